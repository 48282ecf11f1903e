//! The host side of the node networks: one bridge every node's namespace plugs into,
//! the routes to pods, and the sweep of what a killed run left.

use super::*;

/// The bridge namespace of this process and the host's veth into it; shared by every
/// data plane of the process, removed with the last.
#[derive(Debug)]
pub(crate) struct Fabric {
    /// Third octet K of 198.19.K.0/24.
    pub(crate) subnet: u8,
    pub(crate) bridge: Netns,
    pub(crate) next_node: AtomicU32,
    pub(crate) next_extra: AtomicU32,
    /// The pod CIDR of every real node of this process, routed from every other.
    pub(crate) pod_routes: Mutex<Vec<PodRoute>>,
}

/// A real node's pod CIDR and the node address it is routed to.
#[derive(Debug)]
pub(crate) struct PodRoute {
    /// A process in the node's network namespace (its first process).
    pub pid: u32,
    pub ip: Ipv4Addr,
    pub pod_cidr: String,
}

impl Fabric {
    pub(crate) fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, self.subnet, 1)
    }

    /// A new node address 198.19.K.(10+i) and a network namespace (`ns`) plugged into
    /// the bridge with it as `eth0`, the service CIDR routed to a dead-end veth.
    pub(crate) fn plug(&self, ns: &Netns, service_cidr: &str) -> Result<Ipv4Addr> {
        let index = self.next_node.fetch_add(1, Ordering::Relaxed);
        if index >= 200 {
            return Err(Error::DataPlane(
                "more than 200 nodes in one process".into(),
            ));
        }
        let node_ip = Ipv4Addr::new(198, 19, self.subnet, 10 + index as u8);
        let bridge_end = format!("n{index}");
        netns::host_ip(&[
            "link",
            "add",
            "eth0",
            "netns",
            &ns.pid().to_string(),
            "type",
            "veth",
            "peer",
            "name",
            &bridge_end,
            "netns",
            &self.bridge.pid().to_string(),
        ])?;
        self.bridge
            .ip(&["link", "set", &bridge_end, "master", "br0", "up"])?;
        ns.ip(&["link", "set", "lo", "up"])?;
        // kube-proxy refuses a connection to a Service without endpoints with an ICMP
        // reject; the kernel's default rate limit (one per second per destination) would
        // leave a client asking several times a second hanging until its timeout.
        // Namespaced: the host's own limit is untouched.
        ns.enter(|| std::fs::write("/proc/sys/net/ipv4/icmp_ratelimit", "0"))?;
        ns.ip(&["addr", "add", &format!("{node_ip}/24"), "dev", "eth0"])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
        // A ClusterIP must be routable before netfilter (kube-proxy's DNAT) sees it. Via
        // a veth pair whose far end has no address: a packet that is not DNATed goes
        // nowhere. Not via `lo`: kube-proxy's reject of a Service without ready endpoints
        // then never reaches the client, whose connect hangs instead of being refused.
        ns.ip(&[
            "link", "add", "svc0", "type", "veth", "peer", "name", "svc0p",
        ])?;
        ns.ip(&["link", "set", "svc0p", "up"])?;
        ns.ip(&["link", "set", "svc0", "up"])?;
        ns.ip(&[
            "route",
            "add",
            service_cidr,
            "dev",
            "svc0",
            "src",
            &node_ip.to_string(),
        ])?;
        Ok(node_ip)
    }

    pub(crate) fn get(dir: &Path) -> Result<Arc<Fabric>> {
        data_plane_support().map_err(Error::DataPlane)?;
        static FABRIC: Mutex<Weak<Fabric>> = Mutex::new(Weak::new());
        let mut slot = FABRIC.lock();
        if let Some(f) = slot.upgrade() {
            return Ok(f);
        }
        sweep();
        let used = netns::host_ip_output(&["-o", "-4", "addr", "show"])?;
        let pid = std::process::id();
        // 250 subnets; start at one derived from the pid so concurrent processes differ.
        let subnet = (0..250u32)
            .map(|i| ((pid + i) % 250 + 1) as u8)
            .find(|k| !used.contains(&format!("inet 198.19.{k}.")))
            .ok_or_else(|| Error::DataPlane("every 198.19.K.0/24 is in use".into()))?;
        let bridge = Netns::create("bridge", dir)?;
        bridge.ip(&["link", "set", "lo", "up"])?;
        bridge.ip(&["link", "add", "br0", "type", "bridge"])?;
        bridge.ip(&["link", "set", "br0", "up"])?;
        let host_if = format!("smh{pid}");
        // A fabric of this process dropped a moment ago leaves its veth until the kernel
        // has torn its bridge namespace down, which it does asynchronously: the add below
        // then failed with "File exists" (CI, 2026-12-05, a test starting its clusters
        // right after another's ended).
        // Deleting one end deletes the pair; it may be going already, so a failed delete
        // is tried over, up to 2 s.
        let bpid = bridge.pid().to_string();
        let add = [
            "link", "add", &host_if, "type", "veth", "peer", "name", "host", "netns", &bpid,
        ];
        let mut tries = 0;
        while let Err(e) = netns::host_ip(&add) {
            tries += 1;
            if tries > 20 || !e.to_string().contains("File exists") {
                return Err(e);
            }
            let _ = netns::host_ip(&["link", "del", &host_if]);
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let fabric = Fabric {
            subnet,
            bridge,
            next_node: AtomicU32::new(0),
            next_extra: AtomicU32::new(0),
            pod_routes: Mutex::new(Vec::new()),
        };
        netns::host_ip(&[
            "addr",
            "add",
            &format!("{}/24", fabric.host_ip()),
            "dev",
            &host_if,
        ])?;
        // No IPv6 on the host's link (no link-local address, no router solicitations):
        // the host talks to the fabric over 198.19.K.0/24 only.
        let _ = std::fs::write(
            format!("/proc/sys/net/ipv6/conf/{host_if}/disable_ipv6"),
            "1",
        );
        netns::host_ip(&["link", "set", &host_if, "up"])?;
        fabric
            .bridge
            .ip(&["link", "set", "host", "master", "br0", "up"])?;
        let fabric = Arc::new(fabric);
        *slot = Arc::downgrade(&fabric);
        Ok(fabric)
    }
}

/// Removes host veths `smh<pid>` of processes that no longer run. (Their namespaces die
/// with their holder processes, which die with their owner; this is the safety net.)
pub(super) fn sweep() {
    let Ok(links) = netns::host_ip_output(&["-o", "link", "show"]) else {
        return;
    };
    for line in links.lines() {
        let Some(name) = line
            .split(": ")
            .nth(1)
            .map(|n| n.split('@').next().unwrap_or(n))
        else {
            continue;
        };
        let Some(pid) = name.strip_prefix("smh").and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = netns::host_ip(&["link", "del", name]);
        }
    }
}

/// The service CIDR of the next data-plane cluster of this process: 198.18.N.0/24.
pub(crate) fn next_service_cidr() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    // 190, not 254: 198.18.192.0/18 holds real nodes' pod CIDRs.
    format!("198.18.{}.0/24", 1 + n % 190)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fabric made again at once after this process's last one was dropped starts: the
    /// old host veth, left while the kernel tears the old bridge namespace down, is
    /// replaced (the add failed with "File exists" before, now and then).
    #[test]
    fn a_fabric_made_again_at_once_after_the_last_was_dropped_starts() {
        if let Err(why) = crate::data_plane::data_plane_support() {
            eprintln!("skipped: {why}");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        for round in 0..10 {
            let fabric = Fabric::get(dir.path()).unwrap_or_else(|e| panic!("round {round}: {e}"));
            drop(fabric);
        }
    }
}
