//! Federated services: ONE process-wide component keeps every `<svc>-federated`
//! Service and its per-cluster EndpointSlices (see `service_mirror_core::federated`).
//!
//! Why one: a federated Service has members in several links, and Linkerd lets every
//! link's controller update it, so they fight with 409 conflicts and the last writer's
//! view wins. Here the link controllers only report (each through a [`LinkFeed`]: its
//! remote members, complete-list markers, its gateway's addresses and verdict), a
//! local watch reports the local members, and one component plans and writes, through
//! the federation's [`crate::writer::LocalWriter`], only while leader. It runs on the
//! runtime: an index task takes every [`Msg`] into the index and adds the keys it
//! changes to a `runtime::WorkQueue`; the runtime's workers run `reconcile(key)`, and a
//! failed write is retried with the queue's backoff.
//!
//! Files: `feed.rs` (the link side), `index.rs` (members, gateways, pending clusters),
//! `held.rs` (messages of a link kept out by its write Lease), `indexer.rs` (the index
//! task), `shared.rs` (what it shares with reconcile), `reconcile.rs` (plan, write),
//! `report.rs` (what is said once per episode), `watches.rs` (local members and our
//! stored federated objects), `metrics.rs`.

mod feed;
mod held;
mod index;
mod indexer;
mod local_slices;
pub(crate) mod metrics;
mod reconcile;
mod report;
mod shared;
mod watches;

pub use feed::{LinkFeed, LinkIdentity};

use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::writer::LocalWriter;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use service_mirror_core::ResolvedGateway;
use service_mirror_core::{NamespaceFilter, ResourceStyle, Selector, ServiceKey};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

// The number of a link feed (see the runtime's `generation.rs`).
pub(crate) use crate::runtime::generation::Generation;

/// What the federation's index task is told.
#[derive(Debug)]
pub(crate) enum Msg {
    /// A new feed of `cluster` starts (sent before any of its messages).
    Feed {
        cluster: String,
        generation: Generation,
    },
    /// A remote member joined or changed.
    Member {
        link: Arc<LinkIdentity>,
        generation: Generation,
        service: Box<Service>,
    },
    /// A remote member left (deleted, or no longer selected, or not in a complete list).
    Left {
        cluster: String,
        generation: Generation,
        key: ServiceKey,
    },
    /// A link (re)lists: its membership is unknown until `Listed`.
    Listing {
        cluster: String,
        generation: Generation,
    },
    /// A link stopped watching for a while (cold standby): its members are unknown
    /// until a feed of it lists again.
    Unknown {
        cluster: String,
        generation: Generation,
    },
    /// A link's list is complete.
    Listed {
        cluster: String,
        generation: Generation,
    },
    /// A link's gateway as resolved and probed.
    Gateway {
        cluster: String,
        generation: Generation,
        gateway: Option<ResolvedGateway>,
    },
    /// A link's status book: its federated members' entries are recorded there.
    StatusBook {
        cluster: String,
        book: Arc<crate::link_controller::link_status::StatusBook>,
    },
    /// A link was removed: its members leave.
    LinkRemoved { cluster: String },
    /// The link manager's first list: these clusters are linked.
    Expect { clusters: Vec<String> },
    /// A local member applied (`Some`) or deleted.
    Local {
        key: ServiceKey,
        service: Option<Box<Service>>,
    },
    /// The local member watch starts a list.
    LocalListing,
    /// The local member list is complete.
    LocalListed,
    /// An event of `key`'s local member's EndpointSlice watch (`local_slices.rs`).
    LocalSlice {
        key: ServiceKey,
        event: Box<kube::runtime::watcher::Event<k8s_openapi::api::discovery::v1::EndpointSlice>>,
    },
    /// One of our stored federated objects changed: plan its key again.
    Stored(ServiceKey),
    /// Our stored federated Services (`true`) or slices are listed.
    StoreListed(bool),
    /// Leadership changed.
    Leader(bool),
    /// The foreign Service holding `key`'s `<svc>-federated` name is there (`true`) or
    /// gone (or ours now).
    Foreign { key: ServiceKey, present: bool },
}

/// Settings of the federation.
#[derive(Debug, Clone)]
pub struct FederationOptions {
    /// Our namespace: the ownership annotation of federated objects.
    pub controller_namespace: String,
    /// `--federated-service-selector` as a label selector string (`None`: no local
    /// members).
    pub local_selector: Option<String>,
    /// Writes only while this says true (leader election); `None`: always.
    pub leader: Option<crate::leader::Leadership>,
    /// The links' write gates: a link's messages are held while its gate is closed
    /// (see `held.rs`); `None`: never held.
    pub write_gates: Option<crate::write_leases::WriteGates>,
    /// Where federated traffic goes by default (`core::traffic`: local-first, the
    /// priority list).
    pub traffic: service_mirror_core::traffic::TrafficDefaults,
}

/// A handle on the running federation (clones share it).
#[derive(Clone)]
pub struct Federation {
    tx: mpsc::UnboundedSender<Msg>,
    /// The last feed generation handed out (process-wide, so always increasing).
    generations: Arc<crate::runtime::generation::Generations>,
    /// The newest feed's state of each cluster: a replacing feed starts from it.
    feeds: Arc<
        parking_lot::Mutex<
            std::collections::BTreeMap<String, Arc<parking_lot::Mutex<feed::FeedState>>>,
        >,
    >,
}

impl std::fmt::Debug for Federation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Federation")
    }
}

impl Federation {
    /// Starts the federation: its local watches, its index task and its reconcile
    /// workers, until `cancel`.
    pub fn start(
        local: Client,
        recorder: EventRecorder,
        metrics: Arc<Metrics>,
        opts: FederationOptions,
        cancel: CancellationToken,
    ) -> (Self, Vec<JoinHandle<()>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (stored, mut tasks) = watches::spawn(&local, &opts, &tx, &cancel);
        tasks.extend(run_on(
            local,
            recorder,
            metrics,
            &opts,
            stored,
            (tx.clone(), rx),
            &cancel,
        ));
        let federation = Self {
            tx,
            generations: Arc::default(),
            feeds: Arc::default(),
        };
        (federation, tasks)
    }

    /// The feed of one link controller: its members are the remote Services `selector`
    /// matches (a Link's `federatedServiceSelector`) in the namespaces it mirrors.
    pub fn feed(
        &self,
        id: LinkIdentity,
        selector: Selector,
        namespaces: NamespaceFilter,
    ) -> LinkFeed {
        let generation = self.generations.next();
        // A replacing feed starts from what the old one announced: members its first
        // list lacks leave at that list's end, and an untrusted (empty, after an
        // outage) list is held as the old feed would have held it.
        let state = {
            let mut feeds = self.feeds.lock();
            let seeded = feeds
                .get(&id.cluster)
                .map(|old| old.lock().successor())
                .unwrap_or_default();
            let state = Arc::new(parking_lot::Mutex::new(seeded));
            feeds.insert(id.cluster.clone(), state.clone());
            state
        };
        let in_use = Arc::new(std::sync::atomic::AtomicBool::new(
            state.lock().has_announced(),
        ));
        let _ = self.tx.send(Msg::Feed {
            cluster: id.cluster.clone(),
            generation,
        });
        LinkFeed {
            tx: self.tx.clone(),
            id: Arc::new(id),
            generation,
            selector,
            namespaces,
            state,
            in_use,
            hold: std::time::Duration::from_secs(30),
            export_to: None,
        }
    }

    /// The Link of `cluster` shows its federated members in its status through `book`
    /// (a replacing controller's book replaces the old one).
    pub(crate) fn report_status(
        &self,
        cluster: &str,
        book: Arc<crate::link_controller::link_status::StatusBook>,
    ) {
        let _ = self.tx.send(Msg::StatusBook {
            cluster: cluster.to_owned(),
            book,
        });
    }

    /// The link of `cluster` was removed: its members leave their federated Services.
    pub fn link_removed(&self, cluster: &str) {
        // A later link of that cluster starts afresh.
        self.feeds.lock().remove(cluster);
        let _ = self.tx.send(Msg::LinkRemoved {
            cluster: cluster.to_owned(),
        });
    }

    /// The linked clusters at start (the link manager's first list of its sources):
    /// their stored entries are kept until each has listed its remote Services.
    pub fn expect(&self, clusters: Vec<String>) {
        let _ = self.tx.send(Msg::Expect { clusters });
    }
}

/// The federation on the runtime, over the stores of our federated objects and the
/// message channel (the watches feeding them are started by [`Federation::start`]): the
/// index task, the leader follower, and the reconcile workers behind their gate.
fn run_on(
    local: Client,
    recorder: EventRecorder,
    metrics: Arc<Metrics>,
    opts: &FederationOptions,
    stored: watches::Stored,
    (tx, rx): (mpsc::UnboundedSender<Msg>, mpsc::UnboundedReceiver<Msg>),
    cancel: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    let queue = crate::runtime::WorkQueue::new(reconcile::RETRY, cancel.clone());
    let shared = Arc::default();
    let indexer = indexer::Indexer::new(
        Arc::clone(&shared),
        stored.clone(),
        queue.clone(),
        opts.write_gates.clone(),
    );
    // Writes wait for the index and the stores (see `indexer.rs`) and the lead.
    let gate = crate::runtime::Gate::new(indexer.ready.subscribe(), opts.leader.clone(), false);
    let rec = Arc::new(reconcile::Reconciler {
        shared,
        stored,
        queue: queue.clone(),
        leader: opts.leader.clone(),
        writer: LocalWriter::federated(
            local.clone(),
            &opts.controller_namespace,
            metrics.clone(),
            recorder.clone(),
        )
        .led_by(opts.leader.clone()),
        recorder,
        metrics,
        namespace: opts.controller_namespace.clone(),
        traffic: opts.traffic.clone(),
        client: local,
        tx: tx.clone(),
    });
    crate::runtime::spawn_component(
        indexer.run(rx, cancel.clone()),
        (&tx, Msg::Leader),
        reconcile::WORKERS,
        &queue,
        &gate,
        &rec,
        cancel,
    )
}

/// Parses `--federated-service-selector` (`key=value[,...]`; empty: no local members)
/// into the label selector string the local watch uses.
pub fn local_selector(flag: &str) -> anyhow::Result<Option<String>> {
    if flag.trim().is_empty() {
        return Ok(None);
    }
    let parsed = crate::cli::link_gen::parse_selector(flag)?;
    Selector::parse(Some(&parsed)).map_err(|e| anyhow::anyhow!("{flag:?}: {e}"))?;
    let text = parsed
        .match_labels
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    Ok(Some(text))
}

/// A `Link`'s identity for its members: cluster, domain, exclusions (from the core
/// link's style), creation time and the Link to report on.
pub fn link_identity(
    link: &service_mirror_core::Link,
    created: Option<k8s_openapi::jiff::Timestamp>,
    reference: Option<k8s_openapi::api::core::v1::ObjectReference>,
) -> LinkIdentity {
    let exclusions = match &link.style {
        service_mirror_core::MirrorStyle::Resource(style) => style.clone(),
        _ => ResourceStyle::default(),
    };
    LinkIdentity {
        cluster: link.cluster_name.clone(),
        created,
        domain: link.cluster_domain.clone(),
        exclusions,
        link: reference,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_selector_flag_table() {
        let table: Vec<(&str, Option<Option<&str>>)> = vec![
            ("", Some(None)),
            (
                "mirror.linkerd.io/federated=member",
                Some(Some("mirror.linkerd.io/federated=member")),
            ),
            ("b=2, a=1", Some(Some("a=1,b=2"))),
            ("no-equals", None),
            ("a in (x)", None),
        ];
        for (flag, want) in table {
            let got = local_selector(flag).ok();
            let got = got.as_ref().map(|o| o.as_deref());
            assert_eq!(got, want, "{flag}");
        }
    }
}
