//! What a link controller reports about itself.

/// Which caches have listed at least once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Synced {
    pub(super) remote: bool,
    pub(super) local_services: bool,
    pub(super) local_endpoints: bool,
    pub(super) local_slices: bool,
    /// `endpoints` mode writes no slice: it waits for the slice cache only to delete
    /// slices an earlier mode left, which can wait. So a ClusterRole from before slices
    /// (no `endpointslices` verbs: the watch is refused forever) does not freeze it.
    pub(super) slices_optional: bool,
}

impl crate::runtime::Listed for Synced {
    fn listed(&self) -> bool {
        self.local()
    }
}

impl Synced {
    /// Nothing synced yet; `slices_optional` as above.
    pub(super) fn new(slices_optional: bool) -> Self {
        Self {
            slices_optional,
            ..Self::default()
        }
    }

    /// Whether the local caches the plan needs have listed.
    pub(super) fn local(&self) -> bool {
        self.local_services && self.local_endpoints && (self.local_slices || self.slices_optional)
    }
}

#[cfg(test)]
mod tests {
    use super::{LinkStatus, Synced};

    /// A replica is ready for a link synced here, or run elsewhere as far as its Lease
    /// passes know; not for one unplaced (before its first pass, or about to run here).
    #[test]
    fn a_link_is_ready_synced_here_or_placed_elsewhere() {
        let running = |synced: bool| LinkStatus {
            local_synced: synced,
            standby: false,
            unplaced: false,
            ..LinkStatus::standby(false)
        };
        assert!(running(true).ready());
        assert!(!running(false).ready());
        assert!(LinkStatus::standby(false).ready());
        assert!(!LinkStatus::standby(true).ready());
    }

    #[test]
    fn only_endpoints_mode_is_local_synced_without_the_slice_cache() {
        for (slices_optional, want) in [(false, false), (true, true)] {
            let s = Synced {
                local_services: true,
                local_endpoints: true,
                ..Synced::new(slices_optional)
            };
            assert_eq!(s.local(), want, "slices_optional={slices_optional}");
            let all = Synced {
                local_slices: true,
                ..s
            };
            assert!(all.local());
        }
        let s = Synced {
            local_slices: true,
            ..Synced::new(true)
        };
        assert!(!s.local(), "services and Endpoints are always needed");
    }
}

/// A snapshot of a link controller's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkStatus {
    /// The remote Services have been listed at least once.
    pub remote_synced: bool,
    /// The local mirror caches have been listed at least once.
    pub local_synced: bool,
    /// The last remote watch call succeeded.
    pub remote_connected: bool,
    /// Local mirror Services of this cluster in the cache.
    pub mirrors: usize,
    /// Exported services not mirrored because the link holds its limit of mirrors.
    pub refused: usize,
    /// Keys waiting to be reconciled (now or after a backoff).
    pub queue_depth: usize,
    /// Keys whose last reconcile failed.
    pub failing: usize,
    /// Full lists of the remote after the first (watch resume point expired).
    pub relists: u64,
    /// A standby replica that does not run the link now (cold standby: its write Lease
    /// is held by another replica, or not yet taken): nothing is watched here, every
    /// count is 0.
    pub standby: bool,
    /// In standby, but not known to run elsewhere: no complete Lease pass of this
    /// replica has judged the link held by a peer or a foreign writer, or its gate is
    /// open here (taken, about to run). Such a link is not ready.
    pub unplaced: bool,
}

impl LinkStatus {
    /// A link this replica keeps in cold standby, not running it; `unplaced`: not known
    /// to run elsewhere (see [`LinkStatus::unplaced`]).
    pub(super) fn standby(unplaced: bool) -> Self {
        Self {
            remote_synced: false,
            local_synced: false,
            remote_connected: false,
            mirrors: 0,
            refused: 0,
            queue_depth: 0,
            failing: 0,
            relists: 0,
            standby: true,
            unplaced,
        }
    }

    /// Whether the link counts toward the replica's readiness as ready: its local
    /// caches are synced here, or it runs elsewhere.
    pub fn ready(&self) -> bool {
        self.local_synced || (self.standby && !self.unplaced)
    }
}

/// One gateway of a link, as the admin server's `/gateways` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// The link's cluster name.
    pub cluster_name: String,
    /// The gateway Service's name.
    pub gateway_name: String,
    /// The gateway Service's namespace.
    pub gateway_namespace: String,
    /// The probe verdict (a gateway that is not probed counts as alive).
    pub alive: bool,
    /// Milliseconds of the last successful probe; None before one or when not probed.
    pub latency_ms: Option<u64>,
    /// Whether the gateway is probed (Linkerd's `gateway_enabled`).
    pub enabled: bool,
    /// Local mirror Services of the link whose remote Service uses this gateway.
    pub num_services: usize,
}
