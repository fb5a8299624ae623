//! What the other crates are handed, built from the settings: each provider instance's settings (`None` when it
//! is not configured), the API client settings, the event puller's settings, the Redis endpoint, the key
//! builders, job limits and storage settings.

use std::path::PathBuf;
use std::time::Duration;

use super::{ConfigError, InstanceSection, RedisMode, Secret, Settings};

impl Settings {
    /// How to reach the Cloudflare API with `token`.
    pub fn client_settings(&self, token: &Secret) -> batchd_cloudflare::ClientSettings {
        let mut settings = batchd_cloudflare::ClientSettings::new(
            self.cloudflare.account_id.clone(),
            batchd_cloudflare::ApiToken::new(token.expose().to_owned()),
        );
        settings.base_url = self.cloudflare.base_url.clone();
        settings.request_timeout = Duration::from_secs(self.cloudflare.request_timeout_secs);
        settings.connect_timeout = Duration::from_secs(self.cloudflare.connect_timeout_secs);
        settings.max_reply_bytes = self.cloudflare.max_reply_bytes;
        settings
    }

    /// Whether `[cloudflare]` is configured: its account id or its token is given (then both must be).
    pub fn cloudflare_configured(&self) -> bool {
        !self.cloudflare.account_id.trim().is_empty()
            || self.cloudflare.api_token.as_ref().is_some_and(|token| !token.expose().is_empty())
            || !self.cloudflare.api_token_file.is_empty()
    }

    /// The Workers AI instance (`[cloudflare]`, `[rate_limits]`, `jobs.max_payload_bytes`), `None` when it is not
    /// configured; an error names a missing token.
    pub fn cloudflare_instance(&self) -> Result<Option<batchd_cloudflare::ProviderSettings>, ConfigError> {
        if !self.cloudflare_configured() {
            return Ok(None);
        }
        let token = self.api_token()?;
        let account =
            if self.cloudflare.account.is_empty() { &self.cloudflare.account_id } else { &self.cloudflare.account };
        Ok(Some(batchd_cloudflare::ProviderSettings {
            client: self.client_settings(&token),
            account: account.trim().to_owned(),
            rate_limits: self.rate_limits.clone(),
            max_body_bytes: self.jobs.max_payload_bytes,
            max_items: Some(self.jobs.max_batch_items).filter(|max| *max > 0),
        }))
    }

    /// The OpenAI Batch instance (`[openai]`), `None` when no key is given.
    pub fn openai_instance(&self) -> Result<Option<batchd_openai::OpenAiClientSettings>, ConfigError> {
        self.openai_api_key()?.map(|key| self.openai_settings(&key)).transpose()
    }

    /// The Anthropic Message Batches instance (`[anthropic]`), `None` when no key is given.
    pub fn anthropic_instance(&self) -> Result<Option<batchd_anthropic::AnthropicSettings>, ConfigError> {
        Ok(self.anthropic_key()?.map(|key| self.anthropic_settings(&key)))
    }

    /// The Gemini Batch Mode instance (`[gemini]`), `None` when no key is given.
    pub fn gemini_instance(&self) -> Result<Option<batchd_gemini::GeminiSettings>, ConfigError> {
        Ok(self.gemini_key()?.map(|key| self.gemini_settings(&key)))
    }

    /// How to reach Gemini Batch Mode with `key` (`[gemini]`).
    pub fn gemini_settings(&self, key: &Secret) -> batchd_gemini::GeminiSettings {
        gemini_client(&self.gemini, key, batchd_gemini::NAME)
    }

    /// How to reach Anthropic Message Batches with `key` (`[anthropic]`).
    pub fn anthropic_settings(&self, key: &Secret) -> batchd_anthropic::AnthropicSettings {
        anthropic_client(&self.anthropic, key, batchd_anthropic::NAME)
    }

    /// The OpenAI provider's settings with `key` (its build bounds the input file by a quarter of
    /// `workers.inflight_bytes` too: a submit holds room for its items and the file built from them).
    pub fn openai_settings(&self, key: &Secret) -> Result<batchd_openai::OpenAiClientSettings, ConfigError> {
        openai_client(&self.openai, key, "openai")
    }

    /// A named OpenAI-kind instance (`[providers.<name>]`, `kind = "openai"`): Groq, Azure OpenAI, or another API
    /// that copies OpenAI's Files and Batch endpoints.
    pub fn openai_named(
        &self,
        name: &str,
        section: &InstanceSection,
    ) -> Result<batchd_openai::OpenAiClientSettings, ConfigError> {
        let config: super::OpenAiSettings = instance_section(name, section)?;
        let key = instance_key(name, section, &config.api_key_file)?;
        openai_client(&config, &key, name)
    }

    /// The endpoints an OpenAI-kind instance accepts, with the setting that lists them: `openai.endpoints` for
    /// `openai`, `providers.<name>.endpoints` for a named OpenAI-kind instance; `None` for any other instance (or
    /// one whose section cannot be read: `batchd config check` says why).
    pub fn openai_endpoints(&self, instance: &str) -> Option<(Vec<String>, String)> {
        if instance == batchd_openai::REGISTRATION.kind.name {
            return Some((self.openai.endpoints.clone(), "openai.endpoints".to_owned()));
        }
        let section = self.providers.get(instance).filter(|section| section.kind == "openai")?;
        let config: super::OpenAiSettings = instance_section(instance, section).ok()?;
        Some((config.endpoints, format!("providers.{instance}.endpoints")))
    }

    /// A named Anthropic-kind instance (`[providers.<name>]`, `kind = "anthropic"`).
    pub fn anthropic_named(
        &self,
        name: &str,
        section: &InstanceSection,
    ) -> Result<batchd_anthropic::AnthropicSettings, ConfigError> {
        let config: super::AnthropicConfig = instance_section(name, section)?;
        let key = instance_key(name, section, &config.api_key_file)?;
        Ok(anthropic_client(&config, &key, name))
    }

    /// A named Gemini-kind instance (`[providers.<name>]`, `kind = "gemini"`).
    pub fn gemini_named(
        &self,
        name: &str,
        section: &InstanceSection,
    ) -> Result<batchd_gemini::GeminiSettings, ConfigError> {
        let config: super::GeminiConfig = instance_section(name, section)?;
        let key = instance_key(name, section, &config.api_key_file)?;
        Ok(gemini_client(&config, &key, name))
    }

    /// How the batch event puller reads the queue (`[events]`).
    pub fn event_pull(&self) -> batchd_engine::events::PullSettings {
        batchd_engine::events::PullSettings {
            queue_id: self.events.queue_id.clone(),
            batch_size: self.events.batch_size,
            visibility_timeout: Duration::from_millis(self.events.visibility_timeout_ms),
            max_idle: Duration::from_millis(self.events.max_idle_ms),
        }
    }

    /// The key builder of the configured namespace (validated at load).
    pub fn keys(&self) -> batchd_core::Keys {
        batchd_core::Keys::new(&self.redis.namespace).expect("namespace checked at load")
    }

    /// Keys of every namespace the daemon serves: `redis.namespace` first, then `redis.extra_namespaces`.
    pub fn all_keys(&self) -> Vec<batchd_core::Keys> {
        std::iter::once(&self.redis.namespace)
            .chain(&self.redis.extra_namespaces)
            .map(|namespace| batchd_core::Keys::new(namespace).expect("namespaces checked at load"))
            .collect()
    }

    /// Job limits.
    pub fn job_limits(&self) -> batchd_core::JobLimits {
        batchd_core::JobLimits { max_entry_bytes: self.jobs.max_entry_bytes, max_items: self.jobs.max_items }
    }

    /// Storage settings.
    pub fn store_settings(&self) -> batchd_queue::StoreSettings {
        batchd_queue::StoreSettings {
            results_maxlen: self.retention.results_maxlen,
            dead_maxlen: self.retention.dead_maxlen,
            ledger_ttl: Duration::from_secs(self.retention.ledger_ttl_secs),
            lease: Duration::from_secs(self.schedule.lease_secs),
        }
    }

    /// The configured Redis deployment for people, passwords masked: the URL of a standalone server,
    /// `Redis Cluster redis://10.0.0.1:6379, redis://10.0.0.2:6379`, or `Sentinel master mymaster via
    /// redis://10.0.0.1:26379, ...`. Every human output of the CLI names it with the namespace.
    pub fn redis_label(&self) -> String {
        let url = batchd_core::redact_url(self.redis.url.expose());
        let nodes: Vec<String> = self.redis.nodes.iter().map(|node| batchd_core::redact_url(node.expose())).collect();
        match self.redis.mode {
            RedisMode::Standalone => url,
            RedisMode::Cluster => {
                format!("Redis Cluster {}", std::iter::once(url).chain(nodes).collect::<Vec<_>>().join(", "))
            }
            RedisMode::Sentinel => {
                format!("Sentinel master {} via {}", self.redis.sentinel_master, nodes.join(", "))
            }
        }
    }

    /// Whether the Redis URL is the built-in default because neither `REDIS_URL` nor `BATCHD__REDIS__URL` is set in
    /// `env` (a config file may still have set the same URL; then the warning this feeds is merely redundant).
    pub fn redis_url_is_default(&self, env: &std::collections::HashMap<String, String>) -> bool {
        let default = toml::from_str::<toml::Table>(super::DEFAULTS)
            .ok()
            .and_then(|table| table.get("redis")?.get("url")?.as_str().map(str::to_owned));
        !env.contains_key("REDIS_URL")
            && !env.contains_key("BATCHD__REDIS__URL")
            && default.as_deref() == Some(self.redis.url.expose())
    }

    /// The configured Redis deployment, ready to connect (no connection is opened yet).
    pub fn redis_endpoint(&self) -> Result<batchd_queue::Endpoint, ConfigError> {
        let path = |value: &str| (!value.is_empty()).then(|| PathBuf::from(value));
        let tls_client = match (path(&self.redis.tls_cert_file), path(&self.redis.tls_key_file)) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::at("redis.tls_key_file", "not set; redis.tls_cert_file needs it"));
            }
            (None, Some(_)) => {
                return Err(ConfigError::at("redis.tls_cert_file", "not set; redis.tls_key_file needs it"));
            }
        };
        let settings = batchd_queue::RedisSettings {
            url: self.redis.url.expose().to_owned(),
            topology: match self.redis.mode {
                RedisMode::Standalone => batchd_queue::Topology::Standalone,
                RedisMode::Cluster => batchd_queue::Topology::Cluster,
                RedisMode::Sentinel => batchd_queue::Topology::Sentinel,
            },
            nodes: self.redis.nodes.iter().map(|node| node.expose().to_owned()).collect(),
            sentinel_master: self.redis.sentinel_master.clone(),
            tls_ca_file: path(&self.redis.tls_ca_file),
            tls_client,
            response_timeout: Duration::from_secs(self.redis.response_timeout_secs),
        };
        batchd_queue::Endpoint::new(&settings).map_err(|error| {
            // The storage names the key itself when it can (`redis.tls_ca_file: cannot read ...`); otherwise the
            // URL is what it could not use.
            let detail = match &error {
                batchd_queue::StoreError::Redis(error) => error.detail().unwrap_or_default().to_owned(),
                other => other.to_string(),
            };
            match detail.split_once(": ").filter(|(key, _)| key.starts_with("redis.") && !key.contains(' ')) {
                Some((key, why)) => ConfigError::at(key, why),
                None if detail.starts_with("redis.") => ConfigError::keyed(detail),
                None => ConfigError::at("redis.url", if detail.is_empty() { error.to_string() } else { detail }),
            }
        })
    }
}

/// The account label of an instance: its own `account`, else its name (`openai`, `groq`).
fn account_or(account: &str, name: &str) -> String {
    if account.is_empty() { name.to_owned() } else { account.to_owned() }
}

/// How to reach Gemini Batch Mode with `key` from a `[gemini]`-shaped section, as instance `name`.
fn gemini_client(config: &super::GeminiConfig, key: &Secret, name: &str) -> batchd_gemini::GeminiSettings {
    let mut settings = batchd_gemini::GeminiSettings::new(batchd_gemini::ApiKey::new(key.expose().to_owned()));
    settings.name = batchd_provider::instance_name(name);
    settings.account = account_or(&config.account, name);
    settings.base_url = config.base_url.clone();
    settings.request_timeout = Duration::from_secs(config.request_timeout_secs);
    settings.connect_timeout = Duration::from_secs(config.connect_timeout_secs);
    settings.max_inline_bytes = config.max_inline_bytes;
    settings.max_file_bytes = config.max_file_bytes;
    settings.max_requests = config.max_requests;
    settings.max_result_bytes = config.max_result_bytes;
    settings.batches_per_minute = config.batches_per_minute;
    settings.burst = config.burst;
    settings.lookup_pages = config.lookup_pages;
    settings.delete_batches = config.delete_batches;
    settings
}

/// How to reach Anthropic Message Batches with `key` from an `[anthropic]`-shaped section, as instance `name`.
fn anthropic_client(config: &super::AnthropicConfig, key: &Secret, name: &str) -> batchd_anthropic::AnthropicSettings {
    let mut settings = batchd_anthropic::AnthropicSettings::new(batchd_anthropic::ApiKey::new(key.expose().to_owned()));
    settings.name = batchd_provider::instance_name(name);
    settings.account = account_or(&config.account, name);
    settings.base_url = config.base_url.clone();
    settings.version = config.version.clone();
    settings.beta = (!config.beta.is_empty()).then(|| config.beta.clone());
    settings.workspace_id = (!config.workspace_id.is_empty()).then(|| config.workspace_id.clone());
    settings.request_timeout = Duration::from_secs(config.request_timeout_secs);
    settings.connect_timeout = Duration::from_secs(config.connect_timeout_secs);
    settings.max_reply_bytes = config.max_reply_bytes;
    settings.max_body_bytes = config.max_body_bytes;
    settings.max_requests = config.max_requests;
    settings.requests_per_minute = config.requests_per_minute;
    settings.burst = config.burst;
    settings.delete_batches = config.delete_batches;
    settings.idle_timeout = Duration::from_secs(config.idle_timeout_secs);
    settings
}

/// The OpenAI provider's settings with `key` from an `[openai]`-shaped section, as instance `name`; an error names
/// a key header it does not know.
fn openai_client(
    openai: &super::OpenAiSettings,
    key: &Secret,
    name: &str,
) -> Result<batchd_openai::OpenAiClientSettings, ConfigError> {
    let mut settings = batchd_openai::OpenAiClientSettings::new(batchd_openai::ApiKey::new(key.expose().to_owned()));
    settings.name = batchd_provider::instance_name(name);
    settings.key_header = batchd_openai::KeyHeader::parse(&openai.key_header).ok_or_else(|| {
        ConfigError::at(
            &settings.setting("key_header"),
            format!("{:?} is not one of {}", openai.key_header, batchd_openai::KeyHeader::NAMES.join(", ")),
        )
    })?;
    settings.completion_window = Some(openai.completion_window.trim().to_owned()).filter(|window| !window.is_empty());
    settings.file_purpose = openai.file_purpose.clone();
    settings.account = account_or(&openai.account, name);
    settings.base_url = openai.base_url.clone();
    settings.organization = Some(openai.organization.clone()).filter(|value| !value.is_empty());
    settings.project = Some(openai.project.clone()).filter(|value| !value.is_empty());
    settings.request_timeout = Duration::from_secs(openai.request_timeout_secs);
    settings.connect_timeout = Duration::from_secs(openai.connect_timeout_secs);
    settings.max_requests = openai.max_requests;
    settings.max_file_bytes = openai.max_file_bytes;
    settings.max_result_bytes = openai.max_result_bytes;
    settings.delete_files = openai.delete_files;
    settings.batches_per_hour = openai.batches_per_hour;
    settings.burst = openai.burst;
    let model = |model: &str| model_of(model, name);
    settings.model_batches_per_hour =
        openai.models.iter().map(|limit| (model(&limit.model), limit.batches_per_hour)).collect();
    settings.lookup_pages = openai.lookup_pages;
    settings.file_expiry_secs = openai.file_expiry_secs;
    settings.idle_timeout = Duration::from_secs(openai.idle_timeout_secs);
    settings.endpoints = openai.endpoints.clone();
    settings.enqueued_token_limits =
        openai.enqueued_token_limits.iter().map(|limit| (model(&limit.model), limit.tokens)).collect();
    Ok(settings)
}

/// A named instance's section as its kind's section type `T`: the kind's built-in defaults (`config/default.toml`'s
/// `[<kind>]`, not what `[<kind>]` is given) with the instance's own keys over them. An unknown key or a value of
/// the wrong type is named `providers.<name>.<key>` with its environment variable.
fn instance_section<T: serde::de::DeserializeOwned>(name: &str, section: &InstanceSection) -> Result<T, ConfigError> {
    let place = format!("providers.{name}");
    let defaults: toml::Table = super::DEFAULTS.parse().expect("the built-in defaults are TOML");
    let mut merged = match defaults.get(&section.kind) {
        Some(toml::Value::Table(table)) => table.clone(),
        _ => {
            return Err(ConfigError::at(
                &format!("{place}.kind"),
                format!("{:?} is not a provider kind", section.kind),
            ));
        }
    };
    let defaults = merged.clone();
    for (key, value) in &section.settings {
        merged.insert(key.clone(), value.clone());
    }
    let error = match T::deserialize(toml::Value::Table(merged.clone())) {
        Ok(settings) => return Ok(settings),
        Err(error) => error,
    };
    let message = error.message().trim_end();
    // An unknown key is named with the section's keys.
    if message.starts_with("unknown field `") {
        return Err(ConfigError(super::load::describe_message(message, Some(&place), None)));
    }
    // A value of the wrong type: serde does not say whose; the instance's key whose default value mends it is.
    let culprit = section.settings.keys().find(|key| {
        let mut mended = merged.clone();
        match defaults.get(key.as_str()) {
            Some(default) => mended.insert((*key).clone(), default.clone()),
            None => mended.remove(key.as_str()),
        };
        T::deserialize(toml::Value::Table(mended)).is_ok()
    });
    Err(match culprit {
        Some(key) => ConfigError::at(&format!("{place}.{key}"), message),
        None => ConfigError::at(&place, message),
    })
}

/// A named instance's API key: `api_key` (from the environment only, `BATCHD__PROVIDERS__<NAME>__API_KEY`), else
/// the file `api_key_file` names; an error when neither gives one (a named instance is there to be used).
fn instance_key(name: &str, section: &InstanceSection, file: &str) -> Result<Secret, ConfigError> {
    if let Some(key) = section.api_key.as_ref().filter(|key| !key.expose().trim().is_empty()) {
        return Ok(Secret::new(key.expose().trim()));
    }
    let file_key = format!("providers.{name}.api_key_file");
    super::secrets::secret_file(&file_key, file)?.ok_or_else(|| {
        ConfigError::at(
            &format!("providers.{name}.api_key"),
            format!("not set; set it, or {}", super::key_label(&file_key)),
        )
    })
}

/// A model named in an OpenAI-kind section (`models`, `enqueued_token_limits`) as the API knows it: written with or
/// without the instance's prefix (`gpt-4o-mini` and `openai/gpt-4o-mini` are the same model of `[openai]`).
fn model_of(model: &str, instance: &str) -> String {
    model.strip_prefix(instance).and_then(|rest| rest.strip_prefix('/')).unwrap_or(model).to_owned()
}

#[cfg(test)]
mod openai_model_tests {
    #[test]
    fn openai_models_are_named_with_or_without_their_prefix() {
        assert_eq!(super::model_of("openai/gpt-4o-mini", "openai"), "gpt-4o-mini");
        assert_eq!(super::model_of("gpt-4o-mini", "openai"), "gpt-4o-mini");
        assert_eq!(super::model_of("groq/llama-3.1-8b-instant", "groq"), "llama-3.1-8b-instant");
        assert_eq!(super::model_of("groqx/llama", "groq"), "groqx/llama", "another prefix is the model's own");
        let mut settings = crate::settings::Settings::load_from(None, &Default::default()).expect("defaults");
        settings.openai.models =
            vec![crate::settings::OpenAiModelLimit { model: "openai/gpt-4o".into(), batches_per_hour: 7 }];
        let key = crate::settings::Secret::new("k".to_owned());
        assert_eq!(
            settings.openai_settings(&key).expect("settings").model_batches_per_hour,
            [("gpt-4o".to_owned(), 7)]
        );
    }
}
