//! Gemini Batch Mode's JSON, private to this crate: the create bodies (inline requests, or a JSONL file's lines
//! and the create that names the file), the display name that marks a chunk's batch, the operation a create, get
//! or list answers (read leniently, field by field), the batch states in both spellings, and the join of
//! responses on each request's key.

use batchd_core::{ItemResponse, JobOutput};
use batchd_provider::BodyShape;
use batchd_provider::items::{add_usage, failed_item};
use serde::Deserialize;
use serde_json::value::RawValue;

/// Longest part of a job id a display name carries, in bytes (the API's limit on display names is not documented).
const MAX_JOB_IN_NAME: usize = 100;

/// Longest error message kept from a response, in characters.
const MAX_MESSAGE_CHARS: usize = 1000;

/// An upper bound of a create's size from its items' sizes, for either form: the inline envelope (with the longest
/// display name) and per item `{"request":…,"metadata":{"key":"N"}}` (a file line `{"key":"N","request":…}\n` is
/// smaller), a comma between neighbours.
pub const BODY_SHAPE: BodyShape = BodyShape { envelope: 512, per_item: 48, separator: 1 };

/// The display name of chunk `chunk` of `job_id` created under `nonce`: what a look-up after an uncertain create
/// compares, whole, with the listed batches' names (so only a batch carrying this chunk's own nonce matches).
pub fn display_name(nonce: &str, chunk: u32, job_id: &str) -> String {
    let mut end = job_id.len().min(MAX_JOB_IN_NAME);
    while !job_id.is_char_boundary(end) {
        end -= 1;
    }
    format!("batchd-{nonce}-{chunk}-{}", &job_id[..end])
}

/// A request item that is not a JSON object (nothing was sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAnObject(pub usize);

/// Each item without its `external_reference` (the engine echoes it), checked to be an object.
fn items<'a>(items: &'a [&'a RawValue]) -> impl Iterator<Item = Result<std::borrow::Cow<'a, str>, NotAnObject>> {
    items.iter().enumerate().map(|(index, item)| {
        let text = batchd_core::reference::strip(item.get());
        if text.trim_start().starts_with('{') { Ok(text) } else { Err(NotAnObject(index)) }
    })
}

/// `{"batch":{"displayName":…,"inputConfig":{"requests":{"requests":[{"request":…,"metadata":{"key":"N"}},…]}}}}`.
pub fn inline_body(requests: &[&RawValue], display_name: &str) -> Result<Vec<u8>, NotAnObject> {
    let capacity = BODY_SHAPE.bytes(requests.iter().map(|item| item.get().len()));
    let mut body = Vec::with_capacity(capacity);
    body.extend_from_slice(br#"{"batch":{"displayName":"#);
    body.extend_from_slice(json_string(display_name).as_bytes());
    body.extend_from_slice(br#","inputConfig":{"requests":{"requests":["#);
    for (index, item) in items(requests).enumerate() {
        if index > 0 {
            body.push(b',');
        }
        body.extend_from_slice(br#"{"request":"#);
        body.extend_from_slice(item?.as_bytes());
        body.extend_from_slice(format!(r#","metadata":{{"key":"{index}"}}}}"#).as_bytes());
    }
    body.extend_from_slice(b"]}}}}");
    Ok(body)
}

/// The input file: one line `{"key":"N","request":…}` per request.
pub fn file_lines(requests: &[&RawValue]) -> Result<Vec<u8>, NotAnObject> {
    let capacity = BODY_SHAPE.bytes(requests.iter().map(|item| item.get().len()));
    let mut body = Vec::with_capacity(capacity);
    for (index, item) in items(requests).enumerate() {
        body.extend_from_slice(format!(r#"{{"key":"{index}","request":"#).as_bytes());
        body.extend_from_slice(item?.as_bytes());
        body.extend_from_slice(b"}\n");
    }
    Ok(body)
}

/// `{"batch":{"displayName":…,"inputConfig":{"fileName":"files/…"}}}`.
pub fn file_body(file_name: &str, display_name: &str) -> Vec<u8> {
    serde_json::json!({"batch": {"displayName": display_name, "inputConfig": {"fileName": file_name}}})
        .to_string()
        .into_bytes()
}

fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// A batch's state, whichever spelling the reply uses (`BATCH_STATE_*` in REST, `JOB_STATE_*` in the SDKs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Queued, pending, running (or paused, updating): not ended.
    Running,
    /// A cancel is under way.
    Cancelling,
    /// Ended with every request answered (or some: `PARTIALLY_SUCCEEDED`).
    Succeeded,
    /// Ended in failure as a whole.
    Failed,
    /// Cancelled: what finished is in its output, if anything.
    Cancelled,
    /// Not done in time: what finished is in its output, if anything.
    Expired,
    /// A state the docs do not list (read as not ended).
    Other,
}

impl State {
    /// Reads `BATCH_STATE_SUCCEEDED`, `JOB_STATE_SUCCEEDED` (or the bare `SUCCEEDED`).
    pub fn parse(text: &str) -> Self {
        let bare = text.strip_prefix("BATCH_STATE_").or_else(|| text.strip_prefix("JOB_STATE_")).unwrap_or(text);
        match bare {
            "PENDING" | "QUEUED" | "RUNNING" | "PAUSED" | "UPDATING" => Self::Running,
            "CANCELLING" => Self::Cancelling,
            "SUCCEEDED" | "PARTIALLY_SUCCEEDED" => Self::Succeeded,
            "FAILED" => Self::Failed,
            "CANCELLED" => Self::Cancelled,
            "EXPIRED" => Self::Expired,
            _ => Self::Other,
        }
    }
}

/// A long-running operation (create, get, list) or a bare batch, as far as batchd reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Operation {
    /// `batches/…`.
    name: Option<String>,
    /// The batch (`GenerateContentBatch`).
    metadata: Option<BatchFields>,
    /// The batch's output once it succeeded (`GenerateContentBatchOutput`).
    response: Option<Output>,
    /// Why the batch failed (google.rpc.Status).
    error: Option<RpcStatus>,
    /// A bare batch's state (a reply that is the batch itself, not its operation).
    state: Option<String>,
    /// A bare batch's display name.
    display_name: Option<String>,
    /// A bare batch's output.
    output: Option<Output>,
}

/// The batch's fields batchd reads.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct BatchFields {
    /// `batches/…`.
    name: Option<String>,
    /// The display name batchd gave it.
    display_name: Option<String>,
    /// `BATCH_STATE_*` or `JOB_STATE_*`.
    state: Option<String>,
    /// Its output (where the SDKs read it).
    output: Option<Output>,
}

/// Where a batch's responses are.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Output {
    /// `{"inlinedResponses":[…]}`.
    inlined_responses: Option<Inlined>,
    /// `files/…`.
    responses_file: Option<String>,
}

/// The inline responses' wrapper.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Inlined {
    /// One per request, in any order.
    inlined_responses: Vec<Line>,
}

/// One response, inline (the key in `metadata`) or a file line (the key beside it).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Line {
    /// A file line's key.
    key: Option<serde_json::Value>,
    /// An inline response's metadata, with the request's key.
    metadata: Option<serde_json::Value>,
    /// The GenerateContentResponse.
    response: Option<Box<RawValue>>,
    /// The google.rpc.Status of a failed request.
    error: Option<RpcStatus>,
}

/// A google.rpc.Status.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct RpcStatus {
    /// A google.rpc code (a number) or an HTTP one.
    code: Option<serde_json::Value>,
    /// For people.
    message: Option<String>,
    /// The code's name (`INVALID_ARGUMENT`), in HTTP error replies.
    status: Option<String>,
}

impl RpcStatus {
    /// `(code, message)`: the status name, or the number, or `error`.
    fn parts(&self) -> (String, String) {
        let code = self.status.clone().or_else(|| self.code.as_ref().map(ToString::to_string));
        let code = batchd_provider::text::one_line(&code.unwrap_or_else(|| "error".to_owned()), 64);
        let message = batchd_provider::text::one_line(self.message.as_deref().unwrap_or_default(), MAX_MESSAGE_CHARS);
        (code, message)
    }
}

/// Where a finished batch's responses are.
#[derive(Debug)]
pub enum Responses {
    /// In the reply.
    Inline(JobOutput),
    /// In this file.
    File(String),
    /// Nowhere: the batch ended without output.
    None,
}

impl Operation {
    /// The reply read leniently; `None` when it is not a JSON object.
    pub fn read(reply: &[u8]) -> Option<Self> {
        serde_json::from_slice(reply).ok()
    }

    /// `batches/…`.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref().or_else(|| self.metadata.as_ref().and_then(|batch| batch.name.as_deref()))
    }

    /// The display name.
    pub fn display_name(&self) -> Option<&str> {
        self.metadata.as_ref().and_then(|batch| batch.display_name.as_deref()).or(self.display_name.as_deref())
    }

    /// The state as the reply spells it.
    pub fn state_text(&self) -> Option<&str> {
        self.metadata.as_ref().and_then(|batch| batch.state.as_deref()).or(self.state.as_deref())
    }

    /// The state.
    pub fn state(&self) -> State {
        self.state_text().map_or(State::Other, State::parse)
    }

    /// Why a failed batch failed: `(code, message)`.
    pub fn failure(&self) -> (String, String) {
        self.error
            .as_ref()
            .map_or_else(|| ("FAILED".to_owned(), "the batch failed without an error".to_owned()), RpcStatus::parts)
    }

    /// The responses file a finished batch names, if its responses are not inline.
    pub fn responses_file(&self) -> Option<String> {
        [self.response.as_ref(), self.metadata.as_ref().and_then(|batch| batch.output.as_ref()), self.output.as_ref()]
            .into_iter()
            .flatten()
            .find_map(|output| output.responses_file.clone())
    }

    /// Where the responses of a batch of `n_items` requests are, the inline ones joined on their keys; `ended` is
    /// what a request without a response is said to be (`missing`, `cancelled`, `expired`).
    pub fn responses(self, n_items: usize, ended: &str) -> Responses {
        let output = [self.response, self.metadata.and_then(|batch| batch.output), self.output]
            .into_iter()
            .flatten()
            .find(|output| output.inlined_responses.is_some() || output.responses_file.is_some());
        match output {
            Some(Output { responses_file: Some(file), .. }) => Responses::File(file),
            Some(Output { inlined_responses: Some(inlined), .. }) => {
                let mut join = Join::new(n_items);
                for line in inlined.inlined_responses {
                    join.add(line);
                }
                Responses::Inline(join.finish(ended))
            }
            _ => Responses::None,
        }
    }
}

/// A page of the batch list.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Page {
    /// The page's batches, as operations.
    pub operations: Vec<Operation>,
    /// The next page's token, if any.
    pub next_page_token: Option<String>,
}

/// The responses read so far, one slot per request, and what was wrong with the others.
#[derive(Debug)]
pub struct Join {
    /// One slot per request.
    slots: Vec<Option<ItemResponse>>,
    /// Summed token counts of succeeded requests (`usageMetadata`).
    usage: serde_json::Map<String, serde_json::Value>,
    /// Lines skipped: unreadable, without a key of this chunk, or repeating a key.
    pub skipped: usize,
}

impl Join {
    /// A join for `n_items` requests.
    pub fn new(n_items: usize) -> Self {
        Self { slots: vec![None; n_items], usage: serde_json::Map::new(), skipped: 0 }
    }

    /// Reads one line of a responses file (without its newline); blank lines are ignored.
    pub fn add_line(&mut self, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match serde_json::from_slice::<Line>(line) {
            Ok(line) => self.add(line),
            Err(_) => self.skipped += 1,
        }
    }

    /// Takes one response, at the position its key names.
    fn add(&mut self, line: Line) {
        let key = line.key.as_ref().or_else(|| line.metadata.as_ref().and_then(|metadata| metadata.get("key")));
        let index = key.and_then(serde_json::Value::as_str).and_then(parse_key);
        let Some(slot) = index.and_then(|index| self.slots.get_mut(index)).filter(|slot| slot.is_none()) else {
            self.skipped += 1;
            return;
        };
        let index = index.unwrap_or_default();
        *slot = Some(match (line.response, line.error) {
            (Some(response), None) => {
                #[derive(Deserialize)]
                #[serde(rename_all = "camelCase")]
                struct Usage {
                    /// Token counts.
                    usage_metadata: Option<serde_json::Map<String, serde_json::Value>>,
                }
                if let Ok(Usage { usage_metadata: Some(usage) }) = serde_json::from_str(response.get()) {
                    add_usage(&mut self.usage, usage);
                }
                ItemResponse {
                    index,
                    success: true,
                    result: Some(response),
                    error: None,
                    external_reference: None,
                    resent: false,
                }
            }
            (_, Some(error)) => {
                let (code, message) = error.parts();
                failed_item(index, &code, &message)
            }
            (None, None) => failed_item(index, "missing", "the response carries neither a response nor an error"),
        });
    }

    /// Every request answered, in order; one without a response fails with code `ended`.
    pub fn finish(self, ended: &str) -> JobOutput {
        let message = match ended {
            "cancelled" => "not run: the batch was cancelled before this request ran",
            "expired" => "not run: the batch expired before this request ran",
            _ => "Gemini Batch Mode returned no response for this request",
        };
        let responses = self
            .slots
            .into_iter()
            .enumerate()
            .map(|(index, slot)| slot.unwrap_or_else(|| failed_item(index, ended, message)))
            .collect();
        JobOutput { responses, usage: serde_json::Value::Object(self.usage), failed_batches: Vec::new() }
    }
}

/// A key batchd wrote: a request's index in decimal, without leading zeros.
fn parse_key(key: &str) -> Option<usize> {
    let canonical = !key.is_empty() && key.len() <= 9 && key.bytes().all(|b| b.is_ascii_digit());
    if !canonical || (key.len() > 1 && key.starts_with('0')) {
        return None;
    }
    key.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).expect("json")
    }

    #[test]
    fn the_inline_body_carries_each_request_with_its_key_and_fits_the_shape() {
        let items = [raw(r#"{"contents":[{"parts":[{"text":"a"}]}],"external_reference":"r1"}"#), raw(r#"{"x":1}"#)];
        let items: Vec<&RawValue> = items.iter().map(AsRef::as_ref).collect();
        let name = display_name("00ff00ff00ff00ff", 3, &"j".repeat(300));
        let body = inline_body(&items, &name).expect("objects");
        let value: serde_json::Value = serde_json::from_slice(&body).expect("json");
        let requests = &value["batch"]["inputConfig"]["requests"]["requests"];
        assert_eq!(requests[1]["metadata"]["key"], "1");
        assert_eq!(requests[0]["request"]["contents"][0]["parts"][0]["text"], "a");
        assert!(requests[0]["request"].get("external_reference").is_none(), "the reference is not sent");
        assert!(body.len() <= BODY_SHAPE.bytes(items.iter().map(|item| item.get().len())));
        let lines = file_lines(&items).expect("objects");
        assert!(lines.len() <= BODY_SHAPE.bytes(items.iter().map(|item| item.get().len())));
        assert_eq!(String::from_utf8(lines).expect("utf-8").lines().count(), 2);
        assert_eq!(inline_body(&[&*raw("[1]")], &name), Err(NotAnObject(0)));
        assert_eq!(name, format!("batchd-00ff00ff00ff00ff-3-{}", "j".repeat(100)));
    }

    #[test]
    fn both_spellings_of_a_state_read_the_same() {
        for (text, state) in [
            ("BATCH_STATE_PENDING", State::Running),
            ("JOB_STATE_PENDING", State::Running),
            ("BATCH_STATE_RUNNING", State::Running),
            ("JOB_STATE_SUCCEEDED", State::Succeeded),
            ("BATCH_STATE_SUCCEEDED", State::Succeeded),
            ("BATCH_STATE_CANCELLED", State::Cancelled),
            ("JOB_STATE_EXPIRED", State::Expired),
            ("BATCH_STATE_FAILED", State::Failed),
            ("JOB_STATE_CANCELLING", State::Cancelling),
            ("BATCH_STATE_UNSPECIFIED", State::Other),
        ] {
            assert_eq!(State::parse(text), state, "{text}");
        }
    }

    #[test]
    fn inline_responses_are_joined_on_their_keys_never_on_order() {
        let reply = br#"{"name":"batches/b1","done":true,"metadata":{"state":"BATCH_STATE_SUCCEEDED"},
            "response":{"inlinedResponses":{"inlinedResponses":[
              {"metadata":{"key":"2"},"response":{"candidates":[],"usageMetadata":{"promptTokenCount":3}}},
              {"metadata":{"key":"0"},"error":{"code":3,"message":"bad","status":"INVALID_ARGUMENT"}},
              {"metadata":{"key":"0"},"response":{}},
              {"metadata":{"key":"07"},"response":{}},
              {"response":{}}
            ]}}}"#;
        let operation = Operation::read(reply).expect("operation");
        assert_eq!(operation.state(), State::Succeeded);
        let Responses::Inline(output) = operation.responses(3, "missing") else { panic!("inline") };
        assert!(!output.responses[0].success, "the first answer for a key is kept");
        assert!(output.responses[0].error.as_ref().expect("error").get().contains("INVALID_ARGUMENT"));
        assert!(!output.responses[1].success, "no response: missing");
        assert!(output.responses[2].success);
        assert_eq!(output.usage["promptTokenCount"], 3);
    }

    #[test]
    fn a_responses_file_is_named_and_its_lines_joined() {
        let reply = br#"{"name":"batches/b1","metadata":{"state":"JOB_STATE_SUCCEEDED","output":{"responsesFile":"files/r1"}}}"#;
        let Responses::File(file) = Operation::read(reply).expect("operation").responses(2, "missing") else {
            panic!("file")
        };
        assert_eq!(file, "files/r1");
        let mut join = Join::new(2);
        join.add_line(br#"{"key":"1","response":{"candidates":[]}}"#);
        join.add_line(b"not json");
        join.add_line(br#"{"key":"5","response":{}}"#);
        assert_eq!(join.skipped, 2, "an unreadable line and a key past the chunk's end");
        let output = join.finish("cancelled");
        assert_eq!(output.n_failed(), 1);
        assert!(output.responses[1].success);
        assert!(output.responses[0].error.as_ref().expect("error").get().contains("cancelled"));
    }
}
