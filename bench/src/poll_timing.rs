//! Scenario 4, poll timing: 1,000 jobs in flight, each polled every 1,000 ms (no backoff, no jitter) while the
//! emulator keeps the batches `queued`: 1,000 polls/s. The jobs are enqueued over one second so their polls are
//! spread evenly.
//!
//! Lateness is read from the emulator's call log: a chunk's next poll is due `interval` after the daemon
//! recorded the previous answer, so lateness = (gap between two consecutive polls of one batch as they reach the
//! API) − interval. That is an upper bound: the gap also holds the previous answer's way back and the ledger read
//! before the next POST.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

use crate::lifecycle::start_stack;
use crate::redis_server::RedisServer;

/// Jobs in flight.
pub const JOBS: usize = 1_000;
/// Poll interval of every job, ms.
pub const INTERVAL_MS: u64 = 1_000;

/// Runs the scenario: returns every poll's lateness in ms and the poll rate seen.
pub async fn run(redis: &RedisServer, measure: Duration, logs: &Path, tag: &str) -> anyhow::Result<(Vec<f64>, f64)> {
    let env = vec![
        ("BATCHD__POLL__INITIAL_INTERVAL_MS", INTERVAL_MS.to_string()),
        ("BATCHD__POLL__MAX_INTERVAL_MS", INTERVAL_MS.to_string()),
        ("BATCHD__POLL__MULTIPLIER", "1.0".to_owned()),
        ("BATCHD__POLL__JITTER", "0.0".to_owned()),
    ];
    let stack = start_stack(redis, 3_600_000, 0, &env, logs, tag).await?;
    let mut conn = redis.connect().await?;
    let submit = stack.keys.submit();
    let payload: serde_json::Map<String, serde_json::Value> = serde_json::from_str(crate::queue_layer::PAYLOAD)?;
    let mut ticker = tokio::time::interval(Duration::from_millis(10));
    for tick in 0..100 {
        ticker.tick().await;
        let mut pipe = redis::pipe();
        for i in tick * (JOBS / 100)..(tick + 1) * (JOBS / 100) {
            let mut job = payload.clone();
            job.insert("id".into(), format!("T{i}").into());
            pipe.xadd(&submit, "*", &[("job", serde_json::Value::Object(job).to_string())]);
        }
        let _: Vec<String> = pipe.query_async(&mut conn).await?;
    }
    // Warm up: every job submitted and polled a few times.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let http = reqwest::Client::new();
    let origin = stack.emulator.origin();
    http.post(format!("{origin}/_emulator/reset")).send().await?.error_for_status()?;
    tokio::time::sleep(measure).await;
    let calls: Vec<serde_json::Value> =
        http.get(format!("{origin}/_emulator/calls")).send().await?.error_for_status()?.json().await?;
    drop(stack);
    let mut by_batch: HashMap<String, Vec<u64>> = HashMap::new();
    let mut n_polls = 0usize;
    for call in &calls {
        if call["kind"] != "poll" {
            continue;
        }
        n_polls += 1;
        let id = call["request_id"].as_str().context("poll without request_id")?.to_owned();
        by_batch.entry(id).or_default().push(call["at_ms"].as_u64().context("at_ms")?);
    }
    let mut lateness = Vec::new();
    for times in by_batch.values_mut() {
        times.sort_unstable();
        for pair in times.windows(2) {
            lateness.push(pair[1] as f64 - pair[0] as f64 - INTERVAL_MS as f64);
        }
    }
    Ok((lateness, n_polls as f64 / measure.as_secs_f64()))
}
