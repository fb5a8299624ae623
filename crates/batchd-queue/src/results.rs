//! Reading result streams: following one from an entry id (`batchd tail`), and the consumer-group commands of a
//! results reader (the producer library's `ResultReader`, whose replies it parses itself, leniently: an entry
//! trimmed meanwhile comes back without fields). A results stream is `{ns}:results` or `{ns}:results:<suffix>`;
//! the caller checks that with `Keys::is_results_stream`.

use std::time::Duration;

use crate::inspect::Entries;
use crate::{Conn, StoreError};

/// Answers `PING`: whether Redis is reachable on `conn` (the CLI's and the producer's check before they start).
pub async fn ping(conn: &mut Conn) -> Result<(), StoreError> {
    let _: String = redis::cmd("PING").query_async(conn).await?;
    Ok(())
}

/// Up to `count` entries of `stream` after entry id `after` (`XREAD`), waiting up to `block` for the first one.
/// Empty when none arrived in time.
pub async fn read_after(
    conn: &mut Conn,
    stream: &str,
    after: &str,
    count: u64,
    block: Duration,
) -> Result<Entries<String>, StoreError> {
    type Reply = Option<Vec<(String, Entries<String>)>>;
    let reply: Reply = redis::cmd("XREAD")
        .arg("COUNT")
        .arg(count)
        .arg("BLOCK")
        .arg(block.as_millis().max(1) as u64)
        .arg("STREAMS")
        .arg(stream)
        .arg(after)
        .query_async(conn)
        .await?;
    Ok(reply.unwrap_or_default().into_iter().flat_map(|(_, entries)| entries).collect())
}

/// Creates consumer group `group` on `stream` (and the stream), starting at `start` (`0` or `$`); a group that
/// exists already is left as it is.
pub async fn create_group(conn: &mut Conn, stream: &str, group: &str, start: &str) -> Result<(), StoreError> {
    let created: redis::RedisResult<()> =
        redis::cmd("XGROUP").arg("CREATE").arg(stream).arg(group).arg(start).arg("MKSTREAM").query_async(conn).await;
    match created {
        Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
        other => Ok(other?),
    }
}

/// Where a group read starts.
#[derive(Debug, Clone, Copy)]
pub enum GroupRead<'a> {
    /// This consumer's own pending entries after this id (`0` for all), without blocking.
    Pending(&'a str),
    /// New entries, waiting up to this long for the first one.
    New(Duration),
}

/// One `XREADGROUP` of up to `count` entries as `consumer` of `group`; the raw reply.
pub async fn read_group(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    count: usize,
    read: GroupRead<'_>,
) -> Result<redis::Value, StoreError> {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP").arg(group).arg(consumer).arg("COUNT").arg(count);
    let id = match read {
        GroupRead::Pending(after) => after,
        GroupRead::New(block) => {
            cmd.arg("BLOCK").arg(block.as_millis().max(1) as u64);
            ">"
        }
    };
    cmd.arg("STREAMS").arg(stream).arg(id);
    Ok(cmd.query_async(conn).await?)
}

/// One `XAUTOCLAIM` step: up to `count` entries of `group` idle for `min_idle` or longer, claimed for `consumer`,
/// from `cursor`; the raw reply (next cursor, claimed entries, ids deleted meanwhile).
pub async fn autoclaim(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    min_idle: Duration,
    cursor: &str,
    count: usize,
) -> Result<redis::Value, StoreError> {
    Ok(redis::cmd("XAUTOCLAIM")
        .arg(stream)
        .arg(group)
        .arg(consumer)
        .arg(min_idle.as_millis() as u64)
        .arg(cursor)
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?)
}

/// Acknowledges entries of `group` (`XACK`); returns how many were pending.
pub async fn ack(conn: &mut Conn, stream: &str, group: &str, ids: &[&str]) -> Result<u64, StoreError> {
    Ok(redis::cmd("XACK").arg(stream).arg(group).arg(ids).query_async(conn).await?)
}
