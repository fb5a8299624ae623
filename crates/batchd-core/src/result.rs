//! The result entry, wire format v1: what batchd publishes to the results stream, once per job.
//!
//! Stream entries are flat string fields; structured parts (`result`, `error`, `metadata`, `request_ids`) are JSON
//! text. Item payloads are opaque JSON kept byte for byte: batchd restores their order, never their meaning.

use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::UnixMillis;

/// Version of the result entry format, published in field `v`.
pub const RESULT_FORMAT_VERSION: &str = "1";

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResultStatus {
    /// Every remote batch finished; `result` holds one response per request (some may have `success:false`).
    Completed,
    /// The job could not finish; `error` says why.
    Failed,
    /// The job's deadline passed first; `error` says so.
    Expired,
    /// Cancelled on request; `result` holds the responses of batches that had finished.
    Cancelled,
}

impl ResultStatus {
    /// Every status, in the order people read them.
    pub const ALL: [Self; 4] = [Self::Completed, Self::Failed, Self::Expired, Self::Cancelled];

    /// The status as published.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Expired => "expired",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for ResultStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a job did not complete. `code` is batchd's own, stable, machine-readable reason; when the Batch API refused,
/// its own error code and HTTP status are carried in `api_code` and `http_status`, and its message in `message`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobError {
    /// batchd's reason, e.g. `invalid_job`, `api_error`, `batch_failed`, `deadline_exceeded`.
    pub code: String,
    /// A sentence for humans.
    pub message: String,
    /// The provider's own error code, when it answered with one: Cloudflare's numbers (e.g. 10000, 5007), other
    /// providers' strings (`token_limit_exceeded`, `rate_limit_error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_code: Option<ApiCode>,
    /// The HTTP status the Batch API answered with, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
}

impl JobError {
    /// An error of batchd's own (no API code).
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self { code: code.to_owned(), message: message.into(), api_code: None, http_status: None }
    }

    /// The error as JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an error always serialises")
    }
}

/// A provider's own error code, as it gave it: a number (Cloudflare's `errors[].code`) or a string (OpenAI's
/// `error.code`, Anthropic's `error.type`). Written to JSON as it came, so Cloudflare's codes stay numbers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ApiCode {
    /// A numeric code.
    Number(i64),
    /// A textual code.
    Text(String),
}

impl From<i64> for ApiCode {
    fn from(code: i64) -> Self {
        Self::Number(code)
    }
}

impl fmt::Display for ApiCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(code) => write!(f, "{code}"),
            Self::Text(code) => f.write_str(code),
        }
    }
}

/// batchd's error codes.
pub mod code {
    /// The job's JSON was readable but a field was wrong.
    pub const INVALID_JOB: &str = "invalid_job";
    /// The ingress entry could not be read as a job at all (also sent to the dead-letter stream).
    pub const INVALID_ENTRY: &str = "invalid_entry";
    /// The Batch API refused the job permanently (bad token, unknown model, invalid input, ...).
    pub const API_ERROR: &str = "api_error";
    /// The remote batch as a whole failed (API code 5001).
    pub const BATCH_FAILED: &str = "batch_failed";
    /// The job's deadline passed before its batches finished.
    pub const DEADLINE_EXCEEDED: &str = "deadline_exceeded";
    /// Transient errors went on past the attempt limit.
    pub const RETRIES_EXHAUSTED: &str = "retries_exhausted";
    /// The API no longer knows the remote batch (polled after its results were dropped).
    pub const RESULTS_GONE: &str = "results_gone";
    /// One request item alone is larger than the payload limit; the job was not submitted.
    pub const ITEM_TOO_LARGE: &str = "item_too_large";
    /// The job was cancelled on request.
    pub const CANCELLED: &str = "cancelled";
    /// An item's request never ran: its batch was never sent, or ended (cancelled, expired) before running it.
    pub const NOT_RUN: &str = "not_run";
    /// The model cannot run batch requests (API code 8007, "does not support request queuing"); nothing was run.
    pub const MODEL_NOT_BATCHABLE: &str = "model_not_batchable";
    /// A poll reply was larger than `cloudflare.max_reply_bytes`; the batch's results were not read.
    pub const REPLY_TOO_LARGE: &str = "reply_too_large";
}

/// A chunk (one remote batch) of a job that did not finish; listed in the result so the producer knows which
/// items failed and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedBatch {
    /// The chunk's position in the job.
    pub chunk: u32,
    /// Indices of the request items the chunk carried.
    pub items: Vec<usize>,
    /// The remote request id, when the batch had been submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Why it failed.
    pub error: JobError,
}

/// One response, at its request's position.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ItemResponse {
    /// Index of the request item in the job's `requests`.
    pub index: usize,
    /// Whether this item succeeded.
    pub success: bool,
    /// The model's output for this item, opaque (absent when the item failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<RawValue>>,
    /// The item's error as the API gave it, opaque (absent when the item succeeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Box<RawValue>>,
    /// The request item's top-level `external_reference`, echoed back (absent when it had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_reference: Option<Box<RawValue>>,
    /// `true` when the item was sent to the provider twice (its first answer was an expiry, or a failure resent by
    /// `retry_failed_items`): this response is the second one. Absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resent: bool,
}

impl ItemResponse {
    /// A response for item `index` that did not succeed, with `error` as its error object.
    pub fn failure(index: usize, error: Option<Box<RawValue>>) -> Self {
        Self { index, success: false, result: None, error, external_reference: None, resent: false }
    }

    /// What kind of failure a response with `success:false` is, read from the `code` and `http_status` of its
    /// error object (the `{"code","message"}` shape every provider's failed items have); `None` for a success.
    pub fn failure_kind(&self) -> Option<ItemFailure> {
        if self.success {
            return None;
        }
        /// The members of an item's error that say what kind of failure it is.
        #[derive(Deserialize)]
        struct ErrorCode {
            /// The provider's (or batchd's) code.
            #[serde(default)]
            code: Option<serde_json::Value>,
            /// The HTTP status the provider answered the request with.
            #[serde(default)]
            http_status: Option<u16>,
        }
        let read = self.error.as_deref().and_then(|error| serde_json::from_str::<ErrorCode>(error.get()).ok());
        let Some(ErrorCode { code, http_status }) = read else {
            return Some(ItemFailure::Other);
        };
        let code = code.as_ref().and_then(serde_json::Value::as_str).unwrap_or_default();
        if item_code::EXPIRED.contains(&code) {
            return Some(ItemFailure::Expired);
        }
        let refused_status =
            http_status.is_some_and(|status| (400..500).contains(&status) && ![408, 429].contains(&status));
        if refused_status || item_code::REFUSED.contains(&code) {
            return Some(ItemFailure::Refused);
        }
        Some(ItemFailure::Other)
    }
}

/// What kind of failure an item's response is ([`ItemResponse::failure_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemFailure {
    /// The provider did not run it before its batch's window closed: sent again once while the job's deadline
    /// leaves room.
    Expired,
    /// The provider refused the request itself (a 4xx other than 408 and 429): sending it again cannot help, so
    /// it is never resent.
    Refused,
    /// Anything else (a 5xx, a timeout, not run): resent only when the job asks for `retry_failed_items`.
    Other,
}

/// The item error codes the providers' docs give for the kinds of [`ItemFailure`].
pub mod item_code {
    /// A request the provider did not run before the batch's window closed: OpenAI `batch_expired` (an error-file
    /// line's `error.code`), Anthropic `expired` (the result's `type`).
    pub const EXPIRED: [&str; 2] = ["batch_expired", "expired"];
    /// A request the provider refused as such, where the item carries no HTTP status: Anthropic's `errored` types
    /// of its 4xx errors.
    pub const REFUSED: [&str; 5] =
        ["invalid_request_error", "authentication_error", "permission_error", "not_found_error", "request_too_large"];
}

/// The `result` field: all responses in request order plus token usage.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobOutput {
    /// One response per request item, in request order.
    pub responses: Vec<ItemResponse>,
    /// Token usage as the API reported it (summed over chunks), e.g. `{"prompt_tokens":12,...}`.
    pub usage: serde_json::Value,
    /// Batches that failed as a whole (absent when none did).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_batches: Vec<FailedBatch>,
}

impl JobOutput {
    /// Number of responses with `success:false`.
    pub fn n_failed(&self) -> usize {
        self.responses.iter().filter(|response| !response.success).count()
    }
}

/// One entry of a results stream.
#[derive(Debug, Clone)]
pub struct ResultEntry {
    /// The job this is the result of.
    pub job_id: String,
    /// How it ended.
    pub status: ResultStatus,
    /// The job's model (empty when the entry could not be decoded).
    pub model: String,
    /// Responses and usage; present when `completed`, and when a failed or cancelled job had finished batches.
    pub result: Option<JobOutput>,
    /// Present when not `completed`.
    pub error: Option<JobError>,
    /// The job's `metadata`, echoed (JSON object), when it had one.
    pub metadata: Option<Box<RawValue>>,
    /// Remote request ids of the job's batches, in chunk order.
    pub request_ids: Vec<String>,
    /// When batchd accepted the job, Unix ms.
    pub accepted_at: UnixMillis,
    /// When the result was published, Unix ms.
    pub finished_at: UnixMillis,
    /// Number of request items.
    pub items_total: usize,
    /// Number of items that did not succeed (all of them when the job failed).
    pub items_failed: usize,
}

/// A result entry that does not follow the v1 format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed result entry: {0}")]
pub struct MalformedResult(String);

impl ResultEntry {
    /// The entry's stream fields, in a fixed order.
    pub fn to_fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            ("v", RESULT_FORMAT_VERSION.to_owned()),
            ("job_id", self.job_id.clone()),
            ("status", self.status.as_str().to_owned()),
            ("model", self.model.clone()),
        ];
        if let Some(result) = &self.result {
            fields.push(("result", serde_json::to_string(result).expect("output serialises")));
        }
        if let Some(error) = &self.error {
            fields.push(("error", error.to_json()));
        }
        if let Some(metadata) = &self.metadata {
            fields.push(("metadata", metadata.get().to_owned()));
        }
        fields.extend([
            ("request_ids", serde_json::to_string(&self.request_ids).expect("strings serialise")),
            ("accepted_at", self.accepted_at.to_string()),
            ("finished_at", self.finished_at.to_string()),
            ("items_total", self.items_total.to_string()),
            ("items_failed", self.items_failed.to_string()),
        ]);
        fields
    }

    /// Reads an entry back from its stream fields.
    pub fn from_fields(fields: &HashMap<String, String>) -> Result<Self, MalformedResult> {
        let get = |name: &str| fields.get(name).ok_or_else(|| MalformedResult(format!("field `{name}` is missing")));
        let number = |name: &str| -> Result<u64, MalformedResult> {
            get(name)?.parse().map_err(|_| MalformedResult(format!("field `{name}` is not a number")))
        };
        let json_field = |name: &str| -> Result<Option<&String>, MalformedResult> { Ok(fields.get(name)) };
        let status = match get("status")?.as_str() {
            "completed" => ResultStatus::Completed,
            "failed" => ResultStatus::Failed,
            "expired" => ResultStatus::Expired,
            "cancelled" => ResultStatus::Cancelled,
            other => return Err(MalformedResult(format!("unknown status {other:?}"))),
        };
        let parse = |name: &str, text: &str| MalformedResult(format!("field `{name}` is not valid: {text}"));
        Ok(Self {
            job_id: get("job_id")?.clone(),
            status,
            model: get("model")?.clone(),
            result: json_field("result")?
                .map(|text| serde_json::from_str(text).map_err(|e| parse("result", &e.to_string())))
                .transpose()?,
            error: json_field("error")?
                .map(|text| serde_json::from_str(text).map_err(|e| parse("error", &e.to_string())))
                .transpose()?,
            metadata: json_field("metadata")?
                .map(|text| serde_json::from_str(text).map_err(|e| parse("metadata", &e.to_string())))
                .transpose()?,
            request_ids: serde_json::from_str(get("request_ids")?).map_err(|e| parse("request_ids", &e.to_string()))?,
            accepted_at: number("accepted_at")?,
            finished_at: number("finished_at")?,
            items_total: number("items_total")? as usize,
            items_failed: number("items_failed")? as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_items_failure_is_an_expiry_a_refusal_or_something_else() {
        let kind = |error: &str| ItemResponse::failure(0, Some(raw(error))).failure_kind();
        assert_eq!(kind(r#"{"code":"batch_expired","message":"x"}"#), Some(ItemFailure::Expired));
        assert_eq!(kind(r#"{"code":"expired","message":"x"}"#), Some(ItemFailure::Expired));
        assert_eq!(kind(r#"{"code":"invalid_request_error","http_status":400}"#), Some(ItemFailure::Refused));
        assert_eq!(kind(r#"{"code":"x","http_status":404}"#), Some(ItemFailure::Refused));
        assert_eq!(kind(r#"{"code":"invalid_request_error","message":"x"}"#), Some(ItemFailure::Refused));
        for other in [r#"{"code":"server_error","http_status":500}"#, r#"{"code":"r","http_status":429}"#, "7"] {
            assert_eq!(kind(other), Some(ItemFailure::Other), "{other}");
        }
        assert_eq!(ItemResponse::failure(0, None).failure_kind(), Some(ItemFailure::Other));
        let success = ItemResponse { success: true, ..ItemResponse::failure(0, None) };
        assert_eq!(success.failure_kind(), None);
    }

    #[test]
    fn resent_is_on_the_wire_only_when_true() {
        let mut response = ItemResponse::failure(3, None);
        assert!(!serde_json::to_string(&response).unwrap().contains("resent"));
        response.resent = true;
        assert_eq!(serde_json::to_string(&response).unwrap(), r#"{"index":3,"success":false,"resent":true}"#);
    }

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    fn completed() -> ResultEntry {
        let output = JobOutput {
            responses: vec![
                ItemResponse {
                    index: 0,
                    success: true,
                    result: Some(raw(r#"{"response":[{"id":0,"score":0.73}]}"#)),
                    error: None,
                    external_reference: Some(raw(r#""q1""#)),
                    resent: false,
                },
                ItemResponse {
                    index: 1,
                    success: false,
                    result: None,
                    error: Some(raw(r#"{"code":5004,"message":"Invalid data"}"#)),
                    external_reference: None,
                    resent: false,
                },
            ],
            usage: serde_json::json!({"prompt_tokens": 12, "completion_tokens": 0, "total_tokens": 12}),
            failed_batches: Vec::new(),
        };
        ResultEntry {
            job_id: "inv-42".into(),
            status: ResultStatus::Completed,
            model: "@cf/baai/bge-m3".into(),
            items_failed: output.n_failed(),
            result: Some(output),
            error: None,
            metadata: Some(raw(r#"{"tenant":"acme"}"#)),
            request_ids: vec!["3f1c0a52-6a0e-4d0b-9a9f-1f5e0c1d2b3a".into()],
            accepted_at: 1_763_769_600_000,
            finished_at: 1_763_769_605_250,
            items_total: 2,
        }
    }

    /// Golden: a completed result entry, field by field, exactly as consumers read it.
    #[test]
    fn completed_entry_golden() {
        let fields = completed().to_fields();
        let expected: Vec<(&str, &str)> = vec![
            ("v", "1"),
            ("job_id", "inv-42"),
            ("status", "completed"),
            ("model", "@cf/baai/bge-m3"),
            (
                "result",
                r#"{"responses":[{"index":0,"success":true,"result":{"response":[{"id":0,"score":0.73}]},"external_reference":"q1"},{"index":1,"success":false,"error":{"code":5004,"message":"Invalid data"}}],"usage":{"completion_tokens":0,"prompt_tokens":12,"total_tokens":12}}"#,
            ),
            ("metadata", r#"{"tenant":"acme"}"#),
            ("request_ids", r#"["3f1c0a52-6a0e-4d0b-9a9f-1f5e0c1d2b3a"]"#),
            ("accepted_at", "1763769600000"),
            ("finished_at", "1763769605250"),
            ("items_total", "2"),
            ("items_failed", "1"),
        ];
        let actual: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(actual, expected);
    }

    /// Golden: a failed result entry carries the API's own code and message.
    #[test]
    fn failed_entry_golden() {
        let entry = ResultEntry {
            job_id: "inv-43".into(),
            status: ResultStatus::Failed,
            model: "@cf/baai/bge-m3".into(),
            result: None,
            error: Some(JobError {
                code: code::API_ERROR.into(),
                message: "the Batch API refused the batch: Authentication error".into(),
                api_code: Some(ApiCode::Number(10000)),
                http_status: Some(401),
            }),
            metadata: None,
            request_ids: vec![],
            accepted_at: 1,
            finished_at: 2,
            items_total: 3,
            items_failed: 3,
        };
        let actual: Vec<(&str, String)> = entry.to_fields();
        let error = actual.iter().find(|(k, _)| *k == "error").unwrap();
        assert_eq!(
            error.1,
            r#"{"code":"api_error","message":"the Batch API refused the batch: Authentication error","api_code":10000,"http_status":401}"#
        );
        assert!(!actual.iter().any(|(k, _)| *k == "result" || *k == "metadata"));
    }

    #[test]
    fn entries_read_back_from_their_fields() {
        let fields: HashMap<String, String> =
            completed().to_fields().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        let entry = ResultEntry::from_fields(&fields).unwrap();
        assert_eq!(entry.job_id, "inv-42");
        assert_eq!(entry.status, ResultStatus::Completed);
        assert_eq!(entry.items_failed, 1);
        let output = entry.result.unwrap();
        assert_eq!(output.responses[1].index, 1);
        assert_eq!(output.responses[0].result.as_ref().unwrap().get(), r#"{"response":[{"id":0,"score":0.73}]}"#);
        let mut broken = fields.clone();
        broken.remove("status");
        assert_eq!(
            ResultEntry::from_fields(&broken).unwrap_err().to_string(),
            "malformed result entry: field `status` is missing"
        );
    }
}
