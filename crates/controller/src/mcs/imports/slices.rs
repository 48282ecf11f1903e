//! The EndpointSlices of an import: gathered, planned (`decide::decide_slices`), then
//! written through the process's `LocalWriter::mcs_imports` (ownership checked on a
//! create that meets a name).

use super::{ImportFacts, Imports, Kind};
use crate::mcs::decide::{SliceFacts, decide_slices};
use crate::mcs::write_errors::Outcome;
use crate::writer::Applied;
use kube::api::ObjectMeta;
use service_mirror_core::mcs::ImportSpec;
use service_mirror_core::traffic::{Locality, TrafficPolicy};
use service_mirror_core::{Action, ServiceKey};
use std::collections::BTreeSet;

/// What an import's slices are synced to.
pub(super) struct SliceTarget<'a> {
    /// The import's spec; `None`: no import of ours (every slice of ours of the name
    /// goes).
    pub(super) spec: Option<&'a ImportSpec>,
    /// The exporting clusters.
    pub(super) clusters: &'a [String],
    /// Clusters whose slices are kept as they are.
    pub(super) keep: BTreeSet<String>,
    /// The uid of the import created in this pass (the cache shows it only with its
    /// watch event).
    pub(super) created: Option<String>,
    /// Where its traffic goes (only the remote slices' readiness depends on it).
    pub(super) traffic: &'a TrafficPolicy,
}

/// The policy of no import (unused: no slice is wanted).
static NO_IMPORT: TrafficPolicy = TrafficPolicy {
    cluster_local: false,
    locality: Locality::Spread,
    minimum: 1,
    priority: Vec::new(),
};

impl SliceTarget<'_> {
    /// No import of ours: every slice of ours of the name goes.
    pub(super) fn none() -> Self {
        Self {
            spec: None,
            clusters: &[],
            keep: BTreeSet::new(),
            created: None,
            traffic: &NO_IMPORT,
        }
    }
}

impl Imports {
    /// The slices of `key` as `target` says, owned by the import: as cached, or the one
    /// created in this pass (so a new import's slices are written with it, not a watch
    /// round trip later).
    pub(super) async fn sync_slices(
        &self,
        key: &ServiceKey,
        facts: &ImportFacts,
        target: SliceTarget<'_>,
    ) -> Outcome {
        let SliceTarget {
            spec,
            clusters,
            keep,
            created,
            traffic,
        } = target;
        let import = created.or_else(|| {
            facts
                .import
                .as_ref()
                .filter(|i| self.owns(i))
                .and_then(|i| i.metadata.uid.clone())
        });
        // Until listed, this cluster's slices of ours are left as they are.
        let local = facts.local_slices.as_deref();
        let Some(actions) = decide_slices(SliceFacts {
            key,
            listed: facts.slices_listed,
            spec,
            clusters,
            keep,
            import_uid: import.as_deref(),
            local_slices: local,
            gateways: &facts.gateways,
            local_cluster: &self.local_cluster,
            controller_namespace: &self.controller_namespace,
            stored: &facts.slices,
            traffic,
        }) else {
            return Outcome::Done; // judged again when the list, or the new import, is in
        };
        let mut outcome = Outcome::Done;
        for action in &actions {
            let verb = match action {
                Action::Create(_) => "created",
                Action::Update(_) => "updated",
                Action::Delete(_) => "deleted",
            };
            match self.writer.execute(action).await {
                Ok(Applied::Done) => self.wrote(Kind::Slice, verb),
                // Changed, made or gone since the cache showed it (or leadership
                // lost): its event, or the next leader, judges it again.
                Ok(Applied::Stale) => {
                    self.wrote(Kind::Slice, "stale");
                    return Outcome::Dropped;
                }
                Err(crate::error::Error::MissingNamespace(_)) => {
                    self.wrote(Kind::Slice, "no_namespace");
                    return Outcome::Retry;
                }
                Err(crate::error::Error::OwnershipConflict {
                    namespace,
                    name,
                    uid,
                    ..
                }) => {
                    // Its uid as the writer read it: told once per object, and again
                    // for one deleted and made anew under the name.
                    let meta = ObjectMeta {
                        name: Some(name),
                        namespace: Some(namespace),
                        uid,
                        ..Default::default()
                    };
                    // That one slice is not written; the others are (judged again
                    // at the name's next change).
                    self.foreign(key, &meta, Kind::Slice, "SliceNameTaken")
                        .await;
                    outcome = Outcome::Dropped;
                }
                Err(e) => {
                    tracing::warn!(import = %key, error = %e, "import EndpointSlice write failed; retrying with backoff");
                    self.wrote(Kind::Slice, "failed");
                    return Outcome::Retry;
                }
            }
        }
        outcome
    }
}
