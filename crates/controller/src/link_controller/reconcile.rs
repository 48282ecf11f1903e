//! Reconciling one key: gather (caches, index, gateways) → decide (pure, decide.rs) →
//! apply (the writer and the expectations).

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
    MIRRORING_MAX_ENDPOINTS_PER_SUBSET, RemoteState, Route, ServiceKey, desired_mirror,
    desired_slices, export_decision, is_mirrored_slice, mirrored_slice_selector,
    mirroring_overflow, remote_discovery_mirror, slice_routes, stale_effect, stale_gateway,
};
use service_mirror_core::{
    DesiredMirror, Shape, choose_pods, endpoint_mirror_name, flipped, headless_mirror, is_headless,
    is_owned, mirror_name, shape,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

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

fn is_delete(a: &Action) -> bool {
    matches!(
        a,
        Action::DeleteService { .. }
            | Action::DeleteEndpoints { .. }
            | Action::DeleteEndpointSlice { .. }
    )
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
            Action::CreateService(s) | Action::UpdateService(s) => s.metadata.name.as_deref(),
            Action::CreateEndpoints(e) | Action::UpdateEndpoints(e) => e.metadata.name.as_deref(),
            Action::CreateEndpointSlice(e) | Action::UpdateEndpointSlice(e) => e
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .or(e.metadata.name.as_ref())
                .map(String::as_str),
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
        Action::UpdateService(_) | Action::UpdateEndpoints(_) | Action::UpdateEndpointSlice(_)
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

    /// The mirror limit for a headless key that has mirrors: its existing objects keep
    /// being written however many pods it grows to; new endpoint mirrors beyond the
    /// limit are left out of `g` (name order, the same each pass) and refused as over
    /// the limit. True when the key's slots were taken here.
    async fn admit_members(&self, key: &ServiceKey, g: &mut Gathered) -> bool {
        let Some(members) = g.members.as_mut().filter(|_| !g.pending) else {
            return false;
        };
        match self.limit.admit_members(key, 1 + members.len()) {
            None => false,
            Some(Members::All) => true,
            Some(Members::Part { allowed, first }) => {
                let existing: BTreeSet<&str> = g
                    .services
                    .iter()
                    .filter_map(|s| s.metadata.name.as_deref())
                    .collect();
                let wanted = members.len();
                *members =
                    admitted_members(std::mem::take(members), |n| existing.contains(n), allowed);
                let cluster = &self.link.cluster_name;
                tracing::debug!(%cluster, %key, wanted, admitted = members.len(), "mirror limit reached: new endpoint mirrors refused");
                self.refuse_over_limit(key, first, true).await;
                true
            }
        }
    }

    /// Reads what the decision needs: the remote Service and its export decision, the
    /// gateway (asked once), the local objects that stand for the key, pending writes.
    async fn gather(&self, key: &ServiceKey) -> Gathered {
        let remote = self
            .remote
            .get(&ObjectRef::new(&key.name).within(&key.namespace));
        // A Link's gateway mirrors depend on the remote's readiness too.
        let readiness_listed = self.readiness.as_ref().is_none_or(|r| r.lock().listed());
        let mut g = Gathered {
            remote_listed: (remote.is_some() || self.synced.borrow().remote) && readiness_listed,
            mode: self.mode,
            ..Gathered::default()
        };
        // A list after an outage that would delete every mirror is not trusted yet
        // (remote_state.rs): a key whose remote Service it lacks waits.
        if !g.remote_listed || (remote.is_none() && self.health.holding_deletes()) {
            g.remote_listed = false;
            return g;
        }
        let export = remote
            .as_deref()
            .map_or(ExportDecision::NotExported, |svc| {
                export_decision(svc, &self.export)
            });
        if let ExportDecision::Refused { .. } = export {
            g.has_local_services = !self.index.lock().local_names(key).0.is_empty();
            g.export = Some(export);
            return g;
        }
        match (remote.as_deref(), &export) {
            (Some(svc), ExportDecision::Mirror(gw)) => {
                let source = match &self.export.rule {
                    ExportRule::GatewayAnnotations => self
                        .remote
                        .get(&ObjectRef::new(&gw.name).within(&gw.namespace))
                        .map(|gateway| GatewaySource::from_service(&gateway)),
                    ExportRule::Selectors { .. } => self.link_gateway.clone().map(Ok),
                };
                let resolution = match source {
                    // A Link without a gateway: nothing to resolve or probe.
                    None if self.link_gateway.is_none() && self.readiness.is_some() => {
                        Resolution::default()
                    }
                    source => self.gateways.resolve(key, gw, source).await,
                };
                g.requeue = resolution.retry_after;
                if let Some(link) = &self.link_secret {
                    for (reason, note) in resolution.notes() {
                        self.writer
                            .record(link, reason, "Mirror", note.to_owned())
                            .await;
                    }
                }
                let mut gateway = resolution.gateway;
                // A remote Service without a ready endpoint: Endpoints without subsets,
                // as Linkerd makes them (failover tools read that as "remote empty").
                if let Some(r) = &self.readiness
                    && !r.lock().ready(key)
                    && let Some(gw) = gateway.as_mut()
                {
                    gw.addresses.clear();
                }
                // A remote that has not answered for long: not ready (unless the gateway
                // probe says alive), then empty.
                let state = self.health.state();
                if state >= RemoteState::Stale {
                    let probe = self.gateways.probe_state(gw).map(|s| s.alive);
                    gateway = stale_gateway(gateway, stale_effect(state, probe));
                }
                match self.headless_shape(key, svc) {
                    None => {
                        // The remote slices are not listed yet: a pod missing from a
                        // partial view would lose its endpoint mirror.
                        g.remote_listed = false;
                        return g;
                    }
                    Some(true) => {
                        let (parent, members, refused) =
                            self.headless_desired(key, svc, gw, gateway.as_ref());
                        g.desired = Some(parent);
                        g.members = Some(members);
                        g.refused_hostnames = refused;
                    }
                    Some(false) => {
                        self.report_slices_unavailable(key, svc).await;
                        g.desired = Some(desired_mirror(svc, &self.link, gw, gateway.as_ref()));
                    }
                }
            }
            (Some(svc), ExportDecision::RemoteDiscovery) => {
                g.desired = Some(remote_discovery_mirror(svc, &self.link));
            }
            _ => {}
        }
        g.export = Some(export);

        let (mut svc_names, mut ep_names, mut slice_names): (
            BTreeSet<String>,
            BTreeSet<String>,
            BTreeSet<String>,
        ) = {
            let index = self.index.lock();
            let (s, e) = index.local_names(key);
            let l = index.slice_names(key);
            (
                s.into_iter().collect(),
                e.into_iter().collect(),
                l.into_iter().collect(),
            )
        };
        let desired_name = g
            .desired
            .as_ref()
            .and_then(|d| d.service.metadata.name.clone());
        if let Some(name) = &desired_name {
            svc_names.insert(name.clone());
            ep_names.insert(name.clone());
        }
        for m in g.members.iter().flatten() {
            if let Some(name) = &m.service.metadata.name {
                svc_names.insert(name.clone());
                ep_names.insert(name.clone());
            }
        }
        // Only objects that stand for this key: the index is a hint built from events, the
        // caches are the truth. A Go-made Endpoints without annotation belongs to the key of
        // its Service, so it is updated in place rather than deleted by another key.
        let belongs = |name: &String, k: ServiceKey| {
            &k == key || (Some(name) == desired_name.as_ref() && k.name == *name)
        };
        // The desired slices' names too: a create of ours the cache has not shown yet is
        // pending under its name (the owner uid does not matter for names). In
        // `endpoints` mode our slices are written only while some are left.
        let writes_slices = self.mode.writes_slices() || !slice_names.is_empty();
        let desired_all = g.desired.iter().chain(g.members.iter().flatten());
        for d in desired_all.filter(|_| writes_slices) {
            slice_names.extend(
                desired_slices(d, "")
                    .into_iter()
                    .filter_map(|s| s.metadata.name),
            );
        }
        // A write of ours to one of these objects has not reached the caches yet: planning
        // now would repeat it. The watch event that brings it queues the key again. Asked
        // BEFORE the caches are read: a watch applies an event to its cache, then marks
        // the expectation met, so "not pending" now means the caches read next hold our
        // write. Asked after, a write seen between the two reads looked met and absent,
        // and was sent again (a create answered 409 after convergence, chaos run 12).
        let pending = |kind, names: &BTreeSet<String>| {
            names
                .iter()
                .any(|n| self.expectations.pending(kind, &key.namespace, n))
        };
        g.pending = pending(LocalObject::Service, &svc_names)
            || pending(LocalObject::Endpoints, &ep_names)
            || pending(LocalObject::EndpointSlice, &slice_names);
        g.services = svc_names
            .iter()
            .filter_map(|n| {
                self.local_services
                    .get(&ObjectRef::new(n).within(&key.namespace))
            })
            .filter(|s| belongs(&s.name_any(), service_key(s)))
            .collect();
        g.endpoints = ep_names
            .iter()
            .filter_map(|n| {
                self.local_endpoints
                    .get(&ObjectRef::new(n).within(&key.namespace))
            })
            .filter(|e| belongs(&e.name_any(), endpoints_key(&self.local_services, e)))
            .collect();
        g.slices = slice_names
            .iter()
            .filter_map(|n| {
                self.local_slices
                    .get(&ObjectRef::new(n).within(&key.namespace))
            })
            .filter(|s| slice_key(&self.local_services, s) == *key)
            .collect();
        g.endpoints_written_first = self.endpoints_first.lock().get(key).cloned();
        // `endpoints` mode with slices of ours left (a switch from a mode that writes
        // them, so transitional): they go only once kube-controller-manager's mirrored
        // slices route the same, as kube-proxy reads only slices and kcm makes them
        // asynchronously. Our slice watch does not see kcm's, so they are read here.
        if self.mode == EndpointsMode::Endpoints
            && !g.pending
            && !g.slices.is_empty()
            && let Some(name) = &desired_name
        {
            g.mirrored = self.mirrored_routes(&key.namespace, name).await;
            g.mirroring_waits = self
                .mirroring_waits
                .lock()
                .get(key)
                .copied()
                .unwrap_or_default();
        }
        g
    }

    /// Whether the exported remote `svc` gets a headless mirror: `Some(false)` with
    /// `--enable-headless-services` off or a Service with a ClusterIP; `None` while the
    /// remote slices are not listed. With no address at all the mirror keeps its shape
    /// (a StatefulSet scaled to 0 keeps its headless mirror, empty), and a new one is
    /// headless.
    fn headless_shape(&self, key: &ServiceKey, svc: &Service) -> Option<bool> {
        let Some(hostnames) = self.hostnames.as_ref().filter(|_| is_headless(svc)) else {
            return Some(false);
        };
        let hostnames = hostnames.lock();
        // The mirror there is, if ours.
        let mirror = || {
            self.local_services
                .get(
                    &ObjectRef::new(&mirror_name(&key.name, &self.link.cluster_name))
                        .within(&key.namespace),
                )
                .filter(|m| is_owned(&m.metadata, &self.link.cluster_name))
        };
        if !hostnames.listed() {
            // The remote refuses the slice watch (403: `allow` without endpointslices;
            // 404: no discovery.k8s.io/v1): no hostnames will come. A headless mirror is
            // kept as it is (neither its endpoint mirrors deleted nor flipped); any other
            // gets the ClusterIP mirror through the gateway, as with the flag off.
            if hostnames.unavailable() {
                return match mirror().is_some_and(|m| is_headless(&m)) {
                    true => None,
                    false => Some(false),
                };
            }
            return None;
        }
        Some(match shape(&hostnames.slices(key)) {
            Shape::Headless => true,
            Shape::ClusterIp => false,
            // No mirror yet: headless (a StatefulSet starting has no address yet, and
            // would otherwise flip once its pods come).
            Shape::Keep => mirror().is_none_or(|m| is_headless(&m)),
        })
    }

    /// A headless remote `svc` planned as a ClusterIP mirror because the remote refuses
    /// the slice watch: said once per link (log, metric, Event on the link Secret).
    async fn report_slices_unavailable(&self, key: &ServiceKey, svc: &Service) {
        let first = is_headless(svc)
            && self
                .hostnames
                .as_ref()
                .is_some_and(|h| h.lock().take_unavailable_report());
        if !first {
            return;
        }
        let cluster = &self.link.cluster_name;
        let note = format!(
            "the credentials of cluster {cluster} may not list and watch endpointslices (or the remote does not serve discovery.k8s.io/v1): headless services such as {key} get ClusterIP mirrors through the gateway, without per-pod DNS; existing headless mirrors are kept as they are. Grant it with `service-mirror allow`"
        );
        // Counted as an error of the link's mirroring, not as a refusal of its object.
        let metrics = self.metrics.clone();
        let reporter = self.reporter.counting(Arc::new(move |_| {
            metrics.error("headless_slices_unavailable")
        }));
        reporter.say(Say {
            reason: "HeadlessSlicesUnavailable",
            action: "Mirror",
            note,
            key: Some(key.to_string()),
        });
    }

    /// The headless mirror of `svc`, its endpoint mirrors, and the refused hostnames.
    /// The parent lists the pods whose endpoint mirror is cached with a ClusterIP.
    fn headless_desired(
        &self,
        key: &ServiceKey,
        svc: &Service,
        gw: &service_mirror_core::GatewayRef,
        resolved: Option<&service_mirror_core::ResolvedGateway>,
    ) -> (DesiredMirror, Vec<DesiredMirror>, Vec<String>) {
        let slices = self
            .hostnames
            .as_ref()
            .map(|h| h.lock().slices(key))
            .unwrap_or_default();
        let publish_not_ready = svc
            .spec
            .as_ref()
            .and_then(|s| s.publish_not_ready_addresses)
            .unwrap_or(false);
        let mut pods = choose_pods(&slices, publish_not_ready);
        let cluster = &self.link.cluster_name;
        // A pod whose endpoint mirror name is the parent's, or would be the mirror of
        // another remote Service (hostname `api` beside a remote Service `api` of the
        // namespace, exported or not, so the choice does not depend on which key runs
        // first), or is another key's mirror, is refused too: two keys would otherwise
        // fight over one object.
        // One cache read per pod (a cached object is decoded on read).
        let parent_name = mirror_name(&key.name, cluster);
        let mut taken_by_others = Vec::new();
        let mut cluster_ips: BTreeMap<String, String> = BTreeMap::new();
        pods.pods.retain(|p| {
            let name = endpoint_mirror_name(&p.hostname, &self.link);
            let remote_named = || {
                self.remote
                    .contains(&ObjectRef::new(&p.hostname).within(&key.namespace))
            };
            let local = self
                .local_services
                .get(&ObjectRef::new(&name).within(&key.namespace));
            let taken = name == parent_name
                || remote_named()
                || local.as_ref().is_some_and(|m| service_key(m) != *key);
            if taken {
                taken_by_others.push(p.hostname.clone());
                return false;
            }
            // Listed in the parent once its endpoint mirror has a ClusterIP.
            if let Some(m) = local
                && let Some(ip) = m.spec.as_ref().and_then(|s| s.cluster_ip.clone())
                && is_owned(&m.metadata, cluster)
                && !ip.is_empty()
                && !is_headless(&m)
            {
                cluster_ips.insert(name, ip);
            }
            true
        });
        pods.refused.extend(taken_by_others);
        let m = headless_mirror(svc, &self.link, gw, resolved, &pods.pods, &cluster_ips);
        (m.parent, m.members, pods.refused)
    }

    /// Says what a headless key's plan does beyond writes: hostnames refused (log,
    /// metric and Event on the headless mirror, when the refused set changes) and a mirror
    /// recreated because it flips between headless and ClusterIP (Event on it).
    async fn report_headless(&self, key: &ServiceKey, g: &Gathered) {
        let cluster = &self.link.cluster_name;
        if self.hostnames.is_none() || g.pending {
            return;
        }
        // Said on the headless mirror once it exists (its namespace may not before it is
        // created); its watch event brings the key back.
        let parent = g.services.iter().find(|s| {
            g.desired
                .as_ref()
                .is_some_and(|d| d.service.metadata.name == s.metadata.name)
        });
        let changed = {
            let mut refused = self.refused_hostnames.lock();
            if g.refused_hostnames.is_empty() {
                refused.remove(key);
                false
            } else if parent.is_none() {
                false
            } else {
                refused
                    .insert(key.clone(), g.refused_hostnames.clone())
                    .as_ref()
                    != Some(&g.refused_hostnames)
            }
        };
        if let (true, Some(parent)) = (changed, parent) {
            use kube::Resource;
            let shown: Vec<&str> = g
                .refused_hostnames
                .iter()
                .take(5)
                .map(String::as_str)
                .collect();
            let note = format!(
                "headless service {key} of cluster {cluster}: {} hostname(s) refused, not DNS-1123 labels or their endpoint mirror's name taken by another mirror (e.g. {}); those pods get no endpoint mirror, the others are mirrored",
                g.refused_hostnames.len(),
                shown.join(", ")
            );
            tracing::warn!(%cluster, %key, refused = g.refused_hostnames.len(), "{note}");
            self.metrics.error("headless_hostname_invalid");
            self.writer
                .record(
                    &parent.object_ref(&()),
                    "HeadlessHostnameInvalid",
                    "Mirror",
                    note,
                )
                .await;
        }
        let services: Vec<&Service> = g.services.iter().map(|s| s.as_ref()).collect();
        if let Some(d) = &g.desired
            && let Some(old) = flipped(d, &services, cluster)
        {
            use kube::Resource;
            let (from, to) = match is_headless(old) {
                true => ("headless", "ClusterIP"),
                false => ("ClusterIP", "headless"),
            };
            let note = format!(
                "the mirror of {key} of cluster {cluster} changes from {from} to {to}; clusterIP is immutable, so it is deleted and created again (a short gap in its traffic and DNS)"
            );
            tracing::warn!(%cluster, %key, from, to, "{note}");
            self.metrics.error("mirror_recreated");
            self.writer
                .record(&old.object_ref(&()), "MirrorRecreated", "Mirror", note)
                .await;
        }
    }

    /// What kube-controller-manager's mirrored slices of the mirror `namespace/name`
    /// route, by one label-selected LIST served from the apiserver's watch cache
    /// (resourceVersion 0: at most as fresh as a watch would be); `None` when it fails
    /// (the slices of ours then stay, and the key comes back). Read only: kcm's slices
    /// are never written.
    async fn mirrored_routes(&self, namespace: &str, name: &str) -> Option<BTreeSet<Route>> {
        let api: Api<EndpointSlice> = Api::namespaced(self.local.clone(), namespace);
        let lp = ListParams::default()
            .labels(&mirrored_slice_selector(name))
            .match_any();
        match api.list(&lp).await {
            Ok(list) => Some(slice_routes(
                list.items
                    .iter()
                    .filter(|s| is_mirrored_slice(&s.metadata, name)),
            )),
            Err(err) => {
                let cluster = &self.link.cluster_name;
                tracing::debug!(%cluster, namespace, name, error = %err, "listing kube-controller-manager's mirrored slices failed");
                None
            }
        }
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
                        Action::UpdateEndpoints(e) => e.metadata.resource_version.clone(),
                        Action::UpdateEndpointSlice(e) => e.metadata.resource_version.clone(),
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
                let action = Action::CreateEndpointSlice(slice);
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
            if let (Action::CreateService(s), Some(uid)) = (action, &uid) {
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
            let action = Action::CreateEndpointSlice(slice);
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

    /// Another writer keeps undoing this mirror: said once per episode (log, metric,
    /// Event on the mirror Service); the key is held meanwhile (contention.rs).
    async fn report_contention(&self, key: &ServiceKey, g: &Gathered) {
        let cluster = &self.link.cluster_name;
        let note = format!(
            "another writer changed this mirror of cluster {cluster} back {CORRECTIONS} times within {} s; this controller now rewrites it at most once per {} s and up to {} min: look for a second service mirror (Linkerd's own?) linked to the same cluster",
            WINDOW.as_secs(),
            FIRST_HOLD.as_secs(),
            MAX_HOLD.as_secs() / 60
        );
        let mirror = g.services.iter().find(|s| {
            g.desired
                .as_ref()
                .is_some_and(|d| d.service.metadata.name == s.metadata.name)
        });
        let metrics = self.metrics.clone();
        let reporter = self
            .reporter
            .counting(Arc::new(move |_| metrics.error("mirror_contention")));
        use kube::Resource;
        let say = Say {
            reason: "MirrorContention",
            action: "Mirror",
            note,
            key: Some(key.to_string()),
        };
        reporter.say_about(mirror.map(|svc| svc.object_ref(&())), say);
    }

    /// A mirror's namespace is missing and the link may not create it (a `Link`
    /// without `--enable-namespace-creation`): said on the Link; the key is retried
    /// slowly, so the mirror appears once the namespace does.
    pub(super) async fn missing_namespace(&self, key: &ServiceKey, namespace: &str) {
        let cluster = &self.link.cluster_name;
        tracing::info!(%cluster, %key, namespace, "skipped mirroring: the namespace does not exist locally");
        if let Some(link) = &self.link_secret {
            let note = format!(
                "skipped mirroring service {key} of cluster {cluster}: namespace {namespace} does not exist (create it, or run with --enable-namespace-creation)"
            );
            self.writer
                .record(link, "MissingNamespace", "Mirror", note)
                .await;
        }
    }

    /// Reports a mirror refused because the link holds its limit: every refusal is logged
    /// at debug and counted, the first after none also at warn and as an Event on the link
    /// Secret. The key is looked at again when a slot frees. `partly`: a headless key
    /// whose existing mirrors are kept and written, only its new endpoint mirrors refused.
    async fn refuse_over_limit(&self, key: &ServiceKey, first: bool, partly: bool) {
        let cluster = &self.link.cluster_name;
        let max = self.limit.max().unwrap_or_default();
        self.metrics.error("mirror_limit");
        tracing::debug!(%cluster, %key, max, "mirror limit reached; not mirrored until a mirror goes");
        if !first {
            return;
        }
        let note = match partly {
            false => format!(
                "cluster {cluster} exports more services than the limit of {max} mirrors per link (--max-mirrors-per-link): {key} and any further ones are not mirrored until mirrors go; existing mirrors are kept"
            ),
            true => format!(
                "cluster {cluster} exports more services than the limit of {max} mirrors per link (--max-mirrors-per-link): new pods of headless service {key} get no endpoint mirror until mirrors go; its existing mirrors are kept and updated"
            ),
        };
        tracing::warn!(%cluster, %key, max, "{note}");
        if let Some(secret) = &self.link_secret {
            self.writer
                .record(secret, "MirrorLimitReached", "Mirror", note)
                .await;
        }
    }

    /// In `endpoints` mode, an Endpoints written with a subset larger than
    /// kube-controller-manager mirrors into slices (it keeps the first 1000 addresses of
    /// a subset, see `core::slices::MIRRORING_MAX_ENDPOINTS_PER_SUBSET`) is reported, once
    /// per write: a warning and a metric now, and the returned Events on the mirror
    /// Service.
    fn over_capacity(&self, key: &ServiceKey, steps: &Steps) -> Vec<(ObjectReference, String)> {
        let mut events = Vec::new();
        if self.mode != EndpointsMode::Endpoints {
            return events;
        }
        let actions: Vec<&Action> = match steps {
            Steps::InOrder(actions) => actions.iter().collect(),
            Steps::EndpointsFirst { endpoints, .. } => endpoints.iter().collect(),
        };
        for action in actions {
            let (Action::CreateEndpoints(e) | Action::UpdateEndpoints(e)) = action else {
                continue;
            };
            let Some(addresses) = mirroring_overflow(e) else {
                continue;
            };
            let cluster = &self.link.cluster_name;
            let max = MIRRORING_MAX_ENDPOINTS_PER_SUBSET;
            let note = format!(
                "the Endpoints of this mirror hold {addresses} gateway addresses; kube-controller-manager mirrors at most {max} per subset into EndpointSlices (--mirroring-max-endpoints-per-subset), so {} never reach kube-proxy; run service-mirror with --endpoints-mode=both to write the EndpointSlices directly",
                addresses - max
            );
            tracing::warn!(%cluster, %key, addresses, max, "mirror Endpoints over EndpointSliceMirroring's capacity");
            self.metrics.endpoints_over_capacity();
            let service = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Service".into()),
                namespace: e.metadata.namespace.clone(),
                name: e.metadata.name.clone(),
                ..ObjectReference::default()
            };
            events.push((service, note));
        }
        events
    }

    /// Records `events` (from [`Self::over_capacity`]) as `EndpointsOverCapacity`.
    async fn record_all(&self, events: Vec<(ObjectReference, String)>) {
        for (regarding, note) in events {
            self.writer
                .record(&regarding, "EndpointsOverCapacity", "Mirror", note)
                .await;
        }
    }

    /// Executes one action and remembers the write until the caches show it.
    async fn execute(&self, action: &Action) -> Result<Applied> {
        Ok(self.execute_returning_uid(action).await?.0)
    }

    /// As [`Reconciler::execute`], with the uid of a Service created now.
    async fn execute_returning_uid(&self, action: &Action) -> Result<(Applied, Option<String>)> {
        let (applied, uid) = match action {
            Action::CreateService(s) => self.writer.create_service(s).await?,
            _ => (self.writer.execute(action).await?, None),
        };
        if applied != Applied::Done {
            return Ok((applied, None));
        }
        // What the write replaced: the version updated or deleted (a precondition of the
        // write), nothing for a create.
        let (kind, ns, name, replaced) = match action {
            Action::CreateService(s) => (LocalObject::Service, s.namespace(), s.name_any(), None),
            Action::UpdateService(s) => (
                LocalObject::Service,
                s.namespace(),
                s.name_any(),
                s.metadata.resource_version.clone(),
            ),
            Action::CreateEndpoints(e) => {
                (LocalObject::Endpoints, e.namespace(), e.name_any(), None)
            }
            Action::UpdateEndpoints(e) => (
                LocalObject::Endpoints,
                e.namespace(),
                e.name_any(),
                e.metadata.resource_version.clone(),
            ),
            Action::DeleteService {
                namespace,
                name,
                resource_version,
                ..
            } => (
                LocalObject::Service,
                Some(namespace.clone()),
                name.clone(),
                // No version precondition: whatever the cache shows next counts.
                Some(resource_version.clone().unwrap_or_default()),
            ),
            Action::DeleteEndpoints {
                namespace,
                name,
                resource_version,
                ..
            } => (
                LocalObject::Endpoints,
                Some(namespace.clone()),
                name.clone(),
                Some(resource_version.clone().unwrap_or_default()),
            ),
            Action::CreateEndpointSlice(e) => (
                LocalObject::EndpointSlice,
                e.namespace(),
                e.name_any(),
                None,
            ),
            Action::UpdateEndpointSlice(e) => (
                LocalObject::EndpointSlice,
                e.namespace(),
                e.name_any(),
                e.metadata.resource_version.clone(),
            ),
            Action::DeleteEndpointSlice {
                namespace,
                name,
                resource_version,
                ..
            } => (
                LocalObject::EndpointSlice,
                Some(namespace.clone()),
                name.clone(),
                Some(resource_version.clone().unwrap_or_default()),
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
