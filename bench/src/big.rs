//! Scenario 5, big payloads, each through a fresh daemon process (so its VmHWM is this job's peak) at zero delay:
//! - a 9.5 MB submit: one job of 1,000 bge-small items of 9,480 characters, one batch whose submit body is just
//!   under `jobs.max_payload_bytes` (9,500,000 bytes);
//! - a 50 MB merged result: one job of 11,500 short bge-small items in batches of at most 2,000
//!   (`jobs.max_batch_items`), so six batches' embeddings (384 floats per item) are merged into one result entry.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use redis::streams::StreamRangeReply;

use crate::lifecycle::{entry_ms, start_stack, wait_results, zero_delay_env};
use crate::procs::status_mib;
use crate::redis_server::RedisServer;

/// What one big-payload run measured.
#[derive(Debug, Clone)]
pub struct Big {
    /// Size of the ingress entry's `job` field, bytes.
    pub job_bytes: usize,
    /// Size of the result entry's `result` field, bytes.
    pub result_bytes: usize,
    /// XADD → result entry, seconds.
    pub secs: f64,
    /// Daemon VmRSS just before the XADD, MiB.
    pub rss_before_mib: f64,
    /// Daemon VmHWM after the result, MiB.
    pub hwm_mib: f64,
}

/// The 9.5 MB submit job.
pub fn big_submit_job() -> String {
    let text = "x".repeat(9_480);
    let requests: Vec<serde_json::Value> = (0..1_000).map(|_| serde_json::json!({ "text": text })).collect();
    serde_json::json!({"id": "big-submit", "model": "@cf/baai/bge-small-en-v1.5", "requests": requests}).to_string()
}

/// The job whose merged result is about 50 MB.
pub fn big_result_job() -> String {
    let requests: Vec<serde_json::Value> =
        (0..11_500).map(|i| serde_json::json!({ "text": format!("item {i}") })).collect();
    serde_json::json!({"id": "big-result", "model": "@cf/baai/bge-small-en-v1.5", "requests": requests}).to_string()
}

/// Runs `job` through a fresh daemon with `extra_env`.
pub async fn run(
    redis: &RedisServer,
    job: &str,
    extra_env: &[(&str, String)],
    logs: &Path,
    tag: &str,
) -> anyhow::Result<Big> {
    let stack = start_stack(redis, 0, 0, &zero_delay_env(extra_env), logs, tag).await?;
    let pid = stack.daemon.pid();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before_mib = status_mib(pid, "VmRSS");
    let mut conn = redis.connect().await?;
    let entry_id: String =
        redis::cmd("XADD").arg(stack.keys.submit()).arg("*").arg("job").arg(job).query_async(&mut conn).await?;
    wait_results(&mut conn, &stack.keys, 1, Duration::from_secs(300)).await?;
    let hwm_mib = status_mib(pid, "VmHWM");
    let reply: StreamRangeReply =
        redis::cmd("XRANGE").arg(stack.keys.results()).arg("-").arg("+").query_async(&mut conn).await?;
    drop(stack);
    let entry = reply.ids.first().context("no result entry")?;
    let status: String = entry.get("status").unwrap_or_default();
    if status != "completed" {
        let error: String = entry.get("error").unwrap_or_default();
        bail!("big job ended {status}: {error}");
    }
    let result: String = entry.get("result").unwrap_or_default();
    Ok(Big {
        job_bytes: job.len(),
        result_bytes: result.len(),
        secs: entry_ms(&entry.id).saturating_sub(entry_ms(&entry_id)) as f64 / 1000.0,
        rss_before_mib,
        hwm_mib,
    })
}
