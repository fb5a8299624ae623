//! A local fake of the Cloudflare Workers AI asynchronous Batch API, for tests and development.
//!
//! [`Emulator::start`] serves the run endpoint (`/client/v4/accounts/{account_id}/ai/run/{model}`)
//! and a control API under `/_emulator/`; the returned [`EmulatorHandle`] injects faults, changes
//! the timing, the limits (body and item caps, rate limit, retention) and the submit checks (strict items,
//! unbatchable models), and reads the call log in-process. The control API has no authentication: the
//! emulator is for local use only and must never listen on a public interface.
//!
//! With [`EmulatorConfig::events`], it also publishes Workers AI batch events to a queue served by the Cloudflare
//! Queues pull consumer endpoints (`/client/v4/accounts/{account_id}/queues/{queue_id}/messages/pull` and `/ack`),
//! with leases, redelivery and event faults (see the README, "Events and the Queues pull consumer").
//!
//! The same server fakes Anthropic's Message Batches API under `/anthropic` (see [`EmulatorHandle::anthropic`] and
//! the README, "Anthropic Message Batches"), and OpenAI's Files and Batch APIs under `/openai/v1`
//! ([`EmulatorHandle::openai_base_url`]), controlled through [`EmulatorHandle::openai`] or `/_emulator/openai/`
//! (see the README, "OpenAI Batch API"), and Google's Gemini Batch Mode under `/gemini` ([`EmulatorHandle::gemini`],
//! the README's "Gemini Batch Mode"). The OpenAI module can be mounted again under other paths as a vendor that copies
//! OpenAI's API ([`OpenAiMount::groq`], [`OpenAiMount::azure`], [`OpenAiMount::novita`];
//! [`EmulatorHandle::openai_mount`]).

mod account_api;
mod anthropic;
mod calls;
mod config;
mod control;
mod events;
mod fault;
mod gemini;
mod hold;
mod hub;
mod limits;
mod listener;
mod openai;
mod outputs;
mod queue;
mod queue_api;
mod server;
mod state;
mod subscriptions;

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    net::TcpListener,
    sync::{oneshot, watch},
    task::JoinHandle,
};

pub use crate::{
    anthropic::{
        AnthropicCall, AnthropicCallKind, AnthropicCalls, AnthropicConfig, AnthropicControl, AnthropicFault,
        AnthropicFaultKind, ErrorShape,
    },
    calls::{CallKind, CallRecord, QueueCallKind, QueueCallRecord},
    config::{
        DurationRange, EmulatorConfig, Family, ProviderLimits, RandomFaults, RateLimit, RefusalForm, SchemaKeyword,
        default_models,
    },
    events::{
        AckWarnings, DEFAULT_EVENTS_QUEUE, DEFAULT_SUBSCRIPTION_ID, EventBody, EventCounts, EventFaults, EventsConfig,
        PullOrder,
    },
    fault::{Calls, Fault, FaultKind},
    gemini::{GeminiCall, GeminiCallKind, GeminiCalls, GeminiConfig, GeminiControl, GeminiFault, GeminiFaultKind},
    hub::QueueStats,
    openai::{
        OPENAI_PREFIX, OpenAiCallKind, OpenAiCallRecord, OpenAiConfig, OpenAiDialect, OpenAiFault, OpenAiFaultKind,
        OpenAiHandle, OpenAiKeyHeader, OpenAiLimits, OpenAiMount, OpenAiTiming,
    },
    subscriptions::Subscription,
};
use crate::{
    listener::{Connection, ResettableListener},
    state::{State, Timing},
};

/// How long [`EmulatorHandle::shutdown`] waits for open connections before dropping them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// One of the three batch APIs the emulator fakes, as the benchmarks and the chaos suite name them (one type for
/// both, so their reports list the same providers in the same order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Provider {
    /// Cloudflare Workers AI (`@cf/...`).
    Cloudflare,
    /// OpenAI Batch (`openai/...`).
    OpenAi,
    /// Anthropic Message Batches (`anthropic/...`).
    Anthropic,
}

impl Provider {
    /// The three, in report order.
    pub const ALL: [Provider; 3] = [Provider::Cloudflare, Provider::OpenAi, Provider::Anthropic];

    /// `cloudflare`, `openai`, `anthropic` (batchd's routing names).
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Cloudflare => "cloudflare",
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        }
    }

    /// Its name for people, in a report.
    pub fn label(self) -> &'static str {
        match self {
            Provider::Cloudflare => "Workers AI",
            Provider::OpenAi => "OpenAI Batch",
            Provider::Anthropic => "Anthropic Message Batches",
        }
    }
}

/// Entry point: starts emulator instances.
#[derive(Debug)]
pub struct Emulator;

impl Emulator {
    /// Binds `addr` (port 0 picks a free port) and serves the emulator until the handle is shut down or dropped.
    pub async fn start(config: EmulatorConfig, addr: SocketAddr) -> std::io::Result<EmulatorHandle> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::new(config));
        let app = server::router(Arc::clone(&state)).into_make_service_with_connect_info::<Connection>();
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serve = axum::serve(ResettableListener::new(listener), app).with_graceful_shutdown(async move {
                // A dropped sender also means stop.
                let _ = shutdown_rx.await;
            });
            if let Err(error) = serve.await {
                tracing::error!(%error, "emulator server failed");
            }
        });
        tracing::info!(%addr, "emulator started");
        let (extra_stop, _) = watch::channel(false);
        Ok(EmulatorHandle {
            addr,
            state,
            shutdown_tx: Some(shutdown_tx),
            task: Some(task),
            extra_stop,
            extra_tasks: Mutex::new(Vec::new()),
        })
    }
}

/// A running emulator: control it in-process, and stop it with [`EmulatorHandle::shutdown`] or by dropping it.
#[derive(Debug)]
pub struct EmulatorHandle {
    /// The address the emulator is bound to.
    addr: SocketAddr,
    /// State shared with the HTTP handlers.
    state: Arc<State>,
    /// Tells the server to stop; `None` once used.
    shutdown_tx: Option<oneshot::Sender<()>>,
    /// The serving task; `None` once awaited.
    task: Option<JoinHandle<()>>,
    /// Tells the servers started by [`EmulatorHandle::listen_also`] to stop.
    extra_stop: watch::Sender<bool>,
    /// The serving tasks of [`EmulatorHandle::listen_also`].
    extra_tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl EmulatorHandle {
    /// The bound address (with the real port when started on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL for a client, like Cloudflare's `https://api.cloudflare.com/client/v4`.
    ///
    /// An unspecified bind address (`0.0.0.0`, `::`) is replaced by loopback.
    pub fn base_url(&self) -> String {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        format!("http://{addr}/client/v4")
    }

    /// Base URL of the OpenAI emulator, like OpenAI's `https://api.openai.com/v1`: `http://ADDR/openai/v1`.
    pub fn openai_base_url(&self) -> String {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        format!("http://{addr}{OPENAI_PREFIX}")
    }

    /// In-process control of the OpenAI emulator: faults, timing, limits, call log.
    pub fn openai(&self) -> OpenAiHandle {
        OpenAiHandle::new(Arc::clone(&self.state.openai))
    }

    /// Base URL of the OpenAI module's mount at `prefix` (`EmulatorConfig::openai_mounts`): `http://ADDR<prefix>`.
    pub fn openai_mount_base_url(&self, prefix: &str) -> String {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        format!("http://{addr}{prefix}")
    }

    /// In-process control of the OpenAI module's mount at `prefix`; `None` when nothing is mounted there.
    pub fn openai_mount(&self, prefix: &str) -> Option<OpenAiHandle> {
        let (_, api) = self.state.openai_mounts.iter().find(|(mounted, _)| mounted == prefix)?;
        Some(OpenAiHandle::new(Arc::clone(api)))
    }

    /// The configured API token.
    pub fn token(&self) -> &str {
        &self.state.config.token
    }

    /// In-process control of the Anthropic Message Batches emulator served under `/anthropic` (base URL, key,
    /// faults, call log, timing).
    pub fn anthropic(&self) -> AnthropicControl {
        AnthropicControl::new(self.addr, Arc::clone(&self.state))
    }

    /// In-process control of the Gemini Batch Mode emulator served under `/gemini` (base URL, key, faults, call
    /// log, timing).
    pub fn gemini(&self) -> GeminiControl {
        GeminiControl::new(self.addr, Arc::clone(&self.state.gemini))
    }

    /// The configured account id.
    pub fn account_id(&self) -> &str {
        &self.state.config.account_id
    }

    /// Queues a fault (see [`Fault`]); call-level faults are used FIFO by matching calls.
    pub fn inject(&self, fault: Fault) {
        self.state.inject(fault);
    }

    /// Faults not used up yet, call-level first.
    pub fn pending_faults(&self) -> Vec<Fault> {
        self.state.pending_faults()
    }

    /// Every API call since start or the last reset, oldest first.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.state.calls()
    }

    /// The calls of kind [`CallKind::Submit`] (accepted submits, and submits answered by a call-level fault).
    pub fn submits(&self) -> Vec<CallRecord> {
        self.calls().into_iter().filter(|call| call.kind == CallKind::Submit).collect()
    }

    /// The calls of kind [`CallKind::Poll`].
    pub fn polls(&self) -> Vec<CallRecord> {
        self.calls().into_iter().filter(|call| call.kind == CallKind::Poll).collect()
    }

    /// Number of batches accepted since start (resets do not forget batches, and batches that
    /// [`EmulatorHandle::set_retention`] forgot still count).
    pub fn batch_count(&self) -> usize {
        self.state.batch_count()
    }

    /// Number of batches stored now: accepted ones minus those the retention forgot.
    pub fn stored_batch_count(&self) -> usize {
        self.state.stored_batch_count()
    }

    /// Number of calls answered HTTP 429 by the rate limit since start or the last reset (injected 429
    /// faults do not count).
    pub fn rate_limited_count(&self) -> u64 {
        self.state.rate_limited_count()
    }

    /// Changes the body cap (bodies of `max_body_bytes` or more get 413, code 3006) and the item cap (submits
    /// with more than `max_items` items get 413, code 3006; `None`: no cap).
    pub fn set_limits(&self, max_body_bytes: usize, max_items: Option<usize>) {
        self.state.update_limits(|limits| {
            limits.max_body_bytes = max_body_bytes;
            limits.max_items = max_items;
        });
    }

    /// Changes the per-(account, model) rate limit (`None`: unlimited); the windows start empty.
    pub fn set_rate_limit(&self, rate_limit: Option<RateLimit>) {
        self.state.update_limits(|limits| limits.rate_limit = rate_limit);
    }

    /// Sets the creation and request limits of all three providers to a preset: [`ProviderLimits::Documented`]
    /// turns on the documented ones (OpenAI's batch creates, Anthropic's requests, Workers AI's submits),
    /// [`ProviderLimits::Off`] turns them off. A changed limit starts with a full window (or bucket).
    pub fn set_provider_limits(&self, preset: ProviderLimits) {
        self.state.set_provider_limits(preset);
    }

    /// Whether polls count against the rate limit too (by default only submits do).
    pub fn set_limit_polls(&self, limit_polls: bool) {
        self.state.update_limits(|limits| limits.limit_polls = limit_polls);
    }

    /// Changes how long a finished batch can still be polled (`None`: forever); later polls get 404, code
    /// 7000, and the batch is forgotten. Applies to existing batches too.
    pub fn set_retention(&self, retention: Option<Duration>) {
        self.state.update_limits(|limits| limits.retention = retention);
    }

    /// Turns the whole-submit schema check on or off (see [`EmulatorConfig::strict_items`]) for submits from
    /// now on.
    pub fn set_strict_items(&self, strict_items: bool) {
        self.state.set_strict_items(strict_items);
    }

    /// Replaces the models whose queued submits are refused with 8007 (see
    /// [`EmulatorConfig::unbatchable_models`]); an empty list refuses none.
    pub fn set_unbatchable_models<I, S>(&self, models: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.state.set_unbatchable_models(models.into_iter().map(Into::into).collect());
    }

    /// Changes how long batches stay queued and running; applies to existing batches too.
    pub fn set_timing(&self, queued_for: Duration, running_for: Duration) {
        self.state.set_timing(Timing { queued_for, running_for });
    }

    /// Serves the same emulator (same batches, faults and call log) on one more address, until the handle is
    /// shut down or dropped; returns the bound address. Giving each client its own port makes the call log's
    /// [`CallRecord::port`] say which client made each call (e.g. which daemon process submitted a batch).
    pub async fn listen_also(&self, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let app = server::router(Arc::clone(&self.state)).into_make_service_with_connect_info::<Connection>();
        let mut stop = self.extra_stop.subscribe();
        let task = tokio::spawn(async move {
            let serve = axum::serve(ResettableListener::new(listener), app).with_graceful_shutdown(async move {
                // A dropped sender also means stop.
                let _ = stop.wait_for(|stopped| *stopped).await;
            });
            if let Err(error) = serve.await {
                tracing::error!(%error, "emulator server failed");
            }
        });
        self.extra_tasks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(task);
        tracing::info!(%addr, "emulator also listening");
        Ok(addr)
    }

    /// Base URL of an address returned by [`EmulatorHandle::listen_also`] (or any address of this emulator).
    pub fn base_url_of(addr: SocketAddr) -> String {
        let mut addr = addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        format!("http://{addr}/client/v4")
    }

    /// Turns per-batch random durations on (or off with `None`) for batches submitted from now on; batches
    /// already submitted keep their timing.
    pub fn set_random_durations(&self, range: Option<DurationRange>) {
        self.state.set_random_durations(range);
    }

    /// Turns random reply latency on (or off with `None`) for calls from now on.
    pub fn set_random_latency(&self, latency: Option<DurationRange>) {
        self.state.set_random_latency(latency);
    }

    /// Turns random transient faults on (or off with `None`) for calls from now on.
    pub fn set_random_faults(&self, faults: Option<RandomFaults>) {
        self.state.set_random_faults(faults);
    }

    /// Turns events on with these settings, or off with `None` (see [`EventsConfig`]). Events due under the old
    /// settings are published first; when events come on, batches already done get no event, pending ones will.
    /// Messages already queued stay (while events are off the queue endpoints answer 404).
    pub fn set_events(&self, events: Option<EventsConfig>) {
        self.state.set_events(events);
    }

    /// The events settings; `None`: events off.
    pub fn events(&self) -> Option<EventsConfig> {
        self.state.events()
    }

    /// Replaces the event faults (see [`EventFaults`]) for events published from now on.
    pub fn set_event_faults(&self, faults: EventFaults) {
        self.state.set_event_faults(faults);
    }

    /// Changes how strict-mode refusals are worded (see [`RefusalForm`]), for submits from now on.
    pub fn set_strict_refusal(&self, form: RefusalForm) {
        self.state.set_strict_refusal(form);
    }

    /// The account's event subscriptions, in creation order.
    pub fn subscriptions(&self) -> Vec<Subscription> {
        self.state.with_subscriptions(|subs| subs.list(None))
    }

    /// Subscribes `model`'s `batch.succeeded` and `batch.failed` events to the events queue, as `batchd events
    /// setup` would (events must be on).
    pub fn subscribe(&self, model: &str) {
        let queue_id = self.state.events().map(|events| events.queue_id).unwrap_or_default();
        let events = vec!["batch.succeeded".to_owned(), "batch.failed".to_owned()];
        let created = self
            .state
            .with_subscriptions(|subs| subs.create(format!("test {model}"), model.to_owned(), queue_id, true, events));
        if let Err(error) = created {
            tracing::debug!(%error, "subscribe: already subscribed");
        }
    }

    /// Pages of the model catalog served since start.
    pub fn catalog_calls(&self) -> u64 {
        self.state.catalog_calls()
    }

    /// The event faults in force (`drop_next` counts down as events are dropped).
    pub fn event_faults(&self) -> EventFaults {
        self.state.event_faults()
    }

    /// URL of the events queue, `{base_url}/accounts/{account_id}/queues/{queue_id}` (append `/messages/pull` or
    /// `/messages/ack`); `None` while events are off.
    pub fn queue_url(&self) -> Option<String> {
        let events = self.state.events()?;
        Some(format!("{}/accounts/{}/queues/{}", self.base_url(), self.account_id(), events.queue_id))
    }

    /// The token the queue endpoints accept: [`EventsConfig::queue_token`] when set, else the API token.
    pub fn queue_token(&self) -> String {
        self.state.events().and_then(|events| events.queue_token).unwrap_or_else(|| self.state.config.token.clone())
    }

    /// Counts of the events queue: events published by type, faults applied, messages by state, acks, retries.
    /// Publishes the events due first, like a pull.
    pub fn queue_stats(&self) -> QueueStats {
        self.state.queue_stats()
    }

    /// Every pull and ack since start or the last reset, oldest first (a log of its own: [`EmulatorHandle::calls`]
    /// never contains them).
    pub fn queue_calls(&self) -> Vec<QueueCallRecord> {
        self.state.queue_calls()
    }

    /// The queue calls of kind [`QueueCallKind::Pull`].
    pub fn pulls(&self) -> Vec<QueueCallRecord> {
        self.queue_calls().into_iter().filter(|call| call.kind == QueueCallKind::Pull).collect()
    }

    /// The queue calls of kind [`QueueCallKind::Ack`].
    pub fn acks(&self) -> Vec<QueueCallRecord> {
        self.queue_calls().into_iter().filter(|call| call.kind == QueueCallKind::Ack).collect()
    }

    /// Drops every message of the events queue (counters stay).
    pub fn purge_queue(&self) {
        self.state.purge_queue();
    }

    /// Clears pending faults, the call logs (API and queue), the rate-limit windows (the pull rate limit's too) and
    /// [`EmulatorHandle::rate_limited_count`]; batches, timing, limits, the events queue, its settings, faults and
    /// counters stay.
    pub fn reset(&self) {
        self.state.reset();
    }

    /// Lets held replies go, stops accepting connections and waits (at most a few seconds) for open ones to finish.
    pub async fn shutdown(mut self) {
        // Held replies would keep their connections open through the whole grace period.
        self.state.openai.holds.release();
        for (_, mount) in &self.state.openai_mounts {
            mount.holds.release();
        }
        self.state.anthropic.holds.release();
        self.state.gemini.holds.release();
        if let Some(shutdown_tx) = self.shutdown_tx.take() {
            let _ = shutdown_tx.send(());
        }
        self.extra_stop.send_replace(true);
        let extra: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.extra_tasks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        for mut task in extra {
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await.is_err() {
                task.abort();
            }
        }
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await.is_err()
        {
            tracing::warn!("emulator connections still open after the grace period; dropping them");
            task.abort();
        }
        tracing::info!(addr = %self.addr, "emulator stopped");
    }
}

impl Drop for EmulatorHandle {
    fn drop(&mut self) {
        if let Some(shutdown_tx) = self.shutdown_tx.take() {
            let _ = shutdown_tx.send(());
        }
        if let Some(task) = self.task.take() {
            // Dropped without `shutdown`: nobody waits, so stop at once.
            task.abort();
        }
        self.extra_stop.send_replace(true);
        for task in self.extra_tasks.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner()).drain(..) {
            task.abort();
        }
    }
}
