//! Cold standby (`run --shard-links`, `--shard-standby=cold`, the default there): a
//! link runs (watches, caches, writes) only on the replica that holds its write Lease,
//! so each replica's memory and remote watches follow its share of the links, not the
//! whole fleet's.
//!
//! A supervisor per link follows the link's write gate:
//! - the gate opens (the Lease is taken here): the link starts at once, lists the remote
//!   and the local mirrors, and writes what differs (as after a process restart: no
//!   mirror is deleted for being unseen before the lists are in);
//! - the gate stays closed for `linger` (the Lease went to another replica, or was
//!   never ours): the link stops, its mirrors left in place, and this replica keeps only
//!   the link's name. A gate closed for less (a renewal late for a moment) stops
//!   nothing, so no remote is relisted for a blip.
//!
//! The leader writes the federated Services from every link's members, so a link that
//! feeds the federation (a Link: its `federatedServiceSelector`) also runs on the
//! leader, watching only (its writes still need its gate). Its feed is the link's, not
//! one run's: stopped here, the federation marks the cluster pending (its stored
//! entries kept) until the next run's list, as after an outage. With MCS on every link
//! stays warm instead ([`linger`]): the leader's MCS judges every cluster's exports.

use super::*;
use crate::federation::LinkFeed;
use crate::leader::Leadership;
use k8s_openapi::api::core::v1::ObjectReference;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How long a link whose Lease is not held here keeps running, when links are in cold
/// standby; `None`: every link runs here (not sharded, `--shard-standby=warm`, or MCS
/// on: the leader's MCS must have every cluster's exports when it takes over, and they
/// come through the link controllers' feeds).
pub(super) fn linger(deps: &LinkDeps) -> Option<Duration> {
    if deps.mcs.is_some() {
        return None;
    }
    deps.write_gates.as_ref()?.cold_standby()
}

/// What a run of the link is started from.
pub(super) struct Parts {
    pub(super) local: Client,
    pub(super) remote: Client,
    pub(super) link: Link,
    pub(super) config: LinkConfig,
    pub(super) deps: LinkDeps,
    pub(super) feed: Option<LinkFeed>,
}

/// A link in cold standby: its supervisor and, while it runs here, its run.
pub(super) struct Standby {
    shared: Arc<Shared>,
    link: Link,
    source: Option<ObjectReference>,
    /// Cancels the supervisor, also when the controller is dropped without a stop.
    cancel: tokio_util::sync::DropGuard,
    task: JoinHandle<()>,
}

/// Lock order: `running` before `parts`.
struct Shared {
    /// The config moves with [`Standby::move_gateway`]: a later run starts from it.
    parts: Mutex<Parts>,
    running: Mutex<Option<Running>>,
    /// Started paused and not resumed yet (a replacement waiting for its predecessor);
    /// read and written under `running`'s lock, so a resume never misses a run.
    paused: AtomicBool,
    /// Counts starts and stops, for [`Standby::wait_synced`] and the supervisor.
    runs: watch::Sender<u64>,
}

/// What the supervisor drives (the link's runs; a fake in the tests).
trait Runs: Send + Sync + 'static {
    fn is_running(&self) -> bool;
    /// Starts a run if none is running.
    fn run(&self);
    /// Stops the run, if any.
    fn park(&self) -> impl std::future::Future<Output = ()> + Send;
    /// Whether an unwanted run may be stopped: not while paused (a replacement whose
    /// rotation is proving its credentials by a sync, however long it takes).
    fn parkable(&self) -> bool;
    /// Changes with every start, stop and resume.
    fn runs(&self) -> watch::Receiver<u64>;
}

impl Runs for Shared {
    fn is_running(&self) -> bool {
        self.running.lock().is_some()
    }

    /// Runs the link here (under the `running` lock: a resume or a gateway move comes
    /// before it, and the run starts from it, or after, and reaches the run).
    fn run(&self) {
        let mut running = self.running.lock();
        if running.is_some() {
            return;
        }
        let p = self.parts.lock();
        let run = Running::start(
            p.local.clone(),
            p.remote.clone(),
            p.link.clone(),
            p.config.clone(),
            p.deps.clone(),
            self.paused.load(Ordering::Acquire),
            p.feed.clone(),
        );
        tracing::info!(cluster = %p.link.cluster_name, "standby: the link runs on this replica now");
        p.deps.metrics.write_leases.watched.inc();
        *running = Some(run);
        self.runs.send_modify(|n| *n += 1);
    }

    /// Stops the link's run here, its mirrors left in place; the federation no longer
    /// counts on what it last said (the cluster pending until a run lists again).
    async fn park(&self) {
        let Some(run) = self.running.lock().take() else {
            return;
        };
        run.park().await;
        let (cluster, metrics, feed) = {
            let p = self.parts.lock();
            (
                p.link.cluster_name.clone(),
                p.deps.metrics.clone(),
                p.feed.clone(),
            )
        };
        metrics.write_leases.watched.dec();
        if let Some(feed) = feed {
            feed.unknown();
        }
        tracing::info!(%cluster, "standby: the link's write Lease is held elsewhere; its watches stopped here");
        self.runs.send_modify(|n| *n += 1);
    }

    fn parkable(&self) -> bool {
        !self.paused.load(Ordering::Acquire)
    }

    fn runs(&self) -> watch::Receiver<u64> {
        self.runs.subscribe()
    }
}

/// Whether the link runs here now: its Lease is held here, or it feeds the federation
/// and this replica leads.
fn wanted(gate_end: Option<Instant>, now: Instant, feeds: bool, leads: bool) -> bool {
    crate::leader::gate_open(gate_end, now) || (feeds && leads)
}

impl Standby {
    /// Starts the supervisor; the link runs at once if it is wanted here already.
    pub(super) fn start(parts: Parts, paused: bool, linger: Duration) -> Self {
        let cluster = parts.link.cluster_name.clone();
        let gates = parts
            .deps
            .write_gates
            .clone()
            .expect("cold standby has write gates");
        let gate = gates.receiver(&cluster);
        let feeds = parts.feed.is_some();
        let leader = parts.deps.leader.clone().filter(|_| feeds);
        let (link, source) = (parts.link.clone(), parts.deps.link_secret.clone());
        let shared = Arc::new(Shared {
            parts: Mutex::new(parts),
            running: Mutex::new(None),
            paused: AtomicBool::new(paused),
            runs: watch::Sender::new(0),
        });
        let leads = leader.as_ref().is_some_and(Leadership::leading);
        if wanted(*gate.borrow(), Instant::now(), feeds, leads) {
            shared.run();
        } else if let Some(feed) = &shared.parts.lock().feed {
            // Not run here yet: the federation must not take the cluster for one
            // without members meanwhile (a link made after this replica's start).
            feed.unknown();
        }
        let cancel = CancellationToken::new();
        let task = tokio::spawn(supervise(
            shared.clone(),
            gate,
            leader,
            linger,
            cancel.clone(),
        ));
        Self {
            shared,
            link,
            source,
            cancel: cancel.drop_guard(),
            task,
        }
    }

    pub(super) fn resume(&self) {
        let running = self.shared.running.lock();
        self.shared.paused.store(false, Ordering::Release);
        if let Some(run) = running.as_ref() {
            run.resume();
        }
        // The supervisor may stop an unwanted run now.
        self.shared.runs.send_modify(|n| *n += 1);
    }

    pub(super) fn move_gateway(&self, gateway: crate::gateway::GatewaySource) -> bool {
        let crate::gateway::GatewaySource::Link { .. } = gateway else {
            return false;
        };
        let running = self.shared.running.lock();
        let moved = {
            let mut p = self.shared.parts.lock();
            let moved = matches!(
                p.config.link_gateway,
                Some(crate::gateway::GatewaySource::Link { .. })
            ) && p.config.link_gateway.as_ref() != Some(&gateway);
            if moved {
                p.config.link_gateway = Some(gateway.clone());
            }
            moved
        };
        if let Some(run) = running.as_ref() {
            run.move_gateway(gateway);
        }
        moved
    }

    pub(super) fn has_link_gateway(&self) -> bool {
        matches!(
            self.shared.parts.lock().config.link_gateway,
            Some(crate::gateway::GatewaySource::Link { .. })
        )
    }

    pub(super) fn link(&self) -> &Link {
        &self.link
    }

    pub(super) fn source(&self) -> Option<&ObjectReference> {
        self.source.as_ref()
    }

    /// The run's status; not running here, a standby's, placed (ready) once the Lease
    /// task has judged the link held elsewhere. Unplaced (not ready) before: at a
    /// replica's start every link is parked until the first Lease pass, and one it takes
    /// is about to run here.
    pub(super) fn status(&self) -> LinkStatus {
        let running = self.shared.running.lock();
        if let Some(run) = running.as_ref() {
            return run.status();
        }
        let p = self.shared.parts.lock();
        let gates = p.deps.write_gates.as_ref();
        LinkStatus::standby(!gates.is_some_and(|g| g.runs_elsewhere(&self.link.cluster_name)))
    }

    pub(super) fn remote_state(&self) -> service_mirror_core::RemoteState {
        match self.shared.running.lock().as_ref() {
            Some(run) => run.remote_state(),
            None => service_mirror_core::RemoteState::Disconnected,
        }
    }

    pub(super) fn gateways(&self) -> Vec<GatewayStatus> {
        match self.shared.running.lock().as_ref() {
            Some(run) => run.gateways(),
            None => Vec::new(),
        }
    }

    /// Until a run's caches have listed. A paused standby is a replacement whose new
    /// credentials a rotation proves by a sync on every replica, as in warm standby: a
    /// replica that does not run the link starts a run for it (kept while paused, then
    /// stopped by the supervisor after the linger unless the link is wanted here). Not
    /// paused and not running: nothing to sync, at once. A run that stops before it has
    /// synced never returns (the caller's timeout decides, as for a warm run).
    pub(super) async fn wait_synced(&self) {
        let mut runs = self.shared.runs();
        if self.shared.paused.load(Ordering::Acquire) {
            self.shared.run();
        }
        runs.borrow_and_update();
        let synced = self.shared.running.lock().as_ref().map(Running::synced);
        let Some(mut synced) = synced else {
            return;
        };
        let listed = async {
            if synced.wait_for(|s| s.remote && s.local()).await.is_err() {
                std::future::pending::<()>().await
            }
        };
        tokio::select! {
            _ = listed => {}
            _ = runs.changed() => std::future::pending::<()>().await,
        }
    }

    pub(super) async fn stop(self, cleanup: bool) -> Result<()> {
        drop(self.cancel);
        let _ = self.task.await;
        let run = self.shared.running.lock().take();
        match run {
            Some(run) => {
                let (metrics, feed) = {
                    let p = self.shared.parts.lock();
                    (p.deps.metrics.clone(), p.feed.clone())
                };
                metrics.write_leases.watched.dec();
                let stopped = run.stop(cleanup).await;
                // As at a park: what this run said no longer counts (a replacement's
                // list makes the cluster known again; a removed link leaves anyway).
                if let Some(feed) = feed.filter(|_| !cleanup) {
                    feed.unknown();
                }
                stopped
            }
            // The replica holding the link's Lease deletes them (the link manager's
            // cleanup waits for the Lease here, as on a replica that does not lead).
            None if cleanup => Err(Error::NotLeader),
            None => Ok(()),
        }
    }
}

/// Runs the link while it is wanted here; stops it once it has not been for `linger`.
/// `leader`: this replica's leadership, for a link that feeds the federation.
async fn supervise(
    shared: Arc<impl Runs>,
    mut gate: watch::Receiver<Option<Instant>>,
    mut leader: Option<Leadership>,
    linger: Duration,
    cancel: CancellationToken,
) {
    let mut runs = shared.runs();
    let mut unwanted_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let end = *gate.borrow_and_update();
        runs.borrow_and_update();
        // Read (and marked seen) every time: an unseen change would wake `changed`
        // below at once, for ever.
        let leads = leader.as_mut().is_some_and(Leadership::leading_and_update);
        let want = wanted(end, now, leader.is_some(), leads);
        // When to look again without a change told: the hold ends unrenewed (a
        // renewal moves the end without waking anyone), or the linger is over.
        let mut wake = None;
        if want {
            unwanted_since = None;
            if !shared.is_running() {
                shared.run();
                runs.borrow_and_update();
            }
            wake = end.filter(|e| *e > now);
        } else if shared.is_running() && shared.parkable() {
            let since = *unwanted_since.get_or_insert(now);
            if now >= since + linger {
                shared.park().await;
                runs.borrow_and_update();
                unwanted_since = None;
            } else {
                wake = Some(since + linger);
            }
        }
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let led = crate::leader::next_change(leader.as_mut());
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = gate.changed() => {
                // The gates are gone: the process is shutting down.
                if r.is_err() {
                    return;
                }
            }
            // A run started by someone else (a rotation's proof): its linger starts.
            _ = runs.changed() => {}
            _ = led => {}
            _ = sleep => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_link_runs_where_its_lease_is_held_and_on_the_leader_if_it_feeds_the_federation() {
        let now = Instant::now();
        let held = Some(now + Duration::from_secs(5));
        let lapsed = Some(now - Duration::from_millis(1));
        // (gate, feeds the federation, leads, runs here)
        let cases = [
            (held, false, false, true),
            (held, true, false, true),
            (None, false, true, false),
            (None, true, true, true),
            (None, true, false, false),
            (lapsed, false, false, false),
            (lapsed, true, true, true),
        ];
        for (gate, feeds, leads, want) in cases {
            assert_eq!(
                wanted(gate, now, feeds, leads),
                want,
                "gate {gate:?}, feeds {feeds}, leads {leads}"
            );
        }
    }

    /// Runs nothing; counts how often the supervisor looks.
    #[derive(Default)]
    struct Fake {
        running: AtomicBool,
        paused: AtomicBool,
        looks: AtomicUsize,
        runs: watch::Sender<u64>,
    }

    impl Runs for Fake {
        fn is_running(&self) -> bool {
            self.looks.fetch_add(1, Ordering::SeqCst);
            self.running.load(Ordering::SeqCst)
        }
        fn run(&self) {
            self.running.store(true, Ordering::SeqCst);
            self.runs.send_modify(|n| *n += 1);
        }
        async fn park(&self) {
            self.running.store(false, Ordering::SeqCst);
            self.runs.send_modify(|n| *n += 1);
        }
        fn parkable(&self) -> bool {
            !self.paused.load(Ordering::SeqCst)
        }
        fn runs(&self) -> watch::Receiver<u64> {
            self.runs.subscribe()
        }
    }

    fn spawn(
        fake: &Arc<Fake>,
        gate: Option<Instant>,
        leader: Option<Leadership>,
        linger: Duration,
    ) -> (watch::Sender<Option<Instant>>, CancellationToken) {
        let (tx, rx) = watch::channel(gate);
        let cancel = CancellationToken::new();
        tokio::spawn(supervise(fake.clone(), rx, leader, linger, cancel.clone()));
        (tx, cancel)
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(5), "{what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_held_link_that_feeds_the_leader_sleeps_through_leadership_news() {
        let fake = Arc::new(Fake::default());
        let (said, leader) = Leadership::manual(true);
        let held = Some(Instant::now() + Duration::from_secs(60));
        let (_gate, cancel) = spawn(&fake, held, Some(leader), Duration::from_secs(1));
        until("running", || fake.running.load(Ordering::SeqCst)).await;
        for leads in [false, true, true, false] {
            said.send_replace(leads);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let looks = fake.looks.load(Ordering::SeqCst);
        // One look per change told, and a few: not a loop spinning on an unseen one.
        assert!(looks < 20, "{looks} looks");
        assert!(
            fake.running.load(Ordering::SeqCst),
            "held: runs whoever leads"
        );
        cancel.cancel();
    }

    #[tokio::test]
    async fn an_unwanted_run_stops_after_the_linger_not_while_paused_and_runs_again() {
        let fake = Arc::new(Fake::default());
        let (said, leader) = Leadership::manual(true);
        let linger = Duration::from_millis(300);
        let (gate, cancel) = spawn(&fake, None, Some(leader), linger);
        until("runs on the leader", || fake.running.load(Ordering::SeqCst)).await;
        // Paused (a rotation's proof): never stopped for being unwanted.
        fake.paused.store(true, Ordering::SeqCst);
        said.send_replace(false);
        tokio::time::sleep(linger * 2).await;
        assert!(fake.running.load(Ordering::SeqCst), "paused: kept");
        fake.paused.store(false, Ordering::SeqCst);
        fake.runs.send_modify(|n| *n += 1);
        let t = Instant::now();
        until("stopped once resumed and unwanted", || {
            !fake.running.load(Ordering::SeqCst)
        })
        .await;
        assert!(
            t.elapsed() >= linger - Duration::from_millis(20),
            "{:?}",
            t.elapsed()
        );
        // A gate closed for less than the linger stops nothing.
        gate.send_replace(Some(Instant::now() + Duration::from_secs(60)));
        until("runs where held", || fake.running.load(Ordering::SeqCst)).await;
        gate.send_replace(None);
        tokio::time::sleep(linger / 3).await;
        gate.send_replace(Some(Instant::now() + Duration::from_secs(60)));
        tokio::time::sleep(linger).await;
        assert!(fake.running.load(Ordering::SeqCst), "a blip stops nothing");
        // A hold that ends unrenewed (no change told) stops it after the linger.
        gate.send_replace(Some(Instant::now() + Duration::from_millis(100)));
        until("stopped after an unrenewed hold", || {
            !fake.running.load(Ordering::SeqCst)
        })
        .await;
        cancel.cancel();
    }
}
