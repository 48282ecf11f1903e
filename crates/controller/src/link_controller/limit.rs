//! The cap on mirrors per link. A remote cluster is untrusted: exporting 50,000 Services
//! must not fill the local cluster (its Service CIDR, its apiserver) with mirrors.
//! Keys that have a mirror always keep their slot, so the cap never deletes anything;
//! a key refused for lack of a slot is looked at again when a slot frees.

use parking_lot::Mutex;
use service_mirror_core::{DesiredMirror, ServiceKey};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

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
    /// take one: every one costs a Service and a ClusterIP). A key with a mirror is the
    /// link index's shared copy ([`MirrorLimit::hold`]): an entry is then 16 bytes of
    /// slot, where a copy of its own was about 110 bytes of each mirror (heaptrack at
    /// 10 links x 1,000 Services). A key admitted before its mirror exists has its own
    /// copy until its mirror's event holds it.
    held: HashMap<Arc<ServiceKey>, usize>,
    /// The sum of `held`.
    total: usize,
    /// Ordered, so keys are admitted again in a stable order as slots free.
    refused: BTreeSet<ServiceKey>,
    /// Headless keys with mirrors whose new endpoint mirrors are refused (see
    /// [`MirrorLimit::admit_members`]); a local event's `hold` does not end this.
    partial: BTreeSet<ServiceKey>,
}

/// What [`MirrorLimit::admit_members`] decided for a key that has mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Members {
    /// Every wanted Service fits: the key holds that many slots.
    All,
    /// Only `allowed` Services (at least those it holds) fit; `first` is true for the
    /// key's first such refusal since it last fitted.
    Part { allowed: usize, first: bool },
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
        let had = match (count, self.held.get_mut(key)) {
            (0, _) => self.held.remove(key),
            (n, Some(held)) => Some(std::mem::replace(held, n)),
            (n, None) => self.held.insert(Arc::new(key.clone()), n),
        };
        self.total = self.total - had.unwrap_or_default() + count;
    }

    /// Sets the slots of `key` (at least 1), held by the shared copy `key`.
    fn set_shared(&mut self, key: Arc<ServiceKey>, count: usize) {
        // The map keeps the key it has on an insert: the copy of its own goes first.
        let had = self.held.remove(&*key);
        self.held.insert(key, count);
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

    /// `key` (the link index's shared copy) has `count` mirror Services, at least 1:
    /// it holds that many slots whatever the count.
    pub(super) fn hold(&self, key: Arc<ServiceKey>, count: usize) {
        let mut s = self.slots();
        s.refused.remove(&*key);
        s.set_shared(key, count.max(1));
    }

    /// After writing was paused (a follower, a rotated link syncing): slots are held
    /// by exactly the keys with a mirror now (with their Service counts), not by those
    /// seen meanwhile.
    pub(super) fn reset_held(
        &self,
        with_mirror: impl IntoIterator<Item = (Arc<ServiceKey>, usize)>,
    ) {
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

    /// May `key`, which holds slots (a headless mirror exists), have `wanted` Services?
    /// Unlike [`MirrorLimit::admit`], not all or nothing: its existing mirrors keep
    /// being written, only new ones beyond the limit are refused (the key stays refused,
    /// so a freed slot wakes it). `None`: the key holds no slot, see `admit`.
    pub(super) fn admit_members(&self, key: &ServiceKey, wanted: usize) -> Option<Members> {
        let mut s = self.slots();
        let had = s.held.get(key).copied().filter(|h| *h > 0)?;
        let free = self
            .max
            .map_or(usize::MAX, |max| max.saturating_sub(s.total - had));
        if wanted <= free.max(had) {
            s.set(key, wanted.max(1));
            s.refused.remove(key);
            s.partial.remove(key);
            return Some(Members::All);
        }
        let allowed = free.max(had);
        s.set(key, allowed);
        s.refused.insert(key.clone());
        let first = s.partial.insert(key.clone());
        Some(Members::Part { allowed, first })
    }

    /// `key` has no mirror and wants none: its slots (or refusal) go. Returns the
    /// refused keys to look at again, as many as there are free slots; they stay
    /// refused until one of them is admitted.
    pub(super) fn release(&self, key: &ServiceKey) -> Vec<ServiceKey> {
        let mut s = self.slots();
        s.refused.remove(key);
        s.partial.remove(key);
        s.set(key, 0);
        let free = self
            .max
            .map_or(usize::MAX, |max| max.saturating_sub(s.total));
        // Lazily, in key order, each key once: most releases at the limit free one slot
        // and need one key, not a copy of every refused key.
        s.refused.union(&s.partial).take(free).cloned().collect()
    }

    /// Whether `key` is refused for lack of a slot now (wholly, or its new endpoint
    /// mirrors).
    pub(super) fn is_refused(&self, key: &ServiceKey) -> bool {
        let s = self.slots();
        s.refused.contains(key) || s.partial.contains(key)
    }

    /// Exported keys currently refused for lack of a slot (wholly or in part).
    ///
    /// Called after every reconcile (the metric and the status), so it must not walk
    /// the refused set: at 49,000 refused keys (tests/scale.rs) a union count per call
    /// made the refusals quadratic, ~1.2e9 key comparisons. `partial` is the few
    /// partly admitted headless keys; only those outside `refused` add to its length.
    pub(super) fn refused(&self) -> usize {
        let s = self.slots();
        s.refused.len() + s.partial.iter().filter(|k| !s.refused.contains(*k)).count()
    }
}

/// The members a headless key partly admitted may have with `allowed` Services in all:
/// every one whose Service `exists` (they keep being updated), then new ones in name
/// order up to `allowed` with the parent. The same choice on every pass: no churn.
pub(super) fn admitted_members(
    members: Vec<DesiredMirror>,
    exists: impl Fn(&str) -> bool,
    allowed: usize,
) -> Vec<DesiredMirror> {
    let name = |d: &DesiredMirror| d.service.metadata.name.clone().unwrap_or_default();
    let (mut kept, mut new): (Vec<_>, Vec<_>) = members.into_iter().partition(|d| exists(&name(d)));
    new.sort_by_key(name);
    let room = allowed.saturating_sub(1 + kept.len());
    kept.extend(new.into_iter().take(room));
    kept.sort_by_key(name);
    kept
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
        l.hold(Arc::new(k("a")), 1);
        l.hold(Arc::new(k("b")), 1);
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
        l.hold(Arc::new(k("a")), 1);
        l.hold(Arc::new(k("b")), 1);
        l.hold(Arc::new(k("c")), 1);
        assert_eq!(l.admit(&k("d"), 1), Admission::Refused { first: true });
        l.reset_held([(Arc::new(k("b")), 1), (Arc::new(k("d")), 1)]);
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
        l.hold(Arc::new(k("web")), 1);
        assert_eq!(l.admit(&k("api"), 2), Admission::Admitted);
        // A release frees every slot of the key.
        assert_eq!(l.release(&k("db")), vec![]);
        assert_eq!(l.admit(&k("x"), 2), Admission::Admitted);
    }

    #[test]
    fn a_headless_key_with_mirrors_keeps_them_and_is_refused_only_its_new_ones() {
        let l = MirrorLimit::new(Some(5));
        assert_eq!(l.admit_members(&k("web"), 3), None, "no slot held: admit");
        l.hold(Arc::new(k("web")), 3);
        l.hold(Arc::new(k("db")), 1);
        // (wanted, decision, refused keys) in order: web grows past the limit, shrinks.
        let table = [
            (4, Members::All, 0),
            (
                9,
                Members::Part {
                    allowed: 4,
                    first: true,
                },
                1,
            ),
            (
                9,
                Members::Part {
                    allowed: 4,
                    first: false,
                },
                1,
            ),
            (4, Members::All, 0),
            (2, Members::All, 0),
            (
                7,
                Members::Part {
                    allowed: 4,
                    first: true,
                },
                1,
            ),
        ];
        for (i, (wanted, want, refused)) in table.into_iter().enumerate() {
            assert_eq!(l.admit_members(&k("web"), wanted), Some(want), "step {i}");
            assert_eq!(l.refused(), refused, "step {i}");
        }
        // A local event re-counting web's Services does not end the partial refusal.
        l.hold(Arc::new(k("web")), 4);
        assert!(l.is_refused(&k("web")));
        assert_eq!(l.refused(), 1);
        // db goes: its slot wakes web, which then fits.
        assert_eq!(l.release(&k("db")), vec![k("web")]);
        assert_eq!(l.admit_members(&k("web"), 5), Some(Members::All));
        assert!(!l.is_refused(&k("web")));
    }

    fn member(name: &str) -> DesiredMirror {
        let mut d = DesiredMirror {
            service: Default::default(),
            endpoints: Default::default(),
            has_endpoints: true,
            ownership: Default::default(),
        };
        d.service.metadata.name = Some(name.into());
        d
    }

    #[test]
    fn a_partly_admitted_set_keeps_every_existing_member_and_the_first_new_ones_by_name() {
        let names = |v: Vec<DesiredMirror>| -> Vec<String> {
            v.into_iter()
                .filter_map(|d| d.service.metadata.name)
                .collect()
        };
        let members = || ["e", "a", "d", "b", "c"].map(member).to_vec();
        let exists = |n: &str| n == "d" || n == "e";
        // (allowed with the parent, kept)
        let table: [(usize, &[&str]); 5] = [
            (0, &["d", "e"]),
            (3, &["d", "e"]),
            (4, &["a", "d", "e"]),
            (5, &["a", "b", "d", "e"]),
            (9, &["a", "b", "c", "d", "e"]),
        ];
        for (allowed, want) in table {
            assert_eq!(
                names(admitted_members(members(), exists, allowed)),
                want,
                "{allowed}"
            );
            let mut reversed = members();
            reversed.reverse();
            assert_eq!(
                names(admitted_members(reversed, exists, allowed)),
                want,
                "{allowed}: the order given does not matter"
            );
        }
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
