//! Exponential backoff, written once: the doubling delay of every retry loop (the fetchers, the event puller) and
//! the ceiling of the jittered retry decision (`batchd_engine::policy::retry_delay`).
//!
//! Not `backon` (already compiled in through `redis`): it is a retry-loop library whose jitter is added on top of
//! the delay and drawn from its own random source, so the unit-tested decision "delay before retry `attempt`, full
//! jitter from a given number, never under `Retry-After`" cannot be expressed with it, and using it for the loops
//! alone would leave two sources of the doubling rule.

use std::time::Duration;

/// The delay before retry number `attempt` (1-based; 0 counts as 1) of a doubling backoff: `first × 2^(attempt-1)`
/// (at most 31 doublings), capped at `max`.
pub fn doubling(attempt: u64, first: Duration, max: Duration) -> Duration {
    let doublings = attempt.saturating_sub(1).min(31) as u32;
    first.saturating_mul(1 << doublings).min(max)
}

/// A doubling backoff for a retry loop: each failure waits the next [`doubling`] delay, a success starts over.
#[derive(Debug, Clone)]
pub struct Backoff {
    /// The delay after the first failure.
    first: Duration,
    /// The longest delay.
    max: Duration,
    /// Failures since the last success.
    n_failures: u64,
}

impl Backoff {
    /// A backoff that waits `first` after a failure, doubling up to `max` while failures go on.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max, n_failures: 0 }
    }

    /// The delay to wait after one more failure.
    pub fn failed(&mut self) -> Duration {
        self.n_failures = self.n_failures.saturating_add(1);
        doubling(self.n_failures, self.first, self.max)
    }

    /// Starts over from `first`.
    pub fn succeeded(&mut self) {
        self.n_failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn delays_double_to_the_cap() {
        let delays: Vec<u64> = (1..=8).map(|n| doubling(n, ms(1000), ms(60_000)).as_millis() as u64).collect();
        assert_eq!(delays, [1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000]);
        assert_eq!(doubling(0, ms(1000), ms(60_000)), ms(1000), "0 counts as the first retry");
        assert_eq!(doubling(u64::MAX, ms(1000), ms(60_000)), ms(60_000));
        assert_eq!(doubling(u64::MAX, Duration::MAX, Duration::MAX), Duration::MAX, "saturates");
        assert_eq!(doubling(3, ms(100), ms(50)), ms(50), "a cap under the first delay wins");
    }

    #[test]
    fn a_loop_backs_off_while_failing_and_starts_over_after_a_success() {
        let mut backoff = Backoff::new(ms(100), ms(5000));
        let seen: Vec<u64> = (0..8).map(|_| backoff.failed().as_millis() as u64).collect();
        assert_eq!(seen, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        backoff.succeeded();
        assert_eq!(backoff.failed(), ms(100));
        let mut backoff = Backoff::new(ms(100), ms(500));
        let seen: Vec<u64> = (0..5).map(|_| backoff.failed().as_millis() as u64).collect();
        assert_eq!(seen, [100, 200, 400, 500, 500]);
    }
}
