//! Giving back the slots a burst left in a keyed table. A `HashMap` or `HashSet` keeps
//! its capacity when emptied: a link's first list queues every key, a gateway move puts
//! every key in a per-key map for one pass, and those slots would stay for the link's
//! life (about 100 bytes a mirror each, heap profiles at 10 links x 1,000 Services).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

/// Slots a table keeps however empty (a few keys coming and going do not reallocate).
pub(crate) const CAPACITY_KEPT: usize = 64;

/// A table whose slots can be given back.
pub(crate) trait Slots {
    fn len(&self) -> usize;
    fn capacity(&self) -> usize;
    fn shrink_to_fit(&mut self);
}

impl<K: Eq + Hash, V> Slots for HashMap<K, V> {
    fn len(&self) -> usize {
        HashMap::len(self)
    }
    fn capacity(&self) -> usize {
        HashMap::capacity(self)
    }
    fn shrink_to_fit(&mut self) {
        HashMap::shrink_to_fit(self)
    }
}

impl<K: Eq + Hash> Slots for HashSet<K> {
    fn len(&self) -> usize {
        HashSet::len(self)
    }
    fn capacity(&self) -> usize {
        HashSet::capacity(self)
    }
    fn shrink_to_fit(&mut self) {
        HashSet::shrink_to_fit(self)
    }
}

/// After a removal: a table over [`CAPACITY_KEPT`] slots and under an eighth full
/// shrinks to fit (not only once empty: one key left behind must not keep a burst's
/// slots). Amortized O(1): a table shrunk to fit is under an eighth full again only
/// after seven eighths of its keys are gone.
pub(crate) fn give_back(table: &mut impl Slots) {
    if table.capacity() > CAPACITY_KEPT && table.len() * 8 < table.capacity() {
        table.shrink_to_fit();
    }
}
