//! Faults a test injects into the Gemini emulator, and the log of the calls it answered.
//!
//! The JSON form (`POST /_emulator/gemini/faults`) and the Rust form are one type:
//! `{"kind":"status","status":429,"calls":"create","times":2}` is
//! `GeminiFault::status(429).on(GeminiCalls::Create).times(2)`. A fault hits before the call is handled (`status`,
//! `reset`: no batch is created) or after (`hold`, `status_after`: the create takes effect and only its reply is
//! held or lost, the "uncertain create" a client resolves by listing batches by display name).

use serde::{Deserialize, Serialize};

/// One injected fault: what goes wrong, which calls it hits, and how many times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeminiFault {
    /// What goes wrong.
    #[serde(flatten)]
    pub kind: GeminiFaultKind,
    /// Which calls the fault hits.
    #[serde(default)]
    pub calls: GeminiCalls,
    /// How many matching calls the fault hits.
    #[serde(default = "one")]
    pub times: u32,
}

fn one() -> u32 {
    1
}

/// What goes wrong with a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GeminiFaultKind {
    /// Answer this HTTP status with the google.rpc error envelope of its status name (429 `RESOURCE_EXHAUSTED`,
    /// 500 `INTERNAL`, 503 `UNAVAILABLE`, ...) without handling the call: a create creates nothing. Users report
    /// 429 on create well below the documented quota (python-genai #1901, js-genai #1264).
    Status {
        /// HTTP status of the reply.
        status: u16,
        /// Error message; a default from the status when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// Close the connection with a reset, without handling the call or sending any reply.
    Reset,
    /// Handle the call (a create's batch IS created, the call is logged), then hold its reply until the test
    /// releases it (`GeminiControl::release_held`), the client goes away or the emulator stops.
    Hold,
    /// Handle the call (a create's batch IS created), then answer this status and its error envelope instead.
    StatusAfter {
        /// HTTP status of the reply.
        status: u16,
    },
    /// Hits the next create only: its batch is created and ends `FAILED` (with an operation `error`) instead of
    /// succeeding.
    FailBatch,
}

impl GeminiFaultKind {
    /// Short snake_case name, as the call log records it.
    pub fn name(&self) -> &'static str {
        match self {
            GeminiFaultKind::Status { .. } => "status",
            GeminiFaultKind::Reset => "reset",
            GeminiFaultKind::Hold => "hold",
            GeminiFaultKind::StatusAfter { .. } => "status_after",
            GeminiFaultKind::FailBatch => "fail_batch",
        }
    }
}

/// Which calls a fault hits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GeminiCalls {
    /// `POST /v1beta/models/{model}:batchGenerateContent`.
    Create,
    /// `GET /v1beta/batches/{id}`.
    Get,
    /// `GET /v1beta/batches`.
    List,
    /// `POST /v1beta/batches/{id}:cancel`.
    Cancel,
    /// `DELETE /v1beta/batches/{id}`.
    Delete,
    /// Both steps of a resumable upload (`/upload/v1beta/files`).
    Upload,
    /// `GET /download/v1beta/files/{id}:download`.
    Download,
    /// Every call under `/gemini`.
    #[default]
    Any,
}

impl GeminiCalls {
    /// Whether a call of `kind` is one of these.
    fn matches(self, kind: GeminiCallKind) -> bool {
        match self {
            GeminiCalls::Any => true,
            GeminiCalls::Create => kind == GeminiCallKind::Create,
            GeminiCalls::Get => kind == GeminiCallKind::Get,
            GeminiCalls::List => kind == GeminiCallKind::List,
            GeminiCalls::Cancel => kind == GeminiCallKind::Cancel,
            GeminiCalls::Delete => kind == GeminiCallKind::Delete,
            GeminiCalls::Upload => matches!(kind, GeminiCallKind::UploadStart | GeminiCallKind::UploadBytes),
            GeminiCalls::Download => kind == GeminiCallKind::Download,
        }
    }
}

impl GeminiFault {
    fn new(kind: GeminiFaultKind) -> Self {
        Self { kind, calls: GeminiCalls::Any, times: 1 }
    }

    /// Answer `status` without handling the call.
    pub fn status(status: u16) -> Self {
        Self::new(GeminiFaultKind::Status { status, message: None })
    }

    /// Reset the connection without handling the call.
    pub fn reset() -> Self {
        Self::new(GeminiFaultKind::Reset)
    }

    /// Handle the call, then hold its reply until released.
    pub fn hold() -> Self {
        Self::new(GeminiFaultKind::Hold)
    }

    /// Handle the call, then answer `status` instead of its reply.
    pub fn status_after(status: u16) -> Self {
        Self::new(GeminiFaultKind::StatusAfter { status })
    }

    /// The next created batch ends `FAILED`.
    pub fn fail_batch() -> Self {
        Self { calls: GeminiCalls::Create, ..Self::new(GeminiFaultKind::FailBatch) }
    }

    /// Hits only these calls.
    pub fn on(mut self, calls: GeminiCalls) -> Self {
        self.calls = calls;
        self
    }

    /// Hits this many matching calls.
    pub fn times(mut self, times: u32) -> Self {
        self.times = times;
        self
    }
}

/// Uses up one hit of the oldest fault that hits a call of `kind` (a `fail_batch` hits creates only).
pub(crate) fn take_fault(faults: &mut Vec<GeminiFault>, kind: GeminiCallKind) -> Option<GeminiFaultKind> {
    let hits = |fault: &GeminiFault| {
        fault.calls.matches(kind) && (kind == GeminiCallKind::Create || fault.kind != GeminiFaultKind::FailBatch)
    };
    crate::fault::take_hit(faults, hits).map(|fault| fault.kind)
}

impl crate::fault::Hits for GeminiFault {
    fn times_mut(&mut self) -> &mut u32 {
        &mut self.times
    }
}

/// What a call was, from its method and path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GeminiCallKind {
    /// `POST /v1beta/models/{model}:batchGenerateContent`.
    Create,
    /// `GET /v1beta/batches/{id}`.
    Get,
    /// `GET /v1beta/batches`.
    List,
    /// `POST /v1beta/batches/{id}:cancel`.
    Cancel,
    /// `DELETE /v1beta/batches/{id}`.
    Delete,
    /// `POST /upload/v1beta/files` with `x-goog-upload-command: start`.
    UploadStart,
    /// `POST /upload/v1beta/files?upload_id=..` with the bytes (`upload`, `finalize`).
    UploadBytes,
    /// `GET /v1beta/files/{id}`.
    GetFile,
    /// `DELETE /v1beta/files/{id}`.
    DeleteFile,
    /// `GET /download/v1beta/files/{id}:download?alt=media`.
    Download,
    /// Anything else.
    Unknown,
}

/// One call in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeminiCall {
    /// Position in the log, from 1, never reused until a reset.
    pub seq: u64,
    /// What the call was.
    pub kind: GeminiCallKind,
    /// The HTTP method.
    pub method: String,
    /// The path, without `/gemini` and without the query.
    pub path: String,
    /// HTTP status of the reply; 0 when the connection was dropped without one.
    pub status: u16,
    /// The batch (`batches/..`) the call named, or the one a create made (also when a fault replaced its reply).
    pub batch_name: Option<String>,
    /// A create's `displayName`.
    pub display_name: Option<String>,
    /// A create's number of requests (inline or file lines), once read.
    pub n_requests: Option<usize>,
    /// A create's first request `key`.
    pub first_key: Option<String>,
    /// The google.rpc `status` of an error reply (`RESOURCE_EXHAUSTED`, ...).
    pub error_status: Option<String>,
    /// The injected fault that shaped the call (`status`, `reset`, `hold`, `status_after`, `fail_batch`).
    pub fault: Option<String>,
    /// When the call arrived, in Unix milliseconds.
    pub at_ms: u64,
    /// The local port the call arrived on (see `EmulatorHandle::listen_also`).
    pub port: u16,
}

impl GeminiCall {
    /// A record of a call arriving now on local `port`, to be completed as it is handled.
    pub(crate) fn arriving(kind: GeminiCallKind, method: &str, path: &str, port: u16) -> Self {
        let at_ms = crate::state::unix_ms();
        Self {
            seq: 0,
            kind,
            method: method.to_owned(),
            path: path.chars().take(200).collect(),
            status: 0,
            batch_name: None,
            display_name: None,
            n_requests: None,
            first_key: None,
            error_status: None,
            fault: None,
            at_ms,
            port,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_rust_forms_are_one_type() {
        let fault: GeminiFault =
            serde_json::from_str(r#"{"kind":"status","status":429,"calls":"create","times":2}"#).expect("parse");
        assert_eq!(fault, GeminiFault::status(429).on(GeminiCalls::Create).times(2));
        let hold: GeminiFault = serde_json::from_str(r#"{"kind":"hold","calls":"create"}"#).expect("parse");
        assert_eq!(hold, GeminiFault::hold().on(GeminiCalls::Create));
    }

    #[test]
    fn a_fail_batch_waits_for_a_create() {
        let mut faults = vec![GeminiFault::fail_batch().on(GeminiCalls::Any)];
        assert_eq!(take_fault(&mut faults, GeminiCallKind::Get), None);
        assert_eq!(take_fault(&mut faults, GeminiCallKind::Create), Some(GeminiFaultKind::FailBatch));
        assert!(faults.is_empty());
    }
}
