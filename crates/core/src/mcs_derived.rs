//! The derived Service of a ServiceImport: the local Service that kube-proxy and DNS
//! serve for a cluster-set name (KEP-1645 leaves its form to the implementation). Its
//! ClusterIPs are the import's `ips`; the per-cluster EndpointSlices labelled
//! `kubernetes.io/service-name: <derived>` give it endpoints. No selector: nothing of
//! this cluster's pods is picked by name.
//!
//! Named by a hash of the import's namespace/name (`derived-<16 hex>`), not after the
//! import: `<svc>-<suffix>` names are the mirrors' and users', and a derived Service
//! must never take one. Ours carry the MCS service-name label, our mark and our
//! controller namespace; anything else under the name is foreign and never touched.
//!
//! [`derived_action`] compares only what we set, as the apiserver stores it (it fills
//! in `targetPort`, `sessionAffinity: None`, `internalTrafficPolicy: Cluster`, the
//! ClientIP timeout), so an unchanged import plans nothing.

use crate::ServiceKey;
use crate::labels::CONTROLLER_NAMESPACE_ANNOTATION;
use crate::mcs::{ImportSpec, ImportType, SERVICE_NAME_LABEL};
use k8s_openapi::api::core::v1::{
    ClientIPConfig, Service, ServicePort, ServiceSpec, SessionAffinityConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// Annotation of a ServiceImport naming its derived Service (the name the mcs-api
/// reference implementation uses for the same purpose).
pub const DERIVED_SERVICE_ANNOTATION: &str = "multicluster.kubernetes.io/derived-service";
/// Label marking a derived Service as ours (with [`CONTROLLER_NAMESPACE_ANNOTATION`]).
pub const DERIVED_LABEL: &str = "service-mirror.io/mcs-derived";
/// Value of [`DERIVED_LABEL`].
pub const DERIVED_VALUE: &str = "true";
/// The apiserver's ClientIP affinity timeout when none is given (3 hours).
const DEFAULT_AFFINITY_TIMEOUT: i32 = 10_800;

/// FNV-1a, 64 bits: stable across releases and platforms (a derived name must never
/// change between versions, or an upgrade would replace every ClusterSetIP).
fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

/// The derived Service's name for the import `key`: `derived-` and 16 lowercase hex
/// digits of the FNV-1a 64-bit hash of `<namespace>/<name>` (24 characters, a valid
/// DNS-1035 label whatever the import's name).
pub fn derived_service_name(key: &ServiceKey) -> String {
    let hash = fnv1a64(format!("{}/{}", key.namespace, key.name).as_bytes());
    format!("derived-{hash:016x}")
}

/// Whether `meta` is our derived Service of the import named `import` (our mark, its
/// service-name label, our controller namespace).
pub fn is_owned_derived(meta: &ObjectMeta, import: &str, controller_namespace: &str) -> bool {
    let label = |k: &str| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    let annotation = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONTROLLER_NAMESPACE_ANNOTATION))
        .map(String::as_str);
    label(DERIVED_LABEL) == Some(DERIVED_VALUE)
        && label(SERVICE_NAME_LABEL) == Some(import)
        && annotation == Some(controller_namespace)
}

/// The derived Service of the import `key` with `spec`, as we create it.
pub fn desired_derived_service(
    key: &ServiceKey,
    spec: &ImportSpec,
    controller_namespace: &str,
) -> Service {
    let headless = spec.type_ == ImportType::Headless;
    // The families are this cluster's, not the exporter's (an IPv6 exporter must not
    // make an IPv4-only cluster refuse the Service): only the policy follows the
    // exporter, and the import's `ipFamilies` are read back from the stored Service.
    let ip_family_policy = match spec.ip_families.len() {
        0 => None,
        1 => Some("SingleStack".to_string()),
        // An exporter's dual stack is preferred, not required: a single-stack
        // importing cluster still gets its one family.
        _ => Some("PreferDualStack".to_string()),
    };
    Service {
        metadata: ObjectMeta {
            name: Some(derived_service_name(key)),
            namespace: Some(key.namespace.clone()),
            labels: Some(BTreeMap::from([
                (DERIVED_LABEL.to_string(), DERIVED_VALUE.to_string()),
                (SERVICE_NAME_LABEL.to_string(), key.name.clone()),
            ])),
            annotations: Some(BTreeMap::from([(
                CONTROLLER_NAMESPACE_ANNOTATION.to_string(),
                controller_namespace.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: headless.then(|| "None".to_string()),
            ports: Some(
                spec.ports
                    .iter()
                    .map(|p| ServicePort {
                        name: (!p.name.is_empty()).then(|| p.name.clone()),
                        protocol: Some(p.protocol.clone()),
                        port: p.port,
                        app_protocol: p.app_protocol.clone(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            session_affinity: spec.session_affinity.clone(),
            session_affinity_config: spec.session_affinity_config.clone(),
            // Always `Cluster`: its endpoints are gateways and copies, so node-local would
            // drop traffic on every node without one (the import's `Local` means
            // cluster-local instead: no remote serves, `core::traffic`). Its
            // `trafficDistribution` is carried: kube-proxy applies it only where every
            // endpoint has hints, and ours have none.
            internal_traffic_policy: Some("Cluster".into()),
            traffic_distribution: spec.traffic_distribution.clone(),
            ip_family_policy,
            ..Default::default()
        }),
        status: None,
    }
}

/// What to do with a stored derived Service to make it `desired`.
#[derive(Clone, Debug, PartialEq)]
pub enum DerivedAction {
    /// It already says what we set.
    Nothing,
    /// Replace it with this (the stored object with our fields set; its addresses,
    /// families and resourceVersion kept).
    Update(Box<Service>),
    /// Delete and create it again: headless and not cannot change in place (the
    /// apiserver refuses to change a `clusterIP`). The ClusterSetIP changes with it.
    Recreate,
}

/// What makes `current` (ours, as the apiserver stores it) say `desired`.
pub fn derived_action(current: &Service, desired: &Service) -> DerivedAction {
    let (Some(cur), Some(want)) = (current.spec.as_ref(), desired.spec.as_ref()) else {
        return DerivedAction::Recreate;
    };
    let headless = |s: &ServiceSpec| s.cluster_ip.as_deref() == Some("None");
    if headless(cur) != headless(want) {
        return DerivedAction::Recreate;
    }
    let same = normal_ports(cur) == normal_ports(want)
        && affinity(cur) == affinity(want)
        && affinity_timeout(cur) == affinity_timeout(want)
        && cur.internal_traffic_policy.as_deref().unwrap_or("Cluster")
            == want.internal_traffic_policy.as_deref().unwrap_or("Cluster")
        && cur.traffic_distribution == want.traffic_distribution
        && ours_in(&current.metadata.labels, &desired.metadata.labels)
        && ours_in(&current.metadata.annotations, &desired.metadata.annotations);
    if same {
        return DerivedAction::Nothing;
    }
    let mut next = current.clone();
    let spec = next.spec.get_or_insert_with(Default::default);
    spec.ports = want.ports.clone();
    spec.session_affinity = want.session_affinity.clone();
    spec.session_affinity_config = want.session_affinity_config.clone();
    spec.internal_traffic_policy = want.internal_traffic_policy.clone();
    spec.traffic_distribution = want.traffic_distribution.clone();
    for (mine, theirs) in [
        (&desired.metadata.labels, &mut next.metadata.labels),
        (
            &desired.metadata.annotations,
            &mut next.metadata.annotations,
        ),
    ] {
        theirs
            .get_or_insert_with(Default::default)
            .extend(mine.clone().unwrap_or_default());
    }
    DerivedAction::Update(Box::new(next))
}

/// The import's `ips`: the derived Service's ClusterIPs (none while headless or before
/// the apiserver allocated them).
pub fn import_ips(derived: &Service) -> Vec<String> {
    let Some(spec) = derived.spec.as_ref() else {
        return Vec::new();
    };
    let ips = spec
        .cluster_ips
        .clone()
        .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
        .unwrap_or_default();
    ips.into_iter()
        .filter(|ip| !ip.is_empty() && ip != "None")
        .collect()
}

/// A port as compared.
type NormalPort = (
    Option<String>,
    String,
    i32,
    Option<IntOrString>,
    Option<String>,
);

/// Ports as compared: a `targetPort` equal to the port (the apiserver's default for a
/// selectorless Service) counts as none; protocol TCP when left out.
fn normal_ports(spec: &ServiceSpec) -> Vec<NormalPort> {
    spec.ports
        .iter()
        .flatten()
        .map(|p| {
            let target = p
                .target_port
                .clone()
                .filter(|t| *t != IntOrString::Int(p.port));
            (
                p.name.clone().filter(|n| !n.is_empty()),
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                p.port,
                target,
                p.app_protocol.clone(),
            )
        })
        .collect()
}

fn affinity(spec: &ServiceSpec) -> &str {
    spec.session_affinity.as_deref().unwrap_or("None")
}

/// The ClientIP timeout as stored: the default when ClientIP without one.
fn affinity_timeout(spec: &ServiceSpec) -> Option<i32> {
    (affinity(spec) == "ClientIP").then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c: &SessionAffinityConfig| c.client_ip.as_ref())
            .and_then(|c: &ClientIPConfig| c.timeout_seconds)
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
    })
}

/// Whether every entry of `ours` is in `stored` with the same value (others' entries
/// are theirs: never compared, never removed).
fn ours_in(
    stored: &Option<BTreeMap<String, String>>,
    ours: &Option<BTreeMap<String, String>>,
) -> bool {
    ours.iter()
        .flatten()
        .all(|(k, v)| stored.as_ref().and_then(|s| s.get(k)) == Some(v))
}

#[cfg(test)]
#[path = "mcs_derived_tests.rs"]
mod tests;
