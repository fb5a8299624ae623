//! apalis-redis 1.0 side of the batchd queue-layer benchmark (scenario 1 of docs/benchmarks.md).
//!
//! Enqueues N no-op jobs and drains them with one worker of the given concurrency, then prints one JSON line with
//! the time of each phase, the Redis commands each phase cost (`INFO commandstats` deltas, INFO itself left out),
//! redis-server's CPU time per phase (`INFO cpu`) and this process's CPU time while draining.
//!
//! apalis-redis puts every push, even an immediate one, into its `scheduled` ZSET, and its fetch script promotes
//! all due members with one unbounded Lua `unpack`: with 8,000 or more due at once every fetch fails and the worker
//! dies. So the N jobs go in waves of `--wave` (5,000 by default): push a wave with no worker running, start a
//! worker (a fresh name each wave: a name is refused while its previous registration is alive), wait until the
//! wave's jobs are all in the `done` set, stop the worker. Enqueue time is the sum of the push phases, drain time
//! the sum of the drain phases (worker start to last acknowledgement; the worker's shutdown is not counted).
//!
//! usage: apalis-redis-bench --redis URL --n 20000 --wave 5000 --concurrency 50 --batch-size 64
//!        --lock-tasks true --queue NAME --payload JSON

use std::collections::HashMap;
use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_redis::{Config, RedisStorage};
use redis::AsyncCommands;

/// Command-line options.
struct Options {
    /// Redis URL.
    redis: String,
    /// Jobs in total.
    n: usize,
    /// Jobs per wave (kept below apalis-redis's 8,000-due limit).
    wave: usize,
    /// Handler futures run at once.
    concurrency: usize,
    /// Jobs fetched per fetch call.
    batch_size: usize,
    /// apalis-redis's `lock_tasks` (its default is true).
    lock_tasks: bool,
    /// Queue name.
    queue: String,
    /// Job payload (JSON object; `id` is added per job).
    payload: String,
    /// Jobs per `push_bulk` call.
    chunk: usize,
}

fn options() -> Options {
    let mut options = Options {
        redis: "redis://127.0.0.1:6379".into(),
        n: 20_000,
        wave: 5_000,
        concurrency: 50,
        batch_size: 64,
        lock_tasks: true,
        queue: "apalis-bench".into(),
        payload: "{}".into(),
        chunk: 1_000,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        match pair[0].trim_start_matches("--") {
            "redis" => options.redis = value,
            "n" => options.n = value.parse().expect("--n"),
            "wave" => options.wave = value.parse().expect("--wave"),
            "concurrency" => options.concurrency = value.parse().expect("--concurrency"),
            "batch-size" => options.batch_size = value.parse().expect("--batch-size"),
            "lock-tasks" => options.lock_tasks = value == "true",
            "queue" => options.queue = value,
            "payload" => options.payload = value,
            "chunk" => options.chunk = value.parse().expect("--chunk"),
            other => panic!("unknown option --{other}"),
        }
    }
    options
}

async fn commandstats(conn: &mut redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    let text: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.expect("INFO");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// redis-server's CPU time so far (`INFO cpu`: user + sys), seconds.
async fn redis_cpu(conn: &mut redis::aio::MultiplexedConnection) -> f64 {
    let text: String = redis::cmd("INFO").arg("cpu").query_async(conn).await.expect("INFO cpu");
    let field = |name: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
            .unwrap_or(f64::NAN)
    };
    field("used_cpu_user") + field("used_cpu_sys")
}

/// This process's CPU time so far (user + system, `/proc/self/stat`), seconds.
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    (ticks(11) + ticks(12)) / 100.0
}

fn add_delta(total: &mut HashMap<String, u64>, before: &HashMap<String, u64>, after: &HashMap<String, u64>) {
    for (name, calls) in after {
        let d = calls - before.get(name).copied().unwrap_or(0);
        if d > 0 && name != "info" {
            *total.entry(name.clone()).or_default() += d;
        }
    }
}

async fn noop(_job: serde_json::Value) -> Result<(), BoxDynError> {
    Ok(())
}

#[tokio::main]
async fn main() {
    let options = options();
    let client = redis::Client::open(options.redis.as_str()).expect("redis url");
    let mut stats = client.get_multiplexed_async_connection().await.expect("connect");
    let conn = apalis_redis::connect(options.redis.as_str()).await.expect("connect");
    let config = Config::default()
        .queue(&options.queue)
        .batch_size(options.batch_size)
        .lock_tasks(options.lock_tasks);
    let done_set = format!("{}:done", options.queue);
    let payload: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&options.payload).expect("--payload is a JSON object");

    let mut enqueue = Duration::ZERO;
    let mut drain = Duration::ZERO;
    let mut enqueue_commands = HashMap::new();
    let mut drain_commands = HashMap::new();
    let (mut enqueue_redis_cpu, mut drain_redis_cpu, mut drain_worker_cpu) = (0.0, 0.0, 0.0);
    let mut pushed = 0;
    let mut wave_index = 0;
    while pushed < options.n {
        let wave_end = (pushed + options.wave).min(options.n);
        let mut storage = RedisStorage::<serde_json::Value>::new(conn.clone()).with_config(config.clone());
        let s0 = commandstats(&mut stats).await;
        let r0 = redis_cpu(&mut stats).await;
        let started = Instant::now();
        let mut first = pushed;
        while first < wave_end {
            let last = (first + options.chunk).min(wave_end);
            let jobs: Vec<serde_json::Value> = (first..last)
                .map(|i| {
                    let mut job = payload.clone();
                    job.insert("id".into(), format!("j{i}").into());
                    serde_json::Value::Object(job)
                })
                .collect();
            storage.push_bulk(jobs).await.expect("push_bulk");
            first = last;
        }
        enqueue += started.elapsed();
        let s1 = commandstats(&mut stats).await;
        let r1 = redis_cpu(&mut stats).await;
        enqueue_redis_cpu += r1 - r0;
        add_delta(&mut enqueue_commands, &s0, &s1);

        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let worker = WorkerBuilder::new(format!("bench-{}-{wave_index}", std::process::id()))
            .backend(storage)
            .concurrency(options.concurrency)
            .build(noop);
        let started = Instant::now();
        let own0 = own_cpu();
        let running = tokio::spawn(worker.run_until(async move {
            let _ = stop_rx.await;
            Ok::<(), std::io::Error>(())
        }));
        loop {
            let n_done: usize = stats.scard(&done_set).await.expect("SCARD");
            if n_done >= wave_end {
                break;
            }
            if running.is_finished() {
                panic!("apalis-redis worker stopped early: {:?}", running.await);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        drain += started.elapsed();
        drain_worker_cpu += own_cpu() - own0;
        let s2 = commandstats(&mut stats).await;
        drain_redis_cpu += redis_cpu(&mut stats).await - r1;
        add_delta(&mut drain_commands, &s1, &s2);
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(30), running).await;
        pushed = wave_end;
        wave_index += 1;
    }
    // Leave nothing behind in the shared Redis.
    let keys: Vec<String> = stats.keys(format!("{}*", options.queue)).await.expect("KEYS");
    for chunk in keys.chunks(500) {
        let _: () = stats.del(chunk).await.expect("DEL");
    }
    let report = serde_json::json!({
        "system": if options.lock_tasks { "apalis-redis" } else { "apalis-redis (lock_tasks=false)" },
        "n": options.n,
        "wave": options.wave,
        "enqueue_secs": enqueue.as_secs_f64(),
        "drain_secs": drain.as_secs_f64(),
        "enqueue_commands": enqueue_commands,
        "drain_commands": drain_commands,
        "enqueue_redis_cpu_secs": enqueue_redis_cpu,
        "drain_redis_cpu_secs": drain_redis_cpu,
        "drain_worker_cpu_secs": drain_worker_cpu,
    });
    println!("{report}");
}
