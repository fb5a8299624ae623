//! Layered configuration: built-in defaults (`config/default.toml`, compiled in), an optional file, then
//! `BATCHD__SECTION__KEY` environment variables, then the conventional `CLOUDFLARE_ACCOUNT_ID`,
//! `CLOUDFLARE_API_TOKEN`, `OPENAI_API_KEY`, `ANTHROPIC_API_KEY` and `REDIS_URL`.
//!
//! Unknown keys are errors, so a typo cannot silently leave a default in place. The API token never comes from
//! a config file, and its type never prints it.
//!
//! This file holds `Settings`, the constants and the error; one submodule per concern does the rest, and every
//! public item is re-exported here, so callers name `crate::settings::X` only.

mod check;
mod conversions;
mod load;
mod redacted;
mod secrets;
mod sections;

use serde::{Deserialize, Serialize};

pub use batchd_cloudflare::{ModelLimit, ModelTask, RateLimitSettings, TaskType};
/// The one URL mask (also shown by `cli::connect`).
pub use batchd_core::redact_url;
pub use batchd_engine::settings::{PollSettings, RetrySettings};
pub use secrets::Secret;
pub use sections::{
    AdminSettings, AnthropicConfig, CloudflareSettings, EventSettings, IngressConfig, JobSettings, LogFormat,
    LogSettings, OpenAiModelLimit, OpenAiSettings, RedisMode, RedisSettings, RetentionSettings, ScheduleConfig,
    ShutdownSettings, WorkerSettings,
};

/// The built-in defaults; the same file documents every key.
pub const DEFAULTS: &str = include_str!("../../../../config/default.toml");

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
}

/// `pairs` standing for the process environment of `Settings::load_from`, in the unit tests.
#[cfg(test)]
fn test_env(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}
