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
use crate::mcs::{ImportPort, ImportSpec, ImportType};
use crate::mcs_derived::{DERIVED_SERVICE_ANNOTATION, derived_service_name};
use k8s_openapi::api::core::v1::SessionAffinityConfig;
use std::collections::BTreeMap;

/// Label marking a ServiceImport as ours (with [`CONTROLLER_NAMESPACE_ANNOTATION`]).
pub const IMPORT_LABEL: &str = "service-mirror.io/mcs-import";
/// Value of [`IMPORT_LABEL`].
pub const IMPORT_VALUE: &str = "true";

/// A ServiceImport as compared: what we write of it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImportObject {
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `spec.type` (`None`: missing or unknown).
    pub type_: Option<ImportType>,
    /// `spec.ports`.
    pub ports: Vec<ImportPort>,
    /// `spec.ips`.
    pub ips: Vec<String>,
    /// `spec.ipFamilies`.
    pub ip_families: Vec<String>,
    /// `spec.sessionAffinity`.
    pub session_affinity: Option<String>,
    /// `spec.sessionAffinityConfig`.
    pub session_affinity_config: Option<SessionAffinityConfig>,
    /// `spec.internalTrafficPolicy`.
    pub internal_traffic_policy: Option<String>,
    /// `spec.trafficDistribution`.
    pub traffic_distribution: Option<String>,
    /// `status.clusters[].cluster`, sorted.
    pub clusters: Vec<String>,
}

impl ImportObject {
    /// The spec alone.
    fn spec_only(&self) -> Self {
        Self {
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            clusters: Vec::new(),
            ..self.clone()
        }
    }
}

/// Whether every entry of `ours` is in `stored` with the same value.
fn holds(stored: &BTreeMap<String, String>, ours: &BTreeMap<String, String>) -> bool {
    ours.iter().all(|(k, v)| stored.get(k) == Some(v))
}

/// The ServiceImport of `key` with `spec`, the exporting `clusters` and `ips` (the
/// derived Service's ClusterIPs; none while headless or not yet allocated).
pub fn desired_import(
    key: &ServiceKey,
    spec: &ImportSpec,
    clusters: &[String],
    ips: Vec<String>,
    controller_namespace: &str,
) -> ImportObject {
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
    ImportObject {
        labels,
        annotations,
        type_: Some(spec.type_),
        ports: spec.ports.clone(),
        ips: match spec.type_ {
            ImportType::ClusterSetIp => ips,
            ImportType::Headless => Vec::new(),
        },
        ip_families: spec.ip_families.clone(),
        session_affinity: spec.session_affinity.clone(),
        session_affinity_config: spec.session_affinity_config.clone(),
        internal_traffic_policy: spec.internal_traffic_policy.clone(),
        traffic_distribution: spec.traffic_distribution.clone(),
        clusters,
    }
}

/// Whether a ServiceImport with these labels and annotations is ours.
pub fn is_owned_import(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    controller_namespace: &str,
) -> bool {
    labels.get(IMPORT_LABEL).map(String::as_str) == Some(IMPORT_VALUE)
        && annotations
            .get(CONTROLLER_NAMESPACE_ANNOTATION)
            .map(String::as_str)
            == Some(controller_namespace)
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
    current: Option<&ImportObject>,
    owned: bool,
    desired: &ImportObject,
) -> ImportAction {
    let Some(current) = current else {
        return ImportAction::Create;
    };
    if !owned {
        return ImportAction::Foreign;
    }
    let spec = current.spec_only() != desired.spec_only()
        || !holds(&current.labels, &desired.labels)
        || !holds(&current.annotations, &desired.annotations);
    let status = current.clusters != desired.clusters;
    match (spec, status) {
        (false, false) => ImportAction::Nothing,
        (spec, status) => ImportAction::Update { spec, status },
    }
}

#[cfg(test)]
#[path = "mcs_import_tests.rs"]
mod tests;
