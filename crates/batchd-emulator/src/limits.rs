//! Limits that change at runtime: body and item caps, the per-(account, model) rate limit, batch retention, and
//! the rate limiter every provider module meters its calls with.
//!
//! A [`RateLimit`] without a burst is a sliding window over a log of admitted calls: a call is admitted when fewer
//! than `requests` calls were admitted for the same key in the last `per`. Unlike a token bucket, that never lets
//! more than `requests` calls through in any window of `per`, which is how Cloudflare states its limits ("300
//! requests per minute") and lets a test predict exactly which call gets the 429. With a burst it is a token bucket
//! (kept as a GCRA: one theoretical arrival time per key, exact in integer time): it holds at most `burst` calls
//! and refills at `requests` per `per`, which is how Anthropic describes its limits ("continuously replenished")
//! and how OpenAI enforces an hourly one in shorter periods. Refused calls use nothing, so a client that keeps
//! retrying early is not punished further.

use std::{
    collections::{HashMap, VecDeque},
    time::Duration,
};

use tokio::time::Instant;

use crate::config::{EmulatorConfig, RateLimit};

/// The limits in force; they start from [`EmulatorConfig`] and change through the control API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Bodies of this many bytes or more get 413, code 3006.
    pub max_body_bytes: usize,
    /// Submits with more items get 413, code 3006; `None`: no cap.
    pub max_items: Option<usize>,
    /// Calls allowed per (account, model) and window; `None`: unlimited.
    pub rate_limit: Option<RateLimit>,
    /// Whether polls count against the rate limit too.
    pub limit_polls: bool,
    /// How long a finished batch stays pollable; `None`: forever.
    pub retention: Option<Duration>,
}

impl Limits {
    /// The limits a new emulator starts with.
    pub fn from_config(config: &EmulatorConfig) -> Self {
        Self {
            max_body_bytes: config.max_body_bytes,
            max_items: config.max_items,
            rate_limit: config.rate_limit,
            limit_polls: config.limit_polls,
            retention: config.retention,
        }
    }
}

/// What the limiter remembers of one key's admitted calls.
#[derive(Debug)]
enum Admitted {
    /// A sliding window: the times of the calls admitted within the last window, oldest first.
    Window(VecDeque<Instant>),
    /// A token bucket as a GCRA: the time at which the bucket would be full again if no call came.
    Bucket(Instant),
}

impl Admitted {
    /// An empty window, or a full bucket.
    fn fresh(burst: Option<u32>, now: Instant) -> Self {
        match burst {
            None => Self::Window(VecDeque::new()),
            Some(_) => Self::Bucket(now),
        }
    }
}

/// The admitted calls, one record per (account, model) or whatever pair of names a provider keys its limit by.
#[derive(Debug, Default)]
pub(crate) struct RateLimiter {
    /// What each key admitted.
    admitted: HashMap<(String, String), Admitted>,
}

impl RateLimiter {
    /// Admits a call for `account` and `model` at `now`, or returns how long until a call would be admitted.
    pub fn admit(&mut self, account: &str, model: &str, limit: RateLimit, now: Instant) -> Result<(), Duration> {
        if limit.requests == 0 || limit.burst == Some(0) {
            return Err(limit.per);
        }
        let entry = self
            .admitted
            .entry((account.to_owned(), model.to_owned()))
            .or_insert_with(|| Admitted::fresh(limit.burst, now));
        loop {
            match (limit.burst, &mut *entry) {
                (None, Admitted::Window(log)) => return admit_window(log, limit, now),
                (Some(burst), Admitted::Bucket(full_at)) => return admit_bucket(full_at, limit, burst, now),
                // The key was metered by a limit of the other kind: start afresh.
                (burst, other) => *other = Admitted::fresh(burst, now),
            }
        }
    }

    /// Forgets every admitted call (a new limit, or a reset, starts with full windows).
    pub fn clear(&mut self) {
        self.admitted.clear();
    }
}

/// The sliding window: admitted when fewer than `requests` calls were admitted in the last `per`.
fn admit_window(log: &mut VecDeque<Instant>, limit: RateLimit, now: Instant) -> Result<(), Duration> {
    while log.front().is_some_and(|&at| now.saturating_duration_since(at) >= limit.per) {
        log.pop_front();
    }
    match log.front() {
        Some(&oldest) if log.len() >= limit.requests as usize => {
            Err((oldest + limit.per).saturating_duration_since(now))
        }
        _ => {
            log.push_back(now);
            Ok(())
        }
    }
}

/// The token bucket: each call adds one emission interval (`per / requests`) to the time the bucket is full
/// again; a call is admitted while that time is at most `burst - 1` intervals ahead of `now`.
fn admit_bucket(full_at: &mut Instant, limit: RateLimit, burst: u32, now: Instant) -> Result<(), Duration> {
    let interval = limit.per / limit.requests;
    let tolerance = interval * (burst - 1);
    let start = (*full_at).max(now);
    let ahead = start.saturating_duration_since(now);
    if ahead > tolerance {
        return Err(ahead - tolerance);
    }
    *full_at = start + interval;
    Ok(())
}

/// A provider's metered calls under the limit its settings hold: what the limit admitted, and how many calls it
/// refused. A changed limit starts with a full window (or bucket).
#[derive(Debug, Default)]
pub(crate) struct Meter {
    /// The limit the admitted calls were counted under.
    counted_under: Option<RateLimit>,
    /// What the limit admitted.
    limiter: RateLimiter,
    /// Calls refused since start or the last reset.
    n_refused: u64,
}

impl Meter {
    /// Admits one call counted under `key` at `now` by `limit` (`None`: every call passes), or returns how long
    /// until one would be admitted (and counts the refusal).
    pub fn admit(&mut self, limit: Option<RateLimit>, key: &str, now: Instant) -> Result<(), Duration> {
        if self.counted_under != limit {
            self.limiter.clear();
            self.counted_under = limit;
        }
        let Some(limit) = limit else {
            return Ok(());
        };
        let admitted = self.limiter.admit(key, "", limit, now);
        if admitted.is_err() {
            self.n_refused += 1;
        }
        admitted
    }

    /// Calls refused since start or the last reset.
    pub fn n_refused(&self) -> u64 {
        self.n_refused
    }

    /// Empties the window (or fills the bucket) and zeroes the refused count.
    pub fn reset(&mut self) {
        self.limiter.clear();
        self.n_refused = 0;
    }
}

/// The `Retry-After` value for a wait: whole seconds, rounded up, at least 1.
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn at_most_requests_per_window_per_account_and_model() {
        let start = Instant::now();
        let limit = RateLimit::new(2, ms(1000));
        let mut limiter = RateLimiter::default();
        assert_eq!(limiter.admit("a", "m", limit, start), Ok(()));
        assert_eq!(limiter.admit("a", "m", limit, start + ms(100)), Ok(()));
        assert_eq!(limiter.admit("a", "m", limit, start + ms(300)), Err(ms(700)));
        // Other models and accounts have their own windows.
        assert_eq!(limiter.admit("a", "other", limit, start + ms(300)), Ok(()));
        assert_eq!(limiter.admit("b", "m", limit, start + ms(300)), Ok(()));
        // The first call leaves the window at 1000 ms: one slot frees, the second call still counts.
        assert_eq!(limiter.admit("a", "m", limit, start + ms(1000)), Ok(()));
        assert_eq!(limiter.admit("a", "m", limit, start + ms(1050)), Err(ms(50)));
        assert_eq!(limiter.admit("a", "m", limit, start + ms(1100)), Ok(()));
    }

    #[test]
    fn refused_calls_do_not_use_up_the_window() {
        let start = Instant::now();
        let limit = RateLimit::new(1, ms(1000));
        let mut limiter = RateLimiter::default();
        assert_eq!(limiter.admit("a", "m", limit, start), Ok(()));
        for step in 1..10 {
            assert!(limiter.admit("a", "m", limit, start + ms(step * 50)).is_err());
        }
        assert_eq!(limiter.admit("a", "m", limit, start + ms(1000)), Ok(()));
        limiter.clear();
        assert_eq!(limiter.admit("a", "m", limit, start + ms(1001)), Ok(()));
    }

    #[test]
    fn a_bucket_lets_a_burst_through_then_one_call_per_interval() {
        let start = Instant::now();
        // 2,000 an hour is one call per 1.8 s; a burst of 3.
        let limit = RateLimit::new(2000, Duration::from_secs(3600)).burst(3);
        let mut limiter = RateLimiter::default();
        for _ in 0..3 {
            assert_eq!(limiter.admit("a", "m", limit, start), Ok(()));
        }
        assert_eq!(limiter.admit("a", "m", limit, start), Err(ms(1800)));
        assert_eq!(limiter.admit("a", "m", limit, start + ms(1000)), Err(ms(800)));
        assert_eq!(limiter.admit("a", "m", limit, start + ms(1800)), Ok(()));
        assert_eq!(limiter.admit("a", "m", limit, start + ms(1800)), Err(ms(1800)));
        // Idle for long enough, the bucket is full again, and never fuller than the burst.
        let later = start + Duration::from_secs(100);
        for _ in 0..3 {
            assert_eq!(limiter.admit("a", "m", limit, later), Ok(()));
        }
        assert!(limiter.admit("a", "m", limit, later).is_err());
    }

    #[test]
    fn a_burst_of_one_spaces_every_call() {
        let start = Instant::now();
        let limit = RateLimit::new(50, Duration::from_secs(60)).burst(1);
        let mut limiter = RateLimiter::default();
        assert_eq!(limiter.admit("a", "m", limit, start), Ok(()));
        assert_eq!(limiter.admit("a", "m", limit, start + ms(1199)), Err(ms(1)));
        assert_eq!(limiter.admit("a", "m", limit, start + ms(1200)), Ok(()));
        assert_eq!(limiter.admit("a", "m", limit.burst(0), start + ms(5000)), Err(Duration::from_secs(60)));
    }

    #[test]
    fn a_meter_counts_refusals_and_resets() {
        let start = Instant::now();
        let limit = Some(RateLimit::new(1, ms(1000)));
        let mut meter = Meter::default();
        assert_eq!(meter.admit(limit, "k", start), Ok(()));
        assert_eq!(meter.admit(limit, "k", start), Err(ms(1000)));
        assert_eq!(meter.n_refused(), 1);
        meter.reset();
        assert_eq!(meter.n_refused(), 0);
        assert_eq!(meter.admit(limit, "k", start), Ok(()));
        assert_eq!(meter.admit(None, "k", start), Ok(()));
        // A new limit starts with a full window.
        assert_eq!(meter.admit(Some(RateLimit::new(1, ms(2000))), "k", start), Ok(()));
    }

    #[test]
    fn zero_requests_refuses_everything() {
        let mut limiter = RateLimiter::default();
        let limit = RateLimit::new(0, ms(1500));
        assert_eq!(limiter.admit("a", "m", limit, Instant::now()), Err(ms(1500)));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(ms(1)), 1);
        assert_eq!(retry_after_secs(ms(1000)), 1);
        assert_eq!(retry_after_secs(ms(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(59)), 59);
    }
}
