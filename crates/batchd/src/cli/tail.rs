//! `batchd tail`: follows a results stream with plain `XREAD` (no consumer group, so it never takes results away
//! from the applications that read them), from now or from the start, one line per result entry. Entries carry
//! producer input (job ids, metadata) and API text (error messages): lines are escaped, JSON made terminal-safe.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use batchd_queue::Conn;

use super::{EXIT_WAIT_TIMEOUT, Exit, escape_for_terminal, format_utc, json_text, open, result_json};
use crate::settings::Settings;

/// Longest wait of one `XREAD` (the loop re-checks `--timeout` between reads).
const BLOCK: Duration = Duration::from_millis(1000);

/// Entries read at once.
const BATCH: usize = 100;

/// Options of `batchd tail`.
#[derive(Debug, Clone, clap::Args)]
pub struct TailArgs {
    /// Start at the first entry the stream still holds, instead of at new entries only.
    #[arg(long, conflicts_with = "from")]
    pub from_start: bool,
    /// Start at this entry (its id, as `batchd status --json` gives it in `result_entry`), instead of at new
    /// entries only; with --count 1, print just that entry.
    #[arg(long, value_name = "ENTRY_ID", value_parser = parse_entry_id)]
    pub from: Option<EntryId>,
    /// Stop after this many entries.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Follow this results stream (a job's `reply_to`) instead of `{ns}:results`: the full key
    /// `{ns}:results:<suffix>`, or just the suffix.
    #[arg(long, value_name = "STREAM")]
    pub stream: Option<String>,
    /// Stop after this many seconds (exit code 4 if --count entries were not seen by then).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Print each entry as one JSON object per line (`entry_id` plus the entry's fields, JSON fields decoded).
    #[arg(long)]
    pub json: bool,
}

/// `batchd tail`.
pub async fn tail(settings: &Settings, args: &TailArgs) -> anyhow::Result<()> {
    let keys = settings.keys();
    let stream = super::results_stream(&keys, "--stream", args.stream.as_deref())?;
    let mut conn = open(settings).await?;
    let mut last_id = match (&args.from, args.from_start) {
        (Some(from), _) => from.before(),
        (None, true) => "0-0".to_owned(),
        (None, false) => last_entry_id(&mut conn, &stream).await?,
    };
    let start = match (&args.from, args.from_start) {
        (Some(from), _) => format!("from entry {from}"),
        (None, true) => "from the start".to_owned(),
        (None, false) => format!("from now (after {last_id})"),
    };
    eprintln!("following {stream} on {} {start}", settings.redis_label());
    let started = Instant::now();
    let timeout = args.timeout.map(Duration::from_secs);
    let mut seen = 0u64;
    loop {
        if args.count.is_some_and(|count| seen >= count) {
            return Ok(());
        }
        if let Some(timeout) = timeout.filter(|timeout| started.elapsed() >= *timeout) {
            return match args.count {
                Some(count) => Err(Exit {
                    code: EXIT_WAIT_TIMEOUT,
                    message: format!("gave up after {}s with {seen} of {count} entries", timeout.as_secs()),
                }
                .into()),
                None => Ok(()),
            };
        }
        let want = args.count.map_or(BATCH as u64, |count| (count - seen).min(BATCH as u64));
        let block = timeout
            .map_or(BLOCK, |timeout| timeout.saturating_sub(started.elapsed()).clamp(Duration::from_millis(1), BLOCK));
        let entries = batchd_queue::results::read_after(&mut conn, &stream, &last_id, want, block)
            .await
            .with_context(|| format!("read {stream}"))?;
        for (entry_id, fields) in entries {
            if args.json {
                let mut object = result_json(&fields);
                object["entry_id"] = entry_id.clone().into();
                println!("{}", json_text(&object, false)?);
            } else {
                println!("{}", entry_line(&entry_id, &fields));
            }
            last_id = entry_id;
            seen += 1;
        }
    }
}

/// A stream entry id, `<ms>-<seq>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryId {
    /// The milliseconds part.
    pub ms: u64,
    /// The sequence number within that millisecond.
    pub seq: u64,
}

impl EntryId {
    /// The greatest id before this one (what `XREAD` reads after, to read this entry first); `0-0` for the first.
    fn before(self) -> String {
        match (self.ms, self.seq) {
            (ms, 0) if ms > 0 => format!("{}-{}", ms - 1, u64::MAX),
            (ms, 0) => format!("{ms}-0"),
            (ms, seq) => format!("{ms}-{}", seq - 1),
        }
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// Parses a whole stream entry id, `<ms>-<seq>` (both parts, digits only).
pub fn parse_entry_id(text: &str) -> Result<EntryId, String> {
    let (ms, seq) = text.split_once('-').ok_or_else(|| format!("{text:?} is not an entry id (<ms>-<seq>)"))?;
    let part = |part: &str| {
        part.parse::<u64>()
            .ok()
            .filter(|_| part.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| format!("{text:?} is not an entry id (<ms>-<seq>)"))
    };
    Ok(EntryId { ms: part(ms)?, seq: part(seq)? })
}

/// The id of the stream's last entry, `0-0` when it is empty or missing.
async fn last_entry_id(conn: &mut Conn, stream: &str) -> anyhow::Result<String> {
    let last: batchd_queue::inspect::Entries<String> = batchd_queue::inspect::entries(conn, stream, "-", "+", 1, true)
        .await
        .with_context(|| format!("read {stream}"))?;
    Ok(last.into_iter().next().map_or_else(|| "0-0".to_owned(), |(id, _)| id))
}

/// `2025-11-22T00:00:05.250Z  inv-42  completed  3 items, 0 failed  @cf/baai/bge-m3` (plus the error when there is
/// one): when the result was published, from the entry id. Control and bidi characters are escaped.
pub fn entry_line(entry_id: &str, fields: &HashMap<String, String>) -> String {
    let get = |name: &str| fields.get(name).map(String::as_str).unwrap_or("-");
    let published = batchd_producer::entry_millis(entry_id).map_or_else(|| entry_id.to_owned(), format_utc);
    let mut line = format!(
        "{published}  {}  {}  {} items, {} failed  {}",
        get("job_id"),
        get("status"),
        get("items_total"),
        get("items_failed"),
        get("model")
    );
    if let Some(error) = fields.get("error") {
        let error = batchd_queue::ledger_view::ErrorFields::parse(error);
        let code = error.code.as_deref().unwrap_or("error");
        line.push_str(&format!("  {code}: {}", error.message.as_deref().unwrap_or_default()));
    }
    escape_for_terminal(&line).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_id_is_read_whole_and_tail_reads_after_the_one_before() {
        let id = parse_entry_id("1763769605250-3").unwrap();
        assert_eq!(id, EntryId { ms: 1_763_769_605_250, seq: 3 });
        assert_eq!(id.to_string(), "1763769605250-3");
        assert_eq!(id.before(), "1763769605250-2");
        assert_eq!(parse_entry_id("1763769605250-0").unwrap().before(), format!("1763769605249-{}", u64::MAX));
        assert_eq!(parse_entry_id("0-1").unwrap().before(), "0-0");
        assert_eq!(parse_entry_id("0-0").unwrap().before(), "0-0");
        for bad in ["", "5", "5-", "-5", "5-x", "+5-1", "5-1-2", "$", "99999999999999999999-0"] {
            assert!(parse_entry_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_entry_reads_as_one_line() {
        let fields: HashMap<String, String> = [
            ("job_id", "inv-42"),
            ("status", "failed"),
            ("items_total", "2"),
            ("items_failed", "2"),
            ("model", "@cf/x/y"),
            ("error", r#"{"code":"invalid_job","message":"invalid `model`: is missing"}"#),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            entry_line("1763769605250-0", &fields),
            "2025-11-22T00:00:05.250Z  inv-42  failed  2 items, 2 failed  @cf/x/y  invalid_job: invalid `model`: is missing"
        );
    }

    #[test]
    fn control_characters_in_an_entry_are_shown_escaped() {
        // The message is JSON inside the entry: its `\u001b` decodes to a raw ESC, which must not be printed.
        let fields: HashMap<String, String> = [
            ("job_id", "x\u{1b}[2Jy"),
            ("status", "failed"),
            ("error", r#"{"code":"invalid_entry","message":"bad \u001b]0;title\u0007 \u202eevil\r"}"#),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let line = entry_line("1763769605250-0", &fields);
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains("x\\x1b[2Jy") && line.contains("bad \\x1b]0;title\\x07 \\u{202e}evil\\r"), "{line}");
    }
}
