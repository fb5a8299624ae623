//! Pure decisions, unit-tested without Redis or HTTP: when to poll next, how long to back off, how to split a
//! job into chunks and how to merge chunk outputs back into one result.

use std::time::Duration;

use batchd_core::{ItemResponse, JobOutput};

use crate::settings::{PollSettings, RetrySettings};

/// Delay before poll number `n_polls + 1` of a batch: `initial × multiplier^n_polls`, capped at `max`,
/// then spread by ±`jitter`. `unit_random` is a number in [0, 1).
pub fn next_poll_delay(n_polls: u64, settings: &PollSettings, unit_random: f64) -> Duration {
    let base = settings.initial_interval_ms as f64 * settings.multiplier.powi(n_polls.min(64) as i32);
    let capped = base.min(settings.max_interval_ms as f64);
    let spread = 1.0 + settings.jitter * (2.0 * unit_random - 1.0);
    Duration::from_millis((capped * spread).max(1.0) as u64)
}

/// Backoff before retry number `attempt` (1-based) of a failed step: exponential with full jitter
/// (uniform in `[0, min(max, initial × 2^(attempt-1))]`), and never shorter than the API's `Retry-After`.
pub fn retry_delay(attempt: u64, settings: &RetrySettings, retry_after: Option<Duration>, unit_random: f64) -> Duration {
    let exponent = attempt.saturating_sub(1).min(32) as u32;
    let ceiling = (settings.initial_backoff_ms as f64 * 2f64.powi(exponent as i32)).min(settings.max_backoff_ms as f64);
    let jittered = Duration::from_millis((ceiling * unit_random) as u64);
    match retry_after {
        Some(after) => jittered.max(after),
        None => jittered,
    }
}

/// Splits `n_items` into chunks of at most `max_items` (splitting by payload size comes with the big-batches
/// work); every job has at least one chunk.
pub fn plan_chunks(n_items: usize, max_items: Option<usize>) -> Vec<(usize, usize)> {
    let size = max_items.filter(|max| *max > 0).unwrap_or(n_items).max(1);
    let mut plan = Vec::new();
    let mut start = 0;
    while start < n_items {
        let len = size.min(n_items - start);
        plan.push((start, len));
        start += len;
    }
    if plan.is_empty() {
        plan.push((0, 0));
    }
    plan
}

/// Merges chunk outputs (each with chunk-local indices, paired with the chunk's first item index) into one
/// output in request order, with usage summed field by field.
pub fn merge_outputs(chunks: Vec<(usize, JobOutput)>) -> JobOutput {
    let mut responses: Vec<ItemResponse> = Vec::new();
    let mut usage = serde_json::Map::new();
    for (start, output) in chunks {
        responses.extend(output.responses.into_iter().map(|mut response| {
            response.index += start;
            response
        }));
        if let serde_json::Value::Object(fields) = output.usage {
            for (name, value) in fields {
                let sum = match (usage.get(&name).and_then(|v| v.as_u64()), value.as_u64()) {
                    (Some(total), Some(more)) => serde_json::Value::from(total + more),
                    (None, _) => value,
                    (Some(_), None) => continue,
                };
                usage.insert(name, sum);
            }
        }
    }
    responses.sort_by_key(|response| response.index);
    JobOutput { responses, usage: serde_json::Value::Object(usage) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll() -> PollSettings {
        PollSettings { initial_interval_ms: 1000, multiplier: 1.5, max_interval_ms: 30_000, jitter: 0.2 }
    }

    fn retry() -> RetrySettings {
        RetrySettings { max_attempts: 8, initial_backoff_ms: 1000, max_backoff_ms: 60_000 }
    }

    #[test]
    fn polls_start_short_and_back_off_to_the_cap() {
        let mid = 0.5;
        assert_eq!(next_poll_delay(0, &poll(), mid), Duration::from_millis(1000));
        assert_eq!(next_poll_delay(1, &poll(), mid), Duration::from_millis(1500));
        assert_eq!(next_poll_delay(2, &poll(), mid), Duration::from_millis(2250));
        assert_eq!(next_poll_delay(50, &poll(), mid), Duration::from_millis(30_000));
        assert_eq!(next_poll_delay(u64::MAX, &poll(), mid), Duration::from_millis(30_000));
    }

    #[test]
    fn poll_jitter_stays_within_its_spread() {
        assert_eq!(next_poll_delay(0, &poll(), 0.0), Duration::from_millis(800));
        assert_eq!(next_poll_delay(0, &poll(), 0.999_999), Duration::from_millis(1199));
        assert_eq!(next_poll_delay(50, &poll(), 0.0), Duration::from_millis(24_000));
    }

    #[test]
    fn retries_use_full_jitter_under_an_exponential_ceiling() {
        assert_eq!(retry_delay(1, &retry(), None, 0.999), Duration::from_millis(999));
        assert_eq!(retry_delay(3, &retry(), None, 0.5), Duration::from_millis(2000));
        assert_eq!(retry_delay(30, &retry(), None, 0.5), Duration::from_millis(30_000));
        assert_eq!(retry_delay(1, &retry(), None, 0.0), Duration::ZERO);
    }

    #[test]
    fn retry_after_is_a_lower_bound() {
        assert_eq!(retry_delay(1, &retry(), Some(Duration::from_secs(2)), 0.1), Duration::from_secs(2));
        assert_eq!(retry_delay(10, &retry(), Some(Duration::from_secs(2)), 0.5), Duration::from_secs(30));
    }

    #[test]
    fn chunks_cover_the_job_in_order() {
        assert_eq!(plan_chunks(5, None), vec![(0, 5)]);
        assert_eq!(plan_chunks(5, Some(2)), vec![(0, 2), (2, 2), (4, 1)]);
        assert_eq!(plan_chunks(4, Some(2)), vec![(0, 2), (2, 2)]);
        assert_eq!(plan_chunks(1, Some(0)), vec![(0, 1)]);
    }

    #[test]
    fn merge_restores_global_order_and_sums_usage() {
        let response = |index: usize| ItemResponse {
            index,
            success: index != 1,
            result: None,
            error: None,
            external_reference: None,
        };
        let second = JobOutput {
            responses: vec![response(1), response(0)],
            usage: serde_json::json!({"prompt_tokens": 5, "total_tokens": 7}),
        };
        let first = JobOutput {
            responses: vec![response(0), response(1)],
            usage: serde_json::json!({"prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1}),
        };
        let merged = merge_outputs(vec![(2, second), (0, first)]);
        let indices: Vec<usize> = merged.responses.iter().map(|r| r.index).collect();
        assert_eq!(indices, [0, 1, 2, 3]);
        assert_eq!(merged.usage, serde_json::json!({"prompt_tokens": 8, "total_tokens": 11, "completion_tokens": 1}));
        assert_eq!(merged.n_failed(), 2);
    }
}
