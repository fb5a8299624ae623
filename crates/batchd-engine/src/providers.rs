//! The providers one daemon serves, by routing name: a job's model name picks one
//! ([`batchd_core::ModelName::provider`]), and a model whose provider is not configured is refused at take-in
//! with the setting to add, as the kind's registration ([`batchd_provider::Kind`]) says it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use batchd_core::ModelName;
use batchd_provider::{Kind, Provider};

/// Every configured provider, by routing name, and the API calls in flight to each.
#[derive(Debug, Clone, Default)]
pub struct Providers {
    /// The providers, by [`Provider::name`].
    by_name: BTreeMap<String, Arc<dyn Provider>>,
    /// API calls in flight per provider, shared by every clone (every namespace of the process).
    in_flight: BTreeMap<String, Arc<AtomicUsize>>,
    /// Most API calls in flight to one provider at once (`workers.calls_per_provider`); 0: no cap.
    max_calls: usize,
    /// Every provider kind the daemon knows (configured or not), for the refusal of a model none serves.
    kinds: Vec<&'static Kind>,
}

/// One API call's place among its provider's calls in flight ([`Providers::call_slot`]); given back on drop.
#[derive(Debug)]
pub struct CallSlot {
    count: Arc<AtomicUsize>,
    provider: String,
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        let now = self.count.fetch_sub(1, Ordering::AcqRel) - 1;
        crate::metrics::calls_in_flight(&self.provider, now);
    }
}

impl Providers {
    /// No providers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `provider` under its name (replacing one of the same name).
    pub fn with(mut self, provider: Arc<dyn Provider>) -> Self {
        self.in_flight.entry(provider.name().to_owned()).or_default();
        self.by_name.insert(provider.name().to_owned(), provider);
        self
    }

    /// Every provider kind the daemon knows (the registry), so that a job for a kind that is not configured is
    /// refused naming what to set.
    pub fn with_kinds(mut self, kinds: impl IntoIterator<Item = &'static Kind>) -> Self {
        self.kinds = kinds.into_iter().collect();
        self
    }

    /// Caps the API calls in flight to each provider at `max` (0: no cap), so that one slow provider cannot hold
    /// every worker: a step that finds its provider at the cap is rescheduled, like a throttled one.
    pub fn with_call_cap(mut self, max: usize) -> Self {
        self.max_calls = max;
        self
    }

    /// A place for one API call to `provider`, or `None` while its calls in flight are at the cap.
    pub fn call_slot(&self, provider: &str) -> Option<CallSlot> {
        let count = self.in_flight.get(provider)?;
        let taken = count.fetch_add(1, Ordering::AcqRel) + 1;
        let slot = CallSlot { count: Arc::clone(count), provider: provider.to_owned() };
        if self.max_calls > 0 && taken > self.max_calls {
            drop(slot);
            return None;
        }
        crate::metrics::calls_in_flight(provider, taken);
        Some(slot)
    }

    /// The provider that runs `model`, or a sentence saying which one it needs and how to configure it.
    pub fn for_model(&self, model: &ModelName) -> Result<&Arc<dyn Provider>, String> {
        let name = model.provider();
        self.by_name.get(name).ok_or_else(|| match self.kinds.iter().find(|kind| kind.name == name) {
            Some(kind) => format!(
                "model {model} runs on the {name} provider, which this daemon does not have configured; {}",
                kind.configure
            ),
            None => {
                let known: Vec<&str> = self.kinds.iter().flat_map(|kind| kind.models.iter().copied()).collect();
                format!(
                    "model {model} runs on the {name} provider, which this daemon does not have configured; use a \
                     model name of a provider batchd supports ({})",
                    known.join(", ")
                )
            }
        })
    }

    /// The routing names configured, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_at_its_cap_gets_no_slot_until_one_is_given_back() {
        let count = Arc::new(AtomicUsize::new(0));
        let providers = Providers {
            in_flight: BTreeMap::from([("p".to_owned(), Arc::clone(&count))]),
            max_calls: 2,
            ..Providers::default()
        };
        let first = providers.call_slot("p").expect("a slot");
        let second = providers.call_slot("p").expect("a slot");
        assert!(providers.call_slot("p").is_none(), "the cap is 2");
        assert_eq!(count.load(Ordering::Acquire), 2, "a refused slot is not counted");
        drop(first);
        let third = providers.call_slot("p").expect("a slot given back is free again");
        drop((second, third));
        assert_eq!(count.load(Ordering::Acquire), 0);
        assert!(providers.call_slot("unknown").is_none());
        let uncapped = Providers { max_calls: 0, ..providers };
        let slots: Vec<CallSlot> = (0..100).map(|_| uncapped.call_slot("p").expect("no cap")).collect();
        assert_eq!(count.load(Ordering::Acquire), 100);
        drop(slots);
    }
}
