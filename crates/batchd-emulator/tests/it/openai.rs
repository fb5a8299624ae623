//! The OpenAI Files and Batch API emulator under `/openai/v1`, driven over real HTTP as a client would: upload,
//! create, poll, download; validation failures with their lines; cancel and expiry with partial results; faults;
//! list paging; delete; the call log and the control API.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use batchd_emulator::{
    EmulatorConfig, EmulatorHandle, OpenAiCallKind, OpenAiConfig, OpenAiFault, OpenAiLimits, OpenAiTiming,
};
use reqwest::{
    StatusCode,
    multipart::{Form, Part},
};
use serde_json::{Value, json};

use crate::{DEADLINE, FOREVER, Reply, start, wait_until};

const CHAT: &str = "/v1/chat/completions";
const EMBEDDINGS: &str = "/v1/embeddings";
const RESPONSES: &str = "/v1/responses";

/// A minimal OpenAI client over reqwest.
struct Client {
    /// `http://ADDR/openai/v1`.
    base: String,
    /// The key sent as a bearer token.
    key: String,
    /// The HTTP client.
    http: reqwest::Client,
}

async fn reply_of(response: reqwest::Response) -> Reply {
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.expect("a body");
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply { status, headers, body }
}

impl Client {
    fn of(emulator: &EmulatorHandle) -> Self {
        Self {
            base: emulator.openai_base_url(),
            key: emulator.openai().api_key().to_owned(),
            http: reqwest::Client::new(),
        }
    }

    async fn try_upload(&self, filename: &str, content: &str) -> Result<Reply, reqwest::Error> {
        let part = Part::bytes(content.as_bytes().to_vec()).file_name(filename.to_owned());
        let form = Form::new().text("purpose", "batch").part("file", part);
        let response =
            self.http.post(format!("{}/files", self.base)).bearer_auth(&self.key).multipart(form).send().await?;
        Ok(reply_of(response).await)
    }

    async fn upload(&self, content: &str) -> String {
        let reply = self.try_upload("input.jsonl", content).await.expect("a reply");
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        reply.body["id"].as_str().expect("a file id").to_owned()
    }

    async fn try_create(&self, body: &Value) -> Result<Reply, reqwest::Error> {
        let response =
            self.http.post(format!("{}/batches", self.base)).bearer_auth(&self.key).json(body).send().await?;
        Ok(reply_of(response).await)
    }

    async fn create(&self, file_id: &str, endpoint: &str) -> String {
        let body = json!({ "input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h" });
        let reply = self.try_create(&body).await.expect("a reply");
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        assert_eq!(reply.body["status"], "validating");
        reply.body["id"].as_str().expect("a batch id").to_owned()
    }

    async fn get(&self, path: &str) -> Reply {
        let response =
            self.http.get(format!("{}{path}", self.base)).bearer_auth(&self.key).send().await.expect("reply");
        reply_of(response).await
    }

    async fn post(&self, path: &str) -> Reply {
        let response =
            self.http.post(format!("{}{path}", self.base)).bearer_auth(&self.key).send().await.expect("reply");
        reply_of(response).await
    }

    async fn delete(&self, path: &str) -> Reply {
        let response =
            self.http.delete(format!("{}{path}", self.base)).bearer_auth(&self.key).send().await.expect("reply");
        reply_of(response).await
    }

    async fn batch(&self, id: &str) -> Value {
        let reply = self.get(&format!("/batches/{id}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        reply.body
    }

    /// Polls until the batch reaches `status`; returns the batch object.
    async fn wait_for(&self, id: &str, status: &str) -> Value {
        let mut last = Value::Null;
        wait_until(&format!("batch {id} to be {status}"), async || {
            last = self.batch(id).await;
            last["status"] == status
        })
        .await;
        last
    }

    /// A file's lines, parsed.
    async fn lines(&self, file_id: &Value) -> Vec<Value> {
        let id = file_id.as_str().expect("a file id");
        let response = self
            .http
            .get(format!("{}/files/{id}/content", self.base))
            .bearer_auth(&self.key)
            .send()
            .await
            .expect("reply");
        assert_eq!(response.status(), StatusCode::OK);
        let text = response.text().await.expect("content");
        text.lines().map(|line| serde_json::from_str(line).expect("a JSON line")).collect()
    }
}

/// An emulator whose OpenAI batches move with `timing`.
async fn start_with(timing: OpenAiTiming) -> EmulatorHandle {
    start(EmulatorConfig { openai: OpenAiConfig { timing, ..OpenAiConfig::default() }, ..EmulatorConfig::default() })
        .await
}

/// Timing that holds batches in `validating` until a test releases them.
fn held() -> OpenAiTiming {
    OpenAiTiming { validating_for: FOREVER, ..OpenAiTiming::default() }
}

fn line(custom_id: &str, endpoint: &str, body: Value) -> String {
    json!({ "custom_id": custom_id, "method": "POST", "url": endpoint, "body": body }).to_string()
}

fn chat_body(i: usize) -> Value {
    json!({ "model": "gpt-4o-mini", "messages": [{ "role": "user", "content": format!("question number {i}") }] })
}

fn body_for(endpoint: &str, i: usize) -> Value {
    match endpoint {
        CHAT => chat_body(i),
        EMBEDDINGS => json!({ "model": "text-embedding-3-small", "input": format!("text {i}") }),
        _ => json!({ "model": "gpt-4.1-mini", "input": format!("prompt number {i}") }),
    }
}

fn jsonl(endpoint: &str, n: usize) -> String {
    (0..n).map(|i| line(&format!("item-{i}"), endpoint, body_for(endpoint, i)) + "\n").collect()
}

fn custom_ids(lines: &[Value]) -> Vec<String> {
    lines.iter().map(|line| line["custom_id"].as_str().expect("custom_id").to_owned()).collect()
}

#[tokio::test]
async fn chat_embeddings_and_responses_complete_with_shuffled_results_that_join_on_custom_id() {
    let emulator = start_with(OpenAiTiming::default()).await;
    let client = Client::of(&emulator);
    let n = 20;
    for (endpoint, object) in [(CHAT, "chat.completion"), (EMBEDDINGS, "list"), (RESPONSES, "response")] {
        let file_id = client.upload(&jsonl(endpoint, n)).await;
        let batch_id = client.create(&file_id, endpoint).await;
        let batch = client.wait_for(&batch_id, "completed").await;
        assert_eq!(batch["object"], "batch");
        assert_eq!(batch["endpoint"], endpoint);
        assert_eq!(batch["request_counts"], json!({ "total": n, "completed": n, "failed": 0 }));
        assert_eq!(batch["error_file_id"], Value::Null);
        assert!(batch["usage"]["input_tokens"].as_u64().expect("usage") >= n as u64, "{endpoint}: {batch}");
        let created = batch["created_at"].as_u64().expect("created_at");
        for field in ["in_progress_at", "finalizing_at", "completed_at"] {
            assert!(batch[field].as_u64().expect(field) >= created, "{field}");
        }
        assert_eq!(batch["expires_at"].as_u64(), Some(created + 24 * 3600));

        let output = client.lines(&batch["output_file_id"]).await;
        assert_eq!(output.len(), n);
        let ids = custom_ids(&output);
        let expected: Vec<String> = (0..n).map(|i| format!("item-{i}")).collect();
        assert_ne!(ids, expected, "{endpoint}: the output file is shuffled");
        let joined: HashMap<String, &Value> = ids.iter().cloned().zip(output.iter()).collect();
        assert_eq!(joined.keys().cloned().collect::<HashSet<_>>(), expected.iter().cloned().collect());
        for i in 0..n {
            let line = joined[&format!("item-{i}")];
            assert_eq!(line["error"], Value::Null);
            assert!(line["id"].as_str().expect("id").starts_with("batch_req_"));
            assert_eq!(line["response"]["status_code"], 200);
            assert!(line["response"]["request_id"].is_string());
            let body = &line["response"]["body"];
            assert_eq!(body["object"], object, "{endpoint}");
            match endpoint {
                CHAT => {
                    assert_eq!(body["choices"][0]["message"]["content"], format!("echo: question number {i}"));
                    assert!(body["usage"]["total_tokens"].as_u64().expect("usage") > 0);
                }
                EMBEDDINGS => assert_eq!(body["data"][0]["embedding"].as_array().map(Vec::len), Some(8)),
                _ => assert_eq!(body["output"][0]["content"][0]["text"], format!("echo: prompt number {i}")),
            }
        }
    }
}

#[tokio::test]
async fn keep_order_lists_requests_in_input_order() {
    let emulator = start_with(OpenAiTiming::default()).await;
    emulator.openai().set_shuffle(false);
    let client = Client::of(&emulator);
    let batch_id = client.create(&client.upload(&jsonl(CHAT, 10)).await, CHAT).await;
    let batch = client.wait_for(&batch_id, "completed").await;
    let ids = custom_ids(&client.lines(&batch["output_file_id"]).await);
    assert_eq!(ids, (0..10).map(|i| format!("item-{i}")).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_body_the_endpoint_refuses_fails_alone_in_the_error_file() {
    let emulator = start_with(OpenAiTiming::default()).await;
    let client = Client::of(&emulator);
    let content = [
        line("good", CHAT, chat_body(0)),
        line("no-messages", CHAT, json!({ "model": "gpt-4o-mini" })),
        line("good-2", CHAT, chat_body(2)),
    ]
    .join("\n");
    let batch_id = client.create(&client.upload(&content).await, CHAT).await;
    let batch = client.wait_for(&batch_id, "completed").await;
    assert_eq!(batch["request_counts"], json!({ "total": 3, "completed": 2, "failed": 1 }));
    let errors = client.lines(&batch["error_file_id"]).await;
    assert_eq!(custom_ids(&errors), ["no-messages"]);
    assert_eq!(errors[0]["error"], Value::Null);
    assert_eq!(errors[0]["response"]["status_code"], 400);
    let error = &errors[0]["response"]["body"]["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["param"], "messages");
    let output = client.lines(&batch["output_file_id"]).await;
    assert_eq!(
        custom_ids(&output).into_iter().collect::<HashSet<_>>(),
        HashSet::from(["good".into(), "good-2".into()])
    );

    // When every request fails there is no output file at all.
    let content = line("bad", CHAT, json!({ "model": "gpt-4o-mini", "messages": [] }));
    let batch_id = client.create(&client.upload(&content).await, CHAT).await;
    let batch = client.wait_for(&batch_id, "completed").await;
    assert_eq!(batch["output_file_id"], Value::Null);
    assert_eq!(client.lines(&batch["error_file_id"]).await.len(), 1);
}

#[tokio::test]
async fn every_validation_failure_names_its_line() {
    let emulator = start_with(OpenAiTiming::default()).await;
    let client = Client::of(&emulator);
    let content = [
        line("a", CHAT, chat_body(0)),
        "{not json".to_owned(),
        line("a", CHAT, chat_body(2)),
        json!({ "custom_id": "d", "method": "GET", "url": CHAT, "body": chat_body(3) }).to_string(),
        line("e", EMBEDDINGS, chat_body(4)),
        line("f", CHAT, json!({ "messages": [] })),
        line("g", CHAT, json!({ "model": "gpt-4o", "messages": [] })),
        json!({ "method": "POST", "url": CHAT, "body": chat_body(7) }).to_string(),
    ]
    .join("\n");
    let batch_id = client.create(&client.upload(&content).await, CHAT).await;
    let batch = client.wait_for(&batch_id, "failed").await;
    assert!(batch["failed_at"].is_u64());
    assert_eq!(batch["in_progress_at"], Value::Null);
    assert_eq!(batch["errors"]["object"], "list");
    let found: Vec<(String, u64)> = batch["errors"]["data"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|error| (error["code"].as_str().expect("code").to_owned(), error["line"].as_u64().expect("line")))
        .collect();
    let expected = [
        ("invalid_json_line", 2),
        ("duplicate_custom_id", 3),
        ("invalid_method", 4),
        ("url_mismatch", 5),
        ("missing_required_parameter", 6),
        ("model_mismatch", 7),
        ("missing_required_parameter", 8),
    ];
    assert_eq!(found, expected.map(|(code, line)| (code.to_owned(), line)));
    assert!(batch["errors"]["data"][0]["message"].is_string());

    // Caps: too many lines; too many embedding inputs in total.
    emulator.openai().set_limits(OpenAiLimits { max_lines: 3, max_embedding_inputs: 4, ..OpenAiLimits::default() });
    let batch_id = client.create(&client.upload(&jsonl(CHAT, 4)).await, CHAT).await;
    let batch = client.wait_for(&batch_id, "failed").await;
    assert_eq!(batch["errors"]["data"][0]["code"], "too_many_tasks");
    assert_eq!(batch["errors"]["data"][0]["line"], Value::Null);
    let inputs = (0..2)
        .map(|i| line(&i.to_string(), EMBEDDINGS, json!({ "model": "e", "input": ["a", "b", "c"] })))
        .collect::<Vec<_>>()
        .join("\n");
    let batch_id = client.create(&client.upload(&inputs).await, EMBEDDINGS).await;
    let batch = client.wait_for(&batch_id, "failed").await;
    assert_eq!(batch["errors"]["data"][0]["code"], "too_many_tasks");
}

#[tokio::test]
async fn create_and_upload_parameters_are_checked_with_the_error_envelope() {
    let emulator = start_with(held()).await;
    let client = Client::of(&emulator);
    let file_id = client.upload(&jsonl(CHAT, 1)).await;
    let base = json!({ "input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h" });
    let too_many: serde_json::Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    let cases = [
        (json!({ "endpoint": "/v1/audio/speech" }), StatusCode::BAD_REQUEST, Some("endpoint")),
        (json!({ "completion_window": "1h" }), StatusCode::BAD_REQUEST, Some("completion_window")),
        (json!({ "metadata": too_many }), StatusCode::BAD_REQUEST, Some("metadata")),
        (json!({ "metadata": { "k": "v".repeat(513) } }), StatusCode::BAD_REQUEST, Some("metadata")),
        (json!({ "input_file_id": "file-nope" }), StatusCode::NOT_FOUND, Some("input_file_id")),
        (json!({ "stream": true }), StatusCode::BAD_REQUEST, None),
    ];
    for (change, status, param) in cases {
        let mut body = base.clone();
        for (key, value) in change.as_object().expect("object") {
            body[key] = value.clone();
        }
        let reply = client.try_create(&body).await.expect("a reply");
        assert_eq!(reply.status, status, "{change}: {:?}", reply.body);
        let error = &reply.body["error"];
        assert!(error["message"].is_string() && error["type"].is_string(), "{change}: {error}");
        assert!(error.as_object().is_some_and(|error| error.contains_key("code")), "{change}");
        assert_eq!(error["param"].as_str(), param, "{change}");
        assert!(reply.headers.get("x-request-id").is_some());
    }
    let mut huge = base.clone();
    huge["metadata"] = json!({ "k": "v".repeat(100_000) });
    let reply = client.try_create(&huge).await.expect("a reply");
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(reply.body["error"]["message"].as_str().expect("message").contains("larger than"));
    assert_eq!(emulator.openai().batch_count(), 0);

    // Auth: a wrong key is 401 with the envelope, on every endpoint.
    let wrong = Client { key: "sk-wrong".into(), ..Client::of(&emulator) };
    let reply = wrong.get(&format!("/files/{file_id}")).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply.body["error"]["code"], "invalid_api_key");
    assert!(reply.headers.get("x-request-id").is_some());
    assert_eq!(wrong.try_upload("a.jsonl", "x").await.expect("reply").status, StatusCode::UNAUTHORIZED);

    // Uploads: only .jsonl, only purpose=batch, and at most max_file_bytes.
    let reply = client.try_upload("input.csv", "a,b").await.expect("reply");
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.body["error"]["message"], "Invalid file format for Batch API. Must be .jsonl");
    let part = Part::bytes(b"{}".to_vec()).file_name("a.jsonl");
    let form = Form::new().text("purpose", "fine-tune").part("file", part);
    let reply = reply_of(
        client
            .http
            .post(format!("{}/files", client.base))
            .bearer_auth(&client.key)
            .multipart(form)
            .send()
            .await
            .expect("reply"),
    )
    .await;
    assert_eq!(reply.body["error"]["param"], "purpose");
    emulator.openai().set_limits(OpenAiLimits { max_file_bytes: 1000, ..OpenAiLimits::default() });
    let reply = client.try_upload("big.jsonl", &"x".repeat(1001)).await.expect("reply");
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.body["error"]["code"], "file_too_large");
    assert_eq!(client.try_upload("fits.jsonl", &"x".repeat(1000)).await.expect("reply").status, StatusCode::OK);

    // A path the API does not have.
    let reply = client.get("/assistants").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.body["error"]["message"], "Invalid URL (GET /v1/assistants)");
}

#[tokio::test]
async fn cancel_keeps_the_finished_requests_and_marks_the_rest_cancelled() {
    let emulator =
        start_with(OpenAiTiming { cancelling_for: Duration::from_millis(200), ..OpenAiTiming::default() }).await;
    let client = Client::of(&emulator);
    emulator.openai().inject(OpenAiFault::stall(3));
    let batch_id = client.create(&client.upload(&jsonl(CHAT, 10)).await, CHAT).await;
    client.wait_for(&batch_id, "in_progress").await;
    wait_until("3 requests to finish", async || client.batch(&batch_id).await["request_counts"]["completed"] == 3)
        .await;

    let reply = client.post(&format!("/batches/{batch_id}/cancel")).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(reply.body["status"], "cancelling");
    assert!(reply.body["cancelling_at"].is_u64());
    let batch = client.wait_for(&batch_id, "cancelled").await;
    assert!(batch["cancelled_at"].is_u64());
    assert_eq!(batch["request_counts"], json!({ "total": 10, "completed": 3, "failed": 0 }));
    let output = client.lines(&batch["output_file_id"]).await;
    let errors = client.lines(&batch["error_file_id"]).await;
    assert_eq!((output.len(), errors.len()), (3, 7));
    let all: HashSet<String> = custom_ids(&output).into_iter().chain(custom_ids(&errors)).collect();
    assert_eq!(all.len(), 10, "every request is in exactly one file");
    for line in &errors {
        assert_eq!(line["response"], Value::Null);
        assert_eq!(line["error"]["code"], "batch_cancelled");
    }

    // A finished batch cannot be cancelled; an unknown one is 404.
    let reply = client.post(&format!("/batches/{batch_id}/cancel")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(client.post("/batches/batch_nope/cancel").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_batch_cancelled_while_validating_ends_with_no_results() {
    let emulator = start_with(held()).await;
    let client = Client::of(&emulator);
    let batch_id = client.create(&client.upload(&jsonl(CHAT, 3)).await, CHAT).await;
    let reply = client.post(&format!("/batches/{batch_id}/cancel")).await;
    assert_eq!(reply.body["status"], "cancelling");
    assert!(reply.headers.get("x-request-id").is_some(), "success replies carry x-request-id too");
    // Cancelling again answers the batch as it is.
    assert_eq!(client.post(&format!("/batches/{batch_id}/cancel")).await.body["status"], "cancelling");
    let batch = client.wait_for(&batch_id, "cancelled").await;
    assert_eq!(batch["request_counts"], json!({ "total": 0, "completed": 0, "failed": 0 }));
    assert_eq!((batch["output_file_id"].clone(), batch["error_file_id"].clone()), (Value::Null, Value::Null));
    assert_eq!(batch["in_progress_at"], Value::Null);
}

#[tokio::test]
async fn an_expired_batch_keeps_partial_results_and_marks_the_rest_expired() {
    let timing = OpenAiTiming { completion_window: Duration::from_millis(400), ..OpenAiTiming::default() };
    let emulator = start_with(timing).await;
    let client = Client::of(&emulator);
    emulator.openai().inject(OpenAiFault::stall(2));
    let batch_id = client.create(&client.upload(&jsonl(CHAT, 5)).await, CHAT).await;
    let batch = client.wait_for(&batch_id, "expired").await;
    assert!(batch["expired_at"].is_u64());
    assert_eq!(batch["completed_at"], Value::Null);
    assert_eq!(batch["request_counts"]["completed"], 2);
    assert_eq!(client.lines(&batch["output_file_id"]).await.len(), 2);
    let errors = client.lines(&batch["error_file_id"]).await;
    assert_eq!(errors.len(), 3);
    for line in &errors {
        assert_eq!(line["error"]["code"], "batch_expired");
        assert_eq!(
            line["error"]["message"],
            "This request could not be executed before the completion window expired."
        );
    }
}

#[tokio::test]
async fn status_faults_answer_with_the_envelope_and_retry_after_and_create_nothing() {
    let emulator = start_with(held()).await;
    let client = Client::of(&emulator);
    let openai = emulator.openai();
    let file_id = client.upload(&jsonl(CHAT, 1)).await;
    openai.inject(OpenAiFault::status(429).retry_after(7).on(OpenAiCallKind::CreateBatch));
    let body = json!({ "input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h" });
    let reply = client.try_create(&body).await.expect("reply");
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.headers.get("retry-after").and_then(|value| value.to_str().ok()), Some("7"));
    assert_eq!(reply.body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(openai.batch_count(), 0, "a faulted create creates nothing");

    // 5xx on any endpoint, once each.
    openai.inject(OpenAiFault::status(503).times(2));
    assert_eq!(client.get(&format!("/files/{file_id}")).await.status, StatusCode::SERVICE_UNAVAILABLE);
    let reply = client.get("/batches").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.body["error"]["type"], "server_error");
    assert_eq!(client.get("/batches").await.status, StatusCode::OK);

    // A reset upload stores nothing.
    openai.inject(OpenAiFault::reset().on(OpenAiCallKind::Upload));
    let files_before = openai.file_ids().len();
    assert!(client.try_upload("x.jsonl", &jsonl(CHAT, 1)).await.is_err(), "the connection is dropped");
    assert_eq!(openai.file_ids().len(), files_before);

    // A slow reply.
    openai.inject(OpenAiFault::delay(Duration::from_millis(300)).on(OpenAiCallKind::GetFile));
    let started = Instant::now();
    assert_eq!(client.get(&format!("/files/{file_id}")).await.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(300));

    let creates = openai.calls_of(OpenAiCallKind::CreateBatch);
    assert_eq!(creates.len(), 1);
    assert_eq!((creates[0].http_status, creates[0].fault.as_deref()), (429, Some("status")));
    let uploads = openai.calls_of(OpenAiCallKind::Upload);
    assert_eq!(uploads.iter().map(|call| call.http_status).collect::<Vec<_>>(), [200, 0]);
    assert!(openai.pending_faults().is_empty());
}

#[tokio::test]
async fn an_uncertain_create_leaves_a_batch_that_listing_by_metadata_finds() {
    let emulator = start_with(held()).await;
    let client = Client::of(&emulator);
    let openai = emulator.openai();
    let file_id = client.upload(&jsonl(CHAT, 1)).await;
    for (fault, label) in [
        (OpenAiFault::status(500).on(OpenAiCallKind::CreateBatch).after_handling(), "job-1"),
        (OpenAiFault::reset().on(OpenAiCallKind::CreateBatch).after_handling(), "job-2"),
    ] {
        openai.inject(fault);
        let body = json!({
            "input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h",
            "metadata": { "batchd_job": label },
        });
        match client.try_create(&body).await {
            Ok(reply) => assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR),
            Err(error) => assert!(label == "job-2", "{error}"),
        }
        let list = client.get("/batches?limit=100").await;
        let found: Vec<&Value> = list.body["data"]
            .as_array()
            .expect("data")
            .iter()
            .filter(|batch| batch["metadata"]["batchd_job"] == label)
            .collect();
        assert_eq!(found.len(), 1, "{label}: the batch exists although the reply failed");
        let logged = openai.calls_of(OpenAiCallKind::CreateBatch);
        let last = logged.last().expect("logged");
        assert_eq!(last.batch_id.as_deref(), found[0]["id"].as_str());
    }
    assert_eq!(openai.batch_count(), 2);

    // A reply slower than the client's timeout: the batch exists and the call is on record all the same.
    openai.inject(OpenAiFault::delay(Duration::from_secs(30)).on(OpenAiCallKind::CreateBatch).after_handling());
    let impatient = Client {
        http: reqwest::Client::builder().timeout(Duration::from_millis(200)).build().expect("client"),
        ..Client::of(&emulator)
    };
    let body = json!({ "input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h" });
    assert!(impatient.try_create(&body).await.is_err(), "the client times out");
    assert_eq!(openai.batch_count(), 3);
    let logged = openai.calls_of(OpenAiCallKind::CreateBatch);
    assert_eq!(logged.len(), 3);
    assert_eq!((logged[2].http_status, logged[2].fault.as_deref()), (200, Some("delay")));
    assert!(logged[2].batch_id.is_some());
}

#[tokio::test]
async fn a_held_create_has_made_its_batch_and_replies_only_once_released() {
    let emulator = start_with(held()).await;
    let client = Client::of(&emulator);
    let openai = emulator.openai();
    let control = format!("http://{}/_emulator/openai", emulator.addr());
    let http = reqwest::Client::new();
    let file_id = client.upload(&jsonl(CHAT, 1)).await;
    let body = json!({ "input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h" });
    let spawn_create = || {
        let (client, body) = (Client::of(&emulator), body.clone());
        tokio::spawn(async move { client.try_create(&body).await })
    };

    // After handling: the batch exists and the call is on record while its client still waits for the reply.
    openai.inject(OpenAiFault::hold().on(OpenAiCallKind::CreateBatch).after_handling());
    let create = spawn_create();
    assert!(openai.wait_until_held(1, DEADLINE).await, "the create is held");
    assert_eq!((openai.batch_count(), openai.held_replies()), (1, 1));
    let logged = openai.calls_of(OpenAiCallKind::CreateBatch);
    assert_eq!((logged.len(), logged[0].http_status, logged[0].fault.as_deref()), (1, 200, Some("hold")));
    let listed = client.get("/batches").await;
    assert_eq!(listed.body["data"][0]["id"].as_str(), logged[0].batch_id.as_deref(), "other calls are not held");
    assert!(!create.is_finished(), "no reply yet");
    let view: Value = http.get(format!("{control}/held")).send().await.expect("held").json().await.expect("json");
    assert_eq!(view, json!({ "held": 1, "ever_held": 1 }));
    assert_eq!(openai.release_held(), 1);
    let reply = create.await.expect("joined").expect("a reply");
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(reply.body["id"].as_str(), logged[0].batch_id.as_deref(), "the reply names the logged batch");
    assert_eq!(openai.held_replies(), 0);

    // Before handling: nothing happens until the release, then the call goes on (released over HTTP).
    openai.inject(OpenAiFault::hold().on(OpenAiCallKind::CreateBatch));
    let create = spawn_create();
    assert!(openai.wait_until_held(1, DEADLINE).await, "the create is held");
    assert_eq!((openai.batch_count(), openai.calls_of(OpenAiCallKind::CreateBatch).len()), (1, 1), "not handled");
    let released: Value =
        http.post(format!("{control}/held/release")).send().await.expect("release").json().await.expect("json");
    assert_eq!(released, json!({ "released": 1 }));
    let reply = create.await.expect("joined").expect("a reply");
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(openai.batch_count(), 2);

    // A client that goes away while its reply is held: the server drops the call, which is held no longer.
    openai.inject(OpenAiFault::hold().on(OpenAiCallKind::CreateBatch).after_handling());
    let create = spawn_create();
    assert!(openai.wait_until_held(1, DEADLINE).await, "the create is held");
    create.abort();
    wait_until("the dropped client's call to end", async || openai.held_replies() == 0).await;
    assert_eq!(openai.batch_count(), 3, "its batch stays");
    let view: Value = http.get(format!("{control}/held")).send().await.expect("held").json().await.expect("json");
    assert_eq!(view, json!({ "held": 0, "ever_held": 3 }));
}

#[tokio::test]
async fn the_enqueued_token_limit_fails_the_batch_in_validation() {
    let emulator = start_with(OpenAiTiming::default()).await;
    let client = Client::of(&emulator);
    let openai = emulator.openai();
    openai.inject(OpenAiFault::token_limit_exceeded());
    let file_id = client.upload(&jsonl(CHAT, 2)).await;
    let batch_id = client.create(&file_id, CHAT).await;
    let batch = client.wait_for(&batch_id, "failed").await;
    let error = &batch["errors"]["data"][0];
    assert_eq!(error["code"], "token_limit_exceeded");
    assert_eq!(error["line"], Value::Null);
    assert_eq!(
        error["message"],
        "Enqueued token limit reached for gpt-4o-mini in organization org-emulator. Limit: 2,000,000 enqueued \
         tokens. Please try again once some in_progress batches have been completed."
    );
    // The same file goes through once the fault is used up.
    let batch_id = client.create(&file_id, CHAT).await;
    client.wait_for(&batch_id, "completed").await;

    // A real cap: a running batch's tokens count against the next one of the same model.
    openai.set_timing(OpenAiTiming { in_progress_for: FOREVER, ..OpenAiTiming::default() });
    openai.set_limits(OpenAiLimits { enqueued_token_limit: Some(10), ..OpenAiLimits::default() });
    let first = client.create(&file_id, CHAT).await;
    client.wait_for(&first, "in_progress").await;
    let second = client.create(&file_id, CHAT).await;
    let batch = client.wait_for(&second, "failed").await;
    assert!(batch["errors"]["data"][0]["message"].as_str().expect("message").contains("Limit: 10 enqueued tokens"));
}

#[tokio::test]
async fn fail_items_puts_those_lines_in_the_error_file_with_500() {
    let emulator = start_with(OpenAiTiming::default()).await;
    let client = Client::of(&emulator);
    emulator.openai().inject(OpenAiFault::fail_items([1, 3]));
    let batch_id = client.create(&client.upload(&jsonl(CHAT, 5)).await, CHAT).await;
    let batch = client.wait_for(&batch_id, "completed").await;
    assert_eq!(batch["request_counts"], json!({ "total": 5, "completed": 3, "failed": 2 }));
    let errors = client.lines(&batch["error_file_id"]).await;
    let mut ids = custom_ids(&errors);
    ids.sort();
    assert_eq!(ids, ["item-1", "item-3"]);
    assert!(errors.iter().all(|line| line["response"]["status_code"] == 500));
    let creates = emulator.openai().calls_of(OpenAiCallKind::CreateBatch);
    assert_eq!(creates[0].fault.as_deref(), Some("fail_items"));
}

#[tokio::test]
async fn list_is_newest_first_and_cursor_paged() {
    let emulator = start_with(held()).await;
    let client = Client::of(&emulator);
    let file_id = client.upload(&jsonl(CHAT, 1)).await;
    let mut created = Vec::new();
    for _ in 0..5 {
        created.push(client.create(&file_id, CHAT).await);
    }
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let query = match &after {
            Some(after) => format!("/batches?limit=2&after={after}"),
            None => "/batches?limit=2".to_owned(),
        };
        let page = client.get(&query).await;
        assert_eq!(page.status, StatusCode::OK, "{:?}", page.body);
        assert_eq!(page.body["object"], "list");
        let ids: Vec<String> = page.body["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|b| b["id"].as_str().expect("id").to_owned())
            .collect();
        assert_eq!(page.body["first_id"].as_str(), ids.first().map(String::as_str));
        assert_eq!(page.body["last_id"].as_str(), ids.last().map(String::as_str));
        seen.extend(ids.iter().cloned());
        if page.body["has_more"] == false {
            break;
        }
        after = ids.last().cloned();
    }
    assert_eq!(seen, newest_first);
    let default_page = client.get("/batches").await;
    assert_eq!(default_page.body["data"].as_array().map(Vec::len), Some(5));
    assert_eq!(default_page.body["has_more"], false);
    assert_eq!(client.get("/batches?limit=0").await.status, StatusCode::BAD_REQUEST);
    assert_eq!(client.get("/batches?limit=101").await.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn files_are_read_and_deleted_and_the_call_log_counts_them() {
    let emulator = start_with(OpenAiTiming::default()).await;
    let client = Client::of(&emulator);
    let openai = emulator.openai();
    let content = jsonl(CHAT, 2);
    let file_id = client.upload(&content).await;
    let file = client.get(&format!("/files/{file_id}")).await.body;
    assert_eq!(file["object"], "file");
    assert_eq!(file["purpose"], "batch");
    assert_eq!(file["filename"], "input.jsonl");
    assert_eq!(file["bytes"], content.len());
    assert_eq!(file["status"], "processed");
    let batch_id = client.create(&file_id, CHAT).await;
    let batch = client.wait_for(&batch_id, "completed").await;
    let output_id = batch["output_file_id"].as_str().expect("output").to_owned();
    let output = client.get(&format!("/files/{output_id}")).await.body;
    assert_eq!(output["purpose"], "batch_output");

    for id in [&file_id, &output_id] {
        let reply = client.delete(&format!("/files/{id}")).await;
        assert_eq!(reply.body, json!({ "id": id, "object": "file", "deleted": true }));
        assert_eq!(client.get(&format!("/files/{id}")).await.status, StatusCode::NOT_FOUND);
        assert_eq!(client.get(&format!("/files/{id}/content")).await.status, StatusCode::NOT_FOUND);
        assert_eq!(client.delete(&format!("/files/{id}")).await.status, StatusCode::NOT_FOUND);
    }
    assert!(openai.file_ids().is_empty());
    // The batch still names its (deleted) files.
    assert_eq!(client.batch(&batch_id).await["output_file_id"], output_id.as_str());

    assert_eq!(openai.calls_of(OpenAiCallKind::Upload).len(), 1);
    assert_eq!(openai.calls_of(OpenAiCallKind::CreateBatch).len(), 1);
    let deletes = openai.calls_of(OpenAiCallKind::DeleteFile);
    assert_eq!(deletes.iter().map(|call| call.http_status).collect::<Vec<_>>(), [200, 404, 200, 404]);
    assert_eq!(deletes[0].file_id.as_deref(), Some(file_id.as_str()));
    assert_eq!(deletes[0].method, "DELETE");
    assert_eq!(deletes[0].path, format!("/openai/v1/files/{file_id}"));
    let calls = openai.calls();
    assert!(calls.windows(2).all(|pair| pair[0].seq < pair[1].seq));
    openai.reset();
    assert!(openai.calls().is_empty());
}

#[tokio::test]
async fn the_control_api_injects_faults_changes_settings_and_reads_the_log() {
    let emulator = start_with(held()).await;
    let client = Client::of(&emulator);
    let http = reqwest::Client::new();
    let control = format!("http://{}/_emulator/openai", emulator.addr());
    let fault = json!({ "kind": "status", "status": 429, "retry_after_secs": 1, "calls": "list_batches" });
    let pending: Value =
        http.post(format!("{control}/faults")).json(&fault).send().await.expect("post").json().await.expect("json");
    assert_eq!(pending.as_array().map(Vec::len), Some(1));
    assert_eq!(client.get("/batches").await.status, StatusCode::TOO_MANY_REQUESTS);

    let config: Value = http
        .post(format!("{control}/config"))
        .json(&json!({ "validating_ms": 0, "shuffle": false, "enqueued_token_limit": 5 }))
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    assert_eq!((config["validating_ms"].as_u64(), config["shuffle"].as_bool()), (Some(0), Some(false)));
    assert_eq!(emulator.openai().limits().enqueued_token_limit, Some(5));
    let batch_id = client.create(&client.upload(&jsonl(CHAT, 1)).await, CHAT).await;
    client.wait_for(&batch_id, "completed").await;

    let batches: Value = http.get(format!("{control}/batches")).send().await.expect("get").json().await.expect("json");
    assert_eq!(batches, json!([{ "id": batch_id, "status": "completed" }]));
    let calls: Value = http.get(format!("{control}/calls")).send().await.expect("get").json().await.expect("json");
    let kinds: Vec<&str> = calls.as_array().expect("calls").iter().filter_map(|call| call["kind"].as_str()).collect();
    assert_eq!(&kinds[..3], ["list_batches", "upload", "create_batch"]);
    let reset = http.post(format!("{control}/reset")).send().await.expect("post");
    assert_eq!(reset.status(), StatusCode::NO_CONTENT);
    assert!(emulator.openai().calls().is_empty());
    // The Cloudflare side is untouched by all this.
    assert_eq!(emulator.batch_count(), 0);
}

#[tokio::test]
async fn the_binary_serves_openai_with_its_flags() {
    let emulator = crate::binary::EmulatorProcess::spawn(
        &["--openai-validating-ms", "7", "--openai-completion-window-ms", "60000"]
            .into_iter()
            .chain(["--openai-max-file-bytes", "1000", "--openai-keep-order"])
            .collect::<Vec<_>>(),
        &[("EMULATOR_OPENAI_KEY", "sk-test")],
    )
    .await;
    let base_url = emulator.base_url.clone();
    let openai = base_url.replace("/client/v4", "/openai/v1");
    let client = Client { base: openai, key: "sk-test".to_owned(), http: reqwest::Client::new() };
    let reply = client.get("/batches").await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let wrong = Client { key: "emulator-openai-key".to_owned(), ..client };
    assert_eq!(wrong.get("/batches").await.status, StatusCode::UNAUTHORIZED);
    let control = base_url.replace("/client/v4", "/_emulator/openai/config");
    let config: Value = reqwest::get(&control).await.expect("config").json().await.expect("json");
    let expected = [("validating_ms", json!(7)), ("completion_window_ms", json!(60_000))]
        .into_iter()
        .chain([("max_file_bytes", json!(1000)), ("shuffle", json!(false))]);
    for (field, value) in expected {
        assert_eq!(config[field], value, "{field}");
    }
    emulator.stop_with_sigterm().await;
}

#[tokio::test]
async fn files_are_listed_by_purpose_newest_first_and_paged() {
    let emulator = start_with(OpenAiTiming::default()).await;
    let client = Client::of(&emulator);
    let mut uploaded = Vec::new();
    for n in 1..=3 {
        uploaded.push(client.upload(&jsonl(CHAT, n)).await);
    }
    let batch_id = client.create(&uploaded[0], CHAT).await;
    let batch = client.wait_for(&batch_id, "completed").await;
    let ids = |reply: &Reply| -> Vec<String> {
        reply.body["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|file| file["id"].as_str().expect("id").to_owned())
            .collect()
    };

    let page = client.get("/files?purpose=batch&limit=2").await;
    assert_eq!(page.status, StatusCode::OK, "{:?}", page.body);
    assert_eq!(page.body["object"], "list");
    assert_eq!(ids(&page), [uploaded[2].clone(), uploaded[1].clone()]);
    assert_eq!(page.body["has_more"], true);
    assert_eq!(page.body["last_id"].as_str(), Some(uploaded[1].as_str()));
    let rest = client.get(&format!("/files?purpose=batch&limit=2&after={}", uploaded[1])).await;
    assert_eq!(ids(&rest), [uploaded[0].clone()]);
    assert_eq!(rest.body["has_more"], false);
    let ascending = client.get("/files?purpose=batch&order=asc").await;
    assert_eq!(ids(&ascending), uploaded);
    let outputs = client.get("/files?purpose=batch_output").await;
    assert_eq!(ids(&outputs), [batch["output_file_id"].as_str().expect("output").to_owned()]);
    assert_eq!(ids(&client.get("/files").await).len(), 4);
    assert_eq!(client.get("/files?order=sideways").await.status, StatusCode::BAD_REQUEST);
    assert_eq!(client.get("/files?after=file-nope").await.status, StatusCode::BAD_REQUEST);
    assert_eq!(emulator.openai().calls_of(OpenAiCallKind::ListFiles).len(), 7);
}
