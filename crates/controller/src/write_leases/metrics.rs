//! The write Leases' metric families (`service_mirror_write_lease_*`, `service_mirror_shard_*`).

use crate::write_lease_report::{BlockedLabels, TakeoverLabels};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of the write Lease counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VerbLabels {
    /// `create`, `update` or `delete`.
    pub(crate) verb: String,
}

/// The write Leases' metric families.
#[derive(Debug, Default)]
pub(crate) struct WriteLeaseFamilies {
    /// Writes to write Leases (never counted in `local_writes_total`, the mirrors').
    pub(crate) writes: Family<VerbLabels, Counter>,
    /// 1 while a link writes nothing because a foreign holder holds its Lease.
    pub(crate) blocked: Family<BlockedLabels, Gauge>,
    /// Foreign Leases taken over, by how they ended.
    pub(crate) takeovers: Family<TakeoverLabels, Counter>,
    /// Sharded: the write Leases this replica holds.
    pub(crate) held: Gauge,
    /// Sharded: the replicas counted live (member Leases renewed), this one included.
    pub(crate) live: Gauge,
    /// Sharded: links released to another replica for balance.
    pub(crate) handovers: Counter,
    /// Sharded in cold standby: the links that run (watch) on this replica.
    pub(crate) watched: Gauge,
}

impl WriteLeaseFamilies {
    /// Registers the families (under the registry's prefix).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "write_lease_writes",
            "Writes to the per-link service-mirror-write-<cluster> Leases",
            self.writes.clone(),
        );
        r.register(
            "write_lease_blocked",
            "1 while a link writes nothing: its write Lease is held by another writer (reason held_by_foreign)",
            self.blocked.clone(),
        );
        r.register(
            "write_lease_takeovers",
            "Write Leases of another writer taken over, by reason (released, expired)",
            self.takeovers.clone(),
        );
        r.register(
            "shard_links_held",
            "With --shard-links: the links whose write Lease this replica holds",
            self.held.clone(),
        );
        r.register(
            "shard_live_replicas",
            "With --shard-links: replicas counted live by their member Leases, this one included",
            self.live.clone(),
        );
        r.register(
            "shard_handovers",
            "With --shard-links: links released to another replica for balance",
            self.handovers.clone(),
        );
        r.register(
            "shard_links_watched",
            "With --shard-links in cold standby: the links whose watches run on this replica (those it holds, and on the leader those feeding the federation)",
            self.watched.clone(),
        );
    }

    pub(super) fn wrote(&self, verb: &str) {
        self.writes
            .get_or_create(&VerbLabels { verb: verb.into() })
            .inc();
    }
}
