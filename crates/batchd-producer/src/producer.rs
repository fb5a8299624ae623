//! Enqueueing jobs and asking about them: [`Producer`], the job to enqueue ([`NewJob`]) and what the ledger says
//! about a job ([`JobStatus`]).
//!
//! Every job is validated here with the daemon's own decoder (`batchd_core::Job::decode`) before anything is
//! written, so a job the daemon would refuse never reaches the stream.

use std::time::Duration;

use batchd_core::job::JOB_FIELD;
use batchd_core::ledger::field;
use batchd_core::{ChunkState, Job, JobError, JobId, JobLimits, JobState, Keys, ResultEntry, UnixMillis, redact_url};
use batchd_queue::{Conn, Endpoint, LedgerView, RedisSettings, Topology, inspect};
use serde::Serialize;

use crate::error::ProducerError;
use crate::reader::{ReaderOptions, ResultReader};

/// Jobs written per round trip by [`Producer::enqueue_many`].
const PIPELINE_CHUNK: usize = 500;

/// The placeholder id used while validating a job without `id` (the real id is the entry id `XADD` returns).
const VALIDATION_ENTRY_ID: &str = "0-0";

/// A job to enqueue: the v1 job object (see docs/wire-format.md). Build it with [`NewJob::new`] and the setters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NewJob {
    /// The job's identity; the same id enqueued twice is one job with one result. Without it, the stream entry
    /// id becomes the job id (and enqueueing again makes a second job).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The model, which picks the provider: `@cf/<author>/<model>` (Workers AI), `openai/<model>`,
    /// `anthropic/<model>`.
    pub model: String,
    /// For providers with several endpoints (OpenAI): the one each item is a request body of, e.g.
    /// `/v1/embeddings`; `None`: the provider's default (`/v1/chat/completions`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The request items, each a JSON object exactly as the provider takes it (without `model`, which batchd
    /// fills in for OpenAI and Anthropic).
    pub requests: Vec<serde_json::Value>,
    /// The results stream for this job, `{ns}:results` (the default) or `{ns}:results:<suffix>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// A JSON object echoed back in the result entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    /// Seconds after acceptance at which the job ends `expired` (default: the daemon's `jobs.default_deadline_secs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_secs: Option<u64>,
    /// Resubmit, once, the items that came back `success:false` (default: the daemon's `jobs.retry_failed_items`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_failed_items: Option<bool>,
}

impl NewJob {
    /// A job for `model` with these request items.
    pub fn new(model: impl Into<String>, requests: Vec<serde_json::Value>) -> Self {
        Self {
            id: None,
            model: model.into(),
            endpoint: None,
            requests,
            reply_to: None,
            metadata: None,
            deadline_secs: None,
            retry_failed_items: None,
        }
    }

    /// Sets the job id (makes enqueueing idempotent).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Sets the provider endpoint the items are request bodies of (OpenAI: `/v1/embeddings`, `/v1/responses`, ...).
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Sends the result to `{ns}:results:<suffix>` instead of the default results stream.
    pub fn with_reply_to(mut self, stream: impl Into<String>) -> Self {
        self.reply_to = Some(stream.into());
        self
    }

    /// Attaches metadata (a JSON object) that comes back in the result entry.
    pub fn with_metadata(mut self, metadata: serde_json::Value) -> Self {
        self.metadata = Some(metadata);
        self
    }

    /// Sets the job's deadline in seconds after acceptance.
    pub fn with_deadline_secs(mut self, secs: u64) -> Self {
        self.deadline_secs = Some(secs);
        self
    }

    /// Asks the daemon to resubmit failed items once (or not, overriding its default).
    pub fn with_retry_failed_items(mut self, retry: bool) -> Self {
        self.retry_failed_items = Some(retry);
        self
    }

    /// The job as the JSON text of the `job` field.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a job of JSON values always serialises")
    }
}

/// One chunk (one remote batch) of a job, as the ledger records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChunkStatus {
    /// Where the chunk is (`None` if the ledger holds a state this library does not know).
    #[serde(serialize_with = "serialize_chunk_state")]
    pub state: Option<ChunkState>,
    /// Index of the chunk's first request item.
    pub first_item: usize,
    /// Number of request items in the chunk.
    pub n_items: usize,
    /// The Batch API's request id, once submitted.
    pub request_id: Option<String>,
    /// The remote status of the last poll (`queued`, `running`).
    pub remote_status: Option<String>,
    /// Polls answered so far.
    pub n_polls: u64,
    /// Submit attempts made.
    pub attempts: u64,
}

fn serialize_chunk_state<S: serde::Serializer>(state: &Option<ChunkState>, serializer: S) -> Result<S::Ok, S::Error> {
    match state {
        Some(state) => serializer.serialize_str(state.as_str()),
        None => serializer.serialize_none(),
    }
}

/// What the ledger (`{ns}:job:<id>`) says about a job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobStatus {
    /// The job id.
    pub id: JobId,
    /// Where the job is.
    #[serde(serialize_with = "serialize_job_state")]
    pub state: JobState,
    /// The job's model.
    pub model: String,
    /// Number of request items.
    pub n_items: usize,
    /// The job's chunks, in order.
    pub chunks: Vec<ChunkStatus>,
    /// When the daemon accepted the job, Unix ms.
    pub accepted_at: Option<UnixMillis>,
    /// The last change, Unix ms.
    pub updated_at: Option<UnixMillis>,
    /// When the job finished, Unix ms.
    pub finished_at: Option<UnixMillis>,
    /// When the job ends `expired` if it has not finished, Unix ms.
    pub deadline_at: Option<UnixMillis>,
    /// The results stream the job's result goes to.
    pub reply_to: Option<String>,
    /// Later entries that carried the same job id (acknowledged, never run).
    pub duplicates: u64,
    /// Submits repeated after a crash inside the submit window (each may have created a second remote batch).
    pub possible_duplicate_submits: u64,
    /// Why the job failed or expired.
    pub error: Option<JobError>,
    /// The id of the job's result entry in `reply_to`, once published.
    pub result_entry: Option<String>,
}

fn serialize_job_state<S: serde::Serializer>(state: &JobState, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(state.as_str())
}

impl JobStatus {
    /// Reads a ledger view; `None` when it has no known state.
    pub fn from_view(view: &LedgerView) -> Option<Self> {
        let state = view.state()?;
        let number = |name: &str| view.number(name);
        let chunks = view
            .chunks
            .iter()
            .map(|chunk| {
                let (first_item, n_items) = chunk.items();
                ChunkStatus {
                    state: chunk.state(),
                    first_item,
                    n_items,
                    request_id: chunk.get(field::CHUNK_REQUEST_ID).map(str::to_owned),
                    remote_status: chunk.get(field::CHUNK_REMOTE_STATUS).map(str::to_owned),
                    n_polls: chunk.number(field::CHUNK_N_POLLS),
                    attempts: chunk.number(field::CHUNK_ATTEMPTS),
                }
            })
            .collect();
        Some(Self {
            id: view.job_id.clone(),
            state,
            model: view.get(field::MODEL).unwrap_or_default().to_owned(),
            n_items: number(field::N_ITEMS).unwrap_or(0) as usize,
            chunks,
            accepted_at: number(field::ACCEPTED_AT),
            updated_at: number(field::UPDATED_AT),
            finished_at: number(field::FINISHED_AT),
            deadline_at: number(field::DEADLINE_AT),
            reply_to: view.get(field::REPLY_TO).map(str::to_owned),
            duplicates: number(field::DUPLICATES).unwrap_or(0),
            possible_duplicate_submits: number(field::POSSIBLE_DUPLICATE_SUBMITS).unwrap_or(0),
            error: view.get(field::ERROR).and_then(|error| serde_json::from_str(error).ok()),
            result_entry: view.get(field::RESULT_ENTRY).map(str::to_owned),
        })
    }

    /// Chunks whose remote batch finished.
    pub fn chunks_done(&self) -> usize {
        self.chunks.iter().filter(|chunk| chunk.state == Some(ChunkState::Done)).count()
    }

    /// Request items in finished chunks (all of them once the job is terminal).
    pub fn items_done(&self) -> usize {
        if self.state.is_terminal() {
            return self.n_items;
        }
        self.chunks.iter().filter(|chunk| chunk.state == Some(ChunkState::Done)).map(|chunk| chunk.n_items).sum()
    }
}

/// What [`Producer::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The cancellation was requested. The job's state at that moment, or `None` when it has no ledger (not taken in
    /// yet: it will never be submitted if it arrives while the request lasts).
    Requested(Option<JobState>),
    /// The job had already ended; nothing was changed.
    AlreadyFinished(JobState),
}

/// How long a cancellation request lasts by default: the daemon's default `retention.ledger_ttl_secs`.
const DEFAULT_CANCEL_TTL: Duration = Duration::from_secs(604_800);

/// Enqueues jobs into one batchd namespace and reads their state, through batchd's storage (`batchd_queue`), so it
/// reaches every deployment the daemon does: a standalone server, TLS and ACL users, Redis Cluster and Sentinel.
/// Cheap to clone (one shared connection).
#[derive(Clone)]
pub struct Producer {
    /// How to reach Redis, for the connections of results readers (each has its own).
    endpoint: Endpoint,
    /// The shared connection for short commands.
    conn: Conn,
    /// Keys of the namespace.
    keys: Keys,
    /// The limits jobs are validated against (the daemon's defaults unless set).
    limits: JobLimits,
    /// How long a cancellation request is kept (the daemon's `retention.ledger_ttl_secs` unless set).
    cancel_ttl: Duration,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").field("namespace", &self.keys.namespace()).field("limits", &self.limits).finish()
    }
}

/// How long [`Producer::connect`] waits for Redis to answer before it gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Producer {
    /// Connects to one Redis server at `url` (`redis://[user:password@]host:port[/db]`, or `rediss://` with the
    /// system's trust store) for the batchd namespace `namespace` (the daemon's `redis.namespace`, default
    /// `batchd`). For Cluster, Sentinel or a private CA, use [`Producer::with_endpoint`].
    pub async fn connect(url: &str, namespace: &str) -> Result<Self, ProducerError> {
        let keys = Keys::new(namespace)?;
        let settings = RedisSettings {
            url: url.to_owned(),
            topology: Topology::Standalone,
            nodes: Vec::new(),
            sentinel_master: String::new(),
            tls_ca_file: None,
            tls_client: None,
            response_timeout: Duration::from_secs(30),
        };
        let endpoint =
            Endpoint::new(&settings).map_err(|source| ProducerError::Connect { url: redact_url(url), source })?;
        Self::open(endpoint, keys, &redact_url(url)).await
    }

    /// Connects through `endpoint` (built from the same `RedisSettings` as the daemon's, so any deployment the
    /// daemon reaches) for the batchd namespace `namespace`. Fails at once when Redis does not answer.
    pub async fn with_endpoint(endpoint: Endpoint, namespace: &str) -> Result<Self, ProducerError> {
        let keys = Keys::new(namespace)?;
        Self::open(endpoint, keys, "the configured endpoint").await
    }

    async fn open(endpoint: Endpoint, keys: Keys, shown: &str) -> Result<Self, ProducerError> {
        let connect_error = |source| ProducerError::Connect { url: shown.to_owned(), source };
        let mut conn = endpoint.shared().map_err(connect_error)?;
        match tokio::time::timeout(CONNECT_TIMEOUT, batchd_queue::results::ping(&mut conn)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(connect_error(error)),
            Err(_) => {
                let error =
                    redis::RedisError::from((redis::ErrorKind::Io, "no answer", format!("{CONNECT_TIMEOUT:?}")));
                return Err(connect_error(error.into()));
            }
        }
        Ok(Self { endpoint, conn, keys, limits: JobLimits::default(), cancel_ttl: DEFAULT_CANCEL_TTL })
    }

    /// A producer on a connection the caller already has (the CLI's, whose reachability it checked).
    pub fn with_connection(endpoint: Endpoint, conn: Conn, keys: Keys) -> Self {
        Self { endpoint, conn, keys, limits: JobLimits::default(), cancel_ttl: DEFAULT_CANCEL_TTL }
    }

    /// Validates against these limits instead of the daemon's defaults (set them to the daemon's `jobs.*`).
    pub fn with_limits(mut self, limits: JobLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Keeps cancellation requests this long (set it to the daemon's `retention.ledger_ttl_secs`).
    pub fn with_cancel_ttl(mut self, ttl: Duration) -> Self {
        self.cancel_ttl = ttl.max(Duration::from_secs(1));
        self
    }

    /// The namespace's keys.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Validates `job` as the daemon would and enqueues it with one `XADD`. Returns the job id: the job's `id`,
    /// or the stream entry id when it has none.
    pub async fn enqueue(&self, job: &NewJob) -> Result<JobId, ProducerError> {
        self.enqueue_json(&job.to_json()).await
    }

    /// Like [`Producer::enqueue`], for a job that is already JSON text (sent byte for byte).
    pub async fn enqueue_json(&self, job: &str) -> Result<JobId, ProducerError> {
        let validated = self.validate(job).map_err(ProducerError::Invalid)?;
        let entry_id = inspect::enqueue(&mut self.conn.clone(), &self.keys, job.as_bytes()).await?;
        job_id(validated, &entry_id)
    }

    /// Validates every job, then enqueues them all in pipelines (one round trip per 500 jobs). Nothing is written
    /// when any job is invalid. If Redis fails midway, some jobs may have been written: jobs with an `id` can simply
    /// be enqueued again (the daemon runs an id once); jobs without one would run twice.
    pub async fn enqueue_many(&self, jobs: &[NewJob]) -> Result<Vec<JobId>, ProducerError> {
        let texts: Vec<String> = jobs.iter().map(NewJob::to_json).collect();
        let validated: Vec<Option<JobId>> = texts
            .iter()
            .enumerate()
            .map(|(index, text)| self.validate(text).map_err(|source| ProducerError::InvalidInBatch { index, source }))
            .collect::<Result<_, _>>()?;
        let mut ids = Vec::with_capacity(jobs.len());
        let mut conn = self.conn.clone();
        for (texts, validated) in texts.chunks(PIPELINE_CHUNK).zip(validated.chunks(PIPELINE_CHUNK)) {
            let bodies: Vec<&[u8]> = texts.iter().map(|text| text.as_bytes()).collect();
            let entry_ids = inspect::enqueue_many(&mut conn, &self.keys, &bodies).await?;
            for (validated, entry_id) in validated.iter().zip(entry_ids) {
                ids.push(job_id(validated.clone(), &entry_id)?);
            }
        }
        Ok(ids)
    }

    /// Checks a job with the daemon's decoder; returns its explicit id, if it has one.
    fn validate(&self, text: &str) -> Result<Option<JobId>, batchd_core::DecodeError> {
        let fields = [(JOB_FIELD.to_owned(), text.as_bytes().to_vec())];
        let job = Job::decode(&fields, VALIDATION_ENTRY_ID, &self.limits, &self.keys)?;
        // Only the presence of `id` matters here; everything else is skipped without being built.
        #[derive(serde::Deserialize)]
        struct IdOnly {
            #[serde(default)]
            id: Option<serde::de::IgnoredAny>,
        }
        let has_id = serde_json::from_str::<IdOnly>(text).is_ok_and(|job| job.id.is_some());
        Ok(has_id.then_some(job.id))
    }

    /// What the ledger says about job `id`; `None` when there is no ledger: the id is unknown, the daemon has not
    /// taken the job in yet, or the ledger expired (`retention.ledger_ttl_secs` after the job finished).
    pub async fn status(&self, id: &JobId) -> Result<Option<JobStatus>, ProducerError> {
        let view = LedgerView::read(&mut self.conn.clone(), &self.keys, id).await?;
        Ok(view.as_ref().and_then(JobStatus::from_view))
    }

    /// The result entry of job `id`, once it finished and while both its ledger and the entry are kept.
    /// For reliable delivery of every result use a [`ResultReader`]; this is for looking one up.
    pub async fn result(&self, id: &JobId) -> Result<Option<ResultEntry>, ProducerError> {
        let Some(status) = self.status(id).await? else { return Ok(None) };
        let (Some(stream), Some(entry_id)) = (status.reply_to, status.result_entry) else { return Ok(None) };
        if !self.keys.is_results_stream(&stream) {
            return Err(ProducerError::Reply(format!("job {id}: reply_to {stream:?} is outside the namespace")));
        }
        let entries: inspect::Entries<String> =
            inspect::entries(&mut self.conn.clone(), &stream, &entry_id, &entry_id, 1, false).await?;
        let Some((_, fields)) = entries.into_iter().next() else {
            return Ok(None);
        };
        ResultEntry::from_fields(&fields).map(Some).map_err(|e| ProducerError::Reply(format!("{entry_id}: {e}")))
    }

    /// Requests the cancellation of job `id` with batchd's `cancel` Redis function (one atomic step): it
    /// sets the documented flag `{ns}:cancel:<id>` to `reason` (docs/wire-format.md, "Cancelling a job") and makes
    /// the job's steps due at once, so a replica publishes one `cancelled` result right away, with the responses of
    /// the batches that had finished; a job not taken in yet is never submitted if it arrives while the request
    /// lasts. A job that already ended is left alone, and a repeated cancel changes nothing. It is the Redis
    /// function batchd loads (`FCALL`), not a script of the caller's: the user needs `+fcall` and the commands the
    /// function sends on the job's keys (the operator's rules, deploy/redis/operator.acl).
    pub async fn cancel(&self, id: &JobId, reason: &str) -> Result<CancelOutcome, ProducerError> {
        let state =
            batchd_queue::functions::cancel(&mut self.conn.clone(), &self.keys, id, self.cancel_ttl, reason).await?;
        Ok(match state.parse::<JobState>() {
            Ok(state) if state.is_terminal() => CancelOutcome::AlreadyFinished(state),
            Ok(state) => CancelOutcome::Requested(Some(state)),
            Err(_) => CancelOutcome::Requested(None),
        })
    }

    /// The namespace's queue depths now (Redis's clock): entries waiting and being taken in, chunks in flight and
    /// due, dead letters and results.
    pub async fn depths(&self) -> Result<inspect::Depths, ProducerError> {
        let mut conn = self.conn.clone();
        let now = inspect::redis_now(&mut conn).await?;
        Ok(inspect::depths(&mut conn, &self.keys, now).await?)
    }

    /// Opens a results reader on a connection of its own (its blocking reads would hold up this producer's).
    pub async fn results_reader(&self, options: ReaderOptions) -> Result<ResultReader, ProducerError> {
        ResultReader::open(&self.endpoint, &self.keys, options).await
    }
}

fn job_id(explicit: Option<JobId>, entry_id: &str) -> Result<JobId, ProducerError> {
    match explicit {
        Some(id) => Ok(id),
        None => JobId::parse(entry_id).map_err(|e| ProducerError::Reply(format!("entry id {entry_id:?}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_job_serialises_as_a_v1_job() {
        let job = NewJob::new("@cf/baai/bge-m3", vec![serde_json::json!({"text": "hi"})])
            .with_id("inv-1")
            .with_metadata(serde_json::json!({"tenant": "acme"}));
        assert_eq!(
            job.to_json(),
            r#"{"id":"inv-1","model":"@cf/baai/bge-m3","requests":[{"text":"hi"}],"metadata":{"tenant":"acme"}}"#
        );
        let bare = NewJob::new("@cf/baai/bge-m3", vec![]);
        assert_eq!(bare.to_json(), r#"{"model":"@cf/baai/bge-m3","requests":[]}"#);
        let embeddings = NewJob::new("openai/text-embedding-3-small", vec![serde_json::json!({"input": "hi"})])
            .with_endpoint("/v1/embeddings");
        assert_eq!(
            embeddings.to_json(),
            r#"{"model":"openai/text-embedding-3-small","endpoint":"/v1/embeddings","requests":[{"input":"hi"}]}"#
        );
    }

    #[test]
    fn a_ledger_view_reads_as_a_status() {
        let chunk = |pairs: &[(&'static str, &str)]| batchd_queue::ledger_view::ChunkMetadata {
            fields: pairs.iter().map(|(k, v)| (*k, v.to_string())).collect(),
        };
        let view = LedgerView {
            job_id: JobId::parse("a").unwrap(),
            metadata_bytes: None,
            header: [
                ("state", "running"),
                ("model", "@cf/baai/bge-m3"),
                ("n_items", "5"),
                ("n_chunks", "2"),
                ("accepted_at", "1000"),
            ]
            .iter()
            .map(|(k, v)| (*k, v.to_string()))
            .collect(),
            chunks: vec![
                chunk(&[("state", "done"), ("items", "0:3")]),
                chunk(&[("state", "polling"), ("items", "3:2"), ("remote_status", "queued"), ("n_polls", "4")]),
            ],
        };
        let status = JobStatus::from_view(&view).unwrap();
        assert_eq!(status.state, JobState::Running);
        assert_eq!((status.chunks_done(), status.items_done()), (1, 3));
        assert_eq!(status.chunks[1].remote_status.as_deref(), Some("queued"));
        assert_eq!(status.chunks[1].n_polls, 4);
        assert_eq!(status.accepted_at, Some(1000));
        let empty = LedgerView { header: Default::default(), chunks: Vec::new(), ..view };
        assert!(JobStatus::from_view(&empty).is_none());
    }
}
