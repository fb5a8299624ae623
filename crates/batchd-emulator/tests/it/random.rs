//! Chaos helpers: per-batch random durations, random transient faults, extra listeners and the call log's
//! `first_reference` and `port`.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use batchd_emulator::{CallKind, DurationRange, Emulator, EmulatorConfig, EmulatorHandle, EventsConfig, RandomFaults};
use reqwest::StatusCode;
use serde_json::json;

use crate::control::{control_get, control_post};
use crate::events::{event_type, pull_until, request_id_of};
use crate::{DEADLINE, LLAMA, poll, post, post_raw, run_url, start, submit, wait_until};

async fn phases(emulator: &EmulatorHandle, ids: &[String]) -> Vec<String> {
    let mut statuses = Vec::new();
    for id in ids {
        let reply = poll(emulator, LLAMA, id).await;
        let status = if reply.body["result"]["results"].is_array() {
            "done".to_owned()
        } else {
            reply.body["result"]["status"].as_str().expect("a status").to_owned()
        };
        statuses.push(status);
    }
    statuses
}

#[tokio::test]
async fn each_batch_draws_its_own_duration_from_the_range() {
    let emulator = start(EmulatorConfig {
        random_durations: Some(DurationRange::new(Duration::from_millis(400), Duration::from_millis(2_400))),
        seed: 7,
        events: Some(EventsConfig::default()),
        ..EmulatorConfig::default()
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(submit(&emulator, LLAMA, json!([{ "prompt": format!("p{i}") }])).await);
    }
    // Poll until every batch is done, keeping the phases each one went through.
    let mut paths: HashMap<String, Vec<String>> = HashMap::new();
    let started = Instant::now();
    loop {
        for (id, phase) in ids.iter().zip(phases(&emulator, &ids).await) {
            let path = paths.entry(id.clone()).or_default();
            if path.last() != Some(&phase) {
                path.push(phase);
            }
        }
        if paths.values().all(|path| path.last().is_some_and(|phase| phase == "done")) {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "not every batch finished: {paths:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let order = ["queued", "running", "done"];
    for (id, path) in &paths {
        let ranks: Vec<usize> =
            path.iter().map(|phase| order.iter().position(|o| o == phase).expect("a phase")).collect();
        assert!(ranks.is_sorted(), "{id} went back: {path:?}");
    }
    // Every batch runs for three quarters of its duration (at least 300 ms), at different times: polled every few
    // milliseconds, some batch is caught running.
    assert!(paths.values().any(|path| path.iter().any(|phase| phase == "running")), "{paths:?}");

    // The emulator's own record of each duration: the `queued` event carries the submit time, the `succeeded`
    // event the done time (both in whole milliseconds, so a difference may be off by one or two).
    let mut times: HashMap<String, (Option<u64>, Option<u64>)> = HashMap::new();
    for message in pull_until(&emulator, 2 * ids.len(), 60_000).await {
        let at = message["timestamp_ms"].as_u64().expect("timestamp_ms");
        let entry = times.entry(request_id_of(&message)).or_default();
        match event_type(&message).as_str() {
            "cf.workersAi.model.batch.queued" => entry.0 = Some(at),
            "cf.workersAi.model.batch.succeeded" => entry.1 = Some(at),
            other => panic!("unexpected event {other}"),
        }
    }
    let durations: Vec<u64> = ids
        .iter()
        .map(|id| match times.get(id) {
            Some(&(Some(queued), Some(done))) => done - queued,
            other => panic!("{id} lacks an event: {other:?}"),
        })
        .collect();
    assert!(durations.iter().all(|ms| (398..=2_402).contains(ms)), "every duration is in the range: {durations:?}");
    let (shortest, longest) = (durations.iter().min().expect("some"), durations.iter().max().expect("some"));
    assert!(longest - shortest >= 1_000, "durations differ per batch: {durations:?}");
    let distinct: std::collections::HashSet<u64> = durations.iter().map(|ms| ms / 10).collect();
    assert!(distinct.len() >= 10, "durations differ per batch: {durations:?}");

    // The global timing does not move a batch that drew its own duration.
    emulator.set_timing(Duration::from_secs(3600), Duration::from_secs(3600));
    assert!(phases(&emulator, &ids).await.iter().all(|s| s == "done"));
}

#[tokio::test]
async fn random_faults_fail_about_their_share_of_calls_before_anything_is_created() {
    let emulator =
        start(EmulatorConfig { random_faults: Some(RandomFaults::new(0.25)), seed: 42, ..EmulatorConfig::default() })
            .await;
    let url = run_url(&emulator, LLAMA);
    let body = json!({ "requests": [{ "prompt": "x" }] }).to_string();
    let mut answered = 0;
    for _ in 0..200 {
        if let Ok(reply) = post_raw(&url, emulator.token(), body.clone()).await {
            answered += 1;
            assert!(
                [
                    StatusCode::OK,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    StatusCode::BAD_GATEWAY,
                    StatusCode::SERVICE_UNAVAILABLE
                ]
                .contains(&reply.status),
                "{:?}",
                reply.status
            );
            if reply.status == StatusCode::BAD_GATEWAY {
                assert_eq!(reply.body, serde_json::Value::Null, "a 502 is an HTML page");
            }
        }
    }
    let calls = emulator.submits();
    assert_eq!(calls.len(), 200);
    let faulted: Vec<_> = calls.iter().filter(|call| call.fault.is_some()).collect();
    assert!((25..=75).contains(&faulted.len()), "about 25% of 200 calls fail: {}", faulted.len());
    let kinds: std::collections::HashSet<&str> = faulted.iter().filter_map(|call| call.fault.as_deref()).collect();
    assert_eq!(
        kinds,
        ["random_500", "random_502", "random_503", "random_reset"].into_iter().collect(),
        "all four kinds occur"
    );
    let resets = faulted.iter().filter(|call| call.http_status == 0).count();
    assert_eq!(answered, 200 - resets, "a reset sends no reply");
    assert!(faulted.iter().all(|call| call.request_id.is_none()));
    assert_eq!(emulator.batch_count(), 200 - faulted.len(), "a faulted submit creates no batch");
}

#[tokio::test]
async fn random_faults_and_durations_change_at_runtime_over_http() {
    let emulator = start(EmulatorConfig::default()).await;
    let (status, config) = control_post(
        &emulator,
        "config",
        json!({ "random_faults": { "rate": 1.0, "calls": "poll" },
                "random_durations": { "min_ms": 1000, "max_ms": 20000 } }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(config["random_faults"], json!({ "rate": 1.0, "calls": "poll" }));
    assert_eq!(config["random_durations"], json!({ "min_ms": 1000, "max_ms": 20000 }));
    let id = submit(&emulator, LLAMA, json!([{ "prompt": "x" }])).await;
    let reply = post(&emulator, LLAMA, &json!({ "request_id": id })).await;
    assert!(reply.status.is_server_error() || reply.status == StatusCode::OK);
    assert!(emulator.polls()[0].fault.as_deref().is_some_and(|f| f.starts_with("random_")));
    control_post(&emulator, "config", json!({ "random_faults": null, "random_durations": null })).await;
    let config = control_get(&emulator, "config").await;
    assert_eq!(config["random_faults"], serde_json::Value::Null);
    assert_eq!(config["random_durations"], serde_json::Value::Null);
    let reply = post(&emulator, LLAMA, &json!({ "request_id": id })).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn the_call_log_names_the_port_and_the_first_reference() {
    let emulator =
        Emulator::start(EmulatorConfig::default(), "127.0.0.1:0".parse().expect("addr")).await.expect("start");
    let second = emulator.listen_also("127.0.0.1:0".parse().expect("addr")).await.expect("listen");
    assert_ne!(second.port(), emulator.addr().port());
    let url = format!(
        "{}/accounts/{}/ai/run/{}?queueRequest=true",
        EmulatorHandle::base_url_of(second),
        emulator.account_id(),
        LLAMA.replace('@', "%40")
    );
    let body = json!({ "requests": [{ "prompt": "a", "external_reference": "job-7:0" }, { "prompt": "b" }] });
    let reply = post_raw(&url, emulator.token(), body.to_string()).await.expect("reply");
    assert_eq!(reply.status, StatusCode::OK);
    let request_id = reply.body["result"]["request_id"].as_str().expect("id").to_owned();
    // The batch is shared: the first listener polls it.
    assert_eq!(poll(&emulator, LLAMA, &request_id).await.status, StatusCode::OK);
    let calls = emulator.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!((calls[0].kind, calls[0].port), (CallKind::Submit, second.port()));
    assert_eq!(calls[0].first_reference.as_deref(), Some("job-7:0"));
    assert_eq!((calls[1].kind, calls[1].port), (CallKind::Poll, emulator.addr().port()));
    assert_eq!(calls[1].first_reference, None);
    emulator.shutdown().await;
    assert!(reqwest::get(format!("http://{second}/_emulator/calls")).await.is_err(), "the extra listener stops too");
}

#[tokio::test]
async fn random_latency_delays_the_reply_after_the_batch_exists() {
    // An hour of latency: the reply cannot come while the test looks, however slow the machine is.
    let hour = DurationRange::new(Duration::from_secs(3600), Duration::from_secs(3600));
    let emulator = start(EmulatorConfig { random_latency: Some(hour), ..EmulatorConfig::default() }).await;
    let url = run_url(&emulator, LLAMA);
    let token = emulator.token().to_owned();
    let pending =
        tokio::spawn(
            async move { post_raw(&url, &token, json!({ "requests": [{ "prompt": "x" }] }).to_string()).await },
        );
    wait_until("the batch to exist", async || emulator.batch_count() == 1).await;
    assert!(!pending.is_finished(), "the reply is still on its way");
    let submits = emulator.submits();
    assert_eq!(submits.len(), 1);
    assert!(submits[0].request_id.is_some(), "the submit is logged with its batch before the reply leaves");
    // A client that gives up waiting does not undo the batch.
    pending.abort();
    assert!(pending.await.is_err_and(|error| error.is_cancelled()));
    assert_eq!(emulator.batch_count(), 1);

    // Switched off, replies come at once: with the hour still on, this would time out.
    emulator.set_random_latency(None);
    tokio::time::timeout(DEADLINE, submit(&emulator, LLAMA, json!([{ "prompt": "y" }])))
        .await
        .expect("latency off again");

    // A drawn latency is at least the lower bound of its range.
    emulator.set_random_latency(Some(DurationRange::new(Duration::from_millis(400), Duration::from_millis(500))));
    let started = Instant::now();
    submit(&emulator, LLAMA, json!([{ "prompt": "z" }])).await;
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[tokio::test]
async fn the_binary_takes_the_chaos_flags() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_batchd-emulator"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--duration-min-ms",
            "1000",
            "--duration-max-ms",
            "20000",
            "--fault-rate",
            "0.05",
            "--latency-min-ms",
            "10",
            "--latency-max-ms",
            "20",
            "--seed",
            "7",
        ])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the emulator binary");
    let stdout = child.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).map(|_| line)
    })
    .await
    .expect("join")
    .expect("first line");
    let base =
        line.trim().trim_start_matches("batchd-emulator listening on ").trim_end_matches("/client/v4").to_owned();
    let config: serde_json::Value =
        reqwest::get(format!("{base}/_emulator/config")).await.expect("config").json().await.expect("json");
    child.kill().ok();
    child.wait().ok();
    assert_eq!(config["random_durations"], json!({ "min_ms": 1000, "max_ms": 20000 }));
    assert_eq!(config["random_faults"], json!({ "rate": 0.05, "calls": "any" }));
    assert_eq!(config["random_latency"], json!({ "min_ms": 10, "max_ms": 20 }));
}
