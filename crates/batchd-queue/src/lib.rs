//! batchd's durable storage on Redis: the only crate that sends Redis commands to batchd's keys (the daemon's
//! runtime, the CLI, the dashboard and the producer library all go through it).
//!
//! - [`Store`]: the job ledger, the schedule and result publishing, each transition one Lua script.
//! - [`ingress`]: the submit stream as the ingress fetcher reads it (group reads, reclaims, delivery counts).
//! - [`inspect`]: read-only looks for operators and producers (depths, ledgers, consumers, entries, counters).
//! - [`failed`]: the jobs that finished without completing, grouped by error code and model.
//! - [`ledger_view`]: one typed, bounded view of a job's ledger for every reader outside the daemon.
//! - [`functions`]: the Redis Functions operators and producers call by name (`FCALL`): cancel, dead-letter retry.
//! - [`provider_cache`]: a provider account's model catalog and seen models, shared by the replicas.
//! - [`results`]: following a results stream, and a results reader's consumer-group commands.
//! - [`connection`] and [`clock`]: one connection type for every deployment, and Redis's clock.
//!
//! Nothing here knows the Batch API or runs workers: the fetchers and the apalis backend are the daemon's
//! (`crates/batchd-engine/src/runtime/`).

pub mod clock;
pub mod connection;
pub mod failed;
pub mod functions;
pub mod ingress;
pub mod inspect;
pub mod ledger_view;
pub mod provider_cache;
pub mod rerun;
pub mod results;
pub mod store;
pub mod turnaround;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use batchd_core::{Backoff, UnixMillis};

pub use clock::RedisClock;
pub use connection::{Conn, Endpoint, RedisSettings, Topology};
pub use ingress::SubmitEntry;
pub use ledger_view::LedgerView;
pub use store::{
    Accepted, AddOutcome, ChunkPlan, ChunkRecord, ChunkView, Claim, Claimed, DeadLetter, Delivery, Fenced, Intake,
    MAX_CHUNKS_PER_JOB, MAX_PACK_STEP, NewChunk, PackBounds, PackFormed, PackIntake, PackMember, Placement,
    PublishContext, Rejection, Store, StoreSettings, SubmitRetryRecord, SubmitTicket, TOO_MANY_DELIVERIES, Transition,
    Undeliverable,
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
    /// A fenced write was refused: the caller's claim of the chunk was taken over by a later claim (another
    /// replica's, after this one's lease ended), or the chunk is no longer in a state the write starts from.
    /// Nothing was written; the caller drops its step (the chunk's current holder carries on).
    #[error("claim of chunk {chunk} of job {job_id} is stale: {detail}")]
    StaleClaim {
        /// The job of the chunk.
        job_id: String,
        /// The chunk's index.
        chunk: u32,
        /// What the script found.
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
/// their own connections ([`Endpoint::dedicated`]).
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
pub struct RetryDelay(Backoff);

impl Default for RetryDelay {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryDelay {
    /// 100 ms, doubling to 5 s.
    pub fn new() -> Self {
        Self(Backoff::new(Duration::from_millis(100), Duration::from_secs(5)))
    }

    /// The delay to wait now; the next one is twice as long.
    pub fn failed(&mut self) -> Duration {
        self.0.failed()
    }

    /// Back to the first delay.
    pub fn succeeded(&mut self) {
        self.0.succeeded();
    }
}
