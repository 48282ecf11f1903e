//! A work queue of object keys: deduplicated, serialised per key, with per-key backoff.
//!
//! A key is handed to at most one worker at a time; a key added while a worker holds it
//! is marked dirty and handed out again when that worker is done, so no change is lost
//! and no key is reconciled twice at once.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Retry delays: fast exponential retries first, then a slower exponential fallback.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// First retry delay.
    pub base: Duration,
    /// Fast retries before falling back to the slow schedule (`--event-requeue-limit`).
    pub fast_retries: u32,
    /// First delay of the slow schedule.
    pub slow_base: Duration,
    /// Longest delay.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(5),
            fast_retries: 3,
            slow_base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The delay before retry number `failures` (1-based).
    pub fn delay(&self, failures: u32) -> Duration {
        let n = failures.saturating_sub(1);
        let d = if n < self.fast_retries {
            self.base.saturating_mul(1 << n.min(20))
        } else {
            self.slow_base
                .saturating_mul(1 << (n - self.fast_retries).min(20))
        };
        d.min(self.cap)
    }
}

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
pub enum Outcome {
    /// Converged; forget its failures.
    Done,
    /// Converged for now; look again after this delay (e.g. re-resolve a hostname).
    RequeueAfter(Duration),
    /// Failed; retry with backoff.
    Failed,
}

/// The queue. Cheap to clone.
#[derive(Debug)]
pub struct WorkQueue<K> {
    state: Arc<Mutex<State<K>>>,
    tx: mpsc::UnboundedSender<K>,
    rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<K>>>,
    backoff: Backoff,
    cancel: CancellationToken,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            tx: self.tx.clone(),
            rx: self.rx.clone(),
            backoff: self.backoff,
            cancel: self.cancel.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// A new queue; delayed adds stop when `cancel` fires.
    pub fn new(backoff: Backoff, cancel: CancellationToken) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            state: Arc::new(Mutex::new(State {
                queued: HashSet::new(),
                active: HashSet::new(),
                dirty: HashSet::new(),
                failures: HashMap::new(),
                delayed: HashMap::new(),
            })),
            tx,
            rx: Arc::new(tokio::sync::Mutex::new(rx)),
            backoff,
            cancel,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a key now (no-op when already queued; marked dirty when being worked on).
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        if s.active.contains(&key) {
            s.dirty.insert(key);
        } else if s.queued.insert(key.clone()) {
            let _ = self.tx.send(key);
        }
    }

    /// Adds a key after `delay`, unless an earlier delayed add is already pending.
    pub fn add_after(&self, key: K, delay: Duration) {
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
        }
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = queue.cancel.cancelled() => {}
                _ = tokio::time::sleep_until(deadline) => {
                    let due = {
                        let mut s = queue.lock();
                        let due = s.delayed.get(&key) == Some(&deadline);
                        if due {
                            s.delayed.remove(&key);
                        }
                        due
                    };
                    if due {
                        queue.add(key);
                    }
                }
            }
        });
    }

    /// The next key to work on; `None` once cancelled.
    pub async fn next(&self) -> Option<K> {
        let key = {
            let mut rx = self.rx.lock().await;
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                k = rx.recv() => k?,
            }
        };
        let mut s = self.lock();
        s.queued.remove(&key);
        s.active.insert(key.clone());
        Some(key)
    }

    /// Reports the outcome of working on `key`; schedules what comes next for it.
    /// Returns the number of consecutive failures of the key.
    pub fn done(&self, key: K, outcome: Outcome) -> u32 {
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
    pub fn depth(&self) -> usize {
        let s = self.lock();
        s.queued.len() + s.delayed.len()
    }

    /// Keys whose last attempt failed.
    pub fn failing(&self) -> usize {
        self.lock().failures.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> WorkQueue<&'static str> {
        WorkQueue::new(Backoff::default(), CancellationToken::new())
    }

    #[test]
    fn backoff_is_fast_then_slow_and_capped() {
        let b = Backoff::default();
        let ms = |n| b.delay(n).as_millis();
        assert_eq!([ms(1), ms(2), ms(3)], [5, 10, 20]);
        assert_eq!([ms(4), ms(5), ms(6)], [1000, 2000, 4000]);
        assert_eq!(b.delay(40), Duration::from_secs(300));
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
