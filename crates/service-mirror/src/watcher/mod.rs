//! The watcher of one linked remote cluster.
//!
//! Three reflectors feed in-memory stores and indexes: remote Services (all namespaces)
//! and the local Services and Endpoints labelled as mirrors of this cluster. Every watch
//! event becomes one or more keys (a remote Service's namespace/name) on a work queue;
//! workers reconcile a key by comparing the desired mirror, computed by the pure core,
//! with the actual local objects from the stores, and let the writer carry out the
//! difference. Nothing is written when nothing differs. See docs/architecture.md.

mod index;
mod probe;
mod queue;
mod reconcile;
pub mod resolve;

pub use probe::ProbeRedirect;
pub use queue::{Backoff, Outcome, WorkQueue};
pub use resolve::{CachingResolver, Lookup, Resolver, SystemResolver};

use crate::core::{
    GatewayRef, Link, NamespaceFilter, ServiceKey, exported_gateway, owner_selector, remote_key,
    validate_cluster_name,
};
use crate::error::{Error, Result};
use crate::metrics::{ErrorLabels, Metrics};
use crate::writer::LocalWriter;
use futures::StreamExt;
use index::Index;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Tunables of a cluster watcher.
#[derive(Debug, Clone)]
pub struct WatcherOptions {
    /// Reconcile workers running in parallel (keys are still serialised one by one).
    pub workers: usize,
    /// Fast retries of a failing key before it falls back to slow retries.
    pub requeue_limit: u32,
    /// How often gateway hostnames are resolved again.
    pub endpoint_refresh_period: Duration,
    /// Hostname resolver for gateway ingress hostnames.
    pub resolver: Arc<dyn Resolver>,
    /// Remote namespaces whose exported Services are mirrored.
    pub namespaces: NamespaceFilter,
    /// Where the watcher reports its metrics.
    pub metrics: Arc<Metrics>,
    /// How long a gateway probe may take before it counts as failed.
    pub probe_timeout: Duration,
    /// Consecutive failed probes before a gateway is considered down.
    pub probe_failure_threshold: u32,
    /// Where probes connect instead of the gateway's address, if set.
    pub probe_redirect: Option<ProbeRedirect>,
}

impl Default for WatcherOptions {
    fn default() -> Self {
        Self {
            workers: 4,
            requeue_limit: 3,
            endpoint_refresh_period: Duration::from_secs(60),
            resolver: Arc::new(SystemResolver),
            namespaces: NamespaceFilter::default(),
            metrics: Metrics::new(),
            probe_timeout: Duration::from_secs(5),
            probe_failure_threshold: 3,
            probe_redirect: None,
        }
    }
}

/// State shared by the tasks of one watcher.
struct Inner {
    link: Link,
    opts: WatcherOptions,
    remote: Store<Service>,
    local_services: Store<Service>,
    local_endpoints: Store<Endpoints>,
    index: Mutex<Index>,
    queue: WorkQueue<ServiceKey>,
    writer: LocalWriter,
    resolver: CachingResolver,
    remote_synced: AtomicBool,
    local_services_synced: AtomicBool,
    local_endpoints_synced: AtomicBool,
    remote_connected: AtomicBool,
    probers: probe::Probers,
    cancel: CancellationToken,
}

impl Inner {
    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn local_synced(&self) -> bool {
        self.local_services_synced.load(Ordering::SeqCst)
            && self.local_endpoints_synced.load(Ordering::SeqCst)
    }
}

/// A running watcher of one remote cluster. Stop it with [`ClusterWatcher::stop`].
pub struct ClusterWatcher {
    inner: Arc<Inner>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ClusterWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterWatcher")
            .field("link", &self.inner.link)
            .finish()
    }
}

/// A snapshot of a watcher's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatcherStatus {
    /// The remote Services have been listed at least once.
    pub remote_synced: bool,
    /// The local mirror caches have been listed at least once.
    pub local_synced: bool,
    /// The last remote watch call succeeded.
    pub remote_connected: bool,
    /// Local mirror Services of this cluster in the cache.
    pub mirrors: usize,
    /// Keys waiting to be reconciled (now or after a backoff).
    pub queue_depth: usize,
    /// Keys whose last reconcile failed.
    pub failing: usize,
}

fn strip<K: Resource>(obj: &mut K) {
    // Managed fields are large and never read: keep them out of the caches.
    obj.meta_mut().managed_fields = None;
}

fn strip_event<K: Resource>(ev: &mut watcher::Event<K>) {
    match ev {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => {
            strip(o)
        }
        watcher::Event::Init | watcher::Event::InitDone => {}
    }
}

/// The key a local mirror object stands for: from its fq-name annotation, or, for an
/// object of ours without one, its own name (so it is deleted as an orphan).
fn local_key<K: Resource>(obj: &K) -> ServiceKey {
    remote_key(obj.meta())
        .unwrap_or_else(|| ServiceKey::new(obj.namespace().unwrap_or_default(), obj.name_any()))
}

impl ClusterWatcher {
    /// Starts watching the remote cluster behind `remote` and mirroring into `local`.
    pub fn start(local: Client, remote: Client, link: Link, opts: WatcherOptions) -> Result<Self> {
        validate_cluster_name(&link.cluster_name).map_err(|e| Error::InvalidLink(e.to_string()))?;
        let cancel = CancellationToken::new();
        let (remote_store, remote_writer) = reflector::store::<Service>();
        let (svc_store, svc_writer) = reflector::store::<Service>();
        let (ep_store, ep_writer) = reflector::store::<Endpoints>();
        let backoff = Backoff {
            fast_retries: opts.requeue_limit,
            ..Backoff::default()
        };
        let inner = Arc::new(Inner {
            writer: LocalWriter::new(local.clone(), &link.cluster_name, opts.metrics.clone()),
            resolver: CachingResolver::new(opts.resolver.clone()),
            queue: WorkQueue::new(backoff, cancel.clone()),
            link,
            opts,
            remote: remote_store,
            local_services: svc_store,
            local_endpoints: ep_store,
            index: Mutex::default(),
            remote_synced: AtomicBool::new(false),
            local_services_synced: AtomicBool::new(false),
            local_endpoints_synced: AtomicBool::new(false),
            remote_connected: AtomicBool::new(false),
            probers: probe::Probers::default(),
            cancel: cancel.clone(),
        });
        let selector = owner_selector(&inner.link.cluster_name);
        let local_config = watcher::Config::default().labels(&selector);
        let mut tasks = vec![
            tokio::spawn(watch_remote(
                inner.clone(),
                Api::all(remote),
                remote_writer,
                cancel.clone(),
            )),
            tokio::spawn(watch_local(
                inner.clone(),
                Api::<Service>::all(local.clone()),
                local_config.clone(),
                svc_writer,
                cancel.clone(),
            )),
            tokio::spawn(watch_local(
                inner.clone(),
                Api::<Endpoints>::all(local),
                local_config,
                ep_writer,
                cancel.clone(),
            )),
            tokio::spawn(refresh_hostnames(inner.clone(), cancel.clone())),
        ];
        for _ in 0..inner.opts.workers.max(1) {
            tasks.push(tokio::spawn(worker(inner.clone(), cancel.clone())));
        }
        tracing::info!(cluster = %inner.link.cluster_name, "watching remote cluster");
        Ok(Self {
            inner,
            cancel,
            tasks,
        })
    }

    /// The link this watcher serves.
    pub fn link(&self) -> &Link {
        &self.inner.link
    }

    /// The current state.
    pub fn status(&self) -> WatcherStatus {
        let i = &self.inner;
        WatcherStatus {
            remote_synced: i.remote_synced.load(Ordering::SeqCst),
            local_synced: i.local_synced(),
            remote_connected: i.remote_connected.load(Ordering::SeqCst),
            mirrors: i.local_services.len(),
            queue_depth: i.queue.depth(),
            failing: i.queue.failing(),
        }
    }

    /// Stops every task. With `cleanup` (the link was removed) every local Service and
    /// Endpoints labelled as a mirror of this cluster is then deleted.
    pub async fn stop(self, cleanup: bool) -> Result<()> {
        self.cancel.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        let cluster = &self.inner.link.cluster_name;
        if cleanup {
            self.inner.opts.metrics.forget_cluster(cluster);
            let n = self.inner.writer.delete_all_mirrors().await?;
            tracing::info!(cluster = %cluster, deleted = n, "link removed: mirrors deleted");
        } else {
            tracing::info!(cluster = %cluster, "stopped watching; mirrors left in place");
        }
        Ok(())
    }
}

async fn watch_remote(
    inner: Arc<Inner>,
    api: Api<Service>,
    mut store: reflector::store::Writer<Service>,
    cancel: CancellationToken,
) {
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    loop {
        let ev = tokio::select! {
            _ = cancel.cancelled() => return,
            ev = stream.next() => ev,
        };
        match ev {
            Some(Ok(mut ev)) => {
                inner.remote_connected.store(true, Ordering::SeqCst);
                let labels = Metrics::cluster(&inner.link.cluster_name);
                inner
                    .opts
                    .metrics
                    .remote_connected
                    .get_or_create(&labels)
                    .set(1);
                if !matches!(ev, watcher::Event::Init | watcher::Event::InitApply(_)) {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    inner
                        .opts
                        .metrics
                        .last_sync
                        .get_or_create(&labels)
                        .set(now.as_secs_f64());
                }
                strip_event(&mut ev);
                store.apply_watcher_event(&ev);
                on_remote_event(&inner, &ev);
            }
            Some(Err(e)) => {
                inner
                    .opts
                    .metrics
                    .remote_connected
                    .get_or_create(&Metrics::cluster(&inner.link.cluster_name))
                    .set(0);
                if inner.remote_connected.swap(false, Ordering::SeqCst) {
                    tracing::warn!(cluster = %inner.link.cluster_name, error = %e, "remote watch failed; retrying with backoff, mirrors kept");
                }
            }
            None => return,
        }
    }
}

fn on_remote_event(inner: &Inner, ev: &watcher::Event<Service>) {
    let mut keys = Vec::new();
    match ev {
        watcher::Event::Apply(svc) | watcher::Event::Delete(svc) => {
            let key = ServiceKey::new(svc.namespace().unwrap_or_default(), svc.name_any());
            let gw = match ev {
                watcher::Event::Apply(_) if inner.opts.namespaces.allows(&key.namespace) => {
                    exported_gateway(svc)
                }
                _ => None,
            };
            let mut index = inner.index();
            index.set_gateway(&key, gw);
            // The Service may itself be a gateway of other exported Services.
            keys.extend(index.users_of(&GatewayRef::new(&key.namespace, &key.name)));
            keys.push(key);
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
        watcher::Event::InitDone => {
            // The store was replaced by a full list: rebuild the index from it and look at
            // every key, so objects deleted while we were not watching are collected.
            let mut index = inner.index();
            index.clear_gateways();
            for svc in inner.remote.state() {
                let key = ServiceKey::new(svc.namespace().unwrap_or_default(), svc.name_any());
                if let Some(gw) =
                    exported_gateway(&svc).filter(|_| inner.opts.namespaces.allows(&key.namespace))
                {
                    index.set_gateway(&key, Some(gw));
                }
            }
            keys.extend(index.exported().cloned());
            keys.extend(index.local_keys());
            drop(index);
            if !inner.remote_synced.swap(true, Ordering::SeqCst) {
                tracing::info!(cluster = %inner.link.cluster_name, services = inner.remote.len(), "remote services synced");
            }
        }
    }
    for k in keys {
        inner.queue.add(k);
    }
}

/// Which local index and sync flag a local object kind uses.
trait LocalKind:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    fn index(index: &mut Index) -> &mut index::LocalIndex;
    fn synced(inner: &Inner) -> &AtomicBool;
    fn store(inner: &Inner) -> &Store<Self>;
}

impl LocalKind for Service {
    fn index(index: &mut Index) -> &mut index::LocalIndex {
        index.services()
    }
    fn synced(inner: &Inner) -> &AtomicBool {
        &inner.local_services_synced
    }
    fn store(inner: &Inner) -> &Store<Self> {
        &inner.local_services
    }
}

impl LocalKind for Endpoints {
    fn index(index: &mut Index) -> &mut index::LocalIndex {
        index.endpoints()
    }
    fn synced(inner: &Inner) -> &AtomicBool {
        &inner.local_endpoints_synced
    }
    fn store(inner: &Inner) -> &Store<Self> {
        &inner.local_endpoints
    }
}

async fn watch_local<K: LocalKind>(
    inner: Arc<Inner>,
    api: Api<K>,
    config: watcher::Config,
    mut store: reflector::store::Writer<K>,
    cancel: CancellationToken,
) {
    let stream = watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    loop {
        let ev = tokio::select! {
            _ = cancel.cancelled() => return,
            ev = stream.next() => ev,
        };
        match ev {
            Some(Ok(mut ev)) => {
                strip_event(&mut ev);
                store.apply_watcher_event(&ev);
                on_local_event(&inner, &ev);
            }
            Some(Err(e)) => {
                tracing::warn!(kind = %K::kind(&()), error = %e, "local watch failed; retrying with backoff")
            }
            None => return,
        }
    }
}

fn on_local_event<K: LocalKind>(inner: &Inner, ev: &watcher::Event<K>) {
    let mut keys = Vec::new();
    {
        let mut index = inner.index();
        let local = K::index(&mut index);
        match ev {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                let key = local_key(o);
                if let Some(old) = local.set(
                    &o.namespace().unwrap_or_default(),
                    &o.name_any(),
                    key.clone(),
                ) && old != key
                {
                    keys.push(old);
                }
                if matches!(ev, watcher::Event::Apply(_)) {
                    keys.push(key);
                }
            }
            watcher::Event::Delete(o) => {
                keys.extend(local.remove(&o.namespace().unwrap_or_default(), &o.name_any()))
            }
            watcher::Event::Init => {}
            watcher::Event::InitDone => {
                local.clear();
                for o in K::store(inner).state() {
                    local.set(
                        &o.namespace().unwrap_or_default(),
                        &o.name_any(),
                        local_key(o.as_ref()),
                    );
                }
                keys.extend(local.keys().cloned());
                K::synced(inner).store(true, Ordering::SeqCst);
            }
        }
    }
    for k in keys {
        inner.queue.add(k);
    }
}

async fn worker(inner: Arc<Inner>, cancel: CancellationToken) {
    // Reconciling against caches that have not listed yet would create what exists.
    while !inner.local_synced() {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    let metrics = &inner.opts.metrics;
    let labels = Metrics::cluster(&inner.link.cluster_name);
    while let Some(key) = inner.queue.next().await {
        let started = std::time::Instant::now();
        let result = reconcile::reconcile(&inner, &key).await;
        metrics
            .reconcile_duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        metrics
            .mirrored_services
            .get_or_create(&labels)
            .set(inner.local_services.len() as i64);
        metrics
            .queue_depth
            .get_or_create(&labels)
            .set(inner.queue.depth() as i64);
        let outcome = match result {
            Ok(o) => o,
            Err(e) => {
                let failures = inner.queue.done(key.clone(), Outcome::Failed);
                let cluster = &inner.link.cluster_name;
                metrics
                    .reconcile_errors
                    .get_or_create(&ErrorLabels {
                        cluster: cluster.clone(),
                        kind: e.metric_label().into(),
                    })
                    .inc();
                if failures > inner.opts.requeue_limit {
                    tracing::warn!(%cluster, %key, failures, error = %e, kind = e.metric_label(), "reconcile failed; retrying slowly");
                } else {
                    tracing::debug!(%cluster, %key, failures, error = %e, kind = e.metric_label(), "reconcile failed; retrying");
                }
                continue;
            }
        };
        inner.queue.done(key, outcome);
    }
}

/// Every endpoint refresh period: forget resolved hostnames and look again at every
/// mirror whose gateway is given by hostname (writes happen only if addresses changed).
async fn refresh_hostnames(inner: Arc<Inner>, cancel: CancellationToken) {
    let period = inner.opts.endpoint_refresh_period;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        inner.resolver.invalidate();
        let gateways = inner.index().gateways();
        for gw in gateways {
            let by_hostname = reconcile::gateway_service(&inner, &gw)
                .and_then(|svc| crate::core::gateway_spec(&svc).ok())
                .is_some_and(|spec| !spec.hostnames.is_empty());
            if by_hostname {
                for key in inner.index().users_of(&gw) {
                    inner.queue.add(key);
                }
            }
        }
    }
}
