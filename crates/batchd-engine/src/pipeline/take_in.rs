//! Take-in: an ingress entry becomes a job (decoded, its batches planned, then queued for a pack or given batches
//! of its own, the first posted at once) or a rejection with a result that says why.

use std::time::Duration;

use crate::runtime::IngressEntry;
use batchd_core::reference::{self, ChunkReferences};
use batchd_core::result::code;
use batchd_core::{DecodeError, Job, JobError, JobId, UnixMillis};
use batchd_provider::Provider;
use batchd_queue::{Accepted, Claim, DeadLetter, Intake, MAX_CHUNKS_PER_JOB, Placement, Rejection, StoreError};
use serde_json::value::RawValue;

use super::submit::Post;
use super::{Ending, Pipeline};
use crate::metrics::{self, ApiCall};
use crate::policy::plan_chunks_with_inputs;

/// A refusal at take-in: the result's error code and its message.
type Refusal = (&'static str, String);

/// What planning a decoded job found: its provider, its items' sizes, its batches and their `external_reference`s.
pub(super) struct Planned<'p> {
    /// The provider its model routes to.
    pub(super) provider: &'p dyn Provider,
    /// Each item's size, bytes.
    pub(super) sizes: Vec<usize>,
    /// Its batches, `(first item, items)`.
    pub(super) plan: Vec<(usize, usize)>,
    /// The batches' `external_reference`s kept by batchd (for a provider that does not echo them).
    pub(super) references: Vec<(u32, ChunkReferences)>,
    /// The job's inputs and the most one batch may hold, when its provider limits them
    /// ([`Provider::input_limit`]).
    pub(super) inputs: Option<(usize, usize)>,
}

impl Pipeline {
    /// Takes in one ingress entry, in named phases: decode it (or reject the entry), plan the job's batches (or
    /// refuse the job, saying why), then accept it, either into its packing key's queue (the packer submits it
    /// with other jobs) or with batches of its own, the first posted straight away.
    // Spans are debug-level: at info they cost ~12% of the daemon's CPU per job (a profile of an earlier round), so
    // every warn and error event names its job (and chunk) itself.
    #[tracing::instrument(level = "debug", skip_all, fields(entry_id = %entry.id, job_id = tracing::field::Empty))]
    pub async fn take_in(&self, entry: IngressEntry) -> Result<(), StoreError> {
        let now = self.store.now().await?;
        // The items stay views into the entry's `job` field: a big job is held once, not twice.
        let job = match Job::decode_borrowed(&entry.fields, &entry.id, &self.limits, self.store.keys()) {
            Ok(job) => job,
            Err(error) => return self.reject(entry, error).await,
        };
        let entry_id = entry.id.as_str();
        tracing::Span::current().record("job_id", tracing::field::display(&job.id));
        let planned = match self.plan(&job) {
            Ok(planned) => planned,
            Err((reason, message)) => return self.refuse(&job, entry_id, reason, message).await,
        };
        let deadline_at = self.deadline_at(&job, planned.provider, now);
        let first_body = planned.provider.limits().body.bytes(planned.sizes[..planned.plan[0].1].iter().copied());
        let key = packing_key(&job.model, job.endpoint.as_deref());
        let intake = Intake {
            entry_id,
            plan: &planned.plan,
            now,
            deadline_at,
            first_due: deadline_at,
            retry_failed_items: job.retry_failed_items.unwrap_or(self.split.retry_failed_items),
            submit_first: false,
            references: &planned.references,
            pack: self.packing(&job, &planned, first_body, &key, deadline_at.saturating_sub(now)),
        };
        if intake.pack.is_some() {
            // Queued for its packing key: scheduled only for its deadline, submitted by the packer.
            let accepted = self.store.accept(&job, &intake).await?;
            self.accepted(&job, &accepted, planned.plan.len());
            return Ok(());
        }
        self.accept_own(&job, &planned, intake, first_body).await
    }

    /// Routes a decoded job to its provider and plans its batches under the provider's limits; refuses a job that
    /// cannot run (no provider for its model, a model that cannot batch, an item too large, too many batches,
    /// too many `external_reference` bytes to keep).
    fn plan<'p, R: std::borrow::Borrow<RawValue>>(&'p self, job: &Job<R>) -> Result<Planned<'p>, Refusal> {
        let provider = match self.providers.for_model(&job.model) {
            Ok(provider) => provider.as_ref(),
            Err(reason) => return Err((code::INVALID_JOB, reason)),
        };
        provider.check_model(&job.model).map_err(|reason| (code::MODEL_NOT_BATCHABLE, reason))?;
        let limits = provider.limits();
        let sizes: Vec<usize> = job.requests.iter().map(|item| item.borrow().get().len()).collect();
        // A limit on inputs (OpenAI: embedding inputs per batch) is planned under too: only such jobs count them.
        let input_limit = provider.input_limit(&job.model, job.endpoint.as_deref());
        let counts: Vec<usize> = input_limit
            .map(|limit| job.requests.iter().map(|item| (limit.inputs_of)(item.borrow())).collect())
            .unwrap_or_default();
        let inputs = input_limit.map(|limit| (counts.as_slice(), limit.max_inputs));
        let plan = plan_chunks_with_inputs(&sizes, limits.body, limits.max_body_bytes, limits.max_items, inputs)
            .map_err(|too_large| {
            let message = format!(
                "request item {} is {} bytes: sent alone it makes a {}-byte body, over the payload limit of {} bytes \
                 ({}); nothing was submitted",
                too_large.index,
                too_large.bytes,
                too_large.body_bytes,
                limits.max_body_bytes,
                payload_setting(provider.name())
            );
            (code::ITEM_TOO_LARGE, message)
        })?;
        if plan.len() > MAX_CHUNKS_PER_JOB as usize {
            let message = format!(
                "the job needs {} batches, more than the {MAX_CHUNKS_PER_JOB} one job may have: split it into smaller \
                 jobs (or raise jobs.max_batch_items); nothing was submitted",
                plan.len()
            );
            return Err((code::INVALID_JOB, message));
        }
        // A provider that does not echo `external_reference` gets items without it; batchd keeps each chunk's in
        // the ledger with the job (nothing for a job without any) and echoes them in the result.
        let references =
            if provider.echoes_external_reference() { Vec::new() } else { chunk_references(&job.requests, &plan) };
        if let Some((chunk, too_many)) =
            references.iter().find(|(_, references)| references.as_str().len() > reference::MAX_CHUNK_BYTES)
        {
            let message = format!(
                "the external_reference values of batch {chunk}'s items take {} bytes, more than the {} bytes batchd \
                 keeps per batch to echo them (the {} provider does not echo them itself): shorten them or send \
                 fewer items per job; nothing was submitted",
                too_many.as_str().len(),
                reference::MAX_CHUNK_BYTES,
                provider.name()
            );
            return Err((code::INVALID_JOB, message));
        }
        let inputs = input_limit.map(|limit| (counts.iter().sum(), limit.max_inputs));
        Ok(Planned { provider, sizes, plan, references, inputs })
    }

    /// When a job taken in at `now` for `provider` reaches its deadline: its own `deadline_secs`, or the default
    /// (`jobs.default_deadline_secs`, or the provider's window plus the settle wait and a margin:
    /// [`super::default_deadline`]).
    fn deadline_at<R>(&self, job: &Job<R>, provider: &dyn Provider, now: UnixMillis) -> UnixMillis {
        let deadline = job.deadline_secs.map(Duration::from_secs).unwrap_or_else(|| {
            super::default_deadline(self.default_deadline, provider.capabilities().window, self.deadline_settle)
        });
        // Saturating: a producer may ask for a deadline centuries away.
        now.saturating_add(u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX))
    }

    /// Accepts a job with batches of its own and posts the first at once from the items in hand, when a call slot,
    /// the shared limiter and room in the budget allow; otherwise the first batch is accepted `pending`, due when
    /// its slot comes.
    async fn accept_own(
        &self,
        job: &Job<&RawValue>,
        planned: &Planned<'_>,
        mut intake: Intake<'_>,
        first_body: usize,
    ) -> Result<(), StoreError> {
        // The first batch's body needs room of its own in the budget. The entry already holds room, so this never
        // waits: short of room, the batch goes through the schedule (which waits for room holding nothing), like a
        // throttled one.
        let body_room = self.budget.try_hold(first_body);
        // Ask for a call slot and the shared limiter before the job exists: a throttled first batch is accepted
        // `pending`, due when its slot comes; otherwise it is accepted already `submitting` and posted at once,
        // under its lease, holding its call slot until the post is done.
        let admitted = match &body_room {
            Some(_) => self.admit(planned.provider, &job.model, ApiCall::Submit).await?,
            None => {
                tracing::debug!(first_body, "no room in workers.inflight_bytes for the first batch now; scheduling it");
                Err(Duration::ZERO)
            }
        };
        let (_slot, wait) = match admitted {
            Ok(slot) => (Some(slot), None),
            Err(wait) => (None, Some(wait)),
        };
        intake.first_due = intake.now + wait.unwrap_or(self.lease).as_millis() as u64;
        intake.submit_first = wait.is_none();
        let accepted = self.store.accept(job, &intake).await?;
        self.accepted(job, &accepted, planned.plan.len());
        if matches!(accepted, Accepted::New) && wait.is_none() {
            self.post_first(job, planned, intake.deadline_at).await;
        }
        Ok(())
    }

    /// Posts a just-accepted job's first batch with the items in hand, under the claim the accept step gave it.
    /// A failure is logged: the entry is taken in (acknowledged) and the chunk is retried from the schedule.
    async fn post_first(&self, job: &Job<&RawValue>, planned: &Planned<'_>, deadline_at: UnixMillis) {
        let len = planned.plan[0].1;
        let claim = Claim::first(job.id.clone());
        let post = Post {
            provider: planned.provider,
            model: &job.model,
            endpoint: job.endpoint.as_deref(),
            attempt: 1,
            resubmit: false,
            looked: false,
            checked_at: std::time::Instant::now(),
            deadline_at,
        };
        let posted = self.post(&claim, post, &job.requests[..len], Placement::Range { start: 0, len }).await;
        if let Err(StoreError::StaleClaim { job_id, chunk, detail }) = &posted {
            super::stale_step(job_id, *chunk, detail);
        } else if let Err(error) = posted {
            metrics::redis_error("submit");
            tracing::error!(
                job_id = %job.id,
                error = %error,
                "submitting the first batch failed; it is retried after its lease"
            );
        }
    }

    /// Counts and logs what the accept step answered.
    fn accepted<R>(&self, job: &Job<R>, accepted: &Accepted, n_chunks: usize) {
        match accepted {
            Accepted::New => {
                metrics::job_accepted();
                tracing::debug!(model = %job.model, n_items = job.requests.len(), n_chunks, "job accepted");
            }
            Accepted::CancelRequested => {
                metrics::job_accepted();
                tracing::debug!("job accepted with its cancellation already requested; it is concluded next");
            }
            Accepted::Duplicate { state } => {
                metrics::job_duplicate();
                tracing::warn!(
                    job_id = %job.id,
                    state = %state,
                    "job id seen before: entry acknowledged and not run again (the existing job keeps its one result)"
                );
            }
        }
    }

    /// Ends a decoded job that cannot run (its provider is not configured, its model cannot batch, an item is too
    /// large, too many batches) with a `failed` result saying why; nothing was submitted.
    async fn refuse<R>(&self, job: &Job<R>, entry_id: &str, reason: &str, message: String) -> Result<(), StoreError> {
        let error = JobError::new(reason, message);
        let rejection = Rejection {
            entry_id,
            job_id: &job.id,
            model: job.model.as_str(),
            error: &error,
            dead: None,
            items_total: job.requests.len(),
        };
        self.conclude(&job.id, Ending::Rejected(rejection)).await
    }

    async fn reject(&self, mut entry: IngressEntry, error: DecodeError) -> Result<(), StoreError> {
        let (job_id, job_error, dead) = match &error {
            DecodeError::Undecodable { reason } => {
                let job_id = JobId::parse(&entry.id)
                    .map_err(|e| StoreError::Corrupt { job_id: entry.id.clone(), detail: e.to_string() })?;
                // Moved, not copied: the entry can be tens of MB (an oversize one is refused here unparsed), and the
                // dead-letter stream keeps a bounded prefix of it.
                let dead = DeadLetter { fields: std::mem::take(&mut entry.fields), reason: reason.clone() };
                (job_id, JobError::new(code::INVALID_ENTRY, reason.clone()), Some(dead))
            }
            DecodeError::Invalid { job_id, .. } => {
                (job_id.clone(), JobError::new(code::INVALID_JOB, error.to_string()), None)
            }
        };
        // The model the decoder read, when valid: a rejected entry is never parsed a second time to find it.
        let model = match &error {
            DecodeError::Invalid { model: Some(model), .. } => model.as_str(),
            _ => "",
        };
        let rejection = Rejection {
            entry_id: &entry.id,
            job_id: &job_id,
            model,
            error: &job_error,
            dead: dead.as_ref(),
            items_total: 0,
        };
        self.conclude(&job_id, Ending::Rejected(rejection)).await
    }
}

/// Each planned chunk's `external_reference`s (keyed by job index), for the chunks that have any.
fn chunk_references<R: std::borrow::Borrow<serde_json::value::RawValue>>(
    requests: &[R],
    plan: &[(usize, usize)],
) -> Vec<(u32, ChunkReferences)> {
    plan.iter()
        .enumerate()
        .filter_map(|(chunk, &(start, len))| {
            let items = requests[start..start + len].iter().enumerate();
            let references =
                ChunkReferences::collect(items.map(|(offset, item)| (start + offset, item.borrow().get())));
            references.map(|references| (chunk as u32, references))
        })
        .collect()
}

/// The packing key of a job: the jobs packed together share a provider, a model and an endpoint (and a namespace:
/// the key's queue is under the namespace's prefix).
fn packing_key(model: &batchd_core::ModelName, endpoint: Option<&str>) -> String {
    format!("{model}|{}", endpoint.unwrap_or(""))
}

/// The setting that holds a provider's body limit, for the message that quotes it.
fn payload_setting(provider: &str) -> String {
    if provider == batchd_core::ids::CLOUDFLARE {
        "jobs.max_payload_bytes".to_owned()
    } else {
        format!("the {provider} provider's batch size limit")
    }
}
