//! A namespace's daily budget (`[budget]`): once what its finished jobs cost today (a UTC day, at their models'
//! batch prices, from the finished-jobs counters) reaches the budget, new submits are held until the next UTC
//! midnight, and work in flight goes on. The overshoot is bounded by that work: the batches already submitted when
//! the budget is reached, whose cost is only known once they finish.
//!
//! Each replica reads the day's spend at most every [`REFRESH`] (one pipelined read of the day's hourly counters
//! and the minutes not rolled up yet), so a submit pays no Redis read of its own, and adds the cost of each result
//! it publishes at once; another replica's results count from the next read. So the overshoot is bounded by the
//! work in flight when the budget is reached plus what the other replicas submit within [`REFRESH`] of it.

use std::sync::Mutex;
use std::time::Duration;

use batchd_core::UnixMillis;
use batchd_core::pricing::NANO_PER_USD;
use batchd_core::stats::Totals;
use batchd_queue::{Conn, Store, StoreError};

/// How long a replica trusts the day's spend it read.
pub const REFRESH: Duration = Duration::from_secs(5);

/// How soon a held chunk is looked at again (at the latest the next UTC midnight): a budget raised in the
/// configuration applies to it this soon after the daemons restart with it.
pub const RECHECK: Duration = Duration::from_secs(300);

/// One day, ms.
const DAY_MS: u64 = 86_400_000;

/// The next UTC midnight after `now` (Unix ms): when a held submit may go again.
pub fn next_midnight(now: UnixMillis) -> UnixMillis {
    (now / DAY_MS + 1) * DAY_MS
}

/// What the namespace's finished jobs cost on the UTC day of `now`, in nano-dollars: the day's hourly counters,
/// with the minutes not rolled up into them yet.
pub async fn spent_today_nano(conn: &mut Conn, keys: &batchd_core::Keys, now: UnixMillis) -> Result<u64, StoreError> {
    let first_hour = now / DAY_MS * 24;
    let hours = batchd_queue::inspect::hour_counters(conn, keys, first_hour, now / 3_600_000, now).await?;
    Ok(Totals::of(&hours).cost_nano.values().sum())
}

/// The day's spend as a replica last read it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// When it was read (Redis's clock, Unix ms).
    at: UnixMillis,
    /// The spend, nano-dollars.
    spent_nano: u64,
}

/// A namespace's daily budget, as one replica checks it before each submit.
#[derive(Debug, Default)]
pub struct DailyBudget {
    /// The budget in nano-dollars; `None`: no budget.
    limit_nano: Option<u64>,
    /// The spend last read.
    seen: Mutex<Option<Seen>>,
    /// The end of the hold last logged: one log line per hold.
    logged_until: Mutex<Option<UnixMillis>>,
}

impl DailyBudget {
    /// A budget of `usd_per_day` (`None` or 0: none).
    pub fn new(usd_per_day: Option<f64>) -> Self {
        let limit_nano = usd_per_day.filter(|usd| *usd > 0.0).map(|usd| (usd * NANO_PER_USD).round() as u64);
        Self { limit_nano, seen: Mutex::new(None), logged_until: Mutex::new(None) }
    }

    /// Whether a new submit is held now: `Some((now, until))` (Redis's clock; until the next UTC midnight) once the
    /// day's spend has reached the budget, `None` when it may go. Without a budget nothing is read.
    pub async fn held(&self, store: &Store) -> Result<Option<(UnixMillis, UnixMillis)>, StoreError> {
        let Some(limit) = self.limit_nano else { return Ok(None) };
        let now = store.now().await?;
        let fresh =
            |seen: &Seen| seen.at / DAY_MS == now / DAY_MS && now.saturating_sub(seen.at) < REFRESH.as_millis() as u64;
        let known = *self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let spent_nano = match known.filter(fresh) {
            Some(seen) => seen.spent_nano,
            None => {
                let spent_nano = spent_today_nano(&mut store.connection(), store.keys(), now).await?;
                *self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Seen { at: now, spent_nano });
                spent_nano
            }
        };
        if !reached(limit, spent_nano) {
            return Ok(None);
        }
        let until = next_midnight(now);
        let mut logged = self.logged_until.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *logged != Some(until) {
            *logged = Some(until);
            tracing::info!(
                namespace = store.keys().namespace(),
                spent_usd = spent_nano as f64 / NANO_PER_USD,
                usd_per_day = limit as f64 / NANO_PER_USD,
                until = %format_until(until),
                "new submits held by the daily budget until the next UTC midnight (budget.usd_per_day reached; \
                 work in flight continues)"
            );
        }
        Ok(Some((now, until)))
    }
}

impl DailyBudget {
    /// Adds the cost of a result this replica just published to the spend it last read, so its own results count
    /// at once (other replicas' count from its next read, within [`REFRESH`]).
    pub fn add_spent(&self, usage: &serde_json::Value) {
        if self.limit_nano.is_none() {
            return;
        }
        let Some(nano) = batchd_core::pricing::usage_cost_nano(usage) else { return };
        if let Some(seen) = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).as_mut() {
            seen.spent_nano += nano;
        }
    }
}

/// `until` (Unix ms) as an RFC 3339 UTC time, for the log line of a held submit.
pub fn format_until(until: UnixMillis) -> String {
    let time = std::time::UNIX_EPOCH + Duration::from_millis(until);
    humantime::format_rfc3339_seconds(time).to_string()
}

/// Whether a day's spend has reached its budget.
fn reached(limit_nano: u64, spent_nano: u64) -> bool {
    spent_nano >= limit_nano
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_holds_from_the_spend_that_reaches_it_to_the_next_utc_midnight() {
        assert!(!reached(1_000, 999));
        assert!(reached(1_000, 1_000));
        assert_eq!(next_midnight(0), DAY_MS);
        assert_eq!(next_midnight(DAY_MS - 1), DAY_MS);
        assert_eq!(next_midnight(DAY_MS), 2 * DAY_MS);
        assert_eq!(DailyBudget::new(Some(0.0)).limit_nano, None);
        assert_eq!(DailyBudget::new(None).limit_nano, None);
        assert_eq!(DailyBudget::new(Some(1.5)).limit_nano, Some(1_500_000_000));
    }
}
