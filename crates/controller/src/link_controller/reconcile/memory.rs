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

/// Forgets `key` in one of [`Memory`]'s per-key maps, giving back the slots a burst
/// left: a gateway move puts every key of the link in `endpoints_first` for one pass,
/// and after the bench's move at 10 links x 1,000 Services the emptied maps held 0.71
/// MB of slots for the links' lives (heaptrack).
pub(in crate::link_controller) fn forget<V>(map: &Mutex<HashMap<ServiceKey, V>>, key: &ServiceKey) {
    let mut map = map.lock();
    if map.remove(key).is_some() {
        crate::runtime::slots::give_back(&mut *map);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::slots::CAPACITY_KEPT;

    #[test]
    fn a_map_a_burst_left_mostly_empty_gives_its_slots_back_and_a_small_one_keeps_them() {
        let map: Mutex<HashMap<ServiceKey, u32>> = Mutex::default();
        let keys: Vec<ServiceKey> = (0..1_000)
            .map(|n| ServiceKey::new("ns", format!("s{n}")))
            .collect();
        map.lock().extend(keys.iter().map(|k| (k.clone(), 1)));
        for k in &keys[..700] {
            forget(&map, k);
        }
        assert!(map.lock().capacity() >= 1_000, "300 left: kept");
        // One key left behind (refused between its passes) does not hold the slots.
        for k in &keys[700..999] {
            forget(&map, k);
        }
        assert!(map.lock().capacity() <= CAPACITY_KEPT);
        forget(&map, &keys[999]);
        // A key not there changes nothing.
        forget(&map, &keys[0]);
        assert!(map.lock().is_empty());
        // A small map keeps its slots when emptied (its capacity counts the slots
        // usable before a rehash: the removed keys' tombstones take a few).
        let small: Mutex<HashMap<ServiceKey, u32>> = Mutex::new(HashMap::with_capacity(32));
        small
            .lock()
            .extend(keys[..3].iter().map(|k| (k.clone(), 1)));
        keys[..3].iter().for_each(|k| forget(&small, k));
        assert!(small.lock().capacity() >= 32, "{}", small.lock().capacity());
    }
}
