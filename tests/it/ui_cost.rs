//! The dashboard's cost per day (issue 39) in a real browser (headless Chromium through chromedriver), against a
//! real `batchd ui` process and redis-server: the overview's "Cost per day" table reads the finished-jobs counters'
//! `cost_nusd:<model>` fields (written with each result: tests/it/cost_usd.rs) by UTC day and provider, newest day
//! first, and its JSON twin has the same days.

use batchd_tests::World;
use batchd_tests::browser::{Browser, Dashboard};
use redis::AsyncCommands;

/// Adds `nano` nano-dollars to `model`'s cost counter in hash `key`, as a publish does.
async fn count_cost(world: &World, key: &str, model: &str, nano: u64) {
    let _: () = world.conn.clone().hincr(key, batchd_core::stats::cost_field(model), nano).await.expect("HINCRBY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_the_cost_of_each_day_by_provider() {
    let world = World::new().await;
    let (secs, _): (u64, u64) = redis::cmd("TIME").query_async(&mut world.conn.clone()).await.expect("TIME");
    let hour = secs / 3600;
    // Today: $1.50 at OpenAI and $0.000012 at Workers AI; yesterday (24 hours ago): $0.25 at OpenAI.
    count_cost(&world, &world.keys.stats_hour(hour), "openai/gpt-4o-mini", 1_500_000_000).await;
    count_cost(&world, &world.keys.stats_hour(hour), "@cf/baai/bge-m3", 12_000).await;
    count_cost(&world, &world.keys.stats_hour(hour - 24), "openai/gpt-4o-mini", 250_000_000).await;
    let today = batchd::cli::format_utc(hour * 3_600_000)[..10].to_owned();
    let yesterday = batchd::cli::format_utc((hour - 24) * 3_600_000)[..10].to_owned();

    let dashboard = Dashboard::start(&world, &["--refresh-secs", "0"]).await.expect("batchd ui");
    let browser = Browser::start().await.expect("browser");
    let ns = world.keys.namespace().to_owned();
    browser.open(&dashboard.url(&format!("/?ns={ns}")), &format!("#cost-{ns}")).await.expect("overview");
    let cell = |day: &str, css: &str| format!("#cost-{ns} tr[data-day='{day}'] {css}");
    let headers = browser.all(&format!("#cost-{ns} th")).await.expect("headers");
    let mut names = Vec::new();
    for header in headers {
        names.push(header.text().await.expect("text"));
    }
    assert_eq!(names, ["day (UTC)", "total", "cloudflare", "openai"]);
    assert_eq!(browser.text(&cell(&today, "td.total")).await.expect("today"), "$1.50");
    assert_eq!(browser.text(&cell(&today, "td[data-provider=cloudflare]")).await.expect("cf"), "$0.000012");
    assert_eq!(browser.text(&cell(&today, "td[data-provider=openai]")).await.expect("openai"), "$1.50");
    assert_eq!(browser.text(&cell(&yesterday, "td.total")).await.expect("yesterday"), "$0.2500");
    assert_eq!(browser.text(&cell(&yesterday, "td[data-provider=cloudflare]")).await.expect("none"), "–");
    let rows = browser.all(&format!("#cost-{ns} tbody tr")).await.expect("rows");
    assert_eq!(rows.len(), 2, "days without a cost are left out");
    assert_eq!(rows[0].attr("data-day").await.expect("attr").as_deref(), Some(today.as_str()), "newest first");

    // The JSON twin: seven days, oldest first, in USD.
    let overview: serde_json::Value =
        reqwest::get(dashboard.url(&format!("/api/overview?ns={ns}"))).await.expect("get").json().await.expect("json");
    let days = overview["namespaces"][0]["stats"]["cost"]["days"].as_array().expect("days").clone();
    assert_eq!(days.len(), 7);
    assert_eq!(days[6]["day"].as_str(), Some(today.as_str()));
    assert_eq!(days[6]["by_provider"]["openai"].as_f64(), Some(1.5));
    assert_eq!(days[6]["by_model"]["@cf/baai/bge-m3"].as_f64(), Some(0.000012));
    browser.close().await;
}
