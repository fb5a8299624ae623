//! Packs: small jobs of one provider, model and endpoint share one remote batch (DESIGN decision 20).
//!
//! Take-in queues a packable job's one chunk under its packing key (`<model>|<endpoint>`) instead of posting it.
//! The packer ([`Pipeline::run_packer`]) forms packs when a key is due (a queued job waited `packing.window_ms`,
//! or half the time left to its deadline when that is shorter; arrivals paused for `packing.pause_ms`; or a full
//! pack is waiting): it fills the key's open pack in queue order (arrival order for jobs with the same wait) up to
//! the provider's limits and makes it due. The pack is a ledger of its own (one chunk,
//! no result entry) in the packs' schedule, so it is submitted, polled, split and looked up by the very steps a
//! job's chunk takes, fenced the same way; while it waits for the provider's limits it stays `pending` and keeps
//! filling, so throttling makes packs bigger, not more numerous. When it ends, [`Pipeline::deliver`] hands each
//! member its items' responses (in runs, resumable after a crash), and each member's job publishes as usual.

use std::sync::Arc;
use std::time::Duration;

use batchd_core::{ChunkState, ItemResponse, Job, JobError, JobId, JobOutput, JobState, ModelName};
use batchd_queue::{Delivery, MAX_PACK_STEP, PackBounds, PackIntake, PackMember, PublishContext, StoreError};
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::take_in::Planned;
use super::{Ending, Pipeline};
use crate::metrics;
use crate::policy::{ChunkOutcome, assemble};

/// Longest the packer sleeps when no packing key is due (bounds how late a key made due by another replica's
/// take-in is noticed).
const PACKER_IDLE: Duration = Duration::from_secs(1);

/// The item bound of a pack at a provider without an item limit.
const NO_ITEM_LIMIT: usize = 1_000_000_000;

/// Most runs of candidates one pass over a packing key takes (each up to [`MAX_PACK_STEP`] chunks).
const MAX_RUNS_PER_PASS: usize = 200;

impl Pipeline {
    /// How a decoded job joins a packing queue, or `None` when it gets a remote batch of its own: packing off,
    /// the job opting out (`"pack": false`), or a job bigger than half a remote batch (big jobs are their own
    /// packs; a small one never waits behind them).
    ///
    /// A job waits in its queue at most `packing.window_ms`, and at most half of `time_left` (the time to its
    /// deadline): a job whose deadline is near makes its pack go sooner, and the other half is left for the
    /// remote batch to run.
    pub(super) fn packing<'k, R: std::borrow::Borrow<RawValue>>(
        &self,
        job: &Job<R>,
        planned: &Planned<'_>,
        first_body: usize,
        key: &'k str,
        time_left: u64,
    ) -> Option<PackIntake<'k>> {
        let provider = planned.provider;
        if !self.packing.enabled || job.pack == Some(false) || planned.plan.len() != 1 {
            return None;
        }
        // An item naming a model of its own could make a whole shared batch fail (OpenAI takes one model per
        // file): such a job gets a batch of its own, as before packs.
        if job.requests.iter().any(|item| item.borrow().get().contains("\"model\"")) {
            return None;
        }
        let limits = provider.limits();
        let small_items = limits.max_items.is_none_or(|max| 2 * job.requests.len() <= max);
        let small_inputs = planned.inputs.is_none_or(|(inputs, max)| 2 * inputs <= max);
        if !small_items || !small_inputs || 2 * first_body > limits.max_body_bytes {
            return None;
        }
        let full_members = limits.max_items.unwrap_or(MAX_PACK_STEP * 20) as u64;
        let window_ms = self.packing.window_ms.min(time_left / 2);
        Some(PackIntake {
            key,
            window_ms,
            pause_ms: self.packing.pause_ms.min(window_ms),
            full_members,
            n_inputs: planned.inputs.map(|(inputs, _)| inputs),
        })
    }

    /// The packer of this replica: forms packs for every packing key that is due, until `stop`. Any replica may
    /// form a key's packs; each pass leases the key (re-scores it) so the others leave it alone meanwhile.
    pub async fn run_packer(self: Arc<Self>, stop: CancellationToken) {
        tracing::info!(namespace = %self.store.keys().namespace(), "packer started");
        let mut delay = batchd_queue::RetryDelay::new();
        while !stop.is_cancelled() {
            let passed = async {
                let now = self.store.now().await?;
                let (due, next) = self.store.due_packers(now, 16).await?;
                for key in &due {
                    self.pack_key(key).await?;
                }
                Ok::<_, StoreError>((due.is_empty(), next.map(|next| next.saturating_sub(now))))
            }
            .await;
            let sleep = match passed {
                Ok((false, _)) => {
                    delay.succeeded();
                    continue;
                }
                Ok((true, next)) => {
                    delay.succeeded();
                    next.map_or(PACKER_IDLE, |millis| Duration::from_millis(millis).min(PACKER_IDLE))
                }
                Err(error) => {
                    metrics::redis_error("pack");
                    tracing::warn!(error = %error, "packer could not read or form packs; trying again");
                    delay.failed()
                }
            };
            tokio::select! {
                () = stop.cancelled() => break,
                () = self.store.packing_queued() => {}
                () = tokio::time::sleep(sleep.max(Duration::from_millis(1))) => {}
            }
        }
    }

    /// One pass over a due packing key: fill its open pack (a new one when it was sent or is full) from the queue
    /// in arrival order, then make each pack filled due, so its submit step sends it.
    async fn pack_key(&self, key: &str) -> Result<(), StoreError> {
        let now = self.store.now().await?;
        let lease_until = now + self.lease.as_millis() as u64;
        self.store.defer_packer(key, lease_until).await?;
        let routed = key.rsplit_once('|').and_then(|(model, endpoint)| {
            let model = ModelName::parse(model).ok()?;
            let provider = Arc::clone(self.providers.for_model(&model).ok()?);
            Some((model, (!endpoint.is_empty()).then(|| endpoint.to_owned()), provider))
        });
        let Some((model, endpoint, provider)) = routed else {
            // Queued by a replica of another configuration: their jobs end at their deadlines.
            tracing::warn!(key = %key, "no provider for a packing key's model; its queued jobs wait for their deadline");
            return self.store.defer_packer(key, now + self.lease.as_millis() as u64).await;
        };
        let limits = provider.limits();
        let envelope = limits.body.envelope + limits.body.separator;
        let bounds = PackBounds {
            // No item limit: bounded by bytes alone (the scripts' numbers have at most 15 digits).
            max_items: limits.max_items.unwrap_or(NO_ITEM_LIMIT),
            max_bytes: limits.max_body_bytes.saturating_sub(envelope),
            per_item: limits.body.per_item + limits.body.separator,
            max_inputs: provider.input_limit(&model, endpoint.as_deref()).map(|limit| limit.max_inputs),
        };
        // Only a pack formed in this pass is released (made due) at its end: a pack formed earlier was released
        // then, and may be claimed by a replica's submit step now, or wait for the provider's limits; lowering its
        // score would let a second replica claim it and create its batch again while the first one creates it.
        let open = self.store.open_pack(key).await?;
        let mut fresh = open.is_none();
        let mut pack = open.unwrap_or_else(new_pack_id);
        let mut filled: Vec<(JobId, usize, bool)> = Vec::new();
        for _ in 0..MAX_RUNS_PER_PASS {
            let candidates = self.store.pack_candidates(key, MAX_PACK_STEP).await?;
            if candidates.is_empty() {
                break;
            }
            let formed = self
                .store
                .form_pack(key, &pack, model.as_str(), endpoint.as_deref(), bounds, lease_until, &candidates)
                .await?;
            if !formed.open {
                // Sent meanwhile (sealed), or every candidate dropped: anything still queued goes to a new pack.
                if formed.left == 0 {
                    break;
                }
                (pack, fresh) = (new_pack_id(), true);
                continue;
            }
            match filled.last_mut() {
                Some((id, n, _)) if *id == pack => *n += formed.added,
                _ => filled.push((pack.clone(), formed.added, fresh)),
            }
            if formed.full {
                (pack, fresh) = (new_pack_id(), true);
            } else if formed.left == 0 {
                break;
            }
        }
        let now = self.store.now().await?;
        for (pack, added, fresh) in &filled {
            if *fresh {
                self.store.release_pack(pack, now).await?;
            }
            metrics::pack_filled(provider.name(), *added);
            tracing::debug!(pack = %pack, key = %key, added, "pack filled");
        }
        // More queued than one pass takes: the key stays due.
        if !self.store.pack_candidates(key, 1).await?.is_empty() {
            self.store.defer_packer(key, now).await?;
        }
        Ok(())
    }

    /// A pack ended (`ending`: finished, or failed, expired or cancelled as a whole): hands each member its
    /// items' responses, a run of members at a time from the pack's cursor (a delivery repeated after a crash
    /// skips members already served), then closes the pack and settles what it left at the provider.
    pub(super) async fn deliver(
        &self,
        pack_id: &JobId,
        mut context: PublishContext,
        ending: Ending<'_>,
    ) -> Result<(), StoreError> {
        let (state, ended) = match &ending {
            Ending::Failed(error) => (JobState::Failed, Some(error.clone())),
            Ending::Expired(error) => (JobState::Expired, Some(error.clone())),
            Ending::Cancelled(error) => (JobState::Cancelled, Some(error.clone())),
            _ => (JobState::Completed, None),
        };
        let unanswered = ended.clone().unwrap_or_else(|| JobError::new("missing", "no response for this item"));
        let request_id = context.chunks.iter().find_map(|chunk| chunk.request_id.clone()).unwrap_or_default();
        let mut chunks = Vec::with_capacity(context.chunks.len());
        for chunk in &mut context.chunks {
            // A pack is never cancelled as "not run": its unsent chunk leaves its items unanswered.
            let outcome = super::finish::chunk_outcome(pack_id, chunk, false)?;
            chunks.push((chunk.index, chunk.placement.clone(), outcome));
        }
        let done: Vec<bool> = {
            let mut done = vec![false; context.n_items];
            for (_, placement, outcome) in &chunks {
                if matches!(outcome, ChunkOutcome::Done(_)) {
                    for index in placement.job_indices() {
                        if let Some(slot) = done.get_mut(index) {
                            *slot = true;
                        }
                    }
                }
            }
            done
        };
        let output = assemble(context.n_items, chunks, &unanswered);
        let batch_error = output.failed_batches.first().map(|failed| failed.error.clone());
        let pack_usage = output.usage.clone();
        let mut responses = output.responses.into_iter().map(Some).collect::<Vec<_>>();
        let mut cursor = self.store.pack_delivered(pack_id).await?;
        // Every member's items start where the members before it end: the offset is counted from the first
        // member, even when a delivery resumes past it.
        let mut offset = 0;
        let mut start = 0;
        let mut n_members = 0;
        loop {
            let members = self.store.pack_members(pack_id, start, MAX_PACK_STEP).await?;
            if members.is_empty() {
                break;
            }
            let run_start = start;
            start += members.len();
            let mut deliveries = Vec::with_capacity(members.len());
            for member in &members {
                let range = offset..(offset + member.n_items).min(responses.len());
                offset += member.n_items;
                if run_start < cursor {
                    continue;
                }
                let any_done = range.clone().any(|index| done[index]);
                let taken: Vec<ItemResponse> = responses[range].iter_mut().filter_map(Option::take).collect();
                deliveries.push(member_delivery(member, taken, any_done, &ended, &batch_error, &pack_usage, &context));
            }
            n_members += members.len();
            if run_start < cursor {
                continue;
            }
            match self.store.deliver_pack(pack_id, &request_id, cursor, &deliveries).await? {
                Some(at) => cursor = at,
                // Another replica delivered meanwhile: it carries on from its own cursor.
                None => return Ok(()),
            }
        }
        if self.store.close_pack(pack_id, state).await? {
            metrics::pack_delivered();
            tracing::debug!(pack = %pack_id, n_members, state = %state, "pack delivered to its members");
            self.settle_remote(pack_id, &context, state != JobState::Cancelled).await;
        }
        Ok(())
    }
}

impl Pipeline {
    /// After a member's job ended before its pack did: when no job of the pack needs it any more, the pack is
    /// cancelled (its remote batch too, where the provider can cancel). Best effort: the pack runs to its end
    /// otherwise, and its answers for ended jobs are dropped.
    pub(super) async fn leave_packs(&self, job_id: &JobId, context: &PublishContext) {
        let packs = context
            .chunks
            .iter()
            .filter_map(|chunk| chunk.pack.as_deref())
            .filter(|pack| pack.starts_with(batchd_core::ids::PACK_PREFIX));
        for pack in packs {
            let Ok(pack) = JobId::parse(pack) else { continue };
            let unneeded = match self.store.pack_unneeded(&pack).await {
                Ok(unneeded) => unneeded,
                Err(error) => {
                    tracing::warn!(job_id = %job_id, pack = %pack, error = %error, "could not check whether a pack is still needed; it runs on");
                    continue;
                }
            };
            if !unneeded {
                continue;
            }
            match self.store.cancel(&pack, "every job in this pack ended before it").await {
                Ok(_) => {
                    tracing::info!(job_id = %job_id, pack = %pack, "no job needs its pack any more; the pack is cancelled")
                }
                Err(error) => {
                    tracing::warn!(job_id = %job_id, pack = %pack, error = %error, "could not cancel an unneeded pack; it runs on")
                }
            }
        }
    }
}

/// What one member of an ended pack is handed: its items' responses (re-indexed from 0, with its share of the
/// usage) when any of them ran, otherwise the failure that ended them.
fn member_delivery(
    member: &PackMember,
    mut taken: Vec<ItemResponse>,
    any_done: bool,
    ended: &Option<JobError>,
    batch_error: &Option<JobError>,
    pack_usage: &serde_json::Value,
    context: &PublishContext,
) -> Delivery {
    let failure = if any_done { None } else { ended.clone().or_else(|| batch_error.clone()) };
    if let Some(error) = failure {
        let payload = serde_json::to_string(&error).expect("a job error serialises");
        return Delivery { chunk: member.chunk.clone(), state: ChunkState::Failed, payload };
    }
    let first = taken.first().map_or(0, |response| response.index);
    for response in &mut taken {
        response.index -= first;
    }
    let usage = member_usage(&taken, pack_usage, member.n_items, context.n_items);
    let output = JobOutput { responses: taken, usage, failed_batches: Vec::new() };
    let payload = serde_json::to_string(&output).expect("an output serialises");
    Delivery { chunk: member.chunk.clone(), state: ChunkState::Done, payload }
}

/// A member's token usage: the sum of its own responses' `usage` where the provider reports usage per item
/// (OpenAI, Anthropic); otherwise (a usage per batch, Workers AI) its share of the pack's by item count, marked
/// `"estimated": true`. A pack's usage is never counted once per member.
fn member_usage(
    responses: &[ItemResponse],
    pack_usage: &serde_json::Value,
    n_items: usize,
    pack_items: usize,
) -> serde_json::Value {
    let mut own = serde_json::Map::new();
    for response in responses {
        let Some(result) = &response.result else { continue };
        let Ok(body) = serde_json::from_str::<ItemUsage>(result.get()) else { continue };
        for (name, value) in body.usage.into_iter().flatten().take(32) {
            if let Some(n) = value.as_u64() {
                let sum = own.get(&name).and_then(serde_json::Value::as_u64).unwrap_or(0) + n;
                own.insert(name, sum.into());
            }
        }
    }
    if !own.is_empty() {
        return serde_json::Value::Object(own);
    }
    let serde_json::Value::Object(fields) = pack_usage else {
        return serde_json::Value::Object(own);
    };
    let mut share = serde_json::Map::new();
    for (name, value) in fields {
        if let Some(n) = value.as_u64() {
            let part = (n as u128 * n_items as u128 / pack_items.max(1) as u128) as u64;
            share.insert(name.clone(), part.into());
        }
    }
    if !share.is_empty() {
        share.insert("estimated".to_owned(), true.into());
    }
    serde_json::Value::Object(share)
}

/// The `usage` member of an item's result, when it has one.
#[derive(serde::Deserialize)]
struct ItemUsage {
    usage: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A fresh pack id: [`batchd_core::ids::PACK_PREFIX`] and 128 random bits.
fn new_pack_id() -> JobId {
    let id = format!("{}{:016x}{:016x}", batchd_core::ids::PACK_PREFIX, rand::random::<u64>(), rand::random::<u64>());
    JobId::parse(&id).expect("a pack id is a valid job id")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(index: usize, result: &str) -> ItemResponse {
        ItemResponse {
            index,
            success: true,
            result: Some(RawValue::from_string(result.to_owned()).unwrap()),
            error: None,
            external_reference: None,
            resent: false,
        }
    }

    #[test]
    fn a_member_counts_its_own_items_usage_where_items_report_it() {
        let responses =
            [response(0, r#"{"usage":{"prompt_tokens":3}}"#), response(1, r#"{"usage":{"prompt_tokens":4}}"#)];
        let pack = serde_json::json!({"prompt_tokens": 1000});
        assert_eq!(member_usage(&responses, &pack, 2, 100), serde_json::json!({"prompt_tokens": 7}));
    }

    #[test]
    fn a_member_gets_an_estimated_share_of_a_usage_reported_per_batch() {
        let responses = [response(0, r#"{"response":"hi"}"#)];
        let pack = serde_json::json!({"prompt_tokens": 1000, "completion_tokens": 10});
        assert_eq!(
            member_usage(&responses, &pack, 1, 4),
            serde_json::json!({"prompt_tokens": 250, "completion_tokens": 2, "estimated": true})
        );
        assert_eq!(member_usage(&responses, &serde_json::json!({}), 1, 4), serde_json::json!({}));
    }

    #[test]
    fn pack_ids_are_job_ids_that_say_they_are_packs() {
        let id = new_pack_id();
        assert!(id.is_pack());
        assert_ne!(id, new_pack_id());
    }
}
