//! Traffic on the wire through mirrors, on clusters with data planes (kube-controller-manager,
//! kube-proxy, CoreDNS; docs/data-plane.md) in network namespaces the harness makes: one test
//! binary.

#[path = "../support/mod.rs"]
mod support;

mod clusterset_dns;
mod federated;
mod headless;
mod links;
mod mcs;
mod stale;
