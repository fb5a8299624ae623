//! What a test injects into the OpenAI emulator (faults) and what it reads back (the call log).
//!
//! The JSON form (`POST /_emulator/openai/faults`) and the Rust form are the same type, as in the Cloudflare
//! emulator's `fault.rs`: `{"kind":"status","status":429,"retry_after_secs":2,"calls":"create_batch","times":1}` is
//! `OpenAiFault::status(429).retry_after(2).on(OpenAiCallKind::CreateBatch)`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which endpoint a call reached; also the filter of a call-level fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpenAiCallKind {
    /// `POST /v1/files`.
    Upload,
    /// `GET /v1/files`.
    ListFiles,
    /// `GET /v1/files/{id}`.
    GetFile,
    /// `GET /v1/files/{id}/content`.
    FileContent,
    /// `DELETE /v1/files/{id}`.
    DeleteFile,
    /// `POST /v1/batches`.
    CreateBatch,
    /// `GET /v1/batches/{id}`.
    GetBatch,
    /// `GET /v1/batches`.
    ListBatches,
    /// `POST /v1/batches/{id}/cancel`.
    CancelBatch,
    /// A path or method the API does not have (never hit by a fault).
    Unrouted,
}

/// One injected fault: what goes wrong, which calls (or batches) it hits, and how many times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenAiFault {
    /// What goes wrong.
    #[serde(flatten)]
    pub kind: OpenAiFaultKind,
    /// The only kind of call a call-level fault hits; `None` (absent in JSON): any routed call. Batch-level faults
    /// ignore it (they hit the next batches created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<OpenAiCallKind>,
    /// How many matching calls (call-level) or created batches (batch-level) the fault hits.
    #[serde(default = "one")]
    pub times: u32,
    /// Call-level only: the call is handled first (an upload stores its file, a create makes its batch) and only
    /// then is its reply replaced (status, reset) or held back (delay). This is the "uncertain create": the client
    /// sees an error or a dropped connection, yet the batch exists.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_handling: bool,
}

fn one() -> u32 {
    1
}

/// What goes wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OpenAiFaultKind {
    /// Call-level: reply with this HTTP status and the OpenAI error envelope.
    Status {
        /// HTTP status of the reply.
        status: u16,
        /// `error.message`; a default is picked from the status when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        /// `error.code`; a default is picked from the status when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        /// Value of a `retry-after` header, in seconds; no header when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_secs: Option<u64>,
    },
    /// Call-level: close the connection (with a reset) without any HTTP response.
    Reset,
    /// Call-level: reply normally, but only after this many milliseconds.
    Delay {
        /// The delay in milliseconds.
        millis: u64,
    },
    /// Call-level: hold the call open until the test releases it (`OpenAiHandle::release_held`), the client goes
    /// away or the emulator stops. With `after_handling`, the call is handled and logged first and only its reply
    /// waits: a create's batch exists while the client still waits for its id, the moment a test kills the client
    /// at (it learns of the hold from `OpenAiHandle::wait_until_held`).
    Hold,
    /// Batch-level: the next batch fails validation with `token_limit_exceeded` (the enqueued-token limit), as
    /// observed in practice: the create succeeds, the batch then turns `failed`.
    TokenLimitExceeded,
    /// Batch-level: these input lines of the next batch fail alone (0-based line indices; out-of-range ones are
    /// ignored): their error-file line has `status_code` 500 and a `server_error` body.
    FailItems {
        /// 0-based indices of input lines.
        indices: Vec<usize>,
    },
    /// Batch-level: the next batch finishes this many requests and then makes no progress, so it stays
    /// `in_progress` until it is cancelled or expires (deterministic partial results).
    Stall {
        /// Requests that finish before the batch stalls.
        after_items: usize,
    },
}

impl OpenAiFaultKind {
    /// Short snake_case name, as recorded in the call log.
    pub fn name(&self) -> &'static str {
        match self {
            OpenAiFaultKind::Status { .. } => "status",
            OpenAiFaultKind::Reset => "reset",
            OpenAiFaultKind::Delay { .. } => "delay",
            OpenAiFaultKind::Hold => "hold",
            OpenAiFaultKind::TokenLimitExceeded => "token_limit_exceeded",
            OpenAiFaultKind::FailItems { .. } => "fail_items",
            OpenAiFaultKind::Stall { .. } => "stall",
        }
    }

    /// Whether the fault applies to a created batch rather than to a single call.
    pub fn is_batch_level(&self) -> bool {
        matches!(
            self,
            OpenAiFaultKind::TokenLimitExceeded | OpenAiFaultKind::FailItems { .. } | OpenAiFaultKind::Stall { .. }
        )
    }
}

impl OpenAiFault {
    /// A fault of `kind` hitting the next routed call (or the next batch), once, before the call is handled.
    pub fn new(kind: OpenAiFaultKind) -> Self {
        Self { kind, calls: None, times: 1, after_handling: false }
    }

    /// Reply with `status` and an error envelope (message and code default from the status).
    pub fn status(status: u16) -> Self {
        Self::new(OpenAiFaultKind::Status { status, message: None, code: None, retry_after_secs: None })
    }

    /// Close the connection without any HTTP response.
    pub fn reset() -> Self {
        Self::new(OpenAiFaultKind::Reset)
    }

    /// Reply normally after `delay`.
    pub fn delay(delay: Duration) -> Self {
        Self::new(OpenAiFaultKind::Delay { millis: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX) })
    }

    /// Hold the call open until released: see [`OpenAiFaultKind::Hold`]. `OpenAiFault::hold().on(CreateBatch)
    /// .after_handling()` makes the batch, logs the call, and holds only the reply.
    pub fn hold() -> Self {
        Self::new(OpenAiFaultKind::Hold)
    }

    /// The next batch fails validation with `token_limit_exceeded`.
    pub fn token_limit_exceeded() -> Self {
        Self::new(OpenAiFaultKind::TokenLimitExceeded)
    }

    /// These 0-based input lines of the next batch fail alone (500 in the error file).
    pub fn fail_items(indices: impl IntoIterator<Item = usize>) -> Self {
        Self::new(OpenAiFaultKind::FailItems { indices: indices.into_iter().collect() })
    }

    /// The next batch stalls after `after_items` requests.
    pub fn stall(after_items: usize) -> Self {
        Self::new(OpenAiFaultKind::Stall { after_items })
    }

    /// Set `error.message` of a `status` fault (no effect on other kinds).
    pub fn message(mut self, new_message: impl Into<String>) -> Self {
        if let OpenAiFaultKind::Status { message, .. } = &mut self.kind {
            *message = Some(new_message.into());
        }
        self
    }

    /// Set `error.code` of a `status` fault (no effect on other kinds).
    pub fn code(mut self, new_code: impl Into<String>) -> Self {
        if let OpenAiFaultKind::Status { code, .. } = &mut self.kind {
            *code = Some(new_code.into());
        }
        self
    }

    /// Send `retry-after: <secs>` with a `status` fault (no effect on other kinds).
    pub fn retry_after(mut self, secs: u64) -> Self {
        if let OpenAiFaultKind::Status { retry_after_secs, .. } = &mut self.kind {
            *retry_after_secs = Some(secs);
        }
        self
    }

    /// Restrict a call-level fault to one kind of call.
    pub fn on(mut self, calls: OpenAiCallKind) -> Self {
        self.calls = Some(calls);
        self
    }

    /// Hit this many calls (or batches) instead of one.
    pub fn times(mut self, times: u32) -> Self {
        self.times = times;
        self
    }

    /// Handle the call first, then replace (or delay) its reply: see [`OpenAiFault::after_handling`].
    pub fn after_handling(mut self) -> Self {
        self.after_handling = true;
        self
    }

    /// Whether this call-level fault hits a call of `kind` at this stage (`after`: the call was handled).
    pub(crate) fn hits(&self, kind: OpenAiCallKind, after: bool) -> bool {
        kind != OpenAiCallKind::Unrouted
            && !self.kind.is_batch_level()
            && self.after_handling == after
            && self.calls.is_none_or(|calls| calls == kind)
    }
}

/// One call to the OpenAI emulator, as it saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenAiCallRecord {
    /// Position in the log, from 1, never reused until a reset.
    pub seq: u64,
    /// Which endpoint the call reached.
    pub kind: OpenAiCallKind,
    /// HTTP method.
    pub method: String,
    /// The path as sent (`/openai/v1/batches/batch_...`), without the query.
    pub path: String,
    /// HTTP status of the reply; 0 when the connection was reset without one.
    pub http_status: u16,
    /// The batch the call created or named, when it did.
    pub batch_id: Option<String>,
    /// The file the call uploaded or named (for a create, its `input_file_id`), when it did.
    pub file_id: Option<String>,
    /// `error.code` (or, when that is null, `error.type`) of an error reply.
    pub error_code: Option<String>,
    /// Names of the injected faults that shaped the call (`status`, `reset+delay`, ...).
    pub fault: Option<String>,
    /// The reply's `x-request-id`.
    pub request_id: String,
    /// When the call arrived, in Unix milliseconds.
    pub at_ms: u64,
    /// The local port the call arrived on (see `EmulatorHandle::listen_also`).
    pub port: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_builder_agree() {
        let json = r#"{"kind":"status","status":429,"retry_after_secs":2,"calls":"create_batch","times":3}"#;
        let parsed: OpenAiFault = serde_json::from_str(json).expect("parse fault");
        assert_eq!(parsed, OpenAiFault::status(429).retry_after(2).on(OpenAiCallKind::CreateBatch).times(3));
        let json = r#"{"kind":"reset","calls":"create_batch","after_handling":true}"#;
        let parsed: OpenAiFault = serde_json::from_str(json).expect("parse fault");
        assert_eq!(parsed, OpenAiFault::reset().on(OpenAiCallKind::CreateBatch).after_handling());
        let parsed: OpenAiFault = serde_json::from_str(r#"{"kind":"stall","after_items":2}"#).expect("parse");
        assert_eq!(parsed, OpenAiFault::stall(2));
        let json = r#"{"kind":"hold","calls":"create_batch","after_handling":true}"#;
        let parsed: OpenAiFault = serde_json::from_str(json).expect("parse fault");
        assert_eq!(parsed, OpenAiFault::hold().on(OpenAiCallKind::CreateBatch).after_handling());
        assert!(!parsed.kind.is_batch_level());
    }

    #[test]
    fn a_call_fault_hits_its_kind_and_stage_only() {
        let fault = OpenAiFault::status(500).on(OpenAiCallKind::CreateBatch).after_handling();
        assert!(fault.hits(OpenAiCallKind::CreateBatch, true));
        assert!(!fault.hits(OpenAiCallKind::CreateBatch, false));
        assert!(!fault.hits(OpenAiCallKind::GetBatch, true));
        let any = OpenAiFault::status(503);
        assert!(any.hits(OpenAiCallKind::Upload, false) && !any.hits(OpenAiCallKind::Unrouted, false));
        assert!(!OpenAiFault::stall(1).hits(OpenAiCallKind::CreateBatch, false));
    }
}
