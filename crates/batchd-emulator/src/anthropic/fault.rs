//! Faults a test injects into the Anthropic emulator, and the log of the calls it answered.
//!
//! The JSON form (`POST /_emulator/anthropic/faults`) and the Rust form are one type:
//! `{"kind":"status","status":429,"retry_after_secs":2,"calls":"create","times":1}` is
//! `AnthropicFault::status(429).retry_after(2).on(AnthropicCalls::Create)`. A fault hits before the call is
//! handled (`status`, `reset`: no batch is created) or after (`delay`, `hold`, `status_after`, `reset_after`: the
//! call takes effect and only its reply is late, held or lost, the "uncertain create" a client resolves by
//! listing).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One injected fault: what goes wrong, which calls it hits, and how many times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnthropicFault {
    /// What goes wrong.
    #[serde(flatten)]
    pub kind: AnthropicFaultKind,
    /// Which calls the fault hits.
    #[serde(default)]
    pub calls: AnthropicCalls,
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
pub enum AnthropicFaultKind {
    /// Answer with this HTTP status and the error envelope of its type (429 `rate_limit_error`, 529
    /// `overloaded_error`, 500 `api_error`, 413 `request_too_large`, ...) without handling the call.
    Status {
        /// HTTP status of the reply.
        status: u16,
        /// Error message; a default from the status when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        /// Value of `retry-after` in seconds; a 429 without it says 1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_secs: Option<u64>,
    },
    /// Close the connection with a reset, without handling the call or sending any reply.
    Reset,
    /// Handle the call at once, send its reply after a delay (a create's batch exists before the client could
    /// time out).
    Delay {
        /// The delay in milliseconds.
        millis: u64,
    },
    /// Handle the call (a create's batch IS created, the call is logged), then hold its reply until the test
    /// releases it (`AnthropicControl::release_held`), the client goes away or the emulator stops: the moment a
    /// test kills the client at, learnt from `AnthropicControl::wait_until_held`.
    Hold,
    /// Handle the call (a create's batch IS created), then answer this status and its error envelope instead.
    StatusAfter {
        /// HTTP status of the reply.
        status: u16,
        /// Value of `retry-after` in seconds; none when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_secs: Option<u64>,
    },
    /// Handle the call (a create's batch IS created), then close the connection without a reply.
    ResetAfter,
    /// Hits the next create only: the batch is created, and these items (indices into `requests`) come back
    /// `errored` with the error type of `status` (a failure on the API's side, not a bad item) instead of running.
    ErrorItems {
        /// Indices into the create's `requests`; out-of-range ones are ignored.
        indices: Vec<usize>,
        /// The HTTP status whose error type the items get (500 `api_error`, 529 `overloaded_error`, ...).
        #[serde(default = "api_error_status")]
        status: u16,
    },
}

fn api_error_status() -> u16 {
    500
}

impl AnthropicFaultKind {
    /// Short snake_case name, as the call log records it.
    pub fn name(&self) -> &'static str {
        match self {
            AnthropicFaultKind::Status { .. } => "status",
            AnthropicFaultKind::Reset => "reset",
            AnthropicFaultKind::Delay { .. } => "delay",
            AnthropicFaultKind::Hold => "hold",
            AnthropicFaultKind::StatusAfter { .. } => "status_after",
            AnthropicFaultKind::ResetAfter => "reset_after",
            AnthropicFaultKind::ErrorItems { .. } => "error_items",
        }
    }
}

/// Which calls a fault hits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnthropicCalls {
    /// `POST /v1/messages/batches`.
    Create,
    /// `GET /v1/messages/batches/{id}`.
    Retrieve,
    /// `GET /v1/messages/batches`.
    List,
    /// `POST /v1/messages/batches/{id}/cancel`.
    Cancel,
    /// `DELETE /v1/messages/batches/{id}`.
    Delete,
    /// `GET /v1/messages/batches/{id}/results`.
    Results,
    /// Every call under `/anthropic`.
    #[default]
    Any,
}

impl AnthropicCalls {
    /// Whether a fault restricted to these calls hits a call of `kind`.
    pub(crate) fn matches(self, kind: AnthropicCallKind) -> bool {
        match self {
            AnthropicCalls::Any => true,
            AnthropicCalls::Create => kind == AnthropicCallKind::Create,
            AnthropicCalls::Retrieve => kind == AnthropicCallKind::Retrieve,
            AnthropicCalls::List => kind == AnthropicCallKind::List,
            AnthropicCalls::Cancel => kind == AnthropicCallKind::Cancel,
            AnthropicCalls::Delete => kind == AnthropicCallKind::Delete,
            AnthropicCalls::Results => kind == AnthropicCallKind::Results,
        }
    }
}

impl AnthropicFault {
    /// A fault of `kind` hitting the next call of any kind, once.
    pub fn new(kind: AnthropicFaultKind) -> Self {
        Self { kind, calls: AnthropicCalls::Any, times: 1 }
    }

    /// Answer `status` with the error envelope of its type, without handling the call.
    pub fn status(status: u16) -> Self {
        Self::new(AnthropicFaultKind::Status { status, message: None, retry_after_secs: None })
    }

    /// Drop the connection without handling the call.
    pub fn reset() -> Self {
        Self::new(AnthropicFaultKind::Reset)
    }

    /// Handle the call, reply after `delay`.
    pub fn delay(delay: Duration) -> Self {
        Self::new(AnthropicFaultKind::Delay { millis: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX) })
    }

    /// Handle the call, then hold its reply until released: see [`AnthropicFaultKind::Hold`].
    pub fn hold() -> Self {
        Self::new(AnthropicFaultKind::Hold)
    }

    /// Handle the call, then answer `status` instead of its reply.
    pub fn status_after(status: u16) -> Self {
        Self::new(AnthropicFaultKind::StatusAfter { status, retry_after_secs: None })
    }

    /// Handle the call, then drop the connection without a reply.
    pub fn reset_after() -> Self {
        Self::new(AnthropicFaultKind::ResetAfter)
    }

    /// Send `retry-after: <secs>` with a `status` or `status_after` fault (no effect on other kinds).
    pub fn retry_after(mut self, secs: u64) -> Self {
        if let AnthropicFaultKind::Status { retry_after_secs, .. }
        | AnthropicFaultKind::StatusAfter { retry_after_secs, .. } = &mut self.kind
        {
            *retry_after_secs = Some(secs);
        }
        self
    }

    /// Make these items of the next create come back `errored` with the error type of `status`.
    pub fn error_items(indices: impl IntoIterator<Item = usize>, status: u16) -> Self {
        Self::new(AnthropicFaultKind::ErrorItems { indices: indices.into_iter().collect(), status })
            .on(AnthropicCalls::Create)
    }

    /// Set the error message of a `status` fault (no effect on other kinds).
    pub fn message(mut self, new_message: impl Into<String>) -> Self {
        if let AnthropicFaultKind::Status { message, .. } = &mut self.kind {
            *message = Some(new_message.into());
        }
        self
    }

    /// Restrict the fault to these calls.
    pub fn on(mut self, calls: AnthropicCalls) -> Self {
        self.calls = calls;
        self
    }

    /// Hit this many calls instead of one.
    pub fn times(mut self, times: u32) -> Self {
        self.times = times;
        self
    }
}

/// Uses up one of the `times` of the oldest fault that hits a call of `kind` (one fault per call; `error_items`
/// only hits creates).
pub(crate) fn take_fault(faults: &mut Vec<AnthropicFault>, kind: AnthropicCallKind) -> Option<AnthropicFaultKind> {
    let hits = |fault: &AnthropicFault| {
        fault.calls.matches(kind)
            && (kind == AnthropicCallKind::Create || !matches!(fault.kind, AnthropicFaultKind::ErrorItems { .. }))
    };
    crate::fault::take_hit(faults, hits).map(|fault| fault.kind)
}

impl crate::fault::Hits for AnthropicFault {
    fn times_mut(&mut self) -> &mut u32 {
        &mut self.times
    }
}

/// What a call was, from its method and path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnthropicCallKind {
    /// `POST /v1/messages/batches`.
    Create,
    /// `GET /v1/messages/batches/{id}`.
    Retrieve,
    /// `GET /v1/messages/batches`.
    List,
    /// `POST /v1/messages/batches/{id}/cancel`.
    Cancel,
    /// `DELETE /v1/messages/batches/{id}`.
    Delete,
    /// `GET /v1/messages/batches/{id}/results`.
    Results,
    /// A path or method the API does not have (answered 404).
    Unknown,
}

/// One call under `/anthropic`, as the emulator answered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnthropicCall {
    /// Position in the log, from 1, never reused until a reset.
    pub seq: u64,
    /// What the call was.
    pub kind: AnthropicCallKind,
    /// The HTTP method.
    pub method: String,
    /// The path, without `/anthropic` and without the query (`/v1/messages/batches/msgbatch_../cancel`).
    pub path: String,
    /// HTTP status of the reply; 0 when the connection was dropped without one.
    pub status: u16,
    /// The batch the call named, or the one a create made (also when a fault replaced the create's reply).
    pub batch_id: Option<String>,
    /// For a create whose body had them, the number of `requests`.
    pub n_requests: Option<usize>,
    /// For a create whose body had them, the `custom_id` of its first request (which names the caller's job in
    /// batchd's format, as `first_reference` does for a Workers AI submit).
    pub first_custom_id: Option<String>,
    /// For an accepted create, the first request's `params.metadata.user_id` (the Messages API's field for the
    /// caller's own end-user id), when it has one: a caller's own name for the work, as `first_reference` is for a
    /// Workers AI submit (the chaos runs put the job id there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_user_id: Option<String>,
    /// For a create whose body was accepted, the names of the top-level `params` members its requests had, each
    /// once, sorted (what a test checks a client sent, or did not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub param_names: Vec<String>,
    /// The `error.type` of an error reply.
    pub error_type: Option<String>,
    /// The injected fault that shaped the call (`status`, `reset`, `delay`, `hold`, `status_after`, `reset_after`).
    pub fault: Option<String>,
    /// When the call arrived, in Unix milliseconds.
    pub at_ms: u64,
    /// The local port the call arrived on (see `EmulatorHandle::listen_also`): which client made it.
    pub port: u16,
}

impl AnthropicCall {
    /// A record of a call arriving now on local `port`, to be completed as it is handled.
    pub(crate) fn arriving(kind: AnthropicCallKind, method: &str, path: &str, port: u16) -> Self {
        let at_ms = crate::state::unix_ms();
        Self {
            seq: 0,
            kind,
            method: method.to_owned(),
            path: path.to_owned(),
            status: 0,
            batch_id: None,
            n_requests: None,
            first_custom_id: None,
            first_user_id: None,
            param_names: Vec::new(),
            error_type: None,
            fault: None,
            at_ms,
            port,
        }
    }
}

/// The call log, oldest first.
#[derive(Debug, Default)]
pub(crate) struct CallLog {
    /// The records.
    records: Vec<AnthropicCall>,
    /// Sequence number of the last record.
    last_seq: u64,
}

impl CallLog {
    pub(crate) fn push(&mut self, mut record: AnthropicCall) {
        self.last_seq += 1;
        record.seq = self.last_seq;
        self.records.push(record);
    }

    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    pub(crate) fn records(&self) -> &[AnthropicCall] {
        &self.records
    }

    pub(crate) fn clear(&mut self) {
        self.records.clear();
        self.last_seq = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_builder_agree() {
        let json = r#"{"kind":"status","status":429,"retry_after_secs":2,"calls":"create","times":3}"#;
        let parsed: AnthropicFault = serde_json::from_str(json).expect("parse fault");
        assert_eq!(parsed, AnthropicFault::status(429).retry_after(2).on(AnthropicCalls::Create).times(3));
        let parsed: AnthropicFault = serde_json::from_str(r#"{"kind":"reset_after"}"#).expect("parse fault");
        assert_eq!(parsed, AnthropicFault::reset_after());
        let parsed: AnthropicFault = serde_json::from_str(r#"{"kind":"hold","calls":"create"}"#).expect("parse fault");
        assert_eq!(parsed, AnthropicFault::hold().on(AnthropicCalls::Create));
        let parsed: AnthropicFault =
            serde_json::from_str(r#"{"kind":"status_after","status":500,"calls":"create"}"#).expect("parse fault");
        assert_eq!(parsed, AnthropicFault::status_after(500).on(AnthropicCalls::Create));
        let parsed: AnthropicFault =
            serde_json::from_str(r#"{"kind":"error_items","indices":[1,2],"calls":"create"}"#).expect("parse fault");
        assert_eq!(parsed, AnthropicFault::error_items([1, 2], 500));
    }

    #[test]
    fn faults_are_taken_oldest_matching_first_and_used_up() {
        let mut faults = vec![
            AnthropicFault::status(529).on(AnthropicCalls::Cancel),
            AnthropicFault::status(500).on(AnthropicCalls::Create).times(2),
        ];
        assert_eq!(take_fault(&mut faults, AnthropicCallKind::List), None);
        for _ in 0..2 {
            let taken = take_fault(&mut faults, AnthropicCallKind::Create).expect("a fault");
            assert_eq!(taken, AnthropicFaultKind::Status { status: 500, message: None, retry_after_secs: None });
        }
        assert_eq!(take_fault(&mut faults, AnthropicCallKind::Create), None);
        assert_eq!(faults.len(), 1);
        faults.insert(0, AnthropicFault::new(AnthropicFaultKind::ErrorItems { indices: vec![0], status: 529 }));
        assert_eq!(take_fault(&mut faults, AnthropicCallKind::Cancel).map(|kind| kind.name()), Some("status"));
        assert_eq!(take_fault(&mut faults, AnthropicCallKind::Create).map(|kind| kind.name()), Some("error_items"));
    }
}
