//! Reading a Linkerd `Link` resource and its credentials Secret: a checked
//! [`LinkSpec`], or the one reason it cannot be used.
//!
//! A Link is user input and its credentials reach a remote: every field is checked
//! here, once, so the link manager and the link controller only ever see valid values.
//! Every refusal waits for the Link (or its Secret) to change: none is retryable.
//!
//! Transport weakenings (`mirror.linkerd.io/allow-insecure`, see [`Allowances`]) are
//! read from the **Link's** annotations, not the credentials Secret's: the Link is the
//! object an operator writes and reviews, and `link-gen` Secrets carry no such
//! annotation.

use super::duration::parse_go_duration;
use super::resource::{Link as LinkResource, LinkProbeSpec};
use super::sanitize::sanitize_remote_text;
use super::secret::{
    ALLOW_INSECURE_ANNOTATION, Allowances, LinkError, LinkSource, LinkSpec, ResourceLink,
    checked_kubeconfig_text,
};
use k8s_openapi::api::core::v1::Secret;
use service_mirror_core::gateway::valid_identity;
use service_mirror_core::labels::LINK_SECRET_TYPE;
use service_mirror_core::naming::is_dns1123_subdomain;
use service_mirror_core::probe::DEFAULT_PROBE_PATH;
use service_mirror_core::{
    Exclusions, ExportRule, GatewayRef, GatewaySpec, Link, MirrorStyle, ProbeSpec, ResourceStyle,
    Selector, endpoint_ip_allowed, validate_cluster_name,
};
use std::net::IpAddr;
use std::time::Duration;

/// `probeSpec.period` when unset (Linkerd's gateway annotation default).
pub const DEFAULT_LINK_PROBE_PERIOD: Duration = Duration::from_secs(3);
/// `probeSpec.timeout` when unset (Linkerd's CRD default).
pub const DEFAULT_LINK_PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// `probeSpec.failureThreshold` when unset (Linkerd's CRD default).
pub const DEFAULT_LINK_PROBE_FAILURE_THRESHOLD: u32 = 3;
/// Shortest period and timeout: a faster probe loads the remote gateway for nothing.
pub const MIN_LINK_PROBE_DURATION: Duration = Duration::from_secs(1);
/// Longest period and timeout. The timeout is bounded on its own, not by the period:
/// Linkerd's own defaults (3 s period, 30 s timeout) have it longer.
pub const MAX_LINK_PROBE_DURATION: Duration = Duration::from_secs(3600);
/// Largest `failureThreshold`.
pub const MAX_LINK_PROBE_FAILURE_THRESHOLD: u32 = 100;
/// Longest `probeSpec.path`.
const MAX_PROBE_PATH_LEN: usize = 1024;

/// Go's `omitempty`: Linkerd writes an empty string as no field, so both mean unset.
pub(super) fn set(field: &Option<String>) -> Option<&str> {
    field.as_deref().filter(|s| !s.is_empty())
}

/// Reads a `Link` and the Secret its `clusterCredentialsSecret` names (`None`: no such
/// Secret in the Link's namespace): the only way to make a [`LinkSpec`] from a Link.
///
/// The result's core link has [`MirrorStyle::Resource`] and no controller namespace
/// (Link mirrors look like Linkerd's), and its source is a [`ResourceLink`] whose
/// export rule is [`ExportRule::Selectors`] through the gateway named after the Link.
pub fn parse_link(
    link: &LinkResource,
    credentials: Option<&Secret>,
) -> Result<LinkSpec, LinkError> {
    let spec = &link.spec;
    let namespace = link.metadata.namespace.clone().unwrap_or_default();
    let name = link.metadata.name.clone().unwrap_or_default();

    let cluster = set(&spec.target_cluster_name).ok_or(LinkError::MissingTargetClusterName)?;
    validate_cluster_name(cluster)
        .map_err(|e| LinkError::InvalidClusterName(sanitize_remote_text(cluster), e.to_string()))?;
    let domain = set(&spec.target_cluster_domain);
    if let Some(d) = domain.filter(|d| !is_dns1123_subdomain(d)) {
        return Err(LinkError::InvalidClusterDomain(sanitize_remote_text(d)));
    }

    let secret_name =
        set(&spec.cluster_credentials_secret).ok_or(LinkError::MissingCredentialsSecretName)?;
    let allow = match link
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOW_INSECURE_ANNOTATION))
    {
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

    let gateway = gateway(
        set(&spec.gateway_address),
        set(&spec.gateway_port),
        set(&spec.gateway_identity),
    )?;
    let (probe, probe_timeout, probe_failure_threshold) = probe(
        spec.probe_spec
            .as_ref()
            .unwrap_or(&LinkProbeSpec::default()),
    )?;

    let selector = |which, s| {
        let invalid = |message: &str| LinkError::InvalidSelector {
            which,
            message: sanitize_remote_text(message),
        };
        if let Some((_, why)) = spec.undecodable.iter().find(|(w, _)| *w == which) {
            return Err(invalid(&format!("not a label selector: {why}")));
        }
        Selector::parse(s).map_err(|e| invalid(&e.to_string()))
    };
    let export = selector("selector", spec.selector.as_ref())?;
    let remote_discovery = selector(
        "remoteDiscoverySelector",
        spec.remote_discovery_selector.as_ref(),
    )?;
    let federated = selector(
        "federatedServiceSelector",
        spec.federated_service_selector.as_ref(),
    )?;

    let exclusions = |which, patterns: &Option<Vec<String>>| {
        Exclusions::parse(patterns.as_deref().unwrap_or_default()).map_err(|e| {
            LinkError::InvalidExclusion {
                which,
                message: sanitize_remote_text(&e.to_string()),
            }
        })
    };
    let style = ResourceStyle {
        excluded_labels: exclusions("excludedLabels", &spec.excluded_labels)?,
        excluded_annotations: exclusions("excludedAnnotations", &spec.excluded_annotations)?,
    };

    let core = Link::new(cluster, domain).with_style(MirrorStyle::Resource(style));
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

/// Whether `secret` is the one named `name` in `namespace` (a caller that passes
/// another one gets the same answer as for a missing Secret).
pub(super) fn is_the_secret(secret: &Secret, name: &str, namespace: &str) -> bool {
    secret.metadata.name.as_deref() == Some(name)
        && secret
            .metadata
            .namespace
            .as_deref()
            .is_none_or(|ns| namespace.is_empty() || ns == namespace)
}

/// `gatewayAddress`, `gatewayPort`, `gatewayIdentity`: `None` without an address.
pub(super) fn gateway(
    address: Option<&str>,
    port: Option<&str>,
    identity: Option<&str>,
) -> Result<Option<GatewaySpec>, LinkError> {
    // Checked even without an address, so a typo never waits for the address to surface.
    let port = port
        .map(|p| {
            parse_port(p).ok_or_else(|| LinkError::InvalidGatewayPort(sanitize_remote_text(p)))
        })
        .transpose()?;
    if let Some(i) = identity.filter(|i| !valid_identity(i)) {
        return Err(LinkError::InvalidGatewayIdentity(sanitize_remote_text(i)));
    }
    let Some(address) = address else {
        return Ok(None);
    };
    let (mut ips, mut hostnames) = (Vec::new(), Vec::<String>::new());
    for entry in address.split(',').map(str::trim) {
        match gateway_address(entry) {
            Ok(Address::Ip(ip)) if !ips.contains(&ip) => ips.push(ip),
            Ok(Address::Hostname(h)) if !hostnames.contains(&h) => hostnames.push(h),
            Ok(_) => {}
            Err(why) => {
                return Err(LinkError::InvalidGatewayAddress {
                    entry: sanitize_remote_text(entry),
                    why,
                });
            }
        }
    }
    Ok(Some(GatewaySpec {
        ips,
        hostnames,
        port: i32::from(port.ok_or(LinkError::MissingGatewayPort)?),
        // A Link's gateway is no Service: no version to record on its mirrors.
        resource_version: String::new(),
        invalid_ingress: Vec::new(),
        identity: identity.map(str::to_string),
    }))
}

enum Address {
    Ip(IpAddr),
    Hostname(String),
}

fn gateway_address(entry: &str) -> Result<Address, &'static str> {
    if entry.is_empty() {
        return Err("empty entry");
    }
    if let Ok(ip) = entry.parse::<IpAddr>() {
        // As for a gateway Service's ingress: ::ffff:a.b.c.d is the IPv4 address.
        let ip = ip.to_canonical();
        return match endpoint_ip_allowed(&ip) {
            true => Ok(Address::Ip(ip)),
            false => Err(
                "cannot be an Endpoints address (loopback, link-local, multicast or unspecified)",
            ),
        };
    }
    // An all-digit last label is a mistyped IPv4 address, not a name to resolve.
    let numeric_tld = entry
        .rsplit('.')
        .next()
        .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()));
    if is_dns1123_subdomain(entry) && !numeric_tld {
        Ok(Address::Hostname(entry.to_string()))
    } else {
        Err("neither an IP address nor a DNS-1123 hostname (no scheme, port or path)")
    }
}

/// A decimal port from 1 to 65535: digits only, as Linkerd writes it.
fn parse_port(text: &str) -> Option<u16> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u16>().ok().filter(|p| *p > 0)
}

/// `probeSpec`: where and how often, the timeout and the failure threshold.
pub(super) fn probe(spec: &LinkProbeSpec) -> Result<(ProbeSpec, Duration, u32), LinkError> {
    let invalid = |field, value: &str, why: &str| LinkError::InvalidProbeSpec {
        field,
        value: sanitize_remote_text(value),
        why: why.to_string(),
    };
    let port = set(&spec.port)
        .map(|p| {
            parse_port(p).ok_or_else(|| invalid("port", p, "not a port number from 1 to 65535"))
        })
        .transpose()?;
    let path = match set(&spec.path) {
        None => DEFAULT_PROBE_PATH.to_string(),
        Some(p)
            if p.starts_with('/')
                && p.len() <= MAX_PROBE_PATH_LEN
                && !p.chars().any(|c| c.is_whitespace() || c.is_control()) =>
        {
            p.to_string()
        }
        Some(p) => {
            return Err(invalid(
                "path",
                p,
                "not an absolute path (starts with /, no spaces, at most 1024 bytes)",
            ));
        }
    };
    let duration = |field, value: Option<&str>, default| match value {
        None => Ok(default),
        Some(v) => match parse_go_duration(v) {
            Ok(d) if (MIN_LINK_PROBE_DURATION..=MAX_LINK_PROBE_DURATION).contains(&d) => Ok(d),
            Ok(_) => Err(invalid(field, v, "must be from 1s to 1h")),
            Err(why) => Err(invalid(
                field,
                v,
                &format!("not a Go duration such as 3s or 1m30s: {why}"),
            )),
        },
    };
    let period = duration("period", set(&spec.period), DEFAULT_LINK_PROBE_PERIOD)?;
    let timeout = duration("timeout", set(&spec.timeout), DEFAULT_LINK_PROBE_TIMEOUT)?;
    let threshold = match set(&spec.failure_threshold) {
        None => DEFAULT_LINK_PROBE_FAILURE_THRESHOLD,
        Some(t) => t
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| t.parse::<u32>().ok())
            .flatten()
            .filter(|n| (1..=MAX_LINK_PROBE_FAILURE_THRESHOLD).contains(n))
            .ok_or_else(|| invalid("failureThreshold", t, "not a number from 1 to 100"))?,
    };
    let probe = ProbeSpec {
        port,
        path,
        period,
        warnings: Vec::new(),
    };
    Ok((probe, timeout, threshold))
}

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
