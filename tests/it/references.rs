//! An item's top-level `external_reference` at the providers that do not echo it (OpenAI, Anthropic): left out of
//! what the API is sent (checked in the emulators' uploaded files and call log), and echoed on the item's own
//! response in the result entry, byte for byte, whether the item succeeded, failed, was cancelled or never sent.
//! The daemon in-process, real Redis, the emulator over HTTP. The stripping itself is unit-tested in
//! `batchd_core::reference`.

use std::time::Duration;

use batchd_core::{ResultEntry, ResultStatus};
use batchd_emulator::{AnthropicCallKind, AnthropicFault, OpenAiCallKind, OpenAiFault};
use batchd_tests::{Daemon, World, wait_until, with_anthropic, with_openai};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// Each response's `external_reference` as the result entry carries it (its JSON text), in request order.
fn echoed(entry: &ResultEntry) -> Vec<Option<String>> {
    let output = entry.result.as_ref().expect("result");
    output.responses.iter().map(|response| response.external_reference.as_ref().map(|r| r.get().to_owned())).collect()
}

fn succeeded(entry: &ResultEntry) -> Vec<bool> {
    entry.result.as_ref().expect("result").responses.iter().map(|response| response.success).collect()
}

fn error_code(entry: &ResultEntry, index: usize) -> String {
    let response = &entry.result.as_ref().expect("result").responses[index];
    let error: Value = serde_json::from_str(response.error.as_ref().expect("error").get()).expect("json");
    error["code"].as_str().expect("code").to_owned()
}

/// The lines of every input file the OpenAI emulator accepted an upload of (read back through its Files API).
async fn uploaded_lines(world: &World) -> Vec<String> {
    let openai = world.emulator.openai();
    let mut lines = Vec::new();
    for call in openai.calls_of(OpenAiCallKind::Upload).iter().filter(|call| call.http_status == 200) {
        let id = call.file_id.as_deref().expect("an upload names its file");
        let text = reqwest::Client::new()
            .get(format!("{}/files/{id}/content", world.emulator.openai_base_url()))
            .bearer_auth(openai.api_key())
            .send()
            .await
            .expect("file content")
            .text()
            .await
            .expect("text");
        lines.extend(text.lines().map(str::to_owned));
    }
    lines
}

#[tokio::test]
async fn openai_echoes_each_items_reference_on_its_response_and_never_sends_it() {
    let mut world = World::new().await;
    with_openai(&mut world.settings, &world.emulator);
    // Two batches (3 + 2 items): each chunk keeps its items' references.
    world.settings.openai.max_requests = 3;
    // The input files stay at the emulator, so the test can read what the API was sent.
    world.settings.openai.delete_files = false;
    let daemon = world.daemon();
    // Written as text: a reference with its own spacing, an escaped key, a nested member that is not one.
    let job = r#"{"id":"xref-openai","model":"openai/gpt-4o-mini","requests":[
        {"external_reference":"r-zero","messages":[{"role":"user","content":"zero"}],"max_tokens":5},
        {"messages":[{"role":"user","content":"one"}], "external_reference" : {"k" : [1, 2]}, "max_tokens":5},
        {"messages":[],"max_tokens":5,"external_reference":"r-refused"},
        {"messages":[{"role":"user","content":"three"}],"max_tokens":5},
        {"messages":[{"role":"user","content":"four"}],"metadata":{"external_reference":"nested"},"external\u005freference":7}
    ]}"#;
    world.enqueue_raw(&[("job", job.to_owned())]).await;
    let entry = world.wait_for_result("xref-openai", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(entry.request_ids.len(), 2);
    assert_eq!(succeeded(&entry), [true, true, false, true, true]);
    let refused = entry.result.as_ref().expect("result").responses[2].error.as_ref().expect("error").get().to_owned();
    assert!(refused.contains(r#""http_status":400"#), "the API refused that item: {refused}");
    assert_eq!(
        echoed(&entry),
        [
            Some(r#""r-zero""#.to_owned()),
            Some(r#"{"k" : [1, 2]}"#.to_owned()),
            Some(r#""r-refused""#.to_owned()),
            None,
            Some("7".to_owned()),
        ],
        "each reference on its own response, byte for byte, the failed item's too"
    );
    // What the API was sent: every item, none with a top-level external_reference, the rest as it was.
    let lines = uploaded_lines(&world).await;
    assert_eq!(lines.len(), 5, "{lines:?}");
    for line in &lines {
        let parsed: Value = serde_json::from_str(line).expect("a JSON line");
        assert!(parsed["body"].get("external_reference").is_none(), "{line}");
        assert!(!line.contains("r-zero") && !line.contains("r-refused") && !line.contains("005f"), "{line}");
    }
    assert!(
        lines.iter().any(|line| line.contains(
            r#""body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"one"}], "max_tokens":5}}"#
        )),
        "the member and its comma left out, nothing else changed: {lines:?}"
    );
    assert!(
        lines.iter().any(|line| line.contains(r#""metadata":{"external_reference":"nested"}}"#)),
        "a nested member is the item's own: {lines:?}"
    );
    // Recorded with the job, read when its result was assembled, dropped once published.
    let ledger = world.ledger("xref-openai").await;
    assert_eq!(ledger.get("n_references").map(String::as_str), Some("4"));
    assert!(!ledger.keys().any(|name| name.ends_with(":references")), "{ledger:?}");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn openai_echoes_the_references_of_cancelled_and_never_sent_items() {
    // Chunks of 3 requests; one create per hour, so the second chunk waits to be sent when the cancel comes.
    let mut world = World::new().await;
    with_openai(&mut world.settings, &world.emulator);
    world.settings.openai.max_requests = 3;
    world.settings.openai.batches_per_hour = 1;
    world.settings.openai.burst = 1;
    let openai = world.emulator.openai();
    openai.inject(OpenAiFault::stall(1));
    let daemon = world.daemon();
    let requests: Vec<Value> = (0..5)
        .map(|i| json!({"messages": [{"role": "user", "content": format!("item-{i}")}], "max_tokens": 5, "external_reference": format!("ref-{i}")}))
        .collect();
    world.enqueue(&json!({"id": "xref-cancel", "model": "openai/gpt-4o-mini", "requests": requests})).await;
    // Whichever chunk took the hour's one create runs (one request finishes, then it stalls); the other waits.
    let batch = async || {
        let ledger = world.ledger("xref-cancel").await;
        (0..2u32).find(|chunk| ledger.contains_key(&format!("c{chunk}:request_id")))
    };
    wait_until("a batch is created", WAIT, async || batch().await.is_some()).await;
    let sent = batch().await.expect("a sent chunk");
    wait_until("one request of it ran", WAIT, async || {
        openai.batches().iter().any(|batch| batch["request_counts"]["completed"] == 1)
    })
    .await;
    world.cancel("xref-cancel", "not needed").await;
    let entry = world.wait_for_result("xref-cancel", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Cancelled);
    let (ran, unsent) = if sent == 0 { (0..3, 3..5) } else { (3..5, 0..3) };
    let ok = succeeded(&entry);
    assert_eq!(ok.iter().filter(|ok| **ok).count(), 1, "{ok:?}");
    for index in ran.filter(|index| !ok[*index]) {
        assert_eq!(error_code(&entry, index), "batch_cancelled", "item {index}");
    }
    for index in unsent {
        assert_eq!(error_code(&entry, index), "not_run", "item {index} was never sent");
    }
    let expected: Vec<Option<String>> = (0..5).map(|i| Some(format!("\"ref-{i}\""))).collect();
    assert_eq!(echoed(&entry), expected, "every item's reference, however it ended");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_chunk_split_after_a_size_refusal_keeps_each_items_reference_with_its_item() {
    let mut world = World::new().await;
    with_openai(&mut world.settings, &world.emulator);
    let openai = world.emulator.openai();
    // The API's upload limit is lower than batchd's: the first uploads are refused with `file_too_large`.
    let mut limits = openai.limits();
    limits.max_file_bytes = 1500;
    openai.set_limits(limits);
    let daemon = world.daemon();
    let padding = "x".repeat(200);
    let requests: Vec<Value> = (0..8)
        .map(|i| {
            let mut item =
                json!({"messages": [{"role": "user", "content": format!("item-{i} {padding}")}], "max_tokens": 5});
            if i % 3 != 1 {
                item["external_reference"] = json!({"n": i});
            }
            item
        })
        .collect();
    world.enqueue(&json!({"id": "xref-split", "model": "openai/gpt-4o-mini", "requests": requests})).await;
    let entry = world.wait_for_result("xref-split", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert!(entry.request_ids.len() > 1, "split into {} batches", entry.request_ids.len());
    let uploads = openai.calls_of(OpenAiCallKind::Upload);
    assert!(uploads.iter().any(|call| call.error_code.as_deref() == Some("file_too_large")), "a refusal");
    let expected: Vec<Option<String>> = (0..8).map(|i| (i % 3 != 1).then(|| format!(r#"{{"n":{i}}}"#))).collect();
    assert_eq!(echoed(&entry), expected);
    for (index, response) in entry.result.as_ref().expect("result").responses.iter().enumerate() {
        let body: Value = serde_json::from_str(response.result.as_ref().expect("result").get()).expect("json");
        let content = body["choices"][0]["message"]["content"].as_str().expect("content");
        assert!(content.contains(&format!("item-{index} ")), "item {index}: {content}");
    }
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn anthropic_echoes_each_items_reference_on_its_response_and_never_sends_it() {
    let world = World::new().await;
    let mut settings = world.settings.clone();
    with_anthropic(&mut settings, &world.emulator);
    let anthropic = world.emulator.anthropic();
    // The create's second request comes back errored (a failure on the API's side).
    anthropic.inject(AnthropicFault::error_items([1], 500));
    let daemon = Daemon::start(settings, &world.emulator);
    let job = r#"{"id":"xref-claude","model":"anthropic/claude-sonnet-4-5","requests":[
        {"max_tokens":32,"messages":[{"role":"user","content":"zero"}],"external_reference":"c-zero"},
        {"external_reference" : {"k" : [1, 2]} ,"max_tokens":32,"messages":[{"role":"user","content":"one"}]},
        {"max_tokens":32,"messages":[{"role":"user","content":"two"}]},
        {"max_tokens":32,"external\u005freference":[3],"messages":[{"role":"user","content":"three"}],"metadata":{"external_reference":"nested"}}
    ]}"#;
    world.enqueue_raw(&[("job", job.to_owned())]).await;
    let entry = world.wait_for_result("xref-claude", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(succeeded(&entry), [true, false, true, true]);
    assert_eq!(error_code(&entry, 1), "api_error");
    assert_eq!(
        echoed(&entry),
        [Some(r#""c-zero""#.to_owned()), Some(r#"{"k" : [1, 2]}"#.to_owned()), None, Some("[3]".to_owned())]
    );

    // A one-batch job whose items all succeed is published straight from its poll: its references too.
    let job = json!({"id": "xref-claude-2", "model": "anthropic/claude-sonnet-4-5", "requests": [
        {"max_tokens": 32, "messages": [{"role": "user", "content": "a"}]},
        {"max_tokens": 32, "messages": [{"role": "user", "content": "b"}], "external_reference": "only-b"},
    ]});
    world.enqueue(&job).await;
    let entry = world.wait_for_result("xref-claude-2", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(succeeded(&entry), [true, true]);
    assert_eq!(echoed(&entry), [None, Some(r#""only-b""#.to_owned())]);

    // What the API was sent: params without a top-level external_reference (the nested one is the item's).
    let creates = anthropic.calls_of(AnthropicCallKind::Create);
    assert_eq!(creates.len(), 2);
    for create in &creates {
        assert!(create.param_names.iter().any(|name| name == "messages"), "{create:?}");
        assert!(!create.param_names.iter().any(|name| name == "external_reference"), "{create:?}");
    }
    assert!(creates[0].param_names.iter().any(|name| name == "metadata"), "{:?}", creates[0]);
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_job_whose_references_for_one_batch_exceed_the_cap_is_refused_before_anything_is_sent() {
    let mut world = World::new().await;
    with_openai(&mut world.settings, &world.emulator);
    let daemon = world.daemon();
    let long = "r".repeat(batchd_core::reference::MAX_CHUNK_BYTES);
    let job = json!({"id": "xref-too-many", "model": "openai/gpt-4o-mini", "requests": [
        {"messages": [{"role": "user", "content": "a"}], "external_reference": long},
    ]});
    world.enqueue(&job).await;
    let entry = world.wait_for_result("xref-too-many", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Failed);
    let error = entry.error.expect("error");
    assert_eq!(error.code, "invalid_job");
    assert!(error.message.contains("external_reference") && error.message.contains("batch 0"), "{}", error.message);
    assert!(world.emulator.openai().calls_of(OpenAiCallKind::Upload).is_empty(), "nothing was sent");
    daemon.stop().await.expect("stop");
}

/// What `n` one-item OpenAI jobs cost in Redis: commands per job, and the calls of each command the jobs sent.
async fn openai_cost(
    world: &World,
    prefix: &str,
    n: usize,
    with_reference: bool,
) -> (f64, std::collections::BTreeMap<String, u64>) {
    let before = crate::cost::commandstats(world).await;
    let mut pipe = redis::pipe();
    for i in 0..n {
        let mut item = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
        if with_reference {
            item["external_reference"] = json!(format!("ref-{i}"));
        }
        let job = json!({"id": format!("{prefix}-{i}"), "model": "openai/gpt-4o-mini", "requests": [item]});
        pipe.xadd(world.keys.submit(), "*", &[("job", job.to_string())]);
    }
    let _: Vec<String> = pipe.query_async(&mut world.conn.clone()).await.expect("enqueue");
    for i in 0..n {
        world.wait_for_result(&format!("{prefix}-{i}"), WAIT).await;
    }
    let after = crate::cost::commandstats(world).await;
    let delta = |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    // The test's own commands: its enqueue (XADD) and waits (XLEN, XRANGE of the results, INFO).
    let own = ["xadd", "xlen", "xrange", "info"];
    let calls: std::collections::BTreeMap<String, u64> = after
        .keys()
        .filter(|name| !own.contains(&name.as_str()) && delta(name) > 0)
        .map(|name| (name.clone(), delta(name)))
        .collect();
    (calls.values().sum::<u64>() as f64 / n as f64, calls)
}

/// A job without references costs what it did; one with references one `HGET` more when it is published straight
/// from its poll (a one-batch job with every item answered), and nothing more otherwise.
#[tokio::test]
async fn references_cost_nothing_without_them_and_one_read_with_them() {
    let mut world = World::new().await;
    with_openai(&mut world.settings, &world.emulator);
    world.settings.poll.initial_interval_ms = 1;
    world.settings.poll.max_interval_ms = 1;
    world.settings.poll.jitter = 0.0;
    let openai = world.emulator.openai();
    let mut timing = openai.timing();
    timing.validating_for = Duration::ZERO;
    timing.in_progress_for = Duration::ZERO;
    timing.finalizing_for = Duration::ZERO;
    openai.set_timing(timing);
    let daemon = world.daemon();
    openai_cost(&world, "warm", 1, true).await;
    let (plain, plain_calls) = openai_cost(&world, "plain", 100, false).await;
    let (referenced, referenced_calls) = openai_cost(&world, "referenced", 100, true).await;
    let hget = |calls: &std::collections::BTreeMap<String, u64>| calls.get("hget").copied().unwrap_or(0);
    eprintln!(
        "Redis commands per OpenAI job: {plain:.2} without references, {referenced:.2} with (HGET {} / {} in 100 jobs)",
        hget(&plain_calls),
        hget(&referenced_calls)
    );
    // The totals move with the daemon's idle reads and a batch not done at its first poll on a loaded machine; the
    // HGETs and the kinds of command sent per job do not. The daemon's background work (the sampler, the ingress's
    // reclaim, idle reads) falls into one window or the other a few times, so a kind counts as per job from one
    // call per ten jobs.
    assert_eq!(hget(&referenced_calls), hget(&plain_calls) + 100, "one HGET more per job");
    let per_job =
        |calls: &std::collections::BTreeMap<String, u64>, name: &str| calls.get(name).is_some_and(|n| *n >= 10);
    let new: Vec<&String> = referenced_calls
        .keys()
        .filter(|name| *name != "hget" && per_job(&referenced_calls, name) && !per_job(&plain_calls, name))
        .collect();
    assert!(
        new.is_empty(),
        "no other command comes with references: {new:?} ({referenced_calls:?} against {plain_calls:?})"
    );
    daemon.stop().await.expect("stop");
}
