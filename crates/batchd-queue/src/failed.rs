//! Failed jobs, first class: the jobs that finished without completing (`failed`, `expired`, `cancelled`),
//! grouped by error code and model, with counts and the newest examples of each group: what `batchd failed` prints
//! and the dashboard's failed-jobs page shows.
//!
//! These are not dead letters: `{ns}:dead` holds ingress entries that could not be read as a job at all; a failed
//! job was read, ran (or was refused) and has a ledger and a result entry with an error. The walk reads ledgers only
//! (never a result entry, which can hold every response of its job): one `SCAN` step of [`SCAN_COUNT`] keys, one
//! pipelined `HMGET` of their summary fields ([`crate::inspect::scan_ledgers`]), and for the matching ones their
//! error, size-checked first ([`crate::ledger_view::job_errors`]). Its cost is O(ledgers walked), capped by
//! [`FailedQuery::max_scanned`]; its memory is O(groups × examples).

use std::collections::HashMap;

use batchd_core::{JobId, JobState, Keys, UnixMillis};
use serde::{Deserialize, Serialize};

use crate::ledger_view::{ErrorFields, job_errors};
use crate::{Conn, StoreError};

/// The states of a job that finished without completing.
pub const FAILED_STATES: [JobState; 3] = [JobState::Failed, JobState::Expired, JobState::Cancelled];

/// Keys asked for per `SCAN` step.
pub const SCAN_COUNT: usize = 1000;

/// The group code of a failed job whose ledger holds no readable error code.
pub const NO_CODE: &str = "unknown";

/// Which failed jobs to list (every filter is optional). `FailedQuery::default()` lists them all, three examples per
/// group, reading at most 100,000 ledgers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedQuery {
    /// Only these states, each one of [`FAILED_STATES`] (all three when empty).
    pub states: Vec<JobState>,
    /// Only this model.
    pub model: Option<String>,
    /// Only this error code.
    pub code: Option<String>,
    /// Only jobs that finished at or after this time, Unix ms.
    pub since: Option<UnixMillis>,
    /// The newest jobs kept per group as examples.
    pub examples: usize,
    /// Most ledgers read; the walk stops there and says where to continue ([`FailedReport::next_cursor`]).
    pub max_scanned: usize,
    /// The `SCAN` cursor to start from (0: the start; a report's `next_cursor` to continue).
    pub cursor: u64,
}

impl Default for FailedQuery {
    fn default() -> Self {
        Self { states: Vec::new(), model: None, code: None, since: None, examples: 3, max_scanned: 100_000, cursor: 0 }
    }
}

/// One failed job, as an example of its group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedJob {
    /// The job id.
    pub job_id: String,
    /// How it ended: `failed`, `expired` or `cancelled`.
    pub state: String,
    /// When it finished, Unix ms.
    pub finished_at: Option<UnixMillis>,
    /// Request items.
    pub n_items: Option<u64>,
    /// Its error, field by field (`None` when its ledger holds none).
    pub error: Option<ErrorFields>,
    /// Refused before it ran (no chunks: nothing of it was stored), so `batchd retry` cannot run it again.
    #[serde(default)]
    pub refused: bool,
}

/// The failed jobs of one error code and model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedGroup {
    /// The error code (`api_error`, `retries_exhausted`, `deadline_exceeded`, `cancelled`, ...; [`NO_CODE`] when
    /// the ledger has none).
    pub code: String,
    /// The model.
    pub model: String,
    /// Failed jobs of this code and model found.
    pub count: u64,
    /// When the newest of them finished, Unix ms.
    pub newest_finished_at: Option<UnixMillis>,
    /// The newest of them, newest first (at most [`FailedQuery::examples`]).
    pub examples: Vec<FailedJob>,
}

/// The failed jobs found, grouped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedReport {
    /// The groups, the largest first (ties: the most recent first, then by code and model).
    pub groups: Vec<FailedGroup>,
    /// Failed jobs found (the sum of the groups' counts).
    pub total: u64,
    /// Ledgers read.
    pub scanned: usize,
    /// Where to continue the walk (`FailedQuery::cursor`) when it stopped at `max_scanned`; `None` when every
    /// ledger of the namespace was read.
    pub next_cursor: Option<u64>,
}

/// Lists `keys`' failed jobs that `query` asks for, grouped by error code and model (see the module's doc).
pub async fn failed_jobs(conn: &mut Conn, keys: &Keys, query: &FailedQuery) -> Result<FailedReport, StoreError> {
    let states: Vec<&str> = FAILED_STATES
        .iter()
        .filter(|state| query.states.is_empty() || query.states.contains(state))
        .map(|state| state.as_str())
        .collect();
    let mut groups: HashMap<(String, String), FailedGroup> = HashMap::new();
    let mut report = FailedReport::default();
    let mut cursor = query.cursor;
    loop {
        let step = crate::inspect::scan_ledgers(conn, keys, None, cursor, SCAN_COUNT).await?;
        report.scanned += step.scanned;
        let rows: Vec<_> = step
            .rows
            .into_iter()
            .filter(|row| states.contains(&row.state.as_str()))
            .filter(|row| query.model.as_ref().is_none_or(|model| *model == row.model))
            .filter(|row| query.since.is_none_or(|since| row.finished_at.is_some_and(|at| at >= since)))
            .filter_map(|row| Some((JobId::parse(&row.job_id).ok()?, row)))
            .collect();
        let ids: Vec<JobId> = rows.iter().map(|(id, _)| id.clone()).collect();
        let errors = job_errors(conn, keys, &ids).await?;
        for ((_, row), error) in rows.into_iter().zip(errors) {
            let code = error.as_ref().and_then(|error| error.code.clone()).unwrap_or_else(|| NO_CODE.to_owned());
            if query.code.as_ref().is_some_and(|wanted| *wanted != code) {
                continue;
            }
            let group = groups.entry((code.clone(), row.model.clone())).or_insert_with(|| FailedGroup {
                code,
                model: row.model.clone(),
                count: 0,
                newest_finished_at: None,
                examples: Vec::new(),
            });
            group.count += 1;
            group.newest_finished_at = group.newest_finished_at.max(row.finished_at);
            group.examples.push(FailedJob {
                job_id: row.job_id,
                state: row.state,
                finished_at: row.finished_at,
                n_items: row.n_items,
                error,
                refused: row.n_chunks == Some(0),
            });
            if group.examples.len() > query.examples.saturating_mul(2).max(16) {
                newest_first(&mut group.examples, query.examples);
            }
            report.total += 1;
        }
        cursor = step.next_cursor.unwrap_or(0);
        if cursor == 0 || report.scanned >= query.max_scanned {
            break;
        }
    }
    report.next_cursor = (cursor != 0).then_some(cursor);
    report.groups = groups.into_values().collect();
    for group in &mut report.groups {
        newest_first(&mut group.examples, query.examples);
    }
    report.groups.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| b.newest_finished_at.cmp(&a.newest_finished_at))
            .then_with(|| (&a.code, &a.model).cmp(&(&b.code, &b.model)))
    });
    Ok(report)
}

/// Sorts the most recently finished first (ties by id) and keeps `limit`.
fn newest_first(jobs: &mut Vec<FailedJob>, limit: usize) {
    jobs.sort_by(|a, b| b.finished_at.cmp(&a.finished_at).then_with(|| a.job_id.cmp(&b.job_id)));
    jobs.truncate(limit);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, finished_at: u64) -> FailedJob {
        FailedJob {
            job_id: id.into(),
            state: "failed".into(),
            finished_at: Some(finished_at),
            n_items: Some(1),
            error: None,
            refused: false,
        }
    }

    #[test]
    fn examples_are_the_newest() {
        let mut jobs = vec![job("a", 1), job("b", 3), job("c", 2), job("d", 3)];
        newest_first(&mut jobs, 3);
        assert_eq!(jobs.iter().map(|job| job.job_id.as_str()).collect::<Vec<_>>(), ["b", "d", "c"]);
    }

    #[test]
    fn the_failed_states_are_the_finished_ones_but_completed() {
        for state in JobState::ALL {
            assert_eq!(FAILED_STATES.contains(&state), state.is_terminal() && state != JobState::Completed, "{state}");
        }
    }
}
