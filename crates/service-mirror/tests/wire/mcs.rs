//! A ServiceImport on the wire (issue 17 point 6; issue 32 points 1 and 2): local `west`
//! and remotes `east` and `north` with data planes (kube-controller-manager, kube-proxy,
//! CoreDNS), each exporting `shop/web` with a ServiceExport (each workload answers with
//! its cluster's name; the remotes' behind the stand-in gateway on their node), linked
//! by `Link`s to the real `service-mirror run --mcs-cluster-name west
//! --cluster-priority east,north` on west. Requests from west's node to the import's
//! ClusterSetIP go through west's kube-proxy, which reads the import's EndpointSlices:
//! west's own (a copy of the slice kube-controller-manager mirrors from its Endpoints)
//! and the remotes' (at their gateways), ready as local-first decides. The requests
//! carry `web.shop.svc.clusterset.local` as their Host (the stand-in gateways route by
//! it). West's CoreDNS forwards `clusterset.local` to the controller's own DNS server
//! (`--clusterset-dns-addr` on the host's fabric address, issue 32 point 3): the name
//! resolves to the ClusterSetIP and a request by name is answered, and the headless
//! import `shop/db` (exported by west and east) answers west's own endpoint and east's
//! pod through its headless mirror's endpoint mirror (`--enable-headless-services`), by
//! name. Needs root (network namespaces).

use crate::support;
use crate::support::controller::Controller;
use crate::support::wire::{
    data_plane_cluster, home_ready, link_through_gateway, serve_web, slice_ready, switch,
    until_each_answers,
};
use crate::support::*;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use local_cluster::{DataPlane, Gateway, LocalCluster, Workload, skip_without_data_plane};
use service_mirror_controller::links::{LINK_CRD_YAML, LinkResource};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

const HOST: &str = "web.shop.svc.clusterset.local";
/// The Links' probe: every second, dead after three failures.
const PROBE_PERIOD: Duration = Duration::from_secs(1);
const PROBE_THRESHOLD: u32 = 3;
/// Home's endpoints taken away and given back this many times each: 20 switches.
const ROUNDS: usize = 10;

fn exports(client: &kube::Client) -> Api<DynamicObject> {
    support::mcs::mcs_api(client, "shop", "ServiceExport")
}

/// `shop/web` of cluster `c` (selectorless, its Endpoints the workload on the node,
/// answering `body`), exported with a ServiceExport.
async fn exporter(c: &LocalCluster, body: &str) -> Workload {
    let workload = serve_web(c, body, serde_json::json!({})).await;
    let client = c.client().await.unwrap();
    let export = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
        "metadata": {"name": "web", "namespace": "shop"},
    }))
    .unwrap();
    eventually("the ServiceExport is created", || async {
        exports(&client)
            .create(&PostParams::default(), &export)
            .await
            .ok()
    })
    .await;
    workload
}

/// The import's ClusterSetIP once it lists all three clusters.
async fn cluster_set_ip(wc: &kube::Client) -> Ipv4Addr {
    let imports: Api<DynamicObject> = support::mcs::mcs_api(wc, "shop", "ServiceImport");
    eventually(
        "the import of web from west, east and north, with its ClusterSetIP",
        || async {
            let i = imports.get_opt("web").await.ok()??;
            let clusters: Vec<&str> = i.data["status"]["clusters"]
                .as_array()?
                .iter()
                .filter_map(|c| c["cluster"].as_str())
                .collect();
            (clusters == ["east", "north", "west"]).then_some(())?;
            i.data["spec"]["ips"][0].as_str()?.parse().ok()
        },
    )
    .await
}

/// Whether `cluster`'s import slice is ready (None: no such slice yet).
async fn ready(wc: &kube::Client, cluster: &str) -> Option<bool> {
    slice_ready(
        wc,
        &format!(
            "multicluster.kubernetes.io/service-name=web,multicluster.kubernetes.io/source-cluster={cluster}"
        ),
    )
    .await
}

/// One request to the ClusterSetIP from west's node: the answering cluster, or the error.
async fn ask(wp: &DataPlane, ip: Ipv4Addr) -> Result<String, String> {
    match wp
        .http_get_addr(SocketAddr::from((ip, 80)), HOST, "/")
        .await
    {
        Ok(a) if a.status == 200 => Ok(a.body),
        Ok(a) => Err(format!("status {}: {}", a.status, a.body)),
        Err(e) => Err(e.to_string()),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_stays_home_fails_over_by_priority_and_comes_back() {
    if skip_without_data_plane("traffic_stays_home_fails_over_by_priority_and_comes_back") {
        return;
    }
    let (west, east, north) = tokio::join!(
        data_plane_cluster("west-mcs"),
        data_plane_cluster("east-mcs"),
        data_plane_cluster("north-mcs"),
    );
    for c in [&west, &east, &north] {
        let client = c.client().await.unwrap();
        for yaml in [
            service_mirror_controller::mcs::SERVICE_EXPORT_CRD_YAML,
            service_mirror_controller::mcs::SERVICE_IMPORT_CRD_YAML,
        ] {
            local_cluster::apply_yaml(&client, yaml).await.unwrap();
        }
    }
    let _west_web = exporter(&west, "west").await;
    let _east_web = exporter(&east, "east").await;
    let _north_web = exporter(&north, "north").await;
    let east_gw: Gateway = east.data_plane().unwrap().start_gateway("east").unwrap();
    let _north_gw: Gateway = north.data_plane().unwrap().start_gateway("north").unwrap();
    let wc = west.client().await.unwrap();
    local_cluster::apply_yaml(&wc, LINK_CRD_YAML).await.unwrap();
    eventually("the Link CRD is served", || async {
        Api::<LinkResource>::namespaced(wc.clone(), "default")
            .list(&Default::default())
            .await
            .ok()
    })
    .await;
    let ctl_ns = local_cluster::unique_namespace("smmcs");
    create_namespace(&wc, &ctl_ns).await;
    // The controller's DNS server on the host's fabric address: west's node reaches it.
    let dns = west.data_plane().unwrap().free_host_port().unwrap();
    let dns_flag = dns.to_string();
    let ctl = Controller::spawn(
        &west,
        &ctl_ns,
        &[
            "--namespace-allow",
            "shop",
            "--mcs-cluster-name",
            "west",
            "--cluster-priority",
            "east,north",
            "--clusterset-dns-addr",
            &dns_flag,
            // East's headless db is answered through its headless mirror.
            "--enable-headless-services",
        ],
    );
    ctl.wait_ready().await;
    west.data_plane()
        .unwrap()
        .forward_zone("clusterset.local", dns)
        .await
        .unwrap();
    super::clusterset_dns::headless_export(&wc, west.data_plane().unwrap().node_ip()).await;
    super::clusterset_dns::east_headless_export(&east.client().await.unwrap()).await;
    let linked = Instant::now();
    // The remotes' admin: the links read their ServiceExports (not in Linkerd's role).
    let probe = (PROBE_PERIOD, PROBE_THRESHOLD);
    for (name, c) in [("east", &east), ("north", &north)] {
        let admin = c.admin_kubeconfig().yaml;
        link_through_gateway(&wc, &ctl_ns, name, c, &admin, probe).await;
    }
    let ip = cluster_set_ip(&wc).await;
    eprintln!(
        "ServiceImport web: ClusterSetIP {ip}, {:?} after the Links",
        linked.elapsed()
    );

    // Local-first: both remotes' slices are there, standing by; every request stays home.
    eventually("east and north stand by", || async {
        (ready(&wc, "east").await == Some(false) && ready(&wc, "north").await == Some(false))
            .then_some(())
    })
    .await;
    let wp = west.data_plane().unwrap();
    let node = wp.node_ip();
    // Once west's kube-proxy has the import (its first sync may come after the slices).
    let (d, _) = switch(Instant::now(), "west", || ask(wp, ip), &ctl).await;
    eprintln!("the ClusterSetIP answers from west after {d:?}");
    for i in 0..50 {
        let r = ask(wp, ip).await;
        assert_eq!(
            r.as_deref(),
            Ok("west"),
            "request {i}: home has a ready endpoint"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(east_gw.accepted(), 0, "east's gateway saw nothing");
    eprintln!("50 requests with home ready: all answered by west");
    // By name: west's CoreDNS forwards clusterset.local to the controller.
    super::clusterset_dns::answers(wp, HOST, ip, "west", &ctl, &wc).await;

    // Home's endpoint not ready → east (first in priority); ready again → home. Each
    // switch timed from the Endpoints write to the first of 10 answers in a row.
    let (mut away, mut back, mut failed) = (Vec::new(), Vec::new(), 0);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        home_ready(&wc, node, false).await;
        let (d, f) = switch(t, "east", || ask(wp, ip), &ctl).await;
        away.push(d);
        failed += f;
        let t = Instant::now();
        home_ready(&wc, node, true).await;
        let (d, f) = switch(t, "west", || ask(wp, ip), &ctl).await;
        back.push(d);
        failed += f;
    }
    // The side turning ready is written before the side standing by
    // (`core::traffic::ready_first`): no request fails at a switch.
    assert_eq!(
        failed,
        0,
        "requests failed at a switch\ncontroller:\n{}",
        ctl.log_text()
    );
    let mut all: Vec<Duration> = away.iter().chain(&back).copied().collect();
    all.sort();
    away.sort();
    back.sort();
    eprintln!(
        "{} switches: p50 {:?}, p99 {:?} (home → east: p50 {:?}, max {:?}; east → home: p50 {:?}, max {:?}); {failed} requests failed before their switch settled, none after",
        all.len(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        percentile(&away, 0.5),
        away.last().unwrap(),
        percentile(&back, 0.5),
        back.last().unwrap(),
    );

    // Home away again, then east's gateway dies: north (next in priority) once the
    // probe's verdict lands.
    home_ready(&wc, node, false).await;
    switch(Instant::now(), "east", || ask(wp, ip), &ctl).await;
    let killed = Instant::now();
    drop(east_gw);
    let (d, f) = switch(killed, "north", || ask(wp, ip), &ctl).await;
    let bound = PROBE_PERIOD * PROBE_THRESHOLD + Duration::from_secs(10);
    eprintln!("east's gateway killed: all to north after {d:?} ({f} requests failed before)");
    assert!(d <= bound, "failover to north {d:?} within {bound:?}");
    assert_eq!(ready(&wc, "east").await, Some(false), "east not ready");

    // Home back: every request home again.
    let t = Instant::now();
    home_ready(&wc, node, true).await;
    let (d, _) = switch(t, "west", || ask(wp, ip), &ctl).await;
    eprintln!("home ready again: all to west after {d:?}");
    eventually("north stands by again", || async {
        (ready(&wc, "north").await == Some(false)).then_some(())
    })
    .await;

    // West's export says `spread`: home and the live remote (north) both answer.
    let spread = serde_json::json!({"metadata": {"annotations": {
        "service-mirror.io/locality": "spread"}}});
    exports(&wc)
        .patch("web", &PatchParams::default(), &Patch::Merge(&spread))
        .await
        .unwrap();
    let (seen, tries) = until_each_answers(&["west", "north"], || ask(wp, ip)).await;
    assert!(
        !seen.contains(&0),
        "spread: west {}, north {} of {tries}\ncontroller:\n{}",
        seen[0],
        seen[1],
        ctl.log_text()
    );
    eprintln!(
        "spread: west {}, north {} of {tries} requests",
        seen[0], seen[1]
    );
    drop(ctl);
}
