//! Scenario 9: a replica frozen with SIGSTOP for three leases while it holds claimed submits and polls (their
//! replies slowed down, so they are in flight when it stops). The other replica takes the work over when the
//! leases end and finishes it; then the frozen one is resumed, and every write it still tries is refused by the
//! chunks' fencing tokens: every job exactly one completed result, no finished chunk touched again (no API call
//! for a job after its result), the schedule empty, and the resumed replica's `batchd_stale_writes_total` above 0.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use batchd_emulator::{AnthropicCalls, AnthropicFault, Calls, Fault, FaultKind, OpenAiCallKind, OpenAiFault};

use super::{FAULT_RATE, NO_PERSISTENCE, Timing, finish, secs, seed, stale_writes, start_daemons, supervised_sleep};
use crate::chaos::Size;
use crate::chaos::check::Outcome;
use crate::chaos::cluster::Cluster;
use crate::chaos::load::{self, Mix, spawn_producer};
use crate::chaos::remote::RemoteLog;

/// Scenario 9: two daemons; one is frozen for 3 × the lease with submits and polls in flight, then resumed.
pub(super) async fn freeze(size: Size) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let seed = seed(size);
    // Batches that outlast the freeze, so the resumed replica also finds chunks the other one is still polling.
    let timing = Timing::new(size, size.pick((secs(2), secs(60)), (secs(1), secs(20))));
    let n_jobs = size.pick(1_000, 120);
    let mut outcome = Outcome::new(
        "9-freeze",
        "a replica frozen (SIGSTOP) for 3 leases with work in flight, then resumed: fenced out",
        size,
    );
    let mut cluster =
        Cluster::start("9-freeze", size, &NO_PERSISTENCE, timing.emulator(FAULT_RATE, seed), &timing.vars).await?;
    cluster.event(format!("scenario 9-freeze ({}), seed {seed}, {n_jobs} jobs", size.as_str()));
    start_daemons(&mut cluster, 2).await?;
    let collector = load::Collector::start(cluster.conn.clone(), cluster.keys.clone());
    // The load goes on through the freeze, so the victim is taking jobs in (and posting them) when it stops.
    let (batch, every) = size.pick((50, Duration::from_millis(500)), (10, Duration::from_millis(500)));
    let producer =
        spawn_producer(cluster.conn.clone(), cluster.keys.clone(), load::ids("z", n_jobs), Mix::ALL, batch, every);
    supervised_sleep(&mut cluster, size.pick(secs(5), secs(2))).await;

    // Slow replies (a third of the lease), so the victim has submits and polls in flight when it stops, at every
    // provider: the call takes effect at once, its reply is late.
    let slow = timing.lease / 3;
    cluster.injected_delay_ms = slow.as_millis() as u64;
    let times = size.pick(40, 12);
    for calls in [Calls::Submit, Calls::Poll] {
        let kind = FaultKind::Delay { millis: slow.as_millis() as u64 };
        cluster.emulator.inject(Fault { kind, calls, times });
    }
    for kind in [OpenAiCallKind::CreateBatch, OpenAiCallKind::GetBatch] {
        cluster.emulator.openai().inject(OpenAiFault::delay(slow).on(kind).after_handling().times(times));
    }
    for calls in [AnthropicCalls::Create, AnthropicCalls::Retrieve] {
        cluster.emulator.anthropic().inject(AnthropicFault::delay(slow).on(calls).times(times));
    }
    tokio::time::sleep(slow / 2).await;
    let victim = cluster.in_slot(0).ok_or_else(|| anyhow::anyhow!("no daemon in slot 0"))?;
    let victim_port = cluster.incarnations[victim].port;
    let calls_before = cluster.emulator.calls().iter().filter(|call| call.port == victim_port).count()
        + cluster.emulator.openai().calls().iter().filter(|call| call.port == victim_port).count()
        + cluster.emulator.anthropic().calls().iter().filter(|call| call.port == victim_port).count();
    cluster.freeze(victim, timing.lease * 3).await?;
    outcome.figure("victim_api_calls_before_freeze", calls_before);

    // Resumed: its late writes are refused and counted. Wait for the count while the load drains.
    let mut stale = 0;
    let waited = Instant::now();
    while waited.elapsed() < size.pick(secs(60), secs(30)) {
        stale = stale_writes(&cluster, victim).await.unwrap_or(0);
        if stale > 0 {
            break;
        }
        supervised_sleep(&mut cluster, Duration::from_millis(250)).await;
    }
    outcome.figure("stale_writes_of_the_resumed_replica", stale);
    outcome.expect(stale > 0, || "the resumed replica counted no stale write (batchd_stale_writes_total)".to_owned());

    let produced = producer.await?;
    finish(&mut cluster, collector, &produced, size.pick(secs(300), secs(120)), false, &mut outcome).await;
    let frozen = outcome.duplicate_causes.get(crate::chaos::excuse::CAUSE_FREEZE).copied().unwrap_or(0);
    outcome.figure("duplicate_submits_of_posts_in_flight_at_the_freeze", frozen);

    // No finished chunk was touched again: no API call for a job after its result was published. Except calls the
    // frozen daemon had already started when it stopped (between its last check of the claim and the request
    // leaving): they reach the API within the slowed reply of the SIGCONT, and their outcome is refused.
    let resumed_window = cluster.freezes.first().map(|(_, _, to)| (victim_port, to + slow.as_millis() as u64 + 1_000));
    let published = published_at(&mut cluster).await?;
    let jobs: Vec<String> = produced.acked.keys().cloned().collect();
    let mut log = RemoteLog::read(&cluster.emulator, &jobs);
    log.attribute_packs(&mut cluster.conn.clone(), &cluster.keys, &jobs).await?;
    let job_of_batch: HashMap<&str, &str> =
        log.created.iter().map(|created| (created.batch.as_str(), created.job.as_str())).collect();
    // Creates (by their job) and polls (by their batch's job). Not results downloads: an Anthropic look for an
    // uncertain create reads other chunks' results by design; nor OpenAI's file deletions, which come after the
    // result by design (the outcome is stored first).
    let calls = log.created.iter().map(|created| (created.job.as_str(), "create", created.port, created.at_ms)).chain(
        log.touches.iter().filter(|touch| touch.what == "poll").filter_map(|touch| {
            job_of_batch.get(touch.batch.as_str()).map(|job| (*job, touch.what, touch.port, touch.at_ms))
        }),
    );
    let late: Vec<String> = calls
        .filter_map(|(job, what, port, at_ms)| {
            // A pack's calls end before the first of its members publishes.
            let at = log.jobs_of(job).iter().filter_map(|member| published.get(*member)).min().copied()?;
            let in_flight_at_resume = resumed_window.is_some_and(|(victim, until)| port == victim && at_ms <= until);
            (at_ms > at + 200 && !in_flight_at_resume)
                .then(|| format!("{job}: {what} at {at_ms} after its result at {at}"))
        })
        .collect();
    outcome.figure("api_calls_after_a_result", late.len());
    outcome.expect(late.is_empty(), || {
        format!("{} API calls for jobs already finished: {:?}", late.len(), late.iter().take(5).collect::<Vec<_>>())
    });
    outcome.recovery = cluster.freezes.first().map(|(_, from, to)| Duration::from_millis(to - from));
    outcome.recovery_what =
        format!("how long the replica was frozen (3 × the {} lease)", crate::chaos::human(timing.lease));
    outcome.figure("seed", seed);
    outcome.wall = started.elapsed();
    Ok(outcome)
}

/// Unix ms of each job's result entry (its stream id).
async fn published_at(cluster: &mut Cluster) -> anyhow::Result<HashMap<String, u64>> {
    let mut published = HashMap::new();
    let mut start = "-".to_owned();
    loop {
        let page: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
            .arg(cluster.keys.results())
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(1_000)
            .query_async(&mut cluster.conn)
            .await?;
        let Some((last, _)) = page.last() else { break };
        start = format!("({last}");
        let done = page.len() < 1_000;
        for (id, fields) in page {
            let ms = id.split('-').next().and_then(|ms| ms.parse().ok()).unwrap_or(0);
            published.entry(fields.get("job_id").cloned().unwrap_or_default()).or_insert(ms);
        }
        if done {
            break;
        }
    }
    Ok(published)
}
