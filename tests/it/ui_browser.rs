//! The dashboard (`batchd ui`) in a real browser: headless Chromium through chromedriver, a real `batchd ui`
//! process, a real redis-server filled by a real daemon and the emulator. The tests look at what a person would
//! see (job ids, states, counts, error messages), click from the overview to a job, check that every page's JSON
//! twin has the CLI's `--json` shape, and act: without `--allow-actions` the buttons are absent and the endpoints
//! refuse; with it, a dead letter is retried (a double click sends one request: the button is disabled) and a job
//! cancelled, and the effect is checked in Redis. With `--auth-token-file` the browser logs in with basic auth and
//! the page refreshes itself as before.

use std::time::Duration;

use batchd_core::{JobId, ResultStatus};
use batchd_emulator::EmulatorConfig;
use batchd_tests::browser::{Browser, Dashboard, wait_for};
use batchd_tests::{World, bge_m3_job};
use redis::AsyncCommands;

const WAIT: Duration = Duration::from_secs(60);

/// Runs the `batchd` CLI with the world's settings and parses its JSON output.
fn cli_json(world: &World, args: &[&str]) -> serde_json::Value {
    let output = world.batchd().args(args).output().expect("run batchd");
    assert!(output.status.success(), "batchd {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("JSON output")
}

/// The object keys of a JSON value, sorted (the shape, not the values).
fn shape(value: &serde_json::Value) -> Vec<String> {
    let mut keys: Vec<String> = value.as_object().expect("an object").keys().cloned().collect();
    keys.sort();
    keys
}

/// A dead letter as a person meets it: an entry whose take-in fails every time (a key of the wrong type where the
/// job's ledger goes), moved to the dead-letter stream after `ingress.max_deliveries`. Returns its entry id.
async fn poison_dead_letter(world: &World, job_id: &str) -> String {
    let poisoned = world.keys.job(&JobId::parse(job_id).expect("job id"));
    let _: () = world.conn.clone().set(&poisoned, "not a ledger").await.expect("redis");
    let source = world.enqueue(&bge_m3_job(job_id, 2)).await;
    wait_for(WAIT, "the dead letter", || async {
        let entries = world.entries(&world.keys.dead()).await;
        entries.into_iter().find(|(_, fields)| fields.get("source_id") == Some(&source)).map(|(id, _)| id)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_what_the_daemon_did_and_is_read_only_without_the_flag() {
    let world = World::new().await;
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("ui-alpha", 3)).await;
    world.enqueue(&bge_m3_job("ui-beta", 60)).await;
    // An entry that is not a job: a failed result and a dead letter whose fields try to script the page.
    world.enqueue_raw(&[("bogus", "<script>document.title='pwned'</script>\u{202e}evil".to_owned())]).await;
    world.wait_for_results(3, WAIT).await;
    assert_eq!(world.wait_for_result("ui-alpha", WAIT).await.status, ResultStatus::Completed);

    let dashboard = Dashboard::start(&world, &["--refresh-secs", "1"]).await.expect("batchd ui");
    let browser = Browser::start().await.expect("browser");
    let ns = world.keys.namespace().to_owned();

    // Overview: the counts a person reads.
    let dead = browser.open(&dashboard.url(&format!("/?ns={ns}")), "#dead").await.expect("overview");
    assert_eq!(dead, "1", "one dead letter");
    let completed = browser.text(&format!("#finished-{ns} [data-status=completed]")).await.expect("finished");
    assert_eq!(completed, "2");
    let failed = browser.text(&format!("#finished-{ns} [data-status=failed]")).await.expect("finished");
    assert_eq!(failed, "1", "the rejected entry's failed result");
    let consumers = browser.text(&format!("#ns-{ns} table.consumers")).await.expect("consumers");
    assert!(consumers.contains("consumer") && consumers.lines().count() >= 2, "a replica is listed: {consumers}");
    assert_eq!(browser.text("#mode").await.expect("mode"), "read-only");

    // It refreshes itself without a reload: a new job's completion shows up in the page that is open.
    world.enqueue(&bge_m3_job("ui-gamma", 1)).await;
    world.wait_for_result("ui-gamma", WAIT).await;
    wait_for(WAIT, "the overview to refresh itself", || async {
        let text = browser.text(&format!("#finished-{ns} [data-status=completed]")).await.ok()?;
        (text == "3").then_some(())
    })
    .await;
    assert!(
        browser.client.find(fantoccini::Locator::Css("body[data-refreshed]")).await.is_ok(),
        "the content was replaced in place, not by navigating"
    );

    // Overview → Jobs → a job's detail, by clicking.
    browser.click("header nav a[href^='/jobs']").await.expect("jobs link");
    let table = browser.text("#jobs").await.expect("jobs table");
    for id in ["ui-alpha", "ui-beta", "ui-gamma"] {
        assert!(table.contains(id), "{id} listed: {table}");
    }
    browser.click("#jobs a.job-link[href^='/jobs/ui-beta']").await.expect("job link");
    assert_eq!(browser.text("#job-id").await.expect("job id"), "ui-beta");
    assert_eq!(browser.text("#job-state").await.expect("state"), "completed");
    let chunks = browser.text("#chunks").await.expect("chunks");
    assert!(chunks.contains("done") && chunks.contains("0:60"), "{chunks}");
    assert_eq!(browser.all("#responses tbody tr").await.expect("rows").len(), 50, "responses are paged by 50");
    browser.click("#next-responses").await.expect("next page of responses");
    wait_for(WAIT, "the second page of responses", || async {
        (browser.all("#responses tbody tr").await.ok()?.len() == 10).then_some(())
    })
    .await;
    assert!(browser.text("#timeline").await.expect("timeline").contains("finished completed"));

    // Filters: by state.
    browser.open(&dashboard.url(&format!("/jobs?ns={ns}&state=failed")), "#jobs").await.expect("filtered");
    assert_eq!(browser.all("#jobs tbody tr").await.expect("rows").len(), 1, "only the rejected entry failed");

    // Dead letters: the error as the daemon wrote it, the producer's text shown, never run; no action buttons.
    let list = browser.open(&dashboard.url(&format!("/dead?ns={ns}")), "#dead").await.expect("dead letters");
    assert!(list.contains("entry has no `job` field"), "{list}");
    assert!(browser.all("form.action").await.expect("forms").is_empty(), "no action buttons when read-only");
    browser.click("#dead tbody a").await.expect("dead letter link");
    let field = browser.text("pre.field").await.expect("field");
    assert_eq!(field, "<script>document.title='pwned'</script>\\u{202e}evil", "shown as text, bidi made visible");
    assert!(browser.client.title().await.expect("title").starts_with("batchd"), "the script did not run");
    assert!(browser.all("form.action").await.expect("forms").is_empty());

    // Without --allow-actions the endpoints refuse, whatever the request carries.
    let dead_ids = world.entries(&world.keys.dead()).await;
    let http = reqwest::Client::new();
    for path in [
        format!("/dead/{}/retry", dead_ids[0].0),
        format!("/dead/{}/purge", dead_ids[0].0),
        "/jobs/ui-alpha/cancel".to_owned(),
    ] {
        let response = http
            .post(dashboard.url(&path))
            .header("Origin", format!("http://{}", dashboard.addr))
            .header("Cookie", "batchd_ui_session=0123456789abcdef0123456789abcdef")
            .form(&[("token", "0123456789abcdef0123456789abcdef"), ("ns", ns.as_str())])
            .send()
            .await
            .expect("post");
        assert_eq!(response.status(), 403, "{path}");
    }
    assert_eq!(world.stream(&world.keys.dead()).await.len(), 1, "nothing was deleted");

    // Every page's JSON twin has the CLI's --json shape.
    let api = |path: &str| {
        let http = http.clone();
        let url = dashboard.url(path);
        async move { http.get(url).send().await.expect("get").json::<serde_json::Value>().await.expect("json") }
    };
    let jobs_api = api(&format!("/api/jobs?ns={ns}")).await;
    let jobs_cli = cli_json(&world, &["jobs", "--json"]);
    assert_eq!(shape(&jobs_api), shape(&jobs_cli));
    assert_eq!(shape(&jobs_api["jobs"][0]), shape(&jobs_cli["jobs"][0]));
    let mut api_ids: Vec<&str> =
        jobs_api["jobs"].as_array().expect("jobs").iter().filter_map(|j| j["job_id"].as_str()).collect();
    let mut cli_ids: Vec<&str> =
        jobs_cli["jobs"].as_array().expect("jobs").iter().filter_map(|j| j["job_id"].as_str()).collect();
    api_ids.sort();
    cli_ids.sort();
    assert_eq!(api_ids, cli_ids);
    let overview = api("/api/overview").await;
    let stats_cli = cli_json(&world, &["stats", "--json"]);
    assert_eq!(shape(&overview["namespaces"][0]["stats"]), shape(&stats_cli));
    assert_eq!(overview["namespaces"][0]["stats"]["dead"], stats_cli["dead"]);
    assert_eq!(shape(&overview["namespaces"][0]["workers"]), shape(&cli_json(&world, &["workers", "--json"])));
    let job_api = api(&format!("/api/jobs/ui-alpha?ns={ns}")).await;
    assert_eq!(job_api["job"], cli_json(&world, &["status", "ui-alpha", "--json"]));
    let dead_api = api(&format!("/api/dead?ns={ns}")).await;
    assert_eq!(dead_api["entries"], cli_json(&world, &["dead", "list", "--json"]));
    let dead_one = api(&format!("/api/dead/{}?ns={ns}", dead_ids[0].0)).await;
    assert_eq!(dead_one, cli_json(&world, &["dead", "show", &dead_ids[0].0, "--json"]));
    // The page itself answers JSON when asked.
    let negotiated: serde_json::Value = http
        .get(dashboard.url(&format!("/jobs/ui-alpha?ns={ns}")))
        .header("Accept", "application/json")
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(negotiated["job"], job_api["job"]);

    browser.close().await;
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_actions_allowed_a_dead_letter_is_retried_and_a_job_cancelled_from_the_browser() {
    // Batches stay queued for a minute, so a job is still running when it is cancelled.
    let mut world =
        World::with_emulator(EmulatorConfig { queued_for: Duration::from_secs(60), ..EmulatorConfig::default() }).await;
    world.settings.ingress.max_deliveries = 2;
    world.settings.ingress.reclaim_idle_secs = 1;
    world.settings.ingress.reclaim_interval_secs = 1;
    let daemon = world.daemon();
    let dead_id = poison_dead_letter(&world, "ui-poison").await;
    world.enqueue(&bge_m3_job("ui-long", 2)).await;
    wait_for(WAIT, "ui-long to be submitted", || async {
        let ledger = world.ledger("ui-long").await;
        (ledger.get("c0:state").map(String::as_str) == Some("polling")).then_some(())
    })
    .await;

    let dashboard = Dashboard::start(&world, &["--allow-actions", "--refresh-secs", "0"]).await.expect("batchd ui");
    let browser = Browser::start().await.expect("browser");
    let ns = world.keys.namespace().to_owned();
    assert_eq!(browser.open(&dashboard.url(&format!("/?ns={ns}")), "#mode").await.expect("mode"), "actions allowed");

    // A forged request (no same-origin header, or a token that is not the session's) is refused.
    let http = reqwest::Client::new();
    let forged = [
        (None, "0123456789abcdef0123456789abcdef"),
        (Some("http://evil.example".to_owned()), "0123456789abcdef0123456789abcdef"),
        (Some(format!("http://{}", dashboard.addr)), "not-the-session-token-000000000"),
    ];
    for (origin, token) in forged {
        let mut request = http
            .post(dashboard.url(&format!("/dead/{dead_id}/purge")))
            .header("Cookie", "batchd_ui_session=0123456789abcdef0123456789abcdef")
            .form(&[("token", token), ("ns", ns.as_str())]);
        if let Some(origin) = &origin {
            request = request.header("Origin", origin);
        }
        assert_eq!(request.send().await.expect("post").status(), 403, "origin {origin:?}, token {token}");
    }
    assert_eq!(world.stream(&world.keys.dead()).await.len(), 1, "the forged purge deleted nothing");

    // The operator fixes the cause, then retries the dead letter from its page.
    let _: () = world.conn.clone().del(world.keys.job(&JobId::parse("ui-poison").expect("id"))).await.expect("redis");
    let error = browser.open(&dashboard.url(&format!("/dead/{dead_id}?ns={ns}")), "#dead-error").await.expect("dead");
    assert_eq!(error, "too many delivery attempts");
    // An impatient double click: the first submits the form and disables the button, so the second does nothing.
    let disabled = browser
        .client
        .execute("var b = document.getElementById('retry'); b.click(); b.click(); return b.disabled;", Vec::new())
        .await
        .expect("double click");
    assert_eq!(disabled, serde_json::Value::Bool(true), "the button is disabled once its form is submitted");
    let notice = browser.text("#notice[data-notice=dead-requeued]").await.expect("notice");
    assert_eq!(notice, "The dead-letter entry was put back on the submit stream.");
    assert!(
        !browser.client.current_url().await.expect("url").as_str().contains(&dead_id),
        "the notice is a code: nothing from the action is in the URL"
    );
    assert!(world.stream(&world.keys.dead()).await.is_empty(), "the dead letter left the dead-letter stream");
    // And the daemon takes the job in (its batches then stay queued, like every batch of this test).
    wait_for(WAIT, "ui-poison to be taken in", || async {
        let ledger = world.ledger("ui-poison").await;
        (ledger.get("c0:state").map(String::as_str) == Some("polling")).then_some(())
    })
    .await;

    // Cancel the running job from its page (the browser asks first; the test accepts).
    browser.open(&dashboard.url(&format!("/jobs/ui-long?ns={ns}")), "#job-state").await.expect("job page");
    browser.click("#cancel-job").await.expect("cancel");
    browser.client.accept_alert().await.expect("confirm the cancel");
    let notice = browser.text("#notice[data-notice=cancel-requested]").await.expect("notice");
    assert_eq!(notice, "Cancellation of this job requested.");
    assert_eq!(world.wait_for_result("ui-long", WAIT).await.status, ResultStatus::Cancelled);
    assert_eq!(world.ledger("ui-long").await["state"], "cancelled");
    wait_for(WAIT, "the page to show the cancelled job", || async {
        browser.client.refresh().await.ok()?;
        let state = browser.text("#job-state").await.ok()?;
        (state == "cancelled").then_some(())
    })
    .await;
    assert!(browser.all("#cancel-job").await.expect("buttons").is_empty(), "a finished job offers no cancel");

    // Every action is logged with what it did; the refused ones did nothing and are not.
    let log = dashboard.log();
    let actions: Vec<&str> = log.lines().filter(|line| line.contains("dashboard action")).collect();
    assert_eq!(actions.len(), 2, "{log}");
    assert!(actions[0].contains("dead retry") && actions[0].contains(&dead_id), "{}", actions[0]);
    assert!(actions[1].contains("cancel") && actions[1].contains("ui-long"), "{}", actions[1]);

    browser.close().await;
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_the_browser_logs_in_with_basic_auth_and_the_page_refreshes_itself() {
    let world = World::new().await;
    let dir = std::env::temp_dir().join(format!("batchd-ui-browser-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    let token_file = dir.join("token");
    std::fs::write(&token_file, "browser-token-0123456789\n").expect("token file");
    let dashboard =
        Dashboard::start(&world, &["--refresh-secs", "1", "--auth-token-file", token_file.to_str().expect("path")])
            .await
            .expect("batchd ui");
    let ns = world.keys.namespace().to_owned();
    let http = reqwest::Client::new();
    let refused = http.get(dashboard.url("/")).send().await.expect("get");
    assert_eq!(refused.status(), 401, "no page without the token");
    assert!(refused.headers().get("www-authenticate").is_some(), "a browser is asked for it");

    // What a person types into the browser's login prompt, given in the URL (Chromium takes it as the prompt's).
    let browser = Browser::start().await.expect("browser");
    let url = format!("http://ops:browser-token-0123456789@{}/?ns={ns}", dashboard.addr);
    assert_eq!(browser.open(&url, "#mode").await.expect("overview"), "read-only");
    assert_eq!(browser.text("#dead").await.expect("dead letters"), "0");
    // The stylesheet loaded with the same credentials, and the refresh fetches the page with them.
    wait_for(WAIT, "the overview to refresh itself", || async {
        browser.client.find(fantoccini::Locator::Css("body[data-refreshed]")).await.ok().map(|_| ())
    })
    .await;
    let margin =
        browser.client.execute("return getComputedStyle(document.body).marginTop;", Vec::new()).await.expect("style");
    assert_eq!(margin, serde_json::Value::String("0px".to_owned()), "the stylesheet applies (a browser's is 8px)");
    browser.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
