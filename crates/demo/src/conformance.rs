//! `service-mirror demo --mcs-conformance`: what the upstream Multi-Cluster Services
//! conformance suite (kubernetes-sigs/mcs-api, `conformance/`, Ginkgo) needs, on local
//! clusters: `west` and `east`, each with the MCS CRDs, its name in the ClusterProperty
//! `id.k8s.io` (KEP-2149) and its own plain `service-mirror run` (MCS on by default
//! there: the CRD served and the cluster named) linked to the other (a full mesh: each
//! reads the other's ServiceExports over its link), one kubeconfig whose contexts and
//! cluster names are `west` and `east` (the suite names a cluster by its context's
//! cluster, which must be the name its peers' links give it).
//!
//! Where its Pods run, by [`Mode`] (the demo's own choice, `--no-nodes`, `--no-traffic`):
//! - [`Mode::Nodes`]: one real node per cluster (kubelet + containerd). The suite's images
//!   are stand-ins imported into each node (`scripts/build-images.sh`,
//!   `mcs-conformance/stand-in.tar`: busybox named `nicolaka/netshoot:v0.15` and
//!   `alpine/socat:1.7.4.4`, with a socat shim), and each cluster's CoreDNS
//!   forwards `clusterset.local` to its controller's DNS server
//!   (`--clusterset-dns-addr`), as an operator's Corefile does: the DNS specs, which
//!   exec `nslookup` in the request Pod, run for real.
//! - Otherwise no kubelet: a Pod-status step stands in. Every spec first starts a
//!   request Pod in each cluster and waits for it to be `Running`; the step marks the
//!   Pods of the suite's namespaces (`mcs-conformance-*`) Running and Ready, at the
//!   cluster's node address (its data plane's, else a documentation address). Nothing
//!   runs in them: the specs that exec into the request Pod (DNS, connectivity) cannot
//!   pass there.

use crate::mode::Mode;
use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use local_cluster::{ClusterOptions, Kubeconfig, LocalCluster, apply_yaml};
use service_mirror_controller::cli::allow::DEFAULT_NAMESPACE;
use service_mirror_controller::mcs::startup::{CLUSTER_PROPERTY_CRD_YAML, cluster_id_property};
use service_mirror_controller::mcs::{SERVICE_EXPORT_CRD_YAML, SERVICE_IMPORT_CRD_YAML};
use service_mirror_controller::permissions::service_export_api_served;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::task::JoinHandle;

/// The suite's namespaces: `mcs-conformance-<random>`.
pub const SUITE_NAMESPACE_PREFIX: &str = "mcs-conformance-";
/// How often the Pod-status step looks for Pods to mark Running.
const POD_STEP_PERIOD: Duration = Duration::from_millis(500);

/// Two linked clusters ready for the suite; dropping it stops the controllers and the
/// clusters.
pub struct Prepared {
    /// First: stopped before the clusters (fields drop in order). Only dropped.
    _controllers: Controllers,
    /// `west`, the suite's first context (the exporting cluster of its specs).
    pub west: LocalCluster,
    /// `east`.
    pub east: LocalCluster,
    /// The kubeconfig with contexts `west` and `east`.
    pub kubeconfig: Kubeconfig,
    pod_steps: Vec<JoinHandle<()>>,
    mode: Mode,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        for t in &self.pod_steps {
            t.abort();
        }
    }
}

/// The controller processes started so far, killed when dropped (also when the start of
/// a later one fails).
#[derive(Default)]
struct Controllers(Vec<Child>);

impl Drop for Controllers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Prepared {
    /// The log file of the controller of `cluster`.
    pub fn controller_log(cluster: &LocalCluster) -> PathBuf {
        cluster.dir().join("service-mirror.log")
    }

    /// The `go test` command that runs the suite's specs that can pass here against
    /// these clusters, from a checkout of kubernetes-sigs/mcs-api: the Required ones,
    /// and on real nodes the DNS ones too.
    pub fn suite_command(&self) -> String {
        let labels = if self.mode == Mode::Nodes {
            "'Required || DNS'"
        } else {
            "Required"
        };
        format!(
            "cd mcs-api/conformance && go test -v -timeout 30m . -args --kubeconfig={} --contexts=west,east --ginkgo.label-filter={labels}",
            self.kubeconfig.path.display()
        )
    }
}

/// Starts west and east as `mode` says, installs the MCS CRDs and names each in its
/// ClusterProperty `id.k8s.io`, links them both ways, starts `binary run` for each (and
/// the Pod-status steps without nodes), and writes the kubeconfig into `dir`.
pub async fn prepare(binary: &Path, mode: Mode, dir: &Path) -> anyhow::Result<Prepared> {
    // Before the clusters: a missing image fails in a second, not after their start.
    let stand_in = match mode {
        Mode::Nodes => Some(stand_in_images()?),
        _ => None,
    };
    let opts = || ClusterOptions {
        data_plane: mode != Mode::Story,
        nodes: usize::from(mode == Mode::Nodes),
        ..Default::default()
    };
    let (west, east) = tokio::try_join!(
        LocalCluster::start_with("west", opts()),
        LocalCluster::start_with("east", opts())
    )?;
    let (wc, ec) = (west.client().await?, east.client().await?);
    for (client, name) in [(&wc, west.name()), (&ec, east.name())] {
        install_mcs_crds(client, name).await?;
        local_cluster::ensure_namespace(client, DEFAULT_NAMESPACE).await?;
    }
    if let Some(stand_in) = &stand_in {
        for cluster in [&west, &east] {
            for node in cluster.data_plane().map(|d| d.nodes()).unwrap_or_default() {
                node.ctr(&["images", "import", &stand_in.display().to_string()])
                    .await?;
            }
        }
    }
    // Each cluster reads the other with the remote RBAC of `allow` (ServiceExports and
    // Services), by a link Secret as `link` makes it.
    let east_token = crate::allowed_token(&east, &ec).await?;
    crate::link_cluster(&wc, &east, &east.server_url(), &east_token).await?;
    let west_token = crate::allowed_token(&west, &wc).await?;
    crate::link_cluster(&ec, &west, &west.server_url(), &west_token).await?;
    let mut controllers = Controllers::default();
    for cluster in [&west, &east] {
        controller(binary, cluster, &mut controllers).await?;
    }
    let pod_steps = if mode == Mode::Nodes {
        Vec::new()
    } else {
        vec![
            tokio::spawn(pod_step(wc, node_address(&west, 10))),
            tokio::spawn(pod_step(ec, node_address(&east, 20))),
        ]
    };
    let kubeconfig = Kubeconfig::merge(
        &[&west.admin_kubeconfig(), &east.admin_kubeconfig()],
        dir.join("mcs-conformance.kubeconfig"),
    )?;
    Ok(Prepared {
        _controllers: controllers,
        west,
        east,
        kubeconfig,
        pod_steps,
        mode,
    })
}

/// `mcs-conformance/stand-in.tar` of `scripts/build-images.sh`: the suite's images.
fn stand_in_images() -> anyhow::Result<PathBuf> {
    let tar = local_cluster::ensure_images()?.join("mcs-conformance/stand-in.tar");
    anyhow::ensure!(
        tar.is_file(),
        "{} is missing: scripts/build-images.sh builds it (SERVICE_MIRROR_IMAGES_DIR, when set, must hold it)",
        tar.display()
    );
    Ok(tar)
}

/// Prepares the clusters, prints how to run the suite, and waits for Ctrl-C or SIGTERM.
pub async fn run(mode: Mode) -> anyhow::Result<()> {
    let binary = std::env::current_exe().context("the path of this program")?;
    let dir = std::env::temp_dir().join(format!(
        "service-mirror-mcs-conformance-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    println!(
        "Starting west and east (etcd + kube-apiserver each{}), the MCS CRDs, a service-mirror per cluster linked to the other...",
        match mode {
            Mode::Nodes => ", and a real node",
            Mode::Traffic => ", and a data plane",
            Mode::Story => "",
        }
    );
    let prepared = prepare(&binary, mode, &dir).await?;
    println!("Ready.");
    println!(
        "  kubeconfig: {} (contexts and clusters: west, east)",
        prepared.kubeconfig.path.display()
    );
    for c in [&prepared.west, &prepared.east] {
        println!(
            "  {}: {}  controller log: {}",
            c.name(),
            c.server_url(),
            Prepared::controller_log(c).display()
        );
    }
    if mode == Mode::Nodes {
        println!(
            "One real node per cluster, the suite's images as stand-ins, clusterset.local forwarded by CoreDNS to the controller."
        );
    } else {
        println!(
            "Pods of {SUITE_NAMESPACE_PREFIX}* namespaces are marked Running (no kubelet: specs that exec into the request Pod cannot pass)."
        );
    }
    println!("Run the suite's specs from a checkout of kubernetes-sigs/mcs-api:");
    println!("  {}", prepared.suite_command());
    println!("Ctrl-C stops the controllers and the clusters and removes their files.");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    drop(prepared);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The MCS and ClusterProperty CRDs, applied and served, and the ClusterProperty
/// `id.k8s.io` naming the cluster `name`.
async fn install_mcs_crds(client: &Client, name: &str) -> anyhow::Result<()> {
    for yaml in [
        SERVICE_EXPORT_CRD_YAML,
        SERVICE_IMPORT_CRD_YAML,
        CLUSTER_PROPERTY_CRD_YAML,
    ] {
        apply_yaml(client, yaml).await?;
    }
    let exports: Api<service_mirror_controller::mcs::resource::ServiceExport> =
        Api::all(client.clone());
    let id = cluster_id_property(name);
    for _ in 0..100 {
        // Served: the export list answers, discovery lists it (what the controller's
        // start asks) and the property applies.
        if exports.list(&ListParams::default().limit(1)).await.is_ok()
            && service_export_api_served(client).await.unwrap_or(false)
            && apply_yaml(client, &id.to_string()).await.is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the ServiceExport and ClusterProperty CRDs are not served after 10 s")
}

/// `binary run` for `cluster`, as its admin, logging to its directory, added to
/// `started`: no MCS flag (the default finds the CRD and the ClusterProperty). With a
/// data plane its clusterset.local DNS server listens on the host's fabric address,
/// where the cluster's CoreDNS forwards the zone; it returns once that server answers
/// (a port lost to a race between choosing and binding it is an error here, not a
/// silent failure of every DNS spec later).
async fn controller(
    binary: &Path,
    cluster: &LocalCluster,
    started: &mut Controllers,
) -> anyhow::Result<()> {
    let log_path = Prepared::controller_log(cluster);
    let log = std::fs::File::create(&log_path)?;
    let mut cmd = Command::new(binary);
    cmd.arg("run")
        .arg("--kubeconfig")
        .arg(&cluster.admin_kubeconfig().path)
        .args([
            "--namespace",
            DEFAULT_NAMESPACE,
            "--metrics-addr",
            "127.0.0.1:0",
        ]);
    let dns = match cluster.data_plane() {
        Some(plane) => {
            let dns = plane.free_host_port()?;
            plane.forward_zone("clusterset.local", dns).await?;
            cmd.args(["--clusterset-dns-addr", &dns.to_string()]);
            Some(dns)
        }
        None => None,
    };
    let child = cmd
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {} run", binary.display()))?;
    started.0.push(child);
    let Some(dns) = dns else {
        return Ok(());
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = started
            .0
            .last_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            anyhow::bail!(
                "{}'s controller exited ({status}); its log: {}",
                cluster.name(),
                log_path.display()
            );
        }
        if tokio::net::TcpStream::connect(dns).await.is_ok() {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{}'s controller does not serve clusterset.local on {dns} after 30 s; its log: {}",
            cluster.name(),
            log_path.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The address the Pod-status step gives Pods of `cluster`: its node's, else
/// 192.0.2.`octet` (documentation; nothing listens there).
fn node_address(cluster: &LocalCluster, octet: u8) -> Ipv4Addr {
    cluster
        .data_plane()
        .map_or(Ipv4Addr::new(192, 0, 2, octet), |d| d.node_ip())
}

/// Marks every Pod of the suite's namespaces that is not Running as Running and Ready
/// at `ip`, every [`POD_STEP_PERIOD`], until aborted.
pub async fn pod_step(client: Client, ip: Ipv4Addr) {
    let pods: Api<Pod> = Api::all(client.clone());
    let not_running = ListParams::default().fields("status.phase!=Running");
    loop {
        if let Ok(list) = pods.list(&not_running).await {
            for pod in list.items {
                let (Some(ns), Some(name)) = (pod.metadata.namespace, pod.metadata.name) else {
                    continue;
                };
                if !ns.starts_with(SUITE_NAMESPACE_PREFIX) {
                    continue;
                }
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                let _ = api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(running(ip)))
                    .await;
            }
        }
        tokio::time::sleep(POD_STEP_PERIOD).await;
    }
}

/// The status of a Pod a kubelet started, at `ip`.
fn running(ip: Ipv4Addr) -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = |t: &str| serde_json::json!({"type": t, "status": "True", "lastTransitionTime": now.clone()});
    serde_json::json!({"status": {
        "phase": "Running",
        "podIP": ip.to_string(),
        "podIPs": [{"ip": ip.to_string()}],
        "hostIP": ip.to_string(),
        "startTime": now.clone(),
        "conditions": [condition("PodScheduled"), condition("Initialized"),
            condition("ContainersReady"), condition("Ready")],
    }})
}
