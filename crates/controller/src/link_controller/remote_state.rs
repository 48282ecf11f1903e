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
use crate::writer::link_status::LinkStatusWriter;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use parking_lot::Mutex;
use service_mirror_core::{RemoteState, ServiceKey, StalePolicy, relist_untrusted};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

mod reporter;
pub(super) use reporter::{Reporter, run};

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
