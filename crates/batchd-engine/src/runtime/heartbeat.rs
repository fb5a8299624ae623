//! Heartbeats of the fetch loops, so liveness means progress: each loop stamps its heartbeat every time it goes
//! round (and while it waits for room in its channel), and the daemon's `/livez` and systemd watchdog pings stop
//! when a loop has not stamped for longer than a bound.
//!
//! Every wait inside a loop is bounded (Redis replies by the connection's response timeout, backoff by 5 s), so a
//! loop that does not stamp for minutes is stuck, not busy. A Redis outage keeps the loops going round (each
//! attempt fails fast or times out), so it never trips the bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

tokio::task_local! {
    /// The heartbeat of the fetch loop running on this task.
    static CURRENT: Arc<Heartbeat>;
}

/// One loop's heartbeat.
#[derive(Debug)]
pub struct Heartbeat {
    /// The monotonic origin of `last_ms`.
    origin: Instant,
    /// Milliseconds after `origin` of the last stamp.
    last_ms: AtomicU64,
}

impl Heartbeat {
    /// A heartbeat stamped now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self { origin: Instant::now(), last_ms: AtomicU64::new(0) })
    }

    /// Records progress now.
    pub fn stamp(&self) {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(now, Ordering::Relaxed);
    }

    /// How long ago the loop last stamped.
    pub fn silent_for(&self) -> Duration {
        self.origin.elapsed().saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }

    /// Runs `future` (a fetch loop) with this heartbeat as the one [`beat`] stamps.
    pub(crate) async fn scope<F: std::future::Future>(self: Arc<Self>, future: F) -> F::Output {
        CURRENT.scope(self, future).await
    }
}

/// Stamps the heartbeat of the fetch loop this task runs, if any.
pub(crate) fn beat() {
    let _ = CURRENT.try_with(|heartbeat| heartbeat.stamp());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the stamp itself rather than bounding `silent_for` from above, which a stalled thread could exceed.
    #[tokio::test]
    async fn a_loop_that_beats_stays_fresh_and_one_that_stops_goes_silent() {
        let heartbeat = Heartbeat::new();
        std::thread::sleep(Duration::from_millis(30));
        Arc::clone(&heartbeat).scope(async { beat() }).await;
        let stamped = heartbeat.last_ms.load(Ordering::Relaxed);
        assert!(stamped >= 30, "the beat inside the scope stamped: {stamped} ms after the start");
        std::thread::sleep(Duration::from_millis(30));
        beat(); // outside the scope: stamps nothing
        assert_eq!(heartbeat.last_ms.load(Ordering::Relaxed), stamped, "a beat outside the scope stamped");
        assert!(heartbeat.silent_for() >= Duration::from_millis(30));
    }
}
