//! Deterministic fake model outputs, one per request item, by model family.
//!
//! The same item always gives the same result, so tests can compare a result with the input it came from.
//! Embeddings are kept as one seed per text and generated only when a poll serializes them: a batch of
//! 1,000 bge-small items would otherwise hold 384,000 JSON numbers (about 12 MB) until the process stops.

use std::hash::{DefaultHasher, Hash, Hasher};

use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde::{Serialize, Serializer, ser::SerializeMap, ser::SerializeSeq};
use serde_json::{Map, Value, json};

use crate::config::Family;

/// Dimension of bge-m3 embeddings.
const BGE_M3_DIM: usize = 1024;

/// How many characters of the prompt a text-generation result echoes.
const ECHO_CHARS: usize = 40;

/// The result of one item that fits its model's schema.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ItemOutput {
    /// The inner `result` object of the response item.
    pub result: ItemResult,
    /// Tokens counted for the input (words, roughly).
    pub prompt_tokens: u64,
    /// Tokens counted for the output (words of generated text, 0 for embeddings).
    pub completion_tokens: u64,
}

/// Runs the fake model of `family` on one item; `Err` says why the item does not fit the model's schema.
pub(crate) fn run_item(model: &str, family: Family, item: &Map<String, Value>) -> Result<ItemOutput, SchemaError> {
    match family {
        Family::TextGeneration => text_generation(model, item),
        Family::Embeddings { dim } => embeddings(item, dim),
        Family::BgeM3 => {
            if item.contains_key("query") || item.contains_key("contexts") {
                rerank(item)
            } else {
                embeddings(item, BGE_M3_DIM)
            }
        }
        Family::Translation => translation(item),
        Family::Speech => speech(item),
    }
}

/// The inner `result` of a response item, as stored until a poll serializes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ItemResult {
    /// A small result, kept as JSON.
    Json(Value),
    /// `{"shape":[n,dim],"data":[[..]]}`, generated when serialized from one seed per text.
    Embeddings {
        /// Length of each vector.
        dim: usize,
        /// Seed of each text's vector, in the order of the texts.
        seeds: Vec<u64>,
    },
}

impl ItemResult {
    /// The result as a JSON value (materializes embeddings; for tests and small results).
    #[cfg(test)]
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl Serialize for ItemResult {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ItemResult::Json(value) => value.serialize(serializer),
            ItemResult::Embeddings { dim, seeds } => {
                let mut map = serializer.serialize_map(Some(2))?;
                map.serialize_entry("shape", &[seeds.len(), *dim])?;
                map.serialize_entry("data", &Vectors { dim: *dim, seeds })?;
                map.end()
            }
        }
    }
}

/// The `data` of an embeddings result: one vector per seed, generated while serializing.
struct Vectors<'a> {
    /// Length of each vector.
    dim: usize,
    /// One seed per vector.
    seeds: &'a [u64],
}

impl Serialize for Vectors<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut rows = serializer.serialize_seq(Some(self.seeds.len()))?;
        for &seed in self.seeds {
            rows.serialize_element(&embedding_of_seed(seed, self.dim))?;
        }
        rows.end()
    }
}

/// Why an item does not fit its model's schema. One detail feeds both messages: the item's own error in a
/// completion, and the refusal of the whole submit in strict mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SchemaError {
    /// What is wrong with the item, e.g. `expected prompt or messages`.
    pub detail: String,
}

impl SchemaError {
    /// Message of the item's `error` in a completion (code 5004).
    pub fn item_message(&self) -> String {
        format!("Invalid data: oneOf at '/' not met ({})", self.detail)
    }

    /// Message of a strict-mode refusal of a whole submit whose first bad item is `index`, worded like the live
    /// API's in `form` (`oneOf at '/requests/3' not met`, `anyOf at '/' not met`, ...).
    pub fn submit_message(&self, index: usize, form: crate::config::RefusalForm) -> String {
        let keyword = match form.keyword {
            crate::config::SchemaKeyword::OneOf => "oneOf",
            crate::config::SchemaKeyword::AnyOf => "anyOf",
        };
        let at = if form.pointer { format!("/requests/{index}") } else { "/".to_owned() };
        format!("AiError: Bad input: Error: {keyword} at '{at}' not met, 0 matches: {}", self.detail)
    }
}

fn schema_error(detail: &str) -> SchemaError {
    SchemaError { detail: detail.to_owned() }
}

/// Words separated by ASCII whitespace: the token count of the usage block.
///
/// A plain byte loop: `split_whitespace` decodes chars and, unoptimized (this crate builds at opt-level 0 in
/// tests), takes about 0.2 s for a 9.5 MB body, against 0.05 s for this.
fn count_words(text: &str) -> u64 {
    let mut words = 0;
    let mut in_word = false;
    for &byte in text.as_bytes() {
        let is_space = byte.is_ascii_whitespace();
        if !is_space && !in_word {
            words += 1;
        }
        in_word = !is_space;
    }
    words
}

fn text_generation(model: &str, item: &Map<String, Value>) -> Result<ItemOutput, SchemaError> {
    // gpt-oss models take the Responses-style `input` only; a `messages` item is refused live.
    let takes_input_only = model.contains("gpt-oss");
    let prompt = if takes_input_only {
        item.get("input").and_then(text_of_input).ok_or_else(|| schema_error("expected input"))?
    } else if let Some(prompt) = item.get("prompt") {
        prompt.as_str().map(str::to_owned).ok_or_else(|| schema_error("prompt must be a string"))?
    } else if let Some(messages) = item.get("messages") {
        text_of_messages(messages).ok_or_else(|| schema_error("messages must be a non-empty array of messages"))?
    } else if let Some(input) = item.get("input") {
        text_of_input(input).ok_or_else(|| schema_error("expected prompt, messages or input"))?
    } else {
        return Err(schema_error("expected prompt or messages"));
    };
    let echoed: String = prompt.chars().take(ECHO_CHARS).collect();
    let response = format!("echo: {echoed}");
    Ok(ItemOutput {
        prompt_tokens: count_words(&prompt),
        completion_tokens: count_words(&response),
        result: ItemResult::Json(json!({ "response": response })),
    })
}

/// The text of a chat: the content of the last message, or `None` when not a non-empty list of messages.
fn text_of_messages(messages: &Value) -> Option<String> {
    let messages = messages.as_array().filter(|messages| !messages.is_empty())?;
    let mut texts = Vec::with_capacity(messages.len());
    for message in messages {
        texts.push(text_of_content(message.as_object()?.get("content")?)?);
    }
    texts.pop()
}

/// A message content: a string, or a list of parts with `text`.
fn text_of_content(content: &Value) -> Option<String> {
    match content {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts.iter().filter_map(|part| part.get("text").and_then(Value::as_str)).collect();
            Some(texts.join(" "))
        }
        _ => None,
    }
}

/// A Responses-style `input`: a string or a list of messages.
fn text_of_input(input: &Value) -> Option<String> {
    match input {
        Value::String(text) => Some(text.clone()),
        Value::Array(_) => text_of_messages(input),
        _ => None,
    }
}

/// The `text` field of an embeddings item: one string or a non-empty list of strings.
fn texts_of(item: &Map<String, Value>) -> Result<Vec<&str>, SchemaError> {
    match item.get("text") {
        Some(Value::String(text)) => Ok(vec![text.as_str()]),
        Some(Value::Array(texts)) if !texts.is_empty() => texts
            .iter()
            .map(Value::as_str)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| schema_error("text must be a string or a list of strings")),
        _ => Err(schema_error("text must be a string or a non-empty list of strings")),
    }
}

fn embeddings(item: &Map<String, Value>, dim: usize) -> Result<ItemOutput, SchemaError> {
    let texts = texts_of(item)?;
    Ok(ItemOutput {
        prompt_tokens: texts.iter().map(|&text| count_words(text)).sum(),
        completion_tokens: 0,
        result: ItemResult::Embeddings { dim, seeds: texts.iter().map(|&text| hash_of(&[text])).collect() },
    })
}

/// A unit-length vector derived from the text alone.
#[cfg(test)]
pub(crate) fn embedding(text: &str, dim: usize) -> Vec<f32> {
    embedding_of_seed(hash_of(&[text]), dim)
}

/// A unit-length vector derived from a seed (the hash of a text).
fn embedding_of_seed(seed: u64, dim: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let raw: Vec<f64> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
    let norm = raw.iter().map(|x| x * x).sum::<f64>().sqrt().max(f64::MIN_POSITIVE);
    raw.iter().map(|x| (x / norm) as f32).collect()
}

fn rerank(item: &Map<String, Value>) -> Result<ItemOutput, SchemaError> {
    let query = item.get("query").and_then(Value::as_str).ok_or_else(|| schema_error("query must be a string"))?;
    let contexts = item
        .get("contexts")
        .and_then(Value::as_array)
        .filter(|contexts| !contexts.is_empty())
        .ok_or_else(|| schema_error("contexts must be a non-empty array"))?;
    let mut scored = Vec::with_capacity(contexts.len());
    let mut prompt_tokens = count_words(query);
    for (id, context) in contexts.iter().enumerate() {
        let text = context
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| schema_error("each context must have a text string"))?;
        prompt_tokens += count_words(text);
        scored.push((id, score(query, text)));
    }
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let response: Vec<Value> = scored.iter().map(|(id, score)| json!({ "id": id, "score": score })).collect();
    Ok(ItemOutput { prompt_tokens, completion_tokens: 0, result: ItemResult::Json(json!({ "response": response })) })
}

/// A relevance score in `0.0..1.0` with four decimals, derived from the query and the context.
pub(crate) fn score(query: &str, context: &str) -> f64 {
    (hash_of(&[query, context]) % 10_000) as f64 / 10_000.0
}

fn translation(item: &Map<String, Value>) -> Result<ItemOutput, SchemaError> {
    let text = item.get("text").and_then(Value::as_str).ok_or_else(|| schema_error("text must be a string"))?;
    let target_lang =
        item.get("target_lang").and_then(Value::as_str).ok_or_else(|| schema_error("target_lang must be a string"))?;
    if item.get("source_lang").is_some_and(|lang| !lang.is_string()) {
        return Err(schema_error("source_lang must be a string"));
    }
    let translated = format!("[{target_lang}] {text}");
    Ok(ItemOutput {
        prompt_tokens: count_words(text),
        completion_tokens: count_words(&translated),
        result: ItemResult::Json(json!({ "translated_text": translated })),
    })
}

fn speech(item: &Map<String, Value>) -> Result<ItemOutput, SchemaError> {
    let n_bytes = match item.get("audio") {
        Some(Value::String(encoded)) => encoded.len(),
        Some(Value::Array(bytes)) => bytes.len(),
        _ => return Err(schema_error("audio must be a string or an array of bytes")),
    };
    let text = format!("transcript of {n_bytes} audio bytes");
    Ok(ItemOutput {
        prompt_tokens: 0,
        completion_tokens: count_words(&text),
        result: ItemResult::Json(json!({ "text": text })),
    })
}

/// A hash that is the same for the same parts within one build.
pub(crate) fn hash_of(parts: &[&str]) -> u64 {
    let mut hasher = DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    #[test]
    fn text_generation_echoes_the_prompt() {
        let out =
            run_item("@cf/x", Family::TextGeneration, &item(json!({"prompt": "hello there world"}))).expect("fits");
        assert_eq!(out.result.to_value(), json!({"response": "echo: hello there world"}));
        assert_eq!(out.prompt_tokens, 3);
        let out = run_item(
            "@cf/x",
            Family::TextGeneration,
            &item(json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})),
        )
        .expect("fits");
        assert_eq!(out.result.to_value(), json!({"response": "echo: hi"}));
    }

    #[test]
    fn gpt_oss_takes_input_only() {
        let messages = item(json!({"messages": [{"role": "user", "content": "hi"}]}));
        assert!(run_item("@cf/openai/gpt-oss-20b", Family::TextGeneration, &messages).is_err());
        let input = item(json!({"input": [{"role": "user", "content": "hi"}]}));
        assert!(run_item("@cf/openai/gpt-oss-20b", Family::TextGeneration, &input).is_ok());
        assert!(run_item("@cf/x", Family::TextGeneration, &item(json!({"max_tokens": 3}))).is_err());
    }

    #[test]
    fn embeddings_are_deterministic_unit_vectors() {
        let a = embedding("abc", 384);
        assert_eq!(a, embedding("abc", 384));
        assert_ne!(a, embedding("abd", 384));
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-3);
        let out = run_item("m", Family::Embeddings { dim: 8 }, &item(json!({"text": ["a", "b"]}))).expect("fits");
        let result = out.result.to_value();
        assert_eq!(result["shape"], json!([2, 8]));
        assert_eq!(result["data"][1].as_array().map(Vec::len), Some(8));
        let first: Vec<f32> = serde_json::from_value(result["data"][0].clone()).expect("floats");
        assert_eq!(first, embedding("a", 8));
        assert!(run_item("m", Family::Embeddings { dim: 8 }, &item(json!({"text": []}))).is_err());
    }

    #[test]
    fn bge_m3_query_mode_scores_each_context_sorted() {
        let out = run_item(
            "m",
            Family::BgeM3,
            &item(json!({"query": "q", "contexts": [{"text": "a"}, {"text": "b"}, {"text": "c"}]})),
        )
        .expect("fits");
        let result = out.result.to_value();
        let response = result["response"].as_array().expect("array");
        assert_eq!(response.len(), 3);
        let scores: Vec<f64> = response.iter().map(|r| r["score"].as_f64().expect("score")).collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]));
        assert!(scores.iter().all(|s| (0.0..1.0).contains(s)));
        let out = run_item("m", Family::BgeM3, &item(json!({"text": "a"}))).expect("fits");
        assert_eq!(out.result.to_value()["shape"], json!([1, 1024]));
    }

    #[test]
    fn words_are_separated_by_ascii_whitespace() {
        assert_eq!(count_words(""), 0);
        assert_eq!(count_words("  "), 0);
        assert_eq!(count_words("one"), 1);
        assert_eq!(count_words(" two\twords\n"), 2);
        assert_eq!(count_words("a  b\r\nc é"), 4);
    }

    #[test]
    fn translation_tags_the_target_language() {
        let out = run_item(
            "m",
            Family::Translation,
            &item(json!({"text": "hello", "source_lang": "en", "target_lang": "es"})),
        )
        .expect("fits");
        assert_eq!(out.result.to_value(), json!({"translated_text": "[es] hello"}));
        assert!(run_item("m", Family::Translation, &item(json!({"text": "hello"}))).is_err());
    }

    #[test]
    fn a_schema_error_words_the_item_error_and_the_strict_refusal_from_one_detail() {
        let error = run_item("@cf/x", Family::TextGeneration, &item(json!({"max_tokens": 3}))).expect_err("unfit");
        assert_eq!(error.item_message(), "Invalid data: oneOf at '/' not met (expected prompt or messages)");
        assert_eq!(
            error.submit_message(7, crate::config::RefusalForm::default()),
            "AiError: Bad input: Error: oneOf at '/requests/7' not met, 0 matches: expected prompt or messages"
        );
        let any_of =
            crate::config::RefusalForm { keyword: crate::config::SchemaKeyword::AnyOf, code: None, pointer: false };
        assert_eq!(
            error.submit_message(7, any_of),
            "AiError: Bad input: Error: anyOf at '/' not met, 0 matches: expected prompt or messages"
        );
    }
}
