//! The `batchd` daemon and operator CLI as a library, so tests run the real daemon in-process
//! (`daemon::run(settings, token, shutdown)`) and `main.rs` stays glue.

pub mod admin;
pub mod cli;
pub mod daemon;
pub mod logging;
pub mod registry;
pub mod settings;
pub mod ui;

pub use daemon::run;
pub use settings::Settings;
