//! A component's tasks on the runtime, started one way for every process-wide component
//! (the federation, MCS): its index task, the follower telling that task of each
//! leadership change (it queues every key on gaining the lead), and its reconcile
//! workers behind their gate.

use super::gate::{Gate, Listed, follow_leader};
use super::queue::WorkQueue;
use super::worker::{self, Reconcile};
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Spawns `index` (the component's index task, fed by its watches through `tx`), a
/// follower of the leadership `gate` follows (if elected) sending `leader(leading)` on
/// `tx`, and `workers` reconcile workers of `queue` under `gate`; until `cancel`.
pub(crate) fn spawn_component<K, S, R, M>(
    index: impl Future<Output = ()> + Send + 'static,
    (tx, leader): (&mpsc::UnboundedSender<M>, fn(bool) -> M),
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
    M: Send + 'static,
{
    let mut tasks = vec![tokio::spawn(index)];
    if let Some(leadership) = gate.leader.clone() {
        tasks.push(tokio::spawn(follow_leader(
            leadership,
            tx.clone(),
            leader,
            cancel.clone(),
        )));
    }
    tasks.extend(worker::spawn(workers, queue, gate, rec, cancel));
    tasks
}
