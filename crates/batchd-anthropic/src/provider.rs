//! Anthropic Message Batches as a [`Provider`]: a chunk is one create of `{custom_id, params}` requests, polled
//! until `ended`, its results streamed from `results_url` and joined on `custom_id`; cancel is real, and an ended
//! batch is deleted once its results are stored (`delete_batches`). Before each create the chunk's mark (with its
//! random nonce) and the time are recorded, so a resubmit after an uncertain create looks for the batch that
//! create may have made (`lookup.rs`) before creating again, adopting only one whose custom ids carry the nonce,
//! and a cancelled job's chunk looks the same way without creating.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use batchd_core::{JobOutput, ModelName, RequestId};
use batchd_provider::{
    ApiError, BatchLimits, Call, CancelOutcome, ErrorKind, FindBatch, Found, MAX_REMOTE_REF_LEN, PendingStatus, Polled,
    Provider, RateBucket, RemoteBatch, ReplyBudget, ReplyHold, SubmitBatch, Submitted, create_nonce,
};
use futures::future::BoxFuture;

use crate::client::{self, Client};
use crate::lookup::{self, Check, Choice, Listed};
use crate::results::Join;
use crate::settings::{AnthropicSettings, BuildError, MAX_BODY_BYTES, MAX_REQUESTS};
use crate::wire::{self, BODY_SHAPE, CreateMark, MessageBatch};

/// The routing name: models are `anthropic/<model>`.
pub const NAME: &str = "anthropic";

/// Message Batches behind the provider seam.
#[derive(Debug, Clone)]
pub struct AnthropicProvider {
    /// The instance's routing name.
    name: &'static str,
    /// The HTTP client.
    client: Client,
    /// What one batch may hold.
    limits: BatchLimits,
    /// The shared pacing of API calls, if any.
    bucket: Option<RateBucket>,
    /// Where results downloads are counted.
    budget: Option<ReplyBudget>,
    /// Whether ended batches are deleted once their results are stored.
    delete_batches: bool,
}

impl AnthropicProvider {
    /// Checks the settings and builds the provider.
    pub fn new(settings: &AnthropicSettings) -> Result<Self, BuildError> {
        if !(1..=MAX_BODY_BYTES).contains(&settings.max_body_bytes) || settings.max_body_bytes < 1024 {
            return Err(BuildError::InvalidLimit(format!("max_body_bytes: must be 1024-{MAX_BODY_BYTES}")));
        }
        if !(1..=MAX_REQUESTS).contains(&settings.max_requests) {
            return Err(BuildError::InvalidLimit(format!("max_requests: must be 1-{MAX_REQUESTS}")));
        }
        let bucket = (settings.requests_per_minute > 0).then(|| {
            let interval = Duration::from_secs(60).div_f64(f64::from(settings.requests_per_minute));
            let workspace = settings.workspace_id.as_deref().unwrap_or("default");
            RateBucket::new(&settings.account, workspace, interval, settings.burst.max(1))
        });
        Ok(Self {
            name: settings.name,
            client: Client::new(settings)?,
            limits: BatchLimits {
                max_body_bytes: settings.max_body_bytes,
                max_items: Some(settings.max_requests),
                body: BODY_SHAPE,
            },
            bucket,
            budget: None,
            delete_batches: settings.delete_batches,
        })
    }

    /// Counts results downloads against the engine's memory budget while they are read.
    pub fn with_reply_budget(mut self, budget: ReplyBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Looks for the batch an earlier, uncertain create of this chunk may have made (see `lookup.rs`).
    async fn look_for(&self, mark: &CreateMark, n_items: usize) -> Result<Look, ApiError> {
        let from_ms = mark.started_ms.saturating_sub(lookup::CLOCK_MARGIN_MS);
        let to_ms = mark.last_ms.saturating_add(lookup::CLOCK_MARGIN_MS);
        let mut candidates = Vec::new();
        let mut after_id: Option<String> = None;
        let mut reached_window_start = false;
        for _ in 0..lookup::MAX_PAGES {
            let reply = self.client.list(after_id.as_deref(), lookup::PAGE_SIZE).await?;
            let Some((batches, has_more, last_id)) = wire::BatchPage::read(&reply) else {
                return Err(client::unreadable(client::Call::Other, 200, "the batch list is not a list of batches"));
            };
            for batch in batches {
                match lookup::consider(batch, from_ms, to_ms, n_items) {
                    Listed::Older => reached_window_start = true,
                    Listed::Other => {}
                    Listed::Candidate(candidate) => candidates.push(candidate),
                }
                if reached_window_start {
                    break;
                }
            }
            if reached_window_start || !has_more || last_id.is_none() {
                reached_window_start = true;
                break;
            }
            after_id = last_id;
        }
        if !reached_window_start {
            tracing::warn!(
                chunk = mark.chunk.as_str(),
                "more than 1,000 batches since the uncertain create; looked at the newest only"
            );
        }
        let worth_reading = lookup::to_check(&candidates, mark.started_ms, mark.last_ms);
        let mut checks = Vec::with_capacity(candidates.len());
        for (index, candidate) in candidates.iter().enumerate() {
            let check = if worth_reading.contains(&index) {
                match self.client.first_custom_id(&candidate.id, candidate.results_url.as_deref()).await {
                    Some(custom_id) if mark.chunk.index_of(&custom_id).is_some() => Check::Ours,
                    Some(_) => Check::Foreign,
                    None => Check::Unknown,
                }
            } else if candidate.ended {
                Check::Unread
            } else {
                Check::Running
            };
            checks.push(check);
        }
        match lookup::choose(&checks) {
            Choice::Adopt { index } => {
                let found = &candidates[index];
                tracing::info!(
                    chunk = mark.chunk.as_str(),
                    batch_id = found.id,
                    "found the batch an uncertain create made (its custom ids carry the chunk's nonce); not creating another"
                );
                Ok(Look::Found { id: found.id.clone(), status: found.status.clone() })
            }
            Choice::Create => Ok(Look::Nothing),
            Choice::Wait(n) => {
                tracing::info!(
                    chunk = mark.chunk.as_str(),
                    n_candidates = n,
                    "batches that may be the one an uncertain create made are still running; looking again once they have ended"
                );
                Ok(Look::Wait(n))
            }
            Choice::Ambiguous(n) => {
                tracing::warn!(
                    chunk = mark.chunk.as_str(),
                    n_candidates = n,
                    "ended batches that could be the one an uncertain create made could not be checked; none is taken for it (a resumed submit creates again: a possible duplicate)"
                );
                Ok(Look::Nothing)
            }
        }
    }

    /// The mark an earlier create of this chunk recorded (an earlier release's too), if the ledger holds one.
    fn earlier_mark(resume: Option<&RemoteBatch>, chunk: u32) -> Option<CreateMark> {
        resume
            .and_then(|remote| remote.tag.as_deref())
            .and_then(CreateMark::parse)
            .filter(|mark| mark.chunk.chunk() == Some(chunk))
    }

    /// The create itself: the body, the request, the batch's id.
    async fn create(&self, batch: &SubmitBatch<'_>, mark: &CreateMark) -> Result<Submitted, ApiError> {
        let body = wire::create_body(batch.items, batch.model.remote_name(), &mark.chunk, batch.tag.attempt)
            .map_err(|bad| refusal(ErrorKind::InvalidInput, bad.message()))?;
        let body_bytes = body.len();
        let reply = self.client.create(body).await?;
        let created = MessageBatch::read(&reply);
        let Some(id) = created.as_ref().and_then(|batch| batch.id.as_deref()).and_then(|id| RequestId::parse(id).ok())
        else {
            return Err(client::unreadable(client::Call::Create, 200, "the create reply names no batch id"));
        };
        let status = created.and_then(|batch| batch.processing_status).unwrap_or_else(|| "in_progress".to_owned());
        Ok(Submitted {
            remote: RemoteBatch { id: Some(id), tag: Some(mark.to_tag()), ..RemoteBatch::default() },
            status: PendingStatus::documented(&status).as_str().to_owned(),
            body_bytes,
        })
    }

    fn batch_id(remote: &RemoteBatch) -> Result<&RequestId, ApiError> {
        remote.id.as_ref().ok_or_else(|| refusal(ErrorKind::NotFound, "the chunk records no batch id".to_owned()))
    }
}

/// What a look for an uncertain create's batch concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Look {
    /// This batch carries the chunk's mark.
    Found {
        /// Its id.
        id: String,
        /// Its `processing_status`.
        status: String,
    },
    /// No batch is provably the chunk's.
    Nothing,
    /// These many candidates still run and cannot be checked yet.
    Wait(usize),
}

/// The submit's (or look's) answer while candidates of an uncertain create still run: wait, using no attempt.
fn awaiting(n_candidates: usize) -> ApiError {
    refusal(
        ErrorKind::AwaitingLookUp,
        format!(
            "{n_candidates} batch(es) of this chunk's size, created while its create's outcome was unknown, are still \
             running; their custom ids can be checked only once they end, so batchd looks again then instead of \
             creating a second batch"
        ),
    )
}

/// The submit's answer for the batch a look found (`id`, `status`), marked with `mark`.
fn found(id: &str, status: &str, mark: &CreateMark) -> Result<Submitted, ApiError> {
    let id = RequestId::parse(id).map_err(|error| refusal(ErrorKind::Transient, error.to_string()))?;
    Ok(Submitted {
        remote: RemoteBatch { id: Some(id), tag: Some(mark.to_tag()), ..RemoteBatch::default() },
        status: PendingStatus::documented(status).as_str().to_owned(),
        body_bytes: 0,
    })
}

/// An error batchd itself decided on (nothing was sent, or nothing more is to be sent).
fn refusal(kind: ErrorKind, message: String) -> ApiError {
    ApiError { kind, http_status: None, api_code: None, message, retry_after: None, maybe_delivered: false }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(0))
}

impl Provider for AnthropicProvider {
    fn name(&self) -> &'static str {
        self.name
    }

    fn limits(&self) -> BatchLimits {
        self.limits
    }

    fn check_model(&self, model: &ModelName) -> Result<(), String> {
        let remote = model.remote_name();
        let valid = !remote.is_empty()
            && remote
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'@' | b':'));
        if valid {
            Ok(())
        } else {
            Err(format!("{model} is not an Anthropic model name (anthropic/<model>, e.g. anthropic/claude-sonnet-4-5)"))
        }
    }

    fn rate_bucket(&self, _model: &ModelName, _call: Call) -> Option<RateBucket> {
        self.bucket.clone()
    }

    fn submit<'a>(&'a self, batch: SubmitBatch<'a>) -> BoxFuture<'a, Result<Submitted, ApiError>> {
        Box::pin(async move {
            // A batch id already recorded is the chunk's batch.
            if let Some(remote) = batch.resume.filter(|remote| remote.id.is_some()) {
                return Ok(Submitted { remote: remote.clone(), status: "in_progress".to_owned(), body_bytes: 0 });
            }
            let mark = match Self::earlier_mark(batch.resume, batch.tag.chunk) {
                Some(mark) if mark.chunk.is_provable() => {
                    // An earlier create of this chunk may have made its batch: look before creating again. Until
                    // the look answers, the earlier create stays uncertain.
                    match self.look_for(&mark, batch.items.len()).await {
                        Ok(Look::Found { id, status }) => return found(&id, &status, &mark),
                        Ok(Look::Wait(n)) => return Err(awaiting(n)),
                        Ok(Look::Nothing) => mark.again(now_ms()),
                        Err(error) => return Err(error.into_failed_look()),
                    }
                }
                Some(earlier) => {
                    tracing::warn!(
                        chunk = earlier.chunk.as_str(),
                        "an earlier release recorded this chunk's uncertain create without a nonce, so no batch found \
                         can be proved to be its own; creating again (a possible duplicate)"
                    );
                    CreateMark::first(&create_nonce(), batch.tag.chunk, now_ms())
                }
                None => CreateMark::first(&create_nonce(), batch.tag.chunk, now_ms()),
            };
            // Recorded before every create, so a look after it reads the batches created up to it.
            let record = RemoteBatch { tag: Some(mark.to_tag()), ..RemoteBatch::default() };
            batch.checkpoint.record(&record).await.map_err(|message| refusal(ErrorKind::Transient, message))?;
            self.create(&batch, &mark).await
        })
    }

    fn poll<'a>(
        &'a self,
        _model: &'a ModelName,
        remote: &'a RemoteBatch,
        _n_items: usize,
    ) -> BoxFuture<'a, Result<(Polled, Vec<ReplyHold>), ApiError>> {
        Box::pin(async move {
            let id = Self::batch_id(remote)?;
            let reply = self.client.retrieve(id.as_str()).await?;
            let batch = MessageBatch::read(&reply).unwrap_or_default();
            let polled = match batch.processing_status.as_deref() {
                Some("ended") => {
                    let results_url = batch.results_url.filter(|url| url.len() <= MAX_REMOTE_REF_LEN);
                    Polled::Ready(RemoteBatch { results_url, ..remote.clone() })
                }
                Some("in_progress") => Polled::Pending(PendingStatus::documented("in_progress")),
                Some("canceling") => Polled::Pending(PendingStatus::cancelling("canceling")),
                Some(other) => Polled::Pending(PendingStatus::undocumented(other)),
                None => Polled::Pending(PendingStatus::undocumented("unreadable")),
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
            let id = Self::batch_id(remote)?;
            let Some(mark) = remote.tag.as_deref().and_then(CreateMark::parse) else {
                return Err(refusal(
                    ErrorKind::BatchFailed,
                    "the chunk records no custom-id mark, so its results cannot be joined".to_owned(),
                ));
            };
            let url = self.client.results_url(id.as_str(), remote.results_url.as_deref());
            let mut join = Join::new(mark.chunk.clone(), n_items);
            let held = self.client.results(url, self.budget.as_ref(), |line| join.add_line(line)).await?;
            let skipped = join.skipped;
            if skipped != crate::results::Skipped::default() {
                tracing::warn!(batch_id = %id, ?skipped, "result lines skipped");
            }
            match join.finish() {
                Ok(output) => Ok((output, held)),
                Err(foreign) => Err(refusal(
                    ErrorKind::BatchFailed,
                    format!(
                        "batch {id} holds another chunk's requests ({} result lines), so it was not this chunk's \
                         (found after an uncertain create)",
                        foreign.foreign
                    ),
                )),
            }
        })
    }

    fn find<'a>(&'a self, find: FindBatch<'a>) -> BoxFuture<'a, Result<Found, ApiError>> {
        Box::pin(async move {
            // A batch id already recorded is the chunk's batch.
            if find.resume.id.is_some() {
                return Ok(Found::Batch(Submitted {
                    remote: find.resume.clone(),
                    status: "in_progress".to_owned(),
                    body_bytes: 0,
                }));
            }
            // A create is only ever sent after its mark is recorded: without one, nothing was created. A batch that
            // does not carry the chunk's nonce is not this chunk's to cancel (it may be another namespace's).
            let Some(mark) = Self::earlier_mark(Some(find.resume), find.chunk) else {
                return Ok(Found::Nothing);
            };
            if !mark.chunk.is_provable() {
                tracing::warn!(
                    chunk = mark.chunk.as_str(),
                    "an earlier release recorded this chunk's create without a nonce; no batch found can be proved to be its own, so none is cancelled"
                );
                return Ok(Found::Nothing);
            }
            match self.look_for(&mark, find.n_items).await? {
                Look::Found { id, status } => Ok(Found::Batch(found(&id, &status, &mark)?)),
                Look::Nothing => Ok(Found::Nothing),
                Look::Wait(n) => Err(awaiting(n)),
            }
        })
    }

    fn capabilities(&self) -> batchd_provider::Capabilities {
        crate::registration::CAPABILITIES
    }

    fn cancel<'a>(
        &'a self,
        _model: &'a ModelName,
        remote: &'a RemoteBatch,
    ) -> BoxFuture<'a, Result<CancelOutcome, ApiError>> {
        Box::pin(async move {
            let id = Self::batch_id(remote)?;
            match self.client.cancel(id.as_str()).await {
                Ok(_) => Ok(CancelOutcome::Requested),
                // Refused as already ended: its results come through the poll all the same.
                Err(error) if error.http_status == Some(400) => {
                    tracing::debug!(batch_id = %id, error = %error, "cancel refused; the batch has likely ended");
                    Ok(CancelOutcome::Requested)
                }
                Err(error) => Err(error),
            }
        })
    }

    fn clean_up<'a>(&'a self, remote: &'a RemoteBatch) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let Some(id) = remote.id.as_ref().filter(|_| self.delete_batches) else {
                return Ok(());
            };
            match self.client.delete(id.as_str()).await {
                Ok(_) => Ok(()),
                // Deleted already (by an earlier attempt, or by hand).
                Err(error) if error.kind == ErrorKind::NotFound => Ok(()),
                Err(error) => Err(error),
            }
        })
    }
}
