//! A fake of Anthropic's Message Batches API, served under `/anthropic` on the same server as the Cloudflare one.
//!
//! Written from the project's reference (`openai-and-anthropic-batch.md`, Part B2), never from a client: a client
//! uses the base URL `http://ADDR/anthropic` and calls `/anthropic/v1/messages/batches...` as it would call
//! `https://api.anthropic.com/v1/messages/batches...`. Tests steer it through [`AnthropicControl`] (in process,
//! from [`crate::EmulatorHandle::anthropic`]) or the control routes under `/_emulator/anthropic/`.
//!
//! One file per concern: `api.rs` (the HTTP surface, its checks and error envelope), `batches.rs` (the batch
//! store and its lifecycle), `results.rs` (the asynchronous check of each item and its result line), `fault.rs`
//! (faults and the call log) and `control.rs` (the control routes).

mod api;
mod batches;
mod control;
mod fault;
mod results;

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use axum::{Router, routing::any};
use serde::{Deserialize, Serialize};

pub use self::fault::{AnthropicCall, AnthropicCallKind, AnthropicCalls, AnthropicFault, AnthropicFaultKind};
use self::{batches::Batches, fault::CallLog};
use crate::{config::RateLimit, hold::Holds, limits::Meter, server::Shared};

/// Prefix of every emulated Anthropic path: a client's base URL is `http://ADDR` followed by it.
pub(crate) const PATH_PREFIX: &str = "/anthropic";

/// Settings of the Anthropic emulator; the timing, limits and result controls change at runtime too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AnthropicConfig {
    /// The key a caller must send as `x-api-key`; any other answers 401 `authentication_error`.
    pub api_key: String,
    /// The `anthropic-version` values accepted; a call without the header or with another value answers 400.
    pub versions: Vec<String>,
    /// How long a batch processes: its items finish one by one, evenly spread over this time, and the batch ends
    /// with the last one. Applies to batches not ended yet.
    #[serde(rename = "processing_ms", with = "crate::config::millis")]
    pub processing_for: Duration,
    /// How long a canceled batch stays `canceling` before it ends.
    #[serde(rename = "canceling_ms", with = "crate::config::millis")]
    pub canceling_for: Duration,
    /// Time from create to `expires_at` (24 h live): a batch still processing then ends, its unfinished items
    /// `expired`. Applies to batches not ended yet.
    #[serde(rename = "expires_after_ms", with = "crate::config::millis")]
    pub expires_after: Duration,
    /// Time from create after which a batch's results can no longer be downloaded (29 days live); it is then
    /// `archived_at` and its results answer 404.
    #[serde(rename = "results_kept_ms", with = "crate::config::millis")]
    pub results_kept_for: Duration,
    /// Request bodies larger than this answer 413 `request_too_large` (256 MB live, read here as 256,000,000 bytes,
    /// the stricter of the two readings).
    pub max_body_bytes: usize,
    /// Most requests in one batch (100,000 live); more answers 400 `invalid_request_error`.
    pub max_requests: usize,
    /// Most requests waiting in batches not ended yet, across batches; a create that would go over answers 429
    /// `rate_limit_error` with `retry-after` (the live rate limit also covers "requests waiting to be
    /// processed"). `None`: no limit.
    pub max_queued_requests: Option<usize>,
    /// Whether results come back shuffled (the default: the API promises no order) or in request order.
    pub shuffle_results: bool,
    /// The shape of an `errored` result's `error`: nested (documented) or flat (seen in some captures).
    pub error_shape: ErrorShape,
    /// The requests-per-minute limit: every call with the right key counts (creates, polls, lists, results,
    /// cancels, deletes); over it, 429 `rate_limit_error` with `retry-after`. `None`: off;
    /// [`RateLimit::anthropic_requests`] is Tier 1's 50 a minute.
    pub rate_limit: Option<RateLimit>,
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        Self {
            api_key: "emulator-anthropic-key".to_owned(),
            versions: vec!["2023-06-01".to_owned()],
            processing_for: Duration::from_millis(300),
            canceling_for: Duration::from_millis(100),
            expires_after: Duration::from_secs(24 * 3600),
            results_kept_for: Duration::from_secs(29 * 24 * 3600),
            max_body_bytes: 256_000_000,
            max_requests: 100_000,
            max_queued_requests: None,
            shuffle_results: true,
            error_shape: ErrorShape::Nested,
            rate_limit: None,
        }
    }
}

/// How an `errored` result line writes its error.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorShape {
    /// `"error":{"type":"error","error":{"type":..,"message":..},"request_id":..}`, the documented shape.
    #[default]
    Nested,
    /// `"error":{"type":"invalid_request_error","message":..}`, as some third-party captures show it.
    Flat,
}

/// Everything the Anthropic emulator keeps, behind one mutex: settings, batches, faults and the call log.
#[derive(Debug)]
pub(crate) struct Anthropic {
    /// The replies a `hold` fault keeps open, and their release.
    pub(crate) holds: Holds,
    /// The mutable parts.
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Current settings (starting from [`crate::EmulatorConfig::anthropic`]).
    config: AnthropicConfig,
    /// Every batch not deleted, with the counters of the store.
    batches: Batches,
    /// Injected faults not used up yet, in injection order.
    faults: Vec<AnthropicFault>,
    /// The call log.
    calls: CallLog,
    /// What [`AnthropicConfig::rate_limit`] admitted.
    requests: Meter,
}

impl Anthropic {
    pub(crate) fn new(config: AnthropicConfig) -> Self {
        Self {
            holds: Holds::default(),
            inner: Mutex::new(Inner {
                config,
                batches: Batches::default(),
                faults: Vec::new(),
                calls: CallLog::default(),
                requests: Meter::default(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn config(&self) -> AnthropicConfig {
        self.lock().config.clone()
    }

    /// See [`AnthropicConfig::rate_limit`].
    pub(crate) fn rate_limit(&self) -> Option<RateLimit> {
        self.lock().config.rate_limit
    }

    pub(crate) fn set_rate_limit(&self, limit: Option<RateLimit>) {
        self.lock().config.rate_limit = limit;
    }

    /// Calls answered 429 by the rate limit since start or the last reset.
    pub(crate) fn rate_limited_count(&self) -> u64 {
        self.lock().requests.n_refused()
    }

    fn inject(&self, fault: AnthropicFault) {
        tracing::info!(?fault, "anthropic fault injected");
        self.lock().faults.push(fault);
    }

    fn pending_faults(&self) -> Vec<AnthropicFault> {
        self.lock().faults.clone()
    }

    fn clear_faults(&self) -> Vec<AnthropicFault> {
        std::mem::take(&mut self.lock().faults)
    }

    fn calls(&self) -> Vec<AnthropicCall> {
        self.lock().calls.records().to_vec()
    }

    /// Clears the pending faults (as [`Anthropic::clear_faults`]), the call log, the rate limit's window and its
    /// refused count; batches and settings stay.
    fn reset(&self) {
        self.clear_faults();
        let mut inner = self.lock();
        inner.calls.clear();
        inner.requests.reset();
    }

    /// See [`AnthropicControl::finish_items`].
    fn finish_items(&self, batch_id: &str, n_items: usize) -> bool {
        let mut inner = self.lock();
        let config = inner.config.clone();
        inner.batches.finish_items(batch_id, n_items, SystemTime::now(), &config)
    }
}

/// The routes of the Anthropic emulator: the API under [`PATH_PREFIX`] and its control API, merged into the
/// emulator's router.
pub(crate) fn routes() -> Router<Shared> {
    Router::new().route(&format!("{PATH_PREFIX}/{{*path}}"), any(api::handle)).merge(control::routes())
}

/// In-process control of the Anthropic emulator of a running [`crate::EmulatorHandle`].
#[derive(Debug, Clone)]
pub struct AnthropicControl {
    /// The emulator's address.
    addr: SocketAddr,
    /// State shared with the HTTP handlers.
    state: Shared,
}

impl AnthropicControl {
    pub(crate) fn new(addr: SocketAddr, state: Shared) -> Self {
        Self { addr, state }
    }

    fn anthropic(&self) -> &Anthropic {
        &self.state.anthropic
    }

    /// A client's base URL, like `https://api.anthropic.com`: `http://ADDR/anthropic` (loopback for an
    /// unspecified bind address).
    pub fn base_url(&self) -> String {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        format!("http://{addr}{PATH_PREFIX}")
    }

    /// The key callers must send as `x-api-key`.
    pub fn api_key(&self) -> String {
        self.anthropic().config().api_key
    }

    /// The settings in force.
    pub fn config(&self) -> AnthropicConfig {
        self.anthropic().config()
    }

    /// Changes the settings in place (the key, versions, timing, limits, result order and error shape); the
    /// timing and expiry apply to batches not ended yet.
    pub fn update_config(&self, change: impl FnOnce(&mut AnthropicConfig)) -> AnthropicConfig {
        let mut inner = self.anthropic().lock();
        change(&mut inner.config);
        inner.config.clone()
    }

    /// Changes how long batches process and how long a canceled one stays `canceling`.
    pub fn set_timing(&self, processing_for: Duration, canceling_for: Duration) {
        self.update_config(|config| {
            config.processing_for = processing_for;
            config.canceling_for = canceling_for;
        });
    }

    /// Queues a fault; faults are used in injection order by the calls they match.
    pub fn inject(&self, fault: AnthropicFault) {
        self.anthropic().inject(fault);
    }

    /// Faults not used up yet.
    pub fn pending_faults(&self) -> Vec<AnthropicFault> {
        self.anthropic().pending_faults()
    }

    /// Removes the faults not used up yet (the call log stays) and answers them, in injection order.
    pub fn clear_faults(&self) -> Vec<AnthropicFault> {
        self.anthropic().clear_faults()
    }

    /// Every call since start or the last reset, oldest first.
    pub fn calls(&self) -> Vec<AnthropicCall> {
        self.anthropic().calls()
    }

    /// How many calls the log holds, without copying it (a test that injects faults at a rate reads it often).
    pub fn n_calls(&self) -> u64 {
        self.anthropic().lock().calls.last_seq()
    }

    /// The calls of one kind (creates, cancels, ...), oldest first.
    pub fn calls_of(&self, kind: AnthropicCallKind) -> Vec<AnthropicCall> {
        self.calls().into_iter().filter(|call| call.kind == kind).collect()
    }

    /// Batches created since start (deleted ones and those of faulted replies included).
    pub fn batch_count(&self) -> usize {
        self.anthropic().lock().batches.n_created()
    }

    /// The ids of the batches that exist (not deleted), oldest first.
    pub fn batch_ids(&self) -> Vec<String> {
        self.anthropic().lock().batches.ids()
    }

    /// Makes the first `n_items` items (in request order) of a batch finished now, whatever its timing; `false`
    /// when no such batch exists or it has ended already.
    pub fn finish_items(&self, batch_id: &str, n_items: usize) -> bool {
        self.anthropic().finish_items(batch_id, n_items)
    }

    /// Calls answered 429 by [`AnthropicConfig::rate_limit`] since start or the last reset (injected 429s do not
    /// count).
    pub fn rate_limited_count(&self) -> u64 {
        self.anthropic().rate_limited_count()
    }

    /// Clears the pending faults, the call log and the rate limit's window; batches and settings stay.
    pub fn reset(&self) {
        self.anthropic().reset();
    }

    /// How many replies an [`AnthropicFault::hold`] keeps open now.
    pub fn held_replies(&self) -> usize {
        self.anthropic().holds.n_held()
    }

    /// Waits until at least `n` replies are held at once, at most `timeout`; answers whether they were. With
    /// `AnthropicFault::hold().on(AnthropicCalls::Create)`, once it answers `true` the batch exists and its creator
    /// has not been told its id: the moment to kill the creator at.
    pub async fn wait_until_held(&self, n: usize, timeout: Duration) -> bool {
        self.anthropic().holds.wait_held(n, timeout).await
    }

    /// Lets every held reply go (to a client still there); answers how many were held.
    pub fn release_held(&self) -> usize {
        self.anthropic().holds.release()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_documented_limits() {
        let config = AnthropicConfig::default();
        assert_eq!(config.max_requests, 100_000);
        assert_eq!(config.max_body_bytes, 256_000_000);
        assert_eq!(config.expires_after, Duration::from_secs(24 * 3600));
        assert_eq!(config.results_kept_for, Duration::from_secs(29 * 24 * 3600));
        assert_eq!(config.versions, ["2023-06-01"]);
        assert!(config.shuffle_results);
        assert_eq!(config.error_shape, ErrorShape::Nested);
    }
}
