//! The sampler: reads each namespace's queue depths and pause flag from Redis with bounded commands, sets the
//! queue gauges, and records Redis reachability and paused namespaces in [`Health`] for `/readyz`. On the same
//! rhythm it rolls the finished minutes' counters up into their hours' (`Store::roll_up_counters`), and sets the
//! age of the oldest unfinished remote batch per provider and model from the first [`REMOTE_WINDOW`] members of
//! the remote-batches index (`Keys::remote_batches`, scored by submit time); and it writes the batch times this
//! process counted ([`batchd_engine::turnaround`]) into the hour's per-model counters, a few commands per sample,
//! so the poll step adds no Redis command per batch for them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use batchd_core::Keys;
use batchd_queue::Conn;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use super::Health;
use super::systemd::notify_status;
use batchd_engine::metrics;

/// How many of the oldest unfinished remote batches one sample reads (one `HMGET` each): a stuck model's batches
/// become the oldest ones, so it shows whatever the number of younger batches in flight.
pub const REMOTE_WINDOW: usize = 64;

/// Queue depths read from Redis in one sample.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueSample {
    /// Entries in the submit stream (not yet taken in: unread plus in flight).
    pub submit_entries: u64,
    /// Of those, entries read by a replica and not yet acknowledged (`XPENDING` of the group).
    pub submit_in_flight: u64,
    /// Steps in the schedule (polls and submit retries).
    pub scheduled: u64,
    /// Of those, steps whose due time has passed.
    pub due: u64,
    /// Entries in the dead-letter stream.
    pub dead: u64,
    /// Id of the first entry of the submit stream (the oldest waiting one), if any.
    pub oldest_entry_id: Option<String>,
    /// Due time (Unix ms) of the first step of the schedule, if any.
    pub earliest_due_ms: Option<u64>,
    /// The oldest unfinished remote batches, oldest first (at most [`REMOTE_WINDOW`]); `None` when the index could
    /// not be read (a key of another type): logged, and the gauges keep their values.
    pub remote: Option<Vec<batchd_queue::inspect::RemoteBatch>>,
}

impl QueueSample {
    /// Reads one sample through the storage's [`batchd_queue::inspect::depths`]; every command is bounded,
    /// whatever the backlog.
    pub async fn read(conn: &mut Conn, keys: &Keys, now_ms: u64) -> Result<Self, batchd_queue::StoreError> {
        let depths = batchd_queue::inspect::depths(conn, keys, now_ms).await?;
        Ok(Self {
            submit_entries: depths.submit_entries,
            submit_in_flight: depths.submit_in_flight,
            scheduled: depths.scheduled,
            due: depths.due,
            dead: depths.dead,
            oldest_entry_id: depths.oldest_entry_id,
            earliest_due_ms: depths.earliest_due_ms,
            remote: match batchd_queue::inspect::oldest_remote_batches(conn, keys, REMOTE_WINDOW).await {
                Ok(remote) => Some(remote),
                Err(batchd_queue::StoreError::Redis(error)) if error.code() == Some("WRONGTYPE") => {
                    tracing::warn!(key = %keys.remote_batches(), error = %error, "remote batches index unreadable");
                    None
                }
                Err(error) => return Err(error),
            },
        })
    }

    /// Sets the gauges of `namespace` from this sample.
    pub fn record(&self, namespace: &str, now_ms: u64) {
        let depth = |stream, state, depth| metrics::queue_depth(namespace, stream, state, depth);
        depth("submit", "pending", self.submit_entries.saturating_sub(self.submit_in_flight));
        depth("submit", "in_flight", self.submit_in_flight);
        depth("schedule", "scheduled", self.scheduled);
        depth("schedule", "due", self.due);
        depth("dead", "dead", self.dead);
        let age = self.oldest_entry_id.as_deref().map_or(Duration::ZERO, |id| entry_age(id, now_ms));
        metrics::oldest_waiting_job_age(namespace, age);
        metrics::schedule_lag(namespace, self.earliest_due_ms.map_or(Duration::ZERO, |due| lag(due, now_ms)));
    }

    /// The age of the oldest batch of each (provider, model) in [`Self::remote`] (`None` when it was unreadable).
    pub fn remote_ages(&self, now_ms: u64) -> Option<BTreeMap<(String, String), Duration>> {
        let mut ages = BTreeMap::new();
        for batch in self.remote.as_ref()? {
            let model = batch.model.clone().unwrap_or_default();
            let provider = batchd_core::ModelName::parse(&model).map(|m| m.provider().to_owned()).unwrap_or_default();
            ages.entry((provider, model)).or_insert_with(|| lag(batch.submitted_at, now_ms));
        }
        Some(ages)
    }
}

/// The `batchd_oldest_remote_batch_age_seconds` series one namespace has set, so a model whose batches all
/// finished reads 0 rather than its last age.
#[derive(Debug, Default)]
pub struct RemoteAgeSeries {
    /// The (provider, model) pairs set by the last sample.
    set: BTreeSet<(String, String)>,
}

impl RemoteAgeSeries {
    /// Sets the gauge of every pair in `ages`, and 0 for each pair set before and absent now.
    pub fn record(&mut self, namespace: &str, ages: BTreeMap<(String, String), Duration>) {
        for (provider, model) in &self.set {
            if !ages.contains_key(&(provider.clone(), model.clone())) {
                metrics::oldest_remote_batch_age(namespace, provider, model, Duration::ZERO);
            }
        }
        for ((provider, model), age) in &ages {
            metrics::oldest_remote_batch_age(namespace, provider, model, *age);
        }
        self.set = ages.into_keys().collect();
    }
}

/// Writes the batch times this process counted since the last sample ([`batchd_engine::turnaround`]) into the
/// hour's counters of `keys`' namespace: one round trip of at most `MAX_MODELS × buckets + 1` commands. Counts
/// that could not be written are kept for the next sample.
async fn flush_turnaround(conn: &mut Conn, keys: &Keys, now_ms: u64) {
    let counts = batchd_engine::turnaround::take(keys.namespace());
    if counts.is_empty() {
        return;
    }
    if let Err(error) = batchd_queue::turnaround::flush(conn, keys, now_ms, &counts).await {
        tracing::warn!(namespace = %keys.namespace(), error = %error, "batch times not written; kept for the next sample");
        batchd_engine::turnaround::give_back(keys.namespace(), counts);
    }
}

/// Age of a stream entry from the millisecond part of its id (`<ms>-<seq>`); zero for ids in the future or
/// not of that form (a producer that chose its own ids).
pub fn entry_age(entry_id: &str, now_ms: u64) -> Duration {
    let ms = entry_id.split_once('-').map_or(entry_id, |(ms, _)| ms);
    ms.parse::<u64>().map_or(Duration::ZERO, |ms| Duration::from_millis(now_ms.saturating_sub(ms)))
}

/// How long a step due at `due_ms` has been overdue at `now_ms` (zero if not due yet).
pub fn lag(due_ms: u64, now_ms: u64) -> Duration {
    Duration::from_millis(now_ms.saturating_sub(due_ms))
}

/// The `/readyz` detail of a paused namespace: `intake paused in namespace batchd (paused by ops@host at ...)`,
/// escaped and capped (the flag's value is whatever was written to Redis).
pub fn pause_detail(namespace: &str, flag: &str) -> String {
    let record = crate::cli::pause::PauseRecord::parse(flag);
    format!("intake paused in namespace {namespace} ({})", record.describe())
}

/// The sampler: every `interval`, reads a [`QueueSample`] and the pause flag of each namespace, sets the gauges and
/// records Redis reachability and paused namespaces in `health`; also runs the Prometheus recorder's upkeep. Runs
/// until `stop` is cancelled.
pub async fn run_sampler(
    mut conn: Conn,
    namespaces: Vec<Keys>,
    interval: Duration,
    health: Arc<Health>,
    recorder: PrometheusHandle,
    stop: CancellationToken,
) {
    let timeout = interval.max(Duration::from_secs(2));
    let mut remote_series: Vec<RemoteAgeSeries> = namespaces.iter().map(|_| RemoteAgeSeries::default()).collect();
    let stores: Vec<batchd_queue::Store> = namespaces
        .iter()
        .map(|keys| batchd_queue::Store::new(conn.clone(), keys.clone(), batchd_queue::StoreSettings::default()))
        .collect();
    loop {
        let now_ms = batchd_queue::now_ms();
        let mut outcome = Ok(());
        let mut paused = Vec::new();
        for (keys, series) in namespaces.iter().zip(&mut remote_series) {
            let sample = async {
                let sample = QueueSample::read(&mut conn, keys, now_ms).await?;
                Ok::<_, batchd_queue::StoreError>((sample, batchd_queue::inspect::pause_flag(&mut conn, keys).await?))
            };
            match tokio::time::timeout(timeout, sample).await {
                Ok(Ok((sample, flag))) => {
                    sample.record(keys.namespace(), now_ms);
                    if let Some(ages) = sample.remote_ages(now_ms) {
                        series.record(keys.namespace(), ages);
                    }
                    paused.extend(flag.map(|flag| pause_detail(keys.namespace(), &flag)));
                }
                Ok(Err(error)) => outcome = Err(format!("redis unreachable: {error}")),
                Err(_) => outcome = Err(format!("redis unreachable: no answer within {timeout:?}")),
            }
            if outcome.is_err() {
                break;
            }
        }
        if outcome.is_ok() && health.set_paused(paused.clone()) {
            if paused.is_empty() {
                tracing::info!("intake running");
            } else {
                tracing::warn!(paused = %paused.join("; "), "intake paused; work in flight goes on");
            }
        }
        metrics::redis_up(outcome.is_ok());
        if let Err(reason) = &outcome {
            metrics::redis_error("sample");
            if health.set_redis(outcome.clone()) {
                tracing::warn!(reason = %reason, "not ready: redis unreachable");
                notify_status(&format!("running; {reason}"));
            }
        } else if health.set_redis(Ok(())) {
            tracing::info!("ready: redis reachable");
            notify_status("running; redis reachable");
        }
        if outcome.is_ok() {
            for store in &stores {
                if let Err(error) = store.roll_up_counters(now_ms).await {
                    tracing::warn!(namespace = %store.keys().namespace(), error = %error, "finished-jobs counters not rolled up into hours");
                }
            }
            for keys in &namespaces {
                flush_turnaround(&mut conn, keys, now_ms).await;
            }
        }
        recorder.run_upkeep();
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_age_comes_from_the_id() {
        assert_eq!(entry_age("1000-0", 4500), Duration::from_millis(3500));
        assert_eq!(entry_age("5000-3", 4500), Duration::ZERO, "clock skew: never negative");
        assert_eq!(entry_age("not-an-id", 4500), Duration::ZERO);
        assert_eq!(lag(1000, 1500), Duration::from_millis(500));
        assert_eq!(lag(2000, 1500), Duration::ZERO);
    }

    /// The sampler's flush of batch times is bounded whatever producers name: a flood of models and batches
    /// becomes at most `MAX_MODELS × buckets + 1` commands in one round trip.
    #[test]
    fn the_batch_time_flush_is_bounded() {
        use batchd_core::turnaround::BOUNDS_SECS;
        use batchd_engine::turnaround::{MAX_MODELS, record, take};
        let ns = "sampler-flush-bound";
        for n in 0..10 * MAX_MODELS {
            for bucket_secs in [1, 100, 1000, 100_000, 1_000_000] {
                record(ns, &format!("model-{n}"), Duration::from_secs(bucket_secs));
            }
        }
        let counts = take(ns);
        assert_eq!(counts.len(), MAX_MODELS);
        let commands = batchd_queue::turnaround::flush_commands(&counts);
        assert_eq!(commands, MAX_MODELS * 5 + 1);
        assert!(commands <= MAX_MODELS * (BOUNDS_SECS.len() + 1) + 1);
        assert_eq!(batchd_queue::turnaround::flush_commands(&take(ns)), 0, "nothing to add, nothing sent");
    }
}
