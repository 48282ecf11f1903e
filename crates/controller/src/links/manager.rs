//! The link manager: reconciles link sources (link Secrets, Linkerd's `Link`
//! resources and, when enabled, `ClusterProfile`s, by name) into running link
//! controllers.
//!
//! Each source object is a key on a work queue, so a slow or unreachable remote only
//! holds up its own. A refused Secret or Link never stops or cleans up a running link:
//! its mirrors stay until it is fixed or deleted. Deleting a link Secret unlinks (its
//! mirrors go); deleting a Link stops its link and keeps the mirrors, as Linkerd does
//! (`service-mirror unlink` removes them); deleting a ClusterProfile stops its link at
//! once and deletes its mirrors once it has stayed absent for the deletion grace (a
//! profile of the name back within it resumes the link; docs/operations.md,
//! "ClusterProfile links").

use super::choice;
use super::cleanup::Cleanups;
use super::clusterprofile::parse_cluster_profile;
use super::collector::Collector;
use super::connect::connect;
use super::link::parse_link;
use super::metrics::LinkErrorLabels;
use super::metrics::LinkResourceErrorLabels;
use super::resource::Link as LinkResource;
use super::secret::{LinkError, LinkSource, LinkSpec, parse_link_secret};
use crate::backoff::Backoff;
use crate::events::EventRecorder;
use crate::gateway::GatewaySource;
use crate::link_controller::{GatewayStatus, LinkConfig, LinkController, LinkDeps, LinkStatus};
use crate::metrics::Metrics;
use crate::runtime::watch::{Watch, drive, keep_all};
use crate::runtime::{Outcome, WorkQueue};
use crate::writer::{LocalWriter, MirrorSelector};
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::api::{Api, ListParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use parking_lot::{Mutex, MutexGuard};
use service_mirror_api::clusterprofile::ClusterProfile;
use service_mirror_core::labels::{LINK_CLUSTER_NAME_ANNOTATION, LINK_SECRET_TYPE};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

mod gone;
mod lifecycle;
mod profiles;
mod reconcile;
mod report;
mod sources;

use profiles::watch_cluster_profiles;
use sources::{watch_links, watch_secrets};

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
    /// Which link sources are read.
    pub sources: LinkSources,
    /// Whether the link controllers of `Link`s create missing namespaces.
    pub link_namespace_creation: bool,
    /// How long a deleted ClusterProfile must stay absent before its mirrors are
    /// deleted (`--cluster-profile-deletion-grace`, [`CLUSTER_PROFILE_DELETION_GRACE`]).
    pub cluster_profile_deletion_grace: Duration,
}

/// The default of `--cluster-profile-deletion-grace`: how long a deleted ClusterProfile
/// must stay absent before its mirrors are deleted (its link stops at once). Profiles
/// belong to a third-party cluster manager, which may delete and re-create one (a
/// re-sync, a GitOps prune and re-apply, a migration between managers): deleting the
/// mirrors at once would delete every mirror and re-create them with new ClusterIPs.
/// Such a re-create lands within seconds; 30 s covers it with room (a prune-and-apply
/// cycle, a manager's restart and re-list) while a cluster truly gone from the
/// inventory stops being mirrored within half a minute, as `--remote-grace` (also 30 s)
/// bounds how long a silent remote goes unreported.
pub const CLUSTER_PROFILE_DELETION_GRACE: Duration = Duration::from_secs(30);

/// Where links come from (`--link-source`). ClusterProfiles are read only when asked
/// for (`cluster-profiles` or `all`): a cluster inventory may hold profiles of clusters
/// nobody meant to mirror, so none links by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LinkSources {
    /// Link Secrets only (the 2020 contract).
    Secrets,
    /// Linkerd's `Link` resources only.
    Links,
    /// Both; a cluster named by both is linked by the oldest (see docs/operations.md).
    #[default]
    Both,
    /// `ClusterProfile`s (KEP-4322) only.
    ClusterProfiles,
    /// Link Secrets, `Link`s and `ClusterProfile`s.
    All,
}

impl LinkSources {
    /// Whether link Secrets are read.
    pub fn secrets(self) -> bool {
        matches!(
            self,
            LinkSources::Secrets | LinkSources::Both | LinkSources::All
        )
    }

    /// Whether `Link` resources are read.
    pub fn links(self) -> bool {
        matches!(
            self,
            LinkSources::Links | LinkSources::Both | LinkSources::All
        )
    }

    /// Whether `ClusterProfile`s are read.
    pub fn cluster_profiles(self) -> bool {
        matches!(self, LinkSources::ClusterProfiles | LinkSources::All)
    }
}

/// How long a new Link may wait for its credentials Secret before it is reported.
const CREDENTIALS_GRACE: Duration = Duration::from_secs(2);

/// When a link Secret the cache lost but the apiserver still holds is looked at again:
/// by then the lagging watch has usually delivered the re-create (one list per second
/// per such Secret while it lags).
const WATCH_BEHIND_RECHECK: Duration = Duration::from_secs(1);

/// An object created within the last [`CREDENTIALS_GRACE`] (per its creation time).
fn young(meta: &kube::api::ObjectMeta) -> bool {
    meta.creation_timestamp.as_ref().is_some_and(|t| {
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(t.0);
        // A small negative age is a clock skew: young too.
        age.unsigned_abs() < CREDENTIALS_GRACE
    })
}

/// The tunables of the link controller of `spec`: `base` (every link's), with, for a
/// `Link`, its own selectors, gateway and probe settings, and namespace creation only if
/// `link_namespace_creation`. A Secret link gets `base` unchanged.
pub fn link_config(
    base: &LinkConfig,
    spec: &LinkSpec,
    link_namespace_creation: bool,
) -> LinkConfig {
    let mut config = base.clone();
    if let LinkSource::Resource(r) = spec.source() {
        config.export_rule = r.export.clone();
        config.link_gateway = r.gateway.clone().map(|spec| GatewaySource::Link {
            spec,
            probe: r.probe.clone(),
        });
        config.probe_timeout = r.probe_timeout;
        config.probe_failure_threshold = r.probe_failure_threshold;
        config.create_namespaces = link_namespace_creation;
        config.federated_selector = Some(r.federated.clone());
    }
    config
}

/// A link source object: a key of the manager's queue. (Which of several links a
/// cluster: choice.rs, not this type's order.)
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum SourceKey {
    /// A link Secret, by name.
    Secret(String),
    /// A `Link`, by name.
    Link(String),
    /// A `ClusterProfile`, by name.
    ClusterProfile(String),
}

impl fmt::Display for SourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceKey::Secret(n) => write!(f, "Secret/{n}"),
            SourceKey::Link(n) => write!(f, "Link/{n}"),
            SourceKey::ClusterProfile(n) => write!(f, "ClusterProfile/{n}"),
        }
    }
}

struct Active {
    spec: LinkSpec,
    controller: LinkController,
    /// The uid of the source object it runs from (`service_mirror_link_source`): a
    /// re-created Secret of the same spec keeps the link, and says so here.
    uid: Option<String>,
}

/// A source object, for Events and metrics about it.
enum SourceObject<'a> {
    Secret(&'a Secret),
    Link(&'a LinkResource),
    ClusterProfile(&'a ClusterProfile),
}

impl SourceObject<'_> {
    fn reference(&self) -> ObjectReference {
        match self {
            SourceObject::Secret(s) => s.object_ref(&()),
            SourceObject::Link(l) => l.object_ref(&()),
            SourceObject::ClusterProfile(p) => p.object_ref(&()),
        }
    }

    fn created(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        self.meta().creation_timestamp.as_ref().map(|t| t.0)
    }

    fn meta(&self) -> &kube::api::ObjectMeta {
        match self {
            SourceObject::Secret(s) => &s.metadata,
            SourceObject::Link(l) => &l.metadata,
            SourceObject::ClusterProfile(p) => &p.metadata,
        }
    }
}

struct Inner {
    local: Client,
    opts: LinkManagerOptions,
    secrets: Store<Secret>,
    links: Store<LinkResource>,
    profiles: Store<ClusterProfile>,
    /// The Secrets are listed.
    synced: AtomicBool,
    /// The Links are listed (or are not read, or could not be listed).
    links_synced: AtomicBool,
    /// The Links are known: listed, not read, or their CRD is not installed (none can
    /// exist). False while the list is forbidden.
    links_known: AtomicBool,
    /// The ClusterProfiles are listed (or are not read, or could not be listed).
    profiles_synced: AtomicBool,
    /// The ClusterProfiles are known, as `links_known`.
    profiles_known: AtomicBool,
    /// The federation was told which clusters are linked (once the Links are known).
    federation_expected: AtomicBool,
    /// The MCS component has been told which clusters the sources name.
    mcs_expected: AtomicBool,
    active: Mutex<HashMap<SourceKey, Active>>,
    /// cluster name -> the source that links it.
    claims: Mutex<HashMap<String, SourceKey>>,
    /// Sources whose last connect failed (retried with backoff): not candidates.
    failing: Mutex<std::collections::HashSet<SourceKey>>,
    /// The cluster of each source whose connect failed (nothing runs for it): its
    /// federation entries are pending until it is gone (see `gone`).
    failing_clusters: Mutex<HashMap<SourceKey, String>>,
    queue: WorkQueue<SourceKey>,
    recorder: EventRecorder,
    /// Background cleanups of unlinked clusters still running, by cluster name.
    cleanups: Cleanups,
    /// The refusal last told of each ClusterProfile, by name (told once per episode).
    profile_refusals: Mutex<HashMap<String, super::clusterprofile::Refusal>>,
    /// Deleted ClusterProfiles whose link stopped and whose mirrors wait out the
    /// deletion grace, by name.
    parked_profiles: Mutex<HashMap<String, profiles::Parked>>,
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
        let (links, links_writer) = reflector::store::<LinkResource>();
        let (profiles, profiles_writer) = reflector::store::<ClusterProfile>();
        let links_enabled = opts.sources.links();
        let profiles_enabled = opts.sources.cluster_profiles();
        let inner = Arc::new(Inner {
            recorder,
            queue: WorkQueue::new(
                Backoff::with_fast_retries(opts.config.requeue_limit),
                cancel.clone(),
            ),
            local,
            opts,
            secrets: store,
            links,
            profiles,
            synced: AtomicBool::new(false),
            links_synced: AtomicBool::new(!links_enabled),
            links_known: AtomicBool::new(!links_enabled),
            profiles_synced: AtomicBool::new(!profiles_enabled),
            profiles_known: AtomicBool::new(!profiles_enabled),
            federation_expected: AtomicBool::new(false),
            mcs_expected: AtomicBool::new(false),
            active: Mutex::default(),
            claims: Mutex::default(),
            failing: Mutex::default(),
            failing_clusters: Mutex::default(),
            cleanups: Cleanups::default(),
            profile_refusals: Mutex::default(),
            parked_profiles: Mutex::default(),
            cancel: cancel.clone(),
        });
        let mut tasks = vec![tokio::spawn(watch_secrets(
            inner.clone(),
            writer,
            cancel.clone(),
        ))];
        if links_enabled {
            tasks.push(tokio::spawn(watch_links(
                inner.clone(),
                links_writer,
                cancel.clone(),
            )));
        }
        if profiles_enabled {
            tasks.push(tokio::spawn(watch_cluster_profiles(
                inner.clone(),
                profiles_writer,
                cancel.clone(),
            )));
        }
        for _ in 0..inner.opts.workers.max(1) {
            tasks.push(tokio::spawn(worker(inner.clone())));
        }
        Self {
            inner,
            cancel,
            tasks,
        }
    }

    /// Ready once the Secrets are listed and every link's local caches are synced (a
    /// link in cold standby, run by another replica, has none to wait for). Never waits
    /// on a remote cluster.
    pub fn ready(&self) -> bool {
        self.inner.listed()
            && self
                .inner
                .active()
                .values()
                .all(|a| a.controller.status().ready())
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
        let sources = self
            .inner
            .active()
            .values()
            .filter_map(|a| {
                let src = a.controller.source()?.clone();
                Some((a.spec.link().cluster_name.clone(), src))
            })
            .collect();
        let claimed = self.inner.claims().keys().cloned().collect();
        let cleaning = self.inner.cleanups.clusters().into_iter().collect();
        crate::write_leases::LinkSet {
            running,
            claimed,
            cleaning,
            sources,
        }
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
    fn active(&self) -> MutexGuard<'_, HashMap<SourceKey, Active>> {
        self.active.lock()
    }

    fn claims(&self) -> MutexGuard<'_, HashMap<String, SourceKey>> {
        self.claims.lock()
    }

    /// Every source listed.
    fn listed(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
            && self.links_synced.load(Ordering::SeqCst)
            && self.profiles_synced.load(Ordering::SeqCst)
    }

    /// Every source known (listed, not read, or its CRD not installed).
    fn known(&self) -> bool {
        self.links_known.load(Ordering::SeqCst) && self.profiles_known.load(Ordering::SeqCst)
    }

    fn metrics(&self) -> &Metrics {
        &self.opts.deps.metrics
    }

    /// What the link controller of `source` uses.
    fn link_deps(&self, source: &SourceObject<'_>) -> LinkDeps {
        LinkDeps {
            link_secret: Some(source.reference()),
            recorder: Some(self.recorder.clone()),
            link_created: source.created(),
            ..self.opts.deps.clone()
        }
    }

    /// The tunables of the link controller of `spec` (see [`link_config`]).
    fn link_config(&self, spec: &LinkSpec) -> LinkConfig {
        link_config(&self.opts.config, spec, self.opts.link_namespace_creation)
    }

    /// Takes a source's running link out of the tables.
    fn take(&self, key: &SourceKey) -> Option<Active> {
        let a = self.active().remove(key)?;
        let mut claims = self.claims();
        if claims.get(&a.spec.link().cluster_name) == Some(key) {
            claims.remove(&a.spec.link().cluster_name);
        }
        Some(a)
    }

    /// Every source object that validly links `cluster`, oldest first (the rule:
    /// choice.rs), the same after a restart.
    fn candidates(&self, cluster: &str) -> Vec<SourceKey> {
        let mut sources = Vec::new();
        if self.opts.sources.secrets() {
            for s in self.secrets.state() {
                sources.push(choice::Named {
                    key: SourceKey::Secret(s.name_any()),
                    created: s.metadata.creation_timestamp.clone().map(|t| t.0),
                    cluster: parse_link_secret(&s)
                        .ok()
                        .map(|spec| spec.link().cluster_name.clone()),
                });
            }
        }
        if self.opts.sources.links() {
            for l in self.links.state() {
                sources.push(choice::Named {
                    key: SourceKey::Link(l.name_any()),
                    created: l.metadata.creation_timestamp.clone().map(|t| t.0),
                    cluster: self
                        .parse(&l)
                        .ok()
                        .map(|spec| spec.link().cluster_name.clone()),
                });
            }
        }
        if self.opts.sources.cluster_profiles() {
            for p in self.profiles.state() {
                sources.push(choice::Named {
                    key: SourceKey::ClusterProfile(p.name_any()),
                    created: p.metadata.creation_timestamp.clone().map(|t| t.0),
                    cluster: self
                        .parse_profile(&p)
                        .ok()
                        .map(|spec| spec.link().cluster_name.clone()),
                });
            }
        }
        let failing = self.failing.lock().clone();
        choice::candidates(cluster, sources, &failing)
    }

    /// Another source that links `cluster` (choice.rs), not running a link of its own
    /// and not failing to connect.
    fn successor(&self, gone: &SourceKey, cluster: &str) -> Option<SourceKey> {
        let active: std::collections::HashSet<SourceKey> = self.active().keys().cloned().collect();
        choice::successor(gone, self.candidates(cluster), &active)
    }

    /// Queues every source object and every running link.
    fn queue_all(&self) {
        let mut keys: Vec<SourceKey> = self
            .secrets
            .state()
            .iter()
            .map(|s| SourceKey::Secret(s.name_any()))
            .collect();
        keys.extend(
            self.links
                .state()
                .iter()
                .map(|l| SourceKey::Link(l.name_any())),
        );
        keys.extend(
            self.profiles
                .state()
                .iter()
                .map(|p| SourceKey::ClusterProfile(p.name_any())),
        );
        keys.extend(self.active().keys().cloned());
        for k in keys {
            self.queue.add(k);
        }
    }
}

async fn worker(inner: Arc<Inner>) {
    while let Some(key) = inner.queue.next().await {
        let outcome = inner.reconcile(&key).await;
        inner.queue.done(key, outcome);
    }
}

/// A rotation counted in `service_mirror_link_rotations_in_progress` while it lives
/// (until `rotate` returns, whichever way).
struct RotationInProgress(prometheus_client::metrics::gauge::Gauge);

impl RotationInProgress {
    fn start(gauge: &prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for RotationInProgress {
    fn drop(&mut self) {
        self.0.dec();
    }
}
