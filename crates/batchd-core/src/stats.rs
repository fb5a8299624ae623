//! The fields of the finished-jobs counters ([`crate::Keys::stats_minute`], [`crate::Keys::stats_hour`]): built
//! here for the storage that writes them and read back here for the dashboard, so the two cannot disagree.

use std::collections::{BTreeMap, HashMap};

/// Token kinds counted from a result's `usage`, each with the usage keys that hold it: `prompt_tokens` and
/// `completion_tokens` (Workers AI, OpenAI's chat, completions and embeddings), `input_tokens` and `output_tokens`
/// (Anthropic, OpenAI's Responses API). Anthropic's cache tokens are not counted as prompt tokens.
pub const TOKEN_KINDS: [(&str, [&str; 2]); 2] =
    [("prompt", ["prompt_tokens", "input_tokens"]), ("completion", ["completion_tokens", "output_tokens"])];

/// The positive token counts of a `usage` object by kind ([`TOKEN_KINDS`]; the first of a kind's keys that holds a
/// positive integer; other keys and non-numbers are ignored).
pub fn token_counts(usage: &serde_json::Value) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    TOKEN_KINDS.iter().filter_map(move |(kind, keys)| {
        let count = |key: &&str| usage.get(*key).and_then(serde_json::Value::as_u64).filter(|n| *n > 0);
        keys.iter().find_map(count).map(|n| (*kind, n))
    })
}

/// Most characters of a model name kept in a counter's field name (a rejected entry's model is a producer's text).
const MAX_MODEL_CHARS: usize = 64;

/// The counter of results published with `status` (`completed`, `failed`, `expired`, `cancelled`).
pub fn finished_field(status: &str) -> String {
    format!("finished:{status}")
}

/// The counter of `kind` tokens (`prompt`, `completion`) used by `model`.
pub fn tokens_field(kind: &str, model: &str) -> String {
    let model: String = model.chars().take(MAX_MODEL_CHARS).collect();
    format!("tokens:{kind}:{model}")
}

/// The counter of what `model`'s finished jobs cost, in nano-dollars (the `cost_usd` of their `usage`).
pub fn cost_field(model: &str) -> String {
    let model: String = model.chars().take(MAX_MODEL_CHARS).collect();
    format!("cost_nusd:{model}")
}

/// The increments one finished job makes: one `finished:<status>`, plus the positive token counts of its `usage`,
/// plus its cost in nano-dollars when its `usage` carries a positive `cost_usd`.
pub fn increments(status: &str, model: &str, usage: Option<&serde_json::Value>) -> Vec<(String, u64)> {
    let mut fields = vec![(finished_field(status), 1)];
    fields.extend(usage.into_iter().flat_map(token_counts).map(|(kind, n)| (tokens_field(kind, model), n)));
    let cost = usage.and_then(crate::pricing::usage_cost_nano).filter(|nano| *nano > 0);
    fields.extend(cost.map(|nano| (cost_field(model), nano)));
    fields
}

/// One counter field, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatField<'a> {
    /// Results published with this status.
    Finished(&'a str),
    /// Tokens of this kind used by this model.
    Tokens {
        /// `prompt` or `completion`.
        kind: &'a str,
        /// The model's name.
        model: &'a str,
    },
    /// What this model's finished jobs cost, in nano-dollars.
    Cost(&'a str),
}

impl<'a> StatField<'a> {
    /// Reads a field name written by [`finished_field`], [`tokens_field`] or [`cost_field`]; `None` for anything
    /// else.
    pub fn parse(name: &'a str) -> Option<Self> {
        if let Some(status) = name.strip_prefix("finished:") {
            return Some(Self::Finished(status));
        }
        if let Some(model) = name.strip_prefix("cost_nusd:") {
            return Some(Self::Cost(model));
        }
        let (kind, model) = name.strip_prefix("tokens:")?.split_once(':')?;
        Some(Self::Tokens { kind, model })
    }
}

/// What counter hashes add up to: finished jobs by status, tokens by model and kind, and cost by model. Every
/// reader of the counters (the dashboard's chart, tokens and cost, `batchd stats`, the daily budget) sums them
/// here.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    /// Results published, by status.
    pub finished: BTreeMap<String, u64>,
    /// Tokens by model, then by kind (`prompt`, `completion`).
    pub tokens: BTreeMap<String, BTreeMap<String, u64>>,
    /// What finished jobs cost, in nano-dollars, by model (only models with a price).
    pub cost_nano: BTreeMap<String, u64>,
}

impl Totals {
    /// The sums of `hashes` (each a counter hash as `HGETALL` returns it); fields that are not counters are skipped.
    pub fn of<'a>(hashes: impl IntoIterator<Item = &'a HashMap<String, u64>>) -> Self {
        let mut totals = Self::default();
        for (name, n) in hashes.into_iter().flatten() {
            match StatField::parse(name) {
                Some(StatField::Finished(status)) => *totals.finished.entry(status.to_owned()).or_default() += n,
                Some(StatField::Tokens { kind, model }) => {
                    *totals.tokens.entry(model.to_owned()).or_default().entry(kind.to_owned()).or_default() += n;
                }
                Some(StatField::Cost(model)) => *totals.cost_nano.entry(model.to_owned()).or_default() += n,
                None => {}
            }
        }
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden: the fields are part of the documented key layout (docs/wire-format.md).
    #[test]
    fn fields_are_stable_and_read_back() {
        let usage = serde_json::json!({"prompt_tokens": 12, "completion_tokens": 0, "total_tokens": 12});
        let fields = increments("completed", "@cf/baai/bge-m3", Some(&usage));
        assert_eq!(fields, [("finished:completed".to_owned(), 1), ("tokens:prompt:@cf/baai/bge-m3".to_owned(), 12)]);
        assert_eq!(StatField::parse(&fields[0].0), Some(StatField::Finished("completed")));
        assert_eq!(
            StatField::parse(&fields[1].0),
            Some(StatField::Tokens { kind: "prompt", model: "@cf/baai/bge-m3" })
        );
        assert_eq!(StatField::parse("other"), None);
        assert_eq!(increments("failed", "", None), [("finished:failed".to_owned(), 1)]);
        let priced = serde_json::json!({"prompt_tokens": 12, "cost_usd": 0.000000144});
        let fields = increments("completed", "@cf/baai/bge-m3", Some(&priced));
        assert_eq!(fields[2], ("cost_nusd:@cf/baai/bge-m3".to_owned(), 144));
        assert_eq!(StatField::parse(&fields[2].0), Some(StatField::Cost("@cf/baai/bge-m3")));
        let free = serde_json::json!({"prompt_tokens": 12, "cost_usd": 0.0});
        assert_eq!(increments("completed", "m", Some(&free)).len(), 2, "a cost of 0 is not counted");
    }

    #[test]
    fn counters_add_up_by_status_and_by_model() {
        let hash = |pairs: &[(&str, u64)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect::<HashMap<_, _>>();
        let a = hash(&[("finished:completed", 2), ("tokens:prompt:m", 10), ("other", 7), ("cost_nusd:m", 30)]);
        let b = hash(&[("finished:completed", 1), ("finished:failed", 4), ("tokens:prompt:m", 5), ("cost_nusd:m", 12)]);
        let totals = Totals::of([&a, &b]);
        assert_eq!(totals.cost_nano["m"], 42);
        assert_eq!(totals.finished, BTreeMap::from([("completed".to_owned(), 3), ("failed".to_owned(), 4)]));
        assert_eq!(totals.tokens["m"]["prompt"], 15);
        assert_eq!(Totals::of([]), Totals::default());
    }

    #[test]
    fn every_providers_usage_names_count() {
        let counts = |usage: serde_json::Value| token_counts(&usage).collect::<Vec<_>>();
        let anthropic = serde_json::json!({"input_tokens": 30, "output_tokens": 6, "cache_read_input_tokens": 3});
        assert_eq!(counts(anthropic), [("prompt", 30), ("completion", 6)]);
        let openai_chat = serde_json::json!({"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13});
        assert_eq!(counts(openai_chat), [("prompt", 9), ("completion", 4)]);
        let odd =
            serde_json::json!({"prompt_tokens": 0, "input_tokens": 5, "output_tokens": "7", "completion_tokens": -1});
        assert_eq!(counts(odd), [("prompt", 5)]);
        assert_eq!(counts(serde_json::json!([1, 2])), []);
    }

    #[test]
    fn a_long_model_name_is_cut() {
        assert_eq!(tokens_field("prompt", &"m".repeat(500)).len(), "tokens:prompt:".len() + MAX_MODEL_CHARS);
    }
}
