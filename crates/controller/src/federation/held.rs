//! A link's federation messages held while its write gate is closed.
//!
//! A link whose write Lease another writer holds (Linkerd's controller mid-migration)
//! writes nothing, and that includes its part of the federated Services: Linkerd's own
//! link controller updates `<svc>-federated` for that link meanwhile. So the link's
//! messages (its feed starting, members joining and leaving, lists, its gateway) are
//! held, in order, and applied once the gate opens: until then the federation keeps
//! the cluster's members as it last knew them (a cluster expected at start stays
//! pending, which keeps its stored entries), and a cluster never let through has no
//! member, so no federated Service is created on its account alone.
//!
//! Bounded while a link stays held for hours (its feed relists and its gateway is
//! reported again and again): within one feed generation's run at the end of the queue
//! (no message of another generation after it, so the generation verdicts are never
//! reordered), a member's join or leave replaces its earlier one, a gateway report its
//! earlier one, and a new list drops an earlier complete list (its start and end; the
//! joins in between stay, coalesced). Only the final state matters: held messages are
//! all applied at once before anything is planned. So a link holds at most about one
//! message per key and generation, plus a few.

use super::Msg;
use service_mirror_core::ServiceKey;
use std::collections::BTreeMap;

/// Messages held by cluster, in arrival order.
#[derive(Default)]
pub(super) struct Held {
    by_cluster: BTreeMap<String, Vec<Msg>>,
}

/// The cluster a message speaks for, if it is one link's.
fn cluster_of(msg: &Msg) -> Option<&str> {
    match msg {
        Msg::Feed { cluster, .. }
        | Msg::Left { cluster, .. }
        | Msg::Listing { cluster, .. }
        | Msg::Unknown { cluster, .. }
        | Msg::Listed { cluster, .. }
        | Msg::Gateway { cluster, .. } => Some(cluster),
        Msg::Member { link, .. } => Some(&link.cluster),
        _ => None,
    }
}

/// The feed generation a message belongs to.
fn generation_of(msg: &Msg) -> Option<super::Generation> {
    match msg {
        Msg::Feed { generation, .. }
        | Msg::Member { generation, .. }
        | Msg::Left { generation, .. }
        | Msg::Listing { generation, .. }
        | Msg::Unknown { generation, .. }
        | Msg::Listed { generation, .. }
        | Msg::Gateway { generation, .. } => Some(*generation),
        _ => None,
    }
}

/// What a later message of the same generation replaces, if anything.
#[derive(PartialEq)]
enum Slot {
    Member(ServiceKey),
    Gateway,
    /// The link stopped watching (`Msg::Unknown`): one says what two would.
    Unknown,
}

fn slot_of(msg: &Msg) -> Option<Slot> {
    match msg {
        Msg::Gateway { .. } => Some(Slot::Gateway),
        Msg::Unknown { .. } => Some(Slot::Unknown),
        _ => member_of(msg).map(|(_, key)| Slot::Member(key)),
    }
}

/// Adds `msg` to one cluster's held queue, coalescing within the trailing run of its
/// generation (see the module's note).
fn push(held: &mut Vec<Msg>, msg: Msg) {
    let Some(generation) = generation_of(&msg) else {
        held.push(msg);
        return;
    };
    // The trailing run of this generation: nothing after `run` is of another one.
    let run = held
        .iter()
        .rposition(|m| generation_of(m) != Some(generation))
        .map_or(0, |i| i + 1);
    if let Some(slot) = slot_of(&msg) {
        if let Some(i) = held[run..]
            .iter()
            .position(|m| slot_of(m).as_ref() == Some(&slot))
        {
            held.remove(run + i);
        }
    } else if matches!(msg, Msg::Listing { .. }) {
        // A new list replaces an earlier complete one (its start and its end).
        let start = held[run..]
            .iter()
            .position(|m| matches!(m, Msg::Listing { .. }))
            .map(|i| run + i);
        let end = start.and_then(|s| {
            held[s..]
                .iter()
                .position(|m| matches!(m, Msg::Listed { .. }))
                .map(|i| s + i)
        });
        if let (Some(start), Some(end)) = (start, end) {
            held.remove(end);
            held.remove(start);
        }
    }
    held.push(msg);
}

/// The member a join or leave is about, with its feed's generation.
fn member_of(msg: &Msg) -> Option<(super::Generation, ServiceKey)> {
    match msg {
        Msg::Member {
            generation,
            service,
            ..
        } => Some((*generation, ServiceKey::from_meta(&service.metadata)?)),
        Msg::Left {
            generation, key, ..
        } => Some((*generation, key.clone())),
        _ => None,
    }
}

impl Held {
    /// `msg` back if it applies now; held (`None`) if its link's gate is closed, or if
    /// earlier messages of its link are still held (order is kept).
    pub(super) fn admit(&mut self, msg: Msg, open: impl Fn(&str) -> bool) -> Option<Msg> {
        if let Msg::LinkRemoved { cluster } = &msg {
            self.by_cluster.remove(cluster);
            return Some(msg);
        }
        let Some(cluster) = cluster_of(&msg) else {
            return Some(msg);
        };
        if open(cluster) && !self.by_cluster.contains_key(cluster) {
            return Some(msg);
        }
        push(self.by_cluster.entry(cluster.to_string()).or_default(), msg);
        None
    }

    /// The held messages of the clusters whose gate is open now, in order.
    pub(super) fn release(&mut self, open: impl Fn(&str) -> bool) -> Vec<Msg> {
        let ready: Vec<String> = self
            .by_cluster
            .keys()
            .filter(|c| open(c))
            .cloned()
            .collect();
        ready
            .iter()
            .flat_map(|c| self.by_cluster.remove(c).unwrap_or_default())
            .collect()
    }

    /// The clusters with messages held (pending for the planning meanwhile).
    pub(super) fn clusters(&self) -> impl Iterator<Item = &String> {
        self.by_cluster.keys()
    }

    /// Whether anything is held.
    pub(super) fn any(&self) -> bool {
        !self.by_cluster.is_empty()
    }

    /// How many messages are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_cluster.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::federation::LinkIdentity;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::sync::Arc;

    fn member(cluster: &str, name: &str, generation: u64) -> Msg {
        Msg::Member {
            link: Arc::new(LinkIdentity {
                cluster: cluster.into(),
                created: None,
                domain: "cluster.local".into(),
                exclusions: Default::default(),
                link: None,
            }),
            generation,
            service: Box::new(Service {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some("shop".into()),
                    ..Default::default()
                },
                ..Default::default()
            }),
        }
    }

    fn what(msg: &Msg) -> String {
        match msg {
            Msg::Member {
                link,
                service,
                generation,
            } => format!(
                "join {}/{} g{generation}",
                link.cluster,
                service.metadata.name.clone().unwrap_or_default()
            ),
            Msg::Left {
                cluster,
                key,
                generation,
            } => format!("leave {cluster}/{} g{generation}", key.name),
            Msg::Listing {
                cluster,
                generation,
            } => format!("listing {cluster} g{generation}"),
            Msg::Listed {
                cluster,
                generation,
            } => format!("listed {cluster} g{generation}"),
            Msg::Gateway { generation, .. } => format!("gateway g{generation}"),
            Msg::Feed { generation, .. } => format!("feed g{generation}"),
            Msg::LinkRemoved { cluster } => format!("removed {cluster}"),
            _ => "other".into(),
        }
    }

    #[test]
    fn a_blocked_links_messages_wait_in_order_for_its_gate_and_others_pass() {
        let mut held = Held::default();
        let blocked = |c: &str| c != "east";
        let open = |_: &str| true;
        let listing = |c: &str| Msg::Listing {
            cluster: c.into(),
            generation: 1,
        };
        let listed = |c: &str| Msg::Listed {
            cluster: c.into(),
            generation: 1,
        };
        // east is blocked: nothing of it applies.
        assert!(held.admit(listing("east"), blocked).is_none());
        assert!(held.admit(member("east", "api", 1), blocked).is_none());
        // west is open: its messages apply at once.
        let west = held.admit(member("west", "api", 1), blocked);
        assert_eq!(west.as_ref().map(what).as_deref(), Some("join west/api g1"));
        // The same member again replaces its earlier join (bounded by the keys), across
        // a list of the same feed too (only the final state is applied).
        assert!(held.admit(member("east", "api", 1), blocked).is_none());
        assert!(held.admit(listed("east"), blocked).is_none());
        assert!(held.admit(member("east", "api", 1), blocked).is_none());
        assert_eq!(held.len(), 3);
        // Still blocked: nothing released.
        assert!(held.release(blocked).is_empty());
        // Opened: released in order; later messages of east apply directly.
        let out: Vec<String> = held.release(open).iter().map(what).collect();
        assert_eq!(
            out,
            ["listing east g1", "listed east g1", "join east/api g1"]
        );
        assert!(!held.any());
        assert!(held.admit(member("east", "web", 1), open).is_some());
        // Unlinked while held: dropped, and the removal itself applies.
        assert!(held.admit(member("east", "web", 1), blocked).is_none());
        let removed = held.admit(
            Msg::LinkRemoved {
                cluster: "east".into(),
            },
            blocked,
        );
        assert_eq!(removed.as_ref().map(what).as_deref(), Some("removed east"));
        assert!(!held.any());
    }

    fn feed(what: &str, generation: u64) -> Msg {
        let cluster = "east".to_string();
        match what {
            "listing" => Msg::Listing {
                cluster,
                generation,
            },
            "listed" => Msg::Listed {
                cluster,
                generation,
            },
            "gateway" => Msg::Gateway {
                cluster,
                generation,
                gateway: None,
            },
            "leave" => Msg::Left {
                cluster,
                generation,
                key: ServiceKey {
                    namespace: "shop".into(),
                    name: "api".into(),
                },
            },
            _ => Msg::Feed {
                cluster,
                generation,
            },
        }
    }

    #[test]
    fn a_link_held_for_hours_holds_about_one_message_per_key_however_often_it_relists() {
        let mut held = Held::default();
        let blocked = |_: &str| false;
        assert!(held.admit(feed("feed", 1), blocked).is_none());
        // 1,000 relists of two Services, each with a gateway report and a leave.
        for _ in 0..1000 {
            for m in [
                feed("listing", 1),
                member("east", "api", 1),
                member("east", "web", 1),
                feed("listed", 1),
                feed("gateway", 1),
                feed("leave", 1),
                member("east", "api", 1),
            ] {
                assert!(held.admit(m, blocked).is_none());
            }
        }
        let out: Vec<String> = held.release(|_| true).iter().map(what).collect();
        assert_eq!(
            out,
            [
                "feed g1",
                "listing east g1",
                "join east/web g1",
                "listed east g1",
                "gateway g1",
                "join east/api g1"
            ],
            "the last list and the last word on each key: the same final state"
        );
    }

    #[test]
    fn coalescing_never_moves_a_message_across_another_feed_generation() {
        let mut held = Held::default();
        let blocked = |_: &str| false;
        for m in [
            member("east", "api", 1),
            feed("gateway", 1),
            feed("feed", 2),
            feed("listing", 2),
            member("east", "api", 1),
            feed("gateway", 1),
            member("east", "api", 2),
            feed("listed", 2),
            member("east", "api", 2),
        ] {
            assert!(held.admit(m, blocked).is_none());
        }
        let out: Vec<String> = held.release(|_| true).iter().map(what).collect();
        assert_eq!(
            out,
            [
                "join east/api g1",
                "gateway g1",
                "feed g2",
                "listing east g2",
                "join east/api g1",
                "gateway g1",
                "listed east g2",
                "join east/api g2"
            ]
        );
    }
}
