//! Gateway probe metrics, with Linkerd's series names and labels (`gateway_enabled`,
//! `gateway_alive`, `gateway_latency`, `gateway_probe_latency_ms`, `gateway_probes`), so
//! its dashboards and `linkerd multicluster gateways`/`check` read them.

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

/// Counters Linkerd's Go controller exposes without the `_total` suffix: the Prometheus
/// text format also carries them under that name (see `metrics/text_format.rs`).
pub(crate) const UNSUFFIXED_COUNTERS: &[&str] = &["gateway_probes"];

/// The gateway probe families of the process.
#[derive(Debug)]
pub(crate) struct GatewayFamilies {
    /// 1 while the gateway has a prober (Linkerd: while its probe worker runs).
    pub(crate) enabled: Family<GatewayLabels, Gauge>,
    /// 1 while the gateway answers its probes.
    pub(crate) alive: Family<GatewayLabels, Gauge>,
    /// Round-trip time of the last successful probe in milliseconds.
    pub(crate) latency: Family<GatewayLabels, Gauge>,
    /// Probe round-trip time in milliseconds.
    pub(crate) probe_latency_ms: Family<GatewayLabels, Histogram, fn() -> Histogram>,
    /// Probes sent.
    pub(crate) probes: Family<ProbeLabels, Counter>,
}

impl Default for GatewayFamilies {
    fn default() -> Self {
        Self {
            enabled: Family::default(),
            alive: Family::default(),
            latency: Family::default(),
            probe_latency_ms: Family::new_with_constructor(probe_latency_histogram),
            probes: Family::default(),
        }
    }
}

impl GatewayFamilies {
    /// Registers the families, unprefixed (Linkerd's names).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "gateway_enabled",
            "1 while the remote gateway is probed",
            self.enabled.clone(),
        );
        r.register(
            "gateway_alive",
            "1 while the remote gateway answers its probes",
            self.alive.clone(),
        );
        r.register(
            "gateway_latency",
            "Latency of the last successful gateway probe in milliseconds",
            self.latency.clone(),
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

    /// A prober runs for the gateway (`gateway_enabled` 1).
    pub(super) fn enabled(&self) {
        self.metrics
            .gateway
            .enabled
            .get_or_create(&self.labels)
            .set(1);
    }

    /// One probe answered (or not) after `latency`.
    pub(super) fn probed(&self, latency: Duration, ok: bool) {
        let m = &self.metrics.gateway;
        m.probe_latency_ms
            .get_or_create(&self.labels)
            .observe(latency.as_secs_f64() * 1000.0);
        m.probes.get_or_create(&self.probes[ok as usize]).inc();
    }

    /// The verdict after a probe, and the latency of a successful one
    /// (`gateway_latency` follows successes only, as Linkerd's).
    pub(super) fn verdict(&self, alive: bool, success_ms: Option<u64>) {
        let m = &self.metrics.gateway;
        m.alive.get_or_create(&self.labels).set(alive as i64);
        if let Some(ms) = success_ms {
            m.latency.get_or_create(&self.labels).set(ms as i64);
        }
    }

    /// The gateway is no longer probed: its gauges go (the cumulative histogram and
    /// counter stay, so rates across a prober restart stay right).
    pub(super) fn forget(&self) {
        let m = &self.metrics.gateway;
        m.enabled.remove(&self.labels);
        m.alive.remove(&self.labels);
        m.latency.remove(&self.labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gw(name: &str) -> GatewayRef {
        GatewayRef {
            name: name.into(),
            namespace: "mc".into(),
        }
    }

    const LABELS: &str =
        "gateway_name=\"gw\",gateway_namespace=\"mc\",target_cluster_name=\"east\"";

    #[test]
    fn linkerd_series_in_both_formats_and_gauges_go_with_the_prober() {
        let metrics = Metrics::new();
        let m = ProbeMetrics::new(metrics.clone(), "east", &gw("gw"));
        m.enabled();
        m.probed(Duration::from_millis(12), true);
        m.verdict(true, Some(12));
        m.probed(Duration::from_millis(40), false);
        m.verdict(true, None);
        metrics.writer.write("create", "services");
        let om = metrics.encode();
        let text = metrics.encode_text();
        if let Ok(dir) = std::env::var("SERVICE_MIRROR_DUMP_METRICS") {
            std::fs::write(format!("{dir}/openmetrics.txt"), &om).unwrap();
            std::fs::write(format!("{dir}/text.txt"), &text).unwrap();
        }
        let both = [
            "# TYPE gateway_enabled gauge".to_string(),
            format!("gateway_enabled{{{LABELS}}} 1"),
            "# TYPE gateway_alive gauge".to_string(),
            format!("gateway_alive{{{LABELS}}} 1"),
            "# TYPE gateway_latency gauge".to_string(),
            format!("gateway_latency{{{LABELS}}} 12"),
            "# TYPE gateway_probe_latency_ms histogram".to_string(),
            format!("gateway_probe_latency_ms_count{{{LABELS}}} 2"),
            format!("gateway_probes_total{{{LABELS},probe_successful=\"true\"}} 1"),
            format!("gateway_probes_total{{{LABELS},probe_successful=\"false\"}} 1"),
        ];
        for line in &both {
            assert!(om.lines().any(|l| l == line), "{line} missing in\n{om}");
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(om.lines().any(|l| l == "# TYPE gateway_probes counter"));
        assert!(om.ends_with("# EOF\n"));
        for line in [
            "# TYPE gateway_probes_total counter".to_string(),
            "# TYPE gateway_probes counter".to_string(),
            format!("gateway_probes{{{LABELS},probe_successful=\"true\"}} 1"),
            format!("gateway_probes{{{LABELS},probe_successful=\"false\"}} 1"),
            "# TYPE service_mirror_local_writes_total counter".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
        m.forget();
        let gone = metrics.encode_text();
        for name in ["gateway_enabled{", "gateway_alive{", "gateway_latency{"] {
            assert!(!gone.contains(name), "{name} left after forget:\n{gone}");
        }
        assert!(gone.contains("gateway_probe_latency_ms_count{"), "{gone}");
    }
}
