//! `--json` on every command: each command that prints a result prints JSON that parses, and every leaf command's
//! help offers `--json` (but the servers and `completions`), so a new command cannot leave it out.

use std::time::Duration;

use batchd_tests::{Daemon, World, bge_m3_job, wait_for_http, with_admin};
use serde_json::{Value, json};

use crate::cli_operator::{cli, cli_json, cli_with};

const WAIT: Duration = Duration::from_secs(30);

/// Every command that prints a result has `--json` (all but `run` and `completions`), and what each prints parses.
#[tokio::test]
async fn json_output_parses_for_every_command() {
    let world = World::new().await;
    let mut settings = world.settings.clone();
    let admin = with_admin(&mut settings);
    let daemon = Daemon::start(settings, &world.emulator);
    let job = world.redis.dir.join("job.json");
    std::fs::write(&job, bge_m3_job("j-1", 1).to_string()).unwrap();
    let job = job.display().to_string();

    let submitted = cli_json(&world, &["submit", &job, "--json"], 0).await;
    assert_eq!(submitted["job_id"], "j-1");
    world.wait_for_result("j-1", WAIT).await;
    world.enqueue_raw(&[("payload", "not a job".to_owned())]).await;
    world.wait_for_results(2, WAIT).await;
    wait_for_http(admin, "/readyz", WAIT, |status, _| status == 200).await;
    let dead = cli_json(&world, &["dead", "list", "--json"], 0).await;
    let dead_id = dead[0]["entry_id"].as_str().expect("dead entry").to_owned();

    let addr = admin.to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec!["status", "j-1", "--json"],
        vec!["cancel", "j-1", "--json"],
        vec!["cancel", "u-1", "--before-arrival", "--json"],
        vec!["uncancel", "u-1", "--json"],
        vec!["retry", "--dry-run", "--json"],
        vec!["jobs", "--json"],
        vec!["failed", "--json"],
        vec!["stats", "--json"],
        vec!["workers", "--json"],
        vec!["pause", "--json"],
        vec!["resume", "--json"],
        vec!["dead", "list", "--json"],
        vec!["dead", "show", &dead_id, "--json"],
        vec!["probe", "--addr", &addr, "--json"],
        vec!["dead", "purge", &dead_id, "--yes", "--json"],
    ];
    let mut covered: Vec<String> = vec!["submit".into(), "tail".into(), "dead retry".into(), "config check".into()];
    for args in &commands {
        let value = cli_json(&world, args, 0).await;
        assert!(value.is_object() || value.is_array(), "{args:?}: {value}");
        covered.push(
            args.iter()
                .take_while(|arg| !arg.starts_with('-') && !["j-1", "u-1"].contains(*arg) && **arg != dead_id)
                .copied()
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    let cancelled = cli_json(&world, &["cancel", "j-1", "--json"], 0).await;
    assert_eq!(cancelled, json!({"job_id": "j-1", "outcome": "already_finished", "state": "completed"}));

    // tail and dead retry print one object per line.
    let (code, stdout, _) = cli(&world, &["tail", "--from-start", "--count", "2", "--json"]).await;
    assert_eq!(code, 0);
    let lines: Vec<Value> =
        stdout.lines().map(|line| serde_json::from_str::<Value>(line).expect("JSON line")).collect();
    assert_eq!(lines.len(), 2);
    // A job too big for a daemon with a tiny entry limit becomes a dead letter that `dead retry` can requeue.
    daemon.stop().await.unwrap();
    world.enqueue(&bge_m3_job("too-big", 3)).await;
    let mut small = world.settings.clone();
    small.jobs.max_entry_bytes = 200;
    let daemon = Daemon::start(small, &world.emulator);
    world.wait_for_results(3, WAIT).await;
    daemon.stop().await.unwrap();
    let dead = cli_json(&world, &["dead", "list", "--json"], 0).await;
    let dead_id = dead[0]["entry_id"].as_str().unwrap().to_owned();
    let (code, stdout, stderr) = cli(&world, &["dead", "retry", &dead_id, "--json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let line: Value = serde_json::from_str(stdout.trim_end()).expect("one JSON line");
    assert_eq!((line["entry_id"].as_str(), line["job_id"].as_str()), (Some(dead_id.as_str()), Some("too-big")));
    let (code, stdout, stderr) =
        cli_with(&world, &["config", "check", "--json"], &[("CLOUDFLARE_API_TOKEN", "t0ken-for-the-check")]).await;
    assert_eq!(code, 0, "{stderr}");
    let config: Value = serde_json::from_str(&stdout).expect("config check --json");
    assert_eq!(config["redis"]["namespace"], world.settings.redis.namespace);
    assert!(!stdout.contains("t0ken-for-the-check"), "secrets stay redacted");
    // The two commands that ask Cloudflare's API (the emulator's): the token and an events queue.
    let cloudflare = [("CLOUDFLARE_API_TOKEN", world.emulator.token()), ("BATCHD__EVENTS__QUEUE_ID", "q-cli-json")];
    for args in [vec!["events", "setup", "--dry-run", "--json"], vec!["models", "--json"]] {
        let (code, stdout, stderr) = cli_with(&world, &args, &cloudflare).await;
        assert_eq!(code, 0, "{args:?}: {stderr}");
        let value: Value = serde_json::from_str(&stdout).expect("JSON");
        assert!(value.is_object() || value.is_array(), "{args:?}: {value}");
    }
    covered.extend(["events setup".to_owned(), "models".to_owned()]);

    // Every leaf command's help offers --json, but `run`, `ui` (servers; the dashboard's JSON is its /api/ routes,
    // tests/it/ui_browser.rs) and `completions`.
    let mut leaves = Vec::new();
    let (_, help, _) = cli(&world, &["--help"]).await;
    for name in subcommands(&help) {
        let (_, sub_help, _) = cli(&world, &[name.as_str(), "--help"]).await;
        let nested = subcommands(&sub_help);
        if nested.is_empty() {
            leaves.push((name.clone(), sub_help));
        }
        for inner in nested {
            let (_, inner_help, _) = cli(&world, &[name.as_str(), inner.as_str(), "--help"]).await;
            leaves.push((format!("{name} {inner}"), inner_help));
        }
    }
    for (path, help) in &leaves {
        if path == "run" || path == "ui" || path == "completions" {
            assert!(!help.contains("--json"), "{path}");
            continue;
        }
        assert!(help.contains("      --json "), "`batchd {path}` has no --json");
        assert!(covered.contains(path), "`batchd {path} --json` is not exercised here");
    }
}

/// The command names under "Commands:" in a help text (without `help`).
pub(crate) fn subcommands(help: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_commands = false;
    for line in help.lines() {
        if line == "Commands:" {
            in_commands = true;
        } else if in_commands && line.starts_with("  ") && !line.starts_with("   ") {
            let name = line.split_whitespace().next().unwrap_or_default();
            if name != "help" {
                names.push(name.to_owned());
            }
        } else if in_commands && !line.starts_with(' ') {
            in_commands = false;
        }
    }
    names
}
