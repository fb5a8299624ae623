//! What the client needs to reach the Batch API: base URL, account, token and timeouts.
//!
//! The token is wrapped so that no `Debug`, `Display` or log line can print it; only the code that builds the
//! `Authorization` header reads its text.

use std::time::Duration;

/// The Cloudflare API's base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.cloudflare.com/client/v4";
/// Default limit on one whole request, from connecting to reading the last byte of the reply.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Default limit on establishing a connection (TCP and TLS).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default limit on one reply's body: far above any result the API is known to return for a 10 MB batch (a
/// result is typically a few times its batch), and bounded so a broken or hostile reply cannot take the memory.
pub const DEFAULT_MAX_REPLY_BYTES: usize = 256 * 1024 * 1024;
/// Longest accepted account id, in bytes.
pub const MAX_ACCOUNT_ID_LEN: usize = 64;

/// A secret Cloudflare API token (Workers AI Read + Edit): the key type every provider shares. `Debug` and
/// `Display` print `[redacted]`.
pub use batchd_provider::http::ApiKey as ApiToken;

/// How to reach the Batch API.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// The API's base URL, `https://api.cloudflare.com/client/v4` in production; an emulator's address in tests.
    pub base_url: String,
    /// The Cloudflare account id the batches run under (`[A-Za-z0-9_-]`, 1–64 characters).
    pub account_id: String,
    /// The API token sent as `Authorization: Bearer <token>`.
    pub token: ApiToken,
    /// Limit on one whole request, from connecting to reading the last byte of the reply.
    pub request_timeout: Duration,
    /// Limit on establishing a connection (TCP and TLS).
    pub connect_timeout: Duration,
    /// Largest reply body read, in bytes; a larger reply is an error that names its size, never an allocation.
    pub max_reply_bytes: usize,
}

impl ClientSettings {
    /// Settings for the production API with the default timeouts.
    pub fn new(account_id: impl Into<String>, token: ApiToken) -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            account_id: account_id.into(),
            token,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_reply_bytes: DEFAULT_MAX_REPLY_BYTES,
        }
    }
}

/// Why a client could not be built from its settings; every variant is a configuration mistake.
#[derive(Debug, thiserror::Error)]
pub enum ClientBuildError {
    /// The account id is empty, too long or contains characters outside `[A-Za-z0-9_-]`.
    #[error("invalid account id: {0}")]
    InvalidAccountId(String),
    /// The base URL is not an absolute `http` or `https` URL without query or fragment.
    #[error("invalid base url {url:?}: {reason}")]
    InvalidBaseUrl {
        /// The URL as configured.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The token is empty or cannot be sent in an HTTP header (the token itself is never printed).
    #[error("invalid api token: {0}")]
    InvalidToken(&'static str),
    /// The queue id is empty, too long or not `[A-Za-z0-9_-]` (the id is shown cut to 64 characters).
    #[error("invalid queue id {0:?}: 1-64 characters of A-Z a-z 0-9 _ -")]
    InvalidQueueId(String),
    /// The HTTP client could not be created (TLS setup failed).
    #[error("build http client")]
    Http(#[source] reqwest::Error),
}

/// Checks an account id: 1–64 characters of `[A-Za-z0-9_-]`.
pub(crate) fn validate_account_id(raw: &str) -> Result<(), ClientBuildError> {
    if raw.is_empty() {
        return Err(ClientBuildError::InvalidAccountId("must not be empty".to_owned()));
    }
    if raw.len() > MAX_ACCOUNT_ID_LEN {
        return Err(ClientBuildError::InvalidAccountId(format!(
            "is {} bytes long, the maximum is {MAX_ACCOUNT_ID_LEN}",
            raw.len()
        )));
    }
    if let Some(bad) = raw.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))) {
        return Err(ClientBuildError::InvalidAccountId(format!(
            "contains {bad:?}; allowed characters are A-Z a-z 0-9 _ -"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_ids_are_validated() {
        assert!(validate_account_id("023e105f4ecef8ad9ca31a8372d0c353").is_ok());
        assert!(validate_account_id("acct_test-1").is_ok());
        assert!(validate_account_id(&"a".repeat(64)).is_ok());
        for bad in ["", "a/b", "a?b", "../x", "a b", "é", &"a".repeat(65)] {
            assert!(
                matches!(validate_account_id(bad), Err(ClientBuildError::InvalidAccountId(_))),
                "{bad:?} should be refused"
            );
        }
    }
}
