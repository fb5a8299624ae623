//! Enqueues one job and reads its result through a consumer group, against a running daemon.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6399 BATCHD_NAMESPACE=batchd \
//!   cargo run -p batchd-producer --example enqueue_and_read -- [JOB_ID [PROVIDER]]
//! ```
//!
//! PROVIDER picks the job: `cloudflare` (the default: Workers AI, `@cf/...`), `openai` (OpenAI Batch,
//! `openai/...`) or `anthropic` (Anthropic Message Batches, `anthropic/...`). The daemon routes a job by its model
//! name; only the request items differ (each the provider's own request body, without `model`).
//!
//! Prints one JSON line `{"job_id":..,"status":..,"responses":N,"succeeded":N,"redelivered":..}` and exits 0 when
//! the job completed; exits 1 with a one-line error otherwise (or after 60 s without its result).

use std::time::{Duration, Instant};

use batchd_producer::{NewJob, Producer, ReaderOptions, ResultStatus};
use serde_json::json;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("enqueue_and_read: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let namespace = std::env::var("BATCHD_NAMESPACE").unwrap_or_else(|_| "batchd".into());
    let job_id = std::env::args().nth(1).unwrap_or_else(|| format!("rust-example-{}", std::process::id()));

    let producer = Producer::connect(&url, &namespace).await?;
    // Open the reader (and so create its group) before enqueueing; a group created at the stream's beginning
    // would also see results published before it existed, as long as the stream keeps them.
    let mut reader = producer.results_reader(ReaderOptions::new("rust-example", "worker-1")).await?;

    let provider = std::env::args().nth(2).unwrap_or_else(|| "cloudflare".into());
    let job = sample_job(&provider)?.with_id(job_id.as_str()).with_metadata(json!({"example": "rust"}));
    let job_id = producer.enqueue(&job).await?;
    eprintln!("enqueued {job_id}");

    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        let batch = reader.next_batch().await?;
        let mine = batch.iter().find(|delivery| delivery.job_id() == job_id.as_str()).cloned();
        // Acknowledge everything read: results of other jobs are not this example's business.
        reader.ack_all(&batch).await?;
        if let Some(delivery) = mine {
            let result = delivery.result()?;
            let responses = result.result.as_ref().map_or(&[][..], |output| output.responses.as_slice());
            let succeeded = responses.iter().filter(|response| response.success).count();
            println!(
                "{}",
                json!({"job_id": result.job_id, "status": result.status.as_str(), "responses": responses.len(),
                       "succeeded": succeeded, "redelivered": delivery.redelivered})
            );
            if result.status != ResultStatus::Completed {
                return Err(format!("job {job_id} ended {}", result.status).into());
            }
            return Ok(());
        }
    }
    Err(format!("no result for {job_id} within 60 s; is the daemon running on namespace {namespace}?").into())
}

/// The sample job of a provider: its model and one request item in the provider's own format.
fn sample_job(provider: &str) -> Result<NewJob, String> {
    let question = "What is batchd?";
    match provider {
        "cloudflare" => Ok(NewJob::new(
            "@cf/baai/bge-m3",
            vec![json!({"query": question, "contexts": [{"text": "A batch daemon."}, {"text": "A fruit."}]})],
        )),
        // A Chat Completions body; `.with_endpoint("/v1/embeddings")` (or `/v1/responses`, ...) for another one.
        "openai" => Ok(NewJob::new(
            "openai/gpt-4o-mini",
            vec![json!({"messages": [{"role": "user", "content": question}], "max_tokens": 50})],
        )),
        // A Messages API body (`max_tokens` is required).
        "anthropic" => Ok(NewJob::new(
            "anthropic/claude-sonnet-4-5",
            vec![json!({"max_tokens": 50, "messages": [{"role": "user", "content": question}]})],
        )),
        other => Err(format!("unknown provider {other:?}; use cloudflare, openai or anthropic")),
    }
}
