//! The export rule: which remote Services are mirrored, and through which gateway.
//!
//! One function decides it for everyone who asks (the event mapping that indexes
//! gateways, reconcile, and the test oracle's reading of the contract), so the rule
//! cannot drift between them. Secret links use the 2020 contract's pair of gateway
//! annotations; Linkerd's `Link` resources select by label, through the Link's one
//! gateway.

use k8s_openapi::api::core::v1::Service;

use super::gateway::{GatewayRef, exported_gateway};
use super::namespaces::NamespaceFilter;
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
}

/// Why an exported Service is not mirrored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No ports: a ClusterIP mirror Service needs at least one.
    NoPorts,
}

impl Refusal {
    /// Bounded label for metrics and logs.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::NoPorts => "unmirrorable",
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
}

impl ExportDecision {
    /// The gateway the Service names, mirrored or refused.
    pub fn gateway(&self) -> Option<&GatewayRef> {
        match self {
            ExportDecision::Mirror(gw) | ExportDecision::Refused { gateway: gw, .. } => Some(gw),
            ExportDecision::RemoteDiscovery | ExportDecision::NotExported => None,
        }
    }
}

/// Decides whether `service` is mirrored under `policy`.
pub fn export_decision(service: &Service, policy: &ExportPolicy) -> ExportDecision {
    let namespace = service.metadata.namespace.as_deref().unwrap_or_default();
    if !policy.namespaces.allows(namespace) {
        return ExportDecision::NotExported;
    }
    let gateway = match &policy.rule {
        ExportRule::GatewayAnnotations => exported_gateway(service),
        ExportRule::Selectors {
            export,
            remote_discovery,
            gateway,
        } => {
            let labels = service.metadata.labels.as_ref();
            if remote_discovery.matches(labels) {
                return match has_ports(service) {
                    true => ExportDecision::RemoteDiscovery,
                    false => ExportDecision::Refused {
                        gateway: gateway.clone(),
                        reason: Refusal::NoPorts,
                    },
                };
            }
            export.matches(labels).then(|| gateway.clone())
        }
    };
    let Some(gateway) = gateway else {
        return ExportDecision::NotExported;
    };
    if has_ports(service) {
        ExportDecision::Mirror(gateway)
    } else {
        ExportDecision::Refused {
            gateway,
            reason: Refusal::NoPorts,
        }
    }
}

fn has_ports(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .is_some_and(|p| !p.is_empty())
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
}
