//! `service-mirror demo`: three real local clusters, linked and mirroring, and a short
//! scripted story narrated step by step.
//!
//! `west` is the local cluster, `east` and `north` are remote. Each remote gets the
//! remote-side RBAC of `allow` and a gateway; `west` gets the link Secrets of `link`, and
//! the controller (the same link manager as `run`) runs in this process. Gateways are
//! published at documentation addresses (192.0.2.N, never contacted); their probes are
//! redirected to small HTTP servers on 127.0.0.N that the story can stop.

#![forbid(unsafe_code)]

use anyhow::Context;
use k8s_openapi::api::core::v1::{Endpoints, Secret, Service};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use local_cluster::{LocalCluster, apply_yaml};
use service_mirror_controller::cli::allow::{
    DEFAULT_NAMESPACE, DEFAULT_SERVICE_ACCOUNT, allow_manifests, token_secret_name,
};
use service_mirror_controller::cli::link::link_secret;
use service_mirror_controller::events::EventRecorder;
use service_mirror_controller::gateway::ProbeRedirect;
use service_mirror_controller::link_controller::{LinkConfig, LinkDeps};
use service_mirror_controller::links::{LinkManager, LinkManagerOptions};
use service_mirror_core::NamespaceFilter;
use service_mirror_core::labels::{
    CLUSTER_NAME_LABEL, GATEWAY_NAME_ANNOTATION, GATEWAY_NS_ANNOTATION, MIRRORED_SERVICE_LABEL,
    MIRRORED_SERVICE_VALUE, PROBE_PATH_ANNOTATION, PROBE_PERIOD_ANNOTATION,
    REMOTE_SVC_FQ_NAME_ANNOTATION,
};
use service_mirror_testkit::{Baseline, Remote as InvariantRemote, World, check};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Options of the demo.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Leave the clusters running at the end, with kubectl commands (Ctrl-C stops them).
    #[arg(long)]
    keep: bool,
}

const NS: &str = "shop";
/// Probe settings of the demo's gateways: quick, so a dead gateway shows within seconds.
const PROBE_PERIOD_SECS: &str = "1";

/// A remote cluster of the demo and its gateway.
struct Remote {
    cluster: LocalCluster,
    client: Client,
    /// Last octet of the gateway's address (192.0.2.N outside, 127.0.0.N for probes).
    gateway_octet: u8,
    services: &'static [&'static str],
}

/// Runs the demo; Ctrl-C stops it at any point and removes every file.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    service_mirror_controller::logging::init_logging(
        "warn,kube_client=off",
        service_mirror_controller::logging::LogFormat::Plain,
    )?;
    tokio::select! {
        r = story(args) => r,
        _ = tokio::signal::ctrl_c() => {
            println!("\nInterrupted: stopping the clusters and removing their files.");
            Ok(())
        }
    }
}

async fn story(args: DemoArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    println!(
        "Starting three local clusters (etcd + kube-apiserver each; the first run builds them, ~5 min)..."
    );
    let (west, east, north) = tokio::try_join!(
        LocalCluster::start("west"),
        LocalCluster::start("east"),
        LocalCluster::start("north")
    )?;
    println!(
        "  west (local) {}   east {}   north {}   ready in {:.1?}",
        west.server_url(),
        east.server_url(),
        north.server_url(),
        started.elapsed()
    );
    let local = west.client().await?;
    // What the mirror must never touch: every object of west before it starts.
    let baseline = Baseline::capture(&local).await?;
    let mut remotes = Vec::new();
    for (cluster, octet, services) in [
        (east, 10u8, &["web", "cart"][..]),
        (north, 20, &["payments", "search"][..]),
    ] {
        let client = cluster.client().await?;
        serve_gateway_health(octet, Arc::new(AtomicBool::new(true))).await?;
        remotes.push(Remote {
            cluster,
            client,
            gateway_octet: octet,
            services,
        });
    }

    println!(
        "\nRemote side: `service-mirror allow` (a ServiceAccount that may only read Services), a gateway, exported services."
    );
    println!(
        "Local side: `service-mirror link` Secrets in {DEFAULT_NAMESPACE}, and the controller in this process."
    );
    local_cluster::ensure_namespace(&local, DEFAULT_NAMESPACE).await?;
    for r in &remotes {
        link_remote(&local, r).await?;
        setup_remote(r).await?;
    }
    let manager = LinkManager::start(
        local.clone(),
        EventRecorder::new(local.clone(), None),
        controller_options(),
    );

    step(
        &local,
        "The controller links east and north into west; every mirror gets the gateway's address.",
        |t| t.len() == 4 && t.iter().all(|r| r.state == "ready"),
    )
    .await?;

    let east_svcs: Api<Service> = Api::namespaced(remotes[0].client.clone(), NS);
    east_svcs
        .patch("web", &PatchParams::default(), &merge(serde_json::json!({"spec": {"ports": [
            {"name": "http", "port": 80, "protocol": "TCP"}, {"name": "metrics", "port": 9090, "protocol": "TCP"}]}})))
        .await?;
    step(
        &local,
        "A port is added to east's web: its mirror and endpoints follow.",
        |t| {
            t.iter()
                .any(|r| r.remote == "web" && r.endpoints.contains("metrics=4143"))
        },
    )
    .await?;

    // The gateway moves to a new address; a health server answers there too.
    let moved = 11u8;
    let moved_health = Arc::new(AtomicBool::new(true));
    serve_gateway_health(moved, moved_health.clone()).await?;
    set_gateway_ip(&remotes[0].client, moved).await?;
    step(
        &local,
        "East's gateway moves to 192.0.2.11: every east mirror points at the new address.",
        |t| {
            t.iter()
                .filter(|r| r.cluster == "east")
                .all(|r| r.endpoints.starts_with("192.0.2.11"))
        },
    )
    .await?;

    let north_svcs: Api<Service> = Api::namespaced(remotes[1].client.clone(), NS);
    north_svcs
        .patch(
            "search",
            &PatchParams::default(),
            &merge(
                serde_json::json!({"metadata": {"annotations": {GATEWAY_NAME_ANNOTATION: null}}}),
            ),
        )
        .await?;
    step(
        &local,
        "search is unexported in north: its mirror is removed.",
        |t| t.len() == 3,
    )
    .await?;

    moved_health.store(false, Ordering::SeqCst);
    step(&local, "East's gateway stops answering its probes: east mirrors turn not ready, so clients fail over.", |t| {
        t.iter().filter(|r| r.cluster == "east").all(|r| r.state == "not ready")
    })
    .await?;
    moved_health.store(true, Ordering::SeqCst);
    step(
        &local,
        "East's gateway answers again: its mirrors are ready.",
        |t| t.iter().all(|r| r.state == "ready"),
    )
    .await?;

    remotes[1].cluster.stop_apiserver();
    tokio::time::sleep(Duration::from_secs(2)).await;
    step(
        &local,
        "North's apiserver stops: its mirrors stay as they were.",
        |t| t.len() == 3,
    )
    .await?;
    remotes[1].cluster.start_apiserver().await?;
    let north_svcs: Api<Service> = Api::namespaced(remotes[1].cluster.client().await?, NS);
    north_svcs
        .create(&PostParams::default(), &exported("reviews")?)
        .await?;
    step(
        &local,
        "North is back: the controller resyncs, and a service exported meanwhile appears.",
        |t| t.len() == 4 && t.iter().all(|r| r.state == "ready"),
    )
    .await?;

    let world = World {
        local: local.clone(),
        remotes: remotes
            .iter()
            .map(|r| InvariantRemote {
                cluster: r.cluster.name().to_string(),
                domain: None,
                client: r.client.clone(),
            })
            .collect(),
        namespaces: NamespaceFilter::default(),
        controller_namespace: Some(DEFAULT_NAMESPACE.into()),
    };
    let violations = check(&world, &baseline).await;
    println!(
        "\nInvariant check (mirrors = exported services of linked clusters, nothing foreign changed): {} violation(s).",
        violations.len()
    );
    for v in &violations {
        println!("  {v:?}");
    }
    anyhow::ensure!(
        violations.is_empty(),
        "the world does not keep its invariants"
    );
    println!("Story told in {:.1?}.", started.elapsed());
    if args.keep {
        println!("\nThe clusters keep running (Ctrl-C stops them and removes their files):");
        println!(
            "  kubectl --kubeconfig {} get svc,endpoints -n {NS}",
            west.admin_kubeconfig().path.display()
        );
        for r in &remotes {
            println!(
                "  kubectl --kubeconfig {} get svc -A",
                r.cluster.admin_kubeconfig().path.display()
            );
        }
        tokio::signal::ctrl_c().await?;
    }
    manager.shutdown().await;
    Ok(())
}

fn merge(v: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(v)
}

fn controller_options() -> LinkManagerOptions {
    LinkManagerOptions {
        namespace: DEFAULT_NAMESPACE.into(),
        workers: 2,
        rotation_timeout: Duration::from_secs(30),
        collect_unlinked: true,
        config: LinkConfig {
            probe_timeout: Duration::from_millis(500),
            probe_failure_threshold: 2,
            ..LinkConfig::default()
        },
        deps: LinkDeps {
            // Probes go to the local health servers, never to the published addresses.
            probe_redirect: Some(ProbeRedirect(Arc::new(|a: SocketAddr| match a.ip() {
                std::net::IpAddr::V4(v4) if v4.octets()[..3] == [192, 0, 2] => {
                    SocketAddr::from(([127, 0, 0, v4.octets()[3]], a.port()))
                }
                _ => a,
            }))),
            ..LinkDeps::default()
        },
    }
}

/// An HTTP server on 127.0.0.N:4191 answering 200 while `healthy`, 503 otherwise.
async fn serve_gateway_health(octet: u8, healthy: Arc<AtomicBool>) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener =
        tokio::net::TcpListener::bind(("127.0.0.".to_string() + &octet.to_string(), 4191))
            .await
            .with_context(|| {
                format!("binding the demo gateway's health server on 127.0.0.{octet}:4191")
            })?;
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let ok = healthy.load(Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 512];
                let _ = conn.read(&mut buf).await;
                let answer: &[u8] = if ok {
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                } else {
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
                };
                let _ = conn.write_all(answer).await;
            });
        }
    });
    Ok(())
}

/// `allow` on the remote, the token a controller manager would fill, and `link`'s Secret
/// applied to the local cluster.
async fn link_remote(local: &Client, r: &Remote) -> anyhow::Result<()> {
    let manifests = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": allow_manifests(DEFAULT_NAMESPACE, DEFAULT_SERVICE_ACCOUNT)});
    apply_yaml(&r.client, &manifests.to_string()).await?;
    let token_secret = token_secret_name(DEFAULT_SERVICE_ACCOUNT);
    r.cluster
        .fill_token_secret(DEFAULT_NAMESPACE, &token_secret)
        .await?;
    let filled = Api::<Secret>::namespaced(r.client.clone(), DEFAULT_NAMESPACE)
        .get(&token_secret)
        .await?;
    let token = filled
        .data
        .as_ref()
        .and_then(|d| d.get("token"))
        .map(|t| String::from_utf8_lossy(&t.0).into_owned())
        .context("token")?;
    let secret = link_secret(
        r.cluster.name(),
        "cluster.local",
        DEFAULT_NAMESPACE,
        &r.cluster.server_url(),
        r.cluster.ca_pem().as_bytes(),
        &token,
    )?;
    Api::<Secret>::namespaced(local.clone(), DEFAULT_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

fn exported(name: &str) -> anyhow::Result<Service> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": {
            GATEWAY_NAME_ANNOTATION: "linkerd-gateway", GATEWAY_NS_ANNOTATION: DEFAULT_NAMESPACE}},
        "spec": {"ports": [{"name": "http", "port": 80}]}
    }))?)
}

async fn set_gateway_ip(remote: &Client, octet: u8) -> anyhow::Result<()> {
    // No cloud here: the load balancer status is written by hand.
    let status = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": format!("192.0.2.{octet}")}]}}});
    Api::<Service>::namespaced(remote.clone(), DEFAULT_NAMESPACE)
        .patch_status("linkerd-gateway", &PatchParams::default(), &merge(status))
        .await?;
    Ok(())
}

async fn setup_remote(r: &Remote) -> anyhow::Result<()> {
    local_cluster::ensure_namespace(&r.client, NS).await?;
    let gw: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "linkerd-gateway", "annotations": {
            PROBE_PATH_ANNOTATION: "/ready", PROBE_PERIOD_ANNOTATION: PROBE_PERIOD_SECS}},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "mc-gateway", "port": 4143}, {"name": "mc-probe", "port": 4191}]}
    }))?;
    Api::<Service>::namespaced(r.client.clone(), DEFAULT_NAMESPACE)
        .create(&PostParams::default(), &gw)
        .await?;
    set_gateway_ip(&r.client, r.gateway_octet).await?;
    for name in r.services {
        Api::<Service>::namespaced(r.client.clone(), NS)
            .create(&PostParams::default(), &exported(name)?)
            .await?;
    }
    Ok(())
}

/// One row of the table.
struct Row {
    cluster: String,
    remote: String,
    mirror: String,
    endpoints: String,
    state: &'static str,
}

async fn table(local: &Client) -> anyhow::Result<Vec<Row>> {
    let lp = ListParams::default().labels(&format!(
        "{MIRRORED_SERVICE_LABEL}={MIRRORED_SERVICE_VALUE}"
    ));
    let services = Api::<Service>::namespaced(local.clone(), NS)
        .list(&lp)
        .await?;
    let endpoints = Api::<Endpoints>::namespaced(local.clone(), NS)
        .list(&lp)
        .await?;
    let mut rows = Vec::new();
    for s in services.items {
        let name = s.metadata.name.clone().unwrap_or_default();
        let label = |k: &str| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(k))
                .cloned()
                .unwrap_or_default()
        };
        let fq = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REMOTE_SVC_FQ_NAME_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        let subsets = endpoints
            .items
            .iter()
            .find(|e| e.metadata.name.as_deref() == Some(name.as_str()))
            .and_then(|e| e.subsets.clone())
            .unwrap_or_default();
        let (mut ready, mut not_ready, mut ports) = (Vec::new(), Vec::new(), Vec::new());
        for ss in &subsets {
            ready.extend(ss.addresses.iter().flatten().map(|a| a.ip.clone()));
            not_ready.extend(
                ss.not_ready_addresses
                    .iter()
                    .flatten()
                    .map(|a| a.ip.clone()),
            );
            ports.extend(
                ss.ports
                    .iter()
                    .flatten()
                    .map(|p| format!("{}={}", p.name.as_deref().unwrap_or("-"), p.port)),
            );
        }
        let state = match (ready.is_empty(), not_ready.is_empty()) {
            (false, _) => "ready",
            (true, false) => "not ready",
            (true, true) => "no gateway",
        };
        let addrs: Vec<String> = ready.into_iter().chain(not_ready).collect();
        rows.push(Row {
            cluster: label(CLUSTER_NAME_LABEL),
            remote: fq.split('.').next().unwrap_or_default().to_string(),
            endpoints: if addrs.is_empty() {
                "-".into()
            } else {
                format!("{} [{}]", addrs.join(","), ports.join(" "))
            },
            state,
            mirror: name,
        });
    }
    rows.sort_by(|a, b| (&a.cluster, &a.mirror).cmp(&(&b.cluster, &b.mirror)));
    Ok(rows)
}

/// Narrates a step and prints the local table live, each time it changes, until it
/// satisfies `done` (at most 30 s).
async fn step(
    local: &Client,
    narration: &str,
    done: impl Fn(&[Row]) -> bool,
) -> anyhow::Result<()> {
    println!("\n> {narration}");
    let start = Instant::now();
    let mut shown = String::new();
    loop {
        let rows = table(local).await?;
        let rendered = render(&rows);
        let finished = done(&rows);
        if rendered != shown {
            // Intermediate states are shown as they happen, marked with their time.
            if !finished {
                println!("  [{:>6.1?}]", start.elapsed());
            }
            print!("{rendered}");
            shown = rendered;
        }
        if finished {
            println!("  (converged in {:.1?})", start.elapsed());
            return Ok(());
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(30),
            "the mirror did not converge within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn render(rows: &[Row]) -> String {
    let h = [
        "CLUSTER",
        "NAMESPACE",
        "REMOTE",
        "MIRROR",
        "ENDPOINTS",
        "STATE",
    ];
    let mut out = format!(
        "  {:<7} {:<9} {:<9} {:<16} {:<42} {}\n",
        h[0], h[1], h[2], h[3], h[4], h[5]
    );
    if rows.is_empty() {
        out += "  (no mirror yet)\n";
    }
    for r in rows {
        out += &format!(
            "  {:<7} {:<9} {:<9} {:<16} {:<42} {}\n",
            r.cluster, NS, r.remote, r.mirror, r.endpoints, r.state
        );
    }
    out
}
