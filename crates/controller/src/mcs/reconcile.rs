//! The reconcile of one name, run by the runtime's workers behind the gate (the local
//! cluster listed, leader): judges the local ServiceExport of the name against the
//! exports of the same name in every listed cluster (`service_mirror_core::mcs`) and
//! applies its conditions to the export's status; then brings the name's local
//! ServiceImport, derived Service and slices to the merge (`imports.rs`). Each step
//! gathers what the shared index and caches hold (copied under the lock), asks
//! `decide.rs` what to do (pure, table-tested), and applies that, unlocked.
//!
//! One status write per change: the conditions are compared with the export as the
//! cache holds it (transition times kept where the status did not change), and a write
//! is not repeated while the cache still shows the export as it was before that write.
//!
//! Workers: the queue hands a key to one worker at a time, and every key writes only
//! its own export's status and its own import's objects; what reconcile remembers is
//! kept per key in the shared state. A write that fails is retried with the queue's
//! backoff (1 s doubling to 1 min).

use super::decide::{
    ExportFacts, ExportStep, ExportToProblem, ExportToStep, Settling, decide_export,
    decide_export_to,
};
use super::imports::Imports;
use super::imports::cache::ImportFacts;
use super::resource::ServiceExport;
use super::shared::Shared;
use super::write_errors::{Outcome as Wrote, api_status, status_write_error};
use crate::backoff::Backoff;
use crate::events::EventRecorder;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::runtime::{Outcome, Reconcile, WorkQueue};
use crate::writer::mcs_status::McsStatusWriter;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::runtime::events::EventType;
use parking_lot::Mutex;
use service_mirror_core::ServiceKey;
use service_mirror_core::mcs::{ClusterExport, Merge, Validity, exports_reaching, merge};
use service_mirror_core::traffic::{TrafficDefaults, TrafficPolicy, export_traffic};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// Retries of a failed write: 1 s doubling to 1 min.
pub(super) const RETRY: Backoff =
    Backoff::doubling(Duration::from_secs(1), Duration::from_secs(60));

/// Reconcile workers. A name's writes are a few requests (a status patch; an import,
/// its status, a derived Service, a slice per cluster), each a round trip: one worker
/// judged one name at a time, and the cold sync of 1,000 exports x 2 clusters took
/// 2.55x the reference writer. 16 keep the apiserver, not our round trips, the bound.
pub(super) const WORKERS: usize = 16;

/// The problems last told of local exports' annotations, by key: (uid, problem).
type Told = BTreeMap<ServiceKey, (Option<String>, ExportToProblem)>;

/// Which of the local export's annotations a problem is of (`Reconciler::tell_once`).
#[derive(Clone, Copy)]
enum Annotation {
    /// `service-mirror.io/export-to`.
    ExportTo,
    /// `service-mirror.io/locality`, `service-mirror.io/local-minimum`.
    Traffic,
}

/// A reconcile had a write to retry (already logged and counted where it failed).
#[derive(Debug)]
pub(super) struct Retry;

pub(super) struct Reconciler {
    pub(super) shared: Arc<Mutex<Shared>>,
    pub(super) queue: WorkQueue<ServiceKey>,
    /// The writer of the local exports' conditions.
    pub(super) status: McsStatusWriter,
    pub(super) recorder: EventRecorder,
    pub(super) metrics: Arc<Metrics>,
    pub(super) leader: Option<Leadership>,
    /// This cluster's name.
    pub(super) local: String,
    /// Where imports' traffic goes by default (`--traffic-locality`,
    /// `--cluster-priority`).
    pub(super) traffic: TrafficDefaults,
    /// The writer of the local imports.
    pub(super) imports: Imports,
}

/// What one reconcile judges from: copied from the shared state under its lock.
struct Gathered {
    exports: Vec<ClusterExport>,
    export: Option<ServiceExport>,
    last: Option<(Option<String>, super::decide::Verdict)>,
    /// The `export-to` problem last told of the local export.
    last_export_to: Option<(Option<String>, ExportToProblem)>,
    /// The traffic-annotation problem last told of the local export.
    last_traffic: Option<(Option<String>, ExportToProblem)>,
    written: Option<String>,
    /// Both local import lists are in (no import is written before).
    imports_listed: bool,
    feeds: BTreeMap<String, bool>,
    expected: Option<BTreeSet<String>>,
    removed: BTreeSet<String>,
    facts: ImportFacts,
}

impl Reconcile<ServiceKey> for Reconciler {
    type Error = Retry;

    fn meter(&self) -> Option<crate::runtime::metrics::Meter<'_>> {
        Some(crate::runtime::metrics::Meter {
            families: &self.metrics.runtime,
            component: "mcs",
        })
    }

    async fn reconcile(&self, key: &ServiceKey) -> Result<Outcome, Retry> {
        let gathered = match self.gather(key) {
            Ok(gathered) => gathered,
            Err(hold) => return Ok(Outcome::RequeueAfter(hold)),
        };
        match self.judge(key, gathered).await {
            Wrote::Retry => Err(Retry),
            Wrote::Done | Wrote::Dropped => Ok(Outcome::Done),
        }
    }

    async fn failed(&self, key: &ServiceKey, _: Retry, failures: u32) {
        tracing::debug!(name = %key, failures, "MCS write failed; retrying with backoff");
    }
}

impl Reconciler {
    fn leading(&self) -> bool {
        self.leader.as_ref().is_none_or(Leadership::leading)
    }

    /// What `key` is judged from; `Err(left)` while an unlisted linked cluster holds
    /// every judgement (the key comes back at the hold's end).
    fn gather(&self, key: &ServiceKey) -> Result<Gathered, Duration> {
        let now = std::time::Instant::now();
        let (gathered, again) = {
            let mut s = self.shared.lock();
            if let Some(end) = s.index.held_until(now) {
                return Err(end
                    .saturating_duration_since(now)
                    .max(Duration::from_millis(1)));
            }
            let again = note_unlisted(&mut s);
            self.note_priority(&mut s);
            let gathered = Gathered {
                exports: s.index.exports(key),
                export: s.index.local_export(key).cloned(),
                last: s.verdicts.get(key).cloned(),
                last_export_to: s.export_to.get(key).cloned(),
                last_traffic: s.traffic.get(key).cloned(),
                written: s.written.get(key).cloned(),
                imports_listed: s.cache.listed(),
                feeds: s.index.feeds(),
                expected: s.expected.clone(),
                removed: s.removed.clone(),
                facts: s.cache.facts(key),
            };
            (gathered, again)
        };
        // Queued with the shared state unlocked: the queue has its own lock, and the
        // index task and 16 workers wait on this one.
        for key in again {
            self.queue.add(key);
        }
        Ok(gathered)
    }

    /// Judges the name `key`: the local export's conditions (from the merge of every
    /// export: they describe the name across the cluster set), then the local import
    /// (from the merge of the exports that reach this cluster: `export-to`).
    async fn judge(&self, key: &ServiceKey, g: Gathered) -> Wrote {
        let merged = merge(&g.exports);
        let status = self.judge_export(key, &g, &merged).await;
        // No export left anywhere deletes the import only if every cluster counts.
        if !g.imports_listed {
            return status; // the import is looked at once both local lists are in
        }
        let reaching = merge(&exports_reaching(&g.exports, &self.local));
        let traffic = self.traffic_of(&g, &reaching);
        let settling = Settling {
            feeds: g.feeds,
            local: &self.local,
            expected: g.expected.as_ref(),
            removed: &g.removed,
        };
        let import = self
            .imports
            .sync(key, &g.facts, &reaching, &settling, &traffic)
            .await;
        status.max(import)
    }

    /// The conditions of the local export of `key`, if there is one: gathered, judged
    /// (`decide::decide_export`), then remembered, told and written.
    async fn judge_export(&self, key: &ServiceKey, g: &Gathered, merged: &Merge) -> Wrote {
        let local = g.exports.iter().find(|e| e.cluster == self.local);
        let step = decide_export(&ExportFacts {
            export: g.export.as_ref(),
            local,
            merged,
            last: g.last.as_ref(),
            written: g.written.as_ref(),
            leading: self.leading(),
            now: Timestamp::now(),
        });
        let (export, judged) = match (&g.export, step) {
            (Some(export), ExportStep::Judged(judged)) => (export, judged),
            (_, ExportStep::Forget) => {
                let forgot = {
                    let mut s = self.shared.lock();
                    s.written.remove(key);
                    s.export_to.remove(key);
                    s.traffic.remove(key);
                    s.verdicts.remove(key).is_some()
                };
                if forgot {
                    self.count();
                }
                return Wrote::Done;
            }
            _ => return Wrote::Done,
        };
        if let Some(verdict) = judged.remember {
            self.shared.lock().verdicts.insert(key.clone(), verdict);
            self.count();
        }
        if let Some(told) = judged.event {
            self.tell(export, told.type_, told.reason, told.note).await;
        }
        self.judge_export_to(key, g, export).await;
        self.judge_traffic(key, g, export).await;
        match judged.conditions {
            Some(conditions) => self.write(key, export, &conditions).await,
            None => Wrote::Done,
        }
    }

    /// Tells a problem of the local export's `export-to` annotation once per episode:
    /// a warning, the metric and a Warning Event on the export.
    async fn judge_export_to(&self, key: &ServiceKey, g: &Gathered, export: &ServiceExport) {
        let Some(local) = g.exports.iter().find(|e| e.cluster == self.local) else {
            return;
        };
        let now = ExportToProblem::of(&local.export_to, &self.local, &g.feeds, g.expected.as_ref());
        let last = g.last_export_to.as_ref();
        self.tell_once(key, export, Annotation::ExportTo, now, last)
            .await;
    }

    /// Tells `now`, a problem of one of the local export's annotations (`which`), once
    /// per episode (`decide_export_to`, against `last`): remembered, a warning, the
    /// metric and a Warning Event on the export. The note quotes a tenant's text: one
    /// line of printable characters, made so before it is compared with the one told
    /// (else a note that cleaning changes would be told at every reconcile).
    async fn tell_once(
        &self,
        key: &ServiceKey,
        export: &ServiceExport,
        which: Annotation,
        now: Option<ExportToProblem>,
        last: Option<&(Option<String>, ExportToProblem)>,
    ) {
        let now = now.map(|mut p| {
            p.note = crate::links::sanitize_remote_text(&p.note);
            (export.metadata.uid.clone(), p)
        });
        let problem = match decide_export_to(now, last, self.leading()) {
            ExportToStep::Nothing => return,
            ExportToStep::Forget => {
                self.remembered(which, |m| m.remove(key));
                return;
            }
            ExportToStep::Tell((uid, problem)) => {
                self.remembered(which, |m| m.insert(key.clone(), (uid, problem.clone())));
                problem
            }
        };
        let (family, what) = match which {
            Annotation::ExportTo => (&self.metrics.mcs.export_to_problems, "export-to annotation"),
            Annotation::Traffic => (&self.metrics.mcs.traffic_problems, "traffic annotations"),
        };
        tracing::warn!(export = %key, reason = problem.reason, "ServiceExport's {what}: {}", problem.note);
        family
            .get_or_create(&super::metrics::ReasonLabels {
                reason: problem.reason.into(),
            })
            .inc();
        self.tell(export, EventType::Warning, problem.reason, problem.note)
            .await;
    }

    /// Applies `f` to the memory of problems told of `which` annotation (under the lock).
    fn remembered<T>(&self, which: Annotation, f: impl FnOnce(&mut Told) -> T) -> T {
        let mut s = self.shared.lock();
        match which {
            Annotation::ExportTo => f(&mut s.export_to),
            Annotation::Traffic => f(&mut s.traffic),
        }
    }

    /// Where the import of `g`'s name goes: this controller's defaults, the local
    /// export's annotations, the import's `internalTrafficPolicy` and
    /// `trafficDistribution` (`core::traffic`).
    fn traffic_of(&self, g: &Gathered, reaching: &Merge) -> TrafficPolicy {
        let export = export_traffic(
            g.export
                .as_ref()
                .and_then(|e| e.metadata.annotations.as_ref()),
        );
        let spec = reaching.import.as_ref();
        TrafficPolicy::of(
            self.traffic.locality,
            &self.traffic.priority,
            &export,
            spec.and_then(|s| s.internal_traffic_policy.as_deref()),
            spec.and_then(|s| s.traffic_distribution.as_deref()),
        )
    }

    /// Tells a problem of the local export's traffic annotations
    /// (`service-mirror.io/locality`, `service-mirror.io/local-minimum`) once per
    /// episode: a warning, the metric and a Warning Event `InvalidTrafficAnnotation`.
    async fn judge_traffic(&self, key: &ServiceKey, g: &Gathered, export: &ServiceExport) {
        let problems = export_traffic(export.metadata.annotations.as_ref()).problems;
        let now = (!problems.is_empty()).then(|| ExportToProblem {
            reason: "InvalidTrafficAnnotation",
            note: problems.join("; "),
        });
        let last = g.last_traffic.as_ref();
        self.tell_once(key, export, Annotation::Traffic, now, last)
            .await;
    }

    /// Logs, once per change, the `--cluster-priority` clusters that no link source
    /// names (once the sources are listed) and sets their gauge: they take no traffic
    /// until a link to them runs, and a typo there is otherwise silent.
    fn note_priority(&self, s: &mut Shared) {
        if self.traffic.priority.is_empty() {
            return;
        }
        let Some(expected) = s.expected.as_ref() else {
            return;
        };
        let feeds = s.index.feeds();
        let unknown: Vec<String> = self
            .traffic
            .priority
            .iter()
            .filter(|c| !expected.contains(*c) && !feeds.contains_key(*c))
            .cloned()
            .collect();
        if s.priority_unknown.as_ref() == Some(&unknown) {
            return;
        }
        if !unknown.is_empty() {
            tracing::warn!(clusters = ?unknown, "--cluster-priority names clusters that no link source names: they take no traffic until linked");
        }
        self.metrics.mcs.priority_unknown.set(unknown.len() as i64);
        s.priority_unknown = Some(unknown);
    }

    /// The gauge of local exports by verdict.
    pub(super) fn count(&self) {
        let mut by_state: BTreeMap<&str, i64> = [
            "Exported",
            "Conflict",
            Validity::NoService.reason(),
            Validity::InvalidServiceType.reason(),
        ]
        .into_iter()
        .map(|s| (s, 0))
        .collect();
        // Counted and set under the lock: with 16 workers an older count set after a
        // newer one would leave the gauge wrong until the next change.
        let s = self.shared.lock();
        for (_, verdict) in s.verdicts.values() {
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

    /// Applies `conditions` to the status of `export`, through the status writer.
    async fn write(
        &self,
        key: &ServiceKey,
        export: &ServiceExport,
        conditions: &[Condition],
    ) -> Wrote {
        let before = export.metadata.resource_version.clone();
        let (outcome, result) = match self.status.export_conditions(export, conditions).await {
            Ok(after) => {
                if after.metadata.resource_version != before
                    && let Some(rv) = before
                {
                    self.shared.lock().written.insert(key.clone(), rv);
                }
                ("applied", Wrote::Done)
            }
            // The lead was lost since the gate let this key through: nothing was sent;
            // the next leader judges every name (and so do we once we lead again).
            Err(crate::error::Error::NotLeader) => return Wrote::Dropped,
            Err(crate::error::Error::Kube(e)) => {
                let end = status_write_error(api_status(&e));
                if let Some(told) = end.event {
                    self.tell(export, told.type_, told.reason, told.note).await;
                }
                if end.remember
                    && let Some(rv) = before.clone()
                {
                    self.shared.lock().written.insert(key.clone(), rv);
                }
                if end.outcome == Wrote::Retry {
                    tracing::warn!(export = %key, error = %e, "ServiceExport status write failed; retrying with backoff");
                }
                (end.label, end.outcome)
            }
            // None other comes back from a status write.
            Err(e) => {
                tracing::warn!(export = %key, error = %e, "ServiceExport status write failed; retrying with backoff");
                ("failed", Wrote::Retry)
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

/// Logs a change of the linked clusters judged without (not listed, past their hold),
/// once, and says which names to look at again: every import (one kept while a
/// cluster was unlisted may go now); none while the clusters are as last noted.
fn note_unlisted(s: &mut Shared) -> super::index::Changed {
    let unlisted: Vec<String> = s.index.unlisted().into_iter().map(String::from).collect();
    if unlisted == s.unlisted {
        return super::index::Changed::new();
    }
    if !unlisted.is_empty() {
        tracing::warn!(clusters = ?unlisted, "judging exports without these linked clusters: their exports have not listed (an import they are listed in is kept)");
    }
    s.unlisted = unlisted;
    s.cache.keys()
}
