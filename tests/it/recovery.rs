//! Crashes and restarts: of the daemon (in-process abort and a real `kill -9`), of another replica holding
//! entries, and of Redis itself. Every job still gets exactly one result, and a batch whose request id was
//! recorded is never submitted again.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use batchd_core::ResultStatus;
use batchd_emulator::{Calls, EmulatorConfig, Fault};
use batchd_tests::{Daemon, World, bge_m3_job, binary, wait_for_http, with_admin};
use redis::AsyncCommands;
use redis::streams::{StreamReadOptions, StreamReadReply};

const WAIT: Duration = Duration::from_secs(60);

/// Waits until every job in `ids` has its request id recorded (the remote batch exists and is being polled).
async fn wait_until_polling(world: &World, ids: &[String]) {
    let started = Instant::now();
    loop {
        let mut polling = 0;
        for id in ids {
            if world.ledger(id).await.get("c0:state").map(String::as_str) == Some("polling") {
                polling += 1;
            }
        }
        if polling == ids.len() {
            return;
        }
        assert!(started.elapsed() < WAIT, "only {polling}/{} jobs reached polling", ids.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every job in `ids` has a result and no work is left (see [`World::wait_until_settled`]): no chunk
/// is scheduled or leased and no entry is unacknowledged, so no late duplicate can still be on its way.
async fn wait_until_done(world: &World, ids: &[String]) {
    world.wait_for_results(ids.len(), WAIT).await;
    world.wait_until_settled(WAIT).await;
}

/// Checks that every job has exactly one completed result and was submitted exactly once. Call it once the
/// daemons have stopped, after [`wait_until_done`].
async fn assert_exactly_once(world: &World, ids: &[String]) {
    let results = world.results().await;
    let seen: Vec<&str> = results.iter().map(|r| r["job_id"].as_str()).collect();
    let unique: HashSet<&str> = seen.iter().copied().collect();
    assert_eq!(seen.len(), unique.len(), "a job was published twice: {seen:?}");
    assert_eq!(seen.len(), ids.len(), "one result per job: {seen:?}");
    for id in ids {
        assert!(unique.contains(id.as_str()), "job {id} has no result");
    }
    assert!(results.iter().all(|r| r["status"] == "completed"));
    assert_eq!(world.emulator.submits().len(), ids.len(), "a recorded batch was submitted again");
    assert_eq!(world.scheduled().await, 0);
    assert_eq!(world.ingress_pending().await, 0);
}

fn slow_batches() -> EmulatorConfig {
    EmulatorConfig {
        queued_for: Duration::from_millis(1500),
        running_for: Duration::from_millis(500),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_daemon_aborted_while_polling_is_resumed_by_its_successor() {
    let world = World::with_emulator(slow_batches()).await;
    let daemon = world.daemon();
    let ids: Vec<String> = (0..10).map(|i| format!("crash-{i}")).collect();
    for id in &ids {
        world.enqueue(&bge_m3_job(id, 2)).await;
    }
    wait_until_polling(&world, &ids).await;
    daemon.crash().await;

    let successor = world.daemon();
    wait_until_done(&world, &ids).await;
    successor.stop().await.unwrap();
    assert_exactly_once(&world, &ids).await;
}

#[tokio::test]
async fn a_daemon_process_killed_with_sigkill_loses_nothing() {
    let world = World::with_emulator(slow_batches()).await;
    let bin = binary("batchd").expect("batchd binary");
    let spawn = || {
        Command::new(&bin)
            .arg("run")
            .env("REDIS_URL", world.settings.redis.url.expose())
            .env("BATCHD__REDIS__NAMESPACE", &world.settings.redis.namespace)
            .env("BATCHD__CLOUDFLARE__BASE_URL", world.emulator.base_url())
            .env("CLOUDFLARE_ACCOUNT_ID", world.emulator.account_id())
            .env("CLOUDFLARE_API_TOKEN", world.emulator.token())
            .env("BATCHD__SCHEDULE__LEASE_SECS", "6")
            .env("BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS", "5")
            .env("BATCHD__POLL__INITIAL_INTERVAL_MS", "100")
            .env("BATCHD__POLL__MAX_INTERVAL_MS", "300")
            .env("BATCHD__INGRESS__RECLAIM_IDLE_SECS", "2")
            .env("BATCHD__INGRESS__RECLAIM_INTERVAL_SECS", "1")
            .env("BATCHD__ADMIN__LISTEN", "127.0.0.1:0")
            // Jobs with batches of their own (the polling chunks this waits for); kill_create.rs kills inside packs.
            .env("BATCHD__PACKING__ENABLED", "false")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start batchd")
    };
    let mut first = spawn();
    let ids: Vec<String> = (0..10).map(|i| format!("kill-{i}")).collect();
    for id in &ids {
        world.enqueue(&bge_m3_job(id, 2)).await;
    }
    wait_until_polling(&world, &ids).await;
    first.kill().expect("kill -9");
    first.wait().expect("reaped");

    let mut second = spawn();
    wait_until_done(&world, &ids).await;
    second.kill().ok();
    second.wait().ok();
    assert_exactly_once(&world, &ids).await;
}

#[tokio::test]
async fn entries_held_by_a_dead_replica_are_reclaimed_after_the_idle_timeout() {
    let world = World::new().await;
    let ids: Vec<String> = (0..5).map(|i| format!("orphan-{i}")).collect();
    for id in &ids {
        world.enqueue(&bge_m3_job(id, 1)).await;
    }
    // Another replica reads the entries and dies before acknowledging them.
    let mut conn = world.conn.clone();
    let _: () = conn.xgroup_create_mkstream(world.keys.submit(), "batchd", "0").await.unwrap();
    let options = StreamReadOptions::default().group("batchd", "replica-that-died").count(10);
    let read: StreamReadReply = conn.xread_options(&[world.keys.submit()], &[">"], &options).await.unwrap();
    assert_eq!(read.keys[0].ids.len(), 5);
    let died_at = Instant::now();
    assert_eq!(world.ingress_pending().await, 5);

    let daemon = world.daemon();
    for id in &ids {
        assert_eq!(world.wait_for_result(id, WAIT).await.status, ResultStatus::Completed);
    }
    let recovered_after = died_at.elapsed();
    assert!(recovered_after >= Duration::from_secs(2), "reclaimed before the idle timeout: {recovered_after:?}");
    assert_eq!(world.ingress_pending().await, 0);
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn the_daemon_survives_a_redis_restart_and_carries_on() {
    let mut world = World::new().await;
    let mut settings = world.settings.clone();
    let admin = with_admin(&mut settings);
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&bge_m3_job("before", 1)).await;
    world.wait_for_result("before", WAIT).await;

    // The outage lasts until the daemon has lived through it: readiness says why it is down, and the sampler
    // (every 100 ms) has failed several times in a row, while the fetchers kept retrying (every 20 ms and 200 ms).
    world.redis.kill();
    wait_for_http(admin, "/readyz", WAIT, |status, body| status == 503 && body.starts_with("redis unreachable")).await;
    let failed_samples = |metrics: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix("batchd_redis_errors_total{operation=\"sample\"} "))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    wait_for_http(admin, "/metrics", WAIT, |status, body| status == 200 && failed_samples(body) >= 5.0).await;
    assert!(daemon.is_running(), "a Redis outage must not stop the daemon");
    world.redis.restart().await;

    // Without persistence the group is gone too; the daemon recreates it.
    world.conn = batchd_tests::test_connection(&world.redis.url()).await;
    world.enqueue(&bge_m3_job("after", 1)).await;
    assert_eq!(world.wait_for_result("after", WAIT).await.status, ResultStatus::Completed);
    assert!(daemon.is_running());
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_stop_signal_lets_a_submit_in_flight_finish_and_record_its_request_id() {
    let world = World::new().await;
    // The submit is answered after 2.5 s; the stop comes while it is in flight.
    world.emulator.inject(Fault::delay(Duration::from_millis(2500)).on(Calls::Submit));
    let mut settings = world.settings.clone();
    settings.shutdown.grace_secs = 10; // above cloudflare.request_timeout_secs (5 in tests), as the defaults are
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&bge_m3_job("in-flight", 1)).await;
    let started = Instant::now();
    loop {
        let ledger = world.ledger("in-flight").await;
        if ledger.get("c0:state").map(String::as_str) == Some("submitting") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the submit never started: {ledger:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    daemon.stop().await.expect("a clean stop");

    let ledger = world.ledger("in-flight").await;
    assert_eq!(ledger.get("c0:state").map(String::as_str), Some("polling"), "the submit finished: {ledger:?}");
    assert!(ledger.contains_key("c0:request_id"), "and its request id was recorded before exit");
    let successor = world.daemon();
    let result = world.wait_for_result("in-flight", Duration::from_secs(30)).await;
    assert_eq!(result.status, ResultStatus::Completed);
    assert_eq!(world.emulator.submits().len(), 1, "no second submit after the restart");
    assert_eq!(world.ledger("in-flight").await.get("possible_duplicate_submits"), None);
    successor.stop().await.unwrap();
}
