//! The remote EndpointSlice watch of a link, fed built objects: its store (the readiness
//! and hostname tables, the holds) and its callback, asserting the keys it queues.

use super::*;
use crate::backoff::Backoff;
use crate::runtime::Outcome;
use service_mirror_core::labels::{HEADLESS_SLICE_LABEL, SERVICE_NAME_LABEL};
use service_mirror_core::{NamespaceFilter, StalePolicy};
use std::collections::BTreeSet;
use std::time::Duration;

fn slice(service: &str, name: &str, ready: bool, headless: bool) -> EndpointSlice {
    let mut labels = serde_json::json!({SERVICE_NAME_LABEL: service});
    if headless {
        labels[HEADLESS_SLICE_LABEL] = serde_json::json!("");
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "shop", "labels": labels},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.1"], "hostname": format!("{service}-0"),
            "conditions": {"ready": ready}}],
    }))
    .unwrap()
}

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("shop", name)
}

/// The slice watch of one link, without the driver: events go to its store, then to
/// its callback, as the driver hands them.
struct Harness {
    store: ReadinessStore,
    events: RemoteSliceEvents,
    queue: WorkQueue<ServiceKey>,
    readiness: Arc<Mutex<RemoteReadiness>>,
    hostnames: Arc<Mutex<RemoteHostnames>>,
}

impl Harness {
    fn new() -> Self {
        let queue = WorkQueue::new(Backoff::default(), CancellationToken::new());
        let readiness: Arc<Mutex<RemoteReadiness>> = Arc::default();
        let hostnames = Arc::new(Mutex::new(RemoteHostnames::new(
            false,
            NamespaceFilter::default(),
        )));
        let holds: Arc<Holds> = Arc::default();
        let events = RemoteSliceEvents {
            cluster: "east".into(),
            readiness: Some(readiness.clone()),
            hostnames: Some(hostnames.clone()),
            index: Arc::default(),
            remote: Cache::default(),
            queue: queue.clone(),
            health: Arc::new(RemoteHealth::new(StalePolicy::default())),
            holds: holds.clone(),
        };
        let store = ReadinessStore {
            readiness: Some(readiness.clone()),
            hostnames: Some(hostnames.clone()),
            holds,
        };
        Self {
            store,
            events,
            queue,
            readiness,
            hostnames,
        }
    }

    fn event(&mut self, ev: watcher::Event<EndpointSlice>) {
        self.store.apply(&ev);
        self.events.on_event(&ev);
    }

    fn list(&mut self, slices: Vec<EndpointSlice>) {
        self.event(watcher::Event::Init);
        for s in slices {
            self.event(watcher::Event::InitApply(s));
        }
        self.event(watcher::Event::InitDone);
    }

    /// The keys queued now, each handed out and done.
    async fn queued(&self) -> BTreeSet<ServiceKey> {
        let mut keys = BTreeSet::new();
        while self.queue.depth() > 0 {
            let k = self.queue.next().await.unwrap();
            self.queue.done(k.clone(), Outcome::Done);
            keys.insert(k);
        }
        keys
    }
}

fn keys(names: &[&str]) -> BTreeSet<ServiceKey> {
    names.iter().map(|n| key(n)).collect()
}

#[tokio::test(start_paused = true)]
async fn slice_events_queue_the_keys_whose_readiness_or_hostnames_changed() {
    let mut h = Harness::new();
    h.list(vec![slice("web", "web-1", true, false)]);
    assert_eq!(h.queued().await, keys(&["web"]), "the first list");
    let steps: Vec<(&str, watcher::Event<EndpointSlice>, &[&str])> = vec![
        (
            "a second ready slice: readiness unchanged",
            watcher::Event::Apply(slice("web", "web-2", true, false)),
            &[],
        ),
        (
            "a headless slice: its hostnames are news",
            watcher::Event::Apply(slice("db", "db-1", false, true)),
            &["db"],
        ),
        (
            "the same headless slice again: nothing",
            watcher::Event::Apply(slice("db", "db-1", false, true)),
            &[],
        ),
        (
            "web's slices go unready one by one: the last one counts",
            watcher::Event::Apply(slice("web", "web-1", false, false)),
            &[],
        ),
        (
            "the last ready slice goes",
            watcher::Event::Delete(slice("web", "web-2", true, false)),
            &["web"],
        ),
    ];
    for (what, ev, want) in steps {
        h.event(ev);
        assert_eq!(h.queued().await, keys(want), "{what}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_slices_list_queues_every_remote_service_also_one_the_index_does_not_know() {
    let h = Harness::new();
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "api", "namespace": "shop"},
    }))
    .unwrap();
    h.events
        .remote
        .apply_watcher_event(&watcher::Event::Apply(svc));
    let mut h = h;
    h.list(vec![slice("web", "web-1", true, false)]);
    assert_eq!(h.queued().await, keys(&["api", "web"]));
}

#[tokio::test(start_paused = true)]
async fn an_empty_slice_list_after_an_outage_is_held_until_the_hold_ends() {
    let mut h = Harness::new();
    h.list(vec![
        slice("web", "web-1", true, false),
        slice("db", "db-1", true, true),
    ]);
    h.queued().await;
    // The watch fails, then lists nothing (an apiserver recovering may answer so).
    h.events.on_error(&watcher::Error::NoResourceVersion);
    h.list(vec![]);
    h.queued().await;
    assert!(h.readiness.lock().ready(&key("web")), "readiness held");
    assert_eq!(
        h.hostnames.lock().slices(&key("db")).len(),
        1,
        "hostnames held"
    );
    // The hold is the link's grace, clamped to 5-30 s.
    let hold = h.events.health.relist_hold();
    tokio::time::sleep(hold - Duration::from_millis(100)).await;
    assert!(h.readiness.lock().ready(&key("web")), "still held");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!h.readiness.lock().ready(&key("web")), "the hold ended");
    assert!(h.hostnames.lock().slices(&key("db")).is_empty());
    assert_eq!(h.queued().await, keys(&["db", "web"]), "both views changed");
}

#[tokio::test(start_paused = true)]
async fn a_second_list_ends_a_hold_at_once_and_one_without_an_outage_is_trusted() {
    let mut h = Harness::new();
    h.list(vec![slice("web", "web-1", true, false)]);
    h.queued().await;
    h.events.on_error(&watcher::Error::NoResourceVersion);
    h.list(vec![]);
    assert!(h.readiness.lock().ready(&key("web")), "held");
    h.queued().await;
    // A second complete list, no outage since: trusted, the hold ends now.
    h.list(vec![]);
    assert!(!h.readiness.lock().ready(&key("web")));
    assert_eq!(h.queued().await, keys(&["web"]));
    // The first hold's timer, running out later, changes nothing.
    h.list(vec![slice("web", "web-1", true, false)]);
    h.queued().await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(h.readiness.lock().ready(&key("web")));
    assert!(h.queued().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_refused_slice_watch_queues_every_key_once_and_counts_services_ready() {
    let mut h = Harness::new();
    h.events.index.lock().set_discovery(&key("web"), true);
    let forbidden = || {
        watcher::Error::InitialListFailed(kube::Error::Api(
            kube::core::Status::failure("forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        ))
    };
    h.events.on_error(&forbidden());
    assert!(h.readiness.lock().listed(), "not waited for");
    assert!(
        h.readiness.lock().ready(&key("web")),
        "unknown counts as ready"
    );
    assert_eq!(
        h.queued().await,
        keys(&["web"]),
        "keys that waited look again"
    );
    // kube retries: Init again, refused again: no news.
    h.event(watcher::Event::Init);
    h.events.on_error(&forbidden());
    assert!(h.queued().await.is_empty());
}
