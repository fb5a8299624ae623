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

/// `[packing]`: small jobs of one provider, model and endpoint share remote batches (packs).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PackingSettings {
    /// Whether one-batch jobs are packed (a job may still opt out with `"pack": false`).
    pub enabled: bool,
    /// Longest a queued job waits for its pack to be sent, from its arrival (at most half the time left to its
    /// deadline).
    pub window_ms: u64,
    /// A pack is sent this long after the latest arrival when arrivals pause (a lone job waits this long).
    pub pause_ms: u64,
}

impl PackingSettings {
    /// Packing off: every job gets remote batches of its own (the behaviour before packs).
    pub fn off() -> Self {
        Self { enabled: false, window_ms: 0, pause_ms: 0 }
    }
}
