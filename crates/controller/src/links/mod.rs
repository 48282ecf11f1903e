//! Links: one link controller per remote cluster, started, swapped and stopped from the link
//! Secrets in the controller's namespace.

mod cleanup;
mod collector;
mod connect;
mod manager;
pub(crate) mod metrics;
mod secret;

pub use connect::connect;
pub use manager::{LinkManager, LinkManagerOptions};
pub use secret::{LinkError, LinkSpec, check_kubeconfig, parse_link_secret};
