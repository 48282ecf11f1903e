//! A keyed table fed by one watch that trusts a relist only once it completes, and an
//! empty one after an outage only on a second look.
//!
//! - A list in progress (between `Init` and `InitDone`) builds a new table beside the
//!   last complete one; readers see the last complete one until the new one completes
//!   (a relist that fails half way changes nothing).
//! - A complete list that would empty the table right after an outage may be what an
//!   apiserver that is recovering answers (cilium#47793): the owner may hold it
//!   ([`Relisted::hold_if_emptied`]); readers then keep the table as it was until
//!   [`Relisted::release`] (a second complete list, or the end of the hold:
//!   [`Holds`] numbers the holds and says when each ends).
//!
//! Rows: per key (a Service), entries by name (its EndpointSlices). Each change says
//! which keys readers see differently: by the entries, or by a [`View`] of them (only
//! whether one is ready, say) when readers see less.

use kube::runtime::watcher;
use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The entries of one key, by name: a vector kept sorted by name, as a key (a Service)
/// has one entry (EndpointSlice) in most clusters and a few at most in nearly all. A
/// `HashMap<String, V>` here cost its 48 bytes inline and, for one entry, an allocation
/// of four buckets and their control bytes (160 bytes with a `bool`): with the key and
/// the name, about 350 bytes a mirror on every Link-linked cluster (heap profile, 10
/// links x 1,000 Services). Equal entries compare equal whatever their arrival order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entries<V>(Vec<(Box<str>, V)>);

impl<V> Default for Entries<V> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<V> Entries<V> {
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| (**n).cmp(name))
    }

    /// The entry `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&V> {
        self.find(name).ok().map(|i| &self.0[i].1)
    }

    /// Sets the entry `name`.
    pub(crate) fn insert(&mut self, name: String, v: V) {
        match self.find(&name) {
            Ok(i) => self.0[i].1 = v,
            Err(i) => {
                // Exactly as many slots as entries while few: a first push would
                // allocate four.
                if self.0.len() < 4 {
                    self.0.reserve_exact(1);
                }
                self.0.insert(i, (name.into_boxed_str(), v))
            }
        }
    }

    /// Removes the entry `name`; whether there was one.
    pub(crate) fn remove(&mut self, name: &str) -> bool {
        match self.find(name) {
            Ok(i) => {
                self.0.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether there is no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries, by name.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }
}

/// What readers see of a key's entries, when less than all of them: a change that
/// leaves it alone is no change.
pub(crate) type View<V> = fn(Option<&Entries<V>>) -> bool;

/// One row of a watched object: its key, its name, and its entry (`None`: the object
/// keeps none, e.g. it no longer matches, so an earlier entry goes).
pub(crate) type Row<K, V> = (K, String, Option<V>);

/// The table.
#[derive(Debug)]
pub(crate) struct Relisted<K, V> {
    rows: HashMap<K, Entries<V>>,
    /// A list in progress.
    relisting: Option<HashMap<K, Entries<V>>>,
    /// What readers see while an empty list is held.
    held: Option<HashMap<K, Entries<V>>>,
    listed: bool,
    /// Keys whose view changed since [`Relisted::take_changed`].
    changed: Vec<K>,
    view: Option<View<V>>,
}

impl<K, V> Default for Relisted<K, V> {
    fn default() -> Self {
        Self {
            rows: HashMap::new(),
            relisting: None,
            held: None,
            listed: false,
            changed: Vec::new(),
            view: None,
        }
    }
}

impl<K: Clone + Eq + Hash + Ord, V: Clone + PartialEq> Relisted<K, V> {
    /// A table whose readers see only `view` of a key's entries.
    pub(crate) fn with_view(view: View<V>) -> Self {
        Self {
            view: Some(view),
            ..Self::default()
        }
    }

    fn differs(&self, a: Option<&Entries<V>>, b: Option<&Entries<V>>) -> bool {
        match self.view {
            Some(view) => view(a) != view(b),
            None => a != b,
        }
    }

    /// Whether a list has completed.
    pub(crate) fn listed(&self) -> bool {
        self.listed
    }

    /// The entries of `key` as readers see them (the held table during a hold).
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&Entries<V>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.held.as_ref().unwrap_or(&self.rows).get(key)
    }

    /// Applies one watch event, each object given as a row by `row` (`None`: no key).
    pub(crate) fn apply<T>(
        &mut self,
        ev: &watcher::Event<T>,
        row: impl Fn(&T) -> Option<Row<K, V>>,
    ) {
        match ev {
            watcher::Event::Apply(o) => match row(o) {
                Some((key, name, Some(v))) => self.upsert(key, name, v),
                Some((key, name, None)) => self.remove(&key, &name),
                None => {}
            },
            watcher::Event::Delete(o) => {
                if let Some((key, name, _)) = row(o) {
                    self.remove(&key, &name);
                }
            }
            watcher::Event::Init => self.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(o) => {
                if let Some((key, name, Some(v))) = row(o) {
                    self.relisting
                        .get_or_insert_with(HashMap::new)
                        .entry(key)
                        .or_default()
                        .insert(name, v);
                }
            }
            watcher::Event::InitDone => self.list_done(),
        }
    }

    /// Adds or replaces the entry `name` of `key`.
    pub(crate) fn upsert(&mut self, key: K, name: String, v: V) {
        let changed = match self.view {
            None => {
                let entries = self.rows.entry(key.clone()).or_default();
                // Compared before it moves in: an entry may be large (10,000 hostnames).
                let same = entries.get(&name) == Some(&v);
                if !same {
                    entries.insert(name, v);
                }
                !same
            }
            Some(view) => {
                let before = view(self.rows.get(&key));
                self.rows.entry(key.clone()).or_default().insert(name, v);
                before != view(self.rows.get(&key))
            }
        };
        if changed {
            self.changed.push(key);
        }
    }

    /// Removes the entry `name` of `key`, if any.
    pub(crate) fn remove(&mut self, key: &K, name: &str) {
        let before = self.view.map(|view| view(self.rows.get(key)));
        let Some(entries) = self.rows.get_mut(key) else {
            return;
        };
        let removed = entries.remove(name);
        if entries.is_empty() {
            self.rows.remove(key);
        }
        let changed = match (self.view, before) {
            (Some(view), Some(before)) => before != view(self.rows.get(key)),
            _ => removed,
        };
        if changed {
            self.changed.push(key.clone());
        }
    }

    /// A list completed: it replaces the table; the keys whose view changed are noted.
    fn list_done(&mut self) {
        let new = self.relisting.take().unwrap_or_default();
        let old = std::mem::replace(&mut self.rows, new);
        let changed = self.differences(&old);
        self.changed.extend(changed);
        self.listed = true;
    }

    /// The keys whose view differs between `old` and the table.
    fn differences(&self, old: &HashMap<K, Entries<V>>) -> Vec<K> {
        let keys: BTreeSet<&K> = old.keys().chain(self.rows.keys()).collect();
        keys.into_iter()
            .filter(|k| self.differs(old.get(*k), self.rows.get(*k)))
            .cloned()
            .collect()
    }

    /// Whether the list in progress, once complete, would empty a table that has
    /// something (or is held).
    pub(crate) fn would_empty(&self) -> bool {
        // A held table counts as kept: an empty list after a new outage holds again.
        self.relisting.as_ref().is_none_or(|r| r.is_empty())
            && (self.held.is_some() || !self.rows.is_empty())
    }

    /// Holds the table as readers see it now, until [`Relisted::release`] (a hold in
    /// force stays as it is).
    pub(crate) fn hold(&mut self) {
        if self.held.is_none() {
            self.held = Some(self.rows.clone());
        }
    }

    /// Called before the list in progress completes: holds the table if that list
    /// would empty it. False if there was nothing to keep.
    pub(crate) fn hold_if_emptied(&mut self) -> bool {
        let emptied = self.would_empty();
        if emptied {
            self.hold();
        }
        emptied
    }

    /// Ends a hold: the keys whose view changed.
    pub(crate) fn release(&mut self) -> Vec<K> {
        match self.held.take() {
            Some(old) => self.differences(&old),
            None => Vec::new(),
        }
    }

    /// The keys whose view changed since the last call.
    pub(crate) fn take_changed(&mut self) -> Vec<K> {
        std::mem::take(&mut self.changed)
    }
}

/// The holds of one watch's tables, numbered so that each hold's timer ends only its
/// own hold. Shared (atomics) by the watch's store, which decides at each complete list,
/// and its callback, which starts the timers.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    /// The watch failed since its last complete list.
    outage: AtomicBool,
    /// The hold in force (0: none).
    current: AtomicU64,
    /// The number of the last hold.
    last: AtomicU64,
    /// The hold whose timer runs.
    timed: AtomicU64,
}

/// What a complete list left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterList {
    /// No hold: the tables' holds end now.
    Release,
    /// Hold number `n` began: its timer starts now.
    Started(u64),
    /// A hold whose timer already runs.
    Running,
}

impl Holds {
    /// The watch failed: its next complete list follows an outage.
    pub(crate) fn failed(&self) {
        self.outage.store(true, Ordering::SeqCst);
    }

    /// A list completes (before the tables take it): after an outage, `hold` holds the
    /// tables it would empty and says whether it did; then a new hold is in force.
    /// Otherwise (or a second list with no outage since) the list is trusted.
    pub(crate) fn list_complete(&self, hold: impl FnOnce() -> bool) {
        let after_outage = self.outage.swap(false, Ordering::SeqCst);
        let n = match after_outage && hold() {
            true => 1 + self.last.fetch_add(1, Ordering::SeqCst),
            false => 0,
        };
        self.current.store(n, Ordering::SeqCst);
    }

    /// After the tables took a complete list: what to do about the holds.
    pub(crate) fn after_list(&self) -> AfterList {
        match self.current.load(Ordering::SeqCst) {
            0 => AfterList::Release,
            n if self.timed.swap(n, Ordering::SeqCst) != n => AfterList::Started(n),
            _ => AfterList::Running,
        }
    }

    /// Hold `n` ran out: true if it was still in force (the tables' holds end now).
    pub(crate) fn expire(&self, n: u64) -> bool {
        self.current
            .compare_exchange(n, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

#[cfg(test)]
#[path = "relist_tests.rs"]
mod tests;
