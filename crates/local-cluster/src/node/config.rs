//! The files of one real node, as pure functions of its settings: containerd's config,
//! the CNI network, kubelet's configuration and the values its host sysctls must read.
//! Every setting that differs from a default says why (docs/real-node.md has the traps).

use std::net::Ipv4Addr;
use std::path::Path;

/// The image containerd runs as every pod's sandbox: imported on every node by the
/// harness (`scripts/build-images.sh`), never pulled.
pub const PAUSE_IMAGE: &str = "service-mirror.local/pause:3.10";

/// The six kernel tunables kubelet 1.34 rewrites when they differ from these values
/// (`setupKernelTunables`). They are not namespaced, so each node bind-mounts files
/// holding these values over them in its own mount namespace: the host's values never
/// change.
pub(crate) const KUBELET_SYSCTLS: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// Where a node keeps its state: everything below its directory.
#[derive(Debug, Clone)]
pub(crate) struct NodePaths {
    pub dir: std::path::PathBuf,
}

impl NodePaths {
    pub(crate) fn p(&self, rel: &str) -> String {
        self.dir.join(rel).display().to_string()
    }
    pub(crate) fn containerd_socket(&self) -> String {
        self.p("ctrd/containerd.sock")
    }
}

/// containerd 1.6 (Debian) configuration of one node.
pub(crate) fn containerd_toml(paths: &NodePaths) -> String {
    let p = |r: &str| paths.p(r);
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # This sandbox lacks CAP_SYS_RESOURCE: without this runc fails every pod on
  # "failed to update /proc/self/oom_score_adj: Permission denied".
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # Else runc's state goes to /run/containerd/runc/k8s.io, shared by every node.
        Root = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
        root = p("ctrd/root"),
        state = p("ctrd/state"),
        socket = paths.containerd_socket(),
        opt = p("ctrd/opt"),
        pause = PAUSE_IMAGE,
        runc = p("ctrd/runc"),
        cni = p("cni/net.d"),
    )
}

/// The node's CNI network: a bridge `cni0` holding the node's pod CIDR, the node as the
/// pods' default gateway, and pod traffic leaving the pod CIDR masqueraded to the node's
/// address (so that the host's apiserver forwarder and other clusters' nodes answer a
/// pod without a route back to every pod CIDR).
pub(crate) fn cni_conflist(pod_cidr: &str, ipam_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "service-mirror-node",
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": true,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": pod_cidr }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": ipam_dir.display().to_string(),
            },
        }],
    })
    .to_string()
}

/// Settings of one kubelet.
pub(crate) struct KubeletSettings<'a> {
    pub paths: &'a NodePaths,
    pub node_ip: Ipv4Addr,
    /// `/<name>`: a cgroup of its own in every hierarchy, so nodes never share one.
    pub cgroup_root: &'a str,
    /// The cluster's CoreDNS.
    pub dns: Ipv4Addr,
}

/// kubelet's configuration (kubelet.config.k8s.io/v1beta1).
pub(crate) fn kubelet_yaml(s: &KubeletSettings<'_>) -> String {
    let p = |r: &str| s.paths.p(r);
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://{socket}
# containerd 1.6 does not report its cgroup driver (RuntimeConfig): kubelet uses this.
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
failSwapOn: false
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
# Not podLogsDirectory: kubelet ignores that unknown field and writes /var/log/pods.
podLogsDir: {logs}
volumePluginDir: {plugins}
# -999 is refused here (no CAP_SYS_RESOURCE).
oomScoreAdj: 0
# Pods with dnsPolicy Default never see the host's resolver.
resolvConf: {resolv}
clusterDomain: cluster.local
clusterDNS: [{dns}]
serializeImagePulls: false
imageGCHighThresholdPercent: 100
# No eviction at all: "0%" turns a signal off (kubelet ignores 0% and 100%), and each
# signal named here keeps kubelet from adding its default. A test node shares the host's
# disk and memory with every other test: a full disk (the CI machine at < 1 % free after
# its cargo builds) or page cache counted as working set (cgroup v1) set DiskPressure or
# MemoryPressure, whose NoSchedule taint and evictions left every controller pod of
# every cluster Pending at once; nothing here tests eviction.
evictionHard: {{memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", imagefs.inodesFree: "0%"}}
# The node Lease is renewed every 2 s (a quarter of this): kube-controller-manager's
# node-monitor grace period of 10 s then finds a lost node within about 12 s.
nodeLeaseDurationSeconds: 8
nodeStatusUpdateFrequency: 2s
maxPods: 40
"#,
        socket = s.paths.containerd_socket(),
        cgroup_root = s.cgroup_root,
        ip = s.node_ip,
        ca = p("pki/ca.crt"),
        logs = p("logs/pods"),
        plugins = p("kubelet-plugins/volume/exec"),
        resolv = p("resolv.conf"),
        dns = s.dns,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths() -> NodePaths {
        NodePaths {
            dir: "/tmp/n".into(),
        }
    }

    #[test]
    fn containerd_never_adjusts_oom_scores_and_keeps_every_path_under_the_node() {
        let toml = containerd_toml(&paths());
        assert!(toml.contains("restrict_oom_score_adj = true"));
        assert!(toml.contains(r#"Root = "/tmp/n/ctrd/runc""#));
        assert!(toml.contains(r#"address = "/tmp/n/ctrd/containerd.sock""#));
        assert!(toml.contains(&format!(r#"sandbox_image = "{PAUSE_IMAGE}""#)));
        // Every absolute path it names is the node's own (or the CNI plugins').
        for path in toml.split('"').filter(|s| s.starts_with('/')) {
            assert!(
                path.starts_with("/tmp/n/") || path == "/usr/lib/cni",
                "{path}"
            );
        }
    }

    #[test]
    fn kubelet_config_names_podlogsdir_and_its_own_cgroup_root() {
        let yaml = kubelet_yaml(&KubeletSettings {
            paths: &paths(),
            node_ip: Ipv4Addr::new(198, 19, 7, 11),
            cgroup_root: "/sm-1-west-node",
            dns: Ipv4Addr::new(198, 19, 7, 10),
        });
        let doc: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(doc["podLogsDir"], "/tmp/n/logs/pods");
        assert!(doc.get("podLogsDirectory").is_none());
        assert_eq!(doc["cgroupRoot"], "/sm-1-west-node");
        assert_eq!(doc["clusterDNS"][0], "198.19.7.10");
        assert_eq!(doc["address"], "198.19.7.11");
        assert_eq!(doc["oomScoreAdj"], 0);
    }

    #[test]
    fn kubelet_evicts_for_no_signal_of_the_shared_host() {
        let yaml = kubelet_yaml(&KubeletSettings {
            paths: &paths(),
            node_ip: Ipv4Addr::new(198, 19, 7, 11),
            cgroup_root: "/sm-1-west-node",
            dns: Ipv4Addr::new(198, 19, 7, 10),
        });
        let doc: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        // kubelet's DefaultEvictionHard (pkg/kubelet/eviction/defaults_linux.go, 1.34):
        // a signal left out gets its default back.
        for signal in [
            "memory.available",
            "nodefs.available",
            "nodefs.inodesFree",
            "imagefs.available",
            "imagefs.inodesFree",
        ] {
            assert_eq!(doc["evictionHard"][signal], "0%", "{signal}");
        }
    }

    #[test]
    fn cni_masquerades_pod_traffic_leaving_the_pod_cidr() {
        let conf: serde_json::Value =
            serde_json::from_str(&cni_conflist("198.18.192.0/24", Path::new("/tmp/n/ipam")))
                .unwrap();
        let bridge = &conf["plugins"][0];
        assert_eq!(bridge["ipMasq"], true);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "198.18.192.0/24");
        assert_eq!(bridge["ipam"]["dataDir"], "/tmp/n/ipam");
    }
}
