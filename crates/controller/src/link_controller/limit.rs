//! The cap on mirrors per link. A remote cluster is untrusted: exporting 50,000 Services
//! must not fill the local cluster (its Service CIDR, its apiserver) with mirrors.
//! Keys that have a mirror always keep their slot, so the cap never deletes anything;
//! a key refused for lack of a slot is looked at again when a slot frees.

use parking_lot::Mutex;
use service_mirror_core::ServiceKey;
use std::collections::{BTreeSet, HashMap};

/// What [`MirrorLimit::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admission {
    /// The key holds a slot: its mirror may be created.
    Admitted,
    /// No slot is free. `first` is true for the first refusal after none.
    Refused { first: bool },
}

#[derive(Debug, Default)]
struct Slots {
    /// Slots per key: one per mirror Service (a headless mirror's endpoint mirrors each
    /// take one: every one costs a Service and a ClusterIP).
    held: HashMap<ServiceKey, usize>,
    /// The sum of `held`.
    total: usize,
    /// Ordered, so keys are admitted again in a stable order as slots free.
    refused: BTreeSet<ServiceKey>,
}

/// Slots for mirrors of one link: at most `max` keys hold one, unless more already had
/// mirrors when the link controller started.
#[derive(Debug)]
pub(super) struct MirrorLimit {
    max: Option<usize>,
    slots: Mutex<Slots>,
}

impl Slots {
    /// Sets the slots of `key` (0: none).
    fn set(&mut self, key: &ServiceKey, count: usize) {
        let had = match count {
            0 => self.held.remove(key),
            n => self.held.insert(key.clone(), n),
        };
        self.total = self.total - had.unwrap_or_default() + count;
    }
}

impl MirrorLimit {
    /// A limit of `max` mirrors; `None` admits every key.
    pub(super) fn new(max: Option<usize>) -> Self {
        Self {
            max,
            slots: Mutex::default(),
        }
    }

    fn slots(&self) -> parking_lot::MutexGuard<'_, Slots> {
        self.slots.lock()
    }

    /// The limit, if any.
    pub(super) fn max(&self) -> Option<usize> {
        self.max
    }

    /// `key` has `count` mirror Services: it holds that many slots whatever the count.
    pub(super) fn hold(&self, key: &ServiceKey, count: usize) {
        let mut s = self.slots();
        s.set(key, count);
        s.refused.remove(key);
    }

    /// After writing was paused (a follower, a rotated link syncing): slots are held
    /// by exactly the keys with a mirror now (with their Service counts), not by those
    /// seen meanwhile.
    pub(super) fn reset_held(&self, with_mirror: impl IntoIterator<Item = (ServiceKey, usize)>) {
        let mut s = self.slots();
        s.held = with_mirror.into_iter().collect();
        s.total = s.held.values().sum();
        let Slots { held, refused, .. } = &mut *s;
        refused.retain(|k| !held.contains_key(k));
    }

    /// May `key` have `wanted` mirror Services (1, or a headless mirror with its
    /// endpoint mirrors)? Takes the slots, or records the refusal (all or nothing: a
    /// refused key keeps what it holds and writes nothing).
    pub(super) fn admit(&self, key: &ServiceKey, wanted: usize) -> Admission {
        let mut s = self.slots();
        let had = s.held.get(key).copied().unwrap_or_default();
        let fits = self.max.is_none_or(|max| s.total - had + wanted <= max);
        if (had > 0 && wanted <= had) || fits {
            s.set(key, wanted.max(1));
            s.refused.remove(key);
            return Admission::Admitted;
        }
        let first = s.refused.is_empty();
        s.refused.insert(key.clone());
        Admission::Refused { first }
    }

    /// `key` has no mirror and wants none: its slots (or refusal) go. Returns the
    /// refused keys to look at again, as many as there are free slots; they stay
    /// refused until one of them is admitted.
    pub(super) fn release(&self, key: &ServiceKey) -> Vec<ServiceKey> {
        let mut s = self.slots();
        s.refused.remove(key);
        s.set(key, 0);
        let free = self
            .max
            .map_or(usize::MAX, |max| max.saturating_sub(s.total));
        s.refused.iter().take(free).cloned().collect()
    }

    /// Whether `key` is refused for lack of a slot now.
    pub(super) fn is_refused(&self, key: &ServiceKey) -> bool {
        self.slots().refused.contains(key)
    }

    /// Exported keys currently refused for lack of a slot.
    pub(super) fn refused(&self) -> usize {
        self.slots().refused.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: &str) -> ServiceKey {
        ServiceKey::new("ns", n)
    }

    #[test]
    fn a_key_is_refused_from_its_refusal_until_its_admission_or_release() {
        let l = MirrorLimit::new(Some(1));
        l.admit(&k("a"), 1);
        assert!(!l.is_refused(&k("a")) && !l.is_refused(&k("b")));
        l.admit(&k("b"), 1);
        assert!(l.is_refused(&k("b")));
        l.release(&k("a"));
        assert!(l.is_refused(&k("b")), "woken, still refused until admitted");
        assert_eq!(l.admit(&k("b"), 1), Admission::Admitted);
        assert!(!l.is_refused(&k("b")));
    }

    #[test]
    fn admits_up_to_the_limit_then_refuses_and_reports_once() {
        let l = MirrorLimit::new(Some(2));
        assert_eq!(l.admit(&k("a"), 1), Admission::Admitted);
        assert_eq!(l.admit(&k("a"), 1), Admission::Admitted);
        assert_eq!(l.admit(&k("b"), 1), Admission::Admitted);
        assert_eq!(l.admit(&k("c"), 1), Admission::Refused { first: true });
        assert_eq!(l.admit(&k("d"), 1), Admission::Refused { first: false });
        assert_eq!(l.admit(&k("c"), 1), Admission::Refused { first: false });
        assert_eq!(l.refused(), 2);
    }

    #[test]
    fn a_freed_slot_wakes_the_first_refused_keys() {
        let l = MirrorLimit::new(Some(1));
        l.admit(&k("a"), 1);
        l.admit(&k("d"), 1);
        l.admit(&k("c"), 1);
        assert_eq!(l.release(&k("a")), vec![k("c")]);
        // The woken key stays refused until it is admitted: no second first refusal.
        assert_eq!(l.admit(&k("x"), 1), Admission::Admitted);
        assert_eq!(l.admit(&k("c"), 1), Admission::Refused { first: false });
        assert_eq!(l.release(&k("x")), vec![k("c")]);
        assert_eq!(l.admit(&k("c"), 1), Admission::Admitted);
        assert_eq!(l.refused(), 1);
        // A refused key that stops wanting a mirror leaves; a free slot wakes the next.
        assert_eq!(l.release(&k("c")), vec![k("d")]);
        assert_eq!(l.release(&k("d")), vec![]);
        assert_eq!(l.refused(), 0);
    }

    #[test]
    fn existing_mirrors_keep_their_slots_above_the_limit() {
        let l = MirrorLimit::new(Some(1));
        l.hold(&k("a"), 1);
        l.hold(&k("b"), 1);
        assert_eq!(l.admit(&k("b"), 1), Admission::Admitted);
        assert_eq!(l.admit(&k("c"), 1), Admission::Refused { first: true });
        // One slot freed of two held over a limit of one: still full, nobody woken.
        assert_eq!(l.release(&k("a")), vec![]);
        assert_eq!(l.admit(&k("c"), 1), Admission::Refused { first: false });
        assert_eq!(l.release(&k("b")), vec![k("c")]);
        assert_eq!(l.admit(&k("c"), 1), Admission::Admitted);
    }

    #[test]
    fn a_reset_forgets_slots_of_mirrors_gone_meanwhile() {
        let l = MirrorLimit::new(Some(2));
        l.hold(&k("a"), 1);
        l.hold(&k("b"), 1);
        l.hold(&k("c"), 1);
        assert_eq!(l.admit(&k("d"), 1), Admission::Refused { first: true });
        l.reset_held([(k("b"), 1), (k("d"), 1)]);
        assert_eq!(l.refused(), 0);
        assert_eq!(l.admit(&k("a"), 1), Admission::Refused { first: true });
        assert_eq!(l.admit(&k("d"), 1), Admission::Admitted);
    }

    #[test]
    fn a_headless_mirror_takes_one_slot_per_endpoint_mirror_all_or_nothing() {
        let l = MirrorLimit::new(Some(5));
        assert_eq!(
            l.admit(&k("web"), 3),
            Admission::Admitted,
            "parent + 2 pods"
        );
        assert_eq!(
            l.admit(&k("api"), 3),
            Admission::Refused { first: true },
            "3 + 3 > 5"
        );
        assert_eq!(l.admit(&k("db"), 2), Admission::Admitted);
        // web grows to 4 Services: over the limit, refused whole; it keeps its 3.
        assert_eq!(l.admit(&k("web"), 4), Admission::Refused { first: false });
        assert_eq!(l.admit(&k("web"), 3), Admission::Admitted);
        // web shrinks (the watch counts its Services): slots free for others.
        l.hold(&k("web"), 1);
        assert_eq!(l.admit(&k("api"), 2), Admission::Admitted);
        // A release frees every slot of the key.
        assert_eq!(l.release(&k("db")), vec![]);
        assert_eq!(l.admit(&k("x"), 2), Admission::Admitted);
    }

    #[test]
    fn no_limit_admits_everything() {
        let l = MirrorLimit::new(None);
        for i in 0..1000 {
            assert_eq!(l.admit(&k(&i.to_string()), 1), Admission::Admitted);
        }
        assert_eq!(l.refused(), 0);
    }
}
