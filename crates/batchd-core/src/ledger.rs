//! Job and chunk states as the ledger records them, and the names of the ledger's fields.
//!
//! The ledger is one Redis HASH per job (see [`crate::Keys::job`]). Its field names are listed here so the
//! storage scripts, the CLI and the docs agree on them.

use std::fmt;
use std::str::FromStr;

/// Where a job is in its life. Terminal states never change again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Taken from the ingress stream and recorded; no chunk has been submitted yet.
    Accepted,
    /// At least one chunk was submitted; waiting for the remote batches.
    Running,
    /// Finished; results published (individual items may still have failed).
    Completed,
    /// Finished without results; the error says why.
    Failed,
    /// The job's deadline passed before the remote batches finished.
    Expired,
    /// Cancelled on request; results of chunks that had finished were published.
    Cancelled,
}

impl JobState {
    /// Every job state, in life order.
    pub const ALL: [Self; 6] =
        [Self::Accepted, Self::Running, Self::Completed, Self::Failed, Self::Expired, Self::Cancelled];

    /// The state as stored in the ledger and shown to users.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Expired => "expired",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether the job has finished (its result entry was published).
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Expired | Self::Cancelled)
    }
}

/// Where one chunk (one remote batch) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkState {
    /// Not submitted yet, or a submit failed in a way that certainly created no remote batch.
    Pending,
    /// A submit request is (or was, when a replica crashed) in flight: resubmitting may duplicate the remote batch.
    Submitting,
    /// The remote batch exists (request id recorded) and is being polled.
    Polling,
    /// The remote batch finished and its output is stored in the ledger.
    Done,
    /// The chunk cannot finish (permanent API error).
    Failed,
}

impl ChunkState {
    /// Every chunk state, in life order.
    pub const ALL: [Self; 5] = [Self::Pending, Self::Submitting, Self::Polling, Self::Done, Self::Failed];

    /// Whether the chunk has finished (`done` or `failed`): it counts no longer in the job's `open_chunks`.
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Done | Self::Failed)
    }

    /// The state as stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Submitting => "submitting",
            Self::Polling => "polling",
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }
}

/// A ledger value that is not a known state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for JobState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|state| state.as_str() == s).ok_or_else(|| UnknownState(s.to_owned()))
    }
}

impl FromStr for ChunkState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|state| state.as_str() == s).ok_or_else(|| UnknownState(s.to_owned()))
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for ChunkState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Names of the ledger HASH fields.
///
/// The storage scripts get every name from here: `batchd_queue::store` generates a Lua local for each one into
/// every script's prelude (`F_<NAME>` for a job field, `C_<NAME>` for a per-chunk name), and a test fails on a
/// quoted field name in a script.
pub mod field {
    /// Job state ([`super::JobState`]).
    pub const STATE: &str = "state";
    /// The job's `metadata` JSON, echoed in the result.
    pub const METADATA: &str = "metadata";
    /// `1` when failed items are resubmitted once.
    pub const RETRY_FAILED_ITEMS: &str = "retry_failed_items";
    /// `1` once the failed-items retry chunk was added.
    pub const RETRIED: &str = "retried";
    /// Id of the published result entry.
    pub const RESULT_ENTRY: &str = "result_entry";
    /// Size of the published result entry, in bytes of its field names and values, written by the publish with
    /// [`RESULT_ENTRY`] so that a reader can decide whether to read the entry before it reads it (a stream entry
    /// is read whole). Ledgers of results published before it existed lack it.
    pub const RESULT_BYTES: &str = "result_bytes";
    /// Model name.
    pub const MODEL: &str = "model";
    /// Ingress entry id the job was accepted from.
    pub const ENTRY_ID: &str = "entry_id";
    /// Number of chunks.
    pub const N_CHUNKS: &str = "n_chunks";
    /// Number of request items.
    pub const N_ITEMS: &str = "n_items";
    /// The inputs of a job whose provider limits a batch's inputs (`Provider::input_limit`: OpenAI's embedding
    /// inputs, Workers AI's vectors that fit in a reply), written at take-in for a packed job and summed in its
    /// pack's ledger, so a pack is filled under that limit too. Absent: no such limit.
    pub const N_INPUTS: &str = "n_inputs";
    /// Acceptance time, Unix ms.
    pub const ACCEPTED_AT: &str = "accepted_at";
    /// Last change, Unix ms.
    pub const UPDATED_AT: &str = "updated_at";
    /// Finish time, Unix ms.
    pub const FINISHED_AT: &str = "finished_at";
    /// The time after which the job ends `expired`, Unix ms.
    pub const DEADLINE_AT: &str = "deadline_at";
    /// Results stream the job publishes to.
    pub const REPLY_TO: &str = "reply_to";
    /// Later ingress entries that carried the same job id (acknowledged, not run).
    pub const DUPLICATES: &str = "duplicates";
    /// Submits repeated after a crash inside the submit window (each may have created a second remote batch).
    pub const POSSIBLE_DUPLICATE_SUBMITS: &str = "possible_duplicate_submits";
    /// The job's error (JSON `{code, message, ...}`), once failed or expired.
    pub const ERROR: &str = "error";
    /// How many of the job's chunks are not finished yet (`done` or `failed`), kept by the scripts so that a
    /// chunk's completion costs the same whatever the job's chunk count. Ledgers written before it existed lack
    /// it; `chunk_done.lua` counts them once and then keeps it.
    pub const OPEN_CHUNKS: &str = "open_chunks";
    /// The job's `endpoint`, when it named one (absent: the provider's default).
    pub const ENDPOINT: &str = "endpoint";
    /// How many of the job's items carry a top-level `external_reference` that batchd echoes itself (at a
    /// provider that does not: [`CHUNK_REFERENCES`]); absent when none does.
    pub const N_REFERENCES: &str = "n_references";
    /// When the daemon first acted on the job's cancellation, Unix ms (Redis's clock), written once under a claim
    /// of one of its chunks: the cancel wait (`workers.cancel_wait_secs`) counts from it.
    pub const CANCEL_SEEN_AT: &str = "cancel_seen_at";
    /// A pack's number of members (present only in a pack's ledger: a remote batch batchd filled from many jobs'
    /// chunks, see `batchd_core::ids::JobId::is_pack`); its members are listed in order in `Keys::pack_members`.
    pub const PACK_MEMBERS: &str = "pack_members";
    /// A pack's request bytes so far (the sum of its members' items), checked against the provider's limit.
    pub const PACK_BYTES: &str = "pack_bytes";
    /// A pack's packing key (`Keys::pack_queue`'s suffix: the provider, model and endpoint its members share).
    pub const PACK_KEY: &str = "pack_key";
    /// How many of a pack's members have been handed their results (the delivery's resume point).
    pub const PACK_DELIVERED: &str = "pack_delivered";

    /// Every job-level field name, as `(constant name, field name)`: what the storage scripts' prelude is
    /// generated from.
    pub const JOB_FIELDS: [(&str, &str); 27] = [
        ("STATE", STATE),
        ("METADATA", METADATA),
        ("RETRY_FAILED_ITEMS", RETRY_FAILED_ITEMS),
        ("RETRIED", RETRIED),
        ("RESULT_ENTRY", RESULT_ENTRY),
        ("RESULT_BYTES", RESULT_BYTES),
        ("MODEL", MODEL),
        ("ENTRY_ID", ENTRY_ID),
        ("N_CHUNKS", N_CHUNKS),
        ("N_ITEMS", N_ITEMS),
        ("N_INPUTS", N_INPUTS),
        ("ACCEPTED_AT", ACCEPTED_AT),
        ("UPDATED_AT", UPDATED_AT),
        ("FINISHED_AT", FINISHED_AT),
        ("DEADLINE_AT", DEADLINE_AT),
        ("REPLY_TO", REPLY_TO),
        ("DUPLICATES", DUPLICATES),
        ("POSSIBLE_DUPLICATE_SUBMITS", POSSIBLE_DUPLICATE_SUBMITS),
        ("ERROR", ERROR),
        ("OPEN_CHUNKS", OPEN_CHUNKS),
        ("ENDPOINT", ENDPOINT),
        ("N_REFERENCES", N_REFERENCES),
        ("CANCEL_SEEN_AT", CANCEL_SEEN_AT),
        ("PACK_MEMBERS", PACK_MEMBERS),
        ("PACK_BYTES", PACK_BYTES),
        ("PACK_KEY", PACK_KEY),
        ("PACK_DELIVERED", PACK_DELIVERED),
    ];

    /// What a per-chunk field name starts with, before the chunk index.
    pub const CHUNK_PREFIX: &str = "c";
    /// What separates a per-chunk field's index from its name.
    pub const CHUNK_SEPARATOR: &str = ":";

    /// A per-chunk field: `c<index>:<name>`.
    pub fn chunk(index: u32, name: &str) -> String {
        format!("{CHUNK_PREFIX}{index}{CHUNK_SEPARATOR}{name}")
    }

    /// Per-chunk: state ([`super::ChunkState`]).
    pub const CHUNK_STATE: &str = "state";
    /// Per-chunk: the remote request id.
    pub const CHUNK_REQUEST_ID: &str = "request_id";
    /// Per-chunk: submit attempts made.
    pub const CHUNK_ATTEMPTS: &str = "attempts";
    /// Per-chunk: consecutive failed polls (reset by a successful one).
    pub const CHUNK_POLL_FAILURES: &str = "poll_failures";
    /// Per-chunk: polls answered.
    pub const CHUNK_N_POLLS: &str = "n_polls";
    /// Per-chunk: the remote status of the last poll (`queued`, `running`).
    pub const CHUNK_REMOTE_STATUS: &str = "remote_status";
    /// Per-chunk: first item index and item count, `start:len`.
    pub const CHUNK_ITEMS: &str = "items";
    /// Per-chunk: for a chunk of retried items, the JSON array of their original indices.
    pub const CHUNK_INDICES: &str = "indices";
    /// Per-chunk: the chunk's request items as a JSON array, kept until the job finishes.
    pub const CHUNK_REQUESTS: &str = "requests";
    /// Per-chunk: the normalised output, stored until the job's result is published.
    pub const CHUNK_OUTPUT: &str = "output";
    /// Per-chunk: the last error seen (JSON).
    pub const CHUNK_LAST_ERROR: &str = "last_error";
    /// Per-chunk: time the remote batch was accepted, Unix ms.
    pub const CHUNK_SUBMITTED_AT: &str = "submitted_at";
    /// Per-chunk: what a provider needs of its remote batch besides the id (`batchd_provider::RemoteBatch` as JSON:
    /// file ids, a results URL); absent for Cloudflare, whose request id is all there is.
    pub const CHUNK_REMOTE: &str = "remote";
    /// Per-chunk: the fencing token of the chunk's latest claim, a counter every claim increments (absent: 0, never
    /// claimed). Every script that writes the chunk refuses a writer whose token is not this one.
    pub const CHUNK_CLAIM: &str = "claim";
    /// Per-chunk: when a batch event last woke the chunk, Unix ms (Redis's clock), written by `wake.lua` so that a
    /// wake within `poll.initial_interval_ms` of the last one is ignored.
    pub const CHUNK_WOKEN_AT: &str = "woken_at";
    /// Per-chunk: the top-level `external_reference`s of the items the chunk was accepted with, keyed by their
    /// index in the job (`batchd_core::reference::ChunkReferences`), written at take-in only when one has one and
    /// the provider does not echo them itself; read when the job's result is assembled. A split keeps it on the
    /// chunk's index (the keys are job indices, so every piece's items still find theirs).
    pub const CHUNK_REFERENCES: &str = "references";
    /// Per-chunk: the submit attempt whose outcome is unknown (a timeout, a 5xx after sending), recorded when the
    /// chunk is left `submitting` to be resumed. While it equals `attempts`, no submit of the chunk is in flight: a
    /// cancel makes such a chunk due at once (to look its batch up), and leaves one whose submit is in flight alone.
    pub const CHUNK_UNCERTAIN: &str = "uncertain";
    /// Per-chunk: the submit attempt that sent nothing because a look-up for an uncertain create's batch found one
    /// it cannot check yet and waits for it to end (Anthropic shows a batch's custom ids only once it has ended).
    /// While it equals `attempts`, the chunk's next submit resumes the look without counting a possible duplicate.
    pub const CHUNK_LOOKED: &str = "looked";
    /// Per-chunk: a chunk packed with other jobs' chunks into one remote batch: `queued` while it waits in its
    /// packing queue (`crate::ids::PACK_QUEUED`), then the id of the pack that carries it. Such a chunk stays
    /// `pending` (scheduled only at its job's deadline) until the pack hands it its results.
    pub const CHUNK_PACK: &str = "pack";

    /// Every per-chunk name (the part after `c<index>:`), as `(constant name without `CHUNK_`, name)`: what the
    /// storage scripts' prelude is generated from.
    pub const CHUNK_FIELDS: [(&str, &str); 19] = [
        ("STATE", CHUNK_STATE),
        ("REQUEST_ID", CHUNK_REQUEST_ID),
        ("ATTEMPTS", CHUNK_ATTEMPTS),
        ("POLL_FAILURES", CHUNK_POLL_FAILURES),
        ("N_POLLS", CHUNK_N_POLLS),
        ("REMOTE_STATUS", CHUNK_REMOTE_STATUS),
        ("ITEMS", CHUNK_ITEMS),
        ("INDICES", CHUNK_INDICES),
        ("REQUESTS", CHUNK_REQUESTS),
        ("OUTPUT", CHUNK_OUTPUT),
        ("LAST_ERROR", CHUNK_LAST_ERROR),
        ("SUBMITTED_AT", CHUNK_SUBMITTED_AT),
        ("REMOTE", CHUNK_REMOTE),
        ("CLAIM", CHUNK_CLAIM),
        ("WOKEN_AT", CHUNK_WOKEN_AT),
        ("REFERENCES", CHUNK_REFERENCES),
        ("UNCERTAIN", CHUNK_UNCERTAIN),
        ("LOOKED", CHUNK_LOOKED),
        ("PACK", CHUNK_PACK),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_names() {
        for state in JobState::ALL {
            assert_eq!(state.as_str().parse::<JobState>().unwrap(), state);
        }
        for state in ChunkState::ALL {
            assert_eq!(state.as_str().parse::<ChunkState>().unwrap(), state);
        }
        assert!("bogus".parse::<JobState>().is_err());
        assert!(JobState::Expired.is_terminal());
        assert!(!JobState::Running.is_terminal());
        assert_eq!(field::chunk(3, field::CHUNK_STATE), "c3:state");
        assert!(ChunkState::Failed.is_finished() && !ChunkState::Polling.is_finished());
    }

    #[test]
    fn the_field_lists_name_every_field_once() {
        for list in [&field::JOB_FIELDS[..], &field::CHUNK_FIELDS[..]] {
            let names: std::collections::HashSet<&str> = list.iter().map(|(_, name)| *name).collect();
            assert_eq!(names.len(), list.len(), "a field is listed twice: {list:?}");
            for (constant, name) in list {
                assert_eq!(constant.to_ascii_lowercase(), *name, "constant names follow field names");
            }
        }
    }
}
