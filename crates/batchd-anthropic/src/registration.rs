//! Anthropic Message Batches as a provider kind ([`REGISTRATION`]): its names, what it can do, and the one
//! check-and-build of an instance from its settings that `batchd run` and `batchd config check` share.

use std::sync::Arc;
use std::time::Duration;

use batchd_provider::{BuildContext, Capabilities, Kind, Registration, SettingError, check_request_timeout, http};

use crate::provider::{AnthropicProvider, NAME};
use crate::settings::{AnthropicSettings, BuildError, MAX_BODY_BYTES, MAX_REQUESTS};

/// What Message Batches can do: cancel a running batch (it ends with what it finished); no events; the API does
/// not echo an item's `external_reference`; a batch expires 24 h after its creation.
pub const CAPABILITIES: Capabilities = Capabilities {
    cancel: true,
    events: false,
    echoes_external_reference: false,
    window: Some(Duration::from_secs(24 * 3600)),
};

/// Anthropic Message Batches, as the daemon's registry lists it.
pub static REGISTRATION: Registration<AnthropicSettings, AnthropicProvider> = Registration {
    kind: Kind {
        name: NAME,
        title: "Anthropic Message Batches",
        models: &["anthropic/<model>"],
        capabilities: CAPABILITIES,
        configure: "set ANTHROPIC_API_KEY or api_key_file in [anthropic]",
    },
    check,
    build,
};

/// Checks an instance's settings: limits within the API's, a request that ends within a claim's lease, a base URL
/// that keeps the key private, an account label.
fn check(settings: &AnthropicSettings, context: &BuildContext) -> Result<(), SettingError> {
    let fail = |key: &'static str, why: &str| Err(SettingError::new(key, why));
    if !(1024..=MAX_BODY_BYTES).contains(&settings.max_body_bytes) {
        return fail("max_body_bytes", "must be 1024-256000000 (the API's limit is 256 MB)");
    }
    if !(1..=MAX_REQUESTS).contains(&settings.max_requests) {
        return fail("max_requests", "must be 1-100000 (the API's limit)");
    }
    if settings.max_reply_bytes < 64 * 1024 {
        return fail("max_reply_bytes", "must be at least 65536");
    }
    if settings.burst == 0 {
        return fail("burst", "must be at least 1");
    }
    check_request_timeout("request_timeout_secs", settings.request_timeout, context)?;
    if !batchd_provider::is_account_label(&settings.account) {
        return fail("account", "must be 1-64 characters of A-Z a-z 0-9 . _ -");
    }
    http::refuse_clear_text(&settings.base_url).map_err(|why| SettingError::new("base_url", why))
}

/// Builds an instance's provider (refusing headers that cannot be sent).
fn build(settings: &AnthropicSettings, context: &BuildContext) -> Result<Arc<AnthropicProvider>, SettingError> {
    let provider = AnthropicProvider::new(settings).map_err(|error| match error {
        BuildError::InvalidBaseUrl { url, reason } => SettingError::new("base_url", format!("{url:?}: {reason}")),
        BuildError::InvalidHeader(key) => SettingError::new(key, "empty or not sendable in an HTTP header"),
        BuildError::InvalidLimit(why) => {
            SettingError::new(if why.starts_with("max_body_bytes") { "max_body_bytes" } else { "max_requests" }, why)
        }
        BuildError::Http(error) => SettingError::new("base_url", format!("cannot build the HTTP client: {error}")),
    })?;
    Ok(Arc::new(match &context.reply_budget {
        Some(budget) => provider.with_reply_budget(budget.clone()),
        None => provider,
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ApiKey;

    fn context() -> BuildContext {
        BuildContext { lease: Duration::from_secs(600), inflight_bytes: 1 << 30, reply_budget: None }
    }

    /// Makes one setting wrong.
    type Spoil = fn(&mut AnthropicSettings);

    #[test]
    fn each_refused_setting_is_named_by_its_key() {
        let good = AnthropicSettings::new(ApiKey::new("sk-ant"));
        let check_and_build =
            |settings: &AnthropicSettings| REGISTRATION.check_and_build(settings, &context()).map(drop);
        assert!(check_and_build(&good).is_ok());
        let cases: [(&str, Spoil); 9] = [
            ("max_body_bytes", |s| s.max_body_bytes = 300_000_000),
            ("max_requests", |s| s.max_requests = 100_001),
            ("max_reply_bytes", |s| s.max_reply_bytes = 10),
            ("burst", |s| s.burst = 0),
            ("request_timeout_secs", |s| s.request_timeout = Duration::from_secs(600)),
            ("account", |s| s.account = "{x}".to_owned()),
            ("base_url", |s| s.base_url = "http://api.anthropic.com".to_owned()),
            ("workspace_id", |s| s.workspace_id = Some("a\nb".to_owned())),
            ("api_key", |s| s.api_key = ApiKey::new("")),
        ];
        for (key, spoil) in cases {
            let mut settings = good.clone();
            spoil(&mut settings);
            assert_eq!(check_and_build(&settings).expect_err(key).key, key);
        }
    }
}
