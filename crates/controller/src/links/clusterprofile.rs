//! Reading a `ClusterProfile` (KEP-4322, the cluster inventory API) as a link source: a
//! checked [`LinkSpec`], or the one reason it cannot be used.
//!
//! A ClusterProfile names one cluster (`metadata.name`, which must be a valid cluster
//! name, as a Link's `targetClusterName`) and lists how it can be reached
//! (`status.accessProviders`, or the deprecated `status.credentialProviders`). Of those
//! we use upstream's `kubeconfig-secretreader` convention
//! (kubernetes-sigs/cluster-inventory-api, plugins/kubeconfig-secretreader): the
//! provider's `cluster.extensions` entry `client.authentication.k8s.io/exec` names a
//! Secret (`name`, `key`, optional `namespace` and `context`) holding a kubeconfig.
//! Upstream a controller runs that plugin as an exec credential plugin; we run no
//! command (a link never does): we read the Secret ourselves, and check it exactly as
//! a Link's `clusterCredentialsSecret` (same namespace, type
//! `mirror.linkerd.io/remote-kubeconfig`, key `kubeconfig`, the same kubeconfig checks
//! and refusals). The provider's `cluster.server` must be the kubeconfig's: the
//! profile says where the cluster is, and a Secret that points elsewhere is refused
//! rather than followed.
//!
//! What a Link says beyond credentials, a ClusterProfile says in annotations of the
//! same names' meaning (`service-mirror.io/gateway-address`, ...; see the constants),
//! parsed by the very parsers of [`super::link`]. Its mirrors are a Link's (Linkerd's
//! shape, selectors defaulting to `link --format link`'s).

use super::link::{gateway, is_the_secret, probe};
use super::resource::LinkProbeSpec;
use super::sanitize::sanitize_remote_text;
use super::secret::{
    ALLOW_INSECURE_ANNOTATION, Allowances, LinkError, LinkSource, LinkSpec, ResourceLink,
    checked_kubeconfig_text, parse_kubeconfig,
};
use k8s_openapi::api::core::v1::Secret;
use service_mirror_api::clusterprofile::{AccessProvider, ClusterProfile};
use service_mirror_core::labels::{LINK_KUBECONFIG_KEY, LINK_SECRET_TYPE};
use service_mirror_core::naming::is_dns1123_subdomain;
use service_mirror_core::{
    ExportRule, GatewayRef, Link, MirrorStyle, ResourceStyle, Selector, validate_cluster_name,
};

/// The access provider we use: upstream's kubeconfig Secret reader.
pub const ACCESS_PROVIDER: &str = "kubeconfig-secretreader";
/// The extension of the provider's `cluster` that holds the provider's configuration
/// (client-go's reserved exec extension key).
pub const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";
/// Our condition type in a ClusterProfile's `status.conditions` (server-side applied,
/// the only one we write).
pub const LINKED_CONDITION: &str = "service-mirror.io/Linked";

/// `targetClusterDomain`.
pub const CLUSTER_DOMAIN_ANNOTATION: &str = "service-mirror.io/remote-cluster-domain";
/// `gatewayAddress`.
pub const GATEWAY_ADDRESS_ANNOTATION: &str = "service-mirror.io/gateway-address";
/// `gatewayPort`.
pub const GATEWAY_PORT_ANNOTATION: &str = "service-mirror.io/gateway-port";
/// `gatewayIdentity`.
pub const GATEWAY_IDENTITY_ANNOTATION: &str = "service-mirror.io/gateway-identity";
/// `probeSpec.port`.
pub const PROBE_PORT_ANNOTATION: &str = "service-mirror.io/probe-port";
/// `probeSpec.path`.
pub const PROBE_PATH_ANNOTATION: &str = "service-mirror.io/probe-path";
/// `probeSpec.period`.
pub const PROBE_PERIOD_ANNOTATION: &str = "service-mirror.io/probe-period";
/// `probeSpec.timeout`.
pub const PROBE_TIMEOUT_ANNOTATION: &str = "service-mirror.io/probe-timeout";
/// `probeSpec.failureThreshold`.
pub const PROBE_FAILURE_THRESHOLD_ANNOTATION: &str = "service-mirror.io/probe-failure-threshold";
/// `selector`, as `key=value[,key=value]` (default `mirror.linkerd.io/exported=true`).
pub const SELECTOR_ANNOTATION: &str = "service-mirror.io/selector";
/// `remoteDiscoverySelector` (default `mirror.linkerd.io/exported=remote-discovery`).
pub const REMOTE_DISCOVERY_SELECTOR_ANNOTATION: &str =
    "service-mirror.io/remote-discovery-selector";
/// `federatedServiceSelector` (default `mirror.linkerd.io/federated=member`).
pub const FEDERATED_SERVICE_SELECTOR_ANNOTATION: &str =
    "service-mirror.io/federated-service-selector";

/// How many provider names an `UnsupportedAccessProvider` message lists.
const NAMES_SHOWN: usize = 5;

/// The name of the kubeconfig Secret the profile's `kubeconfig-secretreader` provider
/// names (for the store lookup and for "which profiles use this Secret"); `None`
/// when there is no such provider or it names none.
pub fn credentials_secret_name(cp: &ClusterProfile) -> Option<String> {
    let provider = usable_provider(cp)?;
    let config = exec_config(provider)?;
    config
        .get("name")?
        .as_str()
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}

fn usable_provider(cp: &ClusterProfile) -> Option<&AccessProvider> {
    cp.access_providers()
        .into_iter()
        .find(|p| p.name == ACCESS_PROVIDER)
}

fn exec_config(provider: &AccessProvider) -> Option<&serde_json::Map<String, serde_json::Value>> {
    provider
        .cluster
        .as_ref()?
        .extensions
        .iter()
        .find(|e| e.name == EXEC_EXTENSION)?
        .extension
        .as_object()
}

/// Reads a ClusterProfile and the Secret its access provider names (`None`: no such
/// Secret in the profile's namespace): the only way to make a [`LinkSpec`] from a
/// ClusterProfile. The result is a Link's ([`LinkSource::Resource`],
/// [`MirrorStyle::Resource`]): its mirrors, status entries aside, are those a Link
/// with the same settings makes.
pub fn parse_cluster_profile(
    cp: &ClusterProfile,
    credentials: Option<&Secret>,
) -> Result<LinkSpec, LinkError> {
    let namespace = cp.metadata.namespace.clone().unwrap_or_default();
    let name = cp.metadata.name.clone().unwrap_or_default();
    let annotations = cp.metadata.annotations.clone().unwrap_or_default();
    let annotation = |key: &str| annotations.get(key).filter(|v| !v.is_empty()).cloned();

    validate_cluster_name(&name)
        .map_err(|e| LinkError::InvalidClusterName(sanitize_remote_text(&name), e.to_string()))?;
    let domain = annotation(CLUSTER_DOMAIN_ANNOTATION);
    if let Some(d) = domain.as_deref().filter(|d| !is_dns1123_subdomain(d)) {
        return Err(LinkError::InvalidClusterDomain(sanitize_remote_text(d)));
    }

    let provider = usable_provider(cp).ok_or_else(|| {
        let names: Vec<String> = cp
            .access_providers()
            .iter()
            .map(|p| format!("{:?}", sanitize_remote_text(&p.name)))
            .collect();
        LinkError::UnsupportedAccessProvider(match names.len() {
            0 => "none".into(),
            n if n > NAMES_SHOWN => format!(
                "{} and {} more",
                names[..NAMES_SHOWN].join(", "),
                n - NAMES_SHOWN
            ),
            _ => names.join(", "),
        })
    })?;
    let invalid = |why: String| LinkError::InvalidAccessProvider(why);
    let config = exec_config(provider).ok_or_else(|| {
        invalid(format!(
            "no {EXEC_EXTENSION} extension (an object) in its cluster naming the kubeconfig Secret"
        ))
    })?;
    let field = |key: &str| -> Result<Option<&str>, LinkError> {
        match config.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) if s.is_empty() => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(invalid(format!("{EXEC_EXTENSION}.{key} is not a string"))),
        }
    };
    let secret_name = field("name")?.ok_or_else(|| {
        invalid(format!(
            "{EXEC_EXTENSION} has no name (the kubeconfig Secret's)"
        ))
    })?;
    if let Some(ns) = field("namespace")?.filter(|ns| *ns != namespace) {
        return Err(invalid(format!(
            "the kubeconfig Secret's namespace {:?} is not the controller's ({namespace:?}): only a Secret beside the ClusterProfile is read",
            sanitize_remote_text(ns)
        )));
    }
    if let Some(key) = field("key")?.filter(|k| *k != LINK_KUBECONFIG_KEY) {
        return Err(invalid(format!(
            "key {:?}: the kubeconfig must be under {LINK_KUBECONFIG_KEY:?}, as in every link Secret",
            sanitize_remote_text(key)
        )));
    }
    let context = field("context")?;

    let allow = match annotations.get(ALLOW_INSECURE_ANNOTATION) {
        Some(v) => Allowances::parse(v)?,
        None => Allowances::default(),
    };
    let secret = credentials
        .filter(|s| is_the_secret(s, secret_name, &namespace))
        .ok_or_else(|| LinkError::MissingCredentials(sanitize_remote_text(secret_name)))?;
    let type_ = secret.type_.as_deref().unwrap_or_default();
    if type_ != LINK_SECRET_TYPE {
        return Err(LinkError::InvalidCredentialsType {
            secret: sanitize_remote_text(secret_name),
            type_: sanitize_remote_text(type_),
        });
    }
    let kubeconfig = checked_kubeconfig_text(secret, allow)?;
    // Checked: the current context names a defined cluster.
    let kc = parse_kubeconfig(&kubeconfig)?;
    let current = kc.current_context.clone().unwrap_or_default();
    if let Some(c) = context.filter(|c| *c != current) {
        return Err(invalid(format!(
            "context {:?} is not the kubeconfig's current-context {:?} (the one a link uses)",
            sanitize_remote_text(c),
            sanitize_remote_text(&current)
        )));
    }
    let server = kc
        .contexts
        .iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context.as_ref())
        .and_then(|ctx| kc.clusters.iter().find(|c| c.name == ctx.cluster))
        .and_then(|c| c.cluster.as_ref()?.server.clone())
        .unwrap_or_default();
    let profile_server = provider
        .cluster
        .as_ref()
        .and_then(|c| c.server.clone())
        .unwrap_or_default();
    let trim = |s: &str| s.trim_end_matches('/').to_ascii_lowercase();
    if trim(&profile_server) != trim(&server) {
        return Err(invalid(format!(
            "its cluster.server {:?} is not the kubeconfig's server {:?}: the Secret must reach the cluster the profile names",
            sanitize_remote_text(&profile_server),
            sanitize_remote_text(&server)
        )));
    }

    let gateway = gateway(
        annotation(GATEWAY_ADDRESS_ANNOTATION).as_deref(),
        annotation(GATEWAY_PORT_ANNOTATION).as_deref(),
        annotation(GATEWAY_IDENTITY_ANNOTATION).as_deref(),
    )?;
    let probe_spec = LinkProbeSpec {
        port: annotation(PROBE_PORT_ANNOTATION),
        path: annotation(PROBE_PATH_ANNOTATION),
        period: annotation(PROBE_PERIOD_ANNOTATION),
        timeout: annotation(PROBE_TIMEOUT_ANNOTATION),
        failure_threshold: annotation(PROBE_FAILURE_THRESHOLD_ANNOTATION),
    };
    let (probe, probe_timeout, probe_failure_threshold) = probe(&probe_spec)?;

    let selector = |which: &'static str, key: &str, default: &str| {
        let text = annotation(key).unwrap_or_else(|| default.to_string());
        let invalid = |message: String| LinkError::InvalidSelector {
            which,
            message: sanitize_remote_text(&message),
        };
        let parsed = crate::cli::link_gen::parse_selector(&text)
            .map_err(|e| invalid(format!("annotation {key}: {e}")))?;
        Selector::parse(Some(&parsed)).map_err(|e| invalid(format!("annotation {key}: {e}")))
    };
    use crate::cli::link_gen::{
        DEFAULT_FEDERATED_SERVICE_SELECTOR, DEFAULT_REMOTE_DISCOVERY_SELECTOR, DEFAULT_SELECTOR,
    };
    let export = selector("selector", SELECTOR_ANNOTATION, DEFAULT_SELECTOR)?;
    let remote_discovery = selector(
        "remoteDiscoverySelector",
        REMOTE_DISCOVERY_SELECTOR_ANNOTATION,
        DEFAULT_REMOTE_DISCOVERY_SELECTOR,
    )?;
    let federated = selector(
        "federatedServiceSelector",
        FEDERATED_SERVICE_SELECTOR_ANNOTATION,
        DEFAULT_FEDERATED_SERVICE_SELECTOR,
    )?;

    let core = Link::new(name.clone(), domain.as_deref())
        .with_style(MirrorStyle::Resource(ResourceStyle::default()));
    let source = ResourceLink {
        name: name.clone(),
        credentials_secret: secret_name.to_string(),
        export: ExportRule::Selectors {
            export,
            remote_discovery,
            gateway: GatewayRef::new(namespace, name),
        },
        gateway,
        probe,
        probe_timeout,
        probe_failure_threshold,
        federated,
    };
    Ok(LinkSpec::from_checked(
        core,
        kubeconfig,
        allow,
        LinkSource::Resource(Box::new(source)),
    ))
}

/// A refusal of a ClusterProfile as told (log, Event, metric): the profile's uid (a
/// re-created profile is a new episode), the reason and the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) uid: Option<String>,
    pub(crate) reason: String,
    pub(crate) message: String,
}

/// What to do about a ClusterProfile's refusal (see [`decide_refusal`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RefusalStep {
    /// As remembered: nothing told again.
    Nothing,
    /// No refusal (any more): forget the one remembered.
    Forget,
    /// A new refusal (or another reason or message, or on a new profile of the name):
    /// remember and tell it.
    Tell(Refusal),
}

/// The step for the refusal `now` of a ClusterProfile, given the one `last` told: a
/// refusal is told once per episode, when it starts or changes, and again only after
/// it cleared (a profile's every update, our own condition write and the cluster
/// manager's status writes included, judges it again, so the same refusal comes back
/// on each). Our condition is not part of this: it is written whenever the cached
/// profile lacks it.
pub(crate) fn decide_refusal(now: Option<Refusal>, last: Option<&Refusal>) -> RefusalStep {
    match (now, last) {
        (None, None) => RefusalStep::Nothing,
        (None, Some(_)) => RefusalStep::Forget,
        (Some(now), Some(last)) if &now == last => RefusalStep::Nothing,
        (Some(now), _) => RefusalStep::Tell(now),
    }
}

/// The annotations of a ClusterProfile that carry Link settings, for documentation
/// and tests: (annotation, the Link field it stands for).
pub const SETTINGS: &[(&str, &str)] = &[
    (CLUSTER_DOMAIN_ANNOTATION, "targetClusterDomain"),
    (GATEWAY_ADDRESS_ANNOTATION, "gatewayAddress"),
    (GATEWAY_PORT_ANNOTATION, "gatewayPort"),
    (GATEWAY_IDENTITY_ANNOTATION, "gatewayIdentity"),
    (PROBE_PORT_ANNOTATION, "probeSpec.port"),
    (PROBE_PATH_ANNOTATION, "probeSpec.path"),
    (PROBE_PERIOD_ANNOTATION, "probeSpec.period"),
    (PROBE_TIMEOUT_ANNOTATION, "probeSpec.timeout"),
    (
        PROBE_FAILURE_THRESHOLD_ANNOTATION,
        "probeSpec.failureThreshold",
    ),
    (SELECTOR_ANNOTATION, "selector"),
    (
        REMOTE_DISCOVERY_SELECTOR_ANNOTATION,
        "remoteDiscoverySelector",
    ),
    (
        FEDERATED_SERVICE_SELECTOR_ANNOTATION,
        "federatedServiceSelector",
    ),
    (ALLOW_INSECURE_ANNOTATION, "(the Link's own annotation)"),
];

/// `BTreeMap` of annotations, for tests and docs examples.
#[cfg(test)]
fn annotations(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
#[path = "clusterprofile_tests.rs"]
mod tests;
