//! The Redis work one job costs, as a guard: 500 one-item jobs go take-in → submit → poll → publish through the real
//! daemon (in-process) and the emulator over HTTP, each batch done at its first poll, and the commands Redis served
//! meanwhile (`INFO commandstats`, commands inside scripts included) are divided by the number of jobs.
//!
//! The count is deterministic up to the daemon's idle reads (a schedule read or an ingress read that finds
//! nothing), which the jobs' own work dwarfs; so a change that adds one command per job fails here, in `make test`,
//! and not in a benchmark nobody re-ran. docs/benchmarks.md has the same figure from `make bench` (release build).

use std::collections::BTreeMap;
use std::time::Duration;

use batchd_emulator::EmulatorConfig;
use batchd_tests::World;

/// Jobs per run: enough that the daemon's start-up and idle reads are under 0.1 command per job.
const JOBS: usize = 500;

/// Redis commands per lifecycle job: what this engine costs (27.8 measured here; docs/benchmarks.md has where each
/// one goes), with room for the idle reads only, so one more command per job fails. Of the 27.8, 2 are the
/// remote-batches index (`Keys::remote_batches`) behind `batchd_oldest_remote_batch_age_seconds`: a ZADD in the
/// transition that records a submit and a ZREM when the job is published (issue 26, stuck batches). The schedule
/// alone cannot say how old a batch is (a polling chunk's score is its next poll), and reading every ledger per
/// sample is unbounded; the index makes a sample cost a fixed 64 `HMGET`s at most.
const MAX_COMMANDS_PER_JOB: f64 = 28.5;

/// Calls per command (`INFO commandstats`, commands inside scripts included).
pub(crate) async fn commandstats(world: &World) -> BTreeMap<String, u64> {
    let text: String = redis::cmd("INFO").arg("commandstats").query_async(&mut world.conn.clone()).await.expect("INFO");
    text.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

#[tokio::test]
async fn a_job_costs_no_more_redis_commands_than_measured_from_take_in_to_result() {
    let config =
        EmulatorConfig { queued_for: Duration::ZERO, running_for: Duration::ZERO, ..EmulatorConfig::default() };
    let mut world = World::with_emulator(config).await;
    // First poll right after the submit, so every batch is polled exactly once (it is done by then).
    world.settings.poll.initial_interval_ms = 1;
    world.settings.poll.max_interval_ms = 1;
    world.settings.poll.jitter = 0.0;

    let daemon = world.daemon();
    // Warm up: the first job creates the consumer group, loads the scripts and starts every loop.
    world
        .enqueue(&serde_json::json!({"id": "warm", "model": "@cf/baai/bge-m3",
        "requests": [{"query": "q", "contexts": [{"text": "c"}]}]}))
        .await;
    world.wait_for_results(1, Duration::from_secs(30)).await;

    let before = commandstats(&world).await;
    let mut pipe = redis::pipe();
    for i in 0..JOBS {
        let job = serde_json::json!({"id": format!("j{i}"), "model": "@cf/baai/bge-m3",
            "requests": [{"query": "What is batchd?", "contexts": [{"text": "A batch daemon."}]}]});
        pipe.xadd(world.keys.submit(), "*", &[("job", job.to_string())]);
    }
    let _: Vec<String> = pipe.query_async(&mut world.conn.clone()).await.expect("enqueue");
    world.wait_for_results(JOBS + 1, Duration::from_secs(120)).await;
    let after = commandstats(&world).await;
    daemon.stop().await.expect("daemon stops");

    let mut per_command: Vec<(String, f64)> = after
        .iter()
        .map(|(name, calls)| (name.clone(), calls.saturating_sub(before.get(name).copied().unwrap_or(0))))
        .map(|(name, calls)| {
            // The test's own enqueue (one XADD per job) and its waits (XLEN, XRANGE of the results, INFO).
            let own = match name.as_str() {
                "xadd" => JOBS as u64,
                "info" => 1,
                _ => 0,
            };
            (name, calls.saturating_sub(own) as f64 / JOBS as f64)
        })
        .filter(|(name, per_job)| *per_job > 0.0 && name != "xlen")
        .collect();
    per_command.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = per_command.iter().map(|(_, n)| n).sum();
    let breakdown: Vec<String> = per_command.iter().map(|(name, n)| format!("{name} {n:.2}")).collect();
    println!("{total:.2} Redis commands per job: {}", breakdown.join(", "));
    assert!(
        total <= MAX_COMMANDS_PER_JOB,
        "a job costs {total:.2} Redis commands, more than {MAX_COMMANDS_PER_JOB}: {}",
        breakdown.join(", ")
    );
    // The jobs really went the whole way: one completed result each.
    let results = world.results().await;
    assert_eq!(results.len(), JOBS + 1);
    assert!(results.iter().all(|fields| fields.get("status").map(String::as_str) == Some("completed")));
    // ... each submitted once and polled once, so the count is the lifecycle's and not a retry's or a re-poll's.
    assert_eq!(world.emulator.submits().len(), JOBS + 1);
    assert_eq!(world.emulator.polls().len(), JOBS + 1);
}
