//! Settings of an emulator instance and the table of models it knows.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::events::{EventFaults, EventsConfig};

/// Settings of one emulator instance.
#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    /// API token a caller must send as `Authorization: Bearer <token>`.
    pub token: String,
    /// The only account id the emulator routes; any other answers 404 with code 7003.
    pub account_id: String,
    /// How long a submitted batch reports `queued`, measured from its submit.
    pub queued_for: Duration,
    /// How long a batch reports `running` once it stops being `queued`; after that it is done.
    pub running_for: Duration,
    /// Request bodies of this many bytes or more are refused with HTTP 413, code 3006.
    pub max_body_bytes: usize,
    /// A submit with more items than this is refused with HTTP 413, code 3006; `None`: no cap (the API documents none).
    pub max_items: Option<usize>,
    /// Calls allowed per (account, model) in any window of `per`; over it, HTTP 429 code 3040. `None`: unlimited.
    pub rate_limit: Option<RateLimit>,
    /// Whether polls count against (and are refused by) [`EmulatorConfig::rate_limit`]; by default only submits do.
    pub limit_polls: bool,
    /// How long a finished batch can still be polled; after that it answers 404, code 7000. `None`: forever.
    pub retention: Option<Duration>,
    /// HTTP status of an accepted submit: 200 (documented) or 202 (seen live).
    pub submit_status: u16,
    /// Models known in addition to [`default_models`], with the family that shapes their input and output.
    pub extra_models: Vec<(String, Family)>,
    /// When set, every new batch draws its own duration from this range instead of using `queued_for` and
    /// `running_for` (see [`DurationRange`]). `None`: the fixed timing above.
    pub random_durations: Option<DurationRange>,
    /// When set, a share of the calls fails at random with a transient error (see [`RandomFaults`]). `None`:
    /// only injected faults.
    pub random_faults: Option<RandomFaults>,
    /// When set, every call that is handled (not one answered by a fault) is answered after a delay drawn from
    /// this range, like the latency of the live API. The work is done first: a submit's batch exists before its
    /// reply leaves, so a client that dies meanwhile leaves a batch it never learned about. `None`: no delay.
    pub random_latency: Option<DurationRange>,
    /// Whether a submit with any item that does not fit its model's schema is refused as a whole, as the live
    /// API does: HTTP 400, code 5006, naming the first bad item's index; no batch is created. When `false`,
    /// such an item fails alone in the completion (`success: false`, code 5004).
    pub strict_items: bool,
    /// How a strict-mode refusal is worded (the live API's forms vary by model schema and over time).
    pub strict_refusal: RefusalForm,
    /// Whether every batch completes in the shape Cloudflare's docs show, `{"responses":[{"id":..}]}`; by default
    /// a batch completes as live replies do in 2026, `{"results":[{"index":..}]}` (the per-batch fault
    /// `Fault::documented_shape` does the same for one batch).
    pub documented_shape: bool,
    /// Models that do not support request queuing: a submit with `?queueRequest=true` to one of them is
    /// refused with HTTP 400, code 8007, and creates no batch.
    pub unbatchable_models: Vec<String>,
    /// Workers AI batch events and the queue they are pulled from (see [`EventsConfig`]); `None`: off, and the
    /// queue endpoints answer 404.
    pub events: Option<EventsConfig>,
    /// Faults applied to events as they are published and to the order pulls hand them out in.
    pub event_faults: EventFaults,
    /// Seed of the generator behind [`EmulatorConfig::random_durations`], [`EmulatorConfig::random_faults`] and
    /// [`EmulatorConfig::random_latency`] (and, from its own generator, of [`EventFaults::drop_rate`] and
    /// [`crate::PullOrder::Random`]):
    /// the same seed gives the same sequence of draws (which call gets which draw still depends on arrival order).
    pub seed: u64,
    /// Settings of the Anthropic Message Batches emulator served under `/anthropic` (see
    /// [`crate::AnthropicConfig`]).
    pub anthropic: crate::anthropic::AnthropicConfig,
    /// The OpenAI Files and Batch API emulator served under `/openai/v1` (see [`crate::OpenAiConfig`]).
    pub openai: crate::openai::OpenAiConfig,
    /// The same module mounted again under other paths, each with its own key, dialect and state: a Groq-like
    /// ([`crate::OpenAiMount::groq`]) or Azure-like ([`crate::OpenAiMount::azure`]) API. None by default.
    pub openai_mounts: Vec<crate::openai::OpenAiMount>,
    /// The Gemini Batch Mode emulator served under `/gemini` (see [`crate::GeminiConfig`]).
    pub gemini: crate::gemini::GeminiConfig,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        Self {
            token: "emulator-token".to_owned(),
            account_id: "emulator-account".to_owned(),
            queued_for: Duration::from_millis(200),
            running_for: Duration::from_millis(300),
            max_body_bytes: 10_000_000,
            max_items: None,
            rate_limit: None,
            limit_polls: false,
            retention: None,
            submit_status: 200,
            extra_models: Vec::new(),
            random_durations: None,
            random_faults: None,
            random_latency: None,
            strict_items: false,
            strict_refusal: RefusalForm::default(),
            documented_shape: false,
            unbatchable_models: Vec::new(),
            events: None,
            event_faults: EventFaults::default(),
            seed: 0,
            anthropic: crate::anthropic::AnthropicConfig::default(),
            openai: crate::openai::OpenAiConfig::default(),
            openai_mounts: Vec::new(),
            gemini: crate::gemini::GeminiConfig::default(),
        }
    }
}

/// The wording of a strict-mode refusal of a whole submit: `oneOf` or `anyOf` (newer model schemas), with or
/// without an envelope code, with or without the `/requests/N` pointer to the first bad item. The default is the
/// form seen live first: `AiError: Bad input: Error: oneOf at '/requests/N' not met`, code 5006.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RefusalForm {
    /// `oneOf` or `anyOf`.
    pub keyword: SchemaKeyword,
    /// The envelope's `code`; `None`: the error has no code.
    pub code: Option<i64>,
    /// Whether the message points at the bad item (`'/requests/N'`) or at the root (`'/'`).
    pub pointer: bool,
}

impl Default for RefusalForm {
    fn default() -> Self {
        Self { keyword: SchemaKeyword::OneOf, code: Some(5006), pointer: true }
    }
}

/// The JSON Schema keyword a refusal names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchemaKeyword {
    /// `oneOf`.
    #[default]
    OneOf,
    /// `anyOf`.
    AnyOf,
}

/// Per-batch random durations: each accepted batch draws its total time to completion uniformly from
/// `[min, max]` (the first quarter of it `queued`, the rest `running`), so batches of one run finish out of
/// order, as they do on the live API. A batch keeps the duration it drew; changing the timing later does not
/// move it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DurationRange {
    /// Shortest time from submit to done.
    #[serde(rename = "min_ms", with = "millis")]
    pub min: Duration,
    /// Longest time from submit to done.
    #[serde(rename = "max_ms", with = "millis")]
    pub max: Duration,
}

impl DurationRange {
    /// Durations drawn uniformly from `[min, max]` (the bounds are swapped if given in the wrong order).
    pub fn new(min: Duration, max: Duration) -> Self {
        Self { min: min.min(max), max: max.max(min) }
    }
}

/// Random transient faults: each matching API call fails with probability `rate`, with one of HTTP 500
/// (JSON envelope), 502 (an HTML gateway page), 503 (JSON envelope) or a connection reset, picked uniformly.
/// Like injected call-level faults they hit before the call is handled, so a faulted submit creates no batch.
/// Injected faults go first; the rate limit and validation come after.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RandomFaults {
    /// Probability in `[0, 1]` that one matching call fails.
    pub rate: f64,
    /// Which calls can fail.
    #[serde(default)]
    pub calls: crate::fault::Calls,
}

impl RandomFaults {
    /// Every kind of call fails with probability `rate` (clamped to `[0, 1]`).
    pub fn new(rate: f64) -> Self {
        Self { rate: if rate.is_nan() { 0.0 } else { rate.clamp(0.0, 1.0) }, calls: crate::fault::Calls::Any }
    }

    /// Restricts the faults to submits or polls.
    pub fn on(mut self, calls: crate::fault::Calls) -> Self {
        self.calls = calls;
        self
    }
}

/// Serde for a [`Duration`] as whole milliseconds.
pub(crate) mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}

/// A rate limit: without a burst, at most `requests` calls in any window of length `per` (a sliding window over a
/// log of accepted calls); with one, a token bucket holding at most `burst` calls and refilled at `requests` per
/// `per` (see [`crate::limits`]). JSON: `{"requests":N,"per_ms":M}`, plus `"burst":B` for a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Calls allowed in one window (or refilled per `per`, with a burst).
    pub requests: u32,
    /// Length of the window.
    #[serde(rename = "per_ms", with = "millis")]
    pub per: Duration,
    /// Calls a full bucket lets through at once; `None`: a sliding window instead of a bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

impl RateLimit {
    /// At most `requests` calls in any window of length `per`.
    pub fn new(requests: u32, per: Duration) -> Self {
        Self { requests, per, burst: None }
    }

    /// At most `requests` calls in any minute, the unit Cloudflare documents its limits in.
    pub fn per_minute(requests: u32) -> Self {
        Self::new(requests, Duration::from_secs(60))
    }

    /// The same rate as a token bucket of `burst` calls.
    pub fn burst(self, burst: u32) -> Self {
        Self { burst: Some(burst), ..self }
    }

    /// OpenAI's documented creation limit, "up to 2,000 batches per hour", as a bucket of one: one create every
    /// 1.8 s (the benchmark of issue 33 runs it so).
    pub fn openai_batch_creates() -> Self {
        Self::new(2000, Duration::from_secs(3600)).burst(1)
    }

    /// Anthropic's requests per minute, Tier 1's 50 (the tier numbers are UNCONFIRMED in the reference), as the
    /// token bucket Anthropic describes: it holds a minute's worth and is "continuously replenished".
    pub fn anthropic_requests() -> Self {
        Self::per_minute(50).burst(50)
    }

    /// Workers AI's documented 300 requests a minute for text generation, as Cloudflare states it (a window per
    /// account and model).
    pub fn workers_ai_submits() -> Self {
        Self::per_minute(300)
    }
}

/// Which creation and request limits the three provider modules enforce (see
/// [`EmulatorConfig::with_provider_limits`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderLimits {
    /// None: every call passes (what tests get unless they ask).
    #[default]
    Off,
    /// The documented ones: OpenAI 2,000 batch creates an hour (burst 1), Anthropic 50 requests a minute with
    /// every call counted (polls too), Workers AI 300 submits a minute per model with polls free.
    Documented,
}

impl ProviderLimits {
    /// The limits of Workers AI (per account and model, submits only), OpenAI (batch creates) and Anthropic (every
    /// call).
    pub fn limits(self) -> (Option<RateLimit>, Option<RateLimit>, Option<RateLimit>) {
        match self {
            Self::Off => (None, None, None),
            Self::Documented => (
                Some(RateLimit::workers_ai_submits()),
                Some(RateLimit::openai_batch_creates()),
                Some(RateLimit::anthropic_requests()),
            ),
        }
    }
}

/// The kind of model, which decides what a request item must contain and what its result looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "family")]
pub enum Family {
    /// `prompt`, `messages` or `input` in, `{"response": "..."}` out.
    TextGeneration,
    /// `text` (a string or a list of strings) in, `{"shape": [n, dim], "data": [[..]]}` out.
    Embeddings {
        /// Length of each embedding vector.
        dim: usize,
    },
    /// bge-m3: embeddings like [`Family::Embeddings`] (dim 1024), or query mode with `query` and `contexts`.
    BgeM3,
    /// `text`, `source_lang`, `target_lang` in, `{"translated_text": "..."}` out.
    Translation,
    /// `audio` in, `{"text": "..."}` out.
    Speech,
}

/// Models the emulator knows without configuration, with their families.
pub fn default_models() -> Vec<(String, Family)> {
    let text = [
        "@cf/meta/llama-3.3-70b-instruct-fp8-fast",
        "@cf/meta/llama-4-scout-17b-16e-instruct",
        "@cf/qwen/qwen3-30b-a3b-fp8",
        "@cf/openai/gpt-oss-120b",
        "@cf/openai/gpt-oss-20b",
    ];
    let mut models: Vec<(String, Family)> =
        text.iter().map(|name| ((*name).to_owned(), Family::TextGeneration)).collect();
    models.extend([
        ("@cf/baai/bge-small-en-v1.5".to_owned(), Family::Embeddings { dim: 384 }),
        ("@cf/baai/bge-base-en-v1.5".to_owned(), Family::Embeddings { dim: 768 }),
        ("@cf/baai/bge-large-en-v1.5".to_owned(), Family::Embeddings { dim: 1024 }),
        ("@cf/baai/bge-m3".to_owned(), Family::BgeM3),
        ("@cf/meta/m2m100-1.2b".to_owned(), Family::Translation),
        ("@cf/openai/whisper-large-v3-turbo".to_owned(), Family::Speech),
    ]);
    models
}

impl EmulatorConfig {
    /// These settings with the three providers' creation and request limits set to `limits` (replacing
    /// [`EmulatorConfig::rate_limit`], [`EmulatorConfig::limit_polls`], `openai.create_limit` and
    /// `anthropic.rate_limit`).
    pub fn with_provider_limits(mut self, limits: ProviderLimits) -> Self {
        let (workers_ai, openai, anthropic) = limits.limits();
        self.rate_limit = workers_ai;
        self.limit_polls = false;
        self.openai.create_limit = openai;
        self.anthropic.rate_limit = anthropic;
        self
    }

    /// These settings with every provider's remote batch taking `duration` from create to results, split over its
    /// states: Workers AI a quarter `queued`, the rest `running`; OpenAI a tenth `validating`, eight tenths
    /// `in_progress`, a tenth `finalizing`; Anthropic all of it processing; Gemini a quarter `PENDING`, the rest
    /// `RUNNING`.
    pub fn with_batch_duration(mut self, duration: Duration) -> Self {
        self.queued_for = duration / 4;
        self.running_for = duration - duration / 4;
        self.openai.timing.validating_for = duration / 10;
        self.openai.timing.finalizing_for = duration / 10;
        self.openai.timing.in_progress_for = duration - 2 * (duration / 10);
        self.anthropic.processing_for = duration;
        self.gemini.pending_for = duration / 4;
        self.gemini.running_for = duration - duration / 4;
        self
    }

    /// The family of `model`, looking at the extra models first, or `None` for an unknown model.
    pub fn family_of(&self, model: &str) -> Option<Family> {
        self.extra_models
            .iter()
            .find(|(name, _)| name == model)
            .map(|(_, family)| *family)
            .or_else(|| default_models().into_iter().find(|(name, _)| name == model).map(|(_, family)| family))
    }
}
