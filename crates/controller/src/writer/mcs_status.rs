//! The one writer of the status of MCS objects: `status.clusters` of the component's
//! ServiceImports and our conditions of the local ServiceExports.
//!
//! Both are writes to the status subresource by our field manager, never forced, each
//! checked against the lead the moment before it is sent (`Error::NotLeader`
//! otherwise: the next leader judges every name) and counted like every other local
//! write, in `local_writes{verb="patch",resource="serviceimports/status"}` and
//! `{..,resource="serviceexports/status"}`. What an answer means (stale, gone,
//! refused) is the caller's (`mcs/write_errors.rs`): the apiserver's error comes back
//! as `Error::Kube`.
//!
//! - An import's status is a merge patch carrying the resourceVersion judged (a 409 if
//!   the import changed since), only on an import of ours (`is_owned_import`:
//!   `Error::OwnershipConflict` otherwise); the list is replaced whole.
//! - An export's status is a server-side apply of our condition types only (the
//!   apiserver keeps every other writer's: the list is a map keyed by type), with the
//!   resourceVersion judged as precondition (see `mcs::resource::status_apply`). The
//!   export is the user's: our part of it is those conditions, which the apply's field
//!   manager owns and another manager's ownership refuses (409, never forced).

use crate::error::{Error, Result};
use crate::leader::Leadership;
use crate::mcs::resource::{ServiceExport, ServiceImport, status_apply};
use crate::metrics::Metrics;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use service_mirror_core::mcs::EXPORT_CONDITION_TYPES;
use service_mirror_core::mcs_import::is_owned_import;
use std::sync::Arc;

/// The resource label of an import status write in `local_writes`.
const IMPORT_STATUS: &str = "serviceimports/status";
/// The resource label of an export status write in `local_writes`.
const EXPORT_STATUS: &str = "serviceexports/status";

/// The merge patch of an import's `status.clusters`, at resourceVersion `rv` (`None`:
/// no precondition).
pub(crate) fn import_status_patch(rv: Option<&str>, clusters: &[String]) -> serde_json::Value {
    let clusters: Vec<_> = clusters
        .iter()
        .map(|c| serde_json::json!({ "cluster": c }))
        .collect();
    serde_json::json!({
        "metadata": { "resourceVersion": rv },
        "status": { "clusters": clusters },
    })
}

/// The server-side apply body of `export`'s status: `conditions` of our types only
/// (any other is not ours to write, and is left out).
pub(crate) fn export_status_apply(
    export: &ServiceExport,
    conditions: &[Condition],
) -> serde_json::Value {
    let ours: Vec<Condition> = conditions
        .iter()
        .filter(|c| EXPORT_CONDITION_TYPES.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    status_apply(export, &ours)
}

/// Writes the status of MCS objects in the local cluster (cheap to clone).
#[derive(Clone)]
pub(crate) struct McsStatusWriter {
    client: Client,
    metrics: Arc<Metrics>,
    /// Whose ServiceImports are ours (their import mark names it).
    controller_namespace: String,
    /// Writes only while this says so; `None`: always.
    leader: Option<Leadership>,
}

impl std::fmt::Debug for McsStatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("McsStatusWriter")
    }
}

impl McsStatusWriter {
    /// The writer of the MCS component of `controller_namespace`, writing only while
    /// `leader` says so (`None`: always).
    pub(crate) fn new(
        client: Client,
        controller_namespace: &str,
        metrics: Arc<Metrics>,
        leader: Option<Leadership>,
    ) -> Self {
        Self {
            client,
            metrics,
            controller_namespace: controller_namespace.into(),
            leader,
        }
    }

    fn leading(&self) -> bool {
        self.leader.as_ref().is_none_or(Leadership::leading)
    }

    fn params(&self) -> PatchParams {
        PatchParams {
            field_manager: Some(super::FIELD_MANAGER.into()),
            force: false,
            ..Default::default()
        }
    }

    /// Writes `clusters` as the `status.clusters` of the import `import` names (its
    /// namespace and name), with its resourceVersion as precondition; `import` is the
    /// version judged (as cached, or as a create or replace just stored it), and must
    /// be ours.
    pub(crate) async fn import_clusters(
        &self,
        import: &ObjectMeta,
        clusters: &[String],
    ) -> Result<()> {
        if !is_owned_import(import, &self.controller_namespace) {
            return Err(Error::OwnershipConflict {
                kind: "ServiceImport".into(),
                namespace: import.namespace.clone().unwrap_or_default(),
                name: import.name.clone().unwrap_or_default(),
                uid: import.uid.clone(),
                cluster: "mcs".into(),
            });
        }
        if !self.leading() {
            return Err(Error::NotLeader);
        }
        let namespace = import.namespace.as_deref().unwrap_or_default();
        let api: Api<ServiceImport> = Api::namespaced(self.client.clone(), namespace);
        let body = import_status_patch(import.resource_version.as_deref(), clusters);
        self.metrics.writer.write("patch", IMPORT_STATUS);
        let name = import.name.as_deref().unwrap_or_default();
        api.patch_status(name, &self.params(), &Patch::Merge(&body))
            .await?;
        Ok(())
    }

    /// Applies our `conditions` to the status of `export` (as cached: its
    /// resourceVersion is the precondition); the export as stored after.
    pub(crate) async fn export_conditions(
        &self,
        export: &ServiceExport,
        conditions: &[Condition],
    ) -> Result<ServiceExport> {
        if !self.leading() {
            return Err(Error::NotLeader);
        }
        let namespace = export.metadata.namespace.as_deref().unwrap_or_default();
        let api: Api<ServiceExport> = Api::namespaced(self.client.clone(), namespace);
        let params = PatchParams::apply(super::FIELD_MANAGER);
        let body = Patch::Apply(export_status_apply(export, conditions));
        self.metrics.writer.write("patch", EXPORT_STATUS);
        let name = export.metadata.name.as_deref().unwrap_or_default();
        Ok(api.patch_status(name, &params, &body).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn an_import_status_patch_replaces_the_clusters_at_the_version_judged() {
        let cases: &[(Option<&str>, &[&str], serde_json::Value)] = &[
            (
                Some("41"),
                &["east", "west"],
                serde_json::json!({
                    "metadata": {"resourceVersion": "41"},
                    "status": {"clusters": [{"cluster": "east"}, {"cluster": "west"}]},
                }),
            ),
            // No version known: no precondition (null), an empty list written as such.
            (
                None,
                &[],
                serde_json::json!({
                    "metadata": {"resourceVersion": null},
                    "status": {"clusters": []},
                }),
            ),
        ];
        for (rv, clusters, want) in cases {
            let clusters: Vec<String> = clusters.iter().map(|c| c.to_string()).collect();
            assert_eq!(import_status_patch(*rv, &clusters), *want, "{rv:?}");
        }
    }

    #[test]
    fn an_export_status_apply_carries_only_our_condition_types() {
        let c = |type_: &str| Condition {
            type_: type_.into(),
            status: "True".into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        let export = ServiceExport {
            metadata: ObjectMeta {
                name: Some("hello".into()),
                namespace: Some("shop".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let body = export_status_apply(&export, &[c("Valid"), c("Theirs"), c("Conflict")]);
        let types: Vec<&str> = body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["Valid", "Conflict"]);
        assert_eq!(body["metadata"]["resourceVersion"], "42");
        assert_eq!(body["kind"], "ServiceExport");
    }
}
