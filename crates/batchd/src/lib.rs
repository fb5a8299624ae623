//! The `batchd` daemon and operator CLI as a library, so tests run the real daemon in-process
//! (`daemon::run(settings, token, shutdown)`) and `main.rs` stays glue.

pub mod admin;
pub mod cli;
pub mod daemon;
pub mod events;
pub mod logging;
pub mod metrics;
pub mod pipeline;
pub mod policy;
pub mod runtime;
pub mod settings;
pub mod ui;

pub use daemon::run;
pub use settings::Settings;
