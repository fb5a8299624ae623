//! Workers AI batch events and the Queues pull consumer, over HTTP: event shapes, leases, acks, retries, event
//! faults, errors, the control API and the binary's flags.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use batchd_emulator::{
    AckWarnings, Calls, DurationRange, EmulatorConfig, EmulatorHandle, EventBody, EventFaults, EventsConfig, Fault,
    PullOrder, QueueCallKind, RateLimit,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    DEADLINE, FOREVER, LLAMA, Reply,
    control::{control_get, control_post, control_url},
    poll, post_raw, start, submit,
};

/// An emulator with events on (`events`) whose batches stay pending until the test changes the timing.
async fn start_events(events: EventsConfig) -> EmulatorHandle {
    start(EmulatorConfig {
        queued_for: FOREVER,
        running_for: FOREVER,
        events: Some(events),
        ..EmulatorConfig::default()
    })
    .await
}

fn queue_action_url(emulator: &EmulatorHandle, action: &str) -> String {
    format!("{}/messages/{action}", emulator.queue_url().expect("events are on"))
}

/// `POST .../messages/pull` with `body`, as the queue's token.
async fn pull_raw(emulator: &EmulatorHandle, body: &Value) -> Reply {
    post_raw(&queue_action_url(emulator, "pull"), &emulator.queue_token(), body.to_string()).await.expect("a reply")
}

/// Pulls and returns the messages, asserting the reply's envelope.
async fn pull(emulator: &EmulatorHandle, batch_size: u64, visibility_timeout_ms: u64) -> Vec<Value> {
    let reply =
        pull_raw(emulator, &json!({ "batch_size": batch_size, "visibility_timeout_ms": visibility_timeout_ms })).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(reply.body["success"], true);
    assert_eq!(reply.body["errors"], json!([]));
    assert_eq!(reply.body["messages"], json!([]));
    reply.body["result"]["messages"].as_array().expect("messages").clone()
}

/// Pulls until `n` messages came (leasing each for `visibility_timeout_ms`), failing after [`DEADLINE`].
pub(crate) async fn pull_until(emulator: &EmulatorHandle, n: usize, visibility_timeout_ms: u64) -> Vec<Value> {
    let started = Instant::now();
    let mut messages = Vec::new();
    while messages.len() < n {
        assert!(started.elapsed() < DEADLINE, "only {} of {n} messages came: {messages:?}", messages.len());
        let pulled = pull(emulator, 100, visibility_timeout_ms).await;
        if pulled.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        messages.extend(pulled);
    }
    messages
}

/// `POST .../messages/ack` with `body`.
async fn ack(emulator: &EmulatorHandle, body: &Value) -> Reply {
    post_raw(&queue_action_url(emulator, "ack"), &emulator.queue_token(), body.to_string()).await.expect("a reply")
}

/// The event a base64 `json` message carries.
pub(crate) fn event_of(message: &Value) -> Value {
    assert_eq!(message["metadata"]["CF-Content-Type"], "json", "{message}");
    let body = message["body"].as_str().expect("body is a string");
    let bytes = STANDARD.decode(body).expect("body is base64");
    serde_json::from_slice(&bytes).expect("body decodes to JSON")
}

pub(crate) fn event_type(message: &Value) -> String {
    event_of(message)["type"].as_str().expect("type").to_owned()
}

pub(crate) fn request_id_of(message: &Value) -> String {
    event_of(message)["payload"]["requestId"].as_str().expect("requestId").to_owned()
}

fn lease(message: &Value) -> String {
    message["lease_id"].as_str().expect("lease_id").to_owned()
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_millis() as u64
}

fn prompt() -> Value {
    json!([{ "prompt": "x" }])
}

#[tokio::test]
async fn a_batch_publishes_queued_then_succeeded_in_the_documented_shape() {
    let emulator = start_events(EventsConfig::default()).await;
    let before_ms = now_ms();
    let request_id = submit(&emulator, "@cf/baai/bge-base-en-v1.5", json!([{ "text": "a" }])).await;

    let reply = pull_raw(&emulator, &json!({})).await;
    assert_eq!(reply.status, StatusCode::OK);
    let result = &reply.body["result"];
    let messages = result["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 1);
    let message = &messages[0];
    let id = message["id"].as_str().expect("id");
    assert!(id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    assert_eq!(message["attempts"], 1);
    assert!(!lease(message).is_empty());
    let timestamp_ms = message["timestamp_ms"].as_u64().expect("timestamp_ms");
    assert!((before_ms..=now_ms()).contains(&timestamp_ms), "{timestamp_ms}");
    let event = event_of(message);
    let event_timestamp = event["metadata"]["eventTimestamp"].as_str().expect("eventTimestamp").to_owned();
    assert!(event_timestamp.len() == 24 && event_timestamp.ends_with('Z'), "{event_timestamp}");
    assert_eq!(
        event,
        json!({
            "type": "cf.workersAi.model.batch.queued",
            "source": { "type": "workersAi.model", "modelName": "@cf/baai/bge-base-en-v1.5" },
            "payload": { "requestId": request_id },
            "metadata": {
                "accountId": emulator.account_id(),
                "eventSubscriptionId": "emulator-subscription",
                "eventSchemaVersion": 1,
                "eventTimestamp": event_timestamp,
            }
        })
    );
    // Leased messages are still in the backlog.
    let body_len = STANDARD.decode(message["body"].as_str().expect("body")).expect("base64").len();
    assert_eq!(result["message_backlog_count"], 1);
    assert_eq!(
        result["metadata"]["metrics"],
        json!({ "backlog_count": 1, "backlog_bytes": body_len, "oldest_message_timestamp_ms": timestamp_ms })
    );

    let reply = ack(&emulator, &json!({ "acks": [{ "lease_id": lease(message) }] })).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.body,
        json!({ "result": { "ackCount": 1, "retryCount": 0, "warnings": [] }, "success": true, "errors": [], "messages": [] })
    );
    let reply = pull_raw(&emulator, &json!({})).await;
    assert_eq!(reply.body["result"]["messages"], json!([]));
    assert_eq!(reply.body["result"]["message_backlog_count"], 0);
    assert_eq!(reply.body["result"]["metadata"]["metrics"]["oldest_message_timestamp_ms"], 0);

    // Done: the next pull sees `succeeded` at once (published lazily, stamped with the done time).
    emulator.set_timing(Duration::ZERO, Duration::ZERO);
    let messages = pull(&emulator, 10, 30_000).await;
    assert_eq!(messages.len(), 1);
    let event = event_of(&messages[0]);
    assert_eq!(event["type"], "cf.workersAi.model.batch.succeeded");
    assert_eq!(event["payload"], json!({ "requestId": request_id }));
    assert_eq!(event["source"]["modelName"], "@cf/baai/bge-base-en-v1.5");

    let stats = emulator.queue_stats();
    assert_eq!((stats.published.queued, stats.published.succeeded, stats.published.failed), (1, 1, 0));
    assert_eq!((stats.enqueued, stats.delivered, stats.acked, stats.backlog, stats.leased), (2, 2, 1, 1, 1));
    assert_eq!((stats.pulls, stats.acks), (3, 1));
}

#[tokio::test]
async fn a_failed_batch_publishes_failed_with_the_error() {
    let emulator = start_events(EventsConfig::default()).await;
    emulator.inject(Fault::fail_batch());
    let request_id = submit(&emulator, LLAMA, prompt()).await;
    emulator.set_timing(Duration::ZERO, Duration::ZERO);
    let messages = pull_until(&emulator, 2, 30_000).await;
    assert_eq!(
        messages.iter().map(event_type).collect::<Vec<_>>(),
        ["cf.workersAi.model.batch.queued", "cf.workersAi.model.batch.failed"]
    );
    assert_eq!(
        event_of(&messages[1])["payload"],
        json!({ "requestId": request_id, "message": "Model execution failed", "internalCode": 5001, "httpCode": 500 })
    );
    assert_eq!(poll(&emulator, LLAMA, &request_id).await.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(emulator.queue_stats().published.failed, 1);
}

#[tokio::test]
async fn an_unacked_message_comes_back_after_its_lease_with_attempts_2() {
    let emulator = start_events(EventsConfig::default()).await;
    submit(&emulator, LLAMA, prompt()).await;
    let pulled_at = Instant::now();
    let first = pull(&emulator, 10, 100).await;
    assert_eq!(first.len(), 1);
    let again = pull_until(&emulator, 1, 30_000).await;
    assert!(pulled_at.elapsed() >= Duration::from_millis(100));
    assert_eq!(again[0]["id"], first[0]["id"]);
    assert_eq!(again[0]["attempts"], 2);
    assert_ne!(lease(&again[0]), lease(&first[0]));
    assert_eq!(again[0]["body"], first[0]["body"]);

    // The expired lease cannot ack; the live one can.
    let reply =
        ack(&emulator, &json!({ "acks": [{ "lease_id": lease(&first[0]) }, { "lease_id": lease(&again[0]) }] })).await;
    assert_eq!(reply.body["result"]["ackCount"], 1);
    let warnings = reply.body["result"]["warnings"].as_array().expect("a list");
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].as_str().expect("a string").contains(&lease(&first[0])));
    let stats = emulator.queue_stats();
    assert_eq!(
        (stats.expired_leases, stats.redelivered, stats.acked, stats.ack_warnings, stats.backlog),
        (1, 1, 1, 1, 0)
    );
}

#[tokio::test]
async fn expired_and_unknown_leases_do_not_ack_and_warnings_can_be_a_map() {
    let emulator = start_events(EventsConfig { ack_warnings: AckWarnings::Map, ..EventsConfig::default() }).await;
    submit(&emulator, LLAMA, prompt()).await;
    // A lease of 0 ms has expired by the time any ack arrives.
    let message = pull(&emulator, 10, 0).await.remove(0);
    let reply = ack(
        &emulator,
        &json!({ "acks": [{ "lease_id": lease(&message) }], "retries": [{ "lease_id": "nonsense", "delay_seconds": 1 }] }),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let result = &reply.body["result"];
    assert_eq!((result["ackCount"].as_u64(), result["retryCount"].as_u64()), (Some(0), Some(0)));
    let warnings = result["warnings"].as_object().expect("a map");
    assert_eq!(
        warnings.keys().cloned().collect::<HashSet<_>>(),
        HashSet::from([lease(&message), "nonsense".to_owned()])
    );
    let again = pull(&emulator, 10, 30_000).await;
    assert_eq!(again[0]["attempts"], 2);
}

#[tokio::test]
async fn a_retry_comes_back_after_its_delay() {
    let emulator = start_events(EventsConfig::default()).await;
    submit(&emulator, LLAMA, prompt()).await;
    submit(&emulator, LLAMA, prompt()).await;
    let messages = pull(&emulator, 10, 60_000).await;
    assert_eq!(messages.len(), 2);
    let retried_at = Instant::now();
    let reply = ack(
        &emulator,
        &json!({ "retries": [
            { "lease_id": lease(&messages[0]), "delay_seconds": 3600 },
            { "lease_id": lease(&messages[1]), "delay_seconds": 1 },
        ] }),
    )
    .await;
    assert_eq!(reply.body["result"], json!({ "ackCount": 0, "retryCount": 2, "warnings": [] }));
    let again = pull_until(&emulator, 1, 60_000).await;
    assert!(retried_at.elapsed() >= Duration::from_secs(1));
    assert_eq!(again.len(), 1);
    assert_eq!(again[0]["id"], messages[1]["id"]);
    assert_eq!(again[0]["attempts"], 2);
    let stats = emulator.queue_stats();
    assert_eq!((stats.retried, stats.waiting, stats.leased, stats.available, stats.backlog), (2, 1, 1, 0, 2));
    assert!(pull(&emulator, 10, 60_000).await.is_empty(), "the other waits an hour");
}

#[tokio::test]
async fn a_message_is_dropped_after_max_retries() {
    let emulator = start_events(EventsConfig { max_retries: Some(1), ..EventsConfig::default() }).await;
    submit(&emulator, LLAMA, prompt()).await;
    assert_eq!(pull(&emulator, 10, 0).await[0]["attempts"], 1);
    assert_eq!(pull(&emulator, 10, 0).await[0]["attempts"], 2);
    assert!(pull(&emulator, 10, 0).await.is_empty());
    let stats = emulator.queue_stats();
    assert_eq!((stats.dead, stats.backlog), (1, 0));
}

#[tokio::test]
async fn two_pullers_never_get_the_same_leased_message() {
    let emulator = start_events(EventsConfig::default()).await;
    for _ in 0..30 {
        submit(&emulator, LLAMA, prompt()).await;
    }
    let url = queue_action_url(&emulator, "pull");
    let token = emulator.queue_token();
    let pullers: Vec<_> = (0..4)
        .map(|_| {
            let (url, token) = (url.clone(), token.clone());
            tokio::spawn(async move {
                let mut ids = Vec::new();
                loop {
                    let body = json!({ "batch_size": 3, "visibility_timeout_ms": 60_000 }).to_string();
                    let reply = post_raw(&url, &token, body).await.expect("a reply");
                    let messages = reply.body["result"]["messages"].as_array().expect("messages").clone();
                    if messages.is_empty() {
                        return ids;
                    }
                    ids.extend(messages.iter().map(|m| m["id"].as_str().expect("id").to_owned()));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for puller in pullers {
        all.extend(puller.await.expect("puller"));
    }
    let distinct: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), 30, "{all:?}");
    assert_eq!(distinct.len(), 30);
    assert_eq!(emulator.queue_stats().leased, 30);
}

#[tokio::test]
async fn drop_faults_keep_events_out_of_the_queue() {
    let emulator = start_events(EventsConfig::default()).await;
    emulator.set_event_faults(EventFaults::drop_next(2));
    let ids: Vec<String> =
        [submit(&emulator, LLAMA, prompt()).await, submit(&emulator, LLAMA, prompt()).await].into_iter().collect();
    let third = submit(&emulator, LLAMA, prompt()).await;
    let messages = pull(&emulator, 10, 30_000).await;
    assert_eq!(messages.iter().map(request_id_of).collect::<Vec<_>>(), [third]);
    assert!(!ids.contains(&request_id_of(&messages[0])));
    assert_eq!(emulator.event_faults().drop_next, 0);
    let stats = emulator.queue_stats();
    assert_eq!((stats.published.queued, stats.dropped, stats.enqueued), (3, 2, 1));

    emulator.set_event_faults(EventFaults::drop_rate(1.0));
    emulator.set_timing(Duration::ZERO, Duration::ZERO);
    assert!(pull(&emulator, 10, 30_000).await.is_empty());
    assert_eq!(emulator.queue_stats().dropped, 5, "the three succeeded events too");

    // A share is drawn from the seed: the same seed drops the same events.
    let mut dropped = Vec::new();
    for _ in 0..2 {
        let emulator = start(EmulatorConfig {
            queued_for: FOREVER,
            events: Some(EventsConfig::default()),
            event_faults: EventFaults::drop_rate(0.5),
            seed: 3,
            ..EmulatorConfig::default()
        })
        .await;
        let mut kept = Vec::new();
        for i in 0..20 {
            submit(&emulator, LLAMA, prompt()).await;
            kept.push((i, emulator.queue_stats().enqueued));
        }
        dropped.push(kept);
    }
    assert_eq!(dropped[0], dropped[1]);
    let enqueued = dropped[0].last().expect("20 submits").1;
    assert!(0 < enqueued && enqueued < 20, "{enqueued}");
}

#[tokio::test]
async fn duplicate_fault_enqueues_each_event_twice() {
    let emulator = start_events(EventsConfig::default()).await;
    emulator.set_event_faults(EventFaults::duplicate());
    let request_id = submit(&emulator, LLAMA, prompt()).await;
    let messages = pull(&emulator, 10, 30_000).await;
    assert_eq!(messages.len(), 2);
    assert_ne!(messages[0]["id"], messages[1]["id"]);
    assert_eq!(messages[0]["body"], messages[1]["body"]);
    assert_eq!(request_id_of(&messages[1]), request_id);
    assert_eq!(emulator.queue_stats().duplicated, 1);
}

#[tokio::test]
async fn delay_fault_makes_events_late() {
    let emulator = start_events(EventsConfig::default()).await;
    emulator.set_event_faults(EventFaults::delay(Duration::from_secs(3600)));
    submit(&emulator, LLAMA, prompt()).await;
    assert!(pull(&emulator, 10, 30_000).await.is_empty());
    let stats = emulator.queue_stats();
    assert_eq!((stats.in_flight, stats.backlog, stats.enqueued), (1, 0, 1));

    emulator.purge_queue();
    emulator.set_event_faults(EventFaults::delay(Duration::from_millis(300)));
    let submitted_at = Instant::now();
    let submitted_ms = now_ms();
    submit(&emulator, LLAMA, prompt()).await;
    let message = pull_until(&emulator, 1, 30_000).await.remove(0);
    assert!(submitted_at.elapsed() >= Duration::from_millis(300));
    // `timestamp_ms` is when the message entered the queue; the event keeps the time it happened.
    assert!(message["timestamp_ms"].as_u64().expect("timestamp_ms") >= submitted_ms + 300);
}

#[tokio::test]
async fn order_faults_reverse_or_shuffle_the_pull() {
    let mut orders = Vec::new();
    for order in [PullOrder::Fifo, PullOrder::Reverse, PullOrder::Random, PullOrder::Random] {
        let emulator = start(EmulatorConfig {
            queued_for: FOREVER,
            events: Some(EventsConfig::default()),
            event_faults: EventFaults::order(order),
            seed: 11,
            ..EmulatorConfig::default()
        })
        .await;
        let mut position = HashMap::new();
        for i in 0..6 {
            position.insert(submit(&emulator, LLAMA, prompt()).await, i);
        }
        let messages = pull(&emulator, 10, 30_000).await;
        orders.push(messages.iter().map(|m| position[&request_id_of(m)]).collect::<Vec<usize>>());
    }
    assert_eq!(orders[0], [0, 1, 2, 3, 4, 5]);
    assert_eq!(orders[1], [5, 4, 3, 2, 1, 0]);
    assert_eq!(orders[2], orders[3], "the same seed shuffles the same way");
    let mut sorted = orders[2].clone();
    sorted.sort_unstable();
    assert_eq!(sorted, orders[0]);
    assert_ne!(orders[2], orders[0]);
}

#[tokio::test]
async fn queue_errors_auth_routing_and_bodies() {
    let emulator = start_events(EventsConfig::queue("q1")).await;
    let pull_url = queue_action_url(&emulator, "pull");
    let empty = json!({}).to_string();

    let reply = post_raw(&pull_url, "wrong", empty.clone()).await.expect("reply");
    assert_eq!((reply.status, reply.error_code()), (StatusCode::UNAUTHORIZED, 10000));
    let other_queue = pull_url.replace("/queues/q1/", "/queues/q2/");
    let reply = post_raw(&other_queue, emulator.token(), empty.clone()).await.expect("reply");
    assert_eq!((reply.status, reply.error_code()), (StatusCode::NOT_FOUND, 10104));
    assert_eq!(reply.body["errors"][0]["message"], "Queue does not exist");
    let other_account = pull_url.replace(&format!("/accounts/{}/", emulator.account_id()), "/accounts/other/");
    let reply = post_raw(&other_account, emulator.token(), empty.clone()).await.expect("reply");
    assert_eq!((reply.status, reply.error_code()), (StatusCode::NOT_FOUND, 7003));
    let response = reqwest::Client::new().get(&pull_url).bearer_auth(emulator.token()).send().await.expect("reply");
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);

    let reply = pull_raw(&emulator, &json!({ "batch_size": 101 })).await;
    assert_eq!((reply.status, reply.error_code()), (StatusCode::BAD_REQUEST, 10206));
    assert_eq!(pull_raw(&emulator, &json!({ "batch_size": 100 })).await.status, StatusCode::OK);
    let reply = pull_raw(&emulator, &json!({ "visibility_timeout_ms": 43_200_001u64 })).await;
    assert_eq!((reply.status, reply.error_code()), (StatusCode::BAD_REQUEST, 10207));
    let reply = post_raw(&pull_url, emulator.token(), "{nope").await.expect("reply");
    assert_eq!((reply.status, reply.error_code()), (StatusCode::BAD_REQUEST, 10208));
    let reply = ack(&emulator, &json!({ "acks": [{ "id": "x" }] })).await;
    assert_eq!((reply.status, reply.error_code()), (StatusCode::BAD_REQUEST, 10207));
    // An empty pull body takes the defaults.
    let reply = post_raw(&pull_url, emulator.token(), "").await.expect("reply");
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(emulator.pulls().last().and_then(|call| call.batch_size), Some(5));
    assert_eq!(emulator.pulls().last().and_then(|call| call.visibility_timeout_ms), Some(30_000));

    // A queue token of its own: the API token no longer pulls.
    emulator.set_events(Some(EventsConfig { queue_token: Some("queue-secret".into()), ..EventsConfig::queue("q1") }));
    assert_eq!(emulator.queue_token(), "queue-secret");
    let reply = post_raw(&pull_url, emulator.token(), empty.clone()).await.expect("reply");
    assert_eq!((reply.status, reply.error_code()), (StatusCode::UNAUTHORIZED, 10000));
    assert_eq!(post_raw(&pull_url, "queue-secret", empty.clone()).await.expect("reply").status, StatusCode::OK);

    // Events off: no queue.
    emulator.set_events(None);
    assert_eq!(emulator.queue_url(), None);
    let reply = post_raw(&pull_url, emulator.token(), empty).await.expect("reply");
    assert_eq!((reply.status, reply.error_code()), (StatusCode::NOT_FOUND, 10104));
    // Every one of these is in the queue call log, none in the API call log.
    assert!(emulator.calls().is_empty());
    assert_eq!(emulator.queue_calls().len(), 13);
}

#[tokio::test]
async fn the_pull_rate_limit_answers_429_with_retry_after() {
    let emulator =
        start_events(EventsConfig { pull_rate_limit: Some(RateLimit::per_minute(2)), ..EventsConfig::default() }).await;
    pull(&emulator, 5, 1000).await;
    pull(&emulator, 5, 1000).await;
    let reply = pull_raw(&emulator, &json!({})).await;
    assert_eq!((reply.status, reply.error_code()), (StatusCode::TOO_MANY_REQUESTS, 10250));
    let wait: u64 = reply.headers["retry-after"].to_str().expect("ascii").parse().expect("seconds");
    assert!((58..=60).contains(&wait), "{wait}");
    // Acks are not limited.
    assert_eq!(ack(&emulator, &json!({})).await.status, StatusCode::OK);
    let limited = emulator.pulls().pop().expect("a pull");
    assert_eq!((limited.http_status, limited.fault.as_deref()), (429, Some("rate_limit")));
    assert_eq!(emulator.queue_stats().pulls_rate_limited, 1);
}

#[tokio::test]
async fn call_level_faults_hit_queue_calls_only_when_aimed_at_them() {
    let emulator = start_events(EventsConfig::default()).await;
    submit(&emulator, LLAMA, prompt()).await;
    emulator.inject(Fault::status(500));
    emulator.inject(Fault::status(503).retry_after(1).on(Calls::Pull));
    let reply = pull_raw(&emulator, &json!({})).await;
    assert_eq!((reply.status, reply.error_code()), (StatusCode::SERVICE_UNAVAILABLE, 503));
    assert_eq!(emulator.pending_faults(), [Fault::status(500)], "an `any` fault is for the batch API");
    let message = pull(&emulator, 5, 60_000).await.remove(0);
    emulator.inject(Fault::reset().on(Calls::Queue));
    let url = queue_action_url(&emulator, "ack");
    let body = json!({ "acks": [{ "lease_id": lease(&message) }] }).to_string();
    assert!(post_raw(&url, &emulator.queue_token(), body.clone()).await.is_err(), "the connection is reset");
    assert_eq!(post_raw(&url, &emulator.queue_token(), body).await.expect("reply").body["result"]["ackCount"], 1);
    let faults: Vec<Option<String>> = emulator.queue_calls().into_iter().map(|call| call.fault).collect();
    assert_eq!(faults, [Some("status".to_owned()), None, Some("reset".to_owned()), None]);
}

#[tokio::test]
async fn pulls_and_acks_have_their_own_call_log() {
    let emulator = start_events(EventsConfig::default()).await;
    let request_id = submit(&emulator, LLAMA, prompt()).await;
    poll(&emulator, LLAMA, &request_id).await;
    let message = pull(&emulator, 7, 1234).await.remove(0);
    ack(&emulator, &json!({ "acks": [{ "lease_id": lease(&message) }, { "lease_id": "gone" }] })).await;

    assert_eq!(emulator.submits().len(), 1);
    assert_eq!(emulator.polls().len(), 1);
    assert_eq!(emulator.calls().len(), 2);
    let calls = emulator.queue_calls();
    assert_eq!(
        calls.iter().map(|call| (call.seq, call.kind)).collect::<Vec<_>>(),
        [(1, QueueCallKind::Pull), (2, QueueCallKind::Ack)]
    );
    let pulled = &emulator.pulls()[0];
    assert_eq!((pulled.http_status, pulled.batch_size, pulled.visibility_timeout_ms), (200, Some(7), Some(1234)));
    assert_eq!(pulled.message_ids, [message["id"].as_str().expect("id")]);
    assert_eq!(pulled.queue_id, "batchd-events");
    assert_eq!(pulled.account_id, emulator.account_id());
    let acked = &emulator.acks()[0];
    assert_eq!((acked.ack_count, acked.retry_count, acked.n_warnings), (Some(1), Some(0), Some(1)));
    let over_http = control_get(&emulator, "queue/calls").await;
    assert_eq!(over_http.as_array().map(Vec::len), Some(2));
    assert_eq!(over_http[0]["kind"], "pull");

    emulator.reset();
    assert!(emulator.queue_calls().is_empty());
    assert_eq!(emulator.queue_stats().acked, 1, "counters survive a reset");
}

#[tokio::test]
async fn events_turned_on_later_skip_batches_already_done() {
    let emulator =
        start(EmulatorConfig { queued_for: FOREVER, running_for: FOREVER, ..EmulatorConfig::default() }).await;
    assert_eq!(emulator.queue_url(), None);
    // One batch done before events exist, one still pending.
    emulator.set_random_durations(Some(DurationRange::new(Duration::ZERO, Duration::ZERO)));
    let done_before = submit(&emulator, LLAMA, prompt()).await;
    emulator.set_random_durations(None);
    let pending = submit(&emulator, LLAMA, prompt()).await;
    emulator.set_events(Some(EventsConfig::default()));
    assert!(pull(&emulator, 10, 30_000).await.is_empty());
    emulator.set_timing(Duration::ZERO, Duration::ZERO);
    let messages = pull(&emulator, 10, 30_000).await;
    assert_eq!(messages.len(), 1);
    assert_eq!(
        (event_type(&messages[0]), request_id_of(&messages[0])),
        ("cf.workersAi.model.batch.succeeded".to_owned(), pending)
    );
    assert_ne!(request_id_of(&messages[0]), done_before);
}

#[tokio::test]
async fn a_batch_forgotten_by_retention_still_publishes_its_event() {
    let emulator = start(EmulatorConfig {
        queued_for: Duration::ZERO,
        running_for: Duration::ZERO,
        retention: Some(Duration::ZERO),
        events: Some(EventsConfig::default()),
        ..EmulatorConfig::default()
    })
    .await;
    let request_id = submit(&emulator, LLAMA, prompt()).await;
    let started = Instant::now();
    while emulator.stored_batch_count() > 0 {
        assert!(started.elapsed() < DEADLINE, "the batch is never forgotten");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let messages = pull(&emulator, 10, 30_000).await;
    assert_eq!(
        messages.iter().map(event_type).collect::<Vec<_>>(),
        ["cf.workersAi.model.batch.queued", "cf.workersAi.model.batch.succeeded"]
    );
    assert!(messages.iter().all(|m| request_id_of(m) == request_id));
}

#[tokio::test]
async fn events_and_event_faults_change_over_http() {
    let emulator =
        start(EmulatorConfig { queued_for: FOREVER, running_for: FOREVER, ..EmulatorConfig::default() }).await;
    let (status, view) = control_post(
        &emulator,
        "config",
        json!({ "events": { "queue_id": "q9", "body": "text", "prefix_request_ids": true },
                "event_faults": { "duplicate": true } }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        view["events"],
        json!({ "queue_id": "q9", "queue_token": null, "subscription_id": "emulator-subscription",
                "prefix_request_ids": true, "body": "text", "ack_warnings": "list", "max_retries": 3,
                "pull_rate_limit": null, "all_models": true })
    );
    assert_eq!(
        view["event_faults"],
        json!({ "drop_next": 0, "drop_rate": 0.0, "duplicate": true, "delay_ms": 0, "order": "fifo" })
    );
    assert_eq!(emulator.events().map(|events| events.body), Some(EventBody::Text));

    let request_id = submit(&emulator, LLAMA, prompt()).await;
    let messages = pull(&emulator, 10, 30_000).await;
    assert_eq!(messages.len(), 2);
    // A plain-text body marked `text`, with the `req-` prefix.
    assert_eq!(messages[0]["metadata"]["CF-Content-Type"], "text");
    let event: Value = serde_json::from_str(messages[0]["body"].as_str().expect("body")).expect("plain JSON");
    assert_eq!(event["payload"]["requestId"], format!("req-{request_id}"));

    let stats = control_get(&emulator, "queue").await;
    assert_eq!(
        (stats["enabled"].as_bool(), stats["leased"].as_u64(), stats["duplicated"].as_u64()),
        (Some(true), Some(2), Some(1))
    );
    let response = reqwest::Client::new().post(control_url(&emulator, "queue/purge")).send().await.expect("purge");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(control_get(&emulator, "queue").await["backlog"], 0);

    // `plain_json`: plain text marked `json`, as in the docs' sample.
    control_post(
        &emulator,
        "config",
        json!({ "events": { "queue_id": "q9", "body": "plain_json" }, "event_faults": {} }),
    )
    .await;
    submit(&emulator, LLAMA, prompt()).await;
    let message = pull(&emulator, 10, 30_000).await.remove(0);
    assert_eq!(message["metadata"]["CF-Content-Type"], "json");
    let event: Value = serde_json::from_str(message["body"].as_str().expect("body")).expect("plain JSON");
    assert_eq!(event["type"], "cf.workersAi.model.batch.queued");

    let (status, _) = control_post(&emulator, "config", json!({ "events": { "queue": "x" } })).await;
    assert!(status.is_client_error(), "unknown fields are refused");
    let (_, view) = control_post(&emulator, "config", json!({ "events": null })).await;
    assert_eq!(view["events"], Value::Null);
    assert_eq!(control_get(&emulator, "queue").await["enabled"], false);
}

#[tokio::test]
async fn the_binary_takes_the_events_flags() {
    let emulator = crate::binary::EmulatorProcess::spawn(
        &[
            "--account-id",
            "acc",
            "--queued-ms",
            "0",
            "--running-ms",
            "0",
            "--events",
            "--events-queue",
            "demo-events",
            "--event-duplicate",
            "--event-order",
            "reverse",
        ],
        &[("EMULATOR_TOKEN", "secret")],
    )
    .await;
    let base_url = emulator.base_url.clone();

    let run = format!("{base_url}/accounts/acc/ai/run/%40cf/meta/llama-3.3-70b-instruct-fp8-fast?queueRequest=true");
    let reply = post_raw(&run, "secret", json!({ "requests": prompt() }).to_string()).await.expect("submit");
    let request_id = reply.body["result"]["request_id"].as_str().expect("request id").to_owned();
    let pull_url = format!("{base_url}/accounts/acc/queues/demo-events/messages/pull");
    let started = Instant::now();
    let mut messages = Vec::new();
    while messages.len() < 4 {
        assert!(started.elapsed() < DEADLINE, "{messages:?}");
        let reply = post_raw(&pull_url, "secret", json!({ "batch_size": 10 }).to_string()).await.expect("pull");
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        messages.extend(reply.body["result"]["messages"].as_array().expect("messages").iter().cloned());
    }
    // Each event twice; all about our batch.
    assert_eq!(messages.len(), 4);
    assert!(messages.iter().all(|m| request_id_of(m) == request_id));
    let config: Value = reqwest::get(base_url.replace("/client/v4", "/_emulator/config"))
        .await
        .expect("config")
        .json()
        .await
        .expect("json");
    assert_eq!(config["events"]["queue_id"], "demo-events");
    assert_eq!(config["event_faults"]["order"], "reverse");
    drop(emulator);
}
