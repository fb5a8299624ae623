//! The storage's Lua scripts as Redis runs them: each gets, before the shared prelude, the names, words and limits
//! it shares with Rust (ledger fields, states, verdicts, the member format), generated here from batchd-core, so a
//! Lua literal cannot drift from the Rust one; and one `EVALSHA` call per transition.

use super::*;

pub(super) struct Scripts {
    pub(super) accept: Script,
    pub(super) reject: Script,
    pub(super) claim: Script,
    pub(super) begin_submit: Script,
    pub(super) transition: Script,
    pub(super) chunk_done: Script,
    pub(super) add_chunks: Script,
    pub(super) publish: Script,
    pub(super) rate_limit: Script,
    pub(super) wake: Script,
    pub(super) roll_up: Script,
    pub(super) pack_form: Script,
    pub(super) pack_deliver: Script,
    pub(super) pack_close: Script,
}

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
            pub(super) fn parse(text: &str, job_id: &impl std::fmt::Display) -> Result<Self, StoreError> {
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
    /// The verdict of `pack_form.lua`.
    pub enum PackVerdict ("pack_form", "PACK_") {
        /// Members were taken into the pack (created by this call when it did not exist).
        Formed = "formed",
        /// No queued chunk could be taken and the pack does not exist: nothing was formed.
        Empty = "empty",
        /// The pack was submitted already (or finished): its membership is frozen.
        Sealed = "sealed",
    }
}

script_words! {
    /// The verdict of `pack_deliver.lua`.
    pub enum DeliverVerdict ("pack_deliver", "DELIVER_") {
        /// The run was delivered (members already served or ended are skipped).
        Delivered = "delivered",
        /// The pack's cursor is not the caller's: another delivery moved it.
        Moved = "moved",
        /// The pack has no ledger.
        Gone = "gone",
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
        /// The caller's claim of the chunk was taken over (its fencing token is not the chunk's latest).
        Stale = "stale",
        /// The chunk is past submitting.
        Skip = "skip",
        /// The chunk is marked `submitting`: post it.
        Submit = "submit",
        /// As `Submit`, but a previous submit was interrupted (its remote batch may exist).
        Resubmit = "resubmit",
        /// As `Resubmit`, but the previous attempt only looked for that batch and waits for one it found to end:
        /// the look resumes, not counted as a possible duplicate.
        ResumeLook = "resume_look",
    }
}

script_words! {
    /// A named transition of a claimed chunk: `transition.lua`'s first argument (see the script for the chunk
    /// states each one starts from).
    pub enum Transition ("transition", "T_") {
        /// The remote batch exists: record its request id, the chunk polls next (from `submitting`).
        MarkSubmitted = "mark_submitted",
        /// A multi-request submit created part of the remote batch (an upload): record it, renew the lease (from
        /// `submitting`).
        RecordRemote = "record_remote",
        /// A poll found the batch still running: count it, poll again (from `polling`).
        MarkPendingPoll = "mark_pending_poll",
        /// A poll failed and is retried: record the failure (from `polling`).
        MarkPollFailed = "mark_poll_failed",
        /// A submit failed and is retried (from `submitting`).
        MarkSubmitRetry = "mark_submit_retry",
        /// A created batch was refused for a quota: the chunk is created again after a backoff (from `polling`).
        MarkRecreate = "mark_recreate",
        /// A cancelled job's chunk whose earlier submit was looked up and created nothing: it is unsent (from
        /// `submitting` to `pending`).
        MarkUnsent = "mark_unsent",
        /// The daemon acts on the job's cancellation: when, recorded once for the job, the lease renewed (any
        /// state).
        NoteCancel = "note_cancel",
        /// The job's cancellation was withdrawn (`batchd uncancel`): when it was first seen is dropped, so a later
        /// cancel waits from when it is acted on; the lease renewed (any state).
        ForgetCancel = "forget_cancel",
        /// The rate limiter said wait: due again later, nothing else changes (from any unfinished state).
        Reschedule = "reschedule",
        /// The step is still working: its lease is extended (any state).
        Renew = "renew",
        /// Claimed work handed back unstarted (any state).
        Release = "release",
        /// The job has finished or is gone: take the member off the schedule (applies to nothing else).
        Forget = "forget",
    }
}

script_words! {
    /// The verdict of a fenced write of a chunk (`transition.lua`, `chunk_done.lua`).
    pub enum FenceVerdict ("transition", "FENCE_") {
        /// Written.
        Applied = "applied",
        /// The job has finished or has no ledger: the member was taken off the schedule, nothing else written.
        Gone = "gone",
        /// The caller's claim was taken over by a later one: nothing written.
        Stale = "stale",
        /// The chunk is not in a state this write starts from: nothing written.
        Refused = "refused",
    }
}

script_words! {
    /// The verdict of `add_chunks.lua`.
    pub enum AddVerdict ("add_chunks", "ADD_") {
        /// The chunks were added and scheduled.
        Added = "added",
        /// The once-only guard was already set; nothing was added.
        Guarded = "guarded",
        /// The job has finished or has no ledger.
        Gone = "gone",
        /// The caller's claim was taken over by a later one: nothing written.
        Stale = "stale",
        /// The chunk to split is no longer `submitting`: nothing written.
        Refused = "refused",
    }
}

/// The fencing token of a chunk's first claim: the take-in's, when it posts the first chunk at once.
pub const FIRST_CLAIM: u64 = 1;

/// One ledger field of a chunk's view: a job field, or a field of the chunk (`c<index>:<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewField {
    /// A job-level field.
    Job(&'static str),
    /// A per-chunk field.
    Chunk(&'static str),
}

impl ViewField {
    /// The field's name in the ledger, for chunk `index`.
    pub fn name(self, index: u32) -> String {
        match self {
            Self::Job(name) => name.to_owned(),
            Self::Chunk(name) => field::chunk(index, name),
        }
    }
}

/// The ledger fields of a chunk's view ([`ChunkView`]), in the order its parser reads them: read by
/// [`Store::load_chunk`] and, in the claim itself, by `claim.lua` (which gets this list generated as
/// `VIEW_FIELDS`). The job's state comes first and the claim token is [`VIEW_CLAIM`].
pub const VIEW_FIELDS: [ViewField; 22] = [
    ViewField::Job(field::STATE),
    ViewField::Job(field::MODEL),
    ViewField::Chunk(field::CHUNK_STATE),
    ViewField::Chunk(field::CHUNK_REQUEST_ID),
    ViewField::Chunk(field::CHUNK_ITEMS),
    ViewField::Chunk(field::CHUNK_N_POLLS),
    ViewField::Chunk(field::CHUNK_POLL_FAILURES),
    ViewField::Job(field::DEADLINE_AT),
    ViewField::Job(field::ACCEPTED_AT),
    ViewField::Job(field::N_CHUNKS),
    ViewField::Job(field::N_ITEMS),
    ViewField::Job(field::REPLY_TO),
    ViewField::Job(field::METADATA),
    ViewField::Chunk(field::CHUNK_REMOTE_STATUS),
    ViewField::Chunk(field::CHUNK_CLAIM),
    ViewField::Chunk(field::CHUNK_REMOTE),
    ViewField::Job(field::ENDPOINT),
    ViewField::Job(field::N_REFERENCES),
    ViewField::Job(field::CANCEL_SEEN_AT),
    ViewField::Chunk(field::CHUNK_SUBMITTED_AT),
    ViewField::Chunk(field::CHUNK_PACK),
    ViewField::Job(field::PACK_MEMBERS),
];

/// Where the claim token is in [`VIEW_FIELDS`] (1-based, as Lua counts).
pub const VIEW_CLAIM: usize = 15;

/// The marker in `accept.lua`'s arguments between the ledger pairs and the chunks.
pub(super) const CHUNKS_MARKER: &str = "--chunks";

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
/// `ACCEPT_DUPLICATE`, the items sources `SOURCE_ENTRY`/`SOURCE_INLINE`, the transitions `T_MARK_SUBMITTED`...,
/// `CHUNKS_MARKER`), the ingress entry's job field (`ENTRY_JOB_FIELD`), the limits (`MAX_CHUNKS`, `MAX_PAIRS`,
/// `MAX_LIMIT`), the first claim's token (`FIRST_CLAIM`), and the functions
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
    strings.extend(Transition::lua_locals());
    strings.extend(FenceVerdict::lua_locals());
    strings.extend(AddVerdict::lua_locals());
    strings.extend(PackVerdict::lua_locals());
    strings.extend(DeliverVerdict::lua_locals());
    strings.push(("PACK_QUEUED".to_owned(), batchd_core::ids::PACK_QUEUED));
    strings.push(("PACK_MEMBER_SEPARATOR".to_owned(), batchd_core::ids::PACK_MEMBER_SEPARATOR));
    strings.push(("CHUNKS_MARKER".to_owned(), CHUNKS_MARKER));
    strings.push(("ENTRY_JOB_FIELD".to_owned(), batchd_core::job::JOB_FIELD));

    let mut text = String::from("-- Generated from batchd-core by batchd_queue::store::script_constants.\n");
    for (name, value) in &strings {
        writeln!(text, "local {name} = {}", lua_quote(value)).expect("writing into memory");
    }
    writeln!(text, "local MAX_CHUNKS = {MAX_CHUNKS_PER_JOB}").expect("writing into memory");
    writeln!(text, "local MAX_PAIRS = {MAX_SCRIPT_PAIRS}").expect("writing into memory");
    writeln!(text, "local MAX_LIMIT = {MAX_CLAIM}").expect("writing into memory");
    writeln!(text, "local FIRST_CLAIM = {FIRST_CLAIM}").expect("writing into memory");
    writeln!(text, "local MAX_PACK_STEP = {MAX_PACK_STEP}").expect("writing into memory");
    let view: Vec<String> = VIEW_FIELDS
        .iter()
        .map(|field| match field {
            ViewField::Job(name) => format!("{{false, {}}}", lua_quote(name)),
            ViewField::Chunk(name) => format!("{{true, {}}}", lua_quote(name)),
        })
        .collect();
    writeln!(text, "local VIEW_FIELDS = {{{}}}", view.join(", ")).expect("writing into memory");
    writeln!(text, "local VIEW_CLAIM = {VIEW_CLAIM}").expect("writing into memory");
    writeln!(text, "local MAX_ROLL_UP = {MAX_ROLL_UP}").expect("writing into memory");
    writeln!(text, "local STATS_MINUTE_TTL = {}", batchd_core::keys::STATS_MINUTE_TTL_SECS)
        .expect("writing into memory");
    writeln!(text, "local STATS_HOUR_TTL = {}", batchd_core::keys::STATS_HOUR_TTL_SECS).expect("writing into memory");
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
/// the finished-jobs counters (`counters.lua`), then the script itself.
pub(crate) fn script_text(body: &str) -> String {
    library_text(&format!("{}\n{body}", include_str!("../lua/counters.lua")))
}

/// The names, words and limits from Rust and the shared prelude, then `body`: what the Functions library
/// (`functions.lua`, which never counts finished jobs) is built on.
pub(crate) fn library_text(body: &str) -> String {
    format!("{}{}\n{body}", script_constants(), include_str!("../lua/prelude.lua"))
}

/// The full text of a storage script by its file name without `.lua` (`accept`, `reject`, ...), as Redis runs
/// it: for tests that drive a script with arguments [`Store`] never sends (error paths, malformed input).
pub fn script_source(name: &str) -> Option<String> {
    let body = match name {
        "accept" => include_str!("../lua/accept.lua"),
        "reject" => include_str!("../lua/reject.lua"),
        "claim" => include_str!("../lua/claim.lua"),
        "begin_submit" => include_str!("../lua/begin_submit.lua"),
        "transition" => include_str!("../lua/transition.lua"),
        "chunk_done" => include_str!("../lua/chunk_done.lua"),
        "add_chunks" => include_str!("../lua/add_chunks.lua"),
        "publish" => include_str!("../lua/publish.lua"),
        "rate_limit" => include_str!("../lua/rate_limit.lua"),
        "wake" => include_str!("../lua/wake.lua"),
        "roll_up" => include_str!("../lua/roll_up.lua"),
        "pack_form" => include_str!("../lua/pack_form.lua"),
        "pack_deliver" => include_str!("../lua/pack_deliver.lua"),
        "pack_close" => include_str!("../lua/pack_close.lua"),
        _ => return None,
    };
    Some(script_text(body))
}

/// The file names (without `.lua`) of every storage script, for [`script_source`].
pub const SCRIPT_NAMES: [&str; 14] = [
    "accept",
    "reject",
    "claim",
    "begin_submit",
    "transition",
    "chunk_done",
    "add_chunks",
    "publish",
    "rate_limit",
    "wake",
    "roll_up",
    "pack_form",
    "pack_deliver",
    "pack_close",
];

/// Most minutes one roll-up of the finished-jobs counters takes (`roll_up.lua` refuses more): three hours.
pub const MAX_ROLL_UP: u64 = 180;

/// One script call: `EVALSHA <script> <n keys> <keys>`, the caller adding the arguments through the command it
/// derefs to. Built as one [`redis::Cmd`] (not redis-rs's `ScriptInvocation`, which holds the arguments and then
/// copies them all into a command): a job's items can be tens of MB, and each copy of them counts. It keeps its
/// script, so [`Store::run`] can load it into a Redis that lost it.
pub(super) struct ScriptCall<'s> {
    pub(super) script: &'s Script,
    pub(super) cmd: redis::Cmd,
}

impl<'s> ScriptCall<'s> {
    pub(super) fn new(script: &'s Script, keys: &[String]) -> Self {
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
    pub(super) fn load() -> Self {
        let load = |name: &str| Script::new(&script_source(name).expect("a known script"));
        Self {
            accept: load("accept"),
            reject: load("reject"),
            claim: load("claim"),
            begin_submit: load("begin_submit"),
            transition: load("transition"),
            chunk_done: load("chunk_done"),
            add_chunks: load("add_chunks"),
            publish: load("publish"),
            rate_limit: load("rate_limit"),
            wake: load("wake"),
            roll_up: load("roll_up"),
            pack_form: load("pack_form"),
            pack_deliver: load("pack_deliver"),
            pack_close: load("pack_close"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            .filter(|name| !["prelude", "counters", "functions"].contains(&name.as_str()))
            .collect();
        on_disk.sort();
        let mut known: Vec<&str> = SCRIPT_NAMES.to_vec();
        known.sort_unstable();
        assert_eq!(on_disk, known, "every script file is loaded");
    }

    #[test]
    fn the_view_starts_with_the_state_and_has_the_claim_where_the_claim_script_looks() {
        assert_eq!(VIEW_FIELDS[0], ViewField::Job(field::STATE));
        assert_eq!(VIEW_FIELDS[VIEW_CLAIM - 1], ViewField::Chunk(field::CHUNK_CLAIM));
        assert!(
            script_constants().contains("local VIEW_FIELDS = {{false, 'state'}, {false, 'model'}, {true, 'state'}")
        );
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
