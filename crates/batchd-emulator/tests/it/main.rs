//! Integration tests: a real emulator on port 0, driven over HTTP with reqwest.

mod anthropic;
mod binary;
mod control;
mod errors;
mod events;
mod faults;
mod gemini;
mod lifecycle;
mod limits;
mod openai;
mod provider_limits;
mod random;
mod variants;

use std::{net::SocketAddr, time::Duration};

use batchd_emulator::{Emulator, EmulatorConfig, EmulatorHandle};
use reqwest::{StatusCode, header::HeaderMap};
use serde_json::{Value, json};

/// Timing that keeps batches pending until a test changes it.
const FOREVER: Duration = Duration::from_secs(3600);

/// How long a test waits for a condition before failing.
const DEADLINE: Duration = Duration::from_secs(10);

/// Checks `condition` every 10 ms until it holds; panics after [`DEADLINE`], naming `what` was awaited.
async fn wait_until(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let started = std::time::Instant::now();
    while !condition().await {
        assert!(started.elapsed() < DEADLINE, "timed out after {DEADLINE:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn start(config: EmulatorConfig) -> EmulatorHandle {
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("address");
    Emulator::start(config, addr).await.expect("start emulator")
}

/// An emulator whose batches stay queued until the test calls `set_timing`.
async fn start_paused() -> EmulatorHandle {
    start(EmulatorConfig { queued_for: FOREVER, running_for: FOREVER, ..EmulatorConfig::default() }).await
}

/// The run URL of `model`, percent-encoding the `@` like the real client does.
fn run_url(emulator: &EmulatorHandle, model: &str) -> String {
    let model = model.replace('@', "%40");
    format!("{}/accounts/{}/ai/run/{model}?queueRequest=true", emulator.base_url(), emulator.account_id())
}

/// A reply: status, headers and the JSON body (`Value::Null` when the body is not JSON).
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Reply {
    /// The first envelope error code.
    fn error_code(&self) -> i64 {
        assert_eq!(self.body["success"], false, "{:?}", self.body);
        assert_eq!(self.body["result"], Value::Null);
        self.body["errors"][0]["code"].as_i64().expect("an error code")
    }
}

async fn post_raw(url: &str, token: &str, body: impl Into<reqwest::Body>) -> Result<Reply, reqwest::Error> {
    let response = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.bytes().await?;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Reply { status, headers, body })
}

async fn post(emulator: &EmulatorHandle, model: &str, body: &Value) -> Reply {
    post_raw(&run_url(emulator, model), emulator.token(), body.to_string()).await.expect("a reply")
}

/// Submits `requests` and returns the new request id.
async fn submit(emulator: &EmulatorHandle, model: &str, requests: Value) -> String {
    let reply = post(emulator, model, &json!({ "requests": requests })).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    reply.body["result"]["request_id"].as_str().expect("a request id").to_owned()
}

async fn poll(emulator: &EmulatorHandle, model: &str, request_id: &str) -> Reply {
    post(emulator, model, &json!({ "request_id": request_id })).await
}

/// Makes every batch done at once and polls it.
async fn finish_and_poll(emulator: &EmulatorHandle, model: &str, request_id: &str) -> Reply {
    emulator.set_timing(Duration::ZERO, Duration::ZERO);
    poll(emulator, model, request_id).await
}

const LLAMA: &str = "@cf/meta/llama-3.3-70b-instruct-fp8-fast";
