//! Layered configuration: built-in defaults (`config/default.toml`, compiled in), an optional file, then
//! `BATCHD__SECTION__KEY` environment variables, then the conventional `CLOUDFLARE_ACCOUNT_ID`,
//! `CLOUDFLARE_API_TOKEN` and `REDIS_URL`.
//!
//! Unknown keys are errors, so a typo cannot silently leave a default in place. The API token never comes from
//! a config file, and its type never prints it.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The one URL mask (also shown by `cli::connect`).
pub use batchd_core::redact_url;

/// The built-in defaults; the same file documents every key.
pub const DEFAULTS: &str = include_str!("../../../config/default.toml");

/// Exit code for configuration errors (EX_CONFIG), listed in the systemd unit's `RestartPreventExitStatus`.
pub const EXIT_CONFIG: i32 = 78;

/// Name of the systemd credential holding the API token (`LoadCredential=cloudflare-api-token:<file>`), read
/// from `$CREDENTIALS_DIRECTORY` when neither the environment nor `cloudflare.api_token_file` gives the token.
pub const TOKEN_CREDENTIAL: &str = "cloudflare-api-token";

/// A configuration problem, with the key it concerns in the message.
#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);

/// All settings of the daemon and the CLI.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Redis connection and namespace.
    pub redis: RedisSettings,
    /// The Batch API.
    pub cloudflare: CloudflareSettings,
    /// Worker concurrency.
    pub workers: WorkerSettings,
    /// Reading the submit stream.
    pub ingress: IngressConfig,
    /// Claiming scheduled steps.
    pub schedule: ScheduleConfig,
    /// Poll timing.
    pub poll: PollSettings,
    /// Retries of transient errors.
    pub retry: RetrySettings,
    /// Job limits and defaults.
    pub jobs: JobSettings,
    /// Shared submit rate limits.
    pub rate_limits: RateLimitSettings,
    /// Retention of results and ledgers.
    pub retention: RetentionSettings,
    /// Graceful shutdown.
    pub shutdown: ShutdownSettings,
    /// Logging.
    pub log: LogSettings,
    /// The admin HTTP server (health and metrics).
    pub admin: AdminSettings,
    /// Workers AI batch events from a Cloudflare Queue (off unless `queue_id` is set).
    pub events: EventSettings,
}

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
}

/// `[workers]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// Ingress entries handled at once.
    pub submit_concurrency: usize,
    /// Scheduled steps handled at once.
    pub poll_concurrency: usize,
    /// Threads of the async runtime; 0 means one per CPU the process may use.
    pub runtime_threads: usize,
    /// Bytes of work in flight one process may hold (entries being read and taken in, submit bodies, poll
    /// replies), shared by every namespace; what the memory limit is sized by (docs/operations.md).
    pub inflight_bytes: usize,
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

/// `[poll]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PollSettings {
    /// First delay between submit and poll.
    pub initial_interval_ms: u64,
    /// Growth factor of the delay.
    pub multiplier: f64,
    /// Upper bound for the delay.
    pub max_interval_ms: u64,
    /// The delay between polls when batch events are on: polls are then only the fallback for a lost event.
    pub max_interval_ms_with_events: u64,
    /// Random spread, as a fraction of the delay.
    pub jitter: f64,
}

/// `[retry]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    /// Attempts per step before the job fails.
    pub max_attempts: u64,
    /// First backoff.
    pub initial_backoff_ms: u64,
    /// Largest backoff.
    pub max_backoff_ms: u64,
}

/// `[jobs]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobSettings {
    /// Default deadline of a job.
    pub default_deadline_secs: u64,
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
}

/// `[rate_limits]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    /// Requests per window for text generation models.
    pub text_generation: u32,
    /// Requests per window for embedding models.
    pub embeddings: u32,
    /// Requests per window for translation models.
    pub translation: u32,
    /// Requests per window for speech recognition models.
    pub speech_recognition: u32,
    /// Window length in seconds.
    pub window_secs: u64,
    /// Requests allowed back to back.
    pub burst: u32,
    /// Whether polls are limited too.
    pub limit_polls: bool,
    /// Per-model limits.
    pub models: Vec<ModelLimit>,
    /// The task type of each known model, which picks its limit.
    pub task_types: Vec<ModelTask>,
    /// More model task types, for operators (an entry here wins over `task_types`).
    pub extra_task_types: Vec<ModelTask>,
    /// The task type of a model listed in neither table.
    pub unknown_model_task: TaskType,
}

impl RateLimitSettings {
    /// The task type of `model`: from `extra_task_types`, then `task_types`, else `unknown_model_task`.
    pub fn task_of(&self, model: &str) -> TaskType {
        self.extra_task_types
            .iter()
            .chain(&self.task_types)
            .find(|entry| entry.model == model)
            .map_or(self.unknown_model_task, |entry| entry.task)
    }

    /// Requests per window for a task type (0: not limited).
    pub fn limit_of(&self, task: TaskType) -> u32 {
        match task {
            TaskType::TextGeneration => self.text_generation,
            TaskType::Embeddings => self.embeddings,
            TaskType::Translation => self.translation,
            TaskType::SpeechRecognition => self.speech_recognition,
        }
    }
}

/// A model's task type, as the API's rate limits are set per account and task type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskType {
    /// Text generation (LLMs), `rate_limits.text_generation`.
    TextGeneration,
    /// Text embeddings, `rate_limits.embeddings`.
    Embeddings,
    /// Translation, `rate_limits.translation`.
    Translation,
    /// Speech recognition, `rate_limits.speech_recognition`.
    SpeechRecognition,
}

impl TaskType {
    /// The name used in configuration and in rate-limit bucket keys.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TextGeneration => "text_generation",
            Self::Embeddings => "embeddings",
            Self::Translation => "translation",
            Self::SpeechRecognition => "speech_recognition",
        }
    }
}

/// One entry of the model-to-task table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelTask {
    /// The model name, e.g. `@cf/baai/bge-m3`.
    pub model: String,
    /// Its task type.
    pub task: TaskType,
}

/// One per-model limit.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelLimit {
    /// The model name.
    pub model: String,
    /// Requests per window.
    pub limit: u32,
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
}

impl AdminSettings {
    /// The address to listen on, or `None` when the server is off (validated at load).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        if self.listen.is_empty() { None } else { self.listen.parse().ok() }
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

/// A string that never appears in `Debug` output (tokens, URLs that may carry passwords).
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret text; call only where it is used.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Serialize for Secret {
    /// Secrets serialise as `[redacted]` (for `batchd config check`), never as their value.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("[redacted]")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl Settings {
    /// Loads the layers, reading the process environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, &std::env::vars().collect())
    }

    /// Loads the layers with `env` standing for the process environment (for tests).
    pub fn load_from(file: Option<&Path>, env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let mut builder =
            config::Config::builder().add_source(config::File::from_str(DEFAULTS, config::FileFormat::Toml));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError(format!("config file {} does not exist", file.display())));
            }
            refuse_token_in_file(file)?;
            builder = builder.add_source(config::File::from(PathBuf::from(file)).format(config::FileFormat::Toml));
        }
        let batchd_env: HashMap<String, String> =
            env.iter().filter(|(name, _)| name.starts_with("BATCHD__")).map(|(k, v)| (k.clone(), v.clone())).collect();
        builder = builder.add_source(
            config::Environment::with_prefix("BATCHD")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .source(Some(batchd_env.clone())),
        );
        for (conventional, key, own) in [
            ("CLOUDFLARE_ACCOUNT_ID", "cloudflare.account_id", "BATCHD__CLOUDFLARE__ACCOUNT_ID"),
            ("CLOUDFLARE_API_TOKEN", "cloudflare.api_token", "BATCHD__CLOUDFLARE__API_TOKEN"),
            ("REDIS_URL", "redis.url", "BATCHD__REDIS__URL"),
        ] {
            if let (Some(value), false) = (env.get(conventional), batchd_env.contains_key(own)) {
                builder = builder
                    .set_override(key, value.clone())
                    .map_err(|e| ConfigError(format!("{conventional}: {e}")))?;
            }
        }
        let mut settings: Settings =
            builder.build().and_then(|config| config.try_deserialize()).map_err(|e| ConfigError(e.to_string()))?;
        settings.use_systemd_credential(env);
        settings.check()?;
        Ok(settings)
    }

    /// Points `cloudflare.api_token_file` at the systemd credential `cloudflare-api-token` when the token is
    /// given no other way and systemd passed credentials (`LoadCredential=` sets `$CREDENTIALS_DIRECTORY`).
    fn use_systemd_credential(&mut self, env: &HashMap<String, String>) {
        let token_given = self.cloudflare.api_token.as_ref().is_some_and(|token| !token.expose().is_empty());
        if token_given || !self.cloudflare.api_token_file.is_empty() {
            return;
        }
        if let Some(dir) = env.get("CREDENTIALS_DIRECTORY").filter(|dir| !dir.is_empty()) {
            let file = Path::new(dir).join(TOKEN_CREDENTIAL);
            if file.exists() {
                self.cloudflare.api_token_file = file.display().to_string();
            }
        }
    }

    /// Checks relations between values that the types cannot express.
    fn check(&self) -> Result<(), ConfigError> {
        let fail = |key: &str, why: &str| Err(ConfigError(format!("{key}: {why}")));
        batchd_core::Keys::new(&self.redis.namespace).map_err(|e| ConfigError(format!("redis.namespace: {e}")))?;
        for extra in &self.redis.extra_namespaces {
            batchd_core::Keys::new(extra).map_err(|e| ConfigError(format!("redis.extra_namespaces: {e}")))?;
            if *extra == self.redis.namespace || self.redis.extra_namespaces.iter().filter(|n| *n == extra).count() > 1
            {
                return Err(ConfigError(format!("redis.extra_namespaces: {extra:?} is listed twice")));
            }
        }
        if self.workers.submit_concurrency == 0 {
            return fail("workers.submit_concurrency", "must be at least 1");
        }
        if self.workers.poll_concurrency == 0 {
            return fail("workers.poll_concurrency", "must be at least 1");
        }
        if self.workers.inflight_bytes < 1024 * 1024 {
            return fail("workers.inflight_bytes", "must be at least 1048576 (1 MiB)");
        }
        if self.workers.inflight_bytes < self.jobs.max_entry_bytes {
            return fail(
                "workers.inflight_bytes",
                "must be at least jobs.max_entry_bytes (an idle replica holds room for one entry of that size)",
            );
        }
        if self.workers.runtime_threads > 1024 {
            return fail("workers.runtime_threads", "must be at most 1024 (0 means one per CPU)");
        }
        if self.ingress.batch == 0 || self.schedule.batch == 0 {
            return fail("ingress.batch / schedule.batch", "must be at least 1");
        }
        if self.schedule.lease_secs <= self.cloudflare.request_timeout_secs {
            return fail("schedule.lease_secs", "must exceed cloudflare.request_timeout_secs");
        }
        if self.poll.multiplier.is_nan() || self.poll.multiplier < 1.0 {
            return fail("poll.multiplier", "must be at least 1.0");
        }
        if !(0.0..1.0).contains(&self.poll.jitter) {
            return fail("poll.jitter", "must be in [0, 1)");
        }
        if self.poll.initial_interval_ms == 0 || self.poll.max_interval_ms < self.poll.initial_interval_ms {
            return fail("poll.max_interval_ms", "must be at least poll.initial_interval_ms, which must be positive");
        }
        if self.retry.max_attempts == 0 {
            return fail("retry.max_attempts", "must be at least 1");
        }
        if self.jobs.default_deadline_secs == 0 {
            return fail("jobs.default_deadline_secs", "must be at least 1");
        }
        if self.jobs.max_payload_bytes < 1024 {
            return fail("jobs.max_payload_bytes", "must be at least 1024");
        }
        if self.rate_limits.window_secs == 0 {
            return fail("rate_limits.window_secs", "must be at least 1");
        }
        if self.rate_limits.burst == 0 {
            return fail("rate_limits.burst", "must be at least 1");
        }
        if let Some(bad) =
            self.rate_limits.models.iter().find(|limit| batchd_core::ModelName::parse(&limit.model).is_err())
        {
            return Err(ConfigError(format!("rate_limits.models: {:?} is not a model name", bad.model)));
        }
        if self.retention.results_maxlen == 0 {
            return fail("retention.results_maxlen", "must be at least 1");
        }
        if self.ingress.max_deliveries == 0 {
            return fail("ingress.max_deliveries", "must be at least 1");
        }
        if self.retention.dead_entry_bytes > 64 * 1024 * 1024 {
            return fail("retention.dead_entry_bytes", "must be at most 67108864 (64 MiB)");
        }
        if !self.admin.listen.is_empty() && self.admin.listen.parse::<SocketAddr>().is_err() {
            return fail("admin.listen", "must be IP:port (e.g. 127.0.0.1:9090 or 0.0.0.0:9090), or empty");
        }
        if self.admin.sample_interval_ms < 10 {
            return fail("admin.sample_interval_ms", "must be at least 10");
        }
        if self.admin.stall_secs == 0 {
            return fail("admin.stall_secs", "must be at least 1");
        }
        if self.cloudflare.max_reply_bytes < 64 * 1024 {
            return fail("cloudflare.max_reply_bytes", "must be at least 65536");
        }
        check_base_url(&self.cloudflare.base_url)?;
        if self.events.enabled() {
            if !(1..=batchd_cloudflare::MAX_PULL_BATCH).contains(&self.events.batch_size) {
                return fail("events.batch_size", "must be 1-100 (the Queues limit)");
            }
            if !(1000..=43_200_000).contains(&self.events.visibility_timeout_ms) {
                return fail("events.visibility_timeout_ms", "must be 1000-43200000 (1 s to 12 h, the Queues limits)");
            }
            if self.events.max_idle_ms == 0 {
                return fail("events.max_idle_ms", "must be at least 1");
            }
            if self.poll.max_interval_ms_with_events < self.poll.initial_interval_ms {
                return fail("poll.max_interval_ms_with_events", "must be at least poll.initial_interval_ms");
            }
        }
        let insecure = |url: &str| url.trim_end().ends_with("#insecure");
        if !self.redis.tls_insecure
            && (insecure(self.redis.url.expose()) || self.redis.nodes.iter().any(|node| insecure(node.expose())))
        {
            return fail(
                "redis.url / redis.nodes",
                "a TLS URL ending in #insecure turns certificate checks off; set redis.tls_insecure = true to allow \
                 it (not for production), or give the CA with redis.tls_ca_file",
            );
        }
        Ok(())
    }

    /// What is allowed but unsafe, for the daemon to log at start as warnings: certificate checks turned off, a
    /// token file other users can read.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.shutdown.grace_secs <= self.cloudflare.request_timeout_secs {
            warnings.push(format!(
                "shutdown.grace_secs ({}) is not longer than cloudflare.request_timeout_secs ({}): a submit in flight \
                 at shutdown may be cut, then resubmitted and counted as a possible duplicate",
                self.shutdown.grace_secs, self.cloudflare.request_timeout_secs
            ));
        }
        if self.redis.tls_insecure {
            warnings.push(
                "redis.tls_insecure is set: TLS connections to Redis may skip certificate checks (#insecure URLs)"
                    .to_owned(),
            );
        }
        // Group read is allowed: Kubernetes mounts Secrets 0440 for the pod's fsGroup.
        if let Some(mode) = file_mode(&self.cloudflare.api_token_file).filter(|mode| mode & 0o027 != 0) {
            warnings.push(format!(
                "cloudflare.api_token_file {} is writable by its group or readable by others (mode {:o}); chmod 600 it",
                self.cloudflare.api_token_file,
                mode & 0o777
            ));
        }
        warnings
    }

    /// The effective settings as TOML, secrets shown as `[redacted]` (and the Redis URL without its password).
    pub fn to_redacted_toml(&self) -> String {
        let mut value = toml::Value::try_from(self).expect("settings serialise");
        if let Some(redis) = value.get_mut("redis") {
            if let Some(url) = redis.get_mut("url") {
                *url = toml::Value::String(redact_url(self.redis.url.expose()));
            }
            if let Some(nodes) = redis.get_mut("nodes") {
                *nodes = toml::Value::Array(
                    self.redis.nodes.iter().map(|node| toml::Value::String(redact_url(node.expose()))).collect(),
                );
            }
        }
        toml::to_string_pretty(&value).expect("settings render as TOML")
    }

    /// Everything `run` checks before it starts work, short of connecting, and the one function both `batchd run`
    /// and `batchd config check` call: the tokens can be read, the API clients can be built from these settings
    /// (account id, base URL, token, queue id), the Redis deployment (TLS files included) is usable, the log filter
    /// (`log.level`, or `RUST_LOG` when set) parses.
    pub fn check_for_run(&self) -> Result<(), ConfigError> {
        let token = self.api_token()?;
        batchd_cloudflare::BatchClient::new(self.client_settings(&token))
            .map_err(|e| ConfigError(format!("cloudflare: {e}")))?;
        if self.events.enabled() {
            let token = self.events_token()?.unwrap_or(token);
            batchd_cloudflare::QueueClient::new(self.client_settings(&token), &self.events.queue_id)
                .map_err(|e| ConfigError(format!("events: {e}")))?;
        }
        self.redis_endpoint()?;
        crate::logging::check(&self.log, std::env::var("RUST_LOG").ok().as_deref()).map_err(ConfigError)?;
        Ok(())
    }

    /// How to reach the Cloudflare API with `token`.
    pub fn client_settings(&self, token: &Secret) -> batchd_cloudflare::ClientSettings {
        let mut settings = batchd_cloudflare::ClientSettings::new(
            self.cloudflare.account_id.clone(),
            batchd_cloudflare::ApiToken::new(token.expose().to_owned()),
        );
        settings.base_url = self.cloudflare.base_url.clone();
        settings.request_timeout = Duration::from_secs(self.cloudflare.request_timeout_secs);
        settings.connect_timeout = Duration::from_secs(self.cloudflare.connect_timeout_secs);
        settings.max_reply_bytes = self.cloudflare.max_reply_bytes;
        settings
    }

    /// The API token from the environment or `api_token_file`. Only the daemon needs it.
    pub fn api_token(&self) -> Result<Secret, ConfigError> {
        if let Some(token) = self.cloudflare.api_token.as_ref().filter(|token| !token.expose().is_empty()) {
            return Ok(token.clone());
        }
        let file = &self.cloudflare.api_token_file;
        if file.is_empty() {
            return Err(ConfigError(
                "cloudflare.api_token: not set; set CLOUDFLARE_API_TOKEN or cloudflare.api_token_file".into(),
            ));
        }
        let text = std::fs::read_to_string(file)
            .map_err(|e| ConfigError(format!("cloudflare.api_token_file: cannot read {file}: {e}")))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(ConfigError(format!("cloudflare.api_token_file: {file} is empty")));
        }
        Ok(Secret::new(token))
    }

    /// The queue's own token for `[events]` (from the environment or `events.api_token_file`); `None` when the
    /// Workers AI API token is to be used.
    pub fn events_token(&self) -> Result<Option<Secret>, ConfigError> {
        if let Some(token) = self.events.api_token.as_ref().filter(|token| !token.expose().is_empty()) {
            return Ok(Some(token.clone()));
        }
        let file = &self.events.api_token_file;
        if file.is_empty() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(file)
            .map_err(|e| ConfigError(format!("events.api_token_file: cannot read {file}: {e}")))?;
        match text.trim() {
            "" => Err(ConfigError(format!("events.api_token_file: {file} is empty"))),
            token => Ok(Some(Secret::new(token))),
        }
    }

    /// The key builder of the configured namespace (validated at load).
    pub fn keys(&self) -> batchd_core::Keys {
        batchd_core::Keys::new(&self.redis.namespace).expect("namespace checked at load")
    }

    /// Keys of every namespace the daemon serves: `redis.namespace` first, then `redis.extra_namespaces`.
    pub fn all_keys(&self) -> Vec<batchd_core::Keys> {
        std::iter::once(&self.redis.namespace)
            .chain(&self.redis.extra_namespaces)
            .map(|namespace| batchd_core::Keys::new(namespace).expect("namespaces checked at load"))
            .collect()
    }

    /// Job limits.
    pub fn job_limits(&self) -> batchd_core::JobLimits {
        batchd_core::JobLimits { max_entry_bytes: self.jobs.max_entry_bytes, max_items: self.jobs.max_items }
    }

    /// Storage settings.
    pub fn store_settings(&self) -> batchd_queue::StoreSettings {
        batchd_queue::StoreSettings {
            results_maxlen: self.retention.results_maxlen,
            dead_maxlen: self.retention.dead_maxlen,
            ledger_ttl: Duration::from_secs(self.retention.ledger_ttl_secs),
            lease: Duration::from_secs(self.schedule.lease_secs),
        }
    }

    /// The configured Redis deployment, ready to connect (no connection is opened yet).
    pub fn redis_endpoint(&self) -> Result<batchd_queue::Endpoint, ConfigError> {
        let path = |value: &str| (!value.is_empty()).then(|| PathBuf::from(value));
        let tls_client = match (path(&self.redis.tls_cert_file), path(&self.redis.tls_key_file)) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(ConfigError("redis.tls_cert_file and redis.tls_key_file go together".into())),
        };
        let settings = batchd_queue::RedisSettings {
            url: self.redis.url.expose().to_owned(),
            topology: match self.redis.mode {
                RedisMode::Standalone => batchd_queue::Topology::Standalone,
                RedisMode::Cluster => batchd_queue::Topology::Cluster,
                RedisMode::Sentinel => batchd_queue::Topology::Sentinel,
            },
            nodes: self.redis.nodes.iter().map(|node| node.expose().to_owned()).collect(),
            sentinel_master: self.redis.sentinel_master.clone(),
            tls_ca_file: path(&self.redis.tls_ca_file),
            tls_client,
            response_timeout: Duration::from_secs(self.redis.response_timeout_secs),
        };
        batchd_queue::Endpoint::new(&settings).map_err(|e| ConfigError(format!("redis: {e}")))
    }
}

/// Refuses a config file that sets `cloudflare.api_token`: a config file is often world-readable and checked in;
/// the token comes from the environment, `cloudflare.api_token_file` or a systemd credential.
fn refuse_token_in_file(file: &Path) -> Result<(), ConfigError> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Ok(()); // the config layer reports an unreadable file with its own message
    };
    let Ok(value) = text.parse::<toml::Table>() else {
        return Ok(()); // likewise for a file that is not TOML
    };
    let holds_token = |section: &str| value.get(section).and_then(|section| section.get("api_token")).is_some();
    if holds_token("events") {
        return Err(ConfigError(format!(
            "events.api_token: not allowed in a config file ({}); give it through BATCHD__EVENTS__API_TOKEN or \
             events.api_token_file",
            file.display()
        )));
    }
    if holds_token("cloudflare") {
        return Err(ConfigError(format!(
            "cloudflare.api_token: not allowed in a config file ({}); give the token through CLOUDFLARE_API_TOKEN, \
             cloudflare.api_token_file or the systemd credential `{TOKEN_CREDENTIAL}`",
            file.display()
        )));
    }
    Ok(())
}

/// Refuses a plain-HTTP API base URL that is not on this machine: the token would cross the network in clear.
fn check_base_url(base_url: &str) -> Result<(), ConfigError> {
    let Some(rest) = base_url.trim().strip_prefix("http://") else {
        return Ok(()); // https, or a URL the client itself refuses with a clearer message
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    let loopback =
        host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(ConfigError(format!(
            "cloudflare.base_url: {base_url:?} is plain http to another host, which would send the API token in \
             clear; use https (http is allowed only for loopback, e.g. the emulator on 127.0.0.1)"
        )))
    }
}

/// Permission bits of a file, when it exists (Unix).
fn file_mode(path: &str) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    (!path.is_empty()).then(|| std::fs::metadata(path).ok()).flatten().map(|meta| meta.permissions().mode())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn plain_http_is_refused_unless_the_api_is_on_this_machine() {
        let load = |url: &str| Settings::load_from(None, &env(&[("BATCHD__CLOUDFLARE__BASE_URL", url)]));
        for allowed in [
            "https://api.cloudflare.com/client/v4",
            "http://127.0.0.1:8787/client/v4",
            "http://127.9.0.1:1",
            "http://localhost:8787",
            "http://[::1]:8787/x",
        ] {
            assert!(load(allowed).is_ok(), "{allowed}");
        }
        for refused in ["http://api.cloudflare.com/client/v4", "http://10.0.0.5:8787", "http://[2001:db8::1]:80"] {
            let error = load(refused).expect_err(refused).to_string();
            assert!(error.contains("cloudflare.base_url") && error.contains("in clear"), "{error}");
        }
    }

    #[test]
    fn a_config_file_may_not_hold_the_api_token() {
        let dir = std::env::temp_dir().join(format!("batchd-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("batchd.toml");
        std::fs::write(&file, "[cloudflare]\naccount_id = \"a\"\napi_token = \"tok-in-file\"\n").unwrap();
        let error = Settings::load_from(Some(&file), &env(&[])).expect_err("refused").to_string();
        assert!(error.contains("cloudflare.api_token: not allowed in a config file"), "{error}");
        assert!(!error.contains("tok-in-file"));
        std::fs::write(&file, "[cloudflare]\naccount_id = \"a\"\n").unwrap();
        let settings = Settings::load_from(Some(&file), &env(&[("CLOUDFLARE_API_TOKEN", "tok-env")])).unwrap();
        assert_eq!(settings.api_token().unwrap().expose(), "tok-env", "the environment still gives it");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_token_file_others_can_read_is_warned_about() {
        use std::os::unix::fs::PermissionsExt;
        let file = std::env::temp_dir().join(format!("batchd-token-mode-{}", std::process::id()));
        std::fs::write(&file, "tok\n").unwrap();
        let path = file.display().to_string();
        let settings = Settings::load_from(None, &env(&[("BATCHD__CLOUDFLARE__API_TOKEN_FILE", &path)])).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let warnings = settings.warnings();
        assert!(warnings.iter().any(|w| w.contains("readable by others (mode 644)")), "{warnings:?}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o440)).unwrap();
        assert!(settings.warnings().is_empty(), "group read is how Kubernetes mounts Secrets");
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn insecure_tls_urls_need_an_explicit_setting() {
        let url = "rediss://10.0.0.1:6380/#insecure";
        let error = Settings::load_from(None, &env(&[("REDIS_URL", url)])).expect_err("refused").to_string();
        assert!(error.contains("redis.tls_insecure"), "{error}");
        let settings =
            Settings::load_from(None, &env(&[("REDIS_URL", url), ("BATCHD__REDIS__TLS_INSECURE", "true")])).unwrap();
        assert!(settings.warnings().iter().any(|w| w.contains("certificate checks")));
    }

    #[test]
    fn node_passwords_are_redacted_when_settings_are_printed() {
        let mut settings = Settings::load_from(None, &env(&[])).unwrap();
        settings.redis.nodes = vec![Secret::new("redis://:s3cret@10.0.0.2:26379"), Secret::new("redis://10.0.0.3:1")];
        let text = settings.to_redacted_toml();
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("redis://:[redacted]@10.0.0.2:26379") && text.contains("redis://10.0.0.3:1"), "{text}");
        assert!(!format!("{settings:?}").contains("s3cret"));
    }

    #[test]
    fn the_effective_settings_print_without_secrets() {
        let settings = Settings::load_from(
            None,
            &env(&[("REDIS_URL", "redis://app:hunter2@10.0.0.1:6379/0"), ("CLOUDFLARE_API_TOKEN", "tok-secret")]),
        )
        .unwrap();
        let text = settings.to_redacted_toml();
        assert!(text.contains("url = \"redis://app:[redacted]@10.0.0.1:6379/0\""), "{text}");
        assert!(text.contains("api_token = \"[redacted]\""), "{text}");
        assert!(!text.contains("hunter2") && !text.contains("tok-secret"));
        assert!(text.contains("[rate_limits]") && text.contains("max_payload_bytes = 9500000"), "{text}");
    }

    #[test]
    fn defaults_load_and_are_sane() {
        let settings = Settings::load_from(None, &env(&[])).unwrap();
        assert_eq!(settings.redis.namespace, "batchd");
        assert_eq!(settings.jobs.default_deadline_secs, 86_400);
        assert_eq!(settings.log.format, LogFormat::Text);
    }

    #[test]
    fn environment_overrides_in_order() {
        let settings = Settings::load_from(
            None,
            &env(&[
                ("BATCHD__POLL__MAX_INTERVAL_MS", "5000"),
                ("REDIS_URL", "redis://10.0.0.1:6379"),
                ("CLOUDFLARE_ACCOUNT_ID", "acct"),
                ("BATCHD__CLOUDFLARE__ACCOUNT_ID", "wins"),
                ("CLOUDFLARE_API_TOKEN", "tok-123"),
            ]),
        )
        .unwrap();
        assert_eq!(settings.poll.max_interval_ms, 5000);
        assert_eq!(settings.redis.url.expose(), "redis://10.0.0.1:6379");
        assert_eq!(settings.cloudflare.account_id, "wins");
        assert_eq!(settings.api_token().unwrap().expose(), "tok-123");
        assert!(!format!("{settings:?}").contains("tok-123"));
    }

    #[test]
    fn bad_values_name_their_key() {
        let err = Settings::load_from(None, &env(&[("BATCHD__POLL__MAX_INTERVAL_MS", "soon")])).unwrap_err();
        assert!(err.to_string().contains("poll.max_interval_ms"), "{err}");
        let err = Settings::load_from(None, &env(&[("BATCHD__POLL__TYPO", "1")])).unwrap_err();
        assert!(err.to_string().contains("typo"), "{err}");
        let err = Settings::load_from(None, &env(&[("BATCHD__REDIS__NAMESPACE", "a b")])).unwrap_err();
        assert!(err.to_string().contains("redis.namespace"), "{err}");
        let err = Settings::load_from(None, &env(&[("BATCHD__WORKERS__RUNTIME_THREADS", "5000")])).unwrap_err();
        assert!(err.to_string().contains("workers.runtime_threads"), "{err}");
        let one = Settings::load_from(None, &env(&[("BATCHD__WORKERS__RUNTIME_THREADS", "1")])).unwrap();
        assert_eq!(one.workers.runtime_threads, 1);
        let err = Settings::load_from(Some(Path::new("/nonexistent/batchd.toml")), &env(&[])).unwrap_err();
        assert_eq!(err.to_string(), "configuration: config file /nonexistent/batchd.toml does not exist");
    }

    #[test]
    fn the_token_comes_from_a_file_when_not_in_the_environment() {
        let dir = std::env::temp_dir().join(format!("batchd-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "file-token\n").unwrap();
        let settings =
            Settings::load_from(None, &env(&[("BATCHD__CLOUDFLARE__API_TOKEN_FILE", file.to_str().unwrap())])).unwrap();
        assert_eq!(settings.api_token().unwrap().expose(), "file-token");
        let missing = Settings::load_from(None, &env(&[])).unwrap().api_token().unwrap_err();
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(
            missing.to_string(),
            "configuration: cloudflare.api_token: not set; set CLOUDFLARE_API_TOKEN or cloudflare.api_token_file"
        );
    }

    #[test]
    fn the_token_comes_from_a_systemd_credential_last() {
        let dir = std::env::temp_dir().join(format!("batchd-credentials-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(TOKEN_CREDENTIAL), "credential-token\n").unwrap();
        let credentials = ("CREDENTIALS_DIRECTORY", dir.to_str().unwrap());
        let settings = Settings::load_from(None, &env(&[credentials])).unwrap();
        assert_eq!(settings.api_token().unwrap().expose(), "credential-token");
        let settings = Settings::load_from(None, &env(&[credentials, ("CLOUDFLARE_API_TOKEN", "env-token")])).unwrap();
        assert_eq!(settings.api_token().unwrap().expose(), "env-token", "the environment wins");
        std::fs::remove_dir_all(&dir).ok();
        let empty = std::env::temp_dir().join(format!("batchd-no-credentials-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let settings = Settings::load_from(None, &env(&[("CREDENTIALS_DIRECTORY", empty.to_str().unwrap())])).unwrap();
        assert!(settings.api_token().is_err(), "no such credential: the token is not set");
        std::fs::remove_dir_all(&empty).ok();
    }

    #[test]
    fn admin_settings_are_checked() {
        let settings = Settings::load_from(None, &env(&[])).unwrap();
        assert_eq!(settings.admin.listen_addr(), Some("127.0.0.1:9090".parse().unwrap()));
        assert_eq!(settings.admin.sample_interval(), Duration::from_secs(5));
        let off = Settings::load_from(None, &env(&[("BATCHD__ADMIN__LISTEN", "")])).unwrap();
        assert_eq!(off.admin.listen_addr(), None);
        let err = Settings::load_from(None, &env(&[("BATCHD__ADMIN__LISTEN", "localhost")])).unwrap_err();
        assert!(err.to_string().contains("admin.listen"), "{err}");
        let err = Settings::load_from(None, &env(&[("BATCHD__ADMIN__SAMPLE_INTERVAL_MS", "0")])).unwrap_err();
        assert!(err.to_string().contains("admin.sample_interval_ms"), "{err}");
    }
}
