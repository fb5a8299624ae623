//! Layered configuration: built-in defaults (`config/default.toml`, compiled in), an optional file, then
//! `BATCHD__SECTION__KEY` environment variables, then the conventional `CLOUDFLARE_ACCOUNT_ID`,
//! `CLOUDFLARE_API_TOKEN` and `REDIS_URL`.
//!
//! Unknown keys are errors, so a typo cannot silently leave a default in place. The API token never comes from
//! a config file, and its type never prints it.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The built-in defaults; the same file documents every key.
pub const DEFAULTS: &str = include_str!("../../../config/default.toml");

/// Exit code for configuration errors (EX_CONFIG), listed in the systemd unit's `RestartPreventExitStatus`.
pub const EXIT_CONFIG: i32 = 78;

/// A configuration problem, with the key it concerns in the message.
#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);

/// All settings of the daemon and the CLI.
#[derive(Debug, Clone, Deserialize)]
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
    /// Retention of results and ledgers.
    pub retention: RetentionSettings,
    /// Graceful shutdown.
    pub shutdown: ShutdownSettings,
    /// Logging.
    pub log: LogSettings,
}

/// `[redis]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// Redis URL (`redis://` or `rediss://`).
    pub url: Secret,
    /// Key namespace.
    pub namespace: String,
    /// Longest wait for one reply on the shared connection.
    pub response_timeout_secs: u64,
}

/// `[cloudflare]`
#[derive(Debug, Clone, Deserialize)]
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
}

/// `[workers]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// Ingress entries handled at once.
    pub submit_concurrency: usize,
    /// Scheduled steps handled at once.
    pub poll_concurrency: usize,
}

/// `[ingress]`
#[derive(Debug, Clone, Deserialize)]
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
}

/// `[schedule]`
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollSettings {
    /// First delay between submit and poll.
    pub initial_interval_ms: u64,
    /// Growth factor of the delay.
    pub multiplier: f64,
    /// Upper bound for the delay.
    pub max_interval_ms: u64,
    /// Random spread, as a fraction of the delay.
    pub jitter: f64,
}

/// `[retry]`
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSettings {
    /// Default deadline of a job.
    pub default_deadline_secs: u64,
    /// Largest accepted `job` field.
    pub max_entry_bytes: usize,
    /// Largest accepted number of items.
    pub max_items: usize,
}

/// `[retention]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    /// Approximate maximum length of a results stream.
    pub results_maxlen: u64,
    /// Approximate maximum length of the dead-letter stream.
    pub dead_maxlen: u64,
    /// Lifetime of a finished job's ledger.
    pub ledger_ttl_secs: u64,
}

/// `[shutdown]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSettings {
    /// Time given to work in flight after a stop signal.
    pub grace_secs: u64,
}

/// `[log]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// `text` or `json`.
    pub format: LogFormat,
    /// Default level filter.
    pub level: String,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
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
        let mut builder = config::Config::builder()
            .add_source(config::File::from_str(DEFAULTS, config::FileFormat::Toml));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError(format!("config file {} does not exist", file.display())));
            }
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
        let settings: Settings = builder
            .build()
            .and_then(|config| config.try_deserialize())
            .map_err(|e| ConfigError(e.to_string()))?;
        settings.check()?;
        Ok(settings)
    }

    /// Checks relations between values that the types cannot express.
    fn check(&self) -> Result<(), ConfigError> {
        let fail = |key: &str, why: &str| Err(ConfigError(format!("{key}: {why}")));
        batchd_core::Keys::new(&self.redis.namespace).map_err(|e| ConfigError(format!("redis.namespace: {e}")))?;
        if self.workers.submit_concurrency == 0 {
            return fail("workers.submit_concurrency", "must be at least 1");
        }
        if self.workers.poll_concurrency == 0 {
            return fail("workers.poll_concurrency", "must be at least 1");
        }
        if self.ingress.batch == 0 || self.schedule.batch == 0 {
            return fail("ingress.batch / schedule.batch", "must be at least 1");
        }
        if self.schedule.lease_secs <= self.cloudflare.request_timeout_secs {
            return fail("schedule.lease_secs", "must exceed cloudflare.request_timeout_secs");
        }
        if !(self.poll.multiplier >= 1.0) {
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
        if self.retention.results_maxlen == 0 {
            return fail("retention.results_maxlen", "must be at least 1");
        }
        Ok(())
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

    /// The key builder of the configured namespace (validated at load).
    pub fn keys(&self) -> batchd_core::Keys {
        batchd_core::Keys::new(&self.redis.namespace).expect("namespace checked at load")
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

    /// Opens the Redis client for the configured URL.
    pub fn redis_client(&self) -> Result<redis::Client, ConfigError> {
        redis::Client::open(self.redis.url.expose()).map_err(|e| ConfigError(format!("redis.url: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
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
        let err = Settings::load_from(Some(Path::new("/nonexistent/batchd.toml")), &env(&[])).unwrap_err();
        assert_eq!(err.to_string(), "configuration: config file /nonexistent/batchd.toml does not exist");
    }

    #[test]
    fn the_token_comes_from_a_file_when_not_in_the_environment() {
        let dir = std::env::temp_dir().join(format!("batchd-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "file-token\n").unwrap();
        let settings = Settings::load_from(
            None,
            &env(&[("BATCHD__CLOUDFLARE__API_TOKEN_FILE", file.to_str().unwrap())]),
        )
        .unwrap();
        assert_eq!(settings.api_token().unwrap().expose(), "file-token");
        let missing = Settings::load_from(None, &env(&[])).unwrap().api_token().unwrap_err();
        assert_eq!(
            missing.to_string(),
            "configuration: cloudflare.api_token: not set; set CLOUDFLARE_API_TOKEN or cloudflare.api_token_file"
        );
    }
}
