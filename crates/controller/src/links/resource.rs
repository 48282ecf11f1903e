//! Linkerd's `Link` custom resource (`links.multicluster.linkerd.io`), read as
//! v1alpha3, and its CRD as this controller installs it.
//!
//! kube's `derive` feature is not enabled, so [`kube::Resource`] is implemented by
//! hand. Every spec field is optional: a half-written Link still decodes, and
//! [`parse_link`](super::parse_link) names what is missing instead of the watch
//! failing to decode it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::api::ObjectMeta;
use kube::core::NamespaceResourceScope;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// API group of the `Link` resource.
pub const LINK_GROUP: &str = "multicluster.linkerd.io";
/// Version this controller reads and writes (the CRD's storage version).
pub const LINK_VERSION: &str = "v1alpha3";
/// Kind of the resource.
pub const LINK_KIND: &str = "Link";
/// Plural (resource) name, as in RBAC rules and URLs.
pub const LINK_PLURAL: &str = "links";
/// Name of the CRD.
pub const LINK_CRD_NAME: &str = "links.multicluster.linkerd.io";
/// The CRD: versions v1alpha1, v1alpha2 and v1alpha3 (storage), one schema that is a
/// superset of each of Linkerd's, with the status subresource.
pub const LINK_CRD_YAML: &str = include_str!("link-crd.yaml");

/// A Linkerd `Link`: one remote cluster, its credentials, gateway and selectors.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Link {
    /// Standard metadata (the Link lives in the controller's namespace).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the Link asks for.
    #[serde(default)]
    pub spec: LinkResourceSpec,
    /// What the controllers that serve it report.
    #[serde(default)]
    pub status: Option<LinkResourceStatus>,
}

/// Wire form with `apiVersion` and `kind`: the apiserver requires them in a body.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LinkWire<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: &'a ObjectMeta,
    spec: &'a LinkResourceSpec,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: &'a Option<LinkResourceStatus>,
}

impl Serialize for Link {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        LinkWire {
            api_version: "multicluster.linkerd.io/v1alpha3",
            kind: LINK_KIND,
            metadata: &self.metadata,
            spec: &self.spec,
            status: &self.status,
        }
        .serialize(s)
    }
}

impl kube::Resource for Link {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        LINK_KIND.into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        LINK_GROUP.into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        LINK_VERSION.into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        LINK_PLURAL.into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The Link's `spec`. Numbers and durations are strings, as in Linkerd's CRD.
///
/// Decoding never fails on a selector: the CRD leaves `matchLabels` open (as
/// Linkerd's), so `mirror.linkerd.io/exported: true` written unquoted is stored as a
/// boolean; such a selector decodes as unset and is listed in
/// [`undecodable`](Self::undecodable), so that one bad Link cannot stop a watch of all
/// of them, and [`parse_link`](super::parse_link) refuses it by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, from = "RawLinkResourceSpec")]
pub struct LinkResourceSpec {
    /// Name of the remote cluster: the suffix of its mirrors' names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_cluster_name: Option<String>,
    /// The remote cluster's DNS domain (default `cluster.local`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_cluster_domain: Option<String>,
    /// Namespace of Linkerd's control plane on the remote (informational here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_cluster_linkerd_namespace: Option<String>,
    /// Secret, in the Link's namespace, whose `kubeconfig` reaches the remote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_credentials_secret: Option<String>,
    /// Comma-separated gateway IPs and hostnames; empty: no gateway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_address: Option<String>,
    /// Port of every gateway endpoint, decimal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_port: Option<String>,
    /// TLS identity of the gateway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_identity: Option<String>,
    /// How the gateway is probed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_spec: Option<LinkProbeSpec>,
    /// Services mirrored through the gateway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Services mirrored without endpoints (remote discovery).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_discovery_selector: Option<LabelSelector>,
    /// Members of federated Services.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub federated_service_selector: Option<LabelSelector>,
    /// Remote annotations not copied to mirrors (exact keys or `prefix/*`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub excluded_annotations: Option<Vec<String>>,
    /// Remote labels not copied to mirrors (exact keys or `prefix/*`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub excluded_labels: Option<Vec<String>>,
    /// Selectors stored but not decodable: (`selector`, `remoteDiscoverySelector` or
    /// `federatedServiceSelector`, why). Never serialised.
    #[serde(skip)]
    pub undecodable: Vec<(&'static str, String)>,
}

/// The spec as stored, selectors still untyped.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawLinkResourceSpec {
    target_cluster_name: Option<String>,
    target_cluster_domain: Option<String>,
    target_cluster_linkerd_namespace: Option<String>,
    cluster_credentials_secret: Option<String>,
    gateway_address: Option<String>,
    gateway_port: Option<String>,
    gateway_identity: Option<String>,
    probe_spec: Option<LinkProbeSpec>,
    selector: Option<serde_json::Value>,
    remote_discovery_selector: Option<serde_json::Value>,
    federated_service_selector: Option<serde_json::Value>,
    excluded_annotations: Option<Vec<String>>,
    excluded_labels: Option<Vec<String>>,
}

impl From<RawLinkResourceSpec> for LinkResourceSpec {
    fn from(raw: RawLinkResourceSpec) -> Self {
        let mut undecodable = Vec::new();
        let mut selector = |which, value: Option<serde_json::Value>| {
            serde_json::from_value::<Option<LabelSelector>>(value.unwrap_or_default())
                .unwrap_or_else(|e| {
                    undecodable.push((which, e.to_string()));
                    None
                })
        };
        let selector_ = selector("selector", raw.selector);
        let remote_discovery_selector =
            selector("remoteDiscoverySelector", raw.remote_discovery_selector);
        let federated_service_selector =
            selector("federatedServiceSelector", raw.federated_service_selector);
        LinkResourceSpec {
            target_cluster_name: raw.target_cluster_name,
            target_cluster_domain: raw.target_cluster_domain,
            target_cluster_linkerd_namespace: raw.target_cluster_linkerd_namespace,
            cluster_credentials_secret: raw.cluster_credentials_secret,
            gateway_address: raw.gateway_address,
            gateway_port: raw.gateway_port,
            gateway_identity: raw.gateway_identity,
            probe_spec: raw.probe_spec,
            selector: selector_,
            remote_discovery_selector,
            federated_service_selector,
            excluded_annotations: raw.excluded_annotations,
            excluded_labels: raw.excluded_labels,
            undecodable,
        }
    }
}

/// The Link's `probeSpec`: strings, as Linkerd writes them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LinkProbeSpec {
    /// HTTP path of the gateway's health endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Port of the health endpoint, decimal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    /// Time between probes, a Go duration (`3s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    /// Time a probe may take, a Go duration (`30s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Consecutive failures before the gateway counts as dead, decimal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<String>,
}

/// The Link's `status`: one entry per mirrored (or federated) remote Service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LinkResourceStatus {
    /// Services mirrored by this Link.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mirror_services: Vec<LinkServiceStatus>,
    /// Federated Services this Link contributes to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub federated_services: Vec<LinkServiceStatus>,
    /// The Link itself (ours; Linkerd's CRD has no such field and prunes it): `Ready`,
    /// with the reason a Link is refused.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// The status of one remote Service, as one controller sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LinkServiceStatus {
    /// Who wrote this entry (`domain/path`), so controllers leave each other's alone.
    pub controller_name: String,
    /// The remote Service.
    pub remote_ref: LinkObjectRef,
    /// Its conditions (`Mirrored`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<LinkCondition>,
}

/// A reference to an object (remote or local), as in Linkerd's status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LinkObjectRef {
    /// API group (`core` or empty for Services).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// Kind (`Service`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
}

/// One condition of a Service's status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LinkCondition {
    /// Condition type (`Mirrored`).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// When `status` last changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// When the condition was last checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    /// PascalCase reason (`Mirrored`, `InvalidService`, `Error`, `MissingNamespace`).
    pub reason: String,
    /// Human-readable detail.
    pub message: String,
    /// The local mirror this condition is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_ref: Option<LinkObjectRef>,
}

/// `conditions` with `condition` in place of the one of its type (or added last): a
/// merge patch replaces the whole list, so each writer of a Link's conditions (`Ready`,
/// `RemoteReachable`) writes the others back as it read them.
pub(crate) fn with_condition(
    mut conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    condition: k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(c) => *c = condition,
        None => conditions.push(condition),
    }
    conditions
}

/// Writes one condition of Link `name` with a merge patch of its status, keeping every
/// other condition (a merge patch replaces the whole list) and carrying the
/// resourceVersion read, retried up to 3 times on 409. `make` gets the condition of
/// that type as read and the Link's generation, and says what to write (`None`:
/// nothing, it is as wanted). `get` on links: the installed Role grants no `get` on
/// links/status. Ok(true) when written.
pub(crate) async fn write_condition(
    api: &kube::Api<Link>,
    name: &str,
    type_: &str,
    make: impl Fn(
        Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
        Option<i64>,
    ) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
) -> Result<bool, kube::Error> {
    use kube::api::{Patch, PatchParams};
    for _ in 0..3 {
        let current = api.get(name).await?;
        let conditions = current.status.map(|s| s.conditions).unwrap_or_default();
        let old = conditions.iter().find(|c| c.type_ == type_);
        let Some(condition) = make(old, current.metadata.generation) else {
            return Ok(false);
        };
        let body = serde_json::json!({
            "metadata": { "resourceVersion": current.metadata.resource_version },
            "status": { "conditions": with_condition(conditions, condition) },
        });
        let params = PatchParams {
            field_manager: Some(crate::writer::FIELD_MANAGER.into()),
            ..Default::default()
        };
        match api.patch_status(name, &params, &Patch::Merge(&body)).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;
    use serde_json::json;

    #[test]
    fn the_resource_is_namespaced_links_in_multicluster_linkerd_io_v1alpha3() {
        assert_eq!(Link::api_version(&()), "multicluster.linkerd.io/v1alpha3");
        assert_eq!(
            Link::url_path(&(), Some("mc")),
            "/apis/multicluster.linkerd.io/v1alpha3/namespaces/mc/links"
        );
        assert_eq!(Link::kind(&()), "Link");
        assert_eq!(
            LINK_CRD_NAME,
            format!("{LINK_PLURAL}.{LINK_GROUP}"),
            "the CRD name is plural.group"
        );
    }

    #[test]
    fn a_link_gen_link_decodes_field_by_field() {
        let link: Link = serde_json::from_value(json!({
            "apiVersion": "multicluster.linkerd.io/v1alpha3",
            "kind": "Link",
            "metadata": {"name": "east", "namespace": "linkerd-multicluster"},
            "spec": {
                "targetClusterName": "east",
                "targetClusterDomain": "cluster.local",
                "targetClusterLinkerdNamespace": "linkerd",
                "clusterCredentialsSecret": "cluster-credentials-east",
                "gatewayAddress": "10.0.0.1,gw.example.com",
                "gatewayPort": "4143",
                "gatewayIdentity": "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local",
                "probeSpec": {"path": "/ready", "port": "4191", "period": "3s",
                              "timeout": "30s", "failureThreshold": "3"},
                "selector": {"matchLabels": {"mirror.linkerd.io/exported": "true"}},
                "remoteDiscoverySelector": {"matchLabels": {"mirror.linkerd.io/exported": "remote-discovery"}},
                "federatedServiceSelector": {"matchLabels": {"mirror.linkerd.io/federated": "member"}},
                "excludedAnnotations": ["a/*"],
                "excludedLabels": ["b"],
            },
        }))
        .unwrap();
        let s = &link.spec;
        assert_eq!(s.target_cluster_name.as_deref(), Some("east"));
        assert_eq!(
            s.target_cluster_linkerd_namespace.as_deref(),
            Some("linkerd")
        );
        assert_eq!(s.gateway_port.as_deref(), Some("4143"));
        let probe = s.probe_spec.as_ref().unwrap();
        assert_eq!(probe.failure_threshold.as_deref(), Some("3"));
        assert_eq!(probe.timeout.as_deref(), Some("30s"));
        assert!(s.federated_service_selector.is_some());
        assert_eq!(
            s.excluded_annotations.as_deref(),
            Some(&["a/*".to_string()][..])
        );
        assert_eq!(link.status, None);
    }

    #[test]
    fn a_half_written_link_still_decodes() {
        for doc in [
            json!({"metadata": {"name": "x"}}),
            json!({"metadata": {"name": "x"}, "spec": {}}),
            json!({"metadata": {"name": "x"}, "spec": {"probeSpec": {}}, "status": {}}),
        ] {
            let link: Link = serde_json::from_value(doc.clone()).unwrap();
            assert_eq!(link.spec.target_cluster_name, None, "{doc}");
        }
    }

    #[test]
    fn a_selector_that_does_not_decode_leaves_the_link_decodable_and_is_named() {
        let link: Link = serde_json::from_value(json!({
            "metadata": {"name": "x"},
            "spec": {
                "targetClusterName": "east",
                "selector": {"matchLabels": {"mirror.linkerd.io/exported": true}},
                "remoteDiscoverySelector": {"matchLabels": {"a": "b"}},
                "federatedServiceSelector": "not an object",
            },
        }))
        .unwrap();
        assert_eq!(link.spec.target_cluster_name.as_deref(), Some("east"));
        assert_eq!(link.spec.selector, None);
        assert!(link.spec.remote_discovery_selector.is_some());
        assert_eq!(link.spec.federated_service_selector, None);
        let which: Vec<&str> = link.spec.undecodable.iter().map(|(w, _)| *w).collect();
        assert_eq!(which, ["selector", "federatedServiceSelector"]);
        assert!(
            link.spec.undecodable[0].1.contains("boolean"),
            "{:?}",
            link.spec.undecodable
        );
        let v = serde_json::to_value(&link).unwrap();
        assert!(v["spec"].get("undecodable").is_none(), "{v}");
    }

    #[test]
    fn serialising_writes_api_version_and_kind_and_round_trips() {
        let mut link = Link::default();
        link.metadata.name = Some("east".into());
        link.spec.gateway_port = Some("4143".into());
        link.status = Some(LinkResourceStatus {
            mirror_services: vec![LinkServiceStatus {
                controller_name: "linkerd.io/service-mirror".into(),
                remote_ref: LinkObjectRef {
                    group: String::new(),
                    kind: "Service".into(),
                    name: "web".into(),
                    namespace: "shop".into(),
                },
                conditions: vec![LinkCondition {
                    type_: "Mirrored".into(),
                    status: "True".into(),
                    reason: "Mirrored".into(),
                    local_ref: Some(LinkObjectRef {
                        name: "web-east".into(),
                        namespace: "shop".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
            }],
            federated_services: vec![],
            conditions: vec![],
        });
        let v = serde_json::to_value(&link).unwrap();
        assert_eq!(v["apiVersion"], "multicluster.linkerd.io/v1alpha3");
        assert_eq!(v["kind"], "Link");
        assert_eq!(v["spec"], json!({"gatewayPort": "4143"}));
        let cond = &v["status"]["mirrorServices"][0]["conditions"][0];
        assert_eq!(cond["type"], "Mirrored");
        assert!(
            cond.get("lastProbeTime").is_none(),
            "unset times are omitted"
        );
        assert!(v["status"].get("federatedServices").is_none());
        let back: Link = serde_json::from_value(v).unwrap();
        assert_eq!(back, link);
    }

    #[test]
    fn no_status_is_omitted_not_null() {
        let v = serde_json::to_value(Link::default()).unwrap();
        assert!(v.get("status").is_none(), "{v}");
    }

    #[test]
    fn a_condition_replaces_its_type_and_keeps_the_others_in_order() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let c = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        let types = |v: &[Condition]| {
            v.iter()
                .map(|c| format!("{}={}", c.type_, c.status))
                .collect::<Vec<_>>()
        };
        // (conditions before, the one written, conditions after).
        type Case<'a> = (&'a [(&'a str, &'a str)], (&'a str, &'a str), &'a [&'a str]);
        let cases: &[Case] = &[
            (&[], ("Ready", "True"), &["Ready=True"]),
            (
                &[("Ready", "True")],
                ("RemoteReachable", "False"),
                &["Ready=True", "RemoteReachable=False"],
            ),
            (
                &[("Ready", "True"), ("RemoteReachable", "False")],
                ("Ready", "False"),
                &["Ready=False", "RemoteReachable=False"],
            ),
            (
                &[("Ready", "True"), ("RemoteReachable", "False")],
                ("RemoteReachable", "True"),
                &["Ready=True", "RemoteReachable=True"],
            ),
        ];
        for (before, (t, st), want) in cases {
            let list = before.iter().map(|(t, s)| c(t, s)).collect();
            assert_eq!(types(&with_condition(list, c(t, st))), *want, "{before:?}");
        }
    }
}
