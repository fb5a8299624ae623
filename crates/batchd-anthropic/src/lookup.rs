//! Recognising the batch an uncertain create may have made, before creating again. Message Batches has no
//! idempotency key and no metadata, and its list shows batches without their requests, so a listed batch is a
//! candidate when (1) it was created between the chunk's first and latest create (less and plus a clock margin)
//! and (2) it holds as many requests as the chunk; it is the chunk's only when (3) its first `custom_id` carries
//! the chunk's mark, whose nonce no other chunk has (namespaces may share an account and a job id). Custom ids
//! can be read only once a batch has ended: a candidate still running is never adopted unchecked; the look waits
//! for it to end (creating again instead would bill twice whenever the uncertain create had landed, which is
//! the usual case of a lost reply). Decisions only; the provider does the I/O.
//!
//! Reading a candidate's results costs a request, and a stream of batches of one size makes every batch of the last
//! minute a candidate (a chaos run saw 73,000 results reads for 1,000 chunks): at most [`MAX_CHECKS`] ended
//! candidates are read per look, those created closest to the chunk's first create, where an uncertain create of
//! the chunk most likely landed; the others are unread, never adopted, and make the look inconclusive.

use crate::wire::MessageBatch;

/// Margin for the difference between this replica's clock and the API's, in ms.
pub const CLOCK_MARGIN_MS: u64 = 60_000;

/// Batches listed per page while looking: the API's largest page, so that one request usually covers the window
/// (each request of a look may fail, and a failed look costs the submit an attempt: with ten pages of 100, a
/// chaos run at 5% faults used up all eight attempts of a chunk).
pub const PAGE_SIZE: u32 = 1000;

/// Pages read at most while looking (1,000 batches): past that, the look is inconclusive.
pub const MAX_PAGES: usize = 1;

/// Ended candidates whose first result line is read, at most, per look.
pub const MAX_CHECKS: usize = 16;

/// A listed batch that may be the chunk's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its id.
    pub id: String,
    /// Whether it has ended (its results can be read, so its custom ids checked).
    pub ended: bool,
    /// Its `processing_status`.
    pub status: String,
    /// Its `results_url`, when ended.
    pub results_url: Option<String>,
    /// Its `created_at`, Unix ms, when readable.
    pub created_ms: Option<u64>,
}

/// What one listed batch means to the look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listed {
    /// Created too early: this and every older batch are out of the window; stop.
    Older,
    /// Not the chunk's (another size, or no id).
    Other,
    /// Could be the chunk's.
    Candidate(Candidate),
}

/// Reads one listed batch against the window (created from `from_ms` to `to_ms`) and the chunk's size.
pub fn consider(batch: MessageBatch, from_ms: u64, to_ms: u64, n_items: usize) -> Listed {
    let created_ms = batch.created_ms();
    if created_ms.is_some_and(|created| created < from_ms) {
        return Listed::Older;
    }
    if created_ms.is_some_and(|created| created > to_ms) {
        return Listed::Other;
    }
    // An unreadable time does not exclude a batch (lenient reader), a size that differs does.
    let n_requests = batch.n_requests();
    match (batch.id, n_requests) {
        (Some(id), Some(n)) if n == n_items as u64 && !id.is_empty() => {
            let status = batch.processing_status.unwrap_or_default();
            Listed::Candidate(Candidate {
                ended: status == "ended",
                status,
                id,
                results_url: batch.results_url,
                created_ms,
            })
        }
        _ => Listed::Other,
    }
}

/// The candidates (by index) whose first result line is worth reading: ended ones, those created closest to one of
/// the chunk's creates first (`started_ms`, its first, or `last_ms`, its latest: the uncertain create may come
/// minutes after the first), at most [`MAX_CHECKS`]; one without a readable time comes last.
pub fn to_check(candidates: &[Candidate], started_ms: u64, last_ms: u64) -> Vec<usize> {
    let mut ended: Vec<(u64, usize)> = candidates
        .iter()
        .enumerate()
        .filter(|(_, candidate)| candidate.ended)
        .map(|(index, candidate)| {
            let distance = candidate
                .created_ms
                .map_or(u64::MAX, |created| created.abs_diff(started_ms).min(created.abs_diff(last_ms)));
            (distance, index)
        })
        .collect();
    ended.sort_unstable();
    ended.into_iter().take(MAX_CHECKS).map(|(_, index)| index).collect()
}

/// What a candidate's first result line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Its custom id carries the chunk's mark.
    Ours,
    /// It carries another mark.
    Foreign,
    /// Still running: its custom ids cannot be read yet.
    Running,
    /// Ended, but not readable (results gone, or no line).
    Unknown,
    /// Ended, but not read (past [`MAX_CHECKS`]): it could be the chunk's, yet is never adopted unread.
    Unread,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// This candidate carries the chunk's mark: it is the chunk's batch.
    Adopt {
        /// Its index in the candidates.
        index: usize,
    },
    /// No batch is the chunk's: create.
    Create,
    /// These many candidates still run and may be the chunk's: look again once they have ended.
    Wait(usize),
    /// These many ended candidates could not be checked: none is taken (adopting the wrong one would answer the
    /// chunk with another's results); create, a possible duplicate (counted).
    Ambiguous(usize),
}

/// Picks the chunk's batch among `checks` (one per candidate, newest first): one checked as ours wins; else any
/// candidate still running is waited for; else ended ones that could not be checked make the look ambiguous.
pub fn choose(checks: &[Check]) -> Choice {
    if let Some(index) = checks.iter().position(|check| *check == Check::Ours) {
        return Choice::Adopt { index };
    }
    let count = |kind: &[Check]| checks.iter().filter(|check| kind.contains(check)).count();
    match (count(&[Check::Running]), count(&[Check::Unknown, Check::Unread])) {
        (0, 0) => Choice::Create,
        (0, unchecked) => Choice::Ambiguous(unchecked),
        (running, _) => Choice::Wait(running),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(id: &str, created_at: &str, n: u64, status: &str) -> MessageBatch {
        MessageBatch::read(
            format!(
                r#"{{"id":"{id}","processing_status":"{status}","created_at":"{created_at}",
                    "request_counts":{{"processing":{n},"succeeded":0,"errored":0,"canceled":0,"expired":0}}}}"#
            )
            .as_bytes(),
        )
        .expect("batch")
    }

    #[test]
    fn the_window_and_the_size_pick_candidates() {
        let from = crate::wire::rfc3339_ms("2026-11-25T10:00:00Z").expect("time");
        let to = crate::wire::rfc3339_ms("2026-11-25T10:05:00Z").expect("time");
        assert_eq!(consider(batch("a", "2026-11-25T09:59:59Z", 3, "ended"), from, to, 3), Listed::Older);
        assert_eq!(consider(batch("b", "2026-11-25T10:00:01Z", 4, "ended"), from, to, 3), Listed::Other);
        let Listed::Candidate(candidate) = consider(batch("c", "2026-11-25T10:00:01Z", 3, "in_progress"), from, to, 3)
        else {
            panic!("a candidate")
        };
        assert!(!candidate.ended);
        // Created after the chunk's latest create (and its margin): not one of its batches.
        assert_eq!(consider(batch("f", "2026-11-25T10:05:01Z", 3, "in_progress"), from, to, 3), Listed::Other);
        assert!(matches!(consider(batch("d", "yesterday", 3, "ended"), from, to, 3), Listed::Candidate(_)));
        let no_counts = MessageBatch::read(br#"{"id":"e","created_at":"2026-11-25T10:00:01Z"}"#).expect("batch");
        assert_eq!(consider(no_counts, from, to, 3), Listed::Other);
    }

    #[test]
    fn only_the_ended_candidates_closest_to_the_first_create_are_read() {
        let candidate = |ended: bool, created_ms: Option<u64>| Candidate {
            id: "b".into(),
            ended,
            status: if ended { "ended" } else { "in_progress" }.into(),
            results_url: None,
            created_ms,
        };
        let started = 1_000_000;
        // Newest first, as listed: 40 ended ones 1 s apart after the first create, one unended, one without a time.
        let mut candidates: Vec<Candidate> =
            (0..40).rev().map(|i| candidate(true, Some(started - 500 + i * 1_000))).collect();
        candidates.push(candidate(false, Some(started)));
        candidates.push(candidate(true, None));
        let chosen = to_check(&candidates, started, started);
        assert_eq!(chosen.len(), MAX_CHECKS);
        // The closest first (500 ms either side of the first create), then outwards: the 16 within 14.5 s.
        let created: Vec<u64> = chosen.iter().map(|index| candidates[*index].created_ms.expect("time")).collect();
        assert_eq!(created[0].abs_diff(started), 500);
        assert!(created.iter().all(|ms| ms.abs_diff(started) <= 14_500), "{created:?}");
        assert!(!chosen.contains(&40), "an unended candidate has no results to read");
        assert!(!chosen.contains(&41), "one without a time comes after every timed one");
        assert_eq!(to_check(&candidates[40..], started, started), vec![1], "it is read when few are left");
    }

    #[test]
    fn only_a_checked_batch_is_adopted_and_a_running_one_is_waited_for() {
        use Check::{Foreign, Ours, Running, Unknown, Unread};
        assert_eq!(choose(&[]), Choice::Create);
        assert_eq!(choose(&[Foreign, Foreign]), Choice::Create);
        assert_eq!(choose(&[Running, Ours]), Choice::Adopt { index: 1 });
        assert_eq!(choose(&[Unread, Ours]), Choice::Adopt { index: 1 });
        // A lone running candidate is never taken unchecked (another namespace's batch of the same size).
        assert_eq!(choose(&[Foreign, Running]), Choice::Wait(1));
        assert_eq!(choose(&[Running, Unknown, Running]), Choice::Wait(2));
        // Ended ones that cannot be checked are never adopted.
        assert_eq!(choose(&[Unknown, Foreign, Unknown]), Choice::Ambiguous(2));
        assert_eq!(choose(&[Unread]), Choice::Ambiguous(1));
    }
}
