//! The job's path through batchd: take an ingress entry in, split it into batches, submit and poll each, and
//! publish one result.
//!
//! Both apalis handlers live here. Every "retry, split, wait or give up" decision is made in this module, from the
//! variant of the API error, and every step ends in one atomic storage transition, so a crash at any point leaves a
//! state the next replica resumes from. Every way a job ends goes through [`Pipeline::conclude`].

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apalis_core::error::BoxDynError;
use apalis_core::task::data::Data;
use batchd_cloudflare::{ApiError, BatchClient, ErrorKind, PendingStatus, PollStatus};
use batchd_core::ledger::field;
use batchd_core::result::code;
use batchd_core::{
    ChunkRef, ChunkState, DecodeError, Job, JobError, JobId, JobLimits, JobOutput, JobState, ModelName, RequestId,
    ResultEntry, ResultStatus, UnixMillis,
};
use batchd_queue::ingress::IngressEntry;
use batchd_queue::{
    Accepted, AddOutcome, ByteBudget, ChunkView, DeadLetter, Intake, MAX_CHUNKS_PER_JOB, NewChunk, Placement,
    PublishContext, Rejection, Store, StoreError, SubmitTicket,
};
use futures::FutureExt;
use serde_json::value::RawValue;
use tracing::Instrument;

use crate::metrics::{self, ApiCall};
use crate::policy::{
    ChunkOutcome, assemble, isolate_cuts, plan_chunks, poll_delay, rate_bucket, retry_delay, split_placement,
};
use crate::settings::{PollSettings, RateLimitSettings, RetrySettings};

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

/// How a job ends.
#[derive(Debug, Clone)]
enum Ending {
    /// Every batch finished (if one failed as a whole, the job ends `failed`, listing it).
    Finished,
    /// The job cannot go on.
    Failed(JobError),
    /// The deadline passed.
    Expired(JobError),
    /// Cancelled on request.
    Cancelled(JobError),
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
    let removed: Result<i64, redis::RedisError> =
        redis::AsyncCommands::zrem(&mut store.connection(), store.keys().schedule(), member).await;
    if let Err(error) = removed {
        tracing::warn!(error = %error, "could not drop schedule member");
    }
}

impl Pipeline {
    /// Decodes an ingress entry, plans its batches and accepts it as a job (or rejects it with a result that
    /// says why), then submits its first batch straight away.
    // Spans are debug-level: at info they cost ~12% of the daemon's CPU per job (docs/benchmarks.md), so every
    // warn and error event names its job (and chunk) itself.
    #[tracing::instrument(level = "debug", skip_all, fields(entry_id = %entry.id, job_id = tracing::field::Empty))]
    pub async fn take_in(&self, entry: IngressEntry) -> Result<(), StoreError> {
        let now = self.store.now().await?;
        // The items stay views into the entry's `job` field: a big job is held once, not twice.
        let job = match Job::decode_borrowed(&entry.fields, &entry.id, &self.limits, self.store.keys()) {
            Ok(job) => job,
            Err(error) => return self.reject(&entry, error, now).await,
        };
        let entry_id = entry.id.as_str();
        tracing::Span::current().record("job_id", tracing::field::display(&job.id));
        let sizes: Vec<usize> = job.requests.iter().map(|item| item.get().len()).collect();
        let planned = plan_chunks(&sizes, self.split.max_payload_bytes, self.split.max_batch_items);
        let refusal = match &planned {
            Err(too_large) => Some((
                code::ITEM_TOO_LARGE,
                format!(
                    "request item {} is {} bytes: sent alone it makes a {}-byte body, over the payload limit of {} \
                     bytes (jobs.max_payload_bytes); nothing was submitted",
                    too_large.index, too_large.bytes, too_large.body_bytes, self.split.max_payload_bytes
                ),
            )),
            Ok(plan) if plan.len() > MAX_CHUNKS_PER_JOB as usize => Some((
                code::INVALID_JOB,
                format!(
                    "the job needs {} batches, more than the {MAX_CHUNKS_PER_JOB} one job may have: split it into \
                     smaller jobs (or raise jobs.max_batch_items); nothing was submitted",
                    plan.len()
                ),
            )),
            Ok(_) => None,
        };
        if let Some((reason, message)) = refusal {
            let error = JobError::new(reason, message);
            let rejection = Rejection {
                entry_id,
                job_id: &job.id,
                model: job.model.as_str(),
                error: &error,
                dead: None,
                items_total: job.requests.len(),
            };
            if self.store.reject(&rejection, now).await? {
                metrics::job_rejected(reason);
                tracing::warn!(job_id = %job.id, error = %error.message, "job refused before anything was submitted");
            }
            return Ok(());
        }
        let plan = planned.expect("a refused plan returned above");
        let deadline = job.deadline_secs.map(Duration::from_secs).unwrap_or(self.default_deadline);
        // Saturating: a producer may ask for a deadline centuries away.
        let deadline_at = now.saturating_add(u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX));
        // The first batch's body is posted from the items in hand; it needs room of its own in the budget. The
        // entry already holds room, so this never waits: short of room, the batch goes through the schedule
        // (which waits for room holding nothing), like a throttled one.
        let first_body = batchd_cloudflare::submit_body_bytes(sizes[..plan[0].1].iter().copied());
        let body_room = self.budget.try_hold(first_body);
        // Ask the shared limiter before the job exists: a throttled first batch is accepted `pending`, due when
        // its slot comes; otherwise it is accepted already `submitting` and posted at once, under its lease.
        let wait = match &body_room {
            Some(_) => self.rate_wait(&job.model, ApiCall::Submit).await?,
            None => {
                tracing::debug!(first_body, "no room in workers.inflight_bytes for the first batch now; scheduling it");
                Some(Duration::ZERO)
            }
        };
        let first_due = match wait {
            Some(wait) => now + wait.as_millis() as u64,
            None => now + self.lease.as_millis() as u64,
        };
        let retry_failed_items = job.retry_failed_items.unwrap_or(self.split.retry_failed_items);
        let intake = Intake {
            entry_id,
            plan: &plan,
            now,
            deadline_at,
            first_due,
            retry_failed_items,
            submit_first: wait.is_none(),
        };
        match self.store.accept(&job, &intake).await? {
            Accepted::New => {
                metrics::job_accepted();
                tracing::debug!(model = %job.model, n_items = job.requests.len(), n_chunks = plan.len(), "job accepted");
                if wait.is_some() {
                    return Ok(());
                }
                // Post the first chunk with the items in hand instead of reading them back.
                let first = &job.requests[..plan[0].1];
                let chunk = ChunkRef::new(job.id.clone(), 0);
                let placement = Placement::Range { start: 0, len: plan[0].1 };
                if let Err(error) = self.post(&chunk, &job.model, 1, false, first, placement, deadline_at).await {
                    // The entry is taken in (acknowledged); what is retried is the chunk, from the schedule.
                    metrics::redis_error("submit");
                    tracing::error!(
                        job_id = %job.id,
                        error = %error,
                        "submitting the first batch failed; it is retried after its lease"
                    );
                }
                Ok(())
            }
            Accepted::CancelRequested => {
                metrics::job_accepted();
                tracing::debug!("job accepted with its cancellation already requested; it is concluded next");
                Ok(())
            }
            Accepted::Duplicate { state } => {
                metrics::job_duplicate();
                tracing::warn!(
                    job_id = %job.id,
                    state = %state,
                    "job id seen before: entry acknowledged and not run again (the existing job keeps its one result)"
                );
                Ok(())
            }
        }
    }

    async fn reject(&self, entry: &IngressEntry, error: DecodeError, now: UnixMillis) -> Result<(), StoreError> {
        let (job_id, job_error, dead) = match &error {
            DecodeError::Undecodable { reason } => {
                let job_id = JobId::parse(&entry.id)
                    .map_err(|e| StoreError::Corrupt { job_id: entry.id.clone(), detail: e.to_string() })?;
                let dead = DeadLetter { fields: entry.fields.clone(), reason: reason.clone() };
                (job_id, JobError::new(code::INVALID_ENTRY, reason.clone()), Some(dead))
            }
            DecodeError::Invalid { job_id, .. } => {
                (job_id.clone(), JobError::new(code::INVALID_JOB, error.to_string()), None)
            }
        };
        // The model the decoder read, when valid: a rejected entry is never parsed a second time to find it.
        let model = match &error {
            DecodeError::Invalid { model: Some(model), .. } => model.as_str(),
            _ => "",
        };
        let rejection = Rejection {
            entry_id: &entry.id,
            job_id: &job_id,
            model,
            error: &job_error,
            dead: dead.as_ref(),
            items_total: 0,
        };
        let published = self.store.reject(&rejection, now).await?;
        if published {
            metrics::job_rejected(if dead.is_some() { code::INVALID_ENTRY } else { code::INVALID_JOB });
            tracing::warn!(job_id = %job_id, error = %job_error.message, dead_lettered = dead.is_some(), "job rejected");
        } else {
            metrics::job_duplicate();
            tracing::warn!(job_id = %job_id, "rejected entry repeats an existing job id; acknowledged only");
        }
        Ok(())
    }

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

    /// Submits one chunk from the schedule: mark `submitting` (reading its items back), then [`Pipeline::post`].
    async fn submit(&self, chunk: &ChunkRef, model: &ModelName, deadline_at: UnixMillis) -> Result<(), StoreError> {
        if self.throttle(chunk, model, ApiCall::Submit).await?.is_some() {
            return Ok(());
        }
        // Room for the items read back and the body built from them (each at most max_payload_bytes), before either
        // exists; then only what this chunk needs is kept until the submit is done.
        let mut room = self.budget.hold(2 * self.split.max_payload_bytes).await;
        let ticket = self.store.begin_submit(chunk, self.store.now().await?).await?;
        match ticket {
            SubmitTicket::Go { attempt, resubmit, requests, placement, .. } => {
                let body = batchd_cloudflare::submit_body_bytes(requests.iter().map(|item| item.get().len()));
                room.shrink_to(2 * body);
                self.post(chunk, model, attempt, resubmit, &requests, placement, deadline_at).await
            }
            SubmitTicket::Cancelled => {
                let reason = self.store.cancel_requested(&chunk.job_id).await?.unwrap_or_default();
                self.cancel(&chunk.job_id, &reason).await
            }
            SubmitTicket::Skip { chunk_state } => {
                tracing::debug!(chunk_state = %chunk_state, "chunk already submitted");
                Ok(())
            }
            SubmitTicket::Gone => Ok(()),
        }
    }

    /// POSTs a chunk already marked `submitting` (attempt `attempt`), then records the request id and schedules
    /// the first poll, or decides what the failure means. `deadline_at` is the job's: no retry is due after it.
    #[allow(clippy::too_many_arguments)]
    async fn post<R: Item>(
        &self,
        chunk: &ChunkRef,
        model: &ModelName,
        attempt: u64,
        resubmit: bool,
        requests: &[R],
        placement: Placement,
        deadline_at: UnixMillis,
    ) -> Result<(), StoreError> {
        if resubmit {
            metrics::possible_duplicate_submit();
            tracing::warn!(
                job_id = %chunk.job_id,
                chunk = chunk.index,
                attempt,
                "resubmitting a chunk whose previous submit was interrupted; the remote batch may be duplicated"
            );
        }
        let span = tracing::debug_span!("submit", model = %model, attempt, request_id = tracing::field::Empty);
        let started = Instant::now();
        let submitted = self.client.submit(model, requests).instrument(span.clone()).await;
        match &submitted {
            Ok(_) => metrics::api_request(ApiCall::Submit, "ok", Some(200), started.elapsed()),
            Err(error) => {
                metrics::api_request(ApiCall::Submit, error.kind.as_str(), error.http_status, started.elapsed())
            }
        }
        match submitted {
            Ok(submitted) => {
                span.record("request_id", tracing::field::display(&submitted.request_id));
                if self.events {
                    // Before the record: an event that arrives right after it must find the chunk. A failure
                    // here costs only latency (the fallback poll still comes).
                    let indexed = match self.store.now().await {
                        Ok(now) => {
                            self.store.index_request(submitted.request_id.as_str(), chunk, deadline_at, now).await
                        }
                        Err(error) => Err(error),
                    };
                    if let Err(error) = indexed {
                        metrics::redis_error("index_request");
                        tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, "could not index the request id for events; the batch is found by its fallback poll");
                    }
                }
                let recorded = self.record_submitted(chunk, &submitted.request_id).await?;
                tracing::debug!(
                    parent: &span,
                    request_id = %submitted.request_id,
                    n_items = placement.len(),
                    bytes = submitted.body_bytes,
                    recorded,
                    "batch submitted"
                );
                Ok(())
            }
            Err(error) => {
                let failed = FailedSubmit { attempt, placement, deadline_at };
                self.submit_failed(chunk, model, failed, requests, error).await
            }
        }
    }

    /// Records a submitted chunk's request id and schedules its first poll. The remote batch exists now, so a
    /// Redis error here must not lose the id (the chunk would be submitted again after its lease): the step is
    /// retried with backoff for as long as this replica holds the lease.
    async fn record_submitted(&self, chunk: &ChunkRef, request_id: &RequestId) -> Result<bool, StoreError> {
        let started = Instant::now();
        let mut wait = Duration::from_millis(100);
        loop {
            let now = self.store.now().await?;
            let due = now + poll_delay(0, &self.poll, self.events, unit_random()).as_millis() as u64;
            let recorded = self
                .store
                .update_chunk(
                    chunk,
                    Some(due),
                    None,
                    &[
                        (field::CHUNK_STATE, ChunkState::Polling.as_str().to_owned()),
                        (field::CHUNK_REQUEST_ID, request_id.to_string()),
                        (field::CHUNK_SUBMITTED_AT, now.to_string()),
                        (field::CHUNK_REMOTE_STATUS, "queued".to_owned()),
                    ],
                    &[(field::STATE, JobState::Running.as_str().to_owned()), (field::UPDATED_AT, now.to_string())],
                )
                .await;
            match recorded {
                Ok(recorded) => return Ok(recorded),
                Err(error) if started.elapsed() + wait < self.lease => {
                    metrics::redis_error("record_submitted");
                    tracing::warn!(
                        job_id = %chunk.job_id,
                        chunk = chunk.index,
                        request_id = %request_id,
                        error = %error,
                        retry_in = ?wait,
                        "cannot record the request id of a submitted batch; retrying"
                    );
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                Err(error) => {
                    tracing::error!(
                        job_id = %chunk.job_id,
                        chunk = chunk.index,
                        request_id = %request_id,
                        error = %error,
                        "gave up recording the request id of a submitted batch; the chunk will be submitted again"
                    );
                    return Err(error);
                }
            }
        }
    }

    async fn submit_failed<R: Item>(
        &self,
        chunk: &ChunkRef,
        model: &ModelName,
        failed: FailedSubmit,
        requests: &[R],
        error: ApiError,
    ) -> Result<(), StoreError> {
        let FailedSubmit { attempt, placement, deadline_at } = failed;
        let now = self.store.now().await?;
        match error.kind {
            ErrorKind::TooLarge if placement.len() > 1 => {
                let cuts = [placement.len() / 2];
                let owned = requests.iter().map(|item| item.borrow().to_owned()).collect();
                return self.split(chunk, placement, owned, &cuts, &error).await;
            }
            ErrorKind::InvalidInput if placement.len() > 1 => {
                // One bad item refuses the whole batch: split it to isolate the item (around it when the API
                // names it, in halves otherwise), so every valid item is still answered.
                let cuts = isolate_cuts(placement.len(), error.refused_item());
                let owned = requests.iter().map(|item| item.borrow().to_owned()).collect();
                return self.split(chunk, placement, owned, &cuts, &error).await;
            }
            ErrorKind::InvalidInput => return self.item_refused(chunk, &error).await,
            ErrorKind::TooLarge | ErrorKind::BatchFailed | ErrorKind::ReplyTooLarge => {
                return self.chunk_failed(chunk, error.to_job_error()).await;
            }
            ErrorKind::Transient | ErrorKind::QuotaExhausted => {}
            ErrorKind::Permanent | ErrorKind::NotFound | ErrorKind::NotBatchable => {
                tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, model = %model, error = %error, "the Batch API refused the batch");
                return self.conclude(&chunk.job_id, Ending::Failed(error.to_job_error())).await;
            }
        }
        let rate_limited = error.http_status == Some(429);
        if !rate_limited && attempt >= self.retry.max_attempts {
            return self.chunk_failed(chunk, exhausted(&error, attempt)).await;
        }
        let wait = retry_delay(attempt.max(1), &self.retry, error.retry_after, unit_random());
        // A submit that may have reached the API stays `submitting`, so its retry is counted as a possible
        // duplicate; one that certainly created nothing goes back to `pending`.
        let state = if error.is_ambiguous_submit() { ChunkState::Submitting } else { ChunkState::Pending };
        let mut fields = vec![
            (field::CHUNK_STATE, state.as_str().to_owned()),
            (field::CHUNK_LAST_ERROR, error.to_job_error().to_json()),
        ];
        if rate_limited {
            // Rate limiting is not a failure of the job: give the attempt back.
            fields.push((field::CHUNK_ATTEMPTS, attempt.saturating_sub(1).to_string()));
            metrics::throttled_wait(ApiCall::Submit);
        } else {
            metrics::retry(ApiCall::Submit);
        }
        tracing::warn!(
            job_id = %chunk.job_id,
            chunk = chunk.index,
            model = %model,
            attempt,
            error = %error,
            retry_in = ?wait,
            "submit failed; retrying"
        );
        // Never due past the deadline (a long Retry-After included): the job expires on time.
        let due = (now + wait.as_millis() as u64).min(deadline_at);
        self.store.update_chunk(chunk, Some(due), None, &fields, &[]).await?;
        Ok(())
    }

    /// The API refused a one-item batch because of its input: the item is answered `success:false` with the API's
    /// error (code, message, HTTP status), and the chunk is done, so the job goes on and can still complete.
    async fn item_refused(&self, chunk: &ChunkRef, error: &ApiError) -> Result<(), StoreError> {
        tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, "the Batch API refused one request item");
        metrics::item_refused();
        let output = JobOutput {
            responses: vec![batchd_core::ItemResponse::failure(0, Some(api_error_item(error)))],
            usage: serde_json::json!({}),
            failed_batches: Vec::new(),
        };
        let payload = serde_json::to_string(&output).expect("output serialises");
        match self.store.chunk_done(chunk, ChunkState::Done, &payload, self.store.now().await?).await? {
            Some(0) => self.finish(&chunk.job_id).await,
            _ => Ok(()),
        }
    }

    /// Replaces the chunk by its pieces, cut before each of the chunk-local positions `cuts` (ascending, inside
    /// the chunk), all due now: the first piece takes the chunk's place, the others are appended.
    async fn split(
        &self,
        chunk: &ChunkRef,
        placement: Placement,
        mut requests: Vec<Box<RawValue>>,
        cuts: &[usize],
        error: &ApiError,
    ) -> Result<(), StoreError> {
        let placements = split_placement(placement, cuts);
        let mut pieces = Vec::with_capacity(placements.len());
        for placement in placements.into_iter().rev() {
            let rest = requests.split_off(requests.len() - placement.len());
            pieces.push(NewChunk { placement, requests: rest });
        }
        pieces.reverse();
        let reason = if error.kind == ErrorKind::TooLarge { "too_large" } else { "invalid_input" };
        metrics::extra_submits(reason, pieces.len());
        tracing::warn!(
            job_id = %chunk.job_id,
            chunk = chunk.index,
            error = %error,
            pieces = ?pieces.iter().map(|piece| piece.placement.len()).collect::<Vec<_>>(),
            reason,
            "the API refused the batch; splitting it"
        );
        self.store.add_chunks(&chunk.job_id, self.store.now().await?, Some(chunk.index), None, &pieces).await?;
        Ok(())
    }

    /// Polls one chunk's remote batch.
    async fn poll(&self, chunk: &ChunkRef, view: &ChunkView) -> Result<(), StoreError> {
        let (Some(request_id), Ok(model)) =
            (view.request_id.as_deref().and_then(|id| RequestId::parse(id).ok()), ModelName::parse(&view.model))
        else {
            return Err(StoreError::Corrupt {
                job_id: chunk.job_id.to_string(),
                detail: format!("chunk {} is polling without a request id", chunk.index),
            });
        };
        if self.throttle(chunk, &model, ApiCall::Poll).await?.is_some() {
            return Ok(());
        }
        let span = tracing::debug_span!("poll", request_id = %request_id, model = %model, n_polls = view.n_polls);
        let started = Instant::now();
        // The reply's room in the budget (taken as it was read) is held until its outcome is stored or published.
        let (polled, _room) = match self.client.poll_held(&model, &request_id, view.items_len).instrument(span).await {
            Ok((status, room)) => (Ok(status), room),
            Err(error) => (Err(error), Vec::new()),
        };
        let elapsed = started.elapsed();
        match &polled {
            Ok(PollStatus::Done(_)) => metrics::api_request(ApiCall::Poll, "done", Some(200), elapsed),
            Ok(_) => metrics::api_request(ApiCall::Poll, "pending", Some(200), elapsed),
            Err(error) => metrics::api_request(ApiCall::Poll, error.kind.as_str(), error.http_status, elapsed),
        }
        match polled {
            Ok(PollStatus::Pending(status)) => self.still_pending(chunk, view, &status).await,
            Ok(PollStatus::Done(output)) => {
                metrics::polls_per_batch(view.n_polls + 1);
                tracing::debug!(request_id = %request_id, n_polls = view.n_polls + 1, n_failed = output.n_failed(), "batch finished");
                if view.n_chunks <= 1 && output.n_failed() == 0 {
                    // The common case: one batch, nothing to retry: publish straight from what the poll read,
                    // without storing the output or reading the ledger again.
                    let context = view.single_chunk_context(chunk.index);
                    return self.publish(&chunk.job_id, &context, JobState::Completed, Some(output), None).await;
                }
                let payload = serde_json::to_string(&output).expect("output serialises");
                match self.store.chunk_done(chunk, ChunkState::Done, &payload, self.store.now().await?).await? {
                    Some(0) => self.finish(&chunk.job_id).await,
                    _ => Ok(()),
                }
            }
            Err(error) => self.poll_failed(chunk, view, error).await,
        }
    }

    /// Schedules the next poll of a batch that has not answered yet, whatever status it reports: only the job's
    /// deadline bounds how long it may stay pending. A status the docs do not list is logged once per batch (when
    /// it first appears) and counted at every poll.
    async fn still_pending(
        &self,
        chunk: &ChunkRef,
        view: &ChunkView,
        pending: &PendingStatus,
    ) -> Result<(), StoreError> {
        let status = pending.as_str();
        if !pending.is_documented() {
            metrics::unknown_poll_status();
            if view.remote_status.as_deref() != Some(status) {
                tracing::warn!(
                    job_id = %chunk.job_id,
                    chunk = chunk.index,
                    request_id = view.request_id.as_deref().unwrap_or_default(),
                    status,
                    "the Batch API reports a status its docs do not list; the batch is treated as pending until it \
                     answers or the job's deadline passes"
                );
            }
        }
        let now = self.store.now().await?;
        let delay = poll_delay(view.n_polls + 1, &self.poll, self.events, unit_random());
        // Never sleep past the deadline: the job expires on time.
        let due = (now + delay.as_millis() as u64).min(view.deadline_at);
        self.store
            .update_chunk(
                chunk,
                Some(due),
                Some(field::CHUNK_N_POLLS),
                &[(field::CHUNK_REMOTE_STATUS, status.to_owned()), (field::CHUNK_POLL_FAILURES, "0".to_owned())],
                &[],
            )
            .await?;
        tracing::debug!(status, next_poll_in = ?delay, "batch not finished yet");
        Ok(())
    }

    async fn poll_failed(&self, chunk: &ChunkRef, view: &ChunkView, error: ApiError) -> Result<(), StoreError> {
        let now = self.store.now().await?;
        match error.kind {
            ErrorKind::Transient | ErrorKind::QuotaExhausted => {
                let rate_limited = error.http_status == Some(429);
                let failures = if rate_limited { view.poll_failures } else { view.poll_failures + 1 };
                if failures >= self.retry.max_attempts {
                    return self.chunk_failed(chunk, exhausted(&error, failures)).await;
                }
                let wait = retry_delay(failures.max(1), &self.retry, error.retry_after, unit_random());
                if rate_limited {
                    metrics::throttled_wait(ApiCall::Poll);
                } else {
                    metrics::retry(ApiCall::Poll);
                }
                tracing::warn!(
                    job_id = %chunk.job_id,
                    chunk = chunk.index,
                    error = %error,
                    failures,
                    retry_in = ?wait,
                    "poll failed; retrying"
                );
                let due = (now + wait.as_millis() as u64).min(view.deadline_at);
                self.store
                    .update_chunk(
                        chunk,
                        Some(due),
                        None,
                        &[
                            (field::CHUNK_POLL_FAILURES, failures.to_string()),
                            (field::CHUNK_LAST_ERROR, error.to_job_error().to_json()),
                        ],
                        &[],
                    )
                    .await?;
                Ok(())
            }
            ErrorKind::BatchFailed | ErrorKind::NotFound | ErrorKind::TooLarge | ErrorKind::ReplyTooLarge => {
                tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, "the remote batch failed");
                self.chunk_failed(chunk, error.to_job_error()).await
            }
            ErrorKind::Permanent | ErrorKind::InvalidInput | ErrorKind::NotBatchable => {
                tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, "polling was refused permanently");
                self.conclude(&chunk.job_id, Ending::Failed(error.to_job_error())).await
            }
        }
    }

    /// Records a chunk that cannot finish; the job goes on with its other chunks and ends `failed`, listing it.
    async fn chunk_failed(&self, chunk: &ChunkRef, error: JobError) -> Result<(), StoreError> {
        tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error.message, "batch failed");
        match self.store.chunk_done(chunk, ChunkState::Failed, &error.to_json(), self.store.now().await?).await? {
            Some(0) => self.finish(&chunk.job_id).await,
            _ => Ok(()),
        }
    }

    /// Every chunk has finished: resubmit failed items once if asked to, otherwise publish.
    async fn finish(&self, job_id: &JobId) -> Result<(), StoreError> {
        let Some(context) = self.store.publish_context(job_id).await? else {
            return Ok(());
        };
        if context.chunks.iter().any(|chunk| !matches!(chunk.state, Some(ChunkState::Done | ChunkState::Failed))) {
            return Ok(()); // not every chunk has finished yet
        }
        if context.retry_failed_items && !context.retried && self.retry_failed_items(job_id, &context).await? {
            return Ok(());
        }
        self.conclude_with(job_id, context, Ending::Finished).await
    }

    /// Adds one more round of chunks carrying the items that came back `success:false`; returns whether it did.
    async fn retry_failed_items(&self, job_id: &JobId, context: &PublishContext) -> Result<bool, StoreError> {
        let mut indices = Vec::new();
        let mut requests = Vec::new();
        for chunk in &context.chunks {
            let Some(output) = chunk.output.as_deref().and_then(|text| serde_json::from_str::<JobOutput>(text).ok())
            else {
                continue;
            };
            let failed: Vec<usize> = output.responses.iter().filter(|r| !r.success).map(|r| r.index).collect();
            if failed.is_empty() {
                continue;
            }
            let stored = self.store.chunk_requests(&ChunkRef::new(job_id.clone(), chunk.index)).await?;
            for local in failed {
                if let (Some(index), Some(item)) = (chunk.placement.job_index(local), stored.get(local)) {
                    indices.push(index);
                    requests.push(item.clone());
                }
            }
        }
        if indices.is_empty() {
            return Ok(false);
        }
        let sizes: Vec<usize> = requests.iter().map(|item| item.get().len()).collect();
        let Ok(plan) = plan_chunks(&sizes, self.split.max_payload_bytes, self.split.max_batch_items) else {
            return Ok(false);
        };
        let chunks: Vec<NewChunk> = plan
            .into_iter()
            .map(|(start, len)| NewChunk {
                placement: Placement::Indices(indices[start..start + len].to_vec()),
                requests: requests[start..start + len].to_vec(),
            })
            .collect();
        let n = indices.len();
        match self.store.add_chunks(job_id, self.store.now().await?, None, Some(field::RETRIED), &chunks).await? {
            AddOutcome::Added => {
                tracing::info!(job_id = %job_id, n_items = n, "resubmitting failed items once");
                Ok(true)
            }
            AddOutcome::AlreadyDone | AddOutcome::Gone => Ok(false),
        }
    }

    async fn cancel(&self, job_id: &JobId, reason: &str) -> Result<(), StoreError> {
        let why = if reason.is_empty() || reason == "cancelled" { String::new() } else { format!(" ({reason})") };
        let error = JobError::new(
            code::CANCELLED,
            format!(
                "cancelled on request{why}; the Batch API has no cancel, so batches already submitted keep running \
                 remotely (and may be billed), and their results are discarded"
            ),
        );
        tracing::info!(job_id = %job_id, "job cancelled");
        self.conclude(job_id, Ending::Cancelled(error)).await
    }

    async fn expire(&self, job_id: &JobId, view: &ChunkView, now: UnixMillis) -> Result<(), StoreError> {
        let waited = Duration::from_millis(now.saturating_sub(view.accepted_at));
        let error = JobError::new(
            code::DEADLINE_EXCEEDED,
            format!(
                "the job's deadline passed after {}s before the Batch API finished; batches still running remotely \
                 may complete, but their results are not collected",
                waited.as_secs()
            ),
        );
        tracing::warn!(job_id = %job_id, "job expired");
        self.conclude(job_id, Ending::Expired(error)).await
    }

    /// Ends the job: assembles whatever its chunks produced and publishes the one result entry.
    async fn conclude(&self, job_id: &JobId, ending: Ending) -> Result<(), StoreError> {
        let Some(context) = self.store.publish_context(job_id).await? else {
            return Ok(());
        };
        self.conclude_with(job_id, context, ending).await
    }

    async fn conclude_with(
        &self,
        job_id: &JobId,
        mut context: PublishContext,
        ending: Ending,
    ) -> Result<(), StoreError> {
        let mut chunks = Vec::with_capacity(context.chunks.len());
        for chunk in &mut context.chunks {
            // Each stored output is dropped as soon as it is parsed.
            let output = chunk.output.take();
            let outcome = match chunk.state {
                Some(ChunkState::Done) => match output.as_deref().map(serde_json::from_str::<JobOutput>) {
                    Some(Ok(output)) => ChunkOutcome::Done(output),
                    _ => {
                        return Err(StoreError::Corrupt {
                            job_id: job_id.to_string(),
                            detail: format!("chunk {} is done without a readable output", chunk.index),
                        });
                    }
                },
                Some(ChunkState::Failed) => ChunkOutcome::Failed {
                    error: chunk
                        .last_error
                        .as_deref()
                        .and_then(|text| serde_json::from_str(text).ok())
                        .unwrap_or_else(|| JobError::new(code::API_ERROR, "the batch failed")),
                    request_id: chunk.request_id.clone(),
                },
                _ => ChunkOutcome::Unfinished,
            };
            chunks.push((chunk.index, chunk.placement.clone(), outcome));
        }
        let (state, error, unanswered) = match ending {
            Ending::Finished => (JobState::Completed, None, JobError::new("missing", "no response for this item")),
            Ending::Failed(error) => (JobState::Failed, Some(error.clone()), error),
            Ending::Expired(error) => (JobState::Expired, Some(error.clone()), error),
            Ending::Cancelled(error) => (JobState::Cancelled, Some(error.clone()), error),
        };
        let any_done = chunks.iter().any(|(_, _, outcome)| matches!(outcome, ChunkOutcome::Done(_)));
        let output = assemble(context.n_items, chunks, &unanswered);
        let (state, error) = match (state, error) {
            (JobState::Completed, None) if !output.failed_batches.is_empty() && context.chunks.len() == 1 => {
                (JobState::Failed, Some(output.failed_batches[0].error.clone()))
            }
            (JobState::Completed, None) if !output.failed_batches.is_empty() => {
                let first = &output.failed_batches[0].error;
                let message = format!(
                    "{} of {} batches failed; their items have success:false (first: {})",
                    output.failed_batches.len(),
                    context.chunks.len(),
                    first.message
                );
                (JobState::Failed, Some(JobError { message, ..first.clone() }))
            }
            other => other,
        };
        let include_result = state == JobState::Completed || any_done;
        self.publish(job_id, &context, state, include_result.then_some(output), error).await
    }

    /// Publishes the result entry (exactly once per job, guarded by the ledger state). `output` is left out when
    /// no batch of a job that did not complete had finished.
    async fn publish(
        &self,
        job_id: &JobId,
        context: &PublishContext,
        state: JobState,
        output: Option<JobOutput>,
        error: Option<JobError>,
    ) -> Result<(), StoreError> {
        let status = match state {
            JobState::Completed => ResultStatus::Completed,
            JobState::Expired => ResultStatus::Expired,
            JobState::Cancelled => ResultStatus::Cancelled,
            _ => ResultStatus::Failed,
        };
        let now = self.store.now().await?;
        let entry = ResultEntry {
            job_id: job_id.to_string(),
            status,
            model: context.model.clone(),
            items_total: context.n_items,
            items_failed: output.as_ref().map_or(context.n_items, JobOutput::n_failed),
            result: output,
            error,
            metadata: context.metadata.as_ref().and_then(|text| RawValue::from_string(text.clone()).ok()),
            request_ids: context.chunks.iter().filter_map(|chunk| chunk.request_id.clone()).collect(),
            accepted_at: context.accepted_at,
            finished_at: now,
        };
        let items_failed = entry.items_failed;
        let usage = entry.result.as_ref().map(|output| output.usage.clone());
        if self.store.publish(job_id, entry, state, &context.reply_to, now).await? {
            let turnaround = Duration::from_millis(now.saturating_sub(context.accepted_at));
            metrics::job_finished(status.as_str(), turnaround);
            if let Some(usage) = usage {
                metrics::tokens(&context.model, &usage);
            }
            tracing::info!(
                job_id = %job_id,
                status = %status,
                items_failed,
                turnaround_ms = turnaround.as_millis() as u64,
                "result published"
            );
        }
        Ok(())
    }
}

/// What a failed submit's handling needs besides the error.
#[derive(Debug)]
struct FailedSubmit {
    /// The attempt that failed (1-based).
    attempt: u64,
    /// Where the chunk's items sit in the job.
    placement: Placement,
    /// The job's deadline.
    deadline_at: UnixMillis,
}

/// A refused item's error, as its response carries it: the API's code, message and HTTP status.
fn api_error_item(error: &ApiError) -> Box<RawValue> {
    let job_error = error.to_job_error();
    let text = serde_json::json!({
        "code": job_error.code,
        "message": job_error.message,
        "api_code": job_error.api_code,
        "http_status": job_error.http_status,
    })
    .to_string();
    RawValue::from_string(text).expect("a serialised value is valid JSON")
}

fn exhausted(error: &ApiError, attempts: u64) -> JobError {
    let mut job_error = error.to_job_error();
    job_error.code = code::RETRIES_EXHAUSTED.to_owned();
    job_error.message = format!("gave up after {attempts} attempts; last error: {error}");
    job_error
}
