//! The operator CLI (the daemon itself is `batchd run`): `submit`, `status`, `cancel`, `uncancel`, `retry`, `tail`,
//! `jobs`, `failed`, `stats`, `workers`, `pause`, `resume`, `dead` and `probe`.
//!
//! Every human output names where it read ([`place`]: the namespace and the Redis endpoint, password masked), and
//! [`open`] warns on stderr when the default Redis is read because `REDIS_URL` is unset, or when the namespace
//! has never had a daemon.
//!
//! Commands talk to Redis directly with the daemon's own configuration and by the documented key layout
//! (docs/wire-format.md), so they work wherever a producer could enqueue. Errors are one line, printed by `main`;
//! exit codes are listed in `batchd --help` and docs/cli.md.
//!
//! Anything a command prints that came from Redis (a producer's job ids, metadata and fields, the API's statuses and
//! error messages) goes through [`escape_for_terminal`] or, for JSON, [`json_text`], so no control or bidi character
//! reaches the terminal raw: a producer cannot move the cursor, rewrite a line or reorder what follows.
//!
//! `NO_COLOR` (no-color.org) turns every styling off: clap's coloured help and errors, and the animated progress
//! bars and spinners (which then become plain lines, or nothing), see [`no_color`].

pub mod command;
pub mod cost;
pub mod dead;
pub mod endpoint;
pub mod events;
pub mod failed;
pub mod inspect;
pub mod models;
pub mod pause;
pub mod probe;
pub mod retry;
pub mod submit;
pub mod tail;
pub mod waits;
pub mod workers;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use batchd_core::ledger::field;
use batchd_core::{JobId, Keys};
use batchd_queue::{Conn, LedgerView};

use crate::settings::Settings;

pub use submit::{SubmitArgs, submit};

/// Exit code: the command line is wrong (unknown command or option, missing or bad argument).
pub const EXIT_USAGE: i32 = 2;
/// Exit code: the job ended `failed`, `expired` or `cancelled` (`submit --wait`).
pub const EXIT_JOB_FAILED: i32 = 3;
/// Exit code: gave up waiting (`submit --wait --timeout`, `tail --timeout`).
pub const EXIT_WAIT_TIMEOUT: i32 = 4;
/// Exit code: no such job or dead-letter entry.
pub const EXIT_NOT_FOUND: i32 = 5;
/// `submit --wait`: the job completed (wire format v1 `status: completed`) but every request item failed.
pub const EXIT_ALL_ITEMS_FAILED: i32 = 6;

/// The exit codes, as `batchd --help` shows them.
pub const EXIT_CODES_HELP: &str = "Exit codes:
  0   success (for `submit --wait`: the job completed)
  1   error (bad input, Redis unreachable, ...), with a one-line message on stderr; `probe`: not
      healthy or not reachable; `retry`: a job could not be retried
  2   usage error (unknown command or option, missing or bad argument, a --stream or --reply-to
      of another namespace; `dead purge` without --yes when standard input is not a terminal),
      one line on stderr
  3   `submit --wait`: the job ended failed, expired or cancelled, or was refused before it ran
  4   gave up waiting (`submit --wait --timeout`, `tail --timeout` before --count entries)
  5   not found: no such job (`status`; `cancel` without --before-arrival), no pending
      cancellation (`uncancel`), no such dead-letter entry (`dead show|retry|purge`)
  6   `submit --wait`: the job completed, but every one of its request items failed
  78  configuration error (bad or missing key); the message names the key and its environment
      variables";

/// An outcome the CLI reports through its exit code, with its one-line message.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Exit {
    /// Process exit code.
    pub code: i32,
    /// One line for stderr.
    pub message: String,
}

impl Exit {
    /// A "not found" outcome (exit code 5).
    pub fn not_found(message: impl Into<String>) -> anyhow::Error {
        Self { code: EXIT_NOT_FOUND, message: message.into() }.into()
    }
}

/// An error and its causes as one message, each cause once: a cause whose text its parent already holds (a
/// wrapper that prints its source, as `redis: {0}` does, and redis-rs's own "Connection refused (os error 111)"
/// repeated by the I/O error under it) is not repeated. Outer first, joined with `: `, as `{:#}` would.
pub fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        let cause = cause.trim();
        if cause.is_empty() || text.contains(cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(cause);
    }
    text
}

/// Whether styling is off: `NO_COLOR` is set to something other than the empty string (no-color.org). Then clap
/// prints no colours and progress is shown as plain lines (or not at all), never as an animated bar.
pub fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty())
}

/// Opens a connection for one command to whichever Redis is configured (standalone, TLS, Cluster, Sentinel);
/// fails fast (5 s) with a message naming the endpoint (without its password).
pub(crate) async fn connect(settings: &Settings) -> anyhow::Result<Conn> {
    let mut conn =
        settings.redis_endpoint()?.dedicated(Duration::from_secs(settings.redis.response_timeout_secs.max(5)));
    let reached = tokio::time::timeout(Duration::from_secs(5), batchd_queue::results::ping(&mut conn)).await;
    let url = settings.redis_label();
    match reached {
        Ok(Ok(_)) => Ok(conn),
        Ok(Err(error)) => Err(anyhow!(error).context(format!("cannot reach Redis at {url}"))),
        Err(_) => Err(anyhow!("no answer within 5 s").context(format!("cannot reach Redis at {url}"))),
    }
}

/// [`connect`] for an operator's command, then warnings on stderr, so that numbers from the wrong Redis cannot
/// pass for the right ones: when `REDIS_URL` is unset and the built-in default is read, and when the namespace has
/// no consumer group on its submit stream (no daemon ever ran there: a mistyped `--namespace`, or the wrong
/// Redis).
pub(crate) async fn open(settings: &Settings) -> anyhow::Result<Conn> {
    let url = settings.redis_label();
    // Before connecting: it explains a failure to connect too.
    if settings.redis_url_is_default(&std::env::vars().collect()) {
        eprintln!("batchd: warning: REDIS_URL is not set; using the default Redis at {url}");
    }
    let mut conn = connect(settings).await?;
    let keys = settings.keys();
    // A reader the ACL does not allow XINFO simply gets no warning.
    if let Ok(groups) = batchd_queue::inspect::groups(&mut conn, &keys.submit()).await
        && !groups.iter().any(|group| group.name.as_deref() == Some(batchd_core::keys::CONSUMER_GROUP))
    {
        eprintln!(
            "batchd: warning: namespace {} on {url} has no consumer group (no daemon has ever run in it): check \
             --namespace and REDIS_URL",
            keys.namespace()
        );
    }
    Ok(conn)
}

/// `namespace batchd on redis://127.0.0.1:6379`: where a command read, as its human output says (the endpoint with
/// its password masked, [`Settings::redis_label`]).
pub fn place(settings: &Settings) -> String {
    format!("namespace {} on {}", settings.redis.namespace, settings.redis_label())
}

/// A producer for namespace `keys` on `conn`, with the daemon's job limits and cancellation lifetime.
pub(crate) fn producer_on(settings: &Settings, conn: Conn, keys: Keys) -> anyhow::Result<batchd_producer::Producer> {
    let producer = batchd_producer::Producer::with_connection(settings.redis_endpoint()?, conn, keys);
    let ledger_ttl = Duration::from_secs(settings.retention.ledger_ttl_secs);
    Ok(producer.with_limits(settings.job_limits()).with_cancel_ttl(ledger_ttl))
}

/// Parses a job id given on the command line.
pub(crate) fn parse_job_id(id: &str) -> anyhow::Result<JobId> {
    JobId::parse(id).map_err(|e| anyhow!("job id {id:?} {e}"))
}

/// Prints a JSON value, pretty, with [`json_text`].
pub fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", json_text(value, true)?);
    Ok(())
}

/// Whether `c` must not reach a terminal as is: a control character (C0 such as NUL, backspace, CR and ESC; DEL;
/// C1 such as the 8-bit CSI) or a bidirectional-text control (the embeddings and overrides U+202A..U+202E, the
/// isolates U+2066..U+2069, and the marks U+061C, U+200E, U+200F), which reorders the text that follows it.
fn is_unsafe_for_terminal(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` made safe to print: each character [`is_unsafe_for_terminal`] is written as an escape (`\n`, `\r`, `\t`,
/// `\0`, `\x1b` for the other ASCII controls, `\u{202e}` beyond ASCII); everything else, backslashes included, is
/// left as it is (the escaping protects the terminal; it is not meant to be reversed). The one helper every command
/// prints producer or API text through.
pub fn escape_for_terminal(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe_for_terminal) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            '\t' => escaped.push_str("\\t"),
            '\0' => escaped.push_str("\\0"),
            c if c.is_ascii_control() => {
                let _ = write!(escaped, "\\x{:02x}", u32::from(c));
            }
            c if is_unsafe_for_terminal(c) => {
                let _ = write!(escaped, "\\u{{{:x}}}", u32::from(c));
            }
            c => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

/// `value` as JSON text (pretty, or on one line), safe for a terminal. serde_json escapes the C0 controls inside
/// strings (a raw newline left in its output is layout); the other characters [`is_unsafe_for_terminal`] (DEL, C1
/// and bidi controls) are written here as `\uXXXX` escapes, which only occur inside strings: the text stays valid
/// JSON and parses to the same value.
pub fn json_text(value: &serde_json::Value, pretty: bool) -> anyhow::Result<String> {
    let needs_escape = |c: char| u32::from(c) >= 0x7f && is_unsafe_for_terminal(c);
    let text = if pretty { serde_json::to_string_pretty(value) } else { serde_json::to_string(value) };
    let text = text.context("encode JSON")?;
    if !text.chars().any(needs_escape) {
        return Ok(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if needs_escape(c) {
            // Every such character is in the Basic Multilingual Plane: one `\uXXXX` each.
            let _ = write!(escaped, "\\u{:04x}", u32::from(c));
        } else {
            escaped.push(c);
        }
    }
    Ok(escaped)
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

/// A job's ledger without its payloads ([`LedgerView`]: header and chunk metadata by name; chunk outputs and
/// request items can be megabytes, the timeline is what `status` and the dashboard show). A job without a ledger
/// is "not found" (exit code 5).
pub(crate) async fn read_ledger(conn: &mut Conn, keys: &Keys, job_id: &JobId) -> anyhow::Result<LedgerView> {
    LedgerView::read(conn, keys, job_id).await.context("read ledger")?.ok_or_else(|| {
        Exit::not_found(format!(
            "no job {job_id} in namespace {} (never enqueued, not taken in yet, or its ledger expired)",
            keys.namespace()
        ))
    })
}

/// The ledger fields that hold numbers (times in Unix ms, counts, flags), printed as JSON numbers by
/// `status --json`, as `jobs --json` prints its times.
const NUMERIC_FIELDS: [&str; 14] = [
    field::N_CHUNKS,
    field::N_ITEMS,
    field::ACCEPTED_AT,
    field::UPDATED_AT,
    field::FINISHED_AT,
    field::DEADLINE_AT,
    field::DUPLICATES,
    field::POSSIBLE_DUPLICATE_SUBMITS,
    field::OPEN_CHUNKS,
    field::RETRY_FAILED_ITEMS,
    field::RETRIED,
    field::N_REFERENCES,
    field::CANCEL_SEEN_AT,
    field::RESULT_BYTES,
];

/// The per-chunk fields that hold numbers, likewise.
const NUMERIC_CHUNK_FIELDS: [&str; 7] = [
    field::CHUNK_ATTEMPTS,
    field::CHUNK_POLL_FAILURES,
    field::CHUNK_N_POLLS,
    field::CHUNK_SUBMITTED_AT,
    field::CHUNK_CLAIM,
    field::CHUNK_WOKEN_AT,
    field::CHUNK_UNCERTAIN,
];

/// A ledger as `status --json` prints it: `job_id` and every field read, by its ledger name (`c<i>:<name>` for a
/// chunk's); numbers (times in Unix ms, counts) as JSON numbers, JSON-valued fields (errors, metadata) decoded.
pub(crate) fn status_json(view: &LedgerView) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    object.insert("job_id".into(), view.job_id.as_str().into());
    for (name, value) in view.fields() {
        let numeric = match name.split_once(field::CHUNK_SEPARATOR) {
            Some((_, chunk_name)) => NUMERIC_CHUNK_FIELDS.contains(&chunk_name),
            None => NUMERIC_FIELDS.contains(&name.as_str()),
        };
        let decoded = match value.parse::<u64>() {
            Ok(number) if numeric => number.into(),
            _ => serde_json::from_str::<serde_json::Value>(value)
                .ok()
                .filter(|v| v.is_object() || v.is_array())
                .unwrap_or_else(|| value.into()),
        };
        object.insert(name, decoded);
    }
    if let Some(bytes) = view.metadata_bytes {
        // Left out for its size (a producer's); `retry` still carries it over.
        object.insert("metadata_bytes".into(), bytes.into());
    }
    serde_json::Value::Object(object)
}

/// `batchd status <id>`: the job's ledger as a timeline. With `json`, an unknown job is also a JSON object on
/// standard output (`{"job_id":..,"error":{"code":"not_found","message":..}}`), with exit code 5 as ever.
pub async fn status(settings: &Settings, id: &str, json: bool) -> anyhow::Result<()> {
    let job_id = parse_job_id(id)?;
    let keys = settings.keys();
    let mut conn = open(settings).await?;
    let view = match read_ledger(&mut conn, &keys, &job_id).await {
        Ok(view) => view,
        Err(error) if json => {
            if let Some(exit) = error.downcast_ref::<Exit>().filter(|exit| exit.code == EXIT_NOT_FOUND) {
                print_json(&serde_json::json!({
                    "job_id": job_id.as_str(),
                    "error": {"code": "not_found", "message": exit.message},
                }))?;
            }
            return Err(error);
        }
        Err(error) => return Err(error),
    };
    let now = now_ms();
    let usuals = if batchd_queue::turnaround::any_at_remote(&view) {
        batchd_queue::turnaround::usuals(&mut conn, &keys, now).await.context("read the usual batch times")?
    } else {
        Default::default()
    };
    let at_remote = batchd_queue::turnaround::at_remote(&view, &usuals, now);
    let waits = waits::read(&mut conn, &keys, &view, settings.budget.for_namespace(keys.namespace())).await?;
    if json {
        let mut object = status_json(&view);
        object["at_remote"] = serde_json::to_value(&at_remote).context("encode the batches at the remote API")?;
        object["waits"] = waits::json(&waits);
        return print_json(&object);
    }
    print!("{}", status_text(&place(settings), &view, (&at_remote, &waits), now));
    Ok(())
}

/// Most characters of a job's metadata `status` shows (it is the producer's; `--json` has it whole, up to
/// `METADATA_SHOWN_BYTES`).
const METADATA_SHOWN_CHARS: usize = 400;

/// The human-readable timeline of a job: its header, its metadata, its error field by field, and each chunk's
/// state, remote status and last error; a chunk whose remote batch runs shows its age at `now_ms` and, from
/// `at_remote`, how that compares with its model's usual time.
fn status_text(
    place: &str,
    view: &LedgerView,
    (at_remote, waits): (&[batchd_queue::turnaround::AtRemote], &waits::Waits),
    now_ms: u64,
) -> String {
    let get = |name: &str| view.get(name).unwrap_or("-");
    let time = |name: &str| view.number(name).map(format_utc).unwrap_or_else(|| "-".into());
    let mut out = format!("job {} ({place})\n", view.job_id);
    // Every value comes from the ledger: producer input and API text, escaped.
    let mut line = |label: &str, value: String| {
        out.push_str(&format!("  {label:<12} {}\n", escape_for_terminal(&value)));
    };
    line("state", get(field::STATE).to_owned());
    line("model", get(field::MODEL).to_owned());
    line("items", get(field::N_ITEMS).to_owned());
    line("accepted", time(field::ACCEPTED_AT));
    line("updated", time(field::UPDATED_AT));
    if view.header.contains_key(field::FINISHED_AT) {
        line("finished", time(field::FINISHED_AT));
    } else {
        line("deadline", time(field::DEADLINE_AT));
    }
    line("results to", get(field::REPLY_TO).to_owned());
    match (view.get(field::METADATA), view.metadata_bytes) {
        (_, Some(bytes)) => line("metadata", format!("({bytes} bytes, not shown; `status --json` neither)")),
        (Some(metadata), None) if metadata.chars().count() > METADATA_SHOWN_CHARS => {
            let shown: String = metadata.chars().take(METADATA_SHOWN_CHARS).collect();
            line("metadata", format!("{shown}... ({} bytes; `status --json` has it whole)", metadata.len()));
        }
        (Some(metadata), None) => line("metadata", metadata.to_owned()),
        (None, None) => {}
    }
    if let Some(error) = view.error() {
        error_lines(&mut line, "error", &error);
    }
    for (index, chunk) in view.chunks.iter().enumerate() {
        let value = |name: &str| chunk.get(name).unwrap_or("-").to_owned();
        // The dashboard's wording: a chunk left unfinished when its job ended says so, a done one is not "running".
        let status = chunk.status(view.state());
        line(
            &format!("chunk {index}"),
            format!(
                "{}  items {}  request {}  remote {}  polls {}  submit attempts {}",
                status.state,
                value(field::CHUNK_ITEMS),
                value(field::CHUNK_REQUEST_ID),
                status.remote,
                value(field::CHUNK_N_POLLS),
                value(field::CHUNK_ATTEMPTS),
            ),
        );
        let running_for = chunk
            .get(field::CHUNK_SUBMITTED_AT)
            .and_then(|at| at.parse::<u64>().ok())
            .filter(|_| chunk.get(field::CHUNK_STATE) == Some(batchd_core::ledger::ChunkState::Polling.as_str()))
            .map(|at| format_age(Duration::from_millis(now_ms.saturating_sub(at))));
        // The batch's age, against its model's usual time when that was read (a ledger without the submit time is
        // compared by the job's age).
        match (running_for, at_remote.iter().find(|remote| remote.chunk == index)) {
            (Some(age), Some(remote)) => line("", format!("batch running for {age}; {}", remote.text)),
            (Some(age), None) => line("", format!("batch running for {age}")),
            (None, Some(remote)) => {
                let age = format_age(Duration::from_secs(remote.age_secs));
                line("", format!("job accepted {age} ago; {}", remote.text));
            }
            (None, None) => {}
        }
        if let Some(wait) = waits::wait_text(waits, index, chunk, now_ms) {
            line("", wait);
        }
        match chunk.get(field::CHUNK_PACK) {
            Some(batchd_core::ids::PACK_QUEUED) => line("", waits::pack_text(waits.pack_due, now_ms)),
            Some(pack) => line("", format!("packed in {pack} with other jobs (`batchd status {pack}`)")),
            None => {}
        }
        if let Some(error) = chunk.last_error() {
            error_lines(&mut line, "", &error);
        }
    }
    if let Some(members) = view.get(field::PACK_MEMBERS) {
        line("pack of", format!("{members} jobs (their items, in order, make this remote batch)"));
    }
    for (name, label) in [(field::DUPLICATES, "duplicates"), (field::POSSIBLE_DUPLICATE_SUBMITS, "resubmits")] {
        if let Some(value) = view.header.get(name) {
            line(label, value.clone());
        }
    }
    out
}

/// An error as `status` shows it, one field a line: its code (under `label`), then its message, HTTP status and
/// provider's code when it has them.
fn error_lines(line: &mut impl FnMut(&str, String), label: &str, error: &batchd_queue::ledger_view::ErrorFields) {
    let fields = [error.code.is_some(), error.http_status.is_some(), error.api_code.is_some()];
    if let (Some(message), [false, false, false]) = (&error.message, fields) {
        // Not an error batchd wrote as JSON: shown as it is.
        if label.is_empty() {
            line("", format!("last error {message}"));
        } else {
            line(label, message.clone());
        }
        return;
    }
    let code = error.code.as_deref().unwrap_or("-");
    if label.is_empty() {
        line("", format!("last error {code}"));
    } else {
        line(label, code.to_owned());
    }
    for (name, value) in [
        ("message", error.message.clone()),
        ("http status", error.http_status.map(|status| status.to_string())),
        ("api code", error.api_code.clone()),
    ] {
        if let Some(value) = value {
            line("", format!("  {name:<11} {value}"));
        }
    }
}

/// `batchd cancel <id>`: requests the job's cancellation through batchd's `cancel` Redis function: it sets the
/// documented flag `{ns}:cancel:<id>` and makes the job's steps due at once, so a replica publishes the `cancelled`
/// result right away. A finished job is not changed. A job that was never taken in is "not found" (exit code 5:
/// a mistyped id would otherwise cancel a future job silently) unless `before_arrival` is given; then the request
/// waits for the job (`batchd uncancel` withdraws it).
///
/// With `json`: `{"job_id":..,"outcome":"requested"|"already_finished"|"not_taken_in","state":..}`.
pub async fn cancel(
    settings: &Settings,
    id: &str,
    reason: &str,
    before_arrival: bool,
    json: bool,
) -> anyhow::Result<()> {
    use batchd_producer::CancelOutcome;
    let job_id = parse_job_id(id)?;
    let keys = settings.keys();
    let mut conn = open(settings).await?;
    if !before_arrival && !batchd_queue::inspect::job_exists(&mut conn, &keys, &job_id).await.context("read ledger")? {
        return Err(Exit::not_found(format!(
            "no job {job_id} in namespace {} (not taken in yet, never enqueued, or its ledger expired); to cancel \
             it when it arrives, within {}s, add --before-arrival",
            keys.namespace(),
            settings.retention.ledger_ttl_secs
        )));
    }
    let producer = producer_on(settings, conn, keys)?;
    let outcome = producer.cancel(&job_id, reason).await.map_err(|e| anyhow!("cancel job {job_id}: {e}"))?;
    if json {
        let (outcome, state) = match outcome {
            CancelOutcome::AlreadyFinished(state) => ("already_finished", Some(state.as_str())),
            CancelOutcome::Requested(Some(state)) => ("requested", Some(state.as_str())),
            CancelOutcome::Requested(None) => ("not_taken_in", None),
        };
        return print_json(&serde_json::json!({"job_id": job_id.as_str(), "outcome": outcome, "state": state}));
    }
    match outcome {
        CancelOutcome::AlreadyFinished(state) => println!("job {job_id} already ended {state}; nothing to cancel"),
        CancelOutcome::Requested(Some(state)) => println!(
            "cancellation of job {job_id} ({state}) requested; the daemon publishes its cancelled result at once"
        ),
        CancelOutcome::Requested(None) => println!(
            "cancellation of job {job_id} requested; it is not taken in yet, and is never submitted if it arrives \
             within {}s (batchd uncancel {job_id} withdraws the request)",
            settings.retention.ledger_ttl_secs
        ),
    }
    Ok(())
}

/// `batchd uncancel <id>`: withdraws a pending cancellation request (one made with `cancel --before-arrival`
/// for a job not taken in yet, or one the daemon has not acted on). A job already cancelled stays cancelled. No
/// request is "not found" (exit code 5).
pub async fn uncancel(settings: &Settings, id: &str, json: bool) -> anyhow::Result<()> {
    let job_id = parse_job_id(id)?;
    let keys = settings.keys();
    let mut conn = open(settings).await?;
    let Some(reason) =
        batchd_queue::inspect::withdraw_cancel(&mut conn, &keys, &job_id).await.context("withdraw the request")?
    else {
        return Err(Exit::not_found(format!(
            "no cancellation of job {job_id} is pending in namespace {}",
            keys.namespace()
        )));
    };
    if json {
        return print_json(&serde_json::json!({"job_id": job_id.as_str(), "withdrawn": true, "reason": reason}));
    }
    println!("cancellation of job {job_id} withdrawn (its reason was {:?})", escape_for_terminal(&reason));
    Ok(())
}

/// Formats Unix milliseconds as an RFC 3339 UTC timestamp with milliseconds (`2025-11-22T00:00:05.250Z`). A time
/// past the year 9999, which batchd never writes but a hand-edited ledger may hold, is shown as its Unix ms.
pub fn format_utc(ms: u64) -> String {
    let mut text = String::new();
    match std::time::UNIX_EPOCH.checked_add(Duration::from_millis(ms)) {
        Some(time) if write!(text, "{}", humantime::format_rfc3339_millis(time)).is_ok() => text,
        _ => ms.to_string(),
    }
}

/// A duration for humans: `850ms`, `12.3s`, `4m05s`, `2h03m`.
pub fn format_age(age: Duration) -> String {
    let ms = age.as_millis() as u64;
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// This machine's wall clock in Unix ms, for ages shown to people.
pub(crate) use batchd_queue::now_ms;

/// The results stream a `--stream` or `--reply-to` option names, which takes either form: the full key
/// (`{ns}:results`, `{ns}:results:billing`) or the suffix after `{ns}:results:` (`billing`); the namespace's
/// default stream when the option is not given. Anything else (another namespace's stream, a bad suffix) is a usage
/// error (exit code 2) naming `option`.
pub(crate) fn results_stream(keys: &batchd_core::Keys, option: &str, given: Option<&str>) -> anyhow::Result<String> {
    let Some(given) = given else {
        return Ok(keys.results());
    };
    let results = keys.results();
    let full_key = given.starts_with('{') || given == results || given.starts_with(&format!("{results}:"));
    let stream = if full_key { given.to_owned() } else { format!("{results}:{given}") };
    if keys.is_results_stream(&stream) {
        return Ok(stream);
    }
    let why = if full_key {
        format!("not a results stream of namespace {}", keys.namespace())
    } else {
        "a suffix is 1-200 characters of A-Z a-z 0-9 . _ : -".to_owned()
    };
    Err(Exit {
        code: EXIT_USAGE,
        message: format!(
            "{option} {:?}: {why} (give {results}:<suffix>, or just <suffix>)",
            escape_for_terminal(given)
        ),
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_utc(1_763_769_605_250), "2025-11-22T00:00:05.250Z");
        assert_eq!(format_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(format_utc(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        assert_eq!(format_utc(u64::MAX), "18446744073709551615", "past the year 9999: the number");
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(format_age(Duration::from_millis(850)), "850ms");
        assert_eq!(format_age(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(format_age(Duration::from_secs(245)), "4m05s");
        assert_eq!(format_age(Duration::from_secs(7380)), "2h03m");
    }

    /// Every character a producer could use to take over a terminal, with how it is shown.
    const HOSTILE: [(char, &str); 14] = [
        ('\u{1b}', "\\x1b"),
        ('\r', "\\r"),
        ('\n', "\\n"),
        ('\t', "\\t"),
        ('\u{8}', "\\x08"),
        ('\0', "\\0"),
        ('\u{7f}', "\\x7f"),
        ('\u{9b}', "\\u{9b}"),
        ('\u{202a}', "\\u{202a}"),
        ('\u{202e}', "\\u{202e}"),
        ('\u{2066}', "\\u{2066}"),
        ('\u{2069}', "\\u{2069}"),
        ('\u{200f}', "\\u{200f}"),
        ('\u{61c}', "\\u{61c}"),
    ];

    #[test]
    fn control_and_bidi_characters_are_escaped_for_the_terminal() {
        for (c, shown) in HOSTILE {
            assert_eq!(escape_for_terminal(&format!("a{c}b")), format!("a{shown}b"), "{c:?}");
        }
        assert_eq!(escape_for_terminal("\u{1b}[2J\u{1b}]0;pwned\u{7}job-1\r"), "\\x1b[2J\\x1b]0;pwned\\x07job-1\\r");
        let plain = "inv-42 naïve 東京 🙂 C:\\path {\"a\":\"\\n\"}";
        assert!(matches!(escape_for_terminal(plain), Cow::Borrowed(text) if text == plain), "left alone, not copied");
        for c in '\u{202a}'..='\u{202e}' {
            assert!(is_unsafe_for_terminal(c), "{c:?}");
        }
        for c in '\u{2066}'..='\u{2069}' {
            assert!(is_unsafe_for_terminal(c), "{c:?}");
        }
    }

    #[test]
    fn json_output_stays_valid_json_with_nothing_raw_for_the_terminal() {
        let hostile: String = HOSTILE.iter().map(|(c, _)| *c).collect();
        let value = serde_json::json!({"job_id": format!("x{hostile}y"), hostile.clone(): [hostile.clone(), 1]});
        for pretty in [false, true] {
            let text = json_text(&value, pretty).unwrap();
            let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(parsed, value, "same value once parsed");
            let raw: Vec<char> = text.chars().filter(|c| *c != '\n' && is_unsafe_for_terminal(*c)).collect();
            assert!(raw.is_empty(), "raw {raw:?} in {text}");
            assert!(text.contains("\\u202e") && text.contains("\\u001b") && text.contains("\\u009b"), "{text}");
        }
        assert!(!json_text(&value, false).unwrap().contains('\n'), "one line");
    }

    #[test]
    fn status_escapes_what_the_ledger_holds() {
        let view = LedgerView {
            job_id: JobId::parse("inv-1").unwrap(),
            metadata_bytes: None,
            header: [
                (field::STATE, "failed"),
                (field::MODEL, "@cf/x/y"),
                (field::N_CHUNKS, "1"),
                (field::ERROR, "api_error: bad\u{1b}[2J \u{202e}txt"),
            ]
            .iter()
            .map(|(k, v)| (*k, v.to_string()))
            .collect(),
            chunks: vec![batchd_queue::ledger_view::ChunkMetadata {
                fields: [
                    (field::CHUNK_STATE, "failed"),
                    (field::CHUNK_REQUEST_ID, "r\u{1b}]0;title\u{7}"),
                    (field::CHUNK_REMOTE_STATUS, "\u{1b}[31mred"),
                ]
                .iter()
                .map(|(k, v)| (*k, v.to_string()))
                .collect(),
            }],
        };
        let text = status_text("ns", &view, (&[], &Default::default()), 0);
        assert!(!text.chars().any(|c| c != '\n' && is_unsafe_for_terminal(c)), "{text}");
        assert!(text.contains("remote last seen \\x1b[31mred"), "{text}");
        assert!(text.contains("bad\\x1b[2J \\u{202e}txt") && text.contains("request r\\x1b]0;title\\x07"), "{text}");
    }

    #[test]
    fn each_cause_is_shown_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
        let redis = redis::RedisError::from(io);
        let error = anyhow::Error::new(batchd_queue::StoreError::Redis(redis)).context("cannot reach Redis at x");
        assert_eq!(error_text(&error), "cannot reach Redis at x: redis: Connection refused (os error 111)");
        let plain = anyhow!("inner").context("middle").context("outer");
        assert_eq!(error_text(&plain), "outer: middle: inner");
    }

    #[test]
    fn status_shows_how_long_a_running_batch_has_run() {
        let chunk = |state: &str| batchd_queue::ledger_view::ChunkMetadata {
            fields: [(field::CHUNK_STATE, state), (field::CHUNK_SUBMITTED_AT, "1000")]
                .iter()
                .map(|(k, v)| (*k, v.to_string()))
                .collect(),
        };
        let view = LedgerView {
            job_id: JobId::parse("inv-2").unwrap(),
            metadata_bytes: None,
            header: [(field::STATE, "running"), (field::N_CHUNKS, "2"), (field::MODEL, "m"), (field::ACCEPTED_AT, "0")]
                .iter()
                .map(|(k, v)| (*k, v.to_string()))
                .collect(),
            chunks: vec![chunk("polling"), chunk("done")],
        };
        let text = status_text("namespace ns", &view, (&[], &Default::default()), 1000 + 245_000);
        assert_eq!(text.matches("batch running for").count(), 1, "only the polling chunk: {text}");
        assert!(text.contains("batch running for 4m05s"), "{text}");
        assert!(text.contains("remote finished, results read"), "the dashboard's wording for a done chunk: {text}");
        // Against the model's usual time: 10 batches, p95 within a minute, and this job is 4 minutes old.
        let mut buckets = [0; batchd_core::turnaround::BOUNDS_SECS.len() + 1];
        buckets[0] = 10;
        let usuals = batchd_queue::turnaround::Usuals {
            models: [("m".to_owned(), batchd_core::turnaround::Usual::of(&buckets).unwrap())].into(),
            hours_skipped: 0,
        };
        let at_remote = batchd_queue::turnaround::at_remote(&view, &usuals, 1000 + 245_000);
        assert_eq!(at_remote.len(), 1, "only the polling chunk");
        assert!(at_remote[0].older_than_p95);
        let text = status_text("namespace ns", &view, (&at_remote, &Default::default()), 1000 + 245_000);
        assert!(
            text.contains(
                "usual for m: p50 ≤ 1m, p95 ≤ 1m (10 batches, last 24 h); older than 95% of this model's batches"
            ),
            "{text}"
        );
        let none = batchd_queue::turnaround::at_remote(&view, &Default::default(), 1000 + 245_000);
        assert!(
            status_text("ns", &view, (&none, &Default::default()), 1000 + 245_000)
                .contains("usual for m: no history yet")
        );
        // The batch's age is compared, not the job's: this job waited 4 minutes for its submit, and its batch has
        // been at the remote API for 5 seconds, within the usual minute.
        let mut waited = view.clone();
        waited.chunks[0].fields.insert(field::CHUNK_SUBMITTED_AT, (1000 + 240_000).to_string());
        let at_remote = batchd_queue::turnaround::at_remote(&waited, &usuals, 1000 + 245_000);
        assert_eq!((at_remote[0].age_secs, at_remote[0].batch_age_secs), (5, Some(5)));
        assert!(!at_remote[0].older_than_p95, "{at_remote:?}");
        let text = status_text("namespace ns", &waited, (&at_remote, &Default::default()), 1000 + 245_000);
        assert!(text.contains("batch running for 5.0s; usual for m"), "{text}");
    }

    #[test]
    fn passwords_are_not_shown() {
        use crate::settings::redact_url;
        assert_eq!(redact_url("redis://user:secret@host:6379/0"), "redis://user:[redacted]@host:6379/0");
        assert_eq!(redact_url("redis://:secret@host:6379"), "redis://:[redacted]@host:6379");
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
    }
}
