//! The chaos suite: real `batchd` processes sharing a real `redis-server`, the Batch API emulator with random
//! batch durations and random transient faults, and faults from outside (`kill -9` of daemons, Redis killed,
//! restarted, frozen with SIGSTOP, rolling SIGTERM restarts, a 100,000-job backlog), and from inside (replicas whose
//! wall clocks disagree by minutes, hostile entries mixed into the job stream).
//!
//! Every scenario ends the same way ([`check`]): a drain, then a check over every job id that was acknowledged
//! by `XADD` — exactly one result entry each, none lost, every duplicate remote submit (from the emulator's call
//! log) explained by a fault and counted in its job's ledger, nothing left pending in the ingress group or the
//! schedule. `make chaos` runs the full scenarios ([`Size::Full`]) through the `chaos` binary; `make test` runs the
//! short ones ([`Size::Short`]) from `tests/it/chaos.rs`. The figures go to `docs/reliability.md`.

pub mod abandoned;
pub mod check;
pub mod clock;
pub mod cluster;
pub mod excuse;
pub mod hostile;
pub mod load;
pub mod provider_faults;
pub mod remote;
pub mod report;
pub mod scenarios;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How big a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// The scenarios as `make chaos` runs them (thousands of jobs, minutes each).
    Full,
    /// Small versions for `make test` (tens of seconds each on two cores).
    Short,
}

impl Size {
    /// `full` or `short`.
    pub fn as_str(self) -> &'static str {
        match self {
            Size::Full => "full",
            Size::Short => "short",
        }
    }

    /// Picks the value for this size.
    pub fn pick<T>(self, full: T, short: T) -> T {
        match self {
            Size::Full => full,
            Size::Short => short,
        }
    }
}

/// Wall-clock Unix milliseconds (the emulator's call log uses the same clock).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

/// `1.2 s` / `850 ms`, for tables and notes.
pub fn human(duration: Duration) -> String {
    if duration >= Duration::from_secs(1) {
        format!("{:.1} s", duration.as_secs_f64())
    } else {
        format!("{} ms", duration.as_millis())
    }
}
