//! `batchd-bench` (`make bench`): batchd's benchmarks side by side with BullMQ and apalis-redis, on private
//! `redis-server`s with persistence off and with AOF everysec. Every figure is the median of `--runs` runs (3 by
//! default) with min and max. Prints a Markdown table and writes `target/bench/report.json` (+ `report.md`).
//!
//! Scenarios (docs/benchmarks.md says what each measures and how):
//! 1. queue layer like for like ([`queue_layer`]); 2. full lifecycle ([`lifecycle`]); 3. backlog ([`backlog`]);
//! 4. poll timing ([`poll_timing`]); 5. big payloads ([`big`]);
//! 6. default settings against an API answering in 100 ms ([`api_latency`]);
//! 7. batch events against polling, time-compressed ([`batch_events`]);
//! 8. scenario 6's burst at each provider: Workers AI, OpenAI Batch, Anthropic Message Batches ([`providers`]);
//! 9. packing under the providers' documented creation limits: 50,000 one-item jobs per provider ([`providers`]).
//!
//! Needs the release binaries `batchd` and `batchd-emulator` next to this one, `node` with bench/peers/node_modules,
//! and target/bench-peers/release/apalis-redis-bench: scripts/bench.sh builds and installs all of them.
//!
//! Over 500 lines because it runs every scenario and is the one place where their measurements become rows of the
//! report table; the scenario modules only measure and know nothing of the report.

mod api_latency;
mod backlog;
mod batch_events;
mod big;
mod lifecycle;
mod poll_timing;
mod procs;
mod providers;
mod queue_layer;
mod redis_server;
mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;

use crate::redis_server::{Persistence, RedisServer, total};
use crate::report::{Report, fmt, percentile};

/// Command-line options.
#[derive(Debug, Clone)]
struct Options {
    /// Runs per figure.
    runs: usize,
    /// Persistence modes to run.
    modes: Vec<Persistence>,
    /// Scenarios to run (1..=8).
    scenarios: Vec<u8>,
    /// Jobs of scenarios 1 and 2.
    n: usize,
    /// Jobs of scenario 3.
    backlog: usize,
    /// Measuring window of scenario 4.
    poll_window: Duration,
    /// Jobs of scenario 6.
    latency_n: usize,
    /// Jobs of scenario 7 (per run of each of its three systems).
    events_n: usize,
    /// Jobs of scenario 8 (per run of each provider).
    providers_n: usize,
    /// Jobs of scenario 9 (per run of each provider).
    packing_n: usize,
    /// Where the JSON report goes.
    out: PathBuf,
}

fn options() -> anyhow::Result<Options> {
    let root = procs::workspace_root();
    let mut options = Options {
        runs: 3,
        modes: vec![Persistence::Off, Persistence::AofEverysec],
        scenarios: vec![1, 2, 3, 4, 5, 6, 7, 8, 9],
        n: 20_000,
        backlog: 100_000,
        poll_window: Duration::from_secs(10),
        latency_n: 20_000,
        events_n: 300,
        providers_n: 20_000,
        packing_n: 50_000,
        out: root.join("target/bench/report.json"),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = || args.get(i + 1).cloned().with_context(|| format!("{} needs a value", args[i]));
        match args[i].as_str() {
            "--quick" => {
                options.runs = 1;
                options.n = 2_000;
                options.backlog = 5_000;
                options.poll_window = Duration::from_secs(3);
                options.latency_n = 5_000;
                options.events_n = 100;
                options.providers_n = 1_000;
                options.packing_n = 2_000;
                i += 1;
                continue;
            }
            "--runs" => options.runs = value()?.parse()?,
            "--n" => options.n = value()?.parse()?,
            "--backlog" => options.backlog = value()?.parse()?,
            "--latency-n" => options.latency_n = value()?.parse()?,
            "--events-n" => options.events_n = value()?.parse()?,
            "--providers-n" => options.providers_n = value()?.parse()?,
            "--packing-n" => options.packing_n = value()?.parse()?,
            "--out" => options.out = value()?.into(),
            "--modes" => {
                options.modes = value()?
                    .split(',')
                    .map(|mode| match mode {
                        "off" => Ok(Persistence::Off),
                        "aof" => Ok(Persistence::AofEverysec),
                        other => anyhow::bail!("unknown mode {other} (off, aof)"),
                    })
                    .collect::<anyhow::Result<_>>()?;
            }
            "--scenarios" => options.scenarios = value()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "-h" | "--help" => {
                println!(
                    "usage: batchd-bench [--quick] [--runs 3] [--modes off,aof] [--scenarios 1,2,3,4,5,6,7,8,9] [--n 20000] \
                     [--backlog 100000] [--latency-n 20000] [--events-n 300] [--providers-n 20000] [--packing-n 50000] \
                     [--out target/bench/report.json]"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown option {other} (--help)"),
        }
        i += 2;
    }
    Ok(options)
}

fn shell(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|e| format!("unavailable: {e}"))
}

/// The load average when each run started (kept for the report).
static RUN_LOADS: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// Prints what runs now, with the load average, and remembers both for the report.
fn progress(what: &str) {
    let load = loadavg();
    eprintln!("{what} (load average {load})");
    RUN_LOADS.lock().expect("lock").push((what.to_owned(), load));
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned());
    let bullmq: serde_json::Value =
        std::fs::read_to_string(procs::workspace_root().join("bench/peers/node_modules/bullmq/package.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
    json!({
        "nproc": shell("nproc", &[]),
        "cpu": cpu,
        "mem_total": std::fs::read_to_string("/proc/meminfo").unwrap_or_default().lines().next().unwrap_or("").to_owned(),
        "redis_server": shell("redis-server", &["--version"]),
        "node": shell("node", &["--version"]),
        "bullmq": bullmq["version"],
        "kernel": shell("uname", &["-r"]),
    })
}

fn per_job(counts: &BTreeMap<String, u64>, n: usize) -> f64 {
    total(counts) as f64 / n as f64
}

fn scaled(counts: &BTreeMap<String, u64>, n: usize) -> serde_json::Value {
    counts
        .iter()
        .map(|(name, calls)| (name.clone(), json!((*calls as f64 / n as f64 * 100.0).round() / 100.0)))
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let options = options()?;
    let root = procs::workspace_root();
    let work = root.join("target/bench");
    let logs = work.join("logs");
    std::fs::create_dir_all(&logs)?;
    let mut report = Report::default();
    let machine = machine();
    let load_start = loadavg();
    eprintln!("batchd-bench: {options:?}\nmachine: {machine}\nload average at start: {load_start}");

    for &mode in &options.modes {
        let m = mode.label();
        let bench = Bench { options: &options, mode, work: &work, logs: &logs };
        if options.scenarios.contains(&1) {
            scenario_queue(&bench, &mut report).await?;
        }
        if options.scenarios.contains(&2) {
            scenario_lifecycle(&bench, &mut report).await?;
        }
        if options.scenarios.contains(&3) {
            let s = "3 backlog";
            for run in 0..options.runs {
                progress(&format!("[{m}] scenario 3, run {}: {} jobs", run + 1, options.backlog));
                let redis = RedisServer::start(mode, &work).await?;
                let b = backlog::run(&redis, options.backlog, &logs, &format!("backlog-{m}-{run}")).await?;
                let label = format!("batchd, {} jobs", fmt(options.backlog as f64));
                report.add(s, &label, "daemon RSS, all in flight", "MiB", m, b.daemon_rss_mib);
                report.add(s, &label, "daemon peak RSS (VmHWM), take-in", "MiB", m, b.daemon_hwm_mib);
                report.add(s, &label, "Redis memory per waiting job", "bytes", m, b.redis_bytes_per_waiting_job);
                report.add(s, &label, "Redis memory per job in flight", "bytes", m, b.redis_bytes_per_job_in_flight);
                report.add(s, &label, "take-in (accept + submit + schedule)", "jobs/s", m, b.take_in_per_sec);
                for (page, p50, max) in &b.ui_ms {
                    let label = format!("batchd ui, {} jobs in flight", fmt(options.backlog as f64));
                    report.add(s, &label, &format!("{page} p50"), "ms", m, *p50);
                    report.add(s, &label, &format!("{page} max"), "ms", m, *max);
                }
                for members in [1_000usize, 100_000] {
                    let mut times = backlog::claim_times(&redis, members, 200).await?;
                    let p50 = percentile(&mut times, 50.0);
                    let p99 = percentile(&mut times, 99.0);
                    let label = format!("Store::claim_due(256), {} due", fmt(members as f64));
                    report.add(s, &label, "claim time p50", "ms", m, p50);
                    report.add(s, &label, "claim time p99", "ms", m, p99);
                }
            }
        }
        if options.scenarios.contains(&4) {
            let s = "4 poll timing";
            for run in 0..options.runs {
                progress(&format!("[{m}] scenario 4, run {}", run + 1));
                let redis = RedisServer::start(mode, &work).await?;
                let (mut lateness, rate) =
                    poll_timing::run(&redis, options.poll_window, &logs, &format!("polls-{m}-{run}")).await?;
                let label = "batchd, 1,000 jobs polled every 1 s";
                report.add(s, label, "polls/s seen by the API", "polls/s", m, rate);
                report.add(s, label, "lateness p50", "ms", m, percentile(&mut lateness, 50.0));
                report.add(s, label, "lateness p99", "ms", m, percentile(&mut lateness, 99.0));
                report.add(s, label, "lateness max", "ms", m, percentile(&mut lateness, 100.0));
            }
        }
        if options.scenarios.contains(&5) {
            let s = "5 big payloads";
            for run in 0..options.runs {
                progress(&format!("[{m}] scenario 5, run {}", run + 1));
                let redis = RedisServer::start(mode, &work).await?;
                let b = big::run(&redis, &big::big_submit_job(), &[], &logs, &format!("bigsubmit-{m}-{run}")).await?;
                let label = format!("batchd, {:.2} MB submit (1 batch)", b.job_bytes as f64 / 1e6);
                report.add(s, &label, "XADD → result", "s", m, b.secs);
                report.add(s, &label, "daemon peak RSS (VmHWM)", "MiB", m, b.hwm_mib);
                report.add(s, &label, "daemon RSS before the job", "MiB", m, b.rss_before_mib);
                report.add(s, &label, "peak RSS / payload", "×", m, b.hwm_mib * 1048576.0 / b.job_bytes as f64);
                drop(redis);
                let redis = RedisServer::start(mode, &work).await?;
                let env = [("BATCHD__JOBS__MAX_BATCH_ITEMS", "2000".to_owned())];
                let b = big::run(&redis, &big::big_result_job(), &env, &logs, &format!("bigresult-{m}-{run}")).await?;
                let label = format!("batchd, {:.1} MB merged result (6 batches)", b.result_bytes as f64 / 1e6);
                report.add(s, &label, "XADD → result", "s", m, b.secs);
                report.add(s, &label, "daemon peak RSS (VmHWM)", "MiB", m, b.hwm_mib);
                report.add(s, &label, "peak RSS / result", "×", m, b.hwm_mib * 1048576.0 / b.result_bytes as f64);
            }
        }
        if options.scenarios.contains(&6) {
            scenario_api_latency(&bench, &mut report).await?;
        }
        if options.scenarios.contains(&7) {
            scenario_batch_events(&bench, &mut report).await?;
        }
        if options.scenarios.contains(&8) {
            scenario_providers(&bench, &mut report).await?;
        }
        if options.scenarios.contains(&9) {
            scenario_packing(&bench, &mut report).await?;
        }
    }

    add_ratios(&mut report, &options);
    report.finish();
    let modes: Vec<&str> = options.modes.iter().map(|m| m.label()).collect();
    let table = report.table(&modes);
    let load_end = loadavg();
    println!("{table}");
    println!("load average (1, 5, 15 min) at start: {load_start}; at end: {load_end}");
    let out = json!({
        "machine": machine,
        "load_average_start": load_start,
        "load_average_end": load_end,
        "options": {"runs": options.runs, "n": options.n, "backlog": options.backlog,
                    "poll_window_secs": options.poll_window.as_secs(), "latency_n": options.latency_n,
                    "events_n": options.events_n, "providers_n": options.providers_n,
                    "packing_n": options.packing_n},
        "load_average_per_run": RUN_LOADS.lock().expect("lock").iter()
            .map(|(what, load)| json!({"run": what, "load_average": load})).collect::<Vec<_>>(),
        "rows": report.rows,
        "details": report.details,
    });
    if let Some(dir) = options.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&options.out, serde_json::to_string_pretty(&out)?)?;
    std::fs::write(
        options.out.with_extension("md"),
        format!("{table}\nload average at start: {load_start}; at end: {load_end}\n"),
    )?;
    eprintln!("wrote {}", options.out.display());
    Ok(())
}

/// What every scenario runs with: the options, the Redis persistence mode, the work and log directories.
#[derive(Clone, Copy)]
struct Bench<'a> {
    /// The command line.
    options: &'a Options,
    /// How the scenario's Redis servers persist.
    mode: Persistence,
    /// Where the servers keep their files.
    work: &'a std::path::Path,
    /// Where the daemons' logs go.
    logs: &'a std::path::Path,
}

/// Adds the rows every burst scenario reports: throughput overall and in the steady middle, latency p50/p99, and
/// CPU per job of each process.
fn add_burst_rows(report: &mut Report, (s, label, m): (&str, &str, &str), burst: &mut lifecycle::BurstFigures) {
    report.add(s, label, "throughput, first XADD to last result", "jobs/s", m, burst.jobs_per_sec);
    report.add(s, label, "throughput, 10th to 90th percentile result", "jobs/s", m, burst.steady_jobs_per_sec);
    report.add(s, label, "XADD → result p50", "ms", m, percentile(&mut burst.latencies_ms, 50.0));
    report.add(s, label, "XADD → result p99", "ms", m, percentile(&mut burst.latencies_ms, 99.0));
    for (process, cpu) in ["daemon", "emulator", "redis-server"].iter().zip(burst.cpu_us_per_job) {
        report.add(s, label, &format!("CPU per job, {process}"), "µs", m, cpu);
    }
}

/// The rows of one provider run (scenarios 8 and 9): the burst's, then what the emulator's call log says.
fn add_provider_rows(report: &mut Report, (s, label, m): (&str, &str, &str), r: &mut providers::ProviderRun) {
    add_burst_rows(report, (s, label, m), &mut r.burst);
    report.add(s, label, "polls per batch", "polls", m, r.polls_per_batch);
    report.add(s, label, "remote batches per job", "batches", m, r.batches_per_job);
    report.add(s, label, "API calls per job", "calls", m, r.calls_per_job);
    report.add(s, label, "jobs not completed", "jobs", m, r.not_completed as f64);
    report.add(s, label, "daemon peak RSS (VmHWM)", "MiB", m, r.hwm_mib);
    report.detail(&format!("{s} / {label} / {m} / API calls per job by kind"), json!(r.calls_by_kind));
}

/// Runs one system of scenario 1 against a server.
type RunSystem = Box<dyn Fn(&RedisServer) -> futures::future::BoxFuture<'_, anyhow::Result<queue_layer::QueueRun>>>;

async fn scenario_queue(bench: &Bench<'_>, report: &mut Report) -> anyhow::Result<()> {
    let Bench { options, mode, work, .. } = *bench;
    let s = "1 queue layer";
    let m = mode.label();
    let n = options.n;
    let bullmq_label = format!("BullMQ {}", machine()["bullmq"].as_str().unwrap_or("?"));
    for run in 0..options.runs {
        progress(&format!("[{m}] scenario 1, run {}: {n} jobs", run + 1));
        let systems: Vec<(String, RunSystem)> = vec![
            (
                "batchd (ack)".to_owned(),
                Box::new(move |r| Box::pin(queue_layer::batchd(r, n, queue_layer::Handler::Ack))),
            ),
            (
                "batchd (accept)".to_owned(),
                Box::new(move |r| Box::pin(queue_layer::batchd(r, n, queue_layer::Handler::Accept))),
            ),
            (bullmq_label.clone(), Box::new(move |r| Box::pin(async move { queue_layer::bullmq(r, n, run) }))),
            (
                "apalis-redis 1.0.0".to_owned(),
                Box::new(move |r| Box::pin(async move { queue_layer::apalis_redis(r, n, true, run) })),
            ),
            (
                "apalis-redis 1.0.0 (lock_tasks=false)".to_owned(),
                Box::new(move |r| Box::pin(async move { queue_layer::apalis_redis(r, n, false, run) })),
            ),
        ];
        for (label, run_system) in &systems {
            let redis = RedisServer::start(mode, work).await?;
            let result = run_system(&redis).await.with_context(|| format!("scenario 1: {label}"))?;
            report.add(s, label, "enqueue", "jobs/s", m, n as f64 / result.enqueue_secs);
            report.add(s, label, "drain", "jobs/s", m, n as f64 / result.drain_secs);
            report.add(s, label, "Redis commands per job, enqueue", "cmds", m, per_job(&result.enqueue_commands, n));
            report.add(s, label, "Redis commands per job, drain", "cmds", m, per_job(&result.drain_commands, n));
            report.add(
                s,
                label,
                "CPU per job, worker process, drain",
                "µs",
                m,
                result.drain_worker_cpu_secs * 1e6 / n as f64,
            );
            report.add(
                s,
                label,
                "CPU per job, redis-server, drain",
                "µs",
                m,
                result.drain_redis_cpu_secs * 1e6 / n as f64,
            );
            report.detail(
                &format!("1 queue layer / {label} / {m} / commands per job"),
                json!({"enqueue": scaled(&result.enqueue_commands, n), "drain": scaled(&result.drain_commands, n)}),
            );
        }
        let redis = RedisServer::start(mode, work).await?;
        for (test, rps) in queue_layer::redis_benchmark(&redis, n)? {
            report.add(s, &format!("redis-benchmark {test}, 50 clients"), "commands", "per s", m, rps);
        }
    }
    Ok(())
}

/// The rows of one scenario-2 burst of `n` jobs, under `label`.
fn add_burst(report: &mut Report, label: &str, m: &str, burst: &mut lifecycle::Burst, n: usize) {
    let s = "2 full lifecycle";
    report.add(s, label, "throughput", "jobs/s", m, burst.jobs_per_sec);
    report.add(s, label, "XADD → result p50", "ms", m, percentile(&mut burst.latencies_ms, 50.0));
    report.add(s, label, "XADD → result p99", "ms", m, percentile(&mut burst.latencies_ms, 99.0));
    report.add(s, label, "Redis commands per job (in scripts included)", "cmds", m, per_job(&burst.commands, n));
    report.add(s, label, "jobs not completed", "jobs", m, burst.not_completed as f64);
    for (process, cpu) in ["daemon", "emulator", "redis-server"].iter().zip(burst.cpu_us_per_job) {
        report.add(s, label, &format!("CPU per job, {process}"), "µs", m, cpu);
    }
}

async fn scenario_lifecycle(bench: &Bench<'_>, report: &mut Report) -> anyhow::Result<()> {
    let Bench { options, mode, work, logs } = *bench;
    let s = "2 full lifecycle";
    let m = mode.label();
    let n = options.n;
    let burst_label = format!("batchd, {} jobs at once", fmt(n as f64));
    let tuned_label = format!("batchd tuned (1 runtime thread, concurrency 64/128), {} jobs at once", fmt(n as f64));
    let paced_n = (n / 4).max(500);
    let paced_rate = 500;
    let paced_label = format!("batchd, {} jobs at {paced_rate}/s", fmt(paced_n as f64));
    for run in 0..options.runs {
        progress(&format!("[{m}] scenario 2, run {}: {n} jobs", run + 1));
        let redis = RedisServer::start(mode, work).await?;
        let mut burst = lifecycle::burst(&redis, n, &[], logs, &format!("lifecycle-{m}-{run}")).await?;
        add_burst(report, &burst_label, m, &mut burst, n);
        report.detail(&format!("2 full lifecycle / {m} / commands per job (commandstats)"), scaled(&burst.commands, n));
        drop(redis);
        let redis = RedisServer::start(mode, work).await?;
        let tuned_env = lifecycle::tuned_env();
        let mut tuned = lifecycle::burst(&redis, n, &tuned_env, logs, &format!("tuned-{m}-{run}")).await?;
        add_burst(report, &tuned_label, m, &mut tuned, n);
        drop(redis);
        let redis = RedisServer::start(mode, work).await?;
        let mut paced = lifecycle::paced(&redis, paced_n, paced_rate, logs, &format!("paced-{m}-{run}")).await?;
        report.add(s, &paced_label, "XADD → result p50", "ms", m, percentile(&mut paced, 50.0));
        report.add(s, &paced_label, "XADD → result p99", "ms", m, percentile(&mut paced, 99.0));
    }
    // Round trips and commands per step: one run under MONITOR (slower, so not timed), labelled with its own size.
    let monitored_n = 2_000.min(n);
    let monitor_label = format!("batchd, {} jobs at once under MONITOR (not timed)", fmt(monitored_n as f64));
    let redis = RedisServer::start(mode, work).await?;
    let seen = lifecycle::monitored(&redis, monitored_n, logs, &format!("monitor-{m}")).await?;
    // load_chunk sends HMGET + GET of the cancel flag in one pipeline: one round trip for the two.
    let pipelined = seen.client.get("get").copied().unwrap_or(0);
    let client = per_job(&seen.client, monitored_n);
    report.add(s, &monitor_label, "commands sent by the daemon per job", "cmds", m, client);
    report.add(
        s,
        &monitor_label,
        "round trips per job",
        "round trips",
        m,
        client - pipelined as f64 / monitored_n as f64,
    );
    report.add(s, &monitor_label, "commands run inside scripts per job", "cmds", m, per_job(&seen.lua, monitored_n));
    for (step, commands) in &seen.steps {
        let metric = if step == "outside scripts" {
            "commands per job, outside scripts".to_owned()
        } else {
            format!("commands per job, script {step} (its call and what it ran)")
        };
        report.add(s, &monitor_label, &metric, "cmds", m, *commands as f64 / monitored_n as f64);
    }
    report.detail(
        &format!("2 full lifecycle / {m} / MONITOR per job ({monitored_n} jobs)"),
        json!({"client": scaled(&seen.client, monitored_n), "lua": scaled(&seen.lua, monitored_n),
               "steps": scaled(&seen.steps, monitored_n)}),
    );
    Ok(())
}

/// The ratios and sums the docs quote, computed from this run's rows (runs paired by index: run i of one figure
/// against run i of the other), under scenario `ratios`: batchd's drains against BullMQ's and apalis-redis's, the
/// lifecycle's throughput against BullMQ's no-op drain, and worker + redis-server CPU per drained job of each system.
fn add_ratios(report: &mut Report, options: &Options) {
    let s = "ratios";
    let queue = "1 queue layer";
    let bullmq = report.system_like(queue, "BullMQ");
    let lifecycle = "2 full lifecycle";
    let burst = format!("batchd, {} jobs at once", fmt(options.n as f64));
    let tuned = format!("batchd tuned (1 runtime thread, concurrency 64/128), {} jobs at once", fmt(options.n as f64));
    if let Some(bullmq) = bullmq {
        for system in ["batchd (accept)", "batchd (ack)", "apalis-redis 1.0.0", "apalis-redis 1.0.0 (lock_tasks=false)"]
        {
            let label = format!("{system} ÷ {bullmq}");
            report.ratio(s, &label, "drain, jobs/s", (queue, system, "drain"), (queue, &bullmq, "drain"));
        }
        for system in [&burst, &tuned] {
            let label = format!("{system}: lifecycle ÷ {bullmq} no-op drain");
            report.ratio(s, &label, "throughput, jobs/s", (lifecycle, system, "throughput"), (queue, &bullmq, "drain"));
        }
    }
    let systems: Vec<String> = report.systems(queue);
    for system in systems {
        let parts = [
            (queue, system.as_str(), "CPU per job, worker process, drain"),
            (queue, system.as_str(), "CPU per job, redis-server, drain"),
        ];
        report.sum(s, &system, "CPU per drained job, worker process + redis-server", "µs", &parts);
    }
}

/// Scenario 6: default settings, every API call answered after 100 ms.
async fn scenario_api_latency(bench: &Bench<'_>, report: &mut Report) -> anyhow::Result<()> {
    let Bench { options, mode, work, logs } = *bench;
    let s = "6 API latency";
    let m = mode.label();
    let n = options.latency_n;
    let label = format!(
        "batchd defaults, API answering in {} ms, {} one-item jobs at once",
        api_latency::LATENCY_MS,
        fmt(n as f64)
    );
    for run in 0..options.runs {
        progress(&format!("[{m}] scenario 6, run {}: {n} jobs", run + 1));
        let redis = RedisServer::start(mode, work).await?;
        let mut r = api_latency::run(&redis, n, logs, &format!("latency-{m}-{run}")).await?;
        add_burst_rows(report, (s, &label, m), &mut r.burst);
        report.add(s, &label, "daemon peak RSS (VmHWM)", "MiB", m, r.hwm_mib);
        report.add(s, &label, "daemon RSS before the burst", "MiB", m, r.rss_before_mib);
        report.add(s, &label, "peak RSS / byte budget (256 MiB)", "×", m, r.hwm_mib / api_latency::BUDGET_MIB);
        for (kind, calls) in ["submits", "polls", "rejected calls"].iter().zip(r.calls_per_job) {
            report.add(s, &label, &format!("API {kind} per job"), "calls", m, calls);
        }
        report.add(s, &label, "jobs not completed", "jobs", m, r.not_completed as f64);
        for (process, cores) in ["daemon", "emulator", "redis-server"].iter().zip(r.cores) {
            report.add(s, &label, &format!("CPU used, {process}"), "cores", m, cores);
        }
    }
    Ok(())
}

/// Scenario 7: polling only, events on, events on with every event dropped, on time-compressed 5-minute batches.
async fn scenario_batch_events(bench: &Bench<'_>, report: &mut Report) -> anyhow::Result<()> {
    let Bench { options, mode, work, logs } = *bench;
    let s = "7 batch events";
    let m = mode.label();
    let n = options.events_n;
    let scale = batch_events::TIME_SCALE;
    for run in 0..options.runs {
        for events_mode in [batch_events::Mode::Polling, batch_events::Mode::Events, batch_events::Mode::EventsDropped]
        {
            progress(&format!("[{m}] scenario 7, run {}: {n} jobs, {}", run + 1, events_mode.label()));
            let redis = RedisServer::start(mode, work).await?;
            let tag = format!("events-{m}-{run}-{events_mode:?}").to_lowercase();
            let mut r = batch_events::run(&redis, events_mode, n, logs, &tag).await?;
            let label = format!(
                "{}, {n} one-item jobs, 5-minute batches at 1/{scale} time ({} s)",
                events_mode.label(),
                batch_events::BATCH_MS / 1000
            );
            report.add(s, &label, "polls per completed batch", "polls", m, r.polls_per_batch);
            report.add(s, &label, "queue pulls per completed batch", "pulls", m, r.pulls_per_batch);
            let p50 = percentile(&mut r.latencies_ms, 50.0) / 1000.0;
            let p99 = percentile(&mut r.latencies_ms, 99.0) / 1000.0;
            report.add(s, &label, "batch finish → result p50, as measured", "s", m, p50);
            report.add(s, &label, "batch finish → result p99, as measured", "s", m, p99);
            // A latency set by polls scales with the batch; one set by the event puller is real time already.
            let to_real = if events_mode == batch_events::Mode::Events { 1.0 } else { scale as f64 };
            report.add(s, &label, "batch finish → result p50, at real scale", "s", m, p50 * to_real);
            report.add(s, &label, "batch finish → result p99, at real scale", "s", m, p99 * to_real);
            report.add(s, &label, "jobs completed", "jobs", m, r.completed as f64);
            report.add(s, &label, "events published", "events", m, r.events_published_dropped.0 as f64);
            report.add(s, &label, "events dropped", "events", m, r.events_published_dropped.1 as f64);
        }
    }
    Ok(())
}

/// Scenario 8: scenario 6's burst at each provider, and the file-based ones again with a 10 MB body limit.
async fn scenario_providers(bench: &Bench<'_>, report: &mut Report) -> anyhow::Result<()> {
    let Bench { options, mode, work, logs } = *bench;
    let s = "8 providers";
    let m = mode.label();
    let n = options.providers_n;
    for run in 0..options.runs {
        for provider in providers::Provider::ALL {
            let limits: &[providers::Limits] = match provider {
                providers::Provider::Cloudflare => &[providers::Limits::Defaults],
                _ => &[providers::Limits::Defaults, providers::Limits::TenMegabytes],
            };
            for &limits in limits {
                let setting = match limits {
                    providers::Limits::Defaults | providers::Limits::Documented => "defaults",
                    providers::Limits::TenMegabytes => "defaults but a 10 MB body limit",
                };
                progress(&format!("[{m}] scenario 8, run {}: {n} jobs, {}, {setting}", run + 1, provider.label()));
                let redis = RedisServer::start(mode, work).await?;
                let tag = format!("providers-{m}-{run}-{provider:?}-{limits:?}").to_lowercase();
                let mut r = providers::run(&redis, provider, limits, n, logs, &tag)
                    .await
                    .with_context(|| format!("scenario 8: {} ({setting})", provider.label()))?;
                let label = format!(
                    "{}, batchd {setting}, API answering in {} ms, {} one-item jobs at once, {} s batches",
                    provider.label(),
                    providers::LATENCY_MS,
                    fmt(n as f64),
                    providers::BATCH_MS / 1000
                );
                add_provider_rows(report, (s, &label, m), &mut r);
            }
        }
    }
    Ok(())
}

/// Scenario 9: packing under each provider's documented creation limits (issue 33), one provider at a time.
async fn scenario_packing(bench: &Bench<'_>, report: &mut Report) -> anyhow::Result<()> {
    let Bench { options, mode, work, logs } = *bench;
    let s = "9 packing";
    let m = mode.label();
    let n = options.packing_n;
    for run in 0..options.runs {
        for provider in providers::Provider::ALL {
            progress(&format!("[{m}] scenario 9, run {}: {n} jobs, {}, documented limits", run + 1, provider.label()));
            let redis = RedisServer::start(mode, work).await?;
            let tag = format!("packing-{m}-{run}-{provider:?}").to_lowercase();
            let mut r = providers::run(&redis, provider, providers::Limits::Documented, n, logs, &tag)
                .await
                .with_context(|| format!("scenario 9: {}", provider.label()))?;
            let label = format!(
                "{}, batchd defaults (packing on), the API's documented creation limits, {} ms replies, {} one-item \
                 jobs at once, {} s batches",
                provider.label(),
                providers::LATENCY_MS,
                fmt(n as f64),
                providers::BATCH_MS / 1000
            );
            add_provider_rows(report, (s, &label, m), &mut r);
            if let Some(lone) = r.lone_ms {
                report.add(
                    s,
                    &label,
                    "a lone job after the burst, packed: XADD → create",
                    "ms",
                    m,
                    lone.packed_to_create_ms,
                );
                report.add(s, &label, "a lone job, \"pack\": false: XADD → create", "ms", m, lone.alone_to_create_ms);
                report.add(s, &label, "a lone job after the burst, packed: XADD → result", "ms", m, lone.packed_ms);
                report.add(s, &label, "a lone job, \"pack\": false: XADD → result", "ms", m, lone.alone_ms);
            }
        }
    }
    Ok(())
}
