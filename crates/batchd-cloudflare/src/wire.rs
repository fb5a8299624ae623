//! The Batch API's JSON, as it goes over the wire; private to this crate.
//!
//! Only part of the format is documented (see `docs/batch-api.md`), and third-party clients have seen replies that
//! differ from the docs, so everything read here is read field by field and leniently: every field may be missing,
//! `null` or of an unexpected JSON type (a number as a string, a flag as `"true"` or `1`, `errors` as one object
//! instead of a list), and a part that is not the expected shape is read as absent instead of making the whole
//! reply unreadable. Item payloads stay `RawValue`, byte for byte, whatever their type.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeOwned, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// Submit body: `{"requests":[...]}`, each item sent exactly as the caller gave it.
#[derive(Debug, Serialize)]
pub(crate) struct SubmitBody<'a, R> {
    /// The request items (raw JSON, owned or borrowed).
    pub requests: &'a [R],
}

/// Poll body: `{"request_id":"..."}`.
#[derive(Debug, Serialize)]
pub(crate) struct PollBody<'a> {
    /// The id the submit returned.
    pub request_id: &'a str,
}

/// A part of a reply that should be a JSON object: `Object` when it is, `Other` when it is any other JSON value
/// (a string, a number, a list, ...), which callers read as absent. Reading it never fails on the value's type.
#[derive(Debug)]
pub(crate) enum Shape<T> {
    /// The part was an object.
    Object(T),
    /// The part was some other JSON value.
    Other,
}

impl<T> Shape<T> {
    /// The value, when it had the expected shape.
    pub(crate) fn into_option(self) -> Option<T> {
        match self {
            Self::Object(value) => Some(value),
            Self::Other => None,
        }
    }
}

/// The visitor methods for every JSON scalar (`null`, booleans, numbers, strings), each giving `$other`.
macro_rules! scalars_are {
    ($other:expr) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($other)
        }

        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($other)
        }

        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($other)
        }

        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($other)
        }

        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($other)
        }

        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($other)
        }
    };
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Shape<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ShapeVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ShapeVisitor<T> {
            type Value = Shape<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Shape::Object)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Shape::Other)
            }

            scalars_are!(Shape::Other);
        }

        deserializer.deserialize_any(ShapeVisitor(PhantomData))
    }
}

/// A list that should hold objects: each element is read on its own, one that is not an object stays
/// [`Shape::Other`] (and is dropped by the caller with a warning); a value that is not a list at all is
/// [`List::Other`]. Reading it never fails on a value's type.
#[derive(Debug)]
pub(crate) enum List<T> {
    /// The part was a list.
    Items(Vec<Shape<T>>),
    /// The part was some other JSON value.
    Other,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ListVisitor<T> {
            type Value = List<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                // No capacity from the size hint: the reply is not trusted to say how long it is.
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<Shape<T>>()? {
                    items.push(item);
                }
                Ok(List::Items(items))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(List::Other)
            }

            scalars_are!(List::Other);
        }

        deserializer.deserialize_any(ListVisitor(PhantomData))
    }
}

/// The envelope around every reply: `{"result":...,"success":...,"errors":[...],"messages":[...]}`.
#[derive(Debug, Deserialize)]
pub(crate) struct Envelope<T> {
    /// The payload; `null` on errors; [`Shape::Other`] when it is not an object.
    #[serde(default = "none")]
    pub result: Option<Shape<T>>,
    /// Whether the API considers the request successful (read with [`flag`]).
    #[serde(default)]
    pub success: Option<Value>,
    /// The API's errors, if any (read with [`first_error`]).
    #[serde(default)]
    pub errors: Option<Value>,
}

fn none<T>() -> Option<T> {
    None
}

impl<T: DeserializeOwned> Envelope<T> {
    /// Whether the reply says it failed: `success` false, or no result with errors listed.
    pub(crate) fn is_refusal(&self) -> bool {
        flag(self.success.as_ref()) == Some(false) || (self.result.is_none() && has_errors(self.errors.as_ref()))
    }

    /// Whether the reply has none of the envelope's fields, as the Workers binding's unwrapped replies
    /// (`{"status":"queued","request_id":...}`) do: then the whole body is the result.
    pub(crate) fn is_bare(&self) -> bool {
        self.result.is_none() && self.success.is_none() && self.errors.is_none()
    }
}

/// The envelope read for its errors only, so an error reply with an unexpected `result` is still understood.
#[derive(Debug, Deserialize)]
pub(crate) struct ErrorEnvelope {
    /// The API's errors: a list of `{"code":..,"message":..}`, or one such object (seen live), or strings.
    #[serde(default)]
    pub errors: Option<Value>,
}

/// The first of the API's errors as `(code, message)`: `errors` may be a list or a single object; a code may be a
/// number or a numeric string; a message that is not a string is quoted as JSON.
pub(crate) fn first_error(errors: Option<&Value>) -> (Option<i64>, Option<String>) {
    let first = match errors {
        Some(Value::Array(list)) => list.first(),
        Some(other @ (Value::Object(_) | Value::String(_))) => Some(other),
        _ => None,
    };
    match first {
        Some(Value::Object(fields)) => {
            let code = fields.get("code").and_then(integer);
            let message = fields.get("message").and_then(|message| match message {
                Value::Null => None,
                Value::String(text) => Some(text.clone()),
                other => Some(other.to_string()),
            });
            (code, message)
        }
        Some(Value::String(text)) => (None, Some(text.clone())),
        _ => (None, None),
    }
}

fn has_errors(errors: Option<&Value>) -> bool {
    match errors {
        Some(Value::Array(list)) => !list.is_empty(),
        Some(Value::Object(fields)) => !fields.is_empty(),
        Some(Value::String(text)) => !text.trim().is_empty(),
        _ => false,
    }
}

/// A flag given as `true`/`false`, `"true"`/`"false"` (any case) or `1`/`0`; `None` for anything else.
pub(crate) fn flag(value: Option<&Value>) -> Option<bool> {
    match value? {
        Value::Bool(flag) => Some(*flag),
        Value::String(text) => match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Some(true),
            "false" | "0" | "no" => Some(false),
            _ => None,
        },
        Value::Number(number) => match number.as_f64() {
            Some(1.0) => Some(true),
            Some(0.0) => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// `result_info.total_pages` of a paged reply, when it says.
pub(crate) fn total_pages(reply: &serde_json::Map<String, Value>) -> Option<usize> {
    reply
        .get("result_info")
        .and_then(|info| info.get("total_pages"))
        .and_then(integer)
        .and_then(|n| usize::try_from(n).ok())
}

/// An integer given as a number or a numeric string.
pub(crate) fn integer(value: &Value) -> Option<i64> {
    match value {
        Value::Number(number) => number.as_i64(),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

/// A short text given as a string, or as a number (its decimal form); `None` for anything else.
pub(crate) fn text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

/// `result` of a submit reply: `{"status":"queued","request_id":"<uuid>","model":"@cf/baai/bge-m3"}`; only the id
/// matters (any 2xx with an id is an accepted batch, whatever its `status` says).
#[derive(Debug, Deserialize)]
pub(crate) struct SubmitResult {
    /// The batch's id, to poll with (a string; a number is read as its decimal form).
    #[serde(default)]
    pub request_id: Option<Value>,
}

/// `result` of a poll reply: pending (`status` only) or done (`responses[]` or `results[]`, plus `usage`).
#[derive(Debug, Deserialize)]
pub(crate) struct PollResult {
    /// `queued` or `running` while pending (documented); any other value is read too.
    #[serde(default)]
    pub status: Option<Value>,
    /// The batch's id, echoed in pending replies.
    #[serde(default)]
    pub request_id: Option<Value>,
    /// Items keyed by `id` (the documented shape); [`List::Other`] when not a list.
    #[serde(default = "none")]
    pub responses: Option<List<Item>>,
    /// Items keyed by `index` (the shape one live client reads); [`List::Other`] when not a list.
    #[serde(default = "none")]
    pub results: Option<List<Item>>,
    /// Token usage, e.g. `{"prompt_tokens":12,"completion_tokens":0,"total_tokens":12}`; kept raw here and read
    /// leniently, so a usage no `Value` can hold does not make the responses unreadable.
    #[serde(default)]
    pub usage: Option<Box<RawValue>>,
}

/// One response item: `{"id":0,"result":{...},"success":true,"external_reference":"story1"}`.
#[derive(Debug, Deserialize)]
pub(crate) struct Item {
    /// Index of the request item, in `responses[]` (a number or a numeric string).
    #[serde(default)]
    pub id: Option<Value>,
    /// Index of the request item, in `results[]` (a number or a numeric string).
    #[serde(default)]
    pub index: Option<Value>,
    /// Whether the item succeeded (read with [`flag`]); inferred when absent or unreadable.
    #[serde(default)]
    pub success: Option<Value>,
    /// The model's output, opaque: any JSON type.
    #[serde(default)]
    pub result: Option<Box<RawValue>>,
    /// The item's error, opaque.
    #[serde(default)]
    pub error: Option<Box<RawValue>>,
    /// The request item's top-level `external_reference`, echoed; `null` when it had none.
    #[serde(default)]
    pub external_reference: Option<Box<RawValue>>,
}

/// Reads an index given as a number or a numeric string.
pub(crate) fn as_index(value: &Value) -> Option<usize> {
    match value {
        Value::Number(number) => number.as_u64().and_then(|index| usize::try_from(index).ok()),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

/// Exact size in bytes of the submit body `{"requests":[i0,i1,...]}` for items of the given sizes: the envelope,
/// the items byte for byte, and one comma between neighbours.
pub fn submit_body_bytes(item_sizes: impl IntoIterator<Item = usize>) -> usize {
    const ENVELOPE: usize = r#"{"requests":[]}"#.len();
    let (total, count) =
        item_sizes.into_iter().fold((0usize, 0usize), |(total, count), size| (total + size, count + 1));
    ENVELOPE + total + count.saturating_sub(1)
}

#[cfg(test)]
mod body_size_tests {
    use serde_json::value::RawValue;

    use super::*;

    #[test]
    fn the_computed_size_is_the_serialised_size() {
        for items in [vec![], vec![r#"{"a":1}"#], vec![r#"{"text":"x"}"#, r#"{ "b" : [1, 2] }"#, "{}"]] {
            let raw: Vec<Box<RawValue>> = items.iter().map(|i| RawValue::from_string(i.to_string()).unwrap()).collect();
            let body = serde_json::to_vec(&SubmitBody { requests: &raw }).unwrap();
            assert_eq!(submit_body_bytes(items.iter().map(|i| i.len())), body.len(), "{items:?}");
        }
    }
}
