//! HTTP-level tests of the Batch API client against tiny fake servers written here, on 127.0.0.1:0.
//!
//! Each test serves exactly the reply it is about (status, headers, body, or a dropped connection), so the client's
//! handling of HTTP is checked independently of the emulator crate.

mod fake;
mod poll;
mod secrets;
mod submit;
