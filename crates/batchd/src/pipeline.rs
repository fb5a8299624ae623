//! The job's path through batchd: take an ingress entry in, submit its chunks, poll them, publish one result.
//!
//! Both apalis handlers live here. Every "retry or give up" decision is made in this module, from the variant of
//! the API error, and every step ends in one atomic storage transition, so a crash at any point leaves a state
//! the next replica resumes from.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tracing::Instrument;

use apalis_core::error::BoxDynError;
use apalis_core::task::data::Data;
use batchd_cloudflare::{ApiError, BatchClient, ErrorKind, PollStatus};
use batchd_core::ledger::field;
use batchd_core::result::code;
use batchd_core::{
    ChunkRef, ChunkState, DecodeError, Job, JobError, JobId, JobLimits, JobOutput, JobState, ModelName,
    RequestId, ResultEntry, ResultStatus, UnixMillis,
};
use batchd_queue::ingress::IngressEntry;
use batchd_queue::{now_ms, Accepted, ChunkView, DeadLetter, Store, StoreError, SubmitTicket};

use crate::metrics::{self, ApiCall};
use crate::policy::{merge_outputs, next_poll_delay, plan_chunks, retry_delay};
use crate::settings::{PollSettings, RetrySettings};

/// Everything the handlers share.
#[derive(Debug)]
pub struct Pipeline {
    /// Redis storage of the namespace.
    pub store: Store,
    /// The Batch API client.
    pub client: BatchClient,
    /// Poll timing.
    pub poll: PollSettings,
    /// Retry policy for transient errors.
    pub retry: RetrySettings,
    /// Limits applied when decoding jobs.
    pub limits: JobLimits,
    /// Deadline of jobs that set none.
    pub default_deadline: Duration,
    /// Lease held on a chunk while this replica works on it.
    pub lease: Duration,
}

fn unit_random() -> f64 {
    rand::random::<f64>()
}

/// apalis handler of the submit worker: one ingress entry.
pub async fn handle_entry(entry: IngressEntry, pipeline: Data<Arc<Pipeline>>) -> Result<(), BoxDynError> {
    match AssertUnwindSafe(pipeline.take_in(&entry)).catch_unwind().await {
        Ok(Ok(())) => {}
        // The entry stays pending in the consumer group and is reclaimed after `ingress.reclaim_idle_secs`.
        Ok(Err(error)) => {
            metrics::redis_error("take_in");
            tracing::error!(entry_id = %entry.id, error = %error, "could not take in ingress entry; it will be retried");
        }
        Err(_) => tracing::error!(entry_id = %entry.id, "panic while taking in ingress entry; it will be retried"),
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
        // The chunk keeps its lease score and becomes due again when the lease ends.
        Ok(Err(StoreError::Corrupt { job_id, detail })) => {
            // Retrying cannot help a ledger batchd did not write; take it off the schedule and say so.
            tracing::error!(job_id = %job_id, detail = %detail, "ledger is corrupt; the chunk is dropped from the schedule");
            drop_member(&pipeline.store, &member).await;
        }
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
    /// Decodes an ingress entry and accepts it as a job (or rejects it with a result that says why),
    /// then submits its first chunk straight away.
    #[tracing::instrument(skip_all, fields(entry_id = %entry.id, job_id = tracing::field::Empty))]
    pub async fn take_in(&self, entry: &IngressEntry) -> Result<(), StoreError> {
        let now = now_ms();
        let job = match Job::decode(&entry.fields, &entry.id, &self.limits, self.store.keys()) {
            Ok(job) => job,
            Err(error) => return self.reject(entry, error, now).await,
        };
        tracing::Span::current().record("job_id", tracing::field::display(&job.id));
        let plan = plan_chunks(job.requests.len(), None);
        let deadline = job.deadline_secs.map(Duration::from_secs).unwrap_or(self.default_deadline);
        let deadline_at = now + deadline.as_millis() as u64;
        let first_due = now + self.lease.as_millis() as u64;
        match self.store.accept(&job, &entry.id, &plan, now, deadline_at, first_due).await? {
            Accepted::New => {
                metrics::job_accepted();
                tracing::info!(model = %job.model, n_items = job.requests.len(), n_chunks = plan.len(), "job accepted");
                self.submit(&ChunkRef::new(job.id.clone(), 0), true).await
            }
            Accepted::Duplicate { state } => {
                metrics::job_duplicate();
                tracing::warn!(
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
                let job_id = JobId::parse(&entry.id).map_err(|e| StoreError::Corrupt {
                    job_id: entry.id.clone(),
                    detail: e.to_string(),
                })?;
                let dead = DeadLetter { fields: entry.fields.clone(), reason: reason.clone() };
                (job_id, JobError::new(code::INVALID_ENTRY, reason.clone()), Some(dead))
            }
            DecodeError::Invalid { job_id, .. } => {
                (job_id.clone(), JobError::new(code::INVALID_JOB, error.to_string()), None)
            }
        };
        let model = model_hint(entry);
        let published = self.store.reject(&entry.id, &job_id, &model, &job_error, dead.as_ref(), now).await?;
        if published {
            metrics::job_rejected(if dead.is_some() { code::INVALID_ENTRY } else { code::INVALID_JOB });
            tracing::warn!(job_id = %job_id, error = %job_error.message, dead_lettered = dead.is_some(), "job rejected");
        } else {
            metrics::job_duplicate();
            tracing::warn!(job_id = %job_id, "rejected entry repeats an existing job id; acknowledged only");
        }
        Ok(())
    }

    /// Does whatever the chunk's ledger says is next: submit, poll, or finish an interrupted publish.
    #[tracing::instrument(skip_all, fields(job_id = %chunk.job_id, chunk = chunk.index))]
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
        let now = now_ms();
        if now >= view.deadline_at {
            return self.expire(chunk, &view, now).await;
        }
        match view.chunk_state {
            ChunkState::Pending | ChunkState::Submitting => self.submit(chunk, true).await,
            ChunkState::Polling => self.poll(chunk, &view).await,
            ChunkState::Done | ChunkState::Failed => self.finish(&chunk.job_id, None).await,
        }
    }

    /// Submits one chunk: mark `submitting`, POST, then record the request id and schedule the first poll.
    async fn submit(&self, chunk: &ChunkRef, count_attempt: bool) -> Result<(), StoreError> {
        let now = now_ms();
        let (attempt, resubmit, job_json, (start, len)) = match self.store.begin_submit(chunk, now, count_attempt).await? {
            SubmitTicket::Go { attempt, resubmit, job_json, items } => (attempt, resubmit, job_json, items),
            SubmitTicket::Skip { chunk_state } => {
                tracing::debug!(chunk_state = %chunk_state, "chunk already submitted");
                return Ok(());
            }
            SubmitTicket::Gone => return Ok(()),
        };
        if resubmit {
            metrics::possible_duplicate_submit();
            tracing::warn!(
                job_id = %chunk.job_id,
                chunk = chunk.index,
                attempt,
                "resubmitting a chunk whose previous submit was interrupted; the remote batch may be duplicated"
            );
        }
        let job = match Job::decode_json(&job_json, chunk.job_id.as_str(), &JobLimits::default(), self.store.keys()) {
            Ok(job) if start + len <= job.requests.len() => job,
            _ => {
                let error = JobError::new(code::INVALID_JOB, "the stored job cannot be read back; the ledger is corrupt");
                return self.fail(chunk, error, now).await;
            }
        };
        let items = &job.requests[start..start + len];
        let span = tracing::info_span!("submit", model = %job.model, attempt, request_id = tracing::field::Empty);
        let started = std::time::Instant::now();
        let submitted = self.client.submit(&job.model, items).instrument(span.clone()).await;
        match &submitted {
            Ok(_) => metrics::api_request(ApiCall::Submit, "ok", Some(200), started.elapsed()),
            Err(error) => metrics::api_request(ApiCall::Submit, error.kind.as_str(), error.http_status, started.elapsed()),
        }
        match submitted {
            Ok(submitted) => {
                span.record("request_id", tracing::field::display(&submitted.request_id));
                let now = now_ms();
                let due = now + next_poll_delay(0, &self.poll, unit_random()).as_millis() as u64;
                let recorded = self
                    .store
                    .update_chunk(
                        chunk,
                        Some(due),
                        None,
                        &[
                            (field::CHUNK_STATE, ChunkState::Polling.as_str().to_owned()),
                            (field::CHUNK_REQUEST_ID, submitted.request_id.to_string()),
                            (field::CHUNK_SUBMITTED_AT, now.to_string()),
                            (field::CHUNK_REMOTE_STATUS, "queued".to_owned()),
                        ],
                        &[(field::STATE, JobState::Running.as_str().to_owned()), (field::UPDATED_AT, now.to_string())],
                    )
                    .await?;
                tracing::info!(
                    parent: &span,
                    request_id = %submitted.request_id,
                    n_items = len,
                    bytes = submitted.body_bytes,
                    recorded,
                    "batch submitted"
                );
                Ok(())
            }
            Err(error) => self.submit_failed(chunk, &job.model, attempt, error).await,
        }
    }

    async fn submit_failed(&self, chunk: &ChunkRef, model: &ModelName, attempt: u64, error: ApiError) -> Result<(), StoreError> {
        let now = now_ms();
        let rate_limited = error.http_status == Some(429);
        if !error.is_retryable() {
            tracing::warn!(model = %model, error = %error, "the Batch API refused the batch");
            return self.fail(chunk, error.to_job_error(), now).await;
        }
        if !rate_limited && attempt >= self.retry.max_attempts {
            return self.fail(chunk, exhausted(&error, attempt), now).await;
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
        }
        if rate_limited {
            metrics::throttled_wait(ApiCall::Submit);
        } else {
            metrics::retry(ApiCall::Submit);
        }
        tracing::warn!(model = %model, attempt, error = %error, retry_in = ?wait, "submit failed; retrying");
        self.store.update_chunk(chunk, Some(now + wait.as_millis() as u64), None, &fields, &[]).await?;
        Ok(())
    }

    /// Polls one chunk's remote batch.
    async fn poll(&self, chunk: &ChunkRef, view: &ChunkView) -> Result<(), StoreError> {
        let (Some(request_id), Ok(model)) = (
            view.request_id.as_deref().and_then(|id| RequestId::parse(id).ok()),
            ModelName::parse(&view.model),
        ) else {
            let error = JobError::new(code::INVALID_JOB, "the ledger lost the chunk's request id or model");
            return self.fail(chunk, error, now_ms()).await;
        };
        let span = tracing::info_span!("poll", request_id = %request_id, model = %model, n_polls = view.n_polls);
        let started = std::time::Instant::now();
        let polled = self.client.poll(&model, &request_id, view.items_len).instrument(span).await;
        let elapsed = started.elapsed();
        match &polled {
            Ok(PollStatus::Done(_)) => metrics::api_request(ApiCall::Poll, "done", Some(200), elapsed),
            Ok(_) => metrics::api_request(ApiCall::Poll, "pending", Some(200), elapsed),
            Err(error) => metrics::api_request(ApiCall::Poll, error.kind.as_str(), error.http_status, elapsed),
        }
        match polled {
            Ok(PollStatus::Queued) => self.still_pending(chunk, view, "queued").await,
            Ok(PollStatus::Running) => self.still_pending(chunk, view, "running").await,
            Ok(PollStatus::Done(output)) => {
                tracing::info!(n_polls = view.n_polls + 1, n_failed = output.n_failed(), "batch finished");
                self.chunk_finished(chunk, view, output).await
            }
            Err(error) => self.poll_failed(chunk, view, error).await,
        }
    }

    async fn still_pending(&self, chunk: &ChunkRef, view: &ChunkView, status: &str) -> Result<(), StoreError> {
        let now = now_ms();
        let delay = next_poll_delay(view.n_polls + 1, &self.poll, unit_random());
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
        let now = now_ms();
        match error.kind {
            ErrorKind::Transient | ErrorKind::QuotaExhausted => {
                let rate_limited = error.http_status == Some(429);
                let failures = if rate_limited { view.poll_failures } else { view.poll_failures + 1 };
                if failures >= self.retry.max_attempts {
                    return self.fail(chunk, exhausted(&error, failures), now).await;
                }
                let wait = retry_delay(failures.max(1), &self.retry, error.retry_after, unit_random());
                if rate_limited {
                    metrics::throttled_wait(ApiCall::Poll);
                } else {
                    metrics::retry(ApiCall::Poll);
                }
                tracing::warn!(error = %error, failures, retry_in = ?wait, "poll failed; retrying");
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
            _ => {
                tracing::warn!(error = %error, "polling failed permanently");
                self.fail(chunk, error.to_job_error(), now).await
            }
        }
    }

    /// Stores a finished chunk; when it was the last open one, publishes the job's result.
    async fn chunk_finished(&self, chunk: &ChunkRef, view: &ChunkView, output: JobOutput) -> Result<(), StoreError> {
        if view.n_chunks <= 1 {
            return self.finish(&chunk.job_id, Some(output)).await;
        }
        let payload = serde_json::to_string(&output).expect("output serialises");
        match self.store.chunk_done(chunk, ChunkState::Done, &payload, now_ms()).await? {
            Some(0) => self.finish(&chunk.job_id, None).await,
            _ => Ok(()),
        }
    }

    /// Ends the job `failed` with `error`, recording the chunk as failed.
    async fn fail(&self, chunk: &ChunkRef, error: JobError, now: UnixMillis) -> Result<(), StoreError> {
        self.store.chunk_done(chunk, ChunkState::Failed, &error.to_json(), now).await?;
        self.publish_failure(&chunk.job_id, ResultStatus::Failed, error).await
    }

    async fn expire(&self, chunk: &ChunkRef, view: &ChunkView, now: UnixMillis) -> Result<(), StoreError> {
        let waited = Duration::from_millis(now.saturating_sub(view.accepted_at));
        let error = JobError::new(
            code::DEADLINE_EXCEEDED,
            format!(
                "the job's deadline passed after {}s before the Batch API finished; a remote batch may still \
                 complete, but its results are not collected",
                waited.as_secs()
            ),
        );
        tracing::warn!(job_id = %chunk.job_id, "job expired");
        self.publish_failure(&chunk.job_id, ResultStatus::Expired, error).await
    }

    /// Publishes a `failed` or `expired` result for the whole job.
    async fn publish_failure(&self, job_id: &JobId, status: ResultStatus, error: JobError) -> Result<(), StoreError> {
        let Some(context) = self.store.publish_context(job_id).await? else {
            return Ok(());
        };
        let now = now_ms();
        let entry = ResultEntry {
            job_id: job_id.to_string(),
            status,
            model: context.model.clone(),
            result: None,
            error: Some(error),
            metadata: metadata(&context.metadata),
            request_ids: context.chunks.iter().filter_map(|chunk| chunk.request_id.clone()).collect(),
            accepted_at: context.accepted_at,
            finished_at: now,
            items_total: context.n_items,
            items_failed: context.n_items,
        };
        let state = if status == ResultStatus::Expired { JobState::Expired } else { JobState::Failed };
        let published = self.store.publish(job_id, &entry, state, &context.reply_to, now).await?;
        if published {
            metrics::job_finished(status.as_str(), Duration::from_millis(now.saturating_sub(context.accepted_at)));
            tracing::info!(job_id = %job_id, status = %status, "result published");
        }
        Ok(())
    }

    /// Publishes the completed result once every chunk is done. `single` is the output of a one-chunk job,
    /// passed directly instead of through the ledger.
    async fn finish(&self, job_id: &JobId, single: Option<JobOutput>) -> Result<(), StoreError> {
        let Some(context) = self.store.publish_context(job_id).await? else {
            return Ok(());
        };
        if let Some(failed) = context.chunks.iter().find(|chunk| chunk.state == Some(ChunkState::Failed)) {
            let error = failed
                .last_error
                .as_deref()
                .and_then(|text| serde_json::from_str::<JobError>(text).ok())
                .unwrap_or_else(|| JobError::new(code::API_ERROR, "a batch of this job failed"));
            return self.publish_failure(job_id, ResultStatus::Failed, error).await;
        }
        let output = match single {
            Some(output) => output,
            None => {
                let mut parts = Vec::with_capacity(context.chunks.len());
                for chunk in &context.chunks {
                    let Some(text) = chunk.output.as_deref() else {
                        return Ok(()); // not every chunk is done yet
                    };
                    let output: JobOutput = serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
                        job_id: job_id.to_string(),
                        detail: format!("stored chunk output: {e}"),
                    })?;
                    parts.push((chunk.items_start, output));
                }
                merge_outputs(parts)
            }
        };
        let now = now_ms();
        let entry = ResultEntry {
            job_id: job_id.to_string(),
            status: ResultStatus::Completed,
            model: context.model.clone(),
            items_failed: output.n_failed(),
            items_total: context.n_items,
            result: Some(output),
            error: None,
            metadata: metadata(&context.metadata),
            request_ids: context.chunks.iter().filter_map(|chunk| chunk.request_id.clone()).collect(),
            accepted_at: context.accepted_at,
            finished_at: now,
        };
        if self.store.publish(job_id, &entry, JobState::Completed, &context.reply_to, now).await? {
            metrics::job_finished("completed", Duration::from_millis(now.saturating_sub(context.accepted_at)));
            tracing::info!(
                job_id = %job_id,
                items_failed = entry.items_failed,
                turnaround_ms = now.saturating_sub(context.accepted_at),
                "result published"
            );
        }
        Ok(())
    }
}

fn exhausted(error: &ApiError, attempts: u64) -> JobError {
    let mut job_error = error.to_job_error();
    job_error.code = code::RETRIES_EXHAUSTED.to_owned();
    job_error.message = format!("gave up after {attempts} attempts; last error: {error}");
    job_error
}

fn metadata(raw: &Option<String>) -> Option<Box<serde_json::value::RawValue>> {
    raw.as_ref().and_then(|text| serde_json::value::RawValue::from_string(text.clone()).ok())
}

/// The model named by an entry that failed validation, when it can be read, for the failure result.
fn model_hint(entry: &IngressEntry) -> String {
    entry
        .fields
        .iter()
        .find(|(name, _)| name == batchd_core::job::JOB_FIELD)
        .and_then(|(_, raw)| serde_json::from_slice::<serde_json::Value>(raw).ok())
        .and_then(|job| job.get("model").and_then(|model| model.as_str()).map(str::to_owned))
        .filter(|model| ModelName::parse(model).is_ok())
        .unwrap_or_default()
}
