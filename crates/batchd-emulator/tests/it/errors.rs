//! Every error the emulated API answers, each with Cloudflare's envelope.

use batchd_emulator::{CallKind, EmulatorConfig};
use reqwest::StatusCode;
use serde_json::json;

use crate::{LLAMA, post, post_raw, run_url, start, start_paused};

#[tokio::test]
async fn wrong_or_missing_token_is_401_10000() {
    let emulator = start_paused().await;
    let body = json!({ "requests": [{ "prompt": "x" }] }).to_string();
    let reply = post_raw(&run_url(&emulator, LLAMA), "wrong", body.clone()).await.expect("reply");
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply.error_code(), 10000);
    assert_eq!(reply.body["errors"][0]["message"], "Authentication error");

    let reply = reqwest::Client::new().post(run_url(&emulator, LLAMA)).body(body).send().await.expect("reply");
    assert_eq!(reply.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(emulator.batch_count(), 0);
    assert!(emulator.calls().iter().all(|call| call.kind == CallKind::Rejected && call.http_status == 401));
}

#[tokio::test]
async fn wrong_account_or_path_is_404_7003() {
    let emulator = start_paused().await;
    let url = format!("{}/accounts/someone-else/ai/run/@cf/baai/bge-m3?queueRequest=true", emulator.base_url());
    let reply =
        post_raw(&url, emulator.token(), json!({ "requests": [{ "text": "x" }] }).to_string()).await.expect("reply");
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.error_code(), 7003);
    let message = reply.body["errors"][0]["message"].as_str().expect("message");
    assert!(message.starts_with("Could not route to /accounts/someone-else/ai/run/"), "{message}");
    assert!(message.ends_with("perhaps your object identifier is invalid?"), "{message}");

    let url = format!("{}/accounts/{}/ai/models", emulator.base_url(), emulator.account_id());
    let reply = post_raw(&url, emulator.token(), "{}").await.expect("reply");
    assert_eq!(reply.error_code(), 7003);
}

#[tokio::test]
async fn unknown_model_is_400_5007() {
    let emulator = start_paused().await;
    let reply = post(&emulator, "@cf/nobody/nothing", &json!({ "requests": [{ "prompt": "x" }] })).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.error_code(), 5007);
    assert_eq!(reply.body["errors"][0]["message"], "No such model @cf/nobody/nothing or task");
}

#[tokio::test]
async fn body_of_ten_megabytes_is_413_3006_but_three_megabytes_pass() {
    let emulator = start_paused().await;
    // Larger than axum's default 2 MB limit, under the API's 10 MB.
    let text = "a".repeat(3_000_000);
    let reply = post(&emulator, "@cf/baai/bge-small-en-v1.5", &json!({ "requests": [{ "text": text }] })).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);

    let mut body = json!({ "requests": [{ "text": "" }] }).to_string().into_bytes();
    body.resize(10_000_000, b' ');
    let reply =
        post_raw(&run_url(&emulator, "@cf/baai/bge-small-en-v1.5"), emulator.token(), body).await.expect("reply");
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply.error_code(), 3006);
    assert_eq!(reply.body["errors"][0]["message"], "Request is too large");
    let last = emulator.calls().pop().expect("a call");
    assert_eq!(last.body_bytes, 10_000_000);
    assert_eq!(last.kind, CallKind::Rejected);
}

#[tokio::test]
async fn max_body_bytes_is_configurable() {
    let emulator = start(EmulatorConfig { max_body_bytes: 100, ..EmulatorConfig::default() }).await;
    let reply = post(&emulator, LLAMA, &json!({ "requests": [{ "prompt": "x".repeat(100) }] })).await;
    assert_eq!(reply.error_code(), 3006);
    let reply = post(&emulator, LLAMA, &json!({ "requests": [{ "prompt": "x" }] })).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn malformed_bodies_are_400_5004_or_3003() {
    let emulator = start_paused().await;
    let url = run_url(&emulator, LLAMA);
    for body in ["not json", "[1,2]", "\"text\""] {
        let reply = post_raw(&url, emulator.token(), body).await.expect("reply");
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(reply.error_code(), 5004, "{body}");
        let message = reply.body["errors"][0]["message"].as_str().expect("message");
        assert!(message.starts_with("Invalid data: "), "{message}");
    }
    for body in [json!({}), json!({ "requests": [] })] {
        let reply = post(&emulator, LLAMA, &body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(reply.error_code(), 3003, "{body}");
        assert_eq!(reply.body["errors"][0]["message"], "Incomplete request: requests must be a non-empty array");
    }
    let reply = post(&emulator, LLAMA, &json!({ "requests": [{ "prompt": "ok" }, "not an object"] })).await;
    assert_eq!(reply.error_code(), 5004);
    let reply = post(&emulator, LLAMA, &json!({ "requests": "nope" })).await;
    assert_eq!(reply.error_code(), 5004);
    assert_eq!(emulator.batch_count(), 0);
}

#[tokio::test]
async fn unknown_request_id_is_404_7000() {
    let emulator = start_paused().await;
    let reply = post(&emulator, LLAMA, &json!({ "request_id": "00000000-0000-4000-8000-000000000000" })).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.error_code(), 7000);
    assert_eq!(reply.body["errors"][0]["message"], "Request not found");
    let call = emulator.calls().pop().expect("a call");
    assert_eq!(call.kind, CallKind::Poll);
    assert_eq!(call.request_id.as_deref(), Some("00000000-0000-4000-8000-000000000000"));
}

#[tokio::test]
async fn per_item_schema_errors_fail_only_that_item() {
    let emulator = start_paused().await;
    let request_id = crate::submit(
        &emulator,
        LLAMA,
        json!([{ "prompt": "fine" }, { "max_tokens": 5, "external_reference": "bad" }]),
    )
    .await;
    let reply = crate::finish_and_poll(&emulator, LLAMA, &request_id).await;
    let responses = reply.body["result"]["results"].as_array().expect("results");
    let bad = responses.iter().find(|r| r["index"] == 1).expect("item 1");
    assert_eq!(bad["success"], false);
    assert_eq!(bad["error"]["code"], 5004);
    assert_eq!(bad["external_reference"], "bad");
    assert!(bad.get("result").is_none());
    let good = responses.iter().find(|r| r["index"] == 0).expect("item 0");
    assert_eq!(good["success"], true);
}
