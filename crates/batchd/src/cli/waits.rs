//! What a job that is not running yet waits for, and until when (`batchd status`): a chunk waiting in its packing
//! queue waits for its packing key's next pack (`{ns}:packers`); a chunk waiting to be submitted waits for its due
//! time in the schedule (`{ns}:schedule`), which the daemon moves on when the provider's rate limit or calls in
//! flight hold it (`batchd_throttled_waits_total`) or the provider answered a submit with a rate limit, or the
//! namespace's daily budget holds it (`[budget]`). Read with one pipelined round trip of `ZSCORE`s
//! ([`inspect::due_times`]), at most one per chunk of the job (`MAX_CHUNKS_PER_JOB`), and with a budget one more of
//! the day's counters.

use std::time::Duration;

use anyhow::Context as _;
use batchd_core::ledger::{ChunkState, field};
use batchd_core::{Keys, ids};
use batchd_queue::ledger_view::ChunkMetadata;
use batchd_queue::{Conn, LedgerView, inspect};

use super::{format_age, format_utc};

/// The due times that say what a job waits for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Waits {
    /// Each chunk's due time in the schedule (Unix ms), for the chunks waiting to be submitted; `None` for the
    /// others and for a chunk not scheduled.
    pub chunks: Vec<Option<u64>>,
    /// When the job's packing key is next due to send a pack (Unix ms), if one of its chunks waits in that queue.
    pub pack_due: Option<u64>,
    /// The namespace's daily budget, when it is reached and the job has chunks waiting to be submitted.
    pub budget: Option<BudgetHold>,
}

/// A daily budget that holds new submits (`[budget]`, `batchd_engine::spend`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetHold {
    /// Until when: the next UTC midnight (Unix ms).
    pub until: u64,
    /// What the namespace's finished jobs cost today, nano-dollars.
    pub spent_nano: u64,
    /// The budget, nano-dollars.
    pub limit_nano: u64,
}

/// Whether a chunk waits to be submitted (not packed, not at the remote API).
fn waits_for_submit(chunk: &ChunkMetadata) -> bool {
    let waiting = matches!(chunk.state(), Some(ChunkState::Pending | ChunkState::Submitting));
    waiting && chunk.get(field::CHUNK_REQUEST_ID).is_none() && chunk.get(field::CHUNK_PACK).is_none()
}

/// Reads the due times of a job that has not finished: nothing is read for one that has. With a daily budget
/// (`usd_per_day`, the namespace's), a job with chunks waiting to be submitted or packed also reads today's cost
/// (one pipelined read of the day's counters), to say whether the budget holds them.
pub async fn read(conn: &mut Conn, keys: &Keys, view: &LedgerView, usd_per_day: Option<f64>) -> anyhow::Result<Waits> {
    if view.state().is_none_or(|state| state.is_terminal()) {
        return Ok(Waits::default());
    }
    let waiting: Vec<usize> =
        view.chunks.iter().enumerate().filter(|(_, chunk)| waits_for_submit(chunk)).map(|(index, _)| index).collect();
    let packed = view.chunks.iter().any(|chunk| chunk.get(field::CHUNK_PACK) == Some(ids::PACK_QUEUED));
    let pack_key =
        packed.then(|| format!("{}|{}", view.get(field::MODEL).unwrap_or(""), view.get(field::ENDPOINT).unwrap_or("")));
    let (due, pack_due) = inspect::due_times(conn, keys, &view.job_id, &waiting, pack_key.as_deref())
        .await
        .context("read the schedule")?;
    let mut due = due.into_iter();
    let chunks =
        view.chunks.iter().map(|chunk| if waits_for_submit(chunk) { due.next().flatten() } else { None }).collect();
    let budget = match usd_per_day.filter(|usd| *usd > 0.0) {
        Some(usd) if !waiting.is_empty() || packed => {
            let now = inspect::redis_now(conn).await.context("read Redis's clock")?;
            let spent_nano = batchd_engine::spend::spent_today_nano(conn, keys, now)
                .await
                .context("read today's cost from the finished-jobs counters")?;
            let limit_nano = (usd * batchd_core::pricing::NANO_PER_USD).round() as u64;
            (spent_nano >= limit_nano).then(|| BudgetHold {
                until: batchd_engine::spend::next_midnight(now),
                spent_nano,
                limit_nano,
            })
        }
        _ => None,
    };
    Ok(Waits { chunks, pack_due, budget })
}

/// What chunk `index` waits for, for `status` and the dashboard: the daily budget when it holds the chunk's
/// submit (or its pack's), otherwise [`chunk_text`]; the packing queue's wait is [`pack_text`].
pub fn wait_text(waits: &Waits, index: usize, chunk: &ChunkMetadata, now_ms: u64) -> Option<String> {
    let held = waits_for_submit(chunk) || chunk.get(field::CHUNK_PACK) == Some(ids::PACK_QUEUED);
    match waits.budget.filter(|_| held) {
        Some(hold) => Some(budget_text(hold, now_ms)),
        None => chunk_text(chunk, waits.chunks.get(index).copied().flatten(), now_ms),
    }
}

/// `held by the daily budget until <UTC midnight> ...`.
pub fn budget_text(hold: BudgetHold, now_ms: u64) -> String {
    let usd = |nano: u64| super::cost::format_usd(nano as f64 / batchd_core::pricing::NANO_PER_USD);
    format!(
        "held by the daily budget until {}: today's cost {} has reached budget.usd_per_day {}; work in flight \
         continues",
        until(hold.until, now_ms),
        usd(hold.spent_nano),
        usd(hold.limit_nano)
    )
}

/// `2026-11-28T15:20:00.000Z (in 12.0s)`, or `now` once it is due.
fn until(due: u64, now_ms: u64) -> String {
    if due <= now_ms {
        return "now".to_owned();
    }
    format!("{} (in {})", format_utc(due), format_age(Duration::from_millis(due - now_ms)))
}

/// What chunk `index` waits for and until when, for `status`; `None` when it waits for nothing `waits` knows of.
pub fn chunk_text(chunk: &ChunkMetadata, due: Option<u64>, now_ms: u64) -> Option<String> {
    let due = due?;
    if due <= now_ms {
        return Some("due now: waiting for a worker of a running daemon (`batchd workers`)".to_owned());
    }
    let attempts = chunk.get(field::CHUNK_ATTEMPTS).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    let throttled = chunk.last_error().is_some_and(|error| error.http_status == Some(429));
    let when = until(due, now_ms);
    Some(if throttled {
        format!("waiting: the provider answered its submit with a rate limit (429); next submit at {when}")
    } else if chunk.last_error().is_some() && attempts > 0 {
        format!("waiting: submit attempt {attempts} failed; next one at {when}")
    } else {
        format!(
            "waiting until {when}: its provider's rate limit or calls in flight hold its submit \
             (`batchd_throttled_waits_total`), or a daemon is submitting it now"
        )
    })
}

/// What a chunk queued for packing waits for: its packing key's next pack, when that is due.
pub fn pack_text(pack_due: Option<u64>, now_ms: u64) -> String {
    let base = "packed: waiting for its pack (jobs sharing a remote batch)";
    match pack_due {
        Some(due) => format!("{base}; the next pack is sent at {}", until(due, now_ms)),
        None => base.to_owned(),
    }
}

/// The waits as `status --json` adds them: `[{"chunk":i,"due_at":ms}]`, `pack_due_at`, and `held_by_budget`
/// (`{"until","spent_usd","usd_per_day"}`, or null).
pub fn json(waits: &Waits) -> serde_json::Value {
    let chunks: Vec<serde_json::Value> = waits
        .chunks
        .iter()
        .enumerate()
        .filter_map(|(chunk, due)| Some(serde_json::json!({"chunk": chunk, "due_at": (*due)?})))
        .collect();
    let usd = |nano: u64| nano as f64 / batchd_core::pricing::NANO_PER_USD;
    let budget = waits.budget.map(|hold| {
        serde_json::json!({"until": hold.until, "spent_usd": usd(hold.spent_nano), "usd_per_day": usd(hold.limit_nano)})
    });
    serde_json::json!({"chunks": chunks, "pack_due_at": waits.pack_due, "held_by_budget": budget})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(fields: &[(&'static str, &str)]) -> ChunkMetadata {
        ChunkMetadata { fields: fields.iter().map(|(name, value)| (*name, (*value).to_owned())).collect() }
    }

    #[test]
    fn a_wait_says_what_it_waits_for_and_until_when() {
        let pending = chunk(&[(field::CHUNK_STATE, "pending"), (field::CHUNK_ATTEMPTS, "0")]);
        assert_eq!(chunk_text(&pending, None, 1000), None);
        let text = chunk_text(&pending, Some(13_000), 1000).unwrap();
        assert_eq!(
            text,
            "waiting until 1970-01-01T00:00:13.000Z (in 12.0s): its provider's rate limit or calls in flight hold \
             its submit (`batchd_throttled_waits_total`), or a daemon is submitting it now"
        );
        assert!(chunk_text(&pending, Some(1000), 1000).unwrap().starts_with("due now"));
        let limited = chunk(&[
            (field::CHUNK_STATE, "pending"),
            (field::CHUNK_ATTEMPTS, "0"),
            (field::CHUNK_LAST_ERROR, r#"{"code":"api_error","message":"slow down","http_status":429}"#),
        ]);
        assert!(chunk_text(&limited, Some(3000), 1000).unwrap().contains("rate limit (429); next submit at"));
        let hold = BudgetHold { until: 86_400_000, spent_nano: 2_000_000_000, limit_nano: 2_000_000_000 };
        let waits = Waits { chunks: vec![Some(13_000)], pack_due: None, budget: Some(hold) };
        assert_eq!(
            wait_text(&waits, 0, &pending, 86_000_000).unwrap(),
            "held by the daily budget until 1970-01-02T00:00:00.000Z (in 6m40s): today's cost $2.00 has reached \
             budget.usd_per_day $2.00; work in flight continues"
        );
        let polling = chunk(&[(field::CHUNK_STATE, "polling"), (field::CHUNK_REQUEST_ID, "r")]);
        let in_flight = Waits { chunks: vec![None], ..waits };
        assert_eq!(wait_text(&in_flight, 0, &polling, 86_000_000), None, "work in flight is not held");
        assert_eq!(
            pack_text(Some(61_000), 1000),
            "packed: waiting for its pack (jobs sharing a remote batch); the next pack is sent at \
             1970-01-01T00:01:01.000Z (in 1m00s)"
        );
    }
}
