//! The import side of the MCS component: in this cluster, one ServiceImport per
//! namespace/name that some cluster of the set validly exports (the exporters
//! included), its derived Service, whose ClusterIPs are the import's `ips`, and its
//! EndpointSlices, one group per exporting cluster (a remote one's at its gateway, this
//! cluster's a copy of its exported Service's endpoints; `core::mcs_slices`), owned by
//! the import. All are deleted with the last export; a
//! cluster that stops exporting loses its slices. Fed by the watches of the local
//! ServiceImports (all of them: a foreign one must be seen to be left alone), of our
//! derived Services and of our import slices (by label), of the local Services'
//! slices, and by the links' gateway reports.
//!
//! Ownership: only a ServiceImport with our mark and controller namespace
//! (`core::mcs_import::is_owned_import`), a derived Service with ours
//! (`core::mcs_derived::is_owned_derived`) and a slice with ours
//! (`core::mcs_slices::is_owned_import_slice`, written through the process's
//! `LocalWriter::mcs_imports`) is written or deleted, and only as the cache holds it
//! (resourceVersion on a replace, uid and resourceVersion on a delete).
//! Missing namespaces are not created (the KEP's rule): the write is retried with
//! backoff until the namespace exists.
//!
//! An import with no export left goes only if each cluster its status lists either
//! counts now (its lists are in, and it no longer exports the name) or is known gone
//! (its link removed, or named by no link source once those were listed): after a
//! restart, a link not yet running (or failing) must not look like a cluster that
//! stopped exporting, or every remote-only import would be deleted and made again with
//! a new ClusterSetIP. A lost cluster's imports thus stay until its link is removed.
//!
//! Only the leader writes: leadership is checked before each write, not once per name.
//!
//! The caches live in the shared state (`imports/cache.rs`); a reconcile reads one
//! key's copy of them ([`cache::ImportFacts`]). This file holds `sync` (gather,
//! `decide::decide_import`, apply), the removal, and the Events on another's objects;
//! each kind is written by a child: `imports/service_import.rs`, `imports/derived.rs`,
//! `imports/slices.rs`.

pub(super) mod cache;
mod derived;
mod service_import;
mod slices;

use super::decide::{ImportPlan, Settling, StoredImport, decide_import};
use super::resource::ServiceImport;
use super::write_errors::Outcome;
use super::write_errors::{api_status, import_write_error};
use crate::events::EventRecorder;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::writer::Applied;
use crate::writer::LocalWriter;
use crate::writer::mcs_status::McsStatusWriter;
use cache::ImportFacts;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::ObjectMeta;
use kube::runtime::events::EventType;
use parking_lot::Mutex;
use service_mirror_core::ServiceKey;
use service_mirror_core::mcs::Merge;
use service_mirror_core::mcs_import::is_owned_import;
use service_mirror_core::traffic::TrafficPolicy;
use service_mirror_core::{Action, Object, ObjectKind, ObjectRef};
use slices::SliceTarget;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The writer of the local imports, derived Services and import slices. Shared by the
/// reconcile workers: the queue hands a key to one worker at a time, and every key
/// writes only its own objects.
pub(super) struct Imports {
    recorder: EventRecorder,
    metrics: Arc<Metrics>,
    controller_namespace: String,
    /// This cluster's name: its own exports' slices copy its Services' slices.
    local_cluster: String,
    /// The writer of the slices (ownership checked on a create that meets a name).
    writer: LocalWriter,
    /// The writer of the imports' status.
    status: McsStatusWriter,
    /// The foreign object last reported for a key and kind (a slice: and its name): see
    /// [`first_told`]. Locked between awaits only.
    told: Mutex<Told>,
    /// Writes only while this says true; `None`: always.
    leader: Option<Leadership>,
}

/// The foreign objects reported, by key and slot (see [`first_told`]).
type Told = BTreeMap<(ServiceKey, String), Option<String>>;

/// Whether the foreign object `meta`, where `key`'s object of `kind` would be, is new
/// to `told` (and then remembered): told once per object, by its uid (its name if
/// unknown), so one deleted and made anew under the name is told again. One slot per
/// key and kind, and per name for slices (a name's several slices each).
fn first_told(told: &mut Told, key: &ServiceKey, kind: Kind, meta: &ObjectMeta) -> bool {
    let slot = match kind {
        Kind::Slice => format!("{}/{}", kind.label(), meta.name.as_deref().unwrap_or("")),
        _ => kind.label().to_string(),
    };
    let id = meta.uid.clone().or_else(|| meta.name.clone());
    told.insert((key.clone(), slot), id.clone()) != Some(id)
}

/// Which object a write was of (a metric label).
#[derive(Clone, Copy)]
enum Kind {
    Import,
    ImportStatus,
    Derived,
    Slice,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Self::Import => "service_import",
            Self::ImportStatus => "service_import_status",
            Self::Derived => "derived_service",
            Self::Slice => "endpoint_slice",
        }
    }
}

impl Imports {
    pub(super) fn new(
        client: Client,
        recorder: EventRecorder,
        metrics: Arc<Metrics>,
        opts: &super::McsOptions,
    ) -> Self {
        let writer = LocalWriter::mcs_imports(
            client.clone(),
            &opts.controller_namespace,
            metrics.clone(),
            recorder.clone(),
        )
        .led_by(opts.leader.clone());
        let status = McsStatusWriter::new(
            client,
            &opts.controller_namespace,
            metrics.clone(),
            opts.leader.clone(),
        );
        Self {
            leader: opts.leader.clone(),
            status,
            recorder,
            metrics,
            controller_namespace: opts.controller_namespace.clone(),
            local_cluster: opts.cluster_name.clone(),
            writer,
            told: Mutex::new(BTreeMap::new()),
        }
    }

    /// Brings the import of `key`, its derived Service and its slices to `merged`:
    /// gathered, planned (`decide::decide_import`; `settling`: which clusters count now
    /// or are known gone, see the module's doc; `traffic`: which remote clusters'
    /// slices are ready), then applied.
    pub(super) async fn sync(
        &self,
        key: &ServiceKey,
        facts: &ImportFacts,
        merged: &Merge,
        settling: &Settling<'_>,
        traffic: &TrafficPolicy,
    ) -> Outcome {
        let cached = facts.import.as_ref();
        let stored = cached.map(|i| StoredImport {
            owned: self.owns(i),
            clusters: i.clusters(),
        });
        let meta = cached.map(|i| i.metadata.clone());
        match decide_import(stored.as_ref(), merged, settling) {
            ImportPlan::Foreign => {
                // Another's import of the name: never touched, and no derived Service of
                // ours serves a name not imported here.
                let meta = meta.unwrap_or_default();
                self.foreign(key, &meta, Kind::Import, "ImportOwnedByAnother")
                    .await;
                let slices = self.sync_slices(key, facts, SliceTarget::none()).await;
                slices.max(self.remove_derived(key, facts).await)
            }
            ImportPlan::Keep { unsettled } => {
                // Kept: those clusters may export it still (judged again when they list
                // or their links go).
                tracing::debug!(import = %key, clusters = ?unsettled, "no export seen, but clusters it lists are not listed: import kept");
                Outcome::Done
            }
            ImportPlan::Remove { import } => self.remove(key, facts, meta.filter(|_| import)).await,
            ImportPlan::Write { mut spec, keep } => {
                let (ips, families) = match self.sync_derived(key, facts, &spec).await {
                    Ok(found) => found,
                    Err(outcome) => return outcome,
                };
                if let Some(families) = families {
                    spec.ip_families = families; // this cluster's, as the derived Service has them
                }
                match self
                    .sync_import(key, facts, &spec, &merged.clusters, ips)
                    .await
                {
                    Ok(created) => {
                        let slices = SliceTarget {
                            spec: Some(&spec),
                            clusters: &merged.clusters,
                            keep,
                            created,
                            traffic,
                        };
                        self.sync_slices(key, facts, slices).await
                    }
                    Err(other) => other,
                }
            }
        }
    }
    /// Whether this replica may write now.
    fn leading(&self) -> bool {
        self.leader.as_ref().is_none_or(Leadership::leading)
    }

    /// No export of `key` anywhere, and every cluster the import lists settled: our
    /// slices, our import (`import`: its metadata as cached) and our derived Service go.
    async fn remove(
        &self,
        key: &ServiceKey,
        facts: &ImportFacts,
        import: Option<ObjectMeta>,
    ) -> Outcome {
        if let Some(import) = import {
            if !self.leading() {
                return Outcome::Retry;
            }
            // Its slices first: none outlives it pointing at a cluster (the garbage
            // collector would take them too, where one runs).
            let slices = self.sync_slices(key, facts, SliceTarget::none()).await;
            if slices != Outcome::Done {
                return slices;
            }
            let delete = Action::Delete(ObjectRef::of(ObjectKind::ServiceImport, &import));
            if let Err(outcome) = self.write(Kind::Import, key, &delete, "deleted").await {
                return outcome;
            }
        } else {
            // Slices of ours with no import of ours (left by a failed delete): they go.
            let slices = self.sync_slices(key, facts, SliceTarget::none()).await;
            if slices != Outcome::Done {
                return slices;
            }
        }
        self.told.lock().retain(|(k, _), _| k != key);
        self.remove_derived(key, facts).await
    }
    fn owns(&self, import: &ServiceImport) -> bool {
        is_owned_import(&import.metadata, &self.controller_namespace)
    }

    /// A write failed: counted, and what follows.
    fn failed(&self, kind: Kind, key: &ServiceKey, e: &kube::Error) -> Outcome {
        let (outcome, next) = import_write_error(api_status(e));
        match (outcome, e) {
            ("no_namespace", _) => {
                tracing::info!(import = %key, "namespace missing: no ServiceImport until it exists (retried with backoff)");
            }
            ("refused", kube::Error::Api(s)) => {
                tracing::warn!(import = %key, kind = kind.label(), error = %crate::links::sanitize_remote_text(&s.message), "the apiserver refused a ServiceImport write");
            }
            ("failed", e) => {
                tracing::warn!(import = %key, kind = kind.label(), error = %e, "ServiceImport write failed; retrying with backoff");
            }
            _ => {}
        }
        self.wrote(kind, outcome);
        next
    }

    /// Writes `action` (of `kind`) through the process's `LocalWriter` (leadership,
    /// preconditions, field manager, ownership on a create that meets a name): the
    /// object as stored if it was created or replaced now, counted as `done`; an
    /// outcome to stop at otherwise (a create that met another's object: dropped, its
    /// watch event judges it again).
    async fn write(
        &self,
        kind: Kind,
        key: &ServiceKey,
        action: &Action,
        done: &str,
    ) -> Result<Option<Object>, Outcome> {
        let result = self.writer.write(action).await;
        self.written(kind, key, result, done)
    }

    /// What a write through the writer (see [`Imports::write`]) gave, counted.
    fn written(
        &self,
        kind: Kind,
        key: &ServiceKey,
        result: crate::error::Result<(Applied, Option<Object>)>,
        done: &str,
    ) -> Result<Option<Object>, Outcome> {
        match result {
            Ok((Applied::Done, stored)) => {
                self.wrote(kind, done);
                Ok(stored)
            }
            // Changed, made or gone since the cache showed it (or leadership lost): its
            // event, or the next leader, judges it again.
            Ok((Applied::Stale, _)) => {
                self.wrote(kind, "stale");
                Err(Outcome::Dropped)
            }
            Err(e) => Err(self.write_failed(kind, key, e)),
        }
    }

    /// A write through the writer failed: counted, and what follows.
    fn write_failed(&self, kind: Kind, key: &ServiceKey, e: crate::error::Error) -> Outcome {
        match e {
            crate::error::Error::Kube(e) => self.failed(kind, key, &e),
            // A create's 404: the namespace is not there (the KEP leaves it to its owner).
            crate::error::Error::MissingNamespace(_) => {
                tracing::info!(import = %key, "namespace missing: no ServiceImport until it exists (retried with backoff)");
                self.wrote(kind, "no_namespace");
                Outcome::Retry
            }
            // A create met another's object of the name: its watch event judges it.
            crate::error::Error::OwnershipConflict { .. } => {
                self.wrote(kind, "stale");
                Outcome::Dropped
            }
            e => {
                tracing::warn!(import = %key, kind = kind.label(), error = %e, "ServiceImport write failed; retrying with backoff");
                self.wrote(kind, "failed");
                Outcome::Retry
            }
        }
    }

    fn wrote(&self, kind: Kind, outcome: &str) {
        self.metrics.mcs.import_wrote(kind.label(), outcome);
    }

    /// Someone else's object where ours would be: a Warning Event on it, once per object.
    async fn foreign(&self, key: &ServiceKey, meta: &ObjectMeta, kind: Kind, reason: &str) {
        if !first_told(&mut self.told.lock(), key, kind, meta) {
            return;
        }
        // Counted once per object, as the Event: nothing is written.
        self.wrote(kind, "foreign");
        let (api_version, kind_name) = match kind {
            Kind::Derived => ("v1".to_string(), "Service"),
            Kind::Slice => ("discovery.k8s.io/v1".to_string(), "EndpointSlice"),
            Kind::Import | Kind::ImportStatus => (
                format!("{}/{}", service_mirror_core::mcs::GROUP, super::VERSION),
                "ServiceImport",
            ),
        };
        let reference = ObjectReference {
            api_version: Some(api_version),
            kind: Some(kind_name.into()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            ..Default::default()
        };
        let note = match kind {
            Kind::Derived => format!(
                "this Service holds the name of the derived Service of ServiceImport {key} and is not ours: not changed; the import has no ips"
            ),
            Kind::Slice => format!(
                "this EndpointSlice holds the name of an EndpointSlice of ServiceImport {key} and is not ours: not changed; that source cluster has no endpoints here"
            ),
            _ => format!(
                "this ServiceImport is not ours (no {} label for controller namespace {}): not changed; the cluster set's {key} is not imported here",
                service_mirror_core::mcs_import::IMPORT_LABEL,
                self.controller_namespace
            ),
        };
        tracing::warn!(import = %key, reason, "{note}");
        self.recorder
            .publish(&reference, EventType::Warning, reason, "Import", note)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foreign_object_is_told_once_by_uid_and_again_when_made_anew() {
        let meta = |name: &str, uid: Option<&str>| ObjectMeta {
            name: Some(name.into()),
            uid: uid.map(Into::into),
            ..Default::default()
        };
        let key = ServiceKey::new("shop", "hello");
        let mut told = Told::new();
        // (kind, object, told now?, why).
        let cases = [
            (Kind::Slice, meta("s-west", Some("u1")), true, "first seen"),
            (
                Kind::Slice,
                meta("s-west", Some("u1")),
                false,
                "the same object",
            ),
            (
                Kind::Slice,
                meta("s-west", Some("u2")),
                true,
                "deleted, made anew",
            ),
            (
                Kind::Slice,
                meta("s-east", Some("u3")),
                true,
                "another name",
            ),
            (
                Kind::Import,
                meta("hello", Some("u4")),
                true,
                "another kind",
            ),
            (
                Kind::Import,
                meta("hello", Some("u4")),
                false,
                "the same import",
            ),
            (Kind::Derived, meta("d", None), true, "no uid: by name"),
            (Kind::Derived, meta("d", None), false, "the same name"),
        ];
        for (kind, m, want, why) in cases {
            assert_eq!(first_told(&mut told, &key, kind, &m), want, "{why}");
        }
    }
}
