//! The Anthropic emulator's control API under `/_emulator/anthropic/`, for tests outside the process (the
//! in-process [`super::AnthropicControl`] does the same without HTTP). No authentication: loopback only.

use std::time::{Duration, SystemTime};

use axum::{
    Json, Router,
    extract::{Path, State as AxumState},
    http::StatusCode,
    routing::{get, post},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AnthropicCall, AnthropicConfig, AnthropicFault, ErrorShape};
use crate::{
    hold::{HeldView, Released},
    server::Shared,
};

/// The control routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/_emulator/anthropic/faults", get(list_faults).post(add_faults))
        .route("/_emulator/anthropic/calls", get(list_calls))
        .route("/_emulator/anthropic/config", get(get_config).post(set_config))
        .route("/_emulator/anthropic/reset", post(reset))
        .route("/_emulator/anthropic/batches", get(list_batches))
        .route("/_emulator/anthropic/batches/{id}/finish", post(finish_items))
        .route("/_emulator/anthropic/held", get(held))
        .route("/_emulator/anthropic/held/release", post(release_held))
}

/// `GET /_emulator/anthropic/held`: how many replies a `hold` fault keeps open now, and ever did.
async fn held(AxumState(state): AxumState<Shared>) -> Json<HeldView> {
    Json(state.anthropic.holds.view())
}

/// `POST /_emulator/anthropic/held/release`: lets every held reply go.
async fn release_held(AxumState(state): AxumState<Shared>) -> Json<Released> {
    Json(Released { released: state.anthropic.holds.release() })
}

/// `POST /_emulator/anthropic/faults`: one fault or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FaultsBody {
    /// A single fault.
    One(AnthropicFault),
    /// Several, queued in order.
    Many(Vec<AnthropicFault>),
}

async fn add_faults(AxumState(state): AxumState<Shared>, Json(body): Json<FaultsBody>) -> Json<Vec<AnthropicFault>> {
    let faults = match body {
        FaultsBody::One(fault) => vec![fault],
        FaultsBody::Many(faults) => faults,
    };
    for fault in faults {
        state.anthropic.inject(fault);
    }
    Json(state.anthropic.pending_faults())
}

async fn list_faults(AxumState(state): AxumState<Shared>) -> Json<Vec<AnthropicFault>> {
    Json(state.anthropic.pending_faults())
}

async fn list_calls(AxumState(state): AxumState<Shared>) -> Json<Vec<AnthropicCall>> {
    Json(state.anthropic.calls())
}

/// `POST /_emulator/anthropic/config`: every field optional, absent means unchanged; `max_queued_requests: null`
/// removes that limit.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigChange {
    /// See [`AnthropicConfig::api_key`].
    api_key: Option<String>,
    /// See [`AnthropicConfig::versions`].
    versions: Option<Vec<String>>,
    /// See [`AnthropicConfig::processing_for`].
    processing_ms: Option<u64>,
    /// See [`AnthropicConfig::canceling_for`].
    canceling_ms: Option<u64>,
    /// See [`AnthropicConfig::expires_after`].
    expires_after_ms: Option<u64>,
    /// See [`AnthropicConfig::results_kept_for`].
    results_kept_ms: Option<u64>,
    /// See [`AnthropicConfig::max_body_bytes`].
    max_body_bytes: Option<usize>,
    /// See [`AnthropicConfig::max_requests`].
    max_requests: Option<usize>,
    /// See [`AnthropicConfig::max_queued_requests`].
    #[serde(default, deserialize_with = "present")]
    max_queued_requests: Option<Option<usize>>,
    /// See [`AnthropicConfig::shuffle_results`].
    shuffle_results: Option<bool>,
    /// See [`AnthropicConfig::error_shape`].
    error_shape: Option<ErrorShape>,
    /// See [`AnthropicConfig::rate_limit`]: `{"requests":50,"per_ms":60000,"burst":50}`; `null`: off.
    #[serde(default, deserialize_with = "present")]
    rate_limit: Option<Option<crate::config::RateLimit>>,
}

/// Reads a field that is present (possibly `null`) as `Some`; an absent one stays `None` through `default`.
fn present<'de, T: Deserialize<'de>, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

impl ConfigChange {
    fn apply(self, config: &mut AnthropicConfig) {
        let ms = Duration::from_millis;
        if let Some(api_key) = self.api_key {
            config.api_key = api_key;
        }
        if let Some(versions) = self.versions {
            config.versions = versions;
        }
        if let Some(value) = self.processing_ms {
            config.processing_for = ms(value);
        }
        if let Some(value) = self.canceling_ms {
            config.canceling_for = ms(value);
        }
        if let Some(value) = self.expires_after_ms {
            config.expires_after = ms(value);
        }
        if let Some(value) = self.results_kept_ms {
            config.results_kept_for = ms(value);
        }
        if let Some(value) = self.max_body_bytes {
            config.max_body_bytes = value;
        }
        if let Some(value) = self.max_requests {
            config.max_requests = value;
        }
        if let Some(value) = self.max_queued_requests {
            config.max_queued_requests = value;
        }
        if let Some(value) = self.shuffle_results {
            config.shuffle_results = value;
        }
        if let Some(value) = self.error_shape {
            config.error_shape = value;
        }
        if let Some(value) = self.rate_limit {
            config.rate_limit = value;
        }
    }
}

async fn get_config(AxumState(state): AxumState<Shared>) -> Json<AnthropicConfig> {
    Json(state.anthropic.config())
}

async fn set_config(AxumState(state): AxumState<Shared>, Json(change): Json<ConfigChange>) -> Json<AnthropicConfig> {
    let mut inner = state.anthropic.lock();
    change.apply(&mut inner.config);
    tracing::info!(config = ?inner.config, "anthropic settings changed");
    Json(inner.config.clone())
}

async fn reset(AxumState(state): AxumState<Shared>) -> StatusCode {
    state.anthropic.reset();
    StatusCode::NO_CONTENT
}

/// `GET /_emulator/anthropic/batches`: every batch's id and status, newest first.
async fn list_batches(AxumState(state): AxumState<Shared>) -> Json<Value> {
    let mut inner = state.anthropic.lock();
    let config = inner.config.clone();
    let now = SystemTime::now();
    let n_batches = inner.batches.n_created();
    let batches: Vec<Value> = match inner.batches.page(None, None, n_batches.max(1), now, &config) {
        Ok(page) => page
            .batches
            .iter()
            .map(|batch| json!({ "id": batch.id, "processing_status": batch.processing_status() }))
            .collect(),
        Err(_) => Vec::new(),
    };
    Json(Value::Array(batches))
}

/// `POST /_emulator/anthropic/batches/{id}/finish`: `{"items": N}` finishes the first N items now.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FinishBody {
    /// How many items (the first ones, in request order) are finished.
    items: usize,
}

async fn finish_items(
    AxumState(state): AxumState<Shared>,
    Path(id): Path<String>,
    Json(body): Json<FinishBody>,
) -> StatusCode {
    if state.anthropic.finish_items(&id, body.items) { StatusCode::NO_CONTENT } else { StatusCode::NOT_FOUND }
}
