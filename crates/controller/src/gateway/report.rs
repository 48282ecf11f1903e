//! The Link's gateway, reported to the process-wide components that point slices at it
//! (the federation, the MCS component): resolved by the link's own gateway component,
//! its verdict read from the same prober as the link's mirrors. A listener that
//! follows the stale policy (the MCS component) gets it as the link's mirrors do
//! (`--stale-after`: not ready unless the probe says alive; `--stale-delete-after`: no
//! address, so the cluster's slices go), so a lost cluster's slices go only by that
//! policy; the federation's follow the probe alone (docs/operations.md).

use service_mirror_core::{RemoteState, ResolvedGateway, ServiceKey, stale_effect};
use std::sync::Arc;

/// How often a link's gateway verdict is looked at for its listeners: the prober's
/// verdict reaches their slices at most this much after it changes.
pub(crate) const GATEWAY_REPORT_PERIOD: std::time::Duration = std::time::Duration::from_millis(500);

/// One who is told a link's gateway.
pub(crate) trait GatewayListener: Send + Sync {
    /// Whether it needs the gateway now: it is resolved and probed only while one does.
    fn in_use(&self) -> bool;
    /// The gateway changed (`None`: none usable now).
    fn report(&self, gateway: Option<ResolvedGateway>);
    /// Whether the gateway it is told has the link's stale policy applied.
    fn follows_stale_policy(&self) -> bool {
        false
    }
}

/// The link's remote state now (what its mirrors' endpoints are built under).
pub(crate) type RemoteStateNow = Arc<dyn Fn() -> RemoteState + Send + Sync>;

/// Where the notes of a resolution go (a Warning Event on the link: reason, note).
/// The gateway component says each note once per gateway and episode to whichever
/// caller resolves first; when that is this report (MCS or federation in use), the note
/// must be recorded here or the link never hears of it.
pub(crate) type Notes = Arc<dyn Fn(&'static str, String) + Send + Sync>;

/// What the report reads from and tells its link.
pub(crate) struct LinkSide {
    /// The link's remote state now.
    pub(crate) remote: RemoteStateNow,
    /// Where the resolution's notes go.
    pub(crate) notes: Notes,
}

/// Reports the Link's gateway `gw` (from `source`) to every listener while one is in
/// use: resolved by the link's own gateway component every `refresh` (and when a
/// listener comes into use), its verdict read and the link's `remote` state applied
/// (for the listeners that follow the stale policy) every [`GATEWAY_REPORT_PERIOD`];
/// sent to each only when what it is told changes.
pub(crate) async fn report_gateway(
    listeners: Vec<Arc<dyn GatewayListener>>,
    gateways: Arc<super::Gateways>,
    gw: service_mirror_core::GatewayRef,
    mut source: tokio::sync::watch::Receiver<Option<super::GatewaySource>>,
    link: LinkSide,
    refresh: std::time::Duration,
    cancel: tokio_util::sync::CancellationToken,
) {
    // The name the gateway component tracks this use under (refusals are told per key):
    // the Link's gateway as its listeners use it.
    let key = ServiceKey::new(gw.namespace.clone(), format!("{}-link-gateway", gw.name));
    // What each listener was last told.
    let mut sent: Vec<Option<Option<ResolvedGateway>>> = vec![None; listeners.len()];
    let mut current: Option<ResolvedGateway> = None;
    let mut resolved_at: Option<std::time::Instant> = None;
    loop {
        if listeners.iter().any(|l| l.in_use()) {
            if resolved_at.is_none_or(|t| t.elapsed() >= refresh) {
                let spec = source.borrow_and_update().clone().map(Ok);
                let resolution = gateways.resolve(&key, &gw, spec).await;
                for (reason, note) in resolution.notes() {
                    (link.notes)(reason, note.to_owned());
                }
                // Each address's own verdict kept: a dead one not ready alone. No version:
                // no slice of theirs carries it, so a new version alone is no change.
                current = resolution
                    .gateway
                    .map(ResolvedGateway::without_resource_version);
                resolved_at = Some(std::time::Instant::now());
            } else if current.is_some()
                && let Some(state) = gateways.probe_state(&gw)
            {
                current = current.take().map(|g| {
                    // Past MAX_PROBED_ADDRESSES only the first is probed and its verdict
                    // is the gateway's (`alive`), as `resolve` does.
                    let dead = match g.addresses.len() <= super::MAX_PROBED_ADDRESSES {
                        true => state.dead,
                        false => Vec::new(),
                    };
                    g.with_alive(state.alive).with_dead(dead)
                });
            }
            let state = (link.remote)();
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
            // The Link's gateway moved (in place): resolved afresh at once.
            changed = source.changed() => match changed {
                Ok(()) => resolved_at = None,
                Err(_) => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::{GatewaySource, Gateways, Lookup, ProbeConfig, Resolver};
    use parking_lot::Mutex;
    use service_mirror_core::{AddressPolicy, Cidr, GatewayRef, GatewaySpec, ProbeSpec};
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    /// Every hostname resolves to 198.18.0.1.
    #[derive(Debug)]
    struct OneAnswer;

    impl Resolver for OneAnswer {
        fn lookup<'a>(&'a self, _host: &'a str) -> Lookup<'a> {
            Box::pin(async { Ok(vec!["198.18.0.1".parse().unwrap()]) })
        }
    }

    struct InUse;

    impl GatewayListener for InUse {
        fn in_use(&self) -> bool {
            true
        }
        fn report(&self, _gateway: Option<ResolvedGateway>) {}
    }

    #[tokio::test]
    async fn a_refusal_found_by_the_link_gateway_report_is_recorded_once_not_swallowed() {
        let cancel = CancellationToken::new();
        let policy = AddressPolicy {
            deny: Cidr::parse_list("198.18.0.0/15").unwrap(),
            ..AddressPolicy::default()
        };
        let probes = ProbeConfig {
            timeout: Duration::from_secs(1),
            failure_threshold: 3,
            redirect: None,
        };
        let (gateways, _verdicts) = Gateways::new(
            "east",
            Arc::new(OneAnswer),
            crate::gateway::Policy {
                flags: policy,
                local: Default::default(),
            },
            probes,
            crate::metrics::Metrics::new(),
            Arc::new(|_: &GatewayRef| true),
            cancel.clone(),
        );
        let gateways = Arc::new(gateways);
        // A Link gateway given by hostname, refused after resolution.
        let source = GatewaySource::Link {
            spec: GatewaySpec {
                ips: vec!["203.0.113.1".parse().unwrap()],
                hostnames: vec!["gw.example".into()],
                port: 4143,
                resource_version: String::new(),
                invalid_ingress: vec![],
                identity: None,
            },
            probe: ProbeSpec {
                port: None,
                path: "/ready".into(),
                period: Duration::from_secs(3),
                warnings: vec![],
            },
        };
        let gw = GatewayRef::new("ns", "link-east");
        let recorded: Arc<Mutex<Vec<(&'static str, String)>>> = Arc::default();
        let sink = recorded.clone();
        let notes: Notes = Arc::new(move |reason, note| sink.lock().push((reason, note)));
        let (_link_gateway, watched) = tokio::sync::watch::channel(Some(source.clone()));
        let task = tokio::spawn(report_gateway(
            vec![Arc::new(InUse)],
            gateways.clone(),
            gw.clone(),
            watched,
            LinkSide {
                remote: Arc::new(|| RemoteState::Connected),
                notes,
            },
            Duration::from_millis(100),
            cancel.clone(),
        ));
        for _ in 0..100 {
            if !recorded.lock().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Several resolutions later, still one note.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let got = recorded.lock().clone();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, "GatewayAddressRefused");
        assert!(got[0].1.contains("198.18.0.1"), "{}", got[0].1);
        // A mirror's reconcile of the same gateway in the same episode: said already.
        let key = ServiceKey::new("ns", "web-east");
        let again = gateways.resolve(&key, &gw, Some(Ok(source))).await;
        assert_eq!(again.notes().count(), 0);
        cancel.cancel();
        let _ = task.await;
    }
}
