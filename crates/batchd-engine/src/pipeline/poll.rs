//! Poll: a submitted chunk's remote batch is asked for its status; an answer finishes the chunk, anything else
//! schedules the next poll (or decides what a failed poll means).

use std::time::{Duration, Instant};

use batchd_core::{ChunkState, JobError, ModelName, RequestId};
use batchd_provider::{ApiError, ErrorKind, PendingStatus, Polled, Provider, RemoteBatch};
use batchd_queue::{ChunkView, Claim, StoreError};
use tracing::Instrument;

use super::cancel::Cancelling;
use super::{Ending, Pipeline, unit_random};
use crate::metrics::{self, ApiCall};
use crate::policy::{poll_delay, retry_delay};

impl Pipeline {
    /// Polls one chunk's remote batch.
    /// `checked_at`: when the claim was last checked (the step's read of the ledger). `cancel`: when the job's
    /// cancellation was requested and the provider can cancel: a batch still running is asked to cancel (unless it
    /// already is), and once it ends the job is settled as cancelled ([`Pipeline::settle_cancel`]).
    pub(super) async fn poll(
        &self,
        claim: &Claim,
        provider: &dyn Provider,
        model: &ModelName,
        view: &ChunkView,
        checked_at: std::time::Instant,
        cancel: Option<Cancelling<'_>>,
    ) -> Result<(), StoreError> {
        let chunk = &claim.chunk;
        let request_id = view.request_id.as_deref().and_then(|id| RequestId::parse(id).ok());
        let remote = request_id.clone().and_then(|id| RemoteBatch::from_ledger(Some(id), view.remote.as_deref()));
        let (Some(request_id), Some(remote)) = (request_id, remote) else {
            return Err(StoreError::Corrupt {
                job_id: chunk.job_id.to_string(),
                detail: format!("chunk {} is polling without a readable request id", chunk.index),
            });
        };
        // Held until the poll (and a results download) is done.
        let Some(_slot) = self.admit_step(claim, provider, model, ApiCall::Poll).await? else {
            return Ok(());
        };
        if !self.still_held(claim, checked_at).await? {
            return Ok(());
        }
        let span = tracing::debug_span!("poll", request_id = %request_id, model = %model, n_polls = view.n_polls);
        let started = Instant::now();
        // The reply's room in the budget (taken as it was read) is held until its outcome is stored or published;
        // so is a results download's. The lease is renewed while the poll (and a download) is in flight: a slow
        // reply is not taken over.
        let polling = provider.poll(model, &remote, view.items_len).instrument(span.clone());
        let (polled, mut room) = match self.renewing(claim, polling).await {
            Ok((status, room)) => (Ok(status), room),
            Err(error) => (Err(error), Vec::new()),
        };
        // What the provider keeps of an ended batch (files), deleted once its outcome is stored.
        let mut ended: Option<RemoteBatch> = None;
        let polled = match polled {
            Ok(Polled::Pending(status)) => Ok(Answer::Pending(status)),
            Ok(Polled::Done(output)) => Ok(Answer::Done(output)),
            // Results are fetched in the same step, under the same renewed lease (a status, an output file and an
            // error file may outlast the lease together, each within the request timeout): if this replica dies
            // here, the next poll finds them ready again.
            Ok(Polled::Ready(ready)) => {
                let fetching = provider.fetch_results(model, &ready, view.items_len).instrument(span);
                match self.renewing(claim, fetching).await {
                    Ok((output, held)) => {
                        room.extend(held);
                        ended = Some(ready);
                        Ok(Answer::Done(output))
                    }
                    Err(error) => Err(error),
                }
            }
            Err(error) => {
                if error.kind == ErrorKind::BatchFailed {
                    ended = Some(remote.clone());
                }
                Err(error)
            }
        };
        let _room = room;
        let elapsed = started.elapsed();
        match &polled {
            Ok(Answer::Done(_)) => metrics::api_request(provider.name(), ApiCall::Poll, "done", Some(200), elapsed),
            Ok(_) => metrics::api_request(provider.name(), ApiCall::Poll, "pending", Some(200), elapsed),
            Err(error) => {
                metrics::api_request(provider.name(), ApiCall::Poll, error.kind.as_str(), error.http_status, elapsed)
            }
        }
        // How long the batch has gone unread (`batchd_remote_unreachable_seconds`): a failure batchd waits out
        // (the batch is kept) extends it, any answer ends it.
        let failing =
            matches!(&polled, Err(error) if matches!(after_failed_poll(error, 0), PollDecision::Retry { .. }));
        let forget_after = Duration::from_millis(3 * self.poll.max_interval_ms.max(self.retry.max_backoff_ms));
        metrics::remote_poll(provider.name(), &chunk.to_string(), failing, forget_after);
        let stored = match polled {
            Ok(Answer::Pending(status)) => {
                if cancel.is_some() && !status.is_cancelling() {
                    self.cancel_batch(claim, provider, model, &remote).await;
                }
                let events = self.events && provider.sends_events();
                self.still_pending(claim, view, &status, events, cancel).await
            }
            Ok(Answer::Done(output)) => self.batch_done(claim, view, &request_id, output, cancel).await,
            Err(error) => self.poll_failed(claim, view, error, cancel).await,
        };
        if let (Ok(()), Some(ended)) = (&stored, ended) {
            // Best effort, after the outcome is stored: a crash before it leaves files, never loses results.
            if let Err(error) = provider.clean_up(&ended).await {
                tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, "could not clean up an ended batch at its provider");
            }
        }
        stored
    }

    /// Asks the provider to cancel the running batch of a cancelled job's chunk (the lease renewed meanwhile); a
    /// failure is logged, and the next poll asks again while the batch is not cancelling.
    async fn cancel_batch(&self, claim: &Claim, provider: &dyn Provider, model: &ModelName, remote: &RemoteBatch) {
        let chunk = &claim.chunk;
        match self.renewing(claim, provider.cancel(model, remote)).await {
            Ok(outcome) => {
                tracing::info!(job_id = %chunk.job_id, chunk = chunk.index, ?outcome, "asked the provider to cancel the batch")
            }
            Err(error) => {
                tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, "could not cancel a remote batch; asking again at the next poll")
            }
        }
    }

    /// Stores a finished batch's output (or publishes it straight away when it is the job's only batch).
    async fn batch_done(
        &self,
        claim: &Claim,
        view: &ChunkView,
        request_id: &RequestId,
        output: batchd_core::JobOutput,
        cancel: Option<Cancelling<'_>>,
    ) -> Result<(), StoreError> {
        let chunk = &claim.chunk;
        metrics::polls_per_batch(view.n_polls + 1);
        // Counted in this process (the sampler flushes it), from the batch's submit (read with the claim's view; a
        // ledger written before the view carried it counts from the job's acceptance).
        let now = self.store.now().await?;
        let started_at = view.submitted_at.unwrap_or(view.accepted_at);
        let elapsed = std::time::Duration::from_millis(now.saturating_sub(started_at));
        if !crate::turnaround::record(self.store.keys().namespace(), &view.model, elapsed) {
            tracing::debug!(model = %view.model, "too many models since the last sample; batch time not counted");
        }
        tracing::debug!(request_id = %request_id, n_polls = view.n_polls + 1, n_failed = output.n_failed(), "batch finished");
        // A pack stores its output first: its members are handed their shares from the ledger, resumably.
        if view.n_chunks <= 1 && output.n_failed() == 0 && cancel.is_none() && !chunk.job_id.is_pack() {
            // The common case: one batch, nothing to retry: publish straight from what the poll read,
            // without storing the output or reading the ledger again.
            let context = view.single_chunk_context(chunk.index);
            return self.conclude(&chunk.job_id, Ending::FinishedOneBatch { context, output }).await;
        }
        let payload = serde_json::to_string(&output).expect("output serialises");
        let open = self.store.chunk_done(claim, ChunkState::Done, &payload, now).await?;
        self.after_chunk_done(claim, ChunkState::Done, open, cancel).await
    }

    /// After a chunk's outcome was stored (`open`: the job's chunks still unfinished, `None` when the job has
    /// finished): settles a cancelled job, or finishes the job once its last chunk is done.
    async fn after_chunk_done(
        &self,
        claim: &Claim,
        state: ChunkState,
        open: Option<u32>,
        cancel: Option<Cancelling<'_>>,
    ) -> Result<(), StoreError> {
        match (cancel, open) {
            (_, None) => Ok(()),
            (Some(cancel), Some(_)) => self.settle_cancel(claim, state, cancel).await,
            (None, Some(0)) => self.finish(claim).await,
            (None, Some(_)) => Ok(()),
        }
    }

    /// Schedules the next poll of a batch that has not answered yet, whatever status it reports: only the job's
    /// deadline bounds how long it may stay pending. A status the docs do not list is logged once per batch (when
    /// it first appears) and counted at every poll. A cancelled job's batch is polled again no later than the end
    /// of its wait. `events`: whether the batch's provider sends completion events that `[events]` consumes (then
    /// the next poll is the long fallback).
    async fn still_pending(
        &self,
        claim: &Claim,
        view: &ChunkView,
        pending: &PendingStatus,
        events: bool,
        cancel: Option<Cancelling<'_>>,
    ) -> Result<(), StoreError> {
        let chunk = &claim.chunk;
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
        let delay = poll_delay(view.n_polls + 1, &self.poll, events, unit_random());
        // Never sleep past the deadline (or a cancelled job's wait): the job ends on time.
        let due = (now + delay.as_millis() as u64).min(latest_due(view, cancel));
        self.store.mark_pending_poll(claim, status, due).await?;
        tracing::debug!(status, next_poll_in = ?delay, "batch not finished yet");
        Ok(())
    }

    async fn poll_failed(
        &self,
        claim: &Claim,
        view: &ChunkView,
        error: ApiError,
        cancel: Option<Cancelling<'_>>,
    ) -> Result<(), StoreError> {
        let chunk = &claim.chunk;
        let now = self.store.now().await?;
        if error.kind == ErrorKind::QuotaExhausted && view.remote.is_some() && cancel.is_none() {
            // A batch refused for a quota after it was created (OpenAI's enqueued-token limit): not now. The chunk
            // is submitted again after a backoff, resuming with what the provider recorded (its input file).
            let failures = view.poll_failures + 1;
            let wait = retry_delay(failures, &self.retry, error.retry_after, unit_random());
            metrics::throttled_wait(ApiCall::Poll);
            tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, retry_in = ?wait, "the batch hit a quota; creating it again later");
            let due = (now + wait.as_millis() as u64).min(view.deadline_at);
            self.store.mark_recreate(claim, failures, &error.to_job_error().to_json(), due).await?;
            return Ok(());
        }
        let failures = match after_failed_poll(&error, view.poll_failures) {
            PollDecision::FailChunk => {
                tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, "the remote batch failed");
                return self.chunk_failed(claim, error.to_job_error(), cancel).await;
            }
            // A cancelled job's batch that cannot be polled any more is given up: it ends the chunk, not the job.
            PollDecision::FailJob if cancel.is_some() => {
                tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, "polling a cancelled batch was refused");
                return self.chunk_failed(claim, error.to_job_error(), cancel).await;
            }
            PollDecision::FailJob => {
                tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, "polling was refused permanently");
                return self.conclude(&chunk.job_id, Ending::Failed(error.to_job_error())).await;
            }
            PollDecision::Retry { failures } => failures,
        };
        // The batch exists and is paid for: a poll or download that keeps failing is never an attempt used up,
        // only a wait. Past `retry.max_attempts` failures in a row it is asked at the poll's longest interval until
        // it answers or the job's deadline passes (DESIGN decision 22).
        let wait = if failures >= self.retry.max_attempts {
            (Duration::from_millis(self.poll.max_interval_ms)).max(error.retry_after.unwrap_or_default())
        } else {
            retry_delay(failures.max(1), &self.retry, error.retry_after, unit_random())
        };
        if failures == self.retry.max_attempts {
            tracing::warn!(
                job_id = %chunk.job_id,
                chunk = chunk.index,
                request_id = view.request_id.as_deref().unwrap_or_default(),
                failures,
                "the provider has not answered for this batch's last polls; it is kept and asked again at the longest \
                 poll interval until it answers or the job's deadline passes"
            );
        }
        if error.kind.is_throttle() {
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
        let due = (now + wait.as_millis() as u64).min(latest_due(view, cancel));
        self.store.mark_poll_failed(claim, failures, &error.to_job_error().to_json(), due).await?;
        Ok(())
    }

    /// Records a chunk that cannot finish; the job goes on with its other chunks and ends `failed`, listing it
    /// (or `cancelled`, when `cancel` says its cancellation was requested).
    pub(super) async fn chunk_failed(
        &self,
        claim: &Claim,
        error: JobError,
        cancel: Option<Cancelling<'_>>,
    ) -> Result<(), StoreError> {
        let chunk = &claim.chunk;
        tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error.message, "batch failed");
        let open = self.store.chunk_done(claim, ChunkState::Failed, &error.to_json(), self.store.now().await?).await?;
        self.after_chunk_done(claim, ChunkState::Failed, open, cancel).await
    }
}

/// The latest a chunk's next step may be due: the job's deadline, or the end of a settling job's wait (a cancelled
/// job's ends by the deadline; an expired job's after it, by `jobs.deadline_settle_secs`).
fn latest_due(view: &ChunkView, cancel: Option<Cancelling<'_>>) -> batchd_core::UnixMillis {
    cancel.map_or(view.deadline_at, |cancel| cancel.ends_at)
}

/// What a poll (and, where the provider needs one, a results download) answered.
enum Answer {
    /// Not finished yet.
    Pending(PendingStatus),
    /// Finished: one response per item, in request order.
    Done(batchd_core::JobOutput),
}

/// What a failed poll means for its chunk (decided from the error alone, without Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PollDecision {
    /// Poll again later, with this many consecutive failures recorded (a rate limit does not count as one). However
    /// many there are, the batch is kept: only the provider saying it is gone or failed, or the job's deadline,
    /// ends it.
    Retry {
        /// Consecutive failed polls, this one included unless it was rate-limited.
        failures: u64,
    },
    /// The remote batch failed, is gone, or answered too much to read: the chunk fails, the job goes on.
    FailChunk,
    /// Polling was refused in a way no other batch of the job escapes (auth, an unbatchable model).
    FailJob,
}

/// Decides what a failed poll means after `poll_failures` consecutive failed polls.
pub(super) fn after_failed_poll(error: &ApiError, poll_failures: u64) -> PollDecision {
    match error.kind {
        ErrorKind::Transient | ErrorKind::RateLimited | ErrorKind::QuotaExhausted | ErrorKind::AwaitingLookUp => {
            let failures = if error.kind.is_throttle() { poll_failures } else { poll_failures + 1 };
            PollDecision::Retry { failures }
        }
        ErrorKind::BatchFailed | ErrorKind::NotFound | ErrorKind::TooLarge | ErrorKind::ReplyTooLarge => {
            PollDecision::FailChunk
        }
        ErrorKind::Permanent | ErrorKind::Billing | ErrorKind::InvalidInput | ErrorKind::NotBatchable => {
            PollDecision::FailJob
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(kind: ErrorKind, http_status: Option<u16>) -> ApiError {
        ApiError {
            kind,
            http_status,
            api_code: None,
            message: "x".to_owned(),
            retry_after: None,
            maybe_delivered: false,
        }
    }

    #[test]
    fn failed_polls_are_retried_however_many_fail_in_a_row_and_rate_limits_do_not_count() {
        let unavailable = error(ErrorKind::Transient, Some(503));
        assert_eq!(after_failed_poll(&unavailable, 0), PollDecision::Retry { failures: 1 });
        assert_eq!(after_failed_poll(&unavailable, 4), PollDecision::Retry { failures: 5 });
        assert_eq!(after_failed_poll(&unavailable, 1_000), PollDecision::Retry { failures: 1_001 });
        let limited = error(ErrorKind::RateLimited, Some(429));
        assert_eq!(after_failed_poll(&limited, 3), PollDecision::Retry { failures: 3 });
    }

    #[test]
    fn a_failed_or_vanished_batch_fails_its_chunk_and_a_refusal_fails_the_job() {
        for kind in [ErrorKind::BatchFailed, ErrorKind::NotFound, ErrorKind::TooLarge, ErrorKind::ReplyTooLarge] {
            assert_eq!(after_failed_poll(&error(kind, Some(200)), 0), PollDecision::FailChunk, "{kind:?}");
        }
        for kind in [ErrorKind::Permanent, ErrorKind::Billing, ErrorKind::InvalidInput, ErrorKind::NotBatchable] {
            assert_eq!(after_failed_poll(&error(kind, Some(401)), 0), PollDecision::FailJob, "{kind:?}");
        }
    }
}
