//! Redis's clock, for every time that orders work between replicas: leases, due times, deadlines.
//!
//! A replica's wall clock is an opinion: after a broken NTP sync or a VM resumed from a snapshot it can be minutes
//! off, and a replica that reads a lease with a clock 5 minutes ahead takes a chunk whose submit is still in flight
//! and submits it again (billed twice). So every such time is Redis's `TIME`, read once in a while and carried
//! forward on this process's monotonic clock (which never jumps), never the local wall clock. One `TIME` per
//! [`RESYNC`] per namespace is the whole cost.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use batchd_core::UnixMillis;

use crate::{Conn, StoreError};

/// How long a reading of Redis's clock is carried forward before it is read again. Drift between two machines'
/// monotonic clocks is parts per million, so over this long it stays well under a millisecond.
pub const RESYNC: Duration = Duration::from_secs(5);

/// One reading of Redis's clock, and when (on the monotonic clock) it was taken.
#[derive(Debug, Clone, Copy)]
struct Reading {
    /// Redis's time, Unix milliseconds.
    redis_ms: UnixMillis,
    /// The monotonic instant it stands for (the middle of the round trip that read it).
    at: Instant,
}

impl Reading {
    fn now(&self) -> UnixMillis {
        self.redis_ms + u64::try_from(self.at.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Redis's clock as this process sees it. Shared by the clones of a `Store`.
#[derive(Debug, Default)]
pub struct RedisClock {
    /// The last reading; `None` until Redis answered once.
    reading: Mutex<Option<Reading>>,
}

impl RedisClock {
    /// A clock that reads Redis at its first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// Redis's current time in Unix milliseconds: the last reading carried forward, read again with `TIME` when
    /// it is older than [`RESYNC`]. If Redis cannot be reached, an older reading carried forward is still right
    /// (the monotonic clock does not jump); only a clock that never reached Redis fails.
    pub async fn now(&self, conn: &Conn) -> Result<UnixMillis, StoreError> {
        let last = *self.reading.lock().expect("clock lock");
        if let Some(reading) = last.filter(|reading| reading.at.elapsed() < RESYNC) {
            return Ok(reading.now());
        }
        let sent = Instant::now();
        let time: Result<(u64, u64), redis::RedisError> = redis::cmd("TIME").query_async(&mut conn.clone()).await;
        match time {
            Ok((seconds, micros)) => {
                let reading = Reading { redis_ms: seconds * 1000 + micros / 1000, at: sent + sent.elapsed() / 2 };
                *self.reading.lock().expect("clock lock") = Some(reading);
                Ok(reading.now())
            }
            Err(error) => match last {
                Some(reading) => {
                    tracing::debug!(error = %error, "cannot read Redis's clock; carrying the last reading forward");
                    Ok(reading.now())
                }
                None => Err(error.into()),
            },
        }
    }

    /// The last reading carried forward, without asking Redis; `None` before the first reading. For decisions that
    /// only shape this process's own timing (when to wake its fetcher).
    pub fn carried(&self) -> Option<UnixMillis> {
        self.reading.lock().expect("clock lock").map(|reading| reading.now())
    }
}
