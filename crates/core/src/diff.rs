//! Compare-then-update: an existing mirror object is rewritten only when a field
//! the mirror owns differs, so that an unchanged world causes no write.
//!
//! Owned fields: the mirror's labels and annotations ([`OWNED_LABELS`] and
//! [`OWNED_ANNOTATIONS`] for a Secret link, all of them for a Link mirror: see
//! [`MetadataOwnership`]), and for a Service its ports, selector and type, for
//! Endpoints its subsets. Everything else (resourceVersion, uid, clusterIP, and under
//! [`MetadataOwnership::Keys`] labels and annotations set by others, ...) is kept from
//! the actual object, so an update is a minimal change to what is stored.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::desired::{CLUSTER_IP, port_name, protocol_or_default, target_port_or_default};
use super::labels::{
    CLUSTER_NAME_LABEL, CONTROLLER_NAMESPACE_ANNOTATION, HEADLESS_MIRROR_SVC_NAME_LABEL,
    MIRRORED_SERVICE_LABEL, REMOTE_GATEWAY_IDENTITY_ANNOTATION, REMOTE_GATEWAY_NAME_LABEL,
    REMOTE_GATEWAY_NS_LABEL, REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION,
    REMOTE_RESOURCE_VERSION_ANNOTATION, REMOTE_SVC_FQ_NAME_ANNOTATION, SKIP_MIRROR_LABEL,
};

/// Label keys the mirror owns on its objects: the four mirror labels (first, in this
/// order), `skip-mirror` (only ever on Endpoints, in the modes that write slices:
/// an Endpoints in `endpoints` mode loses it, so kube-controller-manager mirrors it),
/// and an endpoint mirror's `headless-mirror-svc-name`.
pub const OWNED_LABELS: [&str; 6] = [
    MIRRORED_SERVICE_LABEL,
    CLUSTER_NAME_LABEL,
    REMOTE_GATEWAY_NAME_LABEL,
    REMOTE_GATEWAY_NS_LABEL,
    SKIP_MIRROR_LABEL,
    HEADLESS_MIRROR_SVC_NAME_LABEL,
];

/// Annotation keys the mirror owns on its objects; one absent from the desired
/// object is removed from the actual one.
pub const OWNED_ANNOTATIONS: [&str; 5] = [
    REMOTE_RESOURCE_VERSION_ANNOTATION,
    REMOTE_SVC_FQ_NAME_ANNOTATION,
    REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION,
    CONTROLLER_NAMESPACE_ANNOTATION,
    REMOTE_GATEWAY_IDENTITY_ANNOTATION,
];

/// Which labels and annotations of a mirror object are the mirror's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MetadataOwnership {
    /// Only [`OWNED_LABELS`] and [`OWNED_ANNOTATIONS`]: keys others add to a mirror stay
    /// (Secret links: nothing is copied from the remote, so the set is fixed).
    #[default]
    Keys,
    /// All of them (Link mirrors): they copy the remote Service's metadata, so a key the
    /// remote drops must go, and only the whole map says which keys were copied.
    /// Linkerd replaces them whole on every update too.
    All,
}

type Map = BTreeMap<String, String>;

/// Whether the labels or annotations `actual` match `desired` on the mirror's `keys`
/// (all keys, under [`MetadataOwnership::All`]; an empty map is no map).
pub(crate) fn meta_match(
    actual: Option<&Map>,
    desired: Option<&Map>,
    keys: &[&str],
    ownership: MetadataOwnership,
) -> bool {
    match ownership {
        MetadataOwnership::Keys => owned_match(actual, desired, keys),
        MetadataOwnership::All => {
            actual.filter(|m| !m.is_empty()) == desired.filter(|m| !m.is_empty())
        }
    }
}

/// Sets the mirror's labels or annotations of `target` to `desired`'s.
pub(crate) fn set_meta(
    target: &mut Option<Map>,
    desired: Option<&Map>,
    keys: &[&str],
    ownership: MetadataOwnership,
) {
    match ownership {
        MetadataOwnership::Keys => set_owned(target, desired, keys),
        MetadataOwnership::All => *target = desired.filter(|m| !m.is_empty()).cloned(),
    }
}

fn owned_match(actual: Option<&Map>, desired: Option<&Map>, keys: &[&str]) -> bool {
    keys.iter()
        .all(|k| actual.and_then(|m| m.get(*k)) == desired.and_then(|m| m.get(*k)))
}

/// Sets the `keys` of `target` to the values `desired` has, removing those it lacks;
/// other keys (someone else's) stay. Also used for slices (`slices.rs`).
pub(crate) fn set_owned(target: &mut Option<Map>, desired: Option<&Map>, keys: &[&str]) {
    for key in keys {
        match desired.and_then(|m| m.get(*key)) {
            Some(v) => {
                target
                    .get_or_insert_with(Map::new)
                    .insert((*key).to_owned(), v.clone());
            }
            None => {
                if let Some(m) = target.as_mut() {
                    m.remove(*key);
                }
            }
        }
    }
}

/// The fields of a Service port the mirror owns, with apiserver defaults applied.
fn port_key(p: &ServicePort) -> (Option<String>, String, i32, IntOrString) {
    (
        port_name(p.name.as_deref()),
        protocol_or_default(p.protocol.as_deref()),
        p.port,
        target_port_or_default(p.target_port.as_ref(), p.port),
    )
}

fn service_type(spec: Option<&ServiceSpec>) -> &str {
    spec.and_then(|s| s.type_.as_deref())
        .filter(|t| !t.is_empty())
        .unwrap_or(CLUSTER_IP)
}

fn spec_matches(actual: Option<&ServiceSpec>, desired: Option<&ServiceSpec>) -> bool {
    let ports = |s: Option<&ServiceSpec>| -> Vec<_> {
        s.and_then(|s| s.ports.as_deref())
            .unwrap_or_default()
            .iter()
            .map(port_key)
            .collect()
    };
    fn selector(s: Option<&ServiceSpec>) -> Option<&Map> {
        s.and_then(|s| s.selector.as_ref())
            .filter(|m| !m.is_empty())
    }
    service_type(actual) == service_type(desired)
        && selector(actual) == selector(desired)
        && ports(actual) == ports(desired)
}

/// Whether `actual` carries the owned labels and annotations of `desired` (a mirror's
/// Service and Endpoints own the same ones).
fn owned_metadata_matches(
    actual: &ObjectMeta,
    desired: &ObjectMeta,
    ownership: MetadataOwnership,
) -> bool {
    meta_match(
        actual.labels.as_ref(),
        desired.labels.as_ref(),
        &OWNED_LABELS,
        ownership,
    ) && meta_match(
        actual.annotations.as_ref(),
        desired.annotations.as_ref(),
        &OWNED_ANNOTATIONS,
        ownership,
    )
}

/// Sets the owned labels and annotations of `meta` to those of `desired`, leaving the
/// others (someone else's, under [`MetadataOwnership::Keys`]) alone.
pub(crate) fn set_owned_metadata(
    meta: &mut ObjectMeta,
    desired: &ObjectMeta,
    ownership: MetadataOwnership,
) {
    set_meta(
        &mut meta.labels,
        desired.labels.as_ref(),
        &OWNED_LABELS,
        ownership,
    );
    set_meta(
        &mut meta.annotations,
        desired.annotations.as_ref(),
        &OWNED_ANNOTATIONS,
        ownership,
    );
}

/// The update that makes `actual` match `desired` on the fields the mirror owns,
/// or `None` when it already does (apiserver defaults count as equal); the labels and
/// annotations owned are the fixed keys (Secret links, see [`service_update_with`]).
pub fn service_update(actual: &Service, desired: &Service) -> Option<Service> {
    service_update_with(actual, desired, MetadataOwnership::Keys)
}

/// [`service_update`], with the mirror's labels and annotations per `ownership`.
pub fn service_update_with(
    actual: &Service,
    desired: &Service,
    ownership: MetadataOwnership,
) -> Option<Service> {
    let (am, dm) = (&actual.metadata, &desired.metadata);
    let (aspec, dspec) = (actual.spec.as_ref(), desired.spec.as_ref());
    if owned_metadata_matches(am, dm, ownership) && spec_matches(aspec, dspec) {
        return None;
    }
    let mut updated = actual.clone();
    set_owned_metadata(&mut updated.metadata, dm, ownership);
    let type_changed = service_type(aspec) != service_type(dspec);
    let spec = updated.spec.get_or_insert_with(Default::default);
    spec.ports = dspec.and_then(|s| s.ports.clone());
    spec.selector = dspec.and_then(|s| s.selector.clone());
    spec.type_ = Some(service_type(dspec).to_owned());
    if type_changed {
        // Someone changed our mirror's type: drop what the apiserver rejects on a
        // ClusterIP Service.
        spec.external_name = None;
        spec.external_traffic_policy = None;
        spec.health_check_node_port = None;
        spec.allocate_load_balancer_node_ports = None;
        spec.load_balancer_class = None;
        spec.load_balancer_ip = None;
        spec.load_balancer_source_ranges = None;
    }
    Some(updated)
}

fn canonical_ip(ip: &str) -> String {
    ip.parse::<IpAddr>()
        .map_or_else(|_| ip.to_owned(), |a| a.to_string())
}

fn normalize_addresses(addresses: Option<&Vec<EndpointAddress>>) -> Option<Vec<EndpointAddress>> {
    let mut out: Vec<EndpointAddress> = addresses?
        .iter()
        .map(|a| EndpointAddress {
            ip: canonical_ip(&a.ip),
            ..a.clone()
        })
        .collect();
    out.sort_by(|a, b| a.ip.cmp(&b.ip).then_with(|| a.hostname.cmp(&b.hostname)));
    (!out.is_empty()).then_some(out)
}

fn normalize_ports(ports: Option<&Vec<EndpointPort>>) -> Option<Vec<EndpointPort>> {
    let mut out: Vec<EndpointPort> = ports?
        .iter()
        .map(|p| EndpointPort {
            name: port_name(p.name.as_deref()),
            protocol: Some(protocol_or_default(p.protocol.as_deref())),
            ..p.clone()
        })
        .collect();
    out.sort_by(|a, b| (&a.name, a.port, &a.protocol).cmp(&(&b.name, b.port, &b.protocol)));
    (!out.is_empty()).then_some(out)
}

/// Subsets in a canonical form: order and apiserver defaults do not matter, and
/// an empty list is the same as none.
fn normalize_subsets(subsets: Option<&Vec<EndpointSubset>>) -> Vec<EndpointSubset> {
    subsets
        .map(|v| {
            v.iter()
                .map(|s| EndpointSubset {
                    addresses: normalize_addresses(s.addresses.as_ref()),
                    not_ready_addresses: normalize_addresses(s.not_ready_addresses.as_ref()),
                    ports: normalize_ports(s.ports.as_ref()),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The update that makes `actual` match `desired` on the fields the mirror owns
/// (labels, annotations, subsets), or `None` when it already does.
pub fn endpoints_update(actual: &Endpoints, desired: &Endpoints) -> Option<Endpoints> {
    endpoints_update_with(actual, desired, MetadataOwnership::Keys)
}

/// [`endpoints_update`], with the mirror's labels and annotations per `ownership`.
pub fn endpoints_update_with(
    actual: &Endpoints,
    desired: &Endpoints,
    ownership: MetadataOwnership,
) -> Option<Endpoints> {
    let (am, dm) = (&actual.metadata, &desired.metadata);
    if owned_metadata_matches(am, dm, ownership)
        && normalize_subsets(actual.subsets.as_ref()) == normalize_subsets(desired.subsets.as_ref())
    {
        return None;
    }
    let mut updated = actual.clone();
    set_owned_metadata(&mut updated.metadata, dm, ownership);
    updated.subsets = desired.subsets.clone().filter(|s| !s.is_empty());
    Some(updated)
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::super::desired::{Link, desired_mirror};
    use super::super::gateway::{GatewayRef, ResolvedGateway};
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn sport(name: &str, protocol: Option<&str>, port: i32, target: Option<i32>) -> ServicePort {
        ServicePort {
            name: Some(name.to_owned()),
            protocol: protocol.map(str::to_owned),
            port,
            target_port: target.map(IntOrString::Int),
            ..Default::default()
        }
    }

    fn remote(ports: Vec<ServicePort>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                resource_version: Some("100".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(ports),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn desired(resolved: Option<&ResolvedGateway>) -> (Service, Endpoints) {
        let m = desired_mirror(
            &remote(vec![
                sport("http", None, 80, Some(8080)),
                sport("grpc", None, 9090, None),
            ]),
            &Link::new("east", None),
            &GatewayRef::new("mc", "gw"),
            resolved,
        );
        (m.service, m.endpoints)
    }

    fn gw() -> ResolvedGateway {
        ResolvedGateway::new([ip("10.0.0.1"), ip("10.0.0.2")], 4143).with_resource_version("g1")
    }

    /// What the apiserver returns after storing `s`: identity, clusterIP, and other
    /// defaulted fields; port defaults removed to check they compare equal.
    fn stored_service(s: &Service) -> Service {
        let mut s = s.clone();
        s.metadata.uid = Some("uid-1".into());
        s.metadata.resource_version = Some("5".into());
        s.metadata.creation_timestamp = None;
        let spec = s.spec.as_mut().unwrap();
        spec.cluster_ip = Some("10.96.0.10".into());
        spec.cluster_ips = Some(vec!["10.96.0.10".into()]);
        spec.session_affinity = Some("None".into());
        spec.internal_traffic_policy = Some("Cluster".into());
        spec.ip_families = Some(vec!["IPv4".into()]);
        spec.ip_family_policy = Some("SingleStack".into());
        for p in spec.ports.as_mut().unwrap() {
            p.protocol = None;
            if p.target_port == Some(IntOrString::Int(p.port)) {
                p.target_port = None;
            }
        }
        s
    }

    fn stored_endpoints(e: &Endpoints) -> Endpoints {
        let mut e = e.clone();
        e.metadata.uid = Some("uid-2".into());
        e.metadata.resource_version = Some("6".into());
        e
    }

    fn with_label(mut s: Service, k: &str, v: Option<&str>) -> Service {
        let labels = s.metadata.labels.get_or_insert_with(Default::default);
        match v {
            Some(v) => labels.insert(k.into(), v.into()),
            None => labels.remove(k),
        };
        s
    }

    fn with_annotation(mut s: Service, k: &str, v: Option<&str>) -> Service {
        let a = s.metadata.annotations.get_or_insert_with(Default::default);
        match v {
            Some(v) => a.insert(k.into(), v.into()),
            None => a.remove(k),
        };
        s
    }

    fn with_spec(mut s: Service, f: impl FnOnce(&mut ServiceSpec)) -> Service {
        f(s.spec.as_mut().unwrap());
        s
    }

    #[test]
    fn service_no_update_when_equal() {
        let (d, _) = desired(Some(&gw()));
        let base = stored_service(&d);
        let table: Vec<(&str, Service)> = vec![
            ("identical", d.clone()),
            ("apiserver defaults and clusterIP", base.clone()),
            ("foreign label", with_label(base.clone(), "team", Some("a"))),
            (
                "foreign annotation",
                with_annotation(base.clone(), "kubectl.kubernetes.io/x", Some("y")),
            ),
            (
                "nodePort and appProtocol ignored",
                with_spec(base.clone(), |s| {
                    let p = &mut s.ports.as_mut().unwrap()[0];
                    p.node_port = Some(30000);
                    p.app_protocol = Some("http".into());
                }),
            ),
            (
                "empty selector",
                with_spec(base.clone(), |s| s.selector = Some(Default::default())),
            ),
            ("type unset", with_spec(base.clone(), |s| s.type_ = None)),
            (
                "empty target port string",
                with_spec(base.clone(), |s| {
                    s.ports.as_mut().unwrap()[1].target_port =
                        Some(IntOrString::String(String::new()))
                }),
            ),
        ];
        for (what, actual) in table {
            assert_eq!(service_update(&actual, &d), None, "{what}");
        }
    }

    #[test]
    fn service_update_when_owned_field_differs() {
        let (d, _) = desired(Some(&gw()));
        let base = stored_service(&d);
        fn ports(s: &mut ServiceSpec) -> &mut Vec<ServicePort> {
            s.ports.as_mut().unwrap()
        }
        let table: Vec<(&str, Service)> = vec![
            (
                "gateway name label",
                with_label(base.clone(), REMOTE_GATEWAY_NAME_LABEL, Some("gw2")),
            ),
            (
                "gateway ns label missing",
                with_label(base.clone(), REMOTE_GATEWAY_NS_LABEL, None),
            ),
            ("no labels", {
                let mut s = base.clone();
                s.metadata.labels = None;
                s
            }),
            (
                "remote resource version",
                with_annotation(base.clone(), REMOTE_RESOURCE_VERSION_ANNOTATION, Some("99")),
            ),
            (
                "gateway resource version",
                with_annotation(
                    base.clone(),
                    REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION,
                    None,
                ),
            ),
            (
                "fq name",
                with_annotation(
                    base.clone(),
                    REMOTE_SVC_FQ_NAME_ANNOTATION,
                    Some("x.y.svc.z"),
                ),
            ),
            (
                "port added",
                with_spec(base.clone(), |s| ports(s).truncate(1)),
            ),
            (
                "port removed",
                with_spec(base.clone(), |s| ports(s).push(sport("x", None, 1, None))),
            ),
            (
                "port renamed",
                with_spec(base.clone(), |s| ports(s)[0].name = Some("web".into())),
            ),
            (
                "port number",
                with_spec(base.clone(), |s| ports(s)[0].port = 81),
            ),
            (
                "protocol",
                with_spec(base.clone(), |s| ports(s)[0].protocol = Some("UDP".into())),
            ),
            (
                "target port",
                with_spec(base.clone(), |s| {
                    ports(s)[0].target_port = Some(IntOrString::Int(80))
                }),
            ),
            (
                "named target port",
                with_spec(base.clone(), |s| {
                    ports(s)[1].target_port = Some(IntOrString::String("grpc".into()))
                }),
            ),
            (
                "port order",
                with_spec(base.clone(), |s| ports(s).reverse()),
            ),
            (
                "selector",
                with_spec(base.clone(), |s| {
                    s.selector = Some(BTreeMap::from([("app".into(), "web".into())]))
                }),
            ),
            (
                "type",
                with_spec(base.clone(), |s| {
                    s.type_ = Some("LoadBalancer".into());
                    s.external_traffic_policy = Some("Local".into());
                    s.health_check_node_port = Some(31000);
                    s.allocate_load_balancer_node_ports = Some(true);
                }),
            ),
            ("no spec", {
                let mut s = base.clone();
                s.spec = None;
                s
            }),
        ];
        for (what, actual) in table {
            let updated =
                service_update(&actual, &d).unwrap_or_else(|| panic!("{what}: no update"));
            // The update converges: applying it leaves nothing to do.
            assert_eq!(service_update(&updated, &d), None, "{what}: not converged");
            // Identity and allocated fields are kept.
            assert_eq!(updated.metadata.uid, actual.metadata.uid, "{what}");
            assert_eq!(
                updated.metadata.resource_version, actual.metadata.resource_version,
                "{what}"
            );
            let (us, ds) = (updated.spec.as_ref().unwrap(), d.spec.as_ref().unwrap());
            if let Some(a) = actual.spec.as_ref() {
                assert_eq!(us.cluster_ip, a.cluster_ip, "{what}");
                assert_eq!(us.cluster_ips, a.cluster_ips, "{what}");
            }
            assert_eq!(us.ports, ds.ports, "{what}");
            assert_eq!(us.selector, None, "{what}");
            assert_eq!(us.type_.as_deref(), Some("ClusterIP"), "{what}");
            assert_eq!(us.external_traffic_policy, None, "{what}");
            assert_eq!(us.health_check_node_port, None, "{what}");
            assert_eq!(us.allocate_load_balancer_node_ports, None, "{what}");
        }
    }

    #[test]
    fn service_update_keeps_foreign_metadata() {
        let (d, _) = desired(Some(&gw()));
        let actual = with_annotation(
            with_label(
                with_label(stored_service(&d), REMOTE_GATEWAY_NAME_LABEL, Some("old")),
                "team",
                Some("a"),
            ),
            "note",
            Some("keep"),
        );
        let updated = service_update(&actual, &d).unwrap();
        let labels = updated.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "a");
        assert_eq!(labels[REMOTE_GATEWAY_NAME_LABEL], "gw");
        assert_eq!(
            updated.metadata.annotations.as_ref().unwrap()["note"],
            "keep"
        );
    }

    #[test]
    fn service_update_removes_gateway_resource_version_when_unresolved() {
        let (with_gw, _) = desired(Some(&gw()));
        let (without_gw, _) = desired(None);
        let actual = stored_service(&with_gw);
        let updated = service_update(&actual, &without_gw).unwrap();
        let a = updated.metadata.annotations.as_ref().unwrap();
        assert!(!a.contains_key(REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION));
        assert_eq!(a[REMOTE_RESOURCE_VERSION_ANNOTATION], "100");
    }

    fn addr(ip: &str) -> EndpointAddress {
        EndpointAddress {
            ip: ip.into(),
            ..Default::default()
        }
    }

    fn eport(name: &str, protocol: Option<&str>, port: i32) -> EndpointPort {
        EndpointPort {
            name: Some(name.into()),
            protocol: protocol.map(str::to_owned),
            port,
            ..Default::default()
        }
    }

    fn with_subsets(mut e: Endpoints, subsets: Option<Vec<EndpointSubset>>) -> Endpoints {
        e.subsets = subsets;
        e
    }

    fn subset(addresses: &[&str], ports: Vec<EndpointPort>) -> EndpointSubset {
        EndpointSubset {
            addresses: Some(addresses.iter().map(|a| addr(a)).collect()),
            ports: Some(ports),
            not_ready_addresses: None,
        }
    }

    #[test]
    fn endpoints_no_update_when_equal() {
        let (_, d) = desired(Some(&gw()));
        let (_, d_none) = desired(None);
        let base = stored_endpoints(&d);
        let table: Vec<(&str, Endpoints, &Endpoints)> = vec![
            ("identical", d.clone(), &d),
            ("stored", base.clone(), &d),
            (
                "address and port order, default protocol",
                with_subsets(
                    base.clone(),
                    Some(vec![subset(
                        &["10.0.0.2", "10.0.0.1"],
                        vec![eport("grpc", Some("TCP"), 4143), eport("http", None, 4143)],
                    )]),
                ),
                &d,
            ),
            (
                "empty not-ready addresses",
                with_subsets(base.clone(), {
                    let mut s = d.subsets.clone().unwrap();
                    s[0].not_ready_addresses = Some(vec![]);
                    Some(s)
                }),
                &d,
            ),
            (
                "empty subsets == none",
                with_subsets(base.clone(), Some(vec![])),
                &d_none,
            ),
            ("none == none", with_subsets(base.clone(), None), &d_none),
            (
                "foreign label",
                {
                    let mut e = base.clone();
                    e.metadata
                        .labels
                        .as_mut()
                        .unwrap()
                        .insert("team".into(), "a".into());
                    e
                },
                &d,
            ),
        ];
        for (what, actual, desired) in table {
            assert_eq!(endpoints_update(&actual, desired), None, "{what}");
        }
    }

    #[test]
    fn endpoints_no_update_for_non_canonical_ipv6() {
        let r = ResolvedGateway::new([ip("fd00::1")], 4143).with_resource_version("g1");
        let (_, d) = desired(Some(&r));
        let mut actual = stored_endpoints(&d);
        actual.subsets.as_mut().unwrap()[0].addresses = Some(vec![addr("fd00:0:0:0::1")]);
        assert_eq!(endpoints_update(&actual, &d), None);
    }

    #[test]
    fn endpoints_update_when_owned_field_differs() {
        let (_, d) = desired(Some(&gw()));
        let (_, d_none) = desired(None);
        let base = stored_endpoints(&d);
        let ports = || {
            vec![
                eport("grpc", Some("TCP"), 4143),
                eport("http", Some("TCP"), 4143),
            ]
        };
        let table: Vec<(&str, Endpoints, &Endpoints)> = vec![
            (
                "address added",
                with_subsets(base.clone(), Some(vec![subset(&["10.0.0.1"], ports())])),
                &d,
            ),
            (
                "address changed",
                with_subsets(
                    base.clone(),
                    Some(vec![subset(&["10.0.0.1", "10.0.0.3"], ports())]),
                ),
                &d,
            ),
            (
                "gateway port changed",
                with_subsets(
                    base.clone(),
                    Some(vec![subset(
                        &["10.0.0.1", "10.0.0.2"],
                        vec![eport("grpc", None, 4144), eport("http", None, 4144)],
                    )]),
                ),
                &d,
            ),
            (
                "port missing",
                with_subsets(
                    base.clone(),
                    Some(vec![subset(
                        &["10.0.0.1", "10.0.0.2"],
                        vec![eport("http", None, 4143)],
                    )]),
                ),
                &d,
            ),
            (
                "address not ready",
                with_subsets(base.clone(), {
                    let mut s = d.subsets.clone().unwrap();
                    s[0].not_ready_addresses = Some(vec![addr("10.0.0.9")]);
                    Some(s)
                }),
                &d,
            ),
            ("subsets missing", with_subsets(base.clone(), None), &d),
            ("subsets to remove", base.clone(), &d_none),
            (
                "label changed",
                {
                    let mut e = base.clone();
                    e.metadata
                        .labels
                        .as_mut()
                        .unwrap()
                        .insert(REMOTE_GATEWAY_NS_LABEL.into(), "other".into());
                    e
                },
                &d,
            ),
            (
                "annotation missing",
                {
                    let mut e = base.clone();
                    e.metadata.annotations = None;
                    e
                },
                &d,
            ),
            (
                "stale annotation",
                {
                    let mut e = base.clone();
                    e.metadata
                        .annotations
                        .as_mut()
                        .unwrap()
                        .insert(REMOTE_RESOURCE_VERSION_ANNOTATION.into(), "1".into());
                    e
                },
                &d,
            ),
        ];
        for (what, actual, desired) in table {
            let updated =
                endpoints_update(&actual, desired).unwrap_or_else(|| panic!("{what}: no update"));
            assert_eq!(
                endpoints_update(&updated, desired),
                None,
                "{what}: not converged"
            );
            assert_eq!(updated.subsets, desired.subsets, "{what}");
            assert_eq!(updated.metadata.uid, actual.metadata.uid, "{what}");
            assert_eq!(
                updated.metadata.resource_version, actual.metadata.resource_version,
                "{what}"
            );
            assert_eq!(
                updated.metadata.annotations, desired.metadata.annotations,
                "{what}"
            );
        }
    }

    // ---- MetadataOwnership: All (Link mirrors) vs Keys (Secret links) ----

    use super::super::desired::{MirrorStyle, ResourceStyle};

    fn link_mirror(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> (Service, Endpoints) {
        let mut r = remote(vec![sport("http", None, 80, None)]);
        let map = |pairs: &[(&str, &str)]| -> Map {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        r.metadata.labels = Some(map(labels));
        r.metadata.annotations = Some(map(annotations));
        let l = Link::new("east", None).with_style(MirrorStyle::Resource(ResourceStyle::default()));
        let resolved =
            gw().with_identity(Some("gw.mc.serviceaccount.identity.cluster.local".into()));
        let m = desired_mirror(&r, &l, &GatewayRef::new("mc", "gw"), Some(&resolved));
        assert_eq!(m.ownership, MetadataOwnership::All);
        (m.service, m.endpoints)
    }

    fn set_key(map: &mut Option<Map>, k: &str, v: Option<&str>) {
        let m = map.get_or_insert_with(Map::new);
        match v {
            Some(v) => m.insert(k.into(), v.into()),
            None => m.remove(k),
        };
    }

    /// A change to the stored labels (`true`) or annotations (`false`) of an object.
    type MetaEdit = (&'static str, bool, &'static str, Option<&'static str>);

    /// What drifts on a stored Link mirror, and must be undone under `All`.
    const LINK_DRIFT: &[MetaEdit] = &[
        (
            "stale copied label (the remote dropped it)",
            true,
            "old",
            Some("x"),
        ),
        ("foreign label (someone added it)", true, "team", Some("a")),
        ("copied label changed", true, "app", Some("api")),
        ("copied label removed", true, "app", None),
        ("stale copied annotation", false, "old", Some("x")),
        (
            "foreign annotation",
            false,
            "kubectl.kubernetes.io/x",
            Some("y"),
        ),
        ("copied annotation changed", false, "a", Some("2")),
    ];

    #[test]
    fn under_all_a_service_update_replaces_labels_and_annotations_whole() {
        let (d, _) = link_mirror(&[("app", "web")], &[("a", "1")]);
        let base = stored_service(&d);
        assert_eq!(service_update_with(&base, &d, MetadataOwnership::All), None);
        for (what, label, k, v) in LINK_DRIFT {
            let mut actual = base.clone();
            match label {
                true => set_key(&mut actual.metadata.labels, k, *v),
                false => set_key(&mut actual.metadata.annotations, k, *v),
            }
            let updated = service_update_with(&actual, &d, MetadataOwnership::All)
                .unwrap_or_else(|| panic!("{what}: no update"));
            assert_eq!(updated.metadata.labels, d.metadata.labels, "{what}");
            assert_eq!(
                updated.metadata.annotations, d.metadata.annotations,
                "{what}"
            );
            assert_eq!(updated.metadata.uid, actual.metadata.uid, "{what}");
            assert_eq!(
                updated.spec.as_ref().unwrap().cluster_ip,
                actual.spec.as_ref().unwrap().cluster_ip,
                "{what}"
            );
            assert_eq!(
                service_update_with(&updated, &d, MetadataOwnership::All),
                None,
                "{what}: not converged"
            );
        }
    }

    #[test]
    fn under_all_an_endpoints_update_replaces_labels_and_annotations_whole() {
        let (_, d) = link_mirror(&[("app", "web")], &[("a", "1")]);
        let base = stored_endpoints(&d);
        assert_eq!(
            endpoints_update_with(&base, &d, MetadataOwnership::All),
            None
        );
        let drift: Vec<MetaEdit> = vec![
            ("stale copied label", true, "old", Some("x")),
            ("foreign label", true, "team", Some("a")),
            ("copied label removed", true, "app", None),
            ("foreign annotation", false, "note", Some("y")),
            (
                "identity removed",
                false,
                REMOTE_GATEWAY_IDENTITY_ANNOTATION,
                None,
            ),
            (
                "identity changed",
                false,
                REMOTE_GATEWAY_IDENTITY_ANNOTATION,
                Some("x.y"),
            ),
        ];
        for (what, label, k, v) in drift {
            let mut actual = base.clone();
            match label {
                true => set_key(&mut actual.metadata.labels, k, v),
                false => set_key(&mut actual.metadata.annotations, k, v),
            }
            let updated = endpoints_update_with(&actual, &d, MetadataOwnership::All)
                .unwrap_or_else(|| panic!("{what}: no update"));
            assert_eq!(updated.metadata.labels, d.metadata.labels, "{what}");
            assert_eq!(
                updated.metadata.annotations, d.metadata.annotations,
                "{what}"
            );
            assert_eq!(updated.subsets, d.subsets, "{what}");
            assert_eq!(
                endpoints_update_with(&updated, &d, MetadataOwnership::All),
                None,
                "{what}: not converged"
            );
        }
    }

    #[test]
    fn under_all_an_empty_map_is_no_map() {
        let (d, de) = link_mirror(&[], &[]);
        // A desired object with no labels or annotations at all (not a real mirror, but
        // the comparison must not care which of None and {} either side holds).
        let strip = |m: &mut ObjectMeta, labels: Option<Map>, annotations: Option<Map>| {
            m.labels = labels;
            m.annotations = annotations;
        };
        for (desired_side, actual_side) in [
            (None, Some(Map::new())),
            (Some(Map::new()), None),
            (Some(Map::new()), Some(Map::new())),
            (None, None),
        ] {
            let mut want = d.clone();
            strip(
                &mut want.metadata,
                desired_side.clone(),
                desired_side.clone(),
            );
            let mut actual = stored_service(&d);
            strip(
                &mut actual.metadata,
                actual_side.clone(),
                actual_side.clone(),
            );
            assert_eq!(
                service_update_with(&actual, &want, MetadataOwnership::All),
                None,
                "{desired_side:?} vs {actual_side:?}"
            );
            let mut want_e = de.clone();
            strip(
                &mut want_e.metadata,
                desired_side.clone(),
                desired_side.clone(),
            );
            let mut actual_e = stored_endpoints(&de);
            strip(
                &mut actual_e.metadata,
                actual_side.clone(),
                actual_side.clone(),
            );
            assert_eq!(
                endpoints_update_with(&actual_e, &want_e, MetadataOwnership::All),
                None,
                "{desired_side:?} vs {actual_side:?}"
            );
        }
        // But an empty stored map against a non-empty desired one is an update.
        let mut actual = stored_service(&d);
        actual.metadata.labels = Some(Map::new());
        let updated = service_update_with(&actual, &d, MetadataOwnership::All).unwrap();
        assert_eq!(updated.metadata.labels, d.metadata.labels);
    }

    #[test]
    fn a_foreign_key_is_kept_only_under_keys() {
        let (ds, de) = desired(Some(&gw()));
        type Row = (MetadataOwnership, bool);
        let table: [Row; 2] = [
            (MetadataOwnership::Keys, true),
            (MetadataOwnership::All, false),
        ];
        for (ownership, kept) in table {
            // Alone, a foreign key is an update only under All.
            let mut s = stored_service(&ds);
            set_key(&mut s.metadata.labels, "team", Some("a"));
            set_key(&mut s.metadata.annotations, "note", Some("y"));
            assert_eq!(
                service_update_with(&s, &ds, ownership).is_none(),
                kept,
                "{ownership:?}"
            );
            let mut e = stored_endpoints(&de);
            set_key(&mut e.metadata.labels, "team", Some("a"));
            set_key(&mut e.metadata.annotations, "note", Some("y"));
            assert_eq!(
                endpoints_update_with(&e, &de, ownership).is_none(),
                kept,
                "{ownership:?}"
            );
            // With an owned key to fix, the foreign one survives only under Keys.
            set_key(
                &mut s.metadata.labels,
                REMOTE_GATEWAY_NAME_LABEL,
                Some("old"),
            );
            let us = service_update_with(&s, &ds, ownership).unwrap();
            let labels = us.metadata.labels.as_ref().unwrap();
            assert_eq!(labels.contains_key("team"), kept, "{ownership:?}");
            assert_eq!(labels[REMOTE_GATEWAY_NAME_LABEL], "gw", "{ownership:?}");
            assert_eq!(
                us.metadata
                    .annotations
                    .as_ref()
                    .unwrap()
                    .contains_key("note"),
                kept,
                "{ownership:?}"
            );
            set_key(
                &mut e.metadata.annotations,
                REMOTE_SVC_FQ_NAME_ANNOTATION,
                Some("x"),
            );
            let ue = endpoints_update_with(&e, &de, ownership).unwrap();
            assert_eq!(
                ue.metadata.labels.as_ref().unwrap().contains_key("team"),
                kept,
                "{ownership:?}"
            );
            assert_eq!(
                ue.metadata
                    .annotations
                    .as_ref()
                    .unwrap()
                    .contains_key("note"),
                kept,
                "{ownership:?}"
            );
        }
    }

    #[test]
    fn the_keys_variants_are_the_plain_functions() {
        let (ds, de) = desired(Some(&gw()));
        let mut s = stored_service(&ds);
        set_key(&mut s.metadata.labels, REMOTE_GATEWAY_NS_LABEL, Some("x"));
        set_key(&mut s.metadata.labels, "team", Some("a"));
        assert_eq!(
            service_update(&s, &ds),
            service_update_with(&s, &ds, MetadataOwnership::Keys)
        );
        let mut e = stored_endpoints(&de);
        e.subsets = None;
        set_key(&mut e.metadata.annotations, "note", Some("y"));
        assert_eq!(
            endpoints_update(&e, &de),
            endpoints_update_with(&e, &de, MetadataOwnership::Keys)
        );
        assert_eq!(MetadataOwnership::default(), MetadataOwnership::Keys);
    }

    #[test]
    fn under_keys_a_gateway_identity_that_goes_is_removed() {
        let with = gw().with_identity(Some("gw.mc.serviceaccount.identity.cluster.local".into()));
        let (_, de_with) = desired(Some(&with));
        let (_, de_without) = desired(Some(&gw()));
        let stored = stored_endpoints(&de_with);
        let updated = endpoints_update(&stored, &de_without).expect("identity dropped");
        assert!(
            !updated
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(REMOTE_GATEWAY_IDENTITY_ANNOTATION)
        );
        let updated = endpoints_update(&stored_endpoints(&de_without), &de_with).expect("added");
        assert_eq!(
            updated.metadata.annotations.as_ref().unwrap()[REMOTE_GATEWAY_IDENTITY_ANNOTATION],
            "gw.mc.serviceaccount.identity.cluster.local"
        );
    }
}
