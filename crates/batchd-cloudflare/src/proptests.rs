//! Property tests of the reply readers: whatever a server answers to a poll or a submit, reading it never panics,
//! a finished batch always yields exactly one response per request item at its own index, and every failure is an
//! `ApiError` with a one-line message.
//!
//! Poll replies are generated as structured envelopes in both completion shapes (`responses[]` keyed by `id`,
//! `results[]` keyed by `index`) with shuffled, duplicated, missing, out-of-range, negative, fractional and
//! stringly indices, and checked against a model of the documented rules; then as arbitrary JSON and arbitrary or
//! damaged bytes, checked for the invariants only. `PROPTEST_CASES` raises the number of cases (default 256; fewer than 32 is refused).
//!
//! Long because the generators and the model of the documented rules have to sit beside the properties that use
//! them; it is test code only.

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;

use crate::error::{ApiError, ErrorKind};
use crate::reply::{FAILED, FINISHED, PollStatus, UNFINISHED, read_poll, read_submit, status_text};

/// Shared with batchd-core's decode properties (the configuration and JSON as text).
#[path = "../../batchd-core/tests/props_support/mod.rs"]
mod props_support;
use props_support::{Json, config};

/// A JSON object of the members that are present.
fn object(members: Vec<(&str, Option<Json>)>) -> Json {
    Json::Object(members.into_iter().filter_map(|(name, value)| value.map(|value| (name.to_owned(), value))).collect())
}

fn text() -> BoxedStrategy<String> {
    prop_oneof![
        3 => select(&["", "queued", "running", "Running", "DONE", "failed", "error", "processing", " Completed ",
                      "x\ny", "\u{1b}[31m", "é",
                      "3f1c0a52-6a0e-4d0b-9a9f-1f5e0c1d2b3a", " 1 ", "+2", "-1", "1e2", "\u{0}"][..])
            .prop_map(str::to_owned),
        1 => any::<String>(),
    ]
    .boxed()
}

fn number() -> BoxedStrategy<String> {
    prop_oneof![
        (0u64..12).prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        select(&["-1", "-0", "0.0", "1.0", "1.5", "1e0", "2E+0", "18446744073709551616", "1e400", "-1e400"][..])
            .prop_map(str::to_owned),
    ]
    .boxed()
}

/// Names that occur in replies, so arbitrary JSON often hits the real fields.
fn key() -> BoxedStrategy<String> {
    prop_oneof![
        3 => select(&["result", "success", "errors", "messages", "status", "request_id", "responses", "results",
                      "usage", "id", "index", "error", "external_reference", "code", "message"][..])
            .prop_map(str::to_owned),
        1 => text(),
    ]
    .boxed()
}

fn any_json() -> BoxedStrategy<Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        number().prop_map(Json::Number),
        text().prop_map(Json::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
            prop::collection::vec((key(), inner), 0..6).prop_map(Json::Object),
        ]
    })
    .boxed()
}

/// How a response item states its request's index.
#[derive(Debug, Clone)]
enum Index {
    /// A whole number, as JSON number text.
    Number(i128),
    /// A numeric string, maybe padded with spaces.
    Text(String),
    /// Anything else the API could send: a fraction, a negative, a word, an object.
    Other(Json),
}

impl Index {
    /// The request index this value names, following the documented rules (whole non-negative numbers and
    /// numeric strings; anything else names none).
    fn value(&self) -> Option<usize> {
        match self {
            Index::Number(n) => u64::try_from(*n).ok().and_then(|n| usize::try_from(n).ok()),
            Index::Text(text) | Index::Other(Json::String(text)) => text.trim().parse().ok(),
            // Fractions, exponents and `-0` are not whole numbers as JSON readers see them.
            Index::Other(_) => None,
        }
    }

    fn json(&self) -> Json {
        match self {
            Index::Number(n) => Json::Number(n.to_string()),
            Index::Text(text) => Json::String(text.clone()),
            Index::Other(value) => value.clone(),
        }
    }
}

fn index() -> BoxedStrategy<Index> {
    prop_oneof![
        8 => (-2i128..12).prop_map(Index::Number),
        1 => prop_oneof![Just(i128::from(u64::MAX)), Just(i128::from(u64::MAX) + 1)].prop_map(Index::Number),
        2 => (0u32..12, select(&["", " ", "\t"][..])).prop_map(|(n, pad)| Index::Text(format!("{pad}{n}{pad}"))),
        1 => prop_oneof![
            select(&["1.0", "0.5", "-0", "1e0", "-3"][..]).prop_map(|n| Json::Number(n.to_owned())),
            text().prop_map(Json::String),
            Just(Json::Bool(true)),
            Just(Json::Array(vec![Json::Number("0".to_owned())])),
        ]
        .prop_map(Index::Other),
    ]
    .boxed()
}

/// An item's `success` as the API might write it: a boolean, or a string or number standing for one (or not).
#[derive(Debug, Clone)]
enum Flag {
    Bool(bool),
    Text(&'static str),
    Number(&'static str),
}

impl Flag {
    /// What the flag says, by the lenient rules: `true`/`false`, `"true"`/`"false"`/`"1"`/`"0"`/`"yes"`/`"no"` in
    /// any case and padding, `1`/`0`; anything else says nothing (success is then inferred).
    fn value(&self) -> Option<bool> {
        match self {
            Flag::Bool(flag) => Some(*flag),
            Flag::Text(text) => match text.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => Some(true),
                "false" | "0" | "no" => Some(false),
                _ => None,
            },
            Flag::Number(number) => match *number {
                "1" | "1.0" | "1e0" => Some(true),
                "0" | "0.0" | "-0" => Some(false),
                _ => None,
            },
        }
    }

    fn json(&self) -> Json {
        match self {
            Flag::Bool(flag) => Json::Bool(*flag),
            Flag::Text(text) => Json::String((*text).to_owned()),
            Flag::Number(number) => Json::Number((*number).to_owned()),
        }
    }
}

fn flag() -> BoxedStrategy<Flag> {
    prop_oneof![
        6 => any::<bool>().prop_map(Flag::Bool),
        1 => select(&["true", "false", " TRUE ", "False", "1", "0", "yes", "no", "maybe", ""][..]).prop_map(Flag::Text),
        1 => select(&["1", "0", "1.0", "0.0", "-0", "2", "1e0", "-1"][..]).prop_map(Flag::Number),
    ]
    .boxed()
}

/// One response item; every field may be absent, and `null` stands for absent.
#[derive(Debug, Clone)]
struct Item {
    id: Option<Index>,
    index: Option<Index>,
    success: Option<Flag>,
    result: Option<Json>,
    error: Option<Json>,
    external_reference: Option<Json>,
}

impl Item {
    fn json(&self) -> Json {
        object(vec![
            ("id", self.id.as_ref().map(Index::json)),
            ("index", self.index.as_ref().map(Index::json)),
            ("success", self.success.as_ref().map(Flag::json)),
            ("result", self.result.clone()),
            ("error", self.error.clone()),
            ("external_reference", self.external_reference.clone()),
        ])
    }

    /// The request index the item answers, read the way the shape says (its own key first, the other as fallback).
    fn slot(&self, keyed_by_id: bool) -> Option<usize> {
        let (primary, fallback) = if keyed_by_id { (&self.id, &self.index) } else { (&self.index, &self.id) };
        primary.as_ref().or(fallback.as_ref()).and_then(Index::value)
    }
}

/// A non-null JSON value, or none (absent or `null` in the reply mean the same).
fn payload() -> BoxedStrategy<Option<Json>> {
    prop::option::weighted(0.6, any_json().prop_filter("null reads as absent", |value| !matches!(value, Json::Null)))
        .boxed()
}

fn item() -> BoxedStrategy<Item> {
    (
        prop::option::weighted(0.85, index()),
        prop::option::weighted(0.2, index()),
        prop::option::weighted(0.7, flag()),
        payload(),
        payload(),
        payload(),
    )
        .prop_map(|(id, index, success, result, error, external_reference)| Item {
            id,
            index,
            success,
            result,
            error,
            external_reference,
        })
        .boxed()
}

/// A finished batch: `n_items` requests, items in either shape (shuffled), usage or not, envelope extras.
#[derive(Debug, Clone)]
struct Finished {
    n_items: usize,
    keyed_by_id: bool,
    items: Vec<Item>,
    usage: Option<Json>,
    success: Option<bool>,
    status: Option<String>,
    pretty: bool,
}

impl Finished {
    fn body(&self) -> String {
        let items = Json::Array(self.items.iter().map(Item::json).collect());
        let shape = if self.keyed_by_id { "responses" } else { "results" };
        let result = object(vec![
            ("status", self.status.clone().map(Json::String)),
            (shape, Some(items)),
            ("usage", self.usage.clone()),
        ]);
        let envelope = object(vec![
            ("result", Some(result)),
            ("success", self.success.map(Json::Bool)),
            ("errors", Some(Json::Array(Vec::new()))),
            ("messages", Some(Json::Array(Vec::new()))),
        ]);
        envelope.to_text(self.pretty)
    }
}

fn finished() -> BoxedStrategy<Finished> {
    (
        0usize..9,
        any::<bool>(),
        prop::collection::vec(item(), 0..12),
        prop::option::weighted(0.5, any_json()),
        prop::option::weighted(0.7, Just(true)),
        prop::option::weighted(0.2, text()),
        any::<bool>(),
    )
        .prop_map(|(n_items, keyed_by_id, items, usage, success, status, pretty)| Finished {
            n_items,
            keyed_by_id,
            items,
            usage,
            success,
            status,
            pretty,
        })
        .prop_flat_map(|finished| {
            // Items of a well-behaved batch: one per request, in random order; then the generated ones.
            let n_items = finished.n_items;
            let answers = prop::collection::vec(item(), n_items..=n_items);
            (Just(finished), answers, any::<bool>()).prop_map(|(mut finished, mut answers, complete)| {
                if complete {
                    for (slot, answer) in answers.iter_mut().enumerate() {
                        let value = Index::Number(slot as i128);
                        if finished.keyed_by_id { answer.id = Some(value) } else { answer.index = Some(value) }
                    }
                    answers.append(&mut finished.items);
                    finished.items = answers;
                }
                finished
            })
        })
        .prop_flat_map(|finished| {
            let items = finished.items.clone();
            (Just(finished), Just(items).prop_shuffle()).prop_map(|(mut finished, items)| {
                finished.items = items;
                finished
            })
        })
        .boxed()
}

/// An error message that lands in a result entry and a log line: one line, non-empty.
fn check_error(error: &ApiError) -> Result<(), TestCaseError> {
    prop_assert!(!error.message.trim().is_empty(), "empty message: {error:?}");
    let text = error.to_string();
    prop_assert!(
        !text.chars().any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')),
        "message is not one clean line: {text:?}"
    );
    Ok(())
}

/// What every finished poll must give: `n_items` responses with indices `0..n_items` in order, a usage object,
/// and a failed item (success false, an error, no result) for each request nobody answered.
fn check_done(status: &Result<PollStatus, ApiError>, n_items: usize) -> Result<(), TestCaseError> {
    match status {
        Ok(PollStatus::Done(output)) => {
            prop_assert_eq!(output.responses.len(), n_items);
            for (position, response) in output.responses.iter().enumerate() {
                prop_assert_eq!(response.index, position);
            }
            prop_assert!(!output.usage.is_null());
            prop_assert!(output.failed_batches.is_empty());
        }
        Ok(PollStatus::Pending(_)) => {}
        Err(error) => check_error(error)?,
    }
    Ok(())
}

fn raw_text(raw: &Option<Box<serde_json::value::RawValue>>) -> Option<String> {
    raw.as_ref().map(|raw| raw.get().to_owned())
}

proptest! {
    #![proptest_config(config(256))]

    /// Against a model of the rules: the first item naming a request index in range answers it; success is as
    /// stated, else inferred from a result without an error; payloads are kept byte for byte.
    #[test]
    fn finished_batches_come_back_in_request_order(finished in finished()) {
        let body = finished.body();
        let status = read_poll(200, body.as_bytes(), finished.n_items);
        check_done(&status, finished.n_items)?;
        // Pending is anything that is not an answer: an empty list next to a status that is not a finished one,
        // or any list next to a status that says the batch is still working.
        let word = finished.status.as_ref().map(|status| status_text(&serde_json::Value::String(status.clone())));
        let word_in = |words: &[&str]| word.as_deref().is_some_and(|word| words.contains(&word));
        let answered =
            if finished.items.is_empty() { word.is_none() || word_in(&FINISHED) } else { !word_in(&UNFINISHED) };
        if !answered {
            if word_in(&FAILED) {
                let failed = matches!(&status, Err(error) if error.kind == ErrorKind::BatchFailed);
                prop_assert!(failed, "expected a failed batch, got {status:?} for {body}");
            } else {
                prop_assert!(matches!(status, Ok(PollStatus::Pending(_))), "expected Pending, got {status:?} for {body}");
            }
            return Ok(());
        }
        let output = match status {
            Ok(PollStatus::Done(output)) => output,
            other => return Err(TestCaseError::fail(format!("expected Done, got {other:?} for {body}"))),
        };
        let mut expected: Vec<Option<&Item>> = vec![None; finished.n_items];
        for item in &finished.items {
            if let Some(slot) = item.slot(finished.keyed_by_id).and_then(|slot| expected.get_mut(slot)) {
                slot.get_or_insert(item);
            }
        }
        for (response, expected) in output.responses.iter().zip(&expected) {
            match expected {
                Some(item) => {
                    let success = item
                        .success
                        .as_ref()
                        .and_then(Flag::value)
                        .unwrap_or(item.result.is_some() && item.error.is_none());
                    prop_assert_eq!(response.success, success, "index {}", response.index);
                    prop_assert_eq!(raw_text(&response.result), item.result.as_ref().map(|v| v.to_text(finished.pretty)));
                    prop_assert_eq!(raw_text(&response.error), item.error.as_ref().map(|v| v.to_text(finished.pretty)));
                    prop_assert_eq!(
                        raw_text(&response.external_reference),
                        item.external_reference.as_ref().map(|v| v.to_text(finished.pretty))
                    );
                }
                None => {
                    prop_assert!(!response.success);
                    prop_assert!(response.result.is_none());
                    let error: serde_json::Value =
                        serde_json::from_str(response.error.as_ref().expect("a missing item has an error").get())
                            .expect("the error is JSON");
                    prop_assert_eq!(&error["code"], "missing");
                }
            }
        }
    }

    /// Any JSON reply, shaped like an envelope or not: the invariants hold, nothing panics.
    #[test]
    fn any_json_poll_reply_is_read_or_refused_cleanly(
        value in any_json(),
        wrap in any::<bool>(),
        pretty in any::<bool>(),
        n_items in 0usize..6,
        http_status in select(&[200u16, 201, 202, 204, 299][..]),
    ) {
        let value = if wrap { Json::Object(vec![("result".to_owned(), value)]) } else { value };
        let body = value.to_text(pretty);
        check_done(&read_poll(http_status, body.as_bytes(), n_items), n_items)?;
        match read_submit(http_status, body.as_bytes(), body.len()) {
            Ok(submitted) => prop_assert!(batchd_core::RequestId::parse(submitted.request_id.as_str()).is_ok()),
            Err(error) => check_error(&error)?,
        }
    }

    /// Arbitrary bytes, and finished replies cut short or with a byte changed.
    #[test]
    fn any_bytes_poll_reply_is_read_or_refused_cleanly(
        body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..128),
            (finished(), any::<prop::sample::Index>(), any::<u8>(), any::<bool>()).prop_map(|(finished, at, byte, cut)| {
                let mut body = finished.body().into_bytes();
                let at = at.index(body.len());
                if cut { body.truncate(at) } else { body[at] = byte }
                body
            }),
        ],
        n_items in 0usize..6,
    ) {
        check_done(&read_poll(200, &body, n_items), n_items)?;
        match read_submit(200, &body, body.len()) {
            Ok(submitted) => prop_assert!(batchd_core::RequestId::parse(submitted.request_id.as_str()).is_ok()),
            Err(error) => check_error(&error)?,
        }
    }
}

/// Replies far deeper than serde_json's recursion limit: a clean error, never a stack overflow.
#[test]
fn deeply_nested_replies_are_refused_cleanly() {
    for depth in [127, 128, 129, 10_000, 100_000] {
        let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let bodies = [
            arrays.clone(),
            format!(r#"{{"result":{{"responses":[{{"id":0,"result":{arrays}}}]}}}}"#),
            format!(r#"{{"result":{{"responses":[{{"id":{arrays}}}]}}}}"#),
            format!(r#"{{"result":{{"results":[],"usage":{arrays}}}}}"#),
            format!(r#"{{"success":false,"errors":[{{"code":{arrays},"message":"m"}}]}}"#),
        ];
        for body in &bodies {
            let status = read_poll(200, body.as_bytes(), 1);
            check_done(&status, 1).unwrap_or_else(|e| panic!("{e}"));
            if let Err(error) = read_submit(200, body.as_bytes(), body.len()) {
                check_error(&error).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}

/// Regression found by the properties: a finished batch whose `usage` serde_json cannot hold made the whole reply
/// unreadable, so the poll was retried until the job failed with every response lost.
#[test]
fn a_usage_that_cannot_be_read_does_not_lose_the_responses() {
    let body = r#"{"result":{"responses":[{"id":0,"result":{"r":1},"success":true}],"usage":{"total_tokens":-1e400}},"success":true}"#;
    match read_poll(200, body.as_bytes(), 1) {
        Ok(PollStatus::Done(output)) => {
            assert!(output.responses[0].success);
            assert_eq!(output.usage, serde_json::json!({}));
        }
        other => panic!("expected Done, got {other:?}"),
    }
}

/// Regression found by the properties: control characters of a reply were quoted into error messages (and so
/// into log lines and result entries) as they were.
#[test]
fn control_characters_of_a_reply_are_not_quoted() {
    let error = read_poll(200, b"\x1b[2J\0<html>\x07", 1).expect_err("should fail");
    assert_eq!(error.message, "the poll reply is not a JSON object: [2J <html>");
}
