//! The metrics of the link controllers: the families (registered once per process)
//! and, per link, every update with the cluster label bound once.

use crate::links::metrics::{LinkErrorLabels, LinkResourceErrorLabels};
use crate::metrics::{ClusterLabels, Metrics};
use k8s_openapi::api::core::v1::ObjectReference;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

/// Labels of reconcile errors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ErrorLabels {
    /// The link's cluster name.
    pub(crate) cluster: String,
    /// The error kind ([`crate::Error::metric_label`], or a refusal's reason).
    pub(crate) kind: String,
}

fn reconcile_histogram() -> Histogram {
    // 0.5 ms to ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The families of every link controller, labelled by cluster.
#[derive(Debug)]
pub(crate) struct LinkFamilies {
    /// Local mirror Services per cluster.
    pub(crate) mirrored_services: Family<ClusterLabels, Gauge>,
    /// 1 while the last remote watch call succeeded.
    pub(crate) remote_connected: Family<ClusterLabels, Gauge>,
    /// Unix time of the last event or list received from the remote cluster.
    pub(crate) last_sync: Family<ClusterLabels, Gauge<f64, AtomicU64>>,
    /// Time to reconcile one key.
    pub(crate) reconcile_duration: Family<ClusterLabels, Histogram, fn() -> Histogram>,
    /// Failed reconciles by kind.
    pub(crate) reconcile_errors: Family<ErrorLabels, Counter>,
    /// Keys waiting to be reconciled, now or after a backoff.
    pub(crate) queue_depth: Family<ClusterLabels, Gauge>,
    /// Exported services not mirrored because the link holds its limit of mirrors.
    pub(crate) mirrors_refused: Family<ClusterLabels, Gauge>,
    /// Full lists of a remote after the first one (expired watches, HTTP 410).
    pub(crate) remote_relists: Family<ClusterLabels, Counter>,
    /// Endpoints writes (`endpoints` mode) of mirrors with more addresses than
    /// kube-controller-manager's EndpointSliceMirroring mirrors.
    pub(crate) endpoints_over_capacity: Family<ClusterLabels, Counter>,
    /// Writes of a `Link`'s status.
    pub(crate) link_status_writes: Family<ClusterLabels, Counter>,
    /// Bytes of `Link` status written (the patch bodies).
    pub(crate) link_status_bytes: Family<ClusterLabels, Counter>,
    /// Remote Services left out of a `Link`'s status (over its size budget).
    pub(crate) link_status_truncated: Family<ClusterLabels, Gauge>,
    /// Gateway addresses refused by the address policy, counted once per gateway and
    /// refused set.
    pub(crate) gateway_addresses_refused: Family<RefusedLabels, Counter>,
    /// Gateways found unusable (missing, no ingress, no `mc-gateway` port), counted once
    /// per gateway and reason.
    pub(crate) gateway_unusable: Family<RefusedLabels, Counter>,
    /// 1 for the current state of a link's remote (remote_state.rs), 0 for the others.
    pub(crate) remote_state: Family<StateLabels, Gauge>,
    /// Complete lists after an outage whose deletes were held (they would have deleted
    /// every mirror).
    pub(crate) remote_lists_held: Family<ClusterLabels, Counter>,
}

/// Labels of the remote state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StateLabels {
    /// The link's cluster name.
    pub(crate) cluster: String,
    /// `connected`, `disconnected`, `stale` or `expired`.
    pub(crate) state: String,
}

/// Labels of refused gateway addresses.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RefusedLabels {
    /// The link's cluster name.
    pub(crate) cluster: String,
    /// Why: `configured_deny`, `default_deny`, `local_service_cidr` or `local_pod_cidr` (refused addresses); a `GatewayError` reason
    /// (unusable gateways).
    pub(crate) reason: String,
}

impl Default for LinkFamilies {
    fn default() -> Self {
        Self {
            mirrored_services: Family::default(),
            remote_connected: Family::default(),
            last_sync: Family::default(),
            reconcile_duration: Family::new_with_constructor(reconcile_histogram),
            reconcile_errors: Family::default(),
            queue_depth: Family::default(),
            mirrors_refused: Family::default(),
            remote_relists: Family::default(),
            endpoints_over_capacity: Family::default(),
            link_status_writes: Family::default(),
            link_status_bytes: Family::default(),
            link_status_truncated: Family::default(),
            gateway_addresses_refused: Family::default(),
            gateway_unusable: Family::default(),
            remote_state: Family::default(),
            remote_lists_held: Family::default(),
        }
    }
}

impl LinkFamilies {
    /// Registers the families (under the registry's prefix).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "mirrored_services",
            "Local mirror Services per linked cluster",
            self.mirrored_services.clone(),
        );
        r.register(
            "remote_connected",
            "1 while the remote cluster's watch is connected",
            self.remote_connected.clone(),
        );
        r.register(
            "last_sync_timestamp_seconds",
            "Unix time of the last data received from the remote cluster",
            self.last_sync.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time to reconcile one mirror",
            self.reconcile_duration.clone(),
        );
        r.register(
            "reconcile_errors",
            "Failed reconciles by error kind",
            self.reconcile_errors.clone(),
        );
        r.register(
            "retry_queue_depth",
            "Keys waiting to be reconciled, now or after a backoff",
            self.queue_depth.clone(),
        );
        r.register(
            "mirrors_refused",
            "Exported services not mirrored because the link holds its limit of mirrors",
            self.mirrors_refused.clone(),
        );
        r.register(
            "remote_relists",
            "Full lists of a remote cluster after the first (expired watches)",
            self.remote_relists.clone(),
        );
        r.register(
            "endpoints_over_capacity",
            "Endpoints written (endpoints mode) with more addresses in a subset than EndpointSliceMirroring mirrors (1000 by default)",
            self.endpoints_over_capacity.clone(),
        );
        r.register(
            "link_status_writes",
            "Writes of a Link's status subresource",
            self.link_status_writes.clone(),
        );
        r.register(
            "link_status_bytes",
            "Bytes of Link status written (patch bodies)",
            self.link_status_bytes.clone(),
        );
        r.register(
            "link_status_truncated",
            "Remote Services left out of a Link's status, over its size budget",
            self.link_status_truncated.clone(),
        );
        r.register(
            "gateway_addresses_refused",
            "Gateway addresses refused by the gateway address policy, by reason (configured_deny, default_deny, local_service_cidr, local_pod_cidr)",
            self.gateway_addresses_refused.clone(),
        );
        r.register(
            "gateway_unusable",
            "Gateways of mirrored Services found unusable, once per gateway and reason (NotFound, NoIngress, NoGatewayPort, NoUsableIngress)",
            self.gateway_unusable.clone(),
        );
        r.register(
            "remote_state",
            "1 for the current state of a linked cluster's apiserver (connected, disconnected, stale, expired), 0 for the others",
            self.remote_state.clone(),
        );
        r.register(
            "remote_lists_held",
            "Lists of a remote after an outage that would have deleted every mirror, whose deletes were held",
            self.remote_lists_held.clone(),
        );
    }

    /// Counts a gateway address of link `cluster` refused by the address policy.
    pub(crate) fn gateway_address_refused(&self, cluster: &str, reason: &str) {
        self.gateway_addresses_refused
            .get_or_create(&RefusedLabels {
                cluster: cluster.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts a gateway of link `cluster` found unusable for `reason`.
    pub(crate) fn gateway_unusable(&self, cluster: &str, reason: &str) {
        self.gateway_unusable
            .get_or_create(&RefusedLabels {
                cluster: cluster.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts a failed or refused reconcile of link `cluster`.
    pub(crate) fn error(&self, cluster: &str, kind: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                cluster: cluster.into(),
                kind: kind.into(),
            })
            .inc();
    }

    /// Drops the gauges of an unlinked cluster (counters keep their totals).
    pub(crate) fn forget(&self, cluster: &str) {
        let l = ClusterLabels::of(cluster);
        self.mirrored_services.remove(&l);
        self.remote_connected.remove(&l);
        self.last_sync.remove(&l);
        self.queue_depth.remove(&l);
        self.mirrors_refused.remove(&l);
        self.link_status_truncated.remove(&l);
        for state in service_mirror_core::RemoteState::ALL {
            self.remote_state.remove(&StateLabels {
                cluster: cluster.into(),
                state: state.label().into(),
            });
        }
    }
}

/// The series of one link. A series appears with its first update, as before.
#[derive(Debug, Clone)]
pub(super) struct LinkMetrics {
    metrics: Arc<Metrics>,
    labels: ClusterLabels,
    /// Held while the state gauges are read and set: workers finishing together
    /// would otherwise set an older reading after a newer one (an idle link then showed
    /// a queue depth of 1 for good: tests/scale.rs).
    state: Arc<parking_lot::Mutex<()>>,
}

impl LinkMetrics {
    /// The series of link `cluster`.
    pub(super) fn new(metrics: Arc<Metrics>, cluster: &str) -> Self {
        Self {
            metrics,
            labels: ClusterLabels::of(cluster),
            state: Arc::default(),
        }
    }

    /// Where the runtime's workers count this link's reconciles (summed over links:
    /// `reconcile_duration_seconds{cluster}` has them per link).
    pub(super) fn meter(&self) -> crate::runtime::metrics::Meter<'_> {
        crate::runtime::metrics::Meter {
            families: &self.metrics.runtime,
            component: "link",
        }
    }

    /// Whether the last remote watch call succeeded.
    pub(super) fn remote_connected(&self, connected: bool) {
        let m = &self.metrics.link.remote_connected;
        m.get_or_create(&self.labels).set(connected as i64);
    }

    /// Data (an event or a whole list) arrived from the remote now.
    pub(super) fn remote_synced_now(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let m = &self.metrics.link.last_sync;
        m.get_or_create(&self.labels).set(now.as_secs_f64());
    }

    /// The remote's state is `now` (1 for it, 0 for the others).
    pub(super) fn remote_state(&self, now: service_mirror_core::RemoteState) {
        for state in service_mirror_core::RemoteState::ALL {
            let l = StateLabels {
                cluster: self.labels.cluster.clone(),
                state: state.label().into(),
            };
            self.metrics
                .link
                .remote_state
                .get_or_create(&l)
                .set((state == now) as i64);
        }
    }

    /// A list's deletes were held (it would have deleted every mirror after an outage).
    pub(super) fn relist_held(&self) {
        self.metrics
            .link
            .remote_lists_held
            .get_or_create(&self.labels)
            .inc();
    }

    /// The remote was listed again (its watch resume point expired).
    pub(super) fn remote_relisted(&self) {
        self.metrics
            .link
            .remote_relists
            .get_or_create(&self.labels)
            .inc();
    }

    /// Times one reconcile: the histogram is observed when the guard drops.
    pub(super) fn reconcile_timer(&self) -> ReconcileTimer<'_> {
        ReconcileTimer {
            metrics: self,
            started: Instant::now(),
        }
    }

    /// The link's state after a reconcile: mirrors, queue depth, refused keys.
    pub(super) fn state(&self, read: impl FnOnce() -> (usize, usize, usize)) {
        let _one_at_a_time = self.state.lock();
        let (mirrors, queue_depth, refused) = read();
        let m = &self.metrics.link;
        let l = &self.labels;
        m.mirrored_services.get_or_create(l).set(mirrors as i64);
        m.queue_depth.get_or_create(l).set(queue_depth as i64);
        m.mirrors_refused.get_or_create(l).set(refused as i64);
    }

    /// An Endpoints write of a mirror over EndpointSliceMirroring's capacity.
    pub(super) fn endpoints_over_capacity(&self) {
        self.metrics
            .link
            .endpoints_over_capacity
            .get_or_create(&self.labels)
            .inc();
    }

    /// One write of the Link's status, of `bytes`, leaving `truncated` Services out.
    pub(super) fn status_written(&self, bytes: usize, truncated: usize) {
        let m = &self.metrics.link;
        m.link_status_writes.get_or_create(&self.labels).inc();
        m.link_status_bytes
            .get_or_create(&self.labels)
            .inc_by(bytes as u64);
        m.link_status_truncated
            .get_or_create(&self.labels)
            .set(truncated as i64);
    }

    /// A failed or refused reconcile, by bounded kind.
    pub(super) fn error(&self, kind: &str) {
        self.metrics.link.error(&self.labels.cluster, kind);
    }

    /// The running remote refused the credentials of the link object `link` (a link
    /// Secret or a Link), counted where refusals of that object are: `link_errors` or
    /// `link_resource_errors`, by `reason`.
    pub(super) fn link_refused(&self, link: &ObjectReference, reason: &str) {
        let name = link.name.clone().unwrap_or_default();
        let links = &self.metrics.links;
        match link.kind.as_deref() {
            Some("ClusterProfile") => links
                .cluster_profile_errors
                .get_or_create(&crate::links::metrics::ClusterProfileErrorLabels {
                    cluster_profile: name,
                    reason: reason.into(),
                })
                .inc(),
            Some("Link") => links
                .link_resource_errors
                .get_or_create(&LinkResourceErrorLabels {
                    link: name,
                    reason: reason.into(),
                })
                .inc(),
            _ => links
                .link_errors
                .get_or_create(&LinkErrorLabels {
                    secret: name,
                    reason: reason.into(),
                })
                .inc(),
        };
    }

    /// The link was removed: its gauges go.
    pub(super) fn forget(&self) {
        self.metrics.link.forget(&self.labels.cluster);
    }
}

/// Observes the reconcile duration of its link when dropped.
pub(super) struct ReconcileTimer<'a> {
    metrics: &'a LinkMetrics,
    started: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        let m = &self.metrics.metrics.link.reconcile_duration;
        m.get_or_create(&self.metrics.labels)
            .observe(self.started.elapsed().as_secs_f64());
    }
}
