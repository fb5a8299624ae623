//! Process faults: `kill -9` of a daemon every few seconds (scenario 1), random or aimed at a create whose reply the
//! emulator holds, and a rolling SIGTERM restart under load, replica by replica (scenario 4).

use std::time::{Duration, Instant};

use batchd_emulator::{
    AnthropicCalls, AnthropicFault, AnthropicFaultKind, OpenAiCallKind, OpenAiFault, OpenAiFaultKind,
};

use super::{Dice, FAULT_RATE, NO_PERSISTENCE, Timing, finish, secs, seed, start_daemons, supervised_sleep};
use crate::chaos::abandoned::{collect_trackers, judge_abandoned, track_abandoned};
use crate::chaos::check::Outcome;
use crate::chaos::cluster::{Cluster, End};
use crate::chaos::load::{self, Collector, Mix, Provider, spawn_producer};
use crate::chaos::{Size, human, unix_ms};

/// The kills of scenario 1, in turn while jobs are being enqueued: one aimed inside an OpenAI create, one inside an
/// Anthropic create, one inside a Workers AI submit, one at random. Once every job is in, creates are rare (retries
/// only) and every kill is random.
const AIMS: [Option<Provider>; 4] =
    [Some(Provider::OpenAi), Some(Provider::Anthropic), Some(Provider::Cloudflare), None];

/// Scenario 1: three daemons, 5,000 jobs, random 1–20 s batches and 5% faults; every few seconds one daemon gets
/// `kill -9` (a random one, or the one whose OpenAI or Anthropic create the emulator holds) and is restarted. Fails
/// when no kill interrupted a create at some provider: a fault that never landed proves nothing.
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
    // The short load lasts 12.5 s, so that its first three kills (aimed at the three providers, 1.5–3 s apart, each
    // after its aim's wait) come while it runs.
    let (batch, every) = size.pick((50, Duration::from_millis(500)), (6, Duration::from_millis(500)));
    let producer =
        spawn_producer(cluster.conn.clone(), cluster.keys.clone(), load::ids("k", n_jobs), Mix::ALL, batch, every);
    let load_time = every * (n_jobs / batch) as u32;
    let chaos_until = Instant::now() + load_time + size.pick(secs(40), secs(6));
    let (gap_low, gap_high) = size.pick((secs(2), secs(6)), (Duration::from_millis(1500), secs(3)));
    let mut trackers = Vec::new();
    let mut aims = AIMS.iter().cycle();
    let mut missed_aims = 0;
    while Instant::now() < chaos_until {
        let gap = dice.between(gap_low, gap_high);
        supervised_sleep(&mut cluster, gap).await;
        let aim = if producer.is_finished() { None } else { *aims.next().unwrap_or(&None) };
        let aimed = match aim {
            Some(provider) => aimed_kill(&mut cluster, provider, size.pick(secs(10), secs(4))).await?,
            None => None,
        };
        if aim.is_some() && aimed.is_none() {
            missed_aims += 1;
        }
        let victim = match aimed {
            Some(victim) => victim,
            None => {
                let live = cluster.live();
                let victim = live[dice.index(live.len())];
                cluster.kill9(victim)?;
                victim
            }
        };
        let (slot, pid) = (cluster.incarnations[victim].slot, cluster.incarnations[victim].pid);
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
    cluster.event(format!("chaos over: {} kills, {} aimed", cluster.kills, cluster.aimed_kills.len()));
    let produced = producer.await?;
    let (drained, _) =
        finish(&mut cluster, collector, &produced, size.pick(secs(600), secs(120)), false, &mut outcome).await;
    outcome.figure("aimed_kills", cluster.aimed_kills.len());
    outcome.figure("aimed_kills_missed", missed_aims);
    for provider in Mix::ALL.providers() {
        let interrupted = outcome.providers.get(provider).map_or(0, |counts| counts.interrupted_by_kill);
        outcome.expect(interrupted > 0, || {
            format!("no kill -9 interrupted a create at {}: the fault never landed there", provider.as_str())
        });
    }
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
    for _ in 0..rounds {
        for slot in 0..3 {
            supervised_sleep(&mut cluster, size.pick(secs(4), Duration::from_millis(800))).await;
            let old = cluster.in_slot(slot).ok_or_else(|| anyhow::anyhow!("no daemon in slot {slot}"))?;
            let pid = cluster.incarnations[old].pid;
            stops.extend(replace_in_slot(&mut cluster, slot, timing.grace, &mut outcome).await?);
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

/// A `kill -9` aimed inside a create at `provider`. At OpenAI and Anthropic the emulator holds the reply of the next
/// create there (the batch exists and the call is logged), the process that sent it is killed while it waits, then
/// the held reply is let go. Workers AI has no hold: the next submit the emulator logs (handled, its reply still
/// waiting out the drawn latency) has its process killed at once, within half the shortest latency of the log.
/// Returns the incarnation killed, or `None` when no create came within `wait` (a hold is taken back; the caller
/// kills at random instead).
async fn aimed_kill(cluster: &mut Cluster, provider: Provider, wait: Duration) -> anyhow::Result<Option<usize>> {
    if provider == Provider::Cloudflare {
        return aimed_kill_workers_ai(cluster, wait).await;
    }
    let openai = cluster.emulator.openai();
    let anthropic = cluster.emulator.anthropic();
    let held = match provider {
        Provider::OpenAi => {
            openai.inject(OpenAiFault::hold().on(OpenAiCallKind::CreateBatch).after_handling());
            openai.wait_until_held(1, wait).await || {
                // Taken back with the random faults queued beside it, which go back in.
                for fault in openai.clear_faults() {
                    if fault.kind != OpenAiFaultKind::Hold {
                        openai.inject(fault);
                    }
                }
                openai.held_replies() > 0
            }
        }
        Provider::Anthropic => {
            anthropic.inject(AnthropicFault::hold().on(AnthropicCalls::Create));
            anthropic.wait_until_held(1, wait).await || {
                for fault in anthropic.clear_faults() {
                    if fault.kind != AnthropicFaultKind::Hold {
                        anthropic.inject(fault);
                    }
                }
                anthropic.held_replies() > 0
            }
        }
        Provider::Cloudflare => false,
    };
    if !held {
        cluster.event(format!("no {} create to aim a kill at within {}", provider.as_str(), human(wait)));
        return Ok(None);
    }
    let is_hold = |fault: Option<&str>| fault.is_some_and(|faults| faults.split('+').any(|name| name == "hold"));
    let port = match provider {
        Provider::OpenAi => openai
            .calls_of(OpenAiCallKind::CreateBatch)
            .iter()
            .rev()
            .find(|call| is_hold(call.fault.as_deref()))
            .map(|call| call.port),
        _ => anthropic
            .calls_of(batchd_emulator::AnthropicCallKind::Create)
            .iter()
            .rev()
            .find(|call| is_hold(call.fault.as_deref()))
            .map(|call| call.port),
    };
    let victim = port.and_then(|port| cluster.by_port(port)).map(|(index, _)| index);
    let victim = victim.filter(|index| cluster.live().contains(index));
    if let Some(index) = victim {
        cluster.kill9(index)?;
        cluster.aimed_kills.push((provider, index));
        cluster.event(format!("that kill was aimed inside a {} create whose reply was held", provider.as_str()));
    }
    // The killed process's held call ends with its connection; let go of anything else held.
    match provider {
        Provider::OpenAi => openai.release_held(),
        _ => anthropic.release_held(),
    };
    Ok(victim)
}

/// [`aimed_kill`] at Workers AI: watches the call log for a submit just handled by a live daemon, and kills it
/// before the submit's reply can leave (the shortest drawn latency).
async fn aimed_kill_workers_ai(cluster: &mut Cluster, wait: Duration) -> anyhow::Result<Option<usize>> {
    let after = cluster.emulator.calls().last().map_or(0, |call| call.seq);
    let fresh_ms = cluster.latency_ms.0 / 2;
    let until = Instant::now() + wait;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis((fresh_ms / 2).clamp(1, 10))).await;
        let submits = cluster.emulator.submits();
        let (now_ms, live) = (unix_ms(), cluster.live());
        let victim = submits.iter().rev().take_while(|call| call.seq > after).find_map(|call| {
            let fresh = (200..300).contains(&call.http_status) && now_ms < call.at_ms + fresh_ms;
            let index = cluster.by_port(call.port).map(|(index, _)| index)?;
            (fresh && live.contains(&index)).then_some(index)
        });
        if let Some(index) = victim {
            cluster.kill9(index)?;
            cluster.aimed_kills.push((Provider::Cloudflare, index));
            cluster.event("that kill was aimed inside a cloudflare submit whose reply was still due");
            return Ok(Some(index));
        }
    }
    cluster.event(format!("no cloudflare submit to aim a kill at within {}", human(wait)));
    Ok(None)
}

/// Waits until one daemon answers `/readyz` with 200.
/// A rollout's step in `slot`, as a Deployment takes it: a new daemon started, ready (its `/readyz` 200 within
/// 30 s), then the slot's old one stopped with SIGTERM (given `grace` and 15 s), which must exit 0. Failures go to
/// `outcome`; returns how long the old one took to exit, when it did.
pub(super) async fn replace_in_slot(
    cluster: &mut Cluster,
    slot: usize,
    grace: Duration,
    outcome: &mut Outcome,
) -> anyhow::Result<Option<Duration>> {
    let old = cluster.in_slot(slot).ok_or_else(|| anyhow::anyhow!("no daemon in slot {slot}"))?;
    let new = cluster.start_daemon(slot).await?;
    let ready = wait_one_ready(cluster, new, secs(30)).await;
    outcome.expect(ready.is_some(), || format!("slot {slot}: the new daemon #{new} was not ready within 30 s"));
    let end = cluster.terminate(old, grace + secs(15)).await;
    cluster.restarts += 1;
    match end {
        Ok(End::Stopped { code, took, .. }) => {
            outcome.expect(code == Some(0), || format!("daemon #{old} exited with {code:?} after SIGTERM"));
            Ok(Some(took))
        }
        Ok(other) => {
            outcome.failures.push(format!("daemon #{old}: unexpected end {other:?}"));
            Ok(None)
        }
        Err(error) => {
            outcome.failures.push(format!("daemon #{old}: {error:#}"));
            Ok(None)
        }
    }
}

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
