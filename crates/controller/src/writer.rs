//! The only code that writes to the local cluster: creates, compare-then-updates and
//! deletes mirror objects under a field manager, with ownership checks at the API;
//! its children write status subresources: `link_status` of our Links, `mcs_status` of
//! the MCS component's ServiceImports and of the local ServiceExports.

pub(crate) mod link_status;
pub(crate) mod mcs_status;

use crate::error::{Error, Result};
use crate::events::EventRecorder;
use crate::mcs::resource::ServiceImport;
use crate::metrics::{ClusterLabels, Metrics};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Client, Resource, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde::de::DeserializeOwned;
use service_mirror_core::{
    Action, Object, ObjectKind, ObjectRef, desired_namespace, is_our_slice, is_owned,
};
use std::fmt::Debug;
use std::sync::Arc;

/// The result of one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Written (or already as wanted).
    Done,
    /// The cache was behind the API; nothing written.
    Stale,
}

/// Labels of local API writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WriteLabels {
    /// create, update, delete or patch (a status subresource).
    pub(crate) verb: String,
    /// services, endpoints, endpointslices, serviceimports, namespaces, or a status
    /// subresource (links/status, serviceimports/status, serviceexports/status).
    pub(crate) resource: String,
}

/// The writer's metric families.
#[derive(Debug, Default)]
pub(crate) struct WriterFamilies {
    /// Write requests to the local API.
    pub(crate) local_writes: Family<WriteLabels, Counter>,
    /// Local objects holding a mirror's name without being ours.
    pub(crate) ownership_conflicts: Family<ClusterLabels, Counter>,
}

impl WriterFamilies {
    /// Registers the families (under the registry's prefix).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "local_writes",
            "Write requests to the local API by verb and resource",
            self.local_writes.clone(),
        );
        r.register(
            "ownership_conflicts",
            "Local objects holding a mirror's name without our labels",
            self.ownership_conflicts.clone(),
        );
    }

    /// Counts one local write request.
    pub(crate) fn write(&self, verb: &str, resource: &str) {
        self.local_writes
            .get_or_create(&WriteLabels {
                verb: verb.into(),
                resource: resource.into(),
            })
            .inc();
    }
}

/// Picks, among the mirrors of a cluster, those a cleanup may delete.
pub type MirrorSelector = std::sync::Arc<dyn Fn(&kube::api::ObjectMeta) -> bool + Send + Sync>;

/// Field manager recorded on every object this controller writes.
pub const FIELD_MANAGER: &str = "service-mirror";

/// Reconciles that create mirrors at once, across every link of a process. A Service
/// create costs kube-apiserver time that grows with the Services it holds (its
/// ClusterIP allocator), and more of them in flight cost it more per create: it takes
/// creates fastest at a low concurrency. Updates use every worker (see BENCHMARKS.md).
pub const CREATES_IN_FLIGHT: usize = 8;

/// Bounds the reconciles that create; shared by the link controllers of every link.
pub type CreateLimit = Arc<tokio::sync::Semaphore>;

/// A new [`CreateLimit`] of [`CREATES_IN_FLIGHT`] permits.
pub fn default_create_limit() -> CreateLimit {
    Arc::new(tokio::sync::Semaphore::new(CREATES_IN_FLIGHT))
}

/// Writes to the local cluster on behalf of one link.
#[derive(Clone)]
pub struct LocalWriter {
    client: Client,
    cluster: String,
    recorder: EventRecorder,
    metrics: Arc<Metrics>,
    /// Whether a create that meets a missing namespace creates it.
    create_namespaces: bool,
    /// Which objects are ours.
    owner: Owner,
    /// Leader election: mirrors are written only while leading, read at each write.
    leader: Option<crate::leader::Leadership>,
}

/// Which objects a writer may change or delete.
#[derive(Clone, Debug)]
enum Owner {
    /// One link's mirrors: by that cluster's labels (`is_owned`).
    Link,
    /// The federation's: by the federated mark of this controller namespace
    /// (`is_owned_federated`).
    Federated(String),
    /// The MCS component's ServiceImports, derived Services and import slices: by the
    /// marks of this controller namespace (see [`mcs_owned`]).
    McsImport(String),
}

impl std::fmt::Debug for LocalWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalWriter")
            .field("cluster", &self.cluster)
            .finish()
    }
}

/// The kinds of objects written (Service, Endpoints, EndpointSlice, ServiceImport):
/// namespaced, with a static type, read and written as JSON, and a rule for which
/// objects of a link are ours.
trait MirrorKind:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Into<Object>
{
    /// Its kind in the vocabulary of [`Action`].
    const OBJECT_KIND: ObjectKind;
    /// Whether an object of this kind is ours for `cluster` (may be changed or deleted).
    fn ours(meta: &kube::api::ObjectMeta, cluster: &str) -> bool {
        is_owned(meta, cluster)
    }
    /// The label selector of our objects of this kind for `cluster`.
    fn selector(cluster: &str) -> String {
        service_mirror_core::owner_selector(cluster)
    }
}

impl MirrorKind for Service {
    const OBJECT_KIND: ObjectKind = ObjectKind::Service;
}
impl MirrorKind for Endpoints {
    const OBJECT_KIND: ObjectKind = ObjectKind::Endpoints;
}
// Written only by the MCS component (`Owner::McsImport`): a link never plans one.
impl MirrorKind for ServiceImport {
    const OBJECT_KIND: ObjectKind = ObjectKind::ServiceImport;
}
impl MirrorKind for EndpointSlice {
    const OBJECT_KIND: ObjectKind = ObjectKind::EndpointSlice;
    // kube-controller-manager's mirrored slices copy our labels: our managed-by tells.
    fn ours(meta: &kube::api::ObjectMeta, cluster: &str) -> bool {
        is_our_slice(meta, cluster)
    }
    fn selector(cluster: &str) -> String {
        service_mirror_core::labels::slice_owner_selector(cluster)
    }
}

/// Whether `meta`, stored where the MCS component writes `wanted` (of `kind`), is the
/// component's of `controller_namespace`: a ServiceImport by its import mark
/// (`is_owned_import`), a derived Service by its derived mark and the name of the
/// import it serves, which the one written names in its service-name label
/// (`is_owned_derived`), a slice by its import mark (`is_owned_import_slice`). It
/// writes no Endpoints.
fn mcs_owned(
    kind: ObjectKind,
    meta: &kube::api::ObjectMeta,
    wanted: &kube::api::ObjectMeta,
    controller_namespace: &str,
) -> bool {
    use service_mirror_core::{mcs, mcs_derived, mcs_import, mcs_slices};
    match kind {
        ObjectKind::ServiceImport => mcs_import::is_owned_import(meta, controller_namespace),
        ObjectKind::Service => wanted
            .labels
            .as_ref()
            .and_then(|l| l.get(mcs::SERVICE_NAME_LABEL))
            .is_some_and(|import| {
                mcs_derived::is_owned_derived(meta, import, controller_namespace)
            }),
        ObjectKind::EndpointSlice => mcs_slices::is_owned_import_slice(meta, controller_namespace),
        ObjectKind::Endpoints => false,
    }
}

/// The stored object of a create or replace, as an [`Object`].
fn stored<K: MirrorKind>(
    written: Result<(Applied, Option<K>)>,
) -> Result<(Applied, Option<Object>)> {
    written.map(|(applied, obj)| (applied, obj.map(Into::into)))
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

impl LocalWriter {
    /// A writer for the mirrors of `cluster`, recording its Events through `recorder`
    /// (the process's one recorder).
    pub fn with_recorder(
        client: Client,
        cluster: &str,
        metrics: Arc<Metrics>,
        recorder: EventRecorder,
    ) -> Self {
        Self {
            recorder,
            client,
            cluster: cluster.to_string(),
            metrics,
            create_namespaces: true,
            owner: Owner::Link,
            leader: None,
        }
    }

    /// The writer of federated Services and their slices (one for the process): an
    /// object is ours if it carries the federated mark of `controller_namespace`; a
    /// missing namespace is not created.
    pub fn federated(
        client: Client,
        controller_namespace: &str,
        metrics: Arc<Metrics>,
        recorder: EventRecorder,
    ) -> Self {
        let owner = Owner::Federated(controller_namespace.to_owned());
        Self::process_wide(client, "federated", owner, metrics, recorder)
    }

    /// The writer of the MCS component's import EndpointSlices (one for the process):
    /// a slice is ours if it carries the import mark of `controller_namespace`; a
    /// missing namespace is not created (the KEP's rule).
    pub fn mcs_imports(
        client: Client,
        controller_namespace: &str,
        metrics: Arc<Metrics>,
        recorder: EventRecorder,
    ) -> Self {
        let owner = Owner::McsImport(controller_namespace.to_owned());
        Self::process_wide(client, "mcs", owner, metrics, recorder)
    }

    /// A process-wide component's writer, `name` standing for the cluster in logs: it
    /// never creates a namespace.
    fn process_wide(
        client: Client,
        name: &str,
        owner: Owner,
        metrics: Arc<Metrics>,
        recorder: EventRecorder,
    ) -> Self {
        Self {
            recorder,
            client,
            cluster: name.into(),
            metrics,
            create_namespaces: false,
            owner,
            leader: None,
        }
    }

    /// Whether `meta`, stored where `wanted` is to be written, is ours (may be changed
    /// or deleted) for this writer.
    fn ours<K: MirrorKind>(&self, meta: &kube::api::ObjectMeta, wanted: &K) -> bool {
        match &self.owner {
            Owner::Link => K::ours(meta, &self.cluster),
            Owner::Federated(ns) => service_mirror_core::is_owned_federated(meta, ns),
            Owner::McsImport(ns) => mcs_owned(K::OBJECT_KIND, meta, wanted.meta(), ns),
        }
    }

    /// The same writer; `create` says whether a missing namespace is created (else the
    /// create fails with [`Error::MissingNamespace`]).
    pub fn creating_namespaces(mut self, create: bool) -> Self {
        self.create_namespaces = create;
        self
    }

    /// The same writer, writing only while `leader` says so (`None`: always): each
    /// write checks the clock-bounded leadership the moment before it is sent, and is
    /// skipped as [`Applied::Stale`] otherwise (the next leader reconciles every key).
    pub fn led_by(mut self, leader: Option<crate::leader::Leadership>) -> Self {
        self.leader = leader;
        self
    }

    /// Whether this writer may write now (its leadership, and its link's gate).
    pub(crate) fn leading(&self) -> bool {
        self.leader.as_ref().is_none_or(|l| l.leading())
    }

    fn post_params() -> PostParams {
        PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        }
    }

    /// Carries out one planned action. `Stale` means the API holds a newer version than
    /// the cache the plan was made from: the rest of the plan is skipped, and the watch
    /// event bringing that version queues the key again.
    pub async fn execute(&self, action: &Action) -> Result<Applied> {
        Ok(self.write(action).await?.0)
    }

    /// As [`LocalWriter::execute`], with the object as the apiserver stored it when it
    /// was created or replaced now (its uid, resourceVersion and allocated fields: a new
    /// mirror's slices name its Service's uid, an import's status is written at the
    /// version its replace gave, a derived Service's ClusterIPs are the import's ips).
    pub async fn write(&self, action: &Action) -> Result<(Applied, Option<Object>)> {
        if !self.leading() {
            return Ok((Applied::Stale, None));
        }
        match action {
            Action::Create(Object::Service(o)) => stored(self.create(o).await),
            Action::Create(Object::Endpoints(o)) => stored(self.create(o).await),
            Action::Create(Object::EndpointSlice(o)) => stored(self.create(o).await),
            Action::Create(Object::ServiceImport(o)) => stored(self.create(o).await),
            Action::Update(Object::Service(o)) => stored(self.update(o).await),
            Action::Update(Object::Endpoints(o)) => stored(self.update(o).await),
            Action::Update(Object::EndpointSlice(o)) => stored(self.update(o).await),
            Action::Update(Object::ServiceImport(o)) => stored(self.update(o).await),
            Action::Delete(r) => {
                let applied = match r.kind {
                    ObjectKind::Service => self.delete::<Service>(r).await,
                    ObjectKind::Endpoints => self.delete::<Endpoints>(r).await,
                    ObjectKind::EndpointSlice => self.delete::<EndpointSlice>(r).await,
                    ObjectKind::ServiceImport => self.delete::<ServiceImport>(r).await,
                };
                Ok((applied?, None))
            }
        }
    }

    async fn create<K: MirrorKind>(&self, obj: &K) -> Result<(Applied, Option<K>)> {
        let ns = obj.namespace().unwrap_or_default();
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        let mut created_namespace = false;
        // A holder deleted between our create's 409 and the read that follows it: the
        // name is free, and no watch event will say so (ours select our labels), so the
        // create is tried again at once (twice at most).
        let mut holder_gone = 0;
        loop {
            self.metrics.writer.write("create", K::plural(&()).as_ref());
            match api.create(&Self::post_params(), obj).await {
                Ok(created) => return Ok((Applied::Done, Some(created))),
                Err(e) if api_code(&e) == Some(404) && !self.create_namespaces => {
                    return Err(Error::MissingNamespace(ns));
                }
                // The namespace is missing: create it (labelled as ours) and try again once.
                Err(e) if api_code(&e) == Some(404) && !created_namespace => {
                    self.ensure_namespace(&ns).await?;
                    created_namespace = true;
                }
                Err(e) if api_code(&e) == Some(409) => match self.on_exists(&api, obj).await? {
                    Some(applied) => return Ok((applied, None)),
                    None if holder_gone < 2 => holder_gone += 1,
                    // Taken and freed again and again: the key is retried with backoff.
                    None => return Err(e.into()),
                },
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Create found the name taken: ours but not yet in the cache, or someone else's;
    /// `None` if it is gone by the time it is read (the name is free: create again).
    async fn on_exists<K: MirrorKind>(&self, api: &Api<K>, obj: &K) -> Result<Option<Applied>> {
        let name = obj.name_any();
        let ns = obj.namespace().unwrap_or_default();
        let existing = api.get_opt(&name).await?;
        match existing {
            Some(o) if !self.ours(o.meta(), obj) => {
                let err = Error::OwnershipConflict {
                    kind: K::kind(&()).into_owned(),
                    namespace: ns,
                    name,
                    uid: o.meta().uid.clone(),
                    cluster: self.cluster.clone(),
                };
                // The federation and the MCS component report their conflicts
                // themselves (once per conflict, their own metrics): no per-cluster
                // series or Event for their pseudo-clusters.
                if matches!(self.owner, Owner::Link) {
                    self.metrics
                        .writer
                        .ownership_conflicts
                        .get_or_create(&ClusterLabels::of(&self.cluster))
                        .inc();
                    self.report_conflict(&o, &err).await;
                }
                Err(err)
            }
            // Ours (the cache has not seen it yet): the watch event that brings it to
            // the cache queues this key again, so nothing is lost.
            Some(_) => {
                tracing::debug!(cluster = %self.cluster, kind = %K::kind(&()), %ns, %name, "create found our own object: cache behind");
                Ok(Some(Applied::Stale))
            }
            // Someone else's, deleted since our create: no event of ours will tell.
            None => {
                tracing::debug!(cluster = %self.cluster, kind = %K::kind(&()), %ns, %name, "the name's holder is gone: creating again");
                Ok(None)
            }
        }
    }

    async fn report_conflict<K: Resource<DynamicType = ()>>(&self, obj: &K, err: &Error) {
        tracing::warn!(cluster = %self.cluster, error = %err, "ownership conflict");
        let reference = obj.object_ref(&());
        let note = format!(
            "{err}. The mirror of cluster {} needs this name; rename or delete this object to let it be created.",
            self.cluster
        );
        self.record(&reference, "MirrorConflict", "Mirror", note)
            .await;
    }

    /// Records a Warning Event about `regarding`; a failure to record is only logged.
    pub async fn record(
        &self,
        regarding: &ObjectReference,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.recorder
            .publish(regarding, EventType::Warning, reason, action, note)
            .await;
    }

    /// As [`LocalWriter::record`], as a Normal Event (a recovery).
    pub async fn record_normal(
        &self,
        regarding: &ObjectReference,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.recorder
            .publish(regarding, EventType::Normal, reason, action, note)
            .await;
    }

    async fn update<K: MirrorKind>(&self, obj: &K) -> Result<(Applied, Option<K>)> {
        // `obj` carries the resourceVersion read from the cache: the update fails with
        // 409 if anyone changed (or relabelled) the object since. That newer version is
        // on its way to the cache, and its watch event queues this key again.
        let api: Api<K> =
            Api::namespaced(self.client.clone(), &obj.namespace().unwrap_or_default());
        self.metrics.writer.write("update", K::plural(&()).as_ref());
        match api
            .replace(&obj.name_any(), &Self::post_params(), obj)
            .await
        {
            Ok(replaced) => Ok((Applied::Done, Some(replaced))),
            Err(e) if api_code(&e) == Some(409) => {
                tracing::debug!(cluster = %self.cluster, kind = %K::kind(&()), name = %obj.name_any(), "update raced a newer version: cache behind");
                Ok((Applied::Stale, None))
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn delete<K: MirrorKind>(&self, target: &ObjectRef) -> Result<Applied> {
        let api: Api<K> = Api::namespaced(self.client.clone(), &target.namespace);
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: target.uid.clone(),
                resource_version: target.resource_version.clone(),
            }),
            ..Default::default()
        };
        self.metrics.writer.write("delete", K::plural(&()).as_ref());
        match api.delete(&target.name, &dp).await {
            Ok(_) => Ok(Applied::Done),
            Err(e) if api_code(&e) == Some(404) => Ok(Applied::Done),
            // The object changed since we read it (maybe it is no longer ours): its watch
            // event queues the key again and the plan is made afresh.
            Err(e) if api_code(&e) == Some(409) => Ok(Applied::Stale),
            Err(e) => Err(e.into()),
        }
    }

    async fn ensure_namespace(&self, ns: &str) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        self.metrics.writer.write("create", "namespaces");
        match api
            .create(&Self::post_params(), &desired_namespace(ns, &self.cluster))
            .await
        {
            Ok(_) => {
                tracing::info!(namespace = ns, cluster = %self.cluster, "created namespace for mirrors");
                Ok(())
            }
            Err(e) if api_code(&e) == Some(409) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes every Service, Endpoints and EndpointSlice of ours for this cluster, listing
    /// them from the API (not a cache) so nothing is missed, until none is left (an
    /// object changed between list and delete is listed again). Used when a link goes.
    pub async fn delete_all_mirrors(&self) -> Result<usize> {
        self.delete_mirrors_in(None).await
    }

    /// Like [`LocalWriter::delete_all_mirrors`], limited to the objects `only` selects.
    pub async fn delete_mirrors_in(&self, only: Option<&MirrorSelector>) -> Result<usize> {
        let mut deleted = 0;
        for _ in 0..5 {
            // Slices first: they point at their Service (and go with it anyway).
            let n = self.delete_all_slices(only).await?
                + self.delete_all::<Service>(only).await?
                + self.delete_all::<Endpoints>(only).await?;
            if n == 0 {
                break;
            }
            deleted += n;
        }
        Ok(deleted)
    }

    /// Our slices, as [`LocalWriter::delete_all`]; refused (403: a ClusterRole from before
    /// slices) deletes none and goes on: the Services and Endpoints must still go, and
    /// our slices, if any, follow their Service through the ownerReference.
    async fn delete_all_slices(&self, only: Option<&MirrorSelector>) -> Result<usize> {
        match self.delete_all::<EndpointSlice>(only).await {
            Err(Error::Kube(e)) if api_code(&e) == Some(403) => {
                tracing::warn!(cluster = %self.cluster, error = %e, "not allowed to delete EndpointSlices; leaving ours to the garbage collector (re-run `service-mirror install` for the current permissions)");
                Ok(0)
            }
            r => r,
        }
    }

    async fn delete_all<K: MirrorKind>(&self, only: Option<&MirrorSelector>) -> Result<usize> {
        let lp = kube::api::ListParams::default().labels(&K::selector(&self.cluster));
        let listed = Api::<K>::all(self.client.clone())
            .list_metadata(&lp)
            .await?;
        let mine: Vec<_> = listed
            .items
            .iter()
            .map(|o| &o.metadata)
            .filter(|m| K::ours(m, &self.cluster) && only.is_none_or(|f| f(m)))
            .collect();
        for m in &mine {
            // Every replica stops a link that goes; only the leader deletes its mirrors
            // (a follower's cleanup waits to lead: links/cleanup.rs).
            if !self.leading() {
                return Err(Error::NotLeader);
            }
            self.delete::<K>(&ObjectRef::of(K::OBJECT_KIND, m)).await?;
        }
        Ok(mine.len())
    }
}
