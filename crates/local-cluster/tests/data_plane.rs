//! The data plane on real processes: kube-controller-manager mirrors Endpoints into
//! EndpointSlices, kube-proxy routes ClusterIPs, CoreDNS resolves `cluster.local`, and
//! the stand-in gateway forwards between two clusters' nodes. Needs root: without it each
//! test prints `skipped: needs root for network namespaces` (under CI=true it fails).

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use local_cluster::{ClusterOptions, DataPlane, LocalCluster, skip_without_data_plane};
use std::time::{Duration, Instant};

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
        "{name}: control plane + data plane ready in {:?}",
        started.elapsed()
    );
    c
}

/// A selectorless Service `ns/name` (port 80 → `target`) and its Endpoints `ip:target`.
async fn publish(client: &kube::Client, ns: &str, name: &str, ip: &str, target: u16) -> String {
    local_cluster::ensure_namespace(client, ns).await.unwrap();
    let meta = ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    let svc = Service {
        metadata: meta.clone(),
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::Int(target.into())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let svc = Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let ep = Endpoints {
        metadata: meta,
        subsets: Some(vec![EndpointSubset {
            addresses: Some(vec![EndpointAddress {
                ip: ip.into(),
                ..Default::default()
            }]),
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: target.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }]),
    };
    Api::<Endpoints>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &ep)
        .await
        .unwrap();
    svc.spec.unwrap().cluster_ip.unwrap()
}

/// Retries `GET` until it answers `want` (at most 120 tries over 60 s).
async fn until_answer(
    plane: &DataPlane,
    what: &str,
    mut get: impl AsyncFnMut(&DataPlane) -> local_cluster::Result<local_cluster::HttpAnswer>,
    want: &str,
) -> Duration {
    let start = Instant::now();
    let mut last = None;
    for _ in 0..120 {
        match get(plane).await {
            Ok(a) if a.status == 200 && a.body == want => return start.elapsed(),
            other => last = Some(format!("{other:?}")),
        }
        if start.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!(
        "{what}: no {want:?} within {:?}; last: {last:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn endpoints_are_mirrored_into_slices_and_served_through_kube_proxy_and_dns() {
    if skip_without_data_plane("endpoints_are_mirrored_into_slices_and_served") {
        return;
    }
    let c = data_plane_cluster("dp").await;
    let plane = c.data_plane().expect("data plane");
    let client = c.client().await.unwrap();
    let ip = plane.node_ip().to_string();
    let workload = plane.serve_http(8080, "dp/web").unwrap();
    assert_eq!(workload.addr().port(), 8080);
    let cluster_ip = publish(&client, "shop", "web", &ip, 8080).await;
    assert!(cluster_ip.starts_with("198.18."), "{cluster_ip}");

    // EndpointSliceMirroring: a slice labelled with the Service, managed by the mirroring
    // controller, holding the Endpoints' address.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "shop");
    let start = Instant::now();
    let slice = loop {
        let list = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
            .await
            .unwrap();
        if let Some(s) = list.items.into_iter().next() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no EndpointSlice for shop/web in 60 s; kube-controller-manager:\n{}",
            plane.log_tail("kube-controller-manager", 40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!("EndpointSlice mirrored in {:?}", start.elapsed());
    let labels = slice.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("endpointslice.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("endpointslicemirroring-controller.k8s.io"),
        "{labels:?}"
    );
    assert_eq!(slice.endpoints[0].addresses, vec![ip.clone()]);

    let addr: std::net::SocketAddr = format!("{cluster_ip}:80").parse().unwrap();
    let took = until_answer(
        plane,
        "ClusterIP",
        async |p| p.http_get_addr(addr, "web", "/").await,
        "dp/web",
    )
    .await;
    eprintln!("ClusterIP {addr} answered through kube-proxy after {took:?}");
    let took = until_answer(
        plane,
        "DNS name",
        async |p| p.http_get("web.shop.svc.cluster.local", 80, "/").await,
        "dp/web",
    )
    .await;
    eprintln!("web.shop.svc.cluster.local answered after {took:?}");
    assert_eq!(
        plane.resolve("web.shop.svc.cluster.local").await.unwrap(),
        vec![cluster_ip.parse::<std::net::Ipv4Addr>().unwrap()]
    );
    assert!(
        plane
            .resolve("nothing.shop.svc.cluster.local")
            .await
            .unwrap()
            .is_empty(),
        "an unknown name does not resolve"
    );
}

#[tokio::test]
async fn the_gateway_forwards_from_one_node_to_the_other_clusters_service() {
    if skip_without_data_plane("the_gateway_forwards") {
        return;
    }
    let (west, east) = tokio::join!(data_plane_cluster("gw-west"), data_plane_cluster("gw-east"));
    let (wp, ep) = (west.data_plane().unwrap(), east.data_plane().unwrap());
    let east_client = east.client().await.unwrap();
    let _workload = ep.serve_http(8080, "east/web").unwrap();
    publish(&east_client, "shop", "web", &ep.node_ip().to_string(), 8080).await;
    let gateway = ep.start_gateway("gw-east").unwrap();

    // The probe, from the west node.
    let probe = wp
        .http_get_addr(gateway.probe_addr(), "gw", "/ready")
        .await
        .unwrap();
    assert_eq!(probe.status, 200);
    // West's node reaches east's gateway, which goes through east's DNS and kube-proxy.
    let took = until_answer(
        wp,
        "gateway",
        async |p| {
            p.http_get_addr(gateway.addr(), "web-gw-east.shop.svc.cluster.local:80", "/")
                .await
        },
        "east/web",
    )
    .await;
    eprintln!("east/web answered through the gateway after {took:?}");
    let unknown = wp
        .http_get_addr(gateway.addr(), "web.shop.svc.cluster.local", "/")
        .await
        .unwrap();
    assert_eq!(unknown.status, 404, "not a name of this gateway's cluster");
}

/// A pod running busybox's httpd on `node`, from the preloaded image (never pulled).
fn web_pod(name: &str, node: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "web",
                "image": "service-mirror.local/busybox:1.35",
                "imagePullPolicy": "Never",
                "command": ["/bin/httpd", "-f", "-p", "8080", "-h", "/www"],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
            }],
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn real_nodes_run_pods_reachable_across_nodes_and_leave_nothing_behind() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    if local_cluster::skip_without_nodes(
        "real_nodes_run_pods_reachable_across_nodes_and_leave_nothing_behind",
    ) {
        return;
    }
    let started = Instant::now();
    let c = LocalCluster::start_with(
        "rn",
        ClusterOptions {
            nodes: 2,
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("start a cluster with 2 nodes: {e}"));
    eprintln!("rn: 2 nodes Ready in {:?}", started.elapsed());
    let plane = c.data_plane().unwrap();
    let nodes = plane.nodes();
    assert_eq!(nodes.len(), 2);
    let client = c.client().await.unwrap();
    let api: Api<Node> = Api::all(client.clone());
    for n in nodes {
        let node = api.get(n.name()).await.unwrap();
        assert!(local_cluster::is_ready(&node), "{} Ready", n.name());
        let addrs = node.status.unwrap().addresses.unwrap();
        assert!(
            addrs
                .iter()
                .any(|a| a.type_ == "InternalIP" && a.address == n.ip().to_string()),
            "{addrs:?}"
        );
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let t = Instant::now();
    pods.create(&PostParams::default(), &web_pod("web", nodes[1].name()))
        .await
        .unwrap();
    let ip = loop {
        let p = pods.get("web").await.unwrap();
        let status = p.status.unwrap_or_default();
        let ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if ready {
            break status.pod_ip.unwrap();
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "pod not Ready in 60 s: {}",
            nodes[1].log_tail("kubelet", 30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("rn: pod Ready in {:?} at {ip}", t.elapsed());
    // From the first node (another node's namespace) to the pod on the second.
    let answer = plane
        .http_get_addr(format!("{ip}:8080").parse().unwrap(), "web", "/")
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    let pids: Vec<u32> = nodes.iter().flat_map(|n| n.pids()).collect();
    drop(c);
    // kubelet's and kube-controller-manager's fixed host paths stayed in the node's own
    // mounts or the cluster's directory.
    for path in ["/var/log/containers", "/usr/libexec/kubernetes"] {
        assert!(
            !std::path::Path::new(path).exists(),
            "{path} made on the host"
        );
    }
    // Every node process, shim and container is gone, and every cgroup root.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive: Vec<&u32> = pids
            .iter()
            .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
            .collect();
        let ours = format!("service-mirror-{}-", std::process::id());
        let cgroups: Vec<_> = local_cluster::leftover_cgroups()
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&ours))
            })
            .collect();
        if alive.is_empty() && cgroups.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: pids {alive:?}, cgroups {cgroups:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
