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

mod lifecycle;
mod profiles;
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

    /// Reads a Link with its credentials Secret from the store.
    fn parse(&self, link: &LinkResource) -> Result<LinkSpec, LinkError> {
        let credentials = link
            .spec
            .cluster_credentials_secret
            .as_deref()
            .and_then(|n| {
                self.secrets
                    .get(&ObjectRef::new(n).within(&self.opts.namespace))
            });
        parse_link(link, credentials.as_deref())
    }

    /// A Link whose credentials Secret is not in the store (which holds only Secrets of
    /// the link type): the Secret may exist with another type. Read by name, unfiltered
    /// (a quorum list, as the install grants Secrets list, not get), it is judged by the
    /// same [`parse_link`], which calls it `InvalidCredentialsType`; absent (or the list
    /// failing: then the next event or retry looks again) it stays `MissingCredentials`.
    async fn parse_other_type(&self, link: &LinkResource) -> Result<LinkSpec, LinkError> {
        let Some(name) = link.spec.cluster_credentials_secret.as_deref() else {
            return parse_link(link, None);
        };
        let source = format!("Link/{}", link.name_any());
        parse_link(link, self.secret_of_any_type(name, &source).await.as_ref())
    }

    /// The Secret `name` of the controller's namespace, whatever its type, for the
    /// credentials of `source` (a Link or a ClusterProfile): a quorum list by name (the
    /// install grants Secrets list, not get). `None` when absent, or when the list fails
    /// (then the next event or retry looks again).
    pub(super) async fn secret_of_any_type(&self, name: &str, source: &str) -> Option<Secret> {
        let api: Api<Secret> = Api::namespaced(self.local.clone(), &self.opts.namespace);
        let params = ListParams::default()
            .fields(&format!("metadata.name={name}"))
            .limit(1);
        match api.list(&params).await {
            Ok(list) => list.items.into_iter().next(),
            Err(e) => {
                tracing::debug!(%source, error = %e, "could not look for the credentials Secret of another type");
                None
            }
        }
    }

    /// The Links whose credentials are the Secret `secret`.
    fn links_using(&self, secret: &str) -> Vec<SourceKey> {
        self.links
            .state()
            .iter()
            .filter(|l| l.spec.cluster_credentials_secret.as_deref() == Some(secret))
            .map(|l| SourceKey::Link(l.name_any()))
            .collect()
    }

    async fn reconcile(&self, key: &SourceKey) -> Outcome {
        // Which source links a cluster depends on both lists (the oldest wins), and a
        // Link's credentials are Secrets: nothing is decided on one list alone.
        if !self.listed() {
            return Outcome::RequeueAfter(Duration::from_millis(200));
        }
        match key {
            SourceKey::Secret(name) => self.reconcile_secret(key, name).await,
            SourceKey::Link(name) => self.reconcile_link(key, name).await,
            SourceKey::ClusterProfile(name) => self.reconcile_cluster_profile(key, name).await,
        }
    }

    /// The source `key` is gone: hand its link over to another source of the same
    /// cluster, or stop it. The hand-over moves the running link and the claim under one
    /// lock, so no other source can claim the cluster in between. `absent`: the caller
    /// found no object in the cache (else one that is no longer a source).
    async fn gone(&self, key: &SourceKey, absent: bool) -> Outcome {
        let Some(cluster) = self
            .active()
            .get(key)
            .map(|a| a.spec.link().cluster_name.clone())
        else {
            // Nothing ran, but the federation may wait for its list (a Link valid at
            // start whose connect kept failing): it is told the link is gone, unless
            // another source links the cluster now.
            let failed = self.failing_clusters.lock().remove(key);
            if let Some(cluster) = failed
                && !self.claims().contains_key(&cluster)
            {
                if let Some(federation) = &self.opts.deps.federation {
                    federation.link_removed(&cluster);
                }
                if let Some(mcs) = &self.opts.deps.mcs
                    && self.candidates(&cluster).is_empty()
                {
                    mcs.link_removed(&cluster);
                }
            }
            return Outcome::Done;
        };
        let next = self.successor(key, &cluster);
        // Unlinking a Secret the cache lost deletes its mirrors: the cache alone does not
        // decide it. A watch that resumes from an old resourceVersion delivers a delete
        // and a re-create back to back, and a reconcile between the two finds no Secret
        // in the cache while the apiserver holds one again (chaos run 10, round 366:
        // three live mirrors deleted and re-created 0.1 s later). One the cache holds,
        // turned into a Link's credentials, is gone as a source whatever the apiserver
        // says.
        // A Secret the caller found absent that the cache holds again: the watch's
        // re-create landed since that read (CI, under load: the delete and the re-create
        // back to back, the second applied between the reconcile's read and this one;
        // without this the link was unlinked with its Secret present). The next
        // reconcile judges the Secret that is there.
        let cached = |name: &str| {
            self.secrets
                .get(&ObjectRef::new(name).within(&self.opts.namespace))
                .is_some()
        };
        if absent
            && next.is_none()
            && let SourceKey::Secret(name) = key
            && cached(name)
        {
            tracing::debug!(%cluster, secret = %name, "link Secret back in the cache: looked at again");
            self.queue.add(key.clone());
            return Outcome::Done;
        }
        if next.is_none()
            && let SourceKey::Secret(name) = key
            && !cached(name)
        {
            match self.secret_exists(name).await {
                Ok(false) => {}
                Ok(true) => {
                    tracing::debug!(%cluster, secret = %name, "link Secret gone from the cache but not from the apiserver (the watch is behind): mirrors kept");
                    return Outcome::RequeueAfter(WATCH_BEHIND_RECHECK);
                }
                Err(e) => {
                    tracing::warn!(%cluster, secret = %name, error = %e, "cannot confirm that the link Secret is gone: mirrors kept; retrying");
                    return Outcome::Failed;
                }
            }
        }
        // The same for a ClusterProfile: its mirrors go after the deletion grace, but a
        // profile the apiserver still holds does not even stop its link.
        if next.is_none()
            && let SourceKey::ClusterProfile(name) = key
            && self
                .profiles
                .get(&ObjectRef::new(name).within(&self.opts.namespace))
                .is_some()
        {
            // Back in the cache since the caller found it absent (as for Secrets).
            tracing::debug!(%cluster, cluster_profile = %name, "ClusterProfile back in the cache: looked at again");
            self.queue.add(key.clone());
            return Outcome::Done;
        }
        if next.is_none()
            && let SourceKey::ClusterProfile(name) = key
        {
            match self.profile_exists(name).await {
                Ok(false) => {}
                Ok(true) => {
                    tracing::debug!(%cluster, cluster_profile = %name, "ClusterProfile gone from the cache but not from the apiserver (the watch is behind): mirrors kept");
                    return Outcome::RequeueAfter(WATCH_BEHIND_RECHECK);
                }
                Err(e) => {
                    tracing::warn!(%cluster, cluster_profile = %name, error = %e, "cannot confirm that the ClusterProfile is gone: mirrors kept; retrying");
                    return Outcome::Failed;
                }
            }
        }
        let stopped = {
            let mut active = self.active();
            let mut claims = self.claims();
            let Some(a) = active.remove(key) else {
                return Outcome::Done;
            };
            match &next {
                // Hand the running link controller over: its reconcile rotates credentials
                // (or restyles mirrors) if they differ, and no mirror is deleted.
                Some(next) => {
                    tracing::info!(%cluster, from = %key, to = %next, "link moved to another source");
                    claims.insert(cluster.clone(), next.clone());
                    active.insert(next.clone(), a);
                    None
                }
                None => {
                    if claims.get(&cluster) == Some(key) {
                        claims.remove(&cluster);
                    }
                    // A deleted ClusterProfile's mirrors wait out the grace, counted as
                    // a cleanup (its write Lease kept) that a new link of the cluster
                    // cancels, under the same locks as the claim's release.
                    if let SourceKey::ClusterProfile(name) = key {
                        self.park_profile(name, &cluster);
                    }
                    Some(a)
                }
            }
        };
        match (next, stopped) {
            (Some(next), _) => self.queue.add(next),
            (None, Some(a)) => {
                let parked = matches!(key, SourceKey::ClusterProfile(_));
                match parked {
                    true => self.stop_link(key, a, false).await,
                    false => self.unlink(key, a).await,
                }
                // A source refused as a duplicate of this one may link now.
                self.queue_all();
                if parked {
                    return Outcome::RequeueAfter(self.opts.cluster_profile_deletion_grace);
                }
            }
            (None, None) => {}
        }
        Outcome::Done
    }

    /// Whether the apiserver holds link Secret `name` now (a quorum list by name and
    /// type, metadata only: the install grants Secrets list, not get).
    async fn secret_exists(&self, name: &str) -> kube::Result<bool> {
        let api: Api<Secret> = Api::namespaced(self.local.clone(), &self.opts.namespace);
        let params = ListParams::default()
            .fields(&format!("metadata.name={name},type={LINK_SECRET_TYPE}"))
            .limit(1);
        Ok(!api.list_metadata(&params).await?.items.is_empty())
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

    async fn reconcile_secret(&self, key: &SourceKey, name: &str) -> Outcome {
        let secret = self
            .secrets
            .get(&ObjectRef::new(name).within(&self.opts.namespace));
        // Links and ClusterProfiles using it as credentials look again (rotated, or
        // gone).
        let users = self.credentials_users(name);
        for l in users.iter().cloned() {
            self.queue.add(l);
        }
        let Some(secret) = secret else {
            return self.gone(key, true).await;
        };
        // Without the cluster-name annotation it is a Link's credentials Secret (as
        // Linkerd writes them), or not a link at all: said only if no Link uses it.
        let credentials_only = !secret
            .annotations()
            .contains_key(LINK_CLUSTER_NAME_ANNOTATION);
        // Applied with its Link (`link --format link` prints the Secret first), a new
        // credentials Secret waits a moment for the Link before it is called unusable.
        if credentials_only
            && (self.opts.sources.links() || self.opts.sources.cluster_profiles())
            && users.is_empty()
            && young(&secret.metadata)
        {
            return Outcome::RequeueAfter(CREDENTIALS_GRACE);
        }
        if !self.opts.sources.secrets() || (credentials_only && !users.is_empty()) {
            let running = self.active().contains_key(key);
            return match running {
                true => self.gone(key, false).await,
                false => Outcome::Done,
            };
        }
        let spec = match parse_link_secret(&secret) {
            Ok(spec) => spec,
            Err(e) => {
                self.report(&SourceObject::Secret(&secret), &e).await;
                return Outcome::Done;
            }
        };
        self.apply_spec(key, &SourceObject::Secret(&secret), spec)
            .await
    }

    async fn reconcile_link(&self, key: &SourceKey, name: &str) -> Outcome {
        let link = self
            .links
            .get(&ObjectRef::new(name).within(&self.opts.namespace));
        let Some(link) = link else {
            return self.gone(key, true).await;
        };
        let parsed = match self.parse(&link) {
            Err(LinkError::MissingCredentials(_)) => self.parse_other_type(&link).await,
            other => other,
        };
        let spec = match parsed {
            Ok(spec) => spec,
            // Applied together (as `link --format link` prints them), the Link's watch
            // event may come before its Secret's: a young Link's missing credentials
            // are looked at again before they are reported.
            Err(LinkError::MissingCredentials(_)) if young(&link.metadata) => {
                return Outcome::RequeueAfter(CREDENTIALS_GRACE);
            }
            Err(e) => {
                self.report(&SourceObject::Link(&link), &e).await;
                return Outcome::Done;
            }
        };
        self.apply_spec(key, &SourceObject::Link(&link), spec).await
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
