//! A real `kill -9` that lands inside a create, at OpenAI, Anthropic and Gemini. The emulator makes the batch and holds
//! its reply (the `hold` fault); the `batchd run` process that sent the create is killed at that moment, so it
//! never learns the batch's id, and nothing of it runs after the kill (unlike the in-process crash tests of
//! `openai.rs` and `anthropic.rs`, which abort a task whose destructors run). Another `batchd run` process takes
//! the chunk over: it must look the batch up and adopt it (one batch at the provider, one `completed` result), and
//! the ledger counts the create as one possible duplicate (DESIGN 5 and 18, docs/providers.md "No double billing
//! on an uncertain create").
//!
//! Each process talks to the emulator on a port of its own, so the call log says which process made each call.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use batchd_core::ResultStatus;
use batchd_emulator::{
    AnthropicCallKind, AnthropicCalls, AnthropicConfig, AnthropicFault, EmulatorConfig, EmulatorHandle, GeminiCallKind,
    GeminiCalls, GeminiFault, OPENAI_PREFIX, OpenAiCallKind, OpenAiFault,
};
use batchd_tests::{World, wait_until};
use serde_json::{Value, json};

/// How long any one step may take (a process start, a lease running out, a look-up, a batch ending).
const WAIT: Duration = Duration::from_secs(30);

/// The settings of `batchd_tests::test_settings` that matter here, as a process's environment: short leases,
/// fast polls and retries, request timeouts under the lease.
const TEST_ENV: &[(&str, &str)] = &[
    ("BATCHD__ADMIN__LISTEN", "127.0.0.1:0"),
    ("BATCHD__LOG__LEVEL", "info"),
    ("BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS", "5"),
    ("BATCHD__SCHEDULE__LEASE_SECS", "6"),
    ("BATCHD__SCHEDULE__IDLE_POLL_MS", "20"),
    ("BATCHD__INGRESS__BLOCK_MS", "200"),
    ("BATCHD__INGRESS__RECLAIM_IDLE_SECS", "2"),
    ("BATCHD__INGRESS__RECLAIM_INTERVAL_SECS", "1"),
    ("BATCHD__POLL__INITIAL_INTERVAL_MS", "100"),
    ("BATCHD__POLL__MAX_INTERVAL_MS", "300"),
    ("BATCHD__RETRY__INITIAL_BACKOFF_MS", "50"),
    ("BATCHD__RETRY__MAX_BACKOFF_MS", "200"),
    ("BATCHD__RETRY__MAX_ATTEMPTS", "4"),
    ("BATCHD__SHUTDOWN__GRACE_SECS", "5"),
    ("BATCHD__OPENAI__BATCHES_PER_HOUR", "0"),
    ("BATCHD__OPENAI__REQUEST_TIMEOUT_SECS", "5"),
    ("BATCHD__ANTHROPIC__REQUEST_TIMEOUT_SECS", "5"),
    ("BATCHD__ANTHROPIC__REQUESTS_PER_MINUTE", "0"),
    ("BATCHD__GEMINI__REQUEST_TIMEOUT_SECS", "5"),
];

/// A `batchd run` process with its own port on the emulator; killed on drop, its log printed if the test failed.
#[derive(Debug)]
struct Process {
    /// The running process; `None` once killed.
    child: Option<Child>,
    /// The emulator port this process (and only it) calls.
    port: u16,
    /// Its stdout and stderr.
    log: PathBuf,
}

impl Process {
    /// Starts `batchd run` against the world's Redis and namespace, with every provider pointed at a new port
    /// of the emulator.
    async fn start(world: &World, name: &str, packing: bool) -> Self {
        let emulator: &EmulatorHandle = &world.emulator;
        let addr = emulator.listen_also("127.0.0.1:0".parse().expect("addr")).await.expect("listen");
        let origin = format!("http://{addr}");
        let log =
            std::env::temp_dir().join(format!("batchd-it-kill-create-{}-{name}.log", world.settings.redis.namespace));
        let file = std::fs::File::create(&log).expect("create the log file");
        let mut command: Command = world.batchd();
        command
            .arg("run")
            .envs(TEST_ENV.iter().copied())
            .env("BATCHD__PACKING__ENABLED", packing.to_string())
            .env("CLOUDFLARE_API_TOKEN", emulator.token())
            .env("BATCHD__CLOUDFLARE__BASE_URL", EmulatorHandle::base_url_of(addr))
            .env("OPENAI_API_KEY", emulator.openai().api_key())
            .env("BATCHD__OPENAI__BASE_URL", format!("{origin}{OPENAI_PREFIX}"))
            .env("ANTHROPIC_API_KEY", emulator.anthropic().api_key())
            .env("BATCHD__ANTHROPIC__BASE_URL", format!("{origin}/anthropic"))
            .env("GEMINI_API_KEY", emulator.gemini().api_key())
            .env("BATCHD__GEMINI__BASE_URL", format!("{origin}/gemini"))
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file);
        let child = command.spawn().expect("start batchd run");
        Self { child: Some(child), port: addr.port(), log }
    }

    /// `kill -9` (SIGKILL) and reap it; answers when it was dead, in Unix milliseconds.
    fn kill_9(&mut self) -> u64 {
        let mut child = self.child.take().expect("running");
        child.kill().expect("kill -9");
        let status = child.wait().expect("reap");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "killed by SIGKILL: {status}");
        unix_ms()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            eprintln!("---- last lines of {} ----", self.log.display());
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

/// Waits until the job has its one `completed` result and no work is left (nothing scheduled, leased or
/// unacknowledged), then checks that it still has exactly one result.
async fn assert_one_completed_result(world: &World, job_id: &str) {
    let entry = world.wait_for_result(job_id, WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    world.wait_until_settled(WAIT).await;
    let results = world.results().await;
    let mine = results.iter().filter(|fields| fields.get("job_id").map(String::as_str) == Some(job_id)).count();
    assert_eq!(mine, 1, "exactly one result for {job_id}: {results:?}");
}

/// The count of creates whose outcome was unknown, in the ledger of what was created: the job's own, or its
/// pack's when it was packed.
async fn possible_duplicate_submits(world: &World, job_id: &str) -> Option<String> {
    let ledger = world.ledger(job_id).await;
    match ledger.get("c0:pack") {
        Some(pack) => world.ledger(pack).await.get("possible_duplicate_submits").cloned(),
        None => ledger.get("possible_duplicate_submits").cloned(),
    }
}

/// What the killed create carries: one job of `items` (unpacked), or one one-request job per item sharing a pack.
/// Returns the job ids.
async fn enqueue(world: &World, prefix: &str, model: &str, items: Vec<Value>, packed: bool) -> Vec<String> {
    let jobs: Vec<(String, Vec<Value>)> = if packed {
        items.into_iter().enumerate().map(|(i, item)| (format!("{prefix}-{i}"), vec![item])).collect()
    } else {
        vec![(prefix.to_owned(), items)]
    };
    let mut pipe = redis::pipe();
    for (id, requests) in &jobs {
        let job = json!({"id": id, "model": model, "requests": requests});
        pipe.xadd(world.keys.submit(), "*", &[("job", job.to_string())]).ignore();
    }
    let _: () = pipe.query_async(&mut world.conn.clone()).await.expect("enqueue");
    jobs.into_iter().map(|(id, _)| id).collect()
}

#[tokio::test]
async fn openai_a_kill_9_inside_the_create_leaves_one_batch_the_next_process_looks_up_and_adopts() {
    openai_kill_9_inside_the_create(false).await;
}

#[tokio::test]
async fn openai_a_kill_9_inside_a_packs_create_leaves_one_batch_the_next_process_looks_up_and_adopts() {
    openai_kill_9_inside_the_create(true).await;
}

async fn openai_kill_9_inside_the_create(packed: bool) {
    let world = World::new().await;
    let openai = world.emulator.openai();
    // The create makes its batch, is logged, and its reply is held until the client is gone.
    openai.inject(OpenAiFault::hold().on(OpenAiCallKind::CreateBatch).after_handling());
    let mut first = Process::start(&world, "first", packed).await;
    let jobs = enqueue(&world, "killed-openai", "openai/gpt-4o-mini", vec![chat("a"), chat("b")], packed).await;
    assert!(openai.wait_until_held(1, WAIT).await, "the create never reached the emulator");
    let creates = openai.calls_of(OpenAiCallKind::CreateBatch);
    assert_eq!(creates.len(), 1, "{creates:?}");
    assert_eq!((creates[0].port, creates[0].http_status), (first.port, 200), "the first process's create was handled");
    let held_batch = creates[0].batch_id.clone().expect("the create made a batch");

    let killed_at_ms = first.kill_9();
    // The kill cut the held call's connection: its reply was never delivered.
    wait_until("the killed process's held create to end", WAIT, async || openai.held_replies() == 0).await;
    let first_looked =
        openai.calls().iter().any(|call| call.port == first.port && call.kind == OpenAiCallKind::ListBatches);
    assert!(
        !first_looked,
        "the first process looked its batch up before the kill: the kill did not land in the create"
    );

    let second = Process::start(&world, "second", packed).await;
    for job in &jobs {
        assert_one_completed_result(&world, job).await;
    }
    assert_eq!(openai.batch_count(), 1, "exactly one batch at the provider: {:?}", openai.batch_statuses());
    assert_eq!(openai.calls_of(OpenAiCallKind::CreateBatch).len(), 1, "the second process did not create");
    let calls = openai.calls();
    let looked = calls
        .iter()
        .any(|call| call.port == second.port && call.kind == OpenAiCallKind::ListBatches && call.at_ms >= killed_at_ms);
    assert!(looked, "the second process listed batches to look for the chunk's: {calls:?}");
    let adopted = calls.iter().any(|call| {
        call.port == second.port
            && call.kind == OpenAiCallKind::GetBatch
            && call.batch_id.as_deref() == Some(held_batch.as_str())
    });
    assert!(adopted, "the second process polled the held batch {held_batch}: {calls:?}");
    assert_eq!(possible_duplicate_submits(&world, &jobs[0]).await.as_deref(), Some("1"), "counted once");
}

#[tokio::test]
async fn anthropic_a_kill_9_inside_the_create_leaves_one_batch_the_next_process_waits_for_and_adopts() {
    anthropic_kill_9_inside_the_create(false).await;
}

#[tokio::test]
async fn anthropic_a_kill_9_inside_a_packs_create_leaves_one_batch_the_next_process_waits_for_and_adopts() {
    anthropic_kill_9_inside_the_create(true).await;
}

async fn anthropic_kill_9_inside_the_create(packed: bool) {
    // Batches keep processing until the test finishes their items.
    let anthropic = AnthropicConfig { processing_for: Duration::from_secs(3600), ..AnthropicConfig::default() };
    let world = World::with_emulator(EmulatorConfig { anthropic, ..EmulatorConfig::default() }).await;
    let control = world.emulator.anthropic();
    control.inject(AnthropicFault::hold().on(AnthropicCalls::Create));
    let mut first = Process::start(&world, "first", packed).await;
    let requests: Vec<Value> = (0..3).map(|i| message(&format!("question {i}"))).collect();
    let jobs = enqueue(&world, "killed-anthropic", "anthropic/claude-sonnet-4-5", requests, packed).await;
    assert!(control.wait_until_held(1, WAIT).await, "the create never reached the emulator");
    let creates = control.calls_of(AnthropicCallKind::Create);
    assert_eq!(creates.len(), 1, "{creates:?}");
    assert_eq!((creates[0].port, creates[0].status), (first.port, 200), "the first process's create was handled");
    let held_batch = creates[0].batch_id.clone().expect("the create made a batch");

    let killed_at_ms = first.kill_9();
    wait_until("the killed process's held create to end", WAIT, async || control.held_replies() == 0).await;
    let first_looked =
        control.calls().iter().any(|call| call.port == first.port && call.kind == AnthropicCallKind::List);
    assert!(
        !first_looked,
        "the first process looked its batch up before the kill: the kill did not land in the create"
    );

    // The second process looks, finds a candidate still running (its custom ids cannot be read yet), and waits:
    // it looks again, creates nothing, publishes nothing.
    let second = Process::start(&world, "second", packed).await;
    let lists_by_second = || {
        control
            .calls_of(AnthropicCallKind::List)
            .iter()
            .filter(|call| call.port == second.port && call.at_ms >= killed_at_ms)
            .count()
    };
    let n_creates = || control.calls_of(AnthropicCallKind::Create).len();
    wait_until("the second process to look twice (or to create)", WAIT, async || {
        lists_by_second() >= 2 || n_creates() > 1
    })
    .await;
    assert_eq!(n_creates(), 1, "it waits for the running batch, never creates: {:?}", control.calls());
    assert!(world.results().await.is_empty(), "nothing is published while the look waits");

    // The batch ends: the look reads its first result, finds the chunk's nonce, and adopts it.
    assert!(control.finish_items(&held_batch, 3), "the held batch was still running");
    for job in &jobs {
        assert_one_completed_result(&world, job).await;
    }
    assert_eq!(control.batch_count(), 1, "exactly one batch at the provider: {:?}", control.batch_ids());
    assert_eq!(control.calls_of(AnthropicCallKind::Create).len(), 1, "the second process did not create");
    let read = control.calls_of(AnthropicCallKind::Results).iter().any(|call| {
        call.port == second.port && call.batch_id.as_deref() == Some(held_batch.as_str()) && call.status == 200
    });
    assert!(read, "the second process read the held batch's results: {:?}", control.calls());
    assert_eq!(possible_duplicate_submits(&world, &jobs[0]).await.as_deref(), Some("1"), "counted once");
}

#[tokio::test]
async fn gemini_a_kill_9_inside_the_create_leaves_one_batch_the_next_process_finds_by_its_display_name() {
    gemini_kill_9_inside_the_create(false).await;
}

#[tokio::test]
async fn gemini_a_kill_9_inside_a_packs_create_leaves_one_batch_the_next_process_finds_by_its_display_name() {
    gemini_kill_9_inside_the_create(true).await;
}

async fn gemini_kill_9_inside_the_create(packed: bool) {
    let world = World::new().await;
    let control = world.emulator.gemini();
    control.inject(GeminiFault::hold().on(GeminiCalls::Create));
    let mut first = Process::start(&world, "first", packed).await;
    let requests: Vec<Value> = (0..3).map(|i| json!({"contents": [{"parts": [{"text": format!("q {i}")}]}]})).collect();
    let jobs = enqueue(&world, "killed-gemini", "gemini/gemini-2.5-flash", requests, packed).await;
    assert!(control.wait_until_held(1, WAIT).await, "the create never reached the emulator");
    let creates = control.calls_of(GeminiCallKind::Create);
    assert_eq!(creates.len(), 1, "{creates:?}");
    assert_eq!((creates[0].port, creates[0].status), (first.port, 200), "the first process's create was handled");
    let held_batch = creates[0].batch_name.clone().expect("the create made a batch");

    let killed_at_ms = first.kill_9();
    wait_until("the killed process's held create to end", WAIT, async || control.held_replies() == 0).await;
    let first_looked = control.calls().iter().any(|call| call.port == first.port && call.kind == GeminiCallKind::List);
    assert!(
        !first_looked,
        "the first process looked its batch up before the kill: the kill did not land in the create"
    );

    let second = Process::start(&world, "second", packed).await;
    for job in &jobs {
        assert_one_completed_result(&world, job).await;
    }
    assert_eq!(control.batch_count(), 1, "exactly one batch at the provider");
    assert_eq!(control.calls_of(GeminiCallKind::Create).len(), 1, "the second process did not create");
    let calls = control.calls();
    let looked = calls
        .iter()
        .any(|call| call.port == second.port && call.kind == GeminiCallKind::List && call.at_ms >= killed_at_ms);
    assert!(looked, "the second process listed batches to look for the chunk's: {calls:?}");
    let adopted = calls.iter().any(|call| {
        call.port == second.port && call.kind == GeminiCallKind::Get && call.batch_name.as_deref() == Some(&held_batch)
    });
    assert!(adopted, "the second process polled the held batch {held_batch}: {calls:?}");
    assert_eq!(possible_duplicate_submits(&world, &jobs[0]).await.as_deref(), Some("1"), "counted once");
}

fn chat(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}], "max_tokens": 5})
}

fn message(text: &str) -> Value {
    json!({"max_tokens": 32, "messages": [{"role": "user", "content": text}]})
}
