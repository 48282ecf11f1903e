//! What a link controller reports about itself.

/// Which caches have listed at least once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Synced {
    pub(super) remote: bool,
    pub(super) local_services: bool,
    pub(super) local_endpoints: bool,
    pub(super) local_slices: bool,
}

impl Synced {
    pub(super) fn local(&self) -> bool {
        self.local_services && self.local_endpoints && self.local_slices
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
}
