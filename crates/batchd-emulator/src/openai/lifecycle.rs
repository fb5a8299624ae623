//! One batch's life: `validating → in_progress → finalizing → completed`, or `failed`, `expired`,
//! `cancelling → cancelled`, decided from the time alone.
//!
//! A batch is stepped lazily: whenever it is read, [`next_step`] says which transition (if any) is due by `now`, and
//! at what instant it happened; the store applies it and asks again. Each state lasts its duration from the instant
//! the state began, so changing the timing moves the end of the current state of every batch (a test can hold
//! batches in `validating` and then release them). Requests finish one by one during `in_progress`, evenly spread
//! over its duration, in the batch's finish order; a cancel or an expiry keeps the ones finished by then.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use serde_json::{Map, Value};

use super::{
    results::{NotRun, Outcome},
    validation::BatchError,
};

/// How long batches stay in each state; changes apply to batches already created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenAiTiming {
    /// Time in `validating`, from the create.
    pub validating_for: Duration,
    /// Time in `in_progress`; the requests finish evenly spread over it.
    pub in_progress_for: Duration,
    /// Time in `finalizing` before `completed`.
    pub finalizing_for: Duration,
    /// Time in `cancelling` before `cancelled` (OpenAI: up to 10 minutes).
    pub cancelling_for: Duration,
    /// The completion window: a batch not finalizing by `created + completion_window` expires (OpenAI: 24 h; the
    /// create must still say `"24h"`).
    pub completion_window: Duration,
}

impl Default for OpenAiTiming {
    /// Fast timing for tests: a batch completes about 200 ms after its create.
    fn default() -> Self {
        Self {
            validating_for: Duration::from_millis(50),
            in_progress_for: Duration::from_millis(100),
            finalizing_for: Duration::from_millis(50),
            cancelling_for: Duration::from_millis(100),
            completion_window: Duration::from_secs(24 * 3600),
        }
    }
}

/// A batch's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// The input file is being validated.
    Validating,
    /// Validation failed (see the batch's errors).
    Failed,
    /// Requests are running.
    InProgress,
    /// All requests finished; results are being prepared.
    Finalizing,
    /// Results are ready.
    Completed,
    /// The completion window ended first.
    Expired,
    /// A cancel was asked for.
    Cancelling,
    /// Cancelled.
    Cancelled,
}

impl Status {
    /// The API's name of the status.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Validating => "validating",
            Status::Failed => "failed",
            Status::InProgress => "in_progress",
            Status::Finalizing => "finalizing",
            Status::Completed => "completed",
            Status::Expired => "expired",
            Status::Cancelling => "cancelling",
            Status::Cancelled => "cancelled",
        }
    }

    /// Whether the batch will never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Failed | Status::Completed | Status::Expired | Status::Cancelled)
    }
}

/// The instants of the transitions a batch went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Transitions {
    /// Entered `in_progress`.
    pub in_progress: Option<Instant>,
    /// Entered `finalizing`.
    pub finalizing: Option<Instant>,
    /// Entered `completed`.
    pub completed: Option<Instant>,
    /// Entered `failed`.
    pub failed: Option<Instant>,
    /// Entered `expired`.
    pub expired: Option<Instant>,
    /// Entered `cancelling`.
    pub cancelling: Option<Instant>,
    /// Entered `cancelled`.
    pub cancelled: Option<Instant>,
}

/// One request of a validated batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Request {
    /// Its `custom_id`.
    pub custom_id: String,
    /// Its `body`, kept until the batch's files are written.
    pub body: Map<String, Value>,
    /// How it ends once it runs.
    pub outcome: Outcome,
}

/// Running totals over the finish order: entry `k` counts the first `k` requests to finish.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Requests that succeeded.
    pub completed: u64,
    /// Requests that failed.
    pub failed: u64,
    /// Input tokens of the successful ones.
    pub input_tokens: u64,
    /// Output tokens of the successful ones.
    pub output_tokens: u64,
}

/// Everything the emulator keeps about one batch.
#[derive(Debug, Clone)]
pub(crate) struct Batch {
    /// `batch_…`.
    pub id: String,
    /// The endpoint every request goes to.
    pub endpoint: String,
    /// The input file's id.
    pub input_file_id: String,
    /// `metadata` as created (`None` when the create had none).
    pub metadata: Option<Map<String, Value>>,
    /// `output_expires_after.seconds`, when the create gave it: when its output and error files expire.
    pub output_expires_in: Option<Duration>,
    /// The `completion_window` the create gave (`24h`).
    pub completion_window: String,
    /// When the create arrived.
    pub created: Instant,
    /// Current status.
    pub status: Status,
    /// When the current status began.
    pub since: Instant,
    /// When each transition happened.
    pub transitions: Transitions,
    /// The input file's content, kept until validation ends.
    pub input: Option<Bytes>,
    /// The model of every request, once validated.
    pub model: Option<String>,
    /// Validation errors of a failed batch.
    pub errors: Vec<BatchError>,
    /// The requests, once validated, in file order.
    pub requests: Vec<Request>,
    /// Indices into `requests`, in the order they finish.
    pub finish_order: Vec<usize>,
    /// `tallies[k]`: totals of the first `k` requests of `finish_order` (length `requests.len() + 1`).
    pub tallies: Vec<Tally>,
    /// With a `stall` fault: requests that finish before the batch stops making progress.
    pub stall_after: Option<usize>,
    /// With a `fail_items` fault: 0-based input lines that fail with 500.
    pub fail_lines: Vec<usize>,
    /// With a `token_limit_exceeded` fault: validation fails with that code.
    pub refuse_tokens: bool,
    /// Requests finished when a cancel or the expiry stopped the batch.
    pub finished_at_stop: Option<usize>,
    /// The output file, once written (`None` also when no request succeeded).
    pub output_file_id: Option<String>,
    /// The error file, once written (`None` also when no request failed).
    pub error_file_id: Option<String>,
}

/// A transition due by `now`, with the instant it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Validation ends: the batch turns `in_progress` or `failed`.
    ValidationEnds(Instant),
    /// Every request finished: the batch turns `finalizing`.
    Finalizes(Instant),
    /// Results are ready: the batch turns `completed`.
    Completes(Instant),
    /// The completion window ended: the batch turns `expired`.
    Expires(Instant),
    /// The cancel finished: the batch turns `cancelled`.
    CancelEnds(Instant),
}

impl Batch {
    /// A batch just created at `now`, in `validating`.
    pub fn new(
        id: String,
        endpoint: String,
        input_file_id: String,
        metadata: Option<Map<String, Value>>,
        input: Bytes,
        now: Instant,
    ) -> Self {
        Self {
            id,
            endpoint,
            input_file_id,
            metadata,
            output_expires_in: None,
            completion_window: "24h".to_owned(),
            created: now,
            status: Status::Validating,
            since: now,
            transitions: Transitions::default(),
            input: Some(input),
            model: None,
            errors: Vec::new(),
            requests: Vec::new(),
            finish_order: Vec::new(),
            tallies: vec![Tally::default()],
            stall_after: None,
            fail_lines: Vec::new(),
            refuse_tokens: false,
            finished_at_stop: None,
            output_file_id: None,
            error_file_id: None,
        }
    }

    /// Moves to `status` at `at`.
    pub fn enter(&mut self, status: Status, at: Instant) {
        self.status = status;
        self.since = at;
        let slot = match status {
            Status::Validating => return,
            Status::Failed => &mut self.transitions.failed,
            Status::InProgress => &mut self.transitions.in_progress,
            Status::Finalizing => &mut self.transitions.finalizing,
            Status::Completed => &mut self.transitions.completed,
            Status::Expired => &mut self.transitions.expired,
            Status::Cancelling => &mut self.transitions.cancelling,
            Status::Cancelled => &mut self.transitions.cancelled,
        };
        *slot = Some(at);
    }

    /// Validation passed at `at`: keeps the requests, fixes their finish order, and starts running them.
    pub fn start(&mut self, model: String, requests: Vec<Request>, finish_order: Vec<usize>, at: Instant) {
        let mut tallies = Vec::with_capacity(requests.len() + 1);
        let mut tally = Tally::default();
        tallies.push(tally);
        for &index in &finish_order {
            match &requests[index].outcome {
                Outcome::Success(usage) => {
                    tally.completed += 1;
                    tally.input_tokens += usage.input_tokens;
                    tally.output_tokens += usage.output_tokens;
                }
                Outcome::Invalid { .. } | Outcome::ServerError => tally.failed += 1,
            }
            tallies.push(tally);
        }
        self.model = Some(model);
        self.requests = requests;
        self.finish_order = finish_order;
        self.tallies = tallies;
        self.input = None;
        self.enter(Status::InProgress, at);
    }

    /// Validation failed at `at` with these errors.
    pub fn fail(&mut self, errors: Vec<BatchError>, at: Instant) {
        self.errors = errors;
        self.input = None;
        self.enter(Status::Failed, at);
    }

    /// The requests that will ever finish: all of them, or fewer with a `stall` fault.
    fn finishable(&self) -> usize {
        self.stall_after.unwrap_or(usize::MAX).min(self.requests.len())
    }

    /// How many requests have finished by `at` (counted in the finish order).
    pub fn finished_by(&self, at: Instant, timing: &OpenAiTiming) -> usize {
        if let Some(stopped) = self.finished_at_stop {
            return stopped;
        }
        let Some(started) = self.transitions.in_progress else { return 0 };
        if matches!(self.status, Status::Finalizing | Status::Completed) {
            return self.requests.len();
        }
        let n = self.requests.len();
        let elapsed = at.saturating_duration_since(started).as_nanos();
        let total = timing.in_progress_for.as_nanos();
        let by_time = (n as u128 * elapsed).checked_div(total).map_or(n, |k| usize::try_from(k).unwrap_or(n).min(n));
        by_time.min(self.finishable())
    }

    /// Totals of the requests finished by `at`.
    pub fn tally(&self, at: Instant, timing: &OpenAiTiming) -> Tally {
        self.tallies.get(self.finished_by(at, timing)).copied().unwrap_or_default()
    }

    /// Stops the batch at `at` (cancel or expiry): the requests finished by then are its results.
    pub fn stop(&mut self, at: Instant, timing: &OpenAiTiming) {
        let finished = self.finished_by(at, timing);
        self.finished_at_stop = Some(finished);
    }

    /// The requests that never ran, and why, for a stopped batch.
    pub fn not_run_reason(&self) -> Option<NotRun> {
        match self.status {
            Status::Cancelled | Status::Cancelling => Some(NotRun::Cancelled),
            Status::Expired => Some(NotRun::Expired),
            _ => None,
        }
    }
}

/// The transition due for `batch` by `now`, if any. A duration too long to add to an instant means "never".
pub(crate) fn next_step(batch: &Batch, now: Instant, timing: &OpenAiTiming) -> Option<Step> {
    let expiry = batch.created.checked_add(timing.completion_window);
    let due = |at: Option<Instant>| at.filter(|&at| at <= now);
    let ends = |duration: Duration| batch.since.checked_add(duration);
    // The earlier of a state's end and the expiry; the end wins a tie.
    let first = |end: Option<Instant>, on_end: fn(Instant) -> Step| match (end, expiry) {
        (Some(end), Some(expiry)) if expiry < end => due(Some(expiry)).map(Step::Expires),
        (None, expiry) => due(expiry).map(Step::Expires),
        (end, _) => due(end).map(on_end),
    };
    match batch.status {
        Status::Validating => first(ends(timing.validating_for), Step::ValidationEnds),
        Status::InProgress => {
            let all_finish = batch.finishable() == batch.requests.len();
            first(ends(timing.in_progress_for).filter(|_| all_finish), Step::Finalizes)
        }
        Status::Finalizing => due(ends(timing.finalizing_for)).map(Step::Completes),
        Status::Cancelling => due(ends(timing.cancelling_for)).map(Step::CancelEnds),
        Status::Failed | Status::Completed | Status::Expired | Status::Cancelled => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::results::Usage;

    const MS: Duration = Duration::from_millis(1);

    fn timing() -> OpenAiTiming {
        OpenAiTiming {
            validating_for: 10 * MS,
            in_progress_for: 100 * MS,
            finalizing_for: 10 * MS,
            cancelling_for: 20 * MS,
            completion_window: Duration::from_secs(3600),
        }
    }

    fn batch(now: Instant, n: usize) -> Batch {
        let mut batch =
            Batch::new("b".into(), "/v1/chat/completions".into(), "f".into(), None, Default::default(), now);
        let requests = (0..n)
            .map(|i| Request {
                custom_id: i.to_string(),
                body: Map::new(),
                outcome: if i == 0 {
                    Outcome::ServerError
                } else {
                    Outcome::Success(Usage { input_tokens: 2, output_tokens: 3 })
                },
            })
            .collect();
        batch.start("m".into(), requests, (0..n).collect(), now + 10 * MS);
        batch
    }

    #[test]
    fn validation_ends_after_its_duration() {
        let start = Instant::now();
        let fresh = Batch::new("b".into(), "e".into(), "f".into(), None, Default::default(), start);
        assert_eq!(next_step(&fresh, start + 9 * MS, &timing()), None);
        assert_eq!(next_step(&fresh, start + 50 * MS, &timing()), Some(Step::ValidationEnds(start + 10 * MS)));
    }

    #[test]
    fn requests_finish_evenly_and_the_batch_then_finalizes() {
        let start = Instant::now();
        let mut batch = batch(start, 4);
        let running = start + 10 * MS;
        assert_eq!(batch.finished_by(running + 50 * MS, &timing()), 2);
        let tally = batch.tally(running + 50 * MS, &timing());
        assert_eq!((tally.completed, tally.failed, tally.input_tokens), (1, 1, 2));
        assert_eq!(next_step(&batch, running + 99 * MS, &timing()), None);
        assert_eq!(next_step(&batch, running + 500 * MS, &timing()), Some(Step::Finalizes(running + 100 * MS)));
        batch.enter(Status::Finalizing, running + 100 * MS);
        assert_eq!(batch.finished_by(running + 100 * MS, &timing()), 4);
        assert_eq!(next_step(&batch, running + 500 * MS, &timing()), Some(Step::Completes(running + 110 * MS)));
    }

    #[test]
    fn a_stalled_batch_expires_with_what_finished() {
        let start = Instant::now();
        let mut batch = batch(start, 4);
        batch.stall_after = Some(1);
        let timing = OpenAiTiming { completion_window: Duration::from_secs(1), ..timing() };
        assert_eq!(next_step(&batch, start + 900 * MS, &timing), None, "stalled, not finalizing");
        let expiry = start + Duration::from_secs(1);
        assert_eq!(next_step(&batch, expiry + MS, &timing), Some(Step::Expires(expiry)));
        batch.stop(expiry, &timing);
        batch.enter(Status::Expired, expiry);
        assert_eq!(batch.finished_by(expiry + Duration::from_secs(9), &timing), 1);
        assert_eq!(batch.not_run_reason(), Some(NotRun::Expired));
    }

    #[test]
    fn durations_too_long_for_an_instant_mean_never() {
        let start = Instant::now();
        let fresh = Batch::new("b".into(), "e".into(), "f".into(), None, Default::default(), start);
        let never = OpenAiTiming { validating_for: Duration::MAX, completion_window: Duration::MAX, ..timing() };
        assert_eq!(next_step(&fresh, start + Duration::from_secs(3600), &never), None);
    }

    #[test]
    fn timing_changes_move_the_end_of_the_current_state() {
        let start = Instant::now();
        let fresh = Batch::new("b".into(), "e".into(), "f".into(), None, Default::default(), start);
        let held = OpenAiTiming { validating_for: Duration::from_secs(3600), ..timing() };
        assert_eq!(next_step(&fresh, start + Duration::from_secs(60), &held), None);
        let released = OpenAiTiming { validating_for: Duration::ZERO, ..held };
        assert_eq!(next_step(&fresh, start + Duration::from_secs(60), &released), Some(Step::ValidationEnds(start)));
    }
}
