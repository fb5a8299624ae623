//! The producer examples in other languages, end to end: `examples/python` (redis-py), `examples/node` (ioredis)
//! and the Rust producer's example each enqueue a job for every provider (Cloudflare, OpenAI, Anthropic) and read
//! its result through a consumer group against a live daemon and the emulator; and the redis-cli walkthrough of
//! docs/producers.md, replayed line by line.
//!
//! Their packages come from `make examples-deps` (pinned). A missing interpreter or package fails the test with
//! what to run; it never skips.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use batchd_tests::{World, with_anthropic, with_openai};
use serde_json::Value;

use crate::cli_ops::{run, text};

/// The workspace root (the tests crate lives in `<root>/tests`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The Python of `make examples-deps`' virtual environment (or $BATCHD_EXAMPLES_PYTHON), with redis-py installed.
fn python() -> PathBuf {
    let python = std::env::var_os("BATCHD_EXAMPLES_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/examples-venv/bin/python3"));
    assert!(
        python.exists(),
        "the Python example needs its pinned packages: run `make examples-deps` (it creates {} with python3 -m venv \
         and installs examples/python/requirements.txt); python3 3.8+ with venv is required",
        python.display()
    );
    let check = Command::new(&python).args(["-c", "import redis"]).output().expect("run python");
    assert!(check.status.success(), "redis-py is missing from {}: run `make examples-deps`", python.display());
    python
}

/// `node`, with examples/node/node_modules installed.
fn node() -> PathBuf {
    let version = Command::new("node").arg("--version").output();
    assert!(
        version.as_ref().is_ok_and(|output| output.status.success()),
        "the Node example needs node 20 or newer on PATH (apt-get install nodejs npm), then `make examples-deps`"
    );
    let ioredis = root().join("examples/node/node_modules/ioredis/package.json");
    assert!(
        ioredis.exists(),
        "the Node example needs its pinned packages: run `make examples-deps` ({} is missing)",
        ioredis.display()
    );
    PathBuf::from("node")
}

/// Runs an example program against the world and returns its one JSON line.
async fn run_example(world: &World, mut command: Command) -> Value {
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("REDIS_URL", world.settings.redis.url.expose())
        .env("BATCHD_NAMESPACE", &world.settings.redis.namespace)
        .current_dir(root());
    let output =
        tokio::time::timeout(Duration::from_secs(90), run(command)).await.expect("the example ends within 90 s");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "exit {:?}\nstdout: {stdout}\nstderr: {stderr}", output.status.code());
    assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// The providers each example has a job for (its second argument).
const PROVIDERS: [&str; 3] = ["cloudflare", "openai", "anthropic"];

/// A world whose daemon has all three providers, each against the emulator.
async fn every_provider_world() -> World {
    let mut world = World::new().await;
    with_openai(&mut world.settings, &world.emulator);
    with_anthropic(&mut world.settings, &world.emulator);
    world
}

/// Checks that `job_id`'s result came from `provider`: its model's prefix and its remote batch ids.
async fn check_provider(world: &World, job_id: &str, provider: &str, n_items: usize) {
    let result = world.wait_for_result(job_id, Duration::from_secs(5)).await;
    assert_eq!(result.items_total, n_items);
    let (model_prefix, batch_prefix) = match provider {
        "cloudflare" => ("@cf/", ""),
        "openai" => ("openai/", "batch_"),
        _ => ("anthropic/", "msgbatch_"),
    };
    assert!(result.model.starts_with(model_prefix), "{job_id}: {}", result.model);
    assert!(!result.request_ids.is_empty(), "{job_id} was sent to a batch API");
    assert!(result.request_ids.iter().all(|id| id.starts_with(batch_prefix)), "{job_id}: {:?}", result.request_ids);
}

/// Checks an example's summary of a job with two items, and that its consumer group has nothing left pending.
async fn check(world: &World, summary: &Value, job_id: &str, group: &str, language: &str, provider: &str) {
    assert_eq!(summary["job_id"], job_id, "{summary}");
    assert_eq!(summary["status"], "completed", "{summary}");
    assert_eq!(summary["responses"], 2, "{summary}");
    assert_eq!(summary["succeeded"], 2, "{summary}");
    assert_eq!(summary["in_order"], true, "{summary}");
    assert_eq!(summary["metadata"]["example"], language, "{summary}");
    assert_eq!(summary["metadata"]["provider"], provider, "{summary}");
    assert_eq!(summary["redelivered"], false, "{summary}");
    let pending: Value = redis_value(world, &["XPENDING", &world.keys.results(), group]).await;
    assert_eq!(pending[0], 0, "{group} acknowledged what it read: {pending}");
    check_provider(world, job_id, provider, 2).await;
}

/// A Redis reply as JSON (integers, strings, arrays), for compact assertions.
async fn redis_value(world: &World, args: &[&str]) -> Value {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let value: redis::Value = cmd.query_async(&mut world.conn.clone()).await.expect("redis command");
    fn json(value: redis::Value) -> Value {
        match value {
            redis::Value::Int(n) => n.into(),
            redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned().into(),
            redis::Value::SimpleString(s) => s.into(),
            redis::Value::Array(items) => items.into_iter().map(json).collect(),
            _ => Value::Null,
        }
    }
    json(value)
}

/// Runs `program script <job id> <provider>` for every provider against one daemon, and checks each summary.
async fn run_for_every_provider(program: &Path, script: &str, language: &str, group: &str) {
    let world = every_provider_world().await;
    let daemon = world.daemon();
    for provider in PROVIDERS {
        let job_id = format!("{language}-{provider}");
        let mut command = Command::new(program);
        command.arg(script).arg(&job_id).arg(provider);
        let summary = run_example(&world, command).await;
        check(&world, &summary, &job_id, group, language, provider).await;
    }
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn the_python_example_enqueues_a_job_per_provider_and_reads_each_result_through_a_consumer_group() {
    run_for_every_provider(&python(), "examples/python/enqueue_and_read.py", "python", "py-example").await;
}

#[tokio::test]
async fn the_node_example_enqueues_a_job_per_provider_and_reads_each_result_through_a_consumer_group() {
    run_for_every_provider(&node(), "examples/node/enqueue_and_read.js", "node", "node-example").await;
}

/// The Rust producer's example binary (`cargo test`/`nextest run --workspace` build it; built here if missing).
fn rust_example() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let path = profile_dir.join("examples/enqueue_and_read");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status =
            Command::new(cargo).args(["build", "--quiet", "--workspace", "--examples"]).status().expect("run cargo");
        assert!(status.success() && path.exists(), "cannot build the batchd-producer example");
    }
    path
}

#[tokio::test]
async fn the_rust_producer_example_enqueues_a_job_per_provider_and_reads_each_result() {
    let example = rust_example();
    let world = every_provider_world().await;
    let daemon = world.daemon();
    for provider in PROVIDERS {
        let job_id = format!("rust-{provider}");
        let mut command = Command::new(&example);
        command.arg(&job_id).arg(provider);
        let summary = run_example(&world, command).await;
        assert_eq!(summary["job_id"], job_id.as_str(), "{summary}");
        assert_eq!(summary["status"], "completed", "{summary}");
        assert_eq!((summary["responses"].as_u64(), summary["succeeded"].as_u64()), (Some(1), Some(1)), "{summary}");
        let pending: Value = redis_value(&world, &["XPENDING", &world.keys.results(), "rust-example"]).await;
        assert_eq!(pending[0], 0);
        check_provider(&world, &job_id, provider, 1).await;
    }
    daemon.stop().await.unwrap();
}

/// Ids in the doc (`1763769600000-0`) stand for whatever Redis returned at that point.
fn is_entry_id(token: &str) -> bool {
    let token = token.trim_matches('"');
    token.split_once('-').is_some_and(|(ms, seq)| {
        ms.len() >= 10
            && ms.bytes().all(|b| b.is_ascii_digit())
            && !seq.is_empty()
            && seq.bytes().all(|b| b.is_ascii_digit())
    })
}

/// Whether an output line matches the documented one: equal, except that entry ids and Unix-ms timestamps match
/// any value (each documented id is bound to the real one, and later commands use the real one).
fn line_matches(documented: &str, actual: &str, ids: &mut HashMap<String, String>) -> bool {
    let (doc_tokens, real_tokens): (Vec<&str>, Vec<&str>) =
        (documented.split_whitespace().collect(), actual.split_whitespace().collect());
    if doc_tokens.len() != real_tokens.len() {
        return false;
    }
    for (doc, real) in doc_tokens.iter().zip(&real_tokens) {
        if doc == real {
            continue;
        }
        let doc_bare = doc.trim_matches('"');
        let real_bare = real.trim_matches('"');
        if is_entry_id(doc_bare) && is_entry_id(real_bare) {
            match ids.get(doc_bare) {
                Some(bound) if bound != real_bare => return false,
                _ => {
                    ids.insert(doc_bare.to_owned(), real_bare.to_owned());
                }
            }
            continue;
        }
        let is_ms = |t: &str| t.len() == 13 && t.bytes().all(|b| b.is_ascii_digit());
        if is_ms(doc_bare) && is_ms(real_bare) {
            continue;
        }
        // JSON values in the doc may be abbreviated with `...`; the rest must match.
        if doc_bare.strip_suffix("...").is_some_and(|prefix| real_bare.starts_with(prefix)) {
            continue;
        }
        return false;
    }
    true
}

/// One command of the walkthrough and the output the doc shows for it.
#[derive(Debug)]
struct Step {
    /// The command line as documented.
    command: String,
    /// The documented output lines (`# ` removed); a line `...` means "and more".
    output: Vec<String>,
}

/// The `redis-cli` lines of every ```sh block of a document, each with the `# ` comment lines below it.
fn walkthrough(doc: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut in_sh = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        if line.starts_with("redis-cli ") {
            steps.push(Step { command: line.to_owned(), output: Vec::new() });
        } else if let (Some(step), Some(output)) =
            (steps.last_mut(), line.strip_prefix("# ").or(line.strip_prefix("#").filter(|l| l.is_empty())))
        {
            step.output.push(output.to_owned());
        }
    }
    steps
}

#[tokio::test]
async fn the_redis_cli_walkthrough_of_the_producer_guide_replays() {
    let doc = std::fs::read_to_string(root().join("docs/producers.md")).expect("docs/producers.md");
    let steps = walkthrough(&doc);
    assert!(steps.len() >= 8, "the walkthrough has its steps: {steps:?}");
    let world = World::new().await;
    let daemon = world.daemon();
    let namespace = &world.settings.redis.namespace;
    let mut ids: HashMap<String, String> = HashMap::new();
    for step in &steps {
        let mut command_line = step.command.replace("{batchd}", &format!("{{{namespace}}}"));
        for (documented, real) in &ids {
            command_line = command_line.replace(documented.as_str(), real);
        }
        // What a person sees in a terminal (--no-raw), against the test's server.
        let command_line =
            command_line.replacen("redis-cli ", &format!("redis-cli -p {} --no-raw ", world.redis.port), 1);
        let mut command = Command::new("sh");
        command.arg("-c").arg(&command_line);
        let output = run(command).await;
        let actual = text(&output.stdout).replace(&format!("{{{namespace}}}"), "{batchd}");
        assert!(output.status.success(), "{command_line}: {}", text(&output.stderr));
        let actual_lines: Vec<&str> = actual.lines().collect();
        let mut index = 0;
        for documented in &step.output {
            if documented.trim() == "..." {
                index = actual_lines.len();
                break;
            }
            let Some(real) = actual_lines.get(index) else {
                panic!("{}\n  documented {documented:?}, but the output ended:\n{actual}", step.command);
            };
            assert!(
                line_matches(documented, real, &mut ids),
                "{}\n  documented: {documented}\n  actual:     {real}\nwhole output:\n{actual}",
                step.command
            );
            index += 1;
        }
        assert_eq!(
            index,
            actual_lines.len(),
            "{}: the doc shows all of the output (or ends with `...`):\n{actual}",
            step.command
        );
    }
    daemon.stop().await.unwrap();
}

#[test]
fn documented_lines_match_with_ids_bound_once() {
    let mut ids = HashMap::new();
    assert!(line_matches("\"1763769600000-0\"", "\"1795310391465-0\"", &mut ids));
    assert!(line_matches("2) \"1763769600000-0\"", "2) \"1795310391465-0\"", &mut ids));
    assert!(!line_matches("\"1763769600000-0\"", "\"1795310391466-0\"", &mut ids), "one doc id, one real id");
    assert!(line_matches("4) \"1763769605250\"", "4) \"1795310391999\"", &mut ids));
    assert!(line_matches("6) \"{\\\"responses\\\":[...", "6) \"{\\\"responses\\\":[{\\\"index\\\":0}]}\"", &mut ids));
    assert!(!line_matches("(integer) 1", "(integer) 2", &mut ids));
    let steps = walkthrough("```sh\nredis-cli PING\n# PONG\n```\n```text\nredis-cli NOT\n```\n");
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].output, ["PONG"]);
}
