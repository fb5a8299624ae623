//! The job's path through batchd: take an ingress entry in, split it into batches, submit and poll each, and
//! publish one result.
//!
//! Both apalis handlers live here. Every "retry, split, wait or give up" decision is made in this module, from the
//! variant of the API error, and every step ends in one atomic storage transition, so a crash at any point leaves a
//! state the next replica resumes from. Every way a job ends goes through [`Pipeline::conclude`].
//!
//! A step works on a [`Claim`]: every transition it makes is fenced by the claim's token, and its lease is renewed
//! while it waits on the API ([`Pipeline::renewing`]). A step whose claim was taken over (this replica was paused
//! past its lease) is refused at its next write with [`StoreError::StaleClaim`]: it is dropped, logged once and
//! counted (`batchd_stale_writes_total`) in [`handle_due`], and the chunk's new holder carries on.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use apalis_core::error::BoxDynError;
use apalis_core::task::data::Data;
use batchd_core::result::code;
use batchd_core::{ChunkState, JobError, JobLimits, ModelName};
use batchd_provider::{ApiError, Call, Provider};
use batchd_queue::{Claim, Store, StoreError};
use futures::FutureExt;

pub(crate) use self::finish::Ending;
use serde_json::value::RawValue;

use crate::metrics::{self, ApiCall};
use crate::providers::{CallSlot, Providers};
use crate::runtime::{ByteBudget, IngressEntry};
use crate::settings::{PackingSettings, PollSettings, RetrySettings};

/// How jobs are split into batches (within each provider's [`batchd_provider::BatchLimits`]).
#[derive(Debug, Clone)]
pub struct SplitSettings {
    /// Default for a job's `retry_failed_items`.
    pub retry_failed_items: bool,
    /// Whether items the provider expired are sent once more while the deadline leaves room
    /// (`jobs.resend_expired_items`).
    pub resend_expired_items: bool,
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
    /// Packing of small jobs into shared remote batches (`[packing]`).
    pub packing: PackingSettings,
    /// Limits applied when decoding jobs.
    pub limits: JobLimits,
    /// Deadline of jobs that set none, when `jobs.default_deadline_secs` is set; `None`: each provider's own
    /// default ([`default_deadline`]).
    pub default_deadline: Option<Duration>,
    /// How long after a job's deadline its batches still running are waited for once asked to cancel
    /// (`jobs.deadline_settle_secs`); then it ends `expired` with what had finished.
    pub deadline_settle: Duration,
    /// How long a cancelled job waits for its batches to end at the provider (`workers.cancel_wait_secs`), from
    /// when the daemon first acted on the cancel; then it ends with what finished.
    pub cancel_wait: Duration,
    /// Lease held on a chunk while this replica works on it.
    pub lease: Duration,
    /// Whether batch events wake polls (`[events]`): request ids are then indexed, and polls are the fallback.
    pub events: bool,
    /// The process's memory budget (`workers.inflight_bytes`): submits hold room for their items and body; the
    /// providers count poll replies and result downloads in it (see `daemon.rs`).
    pub budget: ByteBudget,
    /// Batch prices by model (`[pricing]`): a finished job's `usage` gains its `cost_usd` from them.
    pub pricing: batchd_core::pricing::Pricing,
    /// The namespace's daily budget (`[budget]`): once reached, new submits wait for the next UTC midnight.
    pub spend: crate::spend::DailyBudget,
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

/// apalis handler of the schedule worker: one claimed chunk (a schedule member and this replica's fencing token).
pub async fn handle_due(claim: Claim, pipeline: Data<Arc<Pipeline>>) -> Result<(), BoxDynError> {
    let chunk = &claim.chunk;
    let member = chunk.to_string();
    match AssertUnwindSafe(pipeline.step(&claim)).catch_unwind().await {
        Ok(Ok(())) => {}
        Ok(Err(StoreError::StaleClaim { job_id, chunk, detail })) => stale_step(&job_id, chunk, &detail),
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

/// A step whose claim was taken over: nothing it wrote was kept, and it stops here. Logged once per step.
pub(crate) fn stale_step(job_id: &str, chunk: u32, detail: &str) {
    metrics::stale_write();
    tracing::warn!(
        job_id = %job_id,
        chunk,
        detail = %detail,
        "this replica's claim of the chunk was taken over (it was paused past its lease); the step is dropped"
    );
}

/// How long a step whose provider has `workers.calls_per_provider` calls in flight waits before it is tried again.
const CALL_CAP_WAIT: Duration = Duration::from_millis(500);

/// How often a step renews its lease while it waits on the API: three times per lease, so one late or failed
/// renewal still leaves a third of the lease.
pub(crate) fn renew_every(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(10))
}

async fn drop_member(store: &Store, member: &str) {
    if let Err(error) = store.drop_member(member).await {
        tracing::warn!(error = %error, "could not drop schedule member");
    }
}

mod cancel;
mod finish;
mod pack;
mod poll;
mod submit;
mod take_in;

impl Pipeline {
    /// Does whatever the chunk's ledger says is next: submit, poll, or finish the job.
    #[tracing::instrument(level = "debug", skip_all, fields(job_id = %claim.chunk.job_id, chunk = claim.chunk.index))]
    pub async fn step(&self, claim: &Claim) -> Result<(), StoreError> {
        let chunk = &claim.chunk;
        // The claim read the view in the same step; a claim made elsewhere reads it now.
        let view = match &claim.view {
            Some(view) => Some(view.as_ref().clone()),
            None => self.store.load_chunk(chunk).await?,
        };
        let Some(view) = view else {
            tracing::debug!("ledger gone; dropping schedule member");
            self.store.forget(claim).await?;
            return Ok(());
        };
        if view.job_state.is_terminal() {
            self.store.forget(claim).await?;
            return Ok(());
        }
        if view.claim != claim.token {
            return Err(StoreError::StaleClaim {
                job_id: chunk.job_id.to_string(),
                chunk: chunk.index,
                detail: format!("claimed again (claim {}) before this step (claim {}) began", view.claim, claim.token),
            });
        }
        if let Some(reason) = &view.cancel_requested {
            return self.cancel(claim, &view, reason).await;
        }
        if view.cancel_seen_at.is_some() {
            // The cancel was withdrawn (`batchd uncancel`) after a step acted on it: a later one waits afresh.
            let lease_until = self.store.now().await? + self.lease.as_millis() as u64;
            self.store.forget_cancel(claim, lease_until).await?;
        }
        let now = self.store.now().await?;
        if now >= view.deadline_at {
            return self.settle_deadline(claim, &view, now).await;
        }
        if matches!(view.chunk_state, ChunkState::Done | ChunkState::Failed) {
            return self.finish(claim).await;
        }
        if view.pack.is_some() && view.chunk_state == ChunkState::Pending {
            // Packed: its pack submits it and hands it its results; it is scheduled only for its deadline.
            // (At most 15 digits of Unix ms, as the scripts take: a deadline centuries away is watched in 33658.)
            let watch_at = view.deadline_at.min(999_999_999_999_999);
            return self.store.reschedule(claim, watch_at).await.map(drop);
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
                self.submit(claim, provider.as_ref(), &model, view.endpoint.as_deref(), view.deadline_at).await
            }
            ChunkState::Polling => {
                self.poll(claim, provider.as_ref(), &model, &view, std::time::Instant::now(), None).await
            }
            ChunkState::Done | ChunkState::Failed => self.finish(claim).await,
        }
    }

    /// Runs `work` (a call to the API, or a wait for room in the budget) while renewing `claim`'s lease every
    /// [`renew_every`], so a slow legitimate step is not taken over. Renewal stops once the claim is found taken
    /// over (the step's next write is then refused) or the job finished; a Redis error only skips one renewal.
    async fn renewing<F: std::future::Future>(&self, claim: &Claim, work: F) -> F::Output {
        let mut work = std::pin::pin!(work);
        let mut renewing = true;
        loop {
            tokio::select! {
                output = &mut work => return output,
                () = tokio::time::sleep(renew_every(self.lease)), if renewing => {
                    renewing = self.renew(claim).await;
                }
            }
        }
    }

    /// Before an API call: if this step may have been paused since its claim was last checked at `checked_at` (for
    /// longer than a renewal period: a frozen VM, a SIGSTOP), checks and extends the claim first, so a replica
    /// resumed past its lease does not post or poll for a chunk another replica now holds
    /// ([`StoreError::StaleClaim`]). `Ok(false)`: the job has finished meanwhile; the call is not made.
    async fn still_held(&self, claim: &Claim, checked_at: std::time::Instant) -> Result<bool, StoreError> {
        if checked_at.elapsed() < renew_every(self.lease) {
            return Ok(true);
        }
        let now = self.store.now().await?;
        self.store.renew(claim, now + self.lease.as_millis() as u64).await
    }

    /// Renews `claim`'s lease once; whether to keep renewing.
    async fn renew(&self, claim: &Claim) -> bool {
        let renewed = match self.store.now().await {
            Ok(now) => self.store.renew(claim, now + self.lease.as_millis() as u64).await,
            Err(error) => Err(error),
        };
        match renewed {
            Ok(renewed) => renewed,
            Err(StoreError::StaleClaim { detail, .. }) => {
                tracing::debug!(job_id = %claim.chunk.job_id, chunk = claim.chunk.index, detail = %detail, "lease lost; no more renewals");
                false
            }
            Err(error) => {
                metrics::redis_error("renew");
                tracing::warn!(job_id = %claim.chunk.job_id, chunk = claim.chunk.index, error = %error, "could not renew the lease; trying again");
                true
            }
        }
    }

    /// Whether an API call to `provider` for `model` may go now: a place among the provider's calls in flight
    /// (`workers.calls_per_provider`; the caller holds it until the call is done), then the shared rate limiter.
    /// `Err(wait)`: not now, try again after `wait`.
    async fn admit(
        &self,
        provider: &dyn Provider,
        model: &ModelName,
        call: ApiCall,
    ) -> Result<Result<CallSlot, Duration>, StoreError> {
        // The namespace's daily budget, reached: no new remote batch until the next UTC midnight (looked at again
        // every `spend::RECHECK`); the batches in flight go on.
        if call == ApiCall::Submit
            && let Some((now, until)) = self.spend.held(&self.store).await?
        {
            return Ok(Err(Duration::from_millis(until.saturating_sub(now)).min(crate::spend::RECHECK)));
        }
        let Some(slot) = self.providers.call_slot(provider.name()) else {
            metrics::throttled_wait(call);
            tracing::debug!(provider = provider.name(), wait = ?CALL_CAP_WAIT, "provider at its calls in flight; waiting");
            return Ok(Err(CALL_CAP_WAIT));
        };
        let asked = match call {
            ApiCall::Submit => Call::Submit,
            ApiCall::Poll => Call::Poll,
        };
        let Some(bucket) = provider.rate_bucket(model, asked) else {
            return Ok(Ok(slot));
        };
        match self.store.rate_limit(&bucket.name, bucket.interval, bucket.burst).await? {
            Some(wait) => {
                metrics::throttled_wait(call);
                tracing::debug!(bucket = %bucket.name, wait = ?wait, "rate limited; waiting");
                Ok(Err(wait))
            }
            None => Ok(Ok(slot)),
        }
    }

    /// [`Pipeline::admit`] for a step of the schedule: when the call may not go now, the chunk is rescheduled for
    /// then (a throttled job neither fails nor uses up attempts, and holds no worker meanwhile) and `None` returned.
    async fn admit_step(
        &self,
        claim: &Claim,
        provider: &dyn Provider,
        model: &ModelName,
        call: ApiCall,
    ) -> Result<Option<CallSlot>, StoreError> {
        match self.admit(provider, model, call).await? {
            Ok(slot) => Ok(Some(slot)),
            Err(wait) => {
                self.store.reschedule(claim, self.store.now().await? + wait.as_millis() as u64).await?;
                Ok(None)
            }
        }
    }
}

/// Margin added to a provider's window in its default deadline: time to be taken in, wait for a submit slot and
/// poll once more after the window.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(3600);

/// Default deadline when neither the job nor `jobs.default_deadline_secs` sets one and the provider documents no
/// window (Workers AI).
pub const DEADLINE_WITHOUT_WINDOW: Duration = Duration::from_secs(86_400);

/// The deadline of a job that sets none, counted from acceptance: `jobs.default_deadline_secs` when set
/// (`configured`); otherwise the provider's `window` (the longest a batch runs there before it expires) plus the
/// settle wait (`jobs.deadline_settle_secs`) plus [`DEADLINE_MARGIN`], so a batch that uses its whole window is
/// still collected; [`DEADLINE_WITHOUT_WINDOW`] for a provider without one.
pub fn default_deadline(configured: Option<Duration>, window: Option<Duration>, settle: Duration) -> Duration {
    match (configured, window) {
        (Some(configured), _) => configured,
        (None, Some(window)) => window + settle + DEADLINE_MARGIN,
        (None, None) => DEADLINE_WITHOUT_WINDOW,
    }
}

fn exhausted(error: &ApiError, attempts: u64) -> JobError {
    let mut job_error = error.to_job_error();
    job_error.code = code::RETRIES_EXHAUSTED.to_owned();
    job_error.message = format!("gave up after {attempts} attempts; last error: {error}");
    job_error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_without_a_deadline_gets_the_setting_or_its_providers_window_plus_the_settle_wait_and_a_margin() {
        let settle = Duration::from_secs(600);
        let day = Duration::from_secs(86_400);
        assert_eq!(default_deadline(Some(Duration::from_secs(60)), Some(day), settle), Duration::from_secs(60));
        assert_eq!(default_deadline(None, Some(day), settle), Duration::from_secs(86_400 + 600 + 3600));
        assert_eq!(default_deadline(None, None, settle), DEADLINE_WITHOUT_WINDOW);
    }

    #[test]
    fn a_lease_is_renewed_three_times_per_lease_and_never_in_a_busy_loop() {
        assert_eq!(renew_every(Duration::from_secs(120)), Duration::from_secs(40));
        assert_eq!(renew_every(Duration::from_secs(3)), Duration::from_secs(1));
        assert_eq!(renew_every(Duration::ZERO), Duration::from_millis(10));
    }
}
