//! The dashboard's operations of issue 25 in a real browser (headless Chromium through chromedriver), against a
//! real `batchd ui` process, a real redis-server, a real daemon and the emulator: the throughput chart's axes and
//! its 1 h / 24 h / 8 d switch over the per-minute and hourly counters; a job's page (metadata, request items a
//! page at a time, the error field by field, chunk states true at the end) and the failed-jobs page; retrying a
//! failed job from its page and the failed jobs a filter matched after a dry run; pausing and resuming intake and
//! purging the dead letters a filter matched, each clicked and then checked in Redis; and the "Redis unreachable"
//! page, which turns into the page asked for by itself when Redis returns.

use std::time::Duration;

use batchd_core::ResultStatus;
use batchd_tests::browser::{Browser, Dashboard, wait_for};
use batchd_tests::{World, bge_m3_job};
use fantoccini::Locator;
use redis::AsyncCommands;

const WAIT: Duration = Duration::from_secs(60);

/// Redis's clock, Unix ms (the counters are keyed by it).
async fn redis_now(world: &World) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut world.conn.clone()).await.expect("TIME");
    secs * 1000 + micros / 1000
}

/// Adds `n` to the finished-jobs counter of `status` in hash `key`, as the daemon does after a publish.
async fn count_finished(world: &World, key: &str, status: &str, n: u64) {
    let _: () = world.conn.clone().hincr(key, batchd_core::stats::finished_field(status), n).await.expect("HINCRBY");
}

/// The texts of every element `css` of the current page.
async fn texts(browser: &Browser, css: &str) -> Vec<String> {
    let mut texts = Vec::new();
    for element in browser.all(css).await.expect("elements") {
        texts.push(element.text().await.expect("text"));
    }
    texts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_has_axes_and_switches_between_the_last_hour_day_and_eight_days() {
    let world = World::new().await;
    let now = redis_now(&world).await;
    let (minute, hour) = (now / 60_000, now / 3_600_000);
    // What the daemons' counters would hold: 3 completed two minutes ago; 4 completed five hours ago; 7 failed
    // three days ago (only the hourly counters reach that far).
    count_finished(&world, &world.keys.stats_minute(minute - 2), "completed", 3).await;
    count_finished(&world, &world.keys.stats_hour(hour - 5), "completed", 4).await;
    count_finished(&world, &world.keys.stats_hour(hour - 72), "failed", 7).await;

    let dashboard = Dashboard::start(&world, &["--refresh-secs", "0"]).await.expect("batchd ui");
    let browser = Browser::start().await.expect("browser");
    let ns = world.keys.namespace().to_owned();
    let total = |status: &'static str| {
        let css = format!("#finished-{ns} [data-status={status}]");
        let browser = &browser;
        async move { browser.text(&css).await.expect("total") }
    };

    // The last hour, by minute: the jobs axis says jobs/min, the time axis has a label every 15 minutes.
    browser.open(&dashboard.url(&format!("/?ns={ns}")), &format!("#chart-{ns}[data-range='1h']")).await.expect("1h");
    assert_eq!((total("completed").await, total("failed").await), ("3".to_owned(), "0".to_owned()));
    assert_eq!(browser.text(&format!("#chart-{ns} .y-title")).await.expect("unit"), "jobs/min");
    assert_eq!(texts(&browser, &format!("#chart-{ns} .y-tick")).await, ["0", "5"], "0 to the round number above 3");
    let minutes = texts(&browser, &format!("#chart-{ns} .x-tick")).await;
    assert!((4..=5).contains(&minutes.len()), "a label every 15 minutes: {minutes:?}");
    assert!(minutes.iter().all(|label| label.len() == 5 && label.ends_with(['0', '5'])), "HH:MM: {minutes:?}");
    assert_eq!(browser.text(&format!("#chart-{ns} .x-title")).await.expect("time axis"), "time (UTC)");
    assert_eq!(browser.all(&format!("#chart-{ns} rect.status-completed")).await.expect("bars").len(), 1);

    // 24 hours, by hour: clicked on the switch.
    browser.click(&format!("#range-{ns} a[data-range='24h']")).await.expect("24h");
    browser.wait_for(&format!("#chart-{ns}[data-range='24h']")).await.expect("the 24 h chart");
    assert_eq!((total("completed").await, total("failed").await), ("4".to_owned(), "0".to_owned()));
    assert_eq!(browser.text(&format!("#chart-{ns} .y-title")).await.expect("unit"), "jobs/h");
    let hours = texts(&browser, &format!("#chart-{ns} .x-tick")).await;
    assert!(!hours.is_empty() && hours.iter().all(|label| label.ends_with(":00")), "every 6 hours: {hours:?}");
    assert_eq!(browser.text(&format!("#range-{ns} strong")).await.expect("current"), "24h");

    // Eight days, by hour: the failures of three days ago appear; the scale rounds 7 up to 10.
    browser.click(&format!("#range-{ns} a[data-range='8d']")).await.expect("8d");
    browser.wait_for(&format!("#chart-{ns}[data-range='8d']")).await.expect("the 8 d chart");
    assert_eq!((total("completed").await, total("failed").await), ("4".to_owned(), "7".to_owned()));
    assert_eq!(texts(&browser, &format!("#chart-{ns} .y-tick")).await, ["0", "5", "10"]);
    let days = texts(&browser, &format!("#chart-{ns} .x-tick")).await;
    assert!((7..=8).contains(&days.len()), "a label a day: {days:?}");
    assert!(days.iter().all(|label| label.len() == 5 && label.as_bytes()[2] == b'-'), "MM-DD: {days:?}");

    // The JSON twin has the same buckets.
    let overview: serde_json::Value = reqwest::get(dashboard.url(&format!("/api/overview?ns={ns}&range=8d")))
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let finished = &overview["namespaces"][0]["finished"];
    assert_eq!((finished["range"].as_str(), finished["bucket_ms"].as_u64()), (Some("8d"), Some(3_600_000)));
    let buckets = finished["buckets"].as_array().expect("buckets");
    assert_eq!(buckets.len(), 192);
    assert_eq!(buckets.iter().map(|bucket| bucket["failed"].as_u64().unwrap_or(0)).sum::<u64>(), 7);
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_jobs_are_listed_by_code_and_model_and_a_failed_jobs_page_shows_items_error_fields_and_true_chunks() {
    let world = World::new().await;
    // The model refuses queued requests: the job fails at its first submit (no remote batch was made).
    world.emulator.set_unbatchable_models(["@cf/baai/bge-m3"]);
    // Without the model catalog (which would refuse the model at take-in), the API's 8007 is what says so.
    let mut settings = world.settings.clone();
    settings.cloudflare.catalog_refresh_secs = 0;
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    let mut job = bge_m3_job("ops-refused", 60);
    job["metadata"] = serde_json::json!({"ticket": "OPS-7", "owner": "<b>team</b>"});
    world.enqueue(&job).await;
    world.enqueue(&bge_m3_job("ops-refused-2", 1)).await;
    for id in ["ops-refused", "ops-refused-2"] {
        assert_eq!(world.wait_for_result(id, WAIT).await.status, ResultStatus::Failed);
    }

    let dashboard = Dashboard::start(&world, &["--refresh-secs", "0"]).await.expect("batchd ui");
    let browser = Browser::start().await.expect("browser");
    let ns = world.keys.namespace().to_owned();
    browser.open(&dashboard.url(&format!("/jobs/ops-refused?ns={ns}")), "#job-state").await.expect("job page");
    assert_eq!(browser.text("#job-state").await.expect("state"), "failed");
    // The error, one row per field, as the ledger holds it.
    let field = |name: &'static str| {
        let browser = &browser;
        async move { browser.text(&format!("#job-error tr[data-field={name}] td")).await.expect(name) }
    };
    assert_eq!(field("code").await, "model_not_batchable");
    assert_eq!(field("api_code").await, "8007");
    assert_eq!(field("http_status").await, "400");
    assert!(field("message").await.contains("does not support batch requests"));
    // The producer's metadata, shown as text.
    let metadata = browser.text("#job-metadata").await.expect("metadata");
    assert!(metadata.contains("ticket OPS-7") && metadata.contains("owner <b>team</b>"), "{metadata}");
    // The chunk: the API refused its submit and the job failed at once, so the ledger's chunk still says
    // `submitting`; the page says what is true now, not that stale value.
    assert_eq!(world.ledger("ops-refused").await["c0:state"], "submitting", "the ledger's last written value");
    assert_eq!(
        browser.text("#chunks .chunk-state").await.expect("chunk state"),
        "failed with the job (was submitting)"
    );
    assert_eq!(
        browser.text("#chunks .chunk-remote").await.expect("remote"),
        "none recorded (the job ended during its submit)"
    );
    // The request items, a page of their own (the job's page reads none), 50 a page, read back from the ledger.
    browser.click("#items-link").await.expect("request items");
    browser.wait_for("#items").await.expect("the items page");
    let rows = browser.all("#items tbody tr").await.expect("items");
    assert_eq!(rows.len(), 50);
    assert!(rows[0].text().await.expect("row").contains("question 0"));
    browser.click("#next-items").await.expect("next page of items");
    wait_for(WAIT, "the second page of items", || async {
        let rows = browser.all("#items tbody tr").await.ok()?;
        (rows.len() == 10).then_some(rows)
    })
    .await;
    assert!(browser.text("#items").await.expect("items").contains("question 59"));
    // The JSON twin carries the same.
    let api = |path: String| {
        let url = dashboard.url(&path);
        async move { reqwest::get(url).await.expect("get").json::<serde_json::Value>().await.expect("json") }
    };
    let value = api(format!("/api/jobs/ops-refused?ns={ns}")).await;
    assert_eq!(value["chunks"][0]["state"], "failed with the job (was submitting)");
    assert!(value.get("requests").is_none(), "the job's page reads no request item");
    let items = api(format!("/api/jobs/ops-refused/items?ns={ns}&page=1")).await;
    assert_eq!(items["requests"]["total"], 60);
    assert_eq!(items["requests"]["items"][0]["index"], 50);

    // The failed-jobs page: one group (the code and the model) of two, the newest examples linking to their jobs.
    browser.click("header nav a[href^='/failed']").await.expect("failed jobs link");
    let group = "#failed tr.group[data-code=model_not_batchable][data-model='@cf/baai/bge-m3']";
    assert_eq!(browser.text(&format!("{group} a.count")).await.expect("count"), "2");
    assert_eq!(browser.text("#failed-total").await.expect("total"), "2");
    let examples = texts(&browser, &format!("{group} .example a.job-link")).await;
    assert_eq!(examples.len(), 2, "{examples:?}");
    assert!(examples.contains(&"ops-refused".to_owned()) && examples.contains(&"ops-refused-2".to_owned()));
    // A filter that matches nothing; the JSON twin of a filter on the code.
    browser.open(&dashboard.url(&format!("/failed?ns={ns}&state=cancelled")), "#failed-total").await.expect("filtered");
    assert_eq!(browser.text("#failed-total").await.expect("total"), "0");
    let report: serde_json::Value =
        reqwest::get(dashboard.url(&format!("/api/failed?ns={ns}&code=model_not_batchable")))
            .await
            .expect("get")
            .json()
            .await
            .expect("json");
    assert_eq!((report["total"].as_u64(), report["groups"][0]["count"].as_u64()), (Some(2), Some(2)));
    assert_eq!(report["groups"][0]["examples"][0]["error"]["http_status"], 400);
    browser.close().await;
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_actions_a_failed_job_is_retried_from_its_page_and_the_matching_ones_after_a_dry_run() {
    let world = World::new().await;
    // Three jobs fail (the model refuses queued requests), then the model accepts them again: retries complete.
    world.emulator.set_unbatchable_models(["@cf/baai/bge-m3"]);
    // Without the model catalog (which would refuse the model at take-in), the jobs fail at the API's 8007, with
    // their items in their ledgers.
    let mut settings = world.settings.clone();
    settings.cloudflare.catalog_refresh_secs = 0;
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    for (id, n) in [("rt-a", 2), ("rt-b", 3), ("rt-c", 1)] {
        world.enqueue(&bge_m3_job(id, n)).await;
    }
    for id in ["rt-a", "rt-b", "rt-c"] {
        assert_eq!(world.wait_for_result(id, WAIT).await.status, ResultStatus::Failed);
    }
    world.emulator.set_unbatchable_models(Vec::<String>::new());
    let dashboard = Dashboard::start(&world, &["--allow-actions", "--refresh-secs", "0"]).await.expect("batchd ui");
    let browser = Browser::start().await.expect("browser");
    let ns = world.keys.namespace().to_owned();

    // One job, from its page: its retry runs as rt-a.retry-1 with the same items, and completes.
    browser.open(&dashboard.url(&format!("/jobs/rt-a?ns={ns}")), "#retry-job").await.expect("job page");
    assert_eq!(browser.text("#retry-link").await.expect("retry link"), "rt-a.retry-1");
    browser.click("#retry-job").await.expect("retry");
    browser.client.accept_alert().await.expect("confirm the retry");
    browser.text("#notice[data-notice=job-retried]").await.expect("notice");
    let retried = world.wait_for_result("rt-a.retry-1", WAIT).await;
    assert_eq!(retried.status, ResultStatus::Completed);
    assert_eq!(world.ledger("rt-a.retry-1").await["n_items"], "2", "the same items, rebuilt from the ledger");
    // Again: its retry exists, nothing more is enqueued.
    browser.open(&dashboard.url(&format!("/jobs/rt-a?ns={ns}")), "#retry-job").await.expect("job page");
    browser.click("#retry-job").await.expect("retry again");
    browser.client.accept_alert().await.expect("confirm");
    browser.text("#notice[data-notice=already-retried]").await.expect("notice");

    // The rest, from the failed-jobs page: a dry run first (nothing enqueued), then the confirm step.
    browser.open(&dashboard.url(&format!("/failed?ns={ns}")), "#retry-matching").await.expect("failed jobs");
    browser.click("#retry-matching").await.expect("dry run");
    assert_eq!(browser.text("#would-retry").await.expect("would retry"), "2");
    assert_eq!(browser.text("#already-retried").await.expect("already"), "1");
    assert_eq!(browser.text("#not-retryable").await.expect("not retryable"), "0");
    let outcomes = texts(&browser, "#retry-plan tbody tr[data-outcome=would_retry] a.job-link").await;
    assert_eq!(outcomes.len(), 2, "{outcomes:?}");
    for id in ["rt-b.retry-1", "rt-c.retry-1"] {
        assert!(world.ledger(id).await.is_empty(), "the dry run enqueued nothing ({id})");
    }
    assert_eq!(browser.text("#confirm-retry").await.expect("confirm button"), "Retry these 2 jobs");
    browser.click("#confirm-retry").await.expect("confirm");
    browser.client.accept_alert().await.expect("confirm the retries");
    browser.text("#notice[data-notice=retries-enqueued]").await.expect("notice");
    for id in ["rt-b.retry-1", "rt-c.retry-1"] {
        assert_eq!(world.wait_for_result(id, WAIT).await.status, ResultStatus::Completed, "{id}");
    }
    let log = dashboard.log();
    let actions: Vec<&str> = log.lines().filter(|line| line.contains("dashboard action")).collect();
    assert_eq!(actions.len(), 3, "retry, retry again, retry matching: {log}");
    assert!(actions[2].contains("retry matching") && actions[2].contains("retried=2"), "{}", actions[2]);
    browser.close().await;
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_actions_intake_is_paused_and_resumed_and_the_matching_dead_letters_are_purged() {
    let world = World::new().await;
    let daemon = world.daemon();
    // Three dead letters: two without a `job` field, one whose job is not JSON.
    world.enqueue_raw(&[("payload", "x".to_owned())]).await;
    world.enqueue_raw(&[("jbo", "{}".to_owned())]).await;
    world.enqueue_raw(&[("job", "{not json".to_owned())]).await;
    wait_for(WAIT, "three dead letters", || async {
        (world.stream(&world.keys.dead()).await.len() == 3).then_some(())
    })
    .await;

    let dashboard = Dashboard::start(&world, &["--allow-actions", "--refresh-secs", "0"]).await.expect("batchd ui");
    let browser = Browser::start().await.expect("browser");
    let ns = world.keys.namespace().to_owned();
    let paused_key = world.keys.paused();
    let paused = || {
        let mut conn = world.conn.clone();
        let key = paused_key.clone();
        async move { conn.get::<_, Option<String>>(&key).await.expect("GET the pause flag") }
    };

    // Pause from the overview (the browser asks first), with a reason; the flag is what `batchd pause` writes.
    browser.open(&dashboard.url(&format!("/?ns={ns}")), &format!("#pause-{ns}")).await.expect("overview");
    let reason = browser.wait_for(&format!("#ns-{ns} input[name=reason]")).await.expect("reason field");
    reason.send_keys("deploy freeze").await.expect("type the reason");
    browser.click(&format!("#pause-{ns}")).await.expect("pause");
    browser.client.accept_alert().await.expect("confirm the pause");
    assert_eq!(
        browser.text("#notice[data-notice=intake-paused]").await.expect("notice"),
        "Intake paused: replicas stop reading the submit stream and finish the jobs they have."
    );
    let record: serde_json::Value = serde_json::from_str(&paused().await.expect("paused")).expect("a pause record");
    assert_eq!((record["by"].as_str(), record["reason"].as_str()), (Some("dashboard (-)"), Some("deploy freeze")));
    assert!(browser.text(&format!("#paused-{ns}")).await.expect("banner").contains("deploy freeze"));
    // `batchd stats` reads the same flag.
    let stats = world.batchd().args(["stats", "--json"]).output().expect("stats");
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    assert_eq!(stats["paused"]["by"], "dashboard (-)");

    // Resume.
    browser.click(&format!("#resume-{ns}")).await.expect("resume");
    browser.text("#notice[data-notice=intake-resumed]").await.expect("notice");
    assert_eq!(paused().await, None, "the pause flag is gone");
    browser.wait_for(&format!("#pause-{ns}")).await.expect("the pause button is back");

    // Dead letters: filter by the error's text, then purge exactly what the filter listed.
    browser.open(&dashboard.url(&format!("/dead?ns={ns}")), "#dead-filters").await.expect("dead letters");
    let error = browser.wait_for("#dead-filters input[name=error]").await.expect("error filter");
    error.send_keys("HAS NO `job`").await.expect("type the filter");
    browser.click("#dead-filters button").await.expect("filter");
    assert_eq!(browser.text("#dead-matching").await.expect("matching"), "2");
    assert_eq!(browser.all("#dead tbody tr").await.expect("rows").len(), 2);
    browser.click("#purge-matching").await.expect("purge");
    browser.client.accept_alert().await.expect("confirm the purge");
    browser.text("#notice[data-notice=dead-purged-matching]").await.expect("notice");
    let left = world.stream(&world.keys.dead()).await;
    assert_eq!(left.len(), 1, "only the entry the filter did not match is left");
    assert!(left[0]["error"].contains("not valid JSON"), "{:?}", left[0]);

    let log = dashboard.log();
    let actions: Vec<&str> = log.lines().filter(|line| line.contains("dashboard action")).collect();
    assert_eq!(actions.len(), 3, "pause, resume, purge: {log}");
    assert!(actions[2].contains("dead purge") && actions[2].contains("purged=2"), "{}", actions[2]);
    browser.close().await;
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_unreachable_page_turns_into_the_page_by_itself_when_redis_returns() {
    let mut world = World::new().await;
    world.redis.kill();
    let dashboard = Dashboard::start(&world, &["--refresh-secs", "0"]).await.expect("batchd ui");
    let browser = Browser::start().await.expect("browser");
    let ns = world.keys.namespace().to_owned();
    let heading = browser.open(&dashboard.url(&format!("/jobs?ns={ns}")), "#unavailable").await.expect("page");
    assert_eq!(heading, "Redis unreachable");
    world.redis.restart().await;
    // Nobody clicks: the page tries again by itself and shows the jobs list once Redis answers.
    wait_for(WAIT, "the jobs page", || async { browser.client.find(Locator::Css("#filters")).await.ok() }).await;
    assert!(browser.all("#unavailable").await.expect("elements").is_empty());
    browser.close().await;
}
