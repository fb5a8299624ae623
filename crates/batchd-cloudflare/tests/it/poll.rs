//! Polling a batch: pending states, results in request order, and a batch the API no longer knows.

use batchd_cloudflare::{ErrorKind, PendingStatus, PollStatus};
use batchd_core::RequestId;

use crate::fake::{self, Canned, FakeApi};

fn request_id() -> RequestId {
    RequestId::parse("3f1c0a52-6a0e-4d0b").expect("id")
}

#[tokio::test]
async fn a_poll_sends_the_request_id_and_reads_pending_then_done() {
    let api = FakeApi::start(vec![
        Canned::new(200, r#"{"result":{"status":"queued","request_id":"3f1c0a52-6a0e-4d0b"},"success":true}"#),
        Canned::new(200, r#"{"result":{"status":"running","request_id":"3f1c0a52-6a0e-4d0b"},"success":true}"#),
        Canned::new(
            200,
            r#"{"result":{"responses":[{"id":1,"result":{"r":1},"success":true,"external_reference":"b"},{"id":0,"result":{"r":0},"success":true,"external_reference":"a"}],"usage":{"prompt_tokens":3,"completion_tokens":0,"total_tokens":3}},"success":true,"errors":[],"messages":[]}"#,
        ),
    ])
    .await;
    let client = api.client();

    assert!(matches!(
        client.poll(&fake::model(), &request_id(), 2).await,
        Ok(PollStatus::Pending(PendingStatus::Queued))
    ));
    assert!(matches!(
        client.poll(&fake::model(), &request_id(), 2).await,
        Ok(PollStatus::Pending(PendingStatus::Running))
    ));
    let Ok(PollStatus::Done(output)) = client.poll(&fake::model(), &request_id(), 2).await else {
        panic!("expected the batch to be done");
    };

    let results: Vec<&str> = output.responses.iter().map(|r| r.result.as_deref().expect("result").get()).collect();
    assert_eq!(results, [r#"{"r":0}"#, r#"{"r":1}"#]);
    assert_eq!(output.usage["total_tokens"], 3);
    let received = api.received();
    assert_eq!(received[0].body, r#"{"request_id":"3f1c0a52-6a0e-4d0b"}"#);
    assert_eq!(received[0].uri, "/client/v4/accounts/acct0123/ai/run/@cf/baai/bge-m3?queueRequest=true");
}

#[tokio::test]
async fn a_404_on_poll_means_the_results_are_gone() {
    let api = FakeApi::start(vec![Canned::new(404, fake::error_body(7003, "Not found"))]).await;
    let error = api.client().poll(&fake::model(), &request_id(), 2).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::NotFound);
    assert_eq!(error.http_status, Some(404));
    assert!(!error.is_retryable());
    assert!(!error.is_ambiguous_submit());
    assert_eq!(error.to_job_error().code, "results_gone");
}

#[tokio::test]
async fn a_failed_batch_is_reported_as_such() {
    let api = FakeApi::start(vec![Canned::new(500, fake::error_body(5001, "Model execution failed"))]).await;
    let error = api.client().poll(&fake::model(), &request_id(), 2).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::BatchFailed);
    assert_eq!(error.to_job_error().code, "batch_failed");
}

/// A server that answers every request with a chunked 200 reply of `chunks` pieces of 1 KiB, sent one by one (no
/// `Content-Length`, so only counting what arrives can stop it).
async fn chunked_server(chunks: usize) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = vec![0u8; 64 * 1024];
                let _ = socket.read(&mut request).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let piece = format!("400\r\n{}\r\n", " ".repeat(1024));
                for _ in 0..chunks {
                    if socket.write_all(piece.as_bytes()).await.is_err() {
                        return; // the client stopped reading: what this test wants
                    }
                }
                let _ = socket.write_all(b"0\r\n\r\n").await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_reply_over_the_cap_is_refused_before_it_is_held() {
    // Declared too large: refused from the header, before the body.
    let big = format!(r#"{{"result":{{"responses":[{{"id":0,"result":"{}"}}]}}}}"#, "x".repeat(10_000));
    let api = FakeApi::start(vec![Canned::new(200, big)]).await;
    let settings = batchd_cloudflare::ClientSettings {
        max_reply_bytes: 4096,
        ..fake::settings_for(api.addr, std::time::Duration::from_secs(5))
    };
    let client = batchd_cloudflare::BatchClient::new(settings).expect("client");
    let error = client.poll(&fake::model(), &request_id(), 1).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::ReplyTooLarge);
    assert!(error.message.contains("10047 bytes or more, over the limit of 4096 bytes"), "{}", error.message);
    assert_eq!(error.to_job_error().code, "reply_too_large");

    // Sent in pieces without a declared length: refused once the pieces pass the cap (100 MiB never arrives).
    let addr = chunked_server(100 * 1024).await;
    let settings = batchd_cloudflare::ClientSettings {
        max_reply_bytes: 64 * 1024,
        ..fake::settings_for(addr, std::time::Duration::from_secs(5))
    };
    let client = batchd_cloudflare::BatchClient::new(settings).expect("client");
    let error = client.poll(&fake::model(), &request_id(), 1).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::ReplyTooLarge, "{error}");
    assert!(error.message.contains("over the limit of 65536 bytes"), "{}", error.message);

    // Under the cap, the same chunked reply is read whole (then found to be no JSON object).
    let addr = chunked_server(4).await;
    let settings = batchd_cloudflare::ClientSettings {
        max_reply_bytes: 64 * 1024,
        ..fake::settings_for(addr, std::time::Duration::from_secs(5))
    };
    let client = batchd_cloudflare::BatchClient::new(settings).expect("client");
    let error = client.poll(&fake::model(), &request_id(), 1).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::Transient, "{error}");
}
