//! Trust at the edges, the Redis half (issue 21): operator actions are Redis functions (`FCALL`) and atomic, a
//! forged or repeated batch event cannot make a poll storm, and no reader outside the storage's typed view reads a
//! chunk's fields.

use std::path::{Path, PathBuf};
use std::time::Duration;

use batchd_core::{ChunkRef, JobId};
use batchd_queue::{Store, StoreSettings};
use batchd_tests::World;
use redis::AsyncCommands;

use crate::cli_ops::{run, text};

/// A dead-letter entry as the daemon writes one, holding `job` as its original `job` field.
async fn seed_dead_letter(world: &World, job: &str) -> String {
    let fields = [
        ("source_id", "1-1"),
        ("error", "too many delivery attempts"),
        ("dead_at", "1000"),
        ("original_fields", "1"),
        ("original_bytes", "100"),
        ("truncated", "0"),
        ("field:job", job),
    ];
    world.conn.clone().xadd(world.keys.dead(), "*", &fields).await.expect("seed a dead letter")
}

#[tokio::test]
async fn three_concurrent_retries_of_one_dead_letter_enqueue_it_once() {
    let world = World::new().await;
    let job = batchd_tests::bge_m3_job("dead-1", 1).to_string();

    // Through the CLI, as three operators at once: one moves it, the others find it gone (exit 5).
    let entry = seed_dead_letter(&world, &job).await;
    let retries: Vec<_> = (0..3)
        .map(|_| {
            let mut command = world.batchd();
            command.args(["dead", "retry", &entry]);
            tokio::spawn(run(command))
        })
        .collect();
    let mut outputs = Vec::new();
    for retry in retries {
        outputs.push(retry.await.expect("join"));
    }
    let mut codes: Vec<i32> = outputs.iter().map(|output| output.status.code().unwrap_or(-1)).collect();
    codes.sort_unstable();
    assert_eq!(codes, [0, 5, 5], "{:?}", outputs.iter().map(|o| text(&o.stderr)).collect::<Vec<_>>());
    assert_eq!(world.entries(&world.keys.submit()).await.len(), 1, "enqueued once");
    assert!(world.entries(&world.keys.dead()).await.is_empty(), "the entry was moved");

    // Through the function itself, from three connections released together: exactly one enqueues.
    let entry = seed_dead_letter(&world, &job).await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(3));
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let barrier = std::sync::Arc::clone(&barrier);
            let (keys, entry, job, url) = (world.keys.clone(), entry.clone(), job.clone(), world.redis.url());
            tokio::spawn(async move {
                let client = redis::Client::open(url).expect("url");
                let mut conn = batchd_queue::connect(client, Duration::from_secs(10)).expect("connect");
                batchd_queue::results::ping(&mut conn).await.expect("ping");
                barrier.wait().await;
                batchd_queue::functions::requeue_dead_letter(&mut conn, &keys, &entry, job.as_bytes())
                    .await
                    .expect("fcall")
            })
        })
        .collect();
    let mut answers: Vec<Option<String>> = Vec::new();
    for call in calls {
        answers.push(call.await.expect("join"));
    }
    assert_eq!(answers.iter().filter(|answer| answer.is_some()).count(), 1, "{answers:?}");
    assert_eq!(world.entries(&world.keys.submit()).await.len(), 2, "the second entry was enqueued once too");
}

#[tokio::test]
async fn a_wake_within_the_initial_poll_interval_of_the_last_one_is_ignored() {
    let world = World::new().await;
    let client = redis::Client::open(world.redis.url()).expect("url");
    let store = Store::new(
        batchd_queue::connect(client, Duration::from_secs(10)).expect("connect"),
        world.keys.clone(),
        StoreSettings::default(),
    );
    let job_id = JobId::parse("woken-1").expect("id");
    let chunk = ChunkRef { job_id: job_id.clone(), index: 0 };
    let mut admin = world.conn.clone();
    let ledger = world.keys.job(&job_id);
    let _: () = admin
        .hset_multiple(&ledger, &[("state", "running"), ("n_chunks", "1"), ("c0:state", "polling")])
        .await
        .expect("seed a ledger");
    let now = store.now().await.expect("now");
    store.index_request("req-1", &chunk, now + 3_600_000, now).await.expect("index");
    let later = now + 600_000;
    let score = |admin: &mut redis::aio::MultiplexedConnection| {
        let mut admin = admin.clone();
        let (schedule, member) = (world.keys.schedule(), chunk.to_string());
        async move { admin.zscore::<_, _, Option<u64>>(schedule, member).await.expect("zscore") }
    };
    let gap = Duration::from_millis(1_000);

    let _: () = admin.zadd(world.keys.schedule(), chunk.to_string(), later).await.expect("schedule");
    let (_, woken) = store.wake_request("req-1", now, gap).await.expect("wake").expect("known");
    assert!(woken, "the first event wakes the chunk");
    assert_eq!(score(&mut admin).await, Some(now));

    // Polled and rescheduled; a forged or repeated event within the gap changes nothing.
    let _: () = admin.zadd(world.keys.schedule(), chunk.to_string(), later).await.expect("reschedule");
    for at in [now, now + 1, now + 999] {
        let (_, woken) = store.wake_request("req-1", at, gap).await.expect("wake").expect("known");
        assert!(!woken, "a wake {} ms after the last is ignored", at - now);
    }
    assert_eq!(score(&mut admin).await, Some(later), "still due at its own time");
    let (_, woken) = store.wake_request("req-1", now + 1_000, gap).await.expect("wake").expect("known");
    assert!(woken, "a wake once the gap has passed wakes it again");
    assert_eq!(score(&mut admin).await, Some(now + 1_000));
}

#[tokio::test]
async fn cancel_is_a_function_that_works_before_anyone_loaded_it_and_twice_is_a_no_op() {
    let world = World::new().await;
    let mut admin = world.conn.clone();
    let _: () = redis::cmd("FUNCTION").arg("FLUSH").query_async(&mut admin).await.expect("flush functions");
    for _ in 0..2 {
        let output = run(command_clone(&world, &["cancel", "early-1", "--before-arrival", "--json"])).await;
        assert!(output.status.success(), "{}", text(&output.stderr));
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
        assert_eq!(answer["outcome"], "not_taken_in", "{answer}");
    }
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(batchd_queue::functions::library_name())
        .query_async(&mut admin)
        .await
        .expect("function list");
    assert_eq!(libraries.len(), 1, "a user that may load it loaded the library on first use");
    let flag: Option<String> = admin.get(world.keys.cancel(&JobId::parse("early-1").expect("id"))).await.expect("get");
    assert!(flag.is_some(), "the cancel flag is set");
}

fn command_clone(world: &World, args: &[&str]) -> std::process::Command {
    let mut command = world.batchd();
    command.args(args);
    command
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the tests crate sits in the workspace").to_owned()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// A ledger's chunk fields are read in one place outside the daemon's own transitions: `LedgerView`
/// (batchd-queue's `ledger_view.rs`). Everywhere else in batchd-queue, no per-chunk name is written; and outside
/// batchd-core, batchd-queue and the daemon's pipeline (which writes chunks through the store), no file names a
/// chunk's payload (its request items or output) or its placement, or parses a `start:len` itself.
#[test]
fn chunk_fields_are_read_only_through_the_ledger_view() {
    let root = workspace_root();
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    let mut stray = Vec::new();
    for path in &files {
        let relative = path.strip_prefix(&root).expect("inside the workspace").to_string_lossy().replace('\\', "/");
        if !relative.contains("/src/") {
            continue;
        }
        let source = std::fs::read_to_string(path).expect("read source");
        let names_chunk_field = source.contains("field::chunk(") || source.contains("field::CHUNK_");
        let in_queue = relative.starts_with("crates/batchd-queue/src/");
        let owner = relative == "crates/batchd-queue/src/ledger_view.rs"
            || relative.starts_with("crates/batchd-queue/src/store/")
            || relative == "crates/batchd-core/src/ledger.rs";
        if owner {
            continue;
        }
        if in_queue && names_chunk_field {
            stray.push(format!("{relative}: reads a per-chunk field (use LedgerView)"));
        }
        let daemon = relative.starts_with("crates/batchd/src/pipeline/");
        if !daemon {
            for payload in ["CHUNK_REQUESTS", "CHUNK_OUTPUT", "CHUNK_INDICES"] {
                if source.contains(&format!("field::{payload}")) {
                    stray.push(format!("{relative}: names field::{payload} (use LedgerView)"));
                }
            }
            if source.contains("field::CHUNK_ITEMS") && source.contains("split_once(':')") {
                stray.push(format!("{relative}: parses a chunk's start:len (use ledger_view::parse_items)"));
            }
        }
    }
    assert!(stray.is_empty(), "chunk fields read outside LedgerView:\n{}", stray.join("\n"));
}
