//! The `/_emulator/` control API over HTTP, and the call log.

use std::time::Duration;

use batchd_emulator::{CallKind, Fault};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{FOREVER, LLAMA, poll, post, start_paused, submit};

pub(crate) fn control_url(emulator: &batchd_emulator::EmulatorHandle, path: &str) -> String {
    format!("http://{}/_emulator/{path}", emulator.addr())
}

pub(crate) async fn control_post(
    emulator: &batchd_emulator::EmulatorHandle,
    path: &str,
    body: Value,
) -> (StatusCode, Value) {
    let response =
        reqwest::Client::new().post(control_url(emulator, path)).json(&body).send().await.expect("control reply");
    let status = response.status();
    let bytes = response.bytes().await.expect("body");
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

pub(crate) async fn control_get(emulator: &batchd_emulator::EmulatorHandle, path: &str) -> Value {
    reqwest::get(control_url(emulator, path)).await.expect("control reply").json().await.expect("json")
}

#[tokio::test]
async fn faults_can_be_injected_over_http() {
    let emulator = start_paused().await;
    let (status, pending) = control_post(
        &emulator,
        "faults",
        json!({ "kind": "status", "status": 429, "code": 3040, "message": "Capacity temporarily exceeded, please try again.",
                "retry_after_secs": 2, "calls": "submit", "times": 1 }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(pending.as_array().map(Vec::len), Some(1));
    let (status, _) = control_post(
        &emulator,
        "faults",
        json!([{ "kind": "html", "status": 502 }, { "kind": "fail_items", "indices": [0] }]),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(emulator.pending_faults().len(), 3);
    assert_eq!(emulator.pending_faults()[2], Fault::fail_items([0]));
    let listed = control_get(&emulator, "faults").await;
    assert_eq!(listed.as_array().map(Vec::len), Some(3));

    let body = json!({ "requests": [{ "prompt": "x" }] });
    let reply = post(&emulator, LLAMA, &body).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("2"));
    assert_eq!(post(&emulator, LLAMA, &body).await.status, StatusCode::BAD_GATEWAY);

    let (status, _) = control_post(&emulator, "faults", json!({ "kind": "nonsense" })).await;
    assert!(status.is_client_error());
}

#[tokio::test]
async fn config_changes_timing_at_runtime() {
    let emulator = start_paused().await;
    let request_id = submit(&emulator, LLAMA, json!([{ "prompt": "x" }])).await;
    let (status, timing) = control_post(&emulator, "config", json!({ "queued_for_ms": 0 })).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(timing["queued_for_ms"], 0);
    assert_eq!(timing["running_for_ms"], FOREVER.as_millis() as u64);
    assert_eq!(poll(&emulator, LLAMA, &request_id).await.body["result"]["status"], "running");
    control_post(&emulator, "config", json!({ "queued_for_ms": 0, "running_for_ms": 0 })).await;
    assert!(poll(&emulator, LLAMA, &request_id).await.body["result"]["results"].is_array());
    assert_eq!(
        control_get(&emulator, "config").await,
        json!({
            "queued_for_ms": 0,
            "running_for_ms": 0,
            "max_body_bytes": 10_000_000,
            "max_items": null,
            "rate_limit": null,
            "limit_polls": false,
            "retention_ms": null,
            "random_durations": null,
            "random_faults": null,
            "random_latency": null,
            "strict_items": false,
            "strict_refusal": { "keyword": "one_of", "code": 5006, "pointer": true },
            "unbatchable_models": [],
            "events": null,
            "event_faults": { "drop_next": 0, "drop_rate": 0.0, "duplicate": false, "delay_ms": 0, "order": "fifo" },
        })
    );
    let (status, _) = control_post(&emulator, "config", json!({ "queued_for": 0 })).await;
    assert!(status.is_client_error(), "unknown fields are refused");
    let batches = control_get(&emulator, "batches").await;
    assert_eq!(batches, json!([{ "request_id": request_id, "status": "done" }]));
}

#[tokio::test]
async fn call_log_records_every_api_call() {
    let emulator = start_paused().await;
    let request_id = submit(&emulator, "@cf/baai/bge-m3", json!([{ "text": "a" }, { "text": "b" }])).await;
    poll(&emulator, "@cf/baai/bge-m3", &request_id).await;
    post(&emulator, "@cf/unknown/model", &json!({ "requests": [{ "text": "a" }] })).await;

    let calls = emulator.calls();
    assert_eq!(calls.len(), 3);
    assert_eq!(calls.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
    let submit_call = &calls[0];
    assert_eq!(submit_call.kind, CallKind::Submit);
    assert_eq!(submit_call.model, "@cf/baai/bge-m3");
    assert_eq!(submit_call.account_id, emulator.account_id());
    assert_eq!(submit_call.request_id.as_deref(), Some(request_id.as_str()));
    assert_eq!(submit_call.http_status, 200);
    assert_eq!(submit_call.n_items, Some(2));
    assert!(submit_call.body_bytes > 20);
    assert!(submit_call.at_ms > 1_600_000_000_000);
    assert_eq!(calls[1].kind, CallKind::Poll);
    assert_eq!(calls[1].request_id.as_deref(), Some(request_id.as_str()));
    assert_eq!(calls[1].n_items, None);
    assert_eq!(calls[2].kind, CallKind::Rejected);
    assert_eq!(calls[2].error_code, Some(5007));

    let over_http = control_get(&emulator, "calls").await;
    let over_http = over_http.as_array().expect("calls");
    assert_eq!(over_http.len(), 3);
    assert_eq!(over_http[0]["kind"], "submit");
    assert_eq!(over_http[0]["request_id"], request_id.as_str());
    assert_eq!(over_http[1]["kind"], "poll");
    assert_eq!(over_http[2]["kind"], "rejected");
    assert_eq!(emulator.submits().len(), 1);
    assert_eq!(emulator.batch_count(), 1);
}

#[tokio::test]
async fn reset_clears_faults_and_log_but_keeps_batches() {
    let emulator = start_paused().await;
    let request_id = submit(&emulator, LLAMA, json!([{ "prompt": "x" }])).await;
    emulator.inject(Fault::status(500).times(5));
    emulator.inject(Fault::fail_batch());
    let response = reqwest::Client::new().post(control_url(&emulator, "reset")).send().await.expect("reply");
    assert!(response.status().is_success());
    assert!(emulator.calls().is_empty());
    assert!(emulator.pending_faults().is_empty());
    emulator.set_timing(Duration::ZERO, Duration::ZERO);
    let reply = poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(emulator.calls()[0].seq, 1);

    emulator.inject(Fault::status(500));
    emulator.reset();
    assert!(emulator.pending_faults().is_empty());
    assert!(emulator.calls().is_empty());
}

#[tokio::test]
async fn shutdown_stops_serving() {
    let emulator = start_paused().await;
    let addr = emulator.addr();
    submit(&emulator, LLAMA, json!([{ "prompt": "x" }])).await;
    tokio::time::timeout(Duration::from_secs(10), emulator.shutdown()).await.expect("shutdown in time");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
