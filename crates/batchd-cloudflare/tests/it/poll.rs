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
