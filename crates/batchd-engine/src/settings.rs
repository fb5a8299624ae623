//! The engine's own settings: how polls are spaced and failures retried (`[poll]`, `[retry]`). They are read
//! from the daemon's layered configuration (`config/default.toml` documents every key) and handed over as is.

use serde::{Deserialize, Serialize};

/// `[poll]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PollSettings {
    /// First delay between submit and poll.
    pub initial_interval_ms: u64,
    /// Growth factor of the delay.
    pub multiplier: f64,
    /// Upper bound for the delay.
    pub max_interval_ms: u64,
    /// The delay between polls when batch events are on: polls are then only the fallback for a lost event.
    pub max_interval_ms_with_events: u64,
    /// Random spread, as a fraction of the delay.
    pub jitter: f64,
}

/// `[retry]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    /// Attempts per step before the job fails.
    pub max_attempts: u64,
    /// First backoff.
    pub initial_backoff_ms: u64,
    /// Largest backoff.
    pub max_backoff_ms: u64,
}
