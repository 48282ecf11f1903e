//! Table tests of the zone's answers, written out from the MCS DNS specification
//! (KEP-1645 `specification.md`): each query is built and each response read by
//! hickory-proto (an independent codec), through [`super::respond`], the server's
//! own path from bytes to bytes.

use super::answer::{Endpoint, Lookup, Port, ServiceRecords, Zone};
use super::respond;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// A zone from a table.
struct Table {
    listed: bool,
    services: BTreeMap<(String, String), ServiceRecords>,
}

impl Zone for Table {
    fn service(&self, namespace: &str, name: &str) -> Lookup {
        if !self.listed {
            return Lookup::NotListed;
        }
        match self.services.get(&(namespace.into(), name.into())) {
            Some(s) => Lookup::Found(s.clone()),
            None => Lookup::Missing,
        }
    }

    fn namespace_exists(&self, namespace: &str) -> Option<bool> {
        self.listed
            .then(|| self.services.keys().any(|(ns, _)| ns == namespace))
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn port(name: Option<&str>, protocol: &str, port: u16) -> Port {
    Port {
        name: name.map(Into::into),
        protocol: protocol.into(),
        port,
    }
}

fn endpoint(cluster: &str, hostname: &str, addresses: &[&str]) -> Endpoint {
    Endpoint {
        cluster: cluster.into(),
        hostname: hostname.into(),
        addresses: addresses.iter().map(|a| ip(a)).collect(),
    }
}

/// `shop/web`: ClusterSetIP, dual-stack, ports http/80 TCP, dns/53 UDP and an unnamed
/// 8080; `shop/db`: headless, two endpoints of west (one dual-stack, one without a
/// hostname) and one of east; `shop/empty`: headless, no endpoint; `shop/noip`:
/// ClusterSetIP without IPs yet.
fn zone() -> Table {
    let mut services = BTreeMap::new();
    services.insert(
        ("shop".into(), "web".into()),
        ServiceRecords {
            headless: false,
            ips: vec![ip("10.96.0.10"), ip("fd00::10")],
            ports: vec![
                port(Some("http"), "tcp", 80),
                port(Some("dns"), "udp", 53),
                port(None, "tcp", 8080),
            ],
            endpoints: Vec::new(),
        },
    );
    services.insert(
        ("shop".into(), "db".into()),
        ServiceRecords {
            headless: true,
            ips: Vec::new(),
            ports: vec![port(Some("pg"), "tcp", 5432)],
            endpoints: vec![
                endpoint("west", "db-0", &["10.1.0.5", "fd00::5"]),
                endpoint("west", "10-1-0-6", &["10.1.0.6"]),
                endpoint("east", "db-0", &["10.2.0.5"]),
            ],
        },
    );
    services.insert(
        ("shop".into(), "empty".into()),
        ServiceRecords {
            headless: true,
            ports: vec![port(Some("pg"), "tcp", 5432)],
            ..ServiceRecords::default()
        },
    );
    services.insert(
        ("shop".into(), "noip".into()),
        ServiceRecords {
            ports: vec![port(Some("http"), "tcp", 80)],
            ..ServiceRecords::default()
        },
    );
    Table {
        listed: true,
        services,
    }
}

fn query_bytes(name: &str, rtype: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    if let Some(size) = edns {
        let mut e = Edns::new();
        e.set_max_payload(size);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

/// The response to `name`/`rtype` over UDP without EDNS: its code and its records
/// (answer, then authority, then additional), one line each.
fn ask(zone: &Table, name: &str, rtype: RecordType) -> (ResponseCode, Vec<String>) {
    let (out, _, _) = respond(&query_bytes(name, rtype, None), zone, false).unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert_eq!(m.metadata.id, 0x4242);
    assert_eq!(m.metadata.message_type, MessageType::Response);
    assert!(m.metadata.recursion_desired, "RD is echoed");
    assert!(!m.metadata.recursion_available);
    assert_eq!(m.queries.len(), 1, "the question is echoed");
    let lines = m
        .answers
        .iter()
        .map(|r| format!("AN {r}"))
        .chain(m.authorities.iter().map(|r| format!("NS {r}")))
        .chain(m.additionals.iter().map(|r| format!("AR {r}")))
        .collect();
    (m.metadata.response_code, lines)
}

const SOA: &str = "NS clusterset.local. 5 IN SOA ns.dns.clusterset.local. hostmaster.clusterset.local. 1 7200 1800 86400 5";

#[test]
fn clusterset_ip_services_answer_their_ips_and_ports() {
    let z = zone();
    let web = "web.shop.svc.clusterset.local.";
    let cases: &[(&str, RecordType, ResponseCode, &[&str])] = &[
        (
            web,
            RecordType::A,
            ResponseCode::NoError,
            &["AN web.shop.svc.clusterset.local. 5 IN A 10.96.0.10"],
        ),
        (
            web,
            RecordType::AAAA,
            ResponseCode::NoError,
            &["AN web.shop.svc.clusterset.local. 5 IN AAAA fd00::10"],
        ),
        // Names are compared without case; the answer carries the name as asked.
        (
            "WEB.Shop.SVC.ClusterSet.Local.",
            RecordType::A,
            ResponseCode::NoError,
            &["AN WEB.Shop.SVC.ClusterSet.Local. 5 IN A 10.96.0.10"],
        ),
        // The plain name's SRV: every port, named or not, the service as target.
        (
            web,
            RecordType::SRV,
            ResponseCode::NoError,
            &[
                "AN web.shop.svc.clusterset.local. 5 IN SRV 0 33 80 web.shop.svc.clusterset.local.",
                "AN web.shop.svc.clusterset.local. 5 IN SRV 0 33 53 web.shop.svc.clusterset.local.",
                "AN web.shop.svc.clusterset.local. 5 IN SRV 0 33 8080 web.shop.svc.clusterset.local.",
                "AR web.shop.svc.clusterset.local. 5 IN A 10.96.0.10",
                "AR web.shop.svc.clusterset.local. 5 IN AAAA fd00::10",
            ],
        ),
        (
            "_http._tcp.web.shop.svc.clusterset.local.",
            RecordType::SRV,
            ResponseCode::NoError,
            &[
                "AN _http._tcp.web.shop.svc.clusterset.local. 5 IN SRV 0 100 80 web.shop.svc.clusterset.local.",
                "AR web.shop.svc.clusterset.local. 5 IN A 10.96.0.10",
                "AR web.shop.svc.clusterset.local. 5 IN AAAA fd00::10",
            ],
        ),
        (
            "_dns._udp.web.shop.svc.clusterset.local.",
            RecordType::SRV,
            ResponseCode::NoError,
            &[
                "AN _dns._udp.web.shop.svc.clusterset.local. 5 IN SRV 0 100 53 web.shop.svc.clusterset.local.",
                "AR web.shop.svc.clusterset.local. 5 IN A 10.96.0.10",
                "AR web.shop.svc.clusterset.local. 5 IN AAAA fd00::10",
            ],
        ),
        // A port with another protocol, or another name: no such name.
        (
            "_http._udp.web.shop.svc.clusterset.local.",
            RecordType::SRV,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "_https._tcp.web.shop.svc.clusterset.local.",
            RecordType::SRV,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        // The port's name exists: another type is NODATA.
        (
            "_http._tcp.web.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            &[SOA],
        ),
        // An empty non-terminal: `_tcp` exists while a named TCP port does.
        (
            "_tcp.web.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            &[SOA],
        ),
        (
            "_sctp.web.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        // No record of that type: NODATA with the SOA.
        (web, RecordType::TXT, ResponseCode::NoError, &[SOA]),
        (web, RecordType::MX, ResponseCode::NoError, &[SOA]),
        // No per-cluster names for a ClusterSetIP service (spec 2.3.4).
        (
            "west.web.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "db-0.west.web.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        // Not imported (yet): NXDOMAIN.
        (
            "api.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "web.other.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        // An import without IPs (its derived Service not made yet): the name exists.
        (
            "noip.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            &[SOA],
        ),
    ];
    for (name, rtype, rcode, lines) in cases {
        let (got_rcode, got) = ask(&z, name, *rtype);
        assert_eq!(
            (got_rcode, got),
            (
                *rcode,
                lines.iter().map(|l| l.to_string()).collect::<Vec<_>>()
            ),
            "{name} {rtype}"
        );
    }
}

/// The upstream MCS conformance suite's SRV specs, on real nodes, caught two identical
/// records: its hello serves port 42 over TCP and over UDP. An RRset holds no
/// duplicates (RFC 2181 5); CoreDNS answers one record.
#[test]
fn an_srv_rrset_holds_no_two_identical_records() {
    let mut z = zone();
    let both = vec![port(Some("tcp"), "tcp", 42), port(Some("udp"), "udp", 42)];
    z.services.insert(
        ("shop".into(), "hello".into()),
        ServiceRecords {
            ips: vec![ip("10.96.0.42")],
            ports: both.clone(),
            ..ServiceRecords::default()
        },
    );
    // Headless, its pod in two slices (one per family): one target, both addresses.
    z.services.insert(
        ("shop".into(), "pair".into()),
        ServiceRecords {
            headless: true,
            ports: both,
            endpoints: vec![
                endpoint("west", "p-0", &["10.1.0.7"]),
                endpoint("west", "p-0", &["fd00::7"]),
                endpoint("east", "p-0", &["10.2.0.7"]),
            ],
            ..ServiceRecords::default()
        },
    );
    let cases: &[(&str, &[&str])] = &[
        (
            "hello.shop.svc.clusterset.local.",
            &[
                "AN hello.shop.svc.clusterset.local. 5 IN SRV 0 100 42 hello.shop.svc.clusterset.local.",
                "AR hello.shop.svc.clusterset.local. 5 IN A 10.96.0.42",
            ],
        ),
        // A named port's own name is one port: unchanged.
        (
            "_udp._udp.hello.shop.svc.clusterset.local.",
            &[
                "AN _udp._udp.hello.shop.svc.clusterset.local. 5 IN SRV 0 100 42 hello.shop.svc.clusterset.local.",
                "AR hello.shop.svc.clusterset.local. 5 IN A 10.96.0.42",
            ],
        ),
        (
            "pair.shop.svc.clusterset.local.",
            &[
                "AN pair.shop.svc.clusterset.local. 5 IN SRV 0 50 42 p-0.west.pair.shop.svc.clusterset.local.",
                "AN pair.shop.svc.clusterset.local. 5 IN SRV 0 50 42 p-0.east.pair.shop.svc.clusterset.local.",
                "AR p-0.west.pair.shop.svc.clusterset.local. 5 IN A 10.1.0.7",
                "AR p-0.west.pair.shop.svc.clusterset.local. 5 IN AAAA fd00::7",
                "AR p-0.east.pair.shop.svc.clusterset.local. 5 IN A 10.2.0.7",
            ],
        ),
    ];
    for (name, lines) in cases {
        let (rcode, got) = ask(&z, name, RecordType::SRV);
        assert_eq!(rcode, ResponseCode::NoError, "{name}");
        assert_eq!(
            got,
            lines.iter().map(|l| l.to_string()).collect::<Vec<_>>(),
            "{name}"
        );
    }
}

#[test]
fn headless_services_answer_their_ready_endpoints_by_cluster() {
    let z = zone();
    let db = "db.shop.svc.clusterset.local.";
    let cases: &[(&str, RecordType, ResponseCode, &[&str])] = &[
        (
            db,
            RecordType::A,
            ResponseCode::NoError,
            &[
                "AN db.shop.svc.clusterset.local. 5 IN A 10.1.0.5",
                "AN db.shop.svc.clusterset.local. 5 IN A 10.1.0.6",
                "AN db.shop.svc.clusterset.local. 5 IN A 10.2.0.5",
            ],
        ),
        (
            db,
            RecordType::AAAA,
            ResponseCode::NoError,
            &["AN db.shop.svc.clusterset.local. 5 IN AAAA fd00::5"],
        ),
        (
            "db-0.west.db.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            &["AN db-0.west.db.shop.svc.clusterset.local. 5 IN A 10.1.0.5"],
        ),
        (
            "db-0.west.db.shop.svc.clusterset.local.",
            RecordType::AAAA,
            ResponseCode::NoError,
            &["AN db-0.west.db.shop.svc.clusterset.local. 5 IN AAAA fd00::5"],
        ),
        (
            "db-0.east.db.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            &["AN db-0.east.db.shop.svc.clusterset.local. 5 IN A 10.2.0.5"],
        ),
        // An endpoint without a hostname is named by its address.
        (
            "10-1-0-6.west.db.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            &["AN 10-1-0-6.west.db.shop.svc.clusterset.local. 5 IN A 10.1.0.6"],
        ),
        // No such endpoint in that cluster: NXDOMAIN; the cluster's own name is an
        // empty non-terminal while it has an endpoint.
        (
            "db-1.west.db.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "db-0.north.db.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "west.db.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            &[SOA],
        ),
        (
            "north.db.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        // An endpoint with only an IPv4 address: AAAA is NODATA.
        (
            "db-0.east.db.shop.svc.clusterset.local.",
            RecordType::AAAA,
            ResponseCode::NoError,
            &[SOA],
        ),
        // SRV: one per ready endpoint and port, the endpoint's name as target (spec 2.4.2).
        (
            "_pg._tcp.db.shop.svc.clusterset.local.",
            RecordType::SRV,
            ResponseCode::NoError,
            &[
                "AN _pg._tcp.db.shop.svc.clusterset.local. 5 IN SRV 0 33 5432 db-0.west.db.shop.svc.clusterset.local.",
                "AN _pg._tcp.db.shop.svc.clusterset.local. 5 IN SRV 0 33 5432 10-1-0-6.west.db.shop.svc.clusterset.local.",
                "AN _pg._tcp.db.shop.svc.clusterset.local. 5 IN SRV 0 33 5432 db-0.east.db.shop.svc.clusterset.local.",
                "AR db-0.west.db.shop.svc.clusterset.local. 5 IN A 10.1.0.5",
                "AR db-0.west.db.shop.svc.clusterset.local. 5 IN AAAA fd00::5",
                "AR 10-1-0-6.west.db.shop.svc.clusterset.local. 5 IN A 10.1.0.6",
                "AR db-0.east.db.shop.svc.clusterset.local. 5 IN A 10.2.0.5",
            ],
        ),
        (
            db,
            RecordType::SRV,
            ResponseCode::NoError,
            &[
                "AN db.shop.svc.clusterset.local. 5 IN SRV 0 33 5432 db-0.west.db.shop.svc.clusterset.local.",
                "AN db.shop.svc.clusterset.local. 5 IN SRV 0 33 5432 10-1-0-6.west.db.shop.svc.clusterset.local.",
                "AN db.shop.svc.clusterset.local. 5 IN SRV 0 33 5432 db-0.east.db.shop.svc.clusterset.local.",
                "AR db-0.west.db.shop.svc.clusterset.local. 5 IN A 10.1.0.5",
                "AR db-0.west.db.shop.svc.clusterset.local. 5 IN AAAA fd00::5",
                "AR 10-1-0-6.west.db.shop.svc.clusterset.local. 5 IN A 10.1.0.6",
                "AR db-0.east.db.shop.svc.clusterset.local. 5 IN A 10.2.0.5",
            ],
        ),
        // No ready endpoint: NXDOMAIN (spec 2.4.1), whatever the type; and so is every
        // name under it (RFC 8020: nothing exists below a name that does not), its
        // named port's too.
        (
            "empty.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "empty.shop.svc.clusterset.local.",
            RecordType::SRV,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "_pg._tcp.empty.shop.svc.clusterset.local.",
            RecordType::SRV,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "_pg._tcp.empty.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "_tcp.empty.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "west.empty.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "db-0.west.empty.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        // With endpoints, the same names exist: the port's name NODATA for A.
        (
            "_pg._tcp.db.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            &[SOA],
        ),
        (
            "_tcp.db.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            &[SOA],
        ),
    ];
    for (name, rtype, rcode, lines) in cases {
        let (got_rcode, got) = ask(&z, name, *rtype);
        assert_eq!(
            (got_rcode, got),
            (
                *rcode,
                lines.iter().map(|l| l.to_string()).collect::<Vec<_>>()
            ),
            "{name} {rtype}"
        );
    }
}

#[test]
fn the_zone_apex_version_namespaces_and_other_zones() {
    let z = zone();
    let cases: &[(&str, RecordType, ResponseCode, &[&str])] = &[
        (
            "clusterset.local.",
            RecordType::SOA,
            ResponseCode::NoError,
            &[
                "AN clusterset.local. 5 IN SOA ns.dns.clusterset.local. hostmaster.clusterset.local. 1 7200 1800 86400 5",
            ],
        ),
        (
            "clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            &[SOA],
        ),
        // The schema version (spec 2.2).
        (
            "dns-version.clusterset.local.",
            RecordType::TXT,
            ResponseCode::NoError,
            &["AN dns-version.clusterset.local. 5 IN TXT 1.0.0"],
        ),
        // Empty non-terminals: `svc`, a namespace with an import.
        (
            "svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            &[SOA],
        ),
        (
            "shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            &[SOA],
        ),
        (
            "other.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "web.shop.pod.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        (
            "a.b.c.web.shop.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NXDomain,
            &[SOA],
        ),
        // Not our zone: REFUSED, no records.
        (
            "web.shop.svc.cluster.local.",
            RecordType::A,
            ResponseCode::Refused,
            &[],
        ),
        ("local.", RecordType::A, ResponseCode::Refused, &[]),
        (".", RecordType::NS, ResponseCode::Refused, &[]),
        ("example.com.", RecordType::A, ResponseCode::Refused, &[]),
    ];
    for (name, rtype, rcode, lines) in cases {
        let (got_rcode, got) = ask(&z, name, *rtype);
        assert_eq!(
            (got_rcode, got),
            (
                *rcode,
                lines.iter().map(|l| l.to_string()).collect::<Vec<_>>()
            ),
            "{name} {rtype}"
        );
    }
    // Before the imports are listed: SERVFAIL (nothing can be said), other zones REFUSED.
    let unlisted = Table {
        listed: false,
        services: BTreeMap::new(),
    };
    assert_eq!(
        ask(&unlisted, "web.shop.svc.clusterset.local.", RecordType::A),
        (ResponseCode::ServFail, vec![])
    );
    assert_eq!(
        ask(&unlisted, "shop.svc.clusterset.local.", RecordType::A),
        (ResponseCode::ServFail, vec![])
    );
    assert_eq!(
        ask(&unlisted, "example.com.", RecordType::A).0,
        ResponseCode::Refused
    );
    // The zone without MCS: SERVFAIL.
    let (out, _, _) = respond(
        &query_bytes("web.shop.svc.clusterset.local.", RecordType::A, None),
        &super::Unserved,
        false,
    )
    .unwrap();
    assert_eq!(
        Message::from_vec(&out).unwrap().metadata.response_code,
        ResponseCode::ServFail
    );
}

/// A headless import of 100 endpoints: its A answer (1,600 bytes) does not fit 512.
fn big_zone() -> Table {
    let endpoints = (0..100)
        .map(|i| endpoint("west", &format!("db-{i}"), &[&format!("10.1.0.{i}")]))
        .collect();
    let mut services = BTreeMap::new();
    services.insert(
        ("shop".into(), "big".into()),
        ServiceRecords {
            headless: true,
            ports: vec![port(Some("pg"), "tcp", 5432)],
            endpoints,
            ..ServiceRecords::default()
        },
    );
    Table {
        listed: true,
        services,
    }
}

#[test]
fn udp_answers_are_cut_to_512_bytes_or_the_edns_size_with_tc_and_tcp_answers_whole() {
    let z = big_zone();
    let name = "big.shop.svc.clusterset.local.";
    let read = |out: &[u8]| Message::from_vec(out).unwrap();
    // UDP without EDNS: at most 512 bytes, TC set, whole records only.
    let (out, _, truncated) = respond(&query_bytes(name, RecordType::A, None), &z, false).unwrap();
    let m = read(&out);
    assert!(out.len() <= 512, "{}", out.len());
    assert!(truncated && m.metadata.truncation);
    assert!(
        !m.answers.is_empty() && m.answers.len() < 100,
        "{}",
        m.answers.len()
    );
    assert!(m.edns.is_none());
    // UDP with EDNS 1232: more, still cut, and our OPT record in the answer.
    let (out, _, truncated) =
        respond(&query_bytes(name, RecordType::A, Some(1232)), &z, false).unwrap();
    let m = read(&out);
    assert!(out.len() <= 1232 && out.len() > 512, "{}", out.len());
    assert!(truncated && m.metadata.truncation);
    assert_eq!(m.edns.as_ref().map(|e| e.max_payload()), Some(1232));
    // EDNS 4096 is held to 1232 (no fragments); 100 is raised to 512.
    let (out, _, _) = respond(&query_bytes(name, RecordType::A, Some(4096)), &z, false).unwrap();
    assert!(out.len() <= 1232);
    let (out, _, _) = respond(&query_bytes(name, RecordType::A, Some(100)), &z, false).unwrap();
    assert!(out.len() <= 512 && out.len() > 400, "{}", out.len());
    // TCP: whole.
    let (out, _, truncated) = respond(&query_bytes(name, RecordType::A, None), &z, true).unwrap();
    let m = read(&out);
    assert!(!truncated && !m.metadata.truncation);
    assert_eq!(m.answers.len(), 100);
    // SRV over UDP: the glue goes first (no TC while the answers fit).
    let z = zone();
    let (out, _, truncated) = respond(
        &query_bytes(
            "_pg._tcp.db.shop.svc.clusterset.local.",
            RecordType::SRV,
            None,
        ),
        &z,
        false,
    )
    .unwrap();
    assert!(!truncated);
    assert_eq!(read(&out).answers.len(), 3);
}

#[test]
fn malformed_queries_are_formerr_or_dropped_and_other_opcodes_notimp() {
    let z = zone();
    // Shorter than a header, or a response: no answer at all.
    assert!(respond(&[0; 5], &z, false).is_none());
    let mut response = query_bytes("web.shop.svc.clusterset.local.", RecordType::A, None);
    response[2] |= 0x80;
    assert!(respond(&response, &z, false).is_none());
    // A question cut short: FORMERR with the id.
    let q = query_bytes("web.shop.svc.clusterset.local.", RecordType::A, None);
    let (out, rcode, _) = respond(&q[..20], &z, false).unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert_eq!(
        (m.metadata.id, m.metadata.response_code),
        (0x4242, ResponseCode::FormErr)
    );
    assert_eq!(rcode.label(), "FORMERR");
    // Two questions: FORMERR.
    let mut two = q.clone();
    two[5] = 2;
    assert_eq!(respond(&two, &z, false).unwrap().1.label(), "FORMERR");
    // A compression loop: FORMERR, not a hang.
    let mut looped = q[..12].to_vec();
    looped.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
    assert_eq!(respond(&looped, &z, false).unwrap().1.label(), "FORMERR");
    // A NOTIFY (opcode 4): NOTIMP.
    let mut m = Message::new(7, MessageType::Query, OpCode::Notify);
    m.add_query(Query::query(
        Name::from_ascii("clusterset.local.").unwrap(),
        RecordType::SOA,
    ));
    let (out, _, _) = respond(&m.to_vec().unwrap(), &z, false).unwrap();
    assert_eq!(
        Message::from_vec(&out).unwrap().metadata.response_code,
        ResponseCode::NotImp
    );
    // Zone transfers: NOTIMP (the zone is the ServiceImports); OPT as the question's
    // type: FORMERR (a pseudo-record); both echo the question.
    for (rtype, rcode) in [
        (RecordType::AXFR, ResponseCode::NotImp),
        (RecordType::IXFR, ResponseCode::NotImp),
        (RecordType::OPT, ResponseCode::FormErr),
    ] {
        let (out, _, _) =
            respond(&query_bytes("clusterset.local.", rtype, None), &z, false).unwrap();
        let m = Message::from_vec(&out).unwrap();
        assert_eq!(m.metadata.response_code, rcode, "{rtype}");
        assert_eq!((m.queries.len(), m.answers.len()), (1, 0), "{rtype}");
    }
    // A FORMERR to a query with an OPT record has ours (RFC 6891 7): two OPT records,
    // or two questions beside one.
    let mut two_opts = query_bytes("web.shop.svc.clusterset.local.", RecordType::A, Some(1232));
    two_opts.extend_from_slice(&[0, 0, 41, 4, 0xd0, 0, 0, 0, 0, 0, 0]);
    two_opts[11] = 2;
    let mut two_questions =
        query_bytes("web.shop.svc.clusterset.local.", RecordType::A, Some(1232));
    let question = two_questions[12..12 + 30 + 1 + 4].to_vec();
    two_questions.splice(12 + question.len()..12 + question.len(), question);
    two_questions[5] = 2;
    for (what, msg) in [
        ("two OPT records", &two_opts),
        ("two questions", &two_questions),
    ] {
        let (out, rcode, _) = respond(msg, &z, false).unwrap();
        assert_eq!(rcode.label(), "FORMERR", "{what}");
        let m = Message::from_vec(&out).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr, "{what}");
        assert_eq!(
            m.edns.as_ref().map(|e| (e.max_payload(), e.version())),
            Some((1232, 0)),
            "{what}: our OPT record"
        );
    }
    // A FORMERR to a query without one has none.
    let (out, _, _) = respond(&q[..20], &z, false).unwrap();
    assert!(Message::from_vec(&out).unwrap().edns.is_none());
    // EDNS version 1: BADVERS (16: the OPT record's upper bits), our OPT of version 0, no
    // answer (RFC 6891 6.1.3).
    let mut m = Message::new(9, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(
        Name::from_ascii("web.shop.svc.clusterset.local.").unwrap(),
        RecordType::A,
    ));
    let mut e = Edns::new();
    e.set_max_payload(1232);
    e.set_version(1);
    m.set_edns(e);
    let (out, rcode, _) = respond(&m.to_vec().unwrap(), &z, false).unwrap();
    assert_eq!(rcode.label(), "BADVERS");
    let m = Message::from_vec(&out).unwrap();
    assert_eq!(u16::from(m.metadata.response_code), 16);
    assert_eq!(out[3] & 0x0f, 0, "the header's four bits of 16");
    assert_eq!(m.edns.as_ref().map(|e| e.version()), Some(0));
    assert_eq!((m.queries.len(), m.answers.len()), (1, 0));
    // A class other than IN: REFUSED.
    let mut m = Message::new(8, MessageType::Query, OpCode::Query);
    let mut query = Query::query(
        Name::from_ascii("web.shop.svc.clusterset.local.").unwrap(),
        RecordType::A,
    );
    query.set_query_class(DNSClass::CH);
    m.add_query(query);
    let (out, _, _) = respond(&m.to_vec().unwrap(), &z, false).unwrap();
    assert_eq!(
        Message::from_vec(&out).unwrap().metadata.response_code,
        ResponseCode::Refused
    );
}

/// `shop/big`: headless, 5,000 endpoints of west (`db-<i>`, one IPv4 address each; the
/// last also has an IPv6 one), two named ports.
fn huge_zone() -> Table {
    let mut endpoints: Vec<Endpoint> = (0..5000)
        .map(|i| {
            endpoint(
                "west",
                &format!("db-{i}"),
                &[&format!("10.1.{}.{}", i / 256, i % 256)],
            )
        })
        .collect();
    endpoints[4999].addresses.push(ip("fd00::4999"));
    let mut services = BTreeMap::new();
    services.insert(
        ("shop".into(), "big".into()),
        ServiceRecords {
            headless: true,
            ports: vec![
                port(Some("pg"), "tcp", 5432),
                port(Some("metrics"), "tcp", 9187),
            ],
            endpoints,
            ..ServiceRecords::default()
        },
    );
    Table {
        listed: true,
        services,
    }
}

#[test]
fn a_headless_service_of_5000_endpoints_is_answered_within_the_size_limit() {
    let z = huge_zone();
    let name = "big.shop.svc.clusterset.local.";
    for (transport, edns, limit) in [
        ("udp", None, 512),
        ("udp", Some(1232), 1232),
        ("tcp", None, 65_535),
    ] {
        let tcp = transport == "tcp";
        for rtype in [RecordType::A, RecordType::SRV, RecordType::ANY] {
            let msg = query_bytes(name, rtype, edns);
            // No more records are built than could fit (one over), not 10,000 SRV.
            let q = super::wire::read_query(&msg).unwrap();
            let built = super::answer::answer(&q, &z, limit);
            assert!(
                built.answers.len() <= limit / 16 + 1 && built.additional.len() <= limit / 16 + 1,
                "{transport} {rtype}: {} answers, {} additional built",
                built.answers.len(),
                built.additional.len()
            );
            let (out, rcode, truncated) = respond(&msg, &z, tcp).unwrap();
            assert!(
                out.len() <= limit,
                "{transport} {rtype}: {} bytes",
                out.len()
            );
            let m = Message::from_vec(&out)
                .unwrap_or_else(|e| panic!("{transport} {rtype}: not well-formed: {e}"));
            assert_eq!(rcode.label(), "NOERROR");
            assert!(
                truncated && m.metadata.truncation,
                "{transport} {rtype}: TC"
            );
            assert!(
                !m.answers.is_empty() && m.answers.len() < 5000,
                "{transport} {rtype}: {}",
                m.answers.len()
            );
            assert!(
                m.answers.iter().all(|r| r.record_type() == rtype
                    || (rtype == RecordType::ANY && r.record_type() == RecordType::A)),
                "{transport} {rtype}: answers of the type asked"
            );
            // Cut with TC: no authority, no glue (the client asks again).
            assert!(m.authorities.is_empty() && m.additionals.is_empty());
            eprintln!(
                "{transport} {rtype}: {} bytes, {} answers of 5000 endpoints",
                out.len(),
                m.answers.len()
            );
        }
    }
    // The one IPv6 address, behind 4,999 IPv4 ones: the type is picked before the cut.
    assert_eq!(
        ask(&z, name, RecordType::AAAA),
        (
            ResponseCode::NoError,
            vec!["AN big.shop.svc.clusterset.local. 5 IN AAAA fd00::4999".to_string()]
        )
    );
    // The last endpoint's own name.
    assert_eq!(
        ask(
            &z,
            "db-4999.west.big.shop.svc.clusterset.local.",
            RecordType::A
        ),
        (
            ResponseCode::NoError,
            vec!["AN db-4999.west.big.shop.svc.clusterset.local. 5 IN A 10.1.19.135".to_string()]
        )
    );
    // A type the name has none of: NODATA, not cut.
    assert_eq!(
        ask(&z, name, RecordType::TXT),
        (ResponseCode::NoError, vec![SOA.to_string()])
    );
}
