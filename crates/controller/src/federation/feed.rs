//! The link side of federation: what one link controller tells the federation about
//! its remote cluster's members and gateway.
//!
//! The feed keeps the set of member keys it has announced, so a Service that stops
//! matching the Link's `federatedServiceSelector` (or is deleted) is announced gone, and
//! members missing from a complete list leave only once that list is done (a relist or
//! an unreachable remote never empties a federated Service).

use super::Msg;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::runtime::watcher;
use parking_lot::Mutex;
use service_mirror_core::ResolvedGateway;
use service_mirror_core::{NamespaceFilter, ResourceStyle, Selector, ServiceKey};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::mpsc;

/// What a link knows about itself that its members carry.
#[derive(Debug, Clone)]
pub struct LinkIdentity {
    /// The link's cluster name.
    pub cluster: String,
    /// The Link's creation time (the oldest Link's member gives the metadata).
    pub created: Option<k8s_openapi::jiff::Timestamp>,
    /// The remote cluster's DNS domain.
    pub domain: String,
    /// The Link's label and annotation exclusions.
    pub exclusions: ResourceStyle,
    /// The Link, where refusals of its members are reported.
    pub link: Option<ObjectReference>,
}

/// One link's feed into the federation (cheap to clone; clones share the state).
#[derive(Clone)]
pub struct LinkFeed {
    pub(super) tx: mpsc::UnboundedSender<Msg>,
    pub(super) id: Arc<LinkIdentity>,
    /// This feed's generation (see [`super::Generation`]).
    pub(super) generation: super::Generation,
    pub(super) selector: Selector,
    /// The link's mirrored namespaces (`--namespace-allow/deny`): members outside are
    /// not members.
    pub(super) namespaces: NamespaceFilter,
    /// Keys announced as members, and those seen by the list under way.
    pub(super) state: Arc<Mutex<FeedState>>,
    /// Whether the link has a member: its gateway is probed and reported only then.
    pub(super) in_use: Arc<AtomicBool>,
    /// Longest hold of the `Left`s of an untrusted list (see [`LinkFeed::failed`]).
    pub(super) hold: std::time::Duration,
    /// `Some(this cluster's name, if known)`: a remote Service whose
    /// `service-mirror.io/export-to` does not reach this cluster is no member
    /// (`core::export_to::withheld`, as for the link's mirrors).
    pub(super) export_to: Option<Option<String>>,
}

impl std::fmt::Debug for LinkFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkFeed")
            .field("cluster", &self.id.cluster)
            .finish()
    }
}

#[derive(Default)]
pub(super) struct FeedState {
    announced: BTreeSet<ServiceKey>,
    listing: Option<BTreeSet<ServiceKey>>,
    /// The watch failed since the last complete list.
    outage_since_list: bool,
    /// An untrusted list whose `Left`s are held: its number and the members seen since
    /// it began (the cluster stays pending meanwhile).
    held: Option<(u64, BTreeSet<ServiceKey>)>,
    /// The number of the last hold (a timer ends only its own hold).
    holds: u64,
}

impl FeedState {
    /// The state a replacing feed of the same cluster starts from: the members
    /// announced, and whether a list since would follow an outage (a held list too).
    pub(super) fn successor(&self) -> FeedState {
        FeedState {
            announced: self.announced.clone(),
            outage_since_list: self.outage_since_list || self.held.is_some(),
            ..FeedState::default()
        }
    }

    /// Whether a member is announced.
    pub(super) fn has_announced(&self) -> bool {
        !self.announced.is_empty()
    }
}

impl LinkFeed {
    /// The link's cluster name.
    pub fn cluster(&self) -> &str {
        &self.id.cluster
    }

    /// Whether any remote Service of this link is a member now.
    pub fn has_members(&self) -> bool {
        self.in_use.load(Ordering::SeqCst)
    }

    fn send(&self, msg: Msg) {
        // The federation stopped: the process is shutting down.
        let _ = self.tx.send(msg);
    }

    fn member(&self, svc: &Service) -> Option<ServiceKey> {
        let key = ServiceKey::from_meta(&svc.metadata)?;
        let labels = svc.metadata.labels.as_ref();
        // A mirror (of a cluster the remote links) copies its remote's labels: never a
        // member, or federated Services would chain across clusters.
        let mirror = labels
            .is_some_and(|l| l.contains_key(service_mirror_core::labels::MIRRORED_SERVICE_LABEL));
        let allowed = self.namespaces.allows(&key.namespace);
        let reaches = self.export_to.as_ref().is_none_or(|local| {
            service_mirror_core::export_to::withheld(svc, local.as_deref()).is_none()
        });
        (allowed && !mirror && reaches && self.selector.matches(labels)).then_some(key)
    }

    /// Members are only the remote Services whose `service-mirror.io/export-to` reaches
    /// `local` (this cluster's name; `None`: unknown, so a narrowed Service reaches it
    /// not), as the link's mirrors are. A Service narrowed away leaves as one that no
    /// longer matches the selector does.
    pub fn honour_export_to(mut self, local: Option<String>) -> Self {
        self.export_to = Some(local);
        self
    }

    /// The link stops watching for a while (a standby replica that no longer holds its
    /// Lease, or not yet): its membership is unknown until its next complete list. The
    /// federation drops the members it last had of the cluster and counts it pending,
    /// so our stored objects naming it are kept as they are (as at a start), not
    /// planned from a snapshot that may be hours old; that next list is judged as one
    /// after an outage, and a hold of an untrusted list in progress ends unconfirmed
    /// (its timer no longer applies it).
    pub fn unknown(&self) {
        let mut state = self.state.lock();
        state.outage_since_list = true;
        state.listing = None;
        state.held = None;
        state.holds += 1;
        self.send(Msg::Unknown {
            cluster: self.id.cluster.clone(),
            generation: self.generation,
        });
    }

    /// The link's remote watch failed: the next complete list follows an outage.
    pub fn failed(&self) {
        self.state.lock().outage_since_list = true;
    }

    /// The longest hold of the `Left`s of a list after an outage that would empty the
    /// link's membership (the link's own hold of such a list: the grace, 5-30 s).
    pub fn hold_untrusted_lists_for(mut self, hold: std::time::Duration) -> Self {
        self.hold = hold;
        self
    }

    /// One event of the link's remote Service watch (objects as the link caches them:
    /// labels, annotations, ports and clusterIP kept).
    pub fn remote_event(&self, ev: &watcher::Event<Service>) {
        let mut state = self.state.lock();
        match ev {
            watcher::Event::Init => {
                state.listing = Some(BTreeSet::new());
                self.send(Msg::Listing {
                    cluster: self.id.cluster.clone(),
                    generation: self.generation,
                });
            }
            watcher::Event::InitApply(svc) => {
                if let Some(key) = self.member(svc) {
                    if let Some(listing) = state.listing.as_mut() {
                        listing.insert(key.clone());
                    }
                    if let Some((_, seen)) = state.held.as_mut() {
                        seen.insert(key.clone());
                    }
                    state.announced.insert(key);
                    self.send(self.joined(svc));
                }
            }
            watcher::Event::InitDone => {
                let seen = state.listing.take().unwrap_or_default();
                let after_outage = std::mem::take(&mut state.outage_since_list);
                // A second list confirms (or ends) a hold: it is trusted.
                let confirms = state.held.take().is_some();
                // After an outage, a list without any of the announced members is
                // not trusted (an apiserver back with its storage not restored,
                // cilium#47793): the members stay, the cluster pending, until the
                // hold ends or a second list confirms it.
                if !confirms
                    && service_mirror_core::relist_untrusted(
                        after_outage,
                        state.announced.len(),
                        seen.len(),
                    )
                {
                    state.holds += 1;
                    let number = state.holds;
                    state.held = Some((number, seen));
                    tracing::warn!(
                        cluster = %self.id.cluster,
                        members = state.announced.len(),
                        hold = ?self.hold,
                        "a list after an outage has none of the federated members: they are kept until the hold ends or a second list confirms it"
                    );
                    let feed = self.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(feed.hold).await;
                        feed.hold_ended(number);
                    });
                } else {
                    self.confirm(&mut state, seen);
                }
            }
            watcher::Event::Apply(svc) => match self.member(svc) {
                Some(key) => {
                    if let Some((_, seen)) = state.held.as_mut() {
                        seen.insert(key.clone());
                    }
                    state.announced.insert(key);
                    self.send(self.joined(svc));
                }
                None => {
                    if let Some(key) = ServiceKey::from_meta(&svc.metadata)
                        && state.announced.remove(&key)
                    {
                        self.send(self.left(key));
                    }
                }
            },
            watcher::Event::Delete(svc) => {
                if let Some(key) = ServiceKey::from_meta(&svc.metadata)
                    && state.announced.remove(&key)
                {
                    self.send(self.left(key));
                }
            }
        }
        self.in_use
            .store(!state.announced.is_empty(), Ordering::SeqCst);
    }

    /// A complete list `seen` is trusted: the announced members missing from it leave,
    /// and the cluster is listed.
    fn confirm(&self, state: &mut FeedState, seen: BTreeSet<ServiceKey>) {
        let gone: Vec<ServiceKey> = state.announced.difference(&seen).cloned().collect();
        for key in gone {
            self.send(self.left(key));
        }
        // Not `seen` itself: a member deleted during a hold stays gone.
        state.announced.retain(|k| seen.contains(k));
        self.send(Msg::Listed {
            cluster: self.id.cluster.clone(),
            generation: self.generation,
        });
    }

    /// The hold `number` ended without a second list: its list is trusted.
    fn hold_ended(&self, number: u64) {
        let mut state = self.state.lock();
        if state.held.as_ref().is_none_or(|(n, _)| *n != number) {
            return;
        }
        let (_, seen) = state.held.take().unwrap_or_default();
        self.confirm(&mut state, seen);
        self.in_use
            .store(!state.announced.is_empty(), Ordering::SeqCst);
    }

    /// The link's gateway as its gateway component resolved and probed it (`None`: no
    /// usable address).
    pub fn gateway(&self, gateway: Option<ResolvedGateway>) {
        self.send(Msg::Gateway {
            cluster: self.id.cluster.clone(),
            generation: self.generation,
            gateway,
        });
    }

    fn joined(&self, svc: &Service) -> Msg {
        Msg::Member {
            link: self.id.clone(),
            generation: self.generation,
            service: Box::new(svc.clone()),
        }
    }

    fn left(&self, key: ServiceKey) -> Msg {
        Msg::Left {
            cluster: self.id.cluster.clone(),
            generation: self.generation,
            key,
        }
    }
}

impl crate::gateway::report::GatewayListener for LinkFeed {
    fn in_use(&self) -> bool {
        self.has_members()
    }

    fn report(&self, gateway: Option<ResolvedGateway>) {
        self.gateway(gateway);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn feed() -> (LinkFeed, mpsc::UnboundedReceiver<Msg>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let selector = Selector::parse(Some(&LabelSelector {
            match_labels: Some([("mirror.linkerd.io/federated".into(), "member".into())].into()),
            match_expressions: None,
        }))
        .unwrap();
        let feed = LinkFeed {
            tx,
            id: Arc::new(LinkIdentity {
                cluster: "east".into(),
                created: None,
                domain: "cluster.local".into(),
                exclusions: Default::default(),
                link: None,
            }),
            generation: 1,
            selector,
            namespaces: NamespaceFilter {
                allow: vec![],
                deny: vec!["kube-system".into()],
            },
            state: Arc::default(),
            in_use: Arc::default(),
            hold: std::time::Duration::from_millis(200),
            export_to: None,
        };
        (feed, rx)
    }

    fn svc(ns: &str, name: &str, labels: &[(&str, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn member(name: &str) -> Service {
        svc("shop", name, &[("mirror.linkerd.io/federated", "member")])
    }

    /// The messages sent, as short strings.
    fn drain(rx: &mut mpsc::UnboundedReceiver<Msg>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(m) = rx.try_recv() {
            out.push(match m {
                Msg::Member { service, .. } => {
                    format!("join {}", service.metadata.name.unwrap_or_default())
                }
                Msg::Left { key, .. } => format!("leave {}", key.name),
                Msg::Listing { .. } => "listing".into(),
                Msg::Unknown { .. } => "unknown".into(),
                Msg::Listed { .. } => "listed".into(),
                Msg::Gateway { .. } => "gateway".into(),
                other => format!("{other:?}"),
            });
        }
        out
    }

    #[test]
    fn members_missing_from_a_complete_list_leave_only_when_it_is_done() {
        let (f, mut rx) = feed();
        f.remote_event(&watcher::Event::Init);
        f.remote_event(&watcher::Event::InitApply(member("web")));
        f.remote_event(&watcher::Event::InitApply(member("api")));
        f.remote_event(&watcher::Event::InitDone);
        assert_eq!(
            drain(&mut rx),
            ["listing", "join web", "join api", "listed"]
        );
        assert!(f.has_members());
        // A relist without `api`: it leaves at the end of the list, not before.
        f.remote_event(&watcher::Event::Init);
        f.remote_event(&watcher::Event::InitApply(member("web")));
        assert_eq!(drain(&mut rx), ["listing", "join web"]);
        f.remote_event(&watcher::Event::InitDone);
        assert_eq!(drain(&mut rx), ["leave api", "listed"]);
    }

    #[test]
    fn a_member_narrowed_away_by_export_to_leaves_and_one_narrowed_here_stays() {
        let narrowed = |name: &str, to: &str| {
            let mut s = member(name);
            s.metadata.annotations =
                Some([("service-mirror.io/export-to".to_string(), to.to_string())].into());
            s
        };
        let (f, mut rx) = feed();
        let f = f.honour_export_to(Some("west".into()));
        f.remote_event(&watcher::Event::Init);
        f.remote_event(&watcher::Event::InitApply(narrowed("web", "west")));
        f.remote_event(&watcher::Event::InitApply(narrowed("api", "east")));
        f.remote_event(&watcher::Event::InitApply(narrowed("db", "Bad_Name")));
        f.remote_event(&watcher::Event::InitDone);
        assert_eq!(drain(&mut rx), ["listing", "join web", "listed"]);
        // Narrowed away: it leaves.
        f.remote_event(&watcher::Event::Apply(narrowed("web", "east")));
        assert_eq!(drain(&mut rx), ["leave web"]);
        // No name here: a narrowed Service is no member; an unnarrowed one is.
        let (f, mut rx) = feed();
        let f = f.honour_export_to(None);
        f.remote_event(&watcher::Event::Init);
        f.remote_event(&watcher::Event::InitApply(narrowed("web", "west")));
        f.remote_event(&watcher::Event::InitApply(member("api")));
        f.remote_event(&watcher::Event::InitDone);
        assert_eq!(drain(&mut rx), ["listing", "join api", "listed"]);
    }

    fn list(f: &LinkFeed, members: &[&str]) {
        f.remote_event(&watcher::Event::Init);
        for m in members {
            f.remote_event(&watcher::Event::InitApply(member(m)));
        }
        f.remote_event(&watcher::Event::InitDone);
    }

    #[tokio::test]
    async fn an_empty_list_after_an_outage_keeps_the_members_until_confirmed_or_the_hold_ends() {
        let (f, mut rx) = feed();
        list(&f, &["web", "api"]);
        drain(&mut rx);
        // Back after an outage with an empty list: nobody leaves, the cluster stays
        // pending (no `listed`).
        f.failed();
        list(&f, &[]);
        assert_eq!(drain(&mut rx), ["listing"]);
        assert!(f.has_members());
        // A second list confirms it.
        list(&f, &[]);
        assert_eq!(
            drain(&mut rx),
            ["listing", "leave api", "leave web", "listed"]
        );
        assert!(!f.has_members());

        // The hold ends without a second list: the list is trusted then; a member
        // deleted during the hold stays gone, one that came back stays.
        list(&f, &["web", "api", "db"]);
        drain(&mut rx);
        f.failed();
        list(&f, &[]);
        f.remote_event(&watcher::Event::Apply(member("web")));
        f.remote_event(&watcher::Event::Delete(member("db")));
        assert_eq!(drain(&mut rx), ["listing", "join web", "leave db"]);
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        assert_eq!(drain(&mut rx), ["leave api", "listed"]);
        assert!(f.has_members());
        // Without an outage, an empty list is trusted at once.
        list(&f, &[]);
        assert_eq!(drain(&mut rx), ["listing", "leave web", "listed"]);
    }

    #[tokio::test]
    async fn a_stopped_link_ends_a_hold_unconfirmed_and_its_next_list_follows_an_outage() {
        let (f, mut rx) = feed();
        list(&f, &["web"]);
        drain(&mut rx);
        // An untrusted list is held; the link stops here before the hold ends: the
        // hold's timer applies nothing (no leave, no `listed` while stopped).
        f.failed();
        list(&f, &[]);
        f.unknown();
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        assert_eq!(drain(&mut rx), ["listing", "unknown"]);
        // The next run's empty list is held again (it follows an outage), its members
        // announced again when it has them.
        list(&f, &[]);
        assert_eq!(drain(&mut rx), ["listing"]);
        list(&f, &["web"]);
        assert_eq!(drain(&mut rx), ["listing", "join web", "listed"]);
    }

    #[test]
    fn losing_the_label_or_being_deleted_leaves_once() {
        let (f, mut rx) = feed();
        f.remote_event(&watcher::Event::Apply(member("web")));
        f.remote_event(&watcher::Event::Apply(svc("shop", "web", &[])));
        f.remote_event(&watcher::Event::Apply(svc("shop", "web", &[])));
        assert_eq!(drain(&mut rx), ["join web", "leave web"]);
        assert!(!f.has_members());
        f.remote_event(&watcher::Event::Apply(member("api")));
        f.remote_event(&watcher::Event::Delete(member("api")));
        f.remote_event(&watcher::Event::Delete(member("api")));
        assert_eq!(drain(&mut rx), ["join api", "leave api"]);
    }

    #[test]
    fn non_members_mirrors_and_unmirrored_namespaces_send_nothing() {
        let (f, mut rx) = feed();
        let table = [
            svc("shop", "plain", &[("app", "x")]),
            svc(
                "kube-system",
                "dns",
                &[("mirror.linkerd.io/federated", "member")],
            ),
            svc(
                "shop",
                "web-west",
                &[
                    ("mirror.linkerd.io/federated", "member"),
                    ("mirror.linkerd.io/mirrored-service", "true"),
                ],
            ),
            svc(
                "shop",
                "wrong-value",
                &[("mirror.linkerd.io/federated", "yes")],
            ),
        ];
        for s in table {
            f.remote_event(&watcher::Event::Apply(s.clone()));
            f.remote_event(&watcher::Event::Delete(s));
        }
        assert_eq!(drain(&mut rx), Vec::<String>::new());
        assert!(!f.has_members());
    }
}
