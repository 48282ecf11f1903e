//! A federated Service on the wire (issue 16 point 2): local `west` and remotes `east`
//! and `north` with data planes (kube-controller-manager, kube-proxy, CoreDNS), each
//! remote exporting `shop/web` as a federated member (its workload answers with the
//! cluster's name) behind the stand-in gateway on its node, linked by `Link`s to the
//! real `service-mirror run` binary on west. Requests from west's node namespace to
//! `web-federated.shop.svc.cluster.local` go through west's kube-proxy, which reads the
//! per-cluster EndpointSlices the federation writes. Needs root (network namespaces).

mod support;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};
use local_cluster::{
    ClusterOptions, DataPlane, Gateway, LocalCluster, Workload, publish_endpoints,
    skip_without_data_plane,
};
use service_mirror_controller::links::{LINK_CRD_YAML, LinkResource};
use std::time::{Duration, Instant};
use support::controller::Controller;
use support::links::{allowed_kubeconfig, credentials_secret, link};
use support::*;

const FEDERATED: &str = "web-federated.shop.svc.cluster.local";
/// The Links' probe: every second, dead after three failures.
const PROBE_PERIOD: Duration = Duration::from_secs(1);
const PROBE_THRESHOLD: u32 = 3;

async fn data_plane_cluster(name: &str) -> LocalCluster {
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

/// A remote's member `shop/web` (selectorless, its Endpoints the workload on the node,
/// answering `body`), and its stand-in gateway on the node address.
async fn remote_member(c: &LocalCluster, body: &str, cluster: &str) -> (Workload, Gateway) {
    let client = c.client().await.unwrap();
    create_namespace(&client, "shop").await;
    let dp = c.data_plane().unwrap();
    let workload = dp.serve_http(8080, body).unwrap();
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "shop",
            "labels": {"mirror.linkerd.io/federated": "member", "app": "web"}},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), "shop")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    publish_endpoints(
        &client,
        "shop",
        "web",
        &dp.node_ip().to_string(),
        &[("http", 8080)],
    )
    .await
    .unwrap();
    let gateway = dp.start_gateway(cluster).unwrap();
    (workload, gateway)
}

/// Links `cluster` (on `remote`) from west's controller in `ctl_ns`.
async fn link_remote(wc: &kube::Client, ctl_ns: &str, cluster: &str, remote: &LocalCluster) {
    let kc = allowed_kubeconfig(remote, "shop", "reader").await;
    let secret = format!("cluster-credentials-{cluster}");
    Api::<Secret>::namespaced(wc.clone(), ctl_ns)
        .create(
            &PostParams::default(),
            &credentials_secret(&secret, &kc.yaml),
        )
        .await
        .unwrap();
    let ip = remote.data_plane().unwrap().node_ip().to_string();
    let l = link(
        cluster,
        cluster,
        &secret,
        serde_json::json!({
            "gatewayAddress": ip,
            "gatewayPort": local_cluster::GATEWAY_PORT.to_string(),
            "probeSpec": {"port": local_cluster::PROBE_PORT.to_string(), "path": "/ready",
                "period": format!("{}s", PROBE_PERIOD.as_secs()), "timeout": "1s",
                "failureThreshold": PROBE_THRESHOLD.to_string()},
        }),
    );
    Api::<LinkResource>::namespaced(wc.clone(), ctl_ns)
        .create(&PostParams::default(), &l)
        .await
        .unwrap();
}

/// Whether east's federated slice is ready (None: no such slice yet).
async fn east_ready(wc: &kube::Client) -> Option<bool> {
    let lp = ListParams::default().labels(
        "kubernetes.io/service-name=web-federated,service-mirror.linkerd.io/federated-cluster=east",
    );
    let list = Api::<EndpointSlice>::namespaced(wc.clone(), "shop")
        .list(&lp)
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

/// One request to the federated Service from west's node: the answering cluster, or
/// the error.
async fn ask(wp: &DataPlane) -> Result<String, String> {
    match wp.http_get(FEDERATED, 80, "/").await {
        Ok(a) if a.status == 200 => Ok(a.body),
        Ok(a) => Err(format!("status {}: {}", a.status, a.body)),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_federated_service_spreads_over_both_remotes_and_fails_over_when_one_gateway_dies() {
    if skip_without_data_plane("a_federated_service_spreads_over_both_remotes") {
        return;
    }
    let (west, east, north) = tokio::join!(
        data_plane_cluster("west-fed"),
        data_plane_cluster("east-fed"),
        data_plane_cluster("north-fed")
    );
    let (_east_web, east_gw) = remote_member(&east, "east", "east").await;
    let (_north_web, _north_gw) = remote_member(&north, "north", "north").await;
    let wc = west.client().await.unwrap();
    create_namespace(&wc, "shop").await;
    local_cluster::apply_yaml(&wc, LINK_CRD_YAML).await.unwrap();
    eventually("the Link CRD is served", || async {
        Api::<LinkResource>::namespaced(wc.clone(), "default")
            .list(&Default::default())
            .await
            .ok()
    })
    .await;
    let ctl_ns = local_cluster::unique_namespace("smfed");
    create_namespace(&wc, &ctl_ns).await;
    let ctl = Controller::spawn(&west, &ctl_ns, &["--namespace-allow", "shop"]);
    ctl.wait_ready().await;
    let linked = Instant::now();
    link_remote(&wc, &ctl_ns, "east", &east).await;
    link_remote(&wc, &ctl_ns, "north", &north).await;

    let svc = eventually("web-federated with both members", || async {
        Api::<Service>::namespaced(wc.clone(), "shop")
            .get_opt("web-federated")
            .await
            .ok()
            .flatten()
            .filter(|s| {
                annotation(&s.metadata, "multicluster.linkerd.io/remote-discovery")
                    == Some("web@east,web@north")
            })
    })
    .await;
    eprintln!(
        "web-federated {} with members east and north {:?} after the Links",
        svc.spec
            .as_ref()
            .and_then(|s| s.cluster_ip.clone())
            .unwrap_or_default(),
        linked.elapsed()
    );

    // Both remotes answer through their gateways: bounded, 400 requests at most.
    let wp = west.data_plane().unwrap();
    let (mut seen_east, mut seen_north, mut tries) = (0, 0, 0);
    let spread = Instant::now();
    while (seen_east == 0 || seen_north == 0) && tries < 400 {
        tries += 1;
        match ask(wp).await.as_deref() {
            Ok("east") => seen_east += 1,
            Ok("north") => seen_north += 1,
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    assert!(
        seen_east > 0 && seen_north > 0,
        "requests reach both remotes: east {seen_east}, north {seen_north} of {tries}\ncontroller:\n{}",
        ctl.log_text()
    );
    eprintln!(
        "requests reach both remotes (east {seen_east}, north {seen_north} of {tries}, {:?})",
        spread.elapsed()
    );

    // East's gateway dies. Requests every 100 ms, bounded at 60 s: east's slice turns not
    // ready at the probe verdict, then kube-proxy sends everything to north.
    drop(east_gw);
    let killed = Instant::now();
    let mut verdict: Option<Duration> = None;
    let mut log: Vec<(Duration, Result<String, String>)> = Vec::new();
    let window = 20;
    let mut all_north_since: Option<usize> = None;
    while killed.elapsed() < Duration::from_secs(60) {
        if verdict.is_none() && east_ready(&wc).await == Some(false) {
            verdict = Some(killed.elapsed());
        }
        let r = ask(wp).await;
        let north_ok = r.as_deref() == Ok("north");
        log.push((killed.elapsed(), r));
        match (north_ok, all_north_since) {
            (true, None) => all_north_since = Some(log.len() - 1),
            (false, _) => all_north_since = None,
            _ => {}
        }
        if all_north_since.is_some_and(|i| log.len() - i >= window) && verdict.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let start = all_north_since.expect("a window of requests all answered by north");
    let failover = log[start].0;
    let verdict = verdict.expect("east's slice turned not ready");
    let failed_after_verdict = log
        .iter()
        .filter(|(t, r)| *t > verdict && r.is_err())
        .count();
    let east_before: usize = log
        .iter()
        .filter(|(_, r)| r.as_deref() == Ok("east"))
        .count();
    eprintln!(
        "east's gateway killed: probe verdict in the slice after {verdict:?}, first all-north window after {failover:?} (requests until then: {} to north, {east_before} to east, {} failed; failed after the verdict: {failed_after_verdict})",
        log[..start]
            .iter()
            .filter(|(_, r)| r.as_deref() == Ok("north"))
            .count(),
        log[..start].iter().filter(|(_, r)| r.is_err()).count(),
    );
    let bound = PROBE_PERIOD * PROBE_THRESHOLD + Duration::from_secs(10);
    assert!(failover <= bound, "failover {failover:?} within {bound:?}");

    // After it: every request goes to north, zero failures (100 requests, bounded).
    for i in 0..100 {
        let r = ask(wp).await;
        assert_eq!(r.as_deref(), Ok("north"), "request {i} after the failover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("100 requests after the failover: all answered by north");
    drop(ctl);
}
