//! Read-only looks at a namespace, for operators and producers: queue depths, ledgers (one, or a bounded page of
//! them), the ingress group's consumers, result and dead-letter entries, the finished-jobs counters. The CLI, the
//! dashboard, the admin sampler and the producer library read batchd's keys through these and nothing else, and
//! one job's ledger through [`crate::LedgerView`].
//!
//! Every function is bounded whatever the backlog: single-key commands, `COUNT`-limited ranges, and `SCAN` pages
//! with a caller-given ceiling. None of them writes but the operator actions at the end (enqueue, dead-letter
//! purge, the pause flag), which are kept apart; dead-letter retry and cancel are Redis functions
//! ([`crate::functions`]).

use std::collections::HashMap;

use batchd_core::keys::CONSUMER_GROUP;
use batchd_core::ledger::field;
use batchd_core::{ChunkRef, JobId, Keys, UnixMillis};
use serde::{Deserialize, Serialize};

use crate::{Conn, StoreError};

/// Redis's clock, Unix ms: the time every age and window shown to people is measured in.
pub async fn redis_now(conn: &mut Conn) -> Result<UnixMillis, StoreError> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// A namespace's queue depths, read in one round trip plus one `XPENDING` summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Depths {
    /// Entries in the submit stream (not yet taken in: unread plus being taken in).
    pub submit_entries: u64,
    /// Of those, entries read by a replica and not yet acknowledged (`XPENDING` of the ingress group).
    pub submit_in_flight: u64,
    /// Steps in the schedule (polls and submit retries): chunks in flight.
    pub scheduled: u64,
    /// Of those, steps whose due time has passed at the `now` given.
    pub due: u64,
    /// Entries in the dead-letter stream.
    pub dead: u64,
    /// Entries in the default results stream.
    pub results: u64,
    /// Id of the first entry of the submit stream (the oldest waiting one), if any.
    pub oldest_entry_id: Option<String>,
    /// Due time (Unix ms) of the first step of the schedule, if any.
    pub earliest_due_ms: Option<u64>,
}

impl Depths {
    /// Entries waiting to be read by a replica.
    pub fn submit_waiting(&self) -> u64 {
        self.submit_entries.saturating_sub(self.submit_in_flight)
    }
}

/// Reads `keys`' depths at `now` (Unix ms, for what is due).
///
/// The oldest entry's id comes from the `XPENDING` summary whenever anything is pending: the group delivers in id
/// order and an entry is deleted when it is acknowledged, so the smallest pending id is the stream's first. Only
/// with nothing pending is the first entry read (`XRANGE - + COUNT 1`), and that returns the whole entry: a
/// 90 MB entry being read by a replica would be read by the admin sampler too, doubling what it costs the daemon
/// (docs/reliability.md, finding f2).
pub async fn depths(conn: &mut Conn, keys: &Keys, now: UnixMillis) -> Result<Depths, StoreError> {
    let submit = keys.submit();
    let schedule = keys.schedule();
    let (submit_entries, scheduled, due, dead, results, first_step): (u64, u64, u64, u64, u64, Vec<(String, f64)>) =
        redis::pipe()
            .cmd("XLEN")
            .arg(&submit)
            .cmd("ZCARD")
            .arg(&schedule)
            .cmd("ZCOUNT")
            .arg(&schedule)
            .arg("-inf")
            .arg(now)
            .cmd("XLEN")
            .arg(keys.dead())
            .cmd("XLEN")
            .arg(keys.results())
            .cmd("ZRANGE")
            .arg(&schedule)
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query_async(conn)
            .await?;
    let (submit_in_flight, oldest_pending) = pending_summary(conn, &submit, CONSUMER_GROUP).await?;
    let oldest_entry_id = match oldest_pending {
        Some(id) => Some(id),
        None if submit_entries > 0 => {
            let first: Vec<(String, redis::Value)> =
                redis::cmd("XRANGE").arg(&submit).arg("-").arg("+").arg("COUNT").arg(1).query_async(conn).await?;
            first.into_iter().next().map(|(id, _)| id)
        }
        None => None,
    };
    Ok(Depths {
        submit_entries,
        submit_in_flight,
        scheduled,
        due,
        dead,
        results,
        oldest_entry_id,
        earliest_due_ms: first_step.first().map(|(_, score)| score.max(0.0) as u64),
    })
}

/// Entries read by `group`'s consumers and not yet acknowledged (0 when the stream or the group does not exist).
pub async fn pending_count(conn: &mut Conn, stream: &str, group: &str) -> Result<u64, StoreError> {
    Ok(pending_summary(conn, stream, group).await?.0)
}

/// [`pending_count`] and the smallest pending entry id, from the `XPENDING` summary (ids only, never an entry).
async fn pending_summary(conn: &mut Conn, stream: &str, group: &str) -> Result<(u64, Option<String>), StoreError> {
    // Summary form: [count, smallest id, greatest id, consumers]; the ids are nil when nothing is pending.
    match redis::cmd("XPENDING").arg(stream).arg(group).query_async(conn).await {
        Ok(redis::Value::Array(items)) => {
            let mut items = items.into_iter();
            let count = items.next().and_then(|count| redis::from_redis_value::<u64>(count).ok()).unwrap_or(0);
            let smallest = items.next().and_then(|id| redis::from_redis_value::<String>(id).ok());
            Ok((count, smallest.filter(|_| count > 0)))
        }
        Ok(_) => Ok((0, None)),
        Err(error) if error.code() == Some("NOGROUP") => Ok((0, None)),
        Err(error) => Err(error.into()),
    }
}

/// The value of the namespace's pause flag (`batchd pause`) as written; `None` while intake runs.
pub async fn pause_flag(conn: &mut Conn, keys: &Keys) -> Result<Option<String>, StoreError> {
    Ok(redis::cmd("GET").arg(keys.paused()).query_async(conn).await?)
}

/// One ledger as a list of jobs shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LedgerRow {
    /// The job id.
    pub job_id: String,
    /// The job's state (as stored).
    pub state: String,
    /// The model.
    pub model: String,
    /// Request items.
    pub n_items: Option<u64>,
    /// Chunks (remote batches).
    pub n_chunks: Option<u64>,
    /// Acceptance time, Unix ms.
    pub accepted_at: Option<u64>,
    /// Last change, Unix ms.
    pub updated_at: Option<u64>,
    /// Finish time, Unix ms.
    pub finished_at: Option<u64>,
}

/// One step of a walk over the ledgers.
#[derive(Debug, Clone, Default)]
pub struct LedgerScan {
    /// The ledgers read in this step (at most `count`, often fewer: `SCAN` gives no guarantee).
    pub rows: Vec<LedgerRow>,
    /// Keys `SCAN` returned (ledgers that vanished meanwhile are counted but have no row).
    pub scanned: usize,
    /// The cursor to continue from; `None` once the walk is complete.
    pub next_cursor: Option<u64>,
}

/// One `SCAN` step over the namespace's ledgers from `cursor` (`COUNT` = `count`), whose ids start with
/// `id_prefix` (a parsed job id, so no glob character reaches `MATCH`), and one pipelined `HMGET` of their
/// summary fields.
pub async fn scan_ledgers(
    conn: &mut Conn,
    keys: &Keys,
    id_prefix: Option<&JobId>,
    cursor: u64,
    count: usize,
) -> Result<LedgerScan, StoreError> {
    let prefix = keys.job_prefix();
    let pattern = format!("{prefix}{}*", id_prefix.map_or("", JobId::as_str));
    let (next, batch): (u64, Vec<String>) =
        redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(count).query_async(conn).await?;
    let columns = [
        field::STATE,
        field::MODEL,
        field::N_ITEMS,
        field::N_CHUNKS,
        field::ACCEPTED_AT,
        field::UPDATED_AT,
        field::FINISHED_AT,
    ];
    let mut rows = Vec::with_capacity(batch.len());
    if !batch.is_empty() {
        let mut pipe = redis::pipe();
        for key in &batch {
            pipe.cmd("HMGET").arg(key).arg(&columns[..]);
        }
        let values: Vec<Vec<Option<String>>> = pipe.query_async(conn).await?;
        for (key, values) in batch.iter().zip(values) {
            let Some(state) = values[0].clone() else { continue };
            let number = |index: usize| values[index].as_deref().and_then(|v| v.parse::<u64>().ok());
            rows.push(LedgerRow {
                job_id: key.strip_prefix(&prefix).unwrap_or(key).to_owned(),
                state,
                model: values[1].clone().unwrap_or_default(),
                n_items: number(2),
                n_chunks: number(3),
                accepted_at: number(4),
                updated_at: number(5),
                finished_at: number(6),
            });
        }
    }
    Ok(LedgerScan { rows, scanned: batch.len(), next_cursor: (next != 0).then_some(next) })
}

/// Chunks of each job a look-up by remote batch id compares ([`find_remote_batch`]).
pub const REMOTE_LOOKUP_CHUNKS: u32 = 16;

/// Where a remote batch id was found: the job (or pack) and the chunk whose batch it is, and how many ledgers were
/// read to find it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteLookup {
    /// The job id and chunk index, when found.
    pub found: Option<(String, u32)>,
    /// Ledgers read (0 when the events index answered).
    pub scanned: usize,
    /// Whether every ledger was read (a miss is then certain for the chunks compared).
    pub complete: bool,
}

/// Finds the job whose chunk has remote batch `request_id`: first through the events index (`{ns}:request:<id>`,
/// written with `[events]` on), then by walking the ledgers with `SCAN` (1,000 keys a step, one pipelined `HMGET`
/// of the first [`REMOTE_LOOKUP_CHUNKS`] chunks' request ids a step) until found or `max_ledgers` were read. A pack's
/// batch is found in the pack's ledger (`pack:<id>`).
pub async fn find_remote_batch(
    conn: &mut Conn,
    keys: &Keys,
    request_id: &str,
    max_ledgers: usize,
) -> Result<RemoteLookup, StoreError> {
    let indexed: Option<String> = redis::cmd("GET").arg(keys.request(request_id)).query_async(conn).await?;
    if let Some((job_id, chunk)) = indexed.as_deref().and_then(|member| member.rsplit_once('#'))
        && let Ok(chunk) = chunk.parse::<u32>()
    {
        return Ok(RemoteLookup { found: Some((job_id.to_owned(), chunk)), scanned: 0, complete: false });
    }
    let prefix = keys.job_prefix();
    let fields = crate::ledger_view::request_id_fields(REMOTE_LOOKUP_CHUNKS);
    let mut lookup = RemoteLookup::default();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        if !batch.is_empty() {
            let mut pipe = redis::pipe();
            for key in &batch {
                pipe.cmd("HMGET").arg(key).arg(&fields[..]);
            }
            let values: Vec<Vec<Option<String>>> = pipe.query_async(conn).await?;
            lookup.scanned += batch.len();
            for (key, ids) in batch.iter().zip(values) {
                if let Some(chunk) = ids.iter().position(|id| id.as_deref() == Some(request_id)) {
                    let job_id = key.strip_prefix(&prefix).unwrap_or(key).to_owned();
                    lookup.found = Some((job_id, chunk as u32));
                    return Ok(lookup);
                }
            }
        }
        cursor = next;
        if cursor == 0 {
            lookup.complete = true;
            return Ok(lookup);
        }
        if lookup.scanned >= max_ledgers {
            return Ok(lookup);
        }
    }
}

/// The chunk states behind the first `sample` schedule members (the soonest due), and the schedule's size.
/// A member whose ledger has no such chunk reads as `None`.
pub async fn scheduled_chunk_states(
    conn: &mut Conn,
    keys: &Keys,
    sample: usize,
) -> Result<(Vec<Option<String>>, u64), StoreError> {
    let (members, total): (Vec<String>, u64) = redis::pipe()
        .cmd("ZRANGE")
        .arg(keys.schedule())
        .arg(0)
        .arg(sample.saturating_sub(1))
        .cmd("ZCARD")
        .arg(keys.schedule())
        .query_async(conn)
        .await?;
    let chunks: Vec<ChunkRef> = members.iter().filter_map(|member| ChunkRef::parse(member).ok()).collect();
    if chunks.is_empty() {
        return Ok((Vec::new(), total));
    }
    Ok((crate::ledger_view::chunk_states(conn, keys, &chunks).await?, total))
}

/// One unfinished remote batch from [`oldest_remote_batches`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteBatch {
    /// The job's model (`None` when the ledger has none).
    pub model: Option<String>,
    /// When the batch was submitted (Unix ms, Redis's clock).
    pub submitted_at: UnixMillis,
}

/// The longest a model name read back from a ledger is trusted to be; a longer one is cut (it only labels a gauge).
const MAX_LABEL_BYTES: usize = 200;

/// The oldest unfinished remote batches of `keys`' namespace, oldest first: the first `window` members of
/// [`Keys::remote_batches`], each checked against its ledger (one pipelined `HMGET` of three fields per member).
/// A member whose job has ended or whose chunk is done or failed (left by a job that was cancelled or expired
/// while its batch ran, or by a ledger that expired) is removed from the index and not returned; so is one that is
/// not a chunk reference. Bounded: two commands plus one per member read, whatever the index holds.
pub async fn oldest_remote_batches(
    conn: &mut Conn,
    keys: &Keys,
    window: usize,
) -> Result<Vec<RemoteBatch>, StoreError> {
    let index = keys.remote_batches();
    let members: Vec<(String, f64)> =
        redis::cmd("ZRANGE").arg(&index).arg(0).arg(window.max(1) - 1).arg("WITHSCORES").query_async(conn).await?;
    let mut chunks = Vec::with_capacity(members.len());
    let mut left_behind: Vec<&str> = Vec::new();
    for (member, score) in &members {
        match ChunkRef::parse(member) {
            Ok(chunk) => chunks.push((member.as_str(), score.max(0.0) as UnixMillis, chunk)),
            Err(_) => left_behind.push(member),
        }
    }
    let refs: Vec<ChunkRef> = chunks.iter().map(|(_, _, chunk)| chunk.clone()).collect();
    let states = crate::ledger_view::job_and_chunk_states(conn, keys, &refs).await?;
    let mut batches = Vec::with_capacity(chunks.len());
    for ((member, submitted_at, _), (job_state, model, chunk_state)) in chunks.into_iter().zip(states) {
        let job_over = job_state
            .as_deref()
            .is_none_or(|state| state.parse::<batchd_core::ledger::JobState>().is_ok_and(|state| state.is_terminal()));
        let chunk_over = chunk_state.as_deref().is_some_and(|state| {
            state.parse::<batchd_core::ledger::ChunkState>().is_ok_and(|state| state.is_finished())
        });
        if job_over || chunk_over {
            left_behind.push(member);
        } else {
            let model = model.map(|mut model| {
                let mut end = model.len().min(MAX_LABEL_BYTES);
                while !model.is_char_boundary(end) {
                    end -= 1;
                }
                model.truncate(end);
                model
            });
            batches.push(RemoteBatch { model, submitted_at });
        }
    }
    if !left_behind.is_empty() {
        let _: u64 = redis::cmd("ZREM").arg(&index).arg(&left_behind).query_async(conn).await?;
    }
    Ok(batches)
}

/// The finished-jobs counter hashes named by `keys` (built with [`Keys::stats_minute`] or [`Keys::stats_hour`]),
/// in order, in one round trip; a missing hash reads as empty.
pub async fn counters(
    conn: &mut Conn,
    keys: impl IntoIterator<Item = String>,
) -> Result<Vec<HashMap<String, u64>>, StoreError> {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.hgetall(key);
    }
    Ok(pipe.query_async(conn).await?)
}

/// The finished-jobs counters of hours `first..=last` (as in [`Keys::stats_hour`]), one map per hour, in order, as
/// exact as the minutes': an hour's hash holds the minutes already rolled up into it (`Store::roll_up_counters`),
/// and the minutes after the roll-up's cursor (at most the two hours the minute hashes live) are added from their
/// own hashes. Two round trips: the cursor, then one pipelined `HGETALL` per hash.
pub async fn hour_counters(
    conn: &mut Conn,
    keys: &Keys,
    first: u64,
    last: u64,
    now_ms: u64,
) -> Result<Vec<HashMap<String, u64>>, StoreError> {
    let cursor: Option<String> = redis::cmd("GET").arg(keys.stats_rolled()).query_async(conn).await?;
    let now_minute = now_ms / 60_000;
    // Minutes not in any hour's hash yet: after the cursor, and no older than the minute hashes live.
    // Without a cursor nothing was rolled up by this version: the hours' hashes are all there is.
    let minutes: Vec<u64> = match cursor.and_then(|cursor| cursor.parse::<u64>().ok()) {
        Some(cursor) => ((cursor + 1).max(now_minute.saturating_sub(120))..=now_minute)
            .filter(|minute| (first..=last).contains(&(minute / 60)))
            .collect(),
        None => Vec::new(),
    };
    let hours: Vec<u64> = (first..=last).collect();
    let hashes = counters(
        conn,
        hours.iter().map(|hour| keys.stats_hour(*hour)).chain(minutes.iter().map(|m| keys.stats_minute(*m))),
    )
    .await?;
    let (mut by_hour, rest) = {
        let mut hashes = hashes;
        let rest = hashes.split_off(hours.len());
        (hashes, rest)
    };
    for (minute, hash) in minutes.iter().zip(rest) {
        let hour = &mut by_hour[(minute / 60 - first) as usize];
        for (name, n) in hash {
            *hour.entry(name).or_default() += n;
        }
    }
    Ok(by_hour)
}

/// Stream entries as field maps.
pub type Entries<V> = Vec<(String, HashMap<String, V>)>;

/// Up to `count` entries of `stream` from `from` to `to` (`XRANGE`), or from `to` down to `from` when `newest_first`
/// (`XREVRANGE`). Ids take `-`, `+` and the exclusive `(` form.
pub async fn entries<V: redis::FromRedisValue>(
    conn: &mut Conn,
    stream: &str,
    from: &str,
    to: &str,
    count: usize,
    newest_first: bool,
) -> Result<Entries<V>, StoreError> {
    let (command, first, second) = if newest_first { ("XREVRANGE", to, from) } else { ("XRANGE", from, to) };
    Ok(redis::cmd(command).arg(stream).arg(first).arg(second).arg("COUNT").arg(count).query_async(conn).await?)
}

/// The length of a stream (0 when it does not exist).
pub async fn stream_len(conn: &mut Conn, stream: &str) -> Result<u64, StoreError> {
    Ok(redis::cmd("XLEN").arg(stream).query_async(conn).await?)
}

/// A consumer group of a stream, as `XINFO GROUPS` reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupInfo {
    /// The group's name.
    pub name: Option<String>,
    /// Its consumers.
    pub consumers: Option<u64>,
    /// Entries delivered and not acknowledged.
    pub pending: Option<u64>,
    /// Entries not delivered yet (Redis 7).
    pub lag: Option<u64>,
}

/// The consumer groups of `stream` (empty when the stream does not exist).
pub async fn groups(conn: &mut Conn, stream: &str) -> Result<Vec<GroupInfo>, StoreError> {
    let replies: Vec<HashMap<String, redis::Value>> =
        match redis::cmd("XINFO").arg("GROUPS").arg(stream).query_async(conn).await {
            Ok(replies) => replies,
            Err(error) if error.to_string().contains("no such key") => Vec::new(),
            Err(error) => return Err(error.into()),
        };
    Ok(replies
        .iter()
        .map(|reply| GroupInfo {
            name: text(reply, "name"),
            consumers: number(reply, "consumers").map(|n| n.max(0) as u64),
            pending: number(reply, "pending").map(|n| n.max(0) as u64),
            lag: number(reply, "lag").map(|n| n.max(0) as u64),
        })
        .collect())
}

/// One consumer of the ingress group (one per replica start).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Consumer {
    /// Its name (the replica's, per process start).
    pub name: String,
    /// Entries it read and has not taken in yet.
    pub pending: u64,
    /// Milliseconds since its last read (attempt, on Redis 7.2+).
    pub idle_ms: u64,
    /// Milliseconds since its last successful read (Redis 7.2+ only); `None` when it never read one.
    pub inactive_ms: Option<i64>,
}

/// The ingress group's consumers, the least idle first (empty when the group does not exist).
pub async fn ingress_consumers(conn: &mut Conn, keys: &Keys) -> Result<Vec<Consumer>, StoreError> {
    let replies: Vec<HashMap<String, redis::Value>> =
        match redis::cmd("XINFO").arg("CONSUMERS").arg(keys.submit()).arg(CONSUMER_GROUP).query_async(conn).await {
            Ok(replies) => replies,
            Err(error) if error.code() == Some("NOGROUP") || error.to_string().contains("no such key") => Vec::new(),
            Err(error) => return Err(error.into()),
        };
    let mut consumers: Vec<Consumer> = replies
        .iter()
        .map(|reply| Consumer {
            name: text(reply, "name").unwrap_or_default(),
            pending: number(reply, "pending").unwrap_or(0).max(0) as u64,
            idle_ms: number(reply, "idle").unwrap_or(0).max(0) as u64,
            inactive_ms: number(reply, "inactive").filter(|ms| *ms >= 0),
        })
        .collect();
    consumers.sort_by(|a, b| a.idle_ms.cmp(&b.idle_ms).then_with(|| a.name.cmp(&b.name)));
    Ok(consumers)
}

fn text(reply: &HashMap<String, redis::Value>, name: &str) -> Option<String> {
    reply.get(name).and_then(|value| redis::from_redis_value::<String>(value.clone()).ok())
}

fn number(reply: &HashMap<String, redis::Value>, name: &str) -> Option<i64> {
    reply.get(name).and_then(|value| redis::from_redis_value::<i64>(value.clone()).ok())
}

/// Enqueues one job the way every producer does: one `XADD` of its `job` field to the submit stream. Returns the
/// entry id (the job's id when the job names none).
pub async fn enqueue(conn: &mut Conn, keys: &Keys, job: &[u8]) -> Result<String, StoreError> {
    Ok(redis::cmd("XADD")
        .arg(keys.submit())
        .arg("*")
        .arg(batchd_core::job::JOB_FIELD)
        .arg(job)
        .query_async(conn)
        .await?)
}

/// Enqueues several jobs in one pipeline, in order; returns their entry ids.
pub async fn enqueue_many(conn: &mut Conn, keys: &Keys, jobs: &[&[u8]]) -> Result<Vec<String>, StoreError> {
    let mut pipe = redis::pipe();
    for job in jobs {
        pipe.cmd("XADD").arg(keys.submit()).arg("*").arg(batchd_core::job::JOB_FIELD).arg(*job);
    }
    Ok(pipe.query_async(conn).await?)
}

/// Whether job `id` has a ledger (it was taken in and its ledger has not expired).
pub async fn job_exists(conn: &mut Conn, keys: &Keys, id: &JobId) -> Result<bool, StoreError> {
    let n: u64 = redis::cmd("EXISTS").arg(keys.job(id)).query_async(conn).await?;
    Ok(n == 1)
}

/// The reason of a pending cancellation request of job `id` (`{ns}:cancel:<id>`), if there is one.
pub async fn cancel_request(conn: &mut Conn, keys: &Keys, id: &JobId) -> Result<Option<String>, StoreError> {
    Ok(redis::cmd("GET").arg(keys.cancel(id)).query_async(conn).await?)
}

/// Withdraws a pending cancellation request of job `id` (`GETDEL` of its flag); returns the reason it had.
pub async fn withdraw_cancel(conn: &mut Conn, keys: &Keys, id: &JobId) -> Result<Option<String>, StoreError> {
    Ok(redis::cmd("GETDEL").arg(keys.cancel(id)).query_async(conn).await?)
}

/// Deletes dead-letter entries; returns how many existed.
pub async fn delete_dead_letters(conn: &mut Conn, keys: &Keys, entry_ids: &[String]) -> Result<u64, StoreError> {
    Ok(redis::cmd("XDEL").arg(keys.dead()).arg(entry_ids).query_async(conn).await?)
}

/// Deletes the whole dead-letter stream, in one `MULTI`/`EXEC` with its length; returns how many entries it held.
pub async fn purge_dead_letters(conn: &mut Conn, keys: &Keys) -> Result<u64, StoreError> {
    let (n, _): (u64, u64) = redis::pipe().atomic().xlen(keys.dead()).del(keys.dead()).query_async(conn).await?;
    Ok(n)
}

/// Sets the pause flag to `value` unless it is set already (the first pause is kept); returns whether it was set.
pub async fn set_pause_flag(conn: &mut Conn, keys: &Keys, value: &str) -> Result<bool, StoreError> {
    let set: Option<String> = redis::cmd("SET").arg(keys.paused()).arg(value).arg("NX").query_async(conn).await?;
    Ok(set.is_some())
}

/// Deletes the pause flag (`GETDEL`); returns the value it had.
pub async fn clear_pause_flag(conn: &mut Conn, keys: &Keys) -> Result<Option<String>, StoreError> {
    Ok(redis::cmd("GETDEL").arg(keys.paused()).query_async(conn).await?)
}

/// What a waiting job's chunks and packing key are due at (`batchd status`): the scores of `chunks` (chunk indices
/// of `job_id`) in the job's schedule and, with `pack_key`, of that packing key in `{ns}:packers`; one pipelined
/// round trip of `ZSCORE`s, none when there is nothing to ask. Unix ms; `None` for a member not scheduled.
pub async fn due_times(
    conn: &mut Conn,
    keys: &Keys,
    job_id: &JobId,
    chunks: &[usize],
    pack_key: Option<&str>,
) -> Result<(Vec<Option<UnixMillis>>, Option<UnixMillis>), StoreError> {
    if chunks.is_empty() && pack_key.is_none() {
        return Ok((Vec::new(), None));
    }
    let schedule = keys.schedule_of(job_id);
    let mut pipe = redis::pipe();
    for index in chunks {
        pipe.cmd("ZSCORE").arg(&schedule).arg(ChunkRef::new(job_id.clone(), *index as u32).to_string());
    }
    if let Some(pack_key) = pack_key {
        pipe.cmd("ZSCORE").arg(keys.packers()).arg(pack_key);
    }
    let scores: Vec<Option<f64>> = pipe.query_async(conn).await?;
    let mut scores = scores.into_iter().map(|score| score.map(|due| due.max(0.0) as UnixMillis));
    let due: Vec<Option<UnixMillis>> = chunks.iter().map(|_| scores.next().flatten()).collect();
    let pack_due = if pack_key.is_some() { scores.next().flatten() } else { None };
    Ok((due, pack_due))
}
