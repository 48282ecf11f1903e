//! Every metric update of one link controller, with the cluster label bound once.

use crate::metrics::{ClusterLabels, ErrorLabels, Metrics};
use std::sync::Arc;
use std::time::Instant;

/// The series of one link. A series appears with its first update, as before.
#[derive(Debug, Clone)]
pub(super) struct LinkMetrics {
    metrics: Arc<Metrics>,
    labels: ClusterLabels,
}

impl LinkMetrics {
    /// The series of link `cluster`.
    pub(super) fn new(metrics: Arc<Metrics>, cluster: &str) -> Self {
        Self {
            metrics,
            labels: Metrics::cluster(cluster),
        }
    }

    /// Whether the last remote watch call succeeded.
    pub(super) fn remote_connected(&self, connected: bool) {
        let m = &self.metrics.remote_connected;
        m.get_or_create(&self.labels).set(connected as i64);
    }

    /// Data (an event or a whole list) arrived from the remote now.
    pub(super) fn remote_synced_now(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let m = &self.metrics.last_sync;
        m.get_or_create(&self.labels).set(now.as_secs_f64());
    }

    /// The remote was listed again (its watch resume point expired).
    pub(super) fn remote_relisted(&self) {
        self.metrics
            .remote_relists
            .get_or_create(&self.labels)
            .inc();
    }

    /// Times one reconcile: the histogram is observed when the guard drops.
    pub(super) fn reconcile_timer(&self) -> ReconcileTimer<'_> {
        ReconcileTimer {
            metrics: self,
            started: Instant::now(),
        }
    }

    /// The link's state after a reconcile: mirrors, queue depth, refused keys.
    pub(super) fn state(&self, mirrors: usize, queue_depth: usize, refused: usize) {
        let m = &self.metrics;
        let l = &self.labels;
        m.mirrored_services.get_or_create(l).set(mirrors as i64);
        m.queue_depth.get_or_create(l).set(queue_depth as i64);
        m.mirrors_refused.get_or_create(l).set(refused as i64);
    }

    /// A failed or refused reconcile, by bounded kind.
    pub(super) fn error(&self, kind: &str) {
        self.metrics
            .reconcile_errors
            .get_or_create(&ErrorLabels {
                cluster: self.labels.cluster.clone(),
                kind: kind.into(),
            })
            .inc();
    }

    /// The link was removed: its gauges go.
    pub(super) fn forget(&self) {
        self.metrics.forget_cluster(&self.labels.cluster);
    }
}

/// Observes the reconcile duration of its link when dropped.
pub(super) struct ReconcileTimer<'a> {
    metrics: &'a LinkMetrics,
    started: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        let m = &self.metrics.metrics.reconcile_duration;
        m.get_or_create(&self.metrics.labels)
            .observe(self.started.elapsed().as_secs_f64());
    }
}
