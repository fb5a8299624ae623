//! `batchd dead list|show|retry|purge`: the dead-letter stream `{ns}:dead`, where the daemon copies ingress entries
//! that could not be read as a job (fields `source_id`, `error`, `dead_at`, and the original fields as
//! `field:<name>`).
//!
//! `retry` re-enqueues the original `job` field after validating it with the daemon's rules, and removes the
//! dead-letter entry in the same `MULTI`/`EXEC` (both keys share the namespace's hash tag).
//!
//! `purge` deletes for good, so it asks first on a terminal (`--yes` skips the question) and refuses to run without
//! `--yes` when standard input is not a terminal (a script must say it means it).
//!
//! Every field is a producer's input: text output escapes control and bidi characters, JSON output is made
//! terminal-safe (`escape_for_terminal`, `json_text`).

use std::collections::HashMap;
use std::io::{BufRead as _, IsTerminal as _, Write as _};

use anyhow::{Context as _, anyhow, bail};
use batchd_core::job::JOB_FIELD;
use batchd_core::{Job, Keys};
use batchd_queue::Conn;
use serde_json::json;

use super::{EXIT_USAGE, Exit, escape_for_terminal, format_utc, json_text, open, print_json};
use crate::settings::Settings;

/// The prefix of an original entry's fields in a dead-letter entry.
const FIELD_PREFIX: &str = "field:";

/// `batchd dead` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum DeadCommand {
    /// List dead-letter entries, the newest first.
    List {
        /// Show at most this many entries.
        #[arg(long, default_value_t = 50, value_name = "N")]
        limit: usize,
        /// Print JSON (an array of entries; original field values are left out, only their sizes are given).
        #[arg(long)]
        json: bool,
    },
    /// Show one dead-letter entry with its original fields.
    Show {
        /// The dead-letter entry id (from `dead list`).
        entry_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Re-enqueue the original `job` field of entries after checking it with the daemon's rules; an entry whose job
    /// is still invalid is refused and kept.
    Retry {
        /// Dead-letter entry ids.
        #[arg(required = true)]
        entry_ids: Vec<String>,
        /// Print one JSON object per requeued entry (`{"entry_id":..,"submit_entry_id":..,"job_id":..}`).
        #[arg(long)]
        json: bool,
    },
    /// Delete dead-letter entries (the given ones, or all with --all).
    Purge {
        /// Dead-letter entry ids (from `dead list`); give these or --all.
        #[arg(conflicts_with = "all")]
        entry_ids: Vec<String>,
        /// Delete every dead-letter entry of the namespace.
        #[arg(long)]
        all: bool,
        /// Do not ask for confirmation (required when standard input is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
        /// Print JSON: `{"namespace":..,"purged":N}`.
        #[arg(long)]
        json: bool,
    },
}

/// One dead-letter entry.
#[derive(Debug, Clone)]
struct DeadEntry {
    /// Its id in the dead-letter stream.
    id: String,
    /// Every field as stored.
    fields: HashMap<String, Vec<u8>>,
}

impl DeadEntry {
    fn text(&self, name: &str) -> String {
        self.fields.get(name).map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default()
    }

    /// A field as it is safe to print on a terminal.
    fn shown(&self, name: &str) -> String {
        escape_for_terminal(&self.text(name)).into_owned()
    }

    /// The original entry's fields, sorted by name.
    fn original(&self) -> Vec<(&str, &Vec<u8>)> {
        let mut fields: Vec<(&str, &Vec<u8>)> =
            self.fields.iter().filter_map(|(name, value)| Some((name.strip_prefix(FIELD_PREFIX)?, value))).collect();
        fields.sort_by_key(|(name, _)| *name);
        fields
    }

    fn dead_at(&self) -> String {
        self.text("dead_at").parse::<u64>().map(format_utc).unwrap_or_else(|_| "-".into())
    }

    fn summary_json(&self) -> serde_json::Value {
        let sizes: serde_json::Map<String, serde_json::Value> =
            self.original().into_iter().map(|(name, value)| (name.to_owned(), value.len().into())).collect();
        json!({
            "entry_id": self.id,
            "source_id": self.text("source_id"),
            "error": self.text("error"),
            "dead_at": self.text("dead_at").parse::<u64>().ok(),
            "field_bytes": sizes,
        })
    }
}

/// `batchd dead ...`.
pub async fn dead(settings: &Settings, command: &DeadCommand) -> anyhow::Result<()> {
    if let DeadCommand::Purge { entry_ids, all: false, .. } = command
        && entry_ids.is_empty()
    {
        return Err(Exit {
            code: EXIT_USAGE,
            message: "dead purge needs dead-letter entry ids (from `batchd dead list`), or --all to delete every \
                      entry (see --help)"
                .to_owned(),
        }
        .into());
    }
    let keys = settings.keys();
    let mut conn = open(settings).await?;
    let place = super::place(settings);
    match command {
        DeadCommand::List { limit, json } => list(&mut conn, &keys, &place, *limit, *json).await,
        DeadCommand::Show { entry_id, json } => show(&mut conn, &keys, &place, entry_id, *json).await,
        DeadCommand::Retry { entry_ids, json } => {
            for entry_id in entry_ids {
                retry(&mut conn, &keys, settings, entry_id, *json).await?;
            }
            Ok(())
        }
        DeadCommand::Purge { entry_ids, all, yes, json } => {
            purge(&mut conn, &keys, &place, entry_ids, *all, Confirm { yes: *yes, json: *json }).await
        }
    }
}

async fn read_range(
    conn: &mut Conn,
    key: &str,
    from: &str,
    to: &str,
    count: usize,
    newest_first: bool,
) -> anyhow::Result<Vec<DeadEntry>> {
    let entries: batchd_queue::inspect::Entries<Vec<u8>> =
        batchd_queue::inspect::entries(conn, key, from, to, count, newest_first)
            .await
            .with_context(|| format!("read {key}"))?;
    Ok(entries.into_iter().map(|(id, fields)| DeadEntry { id, fields }).collect())
}

async fn read_one(conn: &mut Conn, keys: &Keys, entry_id: &str) -> anyhow::Result<DeadEntry> {
    if !is_entry_id(entry_id) {
        bail!("{entry_id:?} is not a stream entry id (<ms>-<seq>, as `batchd dead list` shows)");
    }
    read_range(conn, &keys.dead(), entry_id, entry_id, 1, false).await?.into_iter().next().ok_or_else(|| {
        Exit::not_found(format!("no dead-letter entry {entry_id} in {} (see `batchd dead list`)", keys.dead()))
    })
}

fn is_entry_id(id: &str) -> bool {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    !ms.is_empty()
        && ms.bytes().all(|b| b.is_ascii_digit())
        && !seq.is_empty()
        && seq.bytes().all(|b| b.is_ascii_digit())
}

/// The newest `limit` dead-letter entries as `dead list --json` prints them (and the dashboard lists them): ids,
/// source, error, time and the original fields' sizes, never their values.
pub(crate) async fn list_json(conn: &mut Conn, keys: &Keys, limit: usize) -> anyhow::Result<Vec<serde_json::Value>> {
    let entries = read_range(conn, &keys.dead(), "-", "+", limit.max(1), true).await?;
    Ok(entries.iter().take(limit).map(DeadEntry::summary_json).collect())
}

async fn list(conn: &mut Conn, keys: &Keys, place: &str, limit: usize, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(&serde_json::Value::Array(list_json(conn, keys, limit).await?));
    }
    let entries = read_range(conn, &keys.dead(), "-", "+", limit.max(1), true).await?;
    let entries = &entries[..entries.len().min(limit)];
    let total = batchd_queue::inspect::stream_len(conn, &keys.dead()).await.context("count dead letters")?;
    let width = entries.iter().map(|e| e.id.len()).max().unwrap_or(0).max(8);
    let source_width = entries.iter().map(|e| e.shown("source_id").chars().count()).max().unwrap_or(0).max(9);
    println!("{:<width$}  {:<24}  {:<source_width$}  ERROR", "ENTRY ID", "DEAD AT", "SOURCE ID");
    for entry in entries {
        println!(
            "{:<width$}  {:<24}  {:<source_width$}  {}",
            entry.id,
            entry.dead_at(),
            entry.shown("source_id"),
            entry.shown("error")
        );
    }
    println!("{} of {total} dead-letter entries shown ({place})", entries.len());
    Ok(())
}

/// One dead-letter entry as `dead show --json` prints it (and the dashboard shows it): the summary and the
/// original fields' values as text.
pub(crate) async fn show_json(conn: &mut Conn, keys: &Keys, entry_id: &str) -> anyhow::Result<serde_json::Value> {
    let entry = read_one(conn, keys, entry_id).await?;
    let mut object = entry.summary_json();
    let fields: serde_json::Map<String, serde_json::Value> = entry
        .original()
        .into_iter()
        .map(|(name, value)| (name.to_owned(), String::from_utf8_lossy(value).into_owned().into()))
        .collect();
    object["fields"] = fields.into();
    Ok(object)
}

async fn show(conn: &mut Conn, keys: &Keys, place: &str, entry_id: &str, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(&show_json(conn, keys, entry_id).await?);
    }
    let entry = read_one(conn, keys, entry_id).await?;
    println!("dead-letter entry {} ({place})", entry.id);
    println!("  {:<12} {}", "source id", entry.shown("source_id"));
    println!("  {:<12} {}", "dead at", entry.dead_at());
    println!("  {:<12} {}", "error", entry.shown("error"));
    for (name, value) in entry.original() {
        println!("  field {} ({} bytes):", escape_for_terminal(name), value.len());
        println!("    {}", escape_for_terminal(&String::from_utf8_lossy(value)));
    }
    Ok(())
}

/// What re-enqueueing a dead letter did.
#[derive(Debug, Clone)]
pub(crate) struct Requeued {
    /// The new submit entry's id.
    pub submit_entry_id: String,
    /// The job id the daemon will run it as.
    pub job_id: String,
    /// The state of a ledger that already has this job id (the daemon then counts the entry as a duplicate).
    pub existing_state: Option<String>,
}

impl Requeued {
    /// As `dead retry --json` prints it.
    pub fn to_json(&self, entry_id: &str) -> serde_json::Value {
        serde_json::json!({"entry_id": entry_id, "submit_entry_id": self.submit_entry_id, "job_id": self.job_id})
    }
}

/// Re-enqueues dead-letter entry `entry_id`'s `job` field after checking it with the daemon's rules, through
/// batchd's `dead_retry` Redis function: the entry is deleted and the job enqueued only if that deleted it, so
/// concurrent retries of one entry enqueue it once (the others find it gone). An entry without a valid job is
/// refused and kept.
pub(crate) async fn requeue(
    conn: &mut Conn,
    keys: &Keys,
    settings: &Settings,
    entry_id: &str,
) -> anyhow::Result<Requeued> {
    let entry = read_one(conn, keys, entry_id).await?;
    let Some(job) = entry.fields.get(&format!("{FIELD_PREFIX}{JOB_FIELD}")) else {
        let names: Vec<&str> = entry.original().into_iter().map(|(name, _)| name).collect();
        let present =
            if names.is_empty() { "none".to_owned() } else { escape_for_terminal(&names.join(", ")).into_owned() };
        bail!("dead-letter entry {entry_id} has no `{JOB_FIELD}` field to retry (fields: {present}); kept");
    };
    let fields = [(JOB_FIELD.to_owned(), job.clone())];
    let validated = Job::decode(&fields, "0-0", &settings.job_limits(), keys).map_err(|e| {
        // The reason can quote the producer's text (a field name, say).
        let reason = escape_for_terminal(&e.to_string()).into_owned();
        anyhow!("dead-letter entry {entry_id} is still not a valid job: {reason}; kept")
    })?;
    let Some(submit_entry_id) =
        batchd_queue::functions::requeue_dead_letter(conn, keys, entry_id, job).await.context("re-enqueue")?
    else {
        // Another retry (or a purge) took it between the read and the move: enqueued once, by that one.
        return Err(Exit::not_found(format!(
            "no dead-letter entry {entry_id} in namespace {} any more (retried or purged meanwhile)",
            keys.namespace()
        )));
    };
    let has_id = std::str::from_utf8(job).is_ok_and(super::submit::has_id);
    let job_id = if has_id { validated.id.to_string() } else { submit_entry_id.clone() };
    let existing_state = if has_id {
        let view = batchd_queue::LedgerView::read(conn, keys, &validated.id).await.context("read ledger")?;
        view.and_then(|view| view.get(batchd_core::ledger::field::STATE).map(str::to_owned))
    } else {
        None
    };
    Ok(Requeued { submit_entry_id, job_id, existing_state })
}

async fn retry(conn: &mut Conn, keys: &Keys, settings: &Settings, entry_id: &str, json: bool) -> anyhow::Result<()> {
    let requeued = requeue(conn, keys, settings, entry_id).await?;
    let Requeued { submit_entry_id, job_id, existing_state } = &requeued;
    if json {
        println!("{}", json_text(&requeued.to_json(entry_id), false)?);
    } else {
        println!("requeued dead-letter entry {entry_id} as submit entry {submit_entry_id} (job {job_id})");
    }
    if let Some(state) = existing_state {
        eprintln!(
            "batchd: note: job {job_id} already has a ledger ({}); the daemon counts this entry as a duplicate of it \
             and does not run it again",
            escape_for_terminal(state)
        );
    }
    Ok(())
}

/// Deletes dead-letter entries `entry_ids`, all or none: every id is checked to exist first. Returns how many
/// were deleted.
pub(crate) async fn delete(conn: &mut Conn, keys: &Keys, entry_ids: &[String]) -> anyhow::Result<u64> {
    for entry_id in entry_ids {
        read_one(conn, keys, entry_id).await?;
    }
    batchd_queue::inspect::delete_dead_letters(conn, keys, entry_ids).await.context("purge")
}

/// How `purge` confirms and reports.
#[derive(Debug, Clone, Copy)]
struct Confirm {
    /// `--yes`: do not ask.
    yes: bool,
    /// `--json`: report as JSON.
    json: bool,
}

async fn purge(
    conn: &mut Conn,
    keys: &Keys,
    place: &str,
    entry_ids: &[String],
    all: bool,
    confirm: Confirm,
) -> anyhow::Result<()> {
    let n = if all {
        let total = batchd_queue::inspect::stream_len(conn, &keys.dead()).await.context("count dead letters")?;
        if total > 0 {
            confirmed(confirm, &format!("delete all {total} dead-letter entries of namespace {}?", keys.namespace()))
                .await?;
        }
        batchd_queue::inspect::purge_dead_letters(conn, keys).await.context("purge")?
    } else {
        // All or nothing: check every id before asking.
        for entry_id in entry_ids {
            read_one(conn, keys, entry_id).await?;
        }
        confirmed(
            confirm,
            &format!("delete {} dead-letter entries of namespace {}?", entry_ids.len(), keys.namespace()),
        )
        .await?;
        delete(conn, keys, entry_ids).await?
    };
    if confirm.json {
        return print_json(&serde_json::json!({"namespace": keys.namespace(), "purged": n}));
    }
    println!("purged {n} dead-letter entries ({place})");
    Ok(())
}

/// Asks `question` on a terminal unless `--yes` was given; without a terminal and without `--yes`, refuses (exit
/// code 2). Anything but `y` or `yes` is a no (exit code 1, nothing deleted).
async fn confirmed(confirm: Confirm, question: &str) -> anyhow::Result<()> {
    if confirm.yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(Exit {
            code: EXIT_USAGE,
            message: "dead purge deletes for good: give --yes to confirm (standard input is not a terminal, so there \
                      is no one to ask)"
                .to_owned(),
        }
        .into());
    }
    let question = question.to_owned();
    let answer = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let mut stderr = std::io::stderr();
        write!(stderr, "{question} [y/N] ")?;
        stderr.flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        Ok(answer)
    })
    .await
    .context("ask for confirmation")?
    .context("read the answer")?;
    if matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
        Ok(())
    } else {
        bail!("not confirmed; nothing deleted")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_are_checked_before_redis_sees_them() {
        assert!(is_entry_id("1763769600000-0"));
        assert!(is_entry_id("1763769600000"));
        assert!(!is_entry_id("abc"));
        assert!(!is_entry_id("1-"));
        assert!(!is_entry_id("-1"));
    }

    #[test]
    fn original_fields_are_listed_by_name() {
        let entry = DeadEntry {
            id: "1-0".into(),
            fields: [("source_id", "9-0"), ("field:payload", "x"), ("field:job", "{"), ("error", "bad")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
        };
        let names: Vec<&str> = entry.original().into_iter().map(|(name, _)| name).collect();
        assert_eq!(names, ["job", "payload"]);
        assert_eq!(entry.summary_json()["field_bytes"]["payload"], 1);
    }
}
