//! How long each model's remote batches took, counted in this process until the admin sampler flushes the counts
//! into Redis ([`batchd_core::Keys::stats_turnaround`]): no Redis command is added per job. The poll step
//! [`record`]s each finished batch; the sampler [`take`]s the counts every sample and [`give_back`]s them when
//! Redis could not be written. A crash loses at most one sample's counts.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use batchd_core::turnaround::{BOUNDS_SECS, Buckets, bucket};

/// Most models counted per namespace between two flushes; a batch of a further model is not counted (and logged
/// at debug level), so a producer naming a new model per job cannot grow a flush (or a Redis hash) without bound.
pub const MAX_MODELS: usize = 64;

/// The counts not flushed yet: per namespace, per model.
static PENDING: Mutex<BTreeMap<String, BTreeMap<String, Buckets>>> = Mutex::new(BTreeMap::new());

/// Counts one batch of `model` in `namespace` that took `elapsed`; `false` when the namespace already counts
/// [`MAX_MODELS`] other models since the last flush (the batch is not counted).
pub fn record(namespace: &str, model: &str, elapsed: Duration) -> bool {
    let mut pending = PENDING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let models = pending.entry(namespace.to_owned()).or_default();
    if !models.contains_key(model) && models.len() >= MAX_MODELS {
        return false;
    }
    models.entry(model.to_owned()).or_insert([0; BOUNDS_SECS.len() + 1])[bucket(elapsed)] += 1;
    true
}

/// Takes the counts of `namespace` recorded since the last take (at most [`MAX_MODELS`] models).
pub fn take(namespace: &str) -> BTreeMap<String, Buckets> {
    let mut pending = PENDING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    pending.remove(namespace).unwrap_or_default()
}

/// Adds back counts that [`take`] gave and that could not be written, within the same [`MAX_MODELS`] bound.
pub fn give_back(namespace: &str, counts: BTreeMap<String, Buckets>) {
    let mut pending = PENDING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let models = pending.entry(namespace.to_owned()).or_default();
    for (model, buckets) in counts {
        if !models.contains_key(&model) && models.len() >= MAX_MODELS {
            continue;
        }
        let into = models.entry(model).or_insert([0; BOUNDS_SECS.len() + 1]);
        for (into, n) in into.iter_mut().zip(buckets) {
            *into += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_taken_once_given_back_and_bounded_in_models() {
        let ns = "turnaround-unit";
        assert!(record(ns, "m", Duration::from_secs(30)));
        assert!(record(ns, "m", Duration::from_secs(30)));
        let taken = take(ns);
        assert_eq!(taken["m"][0], 2);
        assert!(take(ns).is_empty(), "taken once");
        give_back(ns, taken);
        assert!(record(ns, "m", Duration::from_secs(30)));
        assert_eq!(take(ns)["m"][0], 3);
        for n in 0..MAX_MODELS {
            assert!(record(ns, &format!("model-{n}"), Duration::from_secs(1)));
        }
        assert!(!record(ns, "one-too-many", Duration::from_secs(1)));
        assert!(record(ns, "model-0", Duration::from_secs(1)), "a counted model still counts");
        assert_eq!(take(ns).len(), MAX_MODELS);
    }
}
