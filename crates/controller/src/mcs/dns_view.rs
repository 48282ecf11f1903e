//! What the `clusterset.local` DNS server (`crate::clusterset_dns`) reads of this
//! component: every ServiceImport of the allowed namespaces (ours or another
//! implementation's: DNS reads, never writes, as CoreDNS's multicluster plugin reads
//! them) and, for a Headless import, the ready endpoints of every exporting cluster
//! that can be reached from here:
//!
//! - this cluster's own, when it exports the name: the exported Service's
//!   EndpointSlices, which the import side caches anyway;
//! - a remote cluster's, when a link of ours mirrors that cluster's headless Service
//!   with `--enable-headless-services`: the headless mirror `<svc>-<cluster>`'s
//!   EndpointSlices (`core::slices`'s `headless_slices`) list each pod's hostname with
//!   the ClusterIP of its endpoint mirror (`<hostname>-<cluster>`, routed through the
//!   cluster's gateway). Only slices that are ours count: the mirror labels of that
//!   cluster, our managed-by (never kube-controller-manager's mirror of Endpoints,
//!   which Linkerd's mirrors get), the headless label, the mirror's name for the
//!   import and cluster, in the import's namespace, and no controller-namespace
//!   annotation but ours (a Link's mirrors carry none, as Linkerd's: absent is
//!   accepted). A remote pod's own address is never answered: it is not reachable
//!   from here (no flat network).
//!
//! A lookup locks the shared state for the copy of one import's answered fields (and
//! its endpoints'); records are built after the lock is released. `copy` and `records`
//! are pure and table-tested.

use super::resource::ServiceImport;
use super::shared::Shared;
use crate::clusterset_dns::Zone;
use crate::clusterset_dns::answer::{Endpoint, Lookup, Port, ServiceRecords, dashed};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use service_mirror_core::ServiceKey;
use service_mirror_core::labels::{
    CLUSTER_NAME_LABEL, CONTROLLER_NAMESPACE_ANNOTATION, HEADLESS_SLICE_LABEL, SERVICE_NAME_LABEL,
};
use service_mirror_core::naming::mirror_name;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::IpAddr;
use std::sync::Arc;

/// The zone's data: the MCS component's shared state, this cluster's name and the
/// controller's namespace (whose headless mirrors count).
#[derive(Clone)]
pub(crate) struct ImportZone {
    pub(super) shared: Arc<parking_lot::Mutex<Shared>>,
    pub(super) local: String,
    pub(super) controller_namespace: String,
}

impl Zone for ImportZone {
    fn service(&self, namespace: &str, name: &str) -> Lookup {
        let key = ServiceKey::new(namespace, name);
        // Under the lock: a copy of what the zone reads of this one import (and, when
        // headless, of its clusters' ready endpoints); the records are built after it
        // is released.
        let copied = {
            let shared = self.shared.lock();
            let cache = &shared.cache;
            if !cache.imports_listed() {
                return Lookup::NotListed;
            }
            let Some(import) = cache.import(&key) else {
                return Lookup::Missing;
            };
            copy(
                import,
                &key,
                &self.local,
                &self.controller_namespace,
                |k| cache.local_slices(k),
                |k| cache.mirror_slices(k),
            )
        };
        match copied {
            Some(copied) => Lookup::Found(records(copied)),
            None => Lookup::NotListed,
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

/// What the zone reads of an import and its clusters' endpoints, copied out of the
/// caches: no more than the fields answered, no record built.
#[derive(Debug, Default)]
pub(crate) struct ImportCopy {
    headless: bool,
    ips: Vec<IpAddr>,
    ports: Vec<Port>,
    /// The clusters the endpoints are in (this one first, when it exports the name).
    clusters: Vec<String>,
    /// The ready endpoints of IPv4 and IPv6 slices: (its cluster's index in
    /// `clusters`, hostname as given, addresses).
    endpoints: Vec<(usize, Option<String>, Vec<IpAddr>)>,
}

/// Copies what the zone reads of `import` (the import `key`): a ClusterSetIP import's
/// IPs, the ports, and, headless, the ready endpoints of this cluster `local` (when the
/// import's `status.clusters` lists it: `local_slices` of `key`) and of each other
/// cluster it lists (our headless mirror's slices, `mirror_slices` of
/// `<ns>/<svc>-<cluster>`, those [`is_our_headless_mirror_slice`] only). `None`: a
/// source read is not listed yet.
pub(crate) fn copy<'a, L, M>(
    import: &ServiceImport,
    key: &ServiceKey,
    local: &str,
    controller_namespace: &str,
    local_slices: impl FnOnce(&ServiceKey) -> Option<L>,
    mut mirror_slices: impl FnMut(&ServiceKey) -> Option<M>,
) -> Option<ImportCopy>
where
    L: Iterator<Item = &'a EndpointSlice>,
    M: Iterator<Item = &'a EndpointSlice>,
{
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
    let mut copied = ImportCopy {
        headless,
        ips,
        ports,
        clusters: Vec::new(),
        endpoints: Vec::new(),
    };
    if !headless {
        return Some(copied);
    }
    let mut clusters = import.clusters();
    clusters.dedup(); // sorted: a repeated entry is read once
    if clusters.iter().any(|c| c == local) {
        copied.clusters.push(local.to_string());
        for slice in local_slices(key)? {
            ready_endpoints(slice, 0, &mut copied.endpoints);
        }
    }
    for cluster in clusters.iter().filter(|c| *c != local) {
        let mirror = mirror_name(&key.name, cluster);
        let slices = mirror_slices(&ServiceKey::new(&key.namespace, &mirror))?;
        let at = copied.clusters.len();
        let before = copied.endpoints.len();
        for slice in slices.filter(|s| {
            is_our_headless_mirror_slice(s, &key.namespace, &mirror, cluster, controller_namespace)
        }) {
            ready_endpoints(slice, at, &mut copied.endpoints);
        }
        if copied.endpoints.len() > before {
            copied.clusters.push(cluster.clone());
        }
    }
    Some(copied)
}

/// Whether `slice` is a slice of our headless mirror `<namespace>/<mirror>` of
/// `cluster`: in that namespace, the mirror labels of that cluster, our managed-by,
/// the headless label, the mirror's service name, and no controller-namespace
/// annotation but `controller_namespace` (a Link's mirrors carry none).
pub(crate) fn is_our_headless_mirror_slice(
    slice: &EndpointSlice,
    namespace: &str,
    mirror: &str,
    cluster: &str,
    controller_namespace: &str,
) -> bool {
    let meta = &slice.metadata;
    let Some(labels) = meta.labels.as_ref() else {
        return false;
    };
    let annotation = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONTROLLER_NAMESPACE_ANNOTATION));
    meta.namespace.as_deref() == Some(namespace)
        && service_mirror_core::slices::is_our_slice(meta, cluster)
        && labels.get(CLUSTER_NAME_LABEL).map(String::as_str) == Some(cluster)
        && labels.get(SERVICE_NAME_LABEL).map(String::as_str) == Some(mirror)
        && labels.contains_key(HEADLESS_SLICE_LABEL)
        && annotation.is_none_or(|ns| ns == controller_namespace)
}

/// The ready endpoints of `slice` (IPv4 or IPv6), as of the cluster at index `at`.
fn ready_endpoints(
    slice: &EndpointSlice,
    at: usize,
    out: &mut Vec<(usize, Option<String>, Vec<IpAddr>)>,
) {
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return;
    }
    for e in &slice.endpoints {
        // Unset means ready (the API's reading).
        if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
            continue;
        }
        let addresses: Vec<IpAddr> = e.addresses.iter().filter_map(|a| a.parse().ok()).collect();
        if !addresses.is_empty() {
            out.push((at, e.hostname.clone(), addresses));
        }
    }
}

/// What the zone answers of an import's copy: its type, ClusterSetIPs and ports, and,
/// headless, the ready endpoints (this cluster's, and the remote ones' through their
/// headless mirrors), one per (cluster, hostname) (an endpoint without one: one per
/// address, named by it), in the order first seen. Linear in the endpoints.
pub(crate) fn records(copied: ImportCopy) -> ServiceRecords {
    let mut endpoints: Vec<Endpoint> = Vec::new();
    // (cluster index, hostname) -> its index in `endpoints`.
    let mut index: HashMap<(usize, String), usize> = HashMap::new();
    let clusters = &copied.clusters;
    for (cluster, hostname, addresses) in copied.endpoints {
        let mut add = |hostname: String, addresses: Vec<IpAddr>| {
            add(
                &mut endpoints,
                &mut index,
                (clusters, cluster),
                hostname,
                addresses,
            )
        };
        match hostname.filter(|h| !h.is_empty()) {
            Some(h) => add(h.to_ascii_lowercase(), addresses),
            // No hostname: each address is its own name.
            None => {
                for a in addresses {
                    add(dashed(a), vec![a]);
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
    index: &mut HashMap<(usize, String), usize>,
    (clusters, cluster): (&[String], usize),
    hostname: String,
    addresses: Vec<IpAddr>,
) {
    if addresses.is_empty() {
        return;
    }
    match index.entry((cluster, hostname)) {
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
            let hostname = at.key().1.clone();
            at.insert(endpoints.len());
            endpoints.push(Endpoint {
                cluster: clusters.get(cluster).cloned().unwrap_or_default(),
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

    /// The records of `i` (`shop/<name>`) as this cluster, west, of controller
    /// namespace `mc`, with this cluster's `local` slices and the headless-mirror
    /// `mirrors` as the cache files them (by namespace and service-name label).
    fn answered(
        i: &ServiceImport,
        local: &[EndpointSlice],
        mirrors: &[EndpointSlice],
    ) -> ServiceRecords {
        let key = ServiceKey::from_meta(&i.metadata).unwrap();
        let filed = |k: &ServiceKey| {
            let k = k.clone();
            Some(mirrors.iter().filter(move |s| {
                let label = s
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL));
                s.metadata.namespace.as_deref() == Some(&k.namespace) && label == Some(&k.name)
            }))
        };
        let copied = copy(i, &key, "west", "mc", |_| Some(local.iter()), filed).unwrap();
        records(copied)
    }

    /// (cluster, hostname, addresses) of each endpoint, in order.
    fn endpoints(r: &ServiceRecords) -> Vec<(String, String, Vec<String>)> {
        r.endpoints
            .iter()
            .map(|e| {
                (
                    e.cluster.clone(),
                    e.hostname.clone(),
                    e.addresses.iter().map(ToString::to_string).collect(),
                )
            })
            .collect()
    }

    /// (cluster, hostname, addresses) as written in a table.
    type Row<'a> = (&'a str, &'a str, &'a [&'a str]);

    fn want(rows: &[Row]) -> Vec<(String, String, Vec<String>)> {
        rows.iter()
            .map(|(c, h, a)| {
                (
                    c.to_string(),
                    h.to_string(),
                    a.iter().map(|a| a.to_string()).collect(),
                )
            })
            .collect()
    }

    /// A slice of our headless mirror `<svc>-<cluster>` in `shop`, as a Link's mirror
    /// (no controller-namespace annotation) or, with `controller`, a Secret link's.
    fn mirror_slice(
        name: &str,
        svc: &str,
        cluster: &str,
        controller: Option<&str>,
        endpoints: serde_json::Value,
    ) -> EndpointSlice {
        let mut s = slice(serde_json::json!({
            "metadata": {
                "name": name, "namespace": "shop",
                "labels": {
                    "kubernetes.io/service-name": format!("{svc}-{cluster}"),
                    "mirror.linkerd.io/mirrored-service": "true",
                    "mirror.linkerd.io/cluster-name": cluster,
                    "endpointslice.kubernetes.io/managed-by": "service-mirror.linkerd.io",
                    "service.kubernetes.io/headless": "",
                },
            },
            "addressType": "IPv4",
            "endpoints": endpoints,
        }));
        if let Some(ns) = controller {
            s.metadata.annotations =
                Some([(CONTROLLER_NAMESPACE_ANNOTATION.to_string(), ns.to_string())].into());
        }
        s
    }

    fn headless_db(clusters: &[&str]) -> ServiceImport {
        let clusters: Vec<serde_json::Value> = clusters
            .iter()
            .map(|c| serde_json::json!({"cluster": c}))
            .collect();
        import(serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
            "metadata": {"name": "db", "namespace": "shop"},
            "spec": {"type": "Headless", "ports": [{"name": "pg", "port": 5432}]},
            "status": {"clusters": clusters},
        }))
    }

    #[test]
    fn a_headless_import_merges_this_clusters_endpoints_and_the_remote_ones_of_our_headless_mirrors()
     {
        let local = [slice(serde_json::json!({
            "metadata": {"name": "db-abc", "namespace": "shop"}, "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.1.0.5"], "hostname": "db-0"},
                {"addresses": ["10.1.0.6"], "hostname": "db-1", "conditions": {"ready": false}},
            ],
        }))];
        let east = serde_json::json!([
            {"addresses": ["10.96.5.1"], "hostname": "db-0"},
            {"addresses": ["10.96.5.2"], "hostname": "db-1", "conditions": {"ready": false}},
            {"addresses": ["10.96.5.3"], "hostname": "DB-2", "conditions": {"ready": true}},
        ]);
        let mirrors = [
            // A Link's mirror (no controller-namespace annotation).
            mirror_slice("db-east-v4-0", "db", "east", None, east.clone()),
            // A Secret link's of ours.
            mirror_slice(
                "db-north-v4-0",
                "db",
                "north",
                Some("mc"),
                serde_json::json!([{"addresses": ["10.96.6.1"], "hostname": "db-0"}]),
            ),
            // Not listed by the import: never answered.
            mirror_slice(
                "db-south-v4-0",
                "db",
                "south",
                None,
                serde_json::json!([{"addresses": ["10.96.7.1"], "hostname": "db-0"}]),
            ),
        ];
        let cases: [(&str, &[&str], &[Row]); 4] = [
            (
                "this cluster and two remote ones",
                &["west", "east", "north"],
                &[
                    ("west", "db-0", &["10.1.0.5"]),
                    ("east", "db-0", &["10.96.5.1"]),
                    ("east", "db-2", &["10.96.5.3"]),
                    ("north", "db-0", &["10.96.6.1"]),
                ],
            ),
            (
                "remote only (this cluster does not export it)",
                &["east"],
                &[
                    ("east", "db-0", &["10.96.5.1"]),
                    ("east", "db-2", &["10.96.5.3"]),
                ],
            ),
            (
                "this cluster only",
                &["west"],
                &[("west", "db-0", &["10.1.0.5"])],
            ),
            (
                "a cluster without a headless mirror here adds nothing",
                &["west", "west2"],
                &[("west", "db-0", &["10.1.0.5"])],
            ),
        ];
        for (case, clusters, rows) in cases {
            let r = answered(&headless_db(clusters), &local, &mirrors);
            assert_eq!(endpoints(&r), want(rows), "{case}");
        }
    }

    #[test]
    fn only_our_headless_mirrors_slices_count() {
        let one = || serde_json::json!([{"addresses": ["10.96.9.9"], "hostname": "db-9"}]);
        let ours = mirror_slice("db-east-v4-0", "db", "east", None, one());
        let foreign: [(&str, EndpointSlice); 7] = [
            (
                "another controller's (its namespace annotation)",
                mirror_slice("x", "db", "east", Some("other"), one()),
            ),
            (
                "kube-controller-manager's mirror of Endpoints (Linkerd's)",
                {
                    let mut s = ours.clone();
                    s.metadata.labels.as_mut().unwrap().insert(
                        "endpointslice.kubernetes.io/managed-by".into(),
                        "endpointslicemirroring-controller.k8s.io".into(),
                    );
                    s
                },
            ),
            ("not a mirror", {
                let mut s = ours.clone();
                s.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .remove("mirror.linkerd.io/mirrored-service");
                s
            }),
            ("another cluster's label under east's mirror name", {
                let mut s = ours.clone();
                s.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert("mirror.linkerd.io/cluster-name".into(), "north".into());
                s
            }),
            ("not headless", {
                let mut s = ours.clone();
                s.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .remove("service.kubernetes.io/headless");
                s
            }),
            ("another namespace", {
                let mut s = ours.clone();
                s.metadata.namespace = Some("other".into());
                s
            }),
            ("an FQDN slice", {
                let mut s = ours.clone();
                s.address_type = "FQDN".into();
                s
            }),
        ];
        let i = headless_db(&["east"]);
        assert_eq!(
            endpoints(&answered(&i, &[], std::slice::from_ref(&ours))),
            want(&[("east", "db-9", &["10.96.9.9"])])
        );
        for (case, s) in foreign {
            // The cache files it under east's mirror whatever it says: the check is ours.
            let key = ServiceKey::new("shop", "db-east");
            let copied = copy(
                &i,
                &ServiceKey::new("shop", "db"),
                "west",
                "mc",
                |_| Some([].iter()),
                |k| {
                    let hit = *k == key;
                    Some(std::iter::once(&s).filter(move |_| hit))
                },
            )
            .unwrap();
            assert!(records(copied).endpoints.is_empty(), "{case}");
        }
    }

    #[test]
    fn a_source_not_listed_yet_is_said() {
        let i = headless_db(&["west", "east"]);
        let key = ServiceKey::new("shop", "db");
        let none = || None::<std::slice::Iter<'_, EndpointSlice>>;
        let some = || Some([].iter());
        assert!(copy(&i, &key, "west", "mc", |_| none(), |_| some()).is_none());
        assert!(copy(&i, &key, "west", "mc", |_| some(), |_| none()).is_none());
        assert!(copy(&i, &key, "west", "mc", |_| some(), |_| some()).is_some());
        // A ClusterSetIP import reads neither.
        let mut ip = i.clone();
        ip.spec.type_ = Some("ClusterSetIP".into());
        assert!(copy(&ip, &key, "west", "mc", |_| none(), |_| none()).is_some());
    }

    #[test]
    fn the_watch_keeps_only_what_the_zone_reads() {
        let mut s = mirror_slice(
            "db-east-v4-0",
            "db",
            "east",
            Some("mc"),
            serde_json::json!([{"addresses": ["10.96.5.1"], "hostname": "db-0",
                "nodeName": "n1", "zone": "z", "targetRef": {"kind": "Pod", "name": "db-0"},
                "conditions": {"ready": true, "serving": true, "terminating": false}}]),
        );
        s.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("app".into(), "db".into());
        s.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("a".into(), "b".into());
        s.ports = Some(vec![Default::default()]);
        let before = s.clone();
        super::super::watches::strip_headless_mirror_slice(&mut s);
        assert!(s.ports.is_none());
        assert_eq!(s.metadata.labels.as_ref().unwrap().len(), 5);
        assert_eq!(s.metadata.annotations.as_ref().unwrap().len(), 1);
        let e = &s.endpoints[0];
        assert!(e.target_ref.is_none() && e.node_name.is_none() && e.zone.is_none());
        assert_eq!(e.conditions.as_ref().unwrap().ready, Some(true));
        assert!(e.conditions.as_ref().unwrap().serving.is_none());
        // The zone answers the same of it.
        let i = headless_db(&["east"]);
        assert_eq!(
            endpoints(&answered(&i, &[], &[s])),
            endpoints(&answered(&i, &[], &[before]))
        );
        assert_eq!(
            super::super::watches::headless_mirror_slice_selector(),
            "mirror.linkerd.io/mirrored-service=true,endpointslice.kubernetes.io/managed-by=service-mirror.linkerd.io,service.kubernetes.io/headless"
        );
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
        let r = answered(&i, &[], &[]);
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
            "status": {"clusters": [{"cluster": "west"}]},
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
        let r = answered(&i, &[v4, v6, fqdn], &[]);
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
    /// (The import, this cluster's slices, our headless mirrors' slices.)
    struct Copying(ServiceImport, Vec<EndpointSlice>, Vec<EndpointSlice>);

    impl crate::clusterset_dns::Zone for Copying {
        fn service(&self, _: &str, name: &str) -> Lookup {
            if self.0.metadata.name.as_deref() != Some(name) {
                return Lookup::Missing;
            }
            Lookup::Found(answered(&self.0, &self.1, &self.2))
        }

        fn namespace_exists(&self, _: &str) -> Option<bool> {
            Some(true)
        }
    }

    /// The merge on the wire: `db.shop...` A and SRV, and each cluster's per-endpoint
    /// names, as hickory reads them.
    #[test]
    fn remote_endpoints_are_answered_by_name_through_the_zone() {
        use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
        use hickory_proto::rr::{Name, RecordType};
        let local = vec![slice(serde_json::json!({
            "metadata": {"name": "db-abc", "namespace": "shop"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.0.5"], "hostname": "db-0"}],
        }))];
        let mirrors = vec![
            mirror_slice(
                "db-east-v4-0",
                "db",
                "east",
                None,
                serde_json::json!([
                    {"addresses": ["10.96.5.1"], "hostname": "db-0"},
                    {"addresses": ["10.96.5.2"], "hostname": "db-1", "conditions": {"ready": false}},
                ]),
            ),
            mirror_slice(
                "x",
                "db",
                "east",
                Some("other"),
                serde_json::json!([
                    {"addresses": ["10.96.5.9"], "hostname": "db-9"},
                ]),
            ),
        ];
        let zone = Copying(headless_db(&["west", "east"]), local, mirrors);
        let ask = |name: &str, rtype| {
            let mut m = Message::new(1, MessageType::Query, OpCode::Query);
            m.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
            let (out, _, _) =
                crate::clusterset_dns::respond(&m.to_vec().unwrap(), &zone, false).unwrap();
            let m = Message::from_vec(&out).unwrap();
            let mut answers: Vec<String> = m.answers.iter().map(|r| r.data.to_string()).collect();
            answers.sort();
            (m.metadata.response_code, answers)
        };
        let ok = |a: &[&str]| {
            (
                ResponseCode::NoError,
                a.iter().map(|s| s.to_string()).collect(),
            )
        };
        assert_eq!(
            ask("db.shop.svc.clusterset.local.", RecordType::A),
            ok(&["10.1.0.5", "10.96.5.1"])
        );
        assert_eq!(
            ask("db-0.east.db.shop.svc.clusterset.local.", RecordType::A),
            ok(&["10.96.5.1"])
        );
        assert_eq!(
            ask("db-0.west.db.shop.svc.clusterset.local.", RecordType::A),
            ok(&["10.1.0.5"])
        );
        assert_eq!(
            ask("db.shop.svc.clusterset.local.", RecordType::SRV),
            ok(&[
                "0 50 5432 db-0.east.db.shop.svc.clusterset.local.",
                "0 50 5432 db-0.west.db.shop.svc.clusterset.local.",
            ])
        );
        for nx in [
            "db-1.east.db.shop.svc.clusterset.local.", // not ready
            "db-9.east.db.shop.svc.clusterset.local.", // another controller's mirror
        ] {
            assert_eq!(ask(nx, RecordType::A).0, ResponseCode::NXDomain, "{nx}");
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
            "status": {"clusters": [{"cluster": "west"}]},
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
        let key = ServiceKey::new("shop", "db");
        let copied = copy(
            &i,
            &key,
            "west",
            "mc",
            |_| Some(slices.iter()),
            |_| Some([].iter()),
        )
        .unwrap();
        let copy_took = t.elapsed();
        let t = Instant::now();
        let r = records(copied);
        let records_took = t.elapsed();
        assert_eq!(r.endpoints.len(), 5000);
        assert!(r.endpoints.iter().all(|e| e.addresses.len() == 2));
        assert_eq!(r.endpoints[4999].hostname, "db-4999");
        let zone = Copying(i, slices, Vec::new());
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
