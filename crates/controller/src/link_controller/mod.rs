//! The controller of one linked remote cluster.
//!
//! The flow, one file each: three watches (`watches.rs`, over the one driver in
//! [`crate::runtime::watch`]) feed compact caches (`cache.rs`, objects stripped by `strip.rs`) and
//! an index (`index.rs`); each event becomes keys (a remote Service's namespace/name,
//! `keys.rs`, pure) on the runtime's work queue; the runtime's workers (`workers.rs`
//! implements their `Reconcile`) reconcile a key
//! (`reconcile.rs`: gather → pure decide in `decide.rs` → apply) by comparing the desired
//! mirror, computed by the pure core, with the local objects in the caches, and let the
//! writer carry out the difference. Nothing is written when nothing differs. Gateways
//! (addresses, probes) are the [`crate::gateway`] component's. See docs/architecture.md.

mod blocked;
mod cache;
mod contention;
mod decide;
mod expect;
mod hostnames;
mod index;
mod keys;
mod limit;
pub(crate) mod link_status;
pub(crate) mod metrics;
mod options;
mod readiness;
mod reconcile;
mod remote_state;
mod status;
mod strip;
mod watches;
mod workers;

use crate::runtime::once::Reporter;
use crate::runtime::{Outcome, WorkQueue};
pub use cache::DEFAULT_MAX_REMOTE_CACHE_BYTES;
pub use link_status::CONTROLLER_NAME;
pub use options::{LinkConfig, LinkDeps};
use status::Synced;
pub use status::{GatewayStatus, LinkStatus};

use crate::error::{Error, Result};
use crate::events::EventRecorder;
use crate::gateway::Gateways;
use crate::gateway::report::GatewayListener;
use crate::writer::LocalWriter;
use kube::Client;
use reconcile::Reconciler;
use service_mirror_core::{ExportPolicy, ExportRule, Link, validate_cluster_name};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A running controller of one link. Stop it with [`LinkController::stop`].
pub struct LinkController {
    rec: Arc<Reconciler>,
    synced: watch::Receiver<Synced>,
    connected: Arc<AtomicBool>,
    relists: Arc<AtomicU64>,
    gate: workers::Gate,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for LinkController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkController")
            .field("link", &self.rec.link)
            .finish()
    }
}

impl LinkController {
    /// Starts watching the remote cluster behind `remote` and mirroring into `local`.
    pub fn start(
        local: Client,
        remote: Client,
        link: Link,
        config: LinkConfig,
        deps: LinkDeps,
    ) -> Result<Self> {
        Self::start_inner(local, remote, link, config, deps, false)
    }

    /// Starts with caches and queue running but no writes until [`LinkController::resume`].
    pub fn start_paused(
        local: Client,
        remote: Client,
        link: Link,
        config: LinkConfig,
        deps: LinkDeps,
    ) -> Result<Self> {
        Self::start_inner(local, remote, link, config, deps, true)
    }

    /// Lets a paused controller write.
    pub fn resume(&self) {
        workers::reset_slots(&self.rec.index, &self.rec.limit);
        self.gate.resume();
    }

    fn start_inner(
        local: Client,
        remote: Client,
        link: Link,
        config: LinkConfig,
        deps: LinkDeps,
        paused: bool,
    ) -> Result<Self> {
        validate_cluster_name(&link.cluster_name).map_err(|e| Error::InvalidLink(e.to_string()))?;
        let cluster = link.cluster_name.clone();
        // With write gates, every write of this link (the writer's, the status
        // writers', the workers') also needs the link's write Lease.
        let mut deps = deps;
        if let Some(gates) = &deps.write_gates {
            deps.leader = Some(crate::leader::Leadership::gated(
                deps.leader.take(),
                gates.receiver(&cluster),
            ));
        }
        let cancel = CancellationToken::new();
        let metrics = metrics::LinkMetrics::new(deps.metrics.clone(), &cluster);
        let index = Arc::new(parking_lot::Mutex::new(index::Index::default()));
        // A Link with a federatedServiceSelector feeds the federation.
        let feed = deps
            .federation
            .as_ref()
            .zip(config.federated_selector.clone())
            .map(|(fed, selector)| {
                let id = crate::federation::link_identity(
                    &link,
                    deps.link_created,
                    deps.link_secret.clone(),
                );
                // The same hold as the link's own of an untrusted list.
                let hold = config.stale_policy.grace.clamp(
                    std::time::Duration::from_secs(5),
                    std::time::Duration::from_secs(30),
                );
                fed.feed(id, selector, config.namespaces.clone())
                    .hold_untrusted_lists_for(hold)
            });
        let in_use = {
            let index = index.clone();
            let feed = feed.clone();
            // Federated members and MCS imports use the Link's gateway too: it stays
            // probed for them (for MCS, always: which clusters export is its worker's).
            let probed_for_mcs = match (&deps.mcs, &config.export_rule) {
                (Some(_), ExportRule::Selectors { gateway, .. }) => Some(gateway.clone()),
                _ => None,
            };
            Arc::new(move |gw: &_| {
                probed_for_mcs.as_ref() == Some(gw)
                    || !index.lock().users_of(gw).is_empty()
                    || feed.as_ref().is_some_and(|f| f.has_members())
            })
        };
        let (gateways, verdicts) = Gateways::new(
            &cluster,
            deps.resolver.clone(),
            crate::gateway::Policy {
                flags: config.gateway_address_policy.clone(),
                local: deps.local_networks.clone(),
            },
            config.probes(&deps),
            deps.metrics.clone(),
            in_use,
            cancel.clone(),
        );
        // A Link's status is written on it; a Secret link has none.
        let status_of = deps
            .link_secret
            .as_ref()
            .filter(|r| r.kind.as_deref() == Some("Link"))
            .and_then(|r| Some((r.namespace.clone()?, r.name.clone()?)));
        let status = status_of
            .as_ref()
            .map(|_| Arc::new(link_status::StatusBook::default()));
        // Its federated members' entries (`federatedServices`) come from the federation.
        if let (Some(fed), Some(book), Some(_)) = (&deps.federation, &status, &feed) {
            fed.report_status(&cluster, book.clone());
        }
        let (synced_tx, synced) =
            watch::channel(Synced::new(!config.endpoints_mode.writes_slices()));
        let (connected, relists): (Arc<AtomicBool>, Arc<AtomicU64>) = Default::default();
        let health = Arc::new(remote_state::RemoteHealth::new(config.stale_policy));
        let recorder = deps
            .recorder
            .clone()
            .unwrap_or_else(|| EventRecorder::new(local.clone(), None));
        // Refusals are counted where those of the link object are (by link and reason).
        let reporter = {
            let (metrics, link) = (metrics.clone(), deps.link_secret.clone());
            Reporter::new(
                &cluster,
                Some(recorder.clone()),
                deps.link_secret.clone(),
                Arc::new(move |reason| {
                    if let Some(link) = &link {
                        metrics.link_refused(link, reason);
                    }
                }),
            )
        };
        let rec = Arc::new(Reconciler {
            writer: LocalWriter::with_recorder(
                local.clone(),
                &cluster,
                deps.metrics.clone(),
                recorder,
            )
            .creating_namespaces(config.create_namespaces)
            .led_by(deps.leader.clone()),
            export: ExportPolicy {
                namespaces: config.namespaces.clone(),
                rule: config.export_rule.clone(),
            },
            link_gateway: config.link_gateway.clone(),
            status: status.clone(),
            contention: Default::default(),
            // Link mirrors follow the remote's readiness (as Linkerd's do).
            readiness: matches!(config.export_rule, ExportRule::Selectors { .. })
                .then(Arc::default),
            // Headless services read the remote slices' hostnames, on every link.
            hostnames: config.enable_headless_services.then(|| {
                Arc::new(parking_lot::Mutex::new(hostnames::RemoteHostnames::new(
                    config.headless_hostname_from_target_ref,
                    config.namespaces.clone(),
                )))
            }),
            refused_hostnames: Default::default(),
            remote: cache::Cache::with_cap(config.max_remote_cache_bytes),
            local_services: cache::Cache::default(),
            local_endpoints: cache::Cache::default(),
            local_slices: cache::Cache::default(),
            mode: config.endpoints_mode,
            local: local.clone(),
            mirroring_waits: Default::default(),
            index,
            synced: synced.clone(),
            gateways: Arc::new(gateways),
            expectations: Arc::default(),
            blocked: Arc::default(),
            endpoints_first: Default::default(),
            limit: Arc::new(limit::MirrorLimit::new(config.max_mirrors)),
            queue: WorkQueue::new(
                crate::backoff::Backoff::with_fast_retries(config.requeue_limit),
                cancel.clone(),
            ),
            create_limit: deps.create_limit.clone(),
            link_secret: deps.link_secret.clone(),
            reporter: reporter.clone(),
            metrics: metrics.clone(),
            health: health.clone(),
            member_writes: config.workers,
            link,
        });
        // MCS first: its feed starts (a generation) before the remote watch sends it
        // the remote Services; its own watch reads the remote ServiceExports.
        let (mut mcs_tasks, mut mcs_gateway, mut mcs_feed) = (Vec::new(), None, None);
        if let Some(mcs) = &deps.mcs {
            (mcs_tasks, mcs_gateway, mcs_feed) =
                mcs.link_with_gateway(&cluster, &rec.link.cluster_domain, &remote, &cancel);
        }
        let mut tasks = watches::spawn(
            &rec,
            watches::Shared {
                synced: synced_tx,
                connected: connected.clone(),
                relists: relists.clone(),
                metrics,
                federation: feed.clone(),
                mcs: mcs_feed,
                reporter,
            },
            local.clone(),
            remote.clone(),
            cancel.clone(),
        );
        tasks.append(&mut mcs_tasks);
        let gate = workers::Gate::new(synced.clone(), deps.leader.clone(), paused);
        tasks.push(tokio::spawn(remote_state::run(
            health,
            remote_state::Reporter {
                cluster: cluster.clone(),
                metrics: rec.metrics.clone(),
                writer: rec.writer.clone(),
                link_object: deps.link_secret.clone(),
                link_status: status_of
                    .as_ref()
                    .map(|(ns, _)| kube::Api::namespaced(local.clone(), ns)),
                link_name: status_of.as_ref().map(|(_, name)| name.clone()),
                leader: deps.leader.clone(),
                writable: gate.writable.subscribe(),
                index: rec.index.clone(),
                queue: rec.queue.clone(),
                remote: kube::Api::all(remote),
            },
            cancel.clone(),
        )));
        // The Link's gateway, for the federated slices and the MCS import slices.
        let mut listeners: Vec<Arc<dyn GatewayListener>> = Vec::new();
        if let Some(feed) = feed {
            listeners.push(Arc::new(feed));
        }
        if let Some(feed) = mcs_gateway {
            listeners.push(Arc::new(feed));
        }
        if let (false, Some(source), ExportRule::Selectors { gateway, .. }) = (
            listeners.is_empty(),
            config.link_gateway.clone(),
            &config.export_rule,
        ) {
            let health = rec.health.clone();
            let (writer, link) = (rec.writer.clone(), deps.link_secret.clone());
            let notes: crate::gateway::report::Notes = Arc::new(move |reason, note| {
                if let Some(link) = link.clone() {
                    let writer = writer.clone();
                    tokio::spawn(async move { writer.record(&link, reason, "Mirror", note).await });
                }
            });
            tasks.push(tokio::spawn(crate::gateway::report::report_gateway(
                listeners,
                rec.gateways.clone(),
                gateway.clone(),
                source,
                crate::gateway::report::LinkSide {
                    remote: Arc::new(move || health.state()),
                    notes,
                },
                config.endpoint_refresh_period,
                cancel.clone(),
            )));
        }
        tasks.push(tokio::spawn(workers::follow_local_networks(
            deps.local_networks.clone(),
            rec.index.clone(),
            rec.queue.clone(),
            cancel.clone(),
        )));
        if let (Some(book), Some((ns, name))) = (status, status_of) {
            tasks.push(tokio::spawn(link_status::write_status(
                book,
                kube::Api::namespaced(local.clone(), &ns),
                name,
                gate.clone(),
                rec.metrics.clone(),
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
        Ok(Self {
            rec,
            synced,
            connected,
            relists,
            gate: gate.clone(),
            cancel,
            tasks,
        })
    }

    /// The link this controller serves.
    pub fn link(&self) -> &Link {
        &self.rec.link
    }

    /// The object (link Secret or Link) this controller runs from, if known.
    pub fn source(&self) -> Option<&k8s_openapi::api::core::v1::ObjectReference> {
        self.rec.link_secret.as_ref()
    }

    /// The current state.
    pub fn status(&self) -> LinkStatus {
        let synced = *self.synced.borrow();
        LinkStatus {
            remote_synced: synced.remote,
            local_synced: synced.local(),
            remote_connected: self.connected.load(Ordering::SeqCst),
            mirrors: self.rec.local_services.len(),
            refused: self.rec.limit.refused(),
            queue_depth: self.rec.queue.depth(),
            failing: self.rec.queue.failing(),
            relists: self.relists.load(Ordering::SeqCst),
        }
    }

    /// The state of the remote apiserver as the mirrors see it (`--remote-grace`,
    /// `--stale-after`, `--stale-delete-after`).
    pub fn remote_state(&self) -> service_mirror_core::RemoteState {
        self.rec.health.state()
    }

    /// Every gateway the link's exported services use, sorted.
    pub fn gateways(&self) -> Vec<GatewayStatus> {
        // The index lock is released before the prober table's (lock order: see gateway/).
        let mut used = self.rec.index.lock().gateway_mirrors();
        used.sort();
        used.into_iter()
            .map(|(gw, num_services)| {
                let state = self.rec.gateways.probe_state(&gw);
                GatewayStatus {
                    cluster_name: self.rec.link.cluster_name.clone(),
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

    /// Waits until every cache (remote and local) has listed once; for a rotation that
    /// waits for the new credentials to sync without polling.
    pub async fn wait_synced(&self) {
        let mut synced = self.synced.clone();
        if synced.wait_for(|s| s.remote && s.local()).await.is_err() {
            // Stopped before it synced: it never will (the caller's timeout decides).
            std::future::pending::<()>().await
        }
    }

    /// Stops every task. With `cleanup` (the link was removed) every local Service and
    /// Endpoints labelled as a mirror of this cluster is then deleted.
    pub async fn stop(self, cleanup: bool) -> Result<()> {
        self.cancel.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        let cluster = &self.rec.link.cluster_name;
        if cleanup {
            self.rec.metrics.forget();
            let n = self.rec.writer.delete_all_mirrors().await?;
            tracing::info!(%cluster, deleted = n, "link removed: mirrors deleted");
        } else {
            tracing::info!(%cluster, "stopped watching; mirrors left in place");
        }
        Ok(())
    }
}
