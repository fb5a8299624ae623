//! The OpenAI emulator's control API under `/_emulator/openai/`: faults, the call log, settings, reset and a list
//! of batches, for a test or a demo outside the process ([`super::OpenAiHandle`] does the same in-process). No
//! authentication, like the rest of `/_emulator/`.

use std::{sync::Arc, time::Duration};

use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    routing::{get, post},
};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};

use super::{
    OpenAi, OpenAiLimits,
    faults::{OpenAiCallRecord, OpenAiFault},
    millis,
};
use crate::{
    config::RateLimit,
    hold::{HeldView, Released},
};

/// The control routes.
pub(crate) fn routes() -> Router<Arc<OpenAi>> {
    Router::new()
        .route("/_emulator/openai/faults", get(list_faults).post(add_faults))
        .route("/_emulator/openai/calls", get(list_calls))
        .route("/_emulator/openai/config", get(get_config).post(set_config))
        .route("/_emulator/openai/reset", post(reset))
        .route("/_emulator/openai/batches", get(list_batches))
        .route("/_emulator/openai/held", get(held))
        .route("/_emulator/openai/held/release", post(release_held))
}

/// `POST /_emulator/openai/faults`: one fault or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FaultsBody {
    /// A single fault.
    One(OpenAiFault),
    /// Several faults, queued in order.
    Many(Vec<OpenAiFault>),
}

async fn add_faults(State(api): State<Arc<OpenAi>>, Json(body): Json<FaultsBody>) -> Json<Vec<OpenAiFault>> {
    let faults = match body {
        FaultsBody::One(fault) => vec![fault],
        FaultsBody::Many(faults) => faults,
    };
    for fault in faults {
        tracing::info!(?fault, "openai fault injected");
        api.inject(fault);
    }
    Json(api.pending_faults())
}

async fn list_faults(State(api): State<Arc<OpenAi>>) -> Json<Vec<OpenAiFault>> {
    Json(api.pending_faults())
}

async fn list_calls(State(api): State<Arc<OpenAi>>) -> Json<Vec<OpenAiCallRecord>> {
    Json(api.calls())
}

/// `GET /_emulator/openai/held`: how many replies a `hold` fault keeps open now, and ever did.
async fn held(State(api): State<Arc<OpenAi>>) -> Json<HeldView> {
    Json(api.holds.view())
}

/// `POST /_emulator/openai/held/release`: lets every held reply go.
async fn release_held(State(api): State<Arc<OpenAi>>) -> Json<Released> {
    Json(Released { released: api.holds.release() })
}

async fn reset(State(api): State<Arc<OpenAi>>) -> StatusCode {
    api.reset();
    StatusCode::NO_CONTENT
}

async fn list_batches(State(api): State<Arc<OpenAi>>) -> Json<Value> {
    let batches: Vec<Value> =
        api.batch_statuses().into_iter().map(|(id, status)| json!({ "id": id, "status": status })).collect();
    Json(Value::Array(batches))
}

/// `POST /_emulator/openai/config`: every field optional, absent means unchanged.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigChange {
    /// See [`super::OpenAiTiming::validating_for`].
    validating_ms: Option<u64>,
    /// See [`super::OpenAiTiming::in_progress_for`].
    in_progress_ms: Option<u64>,
    /// See [`super::OpenAiTiming::finalizing_for`].
    finalizing_ms: Option<u64>,
    /// See [`super::OpenAiTiming::cancelling_for`].
    cancelling_ms: Option<u64>,
    /// See [`super::OpenAiTiming::completion_window`].
    completion_window_ms: Option<u64>,
    /// See [`OpenAiLimits::max_file_bytes`].
    max_file_bytes: Option<u64>,
    /// See [`OpenAiLimits::max_lines`].
    max_lines: Option<usize>,
    /// See [`OpenAiLimits::max_embedding_inputs`].
    max_embedding_inputs: Option<usize>,
    /// See [`OpenAiLimits::enqueued_token_limit`]; `null` removes the cap.
    #[serde(default, deserialize_with = "present")]
    enqueued_token_limit: Option<Option<u64>>,
    /// See [`super::OpenAiConfig::shuffle`].
    shuffle: Option<bool>,
    /// See [`super::OpenAiConfig::create_limit`]: `{"requests":2000,"per_ms":3600000,"burst":1}`; `null`: off.
    #[serde(default, deserialize_with = "present")]
    create_limit: Option<Option<RateLimit>>,
}

/// Reads a field that is present (possibly `null`) as `Some`; an absent one stays `None` through `default`.
fn present<'de, T: Deserialize<'de>, D: Deserializer<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// The settings `GET`/`POST /_emulator/openai/config` answer with.
#[derive(Debug, Clone, Serialize)]
struct ConfigView {
    /// See [`super::OpenAiTiming::validating_for`].
    validating_ms: u64,
    /// See [`super::OpenAiTiming::in_progress_for`].
    in_progress_ms: u64,
    /// See [`super::OpenAiTiming::finalizing_for`].
    finalizing_ms: u64,
    /// See [`super::OpenAiTiming::cancelling_for`].
    cancelling_ms: u64,
    /// See [`super::OpenAiTiming::completion_window`].
    completion_window_ms: u64,
    /// See [`OpenAiLimits::max_file_bytes`].
    max_file_bytes: u64,
    /// See [`OpenAiLimits::max_lines`].
    max_lines: usize,
    /// See [`OpenAiLimits::max_embedding_inputs`].
    max_embedding_inputs: usize,
    /// See [`OpenAiLimits::enqueued_token_limit`].
    enqueued_token_limit: Option<u64>,
    /// See [`super::OpenAiConfig::shuffle`].
    shuffle: bool,
    /// See [`super::OpenAiConfig::create_limit`].
    create_limit: Option<RateLimit>,
}

fn config_view(api: &OpenAi) -> ConfigView {
    let (timing, limits) = (api.timing(), api.limits());
    ConfigView {
        validating_ms: millis(timing.validating_for),
        in_progress_ms: millis(timing.in_progress_for),
        finalizing_ms: millis(timing.finalizing_for),
        cancelling_ms: millis(timing.cancelling_for),
        completion_window_ms: millis(timing.completion_window),
        max_file_bytes: limits.max_file_bytes,
        max_lines: limits.max_lines,
        max_embedding_inputs: limits.max_embedding_inputs,
        enqueued_token_limit: limits.enqueued_token_limit,
        shuffle: api.shuffle(),
        create_limit: api.create_limit(),
    }
}

async fn get_config(State(api): State<Arc<OpenAi>>) -> Json<ConfigView> {
    Json(config_view(&api))
}

async fn set_config(State(api): State<Arc<OpenAi>>, Json(change): Json<ConfigChange>) -> Json<ConfigView> {
    let mut timing = api.timing();
    let durations = [
        (change.validating_ms, &mut timing.validating_for),
        (change.in_progress_ms, &mut timing.in_progress_for),
        (change.finalizing_ms, &mut timing.finalizing_for),
        (change.cancelling_ms, &mut timing.cancelling_for),
        (change.completion_window_ms, &mut timing.completion_window),
    ];
    for (ms, slot) in durations {
        if let Some(ms) = ms {
            *slot = Duration::from_millis(ms);
        }
    }
    api.set_timing(timing);
    let mut limits: OpenAiLimits = api.limits();
    if let Some(max_file_bytes) = change.max_file_bytes {
        limits.max_file_bytes = max_file_bytes;
    }
    if let Some(max_lines) = change.max_lines {
        limits.max_lines = max_lines;
    }
    if let Some(max_embedding_inputs) = change.max_embedding_inputs {
        limits.max_embedding_inputs = max_embedding_inputs;
    }
    if let Some(enqueued_token_limit) = change.enqueued_token_limit {
        limits.enqueued_token_limit = enqueued_token_limit;
    }
    api.set_limits(limits);
    if let Some(shuffle) = change.shuffle {
        api.set_shuffle(shuffle);
    }
    if let Some(limit) = change.create_limit {
        api.set_create_limit(limit);
    }
    tracing::info!(?timing, ?limits, "openai emulator settings changed");
    Json(config_view(&api))
}
