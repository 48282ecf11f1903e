//! Links on real apiservers: Linkerd's Link resource and CRD, selectors, gateways named by a
//! Link, link security and the lifecycle of a link's credentials. One test binary.

#[path = "../support/rbac.rs"]
mod rbac_support;
#[path = "../support/mod.rs"]
mod support;

// What ../support/rbac.rs names as `super::controller`.
use support::controller;

mod clusterprofile;
mod crd;
mod credentials;
mod export_to;
mod gateway;
mod gateway_move;
mod security;
mod selectors;
