//! Which source links a cluster that several name (docs/operations.md, "A Link and a
//! Secret (or two of either) naming one cluster"; ClusterProfiles too): pure, over what
//! the manager read from its stores. The same lists give the same choice, so a restart
//! keeps it.

use super::manager::SourceKey;
use k8s_openapi::jiff::Timestamp;
use std::collections::HashSet;

/// A source object as the choice sees it.
#[derive(Debug, Clone)]
pub(super) struct Named {
    pub(super) key: SourceKey,
    /// Its `creationTimestamp` (none sorts first, as the apiserver always sets one).
    pub(super) created: Option<Timestamp>,
    /// The cluster it validly links; none when it does not parse.
    pub(super) cluster: Option<String>,
}

/// At the same instant: a Link, then a ClusterProfile, then a Secret. A Link is the
/// newer way to say what a Secret says and the one object made for this link alone; a
/// ClusterProfile is the inventory's, shared with other consumers.
fn kind_rank(key: &SourceKey) -> u8 {
    match key {
        SourceKey::Link(_) => 0,
        SourceKey::ClusterProfile(_) => 1,
        SourceKey::Secret(_) => 2,
    }
}

fn name(key: &SourceKey) -> &str {
    match key {
        SourceKey::Link(n) | SourceKey::Secret(n) | SourceKey::ClusterProfile(n) => n,
    }
}

/// Every source that validly links `cluster`, oldest first: creation time, then a Link,
/// a ClusterProfile, a Secret, then name. One whose remote cannot be reached now (`failing`) is
/// passed over, so it does not hold up the others.
pub(super) fn candidates(
    cluster: &str,
    sources: impl IntoIterator<Item = Named>,
    failing: &HashSet<SourceKey>,
) -> Vec<SourceKey> {
    let mut found: Vec<Named> = sources
        .into_iter()
        .filter(|s| s.cluster.as_deref() == Some(cluster) && !failing.contains(&s.key))
        .collect();
    found.sort_by(|a, b| {
        (a.created, kind_rank(&a.key), name(&a.key)).cmp(&(
            b.created,
            kind_rank(&b.key),
            name(&b.key),
        ))
    });
    found.into_iter().map(|s| s.key).collect()
}

/// The source that takes over when `gone` stops linking: the first candidate that is
/// not `gone` and runs no link of its own (a Secret renamed by creating the new one
/// before deleting the old, a Secret link replaced by a Link).
pub(super) fn successor(
    gone: &SourceKey,
    candidates: Vec<SourceKey>,
    active: &HashSet<SourceKey>,
) -> Option<SourceKey> {
    candidates
        .into_iter()
        .find(|k| k != gone && !active.contains(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Option<Timestamp> {
        Some(Timestamp::from_second(1_700_000_000 + secs).unwrap())
    }

    fn link(n: &str) -> SourceKey {
        SourceKey::Link(n.into())
    }

    fn secret(n: &str) -> SourceKey {
        SourceKey::Secret(n.into())
    }

    fn profile(n: &str) -> SourceKey {
        SourceKey::ClusterProfile(n.into())
    }

    fn named(key: SourceKey, created: Option<Timestamp>, cluster: Option<&str>) -> Named {
        Named {
            key,
            created,
            cluster: cluster.map(str::to_string),
        }
    }

    #[test]
    fn the_oldest_valid_source_of_the_cluster_comes_first_then_a_link_before_a_secret_then_by_name()
    {
        struct Case {
            what: &'static str,
            sources: Vec<Named>,
            failing: Vec<SourceKey>,
            want: Vec<SourceKey>,
        }
        let east = Some("east");
        let cases = [
            Case {
                what: "creation time first, whatever the kind",
                sources: vec![
                    named(link("l"), at(5), east),
                    named(secret("s"), at(1), east),
                ],
                failing: vec![],
                want: vec![secret("s"), link("l")],
            },
            Case {
                what: "the same instant: the Link first (as documented)",
                sources: vec![
                    named(secret("a"), at(1), east),
                    named(link("z"), at(1), east),
                ],
                failing: vec![],
                want: vec![link("z"), secret("a")],
            },
            Case {
                what: "the same instant: a Link, then a ClusterProfile, then a Secret",
                sources: vec![
                    named(secret("a"), at(1), east),
                    named(profile("b"), at(1), east),
                    named(link("c"), at(1), east),
                ],
                failing: vec![],
                want: vec![link("c"), profile("b"), secret("a")],
            },
            Case {
                what: "an older ClusterProfile before a newer Link",
                sources: vec![
                    named(link("l"), at(2), east),
                    named(profile("p"), at(1), east),
                ],
                failing: vec![],
                want: vec![profile("p"), link("l")],
            },
            Case {
                what: "the same instant and kind: by name",
                sources: vec![named(link("b"), at(1), east), named(link("a"), at(1), east)],
                failing: vec![],
                want: vec![link("a"), link("b")],
            },
            Case {
                what: "other clusters and sources that do not parse are not candidates",
                sources: vec![
                    named(link("west"), at(0), Some("west")),
                    named(link("broken"), at(0), None),
                    named(secret("s"), at(2), east),
                ],
                failing: vec![],
                want: vec![secret("s")],
            },
            Case {
                what: "a source whose remote cannot be reached is passed over",
                sources: vec![
                    named(link("old"), at(0), east),
                    named(link("new"), at(9), east),
                ],
                failing: vec![link("old")],
                want: vec![link("new")],
            },
            Case {
                what: "none",
                sources: vec![],
                failing: vec![],
                want: vec![],
            },
        ];
        for c in cases {
            let failing: HashSet<SourceKey> = c.failing.into_iter().collect();
            assert_eq!(
                candidates("east", c.sources, &failing),
                c.want,
                "{}",
                c.what
            );
        }
    }

    #[test]
    fn the_same_sources_in_any_order_give_the_same_choice() {
        let sources = vec![
            named(secret("s2"), at(3), Some("east")),
            named(link("l1"), at(3), Some("east")),
            named(secret("s1"), at(3), Some("east")),
            named(link("l0"), at(7), Some("east")),
        ];
        let want = vec![secret("s1"), secret("s2"), link("l0")];
        let want = [vec![link("l1")], want].concat();
        let mut reversed = sources.clone();
        reversed.reverse();
        let none = HashSet::new();
        assert_eq!(candidates("east", sources, &none), want);
        assert_eq!(candidates("east", reversed, &none), want);
    }

    #[test]
    fn the_successor_is_the_first_other_candidate_running_no_link() {
        let cands = vec![link("a"), secret("b"), secret("c")];
        let active: HashSet<SourceKey> = [secret("b")].into();
        assert_eq!(
            successor(&link("a"), cands.clone(), &active),
            Some(secret("c"))
        );
        assert_eq!(
            successor(&secret("c"), cands.clone(), &HashSet::new()),
            Some(link("a"))
        );
        assert_eq!(
            successor(&link("a"), vec![link("a")], &HashSet::new()),
            None
        );
    }
}
