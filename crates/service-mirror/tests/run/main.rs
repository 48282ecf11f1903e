//! The real `service-mirror run` binary: links from Secrets, bad links, many clusters, the
//! admin server; two replicas under one Lease; the per-link write Leases. One test binary.

#[path = "../support/mod.rs"]
mod support;

mod ha;
mod lifecycle;
mod shard;
mod write_leases;
