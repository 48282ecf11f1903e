//! The cap on mirrors per link. A remote cluster is untrusted: exporting 50,000 Services
//! must not fill the local cluster (its Service CIDR, its apiserver) with mirrors.
//! Keys that have a mirror always keep their slot, so the cap never deletes anything;
//! a key refused for lack of a slot is looked at again when a slot frees.

use parking_lot::Mutex;
use service_mirror_core::ServiceKey;
use std::collections::{BTreeSet, HashSet};

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
    held: HashSet<ServiceKey>,
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

    /// `key` has a mirror: it holds a slot whatever the count.
    pub(super) fn hold(&self, key: &ServiceKey) {
        let mut s = self.slots();
        if !s.held.contains(key) {
            s.held.insert(key.clone());
            s.refused.remove(key);
        }
    }

    /// After writing was paused (a follower, a rotated link syncing): slots are held
    /// by exactly the keys with a mirror now, not by those seen meanwhile.
    pub(super) fn reset_held(&self, with_mirror: impl IntoIterator<Item = ServiceKey>) {
        let mut s = self.slots();
        s.held = with_mirror.into_iter().collect();
        let Slots { held, refused } = &mut *s;
        refused.retain(|k| !held.contains(k));
    }

    /// May `key` create its mirror? Takes a free slot, or records the refusal.
    pub(super) fn admit(&self, key: &ServiceKey) -> Admission {
        let mut s = self.slots();
        if s.held.contains(key) || self.max.is_none_or(|max| s.held.len() < max) {
            s.held.insert(key.clone());
            s.refused.remove(key);
            return Admission::Admitted;
        }
        let first = s.refused.is_empty();
        s.refused.insert(key.clone());
        Admission::Refused { first }
    }

    /// `key` has no mirror and wants none: its slot (or refusal) goes. Returns the
    /// refused keys to look at again, as many as there are free slots; they stay
    /// refused until one of them is admitted.
    pub(super) fn release(&self, key: &ServiceKey) -> Vec<ServiceKey> {
        let mut s = self.slots();
        s.refused.remove(key);
        s.held.remove(key);
        let free = self
            .max
            .map_or(usize::MAX, |max| max.saturating_sub(s.held.len()));
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
        l.admit(&k("a"));
        assert!(!l.is_refused(&k("a")) && !l.is_refused(&k("b")));
        l.admit(&k("b"));
        assert!(l.is_refused(&k("b")));
        l.release(&k("a"));
        assert!(l.is_refused(&k("b")), "woken, still refused until admitted");
        assert_eq!(l.admit(&k("b")), Admission::Admitted);
        assert!(!l.is_refused(&k("b")));
    }

    #[test]
    fn admits_up_to_the_limit_then_refuses_and_reports_once() {
        let l = MirrorLimit::new(Some(2));
        assert_eq!(l.admit(&k("a")), Admission::Admitted);
        assert_eq!(l.admit(&k("a")), Admission::Admitted);
        assert_eq!(l.admit(&k("b")), Admission::Admitted);
        assert_eq!(l.admit(&k("c")), Admission::Refused { first: true });
        assert_eq!(l.admit(&k("d")), Admission::Refused { first: false });
        assert_eq!(l.admit(&k("c")), Admission::Refused { first: false });
        assert_eq!(l.refused(), 2);
    }

    #[test]
    fn a_freed_slot_wakes_the_first_refused_keys() {
        let l = MirrorLimit::new(Some(1));
        l.admit(&k("a"));
        l.admit(&k("d"));
        l.admit(&k("c"));
        assert_eq!(l.release(&k("a")), vec![k("c")]);
        // The woken key stays refused until it is admitted: no second first refusal.
        assert_eq!(l.admit(&k("x")), Admission::Admitted);
        assert_eq!(l.admit(&k("c")), Admission::Refused { first: false });
        assert_eq!(l.release(&k("x")), vec![k("c")]);
        assert_eq!(l.admit(&k("c")), Admission::Admitted);
        assert_eq!(l.refused(), 1);
        // A refused key that stops wanting a mirror leaves; a free slot wakes the next.
        assert_eq!(l.release(&k("c")), vec![k("d")]);
        assert_eq!(l.release(&k("d")), vec![]);
        assert_eq!(l.refused(), 0);
    }

    #[test]
    fn existing_mirrors_keep_their_slots_above_the_limit() {
        let l = MirrorLimit::new(Some(1));
        l.hold(&k("a"));
        l.hold(&k("b"));
        assert_eq!(l.admit(&k("b")), Admission::Admitted);
        assert_eq!(l.admit(&k("c")), Admission::Refused { first: true });
        // One slot freed of two held over a limit of one: still full, nobody woken.
        assert_eq!(l.release(&k("a")), vec![]);
        assert_eq!(l.admit(&k("c")), Admission::Refused { first: false });
        assert_eq!(l.release(&k("b")), vec![k("c")]);
        assert_eq!(l.admit(&k("c")), Admission::Admitted);
    }

    #[test]
    fn a_reset_forgets_slots_of_mirrors_gone_meanwhile() {
        let l = MirrorLimit::new(Some(2));
        l.hold(&k("a"));
        l.hold(&k("b"));
        l.hold(&k("c"));
        assert_eq!(l.admit(&k("d")), Admission::Refused { first: true });
        l.reset_held([k("b"), k("d")]);
        assert_eq!(l.refused(), 0);
        assert_eq!(l.admit(&k("a")), Admission::Refused { first: true });
        assert_eq!(l.admit(&k("d")), Admission::Admitted);
    }

    #[test]
    fn no_limit_admits_everything() {
        let l = MirrorLimit::new(None);
        for i in 0..1000 {
            assert_eq!(l.admit(&k(&i.to_string())), Admission::Admitted);
        }
        assert_eq!(l.refused(), 0);
    }
}
