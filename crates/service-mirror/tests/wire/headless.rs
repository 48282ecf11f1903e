//! Headless services on the wire (`--enable-headless-services`, issue 16 point 1):
//! east's headless `shop/web` has two "pods", web-0 and web-1 (two addresses of east's
//! node, each answering with its name); from west's node, west's CoreDNS resolves
//! `web-1.web-east.shop.svc.cluster.local` to web-1's endpoint mirror, whose ClusterIP
//! west's kube-proxy sends to east's stand-in gateway, which forwards to
//! `web-1.web.shop.svc.cluster.local` in east. Needs root (network namespaces): without
//! it the test prints `skipped: needs root for network namespaces`.

use crate::support::controller::{Controller, kubeconfig_with_rules, link_secret};
use crate::support::wire::data_plane_cluster;
use crate::support::*;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{Api, PostParams};
use local_cluster::skip_without_data_plane;
use std::time::{Duration, Instant};

/// The pods' port (the headless Service's port and target port).
const POD_PORT: u16 = 8080;

/// East's gateway Service `shop/gateway` in front of the stand-in gateway at `ip` (as
/// tests/wire/links.rs makes it: ingress and Endpoints at the gateway's address).
async fn east_gateway(east: &kube::Client, ip: &str) {
    stand_in_gateway_service(east, "shop", ip, &[ip]).await;
}

/// East's headless `shop/web`, exported through `shop/gateway`, and its EndpointSlice
/// written by hand: `pods` as (hostname, address) at port http 8080.
async fn east_headless_web(east: &kube::Client, pods: &[(&str, String)]) {
    let mut svc = exported("web", "shop", "gateway", &[("http", POD_PORT.into())]);
    svc.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    Api::<Service>::namespaced(east.clone(), "shop")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let endpoints: Vec<serde_json::Value> = pods
        .iter()
        .map(|(host, ip)| {
            serde_json::json!({"addresses": [ip], "hostname": host, "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "name": host, "namespace": "shop"}})
        })
        .collect();
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-pods", "labels": {
            "kubernetes.io/service-name": "web",
            "service.kubernetes.io/headless": "",
            "endpointslice.kubernetes.io/managed-by": "test.service-mirror.io"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": POD_PORT, "protocol": "TCP"}],
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(east.clone(), "shop")
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
}

#[tokio::test]
async fn each_pod_of_a_remote_headless_service_answers_at_its_own_mirrored_dns_name() {
    if skip_without_data_plane("each_pod_of_a_remote_headless_service_answers") {
        return;
    }
    pods_answer(("hl-west", "hl-east"), None).await;
}

/// `endpoints` mode: west's kube-controller-manager mirrors the headless mirror's
/// Endpoints into the slices CoreDNS reads.
#[tokio::test]
async fn each_pod_answers_at_its_mirrored_dns_name_in_endpoints_mode_through_kcms_slices() {
    if skip_without_data_plane("each_pod_answers_at_its_mirrored_dns_name_in_endpoints_mode") {
        return;
    }
    pods_answer(
        ("hl-west-e", "hl-east-e"),
        Some("--endpoints-mode=endpoints"),
    )
    .await;
}

/// The world of this file on clusters `names`, the controller run with `mode_flag`.
async fn pods_answer(names: (&str, &str), mode_flag: Option<&str>) {
    let started = Instant::now();
    let (west, east) = tokio::join!(data_plane_cluster(names.0), data_plane_cluster(names.1));
    let (wc, ec) = (west.client().await.unwrap(), east.client().await.unwrap());
    for c in [&wc, &ec] {
        create_namespace(c, "shop").await;
    }
    let ep = east.data_plane().unwrap();
    let east_ip = ep.node_ip();
    let second = ep.add_address().unwrap();
    let _pods = [
        ep.serve_http_at(east_ip, POD_PORT, "east/web-0").unwrap(),
        ep.serve_http_at(second, POD_PORT, "east/web-1").unwrap(),
    ];
    east_headless_web(
        &ec,
        &[
            ("web-0", east_ip.to_string()),
            ("web-1", second.to_string()),
        ],
    )
    .await;
    let _gateway = ep.start_gateway("east").unwrap();
    east_gateway(&ec, &east_ip.to_string()).await;
    // East's own DNS serves the pods (what the gateway resolves).
    for (host, ip) in [("web-0", east_ip), ("web-1", second)] {
        let name = format!("{host}.web.shop.svc.cluster.local");
        eventually(&format!("east resolves {name}"), || async {
            (ep.resolve(&name).await.ok()? == [ip]).then_some(())
        })
        .await;
    }

    // West: the controller with headless services on, linked with credentials that may
    // read Services and EndpointSlices (what `service-mirror allow` grants).
    let ctl_ns = local_cluster::unique_namespace("sm");
    create_namespace(&wc, &ctl_ns).await;
    let mut flags = vec!["--namespace-allow", "shop", "--enable-headless-services"];
    flags.extend(mode_flag);
    let ctl = Controller::spawn(&west, &ctl_ns, &flags);
    ctl.wait_ready().await;
    let read = |group: &str, resource: &str| PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        verbs: vec!["get".into(), "list".into(), "watch".into()],
        ..Default::default()
    };
    let kc = kubeconfig_with_rules(
        &east,
        "shop",
        "reader",
        "service-mirror-remote-headless-reader",
        vec![
            read("", "services"),
            read("discovery.k8s.io", "endpointslices"),
        ],
    )
    .await;
    Api::<Secret>::namespaced(wc.clone(), &ctl_ns)
        .create(
            &PostParams::default(),
            &link_secret("cluster-credentials-east", Some("east"), Some(&kc.yaml)),
        )
        .await
        .unwrap();
    let linked = Instant::now();

    let wp = west.data_plane().unwrap();
    for host in ["web-1", "web-0"] {
        let name = format!("{host}.web-east.shop.svc.cluster.local");
        let want = format!("east/{host}");
        let start = Instant::now();
        let mut last = String::new();
        // Bounded: 240 tries, 250 ms apart.
        let mut answered = false;
        for _ in 0..240 {
            match wp.http_get(&name, POD_PORT, "/").await {
                Ok(a) if a.status == 200 && a.body == want => {
                    answered = true;
                    break;
                }
                r => last = format!("{r:?}"),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(
            answered,
            "{name} never answered {want:?}; last: {last}\nwest Services: {:?}\ncontroller:\n{}",
            Api::<Service>::namespaced(wc.clone(), "shop")
                .list(&Default::default())
                .await
                .map(|l| l
                    .items
                    .iter()
                    .map(|s| (
                        s.metadata.name.clone(),
                        s.spec.as_ref().and_then(|s| s.cluster_ip.clone())
                    ))
                    .collect::<Vec<_>>()),
            ctl.log_text()
                .lines()
                .filter(|l| l.contains(" WARN ") || l.contains(" INFO "))
                .take(40)
                .collect::<Vec<_>>()
                .join("\n"),
        );
        eprintln!(
            "{name} answered {want:?} {:?} after the link ({:?} waiting for it)",
            linked.elapsed(),
            start.elapsed()
        );
        // It resolves to its endpoint mirror's ClusterIP, not to the remote pod.
        let mirror = Api::<Service>::namespaced(wc.clone(), "shop")
            .get(&format!("{host}-east"))
            .await
            .unwrap();
        let ip = mirror.spec.unwrap().cluster_ip.unwrap();
        assert_eq!(
            wp.resolve(&name).await.unwrap(),
            [ip.parse::<std::net::Ipv4Addr>().unwrap()]
        );
    }
    eprintln!("whole test: {:?}", started.elapsed());
    drop(ctl);
}
