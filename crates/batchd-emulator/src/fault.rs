//! Faults a test injects: misbehaviour of single API calls, or of whole batches.
//!
//! The JSON form (`POST /_emulator/faults`) and the Rust form are the same type:
//! `{"kind":"status","status":429,"code":3040,"retry_after_secs":2,"calls":"submit","times":1}` is
//! `Fault::status(429).code(3040).retry_after(2).on(Calls::Submit).times(1)`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One injected fault: what goes wrong, which calls it hits, and how many times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// What goes wrong.
    #[serde(flatten)]
    pub kind: FaultKind,
    /// Which API calls a call-level fault hits; batch-level faults ignore it (they hit submits).
    #[serde(default)]
    pub calls: Calls,
    /// How many matching calls (call-level) or submitted batches (batch-level) the fault hits.
    #[serde(default = "one")]
    pub times: u32,
}

fn one() -> u32 {
    1
}

/// Which API calls a call-level fault applies to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Calls {
    /// Only submits (a body without `request_id`).
    Submit,
    /// Only polls (a body with `request_id`).
    Poll,
    /// Submits and polls: every call to the Workers AI run endpoint, but no queue call (so a consumer pulling in
    /// the background never uses up a fault meant for the batch API).
    #[default]
    Any,
    /// Only pulls of the events queue.
    Pull,
    /// Only acks of the events queue.
    Ack,
    /// Pulls and acks.
    Queue,
    /// Only reads of the model catalog (`ai/models/search`).
    Catalog,
    /// Only calls of the event subscriptions API.
    Subscriptions,
}

/// The endpoint a call reached, to match it against [`Calls`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// A submit to the run endpoint.
    Submit,
    /// A poll of the run endpoint.
    Poll,
    /// A pull of the events queue.
    Pull,
    /// An ack of the events queue.
    Ack,
    /// A read of the model catalog.
    Catalog,
    /// A call of the event subscriptions API.
    Subscriptions,
}

impl Calls {
    /// Whether a fault restricted to these calls hits a call of `endpoint`.
    pub(crate) fn matches(self, endpoint: Endpoint) -> bool {
        match self {
            Calls::Submit => endpoint == Endpoint::Submit,
            Calls::Poll => endpoint == Endpoint::Poll,
            Calls::Any => matches!(endpoint, Endpoint::Submit | Endpoint::Poll),
            Calls::Pull => endpoint == Endpoint::Pull,
            Calls::Ack => endpoint == Endpoint::Ack,
            Calls::Queue => matches!(endpoint, Endpoint::Pull | Endpoint::Ack),
            Calls::Catalog => endpoint == Endpoint::Catalog,
            Calls::Subscriptions => endpoint == Endpoint::Subscriptions,
        }
    }
}

/// What goes wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// Call-level: answer with this HTTP status and an error envelope.
    Status {
        /// HTTP status of the reply.
        status: u16,
        /// Error code in the envelope; a default is picked from the status when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<i64>,
        /// Error message in the envelope; a default is picked from the status when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        /// Value of a `Retry-After` header, in seconds; no header when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_secs: Option<u64>,
    },
    /// Call-level: answer with this HTTP status and an HTML page, like a proxy in front of the API.
    Html {
        /// HTTP status of the reply.
        status: u16,
    },
    /// Call-level: close the TCP connection (with a reset) without sending any HTTP response.
    Reset,
    /// Call-level: answer normally, but only after a delay.
    Delay {
        /// The delay in milliseconds.
        millis: u64,
    },
    /// Batch-level: these item indices of the next batch fail (`success: false` with an `error` object).
    FailItems {
        /// Indices into the submitted `requests` array; out-of-range indices are ignored.
        indices: Vec<usize>,
    },
    /// Batch-level: the next batch fails as a whole; once it would be done, polls answer HTTP 500, code 5001.
    FailBatch,
    /// Batch-level: the next batch completes in the docs' `responses[]` shape keyed by `id` (by default a batch
    /// completes in `results[]` keyed by `index`, as live replies do in 2026; `EmulatorConfig::documented_shape`
    /// makes every batch use the docs' shape).
    DocumentedShape,
    /// Batch-level: these item indices of the next batch are missing from its completion.
    DropItems {
        /// Indices into the submitted `requests` array; out-of-range indices are ignored.
        indices: Vec<usize>,
    },
    /// Batch-level: while the next batch is not done, its polls report this `status` instead of
    /// `queued`/`running` (an undocumented pending status, such as `processing`); once done it completes normally.
    PendingStatus {
        /// The status string pending polls report.
        status: String,
    },
    /// Batch-level: while the next batch is not done, its polls also carry an empty list, `"responses": []`.
    EmptyPendingList,
    /// Batch-level: the next batch's replies use unexpected JSON types that mean the same thing (`success` as
    /// `"true"` or `1`, item ids as numeric strings, item results as JSON text); see the README.
    OddTypes,
}

impl FaultKind {
    /// Short snake_case name, as recorded in the call log.
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::Status { .. } => "status",
            FaultKind::Html { .. } => "html",
            FaultKind::Reset => "reset",
            FaultKind::Delay { .. } => "delay",
            FaultKind::FailItems { .. } => "fail_items",
            FaultKind::FailBatch => "fail_batch",
            FaultKind::DocumentedShape => "documented_shape",
            FaultKind::DropItems { .. } => "drop_items",
            FaultKind::PendingStatus { .. } => "pending_status",
            FaultKind::EmptyPendingList => "empty_pending_list",
            FaultKind::OddTypes => "odd_types",
        }
    }

    /// Whether the fault applies to a submitted batch rather than to a single call.
    pub fn is_batch_level(&self) -> bool {
        matches!(
            self,
            FaultKind::FailItems { .. }
                | FaultKind::FailBatch
                | FaultKind::DocumentedShape
                | FaultKind::DropItems { .. }
                | FaultKind::PendingStatus { .. }
                | FaultKind::EmptyPendingList
                | FaultKind::OddTypes
        )
    }
}

impl Fault {
    /// A fault of `kind` hitting the next call of any kind (or the next batch), once.
    pub fn new(kind: FaultKind) -> Self {
        Self { kind, calls: Calls::Any, times: 1 }
    }

    /// Reply with `status` and an error envelope (code and message default from the status).
    pub fn status(status: u16) -> Self {
        Self::new(FaultKind::Status { status, code: None, message: None, retry_after_secs: None })
    }

    /// Reply with `status` and an HTML page instead of JSON.
    pub fn html(status: u16) -> Self {
        Self::new(FaultKind::Html { status })
    }

    /// Close the connection without any HTTP response.
    pub fn reset() -> Self {
        Self::new(FaultKind::Reset)
    }

    /// Answer normally after `delay`.
    pub fn delay(delay: Duration) -> Self {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        Self::new(FaultKind::Delay { millis })
    }

    /// Fail these items of the next batch.
    pub fn fail_items(indices: impl IntoIterator<Item = usize>) -> Self {
        Self::new(FaultKind::FailItems { indices: indices.into_iter().collect() })
    }

    /// Fail the next batch as a whole.
    pub fn fail_batch() -> Self {
        Self::new(FaultKind::FailBatch)
    }

    /// Complete the next batch in the docs' `responses[]`/`id` shape.
    pub fn documented_shape() -> Self {
        Self::new(FaultKind::DocumentedShape)
    }

    /// Leave these items out of the next batch's completion.
    pub fn drop_items(indices: impl IntoIterator<Item = usize>) -> Self {
        Self::new(FaultKind::DropItems { indices: indices.into_iter().collect() })
    }

    /// Report `status` (say `processing`) in the pending polls of the next batch instead of `queued`/`running`.
    pub fn pending_status(status: impl Into<String>) -> Self {
        Self::new(FaultKind::PendingStatus { status: status.into() })
    }

    /// Add `"responses": []` to the pending polls of the next batch.
    pub fn empty_pending_list() -> Self {
        Self::new(FaultKind::EmptyPendingList)
    }

    /// Answer the next batch's submit and polls with unexpected JSON types that mean the same thing.
    pub fn odd_types() -> Self {
        Self::new(FaultKind::OddTypes)
    }

    /// Set the envelope error code of a `status` fault (no effect on other kinds).
    pub fn code(mut self, new_code: i64) -> Self {
        if let FaultKind::Status { code, .. } = &mut self.kind {
            *code = Some(new_code);
        }
        self
    }

    /// Set the envelope error message of a `status` fault (no effect on other kinds).
    pub fn message(mut self, new_message: impl Into<String>) -> Self {
        if let FaultKind::Status { message, .. } = &mut self.kind {
            *message = Some(new_message.into());
        }
        self
    }

    /// Send `Retry-After: <secs>` with a `status` fault (no effect on other kinds).
    pub fn retry_after(mut self, secs: u64) -> Self {
        if let FaultKind::Status { retry_after_secs, .. } = &mut self.kind {
            *retry_after_secs = Some(secs);
        }
        self
    }

    /// Restrict a call-level fault to submits, polls, pulls or acks (see [`Calls`]).
    pub fn on(mut self, calls: Calls) -> Self {
        self.calls = calls;
        self
    }

    /// Hit this many calls (or batches) instead of one.
    pub fn times(mut self, times: u32) -> Self {
        self.times = times;
        self
    }
}

/// A fault that hits a number of calls: what [`take_hit`] counts down.
pub(crate) trait Hits {
    /// How many matching calls the fault still hits.
    fn times_mut(&mut self) -> &mut u32;
}

/// Uses up one hit of the first fault `hits` accepts and answers it as it was; a fault whose hits are used up is
/// removed. The faults of the Anthropic and Gemini emulators are taken so.
pub(crate) fn take_hit<F: Hits + Clone>(faults: &mut Vec<F>, hits: impl Fn(&F) -> bool) -> Option<F> {
    let position = faults.iter().position(hits)?;
    let taken = faults[position].clone();
    let times = faults[position].times_mut();
    *times = times.saturating_sub(1);
    if *times == 0 {
        faults.remove(position);
    }
    Some(taken)
}

/// Default envelope code and message for a `status` fault without them.
pub(crate) fn default_error_for_status(status: u16) -> (i64, String) {
    match status {
        401 | 403 => (10000, "Authentication error".to_owned()),
        408 => (3007, "Request timeout".to_owned()),
        413 => (3006, "Request is too large".to_owned()),
        429 => (3040, "Capacity temporarily exceeded, please try again.".to_owned()),
        other => {
            let reason = axum::http::StatusCode::from_u16(other)
                .ok()
                .and_then(|code| code.canonical_reason())
                .unwrap_or("Error");
            (i64::from(other), reason.to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_builder_agree() {
        let json = r#"{"kind":"status","status":429,"code":3040,"retry_after_secs":2,"calls":"submit","times":3}"#;
        let parsed: Fault = serde_json::from_str(json).expect("parse fault");
        assert_eq!(parsed, Fault::status(429).code(3040).retry_after(2).on(Calls::Submit).times(3));
    }

    #[test]
    fn calls_and_times_default_to_any_and_one() {
        let parsed: Fault = serde_json::from_str(r#"{"kind":"fail_items","indices":[1,3]}"#).expect("parse fault");
        assert_eq!(parsed, Fault::fail_items([1, 3]));
        let parsed: Fault = serde_json::from_str(r#"{"kind":"reset"}"#).expect("parse fault");
        assert_eq!(parsed, Fault::reset());
    }

    #[test]
    fn any_means_the_batch_api_and_queue_calls_are_named() {
        assert!(Calls::Any.matches(Endpoint::Submit) && Calls::Any.matches(Endpoint::Poll));
        assert!(!Calls::Any.matches(Endpoint::Pull) && !Calls::Any.matches(Endpoint::Ack));
        assert!(Calls::Queue.matches(Endpoint::Pull) && Calls::Queue.matches(Endpoint::Ack));
        assert!(Calls::Pull.matches(Endpoint::Pull) && !Calls::Pull.matches(Endpoint::Ack));
        let parsed: Fault = serde_json::from_str(r#"{"kind":"status","status":503,"calls":"pull"}"#).expect("parse");
        assert_eq!(parsed, Fault::status(503).on(Calls::Pull));
    }

    #[test]
    fn reply_variant_faults_have_their_json_forms() {
        let cases = [
            (r#"{"kind":"pending_status","status":"processing"}"#, Fault::pending_status("processing")),
            (r#"{"kind":"empty_pending_list"}"#, Fault::empty_pending_list()),
            (r#"{"kind":"odd_types","times":2}"#, Fault::odd_types().times(2)),
        ];
        for (json, fault) in cases {
            let parsed: Fault = serde_json::from_str(json).expect("parse fault");
            assert_eq!(parsed, fault, "{json}");
            assert!(parsed.kind.is_batch_level(), "{json}");
        }
        let written = serde_json::to_value(Fault::pending_status("processing")).expect("serialize");
        assert_eq!(written["kind"], "pending_status");
        assert_eq!(written["status"], "processing");
    }
}
