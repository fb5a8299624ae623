//! Validation of a batch's input file, as the `validating` state does it: every failure becomes an entry of the
//! batch's `errors.data` with the 1-based line it was found on.
//!
//! The checks and their codes: the line count first (no line is parsed when there are too many), then per line
//! JSON (`invalid_json_line`), `custom_id` (`missing_required_parameter`, `duplicate_custom_id`), `method`
//! (`invalid_method`), `url` (`url_mismatch`), `body.model` (`missing_required_parameter`, `model_mismatch`), and
//! last the embeddings input total (`too_many_tasks`). `invalid_json_line`, `duplicate_custom_id`, `url_mismatch`,
//! `model_mismatch`, `empty_file` and `too_many_tasks` are the codes users report; the others are this emulator's.

use std::collections::HashSet;

use serde::Serialize;
use serde_json::{Map, Value};

/// At most this many errors are reported for one file; validation stops there.
pub(crate) const MAX_ERRORS: usize = 100;

/// One entry of a failed batch's `errors.data`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct BatchError {
    /// Machine-readable code (`invalid_json_line`, `token_limit_exceeded`, ...).
    pub code: String,
    /// What is wrong.
    pub message: String,
    /// The parameter at fault, when one is.
    pub param: Option<String>,
    /// The 1-based line of the input file, when the error is about one line.
    pub line: Option<usize>,
}

impl BatchError {
    pub fn new(code: &str, message: impl Into<String>, param: Option<&str>, line: Option<usize>) -> Self {
        Self { code: code.to_owned(), message: message.into(), param: param.map(str::to_owned), line }
    }
}

/// The caps validation enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InputCaps {
    /// Most requests (lines) in one file.
    pub max_lines: usize,
    /// Most embedding inputs in one `/v1/embeddings` file, summed over its lines.
    pub max_embedding_inputs: usize,
}

/// One valid input line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct InputLine {
    /// The line's `custom_id`.
    pub custom_id: String,
    /// The line's `body`, the endpoint's request body.
    pub body: Map<String, Value>,
}

/// A file that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ValidInput {
    /// The one model every line names.
    pub model: String,
    /// The lines, in file order.
    pub lines: Vec<InputLine>,
}

/// Validates `content` (the input file) for a batch of `endpoint`.
pub(crate) fn validate(content: &[u8], endpoint: &str, caps: InputCaps) -> Result<ValidInput, Vec<BatchError>> {
    let raw_lines = split_lines(content);
    if raw_lines.is_empty() {
        return Err(vec![BatchError::new("empty_file", "The input file is empty.", None, None)]);
    }
    if raw_lines.len() > caps.max_lines {
        let message = format!(
            "The batch input file has {} requests; the maximum is {} requests per batch.",
            raw_lines.len(),
            caps.max_lines
        );
        return Err(vec![BatchError::new("too_many_tasks", message, None, None)]);
    }

    let mut errors = Vec::new();
    let mut lines = Vec::with_capacity(raw_lines.len());
    let mut seen = HashSet::with_capacity(raw_lines.len());
    let mut model: Option<String> = None;
    for (index, raw) in raw_lines.iter().enumerate() {
        if errors.len() >= MAX_ERRORS {
            break;
        }
        let number = index + 1;
        match check_line(raw, endpoint, &mut seen, &mut model, number) {
            Ok(line) => lines.push(line),
            Err(error) => errors.push(error),
        }
    }
    if errors.is_empty() && endpoint == "/v1/embeddings" {
        let n_inputs: usize = lines.iter().map(|line| embedding_inputs(&line.body)).sum();
        if n_inputs > caps.max_embedding_inputs {
            let message = format!(
                "The batch has {n_inputs} embedding inputs in total; the maximum is {} per batch.",
                caps.max_embedding_inputs
            );
            errors.push(BatchError::new("too_many_tasks", message, None, None));
        }
    }
    match model {
        Some(model) if errors.is_empty() => Ok(ValidInput { model, lines }),
        _ => Err(errors),
    }
}

/// The lines of a JSONL file: split on `\n`, without the empty piece after a final newline.
fn split_lines(content: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = content.split(|&byte| byte == b'\n').collect();
    if lines.last().is_some_and(|last| last.is_empty()) {
        lines.pop();
    }
    lines
}

fn check_line(
    raw: &[u8],
    endpoint: &str,
    seen: &mut HashSet<String>,
    model: &mut Option<String>,
    number: usize,
) -> Result<InputLine, BatchError> {
    let error = |code: &str, message: &str, param: Option<&str>| BatchError::new(code, message, param, Some(number));
    let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(raw) else {
        return Err(error("invalid_json_line", "This line is not parseable as valid JSON.", None));
    };
    let Some(Value::String(custom_id)) = object.remove("custom_id") else {
        return Err(error("missing_required_parameter", "Missing required parameter: 'custom_id'.", Some("custom_id")));
    };
    if !seen.insert(custom_id.clone()) {
        return Err(error(
            "duplicate_custom_id",
            "The custom_id for this request is a duplicate of another request. The custom_id parameter must be \
             unique for each request in a batch.",
            Some("custom_id"),
        ));
    }
    if object.get("method").and_then(Value::as_str) != Some("POST") {
        return Err(error("invalid_method", "The method of this request must be 'POST'.", Some("method")));
    }
    if object.get("url").and_then(Value::as_str) != Some(endpoint) {
        return Err(error(
            "url_mismatch",
            "The URL provided for this request does not match the batch endpoint.",
            Some("url"),
        ));
    }
    let Some(Value::Object(body)) = object.remove("body") else {
        return Err(error("missing_required_parameter", "Missing required parameter: 'body'.", Some("body")));
    };
    let Some(line_model) = body.get("model").and_then(Value::as_str) else {
        return Err(error(
            "missing_required_parameter",
            "Missing required parameter: 'body.model'.",
            Some("body.model"),
        ));
    };
    match model {
        Some(first) if first != line_model => {
            return Err(error(
                "model_mismatch",
                "The provided model does not match the model of the other requests in this batch; each input \
                 file can only include requests to a single model.",
                Some("body.model"),
            ));
        }
        Some(_) => {}
        None => *model = Some(line_model.to_owned()),
    }
    Ok(InputLine { custom_id, body })
}

/// The number of inputs an embeddings body asks for: 1 for a string, the length of an array.
pub(crate) fn embedding_inputs(body: &Map<String, Value>) -> usize {
    match body.get("input") {
        Some(Value::Array(inputs)) => inputs.len(),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: InputCaps = InputCaps { max_lines: 50_000, max_embedding_inputs: 50_000 };
    const CHAT: &str = "/v1/chat/completions";

    fn line(custom_id: &str, model: &str) -> String {
        format!(
            r#"{{"custom_id":"{custom_id}","method":"POST","url":"{CHAT}","body":{{"model":"{model}","messages":[]}}}}"#
        )
    }

    fn codes_and_lines(result: Result<ValidInput, Vec<BatchError>>) -> Vec<(String, Option<usize>)> {
        result.expect_err("invalid").into_iter().map(|error| (error.code, error.line)).collect()
    }

    #[test]
    fn a_valid_file_keeps_its_lines_in_order() {
        let content = format!("{}\n{}\n", line("a", "m"), line("b", "m"));
        let valid = validate(content.as_bytes(), CHAT, CAPS).expect("valid");
        assert_eq!(valid.model, "m");
        let ids: Vec<&str> = valid.lines.iter().map(|line| line.custom_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
    }

    #[test]
    fn each_failure_names_its_line() {
        let content = [
            line("a", "m"),
            "not json".to_owned(),
            line("a", "m"),
            line("c", "other"),
            line("d", "m").replace("POST", "GET"),
            line("e", "m").replace(CHAT, "/v1/embeddings"),
            r#"{"method":"POST"}"#.to_owned(),
            r#"{"custom_id":"h","method":"POST","url":"/v1/chat/completions","body":{}}"#.to_owned(),
            String::new(),
            line("i", "m"),
        ]
        .join("\n");
        let found = codes_and_lines(validate(content.as_bytes(), CHAT, CAPS));
        let expected = [
            ("invalid_json_line", 2),
            ("duplicate_custom_id", 3),
            ("model_mismatch", 4),
            ("invalid_method", 5),
            ("url_mismatch", 6),
            ("missing_required_parameter", 7),
            ("missing_required_parameter", 8),
            ("invalid_json_line", 9),
        ];
        let expected: Vec<(String, Option<usize>)> =
            expected.iter().map(|(code, line)| ((*code).to_owned(), Some(*line))).collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn counts_are_checked_before_lines_are_read() {
        let caps = InputCaps { max_lines: 2, max_embedding_inputs: 3 };
        let content = "x\ny\nz\n";
        assert_eq!(codes_and_lines(validate(content.as_bytes(), CHAT, caps)), [("too_many_tasks".to_owned(), None)]);
        assert_eq!(codes_and_lines(validate(b"", CHAT, caps)), [("empty_file".to_owned(), None)]);
        let embeddings = [r#"["a","b"]"#, r#"["c","d"]"#]
            .iter()
            .enumerate()
            .map(|(i, input)| {
                format!(r#"{{"custom_id":"{i}","method":"POST","url":"/v1/embeddings","body":{{"model":"e","input":{input}}}}}"#)
            })
            .collect::<Vec<_>>()
            .join("\n");
        let found = codes_and_lines(validate(embeddings.as_bytes(), "/v1/embeddings", caps));
        assert_eq!(found, [("too_many_tasks".to_owned(), None)]);
    }

    #[test]
    fn errors_are_capped() {
        let content = "x\n".repeat(MAX_ERRORS * 2);
        assert_eq!(validate(content.as_bytes(), CHAT, CAPS).expect_err("invalid").len(), MAX_ERRORS);
    }
}
