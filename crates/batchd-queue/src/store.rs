//! The job ledger, the schedule and result publishing: every state transition is one Lua script, so a crash
//! between two steps leaves Redis in a state a restarted replica can resume from.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::time::Duration;

use batchd_core::ledger::field;
use batchd_core::{ChunkRef, ChunkState, Job, JobError, JobId, JobState, Keys, ResultEntry, UnixMillis};
use redis::{AsyncCommands, Script};
use serde_json::value::RawValue;

use crate::{Conn, StoreError};

/// Retention and timing settings of the storage layer.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// Approximate maximum length of each results stream (`XADD ... MAXLEN ~`).
    pub results_maxlen: u64,
    /// Approximate maximum length of the dead-letter stream.
    pub dead_maxlen: u64,
    /// How long a finished job's ledger is kept; a job id is deduplicated for this long after it finished.
    pub ledger_ttl: Duration,
    /// How long a claimed schedule member stays claimed before it becomes due again.
    pub lease: Duration,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            results_maxlen: 100_000,
            dead_maxlen: 10_000,
            ledger_ttl: Duration::from_secs(7 * 24 * 3600),
            lease: Duration::from_secs(60),
        }
    }
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

/// What [`Store::begin_submit`] decided for a chunk.
#[derive(Debug, Clone)]
pub enum SubmitTicket {
    /// Submit the chunk now; what to send is returned so no second read is needed.
    Go {
        /// Attempts made so far, this one included.
        attempt: u64,
        /// True when a previous submit of this chunk was interrupted (its remote batch may exist).
        resubmit: bool,
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
#[derive(Debug, Clone)]
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
            chunks: vec![ChunkRecord {
                index,
                request_id: self.request_id.clone(),
                state: Some(ChunkState::Done),
                output: None,
                last_error: None,
                placement: Placement::Range { start: self.items_start, len: self.items_len },
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

    fn parse(items: &str, indices: &str) -> Option<Self> {
        if !indices.is_empty() {
            return serde_json::from_str(indices).ok().map(Self::Indices);
        }
        parse_items(Some(items)).map(|(start, len)| Self::Range { start, len })
    }

    /// The ledger encoding: (`start:len`, indices JSON or "").
    fn encode(&self) -> (String, String) {
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

/// A step scheduled this close to now wakes the schedule fetcher at once instead of waiting for its idle sleep.
pub const WAKE_WITHIN: Duration = Duration::from_millis(250);

/// A planned split of a job into chunks: `(start, len)` item ranges covering the job in order.
pub type ChunkPlan = Vec<(usize, usize)>;

/// Handle on one namespace's storage. Cheap to clone; all clones share one multiplexed connection.
#[derive(Clone)]
pub struct Store {
    conn: Conn,
    keys: Keys,
    settings: StoreSettings,
    scripts: std::sync::Arc<Scripts>,
    /// Wakes this process's schedule fetcher when a step becomes due soon (see [`Store::soon_due`]).
    soon_due: std::sync::Arc<tokio::sync::Notify>,
    /// Redis's clock, for every time that orders work between replicas.
    clock: std::sync::Arc<crate::clock::RedisClock>,
    /// Most bytes of an entry's fields copied to the dead-letter stream (see [`Store::with_dead_entry_bytes`]).
    dead_entry_bytes: usize,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("keys", &self.keys)
            .field("settings", &self.settings)
            .field("dead_entry_bytes", &self.dead_entry_bytes)
            .finish()
    }
}

struct Scripts {
    accept: Script,
    reject: Script,
    claim: Script,
    begin_submit: Script,
    update_chunk: Script,
    chunk_done: Script,
    add_chunks: Script,
    publish: Script,
    rate_limit: Script,
    cancel: Script,
    wake: Script,
}

/// Ledger field (job level): how many of the job's chunks are not finished yet (see [`field::OPEN_CHUNKS`]).
pub const OPEN_CHUNKS: &str = field::OPEN_CHUNKS;

/// Most chunks one job can have; `accept.lua` and `add_chunks.lua` refuse more before writing anything.
///
/// Accepting a job writes 12 ledger values per chunk in one script, publishing or cancelling it touches every
/// chunk once, and Redis serves nobody else while a script runs: 10,000 chunks (120,000 values) take about
/// 0.1 s of Redis's time; 100,000 would take over 2 s. A job reaches this only with a small `jobs.max_batch_items`
/// (by bytes alone, the largest entry makes a few dozen chunks).
pub const MAX_CHUNKS_PER_JOB: u32 = 10_000;

/// Most field/value pairs in any list a script writes with one command (a result entry, a ledger, a dead-letter
/// entry): 2 × 400 values stay under the ~1,000 one Lua `unpack` takes safely. Scripts refuse longer lists.
pub const MAX_SCRIPT_PAIRS: usize = 400;

/// Most schedule members one claim takes (`claim.lua` refuses a larger limit).
pub const MAX_CLAIM: usize = 10_000;

/// Most of an entry's original fields a dead-letter copy holds: with the copy's own fields, the one `XADD` stays
/// within [`MAX_SCRIPT_PAIRS`]. Fields past it are only counted (`original_fields`), and the copy is `truncated`.
pub const DEAD_MAX_FIELDS: usize = 256;

// With the copy's own fields (at most 7), one dead-letter XADD stays within what `reject.lua` accepts.
const _: () = assert!(DEAD_MAX_FIELDS + 7 <= MAX_SCRIPT_PAIRS);

/// Default of [`Store::with_dead_entry_bytes`]: at most 64 KiB of an entry's fields are copied to the dead-letter
/// stream.
pub const DEFAULT_DEAD_ENTRY_BYTES: usize = 64 * 1024;

/// The dead-letter `error` of an entry that was delivered more than `ingress.max_deliveries` times.
pub const TOO_MANY_DELIVERIES: &str = "too many delivery attempts";

/// Defines a word a script and Rust exchange (a verdict a script returns, or an argument it takes): an enum with
/// its text, parsed once here, and a Lua local per variant (`<lua_prefix><TEXT>`) generated into every script's
/// prelude, so the word is written once.
macro_rules! script_words {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident ($script:literal, $lua_prefix:literal) {
            $($(#[$variant_meta:meta])* $variant:ident = $text:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $name {
            $($(#[$variant_meta])* $variant,)+
        }

        impl $name {
            /// Every variant.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];
            /// The script that speaks this word.
            pub const SCRIPT: &'static str = $script;
            /// What the Lua local of a variant is called before its text in upper case.
            const LUA_PREFIX: &'static str = $lua_prefix;

            /// The word as the script writes it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }

            /// Parses a script's word; an unknown word is an error (a script and a binary of different versions).
            #[allow(dead_code, reason = "argument words are sent, never read back")]
            fn parse(text: &str, job_id: &impl std::fmt::Display) -> Result<Self, StoreError> {
                Self::ALL.iter().copied().find(|word| word.as_str() == text).ok_or_else(|| StoreError::Corrupt {
                    job_id: job_id.to_string(),
                    detail: format!(
                        "{}.lua answered {:?}, which is not one of {:?}",
                        Self::SCRIPT,
                        text.chars().take(64).collect::<String>(),
                        Self::ALL.iter().map(|word| word.as_str()).collect::<Vec<_>>()
                    ),
                })
            }

            /// `(Lua local, text)` for every variant.
            fn lua_locals() -> impl Iterator<Item = (String, &'static str)> {
                Self::ALL
                    .iter()
                    .map(|word| (format!("{}{}", Self::LUA_PREFIX, word.as_str().to_uppercase()), word.as_str()))
            }
        }
    };
}

script_words! {
    /// The verdict of `accept.lua`.
    pub enum AcceptVerdict ("accept", "ACCEPT_") {
        /// A new job: ledger created, chunks scheduled, entry acknowledged.
        Accepted = "accepted",
        /// A new job whose cancellation was requested before it arrived (its first chunk is left pending).
        Cancelled = "cancelled",
        /// The job id already had a ledger; the entry was acknowledged and counted.
        Duplicate = "duplicate",
        /// The entry is gone or not what the caller read (items copied from the entry); nothing was done.
        Missing = "missing",
    }
}

script_words! {
    /// Where `accept.lua` takes the chunks' request items from.
    pub enum ItemsSource ("accept", "SOURCE_") {
        /// Copied inside Redis from the ingress entry, at the byte spans the caller gives.
        Entry = "entry",
        /// Sent in the arguments.
        Inline = "inline",
    }
}

script_words! {
    /// The verdict of `reject.lua`.
    pub enum RejectVerdict ("reject", "REJECT_") {
        /// A `failed` result was published and a finished ledger recorded.
        Rejected = "rejected",
        /// The job id already had a ledger: only counted (and dead-lettered when asked).
        Duplicate = "duplicate",
        /// With a delivery guard: the entry is no longer pending with too many deliveries; nothing was done.
        Gone = "gone",
    }
}

script_words! {
    /// The verdict of `begin_submit.lua`.
    pub enum SubmitVerdict ("begin_submit", "SUBMIT_") {
        /// The job has finished or has no ledger.
        Gone = "gone",
        /// The job's cancellation was requested.
        Cancelled = "cancelled",
        /// The chunk is past submitting.
        Skip = "skip",
        /// The chunk is marked `submitting`: post it.
        Submit = "submit",
        /// As `Submit`, but a previous submit was interrupted (its remote batch may exist).
        Resubmit = "resubmit",
    }
}

/// The marker in `accept.lua`'s arguments between the ledger pairs and the chunks.
const CHUNKS_MARKER: &str = "--chunks";

/// `text` as a Lua string literal.
fn lua_quote(text: &str) -> String {
    let mut quoted = String::from("'");
    for byte in text.bytes() {
        match byte {
            b'\'' | b'\\' => quoted.extend(['\\', byte as char]),
            0x20..=0x7e => quoted.push(byte as char),
            _ => quoted.push_str(&format!("\\{byte:03}")),
        }
    }
    quoted.push('\'');
    quoted
}

/// What every script gets from Rust before the shared prelude, generated so that no script writes a name of its
/// own: a local per ledger field (`F_STATE`, ..., `F_OPEN_CHUNKS`), per per-chunk name (`C_STATE`, ...), per job
/// state (`JOB_RUNNING`, ...) and chunk state (`CHUNK_POLLING`, ...), per script word (verdicts such as
/// `ACCEPT_DUPLICATE`, the items sources `SOURCE_ENTRY`/`SOURCE_INLINE`, `CHUNKS_MARKER`), the ingress entry's
/// job field (`ENTRY_JOB_FIELD`), the limits (`MAX_CHUNKS`, `MAX_PAIRS`, `MAX_LIMIT`), and the functions
/// `is_terminal(state)` and `is_finished(chunk_state)` (from [`JobState::is_terminal`] and
/// [`ChunkState::is_finished`] over every state), `chunk_field(index, name)` (the format of [`field::chunk`])
/// and `member(job_id, index)` (the format of [`ChunkRef`]).
fn script_constants() -> String {
    use std::fmt::Write as _;
    let mut strings: Vec<(String, &str)> = Vec::new();
    strings.extend(field::JOB_FIELDS.iter().map(|(name, value)| (format!("F_{name}"), *value)));
    strings.extend(field::CHUNK_FIELDS.iter().map(|(name, value)| (format!("C_{name}"), *value)));
    strings
        .extend(JobState::ALL.iter().map(|state| (format!("JOB_{}", state.as_str().to_uppercase()), state.as_str())));
    strings.extend(
        ChunkState::ALL.iter().map(|state| (format!("CHUNK_{}", state.as_str().to_uppercase()), state.as_str())),
    );
    strings.extend(AcceptVerdict::lua_locals());
    strings.extend(ItemsSource::lua_locals());
    strings.extend(RejectVerdict::lua_locals());
    strings.extend(SubmitVerdict::lua_locals());
    strings.push(("CHUNKS_MARKER".to_owned(), CHUNKS_MARKER));
    strings.push(("ENTRY_JOB_FIELD".to_owned(), batchd_core::job::JOB_FIELD));

    let mut text = String::from("-- Generated from batchd-core by batchd_queue::store::script_constants.\n");
    for (name, value) in &strings {
        writeln!(text, "local {name} = {}", lua_quote(value)).expect("writing into memory");
    }
    writeln!(text, "local MAX_CHUNKS = {MAX_CHUNKS_PER_JOB}").expect("writing into memory");
    writeln!(text, "local MAX_PAIRS = {MAX_SCRIPT_PAIRS}").expect("writing into memory");
    writeln!(text, "local MAX_LIMIT = {MAX_CLAIM}").expect("writing into memory");
    let set =
        |states: Vec<&str>| states.iter().map(|state| format!("[{}] = true", lua_quote(state))).collect::<Vec<_>>();
    let terminal = set(JobState::ALL.iter().filter(|state| state.is_terminal()).map(|state| state.as_str()).collect());
    let finished =
        set(ChunkState::ALL.iter().filter(|state| state.is_finished()).map(|state| state.as_str()).collect());
    writeln!(text, "local TERMINAL_JOB_STATES = {{{}}}", terminal.join(", ")).expect("writing into memory");
    writeln!(text, "local FINISHED_CHUNK_STATES = {{{}}}", finished.join(", ")).expect("writing into memory");
    text.push_str(&format!(
        "local function is_terminal(state) return TERMINAL_JOB_STATES[state] == true end\n\
         local function is_finished(chunk_state) return FINISHED_CHUNK_STATES[chunk_state] == true end\n\
         local function chunk_field(index, name) return {} .. index .. {} .. name end\n\
         local function member(job_id, index) return job_id .. {} .. index end\n",
        lua_quote(field::CHUNK_PREFIX),
        lua_quote(field::CHUNK_SEPARATOR),
        lua_quote(batchd_core::ids::MEMBER_SEPARATOR),
    ));
    text
}

/// A script as Redis runs it: the names, words and limits it shares with Rust ([`script_constants`], so a Lua
/// literal can never drift from the Rust one), then the shared prelude (`refuse`, the checks, `call_sliced`), then
/// the script itself.
fn script_text(body: &str) -> String {
    format!("{}{}\n{body}", script_constants(), include_str!("lua/prelude.lua"))
}

/// The full text of a storage script by its file name without `.lua` (`accept`, `reject`, ...), as Redis runs
/// it: for tests that drive a script with arguments [`Store`] never sends (error paths, malformed input).
pub fn script_source(name: &str) -> Option<String> {
    let body = match name {
        "accept" => include_str!("lua/accept.lua"),
        "reject" => include_str!("lua/reject.lua"),
        "claim" => include_str!("lua/claim.lua"),
        "begin_submit" => include_str!("lua/begin_submit.lua"),
        "update_chunk" => include_str!("lua/update_chunk.lua"),
        "chunk_done" => include_str!("lua/chunk_done.lua"),
        "add_chunks" => include_str!("lua/add_chunks.lua"),
        "publish" => include_str!("lua/publish.lua"),
        "rate_limit" => include_str!("lua/rate_limit.lua"),
        "cancel" => include_str!("lua/cancel.lua"),
        "wake" => include_str!("lua/wake.lua"),
        _ => return None,
    };
    Some(script_text(body))
}

/// The file names (without `.lua`) of every storage script, for [`script_source`].
pub const SCRIPT_NAMES: [&str; 11] = [
    "accept",
    "reject",
    "claim",
    "begin_submit",
    "update_chunk",
    "chunk_done",
    "add_chunks",
    "publish",
    "rate_limit",
    "cancel",
    "wake",
];

/// One script call: `EVALSHA <script> <n keys> <keys>`, the caller adding the arguments through the command it
/// derefs to. Built as one [`redis::Cmd`] (not redis-rs's `ScriptInvocation`, which holds the arguments and then
/// copies them all into a command): a job's items can be tens of MB, and each copy of them counts. It keeps its
/// script, so [`Store::run`] can load it into a Redis that lost it.
struct ScriptCall<'s> {
    script: &'s Script,
    cmd: redis::Cmd,
}

impl<'s> ScriptCall<'s> {
    fn new(script: &'s Script, keys: &[String]) -> Self {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(key);
        }
        Self { script, cmd }
    }
}

impl std::ops::Deref for ScriptCall<'_> {
    type Target = redis::Cmd;

    fn deref(&self) -> &redis::Cmd {
        &self.cmd
    }
}

impl std::ops::DerefMut for ScriptCall<'_> {
    fn deref_mut(&mut self) -> &mut redis::Cmd {
        &mut self.cmd
    }
}

impl Scripts {
    fn load() -> Self {
        let load = |name: &str| Script::new(&script_source(name).expect("a known script"));
        Self {
            accept: load("accept"),
            reject: load("reject"),
            claim: load("claim"),
            begin_submit: load("begin_submit"),
            update_chunk: load("update_chunk"),
            chunk_done: load("chunk_done"),
            add_chunks: load("add_chunks"),
            publish: load("publish"),
            rate_limit: load("rate_limit"),
            cancel: load("cancel"),
            wake: load("wake"),
        }
    }
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

/// What goes to the dead-letter stream, before it is bounded.
#[derive(Debug, Clone, Copy)]
struct DeadCopy<'a> {
    /// The entry's fields as they were.
    fields: &'a [(String, Vec<u8>)],
    /// The dead-letter `error`.
    reason: &'a str,
    /// The consumer group's delivery count, for an entry dead-lettered for it.
    deliveries: Option<u64>,
}

/// The bounded part of an entry's fields that a dead-letter entry holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeadLetterCopy<'a> {
    /// The fields copied, in order: whole, except the last one, which may be cut.
    fields: Vec<(&'a str, &'a [u8])>,
    /// How many fields the entry had.
    original_fields: usize,
    /// Bytes of the entry's field names and values.
    original_bytes: usize,
    /// Whether anything was left out or cut.
    truncated: bool,
}

impl<'a> DeadLetterCopy<'a> {
    /// At most `max_bytes` of names and values and at most [`DEAD_MAX_FIELDS`] fields of `fields`: fields are
    /// copied whole while they fit; the first one that does not has its value cut to what is left (a name is
    /// never cut: a field whose name does not fit is left out), and copying stops there.
    fn new(fields: &'a [(String, Vec<u8>)], max_bytes: usize) -> Self {
        let original_bytes = fields.iter().map(|(name, value)| name.len() + value.len()).sum();
        let mut copied = Vec::new();
        let mut budget = max_bytes;
        let mut truncated = false;
        for (name, value) in fields {
            if copied.len() == DEAD_MAX_FIELDS || name.len() > budget {
                truncated = true;
                break;
            }
            budget -= name.len();
            let kept = value.len().min(budget);
            budget -= kept;
            copied.push((name.as_str(), &value[..kept]));
            if kept < value.len() {
                truncated = true;
                break;
            }
        }
        Self { fields: copied, original_fields: fields.len(), original_bytes, truncated }
    }
}

impl Store {
    /// A store over `conn` for the namespace of `keys`.
    pub fn new(conn: Conn, keys: Keys, settings: StoreSettings) -> Self {
        Self {
            conn,
            keys,
            settings,
            scripts: std::sync::Arc::new(Scripts::load()),
            soon_due: std::sync::Arc::new(tokio::sync::Notify::new()),
            clock: std::sync::Arc::new(crate::clock::RedisClock::new()),
            dead_entry_bytes: DEFAULT_DEAD_ENTRY_BYTES,
        }
    }

    /// Caps the dead-letter copy of an entry at `bytes` of its field names and values (`retention.dead_entry_bytes`,
    /// default [`DEFAULT_DEAD_ENTRY_BYTES`]): a field that does not fit whole is cut, later ones are left out, and
    /// the copy records the original size and a `truncated` flag.
    pub fn with_dead_entry_bytes(mut self, bytes: usize) -> Self {
        self.dead_entry_bytes = bytes;
        self
    }

    /// Redis's current time in Unix milliseconds: the time every lease, due time and deadline is written and
    /// compared in, whatever this machine's wall clock says (see [`crate::clock`]).
    pub async fn now(&self) -> Result<UnixMillis, StoreError> {
        self.clock.now(&self.conn).await
    }

    /// Resolves when a step this process scheduled is due within [`WAKE_WITHIN`]: the schedule fetcher sleeps on
    /// it besides its timer, so a step scheduled for (almost) now does not wait out the fetcher's idle sleep. A
    /// notification sent while nobody waits is kept for the next wait, so none is lost.
    pub async fn soon_due(&self) {
        self.soon_due.notified().await;
    }

    /// Wakes the fetcher if `due` is close.
    fn scheduled(&self, due: UnixMillis) {
        let now = self.clock.carried().unwrap_or(0);
        if due.saturating_sub(now) < WAKE_WITHIN.as_millis() as u64 {
            self.soon_due.notify_one();
        }
    }

    /// Runs a script call, loading its script first when this Redis does not have it (a restarted or
    /// failed-over server), then sending the same command again.
    async fn run<T: redis::FromRedisValue>(&self, call: &ScriptCall<'_>) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        match call.cmd.query_async(&mut conn).await {
            Err(error) if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let _: String = call.script.load_async(&mut conn).await?;
                Ok(call.cmd.query_async(&mut conn).await?)
            }
            other => Ok(other?),
        }
    }

    /// The namespace's keys.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The storage settings.
    pub fn settings(&self) -> &StoreSettings {
        &self.settings
    }

    /// A clone of the shared connection, for callers that issue their own commands.
    pub fn connection(&self) -> Conn {
        self.conn.clone()
    }

    /// Accepts `job` from ingress entry `entry_id`: ledger created, chunks scheduled, entry acknowledged.
    /// The first chunk is scheduled at `first_due` (the accepting replica submits it right away and holds it
    /// by that lease); the others are due at once.
    pub async fn accept<R: Borrow<RawValue>>(&self, job: &Job<R>, intake: &Intake<'_>) -> Result<Accepted, StoreError> {
        // The chunks' items are copied inside Redis from the entry (which is still in the stream) when their
        // byte spans are known: a big job then never travels back. If the entry is gone, they are sent along.
        let source = if job.item_spans.is_empty() { ItemsSource::Inline } else { ItemsSource::Entry };
        let mut reply = self.accept_with(job, intake, source).await?;
        if reply.0 == AcceptVerdict::Missing {
            reply = self.accept_with(job, intake, ItemsSource::Inline).await?;
        }
        let (verdict, state) = reply;
        if matches!(verdict, AcceptVerdict::Accepted | AcceptVerdict::Cancelled) {
            if intake.plan.len() > 1 || verdict == AcceptVerdict::Cancelled {
                self.scheduled(intake.now); // chunks due at once
            }
            if !intake.submit_first {
                self.scheduled(intake.first_due); // a first chunk the caller does not post (throttled)
            }
        }
        Ok(match verdict {
            AcceptVerdict::Accepted => Accepted::New,
            AcceptVerdict::Cancelled => Accepted::CancelRequested,
            AcceptVerdict::Duplicate => Accepted::Duplicate { state },
            AcceptVerdict::Missing => {
                return Err(StoreError::Corrupt {
                    job_id: job.id.to_string(),
                    detail: "accept answered \"missing\" for items sent inline: the ingress entry vanished while it \
                             was taken in"
                        .to_owned(),
                });
            }
        })
    }

    async fn accept_with<R: Borrow<RawValue>>(
        &self,
        job: &Job<R>,
        intake: &Intake<'_>,
        source: ItemsSource,
    ) -> Result<(AcceptVerdict, String), StoreError> {
        let Intake { entry_id, plan, now, deadline_at, first_due, retry_failed_items, submit_first } = *intake;
        let reply_to = job.reply_to.clone().unwrap_or_else(|| self.keys.results());
        let mut cmd = ScriptCall::new(
            &self.scripts.accept,
            &[self.keys.job(&job.id), self.keys.submit(), self.keys.schedule(), self.keys.cancel(&job.id)],
        );
        cmd.arg(batchd_core::keys::CONSUMER_GROUP)
            .arg(entry_id)
            .arg(job.id.as_str())
            .arg(plan.len())
            .arg(first_due)
            .arg(now)
            .arg(if submit_first { ChunkState::Submitting } else { ChunkState::Pending }.as_str())
            .arg(source.as_str());
        let mut ledger: Vec<(&str, String)> = vec![
            (field::STATE, JobState::Accepted.as_str().to_owned()),
            (field::MODEL, job.model.to_string()),
            (field::ENTRY_ID, entry_id.to_owned()),
            (field::N_CHUNKS, plan.len().to_string()),
            (field::N_ITEMS, job.requests.len().to_string()),
            (field::ACCEPTED_AT, now.to_string()),
            (field::UPDATED_AT, now.to_string()),
            (field::DEADLINE_AT, deadline_at.to_string()),
            (field::REPLY_TO, reply_to),
        ];
        if let Some(metadata) = &job.metadata {
            ledger.push((field::METADATA, metadata.get().to_owned()));
        }
        if retry_failed_items {
            ledger.push((field::RETRY_FAILED_ITEMS, "1".to_owned()));
        }
        for (name, value) in &ledger {
            cmd.arg(*name).arg(value);
        }
        cmd.arg(CHUNKS_MARKER);
        for &(start, len) in plan {
            cmd.arg(format!("{start}:{len}"));
            match (source == ItemsSource::Entry, job.item_spans.get(start), job.item_spans.get(start + len - 1)) {
                (true, Some((from, _)), Some((_, to))) => cmd.arg(format!("{from}:{to}")),
                _ => cmd.arg(RequestsArg(&job.requests[start..start + len])),
            };
        }
        let (verdict, state): (String, String) = self.run(&cmd).await?;
        Ok((AcceptVerdict::parse(&verdict, &job.id)?, state))
    }

    /// Finishes ingress entry `entry_id` as a failed job `job_id` without running it: one `failed` result entry
    /// with `error`, a finished ledger, the entry acknowledged; and, for an undecodable entry, a dead-letter copy
    /// (bounded: see [`Store::with_dead_entry_bytes`]). Returns false when `job_id` already had a ledger (the
    /// entry was a duplicate: only acknowledged, and copied to the dead-letter stream if it had to be).
    pub async fn reject(&self, rejection: &Rejection<'_>, now: UnixMillis) -> Result<bool, StoreError> {
        let dead = rejection.dead.map(|dead| DeadCopy { fields: &dead.fields, reason: &dead.reason, deliveries: None });
        Ok(match self.finish_entry(rejection, dead, 0, now).await? {
            RejectVerdict::Rejected => true,
            RejectVerdict::Duplicate => false,
            RejectVerdict::Gone => {
                return Err(StoreError::Corrupt {
                    job_id: rejection.job_id.to_string(),
                    detail: "reject answered \"gone\" without a delivery guard".to_owned(),
                });
            }
        })
    }

    /// Moves an ingress entry that was delivered more than `max_deliveries` times (`deliveries`, the consumer
    /// group's count) to the dead-letter stream with the error [`TOO_MANY_DELIVERIES`], without reading it as a
    /// job: its `fields` are only copied (bounded). Its default job id, the entry id, gets a `failed` result
    /// (`invalid_entry`) unless that id already has a ledger. Done only if the entry is still pending with more
    /// than `max_deliveries` deliveries, atomically; otherwise nothing changes ([`Undeliverable::Gone`]).
    pub async fn dead_letter_undeliverable(
        &self,
        entry_id: &str,
        fields: &[(String, Vec<u8>)],
        deliveries: u64,
        max_deliveries: u64,
        now: UnixMillis,
    ) -> Result<Undeliverable, StoreError> {
        let job_id = JobId::parse(entry_id)
            .map_err(|e| StoreError::Corrupt { job_id: entry_id.to_owned(), detail: e.to_string() })?;
        let error = JobError::new(
            batchd_core::result::code::INVALID_ENTRY,
            format!(
                "{TOO_MANY_DELIVERIES}: the entry was delivered {deliveries} times, more than ingress.max_deliveries \
                 ({max_deliveries}), without being taken in; it was moved to the dead-letter stream"
            ),
        );
        let rejection = Rejection { entry_id, job_id: &job_id, model: "", error: &error, dead: None, items_total: 0 };
        let dead = DeadCopy { fields, reason: TOO_MANY_DELIVERIES, deliveries: Some(deliveries) };
        Ok(match self.finish_entry(&rejection, Some(dead), max_deliveries.max(1), now).await? {
            RejectVerdict::Rejected => Undeliverable::Moved { published: true },
            RejectVerdict::Duplicate => Undeliverable::Moved { published: false },
            RejectVerdict::Gone => Undeliverable::Gone,
        })
    }

    /// Runs `reject.lua`: see [`Store::reject`]; with `guard` > 0 only for an entry still pending with more than
    /// `guard` deliveries.
    async fn finish_entry(
        &self,
        rejection: &Rejection<'_>,
        dead: Option<DeadCopy<'_>>,
        guard: u64,
        now: UnixMillis,
    ) -> Result<RejectVerdict, StoreError> {
        let Rejection { entry_id, job_id, model, error, dead: _, items_total } = *rejection;
        let entry = ResultEntry {
            job_id: job_id.to_string(),
            status: batchd_core::ResultStatus::Failed,
            model: model.to_owned(),
            result: None,
            error: Some(error.clone()),
            metadata: None,
            request_ids: Vec::new(),
            accepted_at: now,
            finished_at: now,
            items_total,
            items_failed: items_total,
        };
        let result_fields = entry.to_fields();
        let ledger: Vec<(&str, String)> = vec![
            (field::STATE, JobState::Failed.as_str().to_owned()),
            (field::MODEL, model.to_owned()),
            (field::ENTRY_ID, entry_id.to_owned()),
            (field::N_CHUNKS, "0".to_owned()),
            (field::N_ITEMS, items_total.to_string()),
            (field::ACCEPTED_AT, now.to_string()),
            (field::UPDATED_AT, now.to_string()),
            (field::FINISHED_AT, now.to_string()),
            (field::REPLY_TO, self.keys.results()),
            (field::ERROR, error.to_json()),
        ];
        let mut cmd = ScriptCall::new(
            &self.scripts.reject,
            &[self.keys.job(job_id), self.keys.submit(), self.keys.results(), self.keys.dead()],
        );
        cmd.arg(batchd_core::keys::CONSUMER_GROUP)
            .arg(entry_id)
            .arg(self.settings.results_maxlen)
            .arg(self.settings.dead_maxlen)
            .arg(self.settings.ledger_ttl.as_secs().max(1))
            .arg(guard)
            .arg(result_fields.len());
        for (name, value) in &result_fields {
            cmd.arg(*name).arg(value);
        }
        cmd.arg(ledger.len());
        for (name, value) in &ledger {
            cmd.arg(*name).arg(value);
        }
        match dead {
            None => {
                cmd.arg(0);
            }
            Some(dead) => {
                let copy = DeadLetterCopy::new(dead.fields, self.dead_entry_bytes);
                let mut head: Vec<(&str, String)> = vec![
                    ("source_id", entry_id.to_owned()),
                    ("error", dead.reason.to_owned()),
                    ("dead_at", now.to_string()),
                    ("original_fields", copy.original_fields.to_string()),
                    ("original_bytes", copy.original_bytes.to_string()),
                    ("truncated", if copy.truncated { "1" } else { "0" }.to_owned()),
                ];
                if let Some(deliveries) = dead.deliveries {
                    head.push(("deliveries", deliveries.to_string()));
                }
                cmd.arg(head.len() + copy.fields.len());
                for (name, value) in &head {
                    cmd.arg(*name).arg(value);
                }
                for (name, value) in &copy.fields {
                    cmd.arg(format!("field:{name}")).arg(*value);
                }
            }
        }
        let verdict: String = self.run(&cmd).await?;
        let verdict = RejectVerdict::parse(&verdict, job_id)?;
        if verdict == RejectVerdict::Rejected {
            let counts = batchd_core::stats::increments(batchd_core::ResultStatus::Failed.as_str(), model, None);
            self.count_finished(job_id, &counts, now).await;
        }
        Ok(verdict)
    }

    /// Claims up to `limit` (at most [`MAX_CLAIM`]) due schedule members (re-scored to now + lease).
    pub async fn claim_due(&self, now: UnixMillis, limit: usize) -> Result<Vec<String>, StoreError> {
        let lease_until = now + self.settings.lease.as_millis() as u64;
        let mut cmd = ScriptCall::new(&self.scripts.claim, &[self.keys.schedule()]);
        cmd.arg(now).arg(lease_until).arg(limit.clamp(1, MAX_CLAIM));
        let members: Vec<String> = self.run(&cmd).await?;
        Ok(members)
    }

    /// The score of the earliest schedule member, if any (to sleep until it is due).
    pub async fn next_due(&self) -> Result<Option<UnixMillis>, StoreError> {
        let first: Vec<(String, f64)> = self.conn.clone().zrange_withscores(self.keys.schedule(), 0, 0).await?;
        Ok(first.first().map(|(_, score)| *score as UnixMillis))
    }

    /// Makes `members` due at `due` again (hands back claimed work that was never started).
    pub async fn release(&self, members: &[String], due: UnixMillis) -> Result<(), StoreError> {
        if members.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(self.keys.schedule()).arg("XX");
        for member in members {
            cmd.arg(due).arg(member);
        }
        let _: i64 = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// Marks a chunk `submitting` and counts the attempt (see `begin_submit.lua`), returning what to post.
    pub async fn begin_submit(&self, chunk: &ChunkRef, now: UnixMillis) -> Result<SubmitTicket, StoreError> {
        let mut cmd = ScriptCall::new(
            &self.scripts.begin_submit,
            &[self.keys.job(&chunk.job_id), self.keys.cancel(&chunk.job_id)],
        );
        cmd.arg(chunk.index).arg(now);
        let (verdict, attempt, previous, items, indices, requests, model): (
            String,
            u64,
            String,
            String,
            String,
            String,
            String,
        ) = self.run(&cmd).await?;
        let verdict = SubmitVerdict::parse(&verdict, &chunk.job_id)?;
        Ok(match verdict {
            SubmitVerdict::Submit | SubmitVerdict::Resubmit => {
                let corrupt = |what: &str| StoreError::Corrupt {
                    job_id: chunk.job_id.to_string(),
                    detail: format!("chunk {}: {what}", chunk.index),
                };
                let placement = Placement::parse(&items, &indices).ok_or_else(|| corrupt("items"))?;
                let requests: Vec<Box<RawValue>> = serde_json::from_str(&requests).map_err(|_| corrupt("requests"))?;
                if requests.len() != placement.len() {
                    return Err(corrupt("requests do not match items"));
                }
                SubmitTicket::Go { attempt, resubmit: verdict == SubmitVerdict::Resubmit, model, requests, placement }
            }
            SubmitVerdict::Cancelled => SubmitTicket::Cancelled,
            SubmitVerdict::Skip => SubmitTicket::Skip { chunk_state: previous },
            SubmitVerdict::Gone => SubmitTicket::Gone,
        })
    }

    /// Sets chunk fields (`chunk_fields`, stored as `c<i>:<name>`) and job-level fields (`job_fields`),
    /// optionally increments one chunk field, and schedules the chunk at `due` — one atomic step. Returns false
    /// (and unschedules the chunk) when the job has finished meanwhile.
    pub async fn update_chunk(
        &self,
        chunk: &ChunkRef,
        due: Option<UnixMillis>,
        increment: Option<&str>,
        chunk_fields: &[(&str, String)],
        job_fields: &[(&str, String)],
    ) -> Result<bool, StoreError> {
        let mut cmd =
            ScriptCall::new(&self.scripts.update_chunk, &[self.keys.job(&chunk.job_id), self.keys.schedule()]);
        cmd.arg(chunk.to_string())
            .arg(due.map(|due| due.to_string()).unwrap_or_default())
            .arg(increment.map(|name| field::chunk(chunk.index, name)).unwrap_or_default());
        for (name, value) in chunk_fields {
            cmd.arg(field::chunk(chunk.index, name)).arg(value);
        }
        for (name, value) in job_fields {
            cmd.arg(*name).arg(value);
        }
        let updated: i64 = self.run(&cmd).await?;
        let updated = script_flag("update_chunk", updated, &chunk.job_id)?;
        if let (Some(due), true) = (due, updated) {
            self.scheduled(due);
        }
        Ok(updated)
    }

    /// Reads what a poll of `chunk` needs. `None` when the ledger does not exist (expired or never created).
    pub async fn load_chunk(&self, chunk: &ChunkRef) -> Result<Option<ChunkView>, StoreError> {
        let names = [
            field::STATE.to_owned(),
            field::MODEL.to_owned(),
            field::chunk(chunk.index, field::CHUNK_STATE),
            field::chunk(chunk.index, field::CHUNK_REQUEST_ID),
            field::chunk(chunk.index, field::CHUNK_ITEMS),
            field::chunk(chunk.index, field::CHUNK_N_POLLS),
            field::chunk(chunk.index, field::CHUNK_POLL_FAILURES),
            field::DEADLINE_AT.to_owned(),
            field::ACCEPTED_AT.to_owned(),
            field::N_CHUNKS.to_owned(),
            field::N_ITEMS.to_owned(),
            field::REPLY_TO.to_owned(),
            field::METADATA.to_owned(),
            field::chunk(chunk.index, field::CHUNK_REMOTE_STATUS),
        ];
        let (values, cancel_requested): (Vec<Option<String>>, Option<String>) = redis::pipe()
            .hmget(self.keys.job(&chunk.job_id), &names[..])
            .get(self.keys.cancel(&chunk.job_id))
            .query_async(&mut self.conn.clone())
            .await?;
        let Some(state) = values[0].as_deref() else {
            return Ok(None);
        };
        let corrupt = |what: &str| StoreError::Corrupt { job_id: chunk.job_id.to_string(), detail: what.to_owned() };
        let number = |index: usize| -> u64 { values[index].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0) };
        let (items_start, items_len) = parse_items(values[4].as_deref()).ok_or_else(|| corrupt("chunk items"))?;
        Ok(Some(ChunkView {
            job_state: state.parse().map_err(|_| corrupt("job state"))?,
            model: values[1].clone().unwrap_or_default(),
            chunk_state: values[2].as_deref().unwrap_or("").parse().map_err(|_| corrupt("chunk state"))?,
            request_id: values[3].clone(),
            items_start,
            items_len,
            n_polls: number(5),
            poll_failures: number(6),
            deadline_at: number(7),
            accepted_at: number(8),
            n_chunks: number(9) as u32,
            n_items: number(10) as usize,
            reply_to: values[11].clone().unwrap_or_else(|| self.keys.results()),
            metadata: values[12].clone(),
            remote_status: values[13].clone(),
            cancel_requested,
        }))
    }

    /// Stores a finished chunk's output (`state` done) or error (`state` failed) and unschedules it; returns the
    /// number of the job's chunks still open, or `None` when the job already finished.
    pub async fn chunk_done(
        &self,
        chunk: &ChunkRef,
        state: ChunkState,
        payload: &str,
        now: UnixMillis,
    ) -> Result<Option<u32>, StoreError> {
        let mut cmd = ScriptCall::new(&self.scripts.chunk_done, &[self.keys.job(&chunk.job_id), self.keys.schedule()]);
        cmd.arg(chunk.to_string())
            .arg(chunk.index)
            .arg(state.as_str())
            .arg(payload)
            .arg(now)
            .arg(now + self.settings.lease.as_millis() as u64);
        let open: i64 = self.run(&cmd).await?;
        match open {
            -1 => Ok(None),
            open => u32::try_from(open).map(Some).map_err(|_| unknown_answer("chunk_done", open, &chunk.job_id)),
        }
    }

    /// Reads everything needed to build a job's result entry (or decide on a failed-items retry).
    pub async fn publish_context(&self, job_id: &JobId) -> Result<Option<PublishContext>, StoreError> {
        let key = self.keys.job(job_id);
        let head: Vec<Option<String>> = self
            .conn
            .clone()
            .hmget(
                &key,
                &[
                    field::MODEL,
                    field::REPLY_TO,
                    field::METADATA,
                    field::ACCEPTED_AT,
                    field::N_ITEMS,
                    field::N_CHUNKS,
                    field::RETRY_FAILED_ITEMS,
                    field::RETRIED,
                ][..],
            )
            .await?;
        let Some(n_chunks) = head[5].as_deref().and_then(|n| n.parse::<u32>().ok()) else {
            return Ok(None);
        };
        const PER_CHUNK: [&str; 6] = [
            field::CHUNK_REQUEST_ID,
            field::CHUNK_STATE,
            field::CHUNK_OUTPUT,
            field::CHUNK_LAST_ERROR,
            field::CHUNK_ITEMS,
            field::CHUNK_INDICES,
        ];
        let mut chunks = Vec::with_capacity(n_chunks as usize);
        // Read chunk fields a few chunks at a time: outputs can be large.
        for first in (0..n_chunks).step_by(16) {
            let last = (first + 16).min(n_chunks);
            let names: Vec<String> =
                (first..last).flat_map(|index| PER_CHUNK.iter().map(move |name| field::chunk(index, name))).collect();
            let values: Vec<Option<String>> = self.conn.clone().hmget(&key, &names[..]).await?;
            // Moved out of the reply, not cloned: outputs can be tens of MB.
            let mut values = values.into_iter();
            for index in first..last {
                let mut next = || values.next().flatten();
                let (request_id, state, output, last_error, items, indices) =
                    (next(), next(), next(), next(), next(), next());
                let placement = Placement::parse(items.as_deref().unwrap_or(""), indices.as_deref().unwrap_or(""))
                    .ok_or_else(|| StoreError::Corrupt {
                        job_id: job_id.to_string(),
                        detail: format!("chunk {index} has no valid items"),
                    })?;
                chunks.push(ChunkRecord {
                    index,
                    request_id,
                    state: state.as_deref().and_then(|s| s.parse().ok()),
                    output,
                    last_error,
                    placement,
                });
            }
        }
        Ok(Some(PublishContext {
            model: head[0].clone().unwrap_or_default(),
            reply_to: head[1].clone().unwrap_or_else(|| self.keys.results()),
            metadata: head[2].clone(),
            accepted_at: head[3].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0),
            n_items: head[4].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0),
            retry_failed_items: head[6].as_deref() == Some("1"),
            retried: head[7].as_deref() == Some("1"),
            chunks,
        }))
    }

    /// The stored request items of one chunk.
    pub async fn chunk_requests(&self, chunk: &ChunkRef) -> Result<Vec<Box<serde_json::value::RawValue>>, StoreError> {
        let text: Option<String> = self
            .conn
            .clone()
            .hget(self.keys.job(&chunk.job_id), field::chunk(chunk.index, field::CHUNK_REQUESTS))
            .await?;
        text.as_deref().and_then(|text| serde_json::from_str(text).ok()).ok_or_else(|| StoreError::Corrupt {
            job_id: chunk.job_id.to_string(),
            detail: format!("chunk {} has no stored requests", chunk.index),
        })
    }

    /// Adds chunks to a running job, due at `due`: `replaced` (when given) is rewritten with the first of
    /// `chunks`, the rest are appended. With `once_flag`, this happens at most once per job (the flag is set).
    pub async fn add_chunks(
        &self,
        job_id: &JobId,
        due: UnixMillis,
        replaced: Option<u32>,
        once_flag: Option<&str>,
        chunks: &[NewChunk],
    ) -> Result<AddOutcome, StoreError> {
        let mut cmd = ScriptCall::new(&self.scripts.add_chunks, &[self.keys.job(job_id), self.keys.schedule()]);
        cmd.arg(job_id.as_str())
            .arg(due)
            .arg(replaced.map(|index| index.to_string()).unwrap_or_default())
            .arg(once_flag.unwrap_or(""));
        for chunk in chunks {
            let (items, indices) = chunk.placement.encode();
            cmd.arg(items).arg(indices).arg(RequestsArg(&chunk.requests));
        }
        let outcome: i64 = self.run(&cmd).await?;
        if outcome == 1 {
            self.scheduled(due);
        }
        Ok(match outcome {
            1 => AddOutcome::Added,
            0 => AddOutcome::AlreadyDone,
            -1 => AddOutcome::Gone,
            other => return Err(unknown_answer("add_chunks", other, job_id)),
        })
    }

    /// Asks the shared limiter of `bucket` for one slot; `None` means go now (the slot is booked), otherwise how
    /// long to wait before asking again. `interval` is the window divided by the limit.
    pub async fn rate_limit(
        &self,
        bucket: &str,
        interval: Duration,
        burst: u32,
    ) -> Result<Option<Duration>, StoreError> {
        let mut cmd = ScriptCall::new(&self.scripts.rate_limit, &[self.keys.rate_limit(bucket)]);
        cmd.arg(interval.as_secs_f64() * 1000.0).arg(burst.max(1));
        let wait_ms: u64 = self.run(&cmd).await?;
        Ok((wait_ms > 0).then(|| Duration::from_millis(wait_ms)))
    }

    /// Remembers which chunk a remote batch belongs to, by its request id, until the ledger expires (the job's
    /// deadline plus the ledger's lifetime), so a batch event can wake the chunk ([`Store::wake_request`]).
    pub async fn index_request(
        &self,
        request_id: &str,
        chunk: &ChunkRef,
        deadline_at: UnixMillis,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let ledger_ttl = u64::try_from(self.settings.ledger_ttl.as_millis()).unwrap_or(u64::MAX);
        let millis = deadline_at.saturating_sub(now).saturating_add(ledger_ttl).max(1);
        let _: () = redis::cmd("SET")
            .arg(self.keys.request(request_id))
            .arg(chunk.to_string())
            .arg("PX")
            .arg(millis)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Makes the chunk of the batch `request_id` due now, if batchd knows the request id and the chunk is
    /// polling (see `wake.lua`). Returns the chunk and whether it was woken; `None` for an unknown request id.
    pub async fn wake_request(
        &self,
        request_id: &str,
        now: UnixMillis,
    ) -> Result<Option<(ChunkRef, bool)>, StoreError> {
        let member: Option<String> =
            redis::cmd("GET").arg(self.keys.request(request_id)).query_async(&mut self.conn.clone()).await?;
        let Some(chunk) = member.and_then(|member| ChunkRef::parse(&member).ok()) else {
            return Ok(None);
        };
        let mut cmd = ScriptCall::new(&self.scripts.wake, &[self.keys.job(&chunk.job_id), self.keys.schedule()]);
        cmd.arg(chunk.to_string()).arg(chunk.index).arg(now);
        let woken: i64 = self.run(&cmd).await?;
        let woken = script_flag("wake", woken, &chunk.job_id)?;
        if woken {
            self.soon_due.notify_one();
        }
        Ok(Some((chunk, woken)))
    }

    /// Requests cancellation of a job (see `cancel.lua`); returns its state (empty when no ledger exists yet:
    /// the request then waits for the job to arrive, for `ledger_ttl`).
    pub async fn cancel(&self, job_id: &JobId, reason: &str) -> Result<String, StoreError> {
        let mut cmd = ScriptCall::new(
            &self.scripts.cancel,
            &[self.keys.job(job_id), self.keys.cancel(job_id), self.keys.schedule()],
        );
        cmd.arg(job_id.as_str()).arg(self.settings.ledger_ttl.as_secs().max(1)).arg(if reason.is_empty() {
            "cancelled"
        } else {
            reason
        });
        let state: String = self.run(&cmd).await?;
        if !state.is_empty() && state.parse::<JobState>().is_err() {
            return Err(unknown_answer("cancel", &state, job_id));
        }
        Ok(state)
    }

    /// Takes `member` off the schedule (a member batchd did not write, or whose ledger is corrupt).
    pub async fn drop_member(&self, member: &str) -> Result<(), StoreError> {
        let _: i64 =
            redis::cmd("ZREM").arg(self.keys.schedule()).arg(member).query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// The cancellation reason, when a cancellation was requested for the job.
    pub async fn cancel_requested(&self, job_id: &JobId) -> Result<Option<String>, StoreError> {
        Ok(self.conn.clone().get(self.keys.cancel(job_id)).await?)
    }

    /// Publishes `entry` to `reply_to` and closes the ledger with `state`, atomically and at most once per job.
    /// Returns false when the job had already finished (nothing was published).
    pub async fn publish(
        &self,
        job_id: &JobId,
        entry: ResultEntry,
        state: JobState,
        reply_to: &str,
        now: UnixMillis,
    ) -> Result<bool, StoreError> {
        if !self.keys.is_results_stream(reply_to) {
            return Err(StoreError::Corrupt {
                job_id: job_id.to_string(),
                detail: format!("reply_to {reply_to:?} is outside the namespace"),
            });
        }
        // The entry is serialised once and dropped, and the fields are dropped once copied into the command: a
        // merged result can be tens of MB, and each copy held at the same time counts.
        let fields = entry.to_fields();
        let error = entry.error.as_ref().map(JobError::to_json).unwrap_or_default();
        let counts = batchd_core::stats::increments(
            entry.status.as_str(),
            &entry.model,
            entry.result.as_ref().map(|output| &output.usage),
        );
        drop(entry);
        let mut cmd = ScriptCall::new(
            &self.scripts.publish,
            &[self.keys.job(job_id), reply_to.to_owned(), self.keys.schedule(), self.keys.cancel(job_id)],
        );
        cmd.arg(state.as_str())
            .arg(now)
            .arg(self.settings.results_maxlen)
            .arg(self.settings.ledger_ttl.as_secs().max(1))
            .arg(job_id.as_str())
            .arg(error)
            .arg(fields.len());
        for (name, value) in &fields {
            cmd.arg(*name).arg(value);
        }
        drop(fields);
        let published: i64 = self.run(&cmd).await?;
        let published = script_flag("publish", published, job_id)?;
        if published {
            self.count_finished(job_id, &counts, now).await;
        }
        Ok(published)
    }

    /// Adds a finished job's `counts` ([`batchd_core::stats::increments`]) to the minute's and the hour's counters
    /// (`now` is Redis's time). Runs after the publish, not inside its script: a replica that dies between the two
    /// leaves one job uncounted, which the dashboard's rates can bear, and the publish script's layout stays the
    /// one every replica speaks. A failure is logged, never returned: the result is out already.
    async fn count_finished(&self, job_id: &JobId, counts: &[(String, u64)], now: UnixMillis) {
        use batchd_core::keys::{STATS_HOUR_TTL_SECS, STATS_MINUTE_TTL_SECS};
        let minute = self.keys.stats_minute(now / 60_000);
        let hour = self.keys.stats_hour(now / 3_600_000);
        let mut pipe = redis::pipe();
        for (key, ttl) in [(&minute, STATS_MINUTE_TTL_SECS), (&hour, STATS_HOUR_TTL_SECS)] {
            for (name, n) in counts {
                pipe.hincr(key, name, *n).ignore();
            }
            pipe.expire(key, ttl as i64).ignore();
        }
        if let Err(error) = pipe.query_async::<()>(&mut self.conn.clone()).await {
            tracing::warn!(job_id = %job_id, error = %error, "finished-jobs counters not updated");
        }
    }

    /// The whole ledger of a job, as stored (for `batchd status`). `None` when there is none.
    pub async fn ledger(&self, job_id: &JobId) -> Result<Option<HashMap<String, String>>, StoreError> {
        let ledger: HashMap<String, String> = self.conn.clone().hgetall(self.keys.job(job_id)).await?;
        Ok((!ledger.is_empty()).then_some(ledger))
    }
}

/// A JSON array of raw items, byte for byte, written straight into the command being built: a chunk can be
/// nearly 10 MB, and an intermediate string would be one more copy of it in memory.
struct RequestsArg<'a, R>(&'a [R]);

impl<R: Borrow<RawValue>> redis::ToRedisArgs for RequestsArg<'_, R> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        use std::io::Write as _;
        let mut writer = out.writer_for_next_arg();
        let mut write = |bytes: &[u8]| writer.write_all(bytes).expect("writing into memory cannot fail");
        write(b"[");
        for (position, item) in self.0.iter().enumerate() {
            if position > 0 {
                write(b",");
            }
            write(item.borrow().get().as_bytes());
        }
        write(b"]");
    }
}

/// The error for a script answer outside what the script documents (a script and a binary of different versions).
fn unknown_answer(script: &str, answer: impl std::fmt::Debug, job_id: &impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt { job_id: job_id.to_string(), detail: format!("{script}.lua answered {answer:?}") }
}

/// A script's 1 (done) or 0 (nothing done) as a bool; anything else is an error.
fn script_flag(script: &str, answer: i64, job_id: &impl std::fmt::Display) -> Result<bool, StoreError> {
    match answer {
        1 => Ok(true),
        0 => Ok(false),
        other => Err(unknown_answer(script, other, job_id)),
    }
}

fn parse_items(raw: Option<&str>) -> Option<(usize, usize)> {
    let (start, len) = raw?.split_once(':')?;
    Some((start.parse().ok()?, len.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, usize)]) -> Vec<(String, Vec<u8>)> {
        pairs.iter().map(|(name, size)| ((*name).to_owned(), vec![b'x'; *size])).collect()
    }

    #[test]
    fn a_dead_letter_copy_keeps_whole_fields_while_they_fit() {
        let entry = fields(&[("job", 10), ("source", 5)]);
        let copy = DeadLetterCopy::new(&entry, 1000);
        assert_eq!(copy.fields, [("job", &[b'x'; 10][..]), ("source", &[b'x'; 5][..])]);
        assert_eq!((copy.original_fields, copy.original_bytes, copy.truncated), (2, 24, false));
    }

    #[test]
    fn a_dead_letter_copy_cuts_the_field_that_does_not_fit_and_stops() {
        let entry = fields(&[("job", 1_000_000), ("after", 1)]);
        let copy = DeadLetterCopy::new(&entry, 64 * 1024);
        assert_eq!(copy.fields.len(), 1);
        assert_eq!(copy.fields[0].1.len(), 64 * 1024 - 3, "name and value together fill the budget");
        assert_eq!((copy.original_fields, copy.original_bytes, copy.truncated), (2, 1_000_009, true));
    }

    #[test]
    fn a_dead_letter_copy_never_cuts_a_name_and_holds_at_most_dead_max_fields() {
        let entry = fields(&[("a", 2), ("a-very-long-name", 0)]);
        let copy = DeadLetterCopy::new(&entry, 5);
        assert_eq!(copy.fields, [("a", &b"xx"[..])]);
        assert!(copy.truncated);

        let names: Vec<String> = (0..5_000).map(|i| format!("f{i}")).collect();
        let many: Vec<(String, Vec<u8>)> = names.iter().map(|name| (name.clone(), b"v".to_vec())).collect();
        let copy = DeadLetterCopy::new(&many, usize::MAX);
        assert_eq!(copy.fields.len(), DEAD_MAX_FIELDS);
        assert_eq!((copy.original_fields, copy.truncated), (5_000, true));
    }

    #[test]
    fn every_script_is_known_by_name_and_gets_the_shared_names_from_rust() {
        for name in SCRIPT_NAMES {
            let text = script_source(name).expect(name);
            assert!(text.starts_with(&script_constants()), "{name}");
            assert!(text.contains(&format!("\nlocal F_OPEN_CHUNKS = '{OPEN_CHUNKS}'\n")), "{name}");
            assert!(text.contains(&format!("\nlocal MAX_CHUNKS = {MAX_CHUNKS_PER_JOB}\n")), "{name}");
        }
        assert!(script_source("nonesuch").is_none());
        let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lua")).expect("lua dir");
        let mut on_disk: Vec<String> = files
            .map(|file| file.expect("entry").file_name().to_string_lossy().trim_end_matches(".lua").to_owned())
            .filter(|name| name != "prelude")
            .collect();
        on_disk.sort();
        let mut known: Vec<&str> = SCRIPT_NAMES.to_vec();
        known.sort_unstable();
        assert_eq!(on_disk, known, "every script file is loaded");
    }

    #[test]
    fn the_generated_names_are_quoted_for_lua_and_unique() {
        assert_eq!(lua_quote("c"), "'c'");
        assert_eq!(lua_quote("it's \\ \n"), "'it\\'s \\\\ \\010'");
        let constants = script_constants();
        let names: Vec<&str> = constants
            .lines()
            .filter_map(|line| line.strip_prefix("local "))
            .map(|rest| rest.strip_prefix("function ").unwrap_or(rest))
            .filter_map(|rest| rest.split([' ', '(']).next())
            .collect();
        let unique: std::collections::HashSet<&&str> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "a generated name is defined twice");
        assert!(constants.contains("local JOB_CANCELLED = 'cancelled'\n"));
        assert!(constants.contains("local SUBMIT_RESUBMIT = 'resubmit'\n"));
        assert!(constants.contains(
            "local TERMINAL_JOB_STATES = {['completed'] = true, ['failed'] = true, ['expired'] = true, \
             ['cancelled'] = true}\n"
        ));
    }

    #[test]
    fn script_words_parse_their_own_text_and_refuse_others() {
        for verdict in SubmitVerdict::ALL {
            assert_eq!(SubmitVerdict::parse(verdict.as_str(), &"j").unwrap(), *verdict);
        }
        let error = AcceptVerdict::parse("acepted", &"j").unwrap_err().to_string();
        assert!(error.contains("accept.lua answered \"acepted\""), "{error}");
        assert!(RejectVerdict::parse("", &"j").is_err());
    }
}
