//! The operator CLI: `batchd submit` and `batchd status` (the daemon itself is `batchd run`).
//!
//! Commands talk to Redis directly with the daemon's own configuration, so they work wherever a producer could
//! enqueue. Errors are one line, printed by `main`; exit codes are listed in `batchd --help`.

use std::collections::HashMap;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use batchd_core::job::JOB_FIELD;
use batchd_core::ledger::field;
use batchd_core::{Job, JobId, JobState, Keys, ResultEntry};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

use crate::settings::Settings;

/// Exit code: the job ended `failed` or `expired`.
pub const EXIT_JOB_FAILED: i32 = 3;
/// Exit code: `--wait` gave up before the job finished.
pub const EXIT_WAIT_TIMEOUT: i32 = 4;
/// Exit code: the job id is unknown.
pub const EXIT_NOT_FOUND: i32 = 5;

/// An outcome the CLI reports through its exit code (the message is already printed).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Exit {
    /// Process exit code.
    pub code: i32,
    /// One line for stderr.
    pub message: String,
}

/// Options of `batchd submit`.
#[derive(Debug, Clone)]
pub struct SubmitOptions {
    /// The job JSON file, or `-` for standard input.
    pub file: PathBuf,
    /// Overrides the job's `id`.
    pub id: Option<String>,
    /// Follow the job until it finishes and print its result.
    pub wait: bool,
    /// Give up waiting after this long.
    pub timeout: Duration,
    /// Print machine-readable JSON instead of text.
    pub json: bool,
}

async fn connect(settings: &Settings) -> anyhow::Result<MultiplexedConnection> {
    let client = settings.redis_client()?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(settings.redis.response_timeout_secs)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .with_context(|| format!("cannot reach Redis at {}", redacted_url(settings.redis.url.expose())))
}

/// The URL without its password, for messages.
fn redacted_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://[credentials]@{}", &url[..scheme], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

/// `batchd submit`: validates a job locally, enqueues it with one XADD and prints its id; with `--wait`,
/// follows it and prints the result entry.
pub async fn submit(settings: &Settings, options: &SubmitOptions) -> anyhow::Result<()> {
    let text = read_input(&options.file)?;
    let keys = settings.keys();
    let mut job = Job::decode_json(&text, "0-0", &settings.job_limits(), &keys)
        .map_err(|e| anyhow!("{}: {e}", options.file.display()))?;
    let explicit_id = if let Some(id) = &options.id {
        job.id = JobId::parse(id).map_err(|e| anyhow!("--id: {e}"))?;
        true
    } else {
        serde_json::from_str::<serde_json::Value>(&text).ok().and_then(|v| v.get("id").cloned()).is_some()
    };
    let mut body: serde_json::Value = serde_json::from_str(&job.to_json()).context("re-encode job")?;
    if !explicit_id {
        // Without an id the daemon uses the stream entry id, which XADD tells us.
        body.as_object_mut().map(|object| object.remove("id"));
    }
    let mut conn = connect(settings).await?;
    let entry_id: String = conn
        .xadd(keys.submit(), "*", &[(JOB_FIELD, body.to_string())])
        .await
        .context("enqueue job")?;
    let job_id = if explicit_id { job.id.clone() } else { JobId::parse(&entry_id).context("entry id")? };
    if options.json && !options.wait {
        println!("{}", serde_json::json!({"job_id": job_id.as_str(), "entry_id": entry_id}));
    } else {
        println!("{job_id}");
    }
    if !options.wait {
        return Ok(());
    }
    let state = follow(&mut conn, &keys, &job_id, options.timeout).await?;
    let ledger: HashMap<String, String> = conn.hgetall(keys.job(&job_id)).await.context("read ledger")?;
    let result = read_result(&mut conn, &ledger).await?;
    println!("{}", serde_json::to_string_pretty(&result).context("encode result")?);
    if state != JobState::Completed {
        return Err(Exit { code: EXIT_JOB_FAILED, message: format!("job {job_id} ended {state}") }.into());
    }
    Ok(())
}

fn read_input(file: &Path) -> anyhow::Result<String> {
    if file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("read job from standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))
}

/// Follows a job's ledger until it is terminal, showing progress on stderr (a live line on a terminal,
/// one line per change otherwise).
async fn follow(
    conn: &mut MultiplexedConnection,
    keys: &Keys,
    job_id: &JobId,
    timeout: Duration,
) -> anyhow::Result<JobState> {
    let started = Instant::now();
    let live = std::io::stderr().is_terminal();
    let mut last_line = String::new();
    let spinner = ['|', '/', '-', '\\'];
    let mut tick = 0usize;
    loop {
        let ledger: HashMap<String, String> = conn.hgetall(keys.job(job_id)).await.context("read ledger")?;
        let state = ledger.get(field::STATE).and_then(|s| s.parse::<JobState>().ok());
        let line = progress_line(job_id, &ledger);
        let elapsed = started.elapsed();
        if live {
            tick += 1;
            eprint!("\r\x1b[K{} {line}  {:.1}s", spinner[tick % spinner.len()], elapsed.as_secs_f64());
            let _ = std::io::stderr().flush();
        } else if line != last_line {
            eprintln!("{line}");
        }
        last_line = line;
        if let Some(state) = state.filter(|state| state.is_terminal()) {
            if live {
                eprintln!();
            }
            return Ok(state);
        }
        if elapsed >= timeout {
            if live {
                eprintln!();
            }
            return Err(Exit {
                code: EXIT_WAIT_TIMEOUT,
                message: format!("gave up waiting for job {job_id} after {}s; it goes on in the daemon", timeout.as_secs()),
            }
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `inv-42: running (chunk 0: running, 3 polls)` — the job state and each chunk's remote status.
fn progress_line(job_id: &JobId, ledger: &HashMap<String, String>) -> String {
    let Some(state) = ledger.get(field::STATE) else {
        return format!("{job_id}: waiting for the daemon to take the job in");
    };
    let n_chunks: u32 = ledger.get(field::N_CHUNKS).and_then(|n| n.parse().ok()).unwrap_or(0);
    let chunks: Vec<String> = (0..n_chunks)
        .map(|index| {
            let get = |name: &str| ledger.get(&field::chunk(index, name)).cloned().unwrap_or_default();
            let chunk_state = get(field::CHUNK_STATE);
            let shown = if chunk_state == "polling" { get(field::CHUNK_REMOTE_STATUS) } else { chunk_state };
            format!("chunk {index}: {shown}")
        })
        .collect();
    if chunks.is_empty() || JobState::Completed.as_str() == state {
        format!("{job_id}: {state}")
    } else {
        format!("{job_id}: {state} ({})", chunks.join(", "))
    }
}

/// Reads the job's published result entry as JSON (structured fields decoded).
async fn read_result(
    conn: &mut MultiplexedConnection,
    ledger: &HashMap<String, String>,
) -> anyhow::Result<serde_json::Value> {
    let (Some(stream), Some(entry_id)) = (ledger.get(field::REPLY_TO), ledger.get("result_entry")) else {
        bail!("the job finished but its ledger does not say where its result entry is");
    };
    let entries: Vec<(String, HashMap<String, String>)> =
        redis::cmd("XRANGE").arg(stream).arg(entry_id).arg(entry_id).query_async(conn).await.context("read result")?;
    let Some((_, fields)) = entries.into_iter().next() else {
        bail!("result entry {entry_id} is no longer in {stream} (trimmed by retention.results_maxlen)");
    };
    ResultEntry::from_fields(&fields).map_err(|e| anyhow!("{e}"))?;
    Ok(result_json(&fields))
}

/// A result entry's fields as one JSON object, with the JSON-valued fields decoded.
pub fn result_json(fields: &HashMap<String, String>) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    for (name, value) in fields {
        let decoded = match name.as_str() {
            "result" | "error" | "metadata" | "request_ids" => {
                serde_json::from_str(value).unwrap_or_else(|_| serde_json::Value::String(value.clone()))
            }
            "accepted_at" | "finished_at" | "items_total" | "items_failed" => {
                value.parse::<u64>().map(serde_json::Value::from).unwrap_or_else(|_| value.clone().into())
            }
            _ => serde_json::Value::String(value.clone()),
        };
        object.insert(name.clone(), decoded);
    }
    serde_json::Value::Object(object)
}

/// `batchd status <id>`: the job's ledger.
pub async fn status(settings: &Settings, id: &str, json: bool) -> anyhow::Result<()> {
    let job_id = JobId::parse(id).map_err(|e| anyhow!("job id {id:?} {e}"))?;
    let keys = settings.keys();
    let mut conn = connect(settings).await?;
    let mut ledger: HashMap<String, String> = conn.hgetall(keys.job(&job_id)).await.context("read ledger")?;
    if ledger.is_empty() {
        return Err(Exit {
            code: EXIT_NOT_FOUND,
            message: format!(
                "no job {job_id} in namespace {} (never enqueued, not taken in yet, or its ledger expired)",
                keys.namespace()
            ),
        }
        .into());
    }
    // Chunk outputs and request items can be megabytes; status shows the timeline, not the payloads.
    ledger.retain(|name, _| !name.ends_with(":output") && !name.ends_with(":requests"));
    if json {
        let mut object = serde_json::Map::new();
        object.insert("job_id".into(), job_id.as_str().into());
        for (name, value) in &ledger {
            let decoded = serde_json::from_str::<serde_json::Value>(value)
                .ok()
                .filter(|v| v.is_object() || v.is_array())
                .unwrap_or_else(|| value.clone().into());
            object.insert(name.clone(), decoded);
        }
        println!("{}", serde_json::to_string_pretty(&serde_json::Value::Object(object))?);
        return Ok(());
    }
    print!("{}", status_text(&job_id, keys.namespace(), &ledger));
    Ok(())
}

/// The human-readable timeline of a job.
fn status_text(job_id: &JobId, namespace: &str, ledger: &HashMap<String, String>) -> String {
    let get = |name: &str| ledger.get(name).map(String::as_str).unwrap_or("-");
    let time = |name: &str| ledger.get(name).and_then(|ms| ms.parse::<u64>().ok()).map(format_utc).unwrap_or_else(|| "-".into());
    let mut out = format!("job {job_id} (namespace {namespace})\n");
    let mut line = |label: &str, value: String| out.push_str(&format!("  {label:<12} {value}\n"));
    line("state", get(field::STATE).to_owned());
    line("model", get(field::MODEL).to_owned());
    line("items", get(field::N_ITEMS).to_owned());
    line("accepted", time(field::ACCEPTED_AT));
    line("updated", time(field::UPDATED_AT));
    if ledger.contains_key(field::FINISHED_AT) {
        line("finished", time(field::FINISHED_AT));
    } else {
        line("deadline", time(field::DEADLINE_AT));
    }
    line("results to", get(field::REPLY_TO).to_owned());
    let n_chunks: u32 = get(field::N_CHUNKS).parse().unwrap_or(0);
    for index in 0..n_chunks {
        let chunk = |name: &str| ledger.get(&field::chunk(index, name)).cloned().unwrap_or_else(|| "-".into());
        line(
            &format!("chunk {index}"),
            format!(
                "{}  items {}  request {}  remote {}  polls {}  submit attempts {}",
                chunk(field::CHUNK_STATE),
                chunk(field::CHUNK_ITEMS),
                chunk(field::CHUNK_REQUEST_ID),
                chunk(field::CHUNK_REMOTE_STATUS),
                chunk(field::CHUNK_N_POLLS),
                chunk(field::CHUNK_ATTEMPTS),
            ),
        );
        if let Some(error) = ledger.get(&field::chunk(index, field::CHUNK_LAST_ERROR)) {
            line("", format!("last error {error}"));
        }
    }
    for (name, label) in [
        (field::DUPLICATES, "duplicates"),
        (field::POSSIBLE_DUPLICATE_SUBMITS, "resubmits"),
        (field::ERROR, "error"),
    ] {
        if let Some(value) = ledger.get(name) {
            line(label, value.clone());
        }
    }
    out
}

/// Formats Unix milliseconds as an RFC 3339 UTC timestamp with milliseconds.
pub fn format_utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let (hour, minute, second) = ((secs % 86_400) / 3600, (secs % 3600) / 60, secs % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{:03}Z", ms % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_utc(1_763_769_605_250), "2025-11-22T00:00:05.250Z");
        assert_eq!(format_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(redacted_url("redis://user:secret@host:6379/0"), "redis://[credentials]@host:6379/0");
        assert_eq!(redacted_url("redis://host:6379"), "redis://host:6379");
    }

    #[test]
    fn progress_names_each_chunks_remote_status() {
        let id = JobId::parse("inv-42").unwrap();
        let ledger: HashMap<String, String> = [
            ("state", "running"),
            ("n_chunks", "1"),
            ("c0:state", "polling"),
            ("c0:remote_status", "queued"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(progress_line(&id, &ledger), "inv-42: running (chunk 0: queued)");
        assert_eq!(progress_line(&id, &HashMap::new()), "inv-42: waiting for the daemon to take the job in");
    }
}
