//! Short versions of the chaos scenarios (`make chaos` runs the full ones; see `docs/reliability.md`): real
//! `batchd` processes, a real redis-server, the emulator with random batch durations and 5% random faults.
//! Each test fails with the run's own account of what went wrong (lost jobs with their ledgers, duplicates
//! without a cause, work never taken over, daemons that exited, ...).

use batchd_tests::chaos::check::Outcome;
use batchd_tests::chaos::{Size, scenarios};

async fn short(name: &str) -> Outcome {
    let outcome =
        scenarios::run(name, Size::Short).await.unwrap_or_else(|error| panic!("{name} could not run: {error:#}"));
    assert!(outcome.passed(), "{}", outcome.explain());
    // A run that checked nothing is a defect: every job must have been enqueued and accounted for.
    assert!(outcome.jobs >= 100, "{name}: only {} jobs", outcome.jobs);
    assert!(outcome.figures.get("api_submits_accepted").and_then(|n| n.as_u64()).unwrap_or(0) >= outcome.jobs as u64);
    outcome
}

fn figure(outcome: &Outcome, name: &str) -> Option<u64> {
    outcome.figures.get(name).and_then(serde_json::Value::as_u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_kill9_of_random_daemons_loses_and_duplicates_nothing() {
    let outcome = short("1-kill9").await;
    assert!(outcome.kills >= 3 && outcome.restarts == outcome.kills, "{}", outcome.explain());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_redis_restarted_from_its_aof_loses_nothing() {
    let outcome = short("2-redis-aof-restart").await;
    assert_eq!((outcome.kills, outcome.restarts), (1, 1), "{}", outcome.explain());
    assert!(outcome.recovery.is_some(), "results flowed again after the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_redis_frozen_with_sigstop_daemons_stay_up_and_resume() {
    let outcome = short("3a-redis-sigstop").await;
    assert!(figure(&outcome, "readyz_503_within_ms").is_some(), "{}", outcome.explain());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_redis_down_then_restarted_daemons_stay_up_and_resume() {
    let outcome = short("3b-redis-down").await;
    assert!(figure(&outcome, "readyz_503_within_ms").is_some(), "{}", outcome.explain());
    assert!(figure(&outcome, "readyz_200_again_within_ms").is_some(), "{}", outcome.explain());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_rolling_sigterm_restart_loses_and_duplicates_nothing() {
    let outcome = short("4-rolling-sigterm").await;
    assert_eq!(outcome.restarts, 3, "{}", outcome.explain());
    assert_eq!(outcome.duplicate_submits, 0, "{}", outcome.explain());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_backlog_enqueued_before_any_daemon_is_drained() {
    let outcome = short("5-backlog").await;
    assert_eq!(outcome.jobs, 3_000);
    assert!(figure(&outcome, "drain_ms").is_some(), "{}", outcome.explain());
}

/// Regression for chaos finding f1: a submit answered while Redis is down for 2.5 s used to be submitted again
/// after its lease; the daemon now keeps retrying to record the request id it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_received_while_redis_is_down_is_recorded_not_resubmitted() {
    let outcome = scenarios::run("f1-redis-blip-while-recording", Size::Short)
        .await
        .unwrap_or_else(|error| panic!("f1 could not run: {error:#}"));
    assert!(outcome.passed(), "{}", outcome.explain());
    assert_eq!(outcome.jobs, 3);
    assert_eq!(outcome.duplicate_submits, 0, "{}", outcome.explain());
    assert_eq!(figure(&outcome, "emulator_batches"), Some(3), "one remote batch per job");
}
