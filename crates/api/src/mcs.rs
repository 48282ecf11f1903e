//! The Multi-Cluster Services API (KEP-1645, `multicluster.x-k8s.io`): `ServiceExport`
//! and `ServiceImport` at v1beta1, the version the conformance suite and current
//! implementations use; v1alpha1 is served too, with the same schema (no conversion).
//!
//! Every field is optional on read, so that one odd object (a foreign ServiceImport, a
//! ServiceExport written without a spec, the usual form) cannot stop a watch of all of
//! them; the CRD YAML requires more of a writer (see the `schema_check` tests).

use crate::absent_is_default;
use k8s_openapi::api::core::v1::SessionAffinityConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The API group.
pub const GROUP: &str = "multicluster.x-k8s.io";
/// The version the conformance suite and current implementations use.
pub const VERSION: &str = "v1beta1";
/// Every served version: the same schema, no conversion.
pub const SERVED_VERSIONS: [&str; 2] = ["v1alpha1", "v1beta1"];
/// Kind of the export resource.
pub const SERVICE_EXPORT_KIND: &str = "ServiceExport";
/// Plural (resource) name of the export resource, as in RBAC rules.
pub const SERVICE_EXPORT_PLURAL: &str = "serviceexports";
/// Kind of the import resource.
pub const SERVICE_IMPORT_KIND: &str = "ServiceImport";
/// Plural (resource) name of the import resource, as in RBAC rules.
pub const SERVICE_IMPORT_PLURAL: &str = "serviceimports";
/// The ServiceExport CRD (v1alpha1 and v1beta1 served, v1beta1 stored).
pub const SERVICE_EXPORT_CRD_YAML: &str = include_str!("../crds/serviceexport-crd.yaml");
/// The ServiceImport CRD (v1alpha1 and v1beta1 served, v1beta1 stored).
pub const SERVICE_IMPORT_CRD_YAML: &str = include_str!("../crds/serviceimport-crd.yaml");
/// Name of the ServiceExport CRD.
pub const SERVICE_EXPORT_CRD_NAME: &str = "serviceexports.multicluster.x-k8s.io";
/// Name of the ServiceImport CRD.
pub const SERVICE_IMPORT_CRD_NAME: &str = "serviceimports.multicluster.x-k8s.io";

/// `spec` of a ServiceExport: what it exports besides the Service of the same
/// namespace and name.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1beta1",
    kind = "ServiceExport",
    namespaced,
    status = "ServiceExportStatus",
    derive = "Default",
    derive = "PartialEq",
    crates(kube_core = "::kube_core")
)]
#[serde(remote = "Self", rename_all = "camelCase", default)]
pub struct ServiceExportSpec {
    /// Labels the ServiceImport carries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exported_labels: Option<BTreeMap<String, String>>,
    /// Annotations the ServiceImport carries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exported_annotations: Option<BTreeMap<String, String>>,
}
absent_is_default!(ServiceExportSpec);

/// `status` of a ServiceExport.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct ServiceExportStatus {
    /// `Valid`, `Ready`, `Conflict` and any other writer's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

impl ServiceExport {
    /// Its conditions (none when it has no status).
    pub fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
    }
}

/// `spec` of a ServiceImport: a Service of the cluster set, as this cluster imports
/// it. Every field optional on read (a foreign one may say anything); written whole by
/// us.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1beta1",
    kind = "ServiceImport",
    namespaced,
    status = "ServiceImportStatus",
    derive = "Default",
    derive = "PartialEq",
    crates(kube_core = "::kube_core")
)]
#[serde(remote = "Self", rename_all = "camelCase", default)]
pub struct ServiceImportSpec {
    /// `ClusterSetIP` or `Headless`.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The ports, without targetPort.
    pub ports: Vec<ServiceImportPort>,
    /// The cluster-set IPs (the derived Service's ClusterIPs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// The families of `ips`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ip_families: Vec<String>,
    /// `None` or `ClientIP`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<String>,
    /// The ClientIP timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_affinity_config: Option<SessionAffinityConfig>,
    /// `Cluster` or `Local`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal_traffic_policy: Option<String>,
    /// E.g. `PreferClose`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_distribution: Option<String>,
}
absent_is_default!(ServiceImportSpec);

/// A port of a ServiceImport.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceImportPort {
    /// The port's name (none for the one port of a single-port Service).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `TCP`, `UDP` or `SCTP`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// `appProtocol`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    /// The port number.
    pub port: i32,
}

/// `status` of a ServiceImport (a subresource: written apart from the object).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct ServiceImportStatus {
    /// The clusters exporting the Service.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterStatus>,
    /// Conditions of the import (none written by us).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One exporting cluster of a ServiceImport's status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct ClusterStatus {
    /// The cluster's name in its cluster set (empty: a foreign entry without one,
    /// which [`ServiceImport::clusters`] leaves out).
    pub cluster: String,
}

impl ServiceImport {
    /// The clusters its status lists, sorted (repeats kept: a list that has them is not
    /// the one we write), entries without a name left out.
    pub fn clusters(&self) -> Vec<String> {
        let mut clusters: Vec<String> = self
            .status
            .iter()
            .flat_map(|s| &s.clusters)
            .filter(|c| !c.cluster.is_empty())
            .map(|c| c.cluster.clone())
            .collect();
        clusters.sort();
        clusters
    }
}

#[cfg(test)]
#[path = "mcs_tests.rs"]
mod tests;
