//! Submitting a batch: what is sent, which replies are accepted, and how failures are classified.

use std::time::Duration;

use batchd_cloudflare::ErrorKind;
use batchd_core::ApiCode;

use crate::fake::{self, Canned, FakeApi};

#[tokio::test]
async fn a_submit_sends_the_items_byte_for_byte_and_reads_the_request_id() {
    let api = FakeApi::start(vec![Canned::new(200, fake::queued_body("3f1c0a52-6a0e-4d0b"))]).await;
    let requests =
        fake::items(&[r#"{"text" : "a",  "external_reference":"u1"}"#, r#"{"query":"q","contexts":[{"text":"é"}]}"#]);

    let submitted = api.client().submit(&fake::model(), &requests).await.expect("submitted");

    assert_eq!(submitted.request_id.as_str(), "3f1c0a52-6a0e-4d0b");
    let received = api.received();
    assert_eq!(received.len(), 1);
    let expected_body =
        r#"{"requests":[{"text" : "a",  "external_reference":"u1"},{"query":"q","contexts":[{"text":"é"}]}]}"#;
    assert_eq!(received[0].body, expected_body);
    assert_eq!(submitted.body_bytes, expected_body.len());
    assert_eq!(received[0].uri, "/client/v4/accounts/acct0123/ai/run/@cf/baai/bge-m3?queueRequest=true");
    assert_eq!(received[0].authorization.as_deref(), Some(format!("Bearer {}", fake::TOKEN).as_str()));
    assert_eq!(received[0].content_type.as_deref(), Some("application/json"));
}

#[tokio::test]
async fn a_202_is_accepted_too() {
    let api = FakeApi::start(vec![Canned::new(202, fake::queued_body("req-202"))]).await;
    let submitted = api.client().submit(&fake::model(), &fake::items(&["{}"])).await.expect("submitted");
    assert_eq!(submitted.request_id.as_str(), "req-202");
}

#[tokio::test]
async fn capacity_errors_are_rate_limits_and_honour_retry_after() {
    let api = FakeApi::start(vec![
        Canned::new(429, fake::error_body(3040, "Capacity temporarily exceeded, please try again."))
            .header("retry-after", "7"),
    ])
    .await;
    let error = api.client().submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::RateLimited);
    assert!(error.is_retryable());
    assert_eq!((error.http_status, error.api_code.clone()), (Some(429), Some(ApiCode::Number(3040))));
    assert_eq!(error.retry_after, Some(Duration::from_secs(7)));
    assert_eq!(error.message, "Capacity temporarily exceeded, please try again.");
    assert!(!error.is_ambiguous_submit());
}

#[tokio::test]
async fn an_exhausted_daily_allocation_is_its_own_kind_and_reads_http_dates() {
    let api = FakeApi::start(vec![
        Canned::new(429, fake::error_body(3036, "daily free allocation used up"))
            .header("retry-after", "Fri, 01 Jan 2100 00:00:00 GMT"),
    ])
    .await;
    let error = api.client().submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::QuotaExhausted);
    assert!(error.retry_after.expect("retry after") > Duration::from_secs(365 * 86_400));
}

#[tokio::test]
async fn an_html_gateway_page_is_transient_with_a_snippet() {
    let page = "<!DOCTYPE html>\n<html><head><title>api.cloudflare.com | 502: Bad gateway</title></head>\n<body>...</body></html>";
    let api = FakeApi::start(vec![Canned::new(502, page).header("content-type", "text/html")]).await;
    let error = api.client().submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::Transient);
    assert_eq!((error.http_status, error.api_code.clone()), (Some(502), None));
    assert_eq!(error.message, "HTTP 502 with a non-JSON body: api.cloudflare.com | 502: Bad gateway");
    assert!(error.is_ambiguous_submit(), "a gateway may have forwarded the batch");
}

#[tokio::test]
async fn a_bad_token_fails_the_job_with_the_apis_code() {
    let api = FakeApi::start(vec![Canned::new(401, fake::error_body(10000, "Authentication error"))]).await;
    let error = api.client().submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::Permanent);
    assert!(!error.is_retryable());
    let job_error = error.to_job_error();
    assert_eq!(job_error.code, "api_error");
    assert_eq!(job_error.message, "the Batch API refused the batch: Authentication error (code 10000, HTTP 401)");
    assert_eq!((job_error.api_code.clone(), job_error.http_status), (Some(ApiCode::Number(10000)), Some(401)));
}

#[tokio::test]
async fn an_oversized_batch_is_too_large() {
    let api = FakeApi::start(vec![Canned::new(413, fake::error_body(3006, "Request is too large"))]).await;
    let error = api.client().submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::TooLarge);
    assert_eq!(error.api_code.clone(), Some(ApiCode::Number(3006)));
    assert!(!error.is_retryable());
}

#[tokio::test]
async fn an_unroutable_submit_is_permanent() {
    let api = FakeApi::start(vec![Canned::new(404, fake::error_body(7003, "Could not route to /accounts/x"))]).await;
    let error = api.client().submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::Permanent);
}

#[tokio::test]
async fn an_accepted_batch_without_request_id_is_not_resubmitted() {
    let api = FakeApi::start(vec![Canned::new(200, r#"{"result":{"status":"queued"},"success":true}"#)]).await;
    let error = api.client().submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::Permanent);
    assert!(error.is_ambiguous_submit());
}

#[tokio::test]
async fn a_connection_reset_after_sending_is_transient_and_ambiguous() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut buffer = [0_u8; 1024];
        let _ = stream.read(&mut buffer).await;
        stream.set_zero_linger().expect("linger");
        drop(stream);
    });
    let client = fake::client_for(addr, Duration::from_secs(5));
    let error = client.submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::Transient);
    assert_eq!(error.http_status, None);
    assert!(error.message.starts_with("connection failed"), "{}", error.message);
    assert!(error.is_ambiguous_submit());
}

#[tokio::test]
async fn a_refused_connection_is_transient_and_not_ambiguous() {
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let client = fake::client_for(addr, Duration::from_secs(5));
    let error = client.submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail");
    assert_eq!(error.kind, ErrorKind::Transient);
    assert_eq!(error.http_status, None);
    assert!(error.message.starts_with("could not connect"), "{}", error.message);
    assert!(!error.is_ambiguous_submit(), "nothing was sent");
}

#[tokio::test]
async fn a_slow_server_hits_the_request_timeout() {
    let api = FakeApi::start(vec![Canned::new(200, fake::queued_body("late")).delayed(Duration::from_secs(10))]).await;
    let client = fake::client_for(api.addr, Duration::from_millis(300));
    let started = std::time::Instant::now();
    let error = client.submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(error.kind, ErrorKind::Transient);
    assert_eq!(error.http_status, None);
    assert!(error.message.starts_with("request timed out after 300ms"), "{}", error.message);
    assert!(error.is_ambiguous_submit());
    assert_eq!(error.to_job_error().code, "retries_exhausted");
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let api = FakeApi::start(vec![Canned::new(307, "").header("location", "http://127.0.0.1:9/elsewhere")]).await;
    let error = api.client().submit(&fake::model(), &fake::items(&["{}"])).await.expect_err("should fail");
    assert_eq!((error.kind, error.http_status), (ErrorKind::Permanent, Some(307)));
    assert_eq!(api.received().len(), 1);
}
