//! Pure decisions, unit-tested without Redis or HTTP: when to poll next, how long to back off, how to split a
//! job into chunks, how to assemble chunk outputs into one result, and which rate-limit bucket a model uses.

use std::time::Duration;

use batchd_core::result::code;
use batchd_core::{FailedBatch, ItemResponse, JobError, JobOutput, backoff};
use batchd_provider::BodyShape;
use batchd_queue::Placement;
use serde_json::value::RawValue;

use crate::settings::{PollSettings, RetrySettings};

/// Delay before poll number `n_polls + 1` of a batch: `initial × multiplier^n_polls`, capped at `max`,
/// then spread by ±`jitter`. `unit_random` is a number in [0, 1).
pub fn next_poll_delay(n_polls: u64, settings: &PollSettings, unit_random: f64) -> Duration {
    let base = settings.initial_interval_ms as f64 * settings.multiplier.powi(n_polls.min(64) as i32);
    let capped = base.min(settings.max_interval_ms as f64);
    let spread = 1.0 + settings.jitter * (2.0 * unit_random - 1.0);
    Duration::from_millis((capped * spread).max(1.0) as u64)
}

/// How many polls see a batch that ends `ended_after` its submit, polled on the [`next_poll_delay`] schedule with
/// `unit_random` as every delay's spread (0.5: none): the first poll whose time (the sum of the delays before it)
/// reaches the end is the last. An upper bound for the daemon, whose every delay also starts after a reply: each
/// request's latency only makes the count smaller. Without events; with them, the event ends the polling.
pub fn polls_until(ended_after: Duration, settings: &PollSettings, unit_random: f64) -> u64 {
    let mut elapsed = Duration::ZERO;
    let mut n_polls = 0;
    while elapsed < ended_after {
        elapsed += next_poll_delay(n_polls, settings, unit_random);
        n_polls += 1;
    }
    n_polls.max(1)
}

/// Delay before the next poll of a batch: [`next_poll_delay`], or with batch events on, the long fallback interval
/// `max_interval_ms_with_events` from the start (the batch's completion event wakes it earlier), jittered alike.
pub fn poll_delay(n_polls: u64, settings: &PollSettings, events: bool, unit_random: f64) -> Duration {
    if !events {
        return next_poll_delay(n_polls, settings, unit_random);
    }
    let spread = 1.0 + settings.jitter * (2.0 * unit_random - 1.0);
    Duration::from_millis((settings.max_interval_ms_with_events as f64 * spread).max(1.0) as u64)
}

/// Backoff before retry number `attempt` (1-based) of a failed step: exponential with full jitter (uniform in
/// `[0, min(max, initial × 2^(attempt-1))]`, the ceiling from [`backoff::doubling`]), and never shorter than the
/// API's `Retry-After`, which is itself clamped to `max_backoff_ms` (a server asking for hours must not park a step
/// for hours).
pub fn retry_delay(
    attempt: u64,
    settings: &RetrySettings,
    retry_after: Option<Duration>,
    unit_random: f64,
) -> Duration {
    let ceiling = backoff::doubling(
        attempt,
        Duration::from_millis(settings.initial_backoff_ms),
        Duration::from_millis(settings.max_backoff_ms),
    );
    let jittered = Duration::from_millis((ceiling.as_millis() as f64 * unit_random) as u64);
    match retry_after {
        Some(after) => jittered.max(after.min(Duration::from_millis(settings.max_backoff_ms))),
        None => jittered,
    }
}

/// One request item that cannot fit any batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemTooLarge {
    /// Index of the item in the job.
    pub index: usize,
    /// Its size in bytes.
    pub bytes: usize,
    /// The submit body it alone would make.
    pub body_bytes: usize,
}

/// Splits a job's items (given by their sizes in bytes) into consecutive chunks whose submit body (the
/// provider's `shape`) stays under `max_payload_bytes` and that hold at most `max_items` items (when set). Greedy
/// and order-preserving. An item whose body alone reaches the limit makes the whole job unsubmittable.
pub fn plan_chunks(
    item_sizes: &[usize],
    shape: BodyShape,
    max_payload_bytes: usize,
    max_items: Option<usize>,
) -> Result<Vec<(usize, usize)>, ItemTooLarge> {
    plan_chunks_with_inputs(item_sizes, shape, max_payload_bytes, max_items, None)
}

/// [`plan_chunks`] under a limit on inputs too, where an item may hold several (OpenAI's 50,000 embedding inputs
/// per batch): `inputs` is each item's count and the most one chunk may hold. An item over that limit alone gets a
/// chunk of its own (the provider refuses it, that item's chunk alone).
pub fn plan_chunks_with_inputs(
    item_sizes: &[usize],
    shape: BodyShape,
    max_payload_bytes: usize,
    max_items: Option<usize>,
    inputs: Option<(&[usize], usize)>,
) -> Result<Vec<(usize, usize)>, ItemTooLarge> {
    let max_items = max_items.filter(|max| *max > 0).unwrap_or(usize::MAX);
    let mut plan = Vec::new();
    let (mut start, mut len, mut items_bytes, mut n_inputs) = (0usize, 0usize, 0usize, 0usize);
    for (index, &bytes) in item_sizes.iter().enumerate() {
        let alone = shape.bytes([bytes]);
        if alone >= max_payload_bytes {
            return Err(ItemTooLarge { index, bytes, body_bytes: alone });
        }
        let (item_inputs, max_inputs) = match inputs {
            Some((counts, max)) => (counts.get(index).copied().unwrap_or(1), max),
            None => (0, usize::MAX),
        };
        // Body with this item added: the envelope, the items with their overheads, the separators.
        let with_item = shape.bytes([items_bytes + bytes]) + len * (shape.per_item + shape.separator);
        let over_inputs = n_inputs.saturating_add(item_inputs) > max_inputs;
        if len > 0 && (with_item >= max_payload_bytes || len == max_items || over_inputs) {
            plan.push((start, len));
            (start, len, items_bytes, n_inputs) = (index, 0, 0, 0);
        }
        len += 1;
        items_bytes += bytes;
        n_inputs = n_inputs.saturating_add(item_inputs);
    }
    if len > 0 || plan.is_empty() {
        plan.push((start, len));
    }
    Ok(plan)
}

/// Where to cut a batch of `n_items` that the API refused because of its input: around the item the API named
/// (so it is submitted alone and the items before and after it go on in one piece each), or in halves when it
/// named none. Cuts are chunk-local positions, ascending, each inside `1..n_items`.
///
/// Bound: with halving, each bad item is on one path of the bisection tree, so `k` bad items among `n` cost at
/// most `2·k·⌈log2 n⌉` extra submits; when the API names the item, at most 3 per bad item.
pub fn isolate_cuts(n_items: usize, refused_item: Option<usize>) -> Vec<usize> {
    match refused_item.filter(|item| *item < n_items) {
        Some(item) => [item, item + 1].into_iter().filter(|cut| (1..n_items).contains(cut)).collect(),
        None => vec![n_items / 2],
    }
}

/// Cuts a chunk's placement before each chunk-local position of `cuts` (ascending, inside the chunk).
pub fn split_placement(placement: Placement, cuts: &[usize]) -> Vec<Placement> {
    let len = placement.len();
    let mut bounds: Vec<usize> = cuts.iter().copied().filter(|cut| (1..len).contains(cut)).collect();
    bounds.dedup();
    let starts = std::iter::once(0).chain(bounds.iter().copied());
    let ends = bounds.iter().copied().chain(std::iter::once(len));
    let pieces = starts.zip(ends);
    match placement {
        Placement::Range { start, .. } => {
            pieces.map(|(from, to)| Placement::Range { start: start + from, len: to - from }).collect()
        }
        Placement::Indices(indices) => {
            pieces.map(|(from, to)| Placement::Indices(indices[from..to].to_vec())).collect()
        }
    }
}

/// How one chunk ended, for assembling the job's result.
#[derive(Debug, Clone)]
pub enum ChunkOutcome {
    /// The batch finished; its responses have chunk-local indices.
    Done(JobOutput),
    /// The batch failed as a whole.
    Failed {
        /// Why.
        error: JobError,
        /// Its remote request id, if it was submitted.
        request_id: Option<String>,
    },
    /// The batch had not finished (the job was cancelled, expired or failed meanwhile).
    Unfinished,
    /// The batch was never sent (the job was cancelled first): its items are `not_run`, unless an earlier chunk
    /// answered them (a failed-items retry that never ran keeps the first answers).
    NotRun,
}

/// Assembles the job's output from its chunks: every item gets exactly one response, at its own index, in
/// request order. Later chunks win (a chunk of retried items replaces the first answers); items of failed batches
/// get `success:false` with the batch's error, items of batches never sent get `not_run`, items never answered
/// get `unanswered`. Usage is summed.
pub fn assemble(n_items: usize, chunks: Vec<(u32, Placement, ChunkOutcome)>, unanswered: &JobError) -> JobOutput {
    let mut slots: Vec<Option<ItemResponse>> = vec![None; n_items];
    let mut usage = serde_json::Map::new();
    let mut failed_batches = Vec::new();
    let error_item = |error: &JobError| -> Option<Box<RawValue>> {
        let text = serde_json::json!({"code": error.code, "message": error.message}).to_string();
        RawValue::from_string(text).ok()
    };
    let not_run = JobError::new(code::NOT_RUN, "not run: the job ended before this request was sent to the provider");
    for (chunk, placement, outcome) in chunks {
        match outcome {
            ChunkOutcome::Done(output) => {
                for mut response in output.responses {
                    if let Some(index) = placement.job_index(response.index).filter(|index| *index < n_items) {
                        response.index = index;
                        slots[index] = Some(response);
                    }
                }
                add_usage(&mut usage, output.usage);
            }
            ChunkOutcome::Failed { error, request_id } => {
                let items = placement.job_indices();
                for &index in items.iter().filter(|index| **index < n_items) {
                    slots[index] = Some(ItemResponse::failure(index, error_item(&error)));
                }
                failed_batches.push(FailedBatch { chunk, items, request_id, error });
            }
            ChunkOutcome::Unfinished => {}
            ChunkOutcome::NotRun => {
                for index in placement.job_indices().into_iter().filter(|index| *index < n_items) {
                    slots[index].get_or_insert_with(|| ItemResponse::failure(index, error_item(&not_run)));
                }
            }
        }
    }
    let responses = slots
        .into_iter()
        .enumerate()
        .map(|(index, slot)| slot.unwrap_or_else(|| ItemResponse::failure(index, error_item(unanswered))))
        .collect();
    JobOutput { responses, usage: serde_json::Value::Object(usage), failed_batches }
}

fn add_usage(total: &mut serde_json::Map<String, serde_json::Value>, usage: serde_json::Value) {
    if let serde_json::Value::Object(fields) = usage {
        for (name, value) in fields {
            let sum = match (total.get(&name).and_then(|v| v.as_u64()), value.as_u64()) {
                (Some(sum), Some(more)) => serde_json::Value::from(sum + more),
                (None, _) => value,
                (Some(_), None) => continue,
            };
            total.insert(name, sum);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchd_cloudflare::BODY_SHAPE;

    fn poll() -> PollSettings {
        PollSettings {
            initial_interval_ms: 1000,
            multiplier: 1.5,
            max_interval_ms: 30_000,
            max_interval_ms_with_events: 300_000,
            jitter: 0.2,
        }
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

    /// The polls-per-batch figures docs/providers.md quotes for the default `[poll]` (OpenAI, "Costs").
    #[test]
    fn a_batch_is_polled_on_the_backoff_then_every_cap() {
        let mid = 0.5;
        // 1 + 1.5 + 2.25 + ... : the ninth poll comes 74.9 s after the submit, then one every 30 s.
        assert_eq!(polls_until(Duration::from_secs(1), &poll(), mid), 1);
        assert_eq!(polls_until(Duration::from_secs(75), &poll(), mid), 10);
        assert_eq!(polls_until(Duration::from_secs(600), &poll(), mid), 27);
        assert_eq!(polls_until(Duration::from_secs(3600), &poll(), mid), 127);
        assert_eq!(polls_until(Duration::from_secs(24 * 3600), &poll(), mid), 2887);
        // Jitter (±20 %) moves the count by about a fifth either way.
        assert_eq!(polls_until(Duration::from_secs(3600), &poll(), 0.0), 157);
        assert_eq!(polls_until(Duration::from_secs(3600), &poll(), 0.999_999), 107);
    }

    #[test]
    fn with_events_polls_are_the_long_fallback_from_the_start() {
        assert_eq!(poll_delay(0, &poll(), true, 0.5), Duration::from_secs(300));
        assert_eq!(poll_delay(7, &poll(), true, 0.0), Duration::from_secs(240));
        assert_eq!(poll_delay(0, &poll(), false, 0.5), Duration::from_millis(1000));
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
    fn refused_batches_are_cut_around_the_named_item_or_in_halves() {
        assert_eq!(isolate_cuts(10, Some(4)), [4, 5]);
        assert_eq!(isolate_cuts(10, Some(0)), [1]);
        assert_eq!(isolate_cuts(10, Some(9)), [9]);
        assert_eq!(isolate_cuts(2, Some(1)), [1]);
        assert_eq!(isolate_cuts(10, None), [5]);
        assert_eq!(isolate_cuts(10, Some(10)), [5], "an index outside the batch names nothing");
        assert_eq!(isolate_cuts(3, None), [1]);
    }

    #[test]
    fn placements_are_cut_into_consecutive_pieces() {
        let pieces = split_placement(Placement::Range { start: 100, len: 10 }, &[4, 5]);
        assert_eq!(
            pieces,
            [
                Placement::Range { start: 100, len: 4 },
                Placement::Range { start: 104, len: 1 },
                Placement::Range { start: 105, len: 5 }
            ]
        );
        let pieces = split_placement(Placement::Indices(vec![3, 7, 9, 11]), &[2]);
        assert_eq!(pieces, [Placement::Indices(vec![3, 7]), Placement::Indices(vec![9, 11])]);
        assert_eq!(
            split_placement(Placement::Range { start: 0, len: 3 }, &[0, 3]),
            [Placement::Range { start: 0, len: 3 }]
        );
    }

    /// Bisection down to single items answers every valid item, and costs within the stated bound.
    #[test]
    fn isolating_bad_items_stays_within_the_bound() {
        // Simulates the API: a batch is refused when it holds a bad item; the refusal names the first one or not.
        fn submits(items: &[bool], names: bool) -> usize {
            let bad = items.iter().position(|good| !good);
            match bad {
                None => 1,
                Some(_) if items.len() == 1 => 1,
                Some(first) => {
                    let cuts = isolate_cuts(items.len(), names.then_some(first));
                    let mut total = 1;
                    let mut from = 0;
                    for to in cuts.iter().copied().chain(std::iter::once(items.len())) {
                        total += submits(&items[from..to], names);
                        from = to;
                    }
                    total
                }
            }
        }
        for (n, bad) in [(64usize, vec![5usize]), (1000, vec![0, 500, 999]), (37, vec![1, 2, 3, 30])] {
            let items: Vec<bool> = (0..n).map(|i| !bad.contains(&i)).collect();
            let k = bad.len();
            let log2 = (n as f64).log2().ceil() as usize;
            let extra = submits(&items, false) - 1;
            assert!(extra <= 2 * k * log2, "n={n} k={k}: {extra} extra submits by halving");
            let extra = submits(&items, true) - 1;
            assert!(extra <= 3 * k, "n={n} k={k}: {extra} extra submits around named items");
        }
    }

    #[test]
    fn retry_after_is_clamped_to_the_largest_backoff() {
        assert_eq!(retry_delay(1, &retry(), Some(Duration::from_secs(86_400)), 0.1), Duration::from_secs(60));
    }

    #[test]
    fn retry_after_is_a_lower_bound() {
        assert_eq!(retry_delay(1, &retry(), Some(Duration::from_secs(2)), 0.1), Duration::from_secs(2));
        assert_eq!(retry_delay(10, &retry(), Some(Duration::from_secs(2)), 0.5), Duration::from_secs(30));
    }

    fn body(sizes: &[usize]) -> usize {
        BODY_SHAPE.bytes(sizes.iter().copied())
    }

    fn plan(
        sizes: &[usize],
        max_payload_bytes: usize,
        max_items: Option<usize>,
    ) -> Result<Vec<(usize, usize)>, ItemTooLarge> {
        plan_chunks(sizes, BODY_SHAPE, max_payload_bytes, max_items)
    }

    #[test]
    fn chunks_cover_the_job_in_order_under_both_limits() {
        assert_eq!(plan(&[10; 5], 1000, None), Ok(vec![(0, 5)]));
        assert_eq!(plan(&[10; 5], 1000, Some(2)), Ok(vec![(0, 2), (2, 2), (4, 1)]));
        assert_eq!(plan(&[10; 4], 1000, Some(2)), Ok(vec![(0, 2), (2, 2)]));
        assert_eq!(plan(&[10], 1000, Some(0)), Ok(vec![(0, 1)]));
        // Three items of 10 bytes make a 47-byte body; a limit of 47 (must stay under) allows two per chunk.
        assert_eq!(body(&[10, 10, 10]), 47);
        assert_eq!(plan(&[10, 10, 10], 47, None), Ok(vec![(0, 2), (2, 1)]));
        assert_eq!(plan(&[10, 10, 10], 48, None), Ok(vec![(0, 3)]));
    }

    /// Issue 34: items that hold several inputs (OpenAI embeddings) are planned under the inputs limit too.
    #[test]
    fn chunks_stay_under_an_inputs_limit_where_items_hold_several() {
        let inputs = [3, 1, 2, 4, 1, 7, 1];
        let planned = plan_chunks_with_inputs(&[10; 7], BODY_SHAPE, 1000, Some(50), Some((&inputs, 5))).unwrap();
        assert_eq!(planned, vec![(0, 2), (2, 1), (3, 2), (5, 1), (6, 1)], "an item over the limit alone is alone");
        for (start, len) in &planned[..] {
            let held: usize = inputs[*start..start + len].iter().sum();
            assert!(held <= 5 || *len == 1, "{start}+{len}: {held}");
        }
        assert_eq!(plan_chunks_with_inputs(&[10; 7], BODY_SHAPE, 1000, Some(3), None), plan(&[10; 7], 1000, Some(3)));
    }

    #[test]
    fn every_chunk_stays_under_the_payload_limit() {
        let sizes: Vec<usize> = (0..500).map(|i| 100 + (i * 7919) % 900).collect();
        for limit in [1200, 5000, 20_000] {
            let plan = plan(&sizes, limit, Some(37)).unwrap();
            let covered: Vec<usize> = plan.iter().flat_map(|(start, len)| *start..start + len).collect();
            assert_eq!(covered, (0..500).collect::<Vec<_>>());
            for (start, len) in plan {
                assert!(len <= 37);
                assert!(body(&sizes[start..start + len]) < limit);
            }
        }
    }

    #[test]
    fn an_item_too_large_alone_is_named() {
        assert_eq!(plan(&[10, 2000, 10], 1000, None), Err(ItemTooLarge { index: 1, bytes: 2000, body_bytes: 2015 }));
    }

    fn response(index: usize, success: bool) -> ItemResponse {
        ItemResponse { index, success, result: None, error: None, external_reference: None, resent: false }
    }

    fn output(indices: &[(usize, bool)], tokens: u64) -> JobOutput {
        JobOutput {
            responses: indices.iter().map(|(i, ok)| response(*i, *ok)).collect(),
            usage: serde_json::json!({"prompt_tokens": tokens, "total_tokens": tokens}),
            failed_batches: Vec::new(),
        }
    }

    #[test]
    fn assembly_restores_global_order_and_sums_usage() {
        let unanswered = JobError::new("cancelled", "not answered");
        let merged = assemble(
            4,
            vec![
                (1, Placement::Range { start: 2, len: 2 }, ChunkOutcome::Done(output(&[(1, false), (0, true)], 5))),
                (0, Placement::Range { start: 0, len: 2 }, ChunkOutcome::Done(output(&[(0, true), (1, true)], 3))),
            ],
            &unanswered,
        );
        let indices: Vec<usize> = merged.responses.iter().map(|r| r.index).collect();
        assert_eq!(indices, [0, 1, 2, 3]);
        assert_eq!(merged.usage, serde_json::json!({"prompt_tokens": 8, "total_tokens": 8}));
        assert_eq!(merged.n_failed(), 1);
        assert!(merged.failed_batches.is_empty());
    }

    #[test]
    fn retried_items_replace_their_first_answers_and_failed_batches_are_listed() {
        let unanswered = JobError::new("cancelled", "not answered");
        let merged = assemble(
            5,
            vec![
                (
                    0,
                    Placement::Range { start: 0, len: 3 },
                    ChunkOutcome::Done(output(&[(0, true), (1, false), (2, false)], 1)),
                ),
                (
                    1,
                    Placement::Range { start: 3, len: 2 },
                    ChunkOutcome::Failed {
                        error: JobError::new("batch_failed", "Model execution failed"),
                        request_id: Some("r1".into()),
                    },
                ),
                (2, Placement::Indices(vec![2, 1]), ChunkOutcome::Done(output(&[(0, true), (1, true)], 1))),
            ],
            &unanswered,
        );
        let successes: Vec<bool> = merged.responses.iter().map(|r| r.success).collect();
        assert_eq!(successes, [true, true, true, false, false]);
        assert_eq!(merged.failed_batches.len(), 1);
        assert_eq!(merged.failed_batches[0].items, [3, 4]);
        assert!(merged.responses[3].error.as_ref().unwrap().get().contains("batch_failed"));
    }

    #[test]
    fn items_of_a_batch_never_sent_are_not_run_unless_answered_before() {
        let unanswered = JobError::new("cancelled", "not answered");
        let merged = assemble(
            4,
            vec![
                (0, Placement::Range { start: 0, len: 2 }, ChunkOutcome::Done(output(&[(0, true), (1, false)], 1))),
                (1, Placement::Range { start: 2, len: 2 }, ChunkOutcome::NotRun),
                (2, Placement::Indices(vec![1]), ChunkOutcome::NotRun),
            ],
            &unanswered,
        );
        let successes: Vec<bool> = merged.responses.iter().map(|r| r.success).collect();
        assert_eq!(successes, [true, false, false, false]);
        assert!(merged.responses[1].error.is_none(), "the first answer of a retried item is kept");
        for index in [2, 3] {
            assert!(merged.responses[index].error.as_ref().unwrap().get().contains(r#""code":"not_run""#));
        }
        assert!(merged.failed_batches.is_empty());
    }

    #[test]
    fn unfinished_chunks_leave_their_items_unanswered() {
        let unanswered = JobError::new("cancelled", "the job was cancelled before this item was answered");
        let merged =
            assemble(3, vec![(0, Placement::Range { start: 0, len: 3 }, ChunkOutcome::Unfinished)], &unanswered);
        assert_eq!(merged.n_failed(), 3);
        assert!(merged.responses[0].error.as_ref().unwrap().get().contains("cancelled"));
    }
}
