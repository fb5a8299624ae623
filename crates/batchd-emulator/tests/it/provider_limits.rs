//! The providers' creation and request limits, over real HTTP: OpenAI's batch creates (429 `rate_limit_exceeded`,
//! `retry-after`, every other call free), Anthropic's requests (every call counts, polls too: 429
//! `rate_limit_error`, `retry-after`), Workers AI's submits (polls free), the documented preset, bursts and refill,
//! and the resets of the control API.

use std::time::{Duration, Instant};

use batchd_emulator::{EmulatorConfig, EmulatorHandle, ProviderLimits, RateLimit};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{LLAMA, Reply, poll, post, start, start_paused, submit};

/// A reply of any of the three APIs.
async fn reply_of(response: reqwest::Response) -> Reply {
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.expect("a body");
    Reply { status, headers, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null) }
}

/// The `retry-after` header in seconds.
fn retry_after(reply: &Reply) -> u64 {
    let value = reply.headers.get("retry-after").expect("a retry-after header");
    value.to_str().expect("ascii").parse().expect("whole seconds")
}

/// The emulator's origin, for the control API.
fn origin(emulator: &EmulatorHandle) -> String {
    emulator.base_url().trim_end_matches("/client/v4").to_owned()
}

async fn control_post(emulator: &EmulatorHandle, path: &str, body: &Value) -> Reply {
    let response = reqwest::Client::new()
        .post(format!("{}/_emulator/{path}", origin(emulator)))
        .json(body)
        .send()
        .await
        .expect("a control reply");
    reply_of(response).await
}

/// Uploads one chat line to the OpenAI emulator and answers the file id.
async fn openai_upload(emulator: &EmulatorHandle) -> String {
    let line = json!({
        "custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": { "model": "gpt-4o-mini", "messages": [{ "role": "user", "content": "hi" }] },
    });
    let part = reqwest::multipart::Part::bytes(format!("{line}\n").into_bytes()).file_name("input.jsonl");
    let form = reqwest::multipart::Form::new().text("purpose", "batch").part("file", part);
    let response = reqwest::Client::new()
        .post(format!("{}/files", emulator.openai_base_url()))
        .bearer_auth(emulator.openai().api_key())
        .multipart(form)
        .send()
        .await
        .expect("an upload reply");
    let reply = reply_of(response).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    reply.body["id"].as_str().expect("a file id").to_owned()
}

async fn openai_create(emulator: &EmulatorHandle, file_id: &str) -> Reply {
    let body = json!({ "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h" });
    let response = reqwest::Client::new()
        .post(format!("{}/batches", emulator.openai_base_url()))
        .bearer_auth(emulator.openai().api_key())
        .json(&body)
        .send()
        .await
        .expect("a create reply");
    reply_of(response).await
}

async fn openai_get(emulator: &EmulatorHandle, path: &str) -> Reply {
    let response = reqwest::Client::new()
        .get(format!("{}{path}", emulator.openai_base_url()))
        .bearer_auth(emulator.openai().api_key())
        .send()
        .await
        .expect("a reply");
    reply_of(response).await
}

/// Asserts the reply is OpenAI's rate-limit error and answers its `retry-after`.
fn assert_openai_rate_limited(reply: &Reply) -> u64 {
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{:?}", reply.body);
    assert_eq!(reply.body["error"]["code"], "rate_limit_exceeded", "{:?}", reply.body);
    assert_eq!(reply.body["error"]["type"], "requests");
    assert_eq!(reply.body["error"]["param"], Value::Null);
    let message = reply.body["error"]["message"].as_str().expect("a message");
    assert!(message.starts_with("Rate limit reached for batch creations"), "{message}");
    assert!(reply.headers.contains_key("x-request-id"));
    retry_after(reply)
}

#[tokio::test]
async fn openai_counts_batch_creates_only_and_answers_429_with_retry_after() {
    let emulator = start(EmulatorConfig::default()).await;
    let file_id = openai_upload(&emulator).await;
    // Three creates a minute, as a window, set through the control API.
    let reply =
        control_post(&emulator, "openai/config", &json!({ "create_limit": { "requests": 3, "per_ms": 60_000 } })).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body["create_limit"], json!({ "requests": 3, "per_ms": 60_000 }));

    let mut batch_ids = Vec::new();
    for _ in 0..3 {
        let reply = openai_create(&emulator, &file_id).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        batch_ids.push(reply.body["id"].as_str().expect("an id").to_owned());
    }
    let refused = openai_create(&emulator, &file_id).await;
    let wait = assert_openai_rate_limited(&refused);
    assert!((50..=60).contains(&wait), "the oldest create leaves the window in about 60 s, not {wait}");
    assert_eq!(emulator.openai().batch_count(), 3, "a refused create makes no batch");

    // Polls, lists and uploads are not creates: they pass.
    for _ in 0..10 {
        assert_eq!(openai_get(&emulator, &format!("/batches/{}", batch_ids[0])).await.status, StatusCode::OK);
    }
    assert_eq!(openai_get(&emulator, "/batches?limit=10").await.status, StatusCode::OK);
    openai_upload(&emulator).await;
    assert_openai_rate_limited(&openai_create(&emulator, &file_id).await);
    assert_eq!(emulator.openai().rate_limited_count(), 2);
    let log = emulator.openai().calls_of(batchd_emulator::OpenAiCallKind::CreateBatch);
    let faults: Vec<Option<&str>> = log.iter().map(|call| call.fault.as_deref()).collect();
    assert_eq!(faults, [None, None, None, Some("rate_limit"), Some("rate_limit")]);
    assert_eq!(log[3].http_status, 429);
    assert_eq!(log[3].error_code.as_deref(), Some("rate_limit_exceeded"));

    // The control API's reset empties the window.
    assert_eq!(control_post(&emulator, "openai/reset", &json!({})).await.status, StatusCode::NO_CONTENT);
    assert_eq!(emulator.openai().rate_limited_count(), 0);
    assert_eq!(openai_create(&emulator, &file_id).await.status, StatusCode::OK);
    // `null` turns the limit off.
    control_post(&emulator, "openai/config", &json!({ "create_limit": null })).await;
    for _ in 0..5 {
        assert_eq!(openai_create(&emulator, &file_id).await.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn openai_bucket_lets_its_burst_through_then_refills_at_its_rate() {
    let emulator = start(EmulatorConfig::default()).await;
    let file_id = openai_upload(&emulator).await;
    // A burst of 2 refilled once every 1,800 s: the third create is refused, for about that long.
    emulator.openai().set_create_limit(Some(RateLimit::new(2, Duration::from_secs(3600)).burst(2)));
    assert_eq!(openai_create(&emulator, &file_id).await.status, StatusCode::OK);
    assert_eq!(openai_create(&emulator, &file_id).await.status, StatusCode::OK);
    let wait = assert_openai_rate_limited(&openai_create(&emulator, &file_id).await);
    assert!((1700..=1800).contains(&wait), "{wait}");

    // 5 creates in 2 s (one every 400 ms), a burst of 2: a new limit starts with a full bucket.
    let interval = Duration::from_millis(400);
    emulator.openai().set_create_limit(Some(RateLimit::new(5, Duration::from_secs(2)).burst(2)));
    // Creates as fast as they come for 1.3 s: when each admitted one was answered.
    let started = Instant::now();
    let mut admitted = Vec::new();
    let mut n_refused = 0u32;
    while started.elapsed() < Duration::from_millis(1300) {
        let reply = openai_create(&emulator, &file_id).await;
        if reply.status == StatusCode::OK {
            admitted.push(started.elapsed());
        } else {
            assert_eq!(assert_openai_rate_limited(&reply), 1, "a wait under a second rounds up to 1");
            n_refused += 1;
        }
    }
    // The burst, then one per interval: the k-th admitted create (from 0) was answered no earlier than
    // (k - 1) intervals after the first was sent.
    assert!(admitted.len() > 2, "the bucket refills: {admitted:?}");
    for (k, at) in admitted.iter().enumerate().skip(2) {
        let earliest = interval * u32::try_from(k - 1).expect("small");
        assert!(*at >= earliest, "create {k} admitted at {at:?}, before {earliest:?}: {admitted:?}");
    }
    assert_eq!(emulator.openai().rate_limited_count(), 1 + u64::from(n_refused));
}

/// An Anthropic call of `method` to `path` (under `/anthropic`), with the emulator's key and version.
async fn anthropic_call(emulator: &EmulatorHandle, method: reqwest::Method, path: &str, body: Option<Value>) -> Reply {
    let anthropic = emulator.anthropic();
    let mut request = reqwest::Client::new()
        .request(method, format!("{}{path}", anthropic.base_url()))
        .header("x-api-key", anthropic.api_key())
        .header("anthropic-version", "2023-06-01");
    if let Some(body) = body {
        request = request.json(&body);
    }
    reply_of(request.send().await.expect("a reply")).await
}

async fn anthropic_create(emulator: &EmulatorHandle) -> Reply {
    let body = json!({ "requests": [{
        "custom_id": "a",
        "params": { "model": "claude-x", "max_tokens": 10, "messages": [{ "role": "user", "content": "hi" }] },
    }] });
    anthropic_call(emulator, reqwest::Method::POST, "/v1/messages/batches", Some(body)).await
}

fn assert_anthropic_rate_limited(reply: &Reply) -> u64 {
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{:?}", reply.body);
    assert_eq!(reply.body["type"], "error");
    assert_eq!(reply.body["error"]["type"], "rate_limit_error");
    assert!(reply.headers.contains_key("request-id"));
    retry_after(reply)
}

#[tokio::test]
async fn anthropic_counts_every_call_polls_included() {
    let emulator = start_paused().await;
    let reply = control_post(
        &emulator,
        "anthropic/config",
        &json!({ "rate_limit": { "requests": 4, "per_ms": 600_000, "burst": 4 } }),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body["rate_limit"], json!({ "requests": 4, "per_ms": 600_000, "burst": 4 }));

    let created = anthropic_create(&emulator).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.body);
    let id = created.body["id"].as_str().expect("an id").to_owned();
    let poll_path = format!("/v1/messages/batches/{id}");
    // A poll, a list and another poll use the other three.
    assert_eq!(anthropic_call(&emulator, reqwest::Method::GET, &poll_path, None).await.status, StatusCode::OK);
    let list = anthropic_call(&emulator, reqwest::Method::GET, "/v1/messages/batches", None).await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(anthropic_call(&emulator, reqwest::Method::GET, &poll_path, None).await.status, StatusCode::OK);
    // The fifth call, a poll, is refused: one call leaves the bucket every 150 s.
    let refused = anthropic_call(&emulator, reqwest::Method::GET, &poll_path, None).await;
    let wait = assert_anthropic_rate_limited(&refused);
    assert!((140..=150).contains(&wait), "{wait}");
    assert_anthropic_rate_limited(&anthropic_create(&emulator).await);
    assert_eq!(emulator.anthropic().batch_count(), 1, "a refused create makes no batch");
    // A call with a wrong key is refused before it is counted.
    let wrong_key = reqwest::Client::new()
        .get(format!("{}{poll_path}", emulator.anthropic().base_url()))
        .header("x-api-key", "wrong")
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .expect("a reply");
    assert_eq!(wrong_key.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(emulator.anthropic().rate_limited_count(), 2);
    let refused_calls: Vec<_> = emulator
        .anthropic()
        .calls()
        .into_iter()
        .filter(|call| call.fault.as_deref() == Some("rate_limit"))
        .map(|call| (call.status, call.error_type))
        .collect();
    assert_eq!(refused_calls, vec![(429, Some("rate_limit_error".to_owned())); 2]);

    // The control API's reset fills the bucket again.
    assert_eq!(control_post(&emulator, "anthropic/reset", &json!({})).await.status, StatusCode::NO_CONTENT);
    assert_eq!(emulator.anthropic().rate_limited_count(), 0);
    for _ in 0..4 {
        assert_eq!(anthropic_call(&emulator, reqwest::Method::GET, &poll_path, None).await.status, StatusCode::OK);
    }
    assert_anthropic_rate_limited(&anthropic_call(&emulator, reqwest::Method::GET, &poll_path, None).await);
}

#[tokio::test]
async fn workers_ai_counts_submits_and_a_burst_spaces_them() {
    let emulator = start_paused().await;
    // A bucket of one, refilled once a minute, through the control API: one submit, then 429 3040.
    let reply =
        control_post(&emulator, "config", &json!({ "rate_limit": { "requests": 1, "per_ms": 60_000, "burst": 1 } }))
            .await;
    assert_eq!(reply.body["rate_limit"], json!({ "requests": 1, "per_ms": 60_000, "burst": 1 }));
    let request_id = submit(&emulator, LLAMA, json!([{ "prompt": "hi" }])).await;
    let refused = post(&emulator, LLAMA, &json!({ "requests": [{ "prompt": "hi" }] })).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.error_code(), 3040);
    assert!((50..=60).contains(&retry_after(&refused)));
    // Polls are free.
    for _ in 0..5 {
        assert_eq!(poll(&emulator, LLAMA, &request_id).await.status, StatusCode::OK);
    }
    assert_eq!(control_post(&emulator, "reset", &json!({})).await.status, StatusCode::NO_CONTENT);
    submit(&emulator, LLAMA, json!([{ "prompt": "again" }])).await;
}

/// Makes calls until one is not a 200: answers how many were, how long that took, and the refusal.
async fn until_refused(mut call: impl AsyncFnMut() -> Reply) -> (u64, Duration, Reply) {
    let started = Instant::now();
    let mut n_ok = 0;
    loop {
        let reply = call().await;
        if reply.status != StatusCode::OK {
            return (n_ok, started.elapsed(), reply);
        }
        n_ok += 1;
        assert!(n_ok <= 10_000, "never refused");
    }
}

/// How many calls a bucket refilled once per `interval_ms` can have admitted beyond its burst in `elapsed`.
fn allowed_after(elapsed: Duration, interval_ms: u128) -> u64 {
    u64::try_from(elapsed.as_millis() / interval_ms).expect("small") + 1
}

#[tokio::test]
async fn the_documented_preset_meters_each_provider_at_its_documented_limit() {
    let emulator = start_paused().await;
    let view = control_post(&emulator, "provider_limits", &json!({ "preset": "documented" })).await;
    assert_eq!(view.status, StatusCode::OK, "{:?}", view.body);
    assert_eq!(view.body["openai_creates"], json!({ "requests": 2000, "per_ms": 3_600_000, "burst": 1 }));
    assert_eq!(view.body["anthropic_requests"], json!({ "requests": 50, "per_ms": 60_000, "burst": 50 }));
    assert_eq!(view.body["workers_ai"], json!({ "requests": 300, "per_ms": 60_000 }));
    assert_eq!(view.body["workers_ai_limit_polls"], false);

    // OpenAI: one create, then one every 1.8 s (retry-after rounds up to 2).
    let file_id = openai_upload(&emulator).await;
    let (n_created, elapsed, refused) = until_refused(async || openai_create(&emulator, &file_id).await).await;
    assert!(n_created >= 1 && n_created <= 1 + allowed_after(elapsed, 1800), "{n_created} creates in {elapsed:?}");
    assert!((1..=2).contains(&assert_openai_rate_limited(&refused)));

    // Anthropic: 50 calls of any kind, then one every 1.2 s.
    let (n_calls, elapsed, refused) = until_refused(async || {
        anthropic_call(&emulator, reqwest::Method::GET, "/v1/messages/batches?limit=1", None).await
    })
    .await;
    assert!(n_calls >= 50 && n_calls <= 50 + allowed_after(elapsed, 1200), "{n_calls} calls in {elapsed:?}");
    assert!((1..=2).contains(&assert_anthropic_rate_limited(&refused)));

    // Workers AI: 300 submits a minute per model (the 301st within the minute is refused), polls free.
    let request_id = submit(&emulator, LLAMA, json!([{ "prompt": "hi" }])).await;
    let (n_more, elapsed, refused) =
        until_refused(async || post(&emulator, LLAMA, &json!({ "requests": [{ "prompt": "hi" }] })).await).await;
    assert!(n_more == 299 || elapsed >= Duration::from_secs(60), "{} submits in {elapsed:?}", n_more + 1);
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.error_code(), 3040);
    assert_eq!(poll(&emulator, LLAMA, &request_id).await.status, StatusCode::OK);

    let counts = reqwest::get(format!("{}/_emulator/provider_limits", origin(&emulator)))
        .await
        .expect("a reply")
        .json::<Value>()
        .await
        .expect("json");
    assert_eq!(counts["rate_limited"], json!({ "workers_ai": 1, "openai": 1, "anthropic": 1 }));

    // `off` lifts them all.
    control_post(&emulator, "provider_limits", &json!({ "preset": "off" })).await;
    assert_eq!(openai_create(&emulator, &file_id).await.status, StatusCode::OK);
    assert_eq!(anthropic_create(&emulator).await.status, StatusCode::OK);
    submit(&emulator, LLAMA, json!([{ "prompt": "hi" }])).await;
}

#[tokio::test]
async fn the_preset_and_batch_duration_from_the_config() {
    let config = EmulatorConfig::default()
        .with_provider_limits(ProviderLimits::Documented)
        .with_batch_duration(Duration::from_secs(5));
    assert_eq!(config.rate_limit, Some(RateLimit::workers_ai_submits()));
    assert_eq!(config.openai.create_limit, Some(RateLimit::openai_batch_creates()));
    assert_eq!(config.anthropic.rate_limit, Some(RateLimit::anthropic_requests()));
    assert_eq!(config.queued_for + config.running_for, Duration::from_secs(5));
    let openai = config.openai.timing;
    assert_eq!(openai.validating_for + openai.in_progress_for + openai.finalizing_for, Duration::from_secs(5));
    assert_eq!(config.anthropic.processing_for, Duration::from_secs(5));
    // The default stays off.
    let default = EmulatorConfig::default();
    assert_eq!((default.rate_limit, default.openai.create_limit, default.anthropic.rate_limit), (None, None, None));

    let emulator = start(config).await;
    let file_id = openai_upload(&emulator).await;
    assert_eq!(openai_create(&emulator, &file_id).await.status, StatusCode::OK);
    assert_openai_rate_limited(&openai_create(&emulator, &file_id).await);
}

#[tokio::test]
async fn the_binary_takes_the_preset_its_overrides_and_one_batch_duration_for_all_four_apis() {
    let process = crate::binary::EmulatorProcess::spawn(
        &[
            "--provider-limits",
            "documented",
            "--openai-create-limit",
            "5",
            "--openai-create-burst",
            "2",
            "--batch-duration-ms",
            "5000",
        ],
        &[],
    )
    .await;
    let origin = process.base_url.trim_end_matches("/client/v4").to_owned();
    let get = async |path: &str| -> Value {
        reqwest::get(format!("{origin}/_emulator/{path}")).await.expect("a reply").json().await.expect("json")
    };
    let limits = get("provider_limits").await;
    assert_eq!(limits["openai_creates"], json!({ "requests": 5, "per_ms": 3_600_000, "burst": 2 }));
    assert_eq!(limits["anthropic_requests"], json!({ "requests": 50, "per_ms": 60_000, "burst": 50 }));
    assert_eq!(limits["workers_ai"], json!({ "requests": 300, "per_ms": 60_000 }));
    let workers_ai = get("config").await;
    assert_eq!((workers_ai["queued_for_ms"].clone(), workers_ai["running_for_ms"].clone()), (json!(1250), json!(3750)));
    let openai = get("openai/config").await;
    let openai_ms = ["validating_ms", "in_progress_ms", "finalizing_ms"].map(|field| openai[field].clone());
    assert_eq!(openai_ms, [json!(500), json!(4000), json!(500)]);
    assert_eq!(get("anthropic/config").await["processing_ms"], 5000);
    let gemini = get("gemini/config").await;
    assert_eq!((gemini["pending_ms"].clone(), gemini["running_ms"].clone()), (json!(1250), json!(3750)));
    process.stop_with_sigterm().await;
}
