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
use batchd_core::result::code;
use batchd_core::{ChunkRef, ChunkState, JobError, JobLimits, ModelName};
use batchd_provider::{ApiError, Call, Provider};
use batchd_queue::{Store, StoreError};
use futures::FutureExt;

pub(crate) use self::finish::Ending;
use serde_json::value::RawValue;

use crate::metrics::{self, ApiCall};
use crate::providers::Providers;
use crate::runtime::{ByteBudget, IngressEntry};
use crate::settings::{PollSettings, RetrySettings};

/// How jobs are split into batches (within each provider's [`batchd_provider::BatchLimits`]).
#[derive(Debug, Clone)]
pub struct SplitSettings {
    /// Default for a job's `retry_failed_items`.
    pub retry_failed_items: bool,
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct Pipeline {
    /// Redis storage of the namespace.
    pub store: Store,
    /// The batch APIs this daemon drives; a job's model name picks one.
    pub providers: Providers,
    /// Poll timing.
    pub poll: PollSettings,
    /// Retry policy for transient errors.
    pub retry: RetrySettings,
    /// Splitting of big jobs.
    pub split: SplitSettings,
    /// Limits applied when decoding jobs.
    pub limits: JobLimits,
    /// Deadline of jobs that set none.
    pub default_deadline: Duration,
    /// Lease held on a chunk while this replica works on it.
    pub lease: Duration,
    /// Whether batch events wake polls (`[events]`): request ids are then indexed, and polls are the fallback.
    pub events: bool,
    /// The process's memory budget (`workers.inflight_bytes`): submits hold room for their items and body; the
    /// providers count poll replies and result downloads in it (see `daemon.rs`).
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
        if matches!(view.chunk_state, ChunkState::Done | ChunkState::Failed) {
            return self.finish(&chunk.job_id).await;
        }
        let Ok(model) = ModelName::parse(&view.model) else {
            return Err(StoreError::Corrupt { job_id: chunk.job_id.to_string(), detail: "model".into() });
        };
        let provider = match self.providers.for_model(&model) {
            Ok(provider) => Arc::clone(provider),
            // Accepted while the provider was configured; it is not any more (a replica of another configuration).
            Err(reason) => {
                tracing::warn!(model = %model, reason = %reason, "no provider for a running job's model");
                return self.conclude(&chunk.job_id, Ending::Failed(JobError::new(code::INVALID_JOB, reason))).await;
            }
        };
        match view.chunk_state {
            ChunkState::Pending | ChunkState::Submitting => {
                self.submit(chunk, provider.as_ref(), &model, view.endpoint.as_deref(), view.deadline_at).await
            }
            ChunkState::Polling => self.poll(chunk, provider.as_ref(), &model, &view).await,
            ChunkState::Done | ChunkState::Failed => self.finish(&chunk.job_id).await,
        }
    }

    /// Asks the shared rate limiter for a slot of `model`'s bucket at `provider`: `None` means go now (the slot is
    /// booked), otherwise how long to wait.
    async fn rate_wait(
        &self,
        provider: &dyn Provider,
        model: &ModelName,
        call: ApiCall,
    ) -> Result<Option<Duration>, StoreError> {
        let asked = match call {
            ApiCall::Submit => Call::Submit,
            ApiCall::Poll => Call::Poll,
        };
        let Some(bucket) = provider.rate_bucket(model, asked) else {
            return Ok(None);
        };
        let wait = self.store.rate_limit(&bucket.name, bucket.interval, bucket.burst).await?;
        if let Some(wait) = wait {
            metrics::throttled_wait(call);
            tracing::debug!(bucket = %bucket.name, wait = ?wait, "rate limited; waiting");
        }
        Ok(wait)
    }

    /// Waits for the shared rate limiter if `model`'s bucket is full: returns how long, after rescheduling the
    /// chunk (a throttled job neither fails nor uses up attempts).
    async fn throttle(
        &self,
        chunk: &ChunkRef,
        provider: &dyn Provider,
        model: &ModelName,
        call: ApiCall,
    ) -> Result<Option<Duration>, StoreError> {
        let Some(wait) = self.rate_wait(provider, model, call).await? else {
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
