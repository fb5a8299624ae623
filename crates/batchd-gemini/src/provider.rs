//! Gemini Batch Mode as a [`Provider`]: a chunk is one `batchGenerateContent` create, its requests inline under
//! the inline limit, else a JSONL file uploaded through the Files API and recorded first; polled until it ends;
//! responses read from the finished operation (inline) or its responses file, joined on each request's key;
//! cancel is real; an ended batch and its files are deleted once its results are stored (`delete_batches`).
//!
//! Before each create the chunk's nonce (and its uploaded file) is recorded in the ledger, and the batch's display
//! name carries the nonce: a resumed submit after an uncertain create (a lost reply, a 5xx, a replica killed) lists
//! the batches and adopts only one whose display name is this chunk's with this nonce, and only then creates; a
//! cancelled job's chunk looks the same way and never creates ([`Provider::find`]).

use std::time::Duration;

use batchd_core::{JobOutput, ModelName, RequestId};
use batchd_provider::{
    ApiError, BatchLimits, Call, CancelOutcome, ErrorKind, FindBatch, Found, MAX_REMOTE_REF_LEN, PendingStatus, Polled,
    Provider, RateBucket, RemoteBatch, ReplyBudget, ReplyHold, SubmitBatch, Submitted, create_nonce, is_nonce,
};
use futures::future::BoxFuture;

use crate::client::{self, Client, is_resource};
use crate::settings::{BuildError, GeminiSettings};
use crate::wire::{self, BODY_SHAPE, Join, Operation, Responses, State};

/// The routing name: models are `gemini/<model>`.
pub const NAME: &str = "gemini";

/// The one endpoint a Gemini batch runs: each request is a `GenerateContentRequest`.
const ENDPOINT: &str = "generateContent";

/// Batches per page of the list read by a look-up.
const PAGE_SIZE: u32 = 100;

/// Gemini Batch Mode behind the provider seam.
#[derive(Debug, Clone)]
pub struct GeminiProvider {
    /// The instance's routing name.
    name: &'static str,
    /// The HTTP client.
    client: Client,
    /// What one batch may hold.
    limits: BatchLimits,
    /// Largest inline create body; larger chunks go through a file.
    max_inline_bytes: usize,
    /// The shared pacing of creates, if any.
    bucket: Option<RateBucket>,
    /// Where big replies are counted.
    budget: Option<ReplyBudget>,
    /// Pages of the list a look-up reads.
    lookup_pages: u32,
    /// Whether ended batches and their files are deleted once their results are stored.
    delete_batches: bool,
}

impl GeminiProvider {
    /// Builds the provider (its limits as the settings give them; see [`GeminiProvider::with_inflight_bytes`]).
    pub fn new(settings: &GeminiSettings) -> Result<Self, BuildError> {
        let bucket = (settings.batches_per_minute > 0).then(|| {
            let interval = Duration::from_secs(60).div_f64(f64::from(settings.batches_per_minute));
            RateBucket::new(&settings.account, "create", interval, settings.burst.max(1))
        });
        Ok(Self {
            name: settings.name,
            client: Client::new(settings)?,
            limits: BatchLimits {
                max_body_bytes: settings.max_file_bytes,
                max_items: Some(settings.max_requests),
                body: BODY_SHAPE,
            },
            max_inline_bytes: settings.max_inline_bytes,
            bucket,
            budget: None,
            lookup_pages: settings.lookup_pages,
            delete_batches: settings.delete_batches,
        })
    }

    /// Counts big replies (finished batches, responses files) against the engine's memory budget while read.
    pub fn with_reply_budget(mut self, budget: ReplyBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Bounds one batch's body by a quarter of the bytes one process may hold in flight (a submit holds its items
    /// and the body built from them); 0 leaves the limit as it is.
    pub fn with_inflight_bytes(mut self, inflight_bytes: usize) -> Self {
        if inflight_bytes > 0 {
            self.limits.max_body_bytes = self.limits.max_body_bytes.min(inflight_bytes / 4).max(1);
        }
        self
    }

    /// The batch an uncertain create of the chunk made, if the list holds one whose display name is `display_name`
    /// (which carries the chunk's nonce) and that `stands`.
    async fn look_for(&self, display_name: &str, stands: fn(State) -> bool) -> Result<Option<Operation>, ApiError> {
        let mut token: Option<String> = None;
        for _ in 0..self.lookup_pages.max(1) {
            let reply = self.client.list(token.as_deref(), PAGE_SIZE).await?;
            let Ok(page) = serde_json::from_slice::<wire::Page>(&reply) else {
                return Err(client::unreadable(client::Call::Other, 200, "the batch list is not a list of batches"));
            };
            let found = page.operations.into_iter().find(|operation| {
                operation.display_name() == Some(display_name)
                    && operation.name().is_some_and(|name| is_resource(name, "batches"))
                    && stands(operation.state())
            });
            if found.is_some() {
                return Ok(found);
            }
            match page.next_page_token.filter(|token| !token.is_empty() && token.len() <= MAX_REMOTE_REF_LEN) {
                Some(next) => token = Some(next),
                None => return Ok(None),
            }
        }
        tracing::warn!(
            display_name,
            pages = self.lookup_pages,
            "the batch an uncertain create may have made is not among the newest batches read (gemini.lookup_pages)"
        );
        Ok(None)
    }

    /// Uploads the chunk as a JSONL file and records it with the nonce (deleting it again when it cannot be
    /// recorded); its name and size.
    async fn upload_recorded(
        &self,
        batch: &SubmitBatch<'_>,
        display_name: &str,
        nonce: &str,
    ) -> Result<(String, usize), ApiError> {
        let lines = wire::file_lines(batch.items)
            .map_err(|bad| ApiError::decided(ErrorKind::InvalidInput, not_an_object(bad)))?;
        let bytes = lines.len();
        let file = self.client.upload(display_name, lines).await?;
        if let Err(error) = record(batch, nonce, Some(&file)).await {
            self.delete_quietly(&file).await;
            return Err(error);
        }
        Ok((file, bytes))
    }

    /// Deletes a batch or file batchd made, logging a failure (best effort).
    async fn delete_quietly(&self, name: &str) {
        match self.client.delete(name).await {
            Ok(_) => {}
            Err(error) if error.kind == ErrorKind::NotFound => {}
            Err(error) => tracing::warn!(name, error = %error, "could not delete what batchd made at Gemini"),
        }
    }
}

/// Records the chunk's create nonce (and its uploaded file) in its ledger, before any create that uses them.
async fn record(batch: &SubmitBatch<'_>, nonce: &str, file: Option<&str>) -> Result<(), ApiError> {
    let record =
        RemoteBatch { tag: Some(nonce.to_owned()), input_file: file.map(str::to_owned), ..RemoteBatch::default() };
    batch.checkpoint.record(&record).await.map_err(|message| ApiError::decided(ErrorKind::Transient, message))
}

/// The create nonce a ledger records for the chunk, if it holds one batchd wrote.
fn recorded_nonce(resume: Option<&RemoteBatch>) -> Option<&str> {
    resume.and_then(|resume| resume.tag.as_deref()).filter(|tag| is_nonce(tag))
}

/// Whether a batch found for a resumed submit can stand for the chunk: any but a failed or cancelled one.
fn usable(state: State) -> bool {
    !matches!(state, State::Failed | State::Cancelled | State::Cancelling)
}

/// Whether a batch found for a cancelled job's chunk is its batch: any but a failed one (which ran nothing); one
/// cancelled already holds the responses it finished.
fn ran(state: State) -> bool {
    state != State::Failed
}

/// The submit's answer for a created or found batch.
fn submitted(
    operation: &Operation,
    nonce: &str,
    input_file: Option<String>,
    body_bytes: usize,
) -> Result<Submitted, ApiError> {
    let id = operation.name().filter(|name| is_resource(name, "batches")).and_then(|name| RequestId::parse(name).ok());
    let Some(id) = id else {
        return Err(client::unreadable(client::Call::Create, 200, "the create reply names no batch"));
    };
    let status = operation.state_text().unwrap_or("BATCH_STATE_PENDING");
    Ok(Submitted {
        remote: RemoteBatch { id: Some(id), input_file, tag: Some(nonce.to_owned()), ..RemoteBatch::default() },
        status: PendingStatus::documented(status).as_str().to_owned(),
        body_bytes,
    })
}

fn not_an_object(bad: wire::NotAnObject) -> String {
    format!("/requests/{}: a Gemini request item must be a GenerateContentRequest object", bad.0)
}

fn batch_id(remote: &RemoteBatch) -> Result<&str, ApiError> {
    remote
        .id
        .as_ref()
        .map(RequestId::as_str)
        .filter(|id| is_resource(id, "batches"))
        .ok_or_else(|| ApiError::decided(ErrorKind::NotFound, "the chunk records no Gemini batch name".to_owned()))
}

impl Provider for GeminiProvider {
    fn name(&self) -> &'static str {
        self.name
    }

    fn limits(&self) -> BatchLimits {
        self.limits
    }

    fn capabilities(&self) -> batchd_provider::Capabilities {
        crate::registration::CAPABILITIES
    }

    fn check_model(&self, model: &ModelName) -> Result<(), String> {
        let remote = model.remote_name();
        let valid = !remote.is_empty()
            && remote.len() <= 128
            && remote.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_'));
        if valid {
            Ok(())
        } else {
            Err(format!("{model} is not a Gemini model name (gemini/<model>, e.g. gemini/gemini-2.5-flash)"))
        }
    }

    fn rate_bucket(&self, _model: &ModelName, call: Call) -> Option<RateBucket> {
        (call == Call::Submit).then(|| self.bucket.clone()).flatten()
    }

    fn submit<'a>(&'a self, batch: SubmitBatch<'a>) -> BoxFuture<'a, Result<Submitted, ApiError>> {
        Box::pin(async move {
            if let Some(endpoint) = batch.endpoint.filter(|endpoint| *endpoint != ENDPOINT) {
                return Err(ApiError::decided(
                    ErrorKind::Permanent,
                    format!("Gemini Batch Mode has no endpoint {endpoint:?}; leave it out or use {ENDPOINT:?}"),
                ));
            }
            self.check_model(batch.model).map_err(|why| ApiError::decided(ErrorKind::Permanent, why))?;
            // A batch name already recorded is the chunk's batch.
            if let Some(remote) = batch.resume.filter(|remote| remote.id.is_some()) {
                return Ok(Submitted {
                    remote: remote.clone(),
                    status: "BATCH_STATE_PENDING".to_owned(),
                    body_bytes: 0,
                });
            }
            let job_id = batch.tag.job_id.as_str();
            let recorded = recorded_nonce(batch.resume);
            // An earlier create of this chunk may have made its batch: look before creating again. Until the look
            // answers, the earlier create stays uncertain.
            if let Some(nonce) = recorded {
                let display_name = wire::display_name(nonce, batch.tag.chunk, job_id);
                if let Some(found) = self.look_for(&display_name, usable).await.map_err(ApiError::into_failed_look)? {
                    tracing::info!(
                        job_id,
                        chunk = batch.tag.chunk,
                        batch = found.name().unwrap_or_default(),
                        "found the batch an uncertain create made (its display name carries the chunk's nonce); not creating another"
                    );
                    let input_file = batch.resume.and_then(|resume| resume.input_file.clone());
                    return submitted(&found, nonce, input_file, 0);
                }
            }
            // One nonce for every create of the chunk, recorded before the first.
            let nonce = recorded.map_or_else(create_nonce, str::to_owned);
            let display_name = wire::display_name(&nonce, batch.tag.chunk, job_id);
            let model = batch.model.remote_name();
            let inline = wire::inline_body(batch.items, &display_name)
                .map_err(|bad| ApiError::decided(ErrorKind::InvalidInput, not_an_object(bad)))?;
            if inline.len() <= self.max_inline_bytes {
                if recorded.is_none() {
                    record(&batch, &nonce, None).await?;
                }
                let body_bytes = inline.len();
                let reply = self.client.create(model, inline).await?;
                let created = Operation::read(&reply).unwrap_or_default();
                return submitted(&created, &nonce, None, body_bytes);
            }
            drop(inline);
            let reused = batch
                .resume
                .and_then(|resume| resume.input_file.clone())
                .filter(|file| recorded.is_some() && is_resource(file, "files"));
            let (mut file, mut body_bytes) = match &reused {
                Some(file) => (file.clone(), 0),
                None => self.upload_recorded(&batch, &display_name, &nonce).await?,
            };
            let mut created = self.client.create(model, wire::file_body(&file, &display_name)).await;
            // The recorded file may be gone (deleted after a certain refusal, or expired after 48 hours).
            if reused.is_some() && matches!(&created, Err(error) if error.http_status == Some(404)) {
                tracing::warn!(
                    job_id,
                    chunk = batch.tag.chunk,
                    file,
                    "the recorded input file is gone; uploading it again"
                );
                (file, body_bytes) = self.upload_recorded(&batch, &display_name, &nonce).await?;
                created = self.client.create(model, wire::file_body(&file, &display_name)).await;
            }
            match created {
                Ok(reply) => submitted(&Operation::read(&reply).unwrap_or_default(), &nonce, Some(file), body_bytes),
                // The batch may exist (the next attempt looks), or a wait: the recorded file is used again.
                Err(error) if error.maybe_delivered || error.kind.is_throttle() => Err(error),
                Err(error) => {
                    // Certainly nothing was created; the next attempt uploads afresh.
                    if self.delete_batches {
                        self.delete_quietly(&file).await;
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
            let name = batch_id(remote)?;
            // A finished batch's operation carries its inline responses: read within the budget, then dropped (they
            // are read again by `fetch_results`).
            let (reply, _held) = self.client.get(name, self.budget.as_ref()).await?;
            let Some(operation) = Operation::read(&reply) else {
                return Ok((Polled::Pending(PendingStatus::undocumented("unreadable")), Vec::new()));
            };
            drop(reply);
            let state = operation.state();
            let state_text = operation.state_text().unwrap_or("unreadable").to_owned();
            match state {
                State::Running => return Ok((Polled::Pending(PendingStatus::documented(&state_text)), Vec::new())),
                State::Cancelling => return Ok((Polled::Pending(PendingStatus::cancelling(&state_text)), Vec::new())),
                State::Other => return Ok((Polled::Pending(PendingStatus::undocumented(&state_text)), Vec::new())),
                State::Failed => {
                    let (code, message) = operation.failure();
                    return Err(ApiError {
                        kind: ErrorKind::BatchFailed,
                        http_status: Some(200),
                        api_code: Some(batchd_core::ApiCode::Text(code)),
                        message,
                        retry_after: None,
                        maybe_delivered: false,
                    });
                }
                State::Succeeded | State::Cancelled | State::Expired => {}
            }
            // Ready even with the responses inline: the engine deletes what an ended batch left only after a fetch.
            let output_file = operation.responses_file().filter(|file| is_resource(file, "files"));
            let polled = Polled::Ready(RemoteBatch { output_file, ..remote.clone() });
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
            let file = match remote.output_file.as_deref().filter(|file| is_resource(file, "files")) {
                Some(file) => file.to_owned(),
                None => {
                    // The responses are inline in the finished batch's operation (read within the budget).
                    let (reply, held) = self.client.get(batch_id(remote)?, self.budget.as_ref()).await?;
                    let operation = Operation::read(&reply).unwrap_or_default();
                    drop(reply);
                    let ended = match operation.state() {
                        State::Cancelled => "cancelled",
                        State::Expired => "expired",
                        _ => "missing",
                    };
                    match operation.responses(n_items, ended) {
                        Responses::Inline(output) => return Ok((output, held)),
                        Responses::File(file) if is_resource(&file, "files") => file,
                        Responses::File(_) | Responses::None => return Ok((Join::new(n_items).finish(ended), held)),
                    }
                }
            };
            let mut join = Join::new(n_items);
            let held = self.client.download(&file, self.budget.as_ref(), |line| join.add_line(line)).await?;
            if join.skipped > 0 {
                tracing::warn!(
                    batch = remote.id.as_ref().map(RequestId::as_str),
                    skipped = join.skipped,
                    "response lines skipped"
                );
            }
            Ok((join.finish("missing"), held))
        })
    }

    fn find<'a>(&'a self, find: FindBatch<'a>) -> BoxFuture<'a, Result<Found, ApiError>> {
        Box::pin(async move {
            // A batch name already recorded is the chunk's batch.
            if find.resume.id.is_some() {
                let status = "BATCH_STATE_PENDING".to_owned();
                return Ok(Found::Batch(Submitted { remote: find.resume.clone(), status, body_bytes: 0 }));
            }
            // A create is only ever sent after its nonce is recorded: without one, nothing was created.
            let Some(nonce) = recorded_nonce(Some(find.resume)) else {
                return Ok(Found::Nothing);
            };
            let display_name = wire::display_name(nonce, find.chunk, find.job_id.as_str());
            match self.look_for(&display_name, ran).await? {
                Some(found) => {
                    let input_file = find.resume.input_file.clone();
                    Ok(Found::Batch(submitted(&found, nonce, input_file, 0)?))
                }
                None => Ok(Found::Nothing),
            }
        })
    }

    fn cancel<'a>(
        &'a self,
        _model: &'a ModelName,
        remote: &'a RemoteBatch,
    ) -> BoxFuture<'a, Result<CancelOutcome, ApiError>> {
        Box::pin(async move {
            let name = batch_id(remote)?;
            match self.client.cancel(name).await {
                Ok(_) => Ok(CancelOutcome::Requested),
                // Refused as already ended, or gone: its end comes through the poll all the same.
                Err(error) if matches!(error.http_status, Some(400 | 404 | 409)) => {
                    tracing::debug!(batch = name, error = %error, "cancel refused; the batch has likely ended");
                    Ok(CancelOutcome::Requested)
                }
                Err(error) => Err(error),
            }
        })
    }

    fn clean_up<'a>(&'a self, remote: &'a RemoteBatch) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            if !self.delete_batches {
                return Ok(());
            }
            let mut last = Ok(());
            let files = [&remote.input_file, &remote.output_file];
            for file in files.into_iter().flatten().filter(|file| is_resource(file, "files")) {
                match self.client.delete(file).await {
                    Ok(_) => {}
                    Err(error) if error.kind == ErrorKind::NotFound => {}
                    Err(error) => last = Err(error),
                }
            }
            if let Ok(name) = batch_id(remote) {
                match self.client.delete(name).await {
                    Ok(_) => {}
                    Err(error) if error.kind == ErrorKind::NotFound => {}
                    Err(error) => last = Err(error),
                }
            }
            last
        })
    }
}
