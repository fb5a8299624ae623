//! A fake of Google's Gemini Batch Mode (the Gemini Developer API's `v1beta` batches and the Files API it reads and
//! writes), served under `/gemini` on the same server as the others (issue 36).
//!
//! Written from Google's documentation as the project's reference summarises it
//! (`gemini-and-openai-compatible-batch.md`) and from the API reference pages (`batches`, `media.upload`,
//! `files`), never from a client: a client uses the base URL `http://ADDR/gemini` in place of
//! `https://generativelanguage.googleapis.com`. A create (`models/{model}:batchGenerateContent`) takes inline
//! requests or a JSONL file uploaded through the resumable upload protocol, and answers an operation whose
//! `metadata` is the batch; polls step it `PENDING → RUNNING → SUCCEEDED` (or `CANCELLED`, `EXPIRED`, `FAILED`);
//! results come inline (`inlinedResponses`, each with its request's `metadata`) or as a responses file of
//! `{key, response | error}` lines, downloaded through the files download URL. Tests steer it through
//! [`GeminiControl`] or the control routes under `/_emulator/gemini/`.
//!
//! UNCONFIRMED (the reference settles none of these; clients must accept the other readings): the 48 h expiry;
//! whether responses come in input order (the API reference says so, the project's reference says join on the key:
//! here they are shuffled unless `shuffle_results` is off); the `JOB_STATE_*` spelling in REST replies (the SDKs
//! show it; REST documents `BATCH_STATE_*`, the default here, `job_state_names` switches); list order and page
//! sizes; the errors of a cancel of an ended batch, of a bad page token and of a bad API key (Google's usual 400
//! `INVALID_ARGUMENT` "API key not valid", 403 `PERMISSION_DENIED` without a key); the file resource's fields
//! beyond `name`, `mimeType`, `sizeBytes`, `state`, `uri`.
//!
//! One file per concern: `api.rs` (the HTTP surface, its checks and the google.rpc error envelope), `store.rs`
//! (batches, files, lifecycle, responses), `fault.rs` (faults and the call log), `control.rs` (the control routes).

mod api;
mod control;
mod fault;
mod store;

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use axum::{Router, routing::any};
use serde::{Deserialize, Serialize};

pub use self::fault::{GeminiCall, GeminiCallKind, GeminiCalls, GeminiFault, GeminiFaultKind};
use self::store::Store;
use crate::hold::Holds;

/// Prefix of every emulated Gemini path: a client's base URL is `http://ADDR` followed by it.
pub(crate) const PATH_PREFIX: &str = "/gemini";

/// Settings of the Gemini emulator; every one changes at runtime too (`/_emulator/gemini/config`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GeminiConfig {
    /// The key a caller must send as `x-goog-api-key` or `?key=`.
    pub api_key: String,
    /// How long a batch stays `PENDING` after its create. Applies to batches not ended yet.
    #[serde(rename = "pending_ms", with = "crate::config::millis")]
    pub pending_for: Duration,
    /// How long it then stays `RUNNING` before it ends. Applies to batches not ended yet.
    #[serde(rename = "running_ms", with = "crate::config::millis")]
    pub running_for: Duration,
    /// Time from create after which a batch not done ends `EXPIRED` (48 h: UNCONFIRMED).
    #[serde(rename = "expires_after_ms", with = "crate::config::millis")]
    pub expires_after: Duration,
    /// Largest create body (the inline limit, "about 20 MB": read as 20 MiB); larger answers 400.
    pub max_inline_bytes: usize,
    /// Largest upload (2 GB documented); larger answers 400.
    pub max_file_bytes: u64,
    /// Whether responses come shuffled (the default, so a client that joins on order fails) or in input order.
    pub shuffle_results: bool,
    /// Whether `metadata.state` is spelled `JOB_STATE_*` (as the SDKs show) instead of `BATCH_STATE_*` (REST).
    pub job_state_names: bool,
    /// The models a create may name (`gemini-2.5-flash`, without `models/`); empty: any. A create for another
    /// answers Google's 404 `NOT_FOUND` for an unknown model.
    pub models: Vec<String>,
}

impl Default for GeminiConfig {
    fn default() -> Self {
        Self {
            api_key: "emulator-gemini-key".to_owned(),
            pending_for: Duration::from_millis(100),
            running_for: Duration::from_millis(200),
            expires_after: Duration::from_secs(48 * 3600),
            max_inline_bytes: 20 * 1024 * 1024,
            max_file_bytes: 2 * 1024 * 1024 * 1024,
            shuffle_results: true,
            job_state_names: false,
            models: Vec::new(),
        }
    }
}

/// Everything the Gemini emulator keeps, behind one mutex: settings, batches, files, faults and the call log.
#[derive(Debug)]
pub(crate) struct Gemini {
    /// The replies a `hold` fault keeps open, and their release.
    pub(crate) holds: Holds,
    /// The mutable parts.
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Current settings (starting from [`crate::EmulatorConfig::gemini`]).
    config: GeminiConfig,
    /// Batches and files.
    store: Store,
    /// Injected faults not used up yet, in injection order.
    faults: Vec<GeminiFault>,
    /// The call log since start or the last reset.
    calls: Vec<GeminiCall>,
    /// Sequence number of the last logged call.
    last_seq: u64,
}

impl Gemini {
    pub(crate) fn new(config: GeminiConfig) -> Self {
        Self {
            holds: Holds::default(),
            inner: Mutex::new(Inner {
                config,
                store: Store::default(),
                faults: Vec::new(),
                calls: Vec::new(),
                last_seq: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&self, mut call: GeminiCall) {
        tracing::info!(kind = ?call.kind, batch = ?call.batch_name, status = call.status, fault = ?call.fault, "gemini call");
        let mut inner = self.lock();
        inner.last_seq += 1;
        call.seq = inner.last_seq;
        inner.calls.push(call);
    }
}

/// The routes of the Gemini emulator: the API under [`PATH_PREFIX`] and its control API.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(gemini: Arc<Gemini>) -> Router<S> {
    Router::new()
        .route(&format!("{PATH_PREFIX}/{{*path}}"), any(api::handle))
        .merge(control::routes())
        .with_state(gemini)
}

/// In-process control of the Gemini emulator of a running [`crate::EmulatorHandle`].
#[derive(Debug, Clone)]
pub struct GeminiControl {
    /// The emulator's address.
    addr: SocketAddr,
    /// The shared state.
    gemini: Arc<Gemini>,
}

impl GeminiControl {
    pub(crate) fn new(addr: SocketAddr, gemini: Arc<Gemini>) -> Self {
        Self { addr, gemini }
    }

    /// A client's base URL, like `https://generativelanguage.googleapis.com`: `http://ADDR/gemini` (loopback for an
    /// unspecified bind address).
    pub fn base_url(&self) -> String {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        format!("http://{addr}{PATH_PREFIX}")
    }

    /// The key callers must send.
    pub fn api_key(&self) -> String {
        self.gemini.lock().config.api_key.clone()
    }

    /// The settings in force.
    pub fn config(&self) -> GeminiConfig {
        self.gemini.lock().config.clone()
    }

    /// Changes the settings in place; timing and expiry apply to batches not ended yet.
    pub fn update_config(&self, change: impl FnOnce(&mut GeminiConfig)) -> GeminiConfig {
        let mut inner = self.gemini.lock();
        change(&mut inner.config);
        inner.config.clone()
    }

    /// Changes how long batches stay `PENDING` and then `RUNNING`.
    pub fn set_timing(&self, pending_for: Duration, running_for: Duration) {
        self.update_config(|config| {
            config.pending_for = pending_for;
            config.running_for = running_for;
        });
    }

    /// Queues a fault; faults are used in injection order by the calls they match.
    pub fn inject(&self, fault: GeminiFault) {
        tracing::info!(?fault, "gemini fault injected");
        if fault.times > 0 {
            self.gemini.lock().faults.push(fault);
        }
    }

    /// Faults not used up yet.
    pub fn pending_faults(&self) -> Vec<GeminiFault> {
        self.gemini.lock().faults.clone()
    }

    /// Every call since start or the last reset, oldest first.
    pub fn calls(&self) -> Vec<GeminiCall> {
        self.gemini.lock().calls.clone()
    }

    /// The calls of one kind, oldest first.
    pub fn calls_of(&self, kind: GeminiCallKind) -> Vec<GeminiCall> {
        self.calls().into_iter().filter(|call| call.kind == kind).collect()
    }

    /// Batches created since start (deleted ones and those of faulted replies included).
    pub fn batch_count(&self) -> usize {
        self.gemini.lock().store.n_created()
    }

    /// The names (`batches/..`) of the batches not deleted, oldest first.
    pub fn batch_names(&self) -> Vec<String> {
        self.gemini.lock().store.names()
    }

    /// The names (`files/..`) of the files stored now (uploads and responses files), sorted.
    pub fn file_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.gemini.lock().store.files.keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// Clears the pending faults and the call log; batches, files and settings stay.
    pub fn reset(&self) {
        let mut inner = self.gemini.lock();
        inner.faults.clear();
        inner.calls.clear();
        inner.last_seq = 0;
    }

    /// How many replies a [`GeminiFault::hold`] keeps open now.
    pub fn held_replies(&self) -> usize {
        self.gemini.holds.n_held()
    }

    /// Waits until at least `n` replies are held at once, at most `timeout`; answers whether they were. With
    /// `GeminiFault::hold().on(GeminiCalls::Create)`, once it answers `true` the batch exists and its creator has not
    /// been told its name.
    pub async fn wait_until_held(&self, n: usize, timeout: Duration) -> bool {
        self.gemini.holds.wait_held(n, timeout).await
    }

    /// Lets every held reply go (to a client still there); answers how many were held.
    pub fn release_held(&self) -> usize {
        self.gemini.holds.release()
    }
}
