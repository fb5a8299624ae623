//! Layered configuration: built-in defaults (`config/default.toml`, compiled in), an optional file, then
//! `BATCHD__SECTION__KEY` environment variables, then the conventional `CLOUDFLARE_ACCOUNT_ID`,
//! `CLOUDFLARE_API_TOKEN`, `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `GEMINI_API_KEY` and `REDIS_URL`.
//!
//! Unknown keys are errors, so a typo cannot silently leave a default in place. The API token never comes from
//! a config file, and its type never prints it.
//!
//! This file holds `Settings`, the constants and the error; one submodule per concern does the rest, and every
//! public item is re-exported here, so callers name `crate::settings::X` only.

mod check;
mod conversions;
mod load;
mod pricing;
mod redacted;
mod secrets;
mod sections;

use serde::{Deserialize, Serialize};

pub use batchd_cloudflare::{ModelLimit, ModelTask, RateLimitSettings, TaskType};
/// The one URL mask (also shown by `cli::connect`).
pub use batchd_core::redact_url;
pub use batchd_engine::settings::{PackingSettings, PollSettings, RetrySettings};
pub use load::describe_config_error;
pub use pricing::{BudgetSettings, PricingSettings};
pub use secrets::Secret;
pub use sections::{
    AdminSettings, AnthropicConfig, CloudflareSettings, EventSettings, GeminiConfig, IngressConfig, InstanceSection,
    JobSettings, LogFormat, LogSettings, OpenAiModelLimit, OpenAiSettings, OpenAiTokenLimit, RedisMode, RedisSettings,
    RetentionSettings, ScheduleConfig, ShutdownSettings, WorkerSettings,
};

/// The built-in defaults; the same file documents every key.
pub const DEFAULTS: &str = include_str!("../../../../config/default.toml");

/// Exit code for configuration errors (EX_CONFIG), listed in the systemd unit's `RestartPreventExitStatus`.
pub const EXIT_CONFIG: i32 = 78;

/// Name of the systemd credential holding the API token (`LoadCredential=cloudflare-api-token:<file>`), read
/// from `$CREDENTIALS_DIRECTORY` when neither the environment nor `cloudflare.api_token_file` gives the token.
pub const TOKEN_CREDENTIAL: &str = "cloudflare-api-token";

/// Name of the credential holding the OpenAI API key (`LoadCredential=openai-api-key:<file>`, or the key of that
/// name in the Kubernetes Secret mounted at `$CREDENTIALS_DIRECTORY`), used when neither the environment nor
/// `openai.api_key_file` gives the key.
pub const OPENAI_KEY_CREDENTIAL: &str = "openai-api-key";

/// Name of the credential holding the Anthropic API key (`LoadCredential=anthropic-api-key:<file>`), used when
/// neither the environment nor `anthropic.api_key_file` gives the key.
pub const ANTHROPIC_KEY_CREDENTIAL: &str = "anthropic-api-key";

/// Name of the credential holding the Gemini API key (`LoadCredential=gemini-api-key:<file>`), used when neither
/// the environment nor `gemini.api_key_file` gives the key.
pub const GEMINI_KEY_CREDENTIAL: &str = "gemini-api-key";

/// A configuration problem, with the key it concerns in the message (see [`ConfigError::at`]).
#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);

impl ConfigError {
    /// A problem with the value of `key`, naming the environment variables that set it ([`key_label`]):
    /// `poll.max_interval_ms (BATCHD__POLL__MAX_INTERVAL_MS): must be at least ...`.
    pub fn at(key: &str, why: impl std::fmt::Display) -> Self {
        Self(format!("{}: {why}", key_label(key)))
    }

    /// A message another part wrote as `key: why` (`log.level: invalid filter directive`), with the key's
    /// environment variables added as [`ConfigError::at`] does; any other message as it is.
    pub fn keyed(message: String) -> Self {
        let key = message.split_once(": ").map(|(key, _)| key).filter(|key| {
            key.contains('.') && key.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._".contains(c))
        });
        match key {
            Some(key) => Self::at(key, &message[key.len() + 2..]),
            None => Self(message),
        }
    }
}

/// The conventional environment variables batchd honours, with the key each sets and that key's own variable
/// (which wins when both are set).
pub const CONVENTIONAL_ENV: [(&str, &str, &str); 6] = [
    ("CLOUDFLARE_ACCOUNT_ID", "cloudflare.account_id", "BATCHD__CLOUDFLARE__ACCOUNT_ID"),
    ("CLOUDFLARE_API_TOKEN", "cloudflare.api_token", "BATCHD__CLOUDFLARE__API_TOKEN"),
    ("OPENAI_API_KEY", "openai.api_key", "BATCHD__OPENAI__API_KEY"),
    ("REDIS_URL", "redis.url", "BATCHD__REDIS__URL"),
    ("ANTHROPIC_API_KEY", "anthropic.api_key", "BATCHD__ANTHROPIC__API_KEY"),
    ("GEMINI_API_KEY", "gemini.api_key", "BATCHD__GEMINI__API_KEY"),
];

/// The settings that are lists of strings, which the environment gives comma-separated
/// (`BATCHD__REDIS__NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379`).
pub const ENV_LISTS: [&str; 4] = ["redis.nodes", "redis.extra_namespaces", "admin.allowed_hosts", "openai.endpoints"];

/// The environment variable that sets `key`: `BATCHD__SECTION__KEY`. `None` for a key inside a list of tables
/// (`rate_limits.models[0].limit`), which only a file can set.
pub fn env_var(key: &str) -> Option<String> {
    if key.is_empty() || key.contains('[') {
        return None;
    }
    Some(format!("BATCHD__{}", key.to_ascii_uppercase().replace('.', "__")))
}

/// `key` with the environment variables that set it, as every configuration error names it:
/// `redis.url (REDIS_URL or BATCHD__REDIS__URL)`, `poll.jitter (BATCHD__POLL__JITTER)`, or the key alone for one
/// only a file can set.
pub fn key_label(key: &str) -> String {
    let conventional = CONVENTIONAL_ENV.iter().find(|(_, name, _)| *name == key).map(|(variable, _, _)| *variable);
    match (conventional, env_var(key)) {
        (Some(conventional), Some(own)) => format!("{key} ({conventional} or {own})"),
        (None, Some(own)) => format!("{key} ({own})"),
        _ => key.to_owned(),
    }
}

/// All settings of the daemon and the CLI.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Redis connection and namespace.
    pub redis: RedisSettings,
    /// The Batch API.
    pub cloudflare: CloudflareSettings,
    /// The OpenAI Batch provider (configured when a key is given).
    pub openai: OpenAiSettings,
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
    /// Packing small jobs into shared remote batches.
    pub packing: PackingSettings,
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
    /// Anthropic Message Batches (configured when a key is given).
    pub anthropic: AnthropicConfig,
    /// Gemini Batch Mode (configured when a key is given).
    pub gemini: GeminiConfig,
    /// Named provider instances (`[providers.<name>]`), by name.
    #[serde(default)]
    pub providers: std::collections::BTreeMap<String, InstanceSection>,
    /// Batch prices by model, for what jobs cost.
    pub pricing: PricingSettings,
    /// What each namespace may spend per day.
    pub budget: BudgetSettings,
}

/// `pairs` standing for the process environment of `Settings::load_from`, in the unit tests.
#[cfg(test)]
fn test_env(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}
