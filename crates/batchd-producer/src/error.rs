//! The one error type of the producer library; each variant is something a caller acts on differently.

use batchd_core::DecodeError;
use batchd_core::keys::InvalidNamespace;

/// What went wrong talking to batchd through Redis.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// The namespace is not a valid batchd namespace (fix the configuration).
    #[error(transparent)]
    Namespace(#[from] InvalidNamespace),
    /// Redis could not be reached at all (retry later, or fix the URL).
    #[error("cannot reach Redis at {url}: {source}")]
    Connect {
        /// The URL without its password (`batchd_core::redact_url`).
        url: String,
        /// The storage's error (the client's, or a TLS file that cannot be read).
        source: batchd_queue::StoreError,
    },
    /// The job breaks a rule of the v1 wire format; nothing was written (fix the job).
    #[error("invalid job: {0}")]
    Invalid(DecodeError),
    /// One job of an `enqueue_many` batch breaks a rule; nothing of the batch was written.
    #[error("job {index} of the batch is invalid: {source}")]
    InvalidInBatch {
        /// Position of the job in the batch.
        index: usize,
        /// What is wrong with it.
        source: DecodeError,
    },
    /// A reader option is not usable (an empty group name, a stream outside the namespace, ...).
    #[error("invalid reader option: {0}")]
    Option(String),
    /// A Redis command failed (connection lost, timeout, ...); a retry may succeed. Jobs enqueued with an
    /// explicit `id` can be enqueued again safely: the daemon runs a job id once.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis answered with something that is not what batchd's key layout promises.
    #[error("unexpected reply from Redis: {0}")]
    Reply(String),
}

impl From<batchd_queue::StoreError> for ProducerError {
    fn from(error: batchd_queue::StoreError) -> Self {
        match error {
            batchd_queue::StoreError::Redis(error) => Self::Redis(error),
            other => Self::Reply(other.to_string()),
        }
    }
}

impl ProducerError {
    /// Whether the error is a failed Redis command or connection, which a retry may cure.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Redis(_) | Self::Connect { .. })
    }
}
