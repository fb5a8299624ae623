//! Large backlogs: 20,000 jobs waiting in the ingress stream and 20,000 polls due at once are drained with
//! bounded fetches (neither the claim nor the read grows with the backlog).

use std::time::{Duration, Instant};

use batchd_emulator::EmulatorConfig;
use batchd_tests::World;
use redis::AsyncCommands;

const N: usize = 20_000;

#[tokio::test]
async fn twenty_thousand_waiting_jobs_and_twenty_thousand_due_polls_drain() {
    let world = World::with_emulator(EmulatorConfig {
        queued_for: Duration::from_millis(1),
        running_for: Duration::from_millis(1),
        ..Default::default()
    })
    .await;
    // 20,000 jobs waiting before any daemon runs, enqueued in pipelines.
    let mut conn = world.conn.clone();
    for start in (0..N).step_by(1000) {
        let mut pipe = redis::pipe();
        for i in start..start + 1000 {
            let job = serde_json::json!({"id": format!("b-{i}"), "model": "@cf/baai/bge-small-en-v1.5", "requests": [{"text": "x"}]});
            pipe.xadd(world.keys.submit(), "*", &[("job", job.to_string())]).ignore();
        }
        let _: () = pipe.query_async(&mut conn).await.unwrap();
    }
    assert_eq!(conn.xlen::<_, usize>(world.keys.submit()).await.unwrap(), N);

    // Phase 1: take every job in and submit it, with polls far in the future, then stop.
    let mut settings = world.settings.clone();
    settings.poll.initial_interval_ms = 3_600_000;
    settings.poll.max_interval_ms = 3_600_000;
    settings.poll.jitter = 0.0;
    settings.workers.submit_concurrency = 64;
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    let started = Instant::now();
    loop {
        let scheduled = world.scheduled().await;
        let submits = world.emulator.submits().len();
        if scheduled == N && submits == N && world.ingress_pending().await == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "intake stalled: {submits} submits, {scheduled} scheduled"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    daemon.stop().await.unwrap();
    let intake = started.elapsed();

    // Phase 2: make all 20,000 polls due at once, and let a fresh daemon drain them.
    let members: Vec<String> = conn.zrange(world.keys.schedule(), 0, -1).await.unwrap();
    assert_eq!(members.len(), N);
    for chunk in members.chunks(1000) {
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(world.keys.schedule());
        for member in chunk {
            cmd.arg(0).arg(member);
        }
        let _: () = cmd.query_async(&mut conn).await.unwrap();
    }
    let mut settings = world.settings.clone();
    settings.workers.poll_concurrency = 128;
    let daemon = batchd_tests::Daemon::start(settings, &world.emulator);
    let drained_at = Instant::now();
    let results = world.wait_for_results(N, Duration::from_secs(240)).await;
    let drain = drained_at.elapsed();
    assert_eq!(results.len(), N);
    assert!(results.iter().all(|r| r["status"] == "completed"));
    assert_eq!(world.scheduled().await, 0);
    assert_eq!(world.emulator.submits().len(), N, "no job submitted twice");
    eprintln!("backlog of {N}: intake {intake:?}, drain of {N} due polls {drain:?}");
    daemon.stop().await.unwrap();
}
