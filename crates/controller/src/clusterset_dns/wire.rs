//! The DNS wire format (RFC 1035, EDNS(0) of RFC 6891), as much of it as an
//! authoritative server of one zone needs: a query read (header, one question, an OPT
//! record) and a response written, cut to the size the client can take. Pure: bytes in,
//! bytes out; every read is bounded by the message it reads.

use std::net::{Ipv4Addr, Ipv6Addr};

/// Record types this server reads or writes.
pub(crate) mod rtype {
    /// An IPv4 address.
    pub(crate) const A: u16 = 1;
    /// The zone's start of authority.
    pub(crate) const SOA: u16 = 6;
    /// Text.
    pub(crate) const TXT: u16 = 16;
    /// An IPv6 address.
    pub(crate) const AAAA: u16 = 28;
    /// A service location (RFC 2782).
    pub(crate) const SRV: u16 = 33;
    /// The EDNS(0) pseudo-record (never a question's type: FORMERR).
    pub(crate) const OPT: u16 = 41;
    /// An incremental zone transfer (not served: NOTIMP).
    pub(crate) const IXFR: u16 = 251;
    /// A zone transfer (not served: NOTIMP).
    pub(crate) const AXFR: u16 = 252;
    /// Every type.
    pub(crate) const ANY: u16 = 255;
}

/// The Internet class.
pub(crate) const CLASS_IN: u16 = 1;
/// The largest UDP response to a client that sent no EDNS record (RFC 1035).
pub(crate) const UDP_PLAIN_MAX: usize = 512;
/// The UDP payload size this server advertises and the most it sends over UDP, whatever
/// a client advertises (the DNS flag day 2020 value: no IP fragmentation).
pub(crate) const UDP_EDNS_MAX: u16 = 1232;
/// The largest message over TCP (its two-byte length prefix).
pub(crate) const TCP_MAX: usize = 65_535;
/// The size of the fixed header.
const HEADER: usize = 12;
/// A name is at most 255 octets on the wire (RFC 1035 3.1).
const NAME_MAX: usize = 255;
/// Compression pointers followed in one name, at most.
const POINTER_HOPS: usize = 16;

/// Response codes (the low four bits; BADVERS needs the OPT record's extended bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rcode {
    /// No error (with or without answers).
    NoError,
    /// The query could not be read.
    FormErr,
    /// The server cannot answer now (the imports are not listed yet).
    ServFail,
    /// The name does not exist.
    NxDomain,
    /// An opcode other than QUERY.
    NotImp,
    /// Not this server's zone.
    Refused,
    /// An EDNS version other than 0 (RFC 6891 6.1.3).
    BadVers,
}

impl Rcode {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Rcode::NoError => "NOERROR",
            Rcode::FormErr => "FORMERR",
            Rcode::ServFail => "SERVFAIL",
            Rcode::NxDomain => "NXDOMAIN",
            Rcode::NotImp => "NOTIMP",
            Rcode::Refused => "REFUSED",
            Rcode::BadVers => "BADVERS",
        }
    }

    /// (the header's four bits, the OPT record's upper eight bits).
    fn code(self) -> (u8, u8) {
        match self {
            Rcode::NoError => (0, 0),
            Rcode::FormErr => (1, 0),
            Rcode::ServFail => (2, 0),
            Rcode::NxDomain => (3, 0),
            Rcode::NotImp => (4, 0),
            Rcode::Refused => (5, 0),
            // 16 = 1 << 4.
            Rcode::BadVers => (0, 1),
        }
    }
}

/// The EDNS(0) record of a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Edns {
    /// The UDP payload size the client takes.
    pub(crate) payload: u16,
    /// The EDNS version.
    pub(crate) version: u8,
}

/// A query as read: its header fields and its one question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Query {
    /// The id, echoed.
    pub(crate) id: u16,
    /// The opcode (0: QUERY).
    pub(crate) opcode: u8,
    /// Recursion desired, echoed.
    pub(crate) rd: bool,
    /// The question's labels as sent (case kept), root excluded.
    pub(crate) labels: Vec<Vec<u8>>,
    /// The question's type.
    pub(crate) qtype: u16,
    /// The question's class.
    pub(crate) qclass: u16,
    /// The EDNS(0) record, if the query had one.
    pub(crate) edns: Option<Edns>,
}

/// Why a message gets no answer, or a FORMERR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// Not even a header, or a response: dropped, never answered.
    Drop,
    /// A header, but the rest cannot be read: FORMERR with its id.
    FormErr {
        /// The query's id.
        id: u16,
        /// Its opcode.
        opcode: u8,
        /// Its RD bit.
        rd: bool,
        /// Whether an OPT record was read before the error (the FORMERR then has one,
        /// RFC 6891 7).
        edns: bool,
    },
}

/// Reads a query.
pub(crate) fn read_query(msg: &[u8]) -> Result<Query, ReadError> {
    if msg.len() < HEADER {
        return Err(ReadError::Drop);
    }
    let id = u16::from_be_bytes([msg[0], msg[1]]);
    if msg[2] & 0x80 != 0 {
        // A response: answering it could loop two servers.
        return Err(ReadError::Drop);
    }
    let opcode = (msg[2] >> 3) & 0x0f;
    let rd = msg[2] & 0x01 != 0;
    let mut edns = None;
    let formerr = |edns: &Option<Edns>| ReadError::FormErr {
        id,
        opcode,
        rd,
        edns: edns.is_some(),
    };
    let count = |i: usize| u16::from_be_bytes([msg[i], msg[i + 1]]) as usize;
    let (qd, an, ns, ar) = (count(4), count(6), count(8), count(10));
    // Every question is read (one is answered; another count is a FORMERR once the OPT
    // record, if any, is found, so that the FORMERR carries one).
    let mut pos = HEADER;
    let mut question = None;
    for _ in 0..qd {
        let labels = read_name(msg, &mut pos).ok_or(formerr(&edns))?;
        let qtype = read_u16(msg, &mut pos).ok_or(formerr(&edns))?;
        let qclass = read_u16(msg, &mut pos).ok_or(formerr(&edns))?;
        question.get_or_insert((labels, qtype, qclass));
    }
    // Answer and authority records of a query are skipped; the additional section may
    // hold the OPT record.
    for i in 0..an + ns + ar {
        read_name(msg, &mut pos).ok_or(formerr(&edns))?;
        let rr_type = read_u16(msg, &mut pos).ok_or(formerr(&edns))?;
        let class = read_u16(msg, &mut pos).ok_or(formerr(&edns))?;
        let ttl = msg.get(pos..pos + 4).ok_or(formerr(&edns))?;
        let version = ttl[1];
        pos += 4;
        let len = read_u16(msg, &mut pos).ok_or(formerr(&edns))? as usize;
        if msg.len() < pos + len {
            return Err(formerr(&edns));
        }
        pos += len;
        if i >= an + ns && rr_type == rtype::OPT {
            if edns.is_some() {
                // Two OPT records: FORMERR (RFC 6891 6.1.1), with ours.
                return Err(formerr(&edns));
            }
            edns = Some(Edns {
                payload: class,
                version,
            });
        }
    }
    let Some((labels, qtype, qclass)) = question.filter(|_| qd == 1) else {
        return Err(formerr(&edns));
    };
    Ok(Query {
        id,
        opcode,
        rd,
        labels,
        qtype,
        qclass,
        edns,
    })
}

fn read_u16(msg: &[u8], pos: &mut usize) -> Option<u16> {
    let b = msg.get(*pos..*pos + 2)?;
    *pos += 2;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

/// Reads a name at `pos` (compression pointers followed, at most [`POINTER_HOPS`], and
/// at most [`NAME_MAX`] octets), leaving `pos` after it.
fn read_name(msg: &[u8], pos: &mut usize) -> Option<Vec<Vec<u8>>> {
    let mut labels = Vec::new();
    let mut at = *pos;
    let mut jumped = false;
    let mut hops = 0;
    let mut octets = 1;
    loop {
        let len = *msg.get(at)? as usize;
        match len & 0xc0 {
            0x00 => {
                if len == 0 {
                    if !jumped {
                        *pos = at + 1;
                    }
                    return Some(labels);
                }
                octets += len + 1;
                if octets > NAME_MAX {
                    return None;
                }
                labels.push(msg.get(at + 1..at + 1 + len)?.to_vec());
                at += 1 + len;
            }
            0xc0 => {
                hops += 1;
                if hops > POINTER_HOPS {
                    return None;
                }
                let target = ((len & 0x3f) << 8) | *msg.get(at + 1)? as usize;
                if !jumped {
                    *pos = at + 2;
                    jumped = true;
                }
                at = target;
            }
            // Extended and binary labels: not DNS as used today.
            _ => return None,
        }
    }
}

/// The data of one resource record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RData {
    /// An IPv4 address.
    A(Ipv4Addr),
    /// An IPv6 address.
    Aaaa(Ipv6Addr),
    /// A service location (the target is never compressed: RFC 2782).
    Srv {
        /// Priority.
        priority: u16,
        /// Weight.
        weight: u16,
        /// Port.
        port: u16,
        /// Target name (labels, root excluded).
        target: Vec<String>,
    },
    /// One text string.
    Txt(String),
    /// The zone's SOA.
    Soa {
        /// Primary name server.
        mname: Vec<String>,
        /// The mailbox, as a name.
        rname: Vec<String>,
        /// Serial.
        serial: u32,
        /// Refresh, retry, expire, minimum (the negative-answer TTL).
        times: [u32; 4],
    },
}

impl RData {
    /// Its type.
    pub(crate) fn rtype(&self) -> u16 {
        match self {
            RData::A(_) => rtype::A,
            RData::Aaaa(_) => rtype::AAAA,
            RData::Srv { .. } => rtype::SRV,
            RData::Txt(_) => rtype::TXT,
            RData::Soa { .. } => rtype::SOA,
        }
    }
}

/// The owner of a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The question's name, as asked (written as a pointer to it).
    Question,
    /// Another name (labels, root excluded).
    Name(Vec<String>),
}

/// One resource record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// Its owner name.
    pub(crate) owner: Owner,
    /// Its TTL in seconds.
    pub(crate) ttl: u32,
    /// Its data.
    pub(crate) data: RData,
}

/// A response before it is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Response {
    /// The code.
    pub(crate) rcode: Rcode,
    /// Whether the server is authoritative for the name (the zone's names).
    pub(crate) authoritative: bool,
    /// The answer section.
    pub(crate) answers: Vec<Record>,
    /// The authority section (the SOA of a negative answer).
    pub(crate) authority: Vec<Record>,
    /// The additional section (the addresses of SRV targets), dropped first when the
    /// response does not fit.
    pub(crate) additional: Vec<Record>,
}

impl Response {
    /// A response with `rcode` and no records.
    pub(crate) fn empty(rcode: Rcode) -> Self {
        Self {
            rcode,
            authoritative: false,
            answers: Vec::new(),
            authority: Vec::new(),
            additional: Vec::new(),
        }
    }
}

/// What of a query its response echoes.
#[derive(Clone, Debug)]
pub(crate) struct Echo<'a> {
    /// The id.
    pub(crate) id: u16,
    /// The opcode.
    pub(crate) opcode: u8,
    /// The RD bit.
    pub(crate) rd: bool,
    /// The question (labels, type, class); `None`: a FORMERR without one.
    pub(crate) question: Option<(&'a [Vec<u8>], u16, u16)>,
    /// Whether the query had an OPT record (the response gets one).
    pub(crate) edns: bool,
}

impl<'a> Echo<'a> {
    /// What `q`'s response echoes.
    pub(crate) fn of(q: &'a Query) -> Self {
        Self {
            id: q.id,
            opcode: q.opcode,
            rd: q.rd,
            question: Some((&q.labels, q.qtype, q.qclass)),
            edns: q.edns.is_some(),
        }
    }
}

/// The most a response to `query` may take: over TCP the 64 KiB of its length prefix;
/// over UDP 512 without EDNS, else what the client advertises (at least 512) up to
/// [`UDP_EDNS_MAX`].
pub(crate) fn size_limit(edns: Option<Edns>, tcp: bool) -> usize {
    match (tcp, edns) {
        (true, _) => TCP_MAX,
        (false, None) => UDP_PLAIN_MAX,
        (false, Some(e)) => (e.payload as usize).clamp(UDP_PLAIN_MAX, UDP_EDNS_MAX as usize),
    }
}

/// Writes `resp` in at most `limit` bytes, each record encoded only while it fits:
/// the answers, the authority and the additional records in turn; an additional record
/// that does not fit ends the additional section (optional data: no TC; the rest of its
/// RRset goes too, never half an RRset); an answer or authority record that does not
/// fit ends the message with TC set (whole records only; a client then asks again over
/// TCP). The work is bounded by `limit`, whatever the number of records.
pub(crate) fn write_response(echo: &Echo<'_>, resp: &Response, limit: usize) -> Vec<u8> {
    let mut out = write_head(echo);
    let opt = echo.edns.then(|| write_opt(resp.rcode));
    // The OPT record always goes in (it says the client's size was read).
    let room = limit.saturating_sub(opt.as_ref().map_or(0, Vec::len));
    let mut tc = false;
    let mut counts = [0usize; 3];
    for (section, records) in [&resp.answers, &resp.authority].into_iter().enumerate() {
        for r in records {
            if !write_record_within(&mut out, r, room) {
                tc = true;
                break;
            }
            counts[section] += 1;
        }
        if tc {
            break;
        }
    }
    if !tc {
        let mut rrset_start = (out.len(), 0);
        for (i, r) in resp.additional.iter().enumerate() {
            if i == 0 || !same_rrset(&resp.additional[i - 1], r) {
                rrset_start = (out.len(), i);
            }
            if !write_record_within(&mut out, r, room) {
                // Not half an RRset.
                out.truncate(rrset_start.0);
                counts[2] = rrset_start.1;
                break;
            }
            counts[2] = i + 1;
        }
    }
    let (rcode, _) = resp.rcode.code();
    out[2] |= if resp.authoritative { 0x04 } else { 0 } | if tc { 0x02 } else { 0 };
    out[3] = rcode;
    out[6..8].copy_from_slice(&(counts[0] as u16).to_be_bytes());
    out[8..10].copy_from_slice(&(counts[1] as u16).to_be_bytes());
    out[10..12].copy_from_slice(&((counts[2] + usize::from(opt.is_some())) as u16).to_be_bytes());
    if let Some(opt) = opt {
        out.extend_from_slice(&opt);
    }
    out
}

fn same_rrset(a: &Record, b: &Record) -> bool {
    a.owner == b.owner && a.data.rtype() == b.data.rtype()
}

/// Appends `r` to `out` if `out` stays within `room` bytes; else leaves `out` as it
/// was and returns false.
fn write_record_within(out: &mut Vec<u8>, r: &Record, room: usize) -> bool {
    let before = out.len();
    if before + record_len(r) > room {
        return false;
    }
    write_record(out, r);
    debug_assert_eq!(out.len() - before, record_len(r));
    true
}

/// The size of `r` on the wire (as [`write_record`] writes it), computed without
/// writing it.
pub(crate) fn record_len(r: &Record) -> usize {
    let name_len = |labels: &[String]| labels.iter().map(|l| l.len() + 1).sum::<usize>() + 1;
    let owner = match &r.owner {
        Owner::Question => 2,
        Owner::Name(labels) => name_len(labels),
    };
    let data = match &r.data {
        RData::A(_) => 4,
        RData::Aaaa(_) => 16,
        RData::Srv { target, .. } => 6 + name_len(target),
        RData::Txt(s) => 1 + s.len().min(255),
        RData::Soa { mname, rname, .. } => name_len(mname) + name_len(rname) + 20,
    };
    owner + 10 + data
}

/// The header (counts of the answer sections zero) and the question.
fn write_head(echo: &Echo<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&echo.id.to_be_bytes());
    out.push(0x80 | (echo.opcode & 0x0f) << 3 | u8::from(echo.rd));
    out.push(0);
    out.extend_from_slice(&(u16::from(echo.question.is_some())).to_be_bytes());
    out.extend_from_slice(&[0; 6]);
    if let Some((labels, qtype, qclass)) = echo.question {
        for l in labels {
            out.push(l.len() as u8);
            out.extend_from_slice(l);
        }
        out.push(0);
        out.extend_from_slice(&qtype.to_be_bytes());
        out.extend_from_slice(&qclass.to_be_bytes());
    }
    out
}

/// Our OPT record: the root owner, our payload size, the extended rcode bits, version 0.
fn write_opt(rcode: Rcode) -> Vec<u8> {
    let (_, ext) = rcode.code();
    let mut out = vec![0];
    out.extend_from_slice(&rtype::OPT.to_be_bytes());
    out.extend_from_slice(&UDP_EDNS_MAX.to_be_bytes());
    out.extend_from_slice(&[ext, 0, 0, 0]);
    out.extend_from_slice(&0u16.to_be_bytes());
    out
}

fn write_name(out: &mut Vec<u8>, labels: &[String]) {
    for l in labels {
        out.push(l.len() as u8);
        out.extend_from_slice(l.as_bytes());
    }
    out.push(0);
}

fn write_record(out: &mut Vec<u8>, r: &Record) {
    match &r.owner {
        // The question's name sits right after the header.
        Owner::Question => out.extend_from_slice(&[0xc0, HEADER as u8]),
        Owner::Name(labels) => write_name(out, labels),
    }
    out.extend_from_slice(&r.data.rtype().to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out.extend_from_slice(&r.ttl.to_be_bytes());
    let mut data = Vec::new();
    match &r.data {
        RData::A(ip) => data.extend_from_slice(&ip.octets()),
        RData::Aaaa(ip) => data.extend_from_slice(&ip.octets()),
        RData::Srv {
            priority,
            weight,
            port,
            target,
        } => {
            data.extend_from_slice(&priority.to_be_bytes());
            data.extend_from_slice(&weight.to_be_bytes());
            data.extend_from_slice(&port.to_be_bytes());
            write_name(&mut data, target);
        }
        RData::Txt(s) => {
            // One string of at most 255 octets (ours are short).
            let b = &s.as_bytes()[..s.len().min(255)];
            data.push(b.len() as u8);
            data.extend_from_slice(b);
        }
        RData::Soa {
            mname,
            rname,
            serial,
            times,
        } => {
            write_name(&mut data, mname);
            write_name(&mut data, rname);
            data.extend_from_slice(&serial.to_be_bytes());
            for t in times {
                data.extend_from_slice(&t.to_be_bytes());
            }
        }
    }
    out.extend_from_slice(&(data.len() as u16).to_be_bytes());
    out.extend_from_slice(&data);
}
