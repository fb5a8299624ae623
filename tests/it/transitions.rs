//! The fenced transitions of a claimed chunk, in Lua against a real redis-server: each named transition applies
//! only from the chunk states it starts from and only for the holder of the chunk's latest claim, and anything
//! else is answered with a verdict and leaves the namespace as it was. Then the same through [`Store`]: a claim
//! taken over fences out the earlier holder in every write it could make.

use std::collections::BTreeMap;

use batchd_core::{ChunkRef, ChunkState, JobId, Keys};
use batchd_queue::store::{Transition, script_source};
use batchd_queue::{Claim, Intake, NewChunk, Placement, Store, StoreError, StoreSettings, SubmitRetryRecord};
use batchd_tests::{RedisServer, test_connection};
use redis::aio::MultiplexedConnection;

/// The states each transition starts from, written out here (not read from the script) so the test can fail.
fn allowed(transition: Transition) -> &'static [ChunkState] {
    use ChunkState::*;
    match transition {
        Transition::MarkSubmitted | Transition::MarkSubmitRetry | Transition::RecordRemote | Transition::MarkUnsent => {
            &[Submitting]
        }
        Transition::MarkPendingPoll | Transition::MarkPollFailed | Transition::MarkRecreate => &[Polling],
        Transition::Reschedule => &[Pending, Submitting, Polling],
        Transition::Renew | Transition::Release | Transition::NoteCancel | Transition::ForgetCancel => {
            &[Pending, Submitting, Polling, Done, Failed]
        }
        Transition::Forget => &[],
    }
}

/// The arguments after `now` each transition takes.
fn values(transition: Transition) -> Vec<&'static str> {
    match transition {
        Transition::MarkSubmitted => vec!["r-1", "queued", ""],
        Transition::RecordRemote => vec![r#"{"input_file":"file-1"}"#],
        Transition::MarkPendingPoll => vec!["running"],
        Transition::MarkPollFailed | Transition::MarkRecreate => vec!["1", "{}"],
        Transition::MarkSubmitRetry => vec!["pending", "{}", "", ""],
        _ => vec![],
    }
}

/// A namespace with one running one-chunk job `j` whose chunk is in `state`, claimed with token 3, on the schedule
/// at 1,000.
async fn job_in(conn: &mut MultiplexedConnection, state: ChunkState) -> Keys {
    let keys = Keys::new(&format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..10])).expect("namespace");
    let _: () = redis::cmd("HSET")
        .arg(keys.job(&job()))
        .arg(&[
            ("state", "running"),
            ("n_chunks", "1"),
            ("open_chunks", "1"),
            ("c0:state", state.as_str()),
            ("c0:items", "0:1"),
            ("c0:requests", "[{}]"),
            ("c0:attempts", "1"),
            ("c0:n_polls", "0"),
            ("c0:claim", "3"),
        ])
        .query_async(conn)
        .await
        .expect("redis");
    let _: () = redis::cmd("ZADD").arg(keys.schedule()).arg(1_000).arg("j#0").query_async(conn).await.expect("redis");
    keys
}

fn job() -> JobId {
    JobId::parse("j").expect("job id")
}

async fn snapshot(conn: &mut MultiplexedConnection, keys: &Keys) -> (BTreeMap<String, String>, Vec<(String, f64)>) {
    let ledger: BTreeMap<String, String> =
        redis::cmd("HGETALL").arg(keys.job(&job())).query_async(conn).await.expect("redis");
    let schedule: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(keys.schedule())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await
        .expect("redis");
    (ledger, schedule)
}

/// Runs `script` raw; returns its verdict (the first value of its answer).
async fn run(conn: &mut MultiplexedConnection, script: &str, keys: &[String], args: &[String]) -> String {
    let source = script_source(script).expect("script");
    let lua = redis::Script::new(&source);
    let mut invocation = lua.prepare_invoke();
    for key in keys {
        invocation.key(key);
    }
    for arg in args {
        invocation.arg(arg);
    }
    let answer: redis::Value = invocation.invoke_async(conn).await.unwrap_or_else(|e| panic!("{script}: {e}"));
    match answer {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            other => format!("{other:?}"),
        },
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        other => format!("{other:?}"),
    }
}

async fn transition(conn: &mut MultiplexedConnection, keys: &Keys, transition: Transition, token: u64) -> String {
    let mut args: Vec<String> = vec![
        transition.as_str().to_owned(),
        "j#0".to_owned(),
        "0".to_owned(),
        token.to_string(),
        if transition == Transition::Forget { String::new() } else { "7000".to_owned() },
        "5000".to_owned(),
    ];
    args.extend(values(transition).into_iter().map(str::to_owned));
    run(conn, "transition", &[keys.job(&job()), keys.schedule()], &args).await
}

#[tokio::test]
async fn every_transition_applies_only_from_its_starting_states_and_only_for_the_latest_claim() {
    let redis = RedisServer::start().await;
    let mut conn = test_connection(&redis.url()).await;
    for &name in Transition::ALL {
        for state in ChunkState::ALL {
            let keys = job_in(&mut conn, state).await;
            let before = snapshot(&mut conn, &keys).await;
            let stale = transition(&mut conn, &keys, name, 2).await;
            // `forget` takes any claim (it applies only to a finished job, where unscheduling is always right).
            let expected = if name == Transition::Forget { "refused" } else { "stale" };
            assert_eq!(stale, expected, "{} from {} with an earlier claim", name.as_str(), state.as_str());
            assert_eq!(snapshot(&mut conn, &keys).await, before, "a stale {} wrote", name.as_str());

            let verdict = transition(&mut conn, &keys, name, 3).await;
            let after = snapshot(&mut conn, &keys).await;
            if allowed(name).contains(&state) {
                assert_eq!(verdict, "applied", "{} from {}", name.as_str(), state.as_str());
                assert_eq!(after.1, [("j#0".to_owned(), 7_000.0)], "{} schedules the chunk", name.as_str());
            } else {
                assert_eq!(verdict, "refused", "{} from {}", name.as_str(), state.as_str());
                assert_eq!(after, before, "a refused {} wrote", name.as_str());
            }
        }
    }
}

#[tokio::test]
async fn a_finished_job_only_loses_its_schedule_member_and_a_stale_writer_still_hears_stale() {
    let redis = RedisServer::start().await;
    let mut conn = test_connection(&redis.url()).await;
    for &name in Transition::ALL {
        let keys = job_in(&mut conn, ChunkState::Polling).await;
        let _: () = redis::cmd("HSET")
            .arg(keys.job(&job()))
            .arg("state")
            .arg("completed")
            .query_async(&mut conn)
            .await
            .expect("redis");
        let before = snapshot(&mut conn, &keys).await;
        if name != Transition::Forget {
            assert_eq!(transition(&mut conn, &keys, name, 1).await, "stale", "{}", name.as_str());
            assert_eq!(snapshot(&mut conn, &keys).await, before, "{}", name.as_str());
        }
        assert_eq!(transition(&mut conn, &keys, name, 3).await, "gone", "{}", name.as_str());
        assert_eq!(snapshot(&mut conn, &keys).await, (before.0, vec![]), "{}", name.as_str());
    }
}

#[tokio::test]
async fn finishing_submitting_and_splitting_a_chunk_are_fenced_too() {
    let redis = RedisServer::start().await;
    let mut conn = test_connection(&redis.url()).await;
    let done = |token: &str| -> Vec<String> {
        ["j#0", "0", "done", "{}", "5000", "6000", token].iter().map(|v| (*v).to_owned()).collect()
    };
    let split = |token: &str| -> Vec<String> {
        ["j", "5000", "0", "", "0", token, "0:1", "", "[{}]"].iter().map(|v| (*v).to_owned()).collect()
    };
    for state in ChunkState::ALL {
        let name = state.as_str();
        let keys = job_in(&mut conn, state).await;
        let ledger_and_schedule = [keys.job(&job()), keys.schedule()];
        let before = snapshot(&mut conn, &keys).await;
        assert_eq!(run(&mut conn, "chunk_done", &ledger_and_schedule, &done("2")).await, "stale", "{name}");
        assert_eq!(run(&mut conn, "add_chunks", &ledger_and_schedule, &split("4")).await, "stale", "{name}");
        let submit = [keys.job(&job()), keys.cancel(&job())];
        let begin = |token: &str| ["0".to_owned(), "5000".to_owned(), token.to_owned()];
        assert_eq!(run(&mut conn, "begin_submit", &submit, &begin("2")).await, "stale", "{name}");
        assert_eq!(snapshot(&mut conn, &keys).await, before, "{name}: a stale writer wrote");

        let finishes =
            matches!(state, ChunkState::Submitting | ChunkState::Polling | ChunkState::Done | ChunkState::Failed);
        let verdict = run(&mut conn, "chunk_done", &ledger_and_schedule, &done("3")).await;
        assert_eq!(verdict, if finishes { "applied" } else { "refused" }, "chunk_done from {name}");

        let keys = job_in(&mut conn, state).await;
        let ledger_and_schedule = [keys.job(&job()), keys.schedule()];
        let verdict = run(&mut conn, "add_chunks", &ledger_and_schedule, &split("3")).await;
        assert_eq!(verdict, if state == ChunkState::Submitting { "added" } else { "refused" }, "a split from {name}");

        let keys = job_in(&mut conn, state).await;
        let submit = [keys.job(&job()), keys.cancel(&job())];
        let verdict = run(&mut conn, "begin_submit", &submit, &begin("3")).await;
        let starts = matches!(state, ChunkState::Pending | ChunkState::Submitting);
        let expected = match state {
            ChunkState::Pending => "submit",
            ChunkState::Submitting => "resubmit",
            _ => "skip",
        };
        assert_eq!(verdict, expected, "begin_submit from {name} (starts: {starts})");
    }
}

fn store(redis: &RedisServer, keys: &Keys) -> Store {
    let conn = batchd_queue::connect(redis::Client::open(redis.url()).expect("url"), std::time::Duration::from_secs(5))
        .expect("connect");
    Store::new(
        conn,
        keys.clone(),
        StoreSettings { lease: std::time::Duration::from_secs(60), ..StoreSettings::default() },
    )
}

/// Job `id` of two items taken in with `plan`, its first chunk marked `submitting` for the take-in to post (its lease
/// ends a minute after acceptance); the job and the time of its acceptance.
async fn accepted(store: &Store, keys: &Keys, id: &str, plan: &[(usize, usize)]) -> (batchd_core::Job, u64) {
    let job = format!(r#"{{"id":"{id}","model":"@cf/baai/bge-m3","requests":[{{"text":"a"}},{{"text":"b"}}]}}"#);
    let fields = vec![("job".to_owned(), job.into_bytes())];
    let job = batchd_core::Job::decode(&fields, "1-0", &batchd_core::JobLimits::default(), keys).expect("job");
    let plan = plan.to_vec();
    let now = store.now().await.expect("now");
    let intake = Intake {
        entry_id: "1-0",
        plan: &plan,
        now,
        deadline_at: now + 3_600_000,
        first_due: now + 60_000,
        retry_failed_items: false,
        submit_first: true,
        references: &[],
        pack: None,
    };
    assert_eq!(store.accept(&job, &intake).await.expect("accept"), batchd_queue::Accepted::New);
    (job, now)
}

fn is_stale<T: std::fmt::Debug>(result: Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::StaleClaim { .. }))
}

#[tokio::test]
async fn a_claim_taken_over_fences_out_every_write_of_its_earlier_holder() {
    let redis = RedisServer::start().await;
    let mut conn = test_connection(&redis.url()).await;
    let keys = Keys::new(&format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..10])).expect("namespace");
    let store = store(&redis, &keys);
    let (job, now) = accepted(&store, &keys, "f", &[(0, 2)]).await;
    let first = Claim::first(job.id.clone());

    // The take-in's lease ends while it is paused; another replica claims the chunk.
    let claimed = store.claim_due(now + 61_000, 10).await.expect("claim");
    let found: Vec<(ChunkRef, u64)> = claimed.claims.iter().map(|claim| (claim.chunk.clone(), claim.token)).collect();
    assert_eq!(found, [(ChunkRef::new(job.id.clone(), 0), 2)]);
    let view = claimed.claims[0].view.as_deref().expect("the claim reads the chunk's view");
    assert_eq!(view.claim, 2, "the view carries the new claim's token");
    let second = claimed.claims[0].clone();
    assert!(store.claim_due(now + 61_000, 10).await.expect("claim").claims.is_empty(), "leased now");

    // The paused holder comes back: every write it could make is refused, and nothing changes.
    let before = snapshot_of(&mut conn, &keys, "f").await;
    let due = now + 1_000;
    assert!(is_stale(store.mark_submitted(&first, "r-old", "queued", None, due).await));
    let retry =
        SubmitRetryRecord { state: ChunkState::Pending, last_error: "{}".into(), attempts: None, looked: false };
    assert!(is_stale(store.mark_submit_retry(&first, &retry, due).await));
    assert!(is_stale(store.reschedule(&first, due).await));
    assert!(is_stale(store.renew(&first, due).await));
    assert!(is_stale(store.begin_submit(&first, now).await));
    assert!(is_stale(store.chunk_done(&first, ChunkState::Failed, "{}", now).await));
    let piece = |start| NewChunk {
        placement: Placement::Range { start, len: 1 },
        requests: vec![serde_json::value::RawValue::from_string("{}".into()).expect("json")],
    };
    assert!(is_stale(store.add_chunks(&first, due, true, None, &[piece(0), piece(1)]).await));
    assert_eq!(store.release(std::slice::from_ref(&first), due).await.expect("release"), 0);
    store.forget(&first).await.expect("forget leaves a live job alone");
    assert_eq!(snapshot_of(&mut conn, &keys, "f").await, before, "the earlier holder wrote nothing");

    // The new holder carries on: it renews, records the submit, and polls.
    assert!(store.renew(&second, now + 200_000).await.expect("renew"));
    let score: f64 = redis::cmd("ZSCORE").arg(keys.schedule()).arg("f#0").query_async(&mut conn).await.expect("redis");
    assert_eq!(score as u64, now + 200_000, "renewed");
    assert!(matches!(
        store.begin_submit(&second, now).await.expect("begin"),
        batchd_queue::SubmitTicket::Go { resubmit: true, .. }
    ));
    assert!(store.mark_submitted(&second, "r-new", "queued", None, due).await.expect("submitted").applied());
    assert!(
        is_stale(store.mark_submitted(&second, "r-new", "queued", None, due).await),
        "not twice: it is polling now"
    );
    assert!(store.mark_pending_poll(&second, "running", due).await.expect("polled"));
    assert!(store.mark_poll_failed(&second, 1, "{}", due).await.expect("poll failed"));
    let ledger: BTreeMap<String, String> =
        redis::cmd("HGETALL").arg(keys.job(&job.id)).query_async(&mut conn).await.expect("redis");
    assert_eq!(ledger["c0:request_id"], "r-new");
    assert_eq!(ledger["c0:claim"], "2");
    assert_eq!(store.chunk_done(&second, ChunkState::Done, "{}", now).await.expect("done"), Some(0));
}

/// Issue 23: the cancel function leaves a chunk whose submit is in flight on its lease (a claim would fence the
/// submit out, and its batch would run on unrecorded), and makes due a chunk whose uncertain submit waits to be
/// resumed; the daemon records when it first acted on the cancel once, and the transition that ends a submit
/// answers with it.
#[tokio::test]
async fn a_cancel_leaves_a_submit_in_flight_on_its_lease_and_the_first_time_it_was_seen_is_kept() {
    let redis = RedisServer::start().await;
    let mut conn = test_connection(&redis.url()).await;
    let keys = Keys::new(&format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..10])).expect("namespace");
    let store = store(&redis, &keys);
    let (job, now) = accepted(&store, &keys, "c", &[(0, 1), (1, 1)]).await;
    let first = Claim::first(job.id.clone());
    let score = async |conn: &mut MultiplexedConnection, member: &str| -> u64 {
        let score: f64 = redis::cmd("ZSCORE").arg(keys.schedule()).arg(member).query_async(conn).await.expect("redis");
        score as u64
    };

    // Chunk 0's first submit is in flight (the take-in posts it): the cancel leaves its lease; chunk 1 is due now.
    assert_eq!(store.cancel(&job.id, "not needed").await.expect("cancel"), "accepted");
    assert_eq!(score(&mut conn, "c#0").await, now + 60_000, "the submit in flight keeps its lease");
    assert_eq!(score(&mut conn, "c#1").await, 0, "the unsent chunk is due at once");

    // Its outcome is unknown: it waits, submitting, to be resumed; a cancel now makes it due to be looked up.
    let retry =
        SubmitRetryRecord { state: ChunkState::Submitting, last_error: "{}".into(), attempts: None, looked: false };
    let answered = store.mark_submit_retry(&first, &retry, now + 30_000).await.expect("retry");
    assert_eq!(answered, batchd_queue::Fenced::Applied { cancel_seen_at: None }, "no step has acted on it yet");
    let (ledger, _) = snapshot_of(&mut conn, &keys, "c").await;
    assert_eq!((ledger["c0:attempts"].as_str(), ledger["c0:uncertain"].as_str()), ("1", "1"));
    store.cancel(&job.id, "not needed").await.expect("cancel");
    assert_eq!(score(&mut conn, "c#0").await, 0, "no submit in flight: due at once");

    // A step acts on the cancel: when is recorded once, read through the claim's view, and answered by transitions.
    let claimed = store.claim_due(now + 1, 10).await.expect("claim");
    let claim = claimed.claims.iter().find(|claim| claim.chunk.index == 0).expect("chunk 0 claimed").clone();
    let view = claim.view.as_deref().expect("view");
    assert_eq!((view.cancel_requested.as_deref(), view.cancel_seen_at), (Some("not needed"), None));
    let seen_at = store.note_cancel(&claim, now + 60_000).await.expect("note").expect("the job runs");
    assert!(seen_at >= now, "Redis's time");
    let other = claimed.claims.iter().find(|claim| claim.chunk.index == 1).expect("chunk 1 claimed");
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert_eq!(store.note_cancel(other, now + 60_000).await.expect("note"), Some(seen_at), "recorded once");
    assert!(is_stale(store.note_cancel(&first, now + 60_000).await), "under the claim only");
    let view = store.load_chunk(&claim.chunk).await.expect("load").expect("ledger");
    assert_eq!(view.cancel_seen_at, Some(seen_at));
    // Withdrawn and requested again: the wait starts afresh.
    assert!(store.forget_cancel(&claim, now + 60_000).await.expect("forget"));
    assert_eq!(store.load_chunk(&claim.chunk).await.expect("load").expect("ledger").cancel_seen_at, None);
    let again = store.note_cancel(&claim, now + 60_000).await.expect("note").expect("the job runs");
    assert!(again >= seen_at);
    assert!(store.mark_unsent(&claim, now).await.expect("unsent"), "nothing found: never sent");
    assert_eq!(snapshot_of(&mut conn, &keys, "c").await.0["c0:state"], "pending");
    assert!(is_stale(store.mark_unsent(&claim, now).await), "only from submitting");
    assert!(matches!(store.begin_submit(&claim, now).await.expect("begin"), batchd_queue::SubmitTicket::Cancelled));
}

async fn snapshot_of(
    conn: &mut MultiplexedConnection,
    keys: &Keys,
    job: &str,
) -> (BTreeMap<String, String>, Vec<(String, f64)>) {
    let ledger: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(keys.job(&JobId::parse(job).expect("job id")))
        .query_async(conn)
        .await
        .expect("redis");
    let schedule: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(keys.schedule())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await
        .expect("redis");
    (ledger, schedule)
}

/// Two in-process daemons on a 1 s lease, and an API whose submits and first polls answer after 2.5 s: the step
/// holding each chunk renews its lease while it waits, so the other daemon never takes the chunk over. (In-process
/// daemons skip the configuration check `schedule.lease_secs > cloudflare.request_timeout_secs`, which keeps
/// every single request within the lease in production; here a request may outlast it, as a download will.)
#[tokio::test]
async fn a_step_twice_as_long_as_its_lease_renews_it_and_is_not_taken_over() {
    use batchd_emulator::{Calls, Fault, FaultKind};
    let world = batchd_tests::World::new().await;
    let mut settings = world.settings.clone();
    settings.schedule.lease_secs = 1;
    settings.cloudflare.request_timeout_secs = 10;
    let slow = |calls| Fault { kind: FaultKind::Delay { millis: 2_500 }, calls, times: 3 };
    world.emulator.inject(slow(Calls::Submit));
    world.emulator.inject(slow(Calls::Poll));
    let first = batchd_tests::Daemon::start(settings.clone(), &world.emulator);
    let second = batchd_tests::Daemon::start(settings, &world.emulator);
    let ids: Vec<String> = (0..3).map(|i| format!("slow-{i}")).collect();
    for id in &ids {
        world.enqueue(&batchd_tests::bge_m3_job(id, 2)).await;
    }
    let results = world.wait_for_results(3, std::time::Duration::from_secs(60)).await;
    first.stop().await.expect("first daemon");
    second.stop().await.expect("second daemon");
    assert!(results.iter().all(|entry| entry["status"] == "completed"), "{results:?}");
    assert!(world.emulator.pending_faults().is_empty(), "every slow reply was served");
    let accepted: Vec<_> =
        world.emulator.submits().into_iter().filter(|call| (200..300).contains(&call.http_status)).collect();
    assert_eq!(accepted.len(), 3, "one submit per chunk: {accepted:?}");
    for id in &ids {
        let ledger = world.ledger(id).await;
        assert_eq!(ledger.get("possible_duplicate_submits").map(String::as_str).unwrap_or("0"), "0", "{id}");
    }
}
