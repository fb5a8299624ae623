//! The load of a chaos run: a producer that enqueues jobs the way services do (pipelined `XADD`, retried while
//! Redis is away), and a result consumer that reads the results stream as it grows.
//!
//! The jobs go to the three batch APIs in turn ([`Mix::ALL`]: Cloudflare Workers AI, `openai/...`,
//! `anthropic/...`), so every fault a scenario applies hits work at every provider; a finding's reproduction may
//! keep to one ([`Mix::CLOUDFLARE`]).
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

/// The batch API a chaos job goes to, by its model name.
pub use batchd_emulator::Provider;

/// The model `provider`'s chaos jobs name.
fn model(provider: Provider) -> &'static str {
    match provider {
        Provider::Cloudflare => MODEL,
        Provider::OpenAi => "openai/gpt-4o-mini",
        Provider::Anthropic => "anthropic/claude-haiku-4-5",
    }
}

/// Which providers a run's jobs go to (job `<prefix>-<i>` goes to the `i % n`-th of them), with how many items
/// each job holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    /// The providers, in turn.
    providers: &'static [Provider],
    /// Items per job.
    items: usize,
    /// Whether one in four jobs opts out of packing (`"pack": false`, a field releases before packs refuse).
    opt_outs: bool,
}

impl Mix {
    /// Every provider in turn (a third of the jobs each), one item per job.
    pub const ALL: Mix = Mix { providers: &Provider::ALL, items: 1, opt_outs: true };
    /// Cloudflare only (the findings' reproductions, written against its emulator), one item per job.
    pub const CLOUDFLARE: Mix = Mix { providers: &[Provider::Cloudflare], items: 1, opt_outs: true };
    /// OpenAI only, one item per job.
    pub const OPENAI: Mix = Mix { providers: &[Provider::OpenAi], items: 1, opt_outs: true };

    /// The same jobs, none opting out of packing: what a producer writes while replicas of a release before packs
    /// still run (they refuse the `pack` field).
    pub const fn without_opt_outs(self) -> Mix {
        Mix { opt_outs: false, ..self }
    }

    /// The same providers with `items` items per job.
    pub const fn with_items(self, items: usize) -> Mix {
        Mix { items, ..self }
    }

    /// The providers of the mix.
    pub fn providers(self) -> &'static [Provider] {
        self.providers
    }

    /// The provider of job `id` (one of [`ids`]); an id without a numeric suffix goes to the first.
    pub fn provider_of(self, id: &str) -> Provider {
        self.providers[number(id) % self.providers.len()]
    }

    /// Whether job `id` opts out of packing (`"pack": false`): one in four of each provider's jobs, so a run drives
    /// both paths, remote batches shared by many jobs (packing is on by default) and a job's batch of its own.
    pub fn opts_out_of_packing(self, id: &str) -> bool {
        self.opt_outs && (number(id) / self.providers.len()) % 4 == 3
    }

    /// The job JSON of `id`: small items that name the job, so the emulator's call logs tell which job each remote
    /// batch is for (Cloudflare: the first item's `external_reference`; OpenAI: the batch's `metadata`; Anthropic:
    /// each request's `metadata.user_id`, a Messages API field batchd passes through; its `custom_id`s carry a
    /// random nonce per chunk, not the job).
    pub fn job(self, id: &str) -> String {
        let provider = self.provider_of(id);
        let items: Vec<serde_json::Value> = (0..self.items.max(1))
            .map(|index| {
                let text = format!("chaos job {id} item {index}");
                match provider {
                    Provider::Cloudflare => serde_json::json!({"text": text, "external_reference": id}),
                    Provider::OpenAi => {
                        serde_json::json!({"messages": [{"role": "user", "content": text}], "max_tokens": 4})
                    }
                    Provider::Anthropic => serde_json::json!({
                        "messages": [{"role": "user", "content": text}], "max_tokens": 4, "metadata": {"user_id": id}
                    }),
                }
            })
            .collect();
        let mut job = serde_json::json!({"id": id, "model": model(provider), "requests": items});
        if self.opts_out_of_packing(id) {
            job["pack"] = serde_json::Value::Bool(false);
        }
        job.to_string()
    }
}

/// The numeric suffix of job id `<prefix>-<n>` (0 without one).
fn number(id: &str) -> usize {
    id.rsplit('-').next().and_then(|n| n.parse::<usize>().ok()).unwrap_or(0)
}

/// Job ids `<prefix>-0`, `<prefix>-1`, ...
pub fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Enqueues `ids` (at the providers `mix` gives them) with one pipeline of `XADD`s; returns the entry ids Redis
/// gave them, in order.
pub async fn enqueue(
    conn: &mut ConnectionManager,
    keys: &Keys,
    ids: &[String],
    mix: Mix,
) -> redis::RedisResult<Vec<String>> {
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.cmd("XADD").arg(keys.submit()).arg("*").arg("job").arg(mix.job(id));
    }
    pipe.query_async(conn).await
}

/// What the producer did.
#[derive(Debug, Clone)]
pub struct Produced {
    /// Which provider each job went to.
    pub mix: Mix,
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

impl Produced {
    /// Nothing produced yet, at the providers of `mix`.
    pub fn new(mix: Mix) -> Self {
        Self {
            mix,
            acked: HashMap::new(),
            entry_ids: HashMap::new(),
            failed_attempts: 0,
            finished_ms: 0,
            hostile: HashSet::new(),
        }
    }

    /// The provider of an acknowledged job.
    pub fn provider_of(&self, id: &str) -> Provider {
        self.mix.provider_of(id)
    }
}

/// Enqueues `ids` (at the providers of `mix`) in pipelines of `batch`, one every `every`, retrying a failed
/// pipeline (a resent job id is the same job to batchd) until it is acknowledged.
pub async fn produce(
    mut conn: ConnectionManager,
    keys: Keys,
    ids: Vec<String>,
    mix: Mix,
    batch: usize,
    every: Duration,
) -> Produced {
    let mut produced = Produced::new(mix);
    for chunk in ids.chunks(batch.max(1)) {
        let started = tokio::time::Instant::now();
        let entry_ids = loop {
            match enqueue(&mut conn, &keys, chunk, mix).await {
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
    mix: Mix,
    batch: usize,
    every: Duration,
) -> JoinHandle<Produced> {
    tokio::spawn(produce(conn, keys, ids, mix, batch, every))
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
