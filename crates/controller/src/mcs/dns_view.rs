//! What the `clusterset.local` DNS server (`crate::clusterset_dns`) reads of this
//! component: every ServiceImport of the allowed namespaces (ours or another
//! implementation's: DNS reads, never writes, as CoreDNS's multicluster plugin reads
//! them) and, for a Headless import this cluster exports, this cluster's own ready
//! endpoints (the exported Service's EndpointSlices, which the import side caches
//! anyway). A lookup locks the shared state for the copy of one import's answered fields
//! (and its local endpoints'); records are built after the lock is released.
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
use std::collections::HashMap;
use std::collections::hash_map::Entry;
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
        // Under the lock: a copy of what the zone reads of this one import (and, when
        // headless and exported here, of this cluster's ready endpoints); the records
        // are built after it is released.
        let copied = {
            let shared = self.shared.lock();
            let cache = &shared.cache;
            if !cache.imports_listed() {
                return Lookup::NotListed;
            }
            let Some(import) = cache.import(&key) else {
                return Lookup::Missing;
            };
            let exports_here = is_headless(import) && import.clusters().contains(&self.local);
            if exports_here {
                match cache.local_slices(&key) {
                    None => return Lookup::NotListed,
                    Some(slices) => copy(import, slices),
                }
            } else {
                copy(import, std::iter::empty())
            }
        };
        Lookup::Found(records(copied, &self.local))
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

/// What the zone reads of an import and its local slices, copied out of the caches:
/// no more than the fields answered, no record built.
#[derive(Debug, Default)]
pub(crate) struct ImportCopy {
    headless: bool,
    ips: Vec<IpAddr>,
    ports: Vec<Port>,
    /// The ready endpoints of IPv4 and IPv6 slices: (hostname as given, addresses).
    endpoints: Vec<(Option<String>, Vec<IpAddr>)>,
}

/// Copies what the zone reads of `import` and, headless, of `local_slices` (this
/// cluster's own): a ClusterSetIP import's IPs, the ports, and the ready endpoints.
pub(crate) fn copy<'a>(
    import: &ServiceImport,
    local_slices: impl Iterator<Item = &'a EndpointSlice>,
) -> ImportCopy {
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
    let mut endpoints = Vec::new();
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
                if !addresses.is_empty() {
                    endpoints.push((e.hostname.clone(), addresses));
                }
            }
        }
    }
    ImportCopy {
        headless,
        ips,
        ports,
        endpoints,
    }
}

/// What the zone answers of an import's copy: its type, ClusterSetIPs and ports, and,
/// headless, the ready endpoints (this cluster's own, named by cluster `local`), one
/// per hostname (an endpoint without one: one per address, named by it), in the order
/// first seen. Linear in the endpoints.
pub(crate) fn records(copied: ImportCopy, local: &str) -> ServiceRecords {
    let mut endpoints: Vec<Endpoint> = Vec::new();
    // (cluster, hostname) -> its index in `endpoints`.
    let mut index: HashMap<(String, String), usize> = HashMap::new();
    for (hostname, addresses) in copied.endpoints {
        match hostname.filter(|h| !h.is_empty()) {
            Some(h) => add(
                &mut endpoints,
                &mut index,
                local,
                h.to_ascii_lowercase(),
                addresses,
            ),
            // No hostname: each address is its own name.
            None => {
                for a in addresses {
                    add(&mut endpoints, &mut index, local, dashed(a), vec![a]);
                }
            }
        }
    }
    ServiceRecords {
        headless: copied.headless,
        ips: copied.ips,
        ports: copied.ports,
        endpoints,
    }
}

/// One endpoint per (cluster, hostname): the addresses of two slices' entries with the
/// same hostname (its IPv4 and IPv6 slices) joined.
fn add(
    endpoints: &mut Vec<Endpoint>,
    index: &mut HashMap<(String, String), usize>,
    cluster: &str,
    hostname: String,
    addresses: Vec<IpAddr>,
) {
    if addresses.is_empty() {
        return;
    }
    match index.entry((cluster.to_string(), hostname)) {
        Entry::Occupied(at) => {
            let e = &mut endpoints[*at.get()];
            for a in addresses {
                // An endpoint has a handful of addresses (one per family).
                if !e.addresses.contains(&a) {
                    e.addresses.push(a);
                }
            }
        }
        Entry::Vacant(at) => {
            let (cluster, hostname) = at.key().clone();
            at.insert(endpoints.len());
            endpoints.push(Endpoint {
                cluster,
                hostname,
                addresses,
            });
        }
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
        let r = records(copy(&i, std::iter::empty()), "west");
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
        let r = records(copy(&i, [&v4, &v6, &fqdn].into_iter()), "west");
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

    /// A Zone as `ImportZone` answers: the copy (what runs under the MCS lock), then
    /// the records, per query.
    struct Copying(ServiceImport, Vec<EndpointSlice>);

    impl crate::clusterset_dns::Zone for Copying {
        fn service(&self, _: &str, _: &str) -> Lookup {
            Lookup::Found(records(copy(&self.0, self.1.iter()), "west"))
        }

        fn namespace_exists(&self, _: &str) -> Option<bool> {
            Some(true)
        }
    }

    #[test]
    fn a_headless_service_of_5000_pods_is_copied_grouped_and_answered_in_linear_time() {
        use hickory_proto::op::{Message, MessageType, OpCode, Query};
        use hickory_proto::rr::{Name, RecordType};
        use std::time::Instant;
        let i = import(serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
            "metadata": {"name": "db", "namespace": "shop"},
            "spec": {"type": "Headless", "ports": [{"name": "pg", "port": 5432}]},
        }));
        // 50 slices of 100 (the EndpointSlice controller's default size), IPv4, and
        // their IPv6 twins: 5,000 hostnames of two addresses each.
        let slices: Vec<EndpointSlice> = (0..100)
            .map(|s| {
                let v6 = s >= 50;
                let endpoints: Vec<serde_json::Value> = (0..100)
                    .map(|e| {
                        let n = (s % 50) * 100 + e;
                        let a = if v6 {
                            format!("fd00::{n:x}")
                        } else {
                            format!("10.1.{}.{}", n / 256, n % 256)
                        };
                        serde_json::json!({"addresses": [a], "hostname": format!("db-{n}")})
                    })
                    .collect();
                slice(serde_json::json!({
                    "metadata": {"name": format!("db-{s}")},
                    "addressType": if v6 { "IPv6" } else { "IPv4" },
                    "endpoints": endpoints,
                }))
            })
            .collect();
        let t = Instant::now();
        let copied = copy(&i, slices.iter());
        let copy_took = t.elapsed();
        let t = Instant::now();
        let r = records(copied, "west");
        let records_took = t.elapsed();
        assert_eq!(r.endpoints.len(), 5000);
        assert!(r.endpoints.iter().all(|e| e.addresses.len() == 2));
        assert_eq!(r.endpoints[4999].hostname, "db-4999");
        let zone = Copying(i, slices);
        for (rtype, tcp) in [
            (RecordType::A, false),
            (RecordType::SRV, false),
            (RecordType::A, true),
            (RecordType::SRV, true),
        ] {
            let mut m = Message::new(1, MessageType::Query, OpCode::Query);
            m.add_query(Query::query(
                Name::from_ascii("db.shop.svc.clusterset.local.").unwrap(),
                rtype,
            ));
            let t = Instant::now();
            let (out, _, truncated) =
                crate::clusterset_dns::respond(&m.to_vec().unwrap(), &zone, tcp).unwrap();
            let took = t.elapsed();
            assert!(out.len() <= if tcp { 65_535 } else { 512 });
            let m = Message::from_vec(&out).unwrap();
            assert!(truncated && !m.answers.is_empty());
            eprintln!(
                "{rtype} over {}: {} answers in {} bytes, {took:?} (copy {copy_took:?}, records {records_took:?} of it)",
                if tcp { "TCP" } else { "UDP" },
                m.answers.len(),
                out.len()
            );
        }
    }
}
