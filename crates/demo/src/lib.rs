//! `service-mirror demo`: three real local clusters, linked and mirroring, and a short
//! scripted story narrated step by step.
//!
//! `west` is the local cluster, `east` and `north` are remote. Each remote gets the
//! remote-side RBAC of `allow` and a gateway; `west` gets east's link Secret and north's
//! `Link` (both as `link` prints them, `--format secret` and `--format link`), and the
//! controller (the same link manager, Lease and admin server as `run`) runs in this
//! process. The story ends with what `check` reports.
//!
//! Without traffic, gateways are published at documentation addresses (192.0.2.N, never
//! contacted); their probes are redirected to small HTTP servers on 127.0.0.N that the
//! story can stop. With traffic ([`mode::decide`]: root, the data-plane binaries built)
//! every cluster gets a data plane (docs/data-plane.md): each remote's services are
//! answered by workloads on its node behind local-cluster's stand-in gateway, and the
//! story sends real requests from west's node through the mirrors, on 198.18.0.0/15 only.

#![forbid(unsafe_code)]

pub mod conformance;
mod linking;
pub mod mode;
mod nodes;
mod pods;
mod remote;
mod table;
pub mod traffic;
mod verify;

use linking::*;
use remote::*;
use verify::*;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Endpoints, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use local_cluster::{
    ClusterOptions, DataPlane, GATEWAY_PORT, Gateway, LocalCluster, PROBE_PORT, Workload,
    apply_yaml, publish_endpoints,
};
use mode::{Host, Mode};
use service_mirror_controller::admin::{self, AdminState};
use service_mirror_controller::cli::allow::{
    DEFAULT_NAMESPACE, DEFAULT_SERVICE_ACCOUNT, allow_manifests, token_secret_name,
};
use service_mirror_controller::cli::check::{MetricsSource, checks, gather};
use service_mirror_controller::cli::link::{kubeconfig_yaml, link_secret};
use service_mirror_controller::cli::link_gen::{LinkGenArgs, credentials_secret, link_resource};
use service_mirror_controller::events::EventRecorder;
use service_mirror_controller::gateway::ProbeRedirect;
use service_mirror_controller::leader::{LeaderOptions, elect};
use service_mirror_controller::link_controller::{LinkConfig, LinkDeps};
use service_mirror_controller::links::{
    LINK_CRD_YAML, LinkManager, LinkManagerOptions, LinkResource, LinkSources,
};
use service_mirror_controller::metrics::Metrics;
use service_mirror_core::NamespaceFilter;
use service_mirror_core::labels::{
    GATEWAY_NAME_ANNOTATION, GATEWAY_NS_ANNOTATION, PROBE_PATH_ANNOTATION, PROBE_PERIOD_ANNOTATION,
    owner_selector,
};
use service_mirror_testkit::{Baseline, Remote as InvariantRemote, Violation, World, check};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use table::step;
use tokio_util::sync::CancellationToken;

/// Options of the demo.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Leave the clusters running at the end, with kubectl commands (Ctrl-C stops them).
    #[arg(long)]
    keep: bool,
    /// Tell the story without real traffic, even where it can run (as root, with the
    /// data-plane binaries built).
    #[arg(long)]
    no_traffic: bool,
    /// Tell the story with the controller in this process and requests from west's node
    /// namespace, even where real nodes can run (as root, with the node binaries and
    /// images built).
    #[arg(long)]
    no_nodes: bool,
    /// Instead of the story: two linked clusters, each named by its ClusterProperty
    /// `id.k8s.io` (MCS on by default), and a kubeconfig for the upstream MCS
    /// conformance suite (see `conformance.rs`), until Ctrl-C. On real nodes where they
    /// can run (the suite's DNS specs then run too), as the story decides: --no-nodes,
    /// --no-traffic narrow it.
    #[arg(long)]
    mcs_conformance: bool,
}

pub(crate) const NS: &str = "shop";
/// Probe settings of the demo's gateways: quick, so a dead gateway shows within seconds.
pub(crate) const PROBE_PERIOD_SECS: &str = "1";
/// Port of the `metrics` port the story adds to east's web (and, with traffic, of its
/// workload).
pub(crate) const METRICS_PORT: u16 = 9090;
/// Port of the workload of a remote's i-th service: this + i (on the remote's node).
pub(crate) const WORKLOAD_PORT: u16 = 8080;

/// Runs the demo; Ctrl-C stops it at any point and removes every file.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    service_mirror_controller::logging::init_logging(
        "warn,kube_client=off",
        service_mirror_controller::logging::LogFormat::Plain,
    )?;
    if args.mcs_conformance {
        let decision = mode::decide(&Host::here(args.no_traffic, args.no_nodes))?;
        if let Some(line) = &decision.skipped {
            println!("{line}");
        }
        return conformance::run(decision.mode).await;
    }
    tokio::select! {
        r = story(args) => r,
        _ = tokio::signal::ctrl_c() => {
            println!("\nInterrupted: stopping the clusters and removing their files.");
            Ok(())
        }
    }
}

async fn start_clusters(
    traffic: bool,
) -> anyhow::Result<(LocalCluster, LocalCluster, LocalCluster)> {
    let opts = || ClusterOptions {
        data_plane: traffic,
        ..Default::default()
    };
    Ok(tokio::try_join!(
        LocalCluster::start_with("west", opts()),
        LocalCluster::start_with("east", opts()),
        LocalCluster::start_with("north", opts())
    )?)
}

async fn story(args: DemoArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let decision = mode::decide(&Host::here(args.no_traffic, args.no_nodes))?;
    if let Some(line) = &decision.skipped {
        println!("{line}");
    }
    let traffic = match decision.mode {
        Mode::Nodes => return nodes::story(args.keep, started).await,
        Mode::Traffic => true,
        Mode::Story => false,
    };
    if traffic {
        println!(
            "Starting three local clusters (etcd + kube-apiserver each, and a data plane: a node namespace with kube-proxy and CoreDNS, kube-controller-manager; the first run builds them, minutes)..."
        );
    } else {
        println!(
            "Starting three local clusters (etcd + kube-apiserver each; the first run builds them, ~5 min)..."
        );
    }
    let (west, east, north) = start_clusters(traffic).await?;
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
    for (cluster, octet, services, by_link) in [
        (east, 10u8, &["web", "cart"][..], false),
        (north, 20, &["payments", "search"][..], true),
    ] {
        let client = cluster.client().await?;
        let gateway_ip = match cluster.data_plane() {
            Some(plane) => plane.node_ip(),
            None => {
                serve_gateway_health(octet, Arc::new(AtomicBool::new(true))).await?;
                Ipv4Addr::new(192, 0, 2, octet)
            }
        };
        remotes.push(Remote {
            cluster,
            client,
            gateway_ip,
            services,
            by_link,
            gateway: None,
            workloads: Vec::new(),
        });
    }

    if traffic {
        println!(
            "\nRemote side: `service-mirror allow` (a ServiceAccount that may only read Services), a gateway (a stand-in on the remote's node: no mTLS), exported services, each answered by a workload on the remote's node."
        );
    } else {
        println!(
            "\nRemote side: `service-mirror allow` (a ServiceAccount that may only read Services), a gateway, exported services."
        );
    }
    println!(
        "Local side: in {DEFAULT_NAMESPACE}, east's link Secret (`service-mirror link`), north's credentials Secret and `Link` (`service-mirror link --format link`, the Link CRD applied first), and the controller in this process."
    );
    local_cluster::ensure_namespace(&local, DEFAULT_NAMESPACE).await?;
    install_link_crd(&local).await?;
    for r in &mut remotes {
        let token = remote_token(r).await?;
        // A Link carries the gateway's values: the gateway comes first.
        if r.by_link {
            setup_remote(r).await?;
            link_by_link(
                &local,
                &r.cluster,
                &r.client,
                &r.cluster.server_url(),
                &token,
            )
            .await?;
        } else {
            link_remote(&local, r, &token).await?;
            setup_remote(r).await?;
        }
    }
    let metrics = Metrics::new();
    let shutdown = CancellationToken::new();
    let (leader, election) = elect(
        local.clone(),
        LeaderOptions {
            namespace: DEFAULT_NAMESPACE.into(),
            lease_name: LEASE_NAME.into(),
            identity: "demo".into(),
            duration: Duration::from_secs(15),
        },
        metrics.clone(),
        shutdown.clone(),
    );
    // As `run`: each link writes only while its write Lease is held (`check` looks).
    let write_gates = service_mirror_controller::write_leases::WriteGates::default();
    let mut options = controller_options(metrics.clone(), leader.clone());
    options.deps.write_gates = Some(write_gates.clone());
    let manager = Arc::new(LinkManager::start(
        local.clone(),
        EventRecorder::new(local.clone(), None),
        options,
    ));
    let write_leases = {
        let manager = manager.clone();
        service_mirror_controller::write_leases::spawn(
            local.clone(),
            service_mirror_controller::write_leases::WriteLeaseOptions {
                namespace: DEFAULT_NAMESPACE.into(),
                identity: "demo".into(),
                duration: Duration::from_secs(15),
            },
            Some(leader),
            Arc::new(move || manager.link_set()),
            write_gates,
            None,
            metrics.clone(),
            shutdown.clone(),
        )
    };
    let gateways = {
        let manager = manager.clone();
        Arc::new(move || manager.gateways()) as Arc<dyn Fn() -> Vec<_> + Send + Sync>
    };
    let (admin_addr, admin_task) = admin::serve(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        AdminState {
            metrics,
            ready: Arc::new(|| true),
            gateways,
        },
        shutdown.clone(),
    )
    .await?;

    step(
        &local,
        "The controller links east and north into west; every mirror gets the gateway's address.",
        |t| t.len() == 4 && t.iter().all(|r| r.state == "ready"),
    )
    .await?;
    let wp = west.data_plane();
    if let Some(wp) = wp {
        println!(
            "  Requests from west's node (a network namespace, as a pod's): west's CoreDNS and kube-proxy, the remote's gateway, its DNS and kube-proxy, the workload:"
        );
        for r in &remotes {
            for svc in r.services {
                let mirror = format!("{svc}-{}", r.cluster.name());
                let body = format!("{}/{svc}", r.cluster.name());
                traffic::answered(wp, &traffic::host(&mirror, NS), 80, &body, "after ").await?;
            }
        }
    }

    remotes[0]
        .serve(
            "web",
            "east/web:metrics",
            ("metrics", METRICS_PORT),
            &[("http", WORKLOAD_PORT)],
        )
        .await?;
    let east_svcs: Api<Service> = Api::namespaced(remotes[0].client.clone(), NS);
    east_svcs
        .patch("web", &PatchParams::default(), &merge(serde_json::json!({"spec": {"ports": [
            {"name": "http", "port": 80, "protocol": "TCP"}, {"name": "metrics", "port": METRICS_PORT, "protocol": "TCP"}]}})))
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
    if let Some(wp) = wp {
        let host = traffic::host("web-east", NS);
        traffic::answered(wp, &host, METRICS_PORT, "east/web:metrics", "after ").await?;
    }

    // The gateway moves to a new address; a health server (or, with traffic, the
    // gateway itself) answers there, and the old one is gone.
    let moved_health = Arc::new(AtomicBool::new(true));
    let new_address = remotes[0].plane().map(DataPlane::add_address).transpose()?;
    let moved = match new_address {
        Some(ip) => {
            let old = remotes[0].gateway.take();
            remotes[0].start_gateway(ip).await?;
            drop(old);
            ip
        }
        None => {
            serve_gateway_health(11, moved_health.clone()).await?;
            Ipv4Addr::new(192, 0, 2, 11)
        }
    };
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
    if let Some(wp) = wp {
        for svc in remotes[0].services {
            let host = traffic::host(&format!("{svc}-east"), NS);
            let body = format!("east/{svc}");
            traffic::answered(wp, &host, 80, &body, "through the new gateway only, after ").await?;
        }
    }

    let north_svcs: Api<Service> = Api::namespaced(remotes[1].client.clone(), NS);
    north_svcs
        .patch("search", &PatchParams::default(), &unexport_patch())
        .await?;
    step(
        &local,
        "search is unexported in north: its mirror is removed.",
        |t| t.len() == 3,
    )
    .await?;
    if let Some(wp) = wp {
        traffic::unresolved(wp, &traffic::host("search-north", NS)).await?;
    }

    let web_east = traffic::host("web-east", NS);
    let dies = if traffic {
        drop(remotes[0].gateway.take());
        "East's gateway dies: its probes fail, east mirrors turn not ready, so clients fail over."
    } else {
        moved_health.store(false, Ordering::SeqCst);
        "East's gateway stops answering its probes: east mirrors turn not ready, so clients fail over."
    };
    step(&local, dies, |t| {
        t.iter()
            .filter(|r| r.cluster == "east")
            .all(|r| r.state == "not ready")
    })
    .await?;
    if let Some(wp) = wp {
        traffic::failing_fast(wp, &web_east, 80).await?;
    }
    let back = if traffic {
        remotes[0].start_gateway(moved).await?;
        "East's gateway is back: its mirrors are ready."
    } else {
        moved_health.store(true, Ordering::SeqCst);
        "East's gateway answers again: its mirrors are ready."
    };
    step(&local, back, |t| t.iter().all(|r| r.state == "ready")).await?;
    if let Some(wp) = wp {
        traffic::answered(wp, &web_east, 80, "east/web", "again, after ").await?;
    }

    let outage = async {
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
        anyhow::Ok(down.elapsed())
    };
    match wp {
        Some(wp) => {
            let host = traffic::host("payments-north", NS);
            let (down, tally) =
                traffic::while_requesting(wp, &host, "north/payments", outage).await;
            let down = down?;
            println!(
                "  GET http://{host}/ every 100 ms while north's apiserver was down ({down:.1?}): {} requests, {} failed",
                tally.sent,
                tally.failures.len()
            );
            anyhow::ensure!(
                tally.failures.is_empty(),
                "requests failed during north's outage: {:#?}",
                tally.failures
            );
        }
        None => {
            outage.await?;
        }
    }
    let north_client = remotes[1].cluster.client().await?;
    remotes[1].client = north_client.clone();
    let next = WORKLOAD_PORT + remotes[1].services.len() as u16;
    remotes[1]
        .serve("reviews", "north/reviews", ("http", next), &[])
        .await?;
    remotes[1].ready_without_plane("reviews").await?;
    Api::<Service>::namespaced(north_client, NS)
        .create(&PostParams::default(), &exported("reviews")?)
        .await?;
    step(
        &local,
        "North is back: the controller resyncs, and a service exported meanwhile appears.",
        |t| t.len() == 4 && t.iter().all(|r| r.state == "ready"),
    )
    .await?;
    if let Some(wp) = wp {
        let host = traffic::host("reviews-north", NS);
        traffic::answered(wp, &host, 80, "north/reviews", "after ").await?;
    }

    let checked: Vec<(&str, &Client, bool)> = remotes
        .iter()
        .map(|r| (r.cluster.name(), &r.client, r.by_link))
        .collect();
    invariants(&local, &checked, &baseline).await?;
    print_check(&local, &admin_addr.to_string()).await?;
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
        if let Some(wp) = wp {
            let ip = Api::<Service>::namespaced(local.clone(), NS)
                .get("web-east")
                .await?
                .spec
                .and_then(|s| s.cluster_ip)
                .unwrap_or_default();
            println!(
                "  nsenter --net={} curl -s -H 'Host: web-east.{NS}.svc.cluster.local' http://{ip}/   (from west's node; its CoreDNS is {})",
                wp.netns_path().display(),
                wp.dns_addr()
            );
        }
        tokio::signal::ctrl_c().await?;
    }
    // The admin server holds the gateways closure: it finishes first.
    shutdown.cancel();
    let _ = admin_task.await;
    // It holds the manager too (releasing its Leases first).
    let _ = write_leases.await;
    if let Ok(manager) = Arc::try_unwrap(manager) {
        manager.shutdown().await;
    }
    let _ = election.await;
    Ok(())
}

/// Unexports a Service: the annotation exports from a Secret link, the label from a Link.
pub(crate) fn unexport_patch() -> Patch<serde_json::Value> {
    merge(serde_json::json!({"metadata": {
        "annotations": {GATEWAY_NAME_ANNOTATION: null},
        "labels": {EXPORTED_LABEL: null}}}))
}

pub(crate) fn merge(v: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(v)
}

fn controller_options(
    metrics: Arc<Metrics>,
    leader: service_mirror_controller::leader::Leadership,
) -> LinkManagerOptions {
    LinkManagerOptions {
        namespace: DEFAULT_NAMESPACE.into(),
        workers: 2,
        rotation_timeout: Duration::from_secs(30),
        collect_unlinked: true,
        sources: LinkSources::Both,
        // The demo links no ClusterProfile (LinkSources::Both).
        cluster_profile_deletion_grace: Duration::from_secs(30),
        // North's Link may be served before east's Secret link made the namespace.
        link_namespace_creation: true,
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
            metrics,
            leader: Some(leader),
            ..LinkDeps::default()
        },
    }
}

/// The leader-election Lease (`run`'s default name).
pub(crate) const LEASE_NAME: &str = "service-mirror";
