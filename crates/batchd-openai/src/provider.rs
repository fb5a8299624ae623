//! OpenAI's Batch API as a [`Provider`]: submit = upload the chunk's JSONL, record the file, create the batch
//! tagged with batchd's job, chunk and attempt; poll = retrieve the batch; results = its output and error files
//! joined on `custom_id`; cancel = `POST /batches/{id}/cancel`; clean up = delete the three files.
//!
//! A resumed submit (the engine's resubmit after a crash or an uncertain create) first asks for the batch the
//! ledger names, then looks through the newest batches for one tagged with this chunk, and only then creates one,
//! reusing the recorded input file: an uncertain create is never billed twice. A cancelled job's chunk looks the
//! same way and never creates ([`Provider::find`]).

use std::collections::BTreeMap;
use std::time::Duration;

use batchd_core::{JobId, JobOutput, ModelName, RequestId};
use batchd_provider::{
    ApiError, BatchLimits, BatchTag, Call, CancelOutcome, ErrorKind, FindBatch, Found, PendingStatus, Polled, Provider,
    RateBucket, RemoteBatch, ReplyBudget, ReplyHold, SubmitBatch, Submitted,
};
use futures::future::BoxFuture;

use crate::client::{Client, is_safe_id, multipart};
use crate::error::{self, one_line};
use crate::jsonl::{self, Joiner};
use crate::settings::{DEFAULT_ENDPOINT, OpenAiBuildError, OpenAiClientSettings};
use crate::wire;

/// The routing name: models are `openai/<model>`.
pub const NAME: &str = "openai";

/// Metadata keys of batchd's tag on a batch.
mod tag {
    /// The job id.
    pub const JOB: &str = "batchd_job";
    /// The chunk's index.
    pub const CHUNK: &str = "batchd_chunk";
    /// The submit attempt.
    pub const ATTEMPT: &str = "batchd_attempt";
}

/// The statuses of a batch that is still running (documented).
const PENDING: [&str; 4] = ["validating", "in_progress", "finalizing", "cancelling"];

/// The statuses of a batch whose results are in its files.
const ENDED: [&str; 3] = ["completed", "expired", "cancelled"];

/// The validation error code of the enqueued-token limit (a `failed` batch; "not now", not "never").
const TOKEN_LIMIT: &str = "token_limit_exceeded";

/// OpenAI's Batch API behind the provider seam.
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    /// The API client.
    client: Client,
    /// Limits, rates and clean-up settings.
    settings: OpenAiClientSettings,
}

impl OpenAiProvider {
    /// Builds the provider; result files are counted in `budget` while they are read, when given.
    pub fn new(settings: OpenAiClientSettings, budget: Option<ReplyBudget>) -> Result<Self, OpenAiBuildError> {
        if settings.max_requests == 0 {
            return Err(OpenAiBuildError::InvalidLimit("openai.max_requests"));
        }
        if settings.max_file_bytes == 0 {
            return Err(OpenAiBuildError::InvalidLimit("openai.max_file_bytes"));
        }
        let client = Client::new(&settings, budget)?;
        Ok(Self { client, settings })
    }

    /// The batch an interrupted attempt may have created for chunk `chunk` of `job_id`: the recorded one if it
    /// `stands` for the chunk, else the newest tagged with the chunk that does, among the last `lookup_pages`
    /// pages of batches.
    async fn find_created(
        &self,
        job_id: &JobId,
        chunk: u32,
        resume: &RemoteBatch,
        stands: fn(&wire::Batch) -> bool,
    ) -> Result<Option<wire::Batch>, ApiError> {
        if let Some(id) = &resume.id {
            match self.client.retrieve(id.as_str()).await {
                Ok(batch) if stands(&batch) => return Ok(Some(batch)),
                Ok(_) => {}
                Err(error) if error.kind == ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
        let (job, chunk) = (job_id.as_str(), chunk.to_string());
        let mut after: Option<String> = None;
        for _ in 0..self.settings.lookup_pages.max(1) {
            let page = self.client.list(after.as_deref()).await?;
            let found = page.data.into_iter().find(|batch| {
                let metadata = batch.metadata.as_ref();
                let value = |key: &str| metadata.and_then(|metadata| metadata.get(key)).and_then(|v| v.as_str());
                value(tag::JOB) == Some(job) && value(tag::CHUNK) == Some(chunk.as_str()) && stands(batch)
            });
            if found.is_some() {
                return Ok(found);
            }
            match page.last_id {
                Some(last) if page.has_more => after = Some(last),
                _ => break,
            }
        }
        Ok(None)
    }

    /// Uploads the chunk as a JSONL file; its id.
    async fn upload(&self, batch: &SubmitBatch<'_>, endpoint: &str) -> Result<(String, usize), ApiError> {
        let shape = self.limits().body;
        let capacity = shape.bytes(batch.items.iter().map(|item| item.get().len()));
        let name = format!("batchd-{}-{}.jsonl", batch.tag.job_id, batch.tag.chunk);
        let model = batch.model.remote_name();
        let (body, boundary) = multipart(&name, capacity, |out| jsonl::write_lines(out, batch.items, endpoint, model));
        let bytes = body.len();
        let file = self.client.upload(body, &boundary).await?;
        Ok((file, bytes))
    }

    /// Uploads the chunk and records the file in the ledger (the checkpoint), so a resumed submit reuses it; the
    /// file is deleted again when it cannot be recorded.
    async fn upload_recorded(&self, batch: &SubmitBatch<'_>, endpoint: &str) -> Result<(String, usize), ApiError> {
        let (file, bytes) = self.upload(batch, endpoint).await?;
        let record = RemoteBatch { input_file: Some(file.clone()), ..RemoteBatch::default() };
        if let Err(reason) = batch.checkpoint.record(&record).await {
            self.delete_quietly(&file).await;
            return Err(error::local(ErrorKind::Transient, reason));
        }
        Ok((file, bytes))
    }

    /// Creates the batch of `input_file`, tagged with batchd's job, chunk and attempt in its `metadata`.
    async fn create(&self, tag: &BatchTag<'_>, input_file: &str, endpoint: &str) -> Result<wire::Batch, ApiError> {
        let metadata = BTreeMap::from([
            (tag::JOB, tag.job_id.to_string()),
            (tag::CHUNK, tag.chunk.to_string()),
            (tag::ATTEMPT, tag.attempt.to_string()),
        ]);
        let create = wire::CreateBatch { input_file_id: input_file, endpoint, completion_window: "24h", metadata };
        self.client.create(&create).await
    }

    /// Deletes a file, logging a failure (best effort).
    async fn delete_quietly(&self, file: &str) {
        if let Err(error) = self.client.delete_file(file).await {
            tracing::warn!(file, error = %error, "could not delete a file batchd uploaded to OpenAI");
        }
    }
}

/// Whether a batch found for a resumed submit can stand for this chunk: anything but a failed or cancelled one.
fn usable(batch: &wire::Batch) -> bool {
    batch.id.as_deref().is_some_and(is_safe_id)
        && !matches!(batch.status.as_deref(), Some("failed" | "cancelling" | "cancelled"))
}

/// Whether a batch found for a cancelled job's chunk is its batch: anything but a failed one (which ran nothing).
/// One already cancelling or cancelled is taken too: it holds the responses it finished.
fn ran(batch: &wire::Batch) -> bool {
    batch.id.as_deref().is_some_and(is_safe_id) && batch.status.as_deref() != Some("failed")
}

/// The submit's answer for a created (or found) batch.
fn submitted(batch: wire::Batch, input_file: Option<String>, body_bytes: usize) -> Result<Submitted, ApiError> {
    let id = batch.id.as_deref().and_then(|id| RequestId::parse(id).ok()).ok_or_else(|| ApiError {
        maybe_delivered: true,
        ..error::unreadable(error::Operation::Create, 200, "the batch was created without a usable id", b"")
    })?;
    let input_file = input_file.or(batch.input_file_id).filter(|file| is_safe_id(file));
    Ok(Submitted {
        remote: RemoteBatch { id: Some(id), input_file, ..RemoteBatch::default() },
        status: batch.status.unwrap_or_else(|| "validating".to_owned()),
        body_bytes,
    })
}

/// What a `failed` batch means: the enqueued-token limit is a quota ("not now"), anything else fails the batch.
fn failed_batch(batch: &wire::Batch) -> ApiError {
    let errors = batch.errors.as_ref().map(|errors| errors.data.as_slice()).unwrap_or_default();
    let quota = errors.iter().find(|error| error.code.as_deref() == Some(TOKEN_LIMIT));
    let first = quota.or(errors.first());
    let message = first.map_or_else(
        || "the batch failed without an error".to_owned(),
        |error| {
            let line = error.line.map(|line| format!("input line {line}: ")).unwrap_or_default();
            format!("{line}{}", error.message.as_deref().unwrap_or("no message"))
        },
    );
    let more = errors.len().saturating_sub(1);
    let message = if more > 0 { format!("{message} (and {more} more errors)") } else { message };
    ApiError {
        kind: if quota.is_some() { ErrorKind::QuotaExhausted } else { ErrorKind::BatchFailed },
        http_status: Some(200),
        api_code: first
            .and_then(|error| error.code.as_deref())
            .map(|code| batchd_core::ApiCode::Text(one_line(code, 64))),
        message: one_line(&message, 2048),
        retry_after: None,
        maybe_delivered: false,
    }
}

impl Provider for OpenAiProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn limits(&self) -> BatchLimits {
        BatchLimits {
            max_body_bytes: self.settings.max_file_bytes,
            max_items: Some(self.settings.max_requests),
            body: jsonl::line_shape(self.settings.max_requests),
        }
    }

    fn rate_bucket(&self, model: &ModelName, call: Call) -> Option<RateBucket> {
        if call != Call::Submit {
            return None;
        }
        let name = model.remote_name();
        let per_hour = self
            .settings
            .model_batches_per_hour
            .iter()
            .find(|(model, _)| model == name)
            .map_or(self.settings.batches_per_hour, |(_, limit)| *limit);
        (per_hour > 0).then(|| RateBucket {
            name: format!("{NAME}:{name}"),
            interval: Duration::from_secs(3600).div_f64(f64::from(per_hour)),
            burst: self.settings.burst.max(1),
        })
    }

    fn submit<'a>(&'a self, batch: SubmitBatch<'a>) -> BoxFuture<'a, Result<Submitted, ApiError>> {
        Box::pin(async move {
            let endpoint = batch.endpoint.unwrap_or(DEFAULT_ENDPOINT);
            if !jsonl::ENDPOINTS.contains(&endpoint) {
                return Err(error::local(
                    ErrorKind::Permanent,
                    format!(
                        "the OpenAI Batch API has no endpoint {endpoint:?}; use one of {}",
                        jsonl::ENDPOINTS.join(", ")
                    ),
                ));
            }
            // Until a look answers, an earlier create stays uncertain: a failed look is reported as one that may
            // have created, so the next attempt looks again instead of taking the chunk for a fresh one.
            if let Some(resume) = batch.resume
                && let Some(found) = self
                    .find_created(batch.tag.job_id, batch.tag.chunk, resume, usable)
                    .await
                    .map_err(|error| ApiError { maybe_delivered: true, ..error })?
            {
                tracing::info!(
                    job_id = %batch.tag.job_id,
                    chunk = batch.tag.chunk,
                    batch_id = found.id.as_deref().unwrap_or_default(),
                    "found the batch an interrupted submit created; not creating another"
                );
                return submitted(found, resume.input_file.clone(), 0);
            }
            let reused = batch.resume.and_then(|resume| resume.input_file.clone()).filter(|file| is_safe_id(file));
            let (mut input_file, mut body_bytes) = match &reused {
                Some(file) => (file.clone(), 0),
                None => self.upload_recorded(&batch, endpoint).await?,
            };
            let mut created = self.create(&batch.tag, &input_file, endpoint).await;
            // The recorded file may be gone: a replica that held the chunk before deletes its file when the API
            // certainly refused its create, and it may learn only afterwards that the chunk was taken over (a
            // replica paused past its lease, a Redis outage). Upload it again rather than fail the job.
            if reused.is_some() && matches!(&created, Err(error) if error.http_status == Some(404)) {
                tracing::warn!(
                    job_id = %batch.tag.job_id,
                    chunk = batch.tag.chunk,
                    file = input_file,
                    "the recorded input file is gone; uploading it again"
                );
                (input_file, body_bytes) = self.upload_recorded(&batch, endpoint).await?;
                created = self.create(&batch.tag, &input_file, endpoint).await;
            }
            match created {
                Ok(created) => submitted(created, Some(input_file), body_bytes),
                // The batch may exist: the engine resubmits, and the resumed submit looks before creating.
                Err(error) if error.maybe_delivered => Err(error),
                Err(error) => {
                    // Certainly nothing was created; the next attempt uploads afresh.
                    if self.settings.delete_files {
                        self.delete_quietly(&input_file).await;
                    }
                    Err(error)
                }
            }
        })
    }

    fn poll<'a>(
        &'a self,
        _model: &'a ModelName,
        remote: &'a RemoteBatch,
        _n_items: usize,
    ) -> BoxFuture<'a, Result<(Polled, Vec<ReplyHold>), ApiError>> {
        Box::pin(async move {
            let Some(id) = &remote.id else {
                return Err(error::local(ErrorKind::NotFound, "the chunk records no batch id to poll"));
            };
            let batch = self.client.retrieve(id.as_str()).await?;
            let status = batch.status.clone().unwrap_or_default();
            let polled = match status.as_str() {
                "cancelling" => Polled::Pending(PendingStatus::cancelling("cancelling")),
                status if PENDING.contains(&status) => Polled::Pending(PendingStatus::documented(status)),
                status if ENDED.contains(&status) => Polled::Ready(RemoteBatch {
                    id: Some(id.clone()),
                    input_file: remote.input_file.clone().or(batch.input_file_id).filter(|f| is_safe_id(f)),
                    output_file: batch.output_file_id.filter(|f| is_safe_id(f)),
                    error_file: batch.error_file_id.filter(|f| is_safe_id(f)),
                    results_url: None,
                    tag: remote.tag.clone(),
                }),
                "failed" => return Err(failed_batch(&batch)),
                other => Polled::Pending(PendingStatus::undocumented(other)),
            };
            Ok((polled, Vec::new()))
        })
    }

    fn fetch_results<'a>(
        &'a self,
        _model: &'a ModelName,
        remote: &'a RemoteBatch,
        n_items: usize,
    ) -> BoxFuture<'a, Result<(JobOutput, Vec<ReplyHold>), ApiError>> {
        Box::pin(async move {
            let mut joiner = Joiner::new(n_items);
            let mut held = Vec::new();
            let mut read = 0;
            for file in [&remote.output_file, &remote.error_file].into_iter().flatten() {
                read += self.client.stream_content(file, &mut joiner, read, &mut held).await?;
            }
            let (output, skipped) = joiner.finish();
            if skipped != jsonl::Skipped::default() {
                tracing::warn!(
                    batch_id = remote.id.as_ref().map(RequestId::as_str).unwrap_or_default(),
                    unreadable = skipped.unreadable,
                    unknown = skipped.unknown,
                    repeated = skipped.repeated,
                    "result lines skipped"
                );
            }
            tracing::debug!(result_bytes = read, n_failed = output.n_failed(), "batch results read");
            Ok((output, held))
        })
    }

    fn find<'a>(&'a self, find: FindBatch<'a>) -> BoxFuture<'a, Result<Found, ApiError>> {
        Box::pin(async move {
            // A create is only ever sent for a recorded input file (or after a recorded batch id): with neither,
            // nothing was created.
            if find.resume.id.is_none() && find.resume.input_file.is_none() {
                return Ok(Found::Nothing);
            }
            match self.find_created(find.job_id, find.chunk, find.resume, ran).await? {
                Some(found) => {
                    tracing::info!(
                        job_id = %find.job_id,
                        chunk = find.chunk,
                        batch_id = found.id.as_deref().unwrap_or_default(),
                        status = found.status.as_deref().unwrap_or_default(),
                        "found the batch an interrupted submit created"
                    );
                    Ok(Found::Batch(submitted(found, find.resume.input_file.clone(), 0)?))
                }
                None => Ok(Found::Nothing),
            }
        })
    }

    fn can_cancel(&self) -> bool {
        true
    }

    fn cancel<'a>(
        &'a self,
        _model: &'a ModelName,
        remote: &'a RemoteBatch,
    ) -> BoxFuture<'a, Result<CancelOutcome, ApiError>> {
        Box::pin(async move {
            let Some(id) = &remote.id else {
                return Ok(CancelOutcome::Requested);
            };
            match self.client.cancel(id.as_str()).await {
                Ok(_) => Ok(CancelOutcome::Requested),
                // Already ended (400 "Cannot cancel a batch with status ...") or gone: nothing left to cancel.
                Err(error) if matches!(error.http_status, Some(400 | 404 | 409)) => Ok(CancelOutcome::Requested),
                Err(error) => Err(error),
            }
        })
    }

    fn clean_up<'a>(&'a self, remote: &'a RemoteBatch) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            if !self.settings.delete_files {
                return Ok(());
            }
            let mut last = Ok(());
            for file in [&remote.input_file, &remote.output_file, &remote.error_file].into_iter().flatten() {
                if let Err(error) = self.client.delete_file(file).await {
                    last = Err(error);
                }
            }
            last
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(json: &str) -> wire::Batch {
        serde_json::from_str(json).expect("batch")
    }

    #[test]
    fn the_token_limit_is_a_quota_and_other_validation_failures_fail_the_batch() {
        let limited = batch(
            r#"{"id":"batch_1","status":"failed","errors":{"object":"list","data":[{"code":"token_limit_exceeded","message":"Enqueued token limit reached","line":null}]}}"#,
        );
        let error = failed_batch(&limited);
        assert_eq!(error.kind, ErrorKind::QuotaExhausted);
        assert!(error.kind.is_throttle());
        let invalid = batch(
            r#"{"id":"batch_2","status":"failed","errors":{"data":[{"code":"invalid_json_line","message":"bad","line":3},{"code":"x","message":"y","line":4}]}}"#,
        );
        let error = failed_batch(&invalid);
        assert_eq!(error.kind, ErrorKind::BatchFailed);
        assert_eq!(error.message, "input line 3: bad (and 1 more errors)");
        assert_eq!(error.api_code, Some(batchd_core::ApiCode::Text("invalid_json_line".into())));
        assert_eq!(failed_batch(&batch(r#"{"status":"failed"}"#)).kind, ErrorKind::BatchFailed);
    }

    #[test]
    fn only_a_live_or_ended_batch_stands_for_a_resumed_submit() {
        assert!(usable(&batch(r#"{"id":"batch_1","status":"in_progress"}"#)));
        assert!(usable(&batch(r#"{"id":"batch_1","status":"completed"}"#)));
        assert!(!usable(&batch(r#"{"id":"batch_1","status":"failed"}"#)));
        assert!(!usable(&batch(r#"{"id":"batch_1","status":"cancelled"}"#)));
        assert!(!usable(&batch(r#"{"id":"../x","status":"in_progress"}"#)));
    }
}
