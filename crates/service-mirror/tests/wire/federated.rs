//! A federated Service on the wire (issue 16 point 2): local `west` and remotes `east`
//! and `north` with data planes (kube-controller-manager, kube-proxy, CoreDNS), each
//! remote exporting `shop/web` as a federated member (its workload answers with the
//! cluster's name) behind the stand-in gateway on its node, linked by `Link`s to the
//! real `service-mirror run` binary on west. Requests from west's node namespace to
//! `web-federated.shop.svc.cluster.local` go through west's kube-proxy, which reads the
//! per-cluster EndpointSlices the federation writes. Needs root (network namespaces).

use crate::support::controller::Controller;
use crate::support::links::allowed_kubeconfig;
use crate::support::wire::{
    await_failover, data_plane_cluster, home_ready, link_through_gateway, serve_web, slice_ready,
    switch, until_each_answers,
};
use crate::support::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use local_cluster::{DataPlane, Gateway, LocalCluster, Workload, skip_without_data_plane};
use service_mirror_controller::links::{LINK_CRD_YAML, LinkResource};
use std::time::{Duration, Instant};

const FEDERATED: &str = "web-federated.shop.svc.cluster.local";
/// The Links' probe: every second, dead after three failures.
const PROBE_PERIOD: Duration = Duration::from_secs(1);
const PROBE_THRESHOLD: u32 = 3;

/// A remote's member `shop/web` (selectorless, its Endpoints the workload on the node,
/// answering `body`), and its stand-in gateway on the node address.
async fn remote_member(c: &LocalCluster, body: &str, cluster: &str) -> (Workload, Gateway) {
    let labels = serde_json::json!({"mirror.linkerd.io/federated": "member", "app": "web"});
    let workload = serve_web(c, body, labels).await;
    let dp = c.data_plane().unwrap();
    let gateway = dp.start_gateway(cluster).unwrap();
    (workload, gateway)
}

/// Links `cluster` (on `remote`) from west's controller in `ctl_ns`.
async fn link_remote(wc: &kube::Client, ctl_ns: &str, cluster: &str, remote: &LocalCluster) {
    let kc = allowed_kubeconfig(remote, "shop", "reader").await;
    let probe = (PROBE_PERIOD, PROBE_THRESHOLD);
    link_through_gateway(wc, ctl_ns, cluster, remote, &kc.yaml, probe).await;
}

/// Whether east's federated slice is ready (None: no such slice yet).
async fn east_ready(wc: &kube::Client) -> Option<bool> {
    slice_ready(
        wc,
        "kubernetes.io/service-name=web-federated,service-mirror.linkerd.io/federated-cluster=east",
    )
    .await
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
async fn a_federated_service_spreads_over_both_remotes_fails_over_when_one_gateway_dies_and_stays_home_once_it_has_a_local_member()
 {
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
    let spread = Instant::now();
    let (seen, tries) = until_each_answers(&["east", "north"], || ask(wp)).await;
    assert!(
        !seen.contains(&0),
        "requests reach both remotes: east {}, north {} of {tries}\ncontroller:\n{}",
        seen[0],
        seen[1],
        ctl.log_text()
    );
    eprintln!(
        "requests reach both remotes (east {}, north {} of {tries}, {:?})",
        seen[0],
        seen[1],
        spread.elapsed()
    );

    // East's gateway dies: east's slice turns not ready at the probe verdict, then
    // kube-proxy sends everything to north.
    drop(east_gw);
    let f = await_failover(
        Instant::now(),
        "north",
        || ask(wp),
        || async { east_ready(&wc).await == Some(false) },
    )
    .await;
    let (verdict, failover) = (f.verdict, f.failover);
    let failed_after_verdict = f
        .log
        .iter()
        .filter(|(t, r)| *t > verdict && r.is_err())
        .count();
    let east_before = f.before(Some("east"));
    eprintln!(
        "east's gateway killed: probe verdict in the slice after {verdict:?}, first all-north window after {failover:?} (requests until then: {} to north, {east_before} to east, {} failed; failed after the verdict: {failed_after_verdict})",
        f.before(Some("north")),
        f.before(None),
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

    // A local member in west (local-first, the default): its endpoints are copied into
    // web-federated's slices and every request stays home; west not ready → north (east
    // is dead); ready again → home. Each switch without a failed request.
    let labels = serde_json::json!({"mirror.linkerd.io/federated": "member", "app": "web"});
    let _west_web = serve_web(&west, "west", labels).await;
    let (d, f) = switch(Instant::now(), "west", || ask(wp), &ctl).await;
    eprintln!("local member added: every request to west after {d:?} ({f} failed before)");
    assert_eq!(f, 0, "adding home fails no request");
    let node = wp.node_ip();
    let t = Instant::now();
    home_ready(&wc, node, false).await;
    let (away, f1) = switch(t, "north", || ask(wp), &ctl).await;
    let t = Instant::now();
    home_ready(&wc, node, true).await;
    let (back, f2) = switch(t, "west", || ask(wp), &ctl).await;
    eprintln!(
        "home not ready: all to north after {away:?}; ready again: all to west after {back:?}"
    );
    assert_eq!(f1 + f2, 0, "no request fails at a switch");
    drop(ctl);
}
