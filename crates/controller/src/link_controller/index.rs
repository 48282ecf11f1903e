//! In-memory indexes fed by watch events, so no event needs a scan of a store.

use service_mirror_core::{GatewayRef, ServiceKey};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Which remote Services use which gateway, and which local objects mirror which key.
#[derive(Debug, Default)]
pub(crate) struct Index {
    gateway_of: HashMap<ServiceKey, GatewayRef>,
    users_of: HashMap<GatewayRef, HashSet<ServiceKey>>,
    /// Remote Services a Link selects for remote discovery (mirrored without a gateway).
    discovery: HashSet<ServiceKey>,
    services: LocalIndex,
    endpoints: LocalIndex,
    slices: LocalIndex,
}

/// Local objects (by namespace and name) and the remote key each one mirrors.
///
/// Kept lean: one entry per local object of a link, three kinds, so 30,000 entries for
/// 10,000 mirrors. The key is shared by both maps (`Arc`), and a key's names are a
/// sorted vector (almost always one name) rather than a `BTreeSet`, whose first leaf
/// alone is a ~270-byte allocation for 11 slots. Measured with heaptrack at 2,000 Link
/// mirrors in `both` mode: see docs/operations.md (Memory).
#[derive(Debug, Default)]
pub(crate) struct LocalIndex {
    key_of: HashMap<(String, String), Arc<ServiceKey>>,
    names_of: HashMap<Arc<ServiceKey>, Names>,
}

/// The names of a key's local objects, sorted, without duplicates.
type Names = Vec<String>;

impl LocalIndex {
    /// Records that local object `ns/name` mirrors `key`; returns the key it had before.
    pub(crate) fn set(&mut self, ns: &str, name: &str, key: ServiceKey) -> Option<ServiceKey> {
        // Every update of a mirror comes back as an event: the same key again changes
        // nothing (a remove and an insert would churn both tables' slots and allocate
        // the names again: 20,000 times when a gateway move rewrites 10,000 mirrors).
        if let Some(same) = self
            .key_of
            .get(&(ns.to_string(), name.to_string()))
            .filter(|k| ***k == key)
        {
            return Some((**same).clone());
        }
        let old = self.remove(ns, name);
        // One shared key per mirrored Service, whichever object of it came first.
        let key = match self.names_of.get_key_value(&key) {
            Some((shared, _)) => shared.clone(),
            None => Arc::new(key),
        };
        let names = self.names_of.entry(key.clone()).or_default();
        if let Err(at) = names.binary_search_by(|n| n.as_str().cmp(name)) {
            names.insert(at, name.to_string());
            names.shrink_to_fit();
        }
        self.key_of.insert((ns.to_string(), name.to_string()), key);
        old
    }

    /// Forgets local object `ns/name`; returns the key it mirrored.
    pub(crate) fn remove(&mut self, ns: &str, name: &str) -> Option<ServiceKey> {
        let key = self.key_of.remove(&(ns.to_string(), name.to_string()))?;
        if let Some(names) = self.names_of.get_mut(&key) {
            if let Ok(at) = names.binary_search_by(|n| n.as_str().cmp(name)) {
                names.remove(at);
            }
            if names.is_empty() {
                self.names_of.remove(&key);
            }
        }
        Some(Arc::unwrap_or_clone(key))
    }

    /// Names of the local objects that mirror `key`, in order.
    pub(crate) fn names(&self, key: &ServiceKey) -> impl Iterator<Item = &String> {
        self.names_of.get(key).into_iter().flatten()
    }

    /// Every key some local object mirrors.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &ServiceKey> {
        self.names_of.keys().map(|k| &**k)
    }

    /// Empties the index (before a rebuild after a relist).
    pub(crate) fn clear(&mut self) {
        self.key_of.clear();
        self.names_of.clear();
    }
}

impl Index {
    /// Records the gateway a remote Service is exported through (None: not exported or
    /// deleted). Returns the gateway it used before, if any.
    pub(crate) fn set_gateway(
        &mut self,
        key: &ServiceKey,
        gateway: Option<GatewayRef>,
    ) -> Option<GatewayRef> {
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
            self.users_of
                .entry(gw.clone())
                .or_default()
                .insert(key.clone());
            self.gateway_of.insert(key.clone(), gw);
        }
        old
    }

    /// Remote Services exported through `gateway`.
    pub(crate) fn users_of(&self, gateway: &GatewayRef) -> Vec<ServiceKey> {
        self.users_of
            .get(gateway)
            .map(|u| u.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Every gateway in use, with how many of its users have a local mirror Service.
    pub(crate) fn gateway_mirrors(&self) -> Vec<(GatewayRef, usize)> {
        self.users_of
            .iter()
            .map(|(gw, users)| {
                let mirrored = users
                    .iter()
                    .filter(|k| self.services.names(k).next().is_some())
                    .count();
                (gw.clone(), mirrored)
            })
            .collect()
    }

    /// Every gateway in use.
    pub(crate) fn gateways(&self) -> Vec<GatewayRef> {
        self.users_of.keys().cloned().collect()
    }

    /// Records whether a remote Service is selected for remote discovery.
    pub(crate) fn set_discovery(&mut self, key: &ServiceKey, selected: bool) {
        match selected {
            true => self.discovery.insert(key.clone()),
            false => self.discovery.remove(key),
        };
    }

    /// Every exported remote Service (through a gateway or for remote discovery).
    pub(crate) fn exported(&self) -> impl Iterator<Item = &ServiceKey> {
        self.gateway_of.keys().chain(self.discovery.iter())
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
    }

    /// The local Services index.
    pub(crate) fn services(&mut self) -> &mut LocalIndex {
        &mut self.services
    }

    /// The local Endpoints index.
    pub(crate) fn endpoints(&mut self) -> &mut LocalIndex {
        &mut self.endpoints
    }

    /// The local EndpointSlices index.
    pub(crate) fn slices(&mut self) -> &mut LocalIndex {
        &mut self.slices
    }

    /// Names of local Services and Endpoints that mirror `key`.
    pub(crate) fn local_names(&self, key: &ServiceKey) -> (Vec<String>, Vec<String>) {
        (
            self.services.names(key).cloned().collect(),
            self.endpoints.names(key).cloned().collect(),
        )
    }

    /// Names of our local EndpointSlices that stand for `key`.
    pub(crate) fn slice_names(&self, key: &ServiceKey) -> Vec<String> {
        self.slices.names(key).cloned().collect()
    }

    /// Every key a local object mirrors.
    pub(crate) fn local_keys(&self) -> HashSet<ServiceKey> {
        self.services
            .keys()
            .chain(self.endpoints.keys())
            .chain(self.slices.keys())
            .cloned()
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
        let mut i = LocalIndex::default();
        assert_eq!(i.set("ns", "web-east", key("web")), None);
        for _ in 0..3 {
            assert_eq!(i.set("ns", "web-east", key("web")), Some(key("web")));
        }
        assert_eq!(i.names(&key("web")).collect::<Vec<_>>(), ["web-east"]);
        assert_eq!(i.set("ns", "web-east", key("api")), Some(key("web")));
        assert_eq!(i.names(&key("web")).count(), 0);
        assert_eq!(i.names(&key("api")).collect::<Vec<_>>(), ["web-east"]);
        assert_eq!(i.keys().count(), 1);
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
    fn local_objects_map_to_keys_and_back() {
        let mut i = Index::default();
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
        let mut i = LocalIndex::default();
        // A deterministic walk over 4 keys and 12 objects in 2 namespaces: sets, moves
        // between keys, repeated sets and removes (xorshift, no dependency).
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..5_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let ns = ["a", "b"][(x % 2) as usize];
            let name = format!("o{}", (x >> 8) % 12);
            let key = ServiceKey::new(ns, format!("k{}", (x >> 16) % 4));
            let at = (ns.to_string(), name.clone());
            if (x >> 24).is_multiple_of(3) {
                assert_eq!(i.remove(ns, &name), model.remove(&at));
            } else {
                assert_eq!(i.set(ns, &name, key.clone()), model.insert(at, key));
            }
            let mut names_of: BTreeMap<&ServiceKey, BTreeSet<&String>> = BTreeMap::new();
            for ((_, n), k) in &model {
                names_of.entry(k).or_default().insert(n);
            }
            let keys: BTreeSet<&ServiceKey> = i.keys().collect();
            assert_eq!(keys, names_of.keys().copied().collect());
            for (k, want) in &names_of {
                let got: Vec<&String> = i.names(k).collect();
                assert_eq!(got, want.iter().copied().collect::<Vec<_>>(), "{k}");
            }
        }
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
