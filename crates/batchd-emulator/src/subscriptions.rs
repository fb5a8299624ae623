//! Event subscriptions, as Cloudflare's API describes them (`/accounts/{account}/event_subscriptions/
//! subscriptions`): a subscription has a source (`{"type":"workersAi.model","model_name":...}`), a destination
//! (`{"type":"queues.queue","queue_id":...}`), a list of event types (short names, `batch.succeeded`) and an
//! `enabled` flag. With [`crate::EventsConfig::all_models`] off, a model's batch event reaches the queue only
//! through an enabled subscription of that model and event to that queue.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The one source type the emulator knows (any other is refused, 400).
pub const WORKERS_AI_SOURCE: &str = "workersAi.model";

/// The one destination type.
pub const QUEUE_DESTINATION: &str = "queues.queue";

/// The event types a Workers AI model subscription may name.
pub const WORKERS_AI_EVENTS: [&str; 3] = ["batch.queued", "batch.succeeded", "batch.failed"];

/// One stored subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    /// Its id (32 hex digits).
    pub id: String,
    /// Its name.
    pub name: String,
    /// The model of its `workersAi.model` source.
    pub model: String,
    /// The queue it delivers to.
    pub queue_id: String,
    /// Whether it delivers.
    pub enabled: bool,
    /// The event types it delivers (short names).
    pub events: Vec<String>,
}

impl Subscription {
    /// The JSON the API answers for it.
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "name": self.name,
            "enabled": self.enabled,
            "events": self.events,
            "source": {"type": WORKERS_AI_SOURCE, "model_name": self.model},
            "destination": {"type": QUEUE_DESTINATION, "queue_id": self.queue_id},
            "created_at": "2026-01-01T00:00:00.000Z",
            "modified_at": "2026-01-01T00:00:00.000Z",
        })
    }
}

/// Every subscription of the account, in creation order.
#[derive(Debug, Default)]
pub(crate) struct Subscriptions {
    /// The subscriptions.
    list: Vec<Subscription>,
    /// Subscriptions created since start (ids are derived from it).
    n_created: u64,
}

impl Subscriptions {
    /// The id of an enabled subscription that delivers `event` (short name) of `model` to `queue_id`.
    pub fn covering(&self, model: &str, queue_id: &str, event: &str) -> Option<&str> {
        self.list
            .iter()
            .find(|sub| {
                sub.enabled && sub.model == model && sub.queue_id == queue_id && sub.events.iter().any(|e| e == event)
            })
            .map(|sub| sub.id.as_str())
    }

    /// Every subscription, or those delivering to `queue_id`.
    pub fn list(&self, queue_id: Option<&str>) -> Vec<Subscription> {
        self.list.iter().filter(|sub| queue_id.is_none_or(|queue| sub.queue_id == queue)).cloned().collect()
    }

    /// Stores a new subscription; refuses a second one for the same model and queue (the live API allows one
    /// subscription per source, as far as third-party tooling says).
    pub fn create(
        &mut self,
        name: String,
        model: String,
        queue_id: String,
        enabled: bool,
        events: Vec<String>,
    ) -> Result<Subscription, String> {
        if self.list.iter().any(|sub| sub.model == model && sub.queue_id == queue_id) {
            return Err(format!("a subscription of {model} to this queue exists already"));
        }
        self.n_created += 1;
        let id = format!("{:032x}", 0x5eb5_u64.wrapping_mul(1_000_003).wrapping_add(self.n_created));
        let subscription = Subscription { id, name, model, queue_id, enabled, events };
        self.list.push(subscription.clone());
        Ok(subscription)
    }

    /// Changes subscription `id`: its enabled flag and events, where given.
    pub fn update(&mut self, id: &str, enabled: Option<bool>, events: Option<Vec<String>>) -> Option<Subscription> {
        let sub = self.list.iter_mut().find(|sub| sub.id == id)?;
        if let Some(enabled) = enabled {
            sub.enabled = enabled;
        }
        if let Some(events) = events {
            sub.events = events;
        }
        Some(sub.clone())
    }

    /// Removes subscription `id`.
    pub fn delete(&mut self, id: &str) -> Option<Subscription> {
        let at = self.list.iter().position(|sub| sub.id == id)?;
        Some(self.list.remove(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_covers_its_model_queue_and_events_while_enabled() {
        let mut subs = Subscriptions::default();
        let events = vec!["batch.succeeded".to_owned()];
        let sub = subs.create("n".into(), "@cf/a".into(), "q".into(), true, events.clone()).expect("created");
        assert_eq!(subs.covering("@cf/a", "q", "batch.succeeded"), Some(sub.id.as_str()));
        assert_eq!(subs.covering("@cf/a", "q", "batch.failed"), None);
        assert_eq!(subs.covering("@cf/b", "q", "batch.succeeded"), None);
        assert_eq!(subs.covering("@cf/a", "other", "batch.succeeded"), None);
        assert!(subs.create("again".into(), "@cf/a".into(), "q".into(), true, events).is_err());
        subs.update(&sub.id, Some(false), None).expect("exists");
        assert_eq!(subs.covering("@cf/a", "q", "batch.succeeded"), None);
        assert_eq!(subs.list(Some("q")).len(), 1);
        assert_eq!(subs.list(Some("other")).len(), 0);
        assert!(subs.delete(&sub.id).is_some());
        assert!(subs.list(None).is_empty());
    }
}
