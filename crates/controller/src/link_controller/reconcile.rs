//! Reconciling one key: gather (caches, index, gateways) → decide (pure, decide.rs) →
//! apply (the writer and the expectations). One file each under `reconcile/`: the
//! three handles a reconcile holds (`view.rs`: what gather reads; `memory.rs`: what
//! it remembers of a key between passes; `effects.rs`: what it does to the world),
//! the read step (`gather.rs`, writing nothing), kube-controller-manager's slices read
//! after it (`mirroring.rs`), the mirror-limit slots (`slots.rs`), headless keys
//! (`headless.rs`), the apply step (`apply.rs`), what is said beyond writes
//! (`reports.rs`; about a remote Service's `service-mirror.io/export-to`:
//! `export_to.rs`).

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

mod apply;
mod effects;
mod export_to;
mod gather;
mod headless;
mod memory;
mod mirroring;
mod reports;
mod slots;
#[cfg(test)]
mod tests;
mod view;

pub(super) use effects::Effects;
use gather::Notes;
pub(super) use memory::Memory;
pub(super) use view::View;

/// A link's reconcile of one key, as three handles: what gather reads (`view`), what
/// a reconcile remembers of a key between passes (`memory`), and what it does to the
/// world: writes, Events, metrics, status, slots (`fx`).
pub(super) struct Reconciler {
    pub(super) view: View,
    pub(super) memory: Memory,
    pub(super) fx: Effects,
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
        // Kept from this cluster by its export-to: said when it concerns this cluster.
        Some(ExportDecision::Withheld(w @ service_mirror_core::Withheld::Invalid(_))) => {
            Observed::Invalid(w.describe().into())
        }
        Some(ExportDecision::Withheld(w @ service_mirror_core::Withheld::NoClusterName)) => {
            Observed::Error(format!("not mirrored: {}", w.describe()))
        }
        // A federated member's bad list is said, but the status lists mirrors only.
        Some(
            ExportDecision::NotExported
            | ExportDecision::Withheld(_)
            | ExportDecision::InvalidMemberExportTo(_),
        )
        | None => Observed::Gone,
    })
}

impl Reconciler {
    /// Brings the local mirror of `key` to its desired state.
    pub(super) async fn reconcile(&self, key: &ServiceKey) -> Result<Outcome> {
        let (mut gathered, notes) = self.view.gather(key).await;
        gathered.endpoints_written_first = self.memory.endpoints_first.lock().get(key).cloned();
        self.say_gathered(key, notes).await;
        self.say_export_to(key, &gathered);
        self.read_mirroring(key, &mut gathered).await;
        // A headless key with mirrors took its slots here (only its new endpoint
        // mirrors beyond the limit refused); any other is admitted in `apply`.
        let admitted = self.admit_members(key, &mut gathered).await;
        let decision = decide(key, &self.view.link.cluster_name, &gathered);
        if let Decision::Write(w) = &decision
            && w.create_permit
        {
            tracing::debug!(
                cluster = %self.view.link.cluster_name,
                %key,
                services = gathered.services.len(),
                endpoints = gathered.endpoints.len(),
                slices = gathered.slices.len(),
                "the plan creates what the caches do not hold"
            );
        }
        let observed = self.fx.status.as_ref().and_then(|_| observed(&gathered));
        let fingerprint = updates(&decision)
            .then(|| fingerprint(gathered.desired.as_ref(), gathered.members.as_deref()));
        self.report_headless(key, &gathered).await;
        // Slots under the mirror limit: one per mirror Service.
        let slots = 1 + gathered.members.as_ref().map_or(0, Vec::len);
        if let Some(fp) = fingerprint {
            match self
                .memory
                .contention
                .check(key, fp, std::time::Instant::now())
            {
                Verdict::Hold(after) => return Ok(Outcome::RequeueAfter(after)),
                Verdict::Write { report: true } => self.report_contention(key, &gathered).await,
                Verdict::Write { report: false } => {}
            }
        }
        if gathered.desired.is_none() {
            self.memory.contention.forget(key);
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
        if let (Some(book), Some(observed)) = (&self.fx.status, observed) {
            book.observe_shared(
                key,
                || self.view.index.lock().services().shared(key),
                match &result {
                    Ok(_) if self.fx.limit.is_refused(key) => Observed::Error(format!(
                        "not mirrored: the link holds its limit of {} mirrors (--max-mirrors-per-link)",
                        self.fx.limit.max().unwrap_or_default()
                    )),
                    Ok(_) => observed,
                    Err(Error::MissingNamespace(_)) => Observed::MissingNamespace,
                    Err(e) => Observed::Error(e.to_string()),
                },
            );
        }
        result
    }
}
