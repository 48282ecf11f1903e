//! The checks of `check`: pure functions over what [`super::gather`] read, each
//! returning its lines, so every pass and failure is unit-tested without a cluster.

use serde::Serialize;

/// State of the `links.multicluster.linkerd.io` CRD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrdState {
    /// Not installed.
    Missing,
    /// Installed, not (yet) Established.
    NotEstablished,
    /// Installed and served.
    Established,
}

/// One link as `check` saw it: a `Link` or a link Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    /// `Link` or `Secret`.
    pub kind: &'static str,
    /// The object's name.
    pub name: String,
    /// The cluster it links, once parsed.
    pub cluster: Option<String>,
    /// The parse: `Err` with the reason.
    pub parsed: Result<(), String>,
    /// The remote credentials (list and watch): `None` when the link did not parse.
    pub remote: Option<Result<(), String>>,
    /// Where Linkerd runs on the remote (`targetClusterLinkerdNamespace`, default
    /// `linkerd`).
    pub linkerd_namespace: String,
    /// The remote's `linkerd-config` `values` (`Ok(None)`: absent; `None`: not read,
    /// the link did not parse or connect).
    pub remote_config: Option<Result<Option<String>, String>>,
}

/// The leader-election Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Its name.
    pub name: String,
    /// `holderIdentity`.
    pub holder: Option<String>,
    /// `renewTime`, Unix seconds.
    pub renewed: Option<i64>,
    /// `leaseDurationSeconds`.
    pub duration: Option<i64>,
}

/// A mirror Service and how many ready addresses its endpoints have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorInfo {
    /// Cluster it mirrors.
    pub cluster: String,
    /// `namespace/name`.
    pub name: String,
    /// A remote-discovery mirror (no endpoints by design).
    pub remote_discovery: bool,
    /// Ready addresses in its Endpoints or EndpointSlices.
    pub ready: usize,
}

/// Everything `check` reads.
#[derive(Debug, Clone)]
pub struct Gathered {
    /// The controller namespace.
    pub namespace: String,
    /// The Link CRD.
    pub crd: CrdState,
    /// Links and link Secrets.
    pub links: Vec<LinkInfo>,
    /// The Lease (`Ok(None)`: absent; `Err`: could not read it).
    pub lease: Result<Option<LeaseInfo>, String>,
    /// The lease name looked for.
    pub lease_name: String,
    /// The controller's `/metrics` page, or why it could not be read.
    pub metrics: Result<String, String>,
    /// Mirror Services of the links.
    pub mirrors: Vec<MirrorInfo>,
    /// Now, Unix seconds.
    pub now: i64,
    /// Where Linkerd runs on this cluster (`--linkerd-namespace`).
    pub linkerd_namespace: String,
    /// This cluster's `linkerd-config` `values` (`Ok(None)`: absent).
    pub local_config: Result<Option<String>, String>,
    /// Every cluster a Link or link Secret names (parsed or not).
    pub named_clusters: Vec<String>,
    /// Every mirror Service and slice carrying our mirror and cluster-name labels.
    pub mirror_objects: Vec<super::linkerd::MirrorObject>,
    /// The write Lease of each parsed link.
    pub write_leases: Vec<super::linkerd::WriteLeaseInfo>,
    /// Every EndpointSlice of ours.
    pub slices: Vec<super::linkerd::SliceInfo>,
}

/// One line of `check`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Line {
    /// What is checked.
    pub check: String,
    /// Whether it passed (a warning passes: it fails nothing).
    pub ok: bool,
    /// A warning (`‼`): something to look at that does not fail `check`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub warning: bool,
    /// On failure, what is wrong and what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

pub(super) fn pass(check: impl Into<String>) -> Line {
    Line {
        check: check.into(),
        ok: true,
        warning: false,
        hint: None,
    }
}

pub(super) fn fail(check: impl Into<String>, hint: impl Into<String>) -> Line {
    Line {
        check: check.into(),
        ok: false,
        warning: false,
        hint: Some(hint.into()),
    }
}

pub(super) fn warn(check: impl Into<String>, hint: impl Into<String>) -> Line {
    Line {
        check: check.into(),
        ok: true,
        warning: true,
        hint: Some(hint.into()),
    }
}

/// The Link CRD is installed and Established.
pub fn crd(state: &CrdState) -> Line {
    const WHAT: &str = "Link CRD links.multicluster.linkerd.io is installed";
    match state {
        CrdState::Established => pass(WHAT),
        CrdState::Missing => fail(
            WHAT,
            "not found: apply ours (crates/api/crds/link-crd.yaml) or Linkerd's multicluster CRDs before any Link; Secret links work without it",
        ),
        CrdState::NotEstablished => fail(
            WHAT,
            "installed but not Established: see `kubectl get crd links.multicluster.linkerd.io -o yaml` (status.conditions)",
        ),
    }
}

/// At least one link, and each one parses.
pub fn links_valid(links: &[LinkInfo]) -> Vec<Line> {
    if links.is_empty() {
        return vec![fail(
            "at least one link exists",
            "no Link nor link Secret in the namespace: link a cluster with `service-mirror link`",
        )];
    }
    links
        .iter()
        .map(|l| {
            let what = format!("{} {} is valid", l.kind, l.name);
            match &l.parsed {
                Ok(()) => pass(what),
                Err(why) => fail(what, why.clone()),
            }
        })
        .collect()
}

/// Each parsed link's credentials may list and watch Services on its remote.
pub fn remotes(links: &[LinkInfo]) -> Vec<Line> {
    links
        .iter()
        .filter_map(|l| {
            let cluster = l.cluster.as_deref().unwrap_or(&l.name);
            let what = format!("remote cluster {cluster} is reachable with list and watch permission");
            match l.remote.as_ref()? {
                Ok(()) => Some(pass(what)),
                Err(why) => Some(fail(
                    what,
                    format!("{why} (fix the credentials of {} {}; `service-mirror allow` on the remote grants what is needed)", l.kind, l.name),
                )),
            }
        })
        .collect()
}

/// The leader-election Lease is held and not expired.
pub fn leader(
    lease: &Result<Option<LeaseInfo>, String>,
    lease_name: &str,
    namespace: &str,
    now: i64,
) -> Line {
    let what = format!("controller leader present (Lease {namespace}/{lease_name})");
    match lease {
        Err(why) => fail(what, format!("cannot read the Lease: {why}")),
        Ok(None) => fail(
            what,
            "no Lease: the controller is not running in this namespace (or runs with --leader-election=false, or another --lease-name)",
        ),
        Ok(Some(l)) => match (&l.holder, l.renewed, l.duration) {
            (Some(h), Some(renewed), Some(d)) if !h.is_empty() && renewed + d >= now => {
                pass(format!("{what}: {h}"))
            }
            (Some(h), Some(renewed), _) if !h.is_empty() => fail(
                what,
                format!(
                    "the Lease of {h} expired {} s ago: the controller is not running",
                    now - renewed
                ),
            ),
            _ => fail(what, "the Lease has no holder: no controller replica leads"),
        },
    }
}

/// `(cluster, gateway, value)` of every `gateway_alive` series in a metrics page.
pub fn alive_series(metrics: &str) -> Vec<(String, String, f64)> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("gateway_alive{"))
        .filter_map(|rest| {
            let (labels, value) = rest.rsplit_once('}')?;
            let value: f64 = value.split_whitespace().next()?.parse().ok()?;
            let label = |key: &str| {
                let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
                let end = labels[start..].find('"')? + start;
                Some(labels[start..end].to_string())
            };
            let gateway = format!(
                "{}/{}",
                label("gateway_namespace").unwrap_or_default(),
                label("gateway_name").unwrap_or_default()
            );
            Some((label("target_cluster_name")?, gateway, value))
        })
        .collect()
}

/// Each gateway of each link answers its probes (`gateway_alive` of the controller).
pub fn gateways(
    links: &[LinkInfo],
    mirrors: &[MirrorInfo],
    metrics: &Result<String, String>,
) -> Vec<Line> {
    let clusters: Vec<&str> = links.iter().filter_map(|l| l.cluster.as_deref()).collect();
    if clusters.is_empty() {
        return Vec::new();
    }
    let text = match metrics {
        Ok(t) => t,
        Err(why) => {
            return vec![fail(
                "gateways are alive",
                format!(
                    "cannot read the controller's metrics: {why} (pass --admin-addr HOST:PORT)"
                ),
            )];
        }
    };
    let series = alive_series(text);
    clusters
        .iter()
        .map(|c| {
            let what = format!("gateway of cluster {c} is alive");
            let of: Vec<&(String, String, f64)> = series.iter().filter(|s| s.0 == *c).collect();
            let in_use = mirrors.iter().any(|m| m.cluster == *c && !m.remote_discovery);
            let dead: Vec<&str> = of.iter().filter(|s| s.2 < 1.0).map(|s| s.1.as_str()).collect();
            match (of.is_empty(), in_use, dead.is_empty()) {
                (true, false, _) => pass(format!("{what} (no gateway in use)")),
                // A gateway without probe port is never probed: alive, as the controller counts it.
                (true, true, _) => pass(format!("{what} (not probed: no probe port)")),
                (false, _, true) => pass(what),
                (false, _, false) => fail(
                    what,
                    format!("gateway {} does not answer its probes: check it runs and its probe port is reachable from this cluster", dead.join(", ")),
                ),
            }
        })
        .collect()
}

/// Every gateway mirror (not remote-discovery) of each cluster has a ready endpoint.
pub fn mirror_endpoints(links: &[LinkInfo], mirrors: &[MirrorInfo]) -> Vec<Line> {
    links
        .iter()
        .filter_map(|l| l.cluster.as_deref())
        .map(|c| {
            let what = format!("every gateway mirror of cluster {c} has endpoints");
            let of: Vec<&MirrorInfo> = mirrors
                .iter()
                .filter(|m| m.cluster == c && !m.remote_discovery)
                .collect();
            let empty: Vec<&str> = of
                .iter()
                .filter(|m| m.ready == 0)
                .map(|m| m.name.as_str())
                .collect();
            if empty.is_empty() {
                pass(format!("{what} ({} mirrors)", of.len()))
            } else {
                fail(
                    what,
                    format!(
                        "no ready endpoint: {} (is the gateway alive, does it have an address?)",
                        empty.join(", ")
                    ),
                )
            }
        })
        .collect()
}

/// Every check, in order.
pub fn all(g: &Gathered) -> Vec<Line> {
    let mut out = vec![crd(&g.crd)];
    out.extend(links_valid(&g.links));
    out.extend(remotes(&g.links));
    out.push(leader(&g.lease, &g.lease_name, &g.namespace, g.now));
    out.extend(gateways(&g.links, &g.mirrors, &g.metrics));
    out.extend(mirror_endpoints(&g.links, &g.mirrors));
    out.extend(super::linkerd::shared_anchors(
        &g.links,
        &g.local_config,
        &g.linkerd_namespace,
    ));
    out.push(super::linkerd::orphans(
        &g.named_clusters,
        &g.mirror_objects,
    ));
    // The leader's identity, when one leads (an unheld Lease names none).
    let leader = g
        .lease
        .as_ref()
        .ok()
        .and_then(|l| l.as_ref())
        .and_then(|l| l.holder.as_deref())
        .filter(|h| !h.is_empty());
    out.extend(super::linkerd::write_leases(&g.write_leases, leader, g.now));
    out.push(super::linkerd::slices_valid(&g.slices));
    out
}

/// The lines as printed: `√ check` or `× check` and its hint, indented.
pub fn render(lines: &[Line]) -> String {
    let mut out = String::new();
    for l in lines {
        out.push_str(match (l.ok, l.warning) {
            (true, false) => "√ ",
            (true, true) => "‼ ",
            (false, _) => "× ",
        });
        out.push_str(&l.check);
        out.push('\n');
        if let Some(h) = &l.hint {
            out.push_str("    ");
            out.push_str(h);
            out.push('\n');
        }
    }
    let failed = lines.iter().filter(|l| !l.ok).count();
    match failed {
        0 => out.push_str(&format!(
            "\nStatus check results are √ ({} checks)\n",
            lines.len()
        )),
        n => out.push_str(&format!(
            "\nStatus check results are × ({n} of {} failed)\n",
            lines.len()
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, parsed: Result<(), &str>, remote: Option<Result<(), &str>>) -> LinkInfo {
        LinkInfo {
            kind: "Link",
            name: name.into(),
            cluster: parsed.is_ok().then(|| name.to_string()),
            parsed: parsed.map_err(str::to_string),
            remote: remote.map(|r| r.map_err(str::to_string)),
            linkerd_namespace: "linkerd".into(),
            remote_config: None,
        }
    }

    fn mirror(cluster: &str, name: &str, rd: bool, ready: usize) -> MirrorInfo {
        MirrorInfo {
            cluster: cluster.into(),
            name: name.into(),
            remote_discovery: rd,
            ready,
        }
    }

    fn good() -> Gathered {
        Gathered {
            namespace: "mc".into(),
            crd: CrdState::Established,
            links: vec![link("east", Ok(()), Some(Ok(())))],
            lease: Ok(Some(LeaseInfo {
                name: "service-mirror".into(),
                holder: Some("pod-1".into()),
                renewed: Some(100),
                duration: Some(15),
            })),
            lease_name: "service-mirror".into(),
            metrics: Ok("# TYPE gateway_alive gauge\ngateway_alive{gateway_name=\"east\",gateway_namespace=\"mc\",target_cluster_name=\"east\"} 1\n".into()),
            mirrors: vec![mirror("east", "shop/web-east", false, 1), mirror("east", "shop/db-east", true, 0)],
            now: 105,
            linkerd_namespace: "linkerd".into(),
            local_config: Ok(None),
            named_clusters: vec!["east".into()],
            mirror_objects: vec![],
            write_leases: vec![super::super::linkerd::WriteLeaseInfo {
                cluster: "east".into(),
                lease: Ok(Some(super::super::linkerd::WriteLease {
                    holder: Some("pod-1".into()),
                    ours: true,
                    renewed: Some(100),
                    duration: Some(15),
                })),
            }],
            slices: vec![],
        }
    }

    fn failures(g: &Gathered) -> Vec<Line> {
        all(g).into_iter().filter(|l| !l.ok).collect()
    }

    #[test]
    fn a_working_link_passes_every_check() {
        let lines = all(&good());
        assert!(lines.iter().all(|l| l.ok), "{lines:#?}");
        assert_eq!(lines.len(), 10, "{lines:#?}");
        let text = render(&lines);
        assert!(
            text.contains("√ Link CRD links.multicluster.linkerd.io is installed\n"),
            "{text}"
        );
        assert!(
            text.contains("√ every gateway mirror of cluster east has endpoints (1 mirrors)"),
            "{text}"
        );
        assert!(
            text.ends_with("Status check results are √ (10 checks)\n"),
            "{text}"
        );
    }

    #[test]
    fn a_missing_or_unestablished_crd_fails() {
        for state in [CrdState::Missing, CrdState::NotEstablished] {
            let g = Gathered {
                crd: state.clone(),
                ..good()
            };
            let f = failures(&g);
            assert_eq!(f.len(), 1, "{f:#?}");
            assert!(f[0].check.starts_with("Link CRD"), "{state:?}");
        }
        assert!(crd(&CrdState::Missing).hint.unwrap().contains("not found"));
    }

    #[test]
    fn an_invalid_link_fails_and_is_not_probed() {
        let mut g = good();
        g.links.push(link(
            "west",
            Err("credentials Secret \"x\" not found"),
            None,
        ));
        let f = failures(&g);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].check, "Link west is valid");
        assert!(f[0].hint.as_deref().unwrap().contains("not found"));
        assert_eq!(remotes(&g.links).len(), 1, "only the parsed link is probed");
        g.links.clear();
        let f = failures(&g);
        assert_eq!(f[0].check, "at least one link exists");
    }

    #[test]
    fn refused_credentials_fail() {
        let g = Gathered {
            links: vec![link("east", Ok(()), Some(Err("forbidden")))],
            ..good()
        };
        let f = failures(&g);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            f[0].check,
            "remote cluster east is reachable with list and watch permission"
        );
    }

    #[test]
    fn no_or_an_expired_or_an_unheld_lease_fails() {
        let lease = |holder: Option<&str>, renewed| {
            Ok(Some(LeaseInfo {
                name: "service-mirror".into(),
                holder: holder.map(str::to_string),
                renewed: Some(renewed),
                duration: Some(15),
            }))
        };
        for (l, hint) in [
            (Ok(None), "no Lease"),
            (Err("forbidden".to_string()), "cannot read"),
            (lease(Some("pod-1"), 50), "expired 55 s ago"),
            (lease(None, 100), "no holder"),
            (lease(Some(""), 100), "no holder"),
        ] {
            let g = Gathered { lease: l, ..good() };
            let f = failures(&g);
            assert_eq!(f.len(), 1, "{f:#?}");
            assert_eq!(
                f[0].check,
                "controller leader present (Lease mc/service-mirror)"
            );
            assert!(f[0].hint.as_deref().unwrap().contains(hint), "{f:#?}");
        }
    }

    #[test]
    fn a_dead_gateway_or_unreadable_metrics_fail() {
        let g = Gathered {
            metrics: Ok("gateway_alive{gateway_name=\"gw\",gateway_namespace=\"x\",target_cluster_name=\"east\"} 0\n".into()),
            ..good()
        };
        let f = failures(&g);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].check, "gateway of cluster east is alive");
        assert!(f[0].hint.as_deref().unwrap().contains("x/gw"), "{f:#?}");
        let g = Gathered {
            metrics: Err("connection refused".into()),
            ..good()
        };
        assert!(
            failures(&g)[0]
                .hint
                .as_deref()
                .unwrap()
                .contains("--admin-addr")
        );
        let g = Gathered {
            metrics: Ok(String::new()),
            ..good()
        };
        let lines = gateways(&g.links, &g.mirrors, &g.metrics);
        assert_eq!(
            lines[0].check,
            "gateway of cluster east is alive (not probed: no probe port)"
        );
        assert!(failures(&g).is_empty());
        // No series and no gateway mirror: nothing to be alive.
        let g = Gathered {
            metrics: Ok(String::new()),
            mirrors: vec![],
            ..good()
        };
        assert!(failures(&g).is_empty());
    }

    #[test]
    fn a_gateway_mirror_without_endpoints_fails_a_remote_discovery_one_does_not() {
        let mut g = good();
        g.mirrors.push(mirror("east", "shop/api-east", false, 0));
        g.mirrors.push(mirror("other", "shop/x-other", false, 0));
        let f = failures(&g);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            f[0].check,
            "every gateway mirror of cluster east has endpoints"
        );
        assert!(f[0].hint.as_deref().unwrap().contains("shop/api-east"));
        assert!(!f[0].hint.as_deref().unwrap().contains("x-other"));
    }

    #[test]
    fn metrics_parse_any_label_order() {
        let s = alive_series(
            "gateway_alive{target_cluster_name=\"a\",gateway_name=\"g\",gateway_namespace=\"n\"} 1\ngateway_alive_other{target_cluster_name=\"b\"} 0\n# gateway_alive{}\n",
        );
        assert_eq!(s, vec![("a".into(), "n/g".into(), 1.0)]);
    }
}
