//! The loops of a link: reconcile workers, the leader follower, the hostname refresh
//! and the gateway verdicts.

use super::index::Index;
use super::limit::MirrorLimit;
use super::reconcile::Reconciler;
use super::{LinkConfig, Outcome, Synced, WorkQueue};
use crate::gateway::Gateways;
use crate::runtime::Reconcile;
use parking_lot::Mutex;
use service_mirror_core::{GatewayRef, ServiceKey};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
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
            rec.view.gateways.clone(),
            rec.view.index.clone(),
            rec.fx.queue.clone(),
            config.endpoint_refresh_period,
            cancel.clone(),
        )),
        tokio::spawn(forward_verdicts(
            verdicts,
            rec.view.index.clone(),
            rec.fx.queue.clone(),
            cancel.clone(),
        )),
        tokio::spawn(super::blocked::recheck(
            rec.fx.blocked.clone(),
            rec.fx.local.clone(),
            rec.fx.queue.clone(),
            cancel.clone(),
        )),
    ];
    tasks.extend(crate::runtime::worker::spawn(
        config.workers,
        &rec.fx.queue,
        gate,
        rec,
        cancel,
    ));
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
pub(super) type Gate = crate::runtime::Gate<Synced>;

/// A link's reconcile of one remote Service key, run by the runtime's workers.
impl Reconcile<ServiceKey> for Reconciler {
    type Error = crate::error::Error;

    fn meter(&self) -> Option<crate::runtime::metrics::Meter<'_>> {
        Some(self.fx.metrics.meter())
    }

    fn scope(&self) -> &str {
        &self.view.link.cluster_name
    }

    async fn reconcile(&self, key: &ServiceKey) -> Result<Outcome, Self::Error> {
        let timer = self.fx.metrics.reconcile_timer();
        let result = Reconciler::reconcile(self, key).await;
        drop(timer);
        self.fx.metrics.state(|| {
            (
                self.view.local_services.len(),
                self.fx.queue.depth(),
                self.fx.limit.refused(),
            )
        });
        result
    }

    fn succeeded(&self, key: &ServiceKey) {
        self.fx.blocked.clear(key);
    }

    async fn failed(&self, key: &ServiceKey, e: Self::Error, failures: u32) {
        let cluster = &self.view.link.cluster_name;
        self.fx.metrics.error(e.metric_label());
        if let crate::error::Error::MissingNamespace(ns) = &e {
            self.missing_namespace(key, ns).await;
        }
        if let crate::error::Error::OwnershipConflict {
            kind,
            namespace,
            name,
            ..
        } = &e
        {
            self.fx.blocked.hold(key, kind, namespace, name);
        }
        if self.fx.queue.retrying_slowly(failures) {
            tracing::warn!(%cluster, %key, failures, error = %e, kind = e.metric_label(), "reconcile failed; retrying slowly");
        } else {
            tracing::debug!(%cluster, %key, failures, error = %e, kind = e.metric_label(), "reconcile failed; retrying");
        }
    }
}

/// Before writing again after a pause: mirror-limit slots from the local mirrors as
/// they are now (mirrors another writer deleted meanwhile hold none).
pub(super) fn reset_slots(index: &Mutex<Index>, limit: &MirrorLimit) {
    let keys: Vec<(Arc<ServiceKey>, usize)> = {
        let mut index = index.lock();
        let services = index.services();
        services
            .keys()
            .map(|k| (k.clone(), services.count(k)))
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
            reset_slots(&rec.view.index, &rec.fx.limit);
            let keys = rec.view.index.lock().all_keys();
            tracing::info!(cluster = %rec.view.link.cluster_name, keys = keys.len(), "leader: reconciling everything");
            for k in keys {
                rec.fx.queue.add(k);
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
