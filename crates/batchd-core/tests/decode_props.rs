//! Property tests of the job decoder and the id newtypes: whatever a producer puts in an ingress entry, decoding
//! never panics, every refusal is a `DecodeError` with a one-line message, and every accepted job re-encodes to
//! JSON that decodes to the same job.
//!
//! Inputs are generated JSON trees with the real field names and random value types (huge numbers, unicode and
//! control characters, `..`, `%2e`, `/`, `?`, `#` in ids and models, pretty-printed values with newlines), then
//! sometimes damaged byte by byte; plus arbitrary bytes and arbitrary field lists. `PROPTEST_CASES` raises the
//! number of cases (default here: 256 per property, about a second in a debug build; fewer than 32 is refused).

use batchd_core::job::MAX_QUOTED_CHARS;
use batchd_core::{DecodeError, Job, JobId, JobLimits, Keys, ModelName};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;

mod props_support;
use props_support::{Json, config, json_string};

/// Text fragments that ids, model names and keys are built from: the allowed alphabets and everything that must
/// not get through (path traversal, URL syntax, percent-encoding, whitespace, control and bidi characters).
#[rustfmt::skip]
const PIECES: &[&str] = &[
    "a", "Z", "9", "-", "_", ".", ":", "/", "@", "@cf", "cf", "baai", "bge-m3", "..", "%2e", "%2E%2e", "%", "%00",
    "?", "?x=1", "#", "#frag", " ", "\t", "\n", "\r\n", "\0", "\u{7f}", "\u{1b}[31m", "\u{85}", "\u{2028}", "é",
    "\u{202e}", "\u{ff0e}", "\u{200b}", "🦀", "\\", "{", "}", "\"", "'", "+", "~", "*", "$", "=",
];

fn pieces_text() -> impl Strategy<Value = String> {
    prop::collection::vec(select(PIECES), 0..10).prop_map(|pieces| pieces.concat())
}

/// Candidate ids: mostly plausible, often hostile, sometimes long.
fn id_text() -> BoxedStrategy<String> {
    prop_oneof![
        3 => "[A-Za-z0-9._:-]{1,24}",
        3 => pieces_text(),
        1 => any::<String>(),
        1 => (190usize..215, select(&["a", "é", ".", " "][..])).prop_map(|(n, c)| c.repeat(n)),
    ]
    .boxed()
}

/// Candidate model names: valid shapes, near misses and hostile text.
fn model_text() -> BoxedStrategy<String> {
    prop_oneof![
        3 => "@(cf|hf)/[A-Za-z0-9._-]{1,10}/[A-Za-z0-9._-]{1,12}",
        3 => (select(&["@cf/", "@hf/", "@", "@cf/baai/", "", "cf/"][..]), pieces_text(), select(&["", "/", "/x", "/.."][..]))
            .prop_map(|(head, middle, tail)| format!("{head}{middle}{tail}")),
        1 => any::<String>(),
        1 => (190usize..215).prop_map(|n| format!("@cf/a/{}", "b".repeat(n))),
    ]
    .boxed()
}

/// JSON numbers, including ones no Rust integer or float holds.
fn number_text() -> BoxedStrategy<String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        (1u64..100_000).prop_map(|n| n.to_string()),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(|n| n.to_string())),
        select(
            &[
                "0",
                "-0",
                "1",
                "1.0",
                "1e2",
                "1E+2",
                "-1",
                "1e400",
                "-1e400",
                "1e-400",
                "18446744073709551615",
                "18446744073709551616",
                "-9223372036854775809",
                "0.000000000000000000000000001",
            ][..]
        )
        .prop_map(str::to_owned),
        (300usize..2000).prop_map(|n| format!("1{}", "0".repeat(n))),
    ]
    .boxed()
}

fn key_text() -> BoxedStrategy<String> {
    prop_oneof![
        2 => select(&["id", "model", "requests", "reply_to", "metadata", "deadline_secs", "retry_failed_items",
                      "text", "prompt", "external_reference", "modle", "ID", "", "job"][..]).prop_map(str::to_owned),
        1 => pieces_text(),
    ]
    .boxed()
}

/// Any JSON value, nested a few levels.
fn any_json() -> BoxedStrategy<Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        number_text().prop_map(Json::Number),
        prop_oneof![pieces_text(), any::<String>()].prop_map(Json::String),
    ];
    leaf.prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Json::Array),
            prop::collection::vec((key_text(), inner), 0..5).prop_map(Json::Object),
        ]
    })
    .boxed()
}

/// A JSON object with arbitrary members.
fn any_object() -> BoxedStrategy<Json> {
    prop::collection::vec((key_text(), any_json()), 0..4).prop_map(Json::Object).boxed()
}

/// A valid value for each job field.
fn valid_value(name: &'static str) -> BoxedStrategy<Json> {
    match name {
        "id" => "[A-Za-z0-9._:-]{1,24}".prop_map(Json::String).boxed(),
        "model" => "@(cf|hf)/[A-Za-z0-9._-]{1,10}/[A-Za-z0-9_-]{1,12}".prop_map(Json::String).boxed(),
        "requests" => prop::collection::vec(any_object(), 1..5).prop_map(Json::Array).boxed(),
        "reply_to" => prop_oneof![
            Just("{batchd}:results".to_owned()),
            "[A-Za-z0-9._:-]{1,20}".prop_map(|suffix| format!("{{batchd}}:results:{suffix}")),
        ]
        .prop_map(Json::String)
        .boxed(),
        "metadata" => any_object(),
        "deadline_secs" => (1u64..=u64::MAX).prop_map(|secs| Json::Number(secs.to_string())).boxed(),
        "retry_failed_items" => any::<bool>().prop_map(Json::Bool).boxed(),
        _ => unreachable!("not a job field: {name}"),
    }
}

/// A value of the right JSON type for each job field, often with a hostile content.
fn typed_value(name: &'static str) -> BoxedStrategy<Json> {
    match name {
        "id" => id_text().prop_map(Json::String).boxed(),
        "model" => model_text().prop_map(Json::String).boxed(),
        "requests" => {
            prop::collection::vec(prop_oneof![6 => any_object(), 1 => any_json()], 0..5).prop_map(Json::Array).boxed()
        }
        "reply_to" => prop_oneof![
            select(
                &[
                    "{batchd}:results",
                    "{batchd}:results:billing",
                    "{batchd}:results:",
                    "{batchd}:results:a b",
                    "{batchd}:resultsx",
                    "{other}:results",
                    "{batchd}:dead",
                    "{batchd}:results:a\nb"
                ][..]
            )
            .prop_map(str::to_owned),
            pieces_text().prop_map(|suffix| format!("{{batchd}}:results:{suffix}")),
        ]
        .prop_map(Json::String)
        .boxed(),
        "metadata" => any_object(),
        "deadline_secs" => number_text().prop_map(Json::Number).boxed(),
        "retry_failed_items" => any::<bool>().prop_map(Json::Bool).boxed(),
        _ => unreachable!("not a job field: {name}"),
    }
}

/// The value of a job field: valid with weight `valid`, else of the right type with any content, anything, or null.
fn field_value(name: &'static str, valid: u32) -> BoxedStrategy<Json> {
    prop_oneof![valid => valid_value(name), 4 => typed_value(name), 1 => any_json(), 1 => Just(Json::Null)].boxed()
}

/// A job object: each real field present or not, sometimes an unknown one, in any order. `valid` weighs valid
/// field values against hostile ones (0: hostile or mistyped only; 40: most jobs are accepted).
fn job_json(valid: u32) -> BoxedStrategy<Json> {
    let fields = (
        prop::option::weighted(0.7, field_value("id", valid)),
        prop::option::weighted(0.95, field_value("model", valid)),
        prop::option::weighted(0.95, field_value("requests", valid)),
        prop::option::weighted(0.3, field_value("reply_to", valid)),
        prop::option::weighted(0.3, field_value("metadata", valid)),
        prop::option::weighted(0.3, field_value("deadline_secs", valid)),
        prop::option::weighted(0.3, field_value("retry_failed_items", valid)),
        prop::option::weighted(0.05, (key_text(), any_json())),
    );
    fields
        .prop_map(|(id, model, requests, reply_to, metadata, deadline_secs, retry_failed_items, extra)| {
            let mut members: Vec<(String, Json)> = [
                ("id", id),
                ("model", model),
                ("requests", requests),
                ("reply_to", reply_to),
                ("metadata", metadata),
                ("deadline_secs", deadline_secs),
                ("retry_failed_items", retry_failed_items),
            ]
            .into_iter()
            .filter_map(|(name, value)| value.map(|value| (name.to_owned(), value)))
            .collect();
            members.extend(extra);
            members
        })
        .prop_shuffle()
        .prop_map(Json::Object)
        .boxed()
}

/// Mostly valid jobs and entirely hostile ones, half and half.
fn any_job_json() -> BoxedStrategy<Json> {
    prop_oneof![job_json(40), job_json(0)].boxed()
}

/// Damage done to the job's bytes after rendering.
#[derive(Debug, Clone)]
enum Damage {
    None,
    Truncate(prop::sample::Index),
    Insert(prop::sample::Index, u8),
    Replace(prop::sample::Index, u8),
}

impl Damage {
    fn apply(&self, bytes: &mut Vec<u8>) {
        match self {
            Damage::None => {}
            Damage::Truncate(at) => bytes.truncate(at.index(bytes.len() + 1)),
            Damage::Insert(at, byte) => bytes.insert(at.index(bytes.len() + 1), *byte),
            Damage::Replace(at, byte) => {
                if !bytes.is_empty() {
                    let at = at.index(bytes.len());
                    bytes[at] = *byte;
                }
            }
        }
    }
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        8 => Just(Damage::None),
        1 => any::<prop::sample::Index>().prop_map(Damage::Truncate),
        1 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(at, byte)| Damage::Insert(at, byte)),
        1 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(at, byte)| Damage::Replace(at, byte)),
    ]
}

/// The bytes of the `job` field: a rendered (maybe damaged) job, arbitrary bytes, or another JSON value.
fn job_bytes() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        8 => (any_job_json(), any::<bool>(), damage()).prop_map(|(job, pretty, damage)| {
            let mut bytes = job.to_text(pretty).into_bytes();
            damage.apply(&mut bytes);
            bytes
        }),
        1 => prop::collection::vec(any::<u8>(), 0..64),
        1 => (any_json(), any::<bool>()).prop_map(|(value, pretty)| value.to_text(pretty).into_bytes()),
    ]
    .boxed()
}

/// Field names Redis may hand over (any binary-safe string, read lossily as UTF-8 by the fetcher).
fn field_name() -> BoxedStrategy<String> {
    prop_oneof![
        select(&["jbo", "JOB", "", "job ", "a\nb", "x\r\ny: z", "\u{1b}[2J", "é"][..]).prop_map(str::to_owned),
        pieces_text(),
    ]
    .boxed()
}

/// An entry's fields: the `job` field (usually) among others, in any position.
fn entry_fields() -> BoxedStrategy<Vec<(String, Vec<u8>)>> {
    (
        prop::collection::vec((field_name(), prop::collection::vec(any::<u8>(), 0..8)), 0..3),
        prop::option::weighted(0.9, job_bytes()),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(mut others, job, at)| {
            if let Some(job) = job {
                let at = at.index(others.len() + 1);
                others.insert(at, ("job".to_owned(), job));
            }
            others
        })
        .boxed()
}

fn entry_id() -> BoxedStrategy<String> {
    prop_oneof![
        6 => Just("1700000000000-0".to_owned()),
        1 => id_text(),
    ]
    .boxed()
}

/// A text thousands of characters long, repeating hostile pieces.
fn long_text() -> BoxedStrategy<String> {
    (prop::collection::vec(select(PIECES), 1..8), 300usize..3_000)
        .prop_map(|(pieces, times)| pieces.concat().repeat(times))
        .boxed()
}

/// A job text in which one value that error messages quote (a field name, the id, the model, `reply_to`) is
/// thousands of characters long.
fn long_value_job() -> BoxedStrategy<String> {
    (long_text(), 0..5usize)
        .prop_map(|(long, position)| {
            // A model name over 200 bytes is refused without being quoted, so a quoted one is at most that long.
            let model = json_string(&format!("@cf/a/{}", long.chars().take(150).collect::<String>()));
            let long = json_string(&long);
            match position {
                0 => format!(r#"{{"model":"@cf/a/b","requests":[{{}}],{long}:1}}"#),
                1 => format!(r#"{{"id":{long},"model":"@cf/a/b","requests":[{{}}]}}"#),
                2 => format!(r#"{{"model":{long},"requests":[{{}}]}}"#),
                3 => format!(r#"{{"model":"@cf/a/b","requests":[{{}}],"reply_to":{long}}}"#),
                _ => format!(r#"{{"model":{model},"requests":[{{}}]}}"#),
            }
        })
        .boxed()
}

fn limits() -> BoxedStrategy<JobLimits> {
    prop_oneof![
        3 => Just(JobLimits::default()),
        1 => (0usize..400, 0usize..6).prop_map(|(max_entry_bytes, max_items)| JobLimits { max_entry_bytes, max_items }),
    ]
    .boxed()
}

fn keys() -> Keys {
    Keys::new("batchd").expect("namespace")
}

/// A refusal's message goes into a dead-letter entry, a result entry and a log line: one line, no control
/// characters that could forge log lines or drive a terminal, never empty.
fn check_message(error: &DecodeError) -> Result<(), TestCaseError> {
    let message = error.to_string();
    prop_assert!(!message.trim().is_empty(), "empty message for {error:?}");
    prop_assert!(
        !message.chars().any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}'),
        "message is not one clean line: {message:?}"
    );
    if let DecodeError::Invalid { job_id, field, .. } = error {
        prop_assert!(JobId::parse(job_id.as_str()).is_ok());
        prop_assert!(!field.is_empty());
    }
    Ok(())
}

/// A refused job carries the model its entry named exactly when that model is valid (read by the decoder, so the
/// daemon never parses a rejected entry again to find it).
fn check_model_hint(
    error: &DecodeError,
    object: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), TestCaseError> {
    if let DecodeError::Invalid { model, .. } = error {
        let named = object.get("model").and_then(serde_json::Value::as_str).and_then(|m| ModelName::parse(m).ok());
        prop_assert_eq!(model, &named, "{}", error);
    }
    Ok(())
}

/// Everything a job holds, as comparable text.
type JobParts = (String, String, Vec<String>, Option<String>, Option<String>, Option<u64>, Option<bool>);

fn parts(job: &Job) -> JobParts {
    (
        job.id.as_str().to_owned(),
        job.model.as_str().to_owned(),
        job.requests.iter().map(|item| item.get().to_owned()).collect(),
        job.reply_to.clone(),
        job.metadata.as_ref().map(|raw| raw.get().to_owned()),
        job.deadline_secs,
        job.retry_failed_items,
    )
}

fn check_model(model: &ModelName) -> Result<(), TestCaseError> {
    let segments: Vec<&str> = model.segments().collect();
    if segments[0].starts_with('@') {
        // A Workers AI name: a scope and at least two more segments.
        prop_assert!(segments.len() >= 3 && segments[0].len() > 1, "{model}");
    } else {
        // `<provider>/<model>`: the provider in [a-z0-9-], routed by its name.
        prop_assert!(segments.len() >= 2, "{model}");
        prop_assert!(batchd_core::is_provider_name(segments[0]), "{model}");
        prop_assert_eq!(model.provider(), segments[0]);
    }
    for segment in segments {
        prop_assert!(!segment.is_empty() && segment != "." && segment != "..", "{model}: segment {segment:?}");
        prop_assert!(
            !segment.chars().any(|c| matches!(c, '?' | '#' | '%' | '\\' | '/') || c.is_whitespace() || c.is_control()),
            "{model}: segment {segment:?}"
        );
        prop_assert!(segment.is_ascii(), "{model}: segment {segment:?}");
    }
    Ok(())
}

/// An accepted job holds only valid values, and round-trips through its JSON.
fn check_accepted(job: &Job, limits: &JobLimits, keys: &Keys) -> Result<(), TestCaseError> {
    let id = job.id.as_str();
    prop_assert!(!id.is_empty() && id.len() <= 200, "{id:?}");
    prop_assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')), "{id:?}");
    check_model(&job.model)?;
    prop_assert!(!job.requests.is_empty() && job.requests.len() <= limits.max_items);
    for item in &job.requests {
        prop_assert!(item.get().starts_with('{') && item.get().ends_with('}'), "item {:?}", item.get());
    }
    if let Some(reply_to) = &job.reply_to {
        prop_assert!(keys.is_results_stream(reply_to), "{reply_to:?}");
    }
    if let Some(metadata) = &job.metadata {
        prop_assert!(metadata.get().starts_with('{'), "{:?}", metadata.get());
    }
    prop_assert!(job.deadline_secs.is_none_or(|secs| secs >= 1));

    let text = job.to_json();
    let again = Job::decode_json(&text, "1-1", limits, keys);
    prop_assert!(again.is_ok(), "re-encoded job is refused: {:?}\n{text}", again.err());
    let again = again.expect("checked");
    prop_assert_eq!(parts(&again), parts(job));
    prop_assert_eq!(again.to_json(), text);
    Ok(())
}

fn check_decode(fields: &[(String, Vec<u8>)], entry_id: &str, limits: &JobLimits) -> Result<(), TestCaseError> {
    let keys = keys();
    match Job::decode(fields, entry_id, limits, &keys) {
        Ok(job) => check_accepted(&job, limits, &keys),
        Err(error) => {
            check_message(&error)?;
            // What a JSON parser can read as an object within the limits is a job, if a bad one: it must get a
            // `failed` result under an id, not vanish into the dead-letter stream.
            let raw = fields.iter().find(|(name, _)| name == "job").map(|(_, raw)| raw);
            if let Some(raw) = raw {
                let object = match serde_json::from_slice::<serde_json::Value>(raw) {
                    Ok(serde_json::Value::Object(object)) if raw.len() <= limits.max_entry_bytes => Some(object),
                    _ => None,
                };
                if let Some(object) = object.filter(|_| JobId::parse(entry_id).is_ok()) {
                    prop_assert!(
                        matches!(error, DecodeError::Invalid { .. }),
                        "a readable job object was dead-lettered: {error}"
                    );
                    check_model_hint(&error, &object)?;
                }
                if std::str::from_utf8(raw).is_err() && raw.len() <= limits.max_entry_bytes {
                    prop_assert!(matches!(error, DecodeError::Undecodable { .. }), "{error}");
                }
            } else {
                prop_assert!(matches!(error, DecodeError::Undecodable { .. }), "{error}");
            }
            Ok(())
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn entries_decode_or_are_refused_cleanly(fields in entry_fields(), entry_id in entry_id(), limits in limits()) {
        check_decode(&fields, &entry_id, &limits)?;
    }

    #[test]
    fn job_json_decodes_or_is_refused_cleanly(job in any_job_json(), pretty in any::<bool>()) {
        let text = job.to_text(pretty);
        let keys = keys();
        let limits = JobLimits::default();
        match Job::decode_json(&text, "1700000000000-0", &limits, &keys) {
            Ok(job) => check_accepted(&job, &limits, &keys)?,
            Err(error) => {
                check_message(&error)?;
                prop_assert!(matches!(error, DecodeError::Invalid { .. }), "{error}");
                if let Ok(serde_json::Value::Object(object)) = serde_json::from_str(&text) {
                    check_model_hint(&error, &object)?;
                }
            }
        }
    }

    #[test]
    fn long_values_are_quoted_cut(job in long_value_job(), entry_id in entry_id()) {
        let keys = keys();
        let limits = JobLimits::default();
        if let Err(error) = Job::decode_json(&job, &entry_id, &limits, &keys) {
            check_message(&error)?;
            // 64 quoted characters, each at most 10 once escaped (`\u{10ffff}`), and the message's own words.
            let length = error.to_string().chars().count();
            prop_assert!(length <= 10 * MAX_QUOTED_CHARS + 300, "{length} characters: {error}");
        }
    }

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>(), entry_id in entry_id()) {
        let keys = keys();
        match Job::decode_json(&text, &entry_id, &JobLimits::default(), &keys) {
            Ok(job) => check_accepted(&job, &JobLimits::default(), &keys)?,
            Err(error) => check_message(&error)?,
        }
    }

    #[test]
    fn accepted_model_names_are_safe_url_path_segments(raw in model_text()) {
        match ModelName::parse(&raw) {
            Ok(model) => {
                prop_assert_eq!(model.as_str(), raw.as_str());
                check_model(&model)?;
            }
            Err(error) => {
                let message = error.to_string();
                prop_assert!(!message.is_empty() && !message.chars().any(char::is_control), "{message:?}");
            }
        }
    }

    #[test]
    fn accepted_job_ids_use_the_documented_alphabet(raw in id_text()) {
        match JobId::parse(&raw) {
            Ok(id) => {
                prop_assert_eq!(id.as_str(), raw.as_str());
                prop_assert!(!raw.is_empty() && raw.len() <= 200);
                prop_assert!(raw.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')));
            }
            Err(error) => {
                let message = error.to_string();
                prop_assert!(!message.is_empty() && !message.chars().any(char::is_control), "{message:?}");
                // A length complaint quotes a length that is really over the limit.
                if let Some(rest) = message.strip_prefix("is ") {
                    let quoted: usize = rest.split(' ').next().and_then(|n| n.parse().ok()).expect("a number");
                    prop_assert!(quoted > 200, "{message} for {raw:?}");
                }
            }
        }
    }
}

/// Values nested far deeper than serde_json's recursion limit (128), in every position of a job: refused or
/// accepted, never a stack overflow; accepted ones round-trip.
#[test]
fn deep_nesting_is_handled_without_overflowing_the_stack() {
    let keys = keys();
    let limits = JobLimits::default();
    for depth in [127, 128, 129, 1_000, 100_000] {
        let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let objects = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
        let jobs = [
            arrays.clone(),
            objects.clone(),
            format!(r#"{{"model":"@cf/a/b","requests":[{objects}]}}"#),
            format!(r#"{{"model":"@cf/a/b","requests":{arrays}}}"#),
            format!(r#"{{"model":"@cf/a/b","requests":[{{}}],"metadata":{objects}}}"#),
            format!(r#"{{"model":"@cf/a/b","requests":[{{}}],"deadline_secs":{arrays}}}"#),
            format!(r#"{{"id":{arrays},"model":"@cf/a/b","requests":[{{}}]}}"#),
            format!(r#"{{"model":{objects},"requests":[{{}}]}}"#),
            format!(r#"{{"model":"@cf/a/b","requests":[{{}}],"reply_to":{objects}}}"#),
            format!(r#"{{"model":"@cf/a/b","requests":[{{}}],"retry_failed_items":{arrays}}}"#),
        ];
        for text in &jobs {
            let fields = vec![("job".to_owned(), text.as_bytes().to_vec())];
            match Job::decode(&fields, "1-0", &limits, &keys) {
                Ok(job) => check_accepted(&job, &limits, &keys).expect("round trip"),
                Err(error) => check_message(&error).expect("clean message"),
            }
        }
    }
}

/// Regressions found by the properties above, kept as plain examples.
#[test]
fn refusals_stay_on_one_line() {
    let keys = keys();
    let limits = JobLimits::default();
    let refuse = |fields: Vec<(String, Vec<u8>)>| {
        let error = Job::decode(&fields, "1-0", &limits, &keys).expect_err("should be refused");
        check_message(&error).unwrap_or_else(|e| panic!("{e}"));
        error.to_string()
    };
    // A pretty-printed wrong value is not quoted with its newlines.
    let message = refuse(vec![(
        "job".to_owned(),
        b"{\"model\":\"@cf/a/b\",\"requests\":[{}],\"deadline_secs\":[\n1,\n2\n]}".to_vec(),
    )]);
    assert_eq!(message, "invalid `deadline_secs`: must be a positive whole number of seconds, got an array");
    // Field names of an entry without a `job` field are escaped.
    let message = refuse(vec![("jo\nb".to_owned(), b"{}".to_vec()), ("\u{1b}[2J".to_owned(), Vec::new())]);
    assert_eq!(message, "entry has no `job` field (fields present: jo\\nb, \\u{1b}[2J)");
}
