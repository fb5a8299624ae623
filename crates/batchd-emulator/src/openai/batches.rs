//! The Batch endpoints: `POST /v1/batches`, `GET /v1/batches/{id}`, `GET /v1/batches?after=&limit=` (newest first,
//! cursor-paged) and `POST /v1/batches/{id}/cancel`, and the batch object they return.
//!
//! The create checks its parameters at once (unknown ones, `endpoint`, `completion_window`, `metadata` bounds);
//! the input file itself is validated later, in `validating` (see [`super::validation`]).

use std::{sync::Arc, time::Instant};

use axum::{
    extract::{Path, Request, State},
    response::Response,
};
use percent_encoding::percent_decode_str;
use serde_json::{Map, Value, json};

use super::{
    OpenAi,
    faults::OpenAiCallKind,
    http::{CallParts, OpenAiError, Reply, capped},
    lifecycle::{Batch, OpenAiTiming},
    results::ENDPOINTS,
    store::UnixClock,
};

/// Most `metadata` pairs.
const MAX_METADATA_PAIRS: usize = 16;
/// Longest `metadata` key, in characters.
const MAX_METADATA_KEY: usize = 64;
/// Longest `metadata` value, in characters.
const MAX_METADATA_VALUE: usize = 512;
/// Largest create body read (its parameters are a few kilobytes at most).
const MAX_CREATE_BODY_BYTES: usize = 64 * 1024;
/// `limit` of a list when absent.
const DEFAULT_LIST_LIMIT: usize = 20;
/// Largest `limit` of a list.
const MAX_LIST_LIMIT: usize = 100;
/// Bounds of `output_expires_after.seconds`: one hour to 30 days.
const OUTPUT_EXPIRY_SECONDS: std::ops::RangeInclusive<u64> = 3600..=2_592_000;

/// The batch object, as of `now`.
pub(crate) fn batch_json(clock: UnixClock, batch: &Batch, timing: &OpenAiTiming, now: Instant) -> Value {
    let at = |instant: Option<Instant>| instant.map(|instant| clock.unix_secs(instant));
    let created_at = clock.unix_secs(batch.created);
    let validated = batch.model.is_some();
    let tally = batch.tally(now, timing);
    let total = if validated { batch.requests.len() } else { 0 };
    let errors = (!batch.errors.is_empty()).then(|| json!({ "object": "list", "data": batch.errors }));
    let transitions = &batch.transitions;
    json!({
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model,
        "errors": errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status.as_str(),
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": created_at,
        "in_progress_at": at(transitions.in_progress),
        "expires_at": created_at.saturating_add(timing.completion_window.as_secs()),
        "finalizing_at": at(transitions.finalizing),
        "completed_at": at(transitions.completed),
        "failed_at": at(transitions.failed),
        "expired_at": at(transitions.expired),
        "cancelling_at": at(transitions.cancelling),
        "cancelled_at": at(transitions.cancelled),
        "request_counts": { "total": total, "completed": tally.completed, "failed": tally.failed },
        "usage": {
            "input_tokens": tally.input_tokens,
            "input_tokens_details": { "cached_tokens": 0 },
            "output_tokens": tally.output_tokens,
            "output_tokens_details": { "reasoning_tokens": 0 },
            "total_tokens": tally.input_tokens + tally.output_tokens,
        },
        "metadata": batch.metadata,
    })
}

/// The checked parameters of a create.
#[derive(Debug, Clone, PartialEq)]
struct CreateParams {
    /// `input_file_id`.
    input_file_id: String,
    /// `endpoint`, one of [`ENDPOINTS`].
    endpoint: String,
    /// `metadata`, when given and not null.
    metadata: Option<Map<String, Value>>,
    /// `output_expires_after.seconds`, when given.
    output_expires_in: Option<std::time::Duration>,
    /// `completion_window`, one the mount takes.
    completion_window: String,
}

/// A `completion_window` in hours (`48h` or `2d`), when it is spelled so.
fn window_hours(window: &str) -> Option<u64> {
    let (count, unit) = window.split_at(window.len().checked_sub(1)?);
    let count: u64 = count.parse().ok()?;
    match unit {
        "h" => Some(count),
        "d" => count.checked_mul(24),
        _ => None,
    }
}

fn missing(param: &str) -> OpenAiError {
    OpenAiError::invalid(
        format!("Missing required parameter: '{param}'."),
        Some(param),
        Some("missing_required_parameter"),
    )
}

fn invalid_value(param: &str, message: String) -> OpenAiError {
    OpenAiError::invalid(message, Some(param), Some("invalid_value"))
}

/// Checks a create's body; `max_window_hours` is the longest window the mount takes (OpenAI: 24).
fn parse_create(body: &[u8], max_window_hours: u64) -> Result<CreateParams, OpenAiError> {
    let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(body) else {
        return Err(OpenAiError::invalid(
            "We could not parse the JSON body of your request. The OpenAI API expects a JSON payload.",
            None,
            None,
        ));
    };
    const KNOWN: [&str; 5] = ["input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"];
    if let Some(unknown) = object.keys().find(|key| !KNOWN.contains(&key.as_str())) {
        return Err(OpenAiError::invalid(
            format!("Unrecognized request argument supplied: {}", capped(unknown)),
            None,
            None,
        ));
    }
    let Some(Value::String(input_file_id)) = object.remove("input_file_id") else {
        return Err(missing("input_file_id"));
    };
    let Some(Value::String(endpoint)) = object.remove("endpoint") else { return Err(missing("endpoint")) };
    if !ENDPOINTS.contains(&endpoint.as_str()) {
        return Err(invalid_value(
            "endpoint",
            format!("Invalid value: '{}'. Supported values are: {}.", capped(&endpoint), ENDPOINTS.join(", ")),
        ));
    }
    let taken = |window: &str| window_hours(window).is_some_and(|hours| (24..=max_window_hours).contains(&hours));
    let completion_window = match object.remove("completion_window") {
        Some(Value::String(window)) if taken(&window) => window,
        Some(other) => {
            let shown = capped(&other.to_string());
            let supported = if max_window_hours <= 24 {
                "'24h'".to_owned()
            } else {
                format!("'24h' to '{max_window_hours}h' (or whole days, '7d')")
            };
            return Err(invalid_value(
                "completion_window",
                format!("Invalid value: {shown}. Supported values are: {supported}."),
            ));
        }
        None => return Err(missing("completion_window")),
    };
    let metadata = match object.remove("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(metadata)) => Some(check_metadata(metadata)?),
        Some(_) => {
            return Err(invalid_value("metadata", "Invalid type for 'metadata': expected an object.".to_owned()));
        }
    };
    let mut output_expires_in = None;
    if let Some(expiry) = object.remove("output_expires_after") {
        let anchor_ok = expiry.get("anchor").and_then(Value::as_str) == Some("created_at");
        let seconds = expiry.get("seconds").and_then(Value::as_u64).filter(|s| OUTPUT_EXPIRY_SECONDS.contains(s));
        match seconds {
            Some(seconds) if anchor_ok => output_expires_in = Some(std::time::Duration::from_secs(seconds)),
            _ => {
                return Err(invalid_value(
                    "output_expires_after",
                    "'output_expires_after' needs anchor 'created_at' and seconds between 3600 and 2592000.".to_owned(),
                ));
            }
        }
    }
    Ok(CreateParams { input_file_id, endpoint, metadata, output_expires_in, completion_window })
}

fn check_metadata(metadata: Map<String, Value>) -> Result<Map<String, Value>, OpenAiError> {
    if metadata.len() > MAX_METADATA_PAIRS {
        return Err(invalid_value(
            "metadata",
            format!(
                "Invalid 'metadata': too many properties. Expected at most {MAX_METADATA_PAIRS}, got {}.",
                metadata.len()
            ),
        ));
    }
    for (key, value) in &metadata {
        if key.chars().count() > MAX_METADATA_KEY {
            return Err(invalid_value(
                "metadata",
                format!("Invalid 'metadata': key '{}' is longer than {MAX_METADATA_KEY} characters.", capped(key)),
            ));
        }
        let Value::String(text) = value else {
            return Err(invalid_value(
                "metadata",
                format!("Invalid 'metadata': the value of '{}' must be a string.", capped(key)),
            ));
        };
        if text.chars().count() > MAX_METADATA_VALUE {
            return Err(invalid_value(
                "metadata",
                format!(
                    "Invalid 'metadata': the value of '{}' is longer than {MAX_METADATA_VALUE} characters.",
                    capped(key)
                ),
            ));
        }
    }
    Ok(metadata)
}

/// `POST /v1/batches`.
pub(crate) async fn create(State(api): State<Arc<OpenAi>>, parts: CallParts, request: Request) -> Response {
    let mut call = match parts.admit(&api, OpenAiCallKind::CreateBatch).await {
        Ok(call) => call,
        Err(response) => return response,
    };
    // Every create that passes the key counts against the creation limit, as a gateway counts requests.
    if let Err(error) = api.admit_create() {
        call.add_fault("rate_limit");
        return call.end(&api, Err(error));
    }
    // The body is read only after the key is checked, and only up to a bound.
    let body = axum::body::to_bytes(request.into_body(), MAX_CREATE_BODY_BYTES).await.map_err(|_| {
        OpenAiError::invalid(
            format!("The request body is larger than {MAX_CREATE_BODY_BYTES} bytes or could not be read."),
            None,
            None,
        )
    });
    let outcome = body.and_then(|body| parse_create(&body, api.dialect.max_window_hours)).and_then(|params| {
        call.record.file_id = Some(capped(&params.input_file_id));
        let (view, fault_names) = api.create_batch(
            params.endpoint,
            params.input_file_id,
            params.metadata,
            params.output_expires_in,
            params.completion_window,
        )?;
        call.record.batch_id = view["id"].as_str().map(str::to_owned);
        for name in fault_names {
            call.add_fault(name);
        }
        Ok(Reply::Json(view))
    });
    parts.finish(&api, call, outcome).await
}

/// `GET /v1/batches/{id}`.
pub(crate) async fn get(State(api): State<Arc<OpenAi>>, parts: CallParts, Path(id): Path<String>) -> Response {
    let mut call = match parts.admit(&api, OpenAiCallKind::GetBatch).await {
        Ok(call) => call,
        Err(response) => return response,
    };
    call.record.batch_id = Some(capped(&id));
    let outcome = api.batch(&id).map(Reply::Json).ok_or_else(|| OpenAiError::not_found("Batch", &id, "batch_id"));
    parts.finish(&api, call, outcome).await
}

/// `after` and `limit` of a list.
fn parse_list_query(query: Option<&str>) -> Result<(Option<String>, usize), OpenAiError> {
    let mut after = None;
    let mut limit = DEFAULT_LIST_LIMIT;
    for (key, value) in query.unwrap_or("").split('&').filter_map(|pair| pair.split_once('=')) {
        let value = percent_decode_str(value).decode_utf8_lossy().into_owned();
        match key {
            "after" => after = Some(value),
            "limit" => {
                limit = value.parse::<usize>().ok().filter(|limit| (1..=MAX_LIST_LIMIT).contains(limit)).ok_or_else(
                    || {
                        invalid_value(
                            "limit",
                            format!("Invalid 'limit': expected an integer from 1 to {MAX_LIST_LIMIT}."),
                        )
                    },
                )?;
            }
            _ => {}
        }
    }
    Ok((after, limit))
}

/// `GET /v1/batches`.
pub(crate) async fn list(State(api): State<Arc<OpenAi>>, parts: CallParts) -> Response {
    let call = match parts.admit(&api, OpenAiCallKind::ListBatches).await {
        Ok(call) => call,
        Err(response) => return response,
    };
    let outcome = parse_list_query(parts.uri.query()).and_then(|(after, limit)| {
        let (page, has_more) = api.list_batches(after.as_deref(), limit).ok_or_else(|| {
            invalid_value("after", format!("Invalid 'after': no batch '{}'.", capped(after.as_deref().unwrap_or(""))))
        })?;
        let first_id = page.first().map(|batch| batch["id"].clone()).unwrap_or(Value::Null);
        let last_id = page.last().map(|batch| batch["id"].clone()).unwrap_or(Value::Null);
        Ok(Reply::Json(json!({
            "object": "list",
            "data": page,
            "first_id": first_id,
            "last_id": last_id,
            "has_more": has_more,
        })))
    });
    parts.finish(&api, call, outcome).await
}

/// `POST /v1/batches/{id}/cancel`.
pub(crate) async fn cancel(State(api): State<Arc<OpenAi>>, parts: CallParts, Path(id): Path<String>) -> Response {
    let mut call = match parts.admit(&api, OpenAiCallKind::CancelBatch).await {
        Ok(call) => call,
        Err(response) => return response,
    };
    call.record.batch_id = Some(capped(&id));
    let outcome = match api.cancel_batch(&id) {
        Ok(Some(view)) => Ok(Reply::Json(view)),
        Ok(None) => Err(OpenAiError::not_found("Batch", &id, "batch_id")),
        Err(status) => {
            Err(OpenAiError::invalid(format!("Cannot cancel a batch with status '{}'.", status.as_str()), None, None))
        }
    };
    parts.finish(&api, call, outcome).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(body: Value) -> Result<CreateParams, (Option<String>, String)> {
        parse_create(body.to_string().as_bytes(), 24).map_err(|error| (error.param, error.message))
    }

    fn valid() -> Value {
        json!({ "input_file_id": "file-1", "endpoint": "/v1/chat/completions", "completion_window": "24h" })
    }

    #[test]
    fn a_create_names_a_documented_endpoint_and_the_24h_window() {
        let params = create(valid()).expect("valid");
        assert_eq!((params.input_file_id.as_str(), params.endpoint.as_str()), ("file-1", "/v1/chat/completions"));
        let mut body = valid();
        body["endpoint"] = json!("/v1/audio/speech");
        assert_eq!(create(body).expect_err("refused").0.as_deref(), Some("endpoint"));
        let mut body = valid();
        body["completion_window"] = json!("48h");
        assert_eq!(create(body).expect_err("refused").0.as_deref(), Some("completion_window"));
        let mut body = valid();
        body["extra"] = json!(1);
        assert!(create(body).expect_err("refused").1.contains("Unrecognized request argument"));
    }

    #[test]
    fn a_groq_like_mount_takes_windows_from_24h_to_7d() {
        let groq = |window: &str| {
            let mut body = valid();
            body["completion_window"] = json!(window);
            parse_create(body.to_string().as_bytes(), 7 * 24).map(|params| params.completion_window)
        };
        for taken in ["24h", "48h", "2d", "7d", "168h"] {
            assert_eq!(groq(taken).expect(taken), taken);
        }
        for refused in ["12h", "8d", "169h", "1w", "h"] {
            let error = groq(refused).expect_err(refused);
            assert!(error.message.contains("'24h' to '168h'"), "{}", error.message);
        }
    }

    #[test]
    fn metadata_is_bounded() {
        let mut body = valid();
        let many: Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
        body["metadata"] = Value::Object(many);
        assert_eq!(create(body).expect_err("refused").0.as_deref(), Some("metadata"));
        let mut body = valid();
        body["metadata"] = json!({ "k".repeat(65): "v" });
        assert!(create(body).is_err());
        let mut body = valid();
        body["metadata"] = json!({ "k": "v".repeat(513) });
        assert!(create(body).is_err());
        let mut body = valid();
        body["metadata"] = json!({ "k".repeat(64): "v".repeat(512) });
        assert!(create(body).expect("at the bounds").metadata.is_some());
    }

    #[test]
    fn list_queries_are_bounded() {
        assert_eq!(parse_list_query(None).expect("defaults"), (None, DEFAULT_LIST_LIMIT));
        assert_eq!(parse_list_query(Some("after=batch_1&limit=100")).expect("ok"), (Some("batch_1".into()), 100));
        assert!(parse_list_query(Some("limit=0")).is_err());
        assert!(parse_list_query(Some("limit=101")).is_err());
    }
}
