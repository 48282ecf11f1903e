//! The Multi-Cluster Services API (multicluster.x-k8s.io) on real apiservers: one test binary,
//! its shared clusters started once for every module.

#[path = "../support/mod.rs"]
mod support;

mod conformance;
mod crd;
mod enable;
mod export;
mod import;
mod slices;
