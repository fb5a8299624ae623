//! Event subscriptions (`/accounts/{account}/event_subscriptions/subscriptions`): which Workers AI models publish
//! their batch events to batchd's queue.
//!
//! A `workersAi.model` subscription names one model (`source.model_name`; `wrangler queues subscription create`
//! refuses that source without `--model-name`), so a queue hears only the models it was subscribed for: a batch of
//! any other model is found by its fallback poll, minutes later. `batchd events setup` creates the missing ones
//! ([`plan`]); the daemon checks the models it submits for ([`SubscriptionClient::list`]) and says which have none.
//! Sources: `docs/batch-api.md`, "Event subscriptions".

use std::fmt;

use reqwest::Url;
use serde::Serialize;
use serde_json::Value;

use crate::client::{Request, Transport, join};
use crate::error::{ApiError, Build as _, Operation};
use crate::settings::{ClientBuildError, ClientSettings};
use crate::wire;

/// The events batchd needs from each model: a finished batch, either way (`batch.queued` says nothing a poll could
/// read yet). Short names, as subscriptions list them.
pub const BATCH_EVENTS: [&str; 2] = ["batch.succeeded", "batch.failed"];

/// The `source.type` of a Workers AI model subscription.
pub const SOURCE_TYPE: &str = "workersAi.model";

/// Subscriptions asked for per page of the list.
const PAGE_SIZE: usize = 50;

/// Most pages of the list read (1,000 subscriptions); the rest is ignored, with a warning.
const MAX_PAGES: usize = 20;

/// Longest text kept from a subscription's fields.
const MAX_FIELD_CHARS: usize = 200;

/// A client for the event subscriptions of one queue. Cloning is cheap.
#[derive(Clone)]
pub struct SubscriptionClient {
    /// Sends requests and reads replies.
    transport: Transport,
    /// `{base}/accounts/{account}/event_subscriptions/subscriptions`.
    url: Url,
    /// The queue the subscriptions deliver to.
    queue_id: String,
}

impl fmt::Debug for SubscriptionClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubscriptionClient").field("url", &self.url.as_str()).field("queue_id", &self.queue_id).finish()
    }
}

/// One event subscription, read field by field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// `source.type`.
    pub source_type: String,
    /// `source.model_name` (a Workers AI model subscription's model).
    pub model: Option<String>,
    /// `destination.queue_id`.
    pub queue_id: Option<String>,
    /// Whether it delivers.
    pub enabled: bool,
    /// The event types it delivers (short names, `batch.succeeded`).
    pub events: Vec<String>,
}

impl Subscription {
    /// Whether it is a subscription of `model`'s events to `queue_id`.
    pub fn is_for(&self, model: &str, queue_id: &str) -> bool {
        self.source_type == SOURCE_TYPE
            && self.model.as_deref() == Some(model)
            && self.queue_id.as_deref().is_none_or(|queue| queue == queue_id)
    }

    /// Whether it delivers every event batchd needs ([`BATCH_EVENTS`]); a full type name
    /// (`cf.workersAi.model.batch.succeeded`) counts as its short one.
    pub fn delivers_batch_events(&self) -> bool {
        self.enabled
            && BATCH_EVENTS.iter().all(|wanted| {
                self.events.iter().any(|event| {
                    event == wanted || event.strip_prefix("cf.workersAi.model.").is_some_and(|short| short == *wanted)
                })
            })
    }
}

/// What a model needs so that its batch events reach the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A subscription delivers them already.
    Ready {
        /// The model.
        model: String,
        /// The subscription's id.
        id: String,
    },
    /// No subscription of the model's events to the queue exists: create one.
    Create {
        /// The model.
        model: String,
    },
    /// One exists but is disabled or lacks an event: enable it and give it every event of [`BATCH_EVENTS`] (the
    /// events it delivers already are kept).
    Update {
        /// The model.
        model: String,
        /// The subscription's id.
        id: String,
        /// The events it should deliver.
        events: Vec<String>,
    },
}

impl Step {
    /// The model the step is about.
    pub fn model(&self) -> &str {
        match self {
            Self::Ready { model, .. } | Self::Create { model } | Self::Update { model, .. } => model,
        }
    }
}

/// For each of `models` (in order, once each), what it needs given the queue's `subscriptions`.
pub fn plan<'a>(
    models: impl IntoIterator<Item = &'a str>,
    subscriptions: &[Subscription],
    queue_id: &str,
) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    for model in models {
        if steps.iter().any(|step| step.model() == model) {
            continue;
        }
        let mine: Vec<&Subscription> = subscriptions.iter().filter(|sub| sub.is_for(model, queue_id)).collect();
        let step = if let Some(ready) = mine.iter().find(|sub| sub.delivers_batch_events()) {
            Step::Ready { model: model.to_owned(), id: ready.id.clone() }
        } else if let Some(partial) = mine.first() {
            let mut events = partial.events.clone();
            for wanted in BATCH_EVENTS {
                if !events.iter().any(|event| event == wanted) {
                    events.push(wanted.to_owned());
                }
            }
            Step::Update { model: model.to_owned(), id: partial.id.clone(), events }
        } else {
            Step::Create { model: model.to_owned() }
        };
        steps.push(step);
    }
    steps
}

/// The body of a create: `{"name","enabled","source":{"type","model_name"},"destination":{"type","queue_id"},"events"}`.
#[derive(Debug, Serialize)]
struct CreateBody<'a> {
    name: String,
    enabled: bool,
    source: Source<'a>,
    destination: Destination<'a>,
    events: &'a [&'a str],
}

#[derive(Debug, Serialize)]
struct Source<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    model_name: &'a str,
}

#[derive(Debug, Serialize)]
struct Destination<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    queue_id: &'a str,
}

/// The body of an update: `{"enabled":true,"events":[...]}`.
#[derive(Debug, Serialize)]
struct UpdateBody<'a> {
    enabled: bool,
    events: &'a [String],
}

impl SubscriptionClient {
    /// A client for the subscriptions that deliver to `queue_id` (its token needs Queues Edit to create them).
    pub fn new(settings: ClientSettings, queue_id: &str) -> Result<Self, ClientBuildError> {
        crate::queues::validate_queue_id(queue_id)?;
        let (transport, account_url) = Transport::new(settings)?;
        let url = join(&account_url, &["event_subscriptions", "subscriptions"]);
        Ok(Self { transport, url, queue_id: queue_id.to_owned() })
    }

    /// The queue the subscriptions deliver to.
    pub fn queue_id(&self) -> &str {
        &self.queue_id
    }

    /// Every subscription that delivers to the queue (filtered by `queue_id` on the server, and again here).
    pub async fn list(&self) -> Result<Vec<Subscription>, ApiError> {
        let mut all = Vec::new();
        for page in 1..=MAX_PAGES {
            let mut url = self.url.clone();
            url.query_pairs_mut()
                .append_pair("queue_id", &self.queue_id)
                .append_pair("page", &page.to_string())
                .append_pair("per_page", &PAGE_SIZE.to_string());
            let (items, n_items, total_pages) =
                self.transport.exchange(Operation::Subscriptions, Request::get(url), read_list).await?;
            all.extend(
                items.into_iter().filter(|sub| sub.queue_id.as_deref().is_none_or(|queue| queue == self.queue_id)),
            );
            if n_items < PAGE_SIZE || total_pages.is_some_and(|total| page >= total) {
                return Ok(all);
            }
        }
        tracing::warn!(
            pages = MAX_PAGES,
            "the queue has more event subscriptions than batchd reads; the rest is ignored"
        );
        Ok(all)
    }

    /// Creates the subscription of `model`'s batch events to the queue, named `batchd <model>`.
    pub async fn create(&self, model: &str) -> Result<Subscription, ApiError> {
        let body = CreateBody {
            name: format!("batchd {model}"),
            enabled: true,
            source: Source { kind: SOURCE_TYPE, model_name: model },
            destination: Destination { kind: "queues.queue", queue_id: &self.queue_id },
            events: &BATCH_EVENTS,
        };
        let body = serde_json::to_vec(&body).expect("a create body serialises");
        self.transport.exchange(Operation::Subscriptions, Request::post(self.url.clone(), body), read_one).await
    }

    /// Enables subscription `id` and sets its events.
    pub async fn update(&self, id: &str, events: &[String]) -> Result<Subscription, ApiError> {
        let body = serde_json::to_vec(&UpdateBody { enabled: true, events }).expect("an update body serialises");
        let url = join(&self.url, &[id]);
        self.transport.exchange(Operation::Subscriptions, Request::patch(url, body), read_one).await
    }
}

/// The envelope's `result` of a 2xx reply, or the refusal it carries.
fn result_of(http_status: u16, body: &[u8]) -> Result<(Value, Option<usize>), ApiError> {
    let unreadable = |what: &str| ApiError::unreadable_reply(Operation::Subscriptions, http_status, what, body);
    let Ok(Value::Object(mut reply)) = serde_json::from_slice::<Value>(body) else {
        return Err(unreadable("the subscriptions reply is not a JSON object"));
    };
    if wire::flag(reply.get("success")) == Some(false) {
        return Err(ApiError::from_reply(Operation::Subscriptions, http_status, None, body));
    }
    let total_pages = wire::total_pages(&reply);
    let result = reply.remove("result").ok_or_else(|| unreadable("the subscriptions reply has no result"))?;
    Ok((result, total_pages))
}

/// A list page: the readable subscriptions, the number of items, and `result_info.total_pages`.
fn read_list(http_status: u16, body: &[u8]) -> Result<(Vec<Subscription>, usize, Option<usize>), ApiError> {
    let (result, total_pages) = result_of(http_status, body)?;
    let Value::Array(items) = result else {
        return Err(ApiError::unreadable_reply(
            Operation::Subscriptions,
            http_status,
            "the subscriptions list is not a list",
            body,
        ));
    };
    Ok((items.iter().filter_map(read_subscription).collect(), items.len(), total_pages))
}

/// The subscription a create or update answers.
fn read_one(http_status: u16, body: &[u8]) -> Result<Subscription, ApiError> {
    let (result, _) = result_of(http_status, body)?;
    read_subscription(&result).ok_or_else(|| {
        ApiError::unreadable_reply(Operation::Subscriptions, http_status, "the reply names no subscription", body)
    })
}

/// One subscription; `None` without an id.
fn read_subscription(item: &Value) -> Option<Subscription> {
    let short = |value: Option<&Value>| -> Option<String> {
        wire::text(value).map(|text| text.chars().filter(|c| !c.is_control()).take(MAX_FIELD_CHARS).collect())
    };
    let id = short(item.get("id")).filter(|id| !id.is_empty())?;
    let source = item.get("source");
    let model = source.and_then(|source| short(source.get("model_name")).or_else(|| short(source.get("modelName"))));
    let events = match item.get("events") {
        Some(Value::Array(events)) => events.iter().filter_map(|event| short(Some(event))).take(64).collect(),
        _ => Vec::new(),
    };
    Some(Subscription {
        id,
        name: short(item.get("name")).unwrap_or_default(),
        source_type: short(source.and_then(|source| source.get("type"))).unwrap_or_default(),
        model,
        queue_id: short(item.get("destination").and_then(|destination| destination.get("queue_id"))),
        enabled: wire::flag(item.get("enabled")).unwrap_or(true),
        events,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subscription(id: &str, model: &str, enabled: bool, events: &[&str]) -> Subscription {
        Subscription {
            id: id.into(),
            name: format!("batchd {model}"),
            source_type: SOURCE_TYPE.into(),
            model: Some(model.into()),
            queue_id: Some("q".into()),
            enabled,
            events: events.iter().map(|event| (*event).to_owned()).collect(),
        }
    }

    #[test]
    fn the_plan_creates_what_is_missing_and_completes_what_is_partial() {
        let subs = [
            subscription("s1", "@cf/a", true, &["batch.succeeded", "batch.failed"]),
            subscription("s2", "@cf/b", true, &["batch.queued", "batch.succeeded"]),
            subscription("s3", "@cf/c", false, &["batch.succeeded", "batch.failed"]),
            subscription(
                "s4",
                "@cf/e",
                true,
                &["cf.workersAi.model.batch.succeeded", "cf.workersAi.model.batch.failed"],
            ),
            Subscription { queue_id: Some("other".into()), ..subscription("s5", "@cf/d", true, &BATCH_EVENTS) },
        ];
        let steps = plan(["@cf/a", "@cf/b", "@cf/c", "@cf/d", "@cf/e", "@cf/a"], &subs, "q");
        assert_eq!(
            steps,
            [
                Step::Ready { model: "@cf/a".into(), id: "s1".into() },
                Step::Update {
                    model: "@cf/b".into(),
                    id: "s2".into(),
                    events: vec!["batch.queued".into(), "batch.succeeded".into(), "batch.failed".into()]
                },
                Step::Update {
                    model: "@cf/c".into(),
                    id: "s3".into(),
                    events: vec!["batch.succeeded".into(), "batch.failed".into()]
                },
                Step::Create { model: "@cf/d".into() },
                Step::Ready { model: "@cf/e".into(), id: "s4".into() },
            ],
            "another queue's subscription does not count; full type names do"
        );
    }

    #[test]
    fn list_replies_are_read_field_by_field() {
        let body = serde_json::json!({
            "success": true, "errors": [], "messages": [],
            "result_info": {"page": 1, "per_page": 50, "total_pages": 1},
            "result": [
                {"id": "s1", "name": "n", "enabled": true, "events": ["batch.succeeded", "batch.failed"],
                 "source": {"type": "workersAi.model", "model_name": "@cf/baai/bge-m3"},
                 "destination": {"type": "queues.queue", "queue_id": "q"},
                 "created_at": "2026-01-01T00:00:00Z", "modified_at": "2026-01-01T00:00:00Z"},
                {"id": "s2", "source": {"type": "kv"}, "events": "not a list"},
                {"name": "no id"}
            ]
        });
        let (subs, n_items, total) = read_list(200, body.to_string().as_bytes()).expect("readable");
        assert_eq!((n_items, total), (3, Some(1)));
        assert_eq!(subs.len(), 2);
        assert!(subs[0].is_for("@cf/baai/bge-m3", "q") && subs[0].delivers_batch_events());
        assert!(!subs[1].is_for("@cf/baai/bge-m3", "q") && subs[1].events.is_empty());
        let refused = br#"{"success":false,"errors":[{"code":10000,"message":"Authentication error"}]}"#;
        assert!(read_list(200, refused).is_err());
    }
}
