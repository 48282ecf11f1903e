//! The exports of the cluster set as this controller sees them: for the local cluster
//! and each linked one, its ServiceExports and the Services they name, fed by watch
//! events. Each event returns the keys whose exports it may have changed, so that the
//! worker judges only those.
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
use service_mirror_core::mcs::ClusterExport;
use service_mirror_core::{NamespaceFilter, ServiceKey};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The number of a cluster's feed: a link controller replaced (new credentials) starts
/// a new feed; the older one's late events are dropped.
pub(super) type Generation = u64;

/// How long an unlisted linked cluster holds every judgement: a remote that cannot list
/// (no CRD, no permission, unreachable) must not hold the local exports' conditions
/// for ever; it counts as exporting nothing until it lists.
pub(super) const LIST_HOLD: Duration = Duration::from_secs(30);

/// Keys changed by one event.
pub(super) type Changed = BTreeSet<ServiceKey>;

/// Objects of one kind in one cluster, by key.
#[derive(Debug)]
struct Listed<T> {
    items: BTreeMap<ServiceKey, T>,
    /// The keys the list in progress has delivered (`None`: no list in progress).
    listing: Option<BTreeSet<ServiceKey>>,
    /// A complete list has arrived.
    listed: bool,
}

impl<T> Default for Listed<T> {
    fn default() -> Self {
        Self {
            items: BTreeMap::new(),
            listing: None,
            listed: false,
        }
    }
}

impl<T: PartialEq> Listed<T> {
    /// Applies `ev`, each object made by `keep` (None: not stored, as if deleted).
    fn apply<K>(
        &mut self,
        ev: &Event<K>,
        meta: fn(&K) -> &ObjectMeta,
        keep: fn(&K) -> Option<T>,
    ) -> Changed {
        let mut changed = Changed::new();
        match ev {
            Event::Init => self.listing = Some(BTreeSet::new()),
            Event::InitApply(o) | Event::Apply(o) => {
                let Some(key) = ServiceKey::from_meta(meta(o)) else {
                    return changed;
                };
                if let (Event::InitApply(_), Some(seen)) = (ev, self.listing.as_mut()) {
                    seen.insert(key.clone());
                }
                let next = keep(o);
                if self.items.get(&key) != next.as_ref() {
                    match next {
                        Some(v) => self.items.insert(key.clone(), v),
                        None => self.items.remove(&key),
                    };
                    changed.insert(key);
                }
            }
            Event::Delete(o) => {
                if let Some(key) = ServiceKey::from_meta(meta(o))
                    && self.items.remove(&key).is_some()
                {
                    changed.insert(key);
                }
            }
            Event::InitDone => {
                if let Some(seen) = self.listing.take() {
                    let gone: Vec<ServiceKey> = self
                        .items
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        self.items.remove(&key);
                        changed.insert(key);
                    }
                }
                self.listed = true;
            }
        }
        changed
    }
}

/// What an export contributes to the merge (its name is the key).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ExportEntry {
    /// `creationTimestamp`: the oldest export wins.
    pub(super) created: Timestamp,
    /// `spec.exportedLabels`.
    pub(super) labels: BTreeMap<String, String>,
    /// `spec.exportedAnnotations`.
    pub(super) annotations: BTreeMap<String, String>,
    /// The object itself (only the local cluster's: its status is ours to write).
    pub(super) object: Option<ServiceExport>,
}

/// One cluster's view.
#[derive(Debug)]
struct ClusterView {
    generation: Generation,
    /// When its feed started: the end of its [`LIST_HOLD`].
    since: Instant,
    exports: Listed<ExportEntry>,
    services: Listed<Service>,
}

impl ClusterView {
    fn new(generation: Generation, since: Instant) -> Self {
        Self {
            generation,
            since,
            exports: Listed::default(),
            services: Listed::default(),
        }
    }

    fn listed(&self) -> bool {
        self.exports.listed && self.services.listed
    }

    /// Its exports count from the moment both lists are complete: each may change a
    /// verdict.
    fn now_listed(&self, was: bool, changed: &mut Changed) {
        if !was && self.listed() {
            changed.extend(self.exports.items.keys().cloned());
        }
    }
}

/// The cluster set's exports.
#[derive(Debug)]
pub(super) struct ExportIndex {
    local: String,
    /// Exports of other namespaces are not read (as the links mirror no Service there).
    namespaces: NamespaceFilter,
    clusters: BTreeMap<String, ClusterView>,
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
            clusters: BTreeMap::from([(local.to_owned(), ClusterView::new(0, now))]),
        }
    }

    /// The local cluster's name.
    pub(super) fn local(&self) -> &str {
        &self.local
    }

    /// A feed of `cluster` starts at `now`: a newer generation replaces the older
    /// one's (whose objects stay until the new lists complete); an older one is refused.
    pub(super) fn feed(&mut self, cluster: &str, generation: Generation, now: Instant) -> bool {
        match self.clusters.get_mut(cluster) {
            Some(view) if view.generation >= generation => false,
            Some(view) => {
                view.generation = generation;
                true
            }
            None => {
                self.clusters
                    .insert(cluster.into(), ClusterView::new(generation, now));
                true
            }
        }
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

    /// The view of `cluster` at `generation`, if that feed is current.
    fn current(&mut self, cluster: &str, generation: Generation) -> Option<&mut ClusterView> {
        self.clusters
            .get_mut(cluster)
            .filter(|v| v.generation == generation)
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
        let local = cluster == self.local;
        let Some(view) = self.current(cluster, generation) else {
            return Changed::new();
        };
        let was = view.listed();
        let mut changed = view.exports.apply(ev, export_meta, keep_export(local));
        view.now_listed(was, &mut changed);
        changed
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
        let Some(view) = self.current(cluster, generation) else {
            return Changed::new();
        };
        let was = view.listed();
        let mut changed: Changed = view
            .services
            .apply(ev, service_meta, keep_service)
            .into_iter()
            // A Service matters only where it is exported.
            .filter(|k| view.exports.items.contains_key(k))
            .collect();
        view.now_listed(was, &mut changed);
        changed
    }

    /// The feed `generation` of `cluster` ended: unless a newer one replaced it, the
    /// cluster's exports leave.
    pub(super) fn remove(&mut self, cluster: &str, generation: Generation) -> Changed {
        if cluster == self.local
            || self.clusters.get(cluster).map(|v| v.generation) != Some(generation)
        {
            return Changed::new();
        }
        self.clusters
            .remove(cluster)
            .map(|v| v.exports.items.into_keys().collect())
            .unwrap_or_default()
    }

    /// Whether the local lists are complete.
    pub(super) fn local_listed(&self) -> bool {
        self.clusters.get(&self.local).is_some_and(|v| v.listed())
    }

    /// The end of the latest hold of a linked cluster not yet listed, if one still
    /// holds at `now`.
    pub(super) fn held_until(&self, now: Instant) -> Option<Instant> {
        self.clusters
            .values()
            .filter(|v| !v.listed())
            .map(|v| v.since + LIST_HOLD)
            .filter(|end| *end > now)
            .max()
    }

    /// Linked clusters not listed (their exports count as none).
    pub(super) fn unlisted(&self) -> Vec<&str> {
        self.clusters
            .iter()
            .filter(|(name, v)| **name != self.local && !v.listed())
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// The local export of `key`, if any.
    pub(super) fn local_export(&self, key: &ServiceKey) -> Option<&ServiceExport> {
        self.clusters
            .get(&self.local)?
            .exports
            .items
            .get(key)?
            .object
            .as_ref()
    }

    /// Every local export's key.
    pub(super) fn local_keys(&self) -> Vec<ServiceKey> {
        self.clusters
            .get(&self.local)
            .map(|v| v.exports.items.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The exports of `key` in every listed cluster, each with its Service.
    pub(super) fn exports(&self, key: &ServiceKey) -> Vec<ClusterExport> {
        self.clusters
            .iter()
            .filter(|(_, v)| v.listed())
            .filter_map(|(cluster, v)| {
                let e = v.exports.items.get(key)?;
                Some(ClusterExport {
                    cluster: cluster.clone(),
                    created: e.created,
                    exported_labels: e.labels.clone(),
                    exported_annotations: e.annotations.clone(),
                    service: v.services.items.get(key).cloned(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
