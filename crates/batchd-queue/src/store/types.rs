//! The values the storage's transitions take and give: what an intake records, what a chunk's view and a job's
//! publish context hold, where a chunk's items sit, and what each transition answered.

use super::*;

/// A chunk this replica claimed, and the fencing token of that claim: every transition of the chunk takes it, and
/// the script behind the transition refuses it once a later claim (another replica's) has taken the chunk over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The claimed chunk.
    pub chunk: ChunkRef,
    /// The claim's fencing token: the chunk's claim counter as this claim set it (0: the job had finished or had
    /// no ledger when claimed; only [`Store::forget`] applies).
    pub token: u64,
    /// What the ledger said of the chunk when it was claimed ([`Store::claim_due`] reads it in the same step, so
    /// the step need not read it again); `None` for a claim made elsewhere, or a job without a running ledger.
    pub view: Option<Box<ChunkView>>,
}

impl Claim {
    /// The take-in's claim of a job's first chunk, which it posts at once (see [`Intake::submit_first`]).
    pub fn first(job_id: JobId) -> Self {
        Self::new(ChunkRef::new(job_id, 0), FIRST_CLAIM)
    }

    /// A claim of `chunk` with fencing token `token`, without a view.
    pub fn new(chunk: ChunkRef, token: u64) -> Self {
        Self { chunk, token, view: None }
    }
}

/// What one [`Store::claim_due`] found on the schedule.
#[derive(Debug, Default)]
pub struct Claimed {
    /// The members claimed, each with its fencing token.
    pub claims: Vec<Claim>,
    /// Due members batchd did not write (not `<job_id>#<chunk>`), left unclaimed for the caller to drop.
    pub unknown: Vec<String>,
    /// When to look at the schedule again: the due time of the first member read that is not due yet, or the
    /// time of the claim when every member read was due (there may be more).
    pub next_due: Option<UnixMillis>,
}

/// What [`Store::accept`] did with an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// A new job: its ledger exists and its chunks are scheduled; the entry is acknowledged. With
    /// [`Intake::submit_first`], the first chunk is marked `submitting` (attempt 1) and the caller posts it now.
    New,
    /// A new job whose cancellation was requested before it arrived: accepted, but its first chunk is left
    /// `pending` and due at once, so the schedule concludes the job; the caller submits nothing.
    CancelRequested,
    /// The job id already had a ledger (in the given state); the entry was acknowledged and counted, nothing else.
    Duplicate {
        /// State of the existing job.
        state: String,
    },
}

/// What a fenced transition of a chunk did, when its claim still held (a claim taken over is
/// [`StoreError::StaleClaim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// Written.
    Applied {
        /// When the daemon first acted on the job's cancellation (Unix ms), if it has: read in the same step, so a
        /// step that ends a submit learns of a cancel without a command of its own.
        cancel_seen_at: Option<UnixMillis>,
    },
    /// The job has finished or has no ledger: the chunk was taken off the schedule, nothing else written.
    Gone,
}

impl Fenced {
    /// Whether the transition was written.
    pub fn applied(self) -> bool {
        matches!(self, Self::Applied { .. })
    }
}

/// What [`Store::begin_submit`] decided for a chunk.
#[derive(Debug, Clone)]
pub enum SubmitTicket {
    /// Submit the chunk now; what to send is returned so no second read is needed.
    Go {
        /// Attempts made so far, this one included.
        attempt: u64,
        /// True when a previous submit of this chunk was interrupted (its remote batch may exist).
        resubmit: bool,
        /// True when the previous attempt only looked for that batch and waits for one it found to end: the look
        /// resumes, and is no possible duplicate (nothing was sent since the one counted).
        looked: bool,
        /// The job's model.
        model: String,
        /// The chunk's request items, byte for byte.
        requests: Vec<Box<serde_json::value::RawValue>>,
        /// Where the chunk's items sit in the job.
        placement: Placement,
    },
    /// The job's cancellation was requested; nothing is submitted.
    Cancelled,
    /// The chunk is past submitting (in the given state); nothing to submit.
    Skip {
        /// The chunk's current state.
        chunk_state: String,
    },
    /// The job has finished or no longer exists.
    Gone,
}

/// The part of the ledger a poll needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkView {
    /// Job state.
    pub job_state: JobState,
    /// The job's model.
    pub model: String,
    /// Chunk state.
    pub chunk_state: ChunkState,
    /// Remote request id, once submitted.
    pub request_id: Option<String>,
    /// First item index of the chunk.
    pub items_start: usize,
    /// Number of items in the chunk.
    pub items_len: usize,
    /// Polls answered so far.
    pub n_polls: u64,
    /// Consecutive failed polls.
    pub poll_failures: u64,
    /// The job's deadline, Unix ms.
    pub deadline_at: UnixMillis,
    /// When the job was accepted, Unix ms.
    pub accepted_at: UnixMillis,
    /// Number of chunks of the job.
    pub n_chunks: u32,
    /// Number of items of the job.
    pub n_items: usize,
    /// Results stream the job publishes to.
    pub reply_to: String,
    /// The job's metadata JSON, if any.
    pub metadata: Option<String>,
    /// The cancellation reason, when a cancellation was requested.
    pub cancel_requested: Option<String>,
    /// The status the Batch API reported at the chunk's last poll (`queued`, `running`, or an undocumented one).
    pub remote_status: Option<String>,
    /// The provider's references to the remote batch besides its id (JSON), when it needs any.
    pub remote: Option<String>,
    /// The fencing token of the chunk's latest claim (0: never claimed).
    pub claim: u64,
    /// The job's endpoint, when it named one.
    pub endpoint: Option<String>,
    /// How many of the job's items have an `external_reference` batchd echoes itself (0: none; the count only,
    /// the references are read when the result is assembled).
    pub n_references: usize,
    /// When the daemon first acted on the job's cancellation (Unix ms, Redis's clock), once it has.
    pub cancel_seen_at: Option<UnixMillis>,
    /// When the chunk's batch was submitted (Unix ms, Redis's clock), once it has been.
    pub submitted_at: Option<UnixMillis>,
    /// For a chunk packed with other jobs' ([`field::CHUNK_PACK`]): `queued`, or the id of the pack that carries it.
    pub pack: Option<String>,
    /// For a pack's chunk ([`field::PACK_MEMBERS`]): how many jobs the pack carries.
    pub pack_members: Option<usize>,
}

impl ChunkView {
    /// What publishing a one-chunk job needs, from this view alone (no second read of the ledger).
    pub fn single_chunk_context(&self, index: u32) -> PublishContext {
        PublishContext {
            model: self.model.clone(),
            reply_to: self.reply_to.clone(),
            metadata: self.metadata.clone(),
            accepted_at: self.accepted_at,
            n_items: self.n_items,
            retry_failed_items: false,
            retried: false,
            n_references: self.n_references,
            chunks: vec![ChunkRecord {
                index,
                request_id: self.request_id.clone(),
                state: Some(ChunkState::Done),
                output: None,
                last_error: None,
                placement: Placement::Range { start: self.items_start, len: self.items_len },
                pack: self.pack.clone(),
                references: None,
            }],
        }
    }
}

/// A job's fields needed to publish its result.
#[derive(Debug, Clone)]
pub struct PublishContext {
    /// The job's model.
    pub model: String,
    /// Results stream to publish to.
    pub reply_to: String,
    /// The job's metadata JSON, if any.
    pub metadata: Option<String>,
    /// When the job was accepted, Unix ms.
    pub accepted_at: UnixMillis,
    /// Number of items of the job.
    pub n_items: usize,
    /// Whether failed items are to be resubmitted once.
    pub retry_failed_items: bool,
    /// Whether that resubmission already happened.
    pub retried: bool,
    /// How many of the job's items have an `external_reference` batchd echoes itself (0: none).
    pub n_references: usize,
    /// Every chunk's stored outcome, in chunk order.
    pub chunks: Vec<ChunkRecord>,
}

/// One chunk's stored outcome.
#[derive(Debug, Clone)]
pub struct ChunkRecord {
    /// The chunk's position in the job.
    pub index: u32,
    /// Remote request id, if the chunk was submitted.
    pub request_id: Option<String>,
    /// The chunk's state.
    pub state: Option<ChunkState>,
    /// The stored normalised output JSON, when done.
    pub output: Option<String>,
    /// The stored error JSON, when failed.
    pub last_error: Option<String>,
    /// Which of the job's items the chunk carries.
    pub placement: Placement,
    /// For a packed chunk ([`field::CHUNK_PACK`]): `queued`, or the id of the pack that carries it.
    pub pack: Option<String>,
    /// The `external_reference`s of the items the chunk was accepted with (`ChunkReferences`' JSON, keyed by job
    /// index), when it has any and the provider does not echo them; read only when the job has some.
    pub references: Option<String>,
}

/// Which of a job's items a chunk carries: a contiguous range (a planned or split chunk) or a list of indices
/// (a chunk of retried items).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Items `start..start + len`.
    Range {
        /// First item index.
        start: usize,
        /// Number of items.
        len: usize,
    },
    /// These item indices, in this order.
    Indices(Vec<usize>),
}

impl Placement {
    /// Number of items.
    pub fn len(&self) -> usize {
        match self {
            Self::Range { len, .. } => *len,
            Self::Indices(indices) => indices.len(),
        }
    }

    /// Whether the chunk carries no item.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The job-wide index of the chunk's item `local`.
    pub fn job_index(&self, local: usize) -> Option<usize> {
        match self {
            Self::Range { start, len } => (local < *len).then_some(start + local),
            Self::Indices(indices) => indices.get(local).copied(),
        }
    }

    /// All job-wide indices, in chunk order.
    pub fn job_indices(&self) -> Vec<usize> {
        (0..self.len()).filter_map(|local| self.job_index(local)).collect()
    }

    /// The ledger encoding: (`start:len`, indices JSON or "").
    pub(super) fn encode(&self) -> (String, String) {
        match self {
            Self::Range { start, len } => (format!("{start}:{len}"), String::new()),
            Self::Indices(indices) => {
                (format!("0:{}", indices.len()), serde_json::to_string(indices).expect("indices serialise"))
            }
        }
    }
}

/// A chunk to add to a running job.
#[derive(Debug, Clone)]
pub struct NewChunk {
    /// Which of the job's items it carries.
    pub placement: Placement,
    /// Its request items, in placement order.
    pub requests: Vec<Box<serde_json::value::RawValue>>,
}

/// What [`Store::add_chunks`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddOutcome {
    /// The chunks were added and scheduled.
    Added,
    /// The once-only flag was already set; nothing changed.
    AlreadyDone,
    /// The job has finished or no longer exists.
    Gone,
}

/// The state a failed submit leaves its chunk in, for [`Store::mark_submit_retry`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitRetryRecord {
    /// `submitting` when the failed submit may have reached the API, `pending` when it created nothing.
    pub state: ChunkState,
    /// The error, as JSON.
    pub last_error: String,
    /// The attempt count to record instead of the current one (a rate-limited attempt is given back).
    pub attempts: Option<u64>,
    /// The attempt only looked for the batch an uncertain create may have made and waits for one it found to end
    /// (it sent nothing): the next submit resumes the look without counting a possible duplicate.
    pub looked: bool,
}

/// How an accepted job is recorded (see [`Store::accept`]).
#[derive(Debug, Clone, Copy)]
pub struct Intake<'a> {
    /// The ingress entry the job came from (acknowledged in the same step).
    pub entry_id: &'a str,
    /// The job's chunks.
    pub plan: &'a ChunkPlan,
    /// Acceptance time, Unix ms.
    pub now: UnixMillis,
    /// When the job expires, Unix ms.
    pub deadline_at: UnixMillis,
    /// When the first chunk becomes due if the accepting replica does not submit it (its lease).
    pub first_due: UnixMillis,
    /// Whether failed items are resubmitted once.
    pub retry_failed_items: bool,
    /// Mark the first chunk `submitting` with attempt 1, for a caller that posts it right away (saves the
    /// separate [`Store::begin_submit`] step); otherwise it is `pending`, due at `first_due`.
    pub submit_first: bool,
    /// The items' `external_reference`s per chunk (chunk index, references), for a provider that does not echo
    /// them itself: written into the ledger with the job, only for chunks that have any.
    pub references: &'a [(u32, ChunkReferences)],
    /// Queue the job's one chunk for packing instead of scheduling it for a submit of its own (`submit_first`
    /// is then false); the chunk's deadline watcher is the job's deadline.
    pub pack: Option<PackIntake<'a>>,
}

/// How a one-chunk job joins its packing queue at acceptance (see `accept.lua`).
#[derive(Debug, Clone, Copy)]
pub struct PackIntake<'a> {
    /// The packing key: the chunks packed together share it (provider, model and endpoint:
    /// [`batchd_core::Keys::pack_queue`]).
    pub key: &'a str,
    /// How long this chunk waits at most before its pack is due: `packing.window_ms`, shorter for a job whose
    /// deadline is near. The queue is ordered by when each chunk must go (arrival plus its wait).
    pub window_ms: u64,
    /// `packing.pause_ms`: a pack is due this long after the latest arrival when arrivals pause.
    pub pause_ms: u64,
    /// Queued chunks that fill a pack: with this many waiting, the pack is due at once.
    pub full_members: u64,
    /// The job's inputs, when its provider limits a batch's inputs (`batchd_core::ledger::field::N_INPUTS`).
    pub n_inputs: Option<usize>,
}

/// What one remote batch may hold, as a pack is filled ([`Store::form_pack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackBounds {
    /// Most items.
    pub max_items: usize,
    /// Most bytes of items (the body's envelope taken off).
    pub max_bytes: usize,
    /// Bytes each item adds besides its own (its wrapper, a separator).
    pub per_item: usize,
    /// Most inputs, when the provider limits them (members are counted by their ledger's `n_inputs`).
    pub max_inputs: Option<usize>,
}

/// What one call of [`Store::form_pack`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackFormed {
    /// Whether the pack exists and takes members (false: nothing to pack, or its membership is frozen).
    pub open: bool,
    /// Members taken by this call.
    pub added: usize,
    /// The pack's items so far.
    pub n_items: usize,
    /// A queued chunk did not fit: the pack is full.
    pub full: bool,
    /// Chunks still queued under the packing key.
    pub left: usize,
}

/// One member of a pack as its members list records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackMember {
    /// The member's chunk.
    pub chunk: ChunkRef,
    /// How many items it has (its run in the pack's items follows the members before it).
    pub n_items: usize,
}

/// What a member of a finished pack is handed ([`Store::deliver_pack`]).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The member's chunk.
    pub chunk: ChunkRef,
    /// `done` (with the chunk's output) or `failed` (with its error).
    pub state: ChunkState,
    /// The output or error JSON.
    pub payload: String,
}

/// An ingress entry finished as a failed job without running (see [`Store::reject`]).
#[derive(Debug, Clone, Copy)]
pub struct Rejection<'a> {
    /// The ingress entry (acknowledged in the same step).
    pub entry_id: &'a str,
    /// The id the failure is published under.
    pub job_id: &'a JobId,
    /// The job's model, when known.
    pub model: &'a str,
    /// Why.
    pub error: &'a JobError,
    /// A copy for the dead-letter stream, for entries that are not jobs at all.
    pub dead: Option<&'a DeadLetter>,
    /// Number of request items of the job (0 when unknown).
    pub items_total: usize,
}

/// A copy of an undecodable entry for the dead-letter stream.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The entry's fields as they were (the stored copy is bounded: see [`Store::with_dead_entry_bytes`]).
    pub fields: Vec<(String, Vec<u8>)>,
    /// Why it could not be decoded.
    pub reason: String,
}

/// What [`Store::dead_letter_undeliverable`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undeliverable {
    /// The entry is in the dead-letter stream and acknowledged; `published` tells whether its entry id got a
    /// `failed` result (false: that id already had a ledger).
    Moved {
        /// Whether a `failed` result was published under the entry id.
        published: bool,
    },
    /// The entry was no longer pending with too many deliveries (another replica finished it): nothing changed.
    Gone,
}
