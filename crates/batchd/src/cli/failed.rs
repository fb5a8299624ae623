//! `batchd failed`: the jobs that finished without completing (`failed`, `expired`, `cancelled`), grouped by error
//! code and model, with counts and the newest examples of each group ([`batchd_queue::failed::failed_jobs`], which
//! the dashboard's failed-jobs page shows too). `batchd retry <id>...` runs chosen ones again.
//!
//! Not to be confused with `batchd dead`: a dead letter is an ingress entry that could not be read as a job at
//! all; a failed job was read and has a ledger and a result entry with its error. Every id, model, code and
//! message is a producer's or an API's text: printed escaped.

use anyhow::Context as _;
use batchd_core::JobState;
use batchd_queue::failed::{FAILED_STATES, FailedJob, FailedQuery, FailedReport};
use serde_json::json;

use super::retry::{TimeArg, parse_time};
use super::{escape_for_terminal, format_utc, open, print_json};
use crate::settings::Settings;

/// Options of `batchd failed`.
#[derive(Debug, Clone, clap::Args)]
pub struct FailedArgs {
    /// Only jobs that ended in this state: failed, expired, cancelled (repeat for several) [default: all three].
    #[arg(long, value_name = "STATE", value_parser = parse_failed_state)]
    pub state: Vec<JobState>,
    /// Only jobs for this model.
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// Only jobs whose error has this code, e.g. api_error, retries_exhausted.
    #[arg(long, value_name = "CODE")]
    pub code: Option<String>,
    /// Only jobs that finished at or after this time: 2025-11-22T08:00:00Z, 2025-11-22, Unix ms, or an age (30m,
    /// 2h, 1d).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub since: Option<TimeArg>,
    /// The newest jobs shown per group.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub examples: usize,
    /// Read at most this many ledgers (the walk is O(ledgers); it says when it stopped early).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub max_scanned: usize,
    /// Print JSON: the groups (code, model, count, the newest examples with their error's fields), the total,
    /// the ledgers read and where to continue (docs/cli.md, "JSON output").
    #[arg(long)]
    pub json: bool,
}

fn parse_failed_state(text: &str) -> Result<JobState, String> {
    text.parse::<JobState>()
        .ok()
        .filter(|state| FAILED_STATES.contains(state))
        .ok_or_else(|| "expected one of failed, expired, cancelled".to_owned())
}

/// `batchd failed`.
pub async fn failed(settings: &Settings, args: &FailedArgs) -> anyhow::Result<()> {
    let keys = settings.keys();
    let mut conn = open(settings).await?;
    let since = match args.since {
        Some(TimeArg::At(ms)) => Some(ms),
        Some(ago) => {
            let now = batchd_queue::inspect::redis_now(&mut conn).await.context("read Redis's clock")?;
            Some(ago.resolve(now))
        }
        None => None,
    };
    let query = FailedQuery {
        states: args.state.clone(),
        model: args.model.clone(),
        code: args.code.clone(),
        since,
        examples: args.examples,
        max_scanned: args.max_scanned.max(1),
        cursor: 0,
    };
    let report = batchd_queue::failed::failed_jobs(&mut conn, &keys, &query).await.context("read ledgers")?;
    if args.json {
        let mut value = serde_json::to_value(&report).context("encode the report")?;
        value["namespace"] = json!(keys.namespace());
        return print_json(&value);
    }
    print!("{}", failed_text(&super::place(settings), &report));
    Ok(())
}

/// The report for people: a summary line naming where it read, one line per group (count, code, model, newest),
/// its examples below it, and how to go on.
fn failed_text(place: &str, report: &FailedReport) -> String {
    let mut out = format!(
        "{place}: {} jobs ended without completing (failed, expired or cancelled), in {} groups by error code and \
         model; {} ledgers read\n",
        report.total,
        report.groups.len(),
        report.scanned
    );
    let code_width = report.groups.iter().map(|g| escape_for_terminal(&g.code).chars().count()).max().unwrap_or(0);
    let model_width = report.groups.iter().map(|g| escape_for_terminal(&g.model).chars().count()).max().unwrap_or(0);
    for group in &report.groups {
        out.push_str(&format!(
            "{:>7}  {:<code_width$}  {:<model_width$}  newest {}\n",
            group.count,
            escape_for_terminal(&group.code),
            escape_for_terminal(if group.model.is_empty() { "-" } else { &group.model }),
            group.newest_finished_at.map_or_else(|| "-".to_owned(), format_utc)
        ));
        for job in &group.examples {
            out.push_str(&format!("           {}\n", example_line(job)));
        }
    }
    if report.next_cursor.is_some() {
        out.push_str("stopped at --max-scanned ledgers: the counts above are of the ledgers read, not all of them\n");
    }
    if report.total > 0 {
        out.push_str(
            "run one again with `batchd retry <job id>...` (not one refused before it ran), or all of a kind with \
             `batchd retry --code <code> --model <model>`\n",
        );
    }
    out
}

/// `tok-2  failed  2025-11-22T00:00:05.250Z  http 401  api code 10000: message`, escaped.
fn example_line(job: &FailedJob) -> String {
    let mut line =
        format!("{}  {}  {}", job.job_id, job.state, job.finished_at.map_or_else(|| "-".to_owned(), format_utc));
    if let Some(error) = &job.error {
        if let Some(status) = error.http_status {
            line.push_str(&format!("  http {status}"));
        }
        if let Some(code) = &error.api_code {
            line.push_str(&format!("  api code {code}"));
        }
        if let Some(message) = &error.message {
            line.push_str(&format!(": {message}"));
        }
    }
    if job.refused {
        line.push_str("  (refused before it ran: not retryable; after the fix, enqueue it again under a new id)");
    }
    escape_for_terminal(&line).into_owned()
}

#[cfg(test)]
mod tests {
    use batchd_queue::failed::FailedGroup;
    use batchd_queue::ledger_view::ErrorFields;

    use super::*;

    #[test]
    fn only_the_failed_states_are_accepted() {
        assert_eq!(parse_failed_state("expired"), Ok(JobState::Expired));
        assert!(parse_failed_state("completed").unwrap_err().contains("failed, expired, cancelled"));
    }

    #[test]
    fn groups_read_as_a_table_with_their_examples_escaped() {
        let job = FailedJob {
            job_id: "tok-2".into(),
            state: "failed".into(),
            finished_at: Some(0),
            n_items: Some(2),
            error: Some(ErrorFields {
                code: Some("api_error".into()),
                message: Some("bad\u{1b}[2J".into()),
                api_code: Some("10000".into()),
                http_status: Some(401),
            }),
            refused: false,
        };
        let refused = FailedJob {
            job_id: "oa-1".into(),
            error: Some(ErrorFields { message: Some("no openai".into()), ..Default::default() }),
            refused: true,
            ..job.clone()
        };
        let report = FailedReport {
            groups: vec![FailedGroup {
                code: "api_error".into(),
                model: "@cf/baai/bge-m3".into(),
                count: 2,
                newest_finished_at: Some(0),
                examples: vec![job, refused],
            }],
            total: 2,
            scanned: 7,
            next_cursor: None,
        };
        let text = failed_text("namespace ns on redis://h:1", &report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("namespace ns on redis://h:1: 2 jobs ended without completing"), "{text}");
        assert_eq!(lines[1], "      2  api_error  @cf/baai/bge-m3  newest 1970-01-01T00:00:00.000Z");
        assert_eq!(
            lines[2],
            "           tok-2  failed  1970-01-01T00:00:00.000Z  http 401  api code 10000: bad\\x1b[2J"
        );
        assert_eq!(
            lines[3],
            "           oa-1  failed  1970-01-01T00:00:00.000Z: no openai  (refused before it ran: not retryable; after \
             the fix, enqueue it again under a new id)"
        );
    }
}
