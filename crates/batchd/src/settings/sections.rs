//! The sections of the configuration: one struct per `[table]` of `config/default.toml` (which holds their
//! defaults and documents every key), and the small helpers that read them.
//!
//! `[rate_limits]` and its model tables are in `rate_limits.rs`.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Secret;

/// `[events]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EventSettings {
    /// The Cloudflare Queue the event subscription delivers to; empty turns events off.
    pub queue_id: String,
    /// A token for the queue (Queues Edit), from the environment only; the API token when unset.
    #[serde(default)]
    pub api_token: Option<Secret>,
    /// A file holding the queue's token.
    pub api_token_file: String,
    /// Messages asked for per pull (at most 100).
    pub batch_size: u32,
    /// How long a pulled message stays leased to this replica before the queue offers it again.
    pub visibility_timeout_ms: u64,
    /// Longest wait between two pulls while the queue stays empty (the wait starts short and doubles).
    pub max_idle_ms: u64,
}

impl EventSettings {
    /// Whether events are on.
    pub fn enabled(&self) -> bool {
        !self.queue_id.is_empty()
    }
}

/// `[redis]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// Redis URL (`redis://` or `rediss://`).
    pub url: Secret,
    /// Key namespace.
    pub namespace: String,
    /// More namespaces served by the same daemon.
    pub extra_namespaces: Vec<String>,
    /// Longest wait for one reply on the shared connection.
    pub response_timeout_secs: u64,
    /// `standalone`, `cluster` or `sentinel`.
    pub mode: RedisMode,
    /// Cluster seed nodes or sentinel addresses (URLs, which may carry passwords).
    pub nodes: Vec<Secret>,
    /// The master's name for Sentinel.
    pub sentinel_master: String,
    /// CA certificate (PEM) for TLS.
    pub tls_ca_file: String,
    /// Client certificate (PEM) for mutual TLS.
    pub tls_cert_file: String,
    /// Client key (PEM) for mutual TLS.
    pub tls_key_file: String,
    /// Allow TLS URLs that turn certificate checks off (`rediss://...#insecure`); logged as a warning.
    pub tls_insecure: bool,
}

/// The kind of Redis deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// One server.
    Standalone,
    /// Redis Cluster.
    Cluster,
    /// A master behind Redis Sentinel.
    Sentinel,
}

/// `[cloudflare]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CloudflareSettings {
    /// Account id.
    pub account_id: String,
    /// The label of the account's rate-limit buckets; empty: the account id.
    pub account: String,
    /// The API token, from the environment only.
    #[serde(default)]
    pub api_token: Option<Secret>,
    /// A file holding the API token.
    pub api_token_file: String,
    /// Base URL of the API.
    pub base_url: String,
    /// Longest wait for one request.
    pub request_timeout_secs: u64,
    /// Longest wait to connect.
    pub connect_timeout_secs: u64,
    /// Largest reply body read from the API, in bytes.
    pub max_reply_bytes: usize,
    /// How often the model catalog is read again (seconds); 0: never read, the `[rate_limits]` tables alone.
    pub catalog_refresh_secs: u64,
}

/// `[anthropic]`: Anthropic Message Batches, configured when a key is given.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AnthropicConfig {
    /// The API key, from the environment only (`ANTHROPIC_API_KEY`).
    #[serde(default)]
    pub api_key: Option<Secret>,
    /// A file holding the API key.
    pub api_key_file: String,
    /// The label of the account's rate-limit bucket; empty: `anthropic`.
    pub account: String,
    /// Base URL of the API.
    pub base_url: String,
    /// The `anthropic-version` header.
    pub version: String,
    /// The `anthropic-beta` header; empty: not sent.
    pub beta: String,
    /// The `anthropic-workspace-id` header; empty: not sent.
    pub workspace_id: String,
    /// Longest wait for one request (a create of a 256 MB body included).
    pub request_timeout_secs: u64,
    /// Longest wait to connect.
    pub connect_timeout_secs: u64,
    /// Largest results download read, in bytes.
    pub max_reply_bytes: usize,
    /// Largest create body, in bytes.
    pub max_body_bytes: usize,
    /// Most requests per batch.
    pub max_requests: usize,
    /// API requests per minute shared by every replica; 0: not paced by batchd.
    pub requests_per_minute: u32,
    /// Requests that may go back to back before the pacing applies.
    pub burst: u32,
    /// Delete an ended batch once its results are stored.
    pub delete_batches: bool,
    /// Longest pause in a create's upload or a results download (no byte sent or received), in seconds.
    pub idle_timeout_secs: u64,
}

/// `[gemini]`: Gemini Batch Mode, configured when a key is given (`GEMINI_API_KEY` or `api_key_file`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GeminiConfig {
    /// The API key, from the environment only (`GEMINI_API_KEY`, `BATCHD__GEMINI__API_KEY`).
    #[serde(default)]
    pub api_key: Option<Secret>,
    /// A file holding the API key.
    pub api_key_file: String,
    /// The label of the account's rate-limit bucket; empty: `gemini`.
    pub account: String,
    /// Base URL of the API (without `/v1beta`).
    pub base_url: String,
    /// Longest wait for one request (an upload of a whole input file included).
    pub request_timeout_secs: u64,
    /// Longest wait to connect.
    pub connect_timeout_secs: u64,
    /// Largest inline create body, in bytes; larger chunks go through the Files API.
    pub max_inline_bytes: usize,
    /// Largest input file, in bytes, lowered to a quarter of `workers.inflight_bytes`.
    pub max_file_bytes: usize,
    /// Most requests per batch.
    pub max_requests: usize,
    /// Largest finished batch (inline responses) or responses file read, in bytes.
    pub max_result_bytes: usize,
    /// Batch creates per minute shared by every replica; 0: not paced by batchd.
    pub batches_per_minute: u32,
    /// Creates that may go back to back before the pacing applies.
    pub burst: u32,
    /// Pages of 100 batches read to find the batch an uncertain create made.
    pub lookup_pages: u32,
    /// Delete an ended batch and its files once its results are stored.
    pub delete_batches: bool,
}

/// `[openai]`: the OpenAI Batch provider, configured when a key is given (`OPENAI_API_KEY` or `api_key_file`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiSettings {
    /// The API key, from the environment only (`OPENAI_API_KEY`, `BATCHD__OPENAI__API_KEY`).
    #[serde(default)]
    pub api_key: Option<Secret>,
    /// A file holding the API key.
    pub api_key_file: String,
    /// The label of the account's rate-limit buckets; empty: `openai`.
    pub account: String,
    /// Base URL of the API, `.../v1`.
    pub base_url: String,
    /// Sent as `OpenAI-Organization` when not empty.
    pub organization: String,
    /// Sent as `OpenAI-Project` when not empty.
    pub project: String,
    /// Longest wait for one request (an upload of a whole input file included).
    pub request_timeout_secs: u64,
    /// Longest wait to connect.
    pub connect_timeout_secs: u64,
    /// Most requests in one batch (the API's limit: 50,000).
    pub max_requests: usize,
    /// Largest input file, in bytes (the API's limit: 200 MB), lowered to a quarter of `workers.inflight_bytes`.
    pub max_file_bytes: usize,
    /// Largest output plus error file read for one batch, in bytes.
    pub max_result_bytes: usize,
    /// Delete the input, output and error files once a batch's results are stored.
    pub delete_files: bool,
    /// Batches created per hour and model, shared by every replica (0: not limited).
    pub batches_per_hour: u32,
    /// Creates allowed back to back.
    pub burst: u32,
    /// Own limits for some models.
    pub models: Vec<OpenAiModelLimit>,
    /// Pages of 100 batches looked through when an interrupted submit is resumed.
    pub lookup_pages: usize,
    /// After how many seconds OpenAI deletes uploaded and result files by itself (0: its 30-day default).
    pub file_expiry_secs: u64,
    /// Longest pause in an upload or a results download (no byte sent or received), in seconds.
    pub idle_timeout_secs: u64,
    /// The endpoints a job may name.
    pub endpoints: Vec<String>,
    /// Enqueued-token limits of some models (none: not paced).
    pub enqueued_token_limits: Vec<OpenAiTokenLimit>,
    /// The header the key is sent in: `authorization` (`Bearer <key>`) or `api-key` (Azure OpenAI).
    pub key_header: String,
    /// The batch's `completion_window` (`24h` at OpenAI; Groq takes up to `7d`); empty: not sent.
    pub completion_window: String,
    /// The `purpose` of an uploaded input file (`batch`).
    pub file_purpose: String,
}

/// `[providers.<name>]`: a named instance of a provider kind, its models `<name>/<model>`. Its other keys are its
/// kind's section's (`[openai]`, `[anthropic]`, `[gemini]`), with that section's built-in defaults
/// (`config/default.toml`), not the values `[openai]` is given; they are checked when the instance is built.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct InstanceSection {
    /// Its kind: `openai`, `anthropic` or `gemini`.
    pub kind: String,
    /// Its API key, from the environment only (`BATCHD__PROVIDERS__<NAME>__API_KEY`); or `api_key_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<Secret>,
    /// The kind's settings given for this instance.
    #[serde(flatten)]
    pub settings: toml::Table,
}

/// One `openai.enqueued_token_limits` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiTokenLimit {
    /// The model as OpenAI names it (without `openai/`).
    pub model: String,
    /// The organization's enqueued-token limit for it (OpenAI's Limits page).
    pub tokens: u64,
}

/// One `[[openai.models]]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiModelLimit {
    /// The model as OpenAI names it (without `openai/`).
    pub model: String,
    /// Batches created per hour (0: not limited).
    pub batches_per_hour: u32,
}

/// `[workers]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// Ingress entries handled at once.
    pub submit_concurrency: usize,
    /// Scheduled steps handled at once.
    pub poll_concurrency: usize,
    /// Most API calls (submits, polls, result downloads) in flight to one provider at once; 0: no cap.
    pub calls_per_provider: usize,
    /// Threads of the async runtime; 0 means one per CPU the process may use.
    pub runtime_threads: usize,
    /// Bytes of work in flight one process may hold (entries being read and taken in, submit bodies, poll
    /// replies), shared by every namespace; what the memory limit is sized by (docs/operations.md).
    pub inflight_bytes: usize,
    /// How long a cancelled job waits for its batches to end at a provider that can cancel them, from when the
    /// daemon first acted on the cancel; then it ends `cancelled` with what finished.
    pub cancel_wait_secs: u64,
}

/// `[ingress]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IngressConfig {
    /// Most entries read at once.
    pub batch: usize,
    /// Blocking read duration.
    pub block_ms: u64,
    /// Idle time after which another replica's entry is taken over.
    pub reclaim_idle_secs: u64,
    /// How often to look for abandoned entries.
    pub reclaim_interval_secs: u64,
    /// An entry delivered more than this many times is moved to the dead-letter stream instead of taken in again.
    pub max_deliveries: u64,
}

/// `[schedule]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// Most steps claimed at once.
    pub batch: usize,
    /// Lease of a claimed step.
    pub lease_secs: u64,
    /// Longest idle sleep.
    pub idle_poll_ms: u64,
}

/// `[jobs]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobSettings {
    /// Deadline of a job that sets none, in seconds from acceptance; 0: per provider, its window plus
    /// `deadline_settle_secs` plus an hour (OpenAI and Anthropic: 24 h + 10 min + 1 h), 24 h where the provider
    /// documents no window (Workers AI).
    pub default_deadline_secs: u64,
    /// How long after a job's deadline its batches still running are waited for, once asked to cancel at a
    /// provider that can (OpenAI, Anthropic); then the job ends `expired` with what had finished.
    pub deadline_settle_secs: u64,
    /// Largest accepted `job` field.
    pub max_entry_bytes: usize,
    /// Largest accepted number of items.
    pub max_items: usize,
    /// Largest submit body of one batch, in bytes.
    pub max_payload_bytes: usize,
    /// Most items per batch (0: no cap).
    pub max_batch_items: usize,
    /// Default for a job's `retry_failed_items`.
    pub retry_failed_items: bool,
    /// Send once more the items a provider expired (its window closed before they ran), while the job's deadline
    /// is at least 5 minutes away.
    pub resend_expired_items: bool,
}

/// `[retention]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    /// Approximate maximum length of a results stream.
    pub results_maxlen: u64,
    /// Approximate maximum length of the dead-letter stream.
    pub dead_maxlen: u64,
    /// Most bytes of an entry's fields copied into its dead-letter entry.
    pub dead_entry_bytes: usize,
    /// Lifetime of a finished job's ledger.
    pub ledger_ttl_secs: u64,
}

/// `[shutdown]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSettings {
    /// Time given to work in flight after a stop signal.
    pub grace_secs: u64,
}

/// `[log]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// `text` or `json`.
    pub format: LogFormat,
    /// Default level filter.
    pub level: String,
}

/// `[admin]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSettings {
    /// Address of the admin HTTP server (`/livez`, `/readyz`, `/metrics`); empty turns it off.
    pub listen: String,
    /// How often queue depths and Redis reachability are sampled, in milliseconds.
    pub sample_interval_ms: u64,
    /// A fetch loop silent this long is stuck: `/livez` answers 503 and the systemd watchdog pings stop.
    pub stall_secs: u64,
    /// Host names `/metrics` answers to besides `localhost` and IP addresses (e.g. a Service's DNS name that
    /// Prometheus scrapes by); any other `Host` is answered 421, so a DNS-rebinding page reads nothing.
    pub allowed_hosts: Vec<String>,
}

impl AdminSettings {
    /// The address to listen on, or `None` when the server is off (validated at load).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        if self.listen.is_empty() { None } else { self.listen.parse().ok() }
    }

    /// The host names the admin port answers to (validated at load): `localhost`, IP addresses (the bound one
    /// among them) and [`AdminSettings::allowed_hosts`].
    pub fn hosts(&self) -> crate::admin::HostList {
        crate::admin::HostList::new(self.allowed_hosts.iter().map(String::as_str)).unwrap_or_default()
    }

    /// How long a fetch loop may stay silent before the process counts as stuck.
    pub fn stall(&self) -> Duration {
        Duration::from_secs(self.stall_secs)
    }

    /// The sampling interval.
    pub fn sample_interval(&self) -> Duration {
        Duration::from_millis(self.sample_interval_ms)
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
    /// Straight to journald (its native protocol): each event with its priority (error 3, warn 4, info 5,
    /// debug 6) and its fields as journal fields (`JOB_ID`, `REQUEST_ID`, ...).
    Journald,
}
