//! The providers one daemon serves, by routing name: a job's model name picks one
//! ([`batchd_core::ModelName::provider`]), and a model whose provider is not configured is refused at take-in
//! with the setting to add.

use std::collections::BTreeMap;
use std::sync::Arc;

use batchd_core::ModelName;
use batchd_provider::Provider;

/// Every configured provider, by routing name.
#[derive(Debug, Clone, Default)]
pub struct Providers {
    /// The providers, by [`Provider::name`].
    by_name: BTreeMap<String, Arc<dyn Provider>>,
}

impl Providers {
    /// No providers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `provider` under its name (replacing one of the same name).
    pub fn with(mut self, provider: Arc<dyn Provider>) -> Self {
        self.by_name.insert(provider.name().to_owned(), provider);
        self
    }

    /// The provider that runs `model`, or a sentence saying which one it needs and how to configure it.
    pub fn for_model(&self, model: &ModelName) -> Result<&Arc<dyn Provider>, String> {
        let name = model.provider();
        self.by_name.get(name).ok_or_else(|| {
            let how = match name {
                batchd_core::ids::CLOUDFLARE => "set cloudflare.account_id and CLOUDFLARE_API_TOKEN",
                "openai" => "set OPENAI_API_KEY or api_key_file in [openai]",
                "anthropic" => "set ANTHROPIC_API_KEY or api_key_file in [anthropic]",
                _ => "use a model name of a provider batchd supports (@cf/..., openai/..., anthropic/...)",
            };
            format!("model {model} runs on the {name} provider, which this daemon does not have configured; {how}")
        })
    }

    /// The routing names configured, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}
