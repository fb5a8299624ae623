//! The provider registration (issue 36): every provider is optional, so a daemon with only OpenAI or only
//! Anthropic configured starts and runs jobs (a job for a provider it does not have is refused at take-in naming
//! what to set); what the CLI and the dashboard say a provider can do comes from its kind's registration; and
//! rate limits belong to the account, so two namespaces on one account share one bucket.

use std::time::Duration;

use batchd::registry::REGISTRY;
use batchd::settings::Settings;
use batchd_core::{Keys, ResultStatus};
use batchd_queue::Store;
use batchd_tests::{Daemon, World, with_anthropic, with_openai};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// The world's settings with Workers AI not configured (no account id; the token `Daemon::start` hands over is
/// used only for a configured Workers AI).
fn without_cloudflare(world: &World) -> Settings {
    let mut settings = world.settings.clone();
    settings.cloudflare.account_id = String::new();
    settings
}

/// The Workers AI calls the emulator has served: submits, polls, pages of the model catalog.
fn cloudflare_calls(world: &World) -> u64 {
    let batches = world.emulator.submits().len() + world.emulator.polls().len();
    u64::try_from(batches).expect("count") + world.emulator.catalog_calls()
}

/// Runs a job of `model` with `requests` and a Workers AI job through a daemon with one provider configured: the
/// first completes, the second is refused at take-in naming what to set, and Workers AI is never called.
async fn runs_alone(world: &World, settings: Settings, model: &str, requests: Vec<Value>) {
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&json!({"id": "alone-1", "model": model, "requests": requests})).await;
    let entry = world.wait_for_result("alone-1", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(entry.result.as_ref().expect("result").responses.len(), requests.len());
    assert!(entry.result.as_ref().expect("result").responses.iter().all(|response| response.success));

    world.enqueue(&batchd_tests::bge_m3_job("alone-cf", 1)).await;
    let refused = world.wait_for_result("alone-cf", WAIT).await;
    assert_eq!(refused.status, ResultStatus::Failed);
    let message = refused.error.as_ref().expect("error").message.clone();
    assert!(message.contains("set cloudflare.account_id and CLOUDFLARE_API_TOKEN"), "{message}");
    assert!(daemon.is_running(), "a job for a provider that is not configured does not stop the daemon");
    daemon.stop().await.expect("clean stop");
    assert_eq!(cloudflare_calls(world), 0, "Workers AI is not configured: never called, not even for its catalog");
}

#[tokio::test]
async fn a_daemon_with_only_openai_configured_starts_and_runs_a_job_to_completion() {
    let world = World::new().await;
    let mut settings = without_cloudflare(&world);
    with_openai(&mut settings, &world.emulator);
    let chat = |text: &str| json!({"messages": [{"role": "user", "content": text}], "max_tokens": 5});
    runs_alone(&world, settings, "openai/gpt-4o-mini", vec![chat("zero"), chat("one"), chat("two")]).await;
    assert_eq!(world.emulator.openai().calls_of(batchd_emulator::OpenAiCallKind::CreateBatch).len(), 1);
}

#[tokio::test]
async fn a_daemon_with_only_anthropic_configured_starts_and_runs_a_job_to_completion() {
    let world = World::new().await;
    let mut settings = without_cloudflare(&world);
    with_anthropic(&mut settings, &world.emulator);
    let item = |text: &str| json!({"max_tokens": 32, "messages": [{"role": "user", "content": text}]});
    runs_alone(&world, settings, "anthropic/claude-sonnet-4-5", vec![item("zero"), item("one")]).await;
    assert_eq!(world.emulator.anthropic().calls_of(batchd_emulator::AnthropicCallKind::Create).len(), 1);
}

/// What the CLI's JSON and the dashboard's say of each kind: its registration, field by field.
fn assert_is_registration(shown: &Value, kind: &batchd_provider::Kind) {
    assert_eq!(shown["kind"], kind.name, "{shown}");
    assert_eq!(shown["title"], kind.title, "{shown}");
    assert_eq!(shown["models"], json!(kind.models), "{shown}");
    for (name, has) in kind.capabilities.named() {
        assert_eq!(shown["capabilities"][name], has, "{}: {name}: {shown}", kind.name);
    }
}

#[tokio::test]
async fn the_cli_and_the_dashboard_show_each_providers_capabilities_from_its_registration() {
    let world = World::new().await;
    // `batchd models --json` with only OpenAI configured: every kind, and which are configured; no Redis needed.
    let (code, stdout, stderr) = crate::cli_operator::cli_with(
        &world,
        &["models", "--json"],
        &[("CLOUDFLARE_ACCOUNT_ID", ""), ("OPENAI_API_KEY", "sk-test"), ("REDIS_URL", "redis://127.0.0.1:1")],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let listing: Value = serde_json::from_str(&stdout).expect("JSON");
    let providers = listing["providers"].as_array().expect("providers");
    assert_eq!(providers.len(), REGISTRY.len(), "{listing}");
    for (shown, entry) in providers.iter().zip(&REGISTRY) {
        assert_is_registration(shown, entry.kind());
        assert_eq!(shown["configured"], entry.kind().name == "openai", "{shown}");
    }
    assert_eq!(listing["models"], json!([]), "no Workers AI, no catalog to list");
    let kinds: Vec<&str> = providers.iter().filter_map(|shown| shown["kind"].as_str()).collect();
    assert_eq!(kinds, ["cloudflare", "openai", "anthropic", "gemini"]);
    let (code, text, _) = crate::cli_operator::cli_with(
        &world,
        &["models"],
        &[("CLOUDFLARE_ACCOUNT_ID", ""), ("OPENAI_API_KEY", "sk-test"), ("REDIS_URL", "redis://127.0.0.1:1")],
    )
    .await;
    assert_eq!(code, 0);
    let openai = text.lines().find(|line| line.starts_with("openai ")).expect("an openai line");
    assert!(openai.contains("openai/<model>") && openai.contains("cancel") && openai.ends_with("yes"), "{text}");

    // The dashboard's job page (and its JSON twin) reads the job's provider from the registry.
    let mut settings = world.settings.clone();
    with_openai(&mut settings, &world.emulator);
    let daemon = Daemon::start(settings, &world.emulator);
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
    world.enqueue(&json!({"id": "caps-openai", "model": "openai/gpt-4o-mini", "requests": [chat]})).await;
    world.enqueue(&batchd_tests::bge_m3_job("caps-cf", 1)).await;
    world.wait_for_result("caps-openai", WAIT).await;
    world.wait_for_result("caps-cf", WAIT).await;
    daemon.stop().await.expect("clean stop");
    let dashboard = batchd_tests::browser::Dashboard::start(&world, &["--refresh-secs", "0"]).await.expect("ui");
    let ns = world.keys.namespace();
    for (job, model) in [("caps-openai", "openai/gpt-4o-mini"), ("caps-cf", "@cf/baai/bge-m3")] {
        let kind = batchd::registry::kind_of(model).expect("a known kind");
        let page: Value = reqwest::get(dashboard.url(&format!("/api/jobs/{job}?ns={ns}")))
            .await
            .expect("get")
            .json()
            .await
            .expect("JSON");
        assert_is_registration(&page["provider"], kind);
    }
}

#[tokio::test]
async fn two_namespaces_on_one_account_share_one_rate_bucket() {
    let world = World::new().await;
    let store = |namespace: &str| {
        let conn =
            batchd_queue::connect(redis::Client::open(world.redis.url()).expect("client"), WAIT).expect("connect");
        Store::new(conn, Keys::new(namespace).expect("namespace"), world.settings.store_settings())
    };
    let ns = world.keys.namespace();
    let (billing, search) = (store(&format!("{ns}-billing")), store(&format!("{ns}-search")));
    // Account labels of this test's own (a Redis shared by several tests holds theirs too).
    let (shared, other) = (format!("{ns}-shared"), format!("{ns}-other"));
    // One slot an hour, no burst: whoever books it first makes the other wait.
    let hour = Duration::from_secs(3600);
    let bucket = |account: &str| format!("{account}:gpt-4o-mini");
    assert_eq!(billing.rate_limit(&bucket(&shared), hour, 1).await.expect("redis"), None, "the slot");
    let wait = search.rate_limit(&bucket(&shared), hour, 1).await.expect("redis");
    assert!(wait.is_some_and(|wait| wait > Duration::from_secs(3500)), "the other namespace waits: {wait:?}");
    assert_eq!(
        search.rate_limit(&bucket(&other), hour, 1).await.expect("redis"),
        None,
        "another account has its own bucket"
    );
    // Each bucket lives under its account's own hash tag, in no namespace.
    for account in [&shared, &other] {
        let key = format!("{{batchd-rate:{account}}}:gpt-4o-mini");
        let exists: bool = redis::cmd("EXISTS").arg(&key).query_async(&mut world.conn.clone()).await.expect("EXISTS");
        assert!(exists, "{key}");
    }

    // A provider names its buckets after its instance's account label: OpenAI's default is `openai`, a
    // configured label replaces it, so two deployments on one OpenAI organization share their limits.
    let mut settings = world.settings.clone();
    with_openai(&mut settings, &world.emulator);
    settings.openai.batches_per_hour = 60;
    settings.openai.account = "shared-acct".to_owned();
    let context = batchd_provider::BuildContext {
        lease: Duration::from_secs(120),
        inflight_bytes: settings.workers.inflight_bytes,
        reply_budget: None,
    };
    let openai = REGISTRY.iter().find(|entry| entry.kind().name == "openai").expect("openai");
    let built =
        openai.build(&settings, batchd::registry::Instance::BuiltIn, &context).expect("build").expect("configured");
    let model = batchd_core::ModelName::parse("openai/gpt-4o-mini").expect("model");
    let bucket = built.provider.rate_bucket(&model, batchd_provider::Call::Submit).expect("limited");
    assert_eq!(bucket.name, "shared-acct:gpt-4o-mini");
    assert_eq!(Keys::rate_limit(&bucket.name), "{batchd-rate:shared-acct}:gpt-4o-mini");
}
