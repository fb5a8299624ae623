//! batchd's engine as a library: the job pipeline (take an ingress entry in, submit and poll its batches, publish
//! one result), its pure decisions (`policy`), the apalis worker runtime that feeds it, the batch event puller and
//! every metric; and the Cloudflare upkeep (the model catalog, seen models, event subscriptions). The `batchd` binary, its operator CLI and its dashboard sit on top; embedding the engine pulls in
//! none of their dependencies (HTML templates, progress bars, the HTTP server).

pub mod catalog;
pub mod events;
pub mod metrics;
pub mod pipeline;
pub mod policy;
pub mod providers;
pub mod runtime;
pub mod settings;
pub mod spend;
pub mod turnaround;
