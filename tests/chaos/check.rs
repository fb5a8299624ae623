//! How a chaos run is judged: the final drain and check over every job id, and the tracing of duplicate remote
//! submits to their cause. How long work abandoned by a killed daemon waits is measured in [`super::abandoned`].
//!
//! The check over all job ids: each has exactly one result entry, none is lost, nothing is left pending in the
//! ingress group (`XPENDING {ns}:submit batchd`), in the schedule (`ZCARD {ns}:schedule`) or in the submit
//! stream. A duplicate remote submit is a job for which an API (Workers AI, OpenAI or Anthropic: the emulator's
//! three call logs, read by [`super::remote`]) created more than one batch; a batch whose id did not make it into
//! the result is a leftover, and it is excused only with evidence: it was never polled (a polled id had been
//! recorded, so submitting again was a defect), and the evidence of [`super::excuse`] holds for its provider — at
//! Workers AI a kill, a freeze or a Redis outage inside the create's reply window; at OpenAI a batch more creates
//! deep than the look reads; at Anthropic a look, replayed on the emulator's state at that moment, that could not
//! have found it. It must also be counted in the job's ledger (`possible_duplicate_submits`). Anything else is a
//! failure; the excused count is reported per scenario, per provider and per kind of evidence.
//!
//! Over 500 lines because [`verify`] and its duplicate tracing are one pass: the checks for lost, duplicated and
//! left-over work and the tracing of each duplicate submit all read the same results map and call logs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use batchd_core::{JobId, Keys};
use redis::aio::ConnectionManager;

use super::Size;
use super::cluster::{Cluster, End};
use super::excuse::{
    CAUSE_AMBIGUOUS, CAUSE_HORIZON, CAUSE_KILL, CAUSE_ON_WIRE, Evidence, LOOK_CAUSES, MAX_AMBIGUOUS_PER_MILLE,
    ON_WIRE_MS, RECORD_MS, mark_started, var_or,
};
use super::load::{Collected, Collector, Produced, Provider};
use super::remote::{Created, RemoteLog};

/// The verdict and figures of one scenario.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Scenario name, e.g. `1-kill9`.
    pub scenario: String,
    /// What it does, in a few words.
    pub title: String,
    /// Full or short.
    pub size: Size,
    /// Jobs acknowledged by `XADD`.
    pub jobs: usize,
    /// kill -9 of daemons, kills or freezes of Redis.
    pub kills: usize,
    /// Processes started again (daemons after a kill or in a rolling restart, Redis after a kill).
    pub restarts: usize,
    /// Acknowledged jobs without a result entry after the drain.
    pub lost: Vec<String>,
    /// Jobs with more than one result entry (in the stream, or seen by the consumer).
    pub duplicated_results: Vec<String>,
    /// Remote batches created more than once for the same job (from the emulator's call log).
    pub duplicate_submits: usize,
    /// What excused them, by kind ([`super::excuse`]).
    pub duplicate_causes: BTreeMap<String, usize>,
    /// Kills that caused at least one (Workers AI) duplicate.
    pub kills_in_submit_window: usize,
    /// Sum of the ledgers' `possible_duplicate_submits` (resubmits batchd counted, including after ambiguous
    /// API answers that created nothing).
    pub counted_possible_duplicates: u64,
    /// The scenario's recovery time (what it measures is in `recovery_what`).
    pub recovery: Option<Duration>,
    /// What `recovery` measures.
    pub recovery_what: String,
    /// The whole scenario, start to verdict.
    pub wall: Duration,
    /// Further figures (drain time, throughput, readiness answers, ...).
    pub figures: serde_json::Map<String, serde_json::Value>,
    /// Observations worth reading.
    pub notes: Vec<String>,
    /// Every violated expectation, one sentence each; empty when the scenario passed.
    pub failures: Vec<String>,
    /// Daemon settings that differ from the defaults.
    pub settings: Vec<String>,
    /// The daemons' logs.
    pub log_dir: String,
    /// The same counts per provider the run's jobs went to.
    pub providers: BTreeMap<Provider, ProviderCounts>,
}

/// A scenario's figures for one provider.
#[derive(Debug, Clone, Default)]
pub struct ProviderCounts {
    /// Jobs acknowledged by `XADD` that went to it.
    pub jobs: usize,
    /// Of those, jobs without a result.
    pub lost: usize,
    /// Remote batches it created.
    pub batches: usize,
    /// Polls of its batches.
    pub polls: usize,
    /// Calls to it.
    pub calls: usize,
    /// Calls a random or injected fault shaped.
    pub faults: usize,
    /// Remote batches created more than once for the same job.
    pub duplicate_submits: usize,
    /// Of those, excused by evidence.
    pub excused: usize,
    /// The excused ones by kind of evidence (`excuse.rs`).
    pub excused_by: BTreeMap<String, usize>,
    /// Creates whose reply a kill -9 of their process cut (held for an aimed kill, not yet sent, or on the wire).
    pub interrupted_by_kill: usize,
    /// Creates whose reply their daemon never got: lost by the API (an injected fault) or cut by a kill.
    pub uncertain_creates: usize,
    /// Of those, the ones a look found: their batch is the one in the job's result.
    pub uncertain_found: usize,
    /// Answered list calls (the pages the looks for uncertain creates read; OpenAI and Anthropic).
    pub list_calls: usize,
}

impl ProviderCounts {
    /// Polls per remote batch.
    pub fn polls_per_batch(&self) -> f64 {
        if self.batches == 0 { 0.0 } else { self.polls as f64 / self.batches as f64 }
    }

    /// As JSON, for `report.json`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "jobs": self.jobs,
            "lost": self.lost,
            "batches": self.batches,
            "polls": self.polls,
            "polls_per_batch": (self.polls_per_batch() * 100.0).round() / 100.0,
            "calls": self.calls,
            "faults": self.faults,
            "duplicate_submits": self.duplicate_submits,
            "excused_duplicate_submits": self.excused,
            "excused_by_kind": self.excused_by,
            "creates_interrupted_by_a_kill": self.interrupted_by_kill,
            "uncertain_creates": self.uncertain_creates,
            "uncertain_creates_found_by_a_look": self.uncertain_found,
            "look_list_calls": self.list_calls,
        })
    }
}

impl Outcome {
    /// An empty outcome for `scenario`.
    pub fn new(scenario: &str, title: &str, size: Size) -> Self {
        Self {
            scenario: scenario.to_owned(),
            title: title.to_owned(),
            size,
            jobs: 0,
            kills: 0,
            restarts: 0,
            lost: Vec::new(),
            duplicated_results: Vec::new(),
            duplicate_submits: 0,
            duplicate_causes: BTreeMap::new(),
            kills_in_submit_window: 0,
            counted_possible_duplicates: 0,
            recovery: None,
            recovery_what: String::new(),
            wall: Duration::ZERO,
            figures: serde_json::Map::new(),
            notes: Vec::new(),
            failures: Vec::new(),
            settings: Vec::new(),
            log_dir: String::new(),
            providers: BTreeMap::new(),
        }
    }

    /// Whether every expectation held.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// Duplicate remote submits excused by a fault (a kill inside the submit window, a Redis outage longer than
    /// the lease); the others are failures.
    pub fn excused_duplicates(&self) -> usize {
        self.duplicate_causes.values().sum()
    }

    /// Duplicate remote submits excused because an Anthropic look, replayed on the emulator's state, could not
    /// have found the batch a create whose reply was lost had made (the API has no idempotency key and no
    /// metadata): the only ones a scenario that allows no duplicate accepts.
    pub fn duplicates_from_lost_replies(&self) -> usize {
        LOOK_CAUSES.iter().map(|cause| self.duplicate_causes.get(*cause).copied().unwrap_or(0)).sum()
    }

    /// Duplicate remote submits batchd could have avoided: all but [`Outcome::duplicates_from_lost_replies`].
    pub fn avoidable_duplicates(&self) -> usize {
        self.duplicate_submits.saturating_sub(self.duplicates_from_lost_replies())
    }

    /// Records a failure unless `ok`.
    pub fn expect(&mut self, ok: bool, failure: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(failure());
        }
    }

    /// Adds a figure.
    pub fn figure(&mut self, name: &str, value: impl Into<serde_json::Value>) {
        self.figures.insert(name.to_owned(), value.into());
    }

    /// A multi-line summary for a failing test's message.
    pub fn explain(&self) -> String {
        let mut text = format!(
            "scenario {} ({}): {} jobs, {} lost, {} duplicated results, {} duplicate submits ({} excused: {:?}); logs \
             in {}\n",
            self.scenario,
            self.size.as_str(),
            self.jobs,
            self.lost.len(),
            self.duplicated_results.len(),
            self.duplicate_submits,
            self.excused_duplicates(),
            self.duplicate_causes,
            self.log_dir
        );
        for failure in &self.failures {
            text.push_str(&format!("  FAILED: {failure}\n"));
        }
        for note in &self.notes {
            text.push_str(&format!("  note: {note}\n"));
        }
        text
    }
}

/// Waits until the consumer has seen a result for `n` jobs, restarting daemons that died meanwhile; returns
/// how long it waited, or `None` after `timeout`.
pub async fn drain(cluster: &mut Cluster, collector: &Collector, n: usize, timeout: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let have = collector.distinct();
        if have >= n {
            return Some(started.elapsed());
        }
        if started.elapsed() > timeout {
            cluster.event(format!("drain timed out: {have} of {n} jobs have a result"));
            return None;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            cluster.event(format!("draining: {have} of {n} jobs have a result"));
            last_report = Instant::now();
        }
        if let Err(error) = cluster.supervise().await {
            cluster.event(format!("supervise: {error:#}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One result entry, as far as the check needs it.
#[derive(Debug, Clone)]
struct ResultSeen {
    /// `status`.
    status: String,
    /// `request_ids`.
    request_ids: Vec<String>,
}

/// Every entry of the results stream, by job id (read in pages, so 100,000 entries are fine).
async fn read_results(
    conn: &mut ConnectionManager,
    keys: &Keys,
) -> redis::RedisResult<HashMap<String, Vec<ResultSeen>>> {
    let mut results: HashMap<String, Vec<ResultSeen>> = HashMap::new();
    let mut start = "-".to_owned();
    loop {
        let page: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
            .arg(keys.results())
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(10_000)
            .query_async(conn)
            .await?;
        let Some((last, _)) = page.last() else { break };
        start = format!("({last}");
        let full = page.len() < 10_000;
        for (_, fields) in page {
            let job_id = fields.get("job_id").cloned().unwrap_or_default();
            let request_ids = fields
                .get("request_ids")
                .and_then(|text| serde_json::from_str::<Vec<String>>(text).ok())
                .unwrap_or_default();
            let status = fields.get("status").cloned().unwrap_or_default();
            results.entry(job_id).or_default().push(ResultSeen { status, request_ids });
        }
        if full {
            break;
        }
    }
    Ok(results)
}

/// `(XPENDING count, ZCARD schedule, XLEN submit)`.
pub async fn leftovers(conn: &mut ConnectionManager, keys: &Keys) -> redis::RedisResult<(u64, u64, u64)> {
    let pending = crate::ingress_pending(conn, keys).await?;
    let scheduled: u64 = redis::cmd("ZCARD").arg(keys.schedule()).query_async(conn).await?;
    let waiting: u64 = redis::cmd("XLEN").arg(keys.submit()).query_async(conn).await?;
    Ok((pending, scheduled, waiting))
}

/// The ledger field `possible_duplicate_submits` of each job (0 when absent).
async fn counted_duplicates(
    conn: &mut ConnectionManager,
    keys: &Keys,
    ids: &[String],
) -> redis::RedisResult<HashMap<String, u64>> {
    let mut counted = HashMap::new();
    for chunk in ids.chunks(1000) {
        let mut pipe = redis::pipe();
        for id in chunk {
            let key = JobId::parse(id).map(|id| keys.job(&id)).unwrap_or_default();
            pipe.cmd("HGET").arg(key).arg("possible_duplicate_submits");
        }
        let values: Vec<Option<u64>> = pipe.query_async(conn).await?;
        counted.extend(chunk.iter().cloned().zip(values.into_iter().map(Option::unwrap_or_default)));
    }
    Ok(counted)
}

/// A job's ledger in one line, for failure messages.
pub async fn ledger_line(conn: &mut ConnectionManager, keys: &Keys, id: &str) -> String {
    let Ok(job_id) = JobId::parse(id) else { return format!("{id}: not a job id") };
    let ledger: redis::RedisResult<HashMap<String, String>> =
        redis::cmd("HGETALL").arg(keys.job(&job_id)).query_async(conn).await;
    let score: redis::RedisResult<Option<f64>> =
        redis::cmd("ZSCORE").arg(keys.schedule()).arg(format!("{id}#0")).query_async(conn).await;
    match ledger {
        Ok(ledger) if ledger.is_empty() => format!("{id}: no ledger; schedule score {score:?}"),
        Ok(ledger) => {
            let mut fields: Vec<String> = ledger
                .into_iter()
                .filter(|(key, _)| !key.ends_with(":requests") && !key.ends_with(":output"))
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            fields.sort();
            format!("{id}: {}; schedule score {score:?}", fields.join(" "))
        }
        Err(error) => format!("{id}: {error}"),
    }
}

/// The final check over every acknowledged job id (see the module docs). `no_duplicate_submits` makes any
/// duplicate remote submit a failure (graceful restarts).
pub async fn verify(
    cluster: &mut Cluster,
    produced: &Produced,
    collected: &Collected,
    no_duplicate_submits: bool,
    outcome: &mut Outcome,
) {
    let mut conn = cluster.conn.clone();
    let keys = cluster.keys.clone();
    let mut ids: Vec<String> = produced.acked.keys().cloned().collect();
    ids.sort();
    outcome.jobs = ids.len();
    outcome.kills = cluster.kills;
    outcome.restarts = cluster.restarts;

    // Results, from the stream itself.
    let results = match read_results(&mut conn, &keys).await {
        Ok(results) => results,
        Err(error) => {
            outcome.failures.push(format!("cannot read the results stream: {error}"));
            return;
        }
    };
    let acked: HashSet<&str> = ids.iter().map(String::as_str).collect();
    outcome.lost = ids.iter().filter(|id| !results.contains_key(*id)).cloned().collect();
    let mut duplicated: Vec<String> = results
        .iter()
        .filter(|(_, entries)| entries.len() > 1)
        .map(|(id, _)| id.clone())
        .chain(collected.seen.iter().filter(|(_, n)| **n > 1).map(|(id, _)| id.clone()))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    duplicated.sort();
    outcome.duplicated_results = duplicated;
    let strangers: Vec<&String> =
        results.keys().filter(|id| !acked.contains(id.as_str()) && !produced.hostile.contains(id.as_str())).collect();
    outcome.expect(strangers.is_empty(), || {
        format!(
            "{} results for jobs never enqueued: {:?}",
            strangers.len(),
            strangers.iter().take(5).collect::<Vec<_>>()
        )
    });
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for entries in results.values() {
        for entry in entries {
            *statuses.entry(entry.status.clone()).or_default() += 1;
        }
    }
    outcome.figure("result_statuses", serde_json::json!(statuses));
    let not_completed: Vec<String> = results
        .iter()
        .filter(|(id, _)| !produced.hostile.contains(id.as_str()))
        .filter(|(_, entries)| entries.iter().any(|entry| entry.status != "completed"))
        .map(|(id, _)| id.clone())
        .collect();
    if !outcome.lost.is_empty() {
        let mut evidence = Vec::new();
        for id in outcome.lost.iter().take(10) {
            evidence.push(ledger_line(&mut conn, &keys, id).await);
        }
        let acked_at: Vec<u64> = outcome.lost.iter().filter_map(|id| produced.acked.get(id).copied()).collect();
        outcome.failures.push(format!(
            "{} jobs acknowledged by XADD have no result (first ledgers: {}; acknowledged at Unix ms {:?})",
            outcome.lost.len(),
            evidence.join(" | "),
            acked_at.iter().take(10).collect::<Vec<_>>()
        ));
    }
    if !outcome.duplicated_results.is_empty() {
        let failure = format!(
            "{} jobs have more than one result entry: {:?}",
            outcome.duplicated_results.len(),
            outcome.duplicated_results.iter().take(10).collect::<Vec<_>>()
        );
        outcome.failures.push(failure);
    }
    if !not_completed.is_empty() {
        let mut evidence = Vec::new();
        for id in not_completed.iter().take(5) {
            evidence.push(ledger_line(&mut conn, &keys, id).await);
        }
        outcome.failures.push(format!(
            "{} jobs ended other than completed ({statuses:?}); transient faults must be retried, not fail a job: {}",
            not_completed.len(),
            evidence.join(" | ")
        ));
    }

    // Nothing left behind.
    let mut left = (u64::MAX, u64::MAX, u64::MAX);
    let mut last_error = None;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(15) {
        match leftovers(&mut conn, &keys).await {
            Ok(found) => {
                (left, last_error) = (found, None);
                if found == (0, 0, 0) {
                    break;
                }
            }
            Err(error) => last_error = Some(error),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if let Some(error) = last_error {
        outcome.failures.push(format!("cannot read what is left in the ingress group and the schedule: {error}"));
    }
    outcome.figure("left_pending_ingress", left.0);
    outcome.figure("left_scheduled", left.1);
    outcome.figure("left_in_submit_stream", left.2);
    outcome.expect(left.0 == 0, || format!("{} entries still pending in the ingress group (XPENDING)", left.0));
    outcome.expect(left.1 == 0, || format!("{} members still in the schedule (ZCARD)", left.1));
    outcome.expect(left.2 == 0, || format!("{} entries still in the submit stream (XLEN)", left.2));

    // Duplicate remote submits, from the emulator's call logs of all three APIs.
    judge_remote_work(cluster, &mut conn, &keys, produced, &results, &ids, no_duplicate_submits, outcome).await;

    for exit in cluster.unexpected_exits() {
        outcome.failures.push(exit);
    }
    outcome.settings = cluster.settings_summary();
    outcome.log_dir = cluster.log_dir().display().to_string();
}

/// Whether `created` is in its job's result (the batch whose results the job carries): for a pack's batch, in its
/// members' results (each member's entry names the pack's batch).
fn in_result(results: &HashMap<String, Vec<ResultSeen>>, log: &RemoteLog, created: &Created) -> bool {
    log.jobs_of(&created.job).iter().any(|job| {
        results.get(*job).is_some_and(|entries| entries.iter().any(|entry| entry.request_ids.contains(&created.batch)))
    })
}

/// The start of every Anthropic create mark of the jobs submitted more than once, from their chunks' ledgers
/// (`c<i>:remote`): what a look's window and its reading order are measured from.
async fn anthropic_mark_starts(
    conn: &mut ConnectionManager,
    keys: &Keys,
    by_job: &BTreeMap<&str, Vec<&Created>>,
) -> HashMap<String, u64> {
    let mut starts = HashMap::new();
    for (job, creates) in by_job {
        if creates.len() < 2 || creates[0].provider != Provider::Anthropic {
            continue;
        }
        let Ok(id) = JobId::parse(job) else { continue };
        let chunks: BTreeSet<&str> =
            creates.iter().filter_map(|created| created.mark.as_deref()?.rsplit('-').next()).collect();
        for chunk in chunks {
            let remote: redis::RedisResult<Option<String>> =
                redis::cmd("HGET").arg(keys.job(&id)).arg(format!("c{chunk}:remote")).query_async(conn).await;
            if let Ok(Some(remote)) = remote
                && let Some((mark, started)) = mark_started(&remote)
            {
                starts.insert(mark, started);
            }
        }
    }
    starts
}

/// One create in a line, for failure messages: `msgbatch_... at 1764... by daemon #3 (port 4242), 200, hold`.
fn describe(created: &Created, evidence: &Evidence<'_>) -> String {
    let daemon = evidence.incarnation(created.port).map_or("?".to_owned(), |(index, end)| match end {
        Some(End::Killed { at_ms }) => format!("#{index}, killed at {at_ms}"),
        Some(End::Stopped { at_ms, .. }) => format!("#{index}, stopped at {at_ms}"),
        Some(End::Died { at_ms, .. }) => format!("#{index}, died at {at_ms}"),
        None => format!("#{index}"),
    });
    format!(
        "{} at {} by daemon {daemon} (port {}){}{}",
        created.batch,
        created.at_ms,
        created.port,
        if created.reply_lost { ", reply lost" } else { "" },
        created.fault.as_deref().map(|fault| format!(", fault {fault}")).unwrap_or_default()
    )
}

/// The duplicate-submit part of [`verify`]: every remote batch of every provider traced to its job and, when it is a
/// leftover, to the fault that excuses it ([`Evidence`]); per-provider figures in `outcome.providers`.
#[allow(clippy::too_many_arguments)]
async fn judge_remote_work(
    cluster: &mut Cluster,
    conn: &mut ConnectionManager,
    keys: &Keys,
    produced: &Produced,
    results: &HashMap<String, Vec<ResultSeen>>,
    ids: &[String],
    no_duplicate_submits: bool,
    outcome: &mut Outcome,
) {
    let injected = cluster.stop_provider_faults().await;
    if !injected.is_empty() {
        outcome.figure("provider_faults_injected", serde_json::json!(injected));
    }
    let mut log = RemoteLog::read(&cluster.emulator, ids.iter().chain(produced.hostile.iter()));
    if let Err(error) = log.attribute_packs(conn, keys, ids).await {
        outcome.failures.push(format!("cannot read which pack served each job: {error}"));
    }
    outcome
        .figure("packs_created", log.created.iter().filter(|created| log.members.contains_key(&created.job)).count());
    if let Err(error) = RemoteLog::save(&cluster.emulator, cluster.log_dir()) {
        outcome.notes.push(format!("could not save the call logs in {}: {error}", cluster.log_dir().display()));
    }
    outcome.figure("api_calls", log.calls.values().sum::<usize>());
    outcome.figure("api_submits_accepted", log.created.len());
    outcome.figure("api_polls", Provider::ALL.iter().map(|provider| log.polls(*provider)).sum::<usize>());
    outcome.figure("api_faults", log.faulted.values().sum::<usize>());
    outcome.figure("openai_files_left", log.openai_files_left);
    for provider in Provider::ALL {
        let (counted, logged) = (log.batches_counted.get(&provider).copied().unwrap_or(0), log.creates(provider));
        outcome.expect(counted == logged, || {
            format!("the {} emulator created {counted} batches but logged {logged} creates", provider.as_str())
        });
    }
    // Every batch is for jobs the producer enqueued: never for a hostile entry, never for no job at all.
    let strays: Vec<String> = log
        .created
        .iter()
        .filter(|created| log.jobs_of(&created.job).iter().any(|job| !produced.acked.contains_key(*job)))
        .map(|created| format!("{} batch {} for job {:?}", created.provider.as_str(), created.batch, created.job))
        .collect();
    outcome.expect(strays.is_empty(), || {
        format!("{} remote batches for no enqueued job: {:?}", strays.len(), strays.iter().take(5).collect::<Vec<_>>())
    });
    // Creates grouped by their unit's part: a part created twice is a duplicate; a split batch's parts are not.
    let mut by_job: BTreeMap<&str, Vec<&Created>> = BTreeMap::new();
    let mut by_part: BTreeMap<(&str, &str), Vec<&Created>> = BTreeMap::new();
    for created in &log.created {
        by_job.entry(created.job.as_str()).or_default().push(created);
        by_part.entry((created.job.as_str(), created.part.as_str())).or_default().push(created);
    }
    for creates in by_part.values_mut() {
        creates.sort_by_key(|created| (created.at_ms, created.seq));
    }
    for creates in by_job.values_mut() {
        creates.sort_by_key(|created| (created.at_ms, created.seq));
    }
    outcome.figure("units_submitted", by_job.keys().filter(|unit| !unit.is_empty()).count());
    let never_submitted: Vec<&String> =
        ids.iter().filter(|id| results.contains_key(*id) && !by_job.contains_key(log.unit_of(id))).collect();
    outcome.expect(never_submitted.is_empty(), || {
        format!(
            "{} jobs have a result but were never submitted: {:?}",
            never_submitted.len(),
            never_submitted.iter().take(5).collect::<Vec<_>>()
        )
    });
    let units: Vec<String> = ids.iter().cloned().chain(log.members.keys().cloned()).collect();
    let counted = match counted_duplicates(conn, keys, &units).await {
        Ok(counted) => counted,
        Err(error) => {
            outcome.failures.push(format!("cannot read the ledgers: {error}"));
            HashMap::new()
        }
    };
    outcome.counted_possible_duplicates = counted.values().sum();
    // Every batch a daemon polled had its id recorded first, so a polled leftover is "recorded, then submitted
    // again anyway", never an interrupted create.
    let polled = log.polled();
    let evidence = Evidence::of(cluster, &log).with_mark_starts(anthropic_mark_starts(conn, keys, &by_job).await);
    // An OpenAI look reads the newest `openai.lookup_pages` pages of 100 batches: a batch that many creates deep
    // when its chunk looked again is out of its reach (the creates are in log order).
    let horizon = var_or(cluster, "BATCHD__OPENAI__LOOKUP_PAGES", 10) as usize * 100;
    let openai_creates: Vec<u64> = log
        .created
        .iter()
        .filter(|created| created.provider == Provider::OpenAi)
        .map(|created| created.at_ms)
        .collect();
    let creates_between =
        |from_ms: u64, to_ms: u64| openai_creates.iter().filter(|at| **at > from_ms && **at < to_ms).count();
    outcome.figure("excuse_record_ms", RECORD_MS);
    outcome.figure("excuse_on_wire_ms", ON_WIRE_MS);
    let mut per_provider: BTreeMap<Provider, ProviderCounts> = BTreeMap::new();
    for provider in produced.mix.providers() {
        let counts = per_provider.entry(*provider).or_default();
        counts.jobs = ids.iter().filter(|id| produced.provider_of(id) == *provider).count();
        counts.lost = outcome.lost.iter().filter(|id| produced.provider_of(id) == *provider).count();
        counts.batches = log.creates(*provider);
        counts.polls = log.polls(*provider);
        counts.calls = log.calls.get(provider).copied().unwrap_or(0);
        counts.faults = log.faulted.get(provider).copied().unwrap_or(0);
        counts.list_calls =
            log.lists.iter().filter(|list| list.provider == *provider && list.http_status == 200).count();
    }
    // Creates whose reply their daemon never got (lost by the API, held for a kill, cut by a kill), and of those,
    // the ones a look found: their batch is the one in the job's result.
    for created in &log.created {
        let interrupted = evidence.interrupted_by_kill(created);
        let counts = per_provider.entry(created.provider).or_default();
        counts.interrupted_by_kill += usize::from(interrupted);
        if interrupted || created.reply_lost {
            counts.uncertain_creates += 1;
            counts.uncertain_found += usize::from(in_result(results, &log, created));
        }
    }
    let mut kills_hit: HashSet<usize> = HashSet::new();
    let mut attributed_kills: Vec<usize> = Vec::new();
    let mut unexplained = Vec::new();
    for ((job, _), job_creates) in &by_part {
        if job_creates.len() < 2 || job.is_empty() {
            continue;
        }
        let provider = job_creates[0].provider;
        let extra = job_creates.len() - 1;
        outcome.duplicate_submits += extra;
        per_provider.entry(provider).or_default().duplicate_submits += extra;
        let orphans: Vec<&&Created> = job_creates.iter().filter(|created| !in_result(results, &log, created)).collect();
        let mut job_kills = HashSet::new();
        for orphan in &orphans {
            let cause: Result<&'static str, String> = if polled.contains(orphan.batch.as_str()) {
                Err("it was polled, so its id had been recorded".to_owned())
            } else {
                match provider {
                    Provider::Cloudflare => evidence
                        .excuse_workers_ai(orphan, &mut job_kills)
                        .ok_or_else(|| "no kill, freeze or Redis outage inside its window".to_owned()),
                    // Its chunk's next create came after more OpenAI batches than the look reads: the look could not
                    // see it.
                    Provider::OpenAi => job_creates
                        .iter()
                        .filter(|next| next.at_ms > orphan.at_ms)
                        .map(|next| next.at_ms)
                        .min()
                        .filter(|next_ms| creates_between(orphan.at_ms, *next_ms) >= horizon)
                        .map(|_| CAUSE_HORIZON)
                        .ok_or_else(|| "the next create's look by metadata was within reach".to_owned()),
                    Provider::Anthropic => {
                        let position = job_creates.iter().position(|created| created.batch == orphan.batch);
                        match position.and_then(|position| job_creates.get(position + 1)) {
                            Some(next) => {
                                let verdict = evidence.replay(orphan, next);
                                verdict.cause().ok_or_else(|| {
                                    format!(
                                        "the look before the next create ({}) could have found it: {verdict:?}",
                                        describe(next, &evidence)
                                    )
                                })
                            }
                            // The last create is the leftover: an earlier one's batch was adopted after it. It
                            // is excused as that earlier batch's re-create: the look before it could not have
                            // found the earlier batch.
                            None => match position.and_then(|position| position.checked_sub(1)) {
                                Some(previous) => {
                                    let verdict = evidence.replay(job_creates[previous], orphan);
                                    verdict.cause().ok_or_else(|| {
                                        format!(
                                            "created after the batch its job recorded, whose look could have \
                                             found it: {verdict:?}"
                                        )
                                    })
                                }
                                None => Err("created after the batch its job recorded".to_owned()),
                            },
                        }
                    }
                }
            };
            match cause {
                Ok(cause) => {
                    if matches!(cause, CAUSE_KILL | CAUSE_ON_WIRE)
                        && let Some((index, _)) = evidence.incarnation(orphan.port)
                    {
                        kills_hit.insert(*index);
                        attributed_kills.push(*index);
                    }
                    *outcome.duplicate_causes.entry(cause.to_owned()).or_default() += 1;
                    let counts = per_provider.entry(provider).or_default();
                    counts.excused += 1;
                    *counts.excused_by.entry(cause.to_owned()).or_default() += 1;
                }
                Err(why) => unexplained.push(format!(
                    "{job}: {} batch {} not excused: {why}; the job's creates: [{}]",
                    provider.as_str(),
                    describe(orphan, &evidence),
                    job_creates.iter().map(|created| describe(created, &evidence)).collect::<Vec<_>>().join("; ")
                )),
            }
        }
        if orphans.len() != extra {
            unexplained.push(format!("{job}: {} creates, {} not in its result", job_creates.len(), orphans.len()));
        }
        let in_ledger = counted.get(*job).copied().unwrap_or(0);
        outcome.expect(in_ledger >= extra as u64, || {
            format!(
                "{job} was submitted {} times but its ledger counts {in_ledger} possible duplicates",
                job_creates.len()
            )
        });
    }
    // The looks that could not tell candidates apart are counted apart, and bounded.
    if let Some(counts) = per_provider.get(&Provider::Anthropic) {
        let ambiguous = counts.excused_by.get(CAUSE_AMBIGUOUS).copied().unwrap_or(0);
        let allowed = (counts.jobs * MAX_AMBIGUOUS_PER_MILLE).div_ceil(1000);
        outcome.figure("anthropic_ambiguous_looks_allowed", allowed);
        outcome.expect(ambiguous <= allowed, || {
            format!(
                "{ambiguous} Anthropic duplicates from looks with more ended candidates than they read, over the \
                 {allowed} allowed ({MAX_AMBIGUOUS_PER_MILLE} per mille of {} Anthropic jobs)",
                counts.jobs
            )
        });
    }
    outcome.kills_in_submit_window = kills_hit.len();
    let mut per_kill: HashMap<usize, usize> = HashMap::new();
    for index in attributed_kills {
        *per_kill.entry(index).or_default() += 1;
    }
    let most = per_kill.values().copied().max().unwrap_or(0);
    outcome.figure("most_duplicate_submits_from_one_kill", most);
    // One kill interrupts at most the submits that replica had in flight: one per submit worker slot and one per
    // schedule worker slot (a retried submit runs there).
    let in_flight_bound = (var_or(cluster, "BATCHD__WORKERS__SUBMIT_CONCURRENCY", 16)
        + var_or(cluster, "BATCHD__WORKERS__POLL_CONCURRENCY", 64)) as usize;
    outcome.expect(most <= in_flight_bound, || {
        format!("one kill caused {most} duplicate submits, more than the {in_flight_bound} submits a replica can have in flight")
    });
    if !unexplained.is_empty() {
        // Workers AI and OpenAI cases first: fewer, and each a different story from the Anthropic looks.
        unexplained.sort_by_key(|line| line.contains(": anthropic batch"));
        let mut evidence = Vec::new();
        for line in unexplained.iter().take(5) {
            let job = line.split(':').next().unwrap_or_default();
            evidence.push(ledger_line(conn, keys, job).await);
        }
        outcome.failures.push(format!(
            "{} duplicate remote submits without the evidence of an excuse ({}): {} (ledgers: {})",
            unexplained.len(),
            Provider::ALL
                .iter()
                .map(|provider| format!(
                    "{} {}",
                    unexplained.iter().filter(|line| line.contains(&format!(": {} batch", provider.as_str()))).count(),
                    provider.as_str()
                ))
                .collect::<Vec<_>>()
                .join(", "),
            unexplained.iter().take(5).cloned().collect::<Vec<_>>().join(" || "),
            evidence.join(" | ")
        ));
    }
    if no_duplicate_submits {
        // None allowed but those an Anthropic look provably could not find.
        let duplicates = outcome.avoidable_duplicates();
        outcome.expect(duplicates == 0, || format!("{duplicates} duplicate remote submits where none are allowed"));
    }
    outcome.figure(
        "providers",
        serde_json::Value::Object(
            per_provider.iter().map(|(provider, counts)| (provider.as_str().to_owned(), counts.json())).collect(),
        ),
    );
    outcome.providers = per_provider;
}
