//! OpenAI's Batch API as a [`Provider`]: submit = upload the chunk's JSONL, record the file, create the batch
//! tagged with batchd's job, chunk and attempt; poll = retrieve the batch; results = its output and error files
//! joined on `custom_id`; cancel = `POST /batches/{id}/cancel`; clean up = delete the three files.
//!
//! A resumed submit (the engine's resubmit after a crash or an uncertain create) first asks for the batch the
//! ledger names, then looks through the newest batches for one that is provably this chunk's, and only then
//! creates one, reusing the recorded input file: an uncertain create is never billed twice. Provably: the batch
//! was created from the input file this chunk uploaded and recorded, and carries the nonce recorded with that file
//! (and the namespace), so a batch another namespace or deployment made for the same job id on the same account is
//! never adopted. A cancelled job's chunk looks the same way and never creates ([`Provider::find`]).

use std::collections::BTreeMap;
use std::time::Duration;

use batchd_core::{JobId, JobOutput, ModelName, RequestId};
use batchd_provider::{
    ApiError, BatchLimits, BatchTag, Call, CancelOutcome, ErrorKind, FindBatch, Found, InputLimit, PendingStatus,
    Polled, Provider, RateBucket, RemoteBatch, ReplyBudget, ReplyHold, SubmitBatch, Submitted, create_nonce, is_nonce,
};
use futures::future::BoxFuture;

use crate::client::{Client, is_safe_id, multipart};
use crate::error::{self, one_line};
use crate::jsonl::{self, Joiner};
use crate::pacing::{OverLimit, Reservation, TokenPacer, estimate_tokens};
use crate::settings::{DEFAULT_ENDPOINT, FILE_EXPIRY_SECS, OpenAiBuildError, OpenAiClientSettings};
use crate::wire;

/// The built-in instance's routing name: models are `openai/<model>` (a named instance's are `<name>/<model>`).
pub const NAME: &str = "openai";

/// Metadata keys of batchd's tag on a batch.
mod tag {
    /// The namespace.
    pub const NAMESPACE: &str = "batchd_ns";
    /// The job id.
    pub const JOB: &str = "batchd_job";
    /// The chunk's index.
    pub const CHUNK: &str = "batchd_chunk";
    /// The submit attempt.
    pub const ATTEMPT: &str = "batchd_attempt";
    /// The chunk's create nonce, recorded in its ledger with its input file before the first create.
    pub const NONCE: &str = "batchd_nonce";
}

/// What makes a listed batch this chunk's: the chunk's tag, the input file it uploaded and recorded, and the nonce
/// recorded with that file. A ledger of an earlier release records no nonce: its recorded input file, uploaded by
/// this chunk and unique to the account, is then the proof.
#[derive(Debug, Clone, Copy)]
struct Ours<'a> {
    /// The namespace.
    namespace: &'a str,
    /// The job id.
    job: &'a str,
    /// The chunk's index.
    chunk: u32,
    /// The recorded input file.
    input_file: &'a str,
    /// The recorded nonce, if the ledger holds one.
    nonce: Option<&'a str>,
}

impl Ours<'_> {
    /// Whether `batch` carries every mark of this chunk.
    fn carried_by(&self, batch: &wire::Batch) -> bool {
        let metadata = batch.metadata.as_ref();
        let value = |key: &str| metadata.and_then(|metadata| metadata.get(key)).and_then(|value| value.as_str());
        let chunk = self.chunk.to_string();
        let tagged = value(tag::JOB) == Some(self.job) && value(tag::CHUNK) == Some(chunk.as_str());
        let same_file = batch.input_file_id.as_deref() == Some(self.input_file);
        let same_nonce = match self.nonce {
            Some(nonce) => value(tag::NONCE) == Some(nonce) && value(tag::NAMESPACE) == Some(self.namespace),
            None => true,
        };
        tagged && same_file && same_nonce
    }
}

/// The statuses of a batch that is still running (documented).
const PENDING: [&str; 4] = ["validating", "in_progress", "finalizing", "cancelling"];

/// The statuses of a batch whose results are in its files.
const ENDED: [&str; 3] = ["completed", "expired", "cancelled"];

/// Whether a batch of this status has ended (its enqueued tokens are no longer counted).
fn has_ended(status: &str) -> bool {
    ENDED.contains(&status) || status == "failed"
}

/// The validation error code of the enqueued-token limit (a `failed` batch; "not now", not "never").
const TOKEN_LIMIT: &str = "token_limit_exceeded";

/// How long a create waits for room under a model's enqueued-token limit before it asks again (a lower bound of
/// the engine's backoff).
const PACING_WAIT: Duration = Duration::from_secs(5);

/// Most counted batches asked about (retrieved) before a create is made to wait for room under a token limit.
const MAX_PACING_LOOKS: usize = 20;

/// OpenAI's Batch API behind the provider seam.
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    /// The API client.
    client: Client,
    /// Limits, rates and clean-up settings.
    settings: OpenAiClientSettings,
    /// The enqueued tokens of this replica's running batches, per paced model.
    pacer: TokenPacer,
}

impl OpenAiProvider {
    /// Builds the provider; result files are counted in `budget` while they are read, when given.
    pub fn new(settings: OpenAiClientSettings, budget: Option<ReplyBudget>) -> Result<Self, OpenAiBuildError> {
        if settings.max_requests == 0 {
            return Err(OpenAiBuildError::InvalidLimit("max_requests"));
        }
        if settings.max_file_bytes == 0 {
            return Err(OpenAiBuildError::InvalidLimit("max_file_bytes"));
        }
        if settings.file_expiry_secs != 0 && !FILE_EXPIRY_SECS.contains(&settings.file_expiry_secs) {
            return Err(OpenAiBuildError::InvalidLimit("file_expiry_secs"));
        }
        let client = Client::new(&settings, budget)?;
        let pacer = TokenPacer::new(&settings.enqueued_token_limits);
        Ok(Self { client, settings, pacer })
    }

    /// Counts a create of `tokens` for `model` under its enqueued-token limit, when it is paced: the batches
    /// counted for it that may have ended (seen by another replica's poll) are asked about first. A batch that
    /// alone is over the limit is split (when it can be); one that does not fit now waits, using no attempt.
    async fn reserve_tokens(&self, model: &str, tokens: u64, n_items: usize) -> Result<Option<Reservation>, ApiError> {
        let Some(limit) = self.pacer.limit(model) else {
            return Ok(None);
        };
        if tokens > limit && n_items > 1 {
            return Err(error::local(
                ErrorKind::TooLarge,
                format!(
                    "the batch's estimated {tokens} input tokens are over {model}'s enqueued-token limit of {limit} \
                     ({})",
                    self.settings.setting("enqueued_token_limits")
                ),
            ));
        }
        if let Some(Ok(reservation)) = self.pacer.reserve(model, tokens) {
            return Ok(Some(reservation));
        }
        for id in self.pacer.counted_batches(model).into_iter().take(MAX_PACING_LOOKS) {
            match self.client.retrieve(&id).await {
                Ok(batch) if has_ended(batch.status.as_deref().unwrap_or_default()) => self.pacer.ended(&id),
                Err(error) if error.kind == ErrorKind::NotFound => self.pacer.ended(&id),
                _ => {}
            }
        }
        match self.pacer.reserve(model, tokens) {
            Some(Ok(reservation)) => Ok(Some(reservation)),
            Some(Err(OverLimit { enqueued, tokens, limit })) => Err(ApiError {
                retry_after: Some(PACING_WAIT),
                ..error::local(
                    ErrorKind::QuotaExhausted,
                    format!(
                        "waiting for room under {model}'s enqueued-token limit of {limit} ({}): batches of an \
                         estimated {enqueued} input tokens are running, this one needs {tokens}",
                        self.settings.setting("enqueued_token_limits")
                    ),
                )
            }),
            None => Ok(None),
        }
    }

    /// The batch an interrupted attempt may have created for chunk `chunk` of `job_id`: the recorded one if it
    /// `stands` for the chunk, else the newest that is provably the chunk's ([`Ours`]) and stands, among the last
    /// `lookup_pages` pages of batches. A chunk without a recorded input file created nothing (a create is only
    /// ever sent for a recorded file), so nothing is listed for it.
    async fn find_created(
        &self,
        namespace: &str,
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
        let Some(input_file) = resume.input_file.as_deref() else {
            return Ok(None);
        };
        let ours = Ours { namespace, job: job_id.as_str(), chunk, input_file, nonce: recorded_nonce(resume) };
        let mut after: Option<String> = None;
        for _ in 0..self.settings.lookup_pages.max(1) {
            let page = self.client.list(after.as_deref()).await?;
            let found = page.data.into_iter().find(|batch| ours.carried_by(batch) && stands(batch));
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
        let expiry = self.settings.file_expiry_secs;
        let (body, boundary) = multipart(&self.settings.file_purpose, &name, expiry, capacity, |out| {
            jsonl::write_lines(out, batch.items, endpoint, model)
        });
        let bytes = body.len();
        let file = self.client.upload(body, &boundary).await?;
        Ok((file, bytes))
    }

    /// Uploads the chunk and records the file with the chunk's create nonce in the ledger (the checkpoint), so a
    /// resumed submit reuses both; the file is deleted again when it cannot be recorded.
    async fn upload_recorded(
        &self,
        batch: &SubmitBatch<'_>,
        endpoint: &str,
        nonce: &str,
    ) -> Result<(String, usize), ApiError> {
        let (file, bytes) = self.upload(batch, endpoint).await?;
        if let Err(error) = record_file(batch, &file, nonce).await {
            self.delete_quietly(&file).await;
            return Err(error);
        }
        Ok((file, bytes))
    }

    /// Creates the batch of `input_file`, tagged with batchd's namespace, job, chunk, attempt and the chunk's
    /// create nonce in its `metadata`.
    async fn create(
        &self,
        tag: &BatchTag<'_>,
        input_file: &str,
        endpoint: &str,
        nonce: &str,
    ) -> Result<wire::Batch, ApiError> {
        let metadata = BTreeMap::from([
            (tag::NAMESPACE, tag.namespace.to_owned()),
            (tag::JOB, tag.job_id.to_string()),
            (tag::CHUNK, tag.chunk.to_string()),
            (tag::ATTEMPT, tag.attempt.to_string()),
            (tag::NONCE, nonce.to_owned()),
        ]);
        let output_expires_after = (self.settings.file_expiry_secs > 0)
            .then_some(wire::Expiry { anchor: "created_at", seconds: self.settings.file_expiry_secs });
        let create = wire::CreateBatch {
            input_file_id: input_file,
            endpoint,
            completion_window: self.settings.completion_window.as_deref(),
            metadata,
            output_expires_after,
        };
        self.client.create(&create).await
    }

    /// The longest configured endpoint, in bytes (the default's when none is longer).
    fn longest_endpoint(&self) -> usize {
        let default = DEFAULT_ENDPOINT.len();
        self.settings.endpoints.iter().map(String::len).max().unwrap_or(default).max(default)
    }

    /// Deletes a file, logging a failure (best effort).
    async fn delete_quietly(&self, file: &str) {
        if let Err(error) = self.client.delete_file(file).await {
            tracing::warn!(file, error = %error, "could not delete a file batchd uploaded to OpenAI");
        }
    }
}

/// Records the chunk's input file and create nonce in its ledger, before any create that uses them.
async fn record_file(batch: &SubmitBatch<'_>, file: &str, nonce: &str) -> Result<(), ApiError> {
    let record =
        RemoteBatch { input_file: Some(file.to_owned()), tag: Some(nonce.to_owned()), ..RemoteBatch::default() };
    batch.checkpoint.record(&record).await.map_err(|reason| error::local(ErrorKind::Transient, reason))
}

/// The create nonce a ledger records for the chunk, if it holds one batchd wrote.
fn recorded_nonce(resume: &RemoteBatch) -> Option<&str> {
    resume.tag.as_deref().filter(|tag| is_nonce(tag))
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

/// The submit's answer for a created (or found) batch; `nonce` is the chunk's create nonce.
fn submitted(
    batch: wire::Batch,
    input_file: Option<String>,
    nonce: Option<&str>,
    body_bytes: usize,
) -> Result<Submitted, ApiError> {
    let id = batch.id.as_deref().and_then(|id| RequestId::parse(id).ok()).ok_or_else(|| ApiError {
        maybe_delivered: true,
        ..error::unreadable(error::Operation::Create, 200, "the batch was created without a usable id", b"")
    })?;
    let input_file = input_file.or(batch.input_file_id).filter(|file| is_safe_id(file));
    Ok(Submitted {
        remote: RemoteBatch { id: Some(id), input_file, tag: nonce.map(str::to_owned), ..RemoteBatch::default() },
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
        self.settings.name
    }

    fn limits(&self) -> BatchLimits {
        BatchLimits {
            max_body_bytes: self.settings.max_file_bytes,
            max_items: Some(self.settings.max_requests),
            body: jsonl::line_shape(self.settings.max_requests, self.longest_endpoint()),
        }
    }

    fn input_limit(&self, _model: &ModelName, endpoint: Option<&str>) -> Option<InputLimit> {
        (endpoint == Some(jsonl::EMBEDDINGS))
            .then_some(InputLimit { max_inputs: jsonl::MAX_EMBEDDING_INPUTS, inputs_of: jsonl::embedding_inputs })
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
        (per_hour > 0).then(|| {
            let interval = Duration::from_secs(3600).div_f64(f64::from(per_hour));
            RateBucket::new(&self.settings.account, name, interval, self.settings.burst.max(1))
        })
    }

    fn submit<'a>(&'a self, batch: SubmitBatch<'a>) -> BoxFuture<'a, Result<Submitted, ApiError>> {
        Box::pin(async move {
            let endpoint = batch.endpoint.unwrap_or(DEFAULT_ENDPOINT);
            if !self.settings.endpoints.iter().any(|known| known == endpoint) {
                return Err(error::local(
                    ErrorKind::Permanent,
                    format!(
                        "the OpenAI Batch API has no endpoint {endpoint:?}; use one of {} ({})",
                        self.settings.endpoints.join(", "),
                        self.settings.setting("endpoints")
                    ),
                ));
            }
            if endpoint == jsonl::EMBEDDINGS && batch.items.len() > 1 {
                let inputs: usize = batch.items.iter().map(|item| jsonl::embedding_inputs(item)).sum();
                if inputs > jsonl::MAX_EMBEDDING_INPUTS {
                    // Planned under the limit at take-in; a pack or a resend may still go over it: split, not sent.
                    return Err(error::local(
                        ErrorKind::TooLarge,
                        format!(
                            "the batch holds {inputs} embedding inputs, over the API's {} per batch",
                            jsonl::MAX_EMBEDDING_INPUTS
                        ),
                    ));
                }
            }
            let model = batch.model.remote_name();
            let tokens = estimate_tokens(batch.items.iter().map(|item| item.get().len()));
            // Until a look answers, an earlier create stays uncertain: a failed look is reported as one that may
            // have created, so the next attempt looks again instead of taking the chunk for a fresh one.
            if let Some(resume) = batch.resume
                && let Some(found) = self
                    .find_created(batch.tag.namespace, batch.tag.job_id, batch.tag.chunk, resume, usable)
                    .await
                    .map_err(ApiError::into_failed_look)?
            {
                tracing::info!(
                    job_id = %batch.tag.job_id,
                    chunk = batch.tag.chunk,
                    batch_id = found.id.as_deref().unwrap_or_default(),
                    "found the batch an interrupted submit created; not creating another"
                );
                if let Some(id) =
                    found.id.as_deref().filter(|_| !has_ended(found.status.as_deref().unwrap_or_default()))
                {
                    self.pacer.count_found(id, model, tokens);
                }
                return submitted(found, resume.input_file.clone(), recorded_nonce(resume), 0);
            }
            // Room under the model's enqueued-token limit is taken before anything is uploaded or created.
            let reservation = self.reserve_tokens(model, tokens, batch.items.len()).await?;
            // One nonce for every create of the chunk, recorded before the first: a look-up after any of them
            // recognises the batch it made.
            let recorded = batch.resume.and_then(recorded_nonce);
            let nonce = recorded.map_or_else(create_nonce, str::to_owned);
            let reused = batch.resume.and_then(|resume| resume.input_file.clone()).filter(|file| is_safe_id(file));
            let (mut input_file, mut body_bytes) = match &reused {
                Some(file) => {
                    if recorded.is_none() {
                        // A file an earlier release recorded without a nonce: the nonce is recorded before the create.
                        record_file(&batch, file, &nonce).await?;
                    }
                    (file.clone(), 0)
                }
                None => self.upload_recorded(&batch, endpoint, &nonce).await?,
            };
            let mut created = self.create(&batch.tag, &input_file, endpoint, &nonce).await;
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
                (input_file, body_bytes) = self.upload_recorded(&batch, endpoint, &nonce).await?;
                created = self.create(&batch.tag, &input_file, endpoint, &nonce).await;
            }
            match created {
                Ok(created) => {
                    if let (Some(reservation), Some(id)) = (reservation, created.id.as_deref()) {
                        reservation.created(id);
                    }
                    submitted(created, Some(input_file), Some(&nonce), body_bytes)
                }
                // The batch may exist: the engine resubmits, and the resumed submit looks before creating.
                Err(error) if error.maybe_delivered => Err(error),
                // A resumed attempt (an earlier create's outcome unknown) leaves the chunk `submitting`, and the next
                // attempt creates from the file recorded for it: keep it. Deleting it made that create name a deleted
                // file (404), and under OpenAI's creation limit (burst 1) the 404 used the one create the limit
                // allowed, so the create after a new upload was refused again, for ever (bench scenario 9).
                Err(error) if batch.resume.is_some() => Err(error),
                Err(error) => {
                    // Certainly nothing was created; the chunk goes back to `pending` and its next attempt uploads
                    // afresh.
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
            if has_ended(&status) {
                self.pacer.ended(id.as_str());
            }
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
            let (mut held, mut held_bytes) = (Vec::new(), 0);
            let mut read = 0;
            for file in [&remote.output_file, &remote.error_file].into_iter().flatten() {
                read += self.client.stream_content(file, &mut joiner, read, &mut held, &mut held_bytes).await?;
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
            match self.find_created(find.namespace, find.job_id, find.chunk, find.resume, ran).await? {
                Some(found) => {
                    tracing::info!(
                        job_id = %find.job_id,
                        chunk = find.chunk,
                        batch_id = found.id.as_deref().unwrap_or_default(),
                        status = found.status.as_deref().unwrap_or_default(),
                        "found the batch an interrupted submit created"
                    );
                    Ok(Found::Batch(submitted(found, find.resume.input_file.clone(), recorded_nonce(find.resume), 0)?))
                }
                None => Ok(Found::Nothing),
            }
        })
    }

    fn capabilities(&self) -> batchd_provider::Capabilities {
        // The window is the instance's: Groq's may be up to 7 days; without one the vendor documents none.
        let window = self.settings.completion_window.as_deref().and_then(crate::settings::completion_window);
        batchd_provider::Capabilities { window, ..crate::registration::CAPABILITIES }
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
            // A batch whose outcome was not stored (its results too large or unreadable, a job that ended first)
            // has its files named by the batch, not the ledger: asked for once.
            let mut remote = remote.clone();
            if let Some(id) = remote.id.as_ref().filter(|_| remote.output_file.is_none() && remote.error_file.is_none())
            {
                let batch = self.client.retrieve(id.as_str()).await?;
                remote.output_file = batch.output_file_id.filter(|file| is_safe_id(file));
                remote.error_file = batch.error_file_id.filter(|file| is_safe_id(file));
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
    fn a_listed_batch_is_the_chunks_only_with_its_file_nonce_and_namespace() {
        let ours =
            Ours { namespace: "a", job: "inv-42", chunk: 0, input_file: "file-a", nonce: Some("00ff00ff00ff00ff") };
        let listed = |file: &str, ns: &str, nonce: &str, chunk: &str| {
            batch(&format!(
                r#"{{"id":"batch_1","status":"in_progress","input_file_id":"{file}","metadata":{{"batchd_ns":"{ns}",
                "batchd_job":"inv-42","batchd_chunk":"{chunk}","batchd_attempt":"1","batchd_nonce":"{nonce}"}}}}"#
            ))
        };
        assert!(ours.carried_by(&listed("file-a", "a", "00ff00ff00ff00ff", "0")));
        // The same job id in another namespace on the same account: another file, another nonce.
        assert!(!ours.carried_by(&listed("file-b", "b", "1234123412341234", "0")));
        // Each mark on its own is required.
        assert!(!ours.carried_by(&listed("file-b", "a", "00ff00ff00ff00ff", "0")), "another file");
        assert!(!ours.carried_by(&listed("file-a", "a", "1234123412341234", "0")), "another nonce");
        assert!(!ours.carried_by(&listed("file-a", "b", "00ff00ff00ff00ff", "0")), "another namespace");
        assert!(!ours.carried_by(&listed("file-a", "a", "00ff00ff00ff00ff", "1")), "another chunk");
        assert!(!ours.carried_by(&batch(r#"{"id":"batch_1","input_file_id":"file-a"}"#)), "no tag");
        // A ledger of an earlier release records no nonce: the file it recorded is the proof.
        let earlier = Ours { nonce: None, ..ours };
        let untagged =
            batch(r#"{"id":"batch_1","input_file_id":"file-a","metadata":{"batchd_job":"inv-42","batchd_chunk":"0"}}"#);
        assert!(earlier.carried_by(&untagged));
        assert!(!earlier.carried_by(&listed("file-b", "b", "1234123412341234", "0")));
    }

    #[test]
    fn statuses_are_read_whatever_their_case_and_windows_in_hours_or_days() {
        assert_eq!(batch(r#"{"id":"b","status":"COMPLETED"}"#).status.as_deref(), Some("completed"));
        assert_eq!(batch(r#"{"id":"b","status":"In_Progress"}"#).status.as_deref(), Some("in_progress"));
        assert_eq!(batch(r#"{"id":"b","status":null}"#).status, None);
        let window = crate::settings::completion_window;
        assert_eq!(window("24h"), Some(Duration::from_secs(24 * 3600)));
        assert_eq!(window("7d"), Some(Duration::from_secs(7 * 86_400)));
        for refused in ["", "h", "0h", "24", "24m", "-1d", "1.5d"] {
            assert_eq!(window(refused), None, "{refused:?}");
        }
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
