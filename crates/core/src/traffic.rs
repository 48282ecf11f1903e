//! Where a ServiceImport's and a federated Service's traffic goes (issue 32, points 1
//! and 2): local-first with priority failover, and an import's `internalTrafficPolicy:
//! Local` read as cluster-local. A federated Service's local member stands for this
//! cluster's export (`core::federated`).
//!
//! kube-proxy and Linkerd's destination both send a Service's traffic to the *ready*
//! endpoints of its EndpointSlices (kube-proxy falls back to serving-and-terminating
//! endpoints only when none is ready; Linkerd's destination skips an endpoint whose
//! `ready` is false). So the choice is written as which clusters' slices of the import
//! are ready: this cluster's own endpoints (a copy of its exported Service's slices)
//! always keep their own conditions; a remote cluster's gateway endpoints are ready
//! only while that cluster *serves* ([`serving_remotes`]) and its gateway probe passes.
//! A remote that does not serve keeps its slice, addresses and all, with every endpoint
//! `ready: false, serving: false, terminating: false` (a standby: a failover is one
//! slice update, and an operator sees where traffic would go).
//!
//! The rules, for one import in one cluster:
//! - **`internalTrafficPolicy: Local`** (the exporters' Service): cluster-local, as
//!   Lighthouse defines it for imports (submariner-io/lighthouse#1989): no remote ever
//!   serves; only this cluster's own endpoints take traffic, none if it does not export
//!   the name. The derived Service itself is always `Cluster`: node-local on a Service
//!   whose endpoints are gateways and copies would drop traffic on every node without
//!   one, silently.
//! - **spread**: every remote serves (readiness by probe only): traffic splits by
//!   endpoint count, as before local-first.
//! - **local-first** (the default): while this cluster has at least `minimum` ready
//!   endpoints of its own for every port of the Service (its ports are the union of
//!   every cluster's: [`ready_endpoints_serving`]), no remote serves. Below that (its pods gone, or it does not
//!   export the name), the remotes serve by tier: the clusters of the priority list in
//!   its order, one tier each, then every other remote as the last tier; the first tier
//!   with a *usable* cluster (gateway reported, alive, an address not failing its
//!   probes) serves, and the tiers after it stand by. With no priority list every
//!   remote is one tier. With no usable remote at all, every remote serves (their
//!   probes already say not ready: nothing is hidden that could answer).
//! - A cluster's own endpoint count not known yet (its slices not listed since the
//!   start) decides nothing: the remote slices are left as they are.
//!
//! Which locality an import follows: this cluster's own ServiceExport's
//! [`LOCALITY_ANNOTATION`] if it has a valid one; else `local-first` if the import's
//! `trafficDistribution` asks for closeness (`PreferClose`, `PreferSameZone`,
//! `PreferSameNode`: the closest a remote cluster can be is this one); else the
//! controller's default (`--traffic-locality`). The minimum is that export's
//! [`LOCAL_MINIMUM_ANNOTATION`] (1 to [`MAX_LOCAL_MINIMUM`]), else 1.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::naming::fnv1a32;
use crate::slices::slice_name;

/// A ServiceExport annotation: `local-first` or `spread`, for this cluster's import of
/// the name.
pub const LOCALITY_ANNOTATION: &str = "service-mirror.io/locality";
/// A ServiceExport annotation: how many ready endpoints of its own this cluster needs
/// to keep its traffic local (local-first), 1 to [`MAX_LOCAL_MINIMUM`].
pub const LOCAL_MINIMUM_ANNOTATION: &str = "service-mirror.io/local-minimum";
/// The largest minimum: above it, a typo (an extra zero or three) would send every
/// request away for good; an EndpointSlice holds 1,000 endpoints by default.
pub const MAX_LOCAL_MINIMUM: u32 = 1000;
/// The minimum when none is given.
pub const DEFAULT_LOCAL_MINIMUM: u32 = 1;

/// Whether traffic stays in this cluster while it can.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Locality {
    /// This cluster's own endpoints while it has enough, the remotes by priority after.
    #[default]
    LocalFirst,
    /// Every cluster's endpoints alike.
    Spread,
}

impl Locality {
    /// The annotation's (and flag's) value: `local-first` or `spread`.
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim() {
            "local-first" => Some(Self::LocalFirst),
            "spread" => Some(Self::Spread),
            _ => None,
        }
    }

    /// The annotation's (and flag's) word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LocalFirst => "local-first",
            Self::Spread => "spread",
        }
    }
}

/// What this cluster's own ServiceExport of a name says of its traffic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportTraffic {
    /// Its valid [`LOCALITY_ANNOTATION`], if any.
    pub locality: Option<Locality>,
    /// Its valid [`LOCAL_MINIMUM_ANNOTATION`], else [`DEFAULT_LOCAL_MINIMUM`].
    pub minimum: u32,
    /// What was wrong with them, for people (an invalid value is ignored: the default
    /// holds). Empty when both are valid or absent.
    pub problems: Vec<String>,
}

/// Longest value quoted in a problem (an annotation is the tenant's text).
const MAX_QUOTED: usize = 40;

fn quoted(v: &str) -> String {
    match v.char_indices().nth(MAX_QUOTED) {
        None => format!("{v:?}"),
        Some((at, _)) => format!("{:?}...", &v[..at]),
    }
}

/// Reads an export's traffic annotations (`annotations`: its metadata's).
pub fn export_traffic(annotations: Option<&BTreeMap<String, String>>) -> ExportTraffic {
    let get = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
    let mut out = ExportTraffic {
        minimum: DEFAULT_LOCAL_MINIMUM,
        ..Default::default()
    };
    if let Some(v) = get(LOCALITY_ANNOTATION) {
        match Locality::parse(v) {
            Some(l) => out.locality = Some(l),
            None => out.problems.push(format!(
                "{LOCALITY_ANNOTATION} {} is neither local-first nor spread: ignored",
                quoted(v)
            )),
        }
    }
    if let Some(v) = get(LOCAL_MINIMUM_ANNOTATION) {
        match v.trim().parse::<u32>() {
            Ok(n) if (1..=MAX_LOCAL_MINIMUM).contains(&n) => out.minimum = n,
            _ => out.problems.push(format!(
                "{LOCAL_MINIMUM_ANNOTATION} {} is not a whole number from 1 to {MAX_LOCAL_MINIMUM}: the minimum is {DEFAULT_LOCAL_MINIMUM}",
                quoted(v)
            )),
        }
    }
    out
}

/// The controller's own settings: its default locality (`--traffic-locality`) and the
/// remote clusters in priority order (`--cluster-priority`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrafficDefaults {
    /// The locality of an import whose export says none.
    pub locality: Locality,
    /// The remote clusters in priority order.
    pub priority: Vec<String>,
}

/// Reads a priority list (`--cluster-priority`): cluster names separated by commas,
/// trimmed, empty entries ignored; each must be a cluster name, at most once.
pub fn parse_priority(value: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        crate::naming::validate_cluster_name(name)
            .map_err(|e| format!("{name:?} is not a cluster name: {e}"))?;
        if out.iter().any(|n| n == name) {
            return Err(format!("{name:?} is listed twice"));
        }
        out.push(name.to_owned());
    }
    Ok(out)
}

/// Everything that decides where one import's traffic goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrafficPolicy {
    /// `internalTrafficPolicy: Local` on the import: no remote ever serves.
    pub cluster_local: bool,
    /// Local-first or spread.
    pub locality: Locality,
    /// Ready endpoints of its own this cluster needs to keep its traffic (local-first).
    pub minimum: u32,
    /// The remote clusters in priority order (the first serves first); the others come
    /// after them, as one tier.
    pub priority: Vec<String>,
}

/// Whether `distribution` (a Service's `trafficDistribution`) asks for close endpoints.
fn prefers_close(distribution: Option<&str>) -> bool {
    matches!(
        distribution,
        Some("PreferClose" | "PreferSameZone" | "PreferSameNode")
    )
}

impl Default for TrafficPolicy {
    /// Local-first with a minimum of one, no priority list.
    fn default() -> Self {
        TrafficPolicy {
            cluster_local: false,
            locality: Locality::LocalFirst,
            minimum: DEFAULT_LOCAL_MINIMUM,
            priority: Vec::new(),
        }
    }
}

impl TrafficPolicy {
    /// Every cluster alike (before local-first: traffic split by endpoint count).
    pub fn spread() -> Self {
        TrafficPolicy {
            locality: Locality::Spread,
            ..Default::default()
        }
    }

    /// The policy of an import: `default` (the controller's locality), `priority` (the
    /// controller's list), `export` (this cluster's own export's annotations; default
    /// when it has none), and the import's `internalTrafficPolicy` and
    /// `trafficDistribution` (see the module doc for the order).
    pub fn of(
        default: Locality,
        priority: &[String],
        export: &ExportTraffic,
        internal_traffic_policy: Option<&str>,
        traffic_distribution: Option<&str>,
    ) -> Self {
        let locality = export
            .locality
            .unwrap_or(if prefers_close(traffic_distribution) {
                Locality::LocalFirst
            } else {
                default
            });
        TrafficPolicy {
            cluster_local: internal_traffic_policy == Some("Local"),
            locality,
            minimum: export.minimum.max(1),
            priority: priority.to_vec(),
        }
    }
}

/// Which remote clusters take an import's traffic (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Serving {
    /// Every remote (readiness by probe only).
    All,
    /// Only these (the others stand by).
    Only(BTreeSet<String>),
    /// Not known yet (this cluster's own endpoints not counted): leave the remote
    /// slices as they are.
    Undecided,
}

impl Serving {
    /// Whether `cluster` (a remote) serves; `None`: undecided.
    pub fn serves(&self, cluster: &str) -> Option<bool> {
        match self {
            Serving::All => Some(true),
            Serving::Only(set) => Some(set.contains(cluster)),
            Serving::Undecided => None,
        }
    }
}

/// Which of `remotes` (each: the cluster, and whether its gateway is usable now) take
/// the traffic of an import under `policy`, this cluster having `local_ready` ready
/// endpoints of its own (`None`: not counted yet).
pub fn serving_remotes(
    policy: &TrafficPolicy,
    local_ready: Option<usize>,
    remotes: &[(String, bool)],
) -> Serving {
    if policy.cluster_local {
        return Serving::Only(BTreeSet::new());
    }
    if policy.locality == Locality::Spread {
        return Serving::All;
    }
    let Some(local) = local_ready else {
        return Serving::Undecided;
    };
    if local >= policy.minimum as usize {
        return Serving::Only(BTreeSet::new());
    }
    let tier = |cluster: &str| {
        policy
            .priority
            .iter()
            .position(|c| c == cluster)
            .unwrap_or(policy.priority.len())
    };
    let Some(first) = remotes
        .iter()
        .filter(|(_, usable)| *usable)
        .map(|(c, _)| tier(c))
        .min()
    else {
        return Serving::All;
    };
    Serving::Only(
        remotes
            .iter()
            .filter(|(c, _)| tier(c) == first)
            .map(|(c, _)| c.clone())
            .collect(),
    )
}

/// The ready endpoints of this cluster's own slices of a Service (`ready` unset is
/// ready, as the API reads it), in the family that has the most: a dual-stack pod is
/// one endpoint in each family's slice, counted once.
pub fn ready_endpoints(slices: &[EndpointSlice]) -> usize {
    ready_in(slices.iter())
}

fn ready_in<'a>(slices: impl Iterator<Item = &'a EndpointSlice> + Clone) -> usize {
    let count = |family: &str| {
        slices
            .clone()
            .filter(|s| s.address_type == family)
            .flat_map(|s| &s.endpoints)
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
            .count()
    };
    count("IPv4").max(count("IPv6"))
}

/// The ready endpoints of this cluster's own slices that serve each of `ports` (the
/// names of the import's or federated Service's ports, `""` for an unnamed one): the
/// fewest over the ports. The Service's ports are the union of every cluster's, and
/// kube-proxy sends a port only to endpoints of slices that carry it: a port this
/// cluster does not serve counts 0 here, so the remotes that serve it are not stood by
/// (home "enough" for `http` must not cut off a `grpc` only a remote has). No ports:
/// every ready endpoint.
pub fn ready_endpoints_serving(slices: &[EndpointSlice], ports: &[String]) -> usize {
    let carries = |s: &EndpointSlice, port: &str| {
        s.ports
            .iter()
            .flatten()
            .any(|p| p.name.as_deref().unwrap_or_default() == port)
    };
    ports
        .iter()
        .map(|port| ready_in(slices.iter().filter(|s| carries(s, port))))
        .min()
        .unwrap_or_else(|| ready_endpoints(slices))
}

/// Orders `slices` so that those with a ready endpoint come first (stable otherwise):
/// the writes follow this order, so a switch makes the new side ready before the old
/// one stands by, and no instant has no ready endpoint (going home, the home copy is
/// written ready before the remote's standby; going away, the remote first).
pub fn ready_first(slices: &mut [EndpointSlice]) {
    let has_ready = |s: &EndpointSlice| {
        s.endpoints
            .iter()
            .any(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
    };
    slices.sort_by_key(|s| !has_ready(s));
}

/// A remote cluster standing by: its endpoints stay, none ready or serving (neither
/// kube-proxy nor Linkerd's destination sends to them), none terminating.
pub fn stand_by(slices: &mut [EndpointSlice]) {
    for e in slices.iter_mut().flat_map(|s| s.endpoints.iter_mut()) {
        e.conditions = Some(EndpointConditions {
            ready: Some(false),
            serving: Some(false),
            terminating: Some(false),
        });
    }
}

/// Copies of this cluster's own slices of a Service (ServiceImports and federated
/// Services both point at them, so kube-proxy reaches the local pods through the
/// ClusterSetIP or `<svc>-federated` directly): one per IPv4/IPv6 source slice, named
/// `<base>-<8 hex of its name>-<family>-0` (a source slice coming or going renames no
/// other copy, and a restart names them the same), with its endpoints' addresses,
/// conditions, hostname, node and zone and its ports, and `labels` and `annotations`.
///
/// The source is not ours and may be hand-written (a selector-less Service): a port
/// without a number is left out (Linkerd's destination dereferences the number of the
/// port it finds by name), and unset conditions are written as the API reads them
/// (`ready` unset is ready, `serving` unset is `ready`, `terminating` unset is false),
/// so every consumer reads the same.
pub fn copy_local_slices(
    namespace: &str,
    base: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    local: &[EndpointSlice],
) -> Vec<EndpointSlice> {
    let mut sources: Vec<&EndpointSlice> = local
        .iter()
        .filter(|s| matches!(s.address_type.as_str(), "IPv4" | "IPv6"))
        .collect();
    sources.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out = Vec::new();
    for source in sources {
        let family = match source.address_type.as_str() {
            "IPv6" => "ipv6",
            _ => "ipv4",
        };
        let name = source.metadata.name.as_deref().unwrap_or_default();
        let hash = fnv1a32(name.as_bytes());
        let endpoints = source
            .endpoints
            .iter()
            .map(|e| {
                let c = e.conditions.clone().unwrap_or_default();
                let ready = c.ready.unwrap_or(true);
                Endpoint {
                    addresses: e.addresses.clone(),
                    conditions: Some(EndpointConditions {
                        ready: Some(ready),
                        serving: Some(c.serving.unwrap_or(ready)),
                        terminating: Some(c.terminating.unwrap_or(false)),
                    }),
                    hostname: e.hostname.clone(),
                    node_name: e.node_name.clone(),
                    zone: e.zone.clone(),
                    ..Default::default()
                }
            })
            .collect();
        let ports: Vec<EndpointPort> = source
            .ports
            .iter()
            .flatten()
            .filter(|p| p.port.is_some_and(|n| (1..=65535).contains(&n)))
            .cloned()
            .collect();
        out.push(EndpointSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(&format!("{base}-{hash:08x}"), family, 0)),
                namespace: Some(namespace.to_owned()),
                labels: Some(labels.clone()),
                annotations: Some(annotations.clone()),
                ..Default::default()
            },
            address_type: source.address_type.clone(),
            endpoints,
            ports: Some(ports),
        });
    }
    out
}

#[cfg(test)]
#[path = "traffic_tests.rs"]
mod tests;
