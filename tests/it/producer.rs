//! The Rust producer library against a live daemon: validation before writing, ids, status, and a results reader
//! that loses nothing when it is killed and restarted, with duplicates only as documented (an entry comes again only
//! if it was not acknowledged, and then flagged `redelivered`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use batchd_core::JobId;
use batchd_emulator::EmulatorConfig;
use batchd_producer::{
    CancelOutcome, Delivery, JobState, NewJob, Producer, ProducerError, ReaderOptions, ResultReader, ResultStatus,
};
use batchd_tests::World;
use redis::AsyncCommands;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn embedding_job(i: usize) -> NewJob {
    NewJob::new("@cf/baai/bge-m3", vec![json!({"text": format!("text {i}")})]).with_id(format!("p-{i}"))
}

async fn producer(world: &World) -> Producer {
    Producer::connect(world.settings.redis.url.expose(), &world.settings.redis.namespace).await.expect("connect")
}

#[tokio::test]
async fn enqueue_validates_first_and_status_and_result_follow_the_job() {
    let world = World::new().await;
    let producer = producer(&world).await;
    let mut conn = world.conn.clone();

    // Invalid jobs are refused with the daemon's own message, and nothing is written.
    let error = producer.enqueue(&NewJob::new("@cf/baai/bge-m3", vec![])).await.unwrap_err();
    assert!(matches!(error, ProducerError::Invalid(_)), "{error:?}");
    assert_eq!(error.to_string(), "invalid job: invalid `requests`: must not be empty");
    let error = producer.enqueue(&embedding_job(0).with_reply_to("other-app:stream")).await.unwrap_err();
    assert!(error.to_string().starts_with("invalid job: invalid `reply_to`"), "{error}");
    let error = producer.enqueue_json(r#"{"model":"@cf/baai/bge-m3","requests":[{}],"modle":1}"#).await.unwrap_err();
    assert!(error.to_string().contains("unknown field \"modle\""), "{error}");
    let batch = vec![embedding_job(1), NewJob::new("@cf/nope/../x", vec![json!({})]), embedding_job(2)];
    let error = producer.enqueue_many(&batch).await.unwrap_err();
    assert!(matches!(error, ProducerError::InvalidInBatch { index: 1, .. }), "{error:?}");
    assert_eq!(conn.xlen::<_, usize>(world.keys.submit()).await.unwrap(), 0, "nothing of an invalid batch is written");
    let error = Producer::connect("redis://127.0.0.1:1", "batchd").await.unwrap_err();
    assert!(error.to_string().starts_with("cannot reach Redis at redis://127.0.0.1:1"), "{error}");
    assert!(matches!(Producer::connect(&world.redis.url(), "a:b").await, Err(ProducerError::Namespace(_))));

    // A job with an id keeps it; one without gets the entry id. Nothing is known before the daemon takes them in.
    let with_id = producer.enqueue(&embedding_job(7).with_metadata(json!({"tenant": "acme"}))).await.unwrap();
    assert_eq!(with_id.as_str(), "p-7");
    let without_id = producer.enqueue(&NewJob::new("@cf/baai/bge-m3", vec![json!({"text": "x"})])).await.unwrap();
    let entries: Vec<(String, HashMap<String, String>)> =
        redis::cmd("XRANGE").arg(world.keys.submit()).arg("-").arg("+").query_async(&mut conn).await.unwrap();
    assert_eq!(entries[1].0, without_id.as_str(), "a job without id is known by its entry id");
    assert_eq!(producer.status(&with_id).await.unwrap(), None);
    // Enqueueing the same id again is the same job.
    producer.enqueue(&embedding_job(7)).await.unwrap();

    let daemon = world.daemon();
    world.wait_for_result("p-7", WAIT).await;
    world.wait_for_result(without_id.as_str(), WAIT).await;
    let status = producer.status(&with_id).await.unwrap().expect("a ledger");
    assert_eq!(status.state, JobState::Completed);
    assert_eq!((status.n_items, status.items_done(), status.chunks.len()), (1, 1, 1));
    assert!(status.result_entry.is_some() && status.accepted_at.is_some() && status.finished_at.is_some());
    let started = Instant::now();
    while producer.status(&with_id).await.unwrap().unwrap().duplicates != 1 {
        assert!(started.elapsed() < WAIT, "the second entry of p-7 is counted as a duplicate");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let result = producer.result(&with_id).await.unwrap().expect("the result entry");
    assert_eq!(result.status, ResultStatus::Completed);
    assert_eq!(result.metadata.map(|m| m.get().to_owned()).as_deref(), Some(r#"{"tenant":"acme"}"#));
    assert_eq!(world.results().await.len(), 2, "one result per job, none for the duplicate");
    assert_eq!(producer.status(&JobId::parse("never-enqueued").unwrap()).await.unwrap(), None);
    daemon.stop().await.unwrap();
}

/// What the application saw, in order: deliveries and acknowledgements.
#[derive(Debug, Clone)]
enum Event {
    Delivered { entry_id: String, job_id: String, redelivered: bool },
    Acked(Vec<String>),
}

type Log = Arc<Mutex<Vec<Event>>>;

/// Handles one batch the way an application does: record (the "work"), then acknowledge.
async fn handle(reader: &mut ResultReader, batch: &[Delivery], log: &Log, ack: bool) {
    log.lock().expect("log lock").extend(batch.iter().map(|delivery| Event::Delivered {
        entry_id: delivery.entry_id.clone(),
        job_id: delivery.job_id().to_owned(),
        redelivered: delivery.redelivered,
    }));
    if ack {
        reader.ack_all(batch).await.expect("ack");
        log.lock().expect("log lock").push(Event::Acked(batch.iter().map(|d| d.entry_id.clone()).collect()));
    }
}

fn n_delivered(log: &Log) -> usize {
    log.lock().expect("log lock").iter().filter(|event| matches!(event, Event::Delivered { .. })).count()
}

fn options(consumer: &str) -> ReaderOptions {
    let mut options = ReaderOptions::new("billing", consumer);
    options.count = 50;
    options.block = Duration::from_millis(200);
    options
}

#[tokio::test]
async fn a_thousand_results_survive_a_reader_killed_and_restarted_halfway() {
    const N: usize = 1000;
    // Batches take ~0.2 s, so results are still being published while the reader is killed and restarted.
    let world = World::with_emulator(EmulatorConfig {
        queued_for: Duration::from_millis(100),
        running_for: Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    let producer = producer(&world).await;
    let jobs: Vec<NewJob> = (0..N).map(embedding_job).collect();
    let ids = producer.enqueue_many(&jobs).await.expect("enqueue_many");
    let expected: Vec<String> = (0..N).map(|i| format!("p-{i}")).collect();
    assert_eq!(ids.iter().map(|id| id.to_string()).collect::<Vec<_>>(), expected);
    let daemon = world.daemon();
    let log: Log = Arc::default();

    // Phase 1: consumer w1 handles about 300 results, then crashes after handling a batch it never acknowledged.
    let mut reader = producer.results_reader(options("w1")).await.unwrap();
    let started = Instant::now();
    let unacked: Vec<String> = loop {
        let batch = reader.next_batch().await.unwrap();
        let crash = n_delivered(&log) + batch.len() >= 300;
        handle(&mut reader, &batch, &log, !crash).await;
        if crash {
            break batch.iter().map(|d| d.entry_id.clone()).collect();
        }
        assert!(started.elapsed() < Duration::from_secs(120), "phase 1 stalled at {}", n_delivered(&log));
    };
    drop(reader);
    assert!(!unacked.is_empty());

    // Phase 2: w1 restarts; its own pending entries come first, flagged, then it goes on until it is killed while
    // reading (the task is aborted wherever it is, possibly inside XREADGROUP).
    let mut reader = producer.results_reader(options("w1")).await.unwrap();
    let first = reader.next_batch().await.unwrap();
    assert_eq!(first.iter().map(|d| d.entry_id.clone()).collect::<Vec<_>>(), unacked, "own pending entries first");
    assert!(first.iter().all(|d| d.redelivered));
    handle(&mut reader, &first, &log, true).await;
    let task_log = log.clone();
    let (stranded_tx, stranded_rx) = tokio::sync::oneshot::channel::<Vec<String>>();
    let mut stranded_tx = Some(stranded_tx);
    let (stream, conn) = (world.keys.results(), world.conn.clone());
    let task = tokio::spawn(async move {
        loop {
            let batch = reader.next_batch().await.unwrap();
            handle(&mut reader, &batch, &task_log, false).await;
            if n_delivered(&task_log) >= 600 && !batch.is_empty() {
                // Handled, never acknowledged: the process hangs here until it is killed.
                let ids: Vec<String> = batch.iter().map(|d| d.entry_id.clone()).collect();
                if let Some(tx) = stranded_tx.take() {
                    let _ = tx.send(ids);
                }
                std::future::pending::<()>().await;
            }
            // The acknowledgement and its log line happen together (a task of their own that the abort cannot cut
            // in two), so the log knows exactly what Redis acknowledged.
            let (stream, mut conn, log) = (stream.clone(), conn.clone(), task_log.clone());
            let ids: Vec<String> = batch.iter().map(|d| d.entry_id.clone()).collect();
            let ack = tokio::spawn(async move {
                if ids.is_empty() {
                    return;
                }
                let _: i64 = conn.xack(&stream, "billing", &ids).await.expect("xack");
                log.lock().unwrap().push(Event::Acked(ids));
            });
            ack.await.expect("ack task");
        }
    });
    let stranded = tokio::time::timeout(Duration::from_secs(120), stranded_rx)
        .await
        .unwrap_or_else(|_| panic!("phase 2 stalled at {}", n_delivered(&log)))
        .expect("phase 2 task");
    task.abort();
    let _ = task.await;
    let published_at_kill = world.results().await.len();

    // Phase 3: w1 never comes back; w2 claims what w1 left pending and reads the rest.
    let mut options = options("w2");
    options.claim_min_idle = Duration::from_millis(500);
    options.claim_interval = Duration::from_millis(100);
    let mut reader = producer.results_reader(options).await.unwrap();
    let started = Instant::now();
    loop {
        let acked_jobs = acked_job_ids(&log);
        if acked_jobs.len() == N {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "phase 3 stalled: {} of {N} acknowledged",
            acked_jobs.len()
        );
        let batch = reader.next_batch().await.unwrap();
        handle(&mut reader, &batch, &log, true).await;
    }
    daemon.stop().await.unwrap();

    // Every job's result was read and acknowledged; one result entry per job.
    let results = world.results().await;
    assert_eq!(results.len(), N);
    let acked = acked_job_ids(&log);
    assert_eq!(acked, expected.iter().cloned().collect::<HashSet<_>>());
    // Duplicates only within the rule: a second delivery is flagged, and never follows an acknowledgement.
    let mut seen: HashSet<String> = HashSet::new();
    let mut acked_entries: HashSet<String> = HashSet::new();
    let mut n_redelivered = 0;
    for event in log.lock().unwrap().iter() {
        match event {
            Event::Delivered { entry_id, redelivered, job_id } => {
                assert!(!acked_entries.contains(entry_id), "{entry_id} ({job_id}) delivered after it was acknowledged");
                if !seen.insert(entry_id.clone()) {
                    assert!(redelivered, "{entry_id} ({job_id}) delivered twice without the redelivered flag");
                    n_redelivered += 1;
                }
            }
            Event::Acked(ids) => acked_entries.extend(ids.iter().cloned()),
        }
    }
    assert!(n_redelivered >= unacked.len() + stranded.len(), "both unacknowledged batches came again");
    let claimed: HashSet<&String> = stranded.iter().collect();
    let w2_got_them = log
        .lock()
        .unwrap()
        .iter()
        .filter(
            |event| matches!(event, Event::Delivered { entry_id, redelivered: true, .. } if claimed.contains(entry_id)),
        )
        .count();
    assert_eq!(w2_got_them, stranded.len(), "w2 claimed what the killed w1 held");
    let published_while_reading = world.results().await.len();
    eprintln!(
        "{} deliveries for {N} results, {n_redelivered} redelivered ({} unacknowledged at the crash, {} held by the \
         killed reader); {} results when the reader was killed",
        n_delivered(&log),
        unacked.len(),
        stranded.len(),
        published_at_kill
    );
    assert!(published_at_kill < published_while_reading, "results were still being published during the restarts");
    let pending: redis::Value = redis::cmd("XPENDING")
        .arg(world.keys.results())
        .arg("billing")
        .query_async(&mut world.conn.clone())
        .await
        .unwrap();
    let redis::Value::Array(summary) = pending else { panic!("XPENDING summary: {pending:?}") };
    assert_eq!(summary.first(), Some(&redis::Value::Int(0)), "nothing left pending");
}

fn acked_job_ids(log: &Log) -> HashSet<String> {
    let events = log.lock().expect("log lock");
    let job_of: HashMap<&str, &str> = events
        .iter()
        .filter_map(|event| match event {
            Event::Delivered { entry_id, job_id, .. } => Some((entry_id.as_str(), job_id.as_str())),
            Event::Acked(_) => None,
        })
        .collect();
    events
        .iter()
        .filter_map(|event| match event {
            Event::Acked(ids) => Some(ids.iter().filter_map(|id| job_of.get(id.as_str()).map(|job| job.to_string()))),
            Event::Delivered { .. } => None,
        })
        .flatten()
        .collect()
}

#[tokio::test]
async fn a_reader_acknowledges_entries_trimmed_while_pending_and_counts_them() {
    let world = World::new().await;
    let producer = producer(&world).await;
    let mut conn = world.conn.clone();
    let mut reader = producer.results_reader(options("w1")).await.unwrap();
    for i in 0..3 {
        let _: String =
            conn.xadd(world.keys.results(), "*", &[("v", "1"), ("job_id", &format!("t-{i}"))]).await.unwrap();
    }
    let batch = reader.next_batch().await.unwrap();
    assert_eq!(batch.len(), 3);
    assert!(batch.iter().all(|d| !d.redelivered));
    // The stream rolls past two of them before they are acknowledged; the reader restarts.
    let _: i64 =
        redis::cmd("XTRIM").arg(world.keys.results()).arg("MAXLEN").arg(1).query_async(&mut conn).await.unwrap();
    drop(reader);
    let mut reader = producer.results_reader(options("w1")).await.unwrap();
    let batch = reader.next_batch().await.unwrap();
    assert_eq!(batch.iter().map(|d| d.job_id()).collect::<Vec<_>>(), ["t-2"]);
    assert!(batch[0].redelivered);
    assert_eq!(reader.n_trimmed(), 2);
    reader.ack_all(&batch).await.unwrap();
    assert!(reader.next_batch().await.unwrap().is_empty());

    // A reader refuses a stream outside its namespace.
    let mut bad = options("w1");
    bad.stream = Some("other:results".into());
    let error = producer.results_reader(bad).await.unwrap_err();
    assert!(matches!(error, ProducerError::Option(_)), "{error:?}");
}

#[tokio::test]
async fn cancel_requests_are_honoured_by_the_daemon() {
    let world = World::new().await;
    let producer = producer(&world).await;
    // Batches stay queued, so a submitted job keeps running until it is cancelled.
    world.emulator.set_timing(Duration::from_secs(600), Duration::from_secs(600));
    let daemon = world.daemon();

    // Cancelled before it was enqueued: never submitted.
    let early = JobId::parse("c-early").unwrap();
    assert_eq!(producer.cancel(&early, "changed my mind").await.unwrap(), CancelOutcome::Requested(None));
    producer.enqueue(&embedding_job(0).with_id("c-early")).await.unwrap();
    let result = world.wait_for_result("c-early", WAIT).await;
    assert_eq!(result.status, ResultStatus::Cancelled);
    assert!(result.error.expect("an error").message.contains("changed my mind"));
    assert!(world.emulator.submits().is_empty(), "a job cancelled before intake is never submitted");

    // Running: cancelled at its next step.
    let running = producer.enqueue(&embedding_job(1).with_id("c-run")).await.unwrap();
    let started = Instant::now();
    while producer.status(&running).await.unwrap().map(|s| s.state) != Some(JobState::Running) {
        assert!(started.elapsed() < WAIT, "c-run never ran");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(producer.cancel(&running, "").await.unwrap(), CancelOutcome::Requested(Some(JobState::Running)));
    assert_eq!(world.wait_for_result("c-run", WAIT).await.status, ResultStatus::Cancelled);

    // Finished: left alone.
    assert_eq!(producer.cancel(&early, "again").await.unwrap(), CancelOutcome::AlreadyFinished(JobState::Cancelled));
    assert_eq!(world.results().await.len(), 2);
    daemon.stop().await.unwrap();
}
