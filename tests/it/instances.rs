//! Named provider instances (`[providers.<name>]`) through the whole daemon: a Groq-like instance (the emulator's
//! OpenAI module mounted again under `/groq/openai/v1`, its own key, a 48 h window) and an Azure-like one (`api-key`
//! header, the model a deployment's name) beside Gemini and the built-in instances, each running a job to completion
//! with its answers in order; a daemon with only a named instance; packing per instance; and the other providers'
//! promises at an instance's own API (deadline, cancel, one batch after a crash inside a create). `batchd config check`
//! refusing a wrong instance setting is in `config_check.rs`.

use std::time::Duration;

use batchd::settings::{InstanceSection, Secret, Settings};
use batchd_core::{ResultEntry, ResultStatus};
use batchd_emulator::{EmulatorConfig, EmulatorHandle, OpenAiCallKind, OpenAiFault, OpenAiHandle, OpenAiMount};
use batchd_tests::{Daemon, World, http_get, wait_until, with_admin, with_anthropic, with_gemini, with_openai};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// Where the Groq-like mount is served.
const GROQ: &str = "/groq/openai/v1";

/// Where the Azure-like mount is served.
const AZURE: &str = "/azure/openai/v1";

/// Where the Novita-like mount (upper-case statuses) is served.
const NOVITA: &str = "/novita/openai/v1";

/// A world whose emulator serves the Groq-like, Azure-like and Novita-like mounts beside its own APIs.
async fn world() -> World {
    let config = EmulatorConfig {
        openai_mounts: vec![OpenAiMount::groq(), OpenAiMount::azure(), OpenAiMount::novita()],
        ..EmulatorConfig::default()
    };
    World::with_emulator(config).await
}

/// The world's settings without Workers AI, so an instance's jobs are the only ones the daemon can run.
fn without_workers_ai(world: &World) -> Settings {
    let mut settings = world.settings.clone();
    settings.cloudflare.account_id = String::new();
    settings
}

/// The mount at `prefix`.
fn mount(emulator: &EmulatorHandle, prefix: &str) -> OpenAiHandle {
    emulator.openai_mount(prefix).expect("mounted")
}

/// A named OpenAI-kind instance `name` against the emulator's mount at `prefix`, with the keys of `extra` too.
fn instance(settings: &mut Settings, emulator: &EmulatorHandle, name: &str, prefix: &str, extra: Value) {
    let mut keys = json!({
        "kind": "openai",
        "base_url": emulator.openai_mount_base_url(prefix),
        "batches_per_hour": 0,
        "request_timeout_secs": 5,
    });
    for (key, value) in extra.as_object().expect("keys") {
        keys[key] = value.clone();
    }
    let mut section: InstanceSection = serde_json::from_value(keys).expect("section");
    section.api_key = Some(Secret::new(mount(emulator, prefix).api_key()));
    settings.providers.insert(name.to_owned(), section);
}

/// The Groq-like instance `groq`: a 48 h window, which OpenAI's own API would refuse.
fn with_groq(settings: &mut Settings, emulator: &EmulatorHandle) {
    let extra = json!({"completion_window": "48h", "endpoints": ["/v1/chat/completions"]});
    instance(settings, emulator, "groq", GROQ, extra);
}

/// The Azure-like instance `azure`: the key in `api-key`.
fn with_azure(settings: &mut Settings, emulator: &EmulatorHandle) {
    instance(settings, emulator, "azure", AZURE, json!({"key_header": "api-key"}));
}

fn chat(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}], "max_tokens": 5})
}

fn chat_job(id: &str, model: &str, n: usize) -> Value {
    json!({"id": id, "model": model, "pack": false,
           "requests": (0..n).map(|i| chat(&format!("question {i}"))).collect::<Vec<_>>()})
}

/// Asserts an OpenAI-shaped job completed with each answer quoting its own question, in request order.
fn assert_chat_in_order(entry: &ResultEntry, model: &str, n: usize) {
    assert_eq!(entry.status, ResultStatus::Completed, "{model}: {:?}", entry.error);
    assert_eq!(entry.model, model);
    let responses = &entry.result.as_ref().expect("result").responses;
    assert_eq!(responses.len(), n, "{model}");
    for (index, response) in responses.iter().enumerate() {
        assert!(response.success, "{model} item {index}: {:?}", response.error);
        let body: Value = serde_json::from_str(response.result.as_ref().expect("result").get()).expect("json");
        let content = body["choices"][0]["message"]["content"].as_str().expect("content");
        assert!(content.contains(&format!("question {index}")), "{model} item {index}: {content}");
    }
}

/// Asserts an echoing API's job (Anthropic's, Gemini's) completed with `echo: question <i>` in request order.
fn assert_echoed_in_order(entry: &ResultEntry, model: &str, n: usize, text_of: fn(&Value) -> &Value) {
    assert_eq!(entry.status, ResultStatus::Completed, "{model}: {:?}", entry.error);
    let responses = &entry.result.as_ref().expect("result").responses;
    assert_eq!(responses.len(), n, "{model}");
    for (index, response) in responses.iter().enumerate() {
        let body: Value = serde_json::from_str(response.result.as_ref().expect("result").get()).expect("json");
        assert_eq!(text_of(&body).as_str(), Some(format!("echo: question {index}").as_str()), "{model} item {index}");
    }
}

/// The batches a mount (or the OpenAI module itself) holds now, as its API shows them.
fn batches(handle: &OpenAiHandle) -> Vec<Value> {
    handle.batches()
}

#[tokio::test]
async fn one_daemon_runs_jobs_on_named_instances_beside_gemini_and_the_built_in_ones() {
    let world = world().await;
    let mut settings = world.settings.clone();
    with_openai(&mut settings, &world.emulator);
    with_anthropic(&mut settings, &world.emulator);
    with_gemini(&mut settings, &world.emulator);
    with_groq(&mut settings, &world.emulator);
    with_azure(&mut settings, &world.emulator);
    let admin = with_admin(&mut settings);
    let daemon = Daemon::start(settings, &world.emulator);

    world.enqueue(&chat_job("on-groq", "groq/llama-3.1-8b-instant", 4)).await;
    world.enqueue(&chat_job("on-azure", "azure/gpt-4o-mini-batch", 3)).await;
    world.enqueue(&chat_job("on-azure-unknown", "azure/gpt-4o-mini", 1)).await;
    world.enqueue(&chat_job("on-openai", "openai/gpt-4o-mini", 2)).await;
    let echo = |id: &str, model: &str, item: fn(&str) -> Value| {
        json!({"id": id, "model": model, "pack": false,
               "requests": (0..3).map(|i| item(&format!("question {i}"))).collect::<Vec<_>>()})
    };
    let claude = |text: &str| json!({"max_tokens": 32, "messages": [{"role": "user", "content": text}]});
    let gemini = |text: &str| json!({"contents": [{"role": "user", "parts": [{"text": text}]}]});
    world.enqueue(&echo("on-anthropic", "anthropic/claude-sonnet-4-5", claude)).await;
    world.enqueue(&echo("on-gemini", "gemini/gemini-2.5-flash", gemini)).await;
    world
        .enqueue(&json!({"id": "on-workers-ai", "model": "@cf/meta/llama-3.3-70b-instruct-fp8-fast", "pack": false,
                         "requests": [{"prompt": "zero"}, {"prompt": "one"}]}))
        .await;

    assert_chat_in_order(&world.wait_for_result("on-groq", WAIT).await, "groq/llama-3.1-8b-instant", 4);
    assert_chat_in_order(&world.wait_for_result("on-azure", WAIT).await, "azure/gpt-4o-mini-batch", 3);
    assert_chat_in_order(&world.wait_for_result("on-openai", WAIT).await, "openai/gpt-4o-mini", 2);
    let claude_text: fn(&Value) -> &Value = |body| &body["content"][0]["text"];
    let gemini_text: fn(&Value) -> &Value = |body| &body["candidates"][0]["content"]["parts"][0]["text"];
    assert_echoed_in_order(&world.wait_for_result("on-anthropic", WAIT).await, "anthropic", 3, claude_text);
    assert_echoed_in_order(&world.wait_for_result("on-gemini", WAIT).await, "gemini", 3, gemini_text);
    let workers_ai = world.wait_for_result("on-workers-ai", WAIT).await;
    assert_eq!(workers_ai.status, ResultStatus::Completed, "{:?}", workers_ai.error);
    assert_eq!((workers_ai.items_total, workers_ai.items_failed), (2, 0));

    // Azure: a model that is no deployment's name fails the batch there (the model went out as the deployment).
    let unknown = world.wait_for_result("on-azure-unknown", WAIT).await;
    assert_ne!(unknown.status, ResultStatus::Completed, "{unknown:?}");
    assert!(format!("{:?}", unknown.error).contains("model_not_found"), "{:?}", unknown.error);

    // Each instance's batches went to its own API, created as its settings say.
    let groq = batches(&mount(&world.emulator, GROQ));
    assert_eq!(groq.len(), 1, "{groq:?}");
    assert_eq!(groq[0]["completion_window"], "48h", "Groq's window, which OpenAI's API refuses");
    assert_eq!(groq[0]["model"], "llama-3.1-8b-instant", "the instance's prefix is not part of the model");
    let azure = batches(&mount(&world.emulator, AZURE));
    assert_eq!(azure.len(), 2, "{azure:?}");
    // In either order: the job's batch ran its deployment; the other's failed validation.
    assert!(
        azure.iter().any(|batch| batch["model"] == "gpt-4o-mini-batch" && batch["status"] == "completed"),
        "{azure:?}"
    );
    assert!(azure.iter().any(|batch| batch["status"] == "failed"), "{azure:?}");
    let openai = batches(&world.emulator.openai());
    assert_eq!(openai.len(), 1, "the built-in instance's batch alone: {openai:?}");
    let azure_calls = mount(&world.emulator, AZURE).calls();
    assert!(
        azure_calls.iter().all(|call| call.http_status != 401),
        "every Azure call carried api-key: {azure_calls:?}"
    );
    assert!(
        mount(&world.emulator, GROQ).calls_of(OpenAiCallKind::CreateBatch).iter().all(|call| call.http_status == 200),
        "Groq took every create"
    );

    // The provider label of the metrics is the instance's name.
    let (status, metrics) = http_get(admin, "/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    for name in ["groq", "azure", "openai", "anthropic", "gemini", "cloudflare"] {
        assert!(metrics.contains(&format!("provider=\"{name}\"")), "{name} missing from the metrics");
    }
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_daemon_with_only_a_named_openai_kind_instance_starts_and_runs() {
    let world = world().await;
    let mut settings = without_workers_ai(&world);
    with_groq(&mut settings, &world.emulator);
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&chat_job("groq-alone", "groq/llama-3.1-8b-instant", 3)).await;
    assert_chat_in_order(&world.wait_for_result("groq-alone", WAIT).await, "groq/llama-3.1-8b-instant", 3);
    // No other provider is there: a job for one is refused, naming what to configure.
    world.enqueue(&chat_job("not-here", "openai/gpt-4o-mini", 1)).await;
    let refused = world.wait_for_result("not-here", WAIT).await;
    assert_eq!(refused.status, ResultStatus::Failed);
    assert!(format!("{:?}", refused.error).contains("OPENAI_API_KEY"), "{:?}", refused.error);
    assert!(world.emulator.openai().batches().is_empty(), "nothing went to OpenAI");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn small_jobs_are_packed_per_instance() {
    let world = world().await;
    let mut settings = world.settings.clone();
    settings.packing.enabled = true;
    // One pack per instance: each is sent two seconds after its first job, whenever the others arrive.
    (settings.packing.window_ms, settings.packing.pause_ms) = (2000, 2000);
    with_openai(&mut settings, &world.emulator);
    with_groq(&mut settings, &world.emulator);
    let daemon = Daemon::start(settings, &world.emulator);
    // The same remote model on two instances: a pack key holds the instance's name, so each gets its own pack.
    let one =
        |id: String, model: &str| json!({"id": id, "model": model, "requests": [chat(&format!("question {id}"))]});
    for index in 0..3 {
        world.enqueue(&one(format!("g{index}"), "groq/gpt-4o-mini")).await;
        world.enqueue(&one(format!("o{index}"), "openai/gpt-4o-mini")).await;
    }
    for id in ["g0", "g1", "g2", "o0", "o1", "o2"] {
        let entry = world.wait_for_result(id, WAIT).await;
        assert_eq!(entry.status, ResultStatus::Completed, "{id}: {:?}", entry.error);
        let body: Value = serde_json::from_str(
            entry.result.as_ref().expect("result").responses[0].result.as_ref().expect("ok").get(),
        )
        .expect("json");
        let content = body["choices"][0]["message"]["content"].as_str().expect("content");
        assert!(content.contains(&format!("question {id}")), "{id} got another job's answer: {content}");
    }
    let lines = |handle: &OpenAiHandle| -> Vec<u64> {
        batches(handle).iter().map(|batch| batch["request_counts"]["total"].as_u64().unwrap_or_default()).collect()
    };
    wait_until("each instance's three jobs shared its own one batch", WAIT, async || {
        lines(&mount(&world.emulator, GROQ)).iter().sum::<u64>() == 3
            && lines(&world.emulator.openai()).iter().sum::<u64>() == 3
    })
    .await;
    let (groq, openai) = (lines(&mount(&world.emulator, GROQ)), lines(&world.emulator.openai()));
    assert_eq!((groq, openai), (vec![3], vec![3]), "one batch of three at each instance's API");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn an_instance_keeps_the_deadline_and_cancel_promises_at_its_own_api() {
    let world = world().await;
    let mut settings = world.settings.clone();
    with_openai(&mut settings, &world.emulator);
    with_groq(&mut settings, &world.emulator);
    with_azure(&mut settings, &world.emulator);
    let (groq, azure) = (mount(&world.emulator, GROQ), mount(&world.emulator, AZURE));
    for handle in [&groq, &azure] {
        let mut timing = handle.timing();
        timing.in_progress_for = Duration::from_secs(600);
        timing.cancelling_for = Duration::from_millis(300);
        handle.set_timing(timing);
    }
    let daemon = Daemon::start(settings, &world.emulator);
    let mut late = chat_job("groq-late", "groq/llama-3.1-8b-instant", 2);
    late["deadline_secs"] = json!(2);
    world.enqueue(&late).await;
    world.enqueue(&chat_job("azure-cancelled", "azure/gpt-4o-mini-batch", 2)).await;
    wait_until("the Azure batch runs", WAIT, async || {
        batches(&azure).iter().any(|batch| batch["status"] == "in_progress")
    })
    .await;
    world.cancel("azure-cancelled", "not needed").await;

    let expired = world.wait_for_result("groq-late", WAIT).await;
    assert_eq!(expired.status, ResultStatus::Expired, "{:?}", expired.error);
    let cancelled = world.wait_for_result("azure-cancelled", WAIT).await;
    assert_eq!(cancelled.status, ResultStatus::Cancelled, "{:?}", cancelled.error);
    // Each batch was cancelled at its own instance's API, and both ended there; OpenAI's was never asked.
    for (name, handle) in [("groq", &groq), ("azure", &azure)] {
        wait_until(&format!("the {name} batch is cancelled and its files deleted"), WAIT, async || {
            handle.batch_statuses().iter().all(|(_, status)| *status == "cancelled") && handle.file_ids().is_empty()
        })
        .await;
        assert_eq!(handle.calls_of(OpenAiCallKind::CancelBatch).len(), 1, "{name}");
    }
    assert!(world.emulator.openai().calls().is_empty(), "nothing went to OpenAI");
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_crash_inside_an_instances_create_leaves_one_batch_the_next_daemon_adopts() {
    let world = world().await;
    let mut settings = world.settings.clone();
    with_groq(&mut settings, &world.emulator);
    let groq = mount(&world.emulator, GROQ);
    // The create makes its batch at Groq, and its reply is held: the daemon never hears of it.
    groq.inject(OpenAiFault::hold().on(OpenAiCallKind::CreateBatch).after_handling());
    let first = Daemon::start(settings.clone(), &world.emulator);
    world.enqueue(&chat_job("groq-crash", "groq/llama-3.1-8b-instant", 2)).await;
    assert!(groq.wait_until_held(1, WAIT).await, "the create never reached the Groq mount");
    first.crash().await;
    groq.release_held();
    let second = Daemon::start(settings, &world.emulator);
    assert_chat_in_order(&world.wait_for_result("groq-crash", WAIT).await, "groq/llama-3.1-8b-instant", 2);
    assert_eq!(groq.batch_count(), 1, "one batch at Groq: {:?}", groq.batch_statuses());
    assert_eq!(groq.calls_of(OpenAiCallKind::CreateBatch).len(), 1, "the second daemon looked it up, not created");
    assert!(!groq.calls_of(OpenAiCallKind::ListBatches).is_empty(), "it listed Groq's batches to find it");
    assert!(world.emulator.openai().calls().is_empty(), "nothing went to OpenAI");
    second.stop().await.expect("stop");
}

#[tokio::test]
async fn named_anthropic_and_gemini_instances_run_jobs_under_their_own_names() {
    let world = world().await;
    let mut settings = without_workers_ai(&world);
    let (anthropic, gemini) = (world.emulator.anthropic(), world.emulator.gemini());
    for (name, kind, base_url, key) in [
        ("claude_eu", "anthropic", anthropic.base_url(), anthropic.api_key()),
        ("gem_eu", "gemini", gemini.base_url(), gemini.api_key()),
    ] {
        let keys = json!({"kind": kind, "base_url": base_url, "request_timeout_secs": 5});
        let mut section: InstanceSection = serde_json::from_value(keys).expect("section");
        section.api_key = Some(Secret::new(key));
        settings.providers.insert(name.to_owned(), section);
    }
    let daemon = Daemon::start(settings, &world.emulator);
    let claude = |text: &str| json!({"max_tokens": 32, "messages": [{"role": "user", "content": text}]});
    let contents = |text: &str| json!({"contents": [{"role": "user", "parts": [{"text": text}]}]});
    let job = |id: &str, model: &str, item: &dyn Fn(&str) -> Value| {
        json!({"id": id, "model": model, "pack": false,
               "requests": (0..3).map(|i| item(&format!("question {i}"))).collect::<Vec<_>>()})
    };
    world.enqueue(&job("named-claude", "claude_eu/claude-sonnet-4-5", &claude)).await;
    world.enqueue(&job("named-gemini", "gem_eu/gemini-2.5-flash", &contents)).await;
    let claude_text: fn(&Value) -> &Value = |body| &body["content"][0]["text"];
    let gemini_text: fn(&Value) -> &Value = |body| &body["candidates"][0]["content"]["parts"][0]["text"];
    assert_echoed_in_order(&world.wait_for_result("named-claude", WAIT).await, "claude_eu", 3, claude_text);
    assert_echoed_in_order(&world.wait_for_result("named-gemini", WAIT).await, "gem_eu", 3, gemini_text);
    // The model went out without the instance's prefix.
    let created = gemini.calls_of(batchd_emulator::GeminiCallKind::Create);
    assert_eq!(created.len(), 1);
    assert!(created[0].path.contains("models/gemini-2.5-flash:batchGenerateContent"), "{:?}", created[0].path);
    daemon.stop().await.expect("stop");
}

#[tokio::test]
async fn a_vendor_that_spells_statuses_in_upper_case_runs_jobs_to_completion() {
    let world = world().await;
    let mut settings = without_workers_ai(&world);
    instance(&mut settings, &world.emulator, "novita", NOVITA, json!({"completion_window": "48h"}));
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&chat_job("on-novita", "novita/meta-llama/llama-3.1-8b-instruct", 3)).await;
    // `COMPLETED` read as anything but `completed` would leave the job polling until its deadline.
    assert_chat_in_order(&world.wait_for_result("on-novita", WAIT).await, "novita/meta-llama/llama-3.1-8b-instruct", 3);
    let novita = mount(&world.emulator, NOVITA);
    assert_eq!(novita.batch_statuses().len(), 1);
    daemon.stop().await.expect("stop");
}
