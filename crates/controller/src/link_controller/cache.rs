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
//!
//! Each entry is that JSON compressed (LZ4) against a dictionary: the JSON of the first
//! object the cache stored. The objects of one cache share their keys and most values
//! (a link's mirror Services: the same labels, annotations, namespace, spec fields), so
//! an entry keeps mostly what differs: the name, uid, resourceVersion, addresses.
//! Measured in the bench (2,000 Link-linked Services): see BENCHMARKS.md, "Memory of
//! 10,000 Link-linked Services". Decompressing one takes about a microsecond.
//!
//! The remote Services cache has a cap in bytes (`--max-remote-cache-bytes`): a remote
//! is untrusted, and one listing 300,000 Services would otherwise grow the one process
//! past its memory limit, killing every link with it. An object that would pass the
//! cap is refused: a list in progress is dropped, the last complete content stays (no
//! mirror changes because of it), and the caller stops the watch (watches.rs).

use crate::runtime::watch::OverCap;
use hashbrown::{HashTable, hash_table};
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use parking_lot::RwLock;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::marker::PhantomData;
use std::sync::Arc;

/// Each object as one allocation, by namespace, then name: its name's length (4 bytes,
/// little-endian), its name, then its JSON compressed against the cache's dictionary,
/// the JSON's length first (`lz4_flex`'s size-prepended block format). A link's objects
/// are in few namespaces: an entry keeps only its name, inside the entry, so an object
/// costs one allocation and a 16-byte table slot (a `Box<str>` name beside the entry
/// was a second allocation and 16 bytes more of slot: about 28 bytes of each cached
/// object, heaptrack at 10 links x 1,000 Services: 30,000 objects, a remote Service and
/// a local Service and Endpoints per mirror). A lookup by a borrowed namespace and name allocates
/// nothing.
#[derive(Default)]
struct Objects {
    by_ns: HashMap<Box<str>, HashTable<Box<[u8]>>>,
    hasher: RandomState,
}

/// Bytes before an entry's name: its length.
const NAME_LEN_BYTES: usize = 4;

/// The name an entry holds.
fn entry_name(entry: &[u8]) -> &[u8] {
    let len = u32::from_le_bytes([entry[0], entry[1], entry[2], entry[3]]) as usize;
    &entry[NAME_LEN_BYTES..NAME_LEN_BYTES + len]
}

/// The compressed JSON an entry holds.
fn entry_body(entry: &[u8]) -> &[u8] {
    &entry[NAME_LEN_BYTES + entry_name(entry).len()..]
}

impl Objects {
    fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name.as_bytes())
    }

    fn get(&self, ns: &str, name: &str) -> Option<&[u8]> {
        let in_ns = self.by_ns.get(ns)?;
        in_ns
            .find(self.hash(name), |e| entry_name(e) == name.as_bytes())
            .map(|e| entry_body(e))
    }

    /// Stores `body` (a compressed JSON) as `ns/name`'s entry; false if the name is
    /// too long to store (past 4 GiB: no apiserver's response holds one).
    fn insert(&mut self, ns: &str, name: &str, body: &[u8]) -> bool {
        let Ok(len) = u32::try_from(name.len()) else {
            return false;
        };
        let mut entry = Vec::with_capacity(NAME_LEN_BYTES + name.len() + body.len());
        entry.extend_from_slice(&len.to_le_bytes());
        entry.extend_from_slice(name.as_bytes());
        entry.extend_from_slice(body);
        let entry = entry.into_boxed_slice();
        let hash = self.hash(name);
        let hasher = &self.hasher;
        let in_ns = match self.by_ns.get_mut(ns) {
            Some(in_ns) => in_ns,
            None => self.by_ns.entry(ns.into()).or_default(),
        };
        match in_ns.entry(
            hash,
            |e| entry_name(e) == name.as_bytes(),
            |e| hasher.hash_one(entry_name(e)),
        ) {
            hash_table::Entry::Occupied(mut slot) => *slot.get_mut() = entry,
            hash_table::Entry::Vacant(slot) => {
                slot.insert(entry);
            }
        }
        true
    }

    /// Forgets `ns/name`; returns the JSON length its entry held.
    fn remove(&mut self, ns: &str, name: &str) -> Option<usize> {
        let hash = self.hash(name);
        let in_ns = self.by_ns.get_mut(ns)?;
        let (entry, _) = in_ns
            .find_entry(hash, |e| entry_name(e) == name.as_bytes())
            .ok()?
            .remove();
        if in_ns.is_empty() {
            self.by_ns.remove(ns);
        }
        Some(json_len(entry_body(&entry)))
    }

    fn len(&self) -> usize {
        self.by_ns.values().map(HashTable::len).sum()
    }

    /// Every entry's compressed JSON.
    fn values(&self) -> impl Iterator<Item = &[u8]> {
        self.by_ns
            .values()
            .flat_map(|in_ns| in_ns.iter().map(|e| entry_body(e)))
    }
}

/// Largest object whose JSON becomes a cache's dictionary; a larger first object is not
/// taken (the next one may be). LZ4 reads at most the last 64 KiB of a dictionary, and
/// a remote's first object is the remote's choice: this bounds what it costs.
const MAX_DICT_BYTES: usize = 16 << 10;

/// The default of `--max-remote-cache-bytes`: 48 MiB per link. A stripped exported
/// Service costs about 450 bytes here (JSON, key, map slot: measured below), so 48 MiB
/// holds about 110,000 remote Services, eleven times Kubernetes' tested 10,000 per
/// cluster. A link's cache never passes it, a relist in progress included (both lists
/// are in memory until the new one completes), so a remote relists whole up to about
/// 55,000 Services: tests/scale.rs's 50,000 (45 MB while relisting) fit, which 32 MiB
/// would refuse. Measured (tests/hostile/apiserver.rs, debug build, a remote listing
/// 500,000 Services beside a second, small link): refused at the 48 MiB cap the process
/// peaked at 120 MiB of RSS, at a 32 MiB cap at 104 MiB; about one byte of RSS per
/// cached byte over a ~72 MiB base (the process, a list page being decoded). By that
/// slope three links at their cap come to about 215 MiB, under the install's 256 MiB.
pub const DEFAULT_MAX_REMOTE_CACHE_BYTES: usize = 48 << 20;

/// What an entry counts besides its JSON and names: the key's two strings and a map
/// slot, as measured when an entry was those (about 64 bytes with the allocator's
/// rounding). An entry now costs less (a 4-byte name length and a 16-byte slot): the
/// cap stays what the numbers below were measured with, a little conservative.
const ENTRY_OVERHEAD: usize = 64;

/// What an entry counts against the cap: its JSON's length, not what it takes
/// compressed, so the cap means what it says whatever the remote's objects have in
/// common (a hostile remote's need not compress).
fn entry_bytes(ns: &str, name: &str, json_len: usize) -> usize {
    ENTRY_OVERHEAD + ns.len() + name.len() + json_len
}

/// The JSON length an entry holds (the size its compressed form starts with).
fn json_len(entry: &[u8]) -> usize {
    entry
        .get(..4)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
}

#[derive(Default)]
struct State {
    objects: Objects,
    /// Objects of a (re)list in progress; they replace `objects` when it completes.
    listing: Objects,
    /// Bytes of `objects` and of `listing` (see `entry_bytes`).
    objects_bytes: usize,
    listing_bytes: usize,
    /// What entries are compressed against: set once, from the first object stored
    /// (see [`MAX_DICT_BYTES`]), and kept for the cache's life (every entry needs it).
    dict: Option<Box<[u8]>>,
}

impl State {
    fn dict(&self) -> &[u8] {
        self.dict.as_deref().unwrap_or_default()
    }
}

/// A cache of objects of kind `K` by namespace and name. Cheap to clone (shared).
pub(crate) struct Cache<K> {
    state: Arc<RwLock<State>>,
    /// Most bytes `objects` and `listing` hold together (`None`: no cap).
    cap: Option<usize>,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            cap: self.cap,
            _kind: PhantomData,
        }
    }
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            cap: None,
            _kind: PhantomData,
        }
    }
}

impl<K> Cache<K> {
    /// An empty cache that refuses objects past `cap` bytes (`None`: no cap).
    pub(crate) fn with_cap(cap: Option<usize>) -> Self {
        Self {
            cap,
            ..Self::default()
        }
    }

    /// The bytes held, a list in progress included.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        let state = self.state.read();
        state.objects_bytes + state.listing_bytes
    }

    /// The bytes the complete content's entries take compressed.
    #[cfg(test)]
    fn stored_bytes(&self) -> usize {
        self.state.read().objects.values().map(|e| e.len()).sum()
    }
}

/// An object's namespace and name (empty when unset).
fn key_of<K: Resource>(obj: &K) -> (&str, &str) {
    let meta = obj.meta();
    (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
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

    fn decode(entry: &[u8], dict: &[u8]) -> Option<Arc<K>> {
        let json = match lz4_flex::block::decompress_size_prepended_with_dict(entry, dict) {
            Ok(json) => json,
            Err(e) => {
                // Cannot happen for what `encode` wrote; never silently wrong, though.
                tracing::error!(kind = %K::kind(&()), error = %e, "undecompressable cached object");
                return None;
            }
        };
        match serde_json::from_slice(&json) {
            Ok(obj) => Some(Arc::new(obj)),
            Err(e) => {
                tracing::error!(kind = %K::kind(&()), error = %e, "undecodable cached object");
                None
            }
        }
    }

    /// `obj`'s JSON compressed (an entry's body), and the JSON's length; the first
    /// object small enough becomes the dictionary.
    fn encode(obj: &K, dict: &mut Option<Box<[u8]>>) -> Option<(Vec<u8>, usize)> {
        let json = match serde_json::to_vec(obj) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(kind = %K::kind(&()), error = %e, "unencodable object not cached");
                return None;
            }
        };
        if dict.is_none() && json.len() <= MAX_DICT_BYTES {
            *dict = Some(json.clone().into_boxed_slice());
        }
        let entry = lz4_flex::block::compress_prepend_size_with_dict(
            &json,
            dict.as_deref().unwrap_or_default(),
        );
        Some((entry, json.len()))
    }

    /// The object `r` refers to.
    pub(crate) fn get(&self, r: &ObjectRef<K>) -> Option<Arc<K>> {
        let state = self.read();
        state
            .objects
            .get(r.namespace.as_deref().unwrap_or_default(), &r.name)
            .and_then(|b| Self::decode(b, state.dict()))
    }

    /// Whether the object `r` refers to is cached (nothing decoded).
    pub(crate) fn contains(&self, r: &ObjectRef<K>) -> bool {
        self.read()
            .objects
            .get(r.namespace.as_deref().unwrap_or_default(), &r.name)
            .is_some()
    }

    /// Number of cached objects.
    pub(crate) fn len(&self) -> usize {
        self.read().objects.len()
    }

    /// Calls `f` with every cached object, decoded one at a time (for rebuilds after a
    /// list, not per event): a remote of 50,000 Services never exists decoded at once.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&K)) {
        let state = self.read();
        let dict = state.dict();
        for obj in state.objects.values().filter_map(|b| Self::decode(b, dict)) {
            f(&obj);
        }
    }

    /// Applies a watch event, with the semantics of kube's reflector store: a list
    /// (`Init` .. `InitDone`) replaces the whole content when it completes.
    pub(crate) fn apply_watcher_event(&self, event: &watcher::Event<K>) {
        // An uncapped cache never refuses; a capped one is fed by `try_apply`.
        let _ = self.try_apply(event);
    }

    /// [`Cache::apply_watcher_event`], refusing an object that would take the cache
    /// past its cap: the object is not stored, a list in progress is dropped, and the
    /// last complete content stays as it was.
    pub(crate) fn try_apply(&self, event: &watcher::Event<K>) -> Result<(), OverCap> {
        let mut state = self.write();
        let state = &mut *state;
        match event {
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                let Some((entry, len)) = Self::encode(obj, &mut state.dict) else {
                    return Ok(());
                };
                let (ns, name) = key_of(obj);
                let (map, held) = match event {
                    watcher::Event::InitApply(_) => (&mut state.listing, &mut state.listing_bytes),
                    _ => (&mut state.objects, &mut state.objects_bytes),
                };
                let replaced = map
                    .get(ns, name)
                    .map_or(0, |old| entry_bytes(ns, name, json_len(old)));
                let added = entry_bytes(ns, name, len);
                // The complete content and a list in progress may each take half the
                // cap (both are in memory during a relist). A cap on their sum locked a
                // remote accepted once at over half the cap out of every relist for good.
                let would_hold = *held - replaced + added;
                if let Some(cap) = self.cap
                    && would_hold > cap / 2
                {
                    state.listing = Objects::default();
                    state.listing_bytes = 0;
                    return Err(OverCap { cap, would_hold });
                }
                if map.insert(ns, name, &entry) {
                    *held = *held - replaced + added;
                }
            }
            watcher::Event::Delete(obj) => {
                let (ns, name) = key_of(obj);
                if let Some(old) = state.objects.remove(ns, name) {
                    state.objects_bytes -= entry_bytes(ns, name, old);
                }
            }
            watcher::Event::Init => {
                state.listing = Objects::default();
                state.listing_bytes = 0;
            }
            watcher::Event::InitDone => {
                state.objects = std::mem::take(&mut state.listing);
                state.objects_bytes = std::mem::take(&mut state.listing_bytes);
            }
        }
        Ok(())
    }
}

impl<K> crate::runtime::watch::Store<K> for Cache<K>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
{
    fn apply(&mut self, ev: &watcher::Event<K>) {
        self.apply_watcher_event(ev);
    }

    fn try_apply(&mut self, ev: &watcher::Event<K>) -> Result<(), OverCap> {
        Cache::try_apply(self, ev)
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

    #[test]
    fn a_stripped_exported_service_costs_a_few_hundred_bytes() {
        // As a real apiserver lists an exported Service (tests/scale.rs's shape).
        let mut svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s04999", "namespace": "scale-1234567890-0", "resourceVersion": "1234567",
                "uid": "0b6f3c55-8e4a-4a1e-9a3c-3f2b8c1d2e4f", "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {"mirror.linkerd.io/gateway-name": "gw", "mirror.linkerd.io/gateway-ns": "scale-1234567890-0"},
                "managedFields": [{"manager": "scale", "operation": "Update", "apiVersion": "v1",
                    "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"clusterIP": "None", "clusterIPs": ["None"], "type": "ClusterIP", "sessionAffinity": "None",
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster",
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}]},
            "status": {"loadBalancer": {}}
        }))
        .unwrap();
        super::super::strip::strip_remote(&mut svc);
        let cache = Cache::<Service>::default();
        cache.apply_watcher_event(&watcher::Event::Apply(svc));
        // The default cap's doc comment counts on this (measured: 446).
        assert!(
            (400..=500).contains(&cache.bytes()),
            "{} bytes",
            cache.bytes()
        );
    }

    #[test]
    fn similar_objects_are_stored_compressed_and_come_back_whole() {
        let cache = Cache::<Service>::default();
        let all: Vec<Service> = (0..100)
            .map(|i| {
                svc(
                    "mirrors",
                    &format!("web-{i:03}-east"),
                    &format!("{}", 1000 + i),
                )
            })
            .collect();
        for s in &all {
            cache.apply_watcher_event(&watcher::Event::Apply(s.clone()));
        }
        for s in &all {
            let r = ObjectRef::new(s.metadata.name.as_deref().unwrap()).within("mirrors");
            assert_eq!(*cache.get(&r).unwrap(), *s);
        }
        // The cap still counts JSON bytes; what is held is a fraction of them.
        let json: usize = all
            .iter()
            .map(|s| serde_json::to_vec(s).unwrap().len())
            .sum();
        assert!(
            cache.stored_bytes() * 3 < json,
            "{} bytes stored for {json} of JSON",
            cache.stored_bytes()
        );
        // A first object too large for a dictionary is stored all the same, and is not
        // the dictionary: the next one, small, is.
        let big = Cache::<Service>::default();
        let mut huge = svc("ns", "huge", "1");
        huge.metadata.annotations = Some([("x".to_string(), "y".repeat(MAX_DICT_BYTES))].into());
        big.apply_watcher_event(&watcher::Event::Apply(huge.clone()));
        assert!(
            big.state.read().dict.is_none(),
            "too large to be the dictionary"
        );
        big.apply_watcher_event(&watcher::Event::Apply(svc("ns", "small", "1")));
        let dict = big.state.read().dict.as_ref().map(|d| d.len());
        assert!(
            dict.is_some_and(|n| n <= MAX_DICT_BYTES),
            "dictionary {dict:?}"
        );
        assert_eq!(
            *big.get(&ObjectRef::new("huge").within("ns")).unwrap(),
            huge
        );
        assert!(big.get(&ObjectRef::new("small").within("ns")).is_some());
    }

    #[test]
    fn a_capped_cache_refuses_past_the_cap_and_keeps_its_last_complete_content() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let one = {
            let c = Cache::<Service>::default();
            c.apply_watcher_event(&Apply(svc("ns", "s0", "1")));
            c.bytes()
        };
        // Room for three objects in the complete content, and three in a list in
        // progress.
        let cache = Cache::<Service>::with_cap(Some(6 * one));
        let list = |n: usize, rv: &str| {
            let mut events = vec![Init];
            events.extend((0..n).map(|i| InitApply(svc("ns", &format!("s{i}"), rv))));
            events
        };
        for ev in list(3, "1").iter().chain([&InitDone]) {
            cache.try_apply(ev).unwrap();
        }
        assert_eq!((cache.len(), cache.bytes()), (3, 3 * one));
        // A relist of the same three fits, though six are in memory meanwhile: content
        // accepted once can always be listed again.
        for ev in list(3, "2").iter().chain([&InitDone]) {
            cache.try_apply(ev).unwrap();
        }
        let got = cache.get(&ObjectRef::new("s0").within("ns")).unwrap();
        assert_eq!(got.metadata.resource_version.as_deref(), Some("2"));
        // A relist of four is refused at the fourth.
        let events = list(4, "3");
        for ev in &events[..4] {
            cache.try_apply(ev).unwrap();
        }
        let refused = cache.try_apply(&events[4]).unwrap_err();
        assert_eq!(
            refused,
            OverCap {
                cap: 6 * one,
                would_hold: 4 * one
            }
        );
        // The list in progress is dropped; the complete content is untouched.
        assert_eq!((cache.len(), cache.bytes()), (3, 3 * one));
        let kept = cache.get(&ObjectRef::new("s0").within("ns")).unwrap();
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("2"));
        // A watch event: a replacement costs nothing new, a fourth object is refused,
        // a delete makes room.
        cache.try_apply(&Apply(svc("ns", "s1", "4"))).unwrap();
        assert!(cache.try_apply(&Apply(svc("ns", "s3", "1"))).is_err());
        assert_eq!(cache.len(), 3);
        cache.try_apply(&Delete(svc("ns", "s2", "2"))).unwrap();
        assert_eq!(cache.bytes(), 2 * one);
        cache.try_apply(&Apply(svc("ns", "s3", "1"))).unwrap();
        // Uncapped caches (the local ones) never refuse.
        let uncapped = Cache::<Service>::default();
        for i in 0..100 {
            uncapped
                .try_apply(&Apply(svc("ns", &format!("s{i}"), "1")))
                .unwrap();
        }
    }
}
