//! The federation's view of every member: remote members (from the link feeds), local
//! members (from the local watch), each member cluster's gateway, and which clusters
//! have not listed yet. Each change returns the `<namespace>/<svc>` keys to plan again.

use super::Generation;
use super::feed::LinkIdentity;
use crate::runtime::generation::{Verdict, Verdicts};
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use service_mirror_core::ResolvedGateway;
use service_mirror_core::ServiceKey;
use service_mirror_core::federated::Member;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Who a member belongs to: `None` is the local cluster.
type Cluster = Option<String>;

#[derive(Default)]
pub(super) struct Index {
    members: BTreeMap<ServiceKey, BTreeMap<Cluster, Member>>,
    /// The feed generation that last announced each remote member.
    member_generation: BTreeMap<(String, ServiceKey), Generation>,
    /// Each remote cluster's newest feed generation, and whether its link was removed
    /// since (then that generation's late messages are dropped too).
    generations: Verdicts<String>,
    /// The last gateway report of a cluster's candidate feed.
    candidate_gateways: BTreeMap<String, (Generation, Option<ResolvedGateway>)>,
    gateways: BTreeMap<String, ResolvedGateway>,
    /// Linked clusters whose membership is not known yet.
    pending: BTreeSet<String>,
    /// Where each remote cluster's refusals are reported (its Link).
    links: BTreeMap<String, ObjectReference>,
    /// Local members seen by the local list under way.
    local_listing: Option<BTreeSet<ServiceKey>>,
    /// The local members are listed (local first: nothing is planned before).
    pub(super) local_listed: bool,
    /// The link manager said which clusters are linked (nothing is planned before).
    pub(super) expected: bool,
}

impl Index {
    /// Every key with a member or a pending cluster that may hold one.
    pub(super) fn keys(&self) -> Vec<ServiceKey> {
        self.members.keys().cloned().collect()
    }

    fn keys_of(&self, cluster: &Cluster) -> Vec<ServiceKey> {
        self.members
            .iter()
            .filter(|(_, m)| m.contains_key(cluster))
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn insert(&mut self, key: ServiceKey, cluster: Cluster, member: Member) -> Vec<ServiceKey> {
        let slot = self.members.entry(key.clone()).or_default();
        match slot.get(&cluster) == Some(&member) {
            true => Vec::new(),
            false => {
                slot.insert(cluster, member);
                vec![key]
            }
        }
    }

    fn remove(&mut self, key: &ServiceKey, cluster: &Cluster) -> Vec<ServiceKey> {
        if let Some(c) = cluster {
            self.member_generation.remove(&(c.clone(), key.clone()));
        }
        let Some(slot) = self.members.get_mut(key) else {
            return Vec::new();
        };
        let removed = slot.remove(cluster).is_some();
        if slot.is_empty() {
            self.members.remove(key);
        }
        match removed {
            true => vec![key.clone()],
            false => Vec::new(),
        }
    }

    /// What a message of `cluster`'s feed `generation` is: the current feed's, a
    /// replacing feed's that has not completed its first list yet (a candidate: the
    /// manager stops it again if it never syncs, and the current one goes on), or an
    /// older feed's (dropped). A cluster's first feed, and the first after its link was
    /// removed, is current at once.
    fn verdict(&mut self, cluster: &str, generation: Generation) -> Verdict {
        self.generations.verdict(&cluster.to_owned(), generation)
    }

    /// A feed of `cluster` starts.
    pub(super) fn feed_started(&mut self, cluster: &str, generation: Generation) {
        self.verdict(cluster, generation);
    }

    /// A remote member joined or changed.
    pub(super) fn remote_member(
        &mut self,
        link: &Arc<LinkIdentity>,
        generation: Generation,
        svc: Service,
    ) -> Vec<ServiceKey> {
        let Some(key) = ServiceKey::from_meta(&svc.metadata) else {
            return Vec::new();
        };
        if self.verdict(&link.cluster, generation) == Verdict::Old {
            return Vec::new();
        }
        self.member_generation
            .insert((link.cluster.clone(), key.clone()), generation);
        if let Some(r) = &link.link {
            self.links.insert(link.cluster.clone(), r.clone());
        }
        let member = Member {
            cluster: Some(link.cluster.clone()),
            link_created: link.created,
            domain: link.domain.clone(),
            exclusions: link.exclusions.clone(),
            service: svc,
        };
        self.insert(key, Some(link.cluster.clone()), member)
    }

    /// A remote member left.
    pub(super) fn remote_left(
        &mut self,
        cluster: &str,
        generation: Generation,
        key: &ServiceKey,
    ) -> Vec<ServiceKey> {
        if self.verdict(cluster, generation) == Verdict::Old {
            return Vec::new();
        }
        self.remove(key, &Some(cluster.to_owned()))
    }

    /// A link (re)lists its remote Services: its membership is unknown until `listed`.
    pub(super) fn listing(&mut self, cluster: &str, generation: Generation) -> Vec<ServiceKey> {
        // A candidate's list does not make the cluster pending: the current feed's
        // membership stands until the candidate's list is complete.
        if self.verdict(cluster, generation) == Verdict::Current {
            self.pending.insert(cluster.to_owned());
        }
        Vec::new()
    }

    /// A link stopped watching for a while (cold standby, `Msg::Unknown`). The current
    /// feed's word: the cluster's members are forgotten and it is pending until a feed
    /// of it lists, as at a start, so the stored entries naming it are kept (not
    /// planned from what it last said). A candidate's (a replacing feed that has not
    /// listed): only what it announced itself goes; the current feed, still running,
    /// speaks for the cluster.
    pub(super) fn unknown(&mut self, cluster: &str, generation: Generation) -> Vec<ServiceKey> {
        let c = Some(cluster.to_owned());
        match self.verdict(cluster, generation) {
            Verdict::Old => Vec::new(),
            Verdict::Candidate => {
                let own: Vec<ServiceKey> = self
                    .member_generation
                    .iter()
                    .filter(|((m, _), g)| m == cluster && **g == generation)
                    .map(|((_, k), _)| k.clone())
                    .collect();
                own.iter().flat_map(|k| self.remove(k, &c)).collect()
            }
            Verdict::Current => {
                let keys = self.keys_of(&c);
                for k in &keys {
                    self.remove(k, &c);
                }
                self.pending.insert(cluster.to_owned());
                keys
            }
        }
    }

    /// A link's list is complete (the leaves it implied came before): the cluster's
    /// members announced only by older feeds leave (the list replaces them). A
    /// candidate's first complete list makes it the current feed (its gateway applies
    /// from then on, the older feeds' messages are dropped). `None`: an old feed's.
    pub(super) fn listed(
        &mut self,
        cluster: &str,
        generation: Generation,
    ) -> Option<Vec<ServiceKey>> {
        let mut keys = Vec::new();
        match self.generations.listed(&cluster.to_owned(), generation) {
            Verdict::Old => return None,
            Verdict::Current => {}
            Verdict::Candidate => {
                if let Some((g, gw)) = self.candidate_gateways.remove(cluster)
                    && g == generation
                {
                    keys.extend(self.gateway(cluster, generation, gw));
                }
            }
        }
        let older: Vec<ServiceKey> = self
            .member_generation
            .iter()
            .filter(|((c, _), g)| c == cluster && **g < generation)
            .map(|((_, k), _)| k.clone())
            .collect();
        let c = Some(cluster.to_owned());
        keys.extend(older.iter().flat_map(|k| self.remove(k, &c)));
        if self.pending.remove(cluster) {
            keys.extend(self.keys());
            keys.sort();
            keys.dedup();
        }
        Some(keys)
    }

    /// The link manager's first list: these clusters are linked, pending until listed.
    pub(super) fn expect(&mut self, clusters: Vec<String>) -> Vec<ServiceKey> {
        self.pending.extend(clusters);
        self.expected = true;
        self.keys()
    }

    /// A link's gateway changed.
    pub(super) fn gateway(
        &mut self,
        cluster: &str,
        generation: Generation,
        gw: Option<ResolvedGateway>,
    ) -> Vec<ServiceKey> {
        match self.verdict(cluster, generation) {
            Verdict::Old => return Vec::new(),
            // Kept for when it becomes current (its reporter sends only changes).
            Verdict::Candidate => {
                self.candidate_gateways
                    .insert(cluster.to_owned(), (generation, gw));
                return Vec::new();
            }
            Verdict::Current => {}
        }
        let changed = match gw {
            Some(gw) => self.gateways.insert(cluster.to_owned(), gw.clone()) != Some(gw),
            None => self.gateways.remove(cluster).is_some(),
        };
        match changed {
            true => self.keys_of(&Some(cluster.to_owned())),
            false => Vec::new(),
        }
    }

    /// A link was removed: its members leave.
    pub(super) fn link_removed(&mut self, cluster: &str) -> Vec<ServiceKey> {
        let c = Some(cluster.to_owned());
        let keys = self.keys_of(&c);
        for k in &keys {
            self.remove(k, &c);
        }
        self.gateways.remove(cluster);
        self.candidate_gateways.remove(cluster);
        self.links.remove(cluster);
        // The removed link's feed was stopped: anything it still sends is dropped.
        self.generations.removed(&cluster.to_owned());
        let was_pending = self.pending.remove(cluster);
        let mut keys = keys;
        if was_pending {
            // Its stored entries were kept while pending: every key looks again.
            keys.extend(self.keys());
            keys.sort();
            keys.dedup();
        }
        keys
    }

    /// A local member event: `Some(svc)` applied, `None` deleted.
    pub(super) fn local_member(
        &mut self,
        key: ServiceKey,
        svc: Option<Service>,
    ) -> Vec<ServiceKey> {
        if let Some(listing) = self.local_listing.as_mut() {
            listing.insert(key.clone());
        }
        match svc {
            Some(service) => {
                let member = Member {
                    cluster: None,
                    link_created: None,
                    domain: String::new(),
                    exclusions: Default::default(),
                    service,
                };
                self.insert(key, None, member)
            }
            None => self.remove(&key, &None),
        }
    }

    /// The local watch starts a list.
    pub(super) fn local_listing(&mut self) {
        self.local_listing = Some(BTreeSet::new());
    }

    /// The local list is complete: local members it did not show leave.
    pub(super) fn local_listed(&mut self) -> Vec<ServiceKey> {
        let seen = self.local_listing.take().unwrap_or_default();
        let gone: Vec<ServiceKey> = self
            .keys_of(&None)
            .into_iter()
            .filter(|k| !seen.contains(k))
            .collect();
        let mut changed = Vec::new();
        for k in gone {
            changed.extend(self.remove(&k, &None));
        }
        let first = !std::mem::replace(&mut self.local_listed, true);
        match first {
            true => self.keys(),
            false => changed,
        }
    }

    /// The members of `key`, for the pure core.
    pub(super) fn members(&self, key: &ServiceKey) -> Vec<Member> {
        self.members
            .get(key)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every member cluster's gateway.
    pub(super) fn gateways(&self) -> &BTreeMap<String, ResolvedGateway> {
        &self.gateways
    }

    /// Clusters not listed yet.
    pub(super) fn pending(&self) -> &BTreeSet<String> {
        &self.pending
    }

    /// Where refusals of `cluster`'s members are reported.
    pub(super) fn link_of(&self, cluster: &str) -> Option<&ObjectReference> {
        self.links.get(cluster)
    }

    /// Whether planning may start: the local members and the linked clusters known.
    pub(super) fn ready(&self) -> bool {
        self.local_listed && self.expected
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn svc(name: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn link(cluster: &str) -> Arc<LinkIdentity> {
        Arc::new(LinkIdentity {
            cluster: cluster.into(),
            created: None,
            domain: "cluster.local".into(),
            exclusions: Default::default(),
            link: None,
        })
    }

    fn key(name: &str) -> ServiceKey {
        ServiceKey::new("shop", name)
    }

    #[test]
    fn same_member_twice_changes_nothing() {
        let mut i = Index::default();
        assert_eq!(i.remote_member(&link("east"), 1, svc("web")), [key("web")]);
        assert!(i.remote_member(&link("east"), 1, svc("web")).is_empty());
        assert_eq!(i.members(&key("web")).len(), 1);
    }

    #[test]
    fn members_from_several_clusters_and_local_share_a_key() {
        let mut i = Index::default();
        i.remote_member(&link("east"), 1, svc("web"));
        i.remote_member(&link("north"), 1, svc("web"));
        i.local_member(key("web"), Some(svc("web")));
        assert_eq!(i.members(&key("web")).len(), 3);
        assert_eq!(i.remote_left("east", 1, &key("web")), [key("web")]);
        assert!(i.remote_left("east", 1, &key("web")).is_empty());
        assert_eq!(i.members(&key("web")).len(), 2);
    }

    #[test]
    fn gateway_change_queues_only_that_clusters_keys() {
        let mut i = Index::default();
        i.remote_member(&link("east"), 1, svc("web"));
        i.remote_member(&link("north"), 1, svc("api"));
        let gw = ResolvedGateway::new(["198.18.1.1".parse().unwrap()], 4143);
        assert_eq!(i.gateway("east", 1, Some(gw.clone())), [key("web")]);
        assert!(i.gateway("east", 1, Some(gw)).is_empty(), "unchanged");
        assert_eq!(i.gateway("east", 1, None), [key("web")]);
    }

    #[test]
    fn pending_until_listed_and_removed_links_leave() {
        let mut i = Index::default();
        assert!(!i.ready());
        i.expect(vec!["east".into()]);
        assert!(i.pending().contains("east"));
        i.local_listing();
        i.local_listed();
        assert!(i.ready());
        i.remote_member(&link("east"), 1, svc("web"));
        assert_eq!(i.listed("east", 1), Some(vec![key("web")]));
        assert!(i.pending().is_empty());
        i.listing("east", 1);
        assert!(i.pending().contains("east"), "a relist is pending again");
        assert_eq!(i.link_removed("east"), [key("web")]);
        assert!(i.members(&key("web")).is_empty() && i.pending().is_empty());
    }

    #[test]
    fn a_stopped_link_is_unknown_as_at_a_start_until_a_feed_of_it_lists() {
        let mut i = Index::default();
        i.remote_member(&link("east"), 1, svc("web"));
        i.remote_member(&link("north"), 2, svc("web"));
        assert_eq!(i.listed("east", 1), Some(vec![]));
        // East's run stops here: its member is forgotten, north's stays, east pending.
        assert_eq!(i.unknown("east", 1), [key("web")]);
        assert_eq!(i.members(&key("web")).len(), 1);
        assert!(i.pending().contains("east"));
        i.remote_member(&link("east"), 3, svc("api"));
        assert!(i.listed("east", 3).is_some());
        assert!(i.pending().is_empty(), "listed: known again");
        // A candidate stopped before its first list: only what it said goes; the
        // current feed still speaks for east.
        i.remote_member(&link("east"), 4, svc("db"));
        assert_eq!(i.unknown("east", 4), [key("db")]);
        assert!(i.pending().is_empty(), "the current feed runs on");
        assert_eq!(i.members(&key("api")).len(), 1, "its member stays");
        // The next run lists; an old feed's late word then changes nothing.
        i.remote_member(&link("east"), 4, svc("db"));
        i.listed("east", 4);
        assert!(i.unknown("east", 3).is_empty());
        assert!(i.members(&key("db")).len() == 1 && !i.pending().contains("east"));
    }

    #[test]
    fn local_list_removes_only_unseen_local_members() {
        let mut i = Index::default();
        i.local_listing();
        i.local_member(key("web"), Some(svc("web")));
        i.local_member(key("api"), Some(svc("api")));
        i.local_listed();
        i.remote_member(&link("east"), 1, svc("db"));
        i.local_listing();
        i.local_member(key("web"), Some(svc("web")));
        assert_eq!(i.local_listed(), [key("api")]);
        assert_eq!(i.members(&key("web")).len(), 1);
        assert_eq!(i.members(&key("db")).len(), 1, "remote members stay");
    }

    fn gw(ip: &str) -> ResolvedGateway {
        ResolvedGateway::new([ip.parse().unwrap()], 4143)
    }

    #[test]
    fn an_old_feeds_late_gateway_and_member_reports_are_dropped_once_a_newer_one_listed() {
        let mut i = Index::default();
        i.feed_started("east", 1);
        i.remote_member(&link("east"), 1, svc("web"));
        i.gateway("east", 1, Some(gw("198.18.1.1")));
        // The replacing controller's feed (generation 2) lists and reports its gateway:
        // the current feed's stands until that list is complete.
        i.feed_started("east", 2);
        assert!(i.listing("east", 2).is_empty() && i.pending().is_empty());
        i.remote_member(&link("east"), 2, svc("web"));
        assert!(i.gateway("east", 2, Some(gw("198.18.2.2"))).is_empty());
        assert_eq!(i.gateways()["east"], gw("198.18.1.1"));
        assert_eq!(i.listed("east", 2), Some(vec![key("web")]));
        assert_eq!(i.gateways()["east"], gw("198.18.2.2"));
        // The old reporter sends last: ignored, the new gateway stays.
        assert!(i.gateway("east", 1, Some(gw("198.18.1.1"))).is_empty());
        assert!(i.gateway("east", 1, None).is_empty());
        assert_eq!(i.gateways()["east"], gw("198.18.2.2"));
        // Old member reports change nothing either.
        assert!(i.remote_member(&link("east"), 1, svc("api")).is_empty());
        assert!(i.remote_left("east", 1, &key("web")).is_empty());
        assert!(i.listing("east", 1).is_empty() && i.pending().is_empty());
        assert_eq!(i.listed("east", 1), None);
        assert!(i.members(&key("api")).is_empty());
        assert_eq!(i.members(&key("web")).len(), 1);
        // Other clusters are not affected by east's generations.
        assert_eq!(
            i.gateway("north", 1, Some(gw("198.18.3.3"))),
            Vec::<ServiceKey>::new()
        );
        assert!(i.gateways().contains_key("north"));
    }

    #[test]
    fn a_new_feeds_first_complete_list_replaces_the_clusters_older_members() {
        let mut i = Index::default();
        i.remote_member(&link("east"), 1, svc("web"));
        i.remote_member(&link("east"), 1, svc("api"));
        i.remote_member(&link("north"), 1, svc("web"));
        i.listed("east", 1);
        // Generation 2 lists: `api` again, `web` not. Until its list is complete,
        // nothing of generation 1 leaves.
        i.feed_started("east", 2);
        i.listing("east", 2);
        i.remote_member(&link("east"), 2, svc("api"));
        assert_eq!(
            i.members(&key("web")).len(),
            2,
            "kept until the list is done"
        );
        let keys = i.listed("east", 2).unwrap();
        assert!(keys.contains(&key("web")), "{keys:?}");
        assert!(i.pending().is_empty());
        let web = i.members(&key("web"));
        assert_eq!(web.len(), 1);
        assert_eq!(
            web[0].cluster.as_deref(),
            Some("north"),
            "other clusters stay"
        );
        assert_eq!(i.members(&key("api")).len(), 1, "re-announced: stays");
    }

    #[test]
    fn a_replacing_feed_that_never_lists_leaves_the_current_one_in_charge() {
        let mut i = Index::default();
        i.remote_member(&link("east"), 1, svc("web"));
        i.listed("east", 1);
        i.gateway("east", 1, Some(gw("198.18.1.1")));
        // The new controller never syncs (the manager stops it again).
        i.feed_started("east", 2);
        i.listing("east", 2);
        assert!(i.gateway("east", 2, None).is_empty());
        assert!(i.pending().is_empty(), "not pending for a candidate");
        // The old one goes on: its reports still count.
        let moved = gw("198.18.9.9");
        assert_eq!(i.gateway("east", 1, Some(moved.clone())), [key("web")]);
        assert_eq!(i.gateways()["east"], moved);
        assert_eq!(i.remote_left("east", 1, &key("web")), [key("web")]);
        assert!(i.listing("east", 1).is_empty());
        assert!(i.pending().contains("east"));
        assert_eq!(i.listed("east", 1), Some(vec![]));
    }

    #[test]
    fn a_removed_links_late_reports_are_dropped_and_a_new_link_starts_afresh() {
        let mut i = Index::default();
        i.remote_member(&link("east"), 1, svc("web"));
        i.link_removed("east");
        assert!(i.remote_member(&link("east"), 1, svc("web")).is_empty());
        assert!(i.gateway("east", 1, Some(gw("198.18.1.1"))).is_empty());
        assert!(i.members(&key("web")).is_empty() && i.gateways().is_empty());
        i.feed_started("east", 3);
        assert_eq!(i.remote_member(&link("east"), 3, svc("web")), [key("web")]);
    }
}
