//! The batch-submit job, wire format v1, and its decoding from an ingress stream entry.
//!
//! A producer enqueues with one command and no library:
//! `XADD {batchd}:submit * job '{"id":"inv-42","model":"@cf/baai/bge-m3","requests":[...]}'`.
//! Decoding separates two kinds of bad input, because they are reported differently:
//! an entry that cannot be read at all goes to the dead-letter stream, while a readable job with a bad field gets
//! a `failed` result entry naming the field, so the producer waiting for that id hears about it.
//!
//! Long because the decoder is its own serde visitors (members, item count, items), which check sizes and counts
//! before anything is built per item, and its tests pin the message of each kind of bad input.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use crate::ids::{JobId, ModelName};
use crate::keys::Keys;

/// The stream entry field that carries the job's JSON.
pub const JOB_FIELD: &str = "job";

/// The fields a v1 job may have; anything else is refused, so a typo cannot be silently ignored.
const KNOWN_FIELDS: [&str; 9] =
    ["id", "model", "requests", "reply_to", "metadata", "deadline_secs", "retry_failed_items", "endpoint", "pack"];

/// Longest accepted `endpoint`, in bytes.
pub const MAX_ENDPOINT_LEN: usize = 64;

/// Longest part of a producer's value quoted back in an error message, in characters. A message goes into logs,
/// the result entry and the ledger, so a producer must not be able to make it megabytes long.
pub const MAX_QUOTED_CHARS: usize = 64;

/// Most field names listed when an entry has no `job` field.
const MAX_LISTED_FIELDS: usize = 16;

/// Size bounds enforced before any work is done on an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLimits {
    /// Largest accepted `job` field, in bytes.
    pub max_entry_bytes: usize,
    /// Largest accepted number of request items in one job.
    pub max_items: usize,
}

impl Default for JobLimits {
    fn default() -> Self {
        Self { max_entry_bytes: 128 * 1024 * 1024, max_items: 1_000_000 }
    }
}

/// A validated batch-submit job. Its request items are owned (`Box<RawValue>`, the default) or borrowed from the
/// entry they were decoded from (`&RawValue`, see [`Job::decode_borrowed`]).
#[derive(Debug, Clone, Serialize)]
pub struct Job<R = Box<RawValue>> {
    /// The job's identity (the producer's `id`, or the ingress entry id when absent).
    pub id: JobId,
    /// The Workers AI model every item is sent to.
    pub model: ModelName,
    /// The request items, byte for byte as the producer wrote them (each a JSON object).
    pub requests: Vec<R>,
    /// The results stream to publish to, when not the namespace's default one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// An opaque JSON object echoed back in the result entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Box<RawValue>>,
    /// Seconds after acceptance at which the job ends `expired`, when not the configured default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_secs: Option<u64>,
    /// Resubmit the items that came back `success:false`, once, when not the configured default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_failed_items: Option<bool>,
    /// The provider endpoint every item is a request body of (`/v1/embeddings`), for providers that have more
    /// than one (OpenAI; default `/v1/chat/completions`); a path of `[a-z0-9/._-]` starting with `/`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `false`: this job gets remote batches of its own, never shared with other jobs (absent: packed when
    /// `packing.enabled`, see docs/wire-format.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pack: Option<bool>,
    /// Where each request item sits in the decoded text: byte offsets `(start, end)` into the entry's `job`
    /// field, so storage can copy a run of items from the entry inside Redis instead of sending them back.
    #[serde(skip)]
    pub item_spans: Vec<(usize, usize)>,
}

/// Why an ingress entry was not accepted as a job. Every value of the entry quoted in a message is cut to
/// [`MAX_QUOTED_CHARS`] characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The entry cannot be read as a job at all; it goes to the dead-letter stream.
    #[error("{reason}")]
    Undecodable {
        /// What is wrong with the entry, for the dead-letter stream and the failure result.
        reason: String,
    },
    /// The entry is a JSON object but one of its fields is wrong; the job fails with this error.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// The id the failure is reported under (the producer's when it was valid, else the entry id).
        job_id: JobId,
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
        /// The job's model, when the entry named a valid one: the failure result carries it, so a rejected
        /// entry never has to be parsed a second time to find it.
        model: Option<ModelName>,
    },
}

impl DecodeError {
    fn undecodable(reason: impl Into<String>) -> Self {
        Self::Undecodable { reason: reason.into() }
    }
}

impl Job {
    /// Decodes and validates the fields of ingress entry `entry_id`.
    ///
    /// `fields` are the entry's field/value pairs as Redis returned them.
    pub fn decode(
        fields: &[(String, Vec<u8>)],
        entry_id: &str,
        limits: &JobLimits,
        keys: &Keys,
    ) -> Result<Job, DecodeError> {
        Job::decode_borrowed(fields, entry_id, limits, keys).map(Job::into_owned)
    }

    /// Decodes and validates a job's JSON text; `default_id` is used when the job has no `id`.
    pub fn decode_json(text: &str, default_id: &str, limits: &JobLimits, keys: &Keys) -> Result<Job, DecodeError> {
        Job::decode_text(text, default_id, limits, keys).map(Job::into_owned)
    }

    /// The job as v1 JSON (what the ledger stores and the CLI enqueues).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a job always serialises")
    }
}

impl<'a> Job<&'a RawValue> {
    /// [`Job::decode`] without copying the request items: they stay views into `fields`. A job can be tens of MB,
    /// and the daemon needs its items only to post them once.
    pub fn decode_borrowed(
        fields: &'a [(String, Vec<u8>)],
        entry_id: &str,
        limits: &JobLimits,
        keys: &Keys,
    ) -> Result<Self, DecodeError> {
        let Some((_, raw)) = fields.iter().find(|(name, _)| name == JOB_FIELD) else {
            // Escaped: a field name is producer data and must not break the message's one line.
            let mut names: Vec<String> =
                fields.iter().take(MAX_LISTED_FIELDS).map(|(name, _)| escape_cut(name)).collect();
            if fields.len() > MAX_LISTED_FIELDS {
                names.push(format!("… and {} more", fields.len() - MAX_LISTED_FIELDS));
            }
            let present = if names.is_empty() { "none".to_owned() } else { names.join(", ") };
            return Err(DecodeError::undecodable(format!(
                "entry has no `{JOB_FIELD}` field (fields present: {present})"
            )));
        };
        if raw.len() > limits.max_entry_bytes {
            return Err(DecodeError::undecodable(format!(
                "`{JOB_FIELD}` is {} bytes, the limit (limits.max_entry_bytes) is {}",
                raw.len(),
                limits.max_entry_bytes
            )));
        }
        let text = std::str::from_utf8(raw)
            .map_err(|e| DecodeError::undecodable(format!("`{JOB_FIELD}` is not UTF-8: {e}")))?;
        Self::decode_text(text, entry_id, limits, keys)
    }

    /// A copy of the job that owns its items.
    pub fn into_owned(self) -> Job {
        let Job {
            id,
            model,
            requests,
            reply_to,
            metadata,
            deadline_secs,
            retry_failed_items,
            endpoint,
            pack,
            item_spans,
        } = self;
        let requests = requests.into_iter().map(RawValue::to_owned).collect();
        Job { id, model, requests, reply_to, metadata, deadline_secs, retry_failed_items, endpoint, pack, item_spans }
    }

    fn decode_text(text: &'a str, default_id: &str, limits: &JobLimits, keys: &Keys) -> Result<Self, DecodeError> {
        // Bounded work before trust: every pass below reads borrowed views into `text` and holds nothing per
        // member or per item, so what an entry costs is bounded by `limits`, not by what it claims. The request
        // items are collected only once their number is known to be within `limits.max_items`.
        let value: &RawValue = serde_json::from_str(text)
            .map_err(|e| DecodeError::undecodable(format!("`{JOB_FIELD}` is not valid JSON: {e}")))?;
        if !value.get().trim_start().starts_with('{') {
            return Err(DecodeError::undecodable(format!(
                "`{JOB_FIELD}` must be a JSON object, got {}",
                json_kind(value.get())
            )));
        }
        let members: Members<'a> = serde_json::from_str(value.get())
            .map_err(|e| DecodeError::undecodable(format!("`{JOB_FIELD}` is not a valid JSON object: {e}")))?;

        let fallback_id = JobId::parse(default_id)
            .map_err(|e| DecodeError::undecodable(format!("entry id {} cannot be a job id: {e}", quote(default_id))))?;
        let (id, id_error) = match members.get("id").map(|raw| raw.get()) {
            None | Some("null") => (fallback_id, None),
            Some(raw) => match serde_json::from_str::<String>(raw) {
                Ok(text) => match JobId::parse(&text) {
                    Ok(id) if id.is_pack() => (
                        fallback_id,
                        Some(format!("starts with {:?}, which batchd keeps for its packs", crate::ids::PACK_PREFIX)),
                    ),
                    Ok(id) => (id, None),
                    Err(e) => (fallback_id, Some(e.to_string())),
                },
                Err(_) => (fallback_id, Some(format!("must be a string, got {}", json_kind(raw)))),
            },
        };
        // Read once, here: a failure result names the model whenever the entry had a valid one.
        let model = match members.get("model") {
            None => Err("is missing".to_owned()),
            Some(raw) => string_field(raw).and_then(|text| {
                // The model's own message quotes the name whole (at most `MAX_MODEL_LEN` bytes); cut it here.
                ModelName::parse(&text).map_err(|e| e.to_string().replacen(&format!("{text:?}"), &quote(&text), 1))
            }),
        };
        let model_hint = model.as_ref().ok().cloned();
        let invalid = |field: &'static str, reason: String| DecodeError::Invalid {
            job_id: id.clone(),
            field,
            reason,
            model: model_hint.clone(),
        };
        if let Some(reason) = id_error {
            return Err(invalid("id", reason));
        }
        if let Some(unknown) = &members.unknown {
            return Err(invalid(
                "job",
                format!("unknown field {}; the fields of a v1 job are {}", quote(unknown), KNOWN_FIELDS.join(", ")),
            ));
        }
        let model = model.map_err(|reason| invalid("model", reason))?;

        let Some(raw_items) = members.get("requests") else {
            return Err(invalid("requests", "is missing".to_owned()));
        };
        let not_an_array = || invalid("requests", format!("must be an array, got {}", json_kind(raw_items.get())));
        let count: ItemCount = serde_json::from_str(raw_items.get()).map_err(|_| not_an_array())?;
        if count.n_items == 0 {
            return Err(invalid("requests", "must not be empty".to_owned()));
        }
        if count.n_items > limits.max_items {
            return Err(invalid(
                "requests",
                format!("has {} items, the limit (limits.max_items) is {}", count.n_items, limits.max_items),
            ));
        }
        if let Some((index, kind)) = count.first_not_object {
            return Err(invalid("requests", format!("item {index} must be a JSON object, got {kind}")));
        }
        let requests = Items { n_items: count.n_items }
            .deserialize(&mut serde_json::Deserializer::from_str(raw_items.get()))
            .map_err(|_| not_an_array())?;
        // Every view borrows from `text`, so an item's offset is its distance from the start of `text`.
        let item_spans: Vec<(usize, usize)> = requests
            .iter()
            .map(|item| {
                let start = item.get().as_ptr() as usize - text.as_ptr() as usize;
                (start, start + item.get().len())
            })
            .collect();

        let reply_to = match members.optional("reply_to") {
            None => None,
            Some(raw) => {
                let stream = string_field(raw).map_err(|reason| invalid("reply_to", reason))?;
                if !keys.is_results_stream(&stream) {
                    return Err(invalid(
                        "reply_to",
                        format!(
                            "{} is not a results stream of this namespace; it must be {:?} or start with \"{}:\"",
                            quote(&stream),
                            keys.results(),
                            keys.results()
                        ),
                    ));
                }
                Some(stream)
            }
        };

        let metadata = match members.optional("metadata") {
            None => None,
            Some(raw) if raw.get().starts_with('{') => Some(raw.to_owned()),
            Some(raw) => {
                return Err(invalid("metadata", format!("must be a JSON object, got {}", json_kind(raw.get()))));
            }
        };

        let deadline_secs = match members.optional("deadline_secs") {
            None => None,
            Some(raw) => match serde_json::from_str::<u64>(raw.get()) {
                Ok(0) => return Err(invalid("deadline_secs", "must be at least 1".to_owned())),
                Ok(secs) => Some(secs),
                Err(_) => {
                    return Err(invalid(
                        "deadline_secs",
                        format!("must be a positive whole number of seconds, got {}", describe(raw.get())),
                    ));
                }
            },
        };

        let retry_failed_items = match members.optional("retry_failed_items") {
            None => None,
            Some(raw) => Some(serde_json::from_str::<bool>(raw.get()).map_err(|_| {
                invalid("retry_failed_items", format!("must be true or false, got {}", json_kind(raw.get())))
            })?),
        };

        let endpoint = match members.optional("endpoint") {
            None => None,
            Some(raw) => {
                let endpoint = string_field(raw).map_err(|reason| invalid("endpoint", reason))?;
                let path_chars =
                    endpoint.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"/._-".contains(&b));
                if !endpoint.starts_with('/') || endpoint.len() > MAX_ENDPOINT_LEN || !path_chars {
                    return Err(invalid(
                        "endpoint",
                        format!(
                            "{} is not an endpoint path; it must start with / and hold at most {MAX_ENDPOINT_LEN} of \
                             a-z 0-9 / . _ - (e.g. \"/v1/embeddings\")",
                            quote(&endpoint)
                        ),
                    ));
                }
                Some(endpoint)
            }
        };

        let pack = match members.optional("pack") {
            None => None,
            Some(raw) => Some(
                serde_json::from_str::<bool>(raw.get())
                    .map_err(|_| invalid("pack", format!("must be true or false, got {}", json_kind(raw.get()))))?,
            ),
        };

        Ok(Job {
            id,
            model,
            requests,
            reply_to,
            metadata,
            deadline_secs,
            retry_failed_items,
            endpoint,
            pack,
            item_spans,
        })
    }
}

/// The members of a job object as views into its text: the value of each v1 field (a repeated field keeps its
/// last value, as with any JSON object reader) and the first unknown name in sorted order. Reading an object into
/// it holds nothing per member, however many members the object has.
#[derive(Debug, Default)]
struct Members<'a> {
    /// The value of each of [`KNOWN_FIELDS`], by position.
    known: [Option<&'a RawValue>; KNOWN_FIELDS.len()],
    /// The smallest member name that is not a v1 field, if any.
    unknown: Option<Cow<'a, str>>,
}

impl<'a> Members<'a> {
    /// The value of the v1 field `name`, if present (`null` included).
    fn get(&self, name: &str) -> Option<&'a RawValue> {
        KNOWN_FIELDS.iter().position(|known| *known == name).and_then(|index| self.known[index])
    }

    /// A present, non-null field.
    fn optional(&self, name: &str) -> Option<&'a RawValue> {
        self.get(name).filter(|raw| raw.get() != "null")
    }
}

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(MembersVisitor)
    }
}

/// Reads a JSON object into [`Members`].
struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Members<'de>, M::Error> {
        let mut members = Members::default();
        while let Some(name) = map.next_key_seed(MemberName)? {
            match KNOWN_FIELDS.iter().position(|known| *known == name) {
                Some(index) => members.known[index] = Some(map.next_value()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                    if members.unknown.as_ref().is_none_or(|first| name < *first) {
                        members.unknown = Some(name);
                    }
                }
            }
        }
        Ok(members)
    }
}

/// A member name: borrowed from the text unless it holds escapes.
struct MemberName;

impl<'de> DeserializeSeed<'de> for MemberName {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for MemberName {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_borrowed_str<E>(self, name: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(name))
    }

    fn visit_str<E>(self, name: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(name.to_owned()))
    }
}

/// What a first pass over the `requests` array learns while holding nothing per item.
#[derive(Debug)]
struct ItemCount {
    /// Number of items.
    n_items: usize,
    /// Position and JSON kind of the first item that is not an object.
    first_not_object: Option<(usize, &'static str)>,
}

impl<'de> Deserialize<'de> for ItemCount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(CountVisitor)
    }
}

/// Counts the items of an array, looking at each one as a borrowed view and dropping it.
struct CountVisitor;

impl<'de> Visitor<'de> for CountVisitor {
    type Value = ItemCount;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<ItemCount, S::Error> {
        let mut count = ItemCount { n_items: 0, first_not_object: None };
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            if count.first_not_object.is_none() && !item.get().starts_with('{') {
                count.first_not_object = Some((count.n_items, json_kind(item.get())));
            }
            count.n_items += 1;
        }
        Ok(count)
    }
}

/// Collects the items of an array already counted by [`CountVisitor`], into a vector allocated once.
struct Items {
    /// The number of items the count found.
    n_items: usize,
}

impl<'de> DeserializeSeed<'de> for Items {
    type Value = Vec<&'de RawValue>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Items {
    type Value = Vec<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
        let mut items = Vec::with_capacity(self.n_items);
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(items)
    }
}

fn string_field(raw: &RawValue) -> Result<String, String> {
    serde_json::from_str::<String>(raw.get()).map_err(|_| format!("must be a string, got {}", json_kind(raw.get())))
}

/// The first `max_chars` characters of `text`, when it is longer than that.
fn cut(text: &str, max_chars: usize) -> Option<&str> {
    text.char_indices().nth(max_chars).map(|(end, _)| &text[..end])
}

/// A producer's value quoted for an error message (`"..."`, escaped), cut to [`MAX_QUOTED_CHARS`] characters;
/// a cut value is marked with `…` and its size.
fn quote(value: &str) -> String {
    match cut(value, MAX_QUOTED_CHARS) {
        None => format!("{value:?}"),
        Some(head) => format!("{head:?}… ({} bytes)", value.len()),
    }
}

/// A producer's value escaped for an error message without quotes, cut like [`quote`].
fn escape_cut(value: &str) -> String {
    match cut(value, MAX_QUOTED_CHARS) {
        None => value.escape_debug().to_string(),
        Some(head) => format!("{}… ({} bytes)", head.escape_debug(), value.len()),
    }
}

/// A wrong value for an error message: a number as written (shortened), anything else by its kind, so a
/// pretty-printed or huge value cannot spread the message over many lines.
fn describe(raw: &str) -> String {
    const MAX_CHARS: usize = 32;
    match json_kind(raw) {
        "a number" => match cut(raw, MAX_CHARS) {
            Some(head) => format!("{head}... ({} characters)", raw.len()),
            None => raw.to_owned(),
        },
        kind => kind.to_owned(),
    }
}

/// Names the kind of a JSON value for error messages ("a number", "an array", ...).
fn json_kind(raw: &str) -> &'static str {
    match raw.trim_start().as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        Some(_) => "a number",
        None => "nothing",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new("batchd").unwrap()
    }

    fn decode(job: &str) -> Result<Job, DecodeError> {
        let fields = vec![(JOB_FIELD.to_owned(), job.as_bytes().to_vec())];
        Job::decode(&fields, "1700000000000-0", &JobLimits::default(), &keys())
    }

    fn error(job: &str) -> String {
        decode(job).unwrap_err().to_string()
    }

    #[test]
    fn item_spans_point_at_each_item_in_the_field_text() {
        let text =
            "{\"requests\" : [ {\"text\":\"a\\\"b\"} ,\n\t{\"text\":\"\\u00e9 é\"}],\"model\":\"@cf/baai/bge-m3\"}";
        let job = decode(text).unwrap();
        assert_eq!(job.item_spans.len(), 2);
        for (item, (start, end)) in job.requests.iter().zip(&job.item_spans) {
            assert_eq!(&text[*start..*end], item.get());
        }
        // A run of items, separators included, is a valid JSON array body.
        let run = format!("[{}]", &text[job.item_spans[0].0..job.item_spans[1].1]);
        let items: Vec<Box<RawValue>> = serde_json::from_str(&run).unwrap();
        assert_eq!(items.len(), 2);
    }

    #[test]
    fn a_minimal_job_takes_the_entry_id() {
        let job = decode(r#"{"model":"@cf/baai/bge-m3","requests":[{"text":"hi"}]}"#).unwrap();
        assert_eq!(job.id.as_str(), "1700000000000-0");
        assert_eq!(job.requests.len(), 1);
        assert_eq!(job.requests[0].get(), r#"{"text":"hi"}"#);
    }

    #[test]
    fn items_are_kept_byte_for_byte() {
        let job = decode(r#"{"id":"a","model":"@cf/baai/bge-m3","requests":[{"z":1, "a" :2.50}]}"#).unwrap();
        assert_eq!(job.requests[0].get(), r#"{"z":1, "a" :2.50}"#);
    }

    #[test]
    fn each_bad_input_has_a_message_naming_the_problem() {
        assert_eq!(error("not json"), "`job` is not valid JSON: expected ident at line 1 column 2");
        assert_eq!(error("[1,2]"), "`job` must be a JSON object, got an array");
        assert_eq!(error(r#"{"requests":[{}]}"#), "invalid `model`: is missing");
        assert_eq!(error(r#"{"model":"@cf/baai/bge-m3","requests":[]}"#), "invalid `requests`: must not be empty");
        assert_eq!(
            error(r#"{"id":"a b","model":"@cf/baai/bge-m3","requests":[{}]}"#),
            "invalid `id`: contains ' '; allowed characters are A-Z a-z 0-9 . _ : -"
        );
        assert_eq!(
            error(r#"{"model":"@cf/../../x","requests":[{}]}"#),
            "invalid `model`: \"@cf/../../x\" contains the path segment \"..\", which is not allowed"
        );
        assert_eq!(
            error(r#"{"model":"@cf/a/b","requests":[1]}"#),
            "invalid `requests`: item 0 must be a JSON object, got a number"
        );
        assert_eq!(
            error(r#"{"model":"@cf/a/b","requests":{}}"#),
            "invalid `requests`: must be an array, got an object"
        );
        assert_eq!(
            error(r#"{"model":"@cf/a/b","requests":[{}],"modle":1}"#),
            "invalid `job`: unknown field \"modle\"; the fields of a v1 job are id, model, requests, reply_to, metadata, deadline_secs, retry_failed_items, endpoint, pack"
        );
        assert_eq!(
            error(r#"{"model":"openai/m","requests":[{}],"endpoint":"v1/../x?"}"#),
            "invalid `endpoint`: \"v1/../x?\" is not an endpoint path; it must start with / and hold at most 64 of a-z 0-9 / . _ - (e.g. \"/v1/embeddings\")"
        );
        assert_eq!(
            decode(r#"{"model":"openai/m","requests":[{}],"endpoint":"/v1/embeddings"}"#).unwrap().endpoint.as_deref(),
            Some("/v1/embeddings")
        );
        assert_eq!(
            error(r#"{"model":"@cf/a/b","requests":[{}],"metadata":[1]}"#),
            "invalid `metadata`: must be a JSON object, got an array"
        );
        assert_eq!(
            error(r#"{"model":"@cf/a/b","requests":[{}],"deadline_secs":-5}"#),
            "invalid `deadline_secs`: must be a positive whole number of seconds, got -5"
        );
        assert_eq!(
            error(r#"{"model":"@cf/a/b","requests":[{}],"reply_to":"other-app:stream"}"#),
            "invalid `reply_to`: \"other-app:stream\" is not a results stream of this namespace; it must be \"{batchd}:results\" or start with \"{batchd}:results:\""
        );
    }

    #[test]
    fn invalid_jobs_are_reported_under_the_producers_id_when_it_is_valid() {
        match decode(r#"{"id":"inv-42","requests":[{}]}"#) {
            Err(DecodeError::Invalid { job_id, field: "model", .. }) => assert_eq!(job_id.as_str(), "inv-42"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn an_entry_without_a_job_field_is_undecodable() {
        let fields = vec![("jbo".to_owned(), b"{}".to_vec())];
        let err = Job::decode(&fields, "1-0", &JobLimits::default(), &keys()).unwrap_err();
        assert_eq!(err.to_string(), "entry has no `job` field (fields present: jbo)");
        assert!(matches!(err, DecodeError::Undecodable { .. }));
    }

    #[test]
    fn limits_are_enforced_before_parsing() {
        let limits = JobLimits { max_entry_bytes: 10, max_items: 2 };
        let fields = vec![(JOB_FIELD.to_owned(), vec![b'x'; 11])];
        assert_eq!(
            Job::decode(&fields, "1-0", &limits, &keys()).unwrap_err().to_string(),
            "`job` is 11 bytes, the limit (limits.max_entry_bytes) is 10"
        );
        let limits = JobLimits { max_entry_bytes: 1000, max_items: 2 };
        let job = r#"{"model":"@cf/a/b","requests":[{},{},{}]}"#;
        let fields = vec![(JOB_FIELD.to_owned(), job.as_bytes().to_vec())];
        assert_eq!(
            Job::decode(&fields, "1-0", &limits, &keys()).unwrap_err().to_string(),
            "invalid `requests`: has 3 items, the limit (limits.max_items) is 2"
        );
    }

    #[test]
    fn the_item_count_is_checked_before_items_are_collected_and_names_the_real_count() {
        let limits = JobLimits { max_entry_bytes: usize::MAX, max_items: 1_000 };
        let n_items = 200_000;
        let job =
            format!(r#"{{"id":"huge","model":"@cf/baai/bge-m3","requests":[{}{{}}]}}"#, "{},".repeat(n_items - 1));
        let error = Job::decode_json(&job, "1-0", &limits, &keys()).unwrap_err();
        assert_eq!(error.to_string(), "invalid `requests`: has 200000 items, the limit (limits.max_items) is 1000");
        // The failure result still names the model the entry gave.
        match error {
            DecodeError::Invalid { job_id, model, .. } => {
                assert_eq!(job_id.as_str(), "huge");
                assert_eq!(model.as_ref().map(ModelName::as_str), Some("@cf/baai/bge-m3"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn an_invalid_job_carries_its_model_only_when_the_model_is_valid() {
        let model_of = |job: &str| match decode(job) {
            Err(DecodeError::Invalid { model, .. }) => model.map(|model| model.as_str().to_owned()),
            other => panic!("unexpected {other:?}"),
        };
        // Read even when an earlier check (the id, an unknown field) is what failed.
        assert_eq!(model_of(r#"{"id":"a b","model":"@cf/a/b","requests":[{}]}"#).as_deref(), Some("@cf/a/b"));
        assert_eq!(model_of(r#"{"model":"@cf/a/b","requests":[{}],"x":1}"#).as_deref(), Some("@cf/a/b"));
        assert_eq!(model_of(r#"{"model":"@cf/a/b","requests":[]}"#).as_deref(), Some("@cf/a/b"));
        // A repeated field keeps its last value, as before.
        assert_eq!(model_of(r#"{"model":"@cf/x/y","model":"@cf/a/b","requests":[]}"#).as_deref(), Some("@cf/a/b"));
        assert_eq!(model_of(r#"{"model":"@cf/../b","requests":[{}]}"#), None);
        assert_eq!(model_of(r#"{"model":7,"requests":[{}]}"#), None);
        assert_eq!(model_of(r#"{"requests":[{}]}"#), None);
    }

    #[test]
    fn the_first_unknown_field_in_sorted_order_is_named() {
        assert_eq!(
            error(r#"{"zz":1,"model":"@cf/a/b","requests":[{}],"b":2,"\u0061":3}"#),
            "invalid `job`: unknown field \"a\"; the fields of a v1 job are id, model, requests, reply_to, metadata, deadline_secs, retry_failed_items, endpoint, pack"
        );
        // An escaped name of a real field is that field.
        assert!(decode(r#"{"\u006dodel":"@cf/a/b","requests":[{}]}"#).is_ok());
    }

    const MEGABYTE: usize = 1024 * 1024;

    #[test]
    fn a_megabyte_unknown_field_name_is_quoted_cut() {
        let name = "n".repeat(MEGABYTE);
        let message = error(&format!(r#"{{"model":"@cf/a/b","requests":[{{}}],"{name}":1}}"#));
        assert_eq!(
            message,
            format!(
                "invalid `job`: unknown field \"{}\"… (1048576 bytes); the fields of a v1 job are id, model, requests, \
                 reply_to, metadata, deadline_secs, retry_failed_items, endpoint, pack",
                "n".repeat(MAX_QUOTED_CHARS)
            )
        );
    }

    #[test]
    fn a_megabyte_reply_to_is_quoted_cut() {
        let stream = format!("{{other}}:{}", "é".repeat(MEGABYTE / 2));
        let message = error(&format!(r#"{{"model":"@cf/a/b","requests":[{{}}],"reply_to":"{stream}"}}"#));
        let head: String = stream.chars().take(MAX_QUOTED_CHARS).collect();
        assert_eq!(
            message,
            format!(
                "invalid `reply_to`: \"{head}\"… ({} bytes) is not a results stream of this namespace; it must be \
                 \"{{batchd}}:results\" or start with \"{{batchd}}:results:\"",
                stream.len()
            )
        );
    }

    #[test]
    fn other_echoed_values_are_cut_too() {
        // A model name is quoted by its parser; past 64 characters the quote is cut.
        let model = format!("@cf/a/{}?", "b".repeat(150));
        let message = error(&format!(r#"{{"model":"{model}","requests":[{{}}]}}"#));
        let head: String = model.chars().take(MAX_QUOTED_CHARS).collect();
        assert_eq!(
            message,
            format!(
                "invalid `model`: \"{head}\"… ({} bytes) contains '?'; allowed characters are A-Z a-z 0-9 . _ - and / \
                 between segments",
                model.len()
            )
        );
        // An entry id that cannot be a job id.
        let entry_id = "x y".repeat(1000);
        let error =
            Job::decode_json(r#"{"model":"@cf/a/b","requests":[{}]}"#, &entry_id, &JobLimits::default(), &keys())
                .unwrap_err()
                .to_string();
        assert!(
            error.starts_with(&format!("entry id {:?}… (3000 bytes) cannot be a job id", &entry_id[..64])),
            "{error}"
        );
        // The field names of an entry without a `job` field: each cut, and at most 16 of them.
        let mut fields: Vec<(String, Vec<u8>)> = (0..5_000).map(|i| (format!("f{i}"), Vec::new())).collect();
        fields[0].0 = "\n".repeat(MEGABYTE);
        let error = Job::decode(&fields, "1-0", &JobLimits::default(), &keys()).unwrap_err().to_string();
        let listed: Vec<String> = (1..16).map(|i| format!("f{i}")).collect();
        assert_eq!(
            error,
            format!(
                "entry has no `job` field (fields present: {}… (1048576 bytes), {}, … and 4984 more)",
                "\\n".repeat(MAX_QUOTED_CHARS),
                listed.join(", ")
            )
        );
    }

    #[test]
    fn a_job_round_trips_through_its_json() {
        let text = r#"{"id":"inv-42","model":"@cf/baai/bge-m3","requests":[{"query":"q","contexts":[{"text":"c"}]}],"reply_to":"{batchd}:results:billing","metadata":{"k":"v"},"deadline_secs":60}"#;
        let job = Job::decode_json(text, "1-0", &JobLimits::default(), &keys()).unwrap();
        assert_eq!(job.to_json(), text);
    }
}
