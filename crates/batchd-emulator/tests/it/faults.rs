//! Injected faults: call-level (status, html, reset, delay) and batch-level ones.

use std::time::{Duration, Instant};

use batchd_emulator::{CallKind, Calls, Fault};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{LLAMA, finish_and_poll, poll, post, post_raw, run_url, start_paused, submit};

fn prompts(n: usize) -> Value {
    (0..n).map(|i| json!({ "prompt": format!("p{i}"), "external_reference": format!("r{i}") })).collect()
}

#[tokio::test]
async fn status_fault_hits_matching_calls_times_n_with_retry_after() {
    let emulator = start_paused().await;
    emulator.inject(Fault::status(429).code(3040).retry_after(2).on(Calls::Submit).times(2));
    let request_body = json!({ "requests": prompts(1) });

    for _ in 0..2 {
        let reply = post(&emulator, LLAMA, &request_body).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reply.error_code(), 3040);
        assert_eq!(reply.body["errors"][0]["message"], "Capacity temporarily exceeded, please try again.");
        assert_eq!(reply.headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("2"));
    }
    let request_id = submit(&emulator, LLAMA, prompts(1)).await;
    // A submit-only fault never hits polls.
    emulator.inject(Fault::status(503).on(Calls::Submit));
    let reply = poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(emulator.pending_faults().len(), 1);

    let submits = emulator.submits();
    assert_eq!(submits.len(), 3);
    assert_eq!(submits[0].fault.as_deref(), Some("status"));
    assert_eq!(submits[0].http_status, 429);
    assert_eq!(submits[0].error_code, Some(3040));
    assert_eq!(submits[2].fault, None);
    assert_eq!(emulator.batch_count(), 1);
}

#[tokio::test]
async fn status_fault_without_code_gets_a_default_and_poll_faults_hit_polls() {
    let emulator = start_paused().await;
    let request_id = submit(&emulator, LLAMA, prompts(1)).await;
    emulator.inject(Fault::status(500).on(Calls::Poll));
    let reply = poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(reply.body["success"], false);
    assert!(reply.body["errors"][0]["code"].is_i64());
    assert!(reply.headers.get("retry-after").is_none());
    let reply = poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn html_fault_answers_a_proxy_page() {
    let emulator = start_paused().await;
    emulator.inject(Fault::html(502));
    let reply = post_raw(&run_url(&emulator, LLAMA), emulator.token(), json!({ "requests": prompts(1) }).to_string())
        .await
        .expect("reply");
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert_eq!(reply.headers.get("content-type").and_then(|v| v.to_str().ok()), Some("text/html"));
    assert_eq!(reply.body, Value::Null, "the body is not JSON");
    let text = reqwest::Client::new()
        .post(run_url(&emulator, LLAMA))
        .bearer_auth(emulator.token())
        .body(json!({ "requests": prompts(1) }).to_string())
        .send()
        .await
        .expect("reply");
    assert_eq!(text.status(), StatusCode::OK, "the fault was used up");
    emulator.inject(Fault::html(502));
    let page = reqwest::Client::new()
        .post(run_url(&emulator, LLAMA))
        .bearer_auth(emulator.token())
        .body("{}")
        .send()
        .await
        .expect("reply")
        .text()
        .await
        .expect("text");
    assert_eq!(page, "<html><body><h1>502 Bad Gateway</h1></body></html>");
}

#[tokio::test]
async fn reset_fault_closes_the_connection_without_a_reply_for_reqwest() {
    let emulator = start_paused().await;
    emulator.inject(Fault::reset().on(Calls::Submit));
    let error = post_raw(&run_url(&emulator, LLAMA), emulator.token(), json!({ "requests": prompts(1) }).to_string())
        .await
        .expect_err("the connection must fail");
    assert!(error.status().is_none(), "{error:?}");
    assert!(error.is_request() || error.is_connect(), "{error:?}");

    // The next call is answered normally.
    let request_id = submit(&emulator, LLAMA, prompts(1)).await;
    let calls = emulator.calls();
    assert_eq!(calls[0].http_status, 0);
    assert_eq!(calls[0].fault.as_deref(), Some("reset"));
    assert_eq!(calls[0].request_id, None);
    assert_eq!(calls[1].request_id.as_deref(), Some(request_id.as_str()));
    assert_eq!(emulator.batch_count(), 1);
}

#[tokio::test]
async fn reset_fault_is_a_tcp_reset_on_a_raw_socket() {
    let emulator = start_paused().await;
    emulator.inject(Fault::reset());
    let body = json!({ "requests": prompts(1) }).to_string();
    let request = format!(
        "POST /client/v4/accounts/{}/ai/run/{}?queueRequest=true HTTP/1.1\r\nHost: localhost\r\n\
         Authorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        emulator.account_id(),
        LLAMA,
        emulator.token(),
        body.len(),
    );
    let mut stream = tokio::net::TcpStream::connect(emulator.addr()).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write request");
    let mut received = Vec::new();
    let outcome = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut received))
        .await
        .expect("the server must close the connection");
    assert!(received.is_empty(), "no HTTP bytes may arrive: {:?}", String::from_utf8_lossy(&received));
    let error = outcome.expect_err("a reset, not a clean close");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset);
}

#[tokio::test]
async fn delay_fault_answers_late_but_normally() {
    let emulator = start_paused().await;
    emulator.inject(Fault::delay(Duration::from_millis(150)));
    let started = Instant::now();
    let request_id = submit(&emulator, LLAMA, prompts(1)).await;
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert!(!request_id.is_empty());
    assert_eq!(emulator.submits()[0].fault.as_deref(), Some("delay"));
}

#[tokio::test]
async fn call_faults_are_used_in_order() {
    let emulator = start_paused().await;
    emulator.inject(Fault::status(503));
    emulator.inject(Fault::status(429));
    let body = json!({ "requests": prompts(1) });
    assert_eq!(post(&emulator, LLAMA, &body).await.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(post(&emulator, LLAMA, &body).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(post(&emulator, LLAMA, &body).await.status, StatusCode::OK);
}

#[tokio::test]
async fn fail_items_and_drop_items_shape_the_next_batch() {
    let emulator = start_paused().await;
    emulator.inject(Fault::fail_items([1, 3]));
    emulator.inject(Fault::drop_items([2]));
    let request_id = submit(&emulator, LLAMA, prompts(5)).await;
    let clean_id = submit(&emulator, LLAMA, prompts(5)).await;
    assert_eq!(emulator.submits()[0].fault.as_deref(), Some("fail_items+drop_items"));

    let reply = finish_and_poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(reply.status, StatusCode::OK);
    let responses = reply.body["result"]["results"].as_array().expect("results");
    let mut ids: Vec<u64> = responses.iter().map(|r| r["index"].as_u64().expect("id")).collect();
    ids.sort();
    assert_eq!(ids, vec![0, 1, 3, 4]);
    for response in responses {
        let failed = response["index"] == 1 || response["index"] == 3;
        assert_eq!(response["success"], !failed);
        assert_eq!(response.get("error").is_some(), failed);
        assert_eq!(response.get("result").is_some(), !failed);
        assert!(response["external_reference"].is_string());
    }

    let reply = poll(&emulator, LLAMA, &clean_id).await;
    let responses = reply.body["result"]["results"].as_array().expect("results");
    assert_eq!(responses.len(), 5);
    assert!(responses.iter().all(|r| r["success"] == true));
}

#[tokio::test]
async fn fail_batch_answers_500_5001_forever_once_done() {
    let emulator = start_paused().await;
    emulator.inject(Fault::fail_batch());
    let request_id = submit(&emulator, LLAMA, prompts(2)).await;
    let reply = poll(&emulator, LLAMA, &request_id).await;
    assert_eq!(reply.body["result"]["status"], "queued");
    emulator.set_timing(Duration::ZERO, Duration::ZERO);
    for _ in 0..3 {
        let reply = poll(&emulator, LLAMA, &request_id).await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(reply.error_code(), 5001);
        assert_eq!(reply.body["errors"][0]["message"], "Model execution failed");
    }
    let polls = emulator.polls();
    assert!(polls.iter().skip(1).all(|call| call.kind == CallKind::Poll && call.http_status == 500));
}
