//! The submit stream as the ingress fetcher reads it (the fetcher itself is the daemon's runtime,
//! `crates/batchd-engine/src/runtime/ingress.rs`): the consumer group's reads, reclaims of abandoned entries, delivery
//! counts, and handing entries back; each entry's values moved out of the reply rather than copied.

use std::collections::HashMap;
use std::time::Duration;

use batchd_core::Keys;
use batchd_core::keys::CONSUMER_GROUP;
use redis::{AsyncCommands, Value};

use crate::{Conn, StoreError};

/// One entry of the submit stream, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitEntry {
    /// The stream entry id.
    pub id: String,
    /// The entry's fields, sorted by name (a field repeated in the entry keeps its order).
    pub fields: Vec<(String, Vec<u8>)>,
}

impl SubmitEntry {
    /// The bytes of the entry's fields, names included.
    pub fn size(&self) -> usize {
        self.fields.iter().map(|(name, value)| name.len() + value.len()).sum()
    }
}

/// `XREADGROUP` of up to `count` new entries for `consumer`, blocking up to `block` when given, else answering at
/// once.
pub async fn read_new(
    conn: &mut Conn,
    keys: &Keys,
    consumer: &str,
    count: usize,
    block: Option<Duration>,
) -> Result<Vec<SubmitEntry>, StoreError> {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP").arg(CONSUMER_GROUP).arg(consumer).arg("COUNT").arg(count);
    if let Some(block) = block {
        cmd.arg("BLOCK").arg(block.as_millis() as u64);
    }
    let reply: Value = cmd.arg("STREAMS").arg(keys.submit()).arg(">").query_async(conn).await?;
    // One stream asked for: [[stream, [entries]]] (RESP2) or {stream: [entries]} (RESP3); nil on timeout.
    Ok(match reply {
        Value::Array(streams) => streams
            .into_iter()
            .flat_map(|stream| match stream {
                Value::Array(mut pair) if pair.len() == 2 => entries(pair.swap_remove(1)),
                _ => Vec::new(),
            })
            .collect(),
        Value::Map(streams) => streams.into_iter().flat_map(|(_, value)| entries(value)).collect(),
        _ => Vec::new(),
    })
}

/// Claims for `consumer` up to `count` entries that other consumers left pending longer than `min_idle`
/// (`XAUTOCLAIM <stream> <group> <consumer> <min-idle> 0-0 COUNT n`).
pub async fn reclaim(
    conn: &mut Conn,
    keys: &Keys,
    consumer: &str,
    min_idle: Duration,
    count: usize,
) -> Result<Vec<SubmitEntry>, StoreError> {
    let reply: Value = redis::cmd("XAUTOCLAIM")
        .arg(keys.submit())
        .arg(CONSUMER_GROUP)
        .arg(consumer)
        .arg(min_idle.as_millis() as u64)
        .arg("0-0")
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?;
    // [next id, [entries], [deleted]]
    Ok(match reply {
        Value::Array(mut parts) if parts.len() >= 2 => entries(parts.swap_remove(1)),
        _ => Vec::new(),
    })
}

/// Whether intake is paused (`batchd pause`: `{ns}:paused` exists).
pub async fn is_paused(conn: &mut Conn, keys: &Keys) -> Result<bool, StoreError> {
    Ok(conn.exists::<_, bool>(keys.paused()).await?)
}

/// The consumer group's delivery count of each entry (`None` for one no longer pending): one `XPENDING <stream>
/// <group> <id> <id> 1` per entry, sent as one pipeline.
pub async fn delivery_counts(conn: &mut Conn, keys: &Keys, entry_ids: &[&str]) -> Result<Vec<Option<u64>>, StoreError> {
    let stream = keys.submit();
    let mut pipe = redis::pipe();
    for id in entry_ids {
        pipe.cmd("XPENDING").arg(&stream).arg(CONSUMER_GROUP).arg(*id).arg(*id).arg(1);
    }
    let replies: Vec<Value> = pipe.query_async(conn).await?;
    Ok(replies.into_iter().map(pending_deliveries).collect())
}

/// The delivery count in an extended `XPENDING` reply for one entry: `[[id, consumer, idle ms, deliveries]]`.
fn pending_deliveries(reply: Value) -> Option<u64> {
    let Value::Array(mut rows) = reply else { return None };
    let Value::Array(mut row) = rows.pop()? else { return None };
    redis::from_redis_value::<u64>(row.pop()?).ok()
}

/// Creates the consumer group (and the stream) if missing; after a Redis restart without persistence the group
/// is gone (`NOGROUP`) and is recreated here.
pub async fn ensure_group(conn: &mut Conn, keys: &Keys) -> Result<(), StoreError> {
    let created: redis::RedisResult<()> = conn.xgroup_create_mkstream(keys.submit(), CONSUMER_GROUP, "0").await;
    match created {
        Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
        other => Ok(other?),
    }
}

/// Deletes consumers that hold nothing and have been idle for `min_idle` or longer: every process start uses a
/// new consumer name, and without this the group would collect them forever. Best effort: errors are ignored.
pub async fn remove_idle_consumers(conn: &mut Conn, keys: &Keys, min_idle: Duration) {
    let stream = keys.submit();
    let min_idle = min_idle.as_millis() as i64;
    let consumers: redis::RedisResult<Vec<HashMap<String, Value>>> =
        redis::cmd("XINFO").arg("CONSUMERS").arg(&stream).arg(CONSUMER_GROUP).query_async(conn).await;
    let Ok(consumers) = consumers else { return };
    for consumer in consumers {
        let number = |name: &str| consumer.get(name).and_then(|v| redis::from_redis_value::<i64>(v.clone()).ok());
        let name = consumer.get("name").and_then(|v| redis::from_redis_value::<String>(v.clone()).ok());
        if let (Some(name), Some(0), Some(idle)) = (name, number("pending"), number("idle"))
            && idle >= min_idle
        {
            let _: redis::RedisResult<i64> = conn.xgroup_delconsumer(&stream, CONSUMER_GROUP, &name).await;
            tracing::debug!(consumer = %name, "removed idle consumer");
        }
    }
}

/// Deletes this replica's own consumer `name` from the ingress group when it holds nothing, at a clean stop, so
/// operators (`batchd workers`, the dashboard) no longer see a replica that is gone; one that still holds entries is
/// kept for another replica to reclaim them from. Returns whether it was deleted.
pub async fn remove_stopped_consumer(conn: &mut Conn, keys: &Keys, name: &str) -> Result<bool, StoreError> {
    let stream = keys.submit();
    let consumers: Vec<HashMap<String, Value>> =
        redis::cmd("XINFO").arg("CONSUMERS").arg(&stream).arg(CONSUMER_GROUP).query_async(conn).await?;
    let holds_nothing = consumers.iter().any(|consumer| {
        let field = |key: &str| consumer.get(key).cloned();
        field("name").and_then(|v| redis::from_redis_value::<String>(v).ok()).as_deref() == Some(name)
            && field("pending").and_then(|v| redis::from_redis_value::<i64>(v).ok()) == Some(0)
    });
    if !holds_nothing {
        return Ok(false);
    }
    let _pending: i64 = conn.xgroup_delconsumer(&stream, CONSUMER_GROUP, name).await?;
    Ok(true)
}

/// Hands entries back to the group by marking them idle for `idle` (`XCLAIM ... IDLE <ms> JUSTID`), so any
/// replica's next reclaim takes them.
pub async fn hand_back(
    conn: &mut Conn,
    keys: &Keys,
    consumer: &str,
    entry_ids: &[&str],
    idle: Duration,
) -> Result<(), StoreError> {
    let mut cmd = redis::cmd("XCLAIM");
    cmd.arg(keys.submit()).arg(CONSUMER_GROUP).arg(consumer).arg(0);
    for id in entry_ids {
        cmd.arg(*id);
    }
    cmd.arg("IDLE").arg(idle.as_millis() as u64).arg("JUSTID");
    let _: Value = cmd.query_async(conn).await?;
    Ok(())
}

/// The entries of a stream reply (`[[id, [field, value, ...]], ...]`), their values moved out of the reply rather
/// than copied (redis-rs's `StreamId` conversion clones every value, and a job can be tens of MB). Entries deleted
/// while pending come back as nil from `XAUTOCLAIM` on Redis 6.2 and are skipped. Fields are sorted by name, the
/// order of a field repeated in the entry kept.
fn entries(reply: Value) -> Vec<SubmitEntry> {
    let Value::Array(items) = reply else { return Vec::new() };
    items
        .into_iter()
        .filter_map(|item| {
            let Value::Array(mut pair) = item else { return None };
            if pair.len() != 2 {
                return None;
            }
            let values = pair.pop()?;
            let id = text(pair.pop()?);
            let mut fields: Vec<(String, Vec<u8>)> = match values {
                Value::Array(values) => {
                    let mut values = values.into_iter();
                    std::iter::from_fn(|| Some((text(values.next()?), bytes(values.next()?)))).collect()
                }
                Value::Map(pairs) => pairs.into_iter().map(|(name, value)| (text(name), bytes(value))).collect(),
                _ => Vec::new(),
            };
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            Some(SubmitEntry { id, fields })
        })
        .collect()
}

fn bytes(value: Value) -> Vec<u8> {
    match value {
        Value::BulkString(bytes) => bytes,
        Value::SimpleString(text) => text.into_bytes(),
        Value::VerbatimString { text, .. } => text.into_bytes(),
        other => format!("{other:?}").into_bytes(),
    }
}

fn text(value: Value) -> String {
    String::from_utf8_lossy(&bytes(value)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn entries_are_moved_out_of_a_reply_with_their_fields_sorted_and_repeats_kept_in_order() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                bulk("1-0"),
                Value::Array(vec![bulk("zeta"), bulk("z"), bulk("job"), bulk("first"), bulk("job"), bulk("second")]),
            ]),
            Value::Nil, // deleted while pending (XAUTOCLAIM on Redis 6.2)
            Value::Array(vec![bulk("2-0"), Value::Array(vec![bulk("job"), Value::SimpleString("{}".to_owned())])]),
        ]);
        let entries = entries(reply);
        let ids: Vec<&str> = entries.iter().map(|entry| entry.id.as_str()).collect();
        assert_eq!(ids, ["1-0", "2-0"]);
        let fields: Vec<(&str, &[u8])> =
            entries[0].fields.iter().map(|(name, value)| (name.as_str(), value.as_slice())).collect();
        assert_eq!(fields, [("job", &b"first"[..]), ("job", b"second"), ("zeta", b"z")]);
        assert_eq!(entries[1].fields, [("job".to_owned(), b"{}".to_vec())]);
    }

    #[test]
    fn the_delivery_count_is_the_last_column_of_an_extended_xpending_row() {
        let row =
            Value::Array(vec![Value::Array(vec![bulk("1-0"), bulk("consumer"), Value::Int(1200), Value::Int(6)])]);
        assert_eq!(pending_deliveries(row), Some(6));
        assert_eq!(pending_deliveries(Value::Array(Vec::new())), None, "no longer pending");
        assert_eq!(pending_deliveries(Value::Nil), None);
    }

    #[test]
    fn a_reply_that_is_not_a_list_of_entries_has_none() {
        assert!(entries(Value::Nil).is_empty());
        assert!(entries(Value::Array(vec![Value::Array(vec![bulk("only-an-id")])])).is_empty());
    }
}
