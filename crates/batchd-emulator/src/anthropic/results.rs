//! One item's run and its result line: the asynchronous check of `params`, the deterministic Message of an item
//! that passes, and the JSONL the results endpoint serves.
//!
//! The live API accepts a batch whatever its items' `params` say and reports a bad item as an `errored` result
//! once the batch ends; so the check here runs at create, and its verdict only shows in the results.

use serde::Serialize;
use serde_json::{Map, Value};

use super::ErrorShape;
use crate::{outputs::hash_of, state::response_order};

/// Characters of the last user text a Message echoes.
const ECHO_CHARS: usize = 40;

/// What one item comes to once run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// The item ran: its Message.
    Succeeded(Message),
    /// The item was refused by the asynchronous check.
    Errored {
        /// The error's `type` (`invalid_request_error`).
        error_type: &'static str,
        /// The error's message, naming the field.
        message: String,
    },
}

/// The Message of an item that ran: what varies from item to item (kept small, for 100,000-item batches; the
/// rest of the JSON is written by [`MessageJson`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    /// `msg_emu…`, from the item.
    id: String,
    /// The item's `params.model`.
    model: String,
    /// The one text block's text.
    text: String,
    /// `end_turn`, or `max_tokens` when the text was cut.
    stop_reason: &'static str,
    /// Token counts.
    usage: Usage,
}

/// A Message's `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct Usage {
    /// Prompt words outside blocks marked `cache_control`.
    input_tokens: usize,
    /// Words of the text.
    output_tokens: usize,
    /// Always 0.
    cache_creation_input_tokens: usize,
    /// Prompt words inside blocks marked `cache_control`.
    cache_read_input_tokens: usize,
    /// Always `batch`.
    service_tier: &'static str,
}

/// A Message as the API writes it.
#[derive(Serialize)]
struct MessageJson<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: [TextBlock<'a>; 1],
    stop_reason: &'static str,
    stop_sequence: Option<&'static str>,
    usage: Usage,
}

/// A `text` content block.
#[derive(Serialize)]
struct TextBlock<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

impl Serialize for Message {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        MessageJson {
            id: &self.id,
            kind: "message",
            role: "assistant",
            model: &self.model,
            content: [TextBlock { kind: "text", text: &self.text }],
            stop_reason: self.stop_reason,
            stop_sequence: None,
            usage: self.usage,
        }
        .serialize(serializer)
    }
}

/// One item of a batch: its id and what it came to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Item {
    /// The caller's `custom_id`.
    pub custom_id: String,
    /// Its outcome, revealed once the item is finished and the batch has ended.
    pub outcome: Outcome,
}

/// How an item ends up when its batch ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// It ran: `succeeded` or `errored` by its outcome.
    Ran,
    /// The batch was canceled first.
    Canceled,
    /// The batch expired first.
    Expired,
}

/// Runs one item: checks its `params` as the API does after accepting the batch, and answers a Message if they
/// pass.
pub(crate) fn run_item(custom_id: &str, params: &Map<String, Value>) -> Outcome {
    let invalid = |message: &str| Outcome::Errored { error_type: "invalid_request_error", message: message.to_owned() };
    let Some(model) = params.get("model").and_then(Value::as_str) else {
        return invalid("model: Field required");
    };
    let max_tokens = match params.get("max_tokens") {
        None => return invalid("max_tokens: Field required"),
        Some(value) => match value.as_u64() {
            Some(max_tokens) if max_tokens >= 1 => max_tokens,
            _ => return invalid("max_tokens: Input should be an integer greater than or equal to 1"),
        },
    };
    let Some(messages) = params.get("messages").and_then(Value::as_array) else {
        return invalid("messages: Field required");
    };
    if messages.is_empty() {
        return invalid("messages: at least one message is required");
    }
    if params.get("stream").and_then(Value::as_bool) == Some(true) {
        return invalid("stream: streaming is not supported in Message Batches");
    }
    if params.contains_key("speed") {
        return invalid("speed: not supported in Message Batches");
    }
    Outcome::Succeeded(message(custom_id, model, max_tokens, params.get("system"), messages))
}

/// Token counts of a prompt: words, split into plain input and cached input.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct PromptTokens {
    /// Words outside blocks marked `cache_control`.
    input: usize,
    /// Words inside blocks marked `cache_control` (reported as cache reads).
    cache_read: usize,
}

impl PromptTokens {
    /// Adds the words of a `system` or message `content`: a string, or a list of blocks (text blocks count).
    fn add(&mut self, content: &Value) {
        match content {
            Value::String(text) => self.input += count_words(text),
            Value::Array(blocks) => {
                for block in blocks {
                    let words = block.get("text").and_then(Value::as_str).map_or(0, count_words);
                    if block.get("cache_control").is_some() {
                        self.cache_read += words;
                    } else {
                        self.input += words;
                    }
                }
            }
            _ => {}
        }
    }
}

fn count_words(text: &str) -> usize {
    text.split_ascii_whitespace().count()
}

/// The text of a `content`: the string, or its first text block.
fn text_of(content: &Value) -> Option<&str> {
    match content {
        Value::String(text) => Some(text),
        Value::Array(blocks) => blocks.iter().find_map(|block| block.get("text").and_then(Value::as_str)),
        _ => None,
    }
}

/// The deterministic Message for an item: it echoes the start of the last user text, cut to `max_tokens` words.
fn message(custom_id: &str, model: &str, max_tokens: u64, system: Option<&Value>, messages: &[Value]) -> Message {
    let mut prompt = PromptTokens::default();
    if let Some(system) = system {
        prompt.add(system);
    }
    for message in messages {
        if let Some(content) = message.get("content") {
            prompt.add(content);
        }
    }
    let last_user_text = messages
        .iter()
        .rev()
        .filter(|message| message.get("role").and_then(Value::as_str) == Some("user"))
        .find_map(|message| message.get("content").and_then(text_of))
        .unwrap_or("");
    let echoed: String = last_user_text.chars().take(ECHO_CHARS).collect();
    let full = format!("echo: {echoed}");
    let limit = usize::try_from(max_tokens).unwrap_or(usize::MAX);
    let words: Vec<&str> = full.split_ascii_whitespace().collect();
    let (text, stop_reason) =
        if words.len() > limit { (words[..limit].join(" "), "max_tokens") } else { (full.clone(), "end_turn") };
    Message {
        id: format!("msg_emu{:016x}", hash_of(&[custom_id, model, &full])),
        model: model.to_owned(),
        usage: Usage {
            input_tokens: prompt.input,
            output_tokens: count_words(&text),
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: prompt.cache_read,
            service_tier: "batch",
        },
        text,
        stop_reason,
    }
}

/// One result line as the API writes it.
#[derive(Serialize)]
struct Line<'a> {
    custom_id: &'a str,
    result: ResultJson<'a>,
}

/// A line's `result`.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ResultJson<'a> {
    Succeeded { message: &'a Message },
    Errored { error: ErrorJson<'a> },
    Canceled,
    Expired,
}

/// An errored result's `error`, in one of the two shapes.
#[derive(Serialize)]
#[serde(untagged)]
enum ErrorJson<'a> {
    /// `{"type":"error","error":{"type","message"},"request_id"}`.
    Nested {
        #[serde(rename = "type")]
        kind: &'static str,
        error: FlatError<'a>,
        request_id: String,
    },
    /// `{"type","message"}`.
    Flat(FlatError<'a>),
}

/// `{"type","message"}`.
#[derive(Serialize)]
struct FlatError<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

/// The result line of one item of an ended batch.
fn line<'a>(batch_id: &str, item: &'a Item, fate: Fate, shape: ErrorShape) -> Line<'a> {
    let result = match (fate, &item.outcome) {
        (Fate::Canceled, _) => ResultJson::Canceled,
        (Fate::Expired, _) => ResultJson::Expired,
        (Fate::Ran, Outcome::Succeeded(message)) => ResultJson::Succeeded { message },
        (Fate::Ran, Outcome::Errored { error_type, message }) => {
            let flat = FlatError { kind: error_type, message };
            let error = match shape {
                ErrorShape::Nested => ErrorJson::Nested {
                    kind: "error",
                    error: flat,
                    request_id: format!("req_emu{:016x}", hash_of(&[batch_id, &item.custom_id])),
                },
                ErrorShape::Flat => ErrorJson::Flat(flat),
            };
            ResultJson::Errored { error }
        }
    };
    Line { custom_id: &item.custom_id, result }
}

/// The JSONL body of an ended batch's results: the first `n_ran` items ran, the others met `rest`; one line per
/// item, shuffled (deterministically from the batch id, never in request order for two items or more) unless
/// `shuffle` is off.
pub(crate) fn render_results(
    batch_id: &str,
    items: &[Item],
    n_ran: usize,
    rest: Fate,
    shuffle: bool,
    shape: ErrorShape,
) -> Vec<u8> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    if shuffle {
        response_order(batch_id, &mut order);
    }
    let mut body = Vec::with_capacity(items.len() * 256);
    for index in order {
        let fate = if index < n_ran { Fate::Ran } else { rest };
        // Writing plain structs into a `Vec` cannot fail.
        let _ = serde_json::to_writer(&mut body, &line(batch_id, &items[index], fate, shape));
        body.push(b'\n');
    }
    body
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn result_line(batch_id: &str, item: &Item, fate: Fate, shape: ErrorShape) -> Value {
        serde_json::to_value(line(batch_id, item, fate, shape)).expect("a line")
    }

    fn params(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => panic!("an object"),
        }
    }

    fn good() -> Value {
        json!({ "model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{ "role": "user", "content": "Hello there, world" }] })
    }

    #[test]
    fn a_good_item_gets_a_full_deterministic_message() {
        let first = run_item("a", &params(good()));
        assert_eq!(first, run_item("a", &params(good())), "the same item gives the same message");
        let Outcome::Succeeded(message) = first else { panic!("succeeded") };
        let message = serde_json::to_value(&message).expect("json");
        assert_eq!(message["type"], "message");
        assert_eq!(message["role"], "assistant");
        assert_eq!(message["model"], "claude-sonnet-4-5");
        assert_eq!(message["content"][0]["text"], "echo: Hello there, world");
        assert_eq!(message["stop_reason"], "end_turn");
        assert_eq!(message["usage"]["input_tokens"], 3);
        assert_eq!(message["usage"]["output_tokens"], 4);
        assert_eq!(message["usage"]["service_tier"], "batch");
    }

    #[test]
    fn max_tokens_cuts_the_text_and_cached_blocks_count_as_cache_reads() {
        let mut item = good();
        item["max_tokens"] = json!(2);
        item["system"] =
            json!([{ "type": "text", "text": "be brief please", "cache_control": { "type": "ephemeral" } }]);
        let Outcome::Succeeded(message) = run_item("a", &params(item)) else { panic!("succeeded") };
        let message = serde_json::to_value(&message).expect("json");
        assert_eq!(message["content"][0]["text"], "echo: Hello");
        assert_eq!(message["stop_reason"], "max_tokens");
        assert_eq!(message["usage"]["cache_read_input_tokens"], 3);
        assert_eq!(message["usage"]["input_tokens"], 3);
    }

    #[test]
    fn bad_params_are_errored_naming_the_field() {
        let cases = [
            ("model", json!(null)),
            ("max_tokens", json!(null)),
            ("max_tokens", json!(0)),
            ("messages", json!(null)),
            ("messages", json!([])),
            ("stream", json!(true)),
            ("speed", json!("fast")),
        ];
        for (field, value) in cases {
            let mut item = params(good());
            if value.is_null() {
                item.remove(field);
            } else {
                item.insert(field.to_owned(), value);
            }
            match run_item("a", &item) {
                Outcome::Errored { error_type, message } => {
                    assert_eq!(error_type, "invalid_request_error");
                    assert!(message.starts_with(field), "{message}");
                }
                Outcome::Succeeded(_) => panic!("{field} should be refused"),
            }
        }
    }

    #[test]
    fn results_are_shuffled_unless_asked_and_the_rest_meet_their_fate() {
        let items: Vec<Item> = (0..5)
            .map(|i| Item { custom_id: format!("c{i}"), outcome: run_item(&format!("c{i}"), &params(good())) })
            .collect();
        let ids = |body: &[u8]| -> Vec<(String, String)> {
            body.split(|&byte| byte == b'\n')
                .filter(|line| !line.is_empty())
                .map(|line| {
                    let line: Value = serde_json::from_slice(line).expect("json line");
                    (
                        line["custom_id"].as_str().unwrap().to_owned(),
                        line["result"]["type"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        };
        let ordered = ids(&render_results("b", &items, 2, Fate::Canceled, false, ErrorShape::Nested));
        let expected: Vec<(String, String)> = ["succeeded", "succeeded", "canceled", "canceled", "canceled"]
            .iter()
            .enumerate()
            .map(|(i, kind)| (format!("c{i}"), (*kind).to_owned()))
            .collect();
        assert_eq!(ordered, expected);
        let mut shuffled = ids(&render_results("b", &items, 2, Fate::Canceled, true, ErrorShape::Nested));
        assert_ne!(shuffled, expected);
        shuffled.sort();
        assert_eq!(shuffled, expected);
    }

    #[test]
    fn errored_lines_have_the_nested_or_the_flat_shape() {
        let item = Item {
            custom_id: "x".to_owned(),
            outcome: Outcome::Errored { error_type: "invalid_request_error", message: "m".to_owned() },
        };
        let nested = result_line("b", &item, Fate::Ran, ErrorShape::Nested);
        assert_eq!(nested["result"]["type"], "errored");
        assert_eq!(nested["result"]["error"]["type"], "error");
        assert_eq!(nested["result"]["error"]["error"], json!({ "type": "invalid_request_error", "message": "m" }));
        assert!(nested["result"]["error"]["request_id"].is_string());
        let flat = result_line("b", &item, Fate::Ran, ErrorShape::Flat);
        assert_eq!(flat["result"]["error"], json!({ "type": "invalid_request_error", "message": "m" }));
    }
}
