//! The MCS component's metric families (bounded labels: a state, an outcome, a reason
//! or a linked cluster, never a Service name).

use crate::metrics::ClusterLabels;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The verdict on local exports.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StateLabels {
    /// `Exported`, `Conflict`, `NoService` or `InvalidServiceType`.
    pub(crate) state: String,
}

/// One label of a family: `outcome` or `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    /// What happened.
    pub(crate) outcome: String,
}

/// One label: `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    /// Why.
    pub(crate) reason: String,
}

/// What a ServiceImport-side write was of, and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ImportWriteLabels {
    /// `service_import`, `service_import_status` or `derived_service`.
    pub(crate) kind: String,
    /// What happened.
    pub(crate) outcome: String,
}

/// Whether the component runs, and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct McsStateLabels {
    /// `on` or `off`.
    pub(crate) state: String,
    /// On: where the name came from (`flag`, `cluster_property`); off: why
    /// (`enable::OffReason::label`).
    pub(crate) reason: String,
}

/// The MCS families.
#[derive(Debug, Default)]
pub(crate) struct McsFamilies {
    /// Local ServiceExports by verdict (set by the leader: a follower judges nothing).
    pub(crate) exports: Family<StateLabels, Gauge>,
    /// Status writes of local ServiceExports by outcome.
    pub(crate) status_writes: Family<OutcomeLabels, Counter>,
    /// Writes of local ServiceImports and derived Services by kind and outcome.
    pub(crate) import_writes: Family<ImportWriteLabels, Counter>,
    /// Failed ServiceExport and Service watches, by cluster (the local one included).
    pub(crate) watch_errors: Family<ClusterLabels, Counter>,
    /// Problems told of local exports' `export-to` annotations, by reason
    /// (`InvalidExportTo`, `ExportToUnknownCluster`), once per episode.
    pub(crate) export_to_problems: Family<ReasonLabels, Counter>,
    /// Problems told of local exports' traffic annotations (`InvalidTrafficAnnotation`),
    /// once per episode.
    pub(crate) traffic_problems: Family<ReasonLabels, Counter>,
    /// Clusters of `--cluster-priority` that no link source names (once those are
    /// listed): they take no traffic until one does.
    pub(crate) priority_unknown: Gauge,
    /// Clusters whose exports count (both lists complete), the local one included.
    pub(crate) clusters_listed: Gauge,
    /// One series at 1: whether the component runs, and why (set once at the start).
    pub(crate) state: Family<McsStateLabels, Gauge>,
}

impl McsFamilies {
    /// Registers the families (under the registry's prefix).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "mcs_exports",
            "Local ServiceExports by verdict (Exported, Conflict, NoService, InvalidServiceType)",
            self.exports.clone(),
        );
        r.register(
            "mcs_export_status_writes",
            "Status writes of local ServiceExports by outcome (applied, gone, stale, owned_by_another, refused, failed)",
            self.status_writes.clone(),
        );
        r.register(
            "mcs_import_writes",
            "Writes of local ServiceImports, their status, derived Services and EndpointSlices, by kind and outcome (created, updated, deleted, stale, gone, no_namespace, foreign, refused, failed)",
            self.import_writes.clone(),
        );
        r.register(
            "mcs_clusters_listed",
            "Clusters whose ServiceExports and Services are listed and count in the merge, the local one included",
            self.clusters_listed.clone(),
        );
        r.register(
            "mcs_state",
            "1 for the start's verdict on the MCS component: state on (reason flag or cluster_property: where its cluster name came from) or off (reason disabled, no_crd, no_cluster_name, forbidden, invalid_cluster_name, unanswered; restart_needed once a later look finds it could run)",
            self.state.clone(),
        );
        r.register(
            "mcs_export_to_problems",
            "Problems of local ServiceExports' service-mirror.io/export-to annotations, by reason (InvalidExportTo, ExportToUnknownCluster), counted once per episode",
            self.export_to_problems.clone(),
        );
        r.register(
            "mcs_traffic_problems",
            "Problems of local ServiceExports' service-mirror.io/locality and local-minimum annotations, by reason (InvalidTrafficAnnotation), counted once per episode",
            self.traffic_problems.clone(),
        );
        r.register(
            "mcs_priority_unknown_clusters",
            "Clusters named by --cluster-priority that no link source names",
            self.priority_unknown.clone(),
        );
        r.register(
            "mcs_watch_errors",
            "Failed ServiceExport or Service watches of the MCS component, by cluster",
            self.watch_errors.clone(),
        );
    }

    /// Counts one status write's outcome.
    pub(crate) fn wrote(&self, outcome: &str) {
        self.status_writes
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Records the start's verdict.
    pub(crate) fn set_state(&self, decision: &super::enable::Decision) {
        use super::enable::{Decision, NameSource};
        let (state, reason) = match decision {
            Decision::Run {
                source: NameSource::Flag,
                ..
            } => ("on", "flag"),
            Decision::Run {
                source: NameSource::ClusterProperty,
                ..
            } => ("on", "cluster_property"),
            Decision::Off(reason) => ("off", reason.label()),
        };
        self.set_one(state, reason);
    }

    /// An `auto` start found MCS off, and it could run now: a restart starts it.
    pub(crate) fn set_restart_needed(&self) {
        self.set_one("off", "restart_needed");
    }

    /// The one series at 1.
    fn set_one(&self, state: &str, reason: &str) {
        self.state.clear();
        self.state
            .get_or_create(&McsStateLabels {
                state: state.into(),
                reason: reason.into(),
            })
            .set(1);
    }

    /// Counts one import-side write's outcome.
    pub(crate) fn import_wrote(&self, kind: &str, outcome: &str) {
        self.import_writes
            .get_or_create(&ImportWriteLabels {
                kind: kind.into(),
                outcome: outcome.into(),
            })
            .inc();
    }
}
