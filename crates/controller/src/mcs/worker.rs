//! The MCS worker: holds the export index, judges each local ServiceExport against the
//! exports of the same name in every listed cluster (`service_mirror_core::mcs`), and
//! applies its conditions to the export's status; then brings the name's local
//! ServiceImport and derived Service to the merge (`imports.rs`). Only while leader.
//! Each step gathers what the index and caches hold, asks `decide.rs` what to do (pure,
//! table-tested), and applies that.
//!
//! One status write per change: the conditions are compared with the export as the
//! cache holds it (transition times kept where the status did not change), and a write
//! is not repeated while the cache still shows the export as it was before that write.

use super::Msg;
use super::decide::{ExportFacts, ExportStep, Settling, Verdict, decide_export};
use super::imports::Imports;
use super::index::{Changed, ExportIndex};
use super::resource::{ServiceExport, status_apply};
use super::write_errors::{api_status, status_write_error};
use crate::backoff::Backoff;
use crate::events::EventRecorder;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::writer::FIELD_MANAGER;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Client, Resource};
use service_mirror_core::ServiceKey;
use service_mirror_core::mcs::{Merge, Validity, merge};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Retries of a failed status write: 1 s doubling to 1 min.
const RETRY: Backoff = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(60));

/// How a write ended, and what follows (ordered: the worse of two counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Outcome {
    /// Applied (or nothing to apply).
    Done,
    /// Not to be retried: the object's next change judges it again.
    Dropped,
    /// Retried with backoff.
    Retry,
}

pub(super) struct Worker {
    client: Client,
    recorder: EventRecorder,
    metrics: Arc<Metrics>,
    leader: Option<Leadership>,
    index: ExportIndex,
    /// Keys to judge.
    dirty: BTreeSet<ServiceKey>,
    /// Failed writes: when to try again, and how many failed.
    retries: BTreeMap<ServiceKey, (Instant, u32)>,
    /// The resourceVersion a key's export had in the cache when we last changed its
    /// status, or when a write was refused for good (another's conditions, invalid):
    /// while the cache still shows it, nothing is written again (our write has not
    /// come back yet, or would be refused again; an import-side event re-judges a key
    /// too).
    written: BTreeMap<ServiceKey, String>,
    /// The last verdict of each local export (uid, verdict): a new problem is told once.
    verdicts: BTreeMap<ServiceKey, (Option<String>, Verdict)>,
    /// The unlisted clusters last logged (a change is logged once).
    unlisted: Vec<String>,
    /// The local ServiceImports and derived Services, and their writer.
    imports: Imports,
    /// The clusters the link sources named when first listed (`None`: not yet).
    expected: Option<BTreeSet<String>>,
    /// Clusters whose link was removed since (a new feed takes one out).
    removed: BTreeSet<String>,
    /// The links' gateway reports.
    gateways: super::gateways::Gateways,
}

impl Worker {
    pub(super) fn new(
        client: Client,
        recorder: EventRecorder,
        metrics: Arc<Metrics>,
        leader: Option<Leadership>,
        local_cluster: &str,
        namespaces: service_mirror_core::NamespaceFilter,
        imports: Imports,
    ) -> Self {
        Self {
            client,
            recorder,
            metrics,
            leader,
            index: ExportIndex::new(local_cluster, namespaces, std::time::Instant::now()),
            dirty: BTreeSet::new(),
            retries: BTreeMap::new(),
            written: BTreeMap::new(),
            verdicts: BTreeMap::new(),
            unlisted: Vec::new(),
            imports,
            expected: None,
            removed: BTreeSet::new(),
            gateways: Default::default(),
        }
    }

    pub(super) async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Msg>,
        cancel: CancellationToken,
    ) {
        loop {
            let wake = self.next_wake();
            let mut leader = self.leader.clone();
            tokio::select! {
                () = cancel.cancelled() => return,
                msg = rx.recv() => {
                    let Some(msg) = msg else { return };
                    self.handle(msg);
                    // Everything already queued first: one judgement per key per batch.
                    while let Ok(msg) = rx.try_recv() {
                        self.handle(msg);
                    }
                    self.metrics
                        .mcs
                        .clusters_listed
                        .set(self.index.listed_count() as i64);
                }
                () = leader_changed(leader.as_mut()) => {
                    // Its predecessor may have left anything: every name is judged.
                    self.dirty.extend(self.index.keys());
                    self.dirty.extend(self.index.local_keys());
                    self.dirty.extend(self.imports.keys());
                    self.leader = leader;
                }
                () = sleep_until(wake) => {}
            }
            self.flush().await;
        }
    }

    fn handle(&mut self, msg: Msg) {
        let now = std::time::Instant::now();
        let changed: Changed = match msg {
            Msg::Feed {
                cluster,
                generation,
            } => {
                self.index.feed(&cluster, generation, now);
                self.gateways.feed(&cluster, generation);
                self.removed.remove(&*cluster);
                Changed::new()
            }
            Msg::Expect(clusters) => {
                self.expected = Some(clusters);
                self.imports.keys()
            }
            Msg::Removed(cluster) => {
                if let Some(now) = self.gateways.removed(&cluster) {
                    self.imports.gateway(&cluster, now);
                }
                self.removed.insert(cluster);
                self.imports.keys()
            }
            Msg::Export {
                cluster,
                generation,
                event,
            } => {
                let was = self.index.counts(&cluster);
                let changed = self.index.export_event(&cluster, generation, &event);
                self.counted(&cluster, was, changed)
            }
            Msg::Service {
                cluster,
                generation,
                event,
            } => {
                let was = self.index.counts(&cluster);
                let changed = self.index.service_event(&cluster, generation, &event);
                self.counted(&cluster, was, changed)
            }
            Msg::Ended {
                cluster,
                generation,
            } => {
                let mut changed = self.index.remove(&cluster, generation);
                if let Some(now) = self.gateways.ended(&cluster, generation) {
                    changed.extend(self.imports.gateway(&cluster, now));
                }
                changed
            }
            Msg::Import(event) => {
                let was = self.imports.listed();
                let changed = self.imports.import_event(&event);
                self.imports_listed(was, changed)
            }
            Msg::Derived(event) => {
                let was = self.imports.listed();
                let changed = self.imports.derived_event(&event);
                self.imports_listed(was, changed)
            }
            Msg::Slice(event) => {
                let was = self.imports.slices_listed();
                let mut changed = self.imports.slice_event(&event);
                if !was && self.imports.slices_listed() {
                    changed.extend(self.imports.keys()); // slices wait for their list
                }
                changed
            }
            Msg::LocalSlice(event) => self.imports.local_slice_event(&event),
            Msg::Gateway {
                cluster,
                generation,
                gateway,
            } => match self.gateways.report(&cluster, generation, gateway) {
                Some(now) => self.imports.gateway(&cluster, now),
                None => Changed::new(),
            },
        };
        self.dirty.extend(changed);
    }

    /// `changed`, and every import once `cluster` starts to count: an import it held up
    /// (listed in its status, no longer exported there) is judged again, which its own
    /// list would not do.
    fn counted(&self, cluster: &str, was: bool, mut changed: Changed) -> Changed {
        if !was && self.index.counts(cluster) {
            changed.extend(self.imports.keys());
        }
        changed
    }

    /// `changed`, and every name once both local import lists are in (imports wait
    /// for them).
    fn imports_listed(&self, was: bool, mut changed: Changed) -> Changed {
        if !was && self.imports.listed() {
            changed.extend(self.index.keys());
            changed.extend(self.imports.keys());
        }
        changed
    }

    /// When to look again without a message: the end of a hold (nothing is judged
    /// before it: a retry due then would only spin), else a retry due, or in a second
    /// if keys wait for a leadership that came back without a change being said.
    fn next_wake(&self) -> Option<Instant> {
        if let Some(hold) = self.index.held_until(std::time::Instant::now()) {
            return Some(Instant::from_std(hold));
        }
        if !self.leading() {
            // Retries wait for leadership (its change marks every key again): due ones
            // would only wake the loop at once, over and over.
            return (!self.dirty.is_empty() || !self.retries.is_empty())
                .then(|| Instant::now() + Duration::from_secs(1));
        }
        self.retries.values().map(|(at, _)| *at).min()
    }

    fn leading(&self) -> bool {
        self.leader.as_ref().is_none_or(Leadership::leading)
    }

    /// Judges every dirty key and every retry due, unless the view is incomplete.
    async fn flush(&mut self) {
        let now = Instant::now();
        if !self.index.local_listed() || self.index.held_until(now.into_std()).is_some() {
            return;
        }
        let unlisted: Vec<String> = self
            .index
            .unlisted()
            .into_iter()
            .map(String::from)
            .collect();
        if unlisted != self.unlisted {
            if !unlisted.is_empty() {
                tracing::warn!(clusters = ?unlisted, "judging exports without these linked clusters: their exports have not listed (an import they are listed in is kept)");
            }
            // Imports kept while a cluster was unlisted are looked at again.
            self.dirty.extend(self.imports.keys());
            self.unlisted = unlisted;
        }
        let due: Vec<ServiceKey> = self
            .retries
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        self.dirty.extend(due);
        let mut keys = std::mem::take(&mut self.dirty).into_iter();
        while let Some(key) = keys.next() {
            if !self.leading() {
                // Kept for when we lead again (the term may end by its deadline with no
                // change said, and come back the same way).
                self.dirty.insert(key);
                self.dirty.extend(keys);
                break;
            }
            let failures = self.retries.get(&key).map_or(0, |(_, n)| *n);
            if failures > 0 && self.retries[&key].0 > now {
                continue; // judged when due
            }
            match self.judge(&key).await {
                Outcome::Done | Outcome::Dropped => {
                    self.retries.remove(&key);
                }
                Outcome::Retry => {
                    let next = failures + 1;
                    self.retries
                        .insert(key, (Instant::now() + RETRY.delay(next), next));
                }
            }
        }
        self.count();
    }

    /// The gauge of local exports by verdict.
    fn count(&self) {
        let mut by_state: BTreeMap<&str, i64> = [
            "Exported",
            "Conflict",
            Validity::NoService.reason(),
            Validity::InvalidServiceType.reason(),
        ]
        .into_iter()
        .map(|s| (s, 0))
        .collect();
        for (_, verdict) in self.verdicts.values() {
            *by_state.entry(verdict.state()).or_default() += 1;
        }
        for (state, n) in by_state {
            self.metrics
                .mcs
                .exports
                .get_or_create(&super::metrics::StateLabels {
                    state: state.into(),
                })
                .set(n);
        }
    }

    /// Judges the name `key`: the local export's conditions, then the local import.
    async fn judge(&mut self, key: &ServiceKey) -> Outcome {
        let exports = self.index.exports(key);
        let merged = merge(&exports);
        let status = self.judge_export(key, &exports, &merged).await;
        // No export left anywhere deletes the import only if every cluster counts.
        if !self.imports.listed() {
            return status; // the import is looked at once both local lists are in
        }
        let settling = Settling {
            feeds: self.index.feeds(),
            local: self.index.local(),
            expected: self.expected.as_ref(),
            removed: &self.removed,
        };
        let import = self.imports.sync(key, &merged, &settling).await;
        status.max(import)
    }

    /// The conditions of the local export of `key`, if there is one: gathered, judged
    /// (`decide::decide_export`), then remembered, told and written.
    async fn judge_export(
        &mut self,
        key: &ServiceKey,
        exports: &[service_mirror_core::mcs::ClusterExport],
        merged: &Merge,
    ) -> Outcome {
        let export = self.index.local_export(key).cloned();
        let local = exports.iter().find(|e| e.cluster == self.index.local());
        let step = decide_export(&ExportFacts {
            export: export.as_ref(),
            local,
            merged,
            last: self.verdicts.get(key),
            written: self.written.get(key),
            leading: self.leading(),
            now: Timestamp::now(),
        });
        let (export, judged) = match (export, step) {
            (Some(export), ExportStep::Judged(judged)) => (export, judged),
            (_, ExportStep::Forget) => {
                self.verdicts.remove(key);
                self.written.remove(key);
                return Outcome::Done;
            }
            _ => return Outcome::Done,
        };
        if let Some(verdict) = judged.remember {
            self.verdicts.insert(key.clone(), verdict);
        }
        if let Some(told) = judged.event {
            self.tell(&export, told.type_, told.reason, told.note).await;
        }
        match judged.conditions {
            Some(conditions) => self.write(key, &export, &conditions).await,
            None => Outcome::Done,
        }
    }

    /// Applies `conditions` to the status of `export`.
    async fn write(
        &mut self,
        key: &ServiceKey,
        export: &ServiceExport,
        conditions: &[Condition],
    ) -> Outcome {
        let api: Api<ServiceExport> = Api::namespaced(self.client.clone(), &key.namespace);
        let params = PatchParams::apply(FIELD_MANAGER);
        let body = Patch::Apply(status_apply(export, conditions));
        let before = export.metadata.resource_version.clone();
        let (outcome, result) = match api.patch_status(&key.name, &params, &body).await {
            Ok(after) => {
                if after.metadata.resource_version != before
                    && let Some(rv) = before
                {
                    self.written.insert(key.clone(), rv);
                }
                ("applied", Outcome::Done)
            }
            Err(e) => {
                let end = status_write_error(api_status(&e));
                if let Some(told) = end.event {
                    self.tell(export, told.type_, told.reason, told.note).await;
                }
                if end.remember
                    && let Some(rv) = before.clone()
                {
                    self.written.insert(key.clone(), rv);
                }
                if end.outcome == Outcome::Retry {
                    tracing::warn!(export = %key, error = %e, "ServiceExport status write failed; retrying with backoff");
                }
                (end.label, end.outcome)
            }
        };
        self.metrics.mcs.wrote(outcome);
        result
    }

    async fn tell(&self, export: &ServiceExport, type_: EventType, reason: &str, note: String) {
        let mut reference: ObjectReference = export.object_ref(&());
        reference.resource_version = None;
        self.recorder
            .publish(&reference, type_, reason, "Export", note)
            .await;
    }
}

/// The next leadership change; never, without an election (or once it is gone).
async fn leader_changed(leader: Option<&mut Leadership>) {
    if let Some(l) = leader
        && l.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
