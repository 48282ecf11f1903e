//! Traffic on the wire through mirrors made by the real `service-mirror run` binary:
//! local `west` and remote `east` clusters with data planes (kube-controller-manager,
//! kube-proxy, CoreDNS; docs/data-plane.md), east's workload behind the stand-in gateway.
//! Needs root: without it each test prints `skipped: needs root for network namespaces`
//! (under CI=true it fails).

mod support;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Secret, Service, ServicePort,
    ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ObjectMeta, PostParams};
use local_cluster::{
    ClusterOptions, GATEWAY_PORT, LocalCluster, PROBE_PORT, skip_without_data_plane,
};
use std::time::{Duration, Instant};
use support::controller::{Controller, link_secret, reader_kubeconfig};
use support::*;

/// Ports of east's `shop/web`: (name, service port, workload port).
const WEB_PORTS: [(&str, i32, u16); 2] = [("http", 80, 8080), ("admin", 8081, 9090)];

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

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}

/// East's own `shop/web`: exported through gateway `shop/gateway`, selectorless, its
/// Endpoints the workloads on east's node (kube-controller-manager mirrors them into a
/// slice that east's kube-proxy routes).
async fn east_web(east: &kube::Client, node_ip: &str) {
    let mut svc = exported("web", "shop", "gateway", &[]);
    svc.spec.as_mut().unwrap().ports = Some(
        WEB_PORTS
            .iter()
            .map(|(name, port, target)| ServicePort {
                name: Some(name.to_string()),
                port: *port,
                target_port: Some(IntOrString::Int((*target).into())),
                ..Default::default()
            })
            .collect(),
    );
    Api::<Service>::namespaced(east.clone(), "shop")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let ep = Endpoints {
        metadata: meta("web"),
        subsets: Some(vec![EndpointSubset {
            addresses: Some(vec![EndpointAddress {
                ip: node_ip.into(),
                ..Default::default()
            }]),
            ports: Some(
                WEB_PORTS
                    .iter()
                    .map(|(name, _, target)| EndpointPort {
                        name: Some(name.to_string()),
                        port: (*target).into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }]),
    };
    Api::<Endpoints>::namespaced(east.clone(), "shop")
        .create(&PostParams::default(), &ep)
        .await
        .unwrap();
}

/// East's gateway Service `shop/gateway`: ports `mc-gateway` and `mc-probe` of the
/// stand-in gateway, its ingress the gateway's address, and Endpoints at that address as
/// a real gateway's pods would have: east's kube-proxy routes a LoadBalancer IP to the
/// Service's endpoints and rejects it while there are none.
async fn east_gateway(east: &kube::Client, ip: &str) {
    let svc = Service {
        metadata: meta("gateway"),
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(ports(&[
                ("mc-gateway", GATEWAY_PORT.into()),
                ("mc-probe", PROBE_PORT.into()),
            ])),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Service>::namespaced(east.clone(), "shop")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    set_ingress(east, "shop", "gateway", &[ip]).await;
    let ep = Endpoints {
        metadata: meta("gateway"),
        subsets: Some(vec![EndpointSubset {
            addresses: Some(vec![EndpointAddress {
                ip: ip.into(),
                ..Default::default()
            }]),
            ports: Some(
                [("mc-gateway", GATEWAY_PORT), ("mc-probe", PROBE_PORT)]
                    .iter()
                    .map(|(name, port)| EndpointPort {
                        name: Some(name.to_string()),
                        port: (*port).into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }]),
    };
    Api::<Endpoints>::namespaced(east.clone(), "shop")
        .create(&PostParams::default(), &ep)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_mirror_answers_from_the_remote_workload_on_every_port_through_dns_and_kube_proxy() {
    if skip_without_data_plane("a_mirror_answers_from_the_remote_workload") {
        return;
    }
    let test_start = Instant::now();
    let (west, east) = tokio::join!(data_plane_cluster("west"), data_plane_cluster("east"));
    let (wp, ep) = (west.data_plane().unwrap(), east.data_plane().unwrap());
    let (wc, ec) = (west.client().await.unwrap(), east.client().await.unwrap());
    for c in [&wc, &ec] {
        create_namespace(c, "shop").await;
    }

    // East: the workloads, their Service, the gateway.
    let _workloads: Vec<_> = WEB_PORTS
        .iter()
        .map(|(name, _, target)| ep.serve_http(*target, &format!("east/web:{name}")).unwrap())
        .collect();
    let east_ip = ep.node_ip().to_string();
    east_web(&ec, &east_ip).await;
    let gateway = ep.start_gateway("east").unwrap();
    assert_eq!(gateway.addr().ip().to_string(), east_ip);
    east_gateway(&ec, &east_ip).await;

    // West: the controller, linked to east with a reader's credentials.
    let ctl_ns = local_cluster::unique_namespace("sm");
    create_namespace(&wc, &ctl_ns).await;
    let ctl = Controller::spawn(
        &west,
        &ctl_ns,
        &[
            "--namespace-allow",
            "shop",
            "--endpoint-refresh-period",
            "2s",
        ],
    );
    ctl.wait_ready().await;
    let kc = reader_kubeconfig(&east, "shop", "reader").await;
    Api::<Secret>::namespaced(wc.clone(), &ctl_ns)
        .create(
            &PostParams::default(),
            &link_secret("cluster-credentials-east", Some("east"), Some(&kc.yaml)),
        )
        .await
        .unwrap();
    let linked = Instant::now();

    // The mirror, then traffic: west's DNS, west's kube-proxy, the gateway, east's DNS,
    // east's kube-proxy, the workload. Bounded: 240 tries over at most 120 s per port.
    let mirror = "web-east.shop.svc.cluster.local";
    for (name, port, _) in WEB_PORTS {
        let want = format!("east/web:{name}");
        let mut last = None;
        let start = Instant::now();
        let mut answered = false;
        for _ in 0..240 {
            match wp.http_get(mirror, port as u16, "/").await {
                Ok(a) if a.status == 200 && a.body == want => {
                    answered = true;
                    break;
                }
                other => last = Some(format!("{other:?}")),
            }
            if start.elapsed() > Duration::from_secs(120) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(
            answered,
            "http://{mirror}:{port}/ never answered {want:?} in {:?}; last: {last:?}\nmirror Endpoints: {:?}\nwest kube-proxy:\n{}\ncontroller:\n{}",
            start.elapsed(),
            Api::<Endpoints>::namespaced(wc.clone(), "shop")
                .get_opt("web-east")
                .await,
            wp.log_tail("kube-proxy", 20),
            ctl.log_text()
                .lines()
                .filter(|l| l.contains("gateway") || l.contains(" WARN ") || l.contains(" INFO "))
                .take(40)
                .collect::<Vec<_>>()
                .join("\n"),
        );
        eprintln!(
            "http://{mirror}:{port}/ answered {want:?} {:?} after the link",
            linked.elapsed()
        );
    }

    // The mirror's ClusterIP is what the name resolves to, and it is in west's range.
    let svc = Api::<Service>::namespaced(wc.clone(), "shop")
        .get("web-east")
        .await
        .unwrap();
    let cluster_ip = svc.spec.unwrap().cluster_ip.unwrap();
    assert_eq!(
        wp.resolve(mirror).await.unwrap(),
        vec![cluster_ip.parse::<std::net::Ipv4Addr>().unwrap()]
    );
    assert!(cluster_ip.starts_with("198.18."), "{cluster_ip}");
    // Twenty more requests in a row, all answered (no flapping path).
    for i in 0..20 {
        let a = wp.http_get(mirror, 80, "/").await.unwrap();
        assert_eq!(
            (a.status, a.body.as_str()),
            (200, "east/web:http"),
            "request {i}"
        );
    }
    eprintln!("wire test done in {:?}", test_start.elapsed());
}
