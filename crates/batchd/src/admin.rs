//! The admin side of the daemon: the health state, the admin HTTP server (`/livez`, `/readyz`, `/metrics`), the
//! Redis sampler that feeds readiness and the queue-depth gauges, and systemd notifications (`sd_notify`).
//!
//! Liveness says only that the process and its workers are alive, so a Redis outage never gets a replica killed
//! (it recovers by itself); readiness adds "Redis answered the last sample". The sampler reads Redis by the
//! documented key layout (docs/wire-format.md), like the CLI does, with bounded commands only (`XLEN`,
//! `XPENDING` summary, `ZCARD`, `ZCOUNT`, `XRANGE .. COUNT 1`, `ZRANGE 0 0`, and `GET` of the pause flag), so its
//! cost never grows with the backlog.
//!
//! A namespace whose intake is paused (`batchd pause`, the key `{ns}:paused`) leaves the replica live and ready: it
//! still finishes its work and is healthy, so `/readyz` stays 200 and its text says `paused` (and who paused it).
//!
//! The admin server serves its HTTP/1 connections itself (hyper, not `axum::serve`) so that a slow or hostile client
//! cannot hold it: each request's headers must arrive within [`HEADER_READ_TIMEOUT`], a connection on which no byte
//! moves for [`IDLE_TIMEOUT`] is closed, and at most [`MAX_CONNECTIONS`] are served at once (further ones wait in
//! the listen backlog, using no descriptor of the process, until one closes).

use crate::runtime::heartbeat::Heartbeat;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use batchd_core::Keys;
use batchd_queue::Conn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use crate::metrics;

/// Where the workers are in their life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// Wiring up; workers not running yet.
    Starting = 0,
    /// Workers running.
    Running = 1,
    /// A stop was requested; work in flight is finishing.
    Draining = 2,
    /// A worker ended before a stop was requested; the process is about to exit non-zero.
    Failed = 3,
}

/// What `/livez` and `/readyz` answer from, shared by the daemon, the sampler and the admin server.
#[derive(Debug)]
pub struct Health {
    /// The workers' [`Phase`], as its `u8`.
    phase: AtomicU8,
    /// Result of the last Redis sample: `None` before the first one, `Some(Err(reason))` when it failed.
    redis: Mutex<Option<Result<(), String>>>,
    /// Namespaces whose intake the last sample found paused, each as a line of `/readyz` detail.
    paused: Mutex<Vec<String>>,
    /// The fetch loops' heartbeats, by name (`ingress:<ns>`, `schedule:<ns>`), and how long one may stay silent.
    loops: Mutex<WatchedLoops>,
}

/// The watched fetch loops (name and heartbeat) and the longest silence allowed.
type WatchedLoops = (Vec<(String, Arc<Heartbeat>)>, Duration);

impl Default for Health {
    fn default() -> Self {
        Self {
            phase: AtomicU8::new(Phase::Starting as u8),
            redis: Mutex::new(None),
            paused: Mutex::new(Vec::new()),
            loops: Mutex::new((Vec::new(), Duration::MAX)),
        }
    }
}

impl Health {
    fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Starting,
            1 => Phase::Running,
            2 => Phase::Draining,
            _ => Phase::Failed,
        }
    }

    fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// The workers are running.
    pub fn workers_running(&self) {
        self.set_phase(Phase::Running);
    }

    /// A stop was requested: not ready any more, still alive while draining.
    pub fn draining(&self) {
        self.set_phase(Phase::Draining);
    }

    /// A worker ended on its own: neither alive nor ready.
    pub fn worker_failed(&self) {
        self.set_phase(Phase::Failed);
    }

    /// Records the outcome of a Redis sample; returns whether reachability changed (for logging).
    pub fn set_redis(&self, outcome: Result<(), String>) -> bool {
        let mut redis = self.redis.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let changed = redis.as_ref().map(Result::is_ok) != Some(outcome.is_ok());
        *redis = Some(outcome);
        changed
    }

    /// Records which namespaces the last sample found paused (one detail each, see [`pause_detail`]); returns
    /// whether that changed (for logging).
    pub fn set_paused(&self, paused: Vec<String>) -> bool {
        let mut current = self.paused.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let changed = *current != paused;
        *current = paused;
        changed
    }

    /// What `/readyz` answers with 200: `ok`, followed by the paused namespaces, if any.
    pub fn ready_text(&self) -> String {
        let paused = self.paused.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if paused.is_empty() { "ok".to_owned() } else { format!("ok; {}", paused.join("; ")) }
    }

    /// `Ok` while the process and its workers are alive (also while draining); no dependency is checked.
    pub fn liveness(&self) -> Result<(), String> {
        match self.phase() {
            Phase::Failed => Err("a worker stopped; the process is exiting".to_owned()),
            Phase::Running => self.loops_progress(),
            Phase::Starting | Phase::Draining => Ok(()),
        }
    }

    /// Watches a fetch loop: liveness fails once it has not stamped its heartbeat for `stall` (the same bound
    /// for every loop, `admin.stall_secs`).
    pub fn watch(&self, name: String, heartbeat: Arc<Heartbeat>, stall: Duration) {
        let mut loops = self.loops.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        loops.0.push((name, heartbeat));
        loops.1 = stall;
    }

    /// `Err` naming the first fetch loop silent for longer than the bound.
    fn loops_progress(&self) -> Result<(), String> {
        let loops = self.loops.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (watched, stall) = &*loops;
        match watched.iter().find(|(_, heartbeat)| heartbeat.silent_for() > *stall) {
            Some((name, heartbeat)) => Err(format!(
                "the {name} fetch loop made no progress for {}s (admin.stall_secs is {}s)",
                heartbeat.silent_for().as_secs(),
                stall.as_secs()
            )),
            None => Ok(()),
        }
    }

    /// `Ok` when the workers run and the last sample reached Redis; otherwise the reason.
    pub fn readiness(&self) -> Result<(), String> {
        match self.phase() {
            Phase::Starting => return Err("starting: workers not running yet".to_owned()),
            Phase::Draining => return Err("shutting down: finishing work in flight".to_owned()),
            Phase::Failed => return Err("a worker stopped; the process is exiting".to_owned()),
            Phase::Running => {}
        }
        match &*self.redis.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) {
            None => Err("redis not checked yet".to_owned()),
            Some(Err(reason)) => Err(reason.clone()),
            Some(Ok(())) => Ok(()),
        }
    }
}

/// State of the admin server's handlers.
#[derive(Debug, Clone)]
struct AdminState {
    /// The daemon's health.
    health: Arc<Health>,
    /// Renders the Prometheus text.
    metrics: PrometheusHandle,
}

/// The admin routes: `/livez`, `/readyz`, `/metrics`.
pub fn router(health: Arc<Health>, metrics: PrometheusHandle) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { health, metrics })
}

/// Binds the admin listener (port 0 picks a free port; the bound address is logged by [`serve`]).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Longest time a client may take to send a request's headers, counted from when the server starts waiting for
/// them: from the connection's start, or from the end of the previous response on a kept-alive connection (so an
/// idle keep-alive connection is closed after this long too). Probes and scrapers send theirs in one packet.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest time a connection may go without a byte moving either way (e.g. a client that stops reading its
/// response) before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Most connections served at once. Further ones are not accepted until one closes: they wait in the kernel's listen
/// backlog (no descriptor of the process) and are served in arrival order.
pub const MAX_CONNECTIONS: usize = 128;

/// Largest request head (request line and headers) read; a larger one is answered `431` and the connection closed.
/// With [`MAX_CONNECTIONS`] it bounds what clients can make the admin server buffer (about 2 MiB).
pub const MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;

/// Serves the admin routes on `listener` until `stop` is cancelled, within the limits above; then stops accepting,
/// lets requests in flight finish (idle connections close at once) and returns once every connection is closed.
pub async fn serve(listener: TcpListener, router: Router, stop: CancellationToken) -> std::io::Result<()> {
    serve_limited(listener, router, stop, "admin server listening (/livez, /readyz, /metrics)").await
}

/// Serves `router` on `listener` with the admin server's limits (header-read and idle timeouts, a connection cap,
/// a bounded request head) until `stop` is cancelled; logs `what` with the bound address first. The dashboard
/// (`batchd ui`) is served the same way.
pub async fn serve_limited(
    listener: TcpListener,
    router: Router,
    stop: CancellationToken,
    what: &str,
) -> std::io::Result<()> {
    tracing::info!(addr = %listener.local_addr()?, "{what}");
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT).max_buf_size(MAX_REQUEST_HEAD_BYTES);
    loop {
        // A slot first, then the accept: past the cap, connections wait in the backlog, not in the process.
        let slot = tokio::select! {
            () = stop.cancelled() => break,
            slot = Arc::clone(&slots).acquire_owned() => slot.map_err(std::io::Error::other)?,
        };
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, or a connection reset before it was accepted: neither ends the server.
                    tracing::warn!(error = %error, "admin server cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let io = TokioIo::new(IdleTimeout::new(stream, IDLE_TIMEOUT));
        let connection = http.serve_connection(io, TowerToHyperService::new(router.clone()));
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut connection = std::pin::pin!(connection);
            let outcome = tokio::select! {
                outcome = connection.as_mut() => outcome,
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = outcome {
                tracing::debug!(peer = %peer, error = %error, "admin connection closed");
            }
        });
    }
    drop(listener);
    // Every slot back means every connection is closed.
    let _all = slots.acquire_many(MAX_CONNECTIONS as u32).await.map_err(std::io::Error::other)?;
    Ok(())
}

/// A connection's stream that fails with `TimedOut` once no byte has moved either way for `idle`.
#[derive(Debug)]
struct IdleTimeout<S> {
    /// The stream.
    stream: S,
    /// How long the stream may go without a byte moving.
    idle: Duration,
    /// When it times out, unless a byte moves first.
    deadline: Pin<Box<Sleep>>,
}

impl<S> IdleTimeout<S> {
    fn new(stream: S, idle: Duration) -> Self {
        Self { stream, idle, deadline: Box::pin(tokio::time::sleep(idle)) }
    }

    /// After an operation on the stream: pushes the deadline back on progress; on `Pending`, fails once it passed.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<std::io::Result<T>>,
        moved: bool,
    ) -> Poll<std::io::Result<T>> {
        match poll {
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::ErrorKind::TimedOut.into())),
                Poll::Pending => Poll::Pending,
            },
            ready => {
                if moved {
                    self.deadline.as_mut().reset(Instant::now() + self.idle);
                }
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.stream).poll_read(cx, buf);
        let moved = buf.filled().len() > before;
        self.check(cx, poll, moved)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write(cx, data);
        let moved = matches!(poll, Poll::Ready(Ok(n)) if n > 0);
        self.check(cx, poll, moved)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write_vectored(cx, data);
        let moved = matches!(poll, Poll::Ready(Ok(n)) if n > 0);
        self.check(cx, poll, moved)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_flush(cx);
        self.check(cx, poll, false)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.check(cx, poll, false)
    }
}

async fn livez(State(state): State<AdminState>) -> Response {
    plain(state.health.liveness())
}

async fn readyz(State(state): State<AdminState>) -> Response {
    match state.health.readiness() {
        Ok(()) => (StatusCode::OK, format!("{}\n", state.health.ready_text())).into_response(),
        Err(reason) => plain(Err(reason)),
    }
}

async fn metrics_text(State(state): State<AdminState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render()).into_response()
}

/// `200 ok`, or `503` with the reason as plain text.
fn plain(outcome: Result<(), String>) -> Response {
    match outcome {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

/// Queue depths read from Redis in one sample.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueSample {
    /// Entries in the submit stream (not yet taken in: unread plus in flight).
    pub submit_entries: u64,
    /// Of those, entries read by a replica and not yet acknowledged (`XPENDING` of the group).
    pub submit_in_flight: u64,
    /// Steps in the schedule (polls and submit retries).
    pub scheduled: u64,
    /// Of those, steps whose due time has passed.
    pub due: u64,
    /// Entries in the dead-letter stream.
    pub dead: u64,
    /// Id of the first entry of the submit stream (the oldest waiting one), if any.
    pub oldest_entry_id: Option<String>,
    /// Due time (Unix ms) of the first step of the schedule, if any.
    pub earliest_due_ms: Option<u64>,
}

impl QueueSample {
    /// Reads one sample through the storage's [`batchd_queue::inspect::depths`]; every command is bounded,
    /// whatever the backlog.
    pub async fn read(conn: &mut Conn, keys: &Keys, now_ms: u64) -> Result<Self, batchd_queue::StoreError> {
        let depths = batchd_queue::inspect::depths(conn, keys, now_ms).await?;
        Ok(Self {
            submit_entries: depths.submit_entries,
            submit_in_flight: depths.submit_in_flight,
            scheduled: depths.scheduled,
            due: depths.due,
            dead: depths.dead,
            oldest_entry_id: depths.oldest_entry_id,
            earliest_due_ms: depths.earliest_due_ms,
        })
    }

    /// Sets the gauges of `namespace` from this sample.
    pub fn record(&self, namespace: &str, now_ms: u64) {
        let depth = |stream, state, depth| metrics::queue_depth(namespace, stream, state, depth);
        depth("submit", "pending", self.submit_entries.saturating_sub(self.submit_in_flight));
        depth("submit", "in_flight", self.submit_in_flight);
        depth("schedule", "scheduled", self.scheduled);
        depth("schedule", "due", self.due);
        depth("dead", "dead", self.dead);
        let age = self.oldest_entry_id.as_deref().map_or(Duration::ZERO, |id| entry_age(id, now_ms));
        metrics::oldest_waiting_job_age(namespace, age);
        metrics::schedule_lag(namespace, self.earliest_due_ms.map_or(Duration::ZERO, |due| lag(due, now_ms)));
    }
}

/// Age of a stream entry from the millisecond part of its id (`<ms>-<seq>`); zero for ids in the future or
/// not of that form (a producer that chose its own ids).
pub fn entry_age(entry_id: &str, now_ms: u64) -> Duration {
    let ms = entry_id.split_once('-').map_or(entry_id, |(ms, _)| ms);
    ms.parse::<u64>().map_or(Duration::ZERO, |ms| Duration::from_millis(now_ms.saturating_sub(ms)))
}

/// How long a step due at `due_ms` has been overdue at `now_ms` (zero if not due yet).
pub fn lag(due_ms: u64, now_ms: u64) -> Duration {
    Duration::from_millis(now_ms.saturating_sub(due_ms))
}

/// The `/readyz` detail of a paused namespace: `intake paused in namespace batchd (paused by ops@host at ...)`,
/// escaped and capped (the flag's value is whatever was written to Redis).
pub fn pause_detail(namespace: &str, flag: &str) -> String {
    let record = crate::cli::pause::PauseRecord::parse(flag);
    format!("intake paused in namespace {namespace} ({})", record.describe())
}

/// The sampler: every `interval`, reads a [`QueueSample`] and the pause flag of each namespace, sets the gauges and
/// records Redis reachability and paused namespaces in `health`; also runs the Prometheus recorder's upkeep. Runs
/// until `stop` is cancelled.
pub async fn run_sampler(
    mut conn: Conn,
    namespaces: Vec<Keys>,
    interval: Duration,
    health: Arc<Health>,
    recorder: PrometheusHandle,
    stop: CancellationToken,
) {
    let timeout = interval.max(Duration::from_secs(2));
    loop {
        let now_ms = batchd_queue::now_ms();
        let mut outcome = Ok(());
        let mut paused = Vec::new();
        for keys in &namespaces {
            let sample = async {
                let sample = QueueSample::read(&mut conn, keys, now_ms).await?;
                Ok::<_, batchd_queue::StoreError>((sample, batchd_queue::inspect::pause_flag(&mut conn, keys).await?))
            };
            match tokio::time::timeout(timeout, sample).await {
                Ok(Ok((sample, flag))) => {
                    sample.record(keys.namespace(), now_ms);
                    paused.extend(flag.map(|flag| pause_detail(keys.namespace(), &flag)));
                }
                Ok(Err(error)) => outcome = Err(format!("redis unreachable: {error}")),
                Err(_) => outcome = Err(format!("redis unreachable: no answer within {timeout:?}")),
            }
            if outcome.is_err() {
                break;
            }
        }
        if outcome.is_ok() && health.set_paused(paused.clone()) {
            if paused.is_empty() {
                tracing::info!("intake running");
            } else {
                tracing::warn!(paused = %paused.join("; "), "intake paused; work in flight goes on");
            }
        }
        metrics::redis_up(outcome.is_ok());
        if let Err(reason) = &outcome {
            metrics::redis_error("sample");
            if health.set_redis(outcome.clone()) {
                tracing::warn!(reason = %reason, "not ready: redis unreachable");
                notify_status(&format!("running; {reason}"));
            }
        } else if health.set_redis(Ok(())) {
            tracing::info!("ready: redis reachable");
            notify_status("running; redis reachable");
        }
        recorder.run_upkeep();
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Tells systemd the daemon is ready (no-op without `$NOTIFY_SOCKET`).
pub fn notify_ready() {
    notify(&[sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status("running")]);
}

/// Tells systemd the daemon is stopping (no-op without `$NOTIFY_SOCKET`).
pub fn notify_stopping() {
    notify(&[sd_notify::NotifyState::Stopping, sd_notify::NotifyState::Status("draining work in flight")]);
}

/// Updates the status line `systemctl status` shows (no-op without `$NOTIFY_SOCKET`).
fn notify_status(status: &str) {
    notify(&[sd_notify::NotifyState::Status(status)]);
}

fn notify(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::warn!(error = %error, "cannot notify systemd");
    }
}

/// The watchdog interval systemd asked for (`$WATCHDOG_USEC`, for this process per `$WATCHDOG_PID`), halved as
/// sd_watchdog_enabled(3) advises; `None` when the watchdog is off.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().filter(|timeout| !timeout.is_zero()).map(|timeout| timeout / 2)
}

/// Sends `WATCHDOG=1` every `interval` while `health` says the process is alive, until `stop` is cancelled. A
/// wedged runtime or a dead worker stops the pings, and systemd restarts the service. Redis being down does not:
/// the daemon rides that out by itself.
pub async fn run_watchdog(interval: Duration, health: Arc<Health>, stop: CancellationToken) {
    tracing::info!(interval = ?interval, "systemd watchdog enabled");
    loop {
        if health.liveness().is_ok() {
            notify(&[sd_notify::NotifyState::Watchdog]);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_age_comes_from_the_id() {
        assert_eq!(entry_age("1000-0", 4500), Duration::from_millis(3500));
        assert_eq!(entry_age("5000-3", 4500), Duration::ZERO, "clock skew: never negative");
        assert_eq!(entry_age("not-an-id", 4500), Duration::ZERO);
        assert_eq!(lag(1000, 1500), Duration::from_millis(500));
        assert_eq!(lag(2000, 1500), Duration::ZERO);
    }

    #[tokio::test]
    #[allow(clippy::unwrap_used)]
    async fn a_connection_times_out_only_after_idle_without_a_byte_moving() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let idle = Duration::from_millis(300);
        let (client, server) = tokio::io::duplex(64);
        let mut server = IdleTimeout::new(server, idle);
        let mut client = client;
        let started = Instant::now();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(idle * 4 / 5).await;
            client.write_all(b"x").await.unwrap();
            client
        });
        let mut byte = [0u8; 1];
        assert_eq!(server.read(&mut byte).await.unwrap(), 1);
        let moved = Instant::now();
        let _client = writer.await.unwrap();
        let error = server.read(&mut byte).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        assert!(moved.elapsed() >= idle, "a byte pushes the deadline back: timed out {:?} after it", moved.elapsed());
        assert!(started.elapsed() >= idle + idle * 4 / 5);
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn readiness_needs_running_workers_and_redis() {
        let health = Health::default();
        assert!(health.liveness().is_ok());
        assert_eq!(health.readiness().unwrap_err(), "starting: workers not running yet");
        health.workers_running();
        assert_eq!(health.readiness().unwrap_err(), "redis not checked yet");
        assert!(health.set_redis(Ok(())));
        assert!(health.readiness().is_ok());
        assert!(!health.set_redis(Ok(())), "unchanged");
        assert!(health.set_redis(Err("redis unreachable: refused".into())));
        assert_eq!(health.readiness().unwrap_err(), "redis unreachable: refused");
        assert!(health.liveness().is_ok(), "redis is not a liveness concern");
        health.draining();
        assert!(health.readiness().unwrap_err().starts_with("shutting down"));
        assert!(health.liveness().is_ok());
        health.worker_failed();
        assert!(health.liveness().is_err());
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_paused_replica_stays_ready_and_says_so() {
        let health = Health::default();
        health.workers_running();
        health.set_redis(Ok(()));
        assert_eq!(health.ready_text(), "ok");
        let detail = pause_detail("batchd", r#"{"by":"ops@host","at":0,"reason":"freeze \u001b[2J"}"#);
        assert_eq!(
            detail,
            "intake paused in namespace batchd (paused by ops@host at 1970-01-01T00:00:00.000Z: freeze \\x1b[2J)"
        );
        assert!(health.set_paused(vec![detail.clone()]));
        assert!(!health.set_paused(vec![detail.clone()]), "unchanged");
        assert!(health.readiness().is_ok(), "paused is ready");
        assert_eq!(health.ready_text(), format!("ok; {detail}"));
        assert!(health.set_paused(Vec::new()));
        assert_eq!(health.ready_text(), "ok");
    }
}
