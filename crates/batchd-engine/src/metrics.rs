//! The daemon's metrics, recorded through the `metrics` facade (exported in Prometheus format by the admin
//! server). All names start with `batchd_`, use base units, and carry no per-job labels.
//!
//! Call sites use the functions below, never the macros directly, so every metric is named and described here
//! and listed in [`NAMES`] (which the Grafana dashboard is checked against). [`install`] installs the process-wide
//! Prometheus recorder once and returns the handle the admin server renders from.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Every metric batchd exports (histograms also as `_bucket`, `_sum` and `_count` series).
pub const NAMES: &[&str] = &[
    "batchd_build_info",
    "batchd_api_calls_in_flight",
    "batchd_jobs_accepted_total",
    "batchd_jobs_rejected_total",
    "batchd_jobs_duplicate_total",
    "batchd_entries_undeliverable_total",
    "batchd_jobs_finished_total",
    "batchd_api_requests_total",
    "batchd_api_request_duration_seconds",
    "batchd_batch_turnaround_seconds",
    "batchd_retries_total",
    "batchd_throttled_waits_total",
    "batchd_possible_duplicate_submits_total",
    "batchd_remote_cleanups_total",
    "batchd_remote_unreachable_seconds",
    "batchd_pack_jobs",
    "batchd_remote_batch_requests",
    "batchd_remote_batch_jobs",
    "batchd_packs_delivered_total",
    "batchd_stale_writes_total",
    "batchd_results_published_total",
    "batchd_redis_errors_total",
    "batchd_redis_up",
    "batchd_queue_depth",
    "batchd_oldest_waiting_job_age_seconds",
    "batchd_schedule_lag_seconds",
    "batchd_oldest_remote_batch_age_seconds",
    "batchd_poll_unknown_status_total",
    "batchd_items_refused_total",
    "batchd_extra_submits_total",
    "batchd_events_received_total",
    "batchd_events_matched_total",
    "batchd_event_wake_latency_seconds",
    "batchd_polls_per_batch",
    "batchd_api_auth_failures_total",
    "batchd_tokens_total",
    "batchd_cost_usd_total",
    "batchd_models_without_events",
    "batchd_rate_limit_effective",
    "batchd_model_catalog_age_seconds",
    "batchd_events_backlog",
    "batchd_events_oldest_message_age_seconds",
];

/// Most distinct `model` label values of `batchd_tokens_total` besides the configured models; later models are
/// counted as `other`, so a producer naming a new model per job cannot grow the series without bound.
pub const MAX_SEEN_MODELS: usize = 32;

/// The models `batchd_tokens_total` labels by name: the configured ones plus up to [`MAX_SEEN_MODELS`] seen.
static MODELS: std::sync::Mutex<Option<std::collections::BTreeSet<String>>> = std::sync::Mutex::new(None);

/// The process metrics collector (`process_*` series: RSS, CPU seconds, open fds, start time).
static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();

/// Bucket bounds (seconds) of `batchd_api_request_duration_seconds`: 5 ms to the 60 s request timeout.
const API_DURATION_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Bucket bounds (seconds) of `batchd_batch_turnaround_seconds`: one second to the 24 h default deadline.
const TURNAROUND_BUCKETS: &[f64] =
    &[1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0];

/// The installed recorder's handle, or why it could not be installed.
/// Buckets of `batchd_event_wake_latency_seconds`: events are pulled within a second or two of entering the queue.
const WAKE_LATENCY_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];

/// Buckets of `batchd_pack_jobs` (jobs taken into a pack by one packer pass).
const PACK_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0, 10000.0, 50000.0];

/// Buckets of `batchd_remote_batch_requests` and `batchd_remote_batch_jobs` (a remote batch carries one request
/// to a provider's limit: 50,000 at OpenAI, 100,000 at Anthropic).
const PER_BATCH_BUCKETS: &[f64] =
    &[1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0, 10000.0, 50000.0, 100000.0];

/// Buckets of `batchd_polls_per_batch`.
const POLLS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0];

static RECORDER: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// Installs the Prometheus recorder as the process's global `metrics` recorder (once per process; later calls,
/// e.g. by a second in-process daemon in tests, get the same handle) and describes every metric.
///
/// Fails if another recorder was installed first.
pub fn install() -> Result<PrometheusHandle, String> {
    RECORDER
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("batchd_api_request_duration_seconds".into()),
                    API_DURATION_BUCKETS,
                )
                .and_then(|builder| {
                    builder.set_buckets_for_metric(
                        Matcher::Full("batchd_batch_turnaround_seconds".into()),
                        TURNAROUND_BUCKETS,
                    )
                })
                .and_then(|builder| {
                    builder.set_buckets_for_metric(
                        Matcher::Full("batchd_event_wake_latency_seconds".into()),
                        WAKE_LATENCY_BUCKETS,
                    )
                })
                .and_then(|builder| {
                    builder.set_buckets_for_metric(Matcher::Full("batchd_polls_per_batch".into()), POLLS_BUCKETS)
                })
                .and_then(|builder| {
                    builder.set_buckets_for_metric(Matcher::Full("batchd_pack_jobs".into()), PACK_BUCKETS)
                })
                .and_then(|builder| {
                    builder
                        .set_buckets_for_metric(Matcher::Full("batchd_remote_batch_requests".into()), PER_BATCH_BUCKETS)
                })
                .and_then(|builder| {
                    builder.set_buckets_for_metric(Matcher::Full("batchd_remote_batch_jobs".into()), PER_BATCH_BUCKETS)
                })
                .and_then(PrometheusBuilder::install_recorder)
                .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
            describe();
            PROCESS.get_or_init(metrics_process::Collector::default).describe();
            Ok(handle)
        })
        .clone()
}

/// Refreshes the `process_*` metrics and `batchd_remote_unreachable_seconds` (call before rendering, or on the
/// sampler's tick).
pub fn collect_process() {
    if let Some(collector) = PROCESS.get() {
        collector.collect();
    }
    let now = Instant::now();
    let gauges = UNREACHABLE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).gauges(now);
    for (provider, seconds) in gauges {
        gauge!("batchd_remote_unreachable_seconds", "provider" => provider).set(seconds);
    }
}

/// The batches this process polls whose polls keep failing, for `batchd_remote_unreachable_seconds`.
static UNREACHABLE: Mutex<Unreachable> = Mutex::new(Unreachable { batches: None, providers: Vec::new() });

/// Records a poll (with its results download, if any) of a remote batch: `failing` when it failed with an error
/// batchd waits out (the batch is kept), otherwise it was read. `batch` names the batch (its chunk's schedule
/// member); `forget_after`: how long a failing batch no poll of this process reports on is still counted (another
/// replica may be polling it now, or its job ended). The provider's gauge is set when a run of failures starts or
/// ends, and on the sampler's tick ([`collect_process`]) meanwhile, so a poll that fails again costs one map update
/// however many batches are failing.
pub fn remote_poll(provider: &str, batch: &str, failing: bool, forget_after: Duration) {
    let now = Instant::now();
    let mut unreachable = UNREACHABLE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if unreachable.polled(provider, batch, failing, now, forget_after) {
        let seconds = unreachable.gauges(now).into_iter().find(|(name, _)| name == provider).map_or(0.0, |(_, s)| s);
        gauge!("batchd_remote_unreachable_seconds", "provider" => provider.to_owned()).set(seconds);
    }
}

/// A batch whose polls are failing: since when, until when it still counts without another failure.
#[derive(Debug, Clone, Copy)]
struct Failing {
    /// The first failed poll of the current run of failures.
    since: Instant,
    /// The last failed poll plus the forget period.
    counts_until: Instant,
}

/// Failing batches by provider and batch, and every provider seen (whose gauge reads 0 once none is failing).
#[derive(Debug)]
struct Unreachable {
    /// `(provider, batch)` to its run of failures; `None` until the first poll.
    batches: Option<HashMap<(String, String), Failing>>,
    /// Every provider a poll was recorded for.
    providers: Vec<String>,
}

impl Unreachable {
    /// Records one poll of `batch` at `provider` at `now`; whether a run of failures started or ended (or the
    /// provider is new), when its gauge is worth setting at once.
    fn polled(&mut self, provider: &str, batch: &str, failing: bool, now: Instant, forget_after: Duration) -> bool {
        let mut changed = false;
        if !self.providers.iter().any(|name| name == provider) {
            self.providers.push(provider.to_owned());
            changed = true;
        }
        let batches = self.batches.get_or_insert_with(HashMap::new);
        let key = (provider.to_owned(), batch.to_owned());
        if !failing {
            return batches.remove(&key).is_some() || changed;
        }
        if !batches.contains_key(&key) {
            changed = true;
            // A new run of failures (once per batch and outage): runs no longer counted are dropped here too, so
            // the map stays bounded by the batches failing now even when the metrics are never rendered.
            batches.retain(|_, run| run.counts_until > now);
        }
        let run = batches.entry(key).or_insert(Failing { since: now, counts_until: now });
        run.counts_until = now + forget_after;
        changed
    }

    /// Each provider's longest run of failures at `now`, in seconds (runs no longer counted are dropped).
    fn gauges(&mut self, now: Instant) -> Vec<(String, f64)> {
        let Some(batches) = self.batches.as_mut() else {
            return Vec::new();
        };
        batches.retain(|_, run| run.counts_until > now);
        self.providers
            .iter()
            .map(|provider| {
                let longest = batches
                    .iter()
                    .filter(|((name, _), _)| name == provider)
                    .map(|(_, run)| now.saturating_duration_since(run.since))
                    .max()
                    .unwrap_or_default();
                (provider.clone(), longest.as_secs_f64())
            })
            .collect()
    }
}

/// Names the configured models, whose token usage is always labelled by name.
pub fn known_models<'a>(models: impl IntoIterator<Item = &'a str>) {
    let mut guard = MODELS.lock().expect("models lock");
    let set = guard.get_or_insert_with(Default::default);
    for model in models {
        if set.insert(model.to_owned()) {
            KNOWN_ALLOWANCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            for kind in ["prompt", "completion"] {
                counter!("batchd_tokens_total", "model" => model.to_owned(), "kind" => kind).absolute(0);
            }
        }
    }
}

/// The `model` label for `model`: itself when configured or among the first [`MAX_SEEN_MODELS`] seen, else `other`.
fn model_label(model: &str) -> String {
    let mut guard = MODELS.lock().expect("models lock");
    let models = guard.get_or_insert_with(Default::default);
    if models.contains(model) {
        return model.to_owned();
    }
    if models.len() < MAX_SEEN_MODELS + KNOWN_ALLOWANCE.load(std::sync::atomic::Ordering::Relaxed) {
        models.insert(model.to_owned());
        return model.to_owned();
    }
    "other".to_owned()
}

/// How many configured models [`known_models`] registered (they do not count against [`MAX_SEEN_MODELS`]).
static KNOWN_ALLOWANCE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts the tokens of a finished job by model and kind, from the API's `usage`
/// ([`batchd_core::stats::token_counts`]: every provider's names for prompt and completion tokens).
pub fn tokens(model: &str, usage: &serde_json::Value) {
    let label = model_label(model);
    for (kind, n) in batchd_core::stats::token_counts(usage) {
        counter!("batchd_tokens_total", "model" => label.clone(), "kind" => kind).increment(n);
    }
}

/// Adds a finished job's cost (its `usage`'s `cost_usd`, present when its model has a price) to
/// `batchd_cost_usd_total` by provider and model. A pack member's `usage` is its own items' or its share of the
/// pack's, so a remote batch's cost is counted once over its members, never once per member.
pub fn cost(model: &str, usage: &serde_json::Value) {
    let Some(nano) = batchd_core::pricing::usage_cost_nano(usage).filter(|nano| *nano > 0) else { return };
    let provider = batchd_core::ModelName::parse(model).map(|name| name.provider().to_owned()).unwrap_or_default();
    gauge!("batchd_cost_usd_total", "provider" => provider, "model" => model_label(model))
        .increment(nano as f64 / batchd_core::pricing::NANO_PER_USD);
}

/// Which API call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiCall {
    /// A batch submit.
    Submit,
    /// A status poll.
    Poll,
}

impl ApiCall {
    fn as_str(self) -> &'static str {
        match self {
            Self::Submit => "submit",
            Self::Poll => "poll",
        }
    }
}

/// Registers every metric's description and unit (shown as `# HELP` / `# TYPE` lines).
pub fn describe() {
    describe_counter!("batchd_jobs_accepted_total", "Jobs taken in from the submit stream.");
    describe_gauge!(
        "batchd_api_calls_in_flight",
        "API calls (submits, polls, result downloads) this replica has in flight, by provider; at most \
         workers.calls_per_provider when that is set."
    );
    describe_gauge!(
        "batchd_models_without_events",
        "Cloudflare models this replica submitted for whose batch events have no subscription to the events queue \
         (their results wait for the fallback poll; `batchd events setup` subscribes them)."
    );
    describe_gauge!(
        "batchd_rate_limit_effective",
        "Effective submit limit per rate-limit window of a bucket lowered by repeated 429s (AIMD), by bucket."
    );
    describe_gauge!(
        "batchd_model_catalog_age_seconds",
        Unit::Seconds,
        "Age of the Workers AI model catalog in use (absent while none could be read: the hand table applies)."
    );
    describe_gauge!(
        "batchd_events_backlog",
        "Messages in the events queue not yet acknowledged, as the last pull said."
    );
    describe_gauge!(
        "batchd_events_oldest_message_age_seconds",
        Unit::Seconds,
        "Age of the oldest unacknowledged message in the events queue, as the last pull said (event lag)."
    );
    describe_counter!(
        "batchd_jobs_rejected_total",
        "Ingress entries refused before any work, by reason (invalid_job, invalid_entry)."
    );
    describe_counter!(
        "batchd_jobs_duplicate_total",
        "Ingress entries repeating a known job id (acknowledged, not run)."
    );
    describe_counter!(
        "batchd_entries_undeliverable_total",
        "Ingress entries moved to the dead-letter stream unread after more than ingress.max_deliveries deliveries."
    );
    describe_counter!("batchd_jobs_finished_total", "Jobs finished, by outcome (completed, failed, expired).");
    describe_counter!(
        "batchd_api_requests_total",
        "Batch API requests by provider, call (submit, poll), outcome and HTTP status class (2xx, 4xx, 5xx, none)."
    );
    describe_histogram!(
        "batchd_api_request_duration_seconds",
        Unit::Seconds,
        "Batch API request duration, by provider and call."
    );
    describe_histogram!(
        "batchd_batch_turnaround_seconds",
        Unit::Seconds,
        "Time from accepting a job to publishing its result, by outcome."
    );
    describe_counter!("batchd_retries_total", "Steps rescheduled after a transient error, by step (submit, poll).");
    describe_counter!(
        "batchd_throttled_waits_total",
        "Steps delayed by rate limiting (HTTP 429 or the shared limiter)."
    );
    describe_counter!(
        "batchd_possible_duplicate_submits_total",
        "Submits repeated after an interrupted submit (a remote batch may exist twice)."
    );
    describe_counter!(
        "batchd_remote_cleanups_total",
        "What a finished job's unfinished chunks left at their provider (files, a batch), cancelled where it still \
         ran and deleted, best effort, by provider and outcome (ok, failed)."
    );
    describe_histogram!(
        "batchd_pack_jobs",
        "Jobs one packer pass took into a pack (a pack that waits for the provider's limits fills in several \
         passes), by provider: how many jobs share a remote batch."
    );
    describe_histogram!(
        "batchd_remote_batch_requests",
        "Requests in each remote batch created, by provider (a pack's or a job's own)."
    );
    describe_histogram!(
        "batchd_remote_batch_jobs",
        "Jobs sharing each remote batch created, by provider: 1 for a job's own batch, a pack's members for a pack \
         (a piece of a split pack is not counted here)."
    );
    describe_counter!(
        "batchd_packs_delivered_total",
        "Packs (remote batches shared by several jobs) whose results were handed to their members."
    );
    describe_counter!(
        "batchd_stale_writes_total",
        "Steps dropped because their claim of a chunk was taken over (the replica was paused past its lease): \
         the write was refused by the chunk's fencing token, and the chunk's new holder carried on."
    );
    describe_counter!(
        "batchd_results_published_total",
        "Result entries published: finished jobs and refused ones (each gets one failed result)."
    );
    describe_counter!(
        "batchd_api_auth_failures_total",
        "Batch API requests refused with HTTP 401 or 403 (a bad or revoked token: every job will fail), by call."
    );
    describe_counter!(
        "batchd_tokens_total",
        "Tokens of finished jobs from the API's usage, by model (configured models, then up to 32 seen, the rest \
         `other`) and kind (prompt, completion): what batch inference costs."
    );
    describe_gauge!(
        "batchd_cost_usd_total",
        "What finished jobs cost in USD at the configured batch prices ([pricing], docs/cost.md), by provider and \
         model (models with a price only; the model label as for batchd_tokens_total). A running total that only \
         grows (exported as a gauge: the metrics crate's counters count whole numbers); per replica, since start."
    );
    describe_counter!(
        "batchd_poll_unknown_status_total",
        "Poll replies with a status the API docs do not list (read as pending; the batch's deadline bounds it)."
    );
    describe_counter!(
        "batchd_items_refused_total",
        "Request items the API refused on their own after bisection (answered success:false with the API's error)."
    );
    describe_counter!(
        "batchd_events_received_total",
        "Workers AI batch events pulled from the Cloudflare Queue, by type (queued, succeeded, failed, other, unreadable)."
    );
    describe_counter!(
        "batchd_events_matched_total",
        "Batch events by outcome: woken (a polling chunk made due now), known (the chunk was not polling: \
         submitting, or already due or finished), unknown (a request id batchd does not know), ignored (queued \
         and unknown types, which need no poll)."
    );
    describe_histogram!(
        "batchd_event_wake_latency_seconds",
        Unit::Seconds,
        "Time from a batch event entering the queue to its chunk being made due (event-to-poll latency)."
    );
    describe_histogram!(
        "batchd_polls_per_batch",
        "Polls a batch took until it answered (with events: usually 1; without: grows with the batch's duration)."
    );
    describe_counter!(
        "batchd_extra_submits_total",
        "Submits added by splitting a refused batch, by reason (too_large: HTTP 413; invalid_input: one bad item)."
    );
    describe_counter!("batchd_redis_errors_total", "Redis operations that failed, by operation.");
    describe_gauge!(
        "batchd_queue_depth",
        "Items per stream and state: submit pending (not yet read) and in_flight (read, not yet taken in), schedule \
         scheduled (all steps) and due (past their due time), dead (dead-letter entries). Sampled from Redis."
    );
    describe_gauge!(
        "batchd_oldest_waiting_job_age_seconds",
        Unit::Seconds,
        "Age of the oldest entry waiting in the submit stream (0 when empty). Sampled from Redis."
    );
    describe_gauge!(
        "batchd_schedule_lag_seconds",
        Unit::Seconds,
        "How long the most overdue scheduled step (poll or submit retry) has been due (0 when none). Sampled from Redis."
    );
    describe_gauge!(
        "batchd_oldest_remote_batch_age_seconds",
        Unit::Seconds,
        "Age of the oldest unfinished remote batch (submitted, not yet done or failed) per provider and model, among \
         the oldest batches of the namespace the sampler reads (a model with none of them reads 0). Sampled from Redis."
    );
    describe_gauge!(
        "batchd_remote_unreachable_seconds",
        Unit::Seconds,
        "Per provider, the longest a remote batch polled by this process has gone unread: since the first of its \
         polls (or result downloads) that keep failing with errors batchd waits out (0 when none is failing). The \
         batch is kept and asked again until the job's deadline; this says how long the provider has not answered."
    );
    describe_gauge!("batchd_redis_up", "1 when the last sample reached Redis, 0 when it did not.");
    describe_gauge!("batchd_build_info", "Always 1; the label `version` is the running batchd version.");

    // Series without labels exist from the start, so rates and alerts on them never see a missing series.
    gauge!("batchd_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    for name in [
        "batchd_jobs_accepted_total",
        "batchd_jobs_duplicate_total",
        "batchd_possible_duplicate_submits_total",
        "batchd_stale_writes_total",
        "batchd_results_published_total",
        "batchd_poll_unknown_status_total",
        "batchd_items_refused_total",
    ] {
        counter!(name).absolute(0);
    }
    for reason in ["too_large", "invalid_input"] {
        counter!("batchd_extra_submits_total", "reason" => reason).absolute(0);
    }
    for kind in ["queued", "succeeded", "failed", "other", "unreadable"] {
        counter!("batchd_events_received_total", "type" => kind).absolute(0);
    }
    for outcome in ["woken", "known", "unknown", "ignored"] {
        counter!("batchd_events_matched_total", "outcome" => outcome).absolute(0);
    }
    for outcome in ["completed", "failed", "expired", "cancelled"] {
        counter!("batchd_jobs_finished_total", "outcome" => outcome).absolute(0);
    }
    for reason in ["invalid_job", "invalid_entry", "item_too_large"] {
        counter!("batchd_jobs_rejected_total", "reason" => reason).absolute(0);
    }
    for step in ["submit", "poll"] {
        counter!("batchd_retries_total", "step" => step).absolute(0);
        counter!("batchd_throttled_waits_total", "step" => step).absolute(0);
    }
    for operation in ["take_in", "step", "submit", "record_submitted", "index_request", "wake", "sample"] {
        counter!("batchd_redis_errors_total", "operation" => operation).absolute(0);
    }
}

/// A job was accepted.
pub fn job_accepted() {
    counter!("batchd_jobs_accepted_total").increment(1);
}

/// An ingress entry was refused (`reason` is a batchd error code).
pub fn job_rejected(reason: &'static str) {
    counter!("batchd_jobs_rejected_total", "reason" => reason).increment(1);
    // A refused entry gets a failed result entry too.
    counter!("batchd_results_published_total").increment(1);
}

/// An ingress entry delivered more than `ingress.max_deliveries` times was moved to the dead-letter stream;
/// `published`: its entry id got a failed result entry.
pub fn entry_undeliverable(published: bool) {
    counter!("batchd_entries_undeliverable_total").increment(1);
    if published {
        counter!("batchd_results_published_total").increment(1);
    }
}

/// An ingress entry repeated a known job id.
pub fn job_duplicate() {
    counter!("batchd_jobs_duplicate_total").increment(1);
}

/// A job finished with `outcome` after `turnaround`.
pub fn job_finished(outcome: &'static str, turnaround: Duration) {
    counter!("batchd_jobs_finished_total", "outcome" => outcome).increment(1);
    histogram!("batchd_batch_turnaround_seconds", "outcome" => outcome).record(turnaround.as_secs_f64());
    counter!("batchd_results_published_total").increment(1);
}

/// Pre-initialises the per-provider series of the configured providers (at 0, so alerts and dashboards see them
/// before the first failure).
pub fn providers_configured<'a>(names: impl IntoIterator<Item = &'a str>) {
    for provider in names {
        calls_in_flight(provider, 0);
        for call in [ApiCall::Submit, ApiCall::Poll] {
            counter!("batchd_api_auth_failures_total", "provider" => provider.to_owned(), "call" => call.as_str())
                .absolute(0);
        }
    }
}

/// `n` API calls in flight to `provider` now.
pub fn calls_in_flight(provider: &str, n: usize) {
    gauge!("batchd_api_calls_in_flight", "provider" => provider.to_owned()).set(n as f64);
}

/// One API request finished; `outcome` is `ok` or the error kind, `http_status` the status if any.
pub fn api_request(
    provider: &'static str,
    call: ApiCall,
    outcome: &'static str,
    http_status: Option<u16>,
    elapsed: Duration,
) {
    let class = match http_status {
        Some(status) if (200..300).contains(&status) => "2xx",
        Some(status) if (400..500).contains(&status) => "4xx",
        Some(status) if (500..600).contains(&status) => "5xx",
        Some(_) => "other",
        None => "none",
    };
    counter!(
        "batchd_api_requests_total",
        "provider" => provider,
        "call" => call.as_str(),
        "outcome" => outcome,
        "status_class" => class
    )
    .increment(1);
    if matches!(http_status, Some(401 | 403)) {
        counter!("batchd_api_auth_failures_total", "provider" => provider, "call" => call.as_str()).increment(1);
    }
    histogram!("batchd_api_request_duration_seconds", "provider" => provider, "call" => call.as_str())
        .record(elapsed.as_secs_f64());
}

/// A step was rescheduled after a transient error.
pub fn retry(call: ApiCall) {
    counter!("batchd_retries_total", "step" => call.as_str()).increment(1);
}

/// A step waits because of rate limiting.
pub fn throttled_wait(call: ApiCall) {
    counter!("batchd_throttled_waits_total", "step" => call.as_str()).increment(1);
}

/// A submit is being repeated after an interrupted one.
pub fn possible_duplicate_submit() {
    counter!("batchd_possible_duplicate_submits_total").increment(1);
}

/// A remote batch of `requests` requests was created at `provider` and recorded, carrying `jobs` jobs when known.
pub fn remote_batch_created(provider: &str, requests: usize, jobs: Option<usize>) {
    histogram!("batchd_remote_batch_requests", "provider" => provider.to_owned()).record(requests as f64);
    if let Some(jobs) = jobs {
        histogram!("batchd_remote_batch_jobs", "provider" => provider.to_owned()).record(jobs as f64);
    }
}

/// A packer pass took `jobs` jobs into a pack of `provider`.
pub fn pack_filled(provider: &'static str, jobs: usize) {
    histogram!("batchd_pack_jobs", "provider" => provider).record(jobs as f64);
}

/// A pack's results were handed to its members.
pub fn pack_delivered() {
    counter!("batchd_packs_delivered_total").increment(1);
}

/// What a finished job's chunk left at its provider was cleaned up (`outcome`: `ok` or `failed`).
pub fn remote_cleanup(provider: &'static str, outcome: &'static str) {
    counter!("batchd_remote_cleanups_total", "provider" => provider, "outcome" => outcome).increment(1);
}

/// A step's write was refused because its claim of the chunk was taken over.
pub fn stale_write() {
    counter!("batchd_stale_writes_total").increment(1);
}

/// A poll reply carried a status the API docs do not list.
pub fn unknown_poll_status() {
    counter!("batchd_poll_unknown_status_total").increment(1);
}

/// The API refused one request item on its own.
pub fn item_refused() {
    counter!("batchd_items_refused_total").increment(1);
}

/// A refused batch was split into `pieces`, each submitted anew.
pub fn extra_submits(reason: &'static str, pieces: usize) {
    counter!("batchd_extra_submits_total", "reason" => reason).increment(pieces as u64);
}

/// A batch event was pulled (`kind`: queued, succeeded, failed, other, unreadable).
pub fn event_received(kind: &'static str) {
    counter!("batchd_events_received_total", "type" => kind).increment(1);
}

/// What a batch event found: `woken`, `known` (not polling) or `unknown`.
pub fn event_matched(outcome: &'static str) {
    counter!("batchd_events_matched_total", "outcome" => outcome).increment(1);
}

/// An event woke its chunk this long after entering the queue.
pub fn event_wake_latency(latency: Duration) {
    histogram!("batchd_event_wake_latency_seconds").record(latency.as_secs_f64());
}

/// A batch answered after `n_polls` polls.
pub fn polls_per_batch(n_polls: u64) {
    histogram!("batchd_polls_per_batch").record(n_polls as f64);
}

/// A Redis operation failed.
pub fn redis_error(operation: &'static str) {
    counter!("batchd_redis_errors_total", "operation" => operation).increment(1);
}

/// Sets a queue depth gauge.
pub fn queue_depth(namespace: &str, stream: &'static str, state: &'static str, depth: u64) {
    gauge!("batchd_queue_depth", "queue" => namespace.to_owned(), "stream" => stream, "state" => state)
        .set(depth as f64);
}

/// Sets the age of the oldest waiting job.
pub fn oldest_waiting_job_age(namespace: &str, age: Duration) {
    gauge!("batchd_oldest_waiting_job_age_seconds", "queue" => namespace.to_owned()).set(age.as_secs_f64());
}

/// Sets how long the most overdue scheduled step has been due.
pub fn schedule_lag(namespace: &str, lag: Duration) {
    gauge!("batchd_schedule_lag_seconds", "queue" => namespace.to_owned()).set(lag.as_secs_f64());
}

/// Sets the age of `provider`'s `model`'s oldest unfinished remote batch.
pub fn oldest_remote_batch_age(namespace: &str, provider: &str, model: &str, age: Duration) {
    gauge!("batchd_oldest_remote_batch_age_seconds", "queue" => namespace.to_owned(),
        "provider" => provider.to_owned(), "model" => model.to_owned())
    .set(age.as_secs_f64());
}

/// Sets how many submitted-for models have no event subscription.
pub fn models_without_events(n: usize) {
    gauge!("batchd_models_without_events").set(n as f64);
}

/// Sets a bucket's effective limit per window (lowered by repeated 429s).
pub fn rate_limit_effective(bucket: &str, per_window: f64) {
    gauge!("batchd_rate_limit_effective", "bucket" => bucket.to_owned()).set(per_window);
}

/// Sets the age of the model catalog in use.
pub fn model_catalog_age(age: Duration) {
    gauge!("batchd_model_catalog_age_seconds").set(age.as_secs_f64());
}

/// Sets the events queue's backlog and the age of its oldest message, from a pull reply.
pub fn events_backlog(backlog: Option<u64>, oldest_age: Option<Duration>) {
    if let Some(backlog) = backlog {
        gauge!("batchd_events_backlog").set(backlog as f64);
    }
    if let Some(age) = oldest_age {
        gauge!("batchd_events_oldest_message_age_seconds").set(age.as_secs_f64());
    }
}

/// Records whether the last sample reached Redis.
pub fn redis_up(up: bool) {
    gauge!("batchd_redis_up").set(if up { 1.0 } else { 0.0 });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unreachable_gauge_rises_while_polls_fail_and_falls_when_the_batch_is_read() {
        let mut unreachable = Unreachable { batches: None, providers: Vec::new() };
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let forget = Duration::from_secs(90);
        assert!(unreachable.gauges(start).is_empty());
        assert!(unreachable.polled("openai", "job:0", false, at(0), forget), "a new provider");
        assert_eq!(unreachable.gauges(at(0)), [("openai".to_owned(), 0.0)]);
        assert!(unreachable.polled("openai", "job:0", true, at(10), forget), "a run starts");
        assert!(!unreachable.polled("openai", "job:0", true, at(40), forget), "and goes on");
        assert!(unreachable.polled("openai", "other:1", true, at(50), forget));
        assert!(unreachable.polled("anthropic", "a:0", true, at(45), forget));
        let gauges = unreachable.gauges(at(70));
        assert!(gauges.contains(&("openai".to_owned(), 60.0)), "{gauges:?}");
        assert!(gauges.contains(&("anthropic".to_owned(), 25.0)), "{gauges:?}");
        // Read at last: the other failing batch is the longest now.
        assert!(unreachable.polled("openai", "job:0", false, at(80), forget), "a run ends");
        assert!(!unreachable.polled("openai", "job:0", false, at(81), forget));
        assert!(unreachable.gauges(at(80)).contains(&("openai".to_owned(), 30.0)));
        // A batch no poll reports on any more (another replica polls it, or its job ended) stops counting, and is
        // dropped when another batch starts failing.
        assert!(unreachable.polled("anthropic", "b:0", true, at(200), forget));
        assert_eq!(unreachable.batches.as_ref().map(HashMap::len), Some(1), "only the new run is kept");
        assert_eq!(unreachable.gauges(at(200)), [("openai".to_owned(), 0.0), ("anthropic".to_owned(), 0.0)]);
    }

    /// Every `batchd_` name written in this file is listed in `NAMES`, and every listed name is described.
    #[test]
    fn names_lists_every_metric_of_this_module() {
        let source = include_str!("metrics.rs");
        let (code, _) = source.split_once("#[cfg(test)]").expect("test module");
        let mut used: Vec<&str> = code
            .match_indices("\"batchd_")
            .map(|(at, _)| {
                let rest = &code[at + 1..];
                &rest[..rest.find('"').expect("closing quote")]
            })
            .collect();
        used.sort_unstable();
        used.dedup();
        let mut listed: Vec<&str> = NAMES.to_vec();
        listed.sort_unstable();
        assert_eq!(used, listed);
        let describe = &code[code.find("pub fn describe()").expect("describe")..];
        for name in NAMES {
            assert!(describe.contains(&format!("\"{name}\"")), "{name} is not described");
        }
    }

    #[test]
    fn install_is_idempotent_and_renders_described_metrics() {
        let first = install().expect("install");
        let second = install().expect("second install returns the same handle");
        job_accepted();
        api_request("cloudflare", ApiCall::Poll, "ok", Some(200), Duration::from_millis(30));
        let text = second.render();
        assert!(text.contains("# TYPE batchd_jobs_accepted_total counter"), "{text}");
        assert!(
            text.contains(
                "batchd_api_request_duration_seconds_bucket{provider=\"cloudflare\",call=\"poll\",le=\"0.05\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("batchd_build_info{version=\""), "{text}");
        assert!(first.render().contains("# TYPE batchd_jobs_accepted_total counter"));
    }
}
