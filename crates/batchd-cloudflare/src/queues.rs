//! The Cloudflare Queues pull consumer, for Workers AI batch events: pull messages, read each as a batch event,
//! acknowledge them.
//!
//! Events only say "look at this batch now"; the poll stays the source of a batch's outcome, so everything here is
//! read leniently: a message that is not a readable event is still acknowledged by the caller (it would only come
//! back), and an event's request id is matched after stripping an optional `req-` prefix (the docs' example has
//! one, submit replies do not). Shapes and sources: `docs/batch-api.md`, "Batch events".

use std::fmt;
use std::time::Duration;

use base64::Engine;
use reqwest::Url;
use serde::Serialize;
use serde_json::Value;

use crate::client::{Request, Transport, join};
use crate::error::{ApiError, Build as _, Operation};
use crate::settings::{ClientBuildError, ClientSettings};
use crate::wire;

/// Most messages one pull may ask for (the Queues limit).
pub const MAX_PULL_BATCH: u32 = 100;

/// A client for one queue's pull consumer. Cloning is cheap.
#[derive(Clone)]
pub struct QueueClient {
    /// Sends requests and reads replies.
    transport: Transport,
    /// `{base}/accounts/{account}/queues/{queue}/messages`.
    messages_url: Url,
}

impl fmt::Debug for QueueClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueClient")
            .field("messages_url", &self.messages_url.as_str())
            .field("token", &self.transport.token)
            .finish_non_exhaustive()
    }
}

/// What a pull brought.
#[derive(Debug, Clone, Default)]
pub struct Pulled {
    /// The messages, each leased to this puller until acknowledged or until the visibility timeout passes.
    pub messages: Vec<QueueMessage>,
    /// Messages waiting in the queue (not acknowledged), when the reply says: `message_backlog_count`, else
    /// `metadata.metrics.backlog_count`.
    pub backlog: Option<u64>,
    /// When the oldest unacknowledged message was sent, Unix milliseconds (`metadata.metrics.
    /// oldest_message_timestamp_ms`), when the reply says; the API's `0` ("unknown") is `None`.
    pub oldest_message_ms: Option<u64>,
}

/// One pulled message.
#[derive(Debug, Clone)]
pub struct QueueMessage {
    /// The lease to acknowledge it with.
    pub lease_id: String,
    /// How many times it was delivered (1 the first time).
    pub attempts: u64,
    /// When it was sent to the queue, Unix milliseconds, when the reply says.
    pub timestamp_ms: Option<u64>,
    /// The batch event it carries; `None` when the body is not one.
    pub event: Option<BatchEvent>,
}

/// A Workers AI batch event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchEvent {
    /// What happened.
    pub kind: EventKind,
    /// The batch's request id, without a `req-` prefix.
    pub request_id: String,
}

/// The type of a batch event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// `cf.workersAi.model.batch.queued`.
    Queued,
    /// `cf.workersAi.model.batch.succeeded`.
    Succeeded,
    /// `cf.workersAi.model.batch.failed`.
    Failed,
    /// Any other type (a new one, or an event of another source), cut to 64 characters.
    Other(String),
}

impl EventKind {
    /// A stable name, for logs and metric labels (`other` for every unknown type).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Other(_) => "other",
        }
    }
}

/// Pull body: `{"batch_size":N,"visibility_timeout_ms":M}`.
#[derive(Debug, Serialize)]
struct PullBody {
    batch_size: u32,
    visibility_timeout_ms: u64,
}

/// Ack body: `{"acks":[{"lease_id":...}],"retries":[]}`.
#[derive(Debug, Serialize)]
struct AckBody<'a> {
    acks: Vec<LeaseRef<'a>>,
    retries: Vec<LeaseRef<'a>>,
}

#[derive(Debug, Serialize)]
struct LeaseRef<'a> {
    lease_id: &'a str,
}

impl QueueClient {
    /// A client for `queue_id` of the account in `settings` (its token needs Queues Edit: acknowledging writes).
    pub fn new(settings: ClientSettings, queue_id: &str) -> Result<Self, ClientBuildError> {
        validate_queue_id(queue_id)?;
        let (transport, account_url) = crate::client::Transport::new(settings)?;
        let messages_url = join(&account_url, &["queues", queue_id, "messages"]);
        Ok(Self { transport, messages_url })
    }

    /// Pulls up to `batch_size` messages (at most [`MAX_PULL_BATCH`]), leasing them for `visibility_timeout`. The
    /// queue answers at once, with no messages when it is empty.
    pub async fn pull(&self, batch_size: u32, visibility_timeout: Duration) -> Result<Pulled, ApiError> {
        let body = PullBody {
            batch_size: batch_size.clamp(1, MAX_PULL_BATCH),
            visibility_timeout_ms: u64::try_from(visibility_timeout.as_millis()).unwrap_or(u64::MAX),
        };
        let body = serde_json::to_vec(&body).expect("the pull body serialises");
        let url = join(&self.messages_url, &["pull"]);
        self.transport.exchange(Operation::Pull, Request::post(url, body), read_pull).await
    }

    /// Acknowledges messages by their lease ids; returns how many the queue counted (a lease that expired meanwhile
    /// is not acknowledged: its message comes back, and waking its batch again is harmless).
    pub async fn ack(&self, lease_ids: &[String]) -> Result<u64, ApiError> {
        let body =
            AckBody { acks: lease_ids.iter().map(|lease_id| LeaseRef { lease_id }).collect(), retries: Vec::new() };
        let body = serde_json::to_vec(&body).expect("the ack body serialises");
        let url = join(&self.messages_url, &["ack"]);
        self.transport
            .exchange(Operation::Ack, Request::post(url, body), |http_status, body| {
                let envelope: wire::Envelope<Value> = serde_json::from_slice(body).map_err(|_| {
                    ApiError::unreadable_reply(Operation::Ack, http_status, "the ack reply is not a JSON object", body)
                })?;
                if envelope.is_refusal() {
                    return Err(ApiError::from_reply(Operation::Ack, http_status, None, body));
                }
                let result = envelope.result.and_then(wire::Shape::into_option);
                let count = result.as_ref().and_then(|result| result.get("ackCount")).and_then(wire::integer);
                Ok(count.map_or(lease_ids.len() as u64, |count| count.max(0) as u64))
            })
            .await
    }
}

/// Checks a queue id: 1–64 characters of `[A-Za-z0-9_-]`.
pub(crate) fn validate_queue_id(queue_id: &str) -> Result<(), ClientBuildError> {
    if queue_id.is_empty()
        || queue_id.len() > 64
        || !queue_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(ClientBuildError::InvalidQueueId(queue_id.chars().take(64).collect()));
    }
    Ok(())
}

/// Reads a 2xx pull reply: the envelope's `result.messages[]`, each message field by field.
fn read_pull(http_status: u16, body: &[u8]) -> Result<Pulled, ApiError> {
    let envelope: wire::Envelope<Value> = serde_json::from_slice(body).map_err(|_| {
        ApiError::unreadable_reply(Operation::Pull, http_status, "the pull reply is not a JSON object", body)
    })?;
    if envelope.is_refusal() {
        return Err(ApiError::from_reply(Operation::Pull, http_status, None, body));
    }
    let Some(result) = envelope.result.and_then(wire::Shape::into_option) else {
        return Err(ApiError::unreadable_reply(Operation::Pull, http_status, "the pull reply has no result", body));
    };
    let count = |value: Option<&Value>| value.and_then(wire::integer).and_then(|n| u64::try_from(n).ok());
    let metrics = result.get("metadata").and_then(|metadata| metadata.get("metrics"));
    let backlog = count(result.get("message_backlog_count"))
        .or_else(|| count(metrics.and_then(|metrics| metrics.get("backlog_count"))));
    let oldest_message_ms =
        count(metrics.and_then(|metrics| metrics.get("oldest_message_timestamp_ms"))).filter(|ms| *ms > 0);
    let messages = match result.get("messages") {
        Some(Value::Array(messages)) => messages.iter().filter_map(read_message).collect(),
        _ => Vec::new(),
    };
    Ok(Pulled { messages, backlog, oldest_message_ms })
}

/// One message; `None` when it has no lease id (it could not be acknowledged anyway).
fn read_message(message: &Value) -> Option<QueueMessage> {
    let lease_id = wire::text(message.get("lease_id"))?;
    let attempts = message.get("attempts").and_then(wire::integer).and_then(|n| u64::try_from(n).ok()).unwrap_or(1);
    let timestamp_ms = message.get("timestamp_ms").and_then(wire::integer).and_then(|n| u64::try_from(n).ok());
    let content_type = message.get("metadata").and_then(|metadata| metadata.get("CF-Content-Type"));
    let event = message.get("body").and_then(|body| decode_body(body, content_type)).as_ref().and_then(read_event);
    Some(QueueMessage { lease_id, attempts, timestamp_ms, event })
}

/// The JSON a message body carries: `text` bodies are the text; `json` and `bytes` bodies are base64 by the
/// docs, but the docs' own sample shows plain JSON marked `json`, so base64 is used only when it decodes to JSON.
fn decode_body(body: &Value, content_type: Option<&Value>) -> Option<Value> {
    let text = match body {
        Value::String(text) => text,
        Value::Object(_) => return Some(body.clone()),
        _ => return None,
    };
    let plain = content_type.and_then(Value::as_str).is_some_and(|kind| kind.eq_ignore_ascii_case("text"));
    if !plain
        && let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(text.trim())
        && let Ok(value) = serde_json::from_slice::<Value>(&bytes)
    {
        return Some(value);
    }
    serde_json::from_str(text).ok()
}

/// A batch event from a message's JSON: `type` and `payload.requestId` (a string or a number).
fn read_event(value: &Value) -> Option<BatchEvent> {
    let kind = match value.get("type").and_then(Value::as_str)? {
        "cf.workersAi.model.batch.queued" => EventKind::Queued,
        "cf.workersAi.model.batch.succeeded" => EventKind::Succeeded,
        "cf.workersAi.model.batch.failed" => EventKind::Failed,
        other => EventKind::Other(other.chars().take(64).collect()),
    };
    let request_id = wire::text(value.get("payload").and_then(|payload| payload.get("requestId")))?;
    let request_id = request_id.strip_prefix("req-").unwrap_or(&request_id).to_owned();
    Some(BatchEvent { kind, request_id })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event_json(kind: &str, request_id: &str) -> String {
        serde_json::json!({
            "type": kind,
            "source": {"type": "workersAi.model", "modelName": "@cf/baai/bge-m3"},
            "payload": {"requestId": request_id},
            "metadata": {"accountId": "a", "eventSubscriptionId": "s", "eventSchemaVersion": 1,
                         "eventTimestamp": "2025-05-01T02:48:57.132Z"}
        })
        .to_string()
    }

    fn pull_reply(messages: Vec<Value>) -> Vec<u8> {
        serde_json::json!({"success": true, "errors": [], "messages": [],
            "result": {"message_backlog_count": 3, "messages": messages,
                       "metadata": {"metrics": {"backlog_count": 3, "backlog_bytes": 512,
                                                "oldest_message_timestamp_ms": 1710950954154u64}}}})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn messages_are_read_in_every_body_form() {
        let base64 = base64::engine::general_purpose::STANDARD
            .encode(event_json("cf.workersAi.model.batch.succeeded", "req-r1"));
        let reply = pull_reply(vec![
            serde_json::json!({"id": "m1", "attempts": 1, "body": base64, "lease_id": "l1", "timestamp_ms": 1710950954154u64,
                               "metadata": {"CF-Content-Type": "json"}}),
            serde_json::json!({"id": "m2", "attempts": "2", "body": event_json("cf.workersAi.model.batch.failed", "r2"),
                               "lease_id": "l2", "metadata": {"CF-Content-Type": "json"}}),
            serde_json::json!({"id": "m3", "body": event_json("cf.workersAi.model.batch.queued", "r3"), "lease_id": "l3",
                               "metadata": {"CF-Content-Type": "text"}}),
            serde_json::json!({"id": "m4", "body": "not an event", "lease_id": "l4"}),
            serde_json::json!({"id": "m5", "body": event_json("cf.other.thing", "r5"), "lease_id": "l5"}),
            serde_json::json!({"id": "m6", "body": event_json("cf.workersAi.model.batch.queued", "r6")}),
        ]);
        let pulled = read_pull(200, &reply).expect("readable");
        assert_eq!((pulled.backlog, pulled.oldest_message_ms), (Some(3), Some(1710950954154)));
        let leases: Vec<&str> = pulled.messages.iter().map(|m| m.lease_id.as_str()).collect();
        assert_eq!(leases, ["l1", "l2", "l3", "l4", "l5"], "a message without a lease cannot be acknowledged");
        let event = |i: usize| pulled.messages[i].event.clone();
        assert_eq!(
            event(0),
            Some(BatchEvent { kind: EventKind::Succeeded, request_id: "r1".into() }),
            "req- is stripped"
        );
        assert_eq!(pulled.messages[0].timestamp_ms, Some(1710950954154));
        assert_eq!(
            event(1),
            Some(BatchEvent { kind: EventKind::Failed, request_id: "r2".into() }),
            "plain JSON marked json"
        );
        assert_eq!(pulled.messages[1].attempts, 2);
        assert_eq!(event(2), Some(BatchEvent { kind: EventKind::Queued, request_id: "r3".into() }));
        assert_eq!(event(3), None);
        assert_eq!(event(4).map(|e| e.kind), Some(EventKind::Other("cf.other.thing".into())));
    }

    #[test]
    fn an_empty_queue_and_odd_replies() {
        assert!(read_pull(200, &pull_reply(vec![])).expect("empty").messages.is_empty());
        let no_list = br#"{"success":true,"result":{"messages":null}}"#;
        assert!(read_pull(200, no_list).expect("no list").messages.is_empty());
        let metrics_only = br#"{"success":true,"result":{"messages":[],"metadata":{"metrics":{"backlog_count":"7","oldest_message_timestamp_ms":0}}}}"#;
        let pulled = read_pull(200, metrics_only).expect("metrics only");
        assert_eq!((pulled.backlog, pulled.oldest_message_ms), (Some(7), None), "0 means unknown");
        let refused = br#"{"success":false,"errors":[{"code":10000,"message":"Authentication error"}]}"#;
        assert!(read_pull(200, refused).is_err());
        assert!(read_pull(200, b"<html>").is_err());
    }
}
