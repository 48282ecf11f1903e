//! Reconciling one key: gather (caches, index, gateways) → decide (pure, decide.rs) →
//! apply (the writer and the expectations). The read step is `reconcile/gather.rs`,
//! headless keys `reconcile/headless.rs`, what is said beyond writes
//! `reconcile/reports.rs`.

use super::cache::Cache;
use super::contention::{CORRECTIONS, Contention, FIRST_HOLD, MAX_HOLD, Verdict, WINDOW};
use super::decide::{Decision, Gathered, Steps, Writes, decide};
use super::expect::{Expectations, LocalObject};
use super::hostnames::RemoteHostnames;
use super::index::Index;
use super::keys::{endpoints_key, service_key, slice_key};
use super::limit::{Admission, Members, MirrorLimit, admitted_members};
use super::link_status::{Observed, StatusBook};
use super::metrics::LinkMetrics;
use super::readiness::RemoteReadiness;
use super::remote_state::RemoteHealth;
use super::{Outcome, Synced, WorkQueue};
use crate::error::{Error, Result};
use crate::gateway::{GatewaySource, Gateways, Resolution};
use crate::runtime::once::Say;
use crate::writer::{Applied, CreateLimit, LocalWriter};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;
use parking_lot::Mutex;
use service_mirror_core::{
    Action, EndpointsMode, ExportDecision, ExportPolicy, ExportRule, Link,
    MIRRORING_MAX_ENDPOINTS_PER_SUBSET, Object, ObjectKind, RemoteState, Route, ServiceKey,
    desired_mirror, desired_slices, export_decision, is_mirrored_slice, mirrored_slice_selector,
    mirroring_overflow, remote_discovery_mirror, slice_routes, stale_effect, stale_gateway,
};
use service_mirror_core::{
    DesiredMirror, Shape, choose_pods, endpoint_mirror_name, flipped, headless_mirror, is_headless,
    is_owned, mirror_name, shape,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

mod gather;
mod headless;
mod reports;

/// Everything a reconcile reads and writes, and nothing else.
pub(super) struct Reconciler {
    pub(super) link: Link,
    /// Which remote Services are mirrored.
    pub(super) export: ExportPolicy,
    /// A Link's gateway (with [`ExportRule::Selectors`]; `None`: the Link has none).
    pub(super) link_gateway: Option<GatewaySource>,
    /// Keys another writer keeps changing back.
    pub(super) contention: Contention,
    /// The Link's status entries (Link links only).
    pub(super) status: Option<Arc<StatusBook>>,
    /// Which remote Services have ready endpoints (Link links only).
    pub(super) readiness: Option<Arc<Mutex<RemoteReadiness>>>,
    /// The remote headless slices' hostnames (`--enable-headless-services` only).
    pub(super) hostnames: Option<Arc<Mutex<RemoteHostnames>>>,
    /// Per headless key, the hostnames last reported refused (reported on change only).
    pub(super) refused_hostnames: Mutex<HashMap<ServiceKey, Vec<String>>>,
    pub(super) remote: Cache<Service>,
    pub(super) local_services: Cache<Service>,
    pub(super) local_endpoints: Cache<Endpoints>,
    /// Our EndpointSlices (label-selected with our managed-by: kube-controller-manager's
    /// are not even cached).
    pub(super) local_slices: Cache<EndpointSlice>,
    /// Which endpoint objects mirrors carry.
    pub(super) mode: EndpointsMode,
    /// The local cluster, for one read only: kube-controller-manager's mirrored slices
    /// of a mirror whose slices of ours wait for them (`endpoints` mode, see
    /// [`Reconciler::mirrored_routes`]). Writes go through `writer`.
    pub(super) local: kube::Client,
    /// Keys whose slices wait for kcm's, with how many looks they have waited.
    pub(super) mirroring_waits: Mutex<HashMap<ServiceKey, u32>>,
    pub(super) index: Arc<Mutex<Index>>,
    pub(super) synced: tokio::sync::watch::Receiver<Synced>,
    pub(super) gateways: Arc<Gateways>,
    /// Our writes the local caches have not shown yet.
    pub(super) expectations: Arc<Expectations>,
    /// Mirror names someone else's object holds, read again until free.
    pub(super) blocked: Arc<super::blocked::Blocked>,
    /// Keys whose Endpoints were written ahead of their Service (see decide.rs), with
    /// the resourceVersion of the Endpoints that write replaced.
    pub(super) endpoints_first: Mutex<HashMap<ServiceKey, Vec<String>>>,
    /// Slots for mirrors under the link's limit.
    pub(super) limit: Arc<MirrorLimit>,
    /// To wake keys refused under the limit when a slot frees.
    pub(super) queue: WorkQueue<ServiceKey>,
    pub(super) writer: LocalWriter,
    pub(super) create_limit: CreateLimit,
    /// The link Secret, where link-wide Events (the mirror limit) are recorded.
    pub(super) link_secret: Option<ObjectReference>,
    /// Where the link says its conditions once per episode (Events on `link_secret`).
    pub(super) reporter: crate::runtime::once::Reporter,
    pub(super) metrics: LinkMetrics,
    /// The state of the remote apiserver (stale-remote policy).
    pub(super) health: Arc<RemoteHealth>,
    /// How many mirrors of one headless set are written at once (the link's
    /// `--workers`): serial, 1,000 pods took 2.59x the reference writer.
    pub(super) member_writes: usize,
}

/// What [`Reconciler::write_in_order`] did.
#[derive(Debug, Default)]
struct Written {
    /// A write was stale: the rest of its group was not made.
    stale: bool,
    /// The uid of the first Service created.
    created_uid: Option<String>,
    /// Every Service created: (name, uid).
    created: Vec<(String, String)>,
}

/// The name of an object written.
fn name_of(o: &Object) -> String {
    o.metadata().name.clone().unwrap_or_default()
}

fn is_delete(a: &Action) -> bool {
    matches!(a, Action::Delete(_))
}

/// A headless set's writes by mirror, each mirror's in the plan's order (Service before
/// Endpoints and slices), so the mirrors can be written concurrently; the deletes last,
/// in one group in the plan's order. A plan of one mirror is one group.
fn by_mirror(actions: &[Action]) -> Vec<Vec<&Action>> {
    use service_mirror_core::labels::SERVICE_NAME_LABEL;
    let mut groups: Vec<Vec<&Action>> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    let mut deletes = Vec::new();
    for a in actions {
        let name = match a {
            Action::Create(Object::Service(s)) | Action::Update(Object::Service(s)) => {
                s.metadata.name.as_deref()
            }
            Action::Create(Object::Endpoints(e)) | Action::Update(Object::Endpoints(e)) => {
                e.metadata.name.as_deref()
            }
            Action::Create(Object::EndpointSlice(e)) | Action::Update(Object::EndpointSlice(e)) => {
                e.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .or(e.metadata.name.as_ref())
                    .map(String::as_str)
            }
            _ => {
                deletes.push(a);
                continue;
            }
        };
        let i = *at.entry(name.unwrap_or_default()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(a);
    }
    if !deletes.is_empty() {
        groups.push(deletes);
    }
    groups
}

/// Whether a decision updates objects in the plan's own order (a gateway move's
/// Endpoints-first pass is half of one plan: not a write of the whole desired state).
fn updates(d: &Decision) -> bool {
    matches!(d, Decision::Write(w) if matches!(&w.steps, Steps::InOrder(a) if a.iter().any(|a| matches!(
        a,
        Action::Update(Object::Service(_)) | Action::Update(Object::Endpoints(_)) | Action::Update(Object::EndpointSlice(_))
    ))))
}

/// A fingerprint of a desired mirror (what a plan writes towards), with a headless
/// mirror's endpoint mirrors.
fn fingerprint(
    desired: Option<&service_mirror_core::DesiredMirror>,
    members: Option<&[service_mirror_core::DesiredMirror]>,
) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for d in desired.into_iter().chain(members.into_iter().flatten()) {
        serde_json::to_string(&(&d.service, &d.endpoints))
            .unwrap_or_default()
            .hash(&mut h);
        d.has_endpoints.hash(&mut h);
    }
    h.finish()
}

/// What a Link's status says of a key, from what was gathered (None: nothing known yet).
fn observed(g: &Gathered) -> Option<Observed> {
    if !g.remote_listed {
        return None;
    }
    Some(match &g.export {
        Some(ExportDecision::Refused { reason, .. }) => Observed::Invalid(reason.describe().into()),
        Some(ExportDecision::Mirror(_) | ExportDecision::RemoteDiscovery) => Observed::Mirrored {
            local: g
                .desired
                .as_ref()
                .and_then(|d| d.service.metadata.name.clone())
                .unwrap_or_default(),
        },
        Some(ExportDecision::NotExported) | None => Observed::Gone,
    })
}

impl Reconciler {
    /// Brings the local mirror of `key` to its desired state.
    pub(super) async fn reconcile(&self, key: &ServiceKey) -> Result<Outcome> {
        let mut gathered = self.gather(key).await;
        // A headless key with mirrors took its slots here (only its new endpoint
        // mirrors beyond the limit refused); any other is admitted in `apply`.
        let admitted = self.admit_members(key, &mut gathered).await;
        let decision = decide(key, &self.link.cluster_name, &gathered);
        if let Decision::Write(w) = &decision
            && w.create_permit
        {
            tracing::debug!(
                cluster = %self.link.cluster_name,
                %key,
                services = gathered.services.len(),
                endpoints = gathered.endpoints.len(),
                slices = gathered.slices.len(),
                "the plan creates what the caches do not hold"
            );
        }
        let observed = self.status.as_ref().and_then(|_| observed(&gathered));
        let fingerprint = updates(&decision)
            .then(|| fingerprint(gathered.desired.as_ref(), gathered.members.as_deref()));
        self.report_headless(key, &gathered).await;
        // Slots under the mirror limit: one per mirror Service.
        let slots = 1 + gathered.members.as_ref().map_or(0, Vec::len);
        if let Some(fp) = fingerprint {
            match self.contention.check(key, fp, std::time::Instant::now()) {
                Verdict::Hold(after) => return Ok(Outcome::RequeueAfter(after)),
                Verdict::Write { report: true } => self.report_contention(key, &gathered).await,
                Verdict::Write { report: false } => {}
            }
        }
        if gathered.desired.is_none() {
            self.contention.forget(key);
        }
        let set = gathered.members.is_some();
        let result = self
            .apply(
                key,
                decision,
                fingerprint,
                (!admitted).then_some(slots),
                set,
            )
            .await;
        if let (Some(book), Some(observed)) = (&self.status, observed) {
            book.observe(
                key,
                match &result {
                    Ok(_) if self.limit.is_refused(key) => Observed::Error(format!(
                        "not mirrored: the link holds its limit of {} mirrors (--max-mirrors-per-link)",
                        self.limit.max().unwrap_or_default()
                    )),
                    Ok(_) => observed,
                    Err(Error::MissingNamespace(_)) => Observed::MissingNamespace,
                    Err(e) => Observed::Error(e.to_string()),
                },
            );
        }
        result
    }

    /// Carries out a decision (`set`: of a headless set, whose mirrors are written
    /// concurrently).
    /// `fingerprint`: of the desired state the plan's updates write towards, recorded for
    /// the contention check once every write of the plan is made (a stale write is none).
    async fn apply(
        &self,
        key: &ServiceKey,
        decision: Decision,
        fingerprint: Option<u64>,
        slots: Option<usize>,
        set: bool,
    ) -> Result<Outcome> {
        let cluster = &self.link.cluster_name;
        let writes = match decision {
            Decision::Wait => return Ok(Outcome::Done),
            Decision::Refuse {
                reason,
                release_slot,
            } => {
                // Refuse it visibly and touch nothing: an existing mirror stays as it was.
                // The key's text comes from the remote (a hostile one sends what an
                // apiserver would refuse): bounded and cleaned before it is said.
                let service = crate::links::sanitize_remote_text(&key.to_string());
                tracing::warn!(%cluster, %service, reason = reason.reason(), "exported service cannot be mirrored: {}", reason.describe());
                self.metrics.error(reason.reason());
                if let Some(link) = &self.link_secret {
                    let note = format!(
                        "exported service {service} of cluster {cluster} is not mirrored: {}",
                        reason.describe()
                    );
                    self.writer
                        .record(link, "InvalidService", "Mirror", note)
                        .await;
                }
                if release_slot {
                    self.release_slot(key);
                }
                return Ok(Outcome::Done);
            }
            Decision::Pending { requeue } => {
                tracing::trace!(%cluster, %key, "cache behind our own write");
                return Ok(requeue.map_or(Outcome::Done, Outcome::RequeueAfter));
            }
            Decision::Write(writes) => writes,
        };
        let Writes {
            steps,
            admit,
            release_slot,
            create_permit,
            second_pass,
            requeue,
            slices_of_new_service,
            slices_of_new_members,
            awaiting_mirroring,
        } = writes;
        match awaiting_mirroring {
            true => {
                let mut waits = self.mirroring_waits.lock();
                let n = waits.entry(key.clone()).or_default();
                *n = n.saturating_add(1);
                let cluster = &self.link.cluster_name;
                tracing::debug!(%cluster, %key, waits = *n, "slices kept until kube-controller-manager's mirrored ones route the same");
                // About 3 minutes of looks: kcm is down, slow, or cannot mirror it all
                // (over 1000 addresses). Said once; the slices stay meanwhile.
                if *n == 10 {
                    tracing::warn!(%cluster, %key, "endpoints mode: kube-controller-manager has not mirrored this mirror's Endpoints into slices routing every gateway address and port; our EndpointSlices are kept until it has");
                }
            }
            false => {
                self.mirroring_waits.lock().remove(key);
            }
        }
        // `slots`: None when the key's slots are taken already (`admit_members`).
        if admit
            && let Some(slots) = slots
            && let Admission::Refused { first } = self.limit.admit(key, slots)
        {
            self.refuse_over_limit(key, first, false).await;
            return Ok(Outcome::Done);
        } else if release_slot {
            self.release_slot(key);
        }
        // A plan that creates holds a create permit to its end: a Service create and then
        // its Endpoints, as the apiserver takes them fastest (writer::CREATES_IN_FLIGHT).
        // The semaphore is never closed, so acquiring cannot fail.
        let _permit = match create_permit {
            true => self.create_limit.acquire().await.ok(),
            false => None,
        };
        if second_pass {
            self.endpoints_first.lock().remove(key);
        }
        let done = requeue.map_or(Outcome::Done, Outcome::RequeueAfter);
        // Reported once the writes are made (the mirror's namespace may be new).
        let over_capacity = self.over_capacity(key, &steps);
        let actions = match steps {
            Steps::EndpointsFirst { endpoints, service } => {
                tracing::debug!(%cluster, %key, actions = ?endpoints, "writing Endpoints first");
                self.record_all(over_capacity).await;
                let mut replaced = Vec::new();
                for action in &endpoints {
                    let rv = match action {
                        Action::Update(Object::Endpoints(e)) => e.metadata.resource_version.clone(),
                        Action::Update(Object::EndpointSlice(e)) => {
                            e.metadata.resource_version.clone()
                        }
                        _ => unreachable!("decide puts only Endpoints and slice updates first"),
                    };
                    match self.execute(action).await {
                        Ok(Applied::Done) => replaced.extend(rv),
                        // The event bringing the newer object queues the key again.
                        Ok(Applied::Stale) => return Ok(done),
                        // They cannot be written now: the Service still is, as when the
                        // plan runs in its own order; the key is retried for the rest.
                        Err(err) => {
                            self.execute(&service).await?;
                            return Err(err);
                        }
                    }
                }
                self.endpoints_first.lock().insert(key.clone(), replaced);
                return Ok(Outcome::RequeueAfter(std::time::Duration::ZERO));
            }
            Steps::InOrder(actions) => actions,
        };
        let mut created_uid = None;
        // A headless set's new Services: name -> uid.
        let mut created: HashMap<String, String> = HashMap::new();
        let mut stale = false;
        // A headless set's mirrors are written concurrently, each in the plan's order, and
        // its deletes after them (see `by_mirror`); any other plan in its own order. A
        // pod joins the parent's endpoints only once its endpoint mirror is cached with a
        // ClusterIP, so the parent never waits for this pass's creates.
        let groups = match set {
            true => by_mirror(&actions),
            false => vec![actions.iter().collect()],
        };
        let (writes, deletes) = match (set, groups.last()) {
            (true, Some(last)) if last.iter().all(|a| is_delete(a)) => {
                let mut groups = groups;
                let deletes = groups.pop();
                (groups, deletes)
            }
            _ => (groups, None),
        };
        // Made first, not in the stream: a closure in a stream of a spawned future fails
        // the Send check (rust-lang/rust#102211).
        let writes: Vec<_> = writes
            .into_iter()
            .map(|group| self.write_in_order(key, group))
            .collect();
        let results: Vec<Result<Written>> = futures::stream::iter(writes)
            .buffer_unordered(self.member_writes.max(1))
            .collect()
            .await;
        let mut results = results.into_iter().collect::<Result<Vec<_>>>()?;
        if let Some(deletes) = deletes.filter(|_| !results.iter().any(|r| r.stale)) {
            results.push(self.write_in_order(key, deletes).await?);
        }
        for r in results {
            stale |= r.stale;
            created_uid = created_uid.or(r.created_uid);
            if !slices_of_new_members.is_empty() {
                created.extend(r.created);
            }
        }
        if let (false, Some(fp)) = (stale, fingerprint) {
            self.contention.written(key, fp);
        }
        // A new mirror's slices need its Service's uid, which the plan could not know:
        // it came with the create, so they are written now rather than on a second pass
        // after the watch event (a second pass over every key made a cold sync of 1,000
        // mirrors in `both` mode 1.86x the reference writer's time).
        if let (Some(uid), Some(d)) = (created_uid, &slices_of_new_service) {
            for slice in desired_slices(d, &uid) {
                let action = Action::Create(Object::EndpointSlice(slice));
                tracing::debug!(%cluster, %key, ?action, "writing");
                if self.execute(&action).await? == Applied::Stale {
                    break;
                }
            }
        }
        // The same for each new mirror of a headless set (measured: 1,000 pods in `both`
        // mode wrote their last slice 34 s after the start with a second pass, see
        // docs/operations.md).
        // Concurrently per mirror, as above.
        let mut member_slices = Vec::new();
        for d in &slices_of_new_members {
            if let Some(uid) = d
                .service
                .metadata
                .name
                .as_ref()
                .and_then(|n| created.get(n))
            {
                member_slices.push(self.write_slices(key, d, uid));
            }
        }
        let results: Vec<Result<()>> = futures::stream::iter(member_slices)
            .buffer_unordered(self.member_writes.max(1))
            .collect()
            .await;
        results.into_iter().collect::<Result<Vec<()>>>()?;
        self.record_all(over_capacity).await;
        Ok(done)
    }

    /// Writes `group` in its order, stopping at the first stale write.
    async fn write_in_order(&self, key: &ServiceKey, group: Vec<&Action>) -> Result<Written> {
        let cluster = &self.link.cluster_name;
        let mut out = Written::default();
        for action in group {
            tracing::debug!(%cluster, %key, ?action, "writing");
            let (applied, uid) = self.execute_returning_uid(action).await?;
            if applied == Applied::Stale {
                // Keep the plan's order (Service before Endpoints): the watch event that
                // brings the newer version queues this key again.
                out.stale = true;
                break;
            }
            if let (Action::Create(Object::Service(s)), Some(uid)) = (action, &uid) {
                out.created.push((s.name_any(), uid.clone()));
            }
            out.created_uid = out.created_uid.or(uid);
        }
        Ok(out)
    }

    /// Creates the slices of the new mirror `d` (Service uid `uid`), stopping at a stale
    /// write.
    async fn write_slices(&self, key: &ServiceKey, d: &DesiredMirror, uid: &str) -> Result<()> {
        let cluster = &self.link.cluster_name;
        for slice in desired_slices(d, uid) {
            let action = Action::Create(Object::EndpointSlice(slice));
            tracing::debug!(%cluster, %key, ?action, "writing");
            if self.execute(&action).await? == Applied::Stale {
                break;
            }
        }
        Ok(())
    }

    /// Frees the mirror-limit slot of `key` (which has no mirror and creates none) and
    /// queues the refused keys that may take it.
    fn release_slot(&self, key: &ServiceKey) {
        for woken in self.limit.release(key) {
            self.queue.add(woken);
        }
    }

    /// Executes one action and remembers the write until the caches show it.
    async fn execute(&self, action: &Action) -> Result<Applied> {
        Ok(self.execute_returning_uid(action).await?.0)
    }

    /// As [`Reconciler::execute`], with the uid of a Service created now.
    async fn execute_returning_uid(&self, action: &Action) -> Result<(Applied, Option<String>)> {
        let (applied, stored) = self.writer.write(action).await?;
        // Only a Service created now: its slices name its uid.
        let uid = match (action, stored) {
            (Action::Create(Object::Service(_)), Some(o)) => o.metadata().uid.clone(),
            _ => None,
        };
        if applied != Applied::Done {
            return Ok((applied, None));
        }
        // What the write replaced: the version updated or deleted (a precondition of the
        // write), nothing for a create.
        let kind = match action.kind() {
            ObjectKind::Service => LocalObject::Service,
            ObjectKind::Endpoints => LocalObject::Endpoints,
            ObjectKind::EndpointSlice => LocalObject::EndpointSlice,
            // A link plans no ServiceImport: nothing to expect.
            ObjectKind::ServiceImport => return Ok((applied, uid)),
        };
        let (ns, name, replaced) = match action {
            Action::Create(o) => (o.metadata().namespace.clone(), name_of(o), None),
            Action::Update(o) => (
                o.metadata().namespace.clone(),
                name_of(o),
                o.metadata().resource_version.clone(),
            ),
            Action::Delete(r) => (
                Some(r.namespace.clone()),
                r.name.clone(),
                // No version precondition: whatever the cache shows next counts.
                Some(r.resource_version.clone().unwrap_or_default()),
            ),
        };
        let ns = ns.unwrap_or_default();
        self.expectations.written(kind, &ns, &name, replaced);
        // Recorded first, then checked against the cache: the event may have come already
        // (and then went by without finding it), or comes after, and finds it.
        let cached = match kind {
            LocalObject::Service => self
                .local_services
                .get(&ObjectRef::new(&name).within(&ns))
                .and_then(|o| o.metadata.resource_version.clone()),
            LocalObject::Endpoints => self
                .local_endpoints
                .get(&ObjectRef::new(&name).within(&ns))
                .and_then(|o| o.metadata.resource_version.clone()),
            LocalObject::EndpointSlice => self
                .local_slices
                .get(&ObjectRef::new(&name).within(&ns))
                .and_then(|o| o.metadata.resource_version.clone()),
        };
        self.expectations
            .observed(kind, &ns, &name, cached.as_deref());
        Ok((applied, uid))
    }
}
