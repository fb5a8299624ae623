//! Gemini Batch Mode as a provider kind ([`REGISTRATION`]): its names, what it can do, and the one check-and-build
//! of an instance from its settings that `batchd run` and `batchd config check` share.

use std::sync::Arc;

use batchd_provider::{BuildContext, Capabilities, Kind, Registration, SettingError, check_request_timeout, http};

use crate::provider::{GeminiProvider, NAME};
use crate::settings::{BuildError, GeminiSettings, MAX_FILE_BYTES, MAX_INLINE_BYTES};

/// What Gemini Batch Mode can do: cancel a running batch (it ends with what it finished); no events; the API does
/// not echo an item's `external_reference`. Its window: Google targets 24 h and expires a batch pending or running
/// for 48 h (docs/providers.md: the 48 h is not confirmed by a second source); the longer one, so a job's default
/// deadline never gives up a batch Google still runs.
pub const CAPABILITIES: Capabilities = Capabilities {
    cancel: true,
    events: false,
    echoes_external_reference: false,
    window: Some(std::time::Duration::from_secs(48 * 3600)),
};

/// Gemini Batch Mode, as the daemon's registry lists it.
pub static REGISTRATION: Registration<GeminiSettings, GeminiProvider> = Registration {
    kind: Kind {
        name: NAME,
        title: "Gemini Batch Mode",
        models: &["gemini/<model>"],
        capabilities: CAPABILITIES,
        configure: "set GEMINI_API_KEY or api_key_file in [gemini]",
    },
    check,
    build,
};

/// Checks an instance's settings: limits within the API's, a request that ends within a claim's lease, a base URL
/// that keeps the key private, an account label.
fn check(settings: &GeminiSettings, context: &BuildContext) -> Result<(), SettingError> {
    let fail = |key: &'static str, why: String| Err(SettingError::new(key, why));
    if !(1024..=MAX_INLINE_BYTES).contains(&settings.max_inline_bytes) {
        return fail(
            "max_inline_bytes",
            format!("must be 1024-{MAX_INLINE_BYTES} (the API's inline limit, about 20 MB)"),
        );
    }
    if !(1024..=MAX_FILE_BYTES).contains(&settings.max_file_bytes) {
        return fail("max_file_bytes", format!("must be 1024-{MAX_FILE_BYTES} (the Files API's limit, 2 GB)"));
    }
    if !(1..=1_000_000).contains(&settings.max_requests) {
        return fail("max_requests", "must be 1-1000000".to_owned());
    }
    if settings.max_result_bytes < 64 * 1024 {
        return fail("max_result_bytes", "must be at least 65536".to_owned());
    }
    if settings.burst == 0 {
        return fail("burst", "must be at least 1".to_owned());
    }
    if !(1..=100).contains(&settings.lookup_pages) {
        return fail("lookup_pages", "must be 1-100".to_owned());
    }
    check_request_timeout("request_timeout_secs", settings.request_timeout, context)?;
    if !batchd_provider::is_account_label(&settings.account) {
        return fail("account", "must be 1-64 characters of A-Z a-z 0-9 . _ -".to_owned());
    }
    http::refuse_clear_text(&settings.base_url).map_err(|why| SettingError::new("base_url", why))
}

/// Builds an instance's provider (refusing a URL or key its client cannot use).
fn build(settings: &GeminiSettings, context: &BuildContext) -> Result<Arc<GeminiProvider>, SettingError> {
    let provider = GeminiProvider::new(settings).map_err(|error| match error {
        BuildError::InvalidBaseUrl { url, reason } => SettingError::new("base_url", format!("{url:?}: {reason}")),
        BuildError::InvalidKey => SettingError::new("api_key", "empty or not sendable in an HTTP header"),
        BuildError::Http(error) => SettingError::new("base_url", format!("cannot build the HTTP client: {error}")),
    })?;
    let provider = provider.with_inflight_bytes(context.inflight_bytes);
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
    type Spoil = fn(&mut GeminiSettings);

    #[test]
    fn each_refused_setting_is_named_by_its_key() {
        let good = GeminiSettings::new(ApiKey::new("AIza-key"));
        let check_and_build = |settings: &GeminiSettings| REGISTRATION.check_and_build(settings, &context()).map(drop);
        assert!(check_and_build(&good).is_ok());
        let cases: [(&str, Spoil); 10] = [
            ("max_inline_bytes", |s| s.max_inline_bytes = 30_000_000),
            ("max_file_bytes", |s| s.max_file_bytes = 3_000_000_000),
            ("max_requests", |s| s.max_requests = 0),
            ("max_result_bytes", |s| s.max_result_bytes = 10),
            ("burst", |s| s.burst = 0),
            ("lookup_pages", |s| s.lookup_pages = 0),
            ("request_timeout_secs", |s| s.request_timeout = Duration::from_secs(600)),
            ("account", |s| s.account = "{x}".to_owned()),
            ("base_url", |s| s.base_url = "http://generativelanguage.googleapis.com".to_owned()),
            ("api_key", |s| s.api_key = ApiKey::new("")),
        ];
        for (key, spoil) in cases {
            let mut settings = good.clone();
            spoil(&mut settings);
            assert_eq!(check_and_build(&settings).expect_err(key).key, key);
        }
    }

    #[test]
    fn a_batch_is_bounded_by_a_quarter_of_the_inflight_bytes() {
        let settings = GeminiSettings::new(ApiKey::new("k"));
        let context = BuildContext { inflight_bytes: 400_000_000, ..context() };
        let provider = REGISTRATION.check_and_build(&settings, &context).expect("built");
        assert_eq!(batchd_provider::Provider::limits(&*provider).max_body_bytes, 100_000_000);
    }
}
