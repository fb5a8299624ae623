//! The API token (and every provider's key) never leaves its header: not in the logs (JSON, debug level), not in Redis (any
//! key or value of any type: ledgers, schedule, results, dead letters, limiter state), not in `/metrics` or the
//! probes, not in anything the CLI prints, not in `Debug` output or a panic message.
//!
//! The real `batchd run` binary is driven through success, per-item failures, a refused job, a dead-letter entry,
//! a transient failure that is still being retried, and API replies that echo the `Authorization` header back
//! (whole, and where the error message is cut short). A second daemon with a wrong token gets a 401. Both tokens
//! are distinctive, and the check looks for every 12-character piece of them, so a token cut short is found too.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use batchd::settings::{Secret, Settings};
use batchd_core::ApiCode;
use batchd_core::{Keys, ResultEntry, ResultStatus};
use batchd_emulator::{Calls, EmulatorConfig, Fault};
use batchd_tests::{World, bge_m3_job, free_port, http_get, wait_for_http};
use redis::aio::MultiplexedConnection;

/// The daemon's token, the one the emulator accepts (40 characters, like a Cloudflare token).
const TOKEN: &str = "cfSECRETtok7Qx9Lm2Zp4Rv8Wn3Kd6Hj1Fb5Tc0Ys";
/// The second daemon's token, which the emulator refuses with 401/10000.
const WRONG_TOKEN: &str = "cfWRONGtok3Fz1Nq8Gk5Xw2Pb7Md4Lr9Vh6Jc0Tu";
/// A Redis password, which must not show either.
const REDIS_PASSWORD: &str = "rdsPASSWORD5Hq2Wm8Kx4Zt7Nc1Lv9Bj3";
/// The OpenAI key the emulator accepts (read from a credential file, as systemd and the Kubernetes manifests pass it).
const OPENAI_KEY: &str = "sk-proj-OPENAIkey4Tg8Rb2Yx6Mq0Wz3Hs7Lc5Nd1";
/// The Anthropic key the emulator accepts (read from a credential file likewise).
const ANTHROPIC_KEY: &str = "sk-ant-api03-ANTHROPICkey9Pf3Jw7Cv1Qe5Ku2Gy8";
/// Length of the pieces of a secret searched for.
const PIECE: usize = 12;

const WAIT: Duration = Duration::from_secs(60);

/// Fails when `text` holds any 12-character piece of a secret, showing where.
fn assert_clean(what: &str, text: &str) {
    for secret in [TOKEN, WRONG_TOKEN, REDIS_PASSWORD, OPENAI_KEY, ANTHROPIC_KEY] {
        for start in 0..=secret.len() - PIECE {
            let piece = &secret[start..start + PIECE];
            if let Some(at) = text.find(piece) {
                let mut from = at.saturating_sub(200);
                while !text.is_char_boundary(from) {
                    from -= 1;
                }
                let mut to = (at + 200).min(text.len());
                while !text.is_char_boundary(to) {
                    to += 1;
                }
                panic!("{what} holds part of a secret ({piece:?}) at byte {at}: …{}…", &text[from..to]);
            }
        }
    }
}

/// A `batchd` command for `namespace` with only the environment the test gives it.
fn batchd(world: &World, namespace: &str) -> Command {
    let mut command = world.batchd();
    command.env("BATCHD__REDIS__NAMESPACE", namespace).env("CLOUDFLARE_API_TOKEN", TOKEN);
    command
}

/// `batchd run` with JSON logs at debug level (or `log_filter`) written to files in `dir`.
fn start_daemon(
    world: &World,
    namespace: &str,
    token: &str,
    admin: SocketAddr,
    log_filter: &str,
    dir: &Path,
) -> Daemon {
    let stdout = dir.join(format!("{namespace}.stdout"));
    let stderr = dir.join(format!("{namespace}.stderr"));
    let mut command = batchd(world, namespace);
    command
        .env("CLOUDFLARE_API_TOKEN", token)
        .env("RUST_LOG", log_filter)
        .env("BATCHD__LOG__FORMAT", "json")
        .env("BATCHD__ADMIN__LISTEN", admin.to_string())
        .env("BATCHD__ADMIN__SAMPLE_INTERVAL_MS", "100")
        .env("BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS", "5")
        .env("BATCHD__INGRESS__BLOCK_MS", "200")
        .env("BATCHD__SCHEDULE__IDLE_POLL_MS", "20")
        .env("BATCHD__POLL__INITIAL_INTERVAL_MS", "100")
        .env("BATCHD__POLL__MAX_INTERVAL_MS", "300")
        .env("BATCHD__RETRY__INITIAL_BACKOFF_MS", "100")
        .env("BATCHD__RETRY__MAX_BACKOFF_MS", "300")
        // A job whose submit keeps failing stays in the schedule (and its ledger) while Redis is inspected.
        .env("BATCHD__RETRY__MAX_ATTEMPTS", "10000")
        .arg("run")
        .stdout(Stdio::from(std::fs::File::create(&stdout).expect("stdout file")))
        .stderr(Stdio::from(std::fs::File::create(&stderr).expect("stderr file")));
    Daemon { child: command.spawn().expect("start batchd run"), stdout, stderr }
}

/// A `batchd run` process whose output goes to files.
struct Daemon {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Daemon {
    /// SIGTERM, wait for a clean exit, and return everything it printed.
    async fn stop(mut self) -> String {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
        let status = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            loop {
                if let Some(status) = self.child.try_wait().expect("wait") {
                    return status;
                }
                if started.elapsed() > Duration::from_secs(30) {
                    let _ = self.child.kill();
                    panic!("batchd did not stop within 30 s of SIGTERM");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await
        .expect("join");
        let output = format!(
            "{}\n{}",
            std::fs::read_to_string(&self.stdout).expect("stdout"),
            std::fs::read_to_string(&self.stderr).expect("stderr")
        );
        assert_eq!(status.code(), Some(0), "batchd exited with {status}:\n{output}");
        output
    }
}

async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run batchd")).await.expect("join")
}

/// Runs a CLI command that must succeed; returns stdout and stderr together.
async fn cli(world: &World, namespace: &str, args: &[&str]) -> String {
    let mut command = batchd(world, namespace);
    command.args(args);
    let output = run(command).await;
    let text = format!("{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "batchd {args:?} failed: {text}");
    text
}

/// Waits for the one result entry of `job_id` in `stream`.
async fn wait_for_entry(world: &World, stream: &str, job_id: &str) -> ResultEntry {
    let started = Instant::now();
    loop {
        let entries = world.stream(stream).await;
        if let Some(fields) = entries.iter().find(|fields| fields.get("job_id").map(String::as_str) == Some(job_id)) {
            return ResultEntry::from_fields(fields).expect("well-formed result");
        }
        assert!(started.elapsed() < WAIT, "no result for {job_id} in {stream} after {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Renders a Redis reply as text, every string as it is stored (lossily as UTF-8).
fn render(value: &redis::Value, out: &mut String) {
    match value {
        redis::Value::BulkString(bytes) => out.push_str(&String::from_utf8_lossy(bytes)),
        redis::Value::SimpleString(text) => out.push_str(text),
        redis::Value::VerbatimString { text, .. } => out.push_str(text),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            for item in items {
                render(item, out);
                out.push('\n');
            }
        }
        redis::Value::Map(pairs) => {
            for (key, value) in pairs {
                render(key, out);
                out.push('=');
                render(value, out);
                out.push('\n');
            }
        }
        other => out.push_str(&format!("{other:?}")),
    }
}

/// Every key of the (private) Redis and its whole content, by type: strings, hashes, streams (entries, and
/// groups, consumers and pending entries via `XINFO STREAM FULL`), sorted sets, lists and sets.
async fn dump_redis(conn: &MultiplexedConnection) -> (String, HashMap<String, usize>) {
    let mut conn = conn.clone();
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) =
            redis::cmd("SCAN").arg(cursor).arg("COUNT").arg(1000).query_async(&mut conn).await.expect("scan");
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let mut dump = String::new();
    let mut types: HashMap<String, usize> = HashMap::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut conn).await.expect("type");
        let mut commands = Vec::new();
        match kind.as_str() {
            "string" => commands.push(redis::cmd("GET").arg(&key).clone()),
            "hash" => commands.push(redis::cmd("HGETALL").arg(&key).clone()),
            "stream" => {
                commands.push(redis::cmd("XRANGE").arg(&key).arg("-").arg("+").clone());
                commands.push(redis::cmd("XINFO").arg("STREAM").arg(&key).arg("FULL").clone());
            }
            "zset" => commands.push(redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).arg("WITHSCORES").clone()),
            "list" => commands.push(redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).clone()),
            "set" => commands.push(redis::cmd("SMEMBERS").arg(&key).clone()),
            "none" => continue,
            other => panic!("key {} has a type the test does not read: {other}", String::from_utf8_lossy(&key)),
        }
        *types.entry(kind.clone()).or_default() += 1;
        dump.push_str(&format!("--- {} ({kind})\n", String::from_utf8_lossy(&key)));
        for command in commands {
            let value: redis::Value = command.query_async(&mut conn).await.expect("read key");
            render(&value, &mut dump);
        }
    }
    (dump, types)
}

/// Waits until the ledger of `job_id` has recorded a failed attempt of chunk 0; returns the ledger.
async fn wait_for_failed_attempt(world: &World, job_id: &str) -> HashMap<String, String> {
    let started = Instant::now();
    loop {
        let ledger = world.ledger(job_id).await;
        if ledger.contains_key("c0:last_error") {
            return ledger;
        }
        assert!(started.elapsed() < WAIT, "{job_id} recorded no failed attempt: {ledger:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// An API error message that echoes the `Authorization` header, padded so that the 400-character cut of error
/// messages falls 16 characters into the token (a search for the whole token would miss what is left).
fn echo_cut_short() -> String {
    format!("{} Bearer {TOKEN}", "x".repeat(400 - " Bearer ".len() - 16))
}

#[tokio::test]
async fn the_token_never_leaves_the_authorization_header() {
    let world = World::with_emulator(EmulatorConfig { token: TOKEN.to_owned(), ..EmulatorConfig::default() }).await;
    let logs_dir = world.redis.dir.join("logs");
    std::fs::create_dir_all(&logs_dir).expect("logs dir");
    let namespace = world.settings.redis.namespace.clone();
    let keys = world.keys.clone();

    // A daemon with a wrong token, in a namespace of its own: its job fails with the API's 401. Trace level, so
    // every dependency's log line is searched too.
    let wrong_namespace = format!("{namespace}-wrong");
    let wrong_keys = Keys::new(&wrong_namespace).expect("namespace");
    let wrong_admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let wrong = start_daemon(&world, &wrong_namespace, WRONG_TOKEN, wrong_admin, "trace", &logs_dir);
    let mut conn = world.conn.clone();
    let job = bge_m3_job("sec-401", 1).to_string();
    let _: String =
        redis::AsyncCommands::xadd(&mut conn, wrong_keys.submit(), "*", &[("job", job)]).await.expect("xadd");
    let refused = wait_for_entry(&world, &wrong_keys.results(), "sec-401").await;
    assert_eq!(refused.status, ResultStatus::Failed);
    let error = refused.error.expect("error");
    assert_eq!(
        (error.code.as_str(), error.api_code.clone(), error.http_status),
        ("api_error", Some(ApiCode::Number(10000)), Some(401))
    );
    assert!(error.message.contains("Authentication error"), "{}", error.message);
    let (status, metrics) = http_get(wrong_admin, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200);
    assert_clean("the wrong-token daemon's /metrics", &metrics);
    let wrong_logs = wrong.stop().await;
    assert!(wrong_logs.contains("\"level\":\"TRACE\""), "trace logs were written");
    assert_clean("the wrong-token daemon's output", &wrong_logs);

    // The daemon with the right token.
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let daemon = start_daemon(&world, &namespace, TOKEN, admin, "debug", &logs_dir);
    wait_for_http(admin, "/readyz", WAIT, |status, _| status == 200).await;

    // Success.
    world.enqueue(&bge_m3_job("sec-ok", 2)).await;
    assert_eq!(world.wait_for_result("sec-ok", WAIT).await.status, ResultStatus::Completed);

    // Per-item failures.
    world.emulator.inject(Fault::fail_items([1]));
    world.enqueue(&bge_m3_job("sec-items", 3)).await;
    let items = world.wait_for_result("sec-items", WAIT).await;
    assert_eq!((items.status, items.items_failed), (ResultStatus::Completed, 1));

    // A refusal that echoes the token whole: the job fails with the message, the token redacted.
    world.emulator.inject(
        Fault::status(403)
            .code(5016)
            .message(format!("Terms not agreed; Authorization: Bearer {TOKEN}"))
            .on(Calls::Submit),
    );
    world.enqueue(&bge_m3_job("sec-echo", 1)).await;
    let echoed = world.wait_for_result("sec-echo", WAIT).await;
    assert_eq!(echoed.status, ResultStatus::Failed);
    let message = echoed.error.expect("error").message;
    assert!(message.contains("Authorization: Bearer [redacted]"), "{message}");

    // A transient poll failure whose message is cut inside the echoed token: retried, then completed.
    world.emulator.inject(Fault::status(500).message(echo_cut_short()).on(Calls::Poll));
    world.enqueue(&bge_m3_job("sec-echo-cut", 1)).await;
    assert_eq!(world.wait_for_result("sec-echo-cut", WAIT).await.status, ResultStatus::Completed);

    // Bad input: a job with a bad field, and entries that are not jobs (dead letters).
    world.enqueue(&serde_json::json!({"id": "sec-invalid", "model": "@cf/../x", "requests": [{"text": "x"}]})).await;
    assert_eq!(world.wait_for_result("sec-invalid", WAIT).await.status, ResultStatus::Failed);
    let not_json = world.enqueue_raw(&[("job", "not json".to_owned())]).await;
    let no_job = world.enqueue_raw(&[("jbo", bge_m3_job("x", 1).to_string())]).await;
    for entry_id in [&not_json, &no_job] {
        assert_eq!(world.wait_for_result(entry_id, WAIT).await.status, ResultStatus::Failed);
    }
    assert_eq!(world.stream(&keys.dead()).await.len(), 2);

    // A job whose submits keep failing with an echo (cut short): it stays scheduled, its last error in the ledger.
    world.emulator.inject(Fault::status(503).message(echo_cut_short()).on(Calls::Submit).times(100_000));
    world.enqueue(&bge_m3_job("sec-pending", 1)).await;
    let ledger = wait_for_failed_attempt(&world, "sec-pending").await;
    assert!(ledger["c0:last_error"].contains("xxxx"), "the echoed message is recorded: {ledger:?}");

    // The admin endpoints.
    let (status, metrics) = http_get(admin, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("batchd_"), "{metrics}");
    assert_clean("/metrics", &metrics);
    for path in ["/livez", "/readyz"] {
        let (_, body) = http_get(admin, path).await.expect("GET");
        assert_clean(path, &body);
    }

    // What the CLI shows, given the token in its environment.
    for id in ["sec-ok", "sec-items", "sec-echo", "sec-echo-cut", "sec-invalid", "sec-pending"] {
        assert_clean(&format!("status {id}"), &cli(&world, &namespace, &["status", id]).await);
        assert_clean(&format!("status {id} --json"), &cli(&world, &namespace, &["status", id, "--json"]).await);
    }
    assert_clean("status sec-401", &cli(&world, &wrong_namespace, &["status", "sec-401", "--json"]).await);
    assert_clean("dead list", &cli(&world, &namespace, &["dead", "list", "--json"]).await);
    assert_clean("jobs", &cli(&world, &namespace, &["jobs", "--json", "--limit", "100"]).await);
    assert_clean("stats", &cli(&world, &namespace, &["stats", "--json"]).await);
    let tail = cli(&world, &namespace, &["tail", "--from-start", "--count", "7", "--timeout", "10", "--json"]).await;
    assert_clean("tail", &tail);

    // Result and dead-letter entries, then everything in Redis.
    for (stream, n) in [(keys.results(), 7), (keys.dead(), 2), (wrong_keys.results(), 1)] {
        let entries = world.stream(&stream).await;
        assert_eq!(entries.len(), n, "{stream}");
        assert_clean(&stream, &format!("{entries:?}"));
    }
    let (dump, types) = dump_redis(&world.conn).await;
    for kind in ["stream", "hash", "zset", "string"] {
        assert!(types.get(kind).copied().unwrap_or(0) > 0, "no {kind} in Redis to search: {types:?}");
    }
    assert!(dump.contains("sec-pending") && dump.contains("[redacted]"), "the dump holds the jobs:\n{dump}");
    assert_clean("Redis", &dump);

    let logs = daemon.stop().await;
    assert!(logs.contains("\"level\":\"DEBUG\""), "debug logs were written");
    assert!(logs.contains("[redacted]"), "the echoed errors were logged, redacted");
    assert_clean("the daemon's output", &logs);
}

/// Every provider's key, read from its credential file (`$CREDENTIALS_DIRECTORY/<name>`, as the systemd unit and
/// the Kubernetes manifests pass them), is used and never leaves its header: a Workers AI, an OpenAI and an
/// Anthropic job complete, and refusals that echo the OpenAI and Anthropic keys are recorded redacted, while the
/// logs (debug), `/metrics`, the CLI's output and everything in Redis hold no piece of any key. Key files others
/// can read are warned about, each once, at start (the log) and by `batchd config check` (stderr); `0600` files
/// get no warning.
#[tokio::test]
async fn every_providers_key_comes_from_its_credential_and_never_leaves_its_header() {
    use batchd_emulator::{AnthropicCalls, AnthropicConfig, AnthropicFault, OpenAiCallKind, OpenAiConfig, OpenAiFault};
    use std::os::unix::fs::PermissionsExt as _;

    let openai = OpenAiConfig { api_key: OPENAI_KEY.to_owned(), ..OpenAiConfig::default() };
    let anthropic = AnthropicConfig { api_key: ANTHROPIC_KEY.to_owned(), ..AnthropicConfig::default() };
    let world = World::with_emulator(EmulatorConfig {
        token: TOKEN.to_owned(),
        openai,
        anthropic,
        ..EmulatorConfig::default()
    })
    .await;
    let namespace = world.settings.redis.namespace.clone();
    let dir = world.redis.dir.join("keys");
    let credentials = dir.join("credentials");
    std::fs::create_dir_all(&credentials).expect("credentials dir");
    let keys = [("cloudflare-api-token", TOKEN), ("openai-api-key", OPENAI_KEY), ("anthropic-api-key", ANTHROPIC_KEY)];
    for (name, key) in keys {
        let file = credentials.join(name);
        std::fs::write(&file, format!("{key}\n")).expect("key file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    // Only the credentials give the keys: the token from the environment `batchd` sets is taken away.
    let with_credentials = |command: &mut Command| {
        command
            .env_remove("CLOUDFLARE_API_TOKEN")
            .env("CREDENTIALS_DIRECTORY", &credentials)
            .env("BATCHD__OPENAI__BASE_URL", world.emulator.openai_base_url())
            .env("BATCHD__OPENAI__BATCHES_PER_HOUR", "0")
            .env("BATCHD__OPENAI__REQUEST_TIMEOUT_SECS", "5")
            .env("BATCHD__ANTHROPIC__BASE_URL", world.emulator.anthropic().base_url())
            .env("BATCHD__ANTHROPIC__REQUEST_TIMEOUT_SECS", "2");
    };
    // Each key's setting and the credential that fills it.
    let key_files = [
        ("cloudflare.api_token_file", "cloudflare-api-token"),
        ("openai.api_key_file", "openai-api-key"),
        ("anthropic.api_key_file", "anthropic-api-key"),
    ];
    let config_check = async |expect_warnings: bool| {
        let mut command = batchd(&world, &namespace);
        with_credentials(&mut command);
        command.args(["config", "check"]);
        let output = run(command).await;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "config check passes with warnings: {stderr}");
        for (key, name) in key_files {
            let warning = format!(
                "batchd: warning: {key} {} is readable or writable by others (mode 644); chmod 600 it",
                credentials.join(name).display()
            );
            assert_eq!(stderr.matches(&warning).count(), usize::from(expect_warnings), "{key}: {stderr}");
        }
        assert_clean("batchd config check", &format!("{}{stderr}", String::from_utf8_lossy(&output.stdout)));
    };
    config_check(true).await;

    // The daemon, from the credentials (still 0644: it warns once for each at start, and runs).
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let logs_dir = dir.join("logs");
    std::fs::create_dir_all(&logs_dir).expect("logs dir");
    let stdout = logs_dir.join("daemon.stdout");
    let stderr = logs_dir.join("daemon.stderr");
    let mut command = batchd(&world, &namespace);
    with_credentials(&mut command);
    command
        .env("RUST_LOG", "debug")
        .env("BATCHD__LOG__FORMAT", "json")
        .env("BATCHD__ADMIN__LISTEN", admin.to_string())
        .env("BATCHD__ADMIN__SAMPLE_INTERVAL_MS", "100")
        .env("BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS", "5")
        .env("BATCHD__INGRESS__BLOCK_MS", "200")
        .env("BATCHD__SCHEDULE__IDLE_POLL_MS", "20")
        .env("BATCHD__POLL__INITIAL_INTERVAL_MS", "100")
        .env("BATCHD__POLL__MAX_INTERVAL_MS", "300")
        .env("BATCHD__RETRY__INITIAL_BACKOFF_MS", "100")
        .env("BATCHD__RETRY__MAX_BACKOFF_MS", "300")
        .arg("run")
        .stdout(Stdio::from(std::fs::File::create(&stdout).expect("stdout file")))
        .stderr(Stdio::from(std::fs::File::create(&stderr).expect("stderr file")));
    let daemon = Daemon { child: command.spawn().expect("start batchd run"), stdout, stderr };
    wait_for_http(admin, "/readyz", WAIT, |status, _| status == 200).await;

    // Each provider runs a job with its key.
    let chat = |text: &str| serde_json::json!({"messages": [{"role": "user", "content": text}], "max_tokens": 5});
    let message = |text: &str| serde_json::json!({"max_tokens": 32, "messages": [{"role": "user", "content": text}]});
    world.enqueue(&bge_m3_job("keys-cf", 2)).await;
    world
        .enqueue(&serde_json::json!({"id": "keys-openai", "model": "openai/gpt-4o-mini", "requests": [chat("a")]}))
        .await;
    let anthropic_job =
        |id: &str| serde_json::json!({"id": id, "model": "anthropic/claude-sonnet-4-5", "requests": [message("b")]});
    world.enqueue(&anthropic_job("keys-anthropic")).await;
    for id in ["keys-cf", "keys-openai", "keys-anthropic"] {
        let entry = world.wait_for_result(id, WAIT).await;
        assert_eq!(entry.status, ResultStatus::Completed, "{id}: {:?}", entry.error);
    }

    // Refusals that echo the key whole: the jobs fail with the message, the key redacted.
    world
        .emulator
        .openai()
        .inject(OpenAiFault::status(403).message(format!("Forbidden for key {OPENAI_KEY}")).on(OpenAiCallKind::Upload));
    world
        .enqueue(&serde_json::json!({"id": "keys-openai-echo", "model": "openai/gpt-4o-mini", "requests": [chat("c")]}))
        .await;
    world.emulator.anthropic().inject(
        AnthropicFault::status(403).message(format!("x-api-key {ANTHROPIC_KEY} may not")).on(AnthropicCalls::Create),
    );
    world.enqueue(&anthropic_job("keys-anthropic-echo")).await;
    for id in ["keys-openai-echo", "keys-anthropic-echo"] {
        let entry = world.wait_for_result(id, WAIT).await;
        assert_eq!(entry.status, ResultStatus::Failed, "{id}");
        let message = entry.error.expect("error").message;
        assert!(message.contains("[redacted]"), "{id}: {message}");
    }

    // Transient refusals whose echoed key is cut 16 characters in by the client's cap on a quoted message (OpenAI
    // 2,048 characters, Anthropic 300): retried, then completed; no piece of the key is kept or logged.
    // Each pads with its own letter, to find its message again below.
    let cut_short = |pad: &str, cap: usize, key: &str| format!("{} {key}", pad.repeat(cap - 1 - 16));
    world
        .emulator
        .openai()
        .inject(OpenAiFault::status(500).message(cut_short("o", 2048, OPENAI_KEY)).on(OpenAiCallKind::GetBatch));
    world
        .enqueue(&serde_json::json!({"id": "keys-openai-cut", "model": "openai/gpt-4o-mini", "requests": [chat("d")]}))
        .await;
    world
        .emulator
        .anthropic()
        .inject(AnthropicFault::status(500).message(cut_short("q", 300, ANTHROPIC_KEY)).on(AnthropicCalls::Retrieve));
    world.enqueue(&anthropic_job("keys-anthropic-cut")).await;
    for id in ["keys-openai-cut", "keys-anthropic-cut"] {
        let entry = world.wait_for_result(id, WAIT).await;
        assert_eq!(entry.status, ResultStatus::Completed, "{id}: {:?}", entry.error);
    }
    let openai_500s = world
        .emulator
        .openai()
        .calls_of(OpenAiCallKind::GetBatch)
        .iter()
        .filter(|call| call.http_status == 500)
        .count();
    let anthropic_500s = world
        .emulator
        .anthropic()
        .calls_of(batchd_emulator::AnthropicCallKind::Retrieve)
        .iter()
        .filter(|call| call.status == 500)
        .count();
    assert_eq!((openai_500s, anthropic_500s), (1, 1), "each cut-short echo was served once");

    let (status, metrics) = http_get(admin, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200);
    assert_clean("/metrics", &metrics);
    for id in ["keys-cf", "keys-openai", "keys-anthropic", "keys-openai-echo", "keys-anthropic-echo", "keys-openai-cut"]
    {
        assert_clean(&format!("status {id} --json"), &cli(&world, &namespace, &["status", id, "--json"]).await);
    }
    let tail = cli(&world, &namespace, &["tail", "--from-start", "--count", "7", "--timeout", "10", "--json"]).await;
    assert_clean("tail", &tail);
    let (dump, _) = dump_redis(&world.conn).await;
    assert!(dump.contains("keys-openai-echo") && dump.contains("[redacted]"), "the dump holds the jobs:\n{dump}");
    assert_clean("Redis", &dump);
    let logs = daemon.stop().await;
    assert!(logs.contains("\"level\":\"DEBUG\""), "debug logs were written");
    for (key, _) in key_files {
        let lines = logs.lines().filter(|line| line.contains("unsafe setting") && line.contains(key)).count();
        assert_eq!(lines, 1, "{key}: warned once at start:\n{logs}");
    }
    assert_clean("the daemon's output", &logs);
    // The cut-short messages were kept or logged, their piece of the key redacted.
    let everything = format!("{logs}\n{dump}");
    for pad in ["oooo", "qqqq"] {
        assert!(everything.contains(&format!("{pad} [redacted]")), "the message padded with {pad:?} is nowhere");
    }

    // chmod 600: no warning.
    for (_, name) in key_files {
        std::fs::set_permissions(credentials.join(name), std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    config_check(false).await;
}

/// A token the client cannot send (a control character) stops `batchd run` with a message that does not show it.
#[tokio::test]
async fn a_token_that_cannot_be_sent_is_refused_without_being_shown() {
    let world = World::new().await;
    let namespace = world.settings.redis.namespace.clone();
    let mut command = batchd(&world, &namespace);
    command.env("CLOUDFLARE_API_TOKEN", format!("{TOKEN}\u{7f}")).env("BATCHD__ADMIN__LISTEN", "").arg("run");
    let output = run(command).await;
    let text = format!("{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!output.status.success(), "{text}");
    assert!(text.contains("token"), "the message says what is wrong: {text}");
    assert_clean("batchd run with a bad token", &text);

    // In-process, the same through `batchd::run`.
    let mut settings = world.settings.clone();
    settings.admin.listen = String::new();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        batchd::run(settings, Secret::new(format!("{TOKEN}\u{7f}")), shutdown.clone()),
    )
    .await
    .expect("run returns");
    shutdown.cancel();
    let error = result.expect_err("a token that cannot be sent is refused");
    assert_clean("batchd::run's error", &format!("{error:?} {error:#}"));
}

/// `Debug` output of the settings (as a panic message would show them) hides the token and the Redis password,
/// whether the token came from the environment or from a file.
#[test]
fn settings_never_print_the_token() {
    let dir = std::env::temp_dir().join(format!("batchd-it-secrets-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
    let url = format!("redis://batchd:{REDIS_PASSWORD}@127.0.0.1:6379/0");
    let from_env: HashMap<String, String> =
        [("CLOUDFLARE_API_TOKEN", TOKEN.to_owned()), ("REDIS_URL", url.clone()), ("CLOUDFLARE_ACCOUNT_ID", "a".into())]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
    let from_file: HashMap<String, String> = [
        ("BATCHD__CLOUDFLARE__API_TOKEN_FILE", token_file.display().to_string()),
        ("BATCHD__REDIS__URL", url),
        ("CLOUDFLARE_ACCOUNT_ID", "a".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for env in [from_env, from_file] {
        let settings = Settings::load_from(None, &env).expect("settings");
        let token = settings.api_token().expect("token");
        assert_eq!(token.expose(), TOKEN, "the token is read");
        assert_clean("settings", &format!("{settings:?} {settings:#?} {token:?}"));
        let panic = std::panic::catch_unwind(|| panic!("handler failed with {settings:?} and {token:?}"));
        let payload = panic.expect_err("panicked");
        let message = payload.downcast_ref::<String>().expect("a formatted panic message");
        assert!(message.contains("[redacted]"), "{message}");
        assert_clean("a panic message", message);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
