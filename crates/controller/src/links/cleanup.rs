//! Background deletion of an unlinked cluster's mirrors: retried until it succeeds, so
//! mirrors never outlive their link, and cancelled when the cluster is linked again
//! (a new link of the cluster owns those mirrors from then on). A replica that does not
//! lead waits until it does: the leader deletes them meanwhile, and finds nothing left
//! to delete if it ever leads; should the leader die first, it finishes the job.
//!
//! With write Leases, a cleanup deletes under its cluster's write gate (the
//! leadership handed in is gated): a cluster whose Lease another writer (Linkerd's
//! controller) holds has its mirrors, which that writer may have made and still
//! serves, left alone until the Lease is ours. A cluster stays claimed for the write
//! Leases ([`Cleanups::clusters`]) while its cleanup runs, so its Lease is taken or
//! kept until the cleanup ends, not deleted as soon as the link stops.

use crate::backoff::Backoff;
use crate::leader::Leadership;
use crate::writer::{LocalWriter, MirrorSelector};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The cleanups running, by cluster name (each with its id, so that one ending removes
/// only itself, not a cleanup that replaced it).
#[derive(Debug, Default)]
pub(super) struct Cleanups {
    running: Arc<Mutex<HashMap<String, (u64, CancellationToken)>>>,
    next: AtomicU64,
}

impl Cleanups {
    fn register(&self, cluster: &str, cancel: CancellationToken) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Some((_, old)) = self
            .running
            .lock()
            .insert(cluster.into(), (id, cancel.clone()))
        {
            old.cancel();
        }
        id
    }

    /// Marks a cleanup of `cluster` done in place (a link stopping with its mirrors):
    /// the cluster stays claimed until [`Cleanups::end`] with the id returned.
    pub(super) fn begin(&self, cluster: &str) -> u64 {
        self.register(cluster, CancellationToken::new())
    }

    /// Ends the cleanup `id` of `cluster` begun with [`Cleanups::begin`], unless
    /// another replaced it.
    pub(super) fn end(&self, cluster: &str, id: u64) {
        end(&self.running, cluster, id);
    }

    /// Whether the cleanup `id` of `cluster` is still the one registered (not ended,
    /// replaced, nor cancelled by a new link of the cluster).
    pub(super) fn holds(&self, cluster: &str, id: u64) -> bool {
        self.running
            .lock()
            .get(cluster)
            .is_some_and(|(i, _)| *i == id)
    }

    /// The clusters whose mirrors are being deleted: their write Leases are held (or
    /// waited for) until the cleanup ends.
    pub(super) fn clusters(&self) -> Vec<String> {
        self.running.lock().keys().cloned().collect()
    }

    /// Deletes, with `writer`, the mirrors of `cluster` (those `only` selects, or all)
    /// in the background until it succeeds; replaces a cleanup of the same cluster.
    /// Ends with `parent`.
    pub(super) fn spawn(
        &self,
        cluster: &str,
        writer: LocalWriter,
        only: Option<MirrorSelector>,
        leader: Option<Leadership>,
        parent: &CancellationToken,
    ) {
        let cancel = parent.child_token();
        let id = self.register(cluster, cancel.clone());
        let running = self.running.clone();
        let cluster = cluster.to_string();
        tokio::spawn(async move {
            run(writer, only, leader, cancel).await;
            end(&running, &cluster, id);
        });
    }

    /// Stops the cleanup of `cluster`, if one runs: the cluster is linked again.
    pub(super) fn cancel(&self, cluster: &str) {
        if let Some((_, cleanup)) = self.running.lock().remove(cluster) {
            cleanup.cancel();
        }
    }
}

fn end(running: &Mutex<HashMap<String, (u64, CancellationToken)>>, cluster: &str, id: u64) {
    let mut running = running.lock();
    if running.get(cluster).is_some_and(|(i, _)| *i == id) {
        running.remove(cluster);
    }
}

async fn run(
    writer: LocalWriter,
    only: Option<MirrorSelector>,
    leader: Option<Leadership>,
    cancel: CancellationToken,
) {
    let backoff = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(60));
    for failures in 1.. {
        if let Some(mut leader) = leader.clone() {
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = leader.wait_leading() => if r.is_err() { return },
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = writer.delete_mirrors_in(only.as_ref()) => if r.is_ok() { return },
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff.delay(failures)) => {}
        }
    }
}
