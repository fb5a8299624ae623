//! OpenAI's JSON as batchd sends and reads it, private to this crate: the create request, the file, batch and
//! list objects, the error envelope. Read field by field and leniently: every field batchd does not need is
//! ignored, and every one it reads may be absent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /batches`.
#[derive(Debug, Serialize)]
pub(crate) struct CreateBatch<'a> {
    /// The uploaded input file.
    pub input_file_id: &'a str,
    /// The endpoint every line targets.
    pub endpoint: &'a str,
    /// `24h` at OpenAI (the only window it accepts); what the instance sets elsewhere; not sent when it sets none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_window: Option<&'a str>,
    /// batchd's tag: job, chunk and attempt.
    pub metadata: BTreeMap<&'static str, String>,
    /// When the output and error files expire, if set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_expires_after: Option<Expiry>,
}

/// `{"anchor":"created_at","seconds":N}`: when a file expires.
#[derive(Debug, Serialize)]
pub(crate) struct Expiry {
    /// Always `created_at`, the only anchor the API documents.
    pub anchor: &'static str,
    /// Seconds after the anchor.
    pub seconds: u64,
}

/// A file object (the reply of an upload).
#[derive(Debug, Deserialize)]
pub(crate) struct FileObject {
    /// `file-...`.
    #[serde(default)]
    pub id: Option<String>,
}

/// A batch object.
#[derive(Debug, Deserialize)]
pub(crate) struct Batch {
    /// `batch_...`.
    #[serde(default)]
    pub id: Option<String>,
    /// One of the eight documented statuses (anything else is read as pending), in lower case whatever case the
    /// API spelled it in (some vendors that copy the API answer `COMPLETED`).
    #[serde(default, deserialize_with = "lower_case")]
    pub status: Option<String>,
    /// The input file.
    #[serde(default)]
    pub input_file_id: Option<String>,
    /// The successful results, once the batch ended.
    #[serde(default)]
    pub output_file_id: Option<String>,
    /// The failed requests, once the batch ended.
    #[serde(default)]
    pub error_file_id: Option<String>,
    /// Validation errors of a `failed` batch.
    #[serde(default)]
    pub errors: Option<BatchErrors>,
    /// The tag the batch was created with.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, serde_json::Value>>,
}

/// A string read in lower case.
fn lower_case<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(deserializer)?.map(|text| text.to_ascii_lowercase()))
}

/// `errors` of a batch.
#[derive(Debug, Deserialize)]
pub(crate) struct BatchErrors {
    /// The errors, each with the input line it is about.
    #[serde(default)]
    pub data: Vec<BatchError>,
}

/// One validation error.
#[derive(Debug, Deserialize)]
pub(crate) struct BatchError {
    /// `token_limit_exceeded`, `invalid_json_line`, ...
    #[serde(default)]
    pub code: Option<String>,
    /// What is wrong.
    #[serde(default)]
    pub message: Option<String>,
    /// The 1-based input line, when it is about one.
    #[serde(default)]
    pub line: Option<u64>,
}

/// `GET /batches`.
#[derive(Debug, Deserialize)]
pub(crate) struct BatchList {
    /// One page, newest first.
    #[serde(default)]
    pub data: Vec<Batch>,
    /// Whether an older page follows.
    #[serde(default)]
    pub has_more: bool,
    /// The id to ask the next page after.
    #[serde(default)]
    pub last_id: Option<String>,
}

/// `{"error": {...}}`.
#[derive(Debug, Deserialize)]
pub(crate) struct ErrorEnvelope {
    /// The error.
    #[serde(default)]
    pub error: Option<ErrorBody>,
}

/// The error of an error envelope.
#[derive(Debug, Deserialize)]
pub(crate) struct ErrorBody {
    /// What went wrong.
    #[serde(default)]
    pub message: Option<String>,
    /// `invalid_request_error`, `server_error`, ...
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// `rate_limit_exceeded`, `invalid_api_key`, ... (sometimes absent or a number).
    #[serde(default)]
    pub code: Option<serde_json::Value>,
}
