//! service-mirror: mirrors exported Services of linked remote clusters into the local
//! cluster, as Linkerd's service mirror does, with the same labels and annotations.
//!
//! - [`core`]: pure domain logic (desired mirrors, naming, ownership, plans).
//! - [`watcher`]: one remote cluster: caches, indexes, work queue, reconcile.
//! - [`writer`]: the only code that writes to the local cluster.

pub mod admin;
pub mod cli;
pub mod core;
pub mod demo;
pub mod error;
pub mod invariants;
pub mod leader;
pub mod links;
pub mod metrics;
pub mod permissions;
pub mod telemetry;
pub mod watcher;
pub mod writer;

pub use error::{Error, Result};
