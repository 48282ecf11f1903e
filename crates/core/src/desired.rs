//! The desired mirror of one exported remote Service: the local Service and
//! Endpoints that should exist, computed from the remote state alone.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Namespace, Service, ServicePort,
    ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::diff::{MetadataOwnership, OWNED_ANNOTATIONS};
use super::gateway::{GatewayRef, ResolvedGateway};
use super::labels::{
    CLUSTER_NAME_LABEL, CONTROLLER_NAMESPACE_ANNOTATION, DEFAULT_CLUSTER_DOMAIN,
    MIRRORED_SERVICE_LABEL, MIRRORED_SERVICE_VALUE, REMOTE_DISCOVERY_LABEL,
    REMOTE_GATEWAY_IDENTITY_ANNOTATION, REMOTE_GATEWAY_NAME_LABEL, REMOTE_GATEWAY_NS_LABEL,
    REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION, REMOTE_RESOURCE_VERSION_ANNOTATION,
    REMOTE_SERVICE_LABEL, REMOTE_SVC_FQ_NAME_ANNOTATION, SKIP_MIRROR_LABEL,
};
use super::metadata::{Exclusions, copied_annotations, copied_labels};
use super::naming::{fq_name, mirror_name};

/// Protocol the apiserver assumes when a port has none.
pub const DEFAULT_PROTOCOL: &str = "TCP";
/// Service type of every mirror.
pub const CLUSTER_IP: &str = "ClusterIP";

/// What the core needs to know about a link (one remote cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// The link's cluster name: mirror name suffix and `cluster-name` label value.
    pub cluster_name: String,
    /// The remote cluster's DNS domain, used in `remote-svc-fq-name`.
    pub cluster_domain: String,
    /// Namespace of the controller (and link Secret) that owns this link's mirrors,
    /// recorded on them so that a controller only ever collects its own.
    pub controller_namespace: Option<String>,
    /// How the link's mirrors look: the 2020 Secret links' or Linkerd's Link resources'.
    pub style: MirrorStyle,
}

/// How a link's mirrors look, which depends on where the link comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum MirrorStyle {
    /// A link Secret (the 2020 contract): the four mirror labels, the gateway's
    /// resourceVersion and our controller-namespace annotation; nothing is copied from
    /// the remote Service, and others' labels and annotations on a mirror are kept.
    #[default]
    Secret,
    /// A Linkerd `Link` resource: mirrors look the way Linkerd makes them, so its tools
    /// read ours (see [`ResourceStyle`]).
    Resource(ResourceStyle),
}

/// What a `Link` resource says about its mirrors' metadata.
///
/// Their labels are the remote Service's (minus `mirror.linkerd.io*` and the
/// exclusions) plus `mirrored-service` and `cluster-name`; the Service's annotations
/// are the remote's (minus topology and the exclusions) plus the fq-name and the
/// remote resourceVersion. Linkerd replaces a mirror's labels and annotations whole on
/// every update, so they are the mirror's entirely ([`MetadataOwnership::All`]): a key
/// the remote drops goes, with no record needed of which keys were copied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceStyle {
    /// `excludedLabels`: remote labels not copied.
    pub excluded_labels: Exclusions,
    /// `excludedAnnotations`: remote annotations not copied.
    pub excluded_annotations: Exclusions,
}

impl Link {
    /// Builds a link; an empty domain means [`DEFAULT_CLUSTER_DOMAIN`].
    pub fn new(cluster_name: impl Into<String>, cluster_domain: Option<&str>) -> Self {
        Self {
            cluster_name: cluster_name.into(),
            cluster_domain: cluster_domain
                .filter(|d| !d.is_empty())
                .unwrap_or(DEFAULT_CLUSTER_DOMAIN)
                .to_owned(),
            controller_namespace: None,
            style: MirrorStyle::Secret,
        }
    }

    /// The same link, with mirrors of `style`.
    pub fn with_style(mut self, style: MirrorStyle) -> Self {
        self.style = style;
        self
    }

    /// The same link, owned by the controller in `namespace`.
    pub fn with_controller_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.controller_namespace = Some(namespace.into());
        self
    }
}

/// The local objects that should mirror one remote Service.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredMirror {
    /// The mirror Service.
    pub service: Service,
    /// The mirror Endpoints (same name and namespace).
    pub endpoints: Endpoints,
    /// False for a remote-discovery mirror: the Service only, and any Endpoints or
    /// slices of ours go (Linkerd's proxies discover its endpoints in the remote).
    pub has_endpoints: bool,
    /// Which labels and annotations of the mirror's objects are ours.
    pub ownership: MetadataOwnership,
}

/// The four labels every mirror object of a Secret link carries.
pub fn mirror_labels(cluster: &str, gateway: &GatewayRef) -> BTreeMap<String, String> {
    let mut labels = owner_labels(cluster);
    labels.insert(REMOTE_GATEWAY_NAME_LABEL.to_owned(), gateway.name.clone());
    labels.insert(
        REMOTE_GATEWAY_NS_LABEL.to_owned(),
        gateway.namespace.clone(),
    );
    labels
}

/// A port's protocol with the apiserver's default applied.
pub(crate) fn protocol_or_default(protocol: Option<&str>) -> String {
    protocol
        .filter(|p| !p.is_empty())
        .unwrap_or(DEFAULT_PROTOCOL)
        .to_owned()
}

/// A Service port's targetPort with the apiserver's default (the port) applied.
pub(crate) fn target_port_or_default(target: Option<&IntOrString>, port: i32) -> IntOrString {
    match target {
        None | Some(IntOrString::Int(0)) => IntOrString::Int(port),
        Some(IntOrString::String(s)) if s.is_empty() => IntOrString::Int(port),
        Some(t) => t.clone(),
    }
}

/// A port name as the apiserver returns it (an empty name is omitted).
pub(crate) fn port_name(name: Option<&str>) -> Option<String> {
    name.filter(|n| !n.is_empty()).map(str::to_owned)
}

/// The mirror's copy of a remote port: name, protocol, port and targetPort only,
/// defaults made explicit so that the stored object compares equal.
pub(crate) fn mirror_port(remote: &ServicePort) -> ServicePort {
    ServicePort {
        name: port_name(remote.name.as_deref()),
        protocol: Some(protocol_or_default(remote.protocol.as_deref())),
        port: remote.port,
        target_port: Some(target_port_or_default(
            remote.target_port.as_ref(),
            remote.port,
        )),
        // nodePort and appProtocol belong to the remote cluster.
        ..Default::default()
    }
}

/// The mirror of `remote`, exported through `gateway`, for `link`.
///
/// With `resolved` the Endpoints get one subset (the gateway's addresses, one port
/// per Service port at the gateway's port) and, for a Secret link, the Service records
/// the gateway's resourceVersion; without it, or with no address, the Endpoints have no
/// subsets and the mirror Service still exists. The gateway's identity, when it has
/// one, is annotated on the Endpoints.
pub fn desired_mirror(
    remote: &Service,
    link: &Link,
    gateway: &GatewayRef,
    resolved: Option<&ResolvedGateway>,
) -> DesiredMirror {
    let mut mirror = mirror_objects(remote, link, Some(gateway), resolved);
    mirror.has_endpoints = true;
    mirror
}

/// The remote-discovery mirror of `remote` for a Link: the Service only, labelled
/// `remote-discovery: <cluster>` and `remote-service: <name>`, with no Endpoints.
pub fn remote_discovery_mirror(remote: &Service, link: &Link) -> DesiredMirror {
    let mut mirror = mirror_objects(remote, link, None, None);
    let labels = mirror
        .service
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new);
    labels.insert(REMOTE_DISCOVERY_LABEL.to_owned(), link.cluster_name.clone());
    labels.insert(
        REMOTE_SERVICE_LABEL.to_owned(),
        remote.metadata.name.clone().unwrap_or_default(),
    );
    mirror.has_endpoints = false;
    mirror
}

/// Labels and annotations of a mirror's Service and Endpoints, by link style.
struct MirrorMetadata {
    service_labels: BTreeMap<String, String>,
    service_annotations: BTreeMap<String, String>,
    endpoints_labels: BTreeMap<String, String>,
    endpoints_annotations: BTreeMap<String, String>,
    ownership: MetadataOwnership,
}

fn mirror_metadata(
    remote: &Service,
    link: &Link,
    gateway: Option<&GatewayRef>,
    resolved: Option<&ResolvedGateway>,
) -> MirrorMetadata {
    let remote_name = remote.metadata.name.as_deref().unwrap_or_default();
    let namespace = remote.metadata.namespace.as_deref().unwrap_or_default();
    let fq = fq_name(remote_name, namespace, &link.cluster_domain);
    let remote_version = remote.metadata.resource_version.clone().unwrap_or_default();
    let fixed = [
        (
            REMOTE_RESOURCE_VERSION_ANNOTATION.to_owned(),
            remote_version,
        ),
        (REMOTE_SVC_FQ_NAME_ANNOTATION.to_owned(), fq.clone()),
    ];
    let mut endpoints_annotations =
        BTreeMap::from([(REMOTE_SVC_FQ_NAME_ANNOTATION.to_owned(), fq)]);
    if let Some(identity) = resolved
        .and_then(|r| r.identity.as_deref())
        .filter(|i| !i.is_empty())
    {
        endpoints_annotations.insert(
            REMOTE_GATEWAY_IDENTITY_ANNOTATION.to_owned(),
            identity.to_owned(),
        );
    }
    match &link.style {
        MirrorStyle::Secret => {
            let labels = match gateway {
                Some(gw) => mirror_labels(&link.cluster_name, gw),
                None => owner_labels(&link.cluster_name),
            };
            let mut annotations = BTreeMap::from(fixed);
            // A link's resolved gateway always has its version (`gateway_spec`); one
            // without is written as the empty version it would have read.
            if let Some(r) = resolved {
                annotations.insert(
                    REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION.to_owned(),
                    r.resource_version.clone().unwrap_or_default(),
                );
            }
            if let Some(ns) = &link.controller_namespace {
                for a in [&mut annotations, &mut endpoints_annotations] {
                    a.insert(CONTROLLER_NAMESPACE_ANNOTATION.to_owned(), ns.clone());
                }
            }
            MirrorMetadata {
                service_labels: labels.clone(),
                service_annotations: annotations,
                endpoints_labels: labels,
                endpoints_annotations,
                ownership: MetadataOwnership::Keys,
            }
        }
        MirrorStyle::Resource(style) => {
            let mut labels = copied_labels(&remote.metadata, &style.excluded_labels);
            labels.extend(owner_labels(&link.cluster_name));
            let mut annotations = copied_annotations(
                &remote.metadata,
                &style.excluded_annotations,
                &OWNED_ANNOTATIONS,
            );
            annotations.extend(fixed);
            // `skip-mirror` on the Endpoints is the endpoints mode's to set (`plan`): a
            // copied one would stop kube-controller-manager mirroring them in
            // `endpoints` mode, leaving the mirror with no slice at all.
            let mut endpoints_labels = labels.clone();
            endpoints_labels.remove(SKIP_MIRROR_LABEL);
            MirrorMetadata {
                service_labels: labels,
                service_annotations: annotations,
                endpoints_labels,
                endpoints_annotations,
                ownership: MetadataOwnership::All,
            }
        }
    }
}

/// The two labels that make an object a mirror of `cluster` (see [`crate::is_owned`]).
fn owner_labels(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            MIRRORED_SERVICE_LABEL.to_owned(),
            MIRRORED_SERVICE_VALUE.to_owned(),
        ),
        (CLUSTER_NAME_LABEL.to_owned(), cluster.to_owned()),
    ])
}

fn mirror_objects(
    remote: &Service,
    link: &Link,
    gateway: Option<&GatewayRef>,
    resolved: Option<&ResolvedGateway>,
) -> DesiredMirror {
    let remote_name = remote.metadata.name.as_deref().unwrap_or_default();
    let namespace = remote.metadata.namespace.as_deref().unwrap_or_default();
    let name = mirror_name(remote_name, &link.cluster_name);
    let meta = mirror_metadata(remote, link, gateway, resolved);

    let ports: Vec<ServicePort> = remote
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default()
        .iter()
        .map(mirror_port)
        .collect();

    let subsets = resolved.filter(|r| !r.addresses.is_empty()).map(|r| {
        // A gateway (or one address of it) that fails its probes keeps its addresses,
        // as not ready, so local clients fail over instead of sending traffic into a
        // dead link; the addresses still answering stay ready.
        let (ready, not_ready): (Vec<&std::net::IpAddr>, Vec<&std::net::IpAddr>) =
            r.addresses.iter().partition(|ip| r.is_ready(ip));
        let list = |ips: Vec<&std::net::IpAddr>| {
            (!ips.is_empty()).then(|| {
                ips.into_iter()
                    .map(|ip| EndpointAddress {
                        ip: ip.to_string(),
                        ..Default::default()
                    })
                    .collect::<Vec<_>>()
            })
        };
        let (ready, not_ready) = (list(ready), list(not_ready));
        vec![EndpointSubset {
            addresses: ready,
            not_ready_addresses: not_ready,
            ports: Some(
                ports
                    .iter()
                    .map(|p| EndpointPort {
                        name: p.name.clone(),
                        protocol: p.protocol.clone(),
                        port: r.port,
                        ..Default::default()
                    })
                    .collect(),
            ),
        }]
    });

    let service = Service {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.to_owned()),
            labels: Some(meta.service_labels),
            annotations: Some(meta.service_annotations),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(CLUSTER_IP.to_owned()),
            ports: Some(ports),
            ..Default::default()
        }),
        status: None,
    };
    let endpoints = Endpoints {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_owned()),
            labels: Some(meta.endpoints_labels),
            annotations: Some(meta.endpoints_annotations),
            ..Default::default()
        },
        subsets,
    };
    DesiredMirror {
        service,
        endpoints,
        has_endpoints: true,
        ownership: meta.ownership,
    }
}

/// A namespace to create when a mirror's namespace is missing locally, labelled so
/// that it is recognisable as created by the mirror of `cluster`.
pub fn desired_namespace(namespace: &str, cluster: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([
                (
                    MIRRORED_SERVICE_LABEL.to_owned(),
                    MIRRORED_SERVICE_VALUE.to_owned(),
                ),
                (CLUSTER_NAME_LABEL.to_owned(), cluster.to_owned()),
            ])),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn remote(ports: Vec<ServicePort>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                resource_version: Some("100".into()),
                uid: Some("remote-uid".into()),
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                annotations: Some(BTreeMap::from([
                    ("mirror.linkerd.io/gateway-name".into(), "gw".into()),
                    ("mirror.linkerd.io/gateway-ns".into(), "mc".into()),
                ])),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                cluster_ip: Some("10.1.2.3".into()),
                selector: Some(BTreeMap::from([("app".into(), "web".into())])),
                ports: Some(ports),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn port(
        name: Option<&str>,
        protocol: Option<&str>,
        p: i32,
        target: Option<IntOrString>,
    ) -> ServicePort {
        ServicePort {
            name: name.map(str::to_owned),
            protocol: protocol.map(str::to_owned),
            port: p,
            target_port: target,
            ..Default::default()
        }
    }

    fn link() -> Link {
        Link::new("east", None)
    }

    fn gw() -> GatewayRef {
        GatewayRef::new("mc", "gw")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn link_default_domain() {
        assert_eq!(Link::new("e", None).cluster_domain, "cluster.local");
        assert_eq!(Link::new("e", Some("")).cluster_domain, "cluster.local");
        assert_eq!(
            Link::new("e", Some("corp.example")).cluster_domain,
            "corp.example"
        );
    }

    #[test]
    fn service_metadata() {
        let m = desired_mirror(&remote(vec![]), &link(), &gw(), None);
        let meta = &m.service.metadata;
        assert_eq!(meta.name.as_deref(), Some("web-east"));
        assert_eq!(meta.namespace.as_deref(), Some("shop"));
        assert_eq!(meta.labels, Some(mirror_labels("east", &gw())));
        assert_eq!(
            meta.labels.as_ref().unwrap().len(),
            4,
            "exactly the four mirror labels, none copied from the remote"
        );
        assert_eq!(
            meta.annotations,
            Some(BTreeMap::from([
                (
                    "mirror.linkerd.io/remote-resource-version".into(),
                    "100".into()
                ),
                (
                    "mirror.linkerd.io/remote-svc-fq-name".into(),
                    "web.shop.svc.cluster.local".into()
                ),
            ]))
        );
        assert_eq!(meta.uid, None);
        assert_eq!(meta.resource_version, None);
    }

    #[test]
    fn mirror_labels_values() {
        assert_eq!(
            mirror_labels("east", &gw()),
            BTreeMap::from([
                ("mirror.linkerd.io/mirrored-service".into(), "true".into()),
                ("mirror.linkerd.io/cluster-name".into(), "east".into()),
                ("mirror.linkerd.io/remote-gateway-name".into(), "gw".into()),
                ("mirror.linkerd.io/remote-gateway-ns".into(), "mc".into()),
            ])
        );
    }

    #[test]
    fn gateway_resource_version_only_when_resolved() {
        let r = ResolvedGateway::new([ip("1.1.1.1")], 4143).with_resource_version("gw-7");
        let m = desired_mirror(&remote(vec![]), &link(), &gw(), Some(&r));
        assert_eq!(
            m.service.metadata.annotations.as_ref().unwrap()
                [REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION],
            "gw-7"
        );
        let m = desired_mirror(&remote(vec![]), &link(), &gw(), None);
        assert!(
            !m.service
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION)
        );
    }

    #[test]
    fn fq_name_uses_link_domain() {
        let l = Link::new("east", Some("corp.example"));
        let m = desired_mirror(&remote(vec![]), &l, &gw(), None);
        assert_eq!(
            m.service.metadata.annotations.as_ref().unwrap()[REMOTE_SVC_FQ_NAME_ANNOTATION],
            "web.shop.svc.corp.example"
        );
    }

    #[test]
    fn spec_is_cluster_ip_without_selector() {
        let m = desired_mirror(&remote(vec![]), &link(), &gw(), None);
        let spec = m.service.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.selector, None);
        assert_eq!(spec.cluster_ip, None);
        assert_eq!(spec.ports, Some(vec![]));
    }

    #[test]
    fn ports_are_copied_with_defaults() {
        let full = ServicePort {
            name: Some("http".into()),
            protocol: Some("TCP".into()),
            port: 80,
            target_port: Some(IntOrString::String("web".into())),
            node_port: Some(30080),
            app_protocol: Some("http".into()),
        };
        let table = [
            (
                full,
                port(
                    Some("http"),
                    Some("TCP"),
                    80,
                    Some(IntOrString::String("web".into())),
                ),
            ),
            (
                port(Some("dns"), Some("UDP"), 53, Some(IntOrString::Int(5353))),
                port(Some("dns"), Some("UDP"), 53, Some(IntOrString::Int(5353))),
            ),
            (
                port(None, None, 8080, None),
                port(None, Some("TCP"), 8080, Some(IntOrString::Int(8080))),
            ),
            (
                port(Some(""), Some(""), 81, Some(IntOrString::Int(0))),
                port(None, Some("TCP"), 81, Some(IntOrString::Int(81))),
            ),
            (
                port(
                    Some("x"),
                    None,
                    82,
                    Some(IntOrString::String(String::new())),
                ),
                port(Some("x"), Some("TCP"), 82, Some(IntOrString::Int(82))),
            ),
        ];
        for (input, want) in table {
            let m = desired_mirror(&remote(vec![input.clone()]), &link(), &gw(), None);
            assert_eq!(m.service.spec.unwrap().ports, Some(vec![want]), "{input:?}");
        }
    }

    #[test]
    fn endpoints_metadata() {
        let m = desired_mirror(&remote(vec![]), &link(), &gw(), None);
        let meta = &m.endpoints.metadata;
        assert_eq!(meta.name.as_deref(), Some("web-east"));
        assert_eq!(meta.namespace.as_deref(), Some("shop"));
        assert_eq!(meta.labels, Some(mirror_labels("east", &gw())));
        assert_eq!(
            meta.annotations,
            Some(BTreeMap::from([(
                REMOTE_SVC_FQ_NAME_ANNOTATION.to_owned(),
                "web.shop.svc.cluster.local".to_owned()
            )]))
        );
    }

    #[test]
    fn endpoints_subsets() {
        let ports = vec![
            port(Some("http"), None, 80, None),
            port(Some("dns"), Some("UDP"), 53, None),
        ];
        let two =
            ResolvedGateway::new([ip("10.0.0.2"), ip("10.0.0.1")], 4143).with_resource_version("1");
        let none = ResolvedGateway::new([], 4143).with_resource_version("1");
        let want = vec![EndpointSubset {
            addresses: Some(vec![
                EndpointAddress {
                    ip: "10.0.0.1".into(),
                    ..Default::default()
                },
                EndpointAddress {
                    ip: "10.0.0.2".into(),
                    ..Default::default()
                },
            ]),
            ports: Some(vec![
                EndpointPort {
                    name: Some("http".into()),
                    protocol: Some("TCP".into()),
                    port: 4143,
                    app_protocol: None,
                },
                EndpointPort {
                    name: Some("dns".into()),
                    protocol: Some("UDP".into()),
                    port: 4143,
                    app_protocol: None,
                },
            ]),
            not_ready_addresses: None,
        }];
        let dead = two.clone().with_alive(false);
        let mut not_ready = want.clone();
        not_ready[0].not_ready_addresses = not_ready[0].addresses.take();
        // One address failing its own probes: it alone is not ready.
        let one_dead = two.clone().with_dead([ip("10.0.0.2")]);
        let mut split = want.clone();
        let second = split[0].addresses.as_mut().unwrap().pop();
        split[0].not_ready_addresses = second.map(|a| vec![a]);
        // Every address dead and the gateway verdict dead: all not ready.
        let all_dead = two
            .clone()
            .with_dead([ip("10.0.0.1"), ip("10.0.0.2")])
            .with_alive(false);
        type Row<'a> = (
            &'a str,
            Option<&'a ResolvedGateway>,
            Option<Vec<EndpointSubset>>,
        );
        let table: Vec<Row> = vec![
            ("resolved", Some(&two), Some(want)),
            (
                "gateway down: same ports, addresses not ready",
                Some(&dead),
                Some(not_ready.clone()),
            ),
            (
                "one address dead: it alone not ready, the other ready",
                Some(&one_dead),
                Some(split),
            ),
            (
                "every address dead: all not ready",
                Some(&all_dead),
                Some(not_ready),
            ),
            ("resolved without addresses", Some(&none), None),
            ("unresolved", None, None),
        ];
        for (what, resolved, want) in table {
            let m = desired_mirror(&remote(ports.clone()), &link(), &gw(), resolved);
            assert_eq!(m.endpoints.subsets, want, "{what}");
        }
    }

    #[test]
    fn ipv6_addresses_are_written_canonically() {
        let r = ResolvedGateway::new([ip("fd00:0:0::1")], 4143).with_resource_version("1");
        let m = desired_mirror(
            &remote(vec![port(None, None, 80, None)]),
            &link(),
            &gw(),
            Some(&r),
        );
        let subset = &m.endpoints.subsets.unwrap()[0];
        assert_eq!(subset.addresses.as_ref().unwrap()[0].ip, "fd00::1");
    }

    #[test]
    fn long_remote_name_uses_mirror_name_rule() {
        let mut svc = remote(vec![]);
        svc.metadata.name = Some("a".repeat(63));
        let m = desired_mirror(&svc, &link(), &gw(), None);
        let name = m.service.metadata.name.clone().unwrap();
        assert_eq!(name, mirror_name(&"a".repeat(63), "east"));
        assert!(name.len() <= 63);
        assert_eq!(m.endpoints.metadata.name, Some(name));
    }

    #[test]
    fn namespace_labels() {
        let ns = desired_namespace("shop", "east");
        assert_eq!(ns.metadata.name.as_deref(), Some("shop"));
        assert_eq!(
            ns.metadata.labels,
            Some(BTreeMap::from([
                ("mirror.linkerd.io/mirrored-service".into(), "true".into()),
                ("mirror.linkerd.io/cluster-name".into(), "east".into()),
            ]))
        );
    }

    // ---- Link (`MirrorStyle::Resource`) mirrors, remote discovery, gateway identity ----

    use super::super::labels::{
        GATEWAY_NAME_ANNOTATION, GATEWAY_NS_ANNOTATION, OPAQUE_PORTS_ANNOTATION,
        TOPOLOGY_AWARE_HINTS_ANNOTATION, TOPOLOGY_MODE_ANNOTATION,
    };

    type Map = BTreeMap<String, String>;

    fn map(pairs: &[(&str, &str)]) -> Map {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn exclusions(patterns: &[&str]) -> Exclusions {
        let patterns: Vec<String> = patterns.iter().map(|p| (*p).to_owned()).collect();
        Exclusions::parse(&patterns).unwrap()
    }

    /// A `Link` resource's link (with a controller namespace, which it must ignore).
    fn resource_link(excluded_labels: &[&str], excluded_annotations: &[&str]) -> Link {
        link()
            .with_controller_namespace("mc")
            .with_style(MirrorStyle::Resource(ResourceStyle {
                excluded_labels: exclusions(excluded_labels),
                excluded_annotations: exclusions(excluded_annotations),
            }))
    }

    /// The remote `web` with exactly these labels and annotations, and one port.
    fn remote_meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Service {
        let mut s = remote(vec![port(Some("http"), None, 80, None)]);
        s.metadata.labels = Some(map(labels));
        s.metadata.annotations = Some(map(annotations));
        s
    }

    fn owner(cluster: &str) -> Vec<(&'static str, String)> {
        vec![
            (MIRRORED_SERVICE_LABEL, "true".to_owned()),
            (CLUSTER_NAME_LABEL, cluster.to_owned()),
        ]
    }

    fn with_owner(pairs: &[(&str, &str)]) -> Map {
        let mut m = map(pairs);
        m.extend(owner("east").into_iter().map(|(k, v)| (k.to_owned(), v)));
        m
    }

    const FQ: &str = "web.shop.svc.cluster.local";

    fn resolved_with(identity: Option<&str>) -> ResolvedGateway {
        ResolvedGateway::new([ip("10.0.0.1")], 4143)
            .with_resource_version("gw-7")
            .with_identity(identity.map(Into::into))
    }

    #[test]
    fn link_service_labels_are_the_remotes_minus_mirror_prefix_and_excluded_plus_owner_labels() {
        let remote_labels: &[(&str, &str)] = &[
            ("app", "web"),
            ("team", "a"),
            ("example.com/owner", "x"),
            ("example.community/x", "y"),
            ("other.io/keep", "z"),
            ("mirror.linkerd.io/exported", "true"),
            ("mirror.linkerd.io/cluster-name", "spoofed"),
            ("mirror.linkerd.io/mirrored-service", "false"),
            ("mirror.linkerd.iox/other", "w"),
        ];
        type Row<'a> = (&'a str, Vec<&'a str>, Map);
        let table: Vec<Row> = vec![
            (
                "no exclusions: every label but the mirror.linkerd.io* ones",
                vec![],
                with_owner(&[
                    ("app", "web"),
                    ("team", "a"),
                    ("example.com/owner", "x"),
                    ("example.community/x", "y"),
                    ("other.io/keep", "z"),
                ]),
            ),
            (
                "an exact exclusion drops that key only",
                vec!["team"],
                with_owner(&[
                    ("app", "web"),
                    ("example.com/owner", "x"),
                    ("example.community/x", "y"),
                    ("other.io/keep", "z"),
                ]),
            ),
            (
                "a prefix/* exclusion drops every key starting with prefix (Linkerd's HasPrefix)",
                vec!["example.com/*"],
                with_owner(&[("app", "web"), ("team", "a"), ("other.io/keep", "z")]),
            ),
            (
                "an exact exclusion is not a prefix",
                vec!["example.com", "tea"],
                with_owner(&[
                    ("app", "web"),
                    ("team", "a"),
                    ("example.com/owner", "x"),
                    ("example.community/x", "y"),
                    ("other.io/keep", "z"),
                ]),
            ),
            (
                "/* excludes every copied label, never the owner labels",
                vec!["/*"],
                with_owner(&[]),
            ),
            (
                "excluding an owner label changes nothing",
                vec![
                    MIRRORED_SERVICE_LABEL,
                    CLUSTER_NAME_LABEL,
                    "mirror.linkerd.io/*",
                ],
                with_owner(&[
                    ("app", "web"),
                    ("team", "a"),
                    ("example.com/owner", "x"),
                    ("example.community/x", "y"),
                    ("other.io/keep", "z"),
                ]),
            ),
        ];
        for (what, excluded, want) in table {
            let l = resource_link(&excluded, &[]);
            let r = resolved_with(Some("gw.mc.serviceaccount.identity.cluster.local"));
            for resolved in [None, Some(&r)] {
                let m = desired_mirror(&remote_meta(remote_labels, &[]), &l, &gw(), resolved);
                assert_eq!(m.service.metadata.labels.as_ref(), Some(&want), "{what}");
                assert_eq!(
                    m.endpoints.metadata.labels.as_ref(),
                    Some(&want),
                    "{what}: Endpoints labels are the Service's"
                );
            }
        }
    }

    #[test]
    fn link_service_annotations_are_the_remotes_minus_topology_export_and_excluded_plus_fq_and_version()
     {
        let remote_annotations: &[(&str, &str)] = &[
            ("a", "1"),
            ("b", "2"),
            ("example.com/x", "3"),
            ("example.community/y", "4"),
            (OPAQUE_PORTS_ANNOTATION, "3306"),
            (TOPOLOGY_AWARE_HINTS_ANNOTATION, "auto"),
            (TOPOLOGY_MODE_ANNOTATION, "Auto"),
            (GATEWAY_NAME_ANNOTATION, "gw"),
            (GATEWAY_NS_ANNOTATION, "mc"),
            ("mirror.linkerd.io/probe-path", "/health"),
            // Keys the mirror sets itself: the remote's never win.
            (REMOTE_SVC_FQ_NAME_ANNOTATION, "spoofed.other.svc.x"),
            (REMOTE_RESOURCE_VERSION_ANNOTATION, "1"),
        ];
        let fixed = |pairs: &[(&str, &str)]| {
            let mut m = map(pairs);
            m.extend(map(&[
                (REMOTE_SVC_FQ_NAME_ANNOTATION, FQ),
                (REMOTE_RESOURCE_VERSION_ANNOTATION, "100"),
            ]));
            m
        };
        type Row<'a> = (&'a str, Vec<&'a str>, Map);
        let table: Vec<Row> = vec![
            (
                "no exclusions",
                vec![],
                fixed(&[
                    ("a", "1"),
                    ("b", "2"),
                    ("example.com/x", "3"),
                    ("example.community/y", "4"),
                    (OPAQUE_PORTS_ANNOTATION, "3306"),
                    ("mirror.linkerd.io/probe-path", "/health"),
                ]),
            ),
            (
                "exact",
                vec!["b"],
                fixed(&[
                    ("a", "1"),
                    ("example.com/x", "3"),
                    ("example.community/y", "4"),
                    (OPAQUE_PORTS_ANNOTATION, "3306"),
                    ("mirror.linkerd.io/probe-path", "/health"),
                ]),
            ),
            (
                "prefix/*",
                vec!["example.com/*"],
                fixed(&[
                    ("a", "1"),
                    ("b", "2"),
                    (OPAQUE_PORTS_ANNOTATION, "3306"),
                    ("mirror.linkerd.io/probe-path", "/health"),
                ]),
            ),
            (
                "opaque-ports is kept even when excluded exactly",
                vec![OPAQUE_PORTS_ANNOTATION, "a"],
                fixed(&[
                    ("b", "2"),
                    ("example.com/x", "3"),
                    ("example.community/y", "4"),
                    (OPAQUE_PORTS_ANNOTATION, "3306"),
                    ("mirror.linkerd.io/probe-path", "/health"),
                ]),
            ),
            (
                "everything excluded: opaque-ports and the mirror's own remain",
                vec!["/*"],
                fixed(&[(OPAQUE_PORTS_ANNOTATION, "3306")]),
            ),
            (
                "excluding the mirror's own annotations changes nothing",
                vec![REMOTE_SVC_FQ_NAME_ANNOTATION, "mirror.linkerd.io/*"],
                fixed(&[
                    ("a", "1"),
                    ("b", "2"),
                    ("example.com/x", "3"),
                    ("example.community/y", "4"),
                    (OPAQUE_PORTS_ANNOTATION, "3306"),
                ]),
            ),
        ];
        for (what, excluded, want) in table {
            let l = resource_link(&[], &excluded);
            let r = resolved_with(None);
            for resolved in [None, Some(&r)] {
                let m = desired_mirror(&remote_meta(&[], remote_annotations), &l, &gw(), resolved);
                assert_eq!(
                    m.service.metadata.annotations.as_ref(),
                    Some(&want),
                    "{what}"
                );
            }
        }
    }

    #[test]
    fn link_exclusions_of_labels_and_annotations_are_independent() {
        let remote = remote_meta(&[("k", "label")], &[("k", "annotation")]);
        let only_labels = desired_mirror(&remote, &resource_link(&["k"], &[]), &gw(), None);
        assert!(
            !only_labels
                .service
                .metadata
                .labels
                .unwrap()
                .contains_key("k")
        );
        assert_eq!(
            only_labels.service.metadata.annotations.unwrap()["k"],
            "annotation"
        );
        let only_annotations = desired_mirror(&remote, &resource_link(&[], &["k"]), &gw(), None);
        assert_eq!(
            only_annotations.service.metadata.labels.unwrap()["k"],
            "label"
        );
        assert!(
            !only_annotations
                .service
                .metadata
                .annotations
                .unwrap()
                .contains_key("k")
        );
    }

    #[test]
    fn link_mirrors_carry_none_of_the_secret_link_metadata() {
        let remote = remote_meta(&[("app", "web")], &[("a", "1")]);
        let l = resource_link(&[], &[]);
        let r = resolved_with(Some("gw.mc.serviceaccount.identity.cluster.local"));
        let secret_only_labels = [REMOTE_GATEWAY_NAME_LABEL, REMOTE_GATEWAY_NS_LABEL];
        let secret_only_annotations = [
            REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION,
            CONTROLLER_NAMESPACE_ANNOTATION,
        ];
        let mirrors = [
            (
                "gateway, resolved",
                desired_mirror(&remote, &l, &gw(), Some(&r)),
            ),
            (
                "gateway, unresolved",
                desired_mirror(&remote, &l, &gw(), None),
            ),
            ("remote discovery", remote_discovery_mirror(&remote, &l)),
        ];
        for (what, m) in mirrors {
            assert_eq!(m.ownership, MetadataOwnership::All, "{what}");
            for meta in [&m.service.metadata, &m.endpoints.metadata] {
                let labels = meta.labels.as_ref().unwrap();
                let annotations = meta.annotations.as_ref().unwrap();
                for k in secret_only_labels {
                    assert!(!labels.contains_key(k), "{what}: label {k}");
                }
                for k in secret_only_annotations {
                    assert!(!annotations.contains_key(k), "{what}: annotation {k}");
                }
            }
        }
    }

    #[test]
    fn link_endpoints_annotations_are_the_fq_name_and_the_gateway_identity_only() {
        let remote = remote_meta(
            &[("app", "web")],
            &[("a", "1"), (OPAQUE_PORTS_ANNOTATION, "1")],
        );
        let identity = "gw.mc.serviceaccount.identity.cluster.local";
        let l = resource_link(&[], &[]);
        let table = [
            (
                "with identity",
                Some(resolved_with(Some(identity))),
                map(&[
                    (REMOTE_SVC_FQ_NAME_ANNOTATION, FQ),
                    (REMOTE_GATEWAY_IDENTITY_ANNOTATION, identity),
                ]),
            ),
            (
                "without identity",
                Some(resolved_with(None)),
                map(&[(REMOTE_SVC_FQ_NAME_ANNOTATION, FQ)]),
            ),
            (
                "unresolved",
                None,
                map(&[(REMOTE_SVC_FQ_NAME_ANNOTATION, FQ)]),
            ),
        ];
        for (what, resolved, want) in table {
            let m = desired_mirror(&remote, &l, &gw(), resolved.as_ref());
            assert_eq!(m.endpoints.metadata.annotations, Some(want), "{what}");
        }
    }

    #[test]
    fn link_endpoints_subsets_and_ports_are_as_for_secret_links() {
        let ports = vec![
            port(Some("http"), None, 80, None),
            port(Some("dns"), Some("UDP"), 53, None),
        ];
        let mut remote = remote(ports);
        remote.metadata.labels = Some(map(&[("app", "web")]));
        let r =
            ResolvedGateway::new([ip("10.0.0.2"), ip("10.0.0.1")], 4143).with_resource_version("1");
        for resolved in [None, Some(r.clone()), Some(r.with_alive(false))] {
            let secret = desired_mirror(&remote, &link(), &gw(), resolved.as_ref());
            let resource =
                desired_mirror(&remote, &resource_link(&[], &[]), &gw(), resolved.as_ref());
            assert_eq!(resource.endpoints.subsets, secret.endpoints.subsets);
            assert_eq!(resource.service.spec, secret.service.spec);
            assert!(resource.has_endpoints && secret.has_endpoints);
        }
    }

    #[test]
    fn secret_link_mirrors_copy_nothing_from_the_remote() {
        let remote = remote_meta(
            &[("app", "web"), ("team", "a")],
            &[("a", "1"), (OPAQUE_PORTS_ANNOTATION, "3306")],
        );
        let r = resolved_with(None);
        let l = link().with_controller_namespace("mc");
        let m = desired_mirror(&remote, &l, &gw(), Some(&r));
        assert_eq!(m.ownership, MetadataOwnership::Keys);
        assert!(m.has_endpoints);
        assert_eq!(
            m.service.metadata.labels,
            Some(mirror_labels("east", &gw()))
        );
        assert_eq!(
            m.endpoints.metadata.labels,
            Some(mirror_labels("east", &gw()))
        );
        assert_eq!(
            m.service.metadata.annotations,
            Some(map(&[
                (REMOTE_RESOURCE_VERSION_ANNOTATION, "100"),
                (REMOTE_SVC_FQ_NAME_ANNOTATION, FQ),
                (REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION, "gw-7"),
                (CONTROLLER_NAMESPACE_ANNOTATION, "mc"),
            ]))
        );
        assert_eq!(
            m.endpoints.metadata.annotations,
            Some(map(&[
                (REMOTE_SVC_FQ_NAME_ANNOTATION, FQ),
                (CONTROLLER_NAMESPACE_ANNOTATION, "mc"),
            ]))
        );
    }

    #[test]
    fn gateway_identity_is_on_the_endpoints_of_both_styles_only_when_the_gateway_has_one() {
        let identity =
            "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local";
        let remote = remote_meta(&[("app", "web")], &[]);
        let styles = [("secret", link()), ("resource", resource_link(&[], &[]))];
        type Row<'a> = (&'a str, Option<ResolvedGateway>, Option<&'a str>);
        let table: Vec<Row> = vec![
            (
                "identity",
                Some(resolved_with(Some(identity))),
                Some(identity),
            ),
            ("no identity", Some(resolved_with(None)), None),
            ("empty identity", Some(resolved_with(Some(""))), None),
            (
                "identity, gateway down",
                Some(resolved_with(Some(identity)).with_alive(false)),
                Some(identity),
            ),
            ("unresolved", None, None),
        ];
        for (style, l) in &styles {
            for (what, resolved, want) in &table {
                let m = desired_mirror(&remote, l, &gw(), resolved.as_ref());
                let got = m.endpoints.metadata.annotations.as_ref().unwrap();
                assert_eq!(
                    got.get(REMOTE_GATEWAY_IDENTITY_ANNOTATION)
                        .map(String::as_str),
                    *want,
                    "{style}: {what}"
                );
                assert!(
                    !m.service
                        .metadata
                        .annotations
                        .as_ref()
                        .unwrap()
                        .contains_key(REMOTE_GATEWAY_IDENTITY_ANNOTATION),
                    "{style}: {what}: never on the Service"
                );
            }
        }
        // A Secret link's mirror with an identity is the old mirror plus that one key.
        let with = desired_mirror(
            &remote,
            &link(),
            &gw(),
            Some(&resolved_with(Some(identity))),
        );
        let without = desired_mirror(&remote, &link(), &gw(), Some(&resolved_with(None)));
        assert_eq!(with.service, without.service);
        assert_eq!(with.endpoints.subsets, without.endpoints.subsets);
        let mut stripped = with.endpoints.metadata.clone();
        stripped
            .annotations
            .as_mut()
            .unwrap()
            .remove(REMOTE_GATEWAY_IDENTITY_ANNOTATION);
        assert_eq!(stripped, without.endpoints.metadata);
    }

    #[test]
    fn remote_discovery_mirror_is_the_service_labelled_for_discovery_with_no_endpoints() {
        let remote = remote_meta(
            &[
                ("app", "web"),
                ("team", "a"),
                // A remote's own discovery labels never win over ours.
                (REMOTE_DISCOVERY_LABEL, "other"),
                (REMOTE_SERVICE_LABEL, "other"),
            ],
            &[("a", "1")],
        );
        let l = resource_link(&["team"], &[]);
        let m = remote_discovery_mirror(&remote, &l);
        assert!(!m.has_endpoints);
        assert_eq!(m.ownership, MetadataOwnership::All);
        assert_eq!(
            m.service.metadata.labels,
            Some(with_owner(&[
                ("app", "web"),
                (REMOTE_DISCOVERY_LABEL, "east"),
                (REMOTE_SERVICE_LABEL, "web"),
            ]))
        );
        assert_eq!(
            m.service.metadata.annotations,
            Some(map(&[
                ("a", "1"),
                (REMOTE_SVC_FQ_NAME_ANNOTATION, FQ),
                (REMOTE_RESOURCE_VERSION_ANNOTATION, "100"),
            ]))
        );
        assert_eq!(m.endpoints.subsets, None, "no gateway, no addresses");
        // The Service is the gateway mirror's, plus the two discovery labels.
        let gateway = desired_mirror(&remote, &l, &gw(), Some(&resolved_with(None)));
        let mut labels = m.service.metadata.labels.clone().unwrap();
        assert_eq!(
            labels.remove(REMOTE_DISCOVERY_LABEL).as_deref(),
            Some("east")
        );
        assert_eq!(labels.remove(REMOTE_SERVICE_LABEL).as_deref(), Some("web"));
        let mut gateway_labels = gateway.service.metadata.labels.clone().unwrap();
        gateway_labels.remove(REMOTE_DISCOVERY_LABEL);
        gateway_labels.remove(REMOTE_SERVICE_LABEL);
        assert_eq!(labels, gateway_labels);
        assert_eq!(
            m.service.metadata.annotations,
            gateway.service.metadata.annotations
        );
        assert_eq!(m.service.spec, gateway.service.spec);
        assert_eq!(m.service.metadata.name.as_deref(), Some("web-east"));
    }

    #[test]
    fn remote_discovery_labels_name_the_link_and_the_remote_service() {
        let table = [("web", "east"), ("api", "west-2")];
        for (name, cluster) in table {
            let mut remote = remote_meta(&[], &[]);
            remote.metadata.name = Some(name.into());
            let l = Link::new(cluster, None)
                .with_style(MirrorStyle::Resource(ResourceStyle::default()));
            let labels = remote_discovery_mirror(&remote, &l)
                .service
                .metadata
                .labels
                .unwrap();
            assert_eq!(labels[REMOTE_DISCOVERY_LABEL], cluster);
            assert_eq!(labels[REMOTE_SERVICE_LABEL], name);
            assert_eq!(labels[CLUSTER_NAME_LABEL], cluster);
            assert_eq!(labels[MIRRORED_SERVICE_LABEL], "true");
        }
    }

    #[test]
    fn a_remote_skip_mirror_label_never_reaches_a_link_mirrors_endpoints() {
        // The endpoints mode alone decides skip-mirror (`plan`): copied, it would stop
        // kube-controller-manager mirroring the Endpoints in `endpoints` mode, and
        // nothing would route the mirror.
        let remote = remote_meta(&[(SKIP_MIRROR_LABEL, "true"), ("app", "web")], &[]);
        let m = desired_mirror(&remote, &resource_link(&[], &[]), &gw(), None);
        assert_eq!(
            m.endpoints.metadata.labels,
            Some(with_owner(&[("app", "web")]))
        );
        assert_eq!(
            m.service.metadata.labels.unwrap()[SKIP_MIRROR_LABEL],
            "true"
        );
    }
}
