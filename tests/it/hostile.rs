//! Hostile entries against a real daemon process: whatever an entry claims, the work and memory spent on it are
//! bounded by the limits. The daemon runs as its own process so its peak RSS (`VmHWM` in `/proc/<pid>/status`)
//! is the daemon's alone.

use std::time::Instant;

use batchd_core::ResultStatus;
use batchd_tests::World;
use redis::AsyncCommands;

use crate::memory::DaemonProcess;

/// The 90 MB job: `{"id":"huge","model":"@cf/baai/bge-m3","requests":[{},{},...]}` with `n_items` empty items,
/// built with one repeat instead of an item at a time.
fn empty_items_job(n_items: usize) -> Vec<u8> {
    let head = br#"{"id":"huge","model":"@cf/baai/bge-m3","requests":["#;
    let tail = b"{}]}";
    let mut job = Vec::with_capacity(head.len() + 3 * n_items + 1);
    job.extend_from_slice(head);
    job.extend_from_slice(&b"{},".repeat(n_items - 1));
    job.extend_from_slice(tail);
    job
}

const MIB: f64 = 1024.0 * 1024.0;

#[tokio::test]
async fn thirty_million_empty_items_are_refused_for_about_twice_the_entry_size_above_idle() {
    let world = World::new().await;
    let n_items = 30_000_000;
    let job = empty_items_job(n_items);
    let entry_bytes = job.len();
    let mut daemon = DaemonProcess::start(
        &world,
        &[("BATCHD__JOBS__MAX_ENTRY_BYTES", (2 * entry_bytes).to_string()), ("RUST_LOG", "warn".to_owned())],
    );

    // Idle: the daemon has taken in (and refused) a small job, so it is past start-up and reading the stream.
    world.enqueue_raw(&[("job", r#"{"id":"warm-up","model":"@cf/baai/bge-m3","requests":[]}"#.to_owned())]).await;
    assert_eq!(daemon.wait_for_result(&world, "warm-up").await.status, ResultStatus::Failed);
    let idle_rss = daemon.status_bytes("VmRSS");

    let started = Instant::now();
    let _: String = world.conn.clone().xadd(world.keys.submit(), "*", &[("job", job.as_slice())]).await.expect("xadd");
    drop(job);
    let result = daemon.wait_for_result(&world, "huge").await;
    let took = started.elapsed();
    let peak_rss = daemon.status_bytes("VmHWM");
    assert!(daemon.is_running(), "the daemon survives the entry");

    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("a failed result carries an error");
    assert_eq!(error.code, "invalid_job");
    assert_eq!(error.message, "invalid `requests`: has 30000000 items, the limit (limits.max_items) is 1000000");
    assert_eq!(result.model, "@cf/baai/bge-m3", "the failure result names the model the entry gave");
    assert!(world.emulator.calls().is_empty(), "nothing reached the API");

    let figures = format!(
        "entry {:.1} MiB, idle RSS {:.1} MiB, peak RSS {:.1} MiB ({:.2}× the entry above idle), refused after {took:.1?}",
        entry_bytes as f64 / MIB,
        idle_rss as f64 / MIB,
        peak_rss as f64 / MIB,
        peak_rss.saturating_sub(idle_rss) as f64 / entry_bytes as f64,
    );
    eprintln!("{figures}");
    // Measured: 2.00 × (redis-rs's read buffer and the value copied out of it; counting the items borrows).
    assert!(peak_rss <= idle_rss + entry_bytes * 9 / 4, "peak RSS over idle + 2.25 × the entry: {figures}");
}
