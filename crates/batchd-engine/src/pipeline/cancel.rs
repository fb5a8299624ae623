//! Cancel: a job whose cancellation was requested ends `cancelled`, with the responses its batches finished.
//!
//! At a provider that can cancel a running batch (OpenAI, Anthropic), a cancelled job never leaves a batch of its
//! own running there. Each chunk still running remotely is polled once more: a batch that is not already cancelling
//! is asked to cancel, and the chunk keeps being polled until its batch ends (OpenAI: `cancelling` up to 10
//! minutes, then `cancelled`; Anthropic: `canceling`, then `ended`), when its partial results are fetched and
//! stored like any batch's. A chunk whose submit is in flight counts as running too: the submit records its batch
//! (then its poll cancels it) or fails (then nothing runs), and the step that ends it carries on with the cancel
//! at once. A chunk whose earlier submit may have created a batch (an uncertain create, a replica that died in it)
//! is looked up at the provider without creating: a batch found is recorded and cancelled, nothing found means the
//! chunk was never sent.
//!
//! The job is published once no chunk is running (or being submitted): every chunk checks that after its own last
//! write, so the last one to settle publishes (and a chunk that never ran stays scheduled meanwhile, so a crash
//! cannot strand the job). The wait is bounded by the job's deadline and by `workers.cancel_wait_secs` from when
//! the daemon first acted on the cancel (recorded once in the ledger); then the job ends with what finished, its
//! batches still cancelling asked once more. At a provider without a cancel call (Cloudflare), the job ends at once
//! and its batches run on, unread.
//!
//! A job whose deadline passes is settled the same way (DESIGN decision 22): its running batches are cancelled and
//! waited for, bounded by `jobs.deadline_settle_secs` after the deadline, and it ends `expired` with what they
//! finished, the rest `deadline_exceeded` ([`Pipeline::settle_deadline`]). A member of a shared pack keeps the
//! shared-batch rule instead (it ends at once; the pack is cancelled only when no member needs it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use batchd_core::result::code;
use batchd_core::{ChunkState, JobError, JobId, ModelName, RequestId, UnixMillis};
use batchd_provider::{CancelOutcome, FindBatch, Found, Provider, RemoteBatch};
use batchd_queue::{ChunkView, Claim, PublishContext, StoreError};

use super::{Ending, Pipeline, unit_random};
use crate::metrics::ApiCall;
use crate::policy::retry_delay;

/// A step of a job whose remote work is being settled (cancelled on request, or past its deadline) at a provider
/// that can cancel: why, and until when its batches are waited for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cancelling<'a> {
    /// Why the job's batches are cancelled.
    pub why: Why<'a>,
    /// When the wait for its batches ends (Unix ms, Redis's clock): for a cancel, the job's deadline or the end of
    /// the cancel wait, whichever comes first; past the deadline, the end of `jobs.deadline_settle_secs`. No step of
    /// the job is scheduled later.
    pub ends_at: UnixMillis,
}

/// Why a job's running batches are cancelled and waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why<'a> {
    /// Its cancellation was requested, with this reason: it ends `cancelled`.
    Cancel(&'a str),
    /// Its deadline passed, `waited` after its acceptance: it ends `expired`.
    Deadline {
        /// From acceptance to the deadline.
        waited: Duration,
    },
}

impl Why<'_> {
    /// How the job ends once its batches were waited for as `waited` says.
    fn ending(self, waited: Waited) -> Ending<'static> {
        match self {
            Why::Cancel(reason) => Ending::Cancelled(cancelled_error(reason, waited)),
            Why::Deadline { waited: after } => Ending::Expired(deadline_error(after, waited)),
        }
    }
}

impl Pipeline {
    /// A step of a chunk whose job's cancellation was requested: where the provider can cancel, records when the
    /// daemon first acted on it, then waits on (and cancels) the chunk's running batch, looks up the batch an
    /// interrupted submit may have created, or settles the job; otherwise ends the job.
    pub(super) async fn cancel(&self, claim: &Claim, view: &ChunkView, reason: &str) -> Result<(), StoreError> {
        let job_id = &claim.chunk.job_id;
        let routed = ModelName::parse(&view.model)
            .ok()
            .and_then(|model| self.providers.for_model(&model).ok().map(|provider| (model, Arc::clone(provider))));
        let Some((model, provider)) = routed.filter(|(_, provider)| provider.can_cancel()) else {
            return self.conclude_settled(job_id, Why::Cancel(reason), None).await;
        };
        let now = self.store.now().await?;
        // The wait starts when the daemon first acts on the cancel: recorded once, under this claim.
        let seen_at = match view.cancel_seen_at {
            Some(seen_at) => seen_at,
            None => match self.store.note_cancel(claim, now + self.lease.as_millis() as u64).await? {
                Some(seen_at) => seen_at,
                None => return Ok(()),
            },
        };
        let (ends_at, limit) = wait_limit(view.deadline_at, seen_at, self.cancel_wait);
        if now >= ends_at {
            return self.conclude_settled(job_id, Why::Cancel(reason), Some((&model, provider.as_ref(), limit))).await;
        }
        self.settle_step(claim, view, &model, provider.as_ref(), Cancelling { why: Why::Cancel(reason), ends_at }).await
    }

    /// A step of a job whose deadline has passed (DESIGN decision 22): where the provider can cancel, its running
    /// batches are cancelled and waited for until `jobs.deadline_settle_secs` after the deadline, and the job ends
    /// `expired` with what they finished (the rest `deadline_exceeded`), its files cleaned up. Where it cannot
    /// (Workers AI), the job ends at once and says its batches run on. A member of a shared pack (or the pack
    /// itself) keeps the shared-batch rule: it ends at once with what was delivered ([`Pipeline::expire`]).
    pub(super) async fn settle_deadline(
        &self,
        claim: &Claim,
        view: &ChunkView,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let job_id = &claim.chunk.job_id;
        if view.pack.is_some() || job_id.is_pack() {
            return self.expire(job_id, view, now).await;
        }
        let why = Why::Deadline { waited: Duration::from_millis(view.deadline_at.saturating_sub(view.accepted_at)) };
        let routed = ModelName::parse(&view.model)
            .ok()
            .and_then(|model| self.providers.for_model(&model).ok().map(|provider| (model, Arc::clone(provider))));
        let Some((model, provider)) = routed.filter(|(_, provider)| provider.can_cancel()) else {
            return self.conclude_settled(job_id, why, None).await;
        };
        let ends_at = view.deadline_at.saturating_add(self.deadline_settle.as_millis() as u64);
        if now >= ends_at {
            let limit = Limit::DeadlineSettle(self.deadline_settle);
            return self.conclude_settled(job_id, why, Some((&model, provider.as_ref(), limit))).await;
        }
        self.settle_step(claim, view, &model, provider.as_ref(), Cancelling { why, ends_at }).await
    }

    /// One step of a job whose batches are being cancelled and waited for, by the chunk's state.
    async fn settle_step(
        &self,
        claim: &Claim,
        view: &ChunkView,
        model: &ModelName,
        provider: &dyn Provider,
        cancel: Cancelling<'_>,
    ) -> Result<(), StoreError> {
        match view.chunk_state {
            // Cancelled (unless it already is) by the poll, which stores the batch's outcome once it ends and then
            // settles the job.
            ChunkState::Polling => self.poll(claim, provider, model, view, Instant::now(), Some(cancel)).await,
            // Claimed, so no submit of it is in flight (its submit failed uncertainly, or its replica died).
            ChunkState::Submitting => self.look_up(claim, provider, model, view, cancel).await,
            ChunkState::Pending | ChunkState::Done | ChunkState::Failed => {
                self.settle_cancel(claim, view.chunk_state, cancel).await
            }
        }
    }

    /// After a submit step wrote its outcome, when that write found the job's cancel already acted on (or the
    /// submit failed, at a provider that can cancel): if the job's cancellation is requested, carries on with it now
    /// (cancelling the batch just recorded, settling the job, or looking up the batch of an uncertain create),
    /// rather than at the chunk's next due time.
    pub(super) async fn cancel_after_submit(&self, claim: &Claim) -> Result<(), StoreError> {
        match self.store.load_chunk(&claim.chunk).await? {
            Some(view) if !view.job_state.is_terminal() && view.claim == claim.token => {
                match view.cancel_requested.clone() {
                    Some(reason) => self.cancel(claim, &view, &reason).await,
                    // Withdrawn meanwhile: the chunk goes on as scheduled.
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// A settling job's `submitting` chunk, claimed: an earlier submit may have created its batch. Looks it up at
    /// the provider without creating: a batch found is recorded as submitted and polled at once (which asks the
    /// provider to cancel it); nothing found, the chunk was never sent. A failed look is tried again (the chunk
    /// stays `submitting`, and the job waits for it).
    async fn look_up(
        &self,
        claim: &Claim,
        provider: &dyn Provider,
        model: &ModelName,
        view: &ChunkView,
        cancel: Cancelling<'_>,
    ) -> Result<(), StoreError> {
        let chunk = &claim.chunk;
        let Some(_slot) = self.admit_step(claim, provider, model, ApiCall::Poll).await? else {
            return Ok(());
        };
        let request_id = view.request_id.as_deref().and_then(|id| RequestId::parse(id).ok());
        let resume = RemoteBatch::from_ledger(request_id, view.remote.as_deref()).unwrap_or_default();
        let find = FindBatch {
            model,
            namespace: self.store.keys().namespace(),
            job_id: &chunk.job_id,
            chunk: chunk.index,
            n_items: view.items_len,
            resume: &resume,
        };
        match self.renewing(claim, provider.find(find)).await {
            Ok(Found::Batch(submitted)) => {
                tracing::info!(job_id = %chunk.job_id, chunk = chunk.index, "a cancelled job's chunk had a batch at the provider; cancelling it");
                if !self.record_submitted(claim, provider, &submitted.remote, &submitted.status).await?.applied() {
                    self.orphaned(claim, provider, model, &submitted.remote).await;
                    return Ok(());
                }
                match self.store.load_chunk(chunk).await? {
                    Some(view) if view.chunk_state == ChunkState::Polling => {
                        self.poll(claim, provider, model, &view, Instant::now(), Some(cancel)).await
                    }
                    _ => Ok(()),
                }
            }
            Ok(found) => {
                tracing::info!(job_id = %chunk.job_id, chunk = chunk.index, unsupported = (found == Found::Unsupported), "a cancelled job's chunk had no batch at the provider; it was never sent");
                if !self.store.mark_unsent(claim, self.store.now().await?).await? {
                    return Ok(());
                }
                self.settle_cancel(claim, ChunkState::Pending, cancel).await
            }
            Err(error) => {
                let wait = retry_delay(view.poll_failures + 1, &self.retry, error.retry_after, unit_random());
                tracing::warn!(job_id = %chunk.job_id, chunk = chunk.index, error = %error, retry_in = ?wait, "could not look up a cancelled job's batch at the provider; looking again");
                let due = (self.store.now().await? + wait.as_millis() as u64).min(cancel.ends_at);
                self.store.reschedule(claim, due).await?;
                Ok(())
            }
        }
    }

    /// After a step of a cancelled job at a provider that can cancel: publishes the `cancelled` result, unless one
    /// of its batches is still running remotely or being submitted (then its own poll, or the step that ends its
    /// submit, publishes once it ends). `chunk_state`: the claimed chunk's state after the step; an unsent chunk
    /// stays scheduled meanwhile, until the wait ends at the latest, so that the job is still concluded if the
    /// replica waiting on that batch dies after storing its outcome.
    pub(super) async fn settle_cancel(
        &self,
        claim: &Claim,
        chunk_state: ChunkState,
        cancel: Cancelling<'_>,
    ) -> Result<(), StoreError> {
        let job_id = &claim.chunk.job_id;
        let Some(context) = self.store.publish_context(job_id).await? else {
            return Ok(());
        };
        let running = context
            .chunks
            .iter()
            .filter(|chunk| matches!(chunk.state, Some(ChunkState::Polling | ChunkState::Submitting)))
            .count();
        if running == 0 {
            let sent = context.chunks.iter().filter(|chunk| chunk.request_id.is_some()).count();
            tracing::info!(job_id = %job_id, why = ?cancel.why, "job settled: its batches have ended");
            return self.conclude_with(job_id, context, cancel.why.ending(Waited::Ended { sent })).await;
        }
        if matches!(chunk_state, ChunkState::Pending | ChunkState::Submitting) {
            let due = (self.store.now().await? + self.poll.max_interval_ms).min(cancel.ends_at);
            self.store.reschedule(claim, due).await?;
        }
        tracing::debug!(job_id = %job_id, running, "cancelled job waits for its batches to end at the provider");
        Ok(())
    }

    /// Ends a cancelled or expired job now, with the results of the batches that had finished. `cancelling`: the
    /// provider that can cancel the batches still running and the limit of the wait that ran out; they are asked to
    /// cancel once more, best effort.
    async fn conclude_settled(
        &self,
        job_id: &JobId,
        why: Why<'_>,
        cancelling: Option<(&ModelName, &dyn Provider, Limit)>,
    ) -> Result<(), StoreError> {
        let Some(context) = self.store.publish_context(job_id).await? else {
            return Ok(());
        };
        let waited = match cancelling {
            Some((model, provider, limit)) => {
                let asked = self.cancel_running(job_id, &context, model, provider).await;
                Waited::LimitPassed { limit, asked }
            }
            None => Waited::NoCancel,
        };
        tracing::info!(job_id = %job_id, why = ?why, ?waited, "job settled");
        self.conclude_with(job_id, context, why.ending(waited)).await
    }

    /// Asks the provider to cancel each chunk's running remote batch; returns how many it took a cancel for.
    /// Failures are logged: the job ends `cancelled` whatever the provider answers.
    async fn cancel_running(
        &self,
        job_id: &JobId,
        context: &PublishContext,
        model: &ModelName,
        provider: &dyn Provider,
    ) -> usize {
        let mut n_cancelled = 0;
        for chunk in context.chunks.iter().filter(|chunk| chunk.state == Some(ChunkState::Polling)) {
            let Some(id) = chunk.request_id.as_deref().and_then(|id| RequestId::parse(id).ok()) else {
                continue;
            };
            match provider.cancel(model, &RemoteBatch::with_id(id)).await {
                Ok(CancelOutcome::Requested) => n_cancelled += 1,
                Ok(CancelOutcome::Unsupported) => return n_cancelled,
                Err(error) => {
                    tracing::warn!(job_id = %job_id, chunk = chunk.index, error = %error, "could not cancel a remote batch");
                }
            }
        }
        n_cancelled
    }
}

/// When a cancelled job's wait for its batches ends, and which limit that is: the job's deadline, or `wait`
/// (`workers.cancel_wait_secs`) after the daemon first acted on the cancel at `seen_at`.
fn wait_limit(deadline_at: UnixMillis, seen_at: UnixMillis, wait: Duration) -> (UnixMillis, Limit) {
    let wait_ends_at = seen_at.saturating_add(wait.as_millis() as u64);
    if wait_ends_at < deadline_at { (wait_ends_at, Limit::CancelWait(wait)) } else { (deadline_at, Limit::Deadline) }
}

/// The limit a cancelled job's wait for its batches ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// The job's deadline.
    Deadline,
    /// `workers.cancel_wait_secs`, counted from when the daemon first acted on the cancel.
    CancelWait(Duration),
    /// `jobs.deadline_settle_secs`, counted from the job's deadline.
    DeadlineSettle(Duration),
}

/// What became of a cancelled job's batches that were running at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waited {
    /// Those still running were cancelled, and every batch has ended: what they finished is in the result.
    Ended {
        /// Batches that had been created at the provider.
        sent: usize,
    },
    /// The wait ran into `limit` while batches were still cancelling (`asked` of them asked to cancel again);
    /// their results are not collected.
    LimitPassed {
        /// Which limit.
        limit: Limit,
        /// How many the provider took a second cancel for.
        asked: usize,
    },
    /// The provider has no cancel call: they run on, unread.
    NoCancel,
}

/// The job-level error of a cancelled job.
fn cancelled_error(reason: &str, waited: Waited) -> JobError {
    let why = if reason.is_empty() || reason == "cancelled" { String::new() } else { format!(" ({reason})") };
    let remote = match waited {
        Waited::Ended { sent: 0 } => "nothing had been sent to the provider".to_owned(),
        Waited::Ended { sent } => format!(
            "of its {sent} batches at the provider, those still running were cancelled there and have ended: the \
             responses they finished are included (and billed), the requests that did not run are marked not run"
        ),
        Waited::LimitPassed { limit, asked } => {
            let limit = match limit {
                Limit::Deadline => "the job's deadline passed".to_owned(),
                Limit::CancelWait(wait) => {
                    format!("the wait for them to end ran out (workers.cancel_wait_secs, {}s)", wait.as_secs())
                }
                Limit::DeadlineSettle(wait) => {
                    format!("the wait for them to end ran out (jobs.deadline_settle_secs, {}s)", wait.as_secs())
                }
            };
            format!(
                "{limit} while its batches were cancelling at the provider ({asked} asked to cancel again): the \
                 responses of the batches that had ended are included, those the others finish are not collected"
            )
        }
        Waited::NoCancel => "the Batch API has no cancel, so batches already submitted keep running remotely (and \
                             may be billed), and their results are discarded"
            .to_owned(),
    };
    JobError::new(code::CANCELLED, format!("cancelled on request{why}; {remote}"))
}

/// The job-level error of a job whose deadline passed `after` its acceptance (also the error of each item that
/// was not answered: code `deadline_exceeded`).
fn deadline_error(after: Duration, waited: Waited) -> JobError {
    let remote = match waited {
        Waited::Ended { sent: 0 } => "nothing had been sent to the provider".to_owned(),
        Waited::Ended { sent } => format!(
            "of its {sent} batches at the provider, those still running were cancelled there and have ended: the \
             responses they finished are included (and billed), the requests they did not answer are marked \
             deadline_exceeded"
        ),
        Waited::LimitPassed { limit, asked } => {
            let limit = match limit {
                Limit::DeadlineSettle(wait) => {
                    format!("the wait for them to end ran out (jobs.deadline_settle_secs, {}s)", wait.as_secs())
                }
                Limit::Deadline | Limit::CancelWait(_) => "the wait for them to end ran out".to_owned(),
            };
            format!(
                "its running batches were asked to cancel, and {limit} ({asked} asked to cancel again): the \
                 responses of the batches that had ended are included, those the others finish are not collected"
            )
        }
        Waited::NoCancel => "its batches could not be cancelled (the provider's Batch API has no cancel): they keep \
                             running remotely (and may be billed), and their results are not collected"
            .to_owned(),
    };
    JobError::new(
        code::DEADLINE_EXCEEDED,
        format!("the job's deadline passed {}s after it was accepted; {remote}", after.as_secs()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cancelled_error_says_what_became_of_the_running_batches() {
        let ended = cancelled_error("not needed", Waited::Ended { sent: 2 });
        assert_eq!(ended.code, code::CANCELLED);
        assert!(ended.message.starts_with("cancelled on request (not needed); of its 2 batches"), "{}", ended.message);
        assert!(ended.message.contains("the responses they finished are included"), "{}", ended.message);
        let unsent = cancelled_error("", Waited::Ended { sent: 0 });
        assert_eq!(unsent.message, "cancelled on request; nothing had been sent to the provider");
        assert!(cancelled_error("", Waited::NoCancel).message.starts_with("cancelled on request; the Batch API has"));
        let deadline = cancelled_error("cancelled", Waited::LimitPassed { limit: Limit::Deadline, asked: 2 });
        assert!(
            deadline.message.starts_with("cancelled on request; the job's deadline passed"),
            "{}",
            deadline.message
        );
        assert!(deadline.message.contains("(2 asked to cancel again)"), "{}", deadline.message);
        let waited = Waited::LimitPassed { limit: Limit::CancelWait(Duration::from_secs(600)), asked: 1 };
        let message = cancelled_error("", waited).message;
        assert!(message.contains("the wait for them to end ran out (workers.cancel_wait_secs, 600s)"), "{message}");
    }

    #[test]
    fn the_deadline_error_says_what_became_of_the_running_batches() {
        let after = Duration::from_secs(15);
        let ended = deadline_error(after, Waited::Ended { sent: 1 });
        assert_eq!(ended.code, code::DEADLINE_EXCEEDED);
        assert!(ended.message.starts_with("the job's deadline passed 15s after it was accepted; of its 1 batches"));
        assert!(ended.message.contains("marked deadline_exceeded"), "{}", ended.message);
        let no_cancel = deadline_error(after, Waited::NoCancel).message;
        assert!(no_cancel.contains("could not be cancelled"), "{no_cancel}");
        assert!(no_cancel.contains("may be billed"), "{no_cancel}");
        let waited = Waited::LimitPassed { limit: Limit::DeadlineSettle(Duration::from_secs(600)), asked: 1 };
        let passed = deadline_error(after, waited).message;
        assert!(passed.contains("(jobs.deadline_settle_secs, 600s) (1 asked to cancel again)"), "{passed}");
        let why = Why::Deadline { waited: after };
        assert!(
            matches!(why.ending(Waited::NoCancel), Ending::Expired(error) if error.code == code::DEADLINE_EXCEEDED)
        );
        assert!(matches!(Why::Cancel("x").ending(Waited::NoCancel), Ending::Cancelled(_)));
    }

    #[test]
    fn the_wait_ends_at_the_earlier_of_the_deadline_and_the_cancel_wait() {
        let wait = Duration::from_secs(600);
        assert_eq!(wait_limit(10_000_000, 1_000, wait), (601_000, Limit::CancelWait(wait)));
        assert_eq!(wait_limit(300_000, 1_000, wait), (300_000, Limit::Deadline));
        assert_eq!(wait_limit(601_000, 1_000, wait), (601_000, Limit::Deadline), "a tie is the deadline's");
    }
}
