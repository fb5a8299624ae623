//! Reading the API's 2xx replies: a submit's request id, a poll's status or its responses in request order.
//!
//! Pure functions of the reply body, so every documented and guessed shape is unit-tested without HTTP.
//! Responses come back in any order, keyed by `id` (`responses[]`) or `index` (`results[]`); they are put back in
//! request order, and a request without a response gets a failed item of its own instead of silently shifting
//! the others.

use batchd_core::{ItemResponse, JobOutput, RequestId};
use serde_json::value::RawValue;

use crate::error::{ApiError, ErrorKind, Operation};
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
    /// Accepted, not started.
    Queued,
    /// Being processed.
    Running,
    /// Finished: one response per request item, in request order (failed and missing items have `success:false`).
    Done(JobOutput),
}

/// Reads a 2xx submit reply into the batch's request id.
///
/// A reply that says `success:true` but carries no usable `request_id` is a permanent error: the batch may well be
/// queued (and billed), but it cannot be polled, and resubmitting it would run it again every time the API answers
/// the same way. It is flagged as possibly delivered, so the caller counts the duplicate risk.
pub(crate) fn read_submit(http_status: u16, body: &[u8], body_bytes: usize) -> Result<Submitted, ApiError> {
    let envelope: wire::Envelope<wire::SubmitResult> = serde_json::from_slice(body).map_err(|_| {
        ApiError::unreadable_reply(Operation::Submit, http_status, "the submit reply is not the expected JSON", body)
    })?;
    let refused = envelope.success == Some(false)
        || (envelope.result.is_none() && envelope.errors.as_ref().is_some_and(|errors| !errors.is_empty()));
    if refused {
        return Err(ApiError::from_reply(Operation::Submit, http_status, None, body));
    }
    let raw_id = envelope.result.and_then(|result| result.request_id);
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
pub(crate) fn read_poll(http_status: u16, body: &[u8], n_items: usize) -> Result<PollStatus, ApiError> {
    let envelope: wire::Envelope<wire::PollResult> = serde_json::from_slice(body).map_err(|_| {
        ApiError::unreadable_reply(Operation::Poll, http_status, "the poll reply is not the expected JSON", body)
    })?;
    if envelope.success == Some(false) {
        return Err(ApiError::from_reply(Operation::Poll, http_status, None, body));
    }
    let Some(result) = envelope.result else {
        return Err(ApiError::unreadable_reply(Operation::Poll, http_status, "the poll reply has no result", body));
    };
    let usage = read_usage(result.usage.as_deref());
    if let Some(items) = result.responses {
        return Ok(PollStatus::Done(JobOutput {
            responses: restore_order(items, IndexKey::Id, n_items),
            usage,
            failed_batches: Vec::new(),
        }));
    }
    if let Some(items) = result.results {
        return Ok(PollStatus::Done(JobOutput {
            responses: restore_order(items, IndexKey::Index, n_items),
            usage,
            failed_batches: Vec::new(),
        }));
    }
    match result.status.as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("queued") => Ok(PollStatus::Queued),
        Some("running") => Ok(PollStatus::Running),
        Some(status @ ("failed" | "error")) => Err(ApiError {
            kind: ErrorKind::BatchFailed,
            http_status: Some(http_status),
            api_code: None,
            message: format!("the Batch API reports the batch as {status:?} without responses"),
            retry_after: None,
            maybe_delivered: false,
        }),
        _ => Err(ApiError::unreadable_reply(
            Operation::Poll,
            http_status,
            "the poll reply has neither a known status nor responses",
            body,
        )),
    }
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
/// The item's own key is read first, the other one as a fallback. Items without a usable index, with an index out
/// of range, or repeating an index already seen are dropped (the first one wins) with a warning; request indices
/// nobody answered get a failed item with error code `missing`.
fn restore_order(items: Vec<wire::Item>, key: IndexKey, n_items: usize) -> Vec<ItemResponse> {
    let n_received = items.len();
    let mut slots: Vec<Option<ItemResponse>> = (0..n_items).map(|_| None).collect();
    for (position, item) in items.into_iter().enumerate() {
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
        let success = item.success.unwrap_or(item.result.is_some() && item.error.is_none());
        *slot = Some(ItemResponse {
            index,
            success,
            result: item.result,
            error: item.error,
            external_reference: item.external_reference,
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

    #[test]
    fn pending_statuses_are_recognised() {
        let read = |body: &str| read_poll(200, body.as_bytes(), 1);
        assert!(matches!(
            read(r#"{"result":{"status":"queued","request_id":"r"},"success":true}"#),
            Ok(PollStatus::Queued)
        ));
        assert!(matches!(
            read(r#"{"result":{"status":"running"},"success":true,"errors":[]}"#),
            Ok(PollStatus::Running)
        ));
        assert!(matches!(read(r#"{"result":{"status":"Running"}}"#), Ok(PollStatus::Running)));
        let failed = read(r#"{"result":{"status":"failed"},"success":true}"#).expect_err("should fail");
        assert_eq!(failed.kind, ErrorKind::BatchFailed);
        for odd in [r#"{"result":{"status":"done"}}"#, r#"{"result":null,"success":true}"#, "[]", "<html>"] {
            let error = read(odd).expect_err("should fail");
            assert_eq!(error.kind, ErrorKind::Transient, "{odd}");
            assert!(!error.is_ambiguous_submit());
        }
        let refused =
            read(r#"{"result":null,"success":false,"errors":[{"code":5001,"message":"Model execution failed"}]}"#);
        assert_eq!(refused.expect_err("should fail").kind, ErrorKind::BatchFailed);
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
        let unreadable = read_submit(200, b"<html>ok</html>", 1).expect_err("should fail");
        assert_eq!(unreadable.kind, ErrorKind::Transient);
        assert!(unreadable.is_ambiguous_submit());
        let refused = read_submit(200, br#"{"success":false,"errors":[{"code":5007,"message":"No such model"}]}"#, 1);
        let refused = refused.expect_err("should fail");
        assert_eq!((refused.kind, refused.api_code), (ErrorKind::Permanent, Some(5007)));
        assert!(!refused.is_ambiguous_submit());
    }
}
