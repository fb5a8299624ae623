//! `batchd retry`: re-enqueues finished jobs that ended `failed` (or `expired`, `cancelled`), chosen by id
//! (`batchd retry inv-42 inv-43`, as `batchd failed` lists them) or by filters, as new jobs.
//!
//! **By id**, each job's ledger is read ([`LedgerView`]): it must have ended `failed`, `expired` or `cancelled`.
//!
//! **Finding them, with bounded work.** Every finished job has exactly one entry in its results stream, whose id is
//! the time it was published; so `--since`/`--until` become the bounds of an `XRANGE`, read in pages of [`PAGE`]
//! entries, and the filters (status, model, error code) are applied to each entry's fields. Reading stops after
//! `--limit` matches. Nothing walks the ledgers.
//!
//! **The retry's id.** A job id is the job's identity for as long as its ledger lives (`retention.ledger_ttl_secs`
//! after it finished): an entry repeating it is acknowledged and never run. So a retry is a new job with a derived
//! id, `<id>.retry-1`, and a retry of a retry counts on (`<id>.retry-2`); see [`retry_id`]. The same derived id
//! each time makes `retry` safe to repeat: a job whose retry already has a ledger is reported and skipped, and a
//! retry enqueued twice before the daemon took it in is run once (the second entry is a duplicate).
//!
//! **The retry's body** is rebuilt from the original job's ledger: model, metadata, `reply_to`, deadline length,
//! `retry_failed_items`, and the request items stored per chunk (`c<i>:requests`), put back in request order. It is
//! checked with the daemon's own rules before it is enqueued. A job whose ledger expired, which was refused before
//! it ran, or whose request items are no longer stored is reported as not retryable (exit code 1).
//!
//! Long because one command carries the three rules above and the unit tests that pin them (a fifth of the file).

use std::collections::{HashMap, HashSet};
use std::io::IsTerminal as _;
use std::time::Duration;

use anyhow::Context as _;
use batchd_core::ledger::field;
use batchd_core::{Job, JobId, Keys};
use batchd_queue::{Conn, LedgerView};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use serde_json::json;

use super::{Exit, escape_for_terminal, format_utc, open, print_json};
use crate::settings::Settings;

/// Result entries read per `XRANGE` page. Entries of completed jobs carry every response and Redis cannot read an
/// entry's fields by name, so a page is small: what one read copies out of Redis is at most ten result entries.
const PAGE: usize = 10;

/// The statuses a finished job can be retried from.
const RETRYABLE_STATUSES: [&str; 3] = ["failed", "expired", "cancelled"];

/// The suffix of a derived retry id, before its number.
const RETRY_SUFFIX: &str = ".retry-";

/// A point in time given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeArg {
    /// Unix milliseconds.
    At(u64),
    /// This long before now (Redis's clock).
    Ago(Duration),
}

impl TimeArg {
    /// The time in Unix ms, an age counted back from `now_ms`.
    pub(crate) fn resolve(self, now_ms: u64) -> u64 {
        match self {
            Self::At(ms) => ms,
            Self::Ago(ago) => now_ms.saturating_sub(ago.as_millis() as u64),
        }
    }
}

/// Options of `batchd retry`.
#[derive(Debug, Clone, clap::Args)]
pub struct RetryArgs {
    /// Retry these jobs (as `batchd failed` lists them) instead of choosing by filters; each must have ended
    /// failed, expired or cancelled.
    #[arg(value_name = "JOB_ID", conflicts_with_all = ["status", "model", "code", "since", "until", "stream"])]
    pub ids: Vec<String>,
    /// Only jobs that ended with this status: failed, expired, cancelled (repeat for several) [default: failed].
    #[arg(long, value_name = "STATUS", value_parser = parse_status)]
    pub status: Vec<String>,
    /// Only jobs for this model (repeat for several).
    #[arg(long, value_name = "MODEL")]
    pub model: Vec<String>,
    /// Only jobs whose error has this code, e.g. api_error, retries_exhausted (repeat for several).
    #[arg(long, value_name = "CODE")]
    pub code: Vec<String>,
    /// Only jobs that finished at or after this time: 2025-11-22T08:00:00Z, 2025-11-22, Unix ms, or an age (30m,
    /// 2h, 1d).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub since: Option<TimeArg>,
    /// Only jobs that finished at or before this time (same forms as --since).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub until: Option<TimeArg>,
    /// Read this results stream (a job's `reply_to`) instead of `{ns}:results`: the full key
    /// `{ns}:results:<suffix>`, or just the suffix.
    #[arg(long, value_name = "STREAM")]
    pub stream: Option<String>,
    /// Handle at most this many matching jobs, the oldest first; run again for more.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub limit: usize,
    /// List what would be retried, and why some could not be, without enqueueing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON: the counts, and each matching job with its `retry_id` and `outcome`.
    #[arg(long)]
    pub json: bool,
}

fn parse_status(text: &str) -> Result<String, String> {
    if RETRYABLE_STATUSES.contains(&text) {
        Ok(text.to_owned())
    } else {
        Err("expected one of failed, expired, cancelled".to_owned())
    }
}

/// `2025-11-22T08:00:00Z` (seconds and fraction optional), `2025-11-22` (midnight UTC), Unix ms, or an age
/// (`90s`, `30m`, `2h`, `7d`).
pub fn parse_time(text: &str) -> Result<TimeArg, String> {
    let expected = "expected 2025-11-22T08:00:00Z, 2025-11-22, Unix milliseconds, or an age such as 30m, 2h, 1d";
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<u64>().map(TimeArg::At).map_err(|_| expected.to_owned());
    }
    if let Some(unit) = text.chars().last().filter(|c| matches!(c, 's' | 'm' | 'h' | 'd')) {
        let number = &text[..text.len() - 1];
        if !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()) {
            let n: u64 = number.parse().map_err(|_| expected.to_owned())?;
            let secs = match unit {
                's' => n,
                'm' => n.saturating_mul(60),
                'h' => n.saturating_mul(3600),
                _ => n.saturating_mul(86_400),
            };
            return Ok(TimeArg::Ago(Duration::from_secs(secs)));
        }
    }
    parse_utc(text).map(TimeArg::At).ok_or_else(|| expected.to_owned())
}

/// `YYYY-MM-DD` (midnight UTC) or an RFC 3339 UTC time `YYYY-MM-DDTHH:MM[:SS[.fff]]Z` (`T` may be a space, letters
/// any case) as Unix ms.
fn parse_utc(text: &str) -> Option<u64> {
    if !text.is_ascii() {
        return None;
    }
    let text = text.to_ascii_uppercase().replacen(' ', "T", 1);
    let full = match text.len() {
        10 => format!("{text}T00:00:00Z"),
        17 if text.ends_with('Z') => format!("{}:00Z", &text[..16]),
        _ => text,
    };
    // One zone designator, `Z` at the end: humantime reads past junk after it (`...05ZZ`).
    if !full.ends_with('Z') || full.matches(['Z', '+']).count() != 1 {
        return None;
    }
    let at = humantime::parse_rfc3339(&full).ok()?;
    Some(at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64)
}

/// The id a retry of `job_id` gets: `<id>.retry-1`, or for `<base>.retry-<n>` the next number, `<base>.retry-<n+1>`.
/// `None` when that id would not be a valid job id (too long).
pub fn retry_id(job_id: &str) -> Option<JobId> {
    let (base, n) = match job_id.rsplit_once(RETRY_SUFFIX) {
        Some((base, n)) if !base.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            (base, n.parse::<u64>().ok()?.checked_add(1)?)
        }
        _ => (job_id, 1),
    };
    JobId::parse(&format!("{base}{RETRY_SUFFIX}{n}")).ok()
}

/// What happened to one matching job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
enum Outcome {
    /// `--dry-run`: it would be retried.
    WouldRetry,
    /// Enqueued as a new job.
    Retried {
        /// The submit stream entry of the retry.
        submit_entry_id: String,
    },
    /// Its retry exists already (it has a ledger, or was enqueued earlier in this run).
    AlreadyRetried,
    /// It cannot be retried.
    NotRetryable {
        /// Why.
        reason: String,
    },
}

/// One matching job and what happened to it.
#[derive(Debug, Clone, Serialize)]
struct Matched {
    /// The job's id.
    job_id: String,
    /// The id its retry gets (`None` when that id would be too long).
    retry_id: Option<String>,
    /// How it ended.
    status: String,
    /// Its model.
    model: String,
    /// Its error's code, when it has one.
    code: Option<String>,
    /// When its result was published, Unix ms (from the entry id).
    finished_at: Option<u64>,
    /// What happened.
    #[serde(flatten)]
    outcome: Outcome,
}

/// The filters of one run, resolved.
#[derive(Debug, Clone)]
struct Filter {
    /// Statuses that match.
    statuses: Vec<String>,
    /// Models that match (any when empty).
    models: Vec<String>,
    /// Error codes that match (any when empty).
    codes: Vec<String>,
}

impl Filter {
    /// The job a result entry is about, when it matches.
    fn matches(&self, entry_id: &str, fields: &HashMap<String, String>) -> Option<Matched> {
        let status = fields.get("status")?;
        let model = fields.get("model").cloned().unwrap_or_default();
        let code = fields.get("error").and_then(|error| batchd_queue::ledger_view::ErrorFields::parse(error).code);
        let wanted = self.statuses.contains(status)
            && (self.models.is_empty() || self.models.contains(&model))
            && (self.codes.is_empty() || code.as_ref().is_some_and(|code| self.codes.contains(code)));
        if !wanted {
            return None;
        }
        let job_id = fields.get("job_id")?.clone();
        Some(Matched {
            retry_id: retry_id(&job_id).map(|id| id.to_string()),
            job_id,
            status: status.clone(),
            model,
            code,
            finished_at: batchd_producer::entry_millis(entry_id),
            outcome: Outcome::WouldRetry,
        })
    }
}

/// Progress on stderr: a spinner on a terminal (unless `NO_COLOR`), nothing otherwise (the summary follows).
struct Progress(Option<ProgressBar>);

impl Progress {
    fn new() -> Self {
        if !std::io::stderr().is_terminal() || super::no_color() {
            return Self(None);
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(ProgressStyle::with_template("{spinner} {msg}  {elapsed}").expect("valid template"));
        bar.enable_steady_tick(Duration::from_millis(120));
        Self(Some(bar))
    }

    fn update(&self, scanned: usize, matched: usize, done: usize) {
        if let Some(bar) = &self.0 {
            bar.set_message(format!("{scanned} result entries read, {matched} matching, {done} handled"));
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// `batchd retry`.
pub async fn retry(settings: &Settings, args: &RetryArgs) -> anyhow::Result<()> {
    if !args.ids.is_empty() {
        return retry_ids(settings, args).await;
    }
    let keys = settings.keys();
    let stream = super::results_stream(&keys, "--stream", args.stream.as_deref())?;
    if args.limit == 0 {
        return Err(Exit { code: super::EXIT_USAGE, message: "--limit must be at least 1".to_owned() }.into());
    }
    let mut conn = open(settings).await?;
    let now_ms = batchd_queue::inspect::redis_now(&mut conn).await.context("read Redis's clock")?;
    let since = args.since.map(|time| time.resolve(now_ms));
    let until = args.until.map(|time| time.resolve(now_ms));
    if let (Some(since), Some(until)) = (since, until)
        && since > until
    {
        return Err(Exit {
            code: super::EXIT_USAGE,
            message: format!("--since {} is after --until {}", format_utc(since), format_utc(until)),
        }
        .into());
    }
    let filter = Filter {
        statuses: if args.status.is_empty() { vec!["failed".to_owned()] } else { args.status.clone() },
        models: args.model.clone(),
        codes: args.code.clone(),
    };
    let progress = Progress::new();
    let mut start = since.map_or_else(|| "-".to_owned(), |ms| ms.to_string());
    let end = until.map_or_else(|| "+".to_owned(), |ms| ms.to_string());
    let (mut scanned, mut capped) = (0usize, false);
    let mut matched: Vec<Matched> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let limits = settings.job_limits();
    'pages: loop {
        let entries: batchd_queue::inspect::Entries<String> =
            batchd_queue::inspect::entries(&mut conn, &stream, &start, &end, PAGE, false)
                .await
                .with_context(|| format!("read {stream}"))?;
        let full_page = entries.len() == PAGE;
        let mut page: Vec<Matched> = Vec::new();
        for (entry_id, fields) in &entries {
            scanned += 1;
            start = format!("({entry_id}");
            if let Some(job) = filter.matches(entry_id, fields) {
                if matched.len() + page.len() == args.limit {
                    capped = true;
                    break;
                }
                page.push(job);
            }
        }
        for mut job in page {
            job.outcome = handle(&mut conn, &keys, &limits, &job, args.dry_run, &mut seen).await?;
            matched.push(job);
            progress.update(scanned, matched.len(), matched.len());
        }
        progress.update(scanned, matched.len(), matched.len());
        if capped || !full_page {
            break 'pages;
        }
    }
    progress.finish();
    let walk = Walk { stream: &stream, since, until, scanned, capped };
    report(&super::place(settings), &keys, args, Some(walk), &matched)
}

/// `batchd retry <id>...`: each job's ledger says whether it can be retried.
async fn retry_ids(settings: &Settings, args: &RetryArgs) -> anyhow::Result<()> {
    let job_ids = args.ids.iter().map(|id| super::parse_job_id(id)).collect::<anyhow::Result<Vec<JobId>>>()?;
    let keys = settings.keys();
    let mut conn = open(settings).await?;
    let limits = settings.job_limits();
    let mut seen: HashSet<String> = HashSet::new();
    let mut matched = Vec::with_capacity(job_ids.len());
    for job_id in job_ids {
        let view = LedgerView::read(&mut conn, &keys, &job_id)
            .await
            .with_context(|| format!("read the ledger of {job_id}"))?;
        let mut job = Matched {
            job_id: job_id.to_string(),
            retry_id: retry_id(job_id.as_str()).map(|id| id.to_string()),
            status: view.as_ref().and_then(|view| view.get(field::STATE)).unwrap_or("-").to_owned(),
            model: view.as_ref().and_then(|view| view.get(field::MODEL)).unwrap_or_default().to_owned(),
            code: view.as_ref().and_then(LedgerView::error).and_then(|error| error.code),
            finished_at: view.as_ref().and_then(|view| view.number(field::FINISHED_AT)),
            outcome: Outcome::WouldRetry,
        };
        job.outcome = match view.as_ref().map(LedgerView::state) {
            None => Outcome::NotRetryable {
                reason: "it has no ledger (never taken in, or its ledger expired: retention.ledger_ttl_secs)".into(),
            },
            Some(Some(state)) if batchd_queue::failed::FAILED_STATES.contains(&state) => {
                handle(&mut conn, &keys, &limits, &job, args.dry_run, &mut seen).await?
            }
            Some(state) => Outcome::NotRetryable {
                reason: format!(
                    "it is {}; only a job that ended failed, expired or cancelled is retried",
                    state.map_or("in an unknown state", |state| state.as_str())
                ),
            },
        };
        matched.push(job);
    }
    report(&super::place(settings), &keys, args, None, &matched)
}

/// What a run by filters read.
#[derive(Debug, Clone, Copy)]
struct Walk<'a> {
    /// The results stream read.
    stream: &'a str,
    /// Its start, Unix ms.
    since: Option<u64>,
    /// Its end, Unix ms.
    until: Option<u64>,
    /// Result entries read.
    scanned: usize,
    /// Whether reading stopped at `--limit`.
    capped: bool,
}

/// Checks one matching job and, unless `dry_run`, enqueues its retry.
async fn handle(
    conn: &mut Conn,
    keys: &Keys,
    limits: &batchd_core::JobLimits,
    job: &Matched,
    dry_run: bool,
    seen: &mut HashSet<String>,
) -> anyhow::Result<Outcome> {
    let not_retryable = |reason: &str| Ok(Outcome::NotRetryable { reason: reason.to_owned() });
    let Some(retry_id) = job.retry_id.as_deref().and_then(|id| JobId::parse(id).ok()) else {
        return not_retryable("its id is too long to derive a retry id from");
    };
    let Ok(job_id) = JobId::parse(&job.job_id) else { return not_retryable("its id is not a valid job id") };
    if !seen.insert(retry_id.to_string()) {
        return Ok(Outcome::AlreadyRetried);
    }
    let check = batchd_queue::ledger_view::rerun_check(conn, keys, &job_id, &retry_id)
        .await
        .with_context(|| format!("read the ledgers of {job_id} and {retry_id}"))?;
    let batchd_queue::ledger_view::RerunCheck { retry_exists, exists, n_chunks, has_requests } = check;
    if retry_exists {
        return Ok(Outcome::AlreadyRetried);
    }
    if !exists {
        return not_retryable("its ledger expired (retention.ledger_ttl_secs), and its request items with it");
    }
    if n_chunks == 0 {
        return not_retryable("it was refused before it ran (nothing of it was stored); fix it and enqueue it again");
    }
    if !has_requests {
        return not_retryable(
            "its request items are no longer stored (a finished job's ledger keeps only its timeline)",
        );
    }
    let Some(mut view) =
        LedgerView::read(conn, keys, &job_id).await.with_context(|| format!("read the ledger of {job_id}"))?
    else {
        return not_retryable("its ledger expired (retention.ledger_ttl_secs), and its request items with it");
    };
    if view.metadata_bytes.is_some() {
        // A view leaves a large metadata out; the retry carries it over whole.
        let metadata = batchd_queue::ledger_view::job_metadata(conn, keys, &job_id)
            .await
            .with_context(|| format!("read the metadata of {job_id}"))?;
        view.header.extend(metadata.map(|metadata| (field::METADATA, metadata)));
    }
    // The items, one chunk per command: Redis never holds more than one chunk's for this reader.
    let mut requests = Vec::with_capacity(view.chunks.len());
    for index in 0..view.chunks.len() as u32 {
        let stored = batchd_queue::ledger_view::chunk_requests(conn, keys, &job_id, index)
            .await
            .with_context(|| format!("read the items of {job_id}"))?;
        requests.push(stored);
    }
    let text = match batchd_queue::rerun::rebuild_job(&view, &requests, &retry_id, keys) {
        Ok(text) => text,
        Err(reason) => return not_retryable(&reason),
    };
    if let Err(error) = Job::decode_json(&text, "0-0", limits, keys) {
        return not_retryable(&format!("its retry would be refused: {error}"));
    }
    if dry_run {
        return Ok(Outcome::WouldRetry);
    }
    let submit_entry_id = batchd_queue::inspect::enqueue(conn, keys, text.as_bytes())
        .await
        .with_context(|| format!("enqueue the retry of {job_id}"))?;
    Ok(Outcome::Retried { submit_entry_id })
}

/// Prints the jobs and the summary (`walk`: what a run by filters read; `None` for a run by ids); exit code 1 when a
/// job could not be retried (not in a dry run).
fn report(place: &str, keys: &Keys, args: &RetryArgs, walk: Option<Walk>, matched: &[Matched]) -> anyhow::Result<()> {
    let count = |wanted: fn(&Outcome) -> bool| matched.iter().filter(|job| wanted(&job.outcome)).count();
    let retryable = count(|o| matches!(o, Outcome::WouldRetry | Outcome::Retried { .. }));
    let already = count(|o| matches!(o, Outcome::AlreadyRetried));
    let failed = count(|o| matches!(o, Outcome::NotRetryable { .. }));
    if args.json {
        print_json(&json!({
            "namespace": keys.namespace(),
            "stream": walk.map(|walk| walk.stream),
            "dry_run": args.dry_run,
            "since": walk.and_then(|walk| walk.since),
            "until": walk.and_then(|walk| walk.until),
            "scanned": walk.map_or(matched.len(), |walk| walk.scanned),
            "matched": matched.len(),
            "capped": walk.is_some_and(|walk| walk.capped),
            "retried": if args.dry_run { 0 } else { retryable },
            "would_retry": if args.dry_run { retryable } else { 0 },
            "already_retried": already,
            "not_retryable": failed,
            "jobs": matched,
        }))?;
    } else {
        for job in matched {
            println!("{}", job_line(job));
        }
        let verb = if args.dry_run { "would retry" } else { "retried" };
        let counts = format!("({already} already retried, {failed} not retryable)");
        match walk {
            None => println!("{verb} {retryable} of {} jobs {counts}; {place}", matched.len()),
            Some(walk) => {
                let range = match (walk.since, walk.until) {
                    (None, None) => "all of it".to_owned(),
                    (since, until) => format!(
                        "{} to {}",
                        since.map_or_else(|| "the start".to_owned(), format_utc),
                        until.map_or_else(|| "now".to_owned(), format_utc)
                    ),
                };
                println!(
                    "{verb} {retryable} of {} matching jobs {counts}; {} result entries read from {} ({range}; {place}){}",
                    matched.len(),
                    walk.scanned,
                    walk.stream,
                    if walk.capped { "; stopped at --limit, run again for more" } else { "" }
                );
            }
        }
    }
    if failed > 0 && !args.dry_run {
        let which = if walk.is_some() { "matching jobs" } else { "jobs" };
        return Err(Exit { code: 1, message: format!("{failed} {which} could not be retried (listed above)") }.into());
    }
    Ok(())
}

/// `would retry  inv-42 -> inv-42.retry-1  failed  api_error  @cf/x/y  2025-11-22T00:00:05.250Z`, escaped.
fn job_line(job: &Matched) -> String {
    let what = match &job.outcome {
        Outcome::WouldRetry => "would retry".to_owned(),
        Outcome::Retried { .. } => "retried".to_owned(),
        Outcome::AlreadyRetried => "already retried".to_owned(),
        Outcome::NotRetryable { .. } => "not retryable".to_owned(),
    };
    let mut line = format!(
        "{what:<15}  {} -> {}  {}  {}  {}  {}",
        job.job_id,
        job.retry_id.as_deref().unwrap_or("-"),
        job.status,
        job.code.as_deref().unwrap_or("-"),
        job.model,
        job.finished_at.map_or_else(|| "-".to_owned(), format_utc)
    );
    match &job.outcome {
        Outcome::Retried { submit_entry_id } => line.push_str(&format!("  (submit entry {submit_entry_id})")),
        Outcome::NotRetryable { reason } => line.push_str(&format!(": {reason}")),
        _ => {}
    }
    escape_for_terminal(&line).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_ids_count_on_from_the_original() {
        assert_eq!(retry_id("inv-42").unwrap().as_str(), "inv-42.retry-1");
        assert_eq!(retry_id("inv-42.retry-1").unwrap().as_str(), "inv-42.retry-2");
        assert_eq!(retry_id("inv-42.retry-9").unwrap().as_str(), "inv-42.retry-10");
        assert_eq!(retry_id("a.retry-x").unwrap().as_str(), "a.retry-x.retry-1");
        assert_eq!(retry_id(".retry-1").unwrap().as_str(), ".retry-1.retry-1");
        assert_eq!(retry_id("1763769605250-0").unwrap().as_str(), "1763769605250-0.retry-1");
        assert!(retry_id(&"x".repeat(195)).is_none(), "past the 200-character limit");
    }

    #[test]
    fn times_are_absolute_or_ages() {
        assert_eq!(parse_time("2025-11-22T00:00:05.250Z"), Ok(TimeArg::At(1_763_769_605_250)));
        assert_eq!(parse_time("2025-11-22T00:00Z"), Ok(TimeArg::At(1_763_769_600_000)));
        assert_eq!(parse_time("2025-11-22"), Ok(TimeArg::At(1_763_769_600_000)));
        assert_eq!(parse_time("2000-02-29T12:00:00Z"), Ok(TimeArg::At(951_825_600_000)));
        assert_eq!(parse_time("1763769600000"), Ok(TimeArg::At(1_763_769_600_000)));
        assert_eq!(parse_time("30m"), Ok(TimeArg::Ago(Duration::from_secs(1800))));
        assert_eq!(parse_time("2d"), Ok(TimeArg::Ago(Duration::from_secs(172_800))));
        assert_eq!(parse_time("2025-11-22 00:00:05.25z"), Ok(TimeArg::At(1_763_769_605_250)));
        for bad in [
            "",
            "yesterday",
            "2025-13-01",
            "2025-02-30",
            "1969-12-31",
            "2025-11-22T25:00Z",
            "2025-11-22T10:00",
            "2025-11-22T00:00:05+00:00",
            "2025-11-22T00:00:05ZZ",
            "2025-11-22T10:00é",
            "m",
            "-5m",
            "1.5h",
        ] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
        assert_eq!(TimeArg::Ago(Duration::from_secs(2)).resolve(5_000), 3_000);
        for ms in [0, 951_782_400_000, 1_763_769_605_250] {
            let shown = format_utc(ms);
            assert_eq!(parse_time(&shown), Ok(TimeArg::At(ms)), "{shown} reads back");
        }
    }

    fn ledger(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// A stored ledger as the retry reads it: its view and each chunk's stored items.
    fn rebuild(stored: &HashMap<String, String>, id: &JobId, keys: &Keys) -> Result<String, String> {
        let header =
            field::JOB_FIELDS.iter().filter_map(|(_, name)| Some((*name, stored.get(*name)?.clone()))).collect();
        let n_chunks: u32 = stored.get(field::N_CHUNKS).and_then(|n| n.parse().ok()).unwrap_or(0);
        let chunks = (0..n_chunks)
            .map(|index| batchd_queue::ledger_view::ChunkMetadata {
                fields: batchd_queue::ledger_view::chunk_metadata()
                    .filter_map(|name| Some((name, stored.get(&field::chunk(index, name))?.clone())))
                    .collect(),
            })
            .collect();
        let requests: Vec<Option<String>> =
            (0..n_chunks).map(|index| stored.get(&format!("c{index}:requests")).cloned()).collect();
        let view = LedgerView { job_id: JobId::parse("j").unwrap(), header, metadata_bytes: None, chunks };
        batchd_queue::rerun::rebuild_job(&view, &requests, id, keys)
    }

    #[test]
    fn a_retry_is_rebuilt_in_request_order_from_its_chunks() {
        let keys = Keys::new("ns").unwrap();
        let id = JobId::parse("j.retry-1").unwrap();
        let stored = ledger(&[
            ("model", "@cf/baai/bge-m3"),
            ("n_items", "4"),
            ("n_chunks", "3"),
            ("accepted_at", "1000"),
            ("deadline_at", "61000"),
            ("reply_to", "{ns}:results:billing"),
            ("metadata", r#"{"tenant":"acme"}"#),
            ("retry_failed_items", "1"),
            ("c0:items", "0:2"),
            ("c0:requests", r#"[{"text":"a"},{"text":"b"}]"#),
            ("c1:items", "2:2"),
            ("c1:requests", r#"[{"text":"c"}, {"text":"d"}]"#),
            // The failed-items retry chunk repeats item 1; the first copy is kept.
            ("c2:items", "0:1"),
            ("c2:indices", "[1]"),
            ("c2:requests", r#"[{"text":"b"}]"#),
        ]);
        let text = rebuild(&stored, &id, &keys).unwrap();
        assert_eq!(
            text,
            r#"{"id":"j.retry-1","model":"@cf/baai/bge-m3","requests":[{"text":"a"},{"text":"b"},{"text":"c"},{"text":"d"}],"reply_to":"{ns}:results:billing","metadata":{"tenant":"acme"},"deadline_secs":60,"retry_failed_items":true}"#
        );
        let job = Job::decode_json(&text, "0-0", &batchd_core::JobLimits::default(), &keys).unwrap();
        assert_eq!(job.requests.len(), 4);

        let mut default_stream = stored.clone();
        default_stream.insert("reply_to".into(), "{ns}:results".into());
        assert!(!rebuild(&default_stream, &id, &keys).unwrap().contains("reply_to"));
        let mut finished = stored.clone();
        finished.remove("c1:requests");
        assert!(rebuild(&finished, &id, &keys).unwrap_err().contains("no longer stored"));
        let refused = ledger(&[("model", "@cf/x/y"), ("n_items", "0"), ("state", "failed")]);
        assert!(rebuild(&refused, &id, &keys).unwrap_err().contains("refused before it ran"));
        let mut short = stored.clone();
        short.insert("c1:requests".into(), r#"[{"text":"c"}]"#.into());
        assert!(rebuild(&short, &id, &keys).unwrap_err().contains("holds 1 requests for 2 items"));
    }

    #[test]
    fn filters_choose_by_status_model_and_code() {
        let filter =
            Filter { statuses: vec!["failed".into()], models: vec!["@cf/a/b".into()], codes: vec!["api_error".into()] };
        let entry = |status: &str, model: &str, code: &str| -> HashMap<String, String> {
            ledger(&[
                ("job_id", "j"),
                ("status", status),
                ("model", model),
                ("error", &format!(r#"{{"code":"{code}","message":"m"}}"#)),
            ])
        };
        let hit = filter.matches("1763769605250-0", &entry("failed", "@cf/a/b", "api_error")).unwrap();
        assert_eq!((hit.retry_id.as_deref(), hit.finished_at), (Some("j.retry-1"), Some(1_763_769_605_250)));
        assert!(filter.matches("1-0", &entry("completed", "@cf/a/b", "api_error")).is_none());
        assert!(filter.matches("1-0", &entry("failed", "@cf/a/c", "api_error")).is_none());
        assert!(filter.matches("1-0", &entry("failed", "@cf/a/b", "invalid_job")).is_none());
        let any = Filter { statuses: vec!["failed".into(), "expired".into()], models: vec![], codes: vec![] };
        assert!(any.matches("1-0", &entry("expired", "@cf/z/z", "deadline")).is_some());
    }

    #[test]
    fn a_job_line_is_escaped() {
        let job = Matched {
            job_id: "j".into(),
            retry_id: Some("j.retry-1".into()),
            status: "failed".into(),
            model: "@cf/a/b".into(),
            code: Some("api_error".into()),
            finished_at: Some(0),
            outcome: Outcome::NotRetryable { reason: "bad\u{1b}[2J".into() },
        };
        assert_eq!(
            job_line(&job),
            "not retryable    j -> j.retry-1  failed  api_error  @cf/a/b  1970-01-01T00:00:00.000Z: bad\\x1b[2J"
        );
    }
}
