//! The links the Lease task is given ([`LinkSet`]) and the gate of each link
//! ([`WriteGates`]): open while its write Lease is held here.

use k8s_openapi::api::core::v1::ObjectReference;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};

/// The links the manager runs, and those it still claims (a rotation stops the old link
/// controller before the new one runs: its Lease is kept meanwhile).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinkSet {
    /// Clusters with a running link controller.
    pub running: BTreeSet<String>,
    /// Clusters a link Secret claims, running or not.
    pub claimed: BTreeSet<String>,
    /// Clusters whose mirrors are being deleted: their Lease is taken (or waited for)
    /// and kept until the deletion ends.
    pub cleaning: BTreeSet<String>,
    /// The link object (Secret or Link) of each running cluster, for Events.
    pub sources: BTreeMap<String, ObjectReference>,
}

/// One gate per link: `Some(end)` while we hold the link's write Lease (until `end`, on
/// the monotonic clock), `None` otherwise. A link controller started with these gates
/// (`LinkDeps::write_gates`) writes only while its gate is open; the gate of a new link
/// starts closed, and the holder task is woken to take its Lease at once.
#[derive(Debug, Clone, Default)]
pub struct WriteGates {
    gates: Arc<Mutex<BTreeMap<String, watch::Sender<Option<Instant>>>>>,
    pub(super) wake: Arc<Notify>,
    /// Whether the Lease task is in charge (leading, or without election): only then
    /// does a closed gate mean a link's Lease is held elsewhere or not yet ours.
    in_charge: Arc<std::sync::atomic::AtomicBool>,
    /// Links sharded over replicas (`run --shard-links`): a link writes on the replica
    /// holding its Lease, whoever leads.
    sharded: bool,
    /// The links whose Lease a foreign writer holds (sharded: only those are kept out).
    foreign: Arc<Mutex<BTreeSet<String>>>,
    /// The links the last complete sharded pass looked at (took, kept, or found held
    /// elsewhere): until then a closed gate says nothing about where the link runs.
    judged: Arc<Mutex<BTreeSet<String>>>,
    /// Sharded in cold standby (`--shard-standby=cold`): a link's watches run only
    /// while its Lease is held here, and stop once it has stayed elsewhere this long
    /// (see `link_controller/standby.rs`). `None`: every link watched (warm).
    cold: Option<Duration>,
}

impl WriteGates {
    /// Gates for links sharded over replicas (see [`sharded`]).
    pub fn sharded() -> Self {
        Self {
            sharded: true,
            ..Self::default()
        }
    }

    /// Whether links are sharded over replicas.
    pub fn is_sharded(&self) -> bool {
        self.sharded
    }

    /// Sharded gates in cold standby: a link runs (watches) only on the replica holding
    /// its Lease, and stops on one that has not held it for `linger` (a renewal late
    /// for a moment closes a gate: the watches must not be dropped and relisted then).
    pub fn with_cold_standby(mut self, linger: Duration) -> Self {
        self.cold = self.sharded.then_some(linger);
        self
    }

    /// How long a link not held here keeps its watches, in cold standby; `None`: warm
    /// (links not sharded, or `--shard-standby=warm`).
    pub fn cold_standby(&self) -> Option<Duration> {
        self.cold
    }

    /// What a write of `cluster`'s link (its controller's, its cleanup's) reads before
    /// it goes: the replica's leadership `base` and the link's gate; sharded, the gate
    /// alone (the replica holding the link's Lease writes it, whoever leads).
    pub fn link_leadership(
        &self,
        base: Option<crate::leader::Leadership>,
        cluster: &str,
    ) -> crate::leader::Leadership {
        let base = if self.sharded { None } else { base };
        crate::leader::Leadership::gated(base, self.receiver(cluster))
    }

    /// The gate of `cluster`'s link (closed until its Lease is held).
    pub fn receiver(&self, cluster: &str) -> watch::Receiver<Option<Instant>> {
        let rx = self
            .gates
            .lock()
            .entry(cluster.to_string())
            .or_insert_with(|| watch::Sender::new(None))
            .subscribe();
        self.wake.notify_one();
        rx
    }

    /// Wakes the Lease task to take the Leases of the links it is given now. A link
    /// joins that set ([`LinkManager::link_set`](crate::links::LinkManager::link_set))
    /// only after its controller started, which took its gate ([`WriteGates::receiver`])
    /// and woke the task already: woken only then, the task could find no new link and
    /// sleep a whole tick (1 s) before taking the Lease, with every write of the link
    /// waiting (measured: the first headless mirror 1.08-1.10 s after the start in 3 of 4
    /// bench runs, 0.15 s in the other).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Sets `cluster`'s gate; its watchers are woken only when it opens or closes
    /// (a renewal moving the end is no transition: every transition to open makes the
    /// link reconcile every key).
    pub(super) fn set(&self, cluster: &str, end: Option<Instant>) {
        if let Some(tx) = self.gates.lock().get(cluster) {
            let now = Instant::now();
            tx.send_if_modified(|v| {
                let was = crate::leader::gate_open(*v, now);
                *v = end;
                was != crate::leader::gate_open(end, now)
            });
        }
    }

    /// Whether `cluster`'s gate is open now (closed for a cluster never linked). Reads
    /// only: no gate is made, the holder task is not woken.
    pub fn is_open(&self, cluster: &str) -> bool {
        self.gates
            .lock()
            .get(cluster)
            .is_some_and(|tx| crate::leader::gate_open(*tx.borrow(), Instant::now()))
    }

    /// Whether `cluster`'s link is kept from writing by its Lease: we are in charge of
    /// the write Leases (leader) and its gate is closed (another writer holds it, or it
    /// is not taken yet: one pass, at most 1 s). A replica that is not the leader holds
    /// no Lease and is kept from writing by the election instead: `false` there.
    /// Sharded, a link another replica of ours holds is not kept out (that replica
    /// writes it): only a foreign holder keeps it out.
    pub fn kept_out(&self, cluster: &str) -> bool {
        if self.sharded {
            return self.foreign.lock().contains(cluster);
        }
        self.in_charge.load(std::sync::atomic::Ordering::Acquire) && !self.is_open(cluster)
    }

    /// Whether a complete sharded pass has looked at `cluster`'s Lease: a cold standby
    /// link not running here is then known to run elsewhere (or to be kept out by a
    /// foreign writer), and counts as ready; before, it may be about to run here.
    pub(super) fn judged(&self, cluster: &str) -> bool {
        self.judged.lock().contains(cluster)
    }

    /// Whether `cluster`'s link, not running here, is known to run elsewhere: judged by a
    /// complete pass and its gate closed (open, it is about to run here).
    pub fn runs_elsewhere(&self, cluster: &str) -> bool {
        self.judged(cluster) && !self.is_open(cluster)
    }

    pub(super) fn set_judged(&self, clusters: BTreeSet<String>) {
        *self.judged.lock() = clusters;
    }

    pub(super) fn set_foreign(&self, clusters: BTreeSet<String>) {
        *self.foreign.lock() = clusters;
    }

    pub(super) fn set_in_charge(&self, now: bool) {
        self.in_charge
            .store(now, std::sync::atomic::Ordering::Release);
    }

    pub(super) fn close_all(&self) {
        let clusters: Vec<String> = self.gates.lock().keys().cloned().collect();
        for c in clusters {
            self.set(&c, None);
        }
    }

    /// Closes the gate of a cluster no link names any more. Kept, not dropped: a link
    /// controller starting for it again may hold a receiver already (one small channel
    /// per cluster ever linked).
    pub(super) fn forget(&self, cluster: &str) {
        self.set(cluster, None);
    }

    pub(super) fn clusters(&self) -> Vec<String> {
        self.gates.lock().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica's readiness counts a cold standby link ready only once a Lease pass has
    /// judged where it runs: before (a start), a link parked here may be one this replica
    /// is about to take; its gate open, it is taken and about to run here.
    #[test]
    fn a_link_runs_elsewhere_only_once_a_pass_judged_it_and_its_gate_is_closed() {
        let gates = WriteGates::sharded();
        let _rx = gates.receiver("east");
        assert!(!gates.runs_elsewhere("east"), "no pass yet");
        gates.set_judged(["east".to_string()].into());
        assert!(gates.runs_elsewhere("east"));
        assert!(!gates.runs_elsewhere("west"), "not judged");
        let later = Instant::now() + Duration::from_secs(10);
        gates.set("east", Some(later));
        assert!(!gates.runs_elsewhere("east"), "held here");
        gates.set("east", None);
        assert!(gates.runs_elsewhere("east"));
        // A pass without the link (unlinked) forgets it.
        gates.set_judged(Default::default());
        assert!(!gates.runs_elsewhere("east"));
    }
}
