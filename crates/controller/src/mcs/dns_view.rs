//! What the `clusterset.local` DNS server (`crate::clusterset_dns`) reads of this
//! component: every ServiceImport of the allowed namespaces (ours or another
//! implementation's: DNS reads, never writes, as CoreDNS's multicluster plugin reads
//! them) and, for a Headless import this cluster exports, this cluster's own ready
//! endpoints (the exported Service's EndpointSlices, which the import side caches
//! anyway). A lookup locks the shared state for the copy of one import.
//!
//! Remote clusters' headless endpoints are not answered: our headless imports have no
//! slices (a gateway is one address for the whole Service), and a remote pod's address
//! is not reachable from here (no flat network). `records` is pure and table-tested.

use super::resource::ServiceImport;
use super::shared::Shared;
use crate::clusterset_dns::Zone;
use crate::clusterset_dns::answer::{Endpoint, Lookup, Port, ServiceRecords, dashed};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use service_mirror_core::ServiceKey;
use std::net::IpAddr;
use std::sync::Arc;

/// The zone's data: the MCS component's shared state and this cluster's name.
#[derive(Clone)]
pub(crate) struct ImportZone {
    pub(super) shared: Arc<parking_lot::Mutex<Shared>>,
    pub(super) local: String,
}

impl Zone for ImportZone {
    fn service(&self, namespace: &str, name: &str) -> Lookup {
        let key = ServiceKey::new(namespace, name);
        let shared = self.shared.lock();
        let cache = &shared.cache;
        if !cache.imports_listed() {
            return Lookup::NotListed;
        }
        let Some(import) = cache.import(&key) else {
            return Lookup::Missing;
        };
        if !is_headless(import) {
            return Lookup::Found(records(import, &[], &self.local));
        }
        let exports_here = import.clusters().contains(&self.local);
        if !exports_here {
            return Lookup::Found(records(import, &[], &self.local));
        }
        match cache.local_slices(&key) {
            None => Lookup::NotListed,
            Some(slices) => {
                let slices: Vec<&EndpointSlice> = slices.collect();
                Lookup::Found(records(import, &slices, &self.local))
            }
        }
    }

    fn namespace_exists(&self, namespace: &str) -> Option<bool> {
        let shared = self.shared.lock();
        let cache = &shared.cache;
        cache
            .imports_listed()
            .then(|| cache.has_import_in(namespace))
    }
}

fn is_headless(import: &ServiceImport) -> bool {
    import.spec.type_.as_deref() == Some("Headless")
}

/// What the zone answers of `import`: its type, ClusterSetIPs and ports, and, headless,
/// the ready endpoints of `local_slices` (this cluster's own, named by cluster `local`).
pub(crate) fn records(
    import: &ServiceImport,
    local_slices: &[&EndpointSlice],
    local: &str,
) -> ServiceRecords {
    let headless = is_headless(import);
    let ports = import
        .spec
        .ports
        .iter()
        .filter_map(|p| {
            Some(Port {
                name: p.name.clone().filter(|n| !n.is_empty()),
                protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                port: u16::try_from(p.port).ok().filter(|p| *p > 0)?,
            })
        })
        .collect();
    let ips = if headless {
        Vec::new()
    } else {
        import
            .spec
            .ips
            .iter()
            .filter_map(|ip| ip.parse::<IpAddr>().ok())
            .collect()
    };
    let mut endpoints: Vec<Endpoint> = Vec::new();
    if headless {
        for slice in local_slices {
            if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
                continue;
            }
            for e in &slice.endpoints {
                // Unset means ready (the API's reading).
                if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                let addresses: Vec<IpAddr> =
                    e.addresses.iter().filter_map(|a| a.parse().ok()).collect();
                match e.hostname.as_deref().filter(|h| !h.is_empty()) {
                    Some(h) => add(&mut endpoints, local, &h.to_ascii_lowercase(), addresses),
                    // No hostname: each address is its own name.
                    None => {
                        for a in addresses {
                            add(&mut endpoints, local, &dashed(a), vec![a]);
                        }
                    }
                }
            }
        }
    }
    ServiceRecords {
        headless,
        ips,
        ports,
        endpoints,
    }
}

/// One endpoint per (cluster, hostname): the addresses of two slices' entries with the
/// same hostname (its IPv4 and IPv6 slices) joined.
fn add(endpoints: &mut Vec<Endpoint>, cluster: &str, hostname: &str, addresses: Vec<IpAddr>) {
    if addresses.is_empty() {
        return;
    }
    match endpoints
        .iter_mut()
        .find(|e| e.cluster == cluster && e.hostname == hostname)
    {
        Some(e) => {
            for a in addresses {
                if !e.addresses.contains(&a) {
                    e.addresses.push(a);
                }
            }
        }
        None => endpoints.push(Endpoint {
            cluster: cluster.into(),
            hostname: hostname.into(),
            addresses,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import(json: serde_json::Value) -> ServiceImport {
        serde_json::from_value(json).unwrap()
    }

    fn slice(json: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_clusterset_ip_import_gives_its_ips_and_ports_and_no_endpoints() {
        let i = import(serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"type": "ClusterSetIP", "ips": ["10.96.0.10", "fd00::10", "bad"],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"},
                               {"port": 8080}, {"name": "zero", "port": 0}]},
        }));
        let r = records(&i, &[], "west");
        assert_eq!(
            r,
            ServiceRecords {
                headless: false,
                ips: vec!["10.96.0.10".parse().unwrap(), "fd00::10".parse().unwrap()],
                ports: vec![
                    Port {
                        name: Some("http".into()),
                        protocol: "tcp".into(),
                        port: 80
                    },
                    Port {
                        name: None,
                        protocol: "tcp".into(),
                        port: 8080
                    },
                ],
                endpoints: Vec::new(),
            }
        );
    }

    #[test]
    fn a_headless_import_gives_this_clusters_ready_endpoints_by_hostname_or_address() {
        let i = import(serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
            "metadata": {"name": "db", "namespace": "shop"},
            "spec": {"type": "Headless", "ips": ["10.96.0.99"], "ports": [{"name": "pg", "port": 5432}]},
        }));
        let v4 = slice(serde_json::json!({
            "metadata": {"name": "db-abc"}, "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.1.0.5"], "hostname": "DB-0"},
                {"addresses": ["10.1.0.6"]},
                {"addresses": ["10.1.0.7"], "hostname": "db-2", "conditions": {"ready": false}},
                {"addresses": ["10.1.0.8"], "hostname": "db-3", "conditions": {"ready": true}},
            ],
        }));
        let v6 = slice(serde_json::json!({
            "metadata": {"name": "db-def"}, "addressType": "IPv6",
            "endpoints": [{"addresses": ["fd00::5"], "hostname": "db-0"}],
        }));
        let fqdn = slice(serde_json::json!({
            "metadata": {"name": "db-fqdn"}, "addressType": "FQDN",
            "endpoints": [{"addresses": ["db.example.com"]}],
        }));
        let r = records(&i, &[&v4, &v6, &fqdn], "west");
        assert!(r.headless);
        assert!(
            r.ips.is_empty(),
            "a headless import's IPs are never answered"
        );
        let got: Vec<(String, String, Vec<String>)> = r
            .endpoints
            .iter()
            .map(|e| {
                (
                    e.cluster.clone(),
                    e.hostname.clone(),
                    e.addresses.iter().map(ToString::to_string).collect(),
                )
            })
            .collect();
        let want: Vec<(String, String, Vec<String>)> = [
            ("west", "db-0", vec!["10.1.0.5", "fd00::5"]),
            ("west", "10-1-0-6", vec!["10.1.0.6"]),
            ("west", "db-3", vec!["10.1.0.8"]),
        ]
        .into_iter()
        .map(|(c, h, a)| (c.into(), h.into(), a.into_iter().map(Into::into).collect()))
        .collect();
        assert_eq!(got, want);
    }
}
