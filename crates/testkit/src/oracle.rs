//! The independent oracle: the expected mirror of one exported remote Service, written
//! by hand from the contract (`/work/shared/reference/contract.md`) and the Go seed, not
//! with the core's functions, and a field-by-field comparison of whole local objects
//! with it. A bug in the core's desired state or diff is therefore visible here.
//!
//! Every label, annotation and constant below is a literal copied from the contract
//! (the wire names shared with Linkerd), not imported from the core.
//!
//! Rule per field of a mirror Service when someone else edits it (what the controller
//! does and so what the oracle expects):
//!
//! | field | rule |
//! |---|---|
//! | labels `mirrored-service`, `cluster-name`, `remote-gateway-name`, `remote-gateway-ns` | restored (owned) |
//! | annotations `remote-resource-version`, `remote-svc-fq-name`, `remote-gateway-resource-version`, `service-mirror.io/controller-namespace` | restored (owned) |
//! | any other label or annotation | left as the editor set it |
//! | `spec.ports` (name, protocol, port, targetPort; no nodePort) | restored: the contract fixes them |
//! | `spec.selector` | restored to none: the contract says "no selector" (a selector would make kube-controller-manager overwrite the Endpoints with local pods) |
//! | `spec.type` | restored to `ClusterIP` (a NodePort/LoadBalancer mirror would open the remote service on every local node) |
//! | `spec.externalIPs` | left as the editor set it: not in the contract's mirror; the Go original updates the fetched object and keeps it; an admission policy may own it |
//! | `spec.sessionAffinity` | left as the editor set it (local load-balancing choice, not the remote's) |
//! | `spec.internalTrafficPolicy`, `publishNotReadyAddresses`, clusterIP(s), ipFamilies | left (apiserver defaults or the editor's; not compared except the first two's defaults on an unedited mirror) |
//!
//! Endpoints: the four labels, `skip-mirror` (per endpoints mode), the annotations
//! `remote-svc-fq-name`, `controller-namespace`, `remote-gateway-identity` and the
//! subsets are restored; any other label or annotation is left.
//!
//! Not modelled: gateway probes (every usable gateway counts as alive), hostname
//! ingress entries (only IP entries count), duplicate ingress IPs (addresses compared
//! as sets), Link-resource mirrors (metadata copied from the remote).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{EndpointsMode, Key, Kind};

pub(crate) const MIRRORED: &str = "mirror.linkerd.io/mirrored-service";
pub(crate) const CLUSTER: &str = "mirror.linkerd.io/cluster-name";
const GW_NAME_LABEL: &str = "mirror.linkerd.io/remote-gateway-name";
const GW_NS_LABEL: &str = "mirror.linkerd.io/remote-gateway-ns";
const SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
const GW_NAME: &str = "mirror.linkerd.io/gateway-name";
const GW_NS: &str = "mirror.linkerd.io/gateway-ns";
const REMOTE_RV: &str = "mirror.linkerd.io/remote-resource-version";
const FQ_NAME: &str = "mirror.linkerd.io/remote-svc-fq-name";
const GW_RV: &str = "mirror.linkerd.io/remote-gateway-resource-version";
const CTL_NS: &str = "service-mirror.io/controller-namespace";
const GW_IDENTITY: &str = "mirror.linkerd.io/gateway-identity";
const REMOTE_GW_IDENTITY: &str = "mirror.linkerd.io/remote-gateway-identity";
const GATEWAY_PORT: &str = "mc-gateway";

const OWNED_LABELS: [&str; 5] = [MIRRORED, CLUSTER, GW_NAME_LABEL, GW_NS_LABEL, SKIP_MIRROR];
const OWNED_ANNOTATIONS: [&str; 5] = [REMOTE_RV, FQ_NAME, GW_RV, CTL_NS, REMOTE_GW_IDENTITY];

/// The expected local objects of one mirror.
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    /// The mirror Service.
    pub service: Service,
    /// The mirror Endpoints (same name and namespace; labelled per mode when compared).
    pub endpoints: Endpoints,
}

/// What one link says about its mirrors.
#[derive(Clone, Debug)]
pub struct LinkView<'a> {
    /// The cluster name (mirror name suffix and `cluster-name` label).
    pub cluster: &'a str,
    /// Remote cluster domain (`cluster.local` by default).
    pub domain: &'a str,
    /// The controller namespace recorded on mirrors (Secret links).
    pub controller_namespace: Option<&'a str>,
}

/// The gateway `(namespace, name)` a remote Service names, if it is exported: both
/// annotations, non-empty (the seed's rule).
pub fn exported_gateway(svc: &Service) -> Option<(String, String)> {
    let a = svc.metadata.annotations.as_ref()?;
    let name = a.get(GW_NAME).filter(|v| !v.is_empty())?;
    let ns = a.get(GW_NS).filter(|v| !v.is_empty())?;
    Some((ns.clone(), name.clone()))
}

/// Whether a remote Service has at least one port (a portless one is refused).
pub fn has_ports(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .is_some_and(|p| !p.is_empty())
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h: u32, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// `<name>-<cluster>`; over 63 characters, the documented rule (README "long names"):
/// the name cut, the FNV-1a 32 hash of the full remote name in 8 hex digits, then the
/// cluster.
pub fn mirror_name(name: &str, cluster: &str) -> String {
    let short = format!("{name}-{cluster}");
    if short.chars().count() <= 63 {
        return short;
    }
    let hash = format!("{:08x}", fnv1a32(name.as_bytes()));
    let keep = 63usize.saturating_sub(cluster.chars().count() + 8 + 2);
    let prefix: String = name.chars().take(keep).collect();
    let prefix = prefix.trim_end_matches('-');
    if prefix.is_empty() {
        format!("{hash}-{cluster}")
    } else {
        format!("{prefix}-{hash}-{cluster}")
    }
}

/// A usable gateway, per the contract: an ingress entry and a port named `mc-gateway`.
struct Gateway {
    /// Its IP ingress addresses that can be Endpoints addresses, canonical.
    addresses: BTreeSet<String>,
    port: i32,
    resource_version: String,
    identity: Option<String>,
}

fn endpoint_ip(raw: &str) -> Option<String> {
    let ip = raw.parse::<IpAddr>().ok()?.to_canonical();
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    let bad = ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || link_local;
    (!bad).then(|| ip.to_string())
}

fn dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

fn usable_gateway(gw: &Service) -> Option<Gateway> {
    let ingress = gw
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?;
    let port = gw
        .spec
        .as_ref()?
        .ports
        .as_ref()?
        .iter()
        .find(|p| p.name.as_deref() == Some(GATEWAY_PORT))?
        .port;
    let addresses: BTreeSet<String> = ingress
        .iter()
        .filter_map(|i| i.ip.as_deref())
        .filter_map(endpoint_ip)
        .collect();
    let hostnames = ingress
        .iter()
        .any(|i| i.hostname.as_deref().is_some_and(|h| !h.is_empty()));
    if addresses.is_empty() && !hostnames {
        return None;
    }
    Some(Gateway {
        addresses,
        port,
        resource_version: gw.metadata.resource_version.clone().unwrap_or_default(),
        identity: gw
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(GW_IDENTITY))
            .filter(|i| dns_subdomain(i))
            .cloned(),
    })
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The expected mirror of exported `remote` (through gateway `gw_ref`; `gateway` is
/// that remote Service if it exists) for `link`.
pub fn expected_mirror(
    remote: &Service,
    link: &LinkView<'_>,
    gw_ref: &(String, String),
    gateway: Option<&Service>,
) -> Expected {
    let name = remote.metadata.name.clone().unwrap_or_default();
    let ns = remote.metadata.namespace.clone().unwrap_or_default();
    let mirror = mirror_name(&name, link.cluster);
    let fq = format!("{name}.{ns}.svc.{}", link.domain);
    let gw = gateway.and_then(usable_gateway);
    let labels = map(&[
        (MIRRORED, "true"),
        (CLUSTER, link.cluster),
        (GW_NAME_LABEL, &gw_ref.1),
        (GW_NS_LABEL, &gw_ref.0),
    ]);
    let mut svc_annotations = map(&[
        (
            REMOTE_RV,
            remote.metadata.resource_version.as_deref().unwrap_or(""),
        ),
        (FQ_NAME, &fq),
    ]);
    let mut ep_annotations = map(&[(FQ_NAME, &fq)]);
    if let Some(g) = &gw {
        svc_annotations.insert(GW_RV.into(), g.resource_version.clone());
        if let Some(id) = &g.identity {
            ep_annotations.insert(REMOTE_GW_IDENTITY.into(), id.clone());
        }
    }
    if let Some(c) = link.controller_namespace {
        svc_annotations.insert(CTL_NS.into(), c.into());
        ep_annotations.insert(CTL_NS.into(), c.into());
    }
    let ports: Vec<ServicePort> = remote
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|p| ServicePort {
            name: p.name.filter(|n| !n.is_empty()),
            protocol: Some(p.protocol.filter(|p| !p.is_empty()).unwrap_or("TCP".into())),
            port: p.port,
            target_port: Some(default_target(p.target_port.as_ref(), p.port)),
            ..Default::default()
        })
        .collect();
    let subsets = gw.as_ref().filter(|g| !g.addresses.is_empty()).map(|g| {
        vec![EndpointSubset {
            addresses: Some(
                g.addresses
                    .iter()
                    .map(|ip| EndpointAddress {
                        ip: ip.clone(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            not_ready_addresses: None,
            ports: Some(
                ports
                    .iter()
                    .map(|p| EndpointPort {
                        name: p.name.clone(),
                        protocol: p.protocol.clone(),
                        port: g.port,
                        ..Default::default()
                    })
                    .collect(),
            ),
        }]
    });
    let meta = |annotations| ObjectMeta {
        name: Some(mirror.clone()),
        namespace: Some(ns.clone()),
        labels: Some(labels.clone()),
        annotations: Some(annotations),
        ..Default::default()
    };
    Expected {
        service: Service {
            metadata: meta(svc_annotations),
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".into()),
                ports: Some(ports),
                ..Default::default()
            }),
            status: None,
        },
        endpoints: Endpoints {
            metadata: meta(ep_annotations),
            subsets,
        },
    }
}

fn default_target(t: Option<&IntOrString>, port: i32) -> IntOrString {
    match t {
        None | Some(IntOrString::Int(0)) => IntOrString::Int(port),
        Some(IntOrString::String(s)) if s.is_empty() => IntOrString::Int(port),
        Some(t) => t.clone(),
    }
}

/// What a test set on one mirror object's non-owned fields (or owned ones, which the
/// controller must restore), recorded against the object's uid: a recreated object
/// (new uid) no longer carries the edit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Edit {
    /// uid of the object when edited.
    pub uid: String,
    /// Labels set (a non-owned key must keep its value; an owned one is restored).
    pub labels: BTreeMap<String, String>,
    /// Annotations set (same rule).
    pub annotations: BTreeMap<String, String>,
    /// `spec.externalIPs` set (Service only): left as set.
    pub external_ips: Option<Vec<String>>,
    /// `spec.sessionAffinity` set (Service only): left as set.
    pub session_affinity: Option<String>,
}

/// Edits by object.
pub type Edits = BTreeMap<(Kind, Key), Edit>;

type Map = BTreeMap<String, String>;

fn meta_diffs(
    what: &str,
    actual: Option<&Map>,
    want: Option<&Map>,
    owned: &[&str],
    edited: Option<&Map>,
    out: &mut Vec<String>,
) {
    for k in owned {
        let (a, w) = (actual.and_then(|m| m.get(*k)), want.and_then(|m| m.get(*k)));
        if a != w {
            out.push(format!("{what} {k}: {a:?}, want {w:?}"));
        }
    }
    for (k, v) in edited.into_iter().flatten() {
        if owned.contains(&k.as_str()) {
            continue;
        }
        let a = actual.and_then(|m| m.get(k));
        if a != Some(v) {
            out.push(format!(
                "{what} {k} (not owned): {a:?}, want {v:?} as the editor set it"
            ));
        }
    }
}

fn port_tuple(p: &ServicePort) -> (Option<String>, String, i32, IntOrString, Option<i32>) {
    (
        p.name.clone().filter(|n| !n.is_empty()),
        p.protocol.clone().unwrap_or("TCP".into()),
        p.port,
        default_target(p.target_port.as_ref(), p.port),
        p.node_port,
    )
}

/// Every field on which mirror Service `actual` breaks the rules for `want` (given the
/// edit recorded on it, if its uid is still the edited one). Empty: equal.
pub fn service_diffs(actual: &Service, want: &Service, edit: Option<&Edit>) -> Vec<String> {
    let edit = edit.filter(|e| actual.metadata.uid.as_deref() == Some(e.uid.as_str()));
    let mut out = Vec::new();
    let (am, wm) = (&actual.metadata, &want.metadata);
    meta_diffs(
        "label",
        am.labels.as_ref(),
        wm.labels.as_ref(),
        &OWNED_LABELS,
        edit.map(|e| &e.labels),
        &mut out,
    );
    meta_diffs(
        "annotation",
        am.annotations.as_ref(),
        wm.annotations.as_ref(),
        &OWNED_ANNOTATIONS,
        edit.map(|e| &e.annotations),
        &mut out,
    );
    let empty = ServiceSpec::default();
    let a = actual.spec.as_ref().unwrap_or(&empty);
    let w = want.spec.as_ref().unwrap_or(&empty);
    let ty = |s: &ServiceSpec| s.type_.clone().unwrap_or("ClusterIP".into());
    if ty(a) != ty(w) {
        out.push(format!("spec.type: {}, want {}", ty(a), ty(w)));
    }
    if a.selector.as_ref().is_some_and(|s| !s.is_empty()) {
        out.push(format!("spec.selector: {:?}, want none", a.selector));
    }
    let ports = |s: &ServiceSpec| -> Vec<_> { s.ports.iter().flatten().map(port_tuple).collect() };
    if ports(a) != ports(w) {
        out.push(format!("spec.ports: {:?}, want {:?}", ports(a), ports(w)));
    }
    let want_ips = edit
        .and_then(|e| e.external_ips.clone())
        .unwrap_or_default();
    let ips = a.external_ips.clone().unwrap_or_default();
    if ips != want_ips {
        out.push(format!(
            "spec.externalIPs (not owned): {ips:?}, want {want_ips:?}"
        ));
    }
    let want_affinity = edit
        .and_then(|e| e.session_affinity.clone())
        .unwrap_or("None".into());
    let affinity = a.session_affinity.clone().unwrap_or("None".into());
    if affinity != want_affinity {
        out.push(format!(
            "spec.sessionAffinity (not owned): {affinity}, want {want_affinity}"
        ));
    }
    if edit.is_none() {
        // Defaults of an unedited mirror: the controller sets none of these.
        if a.internal_traffic_policy.as_deref().unwrap_or("Cluster") != "Cluster" {
            out.push(format!(
                "spec.internalTrafficPolicy: {:?}",
                a.internal_traffic_policy
            ));
        }
        if a.publish_not_ready_addresses == Some(true) {
            out.push("spec.publishNotReadyAddresses: true".into());
        }
    }
    if a.external_name.is_some() {
        out.push(format!("spec.externalName: {:?}", a.external_name));
    }
    out
}

fn addresses(s: &EndpointSubset) -> (BTreeSet<String>, BTreeSet<String>) {
    let set = |v: &Option<Vec<EndpointAddress>>| {
        v.iter()
            .flatten()
            .map(|a| endpoint_ip(&a.ip).unwrap_or_else(|| a.ip.clone()))
            .collect()
    };
    (set(&s.addresses), set(&s.not_ready_addresses))
}

fn endpoint_ports(s: &EndpointSubset) -> Vec<(Option<String>, String, i32)> {
    let mut v: Vec<_> = s
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.name.clone().filter(|n| !n.is_empty()),
                p.protocol.clone().unwrap_or("TCP".into()),
                p.port,
            )
        })
        .collect();
    v.sort();
    v
}

/// Every field on which mirror Endpoints `actual` breaks the rules for `want`, for a
/// controller in `mode` (`both`: labelled `skip-mirror: "true"`).
pub fn endpoints_diffs(
    actual: &Endpoints,
    want: &Endpoints,
    mode: EndpointsMode,
    edit: Option<&Edit>,
) -> Vec<String> {
    let edit = edit.filter(|e| actual.metadata.uid.as_deref() == Some(e.uid.as_str()));
    let mut labels = want.metadata.labels.clone().unwrap_or_default();
    if mode == EndpointsMode::Both {
        labels.insert(SKIP_MIRROR.into(), "true".into());
    }
    let mut out = Vec::new();
    meta_diffs(
        "label",
        actual.metadata.labels.as_ref(),
        Some(&labels),
        &OWNED_LABELS,
        edit.map(|e| &e.labels),
        &mut out,
    );
    meta_diffs(
        "annotation",
        actual.metadata.annotations.as_ref(),
        want.metadata.annotations.as_ref(),
        &OWNED_ANNOTATIONS,
        edit.map(|e| &e.annotations),
        &mut out,
    );
    let subsets = |e: &Endpoints| -> Vec<_> {
        e.subsets
            .iter()
            .flatten()
            .map(|s| (addresses(s), endpoint_ports(s)))
            .filter(|((r, n), _)| !r.is_empty() || !n.is_empty())
            .collect()
    };
    let (a, w) = (subsets(actual), subsets(want));
    if a != w {
        out.push(format!("subsets: {a:?}, want {w:?}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};

    fn remote(ports: &[(&str, i32)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                resource_version: Some("42".into()),
                annotations: Some(map(&[(GW_NAME, "gw"), (GW_NS, "mc")])),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, p)| ServicePort {
                            name: Some(n.to_string()),
                            port: *p,
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn gateway(ips: &[&str]) -> Service {
        let mut g = remote(&[("mc-gateway", 4143)]);
        g.metadata.name = Some("gw".into());
        g.metadata.resource_version = Some("7".into());
        g.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(
                    ips.iter()
                        .map(|ip| LoadBalancerIngress {
                            ip: Some(ip.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        });
        g
    }

    const LINK: LinkView<'static> = LinkView {
        cluster: "east",
        domain: "cluster.local",
        controller_namespace: Some("sm"),
    };

    fn gw_ref() -> (String, String) {
        ("mc".into(), "gw".into())
    }

    #[test]
    fn the_expected_mirror_is_the_contracts_table() {
        let g = gateway(&["192.0.2.1", "127.0.0.1", "192.0.2.1"]);
        let e = expected_mirror(&remote(&[("http", 80)]), &LINK, &gw_ref(), Some(&g));
        let m = &e.service.metadata;
        assert_eq!(m.name.as_deref(), Some("web-east"));
        assert_eq!(m.namespace.as_deref(), Some("shop"));
        assert_eq!(
            m.labels.clone().unwrap(),
            map(&[
                (MIRRORED, "true"),
                (CLUSTER, "east"),
                (GW_NAME_LABEL, "gw"),
                (GW_NS_LABEL, "mc")
            ])
        );
        assert_eq!(
            m.annotations.clone().unwrap(),
            map(&[
                (REMOTE_RV, "42"),
                (FQ_NAME, "web.shop.svc.cluster.local"),
                (GW_RV, "7"),
                (CTL_NS, "sm")
            ])
        );
        let subsets = e.endpoints.subsets.unwrap();
        assert_eq!(subsets.len(), 1);
        let ips: Vec<_> = subsets[0]
            .addresses
            .iter()
            .flatten()
            .map(|a| &a.ip)
            .collect();
        assert_eq!(ips, vec!["192.0.2.1"], "loopback refused, duplicates once");
        assert_eq!(subsets[0].ports.as_ref().unwrap()[0].port, 4143);
        // No gateway: Service kept, no subsets, no gateway resourceVersion.
        let e = expected_mirror(&remote(&[("http", 80)]), &LINK, &gw_ref(), None);
        assert!(e.endpoints.subsets.is_none());
        assert!(!e.service.metadata.annotations.unwrap().contains_key(GW_RV));
    }

    #[test]
    fn long_names_follow_the_documented_rule() {
        assert_eq!(mirror_name("web", "east"), "web-east");
        let n = mirror_name(&"a".repeat(70), "east");
        assert_eq!(n.len(), 63);
        assert!(n.ends_with("-east"));
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    fn stored(e: &Expected) -> Service {
        let mut s = e.service.clone();
        s.metadata.uid = Some("u1".into());
        let spec = s.spec.as_mut().unwrap();
        spec.session_affinity = Some("None".into());
        spec.internal_traffic_policy = Some("Cluster".into());
        spec.cluster_ip = Some("10.96.0.9".into());
        s
    }

    #[test]
    fn every_field_rule_is_enforced_on_the_service() {
        let e = expected_mirror(&remote(&[("http", 80)]), &LINK, &gw_ref(), None);
        let good = stored(&e);
        assert_eq!(service_diffs(&good, &e.service, None), Vec::<String>::new());
        type Edit1 = fn(&mut Service);
        let restored: &[(&str, Edit1)] = &[
            ("spec.type", |s| {
                s.spec.as_mut().unwrap().type_ = Some("NodePort".into())
            }),
            ("spec.selector", |s| {
                s.spec.as_mut().unwrap().selector = Some(map(&[("app", "x")]))
            }),
            ("spec.ports", |s| {
                s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81
            }),
            ("label mirror.linkerd.io/remote-gateway-name", |s| {
                s.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert(GW_NAME_LABEL.into(), "x".into());
            }),
            (
                "annotation mirror.linkerd.io/remote-resource-version",
                |s| {
                    s.metadata.annotations.as_mut().unwrap().remove(REMOTE_RV);
                },
            ),
            ("spec.externalIPs", |s| {
                s.spec.as_mut().unwrap().external_ips = Some(vec!["192.0.2.9".into()])
            }),
            ("spec.sessionAffinity", |s| {
                s.spec.as_mut().unwrap().session_affinity = Some("ClientIP".into())
            }),
        ];
        for (field, f) in restored {
            let mut s = good.clone();
            f(&mut s);
            let d = service_diffs(&s, &e.service, None);
            assert_eq!(d.len(), 1, "{field}: {d:?}");
            assert!(d[0].starts_with(field), "{field}: {d:?}");
        }
        // Non-owned fields the editor set stay as set: the edit is expected...
        let edit = Edit {
            uid: "u1".into(),
            labels: map(&[("team", "a"), (GW_NAME_LABEL, "x")]),
            annotations: map(&[("note", "n")]),
            external_ips: Some(vec!["192.0.2.9".into()]),
            session_affinity: Some("ClientIP".into()),
        };
        let mut edited = good.clone();
        edited
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "a".into());
        edited
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("note".into(), "n".into());
        let spec = edited.spec.as_mut().unwrap();
        spec.external_ips = edit.external_ips.clone();
        spec.session_affinity = edit.session_affinity.clone();
        assert_eq!(
            service_diffs(&edited, &e.service, Some(&edit)),
            Vec::<String>::new()
        );
        // ... and undoing it is a violation, field by field.
        let d = service_diffs(&good, &e.service, Some(&edit));
        assert_eq!(d.len(), 4, "{d:?}");
        // A recreated object (another uid) no longer carries the edit.
        let mut other = good.clone();
        other.metadata.uid = Some("u2".into());
        assert!(service_diffs(&other, &e.service, Some(&edit)).is_empty());
    }

    #[test]
    fn endpoints_rules_per_mode() {
        let g = gateway(&["192.0.2.1", "192.0.2.2"]);
        let e = expected_mirror(&remote(&[("http", 80)]), &LINK, &gw_ref(), Some(&g));
        let ep = e.endpoints.clone();
        let none: Vec<String> = vec![];
        assert_eq!(
            endpoints_diffs(&ep, &e.endpoints, EndpointsMode::Endpoints, None),
            none
        );
        assert_eq!(
            endpoints_diffs(&ep, &e.endpoints, EndpointsMode::Both, None).len(),
            1,
            "skip-mirror missing in both"
        );
        let mut moved = ep.clone();
        moved.subsets.as_mut().unwrap()[0]
            .addresses
            .as_mut()
            .unwrap()[0]
            .ip = "192.0.2.3".into();
        assert!(
            endpoints_diffs(&moved, &e.endpoints, EndpointsMode::Endpoints, None)[0]
                .starts_with("subsets")
        );
        let mut reordered = ep.clone();
        reordered.subsets.as_mut().unwrap()[0]
            .addresses
            .as_mut()
            .unwrap()
            .reverse();
        assert_eq!(
            endpoints_diffs(&reordered, &e.endpoints, EndpointsMode::Endpoints, None),
            none
        );
    }
}
