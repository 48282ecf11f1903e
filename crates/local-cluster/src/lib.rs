//! Real local Kubernetes control planes for tests, benchmarks and the demo.
//!
//! A [`LocalCluster`] is one `etcd` plus one `kube-apiserver` on 127.0.0.1, built from Go
//! modules by `scripts/build-control-plane.sh` and started with freshly generated
//! certificates, RBAC authorization and a service CIDR of its own. There is no controller
//! manager: no namespace finalisation, no endpoints controller, no garbage collection.
//!
//! With [`ClusterOptions::data_plane`] a cluster also gets a node (a network namespace)
//! with kube-proxy and CoreDNS, and kube-controller-manager's EndpointSlice controllers:
//! see [`DataPlane`] and docs/data-plane.md.
//!
//! With [`ClusterOptions::nodes`] the cluster gets real nodes ([`Node`]: kubelet and
//! containerd in namespaces of their own, running pods from registry-free images), with
//! kube-controller-manager's default controllers and kube-scheduler: docs/real-node.md.
//!
//! Between a client and an apiserver, a [`TcpProxy`] cuts and restores connectivity, and
//! a [`FaultProxy`] injects HTTP faults (error statuses, latency, stalled connections).
//!
//! Processes die with their handle, and with the process that started them (parent-death
//! signal); working directories of dead processes are swept on the next start.

mod apply;
mod binaries;
mod certs;
mod cluster;
mod data_plane;
mod endpoints;
mod fault_proxy;
mod kubeconfig;
mod node;
mod ports;
mod process;
mod proxy;
mod shared;
mod workdir;

pub use apply::{FIELD_MANAGER, apply_yaml, parse_documents};
pub use binaries::{
    Binaries, DataPlaneBinaries, NodeBinaries, built_data_plane_binaries, built_node_binaries,
    ensure_binaries, ensure_data_plane_binaries, ensure_images, ensure_node_binaries,
};
pub use cluster::{ClusterOptions, LocalCluster, ensure_namespace};
pub use data_plane::{
    DataPlane, DnsAnswer, GATEWAY_PORT, Gateway, HttpAnswer, PROBE_PORT, Workload,
    data_plane_support, skip_without_data_plane,
};
pub use endpoints::publish_endpoints;
pub use fault_proxy::{Fault, FaultProxy};
pub use kubeconfig::{Kubeconfig, client_from_yaml, with_server};
pub use node::{
    Node, PAUSE_IMAGE, is_ready, leftover_cgroups, node_support, skip_without_nodes,
    sweep_node_cgroups,
};
pub use process::spawn_tied;
pub use proxy::TcpProxy;
pub use shared::{shared_cluster, shared_cluster_with, unique_namespace};

/// Errors from starting or driving a local cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control-plane binaries are missing and could not be built.
    #[error("control-plane binaries: {0}")]
    Binaries(String),
    /// A process did not start or did not become ready; carries its log tail.
    #[error("{what} did not start: {reason}\n--- log tail ---\n{log_tail}")]
    Start {
        /// Which process.
        what: String,
        /// Why it is considered failed.
        reason: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// Certificate generation failed.
    #[error("certificates: {0}")]
    Certs(#[from] rcgen::Error),
    /// File system or process error.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A Kubernetes API call failed.
    #[error("kubernetes api: {0}")]
    Kube(#[from] kube::Error),
    /// A kubeconfig could not be turned into a client.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// A manifest handed to [`apply_yaml`] is not valid, or names an unknown kind.
    #[error("manifest: {0}")]
    Manifest(String),
    /// The data plane (network namespaces, kube-proxy, CoreDNS) could not be set up.
    #[error("data plane: {0}")]
    DataPlane(String),
    /// A Secret handed to [`LocalCluster::fill_token_secret`] cannot be filled.
    #[error("token secret: {0}")]
    TokenSecret(String),
    /// A [`FaultProxy`] could not set up its TLS from the cluster's certificates.
    #[error("fault proxy: {0}")]
    FaultProxy(String),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
