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
//! Bounded by the link's keys: a member's later join or leave replaces its earlier one
//! of the same feed unless a list or a new feed came in between (order matters then).

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
        | Msg::Listed { cluster, .. }
        | Msg::Gateway { cluster, .. } => Some(cluster),
        Msg::Member { link, .. } => Some(&link.cluster),
        _ => None,
    }
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
        let held = self.by_cluster.entry(cluster.to_string()).or_default();
        if let Some(member) = member_of(&msg) {
            // Replace the same member's earlier join or leave, back to the last list
            // or feed start.
            let tail = held
                .iter()
                .rposition(|m| member_of(m).is_none())
                .map_or(0, |i| i + 1);
            if let Some(i) = held[tail..]
                .iter()
                .position(|m| member_of(m).as_ref() == Some(&member))
            {
                held.remove(tail + i);
            }
        }
        held.push(msg);
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
            Msg::Listing { cluster, .. } => format!("listing {cluster}"),
            Msg::Listed { cluster, .. } => format!("listed {cluster}"),
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
        // The same member again replaces its earlier join (bounded by the keys)...
        assert!(held.admit(member("east", "api", 1), blocked).is_none());
        assert!(held.admit(listed("east"), blocked).is_none());
        // ...but not across a list: order matters there.
        assert!(held.admit(member("east", "api", 1), blocked).is_none());
        assert_eq!(held.len(), 4);
        // Still blocked: nothing released.
        assert!(held.release(blocked).is_empty());
        // Opened: released in order; later messages of east apply directly.
        let out: Vec<String> = held.release(open).iter().map(what).collect();
        assert_eq!(
            out,
            [
                "listing east",
                "join east/api g1",
                "listed east",
                "join east/api g1"
            ]
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
}
