//! batchd's durable storage on Redis, and the apalis backends that feed the daemon's workers from it.
//!
//! - [`Store`]: the job ledger, the schedule and result publishing, each transition one Lua script.
//! - [`inspect`]: read-only looks for operators and producers (depths, ledgers, consumers, entries, counters).
//! - [`results`]: following a results stream, and a results reader's consumer-group commands.
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
pub mod inspect;
pub mod results;
pub mod schedule;
pub mod store;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use batchd_core::{Backoff, UnixMillis};

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

/// The backoff for retrying Redis operations inside the fetchers: 100 ms doubling to 5 s.
#[derive(Debug, Clone)]
pub(crate) struct RetryDelay(Backoff);

impl RetryDelay {
    pub(crate) fn new() -> Self {
        Self(Backoff::new(Duration::from_millis(100), Duration::from_secs(5)))
    }

    /// The delay to wait now; the next one is twice as long.
    pub(crate) fn failed(&mut self) -> Duration {
        self.0.failed()
    }

    pub(crate) fn succeeded(&mut self) {
        self.0.succeeded();
    }
}
