//! The call logs: one record per API call the emulator answered (or refused to answer).
//!
//! Calls to the Workers AI run endpoint go to one log ([`CallRecord`]); pulls and acks of the events queue go to
//! their own ([`QueueCallRecord`]), so a consumer pulling in the background never shows up among submits and polls.

use serde::{Deserialize, Serialize};

/// What an API call turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    /// A body with `requests` (or at least without `request_id`) that got past validation, or hit a fault or
    /// the rate limit.
    Submit,
    /// A body with `request_id`, whatever the answer.
    Poll,
    /// Refused before it could be treated as a submit or a poll: auth, routing, model, size or body errors.
    Rejected,
}

/// One API call, as the emulator saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    /// Position in the log, from 1, never reused until a reset.
    pub seq: u64,
    /// Submit, poll or rejected.
    pub kind: CallKind,
    /// Model from the URL, percent-decoded (empty when the URL did not route).
    pub model: String,
    /// Account id from the URL (empty when the URL did not route).
    pub account_id: String,
    /// For an accepted submit the new request id; for a poll the polled id; otherwise `None`.
    pub request_id: Option<String>,
    /// HTTP status of the reply; 0 when the connection was reset without a reply.
    pub http_status: u16,
    /// Exact length of the raw request body in bytes, as received (whitespace included).
    pub body_bytes: usize,
    /// Number of items in `requests`, for a submit whose body had them.
    pub n_items: Option<usize>,
    /// Envelope error code of the reply, when it was an error envelope.
    pub error_code: Option<i64>,
    /// When the call arrived, in Unix milliseconds.
    pub at_ms: u64,
    /// Names of the injected faults that shaped this call (`reset`, `fail_items+documented_shape`, ...; random
    /// faults are `random_500`, `random_502`, `random_503`, `random_reset`).
    pub fault: Option<String>,
    /// For a submit, the `external_reference` of its first request item when that is a string: lets a test
    /// that labels its items tell which job (and chunk) a remote batch belongs to, e.g. to count duplicates.
    #[serde(default)]
    pub first_reference: Option<String>,
    /// The local port the call arrived on: with [`crate::EmulatorHandle::listen_also`], each client can be given
    /// its own port, so the log tells which client made each call.
    #[serde(default)]
    pub port: u16,
}

/// Which queue endpoint a call reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueCallKind {
    /// `POST .../queues/{queue_id}/messages/pull`.
    Pull,
    /// `POST .../queues/{queue_id}/messages/ack`.
    Ack,
}

/// One call to the queue endpoints, as the emulator saw it (refused ones included: see `http_status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueCallRecord {
    /// Position in the queue call log, from 1, never reused until a reset.
    pub seq: u64,
    /// Pull or ack (from the URL).
    pub kind: QueueCallKind,
    /// Account id from the URL.
    pub account_id: String,
    /// Queue id from the URL.
    pub queue_id: String,
    /// HTTP status of the reply; 0 when the connection was reset without a reply.
    pub http_status: u16,
    /// Envelope error code of the reply, when it was an error envelope.
    pub error_code: Option<i64>,
    /// When the call arrived, in Unix milliseconds.
    pub at_ms: u64,
    /// Names of the faults that shaped this call: injected or random call-level faults (`status`, `reset`, ...,
    /// `random_500`, ...) and `rate_limit` for the pull rate limit's 429s.
    pub fault: Option<String>,
    /// The local port the call arrived on (see [`CallRecord::port`]).
    pub port: u16,
    /// Exact length of the raw request body in bytes.
    pub body_bytes: usize,
    /// For an answered pull: the `batch_size` it used (asked for, or the default 5).
    pub batch_size: Option<u32>,
    /// For an answered pull: the `visibility_timeout_ms` it used (asked for, or the default 30000).
    pub visibility_timeout_ms: Option<u64>,
    /// For an answered pull: the ids of the messages it handed out, in reply order (empty otherwise).
    pub message_ids: Vec<String>,
    /// For an answered ack: the reply's `ackCount`.
    pub ack_count: Option<u32>,
    /// For an answered ack: the reply's `retryCount`.
    pub retry_count: Option<u32>,
    /// For an answered ack: the number of warnings (leases expired or unknown).
    pub n_warnings: Option<u32>,
}
