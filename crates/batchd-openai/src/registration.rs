//! OpenAI Batch as a provider kind ([`REGISTRATION`]): its names, what it can do, and the one check-and-build of
//! an instance from its settings that `batchd run` and `batchd config check` share.

use std::sync::Arc;
use std::time::Duration;

use batchd_provider::{BuildContext, Capabilities, Kind, Registration, SettingError, check_request_timeout, http};

use crate::MAX_ENDPOINT_LEN;
use crate::OpenAiProvider;
use crate::provider::NAME;
use crate::settings::{DEFAULT_ENDPOINT, FILE_EXPIRY_SECS, OpenAiBuildError, OpenAiClientSettings, completion_window};

/// What OpenAI Batch can do: cancel a running batch (it ends with what it finished); no events; the API does not
/// echo an item's `external_reference`; a batch expires 24 h after its creation (`completion_window` "24h").
pub const CAPABILITIES: Capabilities = Capabilities {
    cancel: true,
    events: false,
    echoes_external_reference: false,
    window: Some(Duration::from_secs(24 * 3600)),
};

/// OpenAI Batch, as the daemon's registry lists it.
pub static REGISTRATION: Registration<OpenAiClientSettings, OpenAiProvider> = Registration {
    kind: Kind {
        name: NAME,
        title: "OpenAI Batch",
        models: &["openai/<model>"],
        capabilities: CAPABILITIES,
        configure: "set OPENAI_API_KEY or api_key_file in [openai]",
    },
    check,
    build,
};

/// Checks an instance's settings: limits within the API's, a request that ends within a claim's lease, a base URL
/// that keeps the key private, an account label.
fn check(settings: &OpenAiClientSettings, context: &BuildContext) -> Result<(), SettingError> {
    let fail = |key: &'static str, why: &str| Err(SettingError::new(key, why));
    if !(1..=50_000).contains(&settings.max_requests) {
        return fail("max_requests", "must be 1 to 50000 (the API's limit per batch)");
    }
    if !(1024..=200 * 1000 * 1000).contains(&settings.max_file_bytes) {
        return fail("max_file_bytes", "must be 1024 to 200000000 (the API's limit per input file)");
    }
    if settings.max_result_bytes < 64 * 1024 {
        return fail("max_result_bytes", "must be at least 65536");
    }
    check_request_timeout("request_timeout_secs", settings.request_timeout, context)?;
    if settings.lookup_pages == 0 {
        return fail("lookup_pages", "must be at least 1");
    }
    if settings.file_expiry_secs != 0 && !FILE_EXPIRY_SECS.contains(&settings.file_expiry_secs) {
        return fail("file_expiry_secs", "must be 0 (OpenAI's 30-day default) or 3600-2592000 (one hour to 30 days)");
    }
    if !batchd_provider::is_account_label(&settings.account) {
        return fail("account", "must be 1-64 characters of A-Z a-z 0-9 . _ -");
    }
    if settings.idle_timeout.is_zero() {
        return fail("idle_timeout_secs", "must be at least 1");
    }
    check_endpoints(&settings.endpoints).map_err(|why| SettingError::new("endpoints", why))?;
    if let Some(window) = &settings.completion_window
        && completion_window(window).is_none()
    {
        return fail("completion_window", "must be a whole number of hours or days (24h, 48h, 7d), or empty for none");
    }
    let token = |text: &str| {
        (1..=64).contains(&text.len())
            && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    if !token(&settings.file_purpose) {
        return fail("file_purpose", "must be 1-64 characters of A-Z a-z 0-9 - _ . (OpenAI's is batch)");
    }
    for (model, tokens) in &settings.enqueued_token_limits {
        if model.trim().is_empty() || *tokens == 0 {
            return fail("enqueued_token_limits", "each entry needs a model and tokens of at least 1");
        }
    }
    http::refuse_clear_text(&settings.base_url).map_err(|why| SettingError::new("base_url", why))
}

/// Checks `openai.endpoints`: at least one, each a `/v1/...` path of at most [`MAX_ENDPOINT_LEN`] bytes of
/// `a-z 0-9 / _ . -` (it goes into every input line), none twice. The error is the reason.
fn check_endpoints(endpoints: &[String]) -> Result<(), String> {
    if endpoints.is_empty() {
        return Err(format!("must name at least one endpoint, e.g. {DEFAULT_ENDPOINT:?}"));
    }
    for (index, endpoint) in endpoints.iter().enumerate() {
        let path = endpoint.strip_prefix("/v1/").unwrap_or_default();
        let well_formed = !path.is_empty()
            && endpoint.len() <= MAX_ENDPOINT_LEN
            && !endpoint.ends_with('/')
            && !endpoint.contains("//")
            && path
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'/' | b'_' | b'.' | b'-'));
        if !well_formed {
            let shown: String = endpoint.chars().take(MAX_ENDPOINT_LEN + 1).collect();
            return Err(format!(
                "{shown:?} is not an endpoint path: each must be \"/v1/...\" (at most {MAX_ENDPOINT_LEN} bytes of \
                 a-z 0-9 / _ . -), e.g. \"/v1/chat/completions\""
            ));
        }
        if endpoints[..index].contains(endpoint) {
            return Err(format!("{endpoint:?} is listed twice"));
        }
    }
    Ok(())
}

/// Builds an instance's provider.
fn build(settings: &OpenAiClientSettings, context: &BuildContext) -> Result<Arc<OpenAiProvider>, SettingError> {
    // A submit holds room for its items and the file built from them: a quarter of the budget at most.
    let mut settings = settings.clone();
    settings.max_file_bytes = settings.max_file_bytes.min(context.inflight_bytes / 4);
    let provider = OpenAiProvider::new(settings, context.reply_budget.clone()).map_err(|error| match error {
        OpenAiBuildError::InvalidBaseUrl { url, reason } => SettingError::new("base_url", format!("{url:?}: {reason}")),
        OpenAiBuildError::InvalidHeader(key) => {
            SettingError::new(key, "empty, or holds characters that cannot be sent in an HTTP header")
        }
        OpenAiBuildError::InvalidLimit(key) => SettingError::new(key, "must be at least 1"),
        OpenAiBuildError::Http(error) => {
            SettingError::new("base_url", format!("cannot build the HTTP client: {error}"))
        }
    })?;
    Ok(Arc::new(provider))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ApiKey;

    fn context() -> BuildContext {
        BuildContext { lease: Duration::from_secs(300), inflight_bytes: 1 << 30, reply_budget: None }
    }

    /// Makes one setting wrong.
    type Spoil = fn(&mut OpenAiClientSettings);

    #[test]
    fn each_refused_setting_is_named_by_its_key() {
        let good = OpenAiClientSettings::new(ApiKey::new("sk-x"));
        let check_and_build =
            |settings: &OpenAiClientSettings| REGISTRATION.check_and_build(settings, &context()).map(drop);
        assert!(check_and_build(&good).is_ok());
        let cases: [(&str, Spoil); 16] = [
            ("completion_window", |s| s.completion_window = Some("1 day".to_owned())),
            ("completion_window", |s| s.completion_window = Some("0h".to_owned())),
            ("file_purpose", |s| s.file_purpose = "batch\r\nx".to_owned()),
            ("max_requests", |s| s.max_requests = 50_001),
            ("max_file_bytes", |s| s.max_file_bytes = 300_000_000),
            ("max_result_bytes", |s| s.max_result_bytes = 10),
            ("request_timeout_secs", |s| s.request_timeout = Duration::from_secs(300)),
            ("lookup_pages", |s| s.lookup_pages = 0),
            ("file_expiry_secs", |s| s.file_expiry_secs = 60),
            ("base_url", |s| s.base_url = "http://10.0.0.5/v1".to_owned()),
            ("organization", |s| s.organization = Some("a\nb".to_owned())),
            ("idle_timeout_secs", |s| s.idle_timeout = Duration::ZERO),
            ("enqueued_token_limits", |s| s.enqueued_token_limits.push(("gpt-4o".to_owned(), 0))),
            ("endpoints", |s| s.endpoints.clear()),
            ("endpoints", |s| s.endpoints.push("v1/chat".to_owned())),
            ("endpoints", |s| s.endpoints.push("/v1/embeddings".to_owned())),
        ];
        for (key, spoil) in cases {
            let mut settings = good.clone();
            spoil(&mut settings);
            assert_eq!(check_and_build(&settings).expect_err(key).key, key);
        }
        let mut more = good.clone();
        more.endpoints.push("/v1/audio/speech".to_owned());
        assert!(check_and_build(&more).is_ok(), "a new endpoint is configurable");
        let mut groq = good.clone();
        groq.completion_window = Some("7d".to_owned());
        assert!(check_and_build(&groq).is_ok(), "Groq's windows reach 7 days");
        let mut none = good.clone();
        none.completion_window = None;
        assert!(check_and_build(&none).is_ok(), "a vendor that takes no window");
        let mut settings = good.clone();
        settings.account = "a:b".to_owned();
        assert_eq!(check_and_build(&settings).expect_err("account").key, "account");
        let mut settings = good;
        settings.base_url = "ftp://api.openai.com/v1".to_owned();
        let error = check_and_build(&settings).expect_err("ftp");
        assert!(error.key == "base_url" && error.why.contains("scheme"), "{error:?}");
    }
}
