//! What a link controller is started with: plain tunables ([`LinkConfig`]) and the
//! things it uses ([`LinkDeps`]).

use crate::gateway::{GatewaySource, ProbeConfig, ProbeRedirect, Resolver, SystemResolver};
use crate::metrics::Metrics;
use service_mirror_core::{
    AddressPolicy, EndpointsMode, ExportRule, NamespaceFilter, Selector, StalePolicy,
};
use std::sync::Arc;
use std::time::Duration;

/// Tunables of a link controller (from the command line).
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// Reconcile workers running in parallel (keys are still serialised one by one).
    pub workers: usize,
    /// Fast retries of a failing key before it falls back to slow retries.
    pub requeue_limit: u32,
    /// How often gateway hostnames are resolved again.
    pub endpoint_refresh_period: Duration,
    /// Remote namespaces whose exported Services are mirrored.
    pub namespaces: NamespaceFilter,
    /// How long a gateway probe may take before it counts as failed.
    pub probe_timeout: Duration,
    /// Consecutive failed probes before a gateway is considered down.
    pub probe_failure_threshold: u32,
    /// Most mirrors one link may create; `None`: no limit. Mirrors that exist are
    /// kept whatever the limit.
    pub max_mirrors: Option<usize>,
    /// Which endpoint objects mirrors carry (`--endpoints-mode`): Endpoints,
    /// EndpointSlices, or both (default).
    pub endpoints_mode: EndpointsMode,
    /// Which remote Services are mirrored: the gateway annotations (Secret links,
    /// default) or a `Link`'s selectors.
    pub export_rule: ExportRule,
    /// The gateway of a `Link` (`None`: gateways are remote Services, or the Link has
    /// none). Used only with [`ExportRule::Selectors`].
    pub link_gateway: Option<GatewaySource>,
    /// Create a mirror's namespace when it is missing locally (Secret links always do,
    /// as the 2020 mirror did; Links only with `--enable-namespace-creation`, as
    /// Linkerd): otherwise the Service is skipped, with an Event.
    pub create_namespaces: bool,
    /// Which gateway addresses mirrors and probes may use (`--gateway-address-deny`,
    /// `--gateway-address-allow`); the default refuses the built-in denials.
    pub gateway_address_policy: AddressPolicy,
    /// What an unanswering remote does to its mirrors (`--remote-grace`,
    /// `--stale-after`, `--stale-delete-after`); the default only reports it.
    pub stale_policy: StalePolicy,
    /// A `Link`'s `federatedServiceSelector`: its remote members of federated Services
    /// (`None`: a Secret link, no members).
    pub federated_selector: Option<Selector>,
    /// Mirror remote headless Services whose slices carry hostnames as a headless mirror
    /// plus one endpoint mirror per pod (`--enable-headless-services`); off: as a
    /// ClusterIP mirror, like any other. On, every link watches the remote slices.
    pub enable_headless_services: bool,
    /// A headless Service's address without `hostname` takes its `targetRef.name`
    /// (`--headless-hostname-from-target-ref`, Linkerd #10916).
    pub headless_hostname_from_target_ref: bool,
    /// Most bytes a response of the remote may carry without a newline
    /// (`--max-remote-response-bytes`; 0: no limit): see frame_limit.rs.
    pub max_remote_response_bytes: usize,
    /// Most bytes of the remote Services cache, a list in progress included
    /// (`--max-remote-cache-bytes`; `None`: no limit): see cache.rs.
    pub max_remote_cache_bytes: Option<usize>,
    /// This cluster's name in the cluster set (`--mcs-cluster-name`, else the
    /// ClusterProperty `id.k8s.io` when the start read it): a remote Service whose
    /// `service-mirror.io/export-to` does not list it is not mirrored. `None`: unknown,
    /// so no narrowed Service is mirrored.
    pub local_cluster_name: Option<String>,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            workers: 4,
            requeue_limit: 3,
            endpoint_refresh_period: Duration::from_secs(60),
            namespaces: NamespaceFilter::default(),
            probe_timeout: Duration::from_secs(5),
            probe_failure_threshold: 3,
            max_mirrors: None,
            endpoints_mode: EndpointsMode::default(),
            export_rule: ExportRule::default(),
            link_gateway: None,
            create_namespaces: true,
            gateway_address_policy: AddressPolicy::default(),
            stale_policy: StalePolicy::default(),
            federated_selector: None,
            enable_headless_services: false,
            headless_hostname_from_target_ref: false,
            max_remote_response_bytes: crate::frame_limit::DEFAULT_MAX_RESPONSE_BYTES,
            max_remote_cache_bytes: Some(super::cache::DEFAULT_MAX_REMOTE_CACHE_BYTES),
            local_cluster_name: None,
        }
    }
}

/// What a link controller uses and may share with others.
#[derive(Debug, Clone)]
pub struct LinkDeps {
    /// Hostname resolver for gateway ingress hostnames.
    pub resolver: Arc<dyn Resolver>,
    /// Where the controller reports its metrics.
    pub metrics: Arc<Metrics>,
    /// Where probes connect instead of the gateway's address, if set.
    pub probe_redirect: Option<ProbeRedirect>,
    /// When set, the controller writes only while this says true (leader election);
    /// caches stay warm meanwhile, and every key is looked at again when it turns true.
    pub leader: Option<crate::leader::Leadership>,
    /// Bounds the reconciles that create mirrors; clones share it.
    pub create_limit: crate::writer::CreateLimit,
    /// The link Secret, where link-wide Events (the mirror limit) are recorded.
    pub link_secret: Option<k8s_openapi::api::core::v1::ObjectReference>,
    /// The process's Event recorder (built once in `run`); `None`: one of the link's
    /// own, without an instance name (tests and embedders).
    pub recorder: Option<crate::events::EventRecorder>,
    /// The process's federation, fed with this link's members and gateway when the
    /// link has a `federatedServiceSelector` (`None`: no federation).
    pub federation: Option<crate::federation::Federation>,
    /// The link source's creation time (the oldest Link gives federated metadata).
    pub link_created: Option<k8s_openapi::jiff::Timestamp>,
    /// The process's MCS component, which reads this link's ServiceExports while the
    /// link runs (`None`: MCS off).
    pub mcs: Option<crate::mcs::Mcs>,
    /// The local cluster's service and pod CIDRs, refused as gateway addresses with no
    /// flag (`local_networks::spawn`; the default knows none).
    pub local_networks: crate::local_networks::LocalNetworks,
    /// The per-link write gates (`write_leases.rs`): when set, the link writes only
    /// while the process holds its write Lease `service-mirror-write-<cluster>` (as
    /// well as the leadership), so it never writes beside Linkerd's own controller.
    pub write_gates: Option<crate::write_leases::WriteGates>,
}

impl Default for LinkDeps {
    fn default() -> Self {
        Self {
            resolver: Arc::new(SystemResolver),
            metrics: Metrics::new(),
            probe_redirect: None,
            leader: None,
            create_limit: crate::writer::default_create_limit(),
            link_secret: None,
            recorder: None,
            federation: None,
            link_created: None,
            mcs: None,
            local_networks: Default::default(),
            write_gates: None,
        }
    }
}

impl LinkConfig {
    /// How the gateway probes of this link run.
    pub(crate) fn probes(&self, deps: &LinkDeps) -> ProbeConfig {
        ProbeConfig {
            timeout: self.probe_timeout,
            failure_threshold: self.probe_failure_threshold,
            redirect: deps.probe_redirect.clone(),
        }
    }
}
