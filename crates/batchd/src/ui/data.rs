//! What the dashboard's pages show, read from Redis as JSON: the same reports the CLI prints with `--json`
//! (`stats`, `workers`, `jobs`, `status`, `dead list|show`), plus what only the dashboard needs (chunk states of
//! the work in flight, finished jobs per minute and tokens from the stats counters, a job's result entry).
//!
//! Every read is bounded whatever the backlog: the overview reads a fixed number of keys (the counters of the
//! last 60 minutes and 24 hours, at most [`CHUNK_SAMPLE`] schedule members), the jobs list pages with a `SCAN`
//! cursor ([`JOBS_PAGE_SCAN`] ledgers a page at most), a job's ledger is read without its payloads, and a job's
//! responses are shown [`RESPONSES_PAGE`] at a time from one read of its result entry. What a read copies out of
//! Redis is bounded in bytes too: a result entry is read only when the size its ledger records is at most
//! [`RESULT_SHOWN_BYTES`] (a larger one is shown as its size and the `batchd tail` command that prints it), the
//! entries kept for paging take at most [`RESULT_CACHE_BYTES`], and a chunk's request items are read only when
//! they are at most [`ITEMS_SHOWN_BYTES`].

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
/// paged> | <what it is and how to read it, when it is not read> | null, "responses_page": {"page":..,"pages":..,
/// "total":..}}`. The ledger is read without its payloads ([`batchd_queue::LedgerView`]); `chunks` says what each
/// chunk's state and remote status mean now ([`batchd_queue::ledger_view::ChunkStatus`]); the result entry is read
/// only when the ledger records its size and that is at most [`RESULT_SHOWN_BYTES`] (otherwise `result` is
/// `{"entry_id":..,"stream":..,"not_read":true,"bytes":N|null,"limit_bytes":..,"read_with":"batchd ... tail
/// ..."}`), from Redis once per process and paged from memory ([`ResultCache`]), so 40 open tabs of one big job cost
/// Redis one read of it, not 40. The request items are a page of their own ([`job_items`]): the job's page reads
/// none.
pub async fn job(
    conn: &mut Conn,
    keys: &Keys,
    job_id: &JobId,
    page: usize,
    usd_per_day: Option<f64>,
) -> anyhow::Result<Value> {
    let view = cli::read_ledger(conn, keys, job_id).await?;
    let mut status = cli::status_json(&view);
    let job_state = view.state();
    // What a chunk not at the remote API yet waits for, and until when (as `batchd status` says it).
    let waits = cli::waits::read(conn, keys, &view, usd_per_day).await?;
    status["waits"] = cli::waits::json(&waits);
    let now = cli::now_ms();
    let chunks: Vec<Value> = view
        .chunks
        .iter()
        .enumerate()
        .map(|(index, chunk)| {
            let status = chunk.status(job_state);
            let packed = chunk.get(field::CHUNK_PACK) == Some(batchd_core::ids::PACK_QUEUED)
                && !job_state.is_some_and(|state| state.is_terminal());
            let wait = cli::waits::wait_text(&waits, index, chunk, now)
                .or_else(|| packed.then(|| cli::waits::pack_text(waits.pack_due, now)));
            json!({"index": index, "state": status.state, "remote": status.remote, "wait": wait})
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
    let (result, paging) = match (view.get(field::RESULT_ENTRY), view.get(field::REPLY_TO)) {
        (Some(entry_id), Some(stream)) if keys.is_results_stream(stream) => {
            result_section(conn, keys, &view, stream, entry_id, page).await?
        }
        _ => (Value::Null, json!({"page": 0, "pages": 0, "total": 0})),
    };
    // What its provider can do (cancel, ...), from the kind's registration.
    let provider = view.get(field::MODEL).and_then(crate::registry::kind_of).map(crate::registry::kind_json);
    Ok(json!({"job": status, "chunks": chunks, "result": result, "responses_page": paging, "provider": provider}))
}

/// Page `page` of `total` things shown `per_page` at a time, clamped to the last page: `(page, pages, first)`.
fn page_of(total: usize, page: usize, per_page: usize) -> (usize, usize, usize) {
    let pages = total.div_ceil(per_page);
    let page = page.min(pages.saturating_sub(1));
    (page, pages, page * per_page)
}

/// Request items shown per page.
pub const ITEMS_PAGE: usize = 50;

/// Most bytes of one chunk's request items the items page reads (their size is checked with `HSTRLEN` first):
/// above the daemon's default payload limit (`jobs.max_payload_bytes`, 9.5 MB), so every chunk of a deployment
/// that keeps it is shown; a larger one is shown as its size.
pub const ITEMS_SHOWN_BYTES: u64 = 10 * 1024 * 1024;

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
    let bytes = batchd_queue::ledger_view::chunk_requests_bytes(conn, keys, &view.job_id, chunk as u32)
        .await
        .with_context(|| format!("read the size of the request items of chunk {chunk}"))?;
    if bytes == 0 {
        return Ok(missing);
    }
    if bytes > ITEMS_SHOWN_BYTES {
        return Ok(json!({
            "chunk": chunk,
            "chunks": n_chunks,
            "stored": true,
            "not_read": true,
            "bytes": bytes,
            "limit_bytes": ITEMS_SHOWN_BYTES,
            "items": [],
        }));
    }
    let stored = batchd_queue::ledger_view::chunk_requests(conn, keys, &view.job_id, chunk as u32)
        .await
        .with_context(|| format!("read the request items of chunk {chunk}"))?;
    let Some(text) = stored else { return Ok(missing) };
    // Parsed borrowing: each item is a slice of the text, and only the page shown is built.
    let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(&text) else { return Ok(missing) };
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

/// Most bytes of a result entry a job's page reads: the size the publish recorded in the ledger
/// ([`field::RESULT_BYTES`]) is compared with it first, and a larger entry is shown as its size and the `batchd
/// tail` command that prints it, never read (a stream entry can only be read whole). An entry whose size was not
/// recorded (published before the ledger recorded it) is not read either.
pub const RESULT_SHOWN_BYTES: u64 = 8 * 1024 * 1024;

/// Most bytes the result entries kept for paging take ([`ResultCache`]): the entries' text as read, and 8 bytes a
/// response for where each one is in it. With [`RESULT_SHOWN_BYTES`] and one read at a time it bounds what
/// results cost the dashboard: at most this plus about three times [`RESULT_SHOWN_BYTES`] while one is read, plus
/// one entry per page being cut from an entry the cache has let go.
pub const RESULT_CACHE_BYTES: usize = 32 * 1024 * 1024;

/// What a job's page says of its result entry: `Ok` with the entry (and the responses of page `page`) when it was
/// read, or a note of what it is and how to read it when it is past [`RESULT_SHOWN_BYTES`] or its size is
/// unknown. `(result, responses_page)` of [`job`]'s JSON.
async fn result_section(
    conn: &mut Conn,
    keys: &Keys,
    view: &batchd_queue::LedgerView,
    stream: &str,
    entry_id: &str,
    page: usize,
) -> anyhow::Result<(Value, Value)> {
    let no_page = json!({"page": 0, "pages": 0, "total": 0});
    let recorded = view.number(field::RESULT_BYTES);
    if recorded.is_none_or(|bytes| bytes > RESULT_SHOWN_BYTES) {
        let not_read = json!({
            "entry_id": entry_id,
            "stream": stream,
            "not_read": true,
            "bytes": recorded,
            "limit_bytes": RESULT_SHOWN_BYTES,
            "read_with": tail_command(keys, stream, entry_id),
        });
        return Ok((not_read, no_page));
    }
    let Some(entry) = result_entry(conn, stream, entry_id).await? else {
        return Ok((json!({"entry_id": entry_id, "trimmed": true}), no_page));
    };
    let (mut result, paging) = entry.page(page);
    result["entry_id"] = entry_id.into();
    Ok((result, paging))
}

/// The command that prints result entry `entry_id` of `stream` whole: `batchd tail` from that entry, once, as JSON;
/// `None` when the ledger's entry id is not one.
pub fn tail_command(keys: &Keys, stream: &str, entry_id: &str) -> Option<String> {
    let entry_id = cli::tail::parse_entry_id(entry_id).ok()?;
    Some(format!("batchd --namespace {} tail --stream '{stream}' --from {entry_id} --count 1 --json", keys.namespace()))
}

/// A result entry kept for paging its responses: its text as read, with where each response is in its `result`,
/// so a page of responses is parsed from the text on each view and nothing else of the entry is built. What it
/// holds is counted in bytes ([`CachedEntry::bytes`]).
#[derive(Debug)]
struct CachedEntry {
    /// The entry's fields as read, but `result` when its responses were found (then it is in `result`).
    fields: HashMap<String, String>,
    /// `result`'s members other than `responses` (`usage`, `failed_batches`), as JSON text.
    result_rest: Option<String>,
    /// The `result` field's text, when its responses were found; each page of them is cut from it.
    result: String,
    /// Where each response is in `result`: its first byte and the byte after its last.
    responses: Vec<(u32, u32)>,
}

impl CachedEntry {
    /// Builds the entry from its fields as read. `result` is indexed when it is a JSON object whose `responses`
    /// is an array (what batchd writes); anything else stays a field, shown as `batchd tail --json` shows it.
    fn new(mut fields: HashMap<String, String>) -> Self {
        let mut entry =
            Self { fields: HashMap::new(), result_rest: None, result: String::new(), responses: Vec::new() };
        if let Some(result) = fields.remove("result") {
            match index_responses(&result) {
                Some((rest, responses)) => {
                    entry.result_rest = Some(rest);
                    entry.responses = responses;
                    entry.result = result;
                }
                None => {
                    fields.insert("result".to_owned(), result);
                }
            }
        }
        entry.fields = fields;
        entry
    }

    /// What it holds, in bytes: the text of its fields, its responses' places, and a little per field.
    fn bytes(&self) -> usize {
        let fields: usize = self.fields.iter().map(|(name, value)| name.capacity() + value.capacity() + 64).sum();
        fields
            + self.result_rest.as_ref().map_or(0, String::capacity)
            + self.result.capacity()
            + self.responses.capacity() * std::mem::size_of::<(u32, u32)>()
            + std::mem::size_of::<Self>()
    }

    /// The entry as `batchd tail --json` shows it with only page `page` of its responses (clamped to the last),
    /// and the page's place: `(result, {"page":..,"pages":..,"total":..,"first_index":..})`.
    fn page(&self, page: usize) -> (Value, Value) {
        let mut head = cli::result_json(&self.fields);
        let Some(rest) = &self.result_rest else {
            return (head, json!({"page": 0, "pages": 0, "total": 0}));
        };
        let mut result: Value = serde_json::from_str(rest).unwrap_or_else(|_| json!({}));
        let (page, pages, start) = page_of(self.responses.len(), page, RESPONSES_PAGE);
        let shown: Vec<Value> = self
            .responses
            .iter()
            .skip(start)
            .take(RESPONSES_PAGE)
            .map(|&(first, end)| {
                let text = self.result.get(first as usize..end as usize).unwrap_or("null");
                serde_json::from_str(text).unwrap_or(Value::Null)
            })
            .collect();
        result["responses"] = shown.into();
        head["result"] = result;
        let paging = json!({"page": page, "pages": pages, "total": self.responses.len(), "first_index": start});
        (head, paging)
    }
}

/// A result's members but `responses` as JSON text, and where each response is in `result`; `None` when `result`
/// is not a JSON object with a `responses` array (or is larger than 4 GiB). The text is parsed once, borrowing:
/// nothing of a response is copied.
fn index_responses(result: &str) -> Option<(String, Vec<(u32, u32)>)> {
    let members: BTreeMap<String, &RawValue> = serde_json::from_str(result).ok()?;
    let responses: Vec<&RawValue> = serde_json::from_str(members.get("responses")?.get()).ok()?;
    let base = result.as_ptr().addr();
    let places = responses
        .iter()
        .map(|response| {
            let first = response.get().as_ptr().addr() - base;
            Some((u32::try_from(first).ok()?, u32::try_from(first + response.get().len()).ok()?))
        })
        .collect::<Option<Vec<_>>>()?;
    let rest: serde_json::Map<String, Value> = members
        .iter()
        .filter(|(name, _)| name.as_str() != "responses")
        .map(|(name, value)| (name.clone(), serde_json::from_str(value.get()).unwrap_or(Value::Null)))
        .collect();
    Some((Value::Object(rest).to_string(), places))
}

/// Result entries last shown, by `(stream, entry id)`, under a budget of [`RESULT_CACHE_BYTES`]: an entry never
/// changes once written, so it is read from Redis once and every page of it, in every tab, comes from here.
/// Holding the lock while reading makes concurrent requests of one entry wait for the one read instead of each
/// copying the entry out of Redis, and makes the dashboard read one entry at a time.
#[derive(Debug, Default)]
struct ResultCache {
    /// The entries with their size in bytes, the most recently used last.
    entries: Vec<((String, String), std::sync::Arc<CachedEntry>, usize)>,
    /// The sum of their sizes, at most [`RESULT_CACHE_BYTES`].
    bytes: usize,
}

impl ResultCache {
    /// The entry of `key`, now the most recently used; `None` when it is not kept.
    fn get(&mut self, key: &(String, String)) -> Option<std::sync::Arc<CachedEntry>> {
        let at = self.entries.iter().position(|(cached, _, _)| cached == key)?;
        let hit = self.entries.remove(at);
        let entry = std::sync::Arc::clone(&hit.1);
        self.entries.push(hit);
        Some(entry)
    }

    /// Keeps `entry`, letting go of the least recently used ones until it fits under [`RESULT_CACHE_BYTES`]; an
    /// entry larger than the whole budget is not kept.
    fn insert(&mut self, key: (String, String), entry: std::sync::Arc<CachedEntry>) {
        let bytes = entry.bytes();
        if bytes > RESULT_CACHE_BYTES {
            return;
        }
        while self.bytes + bytes > RESULT_CACHE_BYTES && !self.entries.is_empty() {
            let (_, _, freed) = self.entries.remove(0);
            self.bytes -= freed;
        }
        self.bytes += bytes;
        self.entries.push((key, entry, bytes));
    }
}

static RESULT_CACHE: std::sync::LazyLock<tokio::sync::Mutex<ResultCache>> =
    std::sync::LazyLock::new(|| tokio::sync::Mutex::new(ResultCache::default()));

/// Result entry `entry_id` of `stream`, from the cache or read once; `None` when it was trimmed. The caller has
/// checked its recorded size against [`RESULT_SHOWN_BYTES`].
async fn result_entry(
    conn: &mut Conn,
    stream: &str,
    entry_id: &str,
) -> anyhow::Result<Option<std::sync::Arc<CachedEntry>>> {
    let mut cache = RESULT_CACHE.lock().await;
    let key = (stream.to_owned(), entry_id.to_owned());
    if let Some(entry) = cache.get(&key) {
        return Ok(Some(entry));
    }
    let entries: inspect::Entries<String> = inspect::entries(conn, stream, entry_id, entry_id, 1, false)
        .await
        .with_context(|| format!("read result entry {entry_id}"))?;
    let Some((_, fields)) = entries.into_iter().next() else { return Ok(None) };
    let entry = std::sync::Arc::new(CachedEntry::new(fields));
    cache.insert(key, std::sync::Arc::clone(&entry));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A result entry's fields as batchd writes them, with `n` responses of about `bytes` each.
    fn fields(n: usize, bytes: usize) -> HashMap<String, String> {
        let responses: Vec<Value> = (0..n)
            .map(|index| json!({"index": index, "success": index % 3 != 0, "result": {"text": "x".repeat(bytes)}}))
            .collect();
        let result = json!({"responses": responses, "usage": {"prompt_tokens": 3}, "failed_batches": []});
        [
            ("v", "1".to_owned()),
            ("job_id", "j".to_owned()),
            ("status", "completed".to_owned()),
            ("result", result.to_string()),
            ("items_total", n.to_string()),
            ("metadata", r#"{"tenant":"a\u00e9"}"#.to_owned()),
        ]
        .into_iter()
        // As read from Redis: each value takes its length, no more.
        .map(|(name, mut value)| {
            value.shrink_to_fit();
            (name.to_owned(), value)
        })
        .collect()
    }

    #[test]
    fn a_page_of_responses_is_the_entry_as_tail_shows_it_with_those_responses() {
        let fields = fields(120, 10);
        let whole = cli::result_json(&fields);
        let entry = CachedEntry::new(fields);
        for (page, first, len) in [(0, 0, 50), (1, 50, 50), (2, 100, 20), (9, 100, 20)] {
            let (shown, paging) = entry.page(page);
            let mut expected = whole.clone();
            let responses = whole["result"]["responses"].as_array().unwrap()[first..first + len].to_vec();
            expected["result"]["responses"] = responses.into();
            assert_eq!(shown, expected, "page {page}");
            assert_eq!(paging, json!({"page": first / 50, "pages": 3, "total": 120, "first_index": first}));
        }
    }

    #[test]
    fn a_result_batchd_did_not_write_is_shown_as_it_is() {
        for result in ["not json", r#"{"usage":{}}"#, r#"{"responses":7}"#, "[1,2]"] {
            let mut fields = fields(1, 1);
            fields.insert("result".to_owned(), result.to_owned());
            let (shown, paging) = CachedEntry::new(fields.clone()).page(0);
            assert_eq!(shown, cli::result_json(&fields), "{result}");
            assert_eq!(paging["pages"], 0);
        }
    }

    #[test]
    fn an_entry_counts_its_text_and_its_responses_places() {
        let fields = fields(1_000, 100);
        let text: usize = fields.values().map(String::len).sum();
        let bytes = CachedEntry::new(fields).bytes();
        assert!(bytes >= text + 1_000 * 8, "{bytes} counts the text ({text}) and 8 bytes a response");
        assert!(bytes < text * 2, "{bytes} is about the text ({text})");
    }

    #[test]
    fn the_cache_holds_bytes_under_its_budget_the_least_recently_used_leaving_first() {
        let mut cache = ResultCache::default();
        let key = |n: usize| ("s".to_owned(), format!("{n}-0"));
        // Entries of about a third of the budget: three fit, the fourth makes the least recently used leave.
        let big = std::sync::Arc::new(CachedEntry::new(fields(1, RESULT_CACHE_BYTES / 3 - 4_096)));
        for n in 0..3 {
            cache.insert(key(n), std::sync::Arc::clone(&big));
        }
        assert_eq!(cache.entries.len(), 3);
        assert!(cache.get(&key(0)).is_some(), "used again: now the most recent");
        cache.insert(key(3), std::sync::Arc::clone(&big));
        let kept: Vec<&str> = cache.entries.iter().map(|(key, _, _)| key.1.as_str()).collect();
        assert_eq!(kept, ["2-0", "0-0", "3-0"]);
        assert!(cache.bytes <= RESULT_CACHE_BYTES);
        assert_eq!(cache.bytes, cache.entries.iter().map(|(_, _, bytes)| bytes).sum::<usize>());
        // Small entries: many fit, older ones leave, and the total stays under the budget.
        let small = fields(20, 1_000);
        for n in 10..2_000 {
            cache.insert(key(n), std::sync::Arc::new(CachedEntry::new(small.clone())));
            assert!(cache.bytes <= RESULT_CACHE_BYTES);
        }
        assert!(cache.get(&key(10)).is_none() && cache.get(&key(1_999)).is_some());
        assert!(cache.bytes > RESULT_CACHE_BYTES * 9 / 10, "the budget is used: {}", cache.bytes);
        // An entry over the whole budget is not kept, and lets nothing go.
        let before = cache.entries.len();
        cache.insert(key(1), std::sync::Arc::new(CachedEntry::new(fields(1, RESULT_CACHE_BYTES))));
        assert_eq!(cache.entries.len(), before);
        assert!(cache.get(&key(1)).is_none());
    }
}
