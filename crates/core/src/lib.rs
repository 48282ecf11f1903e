//! The pure domain core of the service mirror.
//!
//! Nothing here talks to a cluster: every function maps Kubernetes objects (as
//! `k8s_openapi` values) to other values, so each rule is unit-tested without an
//! apiserver. This crate does not depend on `kube`'s client or `tokio`: purity is a
//! compile error to break; the custom resources it builds (the ServiceImport) are the
//! api crate's derived types, plain data over kube-core. The rest of the program uses it in three steps:
//!
//! 1. the per-link controller reads its caches (remote Services, remote gateways, local
//!    mirrors) and, for a remote Service key, decides with [`export_decision`], then
//!    builds the desired state with [`gateway_spec`] (plus hostname resolution into a
//!    [`ResolvedGateway`]) and [`desired_mirror`];
//! 2. it selects the local objects owned by the link that map to the key
//!    ([`is_owned`], [`remote_key`]) and calls [`plan()`];
//! 3. the writer executes the returned [`Action`]s, in order, with retries.
//!
//! Because [`plan()`] compares before writing ([`service_update`],
//! [`endpoints_update`], [`slice_update`]), an unchanged world produces no action at all.
//! The [`EndpointsMode`] says whether mirrors carry Endpoints, EndpointSlices or both.

#![forbid(unsafe_code)]

pub mod action;
pub mod address_policy;
pub mod desired;
pub mod diff;
pub mod export;
pub mod export_to;
pub mod federated;
pub mod gateway;
pub mod gateway_slices;
pub mod headless;
pub mod labels;
pub mod local_networks;
pub mod mcs;
pub mod mcs_derived;
pub mod mcs_import;
pub mod mcs_slices;
#[cfg(test)]
mod mcs_test_support;
pub mod metadata;
pub mod namespaces;
pub mod naming;
pub mod ownership;
pub mod plan;
pub mod probe;
pub mod remote_state;
pub mod selector;
pub mod shard;
#[cfg(test)]
mod slice_invariants_tests;
pub mod slices;
pub mod traffic;
pub mod write_lease;

pub use action::{Action, Object, ObjectKind, ObjectRef};
pub use address_policy::{AddressPolicy, Cidr, CidrError, LocalCidrs, Refused, RefusedBy};
pub use desired::{
    DesiredMirror, Link, MirrorStyle, ResourceStyle, desired_mirror, desired_namespace,
    mirror_labels, remote_discovery_mirror,
};
pub use diff::{
    MetadataOwnership, endpoints_update, endpoints_update_with, service_update, service_update_with,
};
pub use export::{ExportDecision, ExportPolicy, ExportRule, Refusal, export_decision};
pub use export_to::{Withheld, withheld};
pub use gateway::{
    GatewayError, GatewayRef, GatewaySpec, ResolvedGateway, endpoint_ip_allowed, exported_gateway,
    gateway_spec,
};
pub use headless::{
    HeadlessMirror, Pod, Pods, RemoteEndpoint, RemoteHeadlessSlice, Shape, choose_pods,
    endpoint_mirror_name, flipped, headless_mirror, is_headless, plan_set, shape,
};
pub use labels::{mirrored_slice_selector, owner_selector};
pub use metadata::{ExclusionError, Exclusions, copied_annotations, copied_labels};
pub use namespaces::NamespaceFilter;
pub use naming::{
    MAX_CLUSTER_NAME_LEN, NameError, ServiceKey, fq_name, mirror_name, parse_fq_name,
    validate_cluster_name,
};
pub use ownership::{is_owned, is_owned_federated, remote_key};
pub use plan::{mirroring_took_over, plan};
pub use probe::{AddressVerdict, ProbeSpec, gateway_verdict, probe_spec};
pub use remote_state::{
    RemoteState, StaleEffect, StalePolicy, StalePolicyError, relist_untrusted, stale_effect,
    stale_gateway,
};
pub use selector::{Selector, SelectorError};
pub use slices::{
    EndpointsMode, MAX_ENDPOINTS_PER_SLICE, MAX_PORTS_PER_SLICE,
    MIRRORING_MAX_ENDPOINTS_PER_SUBSET, Route, desired_slices, is_mirrored_slice, is_our_slice,
    mirroring_overflow, slice_name, slice_routes, slice_update,
};
