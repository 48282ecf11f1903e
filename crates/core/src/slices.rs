//! The EndpointSlices (`discovery.k8s.io/v1`) of a mirror, written by us instead of
//! kube-controller-manager's EndpointSliceMirroring: which objects, their names, their
//! chunking at the API's limits, and the compare-then-update of one slice.
//!
//! The slices carry what the mirror's Endpoints carry (the gateway's addresses, one
//! port per Service port at the gateway's port), derived from the desired Endpoints,
//! so both representations always say the same thing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::desired::{DesiredMirror, port_name, protocol_or_default};
use super::diff::{MetadataOwnership, OWNED_ANNOTATIONS, OWNED_LABELS, meta_match, set_meta};
use super::headless::is_headless;
use super::labels::{
    HEADLESS_MIRROR_SVC_NAME_LABEL, HEADLESS_SLICE_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE,
    MIRRORING_MANAGED_BY_VALUE, SERVICE_NAME_LABEL, SKIP_MIRROR_LABEL, SKIP_MIRROR_VALUE,
};
use super::naming::{MAX_SERVICE_NAME_LEN, fnv1a32};
use super::ownership::is_owned;

/// Most endpoints one EndpointSlice may hold (API validation: `maxEndpoints = 1000`).
pub const MAX_ENDPOINTS_PER_SLICE: usize = 1000;
/// Most ports one EndpointSlice may hold by the API's documentation (v1.34 validates
/// up to 20,000, but documents 100, and kube-proxy merges the slices of one Service by
/// port name, so chunking at 100 costs nothing).
pub const MAX_PORTS_PER_SLICE: usize = 100;

/// kube-controller-manager's `--mirroring-max-endpoints-per-subset` default.
///
/// What EndpointSliceMirroring does (kubernetes v1.34.4,
/// `pkg/controller/endpointslicemirroring/reconciler.go`): per Endpoints subset it adds
/// ready then not-ready addresses and stops at this many (1000): the rest are skipped,
/// counted in `endpoint_slice_mirroring_controller_addresses_skipped_per_sync` and
/// reported by a `TooManyAddressesToMirror` Event on the Endpoints; a 2,500-address
/// subset reaches kube-proxy as 1,000 endpoints. Ports are not chunked: a subset's
/// ports all go to the slices of that subset (the API validates up to 20,000), so 150
/// ports mirror whole.
pub const MIRRORING_MAX_ENDPOINTS_PER_SUBSET: usize = 1000;

/// Which endpoint objects the mirrors carry (`--endpoints-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EndpointsMode {
    /// Endpoints only; kube-controller-manager mirrors them into slices (today's).
    Endpoints,
    /// EndpointSlices only; no Endpoints.
    EndpointSlices,
    /// Both: slices written by us, Endpoints kept for tools that read them, labelled
    /// `skip-mirror` so kube-controller-manager makes no duplicate slices.
    #[default]
    Both,
}

impl EndpointsMode {
    /// Every mode, in flag order.
    pub const ALL: [EndpointsMode; 3] = [
        EndpointsMode::Endpoints,
        EndpointsMode::EndpointSlices,
        EndpointsMode::Both,
    ];

    /// Whether mirrors carry Endpoints.
    pub fn writes_endpoints(self) -> bool {
        self != EndpointsMode::EndpointSlices
    }

    /// Whether mirrors carry EndpointSlices of ours.
    pub fn writes_slices(self) -> bool {
        self != EndpointsMode::Endpoints
    }

    /// The flag value: `endpoints`, `endpointslices` or `both`.
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointsMode::Endpoints => "endpoints",
            EndpointsMode::EndpointSlices => "endpointslices",
            EndpointsMode::Both => "both",
        }
    }
}

impl fmt::Display for EndpointsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown `--endpoints-mode` value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown endpoints mode {0:?}: expected endpoints, endpointslices or both")]
pub struct UnknownMode(pub String);

impl FromStr for EndpointsMode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EndpointsMode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownMode(s.to_owned()))
    }
}

/// Label keys we own on a slice: the mirror labels, and Kubernetes' two slice labels.
const SLICE_LABELS: [&str; 8] = [
    OWNED_LABELS[0],
    OWNED_LABELS[1],
    OWNED_LABELS[2],
    OWNED_LABELS[3],
    SERVICE_NAME_LABEL,
    MANAGED_BY_LABEL,
    HEADLESS_MIRROR_SVC_NAME_LABEL,
    HEADLESS_SLICE_LABEL,
];

/// Whether a slice is ours for `cluster`: the mirror labels and our managed-by.
/// kube-controller-manager's mirrored slices copy the Endpoints' labels (ours
/// included) but say `endpointslicemirroring-controller.k8s.io`: never ours.
pub fn is_our_slice(meta: &ObjectMeta, cluster: &str) -> bool {
    is_owned(meta, cluster)
        && meta
            .labels
            .as_ref()
            .and_then(|l| l.get(MANAGED_BY_LABEL))
            .map(String::as_str)
            == Some(MANAGED_BY_VALUE)
}

/// Whether a slice is kube-controller-manager's mirror (EndpointSliceMirroring) of the
/// Endpoints of the mirror Service named `mirror`.
pub fn is_mirrored_slice(meta: &ObjectMeta, mirror: &str) -> bool {
    let label = |k| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    label(MANAGED_BY_LABEL) == Some(MIRRORING_MANAGED_BY_VALUE)
        && label(SERVICE_NAME_LABEL) == Some(mirror)
}

/// One way kube-proxy reaches a mirror: a ready endpoint address at a port, as
/// (address, port name, port number, protocol).
pub type Route = (IpAddr, String, i32, String);

/// The routes `slices` give kube-proxy: every address of an endpoint not marked
/// unready (kube-proxy takes an unset `ready` as ready) at every port of its slice.
/// Unnamed ports and protocols are normalised (`""`, TCP), so our slices and
/// kube-controller-manager's mirrored ones compare.
pub fn slice_routes<'a>(slices: impl IntoIterator<Item = &'a EndpointSlice>) -> BTreeSet<Route> {
    let mut routes = BTreeSet::new();
    for slice in slices {
        let ports: Vec<(String, i32, String)> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                let port = p.port?;
                let name = p.name.clone().unwrap_or_default();
                Some((name, port, protocol_or_default(p.protocol.as_deref())))
            })
            .collect();
        let ready = slice
            .endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false));
        for ip in ready
            .flat_map(|e| &e.addresses)
            .filter_map(|a| a.parse::<IpAddr>().ok())
        {
            for (name, port, protocol) in &ports {
                routes.insert((ip, name.clone(), *port, protocol.clone()));
            }
        }
    }
    routes
}

/// `endpoints` labelled `skip-mirror: "true"` (modes that write slices themselves).
pub fn with_skip_mirror(mut endpoints: Endpoints) -> Endpoints {
    endpoints
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(SKIP_MIRROR_LABEL.to_owned(), SKIP_MIRROR_VALUE.to_owned());
    endpoints
}

/// Whether `endpoints` carries `skip-mirror: "true"`.
pub fn skips_mirroring(endpoints: &Endpoints) -> bool {
    endpoints
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SKIP_MIRROR_LABEL))
        .map(String::as_str)
        == Some(SKIP_MIRROR_VALUE)
}

/// The largest subset of `endpoints` (ready plus not-ready addresses) when it exceeds
/// what EndpointSliceMirroring mirrors ([`MIRRORING_MAX_ENDPOINTS_PER_SUBSET`]).
pub fn mirroring_overflow(endpoints: &Endpoints) -> Option<usize> {
    endpoints
        .subsets
        .iter()
        .flatten()
        .map(|s| {
            s.addresses.as_ref().map_or(0, Vec::len)
                + s.not_ready_addresses.as_ref().map_or(0, Vec::len)
        })
        .max()
        .filter(|n| *n > MIRRORING_MAX_ENDPOINTS_PER_SUBSET)
}

/// Address family of a slice: its `addressType` and its name part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn of(ip: &IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
    fn address_type(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
    fn name_part(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }
}

/// Name of slice `index` of address family `family` (`"ipv4"` or `"ipv6"`) of the
/// mirror named `mirror`.
///
/// Rule: `<mirror>-<family>-<index>` when it fits in 63 characters; otherwise the
/// mirror name is cut and the 8 hex digits of the FNV-1a hash of the full mirror name
/// inserted, `<prefix>-<hash>-<family>-<index>`, at most 63 characters (the same rule
/// as `naming::mirror_name`). Deterministic: a restart names every slice the same.
pub fn slice_name(mirror: &str, family: &str, index: usize) -> String {
    let suffix = format!("-{family}-{index}");
    let short = format!("{mirror}{suffix}");
    if short.len() <= MAX_SERVICE_NAME_LEN {
        return short;
    }
    let hash = format!("{:08x}", fnv1a32(mirror.as_bytes()));
    let keep = MAX_SERVICE_NAME_LEN.saturating_sub(suffix.len() + hash.len() + 1);
    let prefix: String = mirror.chars().take(keep).collect();
    let prefix = prefix.trim_end_matches('-');
    format!("{prefix}-{hash}{suffix}")
}

/// The slices of `mirror`, owned by its Service of uid `service_uid`.
///
/// One group per address family of the gateway's addresses (IPv4 first), each cut in
/// chunks of [`MAX_ENDPOINTS_PER_SLICE`] endpoints times chunks of
/// [`MAX_PORTS_PER_SLICE`] ports: every endpoint chunk is written once per port chunk.
/// A ready address is ready and serving; a not-ready one (dead gateway) is neither.
///
/// Nothing to route (no gateway, a gateway without a usable address, a remote with no
/// ready endpoint: the Endpoints have no subset, so no gateway port is known): one
/// IPv4 slice with `endpoints: []` and `ports: []`, the placeholder Kubernetes' own
/// EndpointSlice controller writes for a Service with no endpoints (kubernetes
/// `staging/src/k8s.io/endpointslice/reconciler.go`, `reconcileByAddressType`: "When
/// no endpoint slices would usually exist, we need to add a placeholder", built with
/// `ports: []discovery.EndpointPort{}`). A port with a name but no number is never
/// written: Linkerd's destination resolves a Service port by name through the slice's
/// ports and dereferences the number (`port_publisher.go`, `resolveESTargetPort`:
/// `Port(*p.Port)`), so one such port crashes it for the whole mesh.
pub fn desired_slices(mirror: &DesiredMirror, service_uid: &str) -> Vec<EndpointSlice> {
    if is_headless(&mirror.service) {
        return headless_slices(mirror, service_uid);
    }
    let svc = &mirror.service;
    let name = svc.metadata.name.clone().unwrap_or_default();
    let namespace = svc.metadata.namespace.clone();
    let subset = mirror.endpoints.subsets.as_ref().and_then(|s| s.first());
    let gateway_port = subset
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .map(|p| p.port);
    // No gateway port, no port: a numberless port is what crashes Linkerd (see above).
    let ports: Vec<EndpointPort> = match gateway_port {
        None => Vec::new(),
        Some(port) => svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_deref())
            .unwrap_or_default()
            .iter()
            .map(|p| EndpointPort {
                name: Some(port_name(p.name.as_deref()).unwrap_or_default()),
                protocol: Some(protocol_or_default(p.protocol.as_deref())),
                port: Some(port),
                app_protocol: None,
            })
            .collect(),
    };

    let mut by_family: BTreeMap<Family, Vec<Endpoint>> = BTreeMap::new();
    for (addresses, alive) in [
        (subset.and_then(|s| s.addresses.as_ref()), true),
        (subset.and_then(|s| s.not_ready_addresses.as_ref()), false),
    ] {
        for a in addresses.into_iter().flatten() {
            let Ok(ip) = a.ip.parse::<IpAddr>() else {
                continue;
            };
            by_family
                .entry(Family::of(&ip))
                .or_default()
                .push(Endpoint {
                    addresses: vec![ip.to_string()],
                    conditions: Some(EndpointConditions {
                        ready: Some(alive),
                        serving: Some(alive),
                        terminating: Some(false),
                    }),
                    ..Default::default()
                });
        }
    }
    // Nothing to route: the placeholder, one IPv4 slice with no endpoints and no ports
    // (the 150-port chunks of a live mirror become this one slice; the others go).
    let ports = match by_family.is_empty() {
        true => {
            by_family.insert(Family::V4, Vec::new());
            Vec::new()
        }
        false => ports,
    };

    // The Endpoints' labels (a Service's may carry remote-discovery ones) and
    // annotations: the fq-name (how a slice maps back to its key), the controller
    // namespace, the gateway identity.
    let mut labels = mirror.endpoints.metadata.labels.clone().unwrap_or_default();
    labels.insert(SERVICE_NAME_LABEL.to_owned(), name.clone());
    labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned());
    let annotations = mirror.endpoints.metadata.annotations.clone();
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: name.clone(),
        uid: service_uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    };

    let port_chunks: Vec<&[EndpointPort]> = match ports.is_empty() {
        true => vec![&[]],
        false => ports.chunks(MAX_PORTS_PER_SLICE).collect(),
    };
    let mut out = Vec::new();
    for (family, mut endpoints) in by_family {
        endpoints.sort_by(|a, b| a.addresses.cmp(&b.addresses));
        let endpoint_chunks: Vec<&[Endpoint]> = match endpoints.is_empty() {
            true => vec![&[]],
            false => endpoints.chunks(MAX_ENDPOINTS_PER_SLICE).collect(),
        };
        let mut index = 0;
        for chunk in &endpoint_chunks {
            for port_chunk in &port_chunks {
                out.push(EndpointSlice {
                    metadata: ObjectMeta {
                        name: Some(slice_name(&name, family.name_part(), index)),
                        namespace: namespace.clone(),
                        labels: Some(labels.clone()),
                        annotations: annotations.clone(),
                        owner_references: Some(vec![owner.clone()]),
                        ..Default::default()
                    },
                    address_type: family.address_type().to_owned(),
                    endpoints: chunk.to_vec(),
                    ports: Some(port_chunk.to_vec()),
                });
                index += 1;
            }
        }
    }
    out
}

/// The slices of a headless mirror (see `headless.rs`): per subset of its Endpoints
/// (one per remote port list) and address family, chunks of
/// [`MAX_ENDPOINTS_PER_SLICE`] endpoints `{addresses: [<endpoint mirror ClusterIP>],
/// hostname}` at the subset's ports, labelled `service.kubernetes.io/headless` so
/// kube-proxy skips them and CoreDNS serves their hostnames.
/// A slice port as compared: (name, protocol, port).
type PortKey = (String, String, Option<i32>);
/// The ports of a group of headless endpoints, and the endpoints.
type PortGroup = (Vec<EndpointPort>, Vec<Endpoint>);

fn headless_slices(mirror: &DesiredMirror, service_uid: &str) -> Vec<EndpointSlice> {
    let name = mirror.service.metadata.name.clone().unwrap_or_default();
    let mut labels = mirror.endpoints.metadata.labels.clone().unwrap_or_default();
    labels.insert(SERVICE_NAME_LABEL.to_owned(), name.clone());
    labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned());
    labels.insert(HEADLESS_SLICE_LABEL.to_owned(), String::new());
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: name.clone(),
        uid: service_uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    // (family, ports) -> endpoints; ports sorted so the grouping is canonical.
    let mut groups: BTreeMap<(Family, Vec<PortKey>), PortGroup> = BTreeMap::new();
    for subset in mirror.endpoints.subsets.iter().flatten() {
        let mut ports: Vec<EndpointPort> = subset
            .ports
            .iter()
            .flatten()
            .map(|p| EndpointPort {
                name: Some(port_name(p.name.as_deref()).unwrap_or_default()),
                protocol: Some(protocol_or_default(p.protocol.as_deref())),
                port: Some(p.port),
                app_protocol: None,
            })
            .collect();
        ports.sort_by(|a, b| (&a.name, &a.protocol, a.port).cmp(&(&b.name, &b.protocol, b.port)));
        let port_key: Vec<PortKey> = ports
            .iter()
            .map(|p| {
                (
                    p.name.clone().unwrap_or_default(),
                    p.protocol.clone().unwrap_or_default(),
                    p.port,
                )
            })
            .collect();
        for a in subset.addresses.iter().flatten() {
            let Ok(ip) = a.ip.parse::<IpAddr>() else {
                continue;
            };
            groups
                .entry((Family::of(&ip), port_key.clone()))
                .or_insert_with(|| (ports.clone(), Vec::new()))
                .1
                .push(Endpoint {
                    addresses: vec![ip.to_string()],
                    hostname: a.hostname.clone(),
                    conditions: Some(EndpointConditions {
                        ready: Some(true),
                        serving: Some(true),
                        terminating: Some(false),
                    }),
                    ..Default::default()
                });
        }
    }
    if groups.is_empty() {
        // No pod with an endpoint mirror yet: one empty slice, so the mirror has one.
        groups.insert((Family::V4, Vec::new()), (Vec::new(), Vec::new()));
    }
    let mut out = Vec::new();
    let mut index: BTreeMap<Family, usize> = BTreeMap::new();
    for ((family, _), (ports, mut endpoints)) in groups {
        endpoints.sort_by(|a, b| a.addresses.cmp(&b.addresses));
        let chunks: Vec<&[Endpoint]> = match endpoints.is_empty() {
            true => vec![&[]],
            false => endpoints.chunks(MAX_ENDPOINTS_PER_SLICE).collect(),
        };
        for chunk in chunks {
            let i = index.entry(family).or_default();
            out.push(EndpointSlice {
                metadata: ObjectMeta {
                    name: Some(slice_name(&name, family.name_part(), *i)),
                    namespace: mirror.service.metadata.namespace.clone(),
                    labels: Some(labels.clone()),
                    annotations: mirror.endpoints.metadata.annotations.clone(),
                    owner_references: Some(vec![owner.clone()]),
                    ..Default::default()
                },
                address_type: family.address_type().to_owned(),
                endpoints: chunk.to_vec(),
                ports: Some(ports.clone()),
            });
            *i += 1;
        }
    }
    out
}

/// Endpoints in a canonical form: IPs canonical, sorted by address.
fn normalize_endpoints(endpoints: &[Endpoint]) -> Vec<Endpoint> {
    let mut out: Vec<Endpoint> = endpoints
        .iter()
        .map(|e| Endpoint {
            addresses: e
                .addresses
                .iter()
                .map(|a| {
                    a.parse::<IpAddr>()
                        .map_or_else(|_| a.clone(), |ip| ip.to_string())
                })
                .collect(),
            ..e.clone()
        })
        .collect();
    out.sort_by(|a, b| a.addresses.cmp(&b.addresses));
    out
}

/// Ports in a canonical form: an empty name is none, TCP is the default protocol.
fn normalize_ports(ports: Option<&Vec<EndpointPort>>) -> Vec<EndpointPort> {
    let mut out: Vec<EndpointPort> = ports
        .into_iter()
        .flatten()
        .map(|p| EndpointPort {
            name: port_name(p.name.as_deref()),
            protocol: Some(protocol_or_default(p.protocol.as_deref())),
            ..p.clone()
        })
        .collect();
    out.sort_by(|a, b| (&a.name, &a.protocol, a.port).cmp(&(&b.name, &b.protocol, b.port)));
    out
}

/// Whether `actual` can become `desired` by an update: `addressType` is immutable, so
/// a slice of another family under our name is deleted and created again.
pub fn slice_updatable(actual: &EndpointSlice, desired: &EndpointSlice) -> bool {
    actual.address_type == desired.address_type
}

/// The update that makes `actual` match `desired` on the fields we own (the mirror and
/// slice labels, the mirror annotations, the owner reference, endpoints, ports), or
/// `None` when it already does. Others' labels and annotations are kept.
pub fn slice_update(actual: &EndpointSlice, desired: &EndpointSlice) -> Option<EndpointSlice> {
    slice_update_with(actual, desired, MetadataOwnership::Keys)
}

/// [`slice_update`], with the slice's labels and annotations per `ownership`.
pub fn slice_update_with(
    actual: &EndpointSlice,
    desired: &EndpointSlice,
    ownership: MetadataOwnership,
) -> Option<EndpointSlice> {
    let (am, dm) = (&actual.metadata, &desired.metadata);
    let owners = |m: &ObjectMeta| m.owner_references.clone().unwrap_or_default();
    let same = meta_match(
        am.labels.as_ref(),
        dm.labels.as_ref(),
        &SLICE_LABELS,
        ownership,
    ) && meta_match(
        am.annotations.as_ref(),
        dm.annotations.as_ref(),
        &OWNED_ANNOTATIONS,
        ownership,
    ) && owners(am) == owners(dm)
        && actual.address_type == desired.address_type
        && normalize_endpoints(&actual.endpoints) == normalize_endpoints(&desired.endpoints)
        && normalize_ports(actual.ports.as_ref()) == normalize_ports(desired.ports.as_ref());
    if same {
        return None;
    }
    let mut updated = actual.clone();
    set_meta(
        &mut updated.metadata.labels,
        dm.labels.as_ref(),
        &SLICE_LABELS,
        ownership,
    );
    set_meta(
        &mut updated.metadata.annotations,
        dm.annotations.as_ref(),
        &OWNED_ANNOTATIONS,
        ownership,
    );
    updated.metadata.owner_references = dm.owner_references.clone();
    updated.endpoints = desired.endpoints.clone();
    updated.ports = desired.ports.clone();
    Some(updated)
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};

    use super::super::desired::{Link, desired_mirror};
    use super::super::gateway::{GatewayRef, ResolvedGateway};
    use super::super::labels::{
        CLUSTER_NAME_LABEL, CONTROLLER_NAMESPACE_ANNOTATION, MIRRORED_SERVICE_LABEL,
        REMOTE_GATEWAY_NAME_LABEL, REMOTE_SVC_FQ_NAME_ANNOTATION,
    };
    use super::*;

    fn remote(name: &str, ports: usize) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shop".into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(
                    (0..ports)
                        .map(|i| ServicePort {
                            name: Some(format!("p{i}")),
                            protocol: (i % 2 == 1).then(|| "UDP".into()),
                            port: 1000 + i as i32,
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn ips(n: usize) -> Vec<IpAddr> {
        (0..n)
            .map(|i| IpAddr::from([10, 1, (i / 250) as u8, (i % 250) as u8 + 1]))
            .collect()
    }

    fn mirror(name: &str, ports: usize, gw: Option<ResolvedGateway>) -> DesiredMirror {
        desired_mirror(
            &remote(name, ports),
            &Link::new("east", None).with_controller_namespace("mc"),
            &GatewayRef::new("mc", "gw"),
            gw.as_ref(),
        )
    }

    fn resolved(addrs: Vec<IpAddr>) -> ResolvedGateway {
        ResolvedGateway::new(addrs, 4143).with_resource_version("g1")
    }

    /// (name, addressType, endpoints, ports) of each slice.
    fn shape(slices: &[EndpointSlice]) -> Vec<(String, String, usize, usize)> {
        slices
            .iter()
            .map(|s| {
                (
                    s.metadata.name.clone().unwrap(),
                    s.address_type.clone(),
                    s.endpoints.len(),
                    s.ports.as_ref().map_or(0, Vec::len),
                )
            })
            .collect()
    }

    fn row(
        name: &str,
        family: &str,
        endpoints: usize,
        ports: usize,
    ) -> (String, String, usize, usize) {
        (name.into(), family.into(), endpoints, ports)
    }

    #[test]
    fn slices_are_chunked_at_the_api_limits() {
        let v6: IpAddr = "fd00::1".parse().unwrap();
        let mut mixed = ips(2);
        mixed.push(v6);
        type Case = (
            &'static str,
            DesiredMirror,
            Vec<(String, String, usize, usize)>,
        );
        let table: Vec<Case> = vec![
            (
                "two addresses, one port: one slice",
                mirror("web", 1, Some(resolved(ips(2)))),
                vec![row("web-east-ipv4-0", "IPv4", 2, 1)],
            ),
            (
                "1000 addresses: still one slice",
                mirror("web", 1, Some(resolved(ips(1000)))),
                vec![row("web-east-ipv4-0", "IPv4", 1000, 1)],
            ),
            (
                "2500 addresses: 3 slices of at most 1000",
                mirror("web", 1, Some(resolved(ips(2500)))),
                vec![
                    row("web-east-ipv4-0", "IPv4", 1000, 1),
                    row("web-east-ipv4-1", "IPv4", 1000, 1),
                    row("web-east-ipv4-2", "IPv4", 500, 1),
                ],
            ),
            (
                "100 ports: one slice",
                mirror("web", 100, Some(resolved(ips(1)))),
                vec![row("web-east-ipv4-0", "IPv4", 1, 100)],
            ),
            (
                "150 ports: 2 slices, same endpoints, port chunks",
                mirror("web", 150, Some(resolved(ips(3)))),
                vec![
                    row("web-east-ipv4-0", "IPv4", 3, 100),
                    row("web-east-ipv4-1", "IPv4", 3, 50),
                ],
            ),
            (
                "1500 addresses x 150 ports: 4 slices",
                mirror("web", 150, Some(resolved(ips(1500)))),
                vec![
                    row("web-east-ipv4-0", "IPv4", 1000, 100),
                    row("web-east-ipv4-1", "IPv4", 1000, 50),
                    row("web-east-ipv4-2", "IPv4", 500, 100),
                    row("web-east-ipv4-3", "IPv4", 500, 50),
                ],
            ),
            (
                "one slice per address family",
                mirror("web", 1, Some(resolved(mixed))),
                vec![
                    row("web-east-ipv4-0", "IPv4", 2, 1),
                    row("web-east-ipv6-0", "IPv6", 1, 1),
                ],
            ),
            (
                "no gateway: the placeholder, no endpoints and no ports",
                mirror("web", 2, None),
                vec![row("web-east-ipv4-0", "IPv4", 0, 0)],
            ),
            (
                "gateway without addresses: same",
                mirror("web", 2, Some(resolved(vec![]))),
                vec![row("web-east-ipv4-0", "IPv4", 0, 0)],
            ),
            (
                "no gateway, 150 ports: one placeholder, not one per port chunk",
                mirror("web", 150, None),
                vec![row("web-east-ipv4-0", "IPv4", 0, 0)],
            ),
        ];
        for (what, m, want) in table {
            assert_eq!(shape(&desired_slices(&m, "uid-1")), want, "{what}");
        }
    }

    #[test]
    fn port_chunks_hold_every_endpoint_and_every_port_once() {
        let m = mirror("web", 150, Some(resolved(ips(3))));
        let slices = desired_slices(&m, "u");
        let mut names: Vec<String> = slices
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .map(|p| p.name.clone().unwrap())
            .collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 150);
        assert_eq!(slices[0].endpoints, slices[1].endpoints);
    }

    #[test]
    fn slice_metadata_labels_annotations_owner() {
        let m = mirror("web", 1, Some(resolved(ips(1))));
        let s = &desired_slices(&m, "svc-uid")[0];
        let labels = s.metadata.labels.as_ref().unwrap();
        let table = [
            (SERVICE_NAME_LABEL, "web-east"),
            (MANAGED_BY_LABEL, "service-mirror.linkerd.io"),
            (MIRRORED_SERVICE_LABEL, "true"),
            (CLUSTER_NAME_LABEL, "east"),
            (REMOTE_GATEWAY_NAME_LABEL, "gw"),
        ];
        for (k, v) in table {
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert_eq!(labels.len(), 6, "{labels:?}");
        let annotations = s.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            annotations[REMOTE_SVC_FQ_NAME_ANNOTATION],
            "web.shop.svc.cluster.local"
        );
        assert_eq!(annotations[CONTROLLER_NAMESPACE_ANNOTATION], "mc");
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str(),
                owner.controller
            ),
            ("v1", "Service", "web-east", "svc-uid", Some(true))
        );
        assert_eq!(s.metadata.namespace.as_deref(), Some("shop"));
        assert!(is_our_slice(&s.metadata, "east"));
        assert!(!is_our_slice(&s.metadata, "west"));
    }

    #[test]
    fn ports_named_and_typed_as_the_service_at_the_gateway_port() {
        let m = mirror("web", 2, Some(resolved(ips(1))));
        let s = &desired_slices(&m, "u")[0];
        assert_eq!(
            s.ports,
            Some(vec![
                EndpointPort {
                    name: Some("p0".into()),
                    protocol: Some("TCP".into()),
                    port: Some(4143),
                    app_protocol: None,
                },
                EndpointPort {
                    name: Some("p1".into()),
                    protocol: Some("UDP".into()),
                    port: Some(4143),
                    app_protocol: None,
                },
            ])
        );
        // No gateway port known: no port at all (Linkerd's destination dereferences
        // the number of the port it finds by name), as Kubernetes' placeholder.
        let none = desired_slices(&mirror("web", 1, None), "u");
        assert_eq!(none[0].ports, Some(vec![]));
        assert!(none[0].endpoints.is_empty());
    }

    #[test]
    fn conditions_follow_gateway_liveness() {
        let conditions = |alive: bool| {
            let m = mirror("web", 1, Some(resolved(ips(2)).with_alive(alive)));
            desired_slices(&m, "u")[0]
                .endpoints
                .iter()
                .map(|e| e.conditions.clone().unwrap())
                .collect::<Vec<_>>()
        };
        let table = [
            (true, (Some(true), Some(true), Some(false))),
            (false, (Some(false), Some(false), Some(false))),
        ];
        for (alive, (ready, serving, terminating)) in table {
            let want = EndpointConditions {
                ready,
                serving,
                terminating,
            };
            assert_eq!(conditions(alive), vec![want.clone(), want], "alive {alive}");
        }
    }

    #[test]
    fn slice_names_are_deterministic_and_fit() {
        let long = "a".repeat(63);
        let table: Vec<(&str, &str, usize, Option<&str>)> = vec![
            ("web-east", "ipv4", 0, Some("web-east-ipv4-0")),
            ("web-east", "ipv6", 12, Some("web-east-ipv6-12")),
            (&long, "ipv4", 0, None),
            (&long, "ipv6", 123456, None),
        ];
        for (mirror, family, index, want) in table {
            let got = slice_name(mirror, family, index);
            assert!(got.len() <= 63, "{got}");
            assert_eq!(got, slice_name(mirror, family, index));
            assert!(got.ends_with(&format!("-{family}-{index}")), "{got}");
            if let Some(want) = want {
                assert_eq!(got, want);
            }
        }
        // Two long mirror names sharing a prefix get different slice names.
        let (a, b) = (format!("{long}x"), format!("{long}y"));
        assert_ne!(slice_name(&a, "ipv4", 0), slice_name(&b, "ipv4", 0));
        let cut = slice_name(&long, "ipv4", 0);
        assert_eq!(cut.len(), 63, "{cut}");
        assert!(cut.starts_with("aaaa"));
    }

    #[test]
    fn modes_parse_and_print() {
        for mode in EndpointsMode::ALL {
            assert_eq!(mode.as_str().parse::<EndpointsMode>(), Ok(mode));
            assert_eq!(mode.to_string(), mode.as_str());
        }
        assert_eq!(EndpointsMode::default(), EndpointsMode::Both);
        assert!("slices".parse::<EndpointsMode>().is_err());
        let table = [
            (EndpointsMode::Endpoints, true, false),
            (EndpointsMode::EndpointSlices, false, true),
            (EndpointsMode::Both, true, true),
        ];
        for (mode, endpoints, slices) in table {
            assert_eq!(mode.writes_endpoints(), endpoints, "{mode}");
            assert_eq!(mode.writes_slices(), slices, "{mode}");
        }
    }

    /// `s` as the apiserver returns it: identity, and defaults dropped or added.
    fn stored(s: &EndpointSlice) -> EndpointSlice {
        let mut s = s.clone();
        s.metadata.uid = Some("slice-uid".into());
        s.metadata.resource_version = Some("9".into());
        s
    }

    fn with(mut s: EndpointSlice, f: impl FnOnce(&mut EndpointSlice)) -> EndpointSlice {
        f(&mut s);
        s
    }

    #[test]
    fn slice_update_only_when_an_owned_field_differs() {
        let m = mirror("web", 2, Some(resolved(ips(3))));
        let d = desired_slices(&m, "u").remove(0);
        let base = stored(&d);
        let table: Vec<(&str, EndpointSlice, bool)> = vec![
            ("identical", d.clone(), false),
            ("stored with identity", base.clone(), false),
            (
                "endpoints in another order",
                with(base.clone(), |s| s.endpoints.reverse()),
                false,
            ),
            (
                "ports in another order, protocol defaulted, empty name",
                with(base.clone(), |s| {
                    let p = s.ports.as_mut().unwrap();
                    p.reverse();
                    p[1].protocol = None;
                }),
                false,
            ),
            (
                "foreign label and annotation",
                with(base.clone(), |s| {
                    s.metadata
                        .labels
                        .as_mut()
                        .unwrap()
                        .insert("team".into(), "a".into());
                    s.metadata.annotations = Some(BTreeMap::from([
                        ("x".into(), "y".into()),
                        (
                            REMOTE_SVC_FQ_NAME_ANNOTATION.into(),
                            "web.shop.svc.cluster.local".into(),
                        ),
                        (CONTROLLER_NAMESPACE_ANNOTATION.into(), "mc".into()),
                    ]));
                }),
                false,
            ),
            (
                "endpoint removed",
                with(base.clone(), |s| {
                    s.endpoints.pop();
                }),
                true,
            ),
            (
                "endpoint not ready",
                with(base.clone(), |s| {
                    s.endpoints[0].conditions.as_mut().unwrap().ready = Some(false)
                }),
                true,
            ),
            (
                "port number",
                with(base.clone(), |s| {
                    s.ports.as_mut().unwrap()[0].port = Some(1)
                }),
                true,
            ),
            (
                "port removed",
                with(base.clone(), |s| {
                    s.ports.as_mut().unwrap().pop();
                }),
                true,
            ),
            (
                "service-name label",
                with(base.clone(), |s| {
                    s.metadata
                        .labels
                        .as_mut()
                        .unwrap()
                        .insert(SERVICE_NAME_LABEL.into(), "other".into());
                }),
                true,
            ),
            (
                "fq-name annotation lost",
                with(base.clone(), |s| s.metadata.annotations = None),
                true,
            ),
            (
                "owner reference lost",
                with(base.clone(), |s| s.metadata.owner_references = None),
                true,
            ),
        ];
        for (what, actual, want) in table {
            let update = slice_update(&actual, &d);
            assert_eq!(update.is_some(), want, "{what}");
            if let Some(u) = update {
                assert_eq!(slice_update(&u, &d), None, "{what}: converges");
                assert_eq!(u.metadata.uid, actual.metadata.uid, "{what}: identity kept");
                assert_eq!(
                    u.metadata.resource_version,
                    actual.metadata.resource_version
                );
            }
        }
    }

    #[test]
    fn update_keeps_foreign_metadata() {
        let d = desired_slices(&mirror("web", 1, Some(resolved(ips(1)))), "u").remove(0);
        let actual = with(stored(&d), |s| {
            s.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert("team".into(), "a".into());
            s.endpoints.clear();
        });
        let u = slice_update(&actual, &d).unwrap();
        assert_eq!(u.metadata.labels.as_ref().unwrap()["team"], "a");
        assert_eq!(u.endpoints, d.endpoints);
    }

    #[test]
    fn address_type_is_immutable() {
        let d = desired_slices(&mirror("web", 1, Some(resolved(ips(1)))), "u").remove(0);
        let v6 = with(stored(&d), |s| s.address_type = "IPv6".into());
        assert!(slice_updatable(&stored(&d), &d));
        assert!(!slice_updatable(&v6, &d));
    }

    #[test]
    fn ownership_of_slices() {
        let d = desired_slices(&mirror("web", 1, None), "u").remove(0);
        let relabel = |k: &str, v: Option<&str>| {
            with(d.clone(), |s| {
                let l = s.metadata.labels.as_mut().unwrap();
                match v {
                    Some(v) => l.insert(k.into(), v.into()),
                    None => l.remove(k),
                };
            })
        };
        let table = [
            ("ours", d.clone(), true),
            (
                "kcm's mirrored slice (our labels copied)",
                relabel(
                    MANAGED_BY_LABEL,
                    Some("endpointslicemirroring-controller.k8s.io"),
                ),
                false,
            ),
            (
                "the endpointslice controller's",
                relabel(MANAGED_BY_LABEL, Some("endpointslice-controller.k8s.io")),
                false,
            ),
            ("no managed-by", relabel(MANAGED_BY_LABEL, None), false),
            ("not a mirror", relabel(MIRRORED_SERVICE_LABEL, None), false),
            (
                "other cluster",
                relabel(CLUSTER_NAME_LABEL, Some("west")),
                false,
            ),
        ];
        for (what, s, want) in table {
            assert_eq!(is_our_slice(&s.metadata, "east"), want, "{what}");
        }
    }

    #[test]
    fn routes_are_ready_addresses_times_ports_whoever_wrote_the_slice() {
        let m = mirror("web", 2, Some(resolved(ips(2))));
        let ours = desired_slices(&m, "u");
        let routes = slice_routes(&ours);
        assert_eq!(routes.len(), 4, "2 addresses x 2 ports: {routes:?}");
        assert!(routes.iter().all(|(_, _, port, _)| *port == 4143));
        let protocols: BTreeSet<&str> = routes.iter().map(|r| r.3.as_str()).collect();
        assert_eq!(protocols, BTreeSet::from(["TCP", "UDP"]));
        // kcm's mirror of the same: an unset protocol reads as TCP, an unset ready as
        // ready.
        let kcm = with(ours[0].clone(), |s| {
            for p in s.ports.iter_mut().flatten() {
                if p.protocol.as_deref() == Some("TCP") {
                    p.protocol = None;
                }
            }
            for e in &mut s.endpoints {
                e.conditions = None;
            }
        });
        assert_eq!(slice_routes([&kcm]), routes);
        // Unready endpoints route nothing.
        let dead = mirror("web", 2, Some(resolved(ips(2)).with_alive(false)));
        assert!(slice_routes(&desired_slices(&dead, "u")).is_empty());
        // Mirrored slice: kcm's managed-by and the mirror's service name.
        let mirrored = with(kcm, |s| {
            s.metadata.labels.as_mut().unwrap().insert(
                MANAGED_BY_LABEL.into(),
                "endpointslicemirroring-controller.k8s.io".into(),
            );
        });
        let name = m.service.metadata.name.clone().unwrap();
        assert!(is_mirrored_slice(&mirrored.metadata, &name));
        assert!(!is_mirrored_slice(&mirrored.metadata, "other"));
        assert!(!is_mirrored_slice(&ours[0].metadata, &name));
    }

    #[test]
    fn skip_mirror_label() {
        let m = mirror("web", 1, None);
        assert!(!skips_mirroring(&m.endpoints));
        let e = with_skip_mirror(m.endpoints.clone());
        assert!(skips_mirroring(&e));
        assert_eq!(
            e.metadata.labels.as_ref().unwrap()[SKIP_MIRROR_LABEL],
            "true"
        );
    }

    #[test]
    fn mirroring_overflow_counts_ready_and_not_ready() {
        let table = [
            (1000, true, None),
            (1001, true, Some(1001)),
            (2500, false, Some(2500)),
            (0, true, None),
        ];
        for (n, alive, want) in table {
            let m = mirror("web", 1, Some(resolved(ips(n)).with_alive(alive)));
            assert_eq!(mirroring_overflow(&m.endpoints), want, "{n} alive {alive}");
        }
    }

    // ---- Link mirrors' slices: labels from the Endpoints, ownership All ----

    use super::super::desired::{MirrorStyle, ResourceStyle, remote_discovery_mirror};
    use super::super::labels::{REMOTE_GATEWAY_IDENTITY_ANNOTATION, REMOTE_GATEWAY_NS_LABEL};

    const IDENTITY: &str = "gw.mc.serviceaccount.identity.cluster.local";

    fn link_mirror(labels: &[(&str, &str)]) -> DesiredMirror {
        let mut r = remote("web", 1);
        r.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        let l = Link::new("east", None)
            .with_controller_namespace("mc")
            .with_style(MirrorStyle::Resource(ResourceStyle::default()));
        let gw = resolved(ips(2)).with_identity(Some(IDENTITY.into()));
        desired_mirror(&r, &l, &GatewayRef::new("mc", "gw"), Some(&gw))
    }

    #[test]
    fn a_link_mirrors_slices_carry_the_endpoints_labels_and_annotations() {
        let m = link_mirror(&[("app", "web"), ("team", "a")]);
        for s in desired_slices(&m, "u") {
            let mut want = m.endpoints.metadata.labels.clone().unwrap();
            want.insert(SERVICE_NAME_LABEL.into(), "web-east".into());
            want.insert(MANAGED_BY_LABEL.into(), MANAGED_BY_VALUE.into());
            assert_eq!(s.metadata.labels, Some(want));
            assert_eq!(s.metadata.labels.as_ref().unwrap()["app"], "web");
            assert!(
                !s.metadata
                    .labels
                    .as_ref()
                    .unwrap()
                    .contains_key(REMOTE_GATEWAY_NAME_LABEL)
            );
            assert_eq!(s.metadata.annotations, m.endpoints.metadata.annotations);
            assert_eq!(
                s.metadata.annotations.as_ref().unwrap()[REMOTE_GATEWAY_IDENTITY_ANNOTATION],
                IDENTITY
            );
            assert!(is_our_slice(&s.metadata, "east"));
        }
    }

    #[test]
    fn a_remote_label_never_overrides_the_slice_labels_we_set() {
        let m = link_mirror(&[
            (SERVICE_NAME_LABEL, "other"),
            (MANAGED_BY_LABEL, "endpointslice-controller.k8s.io"),
        ]);
        let s = desired_slices(&m, "u").remove(0);
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[SERVICE_NAME_LABEL], "web-east");
        assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY_VALUE);
        assert!(is_our_slice(&s.metadata, "east"));
    }

    #[test]
    fn a_secret_link_mirrors_slice_labels_are_the_four_mirror_labels_plus_the_slice_ones() {
        let m = mirror("web", 1, Some(resolved(ips(1))));
        let s = desired_slices(&m, "u").remove(0);
        let mut want = mirror_labels_for_test();
        want.insert(SERVICE_NAME_LABEL.into(), "web-east".into());
        want.insert(MANAGED_BY_LABEL.into(), MANAGED_BY_VALUE.into());
        assert_eq!(s.metadata.labels, Some(want));
        assert_eq!(s.metadata.annotations, m.endpoints.metadata.annotations);
    }

    fn mirror_labels_for_test() -> BTreeMap<String, String> {
        super::super::desired::mirror_labels("east", &GatewayRef::new("mc", "gw"))
    }

    #[test]
    fn slices_never_carry_the_service_only_remote_discovery_labels() {
        // Slices take the Endpoints' labels, not the Service's: the discovery labels
        // belong to a Service only.
        let mut r = remote("web", 1);
        r.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
        let l = Link::new("east", None).with_style(MirrorStyle::Resource(ResourceStyle::default()));
        let mut m = remote_discovery_mirror(&r, &l);
        m.has_endpoints = true;
        let s = desired_slices(&m, "u").remove(0);
        let labels = s.metadata.labels.unwrap();
        assert!(!labels.contains_key(super::super::labels::REMOTE_DISCOVERY_LABEL));
        assert!(!labels.contains_key(super::super::labels::REMOTE_SERVICE_LABEL));
    }

    #[test]
    fn slice_ownership_all_replaces_metadata_whole_keys_keeps_foreign_keys() {
        let d = desired_slices(&link_mirror(&[("app", "web")]), "u").remove(0);
        let base = stored(&d);
        let edit = |labels: bool, k: &str, v: Option<&str>| {
            with(base.clone(), |s| {
                let m = match labels {
                    true => s.metadata.labels.get_or_insert_with(BTreeMap::new),
                    false => s.metadata.annotations.get_or_insert_with(BTreeMap::new),
                };
                match v {
                    Some(v) => m.insert(k.into(), v.into()),
                    None => m.remove(k),
                };
            })
        };
        // (what, actual, update under All, update under Keys)
        type Row = (&'static str, EndpointSlice, bool, bool);
        let table: Vec<Row> = vec![
            ("idle: stored as desired", base.clone(), false, false),
            (
                "stale copied label",
                edit(true, "old", Some("x")),
                true,
                false,
            ),
            ("foreign label", edit(true, "team", Some("a")), true, false),
            ("copied label removed", edit(true, "app", None), true, false),
            (
                "foreign annotation",
                edit(false, "note", Some("y")),
                true,
                false,
            ),
            (
                "owned label changed",
                edit(true, CLUSTER_NAME_LABEL, Some("west")),
                true,
                true,
            ),
            (
                "owned annotation removed",
                edit(false, REMOTE_GATEWAY_IDENTITY_ANNOTATION, None),
                true,
                true,
            ),
            (
                "empty labels",
                with(base.clone(), |s| s.metadata.labels = Some(BTreeMap::new())),
                true,
                true,
            ),
        ];
        for (what, actual, all, keys) in table {
            let u_all = slice_update_with(&actual, &d, MetadataOwnership::All);
            assert_eq!(u_all.is_some(), all, "{what}: All");
            if let Some(u) = &u_all {
                assert_eq!(u.metadata.labels, d.metadata.labels, "{what}: All");
                assert_eq!(
                    u.metadata.annotations, d.metadata.annotations,
                    "{what}: All"
                );
                assert_eq!(u.metadata.uid, actual.metadata.uid, "{what}: All");
                assert_eq!(
                    slice_update_with(u, &d, MetadataOwnership::All),
                    None,
                    "{what}: All converges"
                );
            }
            let u_keys = slice_update_with(&actual, &d, MetadataOwnership::Keys);
            assert_eq!(u_keys.is_some(), keys, "{what}: Keys");
            assert_eq!(
                u_keys,
                slice_update(&actual, &d),
                "{what}: slice_update is Keys"
            );
            if let Some(u) = &u_keys {
                for k in ["team", "old", "note"] {
                    let has = |m: &Option<BTreeMap<String, String>>| {
                        m.as_ref().is_some_and(|m| m.contains_key(k))
                    };
                    assert_eq!(
                        has(&u.metadata.labels),
                        has(&actual.metadata.labels),
                        "{what}: {k}"
                    );
                    assert_eq!(
                        has(&u.metadata.annotations),
                        has(&actual.metadata.annotations),
                        "{what}: {k}"
                    );
                }
                assert_eq!(
                    slice_update_with(u, &d, MetadataOwnership::Keys),
                    None,
                    "{what}: Keys converges"
                );
            }
        }
    }

    #[test]
    fn under_keys_a_slice_keeps_a_foreign_label_while_an_owned_one_is_fixed() {
        let d = desired_slices(&mirror("web", 1, Some(resolved(ips(1)))), "u").remove(0);
        let actual = with(stored(&d), |s| {
            let l = s.metadata.labels.as_mut().unwrap();
            l.insert("team".into(), "a".into());
            l.insert(REMOTE_GATEWAY_NS_LABEL.into(), "old".into());
        });
        let u = slice_update_with(&actual, &d, MetadataOwnership::Keys).unwrap();
        let labels = u.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "a");
        assert_eq!(labels[REMOTE_GATEWAY_NS_LABEL], "mc");
        let u = slice_update_with(&actual, &d, MetadataOwnership::All).unwrap();
        assert_eq!(u.metadata.labels, d.metadata.labels);
    }
}
