//! Google Gemini Batch Mode (the Gemini Developer API's `v1beta` batches) behind batchd's provider seam
//! (`batchd_provider::Provider`), for models named `gemini/<model>`.
//!
//! Written from Google's documentation as the reference summarises it (`gemini-and-openai-compatible-batch.md`),
//! not from the emulator. A chunk is one `models/{model}:batchGenerateContent` create: its requests inline when the
//! create body stays under the inline limit, else a JSONL file uploaded through the Files API; results are joined
//! on each request's key, never by position. The API's JSON stays private (`wire`); callers see
//! [`GeminiProvider`] and its [`GeminiSettings`]. The key never leaves [`ApiKey`] except in the `x-goog-api-key`
//! header. docs/providers.md, "Gemini Batch Mode", says what maps to what and what is unconfirmed.

mod client;
mod provider;
mod registration;
mod settings;
mod wire;

pub use provider::{GeminiProvider, NAME};
pub use registration::{CAPABILITIES, REGISTRATION};
pub use settings::{ApiKey, BuildError, DEFAULT_BASE_URL, GeminiSettings, MAX_FILE_BYTES, MAX_INLINE_BYTES};
