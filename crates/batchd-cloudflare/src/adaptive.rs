//! Adaptive backoff of a rate bucket (AIMD): repeated 429s for one bucket halve the rate batchd submits at, down
//! to a floor; a quiet window gives a tenth of the configured limit back, up to the limit.
//!
//! Why: the large paid models are capped far below their task type's documented limit (about 20 requests a
//! minute observed against 300, docs/batch-api.md), and a model's capacity changes over time. A configured limit
//! is a ceiling; this finds the rate the API takes now. A 429 already costs no attempt (the job waits), so this
//! only saves the wasted requests. Each replica adapts on the 429s it sees itself; the shared limiter still spaces
//! every replica's submits.
//!
//! Pure: every method takes the time, so the rules are unit-tested without a clock.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The rate is multiplied by this on a decrease.
const DECREASE: f64 = 0.5;

/// The rate never falls below this fraction of the configured limit.
pub const MIN_FRACTION: f64 = 0.05;

/// A quiet window gives back this fraction of the configured limit.
const INCREASE: f64 = 0.1;

/// 429s counted as repeated: this many within one window trigger a decrease.
const STRIKES: u32 = 2;

/// The adaptive state of every bucket that was rate-limited, by bucket name.
#[derive(Debug)]
pub struct AdaptiveRates {
    /// The window of the configured limits (`rate_limits.window_secs`): the span of "repeated" and the step of
    /// the recovery.
    window: Duration,
    /// Per bucket.
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// One bucket's state.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// The bucket's configured limit per window.
    limit: u32,
    /// The fraction of the configured limit batchd submits at, in `[MIN_FRACTION, 1]`.
    fraction: f64,
    /// When the fraction last changed, or recovery was last accounted.
    changed_at: Instant,
    /// 429s since the last decrease, within the window of the first of them.
    strikes: u32,
    /// When the first of those strikes came.
    first_strike_at: Instant,
}

impl AdaptiveRates {
    /// No bucket adapted yet; `window` as in `rate_limits.window_secs` (at least one second).
    pub fn new(window: Duration) -> Self {
        Self { window: window.max(Duration::from_secs(1)), buckets: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Bucket>> {
        self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The fraction of its configured limit `bucket` is submitted at, at `now` (1 for a bucket never limited).
    pub fn fraction(&self, bucket: &str, now: Instant) -> f64 {
        let mut buckets = self.lock();
        let Some(state) = buckets.get_mut(bucket) else {
            return 1.0;
        };
        self.recover(state, now);
        let fraction = state.fraction;
        if self.settled(state, now) {
            buckets.remove(bucket);
        }
        fraction
    }

    /// Counts a 429 for `bucket` (configured at `limit` per window) at `now`; returns the new fraction when this
    /// one lowered the rate.
    pub fn rate_limited(&self, bucket: &str, limit: u32, now: Instant) -> Option<f64> {
        let mut buckets = self.lock();
        let state = buckets.entry(bucket.to_owned()).or_insert(Bucket {
            limit,
            fraction: 1.0,
            changed_at: now,
            strikes: 0,
            first_strike_at: now,
        });
        state.limit = limit;
        self.recover(state, now);
        if state.strikes == 0 || now.saturating_duration_since(state.first_strike_at) > self.window {
            state.strikes = 0;
            state.first_strike_at = now;
        }
        state.strikes += 1;
        if state.strikes < STRIKES {
            return None;
        }
        state.strikes = 0;
        state.fraction = (state.fraction * DECREASE).max(MIN_FRACTION);
        state.changed_at = now;
        Some(state.fraction)
    }

    /// Every adapted bucket with its effective limit per window at `now` (its configured limit times its
    /// fraction); those back at their configured limit are listed once more, then forgotten.
    pub fn snapshot(&self, now: Instant) -> Vec<(String, f64)> {
        let mut buckets = self.lock();
        let mut out = Vec::with_capacity(buckets.len());
        buckets.retain(|name, state| {
            self.recover(state, now);
            out.push((name.clone(), f64::from(state.limit) * state.fraction));
            !self.settled(state, now)
        });
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Whether a bucket is back at its configured limit with no recent 429 counted: nothing left to remember.
    fn settled(&self, state: &Bucket, now: Instant) -> bool {
        state.fraction >= 1.0
            && (state.strikes == 0 || now.saturating_duration_since(state.first_strike_at) > self.window)
    }

    /// Gives back [`INCREASE`] per whole quiet window since the last change.
    fn recover(&self, state: &mut Bucket, now: Instant) {
        let quiet = now.saturating_duration_since(state.changed_at);
        let windows = (quiet.as_secs_f64() / self.window.as_secs_f64()).floor();
        if windows >= 1.0 {
            state.fraction = (state.fraction + INCREASE * windows).min(1.0);
            state.changed_at += self.window.mul_f64(windows);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_429s_halve_the_rate_and_quiet_windows_bring_it_back() {
        let rates = AdaptiveRates::new(Duration::from_secs(60));
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        assert_eq!(rates.fraction("a:m", start), 1.0);
        assert_eq!(rates.rate_limited("a:m", 20, at(0)), None, "one 429 is not repeated");
        assert_eq!(rates.fraction("a:m", at(0)), 1.0, "and is remembered across the submits in between");
        assert_eq!(rates.rate_limited("a:m", 20, at(1)), Some(0.5));
        assert_eq!(rates.rate_limited("a:m", 20, at(2)), None);
        assert_eq!(rates.rate_limited("a:m", 20, at(3)), Some(0.25));
        assert_eq!(rates.fraction("other", at(3)), 1.0, "buckets adapt on their own");
        // Two 429s more than a window apart are not repeated.
        assert_eq!(rates.rate_limited("a:m", 20, at(10)), None);
        assert_eq!(rates.rate_limited("a:m", 20, at(71)), None);
        // Recovery: a tenth of the limit per quiet window since the last change (at 3 s).
        assert!((rates.fraction("a:m", at(3 + 60)) - 0.35).abs() < 1e-9);
        assert!((rates.fraction("a:m", at(3 + 600)) - 1.0).abs() < 1e-9);
        assert_eq!(rates.snapshot(at(3 + 600)), [], "fraction() already forgot the recovered bucket");
        assert!(rates.snapshot(at(3 + 660)).is_empty(), "recovered buckets are forgotten");
    }

    #[test]
    fn the_rate_never_falls_below_the_floor() {
        let rates = AdaptiveRates::new(Duration::from_secs(60));
        let start = Instant::now();
        for i in 0..100 {
            rates.rate_limited("b", 300, start + Duration::from_millis(i));
        }
        assert_eq!(rates.fraction("b", start + Duration::from_millis(100)), MIN_FRACTION);
        assert_eq!(rates.snapshot(start + Duration::from_millis(100)), [("b".to_owned(), 300.0 * MIN_FRACTION)]);
    }
}
