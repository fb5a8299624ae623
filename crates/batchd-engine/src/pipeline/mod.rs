//! The job's path through batchd: take an ingress entry in, split it into batches, submit and poll each, and
//! publish one result.
//!
//! Both apalis handlers live here. Every "retry, split, wait or give up" decision is made in this module, from the
//! variant of the API error, and every step ends in one atomic storage transition, so a crash at any point leaves a
//! state the next replica resumes from. Every way a job ends goes through [`Pipeline::conclude`].

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use apalis_core::error::BoxDynError;
use apalis_core::task::data::Data;
use batchd_cloudflare::{ApiError, BatchClient};
use batchd_core::result::code;
use batchd_core::{ChunkRef, ChunkState, JobError, JobLimits, ModelName};
use batchd_queue::{Store, StoreError};
use futures::FutureExt;

pub(crate) use self::finish::Ending;
use serde_json::value::RawValue;

use crate::metrics::{self, ApiCall};
use crate::policy::rate_bucket;
use crate::rate_limits::RateLimitSettings;
use crate::runtime::{ByteBudget, IngressEntry};
use crate::settings::{PollSettings, RetrySettings};

/// How jobs are split into batches.
#[derive(Debug, Clone)]
pub struct SplitSettings {
    /// Largest submit body, in bytes.
    pub max_payload_bytes: usize,
    /// Most items per batch.
    pub max_batch_items: Option<usize>,
    /// Default for a job's `retry_failed_items`.
    pub retry_failed_items: bool,
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct Pipeline {
    /// Redis storage of the namespace.
    pub store: Store,
    /// The Batch API client.
    pub client: BatchClient,
    /// The Cloudflare account (part of every rate-limit bucket).
    pub account_id: String,
    /// Poll timing.
    pub poll: PollSettings,
    /// Retry policy for transient errors.
    pub retry: RetrySettings,
    /// Splitting of big jobs.
    pub split: SplitSettings,
    /// Shared submit rate limits.
    pub rate_limits: RateLimitSettings,
    /// Limits applied when decoding jobs.
    pub limits: JobLimits,
    /// Deadline of jobs that set none.
    pub default_deadline: Duration,
    /// Lease held on a chunk while this replica works on it.
    pub lease: Duration,
    /// Whether batch events wake polls (`[events]`): request ids are then indexed, and polls are the fallback.
    pub events: bool,
    /// The process's memory budget (`workers.inflight_bytes`): submits hold room for their items and body; the
    /// client counts poll replies in it (see `daemon.rs`).
    pub budget: ByteBudget,
}

/// A request item as the pipeline posts it: owned (read back from the ledger) or borrowed (from the entry).
trait Item: std::borrow::Borrow<RawValue> + serde::Serialize + Sync {}

impl<T: std::borrow::Borrow<RawValue> + serde::Serialize + Sync> Item for T {}

fn unit_random() -> f64 {
    rand::random::<f64>()
}

/// apalis handler of the submit worker: one ingress entry.
pub async fn handle_entry(entry: IngressEntry, pipeline: Data<Arc<Pipeline>>) -> Result<(), BoxDynError> {
    let entry_id = entry.id.clone();
    match AssertUnwindSafe(pipeline.take_in(entry)).catch_unwind().await {
        Ok(Ok(())) => {}
        // The entry stays pending in the consumer group and is reclaimed after `ingress.reclaim_idle_secs`.
        Ok(Err(error)) => {
            metrics::redis_error("take_in");
            tracing::error!(entry_id = %entry_id, error = %error, "could not take in ingress entry; it will be retried");
        }
        Err(_) => tracing::error!(entry_id = %entry_id, "panic while taking in ingress entry; it will be retried"),
    }
    Ok(())
}

/// apalis handler of the schedule worker: one due chunk (a schedule member).
pub async fn handle_due(member: String, pipeline: Data<Arc<Pipeline>>) -> Result<(), BoxDynError> {
    let chunk = match ChunkRef::parse(&member) {
        Ok(chunk) => chunk,
        Err(error) => {
            tracing::warn!(member = %member, error = %error, "dropping a schedule member batchd did not write");
            drop_member(&pipeline.store, &member).await;
            return Ok(());
        }
    };
    match AssertUnwindSafe(pipeline.step(&chunk)).catch_unwind().await {
        Ok(Ok(())) => {}
        Ok(Err(StoreError::Corrupt { job_id, detail })) => {
            // Retrying cannot help a ledger batchd did not write; take it off the schedule and say so.
            tracing::error!(job_id = %job_id, detail = %detail, "ledger is corrupt; the chunk is dropped from the schedule");
            drop_member(&pipeline.store, &member).await;
        }
        // The chunk keeps its lease score and becomes due again when the lease ends.
        Ok(Err(error)) => {
            metrics::redis_error("step");
            tracing::error!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, "step failed; it will be retried");
        }
        Err(_) => tracing::error!(job_id = %chunk.job_id, chunk = chunk.index, "panic in step; it will be retried"),
    }
    Ok(())
}

async fn drop_member(store: &Store, member: &str) {
    if let Err(error) = store.drop_member(member).await {
        tracing::warn!(error = %error, "could not drop schedule member");
    }
}

mod finish;
mod poll;
mod submit;
mod take_in;

impl Pipeline {
    /// Does whatever the chunk's ledger says is next: submit, poll, or finish the job.
    #[tracing::instrument(level = "debug", skip_all, fields(job_id = %chunk.job_id, chunk = chunk.index))]
    pub async fn step(&self, chunk: &ChunkRef) -> Result<(), StoreError> {
        let Some(view) = self.store.load_chunk(chunk).await? else {
            tracing::debug!("ledger gone; dropping schedule member");
            self.store.update_chunk(chunk, None, None, &[], &[]).await?;
            return Ok(());
        };
        if view.job_state.is_terminal() {
            self.store.update_chunk(chunk, None, None, &[], &[]).await?;
            return Ok(());
        }
        if let Some(reason) = &view.cancel_requested {
            return self.cancel(&chunk.job_id, reason).await;
        }
        let now = self.store.now().await?;
        if now >= view.deadline_at {
            return self.expire(&chunk.job_id, &view, now).await;
        }
        match view.chunk_state {
            ChunkState::Pending | ChunkState::Submitting => match ModelName::parse(&view.model) {
                Ok(model) => self.submit(chunk, &model, view.deadline_at).await,
                Err(_) => Err(StoreError::Corrupt { job_id: chunk.job_id.to_string(), detail: "model".into() }),
            },
            ChunkState::Polling => self.poll(chunk, &view).await,
            ChunkState::Done | ChunkState::Failed => self.finish(&chunk.job_id).await,
        }
    }

    /// Asks the shared rate limiter for a slot of `model`'s bucket: `None` means go now (the slot is booked),
    /// otherwise how long to wait.
    async fn rate_wait(&self, model: &ModelName, call: ApiCall) -> Result<Option<Duration>, StoreError> {
        if call == ApiCall::Poll && !self.rate_limits.limit_polls {
            return Ok(None);
        }
        let Some((bucket, limit)) = rate_bucket(&self.account_id, model.as_str(), &self.rate_limits) else {
            return Ok(None);
        };
        let bucket = if call == ApiCall::Poll { format!("poll:{bucket}") } else { bucket };
        let interval = Duration::from_secs(self.rate_limits.window_secs).div_f64(f64::from(limit));
        let wait = self.store.rate_limit(&bucket, interval, self.rate_limits.burst).await?;
        if let Some(wait) = wait {
            metrics::throttled_wait(call);
            tracing::debug!(bucket = %bucket, wait = ?wait, "rate limited; waiting");
        }
        Ok(wait)
    }

    /// Waits for the shared rate limiter if `model`'s bucket is full: returns how long, after rescheduling the
    /// chunk (a throttled job neither fails nor uses up attempts).
    async fn throttle(
        &self,
        chunk: &ChunkRef,
        model: &ModelName,
        call: ApiCall,
    ) -> Result<Option<Duration>, StoreError> {
        let Some(wait) = self.rate_wait(model, call).await? else {
            return Ok(None);
        };
        self.store.update_chunk(chunk, Some(self.store.now().await? + wait.as_millis() as u64), None, &[], &[]).await?;
        Ok(Some(wait))
    }
}

fn exhausted(error: &ApiError, attempts: u64) -> JobError {
    let mut job_error = error.to_job_error();
    job_error.code = code::RETRIES_EXHAUSTED.to_owned();
    job_error.message = format!("gave up after {attempts} attempts; last error: {error}");
    job_error
}
