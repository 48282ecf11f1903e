//! The state of a link's remote apiserver (core `remote_state`: Connected →
//! Disconnected → Stale → Expired) kept up to date, and its transitions reported.
//!
//! The remote watch reports what it sees ([`RemoteHealth::watch_event`],
//! [`RemoteHealth::failed`], [`RemoteHealth::listed`], no I/O); one task per link
//! ([`run`]) turns the time since the watch last worked into a state, with a timer so
//! that a silent remote moves on without any watch event, and on each change sets the
//! metric, the Link's `RemoteReachable` condition, an Event on the link object, and
//! queues the link's keys once. Reconciles read the published state
//! ([`RemoteHealth::state`]) as one input of the desired endpoints.
//!
//! "Answers" means the WATCH works: a complete list from the watch, or a watch event.
//! A remote that allows list but refuses or breaks watch (RBAC without `watch`, a proxy
//! cutting watches) answers a LIST while its mirrors go stale, so a LIST alone is only
//! information (logged, and in the condition's message). A watch that resumes after an
//! outage (kube's watcher keeps its resource version) yields no event until something
//! changes, so while the watch fails the task asks the remote itself every
//! [`check_period`]: a one-item LIST of Services, then a 1 s WATCH from its version;
//! when the watch holds, the remote watch starts afresh, and its first complete list
//! reconnects the link (from Stale or Expired, watch events alone do not: endpoints
//! come back from a complete list, not from a cache as old as the outage).

use super::WorkQueue;
use super::index::Index;
use super::metrics::LinkMetrics;
use crate::writer::LocalWriter;
use crate::writer::link_status::{LinkStatusWriter, condition};
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::api::{Api, ListParams};
use parking_lot::Mutex;
use service_mirror_core::{RemoteState, ServiceKey, StalePolicy, relist_untrusted};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// The condition type on a `Link` (beside our `Ready`).
pub(crate) const CONDITION_TYPE: &str = "RemoteReachable";

/// Longest hold of the deletes of a list that would delete every mirror after an
/// outage (unless a second list confirms it first): the grace, between 5 s and 30 s
/// (30 s with the default grace; a remote that is really empty then loses its mirrors
/// within the 60 s the chaos suite allows a world to converge).
fn relist_hold(policy: &StalePolicy) -> Duration {
    policy
        .grace
        .clamp(Duration::from_secs(5), Duration::from_secs(30))
}

/// How often a failing remote is asked whether it answers again: a quarter of the
/// grace, between 250 ms and 5 s (one cheap request per link and period, only while
/// the watch fails).
fn check_period(policy: &StalePolicy) -> Duration {
    (policy.grace / 4).clamp(Duration::from_millis(250), Duration::from_secs(5))
}

/// What a complete list of the remote means for deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ListVerdict {
    /// Trusted: the caches follow it.
    Trusted,
    /// After an outage it would delete every mirror: deletes are held.
    Held,
}

#[derive(Debug)]
struct Inner {
    /// When the remote stopped answering (`None`: it answers).
    silent_since: Option<Instant>,
    /// The state last published.
    state: RemoteState,
    /// The watch failed since the last complete list.
    outage_since_list: bool,
    /// Deletes are held until then (an untrusted list).
    hold_until: Option<Instant>,
    /// A hold began or ended and is not reported yet.
    hold_news: Option<bool>,
    /// A complete list is replacing the cache and its verdict is not known yet.
    list_pending: bool,
    /// The remote answers a LIST but its watch fails, and why (the last check).
    watch_failing: Option<String>,
    /// A fresh list was asked of the remote watch and has neither completed nor failed.
    relist_requested: bool,
}

/// What the watches know of the remote, and the state they lead to.
#[derive(Debug)]
pub(crate) struct RemoteHealth {
    policy: StalePolicy,
    inner: Mutex<Inner>,
    wake: Notify,
    /// Notified when the remote watch should start afresh (a complete list).
    pub(super) relist: Notify,
    /// The remote is refused for its size (reason, note) until a list fits: the Link's
    /// `RemoteReachable` condition says so instead of the state.
    refusal: Mutex<Option<(&'static str, String)>>,
}

impl RemoteHealth {
    /// A remote that answers, under `policy`.
    pub(super) fn new(policy: StalePolicy) -> Self {
        Self {
            refusal: Mutex::new(None),
            policy,
            inner: Mutex::new(Inner {
                silent_since: None,
                state: RemoteState::Connected,
                outage_since_list: false,
                hold_until: None,
                hold_news: None,
                list_pending: false,
                watch_failing: None,
                relist_requested: false,
            }),
            wake: Notify::new(),
            relist: Notify::new(),
        }
    }

    /// The watch works again: the clock stops and the state is published anew.
    fn answered(&self) {
        let mut inner = self.inner.lock();
        inner.watch_failing = None;
        let was_silent = inner.silent_since.take().is_some();
        drop(inner);
        if was_silent {
            self.wake.notify_one();
        }
    }

    /// A watch event (not of a list) arrived: the watch works. Before Stale it answers;
    /// from Stale on, endpoints come back only from a complete list, which it asks for.
    pub(super) fn watch_event(&self) {
        let (silent, state) = {
            let inner = self.inner.lock();
            (inner.silent_since.is_some(), inner.state)
        };
        if !silent {
            return;
        }
        match state {
            RemoteState::Connected | RemoteState::Disconnected => self.answered(),
            RemoteState::Stale | RemoteState::Expired => self.request_relist(),
        }
    }

    /// Asks the remote watch for a fresh complete list, once until it lists or fails: a
    /// second request would restart the watch and abort the list under way, and a list
    /// longer than the check period (thousands of Services, a slow link) would then
    /// never complete.
    fn request_relist(&self) {
        let mut inner = self.inner.lock();
        if !std::mem::replace(&mut inner.relist_requested, true) {
            drop(inner);
            self.relist.notify_one();
        }
    }

    /// The task's check: the remote's watch holds (a complete list is asked for), or it
    /// answers a LIST while its watch fails with `reason` (the clock goes on).
    fn checked(&self, watch: Result<(), String>) {
        match watch {
            Ok(()) => {
                let mut inner = self.inner.lock();
                inner.watch_failing = None;
                // The watch listed meanwhile (the clock stopped): a second list now
                // would confirm a held one with no reason.
                let silent = inner.silent_since.is_some();
                drop(inner);
                if silent {
                    self.request_relist();
                }
            }
            Err(reason) => self.inner.lock().watch_failing = Some(reason),
        }
    }

    /// A remote watch call failed: the clock starts at the first failure (the open
    /// watch was the last answer).
    pub(super) fn failed(&self) {
        let mut inner = self.inner.lock();
        inner.outage_since_list = true;
        // The requested list (if any) failed: the next check may ask again.
        inner.relist_requested = false;
        if inner.silent_since.is_none() {
            inner.silent_since = Some(Instant::now());
            drop(inner);
            self.wake.notify_one();
        }
    }

    /// A complete list of the remote arrived, exporting `exported` Services while the
    /// link has `mirrors`. A list after an outage that would delete every mirror is held
    /// (cilium#47793); the next complete list, or the end of the hold, confirms it.
    /// A complete list is an answer: the clock stops.
    pub(super) fn listed(&self, mirrors: usize, exported: usize) -> ListVerdict {
        self.answered();
        if self.refusal.lock().take().is_some() {
            self.wake.notify_one();
        }
        let mut inner = self.inner.lock();
        inner.list_pending = false;
        inner.relist_requested = false;
        let after_outage = std::mem::take(&mut inner.outage_since_list);
        if inner.hold_until.is_some() && !after_outage {
            // The second complete list, with no outage since the first: trusted.
            inner.hold_until = None;
            inner.hold_news = Some(false);
            drop(inner);
            self.wake.notify_one();
            return ListVerdict::Trusted;
        }
        if !relist_untrusted(after_outage, mirrors, exported) {
            if inner.hold_until.take().is_some() {
                // A new outage, but this list exports mirrors: the hold has no reason.
                inner.hold_news = Some(false);
                drop(inner);
                self.wake.notify_one();
            }
            return ListVerdict::Trusted;
        }
        // A first untrusted list, or one after a new outage since the held list (which
        // confirms nothing): the hold starts again.
        inner.hold_until = Some(Instant::now() + relist_hold(&self.policy));
        inner.hold_news = Some(true);
        drop(inner);
        self.wake.notify_one();
        ListVerdict::Held
    }

    /// A complete list is about to replace the cache (before [`RemoteHealth::listed`]
    /// says what it means): until then a worker that sees a Service missing from it
    /// deletes nothing.
    pub(super) fn list_arriving(&self) {
        self.inner.lock().list_pending = true;
    }

    /// The remote is refused for its size (`RemoteTooLarge`, `RemoteResponseTooLarge`):
    /// said on a Link's condition until a complete list fits.
    pub(super) fn refused(&self, reason: &'static str, note: String) {
        *self.refusal.lock() = Some((reason, note));
        self.wake.notify_one();
    }

    /// Whether deletes of mirrors whose remote Service is missing are held now.
    pub(super) fn holding_deletes(&self) -> bool {
        let inner = self.inner.lock();
        inner.list_pending || inner.hold_until.is_some_and(|t| Instant::now() < t)
    }

    /// How long an empty list after an outage is held (the slice watch's too).
    pub(super) fn relist_hold(&self) -> Duration {
        relist_hold(&self.policy)
    }

    /// Publishes `state` as the task would (for tests that feed a state to a reader).
    #[cfg(test)]
    pub(super) fn publish(&self, state: RemoteState) {
        self.inner.lock().state = state;
    }

    /// The state last published (what reconciles build endpoints from).
    pub(crate) fn state(&self) -> RemoteState {
        self.inner.lock().state
    }

    /// How long the remote has not answered (`None`: it answers).
    fn unanswered(&self) -> Option<Duration> {
        self.inner.lock().silent_since.map(|t| t.elapsed())
    }
}

/// What the task of a link uses to report a transition.
pub(super) struct Reporter {
    pub(super) cluster: String,
    pub(super) metrics: LinkMetrics,
    pub(super) writer: LocalWriter,
    /// The link object (Secret or Link) Events are recorded on.
    pub(super) link_object: Option<ObjectReference>,
    /// The `Link` whose condition is written (Link links only).
    pub(super) link_status: Option<LinkStatusWriter>,
    pub(super) link_name: Option<String>,
    /// Only the leader writes Events and conditions.
    pub(super) leader: Option<crate::leader::Leadership>,
    /// A paused controller (the new one of a rotation) writes no condition, Event or
    /// metric: the one it replaces still reports the link.
    pub(super) writable: watch::Receiver<bool>,
    pub(super) index: Arc<parking_lot::Mutex<Index>>,
    pub(super) queue: WorkQueue<ServiceKey>,
    /// The remote, for the check while the watch fails.
    pub(super) remote: Api<Service>,
}

/// Keeps the state of `health` up to date until `cancel` fires.
pub(super) async fn run(health: Arc<RemoteHealth>, r: Reporter, cancel: CancellationToken) {
    let policy = health.policy;
    // Whether the current state is shown by the metric, and by the condition: shown
    // again when the controller resumes or gains the leadership (a new leader corrects
    // what the old one last wrote).
    let (mut metric_shown, mut condition_shown) = (false, false);
    let mut refusal_shown: Option<(&'static str, String)> = None;
    let mut leader = r.leader.clone();
    let mut writable = r.writable.clone();
    let mut last_check = Instant::now();
    // The check runs beside the timer: a remote that hangs must not delay a transition.
    let mut check: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let unanswered = health.unanswered();
        let now = policy.state(unanswered);
        let before = std::mem::replace(&mut health.inner.lock().state, now);
        if before != now {
            let failing = health.inner.lock().watch_failing.clone();
            r.transition(before, now, unanswered, failing.as_deref())
                .await;
            metric_shown = r.writable();
            condition_shown = r.reporting();
        }
        if !r.writable() {
            metric_shown = false;
        } else if !metric_shown {
            r.metrics.remote_state(now);
            metric_shown = true;
        }
        if !r.reporting() {
            condition_shown = false;
        } else if !condition_shown {
            let failing = health.inner.lock().watch_failing.clone();
            r.set_condition(now, &r.note(None, now, unanswered, failing.as_deref()))
                .await;
            condition_shown = true;
        }
        // A size refusal replaces the state on the condition while it lasts; the state
        // comes back with the list that fits.
        let refusal = health.refusal.lock().clone();
        if !r.reporting() {
            refusal_shown = None;
        } else if refusal != refusal_shown {
            match &refusal {
                Some((reason, note)) => r.write_condition("False", reason, note).await,
                None => {
                    let failing = health.inner.lock().watch_failing.clone();
                    let note = r.note(None, now, unanswered, failing.as_deref());
                    r.set_condition(now, &note).await;
                }
            }
            refusal_shown = refusal;
        }
        let hold_news = health.inner.lock().hold_news.take();
        match hold_news {
            Some(true) => r.hold_started(relist_hold(&policy)).await,
            Some(false) => r.hold_ended("a second complete list confirmed it"),
            None => {}
        }
        // The hold ran out with no second list.
        let expired_hold = {
            let mut inner = health.inner.lock();
            let over = inner.hold_until.is_some_and(|t| Instant::now() >= t);
            if over {
                inner.hold_until = None;
            }
            over
        };
        if expired_hold {
            r.hold_ended("the hold ran out");
        }
        // Sleep until the next threshold, the next check, the end of a hold, or news.
        let mut sleep = policy.next_change(unanswered);
        if unanswered.is_some() {
            // A check in flight (at most 5 s) is looked at again a period later.
            let in_flight = check.as_ref().is_some_and(|c| !c.is_finished());
            let next_check = match in_flight {
                true => check_period(&policy),
                false => check_period(&policy).saturating_sub(last_check.elapsed()),
            };
            sleep = Some(sleep.map_or(next_check, |s| s.min(next_check)));
        }
        if let Some(t) = health.inner.lock().hold_until {
            let left = t.saturating_duration_since(Instant::now());
            sleep = Some(sleep.map_or(left, |s| s.min(left)));
        }
        let sleep = sleep.unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            _ = cancel.cancelled() => {
                if let Some(c) = check.take() {
                    c.abort();
                }
                return;
            }
            _ = health.wake.notified() => {}
            _ = leader_changed(leader.as_mut()) => {}
            _ = changed(Some(&mut writable)) => {}
            _ = tokio::time::sleep(sleep) => {}
        }
        let idle = check.as_ref().is_none_or(|c| c.is_finished());
        if idle && health.unanswered().is_some() && last_check.elapsed() >= check_period(&policy) {
            last_check = Instant::now();
            let (remote, health, cluster) = (r.remote.clone(), health.clone(), r.cluster.clone());
            check = Some(tokio::spawn(async move {
                let Some(watch) = watch_holds(&remote).await else {
                    return;
                };
                if let Err(reason) = &watch {
                    // Said once per reason: a LIST answers, so this is not an outage of
                    // the apiserver but of its watch.
                    if health.inner.lock().watch_failing.as_ref() != Some(reason) {
                        tracing::warn!(%cluster, %reason, "the remote apiserver answers a list of services but its watch fails: mirrors go stale as if it did not answer");
                    }
                }
                health.checked(watch);
            }));
        }
    }
}

/// Resolves when `rx` changes; never without one, or once its sender is gone.
async fn changed(rx: Option<&mut watch::Receiver<bool>>) {
    let changed = match rx {
        Some(rx) => rx.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await
    }
}

/// Resolves on a leadership transition; never without election, or once it is gone.
async fn leader_changed(l: Option<&mut crate::leader::Leadership>) {
    let changed = match l {
        Some(l) => l.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await
    }
}

/// How long the check's WATCH must hold (the apiserver ends it cleanly then).
const WATCH_PROBE: u32 = 1;

/// Whether the remote's watch of Services works: `None` if it does not answer a
/// one-item LIST within 5 s; else whether a WATCH from the list's version holds for
/// [`WATCH_PROBE`] s and ends cleanly (`Err`: why not), within 5 s more.
async fn watch_holds(remote: &Api<Service>) -> Option<Result<(), String>> {
    use futures::TryStreamExt;
    let five = Duration::from_secs(5);
    let lp = ListParams::default().limit(1);
    let list = match tokio::time::timeout(five, remote.list_metadata(&lp)).await {
        Ok(Ok(l)) => l,
        _ => return None,
    };
    let version = list.metadata.resource_version.unwrap_or_default();
    let wp = kube::api::WatchParams::default().timeout(WATCH_PROBE);
    // The reason carries the remote's text (a Status message of any size, logged and in
    // the condition): bounded and cleaned as every remote text.
    let text = |e: &dyn std::fmt::Display| crate::links::sanitize_remote_text(&e.to_string());
    let watch = async {
        let started = Instant::now();
        let stream = remote
            .watch_metadata(&wp, &version)
            .await
            .map_err(|e| text(&e))?;
        futures::pin_mut!(stream);
        while let Some(ev) = stream.try_next().await.map_err(|e| text(&e))? {
            if let kube::api::WatchEvent::Error(e) = ev {
                return Err(format!("watch error: {}", text(&e)));
            }
        }
        // A proxy closing watches may end them cleanly, but early.
        match started.elapsed() {
            d if d < Duration::from_millis(900) => {
                Err(format!("the watch ended after {} ms", d.as_millis()))
            }
            _ => Ok(()),
        }
    };
    Some(match tokio::time::timeout(five, watch).await {
        Ok(r) => r,
        Err(_) => Err("the watch did not end within 5 s".into()),
    })
}

impl Reporter {
    fn leading(&self) -> bool {
        self.leader.as_ref().is_none_or(|l| l.leading())
    }

    fn writable(&self) -> bool {
        *self.writable.borrow()
    }

    /// Whether this controller writes the link's condition and Events.
    fn reporting(&self) -> bool {
        self.writable() && self.leading()
    }

    /// Every key the link has: exported remote Services and local mirrors.
    fn requeue_all(&self) {
        let keys = self.index.lock().all_keys();
        for k in keys {
            self.queue.add(k);
        }
    }

    /// What `now` means, entered from `before` (`None`: said again, not entered).
    fn note(
        &self,
        before: Option<RemoteState>,
        now: RemoteState,
        silent: Option<Duration>,
        watch_failing: Option<&str>,
    ) -> String {
        let cluster = &self.cluster;
        let silent_s = silent.map_or(0, |d| d.as_secs());
        let note = match (now, before) {
            (RemoteState::Connected, None) => {
                format!("watching the apiserver of cluster {cluster}")
            }
            (RemoteState::Connected, Some(before)) => format!(
                "the apiserver of cluster {cluster} answers again (was {}): mirrors follow it",
                before.label()
            ),
            (RemoteState::Disconnected, _) => format!(
                "the apiserver of cluster {cluster} has not answered for {silent_s} s (--remote-grace): mirrors kept as they are"
            ),
            (RemoteState::Stale, _) => format!(
                "the apiserver of cluster {cluster} has not answered for {silent_s} s (--stale-after): mirror endpoints turn not ready unless their gateway probe says alive"
            ),
            (RemoteState::Expired, _) => format!(
                "the apiserver of cluster {cluster} has not answered for {silent_s} s (--stale-delete-after): mirror endpoints emptied, Services kept"
            ),
        };
        match watch_failing.filter(|_| now != RemoteState::Connected) {
            Some(reason) => {
                format!("{note} (the apiserver answers a list, its watch fails: {reason})")
            }
            None => note,
        }
    }

    async fn transition(
        &self,
        before: RemoteState,
        now: RemoteState,
        silent: Option<Duration>,
        watch_failing: Option<&str>,
    ) {
        let cluster = &self.cluster;
        let note = self.note(Some(before), now, silent, watch_failing);
        match now {
            RemoteState::Connected => tracing::info!(%cluster, from = before.label(), "{note}"),
            _ => tracing::warn!(%cluster, from = before.label(), to = now.label(), "{note}"),
        }
        if self.writable() {
            self.metrics.remote_state(now);
        }
        // Only data-changing states get Events (and the way back from them).
        let event = match now {
            RemoteState::Connected => before >= RemoteState::Stale,
            RemoteState::Disconnected => false,
            RemoteState::Stale | RemoteState::Expired => true,
        };
        if self.reporting() {
            if let (true, Some(link), Some(reason)) = (event, &self.link_object, now.event_reason())
            {
                match now {
                    RemoteState::Connected => {
                        self.writer
                            .record_normal(link, reason, "Mirror", note.clone())
                            .await
                    }
                    _ => {
                        self.writer
                            .record(link, reason, "Mirror", note.clone())
                            .await
                    }
                }
            }
            self.set_condition(now, &note).await;
        }
        // The endpoints of every mirror depend on the state only from Stale on.
        if before.max(now) >= RemoteState::Stale {
            self.requeue_all();
        }
    }

    async fn hold_started(&self, hold: Duration) {
        let cluster = &self.cluster;
        let note = format!(
            "cluster {cluster} listed no exported Service after an outage, which would delete every mirror of the link: deletes held for up to {} s or until a second complete list confirms it (an apiserver that is recovering can list nothing)",
            hold.as_secs()
        );
        tracing::warn!(%cluster, "{note}");
        self.metrics.relist_held();
        if let (true, Some(link)) = (self.reporting(), &self.link_object) {
            self.writer
                .record(link, "RemoteListHeld", "Mirror", note)
                .await;
        }
    }

    fn hold_ended(&self, why: &str) {
        tracing::info!(cluster = %self.cluster, "held deletes released: {why}");
        self.requeue_all();
    }

    /// Sets the Link's `RemoteReachable` condition, keeping every other condition (a
    /// merge patch replaces the whole list); with the version read, retried on 409.
    async fn set_condition(&self, state: RemoteState, note: &str) {
        let status = if state == RemoteState::Connected {
            "True"
        } else {
            "False"
        };
        self.write_condition(status, state.reason(), note).await;
    }

    /// Writes `RemoteReachable` as given (see [`Reporter::set_condition`]).
    async fn write_condition(&self, status: &str, reason: &str, note: &str) {
        let (Some(writer), Some(name)) = (&self.link_status, &self.link_name) else {
            return;
        };
        let written = writer
            .condition(name, CONDITION_TYPE, None, |old, generation| {
                // Unchanged (a restarted link controller): not written again.
                if old.is_some_and(|c| c.status == status && c.reason == reason) {
                    return None;
                }
                Some(condition(
                    old,
                    CONDITION_TYPE,
                    status,
                    reason,
                    note,
                    generation,
                ))
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(link = %name, error = %e, "could not write the Link's RemoteReachable condition");
            self.metrics.error("remote_condition");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> StalePolicy {
        StalePolicy::new(
            Duration::from_secs(1),
            Duration::from_secs(3),
            Duration::from_secs(6),
        )
        .unwrap()
    }

    #[test]
    fn the_clock_starts_at_the_first_failure_and_stops_at_an_answer() {
        let h = RemoteHealth::new(policy());
        assert_eq!(h.unanswered(), None);
        h.failed();
        let first = h.inner.lock().silent_since;
        h.failed();
        assert_eq!(h.inner.lock().silent_since, first, "later failures keep it");
        assert!(h.unanswered().is_some());
        h.answered();
        assert_eq!(h.unanswered(), None);
    }

    #[test]
    fn only_an_empty_list_after_an_outage_is_held_and_the_next_list_confirms_it() {
        let h = RemoteHealth::new(policy());
        assert_eq!(h.listed(3, 0), ListVerdict::Trusted, "no outage: trusted");
        h.failed();
        h.answered();
        assert_eq!(h.listed(3, 1), ListVerdict::Trusted, "not every mirror");
        h.failed();
        h.answered();
        assert_eq!(h.listed(3, 0), ListVerdict::Held);
        assert!(h.holding_deletes());
        assert_eq!(h.listed(3, 0), ListVerdict::Trusted, "the second list");
        assert!(!h.holding_deletes());
        h.failed();
        assert_eq!(h.listed(0, 0), ListVerdict::Trusted, "no mirror to lose");
    }

    #[test]
    fn deletes_are_held_while_a_list_replaces_the_cache_until_its_verdict() {
        let h = RemoteHealth::new(policy());
        h.list_arriving();
        assert!(h.holding_deletes(), "the cache may be empty already");
        assert_eq!(h.listed(3, 3), ListVerdict::Trusted);
        assert!(!h.holding_deletes(), "trusted: deletes go on");
        h.failed();
        h.list_arriving();
        assert_eq!(h.listed(3, 0), ListVerdict::Held);
        assert!(h.holding_deletes(), "held by the verdict from then on");
    }

    #[test]
    fn a_list_after_a_new_outage_during_a_hold_confirms_nothing() {
        let h = RemoteHealth::new(policy());
        h.failed();
        h.answered();
        assert_eq!(h.listed(3, 0), ListVerdict::Held);
        h.failed();
        h.answered();
        assert_eq!(
            h.listed(3, 0),
            ListVerdict::Held,
            "a new outage: held again"
        );
        assert!(h.holding_deletes());
        assert_eq!(h.listed(3, 0), ListVerdict::Trusted, "the list after it");
        assert!(!h.holding_deletes());
        h.failed();
        assert_eq!(h.listed(3, 0), ListVerdict::Held);
        h.failed();
        assert_eq!(
            h.listed(3, 2),
            ListVerdict::Trusted,
            "a list exporting some"
        );
        assert!(!h.holding_deletes(), "the hold ends with it");
    }

    #[test]
    fn from_stale_only_a_complete_list_reconnects_and_a_watch_event_asks_for_one() {
        let h = RemoteHealth::new(policy());
        h.failed();
        h.inner.lock().state = RemoteState::Disconnected;
        h.watch_event();
        assert_eq!(h.unanswered(), None, "Disconnected: a watch event answers");
        for state in [RemoteState::Stale, RemoteState::Expired] {
            h.failed();
            h.inner.lock().state = state;
            h.watch_event();
            assert!(
                h.unanswered().is_some(),
                "{state:?}: an event is not a list"
            );
            h.checked(Err("403".into()));
            assert!(h.unanswered().is_some(), "{state:?}: a LIST is not a watch");
            assert_eq!(h.inner.lock().watch_failing.as_deref(), Some("403"));
            h.listed(1, 1);
            assert_eq!(h.unanswered(), None, "{state:?}: a complete list answers");
            assert_eq!(h.inner.lock().watch_failing, None);
        }
    }

    /// Whether a fresh list was asked for since the last look (consumes the request).
    fn asked(h: &RemoteHealth) -> bool {
        use futures::FutureExt;
        h.relist.notified().now_or_never().is_some()
    }

    #[test]
    fn a_list_under_way_is_never_restarted_by_later_checks_or_events() {
        let h = RemoteHealth::new(policy());
        h.failed();
        h.checked(Ok(()));
        assert!(asked(&h), "a passing check asks for a list");
        // The list takes longer than several check periods: it is not aborted.
        for _ in 0..5 {
            h.checked(Ok(()));
            assert!(!asked(&h), "asked once until it lists or fails");
        }
        h.inner.lock().state = RemoteState::Stale;
        h.watch_event();
        assert!(!asked(&h), "nor by a watch event");
        // The list failed: the next check asks again.
        h.failed();
        h.checked(Ok(()));
        assert!(asked(&h), "after a failure, asked again");
        h.listed(1, 1);
        assert_eq!(h.unanswered(), None);
        h.failed();
        h.checked(Ok(()));
        assert!(asked(&h), "after a list, a new outage asks again");
    }

    #[test]
    fn checks_and_holds_are_bounded_by_the_grace() {
        for (grace_ms, want_ms) in [(100, 250), (1000, 250), (4000, 1000), (60_000, 5000)] {
            let p = StalePolicy {
                grace: Duration::from_millis(grace_ms),
                ..StalePolicy::default()
            };
            assert_eq!(
                check_period(&p),
                Duration::from_millis(want_ms),
                "{grace_ms}"
            );
        }
        assert_eq!(relist_hold(&policy()), Duration::from_secs(5));
        assert_eq!(
            relist_hold(&StalePolicy::default()),
            Duration::from_secs(30)
        );
    }
}
