//! The first mistakes a new user makes, as the CLI reports them (issue 39): a job refused at take-in ends
//! `submit --wait` with its reason and exit code 3, and a file whose id already has a job is not enqueued again but
//! named a duplicate, with what to do instead; a completed job whose every item failed ends it with exit code 6.

use batchd_emulator::Fault;
use batchd_tests::{World, bge_m3_job};
use serde_json::{Value, json};

use crate::cli_ops::{batchd, run, text};

/// `batchd <args>`: (exit code, stdout, stderr).
async fn cli(world: &World, args: &[&str]) -> (i32, String, String) {
    let mut command = batchd(world);
    command.args(args);
    let output = run(command).await;
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

/// The last line of stderr: the CLI's error line (progress lines come before it).
fn last_line(stderr: &str) -> &str {
    stderr.lines().last().unwrap_or_default()
}

#[tokio::test]
async fn a_job_refused_at_take_in_ends_submit_wait_with_its_reason_and_exit_3() {
    let world = World::new().await;
    // The world's daemon runs Workers AI only: an OpenAI job is refused when it is taken in.
    let daemon = world.daemon();
    let file = world.redis.dir.join("openai.json");
    let job = json!({"id": "oa-1", "model": "openai/gpt-4o-mini", "requests": [{"messages": [{"role": "user", "content": "hi"}]}]});
    std::fs::write(&file, job.to_string()).unwrap();
    let path = file.display().to_string();

    let (code, stdout, stderr) = cli(&world, &["submit", "--wait", "--timeout", "60", &path]).await;
    assert_eq!(code, 3, "a refused job is a failed job (docs/cli.md): {stderr}");
    let (id_line, rest) = stdout.split_once('\n').expect("the id, then what the ledger says");
    assert_eq!(id_line, "oa-1");
    let shown: Value = serde_json::from_str(rest).expect("JSON on stdout");
    assert_eq!(shown["status"], "failed", "{shown}");
    assert_eq!(shown["error"]["code"], "invalid_job", "{shown}");
    let reason = shown["error"]["message"].as_str().expect("a reason");
    assert!(reason.contains("openai"), "the reason names the provider: {reason}");
    assert_eq!(last_line(&stderr), format!("batchd: job oa-1 was refused by the daemon before it ran: {reason}"));
    assert!(!stderr.contains("does not say where its result entry is"), "{stderr}");

    // The same file again: a duplicate id is said so, not enqueued (the daemon would run nothing).
    let submit_stream = world.settings.keys().submit();
    let before = world.stream(&submit_stream).await.len();
    let (code, stdout, stderr) = cli(&world, &["submit", "--wait", "--timeout", "60", &path]).await;
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stdout, "", "no id is printed for a job not enqueued");
    assert_eq!(
        last_line(&stderr),
        "batchd: job oa-1 already exists (failed); a job id runs once, so it was not enqueued again: it was refused \
         before it ran (`batchd status oa-1` says why); after the fix, give it a new id (--id) to run it"
    );
    assert_eq!(world.stream(&submit_stream).await.len(), before, "nothing was XADDed");

    // `batchd failed` lists it, as one `batchd retry` cannot run, and `batchd retry` agrees.
    let (code, stdout, stderr) = cli(&world, &["failed"]).await;
    assert_eq!(code, 0, "{stderr}");
    let example = stdout.lines().find(|line| line.trim_start().starts_with("oa-1  failed  ")).expect("listed");
    assert!(
        example.ends_with("(refused before it ran: not retryable; after the fix, enqueue it again under a new id)"),
        "{stdout}"
    );
    let (code, stdout, _) = cli(&world, &["retry", "oa-1"]).await;
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("it was refused before it ran"), "{stdout}");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_duplicate_of_a_finished_job_is_named_with_what_to_do() {
    let world = World::new().await;
    let daemon = world.daemon();
    let file = world.redis.dir.join("job.json");
    std::fs::write(&file, bge_m3_job("dup-1", 2).to_string()).unwrap();
    let path = file.display().to_string();
    let (code, _, stderr) = cli(&world, &["submit", "--wait", "--timeout", "60", &path]).await;
    assert_eq!(code, 0, "{stderr}");

    let (code, _, stderr) = cli(&world, &["submit", &path]).await;
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        last_line(&stderr),
        "batchd: job dup-1 already exists (completed); a job id runs once, so it was not enqueued again: give the \
         file a new id (--id) to run it again"
    );
    // `--id` gives the same items a new identity, and they run.
    let (code, stdout, stderr) = cli(&world, &["submit", "--wait", "--timeout", "60", "--id", "dup-2", &path]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("dup-2\n"), "{stdout}");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_completed_job_whose_every_item_failed_ends_submit_wait_with_exit_6() {
    let world = World::new().await;
    world.emulator.inject(Fault::fail_items([0, 1]));
    let daemon = world.daemon();
    let mut job = bge_m3_job("allbad-1", 2);
    job["retry_failed_items"] = json!(false);
    let file = world.redis.dir.join("job.json");
    std::fs::write(&file, job.to_string()).unwrap();
    let path = file.display().to_string();

    let (code, stdout, stderr) = cli(&world, &["submit", "--wait", "--timeout", "60", &path]).await;
    assert_eq!(code, 6, "every item failed: a distinct exit code (docs/cli.md): {stderr} {stdout}");
    let (_, rest) = stdout.split_once('\n').expect("the id, then the result");
    let result: Value = serde_json::from_str(rest).expect("result JSON");
    assert_eq!(result["status"], "completed", "wire format v1 keeps the status: {result}");
    assert_eq!((result["items_total"].as_u64(), result["items_failed"].as_u64()), (Some(2), Some(2)));
    assert_eq!(
        last_line(&stderr),
        "batchd: job allbad-1 completed, but all 2 of its request items failed (each response's `error` says why)"
    );
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn an_openai_endpoint_is_checked_inferred_or_demanded_before_anything_is_enqueued() {
    let world = World::new().await;
    let submit_stream = world.settings.keys().submit();
    let items = world.redis.dir.join("inputs.jsonl");
    std::fs::write(&items, "{\"input\":\"a\"}\n{\"input\":\"b\"}\n").unwrap();
    let items = items.display().to_string();
    let model = "openai/text-embedding-3-small";

    // A typo in --endpoint: a usage error naming the list and the near one.
    let (code, _, stderr) = cli(&world, &["submit", &items, "--model", model, "--endpoint", "/v1/embedding"]).await;
    assert_eq!(code, 2, "{stderr}");
    let line = last_line(&stderr);
    assert!(
        line.starts_with(
            "batchd: --endpoint: endpoint \"/v1/embedding\" is not one OpenAI batches accept (openai.endpoints: "
        ),
        "{line}"
    );
    assert!(line.ends_with("; did you mean /v1/embeddings?"), "{line}");
    // An embeddings model sent to chat: refused.
    let (code, _, stderr) =
        cli(&world, &["submit", &items, "--model", model, "--endpoint", "/v1/chat/completions"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(
        last_line(&stderr),
        "batchd: --endpoint: model openai/text-embedding-3-small serves /v1/embeddings only, not /v1/chat/completions"
    );
    assert!(world.stream(&submit_stream).await.is_empty(), "nothing was enqueued");

    // No endpoint with --model: the one the model serves, said on stderr.
    let (code, stdout, stderr) = cli(&world, &["submit", &items, "--model", model, "--id", "emb-1"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, "emb-1\n");
    assert!(
        stderr.contains("batchd: note: model openai/text-embedding-3-small serves /v1/embeddings only; the job names it as its endpoint"),
        "{stderr}"
    );
    let entries = world.stream(&submit_stream).await;
    let job: Value = serde_json::from_str(&entries[0]["job"]).expect("the job");
    assert_eq!(job["endpoint"], "/v1/embeddings", "{job}");

    // A job file without one: demanded, not guessed (the file is the producer's contract).
    let file = world.redis.dir.join("emb.json");
    std::fs::write(&file, json!({"id": "emb-2", "model": model, "requests": [{"input": "a"}]}).to_string()).unwrap();
    let (code, _, stderr) = cli(&world, &["submit", &file.display().to_string()]).await;
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        last_line(&stderr),
        format!(
            "batchd: {}: model openai/text-embedding-3-small serves /v1/embeddings only: give the job \"endpoint\": \
             \"/v1/embeddings\" (without it the job goes to /v1/chat/completions and every item fails)",
            file.display()
        )
    );
    assert_eq!(world.stream(&submit_stream).await.len(), 1, "only emb-1 was enqueued");
}
