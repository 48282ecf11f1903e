//! The service mirror controller: mirrors exported Services of linked remote clusters
//! into the local cluster, as Linkerd's service mirror does, with the same labels and
//! annotations.
//!
//! The flow, one folder each: [`links`] (which clusters are linked) → [`link_controller`]
//! (one per link: caches, event mapping, work queue, reconcile; its gateways in
//! [`gateway`]) → the pure core
//! (`service_mirror_core`: desired mirrors, naming, ownership, plans) → [`writer`] (the
//! only code that writes to the local cluster).
//!
//! Every component runs on one runtime (`runtime/`: watch driver, work queue, write
//! gate, workers, relist table, feed generations, once-per-episode reports).

#![forbid(unsafe_code)]

pub mod admin;
pub mod backoff;
pub mod cli;
pub(crate) mod clusterset_dns;
pub mod error;
pub mod events;
pub mod federation;
pub mod frame_limit;
pub mod gateway;
pub mod kube_client;
pub mod leader;
pub mod link_controller;
pub mod links;
pub mod local_networks;
pub mod logging;
pub mod mcs;
pub mod metrics;
pub mod permissions;
pub(crate) mod runtime;
pub mod write_lease_report;
pub mod write_leases;
pub mod writer;

pub use error::{Error, Result};
