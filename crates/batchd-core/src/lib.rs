//! The vocabulary every other batchd crate shares: identifiers, the job and result wire format (v1),
//! validation, ledger states and Redis key names.
//!
//! This crate does no I/O. Everything another service can see (the job it enqueues, the result entry it reads,
//! the keys in Redis) is defined here once and pinned by golden tests, so the daemon, the CLI and the tests
//! cannot disagree about it.

pub mod backoff;
pub mod ids;
pub mod job;
pub mod keys;
pub mod ledger;
pub mod pricing;
pub mod redact;
pub mod reference;
pub mod result;
pub mod stats;
pub mod turnaround;

pub use backoff::Backoff;
pub use ids::{ChunkRef, JobId, ModelName, RequestId, is_provider_name};
pub use job::{DecodeError, Job, JobLimits};
pub use keys::Keys;
pub use ledger::{ChunkState, JobState};
pub use redact::redact_url;
pub use result::{ApiCode, FailedBatch, ItemResponse, JobError, JobOutput, ResultEntry, ResultStatus};

/// Milliseconds since the Unix epoch, the one timestamp unit used in Redis and in result entries.
pub type UnixMillis = u64;
