//! Clusters shared by all tests of one test binary, stopped when the process exits.

use crate::{LocalCluster, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

type Registry = tokio::sync::Mutex<HashMap<String, Arc<LocalCluster>>>;

fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(Default::default)
}

/// Every shared cluster, for the exit hook (a plain mutex: the hook runs outside tokio).
fn started() -> &'static Mutex<Vec<Arc<LocalCluster>>> {
    static STARTED: OnceLock<Mutex<Vec<Arc<LocalCluster>>>> = OnceLock::new();
    STARTED.get_or_init(Default::default)
}

extern "C" fn stop_shared_clusters() {
    let clusters = std::mem::take(&mut *started().lock());
    for c in clusters {
        c.stop();
        let _ = std::fs::remove_dir_all(c.dir());
    }
}

/// The process-wide cluster called `name`, started on first use. Tests share it and
/// isolate themselves with unique namespaces; it stops when the process exits. Do not
/// restart its apiserver: start a private [`LocalCluster`] for that.
pub async fn shared_cluster(name: &str) -> Result<Arc<LocalCluster>> {
    shared_cluster_with(name, crate::ClusterOptions::default()).await
}

/// [`shared_cluster`] started with `opts` on first use (later calls get the running
/// cluster, whatever options they pass): real nodes shared by a test binary, say.
pub async fn shared_cluster_with(
    name: &str,
    opts: crate::ClusterOptions,
) -> Result<Arc<LocalCluster>> {
    let mut reg = registry().lock().await;
    if let Some(c) = reg.get(name) {
        return Ok(c.clone());
    }
    let cluster = Arc::new(LocalCluster::start_with(name, opts).await?);
    let mut started = started().lock();
    if started.is_empty() {
        // SAFETY: registering a plain extern "C" function with no captured state.
        unsafe {
            libc::atexit(stop_shared_clusters);
        }
    }
    started.push(cluster.clone());
    reg.insert(name.to_string(), cluster.clone());
    Ok(cluster)
}

/// A namespace name unique to this process and call, starting with `prefix`.
pub fn unique_namespace(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id() % 100_000)
}
