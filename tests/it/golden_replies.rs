//! Golden replies: each provider client fed the example replies of its vendor's documentation, byte for byte where
//! the docs give a whole reply, through a small HTTP server in the test that answers every call the daemon makes.
//! The emulator is written from the same docs, but it is code: if it and batchd shared a misreading, every other test
//! would pass. These replies are the docs' own text (sources in `/work/shared/reference/` and beside each one
//! below); only what must match the request is filled in — the `custom_id`s batchd sent, the batch's size in its
//! request counts, and a results URL on this server instead of the vendor's host.
//!
//! The daemon runs in-process against real Redis; a job goes in, one result entry comes out, and each item carries
//! what the documented reply said of it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use batchd_core::{ResultEntry, ResultStatus};
use batchd_tests::World;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

const WAIT: Duration = Duration::from_secs(30);

/// One request the server received.
#[derive(Debug, Clone)]
struct Request {
    /// `GET`, `POST`, `DELETE`.
    method: String,
    /// The path, without the query.
    path: String,
    /// The body, as received.
    body: Vec<u8>,
}

/// One reply: status, content type, body.
type Reply = (u16, &'static str, String);

/// What the server answers: the requests so far (this one last) in, the reply out.
type Answer = dyn Fn(&[Request]) -> Reply + Send + Sync;

/// A small HTTP/1.1 server on loopback: answers each request with `answer`, keeps every request for the asserts.
struct Golden {
    /// `http://127.0.0.1:<port>`.
    origin: String,
    /// Every request received, in order.
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Golden {
    /// Starts the server; `answer_for` gets its origin (for URLs in replies) and gives the answering function.
    async fn start(answer_for: impl FnOnce(String) -> Arc<Answer>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let origin = format!("http://{}", listener.local_addr().expect("addr"));
        let answer = answer_for(origin.clone());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&requests);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (answer, log) = (Arc::clone(&answer), Arc::clone(&log));
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut read = BufReader::new(read);
                    while let Some(request) = read_request(&mut read).await {
                        let (status, content_type, body) = {
                            let mut log = log.lock().expect("log");
                            log.push(request);
                            answer(&log)
                        };
                        let head = format!(
                            "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
                            if status == 200 { "OK" } else { "Error" },
                            body.len()
                        );
                        if write.write_all(head.as_bytes()).await.is_err()
                            || write.write_all(body.as_bytes()).await.is_err()
                        {
                            break;
                        }
                    }
                });
            }
        });
        Self { origin, requests }
    }

    /// The requests received so far.
    fn requests(&self) -> Vec<Request> {
        self.requests.lock().expect("log").clone()
    }
}

/// Reads one request (a `content-length` or chunked body); `None` when the connection ends.
async fn read_request<R: tokio::io::AsyncBufRead + Unpin>(read: &mut R) -> Option<Request> {
    let mut line = String::new();
    if read.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.split('?').next()?.to_owned();
    let (mut length, mut chunked) = (0usize, false);
    loop {
        let mut header = String::new();
        read.read_line(&mut header).await.ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().ok()?,
            "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
            _ => {}
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            read.read_line(&mut size).await.ok()?;
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2];
            read.read_exact(&mut chunk).await.ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        body.resize(length, 0);
        read.read_exact(&mut body).await.ok()?;
    }
    Some(Request { method, path, body })
}

fn json_reply(value: &Value) -> Reply {
    (200, "application/json", value.to_string())
}

fn not_found(request: &Request) -> Reply {
    (
        404,
        "application/json",
        json!({"error": format!("no golden reply for {} {}", request.method, request.path)}).to_string(),
    )
}

/// Every `custom_id` in a body: a JSON body's `requests[].custom_id` (Anthropic), or a JSONL file's lines inside a
/// multipart upload (OpenAI), in order.
fn custom_ids(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    if let Ok(value) = serde_json::from_str::<Value>(&text) {
        return value["requests"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|request| request["custom_id"].as_str().map(str::to_owned))
            .collect();
    }
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line.trim()).ok())
        .filter_map(|line| line["custom_id"].as_str().map(str::to_owned))
        .collect()
}

/// The `custom_id`s of the first request to `path` by `method`.
fn sent_ids(requests: &[Request], method: &str, path: &str) -> Vec<String> {
    requests
        .iter()
        .find(|request| request.method == method && request.path == path)
        .map_or_else(Vec::new, |request| custom_ids(&request.body))
}

/// The result entry's items as (success, result or error JSON text).
fn items(entry: &ResultEntry) -> Vec<(bool, String)> {
    let output = entry.result.as_ref().expect("a result");
    output
        .responses
        .iter()
        .map(|response| {
            let text =
                response.result.as_ref().or(response.error.as_ref()).map_or(String::new(), |raw| raw.get().to_owned());
            (response.success, text)
        })
        .collect()
}

/// Runs `job` through an in-process daemon until its result, and checks that it completed; the result entry and the
/// calls the golden server answered (`METHOD /path`).
async fn run(world: &World, golden: &Golden, job: &Value) -> (ResultEntry, Vec<String>) {
    let _daemon = world.daemon();
    world.enqueue(job).await;
    let entry = world.wait_for_result(job["id"].as_str().expect("a job id"), WAIT).await;
    let calls: Vec<String> =
        golden.requests().iter().map(|request| format!("{} {}", request.method, request.path)).collect();
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}; calls {calls:?}", entry.error);
    (entry, calls)
}

/// The OpenAI Batch API's documented examples ([OG] https://developers.openai.com/api/docs/guides/batch, [OREF] the
/// API reference's batch and file objects): upload, create, retrieve (completed), output and error files, delete.
fn openai_answer(requests: &[Request]) -> Reply {
    let request = requests.last().expect("a request");
    let ids = sent_ids(requests, "POST", "/v1/files");
    let id = |index: usize| ids.get(index).cloned().unwrap_or_default();
    match (request.method.as_str(), request.path.as_str()) {
        // [OREF] files-create: the File object.
        ("POST", "/v1/files") => json_reply(&json!({
            "id": "file-abc123", "object": "file", "bytes": 120000, "created_at": 1677610602,
            "filename": "batchinput.jsonl", "purpose": "batch"
        })),
        // [OG] "Create the batch": the Batch object, validating.
        ("POST", "/v1/batches") => json_reply(&json!({
            "id": "batch_abc123", "object": "batch", "endpoint": "/v1/chat/completions", "errors": null,
            "input_file_id": "file-abc123", "completion_window": "24h", "status": "validating",
            "output_file_id": null, "error_file_id": null, "created_at": 1714508499, "in_progress_at": null,
            "expires_at": 1714536634, "completed_at": null, "failed_at": null, "expired_at": null,
            "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": null
        })),
        // [OREF] batches-retrieve: a completed batch with an output and an error file (its counts: this batch's).
        ("GET", "/v1/batches/batch_abc123") => json_reply(&json!({
            "id": "batch_abc123", "object": "batch", "endpoint": "/v1/chat/completions", "errors": null,
            "input_file_id": "file-abc123", "completion_window": "24h", "status": "completed",
            "output_file_id": "file-cvaTdG", "error_file_id": "file-HOWS94", "created_at": 1711471533,
            "in_progress_at": 1711471538, "expires_at": 1711557933, "finalizing_at": 1711493133,
            "completed_at": 1711493163, "failed_at": null, "expired_at": null, "cancelling_at": null,
            "cancelled_at": null, "request_counts": {"total": ids.len(), "completed": 2, "failed": 1},
            "metadata": {"customer_id": "user_123456789", "batch_description": "Nightly eval job"}
        })),
        // [OG] "Retrieving the results": the output file's example lines, in the docs' order (request-2 first).
        ("GET", "/v1/files/file-cvaTdG/content") => {
            let lines = [
                json!({"id": "batch_req_123", "custom_id": id(1), "response": {"status_code": 200, "request_id": "req_123",
                    "body": {"id": "chatcmpl-123", "object": "chat.completion", "created": 1711652795,
                    "model": "gpt-3.5-turbo-0125", "choices": [{"index": 0, "message": {"role": "assistant",
                    "content": "Hello."}, "logprobs": null, "finish_reason": "stop"}], "usage": {"prompt_tokens": 22,
                    "completion_tokens": 2, "total_tokens": 24}, "system_fingerprint": "fp_123"}}, "error": null}),
                json!({"id": "batch_req_456", "custom_id": id(0), "response": {"status_code": 200, "request_id": "req_789",
                    "body": {"id": "chatcmpl-abc", "object": "chat.completion", "created": 1711652789,
                    "model": "gpt-3.5-turbo-0125", "choices": [{"index": 0, "message": {"role": "assistant",
                    "content": "Hello! How can I assist you today?"}, "logprobs": null, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29},
                    "system_fingerprint": "fp_3ba"}}, "error": null}),
            ];
            (200, "application/octet-stream", lines.iter().map(|line| format!("{line}\n")).collect())
        }
        // [OG] "Batch expiration": the error file's line for a request the window ran out on.
        ("GET", "/v1/files/file-HOWS94/content") => {
            let line = json!({"id": "batch_req_123", "custom_id": id(2), "response": null, "error": {"code": "batch_expired",
                "message": "This request could not be executed before the completion window expired."}});
            (200, "application/octet-stream", format!("{line}\n"))
        }
        // [OREF] files-delete.
        ("DELETE", path) if path.starts_with("/v1/files/") => {
            let file = path.trim_start_matches("/v1/files/");
            json_reply(&json!({"id": file, "object": "file", "deleted": true}))
        }
        _ => not_found(request),
    }
}

#[tokio::test]
async fn openai_documented_replies_give_each_item_its_documented_outcome() {
    let mut world = World::new().await;
    let golden = Golden::start(|_| Arc::new(openai_answer)).await;
    batchd_tests::with_openai(&mut world.settings, &world.emulator);
    world.settings.openai.base_url = format!("{}/v1", golden.origin);
    let chat = |text: &str| json!({"messages": [{"role": "user", "content": text}], "max_tokens": 5});
    // A deadline under the resend room (5 min): the expired item is published as the API gave it, not sent again.
    let job = json!({"id": "golden-openai", "model": "openai/gpt-4o-mini", "retry_failed_items": false,
        "deadline_secs": 60, "requests": [chat("first"), chat("second"), chat("third")]});
    let (entry, calls) = run(&world, &golden, &job).await;
    assert_eq!(entry.request_ids, ["batch_abc123"], "the documented batch id is recorded");
    let items = items(&entry);
    assert_eq!(items.len(), 3, "{items:?}");
    assert!(
        items[0].0 && items[0].1.contains("Hello! How can I assist you today?"),
        "request-1's line: {:?}",
        items[0]
    );
    assert!(items[1].0 && items[1].1.contains("\"Hello.\""), "request-2's line: {:?}", items[1]);
    assert!(!items[2].0 && items[2].1.contains("batch_expired"), "the error file's line: {:?}", items[2]);
    for call in [
        "POST /v1/files",
        "POST /v1/batches",
        "GET /v1/batches/batch_abc123",
        "GET /v1/files/file-cvaTdG/content",
        "GET /v1/files/file-HOWS94/content",
    ] {
        assert!(calls.iter().any(|made| made == call), "{call} was made: {calls:?}");
    }
}

/// The Message Batches API's documented examples ([AREF] https://platform.claude.com/docs/en/api/messages/batches/
/// {create,retrieve,results,delete}, [ASDK] the result types): create (in progress), retrieve (ended), the results
/// stream (one line of each kind, out of request order), delete. `origin` is this server's, for the `results_url`
/// (the vendor's names its own host).
fn anthropic_answer(origin: &str, requests: &[Request]) -> Reply {
    let request = requests.last().expect("a request");
    let ids = sent_ids(requests, "POST", "/v1/messages/batches");
    let id = |index: usize| ids.get(index).cloned().unwrap_or_default();
    let batch = "msgbatch_01HkcTjaV5uDC8jWR4ZsDV8d";
    match (request.method.as_str(), request.path.as_str()) {
        ("POST", "/v1/messages/batches") => json_reply(&json!({
            "archived_at": null, "cancel_initiated_at": null, "created_at": "2024-08-20T18:37:24.100435Z",
            "ended_at": null, "expires_at": "2024-08-21T18:37:24.100435Z", "id": batch,
            "processing_status": "in_progress",
            "request_counts": {"canceled": 0, "errored": 0, "expired": 0, "processing": ids.len(), "succeeded": 0},
            "results_url": null, "type": "message_batch"
        })),
        ("GET", path) if path == format!("/v1/messages/batches/{batch}") => json_reply(&json!({
            "archived_at": null, "cancel_initiated_at": null, "created_at": "2024-08-20T18:37:24.100435Z",
            "ended_at": "2024-08-20T18:47:24.100435Z", "expires_at": "2024-08-21T18:37:24.100435Z", "id": batch,
            "processing_status": "ended",
            "request_counts": {"canceled": 1, "errored": 1, "expired": 1, "processing": 0, "succeeded": 1},
            "results_url": format!("{origin}/v1/messages/batches/{batch}/results"),
            "type": "message_batch"
        })),
        ("GET", path) if path == format!("/v1/messages/batches/{batch}/results") => {
            let lines = [
                json!({"custom_id": id(3), "result": {"type": "expired"}}),
                json!({"custom_id": id(2), "result": {"type": "canceled"}}),
                json!({"custom_id": id(1), "result": {"type": "errored", "error": {"type": "error",
                    "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
                    "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}}}),
                json!({"custom_id": id(0), "result": {"type": "succeeded", "message": {
                    "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF", "type": "message", "role": "assistant",
                    "model": "claude-sonnet-4-5-20250929", "content": [{"type": "text", "text": "Hi! My name is Claude."}],
                    "stop_reason": "end_turn", "stop_sequence": null,
                    "usage": {"input_tokens": 2095, "output_tokens": 503, "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 0, "service_tier": "batch"}}}}),
            ];
            (200, "application/binary", lines.iter().map(|line| format!("{line}\n")).collect())
        }
        ("DELETE", path) if path == format!("/v1/messages/batches/{batch}") => {
            json_reply(&json!({"id": batch, "type": "message_batch_deleted"}))
        }
        _ => not_found(request),
    }
}

#[tokio::test]
async fn anthropic_documented_replies_give_each_item_its_documented_outcome() {
    let mut world = World::new().await;
    let golden =
        Golden::start(|origin| Arc::new(move |requests: &[Request]| anthropic_answer(&origin, requests))).await;
    batchd_tests::with_anthropic(&mut world.settings, &world.emulator);
    world.settings.anthropic.base_url = golden.origin.clone();
    let message = |text: &str| json!({"max_tokens": 32, "messages": [{"role": "user", "content": text}]});
    // A deadline under the resend room (5 min): the expired item is published as the API gave it, not sent again.
    let job = json!({"id": "golden-anthropic", "model": "anthropic/claude-sonnet-4-5", "retry_failed_items": false,
        "deadline_secs": 60, "requests": [message("one"), message("two"), message("three"), message("four")]});
    let (entry, calls) = run(&world, &golden, &job).await;
    assert_eq!(entry.request_ids, ["msgbatch_01HkcTjaV5uDC8jWR4ZsDV8d"], "the documented batch id is recorded");
    let items = items(&entry);
    assert_eq!(items.len(), 4, "{items:?}");
    assert!(items[0].0 && items[0].1.contains("Hi! My name is Claude."), "the succeeded line: {:?}", items[0]);
    assert!(!items[1].0 && items[1].1.contains("invalid_request_error"), "the errored line: {:?}", items[1]);
    assert!(!items[2].0 && items[2].1.contains("cancel"), "the canceled line: {:?}", items[2]);
    assert!(!items[3].0 && items[3].1.contains("expire"), "the expired line: {:?}", items[3]);
    let creates = calls.iter().filter(|call| *call == "POST /v1/messages/batches").count();
    assert_eq!(creates, 1, "one create: {calls:?}");
}

/// Workers AI's documented examples (https://developers.cloudflare.com/workers-ai/features/batch-api/, reference
/// `workers-ai-batch-api.md`): the queued submit reply, then the finished poll with `responses` out of order (ids 2,
/// 0, 1) echoing each item's `external_reference`, and the envelope's `usage`.
fn workers_ai_answer(requests: &[Request]) -> Reply {
    let request = requests.last().expect("a request");
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    if request.method != "POST" || !request.path.contains("/ai/run/") {
        return not_found(request);
    }
    let request_id = "000-000-000";
    if body.get("request_id").is_none() {
        return json_reply(&json!({"result": {"status": "queued", "request_id": request_id,
            "model": "@cf/meta/llama-3.3-70b-instruct-fp8-fast"}, "success": true, "errors": [], "messages": []}));
    }
    let response = |id: usize, text: &str, reference: &str| {
        json!({"id": id, "result": {"response": text, "usage": {"prompt_tokens": 22, "completion_tokens": 81,
            "total_tokens": 103}}, "success": true, "external_reference": reference})
    };
    json_reply(&json!({"result": {"responses": [
        response(2, "Here is a short story about a cat.", "reference3"),
        response(0, "Here is a short story about a robot.", "reference1"),
        response(1, "Here is a short story about a dragon.", "reference2"),
    ], "usage": {"prompt_tokens": 66, "completion_tokens": 243, "total_tokens": 309}},
        "success": true, "errors": [], "messages": []}))
}

#[tokio::test]
async fn workers_ai_documented_replies_join_responses_by_id_not_order() {
    let mut world = World::new().await;
    let golden = Golden::start(|_| Arc::new(workers_ai_answer)).await;
    world.settings.cloudflare.base_url = format!("{}/client/v4", golden.origin);
    let story = |what: &str, reference: &str| json!({"prompt": format!("Tell me a story about a {what}"), "max_tokens": 100, "external_reference": reference});
    let job = json!({"id": "golden-workers-ai", "model": "@cf/meta/llama-3.3-70b-instruct-fp8-fast",
        "requests": [story("robot", "reference1"), story("dragon", "reference2"), story("cat", "reference3")]});
    let (entry, calls) = run(&world, &golden, &job).await;
    assert_eq!(entry.request_ids, ["000-000-000"], "the documented request id is recorded: {calls:?}");
    let items = items(&entry);
    for (index, what) in ["robot", "dragon", "cat"].iter().enumerate() {
        assert!(items[index].0 && items[index].1.contains(what), "item {index} is the {what} story: {items:?}");
    }
    let usage = &entry.result.as_ref().expect("a result").usage;
    assert_eq!(usage["total_tokens"], 309, "the envelope's usage: {usage}");
}
