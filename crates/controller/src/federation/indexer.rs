//! The federation's index task: applies every [`Msg`] to the shared index (as kubert's
//! `IndexNamespacedResource` apply / delete / reset) and adds the keys each change
//! concerns to the runtime's work queue, where the reconcile workers take them.
//!
//! It alone takes messages, so they apply in order; it opens the workers' gate once the
//! local members are listed, the link manager has said which clusters are linked and
//! our stored federated Services and slices are listed, and then (as on becoming
//! leader) queues every key: the world may have drifted while nobody planned.

use super::Msg;
use super::shared::Shared;
use super::watches::{Stored, key_of_service};
use crate::runtime::WorkQueue;
use parking_lot::Mutex;
use service_mirror_core::ServiceKey;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// A held link's gate is looked at this often (it opens within a write Lease pass, 1 s
/// at most, of its Lease being taken).
const HELD_RECHECK: Duration = Duration::from_millis(500);

pub(super) struct Indexer {
    pub(super) shared: Arc<Mutex<Shared>>,
    pub(super) stored: Stored,
    pub(super) queue: WorkQueue<ServiceKey>,
    /// The links' write gates.
    pub(super) gates: Option<crate::write_leases::WriteGates>,
    /// Both stores listed once.
    pub(super) services_listed: bool,
    pub(super) slices_listed: bool,
    /// The workers' gate: the index ready and both stores listed.
    pub(super) ready: watch::Sender<bool>,
}

impl Indexer {
    pub(super) fn new(
        shared: Arc<Mutex<Shared>>,
        stored: Stored,
        queue: WorkQueue<ServiceKey>,
        gates: Option<crate::write_leases::WriteGates>,
    ) -> Self {
        Self {
            shared,
            stored,
            queue,
            gates,
            services_listed: false,
            slices_listed: false,
            ready: watch::Sender::new(false),
        }
    }

    /// Whether `cluster`'s messages apply now: not while its link is kept out by its
    /// write Lease (another writer holds it, or, while we lead, it is not ours yet). A
    /// replica that is not the leader applies them all (it writes nothing, and its
    /// index must be whole when it becomes the leader). Always without write gates.
    fn gate_open(gates: &Option<crate::write_leases::WriteGates>, cluster: &str) -> bool {
        gates.as_ref().is_none_or(|g| !g.kept_out(cluster))
    }

    /// Applies `msg` now, or holds it while its link's write gate is closed.
    pub(super) fn admit(&mut self, msg: Msg) {
        let gates = self.gates.clone();
        let admitted = self
            .shared
            .lock()
            .held
            .admit(msg, |c| Self::gate_open(&gates, c));
        if let Some(msg) = admitted {
            self.apply(msg);
        }
    }

    /// Applies what was held for the links whose gate opened.
    fn release_held(&mut self) {
        let gates = self.gates.clone();
        // Released and applied under one guard: a held cluster counts as pending until
        // its held messages are all in the index, so no worker plans a key between the
        // release and the last of them (it would drop that cluster's entries, which
        // another writer still maintains, until its `Listed` came).
        let mut keys = Vec::new();
        {
            let mut shared = self.shared.lock();
            let released = shared.held.release(|c| Self::gate_open(&gates, c));
            if released.is_empty() {
                return;
            }
            for msg in released {
                match &msg {
                    Msg::StoreListed(true) => self.services_listed = true,
                    Msg::StoreListed(false) => self.slices_listed = true,
                    _ => {}
                }
                keys.extend(apply(&mut shared, &self.stored, msg));
            }
        }
        for key in keys {
            self.queue.add(key);
        }
        // The released clusters are no longer kept as pending: every key looks again.
        self.queue_all();
    }

    pub(super) async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Msg>,
        cancel: CancellationToken,
    ) {
        loop {
            let held = self.shared.lock().held.any();
            let msg = tokio::select! {
                _ = cancel.cancelled() => return,
                msg = rx.recv() => msg.map(Some),
                _ = tokio::time::sleep(HELD_RECHECK), if held => Some(None),
            };
            self.release_held();
            match msg {
                None => return,
                Some(None) => {}
                Some(Some(msg)) => self.admit(msg),
            }
            self.open_when_ready();
        }
    }

    /// Opens the workers' gate the first time the index and the stores are ready, and
    /// queues every key then.
    pub(super) fn open_when_ready(&mut self) {
        if *self.ready.borrow() || !self.services_listed || !self.slices_listed {
            return;
        }
        if !self.shared.lock().index.ready() {
            return;
        }
        self.ready.send_replace(true);
        self.queue_all();
    }

    fn queue_all(&self) {
        let keys = all_keys(&self.shared.lock(), &self.stored);
        for key in keys {
            self.queue.add(key);
        }
    }

    /// Applies one message to the index; queues the keys it concerns.
    fn apply(&mut self, msg: Msg) {
        match &msg {
            Msg::StoreListed(true) => self.services_listed = true,
            Msg::StoreListed(false) => self.slices_listed = true,
            _ => {}
        }
        let keys = apply(&mut self.shared.lock(), &self.stored, msg);
        for key in keys {
            self.queue.add(key);
        }
    }
}

/// Every key with a member or a stored federated Service.
fn all_keys(shared: &Shared, stored: &Stored) -> Vec<ServiceKey> {
    let mut keys = shared.index.keys();
    keys.extend(
        stored
            .services
            .state()
            .iter()
            .filter_map(|s| key_of_service(s)),
    );
    keys
}

/// What `msg` changes in the index, and the keys to plan again.
fn apply(s: &mut Shared, stored: &Stored, msg: Msg) -> Vec<ServiceKey> {
    match msg {
        Msg::Feed {
            cluster,
            generation,
        } => {
            s.index.feed_started(&cluster, generation);
            Vec::new()
        }
        Msg::Member {
            link,
            generation,
            service,
        } => s.index.remote_member(&link, generation, *service),
        Msg::Left {
            cluster,
            generation,
            key,
        } => s.index.remote_left(&cluster, generation, &key),
        Msg::Listing {
            cluster,
            generation,
        } => s.index.listing(&cluster, generation),
        Msg::Unknown {
            cluster,
            generation,
        } => s.index.unknown(&cluster, generation),
        // Once a cluster is no longer pending, our stored Services naming it are
        // planned again too (the index knows only keys with a member).
        Msg::Listed {
            cluster,
            generation,
        } => {
            let was_pending = s.index.pending().contains(&cluster);
            match s.index.listed(&cluster, generation) {
                Some(mut keys) if was_pending => {
                    keys.extend(all_keys(s, stored));
                    keys
                }
                Some(keys) => keys,
                None => Vec::new(),
            }
        }
        Msg::Gateway {
            cluster,
            generation,
            gateway,
        } => s.index.gateway(&cluster, generation, gateway),
        // A new book starts empty: every key is recorded in it again.
        Msg::StatusBook { cluster, book } => {
            s.books.insert(cluster.clone(), book);
            for clusters in s.entries.values_mut() {
                clusters.remove(&cluster);
            }
            all_keys(s, stored)
        }
        Msg::LinkRemoved { cluster } => {
            s.books.remove(&cluster);
            let mut keys = s.index.link_removed(&cluster);
            keys.extend(all_keys(s, stored));
            keys
        }
        Msg::Expect { clusters } => s.index.expect(clusters),
        Msg::Local { key, service } => s.index.local_member(key, service.map(|s| *s)),
        Msg::LocalListing => {
            s.index.local_listing();
            Vec::new()
        }
        Msg::LocalListed => s.index.local_listed(),
        Msg::LocalSlice { key, event } => match s.local_slices.apply(&key, *event) {
            true => vec![key],
            false => Vec::new(),
        },
        Msg::Stored(key) => vec![key],
        Msg::StoreListed(_) => all_keys(s, stored),
        // The next leader plans every key (the workers' gate holds them meanwhile).
        Msg::Leader(true) => all_keys(s, stored),
        Msg::Leader(false) => Vec::new(),
        Msg::Foreign { key, present } => match present {
            true => {
                if let Some((p, _)) = s.blocked.get_mut(&key) {
                    *p = true;
                }
                Vec::new()
            }
            // Gone (or ours now): planned again, the create may go ahead.
            false => {
                s.unblock(&key);
                vec![key]
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::Backoff;
    use crate::runtime::queue::queued;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::runtime::reflector::{self, store::Writer};
    use kube::runtime::watcher;
    use service_mirror_core::labels::LOCAL_DISCOVERY_ANNOTATION;

    fn key(name: &str) -> ServiceKey {
        ServiceKey::new("shop", name)
    }

    fn local(name: &str) -> Msg {
        Msg::Local {
            key: key(name),
            service: Some(Box::new(Service {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some("shop".into()),
                    ..Default::default()
                },
                ..Default::default()
            })),
        }
    }

    /// An index task over empty stores (the writer adds stored Services).
    fn indexer() -> (Indexer, Writer<Service>) {
        let (services, writer) = reflector::store::<Service>();
        let (slices, _) = reflector::store();
        let queue = WorkQueue::new(Backoff::default(), CancellationToken::new());
        let stored = Stored { services, slices };
        (Indexer::new(Arc::default(), stored, queue, None), writer)
    }

    /// Feeds `msgs` as the run loop does.
    fn feed(ix: &mut Indexer, msgs: impl IntoIterator<Item = Msg>) {
        for msg in msgs {
            ix.admit(msg);
            ix.open_when_ready();
        }
    }

    fn ready() -> Vec<Msg> {
        vec![
            Msg::LocalListing,
            Msg::LocalListed,
            Msg::Expect {
                clusters: Vec::new(),
            },
            Msg::StoreListed(true),
            Msg::StoreListed(false),
        ]
    }

    #[tokio::test]
    async fn the_workers_gate_opens_once_locals_links_and_both_stores_are_listed() {
        let (mut ix, _) = indexer();
        let mut msgs = ready().into_iter();
        for msg in msgs.by_ref().take(4) {
            feed(&mut ix, [msg]);
            assert!(!*ix.ready.borrow(), "not everything listed yet");
        }
        feed(&mut ix, msgs);
        assert!(*ix.ready.borrow());
    }

    #[tokio::test]
    async fn a_key_changed_before_the_gate_opens_waits_in_the_queue_and_is_queued_again_then() {
        let (mut ix, _) = indexer();
        let mut ready = ready().into_iter();
        feed(&mut ix, ready.by_ref().take(1).chain([local("web")]));
        assert_eq!(queued(&ix.queue).await, ["shop/web"]);
        assert!(!*ix.ready.borrow());
        feed(&mut ix, ready);
        assert_eq!(
            queued(&ix.queue).await,
            ["shop/web"],
            "every key when it opens"
        );
        feed(
            &mut ix,
            [local("api"), local("api"), Msg::Stored(key("db"))],
        );
        assert_eq!(
            queued(&ix.queue).await,
            ["shop/api", "shop/db"],
            "deduplicated"
        );
    }

    #[tokio::test]
    async fn becoming_leader_queues_every_key_with_a_member_or_a_stored_service() {
        let (mut ix, mut writer) = indexer();
        feed(&mut ix, ready().into_iter().chain([local("web")]));
        let _ = queued(&ix.queue).await;
        // A stored federated Service of a key without members (it is to be deleted).
        let stored = Service {
            metadata: ObjectMeta {
                name: Some("old-federated".into()),
                namespace: Some("shop".into()),
                annotations: Some([(LOCAL_DISCOVERY_ANNOTATION.into(), "old".into())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        writer.apply_watcher_event(&watcher::Event::Apply(stored));
        feed(&mut ix, [Msg::Leader(false)]);
        assert!(
            queued(&ix.queue).await.is_empty(),
            "losing the lead plans nothing"
        );
        feed(&mut ix, [Msg::Leader(true)]);
        assert_eq!(queued(&ix.queue).await, ["shop/old", "shop/web"]);
    }

    #[tokio::test]
    async fn a_foreign_service_gone_unblocks_its_key_stops_its_watch_and_queues_it() {
        let (mut ix, _) = indexer();
        let watch = CancellationToken::new();
        ix.shared
            .lock()
            .blocked
            .insert(key("web"), (false, watch.clone()));
        feed(
            &mut ix,
            [Msg::Foreign {
                key: key("web"),
                present: true,
            }],
        );
        assert!(
            queued(&ix.queue).await.is_empty(),
            "still there: nothing to try"
        );
        assert!(ix.shared.lock().blocked[&key("web")].0);
        feed(
            &mut ix,
            [Msg::Foreign {
                key: key("web"),
                present: false,
            }],
        );
        assert_eq!(queued(&ix.queue).await, ["shop/web"]);
        assert!(ix.shared.lock().blocked.is_empty());
        assert!(watch.is_cancelled());
    }
}
