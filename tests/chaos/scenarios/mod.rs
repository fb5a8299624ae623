//! The scenarios of issue 6 (and 7 and 8, from issues 12 and 11), each in a full ([`Size::Full`], `make chaos`) and a short ([`Size::Short`],
//! `make test`) version. Each one starts its own Redis, emulator and daemons, applies its faults under load,
//! drains, and hands the run to [`verify`].
//!
//! The scenarios are grouped by fault type: `process_faults.rs` (kill -9, rolling SIGTERM), `redis_faults.rs`
//! (AOF restart, unreachable, a blip while recording), `load_and_input.rs` (backlog, clock skew, hostile and
//! oversize entries), `freeze.rs` (a replica frozen past its lease, fenced out when it resumes) and `long_step.rs`
//! (a step twice as long as the lease, renewed, not taken over) and `upgrade.rs` (a rolling upgrade from the
//! previous release). This module holds what they share: the names,
//! [`run`], [`Dice`], the timing and the ending.
//!
//! Every scenario but the findings' reproductions sends a third of its jobs to each provider (Workers AI, OpenAI,
//! Anthropic), through daemons with all three configured against the emulator.
//!
//! Daemon settings are chosen for the emulator's batch durations: polls every 1–4 s for batches of 1–20 s,
//! a 20 s schedule lease above a 10 s API timeout, ingress entries reclaimed after 10 s idle (the defaults, 60 s
//! and 120 s, are for production; the recovery bounds scale with them, see `docs/reliability.md`).

mod freeze;
mod load_and_input;
mod long_step;
mod process_faults;
mod redis_faults;
mod upgrade;

use std::time::{Duration, Instant};

use batchd_emulator::{AnthropicConfig, DurationRange, EmulatorConfig, OpenAiConfig, OpenAiTiming, RandomFaults};

use self::freeze::freeze;
use self::load_and_input::{backlog, clock_skew, hostile_entries, oversize_entry_peak_rss};
use self::long_step::long_step;
use self::process_faults::{kill9, rolling_sigterm};
use self::redis_faults::{Outage, redis_aof_restart, redis_blip_while_recording, redis_unreachable};
use self::upgrade::rolling_upgrade;
use super::check::{Outcome, drain, verify};
use super::cluster::Cluster;
use super::load::{Collected, Collector, Produced};
use super::{Size, human, unix_ms};
use crate::small_embeddings;

/// Every scenario, in order.
pub const ALL: [&str; 11] = [
    "1-kill9",
    "2-redis-aof-restart",
    "3a-redis-sigstop",
    "3b-redis-down",
    "4-rolling-sigterm",
    "5-backlog",
    "7-clock-skew",
    "8-hostile-entries",
    "9-freeze",
    "10-long-step",
    "11-upgrade",
];

/// Redis with an append-only file fsynced every second.
const AOF: [&str; 6] = ["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""];
/// Redis without persistence.
const NO_PERSISTENCE: [&str; 4] = ["--appendonly", "no", "--save", ""];

/// Reproductions of problems the scenarios found, run by `make chaos` after the scenarios; each fails until its
/// problem is fixed, and then stays as a regression (f1 is fixed, and `make test` runs it too).
pub const FINDINGS: [&str; 2] = ["f1-redis-blip-while-recording", "f2-oversize-entry-peak-rss"];

/// Runs one scenario (or finding) by name. The daemons' logs are kept under `target/chaos/logs/`, except those
/// of a short run that passed (`make test` runs the short ones every time).
pub async fn run(name: &str, size: Size) -> anyhow::Result<Outcome> {
    let outcome = match name {
        "f1-redis-blip-while-recording" => redis_blip_while_recording().await,
        "f2-oversize-entry-peak-rss" => oversize_entry_peak_rss().await,
        "1-kill9" => kill9(size).await,
        "2-redis-aof-restart" => redis_aof_restart(size).await,
        "3a-redis-sigstop" => redis_unreachable(size, Outage::Freeze).await,
        "3b-redis-down" => redis_unreachable(size, Outage::Down).await,
        "4-rolling-sigterm" => rolling_sigterm(size).await,
        "5-backlog" => backlog(size).await,
        "7-clock-skew" => clock_skew(size).await,
        "8-hostile-entries" => hostile_entries(size).await,
        "9-freeze" => freeze(size).await,
        "10-long-step" => long_step(size).await,
        "11-upgrade" => rolling_upgrade(size).await,
        other => anyhow::bail!("no scenario {other:?}; the scenarios are {ALL:?} and {FINDINGS:?}"),
    }?;
    if outcome.size == Size::Short && outcome.passed() && !outcome.log_dir.is_empty() {
        let _ = std::fs::remove_dir_all(&outcome.log_dir);
    }
    Ok(outcome)
}

/// A small deterministic random source (splitmix64), so a run's fault schedule can be replayed by seed.
#[derive(Debug, Clone)]
pub struct Dice(u64);

impl Dice {
    /// A source seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration drawn uniformly from `[low, high]`.
    pub fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = high.saturating_sub(low).as_millis() as u64;
        low + Duration::from_millis(if span == 0 { 0 } else { self.next_u64() % (span + 1) })
    }

    /// An index below `n`.
    pub fn index(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// The seed of a short run (`make test`) when `CHAOS_SEED` is not set: the same fault schedule and batch durations
/// every time, so the test's verdict does not change with the clock.
pub const SHORT_SEED: u64 = 37;

/// The seed of a run: `CHAOS_SEED` when set (a value that is not a number fails the run rather than being
/// ignored); otherwise [`SHORT_SEED`] for a short run and one from the clock for a full one (`make chaos`).
/// Printed either way, so any run can be replayed.
pub fn seed(size: Size) -> u64 {
    let seed = match std::env::var("CHAOS_SEED") {
        Ok(value) => value.trim().parse().unwrap_or_else(|_| panic!("CHAOS_SEED={value:?} is not a number")),
        Err(_) if size == Size::Short => SHORT_SEED,
        Err(_) => unix_ms(),
    };
    println!("chaos seed {seed} ({} run; CHAOS_SEED={seed} replays it)", size.as_str());
    seed
}

/// Timing of the daemons and the emulator for one size.
#[derive(Debug, Clone)]
struct Timing {
    /// Shortest and longest batch.
    durations: (Duration, Duration),
    /// Shortest and longest reply latency of the emulator.
    latency: (Duration, Duration),
    /// `schedule.lease_secs`.
    lease: Duration,
    /// `ingress.reclaim_idle_secs`.
    reclaim_idle: Duration,
    /// `ingress.reclaim_interval_secs`.
    reclaim_interval: Duration,
    /// `poll.max_interval_ms`.
    max_poll: Duration,
    /// `retry.max_backoff_ms`.
    max_backoff: Duration,
    /// `shutdown.grace_secs`.
    grace: Duration,
    /// The daemons' `BATCHD__` variables.
    vars: Vec<(&'static str, String)>,
}

impl Timing {
    fn new(size: Size, durations: (Duration, Duration)) -> Self {
        let secs = |d: Duration| d.as_secs().to_string();
        let ms = |d: Duration| d.as_millis().to_string();
        let (lease, reclaim_idle, reclaim_interval, max_poll, max_backoff, grace) = match size {
            Size::Full => (
                Duration::from_secs(20),
                Duration::from_secs(10),
                Duration::from_secs(2),
                Duration::from_secs(4),
                Duration::from_secs(4),
                Duration::from_secs(20),
            ),
            Size::Short => (
                Duration::from_secs(6),
                Duration::from_secs(2),
                Duration::from_secs(1),
                Duration::from_millis(1000),
                Duration::from_millis(1000),
                Duration::from_secs(10),
            ),
        };
        let request_timeout = size.pick("10", "4").to_owned();
        let vars = vec![
            ("BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS", request_timeout.clone()),
            ("BATCHD__OPENAI__REQUEST_TIMEOUT_SECS", request_timeout.clone()),
            ("BATCHD__ANTHROPIC__REQUEST_TIMEOUT_SECS", request_timeout),
            ("BATCHD__SCHEDULE__LEASE_SECS", secs(lease)),
            ("BATCHD__INGRESS__BLOCK_MS", size.pick("1000", "200").to_owned()),
            ("BATCHD__INGRESS__RECLAIM_IDLE_SECS", secs(reclaim_idle)),
            ("BATCHD__INGRESS__RECLAIM_INTERVAL_SECS", secs(reclaim_interval)),
            ("BATCHD__POLL__INITIAL_INTERVAL_MS", size.pick("1000", "300").to_owned()),
            ("BATCHD__POLL__MULTIPLIER", "1.5".to_owned()),
            ("BATCHD__POLL__MAX_INTERVAL_MS", ms(max_poll)),
            ("BATCHD__RETRY__INITIAL_BACKOFF_MS", size.pick("250", "100").to_owned()),
            ("BATCHD__RETRY__MAX_BACKOFF_MS", ms(max_backoff)),
            ("BATCHD__RETRY__MAX_ATTEMPTS", "8".to_owned()),
            ("BATCHD__SHUTDOWN__GRACE_SECS", secs(grace)),
        ];
        let latency = size.pick(
            (Duration::from_millis(50), Duration::from_millis(500)),
            (Duration::from_millis(20), Duration::from_millis(200)),
        );
        Self { durations, latency, lease, reclaim_idle, reclaim_interval, max_poll, max_backoff, grace, vars }
    }

    /// Schedule members scored further out than this are leased claims (polls and retries never are).
    fn claim_threshold(&self) -> Duration {
        self.max_poll.mul_f64(1.2).max(self.max_backoff) + Duration::from_millis(1000)
    }

    /// The emulator: 4-dimension bge-small, these batch durations and latencies (for all three APIs), `fault_rate`
    /// random transient faults (injected at the same rate into the OpenAI and Anthropic emulators by the cluster).
    /// Workers AI batches draw their duration from the range; OpenAI and Anthropic batches, whose emulators have
    /// one duration for all, take its middle.
    fn emulator(&self, fault_rate: f64, seed: u64) -> EmulatorConfig {
        let middle = (self.durations.0 + self.durations.1) / 2;
        let base = small_embeddings();
        let openai = OpenAiConfig {
            timing: OpenAiTiming {
                validating_for: Duration::from_millis(100),
                in_progress_for: middle,
                finalizing_for: Duration::from_millis(100),
                ..OpenAiTiming::default()
            },
            ..base.openai.clone()
        };
        let anthropic = AnthropicConfig { processing_for: middle, ..base.anthropic.clone() };
        EmulatorConfig {
            random_durations: Some(DurationRange::new(self.durations.0, self.durations.1)),
            random_latency: Some(DurationRange::new(self.latency.0, self.latency.1)),
            random_faults: (fault_rate > 0.0).then(|| RandomFaults::new(fault_rate)),
            seed,
            openai,
            anthropic,
            ..base
        }
    }
}

/// The share of API calls that fail at random in every scenario.
const FAULT_RATE: f64 = 0.05;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Starts `n` daemons in slots `0..n`.
async fn start_daemons(cluster: &mut Cluster, n: usize) -> anyhow::Result<()> {
    for slot in 0..n {
        cluster.start_daemon(slot).await?;
    }
    Ok(())
}

/// Sleeps `duration` while restarting daemons that died (as a supervisor would).
async fn supervised_sleep(cluster: &mut Cluster, duration: Duration) {
    let until = Instant::now() + duration;
    while Instant::now() < until {
        if let Err(error) = cluster.supervise().await {
            cluster.event(format!("supervise: {error:#}"));
        }
        tokio::time::sleep(until.saturating_duration_since(Instant::now()).min(Duration::from_millis(250))).await;
    }
}

/// Drains, stops the daemons, and runs the final check; returns the drain time and what the consumer saw.
async fn finish(
    cluster: &mut Cluster,
    collector: Collector,
    produced: &Produced,
    drain_timeout: Duration,
    no_duplicate_submits: bool,
    outcome: &mut Outcome,
) -> (Option<Duration>, Collected) {
    let drained = drain(cluster, &collector, produced.acked.len() + produced.hostile.len(), drain_timeout).await;
    let stop_failures = cluster.stop_all().await;
    let collected = collector.stop().await;
    outcome.figure("consumer_read_errors", collected.errors);
    verify(cluster, produced, &collected, no_duplicate_submits, outcome).await;
    outcome.failures.extend(stop_failures);
    outcome.expect(drained.is_some(), || format!("not drained within {}", human(drain_timeout)));
    (drained, collected)
}

/// `batchd_stale_writes_total` from a daemon's `/metrics`.
pub(super) async fn stale_writes(cluster: &Cluster, index: usize) -> anyhow::Result<u64> {
    let (_, body) = cluster.admin_get(index, "/metrics").await?;
    let line = body
        .lines()
        .find(|line| line.starts_with("batchd_stale_writes_total"))
        .ok_or_else(|| anyhow::anyhow!("no batchd_stale_writes_total in /metrics"))?;
    let value = line.split_whitespace().last().unwrap_or("0");
    Ok(value.parse::<f64>().map(|value| value as u64)?)
}
