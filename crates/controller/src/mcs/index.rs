//! The exports of the cluster set as this controller sees them: for the local cluster
//! and each linked one, its ServiceExports and the Services they name, fed by watch
//! events. Each event returns the keys whose exports it may have changed, so that only
//! those are queued for a reconcile.
//!
//! A cluster counts once both its lists are complete: before that its exports are
//! unknown, and judging without them would flip `Conflict` when they arrive. A relist
//! (a watch restarted) keeps the previous list's objects until it completes, so an
//! outage changes nothing; objects the new list lacks then leave.

use super::resource::ServiceExport;
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher::Event;
use service_mirror_core::mcs::{ClusterExport, EXPORT_TO_ANNOTATION, ExportTo};
use service_mirror_core::{NamespaceFilter, ServiceKey};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The number of a cluster's feed: a link controller replaced (new credentials) starts
/// a new feed, which runs beside the older one until either ends (see [`Feeds`]).
pub(super) type Generation = u64;

/// How long an unlisted linked cluster holds every judgement: a remote that cannot list
/// (no CRD, no permission, unreachable) must not hold the local exports' conditions
/// for ever; it counts as exporting nothing until it lists.
pub(super) const LIST_HOLD: Duration = Duration::from_secs(30);

/// Keys changed by one event.
pub(crate) type Changed = BTreeSet<ServiceKey>;

mod tables;
pub(crate) use tables::Grouped;
pub(super) use tables::Listed;

/// What an export contributes to the merge (its name is the key).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ExportEntry {
    /// `creationTimestamp`: the oldest export wins.
    pub(super) created: Timestamp,
    /// `spec.exportedLabels`.
    pub(super) labels: BTreeMap<String, String>,
    /// `spec.exportedAnnotations`.
    pub(super) annotations: BTreeMap<String, String>,
    /// The clusters it reaches (its `service-mirror.io/export-to` annotation).
    pub(super) export_to: ExportTo,
    /// The object itself (only the local cluster's: its status is ours to write).
    pub(super) object: Option<ServiceExport>,
}

/// One feed's view of a cluster.
#[derive(Debug)]
struct ClusterView {
    /// When its feed started: the end of its [`LIST_HOLD`].
    since: Instant,
    exports: Listed<ExportEntry>,
    services: Listed<Service>,
    /// Its feed ended while a newer one had not listed: it counts until that one has.
    ended: bool,
}

impl ClusterView {
    fn new(since: Instant) -> Self {
        Self {
            since,
            exports: Listed::default(),
            services: Listed::default(),
            ended: false,
        }
    }

    fn listed(&self) -> bool {
        self.exports.listed && self.services.listed
    }

    fn keys(&self) -> impl Iterator<Item = ServiceKey> + '_ {
        self.exports.items.keys().cloned()
    }
}

/// A cluster's views, one per live feed: a link being replaced (new credentials) runs
/// beside its successor until one of them stops, and either may be the one that stays
/// (a rotation that times out keeps the old link). The newest listed view counts.
#[derive(Debug, Default)]
struct Feeds(BTreeMap<Generation, ClusterView>);

impl Feeds {
    /// The view that counts: the newest listed one.
    fn effective(&self) -> Option<&ClusterView> {
        self.0.values().rev().find(|v| v.listed())
    }

    fn effective_generation(&self) -> Option<Generation> {
        self.0
            .iter()
            .rev()
            .find(|(_, v)| v.listed())
            .map(|(g, _)| *g)
    }

    /// Whether a feed newer than `generation` is still live (not ended).
    fn live_after(&self, generation: Generation) -> bool {
        self.0.range(generation + 1..).any(|(_, v)| !v.ended)
    }

    /// Drops the ended views no longer needed: an ended view stays only while it counts
    /// and a newer live feed has not listed yet.
    fn prune(&mut self) {
        let effective = self.effective_generation();
        let keep: Vec<bool> = self
            .0
            .iter()
            .map(|(g, v)| !v.ended || (Some(*g) == effective && self.live_after(*g)))
            .collect();
        let mut keep = keep.into_iter();
        self.0.retain(|_, _| keep.next().unwrap_or(true));
    }

    /// The keys of the view that counts.
    fn keys(&self) -> Changed {
        self.effective()
            .map(|v| v.keys().collect())
            .unwrap_or_default()
    }
}

/// The cluster set's exports.
#[derive(Debug)]
pub(super) struct ExportIndex {
    local: String,
    /// Exports of other namespaces are not read (as the links mirror no Service there).
    namespaces: NamespaceFilter,
    clusters: BTreeMap<String, Feeds>,
}

fn export_meta(e: &ServiceExport) -> &ObjectMeta {
    &e.metadata
}

fn service_meta(s: &Service) -> &ObjectMeta {
    &s.metadata
}

/// An export being deleted exports nothing.
fn live(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_none()
}

fn keep_export(local: bool) -> fn(&ServiceExport) -> Option<ExportEntry> {
    fn entry(e: &ServiceExport, object: Option<ServiceExport>) -> Option<ExportEntry> {
        live(&e.metadata).then(|| ExportEntry {
            // A real apiserver always sets it; without one it is the newest of all.
            created: e
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(Timestamp::MAX, |t| t.0),
            labels: e.spec.exported_labels.clone().unwrap_or_default(),
            annotations: e.spec.exported_annotations.clone().unwrap_or_default(),
            export_to: ExportTo::parse(
                e.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(EXPORT_TO_ANNOTATION))
                    .map(String::as_str),
            ),
            object,
        })
    }
    match local {
        true => |e| entry(e, Some(e.clone())),
        false => |e| entry(e, None),
    }
}

/// What the merge reads of a Service: its spec without what differs per cluster
/// (addresses, selector, node ports), so that an unrelated change judges nothing.
fn keep_service(s: &Service) -> Option<Service> {
    let spec = s.spec.as_ref()?;
    live(&s.metadata).then(|| Service {
        metadata: ObjectMeta {
            name: s.metadata.name.clone(),
            namespace: s.metadata.namespace.clone(),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: spec.type_.clone(),
            cluster_ip: spec.cluster_ip.clone().filter(|ip| ip == "None"),
            ports: spec.ports.as_ref().map(|ports| {
                ports
                    .iter()
                    .map(|p| k8s_openapi::api::core::v1::ServicePort {
                        name: p.name.clone(),
                        protocol: p.protocol.clone(),
                        port: p.port,
                        app_protocol: p.app_protocol.clone(),
                        ..Default::default()
                    })
                    .collect()
            }),
            session_affinity: spec.session_affinity.clone(),
            session_affinity_config: spec.session_affinity_config.clone(),
            internal_traffic_policy: spec.internal_traffic_policy.clone(),
            traffic_distribution: spec.traffic_distribution.clone(),
            ip_families: spec.ip_families.clone(),
            external_name: spec.external_name.clone(),
            ..Default::default()
        }),
        status: None,
    })
}

impl ExportIndex {
    /// An index whose local cluster is named `local` (its feed is generation 0), of
    /// the namespaces `namespaces` allows.
    pub(super) fn new(local: &str, namespaces: NamespaceFilter, now: Instant) -> Self {
        Self {
            local: local.into(),
            namespaces,
            clusters: BTreeMap::from([(
                local.to_owned(),
                Feeds(BTreeMap::from([(0, ClusterView::new(now))])),
            )]),
        }
    }

    /// A feed of `cluster` starts at `now`. Refused for the local cluster (a link named
    /// like this cluster: its exports would pass for ours) and for a generation not
    /// newer than every live one.
    pub(super) fn feed(&mut self, cluster: &str, generation: Generation, now: Instant) -> bool {
        if cluster == self.local {
            return false;
        }
        let feeds = self.clusters.entry(cluster.to_owned()).or_default();
        if feeds.0.keys().next_back().is_some_and(|g| *g >= generation) {
            return false;
        }
        feeds.0.insert(generation, ClusterView::new(now));
        true
    }

    /// Whether `ev` is of an allowed namespace (list markers are).
    fn allows<K>(&self, ev: &Event<K>, meta: fn(&K) -> &ObjectMeta) -> bool {
        match ev {
            Event::Apply(o) | Event::InitApply(o) | Event::Delete(o) => meta(o)
                .namespace
                .as_deref()
                .is_some_and(|ns| self.namespaces.allows(ns)),
            Event::Init | Event::InitDone => true,
        }
    }

    /// Applies one event to the view of `cluster` at `generation`: the keys it changed
    /// (every key of the views that stop or start counting when the effective view
    /// moves).
    fn apply(
        &mut self,
        cluster: &str,
        generation: Generation,
        event: impl FnOnce(&mut ClusterView) -> Changed,
    ) -> Changed {
        let Some(feeds) = self.clusters.get_mut(cluster) else {
            return Changed::new();
        };
        let before = feeds.effective_generation();
        let Some(view) = feeds.0.get_mut(&generation) else {
            return Changed::new();
        };
        let was = view.listed();
        let mut changed = event(view);
        if !was && view.listed() {
            // Its exports count from the moment both lists are complete: each may
            // change a verdict.
            changed.extend(view.keys());
        }
        if feeds.effective_generation() != before {
            if let Some(old) = before.and_then(|g| feeds.0.get(&g)) {
                changed.extend(old.keys());
            }
            changed.extend(feeds.keys());
            // An ended view kept for this one's listing goes now.
            feeds.prune();
        }
        changed
    }

    /// A ServiceExport watch event of `cluster`.
    pub(super) fn export_event(
        &mut self,
        cluster: &str,
        generation: Generation,
        ev: &Event<ServiceExport>,
    ) -> Changed {
        if !self.allows(ev, export_meta) {
            return Changed::new();
        }
        let keep = keep_export(cluster == self.local);
        self.apply(cluster, generation, |view| {
            view.exports
                .apply(ev, |e| ServiceKey::from_meta(&e.metadata), keep)
        })
    }

    /// A Service watch event of `cluster`.
    pub(super) fn service_event(
        &mut self,
        cluster: &str,
        generation: Generation,
        ev: &Event<Service>,
    ) -> Changed {
        if !self.allows(ev, service_meta) {
            return Changed::new();
        }
        self.apply(cluster, generation, |view| {
            let exports = &view.exports.items;
            view.services
                .apply(ev, |s| ServiceKey::from_meta(&s.metadata), keep_service)
                .into_iter()
                // A Service matters only where it is exported.
                .filter(|k| exports.contains_key(k))
                .collect()
        })
    }

    /// The feed `generation` of `cluster` ended: its view goes; if it was the one that
    /// counted, its keys are judged again (with the next newest listed view's, if any).
    /// A view that counts while a newer feed has not listed yet (a link restarted with
    /// new settings stops before its successor lists) stays, ended, until that feed has
    /// listed or ended too: the cluster's exports never drop out in between.
    pub(super) fn remove(&mut self, cluster: &str, generation: Generation) -> Changed {
        if cluster == self.local {
            return Changed::new();
        }
        let Some(feeds) = self.clusters.get_mut(cluster) else {
            return Changed::new();
        };
        let before = feeds.effective_generation();
        let Some(view) = feeds.0.get_mut(&generation) else {
            return Changed::new();
        };
        view.ended = true;
        // What counted before: the view that ended, or one kept for its successor.
        let counted = feeds.keys();
        feeds.prune();
        let mut changed = Changed::new();
        if feeds.effective_generation() != before {
            changed.extend(counted);
            changed.extend(feeds.keys());
        }
        if feeds.0.is_empty() {
            self.clusters.remove(cluster);
        }
        changed
    }

    /// Whether the local lists are complete.
    pub(super) fn local_listed(&self) -> bool {
        self.clusters
            .get(&self.local)
            .is_some_and(|f| f.effective().is_some())
    }

    /// How many clusters count (their lists complete), the local one included.
    pub(super) fn listed_count(&self) -> usize {
        self.clusters
            .values()
            .filter(|f| f.effective().is_some())
            .count()
    }

    /// The end of the latest hold of a linked cluster not yet listed, if one still
    /// holds at `now`.
    pub(super) fn held_until(&self, now: Instant) -> Option<Instant> {
        self.clusters
            .values()
            .filter(|f| f.effective().is_none())
            // From its first live feed: a replacement does not extend the hold.
            .filter_map(|f| f.0.values().map(|v| v.since).min())
            .map(|since| since + LIST_HOLD)
            .filter(|end| *end > now)
            .max()
    }

    /// Linked clusters not listed (their exports count as none).
    pub(super) fn unlisted(&self) -> Vec<&str> {
        self.clusters
            .iter()
            .filter(|(name, f)| **name != self.local && f.effective().is_none())
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// Whether `cluster` counts (a feed of it has listed).
    pub(super) fn counts(&self, cluster: &str) -> bool {
        self.clusters
            .get(cluster)
            .is_some_and(|f| f.effective().is_some())
    }

    /// Each cluster with a feed (the local one included), and whether it counts.
    pub(super) fn feeds(&self) -> BTreeMap<String, bool> {
        self.clusters
            .iter()
            .map(|(name, f)| (name.clone(), f.effective().is_some()))
            .collect()
    }

    /// Every key exported in a cluster that counts.
    pub(super) fn keys(&self) -> Changed {
        self.clusters.values().flat_map(Feeds::keys).collect()
    }

    /// The local export of `key`, if any.
    pub(super) fn local_export(&self, key: &ServiceKey) -> Option<&ServiceExport> {
        self.local_view()?.exports.items.get(key)?.object.as_ref()
    }

    /// Every local export's key.
    pub(super) fn local_keys(&self) -> Vec<ServiceKey> {
        self.local_view()
            .map(|v| v.keys().collect())
            .unwrap_or_default()
    }

    /// The local cluster's one view (listed or not).
    fn local_view(&self) -> Option<&ClusterView> {
        self.clusters.get(&self.local)?.0.get(&0)
    }

    /// The exports of `key` in every listed cluster, each with its Service.
    pub(super) fn exports(&self, key: &ServiceKey) -> Vec<ClusterExport> {
        self.clusters
            .iter()
            .filter_map(|(cluster, f)| Some((cluster, f.effective()?)))
            .filter_map(|(cluster, v)| {
                let e = v.exports.items.get(key)?;
                Some(ClusterExport {
                    cluster: cluster.clone(),
                    created: e.created,
                    exported_labels: e.labels.clone(),
                    exported_annotations: e.annotations.clone(),
                    service: v.services.items.get(key).cloned(),
                    export_to: e.export_to.clone(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
