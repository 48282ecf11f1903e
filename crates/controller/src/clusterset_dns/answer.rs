//! The `clusterset.local` zone's answers (the Multi-Cluster Services DNS specification,
//! KEP-1645 `specification.md`, schema 1.0.0), pure: a query and what the zone holds
//! in, a response out. What the zone holds comes from a [`Zone`]: the controller's
//! import caches in production (`mcs/dns_view.rs`), a table in the tests.
//!
//! Names (labels compared without case; answers carry the question's name as asked):
//!
//! | name | records |
//! |---|---|
//! | `<svc>.<ns>.svc.clusterset.local` | ClusterSetIP: A/AAAA of the import's `ips`; Headless: A/AAAA of every ready endpoint (none: NXDOMAIN, as the spec says); SRV: one per port (named or not) and target: the service name, or each endpoint's name |
//! | `_<port>._<proto>.<svc>.<ns>.svc.clusterset.local` | SRV of the named port `<port>` with protocol `<proto>`, targets as above (an unnamed port has none) |
//! | `<hostname>.<clusterid>.<svc>.<ns>.svc.clusterset.local` | Headless only: A/AAAA of that endpoint (the spec forbids per-cluster names of a ClusterSetIP service) |
//! | `dns-version.clusterset.local` | TXT `1.0.0` |
//! | `clusterset.local` | SOA |
//!
//! An endpoint without a hostname is named by its address, dashed (`10-1-2-3`), as
//! CoreDNS's kubernetes plugin names one. A name of the zone that does not exist is
//! NXDOMAIN; an existing name (an empty non-terminal too: `svc`, a namespace with an
//! import, `_tcp.<svc>...`) without a record of the type asked is NOERROR with no
//! answer; both carry the zone's SOA (negative caching: its minimum is the TTL). Names
//! outside the zone are REFUSED; before the imports are listed, SERVFAIL. Every record
//! has the TTL 5 s (CoreDNS's kubernetes plugin's default). PTR records are not served:
//! the derived Service's ClusterIP already has one in `cluster.local` (the spec's
//! "Limitations").

use super::wire::{Owner, Query, RData, Rcode, Record, Response, rtype};
use std::net::IpAddr;

/// The zone.
pub(crate) const ZONE: [&str; 2] = ["clusterset", "local"];
/// The TTL of every record.
pub(crate) const TTL: u32 = 5;
/// The schema version of the specification (its section 2.2).
pub(crate) const SCHEMA_VERSION: &str = "1.0.0";

/// A port of an imported Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Port {
    /// Its name (`None`: unnamed, no `_<port>._<proto>` record).
    pub(crate) name: Option<String>,
    /// Its protocol, lower case (`tcp`, `udp`, `sctp`).
    pub(crate) protocol: String,
    /// Its number.
    pub(crate) port: u16,
}

/// One ready endpoint of a headless import.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// The cluster it is in (its cluster id).
    pub(crate) cluster: String,
    /// Its hostname, or its address dashed when it has none.
    pub(crate) hostname: String,
    /// Its addresses.
    pub(crate) addresses: Vec<IpAddr>,
}

/// What the zone holds of one imported Service.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(crate) struct ServiceRecords {
    /// A headless import (endpoints answered) or a ClusterSetIP one (its IPs).
    pub(crate) headless: bool,
    /// The ClusterSetIPs.
    pub(crate) ips: Vec<IpAddr>,
    /// The ports.
    pub(crate) ports: Vec<Port>,
    /// A headless import's ready endpoints.
    pub(crate) endpoints: Vec<Endpoint>,
}

/// What the zone knows of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The imports are not listed yet: nothing can be said (SERVFAIL).
    NotListed,
    /// No such import.
    Missing,
    /// The import.
    Found(ServiceRecords),
}

/// The data the zone answers from (names in lower case).
pub(crate) trait Zone {
    /// The import `<namespace>/<name>`.
    fn service(&self, namespace: &str, name: &str) -> Lookup;
    /// Whether some import is in `namespace` (`None`: not listed yet).
    fn namespace_exists(&self, namespace: &str) -> Option<bool>;
}

/// The answer to `q`.
pub(crate) fn answer(q: &Query, zone: &(impl Zone + ?Sized)) -> Response {
    if q.opcode != 0 {
        return Response::empty(Rcode::NotImp);
    }
    if q.edns.is_some_and(|e| e.version != 0) {
        return Response::empty(Rcode::BadVers);
    }
    let labels: Vec<String> = q
        .labels
        .iter()
        .map(|l| String::from_utf8_lossy(l).to_ascii_lowercase())
        .collect();
    let n = labels.len();
    let in_zone = n >= ZONE.len() && labels[n - 2..] == ZONE;
    if !in_zone || q.qclass != super::wire::CLASS_IN {
        return Response::empty(Rcode::Refused);
    }
    let rel: Vec<&str> = labels[..n - 2].iter().map(String::as_str).collect();
    let found = match lookup(&rel, zone) {
        Ok(found) => found,
        Err(rcode) => return negative(rcode),
    };
    let mut resp = Response {
        rcode: Rcode::NoError,
        authoritative: true,
        answers: Vec::new(),
        authority: Vec::new(),
        additional: Vec::new(),
    };
    for data in found.records {
        if q.qtype == data_type(&data)
            || (q.qtype == rtype::ANY && matches!(data, RData::A(_) | RData::Aaaa(_)))
        {
            resp.answers.push(record(Owner::Question, data));
        }
    }
    if resp.answers.is_empty() {
        return negative(Rcode::NoError);
    }
    if q.qtype == rtype::SRV {
        resp.additional = found.glue;
    }
    resp
}

fn data_type(d: &RData) -> u16 {
    match d {
        RData::A(_) => rtype::A,
        RData::Aaaa(_) => rtype::AAAA,
        RData::Srv { .. } => rtype::SRV,
        RData::Txt(_) => rtype::TXT,
        RData::Soa { .. } => rtype::SOA,
    }
}

fn record(owner: Owner, data: RData) -> Record {
    Record {
        owner,
        ttl: TTL,
        data,
    }
}

/// NXDOMAIN, or NOERROR with no answer: authoritative, with the zone's SOA. SERVFAIL
/// and the rest: no records.
fn negative(rcode: Rcode) -> Response {
    let mut resp = Response::empty(rcode);
    if matches!(rcode, Rcode::NoError | Rcode::NxDomain) {
        resp.authoritative = true;
        resp.authority
            .push(record(Owner::Name(zone_name(&[])), soa()));
    }
    resp
}

/// The zone's SOA (the minimum, 5 s, is how long a negative answer is cached).
fn soa() -> RData {
    RData::Soa {
        mname: zone_name(&["ns", "dns"]),
        rname: zone_name(&["hostmaster"]),
        serial: 1,
        times: [7200, 1800, 86400, TTL],
    }
}

/// `<prefix>.clusterset.local` as labels.
fn zone_name(prefix: &[&str]) -> Vec<String> {
    prefix
        .iter()
        .chain(ZONE.iter())
        .map(|s| s.to_string())
        .collect()
}

/// Whether `labels` fit in a name on the wire (63 octets a label, 255 in all).
fn name_fits(labels: &[String]) -> bool {
    labels.iter().all(|l| !l.is_empty() && l.len() <= 63)
        && labels.iter().map(|l| l.len() + 1).sum::<usize>() < 255
}

/// The records a name owns (of every type), and the addresses of the SRV targets.
#[derive(Default)]
struct Found {
    records: Vec<RData>,
    glue: Vec<Record>,
}

/// What the name `rel` (relative to the zone, lower case) owns: `Err` NXDOMAIN (or
/// SERVFAIL); an empty `Found` for an existing name without records.
fn lookup(rel: &[&str], zone: &(impl Zone + ?Sized)) -> Result<Found, Rcode> {
    let listed = |l: Lookup| match l {
        Lookup::NotListed => Err(Rcode::ServFail),
        Lookup::Missing => Err(Rcode::NxDomain),
        Lookup::Found(s) => Ok(s),
    };
    match rel {
        [] => Ok(Found {
            records: vec![soa()],
            glue: Vec::new(),
        }),
        ["dns-version"] => Ok(Found {
            records: vec![RData::Txt(SCHEMA_VERSION.into())],
            glue: Vec::new(),
        }),
        ["svc"] => Ok(Found::default()),
        [ns, "svc"] => match zone.namespace_exists(ns) {
            None => Err(Rcode::ServFail),
            Some(true) => Ok(Found::default()),
            Some(false) => Err(Rcode::NxDomain),
        },
        [svc, ns, "svc"] => {
            let s = listed(zone.service(ns, svc))?;
            service_records(&s, svc, ns)
        }
        [first, svc, ns, "svc"] => {
            let s = listed(zone.service(ns, svc))?;
            let exists = match first.strip_prefix('_') {
                // `_<proto>`: exists while a named port of that protocol does.
                Some(proto) => s
                    .ports
                    .iter()
                    .any(|p| p.name.is_some() && p.protocol == proto),
                // `<clusterid>`: a headless import's cluster with an endpoint.
                None => s.headless && s.endpoints.iter().any(|e| e.cluster == *first),
            };
            if exists {
                Ok(Found::default())
            } else {
                Err(Rcode::NxDomain)
            }
        }
        [first, second, svc, ns, "svc"] => {
            let s = listed(zone.service(ns, svc))?;
            match (first.strip_prefix('_'), second.strip_prefix('_')) {
                (Some(port), Some(proto)) => {
                    let ports: Vec<&Port> = s
                        .ports
                        .iter()
                        .filter(|p| p.name.as_deref() == Some(port) && p.protocol == proto)
                        .collect();
                    if ports.is_empty() {
                        return Err(Rcode::NxDomain);
                    }
                    srv_records(&s, &ports, svc, ns)
                }
                (None, None) if s.headless => {
                    let records: Vec<RData> = s
                        .endpoints
                        .iter()
                        .filter(|e| e.cluster == *second && e.hostname == *first)
                        .flat_map(|e| e.addresses.iter().copied().map(address))
                        .collect();
                    if records.is_empty() {
                        Err(Rcode::NxDomain)
                    } else {
                        Ok(Found {
                            records,
                            glue: Vec::new(),
                        })
                    }
                }
                // A ClusterSetIP service has no per-cluster names (spec 2.3.4).
                _ => Err(Rcode::NxDomain),
            }
        }
        _ => Err(Rcode::NxDomain),
    }
}

fn address(ip: IpAddr) -> RData {
    match ip {
        IpAddr::V4(ip) => RData::A(ip),
        IpAddr::V6(ip) => RData::Aaaa(ip),
    }
}

/// `<svc>.<ns>.svc.clusterset.local`'s own records.
fn service_records(s: &ServiceRecords, svc: &str, ns: &str) -> Result<Found, Rcode> {
    let addresses: Vec<RData> = if s.headless {
        s.endpoints
            .iter()
            .flat_map(|e| e.addresses.iter().copied())
            .map(address)
            .collect()
    } else {
        s.ips.iter().copied().map(address).collect()
    };
    if s.headless && addresses.is_empty() {
        // "If there are no ready endpoints for the headless Service, the answer should
        // be NXDOMAIN" (spec 2.4.1).
        return Err(Rcode::NxDomain);
    }
    let ports: Vec<&Port> = s.ports.iter().collect();
    let mut found = srv_records(s, &ports, svc, ns)?;
    found.records.extend(addresses);
    Ok(found)
}

/// SRV records of `ports`: the service as target (ClusterSetIP), or each ready
/// endpoint (headless); with the targets' addresses as glue.
fn srv_records(s: &ServiceRecords, ports: &[&Port], svc: &str, ns: &str) -> Result<Found, Rcode> {
    let service_name = zone_name(&[svc, ns, "svc"]);
    let targets: Vec<(Vec<String>, Vec<IpAddr>)> = if s.headless {
        s.endpoints
            .iter()
            .map(|e| {
                let name = zone_name(&[&e.hostname, &e.cluster, svc, ns, "svc"]);
                (name, e.addresses.clone())
            })
            .filter(|(name, _)| name_fits(name))
            .collect()
    } else {
        vec![(service_name, s.ips.clone())]
    };
    let count = (ports.len() * targets.len()).max(1);
    let weight = (100 / count).max(1) as u16;
    let mut found = Found::default();
    for port in ports {
        for (target, _) in &targets {
            found.records.push(RData::Srv {
                priority: 0,
                weight,
                port: port.port,
                target: target.clone(),
            });
        }
    }
    if !ports.is_empty() {
        for (target, ips) in targets {
            for ip in ips {
                found
                    .glue
                    .push(record(Owner::Name(target.clone()), address(ip)));
            }
        }
    }
    Ok(found)
}

/// The name of an endpoint without a hostname: its address with `-` for `.` and `:`.
pub(crate) fn dashed(ip: IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}
