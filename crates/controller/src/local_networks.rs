//! The local cluster's own networks, kept current: the gateway address policy refuses
//! gateway addresses in them with no flag (`service_mirror_core::LocalCidrs`), so a
//! remote cannot aim local clients at the local apiserver, a local Service or a pod.
//!
//! Three watches of the local apiserver, one per source:
//! - `service_cidrs`: every `networking.k8s.io/v1` ServiceCIDR's `spec.cidrs` (GA and
//!   served by default since Kubernetes 1.33);
//! - `kubernetes_service`: the `kubernetes` Service in `default`, its ClusterIPs as /32
//!   or /128, read whatever else is readable: the documented fallback when ServiceCIDRs
//!   cannot be read (an older apiserver, no permission) still keeps the apiserver's own
//!   ClusterIP out;
//! - `nodes`: every Node's `spec.podCIDRs` (clusters whose nodes get no pod CIDR, as
//!   with many CNI plugins' own IPAM, contribute none).
//!
//! A source that cannot be read (forbidden, not served, unreachable) is said once per
//! change of state (a warning, a Warning Event on the `kubernetes` Service, and
//! `service_mirror_local_cidrs{source,state}`), keeps its last good CIDRs and is watched
//! again with backoff (a 404 every 10 minutes). A routine interruption (a watch's
//! 410 Gone, a dropped connection) is no change of state: unreachable takes three
//! failures in a row. A malformed entry is skipped and said once; the object's other
//! entries still count. A change reaches every link, whose mirrors are looked at again.

use crate::events::EventRecorder;
use crate::metrics::Metrics;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::EventType;
use kube::runtime::watcher::{self, Event};
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use service_mirror_core::local_networks::{
    Malformed, Read, cluster_ips_of, pod_cidrs_of, service_cidrs_of,
};
use service_mirror_core::{Cidr, LocalCidrs};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long gateway addresses wait for the first read of every source before they are
/// judged on what is known (the flags and whatever was read): a busy apiserver answers
/// the three lists in well under a second; 30 s bounds a start against one that hangs.
pub const FIRST_READ_WAIT: Duration = Duration::from_secs(30);

/// The local networks as last read; clones share them.
#[derive(Clone, Debug)]
pub struct LocalNetworks {
    rx: watch::Receiver<LocalCidrs>,
    /// True once every source had its first complete list or its first error (or
    /// [`FIRST_READ_WAIT`] passed): until then the set is empty, not the cluster's.
    ready: watch::Receiver<bool>,
}

impl Default for LocalNetworks {
    /// No local network: the flags alone (embedders and tests that do not discover).
    fn default() -> Self {
        Self::fixed(LocalCidrs::default())
    }
}

impl LocalNetworks {
    /// Networks that never change.
    pub fn fixed(cidrs: LocalCidrs) -> Self {
        let (tx, rx) = watch::channel(cidrs.normalized());
        // The receiver keeps the value; no sender means no change, ever.
        drop(tx);
        let (_, ready) = watch::channel(true);
        Self { rx, ready }
    }

    /// Waits until every source was read once (or failed once, or
    /// [`FIRST_READ_WAIT`] passed): after a restart, no gateway address is judged
    /// against the empty set the watches start from, so a mirror never points at a
    /// local network for the moment the lists take.
    pub async fn first_read(&self) {
        let mut ready = self.ready.clone();
        // An error: the sender is gone (shut down); nothing more to wait for.
        let _ = ready.wait_for(|r| *r).await;
    }

    /// The networks now.
    pub fn current(&self) -> LocalCidrs {
        self.rx.borrow().clone()
    }

    /// Waits for a change; false once none can come any more.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

/// Where the local networks are read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// ServiceCIDR objects.
    ServiceCidrs,
    /// The `kubernetes` Service in `default`.
    KubernetesService,
    /// Nodes' `spec.podCIDRs`.
    Nodes,
}

impl Source {
    const ALL: [Source; 3] = [
        Source::ServiceCidrs,
        Source::KubernetesService,
        Source::Nodes,
    ];

    /// The bounded metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::ServiceCidrs => "service_cidrs",
            Self::KubernetesService => "kubernetes_service",
            Self::Nodes => "nodes",
        }
    }

    /// What missing it means, for the report.
    fn effect(self) -> &'static str {
        match self {
            Self::ServiceCidrs => {
                "gateway addresses in the local service CIDRs are refused only at the kubernetes Service's ClusterIP (grant list/watch servicecidrs.networking.k8s.io, or deny the service CIDRs with --gateway-address-deny)"
            }
            Self::KubernetesService => {
                "the local apiserver's ClusterIP is refused only if a ServiceCIDR holds it (grant list/watch services)"
            }
            Self::Nodes => {
                "gateway addresses in the local pod CIDRs are not refused (grant list/watch nodes, or deny the pod CIDRs with --gateway-address-deny)"
            }
        }
    }
}

/// How a source reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Read and watched.
    Read,
    /// 403: no permission.
    Forbidden,
    /// 404: the API is not served (ServiceCIDR before Kubernetes 1.33).
    NotServed,
    /// Any other failure.
    Unreachable,
}

impl State {
    /// The bounded metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Forbidden => "forbidden",
            Self::NotServed => "not_served",
            Self::Unreachable => "unreachable",
        }
    }

    const ALL: [State; 4] = [
        State::Read,
        State::Forbidden,
        State::NotServed,
        State::Unreachable,
    ];

    fn of(error: &watcher::Error) -> Self {
        let api = match error {
            watcher::Error::InitialListFailed(kube::Error::Api(e))
            | watcher::Error::WatchStartFailed(kube::Error::Api(e))
            | watcher::Error::WatchFailed(kube::Error::Api(e)) => Some(e.code),
            watcher::Error::WatchError(e) => Some(e.code),
            _ => None,
        };
        match api {
            Some(403) => Self::Forbidden,
            Some(404) => Self::NotServed,
            _ => Self::Unreachable,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceStateLabels {
    source: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
}

/// The local networks' metric families.
#[derive(Debug, Default)]
pub(crate) struct LocalNetworkFamilies {
    /// 1 for each source's current state.
    state: Family<SourceStateLabels, Gauge>,
    /// CIDRs each source contributes now.
    cidrs: Family<SourceLabels, Gauge>,
    /// Entries skipped as malformed (each counted once).
    malformed: Family<SourceLabels, Counter>,
}

impl LocalNetworkFamilies {
    /// Registers the families (under the registry's prefix).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "local_cidrs",
            "1 for each source of the local networks (service_cidrs, kubernetes_service, nodes) and its state (read, forbidden, not_served, unreachable)",
            self.state.clone(),
        );
        r.register(
            "local_cidr_blocks",
            "CIDRs each source of the local networks contributes to the gateway address policy",
            self.cidrs.clone(),
        );
        r.register(
            "local_cidr_malformed",
            "Entries of local objects skipped as not a CIDR",
            self.malformed.clone(),
        );
    }

    fn set_state(&self, source: Source, state: State) {
        for s in State::ALL {
            self.state
                .get_or_create(&SourceStateLabels {
                    source: source.label().into(),
                    state: s.label().into(),
                })
                .set(i64::from(s == state));
        }
    }
}

/// What each source last read, by object name.
#[derive(Default)]
struct Parts {
    by_source: BTreeMap<Source, BTreeMap<String, Vec<Cidr>>>,
}

impl Parts {
    fn union(&self) -> LocalCidrs {
        let mut out = LocalCidrs::default();
        for (source, objects) in &self.by_source {
            let into = match source {
                Source::Nodes => &mut out.pod,
                Source::ServiceCidrs | Source::KubernetesService => &mut out.service,
            };
            into.extend(objects.values().flatten().copied());
        }
        out.normalized()
    }
}

/// What the watches share.
struct Shared {
    parts: Mutex<Parts>,
    tx: watch::Sender<LocalCidrs>,
    metrics: Arc<Metrics>,
    recorder: Option<EventRecorder>,
    /// Malformed entries already said.
    said: Mutex<HashSet<String>>,
    /// The sources heard from once (a complete list or an error).
    heard: Mutex<HashSet<Source>>,
    /// Opened once every source was heard from.
    ready: watch::Sender<bool>,
}

/// Where Events about the local networks go: the `kubernetes` Service, whose
/// ClusterIP is the fallback.
fn event_object() -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some("default".into()),
        name: Some("kubernetes".into()),
        ..Default::default()
    }
}

impl Shared {
    fn publish(&self, source: Source, objects: BTreeMap<String, Vec<Cidr>>) {
        let count = objects.values().map(Vec::len).sum::<usize>();
        self.metrics
            .local_networks
            .cidrs
            .get_or_create(&SourceLabels {
                source: source.label().into(),
            })
            .set(count as i64);
        let now = {
            let mut parts = self.parts.lock();
            parts.by_source.insert(source, objects);
            parts.union()
        };
        self.tx.send_if_modified(|cur| {
            let changed = *cur != now;
            if changed {
                tracing::info!(service = ?now.service.iter().map(ToString::to_string).collect::<Vec<_>>(), pod = ?now.pod.iter().map(ToString::to_string).collect::<Vec<_>>(), "local networks refused as gateway addresses");
                *cur = now;
            }
            changed
        });
    }

    async fn malformed(&self, source: Source, bad: Vec<Malformed>) {
        for m in bad {
            let text = m.to_string();
            if !self.said.lock().insert(text.clone()) {
                continue;
            }
            tracing::warn!(source = source.label(), entry = %text, "skipping a malformed local network entry; the object's other entries count");
            self.metrics
                .local_networks
                .malformed
                .get_or_create(&SourceLabels {
                    source: source.label().into(),
                })
                .inc();
            if let Some(r) = &self.recorder {
                let note = format!("{text}: skipped (its other entries count)");
                r.publish(
                    &event_object(),
                    EventType::Warning,
                    "LocalNetworkMalformed",
                    "Discover",
                    note,
                )
                .await;
            }
        }
    }

    /// `source` had its first complete list or its first error: the first-read gate
    /// opens once every source has.
    fn heard(&self, source: Source) {
        let all = {
            let mut heard = self.heard.lock();
            heard.insert(source);
            heard.len() == Source::ALL.len()
        };
        if all {
            self.ready.send_replace(true);
        }
    }

    /// A change of `source`'s state to `now`, said once per change. `kept`: how many
    /// CIDRs it read before, which stay.
    async fn state(
        &self,
        source: Source,
        was: &mut Option<State>,
        now: State,
        error: Option<String>,
        kept: Option<usize>,
    ) {
        if *was == Some(now) {
            return;
        }
        let first = was.is_none();
        *was = Some(now);
        self.metrics.local_networks.set_state(source, now);
        if now == State::Read {
            if !first {
                tracing::info!(source = source.label(), "local networks readable again");
            }
            return;
        }
        let effect = match kept {
            Some(n) => format!("its last good CIDRs ({n}) are kept and refused"),
            None => source.effect().to_owned(),
        };
        let error = error.unwrap_or_default();
        tracing::warn!(source = source.label(), state = now.label(), %error, "cannot read the local networks: {effect}");
        if let Some(r) = &self.recorder {
            let note = format!(
                "cannot read the local networks from {} ({}): {effect}",
                source.label(),
                now.label()
            );
            r.publish(
                &event_object(),
                EventType::Warning,
                "LocalNetworksUnreadable",
                "Discover",
                note,
            )
            .await;
        }
    }
}

/// Starts the watches of the local networks.
pub fn spawn(
    client: kube::Client,
    recorder: Option<EventRecorder>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) -> (LocalNetworks, Vec<JoinHandle<()>>) {
    let (tx, rx) = watch::channel(LocalCidrs::default());
    let (ready_tx, ready) = watch::channel(false);
    let shared = Arc::new(Shared {
        parts: Mutex::default(),
        tx,
        metrics,
        recorder,
        said: Mutex::default(),
        heard: Mutex::default(),
        ready: ready_tx,
    });
    let kubernetes = watcher::Config::default().fields("metadata.name=kubernetes");
    let tasks = vec![
        tokio::spawn(open_after(shared.clone(), FIRST_READ_WAIT, cancel.clone())),
        tokio::spawn(follow(
            shared.clone(),
            Source::ServiceCidrs,
            Api::<ServiceCIDR>::all(client.clone()),
            watcher::Config::default(),
            service_cidrs_of,
            cancel.clone(),
        )),
        tokio::spawn(follow(
            shared.clone(),
            Source::KubernetesService,
            Api::<Service>::namespaced(client.clone(), "default"),
            kubernetes,
            cluster_ips_of,
            cancel.clone(),
        )),
        tokio::spawn(follow(
            shared,
            Source::Nodes,
            Api::<Node>::all(client),
            watcher::Config::default(),
            pod_cidrs_of,
            cancel,
        )),
    ];
    (LocalNetworks { rx, ready }, tasks)
}

/// Opens the first-read gate after `wait` if the sources have not: gateways are then
/// judged on the flags and whatever was read, said once.
async fn open_after(shared: Arc<Shared>, wait: Duration, cancel: CancellationToken) {
    tokio::select! {
        _ = cancel.cancelled() => return,
        _ = tokio::time::sleep(wait) => {}
    }
    if *shared.ready.borrow() {
        return;
    }
    let missing: Vec<&str> = {
        let heard = shared.heard.lock();
        Source::ALL
            .iter()
            .filter(|s| !heard.contains(s))
            .map(|s| s.label())
            .collect()
    };
    tracing::warn!(
        ?missing,
        waited = ?wait,
        "the local networks are not read yet; gateway addresses are judged on the flags and what was read until they are"
    );
    shared.ready.send_replace(true);
}

/// Errors in a row (no event read in between) after which a source is said
/// unreachable: one is routine (a watch's 410 Gone, an interrupted list the watcher
/// retries at once); three, with kube's backoff (0.8 s, then doubling), are about 5 s
/// of failing (re)lists.
const UNREACHABLE_AFTER: u32 = 3;

/// How long a source whose API is not served (404: ServiceCIDR before Kubernetes 1.33)
/// waits before it is asked again: the API comes only with an apiserver upgrade, so
/// every 10 minutes rather than the backoff's 30 s.
const NOT_SERVED_RETRY: Duration = Duration::from_secs(600);

/// What an error of a source's watch means: a change of state, or None when it is
/// routine (the watcher lists or watches again by itself). Forbidden and not served
/// are states at once; anything else only after [`UNREACHABLE_AFTER`] in a row.
fn judge(error: &watcher::Error, failures: u32) -> Option<State> {
    // 410 Gone (the resume point compacted away) is always routine: the watcher lists
    // again. Seen in the chaos suite: after a compaction of the local etcd the nodes
    // watch met 410 three times in a row (its backoff re-watching the same resource
    // version) and an Event was written about a source that was readable.
    if is_gone(error) {
        return None;
    }
    match State::of(error) {
        State::Unreachable if failures < UNREACHABLE_AFTER => None,
        state => Some(state),
    }
}

/// Whether `error` is a 410 Gone (an expired resource version).
fn is_gone(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchError(e) => e.code == 410,
        watcher::Error::WatchFailed(kube::Error::Api(e))
        | watcher::Error::WatchStartFailed(kube::Error::Api(e))
        | watcher::Error::InitialListFailed(kube::Error::Api(e)) => e.code == 410,
        _ => false,
    }
}

/// How long to wait before the watcher may ask again after `error`, beyond its own
/// backoff.
fn retry_after(error: &watcher::Error) -> Option<Duration> {
    (State::of(error) == State::NotServed).then_some(NOT_SERVED_RETRY)
}

/// Watches one source until `cancel`, publishing what it reads.
async fn follow<K>(
    shared: Arc<Shared>,
    source: Source,
    api: Api<K>,
    config: watcher::Config,
    read: fn(&K) -> Read,
    cancel: CancellationToken,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut objects: BTreeMap<String, Vec<Cidr>> = BTreeMap::new();
    let mut relist: Option<BTreeMap<String, Vec<Cidr>>> = None;
    let mut state: Option<State> = None;
    // Errors since the last event that read something.
    let mut failures = 0u32;
    let mut read_once = false;
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => return,
            e = stream.next() => match e { Some(e) => e, None => return },
        };
        let event = match event {
            Ok(e) => {
                failures = 0;
                e
            }
            Err(e) => {
                // A 410 Gone is routine (see `judge`): not a failure in a row.
                if !is_gone(&e) {
                    failures += 1;
                }
                shared.heard(source);
                // The last good CIDRs stay: nothing is forgotten because of a failure.
                if let Some(now) = judge(&e, failures) {
                    let kept = read_once.then(|| objects.values().map(Vec::len).sum());
                    shared
                        .state(source, &mut state, now, Some(e.to_string()), kept)
                        .await;
                } else {
                    tracing::debug!(source = source.label(), error = %e, failures, "local networks watch interrupted; watched again");
                }
                if let Some(wait) = retry_after(&e) {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                continue;
            }
        };
        let apply = |o: &K, into: &mut BTreeMap<String, Vec<Cidr>>| {
            let (cidrs, bad) = read(o);
            into.insert(o.meta().name.clone().unwrap_or_default(), cidrs);
            bad
        };
        let bad = match event {
            Event::Init => {
                relist = Some(BTreeMap::new());
                continue;
            }
            Event::InitApply(o) => apply(&o, relist.get_or_insert_default()),
            Event::InitDone => {
                objects = relist.take().unwrap_or_default();
                // Published before the gate: a first read opens it only once its
                // CIDRs are in the set.
                shared.publish(source, objects.clone());
                read_once = true;
                shared.heard(source);
                shared
                    .state(source, &mut state, State::Read, None, None)
                    .await;
                continue;
            }
            Event::Apply(o) => {
                let bad = apply(&o, &mut objects);
                shared.publish(source, objects.clone());
                bad
            }
            Event::Delete(o) => {
                objects.remove(&o.meta().name.clone().unwrap_or_default());
                shared.publish(source, objects.clone());
                continue;
            }
        };
        shared.malformed(source, bad).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidrs(list: &str) -> Vec<Cidr> {
        Cidr::parse_list(list).unwrap()
    }

    #[test]
    fn the_sources_join_into_service_and_pod_cidrs_and_a_source_replaced_drops_its_old_ones() {
        let mut parts = Parts::default();
        parts.by_source.insert(
            Source::ServiceCidrs,
            [("kubernetes".to_string(), cidrs("10.96.0.0/12"))].into(),
        );
        parts.by_source.insert(
            Source::KubernetesService,
            [("kubernetes".to_string(), cidrs("10.96.0.1/32"))].into(),
        );
        parts.by_source.insert(
            Source::Nodes,
            [
                ("a".to_string(), cidrs("10.244.1.0/24")),
                ("b".to_string(), cidrs("10.244.0.0/24")),
            ]
            .into(),
        );
        let u = parts.union();
        assert_eq!(u.service, cidrs("10.96.0.0/12,10.96.0.1/32"));
        assert_eq!(u.pod, cidrs("10.244.0.0/24,10.244.1.0/24"));
        // A ServiceCIDR removed at run time: no longer refused; the ClusterIP stays.
        parts
            .by_source
            .insert(Source::ServiceCidrs, BTreeMap::new());
        assert_eq!(parts.union().service, cidrs("10.96.0.1/32"));
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("no", "Forbidden")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn watch_errors_map_to_bounded_states() {
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("no", "Forbidden")
                    .with_code(code)
                    .boxed(),
            )
        };
        let table = [
            (
                watcher::Error::InitialListFailed(api(403)),
                State::Forbidden,
            ),
            (watcher::Error::WatchStartFailed(api(403)), State::Forbidden),
            (
                watcher::Error::InitialListFailed(api(404)),
                State::NotServed,
            ),
            (
                watcher::Error::InitialListFailed(api(500)),
                State::Unreachable,
            ),
        ];
        for (error, want) in table {
            assert_eq!(State::of(&error), want, "{error}");
        }
        // A routine interruption (a watch's 410 Gone, a dropped connection) is no change
        // of state; forbidden and not served are at once; other failures only in a row.
        let gone = || {
            watcher::Error::WatchError(
                kube::core::Status::failure("too old resource version", "Expired")
                    .with_code(410)
                    .boxed(),
            )
        };
        let judged = [
            (gone(), 1, None),
            (gone(), 2, None),
            (gone(), 3, None),
            (gone(), 10, None),
            (watcher::Error::WatchFailed(api_error(500)), 1, None),
            (watcher::Error::InitialListFailed(api_error(500)), 2, None),
            (
                watcher::Error::InitialListFailed(api_error(500)),
                3,
                Some(State::Unreachable),
            ),
            (
                watcher::Error::InitialListFailed(api_error(403)),
                1,
                Some(State::Forbidden),
            ),
            (
                watcher::Error::InitialListFailed(api_error(404)),
                1,
                Some(State::NotServed),
            ),
        ];
        for (error, failures, want) in judged {
            assert_eq!(judge(&error, failures), want, "{error} x{failures}");
        }
        // Not served: asked again every 10 minutes, not at the backoff's 30 s.
        assert_eq!(
            retry_after(&watcher::Error::InitialListFailed(api_error(404))),
            Some(Duration::from_secs(600))
        );
        assert_eq!(retry_after(&gone()), None);
        assert_eq!(
            retry_after(&watcher::Error::InitialListFailed(api_error(403))),
            None
        );
        let labels: Vec<&str> = State::ALL.iter().map(|s| s.label()).collect();
        assert_eq!(labels, ["read", "forbidden", "not_served", "unreachable"]);
    }
}
