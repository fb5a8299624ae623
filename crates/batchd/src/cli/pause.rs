//! `batchd pause` and `batchd resume`: stop and restart intake for a whole namespace, shared by every replica
//! through one key, `{ns}:paused` (a STRING; see `Keys::paused`).
//!
//! While the key exists, each replica's ingress fetcher reads no new entries from the submit stream (it checks once
//! per read round, so a pause takes effect once the read in flight returns, within `ingress.block_ms`); it keeps
//! reclaiming entries abandoned by dead replicas and handing back at shutdown, and every job already taken in runs
//! to its result. Paused replicas stay live and ready: `/readyz` answers 200 and its text says `paused`. The value
//! is informational (who paused, when, why), written by `pause` and shown by `stats`, `workers` and `/readyz`; any
//! value pauses, so `redis-cli SET '{batchd}:paused' 1` works too.

use anyhow::Context as _;
use batchd_core::Keys;
use batchd_queue::Conn;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{escape_for_terminal, format_utc, json_text, open, print_json};
use crate::settings::Settings;

/// Longest `by` or `reason` shown from a pause record (the key can be written by anyone with access to Redis).
const MAX_SHOWN_CHARS: usize = 200;

/// Options of `batchd pause`.
#[derive(Debug, Clone, clap::Args)]
pub struct PauseArgs {
    /// Why, shown by `stats`, `workers` and `/readyz`.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Print JSON: `{"namespace":..,"paused":true,"changed":..,"pause":{"by":..,"at":..,"reason":..}}`.
    #[arg(long)]
    pub json: bool,
}

/// Options of `batchd resume`.
#[derive(Debug, Clone, clap::Args)]
pub struct ResumeArgs {
    /// Print JSON: `{"namespace":..,"paused":false,"changed":..,"was":{..} or null}`.
    #[arg(long)]
    pub json: bool,
}

/// What the pause key holds: who paused intake, when (Redis's time) and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseRecord {
    /// Who paused: `user@host` of the `batchd pause` that wrote it, or the raw value when it is not a record.
    pub by: String,
    /// When, Unix ms (Redis's clock); `None` when the value is not a record.
    pub at: Option<u64>,
    /// Why, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl PauseRecord {
    /// Reads a pause key's value leniently: a record as `pause` writes it, or any other text as `by`.
    pub fn parse(value: &str) -> Self {
        serde_json::from_str(value).unwrap_or_else(|_| Self { by: value.to_owned(), at: None, reason: None })
    }

    /// `paused by alice@host at 2025-11-22T00:00:00.000Z: deploy freeze`, escaped and capped for a terminal or a
    /// probe's output.
    pub fn describe(&self) -> String {
        let mut text = format!("paused by {}", shown(&self.by));
        if let Some(at) = self.at {
            text.push_str(&format!(" at {}", format_utc(at)));
        }
        if let Some(reason) = &self.reason {
            text.push_str(&format!(": {}", shown(reason)));
        }
        text
    }

    /// As JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// The record back from [`Self::to_json`]; `None` for `null` (intake running).
    pub fn from_json(value: &serde_json::Value) -> Option<Self> {
        serde_json::from_value(value.clone()).ok()
    }
}

/// `text` escaped for a terminal and cut to [`MAX_SHOWN_CHARS`] characters.
fn shown(text: &str) -> String {
    let cut: String = text.chars().take(MAX_SHOWN_CHARS).collect();
    let ellipsis = if cut.len() < text.len() { "..." } else { "" };
    format!("{}{ellipsis}", escape_for_terminal(&cut))
}

/// The namespace's pause record, `None` while intake runs.
pub async fn read(conn: &mut Conn, keys: &Keys) -> anyhow::Result<Option<PauseRecord>> {
    let value = batchd_queue::inspect::pause_flag(conn, keys).await.context("read the pause flag")?;
    Ok(value.as_deref().map(PauseRecord::parse))
}

/// `user@host` of this process, for the pause record.
fn operator() -> String {
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|value| !value.is_empty()))
        .unwrap_or_else(|| "unknown".to_owned());
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|name| name.trim().to_owned()))
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{user}@{host}")
}

/// Redis's clock, Unix ms (the time that orders work between replicas).
pub(crate) async fn redis_now_ms(conn: &mut Conn) -> anyhow::Result<u64> {
    batchd_queue::inspect::redis_now(conn).await.context("read Redis's clock")
}

/// `batchd pause`: sets the pause key unless it is set already (the first pause is kept, so its time stays true).
pub async fn pause(settings: &Settings, args: &PauseArgs) -> anyhow::Result<()> {
    let keys = settings.keys();
    let mut conn = open(settings).await?;
    let record = PauseRecord { by: operator(), at: Some(redis_now_ms(&mut conn).await?), reason: args.reason.clone() };
    let value = serde_json::to_string(&record).context("encode the pause record")?;
    let changed =
        batchd_queue::inspect::set_pause_flag(&mut conn, &keys, &value).await.context("set the pause flag")?;
    let current = if changed { record } else { read(&mut conn, &keys).await?.unwrap_or(record) };
    if args.json {
        return print_json(&json!({
            "namespace": keys.namespace(),
            "paused": true,
            "changed": changed,
            "pause": current.to_json(),
        }));
    }
    if changed {
        println!(
            "intake of namespace {} {}; replicas stop reading the submit stream within ingress.block_ms ({} ms) and \
             finish the work they have",
            keys.namespace(),
            current.describe(),
            settings.ingress.block_ms
        );
    } else {
        println!("intake of namespace {} was already {}; nothing changed", keys.namespace(), current.describe());
    }
    Ok(())
}

/// `batchd resume`: deletes the pause key (`GETDEL`, so the message says whose pause ended).
pub async fn resume(settings: &Settings, args: &ResumeArgs) -> anyhow::Result<()> {
    let keys = settings.keys();
    let mut conn = open(settings).await?;
    let was = batchd_queue::inspect::clear_pause_flag(&mut conn, &keys).await.context("clear the pause flag")?;
    let was = was.as_deref().map(PauseRecord::parse);
    if args.json {
        let was = was.as_ref().map(PauseRecord::to_json).unwrap_or(serde_json::Value::Null);
        println!(
            "{}",
            json_text(
                &json!({"namespace": keys.namespace(), "paused": false, "changed": !was.is_null(), "was": was}),
                true
            )?
        );
        return Ok(());
    }
    match was {
        Some(was) => println!(
            "intake of namespace {} resumed (it was {}); replicas read the submit stream again within a second",
            keys.namespace(),
            was.describe()
        ),
        None => println!("intake of namespace {} was not paused; nothing changed", keys.namespace()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_record_reads_back_and_anything_else_still_says_who() {
        let record = PauseRecord { by: "ops@host".into(), at: Some(1_763_769_600_000), reason: Some("freeze".into()) };
        let text = serde_json::to_string(&record).unwrap();
        assert_eq!(text, r#"{"by":"ops@host","at":1763769600000,"reason":"freeze"}"#);
        assert_eq!(PauseRecord::parse(&text), record);
        assert_eq!(record.describe(), "paused by ops@host at 2025-11-22T00:00:00.000Z: freeze");
        let raw = PauseRecord::parse("1");
        assert_eq!(raw.describe(), "paused by 1");
    }

    #[test]
    fn what_a_pause_record_shows_is_escaped_and_capped() {
        let record = PauseRecord::parse(&format!("\u{1b}[2J{}", "x".repeat(500)));
        let text = record.describe();
        assert!(text.starts_with("paused by \\x1b[2Jxxx") && text.ends_with("x..."), "{text}");
        assert!(text.chars().count() < 230, "{text}");
    }
}
