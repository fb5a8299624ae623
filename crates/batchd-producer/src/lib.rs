//! The Rust client for services that feed batchd: enqueue jobs (validated with the daemon's own rules), ask about
//! them, and read their results reliably through a consumer group.
//!
//! ```no_run
//! use batchd_producer::{NewJob, Producer, ReaderOptions};
//!
//! # async fn example() -> Result<(), batchd_producer::ProducerError> {
//! let producer = Producer::connect("redis://127.0.0.1:6379", "batchd").await?;
//! let job = NewJob::new("@cf/baai/bge-m3", vec![serde_json::json!({"text": "hello"})]).with_id("inv-42");
//! let job_id = producer.enqueue(&job).await?;
//!
//! let mut reader = producer.results_reader(ReaderOptions::new("billing", "worker-1")).await?;
//! loop {
//!     let batch = reader.next_batch().await?;
//!     for delivery in &batch {
//!         // handle(delivery): dedupe on delivery.job_id() if handling twice would hurt
//!         println!("{} {:?}", delivery.job_id(), delivery.result().map(|r| r.status));
//!     }
//!     reader.ack_all(&batch).await?;
//! #   if batch.iter().any(|d| d.job_id() == job_id.as_str()) { break; }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Delivery of results is at least once; the rule for duplicates is in [`reader`]. See `docs/producers.md` for
//! the same from other languages, and `examples/enqueue_and_read.rs` for a runnable program.
//!
//! The producer speaks to Redis only through batchd's storage crate (`batchd_queue`): [`Producer::with_endpoint`]
//! reaches whatever the daemon reaches (Cluster, Sentinel, TLS), and [`Producer::cancel`] runs the daemon's own
//! atomic `cancel` transition.

mod error;
mod producer;
pub mod reader;
mod reply;

pub use batchd_core::{JobError, JobId, JobLimits, JobState, ResultEntry, ResultStatus};
pub use error::ProducerError;
pub use producer::{CancelOutcome, ChunkStatus, JobStatus, NewJob, Producer};
pub use reader::{Delivery, GroupStart, ReaderOptions, ResultReader};
pub use reply::entry_millis;
