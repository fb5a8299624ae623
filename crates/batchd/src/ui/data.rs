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
use batchd_core::stats::Totals;
use batchd_core::{JobId, Keys, ResultStatus};
use batchd_queue::Conn;
use batchd_queue::failed::{FailedJob, FailedQuery};
use batchd_queue::inspect;
use batchd_queue::rerun::Rerun;
use serde_json::value::RawValue;
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

/// How far back the overview's chart of finished jobs reaches, and in what buckets: the last hour by minute (the
/// per-minute counters, kept two hours), the last day or the last eight days by hour (the hourly counters, kept
/// eight days).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Range {
    /// 60 minutes, one bar a minute.
    #[default]
    Hour,
    /// 24 hours, one bar an hour.
    Day,
    /// 8 days, one bar an hour.
    EightDays,
}

impl Range {
    /// Every range, in the order the switch shows them.
    pub const ALL: [Self; 3] = [Self::Hour, Self::Day, Self::EightDays];

    /// Its name in the URL (`?range=`) and on the switch.
    pub fn code(self) -> &'static str {
        match self {
            Self::Hour => "1h",
            Self::Day => "24h",
            Self::EightDays => "8d",
        }
    }

    /// The range a `?range=` value names; the last hour for anything else.
    pub fn parse(code: Option<&str>) -> Self {
        Self::ALL.into_iter().find(|range| Some(range.code()) == code).unwrap_or_default()
    }

    /// The length of one bucket, ms.
    pub fn bucket_ms(self) -> u64 {
        match self {
            Self::Hour => MINUTE_MS,
            Self::Day | Self::EightDays => HOUR_MS,
        }
    }

    /// How many buckets it shows.
    pub fn buckets(self) -> usize {
        match self {
            Self::Hour => 60,
            Self::Day => 24,
            // As far back as the hourly counters are kept (eight days).
            Self::EightDays => (batchd_core::keys::STATS_HOUR_TTL_SECS * 1000 / HOUR_MS) as usize,
        }
    }
}

/// A minute and an hour, ms: the counters' buckets.
const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 3_600_000;

/// One namespace's overview: `stats --json`, `workers --json`, the chunk states of the work in flight (sampled),
/// finished jobs by status over `range` (per minute or per hour), and tokens by model over the last hour and day.
pub async fn overview(conn: &mut Conn, keys: &Keys, now: u64, range: Range) -> anyhow::Result<Value> {
    let stats = crate::cli::inspect::stats_report(conn, keys, now).await?;
    let workers = workers::report(conn, keys).await?;
    let chunks = chunk_states(conn, keys).await?;
    let minutes = counters(conn, now, MINUTE_MS, 60, |minute| keys.stats_minute(minute)).await?;
    // The day's tokens need the last 24 hours; eight days of bars, 192.
    let n_hours = if range == Range::EightDays { range.buckets() } else { 24 };
    let current = now / HOUR_MS;
    let first = current.saturating_sub(n_hours as u64 - 1);
    let hashes = inspect::hour_counters(conn, keys, first, current, now).await.context("read the hourly counters")?;
    let hours: Vec<Bucket> = (first..=current).map(|hour| hour * HOUR_MS).zip(hashes).collect();
    let shown = if range == Range::Hour { &minutes[..] } else { &hours[hours.len() - range.buckets()..] };
    Ok(json!({
        "namespace": keys.namespace(),
        "at": now,
        "stats": stats,
        "workers": workers,
        "chunks": chunks,
        "finished": {"range": range.code(), "bucket_ms": range.bucket_ms(), "buckets": finished(shown)},
        "tokens": {"last_hour": tokens(&minutes), "last_day": tokens(&hours[hours.len() - 24..])},
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

/// One bucket's counters: its start (Unix ms) and its hash.
type Bucket = (u64, HashMap<String, u64>);

/// The counter hashes of the `n` buckets of `bucket_ms` up to the one holding `now` (the current one last), in one
/// round trip; `key` names a bucket's hash from its number (Unix ms / `bucket_ms`).
async fn counters(
    conn: &mut Conn,
    now: u64,
    bucket_ms: u64,
    n: usize,
    key: impl Fn(u64) -> String,
) -> anyhow::Result<Vec<Bucket>> {
    let current = now / bucket_ms;
    let numbers = current.saturating_sub(n as u64 - 1)..=current;
    let hashes = inspect::counters(conn, numbers.clone().map(key)).await.context("read the finished-jobs counters")?;
    Ok(numbers.map(|number| number * bucket_ms).zip(hashes).collect())
}

/// Finished jobs by status, one `{"at":<Unix ms>,"<status>":n,..}` per bucket (every status, 0 when none).
fn finished(buckets: &[Bucket]) -> Vec<Value> {
    buckets
        .iter()
        .map(|(at, hash)| {
            let mut row = json!({"at": at});
            for status in STATUSES {
                row[status] = 0.into();
            }
            for (status, n) in Totals::of([hash]).finished {
                row[status] = n.into();
            }
            row
        })
        .collect()
}

/// Tokens by model and kind, summed over `buckets`.
fn tokens(buckets: &[Bucket]) -> Tokens {
    Totals::of(buckets.iter().map(|(_, hash)| hash)).tokens
}

/// One page of jobs, as `batchd jobs --json` shapes it (with `next_cursor` while the walk goes on).
pub async fn jobs(conn: &mut Conn, keys: &Keys, filter: &JobFilter, cursor: u64) -> anyhow::Result<JobsPage> {
    crate::cli::inspect::jobs_page(conn, keys, filter, cursor, JOBS_PAGE_SIZE, JOBS_PAGE_SCAN).await
}

/// A job for its page: `{"job": <status --json, with its `at_remote`: each chunk still at the remote API against
/// its model's usual time>, "chunks": [{"index":..,"state":..,"remote":..}], "result": <the result entry, responses
/// paged> | null, "responses_page": {"page":..,"pages":..,"total":..}}`. The ledger is read
/// without its payloads ([`batchd_queue::LedgerView`]); `chunks` says what each chunk's state and remote status
/// mean now ([`batchd_queue::ledger_view::ChunkStatus`]); the result entry is read from Redis once per process and
/// paged from memory ([`ResultCache`]), so 40 open tabs of one big job cost Redis one read of it, not 40. The request
/// items are a page of their own ([`job_items`]): the job's page reads none.
pub async fn job(conn: &mut Conn, keys: &Keys, job_id: &JobId, page: usize) -> anyhow::Result<Value> {
    let view = cli::read_ledger(conn, keys, job_id).await?;
    let mut status = cli::status_json(&view);
    let job_state = view.state();
    let chunks: Vec<Value> = view
        .chunks
        .iter()
        .enumerate()
        .map(|(index, chunk)| {
            let status = chunk.status(job_state);
            json!({"index": index, "state": status.state, "remote": status.remote})
        })
        .collect();
    // Only a job with a batch at the remote API reads the usual times (two bounded round trips).
    let at_remote = if batchd_queue::turnaround::any_at_remote(&view) {
        let now = cli::now_ms();
        let usuals = batchd_queue::turnaround::usuals(conn, keys, now).await.context("read the usual batch times")?;
        batchd_queue::turnaround::at_remote(&view, &usuals, now)
    } else {
        Vec::new()
    };
    status["at_remote"] = serde_json::to_value(&at_remote).context("encode the batches at the remote API")?;
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
                    let (page, pages, start) = page_of(responses.len(), page, RESPONSES_PAGE);
                    let shown: Vec<Value> = responses.iter().skip(start).take(RESPONSES_PAGE).cloned().collect();
                    if let Some(output) = result.get_mut("result").and_then(Value::as_object_mut) {
                        output.insert("responses".into(), shown.into());
                    }
                    paging = json!({"page": page, "pages": pages, "total": responses.len(), "first_index": start});
                }
            }
            None => result = json!({"entry_id": entry_id, "trimmed": true}),
        }
    }
    Ok(json!({"job": status, "chunks": chunks, "result": result, "responses_page": paging}))
}

/// Page `page` of `total` things shown `per_page` at a time, clamped to the last page: `(page, pages, first)`.
fn page_of(total: usize, page: usize, per_page: usize) -> (usize, usize, usize) {
    let pages = total.div_ceil(per_page);
    let page = page.min(pages.saturating_sub(1));
    (page, pages, page * per_page)
}

/// Request items shown per page.
pub const ITEMS_PAGE: usize = 50;

/// Page `page` of chunk `chunk`'s request items of job `job_id`, each with its index in the job: `{"job_id":..,
/// "state":..,"chunk":..,"chunks":..,"stored":bool,"page":..,"pages":..,"total":..,"items":[{"index":..,
/// "item":..}]}`. Read with the bounded reader, only when asked for and one chunk per view
/// ([`batchd_queue::ledger_view::chunk_requests`]): what one view copies out of Redis is one chunk's items, which
/// the daemon's chunking keeps under the provider's payload limit. A completed job's items are gone (`stored:
/// false`): its ledger keeps only its timeline.
pub async fn job_items(
    conn: &mut Conn,
    keys: &Keys,
    job_id: &JobId,
    chunk: usize,
    page: usize,
) -> anyhow::Result<Value> {
    let view = cli::read_ledger(conn, keys, job_id).await?;
    let items = request_items(conn, keys, &view, chunk, page).await?;
    Ok(json!({"job_id": job_id.as_str(), "state": view.get(field::STATE), "requests": items}))
}

/// [`job_items`]' `requests`.
async fn request_items(
    conn: &mut Conn,
    keys: &Keys,
    view: &batchd_queue::LedgerView,
    chunk: usize,
    page: usize,
) -> anyhow::Result<Value> {
    let n_chunks = view.chunks.len();
    let chunk = chunk.min(n_chunks.saturating_sub(1));
    let missing = json!({"chunk": chunk, "chunks": n_chunks, "stored": false, "items": []});
    let Some(placement) = view.chunks.get(chunk).and_then(|metadata| metadata.placement()) else {
        return Ok(missing);
    };
    let stored = batchd_queue::ledger_view::chunk_requests(conn, keys, &view.job_id, chunk as u32)
        .await
        .with_context(|| format!("read the request items of chunk {chunk}"))?;
    let Some(items) = stored.and_then(|text| serde_json::from_str::<Vec<Box<RawValue>>>(&text).ok()) else {
        return Ok(missing);
    };
    let (page, pages, first) = page_of(items.len(), page, ITEMS_PAGE);
    let shown: Vec<Value> = items
        .iter()
        .enumerate()
        .skip(first)
        .take(ITEMS_PAGE)
        .map(|(local, item)| {
            let item: Value = serde_json::from_str(item.get()).unwrap_or(Value::Null);
            json!({"index": placement.job_index(local), "item": item})
        })
        .collect();
    Ok(json!({
        "chunk": chunk,
        "chunks": n_chunks,
        "stored": true,
        "page": page,
        "pages": pages,
        "total": items.len(),
        "items": shown,
    }))
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

/// Most ledgers one view of the failed-jobs page reads; the page links to the rest of the walk.
pub const FAILED_SCAN: usize = 20_000;

/// Examples shown per group of failed jobs.
pub const FAILED_EXAMPLES: usize = 5;

/// The failed jobs (finished without completing) grouped by error code and model, with counts and the newest
/// examples, as `batchd failed --json` prints them: the listing of `batchd_queue::failed`, one bounded walk of at
/// most [`FAILED_SCAN`] ledgers from `query.cursor`.
pub async fn failed(conn: &mut Conn, keys: &Keys, query: &FailedQuery) -> anyhow::Result<Value> {
    let report = batchd_queue::failed::failed_jobs(conn, keys, query).await.context("list the failed jobs")?;
    let mut value = serde_json::to_value(&report).context("encode the failed jobs")?;
    value["namespace"] = keys.namespace().into();
    Ok(value)
}

/// Most jobs one bulk retry handles (the newest that match); run it again for more.
pub const RETRY_BATCH: usize = 100;

/// The id a retry of `job_id` runs under: `batchd retry`'s (`<id>.retry-1`, then `.retry-2`, ...).
pub fn retry_id(job_id: &JobId) -> Result<JobId, String> {
    crate::cli::retry::retry_id(job_id.as_str())
        .ok_or_else(|| "its id is too long to derive a retry id from".to_owned())
}

/// What retrying one job would do or did: `{"job_id":..,"retry_id":..,"state":..,"model":..,"code":..,
/// "finished_at":..,"outcome":"would_retry|retried|already_retried|not_retryable","reason":..,
/// "submit_entry_id":..}`.
pub fn retry_row(job: &FailedJob, model: &str, retry: Result<&JobId, &str>, outcome: &Rerun) -> Value {
    let (name, reason) = match (retry, outcome) {
        (Err(reason), _) => ("not_retryable", Some(reason)),
        (Ok(_), Rerun::Possible | Rerun::Ready(_)) => ("would_retry", None),
        (Ok(_), Rerun::AlreadyRetried) => ("already_retried", None),
        (Ok(_), Rerun::NotRetryable(reason)) => ("not_retryable", Some(reason.as_str())),
    };
    json!({
        "job_id": job.job_id,
        "retry_id": retry.ok().map(JobId::as_str),
        "state": job.state,
        "model": model,
        "code": job.error.as_ref().and_then(|error| error.code.as_deref()),
        "finished_at": job.finished_at,
        "outcome": name,
        "reason": reason,
    })
}

/// A bulk retry's dry run: the newest [`RETRY_BATCH`] failed jobs that `query` matches (through `batchd failed`'s
/// listing), each checked without reading a payload ([`batchd_queue::rerun::check`]): `{"namespace":..,
/// "matching":N,"scanned":N,"complete":bool,"jobs":[<retry_row>..],"would_retry":N,"already_retried":N,
/// "not_retryable":N}`. Nothing is enqueued; the confirm step retries the jobs listed here.
pub async fn retry_plan(conn: &mut Conn, keys: &Keys, query: &FailedQuery) -> anyhow::Result<Value> {
    let query = FailedQuery { examples: RETRY_BATCH, ..query.clone() };
    let report = batchd_queue::failed::failed_jobs(conn, keys, &query).await.context("list the failed jobs")?;
    let mut jobs: Vec<(&FailedJob, &str)> =
        report.groups.iter().flat_map(|group| group.examples.iter().map(|job| (job, group.model.as_str()))).collect();
    jobs.sort_by(|(a, _), (b, _)| b.finished_at.cmp(&a.finished_at).then_with(|| a.job_id.cmp(&b.job_id)));
    jobs.truncate(RETRY_BATCH);
    let mut rows = Vec::with_capacity(jobs.len());
    for (job, model) in jobs {
        let Ok(job_id) = JobId::parse(&job.job_id) else { continue };
        let retry = retry_id(&job_id);
        let outcome = match &retry {
            Ok(retry) => batchd_queue::rerun::check(conn, keys, &job_id, retry)
                .await
                .with_context(|| format!("check whether {job_id} can be retried"))?,
            Err(_) => Rerun::NotRetryable(String::new()),
        };
        rows.push(retry_row(job, model, retry.as_ref().map_err(String::as_str), &outcome));
    }
    let count = |outcome: &str| rows.iter().filter(|row| row["outcome"] == outcome).count();
    Ok(json!({
        "namespace": keys.namespace(),
        "matching": report.total,
        "scanned": report.scanned,
        "complete": report.next_cursor.is_none(),
        "would_retry": count("would_retry"),
        "already_retried": count("already_retried"),
        "not_retryable": count("not_retryable"),
        "jobs": rows,
    }))
}

/// Which of the newest [`DEAD_LIST_LIMIT`] dead letters the list shows (all when empty).
#[derive(Debug, Clone, Default)]
pub struct DeadFilter {
    /// Text the entry's error contains, lowercase (matched in any case).
    pub error: Option<String>,
    /// Dead at or before this time, Unix ms.
    pub before: Option<u64>,
}

impl DeadFilter {
    /// Whether the filter narrows anything.
    pub fn is_empty(&self) -> bool {
        self.error.is_none() && self.before.is_none()
    }

    /// Whether an entry as `dead list --json` shapes it matches.
    fn matches(&self, entry: &Value) -> bool {
        let error_matches = self.error.as_ref().is_none_or(|wanted| {
            entry["error"].as_str().is_some_and(|error| error.to_lowercase().contains(wanted.as_str()))
        });
        let age_matches =
            self.before.is_none_or(|before| entry["dead_at"].as_u64().is_some_and(|dead_at| dead_at <= before));
        error_matches && age_matches
    }
}

/// The newest [`DEAD_LIST_LIMIT`] dead-letter entries that `filter` matches, newest first, as `batchd dead list
/// --json` shapes them, with the stream's length: `{"namespace":..,"total":N,"scanned":N,"filtered":bool,
/// "entries":[..]}`. The filter looks at the newest [`DEAD_LIST_LIMIT`] entries only (`scanned`), so a purge of
/// what matches deletes at most that many at a time.
pub async fn dead_list(conn: &mut Conn, keys: &Keys, filter: &DeadFilter) -> anyhow::Result<Value> {
    let entries = dead::list_json(conn, keys, DEAD_LIST_LIMIT).await?;
    let scanned = entries.len();
    let entries: Vec<Value> = entries.into_iter().filter(|entry| filter.matches(entry)).collect();
    let total = inspect::stream_len(conn, &keys.dead()).await.context("count dead letters")?;
    Ok(json!({
        "namespace": keys.namespace(),
        "total": total,
        "scanned": scanned,
        "filtered": !filter.is_empty(),
        "entries": entries,
    }))
}

/// One dead-letter entry, as `batchd dead show --json` shapes it.
pub async fn dead_entry(conn: &mut Conn, keys: &Keys, entry_id: &str) -> anyhow::Result<Value> {
    dead::show_json(conn, keys, entry_id).await
}
