//! Federated services: one local Service, `<svc>-federated`, for a Service that runs in
//! several clusters (Linkerd 2.17+ names and annotations), plus, beyond Linkerd, one
//! EndpointSlice per remote member cluster pointing at that cluster's gateway, so that
//! any client kube-proxy serves reaches every member through the gateways.
//!
//! Pure: the members (remote Services matching a Link's `federatedServiceSelector`, and
//! local ones matching `--federated-service-selector`) and the member clusters'
//! gateways give the desired Service and slices ([`desired_federated`]); comparing
//! them with the stored ones gives the writes ([`plan_federated`]). Equal inputs give
//! no action: the remote-discovery annotation is sorted, ports keep a fixed order.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;

use super::action::{Action, Object, ObjectKind, ObjectRef};
use super::desired::{ResourceStyle, target_port_or_default};
use super::diff::{MetadataOwnership, service_update_with};
use super::gateway::ResolvedGateway;
use super::gateway_slices::{GatewaySlices, delete_slice, gateway_slices, plan_slices};
use super::labels::{
    CLUSTER_NAME_LABEL, CONTROLLER_NAMESPACE_ANNOTATION, FEDERATED_CLUSTER_LABEL, FEDERATED_LABEL,
    FEDERATED_SUFFIX, FEDERATED_VALUE, LOCAL_DISCOVERY_ANNOTATION, MANAGED_BY_LABEL,
    MANAGED_BY_VALUE, MIRRORED_SERVICE_LABEL, MIRRORED_SERVICE_VALUE, REMOTE_DISCOVERY_ANNOTATION,
    REMOTE_GATEWAY_IDENTITY_ANNOTATION, REMOTE_SVC_FQ_NAME_ANNOTATION, SERVICE_NAME_LABEL,
};
use super::metadata::{copied_annotations, copied_labels};
use super::naming::{fnv1a32, fq_name, mirror_name};
use super::ownership::is_owned_federated;
use super::traffic::{
    TrafficPolicy, copy_local_slices, ready_endpoints_serving, ready_first, serving_remotes,
    stand_by,
};

/// The key of the local member's copies in [`DesiredFederation::untouched_slices`]: they
/// carry no federated-cluster label (no cluster name is empty).
pub const LOCAL_SLICES: &str = "";

/// The name of the federated Service of local name `svc`: `<svc>-federated`, through
/// the mirror names' 63-character rule.
pub fn federated_name(svc: &str) -> String {
    mirror_name(svc, FEDERATED_SUFFIX)
}

/// One member of a federated Service.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// The member's cluster: `None` for the local cluster.
    pub cluster: Option<String>,
    /// Creation time of the Link that links the cluster (`None`: unknown, or local).
    /// The oldest Link's member gives the metadata, after the local one.
    pub link_created: Option<Timestamp>,
    /// The remote cluster's DNS domain (for the slices' `remote-svc-fq-name`).
    pub domain: String,
    /// The Link's `excludedLabels` / `excludedAnnotations` (empty for the local member).
    pub exclusions: ResourceStyle,
    /// The member Service as listed.
    pub service: Service,
}

impl Member {
    /// `<svc>@<cluster>`, or `<svc>@local` for the local member (Events and logs).
    pub fn id(&self) -> String {
        let name = self.service.metadata.name.as_deref().unwrap_or_default();
        format!("{name}@{}", self.cluster.as_deref().unwrap_or("local"))
    }

    /// Precedence: local first, then the oldest Link, then (a tie, or unknown times)
    /// the cluster name. Unknown times sort after every known one.
    fn precedence(&self) -> (bool, bool, Option<Timestamp>, Option<&str>) {
        (
            self.cluster.is_some(),
            self.link_created.is_none(),
            self.link_created,
            self.cluster.as_deref(),
        )
    }
}

/// Why a member is not part of its federated Service (reported, others unaffected).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MemberRefusal {
    /// `clusterIP: None`: a headless Service has no one address to federate (Linkerd
    /// refuses it too).
    Headless,
    /// No ports: the federated Service would have none from it.
    NoPorts,
}

impl MemberRefusal {
    /// Bounded label (metric `reason`), the same for every refusal: Linkerd's Event
    /// reason.
    pub fn reason(self) -> &'static str {
        "InvalidService"
    }

    /// What is wrong, for the Event note.
    pub fn detail(self) -> &'static str {
        match self {
            MemberRefusal::Headless => "headless Services (clusterIP: None) cannot be federated",
            MemberRefusal::NoPorts => "a Service without ports cannot be federated",
        }
    }
}

/// Everything the desired federated Service depends on.
#[derive(Debug, Clone, Copy)]
pub struct FederationInput<'a> {
    /// Namespace of the members and of the federated Service.
    pub namespace: &'a str,
    /// The members' name (`<svc>`).
    pub name: &'a str,
    /// Every member seen (refused ones included, in any order).
    pub members: &'a [Member],
    /// The gateway of each remote member cluster, as its link reports it (absent: not
    /// reported yet).
    pub gateways: &'a BTreeMap<String, ResolvedGateway>,
    /// Clusters linked but whose membership is not known yet (no complete remote list
    /// since the start): their entries of the stored annotation are kept, their slices
    /// left alone.
    pub pending: &'a BTreeSet<String>,
    /// Our controller namespace (the ownership annotation).
    pub controller_namespace: &'a str,
    /// The local member's own EndpointSlices (`None`: not listed yet), copied into
    /// `<svc>-federated`'s slices so kube-proxy reaches the local pods too.
    pub local_slices: Option<&'a [EndpointSlice]>,
    /// Where its traffic goes (`core::traffic`): which remote member clusters' slices
    /// are ready.
    pub traffic: &'a TrafficPolicy,
}

/// What the federated Service should be.
#[derive(Debug, Clone, PartialEq)]
pub enum DesiredService {
    /// No member: no federated Service.
    Absent,
    /// A pending cluster's entry is stored: leave the stored Service as it is (its
    /// slices are still planned).
    Keep,
    /// This Service (no resourceVersion or uid).
    Present(Box<Service>),
}

/// The desired federated objects of one `<namespace>/<svc>`, and what to report.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredFederation {
    /// `<svc>-federated` (63-character rule).
    pub name: String,
    /// The Service.
    pub service: DesiredService,
    /// One slice per address family per remote member cluster with a known gateway
    /// (owner uid empty: [`plan_federated`] fills in the stored Service's).
    pub slices: Vec<EndpointSlice>,
    /// Clusters whose slices are left as they are (pending, or gateway not reported);
    /// [`LOCAL_SLICES`] for the local member's copies (its slices not listed yet).
    pub untouched_slices: BTreeSet<String>,
    /// Refused members (`<svc>@<cluster>`) and why.
    pub refused: Vec<(String, MemberRefusal)>,
    /// Ports of later members that could not join the union (a name or a port number
    /// taken with other settings), as `<svc>@<cluster>: <port>`.
    pub conflicts: Vec<String>,
}

/// The `<svc>@<cluster>` entries of a stored remote-discovery annotation.
fn entries(annotation: Option<&str>) -> BTreeSet<String> {
    annotation
        .into_iter()
        .flat_map(|a| a.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect()
}

fn refusal(svc: &Service) -> Option<MemberRefusal> {
    let spec = svc.spec.as_ref();
    if spec.and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
        return Some(MemberRefusal::Headless);
    }
    let ports = spec.and_then(|s| s.ports.as_ref());
    ports
        .is_none_or(Vec::is_empty)
        .then_some(MemberRefusal::NoPorts)
}

fn port_desc(p: &ServicePort) -> String {
    let proto = p.protocol.as_deref().unwrap_or("TCP");
    match p.name.as_deref() {
        Some(n) if !n.is_empty() => format!("{n} {}/{proto}", p.port),
        _ => format!("{}/{proto}", p.port),
    }
}

/// The union of the members' ports, in precedence order: the first member's as they
/// are, then each later port whose name and (port, protocol) are both new. A later
/// port that reuses one with other settings is a conflict (kept out, reported).
fn port_union(members: &[&Member]) -> (Vec<ServicePort>, Vec<String>) {
    let (mut ports, mut conflicts) = (Vec::<ServicePort>::new(), Vec::new());
    let proto = |p: &ServicePort| p.protocol.clone().unwrap_or_else(|| "TCP".into());
    let name = |p: &ServicePort| p.name.clone().unwrap_or_default();
    for m in members {
        let theirs = m.service.spec.as_ref().and_then(|s| s.ports.as_ref());
        for p in theirs.into_iter().flatten() {
            // targetPort as the member has it (Linkerd's `remapRemoteServicePorts`
            // copies it). Informational only: the Service has no selector, so
            // kube-proxy takes the port from the slices, and Linkerd's destination
            // looks the Service port up by name in the slices (`getTargetPort`).
            let wanted = ServicePort {
                name: p.name.clone().filter(|n| !n.is_empty()),
                port: p.port,
                protocol: Some(proto(p)),
                app_protocol: p.app_protocol.clone(),
                target_port: Some(target_port_or_default(p.target_port.as_ref(), p.port)),
                ..Default::default()
            };
            let same_name = ports.iter().find(|q| name(q) == name(&wanted));
            let same_number = ports
                .iter()
                .find(|q| q.port == wanted.port && proto(q) == proto(&wanted));
            // A Service of several ports needs every one named.
            let unnamed = name(&wanted).is_empty() || ports.iter().any(|q| name(q).is_empty());
            match (same_name, same_number) {
                (Some(a), Some(b)) if std::ptr::eq(a, b) => {}
                (None, None) if ports.is_empty() || !unnamed => ports.push(wanted),
                _ => conflicts.push(format!("{}: {}", m.id(), port_desc(p))),
            }
        }
    }
    (ports, conflicts)
}

/// The desired federated objects (see the module doc).
pub fn desired_federated(
    input: &FederationInput<'_>,
    stored_remote_discovery: Option<&str>,
) -> DesiredFederation {
    let name = federated_name(input.name);
    let mut refused = Vec::new();
    let mut live: Vec<&Member> = Vec::new();
    for m in input.members {
        match refusal(&m.service) {
            Some(r) => refused.push((m.id(), r)),
            None => live.push(m),
        }
    }
    live.sort_by(|a, b| a.precedence().cmp(&b.precedence()));
    refused.sort();
    let mut remote: BTreeSet<String> = live
        .iter()
        .filter_map(|m| m.cluster.as_ref())
        .map(|c| format!("{}@{c}", input.name))
        .collect();
    // A pending cluster's stored entries stay until its list says otherwise.
    let kept: BTreeSet<String> = entries(stored_remote_discovery)
        .into_iter()
        .filter(|e| {
            e.rsplit_once('@')
                .is_some_and(|(_, c)| input.pending.contains(c))
        })
        .collect();
    remote.extend(kept.iter().cloned());
    let mut untouched_slices: BTreeSet<String> = input.pending.clone();
    let Some(primary) = live.first() else {
        let service = match kept.is_empty() {
            true => DesiredService::Absent,
            false => DesiredService::Keep,
        };
        return DesiredFederation {
            name,
            service,
            slices: Vec::new(),
            untouched_slices,
            refused,
            conflicts: Vec::new(),
        };
    };
    let (ports, conflicts) = port_union(&live);

    let style = &primary.exclusions;
    let mut labels = copied_labels(&primary.service.metadata, &style.excluded_labels);
    labels.insert(MIRRORED_SERVICE_LABEL.into(), MIRRORED_SERVICE_VALUE.into());
    labels.insert(FEDERATED_LABEL.into(), FEDERATED_VALUE.into());
    let owned = [
        REMOTE_DISCOVERY_ANNOTATION,
        LOCAL_DISCOVERY_ANNOTATION,
        CONTROLLER_NAMESPACE_ANNOTATION,
        REMOTE_SVC_FQ_NAME_ANNOTATION,
    ];
    let mut annotations = copied_annotations(
        &primary.service.metadata,
        &style.excluded_annotations,
        &owned,
    );
    // Linkerd copies no `mirror.linkerd.io*` key (export and probe settings).
    annotations.retain(|k, _| !k.starts_with(super::labels::SVC_MIRROR_PREFIX));
    if !remote.is_empty() {
        let list: Vec<String> = remote.into_iter().collect();
        annotations.insert(REMOTE_DISCOVERY_ANNOTATION.into(), list.join(","));
    }
    if live.iter().any(|m| m.cluster.is_none()) {
        annotations.insert(LOCAL_DISCOVERY_ANNOTATION.into(), input.name.into());
    }
    annotations.insert(
        CONTROLLER_NAMESPACE_ANNOTATION.into(),
        input.controller_namespace.into(),
    );
    let service = Service {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(input.namespace.into()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            ports: Some(ports.clone()),
            ..Default::default()
        }),
        status: None,
    };

    let local_live = live.iter().any(|m| m.cluster.is_none());
    let local_ready = match (local_live, input.local_slices) {
        (false, _) => Some(0),
        (true, slices) => {
            let names: Vec<String> = ports
                .iter()
                .map(|p| p.name.clone().unwrap_or_default())
                .collect();
            slices.map(|l| ready_endpoints_serving(l, &names))
        }
    };
    let remotes: Vec<(String, bool)> = live
        .iter()
        .filter_map(|m| m.cluster.clone())
        .map(|c| {
            let usable = input
                .gateways
                .get(&c)
                .is_some_and(|g| g.alive && g.addresses.iter().any(|a| g.is_ready(a)));
            (c, usable)
        })
        .collect();
    let serving = serving_remotes(input.traffic, local_ready, &remotes);
    let mut slices = Vec::new();
    if local_live {
        match input.local_slices {
            Some(local) => slices.extend(local_copies(input, &name, local)),
            None => {
                untouched_slices.insert(LOCAL_SLICES.to_owned());
            }
        }
    }
    for m in &live {
        let Some(cluster) = m.cluster.as_deref() else {
            continue;
        };
        match (input.gateways.get(cluster), serving.serves(cluster)) {
            (Some(gw), Some(serves)) => {
                let mut theirs = member_slices(input, &name, m, cluster, gw, &ports);
                if !serves {
                    stand_by(&mut theirs);
                }
                slices.extend(theirs);
            }
            // Not reported yet, or this cluster's own endpoints not counted yet.
            _ => {
                untouched_slices.insert(cluster.to_owned());
            }
        }
    }
    ready_first(&mut slices);
    // A cluster of the stored annotation that has not listed, and of which no member is
    // known (a start: it may give the metadata or ports, and a restart must write
    // nothing), leaves the Service as it is. A pending cluster whose last known member
    // is here (a relist, a held list, a reconnect) takes part with that member, so the
    // other clusters' changes land meanwhile. Slices still follow the gateways.
    let known: BTreeSet<&str> = live.iter().filter_map(|m| m.cluster.as_deref()).collect();
    let unknown = kept
        .iter()
        .any(|e| e.rsplit_once('@').is_some_and(|(_, c)| !known.contains(c)));
    let service = match unknown {
        false => DesiredService::Present(Box::new(service)),
        true => DesiredService::Keep,
    };
    DesiredFederation {
        name,
        service,
        slices,
        untouched_slices,
        refused,
        conflicts,
    }
}

/// The longest `<svc>-federated` kept whole in its local copies' names:
/// `<fed>.local-<8 hex>-ipv4-0` stays within 63 characters.
const MAX_FED_IN_LOCAL_NAME: usize = 41;

/// The local member's copies: labelled for `<svc>-federated` (service name, managed-by,
/// our federated mark), annotated with our namespace and `local-discovery: <svc>` (what
/// maps a stored copy back to its key), with no cluster label (Linkerd's destination
/// reads `cluster-name` as remote) and named `<fed>.local-...`: the dot keeps the name
/// apart from every remote cluster's (`<fed>-<cluster>-...`), as no cluster name has one.
fn local_copies(
    input: &FederationInput<'_>,
    fed: &str,
    local: &[EndpointSlice],
) -> Vec<EndpointSlice> {
    let labels = BTreeMap::from([
        (SERVICE_NAME_LABEL.to_owned(), fed.to_owned()),
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
        (FEDERATED_LABEL.to_owned(), FEDERATED_VALUE.to_owned()),
    ]);
    let annotations = BTreeMap::from([
        (
            CONTROLLER_NAMESPACE_ANNOTATION.to_owned(),
            input.controller_namespace.to_owned(),
        ),
        (LOCAL_DISCOVERY_ANNOTATION.to_owned(), input.name.to_owned()),
    ]);
    let fed_part = match fed.len() <= MAX_FED_IN_LOCAL_NAME {
        true => fed.to_owned(),
        false => format!(
            "{}-{:08x}",
            fed[..MAX_FED_IN_LOCAL_NAME - 9].trim_end_matches('-'),
            fnv1a32(fed.as_bytes())
        ),
    };
    copy_local_slices(
        input.namespace,
        &format!("{fed_part}.local"),
        &labels,
        &annotations,
        local,
    )
}

fn member_slices(
    input: &FederationInput<'_>,
    fed: &str,
    member: &Member,
    cluster: &str,
    gw: &ResolvedGateway,
    ports: &[ServicePort],
) -> Vec<EndpointSlice> {
    let mut labels = BTreeMap::new();
    labels.insert(SERVICE_NAME_LABEL.to_owned(), fed.to_owned());
    labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned());
    labels.insert(FEDERATED_LABEL.to_owned(), FEDERATED_VALUE.to_owned());
    labels.insert(FEDERATED_CLUSTER_LABEL.to_owned(), cluster.to_owned());
    // Linkerd's destination reads `cluster-name` on a slice as "mirrored from that
    // cluster" and labels its metrics `dst_target_cluster` (and, from the fq-name,
    // `dst_target_service` / `dst_target_service_namespace`). One of a link's
    // ownership labels, but ownership needs `mirrored-service: "true"` too (`is_owned`,
    // `owner_selector`, `slice_owner_selector`, the collector's selectors), which a
    // federated slice never carries: no link adopts, rewrites or deletes it.
    labels.insert(CLUSTER_NAME_LABEL.to_owned(), cluster.to_owned());
    let mut annotations = BTreeMap::new();
    annotations.insert(
        REMOTE_SVC_FQ_NAME_ANNOTATION.to_owned(),
        fq_name(input.name, input.namespace, &member.domain),
    );
    annotations.insert(
        CONTROLLER_NAMESPACE_ANNOTATION.to_owned(),
        input.controller_namespace.to_owned(),
    );
    if let Some(id) = &gw.identity {
        annotations.insert(REMOTE_GATEWAY_IDENTITY_ANNOTATION.to_owned(), id.clone());
    }
    let ports: Vec<(String, String)> = ports
        .iter()
        .map(|p| {
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            (p.name.clone().unwrap_or_default(), protocol)
        })
        .collect();
    gateway_slices(&GatewaySlices {
        namespace: input.namespace,
        base: &format!("{fed}-{cluster}"),
        labels: &labels,
        annotations: &annotations,
        gateway: gw,
        ports: &ports,
    })
}

/// The writes of one federated Service.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FederatedPlan {
    /// In order.
    pub actions: Vec<Action>,
    /// A `<svc>-federated` exists that is not ours: nothing is written (reported).
    pub foreign: bool,
}

/// The writes that bring the stored federated Service (`stored`, by its name, ours or
/// not) and our stored slices of it (`stored_slices`) to `desired`. Slices are created
/// once the stored Service has a uid (they name it as their owner): a new Service's
/// slices come on the pass its watch event brings. Never touches a foreign Service, a
/// slice that is not ours, or the slices of [`DesiredFederation::untouched_slices`].
pub fn plan_federated(
    desired: &DesiredFederation,
    stored: Option<&Service>,
    stored_slices: &[EndpointSlice],
    controller_namespace: &str,
) -> FederatedPlan {
    let ours = |m: &ObjectMeta| is_owned_federated(m, controller_namespace);
    if let Some(s) = stored
        && !ours(&s.metadata)
    {
        let foreign = !matches!(desired.service, DesiredService::Absent);
        return FederatedPlan {
            actions: Vec::new(),
            foreign,
        };
    }
    let slices: Vec<&EndpointSlice> = stored_slices
        .iter()
        .filter(|s| {
            ours(&s.metadata)
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    == Some(&desired.name)
        })
        .collect();
    let cluster_of = |s: &EndpointSlice| {
        s.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(FEDERATED_CLUSTER_LABEL))
            .cloned()
            .unwrap_or_default()
    };
    let mut actions = Vec::new();
    match (&desired.service, stored) {
        (DesiredService::Keep, None) | (DesiredService::Absent, None) => {}
        (DesiredService::Absent, Some(svc)) => {
            actions.extend(slices.iter().map(|s| delete_slice(s)));
            actions.push(Action::Delete(ObjectRef {
                kind: ObjectKind::Service,
                namespace: svc.metadata.namespace.clone().unwrap_or_default(),
                name: svc.metadata.name.clone().unwrap_or_default(),
                uid: svc.metadata.uid.clone(),
                resource_version: svc.metadata.resource_version.clone(),
            }));
        }
        (DesiredService::Present(want), None) => {
            actions.push(Action::Create(Object::Service((**want).clone())));
        }
        (want, Some(svc)) => {
            if let DesiredService::Present(want) = want
                && let Some(updated) = service_update_with(svc, want, MetadataOwnership::All)
            {
                actions.push(Action::Update(Object::Service(updated)));
            }
            let uid = svc.metadata.uid.clone().unwrap_or_default();
            let owner = OwnerReference {
                api_version: "v1".into(),
                kind: "Service".into(),
                name: desired.name.clone(),
                uid,
                controller: Some(true),
                block_owner_deletion: None,
            };
            actions.extend(plan_slices(&desired.slices, &slices, &owner, |s| {
                desired.untouched_slices.contains(&cluster_of(s))
            }));
        }
    }
    FederatedPlan {
        actions,
        foreign: false,
    }
}

#[cfg(test)]
#[path = "federated_tests.rs"]
mod tests;
