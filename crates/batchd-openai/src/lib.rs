//! OpenAI's Batch API behind batchd's provider seam ([`OpenAiProvider`]).
//!
//! A chunk becomes one JSONL input file (`custom_id` = the item's position in the chunk, `url` = the job's
//! endpoint, `body` = the item with `"model"` filled in), uploaded with `POST /v1/files`, recorded through the
//! engine's checkpoint, then created as a batch tagged with batchd's job, chunk and attempt in its `metadata`. A
//! resumed submit reuses the recorded file and looks the batch up by that metadata before creating another, so an
//! uncertain create is never billed twice. Results are the batch's output and error files, streamed, bounded and
//! joined on `custom_id` back into request order (`jsonl`). The API's JSON stays private (`wire`); written from
//! the reference (`openai-and-anthropic-batch.md`, Part B1), not from the emulator.
//!
//! The same provider serves the vendors that copy OpenAI's Files and Batch endpoints (Groq, Azure OpenAI) as named
//! instances: what they vary is a setting (the key's header, the completion window, the file purpose, the
//! endpoints, the creation limits), and statuses are read case-insensitively.

mod client;
mod error;
mod jsonl;
mod pacing;
mod provider;
mod registration;
mod settings;
mod wire;

pub use jsonl::{DEFAULT_ENDPOINTS, MAX_ENDPOINT_LEN, line_shape};
pub use provider::OpenAiProvider;
pub use registration::{CAPABILITIES, REGISTRATION};
pub use settings::{
    ApiKey, DEFAULT_BASE_URL, DEFAULT_COMPLETION_WINDOW, DEFAULT_ENDPOINT, DEFAULT_FILE_EXPIRY_SECS,
    DEFAULT_FILE_PURPOSE, FILE_EXPIRY_SECS, KeyHeader, OpenAiBuildError, OpenAiClientSettings, completion_window,
};
