//! `[rate_limits]`: the shared submit limits per task type, and the tables that give each model its task type.

use serde::{Deserialize, Serialize};

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
}

impl RateLimitSettings {
    /// The task type of `model`: from `extra_task_types`, then `task_types`, else `unknown_model_task`.
    pub fn task_of(&self, model: &str) -> TaskType {
        self.extra_task_types
            .iter()
            .chain(&self.task_types)
            .find(|entry| entry.model == model)
            .map_or(self.unknown_model_task, |entry| entry.task)
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
/// type (from the configured table, with its fallback for unknown models) picks the bucket.
pub fn rate_bucket(account: &str, model: &str, limits: &RateLimitSettings) -> Option<(String, u32)> {
    if let Some(own) = limits.models.iter().find(|limit| limit.model == model) {
        return (own.limit > 0).then(|| (format!("{account}:{model}"), own.limit));
    }
    let task = limits.task_of(model);
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
        };
        assert_eq!(rate_bucket("a", "@cf/baai/bge-m3", &limits), Some(("a:embeddings".into(), 3000)));
        assert_eq!(
            rate_bucket("a", "@cf/meta/llama-3.3-70b-instruct-fp8-fast", &limits),
            Some(("a:text_generation".into(), 300))
        );
        assert_eq!(
            rate_bucket("a", "@cf/baai/bge-large-en-v1.5", &limits),
            Some(("a:@cf/baai/bge-large-en-v1.5".into(), 1500))
        );
        assert_eq!(rate_bucket("a", "@cf/meta/m2m100-1.2b", &limits), None, "0 disables");
        assert_eq!(
            rate_bucket("a", "@cf/acme/embedder", &limits),
            Some(("a:speech_recognition".into(), 720)),
            "the operator's table wins"
        );
        assert_eq!(
            rate_bucket("a", "@cf/acme/bge-embed-unknown", &limits),
            Some(("a:text_generation".into(), 300)),
            "an unknown model takes the fallback, whatever its name suggests"
        );
    }
}
