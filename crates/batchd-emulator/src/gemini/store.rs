//! The Gemini emulator's batches and files: each request's response (made at create, deterministic), the batch
//! lifecycle (`PENDING` → `RUNNING` → `SUCCEEDED`, or `CANCELLED`, `EXPIRED`, `FAILED`), the operation JSON a
//! create, get or list answers, the responses file a file-sourced batch writes, and list paging.
//!
//! Batches move on lazily: every look steps a batch to `now` under the settings in force, and an end once seen
//! never moves.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use rand::{SeedableRng, rngs::StdRng, seq::SliceRandom};
use serde_json::{Map, Value, json};

use super::GeminiConfig;

/// `@type` of a batch's metadata.
const BATCH_TYPE: &str = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch";
/// `@type` of a finished batch's `response`.
const OUTPUT_TYPE: &str = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput";

/// How long an uploaded or written file is kept (48 h, the Files API's documented retention; only reported).
const FILE_EXPIRY: Duration = Duration::from_secs(48 * 3600);

/// A batch's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchState {
    /// Created, not started.
    Pending,
    /// Running.
    Running,
    /// Every request has a response or an error.
    Succeeded,
    /// The batch as a whole failed.
    Failed,
    /// Cancelled by the client.
    Cancelled,
    /// Not done within its expiry.
    Expired,
}

impl BatchState {
    /// The REST name (`BATCH_STATE_PENDING`), or the SDKs' (`JOB_STATE_PENDING`) with `job_names`.
    pub fn name(self, job_names: bool) -> String {
        let suffix = match self {
            BatchState::Pending => "PENDING",
            BatchState::Running => "RUNNING",
            BatchState::Succeeded => "SUCCEEDED",
            BatchState::Failed => "FAILED",
            BatchState::Cancelled => "CANCELLED",
            BatchState::Expired => "EXPIRED",
        };
        let prefix = if job_names { "JOB_STATE_" } else { "BATCH_STATE_" };
        format!("{prefix}{suffix}")
    }

    fn is_terminal(self) -> bool {
        !matches!(self, BatchState::Pending | BatchState::Running)
    }
}

/// One request of a batch and what it came to.
#[derive(Debug, Clone)]
pub(crate) struct Item {
    /// The request's key (`metadata.key` inline, `key` in a file line), if it had one.
    pub key: Option<String>,
    /// An inline request's `metadata`, echoed with its response.
    pub metadata: Option<Value>,
    /// The GenerateContentResponse, or the google.rpc error of a request the model refused.
    pub outcome: Result<Value, Value>,
}

/// Where a batch's requests came from, which decides where its responses go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// `inputConfig.requests`: responses inline.
    Inline,
    /// `inputConfig.fileName`: responses in a file.
    File(String),
}

/// One batch.
#[derive(Debug)]
pub(crate) struct Batch {
    /// `batches/…`.
    pub name: String,
    /// `models/…`.
    pub model: String,
    /// The caller's `displayName`.
    pub display_name: String,
    /// When it was created.
    pub created: SystemTime,
    /// Its requests, in input order.
    pub items: Vec<Item>,
    /// Where its requests came from.
    pub source: Source,
    /// Whether a `fail_batch` fault makes it end `FAILED`.
    pub fails: bool,
    /// The end once seen: state and time.
    pub ended: Option<(BatchState, SystemTime)>,
    /// The responses file written when a file-sourced batch succeeded.
    pub responses_file: Option<String>,
}

/// One file: an upload or a responses file.
#[derive(Debug, Clone)]
pub(crate) struct StoredFile {
    /// `files/…`.
    pub name: String,
    /// The caller's `displayName`, or the batch's for a responses file.
    pub display_name: String,
    /// The declared content type.
    pub mime_type: String,
    /// The content.
    pub content: Vec<u8>,
    /// When it was stored.
    pub created: SystemTime,
}

/// A resumable upload between `start` and `finalize`.
#[derive(Debug, Clone)]
pub(crate) struct PendingUpload {
    /// The file's `displayName`.
    pub display_name: String,
    /// The declared content type.
    pub mime_type: String,
    /// The declared length, when given.
    pub declared_len: Option<u64>,
    /// The bytes received so far.
    pub content: Vec<u8>,
}

/// Every batch and file, with the counters of the store.
#[derive(Debug, Default)]
pub(crate) struct Store {
    /// Batches not deleted, by name.
    batches: HashMap<String, Batch>,
    /// Names of the batches not deleted, oldest first.
    order: Vec<String>,
    /// Batches created since start (deleted ones included).
    n_created: usize,
    /// Files not deleted, by name.
    pub files: HashMap<String, StoredFile>,
    /// Resumable uploads not finalized, by upload id.
    pub uploads: HashMap<String, PendingUpload>,
}

/// A page of a list, newest first.
#[derive(Debug)]
pub(crate) struct Page {
    /// The operations of the page.
    pub operations: Vec<Value>,
    /// The token of the next page, if any.
    pub next_page_token: Option<String>,
}

impl Store {
    /// Stores a new batch and answers its name.
    pub fn create(&mut self, mut batch: Batch) -> String {
        self.n_created += 1;
        let name = format!("batches/{}", uuid::Uuid::new_v4().simple());
        batch.name = name.clone();
        self.order.push(name.clone());
        self.batches.insert(name.clone(), batch);
        name
    }

    pub fn n_created(&self) -> usize {
        self.n_created
    }

    /// Names of the batches not deleted, oldest first.
    pub fn names(&self) -> Vec<String> {
        self.order.clone()
    }

    /// Steps the batch to `now` and answers its operation JSON; `None`: no such batch.
    pub fn operation(&mut self, name: &str, now: SystemTime, config: &GeminiConfig) -> Option<Value> {
        let batch = self.batches.get_mut(name)?;
        let written = batch.step(now, config);
        if let Some(file) = written {
            batch.responses_file = Some(file.name.clone());
            self.files.insert(file.name.clone(), file);
        }
        let batch = self.batches.get(name)?;
        Some(batch.to_json(now, config))
    }

    /// The state of a batch now (stepping it).
    pub fn state(&mut self, name: &str, now: SystemTime, config: &GeminiConfig) -> Option<BatchState> {
        self.operation(name, now, config)?;
        self.batches.get(name).map(|batch| batch.state_at(now, config))
    }

    /// Cancels a batch not ended yet; `Err(state)`: it had ended (or `None`: no such batch).
    pub fn cancel(&mut self, name: &str, now: SystemTime, config: &GeminiConfig) -> Option<Result<(), BatchState>> {
        let state = self.state(name, now, config)?;
        if state.is_terminal() {
            return Some(Err(state));
        }
        let batch = self.batches.get_mut(name)?;
        batch.ended = Some((BatchState::Cancelled, now));
        Some(Ok(()))
    }

    /// Deletes a batch in any state (the API: "no longer interested in the result; does not cancel it").
    pub fn delete(&mut self, name: &str) -> bool {
        let deleted = self.batches.remove(name).is_some();
        self.order.retain(|kept| kept != name);
        deleted
    }

    /// A page of at most `page_size` batches, newest first, starting after the token's batch.
    pub fn page(
        &mut self,
        page_token: Option<&str>,
        page_size: usize,
        now: SystemTime,
        config: &GeminiConfig,
    ) -> Result<Page, ()> {
        let newest_first: Vec<String> = self.order.iter().rev().cloned().collect();
        let start = match page_token {
            None | Some("") => 0,
            Some(token) => {
                newest_first.iter().position(|name| name.strip_prefix("batches/") == Some(token)).ok_or(())?
            }
        };
        let names: Vec<&String> = newest_first.iter().skip(start).take(page_size).collect();
        let next_page_token =
            newest_first.get(start + page_size).map(|name| name.trim_start_matches("batches/").to_owned());
        let operations = names.into_iter().filter_map(|name| self.operation(name, now, config)).collect();
        Ok(Page { operations, next_page_token })
    }
}

impl Batch {
    /// The state at `now` under `config` (its end, once seen, stays).
    fn state_at(&self, now: SystemTime, config: &GeminiConfig) -> BatchState {
        if let Some((state, _)) = self.ended {
            return state;
        }
        let elapsed = now.duration_since(self.created).unwrap_or_default();
        let done_after = config.pending_for + config.running_for;
        if elapsed >= config.expires_after && done_after > config.expires_after {
            BatchState::Expired
        } else if elapsed < config.pending_for {
            BatchState::Pending
        } else if elapsed < done_after {
            BatchState::Running
        } else if self.fails {
            BatchState::Failed
        } else {
            BatchState::Succeeded
        }
    }

    /// Records an end reached by `now`; answers the responses file a file-sourced batch writes on success.
    fn step(&mut self, now: SystemTime, config: &GeminiConfig) -> Option<StoredFile> {
        if self.ended.is_some() {
            return None;
        }
        let state = self.state_at(now, config);
        if !state.is_terminal() {
            return None;
        }
        let ended_at = match state {
            BatchState::Expired => self.created + config.expires_after,
            _ => self.created + config.pending_for + config.running_for,
        };
        self.ended = Some((state, ended_at));
        if state != BatchState::Succeeded || self.source == Source::Inline {
            return None;
        }
        let mut content = Vec::new();
        for index in self.output_order(config) {
            let item = &self.items[index];
            let mut line = Map::new();
            if let Some(key) = &item.key {
                line.insert("key".to_owned(), json!(key));
            }
            match &item.outcome {
                Ok(response) => line.insert("response".to_owned(), response.clone()),
                Err(error) => line.insert("error".to_owned(), error.clone()),
            };
            content.extend_from_slice(Value::Object(line).to_string().as_bytes());
            content.push(b'\n');
        }
        Some(StoredFile {
            name: format!("files/batch-{}", self.name.trim_start_matches("batches/")),
            display_name: format!("{} responses", self.display_name),
            mime_type: "application/jsonl".to_owned(),
            content,
            created: ended_at,
        })
    }

    /// The order responses are written in: shuffled by default (deterministic per batch), or input order.
    fn output_order(&self, config: &GeminiConfig) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.items.len()).collect();
        if config.shuffle_results && order.len() >= 2 {
            let seed = self.name.bytes().fold(0u64, |seed, byte| seed.wrapping_mul(31).wrapping_add(u64::from(byte)));
            let mut rng = StdRng::seed_from_u64(seed);
            while order.iter().enumerate().all(|(position, &index)| position == index) {
                order.shuffle(&mut rng);
            }
        }
        order
    }

    /// The operation: `name`, `metadata` (the GenerateContentBatch), `done`, and once ended `response` or `error`.
    fn to_json(&self, now: SystemTime, config: &GeminiConfig) -> Value {
        let state = self.state_at(now, config);
        let n_requests = self.items.len();
        let (n_ok, n_failed) = match state {
            BatchState::Succeeded => {
                let n_ok = self.items.iter().filter(|item| item.outcome.is_ok()).count();
                (n_ok, n_requests - n_ok)
            }
            _ => (0, 0),
        };
        let n_pending = if state.is_terminal() { 0 } else { n_requests };
        let update_time = self.ended.map_or(now, |(_, at)| at);
        let mut metadata = json!({
            "@type": BATCH_TYPE,
            "model": self.model,
            "displayName": self.display_name,
            "createTime": rfc3339(self.created),
            "updateTime": rfc3339(update_time),
            "batchStats": {
                "requestCount": n_requests.to_string(),
                "successfulRequestCount": n_ok.to_string(),
                "failedRequestCount": n_failed.to_string(),
                "pendingRequestCount": n_pending.to_string(),
            },
            "state": state.name(config.job_state_names),
            "name": self.name,
        });
        if let Source::File(file_name) = &self.source {
            metadata["inputConfig"] = json!({ "fileName": file_name });
        }
        let mut operation = json!({ "name": self.name, "metadata": metadata, "done": state.is_terminal() });
        if let Some((_, ended_at)) = self.ended {
            operation["metadata"]["endTime"] = json!(rfc3339(ended_at));
        }
        match state {
            BatchState::Succeeded => {
                let output = self.output(config);
                // The SDKs read `metadata.output`, the REST guide `response`: both are written.
                operation["metadata"]["output"] = output.clone();
                let mut response = json!({ "@type": OUTPUT_TYPE });
                if let (Some(response), Value::Object(fields)) = (response.as_object_mut(), output) {
                    response.extend(fields);
                }
                operation["response"] = response;
            }
            BatchState::Failed => {
                operation["error"] = json!({ "code": 13, "message": "Batch processing failed: internal error." });
            }
            _ => {}
        }
        operation
    }

    /// `{"inlinedResponses":{"inlinedResponses":[..]}}` or `{"responsesFile":"files/.."}`.
    fn output(&self, config: &GeminiConfig) -> Value {
        match (&self.source, &self.responses_file) {
            (Source::File(_), Some(file)) => json!({ "responsesFile": file }),
            _ => {
                let responses: Vec<Value> = self
                    .output_order(config)
                    .into_iter()
                    .map(|index| {
                        let item = &self.items[index];
                        let mut entry = Map::new();
                        match &item.outcome {
                            Ok(response) => entry.insert("response".to_owned(), response.clone()),
                            Err(error) => entry.insert("error".to_owned(), error.clone()),
                        };
                        if let Some(metadata) = &item.metadata {
                            entry.insert("metadata".to_owned(), metadata.clone());
                        }
                        Value::Object(entry)
                    })
                    .collect();
                json!({ "inlinedResponses": { "inlinedResponses": responses } })
            }
        }
    }
}

/// The File resource.
pub(crate) fn file_json(file: &StoredFile, host: &str) -> Value {
    let id = file.name.trim_start_matches("files/");
    json!({
        "name": file.name,
        "displayName": file.display_name,
        "mimeType": file.mime_type,
        "sizeBytes": file.content.len().to_string(),
        "createTime": rfc3339(file.created),
        "updateTime": rfc3339(file.created),
        "expirationTime": rfc3339(file.created + FILE_EXPIRY),
        "uri": format!("http://{host}{}/v1beta/files/{id}", super::PATH_PREFIX),
        "state": "ACTIVE",
        "source": "UPLOADED",
    })
}

/// What one request comes to: an echo of its last text, as a GenerateContentResponse, or the error of a request
/// without `contents`.
pub(crate) fn run_request(request: &Value, model: &str) -> Result<Value, Value> {
    let contents = request.get("contents").and_then(Value::as_array).filter(|contents| !contents.is_empty());
    let Some(contents) = contents else {
        return Err(json!({
            "code": 400,
            "message": "* GenerateContentRequest.contents: contents is not specified\n",
            "status": "INVALID_ARGUMENT",
        }));
    };
    let text_of = |content: &Value| -> String {
        let parts = content.get("parts").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        parts.iter().filter_map(|part| part.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join(" ")
    };
    let prompt_words: usize = contents.iter().map(|content| text_of(content).split_ascii_whitespace().count()).sum();
    let last = contents.last().map(text_of).unwrap_or_default();
    let answer = format!("echo: {}", last.chars().take(40).collect::<String>());
    let answer_words = answer.split_ascii_whitespace().count();
    Ok(json!({
        "candidates": [{
            "content": { "parts": [{ "text": answer }], "role": "model" },
            "finishReason": "STOP",
            "index": 0,
        }],
        "usageMetadata": {
            "promptTokenCount": prompt_words,
            "candidatesTokenCount": answer_words,
            "totalTokenCount": prompt_words + answer_words,
        },
        "modelVersion": model.trim_start_matches("models/"),
    }))
}

/// RFC 3339 with microseconds and `Z`.
fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> GeminiConfig {
        GeminiConfig {
            pending_for: Duration::from_secs(1),
            running_for: Duration::from_secs(2),
            ..GeminiConfig::default()
        }
    }

    fn batch(created: SystemTime, n_items: usize) -> Batch {
        let items = (0..n_items)
            .map(|index| Item {
                key: Some(format!("k{index}")),
                metadata: Some(json!({ "key": format!("k{index}") })),
                outcome: Ok(json!({ "index": index })),
            })
            .collect();
        Batch {
            name: "batches/x".to_owned(),
            model: "models/m".to_owned(),
            display_name: "d".to_owned(),
            created,
            items,
            source: Source::Inline,
            fails: false,
            ended: None,
            responses_file: None,
        }
    }

    #[test]
    fn states_follow_the_timing_and_an_end_stays() {
        let start = SystemTime::now();
        let config = config();
        let mut batch = batch(start, 3);
        assert_eq!(batch.state_at(start, &config), BatchState::Pending);
        assert_eq!(batch.state_at(start + Duration::from_millis(1500), &config), BatchState::Running);
        assert_eq!(batch.step(start + Duration::from_secs(3), &config).map(|file| file.name), None);
        assert_eq!(batch.state_at(start + Duration::from_secs(3), &config), BatchState::Succeeded);
        let slower = GeminiConfig { running_for: Duration::from_secs(60), ..config };
        assert_eq!(batch.state_at(start + Duration::from_secs(4), &slower), BatchState::Succeeded);
        assert_eq!(BatchState::Succeeded.name(false), "BATCH_STATE_SUCCEEDED");
        assert_eq!(BatchState::Succeeded.name(true), "JOB_STATE_SUCCEEDED");
    }

    #[test]
    fn a_batch_that_would_outlive_its_expiry_expires() {
        let start = SystemTime::now();
        let config = GeminiConfig { expires_after: Duration::from_secs(2), ..config() };
        let batch = batch(start, 1);
        assert_eq!(batch.state_at(start + Duration::from_secs(2), &config), BatchState::Expired);
    }

    #[test]
    fn responses_are_shuffled_never_in_input_order_unless_asked() {
        let batch = batch(SystemTime::now(), 5);
        let order = batch.output_order(&config());
        assert_ne!(order, [0, 1, 2, 3, 4]);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2, 3, 4]);
        let kept = GeminiConfig { shuffle_results: false, ..config() };
        assert_eq!(batch.output_order(&kept), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_request_without_contents_fails_alone() {
        let error = run_request(&json!({}), "models/m").expect_err("no contents");
        assert_eq!(error["status"], "INVALID_ARGUMENT");
        let response =
            run_request(&json!({ "contents": [{ "parts": [{ "text": "hello world" }] }] }), "models/m").expect("ok");
        assert_eq!(response["candidates"][0]["content"]["parts"][0]["text"], "echo: hello world");
        assert_eq!(response["usageMetadata"]["promptTokenCount"], 2);
    }
}
