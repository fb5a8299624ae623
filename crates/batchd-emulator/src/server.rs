//! HTTP routes: the emulated Workers AI run endpoint, the events queue (see [`crate::queue_api`]) and the
//! `/_emulator/` control API (see [`crate::control`]).
//!
//! The API is a fallback that parses the path itself, so that every unroutable URL gets
//! Cloudflare's 7003 envelope and the model (which contains slashes) is decoded segment by segment.
//!
//! The file is a little over 500 lines because it holds the run endpoint end to end (the path, every check in the
//! order Cloudflare makes them, submit and poll) with the envelopes and call-level faults the queue endpoints share.

use std::{sync::Arc, time::Duration};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{ConnectInfo, DefaultBodyLimit, State as AxumState},
    http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use percent_encoding::percent_decode_str;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::{
    calls::{CallKind, CallRecord},
    control,
    fault::{Endpoint, FaultKind, default_error_for_status},
    limits::retry_after_secs,
    listener::Connection,
    queue_api::{handle_queue_call, parse_queue_path},
    state::{BoolForm, Completion, Phase, PollOutcome, State, run_items},
};

pub(crate) type Shared = Arc<State>;

/// Prefix of every emulated API path.
pub(crate) const API_PREFIX: &str = "/client/v4";

/// The router of one emulator instance.
pub(crate) fn router(state: Shared) -> Router {
    let mounts = state
        .openai_mounts
        .iter()
        .fold(Router::new(), |router, (prefix, api)| router.merge(crate::openai::api_routes(prefix, Arc::clone(api))));
    let providers = Router::new()
        .merge(crate::anthropic::routes())
        .merge(crate::openai::router(Arc::clone(&state.openai)))
        .merge(mounts)
        .merge(crate::gemini::routes(Arc::clone(&state.gemini)))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&state), late_reply));
    Router::new()
        .merge(control::routes())
        .merge(providers)
        .fallback(api)
        // The emulator measures bodies itself, to answer 413 with Cloudflare's envelope.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// The random latency of the OpenAI, Anthropic and Gemini APIs, as the run endpoint has it: the call is handled (and
/// logged) first, then its reply waits, so a create's batch exists before its reply leaves. Control calls
/// (`/_emulator/...`) are answered at once.
async fn late_reply(
    AxumState(state): AxumState<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path();
    let api = path.starts_with(crate::openai::OPENAI_PREFIX)
        || path.starts_with(crate::anthropic::PATH_PREFIX)
        || path.starts_with(crate::gemini::PATH_PREFIX)
        || state.openai_mounts.iter().any(|(prefix, _)| path.starts_with(prefix.as_str()));
    let response = next.run(request).await;
    if api {
        let latency = state.draw_latency();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }
    response
}

/// An error reply with Cloudflare's envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub(crate) struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Envelope error code.
    pub code: i64,
    /// Envelope error message.
    pub message: String,
    /// Value of a `Retry-After` header in seconds; no header when `None`.
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: i64, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), retry_after_secs: None }
    }

    fn invalid_data(detail: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, 5004, format!("Invalid data: {detail}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = error_response(self.status, self.code, &self.message);
        if let Some(secs) = self.retry_after_secs {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

pub(crate) fn error_response(status: StatusCode, code: i64, message: &str) -> Response {
    let error =
        if code == NO_CODE { json!({ "message": message }) } else { json!({ "code": code, "message": message }) };
    let body = json!({
        "result": null,
        "success": false,
        "errors": [error],
        "messages": [],
    });
    (status, Json(body)).into_response()
}

/// A successful reply: its HTTP status, its `result`, and how its envelope writes `success: true`.
#[derive(Debug)]
struct Answer {
    /// HTTP status.
    status: StatusCode,
    /// The envelope's `result`.
    result: Success,
    /// `true` as documented, or `"true"`/`1` for an `odd_types` batch.
    success: BoolForm,
}

/// What a successful call returns as `result`.
#[derive(Debug)]
enum Success {
    /// A small object built per call (submit reply, pending poll).
    Value(Value),
    /// A done batch's completion, serialized here (it may be tens of megabytes).
    Completion(Arc<Completion>),
}

/// The success envelope around a `result`.
#[derive(Serialize)]
struct Envelope<'a, T: Serialize> {
    /// The call's result.
    result: &'a T,
    /// `true`, in the form the reply calls for.
    success: Value,
    /// Always empty.
    errors: [(); 0],
    /// Always empty.
    messages: [(); 0],
}

fn success_response(answer: Answer) -> Response {
    let success = answer.success.write(true);
    let rendered = match &answer.result {
        Success::Value(value) => serde_json::to_vec(&envelope(value, success)),
        Success::Completion(completion) => serde_json::to_vec(&envelope(completion.as_ref(), success)),
    };
    match rendered {
        Ok(body) => (answer.status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => {
            tracing::error!(%error, "serialize a reply");
            error_response(StatusCode::INTERNAL_SERVER_ERROR, 5001, "Internal error")
        }
    }
}

fn envelope<T: Serialize>(result: &T, success: Value) -> Envelope<'_, T> {
    Envelope { result, success, errors: [], messages: [] }
}

/// What the URL says: account and model, both percent-decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RunPath {
    /// Account id segment.
    account_id: String,
    /// The model, segments decoded and joined with `/`.
    model: String,
}

/// Parses `/client/v4/accounts/{account_id}/ai/run/{model...}`.
fn parse_run_path(path: &str) -> Option<RunPath> {
    let rest = path.strip_prefix(API_PREFIX)?.strip_prefix("/accounts/")?;
    let (account_id, rest) = rest.split_once('/')?;
    let model = rest.strip_prefix("ai/run/")?;
    let decode = |segment: &str| percent_decode_str(segment).decode_utf8_lossy().into_owned();
    let model = model.split('/').map(decode).collect::<Vec<_>>().join("/");
    if account_id.is_empty() || model.is_empty() {
        return None;
    }
    Some(RunPath { account_id: decode(account_id), model })
}

fn has_queue_request(uri: &Uri) -> bool {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .any(|(key, value)| key == "queueRequest" && value == "true")
}

/// One API call in progress: what is known so far, for the call log.
#[derive(Debug)]
struct Call {
    /// Log record, completed as the call is handled.
    record: CallRecord,
}

impl Call {
    /// Logs the call; `http_status` 0 means no reply was sent.
    fn finish(mut self, state: &State, http_status: u16, error_code: Option<i64>) {
        self.record.http_status = http_status;
        self.record.error_code = error_code;
        tracing::info!(
            kind = ?self.record.kind,
            model = %self.record.model,
            request_id = ?self.record.request_id,
            http_status = self.record.http_status,
            fault = ?self.record.fault,
            "api call"
        );
        state.record(self.record);
    }

    fn add_fault(&mut self, name: &str) {
        self.record.fault = Some(match self.record.fault.take() {
            Some(previous) => format!("{previous}+{name}"),
            None => name.to_owned(),
        });
    }
}

/// The reply a call-level fault gives instead of the real one.
#[derive(Debug)]
pub(crate) struct FaultReply {
    /// What the client gets.
    pub response: Response,
    /// HTTP status for the call log; 0 when the connection was reset.
    pub http_status: u16,
    /// Envelope error code for the call log.
    pub error_code: Option<i64>,
}

/// Applies the oldest injected call-level fault that hits a call to `endpoint` (or, when none does, a random one):
/// returns the fault's name and, unless the fault only delays the call, the reply that replaces the real one.
pub(crate) async fn call_fault(
    state: &State,
    connection: &Connection,
    endpoint: Endpoint,
) -> Option<(&'static str, Option<FaultReply>)> {
    // Injected faults first; only a call none of them hit can draw a random one.
    let (name, fault) = match state.take_call_fault(endpoint) {
        Some(fault) => (fault.name(), fault),
        None => {
            let random = state.draw_random_fault(endpoint)?;
            (random.name(), random.as_fault_kind())
        }
    };
    let reply = match fault {
        FaultKind::Delay { millis } => {
            tokio::time::sleep(Duration::from_millis(millis)).await;
            None
        }
        FaultKind::Reset => {
            tracing::info!(remote = %connection.remote, "resetting connection");
            connection.reset();
            let response = StatusCode::INTERNAL_SERVER_ERROR.into_response();
            Some(FaultReply { response, http_status: 0, error_code: None })
        }
        FaultKind::Status { status, code, message, retry_after_secs } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let (default_code, default_message) = default_error_for_status(status.as_u16());
            let code = code.unwrap_or(default_code);
            let mut response = error_response(status, code, &message.unwrap_or(default_message));
            if let Some(secs) = retry_after_secs {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            Some(FaultReply { response, http_status: status.as_u16(), error_code: Some(code) })
        }
        FaultKind::Html { status } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            let page = format!(
                "<html><body><h1>{} {}</h1></body></html>",
                status.as_u16(),
                status.canonical_reason().unwrap_or("Error")
            );
            let response = (status, [(header::CONTENT_TYPE, "text/html")], page).into_response();
            Some(FaultReply { response, http_status: status.as_u16(), error_code: None })
        }
        // Batch-level faults never sit in the call-level queue.
        _ => None,
    };
    Some((name, reply))
}

/// The emulated `POST /client/v4/accounts/{account_id}/ai/run/{model}`, or a call to the events queue.
async fn api(
    AxumState(state): AxumState<Shared>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(queue_path) = parse_queue_path(uri.path()) {
        return handle_queue_call(&state, &connection, &method, &headers, &body, queue_path).await;
    }
    if let Some(account_path) = crate::account_api::parse_account_path(uri.path()) {
        return crate::account_api::handle_account_call(
            &state,
            &connection,
            &method,
            &uri,
            &headers,
            &body,
            account_path,
        )
        .await;
    }
    let run_path = parse_run_path(uri.path());
    let body_bytes = body.len();
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    // Only the parsed body is needed from here on.
    drop(body);
    let object = parsed.as_ref().and_then(Value::as_object);
    let is_poll = object.is_some_and(|object| object.contains_key("request_id"));
    let mut call = Call {
        record: CallRecord {
            seq: 0,
            kind: if is_poll { CallKind::Poll } else { CallKind::Submit },
            model: run_path.as_ref().map(|path| path.model.clone()).unwrap_or_default(),
            account_id: run_path.as_ref().map(|path| path.account_id.clone()).unwrap_or_default(),
            request_id: object.and_then(|object| object.get("request_id")).and_then(Value::as_str).map(str::to_owned),
            http_status: 0,
            body_bytes,
            n_items: object.and_then(|object| object.get("requests")).and_then(Value::as_array).map(Vec::len),
            error_code: None,
            at_ms: 0,
            fault: None,
            first_reference: object
                .filter(|_| !is_poll)
                .and_then(|object| object.get("requests"))
                .and_then(Value::as_array)
                .and_then(|requests| requests.first())
                .and_then(|item| item.get("external_reference"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            port: connection.local.port(),
        },
    };
    if !is_poll {
        // A submit's request id is the one it creates, not one in its body.
        call.record.request_id = None;
    }

    let endpoint = if is_poll { Endpoint::Poll } else { Endpoint::Submit };
    if let Some((name, reply)) = call_fault(&state, &connection, endpoint).await {
        call.add_fault(name);
        if let Some(reply) = reply {
            call.finish(&state, reply.http_status, reply.error_code);
            return reply.response;
        }
    }

    let outcome = handle_run(&state, &method, &uri, &headers, body_bytes, run_path, parsed, &mut call);
    // The call is logged now: if the client goes away while the reply is late (below), the server drops this
    // future, and the batch a submit created must still be on record.
    match &outcome {
        Ok(answer) => call.finish(&state, answer.status.as_u16(), None),
        Err(error) => call.finish(&state, error.status.as_u16(), Some(error.code)),
    }
    // The work is done; only the reply is late (a submit's batch already exists).
    let latency = state.draw_latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    match outcome {
        Ok(answer) => match answer.result {
            // Serializing a large completion takes tens of milliseconds: keep it off the async workers.
            Success::Completion(_) => {
                tokio::task::spawn_blocking(move || success_response(answer)).await.unwrap_or_else(|error| {
                    tracing::error!(%error, "serialize a completion");
                    error_response(StatusCode::INTERNAL_SERVER_ERROR, 5001, "Internal error")
                })
            }
            Success::Value(_) => success_response(answer),
        },
        Err(error) => error.into_response(),
    }
}

/// Message of a 429 from the rate limit, as Cloudflare words its capacity errors.
const RATE_LIMITED_MESSAGE: &str = "Capacity temporarily exceeded, please try again.";

/// The envelope code that means "no code": [`error_response`] leaves `code` out of such an error.
pub(crate) const NO_CODE: i64 = i64::MIN;

/// Validates a run call and answers it as a submit or a poll.
#[allow(clippy::too_many_arguments)]
fn handle_run(
    state: &State,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body_bytes: usize,
    run_path: Option<RunPath>,
    parsed: Option<Value>,
    call: &mut Call,
) -> Result<Answer, ApiError> {
    let is_poll = call.record.kind == CallKind::Poll;
    call.record.kind = CallKind::Rejected;
    let config = &state.config;
    let limits = state.limits();

    let expected = format!("Bearer {}", config.token);
    let authorized = headers.get(header::AUTHORIZATION).is_some_and(|value| value.as_bytes() == expected.as_bytes());
    if !authorized {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, 10000, "Authentication error"));
    }
    let unroutable = || {
        let path = uri.path().strip_prefix(API_PREFIX).unwrap_or(uri.path());
        ApiError::new(
            StatusCode::NOT_FOUND,
            7003,
            format!("Could not route to {path}, perhaps your object identifier is invalid?"),
        )
    };
    let run_path = run_path.ok_or_else(unroutable)?;
    if run_path.account_id != config.account_id {
        return Err(unroutable());
    }
    if method != Method::POST {
        return Err(ApiError::new(StatusCode::METHOD_NOT_ALLOWED, 7001, "Method not allowed"));
    }
    if body_bytes >= limits.max_body_bytes {
        return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, 3006, "Request is too large"));
    }
    let family = config.family_of(&run_path.model).ok_or_else(|| {
        ApiError::new(StatusCode::BAD_REQUEST, 5007, format!("No such model {} or task", run_path.model))
    })?;
    if !is_poll && has_queue_request(uri) && state.is_unbatchable(&run_path.model) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            8007,
            format!("{} does not support request queuing", run_path.model),
        ));
    }
    if let Err(wait) = state.admit(&run_path.account_id, &run_path.model, is_poll) {
        call.record.kind = if is_poll { CallKind::Poll } else { CallKind::Submit };
        call.add_fault("rate_limit");
        return Err(ApiError {
            retry_after_secs: Some(retry_after_secs(wait)),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, 3040, RATE_LIMITED_MESSAGE)
        });
    }
    let Some(Value::Object(mut object)) = parsed else {
        return Err(ApiError::invalid_data("the request body must be a JSON object"));
    };

    if is_poll {
        let request_id = object
            .get("request_id")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid_data("request_id must be a string"))?;
        call.record.kind = CallKind::Poll;
        return poll(state, request_id);
    }

    let requests = match object.remove("requests") {
        Some(Value::Array(requests)) if !requests.is_empty() => requests,
        Some(Value::Array(_)) | None => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                3003,
                "Incomplete request: requests must be a non-empty array",
            ));
        }
        Some(_) => return Err(ApiError::invalid_data("requests must be an array")),
    };
    if let Some(max_items) = limits.max_items.filter(|&max| requests.len() > max) {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            3006,
            format!("Request is too large: {} items, the limit is {max_items}", requests.len()),
        ));
    }
    let items: Vec<Map<String, Value>> = requests
        .into_iter()
        .enumerate()
        .map(|(index, item)| match item {
            Value::Object(item) => Ok(item),
            _ => Err(ApiError::invalid_data(&format!("requests/{index} must be an object"))),
        })
        .collect::<Result<_, _>>()?;
    if !has_queue_request(uri) {
        return Err(ApiError::invalid_data(
            "a body with requests needs ?queueRequest=true (synchronous runs are not emulated)",
        ));
    }

    // The items run once, here: a strict submit is judged on these outputs, an accepted one keeps them.
    let runs = run_items(&run_path.model, family, items);
    if state.strict_items()
        && let Some((index, error)) =
            runs.iter().enumerate().find_map(|(index, run)| run.outcome.as_ref().err().map(|error| (index, error)))
    {
        let form = state.strict_refusal();
        let message = error.submit_message(index, form);
        return Err(ApiError::new(StatusCode::BAD_REQUEST, form.code.unwrap_or(NO_CODE), message));
    }

    let request_id = uuid::Uuid::new_v4().to_string();
    let plan = state.take_batch_plan();
    for name in &plan.fault_names {
        call.add_fault(name);
    }
    let success = BoolForm::of_submit_and_completion(plan.replies.odd_types);
    state.add_batch(&request_id, &run_path.model, runs, &plan);
    call.record.kind = CallKind::Submit;
    call.record.request_id = Some(request_id.clone());
    let status = StatusCode::from_u16(config.submit_status).unwrap_or(StatusCode::OK);
    let result = json!({ "status": "queued", "request_id": request_id, "model": run_path.model });
    Ok(Answer { status, result: Success::Value(result), success })
}

fn poll(state: &State, request_id: &str) -> Result<Answer, ApiError> {
    match state.poll(request_id) {
        PollOutcome::NotFound => Err(ApiError::new(StatusCode::NOT_FOUND, 7000, "Request not found")),
        PollOutcome::Failed => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, 5001, "Model execution failed")),
        PollOutcome::Pending(phase, replies) => {
            let status = match (&replies.pending_status, phase) {
                (Some(status), _) => status.as_str(),
                (None, Phase::Queued) => "queued",
                (None, _) => "running",
            };
            let mut result = json!({ "status": status, "request_id": request_id });
            if replies.empty_pending_list {
                result["responses"] = json!([]);
            }
            let success = BoolForm::of_pending_poll(replies.odd_types);
            Ok(Answer { status: StatusCode::OK, result: Success::Value(result), success })
        }
        PollOutcome::Done(completion) => {
            let success = BoolForm::of_submit_and_completion(completion.odd_types());
            Ok(Answer { status: StatusCode::OK, result: Success::Completion(completion), success })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_path_decodes_each_model_segment() {
        let path = parse_run_path("/client/v4/accounts/acc/ai/run/%40cf/baai/bge-m3").expect("routes");
        assert_eq!(path, RunPath { account_id: "acc".to_owned(), model: "@cf/baai/bge-m3".to_owned() });
        let path = parse_run_path("/client/v4/accounts/acc/ai/run/@cf/meta/m2m100-1.2b").expect("routes");
        assert_eq!(path.model, "@cf/meta/m2m100-1.2b");
        assert!(parse_run_path("/client/v4/accounts/acc/ai/run/").is_none());
        assert!(parse_run_path("/client/v4/accounts/acc/ai/models").is_none());
        assert!(parse_run_path("/other").is_none());
    }

    #[test]
    fn queue_request_is_read_from_the_query() {
        assert!(has_queue_request(&Uri::from_static("/x?queueRequest=true")));
        assert!(has_queue_request(&Uri::from_static("/x?a=b&queueRequest=true")));
        assert!(!has_queue_request(&Uri::from_static("/x?queueRequest=false")));
        assert!(!has_queue_request(&Uri::from_static("/x")));
    }
}
