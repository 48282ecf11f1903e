//! The Link's gateway, reported to the process-wide components that point slices at it
//! (the federation, the MCS component): resolved by the link's own gateway component,
//! its verdict read from the same prober as the link's mirrors. A listener that
//! follows the stale policy (the MCS component) gets it as the link's mirrors do
//! (`--stale-after`: not ready unless the probe says alive; `--stale-delete-after`: no
//! address, so the cluster's slices go), so a lost cluster's slices go only by that
//! policy; the federation's follow the probe alone (docs/operations.md).

use service_mirror_core::federated::MemberGateway;
use service_mirror_core::{RemoteState, ServiceKey, stale_effect};
use std::sync::Arc;

/// How often a link's gateway verdict is looked at for its listeners: the prober's
/// verdict reaches their slices at most this much after it changes.
pub(crate) const GATEWAY_REPORT_PERIOD: std::time::Duration = std::time::Duration::from_millis(500);

/// One who is told a link's gateway.
pub(crate) trait GatewayListener: Send + Sync {
    /// Whether it needs the gateway now: it is resolved and probed only while one does.
    fn in_use(&self) -> bool;
    /// The gateway changed (`None`: none usable now).
    fn report(&self, gateway: Option<MemberGateway>);
    /// Whether the gateway it is told has the link's stale policy applied.
    fn follows_stale_policy(&self) -> bool {
        false
    }
}

/// The link's remote state now (what its mirrors' endpoints are built under).
pub(crate) type RemoteStateNow = Arc<dyn Fn() -> RemoteState + Send + Sync>;

/// Reports the Link's gateway `gw` (from `source`) to every listener while one is in
/// use: resolved by the link's own gateway component every `refresh` (and when a
/// listener comes into use), its verdict read and the link's `remote` state applied
/// (for the listeners that follow the stale policy) every [`GATEWAY_REPORT_PERIOD`];
/// sent to each only when what it is told changes.
pub(crate) async fn report_gateway(
    listeners: Vec<Arc<dyn GatewayListener>>,
    gateways: Arc<super::Gateways>,
    gw: service_mirror_core::GatewayRef,
    source: super::GatewaySource,
    remote: RemoteStateNow,
    refresh: std::time::Duration,
    cancel: tokio_util::sync::CancellationToken,
) {
    // The name the gateway component tracks this use under (refusals are told per key):
    // the Link's gateway as its listeners use it.
    let key = ServiceKey::new(gw.namespace.clone(), format!("{}-link-gateway", gw.name));
    // What each listener was last told.
    let mut sent: Vec<Option<Option<MemberGateway>>> = vec![None; listeners.len()];
    let mut current: Option<MemberGateway> = None;
    let mut resolved_at: Option<std::time::Instant> = None;
    loop {
        if listeners.iter().any(|l| l.in_use()) {
            if resolved_at.is_none_or(|t| t.elapsed() >= refresh) {
                let resolution = gateways.resolve(&key, &gw, Some(Ok(source.clone()))).await;
                current = resolution.gateway.map(|g| MemberGateway {
                    addresses: g.addresses,
                    port: g.port,
                    identity: g.identity,
                    alive: g.alive,
                });
                resolved_at = Some(std::time::Instant::now());
            } else if let (Some(g), Some(state)) = (current.as_mut(), gateways.probe_state(&gw)) {
                g.alive = state.alive;
            }
            let state = remote();
            let stale = current.clone().map(|mut g| {
                if state >= RemoteState::Stale {
                    let probe = gateways.probe_state(&gw).map(|s| s.alive);
                    stale_effect(state, probe).apply(&mut g.addresses, &mut g.alive);
                }
                g
            });
            for (l, sent) in listeners.iter().zip(sent.iter_mut()) {
                let gateway = match l.follows_stale_policy() {
                    true => &stale,
                    false => &current,
                };
                if sent.as_ref() != Some(gateway) {
                    l.report(gateway.clone());
                    *sent = Some(gateway.clone());
                }
            }
        } else {
            // In use again later: resolved (and probed) afresh at once.
            resolved_at = None;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(GATEWAY_REPORT_PERIOD) => {}
        }
    }
}
