//! The federation's local watches: the local members (`--federated-service-selector`)
//! and our stored federated Services and slices (label-selected: our federated mark).
//! Each event becomes a [`Msg`] for the index task, which alone takes them in.

use super::{FederationOptions, Msg};
use crate::runtime::watch::{Store, Watch, drive};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{reflector, watcher};
use kube::{Client, Resource};
use service_mirror_core::labels::{
    LOCAL_DISCOVERY_ANNOTATION, MIRRORED_SERVICE_LABEL, REMOTE_DISCOVERY_ANNOTATION,
    REMOTE_SVC_FQ_NAME_ANNOTATION, federated_selector,
};
use service_mirror_core::{ServiceKey, parse_fq_name};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The reconcile's view of our stored federated objects (read by the workers).
#[derive(Clone)]
pub(super) struct Stored {
    pub(super) services: reflector::Store<Service>,
    pub(super) slices: reflector::Store<EndpointSlice>,
}

/// Local members are not stored here: the index holds them.
struct NoStore;

impl<K> Store<K> for NoStore {
    fn apply(&mut self, _: &watcher::Event<K>) {}
}

fn strip<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

/// The member key a stored federated Service stands for: the `<svc>` of its
/// local-discovery or remote-discovery annotation (never parsed from its name, which
/// may be cut and hashed).
pub(super) fn key_of_service(svc: &Service) -> Option<ServiceKey> {
    let ns = svc.metadata.namespace.as_deref()?;
    let ann = svc.metadata.annotations.as_ref()?;
    let name = ann.get(LOCAL_DISCOVERY_ANNOTATION).cloned().or_else(|| {
        ann.get(REMOTE_DISCOVERY_ANNOTATION)?
            .split(',')
            .find_map(|e| e.trim().rsplit_once('@').map(|(s, _)| s.to_owned()))
    })?;
    (!name.is_empty()).then(|| ServiceKey::new(ns, name))
}

/// The member key of one of our federated slices (its `remote-svc-fq-name`; a copy of
/// the local member's: its `local-discovery`).
fn key_of_slice(slice: &EndpointSlice) -> Option<ServiceKey> {
    let annotations = slice.metadata.annotations.as_ref()?;
    if let Some(svc) = annotations.get(LOCAL_DISCOVERY_ANNOTATION) {
        let ns = slice.metadata.namespace.as_deref()?;
        return (!svc.is_empty()).then(|| ServiceKey::new(ns, svc));
    }
    let fq = annotations.get(REMOTE_SVC_FQ_NAME_ANNOTATION)?;
    let key = parse_fq_name(fq)?;
    (slice.metadata.namespace.as_deref() == Some(key.namespace.as_str())).then_some(key)
}

/// Starts the watches; returns the stores of our federated objects (for reconcile)
/// and the tasks.
pub(super) fn spawn(
    local: &Client,
    opts: &FederationOptions,
    tx: &mpsc::UnboundedSender<Msg>,
    cancel: &CancellationToken,
) -> (Stored, Vec<JoinHandle<()>>) {
    let (services, services_writer) = reflector::store::<Service>();
    let (slices, slices_writer) = reflector::store::<EndpointSlice>();
    let stored = Stored { services, slices };
    let mut tasks = vec![
        tokio::spawn(watch_stored::<Service>(
            Api::all(local.clone()),
            services_writer,
            tx.clone(),
            cancel.clone(),
            key_of_service,
            true,
        )),
        tokio::spawn(watch_stored::<EndpointSlice>(
            Api::all(local.clone()),
            slices_writer,
            tx.clone(),
            cancel.clone(),
            key_of_slice,
            false,
        )),
    ];
    match &opts.local_selector {
        Some(selector) => tasks.push(tokio::spawn(local_members(
            Api::all(local.clone()),
            selector.clone(),
            tx.clone(),
            cancel.clone(),
        ))),
        // No local members: listed at once.
        None => {
            let _ = tx.send(Msg::LocalListing);
            let _ = tx.send(Msg::LocalListed);
        }
    }
    (stored, tasks)
}

async fn watch_stored<K>(
    api: Api<K>,
    store: Writer<K>,
    tx: mpsc::UnboundedSender<Msg>,
    cancel: CancellationToken,
    key_of: fn(&K) -> Option<ServiceKey>,
    services: bool,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let watch = Watch {
        api,
        config: watcher::Config::default().labels(&federated_selector()),
        strip: strip::<K>,
        store,
    };
    let on_event = |ev: &watcher::Event<K>| match ev {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => {
            if let Some(k) = key_of(o) {
                let _ = tx.send(Msg::Stored(k));
            }
        }
        watcher::Event::InitDone => {
            let _ = tx.send(Msg::StoreListed(services));
        }
        watcher::Event::Init => {}
    };
    let on_error = |e: &watcher::Error| tracing::warn!(kind = %K::kind(&()), error = %e, "federated objects watch failed; retrying with backoff");
    drive(watch, cancel, on_event, on_error).await
}

/// Watches the one Service `namespace/name` that holds `key`'s federated name without
/// our mark: tells the index task whether it is still there (foreign), so that no create is
/// tried (each would be a 409) until it changes or goes.
pub(super) async fn watch_foreign(
    client: Client,
    key: ServiceKey,
    name: String,
    controller_namespace: String,
    tx: mpsc::UnboundedSender<Msg>,
    cancel: CancellationToken,
) {
    let watch = Watch {
        api: Api::<Service>::namespaced(client, &key.namespace),
        config: watcher::Config::default().fields(&format!("metadata.name={name}")),
        strip: strip::<Service>,
        store: NoStore,
    };
    let mut listed = false;
    let on_event = |ev: &watcher::Event<Service>| {
        let present = match ev {
            watcher::Event::Init => {
                listed = false;
                return;
            }
            watcher::Event::InitApply(s) | watcher::Event::Apply(s) => {
                listed = true;
                !service_mirror_core::is_owned_federated(&s.metadata, &controller_namespace)
            }
            watcher::Event::Delete(_) => false,
            // An empty list: gone.
            watcher::Event::InitDone if !listed => false,
            watcher::Event::InitDone => return,
        };
        let _ = tx.send(Msg::Foreign {
            key: key.clone(),
            present,
        });
    };
    let on_error = |e: &watcher::Error| tracing::warn!(error = %e, "foreign federated Service watch failed; retrying with backoff");
    drive(watch, cancel, on_event, on_error).await
}

async fn local_members(
    api: Api<Service>,
    selector: String,
    tx: mpsc::UnboundedSender<Msg>,
    cancel: CancellationToken,
) {
    let watch = Watch {
        api,
        config: watcher::Config::default().labels(&selector),
        strip: strip::<Service>,
        store: NoStore,
    };
    let on_event = |ev: &watcher::Event<Service>| {
        let msg = match ev {
            watcher::Event::Init => Msg::LocalListing,
            watcher::Event::InitDone => Msg::LocalListed,
            watcher::Event::Apply(s) | watcher::Event::InitApply(s) => {
                let Some(key) = ServiceKey::from_meta(&s.metadata) else {
                    return;
                };
                // A mirror (ours, Linkerd's) copies its remote's labels: never a member,
                // or a federated Service would federate itself.
                let mirror = s
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(MIRRORED_SERVICE_LABEL));
                Msg::Local {
                    key,
                    service: (!mirror).then(|| Box::new(s.clone())),
                }
            }
            watcher::Event::Delete(s) => match ServiceKey::from_meta(&s.metadata) {
                Some(key) => Msg::Local { key, service: None },
                None => return,
            },
        };
        let _ = tx.send(msg);
    };
    let on_error = |e: &watcher::Error| tracing::warn!(error = %e, "local federated member watch failed; retrying with backoff");
    drive(watch, cancel, on_event, on_error).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn svc(annotations: &[(&str, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("x-federated".into()),
                namespace: Some("shop".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn stored_service_key_comes_from_its_annotations() {
        let l = LOCAL_DISCOVERY_ANNOTATION;
        let r = REMOTE_DISCOVERY_ANNOTATION;
        type Row<'a> = (Vec<(&'a str, &'a str)>, Option<ServiceKey>);
        let table: Vec<Row> = vec![
            (vec![(l, "web")], Some(ServiceKey::new("shop", "web"))),
            (
                vec![(r, "web@east,web@north")],
                Some(ServiceKey::new("shop", "web")),
            ),
            (vec![(r, "")], None),
            (vec![], None),
        ];
        for (ann, want) in table {
            assert_eq!(key_of_service(&svc(&ann)), want, "{ann:?}");
        }
    }

    #[test]
    fn a_stored_slice_maps_to_its_member_key_a_local_copy_by_local_discovery() {
        let slice = |ns: &str, annotations: &[(&str, &str)]| EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        let web = Some(ServiceKey::new("shop", "web"));
        let fq = REMOTE_SVC_FQ_NAME_ANNOTATION;
        let local = LOCAL_DISCOVERY_ANNOTATION;
        let rows = [
            (
                slice("shop", &[(fq, "web.shop.svc.cluster.local")]),
                web.clone(),
            ),
            (slice("shop", &[(local, "web")]), web.clone()),
            (slice("shop", &[(local, "")]), None),
            (slice("other", &[(fq, "web.shop.svc.cluster.local")]), None),
            (slice("shop", &[]), None),
        ];
        for (s, want) in rows {
            assert_eq!(key_of_slice(&s), want, "{:?}", s.metadata.annotations);
        }
    }
}
