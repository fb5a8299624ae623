//! The API refusing or failing: transient errors are retried, permanent ones end the job `failed` with the API's
//! own code and message, and a deadline ends it `expired`.

use std::time::Duration;

use batchd_core::ApiCode;
use batchd_core::ResultStatus;
use batchd_emulator::{CallKind, Calls, EmulatorConfig, Fault};
use batchd_tests::{World, bge_m3_job};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_429_on_submit_is_retried_after_retry_after_and_the_job_completes() {
    let world = World::new().await;
    world.emulator.inject(Fault::status(429).code(3040).retry_after(2).on(Calls::Submit).times(2));
    // Retry-After is clamped to retry.max_backoff_ms (200 ms in tests): allow it here.
    let mut settings = world.settings.clone();
    settings.retry.max_backoff_ms = 5000;
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    world.enqueue(&bge_m3_job("throttled", 2)).await;
    let result = world.wait_for_result("throttled", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed);

    let submits = world.emulator.submits();
    let statuses: Vec<u16> = submits.iter().map(|call| call.http_status).collect();
    assert_eq!(statuses, [429, 429, 200]);
    for pair in submits.windows(2) {
        let gap = pair[1].at_ms - pair[0].at_ms;
        assert!(gap >= 2000, "Retry-After: 2 was not honoured: next call after {gap} ms");
    }
    // 429 does not use up attempts (max_attempts is 4 in tests).
    assert_eq!(world.ledger("throttled").await["c0:attempts"], "1");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn server_errors_and_an_html_page_on_poll_are_retried() {
    let world = World::new().await;
    world.emulator.inject(Fault::status(500).on(Calls::Poll));
    world.emulator.inject(Fault::html(502).on(Calls::Poll));
    world.emulator.inject(Fault::status(503).on(Calls::Poll));
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("flaky-poll", 3)).await;
    let result = world.wait_for_result("flaky-poll", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed);
    let polls: Vec<u16> = world.emulator.polls().iter().map(|call| call.http_status).collect();
    assert_eq!(&polls[..3], [500, 502, 503], "{polls:?}");
    assert_eq!(world.emulator.submits().len(), 1, "poll errors never cause a resubmit");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_connection_reset_on_submit_is_retried_and_counted_as_a_possible_duplicate() {
    let world = World::new().await;
    world.emulator.inject(Fault::reset().on(Calls::Submit));
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("reset", 1)).await;
    let result = world.wait_for_result("reset", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed);
    let ledger = world.ledger("reset").await;
    assert_eq!(ledger["c0:attempts"], "2");
    assert_eq!(ledger["possible_duplicate_submits"], "1", "a reset after sending may have created a batch");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_bad_token_fails_the_job_with_the_apis_code() {
    let world = World::new().await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(batchd::run(
        world.settings.clone(),
        batchd::settings::Secret::new("wrong-token"),
        shutdown.clone(),
    ));
    world.enqueue(&bge_m3_job("unauthorised", 2)).await;
    let result = world.wait_for_result("unauthorised", WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("error");
    assert_eq!(error.code, "api_error");
    assert_eq!(error.api_code.clone(), Some(ApiCode::Number(10000)));
    assert_eq!(error.http_status, Some(401));
    assert!(error.message.contains("Authentication error"), "{}", error.message);
    assert!(!error.message.contains("wrong-token"));
    assert_eq!((result.items_total, result.items_failed), (2, 2));
    assert_eq!(world.emulator.submits().len(), 0, "refused before a batch existed");
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_whole_batch_failure_ends_the_job_failed() {
    let world = World::new().await;
    world.emulator.inject(Fault::fail_batch());
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("doomed", 3)).await;
    let result = world.wait_for_result("doomed", WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("error");
    assert_eq!(
        (error.code.as_str(), error.api_code.clone(), error.http_status),
        ("batch_failed", Some(ApiCode::Number(5001)), Some(500))
    );
    assert_eq!(result.request_ids.len(), 1, "the failed batch's request id is reported");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn transient_errors_past_the_attempt_limit_fail_with_the_last_error() {
    let world = World::new().await;
    world.emulator.inject(Fault::status(503).on(Calls::Submit).times(10));
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("exhausted", 1)).await;
    let result = world.wait_for_result("exhausted", WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("error");
    assert_eq!(error.code, "retries_exhausted");
    assert_eq!(error.http_status, Some(503));
    assert!(error.message.starts_with("gave up after 4 attempts"), "{}", error.message);
    assert_eq!(world.emulator.submits().len(), 4);
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_job_past_its_deadline_ends_expired() {
    let world =
        World::with_emulator(EmulatorConfig { queued_for: Duration::from_secs(30), ..EmulatorConfig::default() }).await;
    let daemon = world.daemon();
    let mut job = bge_m3_job("slow", 1);
    job["deadline_secs"] = serde_json::json!(1);
    world.enqueue(&job).await;
    let result = world.wait_for_result("slow", WAIT).await;
    assert_eq!(result.status, ResultStatus::Expired);
    let error = result.error.expect("error");
    assert_eq!(error.code, "deadline_exceeded");
    assert!(error.message.contains("deadline passed"), "{}", error.message);
    let finished_after = result.finished_at - result.accepted_at;
    assert!((1000..3000).contains(&finished_after), "expired after {finished_after} ms");
    assert!(world.emulator.calls().iter().any(|call| call.kind == CallKind::Poll));
    assert_eq!(world.scheduled().await, 0, "no poll left behind");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn an_unknown_model_fails_with_the_apis_code() {
    let world = World::new().await;
    let daemon = world.daemon();
    world
        .enqueue(&serde_json::json!({"id": "nomodel", "model": "@cf/nobody/nothing", "requests": [{"text": "x"}]}))
        .await;
    let result = world.wait_for_result("nomodel", WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("error");
    assert_eq!((error.api_code.clone(), error.http_status), (Some(ApiCode::Number(5007)), Some(400)));
    assert!(error.message.contains("@cf/nobody/nothing"), "{}", error.message);
    assert!(daemon.is_running());
    daemon.stop().await.unwrap();
}
