//! The operator CLI against a live daemon: `submit` of JSONL with `--out` (order checked), `tail`, `jobs`,
//! `stats`, `cancel` and `dead list|show|retry|purge`, and bad input to every command (one line, non-zero exit).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use batchd_core::ResultStatus;
use batchd_tests::{Daemon, World, bge_m3_job, binary};
use redis::AsyncCommands;
use serde_json::{Value, json};

use crate::cli_operator::cli_json;

const WAIT: Duration = Duration::from_secs(30);

/// The environment the CLI gets: the world's Redis, namespace and emulator, and nothing else.
pub(crate) fn world_env(world: &World) -> Vec<(&'static str, String)> {
    world.batchd_env()
}

/// The `batchd` binary with [`world_env`].
pub(crate) fn batchd(world: &World) -> Command {
    world.batchd()
}

/// Runs a command to completion off the async runtime.
pub(crate) async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run command")).await.expect("join")
}

/// `batchd <args>`: (exit code, stdout, stderr).
async fn cli(world: &World, args: &[&str]) -> (i32, String, String) {
    let mut command = batchd(world);
    command.args(args);
    let output = run(command).await;
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

/// `stderr` without the CLI's warnings (`batchd: warning: ...`: the default Redis, a namespace no daemon ran in),
/// which a test that checks one error line is not about.
pub(crate) fn without_warnings(stderr: &str) -> String {
    stderr.lines().filter(|line| !line.starts_with("batchd: warning: ")).map(|line| format!("{line}\n")).collect()
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write file");
    path.display().to_string()
}

#[tokio::test]
async fn jsonl_submit_waits_and_writes_responses_in_request_order() {
    let world = World::new().await;
    // Three items per batch, so the ten items come back from four remote batches.
    let mut settings = world.settings.clone();
    settings.jobs.max_batch_items = 3;
    let daemon = Daemon::start(settings, &world.emulator);
    let mut lines: Vec<String> = (0..10)
        .map(|i| json!({"query": format!("q {i}"), "contexts": [{"text": format!("c {i}")}], "external_reference": format!("r{i}")}).to_string())
        .collect();
    lines.insert(4, String::new()); // blank lines are skipped
    let items = write(&world.redis.dir, "items.jsonl", &(lines.join("\n") + "\n"));
    let out = world.redis.dir.join("responses.jsonl");

    let (code, stdout, stderr) = cli(
        &world,
        &[
            "submit",
            &items,
            "--model",
            "@cf/baai/bge-m3",
            "--id",
            "jl-1",
            "--metadata",
            r#"{"batch":"nightly"}"#,
            "--wait",
            "--timeout",
            "60",
            "--out",
            out.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(code, 0, "stderr: {stderr}");
    let (id_line, rest) = stdout.split_once('\n').expect("id, then the result");
    assert_eq!(id_line, "jl-1");
    let result: Value = serde_json::from_str(rest).expect("result JSON");
    assert_eq!(result["status"], "completed");
    assert_eq!(result["items_total"], 10);
    assert_eq!(result["metadata"], json!({"batch": "nightly"}));
    assert_eq!(result["out"], json!({"file": out.display().to_string(), "lines": 10}));
    assert!(result["result"].get("responses").is_none(), "responses went to the file, not stdout");
    assert_eq!(result["request_ids"].as_array().map(Vec::len), Some(4), "four batches");

    let written = std::fs::read_to_string(&out).expect("--out file");
    let responses: Vec<Value> = written.lines().map(|line| serde_json::from_str(line).expect("JSONL")).collect();
    assert_eq!(responses.len(), 10);
    for (i, response) in responses.iter().enumerate() {
        assert_eq!(response["index"], i, "request order: {written}");
        assert_eq!(response["external_reference"], format!("r{i}"));
        assert_eq!(response["success"], true);
    }
    // Not a terminal: one plain progress line per change, the last one the final state.
    assert!(stderr.lines().any(|line| line.starts_with("jl-1: running (chunk 0: ")), "{stderr}");
    assert_eq!(stderr.lines().last(), Some("jl-1: completed"), "{stderr}");
    let ledger = world.ledger("jl-1").await;
    assert_eq!(ledger.get("n_chunks").map(String::as_str), Some("4"));
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn submit_wait_shows_a_progress_bar_on_a_terminal() {
    let world = World::new().await;
    let daemon = world.daemon();
    let job = write(&world.redis.dir, "job.json", &bge_m3_job("tty-1", 4).to_string());
    // `script` gives the command a pseudo-terminal, as an operator's shell would.
    let batchd_path = binary("batchd").unwrap();
    let mut script = Command::new("script");
    script.env_clear().envs(world_env(&world)).env("TERM", "xterm").args([
        "-qfec",
        &format!("{} submit --wait --timeout 60 {job}", batchd_path.display()),
        "/dev/null",
    ]);
    let output = run(script).await;
    let screen = text(&output.stdout);
    assert!(output.status.success(), "{screen}");
    assert!(screen.contains("tty-1"), "{screen}");
    assert!(screen.contains("4/4 items"), "the bar counts items: {screen}");
    assert!(screen.contains("completed, chunks 1/1"), "and chunks: {screen}");
    assert!(screen.contains("\"status\": \"completed\""), "{screen}");
    daemon.stop().await.unwrap();
}

/// Starts `batchd tail ...` and returns it once it says it is following (so nothing published later is missed).
async fn start_tail(world: &World, args: &[&str]) -> std::process::Child {
    let mut command = batchd(world);
    command.arg("tail").args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().expect("start tail");
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let mut line = String::new();
        stderr.read_line(&mut line).expect("read stderr");
        assert!(line.starts_with("following "), "tail announces itself: {line}");
        child
    })
    .await
    .expect("join")
}

#[tokio::test]
async fn tail_follows_results_from_now_or_from_the_start() {
    let world = World::new().await;
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("t-1", 1)).await;
    world.wait_for_result("t-1", WAIT).await;

    let child = start_tail(&world, &["--count", "2", "--json", "--timeout", "60"]).await;
    world.enqueue(&bge_m3_job("t-2", 2)).await;
    world.enqueue(&json!({"id": "t-3", "model": "@cf/nobody/nothing", "requests": [{"text": "x"}]})).await;
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    assert_eq!(output.status.code(), Some(0));
    let entries: Vec<Value> =
        text(&output.stdout).lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    let mut ids: Vec<&str> = entries.iter().map(|e| e["job_id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["t-2", "t-3"], "from now: t-1 was published before tail started");
    let t2 = entries.iter().find(|e| e["job_id"] == "t-2").unwrap();
    assert_eq!(t2["result"]["responses"].as_array().map(Vec::len), Some(2), "JSON fields are decoded");
    assert!(t2["entry_id"].as_str().is_some_and(|id| id.contains('-')));

    let (code, stdout, _) = cli(&world, &["tail", "--from-start", "--count", "3"]).await;
    assert_eq!(code, 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines[0].ends_with("  t-1  completed  1 items, 0 failed  @cf/baai/bge-m3"), "{stdout}");
    let failed = lines.iter().find(|line| line.contains("  t-3  failed  ")).expect("t-3's line");
    assert!(failed.contains("  api_error: ") || failed.contains("  invalid_job: "), "the error is shown: {failed}");

    let (code, stdout, stderr) = cli(&world, &["tail", "--from-start", "--count", "5", "--timeout", "1"]).await;
    assert_eq!(code, 4, "{stderr}");
    assert_eq!(stdout.lines().count(), 3);
    assert!(stderr.trim_end().ends_with("batchd: gave up after 1s with 3 of 5 entries"), "{stderr}");

    // One entry by the id its ledger records (the command the dashboard names for a result it does not read), and
    // the size the ledger records for it is the entry's, as Redis holds it.
    let ledger = world.ledger("t-2").await;
    let entry_id = ledger.get("result_entry").expect("result_entry").clone();
    let (code, stdout, stderr) =
        cli(&world, &["tail", "--from", &entry_id, "--count", "1", "--json", "--timeout", "20"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains(&format!(" from entry {entry_id}")), "{stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert_eq!((lines[0]["job_id"].as_str(), lines[0]["entry_id"].as_str()), (Some("t-2"), Some(entry_id.as_str())));
    let entries = world.entries(&world.keys.results()).await;
    let (_, fields) = entries.iter().find(|(id, _)| *id == entry_id).expect("the entry");
    let bytes: usize = fields.iter().map(|(name, value)| name.len() + value.len()).sum();
    assert_eq!(ledger.get("result_bytes"), Some(&bytes.to_string()), "the daemon's publish records the size");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn jobs_lists_ledgers_by_state_and_cancel_ends_a_running_job() {
    let world = World::new().await;
    let daemon = world.daemon();
    for id in ["done-1", "done-2"] {
        world.enqueue(&bge_m3_job(id, 1)).await;
        world.wait_for_result(id, WAIT).await;
    }
    world.enqueue(&json!({"id": "bad-1", "requests": [{"text": "x"}]})).await;
    world.wait_for_result("bad-1", WAIT).await;
    // Batches now stay queued, so the next job keeps running.
    world.emulator.set_timing(Duration::from_secs(600), Duration::from_secs(600));
    world.enqueue(&bge_m3_job("slow-1", 2)).await;
    let started = Instant::now();
    while world.ledger("slow-1").await.get("state").map(String::as_str) != Some("running") {
        assert!(started.elapsed() < WAIT, "slow-1 never ran");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let (code, stdout, stderr) = cli(&world, &["jobs"]).await;
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("JOB ID") && lines[0].ends_with("MODEL"), "{stdout}");
    assert_eq!(lines.len(), 6, "header, four jobs, footer: {stdout}");
    assert!(lines[1].starts_with("slow-1  running"), "newest first: {stdout}");
    assert_eq!(
        lines[5],
        format!(
            "4 of 4 matching jobs shown (4 ledgers scanned; namespace {} on {})",
            world.settings.redis.namespace,
            world.redis.url()
        ),
        "{stdout}"
    );

    let (code, stdout, _) = cli(&world, &["jobs", "--state", "completed", "--json"]).await;
    assert_eq!(code, 0);
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    let ids: Vec<&str> = listed["jobs"].as_array().unwrap().iter().map(|j| j["job_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["done-2", "done-1"]);
    assert_eq!((listed["matching"].as_u64(), listed["scanned"].as_u64()), (Some(2), Some(4)));
    assert_eq!(listed["jobs"][0]["n_items"], 1);

    let (_, stdout, _) =
        cli(&world, &["jobs", "--state", "failed", "--state", "running", "--limit", "1", "--json"]).await;
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed["matching"], 2);
    assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(1), "--limit");

    let (code, stdout, stderr) = cli(&world, &["cancel", "slow-1", "--reason", "not needed"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("cancellation of job slow-1 (running) requested"), "{stdout}");
    let result = world.wait_for_result("slow-1", WAIT).await;
    assert_eq!(result.status, ResultStatus::Cancelled);
    let (_, stdout, _) = cli(&world, &["cancel", "done-1"]).await;
    assert_eq!(stdout.trim_end(), "job done-1 already ended completed; nothing to cancel");

    // A mistyped id cancels nothing: no job was taken in under it, so it is "not found" and no flag is left for a
    // future job; --before-arrival asks for exactly that, `submit` warns about it and `uncancel` withdraws it.
    let (code, stdout, stderr) = cli(&world, &["cancel", "dnoe-1"]).await;
    assert_eq!((code, stdout.as_str()), (5, ""), "{stderr}");
    assert!(stderr.contains("no job dnoe-1 in namespace") && stderr.contains("add --before-arrival"), "{stderr}");
    let flag = world.keys.cancel(&batchd_core::JobId::parse("dnoe-1").unwrap());
    assert!(!world.conn.clone().exists::<_, bool>(&flag).await.unwrap(), "no cancellation was requested");
    let (code, stdout, stderr) = cli(&world, &["cancel", "later-1", "--before-arrival", "--reason", "typo"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("(batchd uncancel later-1 withdraws the request)"), "{stdout}");
    let (code, stdout, stderr) = cli(&world, &["uncancel", "later-1"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("cancellation of job later-1 withdrawn"), "{stdout}");
    let (code, _, stderr) = cli(&world, &["uncancel", "later-1"]).await;
    assert_eq!(code, 5, "nothing left to withdraw: {stderr}");
    // A request left in place cancels the job when it arrives, and `submit` says so as it enqueues it.
    let (code, _, stderr) = cli(&world, &["cancel", "later-2", "--before-arrival"]).await;
    assert_eq!(code, 0, "{stderr}");
    let file = world.redis.dir.join("later.json");
    std::fs::write(&file, bge_m3_job("later-2", 1).to_string()).unwrap();
    let (code, _, stderr) = cli(&world, &["submit", file.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("warning: a cancellation of job later-2 is pending"), "{stderr}");
    assert_eq!(world.wait_for_result("later-2", WAIT).await.status, ResultStatus::Cancelled);
    let (_, stdout, _) = cli(&world, &["jobs", "--state", "cancelled", "--json"]).await;
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    let ids: Vec<&str> = listed["jobs"].as_array().unwrap().iter().map(|j| j["job_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["later-2", "slow-1"], "newest first");

    // --namespace wins over the configuration, before or after the command.
    let namespace = world.settings.redis.namespace.clone();
    for args in [vec!["--namespace", &namespace, "jobs", "--json"], vec!["jobs", "--json", "--namespace", &namespace]] {
        let mut command = batchd(&world);
        command.env("BATCHD__REDIS__NAMESPACE", "someone-else").args(&args);
        let output = run(command).await;
        let listed: Value = serde_json::from_slice(&output.stdout).expect("jobs --json");
        assert_eq!(listed["scanned"], 5, "{args:?}");
    }
    let (code, stdout, _) = cli(&world, &["--namespace", "someone-else", "jobs", "--json"]).await;
    assert_eq!((code, serde_json::from_str::<Value>(&stdout).unwrap()["scanned"].as_u64()), (0, Some(0)));
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn stats_shows_depths_in_flight_work_oldest_waiting_and_throughput() {
    let world = World::new().await;
    let daemon = world.daemon();
    for id in ["s-1", "s-2", "s-3"] {
        world.enqueue(&bge_m3_job(id, 1)).await;
    }
    let dead_entry = world.enqueue_raw(&[("payload", "not a job".into())]).await;
    world.wait_for_results(4, WAIT).await;
    daemon.stop().await.unwrap();
    // Two jobs wait with no daemon running; a results reader has its own group.
    world.enqueue(&bge_m3_job("w-1", 1)).await;
    world.enqueue(&bge_m3_job("w-2", 1)).await;
    let mut conn = world.conn.clone();
    let _: () = conn.xgroup_create(world.keys.results(), "billing", "0").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let (code, stdout, stderr) = cli(&world, &["stats", "--json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let stats: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(stats["namespace"], world.settings.redis.namespace);
    assert_eq!(stats["submit"]["entries"], 2);
    assert_eq!(stats["submit"]["waiting"], 2);
    assert_eq!(stats["submit"]["in_flight"], 0);
    assert!(stats["submit"]["oldest_waiting_ms"].as_u64().is_some_and(|ms| (20..60_000).contains(&ms)), "{stats}");
    assert_eq!(stats["schedule"]["chunks_in_flight"], 0);
    assert_eq!(stats["results"]["entries"], 4);
    // Minute buckets of the finished-jobs counters: unless the minute turned since the results were published,
    // all four are in the current one.
    let minute = |ms: u64| ms / 60_000;
    let published: Vec<u64> = world
        .entries(&world.keys.results())
        .await
        .iter()
        .filter_map(|(id, _)| id.split('-').next().and_then(|ms| ms.parse().ok()))
        .collect();
    let same_minute = published.iter().all(|ms| minute(*ms) == minute(stats["at"].as_u64().unwrap()));
    assert_eq!(stats["results"]["throughput"]["windows"]["15m"], 4, "{stats}");
    assert_eq!(stats["results"]["throughput"]["windows"]["5m"], 4, "{stats}");
    if same_minute {
        assert_eq!(stats["results"]["throughput"]["windows"]["1m"], 4, "{stats}");
    }
    assert_eq!(stats["results"]["throughput"]["by_status_15m"], json!({"completed": 3, "failed": 1}));
    assert_eq!(stats["results"]["groups"][0]["name"], "billing");
    assert_eq!(stats["results"]["groups"][0]["lag"], 4);
    assert_eq!(stats["dead"]["entries"], 1);

    let (code, stdout, _) = cli(&world, &["stats"]).await;
    assert_eq!(code, 0);
    assert!(stdout.contains("  submit stream    2 entries: 2 waiting, 0 being taken in; oldest waiting "), "{stdout}");
    assert!(stdout.contains("  in flight        0 chunks"), "{stdout}");
    assert!(stdout.contains("  results          4 entries; last 1m "), "{stdout}");
    assert!(stdout.contains(", 5m 4 (0.8/min), 15m 4 (0.3/min)"), "{stdout}");
    assert!(stdout.contains("last 15m: 3 completed, 1 failed"), "{stdout}");
    assert!(
        stdout.contains("  result readers   group billing: 0 read and not acknowledged, 4 not read yet"),
        "{stdout}"
    );
    assert!(stdout.contains("  dead letters     1 entries"), "{stdout}");

    assert!(!dead_entry.is_empty());
}

#[tokio::test]
async fn dead_letters_are_listed_shown_retried_after_validation_and_purged() {
    let world = World::new().await;
    // A daemon with a tiny entry limit sends a normal job to the dead-letter stream, with two real misfits.
    let mut small = world.settings.clone();
    small.jobs.max_entry_bytes = 200;
    let daemon = Daemon::start(small, &world.emulator);
    let big = world.enqueue(&bge_m3_job("big-1", 3)).await;
    let no_job = world.enqueue_raw(&[("payload", "hello".into())]).await;
    let not_json = world.enqueue_raw(&[("job", "not json".into())]).await;
    world.wait_for_results(3, WAIT).await;
    daemon.stop().await.unwrap();
    let dead: Vec<(String, std::collections::HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(world.keys.dead())
        .arg("-")
        .arg("+")
        .query_async(&mut world.conn.clone())
        .await
        .unwrap();
    let dead_id = |source: &str| dead.iter().find(|(_, f)| f["source_id"] == source).map(|(id, _)| id.clone()).unwrap();
    let (big_dead, no_job_dead, not_json_dead) = (dead_id(&big), dead_id(&no_job), dead_id(&not_json));

    let (code, stdout, _) = cli(&world, &["dead", "list"]).await;
    assert_eq!(code, 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("ENTRY ID") && lines[0].ends_with("ERROR"), "{stdout}");
    assert!(lines[1].starts_with(&not_json_dead), "newest first: {stdout}");
    assert!(lines[1].ends_with("`job` is not valid JSON: expected ident at line 1 column 2"), "{stdout}");
    assert_eq!(
        lines[4],
        format!(
            "3 of 3 dead-letter entries shown (namespace {} on {})",
            world.settings.redis.namespace,
            world.redis.url()
        )
    );
    let (_, stdout, _) = cli(&world, &["dead", "list", "--json", "--limit", "2"]).await;
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(2));
    assert_eq!(listed[1]["source_id"], no_job);
    assert_eq!(listed[1]["field_bytes"], json!({"payload": 5}));

    let (code, stdout, _) = cli(&world, &["dead", "show", &big_dead]).await;
    assert_eq!(code, 0);
    assert!(stdout.contains(&format!("  source id    {big}")), "{stdout}");
    assert!(stdout.contains("limit (limits.max_entry_bytes) is 200"), "{stdout}");
    assert!(stdout.contains("  field job ("), "{stdout}");
    let (_, stdout, _) = cli(&world, &["dead", "show", &big_dead, "--json"]).await;
    let shown: Value = serde_json::from_str(&stdout).unwrap();
    let original: Value = serde_json::from_str(shown["fields"]["job"].as_str().unwrap()).unwrap();
    assert_eq!(original, bge_m3_job("big-1", 3));

    // Entries that are still not jobs are refused, one line each, and kept.
    let (code, _, stderr) = cli(&world, &["dead", "retry", &no_job_dead]).await;
    assert_eq!(
        (code, stderr.trim_end()),
        (
            1,
            format!("batchd: dead-letter entry {no_job_dead} has no `job` field to retry (fields: payload); kept")
                .as_str()
        )
    );
    let (code, _, stderr) = cli(&world, &["dead", "retry", &not_json_dead]).await;
    assert_eq!(code, 1);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "batchd: dead-letter entry {not_json_dead} is still not a valid job: `job` is not valid JSON: expected ident at line 1 column 2; kept"
        )
    );
    // The big job is valid under the CLI's (default) limits: it goes back to the submit stream, byte for byte.
    let (code, stdout, stderr) = cli(&world, &["dead", "retry", &big_dead]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with(&format!("requeued dead-letter entry {big_dead} as submit entry ")), "{stdout}");
    assert!(stdout.trim_end().ends_with("(job big-1)"), "{stdout}");
    assert_eq!(world.stream(&world.keys.dead()).await.len(), 2);
    let daemon = world.daemon();
    let result = world.wait_for_result("big-1", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed);
    assert_eq!(result.items_total, 3);
    daemon.stop().await.unwrap();

    let (code, stdout, _) = cli(&world, &["dead", "purge", &no_job_dead, "--yes"]).await;
    assert_eq!(
        (code, stdout.trim_end()),
        (
            0,
            format!(
                "purged 1 dead-letter entries (namespace {} on {})",
                world.settings.redis.namespace,
                world.redis.url()
            )
            .as_str()
        )
    );
    let (code, _, stderr) = cli(&world, &["dead", "purge", &no_job_dead, &not_json_dead]).await;
    assert_eq!(code, 5, "all or nothing: {stderr}");
    assert_eq!(world.stream(&world.keys.dead()).await.len(), 1, "nothing purged when one id is unknown");
    let (code, stdout, _) = cli(&world, &["dead", "purge", "--all", "--yes"]).await;
    assert_eq!(
        (code, stdout.trim_end()),
        (
            0,
            format!(
                "purged 1 dead-letter entries (namespace {} on {})",
                world.settings.redis.namespace,
                world.redis.url()
            )
            .as_str()
        )
    );
    assert!(world.stream(&world.keys.dead()).await.is_empty());
}

#[tokio::test]
async fn bad_input_to_every_command_is_one_line_and_a_nonzero_exit() {
    let world = World::new().await;
    let dir = &world.redis.dir;
    let bad_line = write(dir, "bad.jsonl", "{\"text\":\"a\"}\n\n{\"text\": \"b\"\n{\"text\":\"c\"}\n");
    let not_object = write(dir, "array.jsonl", "{\"text\":\"a\"}\n[\"b\"]\n");
    let empty = write(dir, "empty.jsonl", "\n\n");
    let jsonl_as_job = write(dir, "items.jsonl", "{\"text\":\"a\"}\n{\"text\":\"b\"}\n");
    let good = write(dir, "good.json", &bge_m3_job("g-1", 1).to_string());
    let cases: Vec<(Vec<&str>, i32, String)> = vec![
        (vec!["submit", "/nonexistent/job.json"], 1, "batchd: cannot read /nonexistent/job.json: ".into()),
        (
            vec!["submit", "/nonexistent/items.jsonl", "--model", "@cf/baai/bge-m3"],
            1,
            "batchd: cannot read /nonexistent/items.jsonl".into(),
        ),
        (vec!["submit", &bad_line, "--model", "@cf/baai/bge-m3"], 1, format!("batchd: {bad_line}:3: not valid JSON: ")),
        (
            vec!["submit", &not_object, "--model", "@cf/baai/bge-m3"],
            1,
            format!("batchd: {not_object}:2: a request item must be a JSON object, got an array"),
        ),
        (vec!["submit", &empty, "--model", "@cf/baai/bge-m3"], 1, format!("batchd: {empty}: no request items")),
        (vec!["submit", &jsonl_as_job], 1, format!("batchd: {jsonl_as_job}: `job` is not valid JSON: ")),
        (vec!["submit", &good, "--model", "@cf/../x"], 1, format!("batchd: {good}: invalid `model`: ")),
        (
            vec!["submit", &good, "--out", "x.jsonl"],
            2,
            "batchd: the following required arguments were not provided: --wait".into(),
        ),
        (vec!["submit", &good, "--id", "a b"], 1, "batchd: --id: contains ' '".into()),
        (vec!["status", "no-such-job"], 5, "batchd: no job no-such-job in namespace".into()),
        (vec!["cancel", "bad id"], 1, "batchd: job id \"bad id\" contains ' '".into()),
        (vec!["tail", "--stream", "a b"], 2, "batchd: --stream \"a b\": a suffix is 1-200 characters".into()),
        (vec!["tail", "--count", "many"], 2, "batchd: invalid value 'many' for '--count <N>'".into()),
        (
            vec!["jobs", "--state", "bogus"],
            2,
            "batchd: invalid value 'bogus' for '--state <STATE>': expected one of accepted,".into(),
        ),
        (vec!["stats", "--scan-limit", "2"], 2, "batchd: unexpected argument '--scan-limit' found".into()),
        (vec!["dead", "show", "1-0"], 5, format!("batchd: no dead-letter entry 1-0 in {}", world.keys.dead())),
        (vec!["dead", "show", "abc"], 1, "batchd: \"abc\" is not a stream entry id".into()),
        (vec!["dead", "retry", "1-0"], 5, "batchd: no dead-letter entry 1-0".into()),
        (
            vec!["dead", "purge"],
            2,
            "batchd: dead purge needs dead-letter entry ids (from `batchd dead list`), or --all".into(),
        ),
        (vec!["dead", "frob"], 2, "batchd: unrecognized subcommand 'frob'".into()),
    ];
    for (args, code, message) in &cases {
        let (actual, _, stderr) = cli(&world, args).await;
        let stderr = without_warnings(&stderr);
        assert_eq!(actual, *code, "{args:?}: {stderr}");
        assert!(stderr.starts_with(message.as_str()), "{args:?}: expected {message:?}, got {stderr:?}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: one line: {stderr}");
    }
    let hint = cli(&world, &["submit", &jsonl_as_job]).await.2;
    assert!(hint.trim_end().ends_with("(for JSONL request items, give --model)"), "{hint}");
    assert_eq!(world.conn.clone().xlen::<_, usize>(world.keys.submit()).await.unwrap(), 0, "nothing was enqueued");

    // Redis unreachable: every command says so in one line.
    let commands: Vec<Vec<&str>> = vec![
        vec!["submit", &good],
        vec!["status", "g-1"],
        vec!["cancel", "g-1"],
        vec!["tail", "--count", "1"],
        vec!["jobs"],
        vec!["stats"],
        vec!["dead", "list"],
        vec!["dead", "show", "1-0"],
        vec!["dead", "retry", "1-0"],
        vec!["dead", "purge", "--all"],
    ];
    for args in commands {
        let mut command = batchd(&world);
        command.env("REDIS_URL", "redis://127.0.0.1:1").args(&args);
        let output = run(command).await;
        let stderr = without_warnings(&text(&output.stderr));
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.starts_with("batchd: cannot reach Redis at redis://127.0.0.1:1"), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn status_shows_metadata_the_error_by_field_and_numbers_as_jobs_json_does() {
    use batchd_emulator::{Calls, Fault};
    let world = World::new().await;
    let daemon = world.daemon();
    world.emulator.inject(Fault::status(401).code(10000).on(Calls::Submit).times(1));
    let mut job = bge_m3_job("st-1", 2);
    job["metadata"] = json!({"tenant": "acme"});
    world.enqueue(&job).await;
    assert_eq!(world.wait_for_result("st-1", WAIT).await.status, ResultStatus::Failed);

    let (code, stdout, stderr) = cli(&world, &["status", "st-1"]).await;
    assert_eq!(code, 0, "{stderr}");
    for line in [
        "  state        failed",
        r#"  metadata     {"tenant":"acme"}"#,
        "  error        api_error",
        "                 http status 401",
        "                 api code    10000",
    ] {
        assert!(stdout.lines().any(|shown| shown == line), "{line:?} in {stdout}");
    }
    assert!(stdout.lines().any(|line| line.starts_with("                 message     ")), "{stdout}");
    assert!(stdout.contains("  chunk 0      "), "{stdout}");

    // --json: the times and counts are numbers, the same numbers `jobs --json` prints.
    let status = cli_json(&world, &["status", "st-1", "--json"], 0).await;
    let jobs = cli_json(&world, &["jobs", "--json"], 0).await;
    let listed = jobs["jobs"].as_array().unwrap().iter().find(|job| job["job_id"] == "st-1").expect("listed").clone();
    for name in ["accepted_at", "updated_at", "finished_at", "n_items", "n_chunks"] {
        assert!(status[name].is_u64(), "{name}: {status}");
        assert_eq!(status[name], listed[name], "{name}");
    }
    assert!(status["c0:attempts"].is_u64() && status["deadline_at"].is_u64(), "{status}");
    assert_eq!(status["error"]["code"], "api_error");
    assert_eq!(status["metadata"], json!({"tenant": "acme"}));
    assert!(status["c0:state"].is_string() && status["model"].is_string(), "{status}");

    // An unknown job: a JSON object on stdout too, and exit code 5 as ever.
    let (code, stdout, stderr) = cli(&world, &["status", "nosuch-1", "--json"]).await;
    assert_eq!(code, 5, "{stderr}");
    let error: Value = serde_json::from_str(&stdout).expect("JSON on stdout");
    assert_eq!(error["job_id"], "nosuch-1");
    assert_eq!(error["error"]["code"], "not_found");
    assert!(error["error"]["message"].as_str().unwrap().starts_with("no job nosuch-1 in namespace"), "{error}");
    assert!(without_warnings(&stderr).starts_with("batchd: no job nosuch-1"), "{stderr}");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn reply_to_and_stream_take_the_full_key_or_the_suffix() {
    let world = World::new().await;
    let daemon = world.daemon();
    let items = world.redis.dir.join("items.jsonl");
    std::fs::write(&items, "{\"text\":\"a\"}\n").unwrap();
    let items = items.display().to_string();
    let billing = format!("{}:billing", world.keys.results());
    for (id, reply_to) in [("r-1", "billing"), ("r-2", billing.as_str())] {
        let args = ["submit", &items, "--model", "@cf/baai/bge-m3", "--id", id, "--reply-to", reply_to, "--wait"];
        let (code, _, stderr) = cli(&world, &args).await;
        assert_eq!(code, 0, "{reply_to}: {stderr}");
        assert_eq!(world.ledger(id).await.get("reply_to"), Some(&billing), "{reply_to}: the job holds the full key");
    }
    assert_eq!(world.stream(&billing).await.len(), 2, "both results in {billing}");
    for stream in ["billing", billing.as_str()] {
        let (code, stdout, stderr) = cli(&world, &["tail", "--stream", stream, "--from-start", "--count", "2"]).await;
        assert_eq!(code, 0, "{stream}: {stderr}");
        assert_eq!(stdout.lines().count(), 2, "{stream}: {stdout}");
        assert!(stderr.starts_with(&format!("following {billing} on ")), "{stream}: {stderr}");
        let report = cli_json(&world, &["retry", "--stream", stream, "--dry-run", "--json"], 0).await;
        assert_eq!(report["stream"], billing.as_str(), "{stream}");
    }
    // Another namespace's stream, or a bad suffix: a usage error, for every option alike.
    for (args, option) in [
        (vec!["tail", "--stream", "{elsewhere}:results:billing"], "--stream"),
        (vec!["retry", "--stream", "bill ing"], "--stream"),
        (vec!["submit", &items, "--model", "@cf/baai/bge-m3", "--reply-to", "{elsewhere}:results"], "--reply-to"),
    ] {
        let (code, _, stderr) = cli(&world, &args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.starts_with(&format!("batchd: {option} \"")), "{args:?}: {stderr}");
    }
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn stats_since_counts_finished_jobs_from_the_counters_and_jobs_filters_like_the_dashboard() {
    let world = World::new().await;
    let daemon = world.daemon();
    for id in ["a-1", "a-2"] {
        world.enqueue(&bge_m3_job(id, 1)).await;
        world.wait_for_result(id, WAIT).await;
    }
    world.enqueue(&json!({"id": "b-1", "model": "@cf/nobody/nothing", "requests": [{"text": "x"}]})).await;
    assert_eq!(world.wait_for_result("b-1", WAIT).await.status, ResultStatus::Failed);

    // Up to two hours back from the minute counters, further back from the hourly ones: the same three jobs.
    for (since, granularity) in [("1h", "minute"), ("3h", "hour"), ("8d", "hour")] {
        let stats = cli_json(&world, &["stats", "--since", since, "--json"], 0).await;
        let window = &stats["since"];
        assert_eq!(window["granularity"], granularity, "{since}: {stats}");
        assert_eq!(window["total"], 3, "{since}: {stats}");
        assert_eq!(window["finished"], json!({"completed": 2, "failed": 1}), "{since}: {stats}");
        assert!(window["from"].as_u64() < window["to"].as_u64(), "{since}: {stats}");
    }
    let (code, stdout, _) = cli(&world, &["stats", "--since", "1h"]).await;
    assert_eq!(code, 0);
    let line = stdout.lines().find(|line| line.starts_with("  finished since   ")).expect("the window's line");
    assert!(line.contains(", per-minute counters): 3 jobs (") && line.ends_with("): 2 completed, 1 failed"), "{line}");
    let (code, stdout, _) = cli(&world, &["stats"]).await;
    assert_eq!(code, 0);
    assert!(!stdout.contains("finished since"), "only when asked: {stdout}");

    // jobs: the dashboard's filters.
    let ids = |report: &Value| -> Vec<String> {
        report["jobs"].as_array().unwrap().iter().map(|job| job["job_id"].as_str().unwrap().to_owned()).collect()
    };
    let cases: [(&[&str], &[&str]); 5] = [
        (&["--model", "@cf/nobody/nothing"], &["b-1"]),
        (&["--id-prefix", "a-"], &["a-2", "a-1"]),
        (&["--since", "1h"], &["b-1", "a-2", "a-1"]),
        (&["--since", "2099-01-01"], &[]),
        (&["--id-prefix", "a-", "--state", "failed"], &[]),
    ];
    for (filters, expected) in cases {
        let mut args = vec!["jobs", "--json"];
        args.extend_from_slice(filters);
        assert_eq!(ids(&cli_json(&world, &args, 0).await), expected, "{filters:?}");
    }
    let (code, _, stderr) = cli(&world, &["jobs", "--id-prefix", "a*"]).await;
    assert_eq!(code, 1, "no glob reaches SCAN MATCH: {stderr}");
    assert!(stderr.contains("--id-prefix: "), "{stderr}");
    daemon.stop().await.unwrap();
}
