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
use crate::write_lease_report::{BlockedLabels, Reporter, Takeover, TakeoverLabels};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use service_mirror_core::labels::CLUSTER_NAME_LABEL;
use service_mirror_core::write_lease::{
    HOLDER_ANNOTATION, LeaseView, Observed, Record, SHARDED_ANNOTATION, Verdict, anomalies, judge,
    judge_sharded, shown_holder,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

mod sharded;
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

    fn wrote(&self, verb: &str) {
        self.writes
            .get_or_create(&VerbLabels { verb: verb.into() })
            .inc();
    }
}

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
    wake: Arc<Notify>,
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
    fn set(&self, cluster: &str, end: Option<Instant>) {
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
    fn judged(&self, cluster: &str) -> bool {
        self.judged.lock().contains(cluster)
    }

    /// Whether `cluster`'s link, not running here, is known to run elsewhere: judged by a
    /// complete pass and its gate closed (open, it is about to run here).
    pub fn runs_elsewhere(&self, cluster: &str) -> bool {
        self.judged(cluster) && !self.is_open(cluster)
    }

    fn set_judged(&self, clusters: BTreeSet<String>) {
        *self.judged.lock() = clusters;
    }

    fn set_foreign(&self, clusters: BTreeSet<String>) {
        *self.foreign.lock() = clusters;
    }

    fn set_in_charge(&self, now: bool) {
        self.in_charge
            .store(now, std::sync::atomic::Ordering::Release);
    }

    fn close_all(&self) {
        let clusters: Vec<String> = self.gates.lock().keys().cloned().collect();
        for c in clusters {
            self.set(&c, None);
        }
    }

    /// Closes the gate of a cluster no link names any more. Kept, not dropped: a link
    /// controller starting for it again may hold a receiver already (one small channel
    /// per cluster ever linked).
    fn forget(&self, cluster: &str) {
        self.set(cluster, None);
    }

    fn clusters(&self) -> Vec<String> {
        self.gates.lock().keys().cloned().collect()
    }
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

    fn params() -> PostParams {
        PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        }
    }

    /// Reads the Lease and takes it, unless a foreign holder holds it.
    async fn acquire(&mut self, cluster: &str, source: Option<&ObjectReference>) {
        let name = lease_name(cluster);
        let existing = match self.api.get_opt(&name).await {
            Ok(l) => l,
            Err(e) => return self.failed(cluster, "read", &e),
        };
        if !self.may_write() {
            return;
        }
        let view = existing.as_ref().map(view_of);
        let last = self
            .foreign
            .get(cluster)
            .and_then(|f| f.observed.as_ref())
            .or_else(|| self.peers.get(cluster));
        let judge = match self.gates.is_sharded() {
            true => judge_sharded,
            false => judge,
        };
        let (verdict, observed) = judge(
            view.as_ref(),
            &self.opts.identity,
            last,
            Instant::now(),
            Duration::from_secs(self.secs() as u64),
        );
        if let Verdict::HeldByPeer { .. } = &verdict {
            // Another replica of ours writes it (sharded: raced to it, or renewing; a
            // foreign holder's Lease it took over is no longer blocked).
            self.gates.set(cluster, None);
            if let Some(o) = observed {
                self.peers.insert(cluster.to_string(), o);
            }
            self.no_longer_foreign(cluster);
            return;
        }
        self.peers.remove(cluster);
        if let Verdict::HeldByForeign {
            holder, look_again, ..
        } = &verdict
        {
            self.gates.set(cluster, None);
            let shown = shown_holder(holder);
            let first = self
                .foreign
                .get(cluster)
                .is_none_or(|f| f.reported != *holder);
            self.foreign.insert(
                cluster.to_string(),
                Foreign {
                    observed,
                    look_again: *look_again,
                    reported: holder.clone(),
                },
            );
            if first {
                let odd: Vec<String> = view
                    .as_ref()
                    .map(anomalies)
                    .unwrap_or_default()
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                tracing::warn!(%cluster, lease = %name, holder = %shown, anomalies = ?odd, "the link's write Lease is held without our label by another writer (Linkerd's controller?): this link writes nothing until it is released or expires");
                let mut note = format!(
                    "the write Lease {name} is held by {shown:?}, not by this controller: mirrors of {cluster} are not written until it is released or stops being renewed"
                );
                if !odd.is_empty() {
                    note.push_str(&format!(" ({})", odd.join("; ")));
                }
                self.reporter().blocked(cluster, source, note).await;
            }
            return;
        }
        let was_foreign = self.foreign.contains_key(cluster);
        let takeover = match (&verdict, existing.as_ref().is_some_and(is_ours)) {
            (Verdict::Expired { .. }, _) => Some(Takeover::Expired),
            (Verdict::Released, false) => Some(Takeover::Released),
            _ => None,
        };
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let sent = Instant::now();
        let (verb, result) = match existing {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some(our_labels(cluster).into_iter().collect()),
                        annotations: Some({
                            let mut a = BTreeMap::from([(
                                HOLDER_ANNOTATION.to_string(),
                                self.opts.identity.clone(),
                            )]);
                            if self.gates.is_sharded() {
                                a.insert(SHARDED_ANNOTATION.to_string(), "true".to_string());
                            }
                            a
                        }),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.opts.identity.clone()),
                        lease_duration_seconds: Some(self.secs()),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                ("create", self.api.create(&Self::params(), &lease).await)
            }
            Some(mut lease) => {
                // Taken with the resourceVersion read: a holder that renewed meanwhile
                // makes this a 409, and the next pass reads it again.
                let labels = lease.metadata.labels.get_or_insert_with(Default::default);
                labels.extend(our_labels(cluster));
                mark_holder(&mut lease, &self.opts.identity, self.gates.is_sharded());
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if spec.holder_identity.as_deref() != Some(&self.opts.identity) {
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).max(0) + 1);
                    spec.acquire_time = Some(now.clone());
                }
                spec.holder_identity = Some(self.opts.identity.clone());
                spec.lease_duration_seconds = Some(self.secs());
                spec.renew_time = Some(now);
                (
                    "update",
                    self.api.replace(&name, &Self::params(), &lease).await,
                )
            }
        };
        match result {
            Ok(lease) => {
                self.metrics.write_leases.wrote(verb);
                self.failing.remove(cluster);
                self.foreign.remove(cluster);
                self.gates.set(cluster, Some(self.hold_until(sent)));
                tracing::info!(%cluster, lease = %name, identity = %self.opts.identity, ?takeover, "holding the link's write Lease");
                self.held.insert(
                    cluster.to_string(),
                    Held {
                        lease,
                        renewed: sent,
                    },
                );
                if takeover.is_some() || was_foreign {
                    let note = match (&verdict, takeover) {
                        (Verdict::Expired { holder }, _) => format!(
                            "the write Lease {name} was not renewed by {:?} for its whole duration: taken over; mirrors of {cluster} are written again",
                            shown_holder(holder)
                        ),
                        _ => format!(
                            "the write Lease {name} was released by its holder: taken over; mirrors of {cluster} are written again"
                        ),
                    };
                    self.reporter()
                        .unblocked(cluster, source, takeover, note)
                        .await;
                }
            }
            // Sharded, two replicas reaching for one free link: one wins, the other
            // reads the winner's Lease on its next pass.
            Err(kube::Error::Api(s)) if self.gates.is_sharded() && s.code == 409 => {
                tracing::debug!(%cluster, lease = %name, "another replica took the write Lease first");
                self.no_longer_foreign(cluster);
            }
            Err(e) => self.failed(cluster, "take", &e),
        }
    }

    async fn renew(&mut self, cluster: &str) {
        if !self.may_write() {
            return;
        }
        let Some(held) = self.held.get(cluster) else {
            return;
        };
        let mut lease = held.lease.clone();
        mark_holder(&mut lease, &self.opts.identity, self.gates.is_sharded());
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        }
        let sent = Instant::now();
        match self
            .api
            .replace(&lease_name(cluster), &Self::params(), &lease)
            .await
        {
            Ok(lease) => {
                self.metrics.write_leases.wrote("update");
                self.gates.set(cluster, Some(self.hold_until(sent)));
                self.held.insert(
                    cluster.to_string(),
                    Held {
                        lease,
                        renewed: sent,
                    },
                );
            }
            Err(e) => {
                // Changed or deleted by someone else: read it again on the next pass
                // (the gate closes by itself when the hold runs out).
                self.held.remove(cluster);
                self.failed(cluster, "renew", &e);
            }
        }
    }

    async fn delete(&mut self, cluster: &str) {
        if !self.may_write() {
            return;
        }
        let Some(held) = self.held.remove(cluster) else {
            return;
        };
        self.gates.forget(cluster);
        let params = only_as_read(&held.lease);
        match self.api.delete(&lease_name(cluster), &params).await {
            Ok(_) => {
                self.metrics.write_leases.wrote("delete");
                tracing::info!(%cluster, lease = %lease_name(cluster), "link removed: write Lease deleted");
            }
            Err(e) => {
                tracing::warn!(%cluster, lease = %lease_name(cluster), error = %e, "write Lease not deleted (changed meanwhile?)")
            }
        }
    }

    /// Gives every held Lease up (holder `""`, duration 1 s, as client-go releases), each
    /// only if unchanged since our last write, and only while still leading; the gates
    /// close first.
    async fn release_all(&mut self) {
        self.gates.set_in_charge(false);
        self.gates.close_all();
        if self.gates.is_sharded() && !self.held.is_empty() {
            // Another replica takes a released link within a pass: writes that passed a
            // gate just before it closed land first (leader mode: the leader Lease,
            // released last, covers them).
            tokio::time::sleep(sharded::RELEASE_GRACE).await;
        }
        for (cluster, held) in std::mem::take(&mut self.held) {
            if !self.may_write() {
                continue;
            }
            self.release(&cluster, held).await;
        }
        self.foreign.clear();
        self.failing.clear();
        self.gates.set_foreign(BTreeSet::new());
    }

    /// Gives the Lease `held` of `cluster` up (its gate closed already): holder `""`,
    /// duration 1 s, as client-go releases; only if unchanged since our last write.
    async fn release(&mut self, cluster: &str, held: Held) {
        let mut lease = held.lease;
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some(String::new());
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        }
        match self
            .api
            .replace(&lease_name(cluster), &Self::params(), &lease)
            .await
        {
            Ok(_) => {
                self.metrics.write_leases.wrote("update");
                tracing::info!(%cluster, lease = %lease_name(cluster), "write Lease released");
            }
            Err(e) => {
                tracing::debug!(%cluster, error = %e, "write Lease not released (taken over already?)")
            }
        }
    }
}

/// A delete of `lease` only as it was read (its uid and resourceVersion): one changed
/// meanwhile (renewed, taken) stays.
fn only_as_read(lease: &Lease) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: lease.metadata.uid.clone(),
            resource_version: lease.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    }
}

fn our_labels(cluster: &str) -> [(String, String); 2] {
    [
        (OWNER_LABEL.to_string(), OWNER_VALUE.to_string()),
        (CLUSTER_NAME_LABEL.to_string(), cluster.to_string()),
    ]
}

/// The holder of `cluster`'s write Lease when another writer holds it (a holder our
/// annotation does not name): the collector of unlinked mirrors leaves that cluster
/// alone, as its mirrors may be that writer's.
pub async fn held_elsewhere(
    client: &kube::Client,
    namespace: &str,
    cluster: &str,
) -> Result<Option<String>, kube::Error> {
    let lease = Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt(&lease_name(cluster))
        .await?;
    Ok(lease.and_then(|l| {
        let view = view_of(&l);
        view.holder
            .filter(|h| !h.is_empty() && view.marked_holder.as_deref() != Some(h.as_str()))
    }))
}

/// Names `identity` in our holder annotation: the Lease is one of our replicas' only
/// while this equals its holder (see `service_mirror_core::write_lease`).
///
/// `sharded`: also says so ([`SHARDED_ANNOTATION`]: a replica that does not shard leaves
/// the Lease to its holder while it renews it), or takes that word back.
fn mark_holder(lease: &mut Lease, identity: &str, sharded: bool) {
    let annotations = lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(HOLDER_ANNOTATION.to_string(), identity.to_string());
    match sharded {
        true => annotations.insert(SHARDED_ANNOTATION.to_string(), "true".to_string()),
        false => annotations.remove(SHARDED_ANNOTATION),
    };
}

/// Labelled ours (created or once taken by us): only tells how a released Lease is
/// reported, never whether it is ours to take (see [`mark_holder`]).
fn is_ours(lease: &Lease) -> bool {
    lease
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(OWNER_LABEL))
        .is_some_and(|v| v == OWNER_VALUE)
}

/// The Lease as the judgement reads it; `renewTime` only to report one ahead of our
/// wall clock.
fn view_of(lease: &Lease) -> LeaseView {
    let spec = lease.spec.as_ref();
    let renew_ahead = spec
        .and_then(|s| s.renew_time.as_ref())
        .and_then(|t| {
            let ahead = t.0.duration_since(k8s_openapi::jiff::Timestamp::now());
            Duration::try_from(ahead).ok()
        })
        .filter(|d| !d.is_zero());
    LeaseView {
        holder: spec.and_then(|s| s.holder_identity.clone()),
        marked_holder: lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HOLDER_ANNOTATION))
            .cloned(),
        sharded: lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SHARDED_ANNOTATION))
            .is_some_and(|v| v == "true"),
        record: Record {
            acquire_time: spec
                .and_then(|s| s.acquire_time.as_ref())
                .map(|t| t.0.to_string()),
            renew_time: spec
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.to_string()),
            transitions: spec.and_then(|s| s.lease_transitions),
        },
        duration_seconds: spec.and_then(|s| s.lease_duration_seconds),
        renew_ahead,
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
