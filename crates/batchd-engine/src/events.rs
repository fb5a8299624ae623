//! The batch event puller: reads Workers AI batch events from a Cloudflare Queue (pull consumer) and makes the
//! chunk of each finished batch due now, so its result is published within a second of completion while polls
//! stay a rare fallback.
//!
//! Events only wake; the poll decides. A lost event costs latency (the fallback poll still comes); a duplicated,
//! late or reordered one wakes a chunk that is already polled or finished, which changes nothing (`wake.lua` only
//! wakes a `polling` chunk due later). Every replica pulls: the queue leases each message to one puller, and a
//! replica that dies holding leases leaves them to come back after the visibility timeout. Messages are
//! acknowledged only after their wake-ups are written; one whose wake-up failed (Redis down) is left to come back.
//!
//! Anyone who can send to the queue can forge events, so an event can cost little: a chunk is woken at most once
//! per `poll.initial_interval_ms` (`wake.lua`), and the lines logged per event are rate-limited ([`LogLimit`]): one
//! per kind every [`LOG_EVERY`], with the count of those left out.

use std::time::{Duration, Instant};

use batchd_cloudflare::{EventKind, QueueClient, QueueMessage};
use batchd_core::Backoff;
use batchd_queue::Store;
use tokio_util::sync::CancellationToken;

use crate::metrics;

/// First wait after an empty pull or an error; it doubles up to `events.max_idle_ms`.
const FIRST_IDLE: Duration = Duration::from_millis(100);

/// How the puller reads the queue (from the daemon's `[events]`).
#[derive(Debug, Clone)]
pub struct PullSettings {
    /// The queue's id, for logs.
    pub queue_id: String,
    /// Messages asked for per pull (at most 100).
    pub batch_size: u32,
    /// How long a pulled message stays leased to this replica before the queue offers it again.
    pub visibility_timeout: Duration,
    /// Longest wait between two pulls while the queue stays empty (the wait starts short and doubles).
    pub max_idle: Duration,
}

/// Per-event log lines of one kind are written at most once per this long.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// A per-event log line's rate limit: the first line goes out, then at most one per [`LOG_EVERY`], carrying how
/// many were left out since the last one.
#[derive(Debug, Default)]
pub struct LogLimit {
    /// When the last line went out.
    last: Option<Instant>,
    /// Lines left out since.
    suppressed: u64,
}

impl LogLimit {
    /// Whether a line may go out at `now`; `Some(n)` with the lines left out before it, `None` to leave it out.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < LOG_EVERY => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// The rate limits of the puller's per-event lines.
#[derive(Debug, Default)]
struct EventLogs {
    /// "could not wake a batch's chunk".
    wake_failed: LogLimit,
    /// "batch failed event".
    batch_failed: LogLimit,
}

/// Pulls events until `stop`, waking chunks in any of `stores` (one per namespace the daemon serves), each at most
/// once per `wake_gap` (`poll.initial_interval_ms`).
pub async fn run_puller(
    client: QueueClient,
    stores: Vec<Store>,
    settings: PullSettings,
    wake_gap: Duration,
    stop: CancellationToken,
) {
    let mut logs = EventLogs::default();
    let max_idle = settings.max_idle;
    let mut idle = Backoff::new(FIRST_IDLE, max_idle);
    tracing::info!(queue_id = %settings.queue_id, "batch event puller started");
    while !stop.is_cancelled() {
        let pulled = client.pull(settings.batch_size, settings.visibility_timeout).await;
        if let Ok(pulled) = &pulled {
            let oldest_age = pulled
                .oldest_message_ms
                .map(|sent| Duration::from_millis(batchd_queue::now_ms().saturating_sub(sent)))
                .or_else(|| (pulled.backlog == Some(0)).then_some(Duration::ZERO));
            metrics::events_backlog(pulled.backlog, oldest_age);
        }
        let wait = match pulled {
            Ok(pulled) if pulled.messages.is_empty() => idle.failed(),
            Ok(pulled) => {
                idle.succeeded();
                let acks = wake_all(&stores, pulled.messages, wake_gap, &mut logs).await;
                if !acks.is_empty()
                    && let Err(error) = client.ack(&acks).await
                {
                    // Unacknowledged, the messages come back after the visibility timeout: only a second wake-up.
                    tracing::warn!(error = %error, n = acks.len(), "could not acknowledge batch events; they will be delivered again");
                }
                Duration::ZERO
            }
            Err(error) if error.http_status == Some(429) => {
                let wait = error.retry_after.unwrap_or(max_idle).max(max_idle);
                tracing::warn!(error = %error, retry_in = ?wait, "the queue rate-limits pulls; waiting");
                wait
            }
            Err(error) => {
                let wait = idle.failed();
                tracing::warn!(error = %error, retry_in = ?wait, "pulling batch events failed; retrying (polls go on meanwhile)");
                wait
            }
        };
        if !wait.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => break,
            }
        }
    }
    tracing::info!("batch event puller stopped");
}

/// Wakes the chunk of every event; returns the lease ids to acknowledge (all but those whose wake-up could not be
/// written).
async fn wake_all(
    stores: &[Store],
    messages: Vec<QueueMessage>,
    wake_gap: Duration,
    logs: &mut EventLogs,
) -> Vec<String> {
    let mut acks = Vec::with_capacity(messages.len());
    for message in messages {
        let Some(event) = &message.event else {
            metrics::event_received("unreadable");
            tracing::debug!(attempts = message.attempts, "a queue message that is not a batch event; acknowledged");
            acks.push(message.lease_id);
            continue;
        };
        metrics::event_received(event.kind.as_str());
        if !matches!(event.kind, EventKind::Succeeded | EventKind::Failed) {
            // `queued` (and types batchd does not know) say nothing a poll could read yet: polling now would only
            // cost a request.
            metrics::event_matched("ignored");
            acks.push(message.lease_id);
            continue;
        }
        match wake(stores, &event.request_id, wake_gap).await {
            Ok(outcome) => {
                metrics::event_matched(outcome);
                if outcome == "woken"
                    && let Some(sent) = message.timestamp_ms
                {
                    let latency = batchd_queue::now_ms().saturating_sub(sent);
                    metrics::event_wake_latency(Duration::from_millis(latency));
                }
                if matches!(event.kind, EventKind::Failed)
                    && let Some(suppressed) = logs.batch_failed.allow(Instant::now())
                {
                    tracing::info!(request_id = %event.request_id, outcome, suppressed, "batch failed event; its poll reads the cause");
                }
                acks.push(message.lease_id);
            }
            Err(error) => {
                metrics::redis_error("wake");
                if let Some(suppressed) = logs.wake_failed.allow(Instant::now()) {
                    tracing::warn!(request_id = %event.request_id, error = %error, suppressed, "could not wake a batch's chunk; the event will be delivered again");
                }
            }
        }
    }
    acks
}

/// Finds the chunk of `request_id` in any namespace and makes it due now: `woken`, `known` (found, not polling or
/// already due) or `unknown` (another application's batch, or one whose ledger expired).
async fn wake(stores: &[Store], request_id: &str, gap: Duration) -> Result<&'static str, batchd_queue::StoreError> {
    for store in stores {
        let now = store.now().await?;
        if let Some((_, woken)) = store.wake_request(request_id, now, gap).await? {
            return Ok(if woken { "woken" } else { "known" });
        }
    }
    Ok("unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_line_goes_out_once_per_period_with_the_count_left_out() {
        let mut limit = LogLimit::default();
        let start = Instant::now();
        assert_eq!(limit.allow(start), Some(0));
        for n in 1..=5 {
            assert_eq!(limit.allow(start + Duration::from_millis(n)), None);
        }
        assert_eq!(limit.allow(start + LOG_EVERY - Duration::from_millis(1)), None);
        assert_eq!(limit.allow(start + LOG_EVERY), Some(6));
        assert_eq!(limit.allow(start + LOG_EVERY + Duration::from_secs(1)), None);
        assert_eq!(limit.allow(start + LOG_EVERY * 3), Some(1));
    }
}
