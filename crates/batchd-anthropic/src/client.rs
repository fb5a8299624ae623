//! The HTTP side of Message Batches: one request per call (create, retrieve, list, cancel, delete, results), the
//! headers every call carries (`x-api-key`, `anthropic-version`, optional beta and workspace), replies read up to a
//! limit, and every failure classified into the engine's [`ErrorKind`] here, in one place.

use std::time::Duration;

use batchd_core::ApiCode;
use batchd_provider::text::LineSplitter;
use batchd_provider::{ApiError, ErrorKind, ReplyBudget, ReplyHold, http};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Method, Url};
use serde::Deserialize;

use crate::settings::{AnthropicSettings, ApiKey, BuildError};

/// Bytes percent-encoded in a path segment: everything but RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Largest reply of a call other than results (a batch object, a page of 1,000 of them: about 600 KB).
const MAX_SMALL_REPLY: usize = 4 * 1024 * 1024;

/// A results download takes room in the memory budget this many bytes at a time.
const RESULTS_STEP: usize = 1024 * 1024;

/// Longest part of an error body quoted in a message, in characters.
const MAX_QUOTED: usize = 300;

/// Which call failed: it decides whether a failure may have created a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `POST /v1/messages/batches`.
    Create,
    /// A results download.
    Results,
    /// Any other call.
    Other,
}

/// Message Batches over HTTP. Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct Client {
    /// The HTTP client: the settings' timeouts, no redirects.
    http: reqwest::Client,
    /// The client of creates (a body of up to 256 MB) and results downloads: no total limit, `idle_timeout`
    /// between bytes.
    transfer: reqwest::Client,
    /// The longest pause in a transfer, quoted in its timeout errors.
    idle_timeout: Duration,
    /// The headers every call carries (the key marked sensitive).
    headers: HeaderMap,
    /// `{base}/v1/messages/batches`.
    batches_url: Url,
    /// Scheme, host and port of the base URL: a `results_url` elsewhere is not sent the key.
    origin: url_origin::Origin,
    /// The key, to scrub from any error text a server echoes it in.
    key: ApiKey,
    /// The whole-request limit, quoted in timeout errors.
    request_timeout: Duration,
    /// Largest results download.
    max_reply_bytes: usize,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("batches_url", &self.batches_url.as_str()).finish_non_exhaustive()
    }
}

/// Comparing URLs by scheme, host and port.
mod url_origin {
    /// A URL's scheme, host and port.
    pub type Origin = (String, Option<String>, Option<u16>);

    /// The origin of `url`.
    pub fn of(url: &reqwest::Url) -> Origin {
        (url.scheme().to_owned(), url.host_str().map(str::to_owned), url.port_or_known_default())
    }
}

impl Client {
    /// Checks the settings and builds the client; nothing is sent yet.
    pub fn new(settings: &AnthropicSettings) -> Result<Self, BuildError> {
        let base = http::base_url(&settings.base_url)
            .map_err(|reason| BuildError::InvalidBaseUrl { url: settings.base_url.clone(), reason })?;
        let mut batches_url = base.clone();
        batches_url.set_path(&format!("{}/v1/messages/batches", base.path().trim_end_matches('/')));
        let header = |name: &'static str, value: &str| {
            HeaderValue::from_str(value).ok().filter(|_| !value.is_empty()).ok_or(BuildError::InvalidHeader(name))
        };
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", settings.api_key.header("").ok_or(BuildError::InvalidHeader("api_key"))?);
        headers.insert("anthropic-version", header("version", &settings.version)?);
        if let Some(beta) = &settings.beta {
            headers.insert("anthropic-beta", header("beta", beta)?);
        }
        if let Some(workspace) = &settings.workspace_id {
            headers.insert("anthropic-workspace-id", header("workspace_id", workspace)?);
        }
        let http = http::client(settings.request_timeout, settings.connect_timeout).map_err(BuildError::Http)?;
        if settings.idle_timeout.is_zero() {
            return Err(BuildError::InvalidLimit("idle_timeout_secs: must be at least 1".to_owned()));
        }
        let transfer =
            http::transfer_client(settings.connect_timeout, settings.idle_timeout).map_err(BuildError::Http)?;
        Ok(Self {
            http,
            transfer,
            idle_timeout: settings.idle_timeout,
            headers,
            origin: url_origin::of(&base),
            batches_url,
            key: settings.api_key.clone(),
            request_timeout: settings.request_timeout,
            max_reply_bytes: settings.max_reply_bytes,
        })
    }

    /// `{base}/v1/messages/batches` followed by percent-encoded segments.
    fn url(&self, segments: &[&str]) -> Url {
        http::join(&self.batches_url, segments, SEGMENT)
    }

    /// Where the results of batch `id` are read: its `results_url` when that is on the API's own origin (the key
    /// goes nowhere else), `{base}/v1/messages/batches/{id}/results` otherwise.
    pub fn results_url(&self, id: &str, results_url: Option<&str>) -> Url {
        match results_url.and_then(|url| Url::parse(url).ok()) {
            Some(url) if url_origin::of(&url) == self.origin && matches!(url.scheme(), "http" | "https") => url,
            Some(url) => {
                tracing::warn!(
                    batch_id = id,
                    host = url.host_str().unwrap_or_default(),
                    "results_url is not on the API's host; reading the results from the API instead"
                );
                self.url(&[id, "results"])
            }
            None => self.url(&[id, "results"]),
        }
    }

    /// Creates a batch from a body built by `wire::create_body`.
    #[tracing::instrument(level = "debug", skip_all, fields(body_bytes = body.len()))]
    pub async fn create(&self, body: Vec<u8>) -> Result<Vec<u8>, ApiError> {
        self.small(Call::Create, Method::POST, self.batches_url.clone(), Some(body)).await
    }

    /// Retrieves batch `id`.
    pub async fn retrieve(&self, id: &str) -> Result<Vec<u8>, ApiError> {
        self.small(Call::Other, Method::GET, self.url(&[id]), None).await
    }

    /// A page of at most `limit` batches, newest first, older than `after_id` when given.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn list(&self, after_id: Option<&str>, limit: u32) -> Result<Vec<u8>, ApiError> {
        let mut url = self.batches_url.clone();
        url.query_pairs_mut().append_pair("limit", &limit.to_string());
        if let Some(after_id) = after_id {
            url.query_pairs_mut().append_pair("after_id", after_id);
        }
        self.small(Call::Other, Method::GET, url, None).await
    }

    /// Asks for batch `id` to be canceled.
    pub async fn cancel(&self, id: &str) -> Result<Vec<u8>, ApiError> {
        self.small(Call::Other, Method::POST, self.url(&[id, "cancel"]), None).await
    }

    /// Deletes batch `id` (allowed once it has ended): its results are no longer kept at the API.
    pub async fn delete(&self, id: &str) -> Result<Vec<u8>, ApiError> {
        self.small(Call::Other, Method::DELETE, self.url(&[id]), None).await
    }

    /// One request whose reply is small (at most 4 MiB): the reply body of a 2xx, the classified error otherwise.
    async fn small(&self, call: Call, method: Method, url: Url, body: Option<Vec<u8>>) -> Result<Vec<u8>, ApiError> {
        let mut response = self.send(call, method, url, body).await?;
        let http_status = response.status().as_u16();
        let mut reply = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) if reply.len() + chunk.len() > MAX_SMALL_REPLY => {
                    return Err(self.scrub(unreadable(call, http_status, "the reply is larger than 4 MiB")));
                }
                Ok(Some(chunk)) => reply.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(error) => return Err(self.scrub(self.transport(call, &error, Some(http_status)))),
            }
        }
        if (200..300).contains(&http_status) {
            Ok(reply)
        } else {
            Err(self.scrub(from_reply(call, http_status, http::retry_after(response.headers()), &reply)))
        }
    }

    /// Sends a request; a reply of any status is returned, a transport failure classified. A create and a results
    /// download go through the transfer client (timed by progress, not by `request_timeout`).
    async fn send(
        &self,
        call: Call,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
    ) -> Result<reqwest::Response, ApiError> {
        let client = if call == Call::Other { &self.http } else { &self.transfer };
        let mut request = client.request(method, url).headers(self.headers.clone());
        if let Some(body) = body {
            if call == Call::Create {
                request = request.timeout(http::upload_deadline(self.idle_timeout, body.len()));
            }
            request = request.header(CONTENT_TYPE, "application/json").body(body);
        }
        request.send().await.map_err(|error| self.scrub(self.transport(call, &error, None)))
    }

    /// Streams the results at `url` line by line into `line`, holding room in `budget` for the bytes read (their
    /// declared length at once, else growing by doubling, never waiting while holding room); refuses more than
    /// `max_reply_bytes` or than the budget can hold. Returns the room held.
    #[tracing::instrument(level = "debug", skip_all, fields(url = %url.path()))]
    pub async fn results(
        &self,
        url: Url,
        budget: Option<&ReplyBudget>,
        mut line: impl FnMut(&[u8]),
    ) -> Result<Vec<ReplyHold>, ApiError> {
        let mut response = self.send(Call::Results, Method::GET, url, None).await?;
        let http_status = response.status().as_u16();
        if !(200..300).contains(&http_status) {
            let headers = response.headers().clone();
            let mut reply = Vec::new();
            while let Ok(Some(chunk)) = response.chunk().await {
                if reply.len() + chunk.len() > MAX_SMALL_REPLY {
                    break;
                }
                reply.extend_from_slice(&chunk);
            }
            return Err(self.scrub(from_reply(Call::Other, http_status, http::retry_after(&headers), &reply)));
        }
        let limit = self.max_reply_bytes.min(budget.map_or(usize::MAX, ReplyBudget::capacity));
        let (mut held, mut held_bytes, mut total) = (Vec::<ReplyHold>::new(), 0usize, 0usize);
        if let Some(declared) = response.content_length() {
            if declared > limit as u64 {
                return Err(too_large(http_status, declared, limit));
            }
            // A declared length: its room is taken at once, so the download never waits again.
            if let Some(budget) = budget {
                budget.cover(&mut held, &mut held_bytes, declared as usize, RESULTS_STEP).await;
            }
        }
        let mut lines = LineSplitter::default();
        loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(error) => return Err(self.scrub(self.transport(Call::Results, &error, Some(http_status)))),
            };
            total += chunk.len();
            if total > limit {
                return Err(too_large(http_status, total as u64, limit));
            }
            if let Some(budget) = budget {
                budget.cover(&mut held, &mut held_bytes, total, RESULTS_STEP).await;
            }
            lines.feed(&chunk, &mut line);
        }
        lines.finish(line);
        Ok(held)
    }

    /// The `custom_id` of the first result line of batch `id` (read no further than 1 MiB), or `None` when its
    /// results cannot be read or name none.
    pub async fn first_custom_id(&self, id: &str, results_url: Option<&str>) -> Option<String> {
        let url = self.results_url(id, results_url);
        let mut response = self.send(Call::Other, Method::GET, url, None).await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        let mut head = Vec::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            head.extend_from_slice(&chunk);
            if head.contains(&b'\n') || head.len() > RESULTS_STEP {
                break;
            }
        }
        first_custom_id(&head)
    }

    /// A transport failure: a create that may have been sent may have created its batch.
    fn transport(&self, call: Call, error: &reqwest::Error, http_status: Option<u16>) -> ApiError {
        match call {
            Call::Other => http::transport_error(error, http_status, self.request_timeout, false),
            Call::Create | Call::Results => {
                http::transfer_error(error, http_status, self.idle_timeout, call == Call::Create)
            }
        }
    }

    /// Removes the key from an error's message, in case a server echoed it.
    fn scrub(&self, error: ApiError) -> ApiError {
        self.key.scrub(error)
    }
}

/// The documented error envelope, read leniently.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Envelope {
    /// `{type, message}`.
    error: Option<EnvelopeError>,
}

/// The inner error.
#[derive(Deserialize, Default)]
#[serde(default)]
struct EnvelopeError {
    /// `invalid_request_error`, `rate_limit_error`, ...
    #[serde(rename = "type")]
    kind: Option<String>,
    /// For people.
    message: Option<String>,
}

/// What a non-2xx reply means. 429, 529 (`overloaded_error`) and a create's other 5xx (`api_error`) are the API's
/// back-pressure: they wait, using no attempt (a create answered 5xx may have created its batch: the next attempt
/// looks before creating); other calls' 5xx are transient (a running batch is never given up on for them). 402 (`billing_error`) fails the job at once saying why, 413 splits, 404 is a batch
/// gone, any other 4xx a refusal.
pub(crate) fn from_reply(call: Call, http_status: u16, retry_after: Option<Duration>, body: &[u8]) -> ApiError {
    let envelope: Envelope = serde_json::from_slice(body).unwrap_or_default();
    let error = envelope.error.unwrap_or_default();
    let quoted = || {
        let text = String::from_utf8_lossy(body);
        let text: String = text.chars().filter(|c| !c.is_control()).take(MAX_QUOTED).collect();
        if text.is_empty() { format!("HTTP {http_status} without a body") } else { text }
    };
    let message: String = error
        .message
        .map(|message| message.chars().filter(|c| !c.is_control()).take(MAX_QUOTED).collect())
        .unwrap_or_else(quoted);
    let kind = match http_status {
        429 | 529 => ErrorKind::RateLimited,
        // A create answered 5xx: the API's back-pressure on work not yet at the API, a wait. Elsewhere (a poll, a
        // download) transient: a batch that exists is never given up on for it, and its polls back off.
        500.. if call == Call::Create => ErrorKind::RateLimited,
        402 => ErrorKind::Billing,
        413 => ErrorKind::TooLarge,
        404 => ErrorKind::NotFound,
        408 | 409 | 425 | 500.. => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    };
    let api_code = error.kind.map(|kind| ApiCode::Text(kind.chars().take(64).collect()));
    ApiError {
        kind,
        http_status: Some(http_status),
        api_code,
        message,
        retry_after,
        maybe_delivered: call == Call::Create && http_status >= 500,
    }
}

/// A 2xx reply that is not what the API documents.
pub(crate) fn unreadable(call: Call, http_status: u16, what: &str) -> ApiError {
    ApiError {
        kind: ErrorKind::Transient,
        http_status: Some(http_status),
        api_code: None,
        message: what.to_owned(),
        retry_after: None,
        maybe_delivered: call == Call::Create,
    }
}

/// A results download over `anthropic.max_reply_bytes`.
fn too_large(http_status: u16, bytes: u64, limit: usize) -> ApiError {
    ApiError {
        kind: ErrorKind::ReplyTooLarge,
        http_status: Some(http_status),
        api_code: None,
        message: format!(
            "the results are {bytes} bytes or more, over the limit of {limit} bytes (anthropic.max_reply_bytes); \
             raise the limit to read them"
        ),
        retry_after: None,
        maybe_delivered: false,
    }
}

/// The `custom_id` of the first line of a results body's head.
pub(crate) fn first_custom_id(head: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Head {
        /// The line's custom id.
        custom_id: String,
    }
    let line = head.split(|byte| *byte == b'\n').next()?;
    if let Ok(parsed) = serde_json::from_slice::<Head>(line) {
        return Some(parsed.custom_id);
    }
    // A line longer than what was read: take the custom id from its text (custom ids hold no quote or escape).
    let text = String::from_utf8_lossy(line);
    let at = text.find(r#""custom_id":""#)? + r#""custom_id":""#.len();
    let id: String = text[at..].chars().take_while(|c| *c != '"').take(65).collect();
    (text[at..].len() > id.len()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_what_the_engine_does() {
        let error = |status: u16, call: Call| {
            from_reply(call, status, None, br#"{"type":"error","error":{"type":"x","message":"m"}}"#)
        };
        assert_eq!(error(429, Call::Create).kind, ErrorKind::RateLimited);
        assert!(!error(429, Call::Create).maybe_delivered, "a 429 created nothing");
        assert_eq!(error(529, Call::Other).kind, ErrorKind::RateLimited, "overloaded: a wait, not an attempt");
        assert_eq!(error(500, Call::Create).kind, ErrorKind::RateLimited, "a create's api_error: a wait too");
        assert_eq!(error(503, Call::Create).kind, ErrorKind::RateLimited);
        assert_eq!(error(500, Call::Other).kind, ErrorKind::Transient, "a poll's backs off");
        assert_eq!(error(408, Call::Other).kind, ErrorKind::Transient);
        assert!(error(500, Call::Create).maybe_delivered, "a 500 on create may have created the batch");
        assert!(!error(500, Call::Other).maybe_delivered);
        assert_eq!(error(413, Call::Create).kind, ErrorKind::TooLarge);
        assert_eq!(error(404, Call::Other).kind, ErrorKind::NotFound);
        assert_eq!(error(402, Call::Create).kind, ErrorKind::Billing);
        for status in [400, 401, 403] {
            assert_eq!(error(status, Call::Create).kind, ErrorKind::Permanent, "{status}");
        }
        let limited = from_reply(
            Call::Create,
            429,
            Some(Duration::from_secs(3)),
            br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
        );
        assert_eq!(limited.retry_after, Some(Duration::from_secs(3)));
        assert_eq!(limited.api_code, Some(ApiCode::Text("rate_limit_error".into())));
        assert_eq!(limited.message, "slow down");
        let html = from_reply(Call::Other, 502, None, b"<html>\n\x07bad gateway</html>");
        assert_eq!(html.message, "<html>bad gateway</html>");
    }

    #[test]
    fn the_first_custom_id_is_read_from_a_whole_line_or_a_cut_one() {
        assert_eq!(first_custom_id(b"{\"custom_id\":\"b-1-0-1-0\",\"result\":{}}\n{}").as_deref(), Some("b-1-0-1-0"));
        assert_eq!(
            first_custom_id(br#"{"custom_id":"b-1-0-1-3","result":{"type":"succeeded","message":{"content":"#)
                .as_deref(),
            Some("b-1-0-1-3")
        );
        assert_eq!(first_custom_id(br#"{"custom_id":"b-1-0"#), None, "cut inside the id");
        assert_eq!(first_custom_id(b"garbage"), None);
    }
}
