//! Leader election on a `coordination.k8s.io` Lease: every replica keeps warm caches,
//! only the holder writes.

use crate::metrics::Metrics;
use kube_lease_manager::LeaseManagerBuilder;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Leader election's metric family.
#[derive(Debug, Default)]
pub(crate) struct LeaderFamilies {
    /// 1 while this replica holds the leader Lease (or runs without election).
    pub(crate) leading: Gauge,
}

impl LeaderFamilies {
    /// Registers the family (under the registry's prefix).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "leader",
            "Whether this replica may write: it holds the leader Lease, or runs without election",
            self.leading.clone(),
        );
    }
}

/// Where and how to hold the lease.
#[derive(Debug, Clone)]
pub struct LeaderOptions {
    /// Namespace of the Lease (the controller's own).
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's identity (the pod name in a cluster).
    pub identity: String,
    /// How long a lease lasts without renewal: the longest a dead leader blocks writes.
    pub duration: Duration,
}

/// This replica's identity: its pod name (`$POD_NAME`), else host name and process id.
pub fn default_identity(pod_name: Option<&str>) -> String {
    pod_name
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        })
}

/// Starts campaigning. The receiver says whether this replica leads now; the task ends
/// (releasing the lease so another replica takes over at once) when `shutdown` fires.
pub fn elect(
    client: kube::Client,
    opts: LeaderOptions,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> (watch::Receiver<bool>, JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let secs = opts.duration.as_secs().max(2);
        let backoff =
            crate::backoff::Backoff::doubling(Duration::from_secs(1), Duration::from_secs(30));
        let mut failures = 0;
        let manager = loop {
            let built = LeaseManagerBuilder::new(client.clone(), &opts.lease_name)
                .with_namespace(&opts.namespace)
                .with_identity(&opts.identity)
                .with_duration(secs)
                .with_grace((secs / 3).max(1))
                .with_field_manager(format!("service-mirror-{}", opts.identity))
                .build()
                .await;
            match built {
                Ok(m) => break m,
                Err(e) => {
                    failures += 1;
                    tracing::error!(lease = %opts.lease_name, namespace = %opts.namespace, error = %e, "cannot use the leader-election Lease; not writing until it works");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff.delay(failures)) => {}
                    }
                }
            }
        };
        let (mut lease, handle) = manager.watch().await;
        loop {
            let leading = *lease.borrow_and_update();
            if *tx.borrow() != leading {
                tracing::info!(identity = %opts.identity, leading, "leadership changed");
                metrics.leader.leading.set(leading as i64);
                tx.send_replace(leading);
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                changed = lease.changed() => if changed.is_err() { break },
            }
        }
        tx.send_replace(false);
        metrics.leader.leading.set(0);
        // Dropping the last receiver makes the lease manager release the lease.
        drop(lease);
        let _ = tokio::time::timeout(Duration::from_secs(5), handle).await;
    });
    (rx, task)
}
