//! The `clusterset.local` zone's answers (the Multi-Cluster Services DNS specification,
//! KEP-1645 `specification.md`, schema 1.0.0), pure: a query and what the zone holds
//! in, a response out. What the zone holds comes from a [`Zone`]: the controller's
//! import caches in production (`mcs/dns_view.rs`), a table in the tests.
//!
//! Names (labels compared without case; answers carry the question's name as asked):
//!
//! | name | records |
//! |---|---|
//! | `<svc>.<ns>.svc.clusterset.local` | ClusterSetIP: A/AAAA of the import's `ips`; Headless: A/AAAA of every ready endpoint (none: NXDOMAIN, as the spec says); SRV: one per port number (named or not; two protocols on one number give one record) and target: the service name, or each endpoint's name |
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
use std::collections::HashMap;
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

/// The answer to `q`, whose response may take at most `limit` bytes: no more records
/// are built than could fit in it (one over, so that a cut is seen and TC set), however
/// many the name has.
pub(crate) fn answer(q: &Query, zone: &(impl Zone + ?Sized), limit: usize) -> Response {
    if q.opcode != 0 {
        return Response::empty(Rcode::NotImp);
    }
    if q.edns.is_some_and(|e| e.version != 0) {
        return Response::empty(Rcode::BadVers);
    }
    if q.qtype == rtype::OPT {
        // A pseudo-record, never a question (RFC 6891 6.1.1).
        return Response::empty(Rcode::FormErr);
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
    if matches!(q.qtype, rtype::AXFR | rtype::IXFR) {
        // The zone is the ServiceImports, not a file to transfer.
        return Response::empty(Rcode::NotImp);
    }
    let rel: Vec<&str> = labels[..n - 2].iter().map(String::as_str).collect();
    let ask = Ask {
        qtype: q.qtype,
        limit,
    };
    let found = match lookup(&rel, zone, &ask) {
        Ok(found) => found,
        Err(rcode) => return negative(rcode),
    };
    if found.answers.records.is_empty() {
        return negative(Rcode::NoError);
    }
    Response {
        rcode: Rcode::NoError,
        authoritative: true,
        answers: found.answers.records,
        authority: Vec::new(),
        additional: found.glue.records,
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

/// Whether the name `labels` (then the zone) fits on the wire (63 octets a label, 255
/// in all), checked before it is built.
fn name_fits(labels: &[&str]) -> bool {
    labels
        .iter()
        .chain(ZONE.iter())
        .all(|l| !l.is_empty() && l.len() <= 63)
        && labels
            .iter()
            .chain(ZONE.iter())
            .map(|l| l.len() + 1)
            .sum::<usize>()
            < 255
}

/// What the question asks: its type, and the response's size limit.
struct Ask {
    qtype: u16,
    limit: usize,
}

impl Ask {
    /// Whether records of type `t` answer (ANY: the addresses).
    fn wants(&self, t: u16) -> bool {
        self.qtype == t || (self.qtype == rtype::ANY && matches!(t, rtype::A | rtype::AAAA))
    }
}

/// Records of one section, built until they pass the size limit: the one that passes
/// it is kept (the response is then cut, with TC for answers), the rest never built.
struct Section {
    records: Vec<Record>,
    room: usize,
}

impl Section {
    fn new(limit: usize) -> Self {
        Self {
            records: Vec::new(),
            room: limit,
        }
    }

    /// Whether more records are worth building.
    fn open(&self) -> bool {
        self.room > 0
    }

    /// Adds `r` if the section is open; whether it still is.
    fn push(&mut self, r: Record) -> bool {
        if !self.open() {
            return false;
        }
        self.room = self.room.saturating_sub(super::wire::record_len(&r));
        self.records.push(r);
        self.open()
    }
}

/// The answers to the question of a name that exists (empty: NODATA), and the addresses
/// of SRV targets.
struct Found {
    answers: Section,
    glue: Section,
}

impl Found {
    fn new(ask: &Ask) -> Self {
        Self {
            answers: Section::new(ask.limit),
            glue: Section::new(ask.limit),
        }
    }

    /// `data` as an answer (owned by the question's name) if its type is asked.
    fn answer(&mut self, ask: &Ask, data: RData) -> bool {
        if ask.wants(data.rtype()) {
            self.answers.push(record(Owner::Question, data))
        } else {
            self.answers.open()
        }
    }
}

/// What the name `rel` (relative to the zone, lower case) answers to `ask`: `Err`
/// NXDOMAIN (or SERVFAIL); a `Found` without answers for an existing name without
/// records of the type asked.
fn lookup(rel: &[&str], zone: &(impl Zone + ?Sized), ask: &Ask) -> Result<Found, Rcode> {
    let mut found = Found::new(ask);
    // A service's record, or NXDOMAIN for it and every name under it when it does not
    // exist (RFC 8020): a headless import without a ready endpoint.
    let service = |ns: &str, svc: &str| match zone.service(ns, svc) {
        Lookup::NotListed => Err(Rcode::ServFail),
        Lookup::Missing => Err(Rcode::NxDomain),
        Lookup::Found(s) if s.headless && s.endpoints.is_empty() => Err(Rcode::NxDomain),
        Lookup::Found(s) => Ok(s),
    };
    match rel {
        [] => {
            found.answer(ask, soa());
        }
        ["dns-version"] => {
            found.answer(ask, RData::Txt(SCHEMA_VERSION.into()));
        }
        ["svc"] => {}
        [ns, "svc"] => match zone.namespace_exists(ns) {
            None => return Err(Rcode::ServFail),
            Some(true) => {}
            Some(false) => return Err(Rcode::NxDomain),
        },
        [svc, ns, "svc"] => {
            let s = service(ns, svc)?;
            if ask.wants(rtype::SRV) {
                let ports: Vec<&Port> = s.ports.iter().collect();
                srv_records(&mut found, &s, &ports, svc, ns);
            } else if ask.wants(rtype::A) || ask.wants(rtype::AAAA) {
                let addresses: Box<dyn Iterator<Item = IpAddr>> = if s.headless {
                    Box::new(s.endpoints.iter().flat_map(|e| e.addresses.iter().copied()))
                } else {
                    Box::new(s.ips.iter().copied())
                };
                for ip in addresses {
                    if !found.answer(ask, address(ip)) {
                        break;
                    }
                }
            }
        }
        [first, svc, ns, "svc"] => {
            let s = service(ns, svc)?;
            let exists = match first.strip_prefix('_') {
                // `_<proto>`: exists while a named port of that protocol does.
                Some(proto) => s
                    .ports
                    .iter()
                    .any(|p| p.name.is_some() && p.protocol == proto),
                // `<clusterid>`: a headless import's cluster with an endpoint.
                None => s.headless && s.endpoints.iter().any(|e| e.cluster == *first),
            };
            if !exists {
                return Err(Rcode::NxDomain);
            }
        }
        [first, second, svc, ns, "svc"] => {
            let s = service(ns, svc)?;
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
                    if ask.wants(rtype::SRV) {
                        srv_records(&mut found, &s, &ports, svc, ns);
                    }
                }
                (None, None) if s.headless => {
                    let mut endpoints = s
                        .endpoints
                        .iter()
                        .filter(|e| e.cluster == *second && e.hostname == *first)
                        .peekable();
                    if endpoints.peek().is_none() {
                        return Err(Rcode::NxDomain);
                    }
                    for ip in endpoints.flat_map(|e| e.addresses.iter().copied()) {
                        if !found.answer(ask, address(ip)) {
                            break;
                        }
                    }
                }
                // A ClusterSetIP service has no per-cluster names (spec 2.3.4).
                _ => return Err(Rcode::NxDomain),
            }
        }
        _ => return Err(Rcode::NxDomain),
    }
    Ok(found)
}

fn address(ip: IpAddr) -> RData {
    match ip {
        IpAddr::V4(ip) => RData::A(ip),
        IpAddr::V6(ip) => RData::Aaaa(ip),
    }
}

/// SRV answers of `ports` (port by port): the service as target (ClusterSetIP), or
/// each ready endpoint (headless); with the targets' addresses as glue. Built only
/// while they may fit the response.
///
/// An RRset holds no two identical records (RFC 2181 5; CoreDNS's `kubernetes`
/// answers one): a port number under two protocols (the conformance suite's hello
/// serves 42 over TCP and UDP) is one record per target, and an endpoint name in two
/// slices (one per address family) one target, with both families' addresses as glue.
fn srv_records(found: &mut Found, s: &ServiceRecords, ports: &[&Port], svc: &str, ns: &str) {
    let mut numbers: Vec<u16> = Vec::with_capacity(ports.len());
    for p in ports {
        if !numbers.contains(&p.port) {
            numbers.push(p.port);
        }
    }
    // The targets (their labels before the zone, each once) and their addresses.
    let mut targets: Vec<([&str; 5], Vec<IpAddr>)> = Vec::new();
    if s.headless {
        let mut index: HashMap<[&str; 5], usize> = HashMap::with_capacity(s.endpoints.len());
        for e in &s.endpoints {
            let name = [e.hostname.as_str(), e.cluster.as_str(), svc, ns, "svc"];
            if !name_fits(&name) {
                continue;
            }
            let i = match index.get(&name) {
                Some(i) => *i,
                None => {
                    index.insert(name, targets.len());
                    targets.push((name, Vec::new()));
                    targets.len() - 1
                }
            };
            targets[i].1.extend(e.addresses.iter().copied());
        }
    } else {
        targets.push(([svc, ns, "svc", "", ""], s.ips.clone()));
    }
    let labels = |name: &[&str; 5]| -> Vec<String> {
        let n = if s.headless { 5 } else { 3 };
        zone_name(&name[..n])
    };
    let count = (numbers.len() * targets.len()).max(1);
    let weight = (100 / count).max(1) as u16;
    // The targets some SRV answer names (a prefix of `targets`).
    let mut named = 0;
    'ports: for port in &numbers {
        for (i, (target, _)) in targets.iter().enumerate() {
            named = named.max(i + 1);
            let srv = RData::Srv {
                priority: 0,
                weight,
                port: *port,
                target: labels(target),
            };
            if !found.answers.push(record(Owner::Question, srv)) {
                break 'ports;
            }
        }
    }
    'glue: for (target, ips) in &targets[..named] {
        let owner = labels(target);
        for ip in ips.iter().copied() {
            if !found
                .glue
                .push(record(Owner::Name(owner.clone()), address(ip)))
            {
                break 'glue;
            }
        }
    }
}

/// The name of an endpoint without a hostname: its address with `-` for `.` and `:`.
pub(crate) fn dashed(ip: IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}
