//! The HTTP side of Gemini Batch Mode: one request per call (create, get, list, cancel, delete; the Files API's
//! resumable upload, download and delete), the `x-goog-api-key` header, replies read up to a limit (within the
//! memory budget for the big ones), and every failure classified into the engine's [`ErrorKind`] here, in one
//! place.

use std::time::Duration;

use batchd_core::ApiCode;
use batchd_provider::text::{LineSplitter, one_line};
use batchd_provider::{ApiError, ErrorKind, ReplyBudget, ReplyHold, http};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Method, Url};
use serde::Deserialize;

use crate::settings::{ApiKey, BuildError, GeminiSettings};

/// Largest reply of a call other than a finished batch or a download (an operation, a page of the list).
const MAX_SMALL_REPLY: usize = 4 * 1024 * 1024;

/// A big reply takes room in the memory budget this many bytes at a time.
const BUDGET_STEP: usize = 1024 * 1024;

/// Longest part of an error body quoted in a message, in characters.
const MAX_QUOTED: usize = 300;

/// The setting that bounds a finished batch or responses file.
const MAX_RESULT_SETTING: &str = "gemini.max_result_bytes";

/// Longest batch or file id batchd sends back in a path.
const MAX_ID_LEN: usize = 128;

/// Which call failed: it decides whether a failure may have created a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `POST models/{model}:batchGenerateContent`.
    Create,
    /// Any other call.
    Other,
}

/// Whether `name` is `{collection}/{id}` with an id the API gives (`[A-Za-z0-9_-]`), so it can be put in a path
/// as it is (the `:cancel` and `:download` verbs follow it).
pub fn is_resource(name: &str, collection: &str) -> bool {
    name.strip_prefix(collection).and_then(|rest| rest.strip_prefix('/')).is_some_and(|id| {
        !id.is_empty()
            && id.len() <= MAX_ID_LEN
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// Gemini Batch Mode over HTTP. Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct Client {
    /// The HTTP client: the settings' timeouts, no redirects.
    http: reqwest::Client,
    /// The key header every call to the API carries (marked sensitive).
    headers: HeaderMap,
    /// The base URL (`https://generativelanguage.googleapis.com`).
    base: Url,
    /// The key, to scrub from any error text a server echoes it in.
    key: ApiKey,
    /// The whole-request limit, quoted in timeout errors.
    request_timeout: Duration,
    /// Largest finished batch or responses file read.
    max_result_bytes: usize,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("base", &self.base.as_str()).finish_non_exhaustive()
    }
}

impl Client {
    /// Checks the settings and builds the client; nothing is sent yet.
    pub fn new(settings: &GeminiSettings) -> Result<Self, BuildError> {
        let base = http::base_url(&settings.base_url)
            .map_err(|reason| BuildError::InvalidBaseUrl { url: settings.base_url.clone(), reason })?;
        let mut headers = HeaderMap::new();
        headers.insert("x-goog-api-key", settings.api_key.header("").ok_or(BuildError::InvalidKey)?);
        let http = http::client(settings.request_timeout, settings.connect_timeout).map_err(BuildError::Http)?;
        Ok(Self {
            http,
            headers,
            base,
            key: settings.api_key.clone(),
            request_timeout: settings.request_timeout,
            max_result_bytes: settings.max_result_bytes,
        })
    }

    /// `{base}/{path}`: `path` is built by this crate from checked names only.
    fn url(&self, path: &str) -> Url {
        let mut url = self.base.clone();
        url.set_path(&format!("{}/{path}", self.base.path().trim_end_matches('/')));
        url
    }

    /// Creates a batch of `model` (a checked model id) from a body built by `wire`. A 404 (an unknown model, an
    /// input file gone) is a refusal of the create, not a batch whose results are gone.
    #[tracing::instrument(level = "debug", skip_all, fields(body_bytes = body.len()))]
    pub async fn create(&self, model: &str, body: Vec<u8>) -> Result<Vec<u8>, ApiError> {
        let url = self.url(&format!("v1beta/models/{model}:batchGenerateContent"));
        self.small(Call::Create, Method::POST, url, Some(body)).await.map_err(|error| match error.kind {
            ErrorKind::NotFound => ApiError { kind: ErrorKind::Permanent, ..error },
            _ => error,
        })
    }

    /// The operation of batch `name` (`batches/…`), read up to `max_result_bytes` within `budget` (a finished
    /// batch carries its inline responses).
    pub async fn get(&self, name: &str, budget: Option<&ReplyBudget>) -> Result<(Vec<u8>, Vec<ReplyHold>), ApiError> {
        let url = self.url(&format!("v1beta/{name}"));
        let mut reply = Vec::new();
        let held = self.stream(url, budget, |chunk| reply.extend_from_slice(chunk)).await?;
        Ok((reply, held))
    }

    /// A page of `page_size` batches, from `page_token` when given.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn list(&self, page_token: Option<&str>, page_size: u32) -> Result<Vec<u8>, ApiError> {
        let mut url = self.url("v1beta/batches");
        url.query_pairs_mut().append_pair("pageSize", &page_size.to_string());
        if let Some(token) = page_token {
            url.query_pairs_mut().append_pair("pageToken", token);
        }
        self.small(Call::Other, Method::GET, url, None).await
    }

    /// Asks for batch `name` to be cancelled.
    pub async fn cancel(&self, name: &str) -> Result<Vec<u8>, ApiError> {
        self.small(Call::Other, Method::POST, self.url(&format!("v1beta/{name}:cancel")), None).await
    }

    /// Deletes batch `name` or file `name` (`files/…`).
    pub async fn delete(&self, name: &str) -> Result<Vec<u8>, ApiError> {
        self.small(Call::Other, Method::DELETE, self.url(&format!("v1beta/{name}")), None).await
    }

    /// Uploads `content` as a JSONL file named `display_name` through the resumable protocol (start, then one
    /// upload-and-finalize); answers its name (`files/…`).
    #[tracing::instrument(level = "debug", skip_all, fields(bytes = content.len()))]
    pub async fn upload(&self, display_name: &str, content: Vec<u8>) -> Result<String, ApiError> {
        let start = self
            .http
            .post(self.url("upload/v1beta/files"))
            .headers(self.headers.clone())
            .header("x-goog-upload-protocol", "resumable")
            .header("x-goog-upload-command", "start")
            .header("x-goog-upload-header-content-length", content.len().to_string())
            .header("x-goog-upload-header-content-type", "application/jsonl")
            .header(CONTENT_TYPE, "application/json")
            .body(serde_json::json!({"file": {"displayName": display_name}}).to_string());
        let response = start.send().await.map_err(|error| self.transport(Call::Other, &error, None))?;
        let status = response.status().as_u16();
        let upload_url = response.headers().get("x-goog-upload-url").and_then(|value| value.to_str().ok());
        let upload_url = upload_url.and_then(|url| Url::parse(url).ok());
        if !(200..300).contains(&status) {
            let retry_after = http::retry_after(response.headers());
            let body = response.bytes().await.unwrap_or_default();
            return Err(self.scrub(from_reply(Call::Other, status, retry_after, &body)));
        }
        // The upload URL carries its own authorisation; the key goes only to the API's own origin.
        let Some(upload_url) = upload_url.filter(|url| same_origin(url, &self.base)) else {
            return Err(unreadable(Call::Other, status, "the upload start named no upload URL on the API's host"));
        };
        let send = self
            .http
            .post(upload_url)
            .headers(self.headers.clone())
            .header("x-goog-upload-command", "upload, finalize")
            .header("x-goog-upload-offset", "0")
            .body(content);
        let response = send.send().await.map_err(|error| self.transport(Call::Other, &error, None))?;
        let status = response.status().as_u16();
        let retry_after = http::retry_after(response.headers());
        let body = self.read_small(Call::Other, status, response).await?;
        if !(200..300).contains(&status) {
            return Err(self.scrub(from_reply(Call::Other, status, retry_after, &body)));
        }
        #[derive(Deserialize)]
        struct Uploaded {
            /// The file resource.
            file: Option<FileName>,
        }
        #[derive(Deserialize)]
        struct FileName {
            /// `files/…`.
            name: Option<String>,
        }
        let name = serde_json::from_slice::<Uploaded>(&body).ok().and_then(|uploaded| uploaded.file?.name);
        name.filter(|name| is_resource(name, "files"))
            .ok_or_else(|| unreadable(Call::Other, status, "the upload's reply names no file"))
    }

    /// Streams file `name`'s content (`files/…`) line by line into `line`, within `budget`; answers the room held.
    pub async fn download(
        &self,
        name: &str,
        budget: Option<&ReplyBudget>,
        mut line: impl FnMut(&[u8]),
    ) -> Result<Vec<ReplyHold>, ApiError> {
        let mut url = self.url(&format!("download/v1beta/{name}:download"));
        url.query_pairs_mut().append_pair("alt", "media");
        let mut lines = LineSplitter::default();
        let held = self.stream(url, budget, |chunk| lines.feed(chunk, &mut line)).await?;
        lines.finish(line);
        Ok(held)
    }

    /// A GET whose reply may be big: fed to `chunk` piece by piece, holding room in `budget` for what was read
    /// once it is past a small reply's 4 MiB (never waiting while holding room), refused past `max_result_bytes`.
    async fn stream(
        &self,
        url: Url,
        budget: Option<&ReplyBudget>,
        mut chunk: impl FnMut(&[u8]),
    ) -> Result<Vec<ReplyHold>, ApiError> {
        let mut response = self.send(Call::Other, Method::GET, url, None).await?;
        let http_status = response.status().as_u16();
        if !(200..300).contains(&http_status) {
            let retry_after = http::retry_after(response.headers());
            let body = self.read_small(Call::Other, http_status, response).await.unwrap_or_default();
            return Err(self.scrub(from_reply(Call::Other, http_status, retry_after, &body)));
        }
        if let Some(declared) = response.content_length().filter(|declared| *declared > self.max_result_bytes as u64) {
            return Err(ApiError::reply_over_limit(http_status, declared, self.max_result_bytes, MAX_RESULT_SETTING));
        }
        let (mut held, mut held_bytes, mut total) = (Vec::<ReplyHold>::new(), 0usize, 0usize);
        loop {
            let piece = match response.chunk().await {
                Ok(Some(piece)) => piece,
                Ok(None) => break,
                Err(error) => return Err(self.scrub(self.transport(Call::Other, &error, Some(http_status)))),
            };
            total += piece.len();
            if total > self.max_result_bytes {
                return Err(ApiError::reply_over_limit(
                    http_status,
                    total as u64,
                    self.max_result_bytes,
                    MAX_RESULT_SETTING,
                ));
            }
            // A reply as small as any other call's (a pending batch's status) takes no room: a poll never waits
            // behind a download for its few bytes.
            if let Some(budget) = budget.filter(|_| total > MAX_SMALL_REPLY) {
                budget.cover(&mut held, &mut held_bytes, total, BUDGET_STEP).await;
            }
            chunk(&piece);
        }
        Ok(held)
    }

    /// One request whose reply is small (at most 4 MiB): the reply body of a 2xx, the classified error otherwise.
    async fn small(&self, call: Call, method: Method, url: Url, body: Option<Vec<u8>>) -> Result<Vec<u8>, ApiError> {
        let response = self.send(call, method, url, body).await?;
        let http_status = response.status().as_u16();
        let retry_after = http::retry_after(response.headers());
        let reply = self.read_small(call, http_status, response).await?;
        if (200..300).contains(&http_status) {
            Ok(reply)
        } else {
            Err(self.scrub(from_reply(call, http_status, retry_after, &reply)))
        }
    }

    /// A reply's body, at most 4 MiB.
    async fn read_small(
        &self,
        call: Call,
        http_status: u16,
        mut response: reqwest::Response,
    ) -> Result<Vec<u8>, ApiError> {
        let mut reply = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) if reply.len() + chunk.len() > MAX_SMALL_REPLY => {
                    return Err(unreadable(call, http_status, "the reply is larger than 4 MiB"));
                }
                Ok(Some(chunk)) => reply.extend_from_slice(&chunk),
                Ok(None) => return Ok(reply),
                Err(error) => return Err(self.scrub(self.transport(call, &error, Some(http_status)))),
            }
        }
    }

    /// Sends a request; a reply of any status is returned, a transport failure classified.
    async fn send(
        &self,
        call: Call,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
    ) -> Result<reqwest::Response, ApiError> {
        let mut request = self.http.request(method, url).headers(self.headers.clone());
        if let Some(body) = body {
            request = request.header(CONTENT_TYPE, HeaderValue::from_static("application/json")).body(body);
        }
        request.send().await.map_err(|error| self.scrub(self.transport(call, &error, None)))
    }

    /// A transport failure: a create that may have been sent may have created its batch.
    fn transport(&self, call: Call, error: &reqwest::Error, http_status: Option<u16>) -> ApiError {
        http::transport_error(error, http_status, self.request_timeout, call == Call::Create)
    }

    /// Removes the key from an error's message, in case a server echoed it.
    fn scrub(&self, error: ApiError) -> ApiError {
        self.key.scrub(error)
    }
}

/// Whether two URLs share scheme, host and port.
fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme() && a.host_str() == b.host_str() && a.port_or_known_default() == b.port_or_known_default()
}

/// The google.rpc error envelope, read leniently.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Envelope {
    /// `{code, message, status}`.
    error: Option<EnvelopeError>,
}

/// The inner error.
#[derive(Deserialize, Default)]
#[serde(default)]
struct EnvelopeError {
    /// `INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED`, ...
    status: Option<String>,
    /// For people.
    message: Option<String>,
}

/// What a non-2xx reply means. 429 (`RESOURCE_EXHAUSTED`, seen on creates well below the quota) waits, using no
/// attempt; a payload over the inline limit (413, or 400 saying the size exceeds the limit) splits; 5xx, 408 and
/// 409 (`ABORTED`) retry (a create answered 5xx may have created its batch: the next attempt looks before
/// creating); 404 is a batch or file gone; any other 4xx a refusal (a bad key is Google's 400 `INVALID_ARGUMENT`).
pub(crate) fn from_reply(call: Call, http_status: u16, retry_after: Option<Duration>, body: &[u8]) -> ApiError {
    let envelope: Envelope = serde_json::from_slice(body).unwrap_or_default();
    let error = envelope.error.unwrap_or_default();
    let message = match error.message {
        Some(message) => one_line(&message, MAX_QUOTED),
        None if body.is_empty() => format!("HTTP {http_status} without a body"),
        None => one_line(&String::from_utf8_lossy(body), MAX_QUOTED),
    };
    let too_large = http_status == 413
        || (http_status == 400 && call == Call::Create && message.to_ascii_lowercase().contains("exceeds the limit"));
    let kind = match http_status {
        _ if too_large => ErrorKind::TooLarge,
        429 => ErrorKind::RateLimited,
        404 => ErrorKind::NotFound,
        408 | 409 | 425 => ErrorKind::Transient,
        500.. => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    };
    ApiError {
        kind,
        http_status: Some(http_status),
        api_code: error.status.map(|status| ApiCode::Text(one_line(&status, 64))),
        message,
        retry_after,
        maybe_delivered: call == Call::Create && http_status >= 500,
    }
}

/// A 2xx reply that is not what the API documents (a create's may have created its batch).
pub(crate) fn unreadable(call: Call, http_status: u16, what: &str) -> ApiError {
    ApiError::undocumented_reply(call == Call::Create, http_status, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_what_the_engine_does() {
        let error = |status: u16, call: Call, message: &str| {
            let body = serde_json::json!({"error": {"code": status, "message": message, "status": "X"}}).to_string();
            from_reply(call, status, None, body.as_bytes())
        };
        let limited = error(429, Call::Create, "Resource has been exhausted (e.g. check quota).");
        assert_eq!(limited.kind, ErrorKind::RateLimited, "a 429 on create is a wait");
        assert!(!limited.maybe_delivered, "a 429 created nothing");
        assert_eq!(limited.api_code, Some(ApiCode::Text("X".into())));
        assert!(error(500, Call::Create, "m").maybe_delivered, "a 500 on create may have created the batch");
        assert_eq!(error(503, Call::Other, "m").kind, ErrorKind::Transient);
        assert!(!error(503, Call::Other, "m").maybe_delivered);
        assert_eq!(error(404, Call::Other, "m").kind, ErrorKind::NotFound);
        let big = error(400, Call::Create, "Request payload size exceeds the limit: 20971520 bytes.");
        assert_eq!(big.kind, ErrorKind::TooLarge);
        assert_eq!(error(400, Call::Create, "API key not valid.").kind, ErrorKind::Permanent);
        assert_eq!(error(403, Call::Other, "m").kind, ErrorKind::Permanent);
        assert_eq!(
            from_reply(Call::Other, 502, None, b"<html>\n bad\x07 gateway</html>").message,
            "<html> bad gateway</html>"
        );
    }

    #[test]
    fn only_ids_the_api_gives_go_into_a_path() {
        assert!(is_resource("batches/abc-1_2", "batches"));
        assert!(is_resource("files/f1", "files"));
        for bad in ["batches/", "batches/a/b", "batches/a:cancel", "files/f1", "batches/../x", "batches/a?b"] {
            assert!(!is_resource(bad, "batches"), "{bad}");
        }
    }
}
