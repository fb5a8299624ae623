//! The queue behind the pull consumer: messages, leases, redelivery after the visibility timeout, acks and retries.
//!
//! Pure data driven by an explicit clock (`now`), so the lease rules are unit-tested without a server. The emulator's
//! state holds its one queue behind its mutex, which is why two pulls can never lease the same message.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use rand::{Rng, seq::SliceRandom};
use tokio::time::Instant;

use crate::events::PullOrder;

/// The messages of the events queue and their leases.
#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    /// Messages neither acknowledged nor dropped, by enqueue order.
    messages: BTreeMap<u64, Message>,
    /// Live leases: lease id to the position of its message.
    leases: HashMap<String, u64>,
    /// Position of the next message enqueued.
    next_seq: u64,
    /// What happened to messages since start.
    pub counters: QueueCounters,
}

/// What happened to messages since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct QueueCounters {
    /// Messages enqueued.
    pub enqueued: u64,
    /// Messages handed out by pulls, redeliveries included.
    pub delivered: u64,
    /// Of those, deliveries with `attempts` 2 or more.
    pub redelivered: u64,
    /// Messages acknowledged.
    pub acked: u64,
    /// Explicit retries accepted.
    pub retried: u64,
    /// Leases that ran out before an ack or a retry.
    pub expired_leases: u64,
    /// Messages dropped for good after `max_retries` redeliveries.
    pub dead: u64,
    /// Acks and retries that named an expired or unknown lease (not applied).
    pub ack_warnings: u64,
}

/// One message.
#[derive(Debug)]
struct Message {
    /// The message id (32 hex digits).
    id: String,
    /// The event JSON.
    body: Arc<str>,
    /// When it entered the queue, in Unix milliseconds.
    timestamp_ms: u64,
    /// When it enters the queue (later than now for an event the delay fault holds back).
    enters_at: Instant,
    /// When it can be pulled: when it enters, when its lease ran out, or after a retry's delay.
    visible_at: Instant,
    /// How many times pulls handed it out.
    deliveries: u32,
    /// The lease of its current delivery, while one is live (or until the next settle sees it expired).
    lease: Option<Lease>,
}

/// A delivery's lease.
#[derive(Debug)]
struct Lease {
    /// Opaque id the consumer acks with.
    id: String,
    /// When the message becomes available again without an ack.
    expires_at: Instant,
}

/// One message handed out by a pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delivery {
    /// The message id.
    pub id: String,
    /// Deliveries so far, this one included (1 the first time).
    pub attempts: u32,
    /// The event JSON.
    pub body: Arc<str>,
    /// The lease to ack or retry with.
    pub lease_id: String,
    /// When the message entered the queue, in Unix milliseconds.
    pub timestamp_ms: u64,
}

/// What one ack call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AckOutcome {
    /// Messages acknowledged.
    pub ack_count: u32,
    /// Messages put back for a retry.
    pub retry_count: u32,
    /// Lease ids named by acks or retries that were expired or unknown, in request order (acks first).
    pub refused: Vec<String>,
}

/// The queue's backlog: messages in it and not acknowledged (available, leased, or waiting out a retry delay).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Backlog {
    /// Number of messages.
    pub count: usize,
    /// Sum of their bodies' sizes (the event JSON, before any base64).
    pub bytes: usize,
    /// `timestamp_ms` of the oldest one; `None` when empty.
    pub oldest_timestamp_ms: Option<u64>,
}

/// Where the stored messages are now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Census {
    /// Held back by the delay fault: not in the queue yet.
    pub in_flight: usize,
    /// Can be pulled now.
    pub available: usize,
    /// Under a live lease.
    pub leased: usize,
    /// Retried with a delay that has not passed.
    pub waiting: usize,
}

/// Whether a message delivered `deliveries` times has used up its retries.
fn exhausted(deliveries: u32, max_retries: Option<u32>) -> bool {
    max_retries.is_some_and(|max| deliveries > max)
}

impl EventQueue {
    /// Adds a message that enters the queue (and can be pulled) at `enters_at`.
    pub fn enqueue(&mut self, body: Arc<str>, enters_at: Instant, timestamp_ms: u64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let message = Message { id, body, timestamp_ms, enters_at, visible_at: enters_at, deliveries: 0, lease: None };
        self.messages.insert(seq, message);
        self.counters.enqueued += 1;
    }

    /// Ends the leases that ran out by `now`: their messages become available again at the lease's end, or are
    /// dropped when they have used up `max_retries`.
    fn settle(&mut self, now: Instant, max_retries: Option<u32>) {
        let expired: Vec<u64> = self
            .messages
            .iter()
            .filter(|(_, message)| message.lease.as_ref().is_some_and(|lease| lease.expires_at <= now))
            .map(|(&seq, _)| seq)
            .collect();
        for seq in expired {
            let Some(message) = self.messages.get_mut(&seq) else {
                continue;
            };
            let Some(lease) = message.lease.take() else {
                continue;
            };
            self.leases.remove(&lease.id);
            message.visible_at = lease.expires_at;
            self.counters.expired_leases += 1;
            if exhausted(message.deliveries, max_retries) {
                self.messages.remove(&seq);
                self.counters.dead += 1;
            }
        }
    }

    /// Leases up to `batch_size` available messages for `visibility`, in `order`.
    pub fn pull(
        &mut self,
        now: Instant,
        batch_size: usize,
        visibility: Duration,
        order: PullOrder,
        rng: &mut impl Rng,
        max_retries: Option<u32>,
    ) -> Vec<Delivery> {
        self.settle(now, max_retries);
        let mut ready: Vec<u64> = self
            .messages
            .iter()
            .filter(|(_, message)| message.lease.is_none() && message.visible_at <= now)
            .map(|(&seq, _)| seq)
            .collect();
        match order {
            PullOrder::Fifo => {}
            PullOrder::Reverse => ready.reverse(),
            PullOrder::Random => ready.shuffle(rng),
        }
        ready.truncate(batch_size);
        let mut deliveries = Vec::with_capacity(ready.len());
        for seq in ready {
            let Some(message) = self.messages.get_mut(&seq) else {
                continue;
            };
            message.deliveries += 1;
            self.counters.delivered += 1;
            if message.deliveries >= 2 {
                self.counters.redelivered += 1;
            }
            let lease_id = format!("lease-{}", uuid::Uuid::new_v4().simple());
            message.lease = Some(Lease { id: lease_id.clone(), expires_at: now + visibility });
            self.leases.insert(lease_id.clone(), seq);
            deliveries.push(Delivery {
                id: message.id.clone(),
                attempts: message.deliveries,
                body: Arc::clone(&message.body),
                lease_id,
                timestamp_ms: message.timestamp_ms,
            });
        }
        deliveries
    }

    /// Takes the live lease `lease_id`, returning its message's position.
    fn take_lease(&mut self, lease_id: &str) -> Option<u64> {
        let seq = self.leases.remove(lease_id)?;
        self.messages.get_mut(&seq)?.lease.take()?;
        Some(seq)
    }

    /// Acknowledges the messages of `acks` and puts those of `retries` back after their delay; a lease that expired
    /// (or never existed, or was used already) changes nothing and is reported in [`AckOutcome::refused`].
    pub fn ack(
        &mut self,
        now: Instant,
        acks: &[String],
        retries: &[(String, Duration)],
        max_retries: Option<u32>,
    ) -> AckOutcome {
        self.settle(now, max_retries);
        let mut outcome = AckOutcome::default();
        for lease_id in acks {
            match self.take_lease(lease_id) {
                Some(seq) => {
                    self.messages.remove(&seq);
                    self.counters.acked += 1;
                    outcome.ack_count += 1;
                }
                None => outcome.refused.push(lease_id.clone()),
            }
        }
        for (lease_id, delay) in retries {
            let Some(seq) = self.take_lease(lease_id) else {
                outcome.refused.push(lease_id.clone());
                continue;
            };
            self.counters.retried += 1;
            outcome.retry_count += 1;
            let Some(message) = self.messages.get_mut(&seq) else {
                continue;
            };
            if exhausted(message.deliveries, max_retries) {
                self.messages.remove(&seq);
                self.counters.dead += 1;
            } else {
                message.visible_at = now + *delay;
            }
        }
        self.counters.ack_warnings += outcome.refused.len() as u64;
        outcome
    }

    /// The backlog at `now` (after ending the leases that ran out).
    pub fn backlog(&mut self, now: Instant, max_retries: Option<u32>) -> Backlog {
        self.settle(now, max_retries);
        let mut backlog = Backlog::default();
        for message in self.messages.values().filter(|message| message.enters_at <= now) {
            backlog.count += 1;
            backlog.bytes += message.body.len();
            backlog.oldest_timestamp_ms = Some(
                backlog.oldest_timestamp_ms.map_or(message.timestamp_ms, |oldest| oldest.min(message.timestamp_ms)),
            );
        }
        backlog
    }

    /// Where the messages are at `now` (after ending the leases that ran out).
    pub fn census(&mut self, now: Instant, max_retries: Option<u32>) -> Census {
        self.settle(now, max_retries);
        let mut census = Census::default();
        for message in self.messages.values() {
            if message.enters_at > now {
                census.in_flight += 1;
            } else if message.lease.is_some() {
                census.leased += 1;
            } else if message.visible_at > now {
                census.waiting += 1;
            } else {
                census.available += 1;
            }
        }
        census
    }

    /// Drops every message and lease (the counters stay).
    pub fn purge(&mut self) {
        self.messages.clear();
        self.leases.clear();
    }
}

#[cfg(test)]
mod tests {
    use rand::{SeedableRng, rngs::StdRng};

    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn queue_of(n: usize, at: Instant) -> EventQueue {
        let mut queue = EventQueue::default();
        for i in 0..n {
            queue.enqueue(Arc::from(format!("{{\"n\":{i}}}")), at, 1000 + i as u64);
        }
        queue
    }

    fn pull(queue: &mut EventQueue, now: Instant, n: usize) -> Vec<Delivery> {
        queue.pull(now, n, SECOND, PullOrder::Fifo, &mut StdRng::seed_from_u64(0), Some(3))
    }

    #[test]
    fn a_leased_message_comes_back_after_the_visibility_timeout_with_one_more_attempt() {
        let start = Instant::now();
        let mut queue = queue_of(2, start);
        let first = pull(&mut queue, start, 1);
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].attempts, &*first[0].body, first[0].timestamp_ms), (1, "{\"n\":0}", 1000));
        // Leased: the next pull gets the other message, then nothing.
        let second = pull(&mut queue, start, 5);
        assert_eq!(second.iter().map(|d| &*d.body).collect::<Vec<_>>(), ["{\"n\":1}"]);
        assert!(pull(&mut queue, start + SECOND - Duration::from_millis(1), 5).is_empty());
        // At the end of the lease both are available again, with attempts 2 and new leases.
        let again = pull(&mut queue, start + SECOND, 5);
        assert_eq!(
            again.iter().map(|d| (d.id.clone(), d.attempts)).collect::<Vec<_>>(),
            [(first[0].id.clone(), 2), (second[0].id.clone(), 2)]
        );
        assert_ne!(again[0].lease_id, first[0].lease_id);
        assert_eq!(queue.counters.expired_leases, 2);
        assert_eq!(queue.counters.redelivered, 2);
        assert_eq!(queue.counters.delivered, 4);
    }

    #[test]
    fn acks_need_a_live_lease() {
        let start = Instant::now();
        let mut queue = queue_of(3, start);
        let delivered = pull(&mut queue, start, 3);
        let lease = |i: usize| delivered[i].lease_id.clone();
        let outcome = queue.ack(start, &[lease(0), lease(0), "nonsense".to_owned()], &[], Some(3));
        assert_eq!(
            outcome,
            AckOutcome { ack_count: 1, retry_count: 0, refused: vec![lease(0), "nonsense".to_owned()] }
        );
        // Expired: not acknowledged, and delivered again.
        let outcome = queue.ack(start + SECOND, &[lease(1)], &[(lease(2), Duration::ZERO)], Some(3));
        assert_eq!(outcome.refused, [lease(1), lease(2)]);
        assert_eq!(queue.backlog(start + SECOND, Some(3)).count, 2);
        let again = pull(&mut queue, start + SECOND, 5);
        assert_eq!(again.len(), 2);
        assert_eq!(queue.counters.acked, 1);
        assert_eq!(queue.counters.ack_warnings, 4);
    }

    #[test]
    fn a_retry_waits_its_delay_and_counts_an_attempt() {
        let start = Instant::now();
        let mut queue = queue_of(1, start);
        let delivered = pull(&mut queue, start, 1);
        let outcome = queue.ack(start, &[], &[(delivered[0].lease_id.clone(), 10 * SECOND)], Some(3));
        assert_eq!((outcome.retry_count, outcome.refused.len()), (1, 0));
        assert_eq!(queue.census(start, Some(3)), Census { waiting: 1, ..Census::default() });
        assert!(pull(&mut queue, start + 9 * SECOND, 1).is_empty());
        let again = pull(&mut queue, start + 10 * SECOND, 1);
        assert_eq!(again[0].attempts, 2);
        assert_eq!(queue.census(start + 10 * SECOND, Some(3)), Census { leased: 1, ..Census::default() });
    }

    #[test]
    fn a_message_is_dropped_after_max_retries() {
        let start = Instant::now();
        let mut queue = queue_of(1, start);
        let mut now = start;
        for attempt in 1..=2 {
            let delivered = queue.pull(now, 1, SECOND, PullOrder::Fifo, &mut StdRng::seed_from_u64(0), Some(1));
            assert_eq!(delivered[0].attempts, attempt);
            now += SECOND;
        }
        assert!(queue.pull(now, 1, SECOND, PullOrder::Fifo, &mut StdRng::seed_from_u64(0), Some(1)).is_empty());
        assert_eq!(queue.counters.dead, 1);
        assert_eq!(queue.backlog(now, Some(1)), Backlog::default());
    }

    #[test]
    fn late_messages_are_in_flight_until_they_enter() {
        let start = Instant::now();
        let mut queue = EventQueue::default();
        queue.enqueue(Arc::from("{}"), start + SECOND, 5);
        assert_eq!(queue.census(start, None), Census { in_flight: 1, ..Census::default() });
        assert_eq!(queue.backlog(start, None).count, 0);
        assert!(pull(&mut queue, start, 1).is_empty());
        assert_eq!(queue.backlog(start + SECOND, None), Backlog { count: 1, bytes: 2, oldest_timestamp_ms: Some(5) });
        assert_eq!(pull(&mut queue, start + SECOND, 1).len(), 1);
    }

    #[test]
    fn orders() {
        let start = Instant::now();
        let bodies = |order: PullOrder, seed: u64| {
            let mut queue = queue_of(6, start);
            let delivered = queue.pull(start, 10, SECOND, order, &mut StdRng::seed_from_u64(seed), None);
            delivered.iter().map(|d| d.timestamp_ms).collect::<Vec<_>>()
        };
        assert_eq!(bodies(PullOrder::Fifo, 0), [1000, 1001, 1002, 1003, 1004, 1005]);
        assert_eq!(bodies(PullOrder::Reverse, 0), [1005, 1004, 1003, 1002, 1001, 1000]);
        let random = bodies(PullOrder::Random, 7);
        assert_eq!(random, bodies(PullOrder::Random, 7), "the same seed gives the same order");
        let mut sorted = random.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, bodies(PullOrder::Fifo, 0));
    }
}
