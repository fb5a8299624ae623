//! The HTTP side: one function per API call (upload, create, retrieve, list, cancel, delete a file, stream a
//! file's content), each sending one request and handing the reply to `error` or `wire`. Result files are read as
//! a stream, line by line into the join, counted against `max_result_bytes` and the engine's memory budget.
//! Uploads and result downloads go through the transfer client: timed by progress (`idle_timeout` without a byte
//! fails them), not by `request_timeout`.

use std::time::Duration;

use batchd_provider::text::LineSplitter;
use batchd_provider::{ApiError, ErrorKind, ReplyBudget, ReplyHold, http};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use serde::de::DeserializeOwned;

use crate::error::{self, Operation};
use crate::jsonl::Joiner;
use crate::settings::{ApiKey, KeyHeader, OpenAiBuildError, OpenAiClientSettings};
use crate::wire;

/// Largest JSON reply read (a batch object, a list page of 100 batches).
const MAX_JSON_REPLY: usize = 8 * 1024 * 1024;

/// A result file is counted in the memory budget this many bytes at a time.
const BUDGET_STEP: usize = 1024 * 1024;

/// Longest id batchd puts in a URL path.
const MAX_ID_LEN: usize = 256;

/// An OpenAI API client. Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub(crate) struct Client {
    /// The HTTP client (timeouts set, redirects off: one could carry the key elsewhere).
    http: reqwest::Client,
    /// The client of uploads and result downloads: no total limit, `idle_timeout` between bytes.
    transfer: reqwest::Client,
    /// The longest pause in a transfer, quoted in its timeout errors.
    idle_timeout: Duration,
    /// The base URL, `.../v1`.
    base: Url,
    /// The key, to scrub it from any text a server echoes.
    key: ApiKey,
    /// The key's header (`Authorization`, or Azure's `api-key`) and its value (`Bearer <key>`, or the key), marked
    /// sensitive.
    authorization: (HeaderName, HeaderValue),
    /// `OpenAI-Organization`, when configured.
    organization: Option<HeaderValue>,
    /// `OpenAI-Project`, when configured.
    project: Option<HeaderValue>,
    /// The whole-request limit, quoted in timeout errors.
    request_timeout: Duration,
    /// Largest result read (output and error files together): `max_result_bytes`, at most what the memory budget
    /// can hold ([`ReplyBudget::capacity`]).
    max_result_bytes: usize,
    /// Where result files are counted while they are read.
    budget: Option<ReplyBudget>,
    /// The full name of the result limit's setting (`openai.max_result_bytes`), for its error.
    result_setting: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("base", &self.base.as_str()).field("key", &self.key).finish_non_exhaustive()
    }
}

impl Client {
    /// Checks the settings and builds the client; nothing is sent.
    pub(crate) fn new(settings: &OpenAiClientSettings, budget: Option<ReplyBudget>) -> Result<Self, OpenAiBuildError> {
        let base = http::base_url(&settings.base_url)
            .map_err(|reason| OpenAiBuildError::InvalidBaseUrl { url: settings.base_url.clone(), reason })?;
        let (name, prefix) = match settings.key_header {
            KeyHeader::Authorization => (AUTHORIZATION, "Bearer "),
            KeyHeader::ApiKey => (HeaderName::from_static("api-key"), ""),
        };
        let value = settings.api_key.header(prefix).ok_or(OpenAiBuildError::InvalidHeader("api_key"))?;
        let authorization = (name, value);
        let header = |value: &Option<String>, what| match value.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(value) => HeaderValue::from_str(value).map(Some).map_err(|_| OpenAiBuildError::InvalidHeader(what)),
        };
        let organization = header(&settings.organization, "organization")?;
        let project = header(&settings.project, "project")?;
        let http = http::client(settings.request_timeout, settings.connect_timeout).map_err(OpenAiBuildError::Http)?;
        let transfer =
            http::transfer_client(settings.connect_timeout, settings.idle_timeout).map_err(OpenAiBuildError::Http)?;
        Ok(Self {
            http,
            transfer,
            idle_timeout: settings.idle_timeout,
            base,
            key: settings.api_key.clone(),
            authorization,
            organization,
            project,
            request_timeout: settings.request_timeout,
            // A result larger than the memory budget can hold fails `reply_too_large` rather than going over it.
            max_result_bytes: settings.max_result_bytes.min(budget.as_ref().map_or(usize::MAX, ReplyBudget::capacity)),
            budget,
            result_setting: settings.setting("max_result_bytes"),
        })
    }

    /// `POST /files` with a multipart body already built by [`multipart`]; the new file's id.
    pub(crate) async fn upload(&self, body: Vec<u8>, boundary: &str) -> Result<String, ApiError> {
        let request = self
            .transfer_request(Method::POST, &["files"])
            .timeout(http::upload_deadline(self.idle_timeout, body.len()))
            .header(CONTENT_TYPE, format!("multipart/form-data; boundary={boundary}"))
            .body(body);
        let file: wire::FileObject = self.json(Operation::Upload, request).await?;
        file.id.filter(|id| is_safe_id(id)).ok_or_else(|| {
            error::unreadable(Operation::Upload, 200, "the upload was answered without a usable file id", b"")
        })
    }

    /// `POST /batches`.
    pub(crate) async fn create(&self, create: &wire::CreateBatch<'_>) -> Result<wire::Batch, ApiError> {
        let request = self.request(Method::POST, &["batches"]).json(create);
        self.json(Operation::Create, request).await
    }

    /// `GET /batches/{id}`.
    pub(crate) async fn retrieve(&self, id: &str) -> Result<wire::Batch, ApiError> {
        let request = self.request(Method::GET, &["batches", checked(id)?]);
        self.json(Operation::Retrieve, request).await
    }

    /// `GET /batches?limit=100[&after=id]`: one page, newest first.
    pub(crate) async fn list(&self, after: Option<&str>) -> Result<wire::BatchList, ApiError> {
        let query = match after {
            Some(after) => format!("limit=100&after={}", checked(after)?),
            None => "limit=100".to_owned(),
        };
        let request = self.request_with_query(Method::GET, &["batches"], Some(&query));
        self.json(Operation::List, request).await
    }

    /// `POST /batches/{id}/cancel`.
    pub(crate) async fn cancel(&self, id: &str) -> Result<wire::Batch, ApiError> {
        let request = self.request(Method::POST, &["batches", checked(id)?, "cancel"]);
        self.json(Operation::Cancel, request).await
    }

    /// `DELETE /files/{id}`; a file that is already gone counts as deleted.
    pub(crate) async fn delete_file(&self, id: &str) -> Result<(), ApiError> {
        let request = self.request(Method::DELETE, &["files", checked(id)?]);
        match self.json::<serde_json::Value>(Operation::Delete, request).await {
            Ok(_) => Ok(()),
            Err(error) if error.kind == ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Streams `GET /files/{id}/content` line by line into `joiner`, within `max_result_bytes` (`already` bytes
    /// of an earlier file included) and the memory budget (`held` holds room for `held_bytes`, grown as needed);
    /// returns the bytes read.
    pub(crate) async fn stream_content(
        &self,
        id: &str,
        joiner: &mut Joiner,
        already: usize,
        held: &mut Vec<ReplyHold>,
        held_bytes: &mut usize,
    ) -> Result<usize, ApiError> {
        let request = self.transfer_request(Method::GET, &["files", checked(id)?, "content"]);
        let mut response = self.send(Operation::Content, request).await?;
        let status = response.status().as_u16();
        if !response.status().is_success() {
            return Err(self.error_reply(Operation::Content, response).await);
        }
        let (limit, setting) = (self.max_result_bytes, &self.result_setting);
        let too_large = |bytes: usize| ApiError {
            kind: ErrorKind::ReplyTooLarge,
            http_status: Some(status),
            api_code: None,
            message: format!(
                "the batch's result files are {bytes} bytes or more, over the limit of {limit} bytes \
                 ({setting}, at most workers.inflight_bytes / 3)"
            ),
            retry_after: None,
            maybe_delivered: false,
        };
        if let Some(declared) = response.content_length() {
            let declared = usize::try_from(declared).unwrap_or(usize::MAX);
            if already.saturating_add(declared) > limit {
                return Err(too_large(already.saturating_add(declared)));
            }
            // A declared length: its room is taken at once, so the download never waits again.
            if let Some(budget) = &self.budget {
                budget.cover(held, held_bytes, already + declared, BUDGET_STEP).await;
            }
        }
        let mut total = already;
        let mut lines = LineSplitter::default();
        while let Some(bytes) =
            response.chunk().await.map_err(|error| self.transport_error(Operation::Content, &error, Some(status)))?
        {
            total += bytes.len();
            if total > limit {
                return Err(too_large(total));
            }
            if let Some(budget) = &self.budget {
                budget.cover(held, held_bytes, total, BUDGET_STEP).await;
            }
            lines.feed(&bytes, |line| joiner.add_line(line));
        }
        lines.finish(|line| joiner.add_line(line));
        Ok(total - already)
    }

    /// A request to `{base}/{segments}` with the headers every call carries.
    fn request(&self, method: Method, segments: &[&str]) -> reqwest::RequestBuilder {
        self.request_with_query(method, segments, None)
    }

    /// [`Client::request`] on the transfer client (an upload, a results download).
    fn transfer_request(&self, method: Method, segments: &[&str]) -> reqwest::RequestBuilder {
        self.with_headers(self.transfer.request(method, self.url(segments, None)))
    }

    /// `{base}/{segments}?{query}`.
    fn url(&self, segments: &[&str], query: Option<&str>) -> Url {
        let mut url = self.base.clone();
        let path = format!("{}/{}", url.path().trim_end_matches('/'), segments.join("/"));
        url.set_path(&path);
        url.set_query(query);
        url
    }

    /// `request` with the headers every call carries.
    fn with_headers(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let (name, value) = &self.authorization;
        let mut request = request.header(name.clone(), value.clone());
        if let Some(organization) = &self.organization {
            request = request.header("OpenAI-Organization", organization.clone());
        }
        if let Some(project) = &self.project {
            request = request.header("OpenAI-Project", project.clone());
        }
        request
    }

    /// [`Client::request`] with a query string (built by the caller from checked ids only).
    fn request_with_query(&self, method: Method, segments: &[&str], query: Option<&str>) -> reqwest::RequestBuilder {
        self.with_headers(self.http.request(method, self.url(segments, query)))
    }

    async fn send(
        &self,
        operation: Operation,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ApiError> {
        request.send().await.map_err(|error| self.scrub(self.transport_error(operation, &error, None)))
    }

    /// Sends a request and reads its JSON reply (at most [`MAX_JSON_REPLY`] bytes).
    async fn json<T: DeserializeOwned>(
        &self,
        operation: Operation,
        request: reqwest::RequestBuilder,
    ) -> Result<T, ApiError> {
        let response = self.send(operation, request).await?;
        if !response.status().is_success() {
            return Err(self.error_reply(operation, response).await);
        }
        let status = response.status().as_u16();
        let body = self.read_small(operation, response).await?;
        serde_json::from_slice(&body).map_err(|_| {
            self.scrub(error::unreadable(operation, status, "the reply is not the documented JSON", &body))
        })
    }

    /// The error of a non-2xx reply.
    async fn error_reply(&self, operation: Operation, response: reqwest::Response) -> ApiError {
        let status = response.status().as_u16();
        let retry_after = http::retry_after(response.headers())
            // A day at most, whatever the server says: the engine's backoff caps it further.
            .map(|wait| wait.min(Duration::from_secs(86_400)));
        match self.read_small(operation, response).await {
            Ok(body) => self.scrub(error::from_reply(operation, status, retry_after, &body)),
            Err(mut error) => {
                error.http_status = Some(status);
                error.retry_after = retry_after;
                // Back-pressure stays a wait; any other error whose body could not be read is transient.
                if error::classify(operation, status, None) == ErrorKind::RateLimited {
                    error.kind = ErrorKind::RateLimited;
                }
                error
            }
        }
    }

    async fn read_small(&self, operation: Operation, mut response: reqwest::Response) -> Result<Vec<u8>, ApiError> {
        let status = response.status().as_u16();
        let mut body = Vec::new();
        while let Some(bytes) =
            response.chunk().await.map_err(|error| self.scrub(self.transport_error(operation, &error, Some(status))))?
        {
            if body.len() + bytes.len() > MAX_JSON_REPLY {
                return Err(error::unreadable(operation, status, "the reply is larger than any documented one", b""));
            }
            body.extend_from_slice(&bytes);
        }
        Ok(body)
    }

    /// Removes the key from an error's message, in case a server echoed it back.
    fn scrub(&self, error: ApiError) -> ApiError {
        self.key.scrub(error)
    }

    /// The error of a request that got no complete reply; a create that was sent may have worked.
    fn transport_error(&self, operation: Operation, error: &reqwest::Error, http_status: Option<u16>) -> ApiError {
        let creates = operation == Operation::Create;
        let error = if matches!(operation, Operation::Upload | Operation::Content) {
            http::transfer_error(error, http_status, self.idle_timeout, creates)
        } else {
            http::transport_error(error, http_status, self.request_timeout, creates)
        };
        ApiError { message: error::one_line(&error.message, error::MESSAGE_CHARS), ..error }
    }
}

/// The multipart body of an upload: `purpose` (OpenAI's `batch`; checked at build: a token without spaces) and the
/// JSONL file `file_name`, its lines written by `lines` straight into the body (so the file is built once). Returns
/// the body and its boundary.
pub(crate) fn multipart(
    purpose: &str,
    file_name: &str,
    expiry_secs: u64,
    capacity: usize,
    lines: impl FnOnce(&mut Vec<u8>),
) -> (Vec<u8>, String) {
    let boundary = format!("batchd-{}", uuid::Uuid::new_v4().simple());
    let mut body = Vec::with_capacity(capacity + 768);
    if expiry_secs > 0 {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"expires_after[anchor]\"\r\n\r\ncreated_at\r\n\
                 --{boundary}\r\nContent-Disposition: form-data; name=\"expires_after[seconds]\"\r\n\r\n{expiry_secs}\r\n"
            )
            .as_bytes(),
        );
    }
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n--{boundary}\r\n\
             Content-Disposition: form-data; name=\"file\"; filename=\"{file_name}\"\r\n\
             Content-Type: application/jsonl\r\n\r\n"
        )
        .as_bytes(),
    );
    lines(&mut body);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (body, boundary)
}

/// Whether an id the API gave can go into a URL path as it is: 1-256 of `[A-Za-z0-9_-]`.
pub(crate) fn is_safe_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn checked(id: &str) -> Result<&str, ApiError> {
    if is_safe_id(id) {
        Ok(id)
    } else {
        Err(error::local(ErrorKind::NotFound, "the recorded batch or file id is not one the API gives"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(is_safe_id("batch_abc-123") && is_safe_id("file-XYZ"));
        for bad in ["", "../x", "a/b", "a?b", "a b", &"a".repeat(257)] {
            assert!(!is_safe_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_multipart_body_holds_the_purpose_the_expiry_and_the_file() {
        let (body, boundary) =
            multipart("batch", "batchd-j-0.jsonl", 7200, 10, |out| out.extend_from_slice(b"{\"a\":1}\n"));
        let text = String::from_utf8(body).expect("utf-8");
        assert!(text.starts_with(&format!("--{boundary}\r\n")));
        assert!(text.contains("name=\"purpose\"\r\n\r\nbatch\r\n"));
        assert!(text.contains("name=\"expires_after[anchor]\"\r\n\r\ncreated_at\r\n"));
        assert!(text.contains("name=\"expires_after[seconds]\"\r\n\r\n7200\r\n"));
        let (none, _) = multipart("batch-api", "f.jsonl", 0, 10, |out| out.extend_from_slice(b"{}\n"));
        let none = String::from_utf8(none).expect("utf-8");
        assert!(!none.contains("expires_after"), "0: not sent");
        assert!(none.contains("name=\"purpose\"\r\n\r\nbatch-api\r\n"), "another vendor's purpose");
        assert!(
            text.contains("filename=\"batchd-j-0.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n{\"a\":1}\n\r\n")
        );
        assert!(text.ends_with(&format!("--{boundary}--\r\n")));
    }
}
