//! Big batches, rate limits and the failure policy: splitting and merging, the shared limiter across replicas,
//! chunk-level failures, failed-item retries and cancellation.

use std::time::{Duration, Instant};

use batchd_core::ResultStatus;
use batchd_emulator::{CallKind, EmulatorConfig, Fault, RateLimit};
use batchd_tests::{Daemon, World, bge_m3_job, patient, small_embeddings};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

fn embeddings_job(id: &str, n: usize, text: &str) -> serde_json::Value {
    let requests: Vec<serde_json::Value> =
        (0..n).map(|i| json!({"text": format!("{text}{i}"), "external_reference": i})).collect();
    json!({"id": id, "model": "@cf/baai/bge-small-en-v1.5", "requests": requests})
}

#[tokio::test]
async fn fifty_thousand_items_with_an_item_cap_come_back_as_one_result_in_order() {
    let mut world = World::with_emulator(small_embeddings()).await;
    world.settings.jobs.max_batch_items = 1000;
    let daemon = Daemon::start(patient(world.settings.clone()), &world.emulator);
    world.enqueue(&embeddings_job("fifty-k", 50_000, "item ")).await;
    let result = world.wait_for_result("fifty-k", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed, "{:?}", result.error);
    assert_eq!((result.items_total, result.items_failed), (50_000, 0));
    assert_eq!(result.request_ids.len(), 50, "request_ids lists every batch");
    let output = result.result.expect("result");
    assert_eq!(output.responses.len(), 50_000);
    for (position, response) in output.responses.iter().enumerate() {
        assert_eq!(response.index, position);
        assert_eq!(response.external_reference.as_ref().expect("reference").get(), position.to_string());
    }
    // Usage is the sum over the 50 batches: the emulator counts one token per word, two words per item.
    assert_eq!(output.usage["prompt_tokens"], 100_000);
    let submits = world.emulator.submits();
    assert_eq!(submits.len(), 50);
    assert!(submits.iter().all(|call| call.n_items == Some(1000)));
    // The ledger showed per-chunk progress and is closed.
    let ledger = world.ledger("fifty-k").await;
    assert_eq!(ledger["n_chunks"], "50");
    assert_eq!(ledger["c49:state"], "done");
    assert!(!ledger.contains_key("c0:requests"), "request items are dropped once the result is published");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_job_of_more_chunks_than_one_lua_call_can_carry_completes_and_closes_its_ledger() {
    // 1,500 one-item chunks: accepting the job writes 18,000 ledger values and publishing it deletes 3,000 and
    // unschedules 1,500, far past the few thousand values Lua's unpack takes in one call.
    let mut world = World::with_emulator(small_embeddings()).await;
    world.settings.jobs.max_batch_items = 1;
    let daemon = Daemon::start(patient(world.settings.clone()), &world.emulator);
    world.enqueue(&embeddings_job("many-chunks", 1_500, "item ")).await;
    let result = world.wait_for_result("many-chunks", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed, "{:?}", result.error);
    assert_eq!((result.items_total, result.items_failed), (1_500, 0));
    assert_eq!(result.request_ids.len(), 1_500);
    let output = result.result.expect("result");
    let indices: Vec<usize> = output.responses.iter().map(|response| response.index).collect();
    assert_eq!(indices, (0..1_500).collect::<Vec<_>>());
    let ledger = world.ledger("many-chunks").await;
    assert_eq!(ledger["n_chunks"], "1500");
    assert!(ledger.keys().all(|name| !name.ends_with(":requests") && !name.ends_with(":output")), "all dropped");
    assert_eq!(ledger["c1499:state"], "done");
    assert_eq!(world.scheduled().await, 0, "every chunk is off the schedule");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_40_mb_job_is_sent_in_batches_under_10_mb() {
    let world = World::with_emulator(small_embeddings()).await;
    let mut settings = patient(world.settings.clone());
    // Over the default jobs.max_entry_bytes (32 MiB), raised as docs/operations.md says.
    settings.jobs.max_entry_bytes = 64 * 1024 * 1024;
    let daemon = Daemon::start(settings, &world.emulator);
    let text = "y".repeat(4000);
    let job = embeddings_job("forty-mb", 10_000, &text);
    let size = job.to_string().len();
    assert!((40_000_000..42_000_000).contains(&size), "{size}");
    world.enqueue(&job).await;
    let result = world.wait_for_result("forty-mb", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed, "{:?}", result.error);
    assert_eq!(result.result.as_ref().unwrap().responses.len(), 10_000);
    let sizes: Vec<usize> = world.emulator.submits().iter().map(|call| call.body_bytes).collect();
    assert_eq!(sizes.len(), 5, "{sizes:?}");
    assert!(sizes.iter().all(|bytes| *bytes < 9_500_000), "{sizes:?}");
    assert!(sizes.iter().sum::<usize>() > 40_000_000);
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn one_item_over_the_limit_fails_the_job_before_any_submit() {
    let world = World::new().await;
    let daemon = world.daemon();
    let big = "z".repeat(11_000_000);
    let job = json!({"id": "one-big-item", "model": "@cf/baai/bge-small-en-v1.5", "requests": [
        {"text": "small"}, {"text": "also small"}, {"text": big}
    ]});
    world.enqueue(&job).await;
    let result = world.wait_for_result("one-big-item", WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("error");
    assert_eq!(error.code, "item_too_large");
    assert!(
        error.message.starts_with("request item 2 is 11000011 bytes"),
        "the error names the item and its size: {}",
        error.message
    );
    assert_eq!(result.items_total, 3);
    assert!(world.emulator.calls().is_empty(), "nothing was submitted");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_413_on_a_batch_the_daemon_thought_small_enough_splits_it_further() {
    let world = World::new().await;
    // The API turns out to accept fewer items than the daemon's limits allow.
    world.emulator.set_limits(10_000_000, Some(3));
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("split-me", 10)).await;
    let result = world.wait_for_result("split-me", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed, "{:?}", result.error);
    let indices: Vec<usize> = result.result.as_ref().unwrap().responses.iter().map(|r| r.index).collect();
    assert_eq!(indices, (0..10).collect::<Vec<_>>());
    let refused = world.emulator.calls().iter().filter(|call| call.http_status == 413).count();
    assert!(refused >= 1, "the API refused the first batch as too large");
    let submits = world.emulator.submits();
    let accepted: usize = submits.iter().filter(|call| call.http_status == 200).map(|call| call.n_items.unwrap()).sum();
    assert_eq!(accepted, 10, "every item submitted exactly once after the splits");
    assert!(submits.iter().filter(|call| call.http_status == 200).all(|call| call.n_items.unwrap() <= 3));
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn three_daemons_share_one_rate_limit() {
    const LIMIT: usize = 4;
    const WINDOW_MS: u64 = 2000;
    let mut world = World::new().await;
    world.settings.rate_limits.embeddings = LIMIT as u32;
    world.settings.rate_limits.window_secs = WINDOW_MS / 1000;
    let daemons: Vec<Daemon> = (0..3).map(|_| world.daemon()).collect();
    let ids: Vec<String> = (0..12).map(|i| format!("limited-{i}")).collect();
    for id in &ids {
        world.enqueue(&bge_m3_job(id, 1)).await;
    }
    for id in &ids {
        assert_eq!(world.wait_for_result(id, WAIT).await.status, ResultStatus::Completed);
    }
    let times: Vec<u64> = world.emulator.submits().iter().map(|call| call.at_ms).collect();
    assert_eq!(times.len(), ids.len(), "throttled jobs wait; they are not refused or retried");
    // The limiter grants on Redis's clock; a submit reaches the emulator some milliseconds after its grant, more on a
    // loaded machine, so two grants a full window apart can arrive closer than that. Arrivals are counted in the
    // window less that jitter: a limiter that let a fifth submit through within the window still shows.
    const ARRIVAL_JITTER_MS: u64 = 250;
    for (position, start) in times.iter().enumerate() {
        let in_window = times[position..].iter().filter(|at| **at < start + WINDOW_MS - ARRIVAL_JITTER_MS).count();
        assert!(
            in_window <= LIMIT,
            "{in_window} submits within {} ms from {start}: {times:?}",
            WINDOW_MS - ARRIVAL_JITTER_MS
        );
    }
    for daemon in daemons {
        daemon.stop().await.unwrap();
    }
}

#[tokio::test]
async fn the_emulators_own_limit_throttles_without_failing_jobs() {
    let world = World::new().await;
    world.emulator.set_rate_limit(Some(RateLimit::new(2, Duration::from_secs(1))));
    let daemon = world.daemon();
    for i in 0..5 {
        world.enqueue(&bge_m3_job(&format!("api-limited-{i}"), 1)).await;
    }
    for i in 0..5 {
        let result = world.wait_for_result(&format!("api-limited-{i}"), WAIT).await;
        assert_eq!(result.status, ResultStatus::Completed);
    }
    assert!(world.emulator.rate_limited_count() > 0, "the API's 429s were exercised");
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_whole_batch_failure_fails_only_its_chunk_and_the_result_says_which() {
    let mut world = World::new().await;
    world.settings.jobs.max_batch_items = 2;
    world.emulator.inject(Fault::fail_batch());
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("partly", 6)).await;
    let result = world.wait_for_result("partly", WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("error");
    assert_eq!(error.code, "batch_failed");
    assert!(error.message.starts_with("1 of 3 batches failed"), "{}", error.message);
    let output = result.result.expect("the finished batches' responses are kept");
    assert_eq!(output.failed_batches.len(), 1);
    let failed = &output.failed_batches[0];
    assert_eq!(failed.items.len(), 2);
    assert_eq!(result.items_failed, 2);
    let successes = output.responses.iter().filter(|r| r.success).count();
    assert_eq!(successes, 4);
    for index in &failed.items {
        assert!(!output.responses[*index].success);
    }
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn results_no_longer_available_end_the_job_with_a_clear_error() {
    let world = World::new().await;
    world.emulator.set_retention(Some(Duration::from_millis(1)));
    let mut settings = world.settings.clone();
    settings.poll.initial_interval_ms = 1500;
    settings.poll.max_interval_ms = 1500;
    let daemon = Daemon::start(settings, &world.emulator);
    world.enqueue(&bge_m3_job("forgotten", 1)).await;
    let result = world.wait_for_result("forgotten", WAIT).await;
    assert_eq!(result.status, ResultStatus::Failed);
    let error = result.error.expect("error");
    assert_eq!((error.code.as_str(), error.http_status), ("results_gone", Some(404)));
    assert!(error.message.starts_with("the Batch API no longer has the batch's results"), "{}", error.message);
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn failed_items_are_resubmitted_once_and_merged() {
    let world = World::new().await;
    world.emulator.inject(Fault::fail_items([1, 3]));
    let daemon = world.daemon();
    let mut job = bge_m3_job("second-chance", 5);
    job["retry_failed_items"] = json!(true);
    world.enqueue(&job).await;
    let result = world.wait_for_result("second-chance", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed);
    assert_eq!(result.items_failed, 0);
    let output = result.result.expect("result");
    assert!(output.responses.iter().all(|r| r.success));
    let refs: Vec<String> =
        output.responses.iter().map(|r| r.external_reference.as_ref().unwrap().get().to_owned()).collect();
    assert_eq!(refs, ["\"q0\"", "\"q1\"", "\"q2\"", "\"q3\"", "\"q4\""], "retried items are back at their own index");
    let submitted: Vec<Option<usize>> = world.emulator.submits().iter().map(|call| call.n_items).collect();
    assert_eq!(submitted, [Some(5), Some(2)], "only the two failed items were resubmitted");
    assert_eq!(result.request_ids.len(), 2);
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn failed_items_are_retried_only_once() {
    let world = World::new().await;
    world.emulator.inject(Fault::fail_items([0]).times(5));
    let daemon = world.daemon();
    let mut job = bge_m3_job("stubborn", 2);
    job["retry_failed_items"] = json!(true);
    world.enqueue(&job).await;
    let result = world.wait_for_result("stubborn", WAIT).await;
    assert_eq!(result.status, ResultStatus::Completed);
    assert_eq!(result.items_failed, 1, "the item failed again and is reported as failed");
    assert_eq!(world.emulator.submits().len(), 2);
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn cancel_during_polling_publishes_one_cancelled_result_with_the_finished_batches() {
    let mut world = World::with_emulator(EmulatorConfig {
        queued_for: Duration::from_millis(100),
        running_for: Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    // One item per batch, and at most one submit every 3 s: batch 0 finishes, batches 1 and 2 wait.
    world.settings.jobs.max_batch_items = 1;
    world.settings.rate_limits.embeddings = 1;
    world.settings.rate_limits.window_secs = 3;
    let daemon = world.daemon();
    world.enqueue(&bge_m3_job("cancel-me", 3)).await;
    let started = Instant::now();
    loop {
        let ledger = world.ledger("cancel-me").await;
        if ledger.get("c0:state").map(String::as_str) == Some("done") {
            break;
        }
        assert!(started.elapsed() < WAIT, "batch 0 never finished: {ledger:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let keys = world.keys.clone();
    let store = batchd_queue::Store::new(
        batchd_queue::connect(redis::Client::open(world.redis.url()).unwrap(), Duration::from_secs(5)).unwrap(),
        keys,
        world.settings.store_settings(),
    );
    let state = store.cancel(&batchd_core::JobId::parse("cancel-me").unwrap(), "operator request").await.unwrap();
    assert_eq!(state, "running");

    let result = world.wait_for_result("cancel-me", WAIT).await;
    assert_eq!(result.status, ResultStatus::Cancelled);
    let error = result.error.expect("error");
    assert_eq!(error.code, "cancelled");
    assert!(error.message.contains("(operator request)"), "{}", error.message);
    assert!(error.message.contains("keep running remotely"), "the result says the remote batch is not cancelled");
    let output = result.result.expect("the finished batch is kept");
    let successes: Vec<bool> = output.responses.iter().map(|r| r.success).collect();
    assert_eq!(successes, [true, false, false]);
    assert_eq!(result.items_failed, 2);

    // Nothing is published or submitted after the cancelled result. Batches 1 and 2 were waiting for the rate
    // limiter; a later job of the same model waits for it too, and its result shows the daemon worked on past the
    // point where they would have gone. Stopping the daemon then finishes whatever was in flight, and with the
    // schedule empty no step is left that could still submit them.
    let submits_at_cancel = world.emulator.submits().len();
    world.enqueue(&bge_m3_job("after-cancel", 1)).await;
    let later = world.wait_for_result("after-cancel", WAIT).await;
    assert_eq!(later.status, ResultStatus::Completed);
    world.wait_until_settled(WAIT).await;
    daemon.stop().await.unwrap();
    assert_eq!(world.results().await.len(), 2, "the cancelled result and the later job's");
    let submits = world.emulator.submits();
    assert_eq!(submits.len(), submits_at_cancel + 1, "only the later job was submitted");
    assert_eq!(submits.last().and_then(|call| call.request_id.as_ref()), later.request_ids.first());
    assert!(world.emulator.calls().iter().all(|call| call.kind != CallKind::Rejected));
    assert_eq!(world.ledger("cancel-me").await["state"], "cancelled");
    assert_eq!(world.scheduled().await, 0);
}

#[tokio::test]
async fn a_job_cancelled_before_it_is_taken_in_is_never_submitted() {
    let world = World::new().await;
    let store = batchd_queue::Store::new(
        batchd_queue::connect(redis::Client::open(world.redis.url()).unwrap(), Duration::from_secs(5)).unwrap(),
        world.keys.clone(),
        world.settings.store_settings(),
    );
    assert_eq!(store.cancel(&batchd_core::JobId::parse("early").unwrap(), "").await.unwrap(), "");
    world.enqueue(&bge_m3_job("early", 2)).await;
    let daemon = world.daemon();
    let result = world.wait_for_result("early", WAIT).await;
    assert_eq!(result.status, ResultStatus::Cancelled);
    assert!(result.result.is_none());
    assert_eq!(result.items_failed, 2);
    assert!(world.emulator.calls().is_empty());
    daemon.stop().await.unwrap();
}
