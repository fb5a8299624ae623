//! The job ledger, the schedule and result publishing: every state transition is one Lua script, so a crash
//! between two steps leaves Redis in a state a restarted replica can resume from.

use std::borrow::Borrow;
use std::time::Duration;

use batchd_core::ledger::field;
use batchd_core::reference::ChunkReferences;
use batchd_core::{ChunkRef, ChunkState, Job, JobError, JobId, JobState, Keys, ResultEntry, UnixMillis};
use redis::{AsyncCommands, Script};
use serde_json::value::RawValue;

use crate::ledger_view::parse_items;
use crate::{Conn, StoreError};

mod chunks;
mod ending;
mod intake;
mod packs;
mod remote;
mod scripts;
mod types;

pub use scripts::*;
pub use types::*;

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
    /// Wakes this process's packer when an accepted job queued a chunk for packing (see [`Store::packing_queued`]).
    packing_queued: std::sync::Arc<tokio::sync::Notify>,
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

/// Most members one step of a pack takes or hands results to (`pack_form.lua`, `pack_deliver.lua`): a pack of tens
/// of thousands of members is formed and delivered in runs of this many, each atomic, so neither script holds
/// Redis for long nor unpacks more than ~1,000 values.
pub const MAX_PACK_STEP: usize = 500;

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

impl Store {
    /// A store over `conn` for the namespace of `keys`.
    pub fn new(conn: Conn, keys: Keys, settings: StoreSettings) -> Self {
        Self {
            conn,
            keys,
            settings,
            scripts: std::sync::Arc::new(Scripts::load()),
            soon_due: std::sync::Arc::new(tokio::sync::Notify::new()),
            packing_queued: std::sync::Arc::new(tokio::sync::Notify::new()),
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
