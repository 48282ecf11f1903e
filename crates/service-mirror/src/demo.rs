//! `service-mirror demo`: real local clusters, linked and mirroring, with a short story.

use crate::core::Link;
use crate::watcher::{ClusterWatcher, WatcherOptions};
use anyhow::Context;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Service};
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use local_cluster::LocalCluster;
use std::time::{Duration, Instant};

/// Options of the demo.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Leave the clusters running at the end (Ctrl-C stops them).
    #[arg(long)]
    keep: bool,
}

const NS: &str = "shop";
const SERVICES: [&str; 3] = ["web", "cart", "payments"];

fn json(v: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(v)
}

/// Runs the demo.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    println!(
        "Starting two local clusters (etcd + kube-apiserver each; the first run builds them)..."
    );
    let (west, east) = tokio::try_join!(LocalCluster::start("west"), LocalCluster::start("east"))?;
    println!(
        "  west (local)  {}   east (remote)  {}   ready in {:.1?}",
        west.server_url(),
        east.server_url(),
        started.elapsed()
    );
    let (local, remote) = (west.client().await?, east.client().await?);

    println!(
        "\nIn east: a gateway with ingress 203.0.113.10, and {} exported services in namespace {NS}.",
        SERVICES.len()
    );
    setup_remote(&remote).await?;
    let watcher = ClusterWatcher::start(
        local.clone(),
        remote.clone(),
        Link::new("east", None),
        WatcherOptions::default(),
    )?;
    let gw: Api<Service> = Api::namespaced(remote.clone(), "mc-gateway");
    let svcs: Api<Service> = Api::namespaced(remote.clone(), NS);

    step(&local, "The mirror links east into west.", |t| {
        t.iter().filter(|r| r.ready).count() == 3
    })
    .await?;

    svcs.patch("web", &PatchParams::default(), &json(serde_json::json!({"spec": {"ports": [
        {"name": "http", "port": 80, "protocol": "TCP"}, {"name": "metrics", "port": 9090, "protocol": "TCP"}]}})))
        .await?;
    step(
        &local,
        "A port is added to east's web: the mirror and its endpoints follow.",
        |t| {
            t.iter()
                .any(|r| r.remote == "web" && r.endpoints.contains("metrics=4143"))
        },
    )
    .await?;

    gw.patch_status(
        "gateway",
        &PatchParams::default(),
        &json(
            serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.77"}]}}}),
        ),
    )
    .await?;
    step(
        &local,
        "East's gateway moves to 203.0.113.77: every mirror points at the new address.",
        |t| t.iter().all(|r| r.endpoints.contains("203.0.113.77")),
    )
    .await?;

    svcs.patch("cart", &PatchParams::default(), &json(serde_json::json!({"metadata": {"annotations": {"mirror.linkerd.io/gateway-name": null}}})))
        .await?;
    step(
        &local,
        "cart is unexported in east: its mirror is removed.",
        |t| t.len() == 2,
    )
    .await?;

    east.stop_apiserver();
    tokio::time::sleep(Duration::from_secs(2)).await;
    step(
        &local,
        "East's apiserver stops: the mirrors stay as they were.",
        |t| t.len() == 2,
    )
    .await?;
    east.start_apiserver().await?;
    step(
        &local,
        "East is back: the watcher resyncs and nothing changes.",
        |t| t.len() == 2 && t.iter().all(|r| r.ready),
    )
    .await?;

    println!("\nStory told in {:.1?}.", started.elapsed());
    if args.keep {
        for c in [&west, &east] {
            println!(
                "  kubectl --kubeconfig {} get svc,endpoints -n {NS}",
                c.admin_kubeconfig().path.display()
            );
        }
        println!("Clusters keep running; Ctrl-C stops them and removes their files.");
        tokio::signal::ctrl_c().await?;
    }
    watcher.stop(false).await?;
    Ok(())
}

async fn setup_remote(remote: &Client) -> anyhow::Result<()> {
    let pp = PostParams::default();
    for ns in ["mc-gateway", NS] {
        let n = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(remote.clone())
            .create(&pp, &n)
            .await?;
    }
    let gw: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gateway"},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "mc-gateway", "port": 4143}]}
    }))?;
    let gws: Api<Service> = Api::namespaced(remote.clone(), "mc-gateway");
    gws.create(&pp, &gw).await?;
    // No cloud here: write the load balancer status ourselves.
    gws.patch_status(
        "gateway",
        &PatchParams::default(),
        &json(
            serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}),
        ),
    )
    .await?;
    for name in SERVICES {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": {
                "mirror.linkerd.io/gateway-name": "gateway", "mirror.linkerd.io/gateway-ns": "mc-gateway"}},
            "spec": {"ports": [{"name": "http", "port": 80}]}
        }))?;
        Api::<Service>::namespaced(remote.clone(), NS)
            .create(&pp, &svc)
            .await
            .context("create service")?;
    }
    Ok(())
}

/// One row of the table.
struct Row {
    remote: String,
    mirror: String,
    endpoints: String,
    ready: bool,
}

async fn table(local: &Client) -> anyhow::Result<Vec<Row>> {
    let lp = kube::api::ListParams::default().labels("mirror.linkerd.io/cluster-name=east");
    let services = Api::<Service>::all(local.clone()).list(&lp).await?;
    let endpoints = Api::<Endpoints>::all(local.clone()).list(&lp).await?;
    let mut rows = Vec::new();
    for s in services.items {
        let name = s.metadata.name.clone().unwrap_or_default();
        let fq = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("mirror.linkerd.io/remote-svc-fq-name"))
            .cloned()
            .unwrap_or_default();
        let ep = endpoints
            .items
            .iter()
            .find(|e| e.metadata.name.as_deref() == Some(name.as_str()));
        let subsets: Vec<_> = ep.and_then(|e| e.subsets.clone()).unwrap_or_default();
        let addrs: Vec<String> = subsets
            .iter()
            .map(|ss| {
                let ips: Vec<&str> = ss
                    .addresses
                    .iter()
                    .flatten()
                    .map(|a| a.ip.as_str())
                    .collect();
                let ports: Vec<String> = ss
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| format!("{}={}", p.name.as_deref().unwrap_or("-"), p.port))
                    .collect();
                format!("{} [{}]", ips.join(","), ports.join(" "))
            })
            .collect();
        rows.push(Row {
            remote: fq.split('.').next().unwrap_or_default().to_string(),
            ready: !addrs.is_empty(),
            endpoints: if addrs.is_empty() {
                "-".into()
            } else {
                addrs.join(",")
            },
            mirror: name,
        });
    }
    rows.sort_by(|a, b| a.mirror.cmp(&b.mirror));
    Ok(rows)
}

/// Narrates a step, waits (up to 30 s) until the local table satisfies `done`, prints it.
async fn step(
    local: &Client,
    narration: &str,
    done: impl Fn(&[Row]) -> bool,
) -> anyhow::Result<()> {
    println!("\n> {narration}");
    let start = Instant::now();
    let rows = loop {
        let rows = table(local).await?;
        if done(&rows) || start.elapsed() > Duration::from_secs(30) {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let header = [
        "CLUSTER",
        "NAMESPACE",
        "REMOTE",
        "MIRROR",
        "ENDPOINTS",
        "STATE",
    ];
    println!(
        "  {:<8} {:<10} {:<10} {:<16} {:<44} {}",
        header[0], header[1], header[2], header[3], header[4], header[5]
    );
    for r in &rows {
        let state = if r.ready { "ready" } else { "no gateway" };
        println!(
            "  {:<8} {:<10} {:<10} {:<16} {:<44} {state}",
            "east", NS, r.remote, r.mirror, r.endpoints
        );
    }
    println!("  (converged in {:.0?})", start.elapsed());
    anyhow::ensure!(done(&rows), "the mirror did not converge within 30 s");
    Ok(())
}
