//! The HTTP surface of the Anthropic emulator: `/anthropic/v1/messages/batches...`, its checks in order (injected
//! fault, `x-api-key`, `anthropic-version`, route, body size, body), the error envelope
//! `{"type":"error","error":{"type","message"},"request_id"}` and the call log.
//!
//! One catch-all route parses the path itself, so that every unknown path or method gets Anthropic's 404 envelope
//! rather than the Cloudflare emulator's.

use std::{collections::HashSet, time::SystemTime};

use axum::{
    Json,
    body::Body,
    extract::{ConnectInfo, Query, State as AxumState},
    http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{
    Anthropic, AnthropicConfig, ErrorShape, PATH_PREFIX,
    fault::{AnthropicCall, AnthropicCallKind, AnthropicFaultKind, take_fault},
    results::{Fate, Item, Outcome, render_results, run_item},
};
use crate::{listener::Connection, server::Shared};

/// Longest `custom_id` (and the longest piece of a caller's text an error message echoes).
const MAX_CUSTOM_ID_CHARS: usize = 64;

/// Page size of a list without `limit`, and the largest one allowed.
const DEFAULT_LIMIT: usize = 20;
const MAX_LIMIT: usize = 1000;

/// `retry-after` of a 429 that names none, in seconds.
const DEFAULT_RETRY_AFTER_SECS: u64 = 1;

/// The `error.type` the API uses for an HTTP status.
pub(crate) fn error_type_for(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        status if status >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// An error reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    /// HTTP status; the error type follows from it.
    status: u16,
    /// The error's message.
    message: String,
    /// Value of `retry-after` in seconds, if any.
    retry_after_secs: Option<u64>,
}

impl ApiError {
    fn new(status: u16, message: impl Into<String>) -> Self {
        let retry_after_secs = (status == 429).then_some(DEFAULT_RETRY_AFTER_SECS);
        Self { status, message: message.into(), retry_after_secs }
    }

    fn invalid(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    fn not_found(batch_id: &str) -> Self {
        Self::new(404, format!("No batch with id {}", capped(batch_id)))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let request_id = new_request_id();
        let body = json!({
            "type": "error",
            "error": { "type": error_type_for(self.status), "message": self.message },
            "request_id": request_id,
        });
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, Json(body)).into_response();
        let headers = response.headers_mut();
        if let Ok(value) = HeaderValue::from_str(&request_id) {
            headers.insert("request-id", value);
        }
        if let Some(secs) = self.retry_after_secs {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

fn new_request_id() -> String {
    format!("req_emu{}", &uuid::Uuid::new_v4().simple().to_string()[..24])
}

/// At most [`MAX_CUSTOM_ID_CHARS`] characters of a caller's text, for an error message.
fn capped(text: &str) -> String {
    let mut capped: String = text.chars().take(MAX_CUSTOM_ID_CHARS).collect();
    if capped.len() < text.len() {
        capped.push('…');
    }
    capped
}

/// Whether `custom_id` matches `^[a-zA-Z0-9_-]{1,64}$`.
pub(crate) fn is_valid_custom_id(custom_id: &str) -> bool {
    (1..=MAX_CUSTOM_ID_CHARS).contains(&custom_id.len())
        && custom_id.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
}

/// What a method and path (after `/anthropic`) name: the kind of call and its batch id.
pub(crate) fn parse_route(method: &Method, path: &str) -> (AnthropicCallKind, Option<String>) {
    let Some(rest) = path.strip_prefix("/v1/messages/batches") else {
        return (AnthropicCallKind::Unknown, None);
    };
    let segments: Vec<&str> = match rest.strip_prefix('/') {
        _ if rest.is_empty() => Vec::new(),
        Some(rest) => rest.split('/').collect(),
        None => return (AnthropicCallKind::Unknown, None),
    };
    if segments.iter().any(|segment| segment.is_empty()) {
        return (AnthropicCallKind::Unknown, None);
    }
    let kind = match (method.as_str(), segments.as_slice()) {
        ("POST", []) => AnthropicCallKind::Create,
        ("GET", []) => AnthropicCallKind::List,
        ("GET", [_]) => AnthropicCallKind::Retrieve,
        ("DELETE", [_]) => AnthropicCallKind::Delete,
        ("POST", [_, "cancel"]) => AnthropicCallKind::Cancel,
        ("GET", [_, "results"]) => AnthropicCallKind::Results,
        _ => return (AnthropicCallKind::Unknown, None),
    };
    let batch_id = segments.first().map(|id| (*id).to_owned());
    (kind, batch_id)
}

/// A successful reply, rendered once the lock is released.
#[derive(Debug)]
enum Reply {
    /// A JSON object with status 200.
    Json(Value),
    /// The results of an ended batch, as JSONL.
    Results {
        /// The batch.
        batch_id: String,
        /// Its items.
        items: std::sync::Arc<Vec<Item>>,
        /// How many of them ran.
        n_ran: usize,
        /// The fate of the others.
        rest: Fate,
        /// Whether the lines are shuffled.
        shuffle: bool,
        /// The shape of errored lines.
        shape: ErrorShape,
    },
}

impl Reply {
    async fn into_response(self) -> Response {
        match self {
            Reply::Json(value) => (StatusCode::OK, Json(value)).into_response(),
            Reply::Results { batch_id, items, n_ran, rest, shuffle, shape } => {
                // A 100,000-item body takes a while to write: keep it off the async workers.
                let rendered =
                    tokio::task::spawn_blocking(move || render_results(&batch_id, &items, n_ran, rest, shuffle, shape))
                        .await;
                match rendered {
                    Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/x-jsonl")], body).into_response(),
                    Err(error) => {
                        tracing::error!(%error, "render anthropic results");
                        ApiError::new(500, "Internal server error").into_response()
                    }
                }
            }
        }
    }
}

/// Every call under `/anthropic`.
pub(crate) async fn handle(
    AxumState(state): AxumState<Shared>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let path = uri.path().strip_prefix(PATH_PREFIX).unwrap_or(uri.path());
    let (kind, batch_id) = parse_route(&method, path);
    let mut record = AnthropicCall::arriving(kind, method.as_str(), path, connection.local.port());
    record.batch_id = batch_id.clone();
    let anthropic = &state.anthropic;
    let (fault, config) = {
        let mut inner = anthropic.lock();
        (take_fault(&mut inner.faults, kind), inner.config.clone())
    };
    record.fault = fault.as_ref().map(|fault| fault.name().to_owned());

    // Faults that hit before the call is handled.
    match &fault {
        Some(AnthropicFaultKind::Status { status, message, retry_after_secs }) => {
            let mut error = ApiError::new(*status, message.clone().unwrap_or_else(|| default_message(*status)));
            error.retry_after_secs = retry_after_secs.or(error.retry_after_secs);
            log_call(anthropic, record, Some(&error));
            return error.into_response();
        }
        Some(AnthropicFaultKind::Reset) => return drop_connection(anthropic, record, &connection),
        _ => {}
    }

    let error_items = match &fault {
        Some(AnthropicFaultKind::ErrorItems { indices, status }) => Some((indices.as_slice(), *status)),
        _ => None,
    };
    let call = Call {
        anthropic,
        config: &config,
        kind,
        batch_id: batch_id.as_deref(),
        uri: &uri,
        headers: &headers,
        error_items,
    };
    let outcome = call.handle(body, &connection, &mut record).await;

    // Faults that hit once the call took effect: only its reply is late or lost.
    match fault {
        Some(AnthropicFaultKind::StatusAfter { status, retry_after_secs }) => {
            let mut error = ApiError::new(status, default_message(status));
            error.retry_after_secs = retry_after_secs.or(error.retry_after_secs);
            log_call(anthropic, record, Some(&error));
            error.into_response()
        }
        Some(AnthropicFaultKind::ResetAfter) => drop_connection(anthropic, record, &connection),
        fault => {
            // Logged before any delay or hold: a client that gives up (or is killed) meanwhile drops this future,
            // and the call (with the batch a create made) must be on record.
            log_call(anthropic, record, outcome.as_ref().err());
            match fault {
                Some(AnthropicFaultKind::Delay { millis }) => {
                    tokio::time::sleep(std::time::Duration::from_millis(millis)).await;
                }
                Some(AnthropicFaultKind::Hold) => anthropic.holds.hold().await,
                _ => {}
            }
            match outcome {
                Ok(reply) => reply.into_response().await,
                Err(error) => error.into_response(),
            }
        }
    }
}

impl Anthropic {
    /// Admits one call under [`AnthropicConfig::rate_limit`]; `Err`: the 429 `rate_limit_error` to answer, with
    /// `retry-after` in whole seconds.
    fn admit_request(&self) -> Result<(), ApiError> {
        let mut inner = self.lock();
        let limit = inner.config.rate_limit;
        inner.requests.admit(limit, "requests", tokio::time::Instant::now()).map_err(|wait| ApiError {
            retry_after_secs: Some(crate::limits::retry_after_secs(wait)),
            ..ApiError::new(
                429,
                "Number of requests has exceeded your per-minute rate limit \
                 (https://docs.anthropic.com/en/api/rate-limits); see the response headers for current usage. Please \
                 reduce the number of requests you are sending or try again later.",
            )
        })
    }
}

/// Logs a call answered with `error`, or 200 without one.
fn log_call(anthropic: &Anthropic, mut record: AnthropicCall, error: Option<&ApiError>) {
    match error {
        None => record.status = 200,
        Some(error) => {
            record.status = error.status;
            record.error_type = Some(error_type_for(error.status).to_owned());
        }
    }
    tracing::info!(
        kind = ?record.kind,
        batch_id = ?record.batch_id,
        status = record.status,
        fault = ?record.fault,
        "anthropic call"
    );
    anthropic.lock().calls.push(record);
}

/// Resets the connection (the client gets no reply at all) and logs the call with status 0.
fn drop_connection(anthropic: &Anthropic, record: AnthropicCall, connection: &Connection) -> Response {
    tracing::info!(kind = ?record.kind, batch_id = ?record.batch_id, remote = %connection.remote, "anthropic reset");
    connection.reset();
    anthropic.lock().calls.push(record);
    StatusCode::INTERNAL_SERVER_ERROR.into_response()
}

fn default_message(status: u16) -> String {
    match status {
        429 => "Number of requests has exceeded your rate limit".to_owned(),
        529 => "Overloaded".to_owned(),
        413 => "Request exceeds the maximum allowed number of bytes".to_owned(),
        500 => "Internal server error".to_owned(),
        other => {
            StatusCode::from_u16(other).ok().and_then(|code| code.canonical_reason()).unwrap_or("Error").to_owned()
        }
    }
}

/// The client's base URL as it reached us, for `results_url`.
fn api_base(headers: &HeaderMap, connection: &Connection) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .map_or_else(|| connection.local.to_string(), str::to_owned);
    format!("http://{host}{PATH_PREFIX}")
}

/// One call being handled: what it names and the settings it sees.
struct Call<'a> {
    /// The emulator's state.
    anthropic: &'a Anthropic,
    /// Settings at the call's arrival.
    config: &'a AnthropicConfig,
    /// What the call is.
    kind: AnthropicCallKind,
    /// The batch its path names.
    batch_id: Option<&'a str>,
    /// Its URI (a list reads its query).
    uri: &'a Uri,
    /// Its headers.
    headers: &'a HeaderMap,
    /// An `error_items` fault: the items of a create that fail on the API's side, and the status of their error.
    error_items: Option<(&'a [usize], u16)>,
}

impl Call<'_> {
    /// The checks every call passes, then the call itself; a create writes its batch id and request count into
    /// `record`.
    async fn handle(&self, body: Body, connection: &Connection, record: &mut AnthropicCall) -> Result<Reply, ApiError> {
        let (config, headers) = (self.config, self.headers);
        let key_ok = headers.get("x-api-key").is_some_and(|value| value.as_bytes() == config.api_key.as_bytes());
        if !key_ok {
            return Err(ApiError::new(401, "invalid x-api-key"));
        }
        match headers.get("anthropic-version").map(|value| value.to_str().unwrap_or("")) {
            None => return Err(ApiError::invalid("anthropic-version: header is required")),
            Some(version) if !config.versions.iter().any(|known| known == version) => {
                return Err(ApiError::invalid(format!("anthropic-version: unknown version {}", capped(version))));
            }
            Some(_) => {}
        }
        if let Err(error) = self.anthropic.admit_request() {
            record.fault = Some("rate_limit".to_owned());
            return Err(error);
        }
        let api_base = api_base(headers, connection);
        let now = SystemTime::now();
        match (self.kind, self.batch_id) {
            (AnthropicCallKind::Create, _) => self.create(body, &api_base, record).await,
            (AnthropicCallKind::List, _) => self.list(now, &api_base),
            (AnthropicCallKind::Retrieve, Some(id)) => self.retrieve(id, now, &api_base),
            (AnthropicCallKind::Cancel, Some(id)) => self.cancel(id, now, &api_base),
            (AnthropicCallKind::Delete, Some(id)) => self.delete(id, now),
            (AnthropicCallKind::Results, Some(id)) => self.results(id, now),
            _ => Err(ApiError::new(404, "Not found")),
        }
    }

    /// `POST /v1/messages/batches`: checks the body as a whole, runs the items, stores the batch (created once
    /// the body is read).
    async fn create(&self, body: Body, api_base: &str, record: &mut AnthropicCall) -> Result<Reply, ApiError> {
        let body = read_body(self.headers, body, self.config.max_body_bytes).await?;
        let (mut items, param_names, first_user_id) = parse_create(&body, self.config.max_requests)?;
        if let Some((indices, status)) = self.error_items {
            for &index in indices {
                if let Some(item) = items.get_mut(index) {
                    let message = default_message(status);
                    item.outcome = Outcome::Errored { error_type: error_type_for(status), message };
                }
            }
        }
        drop(body);
        let n_requests = items.len();
        record.n_requests = Some(n_requests);
        record.first_custom_id = items.first().map(|item| item.custom_id.clone());
        record.first_user_id = first_user_id;
        record.param_names = param_names;
        let now = SystemTime::now();
        let mut inner = self.anthropic.lock();
        if let Some(max) = self.config.max_queued_requests {
            let queued = inner.batches.n_queued_requests(now, self.config);
            if queued + n_requests > max {
                return Err(ApiError::new(
                    429,
                    format!("Too many requests waiting in Message Batches: {queued} queued, the limit is {max}"),
                ));
            }
        }
        let batch = inner.batches.create(items, now);
        let id = batch.id.clone();
        let json = batch.to_json(now, self.config, api_base);
        record.batch_id = Some(id);
        Ok(Reply::Json(json))
    }

    /// `GET /v1/messages/batches`: a page, newest first.
    fn list(&self, now: SystemTime, api_base: &str) -> Result<Reply, ApiError> {
        let params =
            Query::<ListParams>::try_from_uri(self.uri).map_err(|_| ApiError::invalid("invalid query parameters"))?.0;
        let limit = match params.limit.as_deref() {
            None => DEFAULT_LIMIT,
            Some(text) => text
                .parse::<usize>()
                .ok()
                .filter(|limit| (1..=MAX_LIMIT).contains(limit))
                .ok_or_else(|| ApiError::invalid(format!("limit: must be between 1 and {MAX_LIMIT}")))?,
        };
        if params.before_id.is_some() && params.after_id.is_some() {
            return Err(ApiError::invalid("before_id and after_id cannot both be given"));
        }
        let mut inner = self.anthropic.lock();
        let page = inner
            .batches
            .page(params.before_id.as_deref(), params.after_id.as_deref(), limit, now, self.config)
            .map_err(|super::batches::ListError::UnknownCursor(name)| {
                ApiError::invalid(format!("{name}: no such batch"))
            })?;
        let data: Vec<Value> = page.batches.iter().map(|batch| batch.to_json(now, self.config, api_base)).collect();
        let first_id = page.batches.first().map(|batch| batch.id.clone());
        let last_id = page.batches.last().map(|batch| batch.id.clone());
        let json = json!({ "data": data, "has_more": page.has_more, "first_id": first_id, "last_id": last_id });
        Ok(Reply::Json(json))
    }

    /// `GET /v1/messages/batches/{id}`.
    fn retrieve(&self, id: &str, now: SystemTime, api_base: &str) -> Result<Reply, ApiError> {
        let mut inner = self.anthropic.lock();
        let batch = inner.batches.get(id, now, self.config).ok_or_else(|| ApiError::not_found(id))?;
        Ok(Reply::Json(batch.to_json(now, self.config, api_base)))
    }

    /// `POST /v1/messages/batches/{id}/cancel`.
    fn cancel(&self, id: &str, now: SystemTime, api_base: &str) -> Result<Reply, ApiError> {
        let mut inner = self.anthropic.lock();
        let batch = inner.batches.get(id, now, self.config).ok_or_else(|| ApiError::not_found(id))?;
        if !batch.cancel(now, self.config) {
            return Err(ApiError::invalid(format!("Batch {id} has already ended and cannot be canceled")));
        }
        Ok(Reply::Json(batch.to_json(now, self.config, api_base)))
    }

    /// `DELETE /v1/messages/batches/{id}`.
    fn delete(&self, id: &str, now: SystemTime) -> Result<Reply, ApiError> {
        let mut inner = self.anthropic.lock();
        match inner.batches.delete(id, now, self.config) {
            None => Err(ApiError::not_found(id)),
            Some(false) => Err(ApiError::invalid(format!(
                "Batch {id} cannot be deleted while it is processing; you must first cancel it"
            ))),
            Some(true) => Ok(Reply::Json(json!({ "id": id, "type": "message_batch_deleted" }))),
        }
    }

    /// `GET /v1/messages/batches/{id}/results`: what to render once the lock is released.
    fn results(&self, id: &str, now: SystemTime) -> Result<Reply, ApiError> {
        let mut inner = self.anthropic.lock();
        let batch = inner.batches.get(id, now, self.config).ok_or_else(|| ApiError::not_found(id))?;
        let Some(ended) = batch.ended() else {
            return Err(ApiError::new(404, format!("Batch {id} has not ended yet: no results to download")));
        };
        if batch.is_archived(now, self.config) {
            return Err(ApiError::new(404, format!("The results of batch {id} are no longer available")));
        }
        let reply = Reply::Results {
            batch_id: id.to_owned(),
            items: batch.items(),
            n_ran: ended.n_ran,
            rest: ended.rest,
            shuffle: self.config.shuffle_results,
            shape: self.config.error_shape,
        };
        Ok(reply)
    }
}

/// The query of a list call; `limit` is read as text so that a bad one gets the API's error.
#[derive(Debug, Deserialize)]
struct ListParams {
    /// Cursor: the page right before this batch (newer ones).
    before_id: Option<String>,
    /// Cursor: the page right after this batch (older ones).
    after_id: Option<String>,
    /// Page size, 1 to 1000.
    limit: Option<String>,
}

/// Reads a body of at most `max_bytes`; a longer one (by `content-length` or as it streams) is a 413.
async fn read_body(headers: &HeaderMap, body: Body, max_bytes: usize) -> Result<axum::body::Bytes, ApiError> {
    let too_large = || ApiError::new(413, format!("Request exceeds the maximum size of {max_bytes} bytes"));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<usize>().ok());
    if declared.is_some_and(|length| length > max_bytes) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, max_bytes).await.map_err(|_| too_large())
}

/// Checks a create's body: `requests` with 1 to `max_requests` items, each an object with a valid, unique
/// `custom_id` and an object `params`. The `params` themselves are checked later, item by item (see
/// [`run_item`]); the items run here. Also answers the names of the `params` members the requests had (for the
/// call log).
/// The requests, the names of their top-level `params` members (each once, sorted) and the first request's
/// `params.metadata.user_id` (at most 256 bytes), or why the body is refused.
pub(crate) type ParsedCreate = (Vec<Item>, Vec<String>, Option<String>);

pub(crate) fn parse_create(body: &[u8], max_requests: usize) -> Result<ParsedCreate, ApiError> {
    let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(body) else {
        return Err(ApiError::invalid("The request body is not a valid JSON object"));
    };
    let requests = match object.remove("requests") {
        Some(Value::Array(requests)) => requests,
        Some(_) => return Err(ApiError::invalid("requests: Input should be a valid list")),
        None => return Err(ApiError::invalid("requests: Field required")),
    };
    if requests.is_empty() {
        return Err(ApiError::invalid("requests: List should have at least 1 item"));
    }
    if requests.len() > max_requests {
        return Err(ApiError::invalid(format!(
            "requests: List should have at most {max_requests} items, not {}",
            requests.len()
        )));
    }
    let mut seen = HashSet::with_capacity(requests.len());
    let mut checked: Vec<(String, Map<String, Value>)> = Vec::with_capacity(requests.len());
    for (index, request) in requests.into_iter().enumerate() {
        let Value::Object(mut request) = request else {
            return Err(ApiError::invalid(format!("requests.{index}: Input should be an object")));
        };
        let custom_id = match request.remove("custom_id") {
            Some(Value::String(custom_id)) => custom_id,
            Some(_) => return Err(ApiError::invalid(format!("requests.{index}.custom_id: Input should be a string"))),
            None => return Err(ApiError::invalid(format!("requests.{index}.custom_id: Field required"))),
        };
        if !is_valid_custom_id(&custom_id) {
            return Err(ApiError::invalid(format!(
                "requests.{index}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$', got {}",
                capped(&custom_id)
            )));
        }
        let params = match request.remove("params") {
            Some(Value::Object(params)) => params,
            Some(_) => return Err(ApiError::invalid(format!("requests.{index}.params: Input should be an object"))),
            None => return Err(ApiError::invalid(format!("requests.{index}.params: Field required"))),
        };
        if !seen.insert(custom_id.clone()) {
            return Err(ApiError::invalid(format!(
                "requests.{index}.custom_id: {custom_id} is not unique within the batch"
            )));
        }
        checked.push((custom_id, params));
    }
    drop(seen);
    let first_user_id = checked
        .first()
        .and_then(|(_, params)| params.get("metadata")?.get("user_id")?.as_str().map(str::to_owned))
        .filter(|user_id| user_id.len() <= 256);
    let mut param_names = std::collections::BTreeSet::new();
    let items = checked
        .into_iter()
        .map(|(custom_id, params)| {
            let outcome = run_item(&custom_id, &params);
            for name in params.keys() {
                if !param_names.contains(name) {
                    param_names.insert(name.clone());
                }
            }
            Item { custom_id, outcome }
        })
        .collect();
    Ok((items, param_names.into_iter().collect(), first_user_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_read_from_method_and_path() {
        let cases = [
            (Method::POST, "/v1/messages/batches", AnthropicCallKind::Create, None),
            (Method::GET, "/v1/messages/batches", AnthropicCallKind::List, None),
            (Method::GET, "/v1/messages/batches/msgbatch_1", AnthropicCallKind::Retrieve, Some("msgbatch_1")),
            (Method::DELETE, "/v1/messages/batches/msgbatch_1", AnthropicCallKind::Delete, Some("msgbatch_1")),
            (Method::POST, "/v1/messages/batches/msgbatch_1/cancel", AnthropicCallKind::Cancel, Some("msgbatch_1")),
            (Method::GET, "/v1/messages/batches/msgbatch_1/results", AnthropicCallKind::Results, Some("msgbatch_1")),
            (Method::PUT, "/v1/messages/batches", AnthropicCallKind::Unknown, None),
            (Method::GET, "/v1/messages/batchesx", AnthropicCallKind::Unknown, None),
            (Method::GET, "/v1/messages", AnthropicCallKind::Unknown, None),
            (Method::GET, "/v1/messages/batches//results", AnthropicCallKind::Unknown, None),
            (Method::POST, "/v1/messages/batches/msgbatch_1/results", AnthropicCallKind::Unknown, None),
        ];
        for (method, path, kind, batch_id) in cases {
            assert_eq!(parse_route(&method, path), (kind, batch_id.map(str::to_owned)), "{method} {path}");
        }
    }

    #[test]
    fn custom_ids_follow_the_documented_pattern() {
        assert!(is_valid_custom_id("my-first_request-1"));
        assert!(is_valid_custom_id(&"a".repeat(64)));
        assert!(!is_valid_custom_id(&"a".repeat(65)));
        assert!(!is_valid_custom_id(""));
        assert!(!is_valid_custom_id("has space"));
        assert!(!is_valid_custom_id("dot.ted"));
        assert!(!is_valid_custom_id("é"));
    }

    #[test]
    fn the_status_table_is_the_documented_one() {
        let table = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (529, "overloaded_error"),
        ];
        for (status, error_type) in table {
            assert_eq!(error_type_for(status), error_type, "{status}");
        }
    }

    #[test]
    fn create_bodies_are_checked_as_a_whole_but_params_are_not() {
        let item = |id: &str| json!({ "custom_id": id, "params": {} });
        let body = |requests: Value| json!({ "requests": requests }).to_string().into_bytes();
        let (items, _, _) = parse_create(&body(json!([item("a"), item("b")])), 10).expect("accepted");
        assert_eq!(items.len(), 2, "empty params are accepted, to fail later as errored results");
        let refused = [
            body(json!([])),
            body(json!([item("a"), item("a")])),
            body(json!([item("bad id")])),
            body(json!([{ "custom_id": "a" }])),
            body(json!([item("a"), item("b"), item("c")])),
            b"not json".to_vec(),
        ];
        for body in refused {
            let error = parse_create(&body, 2).expect_err("refused");
            assert_eq!(error.status, 400, "{}", String::from_utf8_lossy(&body));
        }
    }
}
