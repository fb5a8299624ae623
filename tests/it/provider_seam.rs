//! The provider seam, shown by a second provider that exists only here: one whose batches are created in two
//! requests (an upload, then the batch) and whose results are a download after the poll says they are ready,
//! driven through the real pipeline, a real Redis and a daemon that serves Cloudflare beside it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use batchd_core::{ItemResponse, JobOutput, ModelName, RequestId, ResultStatus};
use batchd_provider::{
    ApiError, BatchLimits, BodyShape, Call, CancelOutcome, ErrorKind, PendingStatus, Polled, Provider, RateBucket,
    RemoteBatch, ReplyHold, SubmitBatch, Submitted,
};
use batchd_tests::{Daemon, World, bge_m3_job};
use futures::future::BoxFuture;
use serde_json::json;
use serde_json::value::RawValue;

const WAIT: Duration = Duration::from_secs(30);

/// What the test provider was asked, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Asked {
    /// An upload of a chunk's items (recorded through the checkpoint before the batch is created).
    Upload,
    /// A batch created.
    Create,
    /// A resumed submit found the batch an interrupted one had created.
    Found,
    /// A status poll.
    Poll,
    /// A results download.
    Fetch,
}

/// A remote batch as the test provider keeps it.
#[derive(Debug)]
struct Batch {
    /// The uploaded items, as sent.
    items: Vec<String>,
    /// Polls it answered so far.
    polls: usize,
    /// Which job and chunk created it (what a real provider keeps in its metadata).
    tag: (String, u32),
}

/// A provider whose results are downloaded: pending for two polls, then ready with a results URL.
#[derive(Debug, Default)]
struct DownloadProvider {
    /// Remote batches by id.
    batches: Mutex<HashMap<String, Batch>>,
    /// Uploaded files by id.
    uploads: Mutex<HashMap<String, Vec<String>>>,
    /// Every call, in order.
    asked: Mutex<Vec<Asked>>,
    /// Creates whose reply is lost (the batch exists, the submit fails as possibly delivered).
    lose_create_replies: Mutex<usize>,
    /// While set, every submit waits (a provider that has stopped answering) until it is cleared.
    stalled: AtomicBool,
    /// Wakes stalled submits.
    unstall: tokio::sync::Notify,
    /// Submits in flight now, and the most at once.
    in_submit: AtomicUsize,
    max_in_submit: AtomicUsize,
}

impl DownloadProvider {
    /// Uploads a batch's items and creates the batch (looking first for one an interrupted attempt created).
    async fn create(&self, batch: SubmitBatch<'_>) -> Result<Submitted, ApiError> {
        {
            let tag = (batch.tag.job_id.to_string(), batch.tag.chunk);
            if let Some(resume) = batch.resume {
                // Look before creating again: an interrupted attempt may have created the batch already.
                let found = self
                    .batches
                    .lock()
                    .expect("lock")
                    .iter()
                    .find(|(_, remote)| remote.tag == tag)
                    .map(|(id, _)| id.clone());
                if let Some(id) = found {
                    self.ask(Asked::Found);
                    let remote = RemoteBatch { id: Some(RequestId::parse(&id).expect("id")), ..resume.clone() };
                    return Ok(Submitted { remote, status: "in_progress".into(), body_bytes: 0 });
                }
            }
            let upload = match batch.resume.and_then(|resume| resume.input_file.clone()) {
                Some(file) => file,
                None => {
                    self.ask(Asked::Upload);
                    let mut uploads = self.uploads.lock().expect("lock");
                    let file = format!("file-{}", uploads.len());
                    uploads.insert(file.clone(), batch.items.iter().map(|item| item.get().to_owned()).collect());
                    file
                }
            };
            let mut remote = RemoteBatch { input_file: Some(upload.clone()), ..RemoteBatch::default() };
            batch.checkpoint.record(&remote).await.map_err(|error| transient(&error, false))?;
            self.ask(Asked::Create);
            let items = self
                .uploads
                .lock()
                .expect("lock")
                .get(&upload)
                .cloned()
                .ok_or_else(|| transient("no such file", false))?;
            let id = {
                let mut batches = self.batches.lock().expect("lock");
                let id = format!("dl-{}", batches.len());
                batches.insert(id.clone(), Batch { items, polls: 0, tag });
                id
            };
            let mut lose = self.lose_create_replies.lock().expect("lock");
            if *lose > 0 {
                *lose -= 1;
                return Err(transient("the create's reply was lost", true));
            }
            remote.id = Some(RequestId::parse(&id).expect("id"));
            Ok(Submitted { remote, status: "in_progress".into(), body_bytes: 0 })
        }
    }

    fn ask(&self, what: Asked) {
        self.asked.lock().expect("lock").push(what);
    }

    fn count(&self, what: &Asked) -> usize {
        self.asked.lock().expect("lock").iter().filter(|asked| *asked == what).count()
    }
}

fn transient(message: &str, maybe_delivered: bool) -> ApiError {
    ApiError {
        kind: ErrorKind::Transient,
        http_status: Some(500),
        api_code: None,
        message: message.to_owned(),
        retry_after: Some(Duration::from_millis(10)),
        maybe_delivered,
    }
}

impl Provider for DownloadProvider {
    fn name(&self) -> &'static str {
        "fake-download"
    }

    fn limits(&self) -> BatchLimits {
        // Three items per batch, so a job of seven is three batches merged in order.
        BatchLimits {
            max_body_bytes: 1 << 20,
            max_items: Some(3),
            body: BodyShape { envelope: 0, per_item: 64, separator: 1 },
        }
    }

    fn rate_bucket(&self, _model: &ModelName, _call: Call) -> Option<RateBucket> {
        None
    }

    fn submit<'a>(&'a self, batch: SubmitBatch<'a>) -> BoxFuture<'a, Result<Submitted, ApiError>> {
        Box::pin(async move {
            let now = self.in_submit.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_submit.fetch_max(now, Ordering::SeqCst);
            loop {
                let unstalled = self.unstall.notified();
                if !self.stalled.load(Ordering::SeqCst) {
                    break;
                }
                unstalled.await;
            }
            let submitted = self.create(batch).await;
            self.in_submit.fetch_sub(1, Ordering::SeqCst);
            submitted
        })
    }

    fn poll<'a>(
        &'a self,
        _model: &'a ModelName,
        remote: &'a RemoteBatch,
        _n_items: usize,
    ) -> BoxFuture<'a, Result<(Polled, Vec<ReplyHold>), ApiError>> {
        Box::pin(async move {
            self.ask(Asked::Poll);
            let id = remote.id.as_ref().expect("polled with an id").to_string();
            let mut batches = self.batches.lock().expect("lock");
            let batch = batches.get_mut(&id).expect("a batch this provider created");
            batch.polls += 1;
            let polled = if batch.polls < 3 {
                Polled::Pending(PendingStatus::documented("in_progress"))
            } else {
                Polled::Ready(RemoteBatch { results_url: Some(format!("mem://{id}/results")), ..remote.clone() })
            };
            Ok((polled, Vec::new()))
        })
    }

    fn fetch_results<'a>(
        &'a self,
        _model: &'a ModelName,
        remote: &'a RemoteBatch,
        n_items: usize,
    ) -> BoxFuture<'a, Result<(JobOutput, Vec<ReplyHold>), ApiError>> {
        Box::pin(async move {
            self.ask(Asked::Fetch);
            let url = remote.results_url.as_deref().expect("fetched after Ready");
            let id = url.trim_start_matches("mem://").trim_end_matches("/results");
            let batches = self.batches.lock().expect("lock");
            let items = &batches.get(id).expect("a batch this provider created").items;
            assert_eq!(items.len(), n_items);
            let responses = items
                .iter()
                .enumerate()
                .map(|(index, item)| ItemResponse {
                    index,
                    success: true,
                    result: Some(
                        RawValue::from_string(
                            json!({"echo": serde_json::from_str::<serde_json::Value>(item).expect("json")}).to_string(),
                        )
                        .expect("json"),
                    ),
                    error: None,
                    external_reference: None,
                    resent: false,
                })
                .collect();
            Ok((
                JobOutput { responses, usage: json!({"input_tokens": n_items}), failed_batches: Vec::new() },
                Vec::new(),
            ))
        })
    }

    fn cancel<'a>(
        &'a self,
        _model: &'a ModelName,
        _remote: &'a RemoteBatch,
    ) -> BoxFuture<'a, Result<CancelOutcome, ApiError>> {
        Box::pin(async { Ok(CancelOutcome::Unsupported) })
    }
}

fn download_job(id: &str, n: usize) -> serde_json::Value {
    json!({
        "id": id,
        "model": "fake-download/echo-1",
        "requests": (0..n).map(|i| json!({"q": i})).collect::<Vec<_>>(),
    })
}

fn echoed(entry: &batchd_core::ResultEntry) -> Vec<serde_json::Value> {
    entry
        .result
        .as_ref()
        .expect("result")
        .responses
        .iter()
        .map(|response| {
            let value: serde_json::Value =
                serde_json::from_str(response.result.as_ref().expect("answered").get()).expect("json");
            value["echo"]["q"].clone()
        })
        .collect()
}

#[tokio::test]
async fn a_provider_whose_results_are_a_download_runs_through_the_real_pipeline_beside_cloudflare() {
    let world = World::new().await;
    let provider = Arc::new(DownloadProvider::default());
    let daemon = Daemon::start_with_providers(world.settings.clone(), &world.emulator, vec![provider.clone()]);

    world.enqueue(&download_job("dl-1", 7)).await;
    world.enqueue(&bge_m3_job("cf-1", 3)).await;

    let downloaded = world.wait_for_result("dl-1", WAIT).await;
    assert_eq!(downloaded.status, ResultStatus::Completed, "{:?}", downloaded.error);
    assert_eq!(echoed(&downloaded), (0..7).map(|i| json!(i)).collect::<Vec<_>>(), "merged back in request order");
    assert_eq!(downloaded.request_ids.len(), 3, "seven items, three per batch");
    let cloudflare = world.wait_for_result("cf-1", WAIT).await;
    assert_eq!(cloudflare.status, ResultStatus::Completed, "one daemon serves both providers");

    // Each batch: one upload recorded before one create, pending twice, then ready and downloaded once.
    assert_eq!(provider.count(&Asked::Upload), 3);
    assert_eq!(provider.count(&Asked::Create), 3);
    assert_eq!(provider.count(&Asked::Poll), 9);
    assert_eq!(provider.count(&Asked::Fetch), 3);
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_submit_interrupted_after_its_create_resumes_from_its_checkpoint_without_a_second_batch() {
    let world = World::new().await;
    let provider = Arc::new(DownloadProvider::default());
    *provider.lose_create_replies.lock().expect("lock") = 1;
    let mut settings = world.settings.clone();
    settings.retry.initial_backoff_ms = 10;
    let daemon = Daemon::start_with_providers(settings, &world.emulator, vec![provider.clone()]);

    world.enqueue(&download_job("dl-lost", 2)).await;
    let entry = world.wait_for_result("dl-lost", WAIT).await;
    assert_eq!(entry.status, ResultStatus::Completed, "{:?}", entry.error);
    assert_eq!(echoed(&entry), [json!(0), json!(1)]);
    // The lost reply made the engine resubmit with what the first attempt recorded: the upload was reused and the
    // batch found, not created again.
    assert_eq!(provider.count(&Asked::Upload), 1, "{:?}", provider.asked.lock().expect("lock"));
    assert_eq!(provider.count(&Asked::Create), 1, "{:?}", provider.asked.lock().expect("lock"));
    assert_eq!(provider.count(&Asked::Found), 1);
    let ledger = world.ledger("dl-lost").await;
    assert_eq!(ledger.get("possible_duplicate_submits").map(String::as_str), Some("1"), "the resubmit is counted");
    daemon.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_model_whose_provider_is_not_configured_is_refused_at_take_in_naming_the_setting() {
    let world = World::new().await;
    let daemon = world.daemon();
    world.enqueue(&json!({"id": "oa-1", "model": "openai/gpt-4o-mini", "requests": [{"messages": []}]})).await;
    world.enqueue(&json!({"id": "nx-1", "model": "nosuch/model", "requests": [{}]})).await;

    let refused = world.wait_for_result("oa-1", WAIT).await;
    assert_eq!(refused.status, ResultStatus::Failed);
    let error = refused.error.expect("error");
    assert_eq!(error.code, "invalid_job");
    assert!(error.message.contains("OPENAI_API_KEY") && error.message.contains("[openai]"), "{}", error.message);
    let unknown = world.wait_for_result("nx-1", WAIT).await.error.expect("error");
    assert!(unknown.message.contains("nosuch provider"), "{}", unknown.message);
    assert_eq!(world.emulator.calls().len(), 0, "nothing was sent anywhere");
    daemon.stop().await.expect("clean stop");
}

/// With `workers.calls_per_provider`, a provider that stops answering holds at most that many workers: the other
/// provider's jobs go on, and the held-back jobs run once it answers again.
#[tokio::test]
async fn a_provider_that_stops_answering_holds_no_more_than_its_calls_and_the_other_provider_goes_on() {
    let mut world = World::new().await;
    world.settings.workers.submit_concurrency = 4;
    world.settings.workers.poll_concurrency = 4;
    world.settings.workers.calls_per_provider = 2;
    let provider = Arc::new(DownloadProvider::default());
    provider.stalled.store(true, Ordering::SeqCst);
    let daemon = Daemon::start_with_providers(world.settings.clone(), &world.emulator, vec![provider.clone()]);

    for i in 0..6 {
        world.enqueue(&download_job(&format!("dl-{i}"), 1)).await;
    }
    batchd_tests::wait_until("two stalled submits", WAIT, async || provider.in_submit.load(Ordering::SeqCst) == 2)
        .await;
    // Without the cap, four stalled take-ins would hold all four workers and nothing else would be taken in.
    for i in 0..3 {
        world.enqueue(&bge_m3_job(&format!("cf-{i}"), 2)).await;
    }
    for i in 0..3 {
        let result = world.wait_for_result(&format!("cf-{i}"), WAIT).await;
        assert_eq!(result.status, ResultStatus::Completed);
    }
    assert_eq!(provider.in_submit.load(Ordering::SeqCst), 2, "the stalled provider still holds its two calls");

    provider.stalled.store(false, Ordering::SeqCst);
    provider.unstall.notify_waiters();
    for i in 0..6 {
        let result = world.wait_for_result(&format!("dl-{i}"), WAIT).await;
        assert_eq!(result.status, ResultStatus::Completed, "{:?}", result.error);
    }
    assert_eq!(provider.max_in_submit.load(Ordering::SeqCst), 2, "never more than the cap at once");
    daemon.stop().await.expect("clean stop");
}
