//! The Link's gateway, reported to the process-wide components that point slices at it
//! (the federation, the MCS component): resolved by the link's own gateway component,
//! its verdict read from the same prober as the link's mirrors.

use service_mirror_core::ServiceKey;
use service_mirror_core::federated::MemberGateway;
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
}

/// Reports the Link's gateway `gw` (from `source`) to every listener while one is in
/// use: resolved by the link's own gateway component every `refresh` (and when a
/// listener comes into use), its verdict read every [`GATEWAY_REPORT_PERIOD`]; sent to
/// all only when it changes.
pub(crate) async fn report_gateway(
    listeners: Vec<Arc<dyn GatewayListener>>,
    gateways: Arc<super::Gateways>,
    gw: service_mirror_core::GatewayRef,
    source: super::GatewaySource,
    refresh: std::time::Duration,
    cancel: tokio_util::sync::CancellationToken,
) {
    // The name the gateway component tracks this use under (refusals are told per key):
    // the Link's gateway as its listeners use it.
    let key = ServiceKey::new(gw.namespace.clone(), format!("{}-link-gateway", gw.name));
    let mut sent: Option<Option<MemberGateway>> = None;
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
            if sent.as_ref() != Some(&current) {
                for l in &listeners {
                    l.report(current.clone());
                }
                sent = Some(current.clone());
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
