//! What the fake models answer, per endpoint, and the lines of a batch's output and error files.
//!
//! Bodies are deterministic (the same request gives the same body): a chat completion echoes the start of the last
//! message, an embedding is a unit vector seeded by its text. A request whose body the endpoint would refuse
//! (`messages` missing, `stream: true`, ...) fails alone with `status_code` 400 and the API's error body in the
//! error file. Only the outcome of each request is kept while a batch runs; bodies are written when its files are.

use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde_json::{Map, Value, json};

use crate::outputs::hash_of;

/// How many characters of the input a generated text echoes.
const ECHO_CHARS: usize = 40;

/// Length of an embedding when the body does not ask for `dimensions`.
pub(crate) const DEFAULT_EMBEDDING_DIM: usize = 8;

/// Largest `dimensions` honoured; larger asks get this many.
const MAX_EMBEDDING_DIM: usize = 4096;

/// The documented batch endpoints, each with the body it answers (the guide's seven and the API reference's
/// `/v1/videos`).
pub(crate) const ENDPOINTS: [&str; 8] = [
    "/v1/responses",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/completions",
    "/v1/moderations",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/videos",
];

/// Tokens one request used (words of its input and of the text generated).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Input (prompt) tokens.
    pub input_tokens: u64,
    /// Output (completion) tokens.
    pub output_tokens: u64,
}

/// How one request of a batch ends once it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// HTTP 200 with the endpoint's body.
    Success(Usage),
    /// HTTP 400: the body is not one the endpoint accepts.
    Invalid {
        /// `error.message` of the body.
        message: String,
        /// `error.param` of the body.
        param: String,
        /// `error.code` of the body.
        code: &'static str,
    },
    /// HTTP 500 (an injected per-item fault).
    ServerError,
}

impl Outcome {
    /// Whether the request lands in the output file (rather than the error file).
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Success(_))
    }
}

/// Why a request did not run: the `error.code` of its error-file line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotRun {
    /// The batch was cancelled first.
    Cancelled,
    /// The completion window ended first.
    Expired,
}

/// Judges one request body the way `endpoint` would, and counts its tokens.
pub(crate) fn judge(endpoint: &str, body: &Map<String, Value>) -> Outcome {
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        return invalid("'stream' is not supported in the Batch API.", "stream", "invalid_value");
    }
    let required = match endpoint {
        "/v1/chat/completions" => "messages",
        "/v1/completions" | "/v1/images/generations" | "/v1/images/edits" | "/v1/videos" => "prompt",
        _ => "input",
    };
    let present = match body.get(required) {
        Some(Value::String(text)) => required != "messages" && !text.is_empty(),
        Some(Value::Array(items)) => !items.is_empty(),
        _ => false,
    };
    if !present {
        return invalid(&format!("Missing required parameter: '{required}'."), required, "missing_required_parameter");
    }
    if endpoint == "/v1/images/edits" && !body.contains_key("image") {
        return invalid("Missing required parameter: 'image'.", "image", "missing_required_parameter");
    }
    let input = input_text(endpoint, body);
    let output_tokens = if generates_text(endpoint) { words(&echo(&input)) } else { 0 };
    Outcome::Success(Usage { input_tokens: words(&input).max(1), output_tokens })
}

fn invalid(message: &str, param: &str, code: &'static str) -> Outcome {
    Outcome::Invalid { message: message.to_owned(), param: param.to_owned(), code }
}

fn generates_text(endpoint: &str) -> bool {
    matches!(endpoint, "/v1/chat/completions" | "/v1/completions" | "/v1/responses")
}

fn words(text: &str) -> u64 {
    u64::try_from(text.split_ascii_whitespace().count()).unwrap_or(u64::MAX)
}

fn echo(input: &str) -> String {
    format!("echo: {}", input.chars().take(ECHO_CHARS).collect::<String>())
}

/// The text a request is about: the last chat message, the prompt, or the (first) input.
fn input_text(endpoint: &str, body: &Map<String, Value>) -> String {
    match endpoint {
        "/v1/chat/completions" => body
            .get("messages")
            .and_then(Value::as_array)
            .and_then(|messages| messages.last())
            .map_or_else(String::new, |message| message.get("content").map(content_text).unwrap_or_default()),
        "/v1/completions" | "/v1/images/generations" | "/v1/images/edits" | "/v1/videos" => {
            body.get("prompt").map(first_text).unwrap_or_default()
        }
        _ => body.get("input").map(first_text).unwrap_or_default(),
    }
}

/// A message's `content`: a string, or the `text` of its parts.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => {
            parts.iter().filter_map(|part| part.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join(" ")
        }
        _ => String::new(),
    }
}

/// A string, or the first element of an array (itself a string or a message with `content`).
fn first_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Array(items) => items.first().map_or_else(String::new, |item| match item {
            Value::String(text) => text.clone(),
            other => other.get("content").map(content_text).unwrap_or_default(),
        }),
        _ => String::new(),
    }
}

/// The texts of an `input` that is a string or an array (non-strings, such as token arrays, as their JSON).
fn input_texts(body: &Map<String, Value>) -> Vec<String> {
    match body.get("input") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            })
            .collect(),
        Some(Value::String(text)) => vec![text.clone()],
        _ => Vec::new(),
    }
}

/// What the context of one request is, to write its line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LineContext<'a> {
    /// The batch's id.
    pub batch_id: &'a str,
    /// The batch's endpoint.
    pub endpoint: &'a str,
    /// The batch's model.
    pub model: &'a str,
    /// Unix seconds written as the body's creation time.
    pub created: u64,
}

fn ids(context: LineContext<'_>, index: usize) -> (String, String) {
    let index = index.to_string();
    let line_id = format!("batch_req_{:016x}", hash_of(&[context.batch_id, &index, "line"]));
    let request_id = format!("req_{:016x}", hash_of(&[context.batch_id, &index, "request"]));
    (line_id, request_id)
}

/// The output- or error-file line of a request that ran.
pub(crate) fn ran_line(
    context: LineContext<'_>,
    index: usize,
    custom_id: &str,
    body: &Map<String, Value>,
    outcome: &Outcome,
) -> Value {
    let (line_id, request_id) = ids(context, index);
    let (status_code, response_body) = match outcome {
        Outcome::Success(usage) => (200, success_body(context, &request_id, body, *usage)),
        Outcome::Invalid { message, param, code } => (
            400,
            json!({ "error": { "message": message, "type": "invalid_request_error", "param": param, "code": code } }),
        ),
        Outcome::ServerError => (
            500,
            json!({ "error": {
                "message": "The server had an error processing your request. Sorry about that! You can retry your \
                            request.",
                "type": "server_error", "param": null, "code": null,
            } }),
        ),
    };
    json!({
        "id": line_id,
        "custom_id": custom_id,
        "response": { "status_code": status_code, "request_id": request_id, "body": response_body },
        "error": null,
    })
}

/// The error-file line of a request that never ran.
pub(crate) fn not_run_line(context: LineContext<'_>, index: usize, custom_id: &str, why: NotRun) -> Value {
    let (line_id, _) = ids(context, index);
    let (code, message) = match why {
        NotRun::Expired => {
            ("batch_expired", "This request could not be executed before the completion window expired.")
        }
        NotRun::Cancelled => ("batch_cancelled", "This request was not executed because the batch was cancelled."),
    };
    json!({ "id": line_id, "custom_id": custom_id, "response": null, "error": { "code": code, "message": message } })
}

fn success_body(context: LineContext<'_>, request_id: &str, body: &Map<String, Value>, usage: Usage) -> Value {
    let LineContext { endpoint, model, created, .. } = context;
    let text = echo(&input_text(endpoint, body));
    let suffix = &request_id["req_".len()..];
    let total = usage.input_tokens + usage.output_tokens;
    match endpoint {
        "/v1/chat/completions" => json!({
            "id": format!("chatcmpl-{suffix}"),
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": text, "refusal": null },
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": {
                "prompt_tokens": usage.input_tokens,
                "completion_tokens": usage.output_tokens,
                "total_tokens": total,
            },
            "system_fingerprint": null,
        }),
        "/v1/completions" => json!({
            "id": format!("cmpl-{suffix}"),
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{ "text": text, "index": 0, "logprobs": null, "finish_reason": "stop" }],
            "usage": {
                "prompt_tokens": usage.input_tokens,
                "completion_tokens": usage.output_tokens,
                "total_tokens": total,
            },
        }),
        "/v1/responses" => json!({
            "id": format!("resp_{suffix}"),
            "object": "response",
            "created_at": created,
            "status": "completed",
            "model": model,
            "output": [{
                "type": "message",
                "id": format!("msg_{suffix}"),
                "status": "completed",
                "role": "assistant",
                "content": [{ "type": "output_text", "text": text, "annotations": [] }],
            }],
            "usage": {
                "input_tokens": usage.input_tokens,
                "input_tokens_details": { "cached_tokens": 0 },
                "output_tokens": usage.output_tokens,
                "output_tokens_details": { "reasoning_tokens": 0 },
                "total_tokens": total,
            },
        }),
        "/v1/embeddings" => {
            let dim = body
                .get("dimensions")
                .and_then(Value::as_u64)
                .and_then(|dim| usize::try_from(dim).ok())
                .filter(|&dim| dim > 0)
                .map_or(DEFAULT_EMBEDDING_DIM, |dim| dim.min(MAX_EMBEDDING_DIM));
            let data: Vec<Value> = input_texts(body)
                .iter()
                .enumerate()
                .map(
                    |(index, text)| json!({ "object": "embedding", "index": index, "embedding": embedding(text, dim) }),
                )
                .collect();
            json!({
                "object": "list",
                "data": data,
                "model": model,
                "usage": { "prompt_tokens": usage.input_tokens, "total_tokens": usage.input_tokens },
            })
        }
        "/v1/moderations" => {
            let results: Vec<Value> = input_texts(body).iter().map(|_| moderation_result()).collect();
            json!({ "id": format!("modr-{suffix}"), "model": model, "results": results })
        }
        // A video job, as the Videos API answers its create: the job, not the video.
        "/v1/videos" => json!({
            "id": format!("video_{suffix}"),
            "object": "video",
            "created_at": created,
            "status": "queued",
            "model": model,
            "progress": 0,
            "prompt": text,
        }),
        // Images: a tiny fixed payload.
        _ => json!({ "created": created, "data": [{ "b64_json": "ZW11bGF0b3I=", "revised_prompt": text }] }),
    }
}

fn moderation_result() -> Value {
    let categories = ["harassment", "hate", "self-harm", "sexual", "violence"];
    let flags: Map<String, Value> = categories.iter().map(|name| ((*name).to_owned(), json!(false))).collect();
    let scores: Map<String, Value> = categories.iter().map(|name| ((*name).to_owned(), json!(0.0001))).collect();
    json!({ "flagged": false, "categories": flags, "category_scores": scores })
}

/// A unit-length vector derived from the text alone.
fn embedding(text: &str, dim: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(hash_of(&[text]));
    let raw: Vec<f64> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
    let norm = raw.iter().map(|x| x * x).sum::<f64>().sqrt().max(f64::MIN_POSITIVE);
    raw.iter().map(|x| (x / norm) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    const CONTEXT: LineContext<'static> =
        LineContext { batch_id: "batch_1", endpoint: "/v1/chat/completions", model: "gpt-4o-mini", created: 7 };

    #[test]
    fn a_chat_body_is_a_chat_completion_with_usage() {
        let request = body(json!({ "model": "m", "messages": [{ "role": "user", "content": "hello there" }] }));
        let outcome = judge("/v1/chat/completions", &request);
        assert_eq!(outcome, Outcome::Success(Usage { input_tokens: 2, output_tokens: 3 }));
        let line = ran_line(CONTEXT, 0, "a", &request, &outcome);
        assert_eq!(line["custom_id"], "a");
        assert_eq!(line["error"], Value::Null);
        assert_eq!(line["response"]["status_code"], 200);
        let completion = &line["response"]["body"];
        assert_eq!(completion["object"], "chat.completion");
        assert_eq!(completion["choices"][0]["message"]["content"], "echo: hello there");
        assert_eq!(completion["usage"]["total_tokens"], 5);
        assert_eq!(line, ran_line(CONTEXT, 0, "a", &request, &outcome), "deterministic");
    }

    #[test]
    fn bodies_an_endpoint_refuses_fail_alone_with_400() {
        let cases = [
            ("/v1/chat/completions", json!({ "model": "m" }), "messages"),
            ("/v1/chat/completions", json!({ "model": "m", "messages": [] }), "messages"),
            ("/v1/embeddings", json!({ "model": "m", "input": [] }), "input"),
            ("/v1/responses", json!({ "model": "m", "input": "x", "stream": true }), "stream"),
            ("/v1/completions", json!({ "model": "m" }), "prompt"),
        ];
        for (endpoint, request, param) in cases {
            let outcome = judge(endpoint, &body(request));
            let Outcome::Invalid { param: found, .. } = &outcome else { panic!("{endpoint}: {outcome:?}") };
            assert_eq!(found, param);
            let line = ran_line(CONTEXT, 1, "b", &Map::new(), &outcome);
            assert_eq!(line["response"]["status_code"], 400);
            assert_eq!(line["response"]["body"]["error"]["type"], "invalid_request_error");
        }
    }

    #[test]
    fn embeddings_have_one_unit_vector_per_input() {
        let request = body(json!({ "model": "e", "input": ["a b", "c"], "dimensions": 4 }));
        let outcome = judge("/v1/embeddings", &request);
        let context = LineContext { endpoint: "/v1/embeddings", ..CONTEXT };
        let list = ran_line(context, 0, "e", &request, &outcome)["response"]["body"].clone();
        assert_eq!(list["object"], "list");
        let data = list["data"].as_array().expect("data");
        assert_eq!(data.len(), 2);
        let vector: Vec<f64> =
            data[1]["embedding"].as_array().expect("vector").iter().filter_map(Value::as_f64).collect();
        assert_eq!(vector.len(), 4);
        assert!((vector.iter().map(|x| x * x).sum::<f64>() - 1.0).abs() < 1e-4);
    }

    #[test]
    fn completions_moderations_and_images_have_their_objects() {
        let request = body(json!({ "model": "gpt-3.5-turbo-instruct", "prompt": "once upon" }));
        let context = LineContext { endpoint: "/v1/completions", ..CONTEXT };
        let completion = ran_line(context, 0, "c", &request, &judge("/v1/completions", &request));
        assert_eq!(completion["response"]["body"]["object"], "text_completion");
        assert_eq!(completion["response"]["body"]["choices"][0]["text"], "echo: once upon");

        let request = body(json!({ "model": "omni-moderation-latest", "input": ["a", "b"] }));
        let context = LineContext { endpoint: "/v1/moderations", ..CONTEXT };
        let moderation = ran_line(context, 0, "m", &request, &judge("/v1/moderations", &request));
        let results = moderation["response"]["body"]["results"].as_array().expect("results").clone();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["flagged"], false);

        let request = body(json!({ "model": "gpt-image-1", "prompt": "a cat" }));
        let context = LineContext { endpoint: "/v1/images/generations", ..CONTEXT };
        let image = ran_line(context, 0, "i", &request, &judge("/v1/images/generations", &request));
        assert!(image["response"]["body"]["data"][0]["b64_json"].is_string());
        assert!(matches!(judge("/v1/images/edits", &request), Outcome::Invalid { .. }), "an edit needs an image");
    }

    #[test]
    fn not_run_lines_carry_the_documented_codes() {
        let line = not_run_line(CONTEXT, 2, "c", NotRun::Expired);
        assert_eq!(line["response"], Value::Null);
        assert_eq!(line["error"]["code"], "batch_expired");
        assert_eq!(
            line["error"]["message"],
            "This request could not be executed before the completion window expired."
        );
        assert_eq!(not_run_line(CONTEXT, 2, "c", NotRun::Cancelled)["error"]["code"], "batch_cancelled");
    }
}
