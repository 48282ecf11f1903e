//! The index task's keys: built ServiceExports, Services, ServiceImports and feed
//! markers go in as messages; the keys queued and the gate are asserted.

use super::*;
use crate::backoff::Backoff;
use crate::mcs::resource::{ServiceExport, ServiceImport};
use crate::runtime::queue::queued;
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::watcher::Event;
use service_mirror_core::NamespaceFilter;

const LOCAL: &str = "west";

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("shop".into()),
        uid: Some(format!("uid-{name}")),
        resource_version: Some("1".into()),
        creation_timestamp: Some(Time("2026-12-02T10:00:00Z".parse().unwrap())),
        ..Default::default()
    }
}

fn export(name: &str) -> ServiceExport {
    ServiceExport {
        metadata: meta(name),
        ..Default::default()
    }
}

fn service(name: &str, port: i32) -> Service {
    Service {
        metadata: meta(name),
        spec: Some(ServiceSpec {
            ports: Some(vec![k8s_openapi::api::core::v1::ServicePort {
                port,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn import(name: &str) -> ServiceImport {
    ServiceImport {
        metadata: meta(name),
        ..Default::default()
    }
}

/// A complete list of `objects` as watch events.
fn list<K: Clone>(objects: &[K]) -> Vec<Event<K>> {
    let mut events = vec![Event::Init];
    events.extend(objects.iter().cloned().map(Event::InitApply));
    events.push(Event::InitDone);
    events
}

fn exports(cluster: &str, generation: u64, events: Vec<Event<ServiceExport>>) -> Vec<Msg> {
    events
        .into_iter()
        .map(|event| Msg::Export {
            cluster: cluster.into(),
            generation,
            event: Box::new(event),
        })
        .collect()
}

fn services(cluster: &str, generation: u64, events: Vec<Event<Service>>) -> Vec<Msg> {
    events
        .into_iter()
        .map(|event| Msg::Service {
            cluster: cluster.into(),
            generation,
            event: Box::new(event),
        })
        .collect()
}

/// The local imports and derived Services listed (`imports`: the imports there).
fn imports_listed(imports: &[ServiceImport]) -> Vec<Msg> {
    let mut msgs: Vec<Msg> = list(imports)
        .into_iter()
        .map(|e| Msg::Import(Box::new(e)))
        .collect();
    msgs.extend(
        list::<Service>(&[])
            .into_iter()
            .map(|e| Msg::Derived(Box::new(e))),
    );
    msgs
}

fn indexer() -> Indexer {
    let shared = Shared::new(LOCAL, NamespaceFilter::default());
    let queue = WorkQueue::new(Backoff::default(), CancellationToken::new());
    Indexer::new(Arc::new(Mutex::new(shared)), queue, Metrics::new())
}

fn feed(ix: &Indexer, msgs: impl IntoIterator<Item = Msg>) {
    for msg in msgs {
        ix.admit(msg);
    }
}

#[tokio::test]
async fn the_gate_opens_once_the_local_exports_and_services_are_listed_and_queues_every_name() {
    let ix = indexer();
    feed(&ix, exports(LOCAL, 0, list(&[export("web")])));
    assert!(!*ix.ready.borrow(), "the local Services are not listed");
    assert_eq!(
        queued(&ix.queue).await,
        ["shop/web"],
        "a changed name waits in the queue behind the gate"
    );
    feed(&ix, services(LOCAL, 0, list(&[service("web", 80)])));
    assert!(*ix.ready.borrow());
    assert_eq!(
        queued(&ix.queue).await,
        ["shop/web"],
        "every name when it opens, once"
    );
}

#[tokio::test]
async fn an_event_queues_only_the_names_it_changes() {
    let ix = indexer();
    feed(&ix, exports(LOCAL, 0, list(&[export("web")])));
    feed(&ix, services(LOCAL, 0, list(&[service("web", 80)])));
    let _ = queued(&ix.queue).await;
    let steps: Vec<(&str, Vec<Msg>, &[&str])> = vec![
        (
            "a new export",
            exports(LOCAL, 0, vec![Event::Apply(export("api"))]),
            &["shop/api"],
        ),
        (
            "the same export again",
            exports(LOCAL, 0, vec![Event::Apply(export("api"))]),
            &[],
        ),
        (
            "a Service nobody exports",
            services(LOCAL, 0, vec![Event::Apply(service("db", 5432))]),
            &[],
        ),
        (
            "an exported Service's port",
            services(LOCAL, 0, vec![Event::Apply(service("web", 8080))]),
            &["shop/web"],
        ),
        (
            "an export deleted",
            exports(LOCAL, 0, vec![Event::Delete(export("api"))]),
            &["shop/api"],
        ),
        (
            "losing the lead judges nothing",
            vec![Msg::Leader(false)],
            &[],
        ),
        (
            "becoming leader judges every name",
            vec![Msg::Leader(true)],
            &["shop/web"],
        ),
    ];
    for (what, msgs, want) in steps {
        feed(&ix, msgs);
        assert_eq!(queued(&ix.queue).await, want, "{what}");
    }
}

#[tokio::test]
async fn a_linked_cluster_queues_its_exports_and_every_import_once_both_its_lists_are_in() {
    let ix = indexer();
    feed(&ix, exports(LOCAL, 0, list(&[])));
    feed(&ix, services(LOCAL, 0, list(&[])));
    feed(&ix, imports_listed(&[import("old")]));
    assert_eq!(queued(&ix.queue).await, ["shop/old"], "the local import");
    feed(
        &ix,
        [Msg::Feed {
            cluster: "east".into(),
            generation: 1,
        }],
    );
    assert_eq!(
        queued(&ix.queue).await,
        ["shop/old"],
        "a new feed: the imports are looked at (after its hold)"
    );
    feed(&ix, exports("east", 1, list(&[export("api")])));
    assert_eq!(queued(&ix.queue).await, ["shop/api"], "its export changed");
    feed(&ix, services("east", 1, list(&[service("api", 80)])));
    assert_eq!(
        queued(&ix.queue).await,
        ["shop/api", "shop/old"],
        "its exports, and the import it may have held up"
    );
    feed(
        &ix,
        [Msg::Ended {
            cluster: "east".into(),
            generation: 1,
        }],
    );
    assert_eq!(
        queued(&ix.queue).await,
        ["shop/api", "shop/old"],
        "its feed ended: its exports leave"
    );
}

#[tokio::test]
async fn the_import_lists_gateways_and_link_changes_queue_the_imports() {
    let ix = indexer();
    feed(&ix, exports(LOCAL, 0, list(&[export("web")])));
    feed(&ix, services(LOCAL, 0, list(&[service("web", 80)])));
    let _ = queued(&ix.queue).await;
    // Only the imports' list: not yet both lists.
    feed(
        &ix,
        list(&[import("old")])
            .into_iter()
            .map(|e| Msg::Import(Box::new(e))),
    );
    assert_eq!(queued(&ix.queue).await, ["shop/old"]);
    feed(
        &ix,
        list::<Service>(&[])
            .into_iter()
            .map(|e| Msg::Derived(Box::new(e))),
    );
    assert_eq!(
        queued(&ix.queue).await,
        ["shop/old", "shop/web"],
        "both import lists in: every name"
    );
    let gateway = service_mirror_core::mcs_slices::SourceGateway {
        gateway: service_mirror_core::ResolvedGateway::new(["192.0.2.1".parse().unwrap()], 4143),
        domain: "cluster.local".into(),
    };
    let report = |gateway: Option<service_mirror_core::mcs_slices::SourceGateway>| Msg::Gateway {
        cluster: "east".into(),
        generation: Some(1),
        gateway,
    };
    feed(&ix, [report(Some(gateway.clone()))]);
    assert_eq!(
        queued(&ix.queue).await,
        ["shop/old"],
        "a gateway: every import"
    );
    feed(&ix, [report(Some(gateway))]);
    assert!(queued(&ix.queue).await.is_empty(), "the same gateway again");
    feed(&ix, [Msg::Removed("east".into())]);
    assert_eq!(queued(&ix.queue).await, ["shop/old"], "a link removed");
    feed(&ix, [Msg::Expect(["east".to_string()].into())]);
    assert_eq!(
        queued(&ix.queue).await,
        ["shop/old"],
        "the linked clusters said"
    );
}

#[tokio::test]
async fn a_links_remote_service_events_reach_the_index_through_its_mcs_feed() {
    let ix = indexer();
    feed(&ix, exports(LOCAL, 0, list(&[])));
    feed(&ix, services(LOCAL, 0, list(&[])));
    feed(&ix, imports_listed(&[]));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let link = crate::mcs::McsFeed {
        tx,
        cluster: "east".into(),
        generation: 1,
    };
    // The link's remote watch: a full Service, as the link's strip leaves it.
    let mut api = service("api", 80);
    api.metadata.labels = Some([("app".to_string(), "api".to_string())].into());
    let events = [
        Event::Init,
        Event::InitApply(api.clone()),
        Event::InitApply(service("other", 81)),
        Event::InitDone,
    ];
    let mut msgs = vec![Msg::Feed {
        cluster: "east".into(),
        generation: 1,
    }];
    msgs.extend(exports("east", 1, list(&[export("api")])));
    for event in &events {
        link.remote_event(event);
    }
    while let Ok(msg) = rx.try_recv() {
        if let Msg::Service { event, .. } = &msg
            && let Event::InitApply(s) = &**event
        {
            assert!(s.metadata.labels.is_none(), "sent stripped: {s:?}");
        }
        msgs.push(msg);
    }
    feed(&ix, msgs);
    assert_eq!(
        queued(&ix.queue).await,
        ["shop/api"],
        "its exported Service counts once the link's list is in"
    );
    assert_eq!(
        ix.shared
            .lock()
            .index
            .exports(&ServiceKey::new("shop", "api"))
            .len(),
        1
    );
    // A relist cut short (no InitDone) drops nothing.
    link.remote_event(&Event::Init);
    let msg = rx.try_recv().unwrap();
    feed(&ix, [msg]);
    assert!(queued(&ix.queue).await.is_empty());
    let exports = ix
        .shared
        .lock()
        .index
        .exports(&ServiceKey::new("shop", "api"));
    assert!(exports[0].service.is_some(), "the Service stays");
}

#[tokio::test]
async fn a_cluster_that_lists_queues_every_name_not_only_its_own_exports() {
    let ix = indexer();
    feed(&ix, exports(LOCAL, 0, list(&[export("web")])));
    feed(&ix, services(LOCAL, 0, list(&[service("web", 80)])));
    feed(&ix, imports_listed(&[]));
    feed(
        &ix,
        [Msg::Feed {
            cluster: "east".into(),
            generation: 1,
        }],
    );
    let _ = queued(&ix.queue).await;
    // east lists without web: web, judged during east's hold, is looked at now, not
    // at the hold's end.
    feed(&ix, exports("east", 1, list(&[export("api")])));
    feed(&ix, services("east", 1, list(&[service("api", 80)])));
    assert_eq!(queued(&ix.queue).await, ["shop/api", "shop/web"]);
}
