//! The Batch API client: builds each request's URL and body, sends it, and hands the reply to `reply` (2xx) or
//! `error` (everything else), so this file holds I/O and nothing to decide.

use std::fmt;
use std::time::{Duration, Instant};

use batchd_core::{ModelName, RequestId};
use batchd_provider::{ReplyBudget, ReplyHold, http};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Url;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::value::RawValue;

use crate::error::{ApiError, Build as _, Operation};
use crate::reply::{PollStatus, Submitted, read_poll, read_submit};
use crate::settings::{ApiToken, ClientBuildError, ClientSettings, validate_account_id};
use crate::wire;

/// Bytes percent-encoded in a URL path segment: everything but RFC 3986 unreserved characters and `@` (a valid
/// path character that model scopes such as `@cf` start with, sent literally as Cloudflare's own clients do).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'@');

/// A reply without a declared length is counted as it arrives, this many bytes at a time.
const REPLY_STEP: usize = 1024 * 1024;

/// A Batch API client for one account. Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct BatchClient {
    /// Sends requests and reads replies.
    pub(crate) transport: Transport,
    /// `{base}/accounts/{account}`, the prefix of the catalog's URL.
    pub(crate) account_url: Url,
    /// `{base}/accounts/{account}/ai/run`, the prefix of every model URL.
    run_url: Url,
}

impl fmt::Debug for BatchClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchClient")
            .field("run_url", &self.run_url.as_str())
            .field("token", &self.transport.token)
            .field("request_timeout", &self.transport.request_timeout)
            .finish_non_exhaustive()
    }
}

/// What every request to the Cloudflare API shares: the HTTP client, the token, the limits. Cloning is cheap.
#[derive(Clone)]
pub(crate) struct Transport {
    /// The HTTP client, with the timeouts of the settings and redirects disabled.
    http: reqwest::Client,
    /// The token, kept to scrub it from any error text a server might echo it in.
    pub(crate) token: ApiToken,
    /// `Bearer <token>`, marked sensitive so HTTP-level debug output hides it.
    authorization: HeaderValue,
    /// The whole-request limit, quoted in timeout errors.
    pub(crate) request_timeout: Duration,
    /// Largest reply body read.
    max_reply_bytes: usize,
    /// Where poll replies are counted while they are read, if anywhere.
    reply_budget: Option<ReplyBudget>,
}

impl Transport {
    /// Checks the account id and token and builds the HTTP client; returns it with the account's base URL
    /// (`{base}/accounts/{account}`).
    pub(crate) fn new(settings: ClientSettings) -> Result<(Self, Url), ClientBuildError> {
        validate_account_id(&settings.account_id)?;
        let account_url = account_url(&settings.base_url, &settings.account_id)?;
        if settings.token.is_empty() {
            return Err(ClientBuildError::InvalidToken("must not be empty"));
        }
        let authorization = settings
            .token
            .header("Bearer ")
            .ok_or(ClientBuildError::InvalidToken("contains characters that cannot be sent in a header"))?;
        let http = http::client(settings.request_timeout, settings.connect_timeout).map_err(ClientBuildError::Http)?;
        let transport = Self {
            http,
            token: settings.token,
            authorization,
            request_timeout: settings.request_timeout,
            max_reply_bytes: settings.max_reply_bytes,
            reply_budget: None,
        };
        Ok((transport, account_url))
    }
}

impl BatchClient {
    /// The largest reply the client reads (`cloudflare.max_reply_bytes`).
    pub fn max_reply_bytes(&self) -> usize {
        self.transport.max_reply_bytes
    }

    /// Checks the settings and builds the client. Nothing is sent until the first submit or poll.
    pub fn new(settings: ClientSettings) -> Result<Self, ClientBuildError> {
        let (transport, account_url) = Transport::new(settings)?;
        let run_url = join(&account_url, &["ai", "run"]);
        Ok(Self { transport, account_url, run_url })
    }

    /// Counts every poll reply against the caller's memory budget while it is read: `hold(n)` waits for room for
    /// `n` bytes, `try_hold(n)` takes it only if free now; what they return holds the room until dropped. A reply
    /// that declares its length takes room for all of it before its first byte is read; one that does not takes
    /// room 1 MiB at a time as it arrives, and never waits while it holds room (short of room, it gives back what
    /// it holds and waits for the sum). [`BatchClient::poll_held`] hands the room to the caller, to drop once the
    /// reply is processed. Submit replies (a request id) are not counted.
    pub fn with_reply_budget(mut self, budget: ReplyBudget) -> Self {
        self.transport.reply_budget = Some(budget);
        self
    }

    /// Submits a batch: `POST {base}/accounts/{account}/ai/run/{model}?queueRequest=true` with body
    /// `{"requests":[...]}`, each request item sent byte for byte. Accepts any 2xx carrying a request id.
    #[tracing::instrument(level = "debug", skip_all, fields(model = %model, n_items = requests.len(), request_id = tracing::field::Empty))]
    pub async fn submit<R>(&self, model: &ModelName, requests: &[R]) -> Result<Submitted, ApiError>
    where
        R: std::borrow::Borrow<RawValue> + serde::Serialize,
    {
        // Sized exactly up front: the body can be nearly 10 MB, and a doubling Vec would reserve up to twice that.
        let mut body =
            Vec::with_capacity(wire::submit_body_bytes(requests.iter().map(|item| item.borrow().get().len())));
        serde_json::to_writer(&mut body, &wire::SubmitBody { requests }).expect("raw JSON items always serialise");
        let body_bytes = body.len();
        let url = model_url(&self.run_url, model);
        let result = self
            .transport
            .exchange_held(Operation::Submit, Request::post(url, body), false, |http_status, body| {
                read_submit(http_status, body, body_bytes)
            })
            .await
            .map(|(submitted, _)| submitted);
        match result {
            Ok(submitted) => {
                tracing::Span::current().record("request_id", submitted.request_id.as_str());
                tracing::debug!(body_bytes, "batch submitted");
                Ok(submitted)
            }
            Err(error) => {
                tracing::debug!(
                    body_bytes,
                    kind = %error.kind,
                    http_status = error.http_status,
                    api_code = ?error.api_code,
                    maybe_delivered = error.maybe_delivered,
                    error = %error,
                    "batch submit failed"
                );
                Err(error)
            }
        }
    }

    /// Asks for a batch's status: `POST` to the same model URL with body `{"request_id":"..."}`. `n_items` is the
    /// number of items submitted, to restore their order and detect missing ones.
    pub async fn poll(
        &self,
        model: &ModelName,
        request_id: &RequestId,
        n_items: usize,
    ) -> Result<PollStatus, ApiError> {
        self.poll_held(model, request_id, n_items).await.map(|(status, _)| status)
    }

    /// [`BatchClient::poll`], also returning the room the reply holds in the memory budget (see
    /// [`BatchClient::with_reply_budget`]; empty without one), for the caller to drop once it is done with the
    /// status.
    #[tracing::instrument(level = "debug", skip_all, fields(model = %model, request_id = %request_id))]
    pub async fn poll_held(
        &self,
        model: &ModelName,
        request_id: &RequestId,
        n_items: usize,
    ) -> Result<(PollStatus, Vec<ReplyHold>), ApiError> {
        let body = serde_json::to_vec(&wire::PollBody { request_id: request_id.as_str() })
            .expect("a string always serialises");
        let url = model_url(&self.run_url, model);
        let result = self
            .transport
            .exchange_held(Operation::Poll, Request::post(url, body), true, |http_status, body| {
                read_poll(http_status, body, n_items)
            })
            .await;
        match result {
            Ok((status, held)) => {
                let status_name = match &status {
                    PollStatus::Pending(pending) => pending.as_str(),
                    PollStatus::Done(_) => "done",
                };
                tracing::debug!(status = status_name, "batch polled");
                Ok((status, held))
            }
            Err(error) => {
                tracing::debug!(
                    kind = %error.kind,
                    http_status = error.http_status,
                    api_code = ?error.api_code,
                    error = %error,
                    "batch poll failed"
                );
                Err(error)
            }
        }
    }
}

/// One request to the Cloudflare API: a JSON `POST` (or `PATCH`) with its body, or a `GET`.
pub(crate) struct Request {
    /// The method.
    method: reqwest::Method,
    /// The URL, query included.
    url: Url,
    /// The JSON body; `None` for a `GET`.
    body: Option<Vec<u8>>,
}

impl Request {
    /// `POST url` with a JSON body.
    pub(crate) fn post(url: Url, body: Vec<u8>) -> Self {
        Self { method: reqwest::Method::POST, url, body: Some(body) }
    }

    /// `PATCH url` with a JSON body.
    pub(crate) fn patch(url: Url, body: Vec<u8>) -> Self {
        Self { method: reqwest::Method::PATCH, url, body: Some(body) }
    }

    /// `GET url`.
    pub(crate) fn get(url: Url) -> Self {
        Self { method: reqwest::Method::GET, url, body: None }
    }
}

impl Transport {
    /// Sends one request and reads its reply: a 2xx with `read`, anything else as an API error; the token is
    /// scrubbed from every error.
    pub(crate) async fn exchange<T>(
        &self,
        operation: Operation,
        request: Request,
        read: impl Fn(u16, &[u8]) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        self.exchange_held(operation, request, false, read).await.map(|(value, _)| value)
    }

    /// [`Transport::exchange`]; with `counted`, the reply is counted in the reply budget (if any) while it is read,
    /// and the room it holds is returned with what `read` made of it.
    async fn exchange_held<T>(
        &self,
        operation: Operation,
        request: Request,
        counted: bool,
        read: impl Fn(u16, &[u8]) -> Result<T, ApiError>,
    ) -> Result<(T, Vec<ReplyHold>), ApiError> {
        let budget = self.reply_budget.as_ref().filter(|_| counted);
        let result = match self.send(operation, request, budget).await {
            Ok((reply, held)) if reply.is_success() => reply.read(&self.token, read).map(|value| (value, held)),
            Ok((reply, _)) => Err(reply.into_error(operation, &self.token)),
            Err(error) => Err(error),
        };
        self.scrub(result)
    }

    /// Sends one request and reads the whole reply, up to `max_reply_bytes`: a reply that declares or sends more is
    /// refused before it is held. With `budget`, the reply's bytes are counted in it before they are held (see
    /// [`BatchClient::with_reply_budget`]), and the room is returned with the reply.
    async fn send(
        &self,
        operation: Operation,
        request: Request,
        budget: Option<&ReplyBudget>,
    ) -> Result<(Reply, Vec<ReplyHold>), ApiError> {
        let started = Instant::now();
        let transport_error = |error: reqwest::Error, status| {
            http::transport_error(&error, status, self.request_timeout, operation == Operation::Submit)
        };
        let mut builder =
            self.http.request(request.method, request.url).header(AUTHORIZATION, self.authorization.clone());
        if let Some(body) = request.body {
            builder = builder.header(CONTENT_TYPE, "application/json").body(body);
        }
        let mut response = builder.send().await.map_err(|error| transport_error(error, None))?;
        let http_status = response.status().as_u16();
        let retry_after = http::retry_after(response.headers());
        let limit = self.max_reply_bytes;
        let declared = response.content_length();
        if let Some(declared) = declared.filter(|declared| *declared > limit as u64) {
            return Err(ApiError::reply_too_large(operation, http_status, declared, limit));
        }
        let mut held: Vec<ReplyHold> = Vec::new();
        let mut held_bytes = 0;
        if let (Some(budget), Some(declared)) = (budget, declared) {
            held.push(budget.hold(declared as usize).await);
            held_bytes = declared as usize;
        }
        // Sized from the declared length when there is one (checked above), so a big result is not re-grown.
        let mut body = Vec::with_capacity(declared.map_or(0, |declared| declared as usize));
        while let Some(chunk) = response.chunk().await.map_err(|error| transport_error(error, Some(http_status)))? {
            if let Some(budget) = budget {
                budget.cover(&mut held, &mut held_bytes, body.len() + chunk.len(), REPLY_STEP).await;
            }
            if body.len() + chunk.len() > limit {
                return Err(ApiError::reply_too_large(
                    operation,
                    http_status,
                    (body.len() + chunk.len()) as u64,
                    limit,
                ));
            }
            body.extend_from_slice(&chunk);
        }
        tracing::debug!(
            http_status,
            reply_bytes = body.len(),
            elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "batch api replied"
        );
        Ok((Reply { http_status, retry_after, body }, held))
    }

    /// Removes the token from an error's message, in case a server echoed it back.
    fn scrub<T>(&self, result: Result<T, ApiError>) -> Result<T, ApiError> {
        result.map_err(|error| self.token.scrub(error))
    }
}

/// A complete HTTP reply.
struct Reply {
    /// The HTTP status.
    http_status: u16,
    /// `Retry-After`, when present and readable.
    retry_after: Option<Duration>,
    /// The body.
    body: Vec<u8>,
}

impl Reply {
    fn is_success(&self) -> bool {
        (200..300).contains(&self.http_status)
    }

    /// Reads a 2xx reply. The error of a reply that cannot be read quotes its body, so it is built from the body
    /// with the token taken out (replies that read fine, the common case, are not searched).
    fn read<T>(&self, token: &ApiToken, read: impl Fn(u16, &[u8]) -> Result<T, ApiError>) -> Result<T, ApiError> {
        read(self.http_status, &self.body).or_else(|_| read(self.http_status, &token.redact(&self.body)))
    }

    /// The error of a non-2xx reply, built from the body with the token taken out.
    fn into_error(self, operation: Operation, token: &ApiToken) -> ApiError {
        ApiError::from_reply(operation, self.http_status, self.retry_after, &token.redact(&self.body))
    }
}

/// `{base}/accounts/{account}` from a base URL that must be absolute `http(s)` without query, fragment or
/// credentials, and an already validated account id.
fn account_url(base_url: &str, account_id: &str) -> Result<Url, ClientBuildError> {
    let mut url = http::base_url(base_url)
        .map_err(|reason| ClientBuildError::InvalidBaseUrl { url: base_url.to_owned(), reason })?;
    let path = format!("{}/accounts/{}", url.path().trim_end_matches('/'), utf8_percent_encode(account_id, SEGMENT));
    url.set_path(&path);
    Ok(url)
}

/// `url` with each of `segments` appended as a percent-encoded path segment.
pub(crate) fn join(url: &Url, segments: &[&str]) -> Url {
    http::join(url, segments, SEGMENT)
}

/// `{run_url}/{model segments, each percent-encoded}?queueRequest=true`.
fn model_url(run_url: &Url, model: &ModelName) -> Url {
    let segments: Vec<&str> = model.segments().collect();
    let mut url = join(run_url, &segments);
    url.set_query(Some("queueRequest=true"));
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str) -> ModelName {
        ModelName::parse(name).expect("should succeed")
    }

    fn run_url(base_url: &str, account_id: &str) -> Url {
        join(&account_url(base_url, account_id).expect("should succeed"), &["ai", "run"])
    }

    #[test]
    fn model_urls_keep_the_model_path() {
        let run = run_url("https://api.cloudflare.com/client/v4", "023e105f4ecef8ad9ca31a8372d0c353");
        assert_eq!(
            model_url(&run, &model("@cf/baai/bge-m3")).as_str(),
            "https://api.cloudflare.com/client/v4/accounts/023e105f4ecef8ad9ca31a8372d0c353/ai/run/@cf/baai/bge-m3?queueRequest=true"
        );
        assert_eq!(
            model_url(&run, &model("@cf/meta/llama-3.3-70b-instruct-fp8-fast")).path(),
            "/client/v4/accounts/023e105f4ecef8ad9ca31a8372d0c353/ai/run/@cf/meta/llama-3.3-70b-instruct-fp8-fast"
        );
        let local = run_url("http://127.0.0.1:8787/", "acct");
        assert_eq!(
            model_url(&local, &model("@hf/thebloke/x_1.5")).as_str(),
            "http://127.0.0.1:8787/accounts/acct/ai/run/@hf/thebloke/x_1.5?queueRequest=true"
        );
        let trailing = run_url("https://example.test/client/v4/", "acct");
        assert_eq!(trailing.as_str(), "https://example.test/client/v4/accounts/acct/ai/run");
    }

    #[test]
    fn segments_are_percent_encoded() {
        let encoded: String = utf8_percent_encode("a/b?c#d%e f@g", SEGMENT).collect();
        assert_eq!(encoded, "a%2Fb%3Fc%23d%25e%20f@g");
    }

    #[test]
    fn base_urls_are_validated() {
        for bad in [
            "",
            "api.cloudflare.com/client/v4",
            "ftp://api.cloudflare.com",
            "https://api.cloudflare.com/client/v4?x=1",
            "https://api.cloudflare.com/client/v4#f",
            "https://user:pw@api.cloudflare.com/client/v4",
            "mailto:someone@example.com",
        ] {
            assert!(
                matches!(account_url(bad, "acct"), Err(ClientBuildError::InvalidBaseUrl { .. })),
                "{bad:?} should be refused"
            );
        }
    }
}
