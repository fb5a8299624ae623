//! Anthropic Message Batches through the whole daemon: a producer's `XADD` with `anthropic/<model>`, one result
//! entry back, against the emulator's `/anthropic` API and a real Redis. Responses in request order with
//! `errored`/`expired` requests marked; jobs over the byte or count limit split and merged; 429/529 retried
//! without a second batch; an uncertain create (created, reply lost or the replica crashed) never repeated; a
//! cancel that keeps what finished; ended batches deleted, a failed delete changing nothing.

use std::time::Duration;

use batchd::settings::Settings;
use batchd_core::{ResultEntry, ResultStatus};
use batchd_emulator::{AnthropicCallKind, AnthropicCalls, AnthropicFault, EmulatorConfig};
use batchd_tests::{Daemon, World, wait_until, with_anthropic};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

const MODEL: &str = "anthropic/claude-sonnet-4-5";

/// The world's settings with Anthropic pointed at the emulator.
fn anthropic_settings(world: &World) -> Settings {
    let mut settings = world.settings.clone();
    with_anthropic(&mut settings, &world.emulator);
    settings
}

fn item(text: &str) -> serde_json::Value {
    json!({"max_tokens": 32, "messages": [{"role": "user", "content": text}]})
}

fn job(id: &str, n: usize) -> serde_json::Value {
    json!({"id": id, "model": MODEL, "requests": (0..n).map(|i| item(&format!("question {i}"))).collect::<Vec<_>>()})
}

/// Each response's text, `None` for a failed one.
fn texts(entry: &ResultEntry) -> Vec<Option<String>> {
    entry
        .result
        .as_ref()
        .expect("result")
        .responses
        .iter()
        .map(|response| {
            response.result.as_ref().map(|message| {
                let message: serde_json::Value = serde_json::from_str(message.get()).expect("json");
                message["content"][0]["text"].as_str().expect("text").to_owned()
            })
        })
        .collect()
}

fn error_code(entry: &ResultEntry, index: usize) -> String {
    let response = &entry.result.as_ref().expect("result").responses[index];
    assert!(!response.success, "item {index} succeeded");
    let error: serde_json::Value = serde_json::from_str(response.error.as_ref().expect("error").get()).expect("json");
    error["code"].as_str().expect("code").to_owned()
}

fn assert_in_order(entry: &ResultEntry, n: usize) {
    assert_eq!(entry.status, ResultStatus::Completed);
    assert_eq!(entry.model, MODEL);
    let texts = texts(entry);
    assert_eq!(texts.len(), n);
    for (index, text) in texts.iter().enumerate() {
        assert_eq!(text.as_deref(), Some(format!("echo: question {index}").as_str()), "item {index}");
    }
}

#[tokio::test]
async fn a_job_completes_in_request_order_with_its_messages_and_usage() {
    let world = World::new().await;
    let daemon = Daemon::start(anthropic_settings(&world), &world.emulator);
    world.enqueue(&job("claude-1", 6)).await;
    let entry = world.wait_for_result("claude-1", WAIT).await;
    assert_in_order(&entry, 6);
    let usage = &entry.result.as_ref().expect("result").usage;
    assert_eq!(usage["input_tokens"], 12, "two words per question, summed: {usage}");
    assert!(usage["output_tokens"].as_u64().expect("output tokens") > 0);
    let creates = world.emulator.anthropic().calls_of(AnthropicCallKind::Create);
    assert_eq!(creates.len(), 1);
    assert_eq!(entry.request_ids, [creates[0].batch_id.clone().expect("batch id")]);
    let ledger = world.ledger("claude-1").await;
    assert_eq!(ledger.get("possible_duplicate_submits").map_or("0", String::as_str), "0");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn errored_and_expired_requests_are_marked_and_the_rest_answered() {
    let mut config = EmulatorConfig::default();
    // Six requests finish one every 500 ms; the batch expires after 1.5 s, when three have.
    config.anthropic.processing_for = Duration::from_secs(3);
    config.anthropic.expires_after = Duration::from_millis(1500);
    let world = World::with_emulator(config).await;
    let daemon = Daemon::start(anthropic_settings(&world), &world.emulator);
    let mut requests: Vec<serde_json::Value> = (0..6).map(|i| item(&format!("question {i}"))).collect();
    requests[1] = json!({"messages": [{"role": "user", "content": "no max_tokens"}]});
    // A deadline under the resend room (5 min): the expired requests are not sent again (tests/it/deadline.rs).
    world.enqueue(&json!({"id": "claude-2", "model": MODEL, "requests": requests, "deadline_secs": 60})).await;
    let entry = world.wait_for_result("claude-2", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "a batch that expired still answers every request");
    let texts = texts(&entry);
    assert_eq!(texts[0].as_deref(), Some("echo: question 0"));
    assert_eq!(error_code(&entry, 1), "invalid_request_error");
    assert_eq!(texts[2].as_deref(), Some("echo: question 2"));
    for index in 3..6 {
        assert_eq!(error_code(&entry, index), "expired");
    }
    assert_eq!(entry.items_failed, 4);
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn jobs_over_the_count_or_byte_limit_are_split_and_merged_in_order() {
    let world = World::new().await;
    let mut settings = anthropic_settings(&world);
    settings.anthropic.max_requests = 2;
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&job("by-count", 5)).await;
    let entry = world.wait_for_result("by-count", WAIT).await;
    assert_in_order(&entry, 5);
    assert_eq!(entry.request_ids.len(), 3);
    let sizes: Vec<usize> = world
        .emulator
        .anthropic()
        .calls_of(AnthropicCallKind::Create)
        .iter()
        .map(|call| call.n_requests.expect("n"))
        .collect();
    assert_eq!(sizes.iter().sum::<usize>(), 5);
    assert!(sizes.iter().all(|n| *n <= 2), "{sizes:?}");
    daemon.stop().await.expect("stop");

    // Bytes: batchd's own limit plans the chunks; the API's 413 (a stricter limit than configured) splits more.
    let world = World::new().await;
    world.emulator.anthropic().update_config(|config| config.max_body_bytes = 1500);
    let mut settings = anthropic_settings(&world);
    settings.anthropic.max_body_bytes = 4000;
    let daemon = Daemon::start(settings, &world.emulator);
    let padding = "x".repeat(300);
    let requests: Vec<serde_json::Value> = (0..8)
        .map(|i| json!({"max_tokens": 8, "messages": [{"role": "user", "content": format!("question {i} {padding}")}]}))
        .collect();
    world.enqueue(&json!({"id": "by-bytes", "model": MODEL, "requests": requests})).await;
    let entry = world.wait_for_result("by-bytes", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed);
    for (index, text) in texts(&entry).iter().enumerate() {
        assert!(text.as_deref().expect("answered").starts_with(&format!("echo: question {index} ")), "{text:?}");
    }
    let creates = world.emulator.anthropic().calls_of(AnthropicCallKind::Create);
    assert!(creates.iter().any(|call| call.status == 413), "the API refused a batch as too large");
    let accepted: usize =
        creates.iter().filter(|call| call.status == 200).map(|call| call.n_requests.expect("n")).sum();
    assert_eq!(accepted, 8, "every request was created exactly once");
    assert_eq!(world.emulator.anthropic().batch_count(), entry.request_ids.len());
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn rate_limits_and_overload_are_retried_without_a_second_batch() {
    let world = World::new().await;
    let control = world.emulator.anthropic();
    control.inject(AnthropicFault::status(429).retry_after(1).on(AnthropicCalls::Create));
    control.inject(AnthropicFault::status(529).on(AnthropicCalls::Create));
    control.inject(AnthropicFault::status(529).on(AnthropicCalls::Retrieve));
    let daemon = Daemon::start(anthropic_settings(&world), &world.emulator);
    world.enqueue(&job("limited", 3)).await;
    let entry = world.wait_for_result("limited", WAIT).await;
    assert_in_order(&entry, 3);
    let statuses: Vec<u16> = control.calls_of(AnthropicCallKind::Create).iter().map(|call| call.status).collect();
    assert_eq!(statuses, [429, 529, 200]);
    assert_eq!(control.batch_count(), 1, "one batch");
    assert_eq!(entry.request_ids.len(), 1);
    daemon.stop().await.expect("stop");
}

/// Issue 34: a status endpoint that answers 529 and 500 for longer than `retry.max_attempts` polls in a row (4 in
/// the tests) does not give the running batch up: it is polled until it answers, one batch, one completed result.
#[tokio::test]
async fn a_status_outage_longer_than_the_attempts_ends_with_the_batch_read_not_abandoned() {
    let world = World::new().await;
    let control = world.emulator.anthropic();
    control.inject(AnthropicFault::status(529).on(AnthropicCalls::Retrieve).times(6));
    control.inject(AnthropicFault::status(500).on(AnthropicCalls::Retrieve).times(6));
    let daemon = Daemon::start(anthropic_settings(&world), &world.emulator);
    world.enqueue(&job("outage", 2)).await;
    let entry = world.wait_for_result("outage", WAIT).await;
    assert_in_order(&entry, 2);
    let failed = control.calls_of(AnthropicCallKind::Retrieve).iter().filter(|call| call.status != 200).count();
    assert_eq!(failed, 12, "every fault was met");
    assert_eq!(control.batch_count(), 1, "one batch");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_create_whose_reply_is_lost_is_found_not_repeated() {
    let world = World::new().await;
    let control = world.emulator.anthropic();
    control.inject(AnthropicFault::status_after(500).on(AnthropicCalls::Create));
    let daemon = Daemon::start(anthropic_settings(&world), &world.emulator);
    world.enqueue(&job("lost-reply", 4)).await;
    let entry = world.wait_for_result("lost-reply", WAIT).await;
    assert_in_order(&entry, 4);
    assert_eq!(control.calls_of(AnthropicCallKind::Create).len(), 1, "no second create");
    assert_eq!(control.batch_count(), 1);
    assert!(!control.calls_of(AnthropicCallKind::List).is_empty(), "the retry looked for the batch first");
    assert_eq!(world.ledger("lost-reply").await["possible_duplicate_submits"], "1", "the uncertainty is counted");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_crash_between_create_and_record_creates_no_second_batch() {
    let world = World::new().await;
    let control = world.emulator.anthropic();
    // The batch is created at once, its reply held back: the replica dies before it can record the batch.
    control.inject(AnthropicFault::delay(Duration::from_secs(30)).on(AnthropicCalls::Create));
    let mut settings = anthropic_settings(&world);
    settings.anthropic.request_timeout_secs = 5;
    let first = Daemon::start(settings.clone(), &world.emulator);
    world.enqueue(&job("crashed", 3)).await;
    wait_until("the create to reach the API", WAIT, async || control.batch_count() == 1).await;
    first.crash().await;
    // Another replica takes the chunk over once its lease runs out, and looks before creating.
    let second = Daemon::start(settings, &world.emulator);
    let entry = world.wait_for_result("crashed", WAIT).await;
    assert_in_order(&entry, 3);
    assert_eq!(control.batch_count(), 1, "no second batch");
    assert_eq!(control.calls_of(AnthropicCallKind::Create).len(), 1);
    second.stop().await.expect("stop");
}

/// The request id (batch id) of a job's first chunk, once it is polling.
async fn polling_batch(world: &World, job_id: &str) -> String {
    wait_until("the batch is polled", WAIT, async || {
        world.ledger(job_id).await.get("c0:state").map(String::as_str) == Some("polling")
    })
    .await;
    world.ledger(job_id).await["c0:request_id"].clone()
}

/// A world whose batches finish nothing on their own (tests finish items by hand) and end half a second after a
/// cancel.
async fn cancel_world() -> World {
    let mut config = EmulatorConfig::default();
    config.anthropic.processing_for = Duration::from_secs(600);
    config.anthropic.canceling_for = Duration::from_millis(500);
    World::with_emulator(config).await
}

#[tokio::test]
async fn cancelling_a_job_cancels_its_batch_and_keeps_what_finished() {
    let world = cancel_world().await;
    let control = world.emulator.anthropic();
    let daemon = Daemon::start(anthropic_settings(&world), &world.emulator);
    world.enqueue(&job("claude-cancel", 5)).await;
    let batch_id = polling_batch(&world, "claude-cancel").await;
    assert!(control.finish_items(&batch_id, 2), "the first two requests ran");
    world.cancel("claude-cancel", "not needed").await;
    let entry = world.wait_for_result("claude-cancel", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Cancelled);
    let message = &entry.error.as_ref().expect("error").message;
    assert!(message.contains("the responses they finished are included"), "{message}");
    let texts = texts(&entry);
    assert_eq!(texts[..2], [Some("echo: question 0".to_owned()), Some("echo: question 1".to_owned())]);
    for index in 2..5 {
        assert_eq!(error_code(&entry, index), "canceled", "item {index} did not run");
    }
    assert_eq!((entry.items_total, entry.items_failed), (5, 3));
    let cancels = control.calls_of(AnthropicCallKind::Cancel);
    assert_eq!(cancels.len(), 1, "asked once: later polls saw it canceling");
    assert_eq!(cancels[0].batch_id.as_deref(), Some(batch_id.as_str()));
    let retrieves = control.calls_of(AnthropicCallKind::Retrieve);
    assert!(retrieves.iter().any(|call| call.at_ms >= cancels[0].at_ms), "polled after the cancel until it ended");
    // Once ended and stored, the batch is deleted.
    wait_until("the batch is deleted", WAIT, async || control.batch_ids().is_empty()).await;
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_cancelled_job_with_two_running_batches_is_published_once_both_have_ended() {
    let world = cancel_world().await;
    let control = world.emulator.anthropic();
    let mut settings = anthropic_settings(&world);
    settings.anthropic.max_requests = 2;
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&job("claude-cancel-2", 4)).await;
    wait_until("both batches are polled", WAIT, async || {
        let ledger = world.ledger("claude-cancel-2").await;
        ["c0:state", "c1:state"].iter().all(|state| ledger.get(*state).map(String::as_str) == Some("polling"))
    })
    .await;
    let ledger = world.ledger("claude-cancel-2").await;
    for chunk in ["c0", "c1"] {
        assert!(control.finish_items(&ledger[&format!("{chunk}:request_id")], 1), "the first request of {chunk} ran");
    }
    world.cancel("claude-cancel-2", "").await;
    let entry = world.wait_for_result("claude-cancel-2", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Cancelled);
    let texts = texts(&entry);
    assert_eq!(texts[0].as_deref(), Some("echo: question 0"));
    assert_eq!(texts[2].as_deref(), Some("echo: question 2"));
    for index in [1, 3] {
        assert_eq!(error_code(&entry, index), "canceled", "item {index}");
    }
    assert_eq!(control.calls_of(AnthropicCallKind::Cancel).len(), 2, "each batch cancelled once");
    assert_eq!(entry.request_ids.len(), 2);
    daemon.stop().await.expect("stop");
    assert_eq!(world.results().await.len(), 1, "one result, however many chunks settled the job");
}

/// Issue 23: a cancel that arrives while the create's reply is still on its way (the batch exists, the reply is
/// held 2 s) waits for the create: its batch is recorded, then cancelled, and the result keeps what it finished.
#[tokio::test]
async fn a_cancel_while_the_create_is_in_flight_waits_for_it_and_cancels_its_batch() {
    let world = cancel_world().await;
    let control = world.emulator.anthropic();
    control.inject(AnthropicFault::delay(Duration::from_secs(2)).on(AnthropicCalls::Create));
    let mut settings = anthropic_settings(&world);
    // The reply arrives, late: the create is in flight, not uncertain.
    settings.anthropic.request_timeout_secs = 10;
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&job("claude-inflight", 3)).await;
    wait_until("the batch is created, its reply held back", WAIT, async || control.batch_count() == 1).await;
    let batch_id = control.batch_ids()[0].clone();
    assert!(control.finish_items(&batch_id, 1), "the first request ran");
    assert!(!world.ledger("claude-inflight").await.contains_key("c0:request_id"), "not recorded yet");
    world.cancel("claude-inflight", "not needed").await;
    let entry = world.wait_for_result("claude-inflight", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Cancelled);
    let message = &entry.error.as_ref().expect("error").message;
    assert!(message.contains("of its 1 batches at the provider, those still running were cancelled"), "{message}");
    assert_eq!(texts(&entry)[0].as_deref(), Some("echo: question 0"));
    for index in 1..3 {
        assert_eq!(error_code(&entry, index), "canceled", "item {index} did not run");
    }
    assert_eq!(entry.request_ids, std::slice::from_ref(&batch_id));
    let cancels = control.calls_of(AnthropicCallKind::Cancel);
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0].batch_id.as_deref(), Some(batch_id.as_str()));
    daemon.stop().await.expect("stop");
}

/// Issue 23: a cancel after an uncertain create (the batch was made, the reply replaced by a 500 asking to come
/// back in a minute) looks the batch up without creating; no second batch is created. Issue 38: while the batch
/// runs its custom ids cannot be read, so it cannot be proved to be the chunk's (another namespace on the account
/// may have made it) and is neither adopted nor cancelled: the look waits for it to end, then adopts it.
#[tokio::test]
async fn a_cancel_after_an_uncertain_create_finds_its_batch_once_it_can_be_checked_without_creating_another() {
    let world = cancel_world().await;
    let control = world.emulator.anthropic();
    control.inject(AnthropicFault::status_after(500).retry_after(60).on(AnthropicCalls::Create));
    let mut settings = anthropic_settings(&world);
    settings.retry.max_backoff_ms = 60_000;
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&job("claude-uncertain", 3)).await;
    wait_until("the create's outcome is unknown", WAIT, async || {
        world.ledger("claude-uncertain").await.contains_key("c0:uncertain")
    })
    .await;
    let batch_id = control.batch_ids()[0].clone();
    world.cancel("claude-uncertain", "not needed").await;
    let lists = || control.calls_of(AnthropicCallKind::List).len();
    wait_until("the cancelled job's look ran twice", WAIT, async || lists() >= 2).await;
    assert!(control.calls_of(AnthropicCallKind::Cancel).is_empty(), "an unchecked batch is never cancelled");
    assert!(!world.ledger("claude-uncertain").await.contains_key("c0:request_id"), "nor adopted");
    // It ends: its custom ids carry the chunk's nonce; it is adopted and its results kept.
    assert!(control.finish_items(&batch_id, 3));
    let entry = world.wait_for_result("claude-uncertain", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Cancelled);
    assert_eq!(texts(&entry), (0..3).map(|i| Some(format!("echo: question {i}"))).collect::<Vec<_>>());
    assert_eq!(entry.request_ids, std::slice::from_ref(&batch_id));
    assert_eq!(control.calls_of(AnthropicCallKind::Create).len(), 1, "looked up, not created again");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn ended_batches_are_deleted_after_their_result_and_a_failed_delete_changes_nothing() {
    let world = World::new().await;
    let control = world.emulator.anthropic();
    let mut settings = anthropic_settings(&world);
    // Long enough for a delete whose reply is held back 60 s to still be waiting when the result is checked.
    settings.anthropic.request_timeout_secs = 90;
    settings.schedule.lease_secs = 120;
    let daemon = Daemon::start(settings, &world.emulator);
    let deletes = |status: u16| {
        control.calls_of(AnthropicCallKind::Delete).into_iter().filter(|call| call.status == status).count()
    };

    world.enqueue(&job("deleted", 2)).await;
    let entry = world.wait_for_result("deleted", WAIT).await;
    assert_in_order(&entry, 2);
    wait_until("the batch is deleted", WAIT, async || control.batch_ids().is_empty()).await;
    assert_eq!(deletes(200), 1);

    // A delete that fails: the job completed all the same, and its batch is left.
    control.inject(AnthropicFault::status(500).on(AnthropicCalls::Delete));
    world.enqueue(&job("kept", 2)).await;
    let entry = world.wait_for_result("kept", WAIT).await;
    assert_in_order(&entry, 2);
    wait_until("the delete was tried", WAIT, async || deletes(500) == 1).await;
    assert_eq!(control.batch_ids(), entry.request_ids, "the batch whose delete failed is still there");

    // A delete whose reply is held back 60 s does not hold the result back (published within WAIT, 30 s): the
    // result is published first, and the delete only then sent.
    control.inject(AnthropicFault::delay(Duration::from_secs(60)).on(AnthropicCalls::Delete));
    world.enqueue(&job("slow-delete", 2)).await;
    let entry = world.wait_for_result("slow-delete", WAIT).await;
    assert_in_order(&entry, 2);
    wait_until("the slow delete was sent", WAIT, async || deletes(200) == 2).await;
    // The daemon is still waiting on that reply; it is not a graceful stop's business.
    daemon.crash().await;
}

#[tokio::test]
async fn two_modest_jobs_submit_side_by_side_under_the_default_budget() {
    // Anthropic's body limit (256 MB) is the whole default budget (256 MiB): a submit that held twice it before
    // reading its items waited until nothing else held room, the other job's create in flight included.
    let world = World::new().await;
    let mut settings = anthropic_settings(&world);
    settings.anthropic.request_timeout_secs = 10;
    assert_eq!(settings.workers.inflight_bytes, 256 * 1024 * 1024, "the default budget");
    let control = world.emulator.anthropic();
    // The first creates (posted at take-in) are refused, so both jobs' retries go through the scheduled submit, due
    // together a second later; each retried create is then handled at once and answered 3 s later.
    control.inject(AnthropicFault::status(429).retry_after(1).on(AnthropicCalls::Create).times(2));
    let held = Duration::from_secs(3);
    control.inject(AnthropicFault::delay(held).on(AnthropicCalls::Create).times(2));
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&job("side-a", 2)).await;
    world.enqueue(&job("side-b", 2)).await;
    for id in ["side-a", "side-b"] {
        assert_in_order(&world.wait_for_result(id, WAIT).await, 2);
    }
    let creates: Vec<_> =
        control.calls_of(AnthropicCallKind::Create).into_iter().filter(|call| call.status == 200).collect();
    assert_eq!(creates.len(), 2, "{creates:?}");
    assert!(creates.iter().all(|call| call.fault.as_deref() == Some("delay")), "{creates:?}");
    // The second create arrived while the first one's reply was still held back: the submits overlapped.
    let gap = creates[1].at_ms - creates[0].at_ms;
    assert!(
        gap < held.as_millis() as u64,
        "the second create came {gap} ms after the first: the submits ran one by one"
    );
    assert_eq!(control.batch_count(), 2);
    daemon.stop().await.expect("stop");
}
