//! Limits: body and item caps, the per-(account, model) rate limit, retention, and what they log.

use std::time::{Duration, Instant};

use batchd_emulator::{CallKind, EmulatorConfig, Fault, RateLimit};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    DEADLINE, FOREVER, LLAMA,
    control::{control_get, control_post},
    poll, post, post_raw, run_url, start, start_paused, submit, wait_until,
};

const BGE_SMALL: &str = "@cf/baai/bge-small-en-v1.5";

fn prompts(n: usize) -> Value {
    Value::Array((0..n).map(|i| json!({ "prompt": format!("p{i}") })).collect())
}

fn retry_after(reply: &crate::Reply) -> Option<&str> {
    reply.headers.get("retry-after").and_then(|value| value.to_str().ok())
}

#[tokio::test]
async fn item_cap_is_413_3006_and_both_caps_change_at_runtime() {
    let emulator = start(EmulatorConfig { queued_for: FOREVER, max_items: Some(3), ..EmulatorConfig::default() }).await;
    submit(&emulator, LLAMA, prompts(3)).await;
    let reply = post(&emulator, LLAMA, &json!({ "requests": prompts(4) })).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply.error_code(), 3006);
    assert_eq!(reply.body["errors"][0]["message"], "Request is too large: 4 items, the limit is 3");
    let call = emulator.calls().pop().expect("a call");
    assert_eq!(call.kind, CallKind::Rejected);
    assert_eq!(call.n_items, Some(4));
    assert_eq!(call.error_code, Some(3006));
    assert_eq!(emulator.batch_count(), 1);

    emulator.set_limits(10_000_000, Some(1));
    let reply = post(&emulator, LLAMA, &json!({ "requests": prompts(2) })).await;
    assert_eq!(reply.error_code(), 3006);
    submit(&emulator, LLAMA, prompts(1)).await;

    let (status, view) = control_post(&emulator, "config", json!({ "max_items": null })).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["max_items"], Value::Null);
    assert_eq!(view["max_body_bytes"], 10_000_000);
    submit(&emulator, LLAMA, prompts(50)).await;

    let (_, view) = control_post(&emulator, "config", json!({ "max_body_bytes": 100, "max_items": 2 })).await;
    assert_eq!(view["max_body_bytes"], 100);
    assert_eq!(view["max_items"], 2);
    let reply = post(&emulator, LLAMA, &json!({ "requests": [{ "prompt": "x".repeat(100) }] })).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply.body["errors"][0]["message"], "Request is too large");
    let reply = post(&emulator, LLAMA, &json!({ "requests": prompts(3) })).await;
    assert_eq!(reply.body["errors"][0]["message"], "Request is too large: 3 items, the limit is 2");
    assert_eq!(control_get(&emulator, "config").await["max_items"], 2);
}

#[tokio::test]
async fn rate_limit_is_429_3040_with_retry_after_per_account_and_model() {
    let emulator = start(EmulatorConfig {
        queued_for: FOREVER,
        rate_limit: Some(RateLimit::per_minute(2)),
        ..EmulatorConfig::default()
    })
    .await;
    let first = submit(&emulator, LLAMA, prompts(1)).await;
    submit(&emulator, LLAMA, prompts(1)).await;
    let reply = post(&emulator, LLAMA, &json!({ "requests": prompts(1) })).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.error_code(), 3040);
    assert_eq!(reply.body["errors"][0]["message"], "Capacity temporarily exceeded, please try again.");
    // The first submit leaves the one-minute window in just under 60 s: rounded up.
    let wait: u64 = retry_after(&reply).expect("Retry-After").parse().expect("seconds");
    assert!((58..=60).contains(&wait), "{wait}");

    // Another model has its own window, and polls are not limited by default.
    submit(&emulator, BGE_SMALL, json!([{ "text": "a" }])).await;
    assert_eq!(poll(&emulator, LLAMA, &first).await.status, StatusCode::OK);

    let limited = emulator.calls().into_iter().find(|call| call.http_status == 429).expect("the 429 is logged");
    assert_eq!(limited.kind, CallKind::Submit);
    assert_eq!(limited.fault.as_deref(), Some("rate_limit"));
    assert_eq!(limited.error_code, Some(3040));
    assert_eq!(limited.request_id, None);
    assert_eq!(limited.n_items, Some(1));
    assert_eq!(emulator.submits().len(), 4);
    assert_eq!(emulator.rate_limited_count(), 1);
    assert_eq!(control_get(&emulator, "stats").await, json!({ "rate_limited": 1, "batches": 3 }));

    // An injected 429 is not the limiter's.
    emulator.inject(Fault::status(429).code(3040));
    let reply = post(&emulator, BGE_SMALL, &json!({ "requests": [{ "text": "a" }] })).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(emulator.rate_limited_count(), 1);

    // With limit_polls, polls share the window of their model, which two submits fill.
    emulator.set_limit_polls(true);
    let reply = poll(&emulator, LLAMA, &first).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.error_code(), 3040);
    let call = emulator.calls().pop().expect("a call");
    assert_eq!(call.kind, CallKind::Poll);
    assert_eq!(call.request_id.as_deref(), Some(first.as_str()));
    assert_eq!(call.fault.as_deref(), Some("rate_limit"));
    assert_eq!(emulator.rate_limited_count(), 2);

    // A reset empties the windows and the count; the limit itself stays.
    emulator.reset();
    assert_eq!(emulator.rate_limited_count(), 0);
    assert_eq!(poll(&emulator, LLAMA, &first).await.status, StatusCode::OK);
    submit(&emulator, LLAMA, prompts(1)).await;
    let reply = post(&emulator, LLAMA, &json!({ "requests": prompts(1) })).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn rate_limit_changes_at_runtime_and_frees_after_its_window() {
    let emulator = start_paused().await;
    // An hour-long window: the second call is refused however slow the machine is, and told to wait for the rest
    // of the hour.
    let (status, view) =
        control_post(&emulator, "config", json!({ "rate_limit": { "requests": 1, "per_ms": 3_600_000 } })).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["rate_limit"], json!({ "requests": 1, "per_ms": 3_600_000 }));
    assert_eq!(view["limit_polls"], false);
    submit(&emulator, LLAMA, prompts(1)).await;
    let reply = post(&emulator, LLAMA, &json!({ "requests": prompts(1) })).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = retry_after(&reply).expect("Retry-After").parse().expect("seconds");
    assert!((3_600 - DEADLINE.as_secs()..=3_600).contains(&wait), "{wait}");

    // A 300 ms window (a new limit starts with empty windows): calls are refused, each told to retry in 1 s (the
    // wait rounded up), until the window has passed; then one is admitted.
    control_post(&emulator, "config", json!({ "rate_limit": { "requests": 1, "per_ms": 300 } })).await;
    let first_sent = Instant::now();
    submit(&emulator, LLAMA, prompts(1)).await;
    wait_until("the 300 ms window to free", async || {
        let reply = post(&emulator, LLAMA, &json!({ "requests": prompts(1) })).await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(retry_after(&reply), Some("1"));
        }
        reply.status == StatusCode::OK
    })
    .await;
    assert!(first_sent.elapsed() >= Duration::from_millis(300), "admitted again only after the window");

    emulator.set_rate_limit(None);
    for _ in 0..5 {
        submit(&emulator, LLAMA, prompts(1)).await;
    }
    emulator.set_rate_limit(Some(RateLimit::new(0, Duration::from_millis(1500))));
    let reply = post(&emulator, BGE_SMALL, &json!({ "requests": [{ "text": "a" }] })).await;
    assert_eq!(retry_after(&reply), Some("2"));
    let (_, view) = control_post(&emulator, "config", json!({ "rate_limit": null, "limit_polls": true })).await;
    assert_eq!(view["rate_limit"], Value::Null);
    assert_eq!(view["limit_polls"], true);
    submit(&emulator, BGE_SMALL, json!([{ "text": "a" }])).await;
    assert!(control_get(&emulator, "stats").await["rate_limited"].as_u64() >= Some(1));
}

#[tokio::test]
async fn finished_batches_are_forgotten_after_the_retention() {
    let emulator = start_paused().await;
    let request_id = submit(&emulator, LLAMA, prompts(2)).await;
    // Pending batches never expire.
    emulator.set_retention(Some(Duration::ZERO));
    let reply = poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(reply.body["result"]["status"], "queued");

    emulator.set_retention(None);
    emulator.set_timing(Duration::ZERO, Duration::ZERO);
    let reply = poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body["result"]["results"].is_array());

    // With zero timing the batch has been done since its submit: an hour's retention keeps it, a 150 ms one
    // forgets it once 150 ms have passed since then.
    emulator.set_retention(Some(Duration::from_secs(3600)));
    assert_eq!(poll(&emulator, LLAMA, &request_id).await.status, StatusCode::OK);
    emulator.set_retention(Some(Duration::from_millis(150)));
    wait_until("the batch to be forgotten", async || {
        poll(&emulator, LLAMA, &request_id).await.status == StatusCode::NOT_FOUND
    })
    .await;
    for _ in 0..2 {
        let reply = poll(&emulator, LLAMA, &request_id).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND);
        assert_eq!(reply.error_code(), 7000);
        assert_eq!(reply.body["errors"][0]["message"], "Request not found");
    }
    assert_eq!(emulator.batch_count(), 1);
    assert_eq!(emulator.stored_batch_count(), 0);
    assert_eq!(control_get(&emulator, "batches").await, json!([]));
    assert_eq!(control_get(&emulator, "stats").await["batches"], 1);

    // Over HTTP: a retention of 0 forgets a batch as soon as it is done.
    let (_, view) = control_post(&emulator, "config", json!({ "retention_ms": 0 })).await;
    assert_eq!(view["retention_ms"], 0);
    let request_id = submit(&emulator, LLAMA, prompts(1)).await;
    assert_eq!(poll(&emulator, LLAMA, &request_id).await.status, StatusCode::NOT_FOUND);
    let (_, view) = control_post(&emulator, "config", json!({ "retention_ms": null })).await;
    assert_eq!(view["retention_ms"], Value::Null);
    let request_id = submit(&emulator, LLAMA, prompts(1)).await;
    assert_eq!(poll(&emulator, LLAMA, &request_id).await.status, StatusCode::OK);
}

#[tokio::test]
async fn call_log_body_bytes_is_the_raw_body_length() {
    let emulator = start_paused().await;
    let url = run_url(&emulator, BGE_SMALL);
    // Whitespace that a re-serialization would drop still counts.
    let body = format!("{{ \"requests\" : [ {{ \"text\" : \"é\" }} ] }}{}", " ".repeat(777));
    let reply = post_raw(&url, emulator.token(), body.clone()).await.expect("reply");
    assert_eq!(reply.status, StatusCode::OK);
    let request_id = reply.body["result"]["request_id"].as_str().expect("id").to_owned();
    let poll_body = format!("{{\"request_id\":\"{request_id}\"}}\n");
    post_raw(&url, emulator.token(), poll_body.clone()).await.expect("reply");
    post_raw(&url, emulator.token(), "{\"requests\":[]}").await.expect("reply");
    let calls = emulator.calls();
    assert_eq!(calls[0].kind, CallKind::Submit);
    assert_eq!(calls[0].body_bytes, body.len());
    assert_eq!(calls[1].body_bytes, poll_body.len());
    assert_eq!(calls[2].body_bytes, 15);
}

/// 1,000 bge-small items of 9.5 KB each: parsing, word counts and seeds at submit, 384,000 floats at poll.
#[tokio::test]
async fn a_nine_and_a_half_megabyte_submit_is_fast() {
    let emulator = start_paused().await;
    let text = "word ".repeat(1900);
    let requests: Vec<Value> =
        (0..1000).map(|i| json!({ "text": format!("{i} {text}"), "external_reference": format!("r{i}") })).collect();
    let body = json!({ "requests": requests }).to_string();
    assert!(body.len() > 9_500_000 && body.len() < 10_000_000);

    let started = Instant::now();
    let reply = post_raw(&run_url(&emulator, BGE_SMALL), emulator.token(), body.clone()).await.expect("reply");
    let submit_took = started.elapsed();
    assert_eq!(reply.status, StatusCode::OK);
    let request_id = reply.body["result"]["request_id"].as_str().expect("id").to_owned();
    let call = emulator.submits().pop().expect("the submit");
    assert_eq!(call.body_bytes, body.len());
    assert_eq!(call.n_items, Some(1000));

    emulator.set_timing(Duration::ZERO, Duration::ZERO);
    let started = Instant::now();
    let response = reqwest::Client::new()
        .post(run_url(&emulator, BGE_SMALL))
        .bearer_auth(emulator.token())
        .json(&json!({ "request_id": request_id }))
        .send()
        .await
        .expect("poll");
    let bytes = response.bytes().await.expect("body");
    let poll_took = started.elapsed();
    eprintln!("9.5 MB submit: {} bytes in {submit_took:?}; poll: {} bytes in {poll_took:?}", body.len(), bytes.len());
    // Measured about 0.1 s each in a debug build; the bounds leave room for a loaded machine.
    assert!(submit_took < Duration::from_secs(3), "{submit_took:?}");
    assert!(poll_took < Duration::from_secs(3), "{poll_took:?}");

    let reply: Value = serde_json::from_slice(&bytes).expect("json");
    let responses = reply["result"]["results"].as_array().expect("results");
    assert_eq!(responses.len(), 1000);
    let item = responses.iter().find(|r| r["index"] == 7).expect("item 7");
    assert_eq!(item["external_reference"], "r7");
    assert_eq!(item["result"]["shape"], json!([1, 384]));
    assert_eq!(reply["result"]["usage"]["prompt_tokens"], 1000 * 1901);
}
