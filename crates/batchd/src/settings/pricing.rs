//! `[pricing]`: the batch prices a finished job's cost is computed from (`batchd_core::pricing`), the built-in
//! table with the configured models over it; and `[budget]`, what a namespace may spend a day
//! (`batchd_engine::spend`).

use std::collections::BTreeMap;

use batchd_core::pricing::{ModelPrice, Pricing};
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[pricing]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PricingSettings {
    /// USD per 1,000 Workers AI neurons, for the prices given in neurons.
    pub neuron_usd_per_thousand: f64,
    /// Batch prices of models, each replacing the built-in entry of its model or adding one.
    pub models: Vec<ModelPrice>,
}

impl PricingSettings {
    /// The price table in use: the built-in prices with `models` over them.
    pub fn table(&self) -> Pricing {
        Pricing::new(self.neuron_usd_per_thousand, &self.models)
    }

    /// Checks the neuron price and every configured model's name and prices.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if !self.neuron_usd_per_thousand.is_finite() || self.neuron_usd_per_thousand < 0.0 {
            return Err(ConfigError::at("pricing.neuron_usd_per_thousand", "must be a number of 0 or more"));
        }
        for (position, price) in self.models.iter().enumerate() {
            let key = format!("pricing.models[{position}]");
            batchd_core::ModelName::parse(&price.model).map_err(|e| ConfigError::at(&format!("{key}.model"), e))?;
            if let Some(problem) = price.problem() {
                return Err(ConfigError::at(&key, problem));
            }
            if self.models[..position].iter().any(|earlier| earlier.model == price.model) {
                return Err(ConfigError::at(&key, format!("{} is listed twice", price.model)));
            }
        }
        Ok(())
    }
}

/// `[budget]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSettings {
    /// USD each namespace may spend per UTC day at its models' batch prices; 0: no budget.
    pub usd_per_day: f64,
    /// Budgets of single namespaces (namespace → USD per day, 0: none), over `usd_per_day`.
    pub namespaces: BTreeMap<String, f64>,
}

impl BudgetSettings {
    /// The daily budget of `namespace` in USD, `None` when it has none.
    pub fn for_namespace(&self, namespace: &str) -> Option<f64> {
        Some(self.namespaces.get(namespace).copied().unwrap_or(self.usd_per_day)).filter(|usd| *usd > 0.0)
    }

    /// Checks that every budget is a number of 0 or more.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let bad = |usd: f64| !usd.is_finite() || usd < 0.0;
        if bad(self.usd_per_day) {
            return Err(ConfigError::at("budget.usd_per_day", "must be a number of 0 or more (0: no budget)"));
        }
        if let Some((namespace, _)) = self.namespaces.iter().find(|(_, usd)| bad(**usd)) {
            return Err(ConfigError::at(
                &format!("budget.namespaces.{namespace}"),
                "must be a number of 0 or more (0: no budget)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Settings, test_env};

    #[test]
    fn a_configured_price_is_checked_and_replaces_the_built_in_one() {
        let file = std::env::temp_dir().join(format!("batchd-pricing-{}.toml", std::process::id()));
        std::fs::write(
            &file,
            "[pricing]\nmodels = [{ model = \"openai/gpt-4o-mini\", input = 1.0, output = 2.0 }, \
             { model = \"@cf/example/new-model\", input_neurons = 1000 }]\n",
        )
        .unwrap();
        let settings = Settings::load_from(Some(&file), &test_env(&[])).unwrap();
        let table = settings.pricing.table();
        assert_eq!(table.price("openai/gpt-4o-mini").unwrap().input, Some(1.0));
        let usage = serde_json::json!({"prompt_tokens": 1_000_000});
        assert_eq!(table.cost_usd("@cf/example/new-model", &usage), Some(0.011));
        assert!(table.price("anthropic/claude-sonnet-4-20250514").is_some(), "the built-in table stays");

        std::fs::write(&file, "[pricing]\nmodels = [{ model = \"openai/x\", input = -1.0 }]\n").unwrap();
        let error = Settings::load_from(Some(&file), &test_env(&[])).unwrap_err().to_string();
        assert!(error.contains("pricing.models[0]") && error.contains("input of openai/x is -1"), "{error}");
        std::fs::write(&file, "[pricing]\nmodels = [{ model = \"gpt-4o\", input = 1.0 }]\n").unwrap();
        let error = Settings::load_from(Some(&file), &test_env(&[])).unwrap_err().to_string();
        assert!(error.contains("pricing.models[0].model"), "{error}");
        std::fs::write(&file, "[budget]\nusd_per_day = 5.0\nnamespaces = { tenant = 0.5, free = 0.0 }\n").unwrap();
        let budget = Settings::load_from(Some(&file), &test_env(&[])).unwrap().budget;
        assert_eq!(
            (budget.for_namespace("batchd"), budget.for_namespace("tenant"), budget.for_namespace("free")),
            (Some(5.0), Some(0.5), None)
        );
        std::fs::write(&file, "[budget]\nusd_per_day = -1.0\n").unwrap();
        let error = Settings::load_from(Some(&file), &test_env(&[])).unwrap_err().to_string();
        assert!(error.contains("budget.usd_per_day"), "{error}");
        std::fs::remove_file(&file).unwrap();
    }
}
