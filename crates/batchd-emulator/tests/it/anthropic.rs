//! The Anthropic Message Batches emulator under `/anthropic`, over real HTTP: lifecycle, results, asynchronous
//! validation, both error shapes, refusals, every fault, cancel, expiry, list paging, delete and the control API.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant, SystemTime},
};

use batchd_emulator::{
    AnthropicCallKind, AnthropicCalls, AnthropicConfig, AnthropicControl, AnthropicFault, EmulatorConfig,
    EmulatorHandle, ErrorShape,
};
use reqwest::{Method, StatusCode, header::HeaderMap};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{DEADLINE, FOREVER, start, wait_until};

/// An emulator with these Anthropic settings (everything else default).
async fn start_with(anthropic: AnthropicConfig) -> EmulatorHandle {
    start(EmulatorConfig { anthropic, ..EmulatorConfig::default() }).await
}

/// An emulator whose Anthropic batches keep processing until a test moves them.
async fn start_paused() -> EmulatorHandle {
    start_with(AnthropicConfig { processing_for: FOREVER, ..AnthropicConfig::default() }).await
}

/// A reply: status, headers, the raw body and the body as JSON (`Value::Null` when it is not JSON).
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    text: String,
    body: Value,
}

impl Reply {
    /// Asserts the documented error envelope and returns its `error.type`.
    fn error_type(&self) -> String {
        assert_eq!(self.body["type"], "error", "{}", self.text);
        assert!(self.body["error"]["message"].is_string(), "{}", self.text);
        assert!(self.body["request_id"].as_str().is_some_and(|id| !id.is_empty()), "{}", self.text);
        self.body["error"]["type"].as_str().expect("an error type").to_owned()
    }
}

/// A client as the docs describe one: base URL, `x-api-key`, `anthropic-version`.
struct Client {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Client {
    fn of(anthropic: &AnthropicControl) -> Self {
        Self { http: reqwest::Client::new(), base: anthropic.base_url(), key: anthropic.api_key() }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Reply, reqwest::Error> {
        let response = request.send().await?;
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Reply { status, headers, text, body })
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .header("x-api-key", &self.key)
            .header("anthropic-version", "2023-06-01")
    }

    async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Reply {
        let mut request = self.request(method, path);
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body.to_string());
        }
        self.send(request).await.expect("a reply")
    }

    async fn create(&self, requests: Value) -> Reply {
        self.call(Method::POST, "/v1/messages/batches", Some(&json!({ "requests": requests }))).await
    }

    /// Creates a batch and returns its id.
    async fn create_ok(&self, requests: Value) -> String {
        let reply = self.create(requests).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        reply.body["id"].as_str().expect("an id").to_owned()
    }

    async fn retrieve(&self, id: &str) -> Reply {
        self.call(Method::GET, &format!("/v1/messages/batches/{id}"), None).await
    }

    async fn cancel(&self, id: &str) -> Reply {
        self.call(Method::POST, &format!("/v1/messages/batches/{id}/cancel"), None).await
    }

    async fn results(&self, id: &str) -> Reply {
        self.call(Method::GET, &format!("/v1/messages/batches/{id}/results"), None).await
    }

    async fn list(&self, query: &str) -> Reply {
        self.call(Method::GET, &format!("/v1/messages/batches{query}"), None).await
    }

    /// Polls until the batch has ended and returns it.
    async fn wait_ended(&self, id: &str) -> Value {
        let mut batch = Value::Null;
        wait_until("the batch to end", async || {
            batch = self.retrieve(id).await.body;
            batch["processing_status"] == "ended"
        })
        .await;
        batch
    }
}

/// A valid item.
fn item(custom_id: &str, text: &str) -> Value {
    json!({
        "custom_id": custom_id,
        "params": {
            "model": "claude-sonnet-4-5",
            "max_tokens": 64,
            "messages": [{ "role": "user", "content": text }],
        },
    })
}

fn items(n: usize) -> Value {
    (0..n).map(|i| item(&format!("req-{i}"), &format!("prompt number {i}"))).collect()
}

/// The lines of a JSONL body.
fn lines(reply: &Reply) -> Vec<Value> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    reply.text.lines().map(|line| serde_json::from_str(line).expect("a JSON line")).collect()
}

/// Result lines by `custom_id`.
fn by_custom_id(lines: &[Value]) -> BTreeMap<String, Value> {
    lines
        .iter()
        .map(|line| (line["custom_id"].as_str().expect("custom_id").to_owned(), line["result"].clone()))
        .collect()
}

/// An RFC 3339 time as the API writes them, with microseconds (`2024-08-20T18:37:24.100435Z`).
fn parse_time(value: &Value) -> SystemTime {
    let text = value.as_str().expect("a time");
    assert!(text.len() == 27 && text.ends_with('Z') && text.as_bytes()[19] == b'.', "{text}");
    humantime::parse_rfc3339(text).expect("RFC 3339")
}

#[tokio::test]
async fn create_poll_and_shuffled_results_joined_on_custom_id() {
    let emulator = start_with(AnthropicConfig::default()).await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    let before = SystemTime::now() - Duration::from_secs(1);

    let reply = client.create(items(6)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let batch = &reply.body;
    let id = batch["id"].as_str().expect("an id").to_owned();
    assert!(id.starts_with("msgbatch_"), "{id}");
    assert_eq!(batch["type"], "message_batch");
    assert_eq!(batch["processing_status"], "in_progress");
    assert_eq!(
        batch["request_counts"],
        json!({ "processing": 6, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0 })
    );
    let created_at = parse_time(&batch["created_at"]);
    assert!(created_at > before && created_at < SystemTime::now() + Duration::from_secs(1));
    let expires_at = parse_time(&batch["expires_at"]);
    assert_eq!(expires_at.duration_since(created_at).expect("after"), Duration::from_secs(24 * 3600));
    for field in ["ended_at", "cancel_initiated_at", "archived_at", "results_url"] {
        assert_eq!(batch[field], Value::Null, "{field}");
    }

    let ended = client.wait_ended(&id).await;
    assert_eq!(
        ended["request_counts"],
        json!({ "processing": 0, "succeeded": 6, "errored": 0, "canceled": 0, "expired": 0 })
    );
    assert!(parse_time(&ended["ended_at"]) >= created_at);
    let results_url = ended["results_url"].as_str().expect("a results url");
    assert_eq!(results_url, format!("{}/v1/messages/batches/{id}/results", anthropic.base_url()));

    // The results_url as given, with the same headers.
    let request =
        client.http.get(results_url).header("x-api-key", &client.key).header("anthropic-version", "2023-06-01");
    let results = lines(&client.send(request).await.expect("results"));
    let order: Vec<&str> = results.iter().map(|line| line["custom_id"].as_str().expect("custom_id")).collect();
    let request_order: Vec<String> = (0..6).map(|i| format!("req-{i}")).collect();
    assert_ne!(order, request_order, "results come back shuffled");
    let joined = by_custom_id(&results);
    assert_eq!(joined.keys().cloned().collect::<Vec<_>>(), request_order);
    for (i, custom_id) in request_order.iter().enumerate() {
        let result = &joined[custom_id];
        assert_eq!(result["type"], "succeeded");
        let message = &result["message"];
        assert!(message["id"].as_str().is_some_and(|id| id.starts_with("msg_")));
        assert_eq!(message["type"], "message");
        assert_eq!(message["role"], "assistant");
        assert_eq!(message["model"], "claude-sonnet-4-5");
        assert_eq!(message["content"][0], json!({ "type": "text", "text": format!("echo: prompt number {i}") }));
        assert_eq!(message["stop_reason"], "end_turn");
        let usage = &message["usage"];
        assert_eq!(usage["input_tokens"], 3);
        assert_eq!(usage["output_tokens"], 4);
        assert_eq!(usage["cache_creation_input_tokens"], 0);
        assert_eq!(usage["cache_read_input_tokens"], 0);
        assert_eq!(usage["service_tier"], "batch");
    }
    let again = lines(&client.results(&id).await);
    assert_eq!(again, results, "the same batch gives the same results in the same order");

    // Keeping the request order is a control.
    anthropic.update_config(|config| config.shuffle_results = false);
    let ordered = lines(&client.results(&id).await);
    let order: Vec<&str> = ordered.iter().map(|line| line["custom_id"].as_str().expect("custom_id")).collect();
    assert_eq!(order, request_order);

    let kinds: Vec<AnthropicCallKind> = anthropic.calls().iter().map(|call| call.kind).collect();
    assert_eq!(kinds.first(), Some(&AnthropicCallKind::Create));
    assert_eq!(anthropic.calls_of(AnthropicCallKind::Create).len(), 1);
    assert_eq!(anthropic.calls_of(AnthropicCallKind::Results).len(), 3);
    let create = &anthropic.calls_of(AnthropicCallKind::Create)[0];
    assert_eq!((create.method.as_str(), create.path.as_str(), create.status), ("POST", "/v1/messages/batches", 200));
    assert_eq!(create.batch_id.as_deref(), Some(id.as_str()));
    assert_eq!(create.n_requests, Some(6));
}

#[tokio::test]
async fn bad_params_are_accepted_and_come_back_errored_in_both_shapes() {
    let emulator = start_with(AnthropicConfig::default()).await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    let good = item("good", "hello");
    let with = |custom_id: &str, change: &dyn Fn(&mut Value)| {
        let mut item = item(custom_id, "hello");
        change(&mut item["params"]);
        item
    };
    let requests = json!([
        good,
        with("no-max-tokens", &|params| {
            params.as_object_mut().expect("object").remove("max_tokens");
        }),
        with("zero-max-tokens", &|params| params["max_tokens"] = json!(0)),
        with("streaming", &|params| params["stream"] = json!(true)),
        with("no-messages", &|params| {
            params.as_object_mut().expect("object").remove("messages");
        }),
        with("no-model", &|params| {
            params.as_object_mut().expect("object").remove("model");
        }),
    ]);
    let reply = client.create(requests).await;
    assert_eq!(reply.status, StatusCode::OK, "the batch is accepted: {}", reply.text);
    let id = reply.body["id"].as_str().expect("an id").to_owned();
    assert_eq!(reply.body["request_counts"]["processing"], 6);
    let ended = client.wait_ended(&id).await;
    assert_eq!(
        ended["request_counts"],
        json!({ "processing": 0, "succeeded": 1, "errored": 5, "canceled": 0, "expired": 0 })
    );

    let nested = by_custom_id(&lines(&client.results(&id).await));
    assert_eq!(nested["good"]["type"], "succeeded");
    let expected_fields = [
        ("no-max-tokens", "max_tokens"),
        ("zero-max-tokens", "max_tokens"),
        ("streaming", "stream"),
        ("no-messages", "messages"),
        ("no-model", "model"),
    ];
    for (custom_id, field) in expected_fields {
        let result = &nested[custom_id];
        assert_eq!(result["type"], "errored", "{custom_id}");
        let error = &result["error"];
        assert_eq!(error["type"], "error", "nested shape: {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error");
        assert!(error["error"]["message"].as_str().expect("message").starts_with(field), "{error}");
        assert!(error["request_id"].is_string());
    }

    // The flat shape some captures show, through the control API.
    let reply = reqwest::Client::new()
        .post(format!("http://{}/_emulator/anthropic/config", emulator.addr()))
        .json(&json!({ "error_shape": "flat" }))
        .send()
        .await
        .expect("config");
    assert_eq!(reply.status(), StatusCode::OK);
    assert_eq!(anthropic.config().error_shape, ErrorShape::Flat);
    let flat = by_custom_id(&lines(&client.results(&id).await));
    let error = &flat["streaming"]["error"];
    assert_eq!(error["type"], "invalid_request_error", "flat shape: {error}");
    assert!(error["message"].as_str().expect("message").starts_with("stream"));
    assert_eq!(error.get("error"), None);
    assert_eq!(flat["good"], nested["good"]);
}

#[tokio::test]
async fn malformed_creates_are_refused_at_once_and_create_nothing() {
    let emulator = start_with(AnthropicConfig { max_requests: 3, ..AnthropicConfig::default() }).await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    let cases = [
        ("empty", json!({ "requests": [] })),
        ("no requests", json!({})),
        ("duplicate", json!({ "requests": [item("a", "x"), item("a", "y")] })),
        ("bad pattern", json!({ "requests": [item("has space", "x")] })),
        ("too long", json!({ "requests": [item(&"a".repeat(65), "x")] })),
        ("no params", json!({ "requests": [{ "custom_id": "a" }] })),
        ("over max_requests", json!({ "requests": items(4) })),
    ];
    for (what, body) in cases {
        let reply = client.call(Method::POST, "/v1/messages/batches", Some(&body)).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{what}: {}", reply.text);
        assert_eq!(reply.error_type(), "invalid_request_error", "{what}");
    }
    let reply =
        client.send(client.request(Method::POST, "/v1/messages/batches").body("{not json")).await.expect("reply");
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(anthropic.batch_count(), 0);
    assert_eq!(client.create(items(3)).await.status, StatusCode::OK, "the cap is inclusive");
}

#[tokio::test]
async fn headers_paths_and_ids_are_checked_with_the_documented_errors() {
    let emulator = start_paused().await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    let url = format!("{}/v1/messages/batches", anthropic.base_url());
    let http = reqwest::Client::new();

    let no_key = client.send(http.get(&url).header("anthropic-version", "2023-06-01")).await.expect("reply");
    assert_eq!(no_key.status, StatusCode::UNAUTHORIZED);
    assert_eq!(no_key.error_type(), "authentication_error");
    assert!(no_key.headers.get("request-id").is_some());
    let wrong_key = client
        .send(http.get(&url).header("x-api-key", "nope").header("anthropic-version", "2023-06-01"))
        .await
        .expect("reply");
    assert_eq!(wrong_key.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong_key.error_type(), "authentication_error");
    let no_version = client.send(http.get(&url).header("x-api-key", &client.key)).await.expect("reply");
    assert_eq!(no_version.status, StatusCode::BAD_REQUEST);
    assert_eq!(no_version.error_type(), "invalid_request_error");
    let bad_version = client
        .send(http.get(&url).header("x-api-key", &client.key).header("anthropic-version", "1999-01-01"))
        .await
        .expect("reply");
    assert_eq!(bad_version.status, StatusCode::BAD_REQUEST);

    for (method, path) in [
        (Method::GET, "/v1/messages/batches/msgbatch_unknown"),
        (Method::POST, "/v1/messages/batches/msgbatch_unknown/cancel"),
        (Method::DELETE, "/v1/messages/batches/msgbatch_unknown"),
        (Method::GET, "/v1/messages/batches/msgbatch_unknown/results"),
        (Method::GET, "/v1/nothing/here"),
        (Method::PUT, "/v1/messages/batches"),
    ] {
        let reply = client.call(method.clone(), path, None).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{method} {path}: {}", reply.text);
        assert_eq!(reply.error_type(), "not_found_error");
    }

    // Results before the end are not there yet.
    let id = client.create_ok(items(2)).await;
    let reply = client.results(&id).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.error_type(), "not_found_error");
    // The Cloudflare API next door is untouched.
    assert_eq!(anthropic.calls().len(), 12);
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_request_too_large() {
    let emulator = start_with(AnthropicConfig { max_body_bytes: 2_000, ..AnthropicConfig::default() }).await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    let big: Value = (0..40).map(|i| item(&format!("r{i}"), "some words to fill the body")).collect();
    let reply = client.create(big).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", reply.text);
    assert_eq!(reply.error_type(), "request_too_large");
    // Without a content-length (chunked), the body is cut off as it streams.
    let head = format!(
        "POST /anthropic/v1/messages/batches HTTP/1.1\r\nhost: localhost\r\nx-api-key: {}\r\n\
         anthropic-version: 2023-06-01\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        client.key
    );
    let chunk = format!("5dc\r\n{}\r\n", " ".repeat(1_500));
    let mut stream = tokio::net::TcpStream::connect(emulator.addr()).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write head");
    // The emulator may answer (and close) before the whole body is sent: later writes may fail.
    for _ in 0..2 {
        let _ = stream.write_all(chunk.as_bytes()).await;
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("request_too_large"), "{answer}");
    assert_eq!(anthropic.batch_count(), 0);
    assert_eq!(client.create(items(2)).await.status, StatusCode::OK);
}

#[tokio::test]
async fn status_faults_answer_the_documented_errors_and_create_nothing() {
    let emulator = start_paused().await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    anthropic.inject(AnthropicFault::status(429).retry_after(7).on(AnthropicCalls::Create));
    anthropic.inject(AnthropicFault::status(529).on(AnthropicCalls::Create));
    anthropic.inject(AnthropicFault::status(500).on(AnthropicCalls::Create));
    anthropic.inject(AnthropicFault::status(413).on(AnthropicCalls::Create));
    anthropic.inject(AnthropicFault::status(429).on(AnthropicCalls::Create));
    let expected = [
        (429, "rate_limit_error", Some("7")),
        (529, "overloaded_error", None),
        (500, "api_error", None),
        (413, "request_too_large", None),
        (429, "rate_limit_error", Some("1")),
    ];
    for (status, error_type, retry_after) in expected {
        let reply = client.create(items(1)).await;
        assert_eq!(reply.status.as_u16(), status, "{}", reply.text);
        assert_eq!(reply.error_type(), error_type);
        assert_eq!(reply.headers.get("retry-after").and_then(|value| value.to_str().ok()), retry_after);
    }
    assert_eq!(anthropic.batch_count(), 0, "a fault before handling creates no batch");
    let id = client.create_ok(items(1)).await;

    // A fault restricted to one kind of call leaves the others alone.
    anthropic.inject(AnthropicFault::status(529).on(AnthropicCalls::Cancel));
    assert_eq!(client.retrieve(&id).await.status, StatusCode::OK);
    assert_eq!(anthropic.pending_faults().len(), 1);
    let reply = client.cancel(&id).await;
    assert_eq!(reply.status.as_u16(), 529);
    assert_eq!(client.retrieve(&id).await.body["processing_status"], "in_progress", "the faulted cancel did nothing");

    let creates = anthropic.calls_of(AnthropicCallKind::Create);
    assert_eq!(creates.len(), 6);
    let statuses: Vec<u16> = creates.iter().map(|call| call.status).collect();
    assert_eq!(statuses, [429, 529, 500, 413, 429, 200]);
    assert!(creates[..5].iter().all(|call| call.fault.as_deref() == Some("status") && call.batch_id.is_none()));
    assert_eq!(creates[0].error_type.as_deref(), Some("rate_limit_error"));
    assert_eq!(anthropic.calls_of(AnthropicCallKind::Cancel)[0].status, 529);
}

#[tokio::test]
async fn an_uncertain_create_has_made_its_batch_and_listing_finds_it() {
    let emulator = start_paused().await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);

    // The reply is a 500, but the batch exists.
    anthropic.inject(AnthropicFault::status_after(500).on(AnthropicCalls::Create));
    let reply = client.create(items(3)).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(reply.error_type(), "api_error");
    assert_eq!(anthropic.batch_count(), 1);

    // The connection drops without a reply, and the batch exists.
    anthropic.inject(AnthropicFault::reset_after().on(AnthropicCalls::Create));
    let dropped =
        client.send(client.request(Method::POST, "/v1/messages/batches").json(&json!({ "requests": items(2) })));
    assert!(dropped.await.is_err(), "no reply reaches the client");
    assert_eq!(anthropic.batch_count(), 2);

    // A slow reply: the client times out, the batch exists.
    anthropic.inject(AnthropicFault::delay(Duration::from_secs(5)).on(AnthropicCalls::Create));
    let impatient = client
        .request(Method::POST, "/v1/messages/batches")
        .json(&json!({ "requests": items(4) }))
        .timeout(Duration::from_millis(200));
    assert!(client.send(impatient).await.expect_err("a timeout").is_timeout());
    assert_eq!(anthropic.batch_count(), 3);

    // The call log names each batch; the list (newest first) finds them by request count.
    let creates = anthropic.calls_of(AnthropicCallKind::Create);
    let logged: Vec<(u16, Option<&str>, Option<usize>)> =
        creates.iter().map(|call| (call.status, call.fault.as_deref(), call.n_requests)).collect();
    assert_eq!(
        logged,
        [(500, Some("status_after"), Some(3)), (0, Some("reset_after"), Some(2)), (200, Some("delay"), Some(4))]
    );
    let listed = client.list("").await;
    let data = listed.body["data"].as_array().expect("data");
    let ids: Vec<&str> = data.iter().map(|batch| batch["id"].as_str().expect("id")).collect();
    let logged_ids: Vec<&str> =
        creates.iter().rev().map(|call| call.batch_id.as_deref().expect("a batch id")).collect();
    assert_eq!(ids, logged_ids, "newest first");
    let counts: Vec<u64> =
        data.iter().map(|batch| batch["request_counts"]["processing"].as_u64().expect("count")).collect();
    assert_eq!(counts, [4, 2, 3]);
}

#[tokio::test]
async fn a_held_create_has_made_its_batch_and_replies_only_once_released() {
    let emulator = start_paused().await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    let control = format!("http://{}/_emulator/anthropic", emulator.addr());
    let http = reqwest::Client::new();
    let spawn_create = |n: usize| {
        let client = Client::of(&anthropic);
        tokio::spawn(async move { client.create(items(n)).await })
    };

    anthropic.inject(AnthropicFault::hold().on(AnthropicCalls::Create));
    let create = spawn_create(3);
    assert!(anthropic.wait_until_held(1, DEADLINE).await, "the create is held");
    // The batch exists and the call is on record while its client still waits for the reply.
    assert_eq!((anthropic.batch_count(), anthropic.held_replies()), (1, 1));
    let logged = anthropic.calls_of(AnthropicCallKind::Create);
    assert_eq!(logged.len(), 1);
    assert_eq!((logged[0].status, logged[0].fault.as_deref(), logged[0].n_requests), (200, Some("hold"), Some(3)));
    let listed = client.list("").await;
    assert_eq!(listed.body["data"][0]["id"].as_str(), logged[0].batch_id.as_deref(), "other calls are not held");
    assert!(!create.is_finished(), "no reply yet");
    let view: Value = http.get(format!("{control}/held")).send().await.expect("held").json().await.expect("json");
    assert_eq!(view, json!({ "held": 1, "ever_held": 1 }));
    let released: Value =
        http.post(format!("{control}/held/release")).send().await.expect("release").json().await.expect("json");
    assert_eq!(released, json!({ "released": 1 }));
    let reply = create.await.expect("joined");
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.body["id"].as_str(), logged[0].batch_id.as_deref(), "the reply names the logged batch");
    assert_eq!(anthropic.held_replies(), 0);

    // A client that goes away while its reply is held: the server drops the call, which is held no longer.
    anthropic.inject(AnthropicFault::hold().on(AnthropicCalls::Create));
    let create = spawn_create(2);
    assert!(anthropic.wait_until_held(1, DEADLINE).await, "the create is held");
    create.abort();
    wait_until("the dropped client's call to end", async || anthropic.held_replies() == 0).await;
    assert_eq!(anthropic.batch_count(), 2, "its batch stays");
    assert_eq!(anthropic.release_held(), 0, "nothing left to release");
}

#[tokio::test]
async fn reset_and_delay_before_a_reply() {
    let emulator = start_paused().await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    anthropic.inject(AnthropicFault::reset().on(AnthropicCalls::Create));
    let dropped =
        client.send(client.request(Method::POST, "/v1/messages/batches").json(&json!({ "requests": items(1) })));
    assert!(dropped.await.is_err());
    assert_eq!(anthropic.batch_count(), 0, "a reset before handling creates nothing");
    let id = client.create_ok(items(1)).await;

    anthropic.inject(AnthropicFault::delay(Duration::from_millis(300)).on(AnthropicCalls::Retrieve));
    let started = Instant::now();
    let reply = client.retrieve(&id).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
    let statuses: Vec<(u16, Option<String>)> =
        anthropic.calls().into_iter().map(|call| (call.status, call.fault)).collect();
    assert_eq!(statuses, [(0, Some("reset".to_owned())), (200, None), (200, Some("delay".to_owned()))]);
    anthropic.inject(AnthropicFault::status(500).on(AnthropicCalls::Retrieve));
    anthropic.reset();
    assert!(anthropic.calls().is_empty());
    assert!(anthropic.pending_faults().is_empty(), "a reset clears the pending faults");
    assert_eq!(client.retrieve(&id).await.status, StatusCode::OK, "batches survive a reset");
}

#[tokio::test]
async fn cancel_keeps_the_finished_items_and_cancels_the_rest() {
    let emulator = start_with(AnthropicConfig {
        processing_for: FOREVER,
        canceling_for: Duration::from_millis(200),
        ..AnthropicConfig::default()
    })
    .await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    let id = client.create_ok(items(5)).await;
    assert!(anthropic.finish_items(&id, 2));
    let batch = client.retrieve(&id).await.body;
    assert_eq!(batch["processing_status"], "in_progress");
    assert_eq!(batch["request_counts"]["processing"], 5, "requests count as processing until the batch ends");

    let canceling = client.cancel(&id).await;
    assert_eq!(canceling.status, StatusCode::OK, "{}", canceling.text);
    assert_eq!(canceling.body["processing_status"], "canceling");
    assert!(parse_time(&canceling.body["cancel_initiated_at"]) <= SystemTime::now());
    assert_eq!(canceling.body["request_counts"]["processing"], 5);
    assert_eq!(client.cancel(&id).await.body["processing_status"], "canceling", "a second cancel changes nothing");

    let ended = client.wait_ended(&id).await;
    assert_eq!(
        ended["request_counts"],
        json!({ "processing": 0, "succeeded": 2, "errored": 0, "canceled": 3, "expired": 0 })
    );
    assert!(parse_time(&ended["ended_at"]) >= parse_time(&ended["cancel_initiated_at"]));
    let results = by_custom_id(&lines(&client.results(&id).await));
    let types: Vec<&str> = results.values().map(|result| result["type"].as_str().expect("type")).collect();
    assert_eq!(types, ["succeeded", "succeeded", "canceled", "canceled", "canceled"]);
    assert_eq!(results["req-2"], json!({ "type": "canceled" }));

    let again = client.cancel(&id).await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST, "an ended batch cannot be canceled");
    assert_eq!(again.error_type(), "invalid_request_error");
    assert_eq!(anthropic.calls_of(AnthropicCallKind::Cancel).len(), 3);

    // A cancel before any item finished cancels them all.
    let id = client.create_ok(items(2)).await;
    client.cancel(&id).await;
    let ended = client.wait_ended(&id).await;
    assert_eq!(ended["request_counts"]["canceled"], 2);
}

#[tokio::test]
async fn expiry_marks_the_unfinished_items_expired() {
    let emulator = start_paused().await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    let id = client.create_ok(items(3)).await;
    assert!(anthropic.finish_items(&id, 1));
    anthropic.update_config(|config| config.expires_after = Duration::ZERO);
    let batch = client.retrieve(&id).await.body;
    assert_eq!(batch["processing_status"], "ended");
    assert_eq!(
        batch["request_counts"],
        json!({ "processing": 0, "succeeded": 1, "errored": 0, "canceled": 0, "expired": 2 })
    );
    assert_eq!(batch["ended_at"], batch["expires_at"]);
    let results = by_custom_id(&lines(&client.results(&id).await));
    assert_eq!(results["req-0"]["type"], "succeeded");
    assert_eq!(results["req-1"], json!({ "type": "expired" }));
    assert_eq!(results["req-2"], json!({ "type": "expired" }));
    assert!(!anthropic.finish_items(&id, 3), "an ended batch stays as it ended");

    // Past the retention the batch is archived: still visible, results gone.
    anthropic.update_config(|config| config.results_kept_for = Duration::ZERO);
    let batch = client.retrieve(&id).await.body;
    assert!(batch["archived_at"].is_string(), "{batch}");
    let reply = client.results(&id).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.error_type(), "not_found_error");
}

#[tokio::test]
async fn list_pages_run_newest_first_in_both_directions() {
    let emulator = start_paused().await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(client.create_ok(items(1)).await);
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    let page_of = |reply: &Reply| -> (Vec<String>, bool, Value, Value) {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let data = reply.body["data"].as_array().expect("data");
        let ids = data.iter().map(|batch| batch["id"].as_str().expect("id").to_owned()).collect();
        (
            ids,
            reply.body["has_more"].as_bool().expect("has_more"),
            reply.body["first_id"].clone(),
            reply.body["last_id"].clone(),
        )
    };

    let all = page_of(&client.list("").await);
    assert_eq!(all.0, newest_first, "default limit 20 holds them all");
    assert!(!all.1);

    // Forward, as an SDK pages: after_id = last_id.
    let mut seen = Vec::new();
    let mut query = "?limit=2".to_owned();
    loop {
        let (page, has_more, first_id, last_id) = page_of(&client.list(&query).await);
        assert_eq!(first_id, json!(page[0]));
        assert_eq!(last_id, json!(page[page.len() - 1]));
        seen.extend(page);
        if !has_more {
            break;
        }
        query = format!("?limit=2&after_id={}", last_id.as_str().expect("last id"));
    }
    assert_eq!(seen, newest_first);

    // Backward: before_id = first_id gives the newer page.
    let (page, has_more, _, _) = page_of(&client.list(&format!("?limit=2&before_id={}", newest_first[3])).await);
    assert_eq!(page, newest_first[1..3]);
    assert!(has_more);
    let (page, has_more, _, _) = page_of(&client.list(&format!("?limit=2&before_id={}", newest_first[1])).await);
    assert_eq!(page, newest_first[..1]);
    assert!(!has_more);

    for query in ["?limit=0", "?limit=1001", "?limit=x", "?after_id=msgbatch_unknown"] {
        let reply = client.list(query).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{query}: {}", reply.text);
        assert_eq!(reply.error_type(), "invalid_request_error");
    }
    let empty = start_paused().await;
    let reply = Client::of(&empty.anthropic()).list("").await;
    assert_eq!(reply.body, json!({ "data": [], "has_more": false, "first_id": null, "last_id": null }));
}

#[tokio::test]
async fn delete_works_only_once_the_batch_has_ended() {
    let emulator = start_with(AnthropicConfig {
        processing_for: FOREVER,
        canceling_for: Duration::ZERO,
        ..AnthropicConfig::default()
    })
    .await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    let kept = client.create_ok(items(1)).await;
    let id = client.create_ok(items(2)).await;
    let path = format!("/v1/messages/batches/{id}");
    let reply = client.call(Method::DELETE, &path, None).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert_eq!(reply.error_type(), "invalid_request_error");

    assert_eq!(client.cancel(&id).await.body["processing_status"], "ended", "canceling_for 0 ends at once");
    let reply = client.call(Method::DELETE, &path, None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.body, json!({ "id": id, "type": "message_batch_deleted" }));
    assert_eq!(client.retrieve(&id).await.status, StatusCode::NOT_FOUND);
    assert_eq!(client.call(Method::DELETE, &path, None).await.status, StatusCode::NOT_FOUND);
    let listed: Vec<Value> = client.list("").await.body["data"].as_array().expect("data").clone();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], json!(kept));
    assert_eq!(anthropic.batch_count(), 2, "deleted batches still count as created");
    assert_eq!(anthropic.calls_of(AnthropicCallKind::Delete).len(), 3);
}

#[tokio::test]
async fn queued_requests_over_the_limit_are_429() {
    let emulator = start_with(AnthropicConfig {
        processing_for: FOREVER,
        max_queued_requests: Some(5),
        ..AnthropicConfig::default()
    })
    .await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    let id = client.create_ok(items(4)).await;
    let reply = client.create(items(2)).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{}", reply.text);
    assert_eq!(reply.error_type(), "rate_limit_error");
    assert!(reply.headers.get("retry-after").is_some());
    assert_eq!(client.create(items(1)).await.status, StatusCode::OK, "up to the limit is fine");
    anthropic.set_timing(Duration::ZERO, Duration::ZERO);
    client.wait_ended(&id).await;
    assert_eq!(client.create(items(5)).await.status, StatusCode::OK, "ended batches wait no more");
}

#[tokio::test]
async fn the_control_api_drives_faults_calls_config_and_items() {
    let emulator = start_paused().await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    let control = format!("http://{}/_emulator/anthropic", emulator.addr());
    let http = reqwest::Client::new();

    let faults: Value = http
        .post(format!("{control}/faults"))
        .json(&json!([{ "kind": "status", "status": 529, "calls": "create" }, { "kind": "reset_after", "calls": "cancel" }]))
        .send()
        .await
        .expect("faults")
        .json()
        .await
        .expect("json");
    assert_eq!(faults.as_array().map(Vec::len), Some(2));
    assert_eq!(client.create(items(1)).await.status.as_u16(), 529);
    let id = client.create_ok(items(3)).await;

    let finish =
        http.post(format!("{control}/batches/{id}/finish")).json(&json!({ "items": 3 })).send().await.expect("finish");
    assert_eq!(finish.status(), StatusCode::NO_CONTENT);
    assert_eq!(client.retrieve(&id).await.body["request_counts"]["succeeded"], 3, "all items finished ends the batch");
    let unknown = http.post(format!("{control}/batches/msgbatch_x/finish")).json(&json!({ "items": 1 })).send().await;
    assert_eq!(unknown.expect("finish").status(), StatusCode::NOT_FOUND);

    let batches: Value =
        http.get(format!("{control}/batches")).send().await.expect("batches").json().await.expect("json");
    assert_eq!(batches, json!([{ "id": id, "processing_status": "ended" }]));

    let calls: Vec<Value> =
        http.get(format!("{control}/calls")).send().await.expect("calls").json().await.expect("json");
    let summary: Vec<(String, u64)> = calls
        .iter()
        .map(|call| (call["kind"].as_str().expect("kind").to_owned(), call["status"].as_u64().expect("status")))
        .collect();
    assert_eq!(summary, [("create".to_owned(), 529), ("create".to_owned(), 200), ("retrieve".to_owned(), 200)]);

    let config: Value = http
        .post(format!("{control}/config"))
        .json(&json!({ "processing_ms": 0, "shuffle_results": false, "max_queued_requests": 10 }))
        .send()
        .await
        .expect("config")
        .json()
        .await
        .expect("json");
    assert_eq!(config["processing_ms"], 0);
    assert_eq!(config["shuffle_results"], false);
    assert_eq!(config["max_queued_requests"], 10);
    assert_eq!(anthropic.config().processing_for, Duration::ZERO);
    let refused = http.post(format!("{control}/config")).json(&json!({ "no_such_setting": 1 })).send().await;
    assert!(refused.expect("config").status().is_client_error());

    let reset = http.post(format!("{control}/reset")).send().await.expect("reset");
    assert_eq!(reset.status(), StatusCode::NO_CONTENT);
    assert!(anthropic.calls().is_empty());
    assert!(anthropic.pending_faults().is_empty(), "the cancel fault was cleared too");
    assert_eq!(client.retrieve(&id).await.status, StatusCode::OK);
}

#[tokio::test]
async fn error_items_fail_chosen_items_on_the_api_side() {
    let emulator = start_with(AnthropicConfig::default()).await;
    let anthropic = emulator.anthropic();
    let client = Client::of(&anthropic);
    anthropic.inject(AnthropicFault::error_items([1, 3, 99], 529));
    // A call that is not a create leaves the fault pending.
    assert_eq!(client.list("").await.status, StatusCode::OK);
    assert_eq!(anthropic.pending_faults().len(), 1);
    let id = client.create_ok(items(4)).await;
    assert!(anthropic.pending_faults().is_empty());
    let ended = client.wait_ended(&id).await;
    assert_eq!(
        ended["request_counts"],
        json!({ "processing": 0, "succeeded": 2, "errored": 2, "canceled": 0, "expired": 0 })
    );
    let results = by_custom_id(&lines(&client.results(&id).await));
    assert_eq!(results["req-1"]["error"]["error"]["type"], "overloaded_error");
    assert_eq!(results["req-3"]["error"]["error"]["type"], "overloaded_error");
    assert_eq!(results["req-0"]["type"], "succeeded");
    let create = &anthropic.calls_of(AnthropicCallKind::Create)[0];
    assert_eq!((create.status, create.fault.as_deref()), (200, Some("error_items")));
}
