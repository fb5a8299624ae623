//! Validation: the relations between values that the types cannot express (checked at every load), the
//! warnings the daemon logs at start, and `check_for_run`, shared by `batchd run` and `batchd config check`: every
//! configured provider's settings checked by its kind's registration (`registry.rs`).

use std::net::SocketAddr;

use super::{ConfigError, Settings};

impl Settings {
    /// Checks relations between values that the types cannot express.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let fail = |key: &str, why: &str| Err(ConfigError::at(key, why));
        batchd_core::Keys::new(&self.redis.namespace).map_err(|e| ConfigError::at("redis.namespace", e))?;
        for extra in &self.redis.extra_namespaces {
            batchd_core::Keys::new(extra).map_err(|e| ConfigError::at("redis.extra_namespaces", e))?;
            if *extra == self.redis.namespace || self.redis.extra_namespaces.iter().filter(|n| *n == extra).count() > 1
            {
                return Err(ConfigError::at("redis.extra_namespaces", format!("{extra:?} is listed twice")));
            }
        }
        check_redis_url("redis.url", self.redis.url.expose())?;
        for node in &self.redis.nodes {
            check_redis_url("redis.nodes", node.expose())?;
        }
        if self.redis.mode == super::RedisMode::Sentinel && self.redis.nodes.is_empty() {
            return fail("redis.nodes", "must list the sentinels when redis.mode is sentinel");
        }
        if self.workers.submit_concurrency == 0 {
            return fail("workers.submit_concurrency", "must be at least 1");
        }
        if self.workers.poll_concurrency == 0 {
            return fail("workers.poll_concurrency", "must be at least 1");
        }
        if self.workers.inflight_bytes < 1024 * 1024 {
            return fail("workers.inflight_bytes", "must be at least 1048576 (1 MiB)");
        }
        if self.workers.inflight_bytes < self.jobs.max_entry_bytes {
            return fail(
                "workers.inflight_bytes",
                "must be at least jobs.max_entry_bytes (an idle replica holds room for one entry of that size)",
            );
        }
        if self.workers.cancel_wait_secs == 0 {
            return fail("workers.cancel_wait_secs", "must be at least 1");
        }
        if self.workers.runtime_threads > 1024 {
            return fail("workers.runtime_threads", "must be at most 1024 (0 means one per CPU)");
        }
        if self.ingress.batch == 0 {
            return fail("ingress.batch", "must be at least 1");
        }
        if self.schedule.batch == 0 {
            return fail("schedule.batch", "must be at least 1");
        }
        if self.poll.multiplier.is_nan() || self.poll.multiplier < 1.0 {
            return fail("poll.multiplier", "must be at least 1.0");
        }
        if !(0.0..1.0).contains(&self.poll.jitter) {
            return fail("poll.jitter", "must be in [0, 1)");
        }
        if self.poll.initial_interval_ms == 0 || self.poll.max_interval_ms < self.poll.initial_interval_ms {
            return fail("poll.max_interval_ms", "must be at least poll.initial_interval_ms, which must be positive");
        }
        if self.retry.max_attempts == 0 {
            return fail("retry.max_attempts", "must be at least 1");
        }
        if self.jobs.deadline_settle_secs == 0 {
            return fail("jobs.deadline_settle_secs", "must be at least 1");
        }
        if self.jobs.max_payload_bytes < 1024 {
            return fail("jobs.max_payload_bytes", "must be at least 1024");
        }
        if self.rate_limits.window_secs == 0 {
            return fail("rate_limits.window_secs", "must be at least 1");
        }
        if self.rate_limits.burst == 0 {
            return fail("rate_limits.burst", "must be at least 1");
        }
        if let Some(bad) =
            self.rate_limits.models.iter().find(|limit| batchd_core::ModelName::parse(&limit.model).is_err())
        {
            return Err(ConfigError::at("rate_limits.models", format!("{:?} is not a model name", bad.model)));
        }
        if self.retention.results_maxlen == 0 {
            return fail("retention.results_maxlen", "must be at least 1");
        }
        if self.ingress.max_deliveries == 0 {
            return fail("ingress.max_deliveries", "must be at least 1");
        }
        if self.retention.dead_entry_bytes > 64 * 1024 * 1024 {
            return fail("retention.dead_entry_bytes", "must be at most 67108864 (64 MiB)");
        }
        if !self.admin.listen.is_empty() && self.admin.listen.parse::<SocketAddr>().is_err() {
            return fail("admin.listen", "must be IP:port (e.g. 127.0.0.1:9090 or 0.0.0.0:9090), or empty");
        }
        if self.admin.sample_interval_ms < 10 {
            return fail("admin.sample_interval_ms", "must be at least 10");
        }
        if self.admin.stall_secs == 0 {
            return fail("admin.stall_secs", "must be at least 1");
        }
        if let Err(why) = crate::admin::HostList::new(self.admin.allowed_hosts.iter().map(String::as_str)) {
            return Err(ConfigError::at(
                "admin.allowed_hosts",
                format!("{why} (give names only, e.g. batchd.monitoring.svc, without scheme or port)"),
            ));
        }
        if self.events.enabled() {
            if !(1..=batchd_cloudflare::MAX_PULL_BATCH).contains(&self.events.batch_size) {
                return fail("events.batch_size", "must be 1-100 (the Queues limit)");
            }
            if !(1000..=43_200_000).contains(&self.events.visibility_timeout_ms) {
                return fail("events.visibility_timeout_ms", "must be 1000-43200000 (1 s to 12 h, the Queues limits)");
            }
            if self.events.max_idle_ms == 0 {
                return fail("events.max_idle_ms", "must be at least 1");
            }
            if self.poll.max_interval_ms_with_events < self.poll.initial_interval_ms {
                return fail("poll.max_interval_ms_with_events", "must be at least poll.initial_interval_ms");
            }
        }
        let insecure = |url: &str| url.trim_end().ends_with("#insecure");
        let why = "a TLS URL ending in #insecure turns certificate checks off; set redis.tls_insecure = true \
                   (BATCHD__REDIS__TLS_INSECURE) to allow it (not for production), or give the CA with \
                   redis.tls_ca_file";
        if !self.redis.tls_insecure && insecure(self.redis.url.expose()) {
            return fail("redis.url", why);
        }
        if !self.redis.tls_insecure && self.redis.nodes.iter().any(|node| insecure(node.expose())) {
            return fail("redis.nodes", why);
        }
        for (name, section) in &self.providers {
            crate::registry::check_named(name, section)?;
        }
        self.pricing.check()?;
        self.budget.check()
    }

    /// What is allowed but unsafe, for the daemon to log at start as warnings: certificate checks turned off, a
    /// token file other users can read.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.shutdown.grace_secs <= self.cloudflare.request_timeout_secs {
            warnings.push(format!(
                "shutdown.grace_secs ({}) is not longer than cloudflare.request_timeout_secs ({}): a submit in flight \
                 at shutdown may be cut, then resubmitted and counted as a possible duplicate",
                self.shutdown.grace_secs, self.cloudflare.request_timeout_secs
            ));
        }
        if self.redis.tls_insecure {
            warnings.push(
                "redis.tls_insecure is set: TLS connections to Redis may skip certificate checks (#insecure URLs)"
                    .to_owned(),
            );
        }
        let own_group = own_group();
        for (key, path) in self.secret_files() {
            if let Some(why) = secret_file_mode(path).and_then(|(mode, group)| exposure(mode, group, own_group)) {
                warnings.push(format!("{key} {path} {why} (mode {:o}); chmod 600 it", secret_mode_bits(path)));
            }
        }
        warnings
    }

    /// Everything `run` checks before it starts work, short of connecting, and the one function both `batchd run`
    /// and `batchd config check` call: at least one provider is configured, and each configured one's settings
    /// pass its kind's check and build (keys readable, limits within the API's, a request within the lease, URLs
    /// and headers its client can use); the events queue's client can be built; the Redis deployment (TLS files
    /// included) is usable; the log filter (`log.level`, or `RUST_LOG` when set) parses.
    pub fn check_for_run(&self) -> Result<(), ConfigError> {
        let context = batchd_provider::BuildContext {
            lease: std::time::Duration::from_secs(self.schedule.lease_secs),
            inflight_bytes: self.workers.inflight_bytes,
            reply_budget: None,
        };
        let mut configured = 0;
        for (entry, instance) in crate::registry::instances(self) {
            configured += usize::from(entry.check(self, instance, &context)?);
        }
        if configured == 0 {
            return Err(crate::registry::none_configured());
        }
        if self.events.enabled() {
            if !self.cloudflare_configured() {
                return Err(ConfigError::at(
                    "events.queue_id",
                    "set, but Workers AI is not configured (the events are Workers AI's; see [cloudflare])",
                ));
            }
            let (token, token_key) = match self.events_token()? {
                Some(token) => (token, "events.api_token"),
                None => (self.api_token()?, "cloudflare.api_token"),
            };
            batchd_cloudflare::QueueClient::new(self.client_settings(&token), &self.events.queue_id).map_err(|e| {
                let error = batchd_cloudflare::client_error(e);
                match error.key {
                    "api_token" => ConfigError::at(token_key, error.why),
                    "queue_id" => ConfigError::at("events.queue_id", error.why),
                    key => ConfigError::at(&format!("cloudflare.{key}"), error.why),
                }
            })?;
        }
        self.redis_endpoint()?;
        crate::logging::check(&self.log, std::env::var("RUST_LOG").ok().as_deref()).map_err(ConfigError::keyed)?;
        Ok(())
    }
}

impl Settings {
    /// `batchd config check`'s summary of the providers, one line each: configured or not, base URL, limits and
    /// where the key comes from (never the key), as TOML comments so the printed settings stay valid TOML.
    pub fn provider_summary(&self) -> String {
        let key_source = |from_env: bool, file: &str, variable: &str| match (from_env, file.is_empty()) {
            (true, _) => format!("key from the environment ({variable})"),
            (false, false) => format!("key from file {file}"),
            (false, true) => format!("no key ({variable} or the key file)"),
        };
        let pace = |n: u32, per: &str| if n == 0 { "not paced by batchd".to_owned() } else { format!("{n} {per}") };
        let mut out = String::from("# Providers (the model name's prefix picks one):\n");
        for (entry, instance) in crate::registry::instances(self) {
            let kind = entry.kind();
            let configured = if entry.configured(self, instance) { "configured" } else { "not configured" };
            let detail = match instance {
                crate::registry::Instance::Named { name, section } => {
                    let value = |key: &str| match section.settings.get(key) {
                        Some(toml::Value::String(text)) => text.clone(),
                        Some(other) => other.to_string(),
                        None => format!("[{}]'s default", kind.name),
                    };
                    let file = section.settings.get("api_key_file").and_then(|file| file.as_str()).unwrap_or_default();
                    let variable = crate::settings::env_var(&format!("providers.{name}.api_key")).unwrap_or_default();
                    format!(
                        "named instance of kind {}, models {name}/<model>; base URL {}; account {}; {}",
                        kind.name,
                        value("base_url"),
                        section.settings.get("account").and_then(|account| account.as_str()).unwrap_or(name),
                        key_source(section.api_key.is_some(), file, &variable)
                    )
                }
                crate::registry::Instance::BuiltIn => self.built_in_summary(kind.name, &key_source, &pace),
            };
            let name = instance.name(kind);
            out.push_str(&format!("#   {name} ({}): {configured}; {detail}\n", kind.title));
        }
        out.push('\n');
        out
    }

    /// [`Settings::provider_summary`]'s line of a built-in instance, after its name and state.
    fn built_in_summary(
        &self,
        kind: &str,
        key_source: &dyn Fn(bool, &str, &str) -> String,
        pace: &dyn Fn(u32, &str) -> String,
    ) -> String {
        match kind {
            batchd_core::ids::CLOUDFLARE => {
                let limits = &self.rate_limits;
                format!(
                    "base URL {}; account {}; limits [rate_limits] per {} s: text generation {}, embeddings {}, \
                     translation {}, speech recognition {}, burst {}; {}",
                    self.cloudflare.base_url,
                    if self.cloudflare.account_id.is_empty() { "not set" } else { &self.cloudflare.account_id },
                    limits.window_secs,
                    limits.text_generation,
                    limits.embeddings,
                    limits.translation,
                    limits.speech_recognition,
                    limits.burst,
                    key_source(
                        self.cloudflare.api_token.is_some(),
                        &self.cloudflare.api_token_file,
                        "CLOUDFLARE_API_TOKEN"
                    )
                )
            }
            "openai" => format!(
                "base URL {}; limits openai.batches_per_hour {} (burst {}); {}",
                self.openai.base_url,
                pace(self.openai.batches_per_hour, "per model"),
                self.openai.burst,
                key_source(self.openai.api_key.is_some(), &self.openai.api_key_file, "OPENAI_API_KEY")
            ),
            "anthropic" => format!(
                "base URL {}; limits anthropic.requests_per_minute {} (burst {}), {} requests per batch; {}",
                self.anthropic.base_url,
                pace(self.anthropic.requests_per_minute, "per minute"),
                self.anthropic.burst,
                self.anthropic.max_requests,
                key_source(self.anthropic.api_key.is_some(), &self.anthropic.api_key_file, "ANTHROPIC_API_KEY")
            ),
            "gemini" => format!(
                "base URL {}; limits gemini.batches_per_minute {} (burst {}), {} requests per batch; {}",
                self.gemini.base_url,
                pace(self.gemini.batches_per_minute, "per minute"),
                self.gemini.burst,
                self.gemini.max_requests,
                key_source(self.gemini.api_key.is_some(), &self.gemini.api_key_file, "GEMINI_API_KEY")
            ),
            _ => String::new(),
        }
    }
}

/// Refuses a Redis URL that redis-rs cannot read, naming the key and the forms it takes (the URL's password is
/// masked in the message).
fn check_redis_url(key: &str, url: &str) -> Result<(), ConfigError> {
    use redis::IntoConnectionInfo as _;
    if url.into_connection_info().is_ok() {
        return Ok(());
    }
    let shown = if url.is_empty() { "empty".to_owned() } else { format!("{:?}", batchd_core::redact_url(url)) };
    Err(ConfigError::at(
        key,
        format!(
            "{shown} is not a Redis URL (redis://[user:password@]host:port[/db], rediss:// for TLS, or \
             unix:///path/to/socket)"
        ),
    ))
}

impl Settings {
    /// Every file a secret is read from, with its key: the Cloudflare token, the events queue's token, each
    /// provider instance's key (a systemd credential is one of these once found, [`Settings::use_systemd_credential`]).
    pub fn secret_files(&self) -> Vec<(String, &str)> {
        let named = self.providers.iter().filter_map(|(name, section)| {
            let file = section.settings.get("api_key_file")?.as_str()?;
            Some((format!("providers.{name}.api_key_file"), file))
        });
        [
            ("cloudflare.api_token_file", self.cloudflare.api_token_file.as_str()),
            ("events.api_token_file", self.events.api_token_file.as_str()),
            ("openai.api_key_file", self.openai.api_key_file.as_str()),
            ("anthropic.api_key_file", self.anthropic.api_key_file.as_str()),
            ("gemini.api_key_file", self.gemini.api_key_file.as_str()),
        ]
        .into_iter()
        .map(|(key, file)| (key.to_owned(), file))
        .chain(named)
        .filter(|(_, path)| !path.is_empty())
        .collect()
    }
}

/// A file's permission bits and group, when it exists (Unix; a symlink is followed, as Kubernetes mounts Secrets).
fn secret_file_mode(path: &str) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).ok().map(|meta| (meta.mode() & 0o777, meta.gid()))
}

/// A file's permission bits for a message (0 when it cannot be read).
fn secret_mode_bits(path: &str) -> u32 {
    secret_file_mode(path).map_or(0, |(mode, _)| mode)
}

/// The daemon's own effective group: the group of `/proc/self` (Linux), `None` where that cannot be read.
fn own_group() -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").ok().map(|meta| meta.gid())
}

/// Why a secret file with permission bits `mode` and group `group` is readable by someone other than the daemon,
/// or `None`. Any access by others counts; access by the file's group counts unless that group is the daemon's own
/// (`own_group`): Kubernetes mounts a Secret `0440` for the pod's `fsGroup`, which is the daemon's group and has no
/// other member, while a key file `0640` of a shared group (`adm`, `users`) on a host is readable by that group.
fn exposure(mode: u32, group: u32, own_group: Option<u32>) -> Option<&'static str> {
    if mode & 0o007 != 0 {
        return Some("is readable or writable by others");
    }
    if mode & 0o070 != 0 && own_group != Some(group) {
        return Some("is readable or writable by its group, which is not the daemon's own");
    }
    None
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::settings::test_env as env;

    /// `check_for_run`'s refusal of these settings, or `None` when they pass.
    fn refusal(pairs: &[(&str, &str)]) -> Option<String> {
        let settings = Settings::load_from(None, &env(pairs)).expect("loads: providers are checked for run");
        settings.check_for_run().err().map(|error| error.to_string())
    }

    #[test]
    fn each_configured_providers_settings_are_checked_for_run_naming_the_key_and_its_variable() {
        let cloudflare = [("CLOUDFLARE_ACCOUNT_ID", "acct"), ("CLOUDFLARE_API_TOKEN", "tok")];
        assert_eq!(refusal(&cloudflare), None);
        assert_eq!(refusal(&[("OPENAI_API_KEY", "sk-x")]), None, "OpenAI alone: Cloudflare is optional");
        assert_eq!(refusal(&[("ANTHROPIC_API_KEY", "sk-ant")]), None, "Anthropic alone");
        let none = refusal(&[]).expect("no provider");
        assert!(none.contains("no provider is configured") && none.contains("OPENAI_API_KEY"), "{none}");
        for (key, value, named) in [
            ("BATCHD__OPENAI__MAX_REQUESTS", "50001", "openai.max_requests (BATCHD__OPENAI__MAX_REQUESTS)"),
            ("BATCHD__OPENAI__MAX_FILE_BYTES", "300000000", "openai.max_file_bytes (BATCHD__OPENAI__MAX_FILE_BYTES)"),
            ("BATCHD__OPENAI__BASE_URL", "http://10.0.0.5/v1", "openai.base_url (BATCHD__OPENAI__BASE_URL)"),
            ("BATCHD__OPENAI__BASE_URL", "ftp://10.0.0.5/v1", "openai.base_url (BATCHD__OPENAI__BASE_URL)"),
            ("BATCHD__OPENAI__ORGANIZATION", "org\u{7}", "openai.organization (BATCHD__OPENAI__ORGANIZATION)"),
            ("BATCHD__OPENAI__ACCOUNT", "a:b", "openai.account (BATCHD__OPENAI__ACCOUNT)"),
        ] {
            let error = refusal(&[("OPENAI_API_KEY", "sk-x"), (key, value)]).expect(key);
            assert!(error.contains(named), "{error}");
            assert_eq!(refusal(&[cloudflare[0], cloudflare[1], (key, value)]), None, "{key}: no key, no OpenAI");
        }
        let anthropic: &[(&str, &str)] = &[("ANTHROPIC_API_KEY", "sk-ant")];
        let with_cloudflare: &[(&str, &str)] = &cloudflare;
        for (given, key, value, named) in [
            (anthropic, "BATCHD__ANTHROPIC__BASE_URL", "http://api.anthropic.com", "anthropic.base_url"),
            (anthropic, "BATCHD__ANTHROPIC__MAX_REQUESTS", "100001", "anthropic.max_requests"),
            (anthropic, "BATCHD__ANTHROPIC__MAX_BODY_BYTES", "300000000", "anthropic.max_body_bytes"),
            (anthropic, "BATCHD__ANTHROPIC__BURST", "0", "anthropic.burst (BATCHD__ANTHROPIC__BURST)"),
            (anthropic, "BATCHD__ANTHROPIC__REQUEST_TIMEOUT_SECS", "120", "anthropic.request_timeout_secs"),
            (with_cloudflare, "BATCHD__CLOUDFLARE__BASE_URL", "http://10.0.0.5:8787", "cloudflare.base_url"),
            (with_cloudflare, "BATCHD__CLOUDFLARE__MAX_REPLY_BYTES", "1000", "cloudflare.max_reply_bytes"),
            (with_cloudflare, "BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS", "120", "cloudflare.request_timeout_secs"),
        ] {
            let env: Vec<(&str, &str)> = given.iter().copied().chain([(key, value)]).collect();
            let error = refusal(&env).expect(key);
            assert!(error.contains(named), "{error}");
        }
        let error = refusal(&[("CLOUDFLARE_API_TOKEN", "tok")]).expect("a token without an account");
        assert!(error.contains("cloudflare.account_id (CLOUDFLARE_ACCOUNT_ID or"), "{error}");
        let error = refusal(&[("OPENAI_API_KEY", "sk-x"), ("BATCHD__EVENTS__QUEUE_ID", "q")]).expect("events");
        assert!(error.contains("events.queue_id") && error.contains("Workers AI is not configured"), "{error}");
    }

    #[test]
    fn named_instances_are_checked_naming_their_key_and_variable() {
        let groq: &[(&str, &str)] = &[
            ("BATCHD__PROVIDERS__GROQ__KIND", "openai"),
            ("BATCHD__PROVIDERS__GROQ__API_KEY", "gsk-secret"),
            ("BATCHD__PROVIDERS__GROQ__BASE_URL", "https://api.groq.com/openai/v1"),
            ("BATCHD__PROVIDERS__GROQ__COMPLETION_WINDOW", "48h"),
        ];
        assert_eq!(refusal(groq), None, "a named OpenAI-kind instance alone is a configuration");
        let settings = Settings::load_from(None, &env(groq)).unwrap();
        let client = settings.openai_named("groq", &settings.providers["groq"]).expect("groq");
        assert_eq!((client.name, client.account.as_str()), ("groq", "groq"), "its name routes and names its limits");
        assert_eq!(client.completion_window.as_deref(), Some("48h"));
        assert_eq!(client.setting("endpoints"), "providers.groq.endpoints");
        assert!(!format!("{settings:?}").contains("gsk-secret") && !settings.to_redacted_toml().contains("gsk-secret"));
        let summary = settings.provider_summary();
        assert!(
            summary.contains(
                "#   groq (OpenAI Batch): configured; named instance of kind openai, models groq/<model>; base URL \
                 https://api.groq.com/openai/v1; account groq; key from the environment \
                 (BATCHD__PROVIDERS__GROQ__API_KEY)\n"
            ),
            "{summary}"
        );
        for (key, value, named) in [
            (
                "BATCHD__PROVIDERS__GROQ__BASE_URL",
                "http://10.0.0.5/v1",
                "providers.groq.base_url (BATCHD__PROVIDERS__GROQ__BASE_URL): ",
            ),
            (
                "BATCHD__PROVIDERS__GROQ__KEY_HEADER",
                "bearer",
                "providers.groq.key_header (BATCHD__PROVIDERS__GROQ__KEY_HEADER): \"bearer\" is not one of authorization, api-key",
            ),
            (
                "BATCHD__PROVIDERS__GROQ__COMPLETION_WINDOW",
                "two days",
                "providers.groq.completion_window (BATCHD__PROVIDERS__GROQ__COMPLETION_WINDOW): ",
            ),
            (
                "BATCHD__PROVIDERS__GROQ__MAX_REQUESTS",
                "many",
                "providers.groq.max_requests (BATCHD__PROVIDERS__GROQ__MAX_REQUESTS): ",
            ),
            (
                "BATCHD__PROVIDERS__GROQ__MAX_REQUESTS",
                "50001",
                "providers.groq.max_requests (BATCHD__PROVIDERS__GROQ__MAX_REQUESTS): ",
            ),
            (
                "BATCHD__PROVIDERS__GROQ__BASEURL",
                "x",
                "providers.groq.baseurl (BATCHD__PROVIDERS__GROQ__BASEURL): no such key; [providers.groq] has ",
            ),
            (
                "BATCHD__PROVIDERS__GROQ__API_KEY",
                "",
                "providers.groq.api_key (BATCHD__PROVIDERS__GROQ__API_KEY): not set; set it, or providers.groq.api_key_file (BATCHD__PROVIDERS__GROQ__API_KEY_FILE)",
            ),
        ] {
            let env: Vec<(&str, &str)> =
                groq.iter().copied().filter(|(name, _)| *name != key).chain([(key, value)]).collect();
            let error = refusal(&env).expect(key);
            assert!(error.contains(named), "{key}={value}: {error}");
        }
        let azure = [
            ("BATCHD__PROVIDERS__AZURE__KIND", "openai"),
            ("BATCHD__PROVIDERS__AZURE__API_KEY", "az-key"),
            ("BATCHD__PROVIDERS__AZURE__KEY_HEADER", "api-key"),
            ("BATCHD__PROVIDERS__AZURE__ENDPOINTS", "/v1/chat/completions"),
        ];
        let settings = Settings::load_from(None, &env(&azure)).unwrap();
        let client = settings.openai_named("azure", &settings.providers["azure"]).expect("azure");
        assert_eq!(client.key_header, batchd_openai::KeyHeader::ApiKey);
        assert_eq!(client.endpoints, ["/v1/chat/completions"], "a list from the environment, comma-separated");
        let gem = [("BATCHD__PROVIDERS__GEM_EU__KIND", "gemini"), ("BATCHD__PROVIDERS__GEM_EU__API_KEY", "g")];
        assert_eq!(refusal(&gem), None, "a named Gemini instance");
        let ant = [("BATCHD__PROVIDERS__ANT2__KIND", "anthropic"), ("BATCHD__PROVIDERS__ANT2__API_KEY", "a")];
        assert_eq!(refusal(&ant), None, "a named Anthropic instance");
    }

    #[test]
    fn a_named_instance_needs_a_good_name_and_a_kind_with_named_instances() {
        let load = |name: &str, kind: &str| {
            let kind_var = format!("BATCHD__PROVIDERS__{name}__KIND");
            let key_var = format!("BATCHD__PROVIDERS__{name}__API_KEY");
            Settings::load_from(None, &env(&[(&kind_var, kind), (&key_var, "k")])).err().map(|error| error.to_string())
        };
        assert_eq!(load("GROQ_2", "openai"), None);
        for (name, kind, named) in [
            (
                "OPENAI",
                "openai",
                "providers.openai (BATCHD__PROVIDERS__OPENAI): \"openai\" is the built-in OpenAI Batch instance's name",
            ),
            ("GEMINI", "openai", "is the built-in Gemini"),
            ("9LIVES", "openai", "\"9lives\" is not an instance name"),
            (
                "GROQ",
                "mistral",
                "providers.groq.kind (BATCHD__PROVIDERS__GROQ__KIND): \"mistral\" is not a provider kind; one of openai, anthropic, gemini",
            ),
            (
                "CF2",
                "cloudflare",
                "providers.cf2.kind (BATCHD__PROVIDERS__CF2__KIND): Workers AI has no named instances yet",
            ),
        ] {
            let error = load(name, kind).expect(name);
            assert!(error.contains(named), "{name}: {error}");
        }
        let dir = std::env::temp_dir().join(format!("batchd-named-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("batchd.toml");
        std::fs::write(&file, "[providers.groq]\nkind = \"openai\"\napi_key = \"gsk-in-file\"\n").unwrap();
        let error = Settings::load_from(Some(&file), &env(&[])).expect_err("refused").to_string();
        std::fs::remove_dir_all(&dir).ok();
        assert!(error.contains("providers.groq.api_key: not allowed in a config file"), "{error}");
        assert!(error.contains("BATCHD__PROVIDERS__GROQ__API_KEY") && !error.contains("gsk-in-file"), "{error}");
    }

    #[test]
    fn anthropic_settings_reach_its_client() {
        let load = |pairs: &[(&str, &str)]| Settings::load_from(None, &env(pairs));
        let defaults = load(&[]).unwrap();
        assert_eq!(defaults.anthropic.base_url, "https://api.anthropic.com");
        assert_eq!((defaults.anthropic.max_requests, defaults.anthropic.max_body_bytes), (100_000, 256_000_000));
        assert!(defaults.anthropic_instance().unwrap().is_none(), "no key, no Anthropic");
        let configured = load(&[("ANTHROPIC_API_KEY", "sk-secret-123")]).unwrap();
        let client = configured.anthropic_instance().unwrap().expect("configured");
        assert_eq!((client.version.as_str(), client.beta.as_deref()), ("2023-06-01", None));
        assert_eq!(client.account, "anthropic", "the account label defaults to the kind's name");
        assert!(client.delete_batches, "ended batches are deleted by default");
        assert!(!format!("{client:?}").contains("sk-secret-123"), "the key never prints");
        let keep = load(&[("ANTHROPIC_API_KEY", "sk"), ("BATCHD__ANTHROPIC__DELETE_BATCHES", "false")]).unwrap();
        assert!(!keep.anthropic_instance().unwrap().expect("configured").delete_batches);
        let cloudflare = load(&[("CLOUDFLARE_ACCOUNT_ID", "acct-1"), ("CLOUDFLARE_API_TOKEN", "tok")]).unwrap();
        assert_eq!(cloudflare.cloudflare_instance().unwrap().expect("configured").account, "acct-1");
    }

    #[test]
    fn every_key_file_others_can_read_is_warned_about() {
        use std::os::unix::fs::PermissionsExt;
        for key in
            ["cloudflare.api_token_file", "events.api_token_file", "openai.api_key_file", "anthropic.api_key_file"]
        {
            let file = std::env::temp_dir().join(format!("batchd-key-mode-{}-{key}", std::process::id()));
            std::fs::write(&file, "tok\n").unwrap();
            let path = file.display().to_string();
            let var = crate::settings::env_var(key).unwrap();
            let settings = Settings::load_from(None, &env(&[(&var, &path)])).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
            let warnings = settings.warnings();
            let expected = format!("{key} {path} is readable or writable by others (mode 644); chmod 600 it");
            assert!(warnings.contains(&expected), "{key}: {warnings:?}");
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o440)).unwrap();
            assert!(settings.warnings().is_empty(), "{key}: read by the daemon's own group (a Kubernetes fsGroup)");
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
            assert!(settings.warnings().is_empty(), "{key}");
            std::fs::remove_file(&file).unwrap();
        }
    }

    #[test]
    fn a_key_file_is_exposed_to_others_and_to_a_group_not_the_daemons() {
        assert_eq!(exposure(0o600, 100, Some(1000)), None);
        assert_eq!(exposure(0o400, 100, None), None);
        assert_eq!(exposure(0o440, 1000, Some(1000)), None, "Kubernetes: the pod's fsGroup is the daemon's group");
        assert!(exposure(0o440, 100, Some(1000)).is_some_and(|why| why.contains("its group")), "a shared group");
        assert!(exposure(0o640, 100, None).is_some(), "the daemon's group unknown: warned");
        assert!(exposure(0o620, 1000, Some(1000)).is_none(), "written only by the daemon's own group");
        assert!(exposure(0o604, 1000, Some(1000)).is_some_and(|why| why.contains("others")));
        assert!(exposure(0o602, 1000, Some(1000)).is_some_and(|why| why.contains("others")));
    }

    #[test]
    fn insecure_tls_urls_need_an_explicit_setting() {
        let url = "rediss://10.0.0.1:6380/#insecure";
        let error = Settings::load_from(None, &env(&[("REDIS_URL", url)])).expect_err("refused").to_string();
        assert!(error.contains("redis.tls_insecure"), "{error}");
        let settings =
            Settings::load_from(None, &env(&[("REDIS_URL", url), ("BATCHD__REDIS__TLS_INSECURE", "true")])).unwrap();
        assert!(settings.warnings().iter().any(|w| w.contains("certificate checks")));
    }

    #[test]
    fn admin_settings_are_checked() {
        let settings = Settings::load_from(None, &env(&[])).unwrap();
        assert_eq!(settings.admin.listen_addr(), Some("127.0.0.1:9090".parse().unwrap()));
        assert_eq!(settings.admin.sample_interval(), Duration::from_secs(5));
        let off = Settings::load_from(None, &env(&[("BATCHD__ADMIN__LISTEN", "")])).unwrap();
        assert_eq!(off.admin.listen_addr(), None);
        let err = Settings::load_from(None, &env(&[("BATCHD__ADMIN__LISTEN", "localhost")])).unwrap_err();
        assert!(err.to_string().contains("admin.listen"), "{err}");
        let err = Settings::load_from(None, &env(&[("BATCHD__ADMIN__SAMPLE_INTERVAL_MS", "0")])).unwrap_err();
        assert!(err.to_string().contains("admin.sample_interval_ms"), "{err}");
        assert!(settings.admin.allowed_hosts.is_empty(), "localhost and addresses only by default");
        let named =
            Settings::load_from(None, &env(&[("BATCHD__ADMIN__ALLOWED_HOSTS", "batchd.batchd.svc, Prom.Internal")]))
                .unwrap();
        assert!(named.admin.hosts().is_own_host("prom.internal:9090") && named.admin.hosts().is_own_host("[::1]"));
        assert!(!named.admin.hosts().is_own_host("evil.example:9090"));
        let err =
            Settings::load_from(None, &env(&[("BATCHD__ADMIN__ALLOWED_HOSTS", "https://prom:9090")])).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "configuration: admin.allowed_hosts (BATCHD__ADMIN__ALLOWED_HOSTS): \"https://prom:9090\" is not a host"
            ),
            "{err}"
        );
    }
}
