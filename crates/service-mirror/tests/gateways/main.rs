//! Gateways on real apiservers: probes, the address policy, what the admin server and
//! `service-mirror gateways` say. One test binary.

#[path = "../support/mod.rs"]
mod support;

mod policy;
mod probe;
mod report;
