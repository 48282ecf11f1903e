//! EndpointSlices that point at a remote cluster's gateway, wholly ours: those of a
//! federated Service's remote members (`federated`) and of a ServiceImport's source
//! clusters (`mcs_slices`). One slice per address family, every service port mapped
//! (by name, as kube-proxy routes) to the gateway's one port; and the writes that bring
//! a set of stored slices of ours to the desired ones.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::action::{Action, Object, ObjectKind, ObjectRef};
use super::diff::MetadataOwnership;
use super::gateway::ResolvedGateway;
use super::slices::{MAX_ENDPOINTS_PER_SLICE, slice_name, slice_updatable, slice_update_with};

/// What the slices of one cluster's gateway carry.
#[derive(Debug, Clone, Copy)]
pub struct GatewaySlices<'a> {
    /// Namespace of the slices.
    pub namespace: &'a str,
    /// Name before `-<family>-<index>` (cut by the slice-name rule).
    pub base: &'a str,
    /// Labels of every slice.
    pub labels: &'a BTreeMap<String, String>,
    /// Annotations of every slice.
    pub annotations: &'a BTreeMap<String, String>,
    /// The gateway.
    pub gateway: &'a ResolvedGateway,
    /// The service's ports: `(name, protocol)`, each reaching the gateway's port.
    pub ports: &'a [(String, String)],
}

/// The slices of one gateway: one per address family it has addresses of (IPv4 first;
/// none if it has none), at most [`MAX_ENDPOINTS_PER_SLICE`] addresses each, each ready
/// and serving only while the gateway is alive and that address's own probes pass. Owner references are left to
/// [`plan_slices`].
pub fn gateway_slices(input: &GatewaySlices<'_>) -> Vec<EndpointSlice> {
    let gw = input.gateway;
    let ports: Vec<EndpointPort> = input
        .ports
        .iter()
        .map(|(name, protocol)| EndpointPort {
            name: Some(name.clone()),
            protocol: Some(protocol.clone()),
            port: Some(gw.port),
            app_protocol: None,
        })
        .collect();
    let mut out = Vec::new();
    for (family, v6) in [("ipv4", false), ("ipv6", true)] {
        // Sorted and without duplicates already (a `ResolvedGateway`'s addresses are).
        let mut addrs: Vec<IpAddr> = gw
            .addresses
            .iter()
            .copied()
            .filter(|a| a.is_ipv6() == v6)
            .collect();
        addrs.truncate(MAX_ENDPOINTS_PER_SLICE);
        if addrs.is_empty() {
            continue;
        }
        let endpoints = addrs
            .iter()
            .map(|a| Endpoint {
                addresses: vec![a.to_string()],
                // An address failing its own probes is not ready alone.
                conditions: Some(EndpointConditions {
                    ready: Some(gw.is_ready(a)),
                    serving: Some(gw.is_ready(a)),
                    terminating: Some(false),
                }),
                ..Default::default()
            })
            .collect();
        out.push(EndpointSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(input.base, family, 0)),
                namespace: Some(input.namespace.to_owned()),
                labels: Some(input.labels.clone()),
                annotations: Some(input.annotations.clone()),
                ..Default::default()
            },
            address_type: if v6 { "IPv6" } else { "IPv4" }.to_owned(),
            endpoints,
            ports: Some(ports.clone()),
        });
    }
    out
}

/// The delete of exactly the stored slice `s` (uid and resourceVersion preconditions).
pub fn delete_slice(s: &EndpointSlice) -> Action {
    Action::Delete(ObjectRef {
        kind: ObjectKind::EndpointSlice,
        namespace: s.metadata.namespace.clone().unwrap_or_default(),
        name: s.metadata.name.clone().unwrap_or_default(),
        uid: s.metadata.uid.clone(),
        resource_version: s.metadata.resource_version.clone(),
    })
}

/// The writes that bring `stored` (slices of ours, all of one owner) to `desired`, each
/// owned by `owner`: a missing one created, a changed one updated (labels and
/// annotations whole: the slices are ours), one of another address family under the
/// name deleted and created again, and one not desired deleted unless `untouched` says
/// to leave it (its cluster's gateway is not known yet).
pub fn plan_slices(
    desired: &[EndpointSlice],
    stored: &[&EndpointSlice],
    owner: &OwnerReference,
    untouched: impl Fn(&EndpointSlice) -> bool,
) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut wanted = BTreeSet::new();
    for d in desired {
        let mut d = d.clone();
        d.metadata.owner_references = Some(vec![owner.clone()]);
        let name = d.metadata.name.clone().unwrap_or_default();
        let current = stored
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(&name));
        wanted.insert(name);
        match current {
            None => actions.push(Action::Create(Object::EndpointSlice(d))),
            Some(cur) if !slice_updatable(cur, &d) => {
                actions.push(delete_slice(cur));
                actions.push(Action::Create(Object::EndpointSlice(d)));
            }
            Some(cur) => {
                if let Some(u) = slice_update_with(cur, &d, MetadataOwnership::All) {
                    actions.push(Action::Update(Object::EndpointSlice(u)));
                }
            }
        }
    }
    for s in stored {
        let name = s.metadata.name.clone().unwrap_or_default();
        if !wanted.contains(&name) && !untouched(s) {
            actions.push(delete_slice(s));
        }
    }
    actions
}
