//! The ServiceImport of a name: created and replaced through the process's
//! `LocalWriter::mcs_imports`, and its `status.clusters` written through the
//! `writer::mcs_status` writer (a status patch), as `core::mcs_import` says (only ours,
//! and only as the cache holds it).

use super::{ImportFacts, Imports, Kind};
use crate::mcs::resource::ServiceImport;
use crate::mcs::write_errors::Outcome;
use kube::api::ObjectMeta;
use service_mirror_core::mcs::ImportSpec;
use service_mirror_core::mcs_import::{ImportAction, desired_import, import_action};
use service_mirror_core::{Action, Object, ServiceKey};
use std::collections::BTreeMap;

impl Imports {
    /// The ServiceImport of `key` as `spec`, `clusters` and `ips` say. `Ok`: written
    /// (or nothing to write), with the uid of an import created now, so that its slices
    /// are written in the same pass (the cache shows it only with its watch event: a
    /// round trip and a second reconcile per name otherwise); `Err`: what follows.
    pub(super) async fn sync_import(
        &self,
        key: &ServiceKey,
        facts: &ImportFacts,
        spec: &ImportSpec,
        clusters: &[String],
        ips: Vec<String>,
    ) -> Result<Option<String>, Outcome> {
        let desired = desired_import(key, spec, clusters, ips, &self.controller_namespace);
        let current = facts.import.clone();
        let owned = current.as_ref().is_some_and(|c| self.owns(c));
        let action = import_action(current.as_ref(), owned, &desired);
        // A foreign import stopped `sync` before (the facts are one copy of the cache).
        if matches!(action, ImportAction::Nothing | ImportAction::Foreign) {
            return Ok(None);
        }
        if !self.leading() {
            return Err(Outcome::Retry);
        }
        let (write_spec, write_status) = match action {
            ImportAction::Nothing | ImportAction::Foreign => return Ok(None),
            ImportAction::Create => {
                // Made meanwhile (ours not yet seen, or another's): stale, its event
                // judges it again.
                let create = Action::Create(Object::ServiceImport(import_object(&desired, None)));
                let stored = self.write(Kind::Import, key, &create, "created").await?;
                let uid = stored.as_ref().and_then(|o| o.metadata().uid.clone());
                let judged = stored_meta(stored, &desired);
                return match self.write_status(key, &judged, &desired.clusters()).await {
                    Outcome::Done => Ok(uid),
                    other => Err(other),
                };
            }
            ImportAction::Update { spec, status } => (spec, status),
        };
        let Some(current) = current else {
            return Ok(None);
        };
        let mut judged = current.metadata.clone();
        if write_spec {
            let update = Action::Update(Object::ServiceImport(import_object(
                &desired,
                Some(&current),
            )));
            judged = stored_meta(
                self.write(Kind::Import, key, &update, "updated").await?,
                &desired,
            );
        }
        match write_status {
            true => match self.write_status(key, &judged, &desired.clusters()).await {
                Outcome::Done => Ok(None),
                other => Err(other),
            },
            false => Ok(None),
        }
    }

    /// `status.clusters` of the import `key`, at the resourceVersion of `judged` (the
    /// import as cached, or as a create or replace just stored it), through the status
    /// writer (a merge patch: the list is replaced whole).
    async fn write_status(
        &self,
        key: &ServiceKey,
        judged: &ObjectMeta,
        clusters: &[String],
    ) -> Outcome {
        match self.status.import_clusters(judged, clusters).await {
            Ok(()) => {
                self.wrote(Kind::ImportStatus, "updated");
                Outcome::Done
            }
            // Not counted: nothing was sent; tried again once we lead.
            Err(crate::error::Error::NotLeader) => Outcome::Retry,
            Err(e) => self.write_failed(Kind::ImportStatus, key, e),
        }
    }
}

/// The import as a create or replace stored it (`stored`), whose status is written at
/// its resourceVersion; `desired`'s metadata (no version: no precondition) if the
/// writer gave none back.
fn stored_meta(stored: Option<Object>, desired: &ServiceImport) -> ObjectMeta {
    match stored {
        Some(o) => o.metadata().clone(),
        None => ObjectMeta {
            resource_version: None,
            ..desired.metadata.clone()
        },
    }
}

/// The ServiceImport object for `desired` (status apart); over `base`, the stored one,
/// its metadata kept but for our labels and annotations (its resourceVersion is the
/// precondition of the replace).
fn import_object(desired: &ServiceImport, base: Option<&ServiceImport>) -> ServiceImport {
    let merged = |theirs: &Option<BTreeMap<String, String>>,
                  ours: &Option<BTreeMap<String, String>>| {
        let mut all = theirs.clone().unwrap_or_default();
        all.extend(ours.clone().unwrap_or_default());
        Some(all)
    };
    let metadata = match base {
        // Another writer's labels and annotations stay (see core::mcs_import).
        Some(b) => ObjectMeta {
            labels: merged(&b.metadata.labels, &desired.metadata.labels),
            annotations: merged(&b.metadata.annotations, &desired.metadata.annotations),
            managed_fields: None,
            ..b.metadata.clone()
        },
        None => desired.metadata.clone(),
    };
    ServiceImport {
        metadata,
        spec: desired.spec.clone(),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcs::resource::{ClusterStatus, ServiceImportStatus};
    use service_mirror_core::mcs::{ImportPort, ImportSpec, ImportType};
    use service_mirror_core::mcs_import::is_owned_import;

    fn spec() -> ImportSpec {
        ImportSpec {
            type_: ImportType::ClusterSetIp,
            ports: vec![
                ImportPort {
                    name: "http".into(),
                    protocol: "TCP".into(),
                    port: 80,
                    app_protocol: Some("http".into()),
                },
                ImportPort {
                    name: String::new(),
                    protocol: "UDP".into(),
                    port: 53,
                    app_protocol: None,
                },
            ],
            session_affinity: Some("None".into()),
            session_affinity_config: None,
            internal_traffic_policy: Some("Cluster".into()),
            traffic_distribution: None,
            ip_families: vec!["IPv4".into()],
            labels: BTreeMap::from([("team".into(), "shop".into())]),
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn an_import_we_write_reads_back_as_what_we_wanted() {
        let key = ServiceKey::new("shop", "hello");
        let desired = desired_import(
            &key,
            &spec(),
            &["west".into()],
            vec!["10.96.0.9".into()],
            "sm",
        );
        let mut stored: ServiceImport =
            serde_json::from_value(serde_json::to_value(import_object(&desired, None)).unwrap())
                .unwrap();
        stored.status = Some(ServiceImportStatus {
            clusters: vec![ClusterStatus {
                cluster: "west".into(),
            }],
            conditions: vec![],
        });
        assert_eq!(
            import_action(Some(&stored), true, &desired),
            ImportAction::Nothing
        );
        assert!(is_owned_import(&stored.metadata, "sm"));
    }

    #[test]
    fn the_body_is_the_api_object_with_no_status() {
        let key = ServiceKey::new("shop", "hello");
        let desired = desired_import(&key, &spec(), &["west".into()], vec![], "sm");
        let body = serde_json::to_value(import_object(&desired, None)).unwrap();
        assert_eq!(body["apiVersion"], "multicluster.x-k8s.io/v1beta1");
        assert_eq!(body["kind"], "ServiceImport");
        assert_eq!(body["spec"]["type"], "ClusterSetIP");
        assert_eq!(body["spec"]["ports"][0]["appProtocol"], "http");
        assert!(body["spec"]["ports"][1].get("name").is_none());
        assert!(body["spec"].get("ips").is_none(), "none yet: {body}");
        assert!(body.get("status").is_none());
    }

    #[test]
    fn a_replace_keeps_the_stored_metadata_and_sets_our_labels_and_annotations() {
        let key = ServiceKey::new("shop", "hello");
        let desired = desired_import(&key, &spec(), &[], vec![], "sm");
        let base = ServiceImport {
            metadata: ObjectMeta {
                name: Some("hello".into()),
                namespace: Some("shop".into()),
                uid: Some("u1".into()),
                resource_version: Some("41".into()),
                labels: Some(BTreeMap::from([("stale".into(), "1".into())])),
                finalizers: Some(vec!["x/y".into()]),
                ..Default::default()
            },
            ..Default::default()
        };
        let body = import_object(&desired, Some(&base));
        assert_eq!(body.metadata.resource_version.as_deref(), Some("41"));
        assert_eq!(body.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(body.metadata.finalizers, base.metadata.finalizers);
        let mut want = desired.metadata.labels.clone().unwrap_or_default();
        want.insert("stale".into(), "1".into());
        assert_eq!(body.metadata.labels, Some(want), "theirs kept, ours set");
    }
}
