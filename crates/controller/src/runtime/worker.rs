//! The workers of a component: each takes a key from the work queue while the gate is
//! open, reconciles it, and reports the outcome back to the queue (which schedules what
//! comes next for the key: nothing, a requeue after a delay, or a retry with backoff).
//!
//! A component is an index fed by watches (which add keys to the queue) plus
//! [`Reconcile::reconcile`] of one key, as kubert's `IndexNamespacedResource` + requeue.

use super::gate::{Gate, Listed};
use super::metrics::Meter;
use super::queue::{Outcome, WorkQueue};
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What a component does with one key.
pub(crate) trait Reconcile<K>: Send + Sync + 'static {
    /// Why a reconcile failed.
    type Error: Send;

    /// Brings what `key` names to its desired state.
    fn reconcile(&self, key: &K) -> impl Future<Output = Result<Outcome, Self::Error>> + Send;

    /// Where the workers count this component's reconciles (`None`: not counted).
    fn meter(&self) -> Option<Meter<'_>> {
        None
    }

    /// Which instance of the component this is, for the log (a link's cluster name;
    /// empty for a process-wide component).
    fn scope(&self) -> &str {
        ""
    }

    /// The reconcile of `key` succeeded (before the queue hears of it).
    fn succeeded(&self, _key: &K) {}

    /// The reconcile of `key` failed for the `failures`-th time in a row; the queue
    /// retries it with backoff.
    fn failed(&self, key: &K, error: Self::Error, failures: u32)
    -> impl Future<Output = ()> + Send;
}

/// Starts `workers` (at least one) workers of `queue` under `gate`.
pub(crate) fn spawn<K, S, R>(
    workers: usize,
    queue: &WorkQueue<K>,
    gate: &Gate<S>,
    rec: &Arc<R>,
    cancel: &CancellationToken,
) -> Vec<JoinHandle<()>>
where
    K: Clone + Eq + Hash + std::fmt::Display + Send + Sync + 'static,
    S: Listed + Send + Sync + 'static,
    R: Reconcile<K>,
{
    (0..workers.max(1))
        .map(|_| {
            tokio::spawn(work(
                queue.clone(),
                gate.clone(),
                rec.clone(),
                cancel.clone(),
            ))
        })
        .collect()
}

/// One worker: reconciles keys from `queue` while `gate` is open, until cancelled.
pub(crate) async fn work<K, S, R>(
    queue: WorkQueue<K>,
    gate: Gate<S>,
    rec: Arc<R>,
    cancel: CancellationToken,
) where
    K: Clone + Eq + Hash + std::fmt::Display + Send + Sync + 'static,
    S: Listed + Send + Sync + 'static,
    R: Reconcile<K>,
{
    loop {
        if !gate.wait_open(&cancel).await {
            return;
        }
        let Some(key) = queue.next().await else {
            return;
        };
        if !gate.open_now() {
            // The lead was lost (or the component paused) while waiting: keep the key.
            queue.done(key.clone(), Outcome::Done);
            queue.add(key);
            continue;
        }
        let started = std::time::Instant::now();
        // Boxed: a reconcile's future is large (a link's: about 90 KB, its plan and
        // objects inline), and inline it would be part of every worker task for good,
        // busy or idle: 4 workers a link, 0.36 MiB a link (heap profile, 10 links x
        // 1,000 Services, BENCHMARKS.md "What the live heap holds"). Boxed, it exists
        // only while a key is reconciled.
        let result = Box::pin(rec.reconcile(&key)).await;
        let meter = rec.meter();
        let label = crate::runtime::metrics::outcome_label(result.as_ref().ok());
        if let Some(m) = meter {
            m.families
                .observe(m.component, result.as_ref().ok(), started.elapsed());
        }
        // The key outlives the queue's copy only for the debug line below.
        let logged =
            (meter.is_some() && tracing::enabled!(tracing::Level::DEBUG)).then(|| key.clone());
        match result {
            Ok(outcome) => {
                rec.succeeded(&key);
                queue.done(key, outcome);
            }
            Err(e) => {
                let failures = queue.done(key.clone(), Outcome::Failed);
                Box::pin(rec.failed(&key, e, failures)).await;
            }
        }
        // One debug line per reconcile, once all it does is done (the failure's report
        // included): the witness tests wait on for "this key's change was reconciled"
        // before they check that nothing was written (a wait on an event instead of a
        // fixed sleep).
        if let (Some(m), Some(logged)) = (meter, logged) {
            tracing::debug!(
                component = %m.component,
                scope = %rec.scope(),
                key = %logged,
                outcome = %label,
                "reconciled"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::Backoff;
    use parking_lot::Mutex;
    use std::time::Duration;
    use tokio::sync::watch;

    /// Records what it was asked; fails `fail` times, then succeeds.
    #[derive(Default)]
    struct Recorder {
        seen: Mutex<Vec<&'static str>>,
        failed: Mutex<Vec<(&'static str, u32)>>,
        fail: Mutex<u32>,
    }

    impl Reconcile<&'static str> for Recorder {
        type Error = ();

        async fn reconcile(&self, key: &&'static str) -> Result<Outcome, ()> {
            self.seen.lock().push(key);
            let mut fail = self.fail.lock();
            if *fail > 0 {
                *fail -= 1;
                return Err(());
            }
            Ok(Outcome::Done)
        }

        async fn failed(&self, key: &&'static str, _: (), failures: u32) {
            self.failed.lock().push((key, failures));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_reconciled_until_the_gate_opens() {
        let cancel = CancellationToken::new();
        let queue = WorkQueue::new(Backoff::default(), cancel.clone());
        let (synced_tx, synced) = watch::channel(false);
        let gate = Gate::new(synced, None, false);
        let rec = Arc::new(Recorder::default());
        let tasks = spawn(2, &queue, &gate, &rec, &cancel);
        queue.add("a");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(rec.seen.lock().is_empty(), "caches not listed");
        synced_tx.send_replace(true);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(*rec.seen.lock(), ["a"]);
        cancel.cancel();
        for t in tasks {
            t.await.unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_key_is_retried_with_its_failures_counted() {
        let cancel = CancellationToken::new();
        let queue = WorkQueue::new(Backoff::default(), cancel.clone());
        let gate = Gate::new(watch::channel(true).1, None, false);
        let rec = Arc::new(Recorder {
            fail: Mutex::new(2),
            ..Recorder::default()
        });
        spawn(1, &queue, &gate, &rec, &cancel);
        queue.add("a");
        // Backoff::default: 5 ms, then 10 ms.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(*rec.seen.lock(), ["a", "a", "a"]);
        assert_eq!(*rec.failed.lock(), [("a", 1), ("a", 2)]);
        assert_eq!(queue.failing(), 0, "the success forgot the failures");
        cancel.cancel();
    }
}
