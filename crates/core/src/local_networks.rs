//! The local cluster's own networks, read from its objects: the service CIDRs (every
//! `networking.k8s.io/v1` ServiceCIDR's `spec.cidrs`, and the `kubernetes` Service's
//! ClusterIPs) and the pod CIDRs (every Node's `spec.podCIDRs`). The address policy
//! refuses gateway addresses in them with no flag ([`crate::LocalCidrs`]).
//!
//! The apiserver validates these fields, so a malformed entry should never come; one
//! that does (an older apiserver, a hand-edited etcd) is skipped and named, and the
//! object's other entries still count.

use crate::address_policy::Cidr;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::networking::v1::ServiceCIDR;
use std::net::IpAddr;

/// An entry of a local object that is not a CIDR (or a ClusterIP that is not an IP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed {
    /// The object's kind and name (`Node/worker-1`).
    pub object: String,
    /// The field (`spec.podCIDRs`).
    pub field: &'static str,
    /// The entry.
    pub value: String,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} entry {:?} is not a CIDR",
            self.object, self.field, self.value
        )
    }
}

/// What one object contributes: its CIDRs and its skipped entries.
pub type Read = (Vec<Cidr>, Vec<Malformed>);

fn parse_all<'a>(
    object: String,
    field: &'static str,
    entries: impl IntoIterator<Item = &'a String>,
) -> Read {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for e in entries {
        // A prefix is required: a bare address here is not what the field holds.
        // Read as Kubernetes reads it: leading zeros in an IPv4 octet are decimal.
        match e.contains('/').then(|| Cidr::parse_sloppy(e)) {
            Some(Ok(c)) => ok.push(c),
            _ => bad.push(Malformed {
                object: object.clone(),
                field,
                value: e.clone(),
            }),
        }
    }
    (ok, bad)
}

/// The CIDRs of a ServiceCIDR (`spec.cidrs`, one per family).
pub fn service_cidrs_of(obj: &ServiceCIDR) -> Read {
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    let cidrs = obj.spec.as_ref().and_then(|s| s.cidrs.as_ref());
    parse_all(
        format!("ServiceCIDR/{name}"),
        "spec.cidrs",
        cidrs.into_iter().flatten(),
    )
}

/// The pod CIDRs of a Node (`spec.podCIDRs`; `spec.podCIDR` when the list is absent,
/// as older apiservers wrote it).
pub fn pod_cidrs_of(node: &Node) -> Read {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let spec = node.spec.as_ref();
    let list = spec
        .and_then(|s| s.pod_cidrs.clone())
        .filter(|l| !l.is_empty());
    let entries = list.or_else(|| spec.and_then(|s| s.pod_cidr.clone()).map(|c| vec![c]));
    parse_all(
        format!("Node/{name}"),
        "spec.podCIDRs",
        entries.iter().flatten(),
    )
}

/// The ClusterIPs of a Service as /32 or /128 blocks (`spec.clusterIPs`, else
/// `spec.clusterIP`; `None`, headless, is no address).
pub fn cluster_ips_of(svc: &Service) -> Read {
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
    let spec = svc.spec.as_ref();
    let ips = spec
        .and_then(|s| s.cluster_ips.clone())
        .filter(|l| !l.is_empty())
        .or_else(|| spec.and_then(|s| s.cluster_ip.clone()).map(|ip| vec![ip]))
        .unwrap_or_default();
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for ip in ips.iter().filter(|ip| !ip.is_empty() && *ip != "None") {
        let parsed = ip
            .parse::<IpAddr>()
            .ok()
            .or_else(|| crate::address_policy::sloppy_ipv4(ip).map(IpAddr::V4));
        match parsed {
            Some(a) => {
                let a = a.to_canonical();
                let width = if a.is_ipv4() { 32 } else { 128 };
                ok.extend(Cidr::new(a, width));
            }
            None => bad.push(Malformed {
                object: format!("Service/{ns}/{name}"),
                field: "spec.clusterIPs",
                value: ip.clone(),
            }),
        }
    }
    (ok, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, pod_cidrs: Option<&[&str]>, pod_cidr: Option<&str>) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"podCIDRs": pod_cidrs, "podCIDR": pod_cidr}
        }))
        .unwrap()
    }

    fn strings(r: &Read) -> (Vec<String>, Vec<String>) {
        (
            r.0.iter().map(ToString::to_string).collect(),
            r.1.iter().map(ToString::to_string).collect(),
        )
    }

    #[test]
    fn node_pod_cidrs_are_read_and_a_malformed_entry_is_skipped_and_named() {
        let table: [(Node, &[&str], &[&str]); 7] = [
            (
                node("a", Some(&["10.244.1.0/24", "fd00:10:244:1::/64"]), None),
                &["10.244.1.0/24", "fd00:10:244:1::/64"],
                &[],
            ),
            // The old singular field when the list is absent.
            (
                node("b", None, Some("10.244.2.0/24")),
                &["10.244.2.0/24"],
                &[],
            ),
            (node("c", None, None), &[], &[]),
            (
                node("d", Some(&["10.244.3.0/24", "garbage", "10.244.4.1"]), None),
                &["10.244.3.0/24"],
                &[
                    "Node/d spec.podCIDRs entry \"garbage\" is not a CIDR",
                    "Node/d spec.podCIDRs entry \"10.244.4.1\" is not a CIDR",
                ],
            ),
            (
                node("e", Some(&["10.244.5.0/33"]), None),
                &[],
                &["Node/e spec.podCIDRs entry \"10.244.5.0/33\" is not a CIDR"],
            ),
            (
                node("f", Some(&[]), Some("10.244.6.0/24")),
                &["10.244.6.0/24"],
                &[],
            ),
            // Legacy leading zeros, decimal as Kubernetes reads them; a mapped block.
            (
                node(
                    "g",
                    Some(&["010.244.7.0/24", "::ffff:10.244.8.0/120"]),
                    None,
                ),
                &["10.244.7.0/24", "10.244.8.0/24"],
                &[],
            ),
        ];
        for (n, cidrs, bad) in table {
            let (got, got_bad) = strings(&pod_cidrs_of(&n));
            assert_eq!(got, cidrs, "{:?}", n.metadata.name);
            assert_eq!(got_bad, bad, "{:?}", n.metadata.name);
        }
    }

    #[test]
    fn service_cidrs_give_their_cidrs_per_family() {
        let obj: ServiceCIDR = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubernetes"},
            "spec": {"cidrs": ["10.96.0.0/12", "fd00:10:96::/112", "x/1"]}
        }))
        .unwrap();
        let (got, bad) = strings(&service_cidrs_of(&obj));
        assert_eq!(got, ["10.96.0.0/12", "fd00:10:96::/112"]);
        assert_eq!(
            bad,
            ["ServiceCIDR/kubernetes spec.cidrs entry \"x/1\" is not a CIDR"]
        );
        let empty: ServiceCIDR =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "e"}})).unwrap();
        assert_eq!(service_cidrs_of(&empty), (vec![], vec![]));
    }

    #[test]
    fn the_kubernetes_service_gives_its_cluster_ips_as_host_blocks() {
        let svc = |spec: serde_json::Value| -> Service {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "kubernetes", "namespace": "default"}, "spec": spec
            }))
            .unwrap()
        };
        let table: [(Service, &[&str], usize); 6] = [
            (
                svc(
                    serde_json::json!({"clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1", "fd00::1"]}),
                ),
                &["10.0.0.1/32", "fd00::1/128"],
                0,
            ),
            (
                svc(serde_json::json!({"clusterIP": "10.96.0.1"})),
                &["10.96.0.1/32"],
                0,
            ),
            (svc(serde_json::json!({"clusterIP": "None"})), &[], 0),
            (svc(serde_json::json!({})), &[], 0),
            (
                svc(serde_json::json!({"clusterIPs": ["10.0.0.300"]})),
                &[],
                1,
            ),
            (
                svc(serde_json::json!({"clusterIPs": ["010.096.000.001"]})),
                &["10.96.0.1/32"],
                0,
            ),
        ];
        for (s, want, bad) in table {
            let r = cluster_ips_of(&s);
            assert_eq!(strings(&r).0, want);
            assert_eq!(r.1.len(), bad);
        }
    }
}
