//! Failed jobs, first class: `batchd_queue::failed::failed_jobs` (what `batchd failed` and the dashboard list)
//! groups the jobs that ended `failed`, `expired` or `cancelled` by error code and model, with counts and the newest
//! examples, against a real daemon; `batchd failed` prints it, `batchd retry <id>...` runs chosen ones again.

use std::time::Duration;

use batchd_core::{JobState, ResultStatus};
use batchd_emulator::{Calls, Fault};
use batchd_queue::failed::{FailedQuery, FailedReport, failed_jobs};
use batchd_tests::{World, bge_m3_job};
use serde_json::json;

use crate::cli_operator::{cli, cli_json};

const WAIT: Duration = Duration::from_secs(30);

/// Makes, one after the other: two jobs refused by a revoked token (`api_error`, bge-m3), one for a model that does
/// not exist, one refused at take-in (`invalid_job`, no model), one cancelled while it runs, and one that completes.
pub(crate) async fn some_failed_jobs(world: &World) {
    world.emulator.inject(Fault::status(401).code(10000).on(Calls::Submit).times(2));
    for id in ["tok-1", "tok-2"] {
        world.enqueue(&bge_m3_job(id, 2)).await;
        assert_eq!(world.wait_for_result(id, WAIT).await.status, ResultStatus::Failed);
    }
    world.enqueue(&json!({"id": "nomodel-1", "model": "@cf/nobody/nothing", "requests": [{"text": "x"}]})).await;
    assert_eq!(world.wait_for_result("nomodel-1", WAIT).await.status, ResultStatus::Failed);
    world.enqueue(&json!({"id": "invalid-1", "requests": [{"text": "x"}]})).await;
    assert_eq!(world.wait_for_result("invalid-1", WAIT).await.status, ResultStatus::Failed);
    world.emulator.set_timing(Duration::from_secs(600), Duration::from_secs(600));
    world.enqueue(&bge_m3_job("slow-1", 1)).await;
    batchd_tests::wait_until("slow-1 to be polled", WAIT, async || {
        world.ledger("slow-1").await.get("c0:state").map(String::as_str) == Some("polling")
    })
    .await;
    let (code, _, stderr) =
        crate::cli_operator::cli(world, &["cancel", "slow-1", "--reason", "operator said so"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(world.wait_for_result("slow-1", WAIT).await.status, ResultStatus::Cancelled);
    world.emulator.set_timing(Duration::ZERO, Duration::ZERO);
    world.enqueue(&bge_m3_job("ok-1", 1)).await;
    assert_eq!(world.wait_for_result("ok-1", WAIT).await.status, ResultStatus::Completed);
}

/// `(code, model, count, example ids)` of each group, in the report's order.
fn shape(report: &FailedReport) -> Vec<(String, String, u64, Vec<String>)> {
    report
        .groups
        .iter()
        .map(|group| {
            let ids = group.examples.iter().map(|job| job.job_id.clone()).collect();
            (group.code.clone(), group.model.clone(), group.count, ids)
        })
        .collect()
}

fn group(code: &str, model: &str, count: u64, ids: &[&str]) -> (String, String, u64, Vec<String>) {
    (code.into(), model.into(), count, ids.iter().map(|id| id.to_string()).collect())
}

#[tokio::test]
async fn failed_jobs_are_grouped_by_error_code_and_model_with_the_newest_examples() {
    let world = World::new().await;
    let daemon = world.daemon();
    some_failed_jobs(&world).await;
    let nomodel_code = world.wait_for_result("nomodel-1", WAIT).await.error.expect("error").code;
    let mut conn = batchd_queue::connect(redis::Client::open(world.redis.url()).unwrap(), WAIT).unwrap();

    let report = failed_jobs(&mut conn, &world.keys, &FailedQuery::default()).await.expect("failed jobs");
    assert_eq!(report.total, 5, "{report:#?}");
    assert_eq!(report.next_cursor, None, "every ledger read");
    assert_eq!(report.scanned, 6, "six ledgers, the completed one among them");
    let mut expected = vec![
        group("api_error", "@cf/baai/bge-m3", 2, &["tok-2", "tok-1"]),
        group("cancelled", "@cf/baai/bge-m3", 1, &["slow-1"]),
        group(&nomodel_code, "@cf/nobody/nothing", 1, &["nomodel-1"]),
        group("invalid_job", "", 1, &["invalid-1"]),
    ];
    // Groups of one: the most recent first.
    expected[1..].sort_by_key(|(_, _, _, ids)| match ids[0].as_str() {
        "slow-1" => 0,
        "invalid-1" => 1,
        _ => 2,
    });
    assert_eq!(shape(&report), expected, "{report:#?}");
    let tok2 = &report.groups[0].examples[0];
    assert_eq!((tok2.state.as_str(), tok2.n_items), ("failed", Some(2)));
    let error = tok2.error.as_ref().expect("the error, field by field");
    assert_eq!((error.code.as_deref(), error.http_status), (Some("api_error"), Some(401)), "{error:?}");
    assert_eq!(error.api_code.as_deref(), Some("10000"));
    assert!(report.groups[0].newest_finished_at >= tok2.finished_at && tok2.finished_at.is_some());
    let cancelled = &report.groups[1].examples[0];
    let message = cancelled.error.as_ref().and_then(|e| e.message.clone()).unwrap_or_default();
    assert!(message.starts_with("cancelled on request (operator said so)"), "{message}");

    // Each filter, and a cap on the examples.
    let query = |edit: &dyn Fn(&mut FailedQuery)| {
        let mut query = FailedQuery::default();
        edit(&mut query);
        query
    };
    let narrowed = [
        (query(&|q| q.examples = 1), vec![group("api_error", "@cf/baai/bge-m3", 2, &["tok-2"])]),
        (query(&|q| q.states = vec![JobState::Cancelled]), vec![group("cancelled", "@cf/baai/bge-m3", 1, &["slow-1"])]),
        (
            query(&|q| q.model = Some("@cf/nobody/nothing".into())),
            vec![group(&nomodel_code, "@cf/nobody/nothing", 1, &["nomodel-1"])],
        ),
        (query(&|q| q.code = Some("invalid_job".into())), vec![group("invalid_job", "", 1, &["invalid-1"])]),
        (query(&|q| q.since = Some(u64::MAX)), vec![]),
    ];
    for (query, expected) in narrowed {
        let report = failed_jobs(&mut conn, &world.keys, &query).await.expect("failed jobs");
        let got = shape(&report);
        assert_eq!(got[..expected.len().min(got.len())], expected[..], "{query:?}: {report:#?}");
        if query.examples == 1 {
            assert!(report.groups.iter().all(|group| group.examples.len() == 1), "{report:#?}");
        } else {
            assert_eq!(got.len(), expected.len(), "{query:?}: {report:#?}");
        }
    }
    let since = report.groups[0].examples[0].finished_at.unwrap();
    let recent = failed_jobs(&mut conn, &world.keys, &query(&|q| q.since = Some(since))).await.unwrap();
    assert!(recent.total < 5 && recent.groups.iter().any(|g| g.examples.iter().any(|j| j.job_id == "tok-2")));
    assert!(recent.groups.iter().all(|g| g.examples.iter().all(|j| j.job_id != "tok-1")), "{recent:#?}");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn an_error_batchd_never_writes_is_not_read_and_the_walk_is_capped() {
    let world = World::new().await;
    let mut raw = world.conn.clone();
    // Hand-written ledgers (an operator's mistake or a hostile writer): more failed jobs than one SCAN step reads,
    // one with a 1 MB error.
    const N: u64 = 2500;
    let mut pipe = redis::pipe();
    for i in 0..N {
        let key = world.keys.job(&batchd_core::JobId::parse(&format!("hand-{i}")).unwrap());
        let error = if i == 0 { "x".repeat(1 << 20) } else { r#"{"code":"api_error","message":"m"}"#.to_owned() };
        pipe.hset_multiple(&key, &[("state", "failed"), ("model", "@cf/a/b"), ("finished_at", "5"), ("error", &error)])
            .ignore();
    }
    let _: () = pipe.query_async(&mut raw).await.unwrap();
    let mut conn = batchd_queue::connect(redis::Client::open(world.redis.url()).unwrap(), WAIT).unwrap();
    let report = failed_jobs(&mut conn, &world.keys, &FailedQuery::default()).await.unwrap();
    assert_eq!(report.total, N);
    let big = report.groups.iter().find(|group| group.code == "unknown").expect("the oversized error's group");
    assert_eq!(big.count, 1);
    let message = big.examples[0].error.as_ref().and_then(|error| error.message.clone()).unwrap_or_default();
    assert!(message.contains("1048576 bytes, not read"), "{message}");

    // A walk stops at max_scanned (after a whole SCAN step) and says where to go on; going on reaches the end.
    let first =
        failed_jobs(&mut conn, &world.keys, &FailedQuery { max_scanned: 1, ..FailedQuery::default() }).await.unwrap();
    assert!(first.next_cursor.is_some() && first.total < N, "one SCAN step, not the whole walk: {}", first.total);
    let mut total = first.total;
    let mut cursor = first.next_cursor;
    while let Some(next) = cursor {
        let page = failed_jobs(
            &mut conn,
            &world.keys,
            &FailedQuery { max_scanned: 1, cursor: next, ..FailedQuery::default() },
        )
        .await
        .unwrap();
        total += page.total;
        cursor = page.next_cursor;
    }
    assert_eq!(total, N, "every failed job once, over the pages");
}

#[tokio::test]
async fn batchd_failed_lists_the_groups_and_retry_by_id_runs_chosen_jobs_again() {
    let world = World::new().await;
    let daemon = world.daemon();
    some_failed_jobs(&world).await;
    let place = format!("namespace {} on {}", world.settings.redis.namespace, world.redis.url());

    // Human: where it read, a line per group, its examples below, how to go on.
    let (code, stdout, stderr) = cli(&world, &["failed", "--examples", "1"]).await;
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "{place}: 5 jobs ended without completing (failed, expired or cancelled), in 4 groups by error code and \
             model; 6 ledgers read"
        )
    );
    let group: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(group[..4], ["2", "api_error", "@cf/baai/bge-m3", "newest"], "{stdout}");
    assert!(lines[2].starts_with("           tok-2  failed  20") && lines[2].contains("  http 401  api code 10000: "));
    assert_eq!(lines.len(), 1 + 4 * 2 + 1, "a summary, four groups of one example each, the hint: {stdout}");
    assert!(lines.last().unwrap().starts_with("run one again with `batchd retry <job id>...`"), "{stdout}");

    // JSON: the library's report, with the namespace.
    let report = cli_json(&world, &["failed", "--json", "--state", "cancelled"], 0).await;
    assert_eq!(report["namespace"], world.settings.redis.namespace.as_str());
    assert_eq!((report["total"].as_u64(), report["scanned"].as_u64()), (Some(1), Some(6)), "{report}");
    assert_eq!(report["groups"][0]["code"], "cancelled");
    assert_eq!(report["groups"][0]["examples"][0]["job_id"], "slow-1");
    assert_eq!(report["groups"][0]["examples"][0]["error"]["code"], "cancelled");
    let (code, _, stderr) = cli(&world, &["failed", "--state", "completed"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("expected one of failed, expired, cancelled"), "{stderr}");

    // retry by id: a failed job runs again as <id>.retry-1; a completed one, a refused one and an unknown id are
    // reported and make the exit code 1; the dry run says what would happen and writes nothing.
    let dry = cli_json(&world, &["retry", "tok-1", "ok-1", "nosuch-1", "--dry-run", "--json"], 0).await;
    let outcome = |report: &serde_json::Value, i: usize| report["jobs"][i]["outcome"].as_str().unwrap().to_owned();
    assert_eq!(
        (outcome(&dry, 0), outcome(&dry, 1), outcome(&dry, 2)),
        ("would_retry".into(), "not_retryable".into(), "not_retryable".into())
    );
    assert_eq!(
        dry["jobs"][1]["reason"],
        "it is completed; only a job that ended failed, expired or cancelled is retried"
    );
    assert!(dry["jobs"][2]["reason"].as_str().unwrap().starts_with("it has no ledger"), "{dry}");
    assert_eq!(dry["stream"], serde_json::Value::Null);
    assert!(world.ledger("tok-1.retry-1").await.is_empty(), "a dry run enqueues nothing");
    let (code, stdout, stderr) = cli(&world, &["retry", "tok-1", "slow-1", "invalid-1"]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.lines().any(|line| line.starts_with("retried          tok-1 -> tok-1.retry-1  failed  api_error")));
    assert!(stdout.lines().any(|line| line.starts_with("retried          slow-1 -> slow-1.retry-1  cancelled")));
    assert!(stdout.lines().any(|line| line.starts_with("not retryable    invalid-1 -> invalid-1.retry-1")));
    assert_eq!(
        stdout.lines().last().unwrap(),
        format!("retried 2 of 3 jobs (0 already retried, 1 not retryable); {place}")
    );
    assert_eq!(
        crate::cli_ops::without_warnings(&stderr).trim_end(),
        "batchd: 1 jobs could not be retried (listed above)"
    );
    for id in ["tok-1.retry-1", "slow-1.retry-1"] {
        assert_eq!(world.wait_for_result(id, WAIT).await.status, ResultStatus::Completed, "{id}");
    }
    let again = cli_json(&world, &["retry", "tok-1", "--json"], 0).await;
    assert_eq!(outcome(&again, 0), "already_retried");
    let (code, _, stderr) = cli(&world, &["retry", "tok-1", "--model", "x"]).await;
    assert_eq!(code, 2, "ids or filters, not both: {stderr}");
    daemon.stop().await.unwrap();
}
