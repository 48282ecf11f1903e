//! The export rule: which remote Services are mirrored, and through which gateway.
//!
//! One function decides it for everyone who asks (the event mapping that indexes
//! gateways, reconcile, and the test oracle's reading of the contract), so the rule
//! cannot drift between them. Secret links use the 2020 contract's pair of gateway
//! annotations; Linkerd's `Link` resources select by label, through the Link's one
//! gateway. Either way, a remote Service's `service-mirror.io/export-to` narrows the
//! clusters that mirror it (see `export_to.rs`).

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::export_to::{Withheld, withheld};
use super::gateway::{GatewayRef, exported_gateway};
use super::namespaces::NamespaceFilter;
use super::naming::is_dns1123_label;
use super::selector::Selector;

/// How a remote Service says it is exported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ExportRule {
    /// Both `mirror.linkerd.io/gateway-name` and `mirror.linkerd.io/gateway-ns`
    /// annotations, non-empty: the gateway is the remote Service they name.
    #[default]
    GatewayAnnotations,
    /// A `Link` resource's selectors (Linkerd since 2.9); an annotation-exported
    /// Service is not mirrored by them.
    Selectors {
        /// `selector`: mirrored through `gateway` (default `mirror.linkerd.io/exported=true`).
        export: Selector,
        /// `remoteDiscoverySelector`: mirrored as a Service only, with no endpoints
        /// (default `mirror.linkerd.io/exported=remote-discovery`). Wins over `export`
        /// when both match, as in Linkerd.
        remote_discovery: Selector,
        /// The Link's gateway: the one every selected Service goes through.
        gateway: GatewayRef,
    },
}

/// Everything the export decision depends on besides the Service itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportPolicy {
    /// How export is marked.
    pub rule: ExportRule,
    /// Remote namespaces that may be mirrored at all.
    pub namespaces: NamespaceFilter,
    /// This cluster's name in the cluster set (`--mcs-cluster-name`, or the
    /// ClusterProperty `id.k8s.io` the start read), which a remote Service's
    /// `service-mirror.io/export-to` must list; `None`: unknown (a narrowed Service is
    /// then not mirrored).
    pub local_cluster: Option<String>,
    /// The federated members' selector (a Link's `federatedServiceSelector`, where the
    /// link feeds the federation). A member that is not mirrored is no export, but an
    /// invalid `service-mirror.io/export-to` on it is bad input to say:
    /// [`ExportDecision::InvalidMemberExportTo`] (the federation leaves it out, reaching
    /// no cluster).
    pub federated: Option<Selector>,
}

/// Why an exported Service is not mirrored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No ports: a ClusterIP mirror Service needs at least one.
    NoPorts,
    /// A name or namespace the local apiserver would refuse (a real remote validates
    /// them, a hostile one need not): its mirror could never be created.
    InvalidName,
    /// A port the local apiserver would refuse: a number outside 1-65535, a protocol
    /// other than TCP, UDP and SCTP, a name that is no DNS-1123 label or is used twice,
    /// an unnamed port among several, a target port that is neither 1-65535 nor a
    /// port name.
    InvalidPorts,
}

impl Refusal {
    /// Bounded label for metrics and logs.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::NoPorts => "unmirrorable",
            Refusal::InvalidName => "invalid_name",
            Refusal::InvalidPorts => "invalid_ports",
        }
    }

    /// What an operator reads (no remote text in it).
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::NoPorts => "the Service has no ports",
            Refusal::InvalidName => "its name or namespace is not a valid Kubernetes name",
            Refusal::InvalidPorts => {
                "a port is invalid (number outside 1-65535, unknown protocol, bad or repeated name, unnamed among several, or bad target port)"
            }
        }
    }
}

/// What becomes of one remote Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportDecision {
    /// Mirrored, with its endpoints at this gateway.
    Mirror(GatewayRef),
    /// Exported through `gateway` but not mirrorable: reported, and a mirror that
    /// exists is left exactly as it is (never deleted because of bad input).
    Refused {
        /// The gateway it names (still indexed, so a gateway change looks at it again).
        gateway: GatewayRef,
        /// Why.
        reason: Refusal,
    },
    /// Selected for remote discovery (a Link's `remoteDiscoverySelector`): a mirror
    /// Service with no endpoints.
    RemoteDiscovery,
    /// Not exported, or in a namespace that is not mirrored: any mirror goes.
    NotExported,
    /// Exported, but its `service-mirror.io/export-to` keeps it from this cluster: any
    /// mirror goes (withdrawn), as for [`ExportDecision::NotExported`].
    Withheld(Withheld),
    /// Not exported, but a federated member ([`ExportPolicy::federated`]) whose
    /// `service-mirror.io/export-to` is invalid (the reason): nothing is mirrored, as
    /// for [`ExportDecision::NotExported`] (the federation leaves it out), and the link
    /// says the bad list; its Link status lists mirrors only, so no entry there.
    InvalidMemberExportTo(String),
}

impl ExportDecision {
    /// The gateway the Service names, mirrored or refused.
    pub fn gateway(&self) -> Option<&GatewayRef> {
        match self {
            ExportDecision::Mirror(gw) | ExportDecision::Refused { gateway: gw, .. } => Some(gw),
            ExportDecision::RemoteDiscovery
            | ExportDecision::NotExported
            | ExportDecision::Withheld(_)
            | ExportDecision::InvalidMemberExportTo(_) => None,
        }
    }
}

/// Decides whether `service` is mirrored under `policy`: an allowed namespace, then
/// the link's export rule, then the Service's `service-mirror.io/export-to` for
/// `policy.local_cluster` (a Service kept from this cluster is withheld, not refused:
/// whether another cluster could mirror it is not this one's business), then whether it
/// can be mirrored.
pub fn export_decision(service: &Service, policy: &ExportPolicy) -> ExportDecision {
    let namespace = service.metadata.namespace.as_deref().unwrap_or_default();
    if !policy.namespaces.allows(namespace) {
        return ExportDecision::NotExported;
    }
    let narrowed = || withheld(service, policy.local_cluster.as_deref());
    let gateway = match &policy.rule {
        ExportRule::GatewayAnnotations => exported_gateway(service),
        ExportRule::Selectors {
            export,
            remote_discovery,
            gateway,
        } => {
            let labels = service.metadata.labels.as_ref();
            if remote_discovery.matches(labels) {
                if let Some(w) = narrowed() {
                    return ExportDecision::Withheld(w);
                }
                return match refusal(service) {
                    None => ExportDecision::RemoteDiscovery,
                    Some(reason) => ExportDecision::Refused {
                        gateway: gateway.clone(),
                        reason,
                    },
                };
            }
            export.matches(labels).then(|| gateway.clone())
        }
    };
    let Some(gateway) = gateway else {
        return match narrowed() {
            Some(Withheld::Invalid(reason)) if federated_member(service, policy) => {
                ExportDecision::InvalidMemberExportTo(reason)
            }
            _ => ExportDecision::NotExported,
        };
    };
    if let Some(w) = narrowed() {
        return ExportDecision::Withheld(w);
    }
    match refusal(service) {
        None => ExportDecision::Mirror(gateway),
        Some(reason) => ExportDecision::Refused { gateway, reason },
    }
}

/// Whether `service` is a federated member by `policy` (its selector, and no mirror:
/// a mirror copies its remote's labels, and the federation never takes one).
fn federated_member(service: &Service, policy: &ExportPolicy) -> bool {
    let labels = service.metadata.labels.as_ref();
    policy.federated.as_ref().is_some_and(|f| f.matches(labels))
        && !labels.is_some_and(|l| l.contains_key(crate::labels::MIRRORED_SERVICE_LABEL))
}

/// Why an exported `service` cannot be mirrored, if it cannot.
fn refusal(service: &Service) -> Option<Refusal> {
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    if ports.is_empty() {
        return Some(Refusal::NoPorts);
    }
    let name = service.metadata.name.as_deref().unwrap_or_default();
    let namespace = service.metadata.namespace.as_deref().unwrap_or_default();
    if !is_service_name(name) || !is_dns1123_label(namespace) {
        return Some(Refusal::InvalidName);
    }
    (!ports_valid(ports)).then_some(Refusal::InvalidPorts)
}

/// A Service name as the apiserver validates it: a DNS-1035 label (at most 63
/// characters; [`crate::mirror_name`] shortens the mirror's name when the cluster
/// suffix makes it longer).
fn is_service_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// The rules the apiserver applies to a Service's ports (the mirror copies name,
/// protocol, port and target port; an empty protocol or target port is unset, as the
/// mirror defaults them).
fn ports_valid(ports: &[ServicePort]) -> bool {
    let mut names = std::collections::BTreeSet::new();
    let mut numbers = std::collections::BTreeSet::new();
    ports.iter().all(|p| {
        let named = match p.name.as_deref().filter(|n| !n.is_empty()) {
            Some(n) => is_dns1123_label(n) && names.insert(n),
            None => ports.len() == 1,
        };
        let target = match &p.target_port {
            None => true,
            Some(IntOrString::Int(t)) => (0..=65535).contains(t),
            Some(IntOrString::String(t)) => t.is_empty() || is_port_name(t),
        };
        let protocol = p.protocol.as_deref().filter(|p| !p.is_empty());
        named
            && (1..=65535).contains(&p.port)
            && target
            && matches!(protocol, None | Some("TCP" | "UDP" | "SCTP"))
            // One port number once per protocol.
            && numbers.insert((protocol.unwrap_or("TCP"), p.port))
    })
}

/// An IANA service name, as a named target port must be: at most 15 characters of
/// lowercase letters, digits and single inner `-`, with at least one letter.
fn is_port_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 15
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.iter().any(u8::is_ascii_lowercase)
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !name.contains("--")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::labels::{GATEWAY_NAME_ANNOTATION, GATEWAY_NS_ANNOTATION};

    fn svc(ns: &str, annotations: &[(&str, &str)], ports: Option<usize>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some(ns.into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                ports: ports.map(|n| {
                    (0..n)
                        .map(|i| ServicePort {
                            // Several ports must be named (the apiserver's rule).
                            name: (n > 1).then(|| format!("p{i}")),
                            port: 80 + i as i32,
                            ..ServicePort::default()
                        })
                        .collect()
                }),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }

    const EXPORTED: &[(&str, &str)] = &[
        (GATEWAY_NAME_ANNOTATION, "gw"),
        (GATEWAY_NS_ANNOTATION, "mc"),
    ];

    #[test]
    fn the_decision_table() {
        let gw = GatewayRef::new("mc", "gw");
        let policy = ExportPolicy::default();
        let cases: &[(&str, Service, ExportDecision)] = &[
            (
                "both annotations and a port",
                svc("shop", EXPORTED, Some(1)),
                ExportDecision::Mirror(gw.clone()),
            ),
            (
                "many ports",
                svc("shop", EXPORTED, Some(250)),
                ExportDecision::Mirror(gw.clone()),
            ),
            (
                "no annotations",
                svc("shop", &[], Some(1)),
                ExportDecision::NotExported,
            ),
            (
                "gateway name only",
                svc("shop", &[(GATEWAY_NAME_ANNOTATION, "gw")], Some(1)),
                ExportDecision::NotExported,
            ),
            (
                "gateway namespace only",
                svc("shop", &[(GATEWAY_NS_ANNOTATION, "mc")], Some(1)),
                ExportDecision::NotExported,
            ),
            (
                "empty gateway name",
                svc(
                    "shop",
                    &[(GATEWAY_NAME_ANNOTATION, ""), (GATEWAY_NS_ANNOTATION, "mc")],
                    Some(1),
                ),
                ExportDecision::NotExported,
            ),
            (
                "a denied namespace wins over export",
                svc("kube-system", EXPORTED, Some(1)),
                ExportDecision::NotExported,
            ),
            (
                "denied and portless: not exported, nothing to report",
                svc("kube-system", EXPORTED, None),
                ExportDecision::NotExported,
            ),
            (
                "no ports field",
                svc("shop", EXPORTED, None),
                ExportDecision::Refused {
                    gateway: gw.clone(),
                    reason: Refusal::NoPorts,
                },
            ),
            (
                "an empty port list",
                svc("shop", EXPORTED, Some(0)),
                ExportDecision::Refused {
                    gateway: gw.clone(),
                    reason: Refusal::NoPorts,
                },
            ),
            (
                "portless and not exported: not exported",
                svc("shop", &[], None),
                ExportDecision::NotExported,
            ),
        ];
        for (name, service, want) in cases {
            assert_eq!(&export_decision(service, &policy), want, "{name}");
        }
    }

    #[test]
    fn an_allow_list_limits_export_to_its_namespaces() {
        let policy = ExportPolicy {
            namespaces: NamespaceFilter::allow_only(["shop"]),
            ..ExportPolicy::default()
        };
        assert!(matches!(
            export_decision(&svc("shop", EXPORTED, Some(1)), &policy),
            ExportDecision::Mirror(_)
        ));
        assert_eq!(
            export_decision(&svc("other", EXPORTED, Some(1)), &policy),
            ExportDecision::NotExported
        );
    }

    #[test]
    fn a_refused_service_still_names_its_gateway() {
        let d = export_decision(&svc("shop", EXPORTED, None), &ExportPolicy::default());
        assert_eq!(d.gateway(), Some(&GatewayRef::new("mc", "gw")));
        assert_eq!(
            export_decision(&svc("shop", &[], Some(1)), &ExportPolicy::default()).gateway(),
            None
        );
    }

    #[test]
    fn refusal_reasons_are_bounded_metric_labels() {
        assert_eq!(Refusal::NoPorts.reason(), "unmirrorable");
    }

    // ---- ExportRule::Selectors (Linkerd's `Link` resources) ----

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn labelled(
        ns: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
        ports: Option<usize>,
    ) -> Service {
        let mut s = svc(ns, annotations, ports);
        s.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        s
    }

    fn selector(key: &str, value: &str) -> Selector {
        Selector::parse(Some(&LabelSelector {
            match_labels: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
            match_expressions: None,
        }))
        .unwrap()
    }

    fn link_gw() -> GatewayRef {
        GatewayRef::new("linkerd-multicluster", "linkerd-gateway")
    }

    /// Linkerd's defaults: `mirror.linkerd.io/exported` = `true` / `remote-discovery`.
    fn selectors_policy() -> ExportPolicy {
        ExportPolicy {
            rule: ExportRule::Selectors {
                export: selector("mirror.linkerd.io/exported", "true"),
                remote_discovery: selector("mirror.linkerd.io/exported", "remote-discovery"),
                gateway: link_gw(),
            },
            namespaces: NamespaceFilter::default(),
            local_cluster: None,
            federated: None,
        }
    }

    const EXPORT: (&str, &str) = ("mirror.linkerd.io/exported", "true");
    const DISCOVERY: (&str, &str) = ("mirror.linkerd.io/exported", "remote-discovery");

    #[test]
    fn the_selectors_decision_table() {
        let policy = selectors_policy();
        let refused = ExportDecision::Refused {
            gateway: link_gw(),
            reason: Refusal::NoPorts,
        };
        let cases: Vec<(&str, Service, ExportDecision)> = vec![
            (
                "export selector only: mirrored through the Link's gateway",
                labelled("shop", &[EXPORT], &[], Some(1)),
                ExportDecision::Mirror(link_gw()),
            ),
            (
                "remote-discovery selector only",
                labelled("shop", &[DISCOVERY], &[], Some(1)),
                ExportDecision::RemoteDiscovery,
            ),
            (
                "neither",
                labelled("shop", &[("app", "web")], &[], Some(1)),
                ExportDecision::NotExported,
            ),
            (
                "no labels at all",
                svc("shop", &[], Some(1)),
                ExportDecision::NotExported,
            ),
            (
                "namespace filtered, export",
                labelled("kube-system", &[EXPORT], &[], Some(1)),
                ExportDecision::NotExported,
            ),
            (
                "namespace filtered, discovery",
                labelled("kube-system", &[DISCOVERY], &[], Some(1)),
                ExportDecision::NotExported,
            ),
            (
                "namespace filtered and portless",
                labelled("kube-system", &[EXPORT], &[], None),
                ExportDecision::NotExported,
            ),
            (
                "export, no ports",
                labelled("shop", &[EXPORT], &[], None),
                refused.clone(),
            ),
            (
                "export, empty port list",
                labelled("shop", &[EXPORT], &[], Some(0)),
                refused.clone(),
            ),
            (
                "discovery, no ports",
                labelled("shop", &[DISCOVERY], &[], Some(0)),
                refused.clone(),
            ),
            (
                "annotation-exported, selector not matching: the annotations mean nothing",
                labelled("shop", &[("app", "web")], EXPORTED, Some(1)),
                ExportDecision::NotExported,
            ),
            (
                "annotation-exported and selected: the Link's gateway, not the annotated one",
                labelled("shop", &[EXPORT], EXPORTED, Some(1)),
                ExportDecision::Mirror(link_gw()),
            ),
            (
                "annotation-exported and portless, not selected: nothing to report",
                labelled("shop", &[], EXPORTED, None),
                ExportDecision::NotExported,
            ),
        ];
        for (name, service, want) in &cases {
            assert_eq!(&export_decision(service, &policy), want, "{name}");
        }
    }

    #[test]
    fn remote_discovery_wins_when_both_selectors_match() {
        let policy = ExportPolicy {
            rule: ExportRule::Selectors {
                export: selector("export", "yes"),
                remote_discovery: selector("discover", "yes"),
                gateway: link_gw(),
            },
            namespaces: NamespaceFilter::default(),
            local_cluster: None,
            federated: None,
        };
        let table = [
            (vec![("export", "yes")], ExportDecision::Mirror(link_gw())),
            (vec![("discover", "yes")], ExportDecision::RemoteDiscovery),
            (
                vec![("export", "yes"), ("discover", "yes")],
                ExportDecision::RemoteDiscovery,
            ),
            (
                vec![("export", "no"), ("discover", "no")],
                ExportDecision::NotExported,
            ),
        ];
        for (labels, want) in table {
            let s = labelled("shop", &labels, &[], Some(1));
            assert_eq!(export_decision(&s, &policy), want, "{labels:?}");
        }
    }

    #[test]
    fn unset_selectors_select_nothing() {
        let policy = ExportPolicy {
            rule: ExportRule::Selectors {
                export: Selector::parse(None).unwrap(),
                remote_discovery: Selector::parse(Some(&LabelSelector::default())).unwrap(),
                gateway: link_gw(),
            },
            namespaces: NamespaceFilter::default(),
            local_cluster: None,
            federated: None,
        };
        for s in [
            svc("shop", EXPORTED, Some(1)),
            labelled("shop", &[EXPORT], &[], Some(1)),
            labelled("shop", &[DISCOVERY], &[], Some(1)),
            labelled("shop", &[EXPORT], EXPORTED, Some(1)),
        ] {
            assert_eq!(export_decision(&s, &policy), ExportDecision::NotExported);
        }
    }

    #[test]
    fn an_allow_list_limits_selector_export_too() {
        let policy = ExportPolicy {
            namespaces: NamespaceFilter::allow_only(["shop"]),
            ..selectors_policy()
        };
        for labels in [EXPORT, DISCOVERY] {
            assert_ne!(
                export_decision(&labelled("shop", &[labels], &[], Some(1)), &policy),
                ExportDecision::NotExported
            );
            assert_eq!(
                export_decision(&labelled("other", &[labels], &[], Some(1)), &policy),
                ExportDecision::NotExported
            );
        }
    }

    #[test]
    fn a_remote_discovery_decision_names_no_gateway() {
        assert_eq!(ExportDecision::RemoteDiscovery.gateway(), None);
        assert_eq!(ExportDecision::NotExported.gateway(), None);
        assert_eq!(
            ExportDecision::Mirror(link_gw()).gateway(),
            Some(&link_gw())
        );
        assert_eq!(ExportRule::default(), ExportRule::GatewayAnnotations);
    }

    /// A federated member that is not mirrored is no export, but an invalid
    /// `service-mirror.io/export-to` on it is its own decision, so that the link says it
    /// (the federation leaves it out); any other narrowing of it is not the link's to
    /// say, and a mirror (which copies its remote's labels) is never a member. A member
    /// the link also mirrors is withheld as any mirrored Service.
    #[test]
    fn a_federated_members_invalid_export_to_is_told_apart_and_nothing_else_of_it() {
        use crate::export_to::Withheld;
        use crate::labels::MIRRORED_SERVICE_LABEL as MIRRORED;
        use crate::mcs::EXPORT_TO_ANNOTATION as TO;
        const MEMBER: (&str, &str) = ("mirror.linkerd.io/federated", "member");
        let policy = ExportPolicy {
            federated: Some(selector(MEMBER.0, MEMBER.1)),
            local_cluster: Some("east".into()),
            ..selectors_policy()
        };
        let invalid = |d: &ExportDecision| {
            matches!(
                d,
                ExportDecision::Withheld(Withheld::Invalid(_))
                    | ExportDecision::InvalidMemberExportTo(_)
            )
        };
        type Labels = &'static [(&'static str, &'static str)];
        // (what, labels, export-to, withheld as invalid)
        let cases: &[(&str, Labels, Option<&str>, bool)] = &[
            ("member, invalid list", &[MEMBER], Some("<script>"), true),
            (
                "member, listing another cluster",
                &[MEMBER],
                Some("west"),
                false,
            ),
            ("member, listing this one", &[MEMBER], Some("east"), false),
            ("member, no list", &[MEMBER], None, false),
            ("not a member, invalid list", &[], Some("<script>"), false),
            (
                "a mirror, invalid list",
                &[MEMBER, (MIRRORED, "web")],
                Some("<script>"),
                false,
            ),
            (
                "member and exported, invalid list",
                &[MEMBER, EXPORT],
                Some("<script>"),
                true,
            ),
        ];
        for (what, labels, to, want) in cases {
            let annotations: Vec<(&str, &str)> = to.iter().map(|t| (TO, *t)).collect();
            let s = labelled("shop", labels, &annotations, Some(1));
            let d = export_decision(&s, &policy);
            assert_eq!(invalid(&d), *want, "{what}: {d:?}");
            let exported = labels.contains(&EXPORT);
            if !want && !exported {
                assert_eq!(d, ExportDecision::NotExported, "{what}");
            }
            if *want {
                // Mirrored: withheld as any mirrored Service; else the member's own.
                let member = matches!(d, ExportDecision::InvalidMemberExportTo(_));
                assert_eq!(member, !exported, "{what}: {d:?}");
            }
        }
        // Without a federation (no selector), a member is nothing to this link.
        let s = labelled("shop", &[MEMBER], &[(TO, "<script>")], Some(1));
        let unfederated = ExportPolicy {
            federated: None,
            ..policy
        };
        assert_eq!(
            export_decision(&s, &unfederated),
            ExportDecision::NotExported
        );
    }

    /// `service-mirror.io/export-to` narrows every export rule, after the namespace and
    /// the selection and before a refusal: a Service kept from this cluster is withheld
    /// (its mirror goes), whatever else is wrong with it.
    #[test]
    fn export_to_narrows_every_rule_after_selection_and_before_refusal() {
        use crate::export_to::Withheld;
        use crate::mcs::EXPORT_TO_ANNOTATION as TO;
        let named = |local: Option<&str>, policy: ExportPolicy| ExportPolicy {
            local_cluster: local.map(str::to_owned),
            ..policy
        };
        fn annotated(to: &str) -> [(&'static str, &str); 3] {
            [
                (GATEWAY_NAME_ANNOTATION, "gw"),
                (GATEWAY_NS_ANNOTATION, "mc"),
                (TO, to),
            ]
        }
        let gw = GatewayRef::new("mc", "gw");
        // (what, service, this cluster, policy, decision)
        let cases: Vec<(&str, Service, Option<&str>, ExportPolicy, ExportDecision)> = vec![
            (
                "selected and listed",
                labelled("shop", &[EXPORT], &[(TO, "west,east")], Some(1)),
                Some("east"),
                selectors_policy(),
                ExportDecision::Mirror(link_gw()),
            ),
            (
                "selected, not listed",
                labelled("shop", &[EXPORT], &[(TO, "west")], Some(1)),
                Some("east"),
                selectors_policy(),
                ExportDecision::Withheld(Withheld::NotListed),
            ),
            (
                "remote discovery, not listed",
                labelled("shop", &[DISCOVERY], &[(TO, "west")], Some(1)),
                Some("east"),
                selectors_policy(),
                ExportDecision::Withheld(Withheld::NotListed),
            ),
            (
                "remote discovery, listed",
                labelled("shop", &[DISCOVERY], &[(TO, "east")], Some(1)),
                Some("east"),
                selectors_policy(),
                ExportDecision::RemoteDiscovery,
            ),
            (
                "not selected: not exported, the annotation means nothing",
                labelled("shop", &[], &[(TO, "Bad_Name")], Some(1)),
                Some("east"),
                selectors_policy(),
                ExportDecision::NotExported,
            ),
            (
                "a denied namespace: not exported",
                labelled("kube-system", &[EXPORT], &[(TO, "west")], Some(1)),
                Some("east"),
                selectors_policy(),
                ExportDecision::NotExported,
            ),
            (
                "portless and not listed: withheld, not refused (not this cluster's business)",
                labelled("shop", &[EXPORT], &[(TO, "west")], None),
                Some("east"),
                selectors_policy(),
                ExportDecision::Withheld(Withheld::NotListed),
            ),
            (
                "portless and listed: refused here",
                labelled("shop", &[EXPORT], &[(TO, "east")], None),
                Some("east"),
                selectors_policy(),
                ExportDecision::Refused {
                    gateway: link_gw(),
                    reason: Refusal::NoPorts,
                },
            ),
            (
                "an invalid list: no cluster, even one it names",
                labelled("shop", &[EXPORT], &[(TO, "east,Bad_Name")], Some(1)),
                Some("east"),
                selectors_policy(),
                ExportDecision::Withheld(Withheld::Invalid(
                    "not valid cluster names: Bad_Name".into(),
                )),
            ),
            (
                "this cluster has no name: a narrowed Service is not mirrored",
                labelled("shop", &[EXPORT], &[(TO, "east")], Some(1)),
                None,
                selectors_policy(),
                ExportDecision::Withheld(Withheld::NoClusterName),
            ),
            (
                "no name and no annotation: mirrored as ever",
                labelled("shop", &[EXPORT], &[], Some(1)),
                None,
                selectors_policy(),
                ExportDecision::Mirror(link_gw()),
            ),
            (
                "a Secret link's export, listed",
                svc("shop", &annotated("east"), Some(1)),
                Some("east"),
                ExportPolicy::default(),
                ExportDecision::Mirror(gw.clone()),
            ),
            (
                "a Secret link's export, not listed",
                svc("shop", &annotated("north"), Some(1)),
                Some("east"),
                ExportPolicy::default(),
                ExportDecision::Withheld(Withheld::NotListed),
            ),
            (
                "an empty list: no cluster",
                svc("shop", &annotated(""), Some(1)),
                Some("east"),
                ExportPolicy::default(),
                ExportDecision::Withheld(Withheld::NotListed),
            ),
        ];
        for (what, service, local, policy, want) in cases {
            let got = export_decision(&service, &named(local, policy));
            assert_eq!(got, want, "{what}");
            assert_eq!(
                got.gateway().is_some(),
                matches!(
                    want,
                    ExportDecision::Mirror(_) | ExportDecision::Refused { .. }
                )
            );
        }
    }

    fn exported_with(name: &str, ns: &str, ports: serde_json::Value) -> Service {
        let mut s: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"ports": ports},
        }))
        .unwrap();
        s.metadata.annotations = Some(
            EXPORTED
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s
    }

    #[test]
    fn what_a_hostile_remote_sends_and_an_apiserver_would_refuse_is_refused_by_its_reason() {
        use serde_json::json;
        let http = json!([{"name": "http", "port": 80}]);
        let (long, too_long, long_ns) = ("a".repeat(63), "a".repeat(64), "s".repeat(64));
        let cases = [
            // (name, namespace, ports, refusal)
            ("web", "shop", http.clone(), None),
            ("w", "shop", json!([{"port": 8080}]), None),
            (long.as_str(), "shop", http.clone(), None),
            (
                "web",
                "shop",
                json!([{"name": "a", "port": 80, "protocol": "UDP"}, {"name": "b", "port": 80, "protocol": "SCTP"}]),
                None,
            ),
            (
                "web",
                "shop",
                json!([{"name": "a", "port": 80, "targetPort": "http-alt"}, {"name": "b", "port": 81, "targetPort": 9000}]),
                None,
            ),
            ("web", "shop", json!([]), Some(Refusal::NoPorts)),
            (
                "ünïcødé-☃",
                "shop",
                http.clone(),
                Some(Refusal::InvalidName),
            ),
            ("Web", "shop", http.clone(), Some(Refusal::InvalidName)),
            ("1web", "shop", http.clone(), Some(Refusal::InvalidName)),
            ("web-", "shop", http.clone(), Some(Refusal::InvalidName)),
            (
                too_long.as_str(),
                "shop",
                http.clone(),
                Some(Refusal::InvalidName),
            ),
            ("web", "Shop", http.clone(), Some(Refusal::InvalidName)),
            (
                "web",
                long_ns.as_str(),
                http.clone(),
                Some(Refusal::InvalidName),
            ),
            (
                "web",
                "shop",
                json!([{"name": "a", "port": 0}]),
                Some(Refusal::InvalidPorts),
            ),
            (
                "web",
                "shop",
                json!([{"name": "a", "port": 70000}]),
                Some(Refusal::InvalidPorts),
            ),
            (
                "web",
                "shop",
                json!([{"name": "a", "port": 80}, {"name": "a", "port": 81}]),
                Some(Refusal::InvalidPorts),
            ),
            (
                "web",
                "shop",
                json!([{"port": 80}, {"port": 81}]),
                Some(Refusal::InvalidPorts),
            ),
            (
                "web",
                "shop",
                json!([{"name": "HTTP", "port": 80}]),
                Some(Refusal::InvalidPorts),
            ),
            (
                "web",
                "shop",
                json!([{"name": "a", "port": 80, "protocol": "ICMP"}]),
                Some(Refusal::InvalidPorts),
            ),
            (
                "web",
                "shop",
                json!([{"name": "a", "port": 80, "targetPort": 70000}]),
                Some(Refusal::InvalidPorts),
            ),
            (
                "web",
                "shop",
                json!([{"name": "a", "port": 80, "targetPort": "a-very-long-port-name"}]),
                Some(Refusal::InvalidPorts),
            ),
            (
                "web",
                "shop",
                json!([{"name": "a", "port": 80, "targetPort": "8080"}]),
                Some(Refusal::InvalidPorts),
            ),
        ];
        let policy = ExportPolicy::default();
        let gw = GatewayRef::new("mc", "gw");
        for (name, ns, ports, want) in cases {
            let got = export_decision(&exported_with(name, ns, ports.clone()), &policy);
            let want = match want {
                None => ExportDecision::Mirror(gw.clone()),
                Some(reason) => ExportDecision::Refused {
                    gateway: gw.clone(),
                    reason,
                },
            };
            assert_eq!(got, want, "{name} in {ns} with {ports}");
        }
    }
}
