//! The federation's `reconcile(key)`, run by the runtime's workers: plans one key with
//! the pure core from a copy of the shared index and the stored objects, and writes the
//! difference while leader. A failed write is an error: the work queue retries the key
//! with its backoff ([`RETRY`]). Problems (refused members, port conflicts, a foreign
//! `<svc>-federated`) are reported once per episode (`report.rs`).
//!
//! Several workers are safe: the queue hands a key to one worker at a time, every key
//! writes only its own `<svc>-federated` Service and slices, what reconcile remembers is
//! kept per key, and the shared state is locked only between awaits.

use super::Msg;
use super::shared::Shared;
use super::watches::Stored;
use crate::backoff::Backoff;
use crate::error::Error;
use crate::events::EventRecorder;
use crate::link_controller::link_status::Observed;
use crate::metrics::Metrics;
use crate::runtime::{Outcome, Reconcile, WorkQueue};
use crate::writer::{Applied, LocalWriter};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::runtime::reflector::ObjectRef;
use parking_lot::Mutex;
use service_mirror_core::federated::{
    DesiredService, FederationInput, Member, MemberRefusal, desired_federated, federated_name,
    plan_federated,
};
use service_mirror_core::is_owned_federated;
use service_mirror_core::labels::{REMOTE_DISCOVERY_ANNOTATION, SERVICE_NAME_LABEL};
use service_mirror_core::traffic::{TrafficDefaults, TrafficPolicy, export_traffic};
use service_mirror_core::{Action, Object, ServiceKey};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A failed write is retried after 1 s, doubling up to 60 s (a slice held by someone
/// else is looked at again this often).
pub(super) const RETRY: Backoff =
    Backoff::doubling(Duration::from_secs(1), Duration::from_secs(60));

/// Reconcile workers. The writes of one key are a few requests; 4 keep a burst of
/// changed keys (a link relisting) from waiting on one slow write.
pub(super) const WORKERS: usize = 4;

pub(super) struct Reconciler {
    pub(super) shared: Arc<Mutex<Shared>>,
    pub(super) stored: Stored,
    pub(super) queue: WorkQueue<ServiceKey>,
    pub(super) leader: Option<crate::leader::Leadership>,
    pub(super) writer: LocalWriter,
    pub(super) recorder: EventRecorder,
    pub(super) metrics: Arc<Metrics>,
    /// Our namespace (the ownership annotation).
    pub(super) namespace: String,
    /// For the watch of a foreign Service holding a federated name.
    pub(super) client: Client,
    /// To the index task (the foreign Service's watch reports there).
    pub(super) tx: mpsc::UnboundedSender<Msg>,
    /// Where federated traffic goes by default (`--traffic-locality`,
    /// `--cluster-priority`).
    pub(super) traffic: TrafficDefaults,
}

impl Reconcile<ServiceKey> for Reconciler {
    type Error = Error;

    fn meter(&self) -> Option<crate::runtime::metrics::Meter<'_>> {
        Some(crate::runtime::metrics::Meter {
            families: &self.metrics.runtime,
            component: "federation",
        })
    }

    async fn reconcile(&self, key: &ServiceKey) -> Result<Outcome, Error> {
        let result = Reconciler::reconcile(self, key).await;
        let present = self.shared.lock().present.len();
        self.metrics.federation.services.set(present as i64);
        result
    }

    async fn failed(&self, key: &ServiceKey, e: Error, failures: u32) {
        let name = federated_name(&key.name);
        tracing::warn!(%key, federated = %name, failures, error = %e, "federated write failed; retrying");
        self.metrics.federation.problem("FederatedWriteFailed");
    }
}

impl Reconciler {
    /// What the election says now.
    fn leading(&self) -> bool {
        self.leader.as_ref().is_none_or(|l| l.leading())
    }

    async fn reconcile(&self, key: &ServiceKey) -> Result<Outcome, Error> {
        let name = federated_name(&key.name);
        let stored = self
            .stored
            .services
            .get(&ObjectRef::new(&name).within(&key.namespace));
        let ns = self.namespace.as_str();
        let stored_annotation = stored
            .as_ref()
            .filter(|s| is_owned_federated(&s.metadata, ns))
            .and_then(|s| {
                s.metadata
                    .annotations
                    .as_ref()?
                    .get(REMOTE_DISCOVERY_ANNOTATION)
                    .cloned()
            });
        let (members, gateways, pending, local_slices) = {
            let s = self.shared.lock();
            (
                s.index.members(key),
                s.index.gateways().clone(),
                s.pending(),
                s.local_slices.of(key),
            )
        };
        self.watch_local_slices(key, &members);
        let traffic = self.traffic_of(key, &members).await;
        let desired = desired_federated(
            &FederationInput {
                namespace: &key.namespace,
                name: &key.name,
                members: &members,
                gateways: &gateways,
                pending: &pending,
                controller_namespace: ns,
                local_slices: local_slices.as_deref(),
                traffic: &traffic,
            },
            stored_annotation.as_deref(),
        );
        self.report_refused(key, &desired.refused).await;
        let slices: Vec<EndpointSlice> = self
            .stored
            .slices
            .state()
            .iter()
            .filter(|s| {
                s.metadata.namespace.as_deref() == Some(key.namespace.as_str())
                    && s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(SERVICE_NAME_LABEL))
                        == Some(&name)
            })
            .map(|s| (**s).clone())
            .collect();
        let plan = plan_federated(&desired, stored.as_deref(), &slices, ns);
        let blocked = {
            let mut s = self.shared.lock();
            match desired.service {
                DesiredService::Absent => {
                    // Nothing to create: the foreign Service no longer matters.
                    s.unblock(key);
                    s.present.remove(key)
                }
                _ => s.present.insert(key.clone()),
            };
            s.blocked.get(key).is_some_and(|(present, _)| *present)
        };
        self.record_status(key, &members, &desired.refused, blocked || plan.foreign);
        if blocked {
            // Reported once when found; the foreign Service's watch plans again.
            return Ok(Outcome::Done);
        }
        if plan.foreign {
            let foreign = stored.as_deref().is_some();
            self.report_foreign(key, &name, foreign).await;
            return Ok(Outcome::Done);
        }
        self.report_conflicts(key, &name, &desired.conflicts).await;
        for action in &plan.actions {
            if !self.leading() {
                // Leadership lost mid-plan: stop writing. The key waits in the queue
                // behind the workers' gate (the next leader plans every key anyway).
                self.queue.add(key.clone());
                return Ok(Outcome::Done);
            }
            match self.writer.execute(action).await {
                Ok(Applied::Done) => {}
                // The watch event bringing the newer version plans the key again.
                Ok(Applied::Stale) => return Ok(Outcome::Done),
                // A foreign Service holds the name (our store sees only ours): no retry
                // loop; its watch plans the key again when it changes or goes. Only a
                // Service create blocks: that watch follows the Service, so a slice
                // held by someone else would unblock at once and loop; it is retried
                // with the queue's backoff instead.
                Err(Error::OwnershipConflict { .. })
                    if matches!(action, Action::Create(Object::Service(_))) =>
                {
                    self.record_status(key, &members, &desired.refused, true);
                    self.report_foreign(key, &name, true).await;
                    self.block(key, &name);
                    return Ok(Outcome::Done);
                }
                Err(e) => return Err(e),
            }
        }
        self.shared.lock().foreign.remove(key);
        if !plan.actions.is_empty() {
            tracing::info!(%key, federated = %name, writes = plan.actions.len(), "federated service written");
        }
        Ok(Outcome::Done)
    }

    /// Where `key`'s federated traffic goes: this controller's defaults and the local
    /// member's own annotations (`service-mirror.io/locality`, `local-minimum`) and
    /// `trafficDistribution` (`core::traffic`). A bad annotation is told once per
    /// episode: a warning, a Warning Event on the local member, the metric.
    async fn traffic_of(&self, key: &ServiceKey, members: &[Member]) -> TrafficPolicy {
        let local = members.iter().find(|m| m.cluster.is_none());
        let annotations = local.and_then(|m| m.service.metadata.annotations.as_ref());
        let export = export_traffic(annotations);
        let distribution = local
            .and_then(|m| m.service.spec.as_ref())
            .and_then(|s| s.traffic_distribution.as_deref());
        let policy = TrafficPolicy::of(
            self.traffic.locality,
            &self.traffic.priority,
            &export,
            None,
            distribution,
        );
        let new = {
            let mut s = self.shared.lock();
            let last = s.traffic.get(key).cloned().unwrap_or_default();
            if last == export.problems {
                None
            } else {
                match export.problems.is_empty() {
                    true => s.traffic.remove(key),
                    false => s.traffic.insert(key.clone(), export.problems.clone()),
                };
                (!export.problems.is_empty()).then_some(export.problems)
            }
        };
        if let Some(problems) = new {
            let reason = "InvalidTrafficAnnotation";
            let note = crate::links::sanitize_remote_text(&problems.join("; "));
            tracing::warn!(%key, reason, "federated member's traffic annotations: {note}");
            self.metrics.federation.problem(reason);
            self.report_traffic(key, reason, note).await;
        }
        policy
    }

    /// Starts the watch of `key`'s local member's EndpointSlices when it has one, and
    /// stops it when it has none (`local_slices.rs`): its first list plans the key again.
    fn watch_local_slices(&self, key: &ServiceKey, members: &[Member]) {
        let local = members.iter().any(|m| m.cluster.is_none());
        let cancel = {
            let mut s = self.shared.lock();
            match (local, s.local_slices.watching(key)) {
                (true, false) => {
                    let cancel = CancellationToken::new();
                    s.local_slices.started(key.clone(), cancel.clone());
                    cancel
                }
                (false, true) => {
                    s.local_slices.stop(key);
                    return;
                }
                _ => return,
            }
        };
        tokio::spawn(super::local_slices::watch(
            self.client.clone(),
            key.clone(),
            self.tx.clone(),
            cancel,
        ));
    }

    /// A create of `key`'s `name` found a foreign Service: watched from now on, no
    /// write tried until it changes or goes.
    fn block(&self, key: &ServiceKey, name: &str) {
        let cancel = {
            let mut s = self.shared.lock();
            if s.blocked.contains_key(key) {
                return;
            }
            let cancel = CancellationToken::new();
            s.blocked.insert(key.clone(), (true, cancel.clone()));
            cancel
        };
        tokio::spawn(super::watches::watch_foreign(
            self.client.clone(),
            key.clone(),
            name.to_owned(),
            self.namespace.clone(),
            self.tx.clone(),
            cancel,
        ));
    }

    /// Records `key`'s remote members in their Links' status books: `Mirrored` (into
    /// `<svc>-federated`), `InvalidService` (refused), `Error` (the name is held by a
    /// foreign Service); a cluster no longer a member loses its entry. The books' writers
    /// write only while leader, only on a change.
    fn record_status(
        &self,
        key: &ServiceKey,
        members: &[Member],
        refused: &[(String, MemberRefusal)],
        foreign: bool,
    ) {
        let name = federated_name(&key.name);
        let mut s = self.shared.lock();
        let mut now = BTreeSet::new();
        for member in members {
            let Some(cluster) = &member.cluster else {
                continue;
            };
            let Some(book) = s.books.get(cluster) else {
                continue;
            };
            let id = member.id();
            let observed = match refused.iter().find(|(m, _)| *m == id) {
                Some((_, why)) => Observed::Invalid(why.detail().to_owned()),
                None if foreign => Observed::Error(format!(
                    "Service {}/{name} exists and is not this controller's federated Service",
                    key.namespace
                )),
                None => Observed::Mirrored {
                    local: name.clone(),
                },
            };
            book.observe_federated(key, observed);
            now.insert(cluster.clone());
        }
        let before = match now.is_empty() {
            true => s.entries.remove(key),
            false => s.entries.insert(key.clone(), now.clone()),
        };
        for gone in before.unwrap_or_default().difference(&now) {
            if let Some(book) = s.books.get(gone) {
                book.observe_federated(key, Observed::Gone);
            }
        }
    }
}
