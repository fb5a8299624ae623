//! What the Gemini provider is built from (`[gemini]`, handed over by the binary) and the key that never prints.

use std::time::Duration;

/// The Gemini Developer API's base URL (the client appends `/v1beta/...`, `/upload/v1beta/files`).
pub const DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com";

/// Largest inline create body, in bytes: "about 20 MB", read as 20,000,000 bytes (the stricter reading). A chunk
/// whose inline body would be larger goes through the Files API.
pub const MAX_INLINE_BYTES: usize = 20_000_000;

/// Largest input file, in bytes (the Files API's documented 2 GB, read as 2,000,000,000).
pub const MAX_FILE_BYTES: usize = 2_000_000_000;

/// The API key, sent only as `x-goog-api-key`: the key type every provider shares, printed as `[redacted]`.
pub use batchd_provider::http::ApiKey;

/// How to reach Gemini Batch Mode and what one batch may hold.
#[derive(Debug, Clone)]
pub struct GeminiSettings {
    /// The instance's routing name ([`batchd_provider::Provider::name`]): `gemini` for the built-in instance, the name
    /// of a named one (`[providers.<name>]`, models `<name>/<model>`).
    pub name: &'static str,
    /// `https://generativelanguage.googleapis.com`, or the emulator's `http://ADDR/gemini`.
    pub base_url: String,
    /// The API key.
    pub api_key: ApiKey,
    /// The account's label (`[A-Za-z0-9._-]`, `gemini` by default): it names the rate bucket of creates, which every
    /// namespace and replica using the same label shares.
    pub account: String,
    /// Longest wait for one request (an upload of a whole input file included).
    pub request_timeout: Duration,
    /// Longest wait to connect.
    pub connect_timeout: Duration,
    /// Largest inline create body, in bytes (at most [`MAX_INLINE_BYTES`]); larger chunks go through a file.
    pub max_inline_bytes: usize,
    /// Largest input file, in bytes (at most [`MAX_FILE_BYTES`]); lowered to a quarter of `workers.inflight_bytes`
    /// when the provider is built, since a submit holds its items and the body built from them.
    pub max_file_bytes: usize,
    /// Most requests per batch (the API documents no count limit: batchd's own bound).
    pub max_requests: usize,
    /// Largest reply read: a finished batch's operation with its inline responses, or a responses file. A larger
    /// one fails its chunk (`reply_too_large`).
    pub max_result_bytes: usize,
    /// Batch creates per minute shared by every replica; 0: batchd does not pace them (a 429 is a wait either way).
    pub batches_per_minute: u32,
    /// Creates that may go back to back before the pacing applies.
    pub burst: u32,
    /// Pages of the batch list (100 batches each) read to find a batch an uncertain create made.
    pub lookup_pages: u32,
    /// Delete a batch and its files once it has ended and its results are stored.
    pub delete_batches: bool,
}

impl GeminiSettings {
    /// Settings with the documented defaults for `api_key`.
    pub fn new(api_key: ApiKey) -> Self {
        Self {
            name: crate::provider::NAME,
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key,
            account: crate::provider::NAME.to_owned(),
            request_timeout: Duration::from_secs(100),
            connect_timeout: Duration::from_secs(10),
            max_inline_bytes: MAX_INLINE_BYTES,
            max_file_bytes: MAX_FILE_BYTES,
            max_requests: 100_000,
            max_result_bytes: 512 * 1024 * 1024,
            batches_per_minute: 0,
            burst: 1,
            lookup_pages: 10,
            delete_batches: true,
        }
    }
}

/// Settings the provider cannot be built from.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The base URL is not an absolute http(s) URL without query, fragment or credentials.
    #[error("gemini base url {url:?}: {reason}")]
    InvalidBaseUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The key cannot be sent in a header.
    #[error("gemini api_key: empty or not sendable in an HTTP header")]
    InvalidKey,
    /// The HTTP client could not be built.
    #[error("gemini http client: {0}")]
    Http(#[source] reqwest::Error),
}
