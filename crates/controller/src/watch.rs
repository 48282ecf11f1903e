//! The one way this controller loops over a watch: a kube watcher stream with kube's
//! backoff, stopped by a cancellation token; each event is stripped, applied to a
//! store, then handed to a callback; errors go to another callback (logs, metrics).
//!
//! A store may refuse an event (a capped cache: cache.rs): the watch then stops, says
//! so once to a third callback, and starts afresh (a complete list) after a long
//! backoff, 1 min doubling to 10 min: a remote too large now is likely too large in a
//! second, and each try lists it all again.
//!
//! The backoff on the stream is kube's `default_backoff` (0.8 s doubling to 30 s with
//! jitter, reset after two quiet minutes), not [`crate::backoff::Backoff`]: it lives
//! inside the stream and resets itself when the watch recovers, which is what a watch
//! of an apiserver wants; our `Backoff` schedules per-key retries of the work queues.

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// An event a store refused because it would pass its cap in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverCap {
    /// The cap, in bytes.
    pub(crate) cap: usize,
    /// What the store would have held with the event's object, in bytes.
    pub(crate) would_hold: usize,
}

/// First wait after a refusal; it doubles up to [`REFUSED_BACKOFF_MAX`].
const REFUSED_BACKOFF_MIN: Duration = Duration::from_secs(60);
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
    let start = || {
        watcher(api.clone(), config.clone())
            .default_backoff()
            .boxed()
    };
    let mut stream = start();
    let mut refused_wait = REFUSED_BACKOFF_MIN;
    loop {
        let ev = tokio::select! {
            _ = cancel.cancelled() => return,
            _ = restart.notified() => {
                stream = start();
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
                if let Err(over) = store.try_apply(&ev) {
                    on_refused(&over, refused_wait);
                    // Dropping the stream ends its requests: the list stops here.
                    drop(std::mem::replace(
                        &mut stream,
                        futures::stream::pending().boxed(),
                    ));
                    tokio::select! {
                        _ = cancel.cancelled() => return,
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
            Some(Err(e)) => on_error(&e),
            None => return,
        }
    }
}
