//! The emulator's shared state: timing, limits, pending faults, stored batches, the call logs and the events queue.
//!
//! Everything sits behind one mutex that is never held across an `.await`. A batch keeps only its computed
//! outputs (embeddings as seeds), never the request body; its completion is serialized outside the lock.
//!
//! Events are published lazily: a batch's `succeeded`/`failed` event is published by the first state access after
//! its done time (every pull, ack, poll, submit, batch listing and queue-stats read starts with that sweep), stamped
//! with the done time itself. So a pull made after the done time always sees the event (unless a fault drops or
//! delays it), and the queue looks exactly as if a background task had published it on time.
//!
//! Long because every operation on that state is a method here that takes the one lock, so the invariants tying
//! batches, pending faults, call logs and the events queue together are read in one file.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use rand::{RngExt, SeedableRng, rngs::StdRng, seq::SliceRandom};
use serde::{Serialize, Serializer, ser::Error as _, ser::SerializeMap};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::{
    calls::{CallRecord, QueueCallRecord},
    config::{DurationRange, EmulatorConfig, Family, ProviderLimits, RandomFaults, RateLimit},
    events::{EventFacts, EventFaults, EventType, EventsConfig},
    fault::{Endpoint, Fault, FaultKind},
    hub::{EventHub, Pulled, QueueStats},
    limits::{Limits, RateLimiter},
    outputs::{ItemOutput, ItemResult, SchemaError, hash_of, run_item},
    queue::AckOutcome,
};

/// Envelope error of an item in a `fail_items` batch.
const FAILED_ITEM_CODE: i64 = 5001;
/// Message of an item in a `fail_items` batch.
const FAILED_ITEM_MESSAGE: &str = "Model execution failed";
/// Envelope error of an item that does not fit its model's schema.
const SCHEMA_ITEM_CODE: i64 = 5004;

/// State shared by the HTTP handlers and the in-process handle.
#[derive(Debug)]
pub(crate) struct State {
    /// Settings fixed at start (the timing in it is only the initial value).
    pub config: EmulatorConfig,
    /// The Anthropic Message Batches emulator's own state (see [`crate::anthropic`]).
    pub anthropic: crate::anthropic::Anthropic,
    /// The OpenAI emulator's state, served by the same server.
    pub openai: Arc<crate::openai::OpenAi>,
    /// Each further mount of the OpenAI module (`EmulatorConfig::openai_mounts`): its path prefix and its state.
    pub openai_mounts: Vec<(String, Arc<crate::openai::OpenAi>)>,
    /// The Gemini Batch Mode emulator's state, served by the same server.
    pub gemini: Arc<crate::gemini::Gemini>,
    /// Everything that changes.
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Current timing of batches.
    timing: Timing,
    /// Current caps, rate limit and retention.
    limits: Limits,
    /// Calls admitted by the rate limit, per account and model.
    rate_limiter: RateLimiter,
    /// Calls answered 429 by the rate limit since start or the last reset.
    n_rate_limited: u64,
    /// Batches accepted since start (forgotten ones included).
    n_accepted: usize,
    /// Pending call-level faults, in injection order.
    call_faults: VecDeque<Fault>,
    /// Pending batch-level faults, in injection order.
    batch_faults: VecDeque<Fault>,
    /// Accepted batches by request id, until retention forgets them; kept across resets so in-flight polls
    /// keep working.
    batches: HashMap<String, Batch>,
    /// The call log.
    calls: Vec<CallRecord>,
    /// Sequence number of the last logged call.
    last_seq: u64,
    /// Per-batch random durations for new batches, if on.
    random_durations: Option<DurationRange>,
    /// Random transient faults, if on.
    random_faults: Option<RandomFaults>,
    /// Random reply latency, if on.
    random_latency: Option<DurationRange>,
    /// Whether a submit with any item that does not fit its model's schema is refused as a whole (5006).
    strict_items: bool,
    /// How that refusal is worded.
    strict_refusal: crate::config::RefusalForm,
    /// Models whose queued submits are refused with 8007.
    unbatchable_models: Vec<String>,
    /// Model catalog pages served (`ai/models/search`).
    catalog_calls: u64,
    /// The seeded generator behind both.
    rng: StdRng,
    /// Request ids of stored batches whose `succeeded`/`failed` event is not published yet (while events are off,
    /// batches collect here and are skipped when events come on).
    unannounced: HashSet<String>,
    /// Events settings, faults, queue and queue call log.
    hub: EventHub,
}

/// A transient fault drawn by [`EmulatorConfig::random_faults`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RandomFault {
    /// HTTP 500 with a JSON error envelope.
    Status500,
    /// HTTP 502 with an HTML gateway page.
    Html502,
    /// HTTP 503 with a JSON error envelope.
    Status503,
    /// The connection is reset without a reply.
    Reset,
}

impl RandomFault {
    /// The name recorded in the call log's `fault`.
    pub fn name(self) -> &'static str {
        match self {
            RandomFault::Status500 => "random_500",
            RandomFault::Html502 => "random_502",
            RandomFault::Status503 => "random_503",
            RandomFault::Reset => "random_reset",
        }
    }

    /// The same misbehaviour as an injected fault.
    pub fn as_fault_kind(self) -> FaultKind {
        match self {
            RandomFault::Status500 => {
                FaultKind::Status { status: 500, code: None, message: None, retry_after_secs: None }
            }
            RandomFault::Html502 => FaultKind::Html { status: 502 },
            RandomFault::Status503 => {
                FaultKind::Status { status: 503, code: None, message: None, retry_after_secs: None }
            }
            RandomFault::Reset => FaultKind::Reset,
        }
    }
}

/// How long batches stay in each pending state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// Time from submit during which a batch is `queued`.
    pub queued_for: Duration,
    /// Time after `queued_for` during which a batch is `running`.
    pub running_for: Duration,
}

/// Where a batch is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// Accepted, not started.
    Queued,
    /// Started, not finished.
    Running,
    /// Finished (successfully or not).
    Done,
}

/// The phase of a batch submitted `elapsed` ago.
pub(crate) fn phase(elapsed: Duration, timing: Timing) -> Phase {
    if elapsed < timing.queued_for {
        Phase::Queued
    } else if elapsed < timing.queued_for + timing.running_for {
        Phase::Running
    } else {
        Phase::Done
    }
}

/// Whether a batch submitted `elapsed` ago finished more than `retention` ago (never without a retention).
pub(crate) fn expired(elapsed: Duration, timing: Timing, retention: Option<Duration>) -> bool {
    let Some(retention) = retention else {
        return false;
    };
    elapsed.checked_sub(timing.queued_for + timing.running_for).is_some_and(|done_for| done_for > retention)
}

/// One accepted batch.
#[derive(Debug)]
pub(crate) struct Batch {
    /// When it was accepted, on the emulator's clock.
    submitted_at: Instant,
    /// The model it was submitted to (its events' `source.modelName`).
    model: String,
    /// Whether it fails as a whole once done (`fail_batch`).
    failed: bool,
    /// Its own time from submit to done, when drawn from [`EmulatorConfig::random_durations`]; `None`: the
    /// current global timing applies.
    duration: Option<Duration>,
    /// How its pending polls deviate from the documented reply (batch-level faults).
    replies: ReplyVariant,
    /// The `result` object polls return once it is done (computed at submit time, serialized per poll).
    completion: Arc<Completion>,
}

impl Batch {
    /// The timing that applies to this batch: its own drawn duration (a quarter queued, the rest running), or
    /// the global timing.
    fn timing(&self, global: Timing) -> Timing {
        match self.duration {
            Some(total) => {
                let queued_for = total / 4;
                Timing { queued_for, running_for: total - queued_for }
            }
            None => global,
        }
    }

    /// When it is done under the global timing `global`.
    fn done_at(&self, global: Timing) -> Instant {
        let timing = self.timing(global);
        self.submitted_at + timing.queued_for + timing.running_for
    }
}

/// What a poll finds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PollOutcome {
    /// No batch has this id (never had, or retention forgot it).
    NotFound,
    /// Still queued or running, and how the batch's pending replies deviate from the documented one.
    Pending(Phase, ReplyVariant),
    /// Done and failed as a whole.
    Failed,
    /// Done: the `result` object to return.
    Done(Arc<Completion>),
}

/// How a batch's replies deviate from the documented ones, set by batch-level faults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ReplyVariant {
    /// `pending_status`: the status pending polls report instead of `queued`/`running`.
    pub pending_status: Option<String>,
    /// `empty_pending_list`: pending polls also carry `"responses": []`.
    pub empty_pending_list: bool,
    /// `odd_types`: the submit reply, pending polls and the completion use unexpected JSON types.
    pub odd_types: bool,
}

/// How a reply writes a boolean: the documented JSON boolean, or, for an `odd_types` batch, a string or a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BoolForm {
    /// `true` / `false`.
    Bool,
    /// `"true"` / `"false"`.
    Text,
    /// `1` / `0`.
    Number,
}

impl BoolForm {
    /// The form of `success` in a batch's submit reply and completion (the envelope's and each item's):
    /// `"true"`/`"false"` for an `odd_types` batch.
    pub fn of_submit_and_completion(odd_types: bool) -> Self {
        if odd_types { BoolForm::Text } else { BoolForm::Bool }
    }

    /// The form of `success` in the envelope of a batch's pending polls: `1` for an `odd_types` batch.
    pub fn of_pending_poll(odd_types: bool) -> Self {
        if odd_types { BoolForm::Number } else { BoolForm::Bool }
    }

    /// `value` in this form.
    pub fn write(self, value: bool) -> Value {
        match self {
            BoolForm::Bool => Value::Bool(value),
            BoolForm::Text => Value::String(value.to_string()),
            BoolForm::Number => Value::from(u8::from(value)),
        }
    }
}

/// The `result` object of a done batch, as computed at submit time.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Completion {
    /// Whether entries are listed under the docs' `responses` keyed by `id` (else `results` keyed by `index`, the
    /// shape live replies have in 2026).
    documented_shape: bool,
    /// Whether entries use the `odd_types` forms: ids as numeric strings, `success` as `"true"`/`"false"`,
    /// results as JSON text.
    odd_types: bool,
    /// One entry per item not dropped, in response order.
    entries: Vec<Entry>,
    /// Tokens counted over the items that succeeded.
    usage: Usage,
}

/// One response item.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    /// Index of the item in the submitted `requests`.
    index: usize,
    /// `external_reference` from the top level of the item, `null` when absent.
    external_reference: Value,
    /// The inner `result`, or the code and message of the item's error.
    outcome: Result<ItemResult, (i64, String)>,
}

/// Token counts of a completion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
struct Usage {
    /// Tokens of the inputs.
    prompt_tokens: u64,
    /// Tokens of the generated text.
    completion_tokens: u64,
    /// The sum of both.
    total_tokens: u64,
}

impl Completion {
    /// Whether the reply around this completion uses the `odd_types` forms too.
    pub fn odd_types(&self) -> bool {
        self.odd_types
    }
}

impl Serialize for Completion {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        let key = if self.documented_shape { "responses" } else { "results" };
        let entries: Vec<EntryView<'_>> = self
            .entries
            .iter()
            .map(|entry| EntryView {
                entry,
                id_key: if self.documented_shape { "id" } else { "index" },
                odd_types: self.odd_types,
            })
            .collect();
        map.serialize_entry(key, &entries)?;
        map.serialize_entry("usage", &self.usage)?;
        map.end()
    }
}

/// An entry with the name of its index key (`id` or `index`).
struct EntryView<'a> {
    /// The entry.
    entry: &'a Entry,
    /// `index` (live) or `id` (documented: the `documented_shape` fault or option).
    id_key: &'static str,
    /// Whether to write the `odd_types` forms.
    odd_types: bool,
}

impl Serialize for EntryView<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let entry = self.entry;
        let success = BoolForm::of_submit_and_completion(self.odd_types);
        let mut map = serializer.serialize_map(Some(4))?;
        if self.odd_types {
            map.serialize_entry(self.id_key, &entry.index.to_string())?;
        } else {
            map.serialize_entry(self.id_key, &entry.index)?;
        }
        match &entry.outcome {
            Ok(result) if self.odd_types => {
                let text = serde_json::to_string(result).map_err(S::Error::custom)?;
                map.serialize_entry("result", &text)?;
                map.serialize_entry("success", &success.write(true))?;
            }
            Ok(result) => {
                map.serialize_entry("result", result)?;
                map.serialize_entry("success", &success.write(true))?;
            }
            Err((code, message)) => {
                map.serialize_entry("success", &success.write(false))?;
                map.serialize_entry("error", &ItemError { code: *code, message })?;
            }
        }
        map.serialize_entry("external_reference", &entry.external_reference)?;
        map.end()
    }
}

/// The `error` object of a failed item.
#[derive(Serialize)]
struct ItemError<'a> {
    /// Envelope-style error code.
    code: i64,
    /// What went wrong.
    message: &'a str,
}

/// Batch-level faults that apply to one batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BatchPlan {
    /// Items that fail.
    pub fail_items: Vec<usize>,
    /// Items left out of the completion.
    pub drop_items: Vec<usize>,
    /// Whether the completion uses the docs' `responses[]`/`id` shape (else the live `results[]`/`index`).
    pub documented_shape: bool,
    /// Whether the batch fails as a whole.
    pub fail_batch: bool,
    /// How its replies deviate from the documented ones.
    pub replies: ReplyVariant,
    /// Names of the faults that made this plan, for the call log.
    pub fault_names: Vec<&'static str>,
}

impl State {
    pub fn new(config: EmulatorConfig) -> Self {
        let timing = Timing { queued_for: config.queued_for, running_for: config.running_for };
        let limits = Limits::from_config(&config);
        let random_durations = config.random_durations;
        let random_faults = config.random_faults;
        let random_latency = config.random_latency;
        let strict_items = config.strict_items;
        let strict_refusal = config.strict_refusal;
        let unbatchable_models = config.unbatchable_models.clone();
        let rng = StdRng::seed_from_u64(config.seed);
        let hub = EventHub::new(&config);
        let anthropic = crate::anthropic::Anthropic::new(config.anthropic.clone());
        let openai = Arc::new(crate::openai::OpenAi::new(&config.openai, config.seed));
        let openai_mounts = config
            .openai_mounts
            .iter()
            .enumerate()
            .map(|(index, mount)| {
                let seed = config.seed.wrapping_add(index as u64 + 1);
                (mount.prefix.clone(), Arc::new(crate::openai::OpenAi::new(&mount.config, seed)))
            })
            .collect();
        let gemini = Arc::new(crate::gemini::Gemini::new(config.gemini.clone()));
        Self {
            config,
            anthropic,
            openai,
            openai_mounts,
            gemini,
            inner: Mutex::new(Inner {
                timing,
                limits,
                rate_limiter: RateLimiter::default(),
                n_rate_limited: 0,
                n_accepted: 0,
                call_faults: VecDeque::new(),
                batch_faults: VecDeque::new(),
                batches: HashMap::new(),
                calls: Vec::new(),
                last_seq: 0,
                random_durations,
                random_faults,
                random_latency,
                strict_items,
                strict_refusal,
                unbatchable_models,
                catalog_calls: 0,
                rng,
                unannounced: HashSet::new(),
                hub,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the state half-updated in a way that matters here.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn timing(&self) -> Timing {
        self.lock().timing
    }

    pub fn set_timing(&self, timing: Timing) {
        self.lock().timing = timing;
    }

    pub fn limits(&self) -> Limits {
        self.lock().limits
    }

    /// Changes the limits with `change` and returns the new ones; a changed rate limit starts with empty windows.
    pub fn update_limits(&self, change: impl FnOnce(&mut Limits)) -> Limits {
        let mut inner = self.lock();
        let mut limits = inner.limits;
        change(&mut limits);
        if inner.limits.rate_limit != limits.rate_limit {
            inner.rate_limiter.clear();
        }
        inner.limits = limits;
        limits
    }

    /// Applies the rate limit to a call for `account` and `model`: `Err` is how long until one would be
    /// admitted (the call is counted as rate-limited). Polls pass unless `limit_polls` is set.
    pub fn admit(&self, account: &str, model: &str, is_poll: bool) -> Result<(), Duration> {
        let mut inner = self.lock();
        let Some(limit): Option<RateLimit> = inner.limits.rate_limit else {
            return Ok(());
        };
        if is_poll && !inner.limits.limit_polls {
            return Ok(());
        }
        let admitted = inner.rate_limiter.admit(account, model, limit, Instant::now());
        if admitted.is_err() {
            inner.n_rate_limited += 1;
        }
        admitted
    }

    /// Sets the three providers' creation and request limits to a preset (see [`ProviderLimits`]).
    pub fn set_provider_limits(&self, preset: ProviderLimits) {
        let (workers_ai, openai, anthropic) = preset.limits();
        self.update_limits(|limits| {
            limits.rate_limit = workers_ai;
            limits.limit_polls = false;
        });
        self.openai.set_create_limit(openai);
        self.anthropic.set_rate_limit(anthropic);
    }

    pub fn rate_limited_count(&self) -> u64 {
        self.lock().n_rate_limited
    }

    pub fn random_durations(&self) -> Option<DurationRange> {
        self.lock().random_durations
    }

    /// Changes the random durations of batches submitted from now on (`None`: the fixed timing).
    pub fn set_random_durations(&self, range: Option<DurationRange>) {
        self.lock().random_durations = range;
    }

    pub fn random_faults(&self) -> Option<RandomFaults> {
        self.lock().random_faults
    }

    pub fn set_random_faults(&self, faults: Option<RandomFaults>) {
        self.lock().random_faults = faults;
    }

    pub fn random_latency(&self) -> Option<DurationRange> {
        self.lock().random_latency
    }

    pub fn set_random_latency(&self, latency: Option<DurationRange>) {
        self.lock().random_latency = latency;
    }

    pub fn strict_items(&self) -> bool {
        self.lock().strict_items
    }

    /// Turns the whole-submit schema check on or off for submits from now on.
    pub fn set_strict_items(&self, strict_items: bool) {
        self.lock().strict_items = strict_items;
    }

    pub fn strict_refusal(&self) -> crate::config::RefusalForm {
        self.lock().strict_refusal
    }

    /// Changes how strict-mode refusals are worded, for submits from now on.
    pub fn set_strict_refusal(&self, form: crate::config::RefusalForm) {
        self.lock().strict_refusal = form;
    }

    pub fn unbatchable_models(&self) -> Vec<String> {
        self.lock().unbatchable_models.clone()
    }

    /// Replaces the models whose queued submits are refused with 8007.
    pub fn set_unbatchable_models(&self, models: Vec<String>) {
        self.lock().unbatchable_models = models;
    }

    /// Whether queued submits to `model` are refused with 8007.
    pub fn is_unbatchable(&self, model: &str) -> bool {
        self.lock().unbatchable_models.iter().any(|name| name == model)
    }

    /// Counts one catalog page served and returns every model the catalog lists, as `(name, family, batchable)`:
    /// the extra models first, then the default ones not overridden; a model refused with 8007 is listed without
    /// `async_queue`.
    pub fn catalog_models(&self) -> Vec<(String, Family, bool)> {
        let mut inner = self.lock();
        inner.catalog_calls += 1;
        let mut models: Vec<(String, Family)> = self.config.extra_models.clone();
        for (name, family) in crate::config::default_models() {
            if !models.iter().any(|(known, _)| *known == name) {
                models.push((name, family));
            }
        }
        models
            .into_iter()
            .map(|(name, family)| {
                let batchable = !inner.unbatchable_models.contains(&name);
                (name, family, batchable)
            })
            .collect()
    }

    /// Catalog pages served since start.
    pub fn catalog_calls(&self) -> u64 {
        self.lock().catalog_calls
    }

    /// Runs `change` on the account's event subscriptions (events due under the current ones are published
    /// first, so a new subscription only covers events from now on).
    pub fn with_subscriptions<T>(&self, change: impl FnOnce(&mut crate::subscriptions::Subscriptions) -> T) -> T {
        let mut inner = self.lock();
        inner.publish_due_events();
        change(&mut inner.hub.subscriptions)
    }

    /// Draws the delay of one reply (zero without a random latency).
    pub fn draw_latency(&self) -> Duration {
        let mut inner = self.lock();
        match inner.random_latency {
            Some(range) if range.max > range.min => inner.rng.random_range(range.min..=range.max),
            Some(range) => range.min,
            None => Duration::ZERO,
        }
    }

    /// Draws whether a call to `endpoint` fails at random, and how.
    pub fn draw_random_fault(&self, endpoint: Endpoint) -> Option<RandomFault> {
        let mut inner = self.lock();
        let faults = inner.random_faults?;
        if !faults.calls.matches(endpoint) || faults.rate <= 0.0 || !inner.rng.random_bool(faults.rate.min(1.0)) {
            return None;
        }
        Some(match inner.rng.random_range(0..4u8) {
            0 => RandomFault::Status500,
            1 => RandomFault::Html502,
            2 => RandomFault::Status503,
            _ => RandomFault::Reset,
        })
    }

    /// Queues a fault; one with `times == 0` does nothing.
    pub fn inject(&self, fault: Fault) {
        if fault.times == 0 {
            return;
        }
        let mut inner = self.lock();
        if fault.kind.is_batch_level() {
            inner.batch_faults.push_back(fault);
        } else {
            inner.call_faults.push_back(fault);
        }
    }

    /// Pending faults, call-level first.
    pub fn pending_faults(&self) -> Vec<Fault> {
        let inner = self.lock();
        inner.call_faults.iter().chain(inner.batch_faults.iter()).cloned().collect()
    }

    /// Takes one use of the oldest call-level fault that matches a call to `endpoint`.
    pub fn take_call_fault(&self, endpoint: Endpoint) -> Option<FaultKind> {
        let mut inner = self.lock();
        let position = inner.call_faults.iter().position(|fault| fault.calls.matches(endpoint))?;
        take_one(&mut inner.call_faults, position)
    }

    /// Takes one use of the oldest pending batch-level fault of each kind.
    pub fn take_batch_plan(&self) -> BatchPlan {
        let mut inner = self.lock();
        let mut plan = BatchPlan { documented_shape: self.config.documented_shape, ..BatchPlan::default() };
        let names = [
            "fail_items",
            "drop_items",
            "documented_shape",
            "fail_batch",
            "pending_status",
            "empty_pending_list",
            "odd_types",
        ];
        for name in names {
            let Some(position) = inner.batch_faults.iter().position(|fault| fault.kind.name() == name) else {
                continue;
            };
            let Some(kind) = take_one(&mut inner.batch_faults, position) else {
                continue;
            };
            plan.fault_names.push(kind.name());
            match kind {
                FaultKind::FailItems { indices } => plan.fail_items = indices,
                FaultKind::DropItems { indices } => plan.drop_items = indices,
                FaultKind::DocumentedShape => plan.documented_shape = true,
                FaultKind::FailBatch => plan.fail_batch = true,
                FaultKind::PendingStatus { status } => plan.replies.pending_status = Some(status),
                FaultKind::EmptyPendingList => plan.replies.empty_pending_list = true,
                FaultKind::OddTypes => plan.replies.odd_types = true,
                _ => {}
            }
        }
        plan
    }

    /// Stores a new batch and publishes its `queued` event; its completion is built now from the items' outputs
    /// (see [`run_items`]).
    pub fn add_batch(&self, request_id: &str, model: &str, runs: Vec<ItemRun>, plan: &BatchPlan) {
        let completion = completion(request_id, runs, plan);
        let mut inner = self.lock();
        let duration = match inner.random_durations {
            Some(range) if range.max > range.min => Some(inner.rng.random_range(range.min..=range.max)),
            Some(range) => Some(range.min),
            None => None,
        };
        let now = Instant::now();
        let batch = Batch {
            submitted_at: now,
            model: model.to_owned(),
            failed: plan.fail_batch,
            duration,
            replies: plan.replies.clone(),
            completion: Arc::new(completion),
        };
        inner.forget_expired();
        inner.n_accepted += 1;
        inner.batches.insert(request_id.to_owned(), batch);
        inner.unannounced.insert(request_id.to_owned());
        let account_id = self.config.account_id.as_str();
        let now_ms = unix_ms();
        let facts = EventFacts { event_type: EventType::Queued, model, request_id, account_id, at_ms: now_ms };
        inner.hub.publish(facts, now, now, now_ms);
    }

    pub fn poll(&self, request_id: &str) -> PollOutcome {
        let mut inner = self.lock();
        inner.forget_expired();
        let Some(batch) = inner.batches.get(request_id) else {
            return PollOutcome::NotFound;
        };
        match phase(batch.submitted_at.elapsed(), batch.timing(inner.timing)) {
            Phase::Done if batch.failed => PollOutcome::Failed,
            Phase::Done => PollOutcome::Done(Arc::clone(&batch.completion)),
            pending => PollOutcome::Pending(pending, batch.replies.clone()),
        }
    }

    /// Batches accepted since start, including those retention forgot.
    pub fn batch_count(&self) -> usize {
        self.lock().n_accepted
    }

    /// Batches stored now (retention forgets finished ones).
    pub fn stored_batch_count(&self) -> usize {
        let mut inner = self.lock();
        inner.forget_expired();
        inner.batches.len()
    }

    /// Request ids and phases of the stored batches.
    pub fn batch_phases(&self) -> Vec<(String, Phase)> {
        let mut inner = self.lock();
        inner.forget_expired();
        let mut phases: Vec<(String, Phase)> = inner
            .batches
            .iter()
            .map(|(id, batch)| (id.clone(), phase(batch.submitted_at.elapsed(), batch.timing(inner.timing))))
            .collect();
        phases.sort();
        phases
    }

    /// Appends a call to the log, filling in `seq` and `at_ms`.
    pub fn record(&self, mut call: CallRecord) {
        let mut inner = self.lock();
        inner.last_seq += 1;
        call.seq = inner.last_seq;
        call.at_ms = unix_ms();
        inner.calls.push(call);
    }

    pub fn calls(&self) -> Vec<CallRecord> {
        self.lock().calls.clone()
    }

    /// The events settings; `None`: events off.
    pub fn events(&self) -> Option<EventsConfig> {
        self.lock().hub.config.clone()
    }

    /// Replaces the events settings. Events due under the old settings are published first; when events come on,
    /// batches already done get no event (they finished before the subscription existed), pending ones will.
    /// Messages already in the queue stay (turning events off makes the endpoints answer 404 but keeps them).
    pub fn set_events(&self, events: Option<EventsConfig>) {
        let mut inner = self.lock();
        inner.publish_due_events();
        if inner.hub.config.is_none() && events.is_some() {
            inner.skip_done_batches();
        }
        inner.hub.set_config(events);
    }

    /// The event faults in force (`drop_next` shows what is left of it).
    pub fn event_faults(&self) -> EventFaults {
        self.lock().hub.faults.clone()
    }

    /// Replaces the event faults, for events published from now on (events already due are published first).
    pub fn set_event_faults(&self, faults: EventFaults) {
        let mut inner = self.lock();
        inner.publish_due_events();
        inner.hub.faults = faults.clamped();
    }

    /// Applies the pull rate limit: `Err` is how long until a pull would be admitted.
    pub fn admit_pull(&self) -> Result<(), Duration> {
        self.lock().hub.admit_pull(Instant::now())
    }

    /// Publishes the events due, then leases up to `batch_size` messages for `visibility`.
    pub fn pull(&self, batch_size: usize, visibility: Duration) -> Pulled {
        let mut inner = self.lock();
        inner.publish_due_events();
        inner.hub.pull(Instant::now(), batch_size, visibility)
    }

    /// Publishes the events due, then applies acks and retries (each retry with its delay).
    pub fn ack(&self, acks: &[String], retries: &[(String, Duration)]) -> AckOutcome {
        let mut inner = self.lock();
        inner.publish_due_events();
        inner.hub.ack(Instant::now(), acks, retries)
    }

    /// Publishes the events due, then counts the queue.
    pub fn queue_stats(&self) -> QueueStats {
        let mut inner = self.lock();
        inner.publish_due_events();
        inner.hub.stats(Instant::now())
    }

    /// Drops every message in the events queue (events due are published first, and dropped with the rest).
    pub fn purge_queue(&self) {
        let mut inner = self.lock();
        inner.publish_due_events();
        inner.hub.purge();
    }

    /// Appends a call to the queue call log.
    pub fn record_queue_call(&self, call: QueueCallRecord) {
        self.lock().hub.record(call, unix_ms());
    }

    pub fn queue_calls(&self) -> Vec<QueueCallRecord> {
        self.lock().hub.calls()
    }

    /// Clears pending faults, the call logs, the rate-limit windows and the rate-limited count; keeps batches,
    /// timing, limits, the events queue and its settings, faults and counters.
    pub fn reset(&self) {
        let mut inner = self.lock();
        inner.hub.reset();
        inner.call_faults.clear();
        inner.batch_faults.clear();
        inner.calls.clear();
        inner.last_seq = 0;
        inner.rate_limiter.clear();
        inner.n_rate_limited = 0;
    }
}

impl Inner {
    /// Drops the batches that finished more than the retention ago, after publishing their events.
    fn forget_expired(&mut self) {
        self.publish_due_events();
        let Some(retention) = self.limits.retention else {
            return;
        };
        let timing = self.timing;
        let unannounced = &mut self.unannounced;
        self.batches.retain(|request_id, batch| {
            let keep = !expired(batch.submitted_at.elapsed(), batch.timing(timing), Some(retention));
            if !keep {
                unannounced.remove(request_id);
                tracing::debug!(%request_id, "batch forgotten after its retention");
            }
            keep
        });
    }

    /// Publishes the `succeeded`/`failed` events of the batches whose done time has passed, in done-time order,
    /// each stamped with its done time. Does nothing while events are off.
    fn publish_due_events(&mut self) {
        if self.hub.config.is_none() || self.unannounced.is_empty() {
            return;
        }
        let account_id = self.hub.account_id().to_owned();
        let account_id = account_id.as_str();
        let now = Instant::now();
        let timing = self.timing;
        let mut due: Vec<(Instant, String)> = self
            .unannounced
            .iter()
            .filter_map(|request_id| {
                let done_at = self.batches.get(request_id)?.done_at(timing);
                (done_at <= now).then(|| (done_at, request_id.clone()))
            })
            .collect();
        due.sort();
        let now_ms = unix_ms();
        for (done_at, request_id) in due {
            self.unannounced.remove(&request_id);
            let Some(batch) = self.batches.get(&request_id) else {
                continue;
            };
            let event_type = if batch.failed { EventType::Failed } else { EventType::Succeeded };
            let at_ms = crate::hub::unix_ms_at(done_at, now, now_ms);
            let facts = EventFacts { event_type, model: &batch.model, request_id: &request_id, account_id, at_ms };
            self.hub.publish(facts, done_at, now, now_ms);
        }
    }

    /// Forgets the pending announcements of batches already done: events turned on now are not published for them.
    fn skip_done_batches(&mut self) {
        let now = Instant::now();
        let timing = self.timing;
        let batches = &self.batches;
        self.unannounced.retain(|request_id| batches.get(request_id).is_some_and(|batch| batch.done_at(timing) > now));
    }
}

/// Uses up one of the `times` of the fault at `position`, removing it when none are left.
fn take_one(faults: &mut VecDeque<Fault>, position: usize) -> Option<FaultKind> {
    let fault = faults.get_mut(position)?;
    fault.times = fault.times.saturating_sub(1);
    let kind = fault.kind.clone();
    if fault.times == 0 {
        faults.remove(position);
    }
    Some(kind)
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// The order in which item indices appear in a completion: shuffled from the request id, never sorted when n >= 2.
pub(crate) fn response_order(request_id: &str, indices: &mut [usize]) {
    let mut rng = StdRng::seed_from_u64(hash_of(&[request_id]));
    indices.shuffle(&mut rng);
    if indices.is_sorted() {
        indices.rotate_left(1);
    }
}

/// One submitted item after its model ran on it: what a completion is built from.
#[derive(Debug)]
pub(crate) struct ItemRun {
    /// `external_reference` from the top level of the item, `null` when absent.
    external_reference: Value,
    /// The item's output, or why it does not fit its model's schema.
    pub outcome: Result<ItemOutput, SchemaError>,
}

/// Runs the model on every item, in index order; each item's input is dropped as soon as it has run. A strict
/// submit is checked on these outputs, so no item is run twice.
pub(crate) fn run_items(model: &str, family: Family, items: Vec<Map<String, Value>>) -> Vec<ItemRun> {
    items
        .into_iter()
        .map(|mut item| {
            let external_reference = item.remove("external_reference").unwrap_or(Value::Null);
            ItemRun { external_reference, outcome: run_item(model, family, &item) }
        })
        .collect()
}

/// The completion of a done batch: responses (or results) in shuffled order, and usage.
pub(crate) fn completion(request_id: &str, runs: Vec<ItemRun>, plan: &BatchPlan) -> Completion {
    let mut order: Vec<usize> = (0..runs.len()).filter(|index| !plan.drop_items.contains(index)).collect();
    response_order(request_id, &mut order);
    let mut runs: Vec<Option<ItemRun>> = runs.into_iter().map(Some).collect();
    let mut usage = Usage::default();
    let entries: Vec<Entry> = order
        .iter()
        .filter_map(|&index| {
            let run = runs[index].take()?;
            let outcome = if plan.fail_items.contains(&index) {
                Err((FAILED_ITEM_CODE, FAILED_ITEM_MESSAGE.to_owned()))
            } else {
                run.outcome.map_err(|error| (SCHEMA_ITEM_CODE, error.item_message()))
            };
            if let Ok(output) = &outcome {
                usage.prompt_tokens += output.prompt_tokens;
                usage.completion_tokens += output.completion_tokens;
            }
            Some(Entry {
                index,
                external_reference: run.external_reference,
                outcome: outcome.map(|output| output.result),
            })
        })
        .collect();
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    Completion { documented_shape: plan.documented_shape, odd_types: plan.replies.odd_types, entries, usage }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn items(values: Value) -> Vec<Map<String, Value>> {
        values.as_array().expect("array").iter().map(|item| item.as_object().cloned().expect("object")).collect()
    }

    #[test]
    fn phase_follows_the_clock() {
        let timing = Timing { queued_for: Duration::from_millis(10), running_for: Duration::from_millis(20) };
        assert_eq!(phase(Duration::ZERO, timing), Phase::Queued);
        assert_eq!(phase(Duration::from_millis(10), timing), Phase::Running);
        assert_eq!(phase(Duration::from_millis(29), timing), Phase::Running);
        assert_eq!(phase(Duration::from_millis(30), timing), Phase::Done);
    }

    #[test]
    fn expiry_counts_from_the_end_of_running() {
        let timing = Timing { queued_for: Duration::from_millis(10), running_for: Duration::from_millis(20) };
        let retention = Some(Duration::from_millis(100));
        assert!(!expired(Duration::from_millis(130), timing, retention));
        assert!(expired(Duration::from_millis(131), timing, retention));
        assert!(!expired(Duration::from_millis(5), timing, Some(Duration::ZERO)));
        assert!(expired(Duration::from_millis(31), timing, Some(Duration::ZERO)));
        assert!(!expired(Duration::from_secs(3600), timing, None));
    }

    #[test]
    fn response_order_is_never_sorted() {
        for n in 2..12 {
            for seed in 0..50 {
                let mut order: Vec<usize> = (0..n).collect();
                response_order(&format!("id-{seed}"), &mut order);
                assert!(!order.is_sorted(), "n={n} seed={seed}");
                let mut again: Vec<usize> = (0..n).collect();
                response_order(&format!("id-{seed}"), &mut again);
                assert_eq!(order, again);
            }
        }
    }

    /// The serialized completion of text-generation `items` under `plan`.
    fn done(items: &[Map<String, Value>], plan: &BatchPlan) -> Value {
        let runs = run_items("@cf/m", Family::TextGeneration, items.to_vec());
        serde_json::to_value(completion("x", runs, plan)).expect("serializes")
    }

    #[test]
    fn completion_applies_the_plan() {
        let items = items(json!([
            {"prompt": "a", "external_reference": "r0"},
            {"prompt": "b"},
            {"prompt": "c", "external_reference": "r2"},
            {"max_tokens": 1}
        ]));
        let plan =
            BatchPlan { fail_items: vec![1], drop_items: vec![2], documented_shape: true, ..BatchPlan::default() };
        let done_value = done(&items, &plan);
        let responses = done_value["responses"].as_array().expect("responses");
        assert_eq!(responses.len(), 3);
        let by_id = |id: u64| responses.iter().find(|r| r["id"] == id).expect("present");
        assert_eq!(by_id(0)["result"]["response"], "echo: a");
        assert_eq!(by_id(0)["external_reference"], "r0");
        assert_eq!(by_id(1)["success"], false);
        assert_eq!(by_id(1)["external_reference"], Value::Null);
        assert_eq!(by_id(3)["error"]["code"], 5004);
        assert_eq!(by_id(3)["error"]["message"], "Invalid data: oneOf at '/' not met (expected prompt or messages)");
        assert!(by_id(3).get("result").is_none());
        assert_eq!(done_value["usage"]["prompt_tokens"], 1);

        // The default: the live shape.
        let done_value = done(&items, &BatchPlan::default());
        assert_eq!(done_value["results"].as_array().expect("results").len(), 4);
        assert!(done_value.get("responses").is_none());
        assert!(done_value["results"].as_array().expect("results").iter().all(|r| r.get("index").is_some()));
        assert!(done_value["results"][0].get("id").is_none());
    }

    #[test]
    fn odd_types_write_ids_flags_and_results_as_text() {
        let items = items(json!([{"prompt": "hi", "external_reference": "r0"}, {"max_tokens": 1}]));
        let plain = done(&items, &BatchPlan::default());
        let plan = BatchPlan {
            replies: ReplyVariant { odd_types: true, ..ReplyVariant::default() },
            documented_shape: true,
            ..BatchPlan::default()
        };
        let odd = done(&items, &plan);
        let by_id = |id: &str| odd["responses"].as_array().expect("responses").iter().find(|r| r["id"] == id).cloned();
        let good = by_id("0").expect("item 0");
        assert_eq!(
            good,
            json!({"id": "0", "result": "{\"response\":\"echo: hi\"}", "success": "true", "external_reference": "r0"})
        );
        let bad = by_id("1").expect("item 1");
        assert_eq!(bad["success"], "false");
        assert_eq!(bad["error"]["code"], 5004);
        assert_eq!(odd["usage"], plain["usage"]);
        assert_eq!(BoolForm::Number.write(true), json!(1));
        assert_eq!(BoolForm::Number.write(false), json!(0));
    }
}
