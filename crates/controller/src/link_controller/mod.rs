//! The watcher of one linked remote cluster.
//!
//! Three reflectors feed in-memory stores and indexes: remote Services (all namespaces)
//! and the local Services and Endpoints labelled as mirrors of this cluster. Every watch
//! event becomes one or more keys (a remote Service's namespace/name) on a work queue;
//! workers reconcile a key by comparing the desired mirror, computed by the pure core,
//! with the actual local objects from the stores, and let the writer carry out the
//! difference. Nothing is written when nothing differs. See docs/architecture.md.

mod cache;
mod expect;
mod index;
mod limit;
mod probe;
mod queue;
mod reconcile;
pub mod resolve;

pub use probe::ProbeRedirect;
pub use queue::{Backoff, Outcome, WorkQueue};
pub use resolve::{CachingResolver, Lookup, Resolver, SystemResolver};

use crate::error::{Error, Result};
use crate::metrics::{ErrorLabels, Metrics};
use crate::writer::LocalWriter;
use cache::Cache;
use futures::StreamExt;
use index::Index;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use parking_lot::Mutex;
use service_mirror_core::{
    ExportPolicy, GatewayRef, Link, NamespaceFilter, ServiceKey, export_decision, owner_selector,
    remote_key, validate_cluster_name,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// When set, the watcher writes only while this says true (leader election); caches
    /// stay warm meanwhile, and every key is looked at again when it turns true.
    pub leader: Option<tokio::sync::watch::Receiver<bool>>,
    /// Bounds the reconciles that create mirrors; clones of these options share it.
    pub create_limit: crate::writer::CreateLimit,
    /// Most mirrors one link may create; `None`: no limit. Mirrors that exist are
    /// kept whatever the limit.
    pub max_mirrors: Option<usize>,
    /// The link Secret, where link-wide Events (the mirror limit) are recorded.
    pub link_secret: Option<k8s_openapi::api::core::v1::ObjectReference>,
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
            leader: None,
            create_limit: crate::writer::default_create_limit(),
            max_mirrors: None,
            link_secret: None,
        }
    }
}

/// State shared by the tasks of one watcher.
struct Inner {
    link: Link,
    /// Which remote Services are mirrored.
    export: ExportPolicy,
    opts: WatcherOptions,
    remote: Cache<Service>,
    local_services: Cache<Service>,
    local_endpoints: Cache<Endpoints>,
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
    relists: AtomicU64,
    /// False while the watcher is paused (a rotated link syncing before it takes over).
    writable: tokio::sync::watch::Sender<bool>,
    /// Keys whose Endpoints were written ahead of their Service (see reconcile), with
    /// the resourceVersion of the Endpoints that write replaced.
    endpoints_first: Mutex<std::collections::HashMap<ServiceKey, String>>,
    /// Our writes the local caches have not shown yet.
    expectations: expect::Expectations,
    /// Slots for mirrors under `opts.max_mirrors`.
    limit: limit::MirrorLimit,
}

impl Inner {
    fn index(&self) -> parking_lot::MutexGuard<'_, Index> {
        self.index.lock()
    }

    fn endpoints_first(
        &self,
    ) -> parking_lot::MutexGuard<'_, std::collections::HashMap<ServiceKey, String>> {
        self.endpoints_first.lock()
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
    /// Exported services not mirrored because the link holds its limit of mirrors.
    pub refused: usize,
    /// Keys waiting to be reconciled (now or after a backoff).
    pub queue_depth: usize,
    /// Keys whose last reconcile failed.
    pub failing: usize,
    /// Full lists of the remote after the first (watch resume point expired).
    pub relists: u64,
}

fn strip<K: Resource>(obj: &mut K) {
    // Managed fields are large and never read: keep them out of the caches. Local
    // objects keep everything else: an update PUTs the cached object with our changes.
    obj.meta_mut().managed_fields = None;
}

/// Prefix of every annotation the watcher reads on a remote Service (export and probe
/// settings).
const REMOTE_ANNOTATION_PREFIX: &str = "mirror.linkerd.io/";

/// A remote Service is never written back: keep only what the core reads (name,
/// namespace, resourceVersion, `mirror.linkerd.io/` annotations, ports, load-balancer
/// status), so a large remote costs little memory.
fn strip_remote(svc: &mut Service) {
    use k8s_openapi::api::core::v1::{ServiceSpec, ServiceStatus};
    use kube::api::ObjectMeta;
    let meta = std::mem::take(&mut svc.metadata);
    svc.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        resource_version: meta.resource_version,
        annotations: meta.annotations.map(|a| {
            a.into_iter()
                .filter(|(k, _)| k.starts_with(REMOTE_ANNOTATION_PREFIX))
                .collect()
        }),
        ..ObjectMeta::default()
    };
    svc.spec = svc.spec.take().map(|spec| ServiceSpec {
        ports: spec.ports,
        ..ServiceSpec::default()
    });
    svc.status = svc
        .status
        .take()
        .and_then(|status| status.load_balancer)
        .map(|lb| ServiceStatus {
            load_balancer: Some(lb),
            ..ServiceStatus::default()
        });
}

fn strip_event<K: Resource>(ev: &mut watcher::Event<K>, strip: fn(&mut K)) {
    match ev {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => {
            strip(o)
        }
        watcher::Event::Init | watcher::Event::InitDone => {}
    }
}

/// The key a local mirror Service stands for: from its fq-name annotation, or, for one
/// of ours without it, its own name (so it is collected as an orphan).
fn service_key(svc: &Service) -> ServiceKey {
    remote_key(&svc.metadata)
        .unwrap_or_else(|| ServiceKey::new(svc.namespace().unwrap_or_default(), svc.name_any()))
}

/// The key a local mirror Endpoints stands for: its annotation, else that of the Service
/// of the same name (the Go mirror wrote no annotation on Endpoints), else its name.
fn endpoints_key(inner: &Inner, ep: &Endpoints) -> ServiceKey {
    let ns = ep.namespace().unwrap_or_default();
    remote_key(&ep.metadata)
        .or_else(|| {
            let svc = inner
                .local_services
                .get(&ObjectRef::new(&ep.name_any()).within(&ns))?;
            Some(service_key(&svc))
        })
        .unwrap_or_else(|| ServiceKey::new(ns, ep.name_any()))
}

impl ClusterWatcher {
    /// Starts watching the remote cluster behind `remote` and mirroring into `local`.
    pub fn start(local: Client, remote: Client, link: Link, opts: WatcherOptions) -> Result<Self> {
        Self::start_inner(local, remote, link, opts, false)
    }

    /// Starts with caches and queue running but no writes until [`ClusterWatcher::resume`].
    pub fn start_paused(
        local: Client,
        remote: Client,
        link: Link,
        opts: WatcherOptions,
    ) -> Result<Self> {
        Self::start_inner(local, remote, link, opts, true)
    }

    /// Lets a paused watcher write.
    pub fn resume(&self) {
        reset_slots(&self.inner);
        self.inner.writable.send_replace(true);
    }

    fn start_inner(
        local: Client,
        remote: Client,
        link: Link,
        opts: WatcherOptions,
        paused: bool,
    ) -> Result<Self> {
        validate_cluster_name(&link.cluster_name).map_err(|e| Error::InvalidLink(e.to_string()))?;
        let cancel = CancellationToken::new();
        let (remote_store, svc_store, ep_store) =
            (Cache::default(), Cache::default(), Cache::default());
        let (remote_writer, svc_writer, ep_writer) =
            (remote_store.clone(), svc_store.clone(), ep_store.clone());
        let backoff = Backoff {
            fast_retries: opts.requeue_limit,
            ..Backoff::default()
        };
        let inner = Arc::new(Inner {
            writer: LocalWriter::new(local.clone(), &link.cluster_name, opts.metrics.clone()),
            resolver: CachingResolver::new(opts.resolver.clone()),
            queue: WorkQueue::new(backoff, cancel.clone()),
            limit: limit::MirrorLimit::new(opts.max_mirrors),
            export: ExportPolicy {
                namespaces: opts.namespaces.clone(),
                ..ExportPolicy::default()
            },
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
            relists: AtomicU64::new(0),
            writable: tokio::sync::watch::Sender::new(!paused),
            endpoints_first: Mutex::default(),
            expectations: expect::Expectations::default(),
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
        if let Some(leader) = inner.opts.leader.clone() {
            tasks.push(tokio::spawn(follow_leader(
                inner.clone(),
                leader,
                cancel.clone(),
            )));
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
            refused: i.limit.refused(),
            queue_depth: i.queue.depth(),
            failing: i.queue.failing(),
            relists: i.relists.load(Ordering::SeqCst),
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
    store: Cache<Service>,
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
                strip_event(&mut ev, strip_remote);
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
                watcher::Event::Apply(_) => export_decision(svc, &inner.export).gateway().cloned(),
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
            inner.remote.for_each(|svc| {
                let key = ServiceKey::new(svc.namespace().unwrap_or_default(), svc.name_any());
                if let Some(gw) = export_decision(svc, &inner.export).gateway() {
                    index.set_gateway(&key, Some(gw.clone()));
                }
            });
            keys.extend(index.exported().cloned());
            keys.extend(index.local_keys());
            drop(index);
            if !inner.remote_synced.swap(true, Ordering::SeqCst) {
                tracing::info!(cluster = %inner.link.cluster_name, services = inner.remote.len(), "remote services synced");
            } else {
                // kube's watcher lists again only when its resume point expired (HTTP 410).
                inner.relists.fetch_add(1, Ordering::SeqCst);
                inner
                    .opts
                    .metrics
                    .remote_relists
                    .get_or_create(&Metrics::cluster(&inner.link.cluster_name))
                    .inc();
                tracing::info!(cluster = %inner.link.cluster_name, services = inner.remote.len(), "remote services listed again");
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
    + serde::Serialize
    + Send
    + Sync
    + 'static
{
    const OBJECT: expect::LocalObject;
    fn index(index: &mut Index) -> &mut index::LocalIndex;
    fn synced(inner: &Inner) -> &AtomicBool;
    fn store(inner: &Inner) -> &Cache<Self>;
    fn key(inner: &Inner, obj: &Self) -> ServiceKey;
}

impl LocalKind for Service {
    const OBJECT: expect::LocalObject = expect::LocalObject::Service;
    fn index(index: &mut Index) -> &mut index::LocalIndex {
        index.services()
    }
    fn synced(inner: &Inner) -> &AtomicBool {
        &inner.local_services_synced
    }
    fn store(inner: &Inner) -> &Cache<Self> {
        &inner.local_services
    }
    fn key(_: &Inner, obj: &Self) -> ServiceKey {
        service_key(obj)
    }
}

impl LocalKind for Endpoints {
    const OBJECT: expect::LocalObject = expect::LocalObject::Endpoints;
    fn index(index: &mut Index) -> &mut index::LocalIndex {
        index.endpoints()
    }
    fn synced(inner: &Inner) -> &AtomicBool {
        &inner.local_endpoints_synced
    }
    fn store(inner: &Inner) -> &Cache<Self> {
        &inner.local_endpoints
    }
    fn key(inner: &Inner, obj: &Self) -> ServiceKey {
        endpoints_key(inner, obj)
    }
}

async fn watch_local<K: LocalKind>(
    inner: Arc<Inner>,
    api: Api<K>,
    config: watcher::Config,
    store: Cache<K>,
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
                strip_event(&mut ev, strip::<K>);
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
    match ev {
        watcher::Event::Apply(o) => inner.expectations.observed(
            K::OBJECT,
            &o.namespace().unwrap_or_default(),
            &o.name_any(),
            o.meta().resource_version.as_deref(),
        ),
        watcher::Event::Delete(o) => inner.expectations.observed(
            K::OBJECT,
            &o.namespace().unwrap_or_default(),
            &o.name_any(),
            None,
        ),
        watcher::Event::InitDone => inner.expectations.relisted(K::OBJECT),
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
    }
    {
        let mut index = inner.index();
        if matches!(ev, watcher::Event::InitDone) {
            keys.extend(index.exported().cloned());
        }
        let local = K::index(&mut index);
        match ev {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                let key = K::key(inner, o);
                if K::OBJECT == expect::LocalObject::Service {
                    // A mirror that exists keeps its slot under the mirror limit.
                    inner.limit.hold(&key);
                }
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
                // Keys of objects gone while we were not watching are looked at too (so a
                // mirror deleted meanwhile is recreated), as is every exported key (above).
                keys.extend(local.keys().cloned());
                local.clear();
                K::store(inner).for_each(|o| {
                    local.set(
                        &o.namespace().unwrap_or_default(),
                        &o.name_any(),
                        K::key(inner, o),
                    );
                });
                keys.extend(local.keys().cloned());
                K::synced(inner).store(true, Ordering::SeqCst);
            }
        }
    }
    for k in keys {
        inner.queue.add(k);
    }
}

/// Waits until this watcher may write: local caches listed (reconciling against caches
/// that have not listed would create what exists), not paused, and leader if elected.
/// False when cancelled.
async fn wait_writable(inner: &Inner, cancel: &CancellationToken) -> bool {
    let mut own = inner.writable.subscribe();
    loop {
        own.borrow_and_update();
        if writable_now(inner) && inner.local_synced() {
            return true;
        }
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = own.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

fn writable_now(inner: &Inner) -> bool {
    *inner.writable.borrow() && inner.opts.leader.as_ref().is_none_or(|l| *l.borrow())
}

/// Before writing again after a pause: mirror-limit slots from the local mirrors as
/// they are now (mirrors another writer deleted meanwhile hold none).
fn reset_slots(inner: &Inner) {
    let keys: Vec<ServiceKey> = inner.index().services().keys().cloned().collect();
    inner.limit.reset_held(keys);
}

/// On gaining leadership, every key is reconciled: the world may have drifted while
/// another replica (or none) was writing.
async fn follow_leader(
    inner: Arc<Inner>,
    mut leader: tokio::sync::watch::Receiver<bool>,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = leader.changed() => if changed.is_err() { return },
        }
        if *leader.borrow_and_update() {
            reset_slots(&inner);
            let keys: Vec<ServiceKey> = {
                let index = inner.index();
                index
                    .exported()
                    .cloned()
                    .chain(index.local_keys())
                    .collect()
            };
            tracing::info!(cluster = %inner.link.cluster_name, keys = keys.len(), "leader: reconciling everything");
            for k in keys {
                inner.queue.add(k);
            }
        }
    }
}

async fn worker(inner: Arc<Inner>, cancel: CancellationToken) {
    let metrics = &inner.opts.metrics;
    let labels = Metrics::cluster(&inner.link.cluster_name);
    loop {
        if !wait_writable(&inner, &cancel).await {
            return;
        }
        let Some(key) = inner.queue.next().await else {
            return;
        };
        if !writable_now(&inner) {
            // Leadership was lost (or the watcher paused) while waiting: keep the key.
            inner.queue.done(key.clone(), Outcome::Done);
            inner.queue.add(key);
            continue;
        }
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
        metrics
            .mirrors_refused
            .get_or_create(&labels)
            .set(inner.limit.refused() as i64);
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
                .and_then(|svc| service_mirror_core::gateway_spec(&svc).ok())
                .is_some_and(|spec| !spec.hostnames.is_empty());
            if by_hostname {
                for key in inner.index().users_of(&gw) {
                    inner.queue.add(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use service_mirror_core::{
        ResolvedGateway, desired_mirror, exported_gateway, gateway_spec, probe_spec,
    };

    fn full(json: serde_json::Value) -> Service {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn stripped_remote_services_mirror_the_same() {
        let svc = full(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "42", "uid": "u",
                "labels": {"app": "web"},
                "annotations": {"mirror.linkerd.io/gateway-name": "gw", "mirror.linkerd.io/gateway-ns": "mc",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"a\": 1}"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.0.0.7", "type": "ClusterIP",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "appProtocol": "http"}]},
            "status": {"loadBalancer": {}}
        }));
        let gw = full(serde_json::json!({
            "metadata": {"name": "gw", "namespace": "mc", "resourceVersion": "7",
                "annotations": {"mirror.linkerd.io/probe-path": "/health", "mirror.linkerd.io/probe-period": "5", "other": "x"}},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.0.0.9", "ports": [
                {"name": "mc-gateway", "port": 4143, "nodePort": 30001},
                {"name": "mc-probe", "port": 4191, "nodePort": 30002}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"hostname": "gw.example"}]},
                "conditions": [{"type": "x", "status": "True", "reason": "r", "message": "m",
                    "lastTransitionTime": "2024-01-01T00:00:00Z"}]}
        }));
        let (mut s, mut g) = (svc.clone(), gw.clone());
        strip_remote(&mut s);
        strip_remote(&mut g);
        assert!(s.metadata.labels.is_none() && s.metadata.managed_fields.is_none());
        assert_eq!(s.metadata.annotations.as_ref().unwrap().len(), 2);
        assert!(s.spec.as_ref().unwrap().selector.is_none());
        assert_eq!(exported_gateway(&s), exported_gateway(&svc));
        assert_eq!(gateway_spec(&g), gateway_spec(&gw));
        assert_eq!(probe_spec(&g), probe_spec(&gw));
        let link = Link::new("east", None);
        let gref = exported_gateway(&svc).unwrap();
        let resolved = ResolvedGateway::new(["192.0.2.1".parse().unwrap()], 4143, "7");
        assert_eq!(
            desired_mirror(&s, &link, &gref, Some(&resolved)),
            desired_mirror(&svc, &link, &gref, Some(&resolved))
        );
    }
}
