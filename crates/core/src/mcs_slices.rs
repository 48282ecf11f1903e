//! The EndpointSlices of a ServiceImport (KEP-1645, "Tracking Endpoints"): one group
//! per source cluster, labelled with the import's name and the source cluster, with
//! `kubernetes.io/service-name` naming the derived Service, so kube-proxy sends the
//! ClusterSetIP to every exporting cluster: a remote cluster's point at its gateway
//! (gateway mode: the gateway forwards to the exported Service there), this cluster's
//! own (when it exports the name) copy the endpoints of its exported Service's slices
//! (its pods are reachable here as they are).
//!
//! Ours carry [`IMPORT_LABEL`], our managed-by and our controller namespace, and are
//! owned by the ServiceImport; any other slice (kube-controller-manager's, another
//! implementation's) is never written.
//!
//! Not here (yet): headless imports (a gateway is one address for the whole Service,
//! not one per pod): a headless import has no slices of ours.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::ServiceKey;
use crate::action::Action;
use crate::gateway::ResolvedGateway;
use crate::gateway_slices::{GatewaySlices, gateway_slices, plan_slices};
use crate::labels::{
    CLUSTER_NAME_LABEL, CONTROLLER_NAMESPACE_ANNOTATION, MANAGED_BY_LABEL, MANAGED_BY_VALUE,
    REMOTE_GATEWAY_IDENTITY_ANNOTATION, REMOTE_SVC_FQ_NAME_ANNOTATION,
    SERVICE_NAME_LABEL as KUBE_SERVICE_NAME_LABEL,
};
use crate::mcs::{ImportPort, SERVICE_NAME_LABEL, SOURCE_CLUSTER_LABEL};
use crate::mcs_derived::derived_service_name;
use crate::mcs_import::{IMPORT_LABEL, IMPORT_VALUE};
use crate::naming::fq_name;
use crate::traffic::{
    Serving, TrafficPolicy, copy_local_slices, ready_endpoints_serving, ready_first,
    serving_remotes, stand_by,
};

/// A linked cluster's gateway as its link reports it, with the cluster's domain (which
/// only the slices of an import need, so it is not part of the gateway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceGateway {
    /// Addresses (policy-accepted), port, identity and probe verdict.
    pub gateway: ResolvedGateway,
    /// The cluster's DNS domain (the slices' `remote-svc-fq-name`).
    pub domain: String,
}

/// Everything the slices of one import depend on.
#[derive(Debug, Clone, Copy)]
pub struct ImportSlicesInput<'a> {
    /// The import.
    pub key: &'a ServiceKey,
    /// Its ports (the union), each reaching the gateways' port by name.
    pub ports: &'a [ImportPort],
    /// Whether it is headless (no slices of ours).
    pub headless: bool,
    /// The clusters that export it validly (`status.clusters`).
    pub clusters: &'a [String],
    /// This cluster.
    pub local_cluster: &'a str,
    /// The slices of this cluster's exported Service of the name (not ours), as
    /// listed; `None`: not listed yet (this cluster's slices of ours are left as they
    /// are).
    pub local_slices: Option<&'a [EndpointSlice]>,
    /// Each linked cluster's gateway, as last reported: absent, not reported yet (its
    /// slices are left as they are); `None`, none usable (no accepted address, no
    /// gateway Service: its slices go, as a mirror's endpoints do).
    pub gateways: &'a BTreeMap<String, Option<SourceGateway>>,
    /// Our controller namespace.
    pub controller_namespace: &'a str,
    /// Where its traffic goes (`core::traffic`): which remote clusters serve.
    pub traffic: &'a TrafficPolicy,
}

/// The desired slices of one import.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DesiredImportSlices {
    /// The slices (no owner yet: [`plan_import_slices`] sets the import).
    pub slices: Vec<EndpointSlice>,
    /// Exporting clusters whose gateway is not reported yet: their stored slices are
    /// left as they are (a restart must not empty them before the gateways come).
    pub untouched: BTreeSet<String>,
}

/// The base name of the slices of `key` from `cluster`: the derived Service's name
/// (unique per import, never a mirror's) and the cluster.
fn base_name(key: &ServiceKey, cluster: &str) -> String {
    format!("{}-{cluster}", derived_service_name(key))
}

/// The desired slices of an import (see the module doc). A cluster that exports no
/// longer has none, so its stored ones go.
pub fn desired_import_slices(input: &ImportSlicesInput<'_>) -> DesiredImportSlices {
    let mut out = DesiredImportSlices::default();
    if input.headless {
        return out;
    }
    let ports: Vec<(String, String)> = input
        .ports
        .iter()
        .map(|p| (p.name.clone(), p.protocol.clone()))
        .collect();
    let derived = derived_service_name(input.key);
    let labels = |cluster: &str| {
        BTreeMap::from([
            (SERVICE_NAME_LABEL.to_owned(), input.key.name.clone()),
            (SOURCE_CLUSTER_LABEL.to_owned(), cluster.to_owned()),
            (KUBE_SERVICE_NAME_LABEL.to_owned(), derived.clone()),
            (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
            (IMPORT_LABEL.to_owned(), IMPORT_VALUE.to_owned()),
        ])
    };
    let serving = serving(input);
    for cluster in input.clusters {
        if cluster == input.local_cluster {
            // This cluster's own pods: no `cluster-name` (Linkerd's local endpoints
            // carry no target cluster either).
            match input.local_slices {
                Some(local) => out
                    .slices
                    .extend(local_copies(input, &labels(cluster), local)),
                None => {
                    out.untouched.insert(cluster.clone());
                }
            }
            continue;
        }
        let source = match input.gateways.get(cluster) {
            None => {
                out.untouched.insert(cluster.clone());
                continue;
            }
            Some(None) => continue,
            Some(Some(source)) => source,
        };
        let Some(serves) = serving.serves(cluster) else {
            // This cluster's own endpoints not counted yet: as they are.
            out.untouched.insert(cluster.clone());
            continue;
        };
        let mut labels = labels(cluster);
        // Linkerd's destination turns `cluster-name` into `dst_target_cluster` (and the
        // fq-name below into `dst_target_service[_namespace]`). Ownership by a link also
        // needs `mirrored-service: "true"`, never on an import slice: no link adopts,
        // rewrites or deletes it.
        labels.insert(CLUSTER_NAME_LABEL.to_owned(), cluster.clone());
        let mut annotations = BTreeMap::from([
            (
                CONTROLLER_NAMESPACE_ANNOTATION.to_owned(),
                input.controller_namespace.to_owned(),
            ),
            (
                REMOTE_SVC_FQ_NAME_ANNOTATION.to_owned(),
                fq_name(&input.key.name, &input.key.namespace, &source.domain),
            ),
        ]);
        if let Some(id) = &source.gateway.identity {
            annotations.insert(REMOTE_GATEWAY_IDENTITY_ANNOTATION.to_owned(), id.clone());
        }
        let mut slices = gateway_slices(&GatewaySlices {
            namespace: &input.key.namespace,
            base: &base_name(input.key, cluster),
            labels: &labels,
            annotations: &annotations,
            gateway: &source.gateway,
            ports: &ports,
        });
        if !serves {
            stand_by(&mut slices);
        }
        out.slices.extend(slices);
    }
    ready_first(&mut out.slices);
    out
}

/// Which remote clusters take the import's traffic: this cluster's own ready endpoints
/// (when it exports the name; `None` while its slices are not listed) against the
/// policy, each remote usable while its gateway is reported, alive and has an address
/// passing its probes.
fn serving(input: &ImportSlicesInput<'_>) -> Serving {
    let local_ready = match input.clusters.iter().any(|c| c == input.local_cluster) {
        false => Some(0),
        true => {
            let ports: Vec<String> = input.ports.iter().map(|p| p.name.clone()).collect();
            input
                .local_slices
                .map(|l| ready_endpoints_serving(l, &ports))
        }
    };
    let remotes: Vec<(String, bool)> = input
        .clusters
        .iter()
        .filter(|c| *c != input.local_cluster)
        .map(|c| {
            let usable = input.gateways.get(c).is_some_and(|g| {
                g.as_ref().is_some_and(|s| {
                    let gw = &s.gateway;
                    gw.alive && gw.addresses.iter().any(|a| gw.is_ready(a))
                })
            });
            (c.clone(), usable)
        })
        .collect();
    serving_remotes(input.traffic, local_ready, &remotes)
}

/// This cluster's slices of the import: a copy of each slice of its exported Service
/// (`core::traffic::copy_local_slices`), under the import's labels.
fn local_copies(
    input: &ImportSlicesInput<'_>,
    labels: &BTreeMap<String, String>,
    local: &[EndpointSlice],
) -> Vec<EndpointSlice> {
    let annotations = BTreeMap::from([(
        CONTROLLER_NAMESPACE_ANNOTATION.to_owned(),
        input.controller_namespace.to_owned(),
    )]);
    copy_local_slices(
        &input.key.namespace,
        &base_name(input.key, input.local_cluster),
        labels,
        &annotations,
        local,
    )
}

/// Whether `meta` is one of our import slices (any import's), for
/// `controller_namespace`.
pub fn is_owned_import_slice(meta: &ObjectMeta, controller_namespace: &str) -> bool {
    let label = |k: &str| meta.labels.as_ref().and_then(|l| l.get(k));
    let annotation = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONTROLLER_NAMESPACE_ANNOTATION));
    label(IMPORT_LABEL).map(String::as_str) == Some(IMPORT_VALUE)
        && label(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY_VALUE)
        && label(SERVICE_NAME_LABEL).is_some()
        && label(SOURCE_CLUSTER_LABEL).is_some()
        && annotation.map(String::as_str) == Some(controller_namespace)
}

/// The writes that bring the stored slices of the import `key` to `desired`, owned by
/// `owner` (the stored import). Of `stored`, only our slices of `key` count: any other
/// slice is never written. With no import (`desired` empty, nothing untouched), every
/// slice of ours of the name goes.
pub fn plan_import_slices(
    key: &ServiceKey,
    desired: &DesiredImportSlices,
    stored: &[EndpointSlice],
    owner: &OwnerReference,
    controller_namespace: &str,
) -> Vec<Action> {
    let ours: Vec<&EndpointSlice> = stored
        .iter()
        .filter(|s| {
            let m = &s.metadata;
            is_owned_import_slice(m, controller_namespace)
                && m.namespace.as_deref() == Some(&key.namespace)
                && m.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)) == Some(&key.name)
        })
        .collect();
    plan_slices(&desired.slices, &ours, owner, |s| {
        s.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SOURCE_CLUSTER_LABEL))
            .is_some_and(|c| desired.untouched.contains(c))
    })
}

#[cfg(test)]
#[path = "mcs_slices_tests.rs"]
mod tests;
