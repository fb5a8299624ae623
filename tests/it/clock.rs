//! One clock for every replica: real daemon processes whose wall clocks are shifted by ±300 s (libfaketime, with
//! the monotonic clock left alone) or jump while they run share one Redis, with submits answered slowly, and no
//! batch is submitted twice, no job is lost or published twice.
//!
//! Needs Debian's `faketime` package (`make deps` installs it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batchd_emulator::{DurationRange, EmulatorConfig};
use batchd_tests::{World, bge_m3_job, binary};

/// Where Debian's `faketime` package puts the library.
fn libfaketime() -> PathBuf {
    let path = PathBuf::from("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1");
    assert!(path.exists(), "{} is missing: run `make deps` (installs Debian's faketime package)", path.display());
    path
}

/// A daemon process, killed when dropped.
struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a `batchd run` process whose wall clock is given by libfaketime's `spec` file (`+300s`, `-300s`, ...),
/// re-read at every clock read so a test can make the clock jump; the monotonic clock is real.
fn replica(world: &World, clock_file: &Path) -> Replica {
    let child = Command::new(binary("batchd").expect("batchd binary"))
        .arg("run")
        .env_clear()
        .envs(world.batchd_env())
        .env("CLOUDFLARE_API_TOKEN", world.emulator.token())
        .env("BATCHD__SCHEDULE__LEASE_SECS", "6")
        .env("BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS", "5")
        .env("BATCHD__POLL__INITIAL_INTERVAL_MS", "200")
        .env("BATCHD__POLL__MAX_INTERVAL_MS", "500")
        .env("BATCHD__SCHEDULE__IDLE_POLL_MS", "50")
        .env("BATCHD__INGRESS__BLOCK_MS", "200")
        .env("BATCHD__ADMIN__LISTEN", "")
        .env("BATCHD__RATE_LIMITS__EMBEDDINGS", "0")
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_TIMESTAMP_FILE", clock_file)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start batchd");
    Replica(child)
}

/// A libfaketime spec file holding `spec`.
fn clock_file(dir: &Path, name: &str, spec: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, spec).expect("write clock file");
    path
}

/// Submits answered after about a second: long enough for a replica that misreads a lease to take the chunk
/// while its owner's submit is still in flight.
fn slow_api() -> EmulatorConfig {
    EmulatorConfig {
        random_latency: Some(DurationRange::new(Duration::from_millis(700), Duration::from_millis(1300))),
        queued_for: Duration::from_millis(300),
        running_for: Duration::from_millis(700),
        ..EmulatorConfig::default()
    }
}

/// Waits until every job of `ids` has its one result; fails on a duplicate result or after `timeout`.
async fn wait_for_all(world: &World, ids: &[String], timeout: Duration) {
    let started = Instant::now();
    loop {
        let results = world.results().await;
        let published: Vec<&str> =
            results.iter().filter_map(|fields| fields.get("job_id").map(String::as_str)).collect();
        for id in ids {
            assert!(published.iter().filter(|p| **p == id).count() <= 1, "{id} was published twice");
        }
        if ids.iter().all(|id| published.contains(&id.as_str())) {
            for fields in &results {
                assert_eq!(fields.get("status").map(String::as_str), Some("completed"), "{fields:?}");
            }
            return;
        }
        assert!(started.elapsed() < timeout, "{} of {} results after {timeout:?}", published.len(), ids.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("batchd-clock-{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[tokio::test]
async fn replicas_whose_clocks_are_300_s_apart_submit_each_batch_once() {
    let world = World::with_emulator(slow_api()).await;
    let dir = temp_dir("skew");
    let _replicas = [
        replica(&world, &clock_file(&dir, "exact", "+0s")),
        replica(&world, &clock_file(&dir, "ahead", "+300s")),
        replica(&world, &clock_file(&dir, "behind", "-300s")),
    ];
    let ids: Vec<String> = (0..20).map(|i| format!("skew-{i}")).collect();
    for id in &ids {
        world.enqueue(&bge_m3_job(id, 2)).await;
    }
    wait_for_all(&world, &ids, Duration::from_secs(90)).await;

    let accepted = world.emulator.submits().iter().filter(|call| call.http_status == 200).count();
    assert_eq!(accepted, ids.len(), "every batch was submitted exactly once (0 duplicates)");
    for id in &ids {
        let ledger = world.ledger(id).await;
        assert_eq!(ledger.get("possible_duplicate_submits").map(String::as_str).unwrap_or("0"), "0", "{id}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn a_wall_clock_that_jumps_while_replicas_run_changes_nothing() {
    let world = World::with_emulator(slow_api()).await;
    let dir = temp_dir("jump");
    let jumping = clock_file(&dir, "jumping", "+0s");
    let _replicas = [replica(&world, &jumping), replica(&world, &clock_file(&dir, "steady", "+0s"))];
    let before: Vec<String> = (0..10).map(|i| format!("before-{i}")).collect();
    for id in &before {
        world.enqueue(&bge_m3_job(id, 2)).await;
    }
    wait_for_all(&world, &before, Duration::from_secs(60)).await;

    // One machine's wall clock jumps 10 minutes ahead while both replicas run (its monotonic clock does not).
    std::fs::write(&jumping, "+600s").expect("jump");
    let after: Vec<String> = (0..10).map(|i| format!("after-{i}")).collect();
    for id in &after {
        world.enqueue(&bge_m3_job(id, 2)).await;
    }
    let all: Vec<String> = before.iter().chain(&after).cloned().collect();
    wait_for_all(&world, &all, Duration::from_secs(60)).await;

    let accepted = world.emulator.submits().iter().filter(|call| call.http_status == 200).count();
    assert_eq!(accepted, all.len(), "every batch was submitted exactly once (0 duplicates)");
    std::fs::remove_dir_all(&dir).ok();
}
