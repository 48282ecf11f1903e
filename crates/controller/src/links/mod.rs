//! Links: one link controller per remote cluster, started, swapped and stopped from the link
//! Secrets and Linkerd `Link` resources in the controller's namespace.

mod choice;
mod cleanup;
pub mod clusterprofile;
mod collector;
mod connect;
mod duration;
mod link;
mod manager;
pub(crate) mod metrics;
mod resource;
mod sanitize;
mod secret;

pub use clusterprofile::{
    ACCESS_PROVIDER, EXEC_EXTENSION, LINKED_CONDITION, SETTINGS as CLUSTER_PROFILE_SETTINGS,
    credentials_secret_name as cluster_profile_credentials, parse_cluster_profile,
};
pub use connect::connect;
pub(crate) use duration::parse_go_duration;
pub use link::{
    DEFAULT_LINK_PROBE_FAILURE_THRESHOLD, DEFAULT_LINK_PROBE_PERIOD, DEFAULT_LINK_PROBE_TIMEOUT,
    MAX_LINK_PROBE_DURATION, MAX_LINK_PROBE_FAILURE_THRESHOLD, MIN_LINK_PROBE_DURATION, parse_link,
};
pub use manager::{
    CLUSTER_PROFILE_DELETION_GRACE, LinkManager, LinkManagerOptions, LinkSources, link_config,
};
pub use service_mirror_api::clusterprofile::{
    CLUSTER_PROFILE_CRD_NAME, CLUSTER_PROFILE_CRD_YAML, ClusterProfile,
};
// `LinkResource`: the name `Link` is the core's link (name, domain, style).
pub use resource::{
    LINK_CRD_NAME, LINK_CRD_YAML, LINK_GROUP, LINK_KIND, LINK_PLURAL, LINK_VERSION,
    Link as LinkResource, LinkCondition, LinkObjectRef, LinkProbeSpec, LinkResourceSpec,
    LinkResourceStatus, LinkServiceStatus,
};
pub use sanitize::{REDACTED, REMOTE_TEXT_MAX_CHARS, sanitize_remote_text};
pub use secret::{
    ALLOW_INSECURE_ANNOTATION, Allowances, Insecure, LinkError, LinkSource, LinkSpec,
    MAX_KUBECONFIG_BYTES, ResourceLink, check_kubeconfig, parse_link_secret,
};
