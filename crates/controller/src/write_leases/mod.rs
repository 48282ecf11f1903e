//! Per-link write Leases named as Linkerd names them: `linkerd multicluster check` and
//! `gateways` find the pod that writes a link through the Lease
//! `service-mirror-write-<cluster>` in the controller's namespace (its `holderIdentity`),
//! and Linkerd's own controllers write a link only while they hold it.
//!
//! A link writes only while we hold its Lease (the link's [`WriteGates`] gate, read
//! through its [`crate::leader::Leadership`] before every write), so a migration from
//! Linkerd's controller never has two writers on one link: a Lease held and renewed by
//! a holder that is not ours (our holder annotation `service-mirror.linkerd.io/holder`,
//! written with every take and renewal, does not name it: labels cannot tell, as
//! client-go's LeaseLock keeps them when it re-acquires) keeps the link
//! watching, not writing (reported: Event, metric, Link condition; see
//! `write_lease_report.rs`), read again every 2 s at most, and is taken (an update
//! with its resourceVersion, adding our labels) as soon as it is released or expires
//! unrenewed (unchanged election record, metadata aside), judged on our clock
//! (`service_mirror_core::write_lease`). Nothing of a
//! foreign Lease is ever deleted.
//!
//! Among our replicas, who writes is decided by the one leader-election Lease
//! (`leader.rs`): the leader holds one write Lease per running link (holder: its
//! identity, `leaseDurationSeconds` as the leader Lease), renewed every half duration
//! (7.5 s of the default 15 s; the gate closes at 90 % of the duration after the last
//! renewal sent, so a renewal may be a pass late and one may fail; a pass every tenth of
//! the duration, at most 1 s; all from the whole seconds the Lease stores). Every write
//! carries the resourceVersion last seen, so a replica that lost the leadership cannot
//! overwrite the new leader's claim, and each write first reads the clock-bounded
//! leadership (`leader.rs`): a replica whose term ended writes nothing. Shutting down
//! while leading releases the Leases (holder `""`, as client-go releases); losing the
//! leadership only forgets them (the new leader takes them); an unlinked cluster's
//! Lease is deleted, if ours.

use crate::backoff::Backoff;
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::write_lease_report::{Reporter, Takeover};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use service_mirror_core::write_lease::{
    HOLDER_ANNOTATION, Observed, SHARDED_ANNOTATION, Verdict, anomalies, judge, judge_sharded,
    shown_holder,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

mod gates;
mod lease;
mod metrics;
mod sharded;
mod writes;
pub use gates::{LinkSet, WriteGates};
pub use lease::held_elsewhere;
use lease::{is_ours, mark_holder, only_as_read, our_labels, view_of};
pub(crate) use metrics::WriteLeaseFamilies;
pub use sharded::{MEMBER_LABEL, member_lease_name};

/// Marks a write Lease as ours (the value is [`OWNER_VALUE`]).
pub const OWNER_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`OWNER_LABEL`] on our write Leases.
pub const OWNER_VALUE: &str = "service-mirror.linkerd.io";
/// Field manager of every write.
const FIELD_MANAGER: &str = "service-mirror-write-lease";
/// How often the running links are looked at (in memory: costs no request), at most.
const TICK: Duration = Duration::from_secs(1);

/// The timing of the write Leases, all from the whole seconds the Lease stores
/// (`leaseDurationSeconds` is an integer: a foreign controller counts those, so our
/// gate must not stay open on a fraction it never saw).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timing {
    /// `leaseDurationSeconds` written (at least 1).
    secs: i32,
    /// A renewal every half of it.
    renew_every: Duration,
    /// The gate stays open 90 % of it after the write that took or renewed the Lease.
    hold: Duration,
    /// The pass period: a tenth of it, at most [`TICK`], so a renewal is never late by
    /// more than a tenth of the duration.
    tick: Duration,
}

impl Timing {
    fn of(duration: Duration) -> Self {
        let secs = duration.as_secs().clamp(1, i32::MAX as u64);
        let whole = Duration::from_secs(secs);
        Timing {
            secs: secs as i32,
            renew_every: whole / 2,
            hold: whole.mul_f64(0.9),
            tick: TICK.min(whole / 10),
        }
    }
}

/// The Lease of link `cluster`.
pub fn lease_name(cluster: &str) -> String {
    format!("service-mirror-write-{cluster}")
}

/// Where and as whom the Leases are held.
#[derive(Debug, Clone)]
pub struct WriteLeaseOptions {
    /// The controller's namespace.
    pub namespace: String,
    /// The holder identity (the leader Lease's).
    pub identity: String,
    /// `leaseDurationSeconds`.
    pub duration: Duration,
}

struct Held {
    lease: Lease,
    renewed: Instant,
}

/// A link whose Lease a foreign holder holds.
struct Foreign {
    /// The record as last read, for the expiry count.
    observed: Option<Observed>,
    /// When to read it again.
    look_again: Instant,
    /// The holder reported (a new holder is reported again).
    reported: String,
}

struct WriteLeases {
    api: Api<Lease>,
    client: kube::Client,
    opts: WriteLeaseOptions,
    metrics: Arc<Metrics>,
    recorder: Option<EventRecorder>,
    gates: WriteGates,
    held: BTreeMap<String, Held>,
    /// Clusters whose Lease a foreign holder holds: their links write nothing.
    foreign: BTreeMap<String, Foreign>,
    /// Failed attempts and when to try again, by cluster.
    failing: BTreeMap<String, (u32, Instant)>,
    /// Read before each write: a replica whose leadership ended writes nothing.
    leader: Option<crate::leader::Leadership>,
    /// Sharded: the Leases other replicas hold, as last observed (for their expiry).
    peers: BTreeMap<String, Observed>,
    /// Sharded: this replica's membership (see `sharded.rs`).
    members: sharded::Members,
    /// Sharded: the leadership, which decides only who tells of a link blocked by a
    /// foreign holder (its Event and `WriteLeaseHeld` condition: once, not once per
    /// replica); every replica sets its own gauge, and the replica that takes the Lease
    /// over tells that.
    tells: Option<crate::leader::Leadership>,
}

/// Holds the write Leases while `leader` says so (always without election; sharded
/// gates: whoever leads, `leader` then deciding only who reports a foreign holder), for
/// the links `links` returns, opening and closing their `gates`, until `shutdown`; then
/// releases them.
#[allow(clippy::too_many_arguments)]
pub fn spawn(
    client: kube::Client,
    opts: WriteLeaseOptions,
    mut leader: Option<crate::leader::Leadership>,
    links: Arc<dyn Fn() -> LinkSet + Send + Sync>,
    gates: WriteGates,
    recorder: Option<EventRecorder>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let sharded = gates.is_sharded();
    let tells = leader.clone().filter(|_| sharded);
    if sharded {
        leader = None;
    }
    let mut w = WriteLeases {
        api: Api::namespaced(client.clone(), &opts.namespace),
        client,
        opts,
        metrics,
        recorder,
        gates: gates.clone(),
        held: BTreeMap::new(),
        foreign: BTreeMap::new(),
        failing: BTreeMap::new(),
        leader: leader.clone(),
        peers: BTreeMap::new(),
        members: sharded::Members::default(),
        tells,
    };
    let tick = Timing::of(w.opts.duration).tick;
    tokio::spawn(async move {
        loop {
            let leading = sharded || leader.as_mut().is_none_or(|l| l.leading_and_update());
            if leading {
                w.gates.set_in_charge(true);
                match sharded {
                    true => w.step_sharded(&links()).await,
                    false => w.step(&links()).await,
                }
            } else {
                // Not released: the leadership ended, so another replica may hold these
                // already, and a replica that is not the leader writes nothing.
                w.forget_all();
            }
            let changed = crate::leader::next_change(leader.as_mut());
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(tick) => {}
                _ = changed => {}
                // A link started: its gate waits for its Lease.
                _ = gates.wake.notified() => {}
            }
        }
        w.release_all().await;
        if sharded {
            w.leave().await;
        }
    })
}

impl WriteLeases {
    fn may_write(&self) -> bool {
        self.leader.as_ref().is_none_or(|l| l.leading())
    }

    fn reporter(&self) -> Reporter<'_> {
        Reporter {
            tell_blocked: self.tells.as_ref().is_none_or(|l| l.leading()),
            recorder: self.recorder.as_ref(),
            client: &self.client,
            blocked: &self.metrics.write_leases.blocked,
            takeovers: &self.metrics.write_leases.takeovers,
            metrics: &self.metrics,
        }
    }

    /// `cluster`'s Lease is held by one of ours (or taken by one first): its foreign
    /// observation and report end.
    fn no_longer_foreign(&mut self, cluster: &str) {
        if self.foreign.remove(cluster).is_some() {
            self.reporter().forget(cluster);
        }
    }

    /// Drops what is held without writing (the leadership ended).
    fn forget_all(&mut self) {
        self.gates.set_in_charge(false);
        self.gates.close_all();
        self.held.clear();
        self.foreign.clear();
        self.failing.clear();
        self.peers.clear();
        self.gates.set_foreign(BTreeSet::new());
    }

    /// A renewal every half duration (see the module's note).
    fn renew_every(&self) -> Duration {
        Timing::of(self.opts.duration).renew_every
    }

    /// The gate closes at 90 % of the duration after the write that took or renewed
    /// the Lease was sent: a foreign controller counts the whole duration from when it
    /// saw that write, which is later.
    fn hold_until(&self, sent: Instant) -> Instant {
        sent + Timing::of(self.opts.duration).hold
    }

    fn secs(&self) -> i32 {
        Timing::of(self.opts.duration).secs
    }

    fn due(&self, cluster: &str) -> bool {
        let now = Instant::now();
        self.failing.get(cluster).is_none_or(|(_, at)| now >= *at)
            && self
                .foreign
                .get(cluster)
                .is_none_or(|f| now >= f.look_again)
    }

    fn failed(&mut self, cluster: &str, what: &str, e: &kube::Error) {
        let n = self.failing.get(cluster).map_or(1, |(n, _)| n + 1);
        let delay = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(30)).delay(n);
        self.failing
            .insert(cluster.to_string(), (n, Instant::now() + delay));
        tracing::warn!(%cluster, lease = %lease_name(cluster), error = %e, "cannot {what} the write Lease; retrying");
    }

    /// Deletes the Leases of clusters no longer linked and forgets their state.
    async fn forget_unlinked(&mut self, links: &LinkSet) {
        let linked = |c: &String| {
            links.running.contains(c) || links.claimed.contains(c) || links.cleaning.contains(c)
        };
        let gone: Vec<String> = self.held.keys().filter(|c| !linked(c)).cloned().collect();
        for cluster in gone {
            self.delete(&cluster).await;
        }
        for cluster in self.gates.clusters() {
            if !linked(&cluster) {
                self.gates.forget(&cluster);
            }
        }
        let unblocked: Vec<String> = self
            .foreign
            .keys()
            .filter(|c| !linked(c))
            .cloned()
            .collect();
        for cluster in unblocked {
            self.foreign.remove(&cluster);
            self.reporter().forget(&cluster);
        }
        self.failing.retain(|c, _| linked(c));
        self.peers.retain(|c, _| linked(c));
    }

    /// One pass as leader: delete the Leases of unlinked clusters, take those of new
    /// links (and of links a foreign holder let go), renew those due.
    async fn step(&mut self, links: &LinkSet) {
        self.forget_unlinked(links).await;
        for cluster in links.running.iter().chain(&links.cleaning) {
            if !self.held.contains_key(cluster) && self.due(cluster) {
                self.acquire(cluster, links.sources.get(cluster)).await;
            }
        }
        self.renew_due().await;
    }

    /// Renews the Leases held that are due.
    async fn renew_due(&mut self) {
        let every = self.renew_every();
        let due: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| h.renewed.elapsed() >= every)
            .map(|(c, _)| c.clone())
            .collect();
        for cluster in due {
            if self.due(&cluster) {
                self.renew(&cluster).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_and_renewals_follow_the_whole_seconds_the_lease_stores() {
        let ms = Duration::from_millis;
        // (duration given, seconds written, renew every, gate open for, pass period)
        let table = [
            (ms(1500), 1, ms(500), ms(900), ms(100)),
            (ms(3000), 3, ms(1500), ms(2700), ms(300)),
            (ms(3999), 3, ms(1500), ms(2700), ms(300)),
            (ms(15_000), 15, ms(7500), ms(13_500), ms(1000)),
            (ms(200), 1, ms(500), ms(900), ms(100)),
        ];
        for (given, secs, renew, hold, tick) in table {
            let t = Timing::of(given);
            assert_eq!(
                t,
                Timing {
                    secs,
                    renew_every: renew,
                    hold,
                    tick
                },
                "{given:?}"
            );
            // Never open past what a foreign controller counts from our write.
            assert!(t.hold < Duration::from_secs(t.secs as u64), "{given:?}");
            // A renewal late by one pass still lands before the gate closes.
            assert!(t.renew_every + t.tick < t.hold, "{given:?}");
        }
    }
}
