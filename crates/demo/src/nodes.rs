//! The story on real nodes ([`crate::mode::Mode::Nodes`]): each cluster has a node
//! (kubelet + containerd, docs/real-node.md). The controller runs as a Pod in west,
//! installed from `service-mirror install --image service-mirror.local/service-mirror:dev`
//! as a user applies it; its links are the same Secret and Link as in the other modes, but
//! name each remote's apiserver as pods reach it (`LocalCluster::fabric_server_url`). The
//! remotes' workloads are busybox httpd Pods; each gateway is a busybox Pod (a stand-in
//! routing on the Host header, crates/demo/src/pods.rs) behind a LoadBalancer Service whose
//! ingress is the remote's node address. Requests come from a client Pod in west, read
//! from its log. `check` and `gateways` reach the controller's admin port through west's
//! node (a NodePort Service beside install's `service-mirror-admin`).

use crate::pods::{self, ClientLog, Request, answered, between, failing};
use crate::table::step;
use crate::{LEASE_NAME, METRICS_PORT, NS, WORKLOAD_PORT, exported, merge, set_gateway_ip};
use anyhow::Context;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams, PatchParams, PostParams};
use local_cluster::{ClusterOptions, LocalCluster, apply_yaml, ensure_namespace};
use service_mirror_controller::cli::allow::DEFAULT_NAMESPACE;
use service_mirror_core::labels::{PROBE_PATH_ANNOTATION, PROBE_PERIOD_ANNOTATION};
use service_mirror_testkit::Baseline;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

/// The client Pod, in west's `default` namespace (outside the mirrors' `shop`).
const CLIENT: &str = "client";
const CLIENT_NS: &str = "default";
/// The NodePort Service in front of the controller's admin port.
const ADMIN_NODE_PORT: &str = "service-mirror-admin-node";
/// A Pod is Ready within this long (measured 2-5 s; images are imported, never pulled).
const POD_READY: Duration = Duration::from_secs(120);

struct Remote {
    cluster: LocalCluster,
    client: Client,
    services: &'static [&'static str],
    by_link: bool,
}

/// `http://<mirror>.shop.svc.cluster.local[:port]/`
fn url(mirror: &str, port: u16) -> String {
    let host = crate::traffic::host(mirror, NS);
    if port == 80 {
        format!("http://{host}/")
    } else {
        format!("http://{host}:{port}/")
    }
}

/// What `service-mirror install --image <the local image>` prints: this very binary
/// (`service-mirror demo`) run as a user runs it.
fn install_output() -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("locating the service-mirror binary")?;
    let out = std::process::Command::new(&exe)
        .args(["install", "--image", pods::CONTROLLER_IMAGE])
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {} install", exe.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} install failed: {}",
        exe.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// A NodePort copy of install's `service-mirror-admin`: the admin port (`/metrics`) on
/// west's node address, which this process reaches on the fabric. Returns that address.
async fn admin_through_node(local: &Client, node: Ipv4Addr) -> anyhow::Result<SocketAddr> {
    let api: Api<Service> = Api::namespaced(local.clone(), DEFAULT_NAMESPACE);
    let admin = api
        .get("service-mirror-admin")
        .await?
        .spec
        .unwrap_or_default();
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": ADMIN_NODE_PORT},
        "spec": {"type": "NodePort", "selector": admin.selector, "ports": admin.ports},
    }))?;
    let created = api.create(&PostParams::default(), &svc).await?;
    let port = created
        .spec
        .and_then(|s| s.ports)
        .and_then(|p| p.first().and_then(|p| p.node_port))
        .context("no nodePort assigned")?;
    Ok(SocketAddr::from((node, u16::try_from(port)?)))
}

/// The gateway Service (LoadBalancer, its ingress written by hand: no cloud here) in
/// front of the gateway Pods, and the first of them.
async fn start_gateway(r: &Remote, node: Ipv4Addr) -> anyhow::Result<()> {
    pods::create(
        &r.client,
        &pods::gateway("linkerd-gateway-1", DEFAULT_NAMESPACE),
    )
    .await?;
    let gw: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "linkerd-gateway", "annotations": {
            PROBE_PATH_ANNOTATION: "/ready", PROBE_PERIOD_ANNOTATION: crate::PROBE_PERIOD_SECS}},
        "spec": {"type": "LoadBalancer", "selector": {"app": "linkerd-gateway"}, "ports": [
            {"name": "mc-gateway", "port": local_cluster::GATEWAY_PORT, "targetPort": "mc-gateway"},
            {"name": "mc-probe", "port": local_cluster::PROBE_PORT, "targetPort": "mc-probe"}]}
    }))?;
    Api::<Service>::namespaced(r.client.clone(), DEFAULT_NAMESPACE)
        .create(&PostParams::default(), &gw)
        .await?;
    set_gateway_ip(&r.client, node).await
}

/// An exported Service `name` in front of a workload Pod answering `<cluster>/<name>`
/// (and `answers` more).
async fn serve(r: &Remote, name: &str, more: &[(u16, &str)]) -> anyhow::Result<()> {
    let body = format!("{}/{name}", r.cluster.name());
    let mut answers = vec![(WORKLOAD_PORT, body.as_str())];
    answers.extend_from_slice(more);
    pods::create(&r.client, &pods::workload(name, NS, name, &answers)).await?;
    let mut svc = exported(name)?;
    let spec = svc.spec.get_or_insert_with(Default::default);
    spec.selector = Some([("app".to_string(), name.to_string())].into());
    for p in spec.ports.iter_mut().flatten() {
        p.target_port = Some(
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(WORKLOAD_PORT.into()),
        );
    }
    Api::<Service>::namespaced(r.client.clone(), NS)
        .create(&PostParams::default(), &svc)
        .await?;
    Ok(())
}

/// The controller Pod once Ready and behind its admin Services: its name, node, and the
/// Lease holder.
async fn controller_ready(local: &Client, since: Instant) -> anyhow::Result<()> {
    let deployments = Api::<Deployment>::namespaced(local.clone(), DEFAULT_NAMESPACE)
        .list(&ListParams::default())
        .await?;
    let d = deployments
        .items
        .first()
        .context("install made no Deployment")?;
    let labels = d
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let pod = pods::ready(local, DEFAULT_NAMESPACE, &selector.join(","), POD_READY).await?;
    let endpoints: Api<Endpoints> = Api::namespaced(local.clone(), DEFAULT_NAMESPACE);
    for name in ["service-mirror-admin", ADMIN_NODE_PORT] {
        let start = Instant::now();
        while !endpoints.get_opt(name).await?.is_some_and(|e| {
            e.subsets
                .iter()
                .flatten()
                .any(|s| s.addresses.as_ref().is_some_and(|a| !a.is_empty()))
        }) {
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(30),
                "{name} has no ready endpoint within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let holder = Api::<Lease>::namespaced(local.clone(), DEFAULT_NAMESPACE)
        .get_opt(LEASE_NAME)
        .await?
        .and_then(|l| l.spec?.holder_identity)
        .unwrap_or_else(|| "(none yet)".into());
    let spec = pod.spec.unwrap_or_default();
    println!(
        "  the controller Pod {} on node {}: Ready {:.1?} after install (image {}); leader Lease held by {holder}",
        pod.metadata.name.unwrap_or_default(),
        spec.node_name.unwrap_or_default(),
        since.elapsed(),
        spec.containers
            .first()
            .and_then(|c| c.image.clone())
            .unwrap_or_default(),
    );
    Ok(())
}

/// Runs the story on real nodes; `started` is when the demo began.
pub(crate) async fn story(keep: bool, started: Instant) -> anyhow::Result<()> {
    println!(
        "Starting three local clusters, each with a real node (etcd, kube-apiserver, kube-controller-manager, kube-scheduler; on the node containerd, kubelet, kube-proxy, CoreDNS; the images imported, never pulled)..."
    );
    let opts = || ClusterOptions {
        nodes: 1,
        ..Default::default()
    };
    let (west, east, north) = tokio::try_join!(
        LocalCluster::start_with("west", opts()),
        LocalCluster::start_with("east", opts()),
        LocalCluster::start_with("north", opts())
    )?;
    let node_ip = |c: &LocalCluster| {
        c.data_plane()
            .and_then(|p| p.nodes().first())
            .map(|n| n.ip())
    };
    let west_node = node_ip(&west).context("west has no node")?;
    println!(
        "  west (local) {}   east {}   north {}   nodes Ready in {:.1?}",
        west.server_url(),
        east.server_url(),
        north.server_url(),
        started.elapsed()
    );
    let local = west.client().await?;

    println!(
        "\n$ service-mirror install --image {} | kubectl --context west apply -f -",
        pods::CONTROLLER_IMAGE
    );
    let installed = Instant::now();
    apply_yaml(&local, &install_output()?).await?;
    crate::install_link_crd(&local).await?;
    ensure_namespace(&local, NS).await?;
    let admin = admin_through_node(&local, west_node).await?;
    let urls: Vec<String> = [
        ("web-east", 80),
        ("cart-east", 80),
        ("payments-north", 80),
        ("search-north", 80),
        ("web-east", METRICS_PORT),
        ("reviews-north", 80),
    ]
    .iter()
    .map(|(m, p)| url(m, *p))
    .collect();
    pods::create(&local, &pods::client(CLIENT, CLIENT_NS, &urls)).await?;
    // What the mirror must never touch: every object of west before its first link, once
    // the controller's own objects settled (its admin Services' Endpoints list it).
    controller_ready(&local, installed).await?;
    let baseline = Baseline::capture(&local).await?;

    println!(
        "\nRemote side: `service-mirror allow`, a gateway Pod (a stand-in: busybox nc routing on the Host header, no mTLS) behind a LoadBalancer Service at the node's address, exported services answered by busybox httpd Pods."
    );
    println!(
        "Local side: in {DEFAULT_NAMESPACE}, east's link Secret (`service-mirror link`), north's credentials Secret and `Link` (`link --format link`), each naming its apiserver as pods reach it; the controller runs as a Pod; a client Pod requests every mirror every 0.25 s."
    );
    let mut remotes = Vec::new();
    for (cluster, services, by_link) in [
        (east, &["web", "cart"][..], false),
        (north, &["payments", "search"][..], true),
    ] {
        let client = cluster.client().await?;
        remotes.push(Remote {
            cluster,
            client,
            services,
            by_link,
        });
    }
    for r in &remotes {
        let token = crate::allowed_token(&r.cluster, &r.client).await?;
        let server = r
            .cluster
            .fabric_server_url()
            .context("a node cluster has a fabric URL")?;
        ensure_namespace(&r.client, NS).await?;
        start_gateway(r, node_ip(&r.cluster).context("no node")?).await?;
        for name in r.services {
            let more: &[(u16, &str)] = if *name == "web" {
                &[(METRICS_PORT, "east/web:metrics")]
            } else {
                &[]
            };
            serve(r, name, more).await?;
        }
        if r.by_link {
            crate::link_by_link(&local, &r.cluster, &r.client, &server, &token).await?;
        } else {
            crate::link_cluster(&local, &r.cluster, &server, &token).await?;
        }
    }

    step(
        &local,
        "The controller (a Pod in west) links east and north into west; every mirror gets the gateway's address.",
        |t| t.len() == 4 && t.iter().all(|r| r.state == "ready"),
    )
    .await?;
    let log = ClientLog::new(&local, CLIENT_NS, CLIENT);
    println!(
        "  Requests from the client Pod in west (its log): west's CoreDNS and kube-proxy, the remote's gateway Pod at its LoadBalancer address, the remote's DNS and kube-proxy, the workload Pod:"
    );
    for r in &remotes {
        for svc in r.services {
            let body = format!("{}/{svc}", r.cluster.name());
            answered(
                &log,
                &url(&format!("{svc}-{}", r.cluster.name()), 80),
                &body,
                "after ",
            )
            .await?;
        }
    }

    Api::<Service>::namespaced(remotes[0].client.clone(), NS)
        .patch("web", &PatchParams::default(), &merge(serde_json::json!({"spec": {"ports": [
            {"name": "http", "port": 80, "targetPort": WORKLOAD_PORT, "protocol": "TCP"},
            {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT, "protocol": "TCP"}]}})))
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
    answered(
        &log,
        &url("web-east", METRICS_PORT),
        "east/web:metrics",
        "after ",
    )
    .await?;

    let east_plane = remotes[0]
        .cluster
        .data_plane()
        .context("east has a data plane")?;
    let old = east_plane.node_ip();
    let moved = east_plane.add_address()?;
    set_gateway_ip(&remotes[0].client, moved).await?;
    let moved_prefix = format!("{moved} ");
    step(
        &local,
        &format!("East's gateway moves to {moved}: every east mirror points at the new address."),
        |t| {
            t.iter()
                .filter(|r| r.cluster == "east")
                .all(|r| r.endpoints.starts_with(&moved_prefix))
        },
    )
    .await?;
    for svc in remotes[0].services {
        let body = format!("east/{svc}");
        answered(
            &log,
            &url(&format!("{svc}-east"), 80),
            &body,
            "through the new address, after ",
        )
        .await?;
    }
    old_address_closed(&west, old).await?;

    Api::<Service>::namespaced(remotes[1].client.clone(), NS)
        .patch("search", &PatchParams::default(), &crate::unexport_patch())
        .await?;
    step(
        &local,
        "search is unexported in north: its mirror is removed.",
        |t| t.len() == 3,
    )
    .await?;
    let search = url("search-north", 80);
    let since = Timestamp::now();
    let gone = log
        .until(&search, since, "a name that no longer resolves", |rs| {
            rs.iter()
                .find(|r| !r.ok && r.text.contains("bad address"))
                .cloned()
        })
        .await?;
    println!(
        "  GET {search}: {} ({:.1?} after the step)",
        gone.text,
        between(since, gone.at)
    );

    pods::kill(&remotes[0].client, DEFAULT_NAMESPACE, "linkerd-gateway-1").await?;
    step(
        &local,
        "East's gateway Pod is deleted: its probes fail, east mirrors turn not ready, so clients fail over.",
        |t| t.iter().filter(|r| r.cluster == "east").all(|r| r.state == "not ready"),
    )
    .await?;
    let web_east = url("web-east", 80);
    failing(&log, &web_east).await?;
    pods::create(
        &remotes[0].client,
        &pods::gateway("linkerd-gateway-2", DEFAULT_NAMESPACE),
    )
    .await?;
    step(
        &local,
        "A new gateway Pod is Ready: east's mirrors are ready.",
        |t| t.iter().all(|r| r.state == "ready"),
    )
    .await?;
    answered(&log, &web_east, "east/web", "again, after ").await?;

    let payments = url("payments-north", 80);
    let from = Timestamp::now();
    remotes[1].cluster.stop_apiserver();
    let down = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    step(
        &local,
        "North's apiserver stops: its mirrors stay as they were.",
        |t| t.len() == 3,
    )
    .await?;
    remotes[1].cluster.start_apiserver().await?;
    let (down, to) = (down.elapsed(), Timestamp::now());
    // The last requests of the window reach the log within a pause.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during: Vec<Request> = log
        .since(&payments, from)
        .await?
        .into_iter()
        .filter(|r| r.at <= to)
        .collect();
    let failed: Vec<&Request> = during.iter().filter(|r| !r.ok).collect();
    println!(
        "  GET {payments} every 0.25 s while north's apiserver was down ({down:.1?}): {} requests, {} failed",
        during.len(),
        failed.len()
    );
    anyhow::ensure!(
        !during.is_empty() && failed.is_empty(),
        "requests during north's outage: {failed:?}"
    );
    remotes[1].client = remotes[1].cluster.client().await?;
    serve(&remotes[1], "reviews", &[]).await?;
    step(
        &local,
        "North is back: the controller resyncs, and a service exported meanwhile appears.",
        |t| t.len() == 4 && t.iter().all(|r| r.state == "ready"),
    )
    .await?;
    answered(&log, &url("reviews-north", 80), "north/reviews", "after ").await?;

    let checked: Vec<(&str, &Client, bool)> = remotes
        .iter()
        .map(|r| (r.cluster.name(), &r.client, r.by_link))
        .collect();
    crate::invariants(&local, &checked, &baseline).await?;
    crate::print_check(&local, &admin.to_string()).await?;
    println!("Story told in {:.1?}.", started.elapsed());
    if keep {
        println!("\nThe clusters keep running (Ctrl-C stops them and removes their files):");
        let west_kc = west.admin_kubeconfig().path;
        println!(
            "  kubectl --kubeconfig {} get pods -A -o wide",
            west_kc.display()
        );
        println!(
            "  kubectl --kubeconfig {} logs -n {CLIENT_NS} {CLIENT} --tail 20",
            west_kc.display()
        );
        println!(
            "  kubectl --kubeconfig {} logs -n {DEFAULT_NAMESPACE} deploy/service-mirror",
            west_kc.display()
        );
        for r in &remotes {
            println!(
                "  kubectl --kubeconfig {} get pods,svc -A",
                r.cluster.admin_kubeconfig().path.display()
            );
        }
        tokio::signal::ctrl_c().await?;
    }
    Ok(())
}

/// After the move, the old address no longer leads to the gateway (east's kube-proxy
/// dropped its LoadBalancer rule): a request from west's node is refused (polled, 10 s).
async fn old_address_closed(west: &LocalCluster, old: Ipv4Addr) -> anyhow::Result<()> {
    let plane = west.data_plane().context("west has a data plane")?;
    let addr = SocketAddr::from((old, local_cluster::GATEWAY_PORT));
    let host = crate::traffic::host("web-east", NS);
    let start = Instant::now();
    loop {
        match plane.http_get_addr(addr, &host, "/").await {
            Err(e) => {
                println!("  the old address {addr} no longer leads to the gateway: {e}");
                return Ok(());
            }
            Ok(a) if start.elapsed() > Duration::from_secs(10) => {
                anyhow::bail!("the old gateway address {addr} still answers: {}", a.status)
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}
