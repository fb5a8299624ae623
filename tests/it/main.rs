//! Integration tests: the real daemon against a private redis-server and the Batch API emulator over HTTP.
//!
//! One binary, one module per area. Every test gets its own namespace and (usually) its own Redis.

mod acl;
mod admin_limits;
mod anthropic;
mod api_variants;
mod architecture;
mod backlog;
mod bad_input;
mod big;
mod chaos;
mod cli;
mod cli_docs;
mod cli_errors;
mod cli_escaping;
mod cli_json;
mod cli_operator;
mod cli_ops;
mod cli_terminal;
mod clock;
mod config_check;
mod dead_letters;
mod deploy;
mod edges;
mod events;
mod examples;
mod failed_jobs;
mod failures;
mod flow;
mod hostile;
mod journald;
mod liveness;
mod memory;
mod openai;
mod ops;
mod producer;
mod provider_seam;
mod recovery;
mod schema;
mod scripts;
mod secrets;
mod store;
mod topologies;
mod transitions;
mod ui_access;
mod ui_browser;
