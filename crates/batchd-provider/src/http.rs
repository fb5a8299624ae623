//! What every provider's HTTP client is built from, written once: the API key that never prints, the base URL
//! check, path segments appended percent-encoded, the `reqwest` clients (the settings' timeouts, no redirects; the
//! transfer client for uploads and result downloads, timed by progress rather than by a total),
//! `Retry-After` read from a reply's headers, and a failed request (no complete reply) as an [`ApiError`]. Each
//! provider's `client.rs` keeps only what its API does differently (URLs, headers, reply bodies).

use std::fmt;
use std::time::{Duration, SystemTime};

use percent_encoding::{AsciiSet, utf8_percent_encode};
use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use serde::Deserialize;

use crate::{ApiError, ErrorKind};

/// The `User-Agent` every provider's client sends.
pub const USER_AGENT: &str = concat!("batchd/", env!("CARGO_PKG_VERSION"));

/// Shortest start of a key that [`ApiKey::scrub`] takes out of the end of a message cut short (shorter ones, such
/// as a key's public `sk-` prefix, say nothing of the key and would redact ordinary text).
pub const MIN_KEY_PIECE: usize = 4;

/// A secret API key or token. `Debug` and `Display` print `[redacted]`; its text leaves only as a header value
/// ([`ApiKey::header`]), and is taken out of error texts a server may echo it in ([`ApiKey::scrub`],
/// [`ApiKey::redact`]).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key. Surrounding whitespace (a trailing newline from a key file) is ignored when it is used.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key's text, trimmed.
    fn expose(&self) -> &str {
        self.0.trim()
    }

    /// Whether the key is empty (or only whitespace).
    pub fn is_empty(&self) -> bool {
        self.expose().is_empty()
    }

    /// `{prefix}{key}` as a header value marked sensitive (HTTP-level debug output hides it); `None` when the key
    /// is empty or holds characters that cannot be sent in a header.
    pub fn header(&self, prefix: &str) -> Option<HeaderValue> {
        let key = self.expose();
        if key.is_empty() {
            return None;
        }
        let mut value = HeaderValue::from_str(&format!("{prefix}{key}")).ok()?;
        value.set_sensitive(true);
        Some(value)
    }

    /// `error` with the key taken out of its message, in case a server echoed it back: every whole copy, and the
    /// start of one the message was cut inside (a client caps a quoted message before it scrubs it; the cut may
    /// be marked with `…`), when that start is [`MIN_KEY_PIECE`] characters or more.
    pub fn scrub(&self, mut error: ApiError) -> ApiError {
        let key = self.expose();
        if key.is_empty() {
            return error;
        }
        if error.message.contains(key) {
            error.message = error.message.replace(key, "[redacted]");
        }
        let (text, ellipsis) = match error.message.strip_suffix('…') {
            Some(text) => (text, "…"),
            None => (error.message.as_str(), ""),
        };
        let cut = key
            .char_indices()
            .map(|(at, _)| at)
            .filter(|at| key[..*at].chars().count() >= MIN_KEY_PIECE)
            .rev()
            .find(|at| text.ends_with(&key[..*at]));
        if let Some(at) = cut {
            error.message = format!("{}[redacted]{ellipsis}", &text[..text.len() - at]);
        }
        error
    }

    /// `body` with every copy of the key replaced by `[redacted]`: a message quoted from a server that echoes the
    /// request's headers and then cut short would keep a part of the key [`ApiKey::scrub`] cannot find.
    pub fn redact(&self, body: &[u8]) -> Vec<u8> {
        let key = self.expose().as_bytes();
        if key.is_empty() {
            return body.to_vec();
        }
        let mut redacted = Vec::with_capacity(body.len());
        let mut rest = body;
        while let Some(at) = rest.windows(key.len()).position(|window| window == key) {
            redacted.extend_from_slice(&rest[..at]);
            redacted.extend_from_slice(b"[redacted]");
            rest = &rest[at + key.len()..];
        }
        redacted.extend_from_slice(rest);
        redacted
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl<'de> Deserialize<'de> for ApiKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self)
    }
}

/// A configured base URL, checked: absolute `http(s)` with a host, without query, fragment or credentials. The
/// error is the reason, for the provider's own "invalid base url" error.
pub fn base_url(raw: &str) -> Result<Url, String> {
    let url = Url::parse(raw.trim()).map_err(|error| error.to_string())?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("the scheme must be http or https".to_owned());
    }
    if url.host().is_none() || url.cannot_be_a_base() {
        return Err("it has no host".to_owned());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("it must not have a query or fragment".to_owned());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("it must not contain credentials".to_owned());
    }
    Ok(url)
}

/// Refuses a plain-HTTP base URL that is not on this machine: the key would cross the network in clear. The
/// error is the reason.
pub fn refuse_clear_text(base_url: &str) -> Result<(), String> {
    let Some(rest) = base_url.trim().strip_prefix("http://") else {
        return Ok(()); // https, or a URL `base_url` refuses with a clearer message
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    let loopback =
        host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback {
        return Ok(());
    }
    Err(format!(
        "{base_url:?} is plain http to another host, which would send the API token in clear; use https (http is \
         allowed only for loopback, e.g. the emulator on 127.0.0.1)"
    ))
}

/// `url` with each of `segments` appended as a path segment, its bytes in `encoded` percent-encoded (each API
/// has its own idea of which characters a segment may carry literally).
pub fn join(url: &Url, segments: &[&str], encoded: &'static AsciiSet) -> Url {
    let mut url = url.clone();
    let mut path = url.path().to_owned();
    for segment in segments {
        path.push('/');
        path.extend(utf8_percent_encode(segment, encoded));
    }
    url.set_path(&path);
    url
}

/// The HTTP client of a provider: [`USER_AGENT`], the settings' timeouts, and redirects off (a redirect would be
/// a misconfigured base URL; following it could carry the key elsewhere).
pub fn client(request_timeout: Duration, connect_timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .user_agent(USER_AGENT)
        .timeout(request_timeout)
        .connect_timeout(connect_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

/// The HTTP client of a provider's uploads and results downloads: like [`client`], but with no limit on the whole
/// request. A transfer is timed by its progress instead: it fails when no byte arrives for `idle_timeout` (the
/// reply's start, each piece of its body), so a 512 MiB result on a slow link is read to its end, and a stalled
/// one fails in `idle_timeout` whatever its size. Bytes are bounded by the caller (a result cap, the memory
/// budget).
pub fn transfer_client(connect_timeout: Duration, idle_timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .user_agent(USER_AGENT)
        .read_timeout(idle_timeout)
        .connect_timeout(connect_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

/// Slowest upload a transfer is given time for, in bytes a second: an upload's bytes are written by the OS, which
/// says nothing of a server that stops reading, so an upload also ends at [`upload_deadline`].
pub const MIN_UPLOAD_RATE: u64 = 64 * 1024;

/// The longest an upload of `bytes` may take in all (with its reply): `idle_timeout` plus the bytes at
/// [`MIN_UPLOAD_RATE`] (about 52 minutes for 200 MB). A bound for a server that stops reading, not a pace: an
/// upload at any usable speed ends long before it.
pub fn upload_deadline(idle_timeout: Duration, bytes: usize) -> Duration {
    idle_timeout + Duration::from_secs((bytes as u64).div_ceil(MIN_UPLOAD_RATE))
}

/// [`transport_error`] of a transfer ([`transfer_client`]): a timeout is a pause of `idle_timeout` without a byte
/// (or an upload slower than [`MIN_UPLOAD_RATE`]).
pub fn transfer_error(
    error: &reqwest::Error,
    http_status: Option<u16>,
    idle_timeout: Duration,
    creates: bool,
) -> ApiError {
    let mut failed = transport_error(error, http_status, idle_timeout, creates);
    if error.is_timeout() {
        failed.message = format!(
            "the transfer stalled (no byte for {idle_timeout:?}, or an upload slower than {} KiB/s): {}",
            MIN_UPLOAD_RATE / 1024,
            error_chain(error)
        );
    }
    failed
}

/// A reply's `Retry-After`, in seconds or as an HTTP date, when present and readable.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    crate::text::parse_retry_after(headers.get(RETRY_AFTER)?.to_str().ok()?, SystemTime::now())
}

/// The error of a request that got no complete reply: one that could not be built is permanent, anything else
/// transient. `creates` says the call creates a batch: one that may have been sent (anything but a failed
/// connect) may have created it, so the error is `maybe_delivered`. `request_timeout` is quoted for a timeout.
pub fn transport_error(
    error: &reqwest::Error,
    http_status: Option<u16>,
    request_timeout: Duration,
    creates: bool,
) -> ApiError {
    let chain = error_chain(error);
    let (kind, message, sent) = if error.is_builder() {
        (ErrorKind::Permanent, format!("could not build the request: {chain}"), false)
    } else if error.is_connect() {
        (ErrorKind::Transient, format!("could not connect: {chain}"), false)
    } else if error.is_timeout() {
        (ErrorKind::Transient, format!("request timed out after {request_timeout:?}: {chain}"), true)
    } else {
        (ErrorKind::Transient, format!("connection failed: {chain}"), true)
    };
    ApiError { kind, http_status, api_code: None, message, retry_after: None, maybe_delivered: creates && sent }
}

/// An error and its causes, joined by `: ` (a text already included once is not repeated), without the URL (it
/// may hold an account id, and the span has it anyway).
fn error_chain(error: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let top = error.to_string();
    parts.push(top.split(" for url (").next().unwrap_or_default().to_owned());
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_redacted_and_trimmed() {
        let key = ApiKey::new("s3cr3t-token\n");
        assert_eq!(format!("{key:?} {key}"), "[redacted] [redacted]");
        assert_eq!(key.expose(), "s3cr3t-token");
        let header = key.header("Bearer ").expect("a sendable key");
        assert!(header.is_sensitive());
        assert_eq!(header.to_str().expect("ascii"), "Bearer s3cr3t-token");
        assert!(ApiKey::new(" \n").header("Bearer ").is_none(), "an empty key");
        assert!(ApiKey::new("a\u{7}b").header("").is_none(), "not sendable");
    }

    #[test]
    fn the_key_is_taken_out_of_messages_and_bodies() {
        let key = ApiKey::new("sk-1");
        let error = ApiError {
            kind: ErrorKind::Permanent,
            http_status: Some(401),
            api_code: None,
            message: "bad key sk-1 (sk-1)".to_owned(),
            retry_after: None,
            maybe_delivered: false,
        };
        assert_eq!(key.scrub(error).message, "bad key [redacted] ([redacted])");
        assert_eq!(key.redact(b"x sk-1 y sk-"), b"x [redacted] y sk-");
    }

    #[test]
    fn a_message_cut_inside_an_echoed_key_loses_the_keys_start_too() {
        let key = ApiKey::new("sk-proj-SECRETkey42");
        let scrub = |message: &str| {
            let error = ApiError {
                kind: ErrorKind::Transient,
                http_status: Some(500),
                api_code: None,
                message: message.to_owned(),
                retry_after: None,
                maybe_delivered: false,
            };
            key.scrub(error).message
        };
        assert_eq!(scrub("echo sk-proj-SECRETk…"), "echo [redacted]…", "cut and marked");
        assert_eq!(scrub("echo sk-proj-SECR"), "echo [redacted]", "cut without a mark");
        assert_eq!(scrub("sk-proj-SECRETkey42 and sk-proj-S…"), "[redacted] and [redacted]…");
        assert_eq!(scrub("ask-"), "ask-", "shorter than MIN_KEY_PIECE: ordinary text");
        assert_eq!(scrub("sk-p"), "[redacted]");
        assert_eq!(scrub("nothing of it"), "nothing of it");
    }

    #[test]
    fn an_upload_is_given_its_bytes_at_the_slowest_rate_beyond_the_idle_timeout() {
        let idle = Duration::from_secs(60);
        assert_eq!(upload_deadline(idle, 0), idle);
        assert_eq!(upload_deadline(idle, 200_000_000), idle + Duration::from_secs(3052));
    }

    #[test]
    fn base_urls_are_checked() {
        assert_eq!(base_url(" https://api.openai.com/v1 ").expect("valid").as_str(), "https://api.openai.com/v1");
        for bad in [
            "",
            "api.openai.com/v1",
            "ftp://x/v1",
            "https://x/v1?a=1",
            "https://x/v1#f",
            "https://u:p@x/v1",
            "mailto:someone@example.com",
        ] {
            assert!(base_url(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn plain_http_is_refused_unless_the_api_is_on_this_machine() {
        for allowed in [
            "https://api.cloudflare.com/client/v4",
            "http://127.0.0.1:8787/client/v4",
            "http://127.9.0.1:1",
            "http://localhost:8787",
            "http://[::1]:8787/x",
        ] {
            assert!(refuse_clear_text(allowed).is_ok(), "{allowed}");
        }
        for refused in ["http://api.cloudflare.com/client/v4", "http://10.0.0.5:8787", "http://[2001:db8::1]:80"] {
            let why = refuse_clear_text(refused).expect_err(refused);
            assert!(why.contains("in clear"), "{why}");
        }
    }
}
