//! The load of a chaos run: a producer that enqueues jobs the way services do (pipelined `XADD`, retried while
//! Redis is away), and a result consumer that reads the results stream as it grows.
//!
//! A job counts as enqueued only once its `XADD` was acknowledged; the acknowledgement time is kept, so a job
//! lost with Redis can be matched against the persistence policy. The consumer sees every result entry once
//! and notes when it arrived, which gives "work resumed" times after a fault and catches a result that is
//! published twice even if something later removed one of the entries.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use batchd_core::Keys;
use redis::aio::ConnectionManager;
use redis::streams::{StreamReadOptions, StreamReadReply};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::cluster::MODEL;
use super::unix_ms;

/// The job JSON of `id`: one bge-small item whose `external_reference` is the job id, so the emulator's call
/// log names the job of every submit.
pub fn job(id: &str) -> String {
    serde_json::json!({
        "id": id,
        "model": MODEL,
        "requests": [{"text": format!("chaos job {id}"), "external_reference": id}],
    })
    .to_string()
}

/// Job ids `<prefix>-0`, `<prefix>-1`, ...
pub fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Enqueues `ids` with one pipeline of `XADD`s; returns the entry ids Redis gave them, in order.
pub async fn enqueue(conn: &mut ConnectionManager, keys: &Keys, ids: &[String]) -> redis::RedisResult<Vec<String>> {
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.cmd("XADD").arg(keys.submit()).arg("*").arg("job").arg(job(id));
    }
    pipe.query_async(conn).await
}

/// What the producer did.
#[derive(Debug, Clone, Default)]
pub struct Produced {
    /// Every acknowledged job id with the Unix ms of its acknowledgement.
    pub acked: HashMap<String, u64>,
    /// The stream entry id of each acknowledged job's (last) `XADD`, to tell whether a restarted Redis kept it.
    pub entry_ids: HashMap<String, String>,
    /// Pipelines that failed (Redis away) and were sent again.
    pub failed_attempts: u64,
    /// When the last job was acknowledged, in Unix ms.
    pub finished_ms: u64,
    /// The job ids under which hostile entries (scenario 8) get their `failed` results: the final check leaves
    /// them to their scenario and only waits for them.
    pub hostile: HashSet<String>,
}

/// Enqueues `ids` in pipelines of `batch`, one every `every`, retrying a failed pipeline (a resent job id is
/// the same job to batchd) until it is acknowledged.
pub async fn produce(
    mut conn: ConnectionManager,
    keys: Keys,
    ids: Vec<String>,
    batch: usize,
    every: Duration,
) -> Produced {
    let mut produced = Produced::default();
    for chunk in ids.chunks(batch.max(1)) {
        let started = tokio::time::Instant::now();
        let entry_ids = loop {
            match enqueue(&mut conn, &keys, chunk).await {
                Ok(entry_ids) => break entry_ids,
                Err(_) => {
                    produced.failed_attempts += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        let at = unix_ms();
        produced.acked.extend(chunk.iter().map(|id| (id.clone(), at)));
        produced.entry_ids.extend(chunk.iter().cloned().zip(entry_ids));
        tokio::time::sleep_until(started + every).await;
    }
    produced.finished_ms = unix_ms();
    produced
}

/// Starts [`produce`] on its own task.
pub fn spawn_producer(
    conn: ConnectionManager,
    keys: Keys,
    ids: Vec<String>,
    batch: usize,
    every: Duration,
) -> JoinHandle<Produced> {
    tokio::spawn(produce(conn, keys, ids, batch, every))
}

/// What the result consumer has seen.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    /// Result entries seen per job id.
    pub seen: HashMap<String, u32>,
    /// Unix ms at which each result entry was first seen, in order.
    pub arrivals: Vec<u64>,
    /// Reads that failed (Redis away).
    pub errors: u64,
}

impl Collected {
    /// Number of distinct jobs with a result.
    pub fn distinct(&self) -> usize {
        self.seen.len()
    }

    /// The first arrival at or after `ms`.
    pub fn first_arrival_after(&self, ms: u64) -> Option<u64> {
        self.arrivals.iter().copied().find(|at| *at >= ms)
    }
}

/// A consumer reading the results stream from the start, on its own task.
#[derive(Debug)]
pub struct Collector {
    /// What it has seen so far.
    state: Arc<Mutex<Collected>>,
    /// Stops it.
    stop: CancellationToken,
    /// Its task.
    task: JoinHandle<()>,
}

impl Collector {
    /// Starts reading `{ns}:results` with `XREAD` from the beginning.
    pub fn start(mut conn: ConnectionManager, keys: Keys) -> Self {
        let state = Arc::new(Mutex::new(Collected::default()));
        let stop = CancellationToken::new();
        let task = {
            let state = Arc::clone(&state);
            let stop = stop.clone();
            tokio::spawn(async move {
                let key = keys.results();
                let mut last_id = "0-0".to_owned();
                let options = StreamReadOptions::default().count(5000);
                while !stop.is_cancelled() {
                    let reply: redis::RedisResult<StreamReadReply> =
                        redis::AsyncCommands::xread_options(&mut conn, &[&key], &[&last_id], &options).await;
                    let entries = match reply {
                        Ok(reply) => reply.keys.into_iter().flat_map(|key| key.ids).collect::<Vec<_>>(),
                        Err(_) => {
                            lock(&state).errors += 1;
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            continue;
                        }
                    };
                    if entries.is_empty() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    let now = unix_ms();
                    let mut collected = lock(&state);
                    for entry in entries {
                        last_id = entry.id.clone();
                        let job_id: Option<String> = entry.get("job_id");
                        *collected.seen.entry(job_id.unwrap_or_default()).or_default() += 1;
                        collected.arrivals.push(now);
                    }
                }
            })
        };
        Self { state, stop, task }
    }

    /// A copy of what it has seen.
    pub fn snapshot(&self) -> Collected {
        lock(&self.state).clone()
    }

    /// Number of distinct jobs with a result so far.
    pub fn distinct(&self) -> usize {
        lock(&self.state).distinct()
    }

    /// Stops it and returns what it saw.
    pub async fn stop(self) -> Collected {
        self.stop.cancel();
        let _ = self.task.await;
        lock(&self.state).clone()
    }
}

fn lock(state: &Mutex<Collected>) -> MutexGuard<'_, Collected> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
