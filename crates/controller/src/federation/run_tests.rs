//! The federation on the runtime against a fake apiserver: what is written, when, and
//! how a failed write comes back (through the work queue's backoff, not a task per
//! retry).

use super::*;
use crate::leader::Leadership;
use http_body_util::{BodyExt, Full};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector;
use service_mirror_core::federated::MemberGateway;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// Answers every request: a Service create fails (500) while `fail` says so, other
/// creates echo their object (201), anything else is 404. Reports each Service create.
#[derive(Clone)]
struct FakeApi {
    fail: Arc<AtomicBool>,
    creates: mpsc::UnboundedSender<Instant>,
    /// The path of every create, in order.
    posts: Arc<parking_lot::Mutex<Vec<String>>>,
    /// Set false at the first slice create (the lead lost in the middle of a plan).
    lose_lead: Arc<parking_lot::Mutex<Option<Arc<tokio::sync::watch::Sender<bool>>>>>,
}

type Reply = http::Response<Full<bytes::Bytes>>;

fn reply(code: u16, body: Vec<u8>) -> Reply {
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(body.into()))
        .unwrap()
}

fn status(code: u16, reason: &str) -> Reply {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": reason, "reason": reason, "code": code,
    });
    reply(code, body.to_string().into_bytes())
}

impl tower_service::Service<http::Request<kube::client::Body>> for FakeApi {
    type Response = Reply;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Reply, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            if parts.method == http::Method::PUT {
                return Ok(reply(200, body.to_vec()));
            }
            if parts.method != http::Method::POST {
                return Ok(status(404, "NotFound"));
            }
            this.posts.lock().push(parts.uri.path().to_owned());
            if parts.uri.path().ends_with("/endpointslices")
                && let Some(lead) = this.lose_lead.lock().take()
            {
                lead.send_replace(false);
            }
            if parts.uri.path().ends_with("/services") {
                let _ = this.creates.send(Instant::now());
                if this.fail.load(Ordering::SeqCst) {
                    return Ok(status(500, "InternalError"));
                }
            }
            Ok(reply(201, body.to_vec()))
        })
    }
}

struct Running {
    posts: Arc<parking_lot::Mutex<Vec<String>>>,
    tx: mpsc::UnboundedSender<Msg>,
    fail: Arc<AtomicBool>,
    creates: mpsc::UnboundedReceiver<Instant>,
    cancel: CancellationToken,
}

/// The federation over empty stores and the fake apiserver, with a local member
/// `shop/web` and everything listed (no links).
fn start(leader: Option<Leadership>, fail: bool) -> Running {
    start_with(leader, fail, None, None)
}

fn start_with(
    leader: Option<Leadership>,
    fail: bool,
    lose_lead: Option<Arc<tokio::sync::watch::Sender<bool>>>,
    stored: Option<Service>,
) -> Running {
    let (creates_tx, creates) = mpsc::unbounded_channel();
    let fail = Arc::new(AtomicBool::new(fail));
    let posts = Arc::default();
    let api = FakeApi {
        fail: fail.clone(),
        creates: creates_tx,
        posts: Arc::clone(&posts),
        lose_lead: Arc::new(parking_lot::Mutex::new(lose_lead)),
    };
    let client = Client::new(api, "default");
    let (services, mut writer) = reflector::store();
    if let Some(svc) = stored {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(svc));
    }
    let (slices, _) = reflector::store();
    let opts = FederationOptions {
        controller_namespace: "mc".into(),
        local_selector: None,
        leader,
        write_gates: None,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    run_on(
        client.clone(),
        EventRecorder::new(client, None),
        Metrics::new(),
        &opts,
        watches::Stored { services, slices },
        (tx.clone(), rx),
        &cancel,
    );
    for msg in [
        Msg::LocalListing,
        Msg::Local {
            key: ServiceKey::new("shop", "web"),
            service: Some(Box::new(web())),
        },
        Msg::LocalListed,
        Msg::Expect {
            clusters: Vec::new(),
        },
        Msg::StoreListed(true),
        Msg::StoreListed(false),
    ] {
        tx.send(msg).unwrap();
    }
    Running {
        posts,
        tx,
        fail,
        creates,
        cancel,
    }
}

fn web() -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
            ports: Some(vec![k8s_openapi::api::core::v1::ServicePort {
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The next Service create within `within` (of paused time), if any.
async fn next_create(run: &mut Running, within: Duration) -> Option<Instant> {
    tokio::time::timeout(within, run.creates.recv())
        .await
        .ok()
        .flatten()
}

#[tokio::test(start_paused = true)]
async fn a_failed_federated_write_is_retried_by_the_queue_1s_doubling_and_stops_once_written() {
    let mut run = start(None, true);
    let minute = Duration::from_secs(60);
    let mut at = vec![next_create(&mut run, minute).await.expect("first create")];
    for _ in 0..3 {
        at.push(next_create(&mut run, minute).await.expect("a retry"));
    }
    let gaps: Vec<u64> = at.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
    assert_eq!(gaps, [1, 2, 4], "the queue's backoff, growing");
    run.fail.store(false, Ordering::SeqCst);
    let written = next_create(&mut run, minute).await.expect("the next retry");
    assert_eq!((written - at[3]).as_secs(), 8);
    assert_eq!(
        next_create(&mut run, Duration::from_secs(600)).await,
        None,
        "written: no retry left (the stores hold nothing, so only a retry would create)"
    );
    run.cancel.cancel();
    drop(run.tx);
}

#[tokio::test(start_paused = true)]
async fn nothing_is_written_until_leading_and_then_every_key_is_planned() {
    let (lead, leader) = Leadership::manual(false);
    let mut run = start(Some(leader), false);
    assert_eq!(
        next_create(&mut run, Duration::from_secs(120)).await,
        None,
        "a follower writes nothing"
    );
    lead.send_replace(true);
    assert!(
        next_create(&mut run, Duration::from_secs(60))
            .await
            .is_some(),
        "the new leader plans shop/web"
    );
    run.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_lead_lost_in_the_middle_of_a_plan_stops_its_writes_until_leading_again() {
    use service_mirror_core::labels::{CONTROLLER_NAMESPACE_ANNOTATION, FEDERATED_LABEL};
    let (lead, leader) = Leadership::manual(true);
    let lead = Arc::new(lead);
    // Our stored federated Service: the plan updates it, then creates a slice per
    // remote cluster (east, west). The fake API takes the lead away at the first slice.
    let stored = Service {
        metadata: ObjectMeta {
            name: Some("web-federated".into()),
            namespace: Some("shop".into()),
            uid: Some("u1".into()),
            labels: Some([(FEDERATED_LABEL.into(), "true".into())].into()),
            annotations: Some([(CONTROLLER_NAMESPACE_ANNOTATION.into(), "mc".into())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut run = start_with(Some(leader), false, Some(lead.clone()), Some(stored));
    for (generation, cluster) in [(1, "east"), (2, "west")] {
        let link = Arc::new(LinkIdentity {
            cluster: cluster.into(),
            created: None,
            domain: "cluster.local".into(),
            exclusions: Default::default(),
            link: None,
        });
        let gateway = MemberGateway {
            addresses: vec![format!("198.18.1.{generation}").parse().unwrap()],
            port: 4143,
            identity: None,
            alive: true,
            dead: vec![],
        };
        for msg in [
            Msg::Feed {
                cluster: cluster.into(),
                generation,
            },
            Msg::Member {
                link,
                generation,
                service: Box::new(web()),
            },
            Msg::Gateway {
                cluster: cluster.into(),
                generation,
                gateway: Some(gateway),
            },
        ] {
            run.tx.send(msg).unwrap();
        }
    }
    let posts = run.posts.clone();
    let slices = move || {
        posts
            .lock()
            .iter()
            .filter(|p| p.ends_with("/endpointslices"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while slices() == 0 && Instant::now() < deadline {
        let _ = next_create(&mut run, Duration::from_secs(1)).await;
    }
    assert_eq!(
        slices(),
        1,
        "the first slice is written (and the lead lost)"
    );
    let _ = next_create(&mut run, Duration::from_secs(120)).await;
    assert_eq!(slices(), 1, "no write after the lead was lost");
    lead.send_replace(true);
    let deadline = Instant::now() + Duration::from_secs(60);
    while slices() < 3 && Instant::now() < deadline {
        let _ = next_create(&mut run, Duration::from_secs(1)).await;
    }
    assert!(slices() >= 3, "leading again: the key was planned again");
    run.cancel.cancel();
}
