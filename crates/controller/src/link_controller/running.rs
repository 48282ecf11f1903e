//! A link's controller while it runs: its watches, caches, workers and reporters, all
//! stopped together by [`Running::stop`].

use super::*;
use crate::federation::LinkFeed;
use crate::gateway::report::GatewayListener;
use reconcile::{Memory, Reconciler};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::task::JoinHandle;

/// A running controller of one link. Stop it with [`LinkController::stop`].
pub(super) struct Running {
    rec: Arc<Reconciler>,
    synced: watch::Receiver<Synced>,
    connected: Arc<AtomicBool>,
    relists: Arc<AtomicU64>,
    gate: workers::Gate,
    /// A Link's gateway, moved in place by [`Self::move_gateway`].
    link_gateway: watch::Sender<Option<crate::gateway::GatewaySource>>,
    cancel: CancellationToken,
    /// Cancels the tasks if the run is dropped without a stop.
    _cancel_on_drop: tokio_util::sync::DropGuard,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("link", &self.rec.view.link)
            .finish()
    }
}

impl Running {
    /// Starts watching the remote cluster behind `remote` and mirroring into `local`
    /// (no writes until [`Running::resume`] if `paused`), reporting to the federation
    /// through `feed` (the link's, which outlives this run in a standby: see
    /// `standby.rs`). The cluster name is valid (the caller checked).
    pub(super) fn start(
        local: Client,
        remote: Client,
        link: Link,
        config: LinkConfig,
        deps: LinkDeps,
        paused: bool,
        feed: Option<LinkFeed>,
    ) -> Self {
        let cluster = link.cluster_name.clone();
        // With write gates, every write of this link (the writer's, the status
        // writers', the workers') also needs the link's write Lease.
        let mut deps = deps;
        if let Some(gates) = &deps.write_gates {
            deps.leader = Some(gates.link_leadership(deps.leader.take(), &cluster));
        }
        let cancel = CancellationToken::new();
        let metrics = metrics::LinkMetrics::new(deps.metrics.clone(), &cluster);
        let index = Arc::new(parking_lot::Mutex::new(index::Index::new(&cluster)));
        let (gateways, verdicts) =
            wiring::gateways(&cluster, &config, &deps, &index, feed.clone(), &cancel);
        // A Link's status is written on it; a Secret link has none. Its federated
        // members' entries (`federatedServices`) come from the federation.
        let status_of = wiring::status_object(&deps);
        let status = status_of
            .as_ref()
            .map(|_| Arc::new(link_status::StatusBook::new(&cluster)));
        if let (Some(fed), Some(book), Some(_)) = (&deps.federation, &status, &feed) {
            fed.report_status(&cluster, book.clone());
        }
        let (synced_tx, synced) =
            watch::channel(Synced::new(!config.endpoints_mode.writes_slices()));
        let (connected, relists): (Arc<AtomicBool>, Arc<AtomicU64>) = Default::default();
        let (link_gateway, watched_gateway) = watch::channel(config.link_gateway.clone());
        let rec = Arc::new(Reconciler {
            view: wiring::view(
                link,
                &config,
                config.federated_selector.clone().filter(|_| feed.is_some()),
                index,
                synced.clone(),
                gateways,
                watched_gateway,
            ),
            memory: Memory::default(),
            fx: wiring::effects(
                &local,
                &cluster,
                &config,
                &deps,
                metrics,
                status.clone(),
                &cancel,
            ),
        });
        // MCS first: its feed starts (a generation) before the remote watch sends it
        // the remote Services; its own watch reads the remote ServiceExports.
        let (mut mcs_tasks, mut mcs_gateway, mut mcs_feed) = (Vec::new(), None, None);
        if let Some(mcs) = &deps.mcs {
            (mcs_tasks, mcs_gateway, mcs_feed) =
                mcs.link_with_gateway(&cluster, &rec.view.link.cluster_domain, &remote, &cancel);
        }
        let mut tasks = watches::spawn(
            &rec,
            watches::Shared {
                synced: synced_tx,
                connected: connected.clone(),
                relists: relists.clone(),
                metrics: rec.fx.metrics.clone(),
                federation: feed.clone(),
                mcs: mcs_feed,
                reporter: rec.fx.reporter.clone(),
            },
            local.clone(),
            remote.clone(),
            cancel.clone(),
        );
        tasks.append(&mut mcs_tasks);
        let gate = workers::Gate::new(synced.clone(), deps.leader.clone(), paused);
        tasks.push(tokio::spawn(remote_state::run(
            rec.view.health.clone(),
            remote_state::Reporter {
                cluster: cluster.clone(),
                metrics: rec.fx.metrics.clone(),
                writer: rec.fx.writer.clone(),
                link_object: deps.link_secret.clone(),
                link_status: status_of.as_ref().map(|(ns, _)| {
                    crate::writer::link_status::LinkStatusWriter::new(
                        local.clone(),
                        ns,
                        deps.metrics.clone(),
                    )
                }),
                link_name: status_of.as_ref().map(|(_, name)| name.clone()),
                leader: deps.leader.clone(),
                writable: gate.writable.subscribe(),
                index: rec.view.index.clone(),
                queue: rec.fx.queue.clone(),
                remote: kube::Api::all(remote),
            },
            cancel.clone(),
        )));
        // The Link's gateway, for the federated slices and the MCS import slices.
        let listeners: Vec<Arc<dyn GatewayListener>> = [
            feed.map(|f| Arc::new(f) as Arc<dyn GatewayListener>),
            mcs_gateway.map(|f| Arc::new(f) as Arc<dyn GatewayListener>),
        ]
        .into_iter()
        .flatten()
        .collect();
        tasks.extend(wiring::spawn_gateway_report(
            &rec, &config, listeners, &cancel,
        ));
        tasks.push(tokio::spawn(workers::follow_local_networks(
            deps.local_networks.clone(),
            rec.view.index.clone(),
            rec.fx.queue.clone(),
            cancel.clone(),
        )));
        if let (Some(book), Some((ns, name))) = (status, status_of) {
            tasks.push(tokio::spawn(link_status::write_status(
                book,
                crate::writer::link_status::LinkStatusWriter::new(
                    local.clone(),
                    &ns,
                    deps.metrics.clone(),
                ),
                name,
                gate.clone(),
                rec.fx.metrics.clone(),
                cancel.clone(),
            )));
        }
        tasks.extend(workers::spawn(
            &rec,
            &gate,
            verdicts,
            &config,
            deps.leader,
            &cancel,
        ));
        tracing::info!(%cluster, "watching remote cluster");
        Self {
            rec,
            synced,
            connected,
            relists,
            gate: gate.clone(),
            link_gateway,
            _cancel_on_drop: cancel.clone().drop_guard(),
            cancel,
            tasks,
        }
    }

    /// Lets a paused controller write.
    pub(super) fn resume(&self) {
        workers::reset_slots(&self.rec.view.index, &self.rec.fx.limit);
        self.gate.resume();
    }

    /// Moves a Link's gateway in place: the mirrors using it are reconciled again
    /// towards `gateway`, the federation and MCS are told, the probes follow, and the
    /// caches and watches stay as they are. (A restart relists everything: at 10,000
    /// Services 50,000 objects listed again, and the caches dropped and rebuilt.)
    /// `false`, changing nothing, when the link has no Link gateway to move.
    pub(super) fn move_gateway(&self, gateway: crate::gateway::GatewaySource) -> bool {
        let crate::gateway::GatewaySource::Link { .. } = gateway else {
            return false;
        };
        let moved = self.link_gateway.send_if_modified(|current| match current {
            Some(crate::gateway::GatewaySource::Link { .. })
                if *current != Some(gateway.clone()) =>
            {
                *current = Some(gateway);
                true
            }
            _ => false,
        });
        if moved {
            let keys = self.rec.view.index.lock().all_keys();
            tracing::info!(
                cluster = %self.rec.view.link.cluster_name,
                keys = keys.len(),
                "the Link's gateway moved: reconciling its mirrors"
            );
            for k in keys {
                self.rec.fx.queue.add(k);
            }
        }
        moved
    }

    /// Whether the link has a Link gateway that [`Self::move_gateway`] can move.
    pub(super) fn has_link_gateway(&self) -> bool {
        matches!(
            *self.link_gateway.borrow(),
            Some(crate::gateway::GatewaySource::Link { .. })
        )
    }

    /// The link this controller serves.
    pub(super) fn link(&self) -> &Link {
        &self.rec.view.link
    }

    /// The object (link Secret or Link) this controller runs from, if known.
    pub(super) fn source(&self) -> Option<&k8s_openapi::api::core::v1::ObjectReference> {
        self.rec.fx.link_secret.as_ref()
    }

    /// The current state.
    pub(super) fn status(&self) -> LinkStatus {
        let synced = *self.synced.borrow();
        LinkStatus {
            remote_synced: synced.remote,
            local_synced: synced.local(),
            remote_connected: self.connected.load(Ordering::SeqCst),
            mirrors: self.rec.view.local_services.len(),
            refused: self.rec.fx.limit.refused(),
            queue_depth: self.rec.fx.queue.depth(),
            failing: self.rec.fx.queue.failing(),
            relists: self.relists.load(Ordering::SeqCst),
            standby: false,
            unplaced: false,
        }
    }

    /// The state of the remote apiserver as the mirrors see it (`--remote-grace`,
    /// `--stale-after`, `--stale-delete-after`).
    pub(super) fn remote_state(&self) -> service_mirror_core::RemoteState {
        self.rec.view.health.state()
    }

    /// Every gateway the link's exported services use, sorted.
    pub(super) fn gateways(&self) -> Vec<GatewayStatus> {
        // The index lock is released before the prober table's (lock order: see gateway/).
        let mut used = self.rec.view.index.lock().gateway_mirrors();
        used.sort();
        used.into_iter()
            .map(|(gw, num_services)| {
                let state = self.rec.view.gateways.probe_state(&gw);
                GatewayStatus {
                    cluster_name: self.rec.view.link.cluster_name.clone(),
                    gateway_name: gw.name,
                    gateway_namespace: gw.namespace,
                    alive: state.as_ref().is_none_or(|s| s.alive),
                    latency_ms: state.as_ref().and_then(|s| s.latency_ms),
                    enabled: state.is_some(),
                    num_services,
                }
            })
            .collect()
    }

    /// Its caches' sync, for a standby's [`super::LinkController::wait_synced`].
    pub(super) fn synced(&self) -> watch::Receiver<Synced> {
        self.synced.clone()
    }

    /// Stops every task, the mirrors left in place, then drops the link's metric
    /// series (a standby that no longer runs the link has no view of it; after the
    /// stop, so no task of the run makes one again).
    pub(super) async fn park(self) {
        self.cancel.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        self.rec.fx.metrics.forget();
    }

    /// Waits until every cache (remote and local) has listed once; for a rotation that
    /// waits for the new credentials to sync without polling.
    pub(super) async fn wait_synced(&self) {
        let mut synced = self.synced.clone();
        if synced.wait_for(|s| s.remote && s.local()).await.is_err() {
            // Stopped before it synced: it never will (the caller's timeout decides).
            std::future::pending::<()>().await
        }
    }

    /// Stops every task. With `cleanup` (the link was removed) every local Service and
    /// Endpoints labelled as a mirror of this cluster is then deleted.
    pub(super) async fn stop(self, cleanup: bool) -> Result<()> {
        self.cancel.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        let cluster = &self.rec.view.link.cluster_name;
        if cleanup {
            self.rec.fx.metrics.forget();
            let n = self.rec.fx.writer.delete_all_mirrors().await?;
            tracing::info!(%cluster, deleted = n, "link removed: mirrors deleted");
        } else {
            tracing::info!(%cluster, "stopped watching; mirrors left in place");
        }
        Ok(())
    }
}
