//! The MCS index task: applies every [`Msg`] to the shared state (the export index,
//! the import caches, the gateway reports; as kubert's `IndexNamespacedResource` apply
//! / delete / reset) and adds the keys each change concerns to the runtime's work
//! queue, where the reconcile workers take them.
//!
//! It alone takes messages, so they apply in order; it opens the workers' gate once
//! the local cluster's exports and Services are listed, and then (as on becoming
//! leader) queues every name: the world may have drifted while nobody judged.

use super::Msg;
use super::index::Changed;
use super::shared::Shared;
use crate::metrics::Metrics;
use crate::runtime::WorkQueue;
use parking_lot::Mutex;
use service_mirror_core::ServiceKey;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

pub(super) struct Indexer {
    pub(super) shared: Arc<Mutex<Shared>>,
    pub(super) queue: WorkQueue<ServiceKey>,
    pub(super) metrics: Arc<Metrics>,
    /// The workers' gate: the local cluster listed.
    pub(super) ready: watch::Sender<bool>,
}

impl Indexer {
    pub(super) fn new(
        shared: Arc<Mutex<Shared>>,
        queue: WorkQueue<ServiceKey>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            shared,
            queue,
            metrics,
            ready: watch::Sender::new(false),
        }
    }

    pub(super) async fn run(self, mut rx: mpsc::UnboundedReceiver<Msg>, cancel: CancellationToken) {
        loop {
            let msg = tokio::select! {
                _ = cancel.cancelled() => return,
                msg = rx.recv() => msg,
            };
            let Some(msg) = msg else { return };
            self.admit(msg);
        }
    }

    /// Applies `msg`, queues the keys it changed, and opens the gate when ready.
    pub(super) fn admit(&self, msg: Msg) {
        let (keys, listed) = {
            let mut s = self.shared.lock();
            let keys = apply(&mut s, msg);
            (keys, s.index.listed_count())
        };
        self.metrics.mcs.clusters_listed.set(listed as i64);
        for key in keys {
            self.queue.add(key);
        }
        self.open_when_ready();
    }

    /// Opens the workers' gate the first time the local lists are complete, and queues
    /// every name then.
    fn open_when_ready(&self) {
        if *self.ready.borrow() {
            return;
        }
        let keys = {
            let s = self.shared.lock();
            if !s.index.local_listed() {
                return;
            }
            s.all_keys()
        };
        self.ready.send_replace(true);
        for key in keys {
            self.queue.add(key);
        }
    }
}

/// What `msg` changes in the shared state, and the keys to judge again.
fn apply(s: &mut Shared, msg: Msg) -> Changed {
    let now = std::time::Instant::now();
    match msg {
        Msg::Feed {
            cluster,
            generation,
        } => {
            s.index.feed(&cluster, generation, now);
            s.gateways.feed(&cluster, generation);
            s.removed.remove(&*cluster);
            // A new cluster is unlisted: the imports it may hold are looked at once
            // its hold ends (a reconcile during the hold comes back at its end).
            s.cache.keys()
        }
        Msg::Expect(clusters) => {
            s.expected = Some(clusters);
            s.cache.keys()
        }
        Msg::Removed(cluster) => {
            if let Some(now) = s.gateways.removed(&cluster) {
                s.cache.gateway(&cluster, now);
            }
            s.removed.insert(cluster);
            s.cache.keys()
        }
        Msg::Export {
            cluster,
            generation,
            event,
        } => {
            let was = s.index.counts(&cluster);
            let changed = s.index.export_event(&cluster, generation, &event);
            counted(s, &cluster, was, changed)
        }
        Msg::Service {
            cluster,
            generation,
            event,
        } => {
            let was = s.index.counts(&cluster);
            let changed = s.index.service_event(&cluster, generation, &event);
            counted(s, &cluster, was, changed)
        }
        Msg::Ended {
            cluster,
            generation,
        } => {
            let mut changed = s.index.remove(&cluster, generation);
            if let Some(now) = s.gateways.ended(&cluster, generation) {
                changed.extend(s.cache.gateway(&cluster, now));
            }
            // The cluster may no longer be unlisted: imports it held are looked at.
            changed.extend(s.cache.keys());
            changed
        }
        Msg::Import(event) => {
            let was = s.cache.listed();
            let changed = s.cache.import_event(&event);
            imports_listed(s, was, changed)
        }
        Msg::Derived(event) => {
            let was = s.cache.listed();
            let changed = s.cache.derived_event(&event);
            imports_listed(s, was, changed)
        }
        Msg::Slice(event) => {
            let was = s.cache.slices_listed();
            let mut changed = s.cache.slice_event(&event);
            if !was && s.cache.slices_listed() {
                changed.extend(s.cache.keys()); // slices wait for their list
            }
            changed
        }
        Msg::LocalSlice(event) => s.cache.local_slice_event(&event),
        // Read at each query by the DNS zone: no key to judge again.
        Msg::HeadlessMirrorSlice(event) => {
            s.cache.headless_mirror_slice_event(&event);
            Changed::new()
        }
        Msg::Gateway {
            cluster,
            generation,
            gateway,
        } => match s.gateways.report(&cluster, generation, gateway) {
            Some(now) => s.cache.gateway(&cluster, now),
            None => Changed::new(),
        },
        // Its predecessor may have left anything: every name is judged (the workers'
        // gate holds them until we lead).
        Msg::Leader(true) => s.all_keys(),
        Msg::Leader(false) => Changed::new(),
    }
}

/// `changed`, and every import once `cluster` starts to count: an import it held up
/// (listed in its status, no longer exported there) is judged again, which its own
/// list would not do; and every other name, since one judged while `cluster` was
/// unlisted came back only at the end of its hold (up to [`super::index::LIST_HOLD`],
/// 30 s, after a list that took a moment).
fn counted(s: &Shared, cluster: &str, was: bool, mut changed: Changed) -> Changed {
    if !was && s.index.counts(cluster) {
        changed.extend(s.all_keys());
    }
    changed
}

/// `changed`, and every name once both local import lists are in (imports wait for
/// them).
fn imports_listed(s: &Shared, was: bool, mut changed: Changed) -> Changed {
    if !was && s.cache.listed() {
        changed.extend(s.index.keys());
        changed.extend(s.cache.keys());
    }
    changed
}

#[cfg(test)]
#[path = "indexer_tests.rs"]
mod tests;
