//! The gateways of one link: where its mirrors' Endpoints point, and whether they are
//! alive.
//!
//! One component owns hostname resolution ([`resolve`]), the health checks
//! ([`prober`]) and what is known per gateway. Reconcile asks it once per key
//! ([`Gateways::resolve`]) with the gateway's [`GatewaySource`], parsed once; probers
//! report verdict changes on a channel that the link controller turns into queued keys.
//! The one thing a prober asks of the controller is a narrow `in_use` closure (does any
//! mirror still use this gateway?), given at construction; it reads the link's index,
//! so the lock order is prober table, then index, and nothing takes them the other way.

pub(crate) mod metrics;
pub mod prober;
pub(crate) mod report;
pub mod resolve;

pub use prober::{ProbeConfig, ProbeRedirect, ProbeState, ProbeTarget};
pub use resolve::{CachingResolver, Lookup, Resolver, SystemResolver};

use crate::metrics::Metrics;
use parking_lot::Mutex;
use prober::{InUse, Probers};
use service_mirror_core::{
    AddressPolicy, GatewayError, GatewayRef, GatewaySpec, ProbeSpec, Refused, ResolvedGateway,
    ServiceKey, gateway_spec, probe_spec,
};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Where a gateway's addresses, port and probe settings come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewaySource {
    /// A gateway Service of the remote cluster (Secret links), parsed once by the pure
    /// core.
    RemoteService {
        /// Its ingress addresses, hostnames and `mc-gateway` port.
        spec: GatewaySpec,
        /// Its probe settings.
        probe: ProbeSpec,
    },
    /// The gateway a `Link` resource names: `gatewayAddress`, `gatewayPort`,
    /// `gatewayIdentity` and `probeSpec`, checked when the Link was read.
    Link {
        /// Its addresses, hostnames, port and identity.
        spec: GatewaySpec,
        /// Its probe settings.
        probe: ProbeSpec,
    },
}

impl GatewaySource {
    /// Parses a remote gateway Service (once per reconcile).
    pub fn from_service(svc: &k8s_openapi::api::core::v1::Service) -> Result<Self, GatewayError> {
        Ok(Self::RemoteService {
            spec: gateway_spec(svc)?,
            probe: probe_spec(svc),
        })
    }

    /// Hostnames to resolve to addresses.
    pub fn hostnames(&self) -> &[String] {
        &self.parts().0.hostnames
    }

    fn parts(&self) -> (&GatewaySpec, &ProbeSpec) {
        match self {
            Self::RemoteService { spec, probe } | Self::Link { spec, probe } => (spec, probe),
        }
    }
}

/// A gateway with more addresses than this is probed on its first address alone, as
/// Linkerd probes every gateway, and that verdict is every address's: each of 1,200
/// addresses (a gateway `tests/wire/links.rs` runs) probed every 3 s would be 400 probes a
/// second for one gateway. Up to it, every address is probed (21 probes a second at
/// most, at the default 3 s period) and goes not ready alone.
pub(crate) const MAX_PROBED_ADDRESSES: usize = 64;

/// Which gateway addresses a link may use: the operator's flags and the local
/// cluster's own networks (kept current), the two inputs of the core's policy.
#[derive(Clone, Debug, Default)]
pub(crate) struct Policy {
    /// `--gateway-address-deny/allow` on top of the built-in denials.
    pub(crate) flags: AddressPolicy,
    /// The local service and pod CIDRs, refused with no flag.
    pub(crate) local: crate::local_networks::LocalNetworks,
}

/// What [`Gateways::resolve`] found for one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Resolution {
    /// Addresses, port and verdict; None when the gateway is unusable (the mirror is
    /// kept without endpoints).
    pub(crate) gateway: Option<ResolvedGateway>,
    /// Look at the key again this soon: a hostname of the gateway failed to resolve.
    pub(crate) retry_after: Option<Duration>,
    /// Set once per gateway and set of refused addresses (not per reconcile): what the
    /// address policy refused, for a Warning Event on the link.
    pub(crate) refused_note: Option<String>,
    /// Set once per gateway and reason it is unusable (missing, no ingress, no
    /// `mc-gateway` port): for a Warning Event on the link.
    pub(crate) unusable_note: Option<String>,
}

/// The Event reason of a refused-address note.
pub(crate) const REFUSED_REASON: &str = "GatewayAddressRefused";
/// The Event reason of an unusable-gateway note.
pub(crate) const UNUSABLE_REASON: &str = "GatewayUnusable";

impl Resolution {
    /// The notes to record as Warning Events on the link, with their reasons. Each is
    /// set once per gateway and episode by whichever caller resolved it first (a
    /// mirror's reconcile or the Link gateway's report), so every caller must record
    /// what it gets: a note dropped by one is never given to another.
    pub(crate) fn notes(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            (REFUSED_REASON, self.refused_note.as_deref()),
            (UNUSABLE_REASON, self.unusable_note.as_deref()),
        ]
        .into_iter()
        .filter_map(|(reason, note)| Some((reason, note?)))
    }
}

/// The gateways of one link.
pub(crate) struct Gateways {
    cluster: String,
    resolver: CachingResolver,
    probers: Probers,
    /// Gateways last resolved with hostnames: looked at again every refresh period.
    by_hostname: Mutex<HashSet<GatewayRef>>,
    /// Which gateway addresses may be used.
    policy: Policy,
    /// The refusals last reported per gateway: a change is reported again.
    reported: Mutex<HashMap<GatewayRef, Vec<Refused>>>,
    /// Why each unusable gateway was last reported unusable: said again only on a
    /// change, so one missing gateway of 1,000 mirrors is one Event, not 1,000.
    unusable: Mutex<HashMap<GatewayRef, GatewayError>>,
    metrics: Arc<Metrics>,
}

impl Gateways {
    /// The gateways of link `cluster`. `in_use` tells a prober whether any mirror still
    /// uses its gateway; verdict changes come out of the returned receiver.
    pub(crate) fn new(
        cluster: &str,
        resolver: Arc<dyn Resolver>,
        policy: Policy,
        probes: ProbeConfig,
        metrics: Arc<Metrics>,
        in_use: InUse,
        cancel: CancellationToken,
    ) -> (Self, mpsc::UnboundedReceiver<GatewayRef>) {
        let (verdicts, changed) = mpsc::unbounded_channel();
        let gateways = Self {
            cluster: cluster.to_string(),
            resolver: CachingResolver::new(resolver),
            probers: Probers::new(cluster, probes, metrics.clone(), in_use, verdicts, cancel),
            by_hostname: Mutex::default(),
            policy,
            reported: Mutex::default(),
            unusable: Mutex::default(),
            metrics,
        };
        (gateways, changed)
    }

    /// The gateway `gw` of `key` from `source` (None: the gateway Service is not in the
    /// remote cache): its addresses (hostnames resolved), port and probe verdict,
    /// (re)starting or stopping its prober as needed.
    pub(crate) async fn resolve(
        &self,
        key: &ServiceKey,
        gw: &GatewayRef,
        source: Option<Result<GatewaySource, GatewayError>>,
    ) -> Resolution {
        let source = match source {
            None => Err(GatewayError::NotFound),
            Some(source) => source,
        };
        let unusable_note = self.report_unusable(key, gw, source.as_ref().err());
        let source = source.ok();
        let hostnames = source.as_ref().map(|s| s.hostnames()).unwrap_or_default();
        {
            let mut by_hostname = self.by_hostname.lock();
            match hostnames.is_empty() {
                true => by_hostname.remove(gw),
                false => by_hostname.insert(gw.clone()),
            };
        }
        let (resolved, refused) = match &source {
            Some(source) => self.addresses(gw, source).await,
            None => (None, Vec::new()),
        };
        let refused_note = self.report_refused(gw, refused, resolved.is_none());
        let retry_after = hostnames
            .iter()
            .any(|h| self.resolver.failing(h))
            .then_some(resolve::RETRY_FAILED_AFTER);
        let gateway = match resolved {
            None => {
                self.probers.alive(gw, None, &[]);
                None
            }
            Some((resolved, probe)) => {
                // Every accepted address is probed, each with its own verdict (sorted, as
                // the mirror lists them); past MAX_PROBED_ADDRESSES, the first alone, its
                // verdict the gateway's.
                let each = resolved.addresses.len() <= MAX_PROBED_ADDRESSES;
                let probed = if each { resolved.addresses.len() } else { 1 };
                let target = probe.port.map(|port| ProbeTarget {
                    addrs: resolved.addresses[..probed]
                        .iter()
                        .map(|ip| SocketAddr::new(*ip, port))
                        .collect(),
                    path: probe.path.clone(),
                    period: probe.period,
                });
                let verdict = self.probers.alive(gw, target, &probe.warnings);
                let dead = if each { verdict.dead } else { Vec::new() };
                Some(resolved.with_alive(verdict.alive).with_dead(dead))
            }
        };
        Resolution {
            gateway,
            retry_after,
            refused_note,
            unusable_note,
        }
    }

    /// Reports `gw` unusable for `error` when that differs from its last report (a log
    /// line, `gateway_unusable_total{reason}` and the returned Event note); a usable
    /// gateway clears its report, so a relapse is said again.
    fn report_unusable(
        &self,
        key: &ServiceKey,
        gw: &GatewayRef,
        error: Option<&GatewayError>,
    ) -> Option<String> {
        let cluster = &self.cluster;
        let Some(error) = error else {
            self.unusable.lock().remove(gw);
            return None;
        };
        if self
            .unusable
            .lock()
            .insert(gw.clone(), error.clone())
            .as_ref()
            == Some(error)
        {
            return None;
        }
        tracing::warn!(%cluster, %key, gateway = %gw, %error, "gateway unusable; its mirrors are kept without endpoints");
        self.metrics.link.gateway_unusable(cluster, error.reason());
        Some(format!(
            "gateway {gw} of cluster {cluster} is unusable: {error}; its mirrors (first seen: {key}) are kept without endpoints until it is fixed"
        ))
    }

    /// Reports the addresses of `gw` the policy refused, when they differ from the last
    /// report (a log line, the metric and the returned Event note); `unusable`: no
    /// address was left.
    fn report_refused(
        &self,
        gw: &GatewayRef,
        refused: Vec<Refused>,
        unusable: bool,
    ) -> Option<String> {
        {
            let mut reported = self.reported.lock();
            let last = reported.get(gw).map(Vec::as_slice).unwrap_or_default();
            if last == refused.as_slice() {
                return None;
            }
            match refused.is_empty() {
                true => reported.remove(gw),
                false => reported.insert(gw.clone(), refused.clone()),
            };
        }
        if refused.is_empty() {
            return None;
        }
        let cluster = &self.cluster;
        for r in &refused {
            self.metrics
                .link
                .gateway_address_refused(cluster, r.by.label());
        }
        let list = refused
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let outcome = match unusable {
            true => "no address is left: its mirrors have no endpoints",
            false => "its other addresses are used",
        };
        let note = format!(
            "gateway {gw} of cluster {cluster}: refused addresses by the gateway address policy (the local cluster's service and pod CIDRs, --gateway-address-deny/--gateway-address-allow): {list}; {outcome}"
        );
        tracing::warn!(%cluster, gateway = %gw, refused = %list, unusable, "gateway addresses refused by the address policy");
        Some(note)
    }

    /// The addresses of a usable gateway that the policy accepts and how to probe it
    /// (None without an accepted address), and the refused addresses.
    async fn addresses(
        &self,
        gw: &GatewayRef,
        source: &GatewaySource,
    ) -> (Option<(ResolvedGateway, ProbeSpec)>, Vec<Refused>) {
        let cluster = &self.cluster;
        let (spec, probe) = source.parts();
        if !spec.invalid_ingress.is_empty() {
            tracing::warn!(%cluster, gateway = %gw, invalid = ?spec.invalid_ingress, "ignoring invalid gateway ingress entries");
        }
        // Not before the local networks were read once: the set starts empty.
        self.policy.local.first_read().await;
        let local = self.policy.local.current();
        let flags = &self.policy.flags;
        let (mut accepted, mut refused) = flags.partition_in(spec.ips.iter().copied(), &local);
        for host in &spec.hostnames {
            match self.resolver.resolve(host).await {
                Ok(ips) => {
                    let (ok, denied) = flags.partition_in(ips, &local);
                    accepted.extend(ok);
                    refused.extend(denied);
                }
                Err(e) => {
                    tracing::warn!(%cluster, gateway = %gw, error = %e, "gateway hostname unresolved; retried every endpoint refresh period")
                }
            }
        }
        refused.sort();
        refused.dedup();
        let mut spec = spec.clone();
        spec.ips.clear();
        let resolved = spec.into_resolved(accepted);
        let usable = !resolved.addresses.is_empty();
        (usable.then(|| (resolved, probe.clone())), refused)
    }

    /// What the prober of `gw` knows; None when the gateway is not probed.
    pub(crate) fn probe_state(&self, gw: &GatewayRef) -> Option<ProbeState> {
        self.probers.state(gw)
    }

    /// Every endpoint refresh period: forgets resolved hostnames (and the refusals of
    /// gateways no longer in use) and returns the gateways among `in_use` that are given
    /// by hostname (their mirrors are looked at again; writes happen only if addresses
    /// changed).
    pub(crate) fn refresh(&self, in_use: Vec<GatewayRef>) -> Vec<GatewayRef> {
        self.resolver.invalidate();
        let mut by_hostname = self.by_hostname.lock();
        let in_use: HashSet<GatewayRef> = in_use.into_iter().collect();
        by_hostname.retain(|gw| in_use.contains(gw));
        // Refusals of gateways no mirror uses are forgotten (reported again if used again).
        self.reported.lock().retain(|gw, _| in_use.contains(gw));
        self.unusable.lock().retain(|gw, _| in_use.contains(gw));
        by_hostname.iter().cloned().collect()
    }
}
