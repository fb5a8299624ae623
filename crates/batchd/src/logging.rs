//! Log output: human-readable text for terminals or one JSON object per line, to standard error.
//!
//! `RUST_LOG` overrides `log.level`. Every info, warn and error event about a job carries its `job_id` (and
//! `chunk`) as fields of its own, so a job can be followed with one grep. The per-job spans are debug-level (at
//! info their fields would be formatted for every job, about 12% of the daemon's CPU); at `debug` their fields
//! (`request_id`, `model`, `attempt`) appear on the events inside them too.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

use crate::settings::{LogFormat, LogSettings};

/// Installs the global subscriber; returns an error if the level filter does not parse.
pub fn init(settings: &LogSettings) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(value) if !value.is_empty() => EnvFilter::try_new(&value).map_err(|e| format!("RUST_LOG: {e}"))?,
        _ => EnvFilter::try_new(&settings.level).map_err(|e| format!("configuration: log.level: {e}"))?,
    };
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
    }
    .map_err(|e| format!("logging: {e}"))
}
