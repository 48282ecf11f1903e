//! Compact caches fed by watch events: each object is kept as its JSON text and read
//! back on demand.
//!
//! A deserialized Service or Endpoints costs about 4 KB of heap (every optional field,
//! a B-tree node per label and annotation map, a separate allocation per string); its
//! JSON text about a quarter of that. With three caches per linked cluster (remote
//! Services, local mirror Services and Endpoints) that is most of the controller's
//! memory. Objects are read once per reconcile of their key, and decoding one takes a
//! few microseconds, next to the milliseconds of the write it leads to. The JSON is
//! lossless: an update still PUTs the whole cached object with our changes.

use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use parking_lot::RwLock;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

type Key = (String, String);
type Objects = HashMap<Key, Box<[u8]>>;

#[derive(Default)]
struct State {
    objects: Objects,
    /// Objects of a (re)list in progress; they replace `objects` when it completes.
    listing: Objects,
}

/// A cache of objects of kind `K` by namespace and name. Cheap to clone (shared).
pub(crate) struct Cache<K> {
    state: Arc<RwLock<State>>,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            _kind: PhantomData,
        }
    }
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            _kind: PhantomData,
        }
    }
}

fn key_of<K: Resource>(obj: &K) -> Key {
    let meta = obj.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
{
    fn read(&self) -> parking_lot::RwLockReadGuard<'_, State> {
        self.state.read()
    }

    fn write(&self) -> parking_lot::RwLockWriteGuard<'_, State> {
        self.state.write()
    }

    fn decode(bytes: &[u8]) -> Option<Arc<K>> {
        match serde_json::from_slice(bytes) {
            Ok(obj) => Some(Arc::new(obj)),
            Err(e) => {
                // Cannot happen for what `encode` wrote; never silently wrong, though.
                tracing::error!(kind = %K::kind(&()), error = %e, "undecodable cached object");
                None
            }
        }
    }

    fn encode(obj: &K) -> Option<Box<[u8]>> {
        match serde_json::to_vec(obj) {
            Ok(v) => Some(v.into_boxed_slice()),
            Err(e) => {
                tracing::error!(kind = %K::kind(&()), error = %e, "unencodable object not cached");
                None
            }
        }
    }

    /// The object `r` refers to.
    pub(crate) fn get(&self, r: &ObjectRef<K>) -> Option<Arc<K>> {
        let key = (r.namespace.clone().unwrap_or_default(), r.name.clone());
        let state = self.read();
        state.objects.get(&key).and_then(|b| Self::decode(b))
    }

    /// Whether the object `r` refers to is cached (nothing decoded).
    pub(crate) fn contains(&self, r: &ObjectRef<K>) -> bool {
        let key = (r.namespace.clone().unwrap_or_default(), r.name.clone());
        self.read().objects.contains_key(&key)
    }

    /// Number of cached objects.
    pub(crate) fn len(&self) -> usize {
        self.read().objects.len()
    }

    /// Calls `f` with every cached object, decoded one at a time (for rebuilds after a
    /// list, not per event): a remote of 50,000 Services never exists decoded at once.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&K)) {
        let state = self.read();
        for obj in state.objects.values().filter_map(|b| Self::decode(b)) {
            f(&obj);
        }
    }

    /// Applies a watch event, with the semantics of kube's reflector store: a list
    /// (`Init` .. `InitDone`) replaces the whole content when it completes.
    pub(crate) fn apply_watcher_event(&self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(obj) => {
                if let Some(bytes) = Self::encode(obj) {
                    self.write().objects.insert(key_of(obj), bytes);
                }
            }
            watcher::Event::Delete(obj) => {
                self.write().objects.remove(&key_of(obj));
            }
            watcher::Event::Init => self.write().listing = Objects::new(),
            watcher::Event::InitApply(obj) => {
                if let Some(bytes) = Self::encode(obj) {
                    self.write().listing.insert(key_of(obj), bytes);
                }
            }
            watcher::Event::InitDone => {
                let mut state = self.write();
                state.objects = std::mem::take(&mut state.listing);
            }
        }
    }
}

impl<K> crate::watch::Store<K> for Cache<K>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
{
    fn apply(&mut self, ev: &watcher::Event<K>) {
        self.apply_watcher_event(ev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;

    fn svc(ns: &str, name: &str, rv: &str) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "resourceVersion": rv,
                         "labels": {"a": "b"}, "uid": "u-1"},
            "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": "http", "port": 80}]},
        }))
        .unwrap()
    }

    #[test]
    fn objects_come_back_whole() {
        let cache = Cache::<Service>::default();
        let s = svc("ns", "a", "1");
        cache.apply_watcher_event(&watcher::Event::Apply(s.clone()));
        let got = cache.get(&ObjectRef::new("a").within("ns")).unwrap();
        assert_eq!(*got, s);
        assert!(cache.get(&ObjectRef::new("a").within("other")).is_none());
        assert_eq!(cache.len(), 1);
        cache.apply_watcher_event(&watcher::Event::Apply(svc("ns", "a", "2")));
        let got = cache.get(&ObjectRef::new("a").within("ns")).unwrap();
        assert_eq!(got.metadata.resource_version.as_deref(), Some("2"));
        cache.apply_watcher_event(&watcher::Event::Delete(s));
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_list_replaces_everything_when_done() {
        let cache = Cache::<Service>::default();
        cache.apply_watcher_event(&watcher::Event::Apply(svc("ns", "old", "1")));
        cache.apply_watcher_event(&watcher::Event::Init);
        cache.apply_watcher_event(&watcher::Event::InitApply(svc("ns", "new", "2")));
        // Until the list completes, readers see the previous content.
        assert!(cache.get(&ObjectRef::new("old").within("ns")).is_some());
        assert!(cache.get(&ObjectRef::new("new").within("ns")).is_none());
        cache.apply_watcher_event(&watcher::Event::InitDone);
        assert!(cache.get(&ObjectRef::new("old").within("ns")).is_none());
        let mut names = Vec::new();
        cache.for_each(|s| names.push(s.metadata.name.clone()));
        assert_eq!(names, vec![Some("new".to_string())]);
    }
}
