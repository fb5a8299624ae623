//! The events side of the emulator's state: settings, faults, the queue, counters and the queue call log.
//!
//! [`crate::state`] owns one [`EventHub`] behind its mutex and decides *when* events happen (at an accepted submit;
//! when a batch's done time passes); the hub decides what reaches the queue (the event faults) and runs pulls and
//! acks against it.

use std::{sync::Arc, time::Duration};

use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::{
    calls::QueueCallRecord,
    config::EmulatorConfig,
    events::{EventCounts, EventFacts, EventFaults, EventsConfig, event_json},
    limits::RateLimiter,
    queue::{AckOutcome, Backlog, Delivery, EventQueue},
    subscriptions::Subscriptions,
};

/// Mixed into [`EmulatorConfig::seed`] for the events generator, so that event faults do not shift the draws of
/// the batch API's random faults, durations and latency.
const EVENTS_SEED_SALT: u64 = 0x6576_656e_7473;

/// Counts of the events queue, for tests (`EmulatorHandle::queue_stats`, `GET /_emulator/queue`).
///
/// Counters run since start (resets and purges keep them); the message counts are a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStats {
    /// Whether events are on.
    pub enabled: bool,
    /// Events published per type, before faults (a dropped event counts; a duplicated one counts once).
    pub published: EventCounts,
    /// Events the drop fault kept out of the queue.
    pub dropped: u64,
    /// Events not published because no subscription covers their model and type (with `all_models` off).
    pub unsubscribed: u64,
    /// Extra copies the duplicate fault enqueued.
    pub duplicated: u64,
    /// Messages enqueued (published − dropped + duplicated).
    pub enqueued: u64,
    /// Messages the delay fault holds back: not in the queue yet.
    pub in_flight: usize,
    /// Messages in the queue and not acknowledged: `available + leased + waiting` (the pull's `backlog_count`).
    pub backlog: usize,
    /// Messages a pull would hand out now.
    pub available: usize,
    /// Messages under a live lease.
    pub leased: usize,
    /// Messages retried with a delay that has not passed yet.
    pub waiting: usize,
    /// Messages handed out by pulls, redeliveries included.
    pub delivered: u64,
    /// Deliveries with `attempts` 2 or more.
    pub redelivered: u64,
    /// Messages acknowledged.
    pub acked: u64,
    /// Explicit retries accepted.
    pub retried: u64,
    /// Leases that ran out before an ack or a retry.
    pub expired_leases: u64,
    /// Messages dropped for good after `max_retries` redeliveries.
    pub dead: u64,
    /// Acks and retries not applied because their lease had expired or was unknown (each is one ack-reply warning).
    pub ack_warnings: u64,
    /// Pulls answered 200.
    pub pulls: u64,
    /// Acks answered 200.
    pub acks: u64,
    /// Pulls answered 429 by [`EventsConfig::pull_rate_limit`].
    pub pulls_rate_limited: u64,
}

/// What a pull got: the messages leased to it, and the backlog after it.
#[derive(Debug)]
pub(crate) struct Pulled {
    /// The messages, in reply order.
    pub deliveries: Vec<Delivery>,
    /// The backlog once they are leased (leased messages still count).
    pub backlog: Backlog,
}

/// Settings, faults, queue, counters and call log of the events side.
#[derive(Debug)]
pub(crate) struct EventHub {
    /// The account events are about.
    account_id: String,
    /// Current settings; `None`: events off.
    pub config: Option<EventsConfig>,
    /// Current faults.
    pub faults: EventFaults,
    /// Generator of `drop_rate` draws and `random` orders.
    rng: StdRng,
    /// The queue.
    queue: EventQueue,
    /// Events published per type.
    published: EventCounts,
    /// Events dropped by the drop fault.
    dropped: u64,
    /// Events no subscription covered.
    unsubscribed: u64,
    /// The account's event subscriptions.
    pub subscriptions: Subscriptions,
    /// Extra copies enqueued by the duplicate fault.
    duplicated: u64,
    /// Pulls answered 200.
    pulls: u64,
    /// Acks answered 200.
    acks: u64,
    /// Pulls answered 429 by the pull rate limit.
    pulls_rate_limited: u64,
    /// Admitted pulls, for the pull rate limit.
    pull_limiter: RateLimiter,
    /// The queue call log.
    calls: Vec<QueueCallRecord>,
    /// Sequence number of the last logged queue call.
    last_seq: u64,
}

impl EventHub {
    pub fn new(config: &EmulatorConfig) -> Self {
        Self {
            account_id: config.account_id.clone(),
            config: config.events.clone(),
            faults: config.event_faults.clone().clamped(),
            rng: StdRng::seed_from_u64(config.seed ^ EVENTS_SEED_SALT),
            queue: EventQueue::default(),
            published: EventCounts::default(),
            dropped: 0,
            unsubscribed: 0,
            subscriptions: Subscriptions::default(),
            duplicated: 0,
            pulls: 0,
            acks: 0,
            pulls_rate_limited: 0,
            pull_limiter: RateLimiter::default(),
            calls: Vec::new(),
            last_seq: 0,
        }
    }

    /// The account events are about.
    pub fn account_id(&self) -> &str {
        &self.account_id
    }

    /// The retries a message gets (none when events are off: nothing is pulled then).
    fn max_retries(&self) -> Option<u32> {
        self.config.as_ref().and_then(|config| config.max_retries)
    }

    /// Replaces the settings; a changed pull rate limit starts with an empty window.
    pub fn set_config(&mut self, config: Option<EventsConfig>) {
        let old_limit = self.config.as_ref().and_then(|config| config.pull_rate_limit);
        let new_limit = config.as_ref().and_then(|config| config.pull_rate_limit);
        if old_limit != new_limit {
            self.pull_limiter.clear();
        }
        self.config = config;
    }

    /// Publishes the event `facts` describe, which happened at `at`: counts it, applies the faults, and enqueues
    /// what is left to enter the queue at `at` plus the delay fault. Does nothing while events are off.
    pub fn publish(&mut self, facts: EventFacts<'_>, at: Instant, now: Instant, now_ms: u64) {
        let Some(config) = &self.config else {
            return;
        };
        let subscription_id = if config.all_models {
            config.subscription_id.clone()
        } else {
            match self.subscriptions.covering(facts.model, &config.queue_id, facts.event_type.short()) {
                Some(id) => id.to_owned(),
                None => {
                    self.unsubscribed += 1;
                    tracing::debug!(
                        model = facts.model,
                        event = facts.event_type.as_str(),
                        "no subscription: event not published"
                    );
                    return;
                }
            }
        };
        self.published.add(facts.event_type);
        if self.faults.drop_next > 0 {
            self.faults.drop_next -= 1;
            self.dropped += 1;
            tracing::debug!(request_id = facts.request_id, event = facts.event_type.as_str(), "event dropped");
            return;
        }
        if self.faults.drop_rate > 0.0 && self.rng.random_bool(self.faults.drop_rate) {
            self.dropped += 1;
            tracing::debug!(request_id = facts.request_id, event = facts.event_type.as_str(), "event dropped");
            return;
        }
        let body: Arc<str> = Arc::from(event_json(facts, config, &subscription_id));
        let enters_at = at + self.faults.delay;
        let timestamp_ms = unix_ms_at(enters_at, now, now_ms);
        let copies = if self.faults.duplicate { 2 } else { 1 };
        self.duplicated += copies - 1;
        for _ in 0..copies {
            self.queue.enqueue(Arc::clone(&body), enters_at, timestamp_ms);
        }
        tracing::debug!(request_id = facts.request_id, event = facts.event_type.as_str(), copies, "event published");
    }

    /// Admits a pull under the pull rate limit, or returns how long until one would be admitted.
    pub fn admit_pull(&mut self, now: Instant) -> Result<(), Duration> {
        let Some(config) = &self.config else {
            return Ok(());
        };
        let Some(limit) = config.pull_rate_limit else {
            return Ok(());
        };
        let admitted = self.pull_limiter.admit(&self.account_id, &config.queue_id, limit, now);
        if admitted.is_err() {
            self.pulls_rate_limited += 1;
        }
        admitted
    }

    /// Leases up to `batch_size` messages for `visibility`.
    pub fn pull(&mut self, now: Instant, batch_size: usize, visibility: Duration) -> Pulled {
        let max_retries = self.max_retries();
        let deliveries = self.queue.pull(now, batch_size, visibility, self.faults.order, &mut self.rng, max_retries);
        let backlog = self.queue.backlog(now, max_retries);
        self.pulls += 1;
        Pulled { deliveries, backlog }
    }

    /// Applies acks and retries.
    pub fn ack(&mut self, now: Instant, acks: &[String], retries: &[(String, Duration)]) -> AckOutcome {
        let max_retries = self.max_retries();
        let outcome = self.queue.ack(now, acks, retries, max_retries);
        self.acks += 1;
        outcome
    }

    /// Drops every message (counters stay).
    pub fn purge(&mut self) {
        self.queue.purge();
    }

    /// The counts at `now`.
    pub fn stats(&mut self, now: Instant) -> QueueStats {
        let max_retries = self.max_retries();
        let census = self.queue.census(now, max_retries);
        let counters = self.queue.counters;
        QueueStats {
            enabled: self.config.is_some(),
            published: self.published,
            dropped: self.dropped,
            unsubscribed: self.unsubscribed,
            duplicated: self.duplicated,
            enqueued: counters.enqueued,
            in_flight: census.in_flight,
            backlog: census.available + census.leased + census.waiting,
            available: census.available,
            leased: census.leased,
            waiting: census.waiting,
            delivered: counters.delivered,
            redelivered: counters.redelivered,
            acked: counters.acked,
            retried: counters.retried,
            expired_leases: counters.expired_leases,
            dead: counters.dead,
            ack_warnings: counters.ack_warnings,
            pulls: self.pulls,
            acks: self.acks,
            pulls_rate_limited: self.pulls_rate_limited,
        }
    }

    /// Appends a call to the queue call log, filling in `seq` and `at_ms`.
    pub fn record(&mut self, mut call: QueueCallRecord, now_ms: u64) {
        self.last_seq += 1;
        call.seq = self.last_seq;
        call.at_ms = now_ms;
        self.calls.push(call);
    }

    pub fn calls(&self) -> Vec<QueueCallRecord> {
        self.calls.clone()
    }

    /// Clears the queue call log and the pull rate-limit window (messages, settings, faults and counters stay).
    pub fn reset(&mut self) {
        self.calls.clear();
        self.last_seq = 0;
        self.pull_limiter.clear();
    }
}

/// The Unix time in milliseconds of `at`, given that `now` is `now_ms`.
pub(crate) fn unix_ms_at(at: Instant, now: Instant, now_ms: u64) -> u64 {
    let millis = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if at <= now { now_ms.saturating_sub(millis(now - at)) } else { now_ms.saturating_add(millis(at - now)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventType;

    fn hub(faults: EventFaults) -> EventHub {
        let config = EmulatorConfig {
            account_id: "acc".to_owned(),
            events: Some(EventsConfig::default()),
            event_faults: faults,
            ..EmulatorConfig::default()
        };
        EventHub::new(&config)
    }

    fn publish(hub: &mut EventHub, n: usize, now: Instant) {
        for i in 0..n {
            let request_id = format!("r{i}");
            let facts = EventFacts {
                event_type: EventType::Succeeded,
                model: "@cf/m",
                request_id: &request_id,
                account_id: "acc",
                at_ms: 1_000,
            };
            hub.publish(facts, now, now, 1_000);
        }
    }

    #[test]
    fn faults_shape_what_reaches_the_queue() {
        let now = Instant::now();
        let mut dropping = hub(EventFaults::drop_next(2));
        publish(&mut dropping, 3, now);
        let stats = dropping.stats(now);
        assert_eq!((stats.published.succeeded, stats.dropped, stats.enqueued, stats.available), (3, 2, 1, 1));
        assert_eq!(dropping.faults.drop_next, 0);

        let mut all_dropped = hub(EventFaults::drop_rate(1.0));
        publish(&mut all_dropped, 4, now);
        assert_eq!(all_dropped.stats(now).dropped, 4);

        let mut duplicating = hub(EventFaults::duplicate());
        publish(&mut duplicating, 2, now);
        let pulled = duplicating.pull(now, 10, Duration::from_secs(1));
        assert_eq!(pulled.deliveries.len(), 4);
        assert_eq!(pulled.deliveries[0].body, pulled.deliveries[1].body);
        assert_ne!(pulled.deliveries[0].id, pulled.deliveries[1].id);
        assert_eq!(duplicating.stats(now).duplicated, 2);

        let mut delaying = hub(EventFaults::delay(Duration::from_millis(500)));
        publish(&mut delaying, 1, now);
        assert_eq!(delaying.stats(now).in_flight, 1);
        assert!(delaying.pull(now, 10, Duration::from_secs(1)).deliveries.is_empty());
        let later = now + Duration::from_millis(500);
        let pulled = delaying.pull(later, 10, Duration::from_secs(1));
        assert_eq!(pulled.deliveries[0].timestamp_ms, 1_500, "timestamp_ms is when it entered the queue");
    }

    #[test]
    fn nothing_is_published_while_events_are_off() {
        let now = Instant::now();
        let mut hub = hub(EventFaults::none());
        hub.set_config(None);
        publish(&mut hub, 2, now);
        assert_eq!(hub.stats(now), QueueStats::default());
    }

    #[test]
    fn unix_time_of_an_instant() {
        let now = Instant::now();
        assert_eq!(unix_ms_at(now, now, 5_000), 5_000);
        assert_eq!(unix_ms_at(now - Duration::from_millis(200), now, 5_000), 4_800);
        assert_eq!(unix_ms_at(now + Duration::from_millis(200), now, 5_000), 5_200);
    }
}
