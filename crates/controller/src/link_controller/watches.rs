//! The four watches of a link (remote Services, local mirror Services, Endpoints and
//! our EndpointSlices):
//! each event updates a cache (in the driver), then the index and the expectations,
//! and queues the keys that `keys.rs` maps it to.

use super::cache::Cache;
use super::expect::{Expectations, LocalObject};
use super::hostnames::RemoteHostnames;
use super::index::Index;
use super::keys::{LocalKind, keys_for_local, keys_for_remote};
use super::limit::MirrorLimit;
use super::metrics::LinkMetrics;
use super::readiness::RemoteReadiness;
use super::reconcile::Reconciler;
use super::remote_state::RemoteHealth;
use super::strip::{
    strip_managed_fields, strip_remote, strip_remote_for_mcs, strip_remote_keeping_metadata,
    strip_remote_keeping_metadata_for_mcs,
};
use super::{Synced, WorkQueue};
use crate::runtime::once::{Episode, Reporter, Say};
use crate::runtime::relist::{AfterList, Holds};
use crate::runtime::watch::{OverCap, Store, Watch, drive, drive_restartable, keep_all};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher;
use parking_lot::Mutex;
use service_mirror_core::labels::slice_owner_selector;
use service_mirror_core::owner_selector;
use service_mirror_core::{ExportPolicy, ExportRule, ServiceKey};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What the remote watch updates.
pub(super) struct RemoteEvents {
    pub(super) cluster: String,
    pub(super) remote: Cache<Service>,
    pub(super) export: ExportPolicy,
    pub(super) index: Arc<Mutex<Index>>,
    pub(super) synced: watch::Sender<Synced>,
    pub(super) connected: Arc<AtomicBool>,
    pub(super) relists: Arc<AtomicU64>,
    pub(super) metrics: LinkMetrics,
    pub(super) queue: WorkQueue<ServiceKey>,
    /// Where refusals by the running remote are said (a warning, the reason counted
    /// by link, an Event on the link object when it has one).
    pub(super) reporter: Reporter,
    /// The remote refuses the credentials (its reason says 401 or 403): since the remote
    /// last answered.
    pub(super) refused: Episode,
    /// What the remote answers, for the stale-remote policy.
    pub(super) health: Arc<RemoteHealth>,
    /// The link's mirrors (how many a list would delete).
    pub(super) local_services: Cache<Service>,
    /// A refusal of the remote's size (the cache cap, or a response over the frame
    /// limit) since the remote's last complete list: said once per link.
    pub(super) too_large: Episode,
    /// This link's feed of federated members, if any.
    pub(super) federation: Option<crate::federation::LinkFeed>,
    /// This link's feed of remote Services into MCS, if MCS runs.
    pub(super) mcs: Option<crate::mcs::McsFeed>,
}

/// The status of a remote watch failure that refuses the credentials: 401 (revoked or
/// expired token) or 403 (the rights were taken away).
fn refusal(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
            if s.code == 401 || s.code == 403 =>
        {
            Some(s.code)
        }
        watcher::Error::WatchError(s) if s.code == 401 || s.code == 403 => Some(s.code),
        _ => None,
    }
}

impl RemoteEvents {
    /// Watches every remote Service until `cancel` fires.
    pub(super) async fn run(self, api: Api<Service>, cancel: CancellationToken) {
        // A Link's mirrors copy the remote labels and annotations, and its selectors read
        // the labels: keep them.
        let strip = match (&self.export.rule, self.mcs.is_some()) {
            (ExportRule::GatewayAnnotations, false) => strip_remote,
            (ExportRule::Selectors { .. }, false) => strip_remote_keeping_metadata,
            // MCS reads the remote Services from this watch: its spec fields stay.
            (ExportRule::GatewayAnnotations, true) => strip_remote_for_mcs,
            (ExportRule::Selectors { .. }, true) => strip_remote_keeping_metadata_for_mcs,
        };
        let watch = Watch {
            api,
            config: watcher::Config::default(),
            strip,
            store: RemoteStore(self.remote.clone(), self.health.clone()),
        };
        let health = self.health.clone();
        let (on_event, on_error) = (|ev: &_| self.on_event(ev), |e: &_| self.on_error(e));
        let on_refused = |over: &OverCap, wait| self.over_cap(over, wait);
        drive_restartable(
            watch,
            cancel,
            &health.relist,
            on_event,
            on_error,
            on_refused,
        )
        .await
    }

    /// The remote Services would pass the cache cap: the list in progress was dropped,
    /// the last complete content (and so every mirror) stays, and the watch is tried
    /// again after `wait`. Said once until a complete list fits.
    fn over_cap(&self, over: &OverCap, wait: std::time::Duration) {
        let cluster = &self.cluster;
        let services = self.remote.len();
        tracing::debug!(%cluster, cap = over.cap, would_hold = over.would_hold, wait_s = wait.as_secs(), "remote services over the cache cap");
        if !self.too_large.start("RemoteTooLarge") {
            return;
        }
        let note = format!(
            "a list of the remote services of cluster {cluster} would take more than half the cache cap of {} bytes of this link (--max-remote-cache-bytes; the other half keeps the last complete list while a new one arrives): the list was dropped, mirrors stay exactly as they were ({services} remote services kept from the last complete list), and the remote is listed again after a backoff starting at {} s",
            over.cap,
            wait.as_secs()
        );
        self.said_too_large("RemoteTooLarge", note);
    }

    /// Says a refusal of the remote's size: a warning, the reason counted (by link),
    /// a Warning Event on the link object; the stale-remote policy hears of it.
    fn said_too_large(&self, reason: &'static str, note: String) {
        self.health.refused(reason, note.clone());
        self.reporter.say(Say {
            reason,
            action: "Watch",
            note,
            key: None,
        });
    }

    fn on_event(&self, ev: &watcher::Event<Service>) {
        // kube's watcher yields `Init` before it sends the list (again after each failed
        // list): only what came from the remote counts as an answer.
        if !matches!(ev, watcher::Event::Init) {
            self.connected.store(true, Ordering::SeqCst);
            self.refused.end();
            self.metrics.remote_connected(true);
        }
        // The watch works: an event of the watch (a list counts once complete, below).
        if matches!(ev, watcher::Event::Apply(_) | watcher::Event::Delete(_)) {
            self.health.watch_event();
        }
        if !matches!(ev, watcher::Event::Init | watcher::Event::InitApply(_)) {
            self.metrics.remote_synced_now();
        }
        // A complete list fits again: a later refusal is news.
        if matches!(ev, watcher::Event::InitDone) {
            self.too_large.end();
        }
        if let Some(feed) = &self.federation {
            feed.remote_event(ev);
        }
        if let Some(feed) = &self.mcs {
            feed.remote_event(ev);
        }
        let keys = keys_for_remote(&mut self.index.lock(), &self.remote, &self.export, ev);
        if matches!(ev, watcher::Event::InitDone) {
            // The first list too: a restart during an outage reconnects with it.
            let exported = self.index.lock().exported().count();
            self.health.listed(self.local_services.len(), exported);
            let (cluster, services) = (&self.cluster, self.remote.len());
            let first = self
                .synced
                .send_if_modified(|s| !std::mem::replace(&mut s.remote, true));
            if first {
                tracing::info!(%cluster, services, "remote services synced");
            } else {
                // kube's watcher lists again only when its resume point expired (HTTP 410).
                self.relists.fetch_add(1, Ordering::SeqCst);
                self.metrics.remote_relisted();
                tracing::info!(%cluster, services, "remote services listed again");
            }
        }
        for k in keys {
            self.queue.add(k);
        }
    }

    fn on_error(&self, e: &watcher::Error) {
        self.metrics.remote_connected(false);
        self.health.failed();
        if let Some(feed) = &self.federation {
            feed.failed();
        }
        if self.connected.swap(false, Ordering::SeqCst) {
            // The error carries the remote's text (a Status message of any size):
            // bounded and cleaned as every remote text.
            let error = crate::links::sanitize_remote_text(&e.to_string());
            tracing::warn!(cluster = %self.cluster, %error, "remote watch failed; retrying with backoff, mirrors kept");
        }
        if let Some(code) = refusal(e) {
            self.refused_now(code);
        }
        if crate::frame_limit::is_frame_too_large(e)
            && self.too_large.start("RemoteResponseTooLarge")
        {
            let note = format!(
                "the remote apiserver of cluster {} sent a response with more bytes without a line break than the limit (--max-remote-response-bytes): it was dropped unread, mirrors are kept as they are and the watch is retried with backoff",
                self.cluster
            );
            self.said_too_large("RemoteResponseTooLarge", note);
        }
    }

    /// The remote refuses the credentials of a running link (a token revoked or expired,
    /// rights taken away): said once per refusal episode and reason (a warning, the reason counted, an
    /// Event on the link object), retried with backoff, every mirror kept.
    fn refused_now(&self, code: u16) {
        let cluster = &self.cluster;
        let (reason, what) = match code {
            401 => (
                "RemoteUnauthorized",
                "rejects the credentials (401 Unauthorized): the token was revoked or expired",
            ),
            _ => (
                "RemoteForbidden",
                "no longer lets the credentials list and watch services (403 Forbidden)",
            ),
        };
        let note = format!(
            "the remote apiserver of cluster {cluster} {what}; mirrors are kept as they are and the watch is retried: link the cluster again with valid credentials"
        );
        let say = Say {
            reason,
            action: "Watch",
            note,
            key: None,
        };
        self.reporter
            .say_if(self.refused.start_or_change(reason), say);
    }
}

/// The remote Services cache, whose health hears of a complete list before the list
/// replaces the cache: a worker between the two would see every Service gone with no
/// hold yet.
struct RemoteStore(Cache<Service>, Arc<RemoteHealth>);

impl Store<Service> for RemoteStore {
    fn apply(&mut self, ev: &watcher::Event<Service>) {
        let _ = self.try_apply(ev);
    }

    fn try_apply(&mut self, ev: &watcher::Event<Service>) -> Result<(), OverCap> {
        if matches!(ev, watcher::Event::InitDone) {
            self.1.list_arriving();
        }
        // InitDone adds nothing: only an object is ever refused, before its list ends.
        self.0.try_apply(ev)
    }
}

/// What the watch of remote EndpointSlices updates (Link links: see readiness.rs;
/// with `--enable-headless-services`, every link: see hostnames.rs).
pub(super) struct RemoteSliceEvents {
    pub(super) cluster: String,
    pub(super) readiness: Option<Arc<Mutex<RemoteReadiness>>>,
    pub(super) hostnames: Option<Arc<Mutex<RemoteHostnames>>>,
    pub(super) index: Arc<Mutex<Index>>,
    /// The remote Services: their keys too wait for the slices' list.
    pub(super) remote: Cache<Service>,
    pub(super) queue: WorkQueue<ServiceKey>,
    /// For the length of the hold of an empty relist.
    pub(super) health: Arc<RemoteHealth>,
    /// The holds of an empty relist after an outage.
    pub(super) holds: Arc<Holds>,
}

/// The readiness and hostname tables as the watch driver's store. A complete list
/// after an outage that empties a table is held as the Services' list is
/// (remote_state.rs): readers keep the previous table until a second complete list or
/// the end of the hold, else Endpoints lose their subsets and headless mirrors their
/// addresses on a list an apiserver that is recovering may give (cilium#47793).
struct ReadinessStore {
    readiness: Option<Arc<Mutex<RemoteReadiness>>>,
    hostnames: Option<Arc<Mutex<RemoteHostnames>>>,
    holds: Arc<Holds>,
}

impl Store<EndpointSlice> for ReadinessStore {
    fn apply(&mut self, ev: &watcher::Event<EndpointSlice>) {
        if matches!(ev, watcher::Event::InitDone) {
            // Either table emptied: one hold (one list, one verdict), ended for both.
            self.holds.list_complete(|| {
                self.readiness
                    .as_ref()
                    .is_some_and(|r| r.lock().hold_if_emptied())
                    | self
                        .hostnames
                        .as_ref()
                        .is_some_and(|h| h.lock().hold_if_emptied())
            });
        }
        if let Some(r) = &self.readiness {
            r.lock().apply(ev);
        }
        if let Some(h) = &self.hostnames {
            h.lock().apply(ev);
        }
    }
}

impl RemoteSliceEvents {
    /// Watches every remote EndpointSlice until `cancel` fires.
    pub(super) async fn run(self, api: Api<EndpointSlice>, cancel: CancellationToken) {
        let watch = Watch {
            api,
            config: watcher::Config::default(),
            strip: keep_all,
            store: ReadinessStore {
                readiness: self.readiness.clone(),
                hostnames: self.hostnames.clone(),
                holds: self.holds.clone(),
            },
        };
        drive(watch, cancel, |ev| self.on_event(ev), |e| self.on_error(e)).await
    }

    fn on_event(&self, ev: &watcher::Event<EndpointSlice>) {
        let mut keys = self
            .readiness
            .as_ref()
            .map(|r| r.lock().take_changed())
            .unwrap_or_default();
        if let Some(h) = &self.hostnames {
            keys.extend(h.lock().take_changed());
        }
        if matches!(ev, watcher::Event::InitDone) {
            // Every decision waits for this list (a Link's gateway endpoints depend on
            // it) and a key that waited is not queued again by anything else: all keys,
            // also those whose mirrors go (a Link's selector edit restarted the link and
            // a no longer selected Service's key waited here: its mirror stayed).
            keys.extend(self.waited());
            match self.holds.after_list() {
                AfterList::Release => keys.extend(release(&self.readiness, &self.hostnames)),
                AfterList::Started(hold) => self.hold_started(hold),
                AfterList::Running => {}
            }
        }
        for k in keys {
            self.queue.add(k);
        }
    }

    /// The keys that waited for the slices' list, which nothing else queues again: the
    /// index's, and every remote Service's (one with nothing in the index, such as a
    /// federated member with an invalid export-to, was decided "not listed" and waited
    /// too; under CI load its reconcile came before the slices' list and it was never
    /// decided again).
    fn waited(&self) -> Vec<ServiceKey> {
        let mut keys: Vec<ServiceKey> = self.index.lock().all_keys().into_iter().collect();
        self.remote.for_each(|s| {
            keys.push(ServiceKey::new(
                s.metadata.namespace.as_deref().unwrap_or_default(),
                s.metadata.name.as_deref().unwrap_or_default(),
            ))
        });
        keys
    }

    /// Hold number `hold` began: it ends when it runs out unless a list ended it.
    fn hold_started(&self, hold: u64) {
        let wait = self.health.relist_hold();
        tracing::warn!(cluster = %self.cluster, hold_s = wait.as_secs(), "remote endpointslices listed empty after an outage: the previous readiness and hostnames are kept until a second complete list or the end of the hold");
        let (holds, queue) = (self.holds.clone(), self.queue.clone());
        let (readiness, hostnames) = (self.readiness.clone(), self.hostnames.clone());
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            if holds.expire(hold) {
                for k in release(&readiness, &hostnames) {
                    queue.add(k);
                }
            }
        });
    }

    fn on_error(&self, e: &watcher::Error) {
        self.holds.failed();
        // Forbidden (credentials from before Links), or not served (a remote without
        // discovery.k8s.io/v1): readiness cannot be known, so it is not waited for.
        let forbidden = matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) | watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 403 || s.code == 404);
        if forbidden
            && let Some(h) = &self.hostnames
            && h.lock().set_unavailable()
        {
            tracing::warn!(cluster = %self.cluster, error = %e, "the remote credentials may not watch endpointslices: new headless services get ClusterIP mirrors through the gateway, existing headless mirrors are kept as they are (grant it with `service-mirror allow`)");
            // Keys waited for the slices' list: they are planned without it now.
            for k in self.waited() {
                self.queue.add(k);
            }
        }
        if forbidden
            && let Some(readiness) = &self.readiness
            && readiness.lock().set_unavailable()
        {
            tracing::warn!(cluster = %self.cluster, error = %e, "the remote credentials may not watch endpointslices: mirrors get the gateway's endpoints whether or not the remote Service has ready endpoints (grant it with `service-mirror allow`)");
            for k in self.waited() {
                self.queue.add(k);
            }
        } else if !forbidden {
            tracing::debug!(cluster = %self.cluster, error = %e, "remote endpointslice watch failed; retrying with backoff");
        }
    }
}

/// Ends a hold of both tables: the keys whose view changed.
fn release(
    readiness: &Option<Arc<Mutex<RemoteReadiness>>>,
    hostnames: &Option<Arc<Mutex<RemoteHostnames>>>,
) -> Vec<ServiceKey> {
    let mut keys = readiness
        .as_ref()
        .map(|r| r.lock().release())
        .unwrap_or_default();
    if let Some(h) = hostnames {
        keys.extend(h.lock().release());
    }
    keys
}

/// What the local watches update.
#[derive(Clone)]
pub(super) struct LocalEvents {
    pub(super) local_services: Cache<Service>,
    pub(super) index: Arc<Mutex<Index>>,
    pub(super) expectations: Arc<Expectations>,
    pub(super) limit: Arc<MirrorLimit>,
    pub(super) synced: watch::Sender<Synced>,
    pub(super) queue: WorkQueue<ServiceKey>,
}

impl LocalEvents {
    /// Watches the local objects of kind `K` selected by `config` into `store` until
    /// `cancel` fires.
    pub(super) async fn run<K: LocalKind>(
        self,
        api: Api<K>,
        config: watcher::Config,
        store: Cache<K>,
        cancel: CancellationToken,
    ) {
        let watch = Watch {
            api,
            config,
            strip: strip_managed_fields::<K>,
            store: store.clone(),
        };
        let on_error = |e: &watcher::Error| tracing::warn!(kind = %K::kind(&()), error = %e, "local watch failed; retrying with backoff");
        drive(watch, cancel, |ev| self.on_event(&store, ev), on_error).await
    }

    fn on_event<K: LocalKind>(&self, store: &Cache<K>, ev: &watcher::Event<K>) {
        let observed = |o: &K, version| {
            let ns = o.namespace().unwrap_or_default();
            self.expectations
                .observed(K::OBJECT, &ns, &o.name_any(), version)
        };
        match ev {
            watcher::Event::Apply(o) => observed(o, o.meta().resource_version.as_deref()),
            watcher::Event::Delete(o) => {
                tracing::debug!(kind = %K::kind(&()), ns = ?o.namespace(), name = %o.name_any(), "local object deleted");
                observed(o, None)
            }
            watcher::Event::InitDone => self.expectations.relisted(K::OBJECT),
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
        let keys = {
            let mut index = self.index.lock();
            let keys = keys_for_local(&mut index, &self.local_services, store, ev);
            if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = ev
                && K::OBJECT == LocalObject::Service
            {
                // A mirror that exists keeps its slots under the mirror limit: one per
                // Service of its key (a headless mirror's endpoint mirrors count).
                let key = K::key(&self.local_services, o);
                let mut services = index.services();
                let count = services.count(&key).max(1);
                self.limit.hold(services.shared(&key), count);
            }
            // An endpoint mirror gone: its key holds one slot less (the last one goes
            // when the key releases it, which wakes refused keys).
            if let watcher::Event::Delete(o) = ev
                && K::OBJECT == LocalObject::Service
            {
                let key = K::key(&self.local_services, o);
                let mut services = index.services();
                let count = services.count(&key);
                if count > 0 {
                    self.limit.hold(services.shared(&key), count);
                }
            }
            if matches!(ev, watcher::Event::InitDone) {
                self.synced.send_modify(|s| match K::OBJECT {
                    LocalObject::Service => s.local_services = true,
                    LocalObject::Endpoints => s.local_endpoints = true,
                    LocalObject::EndpointSlice => s.local_slices = true,
                });
            }
            keys
        };
        for k in keys {
            self.queue.add(k);
        }
    }
}

/// What the watches of a link update besides the reconciler's caches.
pub(super) struct Shared {
    pub(super) synced: watch::Sender<Synced>,
    pub(super) connected: Arc<AtomicBool>,
    pub(super) relists: Arc<AtomicU64>,
    pub(super) metrics: LinkMetrics,
    /// This link's feed of federated members, if any.
    pub(super) federation: Option<crate::federation::LinkFeed>,
    /// This link's feed of remote Services into MCS, if MCS runs.
    pub(super) mcs: Option<crate::mcs::McsFeed>,
    /// Where the remote watch says its refusals.
    pub(super) reporter: Reporter,
}

/// Starts the three watches of a link: every remote Service, and the local Services and
/// Endpoints labelled as mirrors of its cluster.
pub(super) fn spawn(
    rec: &Reconciler,
    shared: Shared,
    local: Client,
    remote: Client,
    cancel: CancellationToken,
) -> Vec<JoinHandle<()>> {
    let cluster = rec.view.link.cluster_name.clone();
    let cluster_name = cluster.clone();
    let local_config = watcher::Config::default().labels(&owner_selector(&cluster));
    let remote_events = RemoteEvents {
        cluster,
        remote: rec.view.remote.clone(),
        export: rec.view.export.clone(),
        index: rec.view.index.clone(),
        synced: shared.synced.clone(),
        connected: shared.connected,
        relists: shared.relists,
        metrics: shared.metrics,
        queue: rec.fx.queue.clone(),
        reporter: shared.reporter,
        refused: Episode::default(),
        health: rec.view.health.clone(),
        local_services: rec.view.local_services.clone(),
        too_large: Episode::default(),
        federation: shared.federation,
        mcs: shared.mcs,
    };
    let slice_events =
        (rec.view.readiness.is_some() || rec.view.hostnames.is_some()).then(|| RemoteSliceEvents {
            cluster: cluster_name.clone(),
            readiness: rec.view.readiness.clone(),
            hostnames: rec.view.hostnames.clone(),
            index: rec.view.index.clone(),
            remote: rec.view.remote.clone(),
            queue: rec.fx.queue.clone(),
            health: rec.view.health.clone(),
            holds: Arc::default(),
        });
    let local_events = LocalEvents {
        local_services: rec.view.local_services.clone(),
        index: rec.view.index.clone(),
        expectations: rec.view.expectations.clone(),
        limit: rec.fx.limit.clone(),
        synced: shared.synced,
        queue: rec.fx.queue.clone(),
    };
    let mut tasks = Vec::new();
    if let Some(slice_events) = slice_events {
        tasks.push(tokio::spawn(
            slice_events.run(Api::all(remote.clone()), cancel.clone()),
        ));
    }
    tasks.extend([
        tokio::spawn(remote_events.run(Api::all(remote), cancel.clone())),
        tokio::spawn(local_events.clone().run(
            Api::<Service>::all(local.clone()),
            local_config.clone(),
            rec.view.local_services.clone(),
            cancel.clone(),
        )),
        tokio::spawn(local_events.clone().run(
            Api::<Endpoints>::all(local.clone()),
            local_config,
            rec.view.local_endpoints.clone(),
            cancel.clone(),
        )),
        // Our slices only (our managed-by): kube-controller-manager's mirrored slices
        // carry our labels too, and are never ours to cache or touch.
        tokio::spawn(local_events.run(
            Api::<EndpointSlice>::all(local),
            watcher::Config::default().labels(&slice_owner_selector(&cluster_name)),
            rec.view.local_slices.clone(),
            cancel,
        )),
    ]);
    tasks
}

#[cfg(test)]
#[path = "watches_tests.rs"]
mod tests;
