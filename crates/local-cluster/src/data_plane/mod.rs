//! An opt-in data plane for a local cluster ([`crate::ClusterOptions::data_plane`]): a
//! network namespace acting as the cluster's node, with kube-proxy (nftables mode) and
//! CoreDNS inside it and kube-controller-manager (EndpointSlice controllers only) on the
//! host, plus test workloads and a stand-in multicluster gateway. See docs/data-plane.md.
//!
//! Topology (per test process): a bridge namespace joins every node namespace and the
//! host (veth `smh<pid>`, 198.19.K.1/24), each node gets 198.19.K.(10+i)/24, each
//! data-plane cluster a service CIDR 198.18.N.0/24 routed to a dead-end veth in its node. No
//! namespace has a default route: traffic can only go to those addresses.

mod netns;
mod wire;

pub(crate) use netns::{Netns, run};

pub use wire::{DnsAnswer, HttpAnswer};
mod fabric;
mod gateway;
mod start;
mod workload;

pub(crate) use fabric::*;
pub use gateway::Gateway;
use gateway::*;
pub use workload::Workload;

use crate::binaries::{DataPlaneBinaries, ensure_data_plane_binaries};
use crate::kubeconfig::with_server;
use crate::process::Process;
use crate::proxy::TcpProxy;
use crate::{Error, Result};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};
use kube::api::{Api, ObjectMeta, PostParams};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// kube-proxy and CoreDNS get this long to become ready (2 shared cores).
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// One connection attempt or request of the helpers gives up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Port of the `mc-gateway` listener of [`Gateway`] (Linkerd's default).
pub const GATEWAY_PORT: u16 = 4143;
/// Port of the `mc-probe` listener of [`Gateway`] (Linkerd's default).
pub const PROBE_PORT: u16 = 4191;

/// The block [`DataPlane::add_many_addresses`] hands out: 198.19.251.0 to 198.19.255.255
/// (1,280 addresses), inside 198.18.0.0/15 but outside every fabric subnet 198.19.K.0/24
/// (K 1..=250) and every service CIDR 198.18.N.0/24; and numerically above every node
/// address, so a gateway whose ingress lists its node address and these addresses has the
/// node address first (the one the controller, on the host, probes).
const MANY_FIRST: Ipv4Addr = Ipv4Addr::new(198, 19, 251, 0);
/// Size of that block.
const MANY_MAX: usize = 1280;
/// Routes covering that block.
const MANY_PREFIXES: [&str; 2] = ["198.19.251.0/24", "198.19.252.0/22"];

/// Whether this process can run data planes: `Ok` as root with `ip` and `nft` present and
/// network namespaces available; otherwise why not.
pub fn data_plane_support() -> std::result::Result<(), String> {
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    for (tool, package) in [("ip", "iproute2"), ("nft", "nftables")] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
        if !found {
            return Err(format!(
                "`{tool}` is not installed (Debian package {package}; \
                 scripts/build-control-plane.sh --data-plane installs it as root)"
            ));
        }
    }
    Ok(())
}

/// For data-plane tests: `true` (skip) when this process cannot run data planes and
/// `CI` is not `true`, after printing one uncaptured `skipped: needs root for network
/// namespaces` line; panics under `CI=true` or when root lacks a tool.
pub fn skip_without_data_plane(test: &str) -> bool {
    skip_unless(
        test,
        data_plane_support(),
        "the data plane",
        "network namespaces",
    )
}

/// `true` (skip) when `support` says why `what` cannot run and `CI` is not `true`,
/// after printing one uncaptured `skipped: needs root for <needs>` line; panics under
/// `CI=true` or as root (root lacking a tool is a broken setup, not a skip).
pub(crate) fn skip_unless(
    test: &str,
    support: std::result::Result<(), String>,
    what: &str,
    needs: &str,
) -> bool {
    let Err(why) = support else {
        return false;
    };
    // SAFETY: plain getter.
    let root = unsafe { libc::geteuid() } == 0;
    if std::env::var("CI").as_deref() == Ok("true") || root {
        panic!("{test}: {what} cannot run: {why}");
    }
    use std::io::Write;
    // Straight to fd 2: the test harness captures print!/eprint!, not this.
    let _ = writeln!(
        std::io::stderr(),
        "{test}: skipped: needs root for {needs} ({why})"
    );
    true
}

/// What a data plane needs to know of its cluster.
pub(crate) struct ClusterView<'a> {
    pub name: &'a str,
    pub dir: &'a Path,
    pub apiserver: SocketAddr,
    pub admin_yaml: &'a str,
    pub admin_path: &'a Path,
    pub service_cidr: &'a str,
    /// Real nodes ([`crate::ClusterOptions::nodes`]).
    pub nodes: usize,
    /// The fabric, when the cluster got it before its apiserver started (node clusters
    /// advertise its host address).
    pub fabric: Option<Arc<Fabric>>,
    pub pki: &'a crate::certs::Pki,
}

/// The data plane of one local cluster: its node namespace with kube-proxy and CoreDNS,
/// kube-controller-manager, and the tasks of workloads and gateways started on it.
/// Dropping it (done by [`crate::LocalCluster`]) kills them all and removes the namespace.
#[derive(Debug)]
pub struct DataPlane {
    inner: Arc<Inner>,
    processes: Mutex<Vec<Process>>,
    /// The data plane's directory (its Corefile, its processes' logs).
    dir: PathBuf,
    forwarder: Option<TcpProxy>,
    /// Real nodes, the first in `inner.node`'s namespaces.
    nodes: Vec<crate::node::Node>,
    runtime: Option<tokio::runtime::Runtime>,
}

#[derive(Debug)]
struct Inner {
    node_name: String,
    node_ip: Ipv4Addr,
    node: Arc<Netns>,
    // After `node`: the bridge goes last.
    fabric: Arc<Fabric>,
}

impl DataPlane {
    /// The last `lines` lines of the log of `process` (`kube-controller-manager`,
    /// `kube-proxy` or `coredns`), for test failure messages.
    pub fn log_tail(&self, process: &str, lines: usize) -> String {
        let procs = self.processes.lock();
        procs
            .iter()
            .find(|p| p.name() == process)
            .map(|p| p.log_tail(lines))
            .unwrap_or_else(|| format!("(no process {process})"))
    }

    /// The Node object's name (kube-proxy's `--hostname-override`).
    pub fn node_name(&self) -> &str {
        &self.inner.node_name
    }

    /// The node's address (198.19.K.x): kube-proxy, CoreDNS, workloads and the gateway
    /// listen on it.
    pub fn node_ip(&self) -> Ipv4Addr {
        self.inner.node_ip
    }

    /// CoreDNS of this cluster: `<node ip>:53`, serving `cluster.local`.
    pub fn dns_addr(&self) -> SocketAddr {
        SocketAddr::from((self.inner.node_ip, 53))
    }

    /// The host's address on the fabric (198.19.K.1): a process of the test (on the
    /// host) listening there is reached from every node, and from nowhere else.
    pub fn host_ip(&self) -> Ipv4Addr {
        self.inner.fabric.host_ip()
    }

    /// A free port on the host's fabric address ([`DataPlane::host_ip`]), UDP and TCP
    /// both free when checked: for a server of this process (the controller's
    /// `--clusterset-dns-addr`) that the nodes reach.
    ///
    /// Racy by nature: the sockets are closed before the server binds the port, so
    /// another socket could take it in between: the fabric address is this process's
    /// (shared by its clusters), where other servers ask the kernel for a fresh port the
    /// same way and the host's connections to the nodes take ephemeral ports, and the
    /// kernel does not hand a just-released port out again at once. Rare, not
    /// impossible: a caller waits for its server to answer on the port (a lost race
    /// fails the controller's start: "binding the clusterset.local DNS server").
    pub fn free_host_port(&self) -> Result<SocketAddr> {
        let host = self.host_ip();
        for _ in 0..20 {
            let tcp = std::net::TcpListener::bind((host, 0))?;
            let addr = tcp.local_addr()?;
            if std::net::UdpSocket::bind(addr).is_ok() {
                return Ok(addr);
            }
        }
        Err(Error::DataPlane(format!(
            "no port of {host} free for both TCP and UDP in 20 tries"
        )))
    }

    /// Gives this cluster's CoreDNS a server block `<zone>:53 { forward . <to> }` (as an
    /// operator adds `clusterset.local` to a cluster's Corefile, forwarded to the
    /// controller's DNS server; a block this gave `zone` before is replaced) and restarts
    /// it, waiting until it answers again (at most 30 s). `to` must be an address of this process's namespaces or the host's fabric
    /// address ([`DataPlane::host_ip`]): nothing else is reachable from the node.
    pub async fn forward_zone(&self, zone: &str, to: SocketAddr) -> Result<()> {
        let path = self.dir.join("Corefile");
        let corefile = with_forward(&std::fs::read_to_string(&path)?, zone, to);
        std::fs::write(&path, corefile)?;
        let bin = tokio::task::spawn_blocking(ensure_data_plane_binaries)
            .await
            .map_err(|e| Error::Binaries(e.to_string()))??;
        {
            let mut procs = self.processes.lock();
            // Dropping the old process kills it; the new one appends to the same log.
            procs.retain(|p| p.name() != "coredns");
            let mut dns = self.inner.node.command(&bin.coredns);
            dns.args(["-conf".to_string(), path.display().to_string()]);
            procs.push(Process::spawn_command(
                "coredns",
                dns,
                &self.dir.join("coredns.log"),
            )?);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.check_processes()?;
            if self
                .resolve("kubernetes.default.svc.cluster.local")
                .await
                .is_ok_and(|ips| !ips.is_empty())
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.process_error(
                    "coredns",
                    format!("not answering within 30 s after forwarding {zone} to {to}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The process id of `process` (`kube-controller-manager`, `kube-proxy` or
    /// `coredns`): a test may pause it (SIGSTOP, SIGCONT) to play it slow or down.
    pub fn pid_of(&self, process: &str) -> Option<u32> {
        let procs = self.processes.lock();
        procs.iter().find(|p| p.name() == process).map(Process::pid)
    }

    /// Process ids of kube-controller-manager, kube-proxy, CoreDNS and the namespace
    /// holders (node, and the process-wide bridge).
    pub fn pids(&self) -> Vec<u32> {
        let procs = self.processes.lock();
        let mut pids: Vec<u32> = procs.iter().map(Process::pid).collect();
        pids.push(self.inner.node.pid());
        pids.push(self.inner.fabric.bridge.pid());
        pids
    }

    /// `/proc/<pid>/ns/net` of the node namespace: `nsenter --net=<path> <cmd>` runs a
    /// command on the node.
    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.inner.node.pid()))
    }

    /// The A records of `name` from this cluster's CoreDNS, asked from the node.
    pub async fn resolve(&self, name: &str) -> Result<Vec<Ipv4Addr>> {
        self.inner.resolve(name).await
    }

    /// The answer of this cluster's CoreDNS to an A query for `name`, asked from the
    /// node, with its response code (NXDOMAIN and NODATA told apart).
    pub async fn resolve_answer(&self, name: &str) -> Result<DnsAnswer> {
        let socket = tokio::net::UdpSocket::from_std(self.inner.node.udp_socket()?)?;
        let server = SocketAddr::from((self.inner.node_ip, 53));
        Ok(wire::query_a_answer(&socket, server, name).await?)
    }

    /// `GET path` with `Host: host` to `addr`, from the node (so through kube-proxy when
    /// `addr` is a ClusterIP); bounded by 5 s.
    pub async fn http_get_addr(
        &self,
        addr: SocketAddr,
        host: &str,
        path: &str,
    ) -> Result<HttpAnswer> {
        self.inner.http_get_addr(addr, host, path).await
    }

    /// `GET http://<host>:<port><path>` from the node, `host` resolved by this cluster's
    /// CoreDNS (or an IPv4 literal): what a pod's client does.
    pub async fn http_get(&self, host: &str, port: u16, path: &str) -> Result<HttpAnswer> {
        let ip = match host.parse::<Ipv4Addr>() {
            Ok(ip) => ip,
            Err(_) => *self
                .resolve(host)
                .await?
                .first()
                .ok_or_else(|| Error::DataPlane(format!("{host} does not resolve")))?,
        };
        self.http_get_addr(
            SocketAddr::from((ip, port)),
            &format!("{host}:{port}"),
            path,
        )
        .await
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime
            .as_ref()
            .expect("runtime lives as long as the data plane")
    }

    /// Adds another address of the fabric (198.19.K.210-254) to this node and returns it:
    /// where a second gateway can listen, so that a test can move a gateway.
    pub fn add_address(&self) -> Result<Ipv4Addr> {
        let n = self.inner.fabric.next_extra.fetch_add(1, Ordering::Relaxed);
        if n > 44 {
            return Err(Error::DataPlane(
                "no more extra addresses (45 per process)".into(),
            ));
        }
        let ip = Ipv4Addr::new(198, 19, self.inner.fabric.subnet, 210 + n as u8);
        self.inner
            .node
            .ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        Ok(ip)
    }

    /// Adds the first `count` (at most 1,280) addresses of 198.19.251.0-198.19.255.255 to
    /// this node (on `lo`, one `/32` each, in one `ip -batch`) and returns them: with
    /// [`DataPlane::route_many_addresses_via`] on another node, that many distinct
    /// addresses which all lead to this node, e.g. to a gateway listening on it (its
    /// kube-proxy DNATs a LoadBalancer IP to the gateway Service's endpoints anyway; the
    /// addresses make them local even without that). Idempotent.
    pub fn add_many_addresses(&self, count: usize) -> Result<Vec<Ipv4Addr>> {
        if count > MANY_MAX {
            return Err(Error::DataPlane(format!(
                "at most {MANY_MAX} addresses in 198.19.251.0-198.19.255.255, not {count}"
            )));
        }
        let ips: Vec<Ipv4Addr> = (0..count as u32)
            .map(|i| Ipv4Addr::from(u32::from(MANY_FIRST) + i))
            .collect();
        let batch: String = ips
            .iter()
            .map(|ip| format!("addr replace {ip}/32 dev lo\n"))
            .collect();
        self.inner.node.ip_batch(&batch)?;
        Ok(ips)
    }

    /// Routes 198.19.251.0-198.19.255.255 (the block of
    /// [`DataPlane::add_many_addresses`]) from this node to `node`'s node address.
    pub fn route_many_addresses_via(&self, node: &DataPlane) -> Result<()> {
        let via = node.node_ip().to_string();
        let batch: String = MANY_PREFIXES
            .iter()
            .map(|p| format!("route replace {p} via {via} dev eth0\n"))
            .collect();
        self.inner.node.ip_batch(&batch)
    }
}

impl Inner {
    async fn resolve(&self, name: &str) -> Result<Vec<Ipv4Addr>> {
        let socket = tokio::net::UdpSocket::from_std(self.node.udp_socket()?)?;
        let server = SocketAddr::from((self.node_ip, 53));
        Ok(wire::query_a(&socket, server, name).await?)
    }

    async fn connect(&self, addr: SocketAddr) -> Result<tokio::net::TcpStream> {
        let socket = self.node.tcp_socket()?;
        match tokio::time::timeout(REQUEST_TIMEOUT, socket.connect(addr)).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(Error::DataPlane(format!(
                "connect to {addr} timed out after {REQUEST_TIMEOUT:?}"
            ))),
        }
    }

    async fn http_get_addr(&self, addr: SocketAddr, host: &str, path: &str) -> Result<HttpAnswer> {
        let stream = self.connect(addr).await?;
        match tokio::time::timeout(REQUEST_TIMEOUT, wire::http_get(stream, host, path)).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(Error::DataPlane(format!(
                "GET {path} from {addr} timed out after {REQUEST_TIMEOUT:?}"
            ))),
        }
    }

    /// One gateway connection: `Host: <name>-<cluster>.<ns>.svc...[:port]` (or
    /// `<name>-federated...`) goes to `<name>.<ns>.svc.cluster.local:<port>` of this
    /// cluster (its DNS, its kube-proxy).
    async fn gateway_forward(&self, mut inbound: tokio::net::TcpStream, suffix: &str) {
        let Ok((head, _, host)) = wire::read_head(&mut inbound).await else {
            return;
        };
        let target = host.as_deref().and_then(|h| local_target(h, suffix));
        let Some((name, port)) = target else {
            let _ = wire::respond(&mut inbound, 404, "no such exported service").await;
            return;
        };
        let ip = match self.resolve(&name).await {
            Ok(ips) if !ips.is_empty() => ips[0],
            _ => {
                let _ = wire::respond(&mut inbound, 502, &format!("{name} does not resolve")).await;
                return;
            }
        };
        let Ok(mut outbound) = self.connect(SocketAddr::from((ip, port))).await else {
            let _ = wire::respond(&mut inbound, 502, &format!("{name}:{port} refused")).await;
            return;
        };
        use tokio::io::AsyncWriteExt;
        if outbound.write_all(&head).await.is_ok() {
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        }
    }
}

pub(crate) fn first_service_ip(cidr: &str) -> Result<Ipv4Addr> {
    let base: Ipv4Addr = cidr
        .split('/')
        .next()
        .and_then(|b| b.parse().ok())
        .ok_or_else(|| Error::DataPlane(format!("bad service CIDR {cidr}")))?;
    Ok(Ipv4Addr::from(u32::from(base) + 1))
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        // Nodes first (their pods, kubelets, containerds), then the processes, then the
        // tasks; the namespaces go with the last Arc.
        drop(std::mem::take(&mut self.nodes));
        for mut p in std::mem::take(&mut *self.processes.lock()) {
            p.kill();
        }
        drop(self.forwarder.take());
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// `corefile` with the server block `<zone>:53 { forward . <to> }` in place of the one
/// it had for `zone`, if any (the block's first line `<zone>:53 {` to the next `}` at
/// the start of a line), else at its end.
fn with_forward(corefile: &str, zone: &str, to: SocketAddr) -> String {
    let head = format!("{zone}:53 {{");
    let mut out = String::with_capacity(corefile.len() + 128);
    let mut skipping = false;
    for line in corefile.lines() {
        if skipping {
            skipping = line != "}";
            continue;
        }
        if line == head {
            skipping = true;
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    // No cache: the test sees the controller's answers as they change.
    out.push_str(&format!(
        "{head}\n  errors\n  forward . {to} {{\n    max_fails 0\n  }}\n}}\n"
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarding_a_zone_again_replaces_its_block() {
        let base = ".:53 {\n  errors\n  kubernetes cluster.local {\n    pods insecure\n  }\n}\n";
        let once = with_forward(base, "clusterset.local", "10.0.0.1:5353".parse().unwrap());
        assert_eq!(
            once,
            format!(
                "{base}clusterset.local:53 {{\n  errors\n  forward . 10.0.0.1:5353 {{\n    max_fails 0\n  }}\n}}\n"
            )
        );
        let twice = with_forward(&once, "clusterset.local", "10.0.0.2:53".parse().unwrap());
        assert_eq!(twice, once.replace("10.0.0.1:5353", "10.0.0.2:53"));
        assert_eq!(twice.matches("clusterset.local:53").count(), 1);
        // Another zone is added beside it.
        let other = with_forward(&twice, "example.org", "10.0.0.3:53".parse().unwrap());
        assert!(other.starts_with(&twice));
        let blocks = |c: &str| {
            c.lines()
                .filter(|l| !l.starts_with(' ') && l.ends_with(":53 {"))
                .count()
        };
        assert_eq!((blocks(&once), blocks(&twice), blocks(&other)), (2, 2, 3));
    }

    #[test]
    fn gateway_maps_the_host_to_the_local_service() {
        assert_eq!(
            local_target("web-east.shop.svc.cluster.local:8080", "-east"),
            Some(("web.shop.svc.cluster.local".into(), 8080))
        );
        assert_eq!(
            local_target("web-east.shop", "-east"),
            Some(("web.shop.svc.cluster.local".into(), 80))
        );
        assert_eq!(local_target("web.shop.svc.cluster.local", "-east"), None);
        assert_eq!(local_target("-east.shop", "-east"), None);
        assert_eq!(
            local_target("web-federated.shop.svc.cluster.local:80", "-east"),
            Some(("web.shop.svc.cluster.local".into(), 80))
        );
        assert_eq!(local_target("-federated.shop", "-east"), None);
        // A pod of a headless mirror.
        assert_eq!(
            local_target("web-1.web-east.shop.svc.cluster.local:8080", "-east"),
            Some(("web-1.web.shop.svc.cluster.local".into(), 8080))
        );
        assert_eq!(
            local_target("web-1.web-east.shop", "-east"),
            Some(("web-1.web.shop.svc.cluster.local".into(), 80))
        );
        assert_eq!(
            local_target("web-1.web.shop.svc.cluster.local", "-east"),
            None
        );
        // A ServiceImport's clusterset name.
        assert_eq!(
            local_target("web.shop.svc.clusterset.local:8080", "-east"),
            Some(("web.shop.svc.cluster.local".into(), 8080))
        );
        assert_eq!(local_target(".shop.svc.clusterset.local", "-east"), None);
        assert_eq!(
            local_target("web.shop.svc.clusterset.example", "-east"),
            None
        );
    }

    #[test]
    fn first_service_ip_is_the_kubernetes_service() {
        assert_eq!(
            first_service_ip("198.18.3.0/24").unwrap(),
            Ipv4Addr::new(198, 18, 3, 1)
        );
    }
}
