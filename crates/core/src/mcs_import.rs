//! The ServiceImport of a namespace/name as every cluster of the set holds it (KEP-1645,
//! "Importing Services"): one per name while at least one cluster exports it validly,
//! the exporters included, gone with the last export.
//!
//! Ours carry [`IMPORT_LABEL`] and our controller namespace; a ServiceImport of the name
//! without them belongs to another controller (or a person) and is never changed or
//! deleted: [`import_action`] says [`ImportAction::Foreign`] and the caller reports it.
//!
//! Its spec and status are ours. Of its labels and annotations only ours are compared
//! (the oldest export's `exportedLabels`/`exportedAnnotations` plus our marks): another
//! writer's (a webhook's, a person's) stay, since fighting them would write on every
//! event (a webhook adding a label on each write would loop). So a label the exporters
//! drop stays on the import until it is made again. Spec and status are compared apart,
//! since each is its own write (the status is a subresource).

use crate::ServiceKey;
use crate::labels::CONTROLLER_NAMESPACE_ANNOTATION;
use crate::mcs::{ImportSpec, ImportType};
use crate::mcs_derived::{DERIVED_SERVICE_ANNOTATION, derived_service_name};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use service_mirror_api::mcs::{
    ClusterStatus, ServiceImport, ServiceImportPort, ServiceImportSpec, ServiceImportStatus,
};
use std::collections::BTreeMap;

/// Label marking a ServiceImport as ours (with [`CONTROLLER_NAMESPACE_ANNOTATION`]).
pub const IMPORT_LABEL: &str = "service-mirror.io/mcs-import";
/// Value of [`IMPORT_LABEL`].
pub const IMPORT_VALUE: &str = "true";

/// The spec as compared: a port's absent name is the empty one and its absent protocol
/// `TCP` (the apiserver stores what it is given; the KEP's defaults).
fn comparable(spec: &ServiceImportSpec) -> ServiceImportSpec {
    ServiceImportSpec {
        ports: spec
            .ports
            .iter()
            .map(|p| ServiceImportPort {
                name: p.name.clone().filter(|n| !n.is_empty()),
                protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                ..p.clone()
            })
            .collect(),
        ..spec.clone()
    }
}

/// Whether every entry of `ours` is in `stored` with the same value.
fn holds(
    stored: &Option<BTreeMap<String, String>>,
    ours: &Option<BTreeMap<String, String>>,
) -> bool {
    let stored = stored.as_ref();
    ours.iter()
        .flatten()
        .all(|(k, v)| stored.and_then(|s| s.get(k)) == Some(v))
}

/// The ServiceImport of `key` with `spec`, the exporting `clusters` (its status) and
/// `ips` (the derived Service's ClusterIPs; none while headless or not yet allocated).
pub fn desired_import(
    key: &ServiceKey,
    spec: &ImportSpec,
    clusters: &[String],
    ips: Vec<String>,
    controller_namespace: &str,
) -> ServiceImport {
    let mut labels = spec.labels.clone();
    labels.insert(IMPORT_LABEL.into(), IMPORT_VALUE.into());
    let mut annotations = spec.annotations.clone();
    annotations.insert(
        CONTROLLER_NAMESPACE_ANNOTATION.into(),
        controller_namespace.into(),
    );
    annotations.insert(DERIVED_SERVICE_ANNOTATION.into(), derived_service_name(key));
    let mut clusters = clusters.to_vec();
    clusters.sort();
    clusters.dedup();
    ServiceImport {
        metadata: ObjectMeta {
            name: Some(key.name.clone()),
            namespace: Some(key.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: ServiceImportSpec {
            type_: Some(spec.type_.as_str().into()),
            ports: spec
                .ports
                .iter()
                .map(|p| ServiceImportPort {
                    name: (!p.name.is_empty()).then(|| p.name.clone()),
                    protocol: Some(p.protocol.clone()),
                    app_protocol: p.app_protocol.clone(),
                    port: p.port,
                })
                .collect(),
            ips: match spec.type_ {
                ImportType::ClusterSetIp => ips,
                ImportType::Headless => Vec::new(),
            },
            ip_families: spec.ip_families.clone(),
            session_affinity: spec.session_affinity.clone(),
            session_affinity_config: spec.session_affinity_config.clone(),
            internal_traffic_policy: spec.internal_traffic_policy.clone(),
            traffic_distribution: spec.traffic_distribution.clone(),
        },
        status: Some(ServiceImportStatus {
            clusters: clusters
                .into_iter()
                .map(|cluster| ClusterStatus { cluster })
                .collect(),
            conditions: Vec::new(),
        }),
    }
}

/// Whether a ServiceImport with this metadata is ours.
pub fn is_owned_import(meta: &ObjectMeta, controller_namespace: &str) -> bool {
    let has = |map: &Option<BTreeMap<String, String>>, k: &str, v: &str| {
        map.as_ref().and_then(|m| m.get(k)).map(String::as_str) == Some(v)
    };
    has(&meta.labels, IMPORT_LABEL, IMPORT_VALUE)
        && has(
            &meta.annotations,
            CONTROLLER_NAMESPACE_ANNOTATION,
            controller_namespace,
        )
}

/// What to do with the stored ServiceImport of a name to make it `desired`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImportAction {
    /// It says what we would write.
    Nothing,
    /// None is stored: create it, then write its status.
    Create,
    /// Ours: replace the object (`spec`) and/or write the status (`status`).
    Update {
        /// The spec, or one of our labels or annotations, differs.
        spec: bool,
        /// `status.clusters` differs.
        status: bool,
    },
    /// Someone else's: never touched.
    Foreign,
}

/// What makes `current` (`None`: no ServiceImport of the name; `owned`: it is ours, see
/// [`is_owned_import`]) say `desired`.
pub fn import_action(
    current: Option<&ServiceImport>,
    owned: bool,
    desired: &ServiceImport,
) -> ImportAction {
    let Some(current) = current else {
        return ImportAction::Create;
    };
    if !owned {
        return ImportAction::Foreign;
    }
    let (stored, ours) = (&current.metadata, &desired.metadata);
    let spec = comparable(&current.spec) != comparable(&desired.spec)
        || !holds(&stored.labels, &ours.labels)
        || !holds(&stored.annotations, &ours.annotations);
    let status = current.clusters() != desired.clusters();
    match (spec, status) {
        (false, false) => ImportAction::Nothing,
        (spec, status) => ImportAction::Update { spec, status },
    }
}

#[cfg(test)]
#[path = "mcs_import_tests.rs"]
mod tests;
