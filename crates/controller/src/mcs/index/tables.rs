//! The two tables the export index keeps per cluster and kind: [`Listed`] (one object
//! per key) and [`Grouped`] (several per key, by name), each fed by one watch and
//! keeping its last complete list through a relist.

use super::*;

/// Objects of one kind in one cluster, by key.
#[derive(Debug)]
pub(in crate::mcs) struct Listed<T> {
    /// The objects of the last complete list, updated by events since.
    pub(in crate::mcs) items: BTreeMap<ServiceKey, T>,
    /// The keys the list in progress has delivered (`None`: no list in progress).
    listing: Option<BTreeSet<ServiceKey>>,
    /// A complete list has arrived.
    pub(in crate::mcs) listed: bool,
}

impl<T> Default for Listed<T> {
    fn default() -> Self {
        Self {
            items: BTreeMap::new(),
            listing: None,
            listed: false,
        }
    }
}

impl<T: PartialEq> Listed<T> {
    /// Applies `ev`, each object under the key `key` gives it (None: not stored) made by
    /// `keep` (None: not stored, as if deleted).
    pub(in crate::mcs) fn apply<K>(
        &mut self,
        ev: &Event<K>,
        key: impl Fn(&K) -> Option<ServiceKey>,
        keep: impl Fn(&K) -> Option<T>,
    ) -> Changed {
        let mut changed = Changed::new();
        match ev {
            Event::Init => self.listing = Some(BTreeSet::new()),
            Event::InitApply(o) | Event::Apply(o) => {
                let Some(key) = key(o) else {
                    return changed;
                };
                if let (Event::InitApply(_), Some(seen)) = (ev, self.listing.as_mut()) {
                    seen.insert(key.clone());
                }
                let next = keep(o);
                if self.items.get(&key) != next.as_ref() {
                    match next {
                        Some(v) => self.items.insert(key.clone(), v),
                        None => self.items.remove(&key),
                    };
                    changed.insert(key);
                }
            }
            Event::Delete(o) => {
                if let Some(key) = key(o)
                    && self.items.remove(&key).is_some()
                {
                    changed.insert(key);
                }
            }
            Event::InitDone => {
                if let Some(seen) = self.listing.take() {
                    let gone: Vec<ServiceKey> = self
                        .items
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        self.items.remove(&key);
                        changed.insert(key);
                    }
                }
                self.listed = true;
            }
        }
        changed
    }
}

/// Objects of which several share a key (the EndpointSlices of one import), as the
/// last complete list gave them, updated by events since. An object is known by its
/// namespace/name; its key comes from its labels, so a relabelled one moves.
pub(crate) struct Grouped<K> {
    /// By key, then by `<namespace>/<name>`.
    pub(crate) items: BTreeMap<ServiceKey, BTreeMap<String, K>>,
    /// The key each object is filed under.
    filed: BTreeMap<String, ServiceKey>,
    /// The list in progress (`None`: none).
    listing: Option<Vec<(ServiceKey, String, K)>>,
    /// A complete list has arrived.
    pub(crate) listed: bool,
}

impl<K> Default for Grouped<K> {
    fn default() -> Self {
        Self {
            items: BTreeMap::new(),
            filed: BTreeMap::new(),
            listing: None,
            listed: false,
        }
    }
}

impl<K: kube::Resource + Clone + PartialEq> Grouped<K> {
    /// Applies `ev`, each object filed under the key `key` gives it (None: not kept).
    pub(crate) fn apply(
        &mut self,
        ev: &Event<K>,
        key: impl Fn(&K) -> Option<ServiceKey>,
    ) -> Changed {
        let id = |o: &K| {
            let m = o.meta();
            format!(
                "{}/{}",
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default()
            )
        };
        let mut changed = Changed::new();
        match ev {
            Event::Init => self.listing = Some(Vec::new()),
            Event::InitApply(o) => match (key(o), self.listing.as_mut()) {
                (Some(k), Some(listing)) => listing.push((k, id(o), o.clone())),
                (k, None) => self.put(id(o), k, o, &mut changed),
                (None, Some(_)) => {}
            },
            Event::Apply(o) => self.put(id(o), key(o), o, &mut changed),
            Event::Delete(o) => self.put(id(o), None, o, &mut changed),
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let before = std::mem::take(&mut self.items);
                self.filed.clear();
                for (k, name, o) in listed {
                    self.filed.insert(name.clone(), k.clone());
                    self.items.entry(k).or_default().insert(name, o);
                }
                let keys: BTreeSet<&ServiceKey> = before.keys().chain(self.items.keys()).collect();
                changed.extend(
                    keys.into_iter()
                        .filter(|k| before.get(*k) != self.items.get(*k))
                        .cloned(),
                );
                self.listed = true;
            }
        }
        changed
    }

    /// Files `o` under `key` (`None`: forgets it), noting the keys that changed.
    fn put(&mut self, name: String, key: Option<ServiceKey>, o: &K, changed: &mut Changed) {
        let mut old = None;
        if let Some(was) = self.filed.remove(&name) {
            let group = self.items.entry(was.clone()).or_default();
            old = group.remove(&name).map(|o| (was.clone(), o));
            if group.is_empty() {
                self.items.remove(&was);
            }
        }
        let same = matches!((&old, &key), (Some((w, obj)), Some(k)) if w == k && obj == o);
        if let Some((was, _)) = old
            && !same
        {
            changed.insert(was);
        }
        if let Some(k) = key {
            self.filed.insert(name.clone(), k.clone());
            self.items
                .entry(k.clone())
                .or_default()
                .insert(name, o.clone());
            if !same {
                changed.insert(k);
            }
        }
    }

    /// The objects filed under `key`.
    pub(crate) fn of<'a>(&'a self, key: &ServiceKey) -> impl Iterator<Item = &'a K> + use<'a, K> {
        self.items.get(key).into_iter().flat_map(BTreeMap::values)
    }
}
