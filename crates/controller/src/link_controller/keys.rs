//! Watch events → keys to reconcile: pure functions over the index and the caches (no
//! I/O). A key is a remote Service's namespace/name; every local mirror object stands
//! for one. The table in docs/architecture.md lists what each event queues.

use super::cache::Cache;
use super::expect::LocalObject;
use super::index::{Index, Local};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use service_mirror_core::labels::SERVICE_NAME_LABEL;
use service_mirror_core::{
    ExportDecision, ExportPolicy, ExportRule, GatewayRef, ServiceKey, Withheld, export_decision,
    remote_key,
};

/// The key of a remote Service.
pub(super) fn remote_service_key(svc: &Service) -> ServiceKey {
    ServiceKey::new(svc.namespace().unwrap_or_default(), svc.name_any())
}

/// The key a local mirror Service stands for: from its fq-name annotation, or, for one
/// of ours without it, its own name (so it is collected as an orphan).
pub(super) fn service_key(svc: &Service) -> ServiceKey {
    remote_key(&svc.metadata).unwrap_or_else(|| remote_service_key(svc))
}

/// The key a local mirror Endpoints stands for: its annotation, else that of the Service
/// of the same name (the Go mirror wrote no annotation on Endpoints), else its name.
pub(super) fn endpoints_key(local_services: &Cache<Service>, ep: &Endpoints) -> ServiceKey {
    let ns = ep.namespace().unwrap_or_default();
    remote_key(&ep.metadata)
        .or_else(|| {
            let svc = local_services.get(&ObjectRef::new(&ep.name_any()).within(&ns))?;
            Some(service_key(&svc))
        })
        .unwrap_or_else(|| ServiceKey::new(ns, ep.name_any()))
}

/// The key an EndpointSlice of ours stands for: its annotation, else that of the
/// Service it names (`kubernetes.io/service-name`), else its name.
pub(super) fn slice_key(local_services: &Cache<Service>, slice: &EndpointSlice) -> ServiceKey {
    let ns = slice.namespace().unwrap_or_default();
    remote_key(&slice.metadata)
        .or_else(|| {
            let service = slice.labels().get(SERVICE_NAME_LABEL)?;
            let svc = local_services.get(&ObjectRef::new(service).within(&ns))?;
            Some(service_key(&svc))
        })
        .unwrap_or_else(|| ServiceKey::new(ns, slice.name_any()))
}

/// The keys to queue for a remote Service event; keeps the gateway index up to date.
/// On `InitDone` (a full list replaced the cache `remote`) the index is rebuilt from it
/// and every key is queued, so objects deleted while we were not watching are collected.
pub(super) fn keys_for_remote(
    index: &mut Index,
    remote: &Cache<Service>,
    export: &ExportPolicy,
    ev: &watcher::Event<Service>,
) -> Vec<ServiceKey> {
    let mut keys = Vec::new();
    match ev {
        watcher::Event::Apply(svc) | watcher::Event::Delete(svc) => {
            let key = remote_service_key(svc);
            let decision = match ev {
                watcher::Event::Apply(_) => export_decision(svc, export),
                _ => ExportDecision::NotExported,
            };
            index.set_gateway(&key, decision.gateway().cloned());
            index.set_discovery(&key, decision == ExportDecision::RemoteDiscovery);
            // The Service may itself be a gateway of other exported Services (a Link's
            // gateway is no remote Service).
            if export.rule == ExportRule::GatewayAnnotations {
                keys.extend(index.users_of(&GatewayRef::new(&key.namespace, &key.name)));
            }
            keys.push(key);
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
        watcher::Event::InitDone => {
            // The store was replaced by a full list: rebuild the index from it and look at
            // every key, so objects deleted while we were not watching are collected.
            index.clear_gateways();
            remote.for_each(|svc| match export_decision(svc, export) {
                ExportDecision::RemoteDiscovery => {
                    index.set_discovery(&remote_service_key(svc), true)
                }
                // Withheld for a reason to tell (an invalid export-to, this cluster
                // unnamed): looked at, so a start says it (once per episode).
                ExportDecision::Withheld(Withheld::Invalid(_) | Withheld::NoClusterName)
                | ExportDecision::InvalidMemberExportTo(_) => keys.push(remote_service_key(svc)),
                decision => {
                    if let Some(gw) = decision.gateway() {
                        index.set_gateway(&remote_service_key(svc), Some(gw.clone()));
                    }
                }
            });
            keys.extend(index.all_keys());
        }
    }
    keys
}

/// Which local index a local object kind uses, and which key an object stands for.
pub(super) trait LocalKind:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + serde::Serialize
    + Send
    + Sync
    + 'static
{
    /// The kind, for the expectations.
    const OBJECT: LocalObject;
    /// Its part of the index.
    fn index(index: &mut Index) -> Local<'_>;
    /// The key `obj` stands for (an Endpoints may need the local Services cache).
    fn key(local_services: &Cache<Service>, obj: &Self) -> ServiceKey;
}

impl LocalKind for Service {
    const OBJECT: LocalObject = LocalObject::Service;
    fn index(index: &mut Index) -> Local<'_> {
        index.services()
    }
    fn key(_: &Cache<Service>, obj: &Self) -> ServiceKey {
        service_key(obj)
    }
}

impl LocalKind for Endpoints {
    const OBJECT: LocalObject = LocalObject::Endpoints;
    fn index(index: &mut Index) -> Local<'_> {
        index.endpoints()
    }
    fn key(local_services: &Cache<Service>, obj: &Self) -> ServiceKey {
        endpoints_key(local_services, obj)
    }
}

impl LocalKind for EndpointSlice {
    const OBJECT: LocalObject = LocalObject::EndpointSlice;
    fn index(index: &mut Index) -> Local<'_> {
        index.slices()
    }
    fn key(local_services: &Cache<Service>, obj: &Self) -> ServiceKey {
        slice_key(local_services, obj)
    }
}

/// The keys to queue for a local mirror event (of `store`'s kind); keeps the local index
/// up to date. A renamed key (the object now stands for another) queues the old key too.
pub(super) fn keys_for_local<K: LocalKind>(
    index: &mut Index,
    local_services: &Cache<Service>,
    store: &Cache<K>,
    ev: &watcher::Event<K>,
) -> Vec<ServiceKey> {
    let mut keys = Vec::new();
    if matches!(ev, watcher::Event::InitDone) {
        keys.extend(index.exported().cloned());
    }
    let mut local = K::index(index);
    match ev {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
            let key = K::key(local_services, o);
            if let Some(old) = local.set(
                &o.namespace().unwrap_or_default(),
                &o.name_any(),
                key.clone(),
            ) && old != key
            {
                keys.push(old);
            }
            if matches!(ev, watcher::Event::Apply(_)) {
                keys.push(key);
            }
        }
        watcher::Event::Delete(o) => {
            keys.extend(local.remove(&o.namespace().unwrap_or_default(), &o.name_any()))
        }
        watcher::Event::Init => {}
        watcher::Event::InitDone => {
            // Keys of objects gone while we were not watching are looked at too (so a
            // mirror deleted meanwhile is recreated), as is every exported key (above).
            keys.extend(local.keys().map(|k| (**k).clone()));
            local.clear();
            store.for_each(|o| {
                local.set(
                    &o.namespace().unwrap_or_default(),
                    &o.name_any(),
                    K::key(local_services, o),
                );
            });
            keys.extend(local.keys().map(|k| (**k).clone()));
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use service_mirror_core::NamespaceFilter;
    use std::collections::BTreeSet;
    use watcher::Event;

    fn policy() -> ExportPolicy {
        ExportPolicy {
            namespaces: NamespaceFilter::default(),
            ..ExportPolicy::default()
        }
    }

    fn key(ns: &str, name: &str) -> ServiceKey {
        ServiceKey::new(ns, name)
    }

    /// A remote Service exported through gateway `mc/gw` (None: not exported).
    fn remote(ns: &str, name: &str, gateway: Option<&str>) -> Service {
        let annotations = match gateway {
            Some(gw) => serde_json::json!({
                "mirror.linkerd.io/gateway-name": gw,
                "mirror.linkerd.io/gateway-ns": "mc"}),
            None => serde_json::json!({}),
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "1",
                "annotations": annotations},
            "spec": {"ports": [{"name": "http", "port": 80}]}
        }))
        .unwrap()
    }

    /// A local mirror object `ns/name` standing for remote key `fq` (None: no annotation).
    fn local<K: serde::de::DeserializeOwned>(ns: &str, name: &str, fq: Option<&str>) -> K {
        let annotations = match fq {
            Some(fq) => serde_json::json!({"mirror.linkerd.io/remote-svc-fq-name": fq}),
            None => serde_json::json!({}),
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "1",
                "labels": {"mirror.linkerd.io/mirrored-service": "true",
                    "mirror.linkerd.io/cluster-name": "east"},
                "annotations": annotations}
        }))
        .unwrap()
    }

    fn set(keys: Vec<ServiceKey>) -> BTreeSet<ServiceKey> {
        keys.into_iter().collect()
    }

    /// Feeds events to a remote mapping; returns the keys of the last one.
    fn feed_remote(
        index: &mut Index,
        cache: &Cache<Service>,
        events: Vec<Event<Service>>,
    ) -> BTreeSet<ServiceKey> {
        let mut last = Vec::new();
        for ev in events {
            cache.apply_watcher_event(&ev);
            last = keys_for_remote(index, cache, &policy(), &ev);
        }
        set(last)
    }

    #[test]
    fn an_exported_service_queues_its_key_on_apply_and_delete() {
        let (mut index, cache) = (Index::default(), Cache::default());
        let web = remote("shop", "web", Some("gw"));
        let keys = feed_remote(&mut index, &cache, vec![Event::Apply(web.clone())]);
        assert_eq!(keys, set(vec![key("shop", "web")]));
        assert_eq!(
            index.users_of(&GatewayRef::new("mc", "gw")),
            vec![key("shop", "web")]
        );
        let keys = feed_remote(&mut index, &cache, vec![Event::Delete(web)]);
        assert_eq!(keys, set(vec![key("shop", "web")]), "its mirror is to go");
        assert!(index.gateways().is_empty());
    }

    #[test]
    fn a_service_not_exported_queues_its_key_but_uses_no_gateway() {
        let (mut index, cache) = (Index::default(), Cache::default());
        let plain = remote("shop", "db", None);
        let keys = feed_remote(&mut index, &cache, vec![Event::Apply(plain)]);
        assert_eq!(keys, set(vec![key("shop", "db")]));
        assert_eq!(index.exported().count(), 0);
    }

    #[test]
    fn a_gateway_service_queues_every_service_exported_through_it() {
        let (mut index, cache) = (Index::default(), Cache::default());
        feed_remote(
            &mut index,
            &cache,
            vec![
                Event::Apply(remote("shop", "web", Some("gw"))),
                Event::Apply(remote("shop", "api", Some("gw"))),
                Event::Apply(remote("shop", "other", Some("gw2"))),
            ],
        );
        let gw = remote("mc", "gw", None);
        let keys = feed_remote(&mut index, &cache, vec![Event::Apply(gw.clone())]);
        assert_eq!(
            keys,
            set(vec![
                key("mc", "gw"),
                key("shop", "web"),
                key("shop", "api")
            ])
        );
        let keys = feed_remote(&mut index, &cache, vec![Event::Delete(gw)]);
        assert!(keys.contains(&key("shop", "web")) && keys.contains(&key("shop", "api")));
    }

    #[test]
    fn a_list_queues_the_keys_withheld_for_a_reason_to_tell_and_no_other() {
        let (mut index, cache) = (Index::default(), Cache::default());
        let narrowed = |name: &str, to: &str| {
            let mut s = remote("shop", name, Some("gw"));
            s.metadata
                .annotations
                .get_or_insert_default()
                .insert("service-mirror.io/export-to".into(), to.into());
            s
        };
        let mut events = vec![Event::Init];
        events.extend(
            [
                narrowed("invalid", "east,Bad_Name"),
                narrowed("elsewhere", "west"),
                narrowed("unnamed", "east"),
                remote("shop", "plain", None),
            ]
            .map(Event::InitApply),
        );
        events.push(Event::InitDone);
        let list = |index: &mut Index, local: Option<&str>| {
            let policy = ExportPolicy {
                local_cluster: local.map(str::to_owned),
                ..policy()
            };
            let mut last = Vec::new();
            for ev in &events {
                cache.apply_watcher_event(ev);
                last = keys_for_remote(index, &cache, &policy, ev);
            }
            set(last)
        };
        // Named `north`: only the invalid list is said (`unnamed` lists east: not listed).
        assert_eq!(
            list(&mut index, Some("north")),
            set(vec![key("shop", "invalid")])
        );
        assert!(index.gateways().is_empty(), "withheld keys use no gateway");
        // Unnamed: every narrowed Service is said (once per link, by the reconcile).
        assert_eq!(
            list(&mut index, None),
            set(vec![
                key("shop", "invalid"),
                key("shop", "elsewhere"),
                key("shop", "unnamed")
            ])
        );
    }

    #[test]
    fn a_relist_rebuilds_the_index_and_queues_keys_gone_while_not_watching() {
        let (mut index, cache) = (Index::default(), Cache::default());
        feed_remote(
            &mut index,
            &cache,
            vec![
                Event::Apply(remote("shop", "web", Some("gw"))),
                Event::Apply(remote("shop", "gone", Some("gw"))),
            ],
        );
        // A local mirror of a key whose remote Service is not exported any more.
        index.services().set("shop", "old-east", key("shop", "old"));
        let keys = feed_remote(
            &mut index,
            &cache,
            vec![
                Event::Init,
                Event::InitApply(remote("shop", "web", Some("gw"))),
                Event::InitApply(remote("shop", "new", Some("gw"))),
                Event::InitDone,
            ],
        );
        assert_eq!(
            keys,
            set(vec![
                key("shop", "web"),
                key("shop", "new"),
                key("shop", "old")
            ]),
            "every exported key and every key a local mirror stands for"
        );
        let users = set(index.users_of(&GatewayRef::new("mc", "gw")));
        assert_eq!(users, set(vec![key("shop", "web"), key("shop", "new")]));
        // `gone` left the index: its mirror is found through the local index instead.
        assert!(!users.contains(&key("shop", "gone")));
    }

    #[test]
    fn list_events_before_init_done_queue_nothing() {
        let (mut index, cache) = (Index::default(), Cache::default());
        let keys = feed_remote(
            &mut index,
            &cache,
            vec![
                Event::Init,
                Event::InitApply(remote("shop", "web", Some("gw"))),
            ],
        );
        assert!(keys.is_empty());
    }

    #[test]
    fn a_local_mirror_queues_the_key_it_stands_for() {
        let (mut index, services) = (Index::default(), Cache::<Service>::default());
        let svc: Service = local("shop", "web-east", Some("web.shop.svc.cluster.local"));
        let ev = Event::Apply(svc.clone());
        services.apply_watcher_event(&ev);
        let keys = keys_for_local(&mut index, &services, &services, &ev);
        assert_eq!(keys, vec![key("shop", "web")]);
        assert_eq!(index.local_names(&key("shop", "web")).0, vec!["web-east"]);
        let ev = Event::Delete(svc);
        services.apply_watcher_event(&ev);
        let keys = keys_for_local(&mut index, &services, &services, &ev);
        assert_eq!(keys, vec![key("shop", "web")]);
        assert!(index.local_keys().is_empty());
    }

    #[test]
    fn an_endpoint_mirror_queues_its_headless_parents_key_not_its_own() {
        let (mut index, services) = (Index::default(), Cache::<Service>::default());
        let mut svc: Service = local(
            "shop",
            "web-0-east",
            Some("web-0.web.shop.svc.cluster.local"),
        );
        svc.metadata.labels.as_mut().unwrap().insert(
            "mirror.linkerd.io/headless-mirror-svc-name".into(),
            "web-east".into(),
        );
        let parent: Service = local("shop", "web-east", Some("web.shop.svc.cluster.local"));
        for s in [&svc, &parent] {
            let ev = Event::Apply(s.clone());
            services.apply_watcher_event(&ev);
            let keys = keys_for_local(&mut index, &services, &services, &ev);
            assert_eq!(keys, vec![key("shop", "web")]);
        }
        assert_eq!(
            index.local_names(&key("shop", "web")).0,
            vec!["web-0-east", "web-east"],
            "gathered with the parent"
        );
        assert!(index.local_names(&key("shop", "web-0-east")).0.is_empty());
        // Its deletion (a pod gone, or someone else) brings the parent's key back.
        let ev = Event::Delete(svc);
        services.apply_watcher_event(&ev);
        assert_eq!(
            keys_for_local(&mut index, &services, &services, &ev),
            vec![key("shop", "web")]
        );
    }

    #[test]
    fn local_endpoints_without_annotation_map_to_the_key_of_their_service() {
        let mut index = Index::default();
        let (services, endpoints) = (Cache::<Service>::default(), Cache::<Endpoints>::default());
        let svc: Service = local("shop", "web-east", Some("web.shop.svc.cluster.local"));
        services.apply_watcher_event(&Event::Apply(svc));
        // The Go mirror wrote no annotation on Endpoints.
        let ep: Endpoints = local("shop", "web-east", None);
        let ev = Event::Apply(ep);
        endpoints.apply_watcher_event(&ev);
        let keys = keys_for_local(&mut index, &services, &endpoints, &ev);
        assert_eq!(keys, vec![key("shop", "web")]);
        // Without a Service of the same name, the Endpoints stand for their own name.
        let stray: Endpoints = local("shop", "stray", None);
        let keys = keys_for_local(&mut index, &services, &endpoints, &Event::Apply(stray));
        assert_eq!(keys, vec![key("shop", "stray")]);
    }

    /// An EndpointSlice of ours named `name` of mirror Service `service` (None: no
    /// fq-name annotation).
    fn slice(name: &str, service: &str, fq: Option<&str>) -> EndpointSlice {
        let annotations = match fq {
            Some(fq) => serde_json::json!({"mirror.linkerd.io/remote-svc-fq-name": fq}),
            None => serde_json::json!({}),
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop", "resourceVersion": "1",
                "labels": {"mirror.linkerd.io/mirrored-service": "true",
                    "mirror.linkerd.io/cluster-name": "east",
                    "kubernetes.io/service-name": service,
                    "endpointslice.kubernetes.io/managed-by": "service-mirror.linkerd.io"},
                "annotations": annotations},
            "addressType": "IPv4",
            "endpoints": []
        }))
        .unwrap()
    }

    #[test]
    fn drift_on_a_slice_queues_its_mirror_key() {
        let mut index = Index::default();
        let (services, slices) = (
            Cache::<Service>::default(),
            Cache::<EndpointSlice>::default(),
        );
        let ev = Event::Apply(slice(
            "web-east-ipv4-0",
            "web-east",
            Some("web.shop.svc.cluster.local"),
        ));
        slices.apply_watcher_event(&ev);
        assert_eq!(
            keys_for_local(&mut index, &services, &slices, &ev),
            vec![key("shop", "web")]
        );
        assert_eq!(
            index.slice_names(&key("shop", "web")),
            vec!["web-east-ipv4-0"]
        );
        assert!(index.local_keys().contains(&key("shop", "web")));
        // Deleted (by someone else): the key is queued, so it is created again.
        let ev = Event::Delete(slice("web-east-ipv4-0", "web-east", None));
        slices.apply_watcher_event(&ev);
        assert_eq!(
            keys_for_local(&mut index, &services, &slices, &ev),
            vec![key("shop", "web")]
        );
        assert!(index.slice_names(&key("shop", "web")).is_empty());
    }

    #[test]
    fn a_slice_without_annotation_maps_to_the_key_of_the_service_it_names() {
        let mut index = Index::default();
        let (services, slices) = (
            Cache::<Service>::default(),
            Cache::<EndpointSlice>::default(),
        );
        let svc: Service = local("shop", "web-east", Some("web.shop.svc.cluster.local"));
        services.apply_watcher_event(&Event::Apply(svc));
        let table = [
            (
                slice("web-east-ipv4-0", "web-east", None),
                key("shop", "web"),
            ),
            (slice("x-ipv4-0", "gone", None), key("shop", "x-ipv4-0")),
        ];
        for (s, want) in table {
            let keys = keys_for_local(&mut index, &services, &slices, &Event::Apply(s));
            assert_eq!(keys, vec![want]);
        }
    }

    #[test]
    fn a_renamed_local_key_queues_the_old_key_and_the_new() {
        let (mut index, services) = (Index::default(), Cache::<Service>::default());
        let before: Service = local("shop", "web-east", Some("web.shop.svc.cluster.local"));
        keys_for_local(&mut index, &services, &services, &Event::Apply(before));
        let after: Service = local("shop", "web-east", Some("api.shop.svc.cluster.local"));
        let keys = keys_for_local(&mut index, &services, &services, &Event::Apply(after));
        assert_eq!(set(keys), set(vec![key("shop", "web"), key("shop", "api")]));
        assert!(index.local_names(&key("shop", "web")).0.is_empty());
    }

    #[test]
    fn a_local_relist_queues_exported_keys_and_keys_of_mirrors_gone_meanwhile() {
        let (mut index, services) = (Index::default(), Cache::<Service>::default());
        index.set_gateway(&key("shop", "web"), Some(GatewayRef::new("mc", "gw")));
        let gone: Service = local("shop", "gone-east", Some("gone.shop.svc.cluster.local"));
        keys_for_local(&mut index, &services, &services, &Event::Apply(gone));
        let kept: Service = local("shop", "kept-east", Some("kept.shop.svc.cluster.local"));
        let mut last = Vec::new();
        for ev in [Event::Init, Event::InitApply(kept), Event::InitDone] {
            services.apply_watcher_event(&ev);
            last = keys_for_local(&mut index, &services, &services, &ev);
        }
        assert_eq!(
            set(last),
            set(vec![
                key("shop", "web"),
                key("shop", "gone"),
                key("shop", "kept")
            ])
        );
        assert_eq!(index.local_keys().len(), 1, "index rebuilt from the list");
    }
}
