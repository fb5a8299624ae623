//! The Redis Functions library (`lua/functions.lua`) that operators and producers call by name with `FCALL`:
//! cancelling a job and retrying a dead letter. No role but the daemon and the administrator may load or run Lua
//! of its own (`SCRIPT LOAD`, `EVAL`, `EVALSHA` run anything, including a loop that blocks Redis for everyone);
//! calling a function someone trusted loaded is all an operator needs (`+fcall`).
//!
//! The library's name and its functions' names carry a hash of its text (`batchd_<hash>`), so replicas and CLIs of
//! different versions each call their own and never replace another's. The daemon loads it at start
//! ([`load`], `FUNCTION LOAD`, which redis-rs sends to every primary of a Cluster); a caller that finds it missing
//! (a Redis restarted without persistence) loads it itself when its user may, and otherwise says who must.

use std::sync::LazyLock;
use std::time::Duration;

use batchd_core::{JobId, Keys};

use crate::{Conn, StoreError};

/// The library as `FUNCTION LOAD` takes it, with its names.
struct Library {
    /// The library's name (`batchd_<hash>`).
    name: String,
    /// The full text: header, names and prelude from Rust, the functions, their registrations.
    text: String,
}

/// The functions, by their local name in `functions.lua`.
const FUNCTIONS: [&str; 2] = ["cancel", "dead_retry"];

static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let body = crate::store::library_text(include_str!("lua/functions.lua"));
    let hash = redis::Script::new(&body).get_hash().to_owned();
    let name = format!("batchd_{}", &hash[..12]);
    let registrations: String = FUNCTIONS
        .iter()
        .map(|function| format!("redis.register_function('{name}_{function}', {function})\n"))
        .collect();
    Library { text: format!("#!lua name={name}\n{body}\n{registrations}"), name }
});

/// The library's name, as `FUNCTION LIST` shows it.
pub fn library_name() -> &'static str {
    &LIBRARY.name
}

/// The library's full text, for an administrator's `FUNCTION LOAD` (see docs/security.md).
pub fn library_text() -> &'static str {
    &LIBRARY.text
}

/// The name `FCALL` takes for function `function` of this library.
fn function_name(function: &str) -> String {
    format!("{}_{function}", LIBRARY.name)
}

/// Loads the library (`FUNCTION LOAD REPLACE`: the same text again is harmless), on every primary of a Cluster.
pub async fn load(conn: &mut Conn) -> Result<(), StoreError> {
    let _: redis::Value =
        redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(library_text()).query_async(conn).await?;
    Ok(())
}

/// Runs `FCALL function keys args`; when Redis does not have the library, loads it and calls again (a user that
/// may not load it gets an error that names the fix).
async fn call<T: redis::FromRedisValue>(
    conn: &mut Conn,
    function: &str,
    keys: &[String],
    args: &[&[u8]],
) -> Result<T, StoreError> {
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(function_name(function)).arg(keys.len()).arg(keys);
    for arg in args {
        cmd.arg(*arg);
    }
    match cmd.query_async(conn).await {
        Err(error) if is_missing_function(&error) => {
            if let Err(load_error) = load(conn).await {
                return Err(StoreError::Redis(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "batchd's Redis functions are not loaded",
                    format!(
                        "library {} is missing and this user cannot load it ({load_error}); start a batchd daemon \
                         of this version, or have the administrator load it (docs/security.md)",
                        library_name()
                    ),
                ))));
            }
            Ok(cmd.query_async(conn).await?)
        }
        other => Ok(other?),
    }
}

fn is_missing_function(error: &redis::RedisError) -> bool {
    error.to_string().contains("Function not found")
}

/// Requests the cancellation of `job_id` (see `cancel` in `functions.lua`): the flag `{ns}:cancel:<id>` set to
/// `reason` for `ttl`, the job's scheduled chunks due now. Returns the job's state, empty when it has no ledger.
pub async fn cancel(
    conn: &mut Conn,
    keys: &Keys,
    job_id: &JobId,
    ttl: Duration,
    reason: &str,
) -> Result<String, StoreError> {
    let reason = if reason.is_empty() { "cancelled" } else { reason };
    let ttl = ttl.as_secs().max(1).to_string();
    call(
        conn,
        "cancel",
        &[keys.job(job_id), keys.cancel(job_id), keys.schedule_of(job_id)],
        &[job_id.as_str().as_bytes(), ttl.as_bytes(), reason.as_bytes()],
    )
    .await
}

/// Moves dead-letter entry `entry_id` back to the submit stream as job `job` (see `dead_retry` in
/// `functions.lua`), atomically: the entry is deleted, and the job enqueued only if that deleted it. Returns the
/// new submit entry's id, or `None` when the entry was gone (retried or purged meanwhile: nothing enqueued).
pub async fn requeue_dead_letter(
    conn: &mut Conn,
    keys: &Keys,
    entry_id: &str,
    job: &[u8],
) -> Result<Option<String>, StoreError> {
    call(conn, "dead_retry", &[keys.dead(), keys.submit()], &[entry_id.as_bytes(), job]).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_named_by_its_text_and_registers_every_function() {
        let text = library_text();
        assert!(text.starts_with(&format!("#!lua name={}\n", library_name())));
        assert_eq!(library_name().len(), "batchd_".len() + 12);
        for function in FUNCTIONS {
            assert!(text.contains(&format!("local function {function}(keys, args)")), "{function} is defined");
            assert!(text.contains(&format!("redis.register_function('{}', {function})", function_name(function))));
        }
    }
}
