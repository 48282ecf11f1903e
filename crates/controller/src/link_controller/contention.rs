//! Another writer fighting over a mirror: detected, reported, and not fought over.
//!
//! A plan that updates a mirror towards the very state this controller last wrote for
//! it means someone changed the mirror since (a user's edit, or a second controller
//! linked to the same cluster: Linkerd's own mirror during a migration, a second
//! install). One such correction is ordinary drift. [`CORRECTIONS`] of them within
//! [`WINDOW`] is a write ping-pong (two controllers undo each other within a second of
//! each watch event; a slower one costs at most a write per window anyway): the key is then written at most once per backoff
//! ([`FIRST_HOLD`] doubling to [`MAX_HOLD`]) and the contention is reported once, so two
//! writers cost the apiserver a few writes an hour instead of one per watch event.
//! A change of the desired state (the remote moved) ends the episode.

use parking_lot::Mutex;
use service_mirror_core::ServiceKey;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Corrections within [`WINDOW`] that make a contention.
pub(super) const CORRECTIONS: usize = 3;
/// How far back corrections count.
pub(super) const WINDOW: Duration = Duration::from_secs(10);
/// The first hold of a contended key.
pub(super) const FIRST_HOLD: Duration = Duration::from_secs(30);
/// The longest hold.
pub(super) const MAX_HOLD: Duration = Duration::from_secs(600);

/// What to do with a planned update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Write it; `report`: a contention has just been found (say it once).
    Write {
        /// Report the contention now.
        report: bool,
    },
    /// Contended: look again after this long, writing nothing now.
    Hold(Duration),
}

/// A key corrected since its last new desired state.
#[derive(Debug, Default)]
struct Corrected {
    corrections: VecDeque<Instant>,
    holds: u32,
    hold_until: Option<Instant>,
    /// The contention was said (once per episode: a new desired state ends it).
    reported: crate::runtime::once::Episode,
}

/// The contention state of one link's keys.
#[derive(Debug, Default)]
pub(super) struct Contention {
    /// The fingerprint of the desired state last written, by the key's hash: 16 bytes
    /// an entry (keyed by the `ServiceKey` with every field of an episode, the map was
    /// 2.4 MB of the heap at 10,000 mirrors). Two keys of one hash would only make a
    /// plan of one look new to the other: written, never held.
    written: Mutex<HashMap<u64, u64>>,
    /// Keys corrected since their last new desired state (drift is rare: few entries).
    episodes: Mutex<HashMap<ServiceKey, Corrected>>,
    hasher: std::hash::RandomState,
}

impl Contention {
    fn hash(&self, key: &ServiceKey) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, key)
    }

    /// Before writing updates of `key` towards the desired state `fingerprint`.
    pub(super) fn check(&self, key: &ServiceKey, fingerprint: u64, now: Instant) -> Verdict {
        let last = self.written.lock().get(&self.hash(key)).copied();
        let mut episodes = self.episodes.lock();
        if last != Some(fingerprint) {
            // A new desired state: whatever happened before is over.
            episodes.remove(key);
            return Verdict::Write { report: false };
        }
        let s = episodes.entry(key.clone()).or_default();
        if let Some(until) = s.hold_until
            && now < until
        {
            return Verdict::Hold(until - now);
        }
        s.corrections.push_back(now);
        while s
            .corrections
            .front()
            .is_some_and(|t| now.duration_since(*t) > WINDOW)
        {
            s.corrections.pop_front();
        }
        if s.corrections.len() < CORRECTIONS && s.holds == 0 {
            return Verdict::Write { report: false };
        }
        let hold = FIRST_HOLD
            .saturating_mul(2u32.saturating_pow(s.holds))
            .min(MAX_HOLD);
        s.holds = s.holds.saturating_add(1);
        s.hold_until = Some(now + hold);
        let report = s.reported.start("MirrorContention");
        Verdict::Write { report }
    }

    /// The updates towards `fingerprint` were written.
    pub(super) fn written(&self, key: &ServiceKey, fingerprint: u64) {
        self.written.lock().insert(self.hash(key), fingerprint);
    }

    /// The key has no mirror any more.
    pub(super) fn forget(&self, key: &ServiceKey) {
        self.written.lock().remove(&self.hash(key));
        self.episodes.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ServiceKey {
        ServiceKey::new("shop", "web")
    }

    #[test]
    fn updates_towards_new_states_are_never_held() {
        let c = Contention::default();
        let t = Instant::now();
        for i in 0..20u64 {
            assert_eq!(c.check(&key(), i, t), Verdict::Write { report: false });
            c.written(&key(), i);
        }
    }

    #[test]
    fn a_single_drift_correction_is_written_at_once() {
        let c = Contention::default();
        let t = Instant::now();
        c.written(&key(), 7);
        assert_eq!(c.check(&key(), 7, t), Verdict::Write { report: false });
        assert_eq!(
            c.check(&key(), 7, t + Duration::from_secs(1)),
            Verdict::Write { report: false }
        );
    }

    #[test]
    fn repeated_corrections_are_reported_once_and_held_with_a_growing_backoff() {
        let c = Contention::default();
        let t = Instant::now();
        c.written(&key(), 7);
        let s = Duration::from_secs;
        assert!(s(2) < WINDOW);
        assert_eq!(c.check(&key(), 7, t), Verdict::Write { report: false });
        assert_eq!(
            c.check(&key(), 7, t + s(1)),
            Verdict::Write { report: false }
        );
        // The third within the window: written, reported, and the key held.
        assert_eq!(
            c.check(&key(), 7, t + s(2)),
            Verdict::Write { report: true }
        );
        assert_eq!(c.check(&key(), 7, t + s(3)), Verdict::Hold(s(29)));
        // After the hold: one write, not reported again, and a longer hold.
        assert_eq!(
            c.check(&key(), 7, t + s(32)),
            Verdict::Write { report: false }
        );
        assert_eq!(c.check(&key(), 7, t + s(33)), Verdict::Hold(s(59)));
        let mut at = t + s(92);
        let mut last = Duration::ZERO;
        for _ in 0..10 {
            assert_eq!(c.check(&key(), 7, at), Verdict::Write { report: false });
            let Verdict::Hold(h) = c.check(&key(), 7, at + s(1)) else {
                panic!("held");
            };
            assert!(h + s(1) <= MAX_HOLD && h >= last.min(MAX_HOLD - s(1)));
            last = h;
            at += h + s(1);
        }
        assert_eq!(last + s(1), MAX_HOLD, "the hold stops growing");
    }

    #[test]
    fn corrections_spread_wider_than_the_window_are_drift_not_contention() {
        let c = Contention::default();
        let t = Instant::now();
        c.written(&key(), 7);
        for i in 0..10 {
            let at = t + WINDOW.saturating_mul(i) / 2 + Duration::from_secs(i as u64);
            assert_eq!(
                c.check(&key(), 7, at),
                Verdict::Write { report: false },
                "{i}"
            );
        }
    }

    #[test]
    fn a_new_desired_state_ends_the_episode() {
        let c = Contention::default();
        let t = Instant::now();
        c.written(&key(), 7);
        for i in 0..3 {
            c.check(&key(), 7, t + Duration::from_secs(i));
        }
        assert!(matches!(
            c.check(&key(), 7, t + Duration::from_secs(4)),
            Verdict::Hold(_)
        ));
        assert_eq!(
            c.check(&key(), 8, t + Duration::from_secs(5)),
            Verdict::Write { report: false },
            "the remote changed: written at once"
        );
        c.written(&key(), 8);
        c.forget(&key());
        assert_eq!(c.check(&key(), 8, t), Verdict::Write { report: false });
    }
}
