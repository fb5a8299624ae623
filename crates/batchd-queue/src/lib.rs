//! batchd's durable storage on Redis, and the apalis backends that feed the daemon's workers from it.
//!
//! - [`Store`]: the job ledger, the schedule and result publishing, each transition one Lua script.
//! - [`fetch`]: the apalis `Backend` both workers read from, fed by a fetcher task that reads Redis in bounded
//!   batches, never gives up on a Redis error, and hands unstarted work back at shutdown.
//! - [`ingress`] and [`schedule`]: the two fetchers (the ingress stream's consumer group, and the schedule's due
//!   members).
//! - [`ByteBudget`]: the bytes of work in flight one process may hold; the ingress fetcher holds room for what it
//!   reads before it reads it.
//!
//! Nothing here knows the Batch API; the daemon wires storage and API together.

pub mod clock;
pub mod connection;
pub mod fetch;
pub mod heartbeat;
pub mod ingress;
pub mod schedule;
pub mod store;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use batchd_core::UnixMillis;

pub use clock::RedisClock;
pub use connection::{Conn, Endpoint, RedisSettings, Topology};
pub use fetch::{BudgetHold, ByteBudget, FetchBackend};
pub use ingress::{DeliveryLimit, EntryBudget, IngressEntry, IngressSettings};
pub use schedule::ScheduleSettings;
pub use store::{
    Accepted, AddOutcome, ChunkPlan, ChunkRecord, ChunkView, DeadLetter, Intake, MAX_CHUNKS_PER_JOB, NewChunk,
    Placement, PublishContext, Rejection, Store, StoreSettings, SubmitTicket, TOO_MANY_DELIVERIES, Undeliverable,
};

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis could not be reached or answered with an error; the operation may be retried.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A ledger holds a value batchd did not write; the job cannot be processed.
    #[error("ledger of job {job_id} is corrupt: {detail}")]
    Corrupt {
        /// The job whose ledger is affected.
        job_id: String,
        /// What was wrong.
        detail: String,
    },
}

/// This machine's wall clock in Unix milliseconds, for what only people read (ages in CLI output). Never for
/// leases, due times or deadlines: those are Redis's time, [`Store::now`].
pub fn now_ms() -> UnixMillis {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as UnixMillis).unwrap_or(0)
}

/// Opens a shared, auto-reconnecting connection to one standalone server (a shortcut for tools and tests; the
/// daemon goes through [`Endpoint`], which also speaks Cluster and Sentinel).
///
/// The response timeout is generous because a script can carry a whole job (tens of MB); blocking reads use
/// their own connections (see [`ingress`]).
pub fn connect(client: redis::Client, response_timeout: Duration) -> Result<Conn, StoreError> {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(response_timeout))
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(2));
    Ok(Conn::Managed(redis::aio::ConnectionManager::new_lazy_with_config(client, config)?))
}

/// Exponential backoff for retrying Redis operations inside the fetchers: 100 ms doubling to 5 s.
#[derive(Debug, Clone)]
pub(crate) struct RetryDelay {
    /// The delay to wait after the next failure.
    next: Duration,
}

impl RetryDelay {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    pub(crate) fn new() -> Self {
        Self { next: Self::FIRST }
    }

    /// The delay to wait now, doubling the next one.
    pub(crate) fn failed(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }

    pub(crate) fn succeeded(&mut self) {
        self.next = Self::FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_doubles_to_a_cap_and_resets() {
        let mut delay = RetryDelay::new();
        let seen: Vec<u64> = (0..8).map(|_| delay.failed().as_millis() as u64).collect();
        assert_eq!(seen, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        delay.succeeded();
        assert_eq!(delay.failed(), Duration::from_millis(100));
    }
}
