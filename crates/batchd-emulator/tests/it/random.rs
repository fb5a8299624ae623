//! Chaos helpers: per-batch random durations, random transient faults, extra listeners and the call log's
//! `first_reference` and `port`.

use std::time::Duration;

use batchd_emulator::{CallKind, DurationRange, Emulator, EmulatorConfig, EmulatorHandle, RandomFaults};
use reqwest::StatusCode;
use serde_json::json;

use crate::control::{control_get, control_post};
use crate::{LLAMA, poll, post, post_raw, run_url, start, submit};

async fn phases(emulator: &EmulatorHandle, ids: &[String]) -> Vec<String> {
    let mut statuses = Vec::new();
    for id in ids {
        let reply = poll(emulator, LLAMA, id).await;
        let status = if reply.body["result"]["responses"].is_array() {
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
        ..EmulatorConfig::default()
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(submit(&emulator, LLAMA, json!([{ "prompt": format!("p{i}") }])).await);
    }
    // Before the shortest duration nothing is done; a quarter in, every batch has started.
    let early = phases(&emulator, &ids).await;
    assert!(early.iter().all(|s| s != "done"), "{early:?}");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let middle = phases(&emulator, &ids).await;
    let done = middle.iter().filter(|s| *s == "done").count();
    assert!(done > 0 && done < ids.len(), "durations differ per batch: {middle:?}");
    assert!(middle.iter().any(|s| s == "running"), "{middle:?}");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let late = phases(&emulator, &ids).await;
    assert!(late.iter().all(|s| s == "done"), "{late:?}");
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
    let emulator = start(EmulatorConfig {
        random_latency: Some(DurationRange::new(Duration::from_millis(400), Duration::from_millis(500))),
        ..EmulatorConfig::default()
    })
    .await;
    let url = run_url(&emulator, LLAMA);
    let token = emulator.token().to_owned();
    let started = std::time::Instant::now();
    let pending =
        tokio::spawn(
            async move { post_raw(&url, &token, json!({ "requests": [{ "prompt": "x" }] }).to_string()).await },
        );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(emulator.batch_count(), 1, "the batch exists before its reply leaves");
    assert!(!pending.is_finished(), "the reply is still on its way");
    let reply = pending.await.expect("join").expect("reply");
    assert_eq!(reply.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(400));
    emulator.set_random_latency(None);
    let started = std::time::Instant::now();
    submit(&emulator, LLAMA, json!([{ "prompt": "y" }])).await;
    assert!(started.elapsed() < Duration::from_millis(300), "latency off again");
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
