//! Shared pieces of the wire tests (root: network namespaces): clusters with data
//! planes, and the measure of a failover after a gateway dies.

use local_cluster::{ClusterOptions, LocalCluster};
use std::future::Future;
use std::time::{Duration, Instant};

/// A local cluster with a data plane (kube-controller-manager, kube-proxy, CoreDNS in a
/// node namespace); its start time printed.
pub(crate) async fn data_plane_cluster(name: &str) -> LocalCluster {
    let started = Instant::now();
    let c = LocalCluster::start_with(
        name,
        ClusterOptions {
            data_plane: true,
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("start {name} with a data plane: {e}"));
    eprintln!(
        "{name}: ready with its data plane in {:?}",
        started.elapsed()
    );
    c
}

/// What requests saw after a gateway was killed.
pub(crate) struct Failover {
    /// When the dead cluster's slice first said not ready (after the kill).
    pub(crate) verdict: Duration,
    /// When the first window of requests all answered by the survivor began.
    pub(crate) failover: Duration,
    /// Every request until the end of that window: when, and its answer.
    pub(crate) log: Vec<(Duration, Result<String, String>)>,
    /// Index in `log` where the window begins.
    pub(crate) start: usize,
}

impl Failover {
    /// Requests before the window answered `by` (an error: `None`).
    pub(crate) fn before(&self, by: Option<&str>) -> usize {
        self.log[..self.start]
            .iter()
            .filter(|(_, r)| r.as_ref().ok().map(String::as_str) == by)
            .count()
    }
}

/// After a gateway was killed at `killed`: a request (`ask`: the answering cluster, or
/// the error) every 100 ms, bounded at 60 s, until `not_ready` has said the dead
/// cluster's slice is not ready and a window of 20 requests in a row was answered by
/// `survivor`. Panics if either never happens.
pub(crate) async fn await_failover<A, AF, V, VF>(
    killed: Instant,
    survivor: &str,
    ask: A,
    not_ready: V,
) -> Failover
where
    A: Fn() -> AF,
    AF: Future<Output = Result<String, String>>,
    V: Fn() -> VF,
    VF: Future<Output = bool>,
{
    const WINDOW: usize = 20;
    let mut verdict: Option<Duration> = None;
    let mut log: Vec<(Duration, Result<String, String>)> = Vec::new();
    let mut since: Option<usize> = None;
    while killed.elapsed() < Duration::from_secs(60) {
        if verdict.is_none() && not_ready().await {
            verdict = Some(killed.elapsed());
        }
        let r = ask().await;
        let survived = r.as_deref() == Ok(survivor);
        log.push((killed.elapsed(), r));
        match (survived, since) {
            (true, None) => since = Some(log.len() - 1),
            (false, _) => since = None,
            _ => {}
        }
        if since.is_some_and(|i| log.len() - i >= WINDOW) && verdict.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let start = since.unwrap_or_else(|| panic!("a window of requests all answered by {survivor}"));
    Failover {
        verdict: verdict.expect("the dead cluster's slice turned not ready"),
        failover: log[start].0,
        log,
        start,
    }
}

/// `shop/web` of `c` (selectorless, labelled `labels`, port http 80 → 8080), its
/// Endpoints the workload this starts on the node, answering `body`.
pub(crate) async fn serve_web(
    c: &LocalCluster,
    body: &str,
    labels: serde_json::Value,
) -> local_cluster::Workload {
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{Api, PostParams};
    let client = c.client().await.unwrap();
    super::create_namespace(&client, "shop").await;
    let dp = c.data_plane().unwrap();
    let workload = dp.serve_http(8080, body).unwrap();
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "shop", "labels": labels},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), "shop")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let node = dp.node_ip().to_string();
    local_cluster::publish_endpoints(&client, "shop", "web", &node, &[("http", 8080)])
        .await
        .unwrap();
    workload
}

/// A `Link` of `cluster` (on `remote`) in `ctl_ns` through `wc`, with credentials
/// `kubeconfig`, through the stand-in gateway on the remote's node, probed every
/// `period` and dead after `threshold` failures.
pub(crate) async fn link_through_gateway(
    wc: &kube::Client,
    ctl_ns: &str,
    cluster: &str,
    remote: &LocalCluster,
    kubeconfig: &str,
    (period, threshold): (Duration, u32),
) {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, PostParams};
    use service_mirror_controller::links::LinkResource;
    let secret = format!("cluster-credentials-{cluster}");
    Api::<Secret>::namespaced(wc.clone(), ctl_ns)
        .create(
            &PostParams::default(),
            &super::links::credentials_secret(&secret, kubeconfig),
        )
        .await
        .unwrap();
    let ip = remote.data_plane().unwrap().node_ip().to_string();
    let l = super::links::link(
        cluster,
        cluster,
        &secret,
        serde_json::json!({
            "gatewayAddress": ip,
            "gatewayPort": local_cluster::GATEWAY_PORT.to_string(),
            "probeSpec": {"port": local_cluster::PROBE_PORT.to_string(), "path": "/ready",
                "period": format!("{}s", period.as_secs()), "timeout": "1s",
                "failureThreshold": threshold.to_string()},
        }),
    );
    Api::<LinkResource>::namespaced(wc.clone(), ctl_ns)
        .create(&PostParams::default(), &l)
        .await
        .unwrap();
}

/// Whether every endpoint of the first slice in `shop` that `selector` picks is ready
/// (None: no such slice yet).
pub(crate) async fn slice_ready(client: &kube::Client, selector: &str) -> Option<bool> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, ListParams};
    let list = Api::<EndpointSlice>::namespaced(client.clone(), "shop")
        .list(&ListParams::default().labels(selector))
        .await
        .ok()?;
    let slice = list.items.first()?;
    Some(
        slice
            .endpoints
            .iter()
            .all(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true)),
    )
}

/// Requests (`ask`) until each of `clusters` has answered one, at most 400 (25 ms
/// apart after an answer, 250 ms after a miss): how many each answered, and the number
/// of requests.
pub(crate) async fn until_each_answers<A, AF>(clusters: &[&str], ask: A) -> (Vec<usize>, usize)
where
    A: Fn() -> AF,
    AF: Future<Output = Result<String, String>>,
{
    let mut seen = vec![0; clusters.len()];
    let mut tries = 0;
    while seen.contains(&0) && tries < 400 {
        tries += 1;
        match ask().await {
            Ok(body) if clusters.contains(&body.as_str()) => {
                let i = clusters.iter().position(|c| *c == body).expect("listed");
                seen[i] += 1;
                // Answers alone take milliseconds: 400 of them in a row could end before
                // a cluster whose endpoints are still becoming ready (a gateway probe)
                // had a chance; paced, the 400 tries span at least 10 s.
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    (seen, tries)
}

/// `shop/web`'s one workload (at `node`) ready (its Endpoints' `addresses`) or not
/// (`notReadyAddresses`, as a pod failing its readiness probe): a merge patch replaces
/// the subsets whole.
pub(crate) async fn home_ready(wc: &kube::Client, node: std::net::Ipv4Addr, ready: bool) {
    use k8s_openapi::api::core::v1::Endpoints;
    use kube::api::{Api, Patch, PatchParams};
    let list = if ready {
        "addresses"
    } else {
        "notReadyAddresses"
    };
    let patch = serde_json::json!({"subsets": [{
        list: [{"ip": node.to_string()}],
        "ports": [{"name": "http", "port": 8080}],
    }]});
    Api::<Endpoints>::namespaced(wc.clone(), "shop")
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// A switch of the traffic to `to`: a request (`ask`) every 50 ms from `since`
/// (bounded: 30 s) until 10 in a row are answered by `to`; then 20 more, each of which
/// must be. The time from `since` to the first of the 10, and the requests that failed
/// before it.
pub(crate) async fn switch<A, AF>(
    since: Instant,
    to: &str,
    ask: A,
    ctl: &super::controller::Controller,
) -> (Duration, usize)
where
    A: Fn() -> AF,
    AF: Future<Output = Result<String, String>>,
{
    const WINDOW: usize = 10;
    let (mut run, mut first, mut failed) = (0, None, 0);
    while run < WINDOW {
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "traffic to {to} within 30 s\ncontroller:\n{}",
            ctl.log_text()
        );
        let at = since.elapsed();
        match ask().await {
            Ok(body) if body == to => {
                first = first.or(Some(at));
                run += 1;
            }
            Ok(_) => (first, run) = (None, 0),
            Err(_) => (first, run, failed) = (None, 0, failed + 1),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..20 {
        let r = ask().await;
        assert_eq!(r.as_deref(), Ok(to), "request {i} after the switch to {to}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (first.expect("a window began"), failed)
}
