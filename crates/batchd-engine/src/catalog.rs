//! Cloudflare upkeep: keeps the Workers AI model catalog fresh (shared by the replicas through Redis), records the
//! models batchd submits for, and says which of them have no event subscription to the events queue.
//!
//! The catalog is read from the API by whichever replica finds the Redis copy older than
//! `cloudflare.catalog_refresh_secs` (hourly), and from the Redis copy by the others; while the API cannot be
//! read, the last copy stays in use (its age is exported), and with no copy at all the `[rate_limits]` tables
//! apply. A model whose batch events no subscription delivers is logged once and counted in
//! `batchd_models_without_events`: its results wait for the fallback poll (`poll.max_interval_ms_with_events`)
//! instead of arriving within a second (`batchd events setup` fixes it).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use batchd_cloudflare::{CloudflareProvider, ModelCatalog, Step, SubscriptionClient, plan};
use batchd_queue::{Store, provider_cache};
use tokio_util::sync::CancellationToken;

use crate::metrics;

/// How often the loop looks at what changed (a refresh due, an old subscription list); a newly seen model wakes
/// it at once.
const TICK: Duration = Duration::from_secs(15);

/// How long a list of the queue's subscriptions is trusted before a newly seen model makes it read again; a model
/// seen once is checked again after this too (someone may have removed its subscription).
pub const SUBSCRIPTIONS_TTL: Duration = Duration::from_secs(600);

/// What the upkeep needs.
#[derive(Debug, Clone)]
pub struct CloudflareUpkeep {
    /// The provider whose catalog, seen models and effective limits are kept.
    pub provider: Arc<CloudflareProvider>,
    /// The account (part of the Redis keys).
    pub account_id: String,
    /// Where the shared copies live (the daemon's first namespace).
    pub store: Store,
    /// How often the catalog is read again; `None`: never read (the tables apply).
    pub refresh: Option<Duration>,
    /// The events queue's subscriptions, when events are on.
    pub subscriptions: Option<SubscriptionClient>,
}

/// Where the catalog in use came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogSource {
    /// The Redis copy, fresh enough.
    Cache,
    /// The API, just now (and written to Redis).
    Api,
    /// The Redis copy, older than the refresh interval: the API could not be read.
    StaleCache,
    /// Nothing: the API could not be read and Redis has no copy (the tables apply).
    None,
}

/// What the subscription check remembers between rounds.
#[derive(Debug, Default)]
struct SubscriptionWatch {
    /// When the queue's subscriptions were last listed, and the models that had none then.
    checked: Option<(Instant, BTreeSet<String>)>,
    /// Models already logged as without a subscription (each is logged once).
    warned: BTreeSet<String>,
    /// Models seen since the last list.
    unchecked: bool,
}

impl CloudflareUpkeep {
    /// Makes the catalog current: the Redis copy when fresh, else the API's (written back to Redis), else the
    /// stale copy. Sets the provider's catalog and `batchd_model_catalog_age_seconds`.
    pub async fn load_catalog(&self) -> CatalogSource {
        let Some(refresh) = self.refresh else {
            return CatalogSource::None;
        };
        let mut conn = self.store.connection();
        let keys = self.store.keys();
        let now = match self.store.now().await {
            Ok(now) => now,
            Err(error) => {
                tracing::warn!(error = %error, "cannot read Redis's clock; the model catalog is not refreshed now");
                return CatalogSource::None;
            }
        };
        let cached = match provider_cache::read_catalog(&mut conn, keys, &self.account_id).await {
            Ok(text) => text.as_deref().and_then(ModelCatalog::from_json),
            Err(error) => {
                metrics::redis_error("catalog");
                tracing::warn!(error = %error, "cannot read the cached model catalog");
                None
            }
        };
        let age_of = |catalog: &ModelCatalog| Duration::from_millis(now.saturating_sub(catalog.fetched_at_ms));
        if let Some(catalog) = cached.as_ref().filter(|catalog| age_of(catalog) < refresh) {
            self.use_catalog(catalog.clone(), age_of(catalog));
            return CatalogSource::Cache;
        }
        match self.provider.client().model_catalog().await {
            Ok(mut catalog) => {
                catalog.fetched_at_ms = now;
                if let Err(error) =
                    provider_cache::write_catalog(&mut conn, keys, &self.account_id, &catalog.to_json()).await
                {
                    metrics::redis_error("catalog");
                    tracing::warn!(error = %error, "cannot share the model catalog through Redis; this replica uses it alone");
                }
                tracing::info!(
                    models = catalog.models.len(),
                    batchable = catalog.batchable().count(),
                    "model catalog read from the API"
                );
                self.use_catalog(catalog, Duration::ZERO);
                CatalogSource::Api
            }
            Err(error) => match cached {
                Some(catalog) => {
                    let age = age_of(&catalog);
                    tracing::warn!(error = %error, age_secs = age.as_secs(), "cannot read the model catalog; the last copy stays in use");
                    self.use_catalog(catalog, age);
                    CatalogSource::StaleCache
                }
                None => {
                    tracing::warn!(error = %error, "cannot read the model catalog and Redis has no copy; the [rate_limits] tables apply");
                    CatalogSource::None
                }
            },
        }
    }

    fn use_catalog(&self, catalog: ModelCatalog, age: Duration) {
        metrics::model_catalog_age(age);
        self.provider.catalog().set(catalog);
    }

    /// Runs until `stop`: the catalog refreshed when due, seen models recorded, subscriptions checked, effective
    /// rate limits exported.
    pub async fn run(self, stop: CancellationToken) {
        let mut watch = SubscriptionWatch::default();
        let mut loaded_at = Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(TICK) => {}
                () = self.provider.seen_models().wait_for_new() => {}
                () = stop.cancelled() => return,
            }
            if let Some(refresh) = self.refresh {
                let catalog_at = self.provider.catalog().get().map(|catalog| catalog.fetched_at_ms);
                if loaded_at.elapsed() >= refresh.min(Duration::from_secs(300)) || catalog_at.is_none() {
                    self.load_catalog().await;
                    loaded_at = Instant::now();
                }
            }
            let new = self.provider.seen_models().take_new();
            if !new.is_empty() {
                watch.unchecked = true;
                let now = batchd_queue::now_ms();
                if let Err(error) = provider_cache::note_models_seen(
                    &mut self.store.connection(),
                    self.store.keys(),
                    &self.account_id,
                    &new,
                    now,
                )
                .await
                {
                    metrics::redis_error("models_seen");
                    tracing::debug!(error = %error, "cannot record the models seen; batchd events setup may miss them");
                }
            }
            self.check_subscriptions(&mut watch).await;
            for (bucket, per_window) in self.provider.effective_limits() {
                metrics::rate_limit_effective(&bucket, per_window);
            }
        }
    }

    /// Lists the queue's subscriptions when a model was seen since the last list or the list is old, and says
    /// (once per model) which seen models have none.
    async fn check_subscriptions(&self, watch: &mut SubscriptionWatch) {
        let Some(client) = &self.subscriptions else {
            return;
        };
        let stale = watch.checked.as_ref().is_none_or(|(at, _)| at.elapsed() >= SUBSCRIPTIONS_TTL);
        if !watch.unchecked && !stale {
            return;
        }
        let seen = self.provider.seen_models().all();
        if seen.is_empty() {
            return;
        }
        let subscriptions = match client.list().await {
            Ok(subscriptions) => subscriptions,
            Err(error) => {
                tracing::warn!(error = %error, "cannot list the events queue's subscriptions (the token needs Queues Read); retrying later");
                watch.checked =
                    Some((Instant::now(), watch.checked.take().map(|(_, missing)| missing).unwrap_or_default()));
                return;
            }
        };
        watch.unchecked = false;
        let missing: BTreeSet<String> = plan(seen.iter().map(String::as_str), &subscriptions, client.queue_id())
            .into_iter()
            .filter(|step| !matches!(step, Step::Ready { .. }))
            .map(|step| step.model().to_owned())
            .collect();
        for model in missing.difference(&watch.warned.clone()) {
            tracing::warn!(
                model = %model,
                queue_id = %client.queue_id(),
                "no event subscription delivers this model's batch events to the events queue: its results wait for \
                 the fallback poll (poll.max_interval_ms_with_events); run `batchd events setup`"
            );
            watch.warned.insert(model.clone());
        }
        watch.warned.retain(|model| missing.contains(model));
        metrics::models_without_events(missing.len());
        watch.checked = Some((Instant::now(), missing));
    }
}
