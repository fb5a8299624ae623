//! Log output: human-readable text for terminals or one JSON object per line, to standard error; or journald's
//! native protocol, with a priority per level and the fields as journal fields.
//!
//! `RUST_LOG` overrides `log.level`. Every info, warn and error event about a job carries its `job_id` (and
//! `chunk`) as fields of its own, so a job can be followed with one grep. The per-job spans are debug-level (at
//! info their fields would be formatted for every job, about 12% of the daemon's CPU); at `debug` their fields
//! (`request_id`, `model`, `attempt`) appear on the events inside them too.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

use crate::settings::{LogFormat, LogSettings};

/// The level filter: `RUST_LOG` when set and not empty, otherwise `log.level`. Its error names which one is wrong
/// (`batchd config check` and `batchd run` both call this, so a bad filter is refused the same way by both).
pub fn filter(settings: &LogSettings, rust_log: Option<&str>) -> Result<EnvFilter, String> {
    match rust_log {
        Some(value) if !value.is_empty() => EnvFilter::try_new(value).map_err(|e| format!("RUST_LOG: {e}")),
        _ => EnvFilter::try_new(&settings.level).map_err(|e| format!("log.level: {e}")),
    }
}

/// Where journald listens for its native protocol.
pub const JOURNALD_SOCKET: &str = "/run/systemd/journal/socket";

/// Checks what [`init`] needs, without installing anything: the filter parses, and journald is there when asked for.
pub fn check(settings: &LogSettings, rust_log: Option<&str>) -> Result<(), String> {
    filter(settings, rust_log)?;
    if settings.format == LogFormat::Journald && !std::path::Path::new(JOURNALD_SOCKET).exists() {
        return Err(format!("log.format: \"journald\" needs journald, and {JOURNALD_SOCKET} does not exist"));
    }
    Ok(())
}

/// Installs the global subscriber; returns an error if the level filter does not parse.
pub fn init(settings: &LogSettings) -> Result<(), String> {
    let filter = filter(settings, std::env::var("RUST_LOG").ok().as_deref())?;
    if settings.format == LogFormat::Journald {
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        let journald = tracing_journald::layer()
            .map_err(|e| format!("log.format: \"journald\": cannot reach {JOURNALD_SOCKET}: {e}"))?
            .with_syslog_identifier("batchd".to_owned())
            // Fields as they are named (JOB_ID, not F_JOB_ID), so `journalctl JOB_ID=...` finds a job.
            .with_field_prefix(None);
        return tracing_subscriber::registry()
            .with(journald.with_filter(filter))
            .try_init()
            .map_err(|e| format!("logging: {e}"));
    }
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match settings.format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_span_events(FmtSpan::NONE)
            .try_init(),
        LogFormat::Text => builder.with_target(false).with_ansi(std::io::stderr().is_terminal()).try_init(),
        LogFormat::Journald => unreachable!("handled above"),
    }
    .map_err(|e| format!("logging: {e}"))
}
