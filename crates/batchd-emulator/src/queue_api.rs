//! The Cloudflare Queues pull consumer endpoints of the events queue:
//! `POST /client/v4/accounts/{account_id}/queues/{queue_id}/messages/pull` and `.../messages/ack`.
//!
//! Checked in this order: call-level faults (`Calls::Pull`/`Ack`/`Queue`), token (401, code 10000), account (404,
//! 7003), queue (404, 10104; every queue id while events are off), method (405, 7001), body size (413, 3006), the
//! pull rate limit (429, 10250, `Retry-After`), then the body (400: 10208 not JSON, 10207 wrong shape, 10206
//! `batch_size` out of range). Every call is logged in the queue call log.

use std::time::Duration;

use axum::{
    http::{HeaderMap, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use percent_encoding::percent_decode_str;
use serde_json::{Map, Value, json};

use crate::{
    calls::{QueueCallKind, QueueCallRecord},
    events::AckWarnings,
    fault::Endpoint,
    limits::retry_after_secs,
    listener::Connection,
    server::{API_PREFIX, ApiError, call_fault},
    state::State,
};

/// `batch_size` of a pull that names none.
const DEFAULT_BATCH_SIZE: u64 = 5;
/// Largest `batch_size` a pull may ask for.
const MAX_BATCH_SIZE: u64 = 100;
/// `visibility_timeout_ms` of a pull that names none.
const DEFAULT_VISIBILITY_TIMEOUT_MS: u64 = 30_000;
/// Largest `visibility_timeout_ms` (12 hours).
const MAX_VISIBILITY_TIMEOUT_MS: u64 = 12 * 60 * 60 * 1000;
/// Largest `delay_seconds` of a retry (24 hours, Cloudflare's largest message delay).
const MAX_RETRY_DELAY_SECS: u64 = 24 * 60 * 60;
/// Most acks plus retries one ack call may carry (the live limit is unknown; this bounds the work and the warnings).
const MAX_ACK_ENTRIES: usize = 1000;
/// Longest `lease_id` accepted (ours are 38 characters); bounds what warnings echo back.
const MAX_LEASE_ID_CHARS: usize = 256;

/// Codes of the Queues API (from Cloudflare's Queues error-code table).
const QUEUE_NOT_FOUND: i64 = 10104;
/// Batch count out of bounds: `batch_size` not in `1..=100`.
const BATCH_COUNT_OUT_OF_BOUNDS: i64 = 10206;
/// The JSON body does not match the expected schema.
const BODY_INVALID: i64 = 10207;
/// The body is not JSON.
const BODY_MALFORMED: i64 = 10208;
/// Queue overloaded: the emulator's answer to a pull over the pull rate limit (the live code for that is unknown).
const QUEUE_OVERLOADED: i64 = 10250;

/// What a queue URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueuePath {
    /// Account id segment, percent-decoded.
    pub account_id: String,
    /// Queue id segment, percent-decoded.
    pub queue_id: String,
    /// Pull or ack.
    pub kind: QueueCallKind,
}

/// Parses `/client/v4/accounts/{account_id}/queues/{queue_id}/messages/{pull|ack}`.
pub(crate) fn parse_queue_path(path: &str) -> Option<QueuePath> {
    let rest = path.strip_prefix(API_PREFIX)?.strip_prefix("/accounts/")?;
    let segments: Vec<&str> = rest.split('/').collect();
    let [account_id, "queues", queue_id, "messages", action] = segments.as_slice() else {
        return None;
    };
    let kind = match *action {
        "pull" => QueueCallKind::Pull,
        "ack" => QueueCallKind::Ack,
        _ => return None,
    };
    if account_id.is_empty() || queue_id.is_empty() {
        return None;
    }
    let decode = |segment: &str| percent_decode_str(segment).decode_utf8_lossy().into_owned();
    Some(QueuePath { account_id: decode(account_id), queue_id: decode(queue_id), kind })
}

/// A pull's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PullRequest {
    /// Messages wanted, `1..=100`.
    batch_size: u64,
    /// Lease length in milliseconds.
    visibility_timeout_ms: u64,
}

/// An ack call's lease ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct AckRequest {
    /// Leases whose messages are done.
    acks: Vec<String>,
    /// Leases whose messages go back, each after its delay.
    retries: Vec<(String, Duration)>,
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, BODY_INVALID, message)
}

/// Parses a body as a JSON object; an empty body is `None`.
fn parse_object(body: &[u8]) -> Result<Option<Map<String, Value>>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(Some(object)),
        Ok(_) => Err(invalid("Request JSON body does not match expected schema: expected an object")),
        Err(_) => Err(ApiError::new(StatusCode::BAD_REQUEST, BODY_MALFORMED, "Request body is not valid JSON")),
    }
}

/// Reads an optional non-negative integer field (`null` is absent).
fn optional_u64(object: &Map<String, Value>, key: &str) -> Result<Option<u64>, ApiError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| invalid(format!("{key} must be a non-negative integer"))),
    }
}

/// Reads a pull body: both fields optional, unknown fields ignored (so the docs' `visibility_timeout` is ignored).
fn parse_pull(body: &[u8]) -> Result<PullRequest, ApiError> {
    let object = parse_object(body)?.unwrap_or_default();
    let batch_size = optional_u64(&object, "batch_size")?.unwrap_or(DEFAULT_BATCH_SIZE);
    if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            BATCH_COUNT_OUT_OF_BOUNDS,
            format!("Batch count out of bounds: batch_size must be between 1 and {MAX_BATCH_SIZE}, got {batch_size}"),
        ));
    }
    let visibility_timeout_ms =
        optional_u64(&object, "visibility_timeout_ms")?.unwrap_or(DEFAULT_VISIBILITY_TIMEOUT_MS);
    if visibility_timeout_ms > MAX_VISIBILITY_TIMEOUT_MS {
        return Err(invalid(format!(
            "visibility_timeout_ms must be at most {MAX_VISIBILITY_TIMEOUT_MS} (12 hours), got {visibility_timeout_ms}"
        )));
    }
    Ok(PullRequest { batch_size, visibility_timeout_ms })
}

/// Reads the `lease_id` of one ack or retry entry.
fn lease_id_of(entry: &Value, list: &str) -> Result<String, ApiError> {
    let lease_id = entry
        .get("lease_id")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("every entry of {list} needs a lease_id string")))?;
    if lease_id.chars().count() > MAX_LEASE_ID_CHARS {
        return Err(invalid(format!("lease_id longer than {MAX_LEASE_ID_CHARS} characters")));
    }
    Ok(lease_id.to_owned())
}

/// Reads an ack body: `acks` and `retries` optional (absent or `null`: none); a body is required.
fn parse_ack(body: &[u8]) -> Result<AckRequest, ApiError> {
    let Some(object) = parse_object(body)? else {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, BODY_MALFORMED, "Request body is not valid JSON"));
    };
    let list = |key: &str| -> Result<&[Value], ApiError> {
        match object.get(key) {
            None | Some(Value::Null) => Ok(&[]),
            Some(Value::Array(entries)) => Ok(entries.as_slice()),
            Some(_) => Err(invalid(format!("{key} must be an array"))),
        }
    };
    let (acks, retries) = (list("acks")?, list("retries")?);
    if acks.len() + retries.len() > MAX_ACK_ENTRIES {
        return Err(invalid(format!("at most {MAX_ACK_ENTRIES} acks and retries per request")));
    }
    let acks = acks.iter().map(|entry| lease_id_of(entry, "acks")).collect::<Result<Vec<_>, _>>()?;
    let retries = retries
        .iter()
        .map(|entry| {
            let lease_id = lease_id_of(entry, "retries")?;
            let delay_seconds = match entry.get("delay_seconds") {
                None | Some(Value::Null) => 0,
                Some(value) => value.as_u64().ok_or_else(|| invalid("delay_seconds must be a non-negative integer"))?,
            };
            if delay_seconds > MAX_RETRY_DELAY_SECS {
                return Err(invalid(format!("delay_seconds must be at most {MAX_RETRY_DELAY_SECS}")));
            }
            Ok((lease_id, Duration::from_secs(delay_seconds)))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(AckRequest { acks, retries })
}

/// The success envelope around `result`.
fn success(result: Value) -> Response {
    let body = json!({ "result": result, "success": true, "errors": [], "messages": [] });
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// Answers a pull or an ack and logs it in the queue call log.
pub(crate) async fn handle_queue_call(
    state: &State,
    connection: &Connection,
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
    path: QueuePath,
) -> Response {
    let mut record = QueueCallRecord {
        seq: 0,
        kind: path.kind,
        account_id: path.account_id.clone(),
        queue_id: path.queue_id.clone(),
        http_status: 0,
        error_code: None,
        at_ms: 0,
        fault: None,
        port: connection.local.port(),
        body_bytes: body.len(),
        batch_size: None,
        visibility_timeout_ms: None,
        message_ids: Vec::new(),
        ack_count: None,
        retry_count: None,
        n_warnings: None,
    };
    let endpoint = match path.kind {
        QueueCallKind::Pull => Endpoint::Pull,
        QueueCallKind::Ack => Endpoint::Ack,
    };
    if let Some((name, reply)) = call_fault(state, connection, endpoint).await {
        record.fault = Some(name.to_owned());
        if let Some(reply) = reply {
            finish(state, record, reply.http_status, reply.error_code);
            return reply.response;
        }
    }
    match answer(state, method, headers, body, &path, &mut record) {
        Ok(response) => {
            finish(state, record, StatusCode::OK.as_u16(), None);
            response
        }
        Err(error) => {
            finish(state, record, error.status.as_u16(), Some(error.code));
            error.into_response()
        }
    }
}

/// Logs a queue call.
fn finish(state: &State, mut record: QueueCallRecord, http_status: u16, error_code: Option<i64>) {
    record.http_status = http_status;
    record.error_code = error_code;
    tracing::info!(
        kind = ?record.kind,
        queue_id = %record.queue_id,
        http_status,
        n_messages = record.message_ids.len(),
        ack_count = ?record.ack_count,
        fault = ?record.fault,
        "queue call"
    );
    state.record_queue_call(record);
}

/// Checks a queue call and runs it.
fn answer(
    state: &State,
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
    path: &QueuePath,
    record: &mut QueueCallRecord,
) -> Result<Response, ApiError> {
    let events = state.events();
    let token = events.as_ref().and_then(|events| events.queue_token.as_deref()).unwrap_or(&state.config.token);
    let expected = format!("Bearer {token}");
    let authorized = headers.get(header::AUTHORIZATION).is_some_and(|value| value.as_bytes() == expected.as_bytes());
    if !authorized {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, 10000, "Authentication error"));
    }
    if path.account_id != state.config.account_id {
        let action = match path.kind {
            QueueCallKind::Pull => "pull",
            QueueCallKind::Ack => "ack",
        };
        let cut = |id: &str| id.chars().take(64).collect::<String>();
        let route = format!("/accounts/{}/queues/{}/messages/{action}", cut(&path.account_id), cut(&path.queue_id));
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            7003,
            format!("Could not route to {route}, perhaps your object identifier is invalid?"),
        ));
    }
    let Some(events) = events.filter(|events| events.queue_id == path.queue_id) else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, QUEUE_NOT_FOUND, "Queue does not exist"));
    };
    if method != Method::POST {
        return Err(ApiError::new(StatusCode::METHOD_NOT_ALLOWED, 7001, "Method not allowed"));
    }
    if body.len() >= state.limits().max_body_bytes {
        return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, 3006, "Request is too large"));
    }
    match path.kind {
        QueueCallKind::Pull => {
            if let Err(wait) = state.admit_pull() {
                record.fault = Some(match record.fault.take() {
                    Some(previous) => format!("{previous}+rate_limit"),
                    None => "rate_limit".to_owned(),
                });
                return Err(ApiError {
                    retry_after_secs: Some(retry_after_secs(wait)),
                    ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, QUEUE_OVERLOADED, "Queue is overloaded")
                });
            }
            let request = parse_pull(body)?;
            record.batch_size = Some(u32::try_from(request.batch_size).unwrap_or(u32::MAX));
            record.visibility_timeout_ms = Some(request.visibility_timeout_ms);
            let batch_size = usize::try_from(request.batch_size).unwrap_or(usize::MAX);
            let pulled = state.pull(batch_size, Duration::from_millis(request.visibility_timeout_ms));
            let messages: Vec<Value> = pulled
                .deliveries
                .iter()
                .map(|delivery| {
                    let (body, content_type) = events.body.render(&delivery.body);
                    json!({
                        "id": delivery.id,
                        "attempts": delivery.attempts,
                        "body": body,
                        "lease_id": delivery.lease_id,
                        "timestamp_ms": delivery.timestamp_ms,
                        "metadata": { "CF-Content-Type": content_type },
                    })
                })
                .collect();
            record.message_ids = pulled.deliveries.iter().map(|delivery| delivery.id.clone()).collect();
            let backlog = pulled.backlog;
            Ok(success(json!({
                "message_backlog_count": backlog.count,
                "messages": messages,
                "metadata": { "metrics": {
                    "backlog_count": backlog.count,
                    "backlog_bytes": backlog.bytes,
                    "oldest_message_timestamp_ms": backlog.oldest_timestamp_ms.unwrap_or(0),
                } },
            })))
        }
        QueueCallKind::Ack => {
            let request = parse_ack(body)?;
            let outcome = state.ack(&request.acks, &request.retries);
            let n_warnings = u32::try_from(outcome.refused.len()).unwrap_or(u32::MAX);
            record.ack_count = Some(outcome.ack_count);
            record.retry_count = Some(outcome.retry_count);
            record.n_warnings = Some(n_warnings);
            let warnings = match events.ack_warnings {
                AckWarnings::List => Value::Array(
                    outcome
                        .refused
                        .iter()
                        .map(|lease_id| {
                            Value::String(format!("lease {lease_id} is expired or unknown: message not acknowledged"))
                        })
                        .collect(),
                ),
                AckWarnings::Map => Value::Object(
                    outcome
                        .refused
                        .iter()
                        .map(|lease_id| (lease_id.clone(), Value::from("lease expired or unknown")))
                        .collect(),
                ),
            };
            Ok(success(json!({
                "ackCount": outcome.ack_count,
                "retryCount": outcome.retry_count,
                "warnings": warnings,
            })))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_paths_route() {
        let path = parse_queue_path("/client/v4/accounts/acc/queues/q-1/messages/pull").expect("routes");
        assert_eq!(path, QueuePath { account_id: "acc".into(), queue_id: "q-1".into(), kind: QueueCallKind::Pull });
        let path = parse_queue_path("/client/v4/accounts/acc/queues/q/messages/ack").expect("routes");
        assert_eq!(path.kind, QueueCallKind::Ack);
        assert!(parse_queue_path("/client/v4/accounts/acc/queues/q/messages/purge").is_none());
        assert!(parse_queue_path("/client/v4/accounts/acc/queues/q/messages").is_none());
        assert!(parse_queue_path("/client/v4/accounts/acc/queues//messages/pull").is_none());
        assert!(parse_queue_path("/client/v4/accounts/acc/ai/run/@cf/x").is_none());
    }

    #[test]
    fn pull_bodies() {
        assert_eq!(parse_pull(b"").expect("empty"), PullRequest { batch_size: 5, visibility_timeout_ms: 30_000 });
        assert_eq!(
            parse_pull(br#"{"batch_size":100,"visibility_timeout_ms":0,"visibility_timeout":9}"#).expect("ok"),
            PullRequest { batch_size: 100, visibility_timeout_ms: 0 }
        );
        assert_eq!(parse_pull(br#"{"batch_size":101}"#).expect_err("too big").code, BATCH_COUNT_OUT_OF_BOUNDS);
        assert_eq!(parse_pull(br#"{"batch_size":0}"#).expect_err("zero").code, BATCH_COUNT_OUT_OF_BOUNDS);
        assert_eq!(parse_pull(br#"{"batch_size":"5"}"#).expect_err("string").code, BODY_INVALID);
        assert_eq!(parse_pull(br#"{"visibility_timeout_ms":43200001}"#).expect_err("long").code, BODY_INVALID);
        assert_eq!(parse_pull(b"[1]").expect_err("array").code, BODY_INVALID);
        assert_eq!(parse_pull(b"{").expect_err("not json").code, BODY_MALFORMED);
    }

    #[test]
    fn ack_bodies() {
        let request = parse_ack(
            br#"{"acks":[{"lease_id":"a"}],"retries":[{"lease_id":"b","delay_seconds":10},{"lease_id":"c"}]}"#,
        )
        .expect("ok");
        assert_eq!(request.acks, ["a"]);
        assert_eq!(request.retries, [("b".to_owned(), Duration::from_secs(10)), ("c".to_owned(), Duration::ZERO)]);
        assert_eq!(parse_ack(b"{}").expect("empty object"), AckRequest::default());
        assert_eq!(parse_ack(b"").expect_err("no body").code, BODY_MALFORMED);
        assert_eq!(parse_ack(br#"{"acks":[{"id":"a"}]}"#).expect_err("no lease").code, BODY_INVALID);
        assert_eq!(parse_ack(br#"{"acks":{}}"#).expect_err("not a list").code, BODY_INVALID);
        let long = format!(r#"{{"acks":[{{"lease_id":"{}"}}]}}"#, "x".repeat(300));
        assert_eq!(parse_ack(long.as_bytes()).expect_err("long").code, BODY_INVALID);
        let many = format!(r#"{{"acks":[{}]}}"#, vec![r#"{"lease_id":"a"}"#; 1001].join(","));
        assert_eq!(parse_ack(many.as_bytes()).expect_err("many").code, BODY_INVALID);
    }
}
