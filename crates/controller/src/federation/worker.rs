//! The federation's one worker: applies every [`Msg`] to the index, then, once the
//! local members and the linked clusters are known and while leader, plans each
//! changed key with the pure core and writes the difference. Problems (refused
//! members, port conflicts, a foreign `<svc>-federated`) are reported once per
//! episode: a log line, a Warning Event, a metric.

use super::index::Index;
use super::watches::{Stored, key_of_service};
use super::{FederationOptions, Msg};
use crate::error::Error;
use crate::events::EventRecorder;
use crate::link_controller::link_status::{Observed, StatusBook};
use crate::metrics::Metrics;
use crate::writer::{Applied, LocalWriter};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use service_mirror_core::federated::{
    DesiredService, FederationInput, Member, MemberRefusal, desired_federated, federated_name,
    plan_federated,
};
use service_mirror_core::is_owned_federated;
use service_mirror_core::labels::{REMOTE_DISCOVERY_ANNOTATION, SERVICE_NAME_LABEL};
use service_mirror_core::{Action, ServiceKey};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// First retry of a failed write; doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Slowest retry (a foreign `<svc>-federated` is looked at again this often).
const MAX_RETRY: Duration = Duration::from_secs(60);

pub(super) struct Worker {
    index: Index,
    stored: Stored,
    /// Both stores listed once.
    services_listed: bool,
    slices_listed: bool,
    leader: Option<crate::leader::Leadership>,
    leading: bool,
    writer: LocalWriter,
    recorder: EventRecorder,
    metrics: Arc<Metrics>,
    namespace: String,
    tx: mpsc::UnboundedSender<Msg>,
    dirty: BTreeSet<ServiceKey>,
    retries: BTreeMap<ServiceKey, Duration>,
    /// What was last reported per key (reported again only when it changes).
    refused: BTreeMap<ServiceKey, Vec<(String, MemberRefusal)>>,
    conflicts: BTreeMap<ServiceKey, Vec<String>>,
    foreign: BTreeSet<ServiceKey>,
    /// Keys whose `<svc>-federated` name a foreign Service holds: no write until its
    /// watch (the token stops it) says it changed to ours or went.
    blocked: BTreeMap<ServiceKey, (bool, CancellationToken)>,
    client: Client,
    /// Keys whose federated Service is desired.
    present: BTreeSet<ServiceKey>,
    /// Each Link's status book (its `federatedServices`), by cluster.
    books: BTreeMap<String, Arc<StatusBook>>,
    /// The clusters each key has a status entry in (to remove it when a member leaves).
    entries: BTreeMap<ServiceKey, BTreeSet<String>>,
    /// Messages of links whose write gate is closed (see `held.rs`).
    held: super::held::Held,
    /// The links' write gates.
    gates: Option<crate::write_leases::WriteGates>,
}

fn service_ref(namespace: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

impl Worker {
    pub(super) fn new(
        local: Client,
        recorder: EventRecorder,
        metrics: Arc<Metrics>,
        opts: &FederationOptions,
        stored: Stored,
        tx: mpsc::UnboundedSender<Msg>,
    ) -> Self {
        Self {
            index: Index::default(),
            stored,
            services_listed: false,
            slices_listed: false,
            leading: opts.leader.as_ref().is_none_or(|l| l.leading()),
            leader: opts.leader.clone(),
            blocked: BTreeMap::new(),
            client: local.clone(),
            writer: LocalWriter::federated(
                local,
                &opts.controller_namespace,
                metrics.clone(),
                recorder.clone(),
            )
            .led_by(opts.leader.clone()),
            recorder,
            metrics,
            namespace: opts.controller_namespace.clone(),
            tx,
            dirty: BTreeSet::new(),
            retries: BTreeMap::new(),
            refused: BTreeMap::new(),
            conflicts: BTreeMap::new(),
            foreign: BTreeSet::new(),
            present: BTreeSet::new(),
            books: BTreeMap::new(),
            entries: BTreeMap::new(),
            held: super::held::Held::default(),
            gates: opts.write_gates.clone(),
        }
    }

    /// Whether `cluster`'s messages apply now: not while its link is kept out by its
    /// write Lease (another writer holds it, or, while we lead, it is not ours yet). A
    /// replica that is not the leader applies them all (it writes nothing, and its
    /// index must be whole when it becomes the leader). Always without write gates.
    fn gate_open(gates: &Option<crate::write_leases::WriteGates>, cluster: &str) -> bool {
        gates.as_ref().is_none_or(|g| !g.kept_out(cluster))
    }

    /// Applies `msg` now, or holds it while its link's write gate is closed.
    fn admit(&mut self, msg: Msg) {
        let gates = self.gates.clone();
        if let Some(msg) = self.held.admit(msg, |c| Self::gate_open(&gates, c)) {
            self.apply(msg);
        }
    }

    /// Applies what was held for the links whose gate opened.
    fn release_held(&mut self) {
        let gates = self.gates.clone();
        let released = self.held.release(|c| Self::gate_open(&gates, c));
        if released.is_empty() {
            return;
        }
        for msg in released {
            self.apply(msg);
        }
        // The released clusters are no longer kept as pending: every key looks again.
        let keys = self.all_keys();
        self.dirty.extend(keys);
    }

    pub(super) async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Msg>,
        cancel: CancellationToken,
    ) {
        if let Some(mut leader) = self.leader.clone() {
            let (tx, cancel) = (self.tx.clone(), cancel.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        changed = leader.changed() => if changed.is_err() { return },
                    }
                    let now = leader.leading_and_update();
                    let _ = tx.send(Msg::Leader(now));
                }
            });
        }
        loop {
            // A held link's gate is looked at every 500 ms (it opens within a write
            // Lease pass, 1 s at most, of its Lease being taken).
            let held = self.held.any();
            let msg = tokio::select! {
                _ = cancel.cancelled() => return,
                msg = rx.recv() => msg.map(Some),
                _ = tokio::time::sleep(std::time::Duration::from_millis(500)), if held => Some(None),
            };
            self.release_held();
            match msg {
                None => return,
                Some(None) => {}
                Some(Some(msg)) => self.admit(msg),
            }
            // Everything already queued first: one plan per key for a burst of events.
            while let Ok(msg) = rx.try_recv() {
                self.admit(msg);
            }
            if !self.may_write() {
                continue;
            }
            let keys = std::mem::take(&mut self.dirty);
            let mut keys = keys.into_iter();
            while let Some(key) = keys.next() {
                if cancel.is_cancelled() {
                    return;
                }
                // Leadership lost in the middle of a batch (each key may take several
                // requests): stop at once; the next leader plans every key anyway.
                if !self.still_leading() {
                    self.leading = false;
                    self.dirty.insert(key);
                    self.dirty.extend(keys);
                    break;
                }
                self.reconcile(&key).await;
            }
            self.metrics
                .federation
                .services
                .set(self.present.len() as i64);
        }
    }

    /// What the election says now (not the last `Leader` message handled).
    fn still_leading(&self) -> bool {
        self.leader.as_ref().is_none_or(|l| l.leading())
    }

    fn may_write(&self) -> bool {
        self.leading && self.index.ready() && self.services_listed && self.slices_listed
    }

    /// Every key with a member or a stored federated Service.
    fn all_keys(&self) -> Vec<ServiceKey> {
        let mut keys = self.index.keys();
        keys.extend(
            self.stored
                .services
                .state()
                .iter()
                .filter_map(|s| key_of_service(s)),
        );
        keys
    }

    fn apply(&mut self, msg: Msg) {
        let keys = match msg {
            Msg::Feed {
                cluster,
                generation,
            } => {
                self.index.feed_started(&cluster, generation);
                Vec::new()
            }
            Msg::Member {
                link,
                generation,
                service,
            } => self.index.remote_member(&link, generation, *service),
            Msg::Left {
                cluster,
                generation,
                key,
            } => self.index.remote_left(&cluster, generation, &key),
            Msg::Listing {
                cluster,
                generation,
            } => self.index.listing(&cluster, generation),
            // Once a cluster is no longer pending, our stored Services naming it are
            // planned again too (the index knows only keys with a member).
            Msg::Listed {
                cluster,
                generation,
            } => {
                let was_pending = self.index.pending().contains(&cluster);
                match self.index.listed(&cluster, generation) {
                    Some(mut keys) if was_pending => {
                        keys.extend(self.all_keys());
                        keys
                    }
                    Some(keys) => keys,
                    None => Vec::new(),
                }
            }
            Msg::Gateway {
                cluster,
                generation,
                gateway,
            } => self.index.gateway(&cluster, generation, gateway),
            // A new book starts empty: every key is recorded in it again.
            Msg::StatusBook { cluster, book } => {
                self.books.insert(cluster.clone(), book);
                for clusters in self.entries.values_mut() {
                    clusters.remove(&cluster);
                }
                self.all_keys()
            }
            Msg::LinkRemoved { cluster } => {
                self.books.remove(&cluster);
                let mut keys = self.index.link_removed(&cluster);
                keys.extend(self.all_keys());
                keys
            }
            Msg::Expect { clusters } => self.index.expect(clusters),
            Msg::Local { key, service } => self.index.local_member(key, service.map(|s| *s)),
            Msg::LocalListing => {
                self.index.local_listing();
                Vec::new()
            }
            Msg::LocalListed => self.index.local_listed(),
            Msg::Stored(key) => vec![key],
            Msg::StoreListed(services) => {
                match services {
                    true => self.services_listed = true,
                    false => self.slices_listed = true,
                }
                self.all_keys()
            }
            Msg::Leader(now) => {
                self.leading = now;
                match now {
                    true => self.all_keys(),
                    false => Vec::new(),
                }
            }
            Msg::Retry(key) => vec![key],
            Msg::Foreign { key, present } => match present {
                true => {
                    if let Some((p, _)) = self.blocked.get_mut(&key) {
                        *p = true;
                    }
                    Vec::new()
                }
                // Gone (or ours now): planned again, the create may go ahead.
                false => {
                    self.unblock(&key);
                    vec![key]
                }
            },
        };
        self.dirty.extend(keys);
    }

    /// The foreign Service holding `key`'s name is gone: stop watching it.
    fn unblock(&mut self, key: &ServiceKey) {
        if let Some((_, cancel)) = self.blocked.remove(key) {
            cancel.cancel();
        }
    }

    /// A create of `key`'s `name` found a foreign Service: watched from now on, no
    /// write tried until it changes or goes.
    fn block(&mut self, key: &ServiceKey, name: &str) {
        if self.blocked.contains_key(key) {
            return;
        }
        let cancel = CancellationToken::new();
        tokio::spawn(super::watches::watch_foreign(
            self.client.clone(),
            key.clone(),
            name.to_owned(),
            self.namespace.clone(),
            self.tx.clone(),
            cancel.clone(),
        ));
        self.blocked.insert(key.clone(), (true, cancel));
    }

    fn retry_later(&mut self, key: &ServiceKey) {
        let delay = self
            .retries
            .get(key)
            .map_or(FIRST_RETRY, |d| (*d * 2).min(MAX_RETRY));
        self.retries.insert(key.clone(), delay);
        let (tx, key) = (self.tx.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = tx.send(Msg::Retry(key));
        });
    }

    async fn reconcile(&mut self, key: &ServiceKey) {
        let name = federated_name(&key.name);
        let stored = self
            .stored
            .services
            .get(&ObjectRef::new(&name).within(&key.namespace));
        let ns = self.namespace.clone();
        let stored_annotation = stored
            .as_ref()
            .filter(|s| is_owned_federated(&s.metadata, &ns))
            .and_then(|s| {
                s.metadata
                    .annotations
                    .as_ref()?
                    .get(REMOTE_DISCOVERY_ANNOTATION)
                    .cloned()
            });
        let members = self.index.members(key);
        // A held cluster is pending too: its stored entries and slices stay as they are
        // (another writer may be maintaining them), not dropped for want of members.
        let mut pending = self.index.pending().clone();
        pending.extend(self.held.clusters().cloned());
        let desired = desired_federated(
            &FederationInput {
                namespace: &key.namespace,
                name: &key.name,
                members: &members,
                gateways: self.index.gateways(),
                pending: &pending,
                controller_namespace: &ns,
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
        let plan = plan_federated(&desired, stored.as_deref(), &slices, &ns);
        match desired.service {
            DesiredService::Absent => {
                // Nothing to create: the foreign Service no longer matters.
                self.unblock(key);
                self.present.remove(key)
            }
            _ => self.present.insert(key.clone()),
        };
        let blocked = self.blocked.get(key).is_some_and(|(present, _)| *present);
        self.record_status(key, &members, &desired.refused, blocked || plan.foreign);
        if blocked {
            // Reported once when found; the foreign Service's watch plans again.
            return;
        }
        if plan.foreign {
            let foreign = stored.as_deref().map(|s| s.metadata.clone());
            self.report_foreign(key, &name, foreign.is_some()).await;
            return;
        }
        self.report_conflicts(key, &name, &desired.conflicts).await;
        for action in &plan.actions {
            if !self.still_leading() {
                // Planned again by the next leader (or by us when leading again).
                self.dirty.insert(key.clone());
                return;
            }
            match self.writer.execute(action).await {
                Ok(Applied::Done) => {}
                // The watch event bringing the newer version plans the key again.
                Ok(Applied::Stale) => return,
                // A foreign Service holds the name (our store sees only ours): no retry
                // loop; its watch plans the key again when it changes or goes. Only a
                // Service create blocks: that watch follows the Service, so a slice
                // held by someone else would unblock at once and loop; it is retried
                // with backoff below instead.
                Err(Error::OwnershipConflict { .. })
                    if matches!(action, Action::CreateService(_)) =>
                {
                    self.record_status(key, &members, &desired.refused, true);
                    self.report_foreign(key, &name, true).await;
                    self.block(key, &name);
                    return;
                }
                Err(e) => {
                    tracing::warn!(%key, federated = %name, error = %e, "federated write failed; retrying");
                    self.metrics.federation.problem("FederatedWriteFailed");
                    self.retry_later(key);
                    return;
                }
            }
        }
        self.retries.remove(key);
        self.foreign.remove(key);
        if !plan.actions.is_empty() {
            tracing::info!(%key, federated = %name, writes = plan.actions.len(), "federated service written");
        }
    }

    /// Records `key`'s remote members in their Links' status books: `Mirrored` (into
    /// `<svc>-federated`), `InvalidService` (refused), `Error` (the name is held by a
    /// foreign Service); a cluster no longer a member loses its entry. The books' writers
    /// write only while leader, only on a change.
    fn record_status(
        &mut self,
        key: &ServiceKey,
        members: &[Member],
        refused: &[(String, MemberRefusal)],
        foreign: bool,
    ) {
        let name = federated_name(&key.name);
        let mut now = BTreeSet::new();
        for member in members {
            let Some(cluster) = &member.cluster else {
                continue;
            };
            let Some(book) = self.books.get(cluster) else {
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
            true => self.entries.remove(key),
            false => self.entries.insert(key.clone(), now.clone()),
        };
        for gone in before.unwrap_or_default().difference(&now) {
            if let Some(book) = self.books.get(gone) {
                book.observe_federated(key, Observed::Gone);
            }
        }
    }

    async fn event(&self, regarding: &ObjectReference, reason: &str, note: String) {
        self.recorder
            .publish(regarding, EventType::Warning, reason, "Federate", note)
            .await;
    }

    async fn report_foreign(&mut self, key: &ServiceKey, name: &str, exists: bool) {
        if !exists || !self.foreign.insert(key.clone()) {
            return;
        }
        let reason = "FederatedConflict";
        tracing::warn!(%key, federated = %name, "a Service named like the federated Service exists and is not ours: left untouched");
        self.metrics.federation.problem(reason);
        let note = format!(
            "Service {}/{name} exists without this controller's federated mark (label service-mirror.linkerd.io/federated=true and annotation service-mirror.io/controller-namespace={}): it is never adopted or changed; delete or rename it to let the federated Service of {key} be created",
            key.namespace, self.namespace
        );
        self.event(&service_ref(&key.namespace, name), reason, note)
            .await;
    }

    async fn report_refused(&mut self, key: &ServiceKey, refused: &[(String, MemberRefusal)]) {
        let last = self.refused.get(key).cloned().unwrap_or_default();
        if last.as_slice() == refused {
            return;
        }
        match refused.is_empty() {
            true => self.refused.remove(key),
            false => self.refused.insert(key.clone(), refused.to_vec()),
        };
        for (member, why) in refused.iter().filter(|r| !last.contains(r)) {
            let reason = why.reason();
            tracing::warn!(%key, %member, why = why.detail(), "federated member refused; the others are unaffected");
            self.metrics.federation.problem(reason);
            let cluster = member.rsplit_once('@').map(|(_, c)| c).unwrap_or_default();
            let regarding = match self.index.link_of(cluster) {
                Some(link) => link.clone(),
                None => service_ref(&key.namespace, &key.name),
            };
            let note = format!(
                "federated member {member} in namespace {} refused: {}",
                key.namespace,
                why.detail()
            );
            self.event(&regarding, reason, note).await;
        }
    }

    async fn report_conflicts(&mut self, key: &ServiceKey, name: &str, conflicts: &[String]) {
        let last = self
            .conflicts
            .get(key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if last == conflicts {
            return;
        }
        match conflicts.is_empty() {
            true => {
                self.conflicts.remove(key);
                return;
            }
            false => self.conflicts.insert(key.clone(), conflicts.to_vec()),
        };
        let reason = "FederatedPortConflict";
        let list = conflicts.join("; ");
        tracing::warn!(%key, federated = %name, conflicts = %list, "federated members' ports conflict; the union keeps the oldest member's");
        self.metrics.federation.problem(reason);
        let note = format!(
            "members of {key} disagree on ports: the federated Service has the union of their ports, the oldest member's (local first) winning; left out: {list}"
        );
        self.event(&service_ref(&key.namespace, name), reason, note)
            .await;
    }
}
