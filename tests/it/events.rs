//! Batch events through a Cloudflare Queue pull consumer, end to end: the emulator publishes Workers AI batch
//! events to its queue, daemons pull them and wake the finished batch's poll. Events only wake; the poll decides,
//! so lost, duplicated, unknown or redelivered events change nothing but latency.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use batchd_core::ResultStatus;
use batchd_emulator::{Calls, EmulatorConfig, EventFaults, EventsConfig, Fault};
use batchd_tests::{World, bge_m3_job, binary};

const QUEUE: &str = "batchd-events";

/// Batches that take about `duration`, with events on.
fn with_events(duration: Duration) -> EmulatorConfig {
    EmulatorConfig {
        queued_for: duration / 4,
        running_for: duration - duration / 4,
        events: Some(EventsConfig::queue(QUEUE)),
        ..EmulatorConfig::default()
    }
}

/// The world's settings with events on and the fallback poll every `fallback`.
fn settings_with_events(world: &World, fallback: Duration) -> batchd::settings::Settings {
    let mut settings = world.settings.clone();
    settings.events.queue_id = QUEUE.to_owned();
    settings.events.max_idle_ms = 200;
    settings.events.visibility_timeout_ms = 2000;
    settings.poll.max_interval_ms_with_events = fallback.as_millis() as u64;
    settings
}

/// Waits until `condition` holds, failing after `timeout` with `what`.
async fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 34: only Workers AI sends events. With `[events]` configured, an OpenAI or Anthropic batch is polled on
/// the usual schedule, not put off to the events' 10-minute fallback that no event would cut short.
#[tokio::test]
async fn with_events_configured_openai_and_anthropic_batches_are_polled_on_the_usual_schedule() {
    let world = World::with_emulator(with_events(Duration::from_millis(1500))).await;
    let mut settings = settings_with_events(&world, Duration::from_secs(600));
    batchd_tests::with_openai(&mut settings, &world.emulator);
    batchd_tests::with_anthropic(&mut settings, &world.emulator);
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    let chat = serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
    for (id, model) in [("evented-openai", "openai/gpt-4o-mini"), ("evented-anthropic", "anthropic/claude-sonnet-4-5")]
    {
        world.enqueue(&serde_json::json!({"id": id, "model": model, "requests": [chat.clone()]})).await;
    }
    for id in ["evented-openai", "evented-anthropic"] {
        let result = world.wait_for_result(id, Duration::from_secs(30)).await;
        assert_eq!(result.status, ResultStatus::Completed, "{id}: {:?}", result.error);
        let took = result.finished_at - result.accepted_at;
        assert!(took < 10_000, "{id} published {took} ms after acceptance, not after the 10-minute fallback");
    }
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_job_completes_through_its_event_while_the_fallback_poll_is_10_minutes_away() {
    let world = World::with_emulator(with_events(Duration::from_millis(1500))).await;
    let daemon = batchd_tests::Daemon::start(settings_with_events(&world, Duration::from_secs(600)), &world.emulator);
    world.enqueue(&bge_m3_job("evented", 2)).await;

    let result = world.wait_for_result("evented", Duration::from_secs(30)).await;
    assert_eq!(result.status, ResultStatus::Completed);
    assert_eq!(world.emulator.polls().len(), 1, "one poll, right after the succeeded event");
    let took = result.finished_at - result.accepted_at;
    assert!(took < 10_000, "published {took} ms after acceptance, not after the 10-minute fallback");
    let stats = world.emulator.queue_stats();
    assert_eq!(stats.published.succeeded, 1);
    wait_until(Duration::from_secs(10), "every event acknowledged", || world.emulator.queue_stats().backlog == 0).await;
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn without_events_the_same_job_is_found_by_polling() {
    let world = World::with_emulator(with_events(Duration::from_millis(1500))).await;
    let daemon = world.daemon(); // events off: polls every 100-300 ms in tests
    world.enqueue(&bge_m3_job("polled", 2)).await;
    let result = world.wait_for_result("polled", Duration::from_secs(30)).await;
    assert_eq!(result.status, ResultStatus::Completed);
    assert!(world.emulator.polls().len() > 2, "several polls while the batch ran");
    assert_eq!(world.emulator.queue_stats().pulls, 0, "nothing pulls the queue");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn lost_events_end_in_a_result_through_the_fallback_poll() {
    let mut config = with_events(Duration::from_millis(500));
    // Every event of the job's batch is lost (queued and succeeded).
    config.event_faults = EventFaults::drop_next(2);
    let world = World::with_emulator(config).await;
    let daemon = batchd_tests::Daemon::start(settings_with_events(&world, Duration::from_secs(3)), &world.emulator);
    world.enqueue(&bge_m3_job("lost", 1)).await;

    let result = world.wait_for_result("lost", Duration::from_secs(30)).await;
    assert_eq!(result.status, ResultStatus::Completed);
    assert_eq!(world.emulator.queue_stats().dropped, 2);
    assert!(result.finished_at - result.accepted_at >= 2000, "it waited for the fallback poll (3 s ± 20%)");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn duplicated_and_unknown_events_change_nothing() {
    let mut config = with_events(Duration::from_millis(800));
    config.event_faults = EventFaults::duplicate();
    let world = World::with_emulator(config).await;
    // Another application on the same account: a batch batchd never submitted, whose events it will pull too.
    let other = reqwest::Client::new()
        .post(format!(
            "{}/accounts/{}/ai/run/@cf/baai/bge-m3?queueRequest=true",
            world.emulator.base_url(),
            world.emulator.account_id()
        ))
        .bearer_auth(world.emulator.token())
        .json(&serde_json::json!({"requests": [{"text": "someone else's"}]}))
        .send()
        .await
        .expect("submit of another application");
    assert!(other.status().is_success());
    let daemon = batchd_tests::Daemon::start(settings_with_events(&world, Duration::from_secs(600)), &world.emulator);
    let ids: Vec<String> = (0..3).map(|i| format!("dup-{i}")).collect();
    for id in &ids {
        world.enqueue(&bge_m3_job(id, 1)).await;
    }
    for id in &ids {
        assert_eq!(world.wait_for_result(id, Duration::from_secs(30)).await.status, ResultStatus::Completed);
    }
    let polls = world.emulator.polls().len();
    assert!(
        polls <= 2 * ids.len(),
        "{polls} polls for {} batches: a duplicated event polls at most once more",
        ids.len()
    );
    // Every message, the other application's and the duplicates included, is acknowledged.
    wait_until(Duration::from_secs(10), "the queue to drain", || {
        let stats = world.emulator.queue_stats();
        stats.backlog == 0 && stats.duplicated > 0 && stats.published.succeeded == 4
    })
    .await;
    assert_eq!(world.results().await.len(), ids.len(), "one result per job");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn events_leased_by_a_replica_killed_before_it_acknowledged_are_delivered_again() {
    let world = World::with_emulator(with_events(Duration::from_millis(800))).await;
    // The first replica's acknowledgements hang (as if it died before they completed).
    world.emulator.inject(Fault::delay(Duration::from_secs(30)).on(Calls::Ack).times(1000));
    let spawn = || {
        Command::new(binary("batchd").expect("batchd binary"))
            .arg("run")
            .env_clear()
            .envs(world.batchd_env())
            .env("CLOUDFLARE_API_TOKEN", world.emulator.token())
            .env("BATCHD__EVENTS__QUEUE_ID", QUEUE)
            .env("BATCHD__EVENTS__MAX_IDLE_MS", "200")
            .env("BATCHD__EVENTS__VISIBILITY_TIMEOUT_MS", "2000")
            .env("BATCHD__POLL__MAX_INTERVAL_MS_WITH_EVENTS", "600000")
            .env("BATCHD__SCHEDULE__LEASE_SECS", "6")
            .env("BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS", "5")
            .env("BATCHD__ADMIN__LISTEN", "")
            .env("BATCHD__RATE_LIMITS__EMBEDDINGS", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start batchd")
    };
    let mut first = spawn();
    world.enqueue(&bge_m3_job("orphaned-events", 1)).await;
    wait_until(Duration::from_secs(30), "the first replica to lease both events", || {
        let stats = world.emulator.queue_stats();
        stats.published.succeeded == 1 && stats.leased >= 1 && stats.acked == 0
    })
    .await;
    first.kill().expect("kill -9");
    first.wait().expect("reaped");

    world.emulator.reset(); // clears the pending ack delays (and the call logs)
    let mut second = spawn();
    let result = world.wait_for_result("orphaned-events", Duration::from_secs(30)).await;
    assert_eq!(result.status, ResultStatus::Completed);
    wait_until(Duration::from_secs(15), "the leased events to come back and be acknowledged", || {
        let stats = world.emulator.queue_stats();
        stats.redelivered >= 1 && stats.backlog == 0
    })
    .await;
    assert_eq!(world.results().await.len(), 1, "published once");
    second.kill().ok();
    second.wait().ok();
}
