//! Scenario 8, the three providers (issues 23 and 24): scenario 6's burst — the daemon at its defaults, every API call
//! answered after 100 ms — run once per provider: N one-item jobs of `@cf/baai/bge-m3`, `openai/gpt-4o-mini` or
//! `anthropic/claude-haiku-4-5` enqueued at once, through a daemon with all three providers configured against
//! the emulator (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY` and the base URLs, as `make demo` sets them).
//!
//! Every remote batch takes 5 s in the emulator at every provider (Workers AI: 2 s queued + 3 s running; OpenAI:
//! 1 s validating, 3.5 s in progress, 0.5 s finalizing; Anthropic: 5 s processing), so the default poll schedule
//! (first poll 1 s after the submit, then ×1.5, ±20%) polls each batch a few times: polls per batch is read from
//! the emulator's call log (status requests over batches created).
//!
//! Only what the emulator cannot honour is changed from the defaults: the admin server and the rate limits are off
//! (OpenAI's 2,000 batches per hour included). Its jobs opt out of packing (`"pack": false`): scenario 8 measures
//! the path of a job with a remote batch of its own.
//!
//! Scenario 9 (issue 33) runs the same burst against the limits real accounts meet ([`Limits::Documented`]): the
//! emulator enforces OpenAI's 2,000 creates an hour (burst 1), Anthropic's 50 calls a minute (polls included) and
//! Workers AI's 300 submits a minute, and the daemon keeps its own default limits. After the burst, one lone job
//! packed and one with `"pack": false` measure what packing adds to a job that arrives alone. A second run per file-based provider sets its body limit to
//! Workers AI's 10 MB (`openai.max_file_bytes`, `anthropic.max_body_bytes`): a submit holds room for twice that
//! limit in `workers.inflight_bytes` before it reads its items, and at the defaults that is half the budget
//! (OpenAI, 2 × 64 MiB) or all of it (Anthropic, 2 × 256 MB), which the throughput shows.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

use crate::lifecycle::{BurstFigures, Stack, read_results, wait_results};
use crate::procs::{Emulator, cpu_secs, daemon_env, start_daemon, start_emulator, status_mib, wait_daemon_ready};
use crate::redis_server::RedisServer;

/// Delay of every emulator reply, ms (scenario 6's).
pub const LATENCY_MS: u64 = 100;
/// How long every remote batch takes, ms.
pub const BATCH_MS: u64 = 5_000;

/// A batch API of the scenario; [`Provider::label`] names it in the report.
pub use batchd_emulator::Provider;

/// The job JSON of job `id` at `provider`: one small item, as the producers' docs write them, opting out of
/// packing (`"pack": false`) unless `pack`.
fn job_packed(provider: Provider, id: &str, pack: bool) -> String {
    let item = match provider {
        Provider::Cloudflare => {
            serde_json::json!({"query": "What is batchd?", "contexts": [{"text": "A batch daemon."}]})
        }
        Provider::OpenAi | Provider::Anthropic => {
            serde_json::json!({"messages": [{"role": "user", "content": "What is batchd?"}], "max_tokens": 16})
        }
    };
    let model = match provider {
        Provider::Cloudflare => "@cf/baai/bge-m3",
        Provider::OpenAi => "openai/gpt-4o-mini",
        Provider::Anthropic => "anthropic/claude-haiku-4-5",
    };
    let mut job = serde_json::json!({"id": id, "model": model, "requests": [item]});
    if !pack {
        job["pack"] = serde_json::Value::Bool(false);
    }
    job.to_string()
}

/// `provider`'s call log on the emulator's control API, and the call kinds that create a batch and ask its status.
fn call_log(provider: Provider) -> (&'static str, &'static str, &'static str) {
    match provider {
        Provider::Cloudflare => ("/_emulator/calls", "submit", "poll"),
        Provider::OpenAi => ("/_emulator/openai/calls", "create_batch", "get_batch"),
        Provider::Anthropic => ("/_emulator/anthropic/calls", "create", "retrieve"),
    }
}

/// The body limits of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limits {
    /// The defaults of `config/default.toml`.
    Defaults,
    /// OpenAI's and Anthropic's body limits lowered to Workers AI's 10 MB.
    TenMegabytes,
    /// The defaults, against an emulator that enforces each provider's documented creation limits (scenario 9).
    Documented,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct ProviderRun {
    /// Throughput, latency and CPU per job.
    pub burst: BurstFigures,
    /// Status requests per batch created.
    pub polls_per_batch: f64,
    /// Remote batches created per job (1.0 when nothing was created twice).
    pub batches_per_job: f64,
    /// API calls per job, every kind.
    pub calls_per_job: f64,
    /// API calls per job, by kind.
    pub calls_by_kind: BTreeMap<String, f64>,
    /// Jobs that did not end `completed`.
    pub not_completed: usize,
    /// Daemon VmHWM after the last result, MiB.
    pub hwm_mib: f64,
    /// With [`Limits::Documented`]: a lone job after the burst, packed and with `"pack": false`.
    pub lone_ms: Option<Lone>,
}

/// The environment that configures all three providers against `emulator`, with no rate limit of OpenAI's, and
/// the body limits of `limits`.
fn provider_env(emulator: &Emulator, limits: Limits) -> Vec<(&'static str, String)> {
    let origin = emulator.origin();
    let mut env = vec![
        ("OPENAI_API_KEY", "emulator-openai-key".to_owned()),
        ("BATCHD__OPENAI__BASE_URL", format!("{origin}/openai/v1")),
        ("ANTHROPIC_API_KEY", "emulator-anthropic-key".to_owned()),
        ("BATCHD__ANTHROPIC__BASE_URL", format!("{origin}/anthropic")),
    ];
    if limits != Limits::Documented {
        // The emulator meters nothing: batchd's own OpenAI limit would be the only one.
        env.push(("BATCHD__OPENAI__BATCHES_PER_HOUR", "0".to_owned()));
    }
    if limits == Limits::TenMegabytes {
        env.push(("BATCHD__OPENAI__MAX_FILE_BYTES", "10000000".to_owned()));
        env.push(("BATCHD__ANTHROPIC__MAX_BODY_BYTES", "10000000".to_owned()));
    }
    env
}

/// Runs `n` one-item jobs of `provider` at once through a default daemon (with `limits`) against the 100 ms
/// emulator.
pub async fn run(
    redis: &RedisServer,
    provider: Provider,
    limits: Limits,
    n: usize,
    logs: &Path,
    tag: &str,
) -> anyhow::Result<ProviderRun> {
    let ms = |value: u64| value.to_string();
    let emulator_args: Vec<String> = [
        ("--latency-min-ms", ms(LATENCY_MS)),
        ("--latency-max-ms", ms(LATENCY_MS)),
        ("--openai-validating-ms", ms(1_000)),
        ("--openai-in-progress-ms", ms(3_500)),
        ("--openai-finalizing-ms", ms(500)),
        ("--anthropic-processing-ms", ms(BATCH_MS)),
    ]
    .into_iter()
    .chain((limits == Limits::Documented).then(|| ("--provider-limits", "documented".to_owned())))
    .flat_map(|(flag, value)| [flag.to_owned(), value])
    .collect();
    let emulator = start_emulator(2_000, 3_000, &emulator_args, &logs.join(format!("emulator-{tag}.log")))?;
    let env = daemon_env(&redis.url(), &emulator, &provider_env(&emulator, limits));
    let mut daemon = start_daemon(&env, &logs.join(format!("batchd-{tag}.log")))?;
    let keys = batchd_core::Keys::new("batchd")?;
    let mut conn = redis.connect().await?;
    wait_daemon_ready(&mut conn, &keys, &mut daemon).await?;
    let stack = Stack { emulator, daemon, keys };
    let pids = [stack.daemon.pid(), stack.emulator.pid(), redis.pid()];
    let cpu0 = pids.map(cpu_secs);
    let mut entry_ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            let job = job_packed(provider, &format!("P{i}"), limits == Limits::Documented);
            pipe.cmd("XADD").arg(stack.keys.submit()).arg("*").arg("job").arg(job);
        }
        let ids: Vec<String> = pipe.query_async(&mut conn).await?;
        entry_ids.extend(ids);
    }
    wait_results(&mut conn, &stack.keys, n, Duration::from_secs(3_600)).await?;
    let cpu1 = pids.map(cpu_secs);
    let hwm_mib = status_mib(pids[0], "VmHWM");
    let (path, create, status) = call_log(provider);
    let calls: Vec<serde_json::Value> = reqwest::get(format!("{}{path}", stack.emulator.origin()))
        .await?
        .error_for_status()?
        .json()
        .await
        .context("the emulator's call log")?;
    let results = read_results(&mut conn, &stack.keys).await?;
    let lone_ms = if limits == Limits::Documented {
        let packed = lone_job(&mut conn, &stack.keys, &job_packed(provider, "L0", true), n + 1).await?;
        let alone = lone_job(&mut conn, &stack.keys, &job_packed(provider, "L1", false), n + 2).await?;
        // Each lone job's create: the last two answered creates of the log, read again (L1 was sent after L0's
        // result).
        let again: Vec<serde_json::Value> =
            reqwest::get(format!("{}{path}", stack.emulator.origin())).await?.error_for_status()?.json().await?;
        let creates: Vec<u64> = again
            .iter()
            .filter(|call| call["kind"] == create && answered(call))
            .filter_map(|call| call["at_ms"].as_u64())
            .collect();
        let [.., packed_create, alone_create] = creates[..] else {
            anyhow::bail!("the lone jobs' creates are not in the call log");
        };
        Some(Lone {
            packed_ms: packed.1,
            alone_ms: alone.1,
            packed_to_create_ms: packed_create.saturating_sub(packed.0) as f64,
            alone_to_create_ms: alone_create.saturating_sub(alone.0) as f64,
        })
    } else {
        None
    };
    drop(stack);

    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for call in &calls {
        *counts.entry(call["kind"].as_str().unwrap_or("?").to_owned()).or_default() += 1;
    }
    let calls_by_kind = counts.into_iter().map(|(kind, count)| (kind, count as f64 / n as f64)).collect();
    let created = calls.iter().filter(|call| call["kind"] == create && answered(call)).count();
    let polls = calls.iter().filter(|call| call["kind"] == status).count();
    let burst = BurstFigures::measure("P", &entry_ids, &results, (cpu0, cpu1))?;
    Ok(ProviderRun {
        burst,
        polls_per_batch: polls as f64 / created.max(1) as f64,
        batches_per_job: created as f64 / n as f64,
        calls_per_job: calls.len() as f64 / n as f64,
        calls_by_kind,
        not_completed: results.values().filter(|(_, status)| status != "completed").count(),
        hwm_mib,
        lone_ms,
    })
}

/// Whether a call-log record was answered 200 (Workers AI and OpenAI log `http_status`, Anthropic `status`).
fn answered(call: &serde_json::Value) -> bool {
    call["http_status"].as_u64().or_else(|| call["status"].as_u64()).is_some_and(|status| status == 200)
}

/// A lone job after the burst, packed and with `"pack": false`, ms.
#[derive(Debug, Clone, Copy)]
pub struct Lone {
    /// Packed: XADD → result.
    pub packed_ms: f64,
    /// `"pack": false`: XADD → result.
    pub alone_ms: f64,
    /// Packed: XADD → its batch's create at the API (what packing adds, without the poll schedule's steps).
    pub packed_to_create_ms: f64,
    /// `"pack": false`: XADD → its batch's create at the API.
    pub alone_to_create_ms: f64,
}

/// Enqueues `job` alone and waits for the `nth` result entry: (its XADD's Unix ms, XADD → result ms).
async fn lone_job(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &batchd_core::Keys,
    job: &str,
    nth: usize,
) -> anyhow::Result<(u64, f64)> {
    let started = std::time::Instant::now();
    let id: String = redis::cmd("XADD").arg(keys.submit()).arg("*").arg("job").arg(job).query_async(conn).await?;
    wait_results(conn, keys, nth, Duration::from_secs(600)).await?;
    let xadd_ms = id.split('-').next().and_then(|ms| ms.parse().ok()).context("an entry id")?;
    Ok((xadd_ms, started.elapsed().as_secs_f64() * 1000.0))
}
