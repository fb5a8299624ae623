//! Planning a batch's reply before it is sent. Workers AI answers the poll of a finished batch with every response
//! inline, and batchd reads at most `cloudflare.max_reply_bytes` of it: a batch whose reply would be larger runs,
//! is billed, and its results are lost (`reply_too_large`). An embedding's size is predictable (its model's
//! dimensions, each number printed as JSON), so batches of embeddings are planned, and packs filled, under the
//! number of vectors whose reply fits ([`Provider::input_limit`](batchd_provider::Provider::input_limit)).

use serde_json::value::RawValue;

/// Bytes one number of a vector takes in a reply at most: a float32 printed as JSON (`-0.0123456789,` is 14; a
/// number in exponent form or with more digits fits too).
const BYTES_PER_NUMBER: usize = 24;

/// Bytes around each vector in a reply (its brackets, the response's `shape` and wrapper, shared per vector).
const BYTES_PER_VECTOR: usize = 256;

/// Dimensions assumed for an embeddings model [`DIMENSIONS`] does not list: larger than any Workers AI lists today
/// (a model with larger vectors should be added there, or its batches may be refused as too large to read).
const UNKNOWN_DIMENSIONS: usize = 4096;

/// The vector size of the Workers AI embedding models batchd knows (from each model's page on
/// developers.cloudflare.com/workers-ai/models).
const DIMENSIONS: [(&str, usize); 4] = [
    ("@cf/baai/bge-small-en-v1.5", 384),
    ("@cf/baai/bge-base-en-v1.5", 768),
    ("@cf/baai/bge-large-en-v1.5", 1024),
    ("@cf/baai/bge-m3", 1024),
];

/// The most bytes one vector of `model` takes in a reply.
pub fn vector_reply_bytes(model: &str) -> usize {
    let dimensions =
        DIMENSIONS.iter().find(|(name, _)| *name == model).map_or(UNKNOWN_DIMENSIONS, |(_, dimensions)| *dimensions);
    dimensions * BYTES_PER_NUMBER + BYTES_PER_VECTOR
}

/// The most vectors of `model` whose reply fits in `max_reply_bytes` (at least 1).
pub fn max_vectors(model: &str, max_reply_bytes: usize) -> usize {
    (max_reply_bytes / vector_reply_bytes(model)).max(1)
}

/// The vectors an embeddings item asks for: its `text`'s elements when it is a list, else 1 (one text, or an item
/// without a readable `text`, such as bge-m3's query mode, whose reply is scores).
pub fn texts_of(item: &RawValue) -> usize {
    batchd_provider::items::array_member(item, "text").map_or(1, |texts| texts.len().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_owned()).expect("json")
    }

    #[test]
    fn an_item_asks_for_one_vector_per_text() {
        assert_eq!(texts_of(&raw(r#"{"text":"one"}"#)), 1);
        assert_eq!(texts_of(&raw(r#"{"text":["a","b","c"]}"#)), 3);
        assert_eq!(texts_of(&raw(r#"{"text":[]}"#)), 1);
        assert_eq!(texts_of(&raw(r#"{"query":"q","contexts":[{"text":"a"}]}"#)), 1);
        assert_eq!(texts_of(&raw(r#"{"text":7}"#)), 1);
    }

    #[test]
    fn the_vectors_of_a_reply_are_bounded_by_the_model_s_dimensions() {
        // bge-m3: 1,024 numbers of at most 24 bytes and 256 around them, 24,832 bytes a vector.
        assert_eq!(vector_reply_bytes("@cf/baai/bge-m3"), 24_832);
        assert_eq!(max_vectors("@cf/baai/bge-m3", 256 * 1024 * 1024), 10_810);
        assert_eq!(max_vectors("@cf/baai/bge-small-en-v1.5", 1024 * 1024), 110);
        // An unknown model is planned as if its vectors were the largest known.
        assert_eq!(vector_reply_bytes("@cf/some/new-embedder"), 4096 * 24 + 256);
        assert_eq!(max_vectors("@cf/baai/bge-m3", 10), 1);
    }
}
