//! Issue 34: paid work is never abandoned at a job's deadline (DESIGN decision 22). Against the emulator's OpenAI,
//! Anthropic and Workers AI APIs and a real Redis: a job whose deadline passes while its batch runs has the batch
//! cancelled, waits for it to end, and ends `expired` with the responses it finished, its files and batch cleaned
//! up; Workers AI, which has no cancel, says so; items the provider expired are sent once more (never one it
//! refused) and marked `resent`; how long a batch's polls have failed is a gauge.

use std::time::Duration;

use batchd_core::{ResultEntry, ResultStatus};
use batchd_emulator::{AnthropicCallKind, EmulatorConfig, OpenAiCallKind, OpenAiFault};
use batchd_tests::{
    Daemon, World, bge_m3_job, http_get, wait_for_http, wait_until, with_admin, with_anthropic, with_openai,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn chat(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}], "max_tokens": 5})
}

/// The indices of the items that succeeded.
fn succeeded(entry: &ResultEntry) -> Vec<usize> {
    let output = entry.result.as_ref().expect("the responses that finished are kept");
    output.responses.iter().filter(|response| response.success).map(|response| response.index).collect()
}

/// Item `index`'s error code.
fn error_code(entry: &ResultEntry, index: usize) -> String {
    let response = &entry.result.as_ref().expect("result").responses[index];
    assert!(!response.success, "item {index} succeeded");
    let error: Value = serde_json::from_str(response.error.as_ref().expect("error").get()).expect("json");
    error["code"].as_str().expect("code").to_owned()
}

#[tokio::test]
async fn an_openai_job_past_its_deadline_cancels_its_batch_and_keeps_what_finished() {
    let mut world = World::new().await;
    with_openai(&mut world.settings, &world.emulator);
    let openai = world.emulator.openai();
    openai.set_shuffle(false);
    // Two requests finish, then the batch makes no progress until it is cancelled (it would run for hours).
    openai.inject(OpenAiFault::stall(2));
    let mut timing = openai.timing();
    timing.cancelling_for = Duration::from_millis(300);
    openai.set_timing(timing);
    let daemon = world.daemon();
    let requests: Vec<Value> = (0..5).map(|i| chat(&format!("item-{i}"))).collect();
    world
        .enqueue(&json!({"id": "due-openai", "model": "openai/gpt-4o-mini", "requests": requests, "deadline_secs": 3}))
        .await;
    let entry = world.wait_for_result("due-openai", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Expired);
    let error = entry.error.as_ref().expect("error");
    assert_eq!(error.code, "deadline_exceeded");
    assert!(error.message.contains("were cancelled there and have ended"), "{}", error.message);
    assert_eq!(succeeded(&entry), [0, 1], "the two requests that ran before the deadline");
    for index in 2..5 {
        assert_eq!(error_code(&entry, index), "batch_cancelled", "item {index}");
    }
    assert_eq!((entry.items_total, entry.items_failed), (5, 3));
    assert_eq!(openai.batch_statuses(), [(entry.request_ids[0].clone(), "cancelled")]);
    assert_eq!(openai.calls_of(OpenAiCallKind::CancelBatch).len(), 1, "asked once: later polls saw it cancelling");
    // The input file and the cancelled batch's output and error files are deleted.
    wait_until("files deleted", WAIT, async || openai.file_ids().is_empty()).await;
    assert_eq!(world.ledger("due-openai").await["state"], "expired");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn an_anthropic_job_past_its_deadline_cancels_its_batch_and_keeps_what_finished() {
    let mut config = EmulatorConfig::default();
    config.anthropic.processing_for = Duration::from_secs(600);
    config.anthropic.canceling_for = Duration::from_millis(300);
    let world = World::with_emulator(config).await;
    let control = world.emulator.anthropic();
    let mut settings = world.settings.clone();
    with_anthropic(&mut settings, &world.emulator);
    let daemon = Daemon::start(settings, &world.emulator);
    let requests: Vec<Value> =
        (0..4).map(|i| json!({"max_tokens": 32, "messages": [{"role": "user", "content": format!("q{i}")}]})).collect();
    let job =
        json!({"id": "due-claude", "model": "anthropic/claude-sonnet-4-5", "requests": requests, "deadline_secs": 4});
    world.enqueue(&job).await;
    wait_until("the batch is polled", WAIT, async || {
        world.ledger("due-claude").await.get("c0:state").map(String::as_str) == Some("polling")
    })
    .await;
    let batch_id = world.ledger("due-claude").await["c0:request_id"].clone();
    assert!(control.finish_items(&batch_id, 2), "the first two requests ran");
    let entry = world.wait_for_result("due-claude", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Expired);
    assert!(entry.finished_at - entry.accepted_at >= 4000, "not before the deadline");
    assert_eq!(entry.error.as_ref().expect("error").code, "deadline_exceeded");
    assert_eq!(succeeded(&entry), [0, 1]);
    for index in 2..4 {
        assert_eq!(error_code(&entry, index), "canceled", "item {index}");
    }
    let cancels = control.calls_of(AnthropicCallKind::Cancel);
    assert_eq!(cancels.len(), 1);
    assert_eq!(cancels[0].batch_id.as_deref(), Some(batch_id.as_str()));
    wait_until("the ended batch is deleted", WAIT, async || control.batch_ids().is_empty()).await;
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_workers_ai_job_past_its_deadline_says_its_batch_could_not_be_cancelled() {
    let world =
        World::with_emulator(EmulatorConfig { queued_for: Duration::from_secs(60), ..EmulatorConfig::default() }).await;
    let daemon = world.daemon();
    let mut job = bge_m3_job("due-workers-ai", 2);
    job["deadline_secs"] = json!(1);
    world.enqueue(&job).await;
    let entry = world.wait_for_result("due-workers-ai", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Expired);
    let error = entry.error.expect("error");
    assert_eq!(error.code, "deadline_exceeded");
    assert!(error.message.contains("could not be cancelled"), "{}", error.message);
    assert!(error.message.contains("may be billed"), "{}", error.message);
    assert_eq!(entry.request_ids.len(), 1, "the batch that runs on is named");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn items_the_provider_expired_are_sent_once_more_and_marked_but_a_refused_item_is_not() {
    let mut world = World::new().await;
    with_openai(&mut world.settings, &world.emulator);
    let openai = world.emulator.openai();
    openai.set_shuffle(false);
    // The first batch answers two requests (the refused one and one that succeeds), then its window closes.
    let mut timing = openai.timing();
    timing.completion_window = Duration::from_millis(800);
    openai.set_timing(timing);
    openai.inject(OpenAiFault::stall(2));
    let daemon = world.daemon();
    let mut requests: Vec<Value> = (0..5).map(|i| chat(&format!("item-{i}"))).collect();
    requests[0] = json!({"messages": [], "max_tokens": 5});
    world.enqueue(&json!({"id": "resend-1", "model": "openai/gpt-4o-mini", "requests": requests})).await;
    let entry = world.wait_for_result("resend-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    let output = entry.result.as_ref().expect("result");
    let refused: Value = serde_json::from_str(output.responses[0].error.as_ref().expect("error").get()).expect("json");
    assert_eq!(refused["http_status"], 400, "the refused item keeps its 400: {refused}");
    assert_eq!(succeeded(&entry), [1, 2, 3, 4], "the expired items ran in the second batch");
    let resent: Vec<usize> = output.responses.iter().filter(|r| r.resent).map(|r| r.index).collect();
    assert_eq!(resent, [2, 3, 4], "the expired items are marked; the refused one was not sent again");
    assert_eq!(entry.request_ids.len(), 2);
    let creates = openai.calls_of(OpenAiCallKind::CreateBatch);
    assert_eq!(creates.iter().filter(|call| call.http_status == 200).count(), 2);
    let statuses: Vec<&str> = openai.batch_statuses().into_iter().map(|(_, status)| status).collect();
    assert!(statuses.contains(&"expired") && statuses.contains(&"completed"), "{statuses:?}");
    daemon.stop().await.expect("stop");
}

/// `batchd_remote_unreachable_seconds` for OpenAI, scraped from the daemon's `/metrics` (`None` before it exists).
async fn unreachable_seconds(admin: std::net::SocketAddr) -> Option<f64> {
    let (_, text) = http_get(admin, "/metrics").await.expect("metrics");
    let line =
        text.lines().find(|line| line.starts_with(r#"batchd_remote_unreachable_seconds{provider="openai"} "#))?;
    line.rsplit(' ').next()?.parse().ok()
}

#[tokio::test]
async fn the_unreachable_gauge_rises_while_a_batchs_polls_fail_and_falls_once_it_is_read() {
    let mut world = World::new().await;
    with_openai(&mut world.settings, &world.emulator);
    let admin = with_admin(&mut world.settings);
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::status(503).on(OpenAiCallKind::GetBatch).times(1000));
    let daemon = world.daemon();
    wait_for_http(admin, "/readyz", WAIT, |status, _| status == 200).await;
    world.enqueue(&json!({"id": "unreachable-1", "model": "openai/gpt-4o-mini", "requests": [chat("a")]})).await;
    wait_until("the gauge reads a failing batch", WAIT, async || {
        unreachable_seconds(admin).await.is_some_and(|seconds| seconds >= 1.0)
    })
    .await;
    let first = unreachable_seconds(admin).await.expect("gauge");
    wait_until("the gauge rises while polls keep failing", WAIT, async || {
        unreachable_seconds(admin).await.is_some_and(|seconds| seconds > first)
    })
    .await;
    openai.clear_faults();
    let entry = world.wait_for_result("unreachable-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(unreachable_seconds(admin).await, Some(0.0), "read at last: no batch is unreachable");
    daemon.stop().await.expect("stop");
}
