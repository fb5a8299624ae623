//! Scenario 2, the full lifecycle: jobs go submit → poll → publish through one `batchd run` process (release)
//! against `batchd-emulator` (release, its own process) at zero delay (`--queued-ms 0 --running-ms 0`, first
//! poll 1 ms after the submit, no jitter).
//!
//! - burst: N jobs enqueued at once; jobs/s from the first XADD to the last result entry, the time from each job's
//!   XADD to its result entry (both from entry ids, which carry Redis's ms clock), and Redis commands per job
//!   (`INFO commandstats`, commands inside scripts included);
//! - paced: jobs enqueued at a steady rate well below capacity, for the time a job takes when it does not queue;
//! - round trips: a smaller run under `MONITOR`, which tells the commands clients sent from those scripts ran.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use batchd_core::Keys;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamRangeReply;

use crate::procs::{Emulator, Proc, cpu_secs, daemon_env, start_daemon, start_emulator, wait_daemon_ready};
use crate::queue_layer::enqueue;
use crate::redis_server::{RedisServer, commandstats, delta};

/// Settings of the lifecycle daemon: first poll 1 ms after the submit, every later one 1 ms too, no jitter;
/// then `extra` (later entries win).
pub fn zero_delay_env<'a>(extra: &[(&'a str, String)]) -> Vec<(&'a str, String)> {
    let mut env = vec![
        ("BATCHD__POLL__INITIAL_INTERVAL_MS", "1".to_owned()),
        ("BATCHD__POLL__MAX_INTERVAL_MS", "1".to_owned()),
        ("BATCHD__POLL__MULTIPLIER", "1.0".to_owned()),
        ("BATCHD__POLL__JITTER", "0.0".to_owned()),
    ];
    env.extend(extra.iter().cloned());
    env
}

/// A daemon and an emulator started for one run.
pub struct Stack {
    /// The emulator.
    pub emulator: Emulator,
    /// The daemon.
    pub daemon: Proc,
    /// The daemon's namespace keys.
    pub keys: Keys,
}

/// Starts an emulator (`queued_ms`, `running_ms`) and a daemon with `env` on `redis`, and waits until it reads.
pub async fn start_stack(
    redis: &RedisServer,
    queued_ms: u64,
    running_ms: u64,
    env: &[(&str, String)],
    logs: &Path,
    tag: &str,
) -> anyhow::Result<Stack> {
    start_stack_with(redis, queued_ms, running_ms, &[], env, logs, tag).await
}

/// [`start_stack`] with `emulator_args` given to the emulator on top of its batch timing.
pub async fn start_stack_with(
    redis: &RedisServer,
    queued_ms: u64,
    running_ms: u64,
    emulator_args: &[String],
    env: &[(&str, String)],
    logs: &Path,
    tag: &str,
) -> anyhow::Result<Stack> {
    let emulator = start_emulator(queued_ms, running_ms, emulator_args, &logs.join(format!("emulator-{tag}.log")))?;
    let env = daemon_env(&redis.url(), &emulator, env);
    let mut daemon = start_daemon(&env, &logs.join(format!("batchd-{tag}.log")))?;
    let keys = Keys::new("batchd")?;
    let mut conn = redis.connect().await?;
    wait_daemon_ready(&mut conn, &keys, &mut daemon).await?;
    Ok(Stack { emulator, daemon, keys })
}

/// What a burst of jobs enqueued at once measured: throughput overall and in its steady middle, each job's
/// latency, and CPU per job of the daemon, the emulator and redis-server.
#[derive(Debug, Clone)]
pub struct BurstFigures {
    /// Jobs per second, first XADD to last result entry.
    pub jobs_per_sec: f64,
    /// Jobs per second between the 10th and the 90th percentile result entry (the ramp-up of the first poll
    /// delay and the tail left out).
    pub steady_jobs_per_sec: f64,
    /// XADD → result entry, per job, ms.
    pub latencies_ms: Vec<f64>,
    /// CPU time per job of the daemon, the emulator and redis-server, µs.
    pub cpu_us_per_job: [f64; 3],
}

impl BurstFigures {
    /// From the entry ids of jobs `<prefix>0`, `<prefix>1`, ..., their results ([`read_results`]), and the CPU
    /// seconds of the three processes before and after. Fails unless every job has its result.
    pub fn measure(
        prefix: &str,
        entry_ids: &[String],
        results: &HashMap<String, (u64, String)>,
        (cpu0, cpu1): ([f64; 3], [f64; 3]),
    ) -> anyhow::Result<Self> {
        let n = entry_ids.len();
        let latencies_ms: Vec<f64> = entry_ids
            .iter()
            .enumerate()
            .filter_map(|(i, id)| {
                results.get(&format!("{prefix}{i}")).map(|(ms, _)| ms.saturating_sub(entry_ms(id)) as f64)
            })
            .collect();
        if latencies_ms.len() != n || n == 0 {
            anyhow::bail!("{} of {n} jobs have a result", latencies_ms.len());
        }
        let first_xadd = entry_ids.iter().map(|id| entry_ms(id)).min().unwrap_or(0);
        let mut result_ms: Vec<u64> = results.values().map(|(ms, _)| *ms).collect();
        result_ms.sort_unstable();
        let last_result = result_ms.last().copied().unwrap_or(0);
        let (p10, p90) = (result_ms[n / 10], result_ms[n * 9 / 10]);
        Ok(Self {
            jobs_per_sec: n as f64 / (last_result.saturating_sub(first_xadd).max(1) as f64 / 1000.0),
            steady_jobs_per_sec: (n * 8 / 10) as f64 / (p90.saturating_sub(p10).max(1) as f64 / 1000.0),
            latencies_ms,
            cpu_us_per_job: [0, 1, 2].map(|i| (cpu1[i] - cpu0[i]) * 1e6 / n as f64),
        })
    }
}

/// Milliseconds of a stream entry id.
pub fn entry_ms(id: &str) -> u64 {
    id.split('-').next().and_then(|ms| ms.parse().ok()).unwrap_or(0)
}

/// Waits until the results stream holds `n` entries (or `timeout`).
pub async fn wait_results(
    conn: &mut MultiplexedConnection,
    keys: &Keys,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let len: usize = redis::cmd("XLEN").arg(keys.results()).query_async(conn).await?;
        if len >= n {
            return Ok(());
        }
        if started.elapsed() > timeout {
            bail!("only {len} of {n} results after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every result entry: job id → (entry ms, status).
pub async fn read_results(
    conn: &mut MultiplexedConnection,
    keys: &Keys,
) -> anyhow::Result<HashMap<String, (u64, String)>> {
    let mut out = HashMap::new();
    let mut start = "-".to_owned();
    loop {
        let reply: StreamRangeReply = redis::cmd("XRANGE")
            .arg(keys.results())
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(5_000)
            .query_async(conn)
            .await?;
        let n = reply.ids.len();
        for entry in &reply.ids {
            let job_id: String = entry.get("job_id").unwrap_or_default();
            let status: String = entry.get("status").unwrap_or_default();
            out.insert(job_id, (entry_ms(&entry.id), status));
        }
        match reply.ids.last() {
            Some(last) if n == 5_000 => start = format!("({}", last.id),
            _ => return Ok(out),
        }
    }
}

/// What a burst run measured.
#[derive(Debug, Clone)]
pub struct Burst {
    /// Jobs per second, first XADD to last result.
    pub jobs_per_sec: f64,
    /// XADD → result entry, per job, ms.
    pub latencies_ms: Vec<f64>,
    /// Redis commands of the run, per command (the harness's own XADDs, XLEN and INFO left out).
    pub commands: BTreeMap<String, u64>,
    /// Jobs that did not end `completed`.
    pub not_completed: usize,
    /// CPU time per job of the daemon, the emulator and redis-server, µs (robust against other load on the
    /// machine, unlike jobs/s).
    pub cpu_us_per_job: [f64; 3],
}

/// Settings of the *tuned* lifecycle daemon, for a machine whose two cores it shares with Redis and the emulator:
/// one runtime thread (no cross-thread wake-ups), and enough jobs in flight to keep it busy.
pub fn tuned_env() -> Vec<(&'static str, String)> {
    vec![
        ("BATCHD__WORKERS__RUNTIME_THREADS", "1".to_owned()),
        ("BATCHD__WORKERS__SUBMIT_CONCURRENCY", "64".to_owned()),
        ("BATCHD__WORKERS__POLL_CONCURRENCY", "128".to_owned()),
    ]
}

/// N jobs at once through a fresh daemon, with `extra_env` on top of the zero-delay settings.
pub async fn burst(
    redis: &RedisServer,
    n: usize,
    extra_env: &[(&str, String)],
    logs: &Path,
    tag: &str,
) -> anyhow::Result<Burst> {
    let stack = start_stack(redis, 0, 0, &zero_delay_env(extra_env), logs, tag).await?;
    let mut conn = redis.connect().await?;
    let pids = [stack.daemon.pid(), stack.emulator.pid(), redis.pid()];
    let cpu0 = pids.map(cpu_secs);
    let s0 = commandstats(&mut conn).await?;
    let ids = enqueue(&mut conn, &stack.keys, "L", n).await?;
    wait_results(&mut conn, &stack.keys, n, Duration::from_secs(600)).await?;
    let s1 = commandstats(&mut conn).await?;
    let cpu1 = pids.map(cpu_secs);
    let cpu_us_per_job = [0, 1, 2].map(|i| (cpu1[i] - cpu0[i]) * 1e6 / n as f64);
    let results = read_results(&mut conn, &stack.keys).await?;
    drop(stack);
    let mut commands = delta(&s0, &s1, &["info", "xlen"]);
    if let Some(xadd) = commands.get_mut("xadd") {
        *xadd -= n as u64; // the harness's own enqueue; the daemon's result XADDs stay
    }
    let first_xadd = ids.iter().map(|id| entry_ms(id)).min().unwrap_or(0);
    let last_result = results.values().map(|(ms, _)| *ms).max().unwrap_or(0);
    let latencies_ms: Vec<f64> = ids
        .iter()
        .enumerate()
        .filter_map(|(i, id)| results.get(&format!("L{i}")).map(|(ms, _)| ms.saturating_sub(entry_ms(id)) as f64))
        .collect();
    if latencies_ms.len() != n {
        bail!("{} of {n} jobs have a result", latencies_ms.len());
    }
    Ok(Burst {
        jobs_per_sec: n as f64 / ((last_result.saturating_sub(first_xadd)).max(1) as f64 / 1000.0),
        latencies_ms,
        commands,
        not_completed: results.values().filter(|(_, status)| status != "completed").count(),
        cpu_us_per_job,
    })
}

/// `n` jobs at `rate` jobs/s (in ticks of 10 ms) through a fresh daemon: XADD → result entry per job, ms.
pub async fn paced(redis: &RedisServer, n: usize, rate: usize, logs: &Path, tag: &str) -> anyhow::Result<Vec<f64>> {
    let stack = start_stack(redis, 0, 0, &zero_delay_env(&[]), logs, tag).await?;
    let mut conn = redis.connect().await?;
    let per_tick = (rate / 100).max(1);
    let mut ticker = tokio::time::interval(Duration::from_millis(10));
    let mut ids = Vec::with_capacity(n);
    let submit = stack.keys.submit();
    let payload: serde_json::Map<String, serde_json::Value> = serde_json::from_str(crate::queue_layer::PAYLOAD)?;
    while ids.len() < n {
        ticker.tick().await;
        let mut pipe = redis::pipe();
        for i in ids.len()..(ids.len() + per_tick).min(n) {
            let mut job = payload.clone();
            job.insert("id".into(), format!("P{i}").into());
            pipe.xadd(&submit, "*", &[("job", serde_json::Value::Object(job).to_string())]);
        }
        let chunk: Vec<String> = pipe.query_async(&mut conn).await?;
        ids.extend(chunk);
    }
    wait_results(&mut conn, &stack.keys, n, Duration::from_secs(120)).await?;
    let results = read_results(&mut conn, &stack.keys).await?;
    drop(stack);
    Ok(ids
        .iter()
        .enumerate()
        .filter_map(|(i, id)| results.get(&format!("P{i}")).map(|(ms, _)| ms.saturating_sub(entry_ms(id)) as f64))
        .collect())
}

/// Commands seen under MONITOR, split by who sent them.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Monitored {
    /// Commands sent by the daemon's connections, per command.
    pub client: BTreeMap<String, u64>,
    /// Commands run inside scripts, per command.
    pub lua: BTreeMap<String, u64>,
    /// Commands per step: a script's call and the commands it ran, under the script's name (`accept`, `claim`,
    /// ...), and the daemon's commands outside scripts under `outside scripts`.
    pub steps: BTreeMap<String, u64>,
}

/// The step a script call belongs to: the name of the script whose SHA it calls (`batchd_queue`'s scripts).
fn script_names() -> HashMap<String, String> {
    batchd_queue::store::SCRIPT_NAMES
        .iter()
        .filter_map(|name| {
            let source = batchd_queue::store::script_source(name)?;
            Some((redis::Script::new(&source).get_hash().to_owned(), (*name).to_owned()))
        })
        .collect()
}

/// `n` jobs through a fresh daemon while a `MONITOR` connection records every command; the harness's own
/// connections are left out by address.
pub async fn monitored(redis: &RedisServer, n: usize, logs: &Path, tag: &str) -> anyhow::Result<Monitored> {
    let stack = start_stack(redis, 0, 0, &zero_delay_env(&[]), logs, tag).await?;
    let mut conn = redis.connect().await?;
    let own: String = redis::cmd("CLIENT").arg("INFO").query_async(&mut conn).await?;
    let own_addr =
        own.split_whitespace().find_map(|kv| kv.strip_prefix("addr=")).context("CLIENT INFO addr")?.to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let port = redis.port;
    let thread_stop = Arc::clone(&stop);
    let scripts = script_names();
    let monitor = std::thread::spawn(move || -> anyhow::Result<Monitored> {
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_millis(200)))?;
        stream.write_all(b"MONITOR\r\n")?;
        let mut reader = BufReader::new(stream);
        let mut seen = Monitored::default();
        let mut line = Vec::new();
        // The script whose commands follow: Redis shows a script's call, then every command it ran.
        let mut step: Option<String> = None;
        while !thread_stop.load(Ordering::Acquire) {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line);
                    let Some(open) = text.find('[') else { continue };
                    let Some(close) = text[open..].find(']') else { continue };
                    let source = &text[open + 1..open + close];
                    let command = text[open + close + 1..]
                        .trim_start()
                        .trim_start_matches('"')
                        .split('"')
                        .next()
                        .unwrap_or("")
                        .to_lowercase();
                    if source.ends_with(" lua") {
                        let in_step = step.clone().unwrap_or_else(|| "script (unknown call)".to_owned());
                        *seen.steps.entry(in_step).or_default() += 1;
                        *seen.lua.entry(command).or_default() += 1;
                    } else if source.ends_with(&own_addr) {
                        step = None;
                    } else {
                        step = (command == "evalsha").then(|| {
                            let sha = text[open + close + 1..].split('"').nth(3).unwrap_or_default();
                            scripts.get(sha).cloned().unwrap_or_else(|| "script (unknown SHA)".to_owned())
                        });
                        let in_step = step.clone().unwrap_or_else(|| "outside scripts".to_owned());
                        *seen.steps.entry(in_step).or_default() += 1;
                        *seen.client.entry(command).or_default() += 1;
                    }
                }
                // Timed out: the loop condition looks at the stop flag.
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(seen)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    enqueue(&mut conn, &stack.keys, "M", n).await?;
    wait_results(&mut conn, &stack.keys, n, Duration::from_secs(300)).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Release);
    let seen = monitor.join().map_err(|_| anyhow::anyhow!("monitor thread panicked"))??;
    drop(stack);
    Ok(seen)
}
