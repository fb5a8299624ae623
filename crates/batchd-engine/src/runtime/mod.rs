//! The daemon's worker runtime, next to the pipeline it feeds: the apalis backend both workers read from
//! ([`fetch`]), the two fetchers that fill it from Redis through the storage crate ([`ingress`]: the submit
//! stream's consumer group; [`schedule`]: due schedule members), the process's byte budget for work in flight
//! ([`ByteBudget`]), and the fetch loops' heartbeats ([`heartbeat`]).

pub mod fetch;
pub mod heartbeat;
pub mod ingress;
pub mod schedule;

pub use fetch::{BudgetHold, ByteBudget, FetchBackend};
pub use ingress::{DeliveryLimit, EntryBudget, IngressEntry, IngressSettings};
pub use schedule::ScheduleSettings;
