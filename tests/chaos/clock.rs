//! Scenario 7's tools: daemons whose wall clock is faked (libfaketime, as in `tests/it/clock.rs`: `LD_PRELOAD`,
//! the monotonic clock left alone, a spec file re-read at every clock read so a run can make a clock jump), and
//! the check that no batch was polled earlier than its poll interval allows, from the emulator's call logs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::remote::RemoteLog;
use anyhow::Context as _;

/// Where Debian's `faketime` package (`make deps`) puts the library.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Writes libfaketime's spec (`+300s`, `-300s`, ...) to `file`; a daemon started with [`faked_clock`] on that file
/// reads it at its next clock read, so rewriting it makes the clock jump.
pub fn set_clock(file: &Path, spec: &str) -> anyhow::Result<()> {
    // Written aside and renamed over, so a daemon never reads a half-written spec.
    let next = file.with_extension("next");
    std::fs::write(&next, spec).with_context(|| format!("write {}", next.display()))?;
    std::fs::rename(&next, file).with_context(|| format!("rename to {}", file.display()))
}

/// The offset of a spec [`set_clock`] writes (`+300s`, `-600s`), in ms.
pub fn offset_ms(spec: &str) -> i64 {
    spec.trim_end_matches('s').parse::<i64>().map_or(0, |secs| secs * 1000)
}

/// The environment that gives a daemon the wall clock of `file` (see [`set_clock`]), with its monotonic clock real.
pub fn faked_clock(file: &Path) -> anyhow::Result<Vec<(String, String)>> {
    anyhow::ensure!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: run `make deps` (installs Debian's faketime package)"
    );
    Ok(vec![
        ("LD_PRELOAD".to_owned(), LIBFAKETIME.to_owned()),
        ("FAKETIME_TIMESTAMP_FILE".to_owned(), file.display().to_string()),
        ("FAKETIME_NO_CACHE".to_owned(), "1".to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
    ])
}

/// The clock file of a slot in `dir`.
pub fn clock_file(dir: &Path, slot: usize) -> PathBuf {
    dir.join(format!("clock-slot{slot}"))
}

/// The shortest wait before a poll, measured from the arrival of the batch's create or previous poll (in the
/// emulator's call logs, all three APIs) to the arrival of the poll.
#[derive(Debug, Clone, Default)]
pub struct PollGaps {
    /// Polls that followed an answered create or poll (the ones the bound applies to).
    pub checked: usize,
    /// The shortest of those waits.
    pub shortest: Option<Duration>,
    /// Those shorter than the bound: `(batch id, wait)`.
    pub early: Vec<(String, Duration)>,
}

/// Checks every poll in `log` that followed an answered (HTTP 200, no fault) create or poll of the same batch: it
/// may not arrive sooner than `bound` after that call arrived. A poll after a faulted call, or after a results
/// download (OpenAI, Anthropic), is a retry (`retry.*` backoff) and is not checked.
pub fn poll_gaps(log: &RemoteLog, bound: Duration) -> PollGaps {
    // Per batch: (arrival, order at equal arrival, is a poll, answered).
    let mut by_batch: HashMap<&str, Vec<(u64, u8, bool, bool)>> = HashMap::new();
    for created in &log.created {
        by_batch.entry(created.batch.as_str()).or_default().push((created.at_ms, 0, false, !created.reply_lost));
    }
    for touch in &log.touches {
        let answered = touch.what == "poll" && !touch.faulted && touch.http_status == 200;
        let order = if touch.what == "poll" { 1 } else { 2 };
        by_batch.entry(touch.batch.as_str()).or_default().push((touch.at_ms, order, touch.what == "poll", answered));
    }
    let mut gaps = PollGaps::default();
    for (batch, mut calls) in by_batch {
        calls.sort_unstable();
        for pair in calls.windows(2) {
            let ((previous_ms, _, _, answered), (poll_ms, _, is_poll, _)) = (pair[0], pair[1]);
            if !is_poll || !answered {
                continue;
            }
            let wait = Duration::from_millis(poll_ms.saturating_sub(previous_ms));
            gaps.checked += 1;
            gaps.shortest = Some(gaps.shortest.map_or(wait, |shortest| shortest.min(wait)));
            if wait < bound {
                gaps.early.push((batch.to_owned(), wait));
            }
        }
    }
    gaps
}
