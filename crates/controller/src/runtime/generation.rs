//! Feed generations: a link controller replaced (new selector, namespaces or
//! credentials) starts a new feed with a higher generation, and the old one runs on a
//! while (until the new one has synced). A consumer fed by both (federation, MCS) drops
//! what the old feed still sends, and takes the new feed as current at its first
//! complete list: before it, the new feed is a candidate (the manager stops it again if
//! it never syncs, and the current one goes on).
//!
//! [`Generations`] numbers the feeds; [`Verdicts`] is the consumer's side: per source
//! (a cluster), which generation is current and what a message of a generation is.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};

/// The number of a feed: higher is newer.
pub(crate) type Generation = u64;

/// Hands out feed generations, 1, 2, 3, … (0 is left for a feed that exists from the
/// start, e.g. the local cluster's own).
#[derive(Debug, Default)]
pub(crate) struct Generations(AtomicU64);

impl Generations {
    /// The next generation.
    pub(crate) fn next(&self) -> Generation {
        1 + self.0.fetch_add(1, Ordering::SeqCst)
    }
}

/// What a message of one feed is to its consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The current feed's: applied.
    Current,
    /// A newer feed's that has not completed its first list: kept aside until it does.
    Candidate,
    /// An older feed's, or one of a source since removed: dropped.
    Old,
}

/// Per source, the current feed generation, and whether the source was removed.
#[derive(Debug)]
pub(crate) struct Verdicts<C> {
    current: HashMap<C, (Generation, bool)>,
}

impl<C> Default for Verdicts<C> {
    fn default() -> Self {
        Self {
            current: HashMap::new(),
        }
    }
}

impl<C: Clone + Eq + Hash> Verdicts<C> {
    /// What a message of `source`'s feed `generation` is. A source's first feed, and
    /// the first after the source was removed, is current at once.
    pub(crate) fn verdict(&mut self, source: &C, generation: Generation) -> Verdict {
        match self.current.get(source) {
            Some((g, false)) if generation == *g => Verdict::Current,
            Some((g, false)) if generation > *g => Verdict::Candidate,
            Some((g, true)) if generation <= *g => Verdict::Old,
            None | Some((_, true)) => {
                self.current.insert(source.clone(), (generation, false));
                Verdict::Current
            }
            Some(_) => Verdict::Old,
        }
    }

    /// `source`'s feed `generation` completed a list: a candidate becomes current (the
    /// older feeds' messages are dropped from now on). The verdict before it.
    pub(crate) fn listed(&mut self, source: &C, generation: Generation) -> Verdict {
        let verdict = self.verdict(source, generation);
        if verdict == Verdict::Candidate {
            self.current.insert(source.clone(), (generation, false));
        }
        verdict
    }

    /// `source` was removed (its feed stopped): anything its feeds still send is old.
    pub(crate) fn removed(&mut self, source: &C) {
        if let Some((_, removed)) = self.current.get_mut(source) {
            *removed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Verdict::*;

    #[test]
    fn generations_count_from_one() {
        let g = Generations::default();
        assert_eq!([g.next(), g.next(), g.next()], [1, 2, 3]);
    }

    #[test]
    fn a_replaced_feeds_late_messages_are_dropped_once_the_new_one_listed() {
        let mut v = Verdicts::default();
        let east = "east".to_string();
        // (step, generation, listed?, verdict wanted)
        let steps: &[(&str, Generation, bool, Verdict)] = &[
            ("the first feed is current at once", 1, false, Current),
            ("its list", 1, true, Current),
            ("a replacing feed starts: a candidate", 2, false, Candidate),
            ("the old one still talks: still current", 1, false, Current),
            ("the new one lists: it takes over", 2, true, Candidate),
            ("now it is current", 2, false, Current),
            ("the old one's late message: dropped", 1, false, Old),
            ("its late list: dropped too", 1, true, Old),
        ];
        for (what, generation, listed, want) in steps {
            let got = match listed {
                true => v.listed(&east, *generation),
                false => v.verdict(&east, *generation),
            };
            assert_eq!(got, *want, "{what}");
        }
    }

    #[test]
    fn a_removed_sources_feeds_are_old_until_a_newer_one_starts() {
        let mut v = Verdicts::default();
        let east = "east".to_string();
        assert_eq!(v.verdict(&east, 3), Current);
        v.removed(&east);
        assert_eq!(v.verdict(&east, 3), Old, "the stopped feed's late message");
        assert_eq!(v.verdict(&east, 2), Old);
        assert_eq!(
            v.verdict(&east, 4),
            Current,
            "linked again: current at once"
        );
        // Other sources are not affected.
        assert_eq!(v.verdict(&"west".to_string(), 1), Current);
    }
}
