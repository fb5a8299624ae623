//! The account-level endpoints beside the run endpoint: the model catalog (`GET /client/v4/accounts/{account}/
//! ai/models/search`, paged) and event subscriptions (`GET`/`POST /client/v4/accounts/{account}/
//! event_subscriptions/subscriptions`, `PATCH`/`DELETE .../subscriptions/{id}`).
//!
//! Written from Cloudflare's API reference and SDKs (docs/batch-api.md, "The model catalog" and "Event
//! subscriptions"): the catalog lists every model the emulator knows with its task (`Text Generation`, `Text
//! Embeddings`, `Translation`, `Automatic Speech Recognition`) and `async_queue` unless the model refuses queued
//! requests (8007); subscriptions deliver a model's batch events to the events queue. Checked in this order:
//! call-level faults (`Calls::Catalog`, `Calls::Subscriptions`), token (401, 10000), account (404, 7003), method
//! (405, 7001), then the body (400).

use axum::{
    http::{HeaderMap, Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use percent_encoding::percent_decode_str;
use serde_json::{Map, Value, json};

use crate::{
    config::Family,
    fault::Endpoint,
    listener::Connection,
    server::{API_PREFIX, ApiError, call_fault},
    state::State,
    subscriptions::{QUEUE_DESTINATION, WORKERS_AI_EVENTS, WORKERS_AI_SOURCE},
};

/// `per_page` of a catalog or list call that names none.
const DEFAULT_PER_PAGE: usize = 100;
/// Largest `per_page` served.
const MAX_PER_PAGE: usize = 1000;
/// Code of a subscription body the emulator refuses (the live code is unknown).
const SUBSCRIPTION_INVALID: i64 = 10207;
/// Code of an unknown subscription id.
const SUBSCRIPTION_NOT_FOUND: i64 = 10104;

/// What an account URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AccountPath {
    /// `ai/models/search`.
    Catalog {
        /// The account id segment.
        account_id: String,
    },
    /// `event_subscriptions/subscriptions[/{id}]`.
    Subscriptions {
        /// The account id segment.
        account_id: String,
        /// The subscription id segment, if any.
        id: Option<String>,
    },
}

/// Parses the catalog and subscriptions paths.
pub(crate) fn parse_account_path(path: &str) -> Option<AccountPath> {
    let rest = path.strip_prefix(API_PREFIX)?.strip_prefix("/accounts/")?;
    let decode = |segment: &str| percent_decode_str(segment).decode_utf8_lossy().into_owned();
    let segments: Vec<&str> = rest.split('/').collect();
    match segments.as_slice() {
        [account, "ai", "models", "search"] if !account.is_empty() => {
            Some(AccountPath::Catalog { account_id: decode(account) })
        }
        [account, "event_subscriptions", "subscriptions"] if !account.is_empty() => {
            Some(AccountPath::Subscriptions { account_id: decode(account), id: None })
        }
        [account, "event_subscriptions", "subscriptions", id] if !account.is_empty() && !id.is_empty() => {
            Some(AccountPath::Subscriptions { account_id: decode(account), id: Some(decode(id)) })
        }
        _ => None,
    }
}

/// Answers a catalog or subscriptions call.
pub(crate) async fn handle_account_call(
    state: &State,
    connection: &Connection,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    path: AccountPath,
) -> Response {
    let endpoint = match path {
        AccountPath::Catalog { .. } => Endpoint::Catalog,
        AccountPath::Subscriptions { .. } => Endpoint::Subscriptions,
    };
    if let Some((name, Some(reply))) = call_fault(state, connection, endpoint).await {
        tracing::info!(fault = name, ?endpoint, "account call faulted");
        return reply.response;
    }
    let answer = match path {
        AccountPath::Catalog { account_id } => {
            check(state, headers, &account_id, method, &Method::GET).and_then(|()| catalog(state, uri))
        }
        AccountPath::Subscriptions { account_id, id } => {
            subscriptions(state, method, uri, headers, body, &account_id, id)
        }
    };
    match answer {
        Ok((status, body)) => (status, axum::Json(body)).into_response(),
        Err(error) => error.into_response(),
    }
}

/// The token (the API token, or the queue token when one is set), the account and the method.
fn check(
    state: &State,
    headers: &HeaderMap,
    account_id: &str,
    method: &Method,
    allowed: &Method,
) -> Result<(), ApiError> {
    let queue_token = state.events().and_then(|events| events.queue_token);
    let authorized = headers.get(header::AUTHORIZATION).is_some_and(|value| {
        let value = value.as_bytes();
        value == format!("Bearer {}", state.config.token).as_bytes()
            || queue_token.as_ref().is_some_and(|token| value == format!("Bearer {token}").as_bytes())
    });
    if !authorized {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, 10000, "Authentication error"));
    }
    if account_id != state.config.account_id {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            7003,
            "Could not route to the account, perhaps your object identifier is invalid?",
        ));
    }
    if method != allowed {
        return Err(ApiError::new(StatusCode::METHOD_NOT_ALLOWED, 7001, "Method not allowed"));
    }
    Ok(())
}

/// `page` and `per_page` from the query (1 and 100 by default).
fn paging(uri: &Uri) -> (usize, usize) {
    let mut page = 1;
    let mut per_page = DEFAULT_PER_PAGE;
    for (key, value) in uri.query().unwrap_or("").split('&').filter_map(|pair| pair.split_once('=')) {
        match key {
            "page" => page = value.parse().unwrap_or(1).max(1),
            "per_page" => per_page = value.parse().unwrap_or(DEFAULT_PER_PAGE).clamp(1, MAX_PER_PAGE),
            _ => {}
        }
    }
    (page, per_page)
}

/// A query parameter's value, percent-decoded.
fn query_value(uri: &Uri, wanted: &str) -> Option<String> {
    uri.query()?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == wanted)
        .map(|(_, value)| percent_decode_str(value).decode_utf8_lossy().into_owned())
}

/// One page of `items` with Cloudflare's `result_info`.
fn page_of(items: Vec<Value>, page: usize, per_page: usize) -> Value {
    let total = items.len();
    let total_pages = total.div_ceil(per_page).max(1);
    let result: Vec<Value> = items.into_iter().skip((page - 1) * per_page).take(per_page).collect();
    json!({
        "success": true, "errors": [], "messages": [],
        "result": result,
        "result_info": {"page": page, "per_page": per_page, "count": result.len(), "total_count": total, "total_pages": total_pages},
    })
}

/// The catalog's task name of a family.
fn task_name(family: Family) -> &'static str {
    match family {
        Family::TextGeneration => "Text Generation",
        Family::Embeddings { .. } | Family::BgeM3 => "Text Embeddings",
        Family::Translation => "Translation",
        Family::Speech => "Automatic Speech Recognition",
    }
}

/// `GET ai/models/search`.
fn catalog(state: &State, uri: &Uri) -> Result<(StatusCode, Value), ApiError> {
    let (page, per_page) = paging(uri);
    let items: Vec<Value> = state
        .catalog_models()
        .into_iter()
        .enumerate()
        .map(|(index, (name, family, batchable))| {
            let mut properties = vec![json!({"property_id": "context_window", "value": "32000"})];
            if batchable {
                properties.push(json!({"property_id": "async_queue", "value": "true"}));
            }
            json!({
                "id": format!("{:08x}-0000-4000-8000-{index:012x}", index + 1),
                "source": 1,
                "name": name,
                "description": "an emulated model",
                "task": {"id": format!("task-{}", task_name(family).len()), "name": task_name(family), "description": ""},
                "created_at": "2026-01-01 00:00:00.000",
                "tags": [],
                "properties": properties,
            })
        })
        .collect();
    Ok((StatusCode::OK, page_of(items, page, per_page)))
}

/// The subscriptions endpoints.
fn subscriptions(
    state: &State,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    account_id: &str,
    id: Option<String>,
) -> Result<(StatusCode, Value), ApiError> {
    let success = |result: Value| json!({"success": true, "errors": [], "messages": [], "result": result});
    let not_found = || ApiError::new(StatusCode::NOT_FOUND, SUBSCRIPTION_NOT_FOUND, "Subscription not found");
    match id {
        None if method == Method::GET => {
            check(state, headers, account_id, method, &Method::GET)?;
            let (page, per_page) = paging(uri);
            let queue = query_value(uri, "queue_id");
            let items = state.with_subscriptions(|subs| subs.list(queue.as_deref()));
            Ok((StatusCode::OK, page_of(items.iter().map(|sub| sub.to_json()).collect(), page, per_page)))
        }
        None => {
            check(state, headers, account_id, method, &Method::POST)?;
            let object = body_object(body)?;
            let (model, queue_id, name, enabled, events) = read_create(&object)?;
            let created = state.with_subscriptions(|subs| subs.create(name, model, queue_id, enabled, events));
            let created =
                created.map_err(|message| ApiError::new(StatusCode::CONFLICT, SUBSCRIPTION_INVALID, message))?;
            Ok((StatusCode::OK, success(created.to_json())))
        }
        Some(id) if method == Method::PATCH => {
            check(state, headers, account_id, method, &Method::PATCH)?;
            let object = body_object(body)?;
            let enabled = object.get("enabled").and_then(Value::as_bool);
            let events = match object.get("events") {
                Some(events) => Some(read_events(events)?),
                None => None,
            };
            let updated = state.with_subscriptions(|subs| subs.update(&id, enabled, events)).ok_or_else(not_found)?;
            Ok((StatusCode::OK, success(updated.to_json())))
        }
        Some(id) if method == Method::DELETE => {
            check(state, headers, account_id, method, &Method::DELETE)?;
            let deleted = state.with_subscriptions(|subs| subs.delete(&id)).ok_or_else(not_found)?;
            Ok((StatusCode::OK, success(deleted.to_json())))
        }
        Some(id) => {
            check(state, headers, account_id, method, &Method::GET)?;
            let found = state.with_subscriptions(|subs| subs.list(None)).into_iter().find(|sub| sub.id == id);
            Ok((StatusCode::OK, success(found.ok_or_else(not_found)?.to_json())))
        }
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, SUBSCRIPTION_INVALID, message)
}

fn body_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        _ => Err(invalid("the body must be a JSON object")),
    }
}

/// A list of known Workers AI event types, at least one.
fn read_events(events: &Value) -> Result<Vec<String>, ApiError> {
    let Value::Array(events) = events else {
        return Err(invalid("events must be a list of event types"));
    };
    let events: Vec<String> = events.iter().filter_map(Value::as_str).map(str::to_owned).collect();
    if events.is_empty() {
        return Err(invalid("events must name at least one event type"));
    }
    if let Some(unknown) = events.iter().find(|event| !WORKERS_AI_EVENTS.contains(&event.as_str())) {
        return Err(invalid(format!("unknown event type {unknown:?} for source {WORKERS_AI_SOURCE}")));
    }
    Ok(events)
}

/// A create body: `source` `{type: workersAi.model, model_name}` (the model is required, as wrangler's
/// `--model-name` is), `destination` `{type: queues.queue, queue_id}`, `events`, optional `name` and `enabled`.
fn read_create(object: &Map<String, Value>) -> Result<(String, String, String, bool, Vec<String>), ApiError> {
    let source = object.get("source").ok_or_else(|| invalid("source is required"))?;
    if source.get("type").and_then(Value::as_str) != Some(WORKERS_AI_SOURCE) {
        return Err(invalid(format!("the emulator knows only source type {WORKERS_AI_SOURCE}")));
    }
    let model = source
        .get("model_name")
        .and_then(Value::as_str)
        .filter(|model| !model.is_empty())
        .ok_or_else(|| invalid("source.model_name is required for source workersAi.model"))?;
    let destination = object.get("destination").ok_or_else(|| invalid("destination is required"))?;
    if destination.get("type").and_then(Value::as_str) != Some(QUEUE_DESTINATION) {
        return Err(invalid(format!("destination.type must be {QUEUE_DESTINATION}")));
    }
    let queue_id = destination
        .get("queue_id")
        .and_then(Value::as_str)
        .filter(|queue| !queue.is_empty())
        .ok_or_else(|| invalid("destination.queue_id is required"))?;
    let events = read_events(object.get("events").unwrap_or(&Value::Null))?;
    let name = object
        .get("name")
        .and_then(Value::as_str)
        .map_or_else(|| format!("{queue_id} {WORKERS_AI_SOURCE}"), str::to_owned);
    let enabled = object.get("enabled").and_then(Value::as_bool).unwrap_or(true);
    Ok((model.to_owned(), queue_id.to_owned(), name, enabled, events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_paths_route() {
        assert_eq!(
            parse_account_path("/client/v4/accounts/acc/ai/models/search"),
            Some(AccountPath::Catalog { account_id: "acc".into() })
        );
        assert_eq!(
            parse_account_path("/client/v4/accounts/acc/event_subscriptions/subscriptions/s1"),
            Some(AccountPath::Subscriptions { account_id: "acc".into(), id: Some("s1".into()) })
        );
        assert!(parse_account_path("/client/v4/accounts/acc/ai/run/@cf/x").is_none());
        assert!(parse_account_path("/client/v4/accounts//ai/models/search").is_none());
    }

    #[test]
    fn create_bodies_need_a_model_a_queue_and_known_events() {
        let body = |value: Value| value.as_object().cloned().expect("object");
        let good = json!({"source": {"type": "workersAi.model", "model_name": "@cf/a"},
                          "destination": {"type": "queues.queue", "queue_id": "q"},
                          "events": ["batch.succeeded", "batch.failed"]});
        let (model, queue, name, enabled, events) = read_create(&body(good.clone())).expect("valid");
        assert_eq!((model.as_str(), queue.as_str(), name.as_str(), enabled), ("@cf/a", "q", "q workersAi.model", true));
        assert_eq!(events, ["batch.succeeded", "batch.failed"]);
        let mut no_model = good.clone();
        no_model["source"] = json!({"type": "workersAi.model"});
        assert!(read_create(&body(no_model)).is_err(), "wrangler requires --model-name for this source");
        let mut unknown = good.clone();
        unknown["events"] = json!(["batch.exploded"]);
        assert!(read_create(&body(unknown)).is_err());
        let mut empty = good;
        empty["events"] = json!([]);
        assert!(read_create(&body(empty)).is_err());
    }
}
