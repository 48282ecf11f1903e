//! Which gateway addresses a link may point local mirrors (and the controller's
//! probes) at.
//!
//! A remote cluster is not trusted: it chooses its gateway's ingress addresses (and the
//! DNS answers of its hostnames), so without a policy it could point local clients at
//! local things (the node, the cloud metadata address, local ClusterIPs and pods). The
//! policy is checked in this order:
//!
//! 1. the operator's deny CIDRs (`--gateway-address-deny`): refused, whatever the
//!    allow list says;
//! 2. addresses the apiserver refuses in Endpoints (unspecified, loopback, link-local
//!    including the metadata address 169.254.169.254, multicast): always refused;
//! 3. the operator's allow CIDRs (`--gateway-address-allow`): accepted. An operator who
//!    allows a local CIDR means it (a gateway reached through a local Service or a pod
//!    of a flat network), so an allow lifts the discovered local CIDRs too;
//! 4. the other built-in denials (`fd00:ec2::254`, the IPv6 metadata address): refused;
//! 5. the local cluster's own networks, discovered at run time with no flag
//!    ([`LocalCidrs`]: its service CIDRs and the `kubernetes` Service's ClusterIPs, its
//!    Nodes' pod CIDRs): refused, so that a remote cannot aim local clients at the
//!    local apiserver, a local Service or a local pod;
//! 6. anything else: accepted.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IPv4 or IPv6 CIDR block (`10.0.0.0/8`, `fd00::/8`; a bare address is a /32 or
/// /128). Host bits are cleared when parsed, so `10.1.2.3/8` is `10.0.0.0/8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

/// Why a CIDR does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {input:?}: {why}")]
pub struct CidrError {
    /// The text given.
    pub input: String,
    /// What is wrong with it.
    pub why: &'static str,
}

fn bits(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
        IpAddr::V6(v6) => (u128::from(v6), 128),
    }
}

/// The network mask of `prefix` bits in an address of `width` bits (32 or 128).
fn mask(prefix: u8, width: u8) -> u128 {
    let all = u128::MAX >> (128 - u32::from(width));
    all & !all.checked_shr(u32::from(prefix)).unwrap_or(0)
}

impl Cidr {
    /// The block of `prefix` leading bits of `ip` (None when `prefix` is too long).
    /// An IPv4-mapped IPv6 block of /96 or longer (`::ffff:10.0.0.0/104`) is its IPv4
    /// block (`10.0.0.0/8`): addresses are compared as IPv4 (`contains` maps them), so
    /// kept as IPv6 it would hold nothing. A shorter one spans more than the mapped
    /// range and stays IPv6.
    pub fn new(ip: IpAddr, prefix: u8) -> Option<Self> {
        if let IpAddr::V6(v6) = ip
            && let (Some(v4), true) = (v6.to_ipv4_mapped(), prefix >= 96)
        {
            return Self::new(IpAddr::V4(v4), prefix - 96);
        }
        let (value, width) = bits(ip);
        if prefix > width {
            return None;
        }
        let network = value & mask(prefix, width);
        let network = match ip {
            IpAddr::V4(_) => IpAddr::V4((network as u32).into()),
            IpAddr::V6(_) => IpAddr::V6(network.into()),
        };
        Some(Self { network, prefix })
    }

    /// Whether `ip` is in the block. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is
    /// its IPv4 address; an IPv4 block never holds an IPv6 address, nor the reverse.
    pub fn contains(&self, ip: &IpAddr) -> bool {
        let ip = ip.to_canonical();
        let (value, width) = bits(ip);
        let (network, net_width) = bits(self.network);
        width == net_width && value & mask(self.prefix, width) == network
    }

    /// Parses a CIDR as Kubernetes' legacy parser does (k8s.io/utils/net
    /// `ParseCIDRSloppy`, Go's parser before 1.17): an IPv4 octet may carry leading
    /// zeros, read as decimal (`010.244.0.0/24` is `10.244.0.0/24`, not octal), as
    /// objects written before the apiserver validated strictly may hold. For what the
    /// cluster stores; the flags stay strict.
    pub fn parse_sloppy(s: &str) -> Result<Self, CidrError> {
        let strict = s.parse::<Self>();
        let Err(e) = strict else { return strict };
        let (addr, rest) = s.split_at(s.find('/').unwrap_or(s.len()));
        match sloppy_ipv4(addr) {
            Some(v4) => format!("{v4}{rest}").parse().map_err(|_| e),
            None => Err(e),
        }
    }

    /// Parses a comma-separated list of CIDRs (blank entries are skipped).
    pub fn parse_list(list: &str) -> Result<Vec<Self>, CidrError> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect()
    }
}

/// An IPv4 address whose octets may carry leading zeros, read as decimal (Kubernetes'
/// `ParseIPSloppy`); None for anything else (IPv6 needs no such reading).
pub fn sloppy_ipv4(s: &str) -> Option<std::net::Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        let p = parts.next()?;
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = p.trim_start_matches('0');
        *o = match digits.is_empty() {
            true => 0,
            false if digits.len() > 3 => return None,
            false => digits.parse().ok()?,
        };
    }
    parts.next().is_none().then(|| octets.into())
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| CidrError {
            input: s.to_owned(),
            why,
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let ip: IpAddr = addr.parse().map_err(|_| err("not an IP address"))?;
        let width = bits(ip).1;
        let prefix = match prefix {
            None => width,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() <= 3 => {
                p.parse().map_err(|_| err("bad prefix length"))?
            }
            Some(_) => return Err(err("bad prefix length")),
        };
        Self::new(ip, prefix).ok_or_else(|| err("prefix length too long for the address family"))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// Which rule refused an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RefusedBy {
    /// A deny CIDR the operator configured (`--gateway-address-deny`).
    Configured,
    /// A built-in denial.
    Default,
    /// A service CIDR of the local cluster (a ServiceCIDR, or the `kubernetes`
    /// Service's ClusterIP).
    LocalService,
    /// A pod CIDR of the local cluster (a Node's `spec.podCIDRs`).
    LocalPod,
}

impl RefusedBy {
    /// A bounded label for metrics: `configured_deny`, `default_deny`,
    /// `local_service_cidr` or `local_pod_cidr`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Configured => "configured_deny",
            Self::Default => "default_deny",
            Self::LocalService => "local_service_cidr",
            Self::LocalPod => "local_pod_cidr",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Configured => "denied CIDR",
            Self::Default => "the built-in denied CIDR",
            Self::LocalService => "the local service CIDR",
            Self::LocalPod => "the local pod CIDR",
        }
    }
}

/// The local cluster's own networks, discovered at run time (never from a flag): a
/// separate input to [`AddressPolicy::allows_in`], since they change while the process
/// runs and the flags do not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalCidrs {
    /// The service CIDRs: every ServiceCIDR's `spec.cidrs`, and the `kubernetes`
    /// Service's ClusterIPs (as /32 or /128) whether or not ServiceCIDRs can be read.
    pub service: Vec<Cidr>,
    /// The pod CIDRs: every Node's `spec.podCIDRs`.
    pub pod: Vec<Cidr>,
}

impl LocalCidrs {
    /// Sorted and without duplicates, so equal sets compare equal.
    pub fn normalized(mut self) -> Self {
        self.service.sort();
        self.service.dedup();
        self.pod.sort();
        self.pod.dedup();
        self
    }
}

/// An address the policy refuses, and the CIDR that refused it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, thiserror::Error)]
#[error("{ip} is in {} {cidr}", .by.describe())]
pub struct Refused {
    /// The refused address.
    pub ip: IpAddr,
    /// The CIDR it is in.
    pub cidr: Cidr,
    /// Whose rule that CIDR is.
    pub by: RefusedBy,
}

/// Built-in denials that an allow CIDR cannot lift: what the apiserver refuses as an
/// Endpoints address (see [`crate::endpoint_ip_allowed`]).
const ALWAYS_DENIED: &[&str] = &[
    "0.0.0.0/32",
    "::/128",
    "127.0.0.0/8",
    "::1/128",
    "169.254.0.0/16",
    "fe80::/10",
    "224.0.0.0/4",
    "ff00::/8",
];

/// Built-in denials that an allow CIDR lifts.
const DEFAULT_DENIED: &[&str] = &["fd00:ec2::254/128"];

fn builtin(list: &'static [&'static str]) -> impl Iterator<Item = Cidr> {
    list.iter().map(|c| c.parse().expect("built-in CIDR"))
}

/// The gateway address policy of the process: the operator's deny and allow CIDRs on
/// top of the built-in denials (see the module documentation for the order).
/// `AddressPolicy::default()` is the built-in denials alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// Refused whatever else is configured: the local service and pod CIDRs.
    pub deny: Vec<Cidr>,
    /// Accepted although a built-in denial would refuse them (never the addresses the
    /// apiserver refuses in Endpoints, nor the `deny` CIDRs).
    pub allow: Vec<Cidr>,
}

impl AddressPolicy {
    /// Whether a gateway may have address `ip`, the local networks aside (see
    /// [`AddressPolicy::allows_in`]); the refusal names the CIDR.
    pub fn allows(&self, ip: &IpAddr) -> Result<(), Refused> {
        self.allows_in(ip, &LocalCidrs::default())
    }

    /// Whether a gateway may have address `ip` in a cluster whose own networks are
    /// `local`; the refusal names the CIDR and its rule.
    pub fn allows_in(&self, ip: &IpAddr, local: &LocalCidrs) -> Result<(), Refused> {
        let ip = ip.to_canonical();
        let refused = |cidr, by| Refused { ip, cidr, by };
        if let Some(c) = self.deny.iter().find(|c| c.contains(&ip)) {
            return Err(refused(*c, RefusedBy::Configured));
        }
        if let Some(c) = builtin(ALWAYS_DENIED).find(|c| c.contains(&ip)) {
            return Err(refused(c, RefusedBy::Default));
        }
        if self.allow.iter().any(|c| c.contains(&ip)) {
            return Ok(());
        }
        if let Some(c) = builtin(DEFAULT_DENIED).find(|c| c.contains(&ip)) {
            return Err(refused(c, RefusedBy::Default));
        }
        if let Some(c) = local.service.iter().find(|c| c.contains(&ip)) {
            return Err(refused(*c, RefusedBy::LocalService));
        }
        match local.pod.iter().find(|c| c.contains(&ip)) {
            Some(c) => Err(refused(*c, RefusedBy::LocalPod)),
            None => Ok(()),
        }
    }

    /// Splits `ips` into the accepted ones and the refusals, in order, the local
    /// networks aside.
    pub fn partition(&self, ips: impl IntoIterator<Item = IpAddr>) -> (Vec<IpAddr>, Vec<Refused>) {
        self.partition_in(ips, &LocalCidrs::default())
    }

    /// Splits `ips` into the accepted ones and the refusals, in order, in a cluster
    /// whose own networks are `local`.
    pub fn partition_in(
        &self,
        ips: impl IntoIterator<Item = IpAddr>,
        local: &LocalCidrs,
    ) -> (Vec<IpAddr>, Vec<Refused>) {
        let mut ok = Vec::new();
        let mut refused = Vec::new();
        for ip in ips {
            match self.allows_in(&ip, local) {
                Ok(()) => ok.push(ip.to_canonical()),
                Err(r) => refused.push(r),
            }
        }
        (ok, refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint_ip_allowed;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn cidrs(list: &str) -> Vec<Cidr> {
        Cidr::parse_list(list).unwrap()
    }

    #[test]
    fn cidrs_parse_and_print_canonically() {
        let table = [
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.1.2.3/8", "10.0.0.0/8"),
            ("192.0.2.1", "192.0.2.1/32"),
            ("0.0.0.0/0", "0.0.0.0/0"),
            ("198.18.0.0/15", "198.18.0.0/15"),
            ("198.19.255.255/15", "198.18.0.0/15"),
            ("fd00:ec2::254", "fd00:ec2::254/128"),
            ("fe80::1/10", "fe80::/10"),
            ("::/0", "::/0"),
            ("2001:db8::/32", "2001:db8::/32"),
            ("10.0.0.0/32", "10.0.0.0/32"),
            ("::1/128", "::1/128"),
            // IPv4-mapped blocks of /96 or longer are their IPv4 blocks.
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("::ffff:192.0.2.1", "192.0.2.1/32"),
            ("::ffff:10.1.2.3/96", "0.0.0.0/0"),
            ("::ffff:0.0.0.0/95", "::fffe:0:0/95"),
        ];
        for (input, want) in table {
            assert_eq!(cidr(input).to_string(), want, "{input}");
        }
        // A mapped block holds IPv4 addresses (and their mapped forms).
        let mapped = cidr("::ffff:10.0.0.0/104");
        for ip in ["10.9.8.7", "::ffff:10.9.8.7"] {
            assert!(mapped.contains(&ip.parse().unwrap()), "{ip}");
        }
        assert!(!mapped.contains(&"11.0.0.1".parse().unwrap()));
    }

    #[test]
    fn the_sloppy_parser_reads_leading_zeros_as_decimal_as_kubernetes_legacy_one_does() {
        let table: [(&str, Option<&str>); 9] = [
            ("010.244.0.0/24", Some("10.244.0.0/24")),
            ("10.244.000.0/24", Some("10.244.0.0/24")),
            ("0010.0.0.08/32", Some("10.0.0.8/32")),
            ("10.96.0.0/12", Some("10.96.0.0/12")),
            ("fd00::/64", Some("fd00::/64")),
            ("256.0.0.0/8", None),
            ("0256.0.0.0/8", None),
            ("10.0.0/8", None),
            ("10.0.0.0.0/8", None),
        ];
        for (input, want) in table {
            let got = Cidr::parse_sloppy(input).map(|c| c.to_string()).ok();
            assert_eq!(got.as_deref(), want, "{input}");
        }
        // The flags stay strict.
        assert!("010.244.0.0/24".parse::<Cidr>().is_err());
        let err = Cidr::parse_sloppy("x/8").unwrap_err();
        assert!(err.to_string().contains("\"x/8\""), "{err}");
    }

    #[test]
    fn invalid_cidrs_are_refused_with_the_input_named() {
        let table = [
            ("", "not an IP address"),
            (
                "10.0.0.0/33",
                "prefix length too long for the address family",
            ),
            ("::/129", "prefix length too long for the address family"),
            ("10.0.0/8", "not an IP address"),
            ("10.0.0.0/", "bad prefix length"),
            ("10.0.0.0/-1", "bad prefix length"),
            ("10.0.0.0/+8", "bad prefix length"),
            ("10.0.0.0/8/8", "bad prefix length"),
            ("10.0.0.0/0008", "bad prefix length"),
            ("10.0.0.0/256", "bad prefix length"),
            ("example.com/8", "not an IP address"),
            (" 10.0.0.0/8", "not an IP address"),
        ];
        for (input, why) in table {
            let err = input.parse::<Cidr>().unwrap_err();
            assert_eq!(err.why, why, "{input:?}");
            assert!(err.to_string().contains(&format!("{input:?}")), "{err}");
        }
    }

    #[test]
    fn lists_are_comma_separated_and_any_bad_entry_fails_the_list() {
        assert_eq!(cidrs(""), vec![]);
        assert_eq!(cidrs(" , "), vec![]);
        assert_eq!(
            cidrs("10.96.0.0/12, 10.244.0.0/16,fd00::/8"),
            vec![
                cidr("10.96.0.0/12"),
                cidr("10.244.0.0/16"),
                cidr("fd00::/8")
            ]
        );
        let err = Cidr::parse_list("10.96.0.0/12,10.244.0.0/99").unwrap_err();
        assert_eq!(err.input, "10.244.0.0/99");
    }

    #[test]
    fn contains_respects_prefix_and_family() {
        let table = [
            ("10.0.0.0/8", "10.0.0.0", true),
            ("10.0.0.0/8", "10.255.255.255", true),
            ("10.0.0.0/8", "11.0.0.0", false),
            ("10.0.0.0/8", "9.255.255.255", false),
            ("198.18.0.0/15", "198.19.1.1", true),
            ("198.18.0.0/15", "198.20.0.0", false),
            ("192.0.2.1/32", "192.0.2.1", true),
            ("192.0.2.1/32", "192.0.2.2", false),
            ("0.0.0.0/0", "203.0.113.9", true),
            ("0.0.0.0/0", "2001:db8::1", false),
            ("::/0", "2001:db8::1", true),
            ("::/0", "203.0.113.9", false),
            ("10.0.0.0/8", "::ffff:10.1.2.3", true),
            // The whole mapped range is IPv4's 0.0.0.0/0 (it was an IPv6 block that held
            // nothing, addresses being compared as IPv4).
            ("::ffff:0:0/96", "::ffff:10.1.2.3", true),
            ("::ffff:0:0/96", "2001:db8::1", false),
            ("fe80::/10", "febf::1", true),
            ("fe80::/10", "fec0::1", false),
            ("fd00:ec2::254/128", "fd00:ec2::254", true),
            ("fd00:ec2::254/128", "fd00:ec2::255", false),
            ("2001:db8::/32", "2001:db8:ffff::1", true),
            ("2001:db8::/32", "2001:db9::1", false),
        ];
        for (block, addr, want) in table {
            assert_eq!(cidr(block).contains(&ip(addr)), want, "{block} ∋ {addr}");
        }
    }

    #[test]
    fn the_default_policy_refuses_local_and_metadata_addresses() {
        let p = AddressPolicy::default();
        let table: [(&str, Option<&str>); 20] = [
            ("127.0.0.1", Some("127.0.0.0/8")),
            ("127.255.0.9", Some("127.0.0.0/8")),
            ("::1", Some("::1/128")),
            ("::ffff:127.0.0.1", Some("127.0.0.0/8")),
            ("169.254.169.254", Some("169.254.0.0/16")),
            ("169.254.0.1", Some("169.254.0.0/16")),
            ("fe80::1", Some("fe80::/10")),
            ("0.0.0.0", Some("0.0.0.0/32")),
            ("::", Some("::/128")),
            ("224.0.0.1", Some("224.0.0.0/4")),
            ("239.255.255.250", Some("224.0.0.0/4")),
            ("ff02::1", Some("ff00::/8")),
            ("fd00:ec2::254", Some("fd00:ec2::254/128")),
            ("192.0.2.1", None),
            ("10.1.2.3", None),
            ("172.16.0.1", None),
            ("198.18.0.1", None),
            ("2001:db8::1", None),
            ("fd00:ec2::253", None),
            ("169.253.255.255", None),
        ];
        for (addr, want) in table {
            let got = p.allows(&ip(addr)).map_err(|r| {
                assert_eq!(r.by, RefusedBy::Default, "{addr}");
                r.cidr.to_string()
            });
            assert_eq!(got, want.map(str::to_owned).map_or(Ok(()), Err), "{addr}");
        }
    }

    #[test]
    fn the_default_policy_refuses_everything_the_apiserver_refuses() {
        let p = AddressPolicy::default();
        for addr in [
            "0.0.0.0",
            "::",
            "127.0.0.1",
            "::1",
            "169.254.1.1",
            "fe80::9",
            "224.1.1.1",
            "ff05::2",
            "192.0.2.1",
            "10.0.0.1",
            "2001:db8::1",
        ] {
            let addr = ip(addr);
            if !endpoint_ip_allowed(&addr) {
                assert!(p.allows(&addr).is_err(), "{addr}");
            }
        }
    }

    #[test]
    fn configured_deny_wins_over_allow_and_allow_over_lifted_defaults() {
        let p = AddressPolicy {
            deny: cidrs("10.96.0.0/12,10.244.0.0/16,198.18.0.0/15"),
            allow: cidrs("10.0.0.0/8,198.18.0.0/15,fd00:ec2::/32,169.254.0.0/16,127.0.0.0/8"),
        };
        let c = RefusedBy::Configured;
        let d = RefusedBy::Default;
        let table: [(&str, Option<(&str, RefusedBy)>); 12] = [
            // Gateways in 10/8 outside the local service and pod CIDRs: accepted.
            ("10.1.2.3", None),
            ("10.95.255.255", None),
            // The local service and pod CIDRs: refused although 10/8 is allowed.
            ("10.96.0.1", Some(("10.96.0.0/12", c))),
            ("10.111.255.255", Some(("10.96.0.0/12", c))),
            ("10.244.3.7", Some(("10.244.0.0/16", c))),
            ("::ffff:10.244.3.7", Some(("10.244.0.0/16", c))),
            ("198.19.0.1", Some(("198.18.0.0/15", c))),
            // A lifted built-in denial: accepted only because it is allowed.
            ("fd00:ec2::254", None),
            // What the apiserver refuses cannot be allowed.
            ("169.254.169.254", Some(("169.254.0.0/16", d))),
            ("127.0.0.1", Some(("127.0.0.0/8", d))),
            // Untouched by either list.
            ("192.0.2.1", None),
            ("2001:db8::1", None),
        ];
        for (addr, want) in table {
            let got = p.allows(&ip(addr)).map_err(|r| (r.cidr.to_string(), r.by));
            let want = want.map(|(c, by)| (c.to_owned(), by)).map_or(Ok(()), Err);
            assert_eq!(got, want, "{addr}");
        }
    }

    #[test]
    fn an_allow_outside_the_default_lifts_nothing() {
        let p = AddressPolicy {
            deny: vec![],
            allow: cidrs("10.0.0.0/8"),
        };
        assert!(p.allows(&ip("fd00:ec2::254")).is_err());
        assert!(p.allows(&ip("10.0.0.1")).is_ok());
    }

    #[test]
    fn partition_keeps_order_and_names_each_refusal() {
        let p = AddressPolicy {
            deny: cidrs("198.18.0.0/15"),
            allow: vec![],
        };
        let (ok, refused) = p.partition([
            ip("192.0.2.1"),
            ip("169.254.169.254"),
            ip("198.18.0.5"),
            ip("::ffff:192.0.2.2"),
        ]);
        assert_eq!(ok, vec![ip("192.0.2.1"), ip("192.0.2.2")]);
        assert_eq!(
            refused
                .iter()
                .map(|r| (r.ip.to_string(), r.cidr.to_string(), r.by.label()))
                .collect::<Vec<_>>(),
            vec![
                (
                    "169.254.169.254".into(),
                    "169.254.0.0/16".into(),
                    "default_deny"
                ),
                (
                    "198.18.0.5".into(),
                    "198.18.0.0/15".into(),
                    "configured_deny"
                ),
            ] as Vec<(String, String, &str)>
        );
        assert_eq!(
            refused[1].to_string(),
            "198.18.0.5 is in denied CIDR 198.18.0.0/15"
        );
        assert_eq!(
            refused[0].to_string(),
            "169.254.169.254 is in the built-in denied CIDR 169.254.0.0/16"
        );
    }

    #[test]
    fn local_networks_are_refused_with_no_flag_and_an_allow_lifts_them() {
        let local = LocalCidrs {
            service: cidrs("10.96.0.0/12,10.0.0.1/32,fd00:10:96::/112"),
            pod: cidrs("10.244.0.0/24,10.244.1.0/24"),
        };
        let none = AddressPolicy::default();
        let allowing = AddressPolicy {
            deny: cidrs("10.244.1.0/24"),
            allow: cidrs("10.96.0.0/12,10.244.0.0/16"),
        };
        let (s, p, c, d) = (
            RefusedBy::LocalService,
            RefusedBy::LocalPod,
            RefusedBy::Configured,
            RefusedBy::Default,
        );
        type Want = Option<(&'static str, RefusedBy)>;
        let table: [(&AddressPolicy, &str, Want); 14] = [
            // No flag: the apiserver's ClusterIP, a Service, a pod, all refused.
            (&none, "10.96.0.1", Some(("10.96.0.0/12", s))),
            (&none, "10.0.0.1", Some(("10.0.0.1/32", s))),
            (&none, "::ffff:10.0.0.1", Some(("10.0.0.1/32", s))),
            (&none, "fd00:10:96::a", Some(("fd00:10:96::/112", s))),
            (&none, "10.244.1.9", Some(("10.244.1.0/24", p))),
            (&none, "10.0.0.2", None),
            (&none, "10.244.2.1", None),
            (&none, "192.0.2.1", None),
            // The built-in denials come before the local networks.
            (&none, "127.0.0.1", Some(("127.0.0.0/8", d))),
            // An allow lifts a local network; a deny beats the allow.
            (&allowing, "10.96.0.1", None),
            (&allowing, "10.244.0.3", None),
            (&allowing, "10.244.1.3", Some(("10.244.1.0/24", c))),
            // Outside the allow, the local ClusterIP stays refused.
            (&allowing, "10.0.0.1", Some(("10.0.0.1/32", s))),
            (&allowing, "169.254.169.254", Some(("169.254.0.0/16", d))),
        ];
        for (policy, addr, want) in table {
            let got = policy
                .allows_in(&ip(addr), &local)
                .map_err(|r| (r.cidr.to_string(), r.by));
            let want = want.map(|(c, by)| (c.to_owned(), by)).map_or(Ok(()), Err);
            assert_eq!(got, want, "{addr}");
        }
        // Without local networks, `allows` is what it was.
        assert!(none.allows(&ip("10.96.0.1")).is_ok());
    }

    #[test]
    fn local_refusals_read_and_label_as_local() {
        let local = LocalCidrs {
            service: cidrs("10.96.0.0/12"),
            pod: cidrs("10.244.0.0/16"),
        };
        let (ok, refused) = AddressPolicy::default()
            .partition_in([ip("10.96.0.1"), ip("10.244.3.3"), ip("192.0.2.9")], &local);
        assert_eq!(ok, vec![ip("192.0.2.9")]);
        let got: Vec<(String, &str)> = refused
            .iter()
            .map(|r| (r.to_string(), r.by.label()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "10.96.0.1 is in the local service CIDR 10.96.0.0/12".to_owned(),
                    "local_service_cidr"
                ),
                (
                    "10.244.3.3 is in the local pod CIDR 10.244.0.0/16".to_owned(),
                    "local_pod_cidr"
                ),
            ]
        );
    }

    #[test]
    fn normalized_local_cidrs_compare_equal_whatever_their_order() {
        let a = LocalCidrs {
            service: cidrs("10.96.0.0/12,10.0.0.1,10.96.0.0/12"),
            pod: cidrs("10.244.1.0/24,10.244.0.0/24"),
        };
        let b = LocalCidrs {
            service: cidrs("10.0.0.1/32,10.96.0.0/12"),
            pod: cidrs("10.244.0.0/24,10.244.1.0/24,10.244.0.0/24"),
        };
        assert_eq!(a.normalized(), b.normalized());
    }
}
