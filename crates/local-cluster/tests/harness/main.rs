//! The harness itself on real etcd + kube-apiserver processes: clusters, `apply_yaml`,
//! the TCP proxy and the fault proxy. One test binary (the node and data-plane tests,
//! which start namespaces and nodes, are binaries of their own).

mod apply;
mod cluster;
mod fault_proxy;
mod proxy;
