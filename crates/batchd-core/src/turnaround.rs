//! The remote-completion counters per model ([`crate::Keys::stats_turnaround`]): how long a model's batches took
//! from their submit to their completion at the remote API, counted in fixed buckets. The daemon writes the
//! fields built here; `batchd status` and the dashboard read them back here and take p50/p95 from the buckets, so
//! writer and readers cannot disagree on a field or a bound.

use std::collections::BTreeMap;
use std::time::Duration;

/// Upper bounds (seconds) of the buckets: one minute to a day, the span of a batch's life (a time above the last
/// bound counts in the `inf` bucket).
pub const BOUNDS_SECS: [u64; 14] =
    [60, 120, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 64_800, 86_400, 172_800];

/// The bucket name of the times above every bound.
const OVERFLOW: &str = "inf";

/// Most characters of a model name kept in a field (the model is a producer's text).
const MAX_MODEL_CHARS: usize = 64;

/// The bucket (index into [`BOUNDS_SECS`], or its length for the overflow) that `elapsed` counts in.
pub fn bucket(elapsed: Duration) -> usize {
    let secs = elapsed.as_secs_f64();
    BOUNDS_SECS.iter().position(|bound| secs <= *bound as f64).unwrap_or(BOUNDS_SECS.len())
}

/// The field counting `model`'s batches of `bucket`: `<model>:<upper bound in seconds>` or `<model>:inf`.
pub fn field(model: &str, bucket: usize) -> String {
    let model: String = model.chars().take(MAX_MODEL_CHARS).collect();
    match BOUNDS_SECS.get(bucket) {
        Some(bound) => format!("{model}:{bound}"),
        None => format!("{model}:{OVERFLOW}"),
    }
}

/// Reads a field written by [`field`] back into `(model, bucket)`; `None` for anything else.
pub fn parse_field(name: &str) -> Option<(&str, usize)> {
    let (model, bound) = name.rsplit_once(':')?;
    let bucket = match bound {
        OVERFLOW => BOUNDS_SECS.len(),
        bound => BOUNDS_SECS.iter().position(|b| bound.parse::<u64>().is_ok_and(|n| n == *b))?,
    };
    (!model.is_empty()).then_some((model, bucket))
}

/// Batch counts per bucket of one model: index `i` counts the times up to `BOUNDS_SECS[i]`, the last the overflow.
pub type Buckets = [u64; BOUNDS_SECS.len() + 1];

/// What a model's batches usually take: p50 and p95 as bucket upper bounds (`None`: above the last bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Usual {
    /// Batches counted.
    pub n_batches: u64,
    /// The upper bound (seconds) of the bucket holding the median; `None` when it is the overflow.
    pub p50_secs: Option<u64>,
    /// The upper bound (seconds) of the bucket holding the 95th percentile; `None` when it is the overflow.
    pub p95_secs: Option<u64>,
}

impl Usual {
    /// The quantiles of `buckets`; `None` when they count nothing.
    pub fn of(buckets: &Buckets) -> Option<Self> {
        let n_batches: u64 = buckets.iter().sum();
        (n_batches > 0).then(|| Self {
            n_batches,
            p50_secs: quantile(buckets, n_batches, 0.50),
            p95_secs: quantile(buckets, n_batches, 0.95),
        })
    }

    /// Whether a batch of age `age` is older than the 95th percentile (never, when p95 is the overflow).
    pub fn exceeded_by(&self, age: Duration) -> bool {
        self.p95_secs.is_some_and(|p95| age.as_secs() > p95)
    }
}

/// The hours the figures cover, as operators read them.
pub const WINDOW_TEXT: &str = "last 24 h";

/// How a batch of `model` that has been out for `age` compares with the model's usual time, in the one wording
/// `batchd status` and the dashboard share: `usual for <model>: p50 ≤ 5m, p95 ≤ 1h (12 batches, last 24 h)`,
/// with `; older than 95% of this model's batches` when `age` is past p95, or `usual for <model>: no history yet`.
pub fn compare_text(model: &str, usual: Option<&Usual>, age: Duration) -> String {
    match usual {
        None => format!("usual for {model}: no history yet"),
        Some(usual) => {
            let flag = if usual.exceeded_by(age) { "; older than 95% of this model's batches" } else { "" };
            format!(
                "usual for {model}: p50 {}, p95 {} ({} batches, {WINDOW_TEXT}){flag}",
                human_bound(usual.p50_secs),
                human_bound(usual.p95_secs),
                usual.n_batches,
            )
        }
    }
}

/// The upper bound of the bucket holding the `q` quantile of `n` counts (the first bucket whose running total
/// reaches `ceil(q * n)`); `None` when that is the overflow bucket.
fn quantile(buckets: &Buckets, n: u64, q: f64) -> Option<u64> {
    let rank = ((q * n as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (index, count) in buckets.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return BOUNDS_SECS.get(index).copied();
        }
    }
    None
}

/// Sums counter hashes (each as `HGETALL` returns it) into buckets per model; fields that are not counters are
/// skipped.
pub fn sum<'a>(hashes: impl IntoIterator<Item = &'a Vec<(String, u64)>>) -> BTreeMap<String, Buckets> {
    let mut models: BTreeMap<String, Buckets> = BTreeMap::new();
    for (name, n) in hashes.into_iter().flatten() {
        if let Some((model, bucket)) = parse_field(name) {
            models.entry(model.to_owned()).or_insert([0; BOUNDS_SECS.len() + 1])[bucket] += n;
        }
    }
    models
}

/// A duration as an operator reads it: `45s`, `12m`, `3h05m`, `2d4h`.
pub fn human(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..86_400 => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{}h", secs / 86_400, secs % 86_400 / 3600),
    }
}

/// A quantile as an operator reads it: `≤ 5m`, or `> 2d0h` for the overflow.
pub fn human_bound(secs: Option<u64>) -> String {
    match secs {
        Some(secs) => format!("≤ {}", human(Duration::from_secs(secs))),
        None => format!("> {}", human(Duration::from_secs(BOUNDS_SECS[BOUNDS_SECS.len() - 1]))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_models_may_hold_colons() {
        for bucket in 0..=BOUNDS_SECS.len() {
            let name = field("@cf/meta/llama-3:8b", bucket);
            assert_eq!(parse_field(&name), Some(("@cf/meta/llama-3:8b", bucket)), "{name}");
        }
        assert_eq!(parse_field("m:61"), None, "not a bound");
        assert_eq!(parse_field(":60"), None);
        assert_eq!(parse_field("finished:completed"), None);
        assert_eq!(bucket(Duration::from_secs(60)), 0);
        assert_eq!(bucket(Duration::from_millis(60_001)), 1);
        assert_eq!(bucket(Duration::from_secs(10 * 86_400)), BOUNDS_SECS.len());
    }

    #[test]
    fn quantiles_are_the_bounds_of_the_buckets_that_hold_them() {
        let mut buckets: Buckets = [0; BOUNDS_SECS.len() + 1];
        assert_eq!(Usual::of(&buckets), None);
        // 10 batches: 5 within a minute, 4 within 5 minutes, 1 within an hour.
        buckets[0] = 5;
        buckets[2] = 4;
        buckets[6] = 1;
        let usual = Usual::of(&buckets).expect("counts");
        assert_eq!(usual, Usual { n_batches: 10, p50_secs: Some(60), p95_secs: Some(3600) });
        assert!(usual.exceeded_by(Duration::from_secs(3601)));
        assert!(!usual.exceeded_by(Duration::from_secs(3600)));
        // One batch: both quantiles are its bucket.
        let mut one: Buckets = [0; BOUNDS_SECS.len() + 1];
        one[3] = 1;
        assert_eq!(Usual::of(&one).map(|u| (u.p50_secs, u.p95_secs)), Some((Some(600), Some(600))));
        // The overflow has no bound and never flags an age.
        let mut late: Buckets = [0; BOUNDS_SECS.len() + 1];
        late[BOUNDS_SECS.len()] = 3;
        let usual = Usual::of(&late).expect("counts");
        assert_eq!((usual.p50_secs, usual.p95_secs), (None, None));
        assert!(!usual.exceeded_by(Duration::from_secs(u64::MAX / 2)));
        assert_eq!(human_bound(None), "> 2d0h");
        assert_eq!(human_bound(Some(300)), "≤ 5m");
        assert_eq!(human(Duration::from_secs(3900)), "1h05m");
        let usual = Usual::of(&buckets).expect("counts");
        assert_eq!(compare_text("m", None, Duration::ZERO), "usual for m: no history yet");
        assert_eq!(
            compare_text("m", Some(&usual), Duration::from_secs(10)),
            "usual for m: p50 ≤ 1m, p95 ≤ 1h00m (10 batches, last 24 h)"
        );
        assert!(
            compare_text("m", Some(&usual), Duration::from_secs(4000))
                .ends_with("; older than 95% of this model's batches")
        );
    }

    #[test]
    fn sums_add_the_hours_per_model_and_skip_other_fields() {
        let hours = vec![
            vec![(field("a", 0), 2), (field("b", 1), 1), ("junk".to_owned(), 9)],
            vec![(field("a", 0), 3), (field("a", BOUNDS_SECS.len()), 1)],
        ];
        let models = sum(&hours);
        assert_eq!(models.len(), 2);
        assert_eq!(models["a"][0], 5);
        assert_eq!(models["a"][BOUNDS_SECS.len()], 1);
        assert_eq!(models["b"][1], 1);
    }
}
