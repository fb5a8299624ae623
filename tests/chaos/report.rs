//! The chaos report: a text table for the terminal and `docs/reliability.md`, and JSON for machines
//! (`target/chaos/report.json`).

use std::path::Path;

use super::check::{Outcome, ProviderCounts};
use super::human;

/// The columns of the table.
const HEADER: [&str; 11] = [
    "scenario",
    "jobs",
    "kills",
    "restarts",
    "lost",
    "dup. results",
    "dup. submits",
    "excused",
    "recovery",
    "wall",
    "verdict",
];

/// `0`, or the number with the kinds of evidence that excused them: `34 (9 kills, anthropic looks)`.
fn duplicate_submits(outcome: &Outcome) -> String {
    if outcome.duplicate_submits == 0 {
        return "0".to_owned();
    }
    let mut causes = Vec::new();
    if outcome.kills_in_submit_window > 0 {
        causes.push(format!("{} kills", outcome.kills_in_submit_window));
    }
    let has = |prefix: &str| outcome.duplicate_causes.keys().any(|cause| cause.starts_with(prefix));
    if has("workers ai: redis") {
        causes.push("redis away > lease".to_owned());
    }
    if has("workers ai: sent before a SIGSTOP") {
        causes.push("frozen past lease".to_owned());
    }
    if has("anthropic look") {
        causes.push("anthropic looks".to_owned());
    }
    if has("openai look") {
        causes.push("past the openai look's reach".to_owned());
    }
    format!("{} ({})", outcome.duplicate_submits, causes.join(", "))
}

/// One row per outcome, as cells.
fn rows(outcomes: &[Outcome]) -> Vec<[String; 11]> {
    outcomes
        .iter()
        .map(|outcome| {
            [
                outcome.scenario.clone(),
                outcome.jobs.to_string(),
                outcome.kills.to_string(),
                outcome.restarts.to_string(),
                outcome.lost.len().to_string(),
                outcome.duplicated_results.len().to_string(),
                duplicate_submits(outcome),
                outcome.excused_duplicates().to_string(),
                outcome.recovery.map_or("-".to_owned(), human),
                human(outcome.wall),
                if outcome.passed() { "pass".to_owned() } else { format!("FAIL ({})", outcome.failures.len()) },
            ]
        })
        .collect()
}

/// The columns of the per-provider table.
const PROVIDER_HEADER: [&str; 14] = [
    "scenario",
    "provider",
    "jobs",
    "lost",
    "batches",
    "polls/batch",
    "calls",
    "faults",
    "dup. submits",
    "excused (by kind)",
    "creates cut by a kill",
    "uncertain creates",
    "found by a look",
    "list calls",
];

/// The excused count with its kinds: `9 (5 kill, 4 on the wire)`.
fn excused_by_kind(counts: &ProviderCounts) -> String {
    if counts.excused == 0 {
        return "0".to_owned();
    }
    let kinds: Vec<String> = counts
        .excused_by
        .iter()
        .map(|(kind, n)| format!("{n} {}", kind.split_once(": ").map_or(kind.as_str(), |(_, what)| what)))
        .collect();
    format!("{} ({})", counts.excused, kinds.join(", "))
}

/// One row per scenario and provider its jobs went to.
fn provider_rows(outcomes: &[Outcome]) -> Vec<[String; 14]> {
    outcomes
        .iter()
        .flat_map(|outcome| {
            outcome.providers.iter().map(|(provider, counts)| {
                [
                    outcome.scenario.clone(),
                    provider.as_str().to_owned(),
                    counts.jobs.to_string(),
                    counts.lost.to_string(),
                    counts.batches.to_string(),
                    format!("{:.2}", counts.polls_per_batch()),
                    counts.calls.to_string(),
                    counts.faults.to_string(),
                    counts.duplicate_submits.to_string(),
                    excused_by_kind(counts),
                    counts.interrupted_by_kill.to_string(),
                    counts.uncertain_creates.to_string(),
                    counts.uncertain_found.to_string(),
                    counts.list_calls.to_string(),
                ]
            })
        })
        .collect()
}

/// The main table as aligned plain text.
pub fn table(outcomes: &[Outcome]) -> String {
    aligned(&HEADER, &rows(outcomes))
}

/// The per-provider table as aligned plain text.
pub fn provider_table(outcomes: &[Outcome]) -> String {
    aligned(&PROVIDER_HEADER, &provider_rows(outcomes))
}

/// The main table as Markdown.
pub fn markdown(outcomes: &[Outcome]) -> String {
    markdown_of(&HEADER, &rows(outcomes))
}

/// The per-provider table as Markdown.
pub fn provider_markdown(outcomes: &[Outcome]) -> String {
    markdown_of(&PROVIDER_HEADER, &provider_rows(outcomes))
}

/// `header` and `rows` as aligned plain text.
fn aligned<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut text = line(header.to_vec());
    text.push('\n');
    text.push_str(&line(
        widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().iter().map(String::as_str).collect(),
    ));
    text.push('\n');
    for row in rows {
        text.push_str(&line(row.iter().map(String::as_str).collect()));
        text.push('\n');
    }
    text
}

/// `header` and `rows` as a Markdown table.
fn markdown_of<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut text = format!("| {} |\n|{}\n", header.join(" | "), "---|".repeat(N));
    for row in rows {
        text.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    text
}

/// One outcome as JSON.
pub fn json(outcome: &Outcome) -> serde_json::Value {
    serde_json::json!({
        "scenario": outcome.scenario,
        "title": outcome.title,
        "size": outcome.size.as_str(),
        "passed": outcome.passed(),
        "jobs": outcome.jobs,
        "kills": outcome.kills,
        "restarts": outcome.restarts,
        "lost": outcome.lost.len(),
        "lost_ids": outcome.lost.iter().take(100).collect::<Vec<_>>(),
        "duplicated_results": outcome.duplicated_results.len(),
        "duplicated_result_ids": outcome.duplicated_results.iter().take(100).collect::<Vec<_>>(),
        "duplicate_submits": outcome.duplicate_submits,
        "duplicate_submit_causes": outcome.duplicate_causes,
        "excused_duplicate_submits": outcome.excused_duplicates(),
        "kills_that_caused_a_duplicate": outcome.kills_in_submit_window,
        "counted_possible_duplicate_submits": outcome.counted_possible_duplicates,
        "recovery_ms": outcome.recovery.map(|d| d.as_millis() as u64),
        "recovery_measures": outcome.recovery_what,
        "wall_ms": outcome.wall.as_millis() as u64,
        "providers": outcome.providers.iter().map(|(provider, counts)| (provider.as_str().to_owned(), counts.json()))
            .collect::<serde_json::Map<String, serde_json::Value>>(),
        "figures": outcome.figures,
        "notes": outcome.notes,
        "failures": outcome.failures,
        "daemon_settings": outcome.settings,
        "logs": outcome.log_dir,
    })
}

/// Writes the JSON report (every outcome plus the machine) to `path`.
pub fn write_json(path: &Path, outcomes: &[Outcome], machine: serde_json::Value) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let report = serde_json::json!({
        "machine": machine,
        "scenarios": outcomes.iter().map(json).collect::<Vec<_>>(),
    });
    std::fs::write(path, serde_json::to_string_pretty(&report).unwrap_or_default())
}

/// `nproc`, `redis-server --version` and the kernel, for the report.
pub fn machine() -> serde_json::Value {
    let run = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .output()
            .ok()
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    serde_json::json!({
        "nproc": run("nproc", &[]),
        "redis_server": run("redis-server", &["--version"]),
        "kernel": run("uname", &["-srm"]),
        "memory": run("sh", &["-c", "free -h | awk '/^Mem:/ {print $2}'"]),
        "build": "debug (the profile `make test` builds)",
    })
}
