//! Writes the local caches have not shown yet.
//!
//! After the watcher writes a mirror object, the watch event bringing that write reaches
//! its cache a moment later. A reconcile of the same key in between (queued by the
//! event of the key's other object, say) would plan from a cache that misses the write
//! and repeat it: a create that fails with AlreadyExists and a read, an update that
//! fails with a conflict. So each write is remembered until its event arrives, and a key
//! with such a write pending is not planned: that event queues the key again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a write may wait for its event before it is forgotten (a safety net: the
/// watch delivers every change, and a relist clears everything).
const EXPIRY: Duration = Duration::from_secs(30);

/// Kind of a local object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LocalObject {
    /// A mirror Service.
    Service,
    /// A mirror Endpoints.
    Endpoints,
}

type Key = (LocalObject, String, String);

/// What the cache should show next for an object.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Next {
    /// This resourceVersion (we created or updated it).
    Version(String),
    /// No object (we deleted it).
    Gone,
}

/// Pending writes by object.
#[derive(Debug, Default)]
pub struct Expectations {
    pending: Mutex<HashMap<Key, (Next, Instant)>>,
}

impl Expectations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, (Next, Instant)>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// We wrote `ns/name`; the apiserver gave it `version`.
    pub fn written(&self, kind: LocalObject, ns: &str, name: &str, version: String) {
        self.lock().insert(
            (kind, ns.to_owned(), name.to_owned()),
            (Next::Version(version), Instant::now()),
        );
    }

    /// We deleted `ns/name`.
    pub fn deleted(&self, kind: LocalObject, ns: &str, name: &str) {
        self.lock().insert(
            (kind, ns.to_owned(), name.to_owned()),
            (Next::Gone, Instant::now()),
        );
    }

    /// The cache now holds `ns/name` at `version` (None: deleted).
    pub fn observed(&self, kind: LocalObject, ns: &str, name: &str, version: Option<&str>) {
        let mut pending = self.lock();
        let key = (kind, ns.to_owned(), name.to_owned());
        let arrived = match (pending.get(&key), version) {
            (None, _) => false,
            // Gone is final: whatever we wrote before, the cache has moved past it.
            (Some(_), None) => true,
            (Some((Next::Version(v), _)), Some(seen)) => v == seen,
            (Some((Next::Gone, _)), Some(_)) => false,
        };
        if arrived {
            pending.remove(&key);
        }
    }

    /// A relist of `kind` replaced its cache: nothing of it is pending any more.
    pub fn relisted(&self, kind: LocalObject) {
        self.lock().retain(|k, _| k.0 != kind);
    }

    /// Whether a write to `ns/name` has not reached the cache yet.
    pub fn pending(&self, kind: LocalObject, ns: &str, name: &str) -> bool {
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
    fn a_write_is_pending_until_its_version_or_a_deletion_is_seen() {
        let e = Expectations::default();
        e.written(Service, "ns", "a", "5".into());
        assert!(e.pending(Service, "ns", "a"));
        assert!(!e.pending(Endpoints, "ns", "a"), "per kind");
        e.observed(Service, "ns", "a", Some("4"));
        assert!(
            e.pending(Service, "ns", "a"),
            "an older version is not ours"
        );
        e.observed(Service, "ns", "a", Some("5"));
        assert!(!e.pending(Service, "ns", "a"));

        e.written(Service, "ns", "b", "7".into());
        e.observed(Service, "ns", "b", None);
        assert!(!e.pending(Service, "ns", "b"), "deleted meanwhile");

        e.deleted(Endpoints, "ns", "c");
        e.observed(Endpoints, "ns", "c", Some("3"));
        assert!(e.pending(Endpoints, "ns", "c"));
        e.observed(Endpoints, "ns", "c", None);
        assert!(!e.pending(Endpoints, "ns", "c"));

        e.written(Endpoints, "ns", "d", "9".into());
        e.relisted(Endpoints);
        assert!(!e.pending(Endpoints, "ns", "d"));
    }
}
