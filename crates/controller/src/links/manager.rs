//! The link manager: reconciles link Secrets (by name) into running link controllers.
//!
//! Each Secret is a key on a work queue, so a slow or unreachable remote only holds up
//! its own Secret. A refused Secret never stops or cleans up a running link: its mirrors
//! stay until the Secret is fixed or deleted.

use super::cleanup::Cleanups;
use super::collector::Collector;
use super::connect::connect;
use super::metrics::LinkErrorLabels;
use super::secret::{LinkError, LinkSpec, parse_link_secret};
use crate::backoff::Backoff;
use crate::events::EventRecorder;
use crate::link_controller::{
    GatewayStatus, LinkConfig, LinkController, LinkDeps, LinkStatus, Outcome, WorkQueue,
};
use crate::metrics::Metrics;
use crate::watch::{Watch, drive, keep_all};
use crate::writer::{LocalWriter, MirrorSelector};
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use parking_lot::{Mutex, MutexGuard};
use service_mirror_core::labels::LINK_SECRET_TYPE;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Options of the link manager.
#[derive(Debug, Clone)]
pub struct LinkManagerOptions {
    /// Namespace of the link Secrets (the controller's own).
    pub namespace: String,
    /// Tunables of every link controller.
    pub config: LinkConfig,
    /// What every link controller uses (they share its metrics).
    pub deps: LinkDeps,
    /// Secrets processed in parallel.
    pub workers: usize,
    /// How long new credentials may take to sync before a rotation is abandoned.
    pub rotation_timeout: Duration,
    /// After the first list of link Secrets, delete mirrors of clusters no Secret names
    /// (links removed while the controller was down).
    pub collect_unlinked: bool,
}

struct Active {
    spec: LinkSpec,
    controller: LinkController,
}

struct Inner {
    local: Client,
    opts: LinkManagerOptions,
    secrets: Store<Secret>,
    synced: AtomicBool,
    active: Mutex<HashMap<String, Active>>,
    /// cluster name -> the Secret that links it.
    claims: Mutex<HashMap<String, String>>,
    queue: WorkQueue<String>,
    recorder: EventRecorder,
    /// Background cleanups of unlinked clusters still running, by cluster name.
    cleanups: Cleanups,
    cancel: CancellationToken,
}

/// Runs the links of one controller.
pub struct LinkManager {
    inner: Arc<Inner>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl LinkManager {
    /// Starts watching link Secrets in `opts.namespace`; link Events and those of the
    /// cleanups go through `recorder`.
    pub fn start(local: Client, recorder: EventRecorder, opts: LinkManagerOptions) -> Self {
        let cancel = CancellationToken::new();
        let (store, writer) = reflector::store::<Secret>();
        let inner = Arc::new(Inner {
            recorder,
            queue: WorkQueue::new(
                Backoff::with_fast_retries(opts.config.requeue_limit),
                cancel.clone(),
            ),
            local,
            opts,
            secrets: store,
            synced: AtomicBool::new(false),
            active: Mutex::default(),
            claims: Mutex::default(),
            cleanups: Cleanups::default(),
            cancel: cancel.clone(),
        });
        let mut tasks = vec![tokio::spawn(watch_secrets(
            inner.clone(),
            writer,
            cancel.clone(),
        ))];
        for _ in 0..inner.opts.workers.max(1) {
            tasks.push(tokio::spawn(worker(inner.clone())));
        }
        Self {
            inner,
            cancel,
            tasks,
        }
    }

    /// Ready once the Secrets are listed and every link's local caches are synced.
    /// Never waits on a remote cluster.
    pub fn ready(&self) -> bool {
        self.inner.synced.load(Ordering::SeqCst)
            && self
                .inner
                .active()
                .values()
                .all(|a| a.controller.status().local_synced)
    }

    /// The linked clusters and their link controllers' state.
    pub fn status(&self) -> Vec<(String, LinkStatus)> {
        let mut all: Vec<_> = self
            .inner
            .active()
            .values()
            .map(|a| (a.spec.link().cluster_name.clone(), a.controller.status()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// The clusters with a running link controller, and those a link Secret claims (for
    /// the write Leases).
    pub fn link_set(&self) -> crate::write_leases::LinkSet {
        // One lock at a time: never both held at once.
        let running = self
            .inner
            .active()
            .values()
            .map(|a| a.spec.link().cluster_name.clone())
            .collect();
        let claimed = self.inner.claims().keys().cloned().collect();
        crate::write_leases::LinkSet { running, claimed }
    }

    /// Every gateway of every running link, by cluster name.
    pub fn gateways(&self) -> Vec<GatewayStatus> {
        let mut all: Vec<_> = self
            .inner
            .active()
            .values()
            .flat_map(|a| a.controller.gateways())
            .collect();
        all.sort_by(|a, b| a.cluster_name.cmp(&b.cluster_name));
        all
    }

    /// Stops every link controller, leaving the mirrors in place (a restart resumes them).
    pub async fn shutdown(self) {
        self.cancel.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        let active: Vec<Active> = self.inner.active().drain().map(|(_, a)| a).collect();
        for a in active {
            let _ = a.controller.stop(false).await;
        }
    }
}

impl Inner {
    fn active(&self) -> MutexGuard<'_, HashMap<String, Active>> {
        self.active.lock()
    }

    fn claims(&self) -> MutexGuard<'_, HashMap<String, String>> {
        self.claims.lock()
    }

    fn metrics(&self) -> &Metrics {
        &self.opts.deps.metrics
    }

    /// What the link controller of `secret` uses.
    fn link_deps(&self, secret: &Secret) -> LinkDeps {
        LinkDeps {
            link_secret: Some(secret_reference(secret)),
            recorder: Some(self.recorder.clone()),
            ..self.opts.deps.clone()
        }
    }

    async fn event(&self, secret: &Secret, type_: EventType, reason: &str, note: String) {
        self.recorder
            .publish(&secret_reference(secret), type_, reason, "Link", note)
            .await;
    }

    /// Log + metric + Event for a refused or failing link Secret.
    async fn report(&self, secret: &Secret, err: &LinkError) {
        let name = secret.name_any();
        tracing::warn!(secret = %name, reason = err.reason(), error = %err, "link Secret not usable");
        self.metrics()
            .links
            .link_errors
            .get_or_create(&LinkErrorLabels {
                secret: name,
                reason: err.reason().into(),
            })
            .inc();
        self.event(secret, EventType::Warning, err.reason(), err.to_string())
            .await;
    }

    fn update_links_gauge(&self) {
        let n = self.active().len() as i64;
        self.metrics().links.links.set(n);
    }

    /// Takes a Secret's running link out of the tables.
    fn take(&self, secret: &str) -> Option<Active> {
        let a = self.active().remove(secret)?;
        let mut claims = self.claims();
        if claims.get(&a.spec.link().cluster_name).map(String::as_str) == Some(secret) {
            claims.remove(&a.spec.link().cluster_name);
        }
        Some(a)
    }

    async fn unlink(&self, secret: &str, a: Active) {
        let cluster = a.spec.link().cluster_name.clone();
        self.update_links_gauge();
        if let Err(e) = a.controller.stop(true).await {
            // Keep trying in the background: the mirrors must not outlive the link. A
            // new link of the same cluster cancels this (see `link`).
            tracing::warn!(%cluster, error = %e, "cleanup after unlink failed; retrying");
            self.spawn_cleanup(&cluster, None);
        }
        tracing::info!(%cluster, %secret, "unlinked");
    }

    /// Deletes every mirror of `cluster` in the background until it succeeds, unless the
    /// cluster is linked again first.
    fn spawn_cleanup(&self, cluster: &str, only: Option<MirrorSelector>) {
        let writer = LocalWriter::with_recorder(
            self.local.clone(),
            cluster,
            self.opts.deps.metrics.clone(),
            self.recorder.clone(),
        );
        self.cleanups.spawn(cluster, writer, only, &self.cancel);
    }

    /// Another Secret that links the same cluster as `a` (a Secret renamed by creating
    /// the new one before deleting the old).
    fn successor(&self, gone: &str, a: &Active) -> Option<String> {
        let mut candidates: Vec<Arc<Secret>> = self
            .secrets
            .state()
            .into_iter()
            .filter(|s| s.name_any() != gone)
            .filter(|s| {
                parse_link_secret(s)
                    .is_ok_and(|spec| spec.link().cluster_name == a.spec.link().cluster_name)
            })
            .collect();
        // The oldest Secret wins, so the choice is the same after a restart.
        candidates.sort_by_key(|s| {
            (
                s.metadata.creation_timestamp.clone().map(|t| t.0),
                s.name_any(),
            )
        });
        candidates.first().map(|s| s.name_any())
    }

    async fn reconcile(&self, name: &str) -> Outcome {
        let secret = self
            .secrets
            .get(&ObjectRef::new(name).within(&self.opts.namespace));
        let Some(secret) = secret else {
            if let Some(a) = self.take(name) {
                match self.successor(name, &a) {
                    // Hand the running link controller over: its reconcile rotates credentials if
                    // they differ, and no mirror is deleted.
                    Some(next) => {
                        tracing::info!(cluster = %a.spec.link().cluster_name, from = %name, to = %next, "link moved to another Secret");
                        self.claims()
                            .insert(a.spec.link().cluster_name.clone(), next.clone());
                        self.active().insert(next.clone(), a);
                        self.queue.add(next);
                    }
                    None => {
                        self.unlink(name, a).await;
                        // A Secret refused as a duplicate of this one may link now.
                        for s in self.secrets.state() {
                            self.queue.add(s.name_any());
                        }
                    }
                }
            }
            return Outcome::Done;
        };
        let spec = match parse_link_secret(&secret) {
            Ok(spec) => spec,
            Err(e) => {
                self.report(&secret, &e).await;
                return Outcome::Done;
            }
        };
        let current = self.active().get(name).map(|a| a.spec.clone());
        match current {
            Some(cur) if cur == spec => Outcome::Done,
            // Same cluster name: new credentials or domain; the mirror names stay.
            Some(cur) if cur.link().cluster_name == spec.link().cluster_name => {
                self.rotate(name, &secret, spec).await
            }
            Some(_) => {
                // Another cluster name: a different link.
                if let Some(a) = self.take(name) {
                    self.unlink(name, a).await;
                }
                self.link(name, &secret, spec).await
            }
            None => self.link(name, &secret, spec).await,
        }
    }

    async fn link(&self, name: &str, secret: &Secret, spec: LinkSpec) -> Outcome {
        let cluster = spec.link().cluster_name.clone();
        let taken_by = {
            let mut claims = self.claims();
            match claims.get(&cluster) {
                Some(other) if other != name => Some(other.clone()),
                _ => {
                    claims.insert(cluster.clone(), name.to_string());
                    None
                }
            }
        };
        if let Some(other) = taken_by {
            self.report(secret, &LinkError::DuplicateClusterName(cluster, other))
                .await;
            return Outcome::Done;
        }
        // A background cleanup of an earlier link of this cluster must not delete the
        // mirrors of this one.
        self.cleanups.cancel(&cluster);
        let client = match connect(&spec, &self.metrics().client).await {
            Ok(c) => c,
            Err(e) => {
                self.claims().remove(&cluster);
                self.report(secret, &e).await;
                return if e.retryable() {
                    Outcome::Failed
                } else {
                    Outcome::Done
                };
            }
        };
        match LinkController::start(
            self.local.clone(),
            client,
            spec.link().clone(),
            self.opts.config.clone(),
            self.link_deps(secret),
        ) {
            Ok(controller) => {
                self.active()
                    .insert(name.to_string(), Active { spec, controller });
                self.update_links_gauge();
                tracing::info!(%cluster, secret = %name, "linked");
                self.event(
                    secret,
                    EventType::Normal,
                    "Linked",
                    format!("watching remote cluster {cluster}"),
                )
                .await;
                Outcome::Done
            }
            Err(e) => {
                self.claims().remove(&cluster);
                let err = LinkError::InvalidClusterName(cluster, e.to_string());
                self.report(secret, &err).await;
                Outcome::Done
            }
        }
    }

    /// New credentials for a running link: the new link controller syncs before the old stops,
    /// so no mirror is deleted or flaps.
    async fn rotate(&self, name: &str, secret: &Secret, spec: LinkSpec) -> Outcome {
        let cluster = spec.link().cluster_name.clone();
        let client = match connect(&spec, &self.metrics().client).await {
            Ok(c) => c,
            Err(e) => {
                self.report(secret, &e).await;
                return if e.retryable() {
                    Outcome::Failed
                } else {
                    Outcome::Done
                };
            }
        };
        // The new link controller syncs without writing; it writes only once the old one stopped,
        // so the two never work on the same mirror at once.
        let new = match LinkController::start_paused(
            self.local.clone(),
            client,
            spec.link().clone(),
            self.opts.config.clone(),
            self.link_deps(secret),
        ) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(%cluster, error = %e, "could not start the rotated link controller");
                return Outcome::Failed;
            }
        };
        tokio::select! {
            _ = new.wait_synced() => {}
            _ = self.cancel.cancelled() => {
                let _ = new.stop(false).await;
                return Outcome::Done;
            }
            _ = tokio::time::sleep(self.opts.rotation_timeout) => {
                let _ = new.stop(false).await;
                self.report(
                    secret,
                    &LinkError::RotationTimeout(self.opts.rotation_timeout.as_secs()),
                )
                .await;
                return Outcome::Failed;
            }
        }
        let old = self.active().remove(name);
        if let Some(old) = old {
            let _ = old.controller.stop(false).await;
        }
        new.resume();
        self.active().insert(
            name.to_string(),
            Active {
                spec,
                controller: new,
            },
        );
        tracing::info!(%cluster, secret = %name, "credentials rotated");
        self.event(
            secret,
            EventType::Normal,
            "CredentialsRotated",
            format!("now using the new credentials for {cluster}"),
        )
        .await;
        Outcome::Done
    }
}

async fn watch_secrets(
    inner: Arc<Inner>,
    store: reflector::store::Writer<Secret>,
    cancel: CancellationToken,
) {
    let watch = Watch {
        api: Api::namespaced(inner.local.clone(), &inner.opts.namespace),
        config: watcher::Config::default().fields(&format!("type={LINK_SECRET_TYPE}")),
        strip: keep_all,
        store,
    };
    let on_event = |ev: &watcher::Event<Secret>| match ev {
        watcher::Event::Apply(s) | watcher::Event::Delete(s) => inner.queue.add(s.name_any()),
        watcher::Event::InitDone => {
            if inner.opts.collect_unlinked && !inner.synced.load(Ordering::SeqCst) {
                tokio::spawn(collect_unlinked(inner.clone()));
            }
            let mut names: Vec<String> =
                inner.secrets.state().iter().map(|s| s.name_any()).collect();
            names.extend(inner.active().keys().cloned());
            for n in names {
                inner.queue.add(n);
            }
            inner.synced.store(true, Ordering::SeqCst);
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
    };
    let on_error = |e: &watcher::Error| tracing::warn!(error = %e, namespace = %inner.opts.namespace, "watching link Secrets failed; retrying");
    drive(watch, cancel, on_event, on_error).await
}

/// Deletes the mirrors of clusters that no link Secret names (see [`Collector`]); only
/// on the leader.
async fn collect_unlinked(inner: Arc<Inner>) {
    let collector = Collector {
        local: inner.local.clone(),
        secrets: inner.secrets.clone(),
        namespace: inner.opts.namespace.clone(),
        namespaces: inner.opts.config.namespaces.clone(),
        leader: inner.opts.deps.leader.clone(),
        cancel: inner.cancel.clone(),
    };
    let Some(unlinked) = collector.unlinked().await else {
        return;
    };
    for cluster in unlinked.clusters {
        tracing::info!(%cluster, "deleting the mirrors of a cluster no link Secret names");
        inner.spawn_cleanup(&cluster, Some(unlinked.select.clone()));
    }
}

async fn worker(inner: Arc<Inner>) {
    while let Some(name) = inner.queue.next().await {
        let outcome = inner.reconcile(&name).await;
        inner.queue.done(name, outcome);
    }
}

/// A reference to a link Secret, for Events about the link.
fn secret_reference(secret: &Secret) -> ObjectReference {
    secret.object_ref(&())
}
