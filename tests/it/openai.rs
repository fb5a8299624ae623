//! The OpenAI Batch provider end to end: the daemon in-process, real Redis, and the emulator's OpenAI Files and
//! Batch API over HTTP (`/openai/v1`). What each test proves is read from the emulator's call log and state.

use std::time::Duration;

use batchd::settings::Settings;
use batchd_core::{ResultEntry, ResultStatus};
use batchd_emulator::{OpenAiCallKind, OpenAiFault};
use batchd_tests::{World, wait_until, with_openai};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// A world whose daemon has the OpenAI provider pointed at the emulator (creates not rate limited).
async fn openai_world(configure: impl FnOnce(&mut Settings)) -> World {
    let mut world = World::new().await;
    with_openai(&mut world.settings, &world.emulator);
    configure(&mut world.settings);
    world
}

fn chat(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}], "max_tokens": 5})
}

fn body(entry: &ResultEntry, index: usize) -> Value {
    let response = &entry.result.as_ref().expect("result").responses[index];
    assert!(response.success, "item {index} failed: {:?}", response.error);
    serde_json::from_str(response.result.as_ref().expect("result").get()).expect("json")
}

fn error(entry: &ResultEntry, index: usize) -> Value {
    let response = &entry.result.as_ref().expect("result").responses[index];
    assert!(!response.success, "item {index} succeeded");
    serde_json::from_str(response.error.as_ref().expect("error").get()).expect("json")
}

fn successful(world: &World, kind: OpenAiCallKind) -> usize {
    world.emulator.openai().calls_of(kind).iter().filter(|call| call.http_status == 200).count()
}

#[tokio::test]
async fn a_chat_job_completes_in_request_order_with_per_item_failures_and_its_files_are_deleted() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::fail_items([1]));
    let daemon = world.daemon();
    let requests: Vec<Value> = vec![
        chat("zero"),
        chat("one"),
        json!({"messages": [], "max_tokens": 5}),
        chat("three"),
        json!({"messages": [{"role": "user", "content": "four\nlines"}]}),
    ];
    world
        .enqueue(&json!({"id": "chat-1", "model": "openai/gpt-4o-mini", "requests": requests, "metadata": {"t": 1}}))
        .await;
    let entry = world.wait_for_result("chat-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(entry.model, "openai/gpt-4o-mini");
    assert_eq!((entry.items_total, entry.items_failed), (5, 2));
    assert_eq!(entry.metadata.as_ref().expect("metadata").get(), r#"{"t":1}"#);
    for (index, text) in [(0, "zero"), (3, "three"), (4, "four")] {
        let reply = body(&entry, index);
        assert_eq!(reply["object"], "chat.completion");
        assert_eq!(reply["model"], "gpt-4o-mini", "the model was filled in");
        let content = reply["choices"][0]["message"]["content"].as_str().expect("content");
        assert!(content.contains(text), "item {index}: {content}");
    }
    assert_eq!(error(&entry, 1)["http_status"], 500);
    assert_eq!(error(&entry, 1)["code"], "server_error");
    let refused = error(&entry, 2);
    assert_eq!(refused["http_status"], 400, "{refused}");
    assert!(!refused["code"].as_str().unwrap_or_default().is_empty() && refused["message"].is_string(), "{refused}");
    assert!(entry.result.as_ref().expect("result").usage["total_tokens"].as_u64().expect("usage") > 0);
    assert_eq!(entry.request_ids.len(), 1);
    assert!(entry.request_ids[0].starts_with("batch_"));
    assert_eq!(successful(&world, OpenAiCallKind::Upload), 1);
    assert_eq!(successful(&world, OpenAiCallKind::CreateBatch), 1);
    // Input, output and error files deleted once the result was stored.
    wait_until("files deleted", WAIT, async || openai.file_ids().is_empty()).await;
    assert_eq!(successful(&world, OpenAiCallKind::DeleteFile), 3);
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_job_over_max_requests_is_split_into_batches_and_merged_in_order() {
    let world = openai_world(|settings| settings.openai.max_requests = 3).await;
    let daemon = world.daemon();
    let requests: Vec<Value> = (0..8).map(|i| chat(&format!("item-{i}"))).collect();
    world.enqueue(&json!({"id": "split-1", "model": "openai/gpt-4o-mini", "requests": requests})).await;
    let entry = world.wait_for_result("split-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(entry.items_failed, 0);
    for index in 0..8 {
        let content = body(&entry, index)["choices"][0]["message"]["content"].as_str().expect("content").to_owned();
        assert!(content.contains(&format!("item-{index}")), "item {index}: {content}");
    }
    assert_eq!(entry.request_ids.len(), 3);
    assert_eq!(successful(&world, OpenAiCallKind::CreateBatch), 3);
    daemon.stop().await.expect("stop");
}

/// Issue 38: a job that ends with its batch still running (its deadline passed) leaves nothing running or stored
/// at OpenAI that it could settle: the batch is cancelled and the input file deleted, counted.
#[tokio::test]
async fn a_job_that_expires_while_its_batch_runs_cancels_the_batch_and_deletes_its_input_file() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    openai.set_timing(batchd_emulator::OpenAiTiming {
        in_progress_for: Duration::from_secs(600),
        ..batchd_emulator::OpenAiTiming::default()
    });
    let daemon = world.daemon();
    world
        .enqueue(&json!({"id": "late-1", "model": "openai/gpt-4o-mini", "requests": [chat("a")], "deadline_secs": 2}))
        .await;
    let entry = world.wait_for_result("late-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Expired, "{:?}", entry.error);
    wait_until("the running batch is cancelled and its input file deleted", WAIT, async || {
        successful(&world, OpenAiCallKind::CancelBatch) == 1 && openai.file_ids().is_empty()
    })
    .await;
    assert_eq!(openai.batch_count(), 1);
    daemon.stop().await.expect("stop");
}

/// Issue 38: a batch whose results are over `openai.max_result_bytes` fails its chunk unread; its three files
/// (the input, and the output and error files the batch names) are deleted all the same.
#[tokio::test]
async fn a_batch_whose_results_are_too_large_to_read_still_has_its_files_deleted() {
    let world = openai_world(|settings| settings.openai.max_result_bytes = 64).await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::fail_items([1]));
    let daemon = world.daemon();
    world
        .enqueue(&json!({"id": "big-1", "model": "openai/gpt-4o-mini", "requests": [chat("a"), chat("b"), chat("c")]}))
        .await;
    let entry = world.wait_for_result("big-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Failed, "{:?}", entry.error);
    assert_eq!(entry.error.as_ref().expect("error").code, "reply_too_large");
    wait_until("the input, output and error files are deleted", WAIT, async || openai.file_ids().is_empty()).await;
    assert_eq!(successful(&world, OpenAiCallKind::DeleteFile), 3);
    daemon.stop().await.expect("stop");
}

/// Issue 34: a status endpoint that answers 503 for longer than `retry.max_attempts` polls in a row (4 in the
/// tests) does not give the running batch up: it is polled until it answers, one batch, one completed result.
#[tokio::test]
async fn a_status_outage_longer_than_the_attempts_ends_with_the_batch_read_not_abandoned() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::status(503).on(OpenAiCallKind::GetBatch).times(10));
    let daemon = world.daemon();
    world.enqueue(&json!({"id": "outage-1", "model": "openai/gpt-4o-mini", "requests": [chat("a")]})).await;
    let entry = world.wait_for_result("outage-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    let failed = openai.calls_of(OpenAiCallKind::GetBatch).iter().filter(|call| call.http_status == 503).count();
    assert_eq!(failed, 10, "every fault was met");
    assert_eq!(openai.batch_count(), 1, "one batch");
    daemon.stop().await.expect("stop");
}

/// Issue 34: an account out of quota (`insufficient_quota`, which OpenAI answers with HTTP 429) fails the job at
/// once, saying so, instead of waiting like a rate limit until the deadline; the input file is deleted.
#[tokio::test]
async fn an_account_out_of_quota_fails_the_job_at_once_saying_why() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    openai.inject(
        OpenAiFault::status(429)
            .code("insufficient_quota")
            .message("You exceeded your current quota, please check your plan and billing details.")
            .on(OpenAiCallKind::CreateBatch)
            .times(100),
    );
    let daemon = world.daemon();
    world.enqueue(&json!({"id": "broke-1", "model": "openai/gpt-4o-mini", "requests": [chat("a")]})).await;
    let entry = world.wait_for_result("broke-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Failed);
    let error = entry.error.as_ref().expect("error");
    assert_eq!(error.code, "api_error");
    assert!(error.message.starts_with("the provider account cannot pay for batches"), "{}", error.message);
    assert!(error.message.contains("exceeded your current quota"), "{}", error.message);
    assert_eq!(openai.calls_of(OpenAiCallKind::CreateBatch).len(), 1, "one create, not a wait until the deadline");
    wait_until("the input file is deleted", WAIT, async || openai.file_ids().is_empty()).await;
    daemon.stop().await.expect("stop");
}

/// Issue 34: the files batchd leaves at OpenAI expire on their own (`openai.file_expiry_secs`, 3 days by
/// default): the upload carries `expires_after`, the create `output_expires_after`, so the input, output and error
/// files report `expires_at` = `created_at` + the setting (checked with `delete_files` off, so they stay).
#[tokio::test]
async fn uploaded_and_result_files_expire_on_their_own() {
    let world = openai_world(|settings| {
        settings.openai.delete_files = false;
        settings.openai.file_expiry_secs = 7200;
    })
    .await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::fail_items([1]));
    let daemon = world.daemon();
    world
        .enqueue(&json!({"id": "expiring-1", "model": "openai/gpt-4o-mini", "requests": [chat("a"), chat("b")]}))
        .await;
    let entry = world.wait_for_result("expiring-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    let batch = retrieve(&world, &entry.request_ids[0]).await;
    let files =
        ["input_file_id", "output_file_id", "error_file_id"].map(|key| batch[key].as_str().expect(key).to_owned());
    for file in files {
        let object = get(&world, &format!("files/{file}")).await;
        let (created, expires) = (object["created_at"].as_u64().expect("created"), object["expires_at"].as_u64());
        assert_eq!(expires, Some(created + 7200), "{object}");
    }
    daemon.stop().await.expect("stop");
}

/// Issue 37: a batch whose every request failed has an error file and no output file (OpenAI's docs: the output
/// file holds the successful responses). The job completes, every item answered with its error, in order.
#[tokio::test]
async fn a_batch_whose_every_request_failed_has_no_output_file_and_answers_each_item() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::fail_items([0, 1, 2]));
    let daemon = world.daemon();
    world
        .enqueue(
            &json!({"id": "all-failed", "model": "openai/gpt-4o-mini", "requests": [chat("a"), chat("b"), chat("c")]}),
        )
        .await;
    let entry = world.wait_for_result("all-failed", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!((entry.items_total, entry.items_failed), (3, 3));
    for index in 0..3 {
        assert_eq!(error(&entry, index)["http_status"], 500, "item {index}");
    }
    let batch = retrieve(&world, &entry.request_ids[0]).await;
    assert!(batch["output_file_id"].is_null() && batch["error_file_id"].is_string(), "{batch}");
    daemon.stop().await.expect("stop");
}

/// Issue 37: a results download that fails (a 500, then a reset) is retried from the batch, which is kept: one
/// batch, one completed result.
#[tokio::test]
async fn a_failed_results_download_is_retried_from_the_batch() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::status(500).on(OpenAiCallKind::FileContent));
    openai.inject(OpenAiFault::reset().on(OpenAiCallKind::FileContent));
    let daemon = world.daemon();
    world
        .enqueue(&json!({"id": "download-1", "model": "openai/gpt-4o-mini", "requests": [chat("a"), chat("b")]}))
        .await;
    let entry = world.wait_for_result("download-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(body(&entry, 1)["object"], "chat.completion");
    let downloads: Vec<u16> =
        openai.calls_of(OpenAiCallKind::FileContent).iter().map(|call| call.http_status).collect();
    assert_eq!(downloads, [500, 0, 200], "a 500, a reset (no status), then the download");
    assert_eq!(openai.batch_count(), 1);
    daemon.stop().await.expect("stop");
}

/// Issue 37: the look after an uncertain create reads past the first page of `GET /v1/batches` (100 newest first)
/// when more than 100 batches were created after the chunk's: the batch is found on the second page, not created
/// again.
#[tokio::test]
async fn a_look_up_reads_past_the_first_page_of_batches() {
    let world = openai_world(|settings| settings.retry.max_backoff_ms = 30_000).await;
    let openai = world.emulator.openai();
    // The chunk's create makes its batch and its reply is lost (a 500 asking to come back in 15 s): meanwhile
    // another deployment on the account creates 120 batches.
    openai.inject(OpenAiFault::status(500).retry_after(15).on(OpenAiCallKind::CreateBatch).after_handling());
    let daemon = world.daemon();
    world.enqueue(&json!({"id": "paged-1", "model": "openai/gpt-4o-mini", "requests": [chat("a")]})).await;
    wait_until("the chunk's create was answered", WAIT, async || {
        !openai.calls_of(OpenAiCallKind::CreateBatch).is_empty()
    })
    .await;
    let client = reqwest::Client::new();
    let base = world.emulator.openai_base_url();
    let key = openai.api_key();
    let line = r#"{"custom_id":"x","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini","messages":[]}}"#;
    let boundary = "other-deployment";
    let upload = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"other.jsonl\"\r\n\r\n{line}\n\r\n--{boundary}--\r\n"
    );
    for _ in 0..120 {
        let file: Value = client
            .post(format!("{base}/files"))
            .bearer_auth(key)
            .header("content-type", format!("multipart/form-data; boundary={boundary}"))
            .body(upload.clone())
            .send()
            .await
            .expect("upload")
            .json()
            .await
            .expect("file");
        let create =
            json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"});
        let reply = client.post(format!("{base}/batches")).bearer_auth(key).json(&create).send().await.expect("create");
        assert!(reply.status().is_success(), "{}", reply.status());
    }
    assert!(openai.calls_of(OpenAiCallKind::ListBatches).is_empty(), "the 120 were created before the look");
    let entry = world.wait_for_result("paged-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(openai.batch_count(), 121, "the chunk's batch was found, not created again");
    assert_eq!(openai.calls_of(OpenAiCallKind::ListBatches).len(), 2, "one look of two pages");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_rate_limited_create_is_retried_without_a_second_batch() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::status(429).retry_after(1).on(OpenAiCallKind::CreateBatch).times(2));
    let daemon = world.daemon();
    world.enqueue(&json!({"id": "limited-1", "model": "openai/gpt-4o-mini", "requests": [chat("a"), chat("b")]})).await;
    let entry = world.wait_for_result("limited-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    let creates = openai.calls_of(OpenAiCallKind::CreateBatch);
    assert_eq!(creates.iter().filter(|call| call.http_status == 429).count(), 2);
    assert_eq!(openai.batch_count(), 1, "one batch for the chunk");
    let ledger = world.ledger("limited-1").await;
    assert_eq!(ledger.get("possible_duplicate_submits").map(String::as_str).unwrap_or("0"), "0");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn an_uncertain_create_is_resolved_by_looking_the_batch_up_not_by_creating_another() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    // The create makes its batch, then its reply is replaced by a 500: batchd cannot know it worked.
    openai.inject(OpenAiFault::status(500).on(OpenAiCallKind::CreateBatch).after_handling());
    let daemon = world.daemon();
    world
        .enqueue(&json!({"id": "uncertain-1", "model": "openai/gpt-4o-mini", "requests": [chat("a"), chat("b")]}))
        .await;
    let entry = world.wait_for_result("uncertain-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(openai.batch_count(), 1, "no second batch was created");
    assert_eq!(openai.calls_of(OpenAiCallKind::CreateBatch).len(), 1, "the resumed submit did not create");
    assert!(!openai.calls_of(OpenAiCallKind::ListBatches).is_empty(), "it looked the batch up");
    assert_eq!(successful(&world, OpenAiCallKind::Upload), 1, "the recorded input file was the only upload");
    assert_eq!(body(&entry, 1)["object"], "chat.completion");
    daemon.stop().await.expect("stop");
}

/// Seen in the chaos runs (scenarios 1 and 5): after an uncertain create, the look-up of the next attempt failed
/// (a 503 on the list), the chunk was then taken for one that had certainly created nothing, and the attempt after
/// created a second batch without looking. A failed look leaves the earlier create uncertain.
#[tokio::test]
async fn a_failed_look_up_after_an_uncertain_create_is_tried_again_before_creating() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::status(500).on(OpenAiCallKind::CreateBatch).after_handling());
    openai.inject(OpenAiFault::status(503).on(OpenAiCallKind::ListBatches));
    let daemon = world.daemon();
    world.enqueue(&json!({"id": "look-1", "model": "openai/gpt-4o-mini", "requests": [chat("a")]})).await;
    let entry = world.wait_for_result("look-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(openai.batch_count(), 1, "no second batch was created");
    let lists: Vec<u16> = openai.calls_of(OpenAiCallKind::ListBatches).iter().map(|call| call.http_status).collect();
    assert_eq!(lists, [503, 200], "it looked again after the failed look");
    daemon.stop().await.expect("stop");
}

/// Seen in the chaos runs (scenario 3a): a replica paused past its lease had its create certainly refused and
/// deleted its input file, while the replica that took the chunk over resumed with that file recorded. The resumed
/// submit now uploads the file again instead of failing the job on the API's 404.
#[tokio::test]
async fn a_recorded_input_file_that_is_gone_is_uploaded_again() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    // The create's connection drops before it is handled (no batch; batchd cannot know), and the resumed submit's
    // look-up waits 1 s, in which the recorded file is deleted, as the other replica would.
    openai.inject(OpenAiFault::reset().on(OpenAiCallKind::CreateBatch));
    openai.inject(OpenAiFault::delay(Duration::from_secs(1)).on(OpenAiCallKind::ListBatches));
    let daemon = world.daemon();
    world.enqueue(&json!({"id": "gone-1", "model": "openai/gpt-4o-mini", "requests": [chat("a")]})).await;
    wait_until("the first create dropped", WAIT, async || !openai.calls_of(OpenAiCallKind::CreateBatch).is_empty())
        .await;
    let file = openai.calls_of(OpenAiCallKind::Upload)[0].file_id.clone().expect("the uploaded file");
    let deleted = reqwest::Client::new()
        .delete(format!("{}/files/{file}", world.emulator.openai_base_url()))
        .bearer_auth(openai.api_key())
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 200);
    let entry = world.wait_for_result("gone-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    let creates: Vec<u16> = openai.calls_of(OpenAiCallKind::CreateBatch).iter().map(|call| call.http_status).collect();
    assert_eq!(creates, [0, 404, 200], "dropped, refused for the gone file, created with the new one");
    assert_eq!(successful(&world, OpenAiCallKind::Upload), 2, "uploaded again");
    assert_eq!(openai.batch_count(), 1);
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn the_enqueued_token_limit_backs_off_and_creates_again_with_the_same_file() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::token_limit_exceeded());
    let daemon = world.daemon();
    world.enqueue(&json!({"id": "tokens-1", "model": "openai/gpt-4o-mini", "requests": [chat("a")]})).await;
    let entry = world.wait_for_result("tokens-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(successful(&world, OpenAiCallKind::CreateBatch), 2, "created again after the refusal");
    assert_eq!(successful(&world, OpenAiCallKind::Upload), 1, "with the same input file");
    let statuses: Vec<&str> = openai.batch_statuses().into_iter().map(|(_, status)| status).collect();
    assert!(statuses.contains(&"failed") && statuses.contains(&"completed"), "{statuses:?}");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn an_expired_batch_gives_the_results_that_finished_and_the_rest_as_expired() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    let mut timing = openai.timing();
    timing.completion_window = Duration::from_millis(800);
    openai.set_timing(timing);
    openai.inject(OpenAiFault::stall(2));
    let daemon = world.daemon();
    let requests: Vec<Value> = (0..5).map(|i| chat(&format!("item-{i}"))).collect();
    // A deadline under the resend room (5 min): the expired requests are not sent again (tests/it/deadline.rs).
    world
        .enqueue(&json!({"id": "expired-1", "model": "openai/gpt-4o-mini", "requests": requests, "deadline_secs": 60}))
        .await;
    let entry = world.wait_for_result("expired-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    let output = entry.result.as_ref().expect("result");
    let succeeded: Vec<usize> = output.responses.iter().filter(|r| r.success).map(|r| r.index).collect();
    assert_eq!(succeeded.len(), 2, "the two requests that ran before the window closed");
    for response in output.responses.iter().filter(|r| !r.success) {
        let error: Value = serde_json::from_str(response.error.as_ref().expect("error").get()).expect("json");
        assert_eq!(error["code"], "batch_expired", "{error}");
    }
    assert_eq!(openai.batch_statuses()[0].1, "expired");
    daemon.stop().await.expect("stop");
}

fn error_code(entry: &ResultEntry, index: usize) -> String {
    error(entry, index)["code"].as_str().expect("code").to_owned()
}

/// The batch `id` as the API reports it (`GET /v1/batches/{id}`).
async fn retrieve(world: &World, id: &str) -> Value {
    get(world, &format!("batches/{id}")).await
}

/// `GET <base>/<path>` at the emulator's OpenAI API, as JSON.
async fn get(world: &World, path: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{}/{path}", world.emulator.openai_base_url()))
        .bearer_auth(world.emulator.openai().api_key())
        .send()
        .await
        .expect("retrieve")
        .json()
        .await
        .expect("batch json")
}

/// Waits until the job's chunk `chunk` is polling a batch that has finished `n` requests; returns its id.
async fn polling_with_finished(world: &World, job_id: &str, chunk: u32, n: u64) -> String {
    let id = async || world.ledger(job_id).await.get(&format!("c{chunk}:request_id")).cloned();
    wait_until("the batch is polled", WAIT, async || id().await.is_some()).await;
    let id = id().await.expect("request id");
    wait_until("its requests ran", WAIT, async || retrieve(world, &id).await["request_counts"]["completed"] == n).await;
    id
}

#[tokio::test]
async fn cancelling_a_job_cancels_its_batch_and_waits_for_the_responses_it_finished() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    // Two requests finish, then the batch makes no progress until it is cancelled.
    openai.inject(OpenAiFault::stall(2));
    let mut timing = openai.timing();
    timing.cancelling_for = Duration::from_millis(600);
    openai.set_timing(timing);
    let daemon = world.daemon();
    let requests: Vec<Value> = (0..5).map(|i| chat(&format!("item-{i}"))).collect();
    world.enqueue(&json!({"id": "cancel-1", "model": "openai/gpt-4o-mini", "requests": requests})).await;
    polling_with_finished(&world, "cancel-1", 0, 2).await;
    world.cancel("cancel-1", "not needed").await;
    let entry = world.wait_for_result("cancel-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Cancelled);
    let message = &entry.error.as_ref().expect("error").message;
    assert!(message.contains("cancelled on request (not needed)"), "{message}");
    assert!(message.contains("the responses they finished are included"), "{message}");
    // The result waited for the batch to end: it holds what ran before the cancel, the rest not run.
    let output = entry.result.as_ref().expect("the partial result");
    let succeeded: Vec<usize> = output.responses.iter().filter(|r| r.success).map(|r| r.index).collect();
    assert_eq!(succeeded.len(), 2, "the two requests that ran before the cancel");
    for index in (0..5).filter(|index| !succeeded.contains(index)) {
        assert_eq!(error_code(&entry, index), "batch_cancelled", "item {index}");
    }
    assert_eq!((entry.items_total, entry.items_failed), (5, 3));
    assert_eq!(openai.batch_statuses(), [(entry.request_ids[0].clone(), "cancelled")]);
    let cancels = openai.calls_of(OpenAiCallKind::CancelBatch);
    assert_eq!(cancels.len(), 1, "asked once: later polls saw it cancelling");
    assert_eq!(cancels[0].batch_id.as_deref(), Some(entry.request_ids[0].as_str()));
    let polls = openai.calls_of(OpenAiCallKind::GetBatch);
    assert!(polls.iter().any(|poll| poll.at_ms > cancels[0].at_ms), "polled after the cancel until it ended");
    // Its files (input, output, error) were deleted once the results were stored.
    wait_until("files deleted", WAIT, async || openai.file_ids().is_empty()).await;
    assert_eq!(world.ledger("cancel-1").await["state"], "cancelled");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_cancelled_job_keeps_what_its_running_batch_finished_and_its_unsent_batch_is_not_run() {
    // Chunks of 3 requests; one create per hour, so the second chunk waits to be sent when the cancel comes.
    let world = openai_world(|settings| {
        settings.openai.max_requests = 3;
        settings.openai.batches_per_hour = 1;
        settings.openai.burst = 1;
    })
    .await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::stall(1));
    let daemon = world.daemon();
    let requests: Vec<Value> = (0..5).map(|i| chat(&format!("item-{i}"))).collect();
    world.enqueue(&json!({"id": "cancel-2", "model": "openai/gpt-4o-mini", "requests": requests})).await;
    // Whichever chunk took the hour's one create runs; the other waits, unsent.
    wait_until("a batch is polled", WAIT, async || {
        world.ledger("cancel-2").await.values().any(|value| value.starts_with("batch_"))
    })
    .await;
    let sent = u32::from(!world.ledger("cancel-2").await.contains_key("c0:request_id"));
    polling_with_finished(&world, "cancel-2", sent, 1).await;
    assert_eq!(world.ledger("cancel-2").await[&format!("c{}:state", 1 - sent)], "pending");
    world.cancel("cancel-2", "not needed").await;
    let entry = world.wait_for_result("cancel-2", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Cancelled);
    let (ran, unsent) = if sent == 0 { (0..3, 3..5) } else { (3..5, 0..3) };
    let output = entry.result.as_ref().expect("the partial result");
    let succeeded: Vec<usize> = output.responses.iter().filter(|r| r.success).map(|r| r.index).collect();
    assert_eq!(succeeded.len(), 1, "the one request of the sent batch that ran: {succeeded:?}");
    assert!(ran.contains(&succeeded[0]), "{succeeded:?}");
    for index in ran.filter(|index| !succeeded.contains(index)) {
        assert_eq!(error_code(&entry, index), "batch_cancelled", "item {index}");
    }
    for index in unsent {
        assert_eq!(error_code(&entry, index), "not_run", "item {index} was never sent");
    }
    assert_eq!(successful(&world, OpenAiCallKind::CreateBatch), 1, "the second batch was never created");
    assert_eq!(openai.batch_statuses()[0].1, "cancelled");
    assert_eq!(entry.request_ids.len(), 1);
    daemon.stop().await.expect("stop");
}

/// A cancelled job's succeeded responses (by index; none without a partial result) and its message.
fn cancelled(entry: &ResultEntry) -> (Vec<usize>, String) {
    assert_eq!(entry.status, ResultStatus::Cancelled, "{:?}", entry.error);
    let responses = entry.result.as_ref().map(|output| output.responses.as_slice()).unwrap_or_default();
    let succeeded = responses.iter().filter(|r| r.success).map(|r| r.index).collect();
    (succeeded, entry.error.as_ref().expect("error").message.clone())
}

/// Issue 23: a cancel that arrives while the chunk's create is in flight (held 2 s before the API makes the batch)
/// waits for it: the create records its batch, whose poll cancels it; the job is not concluded "nothing had been
/// sent" while its batch goes on running, unread.
#[tokio::test]
async fn a_cancel_while_the_create_is_in_flight_waits_for_it_and_cancels_its_batch() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::delay(Duration::from_secs(2)).on(OpenAiCallKind::CreateBatch));
    openai.inject(OpenAiFault::stall(1));
    let daemon = world.daemon();
    let requests: Vec<Value> = (0..3).map(|i| chat(&format!("item-{i}"))).collect();
    world.enqueue(&json!({"id": "inflight-1", "model": "openai/gpt-4o-mini", "requests": requests})).await;
    wait_until("the create is in flight", WAIT, async || {
        let ledger = world.ledger("inflight-1").await;
        ledger.get("c0:state").map(String::as_str) == Some("submitting")
            && ledger.get("c0:remote").is_some_and(|remote| remote.contains("input_file"))
    })
    .await;
    assert_eq!(openai.batch_count(), 0, "the cancel comes before the batch exists");
    world.cancel("inflight-1", "not needed").await;
    let entry = world.wait_for_result("inflight-1", WAIT).await;
    let (succeeded, message) = cancelled(&entry);
    assert!(message.contains("of its 1 batches at the provider, those still running were cancelled"), "{message}");
    assert_eq!(succeeded.len(), 1, "the request that ran before the cancel: {succeeded:?}");
    assert_eq!(entry.request_ids.len(), 1);
    assert_eq!(openai.batch_statuses(), [(entry.request_ids[0].clone(), "cancelled")], "cancelled at the API");
    assert_eq!(openai.calls_of(OpenAiCallKind::CreateBatch).len(), 1);
    daemon.stop().await.expect("stop");
    assert_eq!(world.results().await.len(), 1, "one result");
}

/// Issue 23: a submit in flight when the cancel arrives that then certainly creates nothing (its create refused
/// with a 429 asking to come back in a minute) ends the job at once, "nothing had been sent", rather than when its
/// retry would have been due.
#[tokio::test]
async fn a_submit_in_flight_that_creates_nothing_ends_the_cancelled_job_at_once() {
    let world = openai_world(|settings| settings.retry.max_backoff_ms = 60_000).await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::delay(Duration::from_secs(2)).on(OpenAiCallKind::Upload));
    openai.inject(OpenAiFault::status(429).retry_after(60).on(OpenAiCallKind::CreateBatch));
    let daemon = world.daemon();
    world.enqueue(&json!({"id": "refused-1", "model": "openai/gpt-4o-mini", "requests": [chat("a")]})).await;
    wait_until("the submit is in flight", WAIT, async || {
        world.ledger("refused-1").await.get("c0:state").map(String::as_str) == Some("submitting")
    })
    .await;
    assert!(openai.calls_of(OpenAiCallKind::CreateBatch).is_empty(), "the cancel comes before the create");
    world.cancel("refused-1", "").await;
    let entry = world.wait_for_result("refused-1", WAIT).await;
    let (succeeded, message) = cancelled(&entry);
    assert_eq!(message, "cancelled on request; nothing had been sent to the provider");
    assert!(succeeded.is_empty());
    assert_eq!(openai.batch_count(), 0);
    assert_eq!(openai.calls_of(OpenAiCallKind::CreateBatch).len(), 1, "refused once, not tried again");
    daemon.stop().await.expect("stop");
}

/// Issue 23: a cancel after an uncertain create (the batch was made, its reply replaced by a 500 asking to come
/// back in a minute) looks the batch up without creating, records it and cancels it: no batch is left running,
/// and no second one is created.
#[tokio::test]
async fn a_cancel_after_an_uncertain_create_finds_its_batch_and_cancels_it_without_creating_another() {
    let world = openai_world(|settings| settings.retry.max_backoff_ms = 60_000).await;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::status(500).retry_after(60).on(OpenAiCallKind::CreateBatch).after_handling());
    openai.inject(OpenAiFault::stall(1));
    let daemon = world.daemon();
    let requests: Vec<Value> = (0..3).map(|i| chat(&format!("item-{i}"))).collect();
    world.enqueue(&json!({"id": "uncertain-cancel", "model": "openai/gpt-4o-mini", "requests": requests})).await;
    wait_until("the create's outcome is unknown", WAIT, async || {
        world.ledger("uncertain-cancel").await.contains_key("c0:uncertain")
    })
    .await;
    assert_eq!(openai.batch_count(), 1, "the batch exists");
    let batch_id = openai.batch_statuses()[0].0.clone();
    wait_until("its first request ran", WAIT, async || {
        retrieve(&world, &batch_id).await["request_counts"]["completed"] == 1
    })
    .await;
    assert!(!world.ledger("uncertain-cancel").await.contains_key("c0:request_id"), "not recorded");
    world.cancel("uncertain-cancel", "not needed").await;
    let entry = world.wait_for_result("uncertain-cancel", WAIT).await;
    let (succeeded, message) = cancelled(&entry);
    assert!(message.contains("of its 1 batches at the provider, those still running were cancelled"), "{message}");
    assert_eq!(succeeded.len(), 1, "the request that ran before the cancel: {succeeded:?}");
    assert_eq!(openai.batch_count(), 1, "no second batch");
    assert_eq!(openai.calls_of(OpenAiCallKind::CreateBatch).len(), 1, "looked up, not created again");
    assert!(!openai.calls_of(OpenAiCallKind::ListBatches).is_empty(), "found by its metadata");
    assert_eq!(openai.batch_statuses(), [(entry.request_ids[0].clone(), "cancelled")], "cancelled at the API");
    daemon.stop().await.expect("stop");
}

/// Issue 23: a batch that stays `cancelling` does not hold the job past `workers.cancel_wait_secs`: the job ends
/// `cancelled` with the batch that had finished, the other asked to cancel once more, and says the wait ran out.
#[tokio::test]
async fn a_batch_that_stays_cancelling_holds_the_job_no_longer_than_the_cancel_wait() {
    let world = openai_world(|settings| {
        settings.openai.max_requests = 2;
        settings.workers.cancel_wait_secs = 2;
    })
    .await;
    let openai = world.emulator.openai();
    // The first batch created runs one request and stalls; once cancelled it stays `cancelling` for an hour.
    openai.inject(OpenAiFault::stall(1));
    let mut timing = openai.timing();
    timing.cancelling_for = Duration::from_secs(3600);
    openai.set_timing(timing);
    let daemon = world.daemon();
    let requests: Vec<Value> = (0..4).map(|i| chat(&format!("item-{i}"))).collect();
    world.enqueue(&json!({"id": "stuck-1", "model": "openai/gpt-4o-mini", "requests": requests})).await;
    let states = async || {
        let ledger = world.ledger("stuck-1").await;
        let mut states = [0, 1].map(|chunk| ledger.get(&format!("c{chunk}:state")).cloned().unwrap_or_default());
        states.sort();
        states
    };
    wait_until("one batch finished, the other stalled", WAIT, async || states().await == ["done", "polling"]).await;
    let ledger = world.ledger("stuck-1").await;
    let stalled = u32::from(ledger["c1:state"] == "polling");
    polling_with_finished(&world, "stuck-1", stalled, 1).await;
    world.cancel("stuck-1", "not needed").await;
    let entry = world.wait_for_result("stuck-1", WAIT).await;
    let (succeeded, message) = cancelled(&entry);
    assert!(message.contains("the wait for them to end ran out (workers.cancel_wait_secs, 2s)"), "{message}");
    assert!(message.contains("(1 asked to cancel again)"), "{message}");
    let finished = if stalled == 0 { [2, 3] } else { [0, 1] };
    assert_eq!(succeeded, finished, "the batch that had finished is in the result");
    assert_eq!((entry.items_total, entry.items_failed), (4, 2));
    let ledger = world.ledger("stuck-1").await;
    let seen_at: u64 = ledger["cancel_seen_at"].parse().expect("recorded when the cancel was first seen");
    let finished_at: u64 = ledger["finished_at"].parse().expect("finished");
    assert!(finished_at >= seen_at + 2_000, "ended after the wait: {seen_at} -> {finished_at}");
    let stalled_id = &ledger[&format!("c{stalled}:request_id")];
    let cancels: Vec<_> = openai.calls_of(OpenAiCallKind::CancelBatch);
    assert_eq!(cancels.len(), 2, "cancelled, then asked once more when the wait ran out");
    assert!(cancels.iter().all(|call| call.batch_id.as_deref() == Some(stalled_id.as_str())));
    assert_eq!(retrieve(&world, stalled_id).await["status"], "cancelling");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_crash_between_create_and_record_creates_no_second_batch() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    // The create makes its batch at once and holds its reply back: the replica dies before it can record it.
    openai.inject(OpenAiFault::delay(Duration::from_secs(30)).on(OpenAiCallKind::CreateBatch).after_handling());
    let first = world.daemon();
    world.enqueue(&json!({"id": "crashed-1", "model": "openai/gpt-4o-mini", "requests": [chat("a"), chat("b")]})).await;
    wait_until("the create to reach the API", WAIT, async || openai.batch_count() == 1).await;
    first.crash().await;
    // Another replica takes the chunk over once its lease runs out, and looks the batch up before creating.
    let second = world.daemon();
    let entry = world.wait_for_result("crashed-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(openai.batch_count(), 1, "no second batch");
    assert_eq!(openai.calls_of(OpenAiCallKind::CreateBatch).len(), 1, "the resumed submit did not create");
    assert_eq!(successful(&world, OpenAiCallKind::Upload), 1, "the recorded input file was reused");
    assert!(!openai.calls_of(OpenAiCallKind::ListBatches).is_empty(), "it looked the batch up");
    assert_eq!(world.ledger("crashed-1").await["possible_duplicate_submits"], "1", "the uncertainty is counted");
    assert_eq!(body(&entry, 1)["object"], "chat.completion");
    second.stop().await.expect("stop");
}

#[tokio::test]
async fn a_file_the_api_refuses_as_too_large_is_split_and_merged_in_order() {
    let world = openai_world(|_| {}).await;
    let openai = world.emulator.openai();
    // The API's upload limit is lower than batchd's: the first uploads are refused with `file_too_large`.
    let mut limits = openai.limits();
    limits.max_file_bytes = 1500;
    openai.set_limits(limits);
    let daemon = world.daemon();
    let padding = "x".repeat(200);
    let requests: Vec<Value> = (0..8).map(|i| chat(&format!("item-{i} {padding}"))).collect();
    world.enqueue(&json!({"id": "too-large-1", "model": "openai/gpt-4o-mini", "requests": requests})).await;
    let entry = world.wait_for_result("too-large-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    for index in 0..8 {
        let content = body(&entry, index)["choices"][0]["message"]["content"].as_str().expect("content").to_owned();
        assert!(content.contains(&format!("item-{index} ")), "item {index}: {content}");
    }
    let uploads = openai.calls_of(OpenAiCallKind::Upload);
    assert!(uploads.iter().any(|call| call.error_code.as_deref() == Some("file_too_large")), "a refusal");
    assert_eq!(successful(&world, OpenAiCallKind::CreateBatch), entry.request_ids.len());
    assert!(entry.request_ids.len() > 1, "split into {} batches", entry.request_ids.len());
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_60000_line_job_is_split_into_batches_of_50000_and_merged_in_order() {
    let world = openai_world(|settings| {
        settings.openai.request_timeout_secs = 60;
        settings.schedule.lease_secs = 120;
    })
    .await;
    let daemon = world.daemon();
    let n = 60_000;
    let requests: Vec<Value> = (0..n).map(|i| json!({"input": format!("i{i}"), "dimensions": 1})).collect();
    world
        .enqueue(&json!({
            "id": "sixty-k",
            "model": "openai/text-embedding-3-small",
            "endpoint": "/v1/embeddings",
            "requests": requests,
        }))
        .await;
    let entry = world.wait_for_result("sixty-k", Duration::from_secs(240)).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!((entry.items_total, entry.items_failed), (n, 0));
    let output = entry.result.as_ref().expect("result");
    assert!(output.responses.iter().enumerate().all(|(index, response)| response.index == index && response.success));
    // The API's own account of each batch: `request_counts.total`.
    let mut sizes = Vec::new();
    for id in &entry.request_ids {
        let batch = retrieve(&world, id).await;
        assert_eq!(batch["status"], "completed", "{batch}");
        sizes.push(batch["request_counts"]["total"].as_u64().expect("total"));
    }
    assert_eq!(sizes, [50_000, 10_000], "two batches: the API's 50,000 lines, then the rest");
    daemon.stop().await.expect("stop");
}

/// The polls-per-batch figures of docs/providers.md come from `policy::polls_until`; this checks the daemon
/// against it, from the emulator's call log: never a poll sooner than the schedule says, never more polls than
/// it counts.
#[tokio::test]
async fn a_batch_is_polled_no_more_often_than_the_schedule_the_docs_count_with() {
    let world = openai_world(|settings| {
        settings.poll.initial_interval_ms = 100;
        settings.poll.multiplier = 1.5;
        settings.poll.max_interval_ms = 400;
        settings.poll.jitter = 0.0;
    })
    .await;
    let openai = world.emulator.openai();
    let mut timing = openai.timing();
    (timing.validating_for, timing.in_progress_for, timing.finalizing_for) =
        (Duration::from_millis(200), Duration::from_millis(1000), Duration::from_millis(200));
    openai.set_timing(timing);
    let ends_after = Duration::from_millis(1400);
    let daemon = world.daemon();
    world.enqueue(&json!({"id": "polls-1", "model": "openai/gpt-4o-mini", "requests": [chat("a")]})).await;
    let entry = world.wait_for_result("polls-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    let created = openai.calls_of(OpenAiCallKind::CreateBatch)[0].at_ms;
    let polls: Vec<u64> = openai
        .calls_of(OpenAiCallKind::GetBatch)
        .into_iter()
        .filter(|call| call.batch_id.as_deref() == Some(entry.request_ids[0].as_str()))
        .map(|call| call.at_ms)
        .collect();
    let schedule = &world.settings.poll;
    // The emulator's clock starts the batch when it handles the create, a little after the call arrived.
    let most = batchd_engine::policy::polls_until(ends_after + Duration::from_millis(50), schedule, 0.5);
    assert!((2..=most as usize).contains(&polls.len()), "{} polls, at most {most}: {polls:?}", polls.len());
    let mut previous = created;
    for (n, at) in polls.iter().enumerate() {
        let delay = batchd_engine::policy::next_poll_delay(n as u64, schedule, 0.5).as_millis() as u64;
        assert!(
            at + 10 >= previous + delay,
            "poll {} came {} ms after the one before, sooner than {delay} ms",
            n + 1,
            at - previous
        );
        previous = *at;
    }
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn embeddings_and_responses_jobs_go_to_their_endpoint_and_an_unknown_endpoint_fails_the_job() {
    let world = openai_world(|_| {}).await;
    let daemon = world.daemon();
    world
        .enqueue(&json!({
            "id": "emb-1",
            "model": "openai/text-embedding-3-small",
            "endpoint": "/v1/embeddings",
            "requests": [{"input": "one"}, {"input": ["two", "three"], "dimensions": 4}, {"input": "four"}],
        }))
        .await;
    world
        .enqueue(&json!({
            "id": "resp-1",
            "model": "openai/gpt-4.1-mini",
            "endpoint": "/v1/responses",
            "requests": [{"input": "first"}, {"no_input": true}, {"input": "third"}],
        }))
        .await;
    world
        .enqueue(&json!({"id": "bad-endpoint", "model": "openai/m", "endpoint": "/v1/audio/speech", "requests": [{}]}))
        .await;

    let embeddings = world.wait_for_result("emb-1", WAIT).await;
    assert_eq!(embeddings.status, ResultStatus::Completed, "{:?}", embeddings.error);
    assert_eq!(embeddings.items_failed, 0);
    let second = body(&embeddings, 1);
    assert_eq!(second["object"], "list");
    assert_eq!(second["data"].as_array().expect("vectors").len(), 2, "one vector per input of item 1");
    assert_eq!(second["data"][0]["embedding"].as_array().expect("vector").len(), 4);
    assert_eq!(body(&embeddings, 0)["data"].as_array().expect("vectors").len(), 1);

    let responses = world.wait_for_result("resp-1", WAIT).await;
    assert_eq!(responses.status, ResultStatus::Completed, "{:?}", responses.error);
    assert_eq!(responses.items_failed, 1);
    assert_eq!(body(&responses, 0)["object"], "response");
    assert!(body(&responses, 2).to_string().contains("third"));
    assert_eq!(error(&responses, 1)["http_status"], 400);
    assert!(responses.result.as_ref().expect("result").usage["input_tokens"].as_u64().expect("usage") > 0);

    let refused = world.wait_for_result("bad-endpoint", WAIT).await;
    assert_eq!(refused.status, ResultStatus::Failed);
    assert!(
        refused.error.as_ref().expect("error").message.contains("no endpoint \"/v1/audio/speech\""),
        "{:?}",
        refused.error
    );
    let creates = world.emulator.openai().calls_of(OpenAiCallKind::CreateBatch);
    assert_eq!(creates.len(), 2, "the unknown endpoint was never sent");
    daemon.stop().await.expect("stop");
}
