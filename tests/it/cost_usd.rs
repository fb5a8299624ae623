//! What a job costs (issue 39): the result entry's `usage.cost_usd` at the model's batch prices, against a table
//! computed by hand; a packed job's estimated share; the cost by provider and day in `batchd stats`; and
//! `batchd_cost_usd_total`, counted once per remote batch's usage (its members' shares add up to it), never once
//! per member. (tests/it/cost.rs is something else: the Redis commands a job costs.)

use std::time::Duration;

use batchd_core::ResultStatus;
use batchd_core::pricing::ModelPrice;
use batchd_tests::{World, bge_m3_job, http_get, wait_until, with_admin, with_openai};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// A result's `usage`.
fn usage(entry: &batchd_core::ResultEntry) -> Value {
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    entry.result.as_ref().expect("a result").usage.clone()
}

/// The tests' price of bge-m3, configured over its built-in one: $2 per million input tokens, so that its costs are
/// easy to check by hand.
fn bge_m3_at_two_dollars() -> Vec<ModelPrice> {
    vec![ModelPrice { model: "@cf/baai/bge-m3".to_owned(), input: Some(2.0), ..ModelPrice::default() }]
}

/// `batchd_cost_usd_total{provider,model}` as the admin server exports it, 0 when absent.
async fn cost_metric(admin: std::net::SocketAddr, provider: &str, model: &str) -> f64 {
    let (_, body) = http_get(admin, "/metrics").await.expect("GET /metrics");
    let labels = format!("batchd_cost_usd_total{{provider=\"{provider}\",model=\"{model}\"}} ");
    body.lines().find_map(|line| line.strip_prefix(&labels)).map_or(0.0, |value| value.parse().expect("a number"))
}

/// The hand-computed table. Token counts are the emulator's (a word is a token): a bge-m3 item of
/// `bge_m3_job` has 6 words (a query of 2, two contexts of 2), the emulator's OpenAI answer echoes its input with a few words more.
///
/// | job | model | price (USD per million tokens, batch) | usage | cost_usd |
/// |---|---|---|---|---|
/// | bge-5 | @cf/baai/bge-m3 | 2.0 input (configured) | 30 prompt | 30 × 2.0 / 1e6 = 0.00006 |
/// | llama | @cf/meta/llama-3.3-70b-instruct-fp8-fast | built-in: 26668 / 204805 neurons, $0.011 per 1,000 | 4 prompt, 6 completion | (4 × 26668 + 6 × 204805) / 1e6 = 1.335502 neurons × 0.011 / 1e3 = 0.0000146905 → 0.000014691 |
/// | chat | openai/gpt-4o-mini | built-in: 0.075 input, 0.30 output (half of 0.15, 0.60) | 6 prompt, 9 completion | (6 × 0.075 + 9 × 0.30) / 1e6 = 0.00000315 |
/// | free | @cf/baai/bge-small-en-v1.5 | configured away: none | 2 prompt | no cost_usd |
#[tokio::test]
async fn a_jobs_cost_is_its_usage_at_the_models_batch_prices() {
    let mut world = World::new().await;
    with_openai(&mut world.settings, &world.emulator);
    let admin = with_admin(&mut world.settings);
    world.settings.pricing.models = bge_m3_at_two_dollars();
    let daemon = world.daemon();

    world.enqueue(&bge_m3_job("bge-5", 5)).await;
    world
        .enqueue(&json!({"id": "llama", "model": "@cf/meta/llama-3.3-70b-instruct-fp8-fast",
            "requests": [{"prompt": "one two"}, {"prompt": "three four"}]}))
        .await;
    world
        .enqueue(&json!({"id": "chat", "model": "openai/gpt-4o-mini", "requests": [
            {"messages": [{"role": "user", "content": "hello there"}]},
            {"messages": [{"role": "user", "content": "good day"}]},
            {"messages": [{"role": "user", "content": "see you"}]},
        ]}))
        .await;
    world.enqueue(&json!({"id": "free", "model": "@cf/qwen/qwen3-30b-a3b-fp8", "requests": [{"prompt": "a b"}]})).await;

    let bge = usage(&world.wait_for_result("bge-5", WAIT).await);
    assert_eq!((bge["prompt_tokens"].as_u64(), bge["cost_usd"].as_f64()), (Some(30), Some(0.00006)), "{bge}");
    let llama = usage(&world.wait_for_result("llama", WAIT).await);
    assert_eq!(
        (llama["prompt_tokens"].as_u64(), llama["completion_tokens"].as_u64(), llama["cost_usd"].as_f64()),
        (Some(4), Some(6), Some(0.000014691)),
        "{llama}"
    );
    let chat = usage(&world.wait_for_result("chat", WAIT).await);
    assert_eq!(
        (chat["prompt_tokens"].as_u64(), chat["completion_tokens"].as_u64(), chat["cost_usd"].as_f64()),
        (Some(6), Some(9), Some(0.00000315)),
        "{chat}"
    );
    let free = world.wait_for_result("free", WAIT).await;
    if let Some(output) = &free.result {
        assert!(output.usage.get("cost_usd").is_none(), "a model with no price has no cost: {}", output.usage);
    }

    // The metric by provider and model, once per job.
    wait_until("the cost metric", WAIT, async || cost_metric(admin, "openai", "openai/gpt-4o-mini").await > 0.0).await;
    assert!((cost_metric(admin, "openai", "openai/gpt-4o-mini").await - 0.00000315).abs() < 1e-12);
    assert!((cost_metric(admin, "cloudflare", "@cf/baai/bge-m3").await - 0.00006).abs() < 1e-12);
    assert!(
        (cost_metric(admin, "cloudflare", "@cf/meta/llama-3.3-70b-instruct-fp8-fast").await - 0.000014691).abs()
            < 1e-12
    );

    // `batchd stats`: today's cost by provider, from the finished-jobs counters.
    let output = world.batchd().args(["stats", "--json"]).output().expect("batchd stats");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).expect("json");
    let days = report["cost"]["days"].as_array().expect("days");
    assert_eq!(days.len(), 7);
    let today = &days[6];
    assert_eq!(today["by_provider"]["openai"].as_f64(), Some(0.00000315), "{today}");
    assert_eq!(today["by_provider"]["cloudflare"].as_f64(), Some(0.000074691), "{today}");
    assert_eq!(today["by_model"]["@cf/baai/bge-m3"].as_f64(), Some(0.00006), "{today}");
    assert_eq!(today["total"].as_f64(), Some(0.000077841), "{today}");
    let text = world.batchd().args(["stats"]).output().expect("batchd stats");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("cost today       $0.000078 (cloudflare $0.000075, openai $0.000003)"), "{text}");
    daemon.stop().await.expect("daemon stops");
}

/// Four one-item bge-m3 jobs of 6 tokens each share one pack (Workers AI reports usage per batch): each gets a
/// quarter of the pack's 24 tokens, marked estimated, and a quarter of its cost; the metric and the counters add
/// the four shares up to the pack's cost once (24 × 2.0 / 1e6 = 0.000048), not four times.
#[tokio::test]
async fn a_packed_job_gets_its_estimated_share_and_the_pack_is_counted_once() {
    let mut world = World::new().await;
    world.settings.packing.enabled = true;
    world.settings.packing.window_ms = 60_000;
    world.settings.packing.pause_ms = 1_000;
    let admin = with_admin(&mut world.settings);
    world.settings.pricing.models = bge_m3_at_two_dollars();
    for i in 0..4 {
        world.enqueue(&bge_m3_job(&format!("packed-{i}"), 1)).await;
    }
    let daemon = world.daemon();
    for i in 0..4 {
        let entry = world.wait_for_result(&format!("packed-{i}"), WAIT).await;
        let usage = usage(&entry);
        assert_eq!(
            (usage["prompt_tokens"].as_u64(), usage["estimated"].as_bool(), usage["cost_usd"].as_f64()),
            (Some(6), Some(true), Some(0.000012)),
            "{usage}"
        );
    }
    assert_eq!(world.emulator.submits().len(), 1, "one pack");
    wait_until("the cost metric", WAIT, async || cost_metric(admin, "cloudflare", "@cf/baai/bge-m3").await > 0.0).await;
    assert!((cost_metric(admin, "cloudflare", "@cf/baai/bge-m3").await - 0.000048).abs() < 1e-12);
    let output = world.batchd().args(["stats", "--json"]).output().expect("batchd stats");
    let report: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(report["cost"]["days"][6]["total"].as_f64(), Some(0.000048), "{report}");
    daemon.stop().await.expect("daemon stops");
}

/// The daily budget against the emulator: two jobs in flight together when the day's spend is still 0 both finish
/// (the overshoot is what was in flight: 2 × $0.00006 against a budget of $0.00005); a job enqueued after that is
/// accepted but held, not submitted, and `batchd status` says until when and why; the engine looks at it again
/// within `spend::RECHECK` (5 minutes), no sooner.
#[tokio::test]
async fn a_reached_daily_budget_holds_new_submits_and_lets_work_in_flight_finish() {
    let config = batchd_emulator::EmulatorConfig {
        running_for: Duration::from_secs(2),
        ..batchd_emulator::EmulatorConfig::default()
    };
    let mut world = World::with_emulator(config).await;
    world.settings.pricing.models = bge_m3_at_two_dollars();
    world.settings.budget.usd_per_day = 0.00005;
    with_admin(&mut world.settings);
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("first", 5)).await;
    world.enqueue(&bge_m3_job("second", 5)).await;
    for id in ["first", "second"] {
        let entry = world.wait_for_result(id, WAIT).await;
        assert_eq!(usage(&entry)["cost_usd"].as_f64(), Some(0.00006));
    }
    assert_eq!(world.emulator.submits().len(), 2);

    world.enqueue(&bge_m3_job("third", 5)).await;
    let status_json = || {
        let output = world
            .batchd()
            .env("BATCHD__BUDGET__USD_PER_DAY", "0.00005")
            .args(["status", "third", "--json"])
            .output()
            .expect("batchd status");
        serde_json::from_slice::<Value>(&output.stdout).unwrap_or(Value::Null)
    };
    // Taken in, then held by the engine: its next look is minutes away, not a submit.
    wait_until("the third job held", WAIT, async || {
        let status = status_json();
        let due = status["waits"]["chunks"][0]["due_at"].as_u64().unwrap_or(0);
        due > status["waits"]["held_by_budget"]["until"].as_u64().unwrap_or(u64::MAX).min(batchd_tests_now() + 60_000)
    })
    .await;
    let status = status_json();
    let held = &status["waits"]["held_by_budget"];
    assert_eq!((held["spent_usd"].as_f64(), held["usd_per_day"].as_f64()), (Some(0.00012), Some(0.00005)), "{status}");
    assert_eq!(held["until"].as_u64().expect("until") % 86_400_000, 0, "the next UTC midnight");
    let text = world
        .batchd()
        .env("BATCHD__BUDGET__USD_PER_DAY", "0.00005")
        .args(["status", "third"])
        .output()
        .expect("batchd status");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("held by the daily budget until ")
            && text.contains("T00:00:00.000Z")
            && text
                .contains("today's cost $0.000120 has reached budget.usd_per_day $0.000050; work in flight continues"),
        "{text}"
    );
    assert_eq!(world.emulator.submits().len(), 2, "the held job was not submitted");
    assert_eq!(
        (status["state"].as_str(), status["c0:state"].as_str()),
        (Some("accepted"), Some("pending")),
        "{status}"
    );
    daemon.stop().await.expect("daemon stops");
}

/// The local clock, Unix ms (within a second of Redis's here, where both run on this machine).
fn batchd_tests_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis() as u64
}
