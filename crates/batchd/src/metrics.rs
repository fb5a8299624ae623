//! The daemon's metrics, recorded through the `metrics` facade (exported in Prometheus format by the admin
//! server). All names start with `batchd_`, use base units, and carry no per-job labels.
//!
//! Call sites use the functions below, never the macros directly, so every metric is named and described here.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit};

/// Which API call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiCall {
    /// A batch submit.
    Submit,
    /// A status poll.
    Poll,
}

impl ApiCall {
    fn as_str(self) -> &'static str {
        match self {
            Self::Submit => "submit",
            Self::Poll => "poll",
        }
    }
}

/// Registers every metric's description and unit (shown as `# HELP` / `# TYPE` lines).
pub fn describe() {
    describe_counter!("batchd_jobs_accepted_total", "Jobs taken in from the submit stream.");
    describe_counter!(
        "batchd_jobs_rejected_total",
        "Ingress entries refused before any work, by reason (invalid_job, invalid_entry)."
    );
    describe_counter!("batchd_jobs_duplicate_total", "Ingress entries repeating a known job id (acknowledged, not run).");
    describe_counter!("batchd_jobs_finished_total", "Jobs finished, by outcome (completed, failed, expired).");
    describe_counter!(
        "batchd_api_requests_total",
        "Batch API requests by call (submit, poll), outcome and HTTP status class (2xx, 4xx, 5xx, none)."
    );
    describe_histogram!("batchd_api_request_duration_seconds", Unit::Seconds, "Batch API request duration, by call.");
    describe_histogram!(
        "batchd_batch_turnaround_seconds",
        Unit::Seconds,
        "Time from accepting a job to publishing its result, by outcome."
    );
    describe_counter!("batchd_retries_total", "Steps rescheduled after a transient error, by step (submit, poll).");
    describe_counter!("batchd_throttled_waits_total", "Steps delayed by rate limiting (HTTP 429 or the shared limiter).");
    describe_counter!(
        "batchd_possible_duplicate_submits_total",
        "Submits repeated after an interrupted submit (a remote batch may exist twice)."
    );
    describe_counter!("batchd_results_published_total", "Result entries published.");
    describe_counter!("batchd_redis_errors_total", "Redis operations that failed, by operation.");
    describe_gauge!("batchd_queue_depth", "Items per stream and state (pending, in_flight, scheduled, dead).");
    describe_gauge!("batchd_oldest_waiting_job_age_seconds", Unit::Seconds, "Age of the oldest entry waiting in the submit stream.");
}

/// A job was accepted.
pub fn job_accepted() {
    counter!("batchd_jobs_accepted_total").increment(1);
}

/// An ingress entry was refused (`reason` is a batchd error code).
pub fn job_rejected(reason: &'static str) {
    counter!("batchd_jobs_rejected_total", "reason" => reason).increment(1);
}

/// An ingress entry repeated a known job id.
pub fn job_duplicate() {
    counter!("batchd_jobs_duplicate_total").increment(1);
}

/// A job finished with `outcome` after `turnaround`.
pub fn job_finished(outcome: &'static str, turnaround: Duration) {
    counter!("batchd_jobs_finished_total", "outcome" => outcome).increment(1);
    histogram!("batchd_batch_turnaround_seconds", "outcome" => outcome).record(turnaround.as_secs_f64());
    counter!("batchd_results_published_total").increment(1);
}

/// One API request finished; `outcome` is `ok` or the error kind, `http_status` the status if any.
pub fn api_request(call: ApiCall, outcome: &'static str, http_status: Option<u16>, elapsed: Duration) {
    let class = match http_status {
        Some(status) if (200..300).contains(&status) => "2xx",
        Some(status) if (400..500).contains(&status) => "4xx",
        Some(status) if (500..600).contains(&status) => "5xx",
        Some(_) => "other",
        None => "none",
    };
    counter!("batchd_api_requests_total", "call" => call.as_str(), "outcome" => outcome, "status_class" => class)
        .increment(1);
    histogram!("batchd_api_request_duration_seconds", "call" => call.as_str()).record(elapsed.as_secs_f64());
}

/// A step was rescheduled after a transient error.
pub fn retry(call: ApiCall) {
    counter!("batchd_retries_total", "step" => call.as_str()).increment(1);
}

/// A step waits because of rate limiting.
pub fn throttled_wait(call: ApiCall) {
    counter!("batchd_throttled_waits_total", "step" => call.as_str()).increment(1);
}

/// A submit is being repeated after an interrupted one.
pub fn possible_duplicate_submit() {
    counter!("batchd_possible_duplicate_submits_total").increment(1);
}

/// A Redis operation failed.
pub fn redis_error(operation: &'static str) {
    counter!("batchd_redis_errors_total", "operation" => operation).increment(1);
}

/// Sets a queue depth gauge.
pub fn queue_depth(stream: &'static str, state: &'static str, depth: u64) {
    gauge!("batchd_queue_depth", "stream" => stream, "state" => state).set(depth as f64);
}

/// Sets the age of the oldest waiting job.
pub fn oldest_waiting_job_age(age: Duration) {
    gauge!("batchd_oldest_waiting_job_age_seconds").set(age.as_secs_f64());
}
