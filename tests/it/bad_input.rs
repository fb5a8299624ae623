//! Bad input from producers and hand-edited Redis: each gets a clear error where the producer looks (a `failed`
//! result under the job's id, and the dead-letter stream for entries that are not jobs at all), nothing is lost,
//! and the daemon keeps running.

use std::collections::HashMap;
use std::time::Duration;

use batchd_core::ResultStatus;
use batchd_tests::{World, bge_m3_job};
use redis::AsyncCommands;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// Enqueues `fields`, waits for the failure result under `job_id` (the entry id when `None`), and returns
/// (error code, message).
async fn rejected(world: &World, fields: &[(&str, String)], job_id: Option<&str>) -> (String, String) {
    let entry_id = world.enqueue_raw(fields).await;
    let result = world.wait_for_result(job_id.unwrap_or(&entry_id), WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("a failed result carries an error");
    (error.code, error.message)
}

#[tokio::test]
async fn each_bad_job_gets_a_failed_result_that_names_the_problem() {
    let world = World::new().await;
    let daemon = world.daemon();
    let job = |value: serde_json::Value| vec![("job", value.to_string())];

    assert_eq!(
        rejected(&world, &[("job", "this is not json".into())], None).await,
        ("invalid_entry".into(), "`job` is not valid JSON: expected ident at line 1 column 2".into())
    );
    assert_eq!(
        rejected(&world, &job(json!({"id": "no-model", "requests": [{"text": "x"}]})), Some("no-model")).await,
        ("invalid_job".into(), "invalid `model`: is missing".into())
    );
    assert_eq!(
        rejected(&world, &job(json!({"id": "empty", "model": "@cf/baai/bge-m3", "requests": []})), Some("empty")).await,
        ("invalid_job".into(), "invalid `requests`: must not be empty".into())
    );
    assert_eq!(
        rejected(&world, &job(json!({"id": "bad id!", "model": "@cf/baai/bge-m3", "requests": [{}]})), None).await,
        ("invalid_job".into(), "invalid `id`: contains ' '; allowed characters are A-Z a-z 0-9 . _ : -".into())
    );
    assert_eq!(
        rejected(
            &world,
            &job(json!({"id": "escape", "model": "@cf/../../accounts/x", "requests": [{"text": "x"}]})),
            Some("escape")
        )
        .await,
        (
            "invalid_job".into(),
            "invalid `model`: \"@cf/../../accounts/x\" contains the path segment \"..\", which is not allowed".into()
        )
    );
    assert_eq!(
        rejected(
            &world,
            &job(json!({"id": "typo", "modle": "@cf/baai/bge-m3", "model": "@cf/baai/bge-m3", "requests": [{}]})),
            Some("typo")
        )
        .await
        .1,
        "invalid `job`: unknown field \"modle\"; the fields of a v1 job are id, model, requests, reply_to, metadata, deadline_secs, retry_failed_items, endpoint, pack"
    );
    assert_eq!(
        rejected(&world, &[("payload", "{}".into())], None).await,
        ("invalid_entry".into(), "entry has no `job` field (fields present: payload)".into())
    );
    assert_eq!(
        rejected(
            &world,
            &job(json!({"id": "foreign", "model": "@cf/baai/bge-m3", "requests": [{}], "reply_to": "billing:events"})),
            Some("foreign")
        )
        .await
        .0,
        "invalid_job"
    );

    // None of them reached the API, nothing is left pending, and the daemon still takes good work.
    assert_eq!(world.emulator.calls().len(), 0);
    assert_eq!(world.ingress_pending().await, 0);
    assert!(daemon.is_running());
    world.enqueue(&bge_m3_job("good", 1)).await;
    assert_eq!(world.wait_for_result("good", WAIT).await.status, ResultStatus::Completed);

    // `batchd status` can explain a rejected job.
    let ledger = world.ledger("no-model").await;
    assert_eq!(ledger["state"], "failed");
    assert!(ledger["error"].contains("is missing"));
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_deadline_centuries_away_is_accepted_without_overflow() {
    let world = World::new().await;
    let daemon = world.daemon();
    let mut job = bge_m3_job("patient-producer", 1);
    job["deadline_secs"] = json!(u64::MAX / 1000);
    world.enqueue(&job).await;
    assert_eq!(world.wait_for_result("patient-producer", WAIT).await.status, ResultStatus::Completed);
    assert_eq!(world.ledger("patient-producer").await["deadline_at"], u64::MAX.to_string());
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn entries_that_are_not_jobs_go_to_the_dead_letter_stream_with_their_fields() {
    let world = World::new().await;
    let daemon = world.daemon();
    let not_json = world.enqueue_raw(&[("job", "{\"model\": ".into()), ("source", "billing".into())]).await;
    let no_field = world.enqueue_raw(&[("jbo", "{}".into())]).await;
    let array = world.enqueue_raw(&[("job", "[1,2,3]".into())]).await;
    world.wait_for_results(3, WAIT).await;

    let dead = world.stream(&world.keys.dead()).await;
    assert_eq!(dead.len(), 3);
    let by_source: HashMap<&str, &HashMap<String, String>> =
        dead.iter().map(|entry| (entry["source_id"].as_str(), entry)).collect();
    let first = by_source[not_json.as_str()];
    assert_eq!(first["field:job"], "{\"model\": ");
    assert_eq!(first["field:source"], "billing");
    assert!(first["error"].starts_with("`job` is not valid JSON: EOF while parsing"), "{}", first["error"]);
    assert_eq!(by_source[no_field.as_str()]["error"], "entry has no `job` field (fields present: jbo)");
    assert_eq!(by_source[array.as_str()]["error"], "`job` must be a JSON object, got an array");
    assert!(daemon.is_running());
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn an_entry_over_the_size_limit_is_dead_lettered_before_any_work() {
    let mut world = World::new().await;
    world.settings.jobs.max_entry_bytes = 1000;
    let daemon = world.daemon();
    let big = bge_m3_job("big", 50);
    let entry_id = world.enqueue(&big).await;
    let result = world.wait_for_result(&entry_id, WAIT).await;
    let error = result.error.expect("error");
    assert_eq!(error.code, "invalid_entry");
    assert_eq!(
        error.message,
        format!("`job` is {} bytes, the limit (limits.max_entry_bytes) is 1000", big.to_string().len())
    );
    assert_eq!(world.stream(&world.keys.dead()).await.len(), 1);
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_50_mb_batch_is_split_under_the_api_limit_and_completes() {
    let world = World::with_emulator(batchd_tests::small_embeddings()).await;
    let mut settings = batchd_tests::patient(world.settings.clone());
    // Over the default jobs.max_entry_bytes (32 MiB), raised as docs/operations.md says.
    settings.jobs.max_entry_bytes = 64 * 1024 * 1024;
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    let text = "x".repeat(1000);
    let requests: Vec<serde_json::Value> =
        (0..50_000).map(|i| json!({"text": text, "external_reference": i})).collect();
    let job = json!({"id": "huge", "model": "@cf/baai/bge-small-en-v1.5", "requests": requests});
    assert!(job.to_string().len() > 50_000_000);
    world.enqueue(&job).await;
    let result = world.wait_for_result("huge", Duration::from_secs(120)).await;
    assert_eq!(result.status, ResultStatus::Completed, "{:?}", result.error);
    assert_eq!((result.items_total, result.items_failed), (50_000, 0));
    let submits = world.emulator.submits();
    assert!(submits.len() >= 6, "50 MB needs at least 6 batches under 10 MB, saw {}", submits.len());
    assert!(submits.iter().all(|call| call.body_bytes < 9_500_000 && call.http_status == 200));
    assert!(daemon.is_running());
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn hand_written_schedule_members_and_ledgers_do_not_stop_the_daemon() {
    let world = World::new().await;
    let mut conn = world.conn.clone();
    let schedule = world.keys.schedule();
    let _: () = conn.zadd(&schedule, "not a chunk ref", 0).await.unwrap();
    let _: () = conn.zadd(&schedule, "ghost#0", 0).await.unwrap();
    // A ledger someone wrote by hand, with a state batchd never writes.
    let ledger = world.keys.job(&batchd_core::JobId::parse("forged").unwrap());
    let _: () = conn.hset_multiple(&ledger, &[("state", "exploded"), ("n_chunks", "1")]).await.unwrap();
    let _: () = conn.zadd(&schedule, "forged#0", 0).await.unwrap();

    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("after-garbage", 1)).await;
    assert_eq!(world.wait_for_result("after-garbage", WAIT).await.status, ResultStatus::Completed);
    let remaining: Vec<String> = conn.zrange(&schedule, 0, -1).await.unwrap();
    assert!(!remaining.contains(&"not a chunk ref".to_owned()), "unparseable member dropped");
    assert!(!remaining.contains(&"ghost#0".to_owned()), "member without a ledger dropped");
    assert!(!remaining.contains(&"forged#0".to_owned()), "member with a corrupt ledger dropped");
    assert!(daemon.is_running());
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_job_that_needs_more_batches_than_a_job_may_have_is_refused_before_any_submit() {
    let world = World::new().await;
    let mut settings = world.settings.clone();
    settings.jobs.max_batch_items = 1;
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    let n = batchd_queue::MAX_CHUNKS_PER_JOB as usize + 1;
    let requests: Vec<serde_json::Value> = (0..n).map(|_| serde_json::json!({})).collect();
    world
        .enqueue(&serde_json::json!({"id": "too-many-batches", "model": "@cf/baai/bge-m3", "requests": requests}))
        .await;
    let result = world.wait_for_result("too-many-batches", Duration::from_secs(30)).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("error");
    assert_eq!(error.code, "invalid_job");
    assert!(error.message.contains(&format!("needs {n} batches")), "{}", error.message);
    assert!(world.emulator.submits().is_empty(), "nothing was submitted");
    assert_eq!(world.ingress_pending().await, 0, "acknowledged at once, not redelivered until dead-lettered");
    daemon.stop().await.unwrap();
}
