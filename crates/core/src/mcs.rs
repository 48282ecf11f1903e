//! The Multi-Cluster Services API's merge rules (KEP-1645, "Constraints and Conflict
//! Resolution"): from the ServiceExports of one namespace/name as every cluster of the
//! set holds them (each with its own Service), the ServiceImport that every cluster,
//! the exporters included, holds, and the conditions each export carries.
//!
//! Each cluster's controller computes this from what it reads over its links (a full
//! mesh) and writes only its own cluster's objects, so every cluster must reach the same
//! answer from the same exports: the result depends on the set of exports, never on
//! their order, and precedence goes to the oldest export (`creationTimestamp`, then the
//! cluster name, so that two exports of one second stay ordered the same everywhere).
//!
//! A property that cannot merge is taken from the oldest export and raises a `Conflict`
//! on every export (the KEP's rule; Lighthouse once set it on the newer export only,
//! submariner-io/lighthouse#1831). Ports merge as a union by name: a name whose protocol
//! or number differs keeps the oldest export's, a port whose protocol and number another
//! name already holds is left out, and any export whose ports differ from the union
//! raises `PortConflict`.
//!
//! An export may narrow the clusters that import it ([`EXPORT_TO_ANNOTATION`]): each
//! cluster imports the merge of the exports that reach it ([`exports_reaching`]), while
//! every export's conditions come from the merge of all of them.

use k8s_openapi::api::core::v1::{Service, ServiceSpec, SessionAffinityConfig};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};

/// The API group of ServiceExport and ServiceImport.
pub use service_mirror_api::mcs::GROUP;
/// Label of an imported EndpointSlice (and of the ServiceImport's objects): the
/// imported Service's name.
pub const SERVICE_NAME_LABEL: &str = "multicluster.kubernetes.io/service-name";
/// Label of an imported EndpointSlice: the cluster its endpoints come from.
pub const SOURCE_CLUSTER_LABEL: &str = "multicluster.kubernetes.io/source-cluster";

/// Annotation of a ServiceExport narrowing the clusters that import it: a
/// comma-separated list of cluster names (as the cluster set names them: each
/// controller's `--mcs-cluster-name` or ClusterProperty `id.k8s.io`). See [`ExportTo`].
pub const EXPORT_TO_ANNOTATION: &str = "service-mirror.io/export-to";

/// The clusters an export reaches, from its [`EXPORT_TO_ANNOTATION`]. The exporting
/// cluster always imports its own export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExportTo {
    /// No annotation: every cluster of the set.
    Every,
    /// Exactly these clusters (and the exporter). Empty: no other cluster.
    Only(BTreeSet<String>),
    /// An annotation naming an invalid cluster name (the reason, naming them): no other
    /// cluster, never wider than asked.
    Invalid(String),
}

/// Longest list of offending names a reason quotes.
const MAX_QUOTED: usize = 200;

impl ExportTo {
    /// Of the annotation's value (`None`: absent). Names are trimmed and empty entries
    /// ignored (`""` and `","` name no other cluster); one name that is not a valid
    /// cluster name makes the whole annotation [`ExportTo::Invalid`].
    pub fn parse(value: Option<&str>) -> Self {
        let Some(value) = value else {
            return Self::Every;
        };
        let names: BTreeSet<String> = value
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        let bad: Vec<&str> = names
            .iter()
            .filter(|n| crate::naming::validate_cluster_name(n).is_err())
            .map(String::as_str)
            .collect();
        if bad.is_empty() {
            return Self::Only(names);
        }
        Self::Invalid(format!(
            "not valid cluster names: {}",
            bounded(&bad.join(", "), MAX_QUOTED)
        ))
    }

    /// Whether the export of `exporter` reaches `cluster`.
    pub fn reaches(&self, exporter: &str, cluster: &str) -> bool {
        exporter == cluster
            || match self {
                Self::Every => true,
                Self::Only(names) => names.contains(cluster),
                Self::Invalid(_) => false,
            }
    }
}

/// `s` cut to at most `max` characters (with `...` when cut).
fn bounded(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((at, _)) => format!("{}...", &s[..at]),
    }
}

/// The exports of `exports` that reach `cluster` (see [`ExportTo::reaches`]): what
/// `cluster`'s ServiceImport is merged from. The exports' own conditions are still
/// judged from the merge of every export.
pub fn exports_reaching(exports: &[ClusterExport], cluster: &str) -> Vec<ClusterExport> {
    exports
        .iter()
        .filter(|e| e.export_to.reaches(&e.cluster, cluster))
        .cloned()
        .collect()
}

/// One cluster's ServiceExport of a namespace/name, with what it exports.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterExport {
    /// The cluster holding the ServiceExport.
    pub cluster: String,
    /// The ServiceExport's `creationTimestamp`.
    pub created: Timestamp,
    /// `spec.exportedLabels`: the labels the ServiceImport carries.
    pub exported_labels: BTreeMap<String, String>,
    /// `spec.exportedAnnotations`: the annotations the ServiceImport carries.
    pub exported_annotations: BTreeMap<String, String>,
    /// The Service of the same namespace/name in that cluster, if there is one.
    pub service: Option<Service>,
    /// The clusters it reaches ([`EXPORT_TO_ANNOTATION`]).
    pub export_to: ExportTo,
}

/// The `Valid` condition of a ServiceExport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validity {
    /// Its Service exists and can be exported.
    Valid,
    /// No Service of that namespace/name in its cluster.
    NoService,
    /// An ExternalName Service: nothing to import (the KEP leaves it out).
    InvalidServiceType,
}

impl Validity {
    /// Of `export`.
    pub fn of(export: &ClusterExport) -> Self {
        match &export.service {
            None => Self::NoService,
            Some(s) if service_type(s) == Some("ExternalName") => Self::InvalidServiceType,
            Some(_) => Self::Valid,
        }
    }

    /// The condition's status.
    pub fn is_valid(self) -> bool {
        self == Self::Valid
    }

    /// The condition's reason (the KEP's words).
    pub fn reason(self) -> &'static str {
        match self {
            Self::Valid => "Valid",
            Self::NoService => "NoService",
            Self::InvalidServiceType => "InvalidServiceType",
        }
    }
}

/// `ServiceImport.spec.type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportType {
    /// One virtual IP for the whole set (ClusterIP, NodePort and LoadBalancer exports).
    ClusterSetIp,
    /// No virtual IP: DNS names the endpoints (`clusterIP: None`).
    Headless,
}

impl ImportType {
    /// Of a Service that can be exported.
    pub fn of(service: &Service) -> Self {
        let none = service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None");
        if none {
            Self::Headless
        } else {
            Self::ClusterSetIp
        }
    }

    /// As the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClusterSetIp => "ClusterSetIP",
            Self::Headless => "Headless",
        }
    }
}

/// A port of a ServiceImport: a Service port without `targetPort` or `nodePort`
/// (those belong to each cluster; mcs-api#93, cilium#36735).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ImportPort {
    /// Its name (`""`: the one port of a single-port Service).
    pub name: String,
    /// `TCP`, `UDP` or `SCTP` (`TCP` when the Service left it out).
    pub protocol: String,
    /// The port number.
    pub port: i32,
    /// `appProtocol`, if given.
    pub app_protocol: Option<String>,
}

/// A property that differs between exports, each with the KEP's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Conflict {
    /// `PortConflict`.
    Port,
    /// `TypeConflict`: headless and not.
    Type,
    /// `SessionAffinityConflict`.
    SessionAffinity,
    /// `SessionAffinityConfigConflict`.
    SessionAffinityConfig,
    /// `LabelsConflict`: different `exportedLabels`.
    Labels,
    /// `AnnotationsConflict`: different `exportedAnnotations`.
    Annotations,
    /// `InternalTrafficPolicyConflict`.
    InternalTrafficPolicy,
    /// `TrafficDistributionConflict`.
    TrafficDistribution,
    /// `IPFamilyConflict`.
    IpFamily,
}

impl Conflict {
    /// The KEP's reason.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Port => "PortConflict",
            Self::Type => "TypeConflict",
            Self::SessionAffinity => "SessionAffinityConflict",
            Self::SessionAffinityConfig => "SessionAffinityConfigConflict",
            Self::Labels => "LabelsConflict",
            Self::Annotations => "AnnotationsConflict",
            Self::InternalTrafficPolicy => "InternalTrafficPolicyConflict",
            Self::TrafficDistribution => "TrafficDistributionConflict",
            Self::IpFamily => "IPFamilyConflict",
        }
    }
}

/// The reason of the `Conflict` condition for `conflicts`: `NoConflicts` (status
/// False), else their reasons joined by commas in a fixed order (status True).
pub fn conflict_reason(conflicts: &BTreeSet<Conflict>) -> String {
    if conflicts.is_empty() {
        return "NoConflicts".into();
    }
    conflicts
        .iter()
        .map(|c| c.reason())
        .collect::<Vec<_>>()
        .join(",")
}

/// What a ServiceImport carries besides its IPs (those are the derived local Service's
/// ClusterIPs, known only once that Service exists).
#[derive(Clone, Debug, PartialEq)]
pub struct ImportSpec {
    /// `spec.type`.
    pub type_: ImportType,
    /// `spec.ports`: the union, oldest export first.
    pub ports: Vec<ImportPort>,
    /// `spec.sessionAffinity`.
    pub session_affinity: Option<String>,
    /// `spec.sessionAffinityConfig`.
    pub session_affinity_config: Option<SessionAffinityConfig>,
    /// `spec.internalTrafficPolicy`.
    pub internal_traffic_policy: Option<String>,
    /// `spec.trafficDistribution`.
    pub traffic_distribution: Option<String>,
    /// `spec.ipFamilies` of the oldest export's Service.
    pub ip_families: Vec<String>,
    /// The oldest export's `exportedLabels`.
    pub labels: BTreeMap<String, String>,
    /// The oldest export's `exportedAnnotations`.
    pub annotations: BTreeMap<String, String>,
}

/// The merge of every export of one namespace/name.
#[derive(Clone, Debug, PartialEq)]
pub struct Merge {
    /// The ServiceImport every cluster holds; None when no export is valid (no
    /// ServiceImport anywhere: an existing one goes).
    pub import: Option<ImportSpec>,
    /// The clusters whose export is valid, by name (`status.clusters`).
    pub clusters: Vec<String>,
    /// The `Conflict` condition of every valid export (empty: `NoConflicts`).
    pub conflicts: BTreeSet<Conflict>,
}

/// Merges the exports of one namespace/name from every cluster (at most one each; the
/// order does not matter).
pub fn merge(exports: &[ClusterExport]) -> Merge {
    let mut valid: Vec<(&ClusterExport, &Service)> = exports
        .iter()
        .filter(|e| Validity::of(e).is_valid())
        .filter_map(|e| e.service.as_ref().map(|s| (e, s)))
        .collect();
    valid.sort_by(|a, b| (a.0.created, &a.0.cluster).cmp(&(b.0.created, &b.0.cluster)));
    let mut clusters: Vec<String> = valid.iter().map(|(e, _)| e.cluster.clone()).collect();
    clusters.sort();
    clusters.dedup();
    let Some(&(oldest, oldest_svc)) = valid.first() else {
        return Merge {
            import: None,
            clusters,
            conflicts: BTreeSet::new(),
        };
    };
    let spec = |s: &Service| s.spec.clone().unwrap_or_default();
    let first = spec(oldest_svc);
    let mut conflicts = BTreeSet::new();
    for &(e, s) in &valid[1..] {
        let other = spec(s);
        let families = |s: &ServiceSpec| s.ip_families.clone().unwrap_or_default();
        let same = [
            (
                Conflict::Type,
                ImportType::of(s) == ImportType::of(oldest_svc),
            ),
            (
                Conflict::SessionAffinity,
                affinity(&other.session_affinity) == affinity(&first.session_affinity),
            ),
            (
                Conflict::SessionAffinityConfig,
                other.session_affinity_config == first.session_affinity_config,
            ),
            (
                Conflict::InternalTrafficPolicy,
                traffic_policy(&other.internal_traffic_policy)
                    == traffic_policy(&first.internal_traffic_policy),
            ),
            (
                Conflict::TrafficDistribution,
                other.traffic_distribution == first.traffic_distribution,
            ),
            (Conflict::IpFamily, families(&other) == families(&first)),
            (
                Conflict::Labels,
                e.exported_labels == oldest.exported_labels,
            ),
            (
                Conflict::Annotations,
                e.exported_annotations == oldest.exported_annotations,
            ),
        ];
        conflicts.extend(same.into_iter().filter(|(_, same)| !same).map(|(c, _)| c));
    }
    let ports = union_of_ports(valid.iter().map(|(_, s)| import_ports(s)));
    let union: BTreeSet<&ImportPort> = ports.iter().collect();
    if valid
        .iter()
        .any(|(_, s)| import_ports(s).iter().collect::<BTreeSet<_>>() != union)
    {
        conflicts.insert(Conflict::Port);
    }
    Merge {
        import: Some(ImportSpec {
            type_: ImportType::of(oldest_svc),
            ports,
            session_affinity: first.session_affinity.clone(),
            session_affinity_config: first.session_affinity_config.clone(),
            internal_traffic_policy: first.internal_traffic_policy.clone(),
            traffic_distribution: first.traffic_distribution.clone(),
            ip_families: first.ip_families.clone().unwrap_or_default(),
            labels: oldest.exported_labels.clone(),
            annotations: oldest.exported_annotations.clone(),
        }),
        clusters,
        conflicts,
    }
}

/// One condition of a ServiceExport's status, without its transition time (see
/// [`with_transition_times`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportCondition {
    /// `Valid`, `Ready` or `Conflict`.
    pub type_: &'static str,
    /// `True` or `False`.
    pub status: bool,
    /// The KEP's reason.
    pub reason: String,
    /// For people.
    pub message: String,
}

/// The conditions the exporting cluster writes on its ServiceExport of `cluster`, from
/// its validity and the merge of every export of the name (unfiltered by
/// [`EXPORT_TO_ANNOTATION`]: they describe the name across the cluster set, while each
/// cluster imports the merge of [`exports_reaching`] it): `Valid`; `Ready` (True,
/// `Exported`, once valid: the merge is what every cluster the exports reach imports; False, `Failed`,
/// otherwise); `Conflict` (valid exports only: the same on every export).
pub fn export_conditions(validity: Validity, merge: &Merge) -> Vec<ExportCondition> {
    let valid = validity.is_valid();
    let mut conditions = vec![
        ExportCondition {
            type_: "Valid",
            status: valid,
            reason: validity.reason().into(),
            message: match validity {
                Validity::Valid => "the Service can be exported".into(),
                Validity::NoService => "no Service of this name in this namespace".into(),
                Validity::InvalidServiceType => "an ExternalName Service cannot be exported".into(),
            },
        },
        ExportCondition {
            type_: "Ready",
            status: valid,
            reason: if valid { "Exported" } else { "Failed" }.into(),
            message: if valid {
                format!("imported from {} cluster(s)", merge.clusters.len())
            } else {
                "not exported: see the Valid condition".into()
            },
        },
    ];
    if valid {
        conditions.push(ExportCondition {
            type_: "Conflict",
            status: !merge.conflicts.is_empty(),
            reason: conflict_reason(&merge.conflicts),
            message: match merge.conflicts.is_empty() {
                true => "every export of this name agrees".into(),
                false => format!(
                    "the exports of this name differ ({}): the oldest export's value is imported (where it reaches)",
                    conflict_reason(&merge.conflicts)
                ),
            },
        });
    }
    conditions
}

/// The condition types [`export_conditions`] writes; others on an export are left as
/// they are.
pub const EXPORT_CONDITION_TYPES: [&str; 3] = ["Valid", "Ready", "Conflict"];

/// `desired` as `metav1.Condition`s at `now`, keeping the transition time of each
/// condition of `current` whose status is unchanged (the API's rule: the time says when
/// the status last changed, not when it was last written), and every condition of a
/// type not ours; returns None when `current` already says exactly that, so an
/// unchanged export writes nothing.
pub fn with_transition_times(
    current: &[Condition],
    desired: &[ExportCondition],
    now: Timestamp,
) -> Option<Vec<Condition>> {
    let theirs = current
        .iter()
        .filter(|c| !EXPORT_CONDITION_TYPES.contains(&c.type_.as_str()))
        .cloned();
    let next: Vec<Condition> = desired
        .iter()
        .map(|d| {
            let status = if d.status { "True" } else { "False" };
            let since = current
                .iter()
                .find(|c| c.type_ == d.type_ && c.status == status)
                .map_or(Time(now), |c| c.last_transition_time.clone());
            Condition {
                type_: d.type_.into(),
                status: status.into(),
                reason: d.reason.clone(),
                message: d.message.clone(),
                last_transition_time: since,
                observed_generation: None,
            }
        })
        .chain(theirs)
        .collect();
    let same = next.len() == current.len()
        && next.iter().all(|n| {
            current.iter().any(|c| {
                c.type_ == n.type_
                    && c.status == n.status
                    && c.reason == n.reason
                    && c.message == n.message
            })
        });
    (!same).then_some(next)
}

/// The ports of `service` as a ServiceImport lists them.
pub fn import_ports(service: &Service) -> Vec<ImportPort> {
    service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|p| ImportPort {
            name: p.name.clone().unwrap_or_default(),
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            port: p.port,
            app_protocol: p.app_protocol.clone(),
        })
        .collect()
}

/// The union of port lists, oldest first: a name keeps its first definition, and a
/// port whose protocol and number an earlier name holds is left out (a Service cannot
/// serve one protocol and number under two names).
fn union_of_ports(lists: impl Iterator<Item = Vec<ImportPort>>) -> Vec<ImportPort> {
    let mut union: Vec<ImportPort> = Vec::new();
    for list in lists {
        for p in list {
            let taken = union
                .iter()
                .any(|u| u.name == p.name || (u.protocol == p.protocol && u.port == p.port));
            if !taken {
                union.push(p);
            }
        }
    }
    union
}

/// `sessionAffinity` as the apiserver defaults it (`None` when left out).
fn affinity(a: &Option<String>) -> &str {
    a.as_deref().unwrap_or("None")
}

/// `internalTrafficPolicy` as the apiserver defaults it (`Cluster` when left out).
fn traffic_policy(p: &Option<String>) -> &str {
    p.as_deref().unwrap_or("Cluster")
}

fn service_type(s: &Service) -> Option<&str> {
    s.spec.as_ref().and_then(|s| s.type_.as_deref())
}

#[cfg(test)]
#[path = "mcs_tests.rs"]
mod tests;
