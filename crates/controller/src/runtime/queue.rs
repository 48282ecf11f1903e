//! A work queue of object keys: deduplicated, serialised per key, with per-key backoff.
//!
//! A key is handed to at most one worker at a time; a key added while a worker holds it
//! is marked dirty and handed out again when that worker is done, so no change is lost
//! and no key is reconciled twice at once.
//!
//! Why not kube's `Controller`: it keys on objects present in its stores, and a remote
//! Service that vanished (deleted while we were not watching, or its namespace denied)
//! must still be reconciled under its key so its mirror goes. Our keys are remote
//! `namespace/name` pairs fed by three watches (see `keys.rs`), not objects of one.
//!
//! Delayed adds (backoff, requeue-after) share one timer task holding a
//! `tokio_util::time::DelayQueue`, not one task per delayed key.

use crate::backoff::Backoff;
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

#[derive(Debug)]
struct State<K> {
    queued: HashSet<K>,
    active: HashSet<K>,
    dirty: HashSet<K>,
    failures: HashMap<K, u32>,
    delayed: HashMap<K, Instant>,
}

/// What became of one reconcile of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Converged; forget its failures.
    Done,
    /// Converged for now; look again after this delay (e.g. re-resolve a hostname).
    RequeueAfter(Duration),
    /// Failed; retry with backoff.
    Failed,
}

/// The queue. Cheap to clone.
#[derive(Debug)]
pub(crate) struct WorkQueue<K> {
    state: Arc<Mutex<State<K>>>,
    tx: mpsc::UnboundedSender<K>,
    rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<K>>>,
    /// To the timer task: a key and when it is due.
    delays: mpsc::UnboundedSender<(K, Instant)>,
    backoff: Backoff,
    cancel: CancellationToken,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            tx: self.tx.clone(),
            rx: self.rx.clone(),
            delays: self.delays.clone(),
            backoff: self.backoff,
            cancel: self.cancel.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// A new queue; delayed adds stop when `cancel` fires. Spawns the timer task, so it
    /// is called within a tokio runtime.
    pub(crate) fn new(backoff: Backoff, cancel: CancellationToken) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let (delays, due) = mpsc::unbounded_channel();
        let state = Arc::new(Mutex::new(State {
            queued: HashSet::new(),
            active: HashSet::new(),
            dirty: HashSet::new(),
            failures: HashMap::new(),
            delayed: HashMap::new(),
        }));
        tokio::spawn(timer(state.clone(), tx.clone(), due, cancel.clone()));
        Self {
            state,
            tx,
            rx: Arc::new(tokio::sync::Mutex::new(rx)),
            delays,
            backoff,
            cancel,
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State<K>> {
        self.state.lock()
    }

    /// Adds a key now (no-op when already queued; marked dirty when being worked on).
    /// A key waiting out a failure backoff runs now too, as client-go's `Add` bypasses
    /// its rate limiter: an add means something about the key changed, often the cause
    /// of the failure (a namespace made, a name freed), and holding it to a backoff of
    /// up to 300 s would leave it broken that long. Only a change adds a key: a key
    /// that keeps failing is retried by its backoff, not by this.
    pub(crate) fn add(&self, key: K) {
        add(&mut self.lock(), &self.tx, key);
    }

    /// Adds a key after `delay`, unless an earlier delayed add is already pending.
    pub(crate) fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let deadline = Instant::now() + delay;
        {
            let mut s = self.lock();
            match s.delayed.get(&key) {
                Some(at) if *at <= deadline => return,
                _ => s.delayed.insert(key.clone(), deadline),
            };
            // Sent under the lock, so the timer sees the deadlines of a key in order.
            let _ = self.delays.send((key, deadline));
        }
    }

    /// The next key to work on; `None` once cancelled.
    pub(crate) async fn next(&self) -> Option<K> {
        let key = {
            let mut rx = self.rx.lock().await;
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                k = rx.recv() => k?,
            }
        };
        let mut s = self.lock();
        s.queued.remove(&key);
        // A burst (a list queues every key of its link) grows the set to as many slots.
        super::slots::give_back(&mut s.queued);
        s.active.insert(key.clone());
        Some(key)
    }

    /// Reports the outcome of working on `key`; schedules what comes next for it.
    /// Returns the number of consecutive failures of the key.
    pub(crate) fn done(&self, key: K, outcome: Outcome) -> u32 {
        let (dirty, failures) = {
            let mut s = self.lock();
            s.active.remove(&key);
            let dirty = s.dirty.remove(&key);
            let failures = match outcome {
                Outcome::Failed => {
                    let n = s.failures.entry(key.clone()).or_default();
                    *n += 1;
                    *n
                }
                _ => {
                    s.failures.remove(&key);
                    0
                }
            };
            (dirty, failures)
        };
        match outcome {
            // New information arrived while it failed: try it at once, still counting.
            Outcome::Failed if dirty => self.add(key),
            Outcome::Failed => self.add_after(key, self.backoff.delay(failures)),
            _ if dirty => self.add(key),
            Outcome::RequeueAfter(d) => self.add_after(key, d),
            Outcome::Done => {}
        }
        failures
    }

    /// Keys waiting now or later (not those being worked on).
    pub(crate) fn depth(&self) -> usize {
        let s = self.lock();
        s.queued.len() + s.delayed.len()
    }

    /// Whether a key that failed `failures` times in a row is past its fast retries
    /// (`--event-requeue-limit`): retried on the slow schedule.
    pub(crate) fn retrying_slowly(&self, failures: u32) -> bool {
        failures > self.backoff.fast_retries
    }

    /// Keys whose last attempt failed.
    pub(crate) fn failing(&self) -> usize {
        self.lock().failures.len()
    }
}

/// The keys queued now, each taken and done (so it can be queued again), as text,
/// sorted: what an index test reads from its queue.
#[cfg(test)]
pub(crate) async fn queued<K>(queue: &WorkQueue<K>) -> Vec<String>
where
    K: Clone + Eq + Hash + Send + std::fmt::Display + 'static,
{
    let mut keys = Vec::new();
    while queue.depth() > 0 {
        let k = queue.next().await.unwrap();
        keys.push(k.to_string());
        queue.done(k, Outcome::Done);
    }
    keys.sort();
    keys
}

fn add<K: Clone + Eq + Hash>(s: &mut State<K>, tx: &mpsc::UnboundedSender<K>, key: K) {
    if s.active.contains(&key) {
        s.dirty.insert(key);
    } else if s.queued.insert(key.clone()) {
        let _ = tx.send(key);
    }
}

/// The timer of one queue: adds each delayed key when it is due. A key has at most one
/// timer; an earlier deadline moves it (a later one never reaches here, see
/// `add_after`). Ends when the queue is cancelled or dropped.
async fn timer<K: Clone + Eq + Hash + Send + 'static>(
    state: Arc<Mutex<State<K>>>,
    tx: mpsc::UnboundedSender<K>,
    mut delays: mpsc::UnboundedReceiver<(K, Instant)>,
    cancel: CancellationToken,
) {
    // Each timer carries the exact deadline it stands for (the DelayQueue rounds to
    // milliseconds): only the latest deadline of a key adds it.
    let mut timers: DelayQueue<(K, Instant)> = DelayQueue::new();
    let mut timer_of: HashMap<K, delay_queue::Key> = HashMap::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            delay = delays.recv() => {
                let Some((key, deadline)) = delay else { return };
                if let Some(t) = timer_of.remove(&key) {
                    timers.remove(&t);
                }
                let t = timers.insert_at((key.clone(), deadline), deadline);
                timer_of.insert(key, t);
            }
            // An empty DelayQueue yields None: the branch is off until the next delay.
            Some(expired) = timers.next() => {
                let (key, deadline) = expired.into_inner();
                timer_of.remove(&key);
                let mut s = state.lock();
                if s.delayed.get(&key) == Some(&deadline) {
                    s.delayed.remove(&key);
                    add(&mut s, &tx, key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> WorkQueue<&'static str> {
        WorkQueue::new(Backoff::default(), CancellationToken::new())
    }

    #[tokio::test]
    async fn duplicates_collapse() {
        let q = queue();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.depth(), 2);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.next().await, Some("b"));
        assert_eq!(q.depth(), 0);
    }

    /// A burst's slots are given back once the queue drains, not kept for the link's life.
    #[tokio::test]
    async fn a_drained_queue_gives_back_a_bursts_memory() {
        let q: WorkQueue<String> = WorkQueue::new(Backoff::default(), CancellationToken::new());
        for n in 0..5_000 {
            q.add(format!("k{n}"));
        }
        assert!(q.lock().queued.capacity() >= 5_000);
        for _ in 0..5_000 {
            let k = q.next().await.unwrap();
            q.done(k, Outcome::Done);
        }
        assert_eq!(q.depth(), 0);
        assert!(q.lock().queued.capacity() <= super::super::slots::CAPACITY_KEPT * 2);
    }

    #[tokio::test]
    async fn a_key_added_while_active_comes_back_once_after_done() {
        let q = queue();
        q.add("a");
        let k = q.next().await.unwrap();
        q.add("a");
        q.add("a");
        assert_eq!(q.depth(), 0, "not handed to a second worker");
        q.done(k, Outcome::Done);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.depth(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_and_success_forgets_them() {
        let q = queue();
        q.add("a");
        let k = q.next().await.unwrap();
        assert_eq!(q.done(k, Outcome::Failed), 1);
        assert_eq!(q.failing(), 1);
        let start = Instant::now();
        let k = q.next().await.unwrap();
        assert!(start.elapsed() >= Duration::from_millis(5));
        assert_eq!(q.done(k, Outcome::Failed), 2);
        let k = q.next().await.unwrap();
        assert!(start.elapsed() >= Duration::from_millis(15));
        assert_eq!(q.done(k, Outcome::Done), 0);
        assert_eq!(q.failing(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_delayed_add_wins() {
        let q = queue();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(1));
        q.add_after("a", Duration::from_secs(5));
        let start = Instant::now();
        assert_eq!(q.next().await, Some("a"));
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn cancel_ends_next() {
        let cancel = CancellationToken::new();
        let q: WorkQueue<&str> = WorkQueue::new(Backoff::default(), cancel.clone());
        cancel.cancel();
        assert_eq!(q.next().await, None);
    }
}
