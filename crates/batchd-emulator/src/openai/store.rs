//! The OpenAI emulator's shared state behind one mutex: files, batches, faults, settings and the call log.
//!
//! Batches move on lazily: every call first steps each unfinished batch to `now` (see [`super::lifecycle`]), so
//! statuses, enqueued tokens and result files are the same whichever endpoint looks first.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use axum::body::Bytes;
use rand::{RngExt, SeedableRng, rngs::StdRng, seq::SliceRandom};
use serde_json::{Map, Value};

use super::{
    OpenAiConfig, OpenAiLimits,
    batches::batch_json,
    faults::{OpenAiCallKind, OpenAiCallRecord, OpenAiFault, OpenAiFaultKind},
    http::OpenAiError,
    lifecycle::{Batch, OpenAiTiming, Request, Status, Step, next_step},
    results::{LineContext, Outcome, judge, not_run_line, ran_line},
    validation::{BatchError, InputCaps, validate},
};
use crate::{config::RateLimit, hold::Holds, limits::Meter};

/// Salt of the generator behind ids and shuffles, so it differs from the Cloudflare emulator's for one seed.
const OPENAI_SEED_SALT: u64 = 0x6f70_656e_6169;

/// How long a `batch`-purpose file is kept: 30 days (only reported as `expires_at`; nothing is deleted).
pub(crate) const FILE_EXPIRY: Duration = Duration::from_secs(30 * 24 * 3600);

/// The organization named in `token_limit_exceeded` messages.
const ORGANIZATION: &str = "org-emulator";

/// The limit quoted by a `token_limit_exceeded` fault when no enqueued-token limit is set (the one users report).
const REPORTED_TOKEN_LIMIT: u64 = 2_000_000;

/// One stored file: an upload, or a batch's output or error file.
#[derive(Debug, Clone)]
pub(crate) struct StoredFile {
    /// `file-…`.
    pub id: String,
    /// The name it was uploaded with, or `batch_…_output.jsonl` / `batch_…_error.jsonl`.
    pub filename: String,
    /// `batch` for uploads, `batch_output` for results.
    pub purpose: &'static str,
    /// The content.
    pub content: Bytes,
    /// When it was stored.
    pub created: Instant,
    /// Position in storing order, from 1 (the order `GET /v1/files` lists in).
    pub seq: u64,
    /// How long after `created` it expires (the upload's `expires_after`, the batch's `output_expires_after`, else
    /// the 30-day default); only reported as `expires_at`, nothing is deleted by time.
    pub expires_in: Duration,
}

/// The OpenAI emulator's state, shared by its handlers and the handle.
#[derive(Debug)]
pub(crate) struct OpenAi {
    /// The key callers must send (in the dialect's header).
    pub api_key: String,
    /// How this mount differs from OpenAI's API.
    pub dialect: super::OpenAiDialect,
    /// Turns instants into Unix times.
    clock: UnixClock,
    /// The calls and replies a `hold` fault keeps open, and their release.
    pub holds: Holds,
    /// Everything that changes.
    inner: Mutex<Inner>,
}

/// Turns instants into Unix times.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UnixClock {
    /// The instant `started_unix_ms` was read.
    started: Instant,
    /// Unix milliseconds at `started`.
    started_unix_ms: u64,
}

impl UnixClock {
    fn now() -> Self {
        let started_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(millis).unwrap_or_default();
        Self { started: Instant::now(), started_unix_ms }
    }

    /// Unix milliseconds of `at`.
    pub fn unix_ms(self, at: Instant) -> u64 {
        self.started_unix_ms.saturating_add(millis(at.saturating_duration_since(self.started)))
    }

    /// Unix seconds of `at`.
    pub fn unix_secs(self, at: Instant) -> u64 {
        self.unix_ms(at) / 1000
    }
}

#[derive(Debug)]
struct Inner {
    /// The same clock as [`OpenAi`]'s, for the times written into result files.
    clock: UnixClock,
    /// The deployments a batch's model must name ([`super::OpenAiDialect::deployments`]); empty: any model.
    deployments: Vec<String>,
    /// Current timing of batches.
    timing: OpenAiTiming,
    /// Current caps.
    limits: OpenAiLimits,
    /// Whether result files list requests in a random order (the documented "order is not guaranteed").
    shuffle: bool,
    /// Stored files by id (deleted ones are removed).
    files: HashMap<String, StoredFile>,
    /// Sequence number of the last file stored.
    last_file_seq: u64,
    /// Every batch, in creation order.
    batches: Vec<Batch>,
    /// Position in `batches` by batch id.
    batch_index: HashMap<String, usize>,
    /// Positions of the batches that are not terminal yet.
    unfinished: BTreeSet<usize>,
    /// Pending call-level faults, in injection order.
    call_faults: VecDeque<OpenAiFault>,
    /// Pending batch-level faults, in injection order.
    batch_faults: VecDeque<OpenAiFault>,
    /// The call log since start or the last reset.
    calls: Vec<OpenAiCallRecord>,
    /// Sequence number of the last logged call.
    last_seq: u64,
    /// Ids, request ids and shuffles.
    rng: StdRng,
    /// The batch creation limit (see [`OpenAiConfig::create_limit`]).
    create_limit: Option<RateLimit>,
    /// What the creation limit admitted.
    creates: Meter,
}

impl OpenAi {
    pub fn new(config: &OpenAiConfig, seed: u64) -> Self {
        let clock = UnixClock::now();
        Self {
            api_key: config.api_key.clone(),
            dialect: config.dialect.clone(),
            clock,
            holds: Holds::default(),
            inner: Mutex::new(Inner {
                clock,
                deployments: config.dialect.deployments.clone(),
                timing: config.timing,
                limits: config.limits,
                shuffle: config.shuffle,
                files: HashMap::new(),
                last_file_seq: 0,
                batches: Vec::new(),
                batch_index: HashMap::new(),
                unfinished: BTreeSet::new(),
                call_faults: VecDeque::new(),
                batch_faults: VecDeque::new(),
                calls: Vec::new(),
                last_seq: 0,
                rng: StdRng::seed_from_u64(seed ^ OPENAI_SEED_SALT),
                create_limit: config.create_limit,
                creates: Meter::default(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The clock that turns instants into Unix times.
    pub fn clock(&self) -> UnixClock {
        self.clock
    }

    /// A fresh `x-request-id`.
    pub fn new_request_id(&self) -> String {
        format!("req_{}", random_hex(&mut self.lock().rng, 32))
    }

    // ---- settings, faults, call log ----

    pub fn timing(&self) -> OpenAiTiming {
        self.lock().timing
    }

    pub fn set_timing(&self, timing: OpenAiTiming) {
        // Transitions due under the old timing happen first.
        let mut inner = self.lock();
        inner.advance_all(Instant::now());
        inner.timing = timing;
    }

    pub fn limits(&self) -> OpenAiLimits {
        self.lock().limits
    }

    pub fn set_limits(&self, limits: OpenAiLimits) {
        self.lock().limits = limits;
    }

    pub fn create_limit(&self) -> Option<RateLimit> {
        self.lock().create_limit
    }

    pub fn set_create_limit(&self, limit: Option<RateLimit>) {
        self.lock().create_limit = limit;
    }

    pub fn rate_limited_count(&self) -> u64 {
        self.lock().creates.n_refused()
    }

    /// Admits one batch create under the creation limit; `Err`: the 429 OpenAI answers over a rate limit.
    pub fn admit_create(&self) -> Result<(), OpenAiError> {
        let mut inner = self.lock();
        let limit = inner.create_limit;
        let wait = match inner.creates.admit(limit, "batches", tokio::time::Instant::now()) {
            Ok(()) => return Ok(()),
            Err(wait) => wait,
        };
        let window = match limit.map(|limit| limit.per.as_secs()) {
            Some(3600) => "requests per hour".to_owned(),
            Some(60) => "requests per min".to_owned(),
            _ => format!("requests per {} ms", limit.map_or(0, |limit| limit.per.as_millis())),
        };
        let message = format!(
            "Rate limit reached for batch creations in organization {ORGANIZATION} on {window}: Limit {}. Please \
             try again in {:.3}s.",
            limit.map_or(0, |limit| limit.requests),
            wait.as_secs_f64(),
        );
        Err(OpenAiError {
            retry_after_secs: Some(crate::limits::retry_after_secs(wait)),
            ..OpenAiError::for_status(429, Some(message), None)
        })
    }

    pub fn shuffle(&self) -> bool {
        self.lock().shuffle
    }

    pub fn set_shuffle(&self, shuffle: bool) {
        self.lock().shuffle = shuffle;
    }

    pub fn inject(&self, fault: OpenAiFault) {
        let mut inner = self.lock();
        if fault.times == 0 {
            return;
        }
        if fault.kind.is_batch_level() {
            inner.batch_faults.push_back(fault);
        } else {
            inner.call_faults.push_back(fault);
        }
    }

    pub fn pending_faults(&self) -> Vec<OpenAiFault> {
        let inner = self.lock();
        inner.call_faults.iter().chain(inner.batch_faults.iter()).cloned().collect()
    }

    /// Uses up one hit of the oldest call-level fault that hits a call of `kind` at this stage.
    pub fn take_call_fault(&self, kind: OpenAiCallKind, after: bool) -> Option<OpenAiFaultKind> {
        let mut inner = self.lock();
        let position = inner.call_faults.iter().position(|fault| fault.hits(kind, after))?;
        take_one(&mut inner.call_faults, position)
    }

    pub fn record(&self, mut record: OpenAiCallRecord) {
        let now_ms = self.clock.unix_ms(Instant::now());
        let mut inner = self.lock();
        inner.last_seq += 1;
        record.seq = inner.last_seq;
        record.at_ms = now_ms;
        inner.calls.push(record);
    }

    pub fn calls(&self) -> Vec<OpenAiCallRecord> {
        self.lock().calls.clone()
    }

    /// Calls logged since start or the last reset, without copying the log.
    pub fn n_calls(&self) -> u64 {
        self.lock().last_seq
    }

    /// Clears pending faults and the call log; files, batches and settings stay.
    pub fn reset(&self) {
        self.clear_faults();
        let mut inner = self.lock();
        inner.calls.clear();
        inner.last_seq = 0;
        inner.creates.reset();
    }

    /// Removes the faults not used up yet and answers them, call-level first.
    pub fn clear_faults(&self) -> Vec<OpenAiFault> {
        let mut inner = self.lock();
        let call_faults = std::mem::take(&mut inner.call_faults);
        let batch_faults = std::mem::take(&mut inner.batch_faults);
        call_faults.into_iter().chain(batch_faults).collect()
    }

    /// Number of batches created since start.
    pub fn batch_count(&self) -> usize {
        self.lock().batches.len()
    }

    /// Ids of the stored files (uploads and results), sorted.
    pub fn file_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.lock().files.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Every batch's id and status, oldest first.
    pub fn batch_statuses(&self) -> Vec<(String, &'static str)> {
        let mut inner = self.lock();
        inner.advance_all(Instant::now());
        inner.batches.iter().map(|batch| (batch.id.clone(), batch.status.as_str())).collect()
    }

    // ---- files ----

    /// Stores an upload; returns it.
    pub fn store_file(&self, filename: String, content: Bytes, expires_in: Option<Duration>) -> StoredFile {
        let mut inner = self.lock();
        let id = format!("file-{}", random_alphanumeric(&mut inner.rng, 22));
        inner.last_file_seq += 1;
        let seq = inner.last_file_seq;
        let expires_in = expires_in.unwrap_or(FILE_EXPIRY);
        let file = StoredFile {
            id: id.clone(),
            filename,
            purpose: "batch",
            content,
            created: Instant::now(),
            seq,
            expires_in,
        };
        inner.files.insert(id, file.clone());
        file
    }

    /// A stored file, with batches stepped first (so a result file named by a batch exists).
    pub fn file(&self, id: &str) -> Option<StoredFile> {
        let mut inner = self.lock();
        inner.advance_all(Instant::now());
        inner.files.get(id).cloned()
    }

    /// Files of `purpose` (any when `None`) in storing order (`descending`: newest first), after the file `after`
    /// (exclusive), at most `limit`; `None` when `after` is not a stored file. Also says whether more follow.
    pub fn list_files(
        &self,
        purpose: Option<&str>,
        after: Option<&str>,
        limit: usize,
        descending: bool,
    ) -> Option<(Vec<StoredFile>, bool)> {
        let mut inner = self.lock();
        inner.advance_all(Instant::now());
        let after_seq = match after {
            Some(after) => Some(inner.files.get(after)?.seq),
            None => None,
        };
        let mut files: Vec<&StoredFile> = inner
            .files
            .values()
            .filter(|file| purpose.is_none_or(|purpose| file.purpose == purpose))
            .filter(|file| after_seq.is_none_or(|after| if descending { file.seq < after } else { file.seq > after }))
            .collect();
        files.sort_by_key(|file| file.seq);
        if descending {
            files.reverse();
        }
        let has_more = files.len() > limit;
        Some((files.into_iter().take(limit).cloned().collect(), has_more))
    }

    /// Deletes a file; `false` when there was none.
    pub fn delete_file(&self, id: &str) -> bool {
        let mut inner = self.lock();
        inner.advance_all(Instant::now());
        inner.files.remove(id).is_some()
    }

    // ---- batches ----

    /// Creates a batch in `validating` from a stored input file; applies the pending batch-level faults to it.
    pub fn create_batch(
        &self,
        endpoint: String,
        input_file_id: String,
        metadata: Option<Map<String, Value>>,
        output_expires_in: Option<Duration>,
        completion_window: String,
    ) -> Result<(Value, Vec<&'static str>), OpenAiError> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.advance_all(now);
        let file = inner
            .files
            .get(&input_file_id)
            .ok_or_else(|| OpenAiError::not_found("File", &input_file_id, "input_file_id"))?;
        if file.purpose != "batch" {
            return Err(OpenAiError::invalid(
                "The input file must have been uploaded with purpose 'batch'.",
                Some("input_file_id"),
                None,
            ));
        }
        let content = file.content.clone();
        let id = format!("batch_{}", random_hex(&mut inner.rng, 32));
        let mut batch = Batch::new(id.clone(), endpoint, input_file_id, metadata, content, now);
        batch.output_expires_in = output_expires_in;
        batch.completion_window = completion_window;
        // Every pending batch-level fault hits this batch once; faults with hits left wait for the next batches.
        let mut fault_names = Vec::new();
        for fault in &mut inner.batch_faults {
            fault_names.push(fault.kind.name());
            fault.times = fault.times.saturating_sub(1);
            match &fault.kind {
                OpenAiFaultKind::TokenLimitExceeded => batch.refuse_tokens = true,
                OpenAiFaultKind::FailItems { indices } => batch.fail_lines.extend(indices.iter().copied()),
                OpenAiFaultKind::Stall { after_items } => batch.stall_after = Some(*after_items),
                OpenAiFaultKind::Status { .. }
                | OpenAiFaultKind::Reset
                | OpenAiFaultKind::Delay { .. }
                | OpenAiFaultKind::Hold => {}
            }
        }
        inner.batch_faults.retain(|fault| fault.times > 0);
        let position = inner.batches.len();
        inner.batch_index.insert(id, position);
        inner.unfinished.insert(position);
        let view = batch_json(self.clock, &batch, &inner.timing, now);
        inner.batches.push(batch);
        Ok((view, fault_names))
    }

    /// A batch's object, stepped to now.
    pub fn batch(&self, id: &str) -> Option<Value> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.advance_all(now);
        let position = *inner.batch_index.get(id)?;
        Some(batch_json(self.clock, &inner.batches[position], &inner.timing, now))
    }

    /// Every batch object (with its `metadata`), oldest first.
    pub fn batches(&self) -> Vec<Value> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.advance_all(now);
        let timing = inner.timing;
        inner.batches.iter().map(|batch| batch_json(self.clock, batch, &timing, now)).collect()
    }

    /// Batches newest first, after the batch `after` (exclusive), at most `limit`; `None` when `after` is unknown.
    /// Also says whether more follow.
    pub fn list_batches(&self, after: Option<&str>, limit: usize) -> Option<(Vec<Value>, bool)> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.advance_all(now);
        let end = match after {
            Some(after) => *inner.batch_index.get(after)?,
            None => inner.batches.len(),
        };
        let start = end.saturating_sub(limit);
        let page: Vec<Value> = inner.batches[start..end]
            .iter()
            .rev()
            .map(|batch| batch_json(self.clock, batch, &inner.timing, now))
            .collect();
        Some((page, start > 0))
    }

    /// Asks for a cancel: a `validating` or `in_progress` batch turns `cancelling`; one already `cancelling` is
    /// returned as it is. `Err(status)`: the batch's status does not allow a cancel. `Ok(None)`: no such batch.
    pub fn cancel_batch(&self, id: &str) -> Result<Option<Value>, Status> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.advance_all(now);
        let Some(&position) = inner.batch_index.get(id) else { return Ok(None) };
        let timing = inner.timing;
        let batch = &mut inner.batches[position];
        match batch.status {
            Status::Validating | Status::InProgress => {
                batch.stop(now, &timing);
                batch.input = None;
                batch.enter(Status::Cancelling, now);
            }
            Status::Cancelling => {}
            other => return Err(other),
        }
        Ok(Some(batch_json(self.clock, batch, &timing, now)))
    }
}

impl Inner {
    /// Steps every unfinished batch to `now`, oldest first.
    fn advance_all(&mut self, now: Instant) {
        let unfinished: Vec<usize> = self.unfinished.iter().copied().collect();
        for position in unfinished {
            while let Some(step) = next_step(&self.batches[position], now, &self.timing) {
                self.apply(position, step);
            }
            if self.batches[position].status.is_terminal() {
                self.unfinished.remove(&position);
            }
        }
    }

    fn apply(&mut self, position: usize, step: Step) {
        let timing = self.timing;
        match step {
            Step::ValidationEnds(at) => self.end_validation(position, at),
            Step::Finalizes(at) => self.batches[position].enter(Status::Finalizing, at),
            Step::Completes(at) => {
                self.batches[position].enter(Status::Completed, at);
                self.write_results(position, at);
            }
            Step::Expires(at) => {
                let batch = &mut self.batches[position];
                batch.stop(at, &timing);
                batch.input = None;
                batch.enter(Status::Expired, at);
                self.write_results(position, at);
            }
            Step::CancelEnds(at) => {
                self.batches[position].enter(Status::Cancelled, at);
                self.write_results(position, at);
            }
        }
    }

    fn end_validation(&mut self, position: usize, at: Instant) {
        let caps =
            InputCaps { max_lines: self.limits.max_lines, max_embedding_inputs: self.limits.max_embedding_inputs };
        let batch = &mut self.batches[position];
        let content = batch.input.take().unwrap_or_default();
        let valid = match validate(&content, &batch.endpoint, caps) {
            Ok(valid) => valid,
            Err(errors) => return batch.fail(errors, at),
        };
        // Azure OpenAI: the model is a deployment's name.
        if !self.deployments.is_empty() && !self.deployments.contains(&valid.model) {
            let message = format!(
                "The model '{}' does not exist or you do not have access to it: name a global-batch deployment.",
                crate::openai::http::capped(&valid.model)
            );
            let error = BatchError::new("model_not_found", message, Some("body.model"), None);
            return batch.fail(vec![error], at);
        }
        let requests: Vec<Request> = valid
            .lines
            .into_iter()
            .enumerate()
            .map(|(index, line)| {
                let outcome = if batch.fail_lines.contains(&index) {
                    Outcome::ServerError
                } else {
                    judge(&batch.endpoint, &line.body)
                };
                Request { custom_id: line.custom_id, body: line.body, outcome }
            })
            .collect();
        let tokens: u64 = requests
            .iter()
            .map(|request| match request.outcome {
                Outcome::Success(usage) => usage.input_tokens,
                _ => 0,
            })
            .sum();
        let refuse_tokens = batch.refuse_tokens;
        let enqueued = self.enqueued_tokens(&valid.model);
        let limit = self.limits.enqueued_token_limit;
        if refuse_tokens || limit.is_some_and(|limit| enqueued.saturating_add(tokens) > limit) {
            let limit = limit.unwrap_or(REPORTED_TOKEN_LIMIT);
            let message = format!(
                "Enqueued token limit reached for {} in organization {ORGANIZATION}. Limit: {} enqueued tokens. \
                 Please try again once some in_progress batches have been completed.",
                valid.model,
                with_thousands(limit)
            );
            let error = BatchError::new("token_limit_exceeded", message, None, None);
            return self.batches[position].fail(vec![error], at);
        }
        let mut finish_order: Vec<usize> = (0..requests.len()).collect();
        if self.shuffle {
            finish_order.shuffle(&mut self.rng);
        }
        self.batches[position].start(valid.model, requests, finish_order, at);
    }

    /// Input tokens of the batches of `model` that are running (in progress, finalizing or cancelling).
    fn enqueued_tokens(&self, model: &str) -> u64 {
        self.unfinished
            .iter()
            .map(|&position| &self.batches[position])
            .filter(|batch| {
                matches!(batch.status, Status::InProgress | Status::Finalizing | Status::Cancelling)
                    && batch.model.as_deref() == Some(model)
            })
            .map(|batch| batch.tallies.last().map_or(0, |tally| tally.input_tokens))
            .sum()
    }

    /// Writes a finished batch's output and error files (each only when it has a line).
    fn write_results(&mut self, position: usize, at: Instant) {
        let batch = &mut self.batches[position];
        let Some(model) = batch.model.clone() else { return };
        let created = self.clock.unix_secs(at);
        let context = LineContext { batch_id: &batch.id, endpoint: &batch.endpoint, model: &model, created };
        let finished = batch.finished_at_stop.unwrap_or(batch.requests.len());
        let not_run = batch.not_run_reason();
        let mut output = Vec::new();
        let mut errors = Vec::new();
        for (rank, &index) in batch.finish_order.iter().enumerate() {
            let request = &batch.requests[index];
            let line = if rank < finished {
                ran_line(context, index, &request.custom_id, &request.body, &request.outcome)
            } else if let Some(why) = not_run {
                not_run_line(context, index, &request.custom_id, why)
            } else {
                continue;
            };
            let target = if rank < finished && request.outcome.is_success() { &mut output } else { &mut errors };
            if serde_json::to_writer(&mut *target, &line).is_ok() {
                target.push(b'\n');
            }
        }
        // The bodies are in the files now.
        for request in &mut batch.requests {
            request.body = Map::new();
        }
        let batch_id = batch.id.clone();
        let expires_in = batch.output_expires_in.unwrap_or(FILE_EXPIRY);
        let output_id = (!output.is_empty()).then(|| self.store_result(&batch_id, "output", output, at, expires_in));
        let error_id = (!errors.is_empty()).then(|| self.store_result(&batch_id, "error", errors, at, expires_in));
        let batch = &mut self.batches[position];
        batch.output_file_id = output_id;
        batch.error_file_id = error_id;
    }

    fn store_result(
        &mut self,
        batch_id: &str,
        which: &str,
        content: Vec<u8>,
        at: Instant,
        expires_in: Duration,
    ) -> String {
        let id = format!("file-{}", random_alphanumeric(&mut self.rng, 22));
        self.last_file_seq += 1;
        let file = StoredFile {
            seq: self.last_file_seq,
            id: id.clone(),
            filename: format!("{batch_id}_{which}.jsonl"),
            purpose: "batch_output",
            content: Bytes::from(content),
            created: at,
            expires_in,
        };
        self.files.insert(id.clone(), file);
        id
    }
}

/// Uses up one hit of the fault at `position`, removing it when none is left; returns its kind.
fn take_one(faults: &mut VecDeque<OpenAiFault>, position: usize) -> Option<OpenAiFaultKind> {
    let fault = faults.get_mut(position)?;
    let kind = fault.kind.clone();
    fault.times = fault.times.saturating_sub(1);
    if fault.times == 0 {
        faults.remove(position);
    }
    Some(kind)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn random_hex(rng: &mut StdRng, len: usize) -> String {
    const HEX: &[u8] = b"0123456789abcdef";
    (0..len).map(|_| char::from(HEX[rng.random_range(0..HEX.len())])).collect()
}

fn random_alphanumeric(rng: &mut StdRng, len: usize) -> String {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..len).map(|_| char::from(CHARS[rng.random_range(0..CHARS.len())])).collect()
}

/// `2000000` as `2,000,000`, as the API writes limits in messages.
fn with_thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_written_with_thousands_separators() {
        assert_eq!(with_thousands(2_000_000), "2,000,000");
        assert_eq!(with_thousands(999), "999");
        assert_eq!(with_thousands(1_000), "1,000");
    }

    #[test]
    fn a_fault_with_several_hits_stays_until_used_up() {
        let mut faults = VecDeque::from([OpenAiFault::stall(1).times(2)]);
        assert!(take_one(&mut faults, 0).is_some());
        assert_eq!(faults.len(), 1);
        assert!(take_one(&mut faults, 0).is_some());
        assert!(faults.is_empty());
    }
}
