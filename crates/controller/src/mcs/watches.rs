//! The watches of one cluster's ServiceExports and Services (the local cluster's, or a
//! linked one's through its link's client). Each event becomes a [`Msg`] for the
//! index task, which alone applies them to the index.

use super::Msg;
use super::index::Generation;
use super::resource::{ServiceExport, ServiceImport};
use crate::metrics::{ClusterLabels, Metrics};
use crate::runtime::watch::{Store, Watch, drive};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The index keeps what it needs; the watch keeps nothing.
struct NoStore;

impl<K> Store<K> for NoStore {
    fn apply(&mut self, _: &watcher::Event<K>) {}
}

/// The index reads the spec and three annotations only: `export-to`, and the local
/// export's traffic annotations (a change of either judges the name again: the local
/// export is kept whole and compared).
fn strip_export(e: &mut ServiceExport) {
    use service_mirror_core::traffic::{LOCAL_MINIMUM_ANNOTATION, LOCALITY_ANNOTATION};
    e.metadata.managed_fields = None;
    if let Some(a) = e.metadata.annotations.as_mut() {
        a.retain(|k, _| {
            k == service_mirror_core::mcs::EXPORT_TO_ANNOTATION
                || k == LOCALITY_ANNOTATION
                || k == LOCAL_MINIMUM_ANNOTATION
        });
    }
    e.metadata.labels = None;
}

/// The index reads a Service's spec only (see `index.rs`): the rest is not sent.
pub(super) fn strip_service(s: &mut Service) {
    s.metadata.managed_fields = None;
    s.metadata.annotations = None;
    s.metadata.labels = None;
    s.status = None;
}

/// One cluster's feed: where its events go.
#[derive(Clone)]
pub(super) struct Feed {
    pub(super) cluster: Arc<str>,
    pub(super) generation: Generation,
    pub(super) tx: mpsc::UnboundedSender<Msg>,
    pub(super) metrics: Arc<Metrics>,
}

/// Starts the two watches of `client`'s cluster (the local one's, or a linked one's
/// read through [`super::Mcs::link`]).
pub(super) fn spawn(
    client: &Client,
    feed: Feed,
    cancel: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    vec![
        spawn_exports(client, feed.clone(), cancel),
        tokio::spawn(watch_kind(
            Api::<Service>::all(client.clone()),
            strip_service,
            |cluster, generation, event| Msg::Service {
                cluster,
                generation,
                event,
            },
            "Service",
            watcher::Config::default(),
            feed,
            cancel.clone(),
        )),
    ]
}

/// Starts the ServiceExport watch of `client`'s cluster (a link's: its remote Services
/// come from the link's own remote Service watch, through a [`super::McsFeed`]).
pub(super) fn spawn_exports(
    client: &Client,
    feed: Feed,
    cancel: &CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(watch_kind(
        Api::<ServiceExport>::all(client.clone()),
        strip_export,
        |cluster, generation, event| Msg::Export {
            cluster,
            generation,
            event,
        },
        "ServiceExport",
        watcher::Config::default(),
        feed,
        cancel.clone(),
    ))
}

fn strip_import(i: &mut ServiceImport) {
    i.metadata.managed_fields = None;
}

fn strip_derived(s: &mut Service) {
    s.metadata.managed_fields = None;
}

fn strip_slice(s: &mut EndpointSlice) {
    s.metadata.managed_fields = None;
}

/// A local Service's slice: its service-name label, endpoints and ports are read (what
/// `core::traffic::copy_local_slices` copies, for imports and federated Services),
/// nothing else is kept.
pub(crate) fn strip_local_slice(s: &mut EndpointSlice) {
    use service_mirror_core::labels::SERVICE_NAME_LABEL;
    let meta = &mut s.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    meta.owner_references = None;
    meta.labels = meta.labels.take().map(|l| {
        l.into_iter()
            .filter(|(k, _)| k == SERVICE_NAME_LABEL)
            .collect()
    });
    for e in &mut s.endpoints {
        e.target_ref = None;
        e.hints = None;
        e.deprecated_topology = None;
    }
}

/// The label selector of our headless mirrors' EndpointSlices (`core::slices`'s
/// `headless_slices`): a link's mirror (`mirrored-service=true`), written by us (our
/// managed-by: never Linkerd's Endpoints as kube-controller-manager mirrors them), of a
/// headless mirror. What the clusterset.local zone answers of remote clusters' headless
/// endpoints (`dns_view.rs`).
pub(crate) fn headless_mirror_slice_selector() -> String {
    use service_mirror_core::labels::{
        HEADLESS_SLICE_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE, MIRRORED_SERVICE_LABEL,
        MIRRORED_SERVICE_VALUE,
    };
    format!(
        "{MIRRORED_SERVICE_LABEL}={MIRRORED_SERVICE_VALUE},{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{HEADLESS_SLICE_LABEL}"
    )
}

/// A headless mirror's slice: only what the clusterset.local zone reads is kept (its
/// namespace and name, the labels that say whose it is, which mirror and which
/// cluster, the controller-namespace annotation, and each endpoint's hostname,
/// addresses and readiness).
pub(crate) fn strip_headless_mirror_slice(s: &mut EndpointSlice) {
    use service_mirror_core::labels::{
        CLUSTER_NAME_LABEL, CONTROLLER_NAMESPACE_ANNOTATION, HEADLESS_SLICE_LABEL,
        MANAGED_BY_LABEL, MIRRORED_SERVICE_LABEL, SERVICE_NAME_LABEL,
    };
    let meta = &mut s.metadata;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.generate_name = None;
    meta.creation_timestamp = None;
    meta.generation = None;
    meta.labels = meta.labels.take().map(|l| {
        l.into_iter()
            .filter(|(k, _)| {
                [
                    SERVICE_NAME_LABEL,
                    CLUSTER_NAME_LABEL,
                    MIRRORED_SERVICE_LABEL,
                    MANAGED_BY_LABEL,
                    HEADLESS_SLICE_LABEL,
                ]
                .contains(&k.as_str())
            })
            .collect()
    });
    meta.annotations = meta.annotations.take().map(|a| {
        a.into_iter()
            .filter(|(k, _)| k == CONTROLLER_NAMESPACE_ANNOTATION)
            .collect()
    });
    s.ports = None;
    for e in &mut s.endpoints {
        e.target_ref = None;
        e.hints = None;
        e.deprecated_topology = None;
        e.node_name = None;
        e.zone = None;
        if let Some(c) = e.conditions.as_mut() {
            c.serving = None;
            c.terminating = None;
        }
    }
}

/// Starts the watches of the local cluster's ServiceImports (all: a foreign one must be
/// seen), of our derived Services and of our import EndpointSlices (both by label), of
/// the Services' own EndpointSlices (every one with a service name not managed by
/// us: the endpoints of this cluster's exports, copied into their imports' slices),
/// and of our headless mirrors' EndpointSlices (by label: what the clusterset.local
/// zone answers of remote clusters' headless endpoints).
pub(super) fn spawn_imports(
    client: &Client,
    feed: Feed,
    cancel: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    use service_mirror_core::labels::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, SERVICE_NAME_LABEL};
    use service_mirror_core::mcs_derived::{DERIVED_LABEL, DERIVED_VALUE};
    use service_mirror_core::mcs_import::{IMPORT_LABEL, IMPORT_VALUE};
    vec![
        tokio::spawn(watch_kind(
            Api::<ServiceImport>::all(client.clone()),
            strip_import,
            |_, _, event| Msg::Import(event),
            "ServiceImport",
            watcher::Config::default(),
            feed.clone(),
            cancel.clone(),
        )),
        tokio::spawn(watch_kind(
            Api::<Service>::all(client.clone()),
            strip_derived,
            |_, _, event| Msg::Derived(event),
            "derived Service",
            watcher::Config::default().labels(&format!("{DERIVED_LABEL}={DERIVED_VALUE}")),
            feed.clone(),
            cancel.clone(),
        )),
        tokio::spawn(watch_kind(
            Api::<EndpointSlice>::all(client.clone()),
            strip_slice,
            |_, _, event| Msg::Slice(event),
            "import EndpointSlice",
            watcher::Config::default().labels(&format!("{IMPORT_LABEL}={IMPORT_VALUE}")),
            feed.clone(),
            cancel.clone(),
        )),
        tokio::spawn(watch_kind(
            Api::<EndpointSlice>::all(client.clone()),
            strip_local_slice,
            |_, _, event| Msg::LocalSlice(event),
            "Service EndpointSlice",
            watcher::Config::default().labels(&format!(
                "{SERVICE_NAME_LABEL},{MANAGED_BY_LABEL}!={MANAGED_BY_VALUE}"
            )),
            feed.clone(),
            cancel.clone(),
        )),
        tokio::spawn(watch_kind(
            Api::<EndpointSlice>::all(client.clone()),
            strip_headless_mirror_slice,
            |_, _, event| Msg::HeadlessMirrorSlice(event),
            "headless mirror EndpointSlice",
            watcher::Config::default().labels(&headless_mirror_slice_selector()),
            feed,
            cancel.clone(),
        )),
    ]
}

fn on_error<'a>(feed: &'a Feed, kind: &'static str) -> impl FnMut(&watcher::Error) + 'a {
    move |e| {
        feed.metrics
            .mcs
            .watch_errors
            .get_or_create(&ClusterLabels::of(&feed.cluster))
            .inc();
        // A linked cluster's error carries its text: bounded and cleaned as every remote text.
        let error = crate::links::sanitize_remote_text(&e.to_string());
        tracing::warn!(cluster = %feed.cluster, kind, %error, "MCS watch failed; retrying with backoff (a cluster that never listed counts as exporting nothing)");
    }
}

/// One watch of `api`, each event sent as the message `msg` makes of it.
async fn watch_kind<K>(
    api: Api<K>,
    strip: fn(&mut K),
    msg: fn(Arc<str>, Generation, Box<watcher::Event<K>>) -> Msg,
    kind: &'static str,
    config: watcher::Config,
    feed: Feed,
    cancel: CancellationToken,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let watch = Watch {
        api,
        config,
        strip,
        store: NoStore,
    };
    let on_event = |ev: &watcher::Event<K>| {
        let _ = feed.tx.send(msg(
            feed.cluster.clone(),
            feed.generation,
            Box::new(ev.clone()),
        ));
    };
    drive(watch, cancel, on_event, on_error(&feed, kind)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_keeps_the_export_to_and_traffic_annotations_only() {
        use service_mirror_core::mcs::EXPORT_TO_ANNOTATION;
        use service_mirror_core::traffic::{LOCAL_MINIMUM_ANNOTATION, LOCALITY_ANNOTATION};
        let mut e = ServiceExport::default();
        e.metadata.annotations = Some(
            [
                EXPORT_TO_ANNOTATION,
                LOCALITY_ANNOTATION,
                LOCAL_MINIMUM_ANNOTATION,
                "kubectl.kubernetes.io/last-applied-configuration",
            ]
            .iter()
            .map(|k| (k.to_string(), "v".to_string()))
            .collect(),
        );
        e.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        strip_export(&mut e);
        let kept: Vec<&str> = e
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            kept,
            vec![
                EXPORT_TO_ANNOTATION,
                LOCAL_MINIMUM_ANNOTATION,
                LOCALITY_ANNOTATION
            ]
        );
        assert!(e.metadata.labels.is_none());
    }
}
