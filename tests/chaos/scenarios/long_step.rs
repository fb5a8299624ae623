//! Scenario 10 (issue 22): a step that takes more than twice the lease, with the lease renewed while it runs, is
//! not taken over.
//!
//! Two daemons; OpenAI jobs of two items, the second of which fails at the API, so each batch ends with an output
//! file and an error file. A chunk's last poll is one step: `GET /batches/{id}`, then both files downloaded. The
//! emulator answers each of those three requests 12.5 s late (the call is handled at once, its reply waits), so the
//! step lasts over 37.5 s under a 16 s lease.
//!
//! How the configuration rule `schedule.lease_secs` > every provider's `request_timeout_secs` stays true (16 > 15):
//! no single request outlasts the request timeout; the step is long because it is several requests in a row, as a
//! real results fetch is (the status, then an output file and an error file, each read within the memory budget,
//! which may itself make a download wait for room). The engine renews the claim every third of the lease while the
//! step runs (`Pipeline::renewing`), so no other replica may claim the chunk meanwhile.
//!
//! Checked, on top of the usual checks (one completed result per job, **zero** duplicate submits): that steps
//! really outlasted twice the lease (from the emulator's log: the poll's arrival to the last download's reply),
//! that none of them was taken over (no other call for its batch during it, from either daemon), that the lease was
//! renewed during each (the chunk's score in the schedule, sampled every 250 ms, moved forward at least twice while
//! it was claimed), and that neither daemon counted a stale write (`batchd_stale_writes_total` = 0).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use batchd_core::Keys;
use batchd_emulator::{OpenAiCallKind, OpenAiCallRecord, OpenAiFault, OpenAiTiming};
use redis::aio::ConnectionManager;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{NO_PERSISTENCE, Timing, finish, secs, seed, stale_writes, start_daemons};
use crate::chaos::check::{Outcome, drain};
use crate::chaos::cluster::Cluster;
use crate::chaos::load::{self, Collector, Mix};
use crate::chaos::{Size, human, unix_ms};

/// The scenario's lease.
const LEASE: Duration = Duration::from_secs(16);
/// Every provider's request timeout: under the lease, as the configuration check requires.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How late the emulator answers each request of a chunk's last poll step: 2.5 s under the request timeout, for a
/// loaded machine (the emulator shares two cores with the daemons; with 1.5 s, a full run saw replies miss it).
const LATE: Duration = Duration::from_millis(12_500);

/// Scenario 10: a poll-and-download step of 3 × 12.5 s under a 16 s lease, renewed, not taken over.
pub(super) async fn long_step(size: Size) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let seed = seed(size);
    let timing = Timing::new(size, (secs(1), secs(1)));
    let n_jobs = size.pick(150, 12);
    let mut outcome = Outcome::new(
        "10-long-step",
        "a poll step of 3 × 12.5 s (status, output file, error file) under a 16 s lease: renewed, not taken over",
        size,
    );
    let mut vars = timing.vars.clone();
    let timeout = REQUEST_TIMEOUT.as_secs().to_string();
    for key in [
        "BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS",
        "BATCHD__OPENAI__REQUEST_TIMEOUT_SECS",
        "BATCHD__ANTHROPIC__REQUEST_TIMEOUT_SECS",
    ] {
        vars.push((key, timeout.clone()));
    }
    vars.push(("BATCHD__SCHEDULE__LEASE_SECS", LEASE.as_secs().to_string()));
    // Each job's own batch and poll steps are what is measured: twelve jobs packed would be one or two steps.
    vars.push(("BATCHD__PACKING__ENABLED", "false".to_owned()));
    // A batch is done 400 ms after its create; the first poll comes 1.2–1.8 s after the submit, so it is the last.
    vars.push(("BATCHD__POLL__INITIAL_INTERVAL_MS", "1500".to_owned()));
    vars.push(("BATCHD__POLL__MAX_INTERVAL_MS", "3000".to_owned()));
    let mut config = timing.emulator(0.0, seed);
    config.random_latency = None;
    config.openai.timing = OpenAiTiming {
        validating_for: Duration::from_millis(100),
        in_progress_for: Duration::from_millis(200),
        finalizing_for: Duration::from_millis(100),
        ..OpenAiTiming::default()
    };
    let mut cluster = Cluster::start("10-long-step", size, &NO_PERSISTENCE, config, &vars).await?;
    cluster.event(format!("scenario 10-long-step ({}), seed {seed}, {n_jobs} jobs", size.as_str()));
    let openai = cluster.emulator.openai();
    let n = u32::try_from(n_jobs)?;
    openai.inject(OpenAiFault::fail_items([1]).times(n));
    openai.inject(OpenAiFault::delay(LATE).on(OpenAiCallKind::GetBatch).after_handling().times(n));
    openai.inject(OpenAiFault::delay(LATE).on(OpenAiCallKind::FileContent).after_handling().times(2 * n));
    start_daemons(&mut cluster, 2).await?;
    cluster.wait_ready(secs(30)).await?;
    let sampler = ScheduleSampler::start(cluster.conn.clone(), cluster.keys.clone());
    let collector = Collector::start(cluster.conn.clone(), cluster.keys.clone());
    let mix = Mix::OPENAI.with_items(2);
    let (batch, every) = size.pick((25, Duration::from_millis(500)), (12, Duration::ZERO));
    let produced =
        load::produce(cluster.conn.clone(), cluster.keys.clone(), load::ids("l", n_jobs), mix, batch, every).await;
    let drain_timeout = size.pick(secs(300), secs(120));
    drain(&mut cluster, &collector, produced.acked.len(), drain_timeout).await;
    // Stale writes are read once every reply the emulator delayed has left it (a taken-over step writes right after
    // its last reply), before the daemons stop. A take-over is also caught without any timing, from the call log.
    let last_reply = openai.calls().iter().map(reply_ms).max().unwrap_or(0);
    while unix_ms() < last_reply + 1_000 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut stale = 0;
    for index in cluster.live() {
        stale += stale_writes(&cluster, index).await?;
    }
    let scores = sampler.stop().await?;
    finish(&mut cluster, collector, &produced, drain_timeout, true, &mut outcome).await;
    outcome.figure("stale_writes", stale);
    outcome.expect(stale == 0, || format!("the daemons counted {stale} stale writes: a step was taken over"));

    let steps = last_steps(&openai.calls(), &openai.batches());
    let threshold = 2 * LEASE;
    let long: Vec<&Step> = steps.iter().filter(|step| step.delayed_calls == 3 && step.length() >= threshold).collect();
    let taken_over: Vec<String> = steps
        .iter()
        .filter(|step| step.intruders > 0)
        .map(|step| format!("{} ({} other calls during its last step)", step.job, step.intruders))
        .collect();
    let renewals: Vec<usize> =
        long.iter().map(|step| lease_extensions(scores.get(&format!("{}#0", step.job)), step)).collect();
    let not_renewed: Vec<&str> =
        long.iter().zip(&renewals).filter(|(_, n)| **n < 2).map(|(step, _)| step.job.as_str()).collect();
    let longest = long.iter().map(|step| step.length()).max();
    let shortest = long.iter().map(|step| step.length()).min();
    outcome.figure("last_steps_seen", steps.len());
    outcome.figure("steps_over_twice_the_lease", long.len());
    outcome.figure("longest_step_ms", longest.map(|d| d.as_millis() as u64));
    outcome.figure("shortest_long_step_ms", shortest.map(|d| d.as_millis() as u64));
    outcome.figure("steps_taken_over", taken_over.len());
    outcome.figure("lease_extensions_seen", renewals.iter().sum::<usize>());
    outcome.figure("fewest_lease_extensions_in_a_long_step", renewals.iter().min().copied());
    outcome.expect(long.len() * 2 >= n_jobs, || {
        format!(
            "only {} of {n_jobs} last steps lasted {} or more with their three requests slowed: the run does not \
             show what it claims",
            long.len(),
            human(threshold)
        )
    });
    outcome.expect(taken_over.is_empty(), || {
        format!("{} steps were taken over: {:?}", taken_over.len(), taken_over.iter().take(5).collect::<Vec<_>>())
    });
    outcome.expect(not_renewed.is_empty(), || {
        format!(
            "{} long steps whose lease was not seen renewed twice in the schedule: {:?}",
            not_renewed.len(),
            not_renewed.iter().take(5).collect::<Vec<_>>()
        )
    });
    outcome.notes.push(format!(
        "{} of {n_jobs} last poll steps lasted {}–{} (status + output file + error file, each answered {} late) under \
         a {} lease (request timeout {}); {} taken over; the chunk's lease was extended {}–{} times during each",
        long.len(),
        shortest.map_or("-".to_owned(), human),
        longest.map_or("-".to_owned(), human),
        human(LATE),
        human(LEASE),
        human(REQUEST_TIMEOUT),
        taken_over.len(),
        renewals.iter().min().copied().unwrap_or(0),
        renewals.iter().max().copied().unwrap_or(0),
    ));
    outcome.recovery = longest;
    outcome.recovery_what = format!("the longest step, renewed and not taken over (lease {})", human(LEASE));
    outcome.figure("seed", seed);
    outcome.wall = started.elapsed();
    Ok(outcome)
}

/// A chunk's last poll step, as the emulator saw it: its status request and the downloads of its result files.
#[derive(Debug, Clone)]
struct Step {
    /// The job.
    job: String,
    /// When the status request arrived, Unix ms.
    from_ms: u64,
    /// When the last download's reply left (its arrival plus its delay), Unix ms.
    to_ms: u64,
    /// Of the step's three requests, those the emulator answered late.
    delayed_calls: usize,
    /// Calls for the batch during the step that are not the step's own: another poll, another download.
    intruders: usize,
}

impl Step {
    fn length(&self) -> Duration {
        Duration::from_millis(self.to_ms.saturating_sub(self.from_ms))
    }
}

/// When the emulator sent a call's reply: its arrival plus the delay a fault gave it (the call log holds the
/// arrival of a call delayed after handling).
fn reply_ms(call: &OpenAiCallRecord) -> u64 {
    let late = call.fault.as_deref().is_some_and(|fault| fault.contains("delay"));
    call.at_ms + if late { LATE.as_millis() as u64 } else { 0 }
}

/// The last poll step of every batch: its last status request before its last download (an earlier step may have
/// failed, a request timing out, and been retried by the same daemon), through the step's downloads' replies; and
/// every other call for the batch in that time.
fn last_steps(calls: &[OpenAiCallRecord], batches: &[serde_json::Value]) -> Vec<Step> {
    let mut steps = Vec::new();
    for batch in batches {
        let (Some(id), Some(job)) = (batch["id"].as_str(), batch["metadata"]["batchd_job"].as_str()) else { continue };
        let files: Vec<&str> =
            ["output_file_id", "error_file_id"].iter().filter_map(|key| batch[*key].as_str()).collect();
        let downloads: Vec<&OpenAiCallRecord> = calls
            .iter()
            .filter(|call| call.kind == OpenAiCallKind::FileContent)
            .filter(|call| call.file_id.as_deref().is_some_and(|file| files.contains(&file)))
            .collect();
        let polls: Vec<&OpenAiCallRecord> = calls
            .iter()
            .filter(|call| call.kind == OpenAiCallKind::GetBatch && call.batch_id.as_deref() == Some(id))
            .collect();
        let Some(last_download) = downloads.iter().map(|call| call.at_ms).max() else { continue };
        let Some(status) = polls.iter().filter(|call| call.at_ms <= last_download).max_by_key(|call| call.seq) else {
            continue;
        };
        let own = |call: &&OpenAiCallRecord| call.port == status.port && call.kind == OpenAiCallKind::FileContent;
        let step_downloads: Vec<&OpenAiCallRecord> =
            downloads.iter().copied().filter(|call| own(call) && call.at_ms >= status.at_ms).take(2).collect();
        let to_ms = step_downloads.iter().map(|call| reply_ms(call)).max().unwrap_or(status.at_ms);
        let delayed = |call: &OpenAiCallRecord| call.fault.as_deref().is_some_and(|fault| fault.contains("delay"));
        let delayed_calls = usize::from(delayed(status)) + step_downloads.iter().filter(|call| delayed(call)).count();
        let intruders = polls
            .iter()
            .chain(downloads.iter())
            .filter(|call| call.seq != status.seq && !step_downloads.iter().any(|own| own.seq == call.seq))
            .filter(|call| call.at_ms > status.at_ms && call.at_ms < to_ms)
            .count();
        steps.push(Step { job: job.to_owned(), from_ms: status.at_ms, to_ms, delayed_calls, intruders });
    }
    steps
}

/// How many times a chunk's lease end moved forward while it was claimed during `step` (a claim's score lies a
/// lease ahead of the time it was seen; a due poll's lies at most a poll interval ahead).
fn lease_extensions(scores: Option<&Vec<(u64, u64)>>, step: &Step) -> usize {
    let claimed = |(seen_ms, score): (u64, u64)| score > seen_ms + 3_000;
    scores
        .map(|scores| {
            scores
                .windows(2)
                .filter(|pair| pair[1].0 >= step.from_ms && pair[1].0 <= step.to_ms + 1_000)
                .filter(|pair| claimed(pair[0]) && claimed(pair[1]) && pair[1].1 > pair[0].1)
                .count()
        })
        .unwrap_or(0)
}

/// Reads the schedule (`ZRANGE {ns}:schedule 0 -1 WITHSCORES`, a few hundred members at most here) every 250 ms
/// and keeps, per member, each score it took with when it was first seen.
struct ScheduleSampler {
    /// Stops it.
    stop: CancellationToken,
    /// The task: per member, `(Unix ms seen, score)` at each change.
    task: JoinHandle<redis::RedisResult<ScoreHistory>>,
}

/// Per schedule member, `(Unix ms seen, score)` at each change.
type ScoreHistory = HashMap<String, Vec<(u64, u64)>>;

impl ScheduleSampler {
    fn start(mut conn: ConnectionManager, keys: Keys) -> Self {
        let stop = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut seen: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
                while !stop.is_cancelled() {
                    let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
                        .arg(keys.schedule())
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query_async(&mut conn)
                        .await?;
                    let now = unix_ms();
                    for (member, score) in members {
                        let scores = seen.entry(member).or_default();
                        if scores.last().is_none_or(|(_, last)| *last != score as u64) {
                            scores.push((now, score as u64));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Ok(seen)
            })
        };
        Self { stop, task }
    }

    async fn stop(self) -> anyhow::Result<HashMap<String, Vec<(u64, u64)>>> {
        self.stop.cancel();
        Ok(self.task.await??)
    }
}
