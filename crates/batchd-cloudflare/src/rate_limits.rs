//! `[rate_limits]`: the shared submit limits per task type, and the tables that give each model its task type.
//!
//! A model's bucket comes from, in order: its own entry in `models` (the large paid models are capped far below
//! their task's limit, docs/batch-api.md, "Rate limits"); the operator's `extra_task_types`; the model catalog's
//! task (`catalog.rs`, the source of truth while it can be read); the shipped `task_types` table (the fallback);
//! `unknown_model_task`.

use serde::{Deserialize, Serialize};

use crate::catalog::ModelCatalog;

/// `[rate_limits]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    /// Requests per window for text generation models.
    pub text_generation: u32,
    /// Requests per window for embedding models.
    pub embeddings: u32,
    /// Requests per window for translation models.
    pub translation: u32,
    /// Requests per window for speech recognition models.
    pub speech_recognition: u32,
    /// Window length in seconds.
    pub window_secs: u64,
    /// Requests allowed back to back.
    pub burst: u32,
    /// Whether polls are limited too.
    pub limit_polls: bool,
    /// Per-model limits.
    pub models: Vec<ModelLimit>,
    /// The task type of each known model, which picks its limit.
    pub task_types: Vec<ModelTask>,
    /// More model task types, for operators (an entry here wins over `task_types`).
    pub extra_task_types: Vec<ModelTask>,
    /// The task type of a model listed in neither table.
    pub unknown_model_task: TaskType,
    /// Whether repeated 429s for one bucket lower its rate until they stop (AIMD, `adaptive.rs`).
    pub adaptive: bool,
}

impl RateLimitSettings {
    /// The task type of `model` and where it came from: `extra_task_types`, then the catalog's task (when it
    /// lists the model with a task batchd has a bucket for), then `task_types`, else `unknown_model_task`.
    pub fn task_of(&self, model: &str, catalog: Option<&ModelCatalog>) -> (TaskType, TaskSource) {
        let find = |table: &[ModelTask]| table.iter().find(|entry| entry.model == model).map(|entry| entry.task);
        if let Some(task) = find(&self.extra_task_types) {
            return (task, TaskSource::Operator);
        }
        if let Some(task) = catalog.and_then(|catalog| catalog.get(model)).and_then(|entry| entry.task_type()) {
            return (task, TaskSource::Catalog);
        }
        match find(&self.task_types) {
            Some(task) => (task, TaskSource::Table),
            None => (self.unknown_model_task, TaskSource::Unknown),
        }
    }

    /// The own limit of `model` in `models`, if it has one.
    pub fn model_limit(&self, model: &str) -> Option<u32> {
        self.models.iter().find(|limit| limit.model == model).map(|limit| limit.limit)
    }

    /// Requests per window for a task type (0: not limited).
    pub fn limit_of(&self, task: TaskType) -> u32 {
        match task {
            TaskType::TextGeneration => self.text_generation,
            TaskType::Embeddings => self.embeddings,
            TaskType::Translation => self.translation,
            TaskType::SpeechRecognition => self.speech_recognition,
        }
    }
}

/// A model's task type, as the API's rate limits are set per account and task type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskType {
    /// Text generation (LLMs), `rate_limits.text_generation`.
    TextGeneration,
    /// Text embeddings, `rate_limits.embeddings`.
    Embeddings,
    /// Translation, `rate_limits.translation`.
    Translation,
    /// Speech recognition, `rate_limits.speech_recognition`.
    SpeechRecognition,
}

impl TaskType {
    /// The name used in configuration and in rate-limit bucket keys.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TextGeneration => "text_generation",
            Self::Embeddings => "embeddings",
            Self::Translation => "translation",
            Self::SpeechRecognition => "speech_recognition",
        }
    }
}

/// Where a model's task type came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSource {
    /// The operator's `extra_task_types`.
    Operator,
    /// The model catalog.
    Catalog,
    /// The shipped `task_types` table.
    Table,
    /// Nowhere: `unknown_model_task`.
    Unknown,
}

impl TaskSource {
    /// A stable name for output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Operator => "extra_task_types",
            Self::Catalog => "catalog",
            Self::Table => "task_types",
            Self::Unknown => "unknown_model_task",
        }
    }
}

/// One entry of the model-to-task table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelTask {
    /// The model name, e.g. `@cf/baai/bge-m3`.
    pub model: String,
    /// Its task type.
    pub task: TaskType,
}

/// One per-model limit.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelLimit {
    /// The model name.
    pub model: String,
    /// Requests per window.
    pub limit: u32,
}

/// The shared limiter bucket (`<account>:<task type or model>`) and its limit per window for `model`, or `None`
/// when submits of that model are not limited. A per-model limit has its own bucket; otherwise the model's task
/// type ([`RateLimitSettings::task_of`]: the operator's table, the catalog, the shipped table, the fallback)
/// picks the bucket.
pub fn rate_bucket(
    account: &str,
    model: &str,
    limits: &RateLimitSettings,
    catalog: Option<&ModelCatalog>,
) -> Option<(String, u32)> {
    if let Some(own) = limits.model_limit(model) {
        return (own > 0).then(|| (format!("{account}:{model}"), own));
    }
    let (task, _) = limits.task_of(model, catalog);
    let limit = limits.limit_of(task);
    (limit > 0).then(|| (format!("{account}:{}", task.as_str()), limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_map_to_rate_limit_buckets() {
        let limits = RateLimitSettings {
            text_generation: 300,
            embeddings: 3000,
            translation: 0,
            speech_recognition: 720,
            window_secs: 60,
            burst: 1,
            limit_polls: false,
            models: vec![ModelLimit { model: "@cf/baai/bge-large-en-v1.5".into(), limit: 1500 }],
            task_types: vec![
                ModelTask { model: "@cf/baai/bge-m3".into(), task: TaskType::Embeddings },
                ModelTask { model: "@cf/meta/m2m100-1.2b".into(), task: TaskType::Translation },
                ModelTask { model: "@cf/acme/embedder".into(), task: TaskType::Embeddings },
            ],
            extra_task_types: vec![ModelTask { model: "@cf/acme/embedder".into(), task: TaskType::SpeechRecognition }],
            unknown_model_task: TaskType::TextGeneration,
            adaptive: true,
        };
        assert_eq!(rate_bucket("a", "@cf/baai/bge-m3", &limits, None), Some(("a:embeddings".into(), 3000)));
        assert_eq!(
            rate_bucket("a", "@cf/meta/llama-3.3-70b-instruct-fp8-fast", &limits, None),
            Some(("a:text_generation".into(), 300))
        );
        assert_eq!(
            rate_bucket("a", "@cf/baai/bge-large-en-v1.5", &limits, None),
            Some(("a:@cf/baai/bge-large-en-v1.5".into(), 1500))
        );
        assert_eq!(rate_bucket("a", "@cf/meta/m2m100-1.2b", &limits, None), None, "0 disables");
        assert_eq!(
            rate_bucket("a", "@cf/acme/embedder", &limits, None),
            Some(("a:speech_recognition".into(), 720)),
            "the operator's table wins"
        );
        assert_eq!(
            rate_bucket("a", "@cf/acme/bge-embed-unknown", &limits, None),
            Some(("a:text_generation".into(), 300)),
            "an unknown model takes the fallback, whatever its name suggests"
        );
        // The catalog's task wins over the shipped table, and the operator's table wins over the catalog.
        let mut catalog = ModelCatalog::default();
        for (name, task) in [
            ("@cf/moonshotai/kimi-k2.6", "Text Generation"),
            ("@cf/baai/bge-m3", "Translation"),
            ("@cf/acme/embedder", "Text Embeddings"),
            ("@cf/acme/new-embedder", "Text Embeddings"),
            ("@cf/acme/painter", "Text-to-Image"),
        ] {
            let model = crate::catalog::CatalogModel {
                name: name.into(),
                task: task.into(),
                batchable: true,
                paid_only: false,
            };
            catalog.models.insert(name.into(), model);
        }
        let catalog = Some(&catalog);
        assert_eq!(limits.task_of("@cf/acme/new-embedder", catalog), (TaskType::Embeddings, TaskSource::Catalog));
        assert_eq!(
            rate_bucket("a", "@cf/baai/bge-m3", &limits, catalog),
            None,
            "the catalog's task (translation, disabled here) wins over the table's embeddings"
        );
        assert_eq!(limits.task_of("@cf/acme/embedder", catalog), (TaskType::SpeechRecognition, TaskSource::Operator));
        assert_eq!(limits.task_of("@cf/acme/painter", catalog), (TaskType::TextGeneration, TaskSource::Unknown));
        assert_eq!(
            limits.task_of("@cf/meta/m2m100-1.2b", catalog),
            (TaskType::Translation, TaskSource::Table),
            "a model the catalog does not list keeps the table's task"
        );
        assert_eq!(
            rate_bucket("a", "@cf/baai/bge-large-en-v1.5", &limits, catalog),
            Some(("a:@cf/baai/bge-large-en-v1.5".into(), 1500)),
            "an own limit wins over everything"
        );
    }
}
