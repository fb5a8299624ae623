//! Validation: the relations between values that the types cannot express (checked at every load), the
//! warnings the daemon logs at start, and `check_for_run`, shared by `batchd run` and `batchd config check`.

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
        if self.schedule.lease_secs <= self.cloudflare.request_timeout_secs {
            return fail("schedule.lease_secs", "must exceed cloudflare.request_timeout_secs");
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
        if self.jobs.default_deadline_secs == 0 {
            return fail("jobs.default_deadline_secs", "must be at least 1");
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
        if self.cloudflare.max_reply_bytes < 64 * 1024 {
            return fail("cloudflare.max_reply_bytes", "must be at least 65536");
        }
        check_base_url("cloudflare.base_url", &self.cloudflare.base_url)?;
        check_base_url("anthropic.base_url", &self.anthropic.base_url)?;
        if !(1024..=batchd_anthropic::MAX_BODY_BYTES).contains(&self.anthropic.max_body_bytes) {
            return fail("anthropic.max_body_bytes", "must be 1024-256000000 (the API's limit is 256 MB)");
        }
        if !(1..=batchd_anthropic::MAX_REQUESTS).contains(&self.anthropic.max_requests) {
            return fail("anthropic.max_requests", "must be 1-100000 (the API's limit)");
        }
        if self.anthropic.max_reply_bytes < 64 * 1024 {
            return fail("anthropic.max_reply_bytes", "must be at least 65536");
        }
        if self.anthropic.burst == 0 {
            return fail("anthropic.burst", "must be at least 1");
        }
        if self.schedule.lease_secs <= self.anthropic.request_timeout_secs && self.anthropic_configured() {
            return fail("schedule.lease_secs", "must exceed anthropic.request_timeout_secs");
        }
        self.check_openai()?;
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
        Ok(())
    }

    /// Whether a key for Anthropic is given (by the environment or a file).
    pub fn anthropic_configured(&self) -> bool {
        self.anthropic.api_key.as_ref().is_some_and(|key| !key.expose().is_empty())
            || !self.anthropic.api_key_file.is_empty()
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
    /// and `batchd config check` call: the tokens can be read, the API clients can be built from these settings
    /// (account id, base URL, token, queue id), the Redis deployment (TLS files included) is usable, the log filter
    /// (`log.level`, or `RUST_LOG` when set) parses.
    pub fn check_for_run(&self) -> Result<(), ConfigError> {
        if self.cloudflare.account_id.trim().is_empty() {
            return Err(ConfigError::at("cloudflare.account_id", "not set (the Cloudflare account's id)"));
        }
        let token = self.api_token()?;
        batchd_cloudflare::BatchClient::new(self.client_settings(&token))
            .map_err(|e| cloudflare_error(e, "cloudflare.api_token"))?;
        if self.events.enabled() {
            let (token, token_key) = match self.events_token()? {
                Some(token) => (token, "events.api_token"),
                None => (token, "cloudflare.api_token"),
            };
            batchd_cloudflare::QueueClient::new(self.client_settings(&token), &self.events.queue_id)
                .map_err(|e| cloudflare_error(e, token_key))?;
        }
        if let Some(key) = self.anthropic_key()? {
            batchd_anthropic::AnthropicProvider::new(&self.anthropic_settings(&key)).map_err(anthropic_error)?;
        }
        self.redis_endpoint()?;
        crate::logging::check(&self.log, std::env::var("RUST_LOG").ok().as_deref()).map_err(ConfigError::keyed)?;
        Ok(())
    }
}

impl Settings {
    /// `[openai]`: limits within the API's, a lease longer than a request, a base URL that keeps the key private.
    fn check_openai(&self) -> Result<(), ConfigError> {
        let openai = &self.openai;
        let fail = |key: &str, why: &str| Err(ConfigError::at(&format!("openai.{key}"), why));
        if !(1..=50_000).contains(&openai.max_requests) {
            return fail("max_requests", "must be 1 to 50000 (the API's limit per batch)");
        }
        if !(1024..=200 * 1000 * 1000).contains(&openai.max_file_bytes) {
            return fail("max_file_bytes", "must be 1024 to 200000000 (the API's limit per input file)");
        }
        if openai.max_result_bytes < 64 * 1024 {
            return fail("max_result_bytes", "must be at least 65536");
        }
        // The lease must outlast a request only where OpenAI is used (a key is given).
        let configured = openai.api_key.is_some() || !openai.api_key_file.is_empty();
        if openai.request_timeout_secs == 0 || (configured && self.schedule.lease_secs <= openai.request_timeout_secs) {
            return fail("request_timeout_secs", "must be at least 1 and below schedule.lease_secs");
        }
        if openai.lookup_pages == 0 {
            return fail("lookup_pages", "must be at least 1");
        }
        let expiry = batchd_openai::FILE_EXPIRY_SECS;
        if openai.file_expiry_secs != 0 && !expiry.contains(&openai.file_expiry_secs) {
            return fail(
                "file_expiry_secs",
                "must be 0 (OpenAI's 30-day default) or 3600-2592000 (one hour to 30 days)",
            );
        }
        check_base_url("openai.base_url", &openai.base_url)
    }
}

/// A Cloudflare client's refusal as the key it concerns (`token_key` for the token it was given).
fn cloudflare_error(error: batchd_cloudflare::ClientBuildError, token_key: &str) -> ConfigError {
    use batchd_cloudflare::ClientBuildError as E;
    match error {
        E::InvalidAccountId(why) => ConfigError::at("cloudflare.account_id", why),
        E::InvalidBaseUrl { url, reason } => ConfigError::at("cloudflare.base_url", format!("{url:?}: {reason}")),
        E::InvalidToken(why) => ConfigError::at(token_key, why),
        E::InvalidQueueId(id) => {
            ConfigError::at("events.queue_id", format!("{id:?}: 1-64 characters of A-Z a-z 0-9 _ -"))
        }
        E::Http(error) => ConfigError(format!("cloudflare: cannot build the HTTP client: {error}")),
    }
}

/// The Anthropic provider's refusal as the key it concerns.
fn anthropic_error(error: batchd_anthropic::BuildError) -> ConfigError {
    use batchd_anthropic::BuildError as E;
    match error {
        E::InvalidBaseUrl { url, reason } => ConfigError::at("anthropic.base_url", format!("{url:?}: {reason}")),
        E::InvalidHeader("api key") => ConfigError::at("anthropic.api_key", "empty or not sendable in an HTTP header"),
        E::InvalidHeader("workspace") => ConfigError::at("anthropic.workspace_id", "not sendable in an HTTP header"),
        E::InvalidHeader(name) => {
            ConfigError::at(&format!("anthropic.{name}"), "empty or not sendable in an HTTP header")
        }
        E::InvalidLimit(why) => ConfigError::keyed(format!("anthropic.{why}")),
        E::Http(error) => ConfigError(format!("anthropic: cannot build the HTTP client: {error}")),
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

/// Refuses a plain-HTTP API base URL that is not on this machine: the token would cross the network in clear.
fn check_base_url(key: &str, base_url: &str) -> Result<(), ConfigError> {
    let Some(rest) = base_url.trim().strip_prefix("http://") else {
        return Ok(()); // https, or a URL the client itself refuses with a clearer message
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    let loopback =
        host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(ConfigError::at(
            key,
            format!(
                "{base_url:?} is plain http to another host, which would send the API token in clear; use https \
                 (http is allowed only for loopback, e.g. the emulator on 127.0.0.1)"
            ),
        ))
    }
}

impl Settings {
    /// Every file a secret is read from, with its key: the Cloudflare token, the events queue's token, the OpenAI
    /// and Anthropic keys (a systemd credential is one of these once found, [`Settings::use_systemd_credential`]).
    pub fn secret_files(&self) -> Vec<(&'static str, &str)> {
        [
            ("cloudflare.api_token_file", self.cloudflare.api_token_file.as_str()),
            ("events.api_token_file", self.events.api_token_file.as_str()),
            ("openai.api_key_file", self.openai.api_key_file.as_str()),
            ("anthropic.api_key_file", self.anthropic.api_key_file.as_str()),
        ]
        .into_iter()
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

    #[test]
    fn openai_limits_and_its_request_timeout_are_checked_where_a_key_is_given() {
        let load = |pairs: &[(&str, &str)]| Settings::load_from(None, &env(pairs)).map_err(|e| e.to_string());
        let error = load(&[("BATCHD__OPENAI__MAX_REQUESTS", "50001")]).unwrap_err();
        assert!(error.contains("openai.max_requests"), "{error}");
        let error = load(&[("BATCHD__OPENAI__MAX_FILE_BYTES", "300000000")]).unwrap_err();
        assert!(error.contains("openai.max_file_bytes"), "{error}");
        let error = load(&[("BATCHD__OPENAI__BASE_URL", "http://10.0.0.5/v1")]).unwrap_err();
        assert!(error.contains("openai.base_url") && error.contains("in clear"), "{error}");
        let short_lease = [("BATCHD__SCHEDULE__LEASE_SECS", "30"), ("BATCHD__CLOUDFLARE__REQUEST_TIMEOUT_SECS", "10")];
        assert!(load(&short_lease).is_ok(), "no key: OpenAI's timeout does not matter");
        let error = load(&[short_lease[0], short_lease[1], ("OPENAI_API_KEY", "sk-x")]).unwrap_err();
        assert!(error.contains("openai.request_timeout_secs"), "{error}");
    }

    #[test]
    fn plain_http_is_refused_unless_the_api_is_on_this_machine() {
        let load = |url: &str| Settings::load_from(None, &env(&[("BATCHD__CLOUDFLARE__BASE_URL", url)]));
        for allowed in [
            "https://api.cloudflare.com/client/v4",
            "http://127.0.0.1:8787/client/v4",
            "http://127.9.0.1:1",
            "http://localhost:8787",
            "http://[::1]:8787/x",
        ] {
            assert!(load(allowed).is_ok(), "{allowed}");
        }
        for refused in ["http://api.cloudflare.com/client/v4", "http://10.0.0.5:8787", "http://[2001:db8::1]:80"] {
            let error = load(refused).expect_err(refused).to_string();
            assert!(error.contains("cloudflare.base_url") && error.contains("in clear"), "{error}");
        }
    }

    #[test]
    fn anthropic_settings_are_checked_at_load() {
        let load = |pairs: &[(&str, &str)]| Settings::load_from(None, &env(pairs));
        let defaults = load(&[]).unwrap();
        assert_eq!(defaults.anthropic.base_url, "https://api.anthropic.com");
        assert_eq!((defaults.anthropic.max_requests, defaults.anthropic.max_body_bytes), (100_000, 256_000_000));
        assert!(!defaults.anthropic_configured(), "no key, no Anthropic");
        let local = load(&[("BATCHD__ANTHROPIC__BASE_URL", "http://127.0.0.1:8787/anthropic")]).unwrap();
        assert_eq!(local.anthropic.base_url, "http://127.0.0.1:8787/anthropic");
        for (key, value, named) in [
            ("BATCHD__ANTHROPIC__BASE_URL", "http://api.anthropic.com", "anthropic.base_url"),
            ("BATCHD__ANTHROPIC__MAX_REQUESTS", "100001", "anthropic.max_requests"),
            ("BATCHD__ANTHROPIC__MAX_BODY_BYTES", "300000000", "anthropic.max_body_bytes"),
            ("BATCHD__ANTHROPIC__BURST", "0", "anthropic.burst"),
        ] {
            let error = load(&[(key, value)]).expect_err(key).to_string();
            assert!(error.contains(named), "{error}");
        }
        let error = load(&[("ANTHROPIC_API_KEY", "sk"), ("BATCHD__ANTHROPIC__REQUEST_TIMEOUT_SECS", "120")])
            .expect_err("a request longer than the lease")
            .to_string();
        assert!(error.contains("anthropic.request_timeout_secs"), "{error}");
        let configured = load(&[("ANTHROPIC_API_KEY", "sk-secret-123")]).unwrap();
        let client = configured.anthropic_settings(&configured.anthropic_key().unwrap().expect("key"));
        assert_eq!((client.version.as_str(), client.beta.as_deref()), ("2023-06-01", None));
        assert!(client.delete_batches, "ended batches are deleted by default");
        assert!(!format!("{client:?}").contains("sk-secret-123"), "the key never prints");
        let keep = load(&[("ANTHROPIC_API_KEY", "sk"), ("BATCHD__ANTHROPIC__DELETE_BATCHES", "false")]).unwrap();
        assert!(!keep.anthropic_settings(&keep.anthropic_key().unwrap().expect("key")).delete_batches);
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
