//! Links: one link controller per remote cluster, started, swapped and stopped from the link
//! Secrets in the controller's namespace.

mod cleanup;
mod collector;
mod connect;
mod manager;
pub(crate) mod metrics;
mod sanitize;
mod secret;

pub use connect::connect;
pub use manager::{LinkManager, LinkManagerOptions, LinkSources};
pub use sanitize::{REDACTED, REMOTE_TEXT_MAX_CHARS, sanitize_remote_text};
pub use secret::{
    ALLOW_INSECURE_ANNOTATION, Allowances, Insecure, LinkError, LinkSource, LinkSpec,
    MAX_KUBECONFIG_BYTES, ResourceLink, check_kubeconfig, parse_link_secret,
};
