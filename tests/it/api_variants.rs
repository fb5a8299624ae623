//! The Batch API as it really answers, end to end through the daemon and the emulator: undocumented pending
//! statuses, empty pending lists, fields of unexpected types, one malformed item refusing a whole batch, models
//! that cannot queue, a `Retry-After` longer than anything sensible, a reply larger than the cap, and a failed
//! batch that keeps its cause. What each variant looks like is in docs/batch-api.md.

use std::time::Duration;

use batchd_core::ApiCode;
use batchd_core::{ItemResponse, ResultStatus};
use batchd_emulator::{CallKind, EmulatorConfig, Fault};
use batchd_tests::{World, bge_m3_job};

const WAIT: Duration = Duration::from_secs(30);

/// The emulator's batches stay pending for `pending`, then finish.
fn slow_batches(pending: Duration) -> EmulatorConfig {
    EmulatorConfig { queued_for: pending / 4, running_for: pending - pending / 4, ..EmulatorConfig::default() }
}

/// Every call that was not a poll: accepted submits and refused ones (the emulator logs a refusal as `rejected`).
fn submit_calls(world: &World) -> usize {
    world.emulator.calls().iter().filter(|call| call.kind != CallKind::Poll).count()
}

fn error_json(response: &ItemResponse) -> serde_json::Value {
    serde_json::from_str(response.error.as_ref().expect("a refused item has an error").get()).expect("error is JSON")
}

#[tokio::test]
async fn an_undocumented_pending_status_is_pending_not_an_error() {
    // The reproduction: two attempts allowed, a batch that reports `processing` for a while.
    let world = World::with_emulator(slow_batches(Duration::from_millis(1500))).await;
    world.emulator.inject(Fault::pending_status("processing"));
    let mut settings = world.settings.clone();
    settings.retry.max_attempts = 2;
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    world.enqueue(&bge_m3_job("processing", 2)).await;

    let result = world.wait_for_result("processing", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed, "{:?}", result.error);
    assert_eq!(result.items_failed, 0);
    let polls = world.emulator.polls();
    assert!(polls.len() > 2, "the batch stayed pending for more polls ({}) than retry attempts (2)", polls.len());
    let ledger = world.ledger("processing").await;
    assert_eq!(ledger.get("c0:poll_failures").map(String::as_str), Some("0"), "pending polls are not failures");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn an_empty_list_in_a_pending_reply_is_not_an_answer() {
    let world = World::with_emulator(slow_batches(Duration::from_millis(800))).await;
    world.emulator.inject(Fault::empty_pending_list());
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("empty-list", 3)).await;

    let result = world.wait_for_result("empty-list", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed);
    assert_eq!(result.items_failed, 0, "the empty pending list was not read as every item missing");
    assert!(world.emulator.polls().len() >= 2, "at least one pending poll carried the empty list");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn fields_of_unexpected_types_are_read_field_by_field() {
    let world = World::new().await;
    world.emulator.inject(Fault::odd_types());
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("odd", 3)).await;

    let result = world.wait_for_result("odd", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed, "{:?}", result.error);
    let output = result.result.expect("output");
    assert_eq!(output.n_failed(), 0, "`success: \"true\"` is true");
    for (index, response) in output.responses.iter().enumerate() {
        assert_eq!(response.index, index, "string ids put the items back in order");
        let raw = response.result.as_ref().expect("result").get();
        assert!(raw.starts_with('"'), "a string result is kept as the API sent it: {raw}");
    }
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn one_malformed_item_is_isolated_and_every_other_item_is_answered() {
    let world = World::new().await;
    world.emulator.set_strict_items(true);
    let daemon = world.daemon();
    let mut job = bge_m3_job("strict", 16);
    let bad = [3usize, 11];
    for index in bad {
        job["requests"][index] = serde_json::json!({"neither": "text nor query"});
    }
    world.enqueue(&job).await;

    let result = world.wait_for_result("strict", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed, "{:?}", result.error);
    assert_eq!(result.items_failed, bad.len());
    let output = result.result.expect("output");
    for response in &output.responses {
        if bad.contains(&response.index) {
            assert!(!response.success);
            let error = error_json(response);
            assert_eq!(error["api_code"], 5006, "{error}");
            assert_eq!(error["http_status"], 400, "{error}");
            let message = error["message"].as_str().expect("message");
            assert!(message.contains("/requests/"), "the API's own message is kept: {message}");
        } else {
            assert!(response.success, "item {} was answered", response.index);
        }
    }
    // Cut around each named item: at most 3 extra submits per bad item.
    let submits = submit_calls(&world);
    assert!(submits <= 1 + 3 * bad.len(), "{submits} submits for {} bad items", bad.len());
    assert!(submits > 1 + bad.len(), "the refused batches were split and resubmitted ({submits} submits)");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_model_that_cannot_queue_fails_the_job_at_once_with_its_own_code() {
    let world = World::new().await;
    world.emulator.set_unbatchable_models(["@cf/baai/bge-m3"]);
    // Without the model catalog (which would refuse the model at take-in, tests/it/cloudflare.rs), the API's 8007
    // is what says so.
    let mut settings = world.settings.clone();
    settings.cloudflare.catalog_refresh_secs = 0;
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    world.enqueue(&bge_m3_job("no-queue", 2)).await;

    let result = world.wait_for_result("no-queue", WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("error");
    assert_eq!(
        (error.code.as_str(), error.api_code.clone(), error.http_status),
        ("model_not_batchable", Some(ApiCode::Number(8007)), Some(400))
    );
    assert!(error.message.contains("does not support batch requests"), "{}", error.message);
    assert_eq!(submit_calls(&world), 1, "no retry, no split");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_failed_batch_keeps_the_apis_cause_in_the_result_and_the_ledger() {
    let world = World::new().await;
    // Two batches: the first fails as a whole, the second completes; the job lists the failed one.
    world.emulator.inject(Fault::fail_batch());
    let mut settings = world.settings.clone();
    settings.jobs.max_batch_items = 2;
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    world.enqueue(&bge_m3_job("cause", 4)).await;

    let result = world.wait_for_result("cause", WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let output = result.result.expect("the finished batch's responses are kept");
    assert_eq!(output.failed_batches.len(), 1);
    let failed = &output.failed_batches[0];
    assert_eq!((failed.error.api_code.clone(), failed.error.http_status), (Some(ApiCode::Number(5001)), Some(500)));
    assert!(failed.error.message.contains("Model execution failed"), "{}", failed.error.message);
    assert!(failed.request_id.is_some());
    let ledger = world.ledger("cause").await;
    let stored = ledger.get(&format!("c{}:last_error", failed.chunk)).expect("the ledger keeps the chunk's error");
    let stored: serde_json::Value = serde_json::from_str(stored).expect("JSON");
    assert_eq!((stored["api_code"].as_i64(), stored["http_status"].as_i64()), (Some(5001), Some(500)));
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_retry_after_of_an_hour_is_clamped_to_the_largest_backoff() {
    let world = World::new().await;
    world.emulator.inject(Fault::status(429).code(3040).retry_after(3600).on(batchd_emulator::Calls::Submit));
    let daemon = world.daemon(); // retry.max_backoff_ms is 200 in tests
    world.enqueue(&bge_m3_job("patient", 1)).await;

    let result = world.wait_for_result("patient", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed);
    let submits = world.emulator.submits();
    assert_eq!(submits.len(), 2);
    let gap = submits[1].at_ms - submits[0].at_ms;
    assert!(gap < 10_000, "the retry came {gap} ms later, not an hour");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_retry_after_never_pushes_a_step_past_the_jobs_deadline() {
    let world = World::new().await;
    world.emulator.inject(Fault::status(429).code(3040).retry_after(600).on(batchd_emulator::Calls::Submit));
    let mut settings = world.settings.clone();
    settings.retry.max_backoff_ms = 600_000;
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    let mut job = bge_m3_job("short-deadline", 1);
    job["deadline_secs"] = serde_json::json!(2);
    world.enqueue(&job).await;

    let result = world.wait_for_result("short-deadline", WAIT).await;
    assert_eq!(result.status, ResultStatus::Expired);
    let took = result.finished_at - result.accepted_at;
    assert!(took < 10_000, "expired {took} ms after acceptance, at its 2 s deadline, not after the 600 s Retry-After");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_reply_over_the_cap_fails_its_batch_naming_the_size() {
    let world = World::new().await;
    let mut settings = world.settings.clone();
    settings.cloudflare.max_reply_bytes = 4096;
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    // A bge-m3 text item answers a 1,024-dimension embedding: far over 4 KiB. Batches of embeddings are planned under
    // the cap (tests/it/reply_planning.rs), but one vector is the least a batch holds: its reply is still refused.
    let job = serde_json::json!({"id": "big-reply", "model": "@cf/baai/bge-m3", "requests": [{"text": "a"}]});
    world.enqueue(&job).await;

    let result = world.wait_for_result("big-reply", WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("error");
    assert_eq!(error.code, "reply_too_large");
    assert!(error.message.contains("over the limit of 4096 bytes"), "{}", error.message);
    assert_eq!(result.request_ids.len(), 1, "the batch whose reply was refused is named");
    assert_eq!(world.ledger("big-reply").await.get("c0:state").map(String::as_str), Some("failed"));
    daemon.stop().await.unwrap();
}
