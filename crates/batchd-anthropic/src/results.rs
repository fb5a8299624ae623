//! Joins the result lines of a batch (JSONL, in any order) into one response per request, in request order:
//! `succeeded` → the `message`, `errored` → `success:false` with the error's type and message (nested or flat
//! shape), `canceled`/`expired` → not run, missing → `missing`. Lines are read one at a time and leniently: a line
//! that is not a result, names a request of another chunk or repeats one is counted and skipped, never trusted.

use batchd_core::{ItemResponse, JobOutput};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::wire::ChunkMark;

/// Longest error message kept from a result line, in characters.
const MAX_MESSAGE_CHARS: usize = 1000;

/// Longest error type kept, in characters.
const MAX_TYPE_CHARS: usize = 64;

/// One result line.
#[derive(Deserialize)]
struct Line {
    /// batchd's custom id.
    custom_id: String,
    /// The outcome.
    result: Outcome,
}

/// A line's `result`.
#[derive(Deserialize)]
struct Outcome {
    /// `succeeded`, `errored`, `canceled` or `expired`.
    #[serde(rename = "type")]
    kind: String,
    /// The Message of a succeeded request.
    #[serde(default)]
    message: Option<Box<RawValue>>,
    /// The error of an errored request.
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// Only the usage of a Message.
#[derive(Deserialize)]
struct MessageUsage {
    /// `{input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens, ...}`.
    #[serde(default)]
    usage: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The lines read so far, and what was wrong with the others.
#[derive(Debug)]
pub struct Join {
    /// Which chunk's custom ids are ours.
    mark: ChunkMark,
    /// One slot per request.
    slots: Vec<Option<ItemResponse>>,
    /// Summed token counts of succeeded requests.
    usage: serde_json::Map<String, serde_json::Value>,
    /// Counts of lines skipped, by reason.
    pub skipped: Skipped,
}

/// Lines that did not become a response.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Skipped {
    /// Not a result line.
    pub unreadable: usize,
    /// A custom id of another chunk, or none batchd writes.
    pub foreign: usize,
    /// A second line for the same request (the first is kept).
    pub duplicate: usize,
    /// An index past the chunk's end.
    pub out_of_range: usize,
}

/// The batch's lines all belong to another chunk: it is not this chunk's batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignBatch {
    /// Lines of another chunk.
    pub foreign: usize,
}

impl Join {
    /// A join for a chunk of `n_items` requests marked `mark`.
    pub fn new(mark: ChunkMark, n_items: usize) -> Self {
        Self { mark, slots: vec![None; n_items], usage: serde_json::Map::new(), skipped: Skipped::default() }
    }

    /// Reads one line (without its newline); blank lines are ignored.
    pub fn add_line(&mut self, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let Ok(line) = serde_json::from_slice::<Line>(line) else {
            self.skipped.unreadable += 1;
            return;
        };
        let Some(index) = self.mark.index_of(&line.custom_id) else {
            self.skipped.foreign += 1;
            return;
        };
        let Some(slot) = self.slots.get_mut(index) else {
            self.skipped.out_of_range += 1;
            return;
        };
        if slot.is_some() {
            self.skipped.duplicate += 1;
            return;
        }
        let response = match (line.result.kind.as_str(), line.result.message) {
            ("succeeded", Some(message)) => {
                if let Ok(MessageUsage { usage: Some(usage) }) = serde_json::from_str(message.get()) {
                    add_usage(&mut self.usage, usage);
                }
                ItemResponse {
                    index,
                    success: true,
                    result: Some(message),
                    error: None,
                    external_reference: None,
                    resent: false,
                }
            }
            ("succeeded", None) => failure(index, "missing", "the result says succeeded but carries no message"),
            ("errored", _) => {
                let (kind, message) = read_error(line.result.error.as_ref());
                failure(index, &kind, &message)
            }
            ("canceled", _) => failure(index, "canceled", "not run: the batch was canceled before this request ran"),
            ("expired", _) => failure(
                index,
                "expired",
                "not run: the batch expired (24 hours after it was created) before this request ran",
            ),
            (other, _) => failure(
                index,
                "unknown_result",
                &format!("a result of undocumented type {}", capped(other, MAX_TYPE_CHARS)),
            ),
        };
        *slot = Some(response);
    }

    /// Every request answered, in order (missing ones `success:false` with code `missing`), and the summed usage;
    /// or [`ForeignBatch`] when not one line was this chunk's and some were another's.
    pub fn finish(self) -> Result<JobOutput, ForeignBatch> {
        let n_ours = self.slots.iter().filter(|slot| slot.is_some()).count();
        if n_ours == 0 && self.skipped.foreign > 0 {
            return Err(ForeignBatch { foreign: self.skipped.foreign });
        }
        let responses = self
            .slots
            .into_iter()
            .enumerate()
            .map(|(index, slot)| {
                slot.unwrap_or_else(|| {
                    failure(index, "missing", "the Message Batches API returned no result for this request")
                })
            })
            .collect();
        Ok(JobOutput { responses, usage: serde_json::Value::Object(self.usage), failed_batches: Vec::new() })
    }
}

/// The error type and message of an `errored` result: the documented nested shape
/// `{"type":"error","error":{"type","message"}}` or the flat `{"type","message"}`.
fn read_error(error: Option<&serde_json::Value>) -> (String, String) {
    let text = |value: Option<&serde_json::Value>| value.and_then(serde_json::Value::as_str).map(str::to_owned);
    let Some(error) = error else {
        return ("unknown_error".to_owned(), "the result is errored without an error".to_owned());
    };
    let inner = error.get("error").filter(|inner| inner.is_object()).unwrap_or(error);
    let kind = text(inner.get("type")).filter(|kind| kind != "error").unwrap_or_else(|| "unknown_error".to_owned());
    let message = text(inner.get("message")).unwrap_or_default();
    (capped(&kind, MAX_TYPE_CHARS), capped(&message, MAX_MESSAGE_CHARS))
}

/// A failed response with `{"code","message"}`, the shape every provider's failed items have.
fn failure(index: usize, code: &str, message: &str) -> ItemResponse {
    let text = serde_json::json!({"code": code, "message": message}).to_string();
    ItemResponse::failure(index, RawValue::from_string(text).ok())
}

/// At most `max` characters of `text`, control characters dropped.
fn capped(text: &str, max: usize) -> String {
    text.chars().filter(|c| !c.is_control()).take(max).collect()
}

/// Adds the numeric members of a Message's `usage` (input, output and cache tokens) to the total.
fn add_usage(
    total: &mut serde_json::Map<String, serde_json::Value>,
    usage: serde_json::Map<String, serde_json::Value>,
) {
    for (name, value) in usage {
        let Some(more) = value.as_u64() else { continue };
        let sum = total.get(&name).and_then(serde_json::Value::as_u64).unwrap_or(0).saturating_add(more);
        total.insert(name, sum.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark() -> ChunkMark {
        ChunkMark::new("0000000000000001", 0)
    }

    fn succeeded(custom_id: &str, text: &str, input: u64) -> String {
        format!(
            r#"{{"custom_id":"{custom_id}","result":{{"type":"succeeded","message":{{"id":"msg","content":[{{"type":"text","text":"{text}"}}],"usage":{{"input_tokens":{input},"output_tokens":2,"cache_read_input_tokens":1,"service_tier":"batch"}}}}}}}}"#
        )
    }

    fn error_of(output: &JobOutput, index: usize) -> serde_json::Value {
        serde_json::from_str(output.responses[index].error.as_ref().expect("error").get()).expect("json")
    }

    #[test]
    fn shuffled_lines_come_back_in_request_order_with_usage_summed() {
        let mark = mark();
        let mut join = Join::new(mark.clone(), 3);
        for index in [2, 0, 1] {
            join.add_line(succeeded(&mark.custom_id(1, index), &format!("t{index}"), 10).as_bytes());
        }
        let output = join.finish().expect("ours");
        for (index, response) in output.responses.iter().enumerate() {
            assert_eq!(response.index, index);
            assert!(response.success);
            assert!(response.result.as_ref().expect("message").get().contains(&format!("t{index}")));
        }
        assert_eq!(
            output.usage,
            serde_json::json!({"input_tokens": 30, "output_tokens": 6, "cache_read_input_tokens": 3})
        );
    }

    #[test]
    fn errored_results_in_both_shapes_and_unrun_requests_are_failures() {
        let mark = mark();
        let mut join = Join::new(mark.clone(), 5);
        let nested = r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"},"request_id":"req_1"}"#;
        let flat = r#"{"type":"overloaded_error","message":"Overloaded"}"#;
        join.add_line(
            format!(r#"{{"custom_id":"{}","result":{{"type":"errored","error":{nested}}}}}"#, mark.custom_id(1, 0))
                .as_bytes(),
        );
        join.add_line(
            format!(r#"{{"custom_id":"{}","result":{{"type":"errored","error":{flat}}}}}"#, mark.custom_id(1, 1))
                .as_bytes(),
        );
        join.add_line(
            format!(r#"{{"custom_id":"{}","result":{{"type":"canceled"}}}}"#, mark.custom_id(1, 2)).as_bytes(),
        );
        join.add_line(
            format!(r#"{{"custom_id":"{}","result":{{"type":"expired"}}}}"#, mark.custom_id(2, 3)).as_bytes(),
        );
        let output = join.finish().expect("ours");
        assert!(output.responses.iter().all(|response| !response.success));
        assert_eq!(
            error_of(&output, 0),
            serde_json::json!({"code": "invalid_request_error", "message": "max_tokens: Field required"})
        );
        assert_eq!(error_of(&output, 1), serde_json::json!({"code": "overloaded_error", "message": "Overloaded"}));
        assert_eq!(error_of(&output, 2)["code"], "canceled");
        assert_eq!(error_of(&output, 3)["code"], "expired", "any attempt of the chunk is ours");
        assert_eq!(error_of(&output, 4)["code"], "missing");
        assert_eq!(output.usage, serde_json::json!({}));
    }

    #[test]
    fn hostile_duplicated_and_foreign_lines_are_skipped_and_counted() {
        let mark = mark();
        let other = ChunkMark::new("0000000000000001", 1);
        let mut join = Join::new(mark.clone(), 2);
        join.add_line(succeeded(&mark.custom_id(1, 0), "first", 1).as_bytes());
        join.add_line(succeeded(&mark.custom_id(1, 0), "second", 1).as_bytes());
        join.add_line(succeeded(&mark.custom_id(1, 7), "past the end", 1).as_bytes());
        join.add_line(succeeded(&other.custom_id(1, 1), "another chunk", 1).as_bytes());
        for hostile in [
            &b"not json"[..],
            br#"{"custom_id":7,"result":{"type":"succeeded"}}"#,
            br#"{"custom_id":"x"}"#,
            br#"[]"#,
            b"\xff\xfe",
        ] {
            join.add_line(hostile);
        }
        join.add_line(b"   ");
        let long = format!(
            r#"{{"custom_id":"{}","result":{{"type":"errored","error":{{"type":"{}","message":"{}\u0007"}}}}}}"#,
            mark.custom_id(1, 1),
            "t".repeat(500),
            "m".repeat(5000)
        );
        join.add_line(long.as_bytes());
        assert_eq!(join.skipped, Skipped { unreadable: 5, foreign: 1, duplicate: 1, out_of_range: 1 });
        let output = join.finish().expect("ours");
        assert!(output.responses[0].result.as_ref().expect("message").get().contains("first"));
        let error = error_of(&output, 1);
        assert_eq!(error["code"].as_str().expect("code").len(), MAX_TYPE_CHARS);
        assert_eq!(error["message"].as_str().expect("message").len(), MAX_MESSAGE_CHARS, "capped, bell dropped");
        let undocumented = format!(r#"{{"custom_id":"{}","result":{{"type":"paused"}}}}"#, mark.custom_id(1, 0));
        let mut join = Join::new(mark.clone(), 1);
        join.add_line(undocumented.as_bytes());
        assert_eq!(error_of(&join.finish().expect("ours"), 0)["code"], "unknown_result");
    }

    #[test]
    fn a_batch_of_another_chunk_is_recognised() {
        let other = ChunkMark::new("0000000000000002", 0);
        let mut join = Join::new(mark(), 2);
        join.add_line(succeeded(&other.custom_id(1, 0), "x", 1).as_bytes());
        join.add_line(succeeded(&other.custom_id(1, 1), "y", 1).as_bytes());
        assert_eq!(join.finish().expect_err("foreign"), ForeignBatch { foreign: 2 });
        let empty = Join::new(mark(), 1).finish().expect("an empty reply is missing items, not a foreign batch");
        assert_eq!(empty.n_failed(), 1);
    }
}
