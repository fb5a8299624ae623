//! The dashboard's job page after the first mistakes (issue 39), in Chromium: a completed job whose every item
//! failed is badged, not shown as a green `completed`, and a job refused before it ran offers no Retry (it cannot
//! be retried: nothing of it was stored) but says why and what to do; a waiting chunk says what it waits for.

use std::time::Duration;

use batchd_core::ResultStatus;
use batchd_emulator::Fault;
use batchd_tests::browser::{Browser, Dashboard};
use batchd_tests::{World, bge_m3_job};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn the_job_page_badges_a_job_whose_every_item_failed_and_offers_no_retry_for_a_refused_one() {
    let world = World::new().await;
    world.emulator.inject(Fault::fail_items([0, 1]));
    let daemon = world.daemon();
    let mut all_bad = bge_m3_job("ui-allbad", 2);
    all_bad["retry_failed_items"] = json!(false);
    world.enqueue(&all_bad).await;
    let entry = world.wait_for_result("ui-allbad", WAIT).await;
    assert_eq!((entry.status, entry.items_failed), (ResultStatus::Completed, 2));
    // No OpenAI is configured: refused at take-in.
    let refused = json!({"id": "ui-refused", "model": "openai/gpt-4o-mini", "requests": [{"messages": []}]});
    world.enqueue(&refused).await;
    assert_eq!(world.wait_for_result("ui-refused", WAIT).await.status, ResultStatus::Failed);

    let dashboard = Dashboard::start(&world, &["--allow-actions", "--refresh-secs", "0"]).await.expect("batchd ui");
    let browser = Browser::start().await.expect("browser");
    let ns = world.keys.namespace().to_owned();

    let badge = browser.open(&dashboard.url(&format!("/jobs/ui-allbad?ns={ns}")), "#all-items-failed").await;
    assert_eq!(badge.expect("the badge"), "every item failed");
    assert_eq!(browser.text("#job-state").await.expect("state"), "completed", "wire format v1 keeps the status");
    let state = browser.client.find(fantoccini::Locator::Css("#job-state")).await.expect("state");
    let class = state.attr("class").await.expect("class");
    assert_eq!(class.as_deref(), Some("state state-failed"), "not the green completed");

    let note = browser.open(&dashboard.url(&format!("/jobs/ui-refused?ns={ns}")), "#not-retryable").await;
    assert!(note.expect("the note").starts_with("Refused before it ran: nothing of it was stored"));
    assert_eq!(browser.text("#job-state").await.expect("state"), "failed");
    assert!(
        browser.client.find(fantoccini::Locator::Css("#retry-job")).await.is_err(),
        "no Retry where retry cannot work"
    );
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn the_job_page_says_what_a_waiting_chunk_waits_for_and_until_when() {
    let mut world = World::new().await;
    world.settings.packing.enabled = true;
    // A long packing window, so the job is still queued when the page is read.
    world.settings.packing.window_ms = 20_000;
    world.settings.packing.pause_ms = 20_000;
    let daemon = world.daemon();
    let job =
        json!({"id": "ui-packed", "model": "@cf/meta/llama-3.3-70b-instruct-fp8-fast", "requests": [{"prompt": "hi"}]});
    world.enqueue(&job).await;
    batchd_tests::wait_until("ui-packed queued for packing", WAIT, async || {
        world.ledger("ui-packed").await.get("c0:pack").map(String::as_str) == Some("queued")
    })
    .await;

    let dashboard = Dashboard::start(&world, &["--refresh-secs", "0"]).await.expect("batchd ui");
    let browser = Browser::start().await.expect("browser");
    let ns = world.keys.namespace().to_owned();
    let wait = browser.open(&dashboard.url(&format!("/jobs/ui-packed?ns={ns}")), "#wait-0").await.expect("the wait");
    assert!(
        wait.starts_with("packed: waiting for its pack (jobs sharing a remote batch); the next pack is sent at "),
        "{wait}"
    );
    assert!(wait.contains("(in "), "until when: {wait}");
    daemon.stop().await.unwrap();
}
