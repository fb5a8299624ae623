//! What the dashboard's pages show, read from Redis as JSON: the same reports the CLI prints with `--json`
//! (`stats`, `workers`, `jobs`, `status`, `dead list|show`), plus what only the dashboard needs (chunk states of
//! the work in flight, finished jobs per minute and tokens from the stats counters, a job's result entry).
//!
//! Every read is bounded whatever the backlog: the overview reads a fixed number of keys (the counters of the
//! last 60 minutes and 24 hours, at most [`CHUNK_SAMPLE`] schedule members), the jobs list pages with a `SCAN`
//! cursor ([`JOBS_PAGE_SCAN`] ledgers a page at most), a job's ledger is read without its payloads, and a job's
//! responses are shown [`RESPONSES_PAGE`] at a time from one read of its result entry.

use std::collections::{BTreeMap, HashMap};

use anyhow::Context as _;
use batchd_core::ledger::field;
use batchd_core::stats::StatField;
use batchd_core::{JobId, Keys, ResultStatus};
use batchd_queue::Conn;
use batchd_queue::inspect;
use serde_json::{Value, json};

use crate::cli::inspect::{JobFilter, JobsPage};
use crate::cli::{self, dead, workers};

/// Most schedule members whose chunk state the overview reads (the soonest due first).
pub const CHUNK_SAMPLE: usize = 1_000;

/// Most ledgers one jobs page reads.
pub const JOBS_PAGE_SCAN: usize = 5_000;

/// Jobs shown per page.
pub const JOBS_PAGE_SIZE: usize = 50;

/// Responses of a job's result shown per page.
pub const RESPONSES_PAGE: usize = 50;

/// Dead-letter entries listed.
pub const DEAD_LIST_LIMIT: usize = 200;

/// The statuses a result entry can have, in the order the overview shows them.
pub const STATUSES: [&str; 4] = {
    let [a, b, c, d] = ResultStatus::ALL;
    [a.as_str(), b.as_str(), c.as_str(), d.as_str()]
};

/// One namespace's overview: `stats --json`, `workers --json`, the chunk states of the work in flight (sampled),
/// finished jobs per minute over the last hour by status, and tokens by model over the last hour and day.
pub async fn overview(conn: &mut Conn, keys: &Keys, now: u64) -> anyhow::Result<Value> {
    let stats = crate::cli::inspect::stats_report(conn, keys, now).await?;
    let workers = workers::report(conn, keys).await?;
    let chunks = chunk_states(conn, keys).await?;
    let (per_minute, tokens_hour) = minutes(conn, keys, now).await?;
    let tokens_day = hours(conn, keys, now).await?;
    Ok(json!({
        "namespace": keys.namespace(),
        "at": now,
        "stats": stats,
        "workers": workers,
        "chunks": chunks,
        "finished_per_minute": per_minute,
        "tokens": {"last_hour": tokens_hour, "last_day": tokens_day},
    }))
}

/// The states of the chunks behind the first [`CHUNK_SAMPLE`] schedule members (the soonest due):
/// `{"sampled":N,"of":M,"by_state":{"polling":..,..}}`; `of` is the schedule's size.
async fn chunk_states(conn: &mut Conn, keys: &Keys) -> anyhow::Result<Value> {
    let (states, total) =
        inspect::scheduled_chunk_states(conn, keys, CHUNK_SAMPLE).await.context("read chunk states")?;
    let mut by_state: BTreeMap<String, u64> = BTreeMap::new();
    for state in &states {
        *by_state.entry(state.clone().unwrap_or_else(|| "unknown".to_owned())).or_default() += 1;
    }
    Ok(json!({"sampled": states.len(), "of": total, "by_state": by_state}))
}

/// Tokens by model and kind, summed over counters.
type Tokens = BTreeMap<String, BTreeMap<String, u64>>;

/// Adds one counter hash to the per-status counts and the token sums.
fn add_counters(hash: &HashMap<String, u64>, statuses: &mut BTreeMap<String, u64>, tokens: &mut Tokens) {
    for (name, n) in hash {
        match StatField::parse(name) {
            Some(StatField::Finished(status)) => *statuses.entry(status.to_owned()).or_default() += n,
            Some(StatField::Tokens { kind, model }) => {
                *tokens.entry(model.to_owned()).or_default().entry(kind.to_owned()).or_default() += n;
            }
            None => {}
        }
    }
}

/// The last 60 minutes' counters (the current minute last): one `{"minute":<Unix ms>,"<status>":n,..}` each, and
/// the hour's tokens.
async fn minutes(conn: &mut Conn, keys: &Keys, now: u64) -> anyhow::Result<(Vec<Value>, Tokens)> {
    let current = now / 60_000;
    let first = current.saturating_sub(59);
    let hashes = inspect::counters(conn, (first..=current).map(|minute| keys.stats_minute(minute)))
        .await
        .context("read the minute counters")?;
    let mut tokens = Tokens::new();
    let mut per_minute = Vec::with_capacity(hashes.len());
    for (minute, hash) in (first..=current).zip(&hashes) {
        let mut statuses: BTreeMap<String, u64> = STATUSES.iter().map(|s| ((*s).to_owned(), 0)).collect();
        add_counters(hash, &mut statuses, &mut tokens);
        let mut row = json!({"minute": minute * 60_000});
        for (status, n) in statuses {
            row[status] = n.into();
        }
        per_minute.push(row);
    }
    Ok((per_minute, tokens))
}

/// Tokens of the last 24 hours (the current hour included).
async fn hours(conn: &mut Conn, keys: &Keys, now: u64) -> anyhow::Result<Tokens> {
    let current = now / 3_600_000;
    let hours = (current.saturating_sub(23)..=current).map(|hour| keys.stats_hour(hour));
    let hashes = inspect::counters(conn, hours).await.context("read the hour counters")?;
    let mut tokens = Tokens::new();
    for hash in &hashes {
        add_counters(hash, &mut BTreeMap::new(), &mut tokens);
    }
    Ok(tokens)
}

/// One page of jobs, as `batchd jobs --json` shapes it (with `next_cursor` while the walk goes on).
pub async fn jobs(conn: &mut Conn, keys: &Keys, filter: &JobFilter, cursor: u64) -> anyhow::Result<JobsPage> {
    crate::cli::inspect::jobs_page(conn, keys, filter, cursor, JOBS_PAGE_SIZE, JOBS_PAGE_SCAN).await
}

/// A job for its page: `{"job": <status --json>, "result": <the result entry, responses paged> | null,
/// "responses_page": {"page":..,"pages":..,"total":..}}`. The ledger is read without its payloads
/// ([`batchd_queue::LedgerView`]); the result entry is read from Redis once per process and paged from memory
/// ([`ResultCache`]), so 40 open tabs of one big job cost Redis one read of it, not 40.
pub async fn job(conn: &mut Conn, keys: &Keys, job_id: &JobId, page: usize) -> anyhow::Result<Value> {
    let view = cli::read_ledger(conn, keys, job_id).await?;
    let status = cli::status_json(&view);
    let mut result = Value::Null;
    let mut paging = json!({"page": 0, "pages": 0, "total": 0});
    let entry_id = view.get(field::RESULT_ENTRY);
    let stream = view.get(field::REPLY_TO).filter(|stream| keys.is_results_stream(stream));
    if let (Some(entry_id), Some(stream)) = (entry_id, stream) {
        match result_entry(conn, stream, entry_id).await? {
            Some(entry) => {
                result = entry.head.clone();
                result["entry_id"] = entry_id.into();
                if let Some(responses) = &entry.responses {
                    let total = responses.len();
                    let pages = total.div_ceil(RESPONSES_PAGE);
                    let page = page.min(pages.saturating_sub(1));
                    let start = page * RESPONSES_PAGE;
                    let shown: Vec<Value> = responses.iter().skip(start).take(RESPONSES_PAGE).cloned().collect();
                    if let Some(output) = result.get_mut("result").and_then(Value::as_object_mut) {
                        output.insert("responses".into(), shown.into());
                    }
                    paging = json!({"page": page, "pages": pages, "total": total, "first_index": start});
                }
            }
            None => result = json!({"entry_id": entry_id, "trimmed": true}),
        }
    }
    Ok(json!({"job": status, "result": result, "responses_page": paging}))
}

/// A result entry as the job page shows it: its fields as `result --json` shapes them, with the responses kept
/// apart so a page of them is cut without copying the rest.
#[derive(Debug)]
struct CachedEntry {
    /// The entry without `result.responses`.
    head: Value,
    /// `result.responses`, when the entry has a result.
    responses: Option<Vec<Value>>,
}

/// Result entries last shown, by `(stream, entry id)`: an entry never changes once written, so it is read from Redis
/// once and every page of it, in every tab, comes from here. Holding the lock while reading makes concurrent
/// requests of one entry wait for the one read instead of each copying the entry out of Redis.
#[derive(Debug, Default)]
struct ResultCache {
    /// The entries, the most recently used last (at most [`RESULT_CACHE_ENTRIES`]).
    entries: Vec<((String, String), std::sync::Arc<CachedEntry>)>,
}

/// Result entries kept by [`ResultCache`].
const RESULT_CACHE_ENTRIES: usize = 4;

static RESULT_CACHE: std::sync::LazyLock<tokio::sync::Mutex<ResultCache>> =
    std::sync::LazyLock::new(|| tokio::sync::Mutex::new(ResultCache::default()));

/// Result entry `entry_id` of `stream`, from the cache or read once; `None` when it was trimmed.
async fn result_entry(
    conn: &mut Conn,
    stream: &str,
    entry_id: &str,
) -> anyhow::Result<Option<std::sync::Arc<CachedEntry>>> {
    let mut cache = RESULT_CACHE.lock().await;
    let key = (stream.to_owned(), entry_id.to_owned());
    if let Some(at) = cache.entries.iter().position(|(cached, _)| *cached == key) {
        let hit = cache.entries.remove(at);
        let entry = std::sync::Arc::clone(&hit.1);
        cache.entries.push(hit);
        return Ok(Some(entry));
    }
    let entries: inspect::Entries<String> = inspect::entries(conn, stream, entry_id, entry_id, 1, false)
        .await
        .with_context(|| format!("read result entry {entry_id}"))?;
    let Some((_, fields)) = entries.into_iter().next() else { return Ok(None) };
    let mut head = cli::result_json(&fields);
    drop(fields);
    let responses = head.pointer_mut("/result/responses").and_then(Value::as_array_mut).map(std::mem::take);
    let entry = std::sync::Arc::new(CachedEntry { head, responses });
    if cache.entries.len() >= RESULT_CACHE_ENTRIES {
        cache.entries.remove(0);
    }
    cache.entries.push((key, std::sync::Arc::clone(&entry)));
    Ok(Some(entry))
}

/// Dead-letter entries, newest first, as `batchd dead list --json` shapes them, with the stream's length.
pub async fn dead_list(conn: &mut Conn, keys: &Keys) -> anyhow::Result<Value> {
    let entries = dead::list_json(conn, keys, DEAD_LIST_LIMIT).await?;
    let total = inspect::stream_len(conn, &keys.dead()).await.context("count dead letters")?;
    Ok(json!({"namespace": keys.namespace(), "total": total, "entries": entries}))
}

/// One dead-letter entry, as `batchd dead show --json` shapes it.
pub async fn dead_entry(conn: &mut Conn, keys: &Keys, entry_id: &str) -> anyhow::Result<Value> {
    dead::show_json(conn, keys, entry_id).await
}
