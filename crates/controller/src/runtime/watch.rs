//! The one way this controller loops over a watch: a kube watcher stream, stopped by a
//! cancellation token; each event is stripped, applied to a store, then handed to a
//! callback; errors go to another callback (logs, metrics), then the loop waits
//! ([`WatchBackoff`]) before the watcher tries again.
//!
//! Not kube's `default_backoff`: its `StreamBackoff` resets on every `Ok` item, and the
//! watcher yields `Ok(Event::Init)` before each list attempt, so after a failed list the
//! delay went back to 0.8 s every time: a watch refused for good (a missing CRD, a 403,
//! a remote answering 429 or 500) was retried about once a second forever (measured: 247
//! `list links` in 300 s without the Link CRD).
//!
//! A store may refuse an event (a capped cache: cache.rs): the watch then stops, says
//! so once to a third callback, and starts afresh (a complete list) after a long
//! backoff, 1 min doubling to 10 min: a remote too large now is likely too large in a
//! second, and each try lists it all again.

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The delays between a watch's failed attempts: 0.8 s doubling to 30 s (kube's
/// numbers), back to 0.8 s once the watch has worked for [`WatchBackoff::HEALTHY`]
/// (data arrived and no error since) or an error comes two minutes after the previous
/// one. A list that succeeds and a watch that fails at once (RBAC without `watch`)
/// keep doubling: the data alone is no recovery.
#[derive(Debug, Default)]
pub(crate) struct WatchBackoff {
    failures: u32,
    last: Option<Instant>,
    /// When data last arrived after the last error (`None`: none since).
    working_since: Option<Instant>,
}

impl WatchBackoff {
    const SCHEDULE: crate::backoff::Backoff =
        crate::backoff::Backoff::doubling(Duration::from_millis(800), Duration::from_secs(30));
    /// Errors further apart than this start the schedule over.
    const RESET_AFTER: Duration = Duration::from_secs(120);
    /// A watch that has delivered data and not failed for this long recovered: its next
    /// failure starts the schedule over. Without it a watch that failed a few times in
    /// one outage waited up to 30 s after the next (chaos, measured: rounds converging
    /// in 28-56 s, 0.5-1.4 s before the own backoff).
    const HEALTHY: Duration = Duration::from_secs(5);

    /// Data arrived at `now` (a list page, a watch event): the watch works.
    pub(crate) fn worked(&mut self, now: Instant) {
        self.working_since.get_or_insert(now);
    }

    /// An error at `now`: how long to wait before the next attempt.
    pub(crate) fn failed(&mut self, now: Instant) -> Duration {
        let apart = self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) > Self::RESET_AFTER);
        let recovered = self
            .working_since
            .is_some_and(|since| now.saturating_duration_since(since) >= Self::HEALTHY);
        if apart || recovered {
            self.failures = 0;
        }
        self.working_since = None;
        self.last = Some(now);
        self.failures += 1;
        Self::SCHEDULE.delay(self.failures)
    }

    /// The watch was started afresh on purpose: the next error waits the least.
    pub(crate) fn reset(&mut self) {
        *self = Self::default();
    }
}

/// An event a store refused because it would pass its cap in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverCap {
    /// The cap, in bytes (a list may take half: the other half holds the last
    /// complete list while a new one arrives).
    pub(crate) cap: usize,
    /// What the list (complete or in progress) would have held with the event's
    /// object, in bytes.
    pub(crate) would_hold: usize,
}

/// First wait after a refusal; it doubles up to [`REFUSED_BACKOFF_MAX`].
const REFUSED_BACKOFF_MIN: Duration = Duration::from_secs(60);

/// Objects per page of a watch's list (kube's default is 500). A page is held whole
/// while it is decoded, its text and every object with its `managedFields`, and a link
/// lists four kinds at once (at start, and again when its settings change): at 500 a
/// page of Endpoints or Services is some MiB, four of them the largest transient of a
/// 10,000-Service link. 100 costs five times the list requests (100 per 10,000
/// objects) for a fifth of that. Measured: BENCHMARKS.md (Memory).
pub(crate) const LIST_PAGE: u32 = 100;
/// Longest wait after a refusal.
const REFUSED_BACKOFF_MAX: Duration = Duration::from_secs(600);

/// Where the driver applies each event before the callback sees it.
pub(crate) trait Store<K> {
    /// Applies one watch event.
    fn apply(&mut self, ev: &watcher::Event<K>);

    /// [`Store::apply`], which a capped store may refuse (nothing changed but a list
    /// in progress dropped). Stores without a cap never refuse.
    fn try_apply(&mut self, ev: &watcher::Event<K>) -> Result<(), OverCap> {
        self.apply(ev);
        Ok(())
    }
}

impl<K> Store<K> for Writer<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn apply(&mut self, ev: &watcher::Event<K>) {
        self.apply_watcher_event(ev);
    }
}

/// One watch: what to watch and how to keep it.
pub(crate) struct Watch<K, S> {
    /// The API to watch.
    pub(crate) api: Api<K>,
    /// Selectors of the watch.
    pub(crate) config: watcher::Config,
    /// What to drop from each object before it is stored.
    pub(crate) strip: fn(&mut K),
    /// Where objects are kept.
    pub(crate) store: S,
}

/// Keeps every field of an object.
pub(crate) fn keep_all<K>(_: &mut K) {}

/// Runs `watch` until `cancel` fires or the stream ends: each event is stripped, stored,
/// then given to `on_event`; each error (the stream retries with backoff) to `on_error`.
pub(crate) async fn drive<K, S>(
    watch: Watch<K, S>,
    cancel: CancellationToken,
    on_event: impl FnMut(&watcher::Event<K>),
    on_error: impl FnMut(&watcher::Error),
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    S: Store<K>,
{
    drive_restartable(
        watch,
        cancel,
        &tokio::sync::Notify::new(),
        on_event,
        on_error,
        |_, _| {},
    )
    .await
}

/// [`drive`], with a watcher started afresh (a complete list first) each time `restart`
/// is notified: kube's watcher resumes a failed watch from its resource version, and a
/// resumed watch lists nothing. An event the store refuses goes to `on_refused` (not
/// to `on_event`) and stops the watch until a backoff passes (see above).
pub(crate) async fn drive_restartable<K, S>(
    watch: Watch<K, S>,
    cancel: CancellationToken,
    restart: &tokio::sync::Notify,
    mut on_event: impl FnMut(&watcher::Event<K>),
    mut on_error: impl FnMut(&watcher::Error),
    mut on_refused: impl FnMut(&OverCap, Duration),
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    S: Store<K>,
{
    let Watch {
        api,
        config,
        strip,
        mut store,
    } = watch;
    let config = config.page_size(LIST_PAGE);
    let start = || watcher(api.clone(), config.clone()).boxed();
    let mut stream = start();
    let mut backoff = WatchBackoff::default();
    let mut wait = None;
    let mut refused_wait = REFUSED_BACKOFF_MIN;
    loop {
        // After an error: wait (kube's watcher retries at once), still stoppable and
        // restartable.
        if let Some(delay) = wait.take() {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = restart.notified() => {
                    stream = start();
                    backoff.reset();
                    continue;
                }
                _ = tokio::time::sleep(delay) => {}
            }
        }
        let ev = tokio::select! {
            _ = cancel.cancelled() => return,
            _ = restart.notified() => {
                stream = start();
                backoff.reset();
                continue;
            }
            ev = stream.next() => ev,
        };
        match ev {
            Some(Ok(mut ev)) => {
                match &mut ev {
                    watcher::Event::Apply(o)
                    | watcher::Event::Delete(o)
                    | watcher::Event::InitApply(o) => strip(o),
                    watcher::Event::Init | watcher::Event::InitDone => {}
                }
                // `Init` comes before every attempt, failed or not: no sign of health.
                if !matches!(ev, watcher::Event::Init) {
                    backoff.worked(Instant::now());
                }
                if let Err(over) = store.try_apply(&ev) {
                    on_refused(&over, refused_wait);
                    // Dropping the stream ends its requests: the list stops here.
                    drop(std::mem::replace(
                        &mut stream,
                        futures::stream::pending().boxed(),
                    ));
                    // A restart asked meanwhile (the liveness check) lists at once.
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = restart.notified() => backoff.reset(),
                        _ = tokio::time::sleep(refused_wait) => {}
                    }
                    refused_wait = (refused_wait * 2).min(REFUSED_BACKOFF_MAX);
                    stream = start();
                    continue;
                }
                if matches!(ev, watcher::Event::InitDone) {
                    refused_wait = REFUSED_BACKOFF_MIN;
                }
                on_event(&ev);
            }
            Some(Err(e)) => {
                on_error(&e);
                wait = Some(backoff.failed(Instant::now()));
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(d: Duration) -> f64 {
        d.as_secs_f64()
    }

    #[test]
    fn repeated_failures_double_from_0_8_s_to_30_s() {
        let mut b = WatchBackoff::default();
        let t = Instant::now();
        let delays: Vec<f64> = (0..8)
            .map(|i| secs(b.failed(t + Duration::from_secs(i))))
            .collect();
        assert_eq!(delays, [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]);
    }

    #[test]
    fn an_error_two_minutes_after_the_last_starts_over_and_a_closer_one_does_not() {
        let mut b = WatchBackoff::default();
        let t = Instant::now();
        for i in 0..5 {
            b.failed(t + Duration::from_secs(i));
        }
        // 119 s later: still failing, the schedule goes on.
        assert_eq!(secs(b.failed(t + Duration::from_secs(123))), 25.6);
        // More than 120 s after that error: a fresh failure.
        assert_eq!(secs(b.failed(t + Duration::from_secs(244))), 0.8);
        assert_eq!(secs(b.failed(t + Duration::from_secs(245))), 1.6);
    }

    #[test]
    fn a_watch_that_worked_for_5_s_starts_over_and_one_failing_at_once_does_not() {
        let mut b = WatchBackoff::default();
        let t = Instant::now();
        let at = |s: u64| t + Duration::from_secs(s);
        for i in 0..4 {
            b.failed(at(i));
        }
        // Data, then a failure 2 s later (a list allowed, its watch refused): doubling.
        b.worked(at(10));
        assert_eq!(secs(b.failed(at(12))), 12.8);
        // Data, then 6 s without a failure: recovered, the next outage starts at 0.8 s.
        b.worked(at(20));
        assert_eq!(secs(b.failed(at(26))), 0.8);
        assert_eq!(secs(b.failed(at(27))), 1.6);
        // Without data in between, time alone (under two minutes) is no recovery.
        assert_eq!(secs(b.failed(at(60))), 3.2);
    }

    #[test]
    fn a_restart_on_purpose_starts_over() {
        let mut b = WatchBackoff::default();
        let t = Instant::now();
        for _ in 0..6 {
            b.failed(t);
        }
        b.reset();
        assert_eq!(secs(b.failed(t)), 0.8);
    }
}
