//! Process faults: `kill -9` of a random daemon every few seconds (scenario 1), and a rolling SIGTERM restart
//! under load, replica by replica (scenario 4).

use std::time::{Duration, Instant};

use super::{Dice, FAULT_RATE, NO_PERSISTENCE, Timing, finish, secs, seed, start_daemons, supervised_sleep};
use crate::chaos::abandoned::{collect_trackers, judge_abandoned, track_abandoned};
use crate::chaos::check::Outcome;
use crate::chaos::cluster::{Cluster, End};
use crate::chaos::load::{self, Collector, Mix, spawn_producer};
use crate::chaos::{Size, human, unix_ms};

/// Scenario 1: three daemons, 5,000 jobs, random 1–20 s batches and 5% faults; every few seconds one random
/// daemon gets `kill -9` and is restarted.
pub(super) async fn kill9(size: Size) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let seed = seed(size);
    let mut dice = Dice::new(seed);
    let timing = Timing::new(size, size.pick((secs(1), secs(20)), (secs(1), secs(4))));
    let n_jobs = size.pick(5_000, 150);
    let mut outcome = Outcome::new("1-kill9", "3 daemons, kill -9 of a random one every few seconds", size);
    let mut cluster =
        Cluster::start("1-kill9", size, &NO_PERSISTENCE, timing.emulator(FAULT_RATE, seed), &timing.vars).await?;
    cluster.event(format!("scenario 1-kill9 ({}), seed {seed}, {n_jobs} jobs", size.as_str()));
    start_daemons(&mut cluster, 3).await?;
    let collector = Collector::start(cluster.conn.clone(), cluster.keys.clone());
    let (batch, every) = size.pick((50, Duration::from_millis(500)), (15, Duration::from_millis(500)));
    let producer =
        spawn_producer(cluster.conn.clone(), cluster.keys.clone(), load::ids("k", n_jobs), Mix::ALL, batch, every);
    let load_time = every * (n_jobs / batch) as u32;
    let chaos_until = Instant::now() + load_time + size.pick(secs(40), secs(6));
    let (gap_low, gap_high) = size.pick((secs(2), secs(6)), (Duration::from_millis(1500), secs(3)));
    let mut trackers = Vec::new();
    while Instant::now() < chaos_until {
        let gap = dice.between(gap_low, gap_high);
        supervised_sleep(&mut cluster, gap).await;
        let live = cluster.live();
        let victim = live[dice.index(live.len())];
        let (slot, pid) = (cluster.incarnations[victim].slot, cluster.incarnations[victim].pid);
        cluster.kill9(victim)?;
        let at_ms = unix_ms();
        trackers.push((
            format!("kill -9 of daemon #{victim}"),
            track_abandoned(
                cluster.conn.clone(),
                cluster.keys.clone(),
                pid,
                at_ms,
                timing.claim_threshold(),
                timing.lease + secs(60),
            ),
        ));
        // A supervisor restarts it after a moment (systemd RestartSec, a Kubernetes container restart).
        tokio::time::sleep(dice.between(Duration::from_millis(300), size.pick(secs(2), Duration::from_millis(800))))
            .await;
        cluster.start_daemon(slot).await?;
        cluster.restarts += 1;
    }
    cluster.event(format!("chaos over: {} kills", cluster.kills));
    let produced = producer.await?;
    let (drained, _) =
        finish(&mut cluster, collector, &produced, size.pick(secs(600), secs(120)), false, &mut outcome).await;
    let reports = collect_trackers(&mut outcome, trackers).await?;
    // Take-over is only tested by kills that abandoned something: the kills made while jobs were still being
    // enqueued must have left claims or ingress entries behind, or "taken over within the lease" holds trivially.
    // One such kill may find its replica with nothing in hand (restarted a moment before, its batch just finished),
    // so what is required is work abandoned by the kills under load together, and every idle one is counted.
    let under_load: Vec<_> = reports.iter().filter(|(_, report)| report.at_ms <= produced.finished_ms).collect();
    let idle_kills: Vec<&str> = under_load
        .iter()
        .filter(|(_, report)| report.claims + report.entries == 0)
        .map(|(what, _)| what.as_str())
        .collect();
    outcome.figure("kills_under_load", under_load.len());
    outcome.figure("kills_under_load_that_abandoned_nothing", idle_kills.len());
    outcome.expect(under_load.is_empty() || idle_kills.len() < under_load.len(), || {
        format!(
            "none of the {} kills under load abandoned a claim or an ingress entry: {idle_kills:?}",
            under_load.len()
        )
    });
    // A claim waits at most its lease, an entry its idle time plus one reclaim round; the slack is for a loaded
    // 2-core machine (fetch intervals, the tracker's own 200 ms polling).
    let slack = size.pick(secs(10), secs(5));
    judge_abandoned(
        &mut outcome,
        &reports,
        timing.lease + slack,
        timing.reclaim_idle + timing.reclaim_interval + slack,
    );
    outcome.recovery = reports.iter().filter_map(|(_, report)| report.resumed_after).max();
    outcome.recovery_what = format!(
        "longest wait of work abandoned by a kill -9 until another daemon took it over (lease {}, reclaim idle {})",
        human(timing.lease),
        human(timing.reclaim_idle)
    );
    outcome.figure("seed", seed);
    // From the last kill (the end of the load) until every job had its result.
    outcome.figure("drain_after_last_kill_ms", drained.map(|drained| drained.as_millis() as u64));
    outcome.figure("producer_retries", produced.failed_attempts);
    outcome.wall = started.elapsed();
    Ok(outcome)
}

/// Scenario 4: rolling restart under load, as Kubernetes does it: start the new replica, wait until it is
/// ready, SIGTERM the old one, wait for exit 0; replica by replica. Zero lost, zero duplicates.
pub(super) async fn rolling_sigterm(size: Size) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let seed = seed(size);
    let timing = Timing::new(size, size.pick((secs(1), secs(10)), (secs(1), secs(3))));
    let n_jobs = size.pick(3_000, 150);
    let rounds = size.pick(2, 1);
    let mut outcome = Outcome::new("4-rolling-sigterm", "rolling SIGTERM restart of 3 replicas under load", size);
    let mut cluster =
        Cluster::start("4-rolling-sigterm", size, &NO_PERSISTENCE, timing.emulator(FAULT_RATE, seed), &timing.vars)
            .await?;
    cluster
        .event(format!("scenario 4-rolling-sigterm ({}), seed {seed}, {n_jobs} jobs, {rounds} rounds", size.as_str()));
    start_daemons(&mut cluster, 3).await?;
    cluster.wait_ready(secs(30)).await?;
    let collector = Collector::start(cluster.conn.clone(), cluster.keys.clone());
    let (batch, every) = size.pick((50, Duration::from_millis(500)), (15, Duration::from_millis(400)));
    let producer =
        spawn_producer(cluster.conn.clone(), cluster.keys.clone(), load::ids("s", n_jobs), Mix::ALL, batch, every);
    let mut stops = Vec::new();
    let mut trackers = Vec::new();
    for round in 0..rounds {
        for slot in 0..3 {
            supervised_sleep(&mut cluster, size.pick(secs(4), Duration::from_millis(800))).await;
            let old = cluster.in_slot(slot).ok_or_else(|| anyhow::anyhow!("no daemon in slot {slot}"))?;
            let new = cluster.start_daemon(slot).await?;
            let ready = wait_one_ready(&cluster, new, secs(30)).await;
            outcome
                .expect(ready.is_some(), || format!("round {round}: the new daemon #{new} was not ready within 30 s"));
            let pid = cluster.incarnations[old].pid;
            let end = cluster.terminate(old, timing.grace + secs(15)).await;
            cluster.restarts += 1;
            match end {
                Ok(End::Stopped { code, took, .. }) => {
                    outcome.expect(code == Some(0), || format!("daemon #{old} exited with {code:?} after SIGTERM"));
                    stops.push(took);
                }
                Ok(other) => outcome.failures.push(format!("daemon #{old}: unexpected end {other:?}")),
                Err(error) => outcome.failures.push(format!("daemon #{old}: {error:#}")),
            }
            trackers.push((
                format!("SIGTERM of daemon #{old}"),
                track_abandoned(
                    cluster.conn.clone(),
                    cluster.keys.clone(),
                    pid,
                    unix_ms(),
                    timing.claim_threshold(),
                    timing.lease + secs(30),
                ),
            ));
        }
    }
    let produced = producer.await?;
    finish(&mut cluster, collector, &produced, size.pick(secs(600), secs(120)), true, &mut outcome).await;
    let reports = collect_trackers(&mut outcome, trackers).await?;
    // A graceful stop hands its unstarted work back: no claim waits for its lease, entries are taken at the
    // next reclaim round.
    let abandoned_claims: usize = reports.iter().map(|(_, report)| report.claims).sum();
    outcome.expect(abandoned_claims == 0, || {
        format!("{abandoned_claims} schedule claims of gracefully stopped daemons waited for their lease")
    });
    judge_abandoned(&mut outcome, &reports, timing.lease, timing.reclaim_interval + secs(5));
    outcome.expect(outcome.duplicated_results.is_empty() && outcome.lost.is_empty(), || {
        "a graceful restart lost or duplicated work".to_owned()
    });
    let longest_stop = stops.iter().max().copied();
    outcome.figure("longest_sigterm_to_exit_ms", longest_stop.map(|d| d.as_millis() as u64));
    outcome.figure("sigterm_to_exit_ms", stops.iter().map(|d| d.as_millis() as u64).collect::<Vec<_>>());
    outcome.recovery = longest_stop;
    outcome.recovery_what = format!("longest SIGTERM-to-exit (drain of work in flight; grace {})", human(timing.grace));
    outcome.figure("seed", seed);
    outcome.wall = started.elapsed();
    Ok(outcome)
}

/// Waits until one daemon answers `/readyz` with 200.
async fn wait_one_ready(cluster: &Cluster, index: usize, timeout: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < timeout {
        if matches!(cluster.readyz(index).await, Ok((200, _))) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}
