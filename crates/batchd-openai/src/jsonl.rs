//! The JSONL of a batch, both ways, with no I/O: a chunk's items written as input lines, and the lines of the
//! output and error files joined back into one response per item, in request order.
//!
//! Built to be lenient in what it reads: a line that is not JSON, names no item of the chunk or repeats one is
//! counted and skipped, a success is never replaced by a failure, and an item that is in neither file is answered
//! `success:false` as not run.

use std::collections::BTreeMap;

use batchd_core::{ItemResponse, JobOutput};
use batchd_provider::BodyShape;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The endpoints a batch may target by default (`openai.endpoints`): the reference's list (Part B1 §3: the guide's
/// seven and the API reference's `/v1/videos`).
pub const DEFAULT_ENDPOINTS: [&str; 8] = [
    "/v1/responses",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/completions",
    "/v1/moderations",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/videos",
];

/// The embeddings endpoint, whose batches are limited by inputs as well as by lines.
pub const EMBEDDINGS: &str = "/v1/embeddings";

/// Most embedding inputs in one `/v1/embeddings` batch ("Embeddings batches are capped at 50,000 inputs in
/// total", the reference's Part B1 §3).
pub const MAX_EMBEDDING_INPUTS: usize = 50_000;

/// The embedding inputs an item asks for: its `input`'s elements when it is an array of texts or of token
/// arrays, else 1 (a text, an array of token ids, or an item without a readable `input`, which the API refuses
/// on its own).
pub fn embedding_inputs(item: &RawValue) -> usize {
    match batchd_provider::items::array_member(item, "input") {
        // An array of token ids is one input.
        Some(elements) if elements.first().is_some_and(|first| !first.get().starts_with(['[', '"'])) => 1,
        Some(elements) => elements.len().max(1),
        None => 1,
    }
}

/// Longest endpoint `openai.endpoints` may name, in bytes (it is part of every input line's bound).
pub const MAX_ENDPOINT_LEN: usize = 64;

/// What every input line holds besides its item, custom id, endpoint and model: the line is
/// `{"custom_id":"<i>","method":"POST","url":"<endpoint>","body":{"model":"<model>",<item's members>}}` and a
/// newline.
const LINE_FRAME: &str = r#"{"custom_id":"","method":"POST","url":"","body":{"model":"",}}"#;

/// Longest error message kept in an item's error, in characters.
const MESSAGE_CHARS: usize = 2048;

/// An upper bound of an input file's size for items of given sizes: each line is its item plus at most this
/// much (a custom id of up to `max_requests` digits, an endpoint of up to `endpoint` bytes, a model name of up to
/// `batchd_core`'s limit), and a newline.
pub fn line_shape(max_requests: usize, endpoint: usize) -> BodyShape {
    let digits = max_requests.max(1).to_string().len();
    let per_item = LINE_FRAME.len() + 1 + digits + endpoint + batchd_core::ids::MAX_MODEL_LEN;
    BodyShape { envelope: 0, per_item, separator: 0 }
}

/// Appends one input line per item to `out`: `custom_id` is the item's position in the chunk, `body` the item
/// with `"model"` put first, its top-level `external_reference` left out (batchd echoes it itself:
/// [`batchd_core::reference`]) and its members byte for byte otherwise (line breaks between tokens, which a
/// pretty-printed item may hold, become spaces: JSONL is one request per line, and JSON strings cannot hold a raw
/// line break). Each item must be a JSON object (the job decoder checks it).
pub fn write_lines(out: &mut Vec<u8>, items: &[&RawValue], endpoint: &str, model: &str) {
    let endpoint = serde_json::to_string(endpoint).expect("a string serialises");
    let model = serde_json::to_string(model).expect("a string serialises");
    for (index, item) in items.iter().enumerate() {
        let item = batchd_core::reference::strip(item.get());
        let text = item.trim();
        out.extend_from_slice(br#"{"custom_id":""#);
        out.extend_from_slice(index.to_string().as_bytes());
        out.extend_from_slice(br#"","method":"POST","url":"#);
        out.extend_from_slice(endpoint.as_bytes());
        out.extend_from_slice(br#","body":{"model":"#);
        out.extend_from_slice(model.as_bytes());
        let members = text.strip_prefix('{').unwrap_or(text);
        if !members.trim_start().starts_with('}') {
            out.push(b',');
        }
        let start = out.len();
        out.extend_from_slice(members.as_bytes());
        for byte in &mut out[start..] {
            if *byte == b'\n' || *byte == b'\r' {
                *byte = b' ';
            }
        }
        out.extend_from_slice(b"}\n");
    }
}

/// One line of an output or error file, read field by field; anything else in it is ignored.
#[derive(Debug, Deserialize)]
struct ResultLine<'a> {
    /// The input line's custom id.
    #[serde(default, borrow)]
    custom_id: Option<&'a RawValue>,
    /// The endpoint's reply, when the request ran.
    #[serde(default)]
    response: Option<LineResponse<'a>>,
    /// A failure that is not an HTTP reply (`batch_expired`, `batch_cancelled`, `request_timeout`).
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

/// `response` of a result line.
#[derive(Debug, Deserialize)]
struct LineResponse<'a> {
    /// The endpoint's HTTP status.
    #[serde(default)]
    status_code: Option<u16>,
    /// The endpoint's reply body, opaque.
    #[serde(default, borrow)]
    body: Option<&'a RawValue>,
}

/// An error object as OpenAI writes it (`{code, message, type, param}`), read leniently.
#[derive(Debug, Default, Deserialize)]
struct ErrorObject {
    /// The error code.
    #[serde(default)]
    code: Option<serde_json::Value>,
    /// The error type (`invalid_request_error`, `server_error`).
    #[serde(default, rename = "type")]
    kind: Option<String>,
    /// What went wrong.
    #[serde(default)]
    message: Option<String>,
}

/// A reply body's `error` member.
#[derive(Debug, Deserialize)]
struct BodyWithError {
    /// The error.
    #[serde(default)]
    error: Option<ErrorObject>,
}

/// A reply body's `usage` member.
#[derive(Debug, Deserialize)]
struct BodyWithUsage {
    /// Token counts; only the numbers at its top level are summed.
    #[serde(default)]
    usage: Option<BTreeMap<String, serde_json::Value>>,
}

/// Lines that were not used, by reason (logged by the provider).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Skipped {
    /// Not a JSON object with a custom id.
    pub unreadable: usize,
    /// A custom id that names no item of the chunk.
    pub unknown: usize,
    /// An item already answered (a failure after a success, or a repeat).
    pub repeated: usize,
}

/// Joins result lines, from either file in any order, into one response per item.
#[derive(Debug)]
pub struct Joiner {
    /// The answer of each item so far.
    slots: Vec<Option<ItemResponse>>,
    /// The summed token counts of the successful replies.
    usage: BTreeMap<String, u64>,
    /// What was skipped.
    skipped: Skipped,
}

impl Joiner {
    /// A join for a chunk of `n_items` items.
    pub fn new(n_items: usize) -> Self {
        Self { slots: (0..n_items).map(|_| None).collect(), usage: BTreeMap::new(), skipped: Skipped::default() }
    }

    /// Reads one line (without its newline; blank lines are ignored).
    pub fn add_line(&mut self, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let Ok(parsed) = serde_json::from_slice::<ResultLine<'_>>(line) else {
            self.skipped.unreadable += 1;
            return;
        };
        let Some(index) = parsed.custom_id.and_then(item_index).filter(|index| *index < self.slots.len()) else {
            if parsed.custom_id.is_none() {
                self.skipped.unreadable += 1;
            } else {
                self.skipped.unknown += 1;
            }
            return;
        };
        let status = parsed.response.as_ref().and_then(|response| response.status_code);
        let body = parsed.response.as_ref().and_then(|response| response.body);
        let error = parsed.error.filter(|error| error.get() != "null");
        let succeeded = error.is_none() && status.is_some_and(|status| (200..300).contains(&status));
        match (&self.slots[index], succeeded) {
            (Some(previous), _) if previous.success => {
                self.skipped.repeated += 1;
                return;
            }
            (Some(_), false) => {
                self.skipped.repeated += 1;
                return;
            }
            _ => {}
        }
        let response = if succeeded {
            let result = body.map(RawValue::to_owned);
            if let Some(body) = body {
                self.add_usage(body);
            }
            ItemResponse { index, success: true, result, error: None, external_reference: None, resent: false }
        } else {
            ItemResponse::failure(index, Some(item_error(error, status, body)))
        };
        self.slots[index] = Some(response);
    }

    /// The responses in request order (an item in neither file answered as not run), the summed usage, and what
    /// was skipped.
    pub fn finish(self) -> (JobOutput, Skipped) {
        let responses = self
            .slots
            .into_iter()
            .enumerate()
            .map(|(index, slot)| slot.unwrap_or_else(|| ItemResponse::failure(index, Some(not_run()))))
            .collect();
        let usage = serde_json::to_value(&self.usage).expect("numbers serialise");
        (JobOutput { responses, usage, failed_batches: Vec::new() }, self.skipped)
    }

    fn add_usage(&mut self, body: &RawValue) {
        let Ok(BodyWithUsage { usage: Some(usage) }) = serde_json::from_str::<BodyWithUsage>(body.get()) else {
            return;
        };
        for (name, value) in usage.into_iter().take(32) {
            if let Some(count) = value.as_u64() {
                let total = self.usage.entry(name).or_default();
                *total = total.saturating_add(count);
            }
        }
    }
}

/// The chunk-local index a custom id names: batchd writes decimal strings; anything else names no item.
fn item_index(custom_id: &RawValue) -> Option<usize> {
    let text: &str = serde_json::from_str(custom_id.get()).ok()?;
    if text.is_empty() || text.len() > 12 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// An item's error as batchd's result carries it: `{code, message, http_status?}` from the line's `error` (a
/// failure that is not an HTTP reply) or its reply body's `error` (an HTTP failure).
fn item_error(error: Option<&RawValue>, status: Option<u16>, body: Option<&RawValue>) -> Box<RawValue> {
    let from_line = error.and_then(|error| serde_json::from_str::<ErrorObject>(error.get()).ok());
    let from_body =
        body.and_then(|body| serde_json::from_str::<BodyWithError>(body.get()).ok()).and_then(|body| body.error);
    let object = from_line.or(from_body).unwrap_or_default();
    let code = match object.code {
        Some(serde_json::Value::String(code)) => Some(code),
        Some(serde_json::Value::Number(code)) => Some(code.to_string()),
        _ => object.kind,
    };
    let message = object.message.map(|message| message.chars().take(MESSAGE_CHARS).collect::<String>());
    let mut value = serde_json::json!({
        "code": code.map_or_else(|| "request_failed".to_owned(), |code| code.chars().take(64).collect()),
        "message": message.unwrap_or_else(|| "the request failed without an error message".to_owned()),
    });
    if let Some(status) = status {
        value["http_status"] = status.into();
    }
    RawValue::from_string(value.to_string()).expect("a serialised value is JSON")
}

/// The error of an item the batch never ran.
fn not_run() -> Box<RawValue> {
    let message = "the batch ended before this request ran: it is in neither the output nor the error file";
    let error = serde_json::json!({"code": batchd_core::result::code::NOT_RUN, "message": message});
    RawValue::from_string(error.to_string()).expect("valid JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedding_inputs_count_the_texts_and_token_arrays_of_an_input() {
        let count = |json: &str| embedding_inputs(&RawValue::from_string(json.to_owned()).expect("json"));
        assert_eq!(count(r#"{"input":"one"}"#), 1);
        assert_eq!(count(r#"{"input":["a","b","c"],"dimensions":4}"#), 3);
        assert_eq!(count(r#"{"input":[[1,2],[3]]}"#), 2);
        assert_eq!(count(r#"{"input":[101,2023,102]}"#), 1, "one tokenized input");
        assert_eq!(count(r#"{"no_input":true}"#), 1);
        assert_eq!(count(r#"{"input":[]}"#), 1);
    }

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).expect("json")
    }

    fn lines(items: &[&str], endpoint: &str, model: &str) -> Vec<serde_json::Value> {
        let owned: Vec<Box<RawValue>> = items.iter().map(|item| raw(item)).collect();
        let refs: Vec<&RawValue> = owned.iter().map(AsRef::as_ref).collect();
        let mut out = Vec::new();
        write_lines(&mut out, &refs, endpoint, model);
        let shape = line_shape(50_000, endpoint.len());
        assert!(out.len() <= shape.bytes(items.iter().map(|item| item.len())), "the shape is an upper bound");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.ends_with('\n'));
        text.lines().map(|line| serde_json::from_str(line).expect("each line is JSON")).collect()
    }

    #[test]
    fn each_item_becomes_one_line_with_the_model_filled_in() {
        let parsed = lines(
            &[
                r#"{"messages":[{"role":"user","content":"hi\nthere"}], "max_tokens" : 5}"#,
                "{}",
                "{ }",
                "{\n  \"input\": \"x\"\n}",
            ],
            "/v1/chat/completions",
            "gpt-4o-mini",
        );
        assert_eq!(parsed.len(), 4);
        assert_eq!(parsed[0]["custom_id"], "0");
        assert_eq!(parsed[0]["method"], "POST");
        assert_eq!(parsed[0]["url"], "/v1/chat/completions");
        assert_eq!(parsed[0]["body"]["model"], "gpt-4o-mini");
        assert_eq!(parsed[0]["body"]["messages"][0]["content"], "hi\nthere", "escaped line breaks stay");
        assert_eq!(parsed[0]["body"]["max_tokens"], 5);
        assert_eq!(parsed[1]["body"], serde_json::json!({"model": "gpt-4o-mini"}));
        assert_eq!(parsed[2]["body"], serde_json::json!({"model": "gpt-4o-mini"}));
        assert_eq!(parsed[3]["custom_id"], "3");
        assert_eq!(parsed[3]["body"]["input"], "x", "a pretty-printed item fits on its line");
    }

    #[test]
    fn the_members_of_an_item_pass_byte_for_byte() {
        let item = raw(r#"{"z":1.50, "a" :[1,2]}"#);
        let mut out = Vec::new();
        write_lines(&mut out, &[item.as_ref()], "/v1/embeddings", "m");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.contains(r#""body":{"model":"m","z":1.50, "a" :[1,2]}}"#), "{text}");
    }

    #[test]
    fn a_top_level_external_reference_is_left_out_of_the_body_and_nothing_else() {
        let parsed = lines(
            &[
                r#"{"external_reference":"q1","messages":[{"role":"user","content":"a"}]}"#,
                r#"{"messages":[], "external_reference" : {"k":1}}"#,
                r#"{"external_reference":7}"#,
                r#"{"input":{"external_reference":"nested"},"external\u005freference":"escaped"}"#,
            ],
            "/v1/chat/completions",
            "m",
        );
        assert_eq!(
            parsed[0]["body"],
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "a"}]})
        );
        assert_eq!(parsed[1]["body"], serde_json::json!({"model": "m", "messages": []}));
        assert_eq!(parsed[2]["body"], serde_json::json!({"model": "m"}));
        assert_eq!(parsed[3]["body"], serde_json::json!({"model": "m", "input": {"external_reference": "nested"}}));
        let item = raw(r#"{"z":1.50, "external_reference":"x", "a" :[1,2]}"#);
        let mut out = Vec::new();
        write_lines(&mut out, &[item.as_ref()], "/v1/embeddings", "m");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.contains(r#""body":{"model":"m","z":1.50, "a" :[1,2]}}"#), "{text}");
    }

    fn output(index: usize, content: &str, tokens: u64) -> String {
        format!(
            r#"{{"id":"batch_req_{index}","custom_id":"{index}","response":{{"status_code":200,"request_id":"req_{index}","body":{{"content":"{content}","usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens},"details":{{"x":1}}}}}}}},"error":null}}"#
        )
    }

    fn join(lines: &[String], n_items: usize) -> (JobOutput, Skipped) {
        let mut joiner = Joiner::new(n_items);
        for line in lines {
            joiner.add_line(line.as_bytes());
        }
        joiner.finish()
    }

    #[test]
    fn shuffled_lines_come_back_in_request_order_with_usage_summed() {
        let lines = vec![output(2, "c", 3), output(0, "a", 1), output(1, "b", 2)];
        let (joined, skipped) = join(&lines, 3);
        assert_eq!(skipped, Skipped::default());
        let contents: Vec<String> = joined
            .responses
            .iter()
            .map(|response| {
                assert!(response.success);
                let body: serde_json::Value =
                    serde_json::from_str(response.result.as_ref().expect("result").get()).expect("json");
                body["content"].as_str().expect("content").to_owned()
            })
            .collect();
        assert_eq!(contents, ["a", "b", "c"]);
        assert_eq!(joined.usage, serde_json::json!({"prompt_tokens": 6, "total_tokens": 6}));
    }

    #[test]
    fn error_lines_and_missing_items_are_failures_with_their_code() {
        let lines = vec![
            output(0, "a", 1),
            r#"{"id":"r1","custom_id":"1","response":{"status_code":400,"request_id":"q","body":{"error":{"message":"bad messages","type":"invalid_request_error","param":"messages","code":null}}},"error":null}"#.to_owned(),
            r#"{"id":"r2","custom_id":"2","response":null,"error":{"code":"batch_expired","message":"This request could not be executed before the completion window expired."}}"#.to_owned(),
        ];
        let (joined, _) = join(&lines, 4);
        let error = |index: usize| -> serde_json::Value {
            assert!(!joined.responses[index].success);
            serde_json::from_str(joined.responses[index].error.as_ref().expect("error").get()).expect("json")
        };
        assert_eq!(
            error(1),
            serde_json::json!({"code": "invalid_request_error", "message": "bad messages", "http_status": 400})
        );
        assert_eq!(error(2)["code"], "batch_expired");
        assert_eq!(error(3)["code"], "not_run");
        assert_eq!(joined.n_failed(), 3);
    }

    #[test]
    fn duplicated_and_hostile_lines_never_replace_an_answer_or_invent_one() {
        let failure = r#"{"custom_id":"0","response":{"status_code":500,"body":{"error":{"message":"boom","type":"server_error"}}}}"#;
        let lines = vec![
            failure.to_owned(),
            output(0, "a", 1),
            output(0, "again", 1),
            failure.to_owned(),
            "not json".to_owned(),
            r#"{"custom_id":"99","response":{"status_code":200,"body":{}}}"#.to_owned(),
            r#"{"custom_id":"-1","response":{"status_code":200,"body":{}}}"#.to_owned(),
            r#"{"custom_id":1,"response":{"status_code":200,"body":{}}}"#.to_owned(),
            r#"{"response":{"status_code":200,"body":{}}}"#.to_owned(),
            r#"[1,2]"#.to_owned(),
            "   ".to_owned(),
        ];
        let (joined, skipped) = join(&lines, 2);
        assert!(joined.responses[0].success, "a success replaces an earlier failure");
        assert!(
            joined.responses[0].result.as_ref().expect("result").get().contains("\"a\""),
            "the first success stays"
        );
        assert!(!joined.responses[1].success);
        assert_eq!(skipped, Skipped { unreadable: 3, unknown: 3, repeated: 2 });
    }
}
