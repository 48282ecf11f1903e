//! The invariant checker: what the local cluster must look like, given the remote
//! clusters, once the world has converged. Used by the chaos suite, benchmarks and the
//! demo.
//!
//! Invariants:
//! 1. the local mirrors are exactly the mirrors of the exported Services (allowed
//!    namespaces) of every linked cluster, each equal on every owned field (labels,
//!    annotations, ports, gateway endpoints, and the rule of each non-owned field) to
//!    the expected mirror written by hand from the contract (`oracle.rs`), never with
//!    the core's functions;
//! 2. no mirror of an unlinked cluster exists;
//! 3. no object labelled as a mirror exists outside the allowed namespaces;
//! 4. no non-owned Service, Endpoints or Namespace changed or disappeared since a
//!    [`Baseline`] was taken (except `default/kubernetes`, which the apiserver itself
//!    rewrites);
//! 5. per [`EndpointsMode`]: Endpoints exist (labelled `skip-mirror` in `both`) unless
//!    the mode is `endpointslices`; our EndpointSlices exist exactly in the modes with
//!    slices, checked from the contract by hand (`slices.rs`).
//!
//! Gateway liveness (probes) is not modelled: every resolved gateway counts as alive.
//! Hostname ingress entries are not resolved: only IP entries count.

#![forbid(unsafe_code)]

pub mod monitor;
pub mod oracle;
mod slices;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{Endpoints, Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, ListParams};

// Only the controller's configuration types come from the core (its flags'
// meaning); nothing of its desired state, diff or export decision.
pub use service_mirror_core::{EndpointsMode, NamespaceFilter};

use oracle::{CLUSTER as CLUSTER_NAME_LABEL, MIRRORED as MIRRORED_SERVICE_LABEL};
pub use oracle::{Edit, Edits, Expected, LinkView};

const MIRRORED_SERVICE_VALUE: &str = "true";

/// One linked remote cluster, as the checker sees it.
#[derive(Clone)]
pub struct Remote {
    /// The link's cluster name.
    pub cluster: String,
    /// The remote cluster domain (`None`: `cluster.local`).
    pub domain: Option<String>,
    /// A client that may list Services in every namespace of the remote.
    pub client: Client,
}

/// The clusters to check.
#[derive(Clone)]
pub struct World {
    /// The local cluster (must list Services, Endpoints and Namespaces).
    pub local: Client,
    /// Every linked remote cluster; a mirror of any other cluster is a violation.
    pub remotes: Vec<Remote>,
    /// The controller's namespace filter (`--namespace-allow`/`--namespace-deny`).
    pub namespaces: NamespaceFilter,
    /// The controller's namespace (recorded on mirrors), if links come from Secrets.
    pub controller_namespace: Option<String>,
}

/// Object kinds the checker looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A Service.
    Service,
    /// An Endpoints object.
    Endpoints,
    /// An EndpointSlice of ours.
    EndpointSlice,
    /// A Namespace.
    Namespace,
}

/// `namespace/name` (namespace empty for a Namespace).
pub type Key = (String, String);

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Violation {
    /// An exported remote Service has no (owned) mirror object.
    Missing(Kind, Key),
    /// A mirror object exists that no exported Service of a linked cluster explains.
    Extra(Kind, Key, String),
    /// Our EndpointSlices of a mirror differ from what the contract says.
    Differs(Kind, Key),
    /// A mirror object breaks the rule of one field (`oracle.rs`): the field, what it
    /// is and what it should be.
    Field(Kind, Key, String),
    /// A mirror object in a namespace outside the filter.
    OutsideRemit(Kind, Key),
    /// A non-owned object changed (resourceVersion before, after) or was deleted.
    ForeignChanged(Kind, Key, String, Option<String>),
    /// The checker could not read a cluster.
    Unreadable(String),
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = |(ns, n): &Key| {
            if ns.is_empty() {
                n.clone()
            } else {
                format!("{ns}/{n}")
            }
        };
        match self {
            Self::Missing(k, o) => write!(f, "missing mirror {k:?} {}", key(o)),
            Self::Extra(k, o, why) => write!(f, "extra mirror {k:?} {} ({why})", key(o)),
            Self::Differs(k, o) => write!(f, "mirror {k:?} {} differs from desired", key(o)),
            Self::Field(k, o, field) => write!(f, "mirror {k:?} {}: {field}", key(o)),
            Self::OutsideRemit(k, o) => {
                write!(f, "mirror {k:?} {} outside the allowed namespaces", key(o))
            }
            Self::ForeignChanged(k, o, before, after) => write!(
                f,
                "non-owned {k:?} {} changed: resourceVersion {before} -> {}",
                key(o),
                after.as_deref().unwrap_or("deleted")
            ),
            Self::Unreadable(e) => write!(f, "cannot read a cluster: {e}"),
        }
    }
}

fn key_of(meta: &ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

fn labelled_mirror(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(MIRRORED_SERVICE_LABEL))
        .map(String::as_str)
        == Some(MIRRORED_SERVICE_VALUE)
}

fn cluster_label(meta: &ObjectMeta) -> Option<&str> {
    meta.labels
        .as_ref()?
        .get(CLUSTER_NAME_LABEL)
        .map(String::as_str)
}

/// Objects the apiserver itself rewrites (not ours to guard).
fn apiserver_managed(kind: Kind, key: &Key) -> bool {
    kind != Kind::Namespace && key.0 == "default" && key.1 == "kubernetes"
}

/// resourceVersions of the non-owned local objects, taken before the faults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Baseline {
    /// (kind, key) → resourceVersion.
    pub objects: BTreeMap<(Kind, Key), String>,
}

/// Every Service, Endpoints, EndpointSlice and Namespace of a cluster.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Services.
    pub services: Vec<Service>,
    /// Endpoints.
    pub endpoints: Vec<Endpoints>,
    /// EndpointSlices (ours and others'; only ours are checked, none is baselined).
    pub slices: Vec<EndpointSlice>,
    /// Namespaces.
    pub namespaces: Vec<Namespace>,
}

impl Snapshot {
    /// Lists everything from `client`.
    pub async fn take(client: &Client) -> Result<Self, kube::Error> {
        let lp = ListParams::default();
        Ok(Self {
            services: Api::<Service>::all(client.clone()).list(&lp).await?.items,
            endpoints: Api::<Endpoints>::all(client.clone()).list(&lp).await?.items,
            slices: Api::<EndpointSlice>::all(client.clone())
                .list(&lp)
                .await?
                .items,
            namespaces: Api::<Namespace>::all(client.clone()).list(&lp).await?.items,
        })
    }

    fn metas(&self) -> impl Iterator<Item = (Kind, &ObjectMeta)> {
        self.services
            .iter()
            .map(|s| (Kind::Service, &s.metadata))
            .chain(
                self.endpoints
                    .iter()
                    .map(|e| (Kind::Endpoints, &e.metadata)),
            )
            .chain(
                self.namespaces
                    .iter()
                    .map(|n| (Kind::Namespace, &n.metadata)),
            )
    }
}

impl Baseline {
    /// The resourceVersions of every non-owned object of `snapshot`.
    pub fn of(snapshot: &Snapshot) -> Self {
        let objects = snapshot
            .metas()
            .filter(|(_, m)| !labelled_mirror(m))
            .map(|(k, m)| {
                (
                    (k, key_of(m)),
                    m.resource_version.clone().unwrap_or_default(),
                )
            })
            .filter(|((k, key), _)| !apiserver_managed(*k, key))
            .collect();
        Self { objects }
    }

    /// Lists the local cluster and records its non-owned objects.
    pub async fn capture(local: &Client) -> Result<Self, kube::Error> {
        Ok(Self::of(&Snapshot::take(local).await?))
    }

    /// Non-owned objects changed or deleted since the baseline.
    pub fn changes(&self, now: &Snapshot) -> Vec<Violation> {
        let current: BTreeMap<(Kind, Key), String> = now
            .metas()
            .map(|(k, m)| {
                (
                    (k, key_of(m)),
                    m.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        self.objects
            .iter()
            .filter_map(
                |((kind, key), rv)| match current.get(&(*kind, key.clone())) {
                    Some(now) if now == rv => None,
                    after => Some(Violation::ForeignChanged(
                        *kind,
                        key.clone(),
                        rv.clone(),
                        after.cloned(),
                    )),
                },
            )
            .collect()
    }
}

/// The export rule of the contract (hand-written, see `oracle.rs`): exported (both
/// gateway annotations) in an allowed namespace; `Some(None)` when exported but refused
/// (no port), `Some(Some(gateway))` when mirrored.
fn decision(svc: &Service, namespaces: &NamespaceFilter) -> Option<Option<(String, String)>> {
    let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
    if !namespaces.allows(ns) {
        return None;
    }
    let gw = oracle::exported_gateway(svc)?;
    Some(oracle::has_ports(svc).then_some(gw))
}

/// Local mirror names of exported but refused (portless) remote Services: the
/// controller creates no mirror and leaves an existing one as it was, so no invariant
/// holds for them either way.
pub fn tolerated_of(
    remote_services: &[Service],
    cluster: &str,
    namespaces: &NamespaceFilter,
) -> BTreeSet<Key> {
    remote_services
        .iter()
        .filter(|s| matches!(decision(s, namespaces), Some(None)))
        .map(|s| {
            (
                s.metadata.namespace.clone().unwrap_or_default(),
                oracle::mirror_name(s.metadata.name.as_deref().unwrap_or_default(), cluster),
            )
        })
        .collect()
}

/// The expected mirrors of one remote cluster, from a list of all its Services.
pub fn desired_of(
    remote_services: &[Service],
    link: &LinkView<'_>,
    namespaces: &NamespaceFilter,
) -> BTreeMap<Key, Expected> {
    let by_key: BTreeMap<Key, &Service> = remote_services
        .iter()
        .map(|s| (key_of(&s.metadata), s))
        .collect();
    let mut out = BTreeMap::new();
    for svc in remote_services {
        let Some(Some(gw)) = decision(svc, namespaces) else {
            continue;
        };
        let gateway = by_key.get(&gw).copied();
        let mirror = oracle::expected_mirror(svc, link, &gw, gateway);
        out.insert(key_of(&mirror.service.metadata), mirror);
    }
    out
}

fn is_owned(meta: &ObjectMeta, cluster: &str) -> bool {
    labelled_mirror(meta) && cluster_label(meta) == Some(cluster)
}

/// Compares the expected mirrors of every linked cluster (`desired`: cluster →
/// mirrors) with the local objects, field by field, for a controller in `mode`, with
/// the `edits` tests made on mirrors (see `oracle.rs` for the rule per field).
pub fn compare(
    desired: &BTreeMap<String, BTreeMap<Key, Expected>>,
    local: &Snapshot,
    namespaces: &NamespaceFilter,
    tolerated: &BTreeSet<Key>,
    mode: EndpointsMode,
    edits: &Edits,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut wanted: BTreeMap<Key, (&str, &Expected)> = BTreeMap::new();
    for (cluster, mirrors) in desired {
        for (key, m) in mirrors {
            wanted.insert(key.clone(), (cluster.as_str(), m));
        }
    }
    let mut seen: BTreeSet<(Kind, Key)> = BTreeSet::new();
    type Diff<'a> = Box<dyn Fn(&Expected, Option<&Edit>) -> Vec<String> + 'a>;
    let metas_and_diff = local
        .services
        .iter()
        .map(|s| {
            let d: Diff<'_> = Box::new(move |e, edit| oracle::service_diffs(s, &e.service, edit));
            (Kind::Service, &s.metadata, d)
        })
        .chain(local.endpoints.iter().map(|ep| {
            let d: Diff<'_> =
                Box::new(move |e, edit| oracle::endpoints_diffs(ep, &e.endpoints, mode, edit));
            (Kind::Endpoints, &ep.metadata, d)
        }));
    for (kind, meta, diffs) in metas_and_diff {
        if !labelled_mirror(meta) {
            continue;
        }
        let key = key_of(meta);
        if !namespaces.allows(&key.0) {
            out.push(Violation::OutsideRemit(kind, key.clone()));
        }
        let cluster = cluster_label(meta).unwrap_or_default();
        let unwanted_kind = kind == Kind::Endpoints && !mode.writes_endpoints();
        match wanted.get(&key) {
            Some((c, d)) if *c == cluster && is_owned(meta, c) && !unwanted_kind => {
                seen.insert((kind, key.clone()));
                for field in diffs(d, edits.get(&(kind, key.clone()))) {
                    out.push(Violation::Field(kind, key.clone(), field));
                }
            }
            _ if tolerated.contains(&key) && namespaces.allows(&key.0) => {}
            _ => {
                let why = if unwanted_kind {
                    format!("no Endpoints in {mode} mode")
                } else if desired.contains_key(cluster) {
                    "no exported remote Service".to_owned()
                } else {
                    format!("cluster {cluster:?} is not linked")
                };
                out.push(Violation::Extra(kind, key, why));
            }
        }
    }
    for key in wanted.keys() {
        for kind in [Kind::Service, Kind::Endpoints] {
            let wanted_kind = kind == Kind::Service || mode.writes_endpoints();
            if wanted_kind && !seen.contains(&(kind, key.clone())) {
                out.push(Violation::Missing(kind, key.clone()));
            }
        }
    }
    let tolerated_wanted: BTreeMap<Key, (&str, &Expected)> = wanted
        .into_iter()
        .filter(|(k, _)| !tolerated.contains(k))
        .collect();
    out.extend(
        slices::compare_slices(&tolerated_wanted, local, mode)
            .into_iter()
            .filter(
                |v| !matches!(v, Violation::Extra(_, k, _) if tolerated_slice(tolerated, local, k)),
            ),
    );
    out.sort();
    out
}

/// Whether slice `key` belongs to a tolerated (refused, portless) mirror.
fn tolerated_slice(tolerated: &BTreeSet<Key>, local: &Snapshot, key: &Key) -> bool {
    local.slices.iter().any(|s| {
        key_of(&s.metadata) == *key
            && s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubernetes.io/service-name"))
                .is_some_and(|svc| tolerated.contains(&(key.0.clone(), svc.clone())))
    })
}

/// Every violated invariant of `world` now (empty: converged and correct), for a
/// controller in the default endpoints mode (`both`, the flag's default).
pub async fn check(world: &World, baseline: &Baseline) -> Vec<Violation> {
    check_in_mode(world, baseline, EndpointsMode::default()).await
}

/// [`check`] for a controller running with `--endpoints-mode=<mode>`.
pub async fn check_in_mode(
    world: &World,
    baseline: &Baseline,
    mode: EndpointsMode,
) -> Vec<Violation> {
    check_with_edits(world, baseline, mode, &Edits::new()).await
}

/// [`check_in_mode`] knowing the `edits` a test made on mirrors (non-owned fields it
/// set must stay as set; owned ones must be restored).
pub async fn check_with_edits(
    world: &World,
    baseline: &Baseline,
    mode: EndpointsMode,
    edits: &Edits,
) -> Vec<Violation> {
    let mut desired = BTreeMap::new();
    let mut tolerated = BTreeSet::new();
    for r in &world.remotes {
        let services = match Api::<Service>::all(r.client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(l) => l.items,
            Err(e) => return vec![Violation::Unreadable(format!("remote {}: {e}", r.cluster))],
        };
        let link = LinkView {
            cluster: &r.cluster,
            domain: r.domain.as_deref().unwrap_or("cluster.local"),
            controller_namespace: world.controller_namespace.as_deref(),
        };
        tolerated.extend(tolerated_of(&services, &r.cluster, &world.namespaces));
        desired.insert(
            r.cluster.clone(),
            desired_of(&services, &link, &world.namespaces),
        );
    }
    let local = match Snapshot::take(&world.local).await {
        Ok(s) => s,
        Err(e) => return vec![Violation::Unreadable(format!("local: {e}"))],
    };
    let mut out = compare(&desired, &local, &world.namespaces, &tolerated, mode, edits);
    out.extend(baseline.changes(&local));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use service_mirror_core::{
        DesiredMirror, ExportDecision, ExportPolicy, Link, ResolvedGateway, desired_mirror,
        export_decision, gateway_spec,
    };

    /// `endpoints` labelled `skip-mirror: "true"`, as the controller does in `both` mode.
    fn skipping_mirroring(mut endpoints: Endpoints) -> Endpoints {
        endpoints
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(
                "endpointslice.kubernetes.io/skip-mirror".into(),
                "true".into(),
            );
        endpoints
    }

    /// Without edits.
    fn compare(
        d: &BTreeMap<String, BTreeMap<Key, Expected>>,
        l: &Snapshot,
        n: &NamespaceFilter,
        t: &BTreeSet<Key>,
        m: EndpointsMode,
    ) -> Vec<Violation> {
        super::compare(d, l, n, t, m, &Edits::new())
    }

    fn view(link: &Link) -> LinkView<'_> {
        LinkView {
            cluster: &link.cluster_name,
            domain: &link.cluster_domain,
            controller_namespace: link.controller_namespace.as_deref(),
        }
    }

    /// The core's mirrors (what the controller writes): the oracle must accept them,
    /// a cross-check of two independent derivations of the contract.
    fn core_of(
        remote_services: &[Service],
        link: &Link,
        namespaces: &NamespaceFilter,
    ) -> BTreeMap<Key, DesiredMirror> {
        let policy = ExportPolicy {
            namespaces: namespaces.clone(),
            ..ExportPolicy::default()
        };
        let by_key: BTreeMap<Key, &Service> = remote_services
            .iter()
            .map(|s| (key_of(&s.metadata), s))
            .collect();
        let mut out = BTreeMap::new();
        for svc in remote_services {
            let ExportDecision::Mirror(gw) = export_decision(svc, &policy) else {
                continue;
            };
            let resolved: Option<ResolvedGateway> = by_key
                .get(&(gw.namespace.clone(), gw.name.clone()))
                .and_then(|g| gateway_spec(g).ok())
                .map(|spec| spec.into_resolved(std::iter::empty()));
            let mirror = desired_mirror(svc, link, &gw, resolved.as_ref());
            out.insert(key_of(&mirror.service.metadata), mirror);
        }
        out
    }
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, ServicePort, ServiceSpec, ServiceStatus,
    };

    fn svc(ns: &str, name: &str, annotations: &[(&str, &str)], rv: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                resource_version: Some(rv.into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn gateway(ip: &str) -> Service {
        let mut g = svc("a", "gw", &[], "7");
        g.spec.as_mut().unwrap().ports = Some(vec![ServicePort {
            name: Some("mc-gateway".into()),
            port: 4143,
            ..Default::default()
        }]);
        g.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some(ip.into()),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        });
        g
    }

    const GW: [(&str, &str); 2] = [
        ("mirror.linkerd.io/gateway-name", "gw"),
        ("mirror.linkerd.io/gateway-ns", "a"),
    ];

    fn world() -> (Vec<Service>, NamespaceFilter, Link) {
        let remote = vec![
            gateway("192.0.2.1"),
            svc("a", "web", &GW, "10"),
            svc("a", "plain", &[], "11"),
            svc("denied", "web", &GW, "12"),
        ];
        (
            remote,
            NamespaceFilter::allow_only(["a"]),
            Link::new("east", None),
        )
    }

    fn local_of(desired: &BTreeMap<Key, DesiredMirror>) -> Snapshot {
        Snapshot {
            services: desired.values().map(|m| m.service.clone()).collect(),
            endpoints: desired.values().map(|m| m.endpoints.clone()).collect(),
            slices: vec![],
            namespaces: vec![],
        }
    }

    #[test]
    fn desired_only_exported_in_allowed_namespaces() {
        let (remote, filter, link) = world();
        let d = desired_of(&remote, &view(&link), &filter);
        assert_eq!(
            d.keys().cloned().collect::<Vec<_>>(),
            vec![("a".to_string(), "web-east".to_string())]
        );
        let ep = &d.values().next().unwrap().endpoints;
        assert_eq!(
            ep.subsets.as_ref().unwrap()[0].addresses.as_ref().unwrap()[0].ip,
            "192.0.2.1"
        );
    }

    #[test]
    fn exact_mirrors_pass_and_every_deviation_is_reported() {
        let (remote, filter, link) = world();
        let d = desired_of(&remote, &view(&link), &filter);
        let all = BTreeMap::from([("east".to_string(), d.clone())]);
        let good = local_of(&core_of(&remote, &link, &filter));
        assert_eq!(
            compare(
                &all,
                &good,
                &filter,
                &BTreeSet::new(),
                EndpointsMode::Endpoints
            ),
            vec![]
        );

        let k = ("a".to_string(), "web-east".to_string());
        // Missing endpoints.
        let mut s = good.clone();
        s.endpoints.clear();
        assert_eq!(
            compare(
                &all,
                &s,
                &filter,
                &BTreeSet::new(),
                EndpointsMode::Endpoints
            ),
            vec![Violation::Missing(Kind::Endpoints, k.clone())]
        );
        // Edited ports.
        let mut s = good.clone();
        s.services[0].spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81;
        assert_eq!(
            compare(
                &all,
                &s,
                &filter,
                &BTreeSet::new(),
                EndpointsMode::Endpoints
            ),
            vec![Violation::Field(
                Kind::Service,
                k.clone(),
                "spec.ports: [(Some(\"http\"), \"TCP\", 81, Int(80), None)], \
                 want [(Some(\"http\"), \"TCP\", 80, Int(80), None)]"
                    .into()
            )]
        );
        // Mirrors of an unlinked cluster and outside the filter.
        let other = core_of(
            &[gateway("192.0.2.2"), svc("b", "x", &GW, "3")],
            &Link::new("west", None),
            &NamespaceFilter::default(),
        );
        let mut s = good.clone();
        s.services.extend(local_of(&other).services);
        let v = compare(
            &all,
            &s,
            &filter,
            &BTreeSet::new(),
            EndpointsMode::Endpoints,
        );
        let kb = ("b".to_string(), "x-west".to_string());
        assert_eq!(
            v,
            vec![
                Violation::Extra(
                    Kind::Service,
                    kb.clone(),
                    "cluster \"west\" is not linked".into()
                ),
                Violation::OutsideRemit(Kind::Service, kb),
            ]
        );
        // No mirror at all when none is desired.
        let none = BTreeMap::from([("east".to_string(), BTreeMap::new())]);
        assert!(matches!(
            compare(
                &none,
                &good,
                &filter,
                &BTreeSet::new(),
                EndpointsMode::Endpoints
            )[0],
            Violation::Extra(Kind::Service, _, _)
        ));
    }

    #[test]
    fn a_portless_exported_service_is_tolerated_either_way() {
        let (mut remote, filter, link) = world();
        let before = core_of(&remote, &link, &filter);
        remote[1].spec.as_mut().unwrap().ports = None;
        assert!(desired_of(&remote, &view(&link), &filter).is_empty());
        let tolerated = tolerated_of(&remote, "east", &filter);
        let none = BTreeMap::from([("east".to_string(), BTreeMap::new())]);
        assert_eq!(
            compare(
                &none,
                &local_of(&before),
                &filter,
                &tolerated,
                EndpointsMode::Endpoints
            ),
            vec![]
        );
        assert_eq!(
            compare(
                &none,
                &Snapshot::default(),
                &filter,
                &tolerated,
                EndpointsMode::Endpoints
            ),
            vec![]
        );
    }

    #[test]
    fn baseline_reports_changed_and_deleted_foreign_objects_only() {
        let (remote, filter, link) = world();
        let mut snap = local_of(&core_of(&remote, &link, &filter));
        snap.services.push(svc("a", "foreign", &[], "5"));
        snap.services.push(svc("default", "kubernetes", &[], "6"));
        let base = Baseline::of(&snap);
        assert_eq!(base.objects.len(), 1);
        assert!(base.changes(&snap).is_empty());
        let mut changed = snap.clone();
        changed.services[1].metadata.resource_version = Some("9".into());
        changed.services[2].metadata.resource_version = Some("9".into());
        changed.services[0].metadata.resource_version = Some("9".into());
        let k = ("a".to_string(), "foreign".to_string());
        assert_eq!(
            base.changes(&changed),
            vec![Violation::ForeignChanged(
                Kind::Service,
                k.clone(),
                "5".into(),
                Some("9".into())
            )]
        );
        changed.services.remove(1);
        assert_eq!(
            base.changes(&changed),
            vec![Violation::ForeignChanged(
                Kind::Service,
                k,
                "5".into(),
                None
            )]
        );
    }

    /// The local objects a controller in `mode` leaves for `desired` (slices from the
    /// core, with the Service's uid): what the hand-written oracle must accept.
    fn local_in_mode(desired: &BTreeMap<Key, DesiredMirror>, mode: EndpointsMode) -> Snapshot {
        let mut snap = local_of(desired);
        for (i, svc) in snap.services.iter_mut().enumerate() {
            svc.metadata.uid = Some(format!("uid-{i}"));
        }
        match mode {
            EndpointsMode::Endpoints => {}
            EndpointsMode::EndpointSlices => snap.endpoints.clear(),
            EndpointsMode::Both => {
                snap.endpoints = snap.endpoints.into_iter().map(skipping_mirroring).collect()
            }
        }
        if mode.writes_slices() {
            for (m, svc) in desired.values().zip(&snap.services) {
                let uid = svc.metadata.uid.clone().unwrap();
                snap.slices
                    .extend(service_mirror_core::desired_slices(m, &uid));
            }
        }
        snap
    }

    type AllDesired = BTreeMap<String, BTreeMap<Key, Expected>>;

    fn big_world(
        addresses: usize,
        ports: usize,
    ) -> (AllDesired, BTreeMap<Key, DesiredMirror>, NamespaceFilter) {
        let (mut remote, filter, link) = world();
        let ips: Vec<LoadBalancerIngress> = (0..addresses)
            .map(|i| LoadBalancerIngress {
                ip: Some(format!("10.9.{}.{}", i / 250, i % 250 + 1)),
                ..Default::default()
            })
            .collect();
        remote[0]
            .status
            .as_mut()
            .unwrap()
            .load_balancer
            .as_mut()
            .unwrap()
            .ingress = Some(ips);
        remote[1].spec.as_mut().unwrap().ports = Some(
            (0..ports)
                .map(|i| ServicePort {
                    name: Some(format!("p{i}")),
                    port: 1000 + i as i32,
                    ..Default::default()
                })
                .collect(),
        );
        let e = desired_of(&remote, &view(&link), &filter);
        let d = core_of(&remote, &link, &filter);
        (BTreeMap::from([("east".to_string(), e)]), d, filter)
    }

    #[test]
    fn the_controllers_objects_pass_in_every_mode_and_size() {
        for (addresses, ports) in [(1, 1), (2500, 1), (3, 150), (1500, 150), (0, 2)] {
            let (all, d, filter) = big_world(addresses, ports);
            for mode in EndpointsMode::ALL {
                let local = local_in_mode(&d, mode);
                assert_eq!(
                    compare(&all, &local, &filter, &BTreeSet::new(), mode),
                    vec![],
                    "{addresses} addresses, {ports} ports, {mode}"
                );
            }
        }
    }

    #[test]
    fn a_numberless_port_on_an_empty_slice_is_a_deviation() {
        // What versions before issue 30 wrote with no usable gateway: it crashes
        // Linkerd's destination (it dereferences the port number it finds by name).
        let (all, d, filter) = big_world(0, 2);
        let k = ("a".to_string(), "web-east".to_string());
        let mut local = local_in_mode(&d, EndpointsMode::Both);
        assert_eq!(local.slices.len(), 1);
        assert_eq!(local.slices[0].ports, Some(vec![]), "the placeholder");
        local.slices[0].ports = Some(vec![k8s_openapi::api::discovery::v1::EndpointPort {
            name: Some("p0".into()),
            protocol: Some("TCP".into()),
            port: None,
            app_protocol: None,
        }]);
        assert_eq!(
            compare(&all, &local, &filter, &BTreeSet::new(), EndpointsMode::Both),
            vec![Violation::Differs(Kind::EndpointSlice, k)]
        );
    }

    #[test]
    fn slice_deviations_are_reported_per_mode() {
        let (all, d, filter) = big_world(2500, 1);
        let k = ("a".to_string(), "web-east".to_string());
        let check = |local: &Snapshot, mode| compare(&all, local, &filter, &BTreeSet::new(), mode);
        let both = local_in_mode(&d, EndpointsMode::Both);
        type Row = (&'static str, EndpointsMode, Snapshot, Vec<Violation>);
        let edit = |f: &dyn Fn(&mut Snapshot)| {
            let mut s = both.clone();
            f(&mut s);
            s
        };
        let first = both.slices[0].metadata.name.clone().unwrap();
        let table: Vec<Row> = vec![
            (
                "no slices",
                EndpointsMode::Both,
                edit(&|s| s.slices.clear()),
                vec![Violation::Missing(Kind::EndpointSlice, k.clone())],
            ),
            (
                "a slice lost (addresses missing)",
                EndpointsMode::Both,
                edit(&|s| {
                    s.slices.pop();
                }),
                vec![Violation::Differs(Kind::EndpointSlice, k.clone())],
            ),
            (
                "an endpoint twice",
                EndpointsMode::Both,
                edit(&|s| {
                    let e = s.slices[0].endpoints[0].clone();
                    s.slices[1].endpoints.push(e);
                }),
                vec![Violation::Differs(Kind::EndpointSlice, k.clone())],
            ),
            (
                "not ready although alive",
                EndpointsMode::Both,
                edit(&|s| s.slices[0].endpoints[0].conditions = None),
                vec![Violation::Differs(Kind::EndpointSlice, k.clone())],
            ),
            (
                "owner reference lost",
                EndpointsMode::Both,
                edit(&|s| s.slices[0].metadata.owner_references = None),
                vec![Violation::Differs(Kind::EndpointSlice, k.clone())],
            ),
            (
                "Endpoints without skip-mirror in both",
                EndpointsMode::Both,
                local_in_mode(&d, EndpointsMode::Both)
                    .slices
                    .into_iter()
                    .fold(local_in_mode(&d, EndpointsMode::Endpoints), |mut s, x| {
                        s.slices.push(x);
                        s
                    }),
                vec![Violation::Field(
                    Kind::Endpoints,
                    k.clone(),
                    "label endpointslice.kubernetes.io/skip-mirror: None, want Some(\"true\")"
                        .into(),
                )],
            ),
            (
                "slices in endpoints mode",
                EndpointsMode::Endpoints,
                edit(&|s| {
                    s.endpoints = local_in_mode(&d, EndpointsMode::Endpoints).endpoints;
                    s.slices.truncate(1);
                }),
                vec![Violation::Extra(
                    Kind::EndpointSlice,
                    ("a".to_string(), first.clone()),
                    "no mirror wants this slice in endpoints mode".into(),
                )],
            ),
            (
                "Endpoints in endpointslices mode",
                EndpointsMode::EndpointSlices,
                both.clone(),
                vec![Violation::Extra(
                    Kind::Endpoints,
                    k.clone(),
                    "no Endpoints in endpointslices mode".into(),
                )],
            ),
            (
                "kube-controller-manager's slices are not ours to check",
                EndpointsMode::Endpoints,
                {
                    let mut s = local_in_mode(&d, EndpointsMode::Endpoints);
                    let mut kcm = both.slices[0].clone();
                    kcm.metadata.labels.as_mut().unwrap().insert(
                        "endpointslice.kubernetes.io/managed-by".into(),
                        "endpointslicemirroring-controller.k8s.io".into(),
                    );
                    s.slices.push(kcm);
                    s
                },
                vec![],
            ),
        ];
        for (what, mode, local, want) in table {
            assert_eq!(check(&local, mode), want, "{what}");
        }
    }
}
