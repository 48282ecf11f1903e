//! Writes the local caches have not shown yet.
//!
//! After the link controller writes a mirror object, the watch event bringing that write reaches
//! its cache a moment later. A reconcile of the same key in between (queued by the
//! event of the key's other object, say) would plan from a cache that misses the write
//! and repeat it: a create that fails with AlreadyExists and a read, an update that
//! fails with a conflict. So each write is remembered until its event arrives, and a key
//! with such a write pending is not planned: that event queues the key again.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a write may wait for its event before it is forgotten (a safety net: the
/// watch delivers every change, and a relist clears everything).
const EXPIRY: Duration = Duration::from_secs(30);

/// Kind of a local object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum LocalObject {
    /// A mirror Service.
    Service,
    /// A mirror Endpoints.
    Endpoints,
    /// An EndpointSlice of a mirror.
    EndpointSlice,
}

impl LocalObject {
    /// Of a Kubernetes kind name (`Service`, `Endpoints`, `EndpointSlice`).
    pub(crate) fn of_kind(kind: &str) -> Option<Self> {
        match kind {
            "Service" => Some(Self::Service),
            "Endpoints" => Some(Self::Endpoints),
            "EndpointSlice" => Some(Self::EndpointSlice),
            _ => None,
        }
    }
}

type Key = (LocalObject, String, String);

/// Pending writes by object: the state each write replaced (a resourceVersion, or
/// None for absent), and when it was written.
#[derive(Debug, Default)]
pub(crate) struct Expectations {
    pending: Mutex<HashMap<Key, (Option<String>, Instant)>>,
}

impl Expectations {
    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<Key, (Option<String>, Instant)>> {
        self.pending.lock()
    }

    /// We wrote `ns/name`, replacing the state the cache showed: `replaced` is the
    /// resourceVersion we updated or deleted, None for a create.
    pub(crate) fn written(
        &self,
        kind: LocalObject,
        ns: &str,
        name: &str,
        replaced: Option<String>,
    ) {
        self.lock().insert(
            (kind, ns.to_owned(), name.to_owned()),
            (replaced, Instant::now()),
        );
    }

    /// The cache now shows `ns/name` at `version` (None: absent). Any state other than
    /// the one a pending write replaced is that write or a later change: every write
    /// carries the version it replaces as a precondition, so the object went from that
    /// version straight to ours, and the watch shows versions in order. (Waiting for our
    /// exact version instead would wait forever when another writer's change arrived
    /// before the write was recorded.)
    pub(crate) fn observed(&self, kind: LocalObject, ns: &str, name: &str, version: Option<&str>) {
        let mut pending = self.lock();
        let key = (kind, ns.to_owned(), name.to_owned());
        if pending
            .get(&key)
            .is_some_and(|(replaced, _)| replaced.as_deref() != version)
        {
            pending.remove(&key);
            tracing::debug!(?kind, %ns, %name, ?version, "write seen in the cache");
        }
    }

    /// A relist of `kind` replaced its cache: nothing of it is pending any more.
    pub(crate) fn relisted(&self, kind: LocalObject) {
        let forgotten = {
            let mut pending = self.lock();
            let before = pending.len();
            pending.retain(|k, _| k.0 != kind);
            before - pending.len()
        };
        if forgotten > 0 {
            tracing::debug!(
                ?kind,
                forgotten,
                "local cache relisted: pending writes forgotten"
            );
        }
    }

    /// Whether a write to `ns/name` has not reached the cache yet.
    pub(crate) fn pending(&self, kind: LocalObject, ns: &str, name: &str) -> bool {
        let mut pending = self.lock();
        let key = (kind, ns.to_owned(), name.to_owned());
        match pending.get(&key) {
            Some((_, at)) if at.elapsed() < EXPIRY => true,
            Some(_) => {
                pending.remove(&key);
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LocalObject::{Endpoints, Service};

    #[test]
    fn a_write_is_pending_until_the_cache_moves_past_what_it_replaced() {
        let e = Expectations::default();
        // Update of version 4.
        e.written(Service, "ns", "a", Some("4".into()));
        assert!(e.pending(Service, "ns", "a"));
        assert!(!e.pending(Endpoints, "ns", "a"), "per kind");
        e.observed(Service, "ns", "a", Some("4"));
        assert!(e.pending(Service, "ns", "a"), "still the replaced version");
        e.observed(Service, "ns", "a", Some("5"));
        assert!(!e.pending(Service, "ns", "a"));

        // Another writer's change came first: it is after ours, so ours arrived too.
        e.written(Endpoints, "ns", "x", Some("10".into()));
        e.observed(Endpoints, "ns", "x", Some("12"));
        assert!(!e.pending(Endpoints, "ns", "x"));

        // Create: pending while absent.
        e.written(Service, "ns", "b", None);
        e.observed(Service, "ns", "b", None);
        assert!(e.pending(Service, "ns", "b"));
        e.observed(Service, "ns", "b", Some("7"));
        assert!(!e.pending(Service, "ns", "b"));

        // Delete of version 3: pending while version 3 is shown.
        e.written(Endpoints, "ns", "c", Some("3".into()));
        e.observed(Endpoints, "ns", "c", Some("3"));
        assert!(e.pending(Endpoints, "ns", "c"));
        e.observed(Endpoints, "ns", "c", None);
        assert!(!e.pending(Endpoints, "ns", "c"));

        e.written(Endpoints, "ns", "d", Some("9".into()));
        e.relisted(Endpoints);
        assert!(!e.pending(Endpoints, "ns", "d"));
    }
}
