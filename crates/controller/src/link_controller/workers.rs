//! The loops of a link: reconcile workers, the leader follower, the hostname refresh
//! and the gateway verdicts.

use super::index::Index;
use super::limit::MirrorLimit;
use super::reconcile::Reconciler;
use super::{LinkConfig, Outcome, Synced, WorkQueue};
use crate::gateway::Gateways;
use parking_lot::Mutex;
use service_mirror_core::{GatewayRef, ServiceKey};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Starts the loops of a link: reconcile workers, the hostname refresh, the verdict
/// forwarder, and the leader follower when elected.
pub(super) fn spawn(
    rec: &Arc<Reconciler>,
    gate: &Gate,
    verdicts: mpsc::UnboundedReceiver<GatewayRef>,
    config: &LinkConfig,
    leader: Option<crate::leader::Leadership>,
    cancel: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![
        tokio::spawn(refresh_hostnames(
            rec.gateways.clone(),
            rec.index.clone(),
            rec.queue.clone(),
            config.endpoint_refresh_period,
            cancel.clone(),
        )),
        tokio::spawn(forward_verdicts(
            verdicts,
            rec.index.clone(),
            rec.queue.clone(),
            cancel.clone(),
        )),
        tokio::spawn(super::blocked::recheck(
            rec.blocked.clone(),
            rec.local.clone(),
            rec.queue.clone(),
            cancel.clone(),
        )),
    ];
    for _ in 0..config.workers.max(1) {
        let work = worker(
            rec.clone(),
            gate.clone(),
            config.requeue_limit,
            cancel.clone(),
        );
        tasks.push(tokio::spawn(work));
    }
    if let Some(leader) = leader {
        tasks.push(tokio::spawn(follow_leader(
            rec.clone(),
            leader,
            cancel.clone(),
        )));
    }
    tasks
}

/// When the link may write: local caches listed, not paused, and leader if elected.
#[derive(Clone)]
pub(super) struct Gate {
    /// False while the controller is paused (a rotated link syncing before it takes over).
    pub(super) writable: watch::Sender<bool>,
    /// Leader election, if any.
    pub(super) leader: Option<crate::leader::Leadership>,
    pub(super) synced: watch::Receiver<Synced>,
}

impl Gate {
    /// Not paused, and leader if elected.
    pub(super) fn open_now(&self) -> bool {
        *self.writable.borrow() && self.leader.as_ref().is_none_or(|l| l.leading())
    }

    /// Waits until this link may write: local caches listed (reconciling against caches
    /// that have not listed would create what exists), not paused, and leader if
    /// elected. Woken by each of the three watch channels. False when cancelled.
    pub(super) async fn wait_open(&self, cancel: &CancellationToken) -> bool {
        let mut own = self.writable.subscribe();
        let mut synced = self.synced.clone();
        let mut leader = self.leader.clone();
        loop {
            own.borrow_and_update();
            let local_synced = synced.borrow_and_update().local();
            if let Some(l) = &mut leader {
                l.leading_and_update();
            }
            if self.open_now() && local_synced {
                return true;
            }
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = next_change(&mut own) => {}
                _ = next_change(&mut synced) => {}
                _ = changed(&mut leader) => {}
            }
        }
    }
}

/// The next change of an optional watch; never, without one or once its sender is gone.
async fn changed(rx: &mut Option<crate::leader::Leadership>) {
    match rx {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await
            }
        }
        None => std::future::pending().await,
    }
}

/// The next change of a watch; never once its sender is gone (a gone sender would
/// otherwise answer at once, every time, and spin the loop waiting on it).
async fn next_change<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await
    }
}

/// Reconciles keys from the queue while the gate is open.
pub(super) async fn worker(
    rec: Arc<Reconciler>,
    gate: Gate,
    requeue_limit: u32,
    cancel: CancellationToken,
) {
    let queue = &rec.queue;
    let cluster = &rec.link.cluster_name;
    loop {
        if !gate.wait_open(&cancel).await {
            return;
        }
        let Some(key) = queue.next().await else {
            return;
        };
        if !gate.open_now() {
            // Leadership was lost (or the controller paused) while waiting: keep the key.
            queue.done(key.clone(), Outcome::Done);
            queue.add(key);
            continue;
        }
        let timer = rec.metrics.reconcile_timer();
        let result = rec.reconcile(&key).await;
        drop(timer);
        rec.metrics
            .state(rec.local_services.len(), queue.depth(), rec.limit.refused());
        let outcome = match result {
            Ok(o) => o,
            Err(e) => {
                let failures = queue.done(key.clone(), Outcome::Failed);
                rec.metrics.error(e.metric_label());
                if let crate::error::Error::MissingNamespace(ns) = &e {
                    rec.missing_namespace(&key, ns).await;
                }
                if let crate::error::Error::OwnershipConflict {
                    kind,
                    namespace,
                    name,
                    ..
                } = &e
                {
                    rec.blocked.hold(&key, kind, namespace, name);
                }
                if failures > requeue_limit {
                    tracing::warn!(%cluster, %key, failures, error = %e, kind = e.metric_label(), "reconcile failed; retrying slowly");
                } else {
                    tracing::debug!(%cluster, %key, failures, error = %e, kind = e.metric_label(), "reconcile failed; retrying");
                }
                continue;
            }
        };
        rec.blocked.clear(&key);
        queue.done(key, outcome);
    }
}

/// Before writing again after a pause: mirror-limit slots from the local mirrors as
/// they are now (mirrors another writer deleted meanwhile hold none).
pub(super) fn reset_slots(index: &Mutex<Index>, limit: &MirrorLimit) {
    let keys: Vec<(ServiceKey, usize)> = {
        let mut index = index.lock();
        let services = index.services();
        services
            .keys()
            .map(|k| (k.clone(), services.names(k).count()))
            .collect()
    };
    limit.reset_held(keys);
}

/// On gaining leadership, every key is reconciled: the world may have drifted while
/// another replica (or none) was writing.
pub(super) async fn follow_leader(
    rec: Arc<Reconciler>,
    mut leader: crate::leader::Leadership,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = leader.changed() => if changed.is_err() { return },
        }
        if leader.leading_and_update() {
            reset_slots(&rec.index, &rec.limit);
            let keys = rec.index.lock().all_keys();
            tracing::info!(cluster = %rec.link.cluster_name, keys = keys.len(), "leader: reconciling everything");
            for k in keys {
                rec.queue.add(k);
            }
        }
    }
}

/// Every endpoint refresh period: forget resolved hostnames and look again at every
/// mirror whose gateway is given by hostname (writes happen only if addresses changed).
pub(super) async fn refresh_hostnames(
    gateways: Arc<Gateways>,
    index: Arc<Mutex<Index>>,
    queue: WorkQueue<ServiceKey>,
    period: Duration,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        let in_use = index.lock().gateways();
        for gw in gateways.refresh(in_use) {
            for key in index.lock().users_of(&gw) {
                queue.add(key);
            }
        }
    }
}

/// A gateway's probe verdict changed: every mirror behind it is looked at again.
pub(super) async fn forward_verdicts(
    mut changed: mpsc::UnboundedReceiver<GatewayRef>,
    index: Arc<Mutex<Index>>,
    queue: WorkQueue<ServiceKey>,
    cancel: CancellationToken,
) {
    loop {
        let gw = tokio::select! {
            _ = cancel.cancelled() => return,
            gw = changed.recv() => match gw { Some(gw) => gw, None => return },
        };
        for key in index.lock().users_of(&gw) {
            queue.add(key);
        }
    }
}

/// The local networks changed (a ServiceCIDR or a Node's pod CIDRs, added or gone):
/// every mirror is looked at again, so an address now in a local network leaves its
/// mirrors and one no longer in any comes back (writes happen only where addresses
/// change).
pub(super) async fn follow_local_networks(
    mut local: crate::local_networks::LocalNetworks,
    index: Arc<Mutex<Index>>,
    queue: WorkQueue<ServiceKey>,
    cancel: CancellationToken,
) {
    loop {
        let changed = tokio::select! {
            _ = cancel.cancelled() => return,
            changed = local.changed() => changed,
        };
        if !changed {
            return;
        }
        let keys: Vec<ServiceKey> = {
            let index = index.lock();
            index
                .gateways()
                .iter()
                .flat_map(|gw| index.users_of(gw))
                .collect()
        };
        for key in keys {
            queue.add(key);
        }
    }
}
