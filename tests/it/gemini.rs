//! Gemini Batch Mode through the whole daemon: a producer's `XADD` with `gemini/<model>`, one result entry back,
//! against the emulator's `/gemini` API (its responses shuffled, so only a join on keys passes) and a real Redis.
//! Responses in request order with per-request errors marked; a job above the inline limit sent as a file through
//! the Files API; cancel and deadline; a 429 on create as a wait; an uncertain create looked up by its display name
//! and never repeated, and a listed batch carrying another nonce never adopted.

use std::time::Duration;

use batchd::settings::Settings;
use batchd_core::{ResultEntry, ResultStatus};
use batchd_emulator::{EmulatorConfig, GeminiCallKind, GeminiCalls, GeminiConfig, GeminiFault};
use batchd_tests::{Daemon, World, wait_until, with_anthropic, with_gemini, with_openai};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

const MODEL: &str = "gemini/gemini-2.5-flash";

/// The world's settings with Gemini pointed at the emulator.
fn gemini_settings(world: &World) -> Settings {
    let mut settings = world.settings.clone();
    with_gemini(&mut settings, &world.emulator);
    settings
}

fn item(text: &str) -> Value {
    json!({"contents": [{"role": "user", "parts": [{"text": text}]}]})
}

fn job(id: &str, n: usize) -> Value {
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
            response.result.as_ref().map(|body| {
                let body: Value = serde_json::from_str(body.get()).expect("json");
                body["candidates"][0]["content"]["parts"][0]["text"].as_str().expect("text").to_owned()
            })
        })
        .collect()
}

fn error_code(entry: &ResultEntry, index: usize) -> String {
    let response = &entry.result.as_ref().expect("result").responses[index];
    assert!(!response.success, "item {index} succeeded");
    let error: Value = serde_json::from_str(response.error.as_ref().expect("error").get()).expect("json");
    error["code"].as_str().expect("code").to_owned()
}

fn assert_in_order(entry: &ResultEntry, n: usize) {
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(entry.model, MODEL);
    let texts = texts(entry);
    assert_eq!(texts.len(), n);
    for (index, text) in texts.iter().enumerate() {
        assert_eq!(text.as_deref(), Some(format!("echo: question {index}").as_str()), "item {index}");
    }
}

/// Creates of a status.
fn creates_with(world: &World, status: u16) -> usize {
    world.emulator.gemini().calls_of(GeminiCallKind::Create).iter().filter(|call| call.status == status).count()
}

#[tokio::test]
async fn a_job_completes_in_request_order_with_per_item_failures_and_its_batch_is_deleted() {
    let world = World::new().await;
    let control = world.emulator.gemini();
    let daemon = Daemon::start(gemini_settings(&world), &world.emulator);
    let mut requests: Vec<Value> = (0..6).map(|i| item(&format!("question {i}"))).collect();
    requests[2] = json!({"generationConfig": {"temperature": 0}});
    world.enqueue(&json!({"id": "gem-1", "model": MODEL, "requests": requests})).await;
    let entry = world.wait_for_result("gem-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    let texts = texts(&entry);
    for index in [0, 1, 3, 4, 5] {
        assert_eq!(texts[index].as_deref(), Some(format!("echo: question {index}").as_str()), "item {index}");
    }
    assert_eq!(error_code(&entry, 2), "INVALID_ARGUMENT", "a request without contents fails alone");
    assert_eq!(entry.items_failed, 1);
    let usage = &entry.result.as_ref().expect("result").usage;
    assert_eq!(usage["promptTokenCount"], 10, "two words per answered question, summed: {usage}");
    let creates = control.calls_of(GeminiCallKind::Create);
    assert_eq!(creates.len(), 1);
    assert_eq!(creates[0].n_requests, Some(6));
    assert!(control.calls_of(GeminiCallKind::UploadStart).is_empty(), "small enough to send inline");
    assert_eq!(entry.request_ids, [creates[0].batch_name.clone().expect("batch")]);
    let name = creates[0].display_name.as_deref().expect("display name");
    assert!(name.starts_with("batchd-") && name.ends_with("-0-gem-1"), "{name}");
    wait_until("the ended batch is deleted", WAIT, async || control.batch_names().is_empty()).await;
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn the_sdks_job_state_names_read_like_the_rest_apis() {
    let config = EmulatorConfig {
        gemini: GeminiConfig { job_state_names: true, ..GeminiConfig::default() },
        ..EmulatorConfig::default()
    };
    let world = World::with_emulator(config).await;
    let daemon = Daemon::start(gemini_settings(&world), &world.emulator);
    world.enqueue(&job("gem-job-names", 3)).await;
    assert_in_order(&world.wait_for_result("gem-job-names", WAIT).await, 3);
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_job_above_the_inline_limit_goes_through_the_files_api_and_its_files_are_deleted() {
    let world = World::new().await;
    let control = world.emulator.gemini();
    let mut settings = gemini_settings(&world);
    settings.gemini.max_inline_bytes = 1024;
    let daemon = Daemon::start(settings, &world.emulator);
    // Small: inline. Big (over 1,024 bytes inline): a file.
    world.enqueue(&job("gem-small", 2)).await;
    assert_in_order(&world.wait_for_result("gem-small", WAIT).await, 2);
    assert!(control.calls_of(GeminiCallKind::UploadStart).is_empty());
    world.enqueue(&job("gem-big", 40)).await;
    let entry = world.wait_for_result("gem-big", WAIT).await;
    assert_in_order(&entry, 40);
    assert_eq!(control.calls_of(GeminiCallKind::UploadStart).len(), 1, "one upload");
    assert_eq!(control.calls_of(GeminiCallKind::Download).len(), 1, "the responses file read once");
    let creates = control.calls_of(GeminiCallKind::Create);
    assert_eq!(creates.iter().map(|call| call.n_requests).collect::<Vec<_>>(), [Some(2), Some(40)]);
    wait_until("the batches, the input file and the responses file are deleted", WAIT, async || {
        control.batch_names().is_empty() && control.file_names().is_empty()
    })
    .await;
    daemon.stop().await.expect("stop");
}

/// A model the API does not serve (Google's 404 `NOT_FOUND` on create) fails the job at once as a refusal, naming
/// the API's status; nothing is retried.
#[tokio::test]
async fn an_unknown_model_fails_the_job_at_once_as_a_refusal() {
    let config = EmulatorConfig {
        gemini: GeminiConfig { models: vec!["gemini-2.5-flash".to_owned()], ..GeminiConfig::default() },
        ..EmulatorConfig::default()
    };
    let world = World::with_emulator(config).await;
    let daemon = Daemon::start(gemini_settings(&world), &world.emulator);
    let request = item("a");
    world.enqueue(&json!({"id": "gem-unknown", "model": "gemini/gemini-0.1-none", "requests": [request]})).await;
    let entry = world.wait_for_result("gem-unknown", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Failed, "{entry:?}");
    let error = entry.error.as_ref().expect("error");
    assert_eq!((error.code.as_str(), error.http_status), ("api_error", Some(404)), "{error:?}");
    assert!(error.message.contains("is not found"), "{}", error.message);
    assert_eq!(world.emulator.gemini().calls_of(GeminiCallKind::Create).len(), 1, "a refusal is not retried");
    daemon.stop().await.expect("stop");
}

/// A responses file whose download fails is read again from the batch, which is kept: one batch, one result.
#[tokio::test]
async fn a_failed_download_of_the_responses_file_is_retried_from_the_batch() {
    let world = World::new().await;
    let control = world.emulator.gemini();
    control.inject(GeminiFault::status(503).on(GeminiCalls::Download));
    let mut settings = gemini_settings(&world);
    settings.gemini.max_inline_bytes = 1024;
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&job("gem-download", 40)).await;
    assert_in_order(&world.wait_for_result("gem-download", WAIT).await, 40);
    let downloads: Vec<u16> = control.calls_of(GeminiCallKind::Download).iter().map(|call| call.status).collect();
    assert_eq!(downloads, [503, 200]);
    assert_eq!(control.batch_count(), 1, "one batch");
    daemon.stop().await.expect("stop");
}

/// Gemini beside the three built-ins in one daemon: a job on each completes.
#[tokio::test]
async fn one_daemon_runs_gemini_beside_workers_ai_openai_and_anthropic() {
    let world = World::new().await;
    let mut settings = gemini_settings(&world);
    with_openai(&mut settings, &world.emulator);
    with_anthropic(&mut settings, &world.emulator);
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&job("four-gemini", 2)).await;
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
    world.enqueue(&json!({"id": "four-openai", "model": "openai/gpt-4o-mini", "requests": [chat]})).await;
    let message = json!({"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    world
        .enqueue(&json!({"id": "four-anthropic", "model": "anthropic/claude-sonnet-4-5", "requests": [message]}))
        .await;
    world.enqueue(&batchd_tests::bge_m3_job("four-cloudflare", 1)).await;
    assert_in_order(&world.wait_for_result("four-gemini", WAIT).await, 2);
    for id in ["four-openai", "four-anthropic", "four-cloudflare"] {
        let entry = world.wait_for_result(id, WAIT).await;
        assert_eq!((entry.status, entry.items_failed), (ResultStatus::Completed, 0), "{id}: {:?}", entry.error);
    }
    assert_eq!(world.emulator.gemini().batch_count(), 1, "only the Gemini job went to Gemini");
    daemon.stop().await.expect("stop");
}

/// A world whose batches stay pending until cancelled.
async fn slow_world() -> World {
    let world = World::new().await;
    world.emulator.gemini().set_timing(Duration::from_secs(600), Duration::from_secs(600));
    world
}

/// The batch name of a job's first chunk, once it is polling.
async fn polling_batch(world: &World, job_id: &str) -> String {
    wait_until("the batch is polled", WAIT, async || {
        world.ledger(job_id).await.get("c0:state").map(String::as_str) == Some("polling")
    })
    .await;
    world.ledger(job_id).await["c0:request_id"].clone()
}

#[tokio::test]
async fn cancelling_a_job_cancels_its_batch_and_answers_each_item_as_not_run() {
    let world = slow_world().await;
    let control = world.emulator.gemini();
    let daemon = Daemon::start(gemini_settings(&world), &world.emulator);
    world.enqueue(&job("gem-cancel", 3)).await;
    let batch = polling_batch(&world, "gem-cancel").await;
    world.cancel("gem-cancel", "not needed").await;
    let entry = world.wait_for_result("gem-cancel", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Cancelled);
    for index in 0..3 {
        assert_eq!(error_code(&entry, index), "cancelled", "item {index} did not run");
    }
    let cancels = control.calls_of(GeminiCallKind::Cancel);
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0].batch_name.as_deref(), Some(batch.as_str()));
    wait_until("the cancelled batch is deleted", WAIT, async || control.batch_names().is_empty()).await;
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_job_past_its_deadline_has_its_running_batch_cancelled() {
    let world = slow_world().await;
    let control = world.emulator.gemini();
    let daemon = Daemon::start(gemini_settings(&world), &world.emulator);
    world.enqueue(&json!({"id": "gem-late", "model": MODEL, "requests": [item("a")], "deadline_secs": 2})).await;
    let entry = world.wait_for_result("gem-late", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Expired, "{:?}", entry.error);
    wait_until("the running batch is cancelled", WAIT, async || {
        control.calls_of(GeminiCallKind::Cancel).iter().any(|call| call.status == 200)
    })
    .await;
    assert_eq!(control.batch_count(), 1);
    daemon.stop().await.expect("stop");
}

/// RESOURCE_EXHAUSTED on create, reported well below the quota: a wait that uses no attempt. Five in a row are
/// more than `retry.max_attempts` (4), yet the job completes with one batch.
#[tokio::test]
async fn a_429_on_create_is_a_wait_not_an_attempt() {
    let world = World::new().await;
    let control = world.emulator.gemini();
    control.inject(GeminiFault::status(429).on(GeminiCalls::Create).times(5));
    let daemon = Daemon::start(gemini_settings(&world), &world.emulator);
    world.enqueue(&job("gem-429", 2)).await;
    let entry = world.wait_for_result("gem-429", WAIT).await;
    assert_in_order(&entry, 2);
    assert_eq!((creates_with(&world, 429), creates_with(&world, 200)), (5, 1));
    assert_eq!(control.batch_count(), 1, "one batch");
    let ledger = world.ledger("gem-429").await;
    assert_eq!(ledger.get("possible_duplicate_submits").map_or("0", String::as_str), "0", "a 429 created nothing");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn an_uncertain_create_is_found_by_its_display_name_not_repeated() {
    let world = World::new().await;
    let control = world.emulator.gemini();
    // The batch is created, its reply replaced by a 500.
    control.inject(GeminiFault::status_after(500).on(GeminiCalls::Create));
    let daemon = Daemon::start(gemini_settings(&world), &world.emulator);
    world.enqueue(&job("gem-lost", 4)).await;
    let entry = world.wait_for_result("gem-lost", WAIT).await;
    assert_in_order(&entry, 4);
    assert_eq!(control.calls_of(GeminiCallKind::Create).len(), 1, "no second create");
    assert_eq!(control.batch_count(), 1);
    assert!(!control.calls_of(GeminiCallKind::List).is_empty(), "the retry looked for the batch first");
    assert_eq!(world.ledger("gem-lost").await["possible_duplicate_submits"], "1", "the uncertainty is counted");
    daemon.stop().await.expect("stop");
}

/// Another namespace on the same account holds a batch for the same job id and chunk, under its own nonce: a
/// look-up after this chunk's uncertain create lists it, does not adopt it, and creates the chunk's own.
#[tokio::test]
async fn a_listed_batch_with_another_nonce_is_never_adopted() {
    let world = World::new().await;
    let control = world.emulator.gemini();
    let foreign_name = "batchd-0123456789abcdef-0-gem-foreign";
    let reply: Value = reqwest::Client::new()
        .post(format!("{}/v1beta/models/gemini-2.5-flash:batchGenerateContent", control.base_url()))
        .header("x-goog-api-key", control.api_key())
        .json(&json!({"batch": {"displayName": foreign_name, "inputConfig": {"requests": {"requests": [
            {"request": item("theirs"), "metadata": {"key": "0"}}
        ]}}}}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("operation");
    let foreign = reply["name"].as_str().expect("batch name").to_owned();
    // This chunk's create fails with a 500 before it is handled: it may have created, as far as batchd knows.
    control.inject(GeminiFault::status(500).on(GeminiCalls::Create));
    let daemon = Daemon::start(gemini_settings(&world), &world.emulator);
    world.enqueue(&job("gem-foreign", 2)).await;
    let entry = world.wait_for_result("gem-foreign", WAIT).await;
    assert_in_order(&entry, 2);
    assert!(!control.calls_of(GeminiCallKind::List).is_empty(), "the retry looked first");
    assert_eq!(entry.request_ids.len(), 1);
    assert_ne!(entry.request_ids[0], foreign, "the other namespace's batch was not adopted");
    assert_eq!(control.batch_count(), 2, "the foreign batch and the chunk's own");
    let touched = control.calls().iter().any(|call| {
        call.batch_name.as_deref() == Some(foreign.as_str())
            && matches!(call.kind, GeminiCallKind::Get | GeminiCallKind::Cancel | GeminiCallKind::Delete)
    });
    assert!(!touched, "the foreign batch was neither polled, cancelled nor deleted");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_failed_batch_fails_the_job_saying_why() {
    let world = World::new().await;
    world.emulator.gemini().inject(GeminiFault::fail_batch());
    let daemon = Daemon::start(gemini_settings(&world), &world.emulator);
    world.enqueue(&job("gem-failed", 2)).await;
    let entry = world.wait_for_result("gem-failed", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Failed, "{entry:?}");
    let error = entry.error.as_ref().expect("error");
    assert_eq!(error.code, "batch_failed");
    assert!(error.message.contains("Batch processing failed"), "{}", error.message);
    daemon.stop().await.expect("stop");
}

/// The key comes from `GEMINI_API_KEY` or `BATCHD__GEMINI__API_KEY` (the latter wins) or a file, never from a
/// config file; without one Gemini is not configured; `[gemini]` reaches the client.
#[test]
fn the_key_comes_from_the_environment_or_a_file_and_the_section_reaches_the_client() {
    use std::collections::HashMap;
    let env = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect()
    };
    let load = |pairs: &[(&str, &str)]| Settings::load_from(None, &env(pairs)).expect("settings");
    assert!(load(&[]).gemini_instance().expect("checked").is_none(), "no key, no Gemini");
    let client = load(&[("GEMINI_API_KEY", "gm-secret-1")]).gemini_instance().expect("checked").expect("configured");
    assert_eq!(
        (client.account.as_str(), client.base_url.as_str()),
        ("gemini", "https://generativelanguage.googleapis.com")
    );
    assert_eq!((client.max_inline_bytes, client.lookup_pages), (20_000_000, 10));
    assert!(client.delete_batches);
    assert!(!format!("{client:?}").contains("gm-secret-1"), "the key never prints");
    let own = load(&[("GEMINI_API_KEY", "a"), ("BATCHD__GEMINI__API_KEY", "b"), ("BATCHD__GEMINI__ACCOUNT", "acct-g")]);
    assert_eq!(own.gemini_key().expect("checked").expect("key").expose(), "b", "the BATCHD__ name wins");
    assert_eq!(own.gemini_instance().expect("checked").expect("configured").account, "acct-g");

    let dir = std::env::temp_dir().join(format!("batchd-gemini-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let key_file = dir.join("key");
    std::fs::write(&key_file, "gm-from-file\n").expect("key file");
    let path = key_file.display().to_string();
    let from_file = load(&[("BATCHD__GEMINI__API_KEY_FILE", path.as_str())]);
    assert_eq!(from_file.gemini_key().expect("checked").expect("key").expose(), "gm-from-file");
    let config = dir.join("batchd.toml");
    std::fs::write(&config, "[gemini]\napi_key = \"gm-in-file\"\n").expect("config");
    let error = Settings::load_from(Some(&config), &env(&[])).expect_err("refused").to_string();
    assert!(
        error.contains("gemini.api_key: not allowed in a config file") && error.contains("GEMINI_API_KEY"),
        "{error}"
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}
