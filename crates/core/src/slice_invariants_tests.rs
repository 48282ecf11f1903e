//! The invariant every EndpointSlice we write holds for its consumers, over every path
//! that writes one: gateway mirrors (ready, dead, no gateway, a gateway without a
//! usable address, a remote with no ready endpoint, a stale remote's withdrawn
//! addresses, chunked), headless mirrors and their endpoint mirrors, federated
//! per-cluster slices, ServiceImport slices (a remote cluster at its gateway, this
//! cluster's own endpoints), and the updates that heal a slice an older version wrote.
//!
//! The checker is written from the consumers' code and the API reference, never with
//! the production helpers it checks (no `port_name`, `protocol_or_default`,
//! `normalize_*`, `is_our_slice`...):
//! - Linkerd's destination (`controller/api/destination/watcher/port_publisher.go`,
//!   `resolveESTargetPort`) finds the Service port by name among the slice's ports and
//!   dereferences its number: a named port without one is a nil-pointer crash of the
//!   destination for the whole mesh. It reads `ready` (unset = ready).
//! - kube-proxy joins slices to Services by `kubernetes.io/service-name`, routes a
//!   Service port through the slice port of the same name and protocol, and reads
//!   `ready`, `serving`, `terminating`.
//! - The API (`discovery.k8s.io/v1`): `addressType` IPv4 | IPv6 (FQDN: kube-proxy
//!   ignores it); at most 1000 endpoints and 100 ports; 1 to 100 addresses per endpoint
//!   of the slice's family; port numbers 1..=65535; port names unique; a hostname is a
//!   DNS-1123 label.
//! - Nothing to route: Kubernetes' own placeholder, `endpoints: []` and `ports: []`
//!   (kubernetes `staging/src/k8s.io/endpointslice/reconciler.go`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    EndpointPort as CorePort, Endpoints, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::ServiceKey;
use crate::action::{Action, Object, ObjectKind, ObjectRef};
use crate::desired::{DesiredMirror, Link, desired_mirror};
use crate::federated::{
    DesiredFederation, DesiredService, FederationInput, Member, desired_federated, plan_federated,
};
use crate::gateway::{GatewayRef, ResolvedGateway};
use crate::headless::{Pod, headless_mirror};
use crate::mcs::ImportPort;
use crate::mcs_slices::{
    ImportSlicesInput, SourceGateway, desired_import_slices, plan_import_slices,
};
use crate::plan::plan;
use crate::slices::EndpointsMode;

const CLUSTER: &str = "east";
const CTL: &str = "mc";
const SERVICE_NAME: &str = "kubernetes.io/service-name";
const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const OURS: &str = "service-mirror.linkerd.io";
const HEADLESS: &str = "service.kubernetes.io/headless";

/// One path's written slices and what they are for.
struct Case {
    what: String,
    /// The Service the slices serve (`kubernetes.io/service-name`).
    service: String,
    /// That Service's ports as (name, protocol), as the apiserver stores them: an
    /// unnamed port is `""`, an unset protocol TCP.
    service_ports: BTreeSet<(String, String)>,
    /// Whether a family with endpoints must carry every Service port (a gateway
    /// forwards every port; a headless slice carries the remote pods' ports).
    complete: bool,
    slices: Vec<EndpointSlice>,
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Everything wrong with `c`'s slices (empty: valid for every consumer).
fn violations(c: &Case) -> Vec<String> {
    let mut out = Vec::new();
    let mut bad = |s: &EndpointSlice, why: String| {
        out.push(format!(
            "{}: {}: {why}",
            c.what,
            s.metadata.name.as_deref().unwrap_or("?")
        ))
    };
    if c.slices.is_empty() {
        return out;
    }
    // Per family: the ports of the slices with endpoints.
    let mut routed: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for s in &c.slices {
        let m = &s.metadata;
        let name = m.name.as_deref().unwrap_or_default();
        if !(name.len() <= 63 && name.split('.').all(is_dns_label)) {
            bad(
                s,
                "name is no DNS subdomain of at most 63 characters".into(),
            );
        }
        if m.namespace.as_deref().is_none_or(str::is_empty) {
            bad(s, "no namespace".into());
        }
        let label = |k: &str| m.labels.as_ref().and_then(|l| l.get(k)).map(String::as_str);
        if label(SERVICE_NAME) != Some(c.service.as_str()) {
            bad(s, format!("{SERVICE_NAME} is {:?}", label(SERVICE_NAME)));
        }
        if label(MANAGED_BY) != Some(OURS) {
            bad(s, format!("{MANAGED_BY} is {:?}", label(MANAGED_BY)));
        }
        let owners = m.owner_references.clone().unwrap_or_default();
        if owners.len() != 1 || owners[0].controller != Some(true) || owners[0].uid.is_empty() {
            bad(s, format!("owner references {owners:?}"));
        }
        let v6 = match s.address_type.as_str() {
            "IPv4" => false,
            "IPv6" => true,
            other => {
                bad(s, format!("addressType {other:?}"));
                continue;
            }
        };
        let ports = s.ports.clone().unwrap_or_default();
        if ports.len() > 100 || s.endpoints.len() > 1000 {
            bad(
                s,
                format!("{} ports, {} endpoints", ports.len(), s.endpoints.len()),
            );
        }
        let mut names = BTreeSet::new();
        for p in &ports {
            let Some(n) = p.name.clone() else {
                bad(s, format!("a port without a name: {p:?}"));
                continue;
            };
            if !names.insert(n.clone()) {
                bad(s, format!("port name {n:?} twice"));
            }
            let protocol = p.protocol.clone().unwrap_or_default();
            if !["TCP", "UDP", "SCTP"].contains(&protocol.as_str()) {
                bad(s, format!("port {n:?}: protocol {:?}", p.protocol));
            }
            if !c.service_ports.contains(&(n.clone(), protocol.clone())) {
                bad(
                    s,
                    format!("port {n:?}/{protocol} is no port of the Service"),
                );
            }
            match p.port {
                Some(1..=65535) => {}
                other => bad(s, format!("port {n:?}: number {other:?}")),
            }
        }
        if ports.is_empty() && !s.endpoints.is_empty() && !c.service_ports.is_empty() {
            bad(s, "endpoints but no ports".into());
        }
        for e in &s.endpoints {
            if e.addresses.is_empty() || e.addresses.len() > 100 {
                bad(s, format!("{} addresses in an endpoint", e.addresses.len()));
            }
            for a in &e.addresses {
                match a.parse::<IpAddr>() {
                    Ok(ip) if ip.is_ipv6() == v6 && ip.to_string() == *a => {}
                    _ => bad(s, format!("address {a:?} in an {} slice", s.address_type)),
                }
            }
            match &e.conditions {
                Some(EndpointConditions {
                    ready: Some(r),
                    serving: Some(_),
                    terminating: Some(t),
                }) => {
                    if *r && *t {
                        bad(s, "ready and terminating".into());
                    }
                }
                other => bad(s, format!("conditions {other:?}")),
            }
            if let Some(h) = &e.hostname
                && !is_dns_label(h)
            {
                bad(s, format!("hostname {h:?}"));
            }
        }
        if !s.endpoints.is_empty() {
            let family = routed.entry(s.address_type.clone()).or_default();
            family.extend(ports.iter().map(|p| {
                (
                    p.name.clone().unwrap_or_default(),
                    p.protocol.clone().unwrap_or_default(),
                )
            }));
        }
    }
    if c.complete {
        for (family, ports) in &routed {
            if *ports != c.service_ports {
                out.push(format!(
                    "{}: {family}: ports {ports:?}, the Service has {:?}",
                    c.what, c.service_ports
                ));
            }
        }
    }
    out
}

// ---- The paths ----

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ips(n: usize) -> Vec<IpAddr> {
    (0..n)
        .map(|i| IpAddr::from([10, 1, (i / 250) as u8, (i % 250) as u8 + 1]))
        .collect()
}

/// A remote Service `name` in `shop` with `ports` as (name, protocol, port).
fn remote(name: &str, ports: &[(&str, Option<&str>, i32)], headless: bool) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            resource_version: Some("7".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: headless.then(|| "None".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p, port)| ServicePort {
                        name: (!n.is_empty()).then(|| (*n).into()),
                        protocol: p.map(str::to_owned),
                        port: *port,
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

fn many_ports(n: usize) -> Vec<(String, Option<&'static str>, i32)> {
    (0..n)
        .map(|i| {
            (
                format!("p{i}"),
                (i % 2 == 1).then_some("UDP"),
                1000 + i as i32,
            )
        })
        .collect()
}

fn gateway(addrs: Vec<IpAddr>, alive: bool) -> ResolvedGateway {
    ResolvedGateway::new(addrs, 4143)
        .with_resource_version("g1")
        .with_alive(alive)
}

/// The Service's ports as the checker reads them: (name or "", protocol or TCP).
fn ports_of(svc: &Service) -> BTreeSet<(String, String)> {
    svc.spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            )
        })
        .collect()
}

/// The slices `plan` creates for `d` in `both` mode, its Service stored with a uid
/// (what the controller writes).
fn written(d: &DesiredMirror) -> Vec<EndpointSlice> {
    let mut svc = d.service.clone();
    svc.metadata.uid = Some("svc-uid".into());
    svc.metadata.resource_version = Some("1".into());
    let key = ServiceKey::new("shop", "web");
    plan(
        &key,
        Some(d),
        &[&svc],
        &[],
        &[],
        None,
        CLUSTER,
        EndpointsMode::Both,
    )
    .into_iter()
    .filter_map(|a| match a {
        Action::Create(Object::EndpointSlice(s)) => Some(s),
        _ => None,
    })
    .collect()
}

fn mirror_case(what: &str, d: &DesiredMirror, complete: bool) -> Case {
    Case {
        what: what.into(),
        service: d.service.metadata.name.clone().unwrap(),
        service_ports: ports_of(&d.service),
        complete,
        slices: written(d),
    }
}

fn mirror_cases() -> Vec<Case> {
    let link = Link::new(CLUSTER, None).with_controller_namespace(CTL);
    let gw = GatewayRef::new(CTL, "gw");
    let two = [("http", None, 80), ("dns", Some("UDP"), 53)];
    let wide = many_ports(150);
    let wide: Vec<(&str, Option<&str>, i32)> =
        wide.iter().map(|(n, p, x)| (n.as_str(), *p, *x)).collect();
    let mixed = vec![ip("192.0.2.1"), ip("2001:db8::1")];
    let rows: Vec<(&str, Service, Option<ResolvedGateway>)> = vec![
        (
            "ready gateway",
            remote("web", &two, false),
            Some(gateway(ips(2), true)),
        ),
        (
            "dual-stack gateway",
            remote("web", &two, false),
            Some(gateway(mixed.clone(), true)),
        ),
        (
            "IPv6-only gateway",
            remote("web", &two, false),
            Some(gateway(vec![ip("2001:db8::9")], true)),
        ),
        (
            "dead gateway (probes fail)",
            remote("web", &two, false),
            Some(gateway(ips(2), false)),
        ),
        ("no gateway", remote("web", &two, false), None),
        (
            "gateway without a usable address",
            remote("web", &two, false),
            Some(gateway(vec![], true)),
        ),
        // The link controller clears the addresses of a remote Service with no ready
        // endpoint, and of a stale remote's dead gateway (`stale_effect`).
        (
            "remote with no ready endpoint",
            remote("web", &two, false),
            Some(gateway(vec![], true)),
        ),
        (
            "stale remote, dead gateway withdrawn",
            remote("web", &two, false),
            Some(gateway(vec![], false)),
        ),
        (
            "one unnamed port",
            remote("web", &[("", None, 80)], false),
            Some(gateway(ips(1), true)),
        ),
        (
            "one unnamed port, no gateway",
            remote("web", &[("", None, 80)], false),
            None,
        ),
        (
            "150 ports",
            remote("web", &wide, false),
            Some(gateway(ips(3), true)),
        ),
        ("150 ports, no gateway", remote("web", &wide, false), None),
        (
            "2500 gateway addresses",
            remote("web", &two, false),
            Some(gateway(ips(2500), true)),
        ),
        (
            "150 ports x 1500 addresses, dead",
            remote("web", &wide, false),
            Some(gateway(ips(1500), false)),
        ),
    ];
    let mut out: Vec<Case> = rows
        .into_iter()
        .map(|(what, r, g)| mirror_case(what, &desired_mirror(&r, &link, &gw, g.as_ref()), true))
        .collect();

    // Headless: the parent (pods at their endpoint mirrors' ClusterIPs, at the remote
    // slice's ports) and each endpoint mirror (an ordinary gateway mirror).
    let r = remote("web", &[("http", None, 80), ("peer", None, 7000)], true);
    let pod = |h: &str| Pod {
        hostname: h.into(),
        ports: vec![
            CorePort {
                name: Some("http".into()),
                port: 8080,
                protocol: Some("TCP".into()),
                app_protocol: None,
            },
            CorePort {
                name: Some("peer".into()),
                port: 7000,
                protocol: None,
                app_protocol: None,
            },
        ],
    };
    let pods = [pod("web-0"), pod("web-1")];
    let ips_known = BTreeMap::from([
        ("web-0-east".to_string(), "10.96.0.10".to_string()),
        ("web-1-east".to_string(), "10.96.0.11".to_string()),
    ]);
    for (what, g, cluster_ips) in [
        (
            "headless, endpoint mirrors with ClusterIPs",
            Some(gateway(ips(1), true)),
            ips_known.clone(),
        ),
        (
            "headless, no ClusterIP known yet",
            Some(gateway(ips(1), true)),
            BTreeMap::new(),
        ),
        ("headless, no gateway", None, ips_known.clone()),
        (
            "headless, dead gateway",
            Some(gateway(ips(1), false)),
            ips_known,
        ),
    ] {
        let h = headless_mirror(&r, &link, &gw, g.as_ref(), &pods, &cluster_ips);
        out.push(mirror_case(&format!("{what}: parent"), &h.parent, false));
        for m in &h.members {
            let name = m.service.metadata.name.clone().unwrap();
            out.push(mirror_case(
                &format!("{what}: endpoint mirror {name}"),
                m,
                true,
            ));
        }
    }
    let none = headless_mirror(&r, &link, &gw, None, &[], &BTreeMap::new());
    out.push(mirror_case(
        "headless scaled to zero: parent",
        &none.parent,
        false,
    ));
    out
}

fn member_gw(addrs: Vec<IpAddr>, alive: bool) -> ResolvedGateway {
    ResolvedGateway::new(addrs, 4143)
        .with_identity(Some("gw.id".into()))
        .with_alive(alive)
}

fn federated_cases() -> Vec<Case> {
    let member = |cluster: Option<&str>, ports: &[(&str, Option<&str>, i32)]| Member {
        cluster: cluster.map(str::to_owned),
        link_created: None,
        domain: "cluster.local".into(),
        exclusions: Default::default(),
        service: remote("web", ports, false),
    };
    let two = [("http", None, 80), ("dns", Some("UDP"), 53)];
    let rows: Vec<(&str, Vec<Member>, BTreeMap<String, ResolvedGateway>)> = vec![
        (
            "two members alive and dead, and local",
            vec![
                member(Some("east"), &two),
                member(Some("north"), &two),
                member(None, &two),
            ],
            BTreeMap::from([
                (
                    "east".into(),
                    member_gw(vec![ip("192.0.2.1"), ip("2001:db8::1")], true),
                ),
                ("north".into(), member_gw(vec![ip("192.0.2.2")], false)),
            ]),
        ),
        (
            "a member whose gateway has no usable address",
            vec![member(Some("east"), &two), member(Some("north"), &two)],
            BTreeMap::from([
                ("east".into(), member_gw(vec![], true)),
                ("north".into(), member_gw(vec![ip("192.0.2.2")], true)),
            ]),
        ),
        (
            "members with different ports: the union",
            vec![
                member(Some("east"), &[("http", None, 80)]),
                member(Some("north"), &[("admin", None, 9000)]),
            ],
            BTreeMap::from([
                ("east".into(), member_gw(vec![ip("192.0.2.1")], true)),
                ("north".into(), member_gw(vec![ip("192.0.2.2")], true)),
            ]),
        ),
        (
            "one unnamed port",
            vec![member(Some("east"), &[("", None, 80)])],
            BTreeMap::from([("east".into(), member_gw(ips(1200), true))]),
        ),
    ];
    rows.into_iter()
        .map(|(what, members, gateways)| {
            let d = desired_federated(
                &FederationInput {
                    namespace: "shop",
                    name: "web",
                    members: &members,
                    gateways: &gateways,
                    pending: &BTreeSet::new(),
                    controller_namespace: CTL,
                    local_slices: Some(&[]),
                    traffic: &crate::traffic::TrafficPolicy::spread(),
                },
                None,
            );
            let svc = stored_federated(&d);
            Case {
                what: format!("federated: {what}"),
                service: d.name.clone(),
                service_ports: ports_of(&svc),
                complete: true,
                slices: federated_written(&d, &svc, &[]),
            }
        })
        .collect()
}

fn stored_federated(d: &DesiredFederation) -> Service {
    let DesiredService::Present(s) = &d.service else {
        panic!("no federated Service: {d:?}")
    };
    let mut s = (**s).clone();
    s.metadata.uid = Some("fed-uid".into());
    s.metadata.resource_version = Some("1".into());
    s
}

fn federated_written(
    d: &DesiredFederation,
    svc: &Service,
    stored: &[EndpointSlice],
) -> Vec<EndpointSlice> {
    plan_federated(d, Some(svc), stored, CTL)
        .actions
        .into_iter()
        .filter_map(|a| match a {
            Action::Create(Object::EndpointSlice(s)) | Action::Update(Object::EndpointSlice(s)) => {
                Some(s)
            }
            _ => None,
        })
        .collect()
}

fn import_owner() -> OwnerReference {
    OwnerReference {
        api_version: "multicluster.x-k8s.io/v1beta1".into(),
        kind: "ServiceImport".into(),
        name: "web".into(),
        uid: "import-uid".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// A slice of this cluster's exported Service `web`, as `f` shapes it.
fn local_slice(name: &str, f: impl FnOnce(&mut EndpointSlice)) -> EndpointSlice {
    let mut s = EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            labels: Some(BTreeMap::from([(SERVICE_NAME.into(), "web".into())])),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: vec![Endpoint {
            addresses: vec!["10.244.0.5".into()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            ..Default::default()
        }],
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            protocol: Some("TCP".into()),
            port: Some(8080),
            app_protocol: None,
        }]),
    };
    f(&mut s);
    s
}

fn import_cases() -> Vec<Case> {
    let key = ServiceKey::new("shop", "web");
    let ports = vec![ImportPort {
        name: "http".into(),
        protocol: "TCP".into(),
        port: 80,
        app_protocol: None,
    }];
    let source = |addrs: Vec<IpAddr>, alive: bool| {
        Some(SourceGateway {
            gateway: member_gw(addrs, alive),
            domain: "east.example".into(),
        })
    };
    let locals = vec![
        local_slice("web-kcm", |_| {}),
        // Hand-written for a selector-less Service: no conditions, a port without a
        // number beside a good one.
        local_slice("web-hand", |s| {
            s.endpoints[0].conditions = None;
            s.ports.as_mut().unwrap().push(EndpointPort {
                name: Some("metrics".into()),
                protocol: Some("TCP".into()),
                port: None,
                app_protocol: None,
            });
        }),
        // Kubernetes' placeholder (no pod).
        local_slice("web-empty", |s| {
            s.endpoints.clear();
            s.ports = Some(vec![]);
        }),
        // Terminating pod, serving.
        local_slice("web-terminating", |s| {
            s.endpoints[0].conditions = Some(EndpointConditions {
                ready: Some(false),
                serving: Some(true),
                terminating: Some(true),
            });
        }),
        // FQDN: never copied (kube-proxy ignores it).
        local_slice("web-fqdn", |s| {
            s.address_type = "FQDN".into();
            s.endpoints[0].addresses = vec!["db.example.com".into()];
        }),
    ];
    let rows: Vec<(&str, BTreeMap<String, Option<SourceGateway>>)> = vec![
        (
            "remote alive, dual-stack",
            BTreeMap::from([(
                "east".into(),
                source(vec![ip("192.0.2.1"), ip("2001:db8::1")], true),
            )]),
        ),
        (
            "remote dead",
            BTreeMap::from([("east".into(), source(vec![ip("192.0.2.1")], false))]),
        ),
        (
            "remote gateway without address",
            BTreeMap::from([("east".into(), source(vec![], true))]),
        ),
        (
            "remote gateway unusable",
            BTreeMap::from([("east".into(), None)]),
        ),
    ];
    let clusters = vec!["east".to_string(), "west".to_string()];
    rows.into_iter()
        .map(|(what, gateways)| {
            let d = desired_import_slices(&ImportSlicesInput {
                key: &key,
                ports: &ports,
                headless: false,
                clusters: &clusters,
                local_cluster: "west",
                local_slices: Some(&locals),
                gateways: &gateways,
                controller_namespace: CTL,
                traffic: &crate::traffic::TrafficPolicy::spread(),
            });
            let slices = plan_import_slices(&key, &d, &[], &import_owner(), CTL)
                .into_iter()
                .filter_map(|a| match a {
                    Action::Create(Object::EndpointSlice(s)) => Some(s),
                    _ => None,
                })
                .collect();
            Case {
                what: format!("import: {what}, and this cluster's own endpoints"),
                service: crate::mcs_derived::derived_service_name(&key),
                // The derived Service's ports are the import's; this cluster's pods'
                // slices carry the Service's port names.
                service_ports: BTreeSet::from([
                    ("http".into(), "TCP".into()),
                    ("metrics".into(), "TCP".into()),
                ]),
                complete: false,
                slices,
            }
        })
        .collect()
}

#[test]
fn every_slice_we_write_on_every_path_is_valid_for_every_consumer() {
    let cases: Vec<Case> = mirror_cases()
        .into_iter()
        .chain(federated_cases())
        .chain(import_cases())
        .collect();
    let mut all = Vec::new();
    let mut placeholders = 0;
    for c in &cases {
        assert!(
            !c.slices.is_empty() || c.what.contains("import") || c.what.contains("federated"),
            "{}: a mirror always has a slice",
            c.what
        );
        placeholders += c
            .slices
            .iter()
            .filter(|s| s.endpoints.is_empty() && s.ports.as_ref().is_some_and(Vec::is_empty))
            .count();
        all.extend(violations(c));
    }
    let slices: usize = cases.iter().map(|c| c.slices.len()).sum();
    eprintln!(
        "{} paths, {slices} slices written, {placeholders} placeholders, {} violations",
        cases.len(),
        all.len()
    );
    assert!(
        all.is_empty(),
        "{} violations:\n{}",
        all.len(),
        all.join("\n")
    );
    // The paths with nothing to route wrote the placeholder (no gateway, no usable
    // address, no ready endpoint, stale, 150 ports without gateway, headless without
    // ClusterIPs or pods, the local placeholder copied per import row).
    assert!(placeholders >= 10, "{placeholders} placeholders");
    assert!(cases.len() >= 30, "{} paths", cases.len());
}

#[test]
fn the_checker_catches_the_shapes_that_break_a_consumer() {
    let link = Link::new(CLUSTER, None).with_controller_namespace(CTL);
    let gw = GatewayRef::new(CTL, "gw");
    let d = desired_mirror(
        &remote("web", &[("http", None, 80)], false),
        &link,
        &gw,
        Some(&gateway(ips(1), true)),
    );
    let good = written(&d);
    let case = |f: &dyn Fn(&mut EndpointSlice)| {
        let mut slices = good.clone();
        f(&mut slices[0]);
        Case {
            what: "mutated".into(),
            service: d.service.metadata.name.clone().unwrap(),
            service_ports: ports_of(&d.service),
            complete: true,
            slices,
        }
    };
    assert!(violations(&case(&|_| {})).is_empty());
    type Mutation<'a> = (&'a str, &'a dyn Fn(&mut EndpointSlice));
    let broken: Vec<Mutation> = vec![
        // What versions before this one wrote for a remote with no ready endpoint.
        ("a named port without a number, no endpoints", &|s| {
            s.endpoints.clear();
            s.ports.as_mut().unwrap()[0].port = None;
        }),
        ("port 0", &|s| s.ports.as_mut().unwrap()[0].port = Some(0)),
        ("port 65536", &|s| {
            s.ports.as_mut().unwrap()[0].port = Some(65536)
        }),
        ("no protocol", &|s| {
            s.ports.as_mut().unwrap()[0].protocol = None
        }),
        ("no name", &|s| s.ports.as_mut().unwrap()[0].name = None),
        ("a name the Service lacks", &|s| {
            s.ports.as_mut().unwrap()[0].name = Some("grpc".into())
        }),
        ("endpoints without ports", &|s| s.ports = Some(vec![])),
        ("FQDN", &|s| s.address_type = "FQDN".into()),
        ("an IPv6 address in an IPv4 slice", &|s| {
            s.endpoints[0].addresses = vec!["2001:db8::1".into()]
        }),
        ("no conditions", &|s| s.endpoints[0].conditions = None),
        ("ready unset", &|s| {
            s.endpoints[0].conditions.as_mut().unwrap().ready = None
        }),
        ("no service-name", &|s| {
            s.metadata.labels.as_mut().unwrap().remove(SERVICE_NAME);
        }),
        ("no owner", &|s| s.metadata.owner_references = None),
        ("a headless label is fine but a bad hostname is not", &|s| {
            s.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert(HEADLESS.into(), String::new());
            s.endpoints[0].hostname = Some("Web_0".into());
        }),
    ];
    for (what, f) in broken {
        assert!(
            !violations(&case(f)).is_empty(),
            "{what} passed the checker"
        );
    }
}

// ---- Upgrade: a slice an older version wrote is healed in place ----

/// `s` as the apiserver stores it: uid and resourceVersion.
fn stored(mut s: EndpointSlice, uid: &str) -> EndpointSlice {
    s.metadata.uid = Some(uid.into());
    s.metadata.resource_version = Some("5".into());
    s
}

#[test]
fn a_numberless_port_slice_from_an_older_version_is_updated_in_place_to_the_placeholder() {
    let link = Link::new(CLUSTER, None).with_controller_namespace(CTL);
    let gw = GatewayRef::new(CTL, "gw");
    let wide = many_ports(150);
    let wide: Vec<(&str, Option<&str>, i32)> =
        wide.iter().map(|(n, p, x)| (n.as_str(), *p, *x)).collect();
    for ports in [vec![("http", None, 80)], wide] {
        let r = remote("web", &ports, false);
        // What an older version wrote with no gateway: the live shape, endpoints
        // dropped and every port's number unset, one slice per 100 ports.
        let live = written(&desired_mirror(
            &r,
            &link,
            &gw,
            Some(&gateway(ips(1), true)),
        ));
        let old: Vec<EndpointSlice> = live
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                s.endpoints.clear();
                s.ports.iter_mut().flatten().for_each(|p| p.port = None);
                stored(s, &format!("old-{i}"))
            })
            .collect();
        let d = desired_mirror(&r, &link, &gw, None);
        let mut svc = d.service.clone();
        svc.metadata.uid = Some("svc-uid".into());
        let mut ep: Endpoints = d.endpoints.clone();
        ep.metadata.labels.get_or_insert_with(BTreeMap::new).insert(
            "endpointslice.kubernetes.io/skip-mirror".into(),
            "true".into(),
        );
        let actions = plan(
            &ServiceKey::new("shop", "web"),
            Some(&d),
            &[&svc],
            &[&ep],
            &old.iter().collect::<Vec<_>>(),
            None,
            CLUSTER,
            EndpointsMode::Both,
        );
        let mut updated = Vec::new();
        let mut deleted = Vec::new();
        for a in &actions {
            match a {
                Action::Update(Object::EndpointSlice(s)) => updated.push(s.clone()),
                Action::Delete(ObjectRef {
                    kind: ObjectKind::EndpointSlice,
                    name,
                    ..
                }) => deleted.push(name.clone()),
                Action::Create(Object::EndpointSlice(s)) => panic!("recreated: {s:?}"),
                _ => {}
            }
        }
        assert_eq!(updated.len(), 1, "{} ports: {actions:?}", ports.len());
        let healed = &updated[0];
        assert_eq!(healed.metadata.uid.as_deref(), Some("old-0"), "in place");
        assert_eq!(healed.metadata.name, old[0].metadata.name);
        assert_eq!(healed.ports, Some(vec![]));
        assert!(healed.endpoints.is_empty());
        // The second port chunk of 150 ports has no place in the placeholder.
        assert_eq!(deleted.len(), old.len() - 1);
    }
}

#[test]
fn federated_and_import_slices_of_an_older_version_gain_the_cluster_label_in_place() {
    let two = [("http", None, 80)];
    let members = vec![Member {
        cluster: Some("east".into()),
        link_created: None,
        domain: "cluster.local".into(),
        exclusions: Default::default(),
        service: remote("web", &two, false),
    }];
    let gateways = BTreeMap::from([("east".to_string(), member_gw(ips(1), true))]);
    let d = desired_federated(
        &FederationInput {
            namespace: "shop",
            name: "web",
            members: &members,
            gateways: &gateways,
            pending: &BTreeSet::new(),
            controller_namespace: CTL,
            local_slices: Some(&[]),
            traffic: &crate::traffic::TrafficPolicy::spread(),
        },
        None,
    );
    let svc = stored_federated(&d);
    let old: Vec<EndpointSlice> = federated_written(&d, &svc, &[])
        .into_iter()
        .map(|mut s| {
            s.metadata
                .labels
                .as_mut()
                .unwrap()
                .remove("mirror.linkerd.io/cluster-name");
            stored(s, "fed-slice")
        })
        .collect();
    let actions = plan_federated(&d, Some(&svc), &old, CTL).actions;
    let [Action::Update(Object::EndpointSlice(s))] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert_eq!(s.metadata.uid.as_deref(), Some("fed-slice"));
    assert_eq!(
        s.metadata.labels.as_ref().unwrap()["mirror.linkerd.io/cluster-name"],
        "east"
    );

    let key = ServiceKey::new("shop", "web");
    let ports = vec![ImportPort {
        name: "http".into(),
        protocol: "TCP".into(),
        port: 80,
        app_protocol: None,
    }];
    let gateways = BTreeMap::from([(
        "east".to_string(),
        Some(SourceGateway {
            gateway: member_gw(ips(1), true),
            domain: "cluster.local".into(),
        }),
    )]);
    let input = ImportSlicesInput {
        key: &key,
        ports: &ports,
        headless: false,
        clusters: &["east".to_string()],
        local_cluster: "west",
        local_slices: None,
        gateways: &gateways,
        controller_namespace: CTL,
        traffic: &crate::traffic::TrafficPolicy::spread(),
    };
    let d = desired_import_slices(&input);
    let old: Vec<EndpointSlice> = d
        .slices
        .iter()
        .cloned()
        .map(|mut s| {
            s.metadata.owner_references = Some(vec![import_owner()]);
            s.metadata
                .labels
                .as_mut()
                .unwrap()
                .remove("mirror.linkerd.io/cluster-name");
            stored(s, "import-slice")
        })
        .collect();
    let actions = plan_import_slices(&key, &d, &old, &import_owner(), CTL);
    let [Action::Update(Object::EndpointSlice(s))] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert_eq!(s.metadata.uid.as_deref(), Some("import-slice"));
    assert_eq!(
        s.metadata.labels.as_ref().unwrap()["mirror.linkerd.io/cluster-name"],
        "east"
    );
}

// ---- Ownership: the cluster-name label on federated and import slices ----

/// Whether the equality-only label selector `selector` (`k=v,k=v`, as every selector
/// of ours over mirrors is) matches `labels`: read by hand, not with `selector.rs`.
fn selects(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    selector.split(',').all(|term| {
        let (k, v) = term.split_once('=').expect("equality term");
        labels.get(k).map(String::as_str) == Some(v)
    })
}

#[test]
fn no_link_selector_or_predicate_takes_a_federated_or_import_slice_of_its_cluster() {
    let cases: Vec<Case> = federated_cases()
        .into_iter()
        .chain(import_cases())
        .collect();
    let mut seen = 0;
    for c in &cases {
        for s in &c.slices {
            let labels = s.metadata.labels.clone().unwrap_or_default();
            let Some(cluster) = labels.get("mirror.linkerd.io/cluster-name").cloned() else {
                // This cluster's own endpoints in an import: no target cluster.
                assert!(c.what.starts_with("import"), "{}: no cluster-name", c.what);
                continue;
            };
            seen += 1;
            // Linkerd's destination reads the fq-name for its metric labels:
            // `<svc>.<ns>.svc.<domain>`.
            let fq =
                &s.metadata.annotations.as_ref().unwrap()["mirror.linkerd.io/remote-svc-fq-name"];
            let parts: Vec<&str> = fq.split('.').collect();
            assert_eq!(&parts[..3], ["web", "shop", "svc"], "{fq}");
            // What a link of `cluster` selects and owns: the link controller's watches
            // and writer (`owner_selector`, `slice_owner_selector`, `is_owned`,
            // `is_our_slice`), the unlinked-mirror collector (its two selectors), unlink.
            for selector in [
                crate::owner_selector(&cluster),
                crate::labels::slice_owner_selector(&cluster),
                "mirror.linkerd.io/mirrored-service=true".to_string(),
                "mirror.linkerd.io/mirrored-service=true,endpointslice.kubernetes.io/managed-by=service-mirror.linkerd.io".to_string(),
            ] {
                assert!(!selects(&selector, &labels), "{}: {selector} selects {labels:?}", c.what);
            }
            assert!(!crate::is_owned(&s.metadata, &cluster), "{}", c.what);
            assert!(!crate::is_our_slice(&s.metadata, &cluster), "{}", c.what);
        }
    }
    assert!(seen >= 8, "{seen} slices with a cluster-name");
}
