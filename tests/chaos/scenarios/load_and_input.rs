//! Load and input: a 100,000-job backlog (scenario 5), replicas whose wall clocks disagree (scenario 7), hostile
//! entries mixed into the job stream (scenario 8), and the peak RSS of refusing oversize entries (finding 2).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use batchd_emulator::CallKind;

use super::{FAULT_RATE, NO_PERSISTENCE, Timing, finish, secs, seed, start_daemons, supervised_sleep};
use crate::chaos::check::{Outcome, drain};
use crate::chaos::cluster::Cluster;
use crate::chaos::load::{self, Collector, Mix, spawn_producer};
use crate::chaos::remote::RemoteLog;
use crate::chaos::{Size, human, unix_ms};
use crate::chaos::{clock, hostile};

/// Scenario 5: a backlog of 100,000 jobs enqueued while no daemon runs (pipelined `XADD`), then three daemons
/// start and drain it.
pub(super) async fn backlog(size: Size) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let seed = seed(size);
    let mut timing = Timing::new(size, size.pick((secs(1), secs(5)), (secs(1), secs(2))));
    timing.latency = (Duration::from_millis(10), Duration::from_millis(100));
    let n_jobs = size.pick(100_000, 3_000);
    let mut outcome = Outcome::new("5-backlog", "backlog enqueued with no daemon running, then 3 daemons", size);
    // 100,000 results must all stay in the stream for the check (the default MAXLEN ~ is 100,000).
    let mut vars = timing.vars.clone();
    vars.push(("BATCHD__RETENTION__RESULTS_MAXLEN", "1000000".to_owned()));
    // Thousands of requests at once reach the emulator, which shares two cores with three debug daemons: patient
    // requests under a longer lease, in the production ratio (60 s / 120 s), so an overloaded emulator's late reply
    // is not taken for a failure. No replica dies here; the lease only bounds a step.
    let (timeout, lease) = size.pick(("20", "40"), ("10", "20"));
    for key in [
        "BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS",
        "BATCHD__OPENAI__REQUEST_TIMEOUT_SECS",
        "BATCHD__ANTHROPIC__REQUEST_TIMEOUT_SECS",
    ] {
        vars.push((key, timeout.to_owned()));
    }
    vars.push(("BATCHD__SCHEDULE__LEASE_SECS", lease.to_owned()));
    let mut cluster =
        Cluster::start("5-backlog", size, &NO_PERSISTENCE, timing.emulator(FAULT_RATE, seed), &vars).await?;
    cluster.event(format!("scenario 5-backlog ({}), seed {seed}, {n_jobs} jobs", size.as_str()));
    let ids = load::ids("b", n_jobs);
    let enqueue_started = Instant::now();
    let produced = load::produce(cluster.conn.clone(), cluster.keys.clone(), ids, Mix::ALL, 1000, Duration::ZERO).await;
    let enqueue_time = enqueue_started.elapsed();
    cluster.event(format!("{n_jobs} jobs enqueued in {}", human(enqueue_time)));
    let collector = Collector::start(cluster.conn.clone(), cluster.keys.clone());
    start_daemons(&mut cluster, 3).await?;
    let (drained, _) =
        finish(&mut cluster, collector, &produced, size.pick(secs(1800), secs(300)), false, &mut outcome).await;
    // `drain` measures from its own start, just after the daemons were started, to the last result.
    let drain_time = drained;
    outcome.figure("enqueue_ms", enqueue_time.as_millis() as u64);
    outcome.figure("enqueue_jobs_per_sec", (n_jobs as f64 / enqueue_time.as_secs_f64()).round());
    if let Some(drain_time) = drain_time {
        outcome.figure("drain_ms", drain_time.as_millis() as u64);
        outcome.figure("drain_jobs_per_sec", (n_jobs as f64 / drain_time.as_secs_f64()).round());
        outcome.notes.push(format!(
            "{n_jobs} jobs enqueued in {} ({:.0}/s); drained by 3 daemons in {} ({:.0} jobs/s), batches {}–{}",
            human(enqueue_time),
            n_jobs as f64 / enqueue_time.as_secs_f64(),
            human(drain_time),
            n_jobs as f64 / drain_time.as_secs_f64(),
            human(timing.durations.0),
            human(timing.durations.1)
        ));
    }
    outcome.recovery = drain_time;
    outcome.recovery_what = "drain time: from starting the daemons until every job had its result".to_owned();
    outcome.figure("seed", seed);
    outcome.wall = started.elapsed();
    Ok(outcome)
}

/// Scenario 7: three replicas whose wall clocks disagree (libfaketime, monotonic clock real): one exact, one
/// 300 s ahead, one 300 s behind; half-way through the load the exact one jumps 600 s ahead (in the full run, the
/// one ahead later jumps to 600 s behind). Every emulator reply is 0.7–1.3 s late, so a submit is in flight long
/// enough for a replica that misreads a lease to take its chunk. Zero duplicate submits, and no batch polled
/// sooner than its interval allows.
pub(super) async fn clock_skew(size: Size) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let seed = seed(size);
    let mut timing = Timing::new(size, size.pick((secs(1), secs(10)), (secs(1), secs(3))));
    timing.latency = (Duration::from_millis(700), Duration::from_millis(1300));
    let n_jobs = size.pick(3_000, 150);
    let mut outcome = Outcome::new(
        "7-clock-skew",
        "3 replicas with wall clocks at +0 s, +300 s, -300 s, one jumping mid-run; replies 0.7-1.3 s late",
        size,
    );
    let mut cluster =
        Cluster::start("7-clock-skew", size, &NO_PERSISTENCE, timing.emulator(FAULT_RATE, seed), &timing.vars).await?;
    cluster.event(format!("scenario 7-clock-skew ({}), seed {seed}, {n_jobs} jobs", size.as_str()));
    for (slot, spec) in ["+0s", "+300s", "-300s"].into_iter().enumerate() {
        let file = clock::clock_file(cluster.log_dir(), slot);
        clock::set_clock(&file, spec)?;
        cluster.clocks.push((slot, 0, clock::offset_ms(spec)));
        cluster.set_slot_vars(slot, clock::faked_clock(&file)?);
        cluster.event(format!("slot {slot}: wall clock {spec}"));
    }
    start_daemons(&mut cluster, 3).await?;
    cluster.wait_ready(secs(30)).await?;
    for index in cluster.live() {
        // The faked clock is in effect: the library is mapped into the daemon.
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", cluster.incarnations[index].pid))?;
        anyhow::ensure!(maps.contains("libfaketime"), "daemon #{index} runs without libfaketime");
    }
    let collector = Collector::start(cluster.conn.clone(), cluster.keys.clone());
    let (batch, every) = size.pick((50, Duration::from_millis(500)), (15, Duration::from_millis(500)));
    let producer =
        spawn_producer(cluster.conn.clone(), cluster.keys.clone(), load::ids("c", n_jobs), Mix::ALL, batch, every);
    let load_time = every * (n_jobs / batch) as u32;
    let mut jumps = vec![(load_time / 2, 0, "+600s")];
    if size == Size::Full {
        jumps.push((load_time * 3 / 4, 1, "-600s"));
    }
    let mut waited = Duration::ZERO;
    for (at, slot, spec) in jumps {
        supervised_sleep(&mut cluster, at.saturating_sub(waited)).await;
        waited = at;
        clock::set_clock(&clock::clock_file(cluster.log_dir(), slot), spec)?;
        cluster.clocks.push((slot, unix_ms(), clock::offset_ms(spec)));
        cluster.event(format!("the wall clock of slot {slot} jumps to {spec}"));
    }
    let produced = producer.await?;
    finish(&mut cluster, collector, &produced, size.pick(secs(600), secs(120)), true, &mut outcome).await;

    // A poll comes no sooner than the previous call's reply (at least the shortest latency) plus the shortest
    // jittered interval; 50 ms of slack for the emulator's own timestamps.
    let initial_poll = Duration::from_millis(var_ms(&cluster, "BATCHD__POLL__INITIAL_INTERVAL_MS"));
    let bound = (timing.latency.0 + initial_poll.mul_f64(1.0 - POLL_JITTER)).saturating_sub(Duration::from_millis(50));
    let jobs: Vec<String> = produced.acked.keys().cloned().collect();
    let gaps = clock::poll_gaps(&RemoteLog::read(&cluster.emulator, &jobs), bound);
    outcome.figure("polls_checked_for_earliness", gaps.checked);
    outcome.figure("shortest_wait_before_a_poll_ms", gaps.shortest.map(|d| d.as_millis() as u64));
    outcome.figure("earliest_allowed_poll_ms", bound.as_millis() as u64);
    outcome.figure("early_polls", gaps.early.len());
    // At least one poll per remote batch of its own: per job or pack (judged by `finish`).
    let units = outcome.figures.get("units_submitted").and_then(serde_json::Value::as_u64).unwrap_or(n_jobs as u64);
    outcome.expect(gaps.checked as u64 >= units, || {
        format!("only {} polls followed an answered call, for {units} jobs and packs", gaps.checked)
    });
    outcome.expect(gaps.early.is_empty(), || {
        format!(
            "{} polls came sooner than {} after the batch's previous answered call: {:?}",
            gaps.early.len(),
            human(bound),
            gaps.early.iter().take(5).collect::<Vec<_>>()
        )
    });
    outcome.notes.push(format!(
        "{} polls after an answered call, the shortest wait {} (allowed: {} = shortest latency {} + {} × (1 - jitter {POLL_JITTER}) - 50 ms)",
        gaps.checked,
        gaps.shortest.map_or("-".to_owned(), human),
        human(bound),
        human(timing.latency.0),
        human(initial_poll)
    ));
    outcome.recovery_what = "none: no fault from outside; the figures are duplicates and poll waits".to_owned();
    outcome.figure("seed", seed);
    outcome.wall = started.elapsed();
    Ok(outcome)
}

/// `poll.jitter` (the default; the chaos runs do not set it).
const POLL_JITTER: f64 = 0.2;

/// A millisecond setting of the run (0 when unset).
fn var_ms(cluster: &Cluster, key: &str) -> u64 {
    cluster.var(key).and_then(|value| value.parse().ok()).unwrap_or(0)
}

const MIB: usize = 1024 * 1024;

/// Scenario 8: three replicas, a steady stream of good jobs, and the hostile entries of [`hostile::catalogue`]
/// mixed in (three rounds in the full run, one in the short). Every good job completes exactly once; every hostile
/// entry gets one `failed` result with its error code, and a dead-letter copy when it is not a job at all; no
/// replica exits; each replica's peak RSS stays under idle + `workers.inflight_bytes` + 3 × the largest entry
/// (docs/operations.md, "Memory and threads").
pub(super) async fn hostile_entries(size: Size) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let seed = seed(size);
    let timing = Timing::new(size, size.pick((secs(1), secs(10)), (secs(1), secs(3))));
    let n_jobs = size.pick(3_000, 150);
    let rounds = size.pick(3, 1);
    let max_entry_bytes = size.pick(32 * MIB, 4 * MIB);
    let inflight_bytes = size.pick(64 * MIB, 16 * MIB);
    let mut outcome = Outcome::new("8-hostile-entries", "3 replicas, good jobs with hostile entries mixed in", size);
    let mut vars = timing.vars.clone();
    vars.push(("BATCHD__JOBS__MAX_ENTRY_BYTES", max_entry_bytes.to_string()));
    vars.push(("BATCHD__WORKERS__INFLIGHT_BYTES", inflight_bytes.to_string()));
    vars.push(("BATCHD__INGRESS__MAX_DELIVERIES", "2".to_owned()));
    let mut cluster =
        Cluster::start("8-hostile-entries", size, &NO_PERSISTENCE, timing.emulator(FAULT_RATE, seed), &vars).await?;
    cluster
        .event(format!("scenario 8-hostile-entries ({}), seed {seed}, {n_jobs} jobs, {rounds} rounds", size.as_str()));
    start_daemons(&mut cluster, 3).await?;
    cluster.wait_ready(secs(30)).await?;
    let mut idle = HashMap::new();
    for index in cluster.live() {
        idle.insert(index, cluster.status_bytes(index, "VmRSS")?);
    }
    let collector = Collector::start(cluster.conn.clone(), cluster.keys.clone());
    let (batch, every) = size.pick((50, Duration::from_millis(500)), (15, Duration::from_millis(500)));
    let producer =
        spawn_producer(cluster.conn.clone(), cluster.keys.clone(), load::ids("g", n_jobs), Mix::ALL, batch, every);
    let load_time = every * (n_jobs / batch) as u32;
    let mut sent = Vec::new();
    let mut largest_entry = 0;
    for round in 0..rounds {
        // Each round in the middle of its share of the load, while good jobs keep arriving.
        supervised_sleep(&mut cluster, load_time / (2 * rounds as u32)).await;
        let entries = hostile::catalogue(round, size, max_entry_bytes, &cluster.keys);
        largest_entry = entries.iter().map(hostile::Hostile::bytes).max().unwrap_or(0).max(largest_entry);
        let n = entries.len();
        let mut conn = cluster.conn.clone();
        sent.extend(hostile::send(&mut conn, &cluster.keys, entries).await?);
        cluster.event(format!(
            "round {round}: {n} hostile entries sent (largest {:.1} MiB)",
            largest_entry as f64 / MIB as f64
        ));
        supervised_sleep(&mut cluster, load_time / (2 * rounds as u32)).await;
    }
    let mut produced = producer.await?;
    produced.hostile = sent.iter().map(|one| one.job_id().to_owned()).collect();
    anyhow::ensure!(produced.hostile.len() == sent.len(), "two hostile entries share a result job id");

    // Peak RSS is read before the daemons stop; `finish` drains again (at once) and stops them.
    let drain_timeout = size.pick(secs(600), secs(120));
    drain(&mut cluster, &collector, produced.acked.len() + produced.hostile.len(), drain_timeout).await;
    let live = cluster.live();
    outcome.expect(live == [0, 1, 2], || format!("the three first replicas are not all running: {live:?}"));
    let mut peaks = Vec::new();
    for index in live {
        let peak = cluster.status_bytes(index, "VmHWM")?;
        let idle = idle.get(&index).copied().unwrap_or(0);
        let bound = idle + inflight_bytes as u64 + 3 * largest_entry as u64;
        let mib = |bytes: u64| (bytes as f64 / MIB as f64 * 10.0).round() / 10.0;
        outcome.expect(peak <= bound, || {
            format!(
                "daemon #{index}: peak RSS {} MiB over idle + inflight_bytes + 3 × the largest entry = {} MiB",
                mib(peak),
                mib(bound)
            )
        });
        peaks.push(
            serde_json::json!({"daemon": index, "idle_mib": mib(idle), "peak_mib": mib(peak), "bound_mib": mib(bound)}),
        );
        outcome.notes.push(format!(
            "daemon #{index}: idle {} MiB, peak RSS {} MiB, bound {} MiB (idle + {} MiB + 3 × {:.1} MiB)",
            mib(idle),
            mib(peak),
            mib(bound),
            inflight_bytes / MIB,
            largest_entry as f64 / MIB as f64
        ));
    }
    outcome.figure("peak_rss", peaks);
    finish(&mut cluster, collector, &produced, drain_timeout, true, &mut outcome).await;
    outcome.expect(cluster.restarts == 0, || format!("{} replica restarts", cluster.restarts));

    let mut conn = cluster.conn.clone();
    let got = hostile::judge(&mut conn, &cluster.keys, &sent, &mut outcome).await?;
    let strays: Vec<String> = cluster
        .emulator
        .calls()
        .iter()
        .filter(|call| call.kind == CallKind::Submit)
        .filter(|call| !call.first_reference.as_deref().is_some_and(|id| produced.acked.contains_key(id)))
        .map(|call| format!("{:?} ({} items)", call.first_reference, call.n_items.unwrap_or(0)))
        .collect();
    outcome.expect(strays.is_empty(), || format!("hostile entries reached the API: {strays:?}"));
    let mut table = Vec::new();
    for (kind, got) in &got {
        outcome.notes.push(format!(
            "{kind}: {} sent ({:.1} KiB), results {:?} ({:?}), dead-lettered {}{} ({:?})",
            got.sent,
            got.bytes as f64 / 1024.0,
            got.results,
            got.message,
            got.dead,
            if got.dead_truncated { ", copy truncated" } else { "" },
            got.dead_error
        ));
        table.push(serde_json::json!({
            "kind": kind,
            "sent": got.sent,
            "bytes": got.bytes,
            "results": got.results,
            "message": got.message,
            "dead_lettered": got.dead,
            "dead_error": got.dead_error,
            "dead_copy_truncated": got.dead_truncated,
        }));
    }
    outcome.figure("hostile", table);
    outcome.figure("hostile_entries", sent.len());
    outcome.figure("largest_entry_bytes", largest_entry);
    outcome.recovery_what = "none: no fault from outside; the figures are what each hostile entry got".to_owned();
    outcome.figure("seed", seed);
    outcome.wall = started.elapsed();
    Ok(outcome)
}

/// Finding 2: refusing an entry over `jobs.max_entry_bytes` unparsed costs 3.1–4.3 × the entry in RSS, while
/// docs/operations.md counts 2 × for the read of an entry before its size is known (and 3 × in the worst-case
/// formula, idle + `workers.inflight_bytes` + 3 × the largest entry). With the budget in use at the same time, a
/// replica goes over the formula: seen in a full run of scenario 8 (365.5 MiB against 337.5 MiB).
///
/// Here one daemon (entries up to 32 MiB) refuses three 90 MB entries of 30,000,000 empty items, one after the
/// other, after 30 one-item jobs have finished, so the budget holds nothing; expected: peak RSS within idle + 3 ×
/// the entry.
pub(super) async fn oversize_entry_peak_rss() -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let size = Size::Short;
    let timing = Timing::new(size, (secs(1), secs(1)));
    let mut outcome =
        Outcome::new("f2-oversize-entry-peak-rss", "finding: an oversize entry costs over 3 × its size in RSS", size);
    let (max_entry_bytes, inflight_bytes) = (32 * MIB, 64 * MIB);
    let mut vars = timing.vars.clone();
    vars.push(("BATCHD__JOBS__MAX_ENTRY_BYTES", max_entry_bytes.to_string()));
    vars.push(("BATCHD__WORKERS__INFLIGHT_BYTES", inflight_bytes.to_string()));
    let mut cluster = Cluster::start("f2-oversize-rss", size, &NO_PERSISTENCE, timing.emulator(0.0, 1), &vars).await?;
    start_daemons(&mut cluster, 1).await?;
    cluster.wait_ready(secs(30)).await?;
    let collector = Collector::start(cluster.conn.clone(), cluster.keys.clone());
    let mut produced = load::produce(
        cluster.conn.clone(),
        cluster.keys.clone(),
        load::ids("f2", 30),
        Mix::CLOUDFLARE,
        10,
        Duration::ZERO,
    )
    .await;
    drain(&mut cluster, &collector, produced.acked.len(), secs(60)).await;
    let idle = cluster.status_bytes(0, "VmRSS")?;
    let mut sent = Vec::new();
    for round in 0..3 {
        let entry = hostile::catalogue(round, Size::Full, max_entry_bytes, &cluster.keys)
            .into_iter()
            .find(|entry| entry.kind == "oversize")
            .ok_or_else(|| anyhow::anyhow!("no oversize entry in the catalogue"))?;
        let mut conn = cluster.conn.clone();
        let one = hostile::send(&mut conn, &cluster.keys, vec![entry]).await?;
        let job_id = one[0].job_id().to_owned();
        sent.extend(one);
        let waited = Instant::now();
        while !collector.snapshot().seen.contains_key(&job_id) {
            anyhow::ensure!(waited.elapsed() < secs(120), "no result for the oversize entry {job_id}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        cluster.event(format!("oversize entry {round} refused"));
    }
    produced.hostile = sent.iter().map(|one| one.job_id().to_owned()).collect();
    let peak = cluster.status_bytes(0, "VmHWM")?;
    let largest = sent.iter().map(|one| one.hostile.bytes()).max().unwrap_or(0) as u64;
    let bound = idle + 3 * largest;
    let mib = |bytes: u64| (bytes as f64 / MIB as f64 * 10.0).round() / 10.0;
    outcome.figure("idle_rss_mib", mib(idle));
    outcome.figure("peak_rss_mib", mib(peak));
    outcome.figure("entry_mib", mib(largest));
    outcome.figure(
        "peak_over_idle_per_entry_byte",
        ((peak - idle.min(peak)) as f64 / largest as f64 * 100.0).round() / 100.0,
    );
    outcome.expect(peak <= bound, || {
        format!(
            "peak RSS {} MiB after refusing three {} MiB entries unparsed with an empty budget: {:.2} × the entry above \
             idle ({} MiB), more than the 3 × the worst-case formula of docs/operations.md allows (2 × documented for \
             the read of an entry before its size is known); with the budget in use, the formula does not hold",
            mib(peak),
            mib(largest),
            (peak - idle.min(peak)) as f64 / largest as f64,
            mib(idle),
        )
    });
    finish(&mut cluster, collector, &produced, secs(60), true, &mut outcome).await;
    let mut conn = cluster.conn.clone();
    hostile::judge(&mut conn, &cluster.keys, &sent, &mut outcome).await?;
    outcome.wall = started.elapsed();
    Ok(outcome)
}
