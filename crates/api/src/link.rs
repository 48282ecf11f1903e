//! Linkerd's `Link` custom resource (`links.multicluster.linkerd.io`): [`Link`] is
//! v1alpha3, the version this controller reads and writes (the CRD's storage version);
//! [`v1alpha1::Link`] and [`v1alpha2::Link`] are the other served versions, the same
//! schema (no conversion webhook: the CRD serves one schema, a superset of each of
//! Linkerd's).
//!
//! Every spec field is optional: a half-written Link still decodes (an absent spec is
//! the empty one), and the controller's `parse_link` names what is missing instead of
//! the watch failing to decode it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of the `Link` resource.
pub const LINK_GROUP: &str = "multicluster.linkerd.io";
/// Version this controller reads and writes (the CRD's storage version).
pub const LINK_VERSION: &str = "v1alpha3";
/// Every served version, oldest first.
pub const LINK_VERSIONS: [&str; 3] = ["v1alpha1", "v1alpha2", "v1alpha3"];
/// Kind of the resource.
pub const LINK_KIND: &str = "Link";
/// Plural (resource) name, as in RBAC rules and URLs.
pub const LINK_PLURAL: &str = "links";
/// Name of the CRD.
pub const LINK_CRD_NAME: &str = "links.multicluster.linkerd.io";
/// The CRD: versions v1alpha1, v1alpha2 and v1alpha3 (storage), one schema that is a
/// superset of each of Linkerd's, with the status subresource.
pub const LINK_CRD_YAML: &str = include_str!("../crds/link-crd.yaml");

/// The Link's `spec`: one remote cluster, its credentials, gateway and selectors.
/// Numbers and durations are strings, as in Linkerd's CRD.
///
/// Decoding never fails on a selector: the CRD leaves `matchLabels` open (as
/// Linkerd's), so `mirror.linkerd.io/exported: true` written unquoted is stored as a
/// boolean; such a selector decodes as unset and is listed in
/// [`undecodable`](Self::undecodable), so that one bad Link cannot stop a watch of all
/// of them, and `parse_link` refuses it by name.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, JsonSchema)]
#[kube(
    group = "multicluster.linkerd.io",
    version = "v1alpha3",
    kind = "Link",
    namespaced,
    status = "LinkResourceStatus",
    derive = "Default",
    derive = "PartialEq",
    crates(kube_core = "::kube_core")
)]
#[serde(rename_all = "camelCase")]
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

/// Decoded through [`RawLinkResourceSpec`] (selectors still untyped); an absent or
/// `null` spec is the empty one.
impl<'de> Deserialize<'de> for LinkResourceSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Option::<RawLinkResourceSpec>::deserialize(d)?
            .map(Self::from)
            .unwrap_or_default())
    }
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    pub conditions: Vec<Condition>,
}

/// The status of one remote Service, as one controller sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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

/// Declares the older served version `$version`: the v1alpha3 spec and status under
/// that version (the CRD serves one schema to every version, without conversion).
macro_rules! served_version {
    ($module:ident, $version:literal) => {
        #[doc = concat!("`Link` as served at ", $version, ": the same schema as v1alpha3.")]
        pub mod $module {
            use super::{LinkResourceSpec, LinkResourceStatus};
            use kube_derive::CustomResource;
            use schemars::JsonSchema;
            use serde::{Deserialize, Serialize};

            #[doc = concat!("The ", $version, " spec: the v1alpha3 one, field for field.")]
            #[derive(
                CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema,
            )]
            #[kube(
                group = "multicluster.linkerd.io",
                version = $version,
                kind = "Link",
                namespaced,
                status = "LinkResourceStatus",
                derive = "Default",
                derive = "PartialEq",
                crates(kube_core = "::kube_core")
            )]
            #[serde(transparent)]
            pub struct LinkSpec(pub LinkResourceSpec);
        }
    };
}

served_version!(v1alpha1, "v1alpha1");
served_version!(v1alpha2, "v1alpha2");

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
