//! The Message Batches JSON batchd sends and reads: the create body with batchd's `custom_id`s, the chunk mark
//! kept in the ledger, and the MessageBatch object read field by field (anything unreadable is "not an answer").

use std::fmt::Write as _;
use std::time::Duration;

use batchd_provider::BodyShape;
use serde::Deserialize;
use serde_json::value::RawValue;

/// Longest `custom_id` the API accepts (`^[a-zA-Z0-9_-]{1,64}$`).
pub const MAX_CUSTOM_ID_LEN: usize = 64;

/// The body of a create, as an upper bound: `{"requests":[r0,r1,...]}` where each `r` is
/// `{"custom_id":"<id>","params":{"model":"<model>",<the item's members>}}`. Per item: the wrapper, the longest
/// custom id and the longest model name (an empty item `{}` is one byte shorter than this).
pub const BODY_SHAPE: BodyShape = BodyShape {
    envelope: r#"{"requests":[]}"#.len(),
    per_item: r#"{"custom_id":"","params":}"#.len()
        + MAX_CUSTOM_ID_LEN
        + r#""model":"","#.len()
        + batchd_core::ids::MAX_MODEL_LEN,
    separator: 1,
};

/// Which chunk a batch is, as its `custom_id`s say it: `n-<nonce>-<chunk>-`, followed by `<attempt>-<index>` in
/// each custom id. The nonce is random (`batchd_provider::create_nonce`) and recorded in the chunk's ledger before
/// its first create, so only this chunk's creates carry it: the same job id in another namespace on the same
/// account gets another. An earlier release wrote `b-<job id hash>-<chunk>-`; such a mark still joins the results
/// of the batch it was sent with, but proves nothing about a batch a look-up finds (every namespace hashes a job
/// id alike).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkMark {
    /// `n-<16 hex>-<chunk>-` (or an earlier release's `b-<16 hex>-<chunk>-`).
    prefix: String,
}

impl ChunkMark {
    /// The mark of chunk `chunk` with a fresh nonce `nonce` (16 hex characters).
    pub fn new(nonce: &str, chunk: u32) -> Self {
        Self { prefix: format!("n-{nonce}-{chunk}-") }
    }

    /// Whether the mark carries a nonce, so that a batch whose custom ids carry it is provably this chunk's.
    pub fn is_provable(&self) -> bool {
        self.prefix.starts_with("n-")
    }

    /// The chunk index the mark names.
    pub fn chunk(&self) -> Option<u32> {
        let body = self.prefix.strip_suffix('-')?;
        body.rsplit_once('-')?.1.parse().ok()
    }

    /// The `custom_id` of item `index` in attempt `attempt`: the prefix is at most 30 characters (a `u32` chunk),
    /// the attempt at most 20, so any index below 1,000,000 (a batch holds at most 100,000) keeps it within
    /// [`MAX_CUSTOM_ID_LEN`].
    pub fn custom_id(&self, attempt: u64, index: usize) -> String {
        let mut id = String::with_capacity(self.prefix.len() + 24);
        id.push_str(&self.prefix);
        let _ = write!(id, "{attempt}-{index}");
        id
    }

    /// The item index a custom id of this chunk names (any attempt), or `None` for another chunk's or a custom id
    /// batchd did not write.
    pub fn index_of(&self, custom_id: &str) -> Option<usize> {
        let rest = custom_id.strip_prefix(&self.prefix)?;
        let (attempt, index) = rest.split_once('-')?;
        if attempt.is_empty() || !attempt.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        if index.is_empty() || index.len() > 12 || !index.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        index.parse().ok()
    }

    /// The prefix, for logs.
    pub fn as_str(&self) -> &str {
        &self.prefix
    }
}

/// What the ledger keeps of a chunk's batches before each create (`RemoteBatch::tag`): the chunk's mark, when its
/// first create began and when its latest began, `<prefix>@<unix ms>@<unix ms>`. A look-up reads only batches
/// created between the two (less and plus a clock margin): nothing created later is one of the chunk's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateMark {
    /// The chunk's custom-id prefix.
    pub chunk: ChunkMark,
    /// When the first create of the chunk began, Unix ms (this replica's clock).
    pub started_ms: u64,
    /// When the latest create of the chunk began, Unix ms; `u64::MAX` for an earlier release's mark, which did
    /// not record it.
    pub last_ms: u64,
}

impl CreateMark {
    /// A fresh mark for a chunk's first create, begun at `now_ms`.
    pub fn first(nonce: &str, chunk: u32, now_ms: u64) -> Self {
        Self { chunk: ChunkMark::new(nonce, chunk), started_ms: now_ms, last_ms: now_ms }
    }

    /// The mark of a further create of the chunk, begun at `now_ms`.
    pub fn again(&self, now_ms: u64) -> Self {
        Self { chunk: self.chunk.clone(), started_ms: self.started_ms, last_ms: now_ms.max(self.started_ms) }
    }

    /// The tag as the ledger stores it.
    pub fn to_tag(&self) -> String {
        format!("{}@{}@{}", self.chunk.prefix, self.started_ms, self.last_ms)
    }

    /// Reads a stored tag (or an earlier release's `<prefix>@<unix ms>`); `None` for one batchd did not write.
    pub fn parse(tag: &str) -> Option<Self> {
        let mut parts = tag.split('@');
        let (prefix, started, last) = (parts.next()?, parts.next()?, parts.next());
        let valid_prefix = (prefix.starts_with("n-") || prefix.starts_with("b-"))
            && prefix.ends_with('-')
            && prefix.len() <= 40
            && prefix.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-');
        if !valid_prefix || parts.next().is_some() {
            return None;
        }
        let started_ms = started.parse().ok()?;
        let last_ms = match last {
            Some(last) => last.parse().ok()?,
            None => u64::MAX,
        };
        let chunk = ChunkMark { prefix: prefix.to_owned() };
        chunk.chunk()?;
        Some(Self { chunk, started_ms, last_ms })
    }
}

/// Why an item cannot be sent as `params`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadItem {
    /// Not a JSON object.
    NotAnObject(usize),
    /// It names its own `model`, which batchd fills in from the job.
    OwnModel(usize),
}

impl BadItem {
    /// A message naming the item the way `ApiError::refused_item` reads it (`/requests/N`), so the engine
    /// answers that item alone and sends the others.
    pub fn message(&self) -> String {
        match self {
            Self::NotAnObject(index) => {
                format!("the item at /requests/{index} is not a JSON object (Messages API parameters)")
            }
            Self::OwnModel(index) => format!(
                "the item at /requests/{index} has its own \"model\"; batchd fills it in from the job's model, so \
                 leave it out"
            ),
        }
    }
}

/// Only the member the body builder must not duplicate.
#[derive(Deserialize)]
struct ModelProbe<'a> {
    /// The item's own `model`, if it has one.
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
}

/// Writes the create body: each item byte for byte after a `"model"` member batchd writes first, without its
/// top-level `external_reference` (batchd echoes it itself: [`batchd_core::reference`]), wrapped with its
/// custom id. `remote_model` is the model's name at Anthropic (a JSON string's content, checked by the caller).
pub fn create_body(
    items: &[&RawValue],
    remote_model: &str,
    mark: &ChunkMark,
    attempt: u64,
) -> Result<Vec<u8>, BadItem> {
    let model_json = serde_json::to_string(remote_model).expect("a string always serialises");
    let exact: usize = r#"{"requests":[]}"#.len()
        + items.iter().map(|item| item.get().len() + 40 + model_json.len() + mark.prefix.len() + 24).sum::<usize>();
    let mut body = Vec::with_capacity(exact);
    body.extend_from_slice(br#"{"requests":["#);
    for (index, item) in items.iter().enumerate() {
        let text = batchd_core::reference::strip(item.get());
        let inner = text.strip_prefix('{').ok_or(BadItem::NotAnObject(index))?;
        let probe: ModelProbe<'_> = serde_json::from_str(&text).map_err(|_| BadItem::NotAnObject(index))?;
        if probe.model.is_some() {
            return Err(BadItem::OwnModel(index));
        }
        if index > 0 {
            body.push(b',');
        }
        body.extend_from_slice(br#"{"custom_id":""#);
        body.extend_from_slice(mark.custom_id(attempt, index).as_bytes());
        body.extend_from_slice(br#"","params":{"model":"#);
        body.extend_from_slice(model_json.as_bytes());
        if inner.trim_start().starts_with('}') {
            body.push(b'}');
        } else {
            body.push(b',');
            body.extend_from_slice(inner.as_bytes());
        }
        body.push(b'}');
    }
    body.extend_from_slice(b"]}");
    Ok(body)
}

/// A MessageBatch as read: every field optional, so an odd reply is "not an answer yet" rather than an error.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct MessageBatch {
    /// `msgbatch_...`.
    pub id: Option<String>,
    /// `in_progress`, `canceling` or `ended`.
    pub processing_status: Option<String>,
    /// Requests per outcome; their sum is the batch's size.
    pub request_counts: Option<RequestCounts>,
    /// RFC 3339.
    pub created_at: Option<String>,
    /// Set once ended.
    pub results_url: Option<String>,
}

impl MessageBatch {
    /// Reads a reply body leniently: `None` when it is not a JSON object at all.
    pub fn read(body: &[u8]) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_slice(body).ok()?;
        if !value.is_object() {
            return None;
        }
        Some(serde_json::from_value(value).unwrap_or_default())
    }

    /// Number of requests in the batch (the sum of its counts), when the counts are readable.
    pub fn n_requests(&self) -> Option<u64> {
        let counts = self.request_counts.as_ref()?;
        [counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired]
            .into_iter()
            .try_fold(0u64, |sum, count| sum.checked_add(count?))
    }

    /// `created_at` as Unix ms, when it is a readable RFC 3339 time.
    pub fn created_ms(&self) -> Option<u64> {
        rfc3339_ms(self.created_at.as_deref()?)
    }
}

/// `request_counts`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RequestCounts {
    /// Not ended yet.
    pub processing: Option<u64>,
    /// Succeeded.
    pub succeeded: Option<u64>,
    /// Errored.
    pub errored: Option<u64>,
    /// Canceled before they ran.
    pub canceled: Option<u64>,
    /// Expired before they ran.
    pub expired: Option<u64>,
}

/// A page of the list, newest first.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct BatchPage {
    /// The batches (each read leniently).
    pub data: Vec<serde_json::Value>,
    /// Whether older batches follow.
    pub has_more: bool,
    /// The oldest batch of the page: the cursor of the next page (`after_id`).
    pub last_id: Option<String>,
}

impl BatchPage {
    /// Reads a page; `None` when the reply is not one.
    pub fn read(body: &[u8]) -> Option<(Vec<MessageBatch>, bool, Option<String>)> {
        let page: BatchPage = serde_json::from_slice(body).ok()?;
        let batches = page.data.into_iter().map(|value| serde_json::from_value(value).unwrap_or_default()).collect();
        Some((batches, page.has_more, page.last_id))
    }
}

/// An RFC 3339 time (`Z` or a numeric offset, any fraction) as Unix ms.
pub fn rfc3339_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    let parsed = match split_offset(text) {
        // `+hh:mm` / `-hh:mm`: read the local part and move it by the offset.
        Some((local, sign, offset)) => {
            let at = humantime::parse_rfc3339_weak(local).ok()?;
            let (hours, minutes) = offset.split_once(':')?;
            let shift = Duration::from_secs(hours.parse::<u64>().ok()? * 3600 + minutes.parse::<u64>().ok()? * 60);
            if sign == '+' { at.checked_sub(shift)? } else { at.checked_add(shift)? }
        }
        None => humantime::parse_rfc3339_weak(text.strip_suffix('Z').unwrap_or(text)).ok()?,
    };
    let since = parsed.duration_since(std::time::UNIX_EPOCH).ok()?;
    u64::try_from(since.as_millis()).ok()
}

/// `(local time, sign, "hh:mm")` of a time that ends in a numeric offset.
fn split_offset(text: &str) -> Option<(&str, char, &str)> {
    let at = text.len().checked_sub(6)?;
    let tail = text.get(at..)?;
    let sign = tail.chars().next()?;
    ((sign == '+' || sign == '-') && tail.as_bytes().get(3) == Some(&b':')).then(|| (&text[..at], sign, &tail[1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).expect("json")
    }

    const NONCE: &str = "0123456789abcdef";

    #[test]
    fn the_body_fills_in_the_model_and_wraps_each_item_with_its_custom_id() {
        let items = [raw(r#"{"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#), raw("{}"), raw("{ }")];
        let items: Vec<&RawValue> = items.iter().map(AsRef::as_ref).collect();
        let mark = ChunkMark::new(NONCE, 3);
        let body = create_body(&items, "claude-sonnet-4-5", &mark, 2).expect("body");
        let value: serde_json::Value = serde_json::from_slice(&body).expect("valid json");
        let requests = value["requests"].as_array().expect("requests");
        assert_eq!(requests.len(), 3);
        assert_eq!(requests[0]["params"]["model"], "claude-sonnet-4-5");
        assert_eq!(requests[0]["params"]["max_tokens"], 5);
        assert_eq!(requests[1]["params"], serde_json::json!({"model": "claude-sonnet-4-5"}));
        for (index, request) in requests.iter().enumerate() {
            let custom_id = request["custom_id"].as_str().expect("custom id");
            assert!(custom_id.len() <= MAX_CUSTOM_ID_LEN);
            assert!(custom_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{custom_id}");
            assert_eq!(mark.index_of(custom_id), Some(index));
        }
        // The item's bytes are passed through as they came.
        assert!(
            std::str::from_utf8(&body)
                .expect("utf8")
                .contains(r#""max_tokens":5,"messages":[{"role":"user","content":"hi"}]"#)
        );
        assert!(BODY_SHAPE.bytes(items.iter().map(|item| item.get().len())) >= body.len());
    }

    #[test]
    fn items_that_are_not_objects_or_name_a_model_are_refused_by_position() {
        let items = [raw("{}"), raw(r#"{"model":"x","max_tokens":1}"#)];
        let items: Vec<&RawValue> = items.iter().map(AsRef::as_ref).collect();
        let mark = ChunkMark::new(NONCE, 0);
        let error = create_body(&items, "m", &mark, 1).expect_err("refused");
        assert_eq!(error, BadItem::OwnModel(1));
        assert!(error.message().contains("/requests/1"));
        let list = raw("[1]");
        assert_eq!(create_body(&[list.as_ref()], "m", &mark, 1), Err(BadItem::NotAnObject(0)));
        // A nested "model" is the item's business, not a second model.
        let nested = raw(r#"{"metadata":{"model":"x"}}"#);
        assert!(create_body(&[nested.as_ref()], "m", &mark, 1).is_ok());
    }

    #[test]
    fn a_top_level_external_reference_is_left_out_of_params_and_nothing_else() {
        let items = [
            raw(r#"{"max_tokens":5, "external_reference":{"k":[1]},"messages":[]}"#),
            raw(r#"{"external_reference":"only"}"#),
            raw(r#"{"metadata":{"external_reference":"nested"},"external\u005freference":"escaped"}"#),
        ];
        let items: Vec<&RawValue> = items.iter().map(AsRef::as_ref).collect();
        let body = create_body(&items, "m", &ChunkMark::new(NONCE, 0), 1).expect("body");
        let text = std::str::from_utf8(&body).expect("utf8");
        assert!(text.contains(r#""params":{"model":"m","max_tokens":5,"messages":[]}}"#), "{text}");
        let value: serde_json::Value = serde_json::from_slice(&body).expect("valid json");
        assert_eq!(value["requests"][1]["params"], serde_json::json!({"model": "m"}));
        assert_eq!(
            value["requests"][2]["params"],
            serde_json::json!({"model": "m", "metadata": {"external_reference": "nested"}})
        );
    }

    #[test]
    fn custom_ids_stay_within_the_pattern_for_big_numbers_and_carry_the_nonce() {
        let mark = ChunkMark::new(NONCE, u32::MAX);
        let id = mark.custom_id(u64::MAX, 999_999);
        assert!(id.len() <= MAX_CUSTOM_ID_LEN, "{id}");
        assert_eq!(mark.index_of(&id), Some(999_999));
        assert_eq!(mark.chunk(), Some(u32::MAX));
        assert!(mark.is_provable());
        assert_eq!(ChunkMark::new("fedcba9876543210", u32::MAX).index_of(&id), None, "another nonce's custom id");
        assert_eq!(ChunkMark::new(NONCE, 999).index_of(&id), None, "another chunk's");
        for hostile in [
            "",
            "b-",
            &format!("{}x-1", mark.as_str()),
            &format!("{}1-", mark.as_str()),
            &format!("{}1-1e3", mark.as_str()),
        ] {
            assert_eq!(mark.index_of(hostile), None, "{hostile}");
        }
    }

    #[test]
    fn a_create_mark_round_trips_and_foreign_tags_are_refused() {
        let mark = CreateMark::first(NONCE, 2, 1_732_570_000_123);
        assert_eq!(CreateMark::parse(&mark.to_tag()), Some(mark.clone()));
        let again = mark.again(1_732_570_009_000);
        assert_eq!((again.started_ms, again.last_ms), (1_732_570_000_123, 1_732_570_009_000));
        assert_eq!(CreateMark::parse(&again.to_tag()), Some(again));
        // An earlier release's tag: read (its batch's results still join), never provable.
        let earlier = CreateMark::parse("b-00ff00ff00ff00ff-2-@1732570000123").expect("an earlier release's tag");
        assert_eq!((earlier.chunk.chunk(), earlier.last_ms), (Some(2), u64::MAX));
        assert!(!earlier.chunk.is_provable());
        for foreign in ["", "x@1", "b-1-@", "b-1-@x", "b-1-2", "b-<script>-@1", "n-x-@1@2@3", "n-ab-@1@x", "n--@1"] {
            assert_eq!(CreateMark::parse(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn batches_are_read_field_by_field() {
        let batch = MessageBatch::read(
            br#"{"id":"msgbatch_1","processing_status":"ended","created_at":"2024-09-24T18:37:24.100435Z",
                "request_counts":{"processing":0,"succeeded":2,"errored":1,"canceled":0,"expired":1},"results_url":"u"}"#,
        )
        .expect("batch");
        assert_eq!(batch.n_requests(), Some(4));
        assert_eq!(batch.created_ms(), Some(1_727_203_044_100));
        let odd = MessageBatch::read(br#"{"id":7,"request_counts":"many"}"#).expect("an object");
        assert_eq!((odd.n_requests(), odd.id), (None, None));
        assert!(MessageBatch::read(b"[]").is_none());
        assert_eq!(rfc3339_ms("2024-09-24T20:37:24.100+02:00"), Some(1_727_203_044_100));
    }
}
