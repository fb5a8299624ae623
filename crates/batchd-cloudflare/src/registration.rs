//! Workers AI as a provider kind ([`REGISTRATION`]): its names, what it can do, and the one check-and-build of an
//! instance from its settings ([`ProviderSettings`]) that `batchd run` and `batchd config check` share. Its
//! background tasks (the model catalog's upkeep and the events queue's consumer) run on the provider it builds.

use std::sync::Arc;

use batchd_provider::{BuildContext, Capabilities, Kind, Registration, SettingError, check_request_timeout, http};

use crate::rate_limits::RateLimitSettings;
use crate::settings::{ClientBuildError, ClientSettings};
use crate::{BatchClient, CloudflareProvider};

/// What Workers AI can do: no cancel call (a cancelled job's batches run on, unread); completion events through
/// a Cloudflare Queue; the API echoes each item's `external_reference`; its docs give no window after which a
/// batch expires.
pub const CAPABILITIES: Capabilities =
    Capabilities { cancel: false, events: true, echoes_external_reference: true, window: None };

/// What a Workers AI instance is built from.
#[derive(Debug, Clone)]
pub struct ProviderSettings {
    /// How to reach the account's API (account id, token, base URL, timeouts, reply bound).
    pub client: ClientSettings,
    /// The account's label (`[A-Za-z0-9._-]`, the account id by default): it names the rate buckets, which
    /// every namespace and replica using the same label shares.
    pub account: String,
    /// The shared limits per task type and model (`[rate_limits]`).
    pub rate_limits: RateLimitSettings,
    /// Largest body of one batch, in bytes (`jobs.max_payload_bytes`; the API's limit is 10 MB).
    pub max_body_bytes: usize,
    /// Most items in one batch (`jobs.max_batch_items`), if capped.
    pub max_items: Option<usize>,
}

/// Workers AI, as the daemon's registry lists it.
pub static REGISTRATION: Registration<ProviderSettings, CloudflareProvider> = Registration {
    kind: Kind {
        name: batchd_core::ids::CLOUDFLARE,
        title: "Workers AI",
        models: &["@cf/<model>", "@hf/<model>"],
        capabilities: CAPABILITIES,
        configure: "set cloudflare.account_id and CLOUDFLARE_API_TOKEN",
    },
    check,
    build,
};

/// Checks an instance's settings: an account id, a request that ends within a claim's lease, a base URL that
/// keeps the token private, a reply bound, an account label.
fn check(settings: &ProviderSettings, context: &BuildContext) -> Result<(), SettingError> {
    let client = &settings.client;
    if client.account_id.trim().is_empty() {
        return Err(SettingError::new("account_id", "not set (the Cloudflare account's id)"));
    }
    crate::settings::validate_account_id(&client.account_id).map_err(client_error)?;
    if client.max_reply_bytes < 64 * 1024 {
        return Err(SettingError::new("max_reply_bytes", "must be at least 65536"));
    }
    check_request_timeout("request_timeout_secs", client.request_timeout, context)?;
    if !batchd_provider::is_account_label(&settings.account) {
        return Err(SettingError::new("account", "must be 1-64 characters of A-Z a-z 0-9 . _ -"));
    }
    http::refuse_clear_text(&client.base_url).map_err(|why| SettingError::new("base_url", why))
}

/// Builds an instance's provider (refusing an account id, URL or token its client cannot use).
fn build(settings: &ProviderSettings, context: &BuildContext) -> Result<Arc<CloudflareProvider>, SettingError> {
    let mut batch_client = BatchClient::new(settings.client.clone()).map_err(client_error)?;
    if let Some(budget) = &context.reply_budget {
        batch_client = batch_client.with_reply_budget(budget.clone());
    }
    Ok(Arc::new(CloudflareProvider::new(
        batch_client,
        settings.account.clone(),
        settings.rate_limits.clone(),
        settings.max_body_bytes,
        settings.max_items,
    )))
}

/// A Cloudflare client's refusal as the setting it concerns (`api_token` for the token).
pub fn client_error(error: ClientBuildError) -> SettingError {
    match error {
        ClientBuildError::InvalidAccountId(why) => SettingError::new("account_id", why),
        ClientBuildError::InvalidBaseUrl { url, reason } => SettingError::new("base_url", format!("{url:?}: {reason}")),
        ClientBuildError::InvalidToken(why) => SettingError::new("api_token", why),
        ClientBuildError::InvalidQueueId(id) => {
            SettingError::new("queue_id", format!("{id:?}: 1-64 characters of A-Z a-z 0-9 _ -"))
        }
        ClientBuildError::Http(error) => {
            SettingError::new("base_url", format!("cannot build the HTTP client: {error}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ApiToken;

    fn context() -> BuildContext {
        BuildContext { lease: Duration::from_secs(120), inflight_bytes: 1 << 30, reply_budget: None }
    }

    fn good() -> ProviderSettings {
        ProviderSettings {
            client: ClientSettings::new("acct", ApiToken::new("tok")),
            account: "acct".to_owned(),
            rate_limits: RateLimitSettings {
                text_generation: 300,
                embeddings: 3000,
                translation: 720,
                speech_recognition: 720,
                window_secs: 60,
                burst: 1,
                limit_polls: false,
                models: Vec::new(),
                task_types: Vec::new(),
                extra_task_types: Vec::new(),
                unknown_model_task: crate::TaskType::TextGeneration,
                adaptive: false,
            },
            max_body_bytes: 10_000_000,
            max_items: None,
        }
    }

    /// Makes one setting wrong.
    type Spoil = fn(&mut ProviderSettings);

    #[test]
    fn each_refused_setting_is_named_by_its_key() {
        let check_and_build =
            |settings: &ProviderSettings| REGISTRATION.check_and_build(settings, &context()).map(drop);
        assert!(check_and_build(&good()).is_ok());
        let cases: [(&str, Spoil); 7] = [
            ("account_id", |s| s.client.account_id = " ".to_owned()),
            ("account_id", |s| s.client.account_id = "a/b".to_owned()),
            ("max_reply_bytes", |s| s.client.max_reply_bytes = 10),
            ("request_timeout_secs", |s| s.client.request_timeout = Duration::from_secs(120)),
            ("account", |s| s.account = "a:b".to_owned()),
            ("base_url", |s| s.client.base_url = "http://api.cloudflare.com/client/v4".to_owned()),
            ("api_token", |s| s.client.token = ApiToken::new("")),
        ];
        for (key, spoil) in cases {
            let mut settings = good();
            spoil(&mut settings);
            assert_eq!(check_and_build(&settings).expect_err(key).key, key);
        }
    }
}
