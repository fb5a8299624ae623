//! Limits that change at runtime: body and item caps, the per-(account, model) rate limit, batch retention.
//!
//! The rate limiter is a sliding window over a log of admitted calls: a call is admitted when fewer than
//! `requests` calls were admitted for the same account and model in the last `per`. Unlike a token bucket,
//! that never lets more than `requests` calls through in any window of `per`, which is how Cloudflare states
//! its limits ("300 requests per minute") and lets a test predict exactly which call gets the 429. Refused
//! calls are not logged, so a client that keeps retrying early is not punished further.

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

/// Sliding-window logs of admitted calls, one per (account, model).
#[derive(Debug, Default)]
pub(crate) struct RateLimiter {
    /// Times of the calls admitted within the last window, oldest first, by (account, model).
    admitted: HashMap<(String, String), VecDeque<Instant>>,
}

impl RateLimiter {
    /// Admits a call for `account` and `model` at `now`, or returns how long until a call would be admitted.
    pub fn admit(&mut self, account: &str, model: &str, limit: RateLimit, now: Instant) -> Result<(), Duration> {
        if limit.requests == 0 {
            return Err(limit.per);
        }
        let log = self.admitted.entry((account.to_owned(), model.to_owned())).or_default();
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

    /// Forgets every admitted call (a new limit, or a reset, starts with full windows).
    pub fn clear(&mut self) {
        self.admitted.clear();
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
