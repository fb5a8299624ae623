//! The `/_emulator/` control API: inject faults, read the call logs, read and change the settings, reset, and read
//! the batches, the counters and the events queue's state. It has no authentication (the emulator is for local use
//! only); the in-process [`crate::EmulatorHandle`] does the same without HTTP.

use std::time::Duration;

use axum::{
    Json, Router,
    extract::State as AxumState,
    http::StatusCode,
    routing::{get, post},
};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};

use crate::{
    calls::{CallRecord, QueueCallRecord},
    config::{DurationRange, ProviderLimits, RandomFaults, RateLimit},
    events::{EventFaults, EventsConfig},
    fault::Fault,
    hub::QueueStats,
    limits::Limits,
    server::Shared,
    state::{Phase, State, Timing},
};

/// The control routes, merged into the emulator's router.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/_emulator/faults", get(list_faults).post(add_faults))
        .route("/_emulator/calls", get(list_calls))
        .route("/_emulator/config", get(get_config).post(set_config))
        .route("/_emulator/reset", post(reset))
        .route("/_emulator/provider_limits", get(get_provider_limits).post(set_provider_limits))
        .route("/_emulator/batches", get(list_batches))
        .route("/_emulator/stats", get(stats))
        .route("/_emulator/queue", get(queue_stats))
        .route("/_emulator/queue/calls", get(list_queue_calls))
        .route("/_emulator/queue/purge", post(purge_queue))
}

/// `POST /_emulator/faults`: one fault or a list of faults.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FaultsBody {
    /// A single fault.
    One(Fault),
    /// Several faults, queued in order.
    Many(Vec<Fault>),
}

async fn add_faults(AxumState(state): AxumState<Shared>, Json(body): Json<FaultsBody>) -> Json<Vec<Fault>> {
    let faults = match body {
        FaultsBody::One(fault) => vec![fault],
        FaultsBody::Many(faults) => faults,
    };
    for fault in faults {
        tracing::info!(?fault, "fault injected");
        state.inject(fault);
    }
    Json(state.pending_faults())
}

async fn list_faults(AxumState(state): AxumState<Shared>) -> Json<Vec<Fault>> {
    Json(state.pending_faults())
}

async fn list_calls(AxumState(state): AxumState<Shared>) -> Json<Vec<CallRecord>> {
    Json(state.calls())
}

/// `POST /_emulator/config`: every field optional, absent means unchanged; `null` removes a cap or limit.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigChange {
    /// See [`Timing::queued_for`].
    queued_for_ms: Option<u64>,
    /// See [`Timing::running_for`].
    running_for_ms: Option<u64>,
    /// See [`Limits::max_body_bytes`].
    max_body_bytes: Option<usize>,
    /// See [`Limits::max_items`].
    #[serde(default, deserialize_with = "present")]
    max_items: Option<Option<usize>>,
    /// See [`Limits::rate_limit`].
    #[serde(default, deserialize_with = "present")]
    rate_limit: Option<Option<RateLimit>>,
    /// See [`Limits::limit_polls`].
    limit_polls: Option<bool>,
    /// See [`Limits::retention`], in milliseconds.
    #[serde(default, deserialize_with = "present")]
    retention_ms: Option<Option<u64>>,
    /// Per-batch random durations of new batches: `{"min_ms":..,"max_ms":..}`, `null`: off.
    #[serde(default, deserialize_with = "present")]
    random_durations: Option<Option<DurationRange>>,
    /// Random transient faults: `{"rate":0.05,"calls":"any"}`, `null`: off.
    #[serde(default, deserialize_with = "present")]
    random_faults: Option<Option<RandomFaults>>,
    /// Random reply latency: `{"min_ms":..,"max_ms":..}`, `null`: off.
    #[serde(default, deserialize_with = "present")]
    random_latency: Option<Option<DurationRange>>,
    /// Whether submits with an unfit item are refused as a whole (5006).
    strict_items: Option<bool>,
    /// How such a refusal is worded: `{"keyword":"any_of","code":null,"pointer":false}`.
    strict_refusal: Option<crate::config::RefusalForm>,
    /// Models whose queued submits are refused (8007); replaces the list, `[]` refuses none.
    unbatchable_models: Option<Vec<String>>,
    /// Events settings, replaced as a whole (absent fields take their defaults); `null`: events off.
    #[serde(default, deserialize_with = "present")]
    events: Option<Option<EventsConfig>>,
    /// Event faults, replaced as a whole (absent fields take their defaults; `{}` clears them).
    event_faults: Option<EventFaults>,
}

/// Reads a field that is present (possibly `null`) as `Some`; an absent one stays `None` through `default`.
fn present<'de, T: Deserialize<'de>, D: Deserializer<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// The settings `GET`/`POST /_emulator/config` answer with.
#[derive(Debug, Clone, Serialize)]
struct ConfigView {
    /// See [`Timing::queued_for`].
    queued_for_ms: u64,
    /// See [`Timing::running_for`].
    running_for_ms: u64,
    /// See [`Limits::max_body_bytes`].
    max_body_bytes: usize,
    /// See [`Limits::max_items`].
    max_items: Option<usize>,
    /// See [`Limits::rate_limit`].
    rate_limit: Option<RateLimit>,
    /// See [`Limits::limit_polls`].
    limit_polls: bool,
    /// See [`Limits::retention`], in milliseconds.
    retention_ms: Option<u64>,
    /// Per-batch random durations, when on.
    random_durations: Option<DurationRange>,
    /// Random transient faults, when on.
    random_faults: Option<RandomFaults>,
    /// Random reply latency, when on.
    random_latency: Option<DurationRange>,
    /// Whether submits with an unfit item are refused as a whole (5006).
    strict_items: bool,
    /// How such a refusal is worded.
    strict_refusal: crate::config::RefusalForm,
    /// Models whose queued submits are refused (8007).
    unbatchable_models: Vec<String>,
    /// Events settings; `null`: events off.
    events: Option<EventsConfig>,
    /// Event faults in force.
    event_faults: EventFaults,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn config_view(state: &State) -> ConfigView {
    let (timing, limits): (Timing, Limits) = (state.timing(), state.limits());
    ConfigView {
        random_durations: state.random_durations(),
        random_faults: state.random_faults(),
        random_latency: state.random_latency(),
        queued_for_ms: millis(timing.queued_for),
        running_for_ms: millis(timing.running_for),
        max_body_bytes: limits.max_body_bytes,
        max_items: limits.max_items,
        rate_limit: limits.rate_limit,
        limit_polls: limits.limit_polls,
        retention_ms: limits.retention.map(millis),
        strict_items: state.strict_items(),
        strict_refusal: state.strict_refusal(),
        unbatchable_models: state.unbatchable_models(),
        events: state.events(),
        event_faults: state.event_faults(),
    }
}

async fn get_config(AxumState(state): AxumState<Shared>) -> Json<ConfigView> {
    Json(config_view(&state))
}

async fn set_config(AxumState(state): AxumState<Shared>, Json(change): Json<ConfigChange>) -> Json<ConfigView> {
    let mut timing = state.timing();
    if let Some(ms) = change.queued_for_ms {
        timing.queued_for = Duration::from_millis(ms);
    }
    if let Some(ms) = change.running_for_ms {
        timing.running_for = Duration::from_millis(ms);
    }
    state.set_timing(timing);
    let limits = state.update_limits(|limits| {
        if let Some(max_body_bytes) = change.max_body_bytes {
            limits.max_body_bytes = max_body_bytes;
        }
        if let Some(max_items) = change.max_items {
            limits.max_items = max_items;
        }
        if let Some(rate_limit) = change.rate_limit {
            limits.rate_limit = rate_limit;
        }
        if let Some(limit_polls) = change.limit_polls {
            limits.limit_polls = limit_polls;
        }
        if let Some(retention_ms) = change.retention_ms {
            limits.retention = retention_ms.map(Duration::from_millis);
        }
    });
    if let Some(range) = change.random_durations {
        state.set_random_durations(range);
    }
    if let Some(latency) = change.random_latency {
        state.set_random_latency(latency);
    }
    if let Some(faults) = change.random_faults {
        state.set_random_faults(faults.map(|faults| RandomFaults::new(faults.rate).on(faults.calls)));
    }
    if let Some(form) = change.strict_refusal {
        state.set_strict_refusal(form);
    }
    if let Some(strict_items) = change.strict_items {
        state.set_strict_items(strict_items);
    }
    if let Some(models) = change.unbatchable_models {
        state.set_unbatchable_models(models);
    }
    if let Some(events) = change.events {
        state.set_events(events);
    }
    if let Some(faults) = change.event_faults {
        state.set_event_faults(faults);
    }
    tracing::info!(?timing, ?limits, "emulator settings changed");
    Json(config_view(&state))
}

/// `POST /_emulator/provider_limits`: a preset of the three providers' limits.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderLimitsChange {
    /// `documented` or `off`.
    preset: ProviderLimits,
}

/// The creation and request limits of the three providers, and the 429s each answered since start or its reset.
#[derive(Debug, Clone, Serialize)]
struct ProviderLimitsView {
    /// Workers AI, per account and model: [`Limits::rate_limit`].
    workers_ai: Option<RateLimit>,
    /// Whether Workers AI polls count too.
    workers_ai_limit_polls: bool,
    /// OpenAI batch creates: [`crate::OpenAiConfig::create_limit`].
    openai_creates: Option<RateLimit>,
    /// Every Anthropic call: [`crate::AnthropicConfig::rate_limit`].
    anthropic_requests: Option<RateLimit>,
    /// 429s answered by each limit: `{"workers_ai":N,"openai":N,"anthropic":N}`.
    rate_limited: Value,
}

fn provider_limits_view(state: &Shared) -> ProviderLimitsView {
    let limits = state.limits();
    ProviderLimitsView {
        workers_ai: limits.rate_limit,
        workers_ai_limit_polls: limits.limit_polls,
        openai_creates: state.openai.create_limit(),
        anthropic_requests: state.anthropic.rate_limit(),
        rate_limited: json!({
            "workers_ai": state.rate_limited_count(),
            "openai": state.openai.rate_limited_count(),
            "anthropic": state.anthropic.rate_limited_count(),
        }),
    }
}

async fn get_provider_limits(AxumState(state): AxumState<Shared>) -> Json<ProviderLimitsView> {
    Json(provider_limits_view(&state))
}

async fn set_provider_limits(
    AxumState(state): AxumState<Shared>,
    Json(change): Json<ProviderLimitsChange>,
) -> Json<ProviderLimitsView> {
    state.set_provider_limits(change.preset);
    tracing::info!(preset = ?change.preset, "provider limits changed");
    Json(provider_limits_view(&state))
}

/// `GET /_emulator/stats`: counters a test outside the process can read.
#[derive(Debug, Clone, Copy, Serialize)]
struct Stats {
    /// Calls answered 429 by the rate limit since start or the last reset.
    rate_limited: u64,
    /// Batches accepted since start.
    batches: usize,
}

async fn stats(AxumState(state): AxumState<Shared>) -> Json<Stats> {
    Json(Stats { rate_limited: state.rate_limited_count(), batches: state.batch_count() })
}

async fn queue_stats(AxumState(state): AxumState<Shared>) -> Json<QueueStats> {
    Json(state.queue_stats())
}

async fn list_queue_calls(AxumState(state): AxumState<Shared>) -> Json<Vec<QueueCallRecord>> {
    Json(state.queue_calls())
}

async fn purge_queue(AxumState(state): AxumState<Shared>) -> StatusCode {
    state.purge_queue();
    StatusCode::NO_CONTENT
}

async fn reset(AxumState(state): AxumState<Shared>) -> StatusCode {
    state.reset();
    StatusCode::NO_CONTENT
}

async fn list_batches(AxumState(state): AxumState<Shared>) -> Json<Value> {
    let batches: Vec<Value> = state
        .batch_phases()
        .into_iter()
        .map(|(request_id, phase)| {
            let status = match phase {
                Phase::Queued => "queued",
                Phase::Running => "running",
                Phase::Done => "done",
            };
            json!({ "request_id": request_id, "status": status })
        })
        .collect();
    Json(Value::Array(batches))
}
