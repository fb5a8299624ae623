//! Finish: every way a job ends, and its one result entry. Every ending (rejected at take-in, dead-lettered after
//! too many deliveries, finished, failed, expired, cancelled) goes through [`Pipeline::conclude`], the only caller
//! of the storage's publish, reject and dead-letter transitions. A finished job may first send some items once
//! more (those the provider expired; with `retry_failed_items`, the other failures it did not refuse), while its
//! deadline leaves room; then `conclude` assembles what the chunks produced and publishes it, exactly once, the
//! items sent twice marked `resent`.

use std::time::Duration;

use batchd_core::ledger::field;
use batchd_core::reference::ChunkReferences;
use batchd_core::result::{ItemFailure, ItemResponse, code};
use batchd_core::{
    ChunkRef, ChunkState, JobError, JobId, JobOutput, JobState, ModelName, RequestId, ResultEntry, ResultStatus,
    UnixMillis,
};
use batchd_provider::RemoteBatch;
use batchd_queue::{
    AddOutcome, ChunkView, Claim, NewChunk, Placement, PublishContext, Rejection, StoreError, Undeliverable,
};
use serde_json::value::RawValue;

use super::Pipeline;
use crate::metrics::{self};
use crate::policy::{ChunkOutcome, assemble, plan_chunks};

/// How a job ends.
#[derive(Debug)]
pub(crate) enum Ending<'a> {
    /// Refused at take-in before anything was submitted (not a job, an invalid job, or one batchd cannot split):
    /// a `failed` result, a finished ledger, the entry acknowledged (and copied to the dead-letter stream when it
    /// is not a job at all).
    Rejected(Rejection<'a>),
    /// An ingress entry the consumer group delivered more than `ingress.max_deliveries` times without it being
    /// taken in (its take-in fails, or crashes the replica, every time): moved to the dead-letter stream unread, its
    /// entry id's job `failed`. Done only while the entry is still pending with that many deliveries.
    Undeliverable {
        /// The entry's id (also its job id: the entry is never read as a job).
        entry_id: &'a str,
        /// Its fields, copied (bounded) to the dead-letter stream.
        fields: &'a [(String, Vec<u8>)],
        /// The consumer group's delivery count.
        deliveries: u64,
        /// `ingress.max_deliveries`.
        max_deliveries: u64,
    },
    /// Every batch finished (if one failed as a whole, the job ends `failed`, listing it).
    Finished,
    /// The job's only batch finished with every item answered: published from what the poll read, without
    /// storing the output or reading the ledger again (the common case).
    FinishedOneBatch {
        /// The job's context, from the chunk's view.
        context: PublishContext,
        /// The batch's output.
        output: JobOutput,
    },
    /// The job cannot go on.
    Failed(JobError),
    /// The deadline passed.
    Expired(JobError),
    /// Cancelled on request.
    Cancelled(JobError),
}

impl Pipeline {
    /// Every chunk has finished: resubmit, once, the items the provider expired (and, with `retry_failed_items`,
    /// the other failed ones it did not refuse) while the deadline leaves room; otherwise publish.
    /// The step holds `claim` (of one of the job's chunks), which fences the resubmission.
    pub(super) async fn finish(&self, claim: &Claim) -> Result<(), StoreError> {
        let job_id = &claim.chunk.job_id;
        let Some(context) = self.store.publish_context(job_id).await? else {
            return Ok(());
        };
        if context.chunks.iter().any(|chunk| !matches!(chunk.state, Some(ChunkState::Done | ChunkState::Failed))) {
            return Ok(()); // not every chunk has finished yet
        }
        if !context.retried && self.resend_items(claim, &context).await? {
            return Ok(());
        }
        self.conclude_with(job_id, context, Ending::Finished).await
    }

    /// Adds one more round of chunks carrying the items to send again ([`resend`]), when the job's deadline is
    /// at least [`RESEND_ROOM`] away; returns whether it did. Each item is sent twice at most: the round is marked
    /// on the ledger (`retried`), and there is one per job.
    async fn resend_items(&self, claim: &Claim, context: &PublishContext) -> Result<bool, StoreError> {
        let job_id = &claim.chunk.job_id;
        let mut indices = Vec::new();
        let mut requests = Vec::new();
        for chunk in &context.chunks {
            let Some(output) = chunk.output.as_deref().and_then(|text| serde_json::from_str::<JobOutput>(text).ok())
            else {
                continue;
            };
            let again: Vec<usize> = output
                .responses
                .iter()
                .filter(|response| resend(response, self.split.resend_expired_items, context.retry_failed_items))
                .map(|response| response.index)
                .collect();
            if again.is_empty() {
                continue;
            }
            let stored = self.store.chunk_requests(&ChunkRef::new(job_id.clone(), chunk.index)).await?;
            for local in again {
                if let (Some(index), Some(item)) = (chunk.placement.job_index(local), stored.get(local)) {
                    indices.push(index);
                    requests.push(item.clone());
                }
            }
        }
        if indices.is_empty() {
            return Ok(false);
        }
        let now = self.store.now().await?;
        let deadline_at = match &claim.view {
            Some(view) => view.deadline_at,
            None => match self.store.load_chunk(&claim.chunk).await? {
                Some(view) => view.deadline_at,
                None => return Ok(false),
            },
        };
        if deadline_at.saturating_sub(now) < RESEND_ROOM.as_millis() as u64 {
            tracing::info!(job_id = %job_id, n_items = indices.len(), "items to send again, but the deadline is too close; published as they are");
            return Ok(false);
        }
        let sizes: Vec<usize> = requests.iter().map(|item| item.get().len()).collect();
        let Ok(model) = ModelName::parse(&context.model) else {
            return Ok(false);
        };
        let Ok(provider) = self.providers.for_model(&model) else {
            return Ok(false);
        };
        let limits = provider.limits();
        let Ok(plan) = plan_chunks(&sizes, limits.body, limits.max_body_bytes, limits.max_items) else {
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
        match self.store.add_chunks(claim, now, false, Some(field::RETRIED), &chunks).await? {
            AddOutcome::Added => {
                tracing::info!(job_id = %job_id, n_items = n, "sending expired (or failed) items once more");
                Ok(true)
            }
            AddOutcome::AlreadyDone | AddOutcome::Gone => Ok(false),
        }
    }

    /// Ends a job past its deadline at once, with what it had (the shared-batch rule, DESIGN decision 20): a member
    /// of a shared pack (whose batch may still run for the other members, and is cancelled only when no member
    /// needs it) or a pack itself. Any other job settles its remote work first ([`Pipeline::settle_deadline`]).
    pub(super) async fn expire(&self, job_id: &JobId, view: &ChunkView, now: UnixMillis) -> Result<(), StoreError> {
        let waited = Duration::from_millis(now.saturating_sub(view.accepted_at));
        let error = JobError::new(
            code::DEADLINE_EXCEEDED,
            format!(
                "the job's deadline passed after {}s before the Batch API finished; its requests share a remote batch \
                 with other jobs, which is cancelled only when no job needs it any more: the responses delivered by \
                 then are included, the rest are not collected",
                waited.as_secs()
            ),
        );
        tracing::warn!(job_id = %job_id, "packed job expired");
        self.conclude(job_id, Ending::Expired(error)).await
    }

    /// Ends the job, whichever way: records a rejection, or assembles whatever its chunks produced and publishes
    /// the one result entry. The only way a job ends.
    pub(crate) async fn conclude(&self, job_id: &JobId, ending: Ending<'_>) -> Result<(), StoreError> {
        match ending {
            Ending::Rejected(rejection) => self.record_rejection(&rejection).await,
            Ending::Undeliverable { entry_id, fields, deliveries, max_deliveries } => {
                let now = self.store.now().await?;
                let moved =
                    self.store.dead_letter_undeliverable(entry_id, fields, deliveries, max_deliveries, now).await?;
                match moved {
                    Undeliverable::Moved { published } => {
                        metrics::entry_undeliverable(published);
                        tracing::error!(
                            entry_id = %entry_id,
                            deliveries,
                            max_deliveries,
                            failed_result = published,
                            "ingress entry delivered too many times; moved to the dead-letter stream"
                        );
                    }
                    Undeliverable::Gone => tracing::debug!(entry_id = %entry_id, "entry finished meanwhile"),
                }
                Ok(())
            }
            Ending::FinishedOneBatch { context, mut output } => {
                if context.n_references > 0 {
                    // Published from the poll: the chunk's references are read here, only for a job that has some.
                    let chunk = ChunkRef::new(job_id.clone(), context.chunks.first().map_or(0, |chunk| chunk.index));
                    let stored = self.store.chunk_references(&chunk).await?;
                    echo_references(&mut output, job_id, stored.as_deref());
                }
                self.publish(job_id, &context, JobState::Completed, Some(output), None).await.map(drop)
            }
            ending => {
                let Some(context) = self.store.publish_context(job_id).await? else {
                    return Ok(());
                };
                self.conclude_with(job_id, context, ending).await
            }
        }
    }

    /// Records a rejection; a job id that already has a ledger is a duplicate (acknowledged only).
    async fn record_rejection(&self, rejection: &Rejection<'_>) -> Result<(), StoreError> {
        let now = self.store.now().await?;
        let job_id = rejection.job_id;
        if self.store.reject(rejection, now).await? {
            // The metric's label takes the known rejection codes only.
            let reason = [code::INVALID_ENTRY, code::INVALID_JOB, code::ITEM_TOO_LARGE]
                .into_iter()
                .find(|known| *known == rejection.error.code)
                .unwrap_or(code::INVALID_JOB);
            metrics::job_rejected(reason);
            tracing::warn!(
                job_id = %job_id,
                error = %rejection.error.message,
                dead_lettered = rejection.dead.is_some(),
                "job rejected; nothing was submitted"
            );
        } else {
            metrics::job_duplicate();
            tracing::warn!(job_id = %job_id, "rejected entry repeats an existing job id; acknowledged only");
        }
        Ok(())
    }

    /// Assembles what the job's chunks produced and publishes it as the job's one result, ending as `ending` says.
    pub(super) async fn conclude_with(
        &self,
        job_id: &JobId,
        mut context: PublishContext,
        ending: Ending<'_>,
    ) -> Result<(), StoreError> {
        if job_id.is_pack() {
            // A pack publishes nothing itself: its members are handed their items' responses.
            return self.deliver(job_id, context, ending).await;
        }
        let cancelled = matches!(ending, Ending::Cancelled(_));
        let settled = cancelled || matches!(ending, Ending::Expired(_));
        let mut chunks = Vec::with_capacity(context.chunks.len());
        let mut references = Vec::new();
        for chunk in &mut context.chunks {
            references.extend(chunk.references.take());
            let outcome = chunk_outcome(job_id, chunk, cancelled)?;
            chunks.push((chunk.index, chunk.placement.clone(), outcome));
        }
        let (state, error, unanswered) = match ending {
            Ending::Finished | Ending::FinishedOneBatch { .. } | Ending::Rejected(_) | Ending::Undeliverable { .. } => {
                (JobState::Completed, None, JobError::new("missing", "no response for this item"))
            }
            Ending::Failed(error) => (JobState::Failed, Some(error.clone()), error),
            Ending::Expired(error) => (JobState::Expired, Some(error.clone()), error),
            Ending::Cancelled(error) => (JobState::Cancelled, Some(error.clone()), error),
        };
        let any_done = chunks.iter().any(|(_, _, outcome)| matches!(outcome, ChunkOutcome::Done(_)));
        let resent = resent_items(&chunks);
        let mut output = assemble(context.n_items, chunks, &unanswered);
        for index in resent {
            if let Some(response) = output.responses.get_mut(index) {
                response.resent = true;
            }
        }
        // Every item's reference on its response, however it ended (a split chunk's are on its first piece).
        for stored in references {
            echo_references(&mut output, job_id, Some(&stored));
        }
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
        let published = self.publish(job_id, &context, state, include_result.then_some(output), error).await?;
        if published && state != JobState::Completed {
            // A job that ended early (cancelled, expired, failed) may leave a shared batch nobody needs.
            self.leave_packs(job_id, &context).await;
        }
        if published {
            // A cancelled or expired job's batches still running were just asked to cancel once more
            // (`conclude_settled`); a packed member has no batch of its own.
            self.settle_remote(job_id, &context, !settled).await;
        }
        Ok(())
    }

    /// After a job's result is published: what its chunks left at the provider is settled, best effort (STYLE
    /// rule 31). A done chunk's batch was cleaned up by its poll; every other chunk that recorded a batch or a file
    /// (a failed one whose results could not be read, one still running at the deadline or past a cancel's wait,
    /// a submit that gave up after its upload) has its running batch cancelled where the provider can, and its
    /// files and batch deleted. Each attempt is counted (`batchd_remote_cleanups_total`); nothing here changes
    /// the result. `cancel_running`: whether a batch still running is asked to cancel here.
    pub(super) async fn settle_remote(&self, job_id: &JobId, context: &PublishContext, cancel_running: bool) {
        let left: Vec<(u32, Option<ChunkState>)> = context
            .chunks
            .iter()
            .filter(|chunk| chunk.state != Some(ChunkState::Done))
            .map(|chunk| (chunk.index, chunk.state))
            .collect();
        if left.is_empty() {
            return;
        }
        let Ok(model) = ModelName::parse(&context.model) else { return };
        let Ok(provider) = self.providers.for_model(&model) else { return };
        for (index, state) in left {
            let chunk = ChunkRef::new(job_id.clone(), index);
            let remote = match self.store.chunk_remote(&chunk).await {
                Ok((id, refs)) => {
                    RemoteBatch::from_ledger(id.and_then(|id| RequestId::parse(&id).ok()), refs.as_deref())
                }
                Err(error) => {
                    tracing::warn!(job_id = %job_id, chunk = index, error = %error, "could not read what a finished job's chunk left at its provider; not cleaned up");
                    continue;
                }
            };
            let Some(remote) = remote.filter(|remote| remote.id.is_some() || remote.input_file.is_some()) else {
                continue;
            };
            let running =
                cancel_running && remote.id.is_some() && state == Some(ChunkState::Polling) && provider.can_cancel();
            if running && let Err(error) = provider.cancel(&model, &remote).await {
                tracing::warn!(job_id = %job_id, chunk = index, error = %error, "could not cancel a finished job's running batch");
            }
            let outcome = match provider.clean_up(&remote).await {
                Ok(()) => "ok",
                Err(error) => {
                    tracing::warn!(job_id = %job_id, chunk = index, error = %error, "could not clean up what a finished job's chunk left at its provider");
                    "failed"
                }
            };
            metrics::remote_cleanup(provider.name(), outcome);
        }
    }

    /// Publishes the result entry (exactly once per job, guarded by the ledger state); whether this call published
    /// it. `output` is left out when no batch of a job that did not complete had finished.
    async fn publish(
        &self,
        job_id: &JobId,
        context: &PublishContext,
        state: JobState,
        output: Option<JobOutput>,
        error: Option<JobError>,
    ) -> Result<bool, StoreError> {
        let status = match state {
            JobState::Completed => ResultStatus::Completed,
            JobState::Expired => ResultStatus::Expired,
            JobState::Cancelled => ResultStatus::Cancelled,
            _ => ResultStatus::Failed,
        };
        let now = self.store.now().await?;
        let mut output = output;
        if let Some(output) = output.as_mut() {
            self.pricing.add_cost(&context.model, &mut output.usage);
        }
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
        let published = self.store.publish(job_id, entry, state, &context.reply_to, now).await?;
        if published {
            let turnaround = Duration::from_millis(now.saturating_sub(context.accepted_at));
            metrics::job_finished(status.as_str(), turnaround);
            if let Some(usage) = usage {
                metrics::tokens(&context.model, &usage);
                metrics::cost(&context.model, &usage);
                self.spend.add_spent(&usage);
            }
            tracing::info!(
                job_id = %job_id,
                status = %status,
                items_failed,
                turnaround_ms = turnaround.as_millis() as u64,
                "result published"
            );
        }
        Ok(published)
    }
}

/// The least time before a job's deadline for its expired (or failed) items to be sent again: less would mostly
/// buy a batch cancelled at the deadline.
const RESEND_ROOM: Duration = Duration::from_secs(300);

/// Whether a response's item is sent again in the job's one extra round: an item the provider expired (its
/// window closed before it ran) with `resend_expired` (`jobs.resend_expired_items`, on by default); another
/// failure only with `retry_failed_items`, and never one the provider refused (a 4xx: the same request gets the
/// same answer).
fn resend(response: &ItemResponse, resend_expired: bool, retry_failed_items: bool) -> bool {
    match response.failure_kind() {
        Some(ItemFailure::Expired) => resend_expired || retry_failed_items,
        Some(ItemFailure::Other) => retry_failed_items,
        Some(ItemFailure::Refused) | None => false,
    }
}

/// Marks the responses of items that were sent twice: those of the chunks of the extra round (placed by index)
/// that ran, `Done` or `Failed`. `chunks`: the job's chunks as assembled.
fn resent_items(chunks: &[(u32, Placement, ChunkOutcome)]) -> Vec<usize> {
    chunks
        .iter()
        .filter(|(_, placement, outcome)| {
            matches!(placement, Placement::Indices(_))
                && matches!(outcome, ChunkOutcome::Done(_) | ChunkOutcome::Failed { .. })
        })
        .flat_map(|(_, placement, _)| placement.job_indices())
        .collect()
}

/// What a chunk's stored record says it produced, for assembling its job's (or its pack's) output. Its stored
/// output is moved out and dropped as soon as it is parsed. `cancelled`: the job ends cancelled, so a chunk never
/// sent is `not run`.
pub(super) fn chunk_outcome(
    job_id: &JobId,
    chunk: &mut batchd_queue::ChunkRecord,
    cancelled: bool,
) -> Result<ChunkOutcome, StoreError> {
    let output = chunk.output.take();
    Ok(match chunk.state {
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
        // In a pack that was sent: it may still run (and be billed); its answers are dropped when they come.
        Some(ChunkState::Pending)
            if chunk.pack.as_deref().is_some_and(|pack| pack != batchd_core::ids::PACK_QUEUED) =>
        {
            ChunkOutcome::Unfinished
        }
        // Never sent: a cancelled job's batch that was still waiting to be submitted.
        Some(ChunkState::Pending) if cancelled => ChunkOutcome::NotRun,
        _ => ChunkOutcome::Unfinished,
    })
}

/// Puts a chunk's stored `external_reference`s on their items' responses (see [`batchd_core::reference`]); an
/// unreadable record is logged and skipped (the result goes out without them rather than not at all).
fn echo_references(output: &mut JobOutput, job_id: &JobId, stored: Option<&str>) {
    let Some(stored) = stored else {
        return;
    };
    match ChunkReferences::read(stored) {
        Some(references) => batchd_core::reference::echo(output, references),
        None => {
            tracing::warn!(job_id = %job_id, "a chunk's stored external_reference values are unreadable; they are not echoed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(error: &str) -> ItemResponse {
        ItemResponse::failure(0, Some(RawValue::from_string(error.to_owned()).unwrap()))
    }

    #[test]
    fn expired_items_are_resent_by_default_other_failures_only_when_asked_and_refusals_never() {
        let expired = failed(r#"{"code":"batch_expired","message":"x"}"#);
        let refused = failed(r#"{"code":"invalid_request_error","message":"x","http_status":400}"#);
        let server = failed(r#"{"code":"server_error","message":"x","http_status":500}"#);
        assert!(resend(&expired, true, false) && resend(&expired, true, true));
        assert!(!resend(&expired, false, false), "expired items are resent unless jobs.resend_expired_items is off");
        for (expired, all) in [(false, false), (true, false), (false, true), (true, true)] {
            assert!(!resend(&refused, expired, all), "a 4xx is never resent");
            assert_eq!(resend(&server, expired, all), all, "another failure only with retry_failed_items");
        }
        let success = ItemResponse { success: true, ..failed("{}") };
        assert!(!resend(&success, true, true));
    }

    #[test]
    fn only_items_of_the_extra_round_that_ran_are_marked_resent() {
        let output = JobOutput { responses: Vec::new(), usage: serde_json::json!({}), failed_batches: Vec::new() };
        let chunks = vec![
            (0, Placement::Range { start: 0, len: 4 }, ChunkOutcome::Done(output.clone())),
            (1, Placement::Indices(vec![1, 3]), ChunkOutcome::Done(output)),
            (2, Placement::Indices(vec![2]), ChunkOutcome::Unfinished),
        ];
        assert_eq!(resent_items(&chunks), [1, 3]);
    }
}
