//! Scenario 6, API latency (issue 11): the daemon at its *default* concurrency and byte budget against an emulator
//! that answers every call after 100 ms (`--latency-min-ms 100 --latency-max-ms 100`), so throughput is bound by
//! how many calls the daemon keeps in flight, not by CPU. N one-item jobs are enqueued at once.
//!
//! Only what the emulator cannot honour is changed from the defaults: the admin server is off and the submit rate
//! limits are off ([`crate::procs::daemon_env`]); polls keep their default timing (first poll 1 s after the submit,
//! ±20%). Batches take the emulator's default 200 ms queued + 300 ms running, so a job is done at its first poll.

use std::path::Path;
use std::time::Duration;

use crate::lifecycle::{BurstFigures, read_results, start_stack_with, wait_results};
use crate::procs::{cpu_secs, status_mib};
use crate::queue_layer::enqueue;
use crate::redis_server::RedisServer;

/// Delay of every emulator reply, ms.
pub const LATENCY_MS: u64 = 100;
/// The byte budget at the defaults (`workers.inflight_bytes`), MiB.
pub const BUDGET_MIB: f64 = 256.0;

/// What one run measured.
#[derive(Debug, Clone)]
pub struct LatencyRun {
    /// Throughput, latency and CPU per job.
    pub burst: BurstFigures,
    /// Daemon VmRSS before the burst, MiB.
    pub rss_before_mib: f64,
    /// Daemon VmHWM after the last result, MiB.
    pub hwm_mib: f64,
    /// API calls per job, by kind (`submit`, `poll`, `rejected`).
    pub calls_per_job: [f64; 3],
    /// Jobs that did not end `completed`.
    pub not_completed: usize,
    /// CPU use of the daemon, the emulator and redis-server over the run, in cores (1.0 = one core busy).
    pub cores: [f64; 3],
}

/// Runs `n` jobs at once through a default daemon against the 100 ms emulator.
pub async fn run(redis: &RedisServer, n: usize, logs: &Path, tag: &str) -> anyhow::Result<LatencyRun> {
    let latency = LATENCY_MS.to_string();
    let emulator_args = ["--latency-min-ms".to_owned(), latency.clone(), "--latency-max-ms".to_owned(), latency];
    let stack = start_stack_with(redis, 200, 300, &emulator_args, &[], logs, tag).await?;
    let mut conn = redis.connect().await?;
    let pids = [stack.daemon.pid(), stack.emulator.pid(), redis.pid()];
    let rss_before_mib = status_mib(pids[0], "VmRSS");
    let cpu0 = pids.map(cpu_secs);
    let started = std::time::Instant::now();
    let ids = enqueue(&mut conn, &stack.keys, "A", n).await?;
    wait_results(&mut conn, &stack.keys, n, Duration::from_secs(600)).await?;
    let wall = started.elapsed().as_secs_f64();
    let cpu1 = pids.map(cpu_secs);
    let hwm_mib = status_mib(pids[0], "VmHWM");
    let calls: Vec<serde_json::Value> =
        reqwest::get(format!("{}/_emulator/calls", stack.emulator.origin())).await?.error_for_status()?.json().await?;
    let results = read_results(&mut conn, &stack.keys).await?;
    drop(stack);

    let calls_per_job = ["submit", "poll", "rejected"]
        .map(|kind| calls.iter().filter(|call| call["kind"] == kind).count() as f64 / n as f64);
    let burst = BurstFigures::measure("A", &ids, &results, (cpu0, cpu1))?;
    Ok(LatencyRun {
        burst,
        rss_before_mib,
        hwm_mib,
        calls_per_job,
        not_completed: results.values().filter(|(_, status)| status != "completed").count(),
        cores: [0, 1, 2].map(|i| (cpu1[i] - cpu0[i]) / wall),
    })
}
