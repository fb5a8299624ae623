//! Building a chunk's per-item responses, the same at every provider: a failed item's `{"code","message"}` error
//! (the shape every provider's failed items have) and token counts summed over the items that succeeded.

use batchd_core::ItemResponse;
use serde_json::value::RawValue;

/// A failed response for item `index` with `{"code": code, "message": message}` as its error.
pub fn failed_item(index: usize, code: &str, message: &str) -> ItemResponse {
    let text = serde_json::json!({"code": code, "message": message}).to_string();
    ItemResponse::failure(index, RawValue::from_string(text).ok())
}

/// The elements of a request item's member `name` when it is a JSON array, unparsed; `None` when the item has no
/// such member, it is not an array, or the item is not a JSON object (how many inputs an item asks for: OpenAI's
/// embedding `input`, Workers AI's embedding `text`).
pub fn array_member<'a>(item: &'a RawValue, name: &str) -> Option<Vec<&'a RawValue>> {
    let members: std::collections::HashMap<String, &RawValue> = serde_json::from_str(item.get()).ok()?;
    let value = members.get(name)?;
    if !value.get().trim_start().starts_with('[') {
        return None;
    }
    serde_json::from_str(value.get()).ok()
}

/// Adds the numeric members of one item's usage (`input_tokens`, `promptTokenCount`, ...) to `total`; other
/// members are left out.
pub fn add_usage(
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

    #[test]
    fn usage_sums_numbers_and_failures_carry_code_and_message() {
        let mut total = serde_json::Map::new();
        for usage in [serde_json::json!({"a": 2, "b": "x"}), serde_json::json!({"a": 3, "c": 1})] {
            add_usage(&mut total, usage.as_object().cloned().unwrap_or_default());
        }
        assert_eq!(serde_json::Value::Object(total), serde_json::json!({"a": 5, "c": 1}));
        let failed = failed_item(4, "expired", "not run");
        assert_eq!((failed.index, failed.success), (4, false));
        assert_eq!(failed.error.expect("error").get(), r#"{"code":"expired","message":"not run"}"#);
    }
}
