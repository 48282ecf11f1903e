//! The controller's Prometheus registry. Each component defines its own metric families
//! and registers them: the link controllers (`link_controller/metrics.rs`), gateway
//! probes (`gateway/metrics.rs`), the writer (`writer.rs`), leader election
//! (`leader.rs`) and the write Leases (`write_leases.rs`), the link manager (`links/metrics.rs`), the Kubernetes clients
//! (`kube_client.rs`) and the runtime's workers (`runtime/metrics.rs`). This file only holds them together and encodes them: everything
//! under the `service_mirror_` prefix except Linkerd's gateway series, which keep their
//! unprefixed names so its dashboards and `linkerd multicluster gateways` work.

mod heap;
pub(crate) mod text_format;

pub use heap::{HeapSource, HeapStats, set_heap_source};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::Registry;
use std::sync::Arc;

use crate::clusterset_dns::metrics::DnsFamilies;
use crate::federation::metrics::FederationFamilies;
use crate::gateway::metrics::GatewayFamilies;
use crate::kube_client::ClientMetrics;
use crate::leader::LeaderFamilies;
use crate::link_controller::metrics::LinkFamilies;
use crate::links::metrics::LinksFamilies;
use crate::local_networks::LocalNetworkFamilies;
use crate::mcs::metrics::McsFamilies;
use crate::runtime::metrics::RuntimeFamilies;
use crate::write_leases::WriteLeaseFamilies;
use crate::writer::WriterFamilies;

/// The text of what `register` registers in a registry of its own (tests of one
/// component's families).
#[cfg(test)]
pub(crate) fn registered_text(register: impl FnOnce(&mut Registry)) -> String {
    let mut r = Registry::default();
    register(&mut r);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
    out
}

/// Labels of per-cluster series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    /// The link's cluster name.
    pub cluster: String,
}

impl ClusterLabels {
    /// The labels of link `cluster`.
    pub fn of(cluster: &str) -> Self {
        Self {
            cluster: cluster.to_string(),
        }
    }
}

/// Every metric family of one controller process, each registered by its component.
pub struct Metrics {
    registry: Registry,
    /// The per-link controllers' series (labelled by cluster).
    pub(crate) link: LinkFamilies,
    /// Gateway probe series (Linkerd's names).
    pub(crate) gateway: GatewayFamilies,
    /// Writes to the local cluster.
    pub(crate) writer: WriterFamilies,
    /// Leader election.
    pub(crate) leader: LeaderFamilies,
    /// The link manager: links and refused link Secrets.
    pub(crate) links: LinksFamilies,
    /// Requests of every Kubernetes client the controller builds.
    pub(crate) client: ClientMetrics,
    /// Writes to the per-link write Leases.
    pub(crate) write_leases: WriteLeaseFamilies,
    /// Federated Services.
    pub(crate) federation: FederationFamilies,
    /// The Multi-Cluster Services API's exports.
    pub(crate) mcs: McsFamilies,
    /// The local networks the gateway address policy refuses.
    pub(crate) local_networks: LocalNetworkFamilies,
    /// Every component's reconciles (the runtime's workers).
    pub(crate) runtime: RuntimeFamilies,
    /// The clusterset.local DNS server.
    pub(crate) dns: DnsFamilies,
    /// The allocator's account of the heap.
    heap: heap::HeapFamilies,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// A fresh set of metrics in its own registry.
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::default();
        let (link, gateway, writer, leader, links, client, write_leases) = Default::default();
        let federation = FederationFamilies::default();
        let mcs = McsFamilies::default();
        let local_networks = LocalNetworkFamilies::default();
        let runtime = RuntimeFamilies::default();
        let dns = DnsFamilies::default();
        let heap = heap::HeapFamilies::default();
        let m = {
            let mut m = Self {
                registry: Registry::default(),
                link,
                gateway,
                writer,
                leader,
                links,
                client,
                write_leases,
                federation,
                mcs,
                local_networks,
                runtime,
                dns,
                heap,
            };
            m.gateway.register(&mut registry);
            let prefixed = registry.sub_registry_with_prefix("service_mirror");
            m.link.register(prefixed);
            m.writer.register(prefixed);
            m.links.register(prefixed);
            m.leader.register(prefixed);
            m.client.register(prefixed);
            m.write_leases.register(prefixed);
            m.federation.register(prefixed);
            m.mcs.register(prefixed);
            m.local_networks.register(prefixed);
            m.runtime.register(prefixed);
            m.dns.register(prefixed);
            m.heap.register(prefixed);
            m.registry = registry;
            m
        };
        Arc::new(m)
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        self.heap.update();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// The metrics in the Prometheus text format 0.0.4, Linkerd's counters also under
    /// their unsuffixed names (see `metrics/text_format.rs`).
    pub fn encode_text(&self) -> String {
        text_format::to_text(&self.encode(), crate::gateway::metrics::UNSUFFIXED_COUNTERS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let m = Metrics::new();
        m.writer.write("create", "services");
        m.link.error("east", "conflict");
        m.link
            .reconcile_duration
            .get_or_create(&ClusterLabels::of("east"))
            .observe(0.01);
        m.link
            .mirrored_services
            .get_or_create(&ClusterLabels::of("east"))
            .set(3);
        m.leader.leading.set(1);
        let text = m.encode();
        for line in [
            "service_mirror_local_writes_total{verb=\"create\",resource=\"services\"} 1",
            "service_mirror_reconcile_errors_total{cluster=\"east\",kind=\"conflict\"} 1",
            "service_mirror_mirrored_services{cluster=\"east\"} 3",
            "service_mirror_reconcile_duration_seconds_count{cluster=\"east\"} 1",
            "service_mirror_leader 1",
            "# TYPE service_mirror_links gauge",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        m.link.forget("east");
        assert!(
            !m.encode()
                .contains("service_mirror_mirrored_services{cluster=\"east\"}")
        );
    }
}
