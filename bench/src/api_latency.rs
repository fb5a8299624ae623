//! Scenario 6, API latency (issue 11): the daemon at its *default* concurrency and byte budget against an emulator
//! that answers every call after 100 ms (`--latency-min-ms 100 --latency-max-ms 100`), so throughput is bound by
//! how many calls the daemon keeps in flight, not by CPU. N one-item jobs are enqueued at once.
//!
//! Only what the emulator cannot honour is changed from the defaults: the admin server is off and the submit rate
//! limits are off ([`crate::procs::daemon_env`]); polls keep their default timing (first poll 1 s after the submit,
//! ±20%). Batches take the emulator's default 200 ms queued + 300 ms running, so a job is done at its first poll.

use std::path::Path;
use std::time::Duration;

use anyhow::bail;

use crate::lifecycle::{entry_ms, read_results, start_stack_with, wait_results};
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
    /// Jobs per second, first XADD to last result entry.
    pub jobs_per_sec: f64,
    /// Jobs per second between the 10th and the 90th percentile result entry (the ramp-up of the first poll
    /// delay and the tail left out).
    pub steady_jobs_per_sec: f64,
    /// XADD → result entry, per job, ms.
    pub latencies_ms: Vec<f64>,
    /// Daemon VmRSS before the burst, MiB.
    pub rss_before_mib: f64,
    /// Daemon VmHWM after the last result, MiB.
    pub hwm_mib: f64,
    /// API calls per job, by kind (`submit`, `poll`, `rejected`).
    pub calls_per_job: [f64; 3],
    /// Jobs that did not end `completed`.
    pub not_completed: usize,
    /// CPU time per job of the daemon, the emulator and redis-server, µs.
    pub cpu_us_per_job: [f64; 3],
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
    let first_xadd = ids.iter().map(|id| entry_ms(id)).min().unwrap_or(0);
    let mut result_ms: Vec<u64> = results.values().map(|(ms, _)| *ms).collect();
    result_ms.sort_unstable();
    let latencies_ms: Vec<f64> = ids
        .iter()
        .enumerate()
        .filter_map(|(i, id)| results.get(&format!("A{i}")).map(|(ms, _)| ms.saturating_sub(entry_ms(id)) as f64))
        .collect();
    if latencies_ms.len() != n {
        bail!("{} of {n} jobs have a result", latencies_ms.len());
    }
    let last_result = result_ms.last().copied().unwrap_or(0);
    let (p10, p90) = (result_ms[n / 10], result_ms[n * 9 / 10]);
    Ok(LatencyRun {
        jobs_per_sec: n as f64 / (last_result.saturating_sub(first_xadd).max(1) as f64 / 1000.0),
        steady_jobs_per_sec: (n * 8 / 10) as f64 / (p90.saturating_sub(p10).max(1) as f64 / 1000.0),
        latencies_ms,
        rss_before_mib,
        hwm_mib,
        calls_per_job,
        not_completed: results.values().filter(|(_, status)| status != "completed").count(),
        cpu_us_per_job: [0, 1, 2].map(|i| (cpu1[i] - cpu0[i]) * 1e6 / n as f64),
        cores: [0, 1, 2].map(|i| (cpu1[i] - cpu0[i]) / wall),
    })
}
