//! Short versions of the chaos scenarios (`make chaos` runs the full ones; see `docs/reliability.md`): real
//! `batchd` processes with all three providers configured, a real redis-server, the emulator (Workers AI, OpenAI
//! and Anthropic) with random batch durations and 5% random faults, and a third of the jobs at each provider.
//! Each test fails with the run's own account of what went wrong (lost jobs with their ledgers, duplicates
//! without a cause, work never taken over, daemons that exited, ...).

use batchd_tests::chaos::check::Outcome;
use batchd_tests::chaos::{Size, hostile, scenarios};

async fn short(name: &str) -> Outcome {
    let outcome =
        scenarios::run(name, Size::Short).await.unwrap_or_else(|error| panic!("{name} could not run: {error:#}"));
    assert!(outcome.passed(), "{}", outcome.explain());
    // A run that checked nothing is a defect: every job must have been enqueued and accounted for.
    assert!(outcome.jobs >= 100, "{name}: only {} jobs", outcome.jobs);
    // Both paths ran: packs shared by many jobs (packing is on by default) and, for the quarter of the jobs that
    // opt out, batches of their own; every job was traced to the remote batch that served it (the check fails a
    // job with a result and no batch).
    assert!(figure(&outcome, "packs_created").unwrap_or(0) >= 1, "{name}: no pack was created");
    // A third of the jobs went to each provider, and each provider's batches were traced.
    assert_eq!(outcome.providers.len(), 3, "{name}: {:?}", outcome.providers);
    for (provider, counts) in &outcome.providers {
        assert!(
            counts.jobs * 4 >= outcome.jobs && counts.batches * 5 >= counts.jobs,
            "{name}, {provider:?}: a quarter of the jobs opt out of packing: {counts:?}"
        );
    }
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
    assert_eq!(outcome.avoidable_duplicates(), 0, "{}", outcome.explain());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_backlog_enqueued_before_any_daemon_is_drained() {
    let outcome = short("5-backlog").await;
    assert_eq!(outcome.jobs, 3_000);
    assert!(figure(&outcome, "drain_ms").is_some(), "{}", outcome.explain());
}

/// Issue 12: replicas at +0 s, +300 s and -300 s wall clock (one jumping to +600 s mid-run), every reply 0.7–1.3 s
/// late: one remote batch per job or pack, and no poll sooner than its interval allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_replicas_whose_clocks_disagree_submit_each_batch_once_and_never_poll_early() {
    let outcome = short("7-clock-skew").await;
    assert_eq!(outcome.avoidable_duplicates(), 0, "{}", outcome.explain());
    let units = figure(&outcome, "units_submitted").expect("units submitted");
    let batches = units + outcome.duplicates_from_lost_replies() as u64;
    assert_eq!(figure(&outcome, "api_submits_accepted"), Some(batches), "one remote batch per job or pack");
    assert_eq!(figure(&outcome, "early_polls"), Some(0), "{}", outcome.explain());
    assert!(figure(&outcome, "polls_checked_for_earliness").unwrap_or(0) >= units);
}

/// Issue 11: good jobs with every hostile entry of `tests/chaos/hostile.rs` mixed in: each hostile entry gets one
/// `failed` result (and a dead-letter copy when it is not a job), no replica exits, peak RSS within the formula.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_hostile_entries_among_good_jobs_are_refused_and_no_replica_exits() {
    let outcome = short("8-hostile-entries").await;
    assert_eq!((outcome.kills, outcome.restarts), (0, 0), "{}", outcome.explain());
    let keys = batchd_core::Keys::new("any").expect("keys");
    let catalogue = hostile::catalogue(0, Size::Short, 4 * 1024 * 1024, &keys);
    let kinds = outcome.figures["hostile"].as_array().expect("a table of hostile kinds");
    assert_eq!(kinds.len(), catalogue.len(), "{kinds:?}");
    assert_eq!(figure(&outcome, "hostile_entries"), Some(kinds.len() as u64));
    for kind in kinds {
        let results = kind["results"].as_object().expect("results by status and code");
        assert_eq!(results.len(), 1, "{kind}");
        let (status_code, n) = results.iter().next().expect("one");
        assert!(status_code.starts_with("failed "), "{kind}");
        assert_eq!(n.as_u64(), kind["sent"].as_u64(), "{kind}");
    }
    let dead: u64 = kinds.iter().filter_map(|kind| kind["dead_lettered"].as_u64()).sum();
    let not_jobs = catalogue.iter().filter(|entry| entry.dead).count() as u64;
    assert!(not_jobs >= 8, "{not_jobs}");
    assert_eq!(dead, not_jobs, "every entry that is not a job is in the dead-letter stream: {kinds:?}");
    let peaks = outcome.figures["peak_rss"].as_array().expect("peak RSS per replica");
    assert_eq!(peaks.len(), 3);
    for peak in peaks {
        assert!(peak["peak_mib"].as_f64() <= peak["bound_mib"].as_f64(), "{peak}");
    }
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
    assert_eq!(figure(&outcome, "submit_replies_during_outage"), Some(3), "every reply left while Redis was down");
}

/// Issue 22: a poll step of three slow requests (status, output file, error file: 37.5 s) under a 16 s lease,
/// each request within the 15 s request timeout: the lease is renewed during the step, so it is not taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_a_step_twice_as_long_as_the_lease_is_renewed_and_not_taken_over() {
    let outcome =
        scenarios::run("10-long-step", Size::Short).await.unwrap_or_else(|error| panic!("could not run: {error:#}"));
    assert!(outcome.passed(), "{}", outcome.explain());
    assert_eq!(outcome.jobs, 12);
    assert_eq!(outcome.duplicate_submits, 0, "{}", outcome.explain());
    assert!(figure(&outcome, "steps_over_twice_the_lease").unwrap_or(0) >= 6, "{}", outcome.explain());
    assert_eq!(figure(&outcome, "steps_taken_over"), Some(0), "{}", outcome.explain());
    assert_eq!(figure(&outcome, "stale_writes"), Some(0), "{}", outcome.explain());
    assert!(figure(&outcome, "fewest_lease_extensions_in_a_long_step").unwrap_or(0) >= 2, "{}", outcome.explain());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_a_replica_frozen_past_its_lease_is_fenced_out_when_it_resumes() {
    let outcome = short("9-freeze").await;
    assert!(figure(&outcome, "stale_writes_of_the_resumed_replica").unwrap_or(0) > 0, "{}", outcome.explain());
    assert_eq!(figure(&outcome, "api_calls_after_a_result"), Some(0), "{}", outcome.explain());
}
