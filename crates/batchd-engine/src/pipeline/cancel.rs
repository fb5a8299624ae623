//! Cancel: a job whose cancellation was requested ends `cancelled`, with the responses its batches finished.
//!
//! At a provider that can cancel a running batch (OpenAI, Anthropic), each chunk still running remotely is polled
//! once more: a batch that is not already cancelling is asked to cancel, and the chunk keeps being polled until its
//! batch ends (OpenAI: `cancelling` up to 10 minutes, then `cancelled`; Anthropic: `canceling`, then `ended`), when
//! its partial results are fetched and stored like any batch's. The job is published once no chunk is still
//! running remotely: every chunk checks that after its own last write, so the last one to settle publishes (and a
//! chunk that never ran stays scheduled meanwhile, so a crash cannot strand the job). The wait is bounded by the
//! job's deadline. At a provider without a cancel call (Cloudflare), the job ends at once and its batches run on,
//! unread.

use std::sync::Arc;
use std::time::Instant;

use batchd_core::result::code;
use batchd_core::{ChunkState, JobError, JobId, ModelName, RequestId};
use batchd_provider::{CancelOutcome, Provider, RemoteBatch};
use batchd_queue::{ChunkView, Claim, PublishContext, StoreError};

use super::{Ending, Pipeline};

impl Pipeline {
    /// A step of a chunk whose job's cancellation was requested: waits on (and cancels) the chunk's running batch
    /// where the provider can cancel, otherwise ends the job.
    pub(super) async fn cancel(&self, claim: &Claim, view: &ChunkView, reason: &str) -> Result<(), StoreError> {
        let job_id = &claim.chunk.job_id;
        let routed = ModelName::parse(&view.model)
            .ok()
            .and_then(|model| self.providers.for_model(&model).ok().map(|provider| (model, Arc::clone(provider))));
        let Some((model, provider)) = routed.filter(|(_, provider)| provider.can_cancel()) else {
            return self.conclude_cancelled(job_id, reason, None).await;
        };
        if self.store.now().await? >= view.deadline_at {
            return self.conclude_cancelled(job_id, reason, Some((&model, provider.as_ref()))).await;
        }
        if view.chunk_state == ChunkState::Polling {
            // Cancelled (unless it already is) by the poll, which stores the batch's outcome once it ends and then
            // settles the job.
            return self.poll(claim, provider.as_ref(), &model, view, Instant::now(), Some(reason)).await;
        }
        self.settle_cancel(claim, view.chunk_state, reason).await
    }

    /// After a step of a cancelled job at a provider that can cancel: publishes the `cancelled` result, unless one
    /// of its batches is still running remotely (then its own poll publishes once it ends). `chunk_state`: the
    /// claimed chunk's state after the step; an unsent chunk stays scheduled meanwhile, so that the job is still
    /// concluded if the replica waiting on that batch dies after storing its outcome.
    pub(super) async fn settle_cancel(
        &self,
        claim: &Claim,
        chunk_state: ChunkState,
        reason: &str,
    ) -> Result<(), StoreError> {
        let job_id = &claim.chunk.job_id;
        let Some(context) = self.store.publish_context(job_id).await? else {
            return Ok(());
        };
        let running = context.chunks.iter().filter(|chunk| chunk.state == Some(ChunkState::Polling)).count();
        if running == 0 {
            let sent = context.chunks.iter().filter(|chunk| chunk.request_id.is_some()).count();
            tracing::info!(job_id = %job_id, "job cancelled");
            let error = cancelled_error(reason, Waited::Ended { sent });
            return self.conclude_with(job_id, context, Ending::Cancelled(error)).await;
        }
        if matches!(chunk_state, ChunkState::Pending | ChunkState::Submitting) {
            let due = self.store.now().await? + self.poll.max_interval_ms;
            self.store.reschedule(claim, due).await?;
        }
        tracing::debug!(job_id = %job_id, running, "cancelled job waits for its batches to end at the provider");
        Ok(())
    }

    /// Ends a cancelled job now, with the results of the batches that had finished. `cancelling`: the provider
    /// that can cancel the batches still running (the job's deadline passed while they were cancelling), asked to
    /// once more, best effort.
    async fn conclude_cancelled(
        &self,
        job_id: &JobId,
        reason: &str,
        cancelling: Option<(&ModelName, &dyn Provider)>,
    ) -> Result<(), StoreError> {
        let Some(context) = self.store.publish_context(job_id).await? else {
            return Ok(());
        };
        let waited = match cancelling {
            Some((model, provider)) => {
                Waited::DeadlinePassed(self.cancel_running(job_id, &context, model, provider).await)
            }
            None => Waited::NoCancel,
        };
        tracing::info!(job_id = %job_id, "job cancelled");
        self.conclude_with(job_id, context, Ending::Cancelled(cancelled_error(reason, waited))).await
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

/// What became of a cancelled job's batches that were running at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waited {
    /// Those still running were cancelled, and every batch has ended: what they finished is in the result.
    Ended {
        /// Batches that had been created at the provider.
        sent: usize,
    },
    /// The job's deadline passed while this many were still cancelling; their results are not collected.
    DeadlinePassed(usize),
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
        Waited::DeadlinePassed(n) => format!(
            "the job's deadline passed while its batches were cancelling at the provider ({n} asked to cancel \
             again); responses they finished after that are not collected"
        ),
        Waited::NoCancel => "the Batch API has no cancel, so batches already submitted keep running remotely (and \
                             may be billed), and their results are discarded"
            .to_owned(),
    };
    JobError::new(code::CANCELLED, format!("cancelled on request{why}; {remote}"))
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
        assert!(cancelled_error("cancelled", Waited::DeadlinePassed(2)).message.contains("(2 asked to cancel again)"));
    }
}
