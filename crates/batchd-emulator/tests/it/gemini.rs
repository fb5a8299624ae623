//! The Gemini Batch Mode emulator under `/gemini`, driven over real HTTP as a client would: inline creates and
//! creates from a file sent through the resumable upload protocol, polls to `BATCH_STATE_SUCCEEDED`, results joined
//! on their keys (inline and as a downloaded responses file), list paging, cancel, delete, the API key, faults
//! (429 on create, 5xx, a held create) and the control API.

use std::{collections::BTreeMap, time::Duration};

use batchd_emulator::{EmulatorConfig, EmulatorHandle, GeminiCallKind, GeminiCalls, GeminiConfig, GeminiFault};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::{FOREVER, Reply, start, wait_until};

const MODEL: &str = "gemini-2.5-flash";

/// A minimal Gemini client over reqwest.
struct Client {
    /// `http://ADDR/gemini`.
    base: String,
    /// The API key, sent as `x-goog-api-key`.
    key: String,
    /// The HTTP client.
    http: reqwest::Client,
}

async fn reply_of(response: reqwest::Response) -> Reply {
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.expect("a body");
    Reply { status, headers, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null) }
}

impl Client {
    fn of(emulator: &EmulatorHandle) -> Self {
        let gemini = emulator.gemini();
        Self { base: gemini.base_url(), key: gemini.api_key(), http: reqwest::Client::new() }
    }

    async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Reply {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).header("x-goog-api-key", &self.key);
        if let Some(body) = body {
            request = request.json(body);
        }
        reply_of(request.send().await.expect("a reply")).await
    }

    /// Creates a batch of `input` (`{"requests":..}` or `{"file_name":..}`) named `display_name`; answers the reply.
    async fn try_create(&self, display_name: &str, input: Value) -> Reply {
        let body = json!({ "batch": { "display_name": display_name, "input_config": input } });
        self.call(Method::POST, &format!("/v1beta/models/{MODEL}:batchGenerateContent"), Some(&body)).await
    }

    /// Creates a batch and answers its name (`batches/..`).
    async fn create(&self, display_name: &str, input: Value) -> String {
        let reply = self.try_create(display_name, input).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        reply.body["name"].as_str().expect("a batch name").to_owned()
    }

    async fn get(&self, name: &str) -> Reply {
        self.call(Method::GET, &format!("/v1beta/{name}"), None).await
    }

    /// Polls until the batch is done; answers the operation.
    async fn wait_done(&self, name: &str) -> Value {
        let mut operation = Value::Null;
        wait_until("the batch to end", async || {
            let reply = self.get(name).await;
            assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
            operation = reply.body;
            operation["done"] == true
        })
        .await;
        operation
    }

    /// Uploads `content` with the resumable protocol in `n_chunks` steps; answers the file's name.
    async fn upload(&self, content: &str, n_chunks: usize) -> String {
        let start = self
            .http
            .post(format!("{}/upload/v1beta/files", self.base))
            .header("x-goog-api-key", &self.key)
            .header("x-goog-upload-protocol", "resumable")
            .header("x-goog-upload-command", "start")
            .header("x-goog-upload-header-content-length", content.len().to_string())
            .header("x-goog-upload-header-content-type", "application/jsonl")
            .json(&json!({ "file": { "display_name": "input" } }))
            .send()
            .await
            .expect("a reply");
        assert_eq!(start.status(), StatusCode::OK);
        assert_eq!(start.headers()["x-goog-upload-status"], "active");
        let url = start.headers()["x-goog-upload-url"].to_str().expect("ascii").to_owned();
        let chunk_len = content.len().div_ceil(n_chunks);
        let mut offset = 0;
        let mut last = None;
        for chunk in content.as_bytes().chunks(chunk_len) {
            let is_last = offset + chunk.len() == content.len();
            let command = if is_last { "upload, finalize" } else { "upload" };
            let response = self
                .http
                .post(&url)
                .header("x-goog-upload-command", command)
                .header("x-goog-upload-offset", offset.to_string())
                .body(chunk.to_vec())
                .send()
                .await
                .expect("a reply");
            offset += chunk.len();
            last = Some(reply_of(response).await);
        }
        let last = last.expect("at least one chunk");
        assert_eq!(last.status, StatusCode::OK, "{:?}", last.body);
        assert_eq!(last.headers["x-goog-upload-status"], "final");
        assert_eq!(last.body["file"]["sizeBytes"], content.len().to_string());
        assert_eq!(last.body["file"]["state"], "ACTIVE");
        last.body["file"]["name"].as_str().expect("a file name").to_owned()
    }
}

/// A GenerateContentRequest asking `text`.
fn request(text: &str) -> Value {
    json!({ "contents": [{ "parts": [{ "text": text }], "role": "user" }] })
}

/// Inline requests keyed `k0`, `k1`, ... asking `prompt 0`, `prompt 1`, ...
fn inline(n: usize) -> Value {
    let requests: Vec<Value> = (0..n)
        .map(|index| json!({ "request": request(&format!("prompt {index}")), "metadata": { "key": format!("k{index}") } }))
        .collect();
    json!({ "requests": { "requests": requests } })
}

fn answer(response: &Value) -> &str {
    response["candidates"][0]["content"]["parts"][0]["text"].as_str().expect("an answer")
}

/// `GET /_emulator/gemini/{path}` as JSON.
async fn control_get(origin: &str, path: &str) -> Value {
    let response = reqwest::get(format!("{origin}/_emulator/gemini/{path}")).await.expect("a reply");
    response.json().await.expect("json")
}

async fn start_with(gemini: GeminiConfig) -> EmulatorHandle {
    start(EmulatorConfig { gemini, ..EmulatorConfig::default() }).await
}

#[tokio::test]
async fn an_inline_batch_runs_to_succeeded_and_its_responses_join_on_their_keys() {
    let emulator = start_with(GeminiConfig::default()).await;
    let client = Client::of(&emulator);
    let mut input = inline(4);
    // One request the model refuses: no contents.
    input["requests"]["requests"][2]["request"] = json!({});
    let created = client.try_create("inline-job", input).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.body);
    let name = created.body["name"].as_str().expect("a name").to_owned();
    assert!(name.starts_with("batches/"), "{name}");
    let metadata = &created.body["metadata"];
    assert_eq!(metadata["@type"], "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch");
    assert_eq!(metadata["state"], "BATCH_STATE_PENDING");
    assert_eq!(metadata["displayName"], "inline-job");
    assert_eq!(metadata["model"], format!("models/{MODEL}"));
    assert_eq!(metadata["batchStats"]["requestCount"], "4");
    assert_eq!(created.body["done"], false);

    let done = client.wait_done(&name).await;
    assert_eq!(done["metadata"]["state"], "BATCH_STATE_SUCCEEDED");
    assert_eq!(done["metadata"]["batchStats"]["successfulRequestCount"], "3");
    assert_eq!(done["metadata"]["batchStats"]["failedRequestCount"], "1");
    assert!(done["metadata"]["endTime"].is_string());
    let responses = done["response"]["inlinedResponses"]["inlinedResponses"].as_array().expect("inline responses");
    assert_eq!(responses.len(), 4);
    let keys: Vec<&str> = responses.iter().map(|entry| entry["metadata"]["key"].as_str().expect("a key")).collect();
    assert_ne!(keys, ["k0", "k1", "k2", "k3"], "responses are not in input order: join on the key");
    let by_key: BTreeMap<&str, &Value> =
        responses.iter().map(|entry| (entry["metadata"]["key"].as_str().unwrap_or(""), entry)).collect();
    assert_eq!(answer(&by_key["k0"]["response"]), "echo: prompt 0");
    assert_eq!(answer(&by_key["k3"]["response"]), "echo: prompt 3");
    assert_eq!(by_key["k2"]["error"]["status"], "INVALID_ARGUMENT");
    assert!(by_key["k2"].get("response").is_none());
    // The SDKs read `metadata.output`: the same responses.
    assert_eq!(done["metadata"]["output"]["inlinedResponses"], done["response"]["inlinedResponses"]);

    // The SDKs' JOB_STATE_* spelling, when asked.
    emulator.gemini().update_config(|config| config.job_state_names = true);
    assert_eq!(client.get(&name).await.body["metadata"]["state"], "JOB_STATE_SUCCEEDED");
}

#[tokio::test]
async fn a_batch_from_an_uploaded_file_writes_a_responses_file_keyed_by_request() {
    let emulator = start_with(GeminiConfig::default()).await;
    let client = Client::of(&emulator);
    let lines: Vec<String> = (0..5)
        .map(|index| {
            json!({ "key": format!("line-{index}"), "request": request(&format!("text {index}")) }).to_string()
        })
        .collect();
    let file_name = client.upload(&(lines.join("\n") + "\n"), 3).await;
    let file = client.call(Method::GET, &format!("/v1beta/{file_name}"), None).await;
    assert_eq!(file.body["mimeType"], "application/jsonl");

    let name = client.create("file-job", json!({ "file_name": file_name })).await;
    let done = client.wait_done(&name).await;
    assert_eq!(done["metadata"]["state"], "BATCH_STATE_SUCCEEDED");
    assert_eq!(done["metadata"]["inputConfig"]["fileName"], file_name.as_str());
    let responses_file = done["response"]["responsesFile"].as_str().expect("a responses file").to_owned();
    assert_eq!(done["metadata"]["output"]["responsesFile"], responses_file.as_str());

    let download =
        client.call(Method::GET, &format!("/download/v1beta/{responses_file}:download?alt=media"), None).await;
    assert_eq!(download.status, StatusCode::OK);
    let text = reqwest::Client::new()
        .get(format!("{}/download/v1beta/{responses_file}:download?alt=media&key={}", client.base, client.key))
        .send()
        .await
        .expect("a reply")
        .text()
        .await
        .expect("text");
    let by_key: BTreeMap<String, Value> = text
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line"))
        .map(|line| (line["key"].as_str().expect("a key").to_owned(), line))
        .collect();
    assert_eq!(by_key.len(), 5);
    for index in 0..5 {
        assert_eq!(answer(&by_key[&format!("line-{index}")]["response"]), format!("echo: text {index}"));
    }
    // Files can be deleted; the download then answers 404.
    assert_eq!(client.call(Method::DELETE, &format!("/v1beta/{responses_file}"), None).await.status, StatusCode::OK);
    let gone = client.call(Method::GET, &format!("/download/v1beta/{responses_file}:download?alt=media"), None).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.body["error"]["status"], "NOT_FOUND");
}

#[tokio::test]
async fn bad_creates_keys_and_uploads_get_google_errors_and_create_nothing() {
    let emulator = start_with(GeminiConfig { max_inline_bytes: 2000, ..GeminiConfig::default() }).await;
    let client = Client::of(&emulator);
    let no_name = json!({ "batch": { "input_config": inline(1) } });
    let path = format!("/v1beta/models/{MODEL}:batchGenerateContent");
    let reply = client.call(Method::POST, &path, Some(&no_name)).await;
    assert_eq!(
        (reply.status, reply.body["error"]["status"].clone()),
        (StatusCode::BAD_REQUEST, json!("INVALID_ARGUMENT"))
    );
    assert_eq!(reply.body["error"]["code"], 400);
    let empty = client.try_create("x", json!({ "requests": { "requests": [] } })).await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);
    let both = client.try_create("x", json!({ "requests": inline(1)["requests"], "file_name": "files/x" })).await;
    assert_eq!(both.status, StatusCode::BAD_REQUEST);
    let no_file = client.try_create("x", json!({ "file_name": "files/nope" })).await;
    assert_eq!(no_file.status, StatusCode::NOT_FOUND);
    let too_big = client.try_create("x", inline(40)).await;
    assert_eq!(too_big.status, StatusCode::BAD_REQUEST);
    assert!(too_big.body["error"]["message"].as_str().expect("a message").contains("payload size exceeds"));
    assert_eq!(emulator.gemini().batch_count(), 0);

    // The key: `?key=` works like the header; none is 403, a wrong one 400.
    let url = |key: &str| format!("{}/v1beta/batches{key}", client.base);
    let by_query = reqwest::get(url(&format!("?key={}", client.key))).await.expect("a reply");
    assert_eq!(by_query.status(), StatusCode::OK);
    let none = reply_of(reqwest::get(url("")).await.expect("a reply")).await;
    assert_eq!(
        (none.status, none.body["error"]["status"].clone()),
        (StatusCode::FORBIDDEN, json!("PERMISSION_DENIED"))
    );
    let wrong = reply_of(reqwest::get(url("?key=wrong")).await.expect("a reply")).await;
    assert_eq!(
        (wrong.status, wrong.body["error"]["status"].clone()),
        (StatusCode::BAD_REQUEST, json!("INVALID_ARGUMENT"))
    );
    // Unknown paths and batches: Google's 404.
    assert_eq!(client.call(Method::GET, "/v1beta/nothing", None).await.status, StatusCode::NOT_FOUND);
    assert_eq!(client.get("batches/unknown").await.body["error"]["status"], "NOT_FOUND");
    // An upload must use the resumable protocol, and its bytes must arrive at the right offset.
    let multipart =
        client.http.post(format!("{}/upload/v1beta/files", client.base)).header("x-goog-api-key", &client.key);
    assert_eq!(multipart.send().await.expect("a reply").status(), StatusCode::BAD_REQUEST);
    let start = client
        .http
        .post(format!("{}/upload/v1beta/files", client.base))
        .header("x-goog-api-key", &client.key)
        .header("x-goog-upload-protocol", "resumable")
        .header("x-goog-upload-command", "start")
        .send()
        .await
        .expect("a reply");
    let upload_url = start.headers()["x-goog-upload-url"].to_str().expect("ascii").to_owned();
    let misplaced = client
        .http
        .post(&upload_url)
        .header("x-goog-upload-command", "upload, finalize")
        .header("x-goog-upload-offset", "7")
        .body("{}")
        .send()
        .await
        .expect("a reply");
    assert_eq!(misplaced.status(), StatusCode::BAD_REQUEST);
    assert!(emulator.gemini().file_names().is_empty(), "nothing was stored");
}

#[tokio::test]
async fn list_pages_newest_first_and_finds_a_batch_by_display_name() {
    let emulator = start_with(GeminiConfig { pending_for: FOREVER, ..GeminiConfig::default() }).await;
    let client = Client::of(&emulator);
    let mut names = Vec::new();
    for index in 0..5 {
        names.push(client.create(&format!("job-{index}"), inline(1)).await);
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut n_pages = 0;
    loop {
        let query =
            token.as_ref().map_or_else(|| "?pageSize=2".to_owned(), |token| format!("?pageSize=2&pageToken={token}"));
        let page = client.call(Method::GET, &format!("/v1beta/batches{query}"), None).await;
        assert_eq!(page.status, StatusCode::OK, "{:?}", page.body);
        n_pages += 1;
        let operations = page.body["operations"].as_array().expect("operations");
        assert!(operations.len() <= 2);
        seen.extend(
            operations
                .iter()
                .map(|operation| operation["metadata"]["displayName"].as_str().expect("a name").to_owned()),
        );
        match page.body["nextPageToken"].as_str() {
            Some(next) => token = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(n_pages, 3);
    assert_eq!(seen, ["job-4", "job-3", "job-2", "job-1", "job-0"]);
    let bad = client.call(Method::GET, "/v1beta/batches?pageToken=nope", None).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    // After deleting everything, a list is `{}`.
    for name in &names {
        assert_eq!(client.call(Method::DELETE, &format!("/v1beta/{name}"), None).await.status, StatusCode::OK);
    }
    assert_eq!(client.call(Method::GET, "/v1beta/batches", None).await.body, json!({}));
}

#[tokio::test]
async fn cancel_ends_a_running_batch_and_delete_forgets_any() {
    let emulator = start_with(GeminiConfig { pending_for: FOREVER, ..GeminiConfig::default() }).await;
    let client = Client::of(&emulator);
    let name = client.create("to-cancel", inline(2)).await;
    let cancelled = client.call(Method::POST, &format!("/v1beta/{name}:cancel"), None).await;
    assert_eq!((cancelled.status, cancelled.body.clone()), (StatusCode::OK, json!({})));
    let operation = client.get(&name).await.body;
    assert_eq!(operation["metadata"]["state"], "BATCH_STATE_CANCELLED");
    assert_eq!(operation["done"], true);
    assert!(operation.get("response").is_none(), "a cancelled batch has no responses");
    let again = client.call(Method::POST, &format!("/v1beta/{name}:cancel"), None).await;
    assert_eq!(
        (again.status, again.body["error"]["status"].clone()),
        (StatusCode::BAD_REQUEST, json!("FAILED_PRECONDITION"))
    );

    // Delete works in any state, and the batch is gone.
    let pending = client.create("to-delete", inline(1)).await;
    assert_eq!(client.call(Method::DELETE, &format!("/v1beta/{pending}"), None).await.status, StatusCode::OK);
    assert_eq!(client.get(&pending).await.status, StatusCode::NOT_FOUND);
    assert_eq!(client.call(Method::DELETE, &format!("/v1beta/{pending}"), None).await.status, StatusCode::NOT_FOUND);
    assert_eq!(emulator.gemini().batch_names(), [name]);
    assert_eq!(emulator.gemini().batch_count(), 2);
}

#[tokio::test]
async fn faults_429_on_create_5xx_failed_batches_and_a_held_create() {
    let emulator = start_with(GeminiConfig::default()).await;
    let client = Client::of(&emulator);
    let origin = client.base.trim_end_matches("/gemini").to_owned();
    let http = reqwest::Client::new();
    // Over the control API: two 429s on create, then a 503 on a get.
    let faults = json!([
        { "kind": "status", "status": 429, "calls": "create", "times": 2 },
        { "kind": "status", "status": 503, "calls": "get" },
    ]);
    let pending = http.post(format!("{origin}/_emulator/gemini/faults")).json(&faults).send().await.expect("a reply");
    assert_eq!(pending.json::<Value>().await.expect("json").as_array().map(Vec::len), Some(2));
    for _ in 0..2 {
        let refused = client.try_create("limited", inline(1)).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.body["error"]["status"], "RESOURCE_EXHAUSTED");
    }
    assert_eq!(emulator.gemini().batch_count(), 0, "a refused create makes nothing");
    let name = client.create("limited", inline(1)).await;
    let unavailable = client.get(&name).await;
    assert_eq!(
        (unavailable.status, unavailable.body["error"]["status"].clone()),
        (StatusCode::SERVICE_UNAVAILABLE, json!("UNAVAILABLE"))
    );
    let creates = emulator.gemini().calls_of(GeminiCallKind::Create);
    let statuses: Vec<(u16, Option<String>)> = creates.iter().map(|call| (call.status, call.fault.clone())).collect();
    assert_eq!(statuses, [(429, Some("status".to_owned())), (429, Some("status".to_owned())), (200, None)]);
    assert_eq!(creates[2].display_name.as_deref(), Some("limited"));
    assert_eq!(creates[2].first_key.as_deref(), Some("k0"));

    // A failed batch.
    emulator.gemini().inject(GeminiFault::fail_batch());
    let failing = client.create("failing", inline(1)).await;
    let done = client.wait_done(&failing).await;
    assert_eq!(done["metadata"]["state"], "BATCH_STATE_FAILED");
    assert!(done["error"]["message"].is_string());

    // A 500 after the create took effect: the batch exists, found again by its display name.
    emulator.gemini().inject(GeminiFault::status_after(500).on(GeminiCalls::Create));
    let lost = client.try_create("uncertain", inline(1)).await;
    assert_eq!(lost.status, StatusCode::INTERNAL_SERVER_ERROR);
    let listed = client.call(Method::GET, "/v1beta/batches", None).await.body;
    let found = listed["operations"]
        .as_array()
        .expect("operations")
        .iter()
        .filter(|op| op["metadata"]["displayName"] == "uncertain")
        .count();
    assert_eq!(found, 1);

    // A held create: the batch exists before its reply leaves.
    emulator.gemini().inject(GeminiFault::hold().on(GeminiCalls::Create));
    let creator = tokio::spawn({
        let client = Client::of(&emulator);
        async move { client.create("held", inline(1)).await }
    });
    assert!(emulator.gemini().wait_until_held(1, Duration::from_secs(10)).await);
    let held_call = emulator.gemini().calls_of(GeminiCallKind::Create).pop().expect("the held create");
    assert_eq!(held_call.fault.as_deref(), Some("hold"));
    let held_name = held_call.batch_name.expect("its batch");
    assert_eq!(client.get(&held_name).await.status, StatusCode::OK);
    assert_eq!(control_get(&origin, "held").await["held"], 1);
    let released = http.post(format!("{origin}/_emulator/gemini/held/release")).send().await.expect("a reply");
    assert_eq!(released.json::<Value>().await.expect("json")["released"], 1);
    assert_eq!(creator.await.expect("join"), held_name);

    // Reset clears the log and the faults.
    emulator.gemini().inject(GeminiFault::status(500));
    assert_eq!(
        http.post(format!("{origin}/_emulator/gemini/reset")).send().await.expect("a reply").status(),
        StatusCode::NO_CONTENT
    );
    assert!(emulator.gemini().calls().is_empty());
    assert!(emulator.gemini().pending_faults().is_empty());
}

#[tokio::test]
async fn the_control_api_sets_the_batch_duration() {
    let emulator = start_with(GeminiConfig::default()).await;
    let client = Client::of(&emulator);
    let origin = client.base.trim_end_matches("/gemini").to_owned();
    let http = reqwest::Client::new();
    let set = |body: Value| http.post(format!("{origin}/_emulator/gemini/config")).json(&body).send();
    let config = set(json!({ "pending_ms": 3_600_000, "running_ms": 0 }))
        .await
        .expect("a reply")
        .json::<Value>()
        .await
        .expect("json");
    assert_eq!((config["pending_ms"].clone(), config["running_ms"].clone()), (json!(3_600_000), json!(0)));
    assert_eq!(set(json!({ "nonsense": 1 })).await.expect("a reply").status(), StatusCode::UNPROCESSABLE_ENTITY);
    let name = client.create("slow", inline(1)).await;
    assert_eq!(client.get(&name).await.body["metadata"]["state"], "BATCH_STATE_PENDING");
    set(json!({ "pending_ms": 0 })).await.expect("a reply");
    assert_eq!(client.wait_done(&name).await["metadata"]["state"], "BATCH_STATE_SUCCEEDED");
    assert_eq!(control_get(&origin, "batches").await, json!([{ "name": name, "state": "BATCH_STATE_SUCCEEDED" }]));
}
