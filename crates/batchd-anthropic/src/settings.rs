//! What the Anthropic provider is built from (`[anthropic]`, handed over by the binary) and the key that never
//! prints.

use std::time::Duration;

/// The API's base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";

/// The `anthropic-version` batchd is written against.
pub const DEFAULT_VERSION: &str = "2023-06-01";

/// Most requests in one batch (the API's documented limit).
pub const MAX_REQUESTS: usize = 100_000;

/// Largest create body, in bytes: "256 MB", read as 256,000,000 bytes (the stricter reading).
pub const MAX_BODY_BYTES: usize = 256_000_000;

/// The API key, sent only as `x-api-key`: the key type every provider shares, printed as `[redacted]`.
pub use batchd_provider::http::ApiKey;

/// How to reach Message Batches and what one batch may hold.
#[derive(Debug, Clone)]
pub struct AnthropicSettings {
    /// The instance's routing name ([`batchd_provider::Provider::name`]): `anthropic` for the built-in instance, the name
    /// of a named one (`[providers.<name>]`, models `<name>/<model>`).
    pub name: &'static str,
    /// `https://api.anthropic.com`, or the emulator's `http://ADDR/anthropic`.
    pub base_url: String,
    /// The API key.
    pub api_key: ApiKey,
    /// The account's label (`[A-Za-z0-9._-]`, `anthropic` by default): it names the rate bucket, which every
    /// namespace and replica using the same label shares.
    pub account: String,
    /// The `anthropic-version` header.
    pub version: String,
    /// The `anthropic-beta` header, when set.
    pub beta: Option<String>,
    /// The `anthropic-workspace-id` header, when set.
    pub workspace_id: Option<String>,
    /// Longest wait for one request other than a create or a results download.
    pub request_timeout: Duration,
    /// Longest pause in a create (its body of up to 256 MB, then its reply) or a results download: those are timed
    /// by progress, not by a total.
    pub idle_timeout: Duration,
    /// Longest wait to connect.
    pub connect_timeout: Duration,
    /// Largest reply read: a results download of more fails its chunk (`reply_too_large`).
    pub max_reply_bytes: usize,
    /// Largest create body, in bytes (at most [`MAX_BODY_BYTES`]).
    pub max_body_bytes: usize,
    /// Most requests per batch (at most [`MAX_REQUESTS`]).
    pub max_requests: usize,
    /// API requests (creates and polls) per minute shared by every replica; 0: batchd does not pace them.
    pub requests_per_minute: u32,
    /// Requests that may go back to back before the pacing applies.
    pub burst: u32,
    /// Delete a batch once it has ended and its results are stored (they hold user data; the API keeps them 29
    /// days otherwise).
    pub delete_batches: bool,
}

impl AnthropicSettings {
    /// Settings with the documented defaults for `api_key`.
    pub fn new(api_key: ApiKey) -> Self {
        Self {
            name: crate::provider::NAME,
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key,
            account: crate::provider::NAME.to_owned(),
            version: DEFAULT_VERSION.to_owned(),
            beta: None,
            workspace_id: None,
            request_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            max_reply_bytes: 512 * 1024 * 1024,
            max_body_bytes: MAX_BODY_BYTES,
            max_requests: MAX_REQUESTS,
            requests_per_minute: 0,
            burst: 1,
            delete_batches: true,
        }
    }
}

/// Settings the provider cannot be built from.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The base URL is not an absolute http(s) URL without query, fragment or credentials.
    #[error("anthropic base url {url:?}: {reason}")]
    InvalidBaseUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A header value cannot be sent, named by its setting (`api_key`, `version`, `beta`, `workspace_id`).
    #[error("anthropic {0}: empty or not sendable in an HTTP header")]
    InvalidHeader(&'static str),
    /// A limit is out of range: `<setting>: <why>`.
    #[error("anthropic {0}")]
    InvalidLimit(String),
    /// The HTTP client could not be built.
    #[error("anthropic http client: {0}")]
    Http(#[source] reqwest::Error),
}
