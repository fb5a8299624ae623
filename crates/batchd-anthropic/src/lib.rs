//! Anthropic Message Batches behind batchd's provider seam (`batchd_provider::Provider`), for models named
//! `anthropic/<model>`.
//!
//! Written from the reference (`openai-and-anthropic-batch.md`, Part B2), not from the emulator. The API's JSON
//! stays private (`wire`, `results`); callers see [`AnthropicProvider`] and its [`AnthropicSettings`]. The key
//! never leaves [`ApiKey`] except in the `x-api-key` header. docs/providers.md, "Anthropic Message Batches",
//! says what maps to what.

mod client;
mod lookup;
mod provider;
mod registration;
mod results;
mod settings;
mod wire;

pub use provider::{AnthropicProvider, NAME};
pub use registration::{CAPABILITIES, REGISTRATION};
pub use settings::{
    AnthropicSettings, ApiKey, BuildError, DEFAULT_BASE_URL, DEFAULT_VERSION, MAX_BODY_BYTES, MAX_REQUESTS,
};
pub use wire::BODY_SHAPE;
