//! Scenario 1, the queue layer like for like: N no-op jobs enqueued, then drained by one worker process with
//! concurrency 50, for batchd's storage, BullMQ and apalis-redis on the same Redis; `redis-benchmark` gives the
//! physical limit of one command per job. Besides jobs/s (which moves with other load on the machine), every system
//! reports the CPU time its worker process and redis-server spent per drained job.
//!
//! batchd's side runs in this process, on `batchd_queue` directly: the daemon's ingress fetcher
//! (`batchd_engine::runtime::ingress::backend`, the apalis `FetchBackend` over `XREADGROUP`) feeds an apalis worker with
//! `concurrency(50)`, as in `batchd run`. Two handlers:
//! - **ack**: `XACK` + `XDEL` of the entry in one pipeline: the queue round trip alone, like BullMQ's and
//!   apalis-redis's completion of a no-op job;
//! - **accept**: the daemon's real take-in step: `Job::decode`, then `Store::accept` (ledger created, chunk
//!   scheduled, entry acknowledged and deleted, one script), i.e. more work per job than the peers do.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use apalis::layers::WorkerBuilderExt;
use apalis_core::error::BoxDynError;
use apalis_core::task::data::Data;
use apalis_core::worker::builder::WorkerBuilder;
use batchd_core::keys::CONSUMER_GROUP;
use batchd_core::{Job, JobLimits, Keys};
use batchd_engine::runtime::IngressEntry;
use batchd_engine::runtime::IngressSettings;
use batchd_queue::store::Intake;
use batchd_queue::{Store, StoreSettings};
use redis::aio::MultiplexedConnection;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::procs::workspace_root;
use crate::redis_server::{RedisServer, commandstats, delta};

/// The job every system enqueues (an `id` is added per job): a valid batchd job, used as opaque data by the peers.
/// Its one item is a bge-m3 query with one context, whose answer is one short score (not an embedding), so the
/// lifecycle scenario measures batchd rather than the size of model outputs. It opts out of packing (`"pack":false`):
/// scenarios 2, 3 and 6 measure the path of a job with a remote batch of its own, as their published figures did
/// before packs existed; scenario 9 measures packing.
pub const PAYLOAD: &str = r#"{"model":"@cf/baai/bge-m3","pack":false,"requests":[{"query":"What is batchd?","contexts":[{"text":"A batch daemon."}]}]}"#;

/// Handler futures run at once, for every system.
pub const CONCURRENCY: usize = 50;

/// Jobs per enqueue call (a pipeline of XADDs, one `addBulk`, one `push_bulk`), one call at a time.
pub const ENQUEUE_CHUNK: usize = 1_000;

/// What one system's run measured.
#[derive(Debug, Clone)]
pub struct QueueRun {
    /// Enqueue phase, seconds.
    pub enqueue_secs: f64,
    /// Drain phase, seconds.
    pub drain_secs: f64,
    /// Redis commands of the enqueue phase, per command.
    pub enqueue_commands: BTreeMap<String, u64>,
    /// Redis commands of the drain phase, per command.
    pub drain_commands: BTreeMap<String, u64>,
    /// CPU time of the worker process while draining, seconds.
    pub drain_worker_cpu_secs: f64,
    /// CPU time of redis-server while draining, seconds.
    pub drain_redis_cpu_secs: f64,
}

/// batchd's drain handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// `XACK` + `XDEL` in one pipeline.
    Ack,
    /// `Job::decode` + `Store::accept`.
    Accept,
}

/// Shared by the handler futures.
struct DrainContext {
    /// Connection for the acks.
    conn: MultiplexedConnection,
    /// The store (accept handler).
    store: Store,
    /// Keys of the namespace.
    keys: Keys,
    /// Which handler.
    handler: Handler,
    /// Jobs finished.
    done: AtomicUsize,
    /// Jobs to finish.
    target: usize,
    /// Woken when `done` reaches `target`.
    finished: Notify,
}

impl std::fmt::Debug for DrainContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrainContext").field("handler", &self.handler).finish()
    }
}

async fn handle(entry: IngressEntry, ctx: Data<Arc<DrainContext>>) -> Result<(), BoxDynError> {
    let submit = ctx.keys.submit();
    match ctx.handler {
        Handler::Ack => {
            let mut conn = ctx.conn.clone();
            let _: () = redis::pipe()
                .xack(&submit, CONSUMER_GROUP, &[&entry.id])
                .ignore()
                .xdel(&submit, &[&entry.id])
                .ignore()
                .query_async(&mut conn)
                .await?;
        }
        Handler::Accept => {
            let job = Job::decode(&entry.fields, &entry.id, &JobLimits::default(), &ctx.keys)?;
            let now = batchd_queue::now_ms();
            let plan = vec![(0, job.requests.len())];
            let intake = Intake {
                entry_id: &entry.id,
                plan: &plan,
                now,
                deadline_at: now + 86_400_000,
                first_due: now + 120_000,
                retry_failed_items: false,
                submit_first: false,
                references: &[],
                pack: None,
            };
            ctx.store.accept(&job, &intake).await?;
        }
    }
    if ctx.done.fetch_add(1, Ordering::AcqRel) + 1 == ctx.target {
        ctx.finished.notify_one();
    }
    Ok(())
}

/// Enqueues `n` jobs into the submit stream: pipelines of [`ENQUEUE_CHUNK`] XADDs, one at a time. Returns each
/// job's entry id.
pub async fn enqueue(
    conn: &mut MultiplexedConnection,
    keys: &Keys,
    prefix: &str,
    n: usize,
) -> anyhow::Result<Vec<String>> {
    let payload: serde_json::Map<String, serde_json::Value> = serde_json::from_str(PAYLOAD)?;
    let mut ids = Vec::with_capacity(n);
    let submit = keys.submit();
    for first in (0..n).step_by(ENQUEUE_CHUNK) {
        let mut pipe = redis::pipe();
        for i in first..(first + ENQUEUE_CHUNK).min(n) {
            let mut job = payload.clone();
            job.insert("id".into(), format!("{prefix}{i}").into());
            pipe.xadd(&submit, "*", &[("job", serde_json::Value::Object(job).to_string())]);
        }
        let chunk: Vec<String> = pipe.query_async(conn).await?;
        ids.extend(chunk);
    }
    Ok(ids)
}

/// batchd: enqueue `n`, then drain with the daemon's ingress fetcher and an apalis worker of concurrency 50.
pub async fn batchd(redis: &RedisServer, n: usize, handler: Handler) -> anyhow::Result<QueueRun> {
    let keys = Keys::new("bench1")?;
    let mut stats = redis.connect().await?;
    let conn = redis.connect().await?;
    let endpoint = redis.endpoint()?;
    let store = Store::new(endpoint.shared()?, keys.clone(), StoreSettings::default());

    let s0 = commandstats(&mut stats).await?;
    let started = Instant::now();
    enqueue(&mut conn.clone(), &keys, "j", n).await?;
    let enqueue_secs = started.elapsed().as_secs_f64();
    let s1 = commandstats(&mut stats).await?;
    let redis_cpu0 = crate::redis_server::cpu_secs(&mut stats).await?;
    let own_cpu0 = crate::procs::cpu_secs(std::process::id());

    let ctx = Arc::new(DrainContext {
        conn,
        store,
        keys: keys.clone(),
        handler,
        done: AtomicUsize::new(0),
        target: n,
        finished: Notify::new(),
    });
    let stop = CancellationToken::new();
    let started = Instant::now();
    let backend = batchd_engine::runtime::ingress::backend(
        endpoint,
        keys.clone(),
        IngressSettings {
            consumer: "bench".to_owned(),
            batch: 64,
            block: Duration::from_millis(2_000),
            reclaim_idle: Duration::from_secs(60),
            reclaim_interval: Duration::from_secs(10),
        },
        stop.child_token(),
    );
    let worker = WorkerBuilder::new("bench-drain")
        .backend(backend)
        .data(Arc::clone(&ctx))
        .concurrency(CONCURRENCY)
        .build(handle);
    let signal = stop.clone();
    let running = tokio::spawn(worker.run_until(async move {
        signal.cancelled().await;
        Ok::<(), std::io::Error>(())
    }));
    let waited = tokio::time::timeout(Duration::from_secs(300), async {
        while ctx.done.load(Ordering::Acquire) < n {
            let _ = tokio::time::timeout(Duration::from_millis(50), ctx.finished.notified()).await;
        }
    })
    .await;
    let drain_secs = started.elapsed().as_secs_f64();
    let drain_worker_cpu_secs = crate::procs::cpu_secs(std::process::id()) - own_cpu0;
    let drain_redis_cpu_secs = crate::redis_server::cpu_secs(&mut stats).await? - redis_cpu0;
    let s2 = commandstats(&mut stats).await?;
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), running).await;
    if waited.is_err() {
        bail!("batchd drain did not finish in 300 s ({} of {n})", ctx.done.load(Ordering::Acquire));
    }
    Ok(QueueRun {
        enqueue_secs,
        drain_secs,
        enqueue_commands: delta(&s0, &s1, &["info"]),
        drain_commands: delta(&s1, &s2, &["info"]),
        drain_worker_cpu_secs,
        drain_redis_cpu_secs,
    })
}

fn parse_peer(output: std::process::Output, what: &str) -> anyhow::Result<QueueRun> {
    if !output.status.success() {
        bail!("{what} failed: {}\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rev().find(|line| line.starts_with('{')).with_context(|| format!("{what}: no JSON"))?;
    let value: serde_json::Value = serde_json::from_str(line)?;
    let commands = |key: &str| -> BTreeMap<String, u64> {
        value[key]
            .as_object()
            .map(|map| {
                map.iter()
                    // SCARD is the harness's own completion probe (apalis-redis side), not the system's.
                    .filter(|(name, _)| name.as_str() != "scard" || what != "apalis-redis")
                    .filter_map(|(name, calls)| Some((name.clone(), calls.as_u64()?)))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(QueueRun {
        enqueue_secs: value["enqueue_secs"].as_f64().context("enqueue_secs")?,
        drain_secs: value["drain_secs"].as_f64().context("drain_secs")?,
        enqueue_commands: commands("enqueue_commands"),
        drain_commands: commands("drain_commands"),
        drain_worker_cpu_secs: value["drain_worker_cpu_secs"].as_f64().unwrap_or(f64::NAN),
        drain_redis_cpu_secs: value["drain_redis_cpu_secs"].as_f64().unwrap_or(f64::NAN),
    })
}

/// BullMQ (pinned in bench/peers/package.json): `node bench/peers/bullmq.mjs`.
pub fn bullmq(redis: &RedisServer, n: usize, run: usize) -> anyhow::Result<QueueRun> {
    let peers = workspace_root().join("bench/peers");
    let output = Command::new("node")
        .current_dir(&peers)
        .args(["bullmq.mjs", "--redis", &redis.url(), "--n", &n.to_string()])
        .args(["--concurrency", &CONCURRENCY.to_string(), "--chunk", &ENQUEUE_CHUNK.to_string()])
        .args(["--queue", &format!("bench-{run}"), "--payload", PAYLOAD])
        .output()
        .context("run node (is bench/peers/node_modules installed? scripts/bench.sh does it)")?;
    parse_peer(output, "bullmq")
}

/// apalis-redis 1.0.0: the release binary of bench/peers/apalis-redis, in waves of 5,000 (see its main.rs).
pub fn apalis_redis(redis: &RedisServer, n: usize, lock_tasks: bool, run: usize) -> anyhow::Result<QueueRun> {
    let binary = workspace_root().join("target/bench-peers/release/apalis-redis-bench");
    let output = Command::new(&binary)
        .args(["--redis", &redis.url(), "--n", &n.to_string(), "--wave", "5000"])
        .args(["--concurrency", &CONCURRENCY.to_string(), "--batch-size", "64", "--chunk", &ENQUEUE_CHUNK.to_string()])
        .args(["--lock-tasks", if lock_tasks { "true" } else { "false" }])
        .args(["--queue", &format!("apalis-bench-{run}"), "--payload", PAYLOAD])
        .output()
        .with_context(|| format!("run {} (scripts/bench.sh builds it)", binary.display()))?;
    parse_peer(output, "apalis-redis")
}

/// `redis-benchmark` against the same server: `(test name, requests/s)`, for XADD and LPUSH of the payload, with
/// 50 clients, unpipelined and with 16 commands per pipeline.
pub fn redis_benchmark(redis: &RedisServer, n: usize) -> anyhow::Result<Vec<(String, f64)>> {
    let mut results = Vec::new();
    for pipeline in [1usize, 16] {
        for (name, command) in [
            ("XADD", vec!["XADD", "bench:stream", "*", "job", PAYLOAD]),
            ("LPUSH", vec!["LPUSH", "bench:list", PAYLOAD]),
        ] {
            let output = Command::new("redis-benchmark")
                .args(["-h", "127.0.0.1", "-p", &redis.port.to_string(), "-n", &n.to_string(), "-c", "50"])
                .args(["-P", &pipeline.to_string(), "--csv"])
                .args(&command)
                .output()
                .context("run redis-benchmark")?;
            let stdout = String::from_utf8_lossy(&output.stdout);
            let rps = stdout
                .lines()
                // The test name (the command) may hold commas: rps is the 7th field from the end.
                .filter(|line| !line.starts_with("\"test\""))
                .find_map(|line| line.split(',').rev().nth(6)?.trim_matches('"').parse::<f64>().ok())
                .with_context(|| format!("redis-benchmark output: {stdout}"))?;
            results.push((format!("{name} -P {pipeline}"), rps));
        }
    }
    Ok(results)
}
