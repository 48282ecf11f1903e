//! The ServiceExport and ServiceImport types, derived in the api crate
//! (`service_mirror_api::mcs`, re-exported here), and the status this controller
//! applies to an export.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
pub use service_mirror_api::mcs::{
    ClusterStatus, SERVICE_EXPORT_KIND, SERVICE_EXPORT_PLURAL, SERVICE_IMPORT_KIND,
    SERVICE_IMPORT_PLURAL, ServiceExport, ServiceExportSpec, ServiceExportStatus, ServiceImport,
    ServiceImportPort, ServiceImportSpec, ServiceImportStatus,
};
use service_mirror_core::mcs::GROUP;

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
    use kube::api::ObjectMeta;

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
