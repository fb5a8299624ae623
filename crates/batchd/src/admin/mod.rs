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
//! cannot hold it: each request's headers must arrive within [`HEADER_READ_TIMEOUT`] (which also closes an idle
//! keep-alive connection), a connection on which no byte moves for [`IDLE_TIMEOUT`] is closed, a connection serves
//! at most [`MAX_REQUESTS_PER_CONNECTION`] requests for at most [`MAX_CONNECTION_AGE`], and at most
//! [`MAX_CONNECTIONS`] are served at once, [`MAX_CONNECTIONS_PER_PEER`] per peer address; a connection past a cap
//! takes the place of the longest-idle one, so `/livez` is answered while some connection only waits.
//!
//! One file per part: `http.rs` (the routes and the limited HTTP/1 server, which the dashboard reuses),
//! `hosts.rs` (the host names a server answers to, which the dashboard's check shares),
//! `sampler.rs` (the Redis sample and the gauges), `systemd.rs` (`sd_notify` and the watchdog); every item is
//! re-exported here, so callers name it `crate::admin::X`.

mod hosts;
mod http;
mod sampler;
mod systemd;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use batchd_engine::runtime::heartbeat::Heartbeat;

pub use hosts::{HostList, host_name, ip_literal};
pub use http::{
    CLOSE_GRACE, HEADER_READ_TIMEOUT, IDLE_TIMEOUT, MAX_CONNECTION_AGE, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER,
    MAX_REQUEST_HEAD_BYTES, MAX_REQUESTS_PER_CONNECTION, OPEN_PATHS, bind, router, serve, serve_limited,
};
pub use sampler::{QueueSample, entry_age, lag, pause_detail, run_sampler};
pub use systemd::{notify_ready, notify_stopping, run_watchdog, watchdog_interval};

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

#[cfg(test)]
mod tests {
    use super::*;

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
