//! Mirrors N exported services of one remote cluster and prints: time from watcher start
//! to every mirror correct, local write requests per mirrored service, and the process's
//! RSS. `cargo run --release -p service-mirror --example scale -- 1000`

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Service};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use local_cluster::LocalCluster;
use service_mirror_controller::link_controller::{LinkConfig, LinkController, LinkDeps};
use service_mirror_core::{Link, NamespaceFilter};
use std::time::{Duration, Instant};

fn rss_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1000);
    let (remote, local) = tokio::try_join!(
        LocalCluster::start("scale-remote"),
        LocalCluster::start("scale-local")
    )?;
    let (rc, lc) = (remote.client().await?, local.client().await?);
    let ns = "scale";
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(rc.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    let svcs: Api<Service> = Api::namespaced(rc.clone(), ns);
    let gw: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gw"}, "spec": {"type": "LoadBalancer", "ports": [{"name": "mc-gateway", "port": 4143}]}}))?;
    svcs.create(&PostParams::default(), &gw).await?;
    let status =
        serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}});
    svcs.patch_status("gw", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let created = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let svcs = svcs.clone();
            async move {
                let svc: Service = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("svc-{i}"), "annotations": {
                        "mirror.linkerd.io/gateway-name": "gw", "mirror.linkerd.io/gateway-ns": ns}},
                    "spec": {"ports": [{"name": "http", "port": 80}, {"name": "grpc", "port": 9090}]}}))?;
                svcs.create(&PostParams::default(), &svc).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    println!("created {n} remote services in {:.1?}", created.elapsed());

    let rss_before = rss_kib("VmRSS:");
    let started = Instant::now();
    let config = LinkConfig {
        namespaces: NamespaceFilter::default(),
        ..LinkConfig::default()
    };
    let watcher = LinkController::start(
        lc.clone(),
        rc.clone(),
        Link::new("east", None),
        config,
        LinkDeps::default(),
    )?;
    let eps: Api<Endpoints> = Api::namespaced(lc.clone(), ns);
    let lp = ListParams::default().labels("mirror.linkerd.io/cluster-name=east");
    loop {
        let ready = eps.list_metadata(&lp).await?.items.len();
        if ready >= n {
            let full = eps
                .list(&lp)
                .await?
                .items
                .iter()
                .filter(|e| e.subsets.as_ref().is_some_and(|s| !s.is_empty()))
                .count();
            if full >= n {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let synced = started.elapsed();
    let services = Api::<Service>::namespaced(lc.clone(), ns)
        .list_metadata(&lp)
        .await?
        .items
        .len();
    let audit = std::fs::read_to_string(local.audit_log())?;
    let writes = audit
        .lines()
        .filter(|l| {
            l.contains("\"stage\":\"ResponseComplete\"")
                && l.contains(&format!("\"namespace\":\"{ns}\""))
        })
        .count();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = std::fs::read_to_string(local.audit_log())?
        .lines()
        .filter(|l| {
            l.contains("\"stage\":\"ResponseComplete\"")
                && l.contains(&format!("\"namespace\":\"{ns}\""))
        })
        .count()
        - writes;
    println!("services mirrored:        {services} (endpoints with subsets: {n})");
    println!("time to all mirrors:      {synced:.2?}");
    println!(
        "local write requests:     {writes} ({:.2} per mirrored service)",
        writes as f64 / n as f64
    );
    println!("write requests idle 5 s:  {idle}");
    println!(
        "process RSS before start: {} MiB, peak (VmHWM): {} MiB",
        rss_before / 1024,
        rss_kib("VmHWM:") / 1024
    );
    watcher.stop(false).await?;
    Ok(())
}
