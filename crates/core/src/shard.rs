//! Links spread over replicas (`run --shard-links`): which write Leases a replica takes
//! and which it lets go, decided from one read of every write Lease and member Lease.
//!
//! Each replica holds a member Lease while it runs; `live` counts those renewed within
//! their duration (judged on the reader's clock, as write Leases are). With `L` links and
//! `R` live replicas a replica's share is `q = ceil(L / R)`:
//! - it takes free links (no Lease, released, or expired) while it holds fewer than `q`;
//!   a replica that died still counts as live until its member Lease expires, so its
//!   links (free once their Leases expire, at about the same time) wait at most that
//!   long for the others' shares to grow;
//! - it lets go of links above `q`, at most as many as the others have room for, so a
//!   link is released only when someone will take it.
//!
//! A replica prefers the links that rank it first by rendezvous hash (FNV-1a of replica
//! and link): replicas taking at once mostly reach for different links (a lost race is a
//! 409 on the Lease, harmless), and which links a replica gives up is stable.

use std::collections::BTreeMap;

/// Who holds a link's write Lease, as judged by this replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// This replica.
    Me,
    /// Another replica of ours, renewing it.
    Peer(String),
    /// A writer that is not ours (Linkerd's controller): the link is not ours to take.
    Foreign,
    /// Nobody: no Lease, released, or its holder stopped renewing.
    Free,
}

/// What one replica sees.
#[derive(Debug, Clone)]
pub struct ShardView<'a> {
    /// This replica's identity.
    pub me: &'a str,
    /// The holder of each link that needs a writer (every link the replicas run).
    pub links: &'a BTreeMap<String, Holder>,
    /// Live replicas, this one included (at least 1).
    pub live: usize,
}

/// The Leases to take and to let go, in the order to do it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardPlan {
    /// Free links to take.
    pub take: Vec<String>,
    /// Links held here to release (gate closed first, then holder `""`).
    pub release: Vec<String>,
}

/// A replica's share of `links` over `live` replicas: `ceil(links / live)`.
pub fn quota(links: usize, live: usize) -> usize {
    links.div_ceil(live.max(1))
}

/// FNV-1a of `replica`, a separator and `link`: the same on every replica and build.
pub fn rank(replica: &str, link: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in replica.bytes().chain([0xff]).chain(link.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The plan of one pass (see the module's note).
pub fn plan(view: &ShardView<'_>) -> ShardPlan {
    // Links held by a foreign writer are nobody's share.
    let shared: usize = view
        .links
        .values()
        .filter(|h| **h != Holder::Foreign)
        .count();
    let live = view.live.max(1);
    let q = quota(shared, live);
    let mut mine: Vec<&String> = Vec::new();
    let mut free: Vec<&String> = Vec::new();
    let mut peers: BTreeMap<&str, usize> = BTreeMap::new();
    for (link, holder) in view.links {
        match holder {
            Holder::Me => mine.push(link),
            Holder::Free => free.push(link),
            Holder::Peer(p) => *peers.entry(p.as_str()).or_default() += 1,
            Holder::Foreign => {}
        }
    }
    // The room of the others within their share: a live peer holding nothing has `q`;
    // a peer over its share (not yet released) leaves the others' room as it is.
    let others = live - 1;
    let idle_peers = others.saturating_sub(peers.len());
    let room = idle_peers * q + peers.values().map(|c| q.saturating_sub(*c)).sum::<usize>();
    let by_rank = |links: &mut Vec<&String>| {
        links.sort_by_key(|l| (rank(view.me, l), l.to_string()));
    };
    let mut out = ShardPlan::default();
    if mine.len() < q {
        by_rank(&mut free);
        out.take = free
            .iter()
            .take(q - mine.len())
            .map(|l| l.to_string())
            .collect();
    } else if mine.len() > q {
        by_rank(&mut mine);
        // Those that rank this replica last go first; only as many as others can take
        // beyond the free links they will take first.
        let room_left = room.saturating_sub(free.len());
        let n = (mine.len() - q).min(room_left);
        out.release = mine.iter().rev().take(n).map(|l| l.to_string()).collect();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn links(spec: &[(&str, Holder)]) -> BTreeMap<String, Holder> {
        spec.iter()
            .map(|(l, h)| (l.to_string(), h.clone()))
            .collect()
    }

    fn numbered(n: usize, holder: impl Fn(usize) -> Holder) -> BTreeMap<String, Holder> {
        (0..n).map(|i| (format!("c{i:02}"), holder(i))).collect()
    }

    fn count(plan: &ShardPlan) -> (usize, usize) {
        (plan.take.len(), plan.release.len())
    }

    #[test]
    fn quota_is_the_ceiling_of_links_over_live_replicas() {
        assert_eq!(quota(12, 3), 4);
        assert_eq!(quota(13, 3), 5);
        assert_eq!(quota(1, 3), 1);
        assert_eq!(quota(0, 3), 0);
        assert_eq!(quota(5, 0), 5, "no replica counted: this one");
    }

    #[test]
    fn rank_is_stable_and_depends_on_both_names() {
        assert_eq!(rank("a", "x"), rank("a", "x"));
        assert_ne!(rank("a", "x"), rank("b", "x"));
        assert_ne!(rank("a", "x"), rank("a", "y"));
        // The separator: ("ab", "c") is not ("a", "bc").
        assert_ne!(rank("ab", "c"), rank("a", "bc"));
        // FNV-1a of the empty pair with the separator byte, computed by hand once.
        assert_eq!(rank("", ""), 0xaf64_724c_8602_eb6e);
    }

    #[test]
    fn one_replica_takes_every_free_link() {
        let l = numbered(7, |_| Holder::Free);
        let p = plan(&ShardView {
            me: "r1",
            links: &l,
            live: 1,
        });
        assert_eq!(count(&p), (7, 0));
    }

    #[test]
    fn a_replica_takes_free_links_up_to_its_share() {
        // 12 links, 3 live replicas, nothing held: each takes 4.
        let l = numbered(12, |_| Holder::Free);
        for me in ["r1", "r2", "r3"] {
            let p = plan(&ShardView {
                me,
                links: &l,
                live: 3,
            });
            assert_eq!(count(&p), (4, 0), "{me}");
        }
    }

    #[test]
    fn replicas_prefer_different_links() {
        let l = numbered(12, |_| Holder::Free);
        let picks: Vec<BTreeSet<String>> = ["r1", "r2", "r3"]
            .iter()
            .map(|me| {
                plan(&ShardView {
                    me,
                    links: &l,
                    live: 3,
                })
                .take
                .into_iter()
                .collect()
            })
            .collect();
        let all: BTreeSet<&String> = picks.iter().flatten().collect();
        assert!(all.len() >= 8, "mostly disjoint first picks: {picks:?}");
    }

    #[test]
    fn a_replica_at_its_share_takes_nothing_while_others_have_room() {
        // r1 holds 4 of 12; r2 holds 4; 4 free; 3 live: r3 has room for them.
        let l = numbered(12, |i| match i {
            0..4 => Holder::Me,
            4..8 => Holder::Peer("r2".into()),
            _ => Holder::Free,
        });
        let p = plan(&ShardView {
            me: "r1",
            links: &l,
            live: 3,
        });
        assert_eq!(p, ShardPlan::default());
    }

    #[test]
    fn free_links_wait_for_a_replica_with_room() {
        // A replica died: its 4 links are free, but it counts as live (room 4) until
        // its member Lease expires: r1 and r2 at their share wait.
        let l = numbered(12, |i| match i {
            0..4 => Holder::Me,
            4..8 => Holder::Peer("r2".into()),
            _ => Holder::Free,
        });
        let p = plan(&ShardView {
            me: "r1",
            links: &l,
            live: 3,
        });
        assert_eq!(p, ShardPlan::default());
        // Its member Lease expired: 2 live, q = 6: r1 takes 2 (and r2 the other 2).
        let p = plan(&ShardView {
            me: "r1",
            links: &l,
            live: 2,
        });
        assert_eq!(count(&p), (2, 0));
        // Below its share, a replica takes what it has room for.
        let l = numbered(12, |i| match i {
            0..2 => Holder::Me,
            2..6 => Holder::Peer("r2".into()),
            _ => Holder::Free,
        });
        let p = plan(&ShardView {
            me: "r1",
            links: &l,
            live: 3,
        });
        assert_eq!(count(&p), (2, 0));
    }

    #[test]
    fn a_replica_over_its_share_releases_only_what_others_can_take() {
        // A new replica joined: r1 holds all 12, 3 live now: q = 4, others' room 8.
        let l = numbered(12, |_| Holder::Me);
        let p = plan(&ShardView {
            me: "r1",
            links: &l,
            live: 3,
        });
        assert_eq!(count(&p), (0, 8));
        // Released links rank r1 last: the ones it keeps rank it first.
        let kept: Vec<&String> = l.keys().filter(|k| !p.release.contains(k)).collect();
        let worst_kept = kept.iter().map(|k| rank("r1", k)).max().unwrap();
        assert!(p.release.iter().all(|k| rank("r1", k) >= worst_kept));
        // The others are full: nothing is released (it would stay unwritten).
        let l = numbered(12, |i| match i {
            0..6 => Holder::Me,
            6..9 => Holder::Peer("r2".into()),
            _ => Holder::Peer("r3".into()),
        });
        let p = plan(&ShardView {
            me: "r1",
            links: &l,
            live: 3,
        });
        assert_eq!(count(&p), (0, 2), "r2 and r3 have room for one each");
        let l = numbered(12, |i| match i {
            0..5 => Holder::Me,
            5..9 => Holder::Peer("r2".into()),
            9..12 => Holder::Peer("r3".into()),
            _ => unreachable!(),
        });
        let p = plan(&ShardView {
            me: "r1",
            links: &l,
            live: 3,
        });
        assert_eq!(count(&p), (0, 1));
        // Free links fill the others' room first: nothing released then.
        let l = numbered(12, |i| match i {
            0..6 => Holder::Me,
            6..10 => Holder::Peer("r2".into()),
            _ => Holder::Free,
        });
        let p = plan(&ShardView {
            me: "r1",
            links: &l,
            live: 3,
        });
        assert_eq!(count(&p), (0, 2), "room 4 (r3), 2 free: 2 released");
    }

    #[test]
    fn links_held_by_a_foreign_writer_are_nobodys_share() {
        // 4 of 10 foreign: 6 shared over 3 live, q = 2.
        let l = numbered(10, |i| if i < 4 { Holder::Foreign } else { Holder::Free });
        let p = plan(&ShardView {
            me: "r1",
            links: &l,
            live: 3,
        });
        assert_eq!(count(&p), (2, 0));
        assert!(p.take.iter().all(|k| k.as_str() >= "c04"));
    }

    #[test]
    fn balanced_replicas_do_nothing() {
        for live in 1..=4 {
            for n in 0..=13 {
                // Deal the links round-robin: every replica within one of another.
                let l = numbered(n, |i| match i % live {
                    0 => Holder::Me,
                    k => Holder::Peer(format!("r{k}")),
                });
                let p = plan(&ShardView {
                    me: "r0",
                    links: &l,
                    live,
                });
                assert_eq!(p, ShardPlan::default(), "{n} links over {live}");
            }
        }
    }

    #[test]
    fn dealt_by_their_own_plans_replicas_converge_within_the_bound() {
        // Replicas take turns planning on the shared truth until nothing changes; every
        // one ends within [q - 1, q + 1] and every link has a holder.
        for live in 1..=4usize {
            for n in [1usize, 5, 12, 13, 50] {
                let names: Vec<String> = (0..live).map(|i| format!("r{i}")).collect();
                let mut owner: BTreeMap<String, Option<usize>> =
                    (0..n).map(|i| (format!("c{i:02}"), None)).collect();
                let mut rounds = 0;
                loop {
                    rounds += 1;
                    assert!(rounds < 50, "{n} over {live}: no convergence");
                    let mut changed = false;
                    for (r, me) in names.iter().enumerate() {
                        let view: BTreeMap<String, Holder> = owner
                            .iter()
                            .map(|(l, o)| {
                                let h = match o {
                                    None => Holder::Free,
                                    Some(o) if *o == r => Holder::Me,
                                    Some(o) => Holder::Peer(names[*o].clone()),
                                };
                                (l.clone(), h)
                            })
                            .collect();
                        let p = plan(&ShardView {
                            me,
                            links: &view,
                            live,
                        });
                        for l in &p.release {
                            owner.insert(l.clone(), None);
                            changed = true;
                        }
                        for l in &p.take {
                            owner.insert(l.clone(), Some(r));
                            changed = true;
                        }
                    }
                    if !changed {
                        break;
                    }
                }
                let q = quota(n, live);
                assert!(owner.values().all(Option::is_some), "{n} over {live}");
                for r in 0..live {
                    let held = owner.values().filter(|o| **o == Some(r)).count();
                    assert!(held <= q + 1, "{n} over {live}: r{r} holds {held}");
                }
            }
        }
    }

    #[test]
    fn a_link_taken_is_free_and_a_link_released_was_mine() {
        let l = links(&[
            ("a", Holder::Me),
            ("b", Holder::Me),
            ("c", Holder::Me),
            ("d", Holder::Free),
            ("e", Holder::Peer("r2".into())),
        ]);
        for live in 1..=4 {
            let p = plan(&ShardView {
                me: "r1",
                links: &l,
                live,
            });
            assert!(p.take.iter().all(|k| l[k] == Holder::Free), "{p:?}");
            assert!(p.release.iter().all(|k| l[k] == Holder::Me), "{p:?}");
        }
    }
}
