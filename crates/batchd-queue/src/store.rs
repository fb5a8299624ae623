//! The job ledger, the schedule and result publishing: every state transition is one Lua script, so a crash
//! between two steps leaves Redis in a state a restarted replica can resume from.

use std::collections::HashMap;
use std::time::Duration;

use batchd_core::ledger::field;
use batchd_core::{ChunkRef, ChunkState, Job, JobError, JobId, JobState, Keys, ResultEntry, UnixMillis};
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

use crate::StoreError;

/// Retention and timing settings of the storage layer.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// Approximate maximum length of each results stream (`XADD ... MAXLEN ~`).
    pub results_maxlen: u64,
    /// Approximate maximum length of the dead-letter stream.
    pub dead_maxlen: u64,
    /// How long a finished job's ledger is kept; a job id is deduplicated for this long after it finished.
    pub ledger_ttl: Duration,
    /// How long a claimed schedule member stays claimed before it becomes due again.
    pub lease: Duration,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            results_maxlen: 100_000,
            dead_maxlen: 10_000,
            ledger_ttl: Duration::from_secs(7 * 24 * 3600),
            lease: Duration::from_secs(60),
        }
    }
}

/// What [`Store::accept`] did with an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// A new job: its ledger exists and its chunks are scheduled; the entry is acknowledged.
    New,
    /// The job id already had a ledger (in the given state); the entry was acknowledged and counted, nothing else.
    Duplicate {
        /// State of the existing job.
        state: String,
    },
}

/// What [`Store::begin_submit`] decided for a chunk.
#[derive(Debug, Clone)]
pub enum SubmitTicket {
    /// Submit the chunk now; the job JSON is returned so no second read is needed.
    Go {
        /// Attempts made so far, this one included.
        attempt: u64,
        /// True when a previous submit of this chunk was interrupted (its remote batch may exist).
        resubmit: bool,
        /// The job's v1 JSON.
        job_json: String,
        /// The chunk's items: first index and count.
        items: (usize, usize),
    },
    /// The chunk is past submitting (in the given state); nothing to submit.
    Skip {
        /// The chunk's current state.
        chunk_state: String,
    },
    /// The job has finished or no longer exists.
    Gone,
}

/// The part of the ledger a poll needs.
#[derive(Debug, Clone)]
pub struct ChunkView {
    /// Job state.
    pub job_state: JobState,
    /// The job's model.
    pub model: String,
    /// Chunk state.
    pub chunk_state: ChunkState,
    /// Remote request id, once submitted.
    pub request_id: Option<String>,
    /// First item index of the chunk.
    pub items_start: usize,
    /// Number of items in the chunk.
    pub items_len: usize,
    /// Polls answered so far.
    pub n_polls: u64,
    /// Consecutive failed polls.
    pub poll_failures: u64,
    /// Submit attempts so far.
    pub attempts: u64,
    /// The job's deadline, Unix ms.
    pub deadline_at: UnixMillis,
    /// When the job was accepted, Unix ms.
    pub accepted_at: UnixMillis,
    /// Number of chunks of the job.
    pub n_chunks: u32,
    /// Number of items of the job.
    pub n_items: usize,
}

/// A job's fields needed to publish its result.
#[derive(Debug, Clone)]
pub struct PublishContext {
    /// The job's model.
    pub model: String,
    /// Results stream to publish to.
    pub reply_to: String,
    /// The job's metadata JSON, if any.
    pub metadata: Option<String>,
    /// When the job was accepted, Unix ms.
    pub accepted_at: UnixMillis,
    /// Number of items of the job.
    pub n_items: usize,
    /// Per chunk: request id (if submitted), state, stored output (if done), last error (if failed), items start.
    pub chunks: Vec<ChunkRecord>,
}

/// One chunk's stored outcome.
#[derive(Debug, Clone)]
pub struct ChunkRecord {
    /// Remote request id, if the chunk was submitted.
    pub request_id: Option<String>,
    /// The chunk's state.
    pub state: Option<ChunkState>,
    /// The stored normalised output JSON, when done.
    pub output: Option<String>,
    /// The stored error JSON, when failed.
    pub last_error: Option<String>,
    /// First item index.
    pub items_start: usize,
    /// Number of items.
    pub items_len: usize,
}

/// A planned split of a job into chunks: `(start, len)` item ranges covering the job in order.
pub type ChunkPlan = Vec<(usize, usize)>;

/// Handle on one namespace's storage. Cheap to clone; all clones share one multiplexed connection.
#[derive(Clone)]
pub struct Store {
    conn: ConnectionManager,
    keys: Keys,
    settings: StoreSettings,
    scripts: std::sync::Arc<Scripts>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("keys", &self.keys).field("settings", &self.settings).finish()
    }
}

struct Scripts {
    accept: Script,
    reject: Script,
    claim: Script,
    begin_submit: Script,
    update_chunk: Script,
    chunk_done: Script,
    publish: Script,
}

impl Scripts {
    fn load() -> Self {
        Self {
            accept: Script::new(include_str!("lua/accept.lua")),
            reject: Script::new(include_str!("lua/reject.lua")),
            claim: Script::new(include_str!("lua/claim.lua")),
            begin_submit: Script::new(include_str!("lua/begin_submit.lua")),
            update_chunk: Script::new(include_str!("lua/update_chunk.lua")),
            chunk_done: Script::new(include_str!("lua/chunk_done.lua")),
            publish: Script::new(include_str!("lua/publish.lua")),
        }
    }
}

/// A copy of an undecodable entry for the dead-letter stream.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The entry's fields as they were.
    pub fields: Vec<(String, Vec<u8>)>,
    /// Why it could not be decoded.
    pub reason: String,
}

impl Store {
    /// A store over `conn` for the namespace of `keys`.
    pub fn new(conn: ConnectionManager, keys: Keys, settings: StoreSettings) -> Self {
        Self { conn, keys, settings, scripts: std::sync::Arc::new(Scripts::load()) }
    }

    /// The namespace's keys.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The storage settings.
    pub fn settings(&self) -> &StoreSettings {
        &self.settings
    }

    /// A clone of the shared connection, for callers that issue their own commands.
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Accepts `job` from ingress entry `entry_id`: ledger created, chunks scheduled, entry acknowledged.
    /// The first chunk is scheduled at `first_due` (the accepting replica submits it right away and holds it
    /// by that lease); the others are due at once.
    pub async fn accept(
        &self,
        job: &Job,
        entry_id: &str,
        plan: &ChunkPlan,
        now: UnixMillis,
        deadline_at: UnixMillis,
        first_due: UnixMillis,
    ) -> Result<Accepted, StoreError> {
        let reply_to = job.reply_to.clone().unwrap_or_else(|| self.keys.results());
        let mut invocation = self.scripts.accept.prepare_invoke();
        invocation
            .key(self.keys.job(&job.id))
            .key(self.keys.submit())
            .key(self.keys.schedule())
            .arg(batchd_core::keys::CONSUMER_GROUP)
            .arg(entry_id)
            .arg(now)
            .arg(job.id.as_str())
            .arg(plan.len())
            .arg(first_due)
            .arg(now);
        let mut ledger: Vec<(&str, String)> = vec![
            (field::STATE, JobState::Accepted.as_str().to_owned()),
            (field::JOB, job.to_json()),
            (field::MODEL, job.model.to_string()),
            (field::ENTRY_ID, entry_id.to_owned()),
            (field::N_CHUNKS, plan.len().to_string()),
            (field::N_ITEMS, job.requests.len().to_string()),
            (field::ACCEPTED_AT, now.to_string()),
            (field::UPDATED_AT, now.to_string()),
            (field::DEADLINE_AT, deadline_at.to_string()),
            (field::REPLY_TO, reply_to),
        ];
        if let Some(metadata) = &job.metadata {
            ledger.push(("metadata", metadata.get().to_owned()));
        }
        for (name, value) in &ledger {
            invocation.arg(*name).arg(value);
        }
        invocation.arg("--chunks");
        for (start, len) in plan {
            invocation.arg(format!("{start}:{len}"));
        }
        let (verdict, state): (String, String) = invocation.invoke_async(&mut self.conn.clone()).await?;
        Ok(match verdict.as_str() {
            "accepted" => Accepted::New,
            _ => Accepted::Duplicate { state },
        })
    }

    /// Finishes ingress entry `entry_id` as a failed job `job_id` without running it: one `failed` result entry
    /// with `error`, a finished ledger, the entry acknowledged; and, for an undecodable entry, a dead-letter copy.
    /// Returns false when `job_id` already had a ledger (the entry was a duplicate and only acknowledged).
    pub async fn reject(
        &self,
        entry_id: &str,
        job_id: &JobId,
        model: &str,
        error: &JobError,
        dead: Option<&DeadLetter>,
        now: UnixMillis,
    ) -> Result<bool, StoreError> {
        let entry = ResultEntry {
            job_id: job_id.to_string(),
            status: batchd_core::ResultStatus::Failed,
            model: model.to_owned(),
            result: None,
            error: Some(error.clone()),
            metadata: None,
            request_ids: Vec::new(),
            accepted_at: now,
            finished_at: now,
            items_total: 0,
            items_failed: 0,
        };
        let result_fields = entry.to_fields();
        let ledger: Vec<(&str, String)> = vec![
            (field::STATE, JobState::Failed.as_str().to_owned()),
            (field::MODEL, model.to_owned()),
            (field::ENTRY_ID, entry_id.to_owned()),
            (field::N_CHUNKS, "0".to_owned()),
            (field::N_ITEMS, "0".to_owned()),
            (field::ACCEPTED_AT, now.to_string()),
            (field::UPDATED_AT, now.to_string()),
            (field::FINISHED_AT, now.to_string()),
            (field::REPLY_TO, self.keys.results()),
            (field::ERROR, error.to_json()),
        ];
        let mut invocation = self.scripts.reject.prepare_invoke();
        invocation
            .key(self.keys.job(job_id))
            .key(self.keys.submit())
            .key(self.keys.results())
            .key(self.keys.dead())
            .arg(batchd_core::keys::CONSUMER_GROUP)
            .arg(entry_id)
            .arg(self.settings.results_maxlen)
            .arg(self.settings.dead_maxlen)
            .arg(self.settings.ledger_ttl.as_secs().max(1))
            .arg(result_fields.len());
        for (name, value) in &result_fields {
            invocation.arg(*name).arg(value);
        }
        invocation.arg(ledger.len());
        for (name, value) in &ledger {
            invocation.arg(*name).arg(value);
        }
        match dead {
            None => {
                invocation.arg(0);
            }
            Some(dead) => {
                invocation.arg(3 + dead.fields.len());
                invocation
                    .arg("source_id")
                    .arg(entry_id)
                    .arg("error")
                    .arg(&dead.reason)
                    .arg("dead_at")
                    .arg(now);
                for (name, value) in &dead.fields {
                    invocation.arg(format!("field:{name}")).arg(value.as_slice());
                }
            }
        }
        let verdict: String = invocation.invoke_async(&mut self.conn.clone()).await?;
        Ok(verdict == "rejected")
    }

    /// Claims up to `limit` due schedule members (re-scored to now + lease).
    pub async fn claim_due(&self, now: UnixMillis, limit: usize) -> Result<Vec<String>, StoreError> {
        let lease_until = now + self.settings.lease.as_millis() as u64;
        let members: Vec<String> = self
            .scripts
            .claim
            .key(self.keys.schedule())
            .arg(now)
            .arg(lease_until)
            .arg(limit)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(members)
    }

    /// The score of the earliest schedule member, if any (to sleep until it is due).
    pub async fn next_due(&self) -> Result<Option<UnixMillis>, StoreError> {
        let first: Vec<(String, f64)> =
            self.conn.clone().zrange_withscores(self.keys.schedule(), 0, 0).await?;
        Ok(first.first().map(|(_, score)| *score as UnixMillis))
    }

    /// Makes `members` due at `due` again (hands back claimed work that was never started).
    pub async fn release(&self, members: &[String], due: UnixMillis) -> Result<(), StoreError> {
        if members.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(self.keys.schedule()).arg("XX");
        for member in members {
            cmd.arg(due).arg(member);
        }
        let _: i64 = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// Marks a chunk `submitting` (see `begin_submit.lua`). `count_attempt` is false for a retry after a
    /// rate-limit answer, which does not use up an attempt.
    pub async fn begin_submit(
        &self,
        chunk: &ChunkRef,
        now: UnixMillis,
        count_attempt: bool,
    ) -> Result<SubmitTicket, StoreError> {
        let (verdict, attempt, job_json, previous, items): (String, u64, String, String, String) = self
            .scripts
            .begin_submit
            .key(self.keys.job(&chunk.job_id))
            .arg(chunk.index)
            .arg(now)
            .arg(if count_attempt { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(match verdict.as_str() {
            "submit" | "resubmit" => SubmitTicket::Go {
                attempt,
                resubmit: verdict == "resubmit",
                job_json,
                items: parse_items(Some(&items)).ok_or_else(|| StoreError::Corrupt {
                    job_id: chunk.job_id.to_string(),
                    detail: format!("chunk {} has items {items:?}", chunk.index),
                })?,
            },
            "skip" => SubmitTicket::Skip { chunk_state: previous },
            _ => SubmitTicket::Gone,
        })
    }

    /// Sets chunk fields (`chunk_fields`, stored as `c<i>:<name>`) and job-level fields (`job_fields`),
    /// optionally increments one chunk field, and schedules the chunk at `due` — one atomic step. Returns false
    /// (and unschedules the chunk) when the job has finished meanwhile.
    pub async fn update_chunk(
        &self,
        chunk: &ChunkRef,
        due: Option<UnixMillis>,
        increment: Option<&str>,
        chunk_fields: &[(&str, String)],
        job_fields: &[(&str, String)],
    ) -> Result<bool, StoreError> {
        let mut invocation = self.scripts.update_chunk.prepare_invoke();
        invocation
            .key(self.keys.job(&chunk.job_id))
            .key(self.keys.schedule())
            .arg(chunk.to_string())
            .arg(due.map(|due| due.to_string()).unwrap_or_default())
            .arg(increment.map(|name| field::chunk(chunk.index, name)).unwrap_or_default());
        for (name, value) in chunk_fields {
            invocation.arg(field::chunk(chunk.index, name)).arg(value);
        }
        for (name, value) in job_fields {
            invocation.arg(*name).arg(value);
        }
        let updated: i64 = invocation.invoke_async(&mut self.conn.clone()).await?;
        Ok(updated == 1)
    }

    /// Reads what a poll of `chunk` needs. `None` when the ledger does not exist (expired or never created).
    pub async fn load_chunk(&self, chunk: &ChunkRef) -> Result<Option<ChunkView>, StoreError> {
        let names = [
            field::STATE.to_owned(),
            field::MODEL.to_owned(),
            field::chunk(chunk.index, field::CHUNK_STATE),
            field::chunk(chunk.index, field::CHUNK_REQUEST_ID),
            field::chunk(chunk.index, field::CHUNK_ITEMS),
            field::chunk(chunk.index, field::CHUNK_N_POLLS),
            field::chunk(chunk.index, field::CHUNK_POLL_FAILURES),
            field::chunk(chunk.index, field::CHUNK_ATTEMPTS),
            field::DEADLINE_AT.to_owned(),
            field::ACCEPTED_AT.to_owned(),
            field::N_CHUNKS.to_owned(),
            field::N_ITEMS.to_owned(),
        ];
        let values: Vec<Option<String>> = self.conn.clone().hmget(self.keys.job(&chunk.job_id), &names[..]).await?;
        let Some(state) = values[0].as_deref() else {
            return Ok(None);
        };
        let corrupt = |what: &str| StoreError::Corrupt {
            job_id: chunk.job_id.to_string(),
            detail: what.to_owned(),
        };
        let number = |index: usize| -> u64 { values[index].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0) };
        let (items_start, items_len) = parse_items(values[4].as_deref()).ok_or_else(|| corrupt("chunk items"))?;
        Ok(Some(ChunkView {
            job_state: state.parse().map_err(|_| corrupt("job state"))?,
            model: values[1].clone().unwrap_or_default(),
            chunk_state: values[2]
                .as_deref()
                .unwrap_or("")
                .parse()
                .map_err(|_| corrupt("chunk state"))?,
            request_id: values[3].clone(),
            items_start,
            items_len,
            n_polls: number(5),
            poll_failures: number(6),
            attempts: number(7),
            deadline_at: number(8),
            accepted_at: number(9),
            n_chunks: number(10) as u32,
            n_items: number(11) as usize,
        }))
    }

    /// Stores a finished chunk's output (`state` done) or error (`state` failed) and unschedules it; returns the
    /// number of the job's chunks still open, or `None` when the job already finished.
    pub async fn chunk_done(
        &self,
        chunk: &ChunkRef,
        state: ChunkState,
        payload: &str,
        now: UnixMillis,
    ) -> Result<Option<u32>, StoreError> {
        let open: i64 = self
            .scripts
            .chunk_done
            .key(self.keys.job(&chunk.job_id))
            .key(self.keys.schedule())
            .arg(chunk.to_string())
            .arg(chunk.index)
            .arg(state.as_str())
            .arg(payload)
            .arg(now)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(u32::try_from(open).ok())
    }

    /// Reads everything needed to build a job's result entry.
    pub async fn publish_context(&self, job_id: &JobId) -> Result<Option<PublishContext>, StoreError> {
        let key = self.keys.job(job_id);
        let head: Vec<Option<String>> = self
            .conn
            .clone()
            .hmget(
                &key,
                &[field::MODEL, field::REPLY_TO, "metadata", field::ACCEPTED_AT, field::N_ITEMS, field::N_CHUNKS][..],
            )
            .await?;
        let Some(n_chunks) = head[5].as_deref().and_then(|n| n.parse::<u32>().ok()) else {
            return Ok(None);
        };
        let mut names = Vec::with_capacity(n_chunks as usize * 5);
        for index in 0..n_chunks {
            for name in [
                field::CHUNK_REQUEST_ID,
                field::CHUNK_STATE,
                field::CHUNK_OUTPUT,
                field::CHUNK_LAST_ERROR,
                field::CHUNK_ITEMS,
            ] {
                names.push(field::chunk(index, name));
            }
        }
        let values: Vec<Option<String>> = if names.is_empty() {
            Vec::new()
        } else {
            self.conn.clone().hmget(&key, &names[..]).await?
        };
        let chunks = values
            .chunks(5)
            .map(|chunk| {
                let (items_start, items_len) = parse_items(chunk[4].as_deref()).unwrap_or((0, 0));
                ChunkRecord {
                    request_id: chunk[0].clone(),
                    state: chunk[1].as_deref().and_then(|s| s.parse().ok()),
                    output: chunk[2].clone(),
                    last_error: chunk[3].clone(),
                    items_start,
                    items_len,
                }
            })
            .collect();
        Ok(Some(PublishContext {
            model: head[0].clone().unwrap_or_default(),
            reply_to: head[1].clone().unwrap_or_else(|| self.keys.results()),
            metadata: head[2].clone(),
            accepted_at: head[3].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0),
            n_items: head[4].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0),
            chunks,
        }))
    }

    /// Publishes `entry` to `reply_to` and closes the ledger with `state`, atomically and at most once per job.
    /// Returns false when the job had already finished (nothing was published).
    pub async fn publish(
        &self,
        job_id: &JobId,
        entry: &ResultEntry,
        state: JobState,
        reply_to: &str,
        now: UnixMillis,
    ) -> Result<bool, StoreError> {
        if !self.keys.is_results_stream(reply_to) {
            return Err(StoreError::Corrupt {
                job_id: job_id.to_string(),
                detail: format!("reply_to {reply_to:?} is outside the namespace"),
            });
        }
        let fields = entry.to_fields();
        let mut invocation = self.scripts.publish.prepare_invoke();
        invocation
            .key(self.keys.job(job_id))
            .key(reply_to)
            .key(self.keys.schedule())
            .arg(state.as_str())
            .arg(now)
            .arg(self.settings.results_maxlen)
            .arg(self.settings.ledger_ttl.as_secs().max(1))
            .arg(job_id.as_str())
            .arg(entry.error.as_ref().map(JobError::to_json).unwrap_or_default())
            .arg(fields.len());
        for (name, value) in &fields {
            invocation.arg(*name).arg(value);
        }
        let published: i64 = invocation.invoke_async(&mut self.conn.clone()).await?;
        Ok(published == 1)
    }

    /// The whole ledger of a job, as stored (for `batchd status`). `None` when there is none.
    pub async fn ledger(&self, job_id: &JobId) -> Result<Option<HashMap<String, String>>, StoreError> {
        let ledger: HashMap<String, String> = self.conn.clone().hgetall(self.keys.job(job_id)).await?;
        Ok((!ledger.is_empty()).then_some(ledger))
    }
}

fn parse_items(raw: Option<&str>) -> Option<(usize, usize)> {
    let (start, len) = raw?.split_once(':')?;
    Some((start.parse().ok()?, len.parse().ok()?))
}
