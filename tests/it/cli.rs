//! The `batchd` binary: `submit --wait`, `status`, exit codes, configuration errors and SIGTERM handling.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use batchd_tests::{World, bge_m3_job};

fn batchd(world: &World) -> Command {
    let mut command = world.batchd();
    command
        .env("BATCHD__POLL__INITIAL_INTERVAL_MS", "100")
        .env("BATCHD__POLL__MAX_INTERVAL_MS", "300")
        // A free port for the admin server, so a daemon started here never collides with another one.
        .env("BATCHD__ADMIN__LISTEN", "127.0.0.1:0");
    command
}

async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run batchd")).await.expect("join")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn submit_wait_prints_progress_and_the_result_and_status_shows_the_timeline() {
    let world = World::new().await;
    let daemon = world.daemon();
    let file = world.redis.dir.join("job.json");
    std::fs::write(&file, bge_m3_job("cli-1", 3).to_string()).unwrap();

    let mut submit = batchd(&world);
    submit.args(["submit", "--wait", "--timeout", "60"]).arg(&file);
    let output = run(submit).await;
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "stderr: {stderr}");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("cli-1"), "the job id comes first: {stdout}");
    let result: serde_json::Value = serde_json::from_str(&lines.collect::<Vec<_>>().join("\n")).expect("result JSON");
    assert_eq!(result["status"], "completed");
    assert_eq!(result["items_total"], 3);
    let indices: Vec<u64> =
        result["result"]["responses"].as_array().unwrap().iter().map(|r| r["index"].as_u64().unwrap()).collect();
    assert_eq!(indices, [0, 1, 2]);
    // Progress, one line per change when stderr is not a terminal.
    assert!(
        stderr.contains("cli-1: running (chunk 0: queued)") || stderr.contains("cli-1: running (chunk 0: running)"),
        "{stderr}"
    );
    assert!(stderr.lines().last().unwrap_or_default().contains("cli-1: completed"), "{stderr}");

    let mut status = batchd(&world);
    status.args(["status", "cli-1"]);
    let output = run(status).await;
    assert!(output.status.success());
    let shown = text(&output.stdout);
    assert!(
        shown.starts_with(&format!(
            "job cli-1 (namespace {} on {})",
            world.settings.redis.namespace,
            world.redis.url()
        )),
        "{shown}"
    );
    assert!(shown.contains("state        completed"), "{shown}");
    assert!(shown.contains("chunk 0      done  items 0:3  request "), "{shown}");

    let mut status = batchd(&world);
    status.args(["status", "cli-1", "--json"]);
    let output = run(status).await;
    let ledger: serde_json::Value = serde_json::from_slice(&output.stdout).expect("status --json is JSON");
    assert_eq!(ledger["state"], "completed");
    assert_eq!(ledger["job_id"], "cli-1");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn bad_input_to_the_cli_gives_one_line_and_a_nonzero_exit() {
    let world = World::new().await;
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["status", "no-such-job"], 5, "batchd: no job no-such-job in namespace"),
        (vec!["status", "bad id"], 1, "batchd: job id \"bad id\" contains ' '"),
        (vec!["submit", "/nonexistent/job.json"], 1, "batchd: cannot read /nonexistent/job.json"),
    ];
    for (args, code, message) in cases {
        let mut command = batchd(&world);
        command.args(&args);
        let output = run(command).await;
        let stderr = crate::cli_ops::without_warnings(&text(&output.stderr));
        assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.starts_with(message), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: one line: {stderr}");
    }

    let file = world.redis.dir.join("bad.json");
    std::fs::write(&file, r#"{"id":"x","model":"@cf/baai/bge-m3","requests":[]}"#).unwrap();
    let mut command = batchd(&world);
    command.arg("submit").arg(&file);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        text(&output.stderr).trim_end(),
        format!("batchd: {}: invalid `requests`: must not be empty", file.display())
    );
    let length: usize = redis::AsyncCommands::xlen(&mut world.conn.clone(), world.keys.submit()).await.unwrap();
    assert_eq!(length, 0, "an invalid job is not enqueued");

    let mut command = batchd(&world);
    command.env("REDIS_URL", "redis://127.0.0.1:1").args(["status", "x"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).starts_with("batchd: cannot reach Redis at redis://127.0.0.1:1"),
        "{}",
        text(&output.stderr)
    );
}

#[tokio::test]
async fn configuration_errors_exit_78_naming_the_key() {
    let world = World::new().await;
    let mut command = batchd(&world);
    command.env("BATCHD__POLL__MAX_INTERVAL_MS", "soon").args(["status", "x"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(78));
    assert!(text(&output.stderr).contains("poll.max_interval_ms"), "{}", text(&output.stderr));

    let mut command = batchd(&world);
    command.arg("run");
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(78), "no token");
    assert_eq!(
        text(&output.stderr).trim_end(),
        "batchd: configuration: cloudflare.api_token (CLOUDFLARE_API_TOKEN or BATCHD__CLOUDFLARE__API_TOKEN): not set; \
         set it, or cloudflare.api_token_file (BATCHD__CLOUDFLARE__API_TOKEN_FILE)"
    );
}

#[tokio::test]
async fn sigterm_drains_and_exits_zero() {
    let world = World::new().await;
    let mut command = batchd(&world);
    command
        .env("CLOUDFLARE_API_TOKEN", world.emulator.token())
        .env("BATCHD__LOG__FORMAT", "json")
        // The smallest runtime a deployment may choose: one thread runs the whole daemon and its shutdown.
        .env("BATCHD__WORKERS__RUNTIME_THREADS", "1")
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = command.spawn().expect("start");
    world.enqueue(&bge_m3_job("before-term", 1)).await;
    world.wait_for_result("before-term", Duration::from_secs(30)).await;

    let pid = child.id().to_string();
    let stopped_at = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    assert_eq!(output.status.code(), Some(0), "full log:\n{}", text(&output.stderr));
    assert!(stopped_at.elapsed() < Duration::from_secs(10));
    let logs = text(&output.stderr);
    for line in logs.lines() {
        let event: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        assert!(event.get("level").is_some());
    }
    assert!(logs.contains("\"job_id\":\"before-term\""), "job_id is a field of the JSON logs");
    assert!(logs.contains("batchd stopped"));
    assert!(!logs.contains(world.emulator.token()), "the token never reaches the logs");
}

#[tokio::test]
async fn config_check_prints_the_effective_settings_or_names_the_bad_key() {
    let world = World::new().await;
    let good = world.redis.dir.join("good.toml");
    std::fs::write(&good, "[poll]\nmultiplier = 1.25\nmax_interval_ms = 45000\n[jobs]\nretry_failed_items = true\n")
        .unwrap();
    let mut command = batchd(&world);
    command.env("CLOUDFLARE_API_TOKEN", "check-token-value").arg("--config").arg(&good).args(["config", "check"]);
    let output = run(command).await;
    let shown = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(shown.contains("multiplier = 1.25"), "the file's value is in effect: {shown}");
    assert!(shown.contains("max_interval_ms = 300"), "the environment wins over the file: {shown}");
    assert!(shown.contains("retry_failed_items = true"));
    assert!(shown.contains(&format!("namespace = \"{}\"", world.settings.redis.namespace)), "{shown}");
    assert!(shown.contains("api_token = \"[redacted]\""), "{shown}");
    assert!(!shown.contains("check-token-value"));

    let bad = world.redis.dir.join("bad.toml");
    std::fs::write(&bad, "[jobs]\nmax_items = \"many\"\n").unwrap();
    let mut command = batchd(&world);
    command.env("CLOUDFLARE_API_TOKEN", "t").arg("--config").arg(&bad).args(["config", "check"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(78));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("jobs.max_items"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1);

    // `run` needs the token; `config check` says so like `run` would.
    let mut command = batchd(&world);
    command.args(["config", "check"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(78));
    assert!(text(&output.stderr).contains("cloudflare.api_token"), "{}", text(&output.stderr));
}
