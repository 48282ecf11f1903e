//! The checks `linkerd multicluster check` makes that the first ones did not: clusters
//! share trust anchors, mirrors that belong to no link, the per-link write Leases, and
//! every EndpointSlice of ours valid for its consumers. Pure, over what
//! [`super::gather`] read. The slice check is written apart from the code that writes
//! slices (`service_mirror_core::slices`) on purpose: a checker that reused it would
//! miss its bugs (the old shape `ports: [{name, protocol}]` without a port number).

use super::checks::{Line, LinkInfo, fail, pass, warn};
use base64::Engine;

/// A mirror object carrying our mirror label and a cluster name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorObject {
    /// `Service` or `EndpointSlice`.
    pub kind: &'static str,
    /// `namespace/name`.
    pub name: String,
    /// Its `mirror.linkerd.io/cluster-name`.
    pub cluster: String,
}

/// A link's write Lease `service-mirror-write-<cluster>` as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteLease {
    /// `holderIdentity`.
    pub holder: Option<String>,
    /// Carries our owner label.
    pub ours: bool,
    /// `renewTime`, Unix seconds.
    pub renewed: Option<i64>,
    /// `leaseDurationSeconds`.
    pub duration: Option<i64>,
}

/// The write Lease of one running link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteLeaseInfo {
    /// The link's cluster.
    pub cluster: String,
    /// The Lease (`Ok(None)`: absent).
    pub lease: Result<Option<WriteLease>, String>,
}

/// One EndpointSlice of ours and the Service it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceInfo {
    /// `namespace/name`.
    pub name: String,
    /// `addressType`.
    pub address_type: String,
    /// Each port's name and number.
    pub ports: Vec<(Option<String>, Option<i32>)>,
    /// How many endpoints it holds.
    pub endpoints: usize,
    /// Its `kubernetes.io/service-name`.
    pub service: Option<String>,
    /// That Service's port names (`None`: no such Service).
    pub service_ports: Option<Vec<String>>,
}

/// The DER bytes of each certificate of `identityTrustAnchorsPEM` in a `linkerd-config`
/// `values` text (parsed as YAML, a `global:` block hoisted as Linkerd does). Empty when
/// absent.
pub fn trust_anchors(values: &str) -> Result<Vec<Vec<u8>>, String> {
    if values.trim().is_empty() {
        return Ok(Vec::new());
    }
    let top = crate::cli::link_destination::linkerd_values(values).map_err(|e| format!("{e:#}"))?;
    match top.get("identityTrustAnchorsPEM") {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::String(text)) => pem_certificates(text),
        Some(other) => Err(format!("identityTrustAnchorsPEM {other} is not a string")),
    }
}

/// The DER bytes of each `CERTIFICATE` PEM block of `text`.
pub fn pem_certificates(text: &str) -> Result<Vec<Vec<u8>>, String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let after = &rest[start + BEGIN.len()..];
        let end = after
            .find(END)
            .ok_or("a certificate without its END line")?;
        let body: String = after[..end].split_whitespace().collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(body.as_bytes())
            .map_err(|e| format!("a certificate that is not base64: {e}"))?;
        out.push(der);
        rest = &after[end + END.len()..];
    }
    Ok(out)
}

/// Whether two anchor sets hold the same certificates (as Linkerd's check: same
/// count, each remote one equal to a local one).
fn same_anchors(local: &[Vec<u8>], remote: &[Vec<u8>]) -> bool {
    local.len() == remote.len() && remote.iter().all(|r| local.contains(r))
}

/// Each link's remote shares this cluster's trust anchors (`linkerd-config`), skipped
/// with a note where Linkerd is not installed.
pub fn shared_anchors(
    links: &[LinkInfo],
    local: &Result<Option<String>, String>,
    linkerd_namespace: &str,
) -> Vec<Line> {
    const WHAT: &str = "clusters share trust anchors";
    let parsed: Vec<&LinkInfo> = links.iter().filter(|l| l.cluster.is_some()).collect();
    if parsed.is_empty() {
        return Vec::new();
    }
    let local = match local {
        Err(why) => {
            return vec![fail(
                WHAT,
                format!("cannot read {linkerd_namespace}/linkerd-config on this cluster: {why}"),
            )];
        }
        Ok(None) => {
            return vec![pass(format!(
                "{WHAT} (skipped: Linkerd is not installed on this cluster, no ConfigMap {linkerd_namespace}/linkerd-config; --linkerd-namespace names another)"
            ))];
        }
        Ok(Some(values)) => match trust_anchors(values) {
            Ok(a) if !a.is_empty() => a,
            Ok(_) => {
                return vec![fail(
                    WHAT,
                    format!(
                        "{linkerd_namespace}/linkerd-config on this cluster has no identityTrustAnchorsPEM"
                    ),
                )];
            }
            Err(e) => {
                return vec![fail(
                    WHAT,
                    format!(
                        "cannot parse the trust anchors of {linkerd_namespace}/linkerd-config on this cluster: {e}"
                    ),
                )];
            }
        },
    };
    parsed
        .iter()
        .filter_map(|l| {
            let c = l.cluster.as_deref()?;
            let ns = &l.linkerd_namespace;
            let what = format!("cluster {c} shares trust anchors with this cluster");
            let remote = l.remote_config.as_ref()?;
            Some(match remote {
                Err(why) => warn(
                    what,
                    format!("cannot read {ns}/linkerd-config on {c}: {why} (the link's credentials need get on that ConfigMap; `service-mirror allow` does not grant it)"),
                ),
                Ok(None) => pass(format!(
                    "{what} (skipped: Linkerd is not installed on {c}, no ConfigMap {ns}/linkerd-config)"
                )),
                Ok(Some(values)) => match trust_anchors(values) {
                    Ok(remote) if same_anchors(&local, &remote) => pass(what),
                    Ok(remote) => fail(
                        what,
                        format!(
                            "the trust anchors differ ({} certificates here, {} on {c}): meshed clients cannot verify the gateway of {c}; install both clusters with the same trust anchor (bundle)",
                            local.len(),
                            remote.len()
                        ),
                    ),
                    Err(e) => fail(what, format!("cannot parse the trust anchors of {ns}/linkerd-config on {c}: {e}")),
                },
            })
        })
        .collect()
}

/// Mirror objects whose cluster no Link or link Secret names (a warning, as Linkerd's
/// "all mirror services are part of a Link": a deleted Link keeps its mirrors).
pub fn orphans(named: &[String], objects: &[MirrorObject]) -> Line {
    const WHAT: &str = "all mirrors are part of a link";
    let orphans: Vec<String> = objects
        .iter()
        .filter(|o| !named.contains(&o.cluster))
        .map(|o| format!("{} {} (cluster {})", o.kind, o.name, o.cluster))
        .collect();
    if orphans.is_empty() {
        return pass(WHAT);
    }
    let mut clusters: Vec<&str> = objects
        .iter()
        .filter(|o| !named.contains(&o.cluster))
        .map(|o| o.cluster.as_str())
        .collect();
    clusters.sort();
    clusters.dedup();
    warn(
        WHAT,
        format!(
            "{}{}: no Link nor link Secret names {}; `service-mirror unlink --cluster-name <cluster>` removes them",
            orphans
                .iter()
                .take(20)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            if orphans.len() > 20 {
                format!(" and {} more", orphans.len() - 20)
            } else {
                String::new()
            },
            clusters.join(", ")
        ),
    )
}

/// Each running link's write Lease is ours, held by the leader and fresh; one held by
/// another writer is a warning naming it (the link writes nothing meanwhile).
pub fn write_leases(leases: &[WriteLeaseInfo], leader: Option<&str>, now: i64) -> Vec<Line> {
    leases
        .iter()
        .map(|w| {
            let c = &w.cluster;
            let what = format!("write Lease service-mirror-write-{c} is held by this controller");
            match &w.lease {
                Err(why) => fail(what, format!("cannot read it: {why}")),
                Ok(None) => fail(
                    what,
                    "absent: no controller writes this link (is the controller running, and leading?)",
                ),
                Ok(Some(l)) => {
                    let holder = l.holder.as_deref().filter(|h| !h.is_empty());
                    match (holder, l.ours) {
                        (None, _) => fail(what, "released: no controller writes this link now"),
                        (Some(h), false) => warn(
                            what,
                            format!("held by {h:?}, another writer (Linkerd's controller?): this link writes nothing until it is released or expires; stop the other controller to hand the link over"),
                        ),
                        (Some(h), true) if leader.is_some_and(|me| me != h) => fail(
                            what,
                            format!("held by {h:?}, not by the leader {:?} (a hand-over in progress?)", leader.unwrap_or_default()),
                        ),
                        (Some(h), true) => match (l.renewed, l.duration) {
                            (Some(r), Some(d)) if r + d >= now => pass(format!("{what}: {h}")),
                            (Some(r), _) => fail(
                                what,
                                format!("not renewed for {} s by {h:?}: the link's writes have stopped", now - r),
                            ),
                            _ => fail(what, "no renewTime: not held"),
                        },
                    }
                }
            }
        })
        .collect()
}

/// Why a slice is invalid for its consumers, if it is.
pub fn slice_problem(s: &SliceInfo) -> Option<String> {
    if !matches!(s.address_type.as_str(), "IPv4" | "IPv6" | "FQDN") {
        return Some(format!(
            "addressType {:?} is not IPv4, IPv6 or FQDN",
            s.address_type
        ));
    }
    for (name, port) in &s.ports {
        match port {
            Some(p) if (1..=65535).contains(p) => {}
            // Kubernetes' own shape for "nothing to route" is `endpoints: [], ports: []`;
            // a port without number crashes Linkerd's destination.
            Some(p) => {
                return Some(format!(
                    "port {:?} has number {p}, outside 1-65535",
                    name.clone().unwrap_or_default()
                ));
            }
            None => {
                return Some(format!(
                    "port {:?} has no port number (the shape for nothing to route is endpoints: [] and ports: [])",
                    name.clone().unwrap_or_default()
                ));
            }
        }
    }
    let Some(service) = &s.service else {
        return Some("no kubernetes.io/service-name label".into());
    };
    let Some(names) = &s.service_ports else {
        return Some(format!("its Service {service} does not exist"));
    };
    for (name, _) in &s.ports {
        let name = name.clone().unwrap_or_default();
        if !names.contains(&name) {
            return Some(format!(
                "port name {name:?} is no port of Service {service} ({})",
                names
                    .iter()
                    .map(|n| format!("{n:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    None
}

/// Every EndpointSlice of ours is valid (ports with numbers, a known addressType, port
/// names of its Service).
pub fn slices_valid(slices: &[SliceInfo]) -> Line {
    let what = format!(
        "every mirror EndpointSlice is valid ({} slices)",
        slices.len()
    );
    let bad: Vec<String> = slices
        .iter()
        .filter_map(|s| slice_problem(s).map(|p| format!("{}: {p}", s.name)))
        .collect();
    match bad.len() {
        0 => pass(what),
        n => fail(
            what,
            format!(
                "{}{} (written by an older controller? it is rewritten on the next change; `kubectl delete` it to have it written now)",
                bad.iter().take(20).cloned().collect::<Vec<_>>().join("; "),
                if n > 20 {
                    format!("; and {} more", n - 20)
                } else {
                    String::new()
                }
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two self-made "certificates" (any DER bytes: the check compares bytes).
    const A: &str = "-----BEGIN CERTIFICATE-----\nQUFBQQ==\n-----END CERTIFICATE-----";
    const B: &str = "-----BEGIN CERTIFICATE-----\nQkJCQg==\n-----END CERTIFICATE-----";

    fn values(pems: &[&str]) -> String {
        let body: String = pems
            .join("\n")
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect();
        format!(
            "clusterDomain: cluster.local\nidentityTrustAnchorsPEM: |\n{body}identity:\n  issuer: {{}}\n"
        )
    }

    fn link(cluster: &str, remote: Option<Result<Option<String>, String>>) -> LinkInfo {
        LinkInfo {
            kind: "Link",
            name: cluster.into(),
            cluster: Some(cluster.into()),
            parsed: Ok(()),
            remote: Some(Ok(())),
            linkerd_namespace: "linkerd".into(),
            remote_config: remote,
        }
    }

    #[test]
    fn trust_anchors_are_read_from_a_block_or_a_quoted_string() {
        assert_eq!(
            trust_anchors(&values(&[A, B])).unwrap(),
            vec![b"AAAA".to_vec(), b"BBBB".to_vec()]
        );
        let quoted = format!("identityTrustAnchorsPEM: \"{}\"\n", A.replace('\n', "\\n"));
        assert_eq!(trust_anchors(&quoted).unwrap(), vec![b"AAAA".to_vec()]);
        assert!(trust_anchors("clusterDomain: x\n").unwrap().is_empty());
        // The same key nested in another map first, and the key under `global:`
        // (before 2.10): YAML, not lines, says which is the value.
        let nested = format!("proxy:\n  identityTrustAnchorsPEM: \"\"\n{}", values(&[A]));
        assert_eq!(trust_anchors(&nested).unwrap(), vec![b"AAAA".to_vec()]);
        let global = format!(
            "global:\n  identityTrustAnchorsPEM: \"{}\"\n",
            A.replace('\n', "\\n")
        );
        assert_eq!(trust_anchors(&global).unwrap(), vec![b"AAAA".to_vec()]);
        assert!(trust_anchors("identityTrustAnchorsPEM: [1, 2]\n").is_err());
        assert!(trust_anchors("a: [unclosed\n").is_err());
        assert!(trust_anchors("identityTrustAnchorsPEM: |\n  -----BEGIN CERTIFICATE-----\n  !!!\n  -----END CERTIFICATE-----\n").is_err());
    }

    #[test]
    fn anchors_shared_pass_differing_fail_and_a_cluster_without_linkerd_is_skipped() {
        let local = Ok(Some(values(&[A])));
        let verdict = |remote: Option<Result<Option<String>, String>>| {
            let lines = shared_anchors(&[link("east", remote)], &local, "linkerd");
            assert_eq!(lines.len(), 1);
            lines[0].clone()
        };
        assert!(verdict(Some(Ok(Some(values(&[A]))))).ok);
        let differ = verdict(Some(Ok(Some(values(&[B])))));
        assert!(!differ.ok && differ.hint.unwrap().contains("differ"));
        let more = verdict(Some(Ok(Some(values(&[A, B])))));
        assert!(!more.ok, "a superset is not the same set");
        let none = verdict(Some(Ok(None)));
        assert!(
            none.ok
                && none
                    .check
                    .contains("skipped: Linkerd is not installed on east")
        );
        let forbidden = verdict(Some(Err("forbidden".into())));
        assert!(forbidden.ok && forbidden.warning, "{forbidden:?}");
        // Not installed here: one skipped line.
        let lines = shared_anchors(
            &[link("east", Some(Ok(Some(values(&[A])))))],
            &Ok(None),
            "linkerd",
        );
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].ok
                && lines[0]
                    .check
                    .contains("skipped: Linkerd is not installed on this cluster")
        );
        let lines = shared_anchors(&[link("east", None)], &Ok(Some("x: 1".into())), "linkerd");
        assert!(!lines[0].ok, "no anchors in the local config");
        assert!(shared_anchors(&[], &local, "linkerd").is_empty());
    }

    #[test]
    fn a_mirror_of_a_cluster_no_link_names_is_a_warning() {
        let obj = |c: &str| MirrorObject {
            kind: "Service",
            name: format!("shop/web-{c}"),
            cluster: c.into(),
        };
        let named = vec!["east".to_string()];
        assert!(orphans(&named, &[obj("east")]).ok);
        assert!(!orphans(&named, &[obj("east")]).warning);
        let l = orphans(&named, &[obj("east"), obj("gone")]);
        assert!(l.ok && l.warning, "{l:?}");
        assert!(l.hint.unwrap().contains("shop/web-gone (cluster gone)"));
    }

    #[test]
    fn a_write_lease_passes_only_ours_held_by_the_leader_and_fresh() {
        let lease = |holder: Option<&str>, ours, renewed| {
            Ok(Some(WriteLease {
                holder: holder.map(str::to_string),
                ours,
                renewed: Some(renewed),
                duration: Some(15),
            }))
        };
        type Read = Result<Option<WriteLease>, String>;
        let table: Vec<(&str, Read, bool, bool, &str)> = vec![
            (
                "ours, fresh",
                lease(Some("pod-1"), true, 100),
                true,
                false,
                "",
            ),
            ("absent", Ok(None), false, false, "absent"),
            (
                "unreadable",
                Err("forbidden".into()),
                false,
                false,
                "cannot read",
            ),
            (
                "released",
                lease(Some(""), true, 100),
                false,
                false,
                "released",
            ),
            (
                "stale",
                lease(Some("pod-1"), true, 50),
                false,
                false,
                "not renewed for 55 s",
            ),
            (
                "another replica",
                lease(Some("pod-2"), true, 100),
                false,
                false,
                "not by the leader",
            ),
            (
                "foreign",
                lease(Some("linkerd-sm-7f9"), false, 100),
                true,
                true,
                "linkerd-sm-7f9",
            ),
        ];
        for (name, l, ok, warning, hint) in table {
            let lines = write_leases(
                &[WriteLeaseInfo {
                    cluster: "east".into(),
                    lease: l,
                }],
                Some("pod-1"),
                105,
            );
            assert_eq!(
                (lines[0].ok, lines[0].warning),
                (ok, warning),
                "{name}: {lines:?}"
            );
            assert!(
                lines[0].hint.clone().unwrap_or_default().contains(hint),
                "{name}: {lines:?}"
            );
        }
    }

    fn slice(ports: &[(Option<&str>, Option<i32>)], endpoints: usize) -> SliceInfo {
        SliceInfo {
            name: "shop/web-east-ipv4-0".into(),
            address_type: "IPv4".into(),
            ports: ports
                .iter()
                .map(|(n, p)| (n.map(str::to_string), *p))
                .collect(),
            endpoints,
            service: Some("web-east".into()),
            service_ports: Some(vec!["http".into(), "admin".into()]),
        }
    }

    #[test]
    fn a_slice_port_without_number_or_of_another_name_or_a_bad_address_type_is_invalid() {
        let ok = slice(&[(Some("http"), Some(4143))], 1);
        assert_eq!(slice_problem(&ok), None);
        assert_eq!(
            slice_problem(&slice(&[], 0)),
            None,
            "Kubernetes' placeholder shape"
        );
        assert_eq!(
            slice_problem(&slice(&[(Some("http"), Some(4143))], 0)),
            None,
            "no endpoints, ports known"
        );
        let old = slice(&[(Some("http"), None)], 0);
        assert!(
            slice_problem(&old).unwrap().contains("no port number"),
            "the old bad shape"
        );
        assert!(
            slice_problem(&slice(&[(Some("http"), Some(0))], 1))
                .unwrap()
                .contains("outside")
        );
        assert!(
            slice_problem(&slice(&[(Some("grpc"), Some(4143))], 1))
                .unwrap()
                .contains("\"grpc\"")
        );
        let mut bad_type = ok.clone();
        bad_type.address_type = "IPv5".into();
        assert!(slice_problem(&bad_type).unwrap().contains("addressType"));
        let mut orphan = ok.clone();
        orphan.service_ports = None;
        assert!(slice_problem(&orphan).unwrap().contains("does not exist"));
        let line = slices_valid(&[ok.clone(), old]);
        assert!(!line.ok);
        assert!(
            line.hint
                .unwrap()
                .starts_with("shop/web-east-ipv4-0: port \"http\" has no port number")
        );
        assert!(slices_valid(&[ok]).ok);
    }
}
