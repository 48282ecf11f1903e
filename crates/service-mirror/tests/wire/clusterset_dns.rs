//! `clusterset.local` on the wire (issue 32 point 3), for `mcs.rs`'s clusters: the
//! controller's DNS server (`--clusterset-dns-addr`) on the host's fabric address, west's
//! CoreDNS forwarding the zone to it, as an operator's Corefile stanza does.

use crate::support::controller::Controller;
use crate::support::eventually;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::{Api, DynamicObject, PostParams};
use local_cluster::DataPlane;
use std::net::Ipv4Addr;
use std::time::Instant;

/// West's headless `shop/db`: its Endpoints one address, hostname `db-0`, at west's
/// node `node`; exported.
pub(crate) async fn headless_export(wc: &kube::Client, node: Ipv4Addr) {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "shop"},
        "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(wc.clone(), "shop")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let eps: Endpoints = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "shop"},
        "subsets": [{
            "addresses": [{"ip": node.to_string(), "hostname": "db-0"}],
            "ports": [{"name": "pg", "port": 5432}],
        }],
    }))
    .unwrap();
    Api::<Endpoints>::namespaced(wc.clone(), "shop")
        .create(&PostParams::default(), &eps)
        .await
        .unwrap();
    let export = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
        "metadata": {"name": "db", "namespace": "shop"},
    }))
    .unwrap();
    let exports: Api<DynamicObject> = crate::support::mcs::mcs_api(wc, "shop", "ServiceExport");
    exports
        .create(&PostParams::default(), &export)
        .await
        .unwrap();
}

/// East's headless `shop/db`, exported both ways: to the Link (`exported=true`, mirrored
/// with `--enable-headless-services` as `db-east` and the endpoint mirror `db-0-east`)
/// and to the cluster set (a ServiceExport). Its one pod, `db-0`, is a slice written by
/// hand (its address is never dialled: only its endpoint mirror's ClusterIP is answered).
pub(crate) async fn east_headless_export(ec: &kube::Client) {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "shop",
            "labels": {"mirror.linkerd.io/exported": "true"}},
        "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(ec.clone(), "shop")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db-pods", "namespace": "shop", "labels": {
            "kubernetes.io/service-name": "db",
            "service.kubernetes.io/headless": "",
            "endpointslice.kubernetes.io/managed-by": "test.service-mirror.io"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["198.51.100.7"], "hostname": "db-0",
            "conditions": {"ready": true}}],
        "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(ec.clone(), "shop")
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
    let export = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
        "metadata": {"name": "db", "namespace": "shop"},
    }))
    .unwrap();
    crate::support::mcs::mcs_api(ec, "shop", "ServiceExport")
        .create(&PostParams::default(), &export)
        .await
        .unwrap();
}

/// `clusterset.local` through west's CoreDNS: `host` (the import `shop/web`) resolves
/// to its ClusterSetIP `ip`, a request by name is answered by `home` (its endpoints
/// ready), the headless import `shop/db` answers west's endpoint and east's (its
/// endpoint mirror `db-0-east`'s ClusterIP, `--enable-headless-services`), each by its
/// name and its cluster's, names that do not exist are NXDOMAIN and names that exist without an
/// address NODATA (NOERROR, no answer), as CoreDNS passes them on.
pub(crate) async fn answers(
    wp: &DataPlane,
    host: &str,
    ip: Ipv4Addr,
    home: &str,
    ctl: &Controller,
    wc: &kube::Client,
) {
    let t = Instant::now();
    eventually("the import's name resolves to the ClusterSetIP", || async {
        (wp.resolve(host).await.ok()? == [ip]).then_some(())
    })
    .await;
    eprintln!(
        "{host} -> {ip} through west's CoreDNS, {:?} after the import had its IP",
        t.elapsed()
    );
    // By name, as a pod asks.
    let t = Instant::now();
    eventually("GET http://<import name>/ answered by home", || async {
        let a = wp.http_get(host, 80, "/").await.ok()?;
        (a.status == 200 && a.body == home).then_some(())
    })
    .await;
    eprintln!(
        "GET http://{host}/ -> 200 {home:?}, {:?} after it resolved",
        t.elapsed()
    );
    dig(wp, &[host, "A"]);
    dig(wp, &[&format!("_http._tcp.{host}"), "SRV"]);
    let node = wp.node_ip();
    let t = Instant::now();
    // East's pod through its endpoint mirror (west's Service `shop/db-0-east`).
    let mirror = eventually("east's db-0 has its endpoint mirror", || async {
        let s = Api::<Service>::namespaced(wc.clone(), "shop")
            .get("db-0-east")
            .await
            .ok()?;
        s.spec?.cluster_ip?.parse::<Ipv4Addr>().ok()
    })
    .await;
    eventually(
        "db.shop.svc.clusterset.local resolves to west's endpoint and east's mirror",
        || async {
            let mut got = wp.resolve("db.shop.svc.clusterset.local").await.ok()?;
            got.sort();
            let mut want = vec![node, mirror];
            want.sort();
            (got == want).then_some(())
        },
    )
    .await;
    eprintln!(
        "db.shop.svc.clusterset.local -> {node} (west) and {mirror} (east's db-0-east), {:?} after web resolved",
        t.elapsed()
    );
    assert_eq!(
        wp.resolve("db-0.east.db.shop.svc.clusterset.local")
            .await
            .unwrap(),
        [mirror],
        "east's endpoint by name: its endpoint mirror\ncontroller:\n{}",
        ctl.log_text()
    );
    assert_eq!(
        wp.resolve("db-0.west.db.shop.svc.clusterset.local")
            .await
            .unwrap(),
        [node],
        "the endpoint's own name\ncontroller:\n{}",
        ctl.log_text()
    );
    dig(wp, &["db.shop.svc.clusterset.local", "SRV"]);
    dig(wp, &["api.shop.svc.clusterset.local", "A"]);
    const NOERROR: u8 = 0;
    const NXDOMAIN: u8 = 3;
    for (name, rcode) in [
        // No such endpoint, cluster, per-cluster name (ClusterSetIP) or import.
        ("db-1.west.db.shop.svc.clusterset.local", NXDOMAIN),
        ("db-1.east.db.shop.svc.clusterset.local", NXDOMAIN),
        ("db-0.north.db.shop.svc.clusterset.local", NXDOMAIN),
        ("east.web.shop.svc.clusterset.local", NXDOMAIN),
        ("api.shop.svc.clusterset.local", NXDOMAIN),
        // Names that exist without an A record: NODATA.
        ("_pg._tcp.db.shop.svc.clusterset.local", NOERROR),
        ("_tcp.web.shop.svc.clusterset.local", NOERROR),
    ] {
        let got = wp.resolve_answer(name).await.unwrap();
        assert_eq!(
            (got.rcode, got.addresses.as_slice()),
            (rcode, &[][..]),
            "{name}\ncontroller:\n{}",
            ctl.log_text()
        );
    }
    // 50 lookups in a row through CoreDNS (no cache in its clusterset.local block).
    let t = Instant::now();
    for _ in 0..50 {
        assert_eq!(wp.resolve(host).await.unwrap(), [ip]);
    }
    eprintln!(
        "50 lookups of {host} through west's CoreDNS in {:?}",
        t.elapsed()
    );
}

/// `dig` from west's node through its CoreDNS, printed for the record (skipped where
/// `dig` is not installed: nothing depends on it).
fn dig(wp: &DataPlane, args: &[&str]) {
    let netns = format!("--net={}", wp.netns_path().display());
    let server = format!("@{}", wp.node_ip());
    let out = std::process::Command::new("nsenter")
        .arg(&netns)
        .args(["dig", "+nocookie", "+tries=1", "+time=2", &server])
        .args(args)
        .output();
    if let Ok(out) = out.as_ref()
        && out.status.success()
    {
        eprintln!(
            "dig {}:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
