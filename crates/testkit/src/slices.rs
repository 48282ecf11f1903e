//! The slice invariants, written from the contract by hand (not with the core's slice
//! functions, which they check): for each desired mirror in a mode with slices, our
//! EndpointSlices carry the mirror's labels, Kubernetes' two slice labels, the fq-name
//! annotation and an ownerReference to the mirror Service; per address family, every
//! gateway address appears once per port, every port once per address; a slice holds
//! at most 1000 endpoints and 100 ports, with no more slices than those limits need;
//! no usable gateway: one IPv4 slice with no endpoints and no ports (Kubernetes' own
//! placeholder); never a port without a number in 1..=65535 (Linkerd's destination
//! dereferences it).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::EndpointsMode;
use super::oracle::Expected as DesiredMirror;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{Key, Kind, Snapshot, Violation, key_of};

const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const OURS: &str = "service-mirror.linkerd.io";
const SERVICE_NAME: &str = "kubernetes.io/service-name";
const FQ_NAME: &str = "mirror.linkerd.io/remote-svc-fq-name";

/// Whether a slice says it is ours (whichever cluster).
pub(crate) fn is_ours(s: &EndpointSlice) -> bool {
    s.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY))
        .map(String::as_str)
        == Some(OURS)
}

fn chunks(n: usize, per: usize) -> usize {
    n.div_ceil(per).max(1)
}

/// What one family of a mirror's slices must hold.
struct Want {
    addresses: BTreeSet<String>,
    /// (name, protocol, port).
    ports: BTreeSet<(String, String, Option<i32>)>,
}

/// The mirror's slices as the contract says, by address type.
fn want_of(m: &DesiredMirror) -> BTreeMap<&'static str, Want> {
    let subset = m.endpoints.subsets.as_ref().and_then(|s| s.first());
    let port = subset
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .map(|p| p.port);
    let ports: BTreeSet<(String, String, Option<i32>)> = m
        .service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                port,
            )
        })
        .collect();
    let mut out: BTreeMap<&'static str, Want> = BTreeMap::new();
    let addresses = subset
        .into_iter()
        .flat_map(|s| s.addresses.iter().chain(s.not_ready_addresses.iter()))
        .flatten();
    for a in addresses {
        let family = match a.ip.parse::<IpAddr>() {
            Ok(IpAddr::V4(_)) => "IPv4",
            Ok(IpAddr::V6(_)) => "IPv6",
            Err(_) => continue,
        };
        out.entry(family)
            .or_insert_with(|| Want {
                addresses: BTreeSet::new(),
                ports: ports.clone(),
            })
            .addresses
            .insert(a.ip.clone());
    }
    if out.is_empty() {
        out.insert(
            "IPv4",
            Want {
                addresses: BTreeSet::new(),
                ports: BTreeSet::new(),
            },
        );
    }
    out
}

/// Whether `slices` (ours, of one mirror) are what the contract says for `m`, owned by
/// the local Service of uid `uid`. Gateways count as alive (the checker does not model
/// probes): every endpoint ready and serving, none terminating.
fn slices_match(m: &DesiredMirror, uid: Option<&str>, slices: &[&EndpointSlice]) -> bool {
    let name = m.service.metadata.name.clone().unwrap_or_default();
    let fq = m
        .endpoints
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FQ_NAME));
    let mirror_labels = m.service.metadata.labels.clone().unwrap_or_default();
    let metadata_ok = slices.iter().all(|s| {
        let labels = s.metadata.labels.clone().unwrap_or_default();
        let owner_ok = s
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Service" && o.name == name && Some(o.uid.as_str()) == uid);
        s.metadata.name.as_ref().is_some_and(|n| n.len() <= 63)
            && labels.get(SERVICE_NAME) == Some(&name)
            && labels.get(MANAGED_BY).map(String::as_str) == Some(OURS)
            && mirror_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && s.metadata.annotations.as_ref().and_then(|a| a.get(FQ_NAME)) == fq
            && owner_ok
            && s.endpoints.len() <= 1000
            && s.ports.as_ref().map_or(0, Vec::len) <= 100
            && s.ports
                .iter()
                .flatten()
                .all(|p| p.port.is_some_and(|n| (1..=65535).contains(&n)))
            && s.endpoints.iter().all(|e| {
                let c = e.conditions.clone().unwrap_or_default();
                e.addresses.len() == 1
                    && c.ready == Some(true)
                    && c.serving == Some(true)
                    && c.terminating == Some(false)
            })
    });
    if !metadata_ok {
        return false;
    }
    let want = want_of(m);
    let families: BTreeSet<&str> = slices.iter().map(|s| s.address_type.as_str()).collect();
    if families != want.keys().copied().collect() {
        return false;
    }
    want.iter().all(|(family, w)| {
        let of_family: Vec<&&EndpointSlice> = slices
            .iter()
            .filter(|s| s.address_type == *family)
            .collect();
        // Every (address, port) pair exactly once.
        let mut pairs = BTreeMap::new();
        for s in &of_family {
            for e in &s.endpoints {
                for p in s.ports.iter().flatten() {
                    let port = (
                        p.name.clone().unwrap_or_default(),
                        p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                        p.port,
                    );
                    *pairs.entry((e.addresses[0].clone(), port)).or_insert(0) += 1;
                }
            }
        }
        let expected: BTreeSet<_> = w
            .addresses
            .iter()
            .flat_map(|a| w.ports.iter().map(move |p| (a.clone(), p.clone())))
            .collect();
        let ports_seen: BTreeSet<_> = of_family
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .map(|p| {
                (
                    p.name.clone().unwrap_or_default(),
                    p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    p.port,
                )
            })
            .collect();
        pairs.keys().cloned().collect::<BTreeSet<_>>() == expected
            && pairs.values().all(|n| *n == 1)
            && ports_seen == w.ports
            && of_family.len() == chunks(w.addresses.len(), 1000) * chunks(w.ports.len(), 100)
    })
}

/// The slice violations of `local` for the desired mirrors (`wanted`: mirror key →
/// (cluster, mirror)) in `mode`.
pub(crate) fn compare_slices(
    wanted: &BTreeMap<Key, (&str, &DesiredMirror)>,
    local: &Snapshot,
    mode: EndpointsMode,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut by_mirror: BTreeMap<Key, Vec<&EndpointSlice>> = BTreeMap::new();
    for s in local.slices.iter().filter(|s| is_ours(s)) {
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        let service = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME))
            .cloned()
            .unwrap_or_default();
        let mirror = (ns, service);
        match wanted.get(&mirror) {
            Some((cluster, _))
                if mode != EndpointsMode::Endpoints
                    && s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("mirror.linkerd.io/cluster-name"))
                        .map(String::as_str)
                        == Some(*cluster) =>
            {
                by_mirror.entry(mirror).or_default().push(s)
            }
            _ => out.push(Violation::Extra(
                Kind::EndpointSlice,
                key_of(&s.metadata),
                format!("no mirror wants this slice in {mode} mode"),
            )),
        }
    }
    if mode == EndpointsMode::Endpoints {
        return out;
    }
    let uids: BTreeMap<Key, Option<String>> = local
        .services
        .iter()
        .map(|s| (key_of(&s.metadata), s.metadata.uid.clone()))
        .collect();
    for (key, (_, m)) in wanted {
        match by_mirror.get(key) {
            None => out.push(Violation::Missing(Kind::EndpointSlice, key.clone())),
            Some(slices) => {
                let uid = uids.get(key).cloned().flatten();
                if !slices_match(m, uid.as_deref(), slices) {
                    out.push(Violation::Differs(Kind::EndpointSlice, key.clone()));
                }
            }
        }
    }
    out
}
