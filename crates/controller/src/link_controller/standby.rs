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
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

struct Shared {
    /// The config moves with [`Standby::move_gateway`]: a later run starts from it.
    parts: Mutex<Parts>,
    running: Mutex<Option<Running>>,
    /// Started paused and not resumed yet (a replacement waiting for its predecessor).
    paused: AtomicBool,
    /// Counts starts and stops, for [`Standby::wait_synced`].
    runs: watch::Sender<u64>,
}

impl Shared {
    fn is_running(&self) -> bool {
        self.running.lock().is_some()
    }

    /// Runs the link here.
    fn run(&self) {
        let run = {
            let p = self.parts.lock();
            Running::start(
                p.local.clone(),
                p.remote.clone(),
                p.link.clone(),
                p.config.clone(),
                p.deps.clone(),
                self.paused.load(Ordering::Acquire),
                p.feed.clone(),
            )
        };
        let (cluster, metrics) = self.cluster_and_metrics();
        tracing::info!(%cluster, "standby: the link runs on this replica now");
        metrics.write_leases.watched.inc();
        *self.running.lock() = Some(run);
        self.runs.send_modify(|n| *n += 1);
    }

    /// Stops the link's run here, its mirrors left in place; the federation no longer
    /// counts on what it last said (the cluster pending until a run lists again).
    async fn park(&self) {
        let Some(run) = self.running.lock().take() else {
            return;
        };
        let (cluster, metrics) = self.cluster_and_metrics();
        run.forget_metrics();
        let _ = run.stop(false).await;
        metrics.write_leases.watched.dec();
        let feed = self.parts.lock().feed.clone();
        if let Some(feed) = feed {
            feed.unknown();
        }
        tracing::info!(%cluster, "standby: the link's write Lease is held elsewhere; its watches stopped here");
        self.runs.send_modify(|n| *n += 1);
    }

    fn cluster_and_metrics(&self) -> (String, Arc<crate::metrics::Metrics>) {
        let p = self.parts.lock();
        (p.link.cluster_name.clone(), p.deps.metrics.clone())
    }
}

/// Whether the link runs here now: its Lease is held here, or it feeds the federation
/// and this replica leads (`leads` is read only then).
fn wanted(
    gate_end: Option<Instant>,
    now: Instant,
    feeds: bool,
    leads: impl FnOnce() -> bool,
) -> bool {
    crate::leader::gate_open(gate_end, now) || (feeds && leads())
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
        let leader = parts.deps.leader.clone();
        let feeds = parts.feed.is_some();
        let (link, source) = (parts.link.clone(), parts.deps.link_secret.clone());
        let shared = Arc::new(Shared {
            parts: Mutex::new(parts),
            running: Mutex::new(None),
            paused: AtomicBool::new(paused),
            runs: watch::Sender::new(0),
        });
        let leads = || leader.as_ref().is_some_and(Leadership::leading);
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
            leader.filter(|_| feeds),
            linger,
            cancel.clone(),
        ));
        Self {
            shared,
            link,
            source,
            cancel,
            task,
        }
    }

    pub(super) fn resume(&self) {
        self.shared.paused.store(false, Ordering::Release);
        if let Some(run) = self.shared.running.lock().as_ref() {
            run.resume();
        }
    }

    pub(super) fn move_gateway(&self, gateway: crate::gateway::GatewaySource) -> bool {
        let crate::gateway::GatewaySource::Link { .. } = gateway else {
            return false;
        };
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
        if let Some(run) = self.shared.running.lock().as_ref() {
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

    pub(super) fn status(&self) -> LinkStatus {
        match self.shared.running.lock().as_ref() {
            Some(run) => run.status(),
            None => LinkStatus::standby(),
        }
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

    /// Until the run's caches have listed; at once while the link does not run here.
    pub(super) async fn wait_synced(&self) {
        let mut runs = self.shared.runs.subscribe();
        loop {
            runs.borrow_and_update();
            let synced = self.shared.running.lock().as_ref().map(Running::synced);
            let Some(mut synced) = synced else {
                return;
            };
            let listed = async { synced.wait_for(|s| s.remote && s.local()).await.is_ok() };
            tokio::select! {
                ok = listed => {
                    if ok {
                        return;
                    }
                    // That run stopped: look again.
                    if runs.changed().await.is_err() {
                        return;
                    }
                }
                r = runs.changed() => {
                    if r.is_err() {
                        return;
                    }
                }
            }
        }
    }

    pub(super) async fn stop(self, cleanup: bool) -> Result<()> {
        self.cancel.cancel();
        let _ = self.task.await;
        let run = self.shared.running.lock().take();
        match run {
            Some(run) => {
                self.shared
                    .parts
                    .lock()
                    .deps
                    .metrics
                    .write_leases
                    .watched
                    .dec();
                run.stop(cleanup).await
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
    shared: Arc<Shared>,
    mut gate: watch::Receiver<Option<Instant>>,
    mut leader: Option<Leadership>,
    linger: Duration,
    cancel: CancellationToken,
) {
    let mut unwanted_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let end = *gate.borrow_and_update();
        let feeds = leader.is_some();
        let want = wanted(end, now, feeds, || {
            leader.as_mut().is_some_and(Leadership::leading_and_update)
        });
        // When to look again without a change told: the hold ends unrenewed (a
        // renewal moves the end without waking anyone), or the linger is over.
        let mut wake = None;
        if want {
            unwanted_since = None;
            if !shared.is_running() {
                shared.run();
            }
            wake = end.filter(|e| *e > now);
        } else if shared.is_running() {
            let since = *unwanted_since.get_or_insert(now);
            if now >= since + linger {
                shared.park().await;
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
        let led = async {
            match leader.as_mut() {
                Some(l) => {
                    if l.changed().await.is_err() {
                        std::future::pending::<()>().await
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = gate.changed() => {
                // The gates are gone: the process is shutting down.
                if r.is_err() {
                    return;
                }
            }
            _ = led => {}
            _ = sleep => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::wanted;
    use std::time::{Duration, Instant};

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
                wanted(gate, now, feeds, || leads),
                want,
                "gate {gate:?}, feeds {feeds}, leads {leads}"
            );
        }
    }

    #[test]
    fn leadership_is_not_read_for_a_link_that_feeds_nothing() {
        let now = Instant::now();
        assert!(!wanted(None, now, false, || panic!("read")));
    }
}
