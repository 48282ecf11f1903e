//! Gateway probe metrics, with Linkerd's series names and labels (`gateway_alive`,
//! `gateway_probe_latency_ms`, `gateway_probes`), so its dashboards and tools read them.

use crate::metrics::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use service_mirror_core::GatewayRef;
use std::sync::Arc;
use std::time::Duration;

/// Labels of gateway probe series (Linkerd's names).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct GatewayLabels {
    /// The gateway Service's name.
    pub(crate) gateway_name: String,
    /// The gateway Service's namespace.
    pub(crate) gateway_namespace: String,
    /// The link's cluster name.
    pub(crate) target_cluster_name: String,
}

/// Labels of the probe counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ProbeLabels {
    /// The gateway Service's name.
    pub(crate) gateway_name: String,
    /// The gateway Service's namespace.
    pub(crate) gateway_namespace: String,
    /// The link's cluster name.
    pub(crate) target_cluster_name: String,
    /// "true" or "false".
    pub(crate) probe_successful: String,
}

fn probe_latency_histogram() -> Histogram {
    // 1 ms to ~33 s.
    Histogram::new(exponential_buckets(1.0, 2.0, 16))
}

/// The gateway probe families of the process.
#[derive(Debug)]
pub(crate) struct GatewayFamilies {
    /// 1 while the gateway answers its probes.
    pub(crate) alive: Family<GatewayLabels, Gauge>,
    /// Probe round-trip time in milliseconds.
    pub(crate) probe_latency_ms: Family<GatewayLabels, Histogram, fn() -> Histogram>,
    /// Probes sent.
    pub(crate) probes: Family<ProbeLabels, Counter>,
}

impl Default for GatewayFamilies {
    fn default() -> Self {
        Self {
            alive: Family::default(),
            probe_latency_ms: Family::new_with_constructor(probe_latency_histogram),
            probes: Family::default(),
        }
    }
}

impl GatewayFamilies {
    /// Registers the families, unprefixed (Linkerd's names).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "gateway_alive",
            "1 while the remote gateway answers its probes",
            self.alive.clone(),
        );
        r.register(
            "gateway_probe_latency_ms",
            "Gateway probe latency in milliseconds",
            self.probe_latency_ms.clone(),
        );
        r.register("gateway_probes", "Gateway probes sent", self.probes.clone());
    }
}

/// The probe metrics of one gateway, labels bound once (Linkerd's series names). A
/// series appears with its first observation, as before the first probe nothing is
/// known.
pub(crate) struct ProbeMetrics {
    metrics: Arc<Metrics>,
    labels: GatewayLabels,
    probes: [ProbeLabels; 2],
}

impl ProbeMetrics {
    /// The series of gateway `gw` of link `cluster`.
    pub(crate) fn new(metrics: Arc<Metrics>, cluster: &str, gw: &GatewayRef) -> Self {
        let labels = GatewayLabels {
            gateway_name: gw.name.clone(),
            gateway_namespace: gw.namespace.clone(),
            target_cluster_name: cluster.to_string(),
        };
        let probes = [false, true].map(|ok| ProbeLabels {
            gateway_name: labels.gateway_name.clone(),
            gateway_namespace: labels.gateway_namespace.clone(),
            target_cluster_name: labels.target_cluster_name.clone(),
            probe_successful: ok.to_string(),
        });
        Self {
            metrics,
            labels,
            probes,
        }
    }

    /// One probe answered (or not) after `latency`.
    pub(super) fn probed(&self, latency: Duration, ok: bool) {
        let m = &self.metrics.gateway;
        m.probe_latency_ms
            .get_or_create(&self.labels)
            .observe(latency.as_secs_f64() * 1000.0);
        m.probes.get_or_create(&self.probes[ok as usize]).inc();
    }

    /// The verdict after a probe.
    pub(super) fn alive(&self, alive: bool) {
        self.metrics
            .gateway
            .alive
            .get_or_create(&self.labels)
            .set(alive as i64);
    }

    /// The gateway is no longer probed: its `gateway_alive` series goes.
    pub(super) fn forget(&self) {
        self.metrics.gateway.alive.remove(&self.labels);
    }
}
