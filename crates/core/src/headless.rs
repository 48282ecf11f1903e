//! Headless services (`clusterIP: None`, a StatefulSet's per-pod DNS): the headless
//! mirror `<svc>-<cluster>` and one endpoint mirror per remote pod hostname, and the
//! plan of that set of mirrors under the parent's key.
//!
//! The shape (Linkerd's `cluster_watcher_headless.go`, minus its bugs):
//! - the headless mirror is a Service with `clusterIP: None` and the remote ports; its
//!   endpoints are `{hostname, address: <endpoint mirror's ClusterIP>}` per pod at the
//!   remote slice's ports, so CoreDNS answers `<hostname>.<svc>-<cluster>.<ns>.svc...`;
//! - an endpoint mirror `<hostname>-<cluster>` is an ordinary gateway mirror (ClusterIP,
//!   the gateway's endpoints) labelled `headless-mirror-svc-name: <svc>-<cluster>` and
//!   annotated `remote-svc-fq-name: <hostname>.<svc>.<ns>.svc.<domain>`, which maps it
//!   to its parent's key ([`crate::remote_key`]).
//!
//! Pure: the controller keeps the remote slices' hostnames ([`RemoteHeadlessSlice`]) and
//! the endpoint mirrors' ClusterIPs from its caches, and calls [`headless_mirror`] and
//! [`plan_set`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::desired::{DesiredMirror, Link, desired_mirror, port_name, protocol_or_default};
use super::gateway::{GatewayRef, ResolvedGateway};
use super::labels::{
    HEADLESS_MIRROR_SVC_NAME_LABEL, REMOTE_SVC_FQ_NAME_ANNOTATION, SERVICE_NAME_LABEL,
};
use super::naming::{ServiceKey, fq_name, is_dns1123_label, mirror_name};
use super::ownership::is_owned;
use super::plan::{Action, plan};
use super::slices::EndpointsMode;

/// The `clusterIP` of a headless Service.
pub const CLUSTER_IP_NONE: &str = "None";

/// Whether `svc` is headless (`spec.clusterIP: None`).
pub fn is_headless(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some(CLUSTER_IP_NONE)
}

/// One address of a remote headless slice that has a hostname (`hostname`, or with
/// `--headless-hostname-from-target-ref` its `targetRef.name` when it has none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteEndpoint {
    /// The pod's hostname, unchecked (a remote is untrusted: see [`choose_pods`]).
    pub hostname: String,
    /// Ready per the slice's conditions (unset counts as ready, as the API says).
    pub ready: bool,
}

/// What the controller keeps of one remote EndpointSlice labelled
/// `service.kubernetes.io/headless`: far less than the slice.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RemoteHeadlessSlice {
    /// The slice's name (the deterministic order of duplicate hostnames).
    pub name: String,
    /// How many endpoints the slice has, with or without a hostname.
    pub addresses: usize,
    /// Its endpoints that have a hostname.
    pub endpoints: Vec<RemoteEndpoint>,
    /// Its ports (name, port, protocol): the headless mirror's endpoint ports.
    pub ports: Vec<EndpointPort>,
}

/// Which mirror a remote headless Service gets, from its slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Some address has a hostname: a headless mirror and endpoint mirrors.
    Headless,
    /// Addresses, none with a hostname: an ordinary ClusterIP mirror (as Linkerd).
    ClusterIp,
    /// No address at all (scaled to 0, or starting): the mirror keeps the shape it has,
    /// so a StatefulSet scaled to zero does not flip its mirror (a delete + recreate).
    Keep,
}

/// The shape `slices` call for.
pub fn shape(slices: &[RemoteHeadlessSlice]) -> Shape {
    if slices.iter().any(|s| !s.endpoints.is_empty()) {
        Shape::Headless
    } else if slices.iter().any(|s| s.addresses > 0) {
        Shape::ClusterIp
    } else {
        Shape::Keep
    }
}

/// One pod that gets an endpoint mirror.
#[derive(Clone, Debug, PartialEq)]
pub struct Pod {
    /// Its hostname, a DNS-1123 label.
    pub hostname: String,
    /// The ports of the remote slice it was taken from.
    pub ports: Vec<EndpointPort>,
}

/// The pods of a headless Service that get endpoint mirrors, and the refused hostnames.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pods {
    /// Sorted by hostname, each hostname once.
    pub pods: Vec<Pod>,
    /// Hostnames that are not DNS-1123 labels (sorted, each once): refused, others
    /// unaffected.
    pub refused: Vec<String>,
}

/// The pods of `slices` that get endpoint mirrors: those ready, or every one with
/// `publish_not_ready` (the remote Service's `publishNotReadyAddresses`: a
/// StatefulSet bootstrapping needs its peers' DNS before they are ready).
///
/// A hostname that is not a DNS-1123 label (it becomes a Service name and a DNS label)
/// is refused. A hostname in several slices (or twice in one) gets one endpoint mirror:
/// a ready entry wins over a not-ready one, then the slice whose name sorts first, so
/// the choice does not depend on event order. O(n log n) in the addresses.
pub fn choose_pods(slices: &[RemoteHeadlessSlice], publish_not_ready: bool) -> Pods {
    let mut ordered: Vec<&RemoteHeadlessSlice> = slices.iter().collect();
    ordered.sort_by(|a, b| a.name.cmp(&b.name));
    // hostname -> (ready, ports of the slice it comes from)
    let mut chosen: BTreeMap<&str, (bool, &[EndpointPort])> = BTreeMap::new();
    let mut refused = BTreeSet::new();
    for slice in ordered {
        for e in &slice.endpoints {
            if !e.ready && !publish_not_ready {
                continue;
            }
            if !is_dns1123_label(&e.hostname) {
                refused.insert(e.hostname.clone());
                continue;
            }
            match chosen.get(e.hostname.as_str()) {
                Some((true, _)) => {}
                Some((false, _)) if !e.ready => {}
                _ => {
                    chosen.insert(&e.hostname, (e.ready, &slice.ports));
                }
            }
        }
    }
    Pods {
        pods: chosen
            .into_iter()
            .map(|(hostname, (_, ports))| Pod {
                hostname: hostname.to_owned(),
                ports: ports.to_vec(),
            })
            .collect(),
        refused: refused.into_iter().collect(),
    }
}

/// The name of the endpoint mirror of pod `hostname` for `link` (the 63-character rule
/// of [`mirror_name`]).
pub fn endpoint_mirror_name(hostname: &str, link: &Link) -> String {
    mirror_name(hostname, &link.cluster_name)
}

/// The mirrors of a headless remote Service: the parent and its endpoint mirrors.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadlessMirror {
    /// The headless mirror `<svc>-<cluster>`.
    pub parent: DesiredMirror,
    /// One per pod, sorted by name.
    pub members: Vec<DesiredMirror>,
}

/// The headless mirror of `remote` with endpoint mirrors for `pods`, through `gateway`.
///
/// `cluster_ips` maps an endpoint mirror's name to its ClusterIP, for the endpoint
/// mirrors that exist locally: only those pods are in the parent's endpoints (a
/// ClusterIP is known once its Service is created; the endpoint mirror's watch event
/// brings the parent's key back).
pub fn headless_mirror(
    remote: &Service,
    link: &Link,
    gateway: &GatewayRef,
    resolved: Option<&ResolvedGateway>,
    pods: &[Pod],
    cluster_ips: &BTreeMap<String, String>,
) -> HeadlessMirror {
    let svc = remote.metadata.name.as_deref().unwrap_or_default();
    let namespace = remote.metadata.namespace.as_deref().unwrap_or_default();
    let mut parent = desired_mirror(remote, link, gateway, resolved);
    let parent_name = parent.service.metadata.name.clone().unwrap_or_default();
    if let Some(spec) = parent.service.spec.as_mut() {
        spec.cluster_ip = Some(CLUSTER_IP_NONE.to_owned());
    }
    // One subset per distinct port list (a Service's slices normally share theirs).
    let mut subsets: BTreeMap<Vec<(Option<String>, String, i32)>, EndpointSubset> = BTreeMap::new();
    let mut members = Vec::with_capacity(pods.len());
    let parent_fq = fq_name(svc, namespace, &link.cluster_domain);
    for pod in pods {
        let mut member_remote = remote.clone();
        member_remote.metadata.name = Some(pod.hostname.clone());
        let mut member = desired_mirror(&member_remote, link, gateway, resolved);
        let fq = format!("{}.{parent_fq}", pod.hostname);
        for meta in [&mut member.service.metadata, &mut member.endpoints.metadata] {
            meta.annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(REMOTE_SVC_FQ_NAME_ANNOTATION.to_owned(), fq.clone());
            meta.labels.get_or_insert_with(BTreeMap::new).insert(
                HEADLESS_MIRROR_SVC_NAME_LABEL.to_owned(),
                parent_name.clone(),
            );
        }
        let name = member.service.metadata.name.clone().unwrap_or_default();
        if let Some(ip) = cluster_ips.get(&name) {
            let ports: Vec<EndpointPort> = pod
                .ports
                .iter()
                .map(|p| EndpointPort {
                    name: port_name(p.name.as_deref()),
                    protocol: Some(protocol_or_default(p.protocol.as_deref())),
                    port: p.port,
                    app_protocol: None,
                })
                .collect();
            let port_key = ports
                .iter()
                .map(|p| {
                    (
                        p.name.clone(),
                        p.protocol.clone().unwrap_or_default(),
                        p.port,
                    )
                })
                .collect();
            subsets
                .entry(port_key)
                .or_insert_with(|| EndpointSubset {
                    addresses: Some(Vec::new()),
                    not_ready_addresses: None,
                    ports: Some(ports),
                })
                .addresses
                .get_or_insert_with(Vec::new)
                .push(EndpointAddress {
                    ip: ip.clone(),
                    hostname: Some(pod.hostname.clone()),
                    ..Default::default()
                });
        }
        members.push(member);
    }
    members.sort_by(|a, b| a.service.metadata.name.cmp(&b.service.metadata.name));
    parent.endpoints.subsets = (!subsets.is_empty()).then(|| subsets.into_values().collect());
    HeadlessMirror { parent, members }
}

/// The owned Service among `actual` that has `desired`'s name but the other shape
/// (headless vs ClusterIP): `clusterIP` is immutable, so it must be deleted and
/// created again (the only deletion of a live mirror).
pub fn flipped<'a>(
    desired: &DesiredMirror,
    actual: &[&'a Service],
    cluster: &str,
) -> Option<&'a Service> {
    actual.iter().copied().find(|a| {
        a.metadata.name == desired.service.metadata.name
            && is_owned(&a.metadata, cluster)
            && is_headless(a) != is_headless(&desired.service)
    })
}

fn named<'a, T>(objs: &[&'a T], name: &str, name_of: fn(&T) -> Option<&str>) -> Vec<&'a T> {
    objs.iter()
        .copied()
        .filter(|o| name_of(o) == Some(name))
        .collect()
}

fn slice_service(s: &EndpointSlice) -> Option<&str> {
    s.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .map(String::as_str)
}

/// The actions for the set of mirrors of one key: [`plan()`] once per desired object,
/// given the local objects of that name (a slice by its `kubernetes.io/service-name`),
/// then once with no desired object for the rest (endpoint mirrors whose pod is gone,
/// the old name of a renamed mirror): those are deleted. Order: the parent (so a member
/// that cannot be written, its name taken by a foreign object, does not hold it back),
/// each member, the deletions.
///
/// The caller calls this only on complete remote lists (Services and slices): a
/// missing pod in a partial list would delete its live endpoint mirror. [`plan()`]
/// never touches an object outside the key's namespace or not owned by `cluster`.
// The arguments of `plan()`, and the set's members.
#[allow(clippy::too_many_arguments)]
pub fn plan_set(
    key: &ServiceKey,
    parent: &DesiredMirror,
    members: &[DesiredMirror],
    actual_services: &[&Service],
    actual_endpoints: &[&Endpoints],
    actual_slices: &[&EndpointSlice],
    mirrored: Option<&BTreeSet<super::slices::Route>>,
    cluster: &str,
    mode: EndpointsMode,
) -> Vec<Action> {
    fn svc_name(s: &Service) -> Option<&str> {
        s.metadata.name.as_deref()
    }
    fn ep_name(e: &Endpoints) -> Option<&str> {
        e.metadata.name.as_deref()
    }
    let mut actions = Vec::new();
    let mut wanted: BTreeSet<&str> = BTreeSet::new();
    for (d, is_parent) in [(parent, true)]
        .into_iter()
        .chain(members.iter().map(|m| (m, false)))
    {
        let name = d.service.metadata.name.as_deref().unwrap_or_default();
        wanted.insert(name);
        actions.extend(plan(
            key,
            Some(d),
            &named(actual_services, name, svc_name),
            &named(actual_endpoints, name, ep_name),
            &named(actual_slices, name, slice_service),
            // kcm's mirrored slices are read for the parent only.
            mirrored.filter(|_| is_parent),
            cluster,
            mode,
        ));
    }
    let rest = |n: Option<&str>| !n.is_some_and(|n| wanted.contains(n));
    let services: Vec<&Service> = actual_services
        .iter()
        .copied()
        .filter(|s| rest(svc_name(s)))
        .collect();
    let endpoints: Vec<&Endpoints> = actual_endpoints
        .iter()
        .copied()
        .filter(|e| rest(ep_name(e)))
        .collect();
    let slices: Vec<&EndpointSlice> = actual_slices
        .iter()
        .copied()
        .filter(|s| rest(slice_service(s)))
        .collect();
    actions.extend(plan(
        key, None, &services, &endpoints, &slices, None, cluster, mode,
    ));
    actions
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::super::labels::{HEADLESS_SLICE_LABEL, REMOTE_GATEWAY_IDENTITY_ANNOTATION};
    use super::super::ownership::remote_key;
    use super::super::slices::desired_slices;
    use super::*;

    const CLUSTER: &str = "east";

    fn link() -> Link {
        Link::new(CLUSTER, None)
    }

    fn remote() -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".into()),
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

    fn resolved() -> ResolvedGateway {
        let mut r = ResolvedGateway::new(["192.0.2.1".parse::<IpAddr>().unwrap()], 4143)
            .with_resource_version("g1");
        r.identity = Some("gw.identity".into());
        r
    }

    fn port(name: &str, port: i32) -> EndpointPort {
        EndpointPort {
            name: Some(name.into()),
            port,
            protocol: Some("TCP".into()),
            app_protocol: None,
        }
    }

    fn slice(name: &str, addresses: usize, eps: &[(&str, bool)]) -> RemoteHeadlessSlice {
        RemoteHeadlessSlice {
            name: name.into(),
            addresses,
            endpoints: eps
                .iter()
                .map(|(h, r)| RemoteEndpoint {
                    hostname: (*h).into(),
                    ready: *r,
                })
                .collect(),
            ports: vec![port("http", 8080)],
        }
    }

    fn hostnames(p: &Pods) -> Vec<&str> {
        p.pods.iter().map(|p| p.hostname.as_str()).collect()
    }

    #[test]
    fn the_shape_follows_the_hostnames_and_keeps_when_there_are_no_addresses() {
        let cases: &[(&str, Vec<RemoteHeadlessSlice>, Shape)] = &[
            ("no slice", vec![], Shape::Keep),
            ("an empty slice", vec![slice("a", 0, &[])], Shape::Keep),
            (
                "addresses without hostnames",
                vec![slice("a", 2, &[])],
                Shape::ClusterIp,
            ),
            (
                "one hostname among others",
                vec![slice("a", 2, &[]), slice("b", 1, &[("web-0", false)])],
                Shape::Headless,
            ),
        ];
        for (what, slices, want) in cases {
            assert_eq!(shape(slices), *want, "{what}");
        }
    }

    #[test]
    fn pods_are_the_ready_valid_hostnames_each_once() {
        // (what, slices, publishNotReadyAddresses, pods, refused)
        type Case<'a> = (
            &'a str,
            Vec<RemoteHeadlessSlice>,
            bool,
            &'a [&'a str],
            &'a [&'a str],
        );
        let cases: &[Case] = &[
            (
                "ready only",
                vec![slice("a", 2, &[("web-0", true), ("web-1", false)])],
                false,
                &["web-0"],
                &[],
            ),
            (
                "publishNotReadyAddresses: every pod",
                vec![slice("a", 2, &[("web-0", true), ("web-1", false)])],
                true,
                &["web-0", "web-1"],
                &[],
            ),
            (
                "not DNS-1123 labels are refused, others kept",
                vec![slice(
                    "a",
                    4,
                    &[
                        ("web-0", true),
                        ("Web_1", true),
                        ("a.b", true),
                        (&"x".repeat(64), true),
                    ],
                )],
                false,
                &["web-0"],
                &["Web_1", "a.b", &"x".repeat(64)],
            ),
            (
                "a duplicate across slices: one pod",
                vec![
                    slice("b", 1, &[("web-0", true)]),
                    slice("a", 1, &[("web-0", true)]),
                ],
                false,
                &["web-0"],
                &[],
            ),
            (
                "a refused not-ready hostname is not even looked at",
                vec![slice("a", 1, &[("Bad", false)])],
                false,
                &[],
                &[],
            ),
        ];
        for (what, slices, publish, want, refused) in cases {
            let p = choose_pods(slices, *publish);
            assert_eq!(hostnames(&p), *want, "{what}");
            let refused: Vec<String> = refused.iter().map(|s| s.to_string()).collect();
            assert_eq!(p.refused, refused, "{what}");
        }
    }

    #[test]
    fn a_duplicate_hostname_takes_the_ready_entry_then_the_first_slice_whatever_the_order() {
        let mut a = slice("a", 1, &[("web-0", false)]);
        let mut b = slice("b", 1, &[("web-0", true)]);
        a.ports = vec![port("a", 1)];
        b.ports = vec![port("b", 2)];
        let mut c = slice("c", 1, &[("web-0", true)]);
        c.ports = vec![port("c", 3)];
        for order in [
            vec![a.clone(), b.clone(), c.clone()],
            vec![c.clone(), b.clone(), a.clone()],
            vec![b.clone(), c.clone(), a.clone()],
        ] {
            let p = choose_pods(&order, true);
            assert_eq!(p.pods.len(), 1);
            assert_eq!(
                p.pods[0].ports,
                vec![port("b", 2)],
                "ready, then slice b < c"
            );
        }
    }

    #[test]
    fn ten_thousand_hostnames_in_one_slice_are_chosen_in_n_log_n() {
        let names: Vec<String> = (0..10_000).map(|i| format!("web-{i}")).collect();
        let eps: Vec<(&str, bool)> = names.iter().map(|n| (n.as_str(), true)).collect();
        let s = slice("a", eps.len(), &eps);
        let start = std::time::Instant::now();
        let p = choose_pods(&[s], false);
        assert_eq!(p.pods.len(), 10_000);
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
    }

    fn pods(names: &[&str]) -> Vec<Pod> {
        names
            .iter()
            .map(|h| Pod {
                hostname: (*h).into(),
                ports: vec![port("http", 8080)],
            })
            .collect()
    }

    #[test]
    fn the_parent_is_headless_and_lists_the_pods_whose_endpoint_mirror_has_a_cluster_ip() {
        let ips = BTreeMap::from([("web-0-east".to_owned(), "10.96.0.10".to_owned())]);
        let m = headless_mirror(
            &remote(),
            &link(),
            &GatewayRef::new("mc", "gw"),
            Some(&resolved()),
            &pods(&["web-0", "web-1"]),
            &ips,
        );
        assert!(is_headless(&m.parent.service));
        assert_eq!(m.parent.service.metadata.name.as_deref(), Some("web-east"));
        let subsets = m.parent.endpoints.subsets.clone().unwrap();
        assert_eq!(subsets.len(), 1);
        let addrs = subsets[0].addresses.clone().unwrap();
        assert_eq!(addrs.len(), 1, "web-1 has no ClusterIP yet");
        assert_eq!(addrs[0].ip, "10.96.0.10");
        assert_eq!(addrs[0].hostname.as_deref(), Some("web-0"));
        assert_eq!(
            subsets[0].ports.clone().unwrap()[0].port,
            8080,
            "the remote slice's port"
        );

        let names: Vec<_> = m
            .members
            .iter()
            .map(|d| d.service.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["web-0-east", "web-1-east"]);
        for d in &m.members {
            assert!(!is_headless(&d.service));
            let labels = d.service.metadata.labels.clone().unwrap();
            assert_eq!(labels[HEADLESS_MIRROR_SVC_NAME_LABEL], "web-east");
            let host = d
                .service
                .metadata
                .name
                .clone()
                .unwrap()
                .replace("-east", "");
            let fq =
                &d.service.metadata.annotations.as_ref().unwrap()[REMOTE_SVC_FQ_NAME_ANNOTATION];
            assert_eq!(fq, &format!("{host}.web.shop.svc.cluster.local"));
            // The endpoint mirror is a gateway mirror, mapped to its parent's key.
            let eps = d.endpoints.subsets.clone().unwrap();
            assert_eq!(eps[0].addresses.as_ref().unwrap()[0].ip, "192.0.2.1");
            assert_eq!(eps[0].ports.as_ref().unwrap()[0].port, 4143);
            let ann = d.endpoints.metadata.annotations.clone().unwrap();
            assert_eq!(ann[REMOTE_GATEWAY_IDENTITY_ANNOTATION], "gw.identity");
            for meta in [&d.service.metadata, &d.endpoints.metadata] {
                assert_eq!(remote_key(meta), Some(ServiceKey::new("shop", "web")));
            }
            for s in desired_slices(d, "u") {
                assert_eq!(
                    remote_key(&s.metadata),
                    Some(ServiceKey::new("shop", "web"))
                );
            }
        }
    }

    #[test]
    fn long_hostnames_get_the_63_character_rule() {
        let host = "a".repeat(63);
        let m = headless_mirror(
            &remote(),
            &link(),
            &GatewayRef::new("mc", "gw"),
            Some(&resolved()),
            &pods(&[&host]),
            &BTreeMap::new(),
        );
        let name = m.members[0].service.metadata.name.clone().unwrap();
        assert_eq!(name, endpoint_mirror_name(&host, &link()));
        assert!(name.len() <= 63 && name.ends_with("-east"), "{name}");
    }

    #[test]
    fn the_parent_slices_carry_hostnames_and_the_headless_label() {
        let ips = BTreeMap::from([
            ("web-0-east".to_owned(), "10.96.0.10".to_owned()),
            ("web-1-east".to_owned(), "fd00::1".to_owned()),
        ]);
        let m = headless_mirror(
            &remote(),
            &link(),
            &GatewayRef::new("mc", "gw"),
            Some(&resolved()),
            &pods(&["web-0", "web-1"]),
            &ips,
        );
        let slices = desired_slices(&m.parent, "uid-1");
        let names: Vec<_> = slices
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["web-east-ipv4-0", "web-east-ipv6-0"]);
        for s in &slices {
            let labels = s.metadata.labels.clone().unwrap();
            assert_eq!(labels[SERVICE_NAME_LABEL], "web-east");
            assert_eq!(labels[HEADLESS_SLICE_LABEL], "");
            assert_eq!(s.endpoints.len(), 1);
            assert!(s.endpoints[0].hostname.is_some());
            assert_eq!(s.ports.clone().unwrap()[0].port, Some(8080));
        }
        // No pod yet: one empty slice.
        let empty = headless_mirror(
            &remote(),
            &link(),
            &GatewayRef::new("mc", "gw"),
            Some(&resolved()),
            &[],
            &BTreeMap::new(),
        );
        let slices = desired_slices(&empty.parent, "uid-1");
        assert_eq!(slices.len(), 1);
        assert!(slices[0].endpoints.is_empty());
    }

    /// `d` as stored: a uid, a resourceVersion, a ClusterIP unless headless.
    fn stored(d: &DesiredMirror, ip: &str) -> (Service, Endpoints) {
        let (mut s, mut e) = (d.service.clone(), d.endpoints.clone());
        for m in [&mut s.metadata, &mut e.metadata] {
            m.uid = Some(format!("uid-{}", m.name.clone().unwrap()));
            m.resource_version = Some("1".into());
        }
        if !is_headless(&s) {
            s.spec.as_mut().unwrap().cluster_ip = Some(ip.into());
        }
        (s, e)
    }

    fn key() -> ServiceKey {
        ServiceKey::new("shop", "web")
    }

    #[test]
    fn the_set_plan_creates_updates_and_deletes_per_member_and_an_idle_set_writes_nothing() {
        let gw = GatewayRef::new("mc", "gw");
        let ips = BTreeMap::from([
            ("web-0-east".to_owned(), "10.96.0.10".to_owned()),
            ("web-1-east".to_owned(), "10.96.0.11".to_owned()),
        ]);
        let m = headless_mirror(
            &remote(),
            &link(),
            &gw,
            Some(&resolved()),
            &pods(&["web-0", "web-1"]),
            &ips,
        );
        let mode = EndpointsMode::Endpoints;
        // Nothing yet: every Service and Endpoints is created.
        let actions = plan_set(
            &key(),
            &m.parent,
            &m.members,
            &[],
            &[],
            &[],
            None,
            CLUSTER,
            mode,
        );
        let creates = actions.iter().filter(|a| a.is_create()).count();
        assert_eq!(creates, 6, "{actions:?}");
        // All stored as desired: nothing.
        let stored_all: Vec<(Service, Endpoints)> = m
            .members
            .iter()
            .chain([&m.parent])
            .map(|d| {
                let name = d.service.metadata.name.clone().unwrap();
                stored(d, ips.get(&name).map_or("", String::as_str))
            })
            .collect();
        let svcs: Vec<&Service> = stored_all.iter().map(|(s, _)| s).collect();
        let eps: Vec<&Endpoints> = stored_all.iter().map(|(_, e)| e).collect();
        assert_eq!(
            plan_set(
                &key(),
                &m.parent,
                &m.members,
                &svcs,
                &eps,
                &[],
                None,
                CLUSTER,
                mode
            ),
            vec![]
        );
        // web-1 gone: its endpoint mirror is deleted, web-0's untouched, the parent updated.
        let m0 = headless_mirror(
            &remote(),
            &link(),
            &gw,
            Some(&resolved()),
            &pods(&["web-0"]),
            &ips,
        );
        let actions = plan_set(
            &key(),
            &m0.parent,
            &m0.members,
            &svcs,
            &eps,
            &[],
            None,
            CLUSTER,
            mode,
        );
        let shown: Vec<String> = actions.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            shown,
            [
                "update Endpoints shop/web-east",
                "delete Endpoints shop/web-1-east",
                "delete Service shop/web-1-east",
            ]
        );
        // Same-named objects of another namespace are never touched.
        let mut other = stored_all[1].0.clone();
        other.metadata.namespace = Some("other".into());
        let with_other: Vec<&Service> = svcs.iter().copied().chain([&other]).collect();
        assert_eq!(
            plan_set(
                &key(),
                &m.parent,
                &m.members,
                &with_other,
                &eps,
                &[],
                None,
                CLUSTER,
                mode
            ),
            vec![]
        );
    }

    #[test]
    fn a_flip_between_headless_and_cluster_ip_deletes_the_mirror_first() {
        let gw = GatewayRef::new("mc", "gw");
        let clusterip = desired_mirror(&remote(), &link(), &gw, Some(&resolved()));
        let headless = headless_mirror(
            &remote(),
            &link(),
            &gw,
            Some(&resolved()),
            &[],
            &BTreeMap::new(),
        );
        let (s, e) = stored(&clusterip, "10.96.0.5");
        assert!(flipped(&headless.parent, &[&s], CLUSTER).is_some());
        assert!(flipped(&clusterip, &[&s], CLUSTER).is_none());
        let actions = plan_set(
            &key(),
            &headless.parent,
            &[],
            &[&s],
            &[&e],
            &[],
            None,
            CLUSTER,
            EndpointsMode::Endpoints,
        );
        let shown: Vec<String> = actions.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            shown,
            [
                "delete Endpoints shop/web-east",
                "delete Service shop/web-east"
            ]
        );
        // And back: a headless mirror under a ClusterIP desired one.
        let (hs, he) = stored(&headless.parent, "");
        assert!(flipped(&clusterip, &[&hs], CLUSTER).is_some());
        let actions = plan(
            &key(),
            Some(&clusterip),
            &[&hs],
            &[&he],
            &[],
            None,
            CLUSTER,
            EndpointsMode::Endpoints,
        );
        assert!(actions.iter().all(|a| !a.is_create()), "{actions:?}");
        assert_eq!(actions.len(), 2);
        // A foreign Service of that name is no flip.
        let mut foreign = hs.clone();
        foreign.metadata.labels = None;
        assert!(flipped(&clusterip, &[&foreign], CLUSTER).is_none());
    }
}
