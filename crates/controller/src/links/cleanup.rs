//! Background deletion of an unlinked cluster's mirrors: retried until it succeeds, so
//! mirrors never outlive their link, and cancelled when the cluster is linked again
//! (a new link of the cluster owns those mirrors from then on). A replica that does not
//! lead waits until it does: the leader deletes them meanwhile, and finds nothing left
//! to delete if it ever leads; should the leader die first, it finishes the job.

use crate::backoff::Backoff;
use crate::leader::Leadership;
use crate::writer::{LocalWriter, MirrorSelector};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The cleanups running, by cluster name.
#[derive(Debug, Default)]
pub(super) struct Cleanups {
    running: Mutex<HashMap<String, CancellationToken>>,
}

impl Cleanups {
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
        if let Some(old) = self.running.lock().insert(cluster.into(), cancel.clone()) {
            old.cancel();
        }
        tokio::spawn(async move {
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
        });
    }

    /// Stops the cleanup of `cluster`, if one runs: the cluster is linked again.
    pub(super) fn cancel(&self, cluster: &str) {
        if let Some(cleanup) = self.running.lock().remove(cluster) {
            cleanup.cancel();
        }
    }
}
