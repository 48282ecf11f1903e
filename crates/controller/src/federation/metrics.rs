//! The federation's metric families (bounded labels: a reason, never a Service name).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of the federation's problems.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    /// The Event reason.
    pub(crate) reason: String,
}

/// The federation's families.
#[derive(Debug, Default)]
pub(crate) struct FederationFamilies {
    /// Federated Services of ours (desired present).
    pub(crate) services: Gauge,
    /// Problems reported (once per episode): refused members, port conflicts,
    /// foreign `<svc>-federated` Services, failed writes.
    pub(crate) problems: Family<ReasonLabels, Counter>,
}

impl FederationFamilies {
    /// Registers the families (under the registry's prefix).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "federated_services",
            "Federated Services (<svc>-federated) this controller maintains",
            self.services.clone(),
        );
        r.register(
            "federated_problems",
            "Federation problems reported, by Event reason (InvalidService, FederatedPortConflict, FederatedConflict, FederatedWriteFailed, InvalidTrafficAnnotation)",
            self.problems.clone(),
        );
    }

    /// Counts one reported problem.
    pub(crate) fn problem(&self, reason: &str) {
        self.problems
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }
}
