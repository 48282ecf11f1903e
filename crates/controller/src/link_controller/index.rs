//! In-memory indexes fed by watch events, so no event needs a scan of a store.

use service_mirror_core::{GatewayRef, ServiceKey};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Which remote Services use which gateway, and which local objects mirror which key.
///
/// Every table names a remote key by an `Arc` of one shared copy ([`Keys`]), and a
/// gateway by an `Arc` of one copy per gateway: at fleet scale the keys were most of
/// the tables (heaptrack at 10 links x 1,000 Services: 309 bytes per local object and
/// 323 per exported remote Service, each table holding its own copies of a key's two
/// strings; see BENCHMARKS.md, "What the live heap holds at fleet scale").
#[derive(Debug, Default)]
pub(crate) struct Index {
    keys: Keys,
    gateway_of: HashMap<Arc<ServiceKey>, Arc<GatewayRef>>,
    users_of: HashMap<Arc<GatewayRef>, HashSet<Arc<ServiceKey>>>,
    /// Remote Services a Link selects for remote discovery (mirrored without a gateway).
    discovery: HashSet<Arc<ServiceKey>>,
    services: LocalIndex,
    endpoints: LocalIndex,
    slices: LocalIndex,
}

/// One shared copy of each remote key the tables name (the index's, and outside it the
/// mirror limit's, the Link status book's and the remote readiness table's).
#[derive(Debug, Default)]
pub(crate) struct Keys {
    set: HashSet<Arc<ServiceKey>>,
    /// Keys made, or let go by an index table, since the last sweep.
    churn: usize,
}

impl Keys {
    /// The shared copy of `key` (made on first use).
    fn intern(&mut self, key: &ServiceKey) -> Arc<ServiceKey> {
        if let Some(k) = self.set.get(key) {
            return k.clone();
        }
        let k = Arc::new(key.clone());
        self.set.insert(k.clone());
        // A new key counts toward the sweep: a table outside the index (the readiness
        // table holds a key for every remote Service with a slice, mirrored or not)
        // lets its keys go without telling, so without this its dead keys would wait
        // for the index's own releases. With it the set holds at most about twice the
        // keys held since the last sweep, plus 1,024.
        self.churned();
        k
    }

    /// A table let go of a key.
    fn release(&mut self) {
        self.churned();
    }

    /// The copies no table holds any more are dropped in a sweep once the keys made or
    /// let go reach half the keys (at least 1,024): amortized O(1).
    fn churned(&mut self) {
        self.churn += 1;
        if self.churn >= (self.set.len() / 2).max(1024) {
            self.sweep();
        }
    }

    /// Drops the copies no table holds (only this set's reference is left).
    fn sweep(&mut self) {
        self.set.retain(|k| Arc::strong_count(k) > 1);
        self.churn = 0;
    }
}

/// Local objects (by namespace and name) and the remote key each one mirrors.
///
/// Kept lean: one entry per local object of a link, three kinds, so 20,000 to 30,000
/// entries for 10,000 mirrors. Almost every object is named as its key's mirror is,
/// `<key name>-<cluster>` in the key's namespace: such an object is only its key in
/// `derived` (an 8-byte slot; the name is made again when asked). Only the others (a
/// long name's hashed mirror name, a headless Service's endpoint mirrors, slices, a
/// stranger's labels) are in the maps: the key the index's shared copy, each name one
/// `Arc<str>` held by both maps, the names of a key a boxed sorted slice (a `BTreeSet`'s
/// first leaf alone is a ~270-byte allocation for 11 slots) and the namespace a map
/// level rather than a string per object. The maps took about 145 bytes of each object
/// (heaptrack at 10 links x 1,000 Services, before `derived`).
#[derive(Debug, Default)]
pub(crate) struct LocalIndex {
    /// `-<cluster>`: what a derived object's name adds to its key's name.
    suffix: Arc<str>,
    /// Keys whose object is named `<key name><suffix>` in the key's namespace.
    derived: HashSet<Arc<ServiceKey>>,
    key_of: HashMap<Box<str>, HashMap<Arc<str>, Arc<ServiceKey>>>,
    names_of: HashMap<Arc<ServiceKey>, Names>,
}

/// Whether `name` is the one `key`'s mirror gets from `suffix`: `<key name><suffix>`
/// (`-<cluster>` for a link's mirrors). Such names are kept as marks, not strings, here
/// and in the Link status book.
pub(crate) fn derived_name(name: &str, key: &ServiceKey, suffix: &str) -> bool {
    name.strip_suffix(suffix) == Some(key.name.as_str())
}

/// The names of a key's local objects, sorted, one per object.
type Names = Box<[Arc<str>]>;

impl LocalIndex {
    fn with_suffix(suffix: Arc<str>) -> Self {
        Self {
            suffix,
            ..Self::default()
        }
    }

    /// Whether object `ns/name` is `key`'s derived one.
    fn derives(&self, ns: &str, name: &str, key: &ServiceKey) -> bool {
        ns == key.namespace && derived_name(name, key, &self.suffix)
    }

    /// The key of the derived object `ns/name` would be, if its name can be one.
    fn derived_key(&self, ns: &str, name: &str) -> Option<ServiceKey> {
        let base = name.strip_suffix(&*self.suffix)?;
        Some(ServiceKey::new(ns, base))
    }

    fn get(&self, ns: &str, name: &str) -> Option<Arc<ServiceKey>> {
        if let Some(key) = self.key_of.get(ns).and_then(|in_ns| in_ns.get(name)) {
            return Some(key.clone());
        }
        self.derived.get(&self.derived_key(ns, name)?).cloned()
    }

    fn set(
        &mut self,
        keys: &mut Keys,
        ns: &str,
        name: &str,
        key: &ServiceKey,
    ) -> Option<ServiceKey> {
        // Every update of a mirror comes back as an event: the same key again changes
        // nothing (a remove and an insert would churn the tables' slots and allocate
        // the names again: 20,000 times when a gateway move rewrites 10,000 mirrors).
        let derived = self.derives(ns, name, key);
        if derived && self.derived.contains(key) {
            return Some(key.clone());
        }
        if !derived && let Some(same) = self.get(ns, name).filter(|k| **k == *key) {
            return Some((*same).clone());
        }
        // A derived object not in the derived set can only be in the maps: no key to
        // make for the set's lookup (a mirror's first event).
        let old = match derived {
            true => self
                .remove_mapped(ns, name)
                .map(|k| Self::released(keys, k)),
            false => self.remove(keys, ns, name),
        };
        let key = keys.intern(key);
        if derived {
            self.derived.insert(key);
            return old;
        }
        let name: Arc<str> = Arc::from(name);
        // One name per object, so a name twice when objects of two namespaces claim
        // the key: removing one keeps the other's.
        let names = self.names_of.entry(key.clone()).or_default();
        let at = names.partition_point(|n| **n < *name);
        let mut v = std::mem::take(names).into_vec();
        v.insert(at, name.clone());
        *names = v.into_boxed_slice();
        match self.key_of.get_mut(ns) {
            Some(in_ns) => in_ns.insert(name, key),
            None => self.key_of.entry(ns.into()).or_default().insert(name, key),
        };
        old
    }

    fn remove(&mut self, keys: &mut Keys, ns: &str, name: &str) -> Option<ServiceKey> {
        let key = match self.remove_mapped(ns, name) {
            Some(key) => key,
            None => self.derived.take(&self.derived_key(ns, name)?)?,
        };
        Some(Self::released(keys, key))
    }

    /// Takes `ns/name` out of the maps (not the derived set).
    fn remove_mapped(&mut self, ns: &str, name: &str) -> Option<Arc<ServiceKey>> {
        let in_ns = self.key_of.get_mut(ns)?;
        let key = in_ns.remove(name)?;
        if in_ns.is_empty() {
            self.key_of.remove(ns);
        }
        if let Some(names) = self.names_of.get_mut(&key) {
            if let Ok(at) = names.binary_search_by(|n| (**n).cmp(name)) {
                let mut v = std::mem::take(names).into_vec();
                v.remove(at);
                *names = v.into_boxed_slice();
            }
            if names.is_empty() {
                self.names_of.remove(&key);
            }
        }
        Some(key)
    }

    /// A table let go of `key`: the key, for the caller.
    fn released(keys: &mut Keys, key: Arc<ServiceKey>) -> ServiceKey {
        let removed = (*key).clone();
        drop(key);
        keys.release();
        removed
    }

    /// The names of `key`'s objects, sorted, each once.
    fn names(&self, key: &ServiceKey) -> Vec<String> {
        let mut names: Vec<String> = self
            .names_of
            .get(key)
            .into_iter()
            .flat_map(|names| names.iter().map(|n| n.to_string()))
            .collect();
        names.dedup();
        if self.derived.contains(key) {
            let name = format!("{}{}", key.name, self.suffix);
            if let Err(at) = names.binary_search(&name) {
                names.insert(at, name);
            }
        }
        names
    }

    /// How many objects `key` has.
    fn count(&self, key: &ServiceKey) -> usize {
        usize::from(self.derived.contains(key)) + self.names_of.get(key).map_or(0, |n| n.len())
    }

    /// Every key with an object, once each.
    fn keys(&self) -> impl Iterator<Item = &Arc<ServiceKey>> {
        self.derived.iter().chain(
            self.names_of
                .keys()
                .filter(|k| !self.derived.contains(&***k)),
        )
    }

    fn clear(&mut self) {
        self.derived.clear();
        self.key_of.clear();
        self.names_of.clear();
    }
}

/// One kind's local objects table, with the index's shared keys.
pub(crate) struct Local<'a> {
    table: &'a mut LocalIndex,
    keys: &'a mut Keys,
}

impl Local<'_> {
    /// Records that local object `ns/name` mirrors `key`; returns the key it had before.
    pub(crate) fn set(&mut self, ns: &str, name: &str, key: ServiceKey) -> Option<ServiceKey> {
        self.table.set(self.keys, ns, name, &key)
    }

    /// Forgets local object `ns/name`; returns the key it mirrored.
    pub(crate) fn remove(&mut self, ns: &str, name: &str) -> Option<ServiceKey> {
        self.table.remove(self.keys, ns, name)
    }

    /// Names of the local objects that mirror `key`, in order.
    #[cfg(test)]
    pub(crate) fn names(&self, key: &ServiceKey) -> Vec<String> {
        self.table.names(key)
    }

    /// How many local objects mirror `key`.
    pub(crate) fn count(&self, key: &ServiceKey) -> usize {
        self.table.count(key)
    }

    /// Every key some local object mirrors (the index's shared copies).
    pub(crate) fn keys(&self) -> impl Iterator<Item = &Arc<ServiceKey>> {
        self.table.keys()
    }

    /// The index's shared copy of `key` (for a table outside the index, such as the
    /// mirror limit's, so it keeps no copy of its own).
    pub(crate) fn shared(&mut self, key: &ServiceKey) -> Arc<ServiceKey> {
        self.keys.intern(key)
    }

    /// Empties the table (before a rebuild after a relist).
    pub(crate) fn clear(&mut self) {
        self.table.clear();
        self.keys.sweep();
    }
}

impl Index {
    /// An empty index of the link to cluster `cluster` (whose mirrors are named
    /// `<remote name>-<cluster>`).
    pub(crate) fn new(cluster: &str) -> Self {
        let suffix: Arc<str> = format!("-{cluster}").into();
        Self {
            services: LocalIndex::with_suffix(suffix.clone()),
            endpoints: LocalIndex::with_suffix(suffix.clone()),
            slices: LocalIndex::with_suffix(suffix),
            ..Self::default()
        }
    }

    /// Records the gateway a remote Service is exported through (None: not exported or
    /// deleted). Returns the gateway it used before, if any.
    pub(crate) fn set_gateway(
        &mut self,
        key: &ServiceKey,
        gateway: Option<GatewayRef>,
    ) -> Option<GatewayRef> {
        // Every event of an exported Service sets its gateway again: unchanged, nothing
        // moves.
        if let (Some(now), Some(gw)) = (self.gateway_of.get(key), &gateway)
            && **now == *gw
        {
            return gateway;
        }
        let old = self.gateway_of.remove(key);
        if let Some(old) = &old
            && let Some(users) = self.users_of.get_mut(old)
        {
            users.remove(key);
            if users.is_empty() {
                self.users_of.remove(old);
            }
        }
        if let Some(gw) = gateway {
            let key = self.keys.intern(key);
            let gw = match self.users_of.get_key_value(&gw) {
                Some((shared, _)) => shared.clone(),
                None => Arc::new(gw),
            };
            self.users_of
                .entry(gw.clone())
                .or_default()
                .insert(key.clone());
            self.gateway_of.insert(key, gw);
        }
        old.map(|old| {
            self.keys.release();
            Arc::unwrap_or_clone(old)
        })
    }

    /// Remote Services exported through `gateway`.
    pub(crate) fn users_of(&self, gateway: &GatewayRef) -> Vec<ServiceKey> {
        self.users_of
            .get(gateway)
            .map(|u| u.iter().map(|k| (**k).clone()).collect())
            .unwrap_or_default()
    }

    /// Every gateway in use, with how many of its users have a local mirror Service.
    pub(crate) fn gateway_mirrors(&self) -> Vec<(GatewayRef, usize)> {
        self.users_of
            .iter()
            .map(|(gw, users)| {
                let mirrored = users.iter().filter(|k| self.services.count(k) > 0).count();
                ((**gw).clone(), mirrored)
            })
            .collect()
    }

    /// Every gateway in use.
    pub(crate) fn gateways(&self) -> Vec<GatewayRef> {
        self.users_of.keys().map(|g| (**g).clone()).collect()
    }

    /// Records whether a remote Service is selected for remote discovery.
    pub(crate) fn set_discovery(&mut self, key: &ServiceKey, selected: bool) {
        if selected {
            if !self.discovery.contains(key) {
                let key = self.keys.intern(key);
                self.discovery.insert(key);
            }
        } else if self.discovery.remove(key) {
            self.keys.release();
        }
    }

    /// Every exported remote Service (through a gateway or for remote discovery).
    pub(crate) fn exported(&self) -> impl Iterator<Item = &ServiceKey> {
        self.gateway_of
            .keys()
            .chain(self.discovery.iter())
            .map(|k| &**k)
    }

    /// Every key with something to do: the exported ones and those with local mirrors
    /// (a mirror whose remote Service is gone or no longer selected is deleted by its
    /// key's reconcile). A complete list that decisions waited for looks at all of them.
    pub(crate) fn all_keys(&self) -> HashSet<ServiceKey> {
        let mut keys = self.local_keys();
        keys.extend(self.exported().cloned());
        keys
    }

    /// Forgets every gateway association (before a rebuild after a relist).
    pub(crate) fn clear_gateways(&mut self) {
        self.discovery.clear();
        self.gateway_of.clear();
        self.users_of.clear();
        self.keys.sweep();
    }

    /// The local Services index.
    pub(crate) fn services(&mut self) -> Local<'_> {
        Local {
            table: &mut self.services,
            keys: &mut self.keys,
        }
    }

    /// The local Endpoints index.
    pub(crate) fn endpoints(&mut self) -> Local<'_> {
        Local {
            table: &mut self.endpoints,
            keys: &mut self.keys,
        }
    }

    /// The local EndpointSlices index.
    pub(crate) fn slices(&mut self) -> Local<'_> {
        Local {
            table: &mut self.slices,
            keys: &mut self.keys,
        }
    }

    /// Whether a local Service mirrors `key`.
    pub(crate) fn has_local_services(&self, key: &ServiceKey) -> bool {
        self.services.count(key) > 0
    }

    /// Names of local Services and Endpoints that mirror `key`.
    pub(crate) fn local_names(&self, key: &ServiceKey) -> (Vec<String>, Vec<String>) {
        (self.services.names(key), self.endpoints.names(key))
    }

    /// Names of our local EndpointSlices that stand for `key`.
    pub(crate) fn slice_names(&self, key: &ServiceKey) -> Vec<String> {
        self.slices.names(key)
    }

    /// Every key a local object mirrors.
    pub(crate) fn local_keys(&self) -> HashSet<ServiceKey> {
        self.services
            .keys()
            .chain(self.endpoints.keys())
            .chain(self.slices.keys())
            .map(|k| (**k).clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> ServiceKey {
        ServiceKey::new("ns", n)
    }

    #[test]
    fn setting_an_object_to_the_key_it_has_changes_nothing_and_another_key_moves_it() {
        let mut index = Index::new("east");
        let mut i = index.services();
        assert_eq!(i.set("ns", "web-east", key("web")), None);
        for _ in 0..3 {
            assert_eq!(i.set("ns", "web-east", key("web")), Some(key("web")));
        }
        assert_eq!(i.names(&key("web")), ["web-east"]);
        assert_eq!(i.set("ns", "web-east", key("api")), Some(key("web")));
        assert_eq!(i.count(&key("web")), 0);
        assert_eq!(i.names(&key("api")), ["web-east"]);
        assert_eq!(i.keys().count(), 1);
        // And back to the key it is named for.
        assert_eq!(i.set("ns", "web-east", key("web")), Some(key("api")));
        assert_eq!(i.names(&key("web")), ["web-east"]);
        assert_eq!(i.count(&key("api")), 0);
    }

    #[test]
    fn gateway_moves_update_both_sides() {
        let mut i = Index::default();
        let (g1, g2) = (GatewayRef::new("gw", "one"), GatewayRef::new("gw", "two"));
        i.set_gateway(&key("a"), Some(g1.clone()));
        i.set_gateway(&key("b"), Some(g1.clone()));
        assert_eq!(i.users_of(&g1).len(), 2);
        assert_eq!(i.set_gateway(&key("a"), Some(g2.clone())), Some(g1.clone()));
        assert_eq!(i.users_of(&g1), vec![key("b")]);
        assert_eq!(i.users_of(&g2), vec![key("a")]);
        i.set_gateway(&key("b"), None);
        assert!(i.users_of(&g1).is_empty());
        assert_eq!(i.gateways(), vec![g2]);
    }

    #[test]
    fn keys_an_outside_table_made_and_dropped_are_swept_as_new_keys_come() {
        // The readiness table interns a key per remote Service and drops it without
        // telling the index: the new keys alone must bring the sweep.
        let mut i = Index::new("east");
        let mut most = 0;
        for n in 0..3000 {
            drop(i.services().shared(&key(&format!("svc-{n}"))));
            most = most.max(i.keys.set.len());
        }
        assert!(most <= 1024, "at most the sweep's floor: {most}");
        // A key still held survives every sweep.
        let held = i.services().shared(&key("held"));
        for n in 0..3000 {
            drop(i.services().shared(&key(&format!("more-{n}"))));
        }
        assert!(Arc::ptr_eq(&held, &i.services().shared(&key("held"))));
    }

    #[test]
    fn local_objects_map_to_keys_and_back() {
        let mut i = Index::new("east");
        i.services().set("ns", "a-east", key("a"));
        i.services().set("ns", "legacy", key("a"));
        assert_eq!(
            i.local_names(&key("a")).0,
            vec!["a-east".to_string(), "legacy".to_string()]
        );
        assert_eq!(i.services().set("ns", "legacy", key("b")), Some(key("a")));
        assert_eq!(i.services().remove("ns", "a-east"), Some(key("a")));
        assert!(i.local_names(&key("a")).0.is_empty());
        assert_eq!(i.local_keys(), HashSet::from([key("b")]));
    }

    #[test]
    fn the_lean_local_index_answers_as_a_map_of_sorted_sets_would() {
        use std::collections::{BTreeMap, BTreeSet};
        // The model: what the index stood for before it was made lean.
        let mut model: BTreeMap<(String, String), ServiceKey> = BTreeMap::new();
        let mut index = Index::new("east");
        let mut i = index.services();
        // A deterministic walk over 4 keys and 16 objects in 2 namespaces: sets, moves
        // between keys, repeated sets and removes (xorshift, no dependency). Half the
        // names are a key's mirror name (`k<n>-east`), in either namespace, so objects
        // move between the derived set and the maps.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let (mut derived, mut mapped) = (false, false);
        for _ in 0..5_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            derived |= !i.table.derived.is_empty();
            mapped |= !i.table.names_of.is_empty();
            let ns = ["a", "b"][(x % 2) as usize];
            let n = (x >> 8) % 16;
            let name = match n < 8 {
                true => format!("o{n}"),
                false => format!("k{}-east", n % 4),
            };
            let key = ServiceKey::new(
                ["a", "b"][((x >> 12) % 2) as usize],
                format!("k{}", (x >> 16) % 4),
            );
            let at = (ns.to_string(), name.clone());
            if (x >> 24).is_multiple_of(3) {
                assert_eq!(i.remove(ns, &name), model.remove(&at));
            } else {
                assert_eq!(i.set(ns, &name, key.clone()), model.insert(at, key));
            }
            let mut objects_of: BTreeMap<&ServiceKey, BTreeSet<(&str, &str)>> = BTreeMap::new();
            for ((ns, n), k) in &model {
                objects_of.entry(k).or_default().insert((ns, n));
            }
            let keys: Vec<&ServiceKey> = i.keys().map(|k| &**k).collect();
            let unique: BTreeSet<&ServiceKey> = keys.iter().copied().collect();
            assert_eq!(keys.len(), unique.len(), "each key once");
            assert_eq!(unique, objects_of.keys().copied().collect());
            for (k, objects) in &objects_of {
                let names: BTreeSet<&str> = objects.iter().map(|(_, n)| *n).collect();
                assert_eq!(i.names(k), names.into_iter().collect::<Vec<_>>(), "{k}");
                assert_eq!(i.count(k), objects.len(), "{k}");
            }
        }
        assert!(
            derived && mapped,
            "the walk used the derived set and the maps"
        );
    }

    /// Every table names a key by one shared copy, and the copies no table holds are
    /// dropped (by the amortized sweep, or at a rebuild's clear).
    #[test]
    fn the_tables_share_one_copy_of_a_key_and_let_it_go_when_none_holds_it() {
        let mut i = Index::new("east");
        let gw = GatewayRef::new("gw", "one");
        i.set_gateway(&key("web"), Some(gw.clone()));
        i.services().set("ns", "web-east", key("web"));
        i.endpoints().set("ns", "web-east", key("web"));
        i.set_discovery(&key("web"), true);
        assert_eq!(i.keys.set.len(), 1);
        let shared = i.keys.set.iter().next().unwrap().clone();
        // The set, the gateway index (both of its tables), discovery, two local tables
        // (their derived sets: both objects are named as web's mirror) and this
        // test's handle: one copy, seven holders.
        assert_eq!(Arc::strong_count(&shared), 7);
        // The same gateway again: nothing moves.
        assert_eq!(i.set_gateway(&key("web"), Some(gw.clone())), Some(gw));
        assert_eq!(Arc::strong_count(&shared), 7);
        // An object named otherwise is in both maps of its table.
        i.services().set("ns", "legacy", key("web"));
        assert_eq!(Arc::strong_count(&shared), 9);
        i.services().remove("ns", "legacy");
        i.set_gateway(&key("web"), None);
        i.set_discovery(&key("web"), false);
        i.services().remove("ns", "web-east");
        i.endpoints().remove("ns", "web-east");
        assert_eq!(
            Arc::strong_count(&shared),
            2,
            "only the set and this handle"
        );
        drop(shared);
        i.keys.sweep();
        assert!(i.keys.set.is_empty());
        // 2,000 keys set and removed: the sweeps keep the set from growing with them.
        for n in 0..2_000 {
            let k = key(&format!("k{n}"));
            i.services().set("ns", &format!("k{n}-east"), k);
            i.services().remove("ns", &format!("k{n}-east"));
        }
        assert!(i.keys.set.len() < 1_100, "{}", i.keys.set.len());
        i.services().clear();
        assert!(i.keys.set.is_empty());
    }

    #[test]
    fn every_key_holds_unexported_keys_that_still_have_mirrors() {
        let mut i = Index::default();
        i.set_gateway(&key("exported"), Some(GatewayRef::new("gw", "one")));
        i.set_discovery(&key("discovered"), true);
        // No longer selected: only its mirror is left, which its reconcile deletes.
        i.services().set("ns", "gone-east", key("gone"));
        assert_eq!(
            i.all_keys(),
            HashSet::from([key("exported"), key("discovered"), key("gone")])
        );
    }
}
