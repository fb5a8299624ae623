//! Workers AI batch events: their settings, their faults, and the exact JSON the emulator publishes.
//!
//! The shapes follow `/work/shared/reference/cloudflare-queues-events.md`: an event is
//! `{"type","source":{"type","modelName"},"payload":{"requestId",..},"metadata":{"accountId","eventSubscriptionId",
//! "eventSchemaVersion","eventTimestamp"}}`, and a pulled message carries it as its `body`.

use std::time::Duration;

use base64::{Engine as _, engine::general_purpose::STANDARD};
use serde::{Deserialize, Serialize};

use crate::config::RateLimit;

/// Queue id of [`EventsConfig::default`].
pub const DEFAULT_EVENTS_QUEUE: &str = "batchd-events";

/// `metadata.eventSubscriptionId` of [`EventsConfig::default`].
pub const DEFAULT_SUBSCRIPTION_ID: &str = "emulator-subscription";

/// Message of a `cf.workersAi.model.batch.failed` event (the poll of such a batch answers the same text).
const FAILED_MESSAGE: &str = "Model execution failed";
/// `payload.internalCode` of a failed event.
const FAILED_INTERNAL_CODE: i64 = 5001;
/// `payload.httpCode` of a failed event.
const FAILED_HTTP_CODE: u16 = 500;
/// `source.type` of every Workers AI model event.
const SOURCE_TYPE: &str = "workersAi.model";
/// `metadata.eventSchemaVersion` of every event.
const SCHEMA_VERSION: u32 = 1;

/// Settings of the event subscriptions and of the queue they feed (one queue, in the configured account).
///
/// With events on, every accepted submit publishes `cf.workersAi.model.batch.queued`, and every batch publishes
/// `cf.workersAi.model.batch.succeeded` (or `.failed` for a `fail_batch` batch) once its done time passes: for
/// every model while [`EventsConfig::all_models`] is set, otherwise only for a model with an enabled subscription
/// of that event to this queue (made through the subscriptions API, `crate::subscriptions`), as on the live API,
/// where a `workersAi.model` subscription names one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventsConfig {
    /// The `{queue_id}` of the pull and ack URLs; any other id answers 404, code 10104.
    pub queue_id: String,
    /// Token the queue endpoints accept instead of the API token; when set, the API token is refused there (401,
    /// code 10000), like a token without the Queues permission. `None`: the API token.
    pub queue_token: Option<String>,
    /// `metadata.eventSubscriptionId` of every event.
    pub subscription_id: String,
    /// Whether `payload.requestId` reads `req-<request id>`, as in the docs' example (whether the live API adds the
    /// prefix is unknown), instead of the bare id the submit returned.
    pub prefix_request_ids: bool,
    /// How a pulled message carries its event.
    pub body: EventBody,
    /// The form of `warnings` in ack replies.
    pub ack_warnings: AckWarnings,
    /// Redeliveries a message gets (after an expired lease or a retry) before it is dropped for good, like a
    /// consumer's `max_retries` (Cloudflare's default is 3); `None`: never dropped.
    pub max_retries: Option<u32>,
    /// At most `requests` pulls per queue in any window of `per`; over it, HTTP 429, code 10250, with `Retry-After`.
    /// `None`: unlimited. Acks are never limited.
    #[serde(with = "rate_limit_ms")]
    pub pull_rate_limit: Option<RateLimit>,
    /// Whether every model's events reach the queue as if each had its subscription (the state `batchd events
    /// setup` leaves); `false`: only the models subscribed through the subscriptions API.
    pub all_models: bool,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            queue_id: DEFAULT_EVENTS_QUEUE.to_owned(),
            queue_token: None,
            subscription_id: DEFAULT_SUBSCRIPTION_ID.to_owned(),
            prefix_request_ids: false,
            body: EventBody::default(),
            ack_warnings: AckWarnings::default(),
            max_retries: Some(3),
            pull_rate_limit: None,
            all_models: true,
        }
    }
}

impl EventsConfig {
    /// Events on, published to the queue `queue_id`, everything else default.
    pub fn queue(queue_id: impl Into<String>) -> Self {
        Self { queue_id: queue_id.into(), ..Self::default() }
    }

    /// Events on, published to `queue_id` only for the models subscribed through the subscriptions API.
    pub fn per_model(queue_id: impl Into<String>) -> Self {
        Self { queue_id: queue_id.into(), all_models: false, ..Self::default() }
    }
}

/// How a pulled message carries its event in `body`, and what its `metadata["CF-Content-Type"]` says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventBody {
    /// The event JSON, base64-encoded; content type `json` (what the docs' prose says).
    #[default]
    Base64,
    /// The event JSON as plain text; content type `json` (what the docs' sample shows).
    PlainJson,
    /// The event JSON as plain text; content type `text`.
    Text,
}

impl EventBody {
    /// The `body` and `CF-Content-Type` of a message whose event is `json`.
    pub(crate) fn render(self, json: &str) -> (String, &'static str) {
        match self {
            EventBody::Base64 => (STANDARD.encode(json), "json"),
            EventBody::PlainJson => (json.to_owned(), "json"),
            EventBody::Text => (json.to_owned(), "text"),
        }
    }
}

/// The form of `result.warnings` in an ack reply (the reference says clients have seen both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckWarnings {
    /// A list of strings, one per lease not acknowledged or retried.
    #[default]
    List,
    /// An object from lease id to message.
    Map,
}

/// Faults applied to events as they are published, and to the order pulls hand them out in. They change at runtime
/// and apply to events published from then on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventFaults {
    /// The next this many events are never enqueued (counts down; checked before `drop_rate`). Deterministic.
    pub drop_next: u32,
    /// Probability in `[0, 1]` that an event is never enqueued, drawn from the generator seeded by
    /// [`crate::EmulatorConfig::seed`].
    pub drop_rate: f64,
    /// Every event is enqueued twice: two messages with their own ids and leases and the same body.
    pub duplicate: bool,
    /// Events enter the queue this long after they happen (late events); their `timestamp_ms` is when they enter.
    #[serde(rename = "delay_ms", with = "crate::config::millis")]
    pub delay: Duration,
    /// The order in which a pull hands out the messages available.
    pub order: PullOrder,
}

impl EventFaults {
    /// No faults.
    pub fn none() -> Self {
        Self::default()
    }

    /// Drops the next `n` events.
    pub fn drop_next(n: u32) -> Self {
        Self { drop_next: n, ..Self::default() }
    }

    /// Drops each event with probability `rate` (clamped to `[0, 1]`; NaN is 0).
    pub fn drop_rate(rate: f64) -> Self {
        Self { drop_rate: rate, ..Self::default() }.clamped()
    }

    /// Enqueues every event twice.
    pub fn duplicate() -> Self {
        Self { duplicate: true, ..Self::default() }
    }

    /// Makes every event enter the queue `delay` after it happens.
    pub fn delay(delay: Duration) -> Self {
        Self { delay, ..Self::default() }
    }

    /// Hands out available messages in `order`.
    pub fn order(order: PullOrder) -> Self {
        Self { order, ..Self::default() }
    }

    /// The same faults with `drop_rate` clamped to `[0, 1]` (NaN is 0).
    pub(crate) fn clamped(mut self) -> Self {
        self.drop_rate = if self.drop_rate.is_nan() { 0.0 } else { self.drop_rate.clamp(0.0, 1.0) };
        self
    }
}

/// The order in which a pull hands out the messages available (Cloudflare does not guarantee one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PullOrder {
    /// Oldest enqueued first.
    #[default]
    Fifo,
    /// Newest enqueued first.
    Reverse,
    /// Shuffled by the generator seeded by [`crate::EmulatorConfig::seed`].
    Random,
}

/// Events published per type (before faults: dropped ones count, a duplicated one counts once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventCounts {
    /// `cf.workersAi.model.batch.queued`.
    pub queued: u64,
    /// `cf.workersAi.model.batch.succeeded`.
    pub succeeded: u64,
    /// `cf.workersAi.model.batch.failed`.
    pub failed: u64,
}

impl EventCounts {
    /// Counts one event of `event_type`.
    pub(crate) fn add(&mut self, event_type: EventType) {
        match event_type {
            EventType::Queued => self.queued += 1,
            EventType::Succeeded => self.succeeded += 1,
            EventType::Failed => self.failed += 1,
        }
    }
}

/// The three Workers AI batch events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    /// A submit was accepted.
    Queued,
    /// A batch finished.
    Succeeded,
    /// A batch failed as a whole (`fail_batch`).
    Failed,
}

impl EventType {
    /// The event's `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Queued => "cf.workersAi.model.batch.queued",
            EventType::Succeeded => "cf.workersAi.model.batch.succeeded",
            EventType::Failed => "cf.workersAi.model.batch.failed",
        }
    }

    /// The short name subscriptions list it by (`batch.succeeded`).
    pub fn short(self) -> &'static str {
        self.as_str().trim_start_matches("cf.workersAi.model.")
    }
}

/// What one event is about.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventFacts<'a> {
    /// Which event.
    pub event_type: EventType,
    /// The model the batch was submitted to (`source.modelName`).
    pub model: &'a str,
    /// The request id the submit returned.
    pub request_id: &'a str,
    /// The account (`metadata.accountId`).
    pub account_id: &'a str,
    /// When it happened, in Unix milliseconds (`metadata.eventTimestamp`).
    pub at_ms: u64,
}

/// The event JSON, as published.
#[derive(Serialize)]
struct Event<'a> {
    /// One of the three event types.
    #[serde(rename = "type")]
    event_type: &'static str,
    /// Which model.
    source: Source<'a>,
    /// Which batch, and for a failure why.
    payload: Payload,
    /// Account, subscription, schema version and time.
    metadata: Metadata<'a>,
}

/// `source` of an event.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Source<'a> {
    /// Always `workersAi.model`.
    #[serde(rename = "type")]
    source_type: &'static str,
    /// The model of the batch.
    model_name: &'a str,
}

/// `payload` of an event.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Payload {
    /// The batch's request id (with `req-` when configured).
    request_id: String,
    /// Failed events only.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'static str>,
    /// Failed events only.
    #[serde(skip_serializing_if = "Option::is_none")]
    internal_code: Option<i64>,
    /// Failed events only.
    #[serde(skip_serializing_if = "Option::is_none")]
    http_code: Option<u16>,
}

/// `metadata` of an event.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Metadata<'a> {
    /// The account of the batch.
    account_id: &'a str,
    /// The configured subscription id.
    event_subscription_id: &'a str,
    /// Always 1.
    event_schema_version: u32,
    /// RFC 3339 with milliseconds, UTC.
    event_timestamp: String,
}

/// The JSON text of the event `facts` describe, under `config`.
pub(crate) fn event_json(facts: EventFacts<'_>, config: &EventsConfig, subscription_id: &str) -> String {
    let request_id =
        if config.prefix_request_ids { format!("req-{}", facts.request_id) } else { facts.request_id.to_owned() };
    let failed = facts.event_type == EventType::Failed;
    let event = Event {
        event_type: facts.event_type.as_str(),
        source: Source { source_type: SOURCE_TYPE, model_name: facts.model },
        payload: Payload {
            request_id,
            message: failed.then_some(FAILED_MESSAGE),
            internal_code: failed.then_some(FAILED_INTERNAL_CODE),
            http_code: failed.then_some(FAILED_HTTP_CODE),
        },
        metadata: Metadata {
            account_id: facts.account_id,
            event_subscription_id: subscription_id,
            event_schema_version: SCHEMA_VERSION,
            event_timestamp: rfc3339_millis(facts.at_ms),
        },
    };
    // A struct of strings and integers always serializes.
    serde_json::to_string(&event).unwrap_or_default()
}

/// Unix milliseconds as `YYYY-MM-DDTHH:MM:SS.mmmZ` (the form of the docs' `eventTimestamp`).
pub(crate) fn rfc3339_millis(unix_ms: u64) -> String {
    let millis = unix_ms % 1000;
    let secs = unix_ms / 1000;
    let (hour, minute, second) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01 (never negative here).
    let days = secs / 86_400 + 719_468;
    let era = days / 146_097;
    let day_of_era = days % 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{millis:03}Z")
}

/// Serde for an optional [`RateLimit`] as `{"requests": N, "per_ms": M}` or `null`.
mod rate_limit_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::config::RateLimit;

    /// The JSON form of a rate limit.
    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Form {
        /// See [`RateLimit::requests`].
        requests: u32,
        /// See [`RateLimit::per`], in milliseconds.
        per_ms: u64,
    }

    pub fn serialize<S: Serializer>(limit: &Option<RateLimit>, serializer: S) -> Result<S::Ok, S::Error> {
        limit
            .map(|limit| Form {
                requests: limit.requests,
                per_ms: u64::try_from(limit.per.as_millis()).unwrap_or(u64::MAX),
            })
            .serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<RateLimit>, D::Error> {
        let form = Option::<Form>::deserialize(deserializer)?;
        Ok(form.map(|form| RateLimit::new(form.requests, Duration::from_millis(form.per_ms))))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn timestamps_are_rfc3339_with_millis() {
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_millis(1_746_067_737_132), "2025-05-01T02:48:57.132Z");
        assert_eq!(rfc3339_millis(951_868_799_999), "2000-02-29T23:59:59.999Z");
        assert_eq!(rfc3339_millis(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
    }

    fn facts(event_type: EventType) -> EventFacts<'static> {
        EventFacts {
            event_type,
            model: "@cf/baai/bge-base-en-v1.5",
            request_id: "0a6b1c2d-0000-4000-8000-000000000001",
            account_id: "acc",
            at_ms: 1_746_067_737_132,
        }
    }

    /// Golden: the exact events a consumer sees (this is the format the daemon parses).
    #[test]
    fn events_have_the_documented_shape() {
        let config = EventsConfig::default();
        let succeeded: Value =
            serde_json::from_str(&event_json(facts(EventType::Succeeded), &config, &config.subscription_id))
                .expect("json");
        assert_eq!(
            succeeded,
            json!({
                "type": "cf.workersAi.model.batch.succeeded",
                "source": { "type": "workersAi.model", "modelName": "@cf/baai/bge-base-en-v1.5" },
                "payload": { "requestId": "0a6b1c2d-0000-4000-8000-000000000001" },
                "metadata": {
                    "accountId": "acc",
                    "eventSubscriptionId": "emulator-subscription",
                    "eventSchemaVersion": 1,
                    "eventTimestamp": "2025-05-01T02:48:57.132Z"
                }
            })
        );
        let queued: Value =
            serde_json::from_str(&event_json(facts(EventType::Queued), &config, &config.subscription_id))
                .expect("json");
        assert_eq!(queued["type"], "cf.workersAi.model.batch.queued");
        assert_eq!(queued["payload"], succeeded["payload"]);

        let config = EventsConfig { prefix_request_ids: true, ..EventsConfig::default() };
        let failed: Value =
            serde_json::from_str(&event_json(facts(EventType::Failed), &config, &config.subscription_id))
                .expect("json");
        assert_eq!(failed["type"], "cf.workersAi.model.batch.failed");
        assert_eq!(
            failed["payload"],
            json!({
                "requestId": "req-0a6b1c2d-0000-4000-8000-000000000001",
                "message": "Model execution failed",
                "internalCode": 5001,
                "httpCode": 500
            })
        );
    }

    #[test]
    fn bodies_are_base64_or_plain() {
        assert_eq!(EventBody::Base64.render("{\"a\":1}"), ("eyJhIjoxfQ==".to_owned(), "json"));
        assert_eq!(EventBody::PlainJson.render("{}"), ("{}".to_owned(), "json"));
        assert_eq!(EventBody::Text.render("{}"), ("{}".to_owned(), "text"));
    }

    #[test]
    fn settings_have_their_json_forms() {
        let config: EventsConfig = serde_json::from_str(
            r#"{"queue_id":"q","body":"plain_json","pull_rate_limit":{"requests":2,"per_ms":1000}}"#,
        )
        .expect("parse");
        assert_eq!(config.queue_id, "q");
        assert_eq!(config.body, EventBody::PlainJson);
        assert_eq!(config.pull_rate_limit, Some(RateLimit::new(2, Duration::from_secs(1))));
        assert_eq!(config.max_retries, Some(3));
        assert!(serde_json::from_str::<EventsConfig>(r#"{"queue":"q"}"#).is_err());
        let faults: EventFaults =
            serde_json::from_str(r#"{"drop_next":2,"delay_ms":300,"order":"reverse"}"#).expect("parse");
        assert_eq!(
            faults,
            EventFaults {
                drop_next: 2,
                delay: Duration::from_millis(300),
                order: PullOrder::Reverse,
                ..EventFaults::none()
            }
        );
        assert_eq!(EventFaults::drop_rate(7.0).drop_rate, 1.0);
        assert_eq!(EventFaults::drop_rate(f64::NAN).drop_rate, 0.0);
    }
}
