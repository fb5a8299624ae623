//! Waiting is visible (issue 39): `batchd status` says what a job that is not running yet waits for and until when,
//! for a chunk held by its provider's rate limit and for one queued to be packed with other jobs; and the daemon
//! logs one info line per wait that starts.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use batchd_tests::{World, bge_m3_job};
use serde_json::{Value, json};

use crate::cli_ops::{batchd, run, text};

const WAIT: Duration = Duration::from_secs(30);

/// `batchd status <id>` until its output contains `wanted` (or `WAIT` passes): the last output.
async fn status_until(world: &World, job_id: &str, wanted: &str) -> String {
    let started = Instant::now();
    loop {
        let mut command = batchd(world);
        command.args(["status", job_id]);
        let output = run(command).await;
        let shown = text(&output.stdout);
        if shown.contains(wanted) {
            return shown;
        }
        assert!(started.elapsed() < WAIT, "`status {job_id}` never said {wanted:?}: {shown}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `batchd status <id> --json`.
async fn status_json(world: &World, job_id: &str) -> Value {
    let mut command = batchd(world);
    command.args(["status", job_id, "--json"]);
    let output = run(command).await;
    serde_json::from_slice(&output.stdout).expect("status --json is JSON")
}

#[tokio::test]
async fn a_chunk_held_by_the_rate_limit_says_so_and_until_when() {
    let mut world = World::new().await;
    // One item per batch and one submit per 60 s: one chunk goes, the other waits for the limiter.
    world.settings.jobs.max_batch_items = 1;
    world.settings.rate_limits.embeddings = 1;
    world.settings.rate_limits.window_secs = 60;
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("held-1", 2)).await;

    let shown = status_until(&world, "held-1", "its provider's rate limit or calls in flight hold its submit").await;
    // Either chunk may be the one the limiter holds (both are due at once; one of them goes first).
    let held_line = shown.lines().find(|line| line.contains("rate limit or calls in flight")).expect("a wait line");
    assert!(held_line.trim_start().starts_with("waiting until "), "{shown}");
    assert!(held_line.contains(" (in "), "how long is left: {shown}");
    assert!(held_line.ends_with("(`batchd_throttled_waits_total`), or a daemon is submitting it now"), "{shown}");
    let ledger = status_json(&world, "held-1").await;
    let waits = ledger["waits"]["chunks"].as_array().expect("waits in --json");
    assert!(
        waits.iter().any(|wait| wait["due_at"].as_u64().is_some_and(|due| due > batchd_queue::now_ms())),
        "a chunk due later: {ledger}"
    );
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_chunk_queued_for_packing_says_when_its_pack_is_sent() {
    let mut world = World::new().await;
    world.settings.packing.enabled = true;
    // A long window, so the job is still queued when `status` looks.
    world.settings.packing.window_ms = 20_000;
    world.settings.packing.pause_ms = 20_000;
    let daemon = world.daemon();
    let job =
        json!({"id": "packed-1", "model": "@cf/meta/llama-3.3-70b-instruct-fp8-fast", "requests": [{"prompt": "hi"}]});
    world.enqueue(&job).await;

    let shown = status_until(&world, "packed-1", "the next pack is sent at").await;
    assert!(shown.contains("packed: waiting for its pack (jobs sharing a remote batch); the next pack is sent at "));
    assert!(shown.contains("(in "), "how long is left: {shown}");
    assert!(status_json(&world, "packed-1").await["waits"]["pack_due_at"].as_u64().is_some());
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn the_daemon_logs_one_line_per_wait_that_starts() {
    let world = World::new().await;
    let mut command = batchd(&world);
    command
        .env("CLOUDFLARE_API_TOKEN", world.emulator.token())
        .env("BATCHD__LOG__FORMAT", "json")
        .env("BATCHD__ADMIN__LISTEN", "127.0.0.1:0")
        .env("BATCHD__PACKING__ENABLED", "false")
        // One item per batch and one submit per 60 s: the first chunk goes, the other two wait the whole test.
        .env("BATCHD__JOBS__MAX_BATCH_ITEMS", "1")
        .env("BATCHD__RATE_LIMITS__EMBEDDINGS", "1")
        .env("BATCHD__RATE_LIMITS__WINDOW_SECS", "60")
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = command.spawn().expect("start the daemon");
    world.enqueue(&bge_m3_job("logged-1", 3)).await;
    // Both held chunks have been looked at (and held) at least once, and then some more: their later holds are
    // the same waits.
    let started = Instant::now();
    loop {
        let mut command = batchd(&world);
        command.args(["status", "logged-1"]);
        let shown = text(&run(command).await.stdout);
        if shown.matches("rate limit or calls in flight").count() == 2 {
            break;
        }
        assert!(started.elapsed() < WAIT, "two chunks never waited: {shown}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    let logs = text(&output.stderr);
    let waits: Vec<Value> = logs
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| {
            event
                .to_string()
                .contains("submit waits for the provider's rate limit, calls in flight or the daily budget")
        })
        .collect();
    let mut chunks: Vec<u64> = waits
        .iter()
        .map(|event| {
            assert_eq!(event["level"], "INFO", "{event}");
            assert_eq!(event["fields"]["job_id"].as_str().or(event["job_id"].as_str()), Some("logged-1"), "{event}");
            event["fields"]["chunk"].as_u64().or(event["chunk"].as_u64()).expect("the chunk")
        })
        .collect();
    chunks.sort_unstable();
    assert_eq!(chunks.len(), 2, "one line per wait, however often the chunk was held: {logs}");
    chunks.dedup();
    assert_eq!(chunks.len(), 2, "the two held chunks: {logs}");
}
