//! What a link's reconcile remembers of a key from one pass to the next.

use super::*;

/// Per-key memory of the reconciles (each key is reconciled by one worker at a time).
#[derive(Default)]
pub(in crate::link_controller) struct Memory {
    /// Keys another writer keeps changing back.
    pub(in crate::link_controller) contention: Contention,
    /// Per headless key, the hostnames last reported refused (reported on change only).
    pub(in crate::link_controller) refused_hostnames: Mutex<HashMap<ServiceKey, Vec<String>>>,
    /// Keys whose slices wait for kcm's, with how many looks they have waited.
    pub(in crate::link_controller) mirroring_waits: Mutex<HashMap<ServiceKey, u32>>,
    /// Keys whose Endpoints were written ahead of their Service (see decide.rs), with
    /// the resourceVersion of the Endpoints that write replaced.
    pub(in crate::link_controller) endpoints_first: Mutex<HashMap<ServiceKey, Vec<String>>>,
    /// What was said about the keys' `service-mirror.io/export-to` (`export_to.rs`).
    pub(in crate::link_controller) export_to: super::export_to::ExportToMemory,
}

/// Forgets `key` in one of [`Memory`]'s per-key maps. A map a burst emptied gives its
/// slots back: a gateway move puts every key of the link in `endpoints_first` for one
/// pass, and the 10,000 keys of 10 links x 1,000 Services left about 0.7 MB of empty
/// slots for the links' lives (heaptrack, after the bench's gateway move).
pub(in crate::link_controller) fn forget<V>(map: &Mutex<HashMap<ServiceKey, V>>, key: &ServiceKey) {
    let mut map = map.lock();
    if map.remove(key).is_some() && map.is_empty() && map.capacity() > EMPTY_CAPACITY_KEPT {
        *map = HashMap::new();
    }
}

/// Slots an emptied map keeps (a few keys coming and going do not reallocate).
const EMPTY_CAPACITY_KEPT: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_emptied_after_a_burst_gives_its_slots_back_and_a_small_one_keeps_them() {
        let map: Mutex<HashMap<ServiceKey, u32>> = Mutex::default();
        let keys: Vec<ServiceKey> = (0..1_000)
            .map(|n| ServiceKey::new("ns", format!("s{n}")))
            .collect();
        map.lock().extend(keys.iter().map(|k| (k.clone(), 1)));
        for k in &keys[..999] {
            forget(&map, k);
        }
        assert!(map.lock().capacity() >= 1_000, "not empty yet: kept");
        forget(&map, &keys[999]);
        assert!(map.lock().capacity() <= EMPTY_CAPACITY_KEPT);
        // A key not there changes nothing; a few keys keep their slots when emptied.
        forget(&map, &keys[0]);
        map.lock().extend(keys[..3].iter().map(|k| (k.clone(), 1)));
        let kept = map.lock().capacity();
        keys[..3].iter().for_each(|k| forget(&map, k));
        assert_eq!(map.lock().capacity(), kept);
    }
}
