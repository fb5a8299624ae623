//! Submit: a chunk is posted to the Batch API, its request id recorded with its first poll, or the failure
//! decided (retry, split around a refused item, answer the item alone, fail the chunk or the job).

use std::time::Instant;

use batchd_core::{ChunkState, JobOutput, ModelName, RequestId, UnixMillis};
use batchd_provider::{ApiError, BatchLimits, BatchTag, Checkpoint, ErrorKind, Provider, RemoteBatch, SubmitBatch};
use batchd_queue::{Claim, Fenced, NewChunk, Placement, StoreError, SubmitRetryRecord, SubmitTicket};
use futures::future::BoxFuture;
use serde_json::value::RawValue;
use tracing::Instrument;

use super::{Ending, Item, Pipeline, exhausted, unit_random};
use crate::metrics::{self, ApiCall};
use crate::policy::{isolate_cuts, poll_delay, retry_delay, split_placement};

impl Pipeline {
    /// Submits one chunk from the schedule: mark `submitting` (reading its items back), then [`Pipeline::post`].
    pub(super) async fn submit(
        &self,
        claim: &Claim,
        provider: &dyn Provider,
        model: &ModelName,
        endpoint: Option<&str>,
        deadline_at: UnixMillis,
    ) -> Result<(), StoreError> {
        // Held until the submit is done.
        let Some(_slot) = self.admit_step(claim, provider, model, ApiCall::Submit).await? else {
            waits::started(claim, provider.name());
            return Ok(());
        };
        waits::ended(claim);
        // Room for the items read back and the body built from them, before either exists, sized by what this
        // chunk can hold (see [`submit_room`]); then only what it needs is kept until the submit is done. The lease
        // is renewed while this waits, so a replica short of memory keeps the chunk rather than losing it to another.
        let limits = provider.limits();
        let n_items = claim.view.as_ref().map(|view| view.items_len);
        let first_room = submit_room(&limits, self.limits.max_entry_bytes, n_items);
        let mut room = self.renewing(claim, self.budget.hold(first_room)).await;
        let ticket = self.store.begin_submit(claim, self.store.now().await?).await?;
        let checked_at = Instant::now();
        match ticket {
            SubmitTicket::Go { attempt, resubmit, looked, requests, placement, .. } => {
                let body = limits.body.bytes(requests.iter().map(|item| item.get().len()));
                if 2 * body > room.bytes() {
                    // Items larger than the bound (a job accepted under a larger jobs.max_entry_bytes): nothing
                    // waits for room while holding some, so the hold is given back and the sum asked for at once.
                    drop(room);
                    room = self.renewing(claim, self.budget.hold(2 * body)).await;
                }
                room.shrink_to(2 * body);
                let post = Post { provider, model, endpoint, attempt, resubmit, looked, checked_at, deadline_at };
                self.post(claim, post, &requests, placement).await
            }
            // The cancellation arrived after this step read the ledger.
            SubmitTicket::Cancelled => match self.store.load_chunk(&claim.chunk).await? {
                Some(view) => {
                    let reason = view.cancel_requested.clone().unwrap_or_default();
                    self.cancel(claim, &view, &reason).await
                }
                None => Ok(()),
            },
            SubmitTicket::Skip { chunk_state } => {
                tracing::debug!(chunk_state = %chunk_state, "chunk already submitted");
                Ok(())
            }
            SubmitTicket::Gone => Ok(()),
        }
    }

    /// Submits a chunk already marked `submitting` to its provider, then records the remote batch and schedules
    /// the first poll, or decides what the failure means.
    pub(super) async fn post<R: Item>(
        &self,
        claim: &Claim,
        post: Post<'_>,
        requests: &[R],
        placement: Placement,
    ) -> Result<(), StoreError> {
        let Post { provider, model, endpoint, attempt, resubmit, looked, checked_at, deadline_at } = post;
        let chunk = &claim.chunk;
        if !self.still_held(claim, checked_at).await? {
            return Ok(());
        }
        if resubmit && !looked {
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
        let items: Vec<&RawValue> = requests.iter().map(|item| item.borrow()).collect();
        // An interrupted attempt may have created part of the batch (an uploaded file) or all of it: the provider
        // reuses what was recorded and looks before creating again.
        let resume = if resubmit {
            let (id, refs) = self.store.chunk_remote(chunk).await?;
            RemoteBatch::from_ledger(id.and_then(|id| RequestId::parse(&id).ok()), refs.as_deref())
        } else {
            None
        };
        let checkpoint = LedgerCheckpoint { pipeline: self, claim };
        let batch = SubmitBatch {
            model,
            endpoint,
            items: &items,
            tag: BatchTag {
                namespace: self.store.keys().namespace(),
                job_id: &chunk.job_id,
                chunk: chunk.index,
                attempt,
            },
            resume: resume.as_ref(),
            checkpoint: &checkpoint,
        };
        // The lease is renewed while the submit is in flight (a slow reply is not taken over).
        let submitted = self.renewing(claim, provider.submit(batch).instrument(span.clone())).await;
        drop(items);
        match &submitted {
            Ok(_) => metrics::api_request(provider.name(), ApiCall::Submit, "ok", Some(200), started.elapsed()),
            Err(error) => metrics::api_request(
                provider.name(),
                ApiCall::Submit,
                error.kind.as_str(),
                error.http_status,
                started.elapsed(),
            ),
        }
        match submitted {
            Ok(submitted) => {
                let Some(request_id) = submitted.remote.id.clone() else {
                    // A provider answered a submit without a batch id: nothing to poll; retried as ambiguous.
                    let error = ApiError {
                        kind: ErrorKind::Transient,
                        http_status: None,
                        api_code: None,
                        message: "the provider accepted the batch without naming it".to_owned(),
                        retry_after: None,
                        maybe_delivered: true,
                    };
                    let failed =
                        FailedSubmit { attempt, resubmit, placement, deadline_at, can_cancel: provider.can_cancel() };
                    return self.submit_failed(claim, model, failed, requests, error).await;
                };
                span.record("request_id", tracing::field::display(&request_id));
                if self.events && provider.sends_events() {
                    // Before the record: an event that arrives right after it must find the chunk. A failure
                    // here costs only latency (the fallback poll still comes).
                    let indexed = match self.store.now().await {
                        Ok(now) => self.store.index_request(request_id.as_str(), chunk, deadline_at, now).await,
                        Err(error) => Err(error),
                    };
                    if let Err(error) = indexed {
                        metrics::redis_error("index_request");
                        tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, "could not index the request id for events; the batch is found by its fallback poll");
                    }
                }
                let recorded = self.record_submitted(claim, provider, &submitted.remote, &submitted.status).await?;
                if recorded.applied() {
                    metrics::remote_batch_created(provider.name(), placement.len(), jobs_carried(claim));
                }
                tracing::debug!(
                    parent: &span,
                    request_id = %request_id,
                    n_items = placement.len(),
                    bytes = submitted.body_bytes,
                    recorded = recorded.applied(),
                    "batch submitted"
                );
                match recorded {
                    // The job's cancel was acted on while the batch was being created: cancel it now.
                    Fenced::Applied { cancel_seen_at: Some(_) } => self.cancel_after_submit(claim).await,
                    Fenced::Applied { cancel_seen_at: None } => Ok(()),
                    Fenced::Gone => {
                        self.orphaned(claim, provider, model, &submitted.remote).await;
                        Ok(())
                    }
                }
            }
            Err(error) => {
                let failed =
                    FailedSubmit { attempt, resubmit, placement, deadline_at, can_cancel: provider.can_cancel() };
                self.submit_failed(claim, model, failed, requests, error).await
            }
        }
    }

    /// Records a submitted chunk's request id and schedules its first poll. The remote batch exists now, so a
    /// Redis error here must not lose the id (the chunk would be submitted again after its lease): the step is
    /// retried with backoff for as long as this replica holds the lease.
    /// A claim taken over meanwhile is not retried: the chunk's new holder carries on.
    pub(super) async fn record_submitted(
        &self,
        claim: &Claim,
        provider: &dyn Provider,
        remote: &RemoteBatch,
        status: &str,
    ) -> Result<Fenced, StoreError> {
        let chunk = &claim.chunk;
        let started = Instant::now();
        let mut delay = batchd_queue::RetryDelay::new();
        let request_id = remote.id.as_ref().map(ToString::to_string).unwrap_or_default();
        loop {
            let now = self.store.now().await?;
            let events = self.events && provider.sends_events();
            let due = now + poll_delay(0, &self.poll, events, unit_random()).as_millis() as u64;
            let refs = remote.has_refs().then(|| remote.refs_json());
            let recorded = self.store.mark_submitted(claim, &request_id, status, refs.as_deref(), due).await;
            let error = match recorded {
                Ok(recorded) => return Ok(recorded),
                Err(error @ StoreError::StaleClaim { .. }) => return Err(error),
                Err(error) => error,
            };
            let wait = delay.failed();
            if started.elapsed() + wait >= self.lease {
                tracing::error!(
                    job_id = %chunk.job_id,
                    chunk = chunk.index,
                    request_id = %request_id,
                    error = %error,
                    "gave up recording the request id of a submitted batch; the chunk will be submitted again"
                );
                return Err(error);
            }
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
        }
    }

    async fn submit_failed<R: Item>(
        &self,
        claim: &Claim,
        model: &ModelName,
        failed: FailedSubmit,
        requests: &[R],
        error: ApiError,
    ) -> Result<(), StoreError> {
        let chunk = &claim.chunk;
        let FailedSubmit { attempt, resubmit, placement, deadline_at, can_cancel } = failed;
        let now = self.store.now().await?;
        let retry = match after_failed_submit(&error, placement.len(), attempt, self.retry.max_attempts) {
            SubmitDecision::Split(cuts) => {
                let owned = requests.iter().map(|item| item.borrow().to_owned()).collect();
                return self.split(claim, placement, owned, &cuts, &error).await;
            }
            SubmitDecision::AnswerItemAlone => return self.item_refused(claim, &error).await,
            SubmitDecision::FailChunk => return self.chunk_failed(claim, error.to_job_error(), None).await,
            SubmitDecision::GiveUp => return self.chunk_failed(claim, exhausted(&error, attempt), None).await,
            SubmitDecision::FailJob => {
                tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, model = %model, error = %error, "the Batch API refused the batch");
                return self.conclude(&chunk.job_id, Ending::Failed(error.to_job_error())).await;
            }
            SubmitDecision::Retry(mut retry) => {
                // This attempt resumed an uncertain create: that its own request certainly created nothing (a 429,
                // a refused connection) says nothing of the earlier one, whose batch may exist. The chunk stays
                // `submitting`, so the next attempt looks again under the same mark before it creates.
                if resubmit {
                    retry.state = ChunkState::Submitting;
                }
                retry
            }
        };
        let wait = retry_delay(attempt.max(1), &self.retry, error.retry_after, unit_random());
        let mut record = SubmitRetryRecord {
            state: retry.state,
            last_error: error.to_job_error().to_json(),
            attempts: None,
            looked: retry.looked,
        };
        if retry.give_attempt_back {
            // Rate limiting is not a failure of the job: give the attempt back.
            record.attempts = Some(attempt.saturating_sub(1));
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
        match self.store.mark_submit_retry(claim, &record, due).await? {
            // A cancel that arrived while this submit was in flight left it alone: at a provider that can cancel,
            // the job is settled (or the batch looked up) now rather than at the retry. A failed submit only: the
            // view it reads costs an ordinary job nothing.
            Fenced::Applied { cancel_seen_at } if can_cancel || cancel_seen_at.is_some() => {
                self.cancel_after_submit(claim).await
            }
            Fenced::Applied { .. } | Fenced::Gone => Ok(()),
        }
    }

    /// A batch created for a job that finished meanwhile (cancelled, expired, failed by another chunk) is read by
    /// nobody: where the provider can, it is cancelled rather than left running (and billed). Best effort.
    pub(super) async fn orphaned(
        &self,
        claim: &Claim,
        provider: &dyn Provider,
        model: &ModelName,
        remote: &RemoteBatch,
    ) {
        let chunk = &claim.chunk;
        if !provider.can_cancel() {
            return;
        }
        let request_id = remote.id.as_ref().map(ToString::to_string).unwrap_or_default();
        match provider.cancel(model, remote).await {
            Ok(outcome) => {
                tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, request_id, ?outcome, "the job finished while its batch was being created; cancelled the batch")
            }
            Err(error) => {
                tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, request_id, error = %error, "the job finished while its batch was being created, and the batch could not be cancelled")
            }
        }
    }

    /// The API refused a one-item batch because of its input: the item is answered `success:false` with the API's
    /// error (code, message, HTTP status), and the chunk is done, so the job goes on and can still complete.
    async fn item_refused(&self, claim: &Claim, error: &ApiError) -> Result<(), StoreError> {
        let chunk = &claim.chunk;
        tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, "the Batch API refused one request item");
        metrics::item_refused();
        let output = JobOutput {
            responses: vec![batchd_core::ItemResponse::failure(0, Some(api_error_item(error)))],
            usage: serde_json::json!({}),
            failed_batches: Vec::new(),
        };
        let payload = serde_json::to_string(&output).expect("output serialises");
        match self.store.chunk_done(claim, ChunkState::Done, &payload, self.store.now().await?).await? {
            Some(0) => self.finish(claim).await,
            _ => Ok(()),
        }
    }

    /// Replaces the chunk by its pieces, cut before each of the chunk-local positions `cuts` (ascending, inside
    /// the chunk), all due now: the first piece takes the chunk's place, the others are appended.
    async fn split(
        &self,
        claim: &Claim,
        placement: Placement,
        mut requests: Vec<Box<RawValue>>,
        cuts: &[usize],
        error: &ApiError,
    ) -> Result<(), StoreError> {
        let chunk = &claim.chunk;
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
        self.store.add_chunks(claim, self.store.now().await?, true, None, &pieces).await?;
        Ok(())
    }
}

/// How many jobs the remote batch of a claimed chunk carries: one for a job's own chunk, the pack's members for an
/// unsplit pack; `None` for a piece of a split pack (which members it carries is not read for a metric).
fn jobs_carried(claim: &Claim) -> Option<usize> {
    if !claim.chunk.job_id.is_pack() {
        return Some(1);
    }
    claim.view.as_ref().filter(|view| view.n_chunks == 1).and_then(|view| view.pack_members)
}

/// What a submit is: where it goes and which attempt it is.
#[derive(Debug, Clone, Copy)]
pub(super) struct Post<'a> {
    /// The provider the chunk's model routes to.
    pub provider: &'a dyn Provider,
    /// The job's model.
    pub model: &'a ModelName,
    /// The job's endpoint, when it named one.
    pub endpoint: Option<&'a str>,
    /// The attempt (1-based).
    pub attempt: u64,
    /// Whether an earlier attempt was interrupted (the remote batch may exist already).
    pub resubmit: bool,
    /// Whether the previous attempt only looked for that batch and waits for one it found to end: the look
    /// resumes and is not counted again as a possible duplicate.
    pub looked: bool,
    /// When the claim was last checked (the chunk marked `submitting` under it).
    pub checked_at: Instant,
    /// The job's deadline: no retry is due after it.
    pub deadline_at: UnixMillis,
}

/// Records what a multi-request submit created so far in the chunk's ledger (see [`Checkpoint`]), fenced by the
/// step's claim, whose lease it renews.
struct LedgerCheckpoint<'a> {
    /// The pipeline whose store holds the ledger.
    pipeline: &'a Pipeline,
    /// The claim of the chunk being submitted.
    claim: &'a Claim,
}

impl Checkpoint for LedgerCheckpoint<'_> {
    fn record<'a>(&'a self, remote: &'a RemoteBatch) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let store = &self.pipeline.store;
            let recorded = match store.now().await {
                Ok(now) => {
                    let lease_until = now + self.pipeline.lease.as_millis() as u64;
                    store.record_remote(self.claim, &remote.refs_json(), lease_until).await
                }
                Err(error) => Err(error),
            };
            match recorded {
                Ok(true) => Ok(()),
                Ok(false) => Err("the job finished while its batch was being created".to_owned()),
                Err(error) => Err(format!("could not record the remote batch's progress: {error}")),
            }
        })
    }
}

/// What a failed submit's handling needs besides the error.
#[derive(Debug)]
struct FailedSubmit {
    /// The attempt that failed (1-based).
    attempt: u64,
    /// Whether it resumed an earlier create whose outcome was unknown.
    resubmit: bool,
    /// Where the chunk's items sit in the job.
    placement: Placement,
    /// The job's deadline.
    deadline_at: UnixMillis,
    /// Whether the provider can cancel a batch (then a cancel that arrived meanwhile is acted on at once).
    can_cancel: bool,
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

/// The room a submit holds in `workers.inflight_bytes` before it reads its chunk's items back: the items and the
/// body built from them. A chunk's items are a part of one job entry, so they are at most `max_entry_bytes`
/// (`jobs.max_entry_bytes`) and at most the provider's body limit; with `n_items` known (the claim's view), the
/// body adds its envelope and per-item overhead to that. So an OpenAI or Anthropic submit (200 MB / 256 MB bodies)
/// holds about twice the entry limit, not twice the body limit, and does not take the whole default budget while
/// it reads; the budget caps any hold at its whole size.
pub(super) fn submit_room(limits: &BatchLimits, max_entry_bytes: usize, n_items: Option<usize>) -> usize {
    let body = match n_items {
        Some(n_items) => {
            let sizes = std::iter::once(max_entry_bytes).chain(std::iter::repeat_n(0, n_items.saturating_sub(1)));
            limits.body.bytes(sizes)
        }
        None => max_entry_bytes.saturating_add(limits.body.envelope),
    };
    2 * body.min(limits.max_body_bytes)
}

/// What a failed submit means for its chunk (decided from the error alone, without Redis).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SubmitDecision {
    /// Split the batch before these chunk-local positions: it was too large (in halves), or one item refused it
    /// (around the item the API names, in halves otherwise), so every valid item is still answered.
    Split(Vec<usize>),
    /// A one-item batch was refused for its input: answer the item `success:false`, the job goes on.
    AnswerItemAlone,
    /// The batch cannot be submitted (too large alone, failed as a whole, a reply too large to read).
    FailChunk,
    /// A transient error, but the attempts are used up.
    GiveUp,
    /// The API refused in a way that no other batch of the job can escape (auth, unknown or unbatchable model).
    FailJob,
    /// Try again later.
    Retry(SubmitRetry),
}

/// How a submit is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SubmitRetry {
    /// `submitting` when the failed submit may have reached the API (its retry counts as a possible duplicate),
    /// `pending` when it certainly created nothing.
    pub state: ChunkState,
    /// Rate limiting is not a failure of the job: the attempt is given back.
    pub give_attempt_back: bool,
    /// The attempt only looked for an uncertain create's batch and waits for one it found to end.
    pub looked: bool,
}

/// Decides what a failed submit of a `n_items`-item batch at attempt `attempt` (of `max_attempts`) means.
pub(super) fn after_failed_submit(error: &ApiError, n_items: usize, attempt: u64, max_attempts: u64) -> SubmitDecision {
    match error.kind {
        ErrorKind::TooLarge if n_items > 1 => SubmitDecision::Split(vec![n_items / 2]),
        ErrorKind::InvalidInput if n_items > 1 => SubmitDecision::Split(isolate_cuts(n_items, error.refused_item())),
        ErrorKind::InvalidInput => SubmitDecision::AnswerItemAlone,
        ErrorKind::TooLarge | ErrorKind::BatchFailed | ErrorKind::ReplyTooLarge => SubmitDecision::FailChunk,
        ErrorKind::Permanent | ErrorKind::Billing | ErrorKind::NotFound | ErrorKind::NotBatchable => {
            SubmitDecision::FailJob
        }
        ErrorKind::Transient | ErrorKind::RateLimited | ErrorKind::QuotaExhausted | ErrorKind::AwaitingLookUp => {
            let throttled = error.kind.is_throttle();
            if !throttled && attempt >= max_attempts {
                return SubmitDecision::GiveUp;
            }
            // A look that waits keeps the earlier create uncertain whatever the error says.
            let looked = error.kind == ErrorKind::AwaitingLookUp;
            let state =
                if looked || error.is_ambiguous_submit() { ChunkState::Submitting } else { ChunkState::Pending };
            SubmitDecision::Retry(SubmitRetry { state, give_attempt_back: throttled, looked })
        }
    }
}

/// One info line per chunk whose submit starts to wait for its provider's rate limit or calls in flight (the
/// waits themselves are counted by `batchd_throttled_waits_total`, one per look): the chunks waiting now, bounded.
mod waits {
    use std::collections::HashSet;
    use std::sync::Mutex;

    use batchd_queue::Claim;

    /// Most chunks remembered as waiting; past it the set starts again (a wait may then be logged twice).
    const MAX_WAITING: usize = 10_000;

    static WAITING: Mutex<Option<HashSet<String>>> = Mutex::new(None);

    fn member(claim: &Claim) -> String {
        format!("{}#{}", claim.chunk.job_id, claim.chunk.index)
    }

    /// The chunk's submit was held: logs the first hold of a wait.
    pub(super) fn started(claim: &Claim, provider: &str) {
        let mut waiting = WAITING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let waiting = waiting.get_or_insert_with(HashSet::new);
        if waiting.len() >= MAX_WAITING {
            waiting.clear();
        }
        if waiting.insert(member(claim)) {
            tracing::info!(
                job_id = %claim.chunk.job_id,
                chunk = claim.chunk.index,
                provider,
                "submit waits for the provider's rate limit, calls in flight or the daily budget (`batchd status` \
                 says which and until when)"
            );
        }
    }

    /// The chunk's submit may go: its wait, if any, is over.
    pub(super) fn ended(claim: &Claim) {
        let mut waiting = WAITING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(waiting) = waiting.as_mut().filter(|waiting| !waiting.is_empty()) {
            waiting.remove(&member(claim));
        }
    }
}

#[cfg(test)]
mod tests {
    use batchd_provider::BodyShape;

    use super::*;

    fn error(kind: ErrorKind, http_status: Option<u16>, message: &str, maybe_delivered: bool) -> ApiError {
        ApiError { kind, http_status, api_code: None, message: message.to_owned(), retry_after: None, maybe_delivered }
    }

    #[test]
    fn a_refused_batch_is_split_to_isolate_the_item() {
        let named = error(ErrorKind::InvalidInput, Some(400), "oneOf at '/requests/5' not met", false);
        assert_eq!(after_failed_submit(&named, 10, 1, 5), SubmitDecision::Split(isolate_cuts(10, Some(5))));
        let unnamed = error(ErrorKind::InvalidInput, Some(400), "bad input", false);
        assert_eq!(after_failed_submit(&unnamed, 10, 1, 5), SubmitDecision::Split(vec![5]));
        assert_eq!(after_failed_submit(&unnamed, 1, 1, 5), SubmitDecision::AnswerItemAlone);
        let too_large = error(ErrorKind::TooLarge, Some(413), "too large", false);
        assert_eq!(after_failed_submit(&too_large, 9, 1, 5), SubmitDecision::Split(vec![4]));
        assert_eq!(after_failed_submit(&too_large, 1, 1, 5), SubmitDecision::FailChunk);
    }

    #[test]
    fn transient_errors_retry_until_the_attempts_run_out_but_rate_limits_never_use_one() {
        let timeout = error(ErrorKind::Transient, None, "timed out", true);
        assert_eq!(
            after_failed_submit(&timeout, 3, 1, 5),
            SubmitDecision::Retry(SubmitRetry {
                state: ChunkState::Submitting,
                give_attempt_back: false,
                looked: false
            }),
            "a submit that may have arrived stays submitting"
        );
        let refused = error(ErrorKind::Transient, Some(503), "unavailable", false);
        assert_eq!(
            after_failed_submit(&refused, 3, 4, 5),
            SubmitDecision::Retry(SubmitRetry { state: ChunkState::Pending, give_attempt_back: false, looked: false })
        );
        assert_eq!(after_failed_submit(&refused, 3, 5, 5), SubmitDecision::GiveUp);
        let limited = error(ErrorKind::RateLimited, Some(429), "slow down", false);
        assert_eq!(
            after_failed_submit(&limited, 3, 9, 5),
            SubmitDecision::Retry(SubmitRetry { state: ChunkState::Pending, give_attempt_back: true, looked: false })
        );
        // A look that found a batch it cannot check yet: the earlier create stays uncertain, no attempt is used.
        let waiting = error(ErrorKind::AwaitingLookUp, None, "batch still running", false);
        assert_eq!(
            after_failed_submit(&waiting, 3, 9, 5),
            SubmitDecision::Retry(SubmitRetry { state: ChunkState::Submitting, give_attempt_back: true, looked: true })
        );
    }

    #[test]
    fn a_submit_holds_room_for_what_its_chunk_can_hold_not_for_the_providers_body_limit() {
        let openai = BatchLimits {
            max_body_bytes: 200 * 1024 * 1024,
            max_items: Some(50_000),
            body: BodyShape { envelope: 0, per_item: 100, separator: 1 },
        };
        let mib = 1024 * 1024;
        assert_eq!(submit_room(&openai, 32 * mib, Some(3)), 2 * (32 * mib + 3 * 100 + 2));
        assert_eq!(submit_room(&openai, 32 * mib, None), 2 * 32 * mib);
        // An entry limit above the body limit: the body limit bounds the hold, as before.
        assert_eq!(submit_room(&openai, 512 * mib, Some(10)), 2 * 200 * mib);
        // Submits of modest jobs fit the default budget (256 MiB) side by side.
        assert!(3 * submit_room(&openai, 32 * mib, Some(1_000)) <= 256 * mib);
        // An oversize hold never exceeds the budget: it takes the whole budget and runs alone.
        let budget = crate::runtime::ByteBudget::new(mib);
        let held = budget.try_hold(submit_room(&openai, 512 * mib, Some(10))).expect("an idle budget");
        assert_eq!((held.bytes(), budget.available_bytes()), (mib, 0));
    }

    #[test]
    fn refusals_no_batch_can_escape_fail_the_job() {
        for kind in [ErrorKind::Permanent, ErrorKind::NotFound, ErrorKind::NotBatchable] {
            assert_eq!(after_failed_submit(&error(kind, Some(400), "no", false), 3, 1, 5), SubmitDecision::FailJob);
        }
        for kind in [ErrorKind::BatchFailed, ErrorKind::ReplyTooLarge] {
            assert_eq!(after_failed_submit(&error(kind, Some(200), "no", false), 3, 1, 5), SubmitDecision::FailChunk);
        }
    }
}
