//! One typed view of a job's ledger for every reader outside the daemon's scripts: the producer library
//! (`Producer::status`), the CLI (`status`, `submit --wait`, `retry`) and the dashboard read a ledger through
//! [`LedgerView::read`] and nothing else (`tests/it/ledger_view.rs` fails on a per-chunk field read elsewhere).
//!
//! It is bounded like a writer (STYLE rule 24): the header and the per-chunk metadata are read by name with
//! `HMGET`, a few chunks per command, and never a chunk's request items or output, which can be megabytes each.
//! The request items are read only when asked for, one chunk per command ([`chunk_requests`]). It also owns the
//! two ledger value formats a reader parses: a chunk's `start:len` ([`parse_items`]) and its placement
//! ([`Placement::parse`]).

use std::collections::BTreeMap;

use batchd_core::ledger::field;
use batchd_core::{ChunkRef, ChunkState, JobId, JobState, Keys};

use crate::{Conn, Placement, StoreError};
use serde::{Deserialize, Serialize};

/// Most bytes of a job's `metadata` a view holds: the producer sizes it, so a larger one is left out and only its
/// size is kept ([`LedgerView::metadata_bytes`]); `batchd retry` reads it whole ([`job_metadata`]).
pub const METADATA_SHOWN_BYTES: u64 = 64 * 1024;

/// Chunks whose metadata one `HMGET` reads: with [`CHUNK_METADATA`]'s names, a few hundred values per command.
pub const CHUNKS_PER_READ: u32 = 32;

/// The per-chunk names a view reads: every one in `batchd_core::ledger::field::CHUNK_FIELDS` but the payloads (the
/// request items and the output), so a name added to the schema is shown without a change here.
pub fn chunk_metadata() -> impl Iterator<Item = &'static str> {
    field::CHUNK_FIELDS.iter().map(|(_, name)| *name).filter(|name| !CHUNK_PAYLOADS.contains(name))
}

/// The per-chunk fields a view never reads: their size is the producer's (items, their references) or the model's
/// (outputs).
pub const CHUNK_PAYLOADS: [&str; 3] = [field::CHUNK_REQUESTS, field::CHUNK_OUTPUT, field::CHUNK_REFERENCES];

/// The remote request id fields of chunks `0..n_chunks` (`c<i>:request_id`), for a look-up by remote batch id.
pub fn request_id_fields(n_chunks: u32) -> Vec<String> {
    (0..n_chunks).map(|index| field::chunk(index, field::CHUNK_REQUEST_ID)).collect()
}

/// A chunk's `start:len` (`c<i>:items`) as numbers; `None` unless it is exactly two unsigned integers.
pub fn parse_items(raw: Option<&str>) -> Option<(usize, usize)> {
    let (start, len) = raw?.split_once(':')?;
    Some((start.parse().ok()?, len.parse().ok()?))
}

impl Placement {
    /// A chunk's placement from its `items` (`start:len`) and `indices` (a JSON array of job-wide indices, or
    /// empty for a run of items) ledger values; `None` when they do not parse.
    pub fn parse(items: &str, indices: &str) -> Option<Self> {
        if !indices.is_empty() {
            return serde_json::from_str(indices).ok().map(Self::Indices);
        }
        parse_items(Some(items)).map(|(start, len)| Self::Range { start, len })
    }
}

/// A job's ledger without its payloads: the header fields and each chunk's metadata, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerView {
    /// The job.
    pub job_id: JobId,
    /// Job-level fields that are set, by name (every name of `field::JOB_FIELDS` is asked for; `metadata` only
    /// up to [`METADATA_SHOWN_BYTES`]).
    pub header: BTreeMap<&'static str, String>,
    /// The size of a `metadata` left out for being larger than [`METADATA_SHOWN_BYTES`].
    pub metadata_bytes: Option<u64>,
    /// The chunks, in order (as many as the ledger's `n_chunks` says, at most `MAX_CHUNKS_PER_JOB`).
    pub chunks: Vec<ChunkMetadata>,
}

/// One chunk's metadata fields that are set, by name (never its request items or output).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkMetadata {
    /// The fields, by per-chunk name (`state`, `items`, ...).
    pub fields: BTreeMap<&'static str, String>,
}

impl ChunkMetadata {
    /// A field's value, if set and not empty.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str).filter(|value| !value.is_empty())
    }

    /// A numeric field (0 when unset or not a number).
    pub fn number(&self, name: &str) -> u64 {
        self.get(name).and_then(|value| value.parse().ok()).unwrap_or(0)
    }

    /// The chunk's state, when it is one batchd knows.
    pub fn state(&self) -> Option<ChunkState> {
        self.get(field::CHUNK_STATE)?.parse().ok()
    }

    /// When the chunk's batch was submitted (ms), when the ledger has the time.
    pub fn submitted_at(&self) -> Option<u64> {
        self.get(field::CHUNK_SUBMITTED_AT)?.parse().ok()
    }

    /// Which of the job's items the chunk carries, when its ledger values parse.
    pub fn placement(&self) -> Option<Placement> {
        Placement::parse(self.get(field::CHUNK_ITEMS).unwrap_or(""), self.get(field::CHUNK_INDICES).unwrap_or(""))
    }

    /// The chunk's first item and item count (`start:len`), `(0, 0)` when unreadable.
    pub fn items(&self) -> (usize, usize) {
        parse_items(self.get(field::CHUNK_ITEMS)).unwrap_or((0, 0))
    }
}

/// A chunk's state and its remote batch's status as they are true now, for people (the dashboard's job page,
/// `batchd status`): the ledger keeps the last values a step wrote, so once the job has ended a chunk can still
/// say `submitting` (the job failed or was cancelled before its submit finished) and a `done` chunk still holds
/// the last status a pending poll saw (`running`). [`ChunkMetadata::status`] says what they mean at the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkStatus {
    /// `pending`, `submitting`, `polling`, `done` or `failed` while they hold; `<job state> with the job (was
    /// <state>)` for a chunk still open when its job ended (it will not finish any more).
    pub state: String,
    /// The remote batch: the status a poll saw while the chunk is followed; `finished, results read` once done;
    /// `never submitted`; or what is known once the job ended without it.
    pub remote: String,
}

impl ChunkMetadata {
    /// The chunk's state and remote status as they are true now, given its job's state (see [`ChunkStatus`]).
    pub fn status(&self, job: Option<JobState>) -> ChunkStatus {
        let stored = self.get(field::CHUNK_STATE).unwrap_or("-");
        let last_seen = self.get(field::CHUNK_REMOTE_STATUS);
        let submitted = self.get(field::CHUNK_REQUEST_ID).is_some() || self.get(field::CHUNK_REMOTE).is_some();
        let ended = job.filter(|job| job.is_terminal());
        let (state, remote) = match (self.state(), ended) {
            (Some(ChunkState::Done), _) => (stored.to_owned(), "finished, results read".to_owned()),
            (Some(ChunkState::Failed), _) if !submitted => (stored.to_owned(), "never submitted".to_owned()),
            (Some(ChunkState::Failed), _) => {
                (stored.to_owned(), last_seen.map_or_else(|| "unknown".to_owned(), |seen| format!("last seen {seen}")))
            }
            (Some(open), Some(job)) => {
                let remote = match (open, submitted) {
                    (ChunkState::Submitting, false) => "none recorded (the job ended during its submit)".to_owned(),
                    (_, false) => "never submitted".to_owned(),
                    (_, true) => format!("no longer followed (last seen {})", last_seen.unwrap_or("nothing yet")),
                };
                (format!("{job} with the job (was {stored})"), remote)
            }
            (_, _) => {
                let remote = match (last_seen, submitted) {
                    (Some(seen), _) => seen.to_owned(),
                    (None, true) => "submitted, not polled yet".to_owned(),
                    (None, false) => "-".to_owned(),
                };
                (stored.to_owned(), remote)
            }
        };
        ChunkStatus { state, remote }
    }
}

impl LedgerView {
    /// Reads job `job_id`'s ledger: the size of its `metadata` (`HSTRLEN`) and one `HMGET` of the header (with
    /// the metadata when it is small), then one `HMGET` per [`CHUNKS_PER_READ`] chunks of their metadata. `None`
    /// when the job has no ledger (no `state`).
    pub async fn read(conn: &mut Conn, keys: &Keys, job_id: &JobId) -> Result<Option<Self>, StoreError> {
        let key = keys.job(job_id);
        let metadata_len: u64 = redis::cmd("HSTRLEN").arg(&key).arg(field::METADATA).query_async(conn).await?;
        let shown = metadata_len <= METADATA_SHOWN_BYTES;
        let names: Vec<&'static str> =
            field::JOB_FIELDS.iter().map(|(_, name)| *name).filter(|name| shown || *name != field::METADATA).collect();
        let values: Vec<Option<String>> = redis::cmd("HMGET").arg(&key).arg(&names).query_async(conn).await?;
        let header: BTreeMap<&'static str, String> =
            names.into_iter().zip(values).filter_map(|(name, value)| Some((name, value?))).collect();
        if !header.contains_key(field::STATE) {
            return Ok(None);
        }
        let metadata_bytes = (!shown).then_some(metadata_len);
        let n_chunks =
            header.get(field::N_CHUNKS).and_then(|n| n.parse::<u32>().ok()).unwrap_or(0).min(crate::MAX_CHUNKS_PER_JOB);
        let per_chunk: Vec<&'static str> = chunk_metadata().collect();
        let mut chunks = Vec::with_capacity(n_chunks as usize);
        for first in (0..n_chunks).step_by(CHUNKS_PER_READ as usize) {
            let last = (first + CHUNKS_PER_READ).min(n_chunks);
            let fields: Vec<String> =
                (first..last).flat_map(|index| per_chunk.iter().map(move |name| field::chunk(index, name))).collect();
            let values: Vec<Option<String>> = redis::cmd("HMGET").arg(&key).arg(&fields).query_async(conn).await?;
            let mut values = values.into_iter();
            for _ in first..last {
                let fields = per_chunk
                    .iter()
                    .filter_map(|name| Some((*name, values.next().flatten()?)))
                    .collect::<BTreeMap<_, _>>();
                chunks.push(ChunkMetadata { fields });
            }
        }
        Ok(Some(Self { job_id: job_id.clone(), header, metadata_bytes, chunks }))
    }

    /// A header field's value, if set and not empty.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.header.get(name).map(String::as_str).filter(|value| !value.is_empty())
    }

    /// A numeric header field, when set and a number.
    pub fn number(&self, name: &str) -> Option<u64> {
        self.get(name)?.parse().ok()
    }

    /// The job's state, when it is one batchd knows.
    pub fn state(&self) -> Option<JobState> {
        self.get(field::STATE)?.parse().ok()
    }

    /// Every field read, with its ledger name (`c<i>:<name>` for a chunk's), in name order: what `status --json`
    /// prints.
    pub fn fields(&self) -> Vec<(String, &str)> {
        let mut fields: Vec<(String, &str)> =
            self.header.iter().map(|(name, value)| ((*name).to_owned(), value.as_str())).collect();
        for (index, chunk) in self.chunks.iter().enumerate() {
            for (name, value) in &chunk.fields {
                fields.push((field::chunk(index as u32, name), value.as_str()));
            }
        }
        fields
    }
}

/// Most bytes of a job's `error` a reader parses: batchd writes a code and one bounded line (plus the provider's code
/// and HTTP status), a few hundred bytes; a larger value was not written by batchd and is not read.
pub const ERROR_READ_BYTES: u64 = 16 * 1024;

/// A job's or a chunk's error (the ledger's `error`, a chunk's `last_error`: JSON `{code, message, api_code,
/// http_status}`), read field by field and leniently: a field of another type is left out, a value that is not a
/// JSON object is kept whole as the message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorFields {
    /// batchd's reason (`api_error`, `retries_exhausted`, `deadline_exceeded`, `cancelled`, ...).
    pub code: Option<String>,
    /// A sentence for people (the provider's own text, as batchd recorded it).
    pub message: Option<String>,
    /// The provider's own code, a number (Cloudflare) or a string (OpenAI, Anthropic), shown as text.
    pub api_code: Option<String>,
    /// The HTTP status the provider answered with.
    pub http_status: Option<u16>,
}

impl ErrorFields {
    /// Reads an error as the ledger stores it.
    pub fn parse(raw: &str) -> Self {
        let Ok(serde_json::Value::Object(object)) = serde_json::from_str::<serde_json::Value>(raw) else {
            return Self { message: Some(raw.to_owned()), ..Self::default() };
        };
        let text = |name: &str| object.get(name).and_then(serde_json::Value::as_str).map(str::to_owned);
        let api_code = match object.get("api_code") {
            Some(serde_json::Value::String(code)) => Some(code.clone()),
            Some(serde_json::Value::Number(code)) => Some(code.to_string()),
            _ => None,
        };
        let http_status =
            object.get("http_status").and_then(serde_json::Value::as_u64).and_then(|n| u16::try_from(n).ok());
        Self { code: text("code"), message: text("message"), api_code, http_status }
    }
}

impl LedgerView {
    /// The job's error (`failed`, `expired`, `cancelled` jobs have one), read field by field.
    pub fn error(&self) -> Option<ErrorFields> {
        self.get(field::ERROR).map(ErrorFields::parse)
    }
}

impl ChunkMetadata {
    /// The chunk's last error, read field by field.
    pub fn last_error(&self) -> Option<ErrorFields> {
        self.get(field::CHUNK_LAST_ERROR).map(ErrorFields::parse)
    }
}

/// The `error` of each of `jobs`' ledgers, in order, in two pipelined round trips: its size (`HSTRLEN`), then the
/// values of those up to [`ERROR_READ_BYTES`]. `None` for a ledger without an error; a larger value reads as an
/// error with no code and a message saying its size.
pub async fn job_errors(conn: &mut Conn, keys: &Keys, jobs: &[JobId]) -> Result<Vec<Option<ErrorFields>>, StoreError> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let mut sizes = redis::pipe();
    for job in jobs {
        sizes.cmd("HSTRLEN").arg(keys.job(job)).arg(field::ERROR);
    }
    let sizes: Vec<u64> = sizes.query_async(conn).await?;
    let readable: Vec<&JobId> = jobs
        .iter()
        .zip(&sizes)
        .filter(|(_, size)| (1..=ERROR_READ_BYTES).contains(*size))
        .map(|(job, _)| job)
        .collect();
    let mut values: Vec<Option<String>> = Vec::new();
    if !readable.is_empty() {
        let mut read = redis::pipe();
        for job in &readable {
            read.cmd("HGET").arg(keys.job(job)).arg(field::ERROR);
        }
        values = read.query_async(conn).await?;
    }
    let mut values = values.into_iter();
    Ok(sizes
        .into_iter()
        .map(|size| match size {
            0 => None,
            size if size <= ERROR_READ_BYTES => values.next().flatten().map(|raw| ErrorFields::parse(&raw)),
            size => Some(ErrorFields {
                message: Some(format!("(an error of {size} bytes, not read: batchd writes no error that large)")),
                ..ErrorFields::default()
            }),
        })
        .collect())
}

/// Job `job_id`'s whole `metadata`, for `batchd retry`, which must carry it over (a view leaves out a large one).
pub async fn job_metadata(conn: &mut Conn, keys: &Keys, job_id: &JobId) -> Result<Option<String>, StoreError> {
    Ok(redis::cmd("HGET").arg(keys.job(job_id)).arg(field::METADATA).query_async(conn).await?)
}

/// The state of each of `chunks` (one `HGET` each, pipelined); `None` for a chunk its ledger does not have.
pub async fn chunk_states(
    conn: &mut Conn,
    keys: &Keys,
    chunks: &[ChunkRef],
) -> Result<Vec<Option<String>>, StoreError> {
    let mut pipe = redis::pipe();
    for chunk in chunks {
        pipe.cmd("HGET").arg(keys.job(&chunk.job_id)).arg(field::chunk(chunk.index, field::CHUNK_STATE));
    }
    Ok(pipe.query_async(conn).await?)
}

/// For each of `chunks`: its job's state and model and the chunk's state (one `HMGET` each, pipelined); `None`
/// for a field the ledger does not have (all three for a ledger that expired).
pub async fn job_and_chunk_states(
    conn: &mut Conn,
    keys: &Keys,
    chunks: &[ChunkRef],
) -> Result<Vec<(Option<String>, Option<String>, Option<String>)>, StoreError> {
    if chunks.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for chunk in chunks {
        pipe.cmd("HMGET")
            .arg(keys.job(&chunk.job_id))
            .arg(field::STATE)
            .arg(field::MODEL)
            .arg(field::chunk(chunk.index, field::CHUNK_STATE));
    }
    Ok(pipe.query_async(conn).await?)
}

/// What a finished job's ledger still holds for running it again (`batchd retry`), read in one round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RerunCheck {
    /// The retry's own id already has a ledger (retried before).
    pub retry_exists: bool,
    /// The job's ledger still exists.
    pub exists: bool,
    /// Its chunk count (0 for a job refused before it ran).
    pub n_chunks: u64,
    /// Its first chunk still stores its request items.
    pub has_requests: bool,
}

/// Checks whether `job_id` can be run again as `retry_id`.
pub async fn rerun_check(
    conn: &mut Conn,
    keys: &Keys,
    job_id: &JobId,
    retry_id: &JobId,
) -> Result<RerunCheck, StoreError> {
    let ledger = keys.job(job_id);
    let (retry_exists, exists, n_chunks, has_requests): (bool, bool, Option<u64>, bool) = redis::pipe()
        .exists(keys.job(retry_id))
        .exists(&ledger)
        .hget(&ledger, field::N_CHUNKS)
        .hexists(&ledger, field::chunk(0, field::CHUNK_REQUESTS))
        .query_async(conn)
        .await?;
    Ok(RerunCheck { retry_exists, exists, n_chunks: n_chunks.unwrap_or(0), has_requests })
}

/// The size in bytes of chunk `index`'s stored request items of job `job_id` (`HSTRLEN`: 0 once they are gone), so
/// that a reader that shows them checks it before it reads them ([`chunk_requests`]).
pub async fn chunk_requests_bytes(conn: &mut Conn, keys: &Keys, job_id: &JobId, index: u32) -> Result<u64, StoreError> {
    Ok(redis::cmd("HSTRLEN")
        .arg(keys.job(job_id))
        .arg(field::chunk(index, field::CHUNK_REQUESTS))
        .query_async(conn)
        .await?)
}

/// Chunk `index`'s stored request items (a JSON array) of job `job_id`, one chunk per command, for `batchd retry`,
/// which rebuilds a job from them; `None` once they are gone (a finished job keeps only its timeline).
pub async fn chunk_requests(
    conn: &mut Conn,
    keys: &Keys,
    job_id: &JobId,
    index: u32,
) -> Result<Option<String>, StoreError> {
    Ok(redis::cmd("HGET")
        .arg(keys.job(job_id))
        .arg(field::chunk(index, field::CHUNK_REQUESTS))
        .query_async(conn)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(fields: &[(&'static str, &str)]) -> ChunkMetadata {
        ChunkMetadata { fields: fields.iter().map(|(name, value)| (*name, (*value).to_owned())).collect() }
    }

    #[test]
    fn a_chunk_says_what_is_true_once_its_job_has_ended() {
        let status = |fields: &[(&'static str, &str)], job| {
            let ChunkStatus { state, remote } = chunk(fields).status(job);
            (state, remote)
        };
        let (running, failed, cancelled) = (Some(JobState::Running), Some(JobState::Failed), Some(JobState::Cancelled));
        let polling = [("state", "polling"), ("request_id", "r-1"), ("remote_status", "running")];
        assert_eq!(status(&polling, running), ("polling".into(), "running".into()), "while it runs, as stored");
        let done = [("state", "done"), ("request_id", "r-1"), ("remote_status", "running")];
        assert_eq!(status(&done, Some(JobState::Completed)), ("done".into(), "finished, results read".into()));
        assert_eq!(
            status(&[("state", "submitting")], failed),
            ("failed with the job (was submitting)".into(), "none recorded (the job ended during its submit)".into())
        );
        assert_eq!(
            status(&polling, cancelled),
            ("cancelled with the job (was polling)".into(), "no longer followed (last seen running)".into())
        );
        assert_eq!(status(&[("state", "pending")], cancelled).1, "never submitted");
        assert_eq!(status(&[("state", "failed")], failed), ("failed".into(), "never submitted".into()));
        assert_eq!(status(&[("state", "submitting")], running), ("submitting".into(), "-".into()));
        assert_eq!(status(&[("state", "polling"), ("request_id", "r")], running).1, "submitted, not polled yet");
    }

    #[test]
    fn items_and_placements_parse_once_here() {
        assert_eq!(parse_items(Some("3:2")), Some((3, 2)));
        for bad in ["3", "3:", ":2", "-1:2", "3:2:1", "a:b"] {
            assert_eq!(parse_items(Some(bad)), None, "{bad}");
        }
        assert_eq!(Placement::parse("3:2", ""), Some(Placement::Range { start: 3, len: 2 }));
        assert_eq!(Placement::parse("0:2", "[7,9]"), Some(Placement::Indices(vec![7, 9])));
        assert_eq!(Placement::parse("0:2", "[7,"), None);
    }

    #[test]
    fn a_view_never_asks_for_a_payload_and_asks_for_every_other_chunk_name() {
        let asked: Vec<&str> = chunk_metadata().collect();
        for payload in CHUNK_PAYLOADS {
            assert!(!asked.contains(&payload), "{payload}");
        }
        assert_eq!(asked.len() + CHUNK_PAYLOADS.len(), field::CHUNK_FIELDS.len());
    }

    #[test]
    fn errors_read_field_by_field() {
        let error =
            ErrorFields::parse(r#"{"code":"api_error","message":"bad","api_code":5007,"http_status":400,"extra":[1]}"#);
        assert_eq!(
            error,
            ErrorFields {
                code: Some("api_error".into()),
                message: Some("bad".into()),
                api_code: Some("5007".into()),
                http_status: Some(400),
            }
        );
        assert_eq!(
            ErrorFields::parse(r#"{"code":"x","api_code":"rate_limit_error"}"#).api_code.as_deref(),
            Some("rate_limit_error")
        );
        let odd = ErrorFields::parse(r#"{"code":7,"http_status":70000}"#);
        assert_eq!(odd, ErrorFields::default(), "wrong types are left out");
        assert_eq!(ErrorFields::parse("not json").message.as_deref(), Some("not json"));
    }

    #[test]
    fn chunk_values_read_by_name() {
        let chunk = ChunkMetadata {
            fields: [(field::CHUNK_STATE, "polling".to_owned()), (field::CHUNK_ITEMS, "4:3".to_owned())]
                .into_iter()
                .collect(),
        };
        assert_eq!(chunk.state(), Some(ChunkState::Polling));
        assert_eq!(chunk.items(), (4, 3));
        assert_eq!(chunk.placement(), Some(Placement::Range { start: 4, len: 3 }));
        assert_eq!(chunk.number(field::CHUNK_N_POLLS), 0);
    }
}
