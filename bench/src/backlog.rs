//! Scenario 3, the backlog: 100,000 jobs waiting in the submit stream when the daemon starts, taken in until all
//! 100,000 are in flight with a poll scheduled (the emulator keeps every batch `queued` for an hour and the
//! first poll is 10 minutes out). Measures the daemon's RSS (`/proc/<pid>/status`), Redis memory per job, and
//! the time of one schedule claim (`Store::claim_due` of 256, called directly) at 1,000 and at 100,000 members.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use batchd_core::Keys;
use batchd_queue::{Store, StoreSettings};

use crate::lifecycle::start_stack;
use crate::procs::{Proc, status_mib};
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
    stop(stack.daemon);
    Ok(Backlog {
        redis_bytes_per_waiting_job: (m1.saturating_sub(m0)) as f64 / n as f64,
        redis_bytes_per_job_in_flight: (m2.saturating_sub(m0)) as f64 / n as f64,
        daemon_rss_mib: rss,
        daemon_hwm_mib: hwm,
        take_in_per_sec: n as f64 / take_in,
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
        if claimed.len() != 256.min(members) {
            bail!("claimed {} of {members}", claimed.len());
        }
        store.release(&claimed, past).await?;
    }
    let _: i64 = redis::cmd("DEL").arg(&schedule).query_async(&mut conn).await?;
    Ok(times)
}
