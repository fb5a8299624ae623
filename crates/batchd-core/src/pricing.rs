//! What a batch costs: each model's batch prices and the cost in USD of a result's `usage`.
//!
//! Prices are what a provider charges in a batch (its batch discount applied: 50% of the interactive price at
//! OpenAI, Anthropic and Gemini; Workers AI documents no batch discount). A built-in table ([`default_prices`]),
//! read on [`PRICES_READ`] from the sources docs/cost.md names, covers the common models; `[pricing]` in the
//! configuration replaces a model's entry or adds one. A model with no price has no cost: batchd never guesses.
//! No I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The day the built-in prices were read from their sources (docs/cost.md).
pub const PRICES_READ: &str = "2026-11-28";

/// The batch discount applied to an interactive price to get the built-in batch prices of OpenAI, Anthropic and
/// Gemini (their batch APIs charge half the interactive price).
pub const BATCH_DISCOUNT: f64 = 0.5;

/// USD per 1,000 Workers AI neurons (Workers Paid, above the free 10,000 a day), the default of
/// `pricing.neuron_usd_per_thousand`.
pub const NEURON_USD_PER_THOUSAND: f64 = 0.011;

/// One model's batch prices. Token prices are USD per million tokens in a batch; a Workers AI model may give its
/// prices in neurons per million tokens instead, billed at `pricing.neuron_usd_per_thousand`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// The model as jobs name it (`openai/gpt-4o-mini`, `@cf/baai/bge-m3`): its provider's prefix included.
    pub model: String,
    /// USD per million input (prompt) tokens; cache writes are billed at this price too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<f64>,
    /// USD per million output (completion) tokens, thinking tokens included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<f64>,
    /// USD per million input tokens read from the provider's prompt cache; absent: billed as input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
    /// Workers AI: neurons per million input tokens (instead of `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_neurons: Option<f64>,
    /// Workers AI: neurons per million output tokens (instead of `output`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_neurons: Option<f64>,
}

impl ModelPrice {
    /// A price in USD per million input and output tokens, with an optional cached-input price.
    fn usd(model: &str, input: f64, output: f64, cached_input: Option<f64>) -> Self {
        Self { model: model.to_owned(), input: Some(input), output: Some(output), cached_input, ..Self::default() }
    }

    /// An interactive price in USD per million tokens, as a provider lists it, with [`BATCH_DISCOUNT`] applied.
    fn discounted(model: &str, input: f64, output: f64, cached_input: Option<f64>) -> Self {
        let batch = |usd: f64| usd * BATCH_DISCOUNT;
        Self::usd(model, batch(input), batch(output), cached_input.map(batch))
    }

    /// A Workers AI price in neurons per million input and output tokens.
    fn neurons(model: &str, input: f64, output: f64) -> Self {
        Self { model: model.to_owned(), input_neurons: Some(input), output_neurons: Some(output), ..Self::default() }
    }

    /// What is wrong with this entry, when something is: a price that is negative or not a number, or a model
    /// with no price at all.
    pub fn problem(&self) -> Option<String> {
        let prices = [
            ("input", self.input),
            ("output", self.output),
            ("cached_input", self.cached_input),
            ("input_neurons", self.input_neurons),
            ("output_neurons", self.output_neurons),
        ];
        let bad =
            prices.iter().find_map(|(name, value)| value.filter(|v| !v.is_finite() || *v < 0.0).map(|v| (name, v)));
        if let Some((name, value)) = bad {
            return Some(format!("{name} of {} is {value}: a price is a number of 0 or more", self.model));
        }
        if prices.iter().all(|(_, value)| value.is_none()) {
            return Some(format!(
                "{} has no price: give input, output (USD) or input_neurons, output_neurons",
                self.model
            ));
        }
        None
    }
}

/// The built-in batch prices (docs/cost.md names the source of each, read on [`PRICES_READ`]). Models not listed
/// have no default: their sources could not be read.
pub fn default_prices() -> Vec<ModelPrice> {
    vec![
        // OpenAI: interactive prices (USD per million tokens) from platform.openai.com/docs/pricing as
        // pydantic/genai-prices records them; the Batch API charges half.
        ModelPrice::discounted("openai/gpt-4o-mini", 0.15, 0.6, Some(0.075)),
        ModelPrice::discounted("openai/gpt-4o", 2.5, 10.0, Some(1.25)),
        ModelPrice::discounted("openai/gpt-4.1", 2.0, 8.0, Some(0.5)),
        ModelPrice::discounted("openai/gpt-4.1-mini", 0.4, 1.6, Some(0.1)),
        ModelPrice::discounted("openai/gpt-4.1-nano", 0.1, 0.4, Some(0.025)),
        ModelPrice::discounted("openai/gpt-5", 1.25, 10.0, Some(0.125)),
        ModelPrice::discounted("openai/gpt-5-mini", 0.25, 2.0, Some(0.025)),
        ModelPrice::discounted("openai/gpt-5-nano", 0.05, 0.4, Some(0.005)),
        // Anthropic: batch prices as docs.anthropic.com's batch-processing page lists them (already 50%).
        ModelPrice::usd("anthropic/claude-opus-4-1-20250805", 7.5, 37.5, None),
        ModelPrice::usd("anthropic/claude-opus-4-20250514", 7.5, 37.5, None),
        ModelPrice::usd("anthropic/claude-sonnet-4-20250514", 1.5, 7.5, None),
        ModelPrice::usd("anthropic/claude-3-7-sonnet-20250219", 1.5, 7.5, None),
        ModelPrice::usd("anthropic/claude-3-5-haiku-20241022", 0.4, 2.0, None),
        ModelPrice::usd("anthropic/claude-3-haiku-20240307", 0.125, 0.625, None),
        // Workers AI: neurons per million tokens from developers.cloudflare.com/workers-ai/platform/pricing/ (no
        // batch discount is documented).
        ModelPrice::neurons("@cf/meta/llama-3.2-1b-instruct", 2457.0, 18252.0),
        ModelPrice::neurons("@cf/meta/llama-3.2-3b-instruct", 4625.0, 30475.0),
        ModelPrice::neurons("@cf/meta/llama-3.1-8b-instruct-fp8-fast", 4119.0, 34868.0),
        ModelPrice::neurons("@cf/meta/llama-3.2-11b-vision-instruct", 4410.0, 61493.0),
        ModelPrice::neurons("@cf/meta/llama-3.1-70b-instruct-fp8-fast", 26668.0, 204805.0),
        ModelPrice::neurons("@cf/meta/llama-3.3-70b-instruct-fp8-fast", 26668.0, 204805.0),
        ModelPrice::neurons("@cf/deepseek-ai/deepseek-r1-distill-qwen-32b", 45170.0, 443756.0),
        ModelPrice::neurons("@cf/mistral/mistral-7b-instruct-v0.1", 10000.0, 17300.0),
        ModelPrice::neurons("@cf/meta/llama-3.1-8b-instruct", 25608.0, 75147.0),
        ModelPrice::neurons("@cf/meta/llama-3.1-8b-instruct-fp8", 13778.0, 26128.0),
        ModelPrice::neurons("@cf/meta/llama-3.1-8b-instruct-awq", 11161.0, 24215.0),
        ModelPrice::neurons("@cf/meta/llama-3-8b-instruct", 25608.0, 75147.0),
        ModelPrice::neurons("@cf/meta/llama-3-8b-instruct-awq", 11161.0, 24215.0),
        ModelPrice::neurons("@cf/meta/m2m100-1.2b", 31050.0, 31050.0),
        ModelPrice::neurons("@cf/huggingface/distilbert-sst-2-int8", 2394.0, 0.0),
        ModelPrice::neurons("@cf/baai/bge-small-en-v1.5", 1841.0, 0.0),
        ModelPrice::neurons("@cf/baai/bge-base-en-v1.5", 6058.0, 0.0),
        ModelPrice::neurons("@cf/baai/bge-large-en-v1.5", 18582.0, 0.0),
        // Workers AI, in USD per million tokens (the page's own figures) where the neurons were not read.
        ModelPrice::usd("@cf/baai/bge-m3", 0.012, 0.0, None),
    ]
}

/// The tokens of a `usage` as prices apply to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BilledTokens {
    /// Input tokens billed at the input price (cache writes included).
    pub input: u64,
    /// Input tokens read from the prompt cache.
    pub cached_input: u64,
    /// Output tokens (thinking tokens included).
    pub output: u64,
}

impl BilledTokens {
    /// The tokens of a result's `usage`, in any provider's names: `prompt_tokens`/`completion_tokens` (Workers AI,
    /// OpenAI's chat and embeddings, with `prompt_tokens_details.cached_tokens` when it is kept), `input_tokens`/
    /// `output_tokens` (Anthropic, whose `cache_read_input_tokens` and `cache_creation_input_tokens` are counted
    /// apart from `input_tokens`; OpenAI's Responses API), `promptTokenCount`/`candidatesTokenCount`/
    /// `thoughtsTokenCount` (Gemini, whose `cachedContentTokenCount` is part of `promptTokenCount`).
    pub fn of(usage: &serde_json::Value) -> Self {
        let n = |key: &str| usage.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let nested = |outer: &str, key: &str| {
            usage.get(outer).and_then(|details| details.get(key)).and_then(serde_json::Value::as_u64).unwrap_or(0)
        };
        if usage.get("promptTokenCount").is_some() || usage.get("candidatesTokenCount").is_some() {
            let cached = n("cachedContentTokenCount").min(n("promptTokenCount"));
            return Self {
                input: n("promptTokenCount") - cached,
                cached_input: cached,
                output: n("candidatesTokenCount") + n("thoughtsTokenCount"),
            };
        }
        if usage.get("cache_read_input_tokens").is_some() || usage.get("cache_creation_input_tokens").is_some() {
            return Self {
                input: n("input_tokens") + n("cache_creation_input_tokens"),
                cached_input: n("cache_read_input_tokens"),
                output: n("output_tokens"),
            };
        }
        let (input, output) = if usage.get("prompt_tokens").is_some() || usage.get("completion_tokens").is_some() {
            (n("prompt_tokens"), n("completion_tokens"))
        } else {
            (n("input_tokens"), n("output_tokens"))
        };
        let cached =
            nested("prompt_tokens_details", "cached_tokens").max(nested("input_tokens_details", "cached_tokens"));
        let cached = cached.min(input);
        Self { input: input - cached, cached_input: cached, output }
    }
}

/// The price table in use: the built-in prices with the configured ones over them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pricing {
    /// Prices by model name.
    prices: BTreeMap<String, ModelPrice>,
    /// USD per 1,000 Workers AI neurons.
    neuron_usd_per_thousand: f64,
}

impl Pricing {
    /// The built-in prices, with `configured` replacing a model's entry or adding one, and neurons billed at
    /// `neuron_usd_per_thousand`.
    pub fn new(neuron_usd_per_thousand: f64, configured: &[ModelPrice]) -> Self {
        let mut prices: BTreeMap<String, ModelPrice> =
            default_prices().into_iter().map(|price| (price.model.clone(), price)).collect();
        prices.extend(configured.iter().map(|price| (price.model.clone(), price.clone())));
        Self { prices, neuron_usd_per_thousand }
    }

    /// No prices at all: nothing has a cost.
    pub fn none() -> Self {
        Self::default()
    }

    /// `model`'s price, when it has one.
    pub fn price(&self, model: &str) -> Option<&ModelPrice> {
        self.prices.get(model)
    }

    /// Every price, by model name.
    pub fn prices(&self) -> impl Iterator<Item = &ModelPrice> {
        self.prices.values()
    }

    /// What `usage` cost at `model`'s batch prices, in USD rounded to the nano-dollar; `None` when the model has
    /// no price.
    pub fn cost_usd(&self, model: &str, usage: &serde_json::Value) -> Option<f64> {
        let price = self.price(model)?;
        let tokens = BilledTokens::of(usage);
        let per_neuron = self.neuron_usd_per_thousand / 1000.0;
        let input = price.input.or(price.input_neurons.map(|neurons| neurons * per_neuron)).unwrap_or(0.0);
        let output = price.output.or(price.output_neurons.map(|neurons| neurons * per_neuron)).unwrap_or(0.0);
        let cached_input = price.cached_input.unwrap_or(input);
        let micro =
            tokens.input as f64 * input + tokens.cached_input as f64 * cached_input + tokens.output as f64 * output;
        Some(round_to_nano(micro / 1_000_000.0))
    }

    /// Adds `cost_usd` to a result's `usage` object when `model` has a price (a share's `estimated` flag, when
    /// there is one, covers the cost too); leaves it as it is otherwise.
    pub fn add_cost(&self, model: &str, usage: &mut serde_json::Value) {
        let Some(cost) = self.cost_usd(model, usage) else { return };
        if let serde_json::Value::Object(fields) = usage {
            fields.insert(COST_FIELD.to_owned(), serde_json::json!(cost));
        }
    }
}

/// The member of a result's `usage` that holds its cost in USD.
pub const COST_FIELD: &str = "cost_usd";

/// Nano-dollars in one dollar: the finished-jobs counters count cost in whole nano-dollars.
pub const NANO_PER_USD: f64 = 1e9;

/// `usd` rounded to the nearest nano-dollar.
pub fn round_to_nano(usd: f64) -> f64 {
    (usd * NANO_PER_USD).round() / NANO_PER_USD
}

/// The cost a result's `usage` carries ([`COST_FIELD`]), in whole nano-dollars; `None` without one.
pub fn usage_cost_nano(usage: &serde_json::Value) -> Option<u64> {
    let usd = usage.get(COST_FIELD)?.as_f64().filter(|usd| usd.is_finite() && *usd >= 0.0)?;
    Some((usd * NANO_PER_USD).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_providers_usage_is_split_into_billed_tokens() {
        let tokens = |usage: serde_json::Value| BilledTokens::of(&usage);
        let workers = serde_json::json!({"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15});
        assert_eq!(tokens(workers), BilledTokens { input: 12, cached_input: 0, output: 3 });
        let openai = serde_json::json!({"prompt_tokens": 100, "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 40}});
        assert_eq!(tokens(openai), BilledTokens { input: 60, cached_input: 40, output: 7 });
        let anthropic = serde_json::json!({"input_tokens": 30, "output_tokens": 6, "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 5});
        assert_eq!(tokens(anthropic), BilledTokens { input: 35, cached_input: 100, output: 6 });
        let gemini = serde_json::json!({"promptTokenCount": 50, "cachedContentTokenCount": 20,
            "candidatesTokenCount": 9, "thoughtsTokenCount": 11});
        assert_eq!(tokens(gemini), BilledTokens { input: 30, cached_input: 20, output: 20 });
        let responses = serde_json::json!({"input_tokens": 8, "output_tokens": 2});
        assert_eq!(tokens(responses), BilledTokens { input: 8, cached_input: 0, output: 2 });
        assert_eq!(tokens(serde_json::json!({})), BilledTokens::default());
    }

    /// Hand-computed: 1,000,000 gpt-4o-mini input tokens of which 200,000 cached and 10,000 output tokens, at the
    /// batch prices (half of 0.15, 0.075 and 0.60): 0.8 × 0.075 + 0.2 × 0.0375 + 0.01 × 0.30 = 0.0705.
    #[test]
    fn a_cost_is_the_tokens_at_the_models_batch_prices() {
        let pricing = Pricing::new(NEURON_USD_PER_THOUSAND, &[]);
        let usage = serde_json::json!({"prompt_tokens": 1_000_000, "completion_tokens": 10_000,
            "prompt_tokens_details": {"cached_tokens": 200_000}});
        assert_eq!(pricing.cost_usd("openai/gpt-4o-mini", &usage), Some(0.0705));
        // 2,000,000 input and 100,000 output tokens of llama-3.2-1b: (2 × 2457 + 0.1 × 18252) neurons at $0.011 a
        // thousand = 6739.2 × 0.000011 = 0.0741312.
        let usage = serde_json::json!({"prompt_tokens": 2_000_000, "completion_tokens": 100_000});
        assert_eq!(pricing.cost_usd("@cf/meta/llama-3.2-1b-instruct", &usage), Some(0.0741312));
        assert_eq!(pricing.cost_usd("openai/unknown-model", &usage), None);
    }

    #[test]
    fn a_configured_price_replaces_the_built_in_one_and_the_cost_joins_the_usage() {
        let configured = ModelPrice::usd("openai/gpt-4o-mini", 1.0, 2.0, None);
        let pricing = Pricing::new(NEURON_USD_PER_THOUSAND, &[configured]);
        let mut usage = serde_json::json!({"prompt_tokens": 500_000, "completion_tokens": 250_000, "estimated": true});
        pricing.add_cost("openai/gpt-4o-mini", &mut usage);
        assert_eq!(usage["cost_usd"], 1.0);
        assert_eq!(usage["estimated"], true);
        assert_eq!(usage_cost_nano(&usage), Some(1_000_000_000));
        let mut unpriced = serde_json::json!({"prompt_tokens": 5});
        Pricing::none().add_cost("openai/gpt-4o-mini", &mut unpriced);
        assert_eq!(unpriced, serde_json::json!({"prompt_tokens": 5}));
    }

    #[test]
    fn the_built_in_prices_are_sound() {
        let prices = default_prices();
        for price in &prices {
            assert_eq!(price.problem(), None, "{}", price.model);
            crate::ModelName::parse(&price.model).expect("a model name");
        }
        let names: std::collections::BTreeSet<&str> = prices.iter().map(|price| price.model.as_str()).collect();
        assert_eq!(names.len(), prices.len(), "one entry per model");
        assert!(ModelPrice { model: "m".into(), ..ModelPrice::default() }.problem().is_some());
        let negative = ModelPrice { input: Some(-1.0), ..ModelPrice::usd("m", 0.0, 0.0, None) };
        assert!(negative.problem().unwrap().contains("input of m is -1"));
    }
}
