//! Redis faults: Redis killed mid-run and started again from its AOF (scenario 2), unreachable for 30 s, frozen
//! with SIGSTOP or down (scenario 3), and briefly down while a daemon records a request id (finding 1).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use batchd_emulator::CallKind;

use super::{AOF, FAULT_RATE, NO_PERSISTENCE, Timing, finish, secs, seed, start_daemons, supervised_sleep};
use crate::chaos::check::Outcome;
use crate::chaos::cluster::Cluster;
use crate::chaos::load::{self, Collector, Mix, spawn_producer};
use crate::chaos::{Size, human, unix_ms};

/// Scenario 2: Redis with AOF (everysec) killed with -9 mid-run and started again on the same port and
/// directory (the full run also does a `SHUTDOWN NOSAVE` later); daemons reconnect on their own.
pub(super) async fn redis_aof_restart(size: Size) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let seed = seed(size);
    let timing = Timing::new(size, size.pick((secs(1), secs(10)), (secs(1), secs(3))));
    let n_jobs = size.pick(3_000, 150);
    let mut outcome = Outcome::new("2-redis-aof-restart", "Redis (AOF everysec) killed and restarted mid-run", size);
    let mut cluster =
        Cluster::start("2-redis-aof-restart", size, &AOF, timing.emulator(FAULT_RATE, seed), &timing.vars).await?;
    cluster.event(format!("scenario 2-redis-aof-restart ({}), seed {seed}, {n_jobs} jobs", size.as_str()));
    start_daemons(&mut cluster, 3).await?;
    let collector = Collector::start(cluster.conn.clone(), cluster.keys.clone());
    let (batch, every) = size.pick((50, Duration::from_millis(500)), (15, Duration::from_millis(500)));
    let producer =
        spawn_producer(cluster.conn.clone(), cluster.keys.clone(), load::ids("r", n_jobs), Mix::ALL, batch, every);

    // (how, down ms, up ms, the last submit-stream entry id the restarted Redis holds)
    let mut restarts: Vec<(String, u64, u64, StreamId)> = Vec::new();
    supervised_sleep(&mut cluster, size.pick(secs(12), Duration::from_millis(2500))).await;
    let plan: Vec<&str> = match size {
        Size::Full => vec!["kill -9", "SHUTDOWN NOSAVE"],
        Size::Short => vec!["kill -9"],
    };
    for (i, how) in plan.iter().enumerate() {
        if i > 0 {
            supervised_sleep(&mut cluster, secs(15)).await;
        }
        let down_ms = unix_ms();
        if *how == "kill -9" {
            cluster.redis.kill();
        } else {
            let client = redis::Client::open(cluster.redis.url())?;
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg("NOSAVE").query_async(&mut conn).await;
            }
            if !cluster.redis.wait_for_exit(secs(10)) {
                outcome.failures.push("redis-server did not exit after SHUTDOWN NOSAVE".to_owned());
                cluster.redis.kill();
            }
        }
        cluster.kills += 1;
        cluster.event(format!("redis-server stopped with {how}"));
        let kept = last_entry_kept(&cluster).await?;
        cluster.event(format!("its AOF holds the submit stream up to entry {}-{}", kept.0, kept.1));
        tokio::time::sleep(size.pick(secs(1), Duration::from_millis(500))).await;
        cluster.redis.restart().await;
        let up_ms = unix_ms();
        cluster.restarts += 1;
        cluster.redis_outages.push((down_ms, up_ms));
        cluster.event(format!(
            "redis-server started again from its AOF after {}",
            human(Duration::from_millis(up_ms - down_ms))
        ));
        restarts.push(((*how).to_owned(), down_ms, up_ms, kept));
    }
    let produced = producer.await?;
    let (_, collected) =
        finish(&mut cluster, collector, &produced, size.pick(secs(600), secs(120)), false, &mut outcome).await;

    // Recovery: from Redis being back until results flow again.
    let mut recovery = Duration::ZERO;
    for (how, down_ms, up_ms, _) in &restarts {
        if let Some(first) = collected.first_arrival_after(*up_ms) {
            let after = Duration::from_millis(first - up_ms);
            recovery = recovery.max(after);
            outcome.notes.push(format!(
                "after {how}: Redis down {}, first result {} after it was back",
                human(Duration::from_millis(up_ms - down_ms)),
                human(after)
            ));
        }
    }
    outcome.recovery = Some(recovery);
    outcome.recovery_what = "from Redis being back until the next result was published".to_owned();

    // What the fsync policy allows: with appendfsync everysec, writes acknowledged in the last second before a
    // machine crash can be lost; a killed process loses nothing it acknowledged (the AOF is written before the
    // reply). A lost job is excused only when its own `XADD` is missing from what Redis loaded at a restart (its
    // entry id is past the last one the AOF held): then Redis lost it, not batchd. A job whose `XADD` Redis kept
    // and that has no result is a take-in or publish defect, and its failure stays.
    let mut xadd_kept = Vec::new();
    for id in &outcome.lost {
        let entry = produced.entry_ids.get(id).and_then(|entry| StreamId::parse(entry));
        let acked = produced.acked.get(id).copied().unwrap_or(0);
        let xadd_lost =
            entry.is_some_and(|entry| restarts.iter().any(|(_, down_ms, _, kept)| acked <= *down_ms && entry > *kept));
        if !xadd_lost {
            xadd_kept.push(format!("{id} (entry {:?}, acknowledged at {acked})", produced.entry_ids.get(id)));
        }
    }
    let xadd_lost = outcome.lost.len() - xadd_kept.len();
    outcome.figure("lost_xadd_not_in_aof", xadd_lost);
    outcome.figure("lost_xadd_in_aof", xadd_kept.len());
    outcome.expect(xadd_kept.is_empty(), || {
        format!(
            "{} lost jobs whose XADD the restarted Redis had kept: {:?}",
            xadd_kept.len(),
            xadd_kept.iter().take(5).collect::<Vec<_>>()
        )
    });
    if xadd_lost > 0 && xadd_kept.is_empty() {
        // Every lost job is explained by Redis losing its XADD: reported, not a failure of batchd.
        outcome.notes.push(format!(
            "{xadd_lost} acknowledged jobs were lost with their XADD, which the restarted Redis did not hold"
        ));
        outcome.failures.retain(|failure| !failure.contains("acknowledged by XADD have no result"));
    }
    outcome.notes.push(format!(
        "the producer's pipelines failed {} times while Redis was away and were sent again",
        produced.failed_attempts
    ));
    outcome.figure("seed", seed);
    outcome.wall = started.elapsed();
    Ok(outcome)
}

/// A stream entry id, `<ms>-<seq>`, ordered as Redis orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct StreamId(u64, u64);

impl StreamId {
    fn parse(text: &str) -> Option<Self> {
        let (ms, seq) = text.split_once('-')?;
        Some(Self(ms.parse().ok()?, seq.parse().ok()?))
    }
}

/// The last entry id ever added to the submit stream in what a stopped Redis will load when it starts again (read
/// from a copy of its directory, before any client writes to the restarted one); `0-0` when the stream is not there.
async fn last_entry_kept(cluster: &Cluster) -> anyhow::Result<StreamId> {
    let copy = cluster.redis.start_copy().await?;
    let mut conn = redis::Client::open(copy.url())?.get_multiplexed_async_connection().await?;
    let info: redis::RedisResult<HashMap<String, redis::Value>> =
        redis::cmd("XINFO").arg("STREAM").arg(cluster.keys.submit()).query_async(&mut conn).await;
    match info {
        Ok(info) => {
            let last: String =
                redis::from_redis_value_ref(info.get("last-generated-id").context("no last-generated-id")?)?;
            StreamId::parse(&last).with_context(|| format!("not a stream id: {last}"))
        }
        Err(error) if error.to_string().contains("no such key") => Ok(StreamId(0, 0)),
        Err(error) => Err(error.into()),
    }
}

/// How Redis becomes unreachable in scenario 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outage {
    /// SIGSTOP, then SIGCONT: connections stay open and nothing answers.
    Freeze,
    /// kill -9, then started again from its AOF: connections are refused.
    Down,
}

/// Scenario 3: Redis unreachable for 30 s (frozen with SIGSTOP, or killed and restarted from its AOF):
/// daemons stay up, `/readyz` says why, work resumes by itself, nothing is lost.
pub(super) async fn redis_unreachable(size: Size, outage: Outage) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let seed = seed(size);
    let timing = Timing::new(size, size.pick((secs(1), secs(10)), (secs(1), secs(3))));
    let n_jobs = size.pick(2_000, 100);
    let (name, title, args): (&str, &str, &[&str]) = match outage {
        Outage::Freeze => ("3a-redis-sigstop", "Redis frozen (SIGSTOP) for 30 s, then SIGCONT", &NO_PERSISTENCE),
        Outage::Down => ("3b-redis-down", "Redis killed, down 30 s, restarted from its AOF", &AOF),
    };
    let title = if size == Size::Short { title.replace("30 s", "8 s") } else { title.to_owned() };
    let mut outcome = Outcome::new(name, &title, size);
    let mut cluster = Cluster::start(name, size, args, timing.emulator(FAULT_RATE, seed), &timing.vars).await?;
    cluster.event(format!("scenario {name} ({}), seed {seed}, {n_jobs} jobs", size.as_str()));
    start_daemons(&mut cluster, 3).await?;
    cluster.wait_ready(secs(30)).await?;
    let collector = Collector::start(cluster.conn.clone(), cluster.keys.clone());
    let (batch, every) = size.pick((50, Duration::from_millis(500)), (10, Duration::from_millis(500)));
    let producer =
        spawn_producer(cluster.conn.clone(), cluster.keys.clone(), load::ids("u", n_jobs), Mix::ALL, batch, every);
    supervised_sleep(&mut cluster, size.pick(secs(8), Duration::from_millis(2500))).await;

    // Short: long enough for readiness to turn (a sample every 500 ms, 2 s timeout) on a loaded machine.
    let length = size.pick(secs(30), secs(8));
    let down_ms = unix_ms();
    match outage {
        Outage::Freeze => cluster.redis.signal("STOP")?,
        Outage::Down => cluster.redis.kill(),
    }
    cluster.kills += 1;
    cluster.event(format!(
        "redis-server {} for {}",
        if outage == Outage::Freeze { "frozen (SIGSTOP)" } else { "killed" },
        human(length)
    ));
    let down_at = Instant::now();
    // Readiness must turn to 503 with a reason on every daemon, while every daemon stays up.
    let mut unready: HashMap<usize, (Duration, String)> = HashMap::new();
    while down_at.elapsed() < length {
        for index in cluster.live() {
            if unready.contains_key(&index) {
                continue;
            }
            if let Ok((503, body)) = cluster.readyz(index).await {
                unready.insert(index, (down_at.elapsed(), body.trim().to_owned()));
            }
        }
        let died = cluster.supervise().await.unwrap_or(0);
        outcome.expect(died == 0, || "a daemon exited while Redis was unreachable".to_owned());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let live = cluster.live();
    for index in &live {
        match unready.get(index) {
            Some((after, reason)) => {
                outcome.expect(reason.to_lowercase().contains("redis"), || {
                    format!("daemon #{index}: /readyz 503 without naming Redis: {reason:?}")
                });
                outcome.notes.push(format!("daemon #{index}: /readyz 503 after {}: {reason:?}", human(*after)));
            }
            None => outcome
                .failures
                .push(format!("daemon #{index}: /readyz never answered 503 during the {} outage", human(length))),
        }
    }
    let flip = unready.values().map(|(after, _)| *after).max();
    outcome.figure("readyz_503_within_ms", flip.map(|d| d.as_millis() as u64));
    if let Some((_, reason)) = unready.values().next() {
        outcome.figure("readyz_reason", reason.clone());
    }

    match outage {
        Outage::Freeze => cluster.redis.signal("CONT")?,
        Outage::Down => {
            cluster.redis.restart().await;
            cluster.restarts += 1;
        }
    }
    let up_ms = unix_ms();
    let up_at = Instant::now();
    cluster.redis_outages.push((down_ms, up_ms));
    cluster.event(format!("redis-server back after {}", human(Duration::from_millis(up_ms - down_ms))));
    let ready_after = cluster.wait_ready(secs(60)).await;
    match &ready_after {
        Ok(after) => outcome.figure("readyz_200_again_within_ms", after.as_millis() as u64),
        Err(error) => outcome.failures.push(format!("daemons not ready again after Redis came back: {error:#}")),
    }
    let produced = producer.await?;
    // Work resumed by itself: a result published after Redis came back.
    let mut resumed = None;
    while up_at.elapsed() < secs(120) {
        if let Some(first) = collector.snapshot().first_arrival_after(up_ms) {
            resumed = Some(Duration::from_millis(first - up_ms));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    outcome.expect(resumed.is_some(), || "no result published within 120 s of Redis coming back".to_owned());
    outcome.recovery = resumed;
    outcome.recovery_what = "from Redis being back until the next result was published".to_owned();
    if let Ok(after) = ready_after {
        outcome.notes.push(format!("every daemon ready again {} after Redis was back", human(after)));
    }
    outcome.notes.push(format!(
        "the producer's pipelines failed {} times during the outage and were sent again",
        produced.failed_attempts
    ));
    finish(&mut cluster, collector, &produced, size.pick(secs(600), secs(120)), false, &mut outcome).await;
    outcome.figure("seed", seed);
    outcome.wall = started.elapsed();
    Ok(outcome)
}

/// Finding 1: a submit whose POST succeeds while Redis is briefly unavailable is submitted again, although the
/// daemon lived and knew the request id.
///
/// The POST of a job's only chunk is answered after 1.5 s (emulator latency); Redis is killed as soon as the
/// emulator has created the batch, and started again from its AOF 2.5 s later. The daemon gets the request id
/// while Redis is down, cannot record it, drops it, and after the lease the chunk (still `submitting`) is
/// submitted again: a second remote batch. Expected: one remote batch (record the request id once Redis is back).
pub(super) async fn redis_blip_while_recording() -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let size = Size::Short;
    let mut timing = Timing::new(size, (secs(1), secs(1)));
    timing.latency = (Duration::from_millis(1500), Duration::from_millis(1500));
    let mut outcome = Outcome::new(
        "f1-redis-blip-while-recording",
        "finding: a submit answered while Redis blinks is submitted again",
        size,
    );
    // Each job's own submit is what the finding is about: three jobs packed would be one create.
    let mut vars = timing.vars.clone();
    vars.push(("BATCHD__PACKING__ENABLED", "false".to_owned()));
    let mut cluster = Cluster::start("f1-redis-blip", size, &AOF, timing.emulator(0.0, 1), &vars).await?;
    start_daemons(&mut cluster, 1).await?;
    cluster.wait_ready(secs(30)).await?;
    let collector = Collector::start(cluster.conn.clone(), cluster.keys.clone());
    let ids = load::ids("blip", 3);
    let produced =
        load::produce(cluster.conn.clone(), cluster.keys.clone(), ids.clone(), Mix::CLOUDFLARE, 3, Duration::ZERO)
            .await;
    // Wait until the emulator has created all three batches (their replies are 1.5 s away), then take Redis away.
    let waited = Instant::now();
    while cluster.emulator.batch_count() < ids.len() {
        anyhow::ensure!(waited.elapsed() < secs(20), "the submits never reached the emulator");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let down_ms = unix_ms();
    cluster.redis.kill();
    cluster.kills += 1;
    cluster.event("batches created, replies on their way: redis-server killed");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    cluster.redis.restart().await;
    cluster.restarts += 1;
    let up_ms = unix_ms();
    cluster.redis_outages.push((down_ms, up_ms));
    cluster.event("redis-server started again from its AOF");
    // The finding's precondition, from the emulator's log: each batch's reply (sent one fixed latency after the
    // submit arrived) left while Redis was down, so the daemon held a request id it could not record.
    let latency_ms = timing.latency.0.as_millis() as u64;
    let replies_in_outage = cluster
        .emulator
        .calls()
        .iter()
        .filter(|call| call.kind == CallKind::Submit && (200..300).contains(&call.http_status))
        .filter(|call| call.at_ms + latency_ms > down_ms && call.at_ms + latency_ms < up_ms)
        .count();
    outcome.figure("submit_replies_during_outage", replies_in_outage);
    outcome.expect(replies_in_outage == ids.len(), || {
        format!(
            "precondition: {replies_in_outage} of {} submit replies were sent while Redis was down (Unix ms \
             {down_ms}..{up_ms}); the run tested nothing",
            ids.len()
        )
    });
    finish(&mut cluster, collector, &produced, secs(90), false, &mut outcome).await;
    // `verify` explains these duplicates by the outage; the finding is that they happen at all.
    let duplicates = outcome.duplicate_submits;
    outcome.expect(duplicates == 0, || {
        format!(
            "{duplicates} of {} chunks were submitted twice: each POST succeeded while Redis was down for 2.5 s; the \
             daemon, alive and holding the request id, could not record it, left the chunk `submitting` and \
             resubmitted it after the lease (counted in possible_duplicate_submits). Expected one remote batch per \
             chunk: retry recording a known request id until Redis is back instead of dropping it",
            ids.len()
        )
    });
    outcome.figure("emulator_batches", cluster.emulator.batch_count());
    outcome.wall = started.elapsed();
    Ok(outcome)
}
