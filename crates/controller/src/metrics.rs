//! Prometheus metrics of the controller, all under the `service_mirror_` prefix.

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// Labels of per-cluster series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    /// The link's cluster name.
    pub cluster: String,
}

/// Labels of reconcile errors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The link's cluster name.
    pub cluster: String,
    /// The error kind ([`crate::Error::metric_label`]).
    pub kind: String,
}

/// Labels of local API writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// create, update or delete.
    pub verb: String,
    /// services, endpoints or namespaces.
    pub resource: String,
}

/// Labels of gateway probe series (Linkerd's names).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GatewayLabels {
    /// The gateway Service's name.
    pub gateway_name: String,
    /// The gateway Service's namespace.
    pub gateway_namespace: String,
    /// The link's cluster name.
    pub target_cluster_name: String,
}

/// Labels of the probe counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    /// The gateway Service's name.
    pub gateway_name: String,
    /// The gateway Service's namespace.
    pub gateway_namespace: String,
    /// The link's cluster name.
    pub target_cluster_name: String,
    /// "true" or "false".
    pub probe_successful: String,
}

/// Labels of link errors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LinkErrorLabels {
    /// The link Secret's name.
    pub secret: String,
    /// Why it was refused (the Event reason).
    pub reason: String,
}

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn probe_latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 16))
}

/// Every metric, shared by the link manager, the watchers and the writer.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Local mirror Services per cluster.
    pub mirrored_services: Family<ClusterLabels, Gauge>,
    /// 1 while the last remote watch call succeeded.
    pub remote_connected: Family<ClusterLabels, Gauge>,
    /// Unix time of the last event or list received from the remote cluster.
    pub last_sync: Family<ClusterLabels, Gauge<f64, AtomicU64>>,
    /// Time to reconcile one key.
    pub reconcile_duration: Family<ClusterLabels, Histogram, fn() -> Histogram>,
    /// Failed reconciles by kind.
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// Keys waiting to be reconciled, now or after a backoff.
    pub queue_depth: Family<ClusterLabels, Gauge>,
    /// Exported services not mirrored because the link holds its limit of mirrors.
    pub mirrors_refused: Family<ClusterLabels, Gauge>,
    /// Write requests to the local API.
    pub local_writes: Family<WriteLabels, Counter>,
    /// Local objects holding a mirror's name without being ours.
    pub ownership_conflicts: Family<ClusterLabels, Counter>,
    /// Refused or failing link Secrets.
    pub link_errors: Family<LinkErrorLabels, Counter>,
    /// Remote clusters being watched.
    pub links: Gauge,
    /// Full lists of a remote after the first one (expired watches, HTTP 410).
    pub remote_relists: Family<ClusterLabels, Counter>,
    /// 1 while this replica holds the leader Lease (or runs without election).
    pub leader: Gauge,
    /// 1 while the gateway answers its probes (Linkerd's `gateway_alive`).
    pub gateway_alive: Family<GatewayLabels, Gauge>,
    /// Probe round-trip time in milliseconds (Linkerd's `gateway_probe_latency_ms`).
    pub gateway_probe_latency_ms: Family<GatewayLabels, Histogram, fn() -> Histogram>,
    /// Probes sent (Linkerd's `gateway_probes`).
    pub gateway_probes: Family<ProbeLabels, Counter>,
    /// Requests of every Kubernetes client the controller builds.
    pub client: crate::kube_client::ClientMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// A fresh set of metrics in its own registry.
    pub fn new() -> Arc<Self> {
        let m = Self {
            registry: Mutex::new(Registry::default()),
            mirrored_services: Family::default(),
            remote_connected: Family::default(),
            last_sync: Family::default(),
            reconcile_duration: Family::new_with_constructor(reconcile_histogram),
            reconcile_errors: Family::default(),
            queue_depth: Family::default(),
            mirrors_refused: Family::default(),
            local_writes: Family::default(),
            ownership_conflicts: Family::default(),
            link_errors: Family::default(),
            links: Gauge::default(),
            remote_relists: Family::default(),
            leader: Gauge::default(),
            gateway_alive: Family::default(),
            gateway_probe_latency_ms: Family::new_with_constructor(probe_latency_histogram),
            gateway_probes: Family::default(),
            client: crate::kube_client::ClientMetrics::default(),
        };
        {
            let mut root = m.registry.lock();
            // Probe metrics keep Linkerd's unprefixed names so its dashboards work.
            root.register(
                "gateway_alive",
                "1 while the remote gateway answers its probes",
                m.gateway_alive.clone(),
            );
            root.register(
                "gateway_probe_latency_ms",
                "Gateway probe latency in milliseconds",
                m.gateway_probe_latency_ms.clone(),
            );
            root.register(
                "gateway_probes",
                "Gateway probes sent",
                m.gateway_probes.clone(),
            );
            let r = root.sub_registry_with_prefix("service_mirror");
            m.client.register(r);
            r.register(
                "mirrored_services",
                "Local mirror Services per linked cluster",
                m.mirrored_services.clone(),
            );
            r.register(
                "remote_connected",
                "1 while the remote cluster's watch is connected",
                m.remote_connected.clone(),
            );
            r.register(
                "last_sync_timestamp_seconds",
                "Unix time of the last data received from the remote cluster",
                m.last_sync.clone(),
            );
            r.register(
                "reconcile_duration_seconds",
                "Time to reconcile one mirror",
                m.reconcile_duration.clone(),
            );
            r.register(
                "reconcile_errors",
                "Failed reconciles by error kind",
                m.reconcile_errors.clone(),
            );
            r.register(
                "retry_queue_depth",
                "Keys waiting to be reconciled, now or after a backoff",
                m.queue_depth.clone(),
            );
            r.register(
                "mirrors_refused",
                "Exported services not mirrored because the link holds its limit of mirrors",
                m.mirrors_refused.clone(),
            );
            r.register(
                "local_writes",
                "Write requests to the local API by verb and resource",
                m.local_writes.clone(),
            );
            r.register(
                "ownership_conflicts",
                "Local objects holding a mirror's name without our labels",
                m.ownership_conflicts.clone(),
            );
            r.register(
                "link_errors",
                "Refused or failing link Secrets by reason",
                m.link_errors.clone(),
            );
            r.register("links", "Remote clusters being watched", m.links.clone());
            r.register("leader", "Whether this replica may write: it holds the leader Lease, or runs without election", m.leader.clone());
            r.register(
                "remote_relists",
                "Full lists of a remote cluster after the first (expired watches)",
                m.remote_relists.clone(),
            );
        }
        Arc::new(m)
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let r = self.registry.lock();
        prometheus_client::encoding::text::encode(&mut out, &r)
            .expect("writing to a String cannot fail");
        out
    }

    /// Per-cluster labels.
    pub fn cluster(cluster: &str) -> ClusterLabels {
        ClusterLabels {
            cluster: cluster.to_string(),
        }
    }

    /// Counts one local write request.
    pub fn write(&self, verb: &str, resource: &str) {
        self.local_writes
            .get_or_create(&WriteLabels {
                verb: verb.into(),
                resource: resource.into(),
            })
            .inc();
    }

    /// Drops the per-cluster gauges of an unlinked cluster (counters keep their totals).
    pub fn forget_cluster(&self, cluster: &str) {
        let l = Self::cluster(cluster);
        self.mirrored_services.remove(&l);
        self.remote_connected.remove(&l);
        self.last_sync.remove(&l);
        self.queue_depth.remove(&l);
        self.mirrors_refused.remove(&l);
    }

    /// Drops the gauge of a gateway no longer probed.
    pub fn forget_gateway(&self, labels: &GatewayLabels) {
        self.gateway_alive.remove(labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let m = Metrics::new();
        m.write("create", "services");
        m.reconcile_errors
            .get_or_create(&ErrorLabels {
                cluster: "east".into(),
                kind: "conflict".into(),
            })
            .inc();
        m.reconcile_duration
            .get_or_create(&Metrics::cluster("east"))
            .observe(0.01);
        m.mirrored_services
            .get_or_create(&Metrics::cluster("east"))
            .set(3);
        let text = m.encode();
        for line in [
            "service_mirror_local_writes_total{verb=\"create\",resource=\"services\"} 1",
            "service_mirror_reconcile_errors_total{cluster=\"east\",kind=\"conflict\"} 1",
            "service_mirror_mirrored_services{cluster=\"east\"} 3",
            "service_mirror_reconcile_duration_seconds_count{cluster=\"east\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        m.forget_cluster("east");
        assert!(
            !m.encode()
                .contains("service_mirror_mirrored_services{cluster=\"east\"}")
        );
    }
}
