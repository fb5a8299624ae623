//! What the OpenAI provider is built from: where the API is, the key, the headers, the limits of one batch and the
//! rate of creates. batchd's `[openai]` section is converted into it by the binary.
//!
//! The key is wrapped so that no `Debug`, `Display` or log line can print it; only the code that builds the
//! `Authorization` header reads its text.

use std::time::Duration;

/// OpenAI's API base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// OpenAI's one completion window.
pub const DEFAULT_COMPLETION_WINDOW: &str = "24h";
/// The `purpose` of a batch input file at OpenAI.
pub const DEFAULT_FILE_PURPOSE: &str = "batch";
/// The endpoint a job's items go to when it names none.
pub const DEFAULT_ENDPOINT: &str = "/v1/chat/completions";

/// A secret OpenAI API key: the key type every provider shares. `Debug` and `Display` print `[redacted]`.
pub use batchd_provider::http::ApiKey;

/// The header the API key is sent in: OpenAI's and most compatible vendors' `Authorization: Bearer <key>`, or
/// Azure OpenAI's `api-key: <key>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyHeader {
    /// `Authorization: Bearer <key>` (OpenAI, Groq, and the others that copy OpenAI's API).
    #[default]
    Authorization,
    /// `api-key: <key>` (Azure OpenAI's key authentication).
    ApiKey,
}

impl KeyHeader {
    /// Every spelling, as the settings give it (`key_header = "authorization" | "api-key"`).
    pub const NAMES: [&'static str; 2] = ["authorization", "api-key"];

    /// The header of its setting's spelling ([`KeyHeader::NAMES`]), case-insensitive.
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "authorization" => Some(Self::Authorization),
            "api-key" => Some(Self::ApiKey),
            _ => None,
        }
    }
}

/// How to reach OpenAI (or an API that copies its Files and Batch endpoints) and what one batch may hold.
#[derive(Debug, Clone)]
pub struct OpenAiClientSettings {
    /// The instance's routing name ([`batchd_provider::Provider::name`]): `openai` for the built-in instance, the
    /// name of a named one (`[providers.<name>]`, models `<name>/<model>`).
    pub name: &'static str,
    /// The API's base URL (`https://api.openai.com/v1`; the emulator's `http://ADDR/openai/v1` in tests).
    pub base_url: String,
    /// The API key, sent as [`OpenAiClientSettings::key_header`] says.
    pub api_key: ApiKey,
    /// The header the key goes in (Azure OpenAI: `api-key`).
    pub key_header: KeyHeader,
    /// The batch's `completion_window` (OpenAI: `24h`, the only value it takes; Groq: `24h` to `7d`); `None`: not
    /// sent, for a vendor that takes none.
    pub completion_window: Option<String>,
    /// The `purpose` of an uploaded input file (OpenAI and Groq: `batch`).
    pub file_purpose: String,
    /// The account's label (`[A-Za-z0-9._-]`, `openai` by default): it names the rate buckets, which every
    /// namespace and replica using the same label shares.
    pub account: String,
    /// Sent as `OpenAI-Organization` when set.
    pub organization: Option<String>,
    /// Sent as `OpenAI-Project` when set.
    pub project: Option<String>,
    /// Limit on one whole request other than an upload or a results download.
    pub request_timeout: Duration,
    /// Longest pause in an upload or a results download (no byte sent or received): those are timed by progress,
    /// not by a total, so a large file on a slow link is read to its end and a stalled one fails.
    pub idle_timeout: Duration,
    /// Limit on opening a connection.
    pub connect_timeout: Duration,
    /// Most request lines in one batch (the API's limit is 50,000).
    pub max_requests: usize,
    /// Largest input file, in bytes (the API's limit is 200 MB; the daemon lowers it to its memory budget).
    pub max_file_bytes: usize,
    /// Largest output or error file read, in bytes; a larger one fails the chunk instead of taking the memory.
    pub max_result_bytes: usize,
    /// Whether the input, output and error files are deleted once a batch's results are stored.
    pub delete_files: bool,
    /// After how many seconds OpenAI deletes the input file and the batch's output and error files by itself
    /// (`expires_after`, `output_expires_after`; 3,600 to 2,592,000): what a crash or a failed delete leaves behind
    /// goes away on its own. 0: not sent (OpenAI keeps them 30 days).
    pub file_expiry_secs: u64,
    /// Batches created per hour and model (0: not limited); the API allows 2,000 per hour.
    pub batches_per_hour: u32,
    /// Creates allowed back to back in a model's bucket.
    pub burst: u32,
    /// Own limits for some models (`(model without "openai/", batches per hour)`; 0: not limited).
    pub model_batches_per_hour: Vec<(String, u32)>,
    /// Pages of `GET /v1/batches` (100 batches each, newest first) looked through when a resumed submit looks for
    /// the batch an interrupted attempt may have created.
    pub lookup_pages: usize,
    /// The endpoints a job may name (`/v1/...`); a job naming another fails before anything is sent. The API's
    /// list grows (it is configurable so that a new endpoint needs no release): [`crate::DEFAULT_ENDPOINTS`].
    pub endpoints: Vec<String>,
    /// The organization's enqueued-token limits of some models (`(model without "openai/", tokens)`): batchd keeps
    /// the estimated input tokens of its running batches of such a model under the limit, and waits before
    /// creating one more that would go over it. A model without one is not paced (a `token_limit_exceeded` is
    /// then waited out). OpenAI publishes the limits per tier on the organization's Limits page, not by API.
    pub enqueued_token_limits: Vec<(String, u64)>,
}

/// Default of [`OpenAiClientSettings::file_expiry_secs`]: 3 days, past the 24 h completion window, the 24 h
/// default job deadline and a day of the daemon being down.
pub const DEFAULT_FILE_EXPIRY_SECS: u64 = 3 * 24 * 3600;

/// Default of [`OpenAiClientSettings::idle_timeout`], in seconds.
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 60;

/// The expiry the Files and Batch APIs accept, in seconds (one hour to 30 days).
pub const FILE_EXPIRY_SECS: std::ops::RangeInclusive<u64> = 3600..=2_592_000;

/// A completion window (`24h`, `48h`, `7d`: a whole number of hours or days) as a duration; `None` for any other
/// spelling.
pub fn completion_window(window: &str) -> Option<Duration> {
    let (count, unit) = window.split_at(window.len().checked_sub(1)?);
    let count: u64 = count.parse().ok().filter(|count| *count > 0 && *count <= 10_000)?;
    match unit {
        "h" => Some(Duration::from_secs(count * 3600)),
        "d" => Some(Duration::from_secs(count * 86_400)),
        _ => None,
    }
}

impl OpenAiClientSettings {
    /// The full name of the instance's setting `key`, as error messages name it: `openai.<key>` for the built-in
    /// instance, `providers.<name>.<key>` for a named one.
    pub fn setting(&self, key: &str) -> String {
        if self.name == crate::provider::NAME {
            format!("openai.{key}")
        } else {
            format!("providers.{}.{key}", self.name)
        }
    }

    /// Settings for the production API with the defaults of `config/default.toml`.
    pub fn new(api_key: ApiKey) -> Self {
        Self {
            name: crate::provider::NAME,
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key,
            key_header: KeyHeader::Authorization,
            completion_window: Some(DEFAULT_COMPLETION_WINDOW.to_owned()),
            file_purpose: DEFAULT_FILE_PURPOSE.to_owned(),
            account: crate::provider::NAME.to_owned(),
            organization: None,
            project: None,
            request_timeout: Duration::from_secs(100),
            idle_timeout: Duration::from_secs(DEFAULT_IDLE_TIMEOUT_SECS),
            connect_timeout: Duration::from_secs(10),
            max_requests: 50_000,
            max_file_bytes: 200 * 1000 * 1000,
            max_result_bytes: 512 * 1024 * 1024,
            delete_files: true,
            file_expiry_secs: DEFAULT_FILE_EXPIRY_SECS,
            batches_per_hour: 2000,
            burst: 10,
            model_batches_per_hour: Vec::new(),
            lookup_pages: 10,
            endpoints: crate::DEFAULT_ENDPOINTS.iter().map(|endpoint| (*endpoint).to_owned()).collect(),
            enqueued_token_limits: Vec::new(),
        }
    }
}

/// Why the provider could not be built; every variant is a configuration mistake.
#[derive(Debug, thiserror::Error)]
pub enum OpenAiBuildError {
    /// The base URL is not an absolute `http(s)` URL without query, fragment or credentials.
    #[error("invalid base url {url:?}: {reason}")]
    InvalidBaseUrl {
        /// The URL as configured.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The key, organization or project (named by its setting: `api_key`, `organization`, `project`) cannot be
    /// sent in a header, or the key is empty.
    #[error("invalid {0}: empty, or holds characters that cannot be sent in a header")]
    InvalidHeader(&'static str),
    /// A limit (named by its setting) is zero.
    #[error("invalid {0}: must be at least 1")]
    InvalidLimit(&'static str),
    /// The HTTP client could not be created.
    #[error("build http client")]
    Http(#[source] reqwest::Error),
}
