//! `batchd jobs` (ledgers by state) and `batchd stats` (queue depths, work in flight, throughput): read-only looks
//! at a namespace for operators.
//!
//! `jobs` walks the ledgers with `SCAN` (1,000 keys per step, one pipelined `HMGET` per step): its time is O(number
//! of ledgers) and its memory O(--limit), so it is an operator's tool, not something to poll. `stats` uses bounded
//! commands only (throughput comes from the finished-jobs counters, never from the result entries, which hold every
//! response); it also says whether intake is paused (`batchd pause`). Names read from Redis
//! (job ids, states, models, statuses, consumer groups) are printed escaped (`escape_for_terminal`).

use std::time::Duration;

use anyhow::Context as _;
use batchd_core::{JobState, Keys};
use batchd_queue::Conn;
use serde::Serialize;
use serde_json::json;

use super::{escape_for_terminal, format_age, format_utc, now_ms, open, print_json};
use crate::settings::Settings;

/// Keys asked for per `SCAN` step.
const SCAN_COUNT: usize = 1000;

/// Throughput windows, in minutes.
const WINDOWS: [u64; 3] = [1, 5, 15];

/// Options of `batchd jobs`.
#[derive(Debug, Clone, clap::Args)]
pub struct JobsArgs {
    /// Only jobs in this state: accepted, running, completed, failed, expired, cancelled (repeat for several).
    #[arg(long, value_name = "STATE", value_parser = parse_state)]
    pub state: Vec<JobState>,
    /// Only jobs for this model.
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// Only jobs of this provider (`cloudflare` for @cf/ and @hf/ models, else the model's prefix: `openai`, ...).
    #[arg(long, value_name = "PROVIDER")]
    pub provider: Option<String>,
    /// Only jobs whose id starts with this (e.g. `inv-2025-11-`).
    #[arg(long, value_name = "PREFIX")]
    pub id_prefix: Option<String>,
    /// Only jobs accepted at or after this time: 2025-11-22T08:00:00Z, 2025-11-22, Unix ms, or an age (30m, 2h,
    /// 1d).
    #[arg(long, value_name = "TIME", value_parser = super::retry::parse_time)]
    pub since: Option<super::retry::TimeArg>,
    /// Show at most this many jobs, the most recently accepted first.
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub limit: usize,
    /// Print JSON: `{"jobs":[..],"matching":N,"scanned":N,"next_cursor":null}` (the dashboard's `/api/jobs` pages
    /// the same shape, with `next_cursor` set while the walk goes on).
    #[arg(long)]
    pub json: bool,
}

fn parse_state(text: &str) -> Result<JobState, String> {
    text.parse::<JobState>()
        .map_err(|_| "expected one of accepted, running, completed, failed, expired, cancelled".to_owned())
}

/// One ledger, as `batchd jobs` (and the dashboard) lists it.
pub(crate) type JobRow = batchd_queue::inspect::LedgerRow;

/// Which ledgers a jobs page keeps (every filter is optional).
#[derive(Debug, Clone, Default)]
pub(crate) struct JobFilter {
    /// Only these states (any when empty).
    pub states: Vec<JobState>,
    /// Only this model.
    pub model: Option<String>,
    /// Only models of this provider ([`super::cost::provider_of`]).
    pub provider: Option<String>,
    /// Only ids starting with this (checked as a job id: no glob characters reach `SCAN MATCH`).
    pub id_prefix: Option<String>,
    /// Only jobs accepted at or after this time, Unix ms.
    pub accepted_since: Option<u64>,
}

impl JobFilter {
    fn keeps(&self, row: &JobRow) -> bool {
        (self.states.is_empty() || self.states.iter().any(|wanted| wanted.as_str() == row.state))
            && self.model.as_ref().is_none_or(|model| *model == row.model)
            && self.provider.as_ref().is_none_or(|provider| *provider == super::cost::provider_of(&row.model))
            && self.accepted_since.is_none_or(|since| row.accepted_at.is_some_and(|at| at >= since))
    }
}

/// One page of a bounded walk over the ledgers.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct JobsPage {
    /// Matching jobs read on this page, the most recently accepted first.
    pub jobs: Vec<JobRow>,
    /// Ledgers that matched the filter on this page (more than `jobs` holds when the page was cut to its limit).
    pub matching: usize,
    /// Ledgers read on this page.
    pub scanned: usize,
    /// The `SCAN` cursor to continue from; `None` when the walk is complete.
    pub next_cursor: Option<u64>,
}

/// Reads ledgers with `SCAN` from `cursor` (1,000 keys a step, one pipelined `HMGET` per step) until `limit`
/// matching jobs are found, `max_scanned` ledgers were read, or the walk ends. Each page's cost is bounded by
/// `max_scanned` whatever the number of ledgers; the order is `SCAN`'s, and each page is sorted newest first.
pub(crate) async fn jobs_page(
    conn: &mut Conn,
    keys: &Keys,
    filter: &JobFilter,
    cursor: u64,
    limit: usize,
    max_scanned: usize,
) -> anyhow::Result<JobsPage> {
    let id_prefix = filter.id_prefix.as_deref().map(super::parse_job_id).transpose()?;
    let mut page = JobsPage::default();
    let mut cursor = cursor;
    loop {
        let step = batchd_queue::inspect::scan_ledgers(conn, keys, id_prefix.as_ref(), cursor, SCAN_COUNT)
            .await
            .context("read ledgers")?;
        page.scanned += step.scanned;
        for row in step.rows {
            if !filter.keeps(&row) {
                continue;
            }
            page.matching += 1;
            page.jobs.push(row);
            if page.jobs.len() > limit.saturating_mul(2).max(SCAN_COUNT) {
                newest_first(&mut page.jobs, limit);
            }
        }
        cursor = step.next_cursor.unwrap_or(0);
        if cursor == 0 || page.matching >= limit || page.scanned >= max_scanned {
            break;
        }
    }
    newest_first(&mut page.jobs, limit);
    page.next_cursor = (cursor != 0).then_some(cursor);
    Ok(page)
}

/// `batchd jobs`: every ledger, walked page after page.
pub async fn jobs(settings: &Settings, args: &JobsArgs) -> anyhow::Result<()> {
    let keys = settings.keys();
    if let Some(prefix) = &args.id_prefix {
        super::parse_job_id(prefix).map_err(|e| anyhow::anyhow!("--id-prefix: {e:#}"))?;
    }
    let mut conn = open(settings).await?;
    let accepted_since = match args.since {
        Some(since) => Some(since.resolve(redis_now(&mut conn).await?)),
        None => None,
    };
    let filter = JobFilter {
        states: args.state.clone(),
        model: args.model.clone(),
        provider: args.provider.clone(),
        id_prefix: args.id_prefix.clone(),
        accepted_since,
    };
    let mut all = JobsPage::default();
    let mut cursor = 0;
    loop {
        let page = jobs_page(&mut conn, &keys, &filter, cursor, usize::MAX, SCAN_COUNT).await?;
        all.matching += page.matching;
        all.scanned += page.scanned;
        all.jobs.extend(page.jobs);
        newest_first(&mut all.jobs, args.limit);
        match page.next_cursor {
            Some(next) => cursor = next,
            None => break,
        }
    }
    if args.json {
        let mut page = serde_json::to_value(&all).context("encode jobs")?;
        annotate_jobs(&mut page, redis_now(&mut conn).await?);
        return print_json(&page);
    }
    print!("{}", jobs_table(&all.jobs));
    println!(
        "{} of {} matching jobs shown ({} ledgers scanned; {})",
        all.jobs.len(),
        all.matching,
        all.scanned,
        super::place(settings)
    );
    Ok(())
}

/// Adds to each job of a jobs page's JSON (`batchd jobs --json`, the dashboard's `/api/jobs`) its `provider` and
/// its `duration_ms`: accepted to finished, or to `now` (Redis's clock) for a job not finished.
pub(crate) fn annotate_jobs(page: &mut serde_json::Value, now: u64) {
    for job in page["jobs"].as_array_mut().into_iter().flatten() {
        job["provider"] = super::cost::provider_of(job["model"].as_str().unwrap_or("")).into();
        let end = job["finished_at"].as_u64().unwrap_or(now);
        job["duration_ms"] = job["accepted_at"].as_u64().map(|accepted| end.saturating_sub(accepted)).into();
    }
}

/// Sorts the most recently accepted first (ties by id) and keeps `limit`.
fn newest_first(rows: &mut Vec<JobRow>, limit: usize) {
    rows.sort_by(|a, b| b.accepted_at.cmp(&a.accepted_at).then_with(|| a.job_id.cmp(&b.job_id)));
    rows.truncate(limit);
}

fn jobs_table(rows: &[JobRow]) -> String {
    let width = rows.iter().map(|row| escape_for_terminal(&row.job_id).chars().count()).max().unwrap_or(0).clamp(6, 40);
    let time = |ms: Option<u64>| ms.map(format_utc).unwrap_or_else(|| "-".into());
    let number = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_else(|| "-".into());
    let mut out = format!(
        "{:<width$}  {:<9}  {:>7}  {:>6}  {:<24}  {:<24}  MODEL\n",
        "JOB ID", "STATE", "ITEMS", "CHUNKS", "ACCEPTED", "UPDATED"
    );
    for row in rows {
        out.push_str(&format!(
            "{:<width$}  {:<9}  {:>7}  {:>6}  {:<24}  {:<24}  {}\n",
            escape_for_terminal(&row.job_id),
            escape_for_terminal(&row.state),
            number(row.n_items),
            number(row.n_chunks),
            time(row.accepted_at),
            time(row.updated_at),
            escape_for_terminal(&row.model)
        ));
    }
    out
}

/// Most ledgers `batchd status --remote` and the dashboard's look-up read to find a remote batch id.
pub(crate) const REMOTE_LOOKUP_LEDGERS: usize = 100_000;

/// The job (or pack) and chunk whose remote batch is `request_id`, or an [`super::Exit`] with
/// [`super::EXIT_NOT_FOUND`] saying what was read.
pub(crate) async fn job_of_remote(conn: &mut Conn, keys: &Keys, request_id: &str) -> anyhow::Result<(String, u32)> {
    let lookup = batchd_queue::inspect::find_remote_batch(conn, keys, request_id, REMOTE_LOOKUP_LEDGERS)
        .await
        .context("look for the remote batch")?;
    lookup.found.ok_or_else(|| {
        let read = if lookup.complete { "every" } else { "the first" };
        super::Exit {
            code: super::EXIT_NOT_FOUND,
            message: format!(
                "no job in namespace {} has remote batch {:?} ({read} {} ledgers read, the first {} chunks of each; a \
                 finished job's ledger expires after retention.ledger_ttl_secs)",
                keys.namespace(),
                escape_for_terminal(request_id),
                lookup.scanned,
                batchd_queue::inspect::REMOTE_LOOKUP_CHUNKS
            ),
        }
        .into()
    })
}

/// `batchd status --remote <batch id>`: the status of the job whose remote batch that is (said on stderr first).
pub async fn status_of_remote(settings: &Settings, request_id: &str, json: bool) -> anyhow::Result<()> {
    let keys = settings.keys();
    let mut conn = open(settings).await?;
    let (job_id, chunk) = match job_of_remote(&mut conn, &keys, request_id).await {
        Ok(found) => found,
        Err(error) => {
            if let Some(exit) = error.downcast_ref::<super::Exit>().filter(|_| json) {
                print_json(&json!({"remote": request_id, "error": {"code": "not_found", "message": exit.message}}))?;
            }
            return Err(error);
        }
    };
    eprintln!(
        "remote batch {} is chunk {chunk} of job {}",
        escape_for_terminal(request_id),
        escape_for_terminal(&job_id)
    );
    super::status(settings, &job_id, json).await
}

/// Options of `batchd stats`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatsArgs {
    /// Also count the jobs finished since then, by status, the tokens used, by model, and their cost, by
    /// provider: an age (30m, 24h, 7d)
    /// or a time (2025-11-22T08:00:00Z, 2025-11-22, Unix ms), at most 8 days back. Up to 2 hours back it reads
    /// the per-minute counters; further back the hourly ones, so the window starts at a whole hour.
    #[arg(long, value_name = "TIME", value_parser = super::retry::parse_time)]
    pub since: Option<super::retry::TimeArg>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// What `batchd stats --json` prints (and the dashboard's overview holds per namespace): queue depths, work in
/// flight, the oldest waiting entry, throughput from the finished-jobs counters, the result streams' reader groups,
/// the pause flag and what finished jobs cost per UTC day ([`super::cost::daily`]). Bounded commands only.
pub(crate) async fn stats_report(conn: &mut Conn, keys: &Keys, now: u64) -> anyhow::Result<serde_json::Value> {
    let depths = batchd_queue::inspect::depths(conn, keys, now).await.context("read queue depths")?;
    let oldest_waiting_ms =
        depths.oldest_entry_id.as_deref().and_then(batchd_producer::entry_millis).map(|ms| now.saturating_sub(ms));
    let schedule_lag_ms = depths.earliest_due_ms.map(|due| now.saturating_sub(due));
    let throughput = throughput(conn, keys, now).await?;
    let readers = result_groups(conn, &keys.results()).await?;
    let paused = super::pause::read(conn, keys).await?;
    let cost_days = super::cost::daily(conn, keys, now).await?;
    Ok(json!({
        "namespace": keys.namespace(),
        "at": now,
        "paused": paused.as_ref().map(super::pause::PauseRecord::to_json),
        "submit": {
            "entries": depths.submit_entries,
            "waiting": depths.submit_waiting(),
            "being_taken_in": depths.submit_in_flight,
            // The older name of `being_taken_in`, kept for scripts written against it.
            "in_flight": depths.submit_in_flight,
            "oldest_waiting_ms": oldest_waiting_ms,
        },
        "schedule": {"chunks_in_flight": depths.scheduled, "due": depths.due, "lag_ms": schedule_lag_ms},
        "results": {"entries": depths.results, "throughput": throughput, "groups": readers},
        "dead": {"entries": depths.dead},
        "cost": {"days": cost_days},
    }))
}

/// `batchd stats`.
pub async fn stats(settings: &Settings, args: &StatsArgs) -> anyhow::Result<()> {
    let keys = settings.keys();
    let mut conn = open(settings).await?;
    let now = now_ms();
    let mut report = stats_report(&mut conn, &keys, now).await?;
    if let Some(since) = args.since {
        let redis_now = redis_now(&mut conn).await?;
        report["since"] = finished_since(&mut conn, &keys, redis_now, since.resolve(redis_now)).await?;
    }
    let number = |value: &serde_json::Value| value.as_u64().unwrap_or(0);
    let (submit_entries, in_flight) =
        (number(&report["submit"]["entries"]), number(&report["submit"]["being_taken_in"]));
    let (scheduled, due) = (number(&report["schedule"]["chunks_in_flight"]), number(&report["schedule"]["due"]));
    let (results, dead) = (number(&report["results"]["entries"]), number(&report["dead"]["entries"]));
    let throughput = &report["results"]["throughput"];
    let readers = &report["results"]["groups"];
    let paused = super::pause::PauseRecord::from_json(&report["paused"]);
    if args.json {
        return print_json(&report);
    }
    let ms = |value: &serde_json::Value| value.as_u64().map(|ms| format_age(Duration::from_millis(ms)));
    let mut out = format!("{} at {}\n", super::place(settings), format_utc(now));
    out.push_str(&format!(
        "  intake           {}\n",
        paused.as_ref().map_or_else(|| "running".to_owned(), super::pause::PauseRecord::describe)
    ));
    out.push_str(&format!(
        "  submit stream    {submit_entries} entries: {} waiting, {in_flight} being taken in{}\n",
        submit_entries.saturating_sub(in_flight),
        ms(&report["submit"]["oldest_waiting_ms"]).map(|age| format!("; oldest waiting {age}")).unwrap_or_default()
    ));
    out.push_str(&format!(
        "  in flight        {scheduled} chunks (remote batches submitted or waiting to be), {due} due now{}\n",
        if due > 0 {
            ms(&report["schedule"]["lag_ms"]).map(|lag| format!(", lag {lag}")).unwrap_or_default()
        } else {
            String::new()
        }
    ));
    let windows: Vec<String> = WINDOWS
        .iter()
        .map(|minutes| {
            let n = throughput["windows"][format!("{minutes}m")].as_u64().unwrap_or(0);
            format!("{minutes}m {n} ({:.1}/min)", n as f64 / *minutes as f64)
        })
        .collect();
    out.push_str(&format!("  results          {results} entries; last {}\n", windows.join(", ")));
    if let Some(statuses) = throughput["by_status_15m"].as_object().filter(|s| !s.is_empty()) {
        let parts: Vec<String> =
            statuses.iter().map(|(status, n)| format!("{n} {}", escape_for_terminal(status))).collect();
        out.push_str(&format!("                   last 15m: {}\n", parts.join(", ")));
    }
    for group in readers.as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  result readers   group {}: {} read and not acknowledged, {} not read yet\n",
            escape_for_terminal(group["name"].as_str().unwrap_or("?")),
            group["pending"],
            group["lag"].as_u64().map_or_else(|| "unknown".to_owned(), |lag| lag.to_string())
        ));
    }
    if let Some(since) = report.get("since") {
        out.push_str(&since_text(since));
    }
    out.push_str(&super::cost::daily_text(report["cost"]["days"].as_array().map(Vec::as_slice).unwrap_or_default()));
    out.push_str(&format!("  dead letters     {dead} entries\n"));
    print!("{out}");
    Ok(())
}

/// Redis's clock, for the windows an operator gives (`--since 2h`): the counters are keyed by it.
async fn redis_now(conn: &mut Conn) -> anyhow::Result<u64> {
    batchd_queue::inspect::redis_now(conn).await.context("read Redis's clock")
}

/// The per-minute counters cover this much of the past (their lifetime less the current minute).
const MINUTE_WINDOW_MS: u64 = 2 * 3_600_000;

/// The hourly counters cover this much of the past.
const HOUR_WINDOW_MS: u64 = batchd_core::keys::STATS_HOUR_TTL_SECS * 1000;

/// Jobs finished from `since` to `now` (Unix ms, Redis's clock) by status, and tokens by model, from the
/// finished-jobs counters: the per-minute hashes for a window up to two hours, the hourly ones (at most 192) for a
/// longer one, whose start is then the whole hour `since` falls in. Bounded: one pipelined `HGETALL` per hash.
pub(crate) async fn finished_since(
    conn: &mut Conn,
    keys: &Keys,
    now: u64,
    since: u64,
) -> anyhow::Result<serde_json::Value> {
    let window = now.saturating_sub(since);
    if window > HOUR_WINDOW_MS {
        return Err(super::Exit {
            code: super::EXIT_USAGE,
            message: "--since: at most 8 days back (the hourly counters are kept for 8 days)".to_owned(),
        }
        .into());
    }
    let (granularity, unit) = if window <= MINUTE_WINDOW_MS { ("minute", 60_000) } else { ("hour", 3_600_000) };
    let (first, last) = (since / unit, now / unit);
    let hashes = if unit == 60_000 {
        batchd_queue::inspect::counters(conn, (first..=last).map(|minute| keys.stats_minute(minute))).await
    } else {
        batchd_queue::inspect::hour_counters(conn, keys, first, last, now).await
    }
    .context("read the finished-jobs counters")?;
    let totals = batchd_core::stats::Totals::of(&hashes);
    Ok(json!({
        "from": first * unit,
        "to": now,
        "granularity": granularity,
        "total": totals.finished.values().sum::<u64>(),
        "cost_usd": super::cost::cost_json(&totals.cost_nano),
        "finished": totals.finished,
        "tokens": totals.tokens,
    }))
}

/// `  since 2h ...` lines of `stats --since`: the window, the jobs finished by status, the tokens by model.
fn since_text(since: &serde_json::Value) -> String {
    let number = |value: &serde_json::Value| value.as_u64().unwrap_or(0);
    let (from, to, total) = (number(&since["from"]), number(&since["to"]), number(&since["total"]));
    let hours = (to.saturating_sub(from) as f64 / 3_600_000.0).max(1.0 / 60.0);
    let statuses: Vec<String> = since["finished"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(status, n)| format!("{n} {}", escape_for_terminal(status)))
        .collect();
    let mut out = format!(
        "  finished since   {} ({}, per-{} counters): {total} jobs ({:.1}/h){}\n",
        format_utc(from),
        format_age(Duration::from_millis(to.saturating_sub(from))),
        since["granularity"].as_str().unwrap_or("?"),
        total as f64 / hours,
        if statuses.is_empty() { String::new() } else { format!(": {}", statuses.join(", ")) }
    );
    for (model, kinds) in since["tokens"].as_object().into_iter().flatten() {
        let kinds: Vec<String> =
            kinds.as_object().into_iter().flatten().map(|(kind, n)| format!("{n} {kind}")).collect();
        out.push_str(&format!("  tokens           {}: {}\n", escape_for_terminal(model), kinds.join(", ")));
    }
    out.push_str(&super::cost::cost_text("cost", &since["cost_usd"]));
    out
}

/// Jobs finished in the last 1, 5 and 15 minutes, and in the last 15 by status, from the finished-jobs counters
/// (one small hash per minute, written when a result is published): a window of N minutes is the current minute
/// and the N - 1 before it. Never reads a result entry (each holds every response of its job).
async fn throughput(conn: &mut Conn, keys: &Keys, now: u64) -> anyhow::Result<serde_json::Value> {
    let longest = WINDOWS[WINDOWS.len() - 1];
    let current = now / 60_000;
    let first = current.saturating_sub(longest - 1);
    let hashes = batchd_queue::inspect::counters(conn, (first..=current).map(|minute| keys.stats_minute(minute)))
        .await
        .context("read the minute counters")?;
    let mut counts = [0u64; WINDOWS.len()];
    let mut by_status: std::collections::BTreeMap<String, u64> = Default::default();
    for (minute, hash) in (first..=current).zip(&hashes) {
        for (name, n) in hash {
            let Some(batchd_core::stats::StatField::Finished(status)) = batchd_core::stats::StatField::parse(name)
            else {
                continue;
            };
            *by_status.entry(status.to_owned()).or_default() += n;
            for (count, minutes) in counts.iter_mut().zip(WINDOWS) {
                if minute + minutes > current {
                    *count += n;
                }
            }
        }
    }
    let windows: serde_json::Map<String, serde_json::Value> =
        WINDOWS.iter().zip(counts).map(|(minutes, n)| (format!("{minutes}m"), n.into())).collect();
    Ok(json!({"windows": windows, "by_status_15m": by_status}))
}

/// The consumer groups reading the results stream, with their pending entries and lag (Redis 7).
async fn result_groups(conn: &mut Conn, stream: &str) -> anyhow::Result<serde_json::Value> {
    let groups =
        batchd_queue::inspect::groups(conn, stream).await.with_context(|| format!("read the groups of {stream}"))?;
    serde_json::to_value(groups).context("encode groups")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, accepted_at: u64) -> JobRow {
        JobRow {
            job_id: id.into(),
            state: "running".into(),
            model: "@cf/baai/bge-m3".into(),
            n_items: Some(3),
            n_chunks: Some(1),
            accepted_at: Some(accepted_at),
            updated_at: None,
            finished_at: None,
        }
    }

    #[test]
    fn the_newest_jobs_are_kept() {
        let mut rows = vec![row("a", 1), row("b", 3), row("c", 2)];
        newest_first(&mut rows, 2);
        assert_eq!(rows.iter().map(|r| r.job_id.as_str()).collect::<Vec<_>>(), ["b", "c"]);
        let table = jobs_table(&rows);
        assert!(table.starts_with("JOB ID  STATE"), "{table}");
        assert!(table.contains("b       running          3       1  1970-01-01T00:00:00.003Z  -"), "{table}");
    }

    #[test]
    fn states_are_checked() {
        assert_eq!(parse_state("running"), Ok(JobState::Running));
        assert!(parse_state("runing").unwrap_err().contains("expected one of"));
    }
}
