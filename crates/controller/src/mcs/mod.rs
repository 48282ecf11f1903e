//! The Multi-Cluster Services API (KEP-1645, `multicluster.x-k8s.io`): its CRDs as we
//! install them, and ONE process-wide component that reads the ServiceExports of the
//! local cluster and of every linked one (a full mesh: each cluster's controller reads
//! the others over its links) and writes the conditions of the local exports, and in
//! this cluster each exported name's ServiceImport, derived Service and EndpointSlices
//! (one group per exporting cluster: a remote one's at its gateway, this cluster's a
//! copy of its own Service's). The merge of
//! exports across the cluster set is pure and lives in `service_mirror_core::mcs`
//! (the import's and derived Service's forms in `mcs_import`, `mcs_derived`); we never
//! write to a remote cluster.
//!
//! It runs on the runtime, as the federation: an index task takes every [`Msg`] into
//! the shared state and adds the keys it changes to a `runtime::WorkQueue`; the
//! runtime's workers run `reconcile(key)` behind a gate (local lists in, leader), and a
//! failed write is retried with the queue's backoff.
//!
//! Files: `enable.rs` (whether it runs, and as which cluster: `--mcs`, the CRD, the
//! ClusterProperty `id.k8s.io`) and `startup.rs` (asking the apiserver that, once),
//! `resource.rs` (the ServiceExport and ServiceImport types), `watches.rs` (one
//! cluster's exports and Services; a link's Services come from its own remote Service
//! watch, through an [`McsFeed`]; the local imports, derived Services and slices),
//! `gateways.rs` (the links' gateway reports, per feed), `index.rs` (every cluster's
//! exports, fed by those watches), `indexer.rs` (the index task: messages in, keys
//! out), `shared.rs` (what it shares with reconcile), `reconcile.rs` (gather, judge,
//! write the status, report), `decide.rs` (the pure judgement of a name: what to write,
//! delete and tell), `write_errors.rs` (what a refused write means), `imports.rs` (the
//! local imports' writer; its children `imports/cache.rs` hold the local caches,
//! `imports/service_import.rs`, `imports/derived.rs`, `imports/slices.rs` write the
//! ServiceImport, the derived Service and the import EndpointSlices), `metrics.rs`.

mod decide;
pub(crate) mod dns_view;
pub mod enable;
mod gateways;
mod imports;
pub(crate) mod index;
mod indexer;
pub(crate) mod metrics;
mod reconcile;
pub mod resource;
mod shared;
pub mod startup;
pub(crate) mod watches;
mod write_errors;

use crate::events::EventRecorder;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::runtime::watcher;
use resource::{ServiceExport, ServiceImport};
use service_mirror_core::mcs_slices::SourceGateway;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

// The CRDs, their names and versions: the api crate's (one vocabulary).
pub use service_mirror_api::mcs::{
    SERVED_VERSIONS, SERVICE_EXPORT_CRD_NAME, SERVICE_EXPORT_CRD_YAML, SERVICE_IMPORT_CRD_NAME,
    SERVICE_IMPORT_CRD_YAML, VERSION,
};

/// What the index task is told.
#[derive(Debug)]
enum Msg {
    /// A feed of `cluster` starts (sent before any of its events).
    Feed {
        cluster: Arc<str>,
        generation: index::Generation,
    },
    /// A ServiceExport watch event of `cluster`.
    Export {
        cluster: Arc<str>,
        generation: index::Generation,
        event: Box<watcher::Event<ServiceExport>>,
    },
    /// A Service watch event of `cluster`.
    Service {
        cluster: Arc<str>,
        generation: index::Generation,
        event: Box<watcher::Event<Service>>,
    },
    /// The feed `generation` of `cluster` ended (its link stopped): its exports leave,
    /// unless a newer feed replaced it.
    Ended {
        cluster: Arc<str>,
        generation: index::Generation,
    },
    /// The clusters the link sources name, once they are first listed.
    Expect(std::collections::BTreeSet<String>),
    /// The link of `cluster` was removed (no other source links it).
    Removed(String),
    /// A watch event of the local ServiceImports.
    Import(Box<watcher::Event<ServiceImport>>),
    /// A watch event of our local derived Services.
    Derived(Box<watcher::Event<Service>>),
    /// A watch event of our local import EndpointSlices.
    Slice(Box<watcher::Event<EndpointSlice>>),
    /// A watch event of the local Services' EndpointSlices (not ours): the endpoints
    /// of this cluster's exports.
    LocalSlice(Box<watcher::Event<EndpointSlice>>),
    /// A watch event of our headless mirrors' EndpointSlices (stripped): read by the
    /// clusterset.local zone only.
    HeadlessMirrorSlice(Box<watcher::Event<EndpointSlice>>),
    /// The gateway of linked cluster `cluster` as the link of feed `generation`
    /// resolved and probed it (`None`: it has none usable now); without a generation,
    /// the cluster's latest feed's.
    Gateway {
        cluster: String,
        generation: Option<index::Generation>,
        gateway: Option<SourceGateway>,
    },
    /// Leadership changed (becoming leader judges every name).
    Leader(bool),
}

/// Settings of the MCS component.
#[derive(Debug, Clone)]
pub struct McsOptions {
    /// This cluster's name in the cluster set (the name its peers' links give it): it
    /// orders exports of one creation second and names this cluster in conditions.
    pub cluster_name: String,
    /// Writes only while this says true (leader election); `None`: always.
    pub leader: Option<Leadership>,
    /// The namespaces whose exports are read (the links' `--namespace-allow/deny`).
    pub namespaces: service_mirror_core::NamespaceFilter,
    /// The controller's namespace: our imports and derived Services carry it.
    pub controller_namespace: String,
    /// Where imports' traffic goes by default (`core::traffic`).
    pub traffic: service_mirror_core::traffic::TrafficDefaults,
}

/// A handle on the running MCS component (clones share it).
#[derive(Clone)]
pub struct Mcs {
    tx: mpsc::UnboundedSender<Msg>,
    /// This cluster's name: no link may feed it.
    local: Arc<str>,
    metrics: Arc<Metrics>,
    /// The last feed generation handed out (process-wide, so always increasing; the
    /// local feed is 0).
    generations: Arc<crate::runtime::generation::Generations>,
    /// What the clusterset.local DNS zone reads (`dns_view.rs`).
    zone: dns_view::ImportZone,
}

impl std::fmt::Debug for Mcs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Mcs")
    }
}

/// A link's gateway reports, into the MCS component, under its feed's generation (a
/// replaced or stopped link's reports are told apart, and dropped with its feed).
pub(crate) struct GatewayFeed {
    mcs: Mcs,
    cluster: String,
    generation: index::Generation,
    domain: String,
}

impl crate::gateway::report::GatewayListener for GatewayFeed {
    /// Always: which imports the cluster exports is the reconcile's to know.
    fn in_use(&self) -> bool {
        true
    }

    /// A lost cluster's slices go by the links' stale policy (issue 17's stale sources),
    /// as its mirrors' endpoints do.
    fn follows_stale_policy(&self) -> bool {
        true
    }

    fn report(&self, gateway: Option<service_mirror_core::ResolvedGateway>) {
        let gateway = gateway.map(|gateway| SourceGateway {
            gateway,
            domain: self.domain.clone(),
        });
        let _ = self.mcs.tx.send(Msg::Gateway {
            cluster: self.cluster.clone(),
            generation: Some(self.generation),
            gateway,
        });
    }
}

impl Mcs {
    /// Starts the component: the local watches, the index task and the reconcile
    /// workers behind their gate, until `cancel`.
    pub fn start(
        local: Client,
        recorder: EventRecorder,
        metrics: Arc<Metrics>,
        opts: McsOptions,
        cancel: CancellationToken,
    ) -> (Self, Vec<JoinHandle<()>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let feed = watches::Feed {
            cluster: opts.cluster_name.as_str().into(),
            generation: 0,
            tx: tx.clone(),
            metrics: metrics.clone(),
        };
        let mut tasks = watches::spawn(&local, feed.clone(), &cancel);
        tasks.extend(watches::spawn_imports(&local, feed, &cancel));
        let queue = crate::runtime::WorkQueue::new(reconcile::RETRY, cancel.clone());
        let shared = Arc::new(parking_lot::Mutex::new(shared::Shared::new(
            &opts.cluster_name,
            opts.namespaces.clone(),
        )));
        let zone = dns_view::ImportZone {
            shared: shared.clone(),
            local: opts.cluster_name.clone(),
            controller_namespace: opts.controller_namespace.clone(),
        };
        let indexer = indexer::Indexer::new(shared.clone(), queue.clone(), metrics.clone());
        // Judgements wait for the local lists (see `indexer.rs`) and the lead.
        let gate = crate::runtime::Gate::new(indexer.ready.subscribe(), opts.leader.clone(), false);
        let imports =
            imports::Imports::new(local.clone(), recorder.clone(), metrics.clone(), &opts);
        let rec = Arc::new(reconcile::Reconciler {
            shared,
            queue: queue.clone(),
            status: crate::writer::mcs_status::McsStatusWriter::new(
                local,
                &opts.controller_namespace,
                metrics.clone(),
                opts.leader.clone(),
            ),
            recorder,
            metrics: metrics.clone(),
            leader: opts.leader.clone(),
            local: opts.cluster_name.clone(),
            traffic: opts.traffic.clone(),
            imports,
        });
        rec.count(); // every state's gauge from the start
        tasks.extend(crate::runtime::spawn_component(
            indexer.run(rx, cancel.clone()),
            (&tx, Msg::Leader),
            reconcile::WORKERS,
            &queue,
            &gate,
            &rec,
            &cancel,
        ));
        let mcs = Self {
            tx,
            local: opts.cluster_name.as_str().into(),
            metrics,
            generations: Arc::default(),
            zone,
        };
        (mcs, tasks)
    }

    /// The `clusterset.local` zone's data: the ServiceImports this component caches.
    pub(crate) fn clusterset_zone(&self) -> Arc<dyn crate::clusterset_dns::Zone + Send + Sync> {
        Arc::new(self.zone.clone())
    }

    /// The clusters the link sources name, once the sources are first listed: a
    /// cluster an import lists that is none of them and has no link is gone (its
    /// imports may go with their last export), one of them waits for its link.
    pub fn expect(&self, clusters: std::collections::BTreeSet<String>) {
        let _ = self.tx.send(Msg::Expect(clusters));
    }

    /// The gateway of linked cluster `cluster` changed (`None`: none usable now), as its
    /// latest link reports it: the EndpointSlices of the imports it exports point at it.
    /// (A link controller reports through the [`GatewayFeed`] of its own feed.)
    pub fn gateway(&self, cluster: &str, gateway: Option<SourceGateway>) {
        let _ = self.tx.send(Msg::Gateway {
            cluster: cluster.into(),
            generation: None,
            gateway,
        });
    }

    /// The link of `cluster` was removed and no other source links it: the imports it
    /// held up may go.
    pub fn link_removed(&self, cluster: &str) {
        let _ = self.tx.send(Msg::Removed(cluster.into()));
    }

    /// Reads the exports and Services of linked cluster `cluster` through `remote`
    /// until `cancel` (the link controller's), when they leave the merge: a newer call
    /// for the same cluster (a link restarted with new credentials) replaces this one,
    /// whose objects stay until the newer one's lists are complete.
    pub fn link(
        &self,
        cluster: &str,
        remote: &Client,
        cancel: &CancellationToken,
    ) -> Vec<JoinHandle<()>> {
        let Some(feed) = self.start_feed(cluster) else {
            return Vec::new();
        };
        let mut tasks = watches::spawn(remote, feed.watches(&self.metrics), cancel);
        tasks.push(feed.ended(cancel));
        tasks
    }

    /// A link controller's feed: its remote ServiceExports read through `remote` here,
    /// its remote Services sent by its own remote Service watch through the returned
    /// [`McsFeed`], and the feed its gateway is reported to (the cluster's DNS domain
    /// `domain` names the remote Service in the slices); until `cancel`.
    pub(crate) fn link_with_gateway(
        &self,
        cluster: &str,
        domain: &str,
        remote: &Client,
        cancel: &CancellationToken,
    ) -> (Vec<JoinHandle<()>>, Option<GatewayFeed>, Option<McsFeed>) {
        let Some(feed) = self.start_feed(cluster) else {
            return (Vec::new(), None, None);
        };
        let tasks = vec![
            watches::spawn_exports(remote, feed.watches(&self.metrics), cancel),
            feed.ended(cancel),
        ];
        let gateway = GatewayFeed {
            mcs: self.clone(),
            cluster: feed.cluster.to_string(),
            generation: feed.generation,
            domain: domain.into(),
        };
        (tasks, Some(gateway), Some(feed))
    }

    /// Starts a feed of linked cluster `cluster` (a new generation, told before any of
    /// its events); `None` for this cluster's own name.
    fn start_feed(&self, cluster: &str) -> Option<McsFeed> {
        if *cluster == *self.local {
            // Its exports would pass for this cluster's own: never read.
            tracing::error!(%cluster, "a link names this cluster's own MCS cluster name: its ServiceExports are not read");
            return None;
        }
        let generation = self.generations.next();
        let cluster: Arc<str> = cluster.into();
        let _ = self.tx.send(Msg::Feed {
            cluster: cluster.clone(),
            generation,
        });
        Some(McsFeed {
            tx: self.tx.clone(),
            cluster,
            generation,
        })
    }
}

/// One feed of a linked cluster into the MCS component: its generation, and the link's
/// remote Service events (the link's remote Service watch sends them here, so MCS needs
/// no second watch of every remote Service). The index keeps the last complete list's
/// Services until the next list completes (`index.rs`): a relist cut short, or an
/// unreachable remote, drops none.
#[derive(Clone)]
pub(crate) struct McsFeed {
    tx: mpsc::UnboundedSender<Msg>,
    cluster: Arc<str>,
    generation: index::Generation,
}

impl McsFeed {
    /// A remote Service watch event of the link (stripped as the link keeps it, with
    /// the spec fields MCS reads).
    pub(crate) fn remote_event(&self, event: &watcher::Event<Service>) {
        let mut event = event.clone();
        match &mut event {
            watcher::Event::Apply(s) | watcher::Event::InitApply(s) | watcher::Event::Delete(s) => {
                watches::strip_service(s)
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
        let _ = self.tx.send(Msg::Service {
            cluster: self.cluster.clone(),
            generation: self.generation,
            event: Box::new(event),
        });
    }

    /// Where this feed's own watches send.
    fn watches(&self, metrics: &Arc<Metrics>) -> watches::Feed {
        watches::Feed {
            cluster: self.cluster.clone(),
            generation: self.generation,
            tx: self.tx.clone(),
            metrics: metrics.clone(),
        }
    }

    /// Tells the end of the feed when `cancel` fires: its objects leave, unless a newer
    /// feed replaced it.
    fn ended(&self, cancel: &CancellationToken) -> JoinHandle<()> {
        let (tx, cancel) = (self.tx.clone(), cancel.clone());
        let (cluster, generation) = (self.cluster.clone(), self.generation);
        tokio::spawn(async move {
            cancel.cancelled().await;
            let _ = tx.send(Msg::Ended {
                cluster,
                generation,
            });
        })
    }
}
