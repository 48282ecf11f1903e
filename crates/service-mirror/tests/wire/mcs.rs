//! A ServiceImport on the wire (issue 17 point 6): local `west` and remote `east` with
//! data planes (kube-controller-manager, kube-proxy, CoreDNS), both exporting `shop/web`
//! with a ServiceExport (each workload answers with its cluster's name; east's behind
//! the stand-in gateway on its node), east linked by a `Link` to the real
//! `service-mirror run --mcs-cluster-name west` on west. Requests from west's node to the
//! import's ClusterSetIP go through west's kube-proxy, which reads the import's
//! EndpointSlices: west's own (a copy of the slices kube-controller-manager made of its
//! Service) and east's (at east's gateway). Our CoreDNS does not serve
//! `clusterset.local`: the requests carry `web.shop.svc.clusterset.local` as their Host
//! only (the stand-in gateway routes by it). Needs root (network namespaces).

use crate::support;
use crate::support::controller::Controller;
use crate::support::wire::{
    await_failover, data_plane_cluster, link_through_gateway, serve_web, slice_ready,
    until_each_answers,
};
use crate::support::*;
use kube::api::{Api, DynamicObject, PostParams};
use local_cluster::{DataPlane, Gateway, LocalCluster, Workload, skip_without_data_plane};
use service_mirror_controller::links::{LINK_CRD_YAML, LinkResource};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

const HOST: &str = "web.shop.svc.clusterset.local";
/// The Link's probe: every second, dead after three failures.
const PROBE_PERIOD: Duration = Duration::from_secs(1);
const PROBE_THRESHOLD: u32 = 3;

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

/// The import's ClusterSetIP once it lists both clusters.
async fn cluster_set_ip(wc: &kube::Client) -> Ipv4Addr {
    let imports: Api<DynamicObject> = support::mcs::mcs_api(wc, "shop", "ServiceImport");
    eventually(
        "the import of web from west and east, with its ClusterSetIP",
        || async {
            let i = imports.get_opt("web").await.ok()??;
            let clusters: Vec<&str> = i.data["status"]["clusters"]
                .as_array()?
                .iter()
                .filter_map(|c| c["cluster"].as_str())
                .collect();
            (clusters == ["east", "west"]).then_some(())?;
            i.data["spec"]["ips"][0].as_str()?.parse().ok()
        },
    )
    .await
}

/// Whether east's import slice is ready (None: no such slice yet).
async fn east_ready(wc: &kube::Client) -> Option<bool> {
    slice_ready(
        wc,
        "multicluster.kubernetes.io/service-name=web,multicluster.kubernetes.io/source-cluster=east",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_set_ip_reaches_both_exporters_and_fails_over_when_a_gateway_dies() {
    if skip_without_data_plane("the_cluster_set_ip_reaches_both_exporters") {
        return;
    }
    let (west, east) = tokio::join!(
        data_plane_cluster("west-mcs"),
        data_plane_cluster("east-mcs")
    );
    for c in [&west, &east] {
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
    let east_gw: Gateway = east.data_plane().unwrap().start_gateway("east").unwrap();
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
    let ctl = Controller::spawn(
        &west,
        &ctl_ns,
        &["--namespace-allow", "shop", "--mcs-cluster-name", "west"],
    );
    ctl.wait_ready().await;
    let linked = Instant::now();
    // East's admin: the link reads east's ServiceExports (not in Linkerd's remote role).
    let admin = east.admin_kubeconfig().yaml;
    let probe = (PROBE_PERIOD, PROBE_THRESHOLD);
    link_through_gateway(&wc, &ctl_ns, "east", &east, &admin, probe).await;
    let ip = cluster_set_ip(&wc).await;
    eprintln!(
        "ServiceImport web: ClusterSetIP {ip}, {:?} after the Link",
        linked.elapsed()
    );

    // Both exporters answer: west's pods directly, east's through its gateway. Bounded:
    // 400 requests at most.
    let wp = west.data_plane().unwrap();
    let (seen, tries) = until_each_answers(&["west", "east"], || ask(wp, ip)).await;
    assert!(
        !seen.contains(&0),
        "requests reach both exporters: west {}, east {} of {tries}\ncontroller:\n{}",
        seen[0],
        seen[1],
        ctl.log_text()
    );
    eprintln!(
        "requests reach both exporters (west {}, east {} of {tries})",
        seen[0], seen[1]
    );
    assert!(
        east_gw.accepted() > 0,
        "east's answers came through its gateway"
    );

    // East's gateway dies: east's slice turns not ready at the probe verdict, then
    // kube-proxy sends everything to west.
    drop(east_gw);
    let f = await_failover(
        Instant::now(),
        "west",
        || ask(wp, ip),
        || async { east_ready(&wc).await == Some(false) },
    )
    .await;
    let (verdict, failover) = (f.verdict, f.failover);
    eprintln!(
        "east's gateway killed: probe verdict in the slice after {verdict:?}, first all-west window after {failover:?} ({} requests failed before it)",
        f.before(None)
    );
    let bound = PROBE_PERIOD * PROBE_THRESHOLD + Duration::from_secs(10);
    assert!(failover <= bound, "failover {failover:?} within {bound:?}");
    for i in 0..100 {
        let r = ask(wp, ip).await;
        assert_eq!(r.as_deref(), Ok("west"), "request {i} after the failover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("100 requests after the failover: all answered by west");
    drop(ctl);
}
