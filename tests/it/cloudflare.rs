//! Cloudflare as it really runs (issue 26), end to end through real daemons, the `batchd` binary, a real Redis and
//! the emulator: per-model event subscriptions (`batchd events setup`, the daemon's check), the model catalog as
//! the source of truth (refusals at take-in, rate buckets, `batchd models`, the Redis copy), per-model limits and
//! adaptive backoff on 429s, and schema refusals in every wording.

use std::process::Output;
use std::time::Duration;

use batchd_core::ResultStatus;
use batchd_emulator::{EmulatorConfig, EventsConfig, Family, Fault, RateLimit, RefusalForm, SchemaKeyword};
use batchd_tests::{Daemon, World, bge_m3_job, http_get, wait_until, with_admin};
use redis::AsyncCommands as _;

const WAIT: Duration = Duration::from_secs(30);
const QUEUE: &str = "batchd-events";

/// The `batchd` binary with the world's settings and the events queue.
fn batchd(world: &World, args: &[&str]) -> Output {
    world
        .batchd()
        .env("CLOUDFLARE_API_TOKEN", world.emulator.token())
        .env("BATCHD__EVENTS__QUEUE_ID", QUEUE)
        .args(args)
        .output()
        .expect("run batchd")
}

fn json_of(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "batchd failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("JSON output")
}

/// The actions `batchd events setup --json` reports, by model.
fn actions(report: &serde_json::Value) -> Vec<(String, String)> {
    report["models"]
        .as_array()
        .expect("models")
        .iter()
        .map(|row| {
            (row["model"].as_str().expect("model").to_owned(), row["action"].as_str().expect("action").to_owned())
        })
        .collect()
}

// Multi-threaded: the batchd process blocks this thread while it talks to the in-process emulator.
#[tokio::test(flavor = "multi_thread")]
async fn events_setup_creates_one_subscription_per_configured_and_seen_model_after_a_dry_run() {
    let config = EmulatorConfig { events: Some(EventsConfig::per_model(QUEUE)), ..EmulatorConfig::default() };
    let world = World::with_emulator(config).await;
    // A model batchd has submitted for, as a daemon records it.
    let mut conn =
        batchd_queue::connect(redis::Client::open(world.settings.redis.url.expose()).unwrap(), WAIT).unwrap();
    let seen = ["@cf/acme/seen-model".to_owned()];
    batchd_queue::provider_cache::note_models_seen(&mut conn, &world.keys, world.emulator.account_id(), &seen, 1)
        .await
        .unwrap();

    let dry = json_of(&batchd(&world, &["events", "setup", "--dry-run", "--json", "--model", "@cf/acme/extra"]));
    let planned = actions(&dry);
    let configured = world.settings.rate_limits.task_types.len();
    assert!(planned.len() > configured, "configured, seen and named models: {planned:?}");
    assert!(planned.iter().all(|(_, action)| action == "would create"), "{planned:?}");
    for model in
        ["@cf/baai/bge-m3", "@cf/acme/seen-model", "@cf/acme/extra", "@cf/meta/llama-3.3-70b-instruct-fp8-fast"]
    {
        assert!(planned.iter().any(|(name, _)| name == model), "{model} in {planned:?}");
    }
    assert!(world.emulator.subscriptions().is_empty(), "a dry run changes nothing");

    let done = json_of(&batchd(&world, &["events", "setup", "--json", "--model", "@cf/acme/extra"]));
    assert!(actions(&done).iter().all(|(_, action)| action == "created"), "{done}");
    let subscriptions = world.emulator.subscriptions();
    assert_eq!(subscriptions.len(), planned.len(), "one subscription per model");
    for subscription in &subscriptions {
        assert_eq!(subscription.queue_id, QUEUE);
        assert_eq!(subscription.events, ["batch.succeeded", "batch.failed"]);
        assert!(subscription.enabled);
    }

    // Run again: nothing to do. A subscription someone disabled is enabled again.
    let again = json_of(&batchd(&world, &["events", "setup", "--json", "--model", "@cf/acme/extra"]));
    assert!(actions(&again).iter().all(|(_, action)| action == "ok"), "{again}");
    let text = batchd(&world, &["events", "setup", "--dry-run"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("dry run"), "{text}");
    assert!(text.lines().any(|line| line.starts_with("ok ") && line.contains("@cf/baai/bge-m3")), "{text}");
}

#[tokio::test]
async fn the_daemon_reports_a_model_without_a_subscription_and_its_events_flow_once_subscribed() {
    let config = EmulatorConfig {
        queued_for: Duration::from_millis(300),
        running_for: Duration::from_millis(900),
        events: Some(EventsConfig::per_model(QUEUE)),
        ..EmulatorConfig::default()
    };
    let world = World::with_emulator(config).await;
    let mut settings = world.settings.clone();
    settings.events.queue_id = QUEUE.to_owned();
    settings.events.max_idle_ms = 200;
    settings.poll.max_interval_ms_with_events = 600_000;
    let admin = with_admin(&mut settings);
    let daemon = Daemon::start(settings, &world.emulator);

    // No subscription: the batch finishes, no event is published, the daemon says which model lacks one.
    world.enqueue(&bge_m3_job("unsubscribed", 1)).await;
    wait_until("batchd_models_without_events 1", WAIT, async || {
        http_get(admin, "/metrics").await.is_ok_and(|(_, body)| body.contains("batchd_models_without_events 1"))
    })
    .await;
    wait_until("the finished batch's event not published", WAIT, async || {
        world.emulator.queue_stats().unsubscribed >= 1
    })
    .await;
    assert_eq!(world.emulator.queue_stats().published.succeeded, 0);
    let seen: Vec<String> =
        world.conn.clone().zrange(world.keys.cloudflare_models_seen(world.emulator.account_id()), 0, -1).await.unwrap();
    assert_eq!(seen, ["@cf/baai/bge-m3"], "the seen model is recorded for batchd events setup");

    // Subscribed: the next job's batch is woken by its event, long before the 10-minute fallback poll.
    world.emulator.subscribe("@cf/baai/bge-m3");
    world.enqueue(&bge_m3_job("subscribed", 1)).await;
    let result = world.wait_for_result("subscribed", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed);
    assert!(world.emulator.queue_stats().published.succeeded >= 1);
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_model_the_catalog_lists_without_async_queue_is_refused_at_take_in_without_a_remote_call() {
    let config = EmulatorConfig { unbatchable_models: vec!["@cf/baai/bge-m3".into()], ..EmulatorConfig::default() };
    let world = World::with_emulator(config).await;
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("not-batchable", 2)).await;

    let result = world.wait_for_result("not-batchable", WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("error");
    assert_eq!((error.code.as_str(), error.api_code, error.http_status), ("model_not_batchable", None, None));
    assert!(error.message.contains("catalog") && error.message.contains("async_queue"), "{}", error.message);
    assert!(world.emulator.submits().is_empty(), "nothing was sent: {:?}", world.emulator.calls());
    assert!(world.emulator.catalog_calls() >= 1);
    // The catalog is shared through Redis: a second daemon takes the copy instead of asking the API again.
    let calls = world.emulator.catalog_calls();
    let second = world.daemon();
    world.enqueue(&bge_m3_job("not-batchable-2", 1)).await;
    let result = world.wait_for_result("not-batchable-2", WAIT).await;
    assert_eq!(result.error.expect("error").code, "model_not_batchable");
    assert_eq!(world.emulator.catalog_calls(), calls, "the second daemon read the catalog from Redis");
    daemon.stop().await.unwrap();
    second.stop().await.unwrap();
}

#[tokio::test]
async fn rate_buckets_follow_the_catalogs_task_and_the_tables_apply_without_it() {
    let new_model = "@cf/acme/new-embedder";
    let config = EmulatorConfig {
        extra_models: vec![(new_model.into(), Family::Embeddings { dim: 8 })],
        ..EmulatorConfig::default()
    };
    let world = World::with_emulator(config).await;
    let mut settings = world.settings.clone();
    settings.rate_limits.embeddings = 6000;
    let daemon = Daemon::start(settings.clone(), &world.emulator);
    let mut job = bge_m3_job("catalog-task", 1);
    job["model"] = new_model.into();
    world.enqueue(&job).await;
    assert_eq!(world.wait_for_result("catalog-task", WAIT).await.status, ResultStatus::Completed);
    let account = world.emulator.account_id();
    let embeddings = batchd_core::Keys::rate_limit(&format!("{account}:embeddings"));
    assert!(world.conn.clone().exists::<_, bool>(&embeddings).await.unwrap(), "the catalog says Text Embeddings");
    daemon.stop().await.unwrap();

    // Without the catalog the model is unknown: the fallback task (text_generation, limited to 60 here).
    let world = World::with_emulator(EmulatorConfig {
        extra_models: vec![(new_model.into(), Family::Embeddings { dim: 8 })],
        ..EmulatorConfig::default()
    })
    .await;
    let mut settings = world.settings.clone();
    settings.cloudflare.catalog_refresh_secs = 0;
    settings.rate_limits.embeddings = 6000;
    settings.rate_limits.text_generation = 6000;
    let daemon = Daemon::start(settings, &world.emulator);
    let mut job = bge_m3_job("table-task", 1);
    job["model"] = new_model.into();
    world.enqueue(&job).await;
    assert_eq!(world.wait_for_result("table-task", WAIT).await.status, ResultStatus::Completed);
    let text = batchd_core::Keys::rate_limit(&format!("{account}:text_generation"));
    assert!(world.conn.clone().exists::<_, bool>(&text).await.unwrap(), "the hand table's fallback");
    assert_eq!(world.emulator.catalog_calls(), 0, "catalog_refresh_secs = 0 reads no catalog");
    daemon.stop().await.unwrap();
}

// Multi-threaded: the batchd process blocks this thread while it talks to the in-process emulator.
#[tokio::test(flavor = "multi_thread")]
async fn batchd_models_lists_the_batchable_models_with_task_bucket_and_limit() {
    let config = EmulatorConfig {
        unbatchable_models: vec!["@cf/openai/gpt-oss-20b".into()],
        extra_models: vec![("@cf/moonshotai/kimi-k2.6".into(), Family::TextGeneration)],
        ..EmulatorConfig::default()
    };
    let world = World::with_emulator(config).await;
    let listing = json_of(&batchd(&world, &["models", "--json"]));
    assert_eq!(listing["source"], "api", "no copy in Redis yet: read from the API: {listing}");
    let models = listing["models"].as_array().expect("models");
    let row = |name: &str| models.iter().find(|row| row["model"] == name).cloned();
    assert!(row("@cf/openai/gpt-oss-20b").is_none(), "not batchable: not listed");
    let bge = row("@cf/baai/bge-m3").expect("bge-m3");
    let account = world.emulator.account_id();
    assert_eq!((bge["task"].as_str(), bge["task_source"].as_str()), (Some("embeddings"), Some("catalog")));
    assert_eq!((bge["bucket"].clone(), bge["limit"].clone()), (format!("{account}:embeddings").into(), 3000.into()));
    let kimi = row("@cf/moonshotai/kimi-k2.6").expect("a model the hand table misses");
    assert_eq!((kimi["task"].as_str(), kimi["limit"].as_u64()), (Some("text_generation"), Some(20)), "{kimi}");
    assert_eq!(kimi["bucket"], format!("{account}:@cf/moonshotai/kimi-k2.6"), "its own observed limit");

    let calls = world.emulator.catalog_calls();
    let again = json_of(&batchd(&world, &["models", "--json"]));
    assert_eq!(again["source"], "cache");
    assert_eq!(world.emulator.catalog_calls(), calls, "the copy in Redis was used");
    let text = batchd(&world, &["models"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("@cf/baai/bge-m3"));
}

#[tokio::test]
async fn repeated_429s_lower_a_buckets_rate_and_the_effective_limit_is_exported() {
    let config =
        EmulatorConfig { rate_limit: Some(RateLimit::new(2, Duration::from_secs(60))), ..EmulatorConfig::default() };
    let world = World::with_emulator(config).await;
    let mut settings = world.settings.clone();
    settings.rate_limits.embeddings = 600;
    let admin = with_admin(&mut settings);
    let daemon = Daemon::start(settings, &world.emulator);
    for i in 0..4 {
        world.enqueue(&bge_m3_job(&format!("throttled-{i}"), 1)).await;
    }
    let account = world.emulator.account_id().to_owned();
    let series = format!("batchd_rate_limit_effective{{bucket=\"{account}:embeddings\"}} ");
    let effective = async || -> Option<f64> {
        let (_, body) = http_get(admin, "/metrics").await.ok()?;
        body.lines().find_map(|line| line.strip_prefix(&series)).and_then(|value| value.trim().parse().ok())
    };
    // Halved on every second 429 (the emulator keeps refusing), never below 5% of the configured 600.
    wait_until("the embeddings bucket lowered", WAIT, async || effective().await.is_some_and(|rate| rate < 600.0))
        .await;
    let rate = effective().await.expect("exported");
    assert!((30.0..=300.0).contains(&rate), "effective limit {rate}");
    assert!(world.emulator.rate_limited_count() >= 2);
    daemon.crash().await;
}

#[tokio::test]
async fn schema_refusals_in_every_wording_isolate_the_bad_item() {
    let forms = [
        RefusalForm { keyword: SchemaKeyword::AnyOf, code: Some(5006), pointer: true },
        RefusalForm { keyword: SchemaKeyword::AnyOf, code: None, pointer: false },
        RefusalForm { keyword: SchemaKeyword::OneOf, code: None, pointer: true },
        RefusalForm { keyword: SchemaKeyword::OneOf, code: Some(5004), pointer: false },
    ];
    let world = World::new().await;
    world.emulator.set_strict_items(true);
    let daemon = world.daemon();
    for (n, form) in forms.into_iter().enumerate() {
        world.emulator.set_strict_refusal(form);
        let id = format!("wording-{n}");
        let mut job = bge_m3_job(&id, 6);
        job["requests"][4] = serde_json::json!({"neither": "text nor query"});
        world.enqueue(&job).await;
        let result = world.wait_for_result(&id, WAIT).await;
        assert_eq!(result.status, ResultStatus::Completed, "{form:?}: {:?}", result.error);
        assert_eq!(result.items_failed, 1, "{form:?}");
        let output = result.result.expect("output");
        assert!(output.responses.iter().all(|response| response.success == (response.index != 4)), "{form:?}");
    }
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn an_unreadable_catalog_leaves_the_tables_in_force_and_jobs_run() {
    let world = World::new().await;
    world.emulator.inject(Fault::status(503).on(batchd_emulator::Calls::Catalog).times(10));
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("no-catalog", 1)).await;
    assert_eq!(world.wait_for_result("no-catalog", WAIT).await.status, ResultStatus::Completed);
    daemon.stop().await.unwrap();
}
