//! Scenario 3, the backlog: 100,000 jobs waiting in the submit stream when the daemon starts, taken in until all
//! 100,000 are in flight with a poll scheduled (the emulator keeps every batch `queued` for an hour and the
//! first poll is 10 minutes out). Measures the daemon's RSS (`/proc/<pid>/status`), Redis memory per job, and
//! the time of one schedule claim (`Store::claim_due` of 256, called directly) at 1,000 and at 100,000 members,
//! and how long the dashboard (`batchd ui`, release) takes to answer its overview and the first jobs page with
//! all of them in flight (issue 15's 200 ms).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use batchd_core::Keys;
use batchd_queue::{Store, StoreSettings};

use crate::lifecycle::start_stack;
use crate::procs::{Proc, start_batchd, status_mib};
use crate::queue_layer::enqueue;
use crate::redis_server::{RedisServer, used_memory};

/// What one backlog run measured.
#[derive(Debug, Clone)]
pub struct Backlog {
    /// Redis memory per job waiting in the submit stream, bytes.
    pub redis_bytes_per_waiting_job: f64,
    /// Redis memory per job in flight (ledger + schedule member), bytes.
    pub redis_bytes_per_job_in_flight: f64,
    /// Daemon VmRSS once all jobs are in flight, MiB.
    pub daemon_rss_mib: f64,
    /// Daemon VmHWM (peak) over start + take-in, MiB.
    pub daemon_hwm_mib: f64,
    /// Take-in rate (submit path only: accept + POST + first poll scheduled), jobs/s.
    pub take_in_per_sec: f64,
    /// The dashboard's answer times with every job in flight, ms: (page, p50, max) for the overview's HTML, its
    /// JSON, and the first jobs page.
    pub ui_ms: Vec<(&'static str, f64, f64)>,
}

/// Requests per dashboard page timed.
const UI_SAMPLES: usize = 30;

/// Starts `batchd ui` on `redis`, asks each page [`UI_SAMPLES`] times one after the other (after one warm-up
/// request), and returns (page, p50, max) in ms.
async fn time_dashboard(redis: &RedisServer, logs: &Path, tag: &str) -> anyhow::Result<Vec<(&'static str, f64, f64)>> {
    let port = crate::redis_server::free_port()?;
    let env = vec![("REDIS_URL".to_owned(), redis.url())];
    let listen = format!("127.0.0.1:{port}");
    let mut ui = start_batchd(&["ui", "--listen", &listen], &env, &logs.join(format!("{tag}-ui.log")))?;
    let http = reqwest::Client::new();
    let base = format!("http://{listen}");
    let started = Instant::now();
    while http.get(format!("{base}/assets/ui.css")).send().await.is_err() {
        if started.elapsed() > Duration::from_secs(30) {
            bail!("batchd ui did not answer within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut figures = Vec::new();
    for (page, path) in [("overview (HTML)", "/"), ("overview (JSON)", "/api/overview"), ("jobs, first page", "/jobs")]
    {
        let mut times = Vec::with_capacity(UI_SAMPLES);
        for sample in 0..=UI_SAMPLES {
            let asked = Instant::now();
            let response = http.get(format!("{base}{path}")).send().await?;
            let status = response.status();
            let body = response.bytes().await?;
            if !status.is_success() {
                bail!("GET {path}: {status}: {}", String::from_utf8_lossy(&body));
            }
            if sample > 0 {
                times.push(asked.elapsed().as_secs_f64() * 1000.0);
            }
        }
        times.sort_by(f64::total_cmp);
        figures.push((page, times[times.len() / 2], times[times.len() - 1]));
    }
    ui.terminate(Duration::from_secs(10));
    Ok(figures)
}

/// Runs the backlog with `n` jobs.
pub async fn run(redis: &RedisServer, n: usize, logs: &Path, tag: &str) -> anyhow::Result<Backlog> {
    let keys = Keys::new("batchd")?;
    let mut conn = redis.connect().await?;
    let m0 = used_memory(&mut conn).await?;
    enqueue(&mut conn, &keys, "B", n).await?;
    let m1 = used_memory(&mut conn).await?;
    let env = vec![
        ("BATCHD__POLL__INITIAL_INTERVAL_MS", "600000".to_owned()),
        ("BATCHD__POLL__MAX_INTERVAL_MS", "600000".to_owned()),
        ("BATCHD__POLL__JITTER", "0.0".to_owned()),
    ];
    let started = Instant::now();
    let stack = start_stack(redis, 3_600_000, 0, &env, logs, tag).await?;
    let pid = stack.daemon.pid();
    // In flight = every job's chunk marked polling (its submit recorded); the stream is empty by then.
    loop {
        let pending: usize = redis::cmd("XLEN").arg(keys.submit()).query_async(&mut conn).await?;
        let scheduled: usize = redis::cmd("ZCOUNT")
            .arg(keys.schedule())
            .arg(batchd_queue::now_ms() + 300_000)
            .arg("+inf")
            .query_async(&mut conn)
            .await?;
        if pending == 0 && scheduled >= n {
            break;
        }
        if started.elapsed() > Duration::from_secs(900) {
            bail!("backlog: {scheduled} of {n} in flight after 900 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let take_in = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = status_mib(pid, "VmRSS");
    let hwm = status_mib(pid, "VmHWM");
    let m2 = used_memory(&mut conn).await?;
    let ui_ms = time_dashboard(redis, logs, tag).await?;
    stop(stack.daemon);
    Ok(Backlog {
        redis_bytes_per_waiting_job: (m1.saturating_sub(m0)) as f64 / n as f64,
        redis_bytes_per_job_in_flight: (m2.saturating_sub(m0)) as f64 / n as f64,
        daemon_rss_mib: rss,
        daemon_hwm_mib: hwm,
        take_in_per_sec: n as f64 / take_in,
        ui_ms,
    })
}

fn stop(mut daemon: Proc) {
    daemon.terminate(Duration::from_secs(30));
}

/// Times `Store::claim_due(now, 256)` on a schedule of `members` due members (each claim's members are made due
/// again, untimed, before the next): `samples` claims, returns their times in ms.
pub async fn claim_times(redis: &RedisServer, members: usize, samples: usize) -> anyhow::Result<Vec<f64>> {
    let keys = Keys::new(&format!("claim{members}"))?;
    let store = Store::new(redis.endpoint()?.shared()?, keys.clone(), StoreSettings::default());
    let mut conn = redis.connect().await?;
    let schedule = keys.schedule();
    let past = batchd_queue::now_ms() - 3_600_000;
    for first in (0..members).step_by(1_000) {
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(&schedule);
        for i in first..(first + 1_000).min(members) {
            cmd.arg(past + (i as u64 % 1_000_000)).arg(format!("job{i}#0"));
        }
        let _: i64 = cmd.query_async(&mut conn).await?;
    }
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        let claimed = store.claim_due(batchd_queue::now_ms(), 256).await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        if claimed.claims.len() != 256.min(members) {
            bail!("claimed {} of {members}", claimed.claims.len());
        }
        // These members have no ledger (a release would unschedule them): made due again by hand.
        let mut due_again = redis::cmd("ZADD");
        due_again.arg(&schedule).arg("XX");
        for claim in &claimed.claims {
            due_again.arg(past).arg(claim.chunk.to_string());
        }
        let _: i64 = due_again.query_async(&mut conn).await?;
    }
    let _: i64 = redis::cmd("DEL").arg(&schedule).query_async(&mut conn).await?;
    Ok(times)
}
