//! The write gate of a component: when it may write. The one way every component waits
//! for leadership: its caches listed, not paused, and leader if elected.
//!
//! Reconciling against caches that have not listed would create what exists; writing
//! while paused (a rotated link syncing before it takes over) or without the lead (another
//! replica writes) would fight the one writer that should.

use crate::leader::Leadership;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What a component's sync state says about its caches: whether the ones its writes
/// depend on have listed.
pub(crate) trait Listed {
    /// The caches the writes depend on have listed.
    fn listed(&self) -> bool;
}

impl Listed for bool {
    fn listed(&self) -> bool {
        *self
    }
}

/// When a component may write (cheap to clone: clones share the state).
pub(crate) struct Gate<S> {
    /// False while the component is paused.
    pub(crate) writable: watch::Sender<bool>,
    /// Leader election, if any.
    pub(crate) leader: Option<Leadership>,
    /// The sync state of the component's caches.
    pub(crate) synced: watch::Receiver<S>,
}

impl<S> Clone for Gate<S> {
    fn clone(&self) -> Self {
        Self {
            writable: self.writable.clone(),
            leader: self.leader.clone(),
            synced: self.synced.clone(),
        }
    }
}

impl<S: Listed> Gate<S> {
    /// A gate over `synced`, paused or not, following `leader` when elected.
    pub(crate) fn new(
        synced: watch::Receiver<S>,
        leader: Option<Leadership>,
        paused: bool,
    ) -> Self {
        Self {
            writable: watch::Sender::new(!paused),
            leader,
            synced,
        }
    }

    /// Not paused, and leader if elected (the caches are not looked at: they list once,
    /// and a write decided on them checks this at the last moment).
    pub(crate) fn open_now(&self) -> bool {
        *self.writable.borrow() && self.leader.as_ref().is_none_or(|l| l.leading())
    }

    /// Lets a paused component write.
    pub(crate) fn resume(&self) {
        self.writable.send_replace(true);
    }

    /// Waits until the component may write: caches listed, not paused, and leader if
    /// elected. Woken by each of the three watch channels. False when cancelled.
    pub(crate) async fn wait_open(&self, cancel: &CancellationToken) -> bool {
        let mut own = self.writable.subscribe();
        let mut synced = self.synced.clone();
        let mut leader = self.leader.clone();
        loop {
            own.borrow_and_update();
            let listed = synced.borrow_and_update().listed();
            if let Some(l) = &mut leader {
                l.leading_and_update();
            }
            if self.open_now() && listed {
                return true;
            }
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = next_change(&mut own) => {}
                _ = next_change(&mut synced) => {}
                _ = changed(&mut leader) => {}
            }
        }
    }
}

/// The next change of an optional leadership; never, without one or once its sender is
/// gone.
async fn changed(rx: &mut Option<Leadership>) {
    match rx {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await
            }
        }
        None => std::future::pending().await,
    }
}

/// The next change of a watch; never once its sender is gone (a gone sender would
/// otherwise answer at once, every time, and spin the loop waiting on it).
async fn next_change<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await
    }
}

/// Sends `msg(leading)` to an index task on each leadership change, until `cancel`:
/// a component's index task queues every key on becoming leader (its gate held them
/// meanwhile). The one follower of leadership for the federation and MCS.
pub(crate) async fn follow_leader<M>(
    mut leader: Leadership,
    tx: tokio::sync::mpsc::UnboundedSender<M>,
    msg: fn(bool) -> M,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = leader.changed() => if changed.is_err() { return },
        }
        let now = leader.leading_and_update();
        let _ = tx.send(msg(now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Whether `wait_open` answers within a minute of paused time.
    async fn opens(gate: &Gate<bool>) -> bool {
        let cancel = CancellationToken::new();
        tokio::time::timeout(Duration::from_secs(60), gate.wait_open(&cancel))
            .await
            .unwrap_or(false)
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_opens_only_when_listed_resumed_and_leading() {
        let (synced_tx, synced) = watch::channel(false);
        let (lead_tx, leader) = Leadership::manual(false);
        let gate = Gate::new(synced, Some(leader), true);
        assert!(!gate.open_now());
        assert!(!opens(&gate).await, "nothing listed, paused, not leading");
        synced_tx.send_replace(true);
        assert!(!opens(&gate).await, "still paused and not leading");
        gate.resume();
        assert!(!opens(&gate).await, "still not leading");
        lead_tx.send_replace(true);
        assert!(gate.open_now());
        assert!(opens(&gate).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_worker_is_woken_by_the_last_condition() {
        let (synced_tx, synced) = watch::channel(false);
        let gate = Gate::new(synced, None, false);
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.wait_open(&CancellationToken::new()).await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiting.is_finished());
        synced_tx.send_replace(true);
        assert!(waiting.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn cancel_ends_the_wait_and_a_gone_sender_does_not_spin() {
        let (synced_tx, synced) = watch::channel(false);
        let gate = Gate::new(synced, None, false);
        drop(synced_tx);
        let cancel = CancellationToken::new();
        let waiting = tokio::spawn({
            let (gate, cancel) = (gate.clone(), cancel.clone());
            async move { gate.wait_open(&cancel).await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiting.is_finished(), "a gone sender is no change");
        cancel.cancel();
        assert!(!waiting.await.unwrap());
    }
}
