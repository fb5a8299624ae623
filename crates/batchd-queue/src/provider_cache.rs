//! What batchd keeps in Redis about a provider's account, shared by every replica and read by operators: the
//! Workers AI model catalog as last read (one STRING of JSON, written whole), and the models batchd has submitted
//! for (a ZSET). Both are bounded on read: the catalog by bytes (`GETRANGE`), the models by count (`ZRANGE`).

use batchd_core::{Keys, UnixMillis};

use crate::{Conn, StoreError};

/// Largest cached catalog read, in bytes (the 2026 catalog is about 10 KB as batchd stores it).
pub const MAX_CATALOG_BYTES: usize = 4 * 1024 * 1024;

/// The cached catalog's JSON, if any and if it is at most [`MAX_CATALOG_BYTES`] (a larger value is not batchd's:
/// it reads as absent, and the next refresh overwrites it).
pub async fn read_catalog(conn: &mut Conn, keys: &Keys, account: &str) -> Result<Option<String>, StoreError> {
    let bytes: Vec<u8> = redis::cmd("GETRANGE")
        .arg(keys.cloudflare_catalog(account))
        .arg(0)
        .arg(MAX_CATALOG_BYTES)
        .query_async(conn)
        .await?;
    if bytes.is_empty() || bytes.len() > MAX_CATALOG_BYTES {
        return Ok(None);
    }
    Ok(String::from_utf8(bytes).ok())
}

/// Replaces the cached catalog.
pub async fn write_catalog(conn: &mut Conn, keys: &Keys, account: &str, json: &str) -> Result<(), StoreError> {
    let () = redis::cmd("SET").arg(keys.cloudflare_catalog(account)).arg(json).query_async(conn).await?;
    Ok(())
}

/// Notes models as seen at `now` (a model already noted keeps its first time).
pub async fn note_models_seen(
    conn: &mut Conn,
    keys: &Keys,
    account: &str,
    models: &[String],
    now: UnixMillis,
) -> Result<(), StoreError> {
    if models.is_empty() {
        return Ok(());
    }
    let mut command = redis::cmd("ZADD");
    command.arg(keys.cloudflare_models_seen(account)).arg("NX");
    for model in models {
        command.arg(now).arg(model);
    }
    let _: i64 = command.query_async(conn).await?;
    Ok(())
}

/// The first `limit` models noted as seen, oldest first.
pub async fn models_seen(conn: &mut Conn, keys: &Keys, account: &str, limit: usize) -> Result<Vec<String>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let models: Vec<String> =
        redis::cmd("ZRANGE").arg(keys.cloudflare_models_seen(account)).arg(0).arg(limit - 1).query_async(conn).await?;
    Ok(models)
}
