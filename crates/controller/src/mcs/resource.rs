//! The ServiceExport object as this controller reads it (v1beta1) and the status it
//! applies. kube's `derive` feature is off: [`kube::Resource`] by hand, as for `Link`.
//! Every field is optional, so that one odd export cannot stop a watch of all of them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::ObjectMeta;
use kube::core::NamespaceResourceScope;
use serde::{Deserialize, Serialize};
use service_mirror_core::mcs::GROUP;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// Kind of the export resource.
pub const SERVICE_EXPORT_KIND: &str = "ServiceExport";
/// Plural (resource) name of the export resource, as in RBAC rules.
pub const SERVICE_EXPORT_PLURAL: &str = "serviceexports";

/// A ServiceExport: the Service of the same namespace and name is exported.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ServiceExport {
    /// Standard metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What it exports besides the Service.
    #[serde(default)]
    pub spec: ServiceExportSpec,
    /// The exporting cluster's conditions.
    #[serde(default)]
    pub status: Option<ServiceExportStatus>,
}

/// `spec` of a ServiceExport.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceExportSpec {
    /// Labels the ServiceImport carries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exported_labels: Option<BTreeMap<String, String>>,
    /// Annotations the ServiceImport carries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exported_annotations: Option<BTreeMap<String, String>>,
}

/// `status` of a ServiceExport.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

impl kube::Resource for ServiceExport {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        SERVICE_EXPORT_KIND.into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        super::VERSION.into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        SERVICE_EXPORT_PLURAL.into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Kind of the import resource.
pub const SERVICE_IMPORT_KIND: &str = "ServiceImport";
/// Plural (resource) name of the import resource, as in RBAC rules.
pub const SERVICE_IMPORT_PLURAL: &str = "serviceimports";

/// A ServiceImport: a Service of the cluster set, as this cluster imports it. Every
/// field optional on read (a foreign one may say anything); written whole by us.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImport {
    /// `multicluster.x-k8s.io/v1beta1` when we write it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `ServiceImport` when we write it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Standard metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The imported Service.
    #[serde(default)]
    pub spec: ServiceImportSpec,
    /// The exporting clusters (a subresource: written apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// `spec` of a ServiceImport.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
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
    pub session_affinity_config: Option<k8s_openapi::api::core::v1::SessionAffinityConfig>,
    /// `Cluster` or `Local`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal_traffic_policy: Option<String>,
    /// E.g. `PreferClose`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_distribution: Option<String>,
}

/// A port of a ServiceImport.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

impl kube::Resource for ServiceImport {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        SERVICE_IMPORT_KIND.into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        super::VERSION.into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        SERVICE_IMPORT_PLURAL.into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The server-side apply body of an export's status: only our condition types, so
/// that the apiserver keeps every other writer's (the list is a map keyed by type),
/// with the resourceVersion the judgement was made on as a precondition (a 409 if the
/// export changed or was made again since). Not the uid: a status write takes the
/// stored object's metadata, so a uid in the body is no precondition.
pub fn status_apply(export: &ServiceExport, conditions: &[Condition]) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": format!("{GROUP}/{}", super::VERSION),
        "kind": SERVICE_EXPORT_KIND,
        "metadata": {
            "name": export.metadata.name,
            "namespace": export.metadata.namespace,
            "resourceVersion": export.metadata.resource_version,
        },
        "status": { "conditions": conditions },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_decodes_with_or_without_spec_and_status() {
        let bare: ServiceExport = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "hello", "namespace": "shop"}
        }))
        .unwrap();
        assert_eq!(bare.spec, ServiceExportSpec::default());
        assert!(bare.conditions().is_empty());
        let full: ServiceExport = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "hello", "namespace": "shop"},
            "spec": {"exportedLabels": {"a": "1"}},
            "status": {"conditions": [{
                "type": "Valid", "status": "True", "reason": "Valid", "message": "",
                "lastTransitionTime": "2026-12-02T10:00:00Z"
            }]}
        }))
        .unwrap();
        assert_eq!(
            full.spec.exported_labels,
            Some(BTreeMap::from([("a".into(), "1".into())]))
        );
        assert_eq!(full.conditions().len(), 1);
    }

    #[test]
    fn the_status_body_names_the_resource_version_and_only_the_given_conditions() {
        let export = ServiceExport {
            metadata: ObjectMeta {
                name: Some("hello".into()),
                namespace: Some("shop".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let body = status_apply(&export, &[]);
        assert_eq!(body["apiVersion"], "multicluster.x-k8s.io/v1beta1");
        assert_eq!(body["metadata"]["resourceVersion"], "42");
        assert!(body["metadata"].get("uid").is_none());
        assert_eq!(body["status"]["conditions"], serde_json::json!([]));
        assert!(body.get("spec").is_none(), "status only: {body}");
    }
}
