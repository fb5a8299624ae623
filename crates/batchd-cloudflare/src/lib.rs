//! Client for the Cloudflare Workers AI asynchronous Batch API: submit a batch, poll it, classify its failures.
//!
//! Written from the API reference (`docs/batch-api.md`), not from the emulator, so a misreading of the API
//! cannot hide in both. The API's JSON stays private (`wire`); callers see [`Submitted`], [`PollStatus`] with
//! responses already in request order, and [`ApiError`] whose [`ErrorKind`] is the only thing they need to decide
//! whether to retry. The API token never leaves [`ApiToken`] except in the `Authorization` header.
//! [`CloudflareProvider`] puts the client behind the engine's provider seam (`batchd_provider::Provider`).

mod adaptive;
mod catalog;
mod client;
mod error;
mod provider;
mod queues;
mod rate_limits;
mod registration;
mod reply;
mod reply_plan;
mod settings;
mod subscriptions;
mod wire;

#[cfg(test)]
mod proptests;

pub use adaptive::{AdaptiveRates, MIN_FRACTION};
pub use catalog::{
    CATALOG_PAGE_SIZE, CatalogModel, MAX_CATALOG_PAGES, MAX_SEEN_MODELS, ModelCatalog, SeenModels, SharedCatalog,
    task_type_of,
};
pub use client::BatchClient;
pub use error::{ApiError, ErrorKind};
pub use provider::{BODY_SHAPE, CloudflareProvider};
pub use queues::{BatchEvent, EventKind, MAX_PULL_BATCH, Pulled, QueueClient, QueueMessage};
pub use rate_limits::{ModelLimit, ModelTask, RateLimitSettings, TaskSource, TaskType, rate_bucket};
pub use registration::{CAPABILITIES, ProviderSettings, REGISTRATION, client_error};
pub use reply::{PendingStatus, PollStatus, Submitted};
pub use settings::{
    ApiToken, ClientBuildError, ClientSettings, DEFAULT_BASE_URL, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_REPLY_BYTES,
    DEFAULT_REQUEST_TIMEOUT, MAX_ACCOUNT_ID_LEN,
};
pub use subscriptions::{BATCH_EVENTS, SOURCE_TYPE, Step, Subscription, SubscriptionClient, plan};
pub use wire::submit_body_bytes;
