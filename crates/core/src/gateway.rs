//! Gateways: which gateway an exported Service names, and what a gateway Service
//! offers (addresses and port) once checked.

use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;

use super::labels::{
    GATEWAY_IDENTITY_ANNOTATION, GATEWAY_NAME_ANNOTATION, GATEWAY_NS_ANNOTATION, GATEWAY_PORT_NAME,
};
use super::naming::is_dns1123_subdomain;

/// Identifies a gateway Service in a remote cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GatewayRef {
    /// Namespace of the gateway Service.
    pub namespace: String,
    /// Name of the gateway Service.
    pub name: String,
}

impl GatewayRef {
    /// Builds a reference from a namespace and a name.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for GatewayRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The gateway a remote Service is exported through, or `None` when it is not
/// exported (both gateway annotations are needed, and must be non-empty).
pub fn exported_gateway(service: &Service) -> Option<GatewayRef> {
    let annotations = service.metadata.annotations.as_ref()?;
    let name = annotations.get(GATEWAY_NAME_ANNOTATION)?;
    let namespace = annotations.get(GATEWAY_NS_ANNOTATION)?;
    if name.is_empty() || namespace.is_empty() {
        return None;
    }
    Some(GatewayRef::new(namespace, name))
}

/// Why a gateway cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    /// The gateway Service does not exist in the remote cluster.
    #[error("gateway Service not found in the remote cluster")]
    NotFound,
    /// The gateway has no `status.loadBalancer.ingress` entry yet.
    #[error("gateway has no status.loadBalancer.ingress entry")]
    NoIngress,
    /// The gateway has no port named `mc-gateway`.
    #[error("gateway has no port named \"{GATEWAY_PORT_NAME}\"")]
    NoGatewayPort,
    /// Every ingress entry is unusable (unparsable IP, or neither IP nor hostname).
    #[error("gateway has no usable ingress entry (invalid: {})", .invalid.join(", "))]
    NoUsableIngress {
        /// Descriptions of the rejected entries.
        invalid: Vec<String>,
    },
}

impl GatewayError {
    /// A bounded name of the error, for metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            GatewayError::NotFound => "NotFound",
            GatewayError::NoIngress => "NoIngress",
            GatewayError::NoGatewayPort => "NoGatewayPort",
            GatewayError::NoUsableIngress { .. } => "NoUsableIngress",
        }
    }
}

/// What a usable gateway Service offers, before hostnames are resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewaySpec {
    /// Ingress IP addresses, in ingress order.
    pub ips: Vec<IpAddr>,
    /// Ingress hostnames, to be resolved to IP addresses by the caller.
    pub hostnames: Vec<String>,
    /// The `port` of the gateway's `mc-gateway` port.
    pub port: i32,
    /// The gateway Service's resourceVersion.
    pub resource_version: String,
    /// Descriptions of skipped ingress entries, for the caller to warn about.
    pub invalid_ingress: Vec<String>,
    /// The gateway's TLS identity (`mirror.linkerd.io/gateway-identity`, or a Link's
    /// `gatewayIdentity`), annotated on the mirrors' Endpoints.
    pub identity: Option<String>,
}

impl GatewaySpec {
    /// The resolved gateway, given the addresses the hostnames resolved to.
    pub fn into_resolved(
        self,
        resolved_hostnames: impl IntoIterator<Item = IpAddr>,
    ) -> ResolvedGateway {
        ResolvedGateway::new(self.ips.into_iter().chain(resolved_hostnames), self.port)
            .with_resource_version(self.resource_version)
            .with_identity(self.identity)
    }
}

/// Checks a gateway Service and extracts its ingress addresses and port.
///
/// An ingress entry with a parsable `ip` gives an address; otherwise a non-empty
/// `hostname` is kept for resolution (an Endpoints address must be an IP). Entries
/// with an unparsable `ip` are reported in `invalid_ingress`, as are entries with
/// neither field; an error is returned only when no entry is usable.
pub fn gateway_spec(gateway: &Service) -> Result<GatewaySpec, GatewayError> {
    let ingress = gateway
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    if ingress.is_empty() {
        return Err(GatewayError::NoIngress);
    }
    let port = gateway
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default()
        .iter()
        .find(|p| p.name.as_deref() == Some(GATEWAY_PORT_NAME))
        .map(|p| p.port)
        .ok_or(GatewayError::NoGatewayPort)?;

    let mut ips = Vec::new();
    let mut hostnames = Vec::new();
    let mut invalid_ingress = Vec::new();
    for entry in ingress {
        let ip = entry.ip.as_deref().filter(|s| !s.is_empty());
        let hostname = entry.hostname.as_deref().filter(|s| !s.is_empty());
        // Canonical: an IPv4-mapped IPv6 address (::ffff:a.b.c.d) is the IPv4 address, so
        // it lands in an IPv4 slice (an IPv6 slice refuses it) and meets the IPv4 checks.
        // Every parsed IP is kept, even one the apiserver refuses in Endpoints (loopback,
        // link-local, multicast, unspecified): the address policy refuses it, visibly
        // (an Event and a count naming the built-in denial), not silently here.
        match ip.map(|s| (s, s.parse::<IpAddr>().map(|a| a.to_canonical()))) {
            Some((_, Ok(addr))) => {
                ips.push(addr);
                continue;
            }
            Some((raw, Err(_))) => invalid_ingress.push(format!("unparsable ip {raw:?}")),
            None => {}
        }
        match hostname {
            Some(h) => hostnames.push(h.to_owned()),
            None if ip.is_none() => {
                invalid_ingress.push("entry with neither ip nor hostname".to_owned())
            }
            None => {}
        }
    }
    if ips.is_empty() && hostnames.is_empty() {
        return Err(GatewayError::NoUsableIngress {
            invalid: invalid_ingress,
        });
    }
    Ok(GatewaySpec {
        ips,
        hostnames,
        port,
        resource_version: gateway
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default(),
        invalid_ingress,
        identity: gateway
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(GATEWAY_IDENTITY_ANNOTATION))
            .filter(|i| valid_identity(i))
            .cloned(),
    })
}

/// Whether `identity` can be a gateway identity: a DNS name (Linkerd's identities are
/// `<sa>.<ns>.serviceaccount.identity.<trust domain>`). The value is remote-chosen text
/// copied onto local objects, so anything else is dropped rather than copied.
pub fn valid_identity(identity: &str) -> bool {
    is_dns1123_subdomain(identity)
}

/// Whether the apiserver accepts `ip` as an Endpoints address: it refuses unspecified,
/// loopback, link-local and multicast addresses (and a remote must not point local
/// clients at the local node itself).
pub fn endpoint_ip_allowed(ip: &IpAddr) -> bool {
    // ::ffff:127.0.0.1 is loopback too.
    let ip = &ip.to_canonical();
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    !(ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || link_local)
}

/// A gateway whose addresses are all IPs: what a link's mirrors, a federated Service's
/// member slices and a ServiceImport's source slices point at (the one gateway value
/// of the crate; a link resolves it and reports it to federation and MCS).
///
/// Canonical, so equal gateways are equal values (and give equal objects): built by
/// [`ResolvedGateway::new`] and [`ResolvedGateway::with_dead`], `addresses` and `dead`
/// are canonical (an IPv4-mapped IPv6 address is the IPv4 one), sorted and without
/// duplicates; [`ResolvedGateway::is_ready`] relies on it (a binary search).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedGateway {
    /// Gateway addresses: canonical, sorted and without duplicates.
    pub addresses: Vec<IpAddr>,
    /// The gateway's `mc-gateway` port.
    pub port: i32,
    /// The gateway Service's resourceVersion when resolved, for a link's mirrors (their
    /// `remote-gateway-resource-version`); `None` where no object carries it (the
    /// gateway a link reports to federation and MCS: a new version alone is no change
    /// of theirs).
    pub resource_version: Option<String>,
    /// False while every address fails its probes (or the remote's stale policy says
    /// so): every address is then not ready.
    pub alive: bool,
    /// The addresses whose own probes fail: canonical, sorted, without duplicates. Not
    /// ready alone while the others stay ready (each address of a gateway is probed).
    pub dead: Vec<IpAddr>,
    /// The gateway's TLS identity, if it has one.
    pub identity: Option<String>,
}

/// `addresses`, canonical, sorted and without duplicates.
fn canonical(addresses: impl IntoIterator<Item = IpAddr>) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = addresses.into_iter().map(|a| a.to_canonical()).collect();
    out.sort();
    out.dedup();
    out
}

impl ResolvedGateway {
    /// Builds a resolved gateway: alive, no dead address, no identity, no
    /// resourceVersion. Addresses are made canonical, sorted and deduplicated so that
    /// equal sets give equal values (and so equal objects).
    pub fn new(addresses: impl IntoIterator<Item = IpAddr>, port: i32) -> Self {
        Self {
            addresses: canonical(addresses),
            port,
            resource_version: None,
            alive: true,
            dead: Vec::new(),
            identity: None,
        }
    }

    /// The same gateway with the gateway Service's resourceVersion.
    pub fn with_resource_version(mut self, resource_version: impl Into<String>) -> Self {
        self.resource_version = Some(resource_version.into());
        self
    }

    /// The same gateway without a resourceVersion (what federation and MCS are told).
    pub fn without_resource_version(mut self) -> Self {
        self.resource_version = None;
        self
    }

    /// The same gateway with its identity.
    pub fn with_identity(mut self, identity: Option<String>) -> Self {
        self.identity = identity;
        self
    }

    /// The same gateway with its probe verdict.
    pub fn with_alive(mut self, alive: bool) -> Self {
        self.alive = alive;
        self
    }

    /// The same gateway with the addresses whose own probes fail (made canonical,
    /// sorted and deduplicated).
    pub fn with_dead(mut self, dead: impl IntoIterator<Item = IpAddr>) -> Self {
        self.dead = canonical(dead);
        self
    }

    /// Whether address `ip` of the gateway is ready: the gateway alive and that
    /// address's own probes passing.
    pub fn is_ready(&self, ip: &IpAddr) -> bool {
        // `dead` is sorted by every constructor (`with_dead`); a hand-built value must
        // keep it so.
        debug_assert!(self.dead.is_sorted(), "ResolvedGateway::dead not sorted");
        self.alive && self.dead.binary_search(&ip.to_canonical()).is_err()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, ServicePort, ServiceSpec, ServiceStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn annotated(pairs: &[(&str, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                annotations: Some(
                    pairs
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn ingress(ip: Option<&str>, hostname: Option<&str>) -> LoadBalancerIngress {
        LoadBalancerIngress {
            ip: ip.map(str::to_owned),
            hostname: hostname.map(str::to_owned),
            ..Default::default()
        }
    }

    fn gateway(ports: &[(&str, i32)], ingress: Option<Vec<LoadBalancerIngress>>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("gw".into()),
                namespace: Some("mc".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(
                    ports
                        .iter()
                        .map(|(name, port)| ServicePort {
                            name: Some((*name).to_owned()),
                            port: *port,
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus { ingress }),
                ..Default::default()
            }),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn exported_gateway_needs_both_annotations() {
        let n = GATEWAY_NAME_ANNOTATION;
        let s = GATEWAY_NS_ANNOTATION;
        let table: Vec<(Service, Option<GatewayRef>)> = vec![
            (
                annotated(&[(n, "gw"), (s, "mc")]),
                Some(GatewayRef::new("mc", "gw")),
            ),
            (annotated(&[(n, "gw")]), None),
            (annotated(&[(s, "mc")]), None),
            (annotated(&[(n, ""), (s, "mc")]), None),
            (annotated(&[(n, "gw"), (s, "")]), None),
            (annotated(&[]), None),
            (Service::default(), None),
        ];
        for (svc, want) in table {
            assert_eq!(exported_gateway(&svc), want, "{:?}", svc.metadata);
        }
    }

    #[test]
    fn gateway_ref_display() {
        assert_eq!(GatewayRef::new("mc", "gw").to_string(), "mc/gw");
    }

    #[test]
    fn gateway_spec_errors() {
        let good_port = [("mc-gateway", 4143)];
        let table: Vec<(&str, Service, GatewayError)> = vec![
            (
                "no status",
                {
                    let mut g = gateway(&good_port, None);
                    g.status = None;
                    g
                },
                GatewayError::NoIngress,
            ),
            (
                "no ingress",
                gateway(&good_port, None),
                GatewayError::NoIngress,
            ),
            (
                "empty ingress",
                gateway(&good_port, Some(vec![])),
                GatewayError::NoIngress,
            ),
            (
                "no mc-gateway port",
                gateway(&[("http", 80)], Some(vec![ingress(Some("1.2.3.4"), None)])),
                GatewayError::NoGatewayPort,
            ),
            (
                "no spec",
                {
                    let mut g = gateway(&[], Some(vec![ingress(Some("1.2.3.4"), None)]));
                    g.spec = None;
                    g
                },
                GatewayError::NoGatewayPort,
            ),
            (
                "only bad entries",
                gateway(
                    &good_port,
                    Some(vec![ingress(Some("not-an-ip"), None), ingress(None, None)]),
                ),
                GatewayError::NoUsableIngress {
                    invalid: vec![
                        "unparsable ip \"not-an-ip\"".to_owned(),
                        "entry with neither ip nor hostname".to_owned(),
                    ],
                },
            ),
            (
                "empty strings",
                gateway(&good_port, Some(vec![ingress(Some(""), Some(""))])),
                GatewayError::NoUsableIngress {
                    invalid: vec!["entry with neither ip nor hostname".to_owned()],
                },
            ),
        ];
        for (what, svc, want) in table {
            assert_eq!(gateway_spec(&svc), Err(want), "{what}");
        }
    }

    #[test]
    fn endpoint_addresses_the_apiserver_refuses_are_rejected() {
        for (ip, ok) in [
            ("192.0.2.1", true),
            ("2001:db8::1", true),
            ("127.0.0.1", false),
            ("::1", false),
            ("0.0.0.0", false),
            ("169.254.1.1", false),
            ("fe80::1", false),
            ("224.0.0.1", false),
            ("ff02::1", false),
            ("::ffff:127.0.0.1", false),
            ("::ffff:169.254.169.254", false),
            ("::ffff:192.0.2.1", true),
        ] {
            assert_eq!(endpoint_ip_allowed(&ip.parse().unwrap()), ok, "{ip}");
        }
    }

    #[test]
    fn gateway_spec_collects_ips_hostnames_and_invalid() {
        let g = gateway(
            &[("mc-probe", 4191), ("mc-gateway", 4143)],
            Some(vec![
                ingress(Some("10.0.0.2"), None),
                ingress(Some("fd00::1"), None),
                ingress(None, Some("lb.example.com")),
                ingress(Some("10.0.0.1"), Some("ignored.example.com")),
                ingress(Some("bogus"), Some("fallback.example.com")),
                ingress(Some("999.1.1.1"), None),
                ingress(None, None),
                // Kept for the address policy to refuse visibly.
                ingress(Some("127.0.0.1"), None),
                ingress(Some("::ffff:169.254.169.254"), None),
            ]),
        );
        let spec = gateway_spec(&g).unwrap();
        assert_eq!(
            spec,
            GatewaySpec {
                ips: vec![
                    ip("10.0.0.2"),
                    ip("fd00::1"),
                    ip("10.0.0.1"),
                    ip("127.0.0.1"),
                    ip("169.254.169.254"),
                ],
                hostnames: vec!["lb.example.com".into(), "fallback.example.com".into()],
                port: 4143,
                resource_version: "42".into(),
                invalid_ingress: vec![
                    "unparsable ip \"bogus\"".into(),
                    "unparsable ip \"999.1.1.1\"".into(),
                    "entry with neither ip nor hostname".into(),
                ],
                identity: None,
            }
        );
    }

    #[test]
    fn gateway_spec_hostname_only_is_usable() {
        let g = gateway(
            &[("mc-gateway", 4143)],
            Some(vec![ingress(None, Some("lb.example.com"))]),
        );
        let spec = gateway_spec(&g).unwrap();
        assert!(spec.ips.is_empty());
        assert_eq!(spec.hostnames, vec!["lb.example.com".to_owned()]);
        assert!(spec.invalid_ingress.is_empty());
    }

    #[test]
    fn resolved_gateway_sorts_and_dedups() {
        let r = ResolvedGateway::new(
            [ip("10.0.0.2"), ip("::1"), ip("10.0.0.1"), ip("10.0.0.2")],
            4143,
        )
        .with_resource_version("7");
        assert_eq!(r.addresses, vec![ip("10.0.0.1"), ip("10.0.0.2"), ip("::1")]);
        assert_eq!(r.port, 4143);
        assert_eq!(r.resource_version.as_deref(), Some("7"));
        assert_eq!(ResolvedGateway::new([], 4143).resource_version, None);
    }

    #[test]
    fn an_ipv4_mapped_address_is_the_ipv4_address() {
        let r = ResolvedGateway::new([ip("::ffff:192.0.2.1"), ip("192.0.2.1")], 4143);
        assert_eq!(r.addresses, vec![ip("192.0.2.1")]);
        assert!(r.addresses[0].is_ipv4(), "so it goes to the IPv4 slice");
    }

    #[test]
    fn an_address_is_ready_unless_dead_whatever_order_or_form_the_dead_come_in() {
        let addrs = [ip("192.0.2.1"), ip("192.0.2.2"), ip("2001:db8::1")];
        type Row<'a> = (&'a str, bool, Vec<IpAddr>, [bool; 3]);
        let table: Vec<Row> = vec![
            ("none dead", true, vec![], [true, true, true]),
            ("one dead", true, vec![ip("192.0.2.2")], [true, false, true]),
            (
                "unsorted, duplicated",
                true,
                vec![ip("2001:db8::1"), ip("192.0.2.1"), ip("2001:db8::1")],
                [false, true, false],
            ),
            (
                "IPv4-mapped",
                true,
                vec![ip("::ffff:192.0.2.2")],
                [true, false, true],
            ),
            ("the gateway dead", false, vec![], [false, false, false]),
        ];
        for (what, alive, dead, want) in table {
            let g = ResolvedGateway::new(addrs, 4143)
                .with_alive(alive)
                .with_dead(dead);
            let mut sorted = g.dead.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(g.dead, sorted, "{what}: dead kept canonical");
            let got = addrs.map(|a| g.is_ready(&a));
            assert_eq!(got, want, "{what}");
            // Asked in the mapped form, the same answer.
            let mapped = ip("::ffff:192.0.2.2");
            assert_eq!(g.is_ready(&mapped), want[1], "{what}: mapped");
        }
    }

    #[test]
    fn into_resolved_merges_hostname_addresses() {
        let g = gateway(
            &[("mc-gateway", 4143)],
            Some(vec![
                ingress(Some("10.0.0.2"), None),
                ingress(None, Some("lb.example.com")),
            ]),
        );
        let r = gateway_spec(&g)
            .unwrap()
            .into_resolved([ip("10.0.0.3"), ip("10.0.0.2")]);
        assert_eq!(
            r,
            ResolvedGateway::new([ip("10.0.0.2"), ip("10.0.0.3")], 4143)
                .with_resource_version("42")
        );
    }

    #[test]
    fn error_messages_are_clear() {
        assert_eq!(
            GatewayError::NoGatewayPort.to_string(),
            "gateway has no port named \"mc-gateway\""
        );
        assert_eq!(
            GatewayError::NoUsableIngress {
                invalid: vec!["a".into(), "b".into()]
            }
            .to_string(),
            "gateway has no usable ingress entry (invalid: a, b)"
        );
    }

    #[test]
    fn gateway_identity_is_read_from_the_gateway_annotation_only_when_valid() {
        let good =
            "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local";
        let too_long = format!("{}.x", "a".repeat(253));
        let table: Vec<(&str, Option<&str>, Option<&str>)> = vec![
            ("absent", None, None),
            ("valid", Some(good), Some(good)),
            ("one label", Some("gateway"), Some("gateway")),
            ("empty", Some(""), None),
            ("uppercase", Some("Gateway.mc.serviceaccount"), None),
            ("spaces", Some("gw mc"), None),
            ("a trailing dot", Some("gw.mc."), None),
            ("a leading dash", Some("-gw.mc"), None),
            ("a path", Some("gw/mc"), None),
            ("an injected newline", Some("gw.mc\nx: y"), None),
            ("too long", Some(too_long.as_str()), None),
        ];
        for (what, annotation, want) in table {
            let mut g = gateway(
                &[("mc-gateway", 4143)],
                Some(vec![ingress(Some("1.2.3.4"), None)]),
            );
            if let Some(a) = annotation {
                g.metadata.annotations = Some(BTreeMap::from([(
                    GATEWAY_IDENTITY_ANNOTATION.to_owned(),
                    a.to_owned(),
                )]));
            }
            let spec = gateway_spec(&g).unwrap();
            assert_eq!(spec.identity.as_deref(), want, "{what}");
            assert_eq!(
                valid_identity(annotation.unwrap_or_default()),
                want.is_some(),
                "{what}"
            );
            // Carried into the resolved gateway, whatever the hostnames resolve to.
            let resolved = spec.into_resolved([ip("5.6.7.8")]);
            assert_eq!(resolved.identity.as_deref(), want, "{what}");
        }
    }

    #[test]
    fn another_annotation_is_no_identity() {
        let mut g = gateway(
            &[("mc-gateway", 4143)],
            Some(vec![ingress(Some("1.2.3.4"), None)]),
        );
        g.metadata.annotations = Some(BTreeMap::from([(
            "mirror.linkerd.io/remote-gateway-identity".to_owned(),
            "gw.mc".to_owned(),
        )]));
        assert_eq!(gateway_spec(&g).unwrap().identity, None);
        assert_eq!(ResolvedGateway::new([], 1).identity, None);
    }
}
