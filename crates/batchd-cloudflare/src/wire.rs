//! The Batch API's JSON, as it goes over the wire; private to this crate.
//!
//! Every field the API might leave out or set to `null` is optional, because only part of the format is documented
//! (see the API reference). Item payloads stay `RawValue`, byte for byte.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// Submit body: `{"requests":[...]}`, each item sent exactly as the caller gave it.
#[derive(Debug, Serialize)]
pub(crate) struct SubmitBody<'a, R> {
    /// The request items (raw JSON, owned or borrowed).
    pub requests: &'a [R],
}

/// Poll body: `{"request_id":"..."}`.
#[derive(Debug, Serialize)]
pub(crate) struct PollBody<'a> {
    /// The id the submit returned.
    pub request_id: &'a str,
}

/// The envelope around every reply: `{"result":...,"success":...,"errors":[...],"messages":[...]}`.
#[derive(Debug, Deserialize)]
pub(crate) struct Envelope<T> {
    /// The payload; `null` on errors (a missing `Option` field reads as `None`).
    pub result: Option<T>,
    /// Whether the API considers the request successful.
    #[serde(default)]
    pub success: Option<bool>,
    /// The API's errors, if any.
    #[serde(default)]
    pub errors: Option<Vec<ErrorItem>>,
}

/// The envelope read for its errors only, so an error reply with an unexpected `result` is still understood.
#[derive(Debug, Deserialize)]
pub(crate) struct ErrorEnvelope {
    /// The API's errors, if any.
    #[serde(default)]
    pub errors: Option<Vec<ErrorItem>>,
}

/// One entry of `errors[]`: `{"code":10000,"message":"Authentication error"}`.
#[derive(Debug, Deserialize)]
pub(crate) struct ErrorItem {
    /// The API's code, an integer (a numeric string is tolerated).
    #[serde(default)]
    code: Option<Value>,
    /// The API's message.
    #[serde(default)]
    pub message: Option<String>,
}

impl ErrorItem {
    /// The code as a number, when it is one.
    pub(crate) fn code(&self) -> Option<i64> {
        match self.code.as_ref()? {
            Value::Number(number) => number.as_i64(),
            Value::String(text) => text.trim().parse().ok(),
            _ => None,
        }
    }
}

/// `result` of a submit reply: `{"status":"queued","request_id":"<uuid>","model":"@cf/baai/bge-m3"}`; only the id
/// matters (any 2xx with an id is an accepted batch, whatever its `status` says).
#[derive(Debug, Deserialize)]
pub(crate) struct SubmitResult {
    /// The batch's id, to poll with.
    #[serde(default)]
    pub request_id: Option<String>,
}

/// `result` of a poll reply: pending (`status` only) or done (`responses[]` or `results[]`, plus `usage`).
#[derive(Debug, Deserialize)]
pub(crate) struct PollResult {
    /// `queued` or `running` while pending.
    #[serde(default)]
    pub status: Option<String>,
    /// Items keyed by `id` (the documented shape).
    #[serde(default)]
    pub responses: Option<Vec<Item>>,
    /// Items keyed by `index` (the shape one live client reads).
    #[serde(default)]
    pub results: Option<Vec<Item>>,
    /// Token usage, e.g. `{"prompt_tokens":12,"completion_tokens":0,"total_tokens":12}`; kept raw here and read
    /// leniently, so a usage no `Value` can hold does not make the responses unreadable.
    #[serde(default)]
    pub usage: Option<Box<RawValue>>,
}

/// One response item: `{"id":0,"result":{...},"success":true,"external_reference":"story1"}`.
#[derive(Debug, Deserialize)]
pub(crate) struct Item {
    /// Index of the request item, in `responses[]`.
    #[serde(default)]
    pub id: Option<Value>,
    /// Index of the request item, in `results[]`.
    #[serde(default)]
    pub index: Option<Value>,
    /// Whether the item succeeded; inferred when absent.
    #[serde(default)]
    pub success: Option<bool>,
    /// The model's output, opaque.
    #[serde(default)]
    pub result: Option<Box<RawValue>>,
    /// The item's error, opaque.
    #[serde(default)]
    pub error: Option<Box<RawValue>>,
    /// The request item's top-level `external_reference`, echoed; `null` when it had none.
    #[serde(default)]
    pub external_reference: Option<Box<RawValue>>,
}

/// Reads an index given as a number or a numeric string.
pub(crate) fn as_index(value: &Value) -> Option<usize> {
    match value {
        Value::Number(number) => number.as_u64().and_then(|index| usize::try_from(index).ok()),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

/// Exact size in bytes of the submit body `{"requests":[i0,i1,...]}` for items of the given sizes: the envelope,
/// the items byte for byte, and one comma between neighbours.
pub fn submit_body_bytes(item_sizes: impl IntoIterator<Item = usize>) -> usize {
    const ENVELOPE: usize = r#"{"requests":[]}"#.len();
    let (total, count) =
        item_sizes.into_iter().fold((0usize, 0usize), |(total, count), size| (total + size, count + 1));
    ENVELOPE + total + count.saturating_sub(1)
}

#[cfg(test)]
mod body_size_tests {
    use serde_json::value::RawValue;

    use super::*;

    #[test]
    fn the_computed_size_is_the_serialised_size() {
        for items in [vec![], vec![r#"{"a":1}"#], vec![r#"{"text":"x"}"#, r#"{ "b" : [1, 2] }"#, "{}"]] {
            let raw: Vec<Box<RawValue>> = items.iter().map(|i| RawValue::from_string(i.to_string()).unwrap()).collect();
            let body = serde_json::to_vec(&SubmitBody { requests: &raw }).unwrap();
            assert_eq!(submit_body_bytes(items.iter().map(|i| i.len())), body.len(), "{items:?}");
        }
    }
}
