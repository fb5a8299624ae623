//! Reading stream replies (`XREADGROUP`, `XAUTOCLAIM`, `XRANGE`) from raw Redis values.
//!
//! Parsed by hand rather than with the client's typed replies because an entry that was trimmed away while it was
//! pending comes back as `[id, nil]`, which must be seen (and acknowledged), not fail the whole reply.

use std::collections::HashMap;

use redis::Value;

use crate::error::ProducerError;

/// One stream entry as read: its id and, unless it was deleted from the stream meanwhile, its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawEntry {
    /// The stream entry id.
    pub id: String,
    /// The fields, or `None` when the entry no longer exists (trimmed or deleted while pending).
    pub fields: Option<HashMap<String, String>>,
}

fn bad(what: &str, value: &Value) -> ProducerError {
    ProducerError::Reply(format!("{what}: {value:?}"))
}

/// A string-ish value as text.
pub(crate) fn text(value: &Value) -> Result<String, ProducerError> {
    match value {
        Value::BulkString(bytes) => Ok(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Ok(text.clone()),
        Value::VerbatimString { text, .. } => Ok(text.clone()),
        Value::Int(n) => Ok(n.to_string()),
        Value::Okay => Ok("OK".to_owned()),
        other => Err(bad("expected a string", other)),
    }
}

/// The elements of an array-like value (arrays, sets, and maps flattened to key, value, key, value).
fn items(value: &Value) -> Result<Vec<&Value>, ProducerError> {
    match value {
        Value::Array(items) | Value::Set(items) => Ok(items.iter().collect()),
        Value::Map(pairs) => Ok(pairs.iter().flat_map(|(k, v)| [k, v]).collect()),
        other => Err(bad("expected an array", other)),
    }
}

/// A field/value list (`[f1, v1, f2, v2, ...]` or a RESP3 map) as a map.
fn field_map(value: &Value) -> Result<HashMap<String, String>, ProducerError> {
    let flat = items(value)?;
    if flat.len() % 2 != 0 {
        return Err(bad("odd field list", value));
    }
    flat.chunks(2).map(|pair| Ok((text(pair[0])?, text(pair[1])?))).collect()
}

/// A list of entries, `[[id, fields | nil], ...]`.
pub(crate) fn entries(value: &Value) -> Result<Vec<RawEntry>, ProducerError> {
    if matches!(value, Value::Nil) {
        return Ok(Vec::new());
    }
    items(value)?
        .into_iter()
        .map(|entry| {
            let parts = items(entry)?;
            let id = text(parts.first().ok_or_else(|| bad("entry without id", entry))?)?;
            let fields = match parts.get(1) {
                None | Some(Value::Nil) => None,
                Some(fields) => Some(field_map(fields)?),
            };
            Ok(RawEntry { id, fields })
        })
        .collect()
}

/// The entries of an `XREAD`/`XREADGROUP` reply for one stream (`nil` when the block timed out).
pub(crate) fn read_reply(value: &Value) -> Result<Vec<RawEntry>, ProducerError> {
    match value {
        Value::Nil => Ok(Vec::new()),
        // RESP3: {stream => entries}
        Value::Map(pairs) => match pairs.first() {
            Some((_, stream_entries)) => entries(stream_entries),
            None => Ok(Vec::new()),
        },
        // RESP2: [[stream, entries]]
        other => {
            let streams = items(other)?;
            match streams.first() {
                Some(stream) => {
                    let parts = items(stream)?;
                    entries(parts.get(1).ok_or_else(|| bad("stream without entries", stream))?)
                }
                None => Ok(Vec::new()),
            }
        }
    }
}

/// An `XAUTOCLAIM` reply: the cursor to continue from, the claimed entries, and the ids that were deleted from the
/// stream while pending (Redis 7 lists them separately and drops them from the pending list).
pub(crate) fn autoclaim_reply(value: &Value) -> Result<(String, Vec<RawEntry>, Vec<String>), ProducerError> {
    let parts = items(value)?;
    let cursor = text(parts.first().ok_or_else(|| bad("XAUTOCLAIM without cursor", value))?)?;
    let claimed = match parts.get(1) {
        Some(list) => entries(list)?,
        None => Vec::new(),
    };
    let deleted = match parts.get(2) {
        Some(list) => items(list)?.into_iter().map(text).collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    Ok((cursor, claimed, deleted))
}

/// The millisecond part of a stream id (`1763769600000-0` → 1763769600000).
pub fn entry_millis(id: &str) -> Option<u64> {
    id.split_once('-').map_or(id, |(ms, _)| ms).parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_trimmed_pending_entry_is_kept_without_fields() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("{ns}:results"),
            Value::Array(vec![
                Value::Array(vec![bulk("1-0"), Value::Array(vec![bulk("job_id"), bulk("a")])]),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ])]);
        let entries = read_reply(&reply).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].fields.as_ref().unwrap()["job_id"], "a");
        assert_eq!(entries[1], RawEntry { id: "2-0".into(), fields: None });
        assert!(read_reply(&Value::Nil).unwrap().is_empty());
    }

    #[test]
    fn autoclaim_replies_of_redis_6_and_7_parse() {
        let claimed = Value::Array(vec![Value::Array(vec![bulk("5-0"), Value::Array(vec![bulk("k"), bulk("v")])])]);
        let (cursor, entries, deleted) =
            autoclaim_reply(&Value::Array(vec![bulk("0-0"), claimed.clone(), Value::Array(vec![bulk("3-0")])]))
                .unwrap();
        assert_eq!((cursor.as_str(), entries.len(), deleted), ("0-0", 1, vec!["3-0".to_owned()]));
        let (_, entries, deleted) = autoclaim_reply(&Value::Array(vec![bulk("7-0"), claimed])).unwrap();
        assert_eq!((entries.len(), deleted.len()), (1, 0));
    }

    #[test]
    fn entry_ids_carry_their_time() {
        assert_eq!(entry_millis("1763769600000-3"), Some(1_763_769_600_000));
        assert_eq!(entry_millis("junk"), None);
    }
}
