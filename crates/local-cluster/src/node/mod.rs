//! Real nodes: kubelet and containerd, each node in its own pid, mount, network and uts
//! namespaces on the data plane's fabric (docs/real-node.md). A node runs pods from the
//! images of `scripts/build-images.sh`, imported into its containerd (never pulled), on a
//! pod CIDR of its own routed from every other node of this process, so a pod in one
//! cluster reaches a node or pod of another (a gateway behind a LoadBalancer address).

mod cgroups;
mod config;

pub use cgroups::{leftover_cgroups, sweep as sweep_node_cgroups};
pub use config::PAUSE_IMAGE;

use crate::certs::Pki;
use crate::data_plane::{Fabric, Netns};
use crate::kubeconfig::{Credential, Kubeconfig};
use crate::process::Process;
use crate::{Error, Result};
use config::{KubeletSettings, NodePaths};
use parking_lot::Mutex;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// containerd answers on its socket within this long.
const CONTAINERD_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether this process can run real nodes: `Ok` as root with the data plane's tools and
/// the node's packages present; otherwise why not.
pub fn node_support() -> std::result::Result<(), String> {
    crate::data_plane_support()?;
    for (path, package) in [
        ("/usr/bin/containerd", "containerd"),
        ("/usr/sbin/runc", "runc"),
        ("/usr/lib/cni/bridge", "containernetworking-plugins"),
        ("/usr/sbin/iptables", "iptables"),
        ("/usr/bin/nsenter", "util-linux"),
        ("/usr/bin/unshare", "util-linux"),
    ] {
        if !Path::new(path).is_file() {
            return Err(format!(
                "{path} is missing (Debian package {package}; \
                 scripts/build-control-plane.sh --node installs it as root)"
            ));
        }
    }
    Ok(())
}

/// For real-node tests: `true` (skip) when this process cannot run nodes and `CI` is not
/// `true`, after printing one uncaptured `skipped: needs root for real nodes` line;
/// panics under `CI=true` or when root lacks a package.
pub fn skip_without_nodes(test: &str) -> bool {
    crate::data_plane::skip_unless(test, node_support(), "real nodes", "real nodes")
}

/// The pod CIDR of the next node of this process: 198.18.(192+n).0/24, outside every
/// data-plane service CIDR (198.18.1-190.0/24) and every fabric (198.19.0.0/16).
fn next_pod_cidr() -> Result<String> {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    if n >= 60 {
        return Err(Error::DataPlane(
            "more than 60 real nodes in one process".into(),
        ));
    }
    Ok(format!("198.18.{}.0/24", 192 + n))
}

/// Every pod CIDR of this process's nodes: kube-proxy's `--cluster-cidr`.
pub(crate) const ALL_POD_CIDRS: &str = "198.18.192.0/18";

/// What a node needs of its cluster.
pub(crate) struct NodeSpec<'a> {
    pub cluster: &'a str,
    pub name: String,
    pub dir: PathBuf,
    pub fabric: Arc<Fabric>,
    /// The cluster's apiserver as the nodes reach it (the fabric forwarder).
    pub apiserver: SocketAddr,
    pub pki: &'a Pki,
    /// The cluster's CoreDNS (its first node's address).
    pub dns: Ipv4Addr,
    /// For kube-proxy: the data plane's node kubeconfig.
    pub proxy_kubeconfig: &'a Path,
}

/// One real node: its namespaces, containerd, kubelet and (but on a cluster's first
/// node, whose kube-proxy the data plane runs) kube-proxy. Dropping it stops them, kills
/// every pod and removes its cgroups.
#[derive(Debug)]
pub struct Node {
    name: String,
    ip: Ipv4Addr,
    pod_cidr: String,
    paths: NodePaths,
    cgroup_root: String,
    ns: Arc<Netns>,
    fabric: Arc<Fabric>,
    processes: Mutex<Vec<Process>>,
}

impl Node {
    /// Starts a node in `ns` (a namespace of [`Netns::create_node`] already on the
    /// fabric at `ip`): containerd, the images, kubelet, and kube-proxy if `with_proxy`.
    pub(crate) async fn start(
        spec: NodeSpec<'_>,
        ns: Arc<Netns>,
        ip: Ipv4Addr,
        with_proxy: bool,
    ) -> Result<Self> {
        let node_bin = tokio::task::spawn_blocking(crate::ensure_node_binaries)
            .await
            .map_err(|e| Error::Binaries(e.to_string()))??;
        let dp_bin = tokio::task::spawn_blocking(crate::ensure_data_plane_binaries)
            .await
            .map_err(|e| Error::Binaries(e.to_string()))??;
        let images = tokio::task::spawn_blocking(crate::ensure_images)
            .await
            .map_err(|e| Error::Binaries(e.to_string()))??;
        let paths = NodePaths {
            dir: spec.dir.clone(),
        };
        for d in [
            "ctrd/root",
            "ctrd/state",
            "ctrd/opt",
            "ctrd/runc",
            "cni/net.d",
            "cni-ipam",
            "kubelet",
            "pki",
            "logs/pods",
            "kubelet-plugins/volume/exec",
        ] {
            std::fs::create_dir_all(spec.dir.join(d))?;
        }
        let pod_cidr = next_pod_cidr()?;
        let cgroup_root = cgroups::root_name(&spec.name);
        cgroups::create(&cgroup_root)?;
        let node = Self {
            name: spec.name.clone(),
            ip,
            pod_cidr,
            paths,
            cgroup_root,
            ns,
            fabric: spec.fabric.clone(),
            processes: Mutex::new(Vec::new()),
        };
        node.write_files(&spec)?;
        node.route_pod_cidrs(&spec.fabric)?;
        node.start_containerd().await?;
        node.import_images(&images).await?;
        node.spawn(
            "kubelet",
            &node_bin.kubelet,
            &[
                format!("--config={}", node.paths.p("kubelet.yaml")),
                format!("--kubeconfig={}", node.paths.p("kubelet.kubeconfig")),
                format!("--hostname-override={}", node.name),
                format!("--node-ip={}", node.ip),
                format!("--root-dir={}", node.paths.p("kubelet")),
                format!("--cert-dir={}", node.paths.p("kubelet/pki")),
                "--v=1".into(),
            ],
        )?;
        if with_proxy {
            node.spawn(
                "kube-proxy",
                &dp_bin.kube_proxy,
                &[
                    format!("--kubeconfig={}", spec.proxy_kubeconfig.display()),
                    "--proxy-mode=nftables".into(),
                    format!("--hostname-override={}", node.name),
                    format!("--bind-address={}", node.ip),
                    format!("--cluster-cidr={ALL_POD_CIDRS}"),
                    "--conntrack-max-per-core=0".into(),
                    "--healthz-bind-address=127.0.0.1:10256".into(),
                    "--metrics-bind-address=127.0.0.1:10249".into(),
                    "--v=1".into(),
                ],
            )?;
        }
        Ok(node)
    }

    fn write_files(&self, spec: &NodeSpec<'_>) -> Result<()> {
        let p = |r: &str| self.paths.dir.join(r);
        std::fs::write(p("containerd.toml"), config::containerd_toml(&self.paths))?;
        std::fs::write(
            p("cni/net.d/10-service-mirror.conflist"),
            config::cni_conflist(&self.pod_cidr, &p("cni-ipam")),
        )?;
        std::fs::write(p("resolv.conf"), format!("nameserver {}\n", spec.dns))?;
        std::fs::write(p("pki/ca.crt"), &spec.pki.ca_cert)?;
        let (cert, key) = spec
            .pki
            .client_cert(&format!("system:node:{}", self.name), "system:nodes")?;
        std::fs::write(
            p("kubelet.kubeconfig"),
            Kubeconfig::render(
                spec.cluster,
                &format!("https://{}", spec.apiserver),
                &spec.pki.ca_cert,
                Credential::ClientCert {
                    cert: &cert,
                    key: &key,
                },
            ),
        )?;
        std::fs::write(
            p("kubelet.yaml"),
            config::kubelet_yaml(&KubeletSettings {
                paths: &self.paths,
                node_ip: self.ip,
                cgroup_root: &self.cgroup_root,
                dns: spec.dns,
            }),
        )?;
        Ok(())
    }

    /// Routes this node's pod CIDR from every other node of this process, and theirs
    /// from this one; registers it for the nodes that come later.
    fn route_pod_cidrs(&self, fabric: &Fabric) -> Result<()> {
        let mut routes = fabric.pod_routes.lock();
        routes.retain(|r| Path::new(&format!("/proc/{}", r.pid)).exists());
        for other in routes.iter() {
            let _ = ip_in(
                other.pid,
                &[
                    "route",
                    "replace",
                    &self.pod_cidr,
                    "via",
                    &self.ip.to_string(),
                ],
            );
            self.ns.ip(&[
                "route",
                "replace",
                &other.pod_cidr,
                "via",
                &other.ip.to_string(),
            ])?;
        }
        routes.push(crate::data_plane::PodRoute {
            pid: self.ns.pid(),
            ip: self.ip,
            pod_cidr: self.pod_cidr.clone(),
        });
        Ok(())
    }

    fn spawn(&self, name: &str, program: &Path, args: &[String]) -> Result<()> {
        let mut cmd = self.ns.node_command(program);
        cmd.args(args);
        let log = self.paths.dir.join(format!("{name}.log"));
        self.processes
            .lock()
            .push(Process::spawn_command(name, cmd, &log)?);
        Ok(())
    }

    async fn start_containerd(&self) -> Result<()> {
        self.spawn(
            "containerd",
            Path::new("/usr/bin/containerd"),
            &[format!("--config={}", self.paths.p("containerd.toml"))],
        )?;
        let deadline = Instant::now() + CONTAINERD_TIMEOUT;
        loop {
            self.check_processes()?;
            if self.ctr(&["version"]).await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.process_error(
                    "containerd",
                    format!("no answer on its socket within {CONTAINERD_TIMEOUT:?}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn import_images(&self, dir: &Path) -> Result<()> {
        let mut tars: Vec<PathBuf> = std::fs::read_dir(dir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "tar"))
            .collect();
        tars.sort();
        for tar in tars {
            let tar = tar.display().to_string();
            self.ctr(&["images", "import", &tar]).await?;
        }
        Ok(())
    }

    /// Runs `ctr -n k8s.io <args>` against this node's containerd (from the host: its
    /// socket is a file of the node's directory) and returns its output.
    pub async fn ctr(&self, args: &[&str]) -> Result<String> {
        let mut cmd = tokio::process::Command::new("ctr");
        cmd.args(["--address", &self.paths.containerd_socket(), "-n", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let what = format!("ctr {} on {}", args.join(" "), self.name);
        let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
            .await
            .map_err(|_| Error::DataPlane(format!("{what}: timed out after 120 s")))?
            .map_err(|e| Error::DataPlane(format!("{what}: {e}")))?;
        if !out.status.success() {
            return Err(Error::DataPlane(format!(
                "{what}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// An error if a process of this node has exited.
    pub(crate) fn check_processes(&self) -> Result<()> {
        for p in self.processes.lock().iter_mut() {
            if let Some(status) = p.exited() {
                return Err(p.start_error(format!("exited: {status}")));
            }
        }
        Ok(())
    }

    fn process_error(&self, name: &str, reason: String) -> Error {
        let procs = self.processes.lock();
        match procs.iter().find(|p| p.name() == name) {
            Some(p) => p.start_error(reason),
            None => Error::DataPlane(format!("{name}: {reason}")),
        }
    }

    /// The Node object's name (kubelet's `--hostname-override`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's address on the fabric (its InternalIP; kubelet listens on it).
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The node's pod CIDR (the CNI bridge's range).
    pub fn pod_cidr(&self) -> &str {
        &self.pod_cidr
    }

    /// The last `lines` lines of the log of `process` (`containerd`, `kubelet`,
    /// `kube-proxy`), for test failure messages.
    pub fn log_tail(&self, process: &str, lines: usize) -> String {
        let procs = self.processes.lock();
        procs
            .iter()
            .find(|p| p.name() == process)
            .map(|p| p.log_tail(lines))
            .unwrap_or_else(|| format!("(no process {process})"))
    }

    /// Process ids of the node's programs and of its first process (pid 1 of its pid
    /// namespace).
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.processes.lock().iter().map(Process::pid).collect();
        pids.push(self.ns.pid());
        pids
    }

    /// The node is lost, as a machine losing power: containerd, kubelet, kube-proxy and
    /// every pod die at once, the network with them. The Node object stays (the
    /// cluster's node-lifecycle controller marks it NotReady and evicts its pods).
    pub fn kill(&self) {
        self.ns.kill();
        self.fabric
            .pod_routes
            .lock()
            .retain(|r| r.pid != self.ns.pid());
        for p in self.processes.lock().iter_mut() {
            p.kill();
        }
    }

    /// Whether the node was killed ([`Node::kill`]) or its first process died.
    pub fn is_dead(&self) -> bool {
        !Path::new(&format!("/proc/{}", self.ns.pid())).exists()
    }
}

impl Node {
    /// Stops the node for good: its programs, then its whole pid namespace (every pod),
    /// then its cgroup roots (once the processes in them are gone; at most 10 s).
    pub(crate) fn shut_down(&self) {
        // kubelet first (it would restart what dies), then the whole pid namespace.
        for p in self.processes.lock().iter_mut() {
            p.kill();
        }
        self.ns.kill();
        cgroups::remove(&self.cgroup_root, Duration::from_secs(10));
        // Its pid may be reused by a process of another network namespace.
        self.fabric
            .pod_routes
            .lock()
            .retain(|r| r.pid != self.ns.pid());
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// `ip <args>` in the network namespace of process `pid`.
fn ip_in(pid: u32, args: &[&str]) -> Result<()> {
    let mut cmd = Command::new("nsenter");
    cmd.args(["--target", &pid.to_string(), "--net", "--", "ip"])
        .args(args);
    crate::data_plane::run(cmd, &format!("ip {} in {pid}", args.join(" ")))
}

/// The namespaces of a new node named `name` (hostname too), its state under `dir`: the
/// pause binary of the images directory as its first process (a reaper), kubelet's
/// sysctls answered by files of `dir`.
pub(crate) async fn namespaces(name: &str, dir: &Path) -> Result<Netns> {
    let images = tokio::task::spawn_blocking(crate::ensure_images)
        .await
        .map_err(|e| Error::Binaries(e.to_string()))??;
    let sysctl_dir = dir.join("sysctl");
    std::fs::create_dir_all(&sysctl_dir)?;
    let mut sysctls = Vec::new();
    for (sysctl, value) in config::KUBELET_SYSCTLS {
        let file = sysctl_dir.join(sysctl.replace('/', "."));
        std::fs::write(&file, format!("{value}\n"))?;
        sysctls.push((sysctl.to_string(), file));
    }
    let name = name.to_string();
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        Netns::create_node(&name, &dir, &images.join("pause"), &sysctls)
    })
    .await
    .map_err(|e| Error::DataPlane(e.to_string()))?
}

/// Waits until every node of `nodes` is Ready; an error names the first that is not,
/// with its kubelet's log tail.
pub(crate) async fn wait_ready(
    client: &kube::Client,
    nodes: &[Node],
    timeout: Duration,
) -> Result<()> {
    use k8s_openapi::api::core::v1::Node as NodeObject;
    let api: kube::Api<NodeObject> = kube::Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        let mut waiting = None;
        for n in nodes {
            n.check_processes()?;
            let ready = api.get_opt(n.name()).await?.is_some_and(|o| is_ready(&o));
            if !ready {
                waiting = Some(n);
                break;
            }
        }
        let Some(n) = waiting else {
            return Ok(());
        };
        if Instant::now() > deadline {
            return Err(n.process_error(
                "kubelet",
                format!("node {} not Ready within {timeout:?}", n.name()),
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Whether a Node's Ready condition is True.
pub fn is_ready(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
