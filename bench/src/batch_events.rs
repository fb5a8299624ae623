//! Scenario 7, batch events (issue 14): what Workers AI batch events through a Cloudflare Queue save against
//! polling, on batches of 5 minutes compressed by [`TIME_SCALE`] (30 s each).
//!
//! Everything tied to the batch's length is divided by the scale: the batch (7.5 s queued + 22.5 s running), the
//! poll timing (first poll 100 ms, cap 3 s, fallback with events 30 s; multiplier 1.5 and jitter ±20% as by
//! default). The event puller keeps its real-time defaults (pulls back to back while there are messages, idle
//! waits 100 ms doubling to `events.max_idle_ms` = 1 s): it does not depend on the batch's length. So polls per
//! batch are the same at either scale, a latency set by polls (polling only, or the fallback poll when events are
//! lost) is 1/[`TIME_SCALE`] of its real-scale value, and a latency set by events is its real value.
//!
//! Three runs, each through a fresh daemon and emulator: polling only (events off), events on, events on with every
//! event dropped (`--event-drop-rate 1`). N one-item jobs are enqueued evenly over [`SPREAD`], each item labelled
//! with its job id (`external_reference`), so the emulator's call log tells which batch is which job's. A batch's
//! finish time is its submit's arrival (call log, emulator clock) + 30 s; its result's time is the result entry's
//! id (Redis clock, same machine).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::lifecycle::{read_results, start_stack_with, wait_results};
use crate::redis_server::RedisServer;

/// Real batches of 5 minutes run this many times faster.
pub const TIME_SCALE: u64 = 10;
/// Length of an emulated batch, ms (5 minutes / [`TIME_SCALE`]).
pub const BATCH_MS: u64 = 300_000 / TIME_SCALE;
/// The jobs are enqueued evenly over this long.
pub const SPREAD: Duration = Duration::from_secs(5);
/// The events queue (the emulator's default id).
const QUEUE: &str = "batchd-events";

/// How batches are found finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Events off: polls back off from 1 s to 30 s (scaled).
    Polling,
    /// Events on: a poll when the batch's completion event arrives, otherwise every 5 minutes (scaled).
    Events,
    /// Events on, and the emulator drops every event: only the fallback poll finds batches finished.
    EventsDropped,
}

impl Mode {
    /// The system column of the report.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Polling => "polling only (events off)",
            Mode::Events => "events on",
            Mode::EventsDropped => "events on, every event dropped",
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct EventsRun {
    /// Poll calls per batch submitted.
    pub polls_per_batch: f64,
    /// Queue pulls per batch submitted (0 with events off).
    pub pulls_per_batch: f64,
    /// Batch finish → result entry, per job, ms (as measured, in compressed time).
    pub latencies_ms: Vec<f64>,
    /// Jobs that ended `completed`.
    pub completed: usize,
    /// Events the emulator published (queued + succeeded + failed) and dropped.
    pub events_published_dropped: (u64, u64),
}

/// Daemon settings: the poll timing of the defaults divided by [`TIME_SCALE`], events on or off.
fn daemon_settings(mode: Mode) -> Vec<(&'static str, String)> {
    let scaled = |ms: u64| (ms / TIME_SCALE).to_string();
    let mut env = vec![
        ("BATCHD__POLL__INITIAL_INTERVAL_MS", scaled(1_000)),
        ("BATCHD__POLL__MAX_INTERVAL_MS", scaled(30_000)),
        ("BATCHD__POLL__MAX_INTERVAL_MS_WITH_EVENTS", scaled(300_000)),
    ];
    if mode != Mode::Polling {
        env.push(("BATCHD__EVENTS__QUEUE_ID", QUEUE.to_owned()));
    }
    env
}

/// Runs `n` jobs in `mode` through a fresh daemon and emulator.
pub async fn run(redis: &RedisServer, mode: Mode, n: usize, logs: &Path, tag: &str) -> anyhow::Result<EventsRun> {
    let mut emulator_args = Vec::new();
    if mode != Mode::Polling {
        emulator_args.extend(["--events".to_owned(), "--events-queue".to_owned(), QUEUE.to_owned()]);
    }
    if mode == Mode::EventsDropped {
        emulator_args.extend(["--event-drop-rate".to_owned(), "1".to_owned()]);
    }
    let queued_ms = BATCH_MS / 4;
    let stack =
        start_stack_with(redis, queued_ms, BATCH_MS - queued_ms, &emulator_args, &daemon_settings(mode), logs, tag)
            .await?;
    let mut conn = redis.connect().await?;
    let submit = stack.keys.submit();
    let ticks = (SPREAD.as_millis() / 100) as usize;
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    let mut i = 0;
    for tick in 1..=ticks {
        ticker.tick().await;
        let mut pipe = redis::pipe();
        while i < n * tick / ticks {
            let id = format!("E{i}");
            let job = serde_json::json!({
                "id": id,
                "model": "@cf/baai/bge-m3",
                // Each job's own batch, as the published figures measured (packing is scenario 9's).
                "pack": false,
                "requests": [{"query": "What is batchd?", "contexts": [{"text": "A batch daemon."}],
                              "external_reference": id}],
            });
            pipe.xadd(&submit, "*", &[("job", job.to_string())]);
            i += 1;
        }
        let _: Vec<String> = pipe.query_async(&mut conn).await?;
    }
    wait_results(&mut conn, &stack.keys, n, Duration::from_secs(30 * BATCH_MS / 1000 + 120)).await?;
    let origin = stack.emulator.origin();
    let http = reqwest::Client::new();
    let calls: Vec<serde_json::Value> =
        http.get(format!("{origin}/_emulator/calls")).send().await?.error_for_status()?.json().await?;
    let queue_calls: Vec<serde_json::Value> =
        http.get(format!("{origin}/_emulator/queue/calls")).send().await?.error_for_status()?.json().await?;
    let queue: serde_json::Value = http.get(format!("{origin}/_emulator/queue")).send().await?.json().await?;
    let results = read_results(&mut conn, &stack.keys).await?;
    drop(stack);

    // Each job's batch finishes BATCH_MS after its (last accepted) submit reached the emulator.
    let mut finished_at: HashMap<String, u64> = HashMap::new();
    let mut n_batches = 0usize;
    let mut n_polls = 0usize;
    for call in &calls {
        match call["kind"].as_str() {
            Some("submit") if call["http_status"].as_u64().is_some_and(|s| (200..300).contains(&s)) => {
                n_batches += 1;
                let job = call["first_reference"].as_str().context("submit without first_reference")?;
                let at = call["at_ms"].as_u64().context("at_ms")?;
                finished_at.insert(job.to_owned(), at + BATCH_MS);
            }
            Some("poll") => n_polls += 1,
            _ => {}
        }
    }
    let mut latencies_ms = Vec::with_capacity(n);
    for (job, finished) in &finished_at {
        let (result_ms, _) = results.get(job).with_context(|| format!("no result for {job}"))?;
        latencies_ms.push(*result_ms as f64 - *finished as f64);
    }
    if latencies_ms.len() != n {
        bail!("{} of {n} jobs have a batch and a result", latencies_ms.len());
    }
    let published =
        ["queued", "succeeded", "failed"].iter().map(|kind| queue["published"][kind].as_u64().unwrap_or(0)).sum();
    Ok(EventsRun {
        polls_per_batch: n_polls as f64 / n_batches as f64,
        pulls_per_batch: queue_calls.iter().filter(|call| call["kind"] == "pull").count() as f64 / n_batches as f64,
        latencies_ms,
        completed: results.values().filter(|(_, status)| status == "completed").count(),
        events_published_dropped: (published, queue["dropped"].as_u64().unwrap_or(0)),
    })
}
