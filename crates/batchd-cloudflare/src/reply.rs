//! Reading the API's 2xx replies: a submit's request id, a poll's status or its responses in request order.
//!
//! Pure functions of the reply body, so every documented and guessed shape is unit-tested without HTTP.
//! Responses come back in any order, keyed by `id` (`responses[]`) or `index` (`results[]`); they are put back in
//! request order, and a request without a response gets a failed item of its own instead of silently shifting
//! the others.

use batchd_core::{ItemResponse, JobOutput, RequestId};
use serde_json::value::RawValue;

use crate::error::{ApiError, Build as _, ErrorKind, Operation};
use crate::wire;

/// The error given to a request item the API returned no response for.
const MISSING_ITEM_ERROR: &str = r#"{"code":"missing","message":"the Batch API returned no response for this item"}"#;

/// A batch the API accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The id to poll the batch with.
    pub request_id: RequestId,
    /// Size of the submitted body in bytes (the API's only documented limit is 10 MB).
    pub body_bytes: usize,
}

/// Where a submitted batch stands.
#[derive(Debug, Clone)]
pub enum PollStatus {
    /// Not finished yet: any successful reply that carries no answer, whatever its status says.
    Pending(PendingStatus),
    /// Finished: one response per request item, in request order (failed and missing items have `success:false`).
    Done(JobOutput),
}

/// The status a pending batch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PendingStatus {
    /// `queued`: accepted, not started (documented).
    Queued,
    /// `running`: being processed (documented).
    Running,
    /// A status the docs do not list (`processing`, a number, none at all), as one line of at most 64 characters.
    Other(String),
}

impl PendingStatus {
    /// The status as the API gave it (`queued`, `running`, or the undocumented text).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Other(status) => status,
        }
    }

    /// Whether the docs list this status.
    pub fn is_documented(&self) -> bool {
        !matches!(self, Self::Other(_))
    }
}

/// Longest status text kept from a reply, in characters.
const STATUS_CHARS: usize = 64;

/// Statuses that say the batch is still working even when a list of responses came with them (the documented
/// pending values and the usual words of other batch APIs): such a list is partial, not an answer.
pub(crate) const UNFINISHED: [&str; 12] = [
    "queued",
    "running",
    "pending",
    "processing",
    "in_progress",
    "in-progress",
    "started",
    "submitted",
    "waiting",
    "scheduled",
    "validating",
    "finalizing",
];

/// Statuses that say the batch is finished, so an empty list of responses is its (empty) answer.
pub(crate) const FINISHED: [&str; 7] = ["completed", "complete", "done", "succeeded", "success", "finished", "ended"];

/// Statuses that say the batch failed as a whole, when no responses came with them.
pub(crate) const FAILED: [&str; 7] = ["failed", "failure", "error", "errored", "cancelled", "canceled", "expired"];

/// Reads a 2xx submit reply into the batch's request id.
///
/// Lenient: the id may be a string or a number, and the envelope may be missing (the Workers binding's bare
/// `{"status":"queued","request_id":...}`). A reply that says `success:true` but carries no usable `request_id`
/// is a permanent error: the batch may well be queued (and billed), but it cannot be polled, and resubmitting it
/// would run it again every time the API answers the same way. It is flagged as possibly delivered, so the caller
/// counts the duplicate risk.
pub(crate) fn read_submit(http_status: u16, body: &[u8], body_bytes: usize) -> Result<Submitted, ApiError> {
    let unreadable =
        || ApiError::unreadable_reply(Operation::Submit, http_status, "the submit reply is not a JSON object", body);
    let envelope: wire::Envelope<wire::SubmitResult> = serde_json::from_slice(body).map_err(|_| unreadable())?;
    if envelope.is_refusal() {
        return Err(ApiError::from_reply(Operation::Submit, http_status, None, body));
    }
    let result = if envelope.is_bare() {
        serde_json::from_slice::<wire::SubmitResult>(body).ok()
    } else {
        envelope.result.and_then(wire::Shape::into_option)
    };
    let raw_id = result.and_then(|result| wire::text(result.request_id.as_ref()));
    match raw_id.as_deref().map(RequestId::parse) {
        Some(Ok(request_id)) => Ok(Submitted { request_id, body_bytes }),
        Some(Err(invalid)) => Err(missing_request_id(http_status, &format!("an unusable request id ({invalid})"))),
        None => Err(missing_request_id(http_status, "no request id")),
    }
}

fn missing_request_id(http_status: u16, what: &str) -> ApiError {
    ApiError {
        kind: ErrorKind::Permanent,
        http_status: Some(http_status),
        api_code: None,
        message: format!("the Batch API accepted the batch with {what}"),
        retry_after: None,
        maybe_delivered: true,
    }
}

/// Reads a 2xx poll reply for a batch of `n_items` request items.
///
/// Pending is anything that is not an answer: a reply without a list of responses is pending whatever its
/// `status` says (only the job's deadline bounds how long), unless the status says the batch failed. A list is the
/// answer, except an empty list next to a status that is not a finished one, or any list next to a status that
/// says the batch is still working (a partial list). Only a reply with neither a status, a request id nor a list
/// is unreadable.
pub(crate) fn read_poll(http_status: u16, body: &[u8], n_items: usize) -> Result<PollStatus, ApiError> {
    let unreadable = |what: &str| ApiError::unreadable_reply(Operation::Poll, http_status, what, body);
    let envelope: wire::Envelope<wire::PollResult> =
        serde_json::from_slice(body).map_err(|_| unreadable("the poll reply is not a JSON object"))?;
    if envelope.is_refusal() {
        return Err(ApiError::from_reply(Operation::Poll, http_status, None, body));
    }
    let result = if envelope.is_bare() {
        serde_json::from_slice::<wire::PollResult>(body).ok()
    } else {
        envelope.result.and_then(wire::Shape::into_option)
    };
    let Some(result) = result else {
        return Err(unreadable("the poll reply has no result object"));
    };
    let status = result.status.as_ref().map(status_text);
    let status_is = |words: &[&str]| status.as_deref().is_some_and(|status| words.contains(&status));
    let (items, key) = match (result.responses, result.results) {
        (Some(wire::List::Items(items)), _) => (Some(items), IndexKey::Id),
        (_, Some(wire::List::Items(items))) => (Some(items), IndexKey::Index),
        _ => (None, IndexKey::Id),
    };
    if let Some(items) = items {
        let answered =
            if items.is_empty() { status.is_none() || status_is(&FINISHED) } else { !status_is(&UNFINISHED) };
        if answered {
            let usage = read_usage(result.usage.as_deref());
            let responses = restore_order(items, key, n_items);
            return Ok(PollStatus::Done(JobOutput { responses, usage, failed_batches: Vec::new() }));
        }
    }
    if status_is(&FAILED) {
        return Err(ApiError {
            kind: ErrorKind::BatchFailed,
            http_status: Some(http_status),
            api_code: None,
            message: format!(
                "the Batch API reports the batch as {:?} without responses",
                status.as_deref().unwrap_or_default()
            ),
            retry_after: None,
            maybe_delivered: false,
        });
    }
    match status.as_deref() {
        Some("queued") => Ok(PollStatus::Pending(PendingStatus::Queued)),
        Some("running") => Ok(PollStatus::Pending(PendingStatus::Running)),
        Some(other) => Ok(PollStatus::Pending(PendingStatus::Other(other.to_owned()))),
        None if result.request_id.is_some() => Ok(PollStatus::Pending(PendingStatus::Other("(none)".to_owned()))),
        None => Err(unreadable("the poll reply has neither a status, a request id nor responses")),
    }
}

/// A status as one lowercase line of at most [`STATUS_CHARS`] characters: a string as it is, any other JSON value
/// as its JSON text.
pub(crate) fn status_text(status: &serde_json::Value) -> String {
    let text = match status {
        serde_json::Value::String(text) => text.trim().to_ascii_lowercase(),
        other => other.to_string(),
    };
    let line: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).take(STATUS_CHARS).collect();
    if text.chars().count() > STATUS_CHARS { format!("{line}…") } else { line }
}

/// The batch's token usage, `{}` when absent. Usage is informational: one that cannot be read as a JSON value
/// (a number beyond `f64`, nesting past serde_json's limit) is dropped with a warning instead of making the whole
/// finished batch unreadable, which would retry the poll until the job failed with its responses lost.
fn read_usage(raw: Option<&RawValue>) -> serde_json::Value {
    match raw.map(|raw| serde_json::from_str::<serde_json::Value>(raw.get())) {
        None | Some(Ok(serde_json::Value::Null)) => serde_json::json!({}),
        Some(Ok(usage)) => usage,
        Some(Err(error)) => {
            tracing::warn!(%error, "ignoring a token usage that cannot be read");
            serde_json::json!({})
        }
    }
}

/// Which field of a response item holds its request's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IndexKey {
    /// `id`, in `responses[]`.
    Id,
    /// `index`, in `results[]`.
    Index,
}

/// Puts response items back in request order: exactly one response per request index `0..n_items`.
///
/// The item's own key is read first, the other one as a fallback. Items that are not objects, without a usable
/// index, with an index out of range, or repeating an index already seen are dropped (the first one wins) with a
/// warning; request indices nobody answered get a failed item with error code `missing`.
fn restore_order(items: Vec<wire::Shape<wire::Item>>, key: IndexKey, n_items: usize) -> Vec<ItemResponse> {
    let n_received = items.len();
    let mut slots: Vec<Option<ItemResponse>> = (0..n_items).map(|_| None).collect();
    for (position, item) in items.into_iter().enumerate() {
        let wire::Shape::Object(item) = item else {
            tracing::warn!(position, "dropping a response item that is not a JSON object");
            continue;
        };
        let (primary, fallback) = match key {
            IndexKey::Id => (&item.id, &item.index),
            IndexKey::Index => (&item.index, &item.id),
        };
        let Some(index) = primary.as_ref().or(fallback.as_ref()).and_then(wire::as_index) else {
            tracing::warn!(position, "dropping a response item without a usable index");
            continue;
        };
        let Some(slot) = slots.get_mut(index) else {
            tracing::warn!(position, index, n_items, "dropping a response item whose index is out of range");
            continue;
        };
        if slot.is_some() {
            tracing::warn!(position, index, "dropping a response item that repeats an index");
            continue;
        }
        let success = wire::flag(item.success.as_ref()).unwrap_or(item.result.is_some() && item.error.is_none());
        *slot = Some(ItemResponse {
            index,
            success,
            result: item.result,
            error: item.error,
            external_reference: item.external_reference,
            resent: false,
        });
    }
    let n_missing = slots.iter().filter(|slot| slot.is_none()).count();
    if n_missing > 0 {
        tracing::warn!(n_missing, n_received, n_items, "the Batch API returned no response for some items");
    }
    slots
        .into_iter()
        .enumerate()
        .map(|(index, slot)| {
            slot.unwrap_or_else(|| {
                let error = RawValue::from_string(MISSING_ITEM_ERROR.to_owned()).expect("the constant is valid JSON");
                ItemResponse::failure(index, Some(error))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchd_core::ApiCode;

    fn done(body: &str, n_items: usize) -> JobOutput {
        match read_poll(200, body.as_bytes(), n_items) {
            Ok(PollStatus::Done(output)) => output,
            other => panic!("expected Done, got {other:?}"),
        }
    }

    fn raw(item: &Option<Box<RawValue>>) -> Option<&str> {
        item.as_deref().map(RawValue::get)
    }

    #[test]
    fn documented_responses_are_put_back_in_request_order() {
        let body = r#"{"result":{"responses":[
            {"id":2,"result":{"response":"c"},"success":true,"external_reference":"u3"},
            {"id":0,"result":{"response" : "a",  "n":[1, 2]},"success":true,"external_reference":null},
            {"id":1,"success":false,"error":{"code":5004,"message":"Invalid data"},"external_reference":{"k":1}}
        ],"usage":{"prompt_tokens":12,"completion_tokens":0,"total_tokens":12}},"success":true,"errors":[],"messages":[]}"#;
        let output = done(body, 3);
        let indices: Vec<usize> = output.responses.iter().map(|response| response.index).collect();
        assert_eq!(indices, [0, 1, 2]);
        assert_eq!(raw(&output.responses[0].result), Some(r#"{"response" : "a",  "n":[1, 2]}"#), "byte for byte");
        assert_eq!(raw(&output.responses[0].external_reference), None, "null means none");
        assert!(!output.responses[1].success);
        assert_eq!(raw(&output.responses[1].error), Some(r#"{"code":5004,"message":"Invalid data"}"#));
        assert_eq!(raw(&output.responses[1].external_reference), Some(r#"{"k":1}"#));
        assert_eq!(raw(&output.responses[2].external_reference), Some(r#""u3""#));
        assert_eq!(output.usage, serde_json::json!({"prompt_tokens":12,"completion_tokens":0,"total_tokens":12}));
        assert_eq!(output.n_failed(), 1);
    }

    #[test]
    fn results_keyed_by_index_are_accepted_too() {
        let body = r#"{"result":{"results":[
            {"index":1,"result":{"data":[[0.5]]}},
            {"index":"0","result":{"data":[[0.25]]},"success":true}
        ]},"success":true}"#;
        let output = done(body, 2);
        assert_eq!(raw(&output.responses[0].result), Some(r#"{"data":[[0.25]]}"#));
        assert_eq!(raw(&output.responses[1].result), Some(r#"{"data":[[0.5]]}"#));
        assert!(output.responses[1].success, "success is inferred from a result without error");
        assert_eq!(output.usage, serde_json::json!({}), "usage defaults to an empty object");
    }

    #[test]
    fn missing_items_become_failed_items() {
        let body = r#"{"result":{"responses":[{"id":2,"result":{"r":2},"success":true}]},"success":true}"#;
        let output = done(body, 3);
        assert_eq!(output.responses.len(), 3);
        for missing in [0, 1] {
            let response = &output.responses[missing];
            assert_eq!(response.index, missing);
            assert!(!response.success);
            assert_eq!(raw(&response.result), None);
            assert_eq!(raw(&response.error), Some(MISSING_ITEM_ERROR));
        }
        assert!(output.responses[2].success);
        assert_eq!(done(r#"{"result":{"responses":[]}}"#, 2).n_failed(), 2);
    }

    #[test]
    fn duplicate_out_of_range_and_unindexed_items_are_dropped() {
        let body = r#"{"result":{"results":[
            {"index":0,"result":"first"},
            {"index":0,"result":"second"},
            {"index":7,"result":"out of range"},
            {"index":-1,"result":"negative"},
            {"result":"no index"},
            {"index":1,"error":{"m":"x"}}
        ]},"success":true}"#;
        let output = done(body, 2);
        assert_eq!(output.responses.len(), 2);
        assert_eq!(raw(&output.responses[0].result), Some(r#""first""#));
        assert!(!output.responses[1].success, "an error without a result is a failure");
        assert_eq!(raw(&output.responses[1].error), Some(r#"{"m":"x"}"#));
    }

    fn pending(body: &str) -> PendingStatus {
        match read_poll(200, body.as_bytes(), 2) {
            Ok(PollStatus::Pending(status)) => status,
            other => panic!("expected Pending, got {other:?} for {body}"),
        }
    }

    #[test]
    fn pending_statuses_are_recognised() {
        assert_eq!(pending(r#"{"result":{"status":"queued","request_id":"r"},"success":true}"#), PendingStatus::Queued);
        assert_eq!(pending(r#"{"result":{"status":"running"},"success":true,"errors":[]}"#), PendingStatus::Running);
        assert_eq!(pending(r#"{"result":{"status":"Running"}}"#), PendingStatus::Running);
        let failed = read_poll(200, br#"{"result":{"status":"failed"},"success":true}"#, 1).expect_err("should fail");
        assert_eq!(failed.kind, ErrorKind::BatchFailed);
        let failed = read_poll(200, br#"{"result":{"status":"failed","responses":[]},"success":true}"#, 1);
        assert_eq!(failed.expect_err("an empty list beside `failed` is a failure").kind, ErrorKind::BatchFailed);
        for odd in [r#"{"result":null,"success":true}"#, r#"{"result":{},"success":true}"#, "[]", "<html>", "7"] {
            let error = read_poll(200, odd.as_bytes(), 1).expect_err("should fail");
            assert_eq!(error.kind, ErrorKind::Transient, "{odd}");
            assert!(!error.is_ambiguous_submit());
        }
        let refused = read_poll(
            200,
            br#"{"result":null,"success":false,"errors":[{"code":5001,"message":"Model execution failed"}]}"#,
            1,
        );
        assert_eq!(refused.expect_err("should fail").kind, ErrorKind::BatchFailed);
    }

    #[test]
    fn anything_that_is_not_an_answer_is_pending() {
        // Undocumented statuses, of any JSON type, with or without a request id.
        assert_eq!(
            pending(r#"{"result":{"status":"processing"},"success":true}"#),
            PendingStatus::Other("processing".into())
        );
        assert_eq!(pending(r#"{"result":{"status":"done"},"success":true}"#), PendingStatus::Other("done".into()));
        assert_eq!(pending(r#"{"result":{"status":3}}"#), PendingStatus::Other("3".into()));
        assert_eq!(pending(r#"{"result":{"status":{"s":"x"}}}"#), PendingStatus::Other(r#"{"s":"x"}"#.into()));
        assert_eq!(pending(r#"{"result":{"request_id":"r"},"success":"true"}"#), PendingStatus::Other("(none)".into()));
        let long = pending(&format!(r#"{{"result":{{"status":"{}\u001b"}}}}"#, "p".repeat(500)));
        assert_eq!(long.as_str().chars().count(), 65, "cut to 64 characters and marked");
        assert!(!long.is_documented());
        // An empty list next to a status that is not a finished one is pending, not every item `missing`.
        assert_eq!(pending(r#"{"result":{"status":"running","responses":[]},"success":true}"#), PendingStatus::Running);
        assert_eq!(
            pending(r#"{"result":{"status":"processing","results":[]}}"#),
            PendingStatus::Other("processing".into())
        );
        // A list next to a status that says the batch is still working is partial.
        assert_eq!(
            pending(r#"{"result":{"status":"queued","responses":[{"id":0,"result":{}}]}}"#),
            PendingStatus::Queued
        );
        // A list that is not a list is no answer.
        assert_eq!(pending(r#"{"result":{"status":"queued","responses":{"0":{}}}}"#), PendingStatus::Queued);
        // An empty list with no status, or a finished one, is the (empty) answer.
        assert_eq!(done(r#"{"result":{"status":"completed","responses":[]}}"#, 2).n_failed(), 2);
        // The bare shape of the Workers binding, without the envelope.
        assert_eq!(pending(r#"{"status":"running","request_id":"r"}"#), PendingStatus::Running);
        assert_eq!(done(r#"{"responses":[{"id":0,"result":1},{"id":1,"result":2}]}"#, 2).n_failed(), 0);
    }

    #[test]
    fn fields_of_unexpected_types_are_read_field_by_field() {
        let body = r#"{"result":{"status":"completed","responses":[
            {"id":"1","result":"{\"response\":\"b\"}","success":"true"},
            {"index":0,"result":[1,2],"success":1},
            "not an item",
            {"id":2,"result":null,"success":"FALSE","error":"bad"},
            {"id":3,"result":7,"success":{"odd":true}}
        ]},"success":"true","errors":{}}"#;
        let output = done(body, 4);
        assert_eq!(raw(&output.responses[0].result), Some("[1,2]"), "index is the fallback of id");
        assert!(output.responses[0].success, "1 is true");
        assert_eq!(raw(&output.responses[1].result), Some(r#""{\"response\":\"b\"}""#), "a string result is kept");
        assert!(output.responses[1].success);
        assert!(!output.responses[2].success, "\"FALSE\" is false");
        assert_eq!(raw(&output.responses[2].error), Some(r#""bad""#));
        assert!(output.responses[3].success, "an unreadable flag is inferred from a result without error");
        assert_eq!(raw(&output.responses[3].result), Some("7"));
        let refused = read_poll(200, br#"{"result":{"status":"running"},"success":"false","errors":"nope"}"#, 1);
        assert_eq!(refused.expect_err("should fail").message, "nope");
    }

    #[test]
    fn submit_replies_give_the_request_id() {
        let body = br#"{"result":{"status":"queued","request_id":"3f1c0a52-6a0e","model":"@cf/baai/bge-m3"},"success":true,"errors":[],"messages":[]}"#;
        let submitted = read_submit(202, body, 99).expect("should succeed");
        assert_eq!(submitted.request_id.as_str(), "3f1c0a52-6a0e");
        assert_eq!(submitted.body_bytes, 99);

        for (body, text) in [
            (r#"{"result":{"status":"queued"},"success":true}"#.as_bytes(), "no request id"),
            (r#"{"result":{"status":"queued","request_id":"a b"},"success":true}"#.as_bytes(), "unusable request id"),
        ] {
            let error = read_submit(200, body, 1).expect_err("should fail");
            assert_eq!(error.kind, ErrorKind::Permanent);
            assert!(error.is_ambiguous_submit());
            assert!(error.message.contains(text), "{}", error.message);
        }
        for (body, id) in [
            (r#"{"result":{"request_id":12345},"success":"true"}"#, "12345"),
            (r#"{"result":{"request_id":"r-1"},"success":1,"errors":{}}"#, "r-1"),
            (r#"{"status":"queued","request_id":"bare-1","model":"@cf/baai/bge-m3"}"#, "bare-1"),
        ] {
            let submitted = read_submit(200, body.as_bytes(), 1).unwrap_or_else(|e| panic!("{body}: {e}"));
            assert_eq!(submitted.request_id.as_str(), id);
        }
        for body in [r#"{"result":"queued","success":true}"#, r#"{"result":{"request_id":[1]},"success":true}"#] {
            let error = read_submit(200, body.as_bytes(), 1).expect_err("should fail");
            assert!(error.message.contains("no request id"), "{body}: {}", error.message);
        }
        let unreadable = read_submit(200, b"<html>ok</html>", 1).expect_err("should fail");
        assert_eq!(unreadable.kind, ErrorKind::Transient);
        assert!(unreadable.is_ambiguous_submit());
        let refused = read_submit(200, br#"{"success":false,"errors":[{"code":5007,"message":"No such model"}]}"#, 1);
        let refused = refused.expect_err("should fail");
        assert_eq!((refused.kind, refused.api_code.clone()), (ErrorKind::Permanent, Some(ApiCode::Number(5007))));
        assert!(!refused.is_ambiguous_submit());
    }
}
