//! `ui-screenshots` (`make ui-screenshots`): takes the screenshots of `docs/ui.md` from a real dashboard.
//!
//! Starts a private redis-server, the emulator (batches of 1 s to 3 min, so some jobs finish and some stay in
//! flight), a daemon and `batchd ui --allow-actions`; enqueues three jobs for a model that refuses queued requests
//! (they fail), a mix of jobs and two entries that are not jobs; waits until the first results are out; then opens
//! each page in headless Chromium and writes `overview.png`, `jobs.png`, `job.png`, `job-failed.png`,
//! `failed.png`, `retry.png`, `dead.png` and `dead-entry.png` into the directory given (default `docs/ui`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use batchd_emulator::{DurationRange, EmulatorConfig};
use batchd_tests::browser::{Browser, Dashboard};
use batchd_tests::{World, bge_m3_job};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "docs/ui".to_owned()));
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let config = EmulatorConfig {
        random_durations: Some(DurationRange { min: Duration::from_secs(1), max: Duration::from_secs(180) }),
        ..EmulatorConfig::default()
    };
    let world = World::with_emulator(config).await;
    let daemon = world.daemon();
    // Failed jobs first: the model refuses queued requests while these are submitted, then accepts them again.
    world.emulator.set_unbatchable_models(["@cf/baai/bge-m3"]);
    for i in 0..3 {
        let mut job = bge_m3_job(&format!("report-{i:03}"), 4 + i * 3);
        job["metadata"] = serde_json::json!({"customer": "acme", "batch": i});
        world.enqueue(&job).await;
    }
    for i in 0..3 {
        world.wait_for_result(&format!("report-{i:03}"), Duration::from_secs(60)).await;
    }
    world.emulator.set_unbatchable_models(Vec::<String>::new());
    for i in 0..40 {
        world.enqueue(&bge_m3_job(&format!("invoice-{i:03}"), 1 + (i * 7) % 120)).await;
    }
    world.enqueue_raw(&[("job", "{\"id\":\"broken-1\",\"model\":".to_owned())]).await;
    world.enqueue_raw(&[("payload", "{\"text\":\"hello\"}".to_owned())]).await;
    world.wait_for_results(15, Duration::from_secs(120)).await;
    let ns = world.keys.namespace().to_owned();

    let dashboard = Dashboard::start(&world, &["--allow-actions", "--refresh-secs", "0"]).await?;
    let browser = Browser::start().await?;
    let finished = world.results().await;
    let done = finished
        .iter()
        .filter_map(|fields| fields.get("job_id"))
        .find(|id| id.starts_with("invoice-"))
        .context("a finished job")?
        .clone();
    let dead_id = {
        let entries: Vec<(String, std::collections::HashMap<String, String>)> = redis::cmd("XREVRANGE")
            .arg(world.keys.dead())
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut world.conn.clone())
            .await?;
        entries.first().context("a dead letter")?.0.clone()
    };
    let pages = [
        ("overview", format!("/?ns={ns}"), "#dead"),
        ("jobs", format!("/jobs?ns={ns}"), "#jobs"),
        ("job", format!("/jobs/{done}?ns={ns}"), "#chunks"),
        ("job-failed", format!("/jobs/report-002?ns={ns}"), "#job-error"),
        ("failed", format!("/failed?ns={ns}"), "#failed"),
        ("retry", format!("/retry?ns={ns}"), "#retry-summary"),
        ("dead", format!("/dead?ns={ns}&error=job"), "#dead"),
        ("dead-entry", format!("/dead/{dead_id}?ns={ns}"), "#dead-error"),
    ];
    for (name, path, ready) in pages {
        browser.open(&dashboard.url(&path), ready).await?;
        let png = browser.client.screenshot().await.context("screenshot")?;
        let file = out.join(format!("{name}.png"));
        std::fs::write(&file, png).with_context(|| format!("write {}", file.display()))?;
        println!("{}", file.display());
    }
    browser.close().await;
    daemon.stop().await
}
