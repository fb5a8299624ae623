//! The dashboard's cost per day (issue 39) in a real browser (headless Chromium through chromedriver), against a
//! real `batchd ui` process and redis-server: the overview's "Cost per day" table reads the finished-jobs counters'
//! `cost_nusd:<model>` fields (written with each result: tests/it/cost_usd.rs) by UTC day and provider, newest day
//! first, and its JSON twin has the same days; the jobs list's provider column and filter and durations; the look-up
//! of a job by its remote batch id; and the overview without a replica that stopped cleanly.

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

/// The jobs list as operators expect it from other batch consoles: a provider column and filter, and how long each
/// job took (accepted to finished) or has been going; a look-up by remote batch id (the dashboard's form and
/// `batchd status --remote`); and a replica that stopped cleanly is not listed any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_list_has_a_provider_column_and_filter_and_durations() {
    let mut world = World::new().await;
    batchd_tests::with_openai(&mut world.settings, &world.emulator);
    let daemon = world.daemon();
    world.enqueue(&batchd_tests::bge_m3_job("cf-1", 2)).await;
    world
        .enqueue(&serde_json::json!({"id": "oa-1", "model": "openai/gpt-4o-mini",
            "requests": [{"messages": [{"role": "user", "content": "hi"}]}]}))
        .await;
    let mut remote_ids = Vec::new();
    for id in ["cf-1", "oa-1"] {
        let entry = world.wait_for_result(id, std::time::Duration::from_secs(30)).await;
        remote_ids.push(entry.request_ids[0].clone());
    }
    daemon.stop().await.expect("daemon stops");

    // The CLI finds a job by its remote batch id (the provider's, as its console shows it).
    let output = world.batchd().args(["status", "--remote", &remote_ids[1], "--json"]).output().expect("status");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(status["job_id"], "oa-1");
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains(&format!("remote batch {} is chunk 0 of job oa-1", remote_ids[1]))
    );
    let output = world.batchd().args(["status", "--remote", "batch_unknown", "--json"]).output().expect("status");
    assert_eq!(output.status.code(), Some(5));
    let missing: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(missing["error"]["code"], "not_found");
    assert!(missing["error"]["message"].as_str().unwrap_or("").contains("every 2 ledgers read"), "{missing}");

    let dashboard = Dashboard::start(&world, &["--refresh-secs", "0"]).await.expect("batchd ui");
    let browser = Browser::start().await.expect("browser");
    let ns = world.keys.namespace().to_owned();
    browser.open(&dashboard.url(&format!("/jobs?ns={ns}")), "#jobs").await.expect("jobs");
    let providers = browser.all("#jobs tbody td.provider").await.expect("cells");
    let mut seen = Vec::new();
    for cell in providers {
        seen.push(cell.text().await.expect("text"));
    }
    seen.sort();
    assert_eq!(seen, ["cloudflare", "openai"]);

    // Filtered by provider, from the form.
    let field = browser.wait_for("#filters input[name=provider]").await.expect("the provider field");
    field.send_keys("openai").await.expect("type");
    browser.click("#filters button[type=submit]").await.expect("filter");
    browser.wait_for("#jobs tbody tr td.provider").await.expect("rows");
    let rows = browser.all("#jobs tbody tr").await.expect("rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(browser.text("#jobs tbody td.provider").await.expect("provider"), "openai");
    assert!(browser.text("#jobs tbody a.job-link").await.expect("id").contains("oa-1"));
    let duration = browser.text("#jobs tbody td.duration").await.expect("duration");
    assert!(duration.ends_with('s') && duration.chars().next().is_some_and(|c| c.is_ascii_digit()), "{duration}");

    // The JSON twin has both.
    let page: serde_json::Value = reqwest::get(dashboard.url(&format!("/api/jobs?ns={ns}&provider=openai")))
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let jobs = page["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["provider"], "openai");
    let took = jobs[0]["duration_ms"].as_u64().expect("a duration");
    assert_eq!(Some(took), jobs[0]["finished_at"].as_u64().zip(jobs[0]["accepted_at"].as_u64()).map(|(f, a)| f - a));

    // The dashboard finds it too: the look-up form leads to the job's page (and the JSON twin to its JSON).
    browser.open(&dashboard.url(&format!("/jobs?ns={ns}")), "#remote-lookup").await.expect("jobs");
    let field = browser.wait_for("#remote-lookup input[name=remote]").await.expect("the look-up field");
    field.send_keys(&remote_ids[0]).await.expect("type");
    browser.click("#remote-lookup button[type=submit]").await.expect("find");
    browser.wait_for("h1").await.expect("a page");
    let url = browser.client.current_url().await.expect("url");
    assert!(url.path().ends_with("/jobs/cf-1"), "{url}");
    let job: serde_json::Value = reqwest::get(dashboard.url(&format!("/api/jobs?ns={ns}&remote={}", remote_ids[1])))
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(job["job"]["job_id"], "oa-1");

    // The daemon stopped cleanly holding nothing: the overview no longer lists it among the replicas.
    browser.open(&dashboard.url(&format!("/?ns={ns}")), &format!("#cost-{ns}")).await.expect("overview");
    let mut notes = Vec::new();
    for note in browser.all("p.note").await.expect("notes") {
        notes.push(note.text().await.expect("text"));
    }
    assert!(notes.iter().any(|note| note.starts_with("No consumer in group")), "{notes:?}");
    browser.close().await;
}

/// Packs as operators see them (issue 33): a packed job's page names the pack that carried it, with a link, and the
/// pack's own page says how many jobs share its remote batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_packed_jobs_page_names_its_pack_and_the_packs_page_its_jobs() {
    let mut world = World::new().await;
    world.settings.packing.enabled = true;
    let mut pipe = redis::pipe();
    for index in 0..3 {
        let job = serde_json::json!({"id": format!("packed-{index}"), "model": "@cf/baai/bge-m3",
            "requests": [{"text": format!("t{index}")}]});
        pipe.xadd(world.keys.submit(), "*", &[("job", job.to_string())]).ignore();
    }
    let _: () = pipe.query_async(&mut world.conn.clone()).await.expect("enqueue");
    let daemon = world.daemon();
    for index in 0..3 {
        world.wait_for_result(&format!("packed-{index}"), std::time::Duration::from_secs(30)).await;
    }
    daemon.stop().await.expect("daemon stops");
    let pack = world.ledger("packed-0").await.get("c0:pack").cloned().expect("the job's pack");
    assert!(pack.starts_with("pack:"), "{pack}");

    let dashboard = Dashboard::start(&world, &["--refresh-secs", "0"]).await.expect("batchd ui");
    let browser = Browser::start().await.expect("browser");
    let ns = world.keys.namespace().to_owned();
    browser.open(&dashboard.url(&format!("/jobs/packed-0?ns={ns}")), "#pack-0").await.expect("job page");
    let named = browser.text("#pack-0").await.expect("pack row");
    assert_eq!(named, format!("packed with other jobs in {pack} (one remote batch)"));
    browser.click("#pack-0 a").await.expect("follow the pack's link");
    browser.wait_for("#pack-members").await.expect("the pack's page");
    let members = browser.text("#pack-members").await.expect("members");
    assert_eq!(members, "3 jobs (their items, in order, make this remote batch)");
    browser.close().await;
}
