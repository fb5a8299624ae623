//! The provider against the Message Batches emulator over HTTP: cancel reaches the API and a canceled batch
//! answers with what finished; an uncertain create is found by the next attempt instead of repeated; another
//! chunk's batch of the same size is told apart by its custom ids.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use batchd_anthropic::{AnthropicProvider, AnthropicSettings, ApiKey};
use batchd_core::{JobId, JobOutput, ModelName};
use batchd_emulator::{AnthropicCallKind, AnthropicCalls, AnthropicFault, Emulator, EmulatorConfig, EmulatorHandle};
use batchd_provider::{
    BatchTag, CancelOutcome, Checkpoint, ErrorKind, Polled, Provider, RemoteBatch, SubmitBatch, Submitted,
};
use futures::future::BoxFuture;
use serde_json::value::RawValue;

/// Records what a submit checkpoints, as the ledger would.
#[derive(Default)]
struct Recorded(Mutex<Option<RemoteBatch>>);

impl Checkpoint for Recorded {
    fn record<'a>(&'a self, remote: &'a RemoteBatch) -> BoxFuture<'a, Result<(), String>> {
        *self.0.lock().expect("lock") = Some(remote.clone());
        Box::pin(async { Ok(()) })
    }
}

async fn emulator() -> EmulatorHandle {
    Emulator::start(EmulatorConfig::default(), "127.0.0.1:0".parse().expect("addr")).await.expect("emulator")
}

fn provider(emulator: &EmulatorHandle) -> AnthropicProvider {
    let control = emulator.anthropic();
    let mut settings = AnthropicSettings::new(ApiKey::new(control.api_key()));
    settings.base_url = control.base_url();
    settings.request_timeout = Duration::from_secs(2);
    AnthropicProvider::new(&settings).expect("provider")
}

fn items(n: usize) -> Vec<Box<RawValue>> {
    (0..n)
        .map(|i| {
            let text = format!(r#"{{"max_tokens":16,"messages":[{{"role":"user","content":"question {i}"}}]}}"#);
            RawValue::from_string(text).expect("json")
        })
        .collect()
}

async fn submit(
    provider: &AnthropicProvider,
    job: &str,
    chunk: u32,
    attempt: u64,
    items: &[Box<RawValue>],
    resume: Option<&RemoteBatch>,
    checkpoint: &Recorded,
) -> Result<Submitted, batchd_provider::ApiError> {
    let model = ModelName::parse("anthropic/claude-sonnet-4-5").expect("model");
    let job_id = JobId::parse(job).expect("job id");
    let items: Vec<&RawValue> = items.iter().map(AsRef::as_ref).collect();
    let batch = SubmitBatch {
        model: &model,
        items: &items,
        endpoint: None,
        tag: BatchTag { namespace: "test", job_id: &job_id, chunk, attempt },
        resume,
        checkpoint,
    };
    provider.submit(batch).await
}

/// Polls until the batch ends, then reads its results.
async fn results(provider: &AnthropicProvider, remote: &RemoteBatch, n_items: usize) -> JobOutput {
    let model = ModelName::parse("anthropic/claude-sonnet-4-5").expect("model");
    let started = Instant::now();
    loop {
        match provider.poll(&model, remote, n_items).await.expect("poll").0 {
            Polled::Ready(ready) => {
                assert!(ready.results_url.is_some(), "an ended batch names its results_url");
                return provider.fetch_results(&model, &ready, n_items).await.expect("results").0;
            }
            Polled::Pending(status) => assert!(status.is_documented(), "{}", status.as_str()),
            Polled::Done(_) => panic!("results come from fetch_results"),
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the batch did not end");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn error_code(output: &JobOutput, index: usize) -> String {
    let error: serde_json::Value =
        serde_json::from_str(output.responses[index].error.as_ref().expect("error").get()).expect("json");
    error["code"].as_str().expect("code").to_owned()
}

#[tokio::test]
async fn cancel_reaches_the_api_and_the_batch_answers_with_what_finished() {
    let emulator = emulator().await;
    emulator.anthropic().set_timing(Duration::from_secs(60), Duration::from_millis(50));
    let provider = provider(&emulator);
    let checkpoint = Recorded::default();
    let items = items(3);
    let submitted = submit(&provider, "cancel-1", 0, 1, &items, None, &checkpoint).await.expect("submit");
    let id = submitted.remote.id.clone().expect("id");
    assert!(emulator.anthropic().finish_items(id.as_str(), 1));

    let model = ModelName::parse("anthropic/claude-sonnet-4-5").expect("model");
    assert_eq!(provider.cancel(&model, &submitted.remote).await.expect("cancel"), CancelOutcome::Requested);
    let cancels = emulator.anthropic().calls_of(AnthropicCallKind::Cancel);
    assert_eq!(cancels.len(), 1);
    assert_eq!((cancels[0].status, cancels[0].batch_id.as_deref()), (200, Some(id.as_str())));

    let output = results(&provider, &submitted.remote, 3).await;
    assert!(output.responses[0].success, "the request that finished before the cancel keeps its message");
    assert_eq!((error_code(&output, 1), error_code(&output, 2)), ("canceled".to_owned(), "canceled".to_owned()));
    // A second cancel, of an ended batch, is not a failure.
    assert_eq!(provider.cancel(&model, &submitted.remote).await.expect("cancel"), CancelOutcome::Requested);
}

#[tokio::test]
async fn an_uncertain_create_is_found_by_the_next_attempt_not_repeated() {
    let emulator = emulator().await;
    // The batch runs until the test ends it.
    emulator.anthropic().set_timing(Duration::from_secs(600), Duration::from_millis(50));
    let provider = provider(&emulator);
    let items = items(4);
    let checkpoint = Recorded::default();
    // The batch is created, its reply lost.
    emulator.anthropic().inject(AnthropicFault::status_after(500).on(AnthropicCalls::Create));
    let error = submit(&provider, "uncertain-1", 2, 1, &items, None, &checkpoint).await.expect_err("reply lost");
    assert!(error.maybe_delivered, "a 500 on create may have created the batch: {error}");
    let recorded = checkpoint.0.lock().expect("lock").clone().expect("the chunk's mark is recorded before the create");
    assert!(recorded.id.is_none() && recorded.tag.is_some());

    // While the batch runs its custom ids cannot be read: the next attempt waits, using no attempt, creating none.
    let waiting = submit(&provider, "uncertain-1", 2, 2, &items, Some(&recorded), &checkpoint).await;
    let error = waiting.expect_err("the running batch cannot be checked yet");
    assert_eq!(error.kind, ErrorKind::AwaitingLookUp, "{error}");
    assert!(error.kind.is_throttle(), "a wait uses no attempt");
    assert_eq!(emulator.anthropic().calls_of(AnthropicCallKind::Create).len(), 1, "no second create");

    // Once it has ended, its custom ids carry the chunk's nonce: it is adopted.
    let batch_ids = emulator.anthropic().batch_ids();
    assert!(emulator.anthropic().finish_items(&batch_ids[0], 4));
    let recorded = checkpoint.0.lock().expect("lock").clone().expect("recorded");
    let again = submit(&provider, "uncertain-1", 2, 3, &items, Some(&recorded), &checkpoint).await.expect("found");
    let creates = emulator.anthropic().calls_of(AnthropicCallKind::Create);
    assert_eq!(creates.len(), 1, "no second create");
    assert_eq!(again.remote.id.as_ref().map(|id| id.as_str()), creates[0].batch_id.as_deref());
    assert_eq!(emulator.anthropic().batch_count(), 1);
    assert!(!emulator.anthropic().calls_of(AnthropicCallKind::List).is_empty(), "it looked");

    let output = results(&provider, &again.remote, 4).await;
    assert_eq!(output.n_failed(), 0);
    for (index, response) in output.responses.iter().enumerate() {
        assert!(response.result.as_ref().expect("message").get().contains(&format!("question {index}")));
    }
}

#[tokio::test]
async fn another_namespaces_batch_of_the_same_job_is_not_taken_for_the_lost_one() {
    let emulator = emulator().await;
    // Batches run until the test ends them.
    emulator.anthropic().set_timing(Duration::from_secs(600), Duration::from_millis(1));
    let provider = provider(&emulator);
    let items = items(2);
    let checkpoint = Recorded::default();
    // The chunk's create fails before anything is created (a reset), but it cannot know that.
    emulator.anthropic().inject(AnthropicFault::reset().on(AnthropicCalls::Create));
    let error = submit(&provider, "inv-42", 0, 1, &items, None, &checkpoint).await.expect_err("reset");
    assert!(error.maybe_delivered, "{error}");
    let recorded = checkpoint.0.lock().expect("lock").clone().expect("recorded");
    // Meanwhile another namespace on the same account creates a batch for its own job `inv-42`, chunk 0, of the
    // same size (its own ledger: its own nonce).
    let other = submit(&provider, "inv-42", 0, 1, &items, None, &Recorded::default()).await.expect("other");
    let other_id = other.remote.id.clone().expect("id");

    // It runs: it cannot be checked, so it is neither adopted nor duplicated; the look waits.
    let error = submit(&provider, "inv-42", 0, 2, &items, Some(&recorded), &checkpoint).await.expect_err("waits");
    assert_eq!(error.kind, ErrorKind::AwaitingLookUp, "{error}");
    assert_eq!(emulator.anthropic().batch_count(), 1);

    // Once it has ended, its custom ids carry the other nonce: a batch of this chunk's own is created.
    assert!(emulator.anthropic().finish_items(other_id.as_str(), 2));
    results(&provider, &other.remote, 2).await;
    let recorded = checkpoint.0.lock().expect("lock").clone().expect("recorded");
    let mine = submit(&provider, "inv-42", 0, 3, &items, Some(&recorded), &checkpoint).await.expect("created");
    assert_ne!(mine.remote.id, other.remote.id, "the other namespace's batch was recognised by its custom ids");
    assert_eq!(emulator.anthropic().batch_count(), 2);
    let mine_id = mine.remote.id.clone().expect("id");
    assert!(emulator.anthropic().finish_items(mine_id.as_str(), 2));
    assert_eq!(results(&provider, &mine.remote, 2).await.n_failed(), 0);
}

#[tokio::test]
async fn a_results_download_takes_room_in_the_budget_and_stops_at_the_reply_limit() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use batchd_provider::{ReplyBudget, ReplyHold};

    let emulator = emulator().await;
    emulator.anthropic().set_timing(Duration::from_millis(1), Duration::from_millis(1));
    let held = Arc::new(AtomicUsize::new(0));
    let (wait, try_now) = (Arc::clone(&held), Arc::clone(&held));
    let budget = ReplyBudget::new(
        move |bytes| {
            wait.fetch_add(bytes, Ordering::SeqCst);
            async { Box::new(()) as ReplyHold }
        },
        move |bytes| {
            try_now.fetch_add(bytes, Ordering::SeqCst);
            Some(Box::new(()) as ReplyHold)
        },
    );
    let provider = provider(&emulator).with_reply_budget(budget);
    let items = items(20);
    let submitted = submit(&provider, "budget", 0, 1, &items, None, &Recorded::default()).await.expect("submit");
    let output = results(&provider, &submitted.remote, 20).await;
    assert_eq!(output.n_failed(), 0);
    assert!(held.load(Ordering::SeqCst) >= 20 * 200, "room was taken for the download: {held:?}");

    // The same results, read with a reply limit below their size, are refused rather than held.
    let control = emulator.anthropic();
    let mut settings = AnthropicSettings::new(ApiKey::new(control.api_key()));
    settings.base_url = control.base_url();
    settings.max_reply_bytes = 1024;
    let small = AnthropicProvider::new(&settings).expect("provider");
    let model = ModelName::parse("anthropic/claude-sonnet-4-5").expect("model");
    let Polled::Ready(ready) = small.poll(&model, &submitted.remote, 20).await.expect("poll").0 else {
        panic!("the batch has ended")
    };
    let Err(error) = small.fetch_results(&model, &ready, 20).await else { panic!("read past the reply limit") };
    assert_eq!(error.kind, ErrorKind::ReplyTooLarge, "{error}");
}
