//! The Workers AI model catalog (`GET /accounts/{account}/ai/models/search`): which models accept queued (batch)
//! requests (`async_queue`), their task type (which picks the rate-limit bucket) and whether they need the paid
//! plan.
//!
//! The catalog is the source of truth for those facts; the hand-kept table in `[rate_limits]` is the fallback
//! while it cannot be read. The search reply's items are untyped in Cloudflare's OpenAPI spec, so every field is
//! read leniently: an item without a readable `name` is skipped, a task may be an object with a `name` or a bare
//! string, a property's value may be `"true"`, `true` or `1`. Sources: `docs/batch-api.md`, "The model catalog".

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::client::{BatchClient, Request, join};
use crate::error::{ApiError, Build as _, Operation};
use crate::rate_limits::TaskType;
use crate::wire;

/// Models asked for per page (the API's default and, as far as is known, its maximum).
pub const CATALOG_PAGE_SIZE: usize = 100;

/// Most pages read: 2,000 models, twenty times the catalog's size in 2026; a reply that keeps paging past it is
/// cut there (and the cut is logged) rather than read forever.
pub const MAX_CATALOG_PAGES: usize = 20;

/// Longest model name kept from the catalog (longer ones are skipped: no job could name them).
const MAX_NAME_CHARS: usize = 200;

/// Longest task name kept.
const MAX_TASK_CHARS: usize = 64;

/// The catalog's `property_id` that marks a model accepting `?queueRequest=true`.
const ASYNC_QUEUE: &str = "async_queue";

/// The catalog's `property_id` that marks a model needing the Workers Paid plan (403/5035 on the free plan).
const REQUIRE_PAID: &str = "require_workers_paid";

/// One model as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogModel {
    /// The model's name, e.g. `@cf/baai/bge-m3`.
    pub name: String,
    /// The catalog's task name, e.g. `Text Generation` (empty when the item had none).
    pub task: String,
    /// Whether the model accepts queued requests (the `async_queue` property is true).
    pub batchable: bool,
    /// Whether the model needs the Workers Paid plan (`require_workers_paid`).
    pub paid_only: bool,
}

impl CatalogModel {
    /// The rate-limit task type of the catalog's task name, when batchd has a bucket for it.
    pub fn task_type(&self) -> Option<TaskType> {
        task_type_of(&self.task)
    }
}

/// The catalog: every model it lists, by name, and when it was read (Redis's clock, Unix ms).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCatalog {
    /// When the catalog was read from the API, Unix milliseconds on Redis's clock.
    pub fetched_at_ms: u64,
    /// The models, by name.
    pub models: BTreeMap<String, CatalogModel>,
}

impl ModelCatalog {
    /// The catalog's entry for `model`, if it lists it.
    pub fn get(&self, model: &str) -> Option<&CatalogModel> {
        self.models.get(model)
    }

    /// The models that accept batch requests, by name.
    pub fn batchable(&self) -> impl Iterator<Item = &CatalogModel> {
        self.models.values().filter(|model| model.batchable)
    }

    /// Whether the catalog says `model` cannot take batch requests: it lists the model without `async_queue`. A
    /// model the catalog does not list is not refused here (a private or newer model: the API decides).
    pub fn refuses(&self, model: &str) -> bool {
        self.get(model).is_some_and(|entry| !entry.batchable)
    }

    /// The catalog as the JSON cached in Redis.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a catalog always serialises")
    }

    /// A catalog cached by [`ModelCatalog::to_json`]; `None` when the text is not one (another version wrote it).
    pub fn from_json(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }
}

/// The catalog the daemon uses now, shared by the provider (take-in checks, rate buckets) and the task that
/// refreshes it; empty until the first read, and while the catalog was never readable (the hand table applies).
#[derive(Debug, Clone, Default)]
pub struct SharedCatalog(Arc<RwLock<Option<Arc<ModelCatalog>>>>);

impl SharedCatalog {
    /// The catalog in use, if one was read.
    pub fn get(&self) -> Option<Arc<ModelCatalog>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Replaces the catalog in use.
    pub fn set(&self, catalog: ModelCatalog) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(catalog));
    }
}

/// Most models remembered as seen; later ones are not remembered (a producer naming a new model per job cannot
/// grow the set without bound).
pub const MAX_SEEN_MODELS: usize = 1000;

/// The Cloudflare models this process has submitted batches for, and those not yet handed to the task that
/// records them in Redis (for `batchd events setup`) and checks their event subscriptions.
#[derive(Debug, Clone, Default)]
pub struct SeenModels {
    /// Every model seen, and those not yet taken.
    models: Arc<Mutex<(BTreeSet<String>, Vec<String>)>>,
    /// Woken when a model is seen for the first time.
    new_model: Arc<tokio::sync::Notify>,
}

impl SeenModels {
    /// Notes a submit for `model` (cheap after the first time).
    pub fn saw(&self, model: &str) {
        let mut guard = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let (all, new) = &mut *guard;
        if all.len() < MAX_SEEN_MODELS && !all.contains(model) {
            all.insert(model.to_owned());
            new.push(model.to_owned());
            self.new_model.notify_one();
        }
    }

    /// Waits until a model is seen for the first time (at once if one was since the last wait).
    pub async fn wait_for_new(&self) {
        self.new_model.notified().await;
    }

    /// The models seen since the last call.
    pub fn take_new(&self) -> Vec<String> {
        std::mem::take(&mut self.models.lock().unwrap_or_else(PoisonError::into_inner).1)
    }

    /// Every model seen, in order.
    pub fn all(&self) -> Vec<String> {
        self.models.lock().unwrap_or_else(PoisonError::into_inner).0.iter().cloned().collect()
    }
}

/// The rate-limit task type of a catalog task name: `Text Generation`, `Text Embeddings`, `Translation`,
/// `Automatic Speech Recognition` (compared without case, spaces, dashes or underscores); `None` for the
/// catalog's other tasks (image, audio generation, classification, ...), which take `unknown_model_task`.
pub fn task_type_of(task: &str) -> Option<TaskType> {
    let key: String = task.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase();
    match key.as_str() {
        "textgeneration" => Some(TaskType::TextGeneration),
        "textembeddings" | "embeddings" => Some(TaskType::Embeddings),
        "translation" => Some(TaskType::Translation),
        "automaticspeechrecognition" | "speechrecognition" => Some(TaskType::SpeechRecognition),
        _ => None,
    }
}

/// One page of the search reply: the models it lists, and whether another page may follow.
#[derive(Debug, Default)]
pub(crate) struct CatalogPage {
    /// The readable items of the page.
    pub models: Vec<CatalogModel>,
    /// Items in the page's `result` list, readable or not (a page shorter than asked is the last).
    pub n_items: usize,
    /// `result_info.total_pages`, when the reply says.
    pub total_pages: Option<usize>,
}

/// Reads one 2xx page of `ai/models/search`.
pub(crate) fn read_catalog_page(http_status: u16, body: &[u8]) -> Result<CatalogPage, ApiError> {
    let unreadable = |what: &str| ApiError::unreadable_reply(Operation::Catalog, http_status, what, body);
    let reply: Value = serde_json::from_slice(body).map_err(|_| unreadable("the catalog reply is not JSON"))?;
    let Value::Object(reply) = reply else {
        return Err(unreadable("the catalog reply is not a JSON object"));
    };
    if wire::flag(reply.get("success")) == Some(false) {
        return Err(ApiError::from_reply(Operation::Catalog, http_status, None, body));
    }
    let Some(Value::Array(items)) = reply.get("result") else {
        return Err(unreadable("the catalog reply has no result list"));
    };
    let total_pages = wire::total_pages(&reply);
    Ok(CatalogPage { models: items.iter().filter_map(read_model).collect(), n_items: items.len(), total_pages })
}

/// One catalog item; `None` without a usable name.
fn read_model(item: &Value) -> Option<CatalogModel> {
    let name = wire::text(item.get("name"))?;
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS || name.chars().any(char::is_control) {
        return None;
    }
    let task = match item.get("task") {
        Some(Value::Object(task)) => wire::text(task.get("name")).unwrap_or_default(),
        Some(Value::String(task)) => task.clone(),
        _ => String::new(),
    };
    let task: String = task.chars().filter(|c| !c.is_control()).take(MAX_TASK_CHARS).collect();
    let property = |id: &str| -> Option<bool> {
        let Some(Value::Array(properties)) = item.get("properties") else {
            return None;
        };
        let found =
            properties.iter().find(|property| property.get("property_id").and_then(Value::as_str) == Some(id))?;
        wire::flag(found.get("value"))
    };
    Some(CatalogModel {
        name,
        task,
        batchable: property(ASYNC_QUEUE).unwrap_or(false),
        paid_only: property(REQUIRE_PAID).unwrap_or(false),
    })
}

impl BatchClient {
    /// Reads the whole model catalog, a page of [`CATALOG_PAGE_SIZE`] at a time, at most [`MAX_CATALOG_PAGES`]
    /// pages; `fetched_at_ms` is left 0 for the caller to stamp.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn model_catalog(&self) -> Result<ModelCatalog, ApiError> {
        let search = join(&self.account_url, &["ai", "models", "search"]);
        let mut catalog = ModelCatalog::default();
        for page in 1..=MAX_CATALOG_PAGES {
            let mut url = search.clone();
            url.query_pairs_mut()
                .append_pair("per_page", &CATALOG_PAGE_SIZE.to_string())
                .append_pair("page", &page.to_string());
            let read = self.transport.exchange(Operation::Catalog, Request::get(url), read_catalog_page).await?;
            for model in read.models {
                catalog.models.entry(model.name.clone()).or_insert(model);
            }
            let last = read.n_items < CATALOG_PAGE_SIZE || read.total_pages.is_some_and(|total| page >= total);
            if last {
                return Ok(catalog);
            }
        }
        tracing::warn!(
            pages = MAX_CATALOG_PAGES,
            "the model catalog has more pages than batchd reads; the rest is ignored"
        );
        Ok(catalog)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_items_are_read_leniently() {
        let body = serde_json::json!({
            "success": true, "errors": [], "messages": [],
            "result_info": {"page": 1, "per_page": 100, "count": 5, "total_count": 5, "total_pages": "1"},
            "result": [
                {"id": "f9f2", "source": 1, "name": "@cf/openai/gpt-oss-120b",
                 "task": {"id": "c329", "name": "Text Generation", "description": "..."},
                 "properties": [{"property_id": "async_queue", "value": "true"},
                                {"property_id": "price", "value": [{"unit": "per M input tokens", "price": 0.35}]}]},
                {"name": "@cf/baai/bge-m3", "task": "Text Embeddings",
                 "properties": [{"property_id": "async_queue", "value": true}]},
                {"name": "@cf/moonshotai/kimi-k2.6", "task": {"name": "Text Generation"},
                 "properties": [{"property_id": "require_workers_paid", "value": "true"}]},
                {"name": "@cf/black-forest-labs/flux-1-schnell", "task": {"name": "Text-to-Image"}},
                {"id": "no name"},
                "not an object"
            ]
        });
        let page = read_catalog_page(200, body.to_string().as_bytes()).expect("readable");
        assert_eq!((page.n_items, page.total_pages), (6, Some(1)));
        let names: Vec<&str> = page.models.iter().map(|model| model.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "@cf/openai/gpt-oss-120b",
                "@cf/baai/bge-m3",
                "@cf/moonshotai/kimi-k2.6",
                "@cf/black-forest-labs/flux-1-schnell"
            ]
        );
        let [gpt, bge, kimi, flux] = [&page.models[0], &page.models[1], &page.models[2], &page.models[3]];
        assert!(gpt.batchable && bge.batchable && !kimi.batchable && !flux.batchable);
        assert!(kimi.paid_only && !gpt.paid_only);
        assert_eq!(gpt.task_type(), Some(TaskType::TextGeneration));
        assert_eq!(bge.task_type(), Some(TaskType::Embeddings));
        assert_eq!(flux.task_type(), None, "no bucket for image generation: the fallback task applies");
    }

    #[test]
    fn task_names_map_to_buckets() {
        assert_eq!(task_type_of("Automatic Speech Recognition"), Some(TaskType::SpeechRecognition));
        assert_eq!(task_type_of("translation"), Some(TaskType::Translation));
        assert_eq!(task_type_of("text-embeddings"), Some(TaskType::Embeddings));
        assert_eq!(task_type_of("Text Classification"), None);
        assert_eq!(task_type_of(""), None);
    }

    #[test]
    fn refusals_and_the_cache_round_trip() {
        let mut catalog = ModelCatalog { fetched_at_ms: 7, ..ModelCatalog::default() };
        for (name, batchable) in [("@cf/a", true), ("@cf/b", false)] {
            let model = CatalogModel { name: name.into(), task: "Text Generation".into(), batchable, paid_only: false };
            catalog.models.insert(name.into(), model);
        }
        assert!(!catalog.refuses("@cf/a") && catalog.refuses("@cf/b"));
        assert!(!catalog.refuses("@cf/unlisted"), "an unlisted model is left to the API");
        assert_eq!(catalog.batchable().count(), 1);
        assert_eq!(ModelCatalog::from_json(&catalog.to_json()), Some(catalog));
        assert_eq!(ModelCatalog::from_json("[1]"), None);
    }

    #[test]
    fn refusing_and_unreadable_pages_are_errors() {
        let refused = br#"{"success":false,"errors":[{"code":10000,"message":"Authentication error"}],"result":null}"#;
        assert_eq!(
            read_catalog_page(200, refused).expect_err("refused").api_code,
            Some(batchd_core::ApiCode::Number(10000))
        );
        assert!(read_catalog_page(200, b"<html>").is_err());
        assert!(read_catalog_page(200, br#"{"success":true,"result":{}}"#).is_err());
    }
}
