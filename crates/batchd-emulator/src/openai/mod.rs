//! A local fake of OpenAI's Files and Batch APIs, served under `/openai/v1` on the emulator's server (a client uses
//! base URL `http://ADDR/openai/v1`), with its control API under `/_emulator/openai/`.
//!
//! Written from OpenAI's documentation as summarised in the project's reference (Part B1 and "Observed in
//! practice"), never from a batchd client: upload a JSONL file, create a batch, poll it through `validating →
//! in_progress → finalizing → completed` (or `failed`, `expired`, `cancelling → cancelled`), download the output and
//! error files, whose lines come in a random order. Faults (429, 5xx, slow replies, dropped connections, a create
//! whose batch exists although its reply failed, the enqueued-token refusal, per-request failures, stalls) are
//! injected through [`OpenAiHandle`] or the control API; a call log says what clients did.

mod batches;
mod control;
mod faults;
mod files;
mod http;
mod lifecycle;
mod results;
mod store;
mod validation;

use std::{sync::Arc, time::Duration};

use axum::{
    Router,
    extract::{ConnectInfo, OriginalUri},
    http::Method,
    response::Response,
    routing::{get, post},
};

pub(crate) use self::store::OpenAi;
use self::{
    faults::OpenAiCallKind as Kind,
    http::{Call, OpenAiError},
};
pub use self::{
    faults::{OpenAiCallKind, OpenAiCallRecord, OpenAiFault, OpenAiFaultKind},
    lifecycle::OpenAiTiming,
};
use crate::{config::RateLimit, listener::Connection};

/// Path prefix of the emulated OpenAI API on the emulator's server.
pub const OPENAI_PREFIX: &str = "/openai/v1";

/// Caps the emulated API enforces; changes apply from the next call (validation: from the next batch validated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenAiLimits {
    /// Largest upload in bytes (OpenAI: 200 MB for batch input); a larger one is refused with 400 `file_too_large`.
    pub max_file_bytes: u64,
    /// Most requests in one batch (OpenAI: 50,000); more fail validation with `too_many_tasks`.
    pub max_lines: usize,
    /// Most embedding inputs in one `/v1/embeddings` batch (OpenAI: 50,000); more fail with `too_many_tasks`.
    pub max_embedding_inputs: usize,
    /// Cap on the input tokens (words, in this emulator) of the running batches of one model: a batch that would
    /// go over it fails validation with `token_limit_exceeded`. `None`: no cap (OpenAI publishes no number).
    pub enqueued_token_limit: Option<u64>,
}

impl Default for OpenAiLimits {
    fn default() -> Self {
        Self {
            max_file_bytes: 200 * 1024 * 1024,
            max_lines: 50_000,
            max_embedding_inputs: 50_000,
            enqueued_token_limit: None,
        }
    }
}

/// The header a mount takes its key in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenAiKeyHeader {
    /// `Authorization: Bearer <key>` (OpenAI, Groq).
    #[default]
    Bearer,
    /// `api-key: <key>` (Azure OpenAI's key authentication).
    ApiKey,
}

/// How a mount of this module differs from OpenAI's own API, as each vendor that copies it documents
/// (`gemini-and-openai-compatible-batch.md`, "OpenAI-compatible batch APIs").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiDialect {
    /// The header the key goes in.
    pub key_header: OpenAiKeyHeader,
    /// The longest `completion_window` taken, in hours: OpenAI takes `24h` only (24); Groq `24h` to `7d` (168). A
    /// window is a whole number of hours (`48h`) or days (`2d`) from 24 h to this.
    pub max_window_hours: u64,
    /// The deployments a batch's `model` must name (Azure OpenAI: the model is a global-batch deployment's name);
    /// a batch naming another fails validation with `model_not_found`. Empty: any model.
    pub deployments: Vec<String>,
    /// Batch objects spell their status in upper case (`COMPLETED`), as Novita's and Together's do.
    pub upper_case_statuses: bool,
}

impl Default for OpenAiDialect {
    /// OpenAI's own: Bearer key, `24h` only, any model.
    fn default() -> Self {
        Self {
            key_header: OpenAiKeyHeader::Bearer,
            max_window_hours: 24,
            deployments: Vec::new(),
            upper_case_statuses: false,
        }
    }
}

/// A second (third, ...) mount of this module under another path, with its own key, dialect and state: a Groq-like
/// or an Azure-like API beside the OpenAI one (`EmulatorConfig::openai_mounts`). Its control is in-process only
/// (`EmulatorHandle::openai_mount`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiMount {
    /// Where it is served, like [`OPENAI_PREFIX`] (a client's base URL is `http://ADDR<prefix>`).
    pub prefix: String,
    /// Its settings (key, dialect, timing, limits).
    pub config: OpenAiConfig,
}

impl OpenAiMount {
    /// Groq's batch API as its docs describe it: OpenAI's paths under `/openai/v1` (here `/groq/openai/v1`), a Bearer
    /// key, completion windows from `24h` to `7d`.
    pub fn groq() -> Self {
        let dialect = OpenAiDialect { max_window_hours: 7 * 24, ..OpenAiDialect::default() };
        let config = OpenAiConfig { api_key: "emulator-groq-key".to_owned(), dialect, ..OpenAiConfig::default() };
        Self { prefix: "/groq/openai/v1".to_owned(), config }
    }

    /// Novita's batch API as the reference summarises its docs: OpenAI's paths under `/openai/v1` (here
    /// `/novita/openai/v1`), a Bearer key, a `48h` window, and statuses in upper case.
    pub fn novita() -> Self {
        let dialect = OpenAiDialect { max_window_hours: 48, upper_case_statuses: true, ..OpenAiDialect::default() };
        let config = OpenAiConfig { api_key: "emulator-novita-key".to_owned(), dialect, ..OpenAiConfig::default() };
        Self { prefix: "/novita/openai/v1".to_owned(), config }
    }

    /// Azure OpenAI's global batch (v1 API) as its docs describe it: OpenAI's paths under `/openai/v1` (here
    /// `/azure/openai/v1`), the key in `api-key`, and a model that is a deployment's name (here `gpt-4o-mini-batch`).
    pub fn azure() -> Self {
        let dialect = OpenAiDialect {
            key_header: OpenAiKeyHeader::ApiKey,
            deployments: vec!["gpt-4o-mini-batch".to_owned()],
            ..OpenAiDialect::default()
        };
        let config = OpenAiConfig { api_key: "emulator-azure-key".to_owned(), dialect, ..OpenAiConfig::default() };
        Self { prefix: "/azure/openai/v1".to_owned(), config }
    }
}

/// Settings of the OpenAI emulator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// The key a caller must send (as `Authorization: Bearer <key>`, or as its dialect's header).
    pub api_key: String,
    /// How this mount differs from OpenAI's API (OpenAI's own by default).
    pub dialect: OpenAiDialect,
    /// How long batches stay in each state.
    pub timing: OpenAiTiming,
    /// Upload size, request and token caps.
    pub limits: OpenAiLimits,
    /// Whether output and error files list requests in a random order, as the API documents ("order is not
    /// guaranteed"); `false` keeps input order (line order), for a test that wants it.
    pub shuffle: bool,
    /// The batch creation limit (`POST /v1/batches`, one organization): over it, 429 `rate_limit_exceeded` with
    /// `retry-after`. `None`: off; [`RateLimit::openai_batch_creates`] is the documented 2,000 an hour.
    pub create_limit: Option<RateLimit>,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            api_key: "emulator-openai-key".to_owned(),
            dialect: OpenAiDialect::default(),
            timing: OpenAiTiming::default(),
            limits: OpenAiLimits::default(),
            shuffle: true,
            create_limit: None,
        }
    }
}

/// In-process control of the OpenAI emulator (from `EmulatorHandle::openai`); the control API does the same
/// over HTTP under `/_emulator/openai/`.
#[derive(Debug, Clone)]
pub struct OpenAiHandle {
    /// The shared state.
    api: Arc<OpenAi>,
}

impl OpenAiHandle {
    pub(crate) fn new(api: Arc<OpenAi>) -> Self {
        Self { api }
    }

    /// The key callers must send.
    pub fn api_key(&self) -> &str {
        &self.api.api_key
    }

    /// Queues a fault: call-level faults are used FIFO by matching calls, batch-level ones by the next batches.
    pub fn inject(&self, fault: OpenAiFault) {
        self.api.inject(fault);
    }

    /// Faults not used up yet, call-level first.
    pub fn pending_faults(&self) -> Vec<OpenAiFault> {
        self.api.pending_faults()
    }

    /// Removes the faults not used up yet (the call log stays) and answers them, call-level first.
    pub fn clear_faults(&self) -> Vec<OpenAiFault> {
        self.api.clear_faults()
    }

    /// Every call since start or the last reset, oldest first.
    pub fn calls(&self) -> Vec<OpenAiCallRecord> {
        self.api.calls()
    }

    /// How many calls the log holds, without copying it (a test that injects faults at a rate reads it often).
    pub fn n_calls(&self) -> u64 {
        self.api.n_calls()
    }

    /// The calls of one kind (say [`OpenAiCallKind::CreateBatch`], to count creates).
    pub fn calls_of(&self, kind: OpenAiCallKind) -> Vec<OpenAiCallRecord> {
        self.calls().into_iter().filter(|call| call.kind == kind).collect()
    }

    /// Clears pending faults, the call log, the creation limit's window and its refused count; files, batches and
    /// settings stay.
    pub fn reset(&self) {
        self.api.reset();
    }

    /// The timing in force.
    pub fn timing(&self) -> OpenAiTiming {
        self.api.timing()
    }

    /// Changes the timing; the state each batch is in now ends by the new duration, counted from when it began.
    pub fn set_timing(&self, timing: OpenAiTiming) {
        self.api.set_timing(timing);
    }

    /// The caps in force.
    pub fn limits(&self) -> OpenAiLimits {
        self.api.limits()
    }

    /// Changes the caps.
    pub fn set_limits(&self, limits: OpenAiLimits) {
        self.api.set_limits(limits);
    }

    /// Whether result files are shuffled (for batches validated from now on).
    pub fn set_shuffle(&self, shuffle: bool) {
        self.api.set_shuffle(shuffle);
    }

    /// The batch creation limit in force (see [`OpenAiConfig::create_limit`]).
    pub fn create_limit(&self) -> Option<RateLimit> {
        self.api.create_limit()
    }

    /// Changes the batch creation limit (`None`: off); a changed limit starts with a full bucket (or window).
    pub fn set_create_limit(&self, limit: Option<RateLimit>) {
        self.api.set_create_limit(limit);
    }

    /// Creates answered 429 by the creation limit since start or the last reset (injected 429s do not count).
    pub fn rate_limited_count(&self) -> u64 {
        self.api.rate_limited_count()
    }

    /// Batches created since start.
    pub fn batch_count(&self) -> usize {
        self.api.batch_count()
    }

    /// Every batch's id and status, oldest first.
    pub fn batch_statuses(&self) -> Vec<(String, &'static str)> {
        self.api.batch_statuses()
    }

    /// Every batch object as `GET /v1/batches/{id}` would answer it now (its `metadata`, file ids and status),
    /// oldest first: what a test reads to tell which caller's work each batch was.
    pub fn batches(&self) -> Vec<serde_json::Value> {
        self.api.batches()
    }

    /// How many replies (or calls) a [`OpenAiFault::hold`] keeps open now.
    pub fn held_replies(&self) -> usize {
        self.api.holds.n_held()
    }

    /// Waits until at least `n` replies are held at once, at most `timeout`; answers whether they were. With
    /// `OpenAiFault::hold().on(OpenAiCallKind::CreateBatch).after_handling()`, once it answers `true` the batch
    /// exists and its creator has not been told: the moment to kill the creator at.
    pub async fn wait_until_held(&self, n: usize, timeout: Duration) -> bool {
        self.api.holds.wait_held(n, timeout).await
    }

    /// Lets every held reply go (to a client still there); answers how many were held.
    pub fn release_held(&self) -> usize {
        self.api.holds.release()
    }

    /// Ids of the files stored now (uploads and results not deleted), sorted.
    pub fn file_ids(&self) -> Vec<String> {
        self.api.file_ids()
    }
}

/// Keeps `duration` as whole milliseconds in JSON.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The OpenAI routes (API and control), with their state, to merge into the emulator's router.
pub(crate) fn router<S: Clone + Send + Sync + 'static>(api: Arc<OpenAi>) -> Router<S> {
    Router::new().merge(api_routes(OPENAI_PREFIX, Arc::clone(&api))).merge(control::routes().with_state(api))
}

/// The API routes alone under `prefix`: a second mount's ([`OpenAiMount`]).
pub(crate) fn api_routes<S: Clone + Send + Sync + 'static>(prefix: &str, api: Arc<OpenAi>) -> Router<S> {
    let v1 = Router::new()
        .route("/files", post(files::upload).get(files::list))
        .route("/files/{id}", get(files::get).delete(files::delete))
        .route("/files/{id}/content", get(files::content))
        .route("/batches", post(batches::create).get(batches::list))
        .route("/batches/{id}", get(batches::get))
        .route("/batches/{id}/cancel", post(batches::cancel))
        .fallback(unrouted)
        .method_not_allowed_fallback(unrouted);
    Router::new().nest(prefix, v1).with_state(api)
}

/// Any path or method the API does not have: 404 with the API's wording.
async fn unrouted(
    axum::extract::State(api): axum::extract::State<Arc<OpenAi>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    OriginalUri(uri): OriginalUri,
) -> Response {
    let call = Call::begin(&api, Kind::Unrouted, method.as_str(), uri.path(), &connection);
    // The path as the API's docs write it, from `/v1` on.
    let path = uri.path().find("/v1").map_or(uri.path(), |at| &uri.path()[at..]);
    let message = format!("Invalid URL ({} {})", method, http::capped(path));
    let error = OpenAiError { status: axum::http::StatusCode::NOT_FOUND, ..OpenAiError::invalid(message, None, None) };
    call.end(&api, Err(error))
}
