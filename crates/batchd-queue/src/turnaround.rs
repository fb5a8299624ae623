//! The remote-completion counters per model ([`Keys::stats_turnaround`], fields from
//! [`batchd_core::turnaround`]): the sampler's bounded flush of one replica's counts, and the bounded read of the
//! last 24 hours that `batchd status` and the dashboard take p50/p95 from.

use std::collections::BTreeMap;

use batchd_core::ledger::field;
use batchd_core::turnaround::{Buckets, Usual, compare_text, sum};
use batchd_core::{ChunkState, Keys, UnixMillis};

use crate::ledger_view::LedgerView;
use crate::{Conn, StoreError};

/// Hours read back: the last day, the current hour included.
pub const HOURS: u64 = 24;

/// Most fields of one hour's hash that are read; an hour with more (only a flood of model names could make one)
/// is skipped and counted in [`Usuals::hours_skipped`].
pub const MAX_FIELDS_PER_HOUR: usize = 2048;

/// The Redis commands one [`flush`] sends for `counts`: one `HINCRBY` per non-zero bucket and one `EXPIRE`, in
/// one round trip (nothing when there is nothing to add).
pub fn flush_commands(counts: &BTreeMap<String, Buckets>) -> usize {
    let n: usize = counts.values().map(|buckets| buckets.iter().filter(|n| **n > 0).count()).sum();
    if n == 0 { 0 } else { n + 1 }
}

/// Adds one replica's `counts` to the hash of the hour of `now_ms`, in one pipelined round trip of
/// [`flush_commands`] commands, and (re)sets its expiry.
pub async fn flush(
    conn: &mut Conn,
    keys: &Keys,
    now_ms: UnixMillis,
    counts: &BTreeMap<String, Buckets>,
) -> Result<(), StoreError> {
    if flush_commands(counts) == 0 {
        return Ok(());
    }
    let key = keys.stats_turnaround(now_ms / 3_600_000);
    let mut pipe = redis::pipe();
    for (model, buckets) in counts {
        for (bucket, n) in buckets.iter().enumerate().filter(|(_, n)| **n > 0) {
            pipe.hincr(&key, batchd_core::turnaround::field(model, bucket), *n).ignore();
        }
    }
    pipe.expire(&key, batchd_core::keys::STATS_HOUR_TTL_SECS as i64).ignore();
    pipe.query_async::<()>(conn).await?;
    Ok(())
}

/// What the last [`HOURS`] hours say of each model's batches.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usuals {
    /// Per model: batches counted and their p50/p95.
    pub models: BTreeMap<String, Usual>,
    /// Hours not read because their hash had more than [`MAX_FIELDS_PER_HOUR`] fields.
    pub hours_skipped: u64,
}

impl Usuals {
    /// The figures of `model`, if its batches were counted.
    pub fn of(&self, model: &str) -> Option<&Usual> {
        self.models.get(model)
    }
}

/// Reads the last [`HOURS`] hours' counters up to `now_ms`: one round trip of `HLEN`s, one of `HGETALL`s of the
/// hours within [`MAX_FIELDS_PER_HOUR`].
pub async fn usuals(conn: &mut Conn, keys: &Keys, now_ms: UnixMillis) -> Result<Usuals, StoreError> {
    let hour = now_ms / 3_600_000;
    let hours: Vec<String> = (0..HOURS).map(|back| keys.stats_turnaround(hour.saturating_sub(back))).collect();
    let mut pipe = redis::pipe();
    for key in &hours {
        pipe.hlen(key);
    }
    let lengths: Vec<usize> = pipe.query_async(conn).await?;
    let readable: Vec<&String> = hours
        .iter()
        .zip(&lengths)
        .filter(|(_, n)| (1..=MAX_FIELDS_PER_HOUR).contains(*n))
        .map(|(key, _)| key)
        .collect();
    let hours_skipped = lengths.iter().filter(|n| **n > MAX_FIELDS_PER_HOUR).count() as u64;
    let hashes: Vec<Vec<(String, u64)>> = if readable.is_empty() {
        Vec::new()
    } else {
        let mut pipe = redis::pipe();
        for key in &readable {
            pipe.hgetall(*key);
        }
        pipe.query_async(conn).await?
    };
    let models = sum(&hashes).into_iter().filter_map(|(model, buckets)| Some((model, Usual::of(&buckets)?))).collect();
    Ok(Usuals { models, hours_skipped })
}

/// A chunk whose batch is still at the remote API, its age and its model's usual time (what `batchd status` and
/// the dashboard's job page show).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AtRemote {
    /// The chunk's index.
    pub chunk: usize,
    /// Seconds the chunk's batch has been at the remote API, what is compared with the usual figures (which
    /// measure from a batch's submit to its completion): since its submit, or since the job's acceptance when the
    /// ledger has no submit time.
    pub age_secs: u64,
    /// Seconds since the chunk's batch was submitted, when the ledger has the time.
    pub batch_age_secs: Option<u64>,
    /// The model's figures over the last [`HOURS`] hours; `None`: no history yet.
    pub usual: Option<Usual>,
    /// Whether `age_secs` is past the model's p95.
    pub older_than_p95: bool,
    /// The comparison as people read it ([`batchd_core::turnaround::compare_text`]).
    pub text: String,
}

/// Whether any chunk of `view` is at the remote API (so [`usuals`] is worth reading).
pub fn any_at_remote(view: &LedgerView) -> bool {
    !view.state().is_some_and(|state| state.is_terminal())
        && view.chunks.iter().any(|chunk| chunk.state() == Some(ChunkState::Polling))
}

/// The chunks of `view` still at the remote API at `now_ms`, each against its model's figures in `usuals`.
pub fn at_remote(view: &LedgerView, usuals: &Usuals, now_ms: UnixMillis) -> Vec<AtRemote> {
    if !any_at_remote(view) {
        return Vec::new();
    }
    let model = view.get(field::MODEL).unwrap_or("-");
    let usual = usuals.of(model).copied();
    let since = |at: u64| now_ms.saturating_sub(at) / 1000;
    let job_age_secs = since(view.number(field::ACCEPTED_AT).unwrap_or(now_ms));
    view.chunks
        .iter()
        .enumerate()
        .filter(|(_, chunk)| chunk.state() == Some(ChunkState::Polling))
        .map(|(chunk_index, chunk)| {
            let batch_age_secs = chunk.submitted_at().map(since);
            let age_secs = batch_age_secs.unwrap_or(job_age_secs);
            let age = std::time::Duration::from_secs(age_secs);
            AtRemote {
                chunk: chunk_index,
                age_secs,
                batch_age_secs,
                usual,
                older_than_p95: usual.is_some_and(|usual| usual.exceeded_by(age)),
                text: compare_text(model, usual.as_ref(), age),
            }
        })
        .collect()
}
