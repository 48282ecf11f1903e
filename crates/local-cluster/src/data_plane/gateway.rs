//! The test gateway: a TCP forwarder in a node's namespace standing for a cluster's
//! multicluster gateway (its probe port answers while it is up).

use super::*;

impl DataPlane {
    /// Starts the stand-in gateway of cluster `cluster` on this node's address; see
    /// [`Gateway`].
    pub fn start_gateway(&self, cluster: &str) -> Result<Gateway> {
        self.start_gateway_at(cluster, self.inner.node_ip)
    }

    /// [`DataPlane::start_gateway`] on another address of this node
    /// ([`DataPlane::add_address`]).
    pub fn start_gateway_at(&self, cluster: &str, ip: Ipv4Addr) -> Result<Gateway> {
        let gateway_addr = SocketAddr::from((ip, GATEWAY_PORT));
        let probe_addr = SocketAddr::from((ip, PROBE_PORT));
        let gw = self.inner.node.tcp_listener(gateway_addr)?;
        let probe = self.inner.node.tcp_listener(probe_addr)?;
        let _guard = self.runtime().enter();
        let gw = tokio::net::TcpListener::from_std(gw)?;
        let probe = tokio::net::TcpListener::from_std(probe)?;
        let suffix = format!("-{cluster}");
        let inner = self.inner.clone();
        let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let count = accepted.clone();
        let reached_on = Arc::new(Mutex::new(BTreeMap::new()));
        let reached = reached_on.clone();
        let forward = self.runtime().spawn(async move {
            loop {
                let Ok((s, _)) = gw.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                count.fetch_add(1, Ordering::Relaxed);
                if let Some(dst) = original_destination(&s) {
                    *reached.lock().entry(dst).or_insert(0) += 1;
                }
                let inner = inner.clone();
                let suffix = suffix.clone();
                tokio::spawn(async move {
                    // Bounded: a stuck connection is dropped after 30 s.
                    let _ = tokio::time::timeout(
                        Duration::from_secs(30),
                        inner.gateway_forward(s, &suffix),
                    )
                    .await;
                });
            }
        });
        let probe_task = self.runtime().spawn(async move {
            loop {
                let Ok((mut s, _)) = probe.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                tokio::spawn(async move {
                    let answer = async {
                        let (_, path, _) = wire::read_head(&mut s).await?;
                        let status = if path == "/ready" { 200 } else { 404 };
                        wire::respond(&mut s, status, "ok").await
                    };
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer).await;
                });
            }
        });
        Ok(Gateway {
            gateway_addr,
            probe_addr,
            accepted,
            reached_on,
            tasks: vec![forward, probe_task],
        })
    }
}

/// Test infrastructure standing in for Linkerd's multicluster gateway (it is not
/// Linkerd's gateway, has no mTLS and no identity): on `<node ip>:4143` (`mc-gateway`) it
/// reads a request's Host header, `<name>-<cluster>.<ns>.svc.cluster.local[:port]` (or a
/// federated `<name>-federated.<ns>...`, or an MCS `<name>.<ns>.svc.clusterset.local`), and
/// forwards the connection to `<name>.<ns>.svc.cluster.local:<port>` of its own cluster,
/// resolved by that cluster's CoreDNS and routed by its kube-proxy; on `<node ip>:4191`
/// (`mc-probe`) it answers `GET /ready` with 200. Stops when the handle drops.
///
/// A gateway Service of type LoadBalancer whose ingress is this address needs Endpoints
/// at this address too (as a real gateway's pods give it): the cluster's kube-proxy
/// routes traffic to a LoadBalancer IP to the Service's endpoints, and rejects it while
/// there are none.
#[derive(Debug)]
pub struct Gateway {
    gateway_addr: SocketAddr,
    probe_addr: SocketAddr,
    accepted: Arc<std::sync::atomic::AtomicU64>,
    /// `mc-gateway` connections per address the client connected to.
    reached_on: Arc<Mutex<BTreeMap<Ipv4Addr, u64>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Gateway {
    /// The `mc-gateway` address: the gateway Service's `status.loadBalancer.ingress` IP
    /// and its `mc-gateway` port.
    pub fn addr(&self) -> SocketAddr {
        self.gateway_addr
    }

    /// The `mc-probe` address.
    pub fn probe_addr(&self) -> SocketAddr {
        self.probe_addr
    }

    /// Connections accepted on `mc-gateway` so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Connections accepted on `mc-gateway` so far, per address the client connected to
    /// (the destination before any DNAT of this node's kube-proxy, which sends traffic for
    /// a LoadBalancer IP of the gateway Service to the gateway's own address).
    pub fn reached_on(&self) -> BTreeMap<Ipv4Addr, u64> {
        self.reached_on.lock().clone()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The IPv4 destination the client of `s` connected to: conntrack's original destination
/// (`SO_ORIGINAL_DST`) when the connection was DNATed, else the socket's local address.
pub(super) fn original_destination(s: &tokio::net::TcpStream) -> Option<Ipv4Addr> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed sockaddr_in is valid; getsockopt writes at most `len` bytes to it.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if r == 0 && addr.sin_family == libc::AF_INET as libc::sa_family_t {
        return Some(Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)));
    }
    match s.local_addr().ok()?.ip() {
        std::net::IpAddr::V4(ip) => Some(ip),
        std::net::IpAddr::V6(_) => None,
    }
}

/// `web-east.shop.svc.cluster.local:8080` with suffix `-east` →
/// (`web.shop.svc.cluster.local`, 8080); port 80 when absent.
pub(super) fn local_target(host: &str, suffix: &str) -> Option<(String, u16)> {
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) => (n, p.parse().ok()?),
        None => (host, 80),
    };
    let labels: Vec<&str> = name.split('.').collect();
    // `<hostname>.<svc>-<cluster>.<ns>.svc...`: one pod of a headless mirror, reached
    // at `<hostname>.<svc>.<ns>.svc.cluster.local` (the remote's per-pod DNS name).
    if let [host, svc, ns, rest @ ..] = labels.as_slice()
        && let Some(service) = svc.strip_suffix(suffix)
        && rest.first().is_none_or(|l| *l == "svc")
        && *ns != "svc"
        && ![host, &service, ns].iter().any(|l| l.is_empty())
    {
        return Some((format!("{host}.{service}.{ns}.svc.cluster.local"), port));
    }
    // A ServiceImport's name, `<svc>.<ns>.svc.clusterset.local` (KEP-1645).
    if let [svc, ns, "svc", "clusterset", "local"] = labels.as_slice()
        && !svc.is_empty()
        && !ns.is_empty()
    {
        return Some((format!("{svc}.{ns}.svc.cluster.local"), port));
    }
    let first = labels.first()?;
    // A mirror `<svc>-<cluster>`, or a federated Service `<svc>-federated`.
    let service = first
        .strip_suffix(suffix)
        .or_else(|| first.strip_suffix("-federated"))?;
    let namespace = labels.get(1)?;
    if service.is_empty() || namespace.is_empty() {
        return None;
    }
    Some((format!("{service}.{namespace}.svc.cluster.local"), port))
}
