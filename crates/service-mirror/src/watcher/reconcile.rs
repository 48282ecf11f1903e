//! Reconciling one key: desired mirror (pure core) vs. actual local objects (caches).

use super::probe::ProbeTarget;
use super::{Inner, Outcome, endpoints_key, service_key};
use crate::core::{
    GatewayRef, ProbeSpec, ResolvedGateway, ServiceKey, desired_mirror, endpoint_ip_allowed,
    exported_gateway, gateway_spec, plan, probe_spec,
};
use crate::error::Result;
use crate::writer::Applied;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

/// The gateway Service from the remote cache.
pub(super) fn gateway_service(inner: &Inner, gw: &GatewayRef) -> Option<Arc<Service>> {
    inner
        .remote
        .get(&ObjectRef::new(&gw.name).within(&gw.namespace))
}

/// The gateway's addresses, port and probe verdict, or None (with a warning) when it is
/// unusable.
async fn resolve_gateway(
    inner: &Arc<Inner>,
    key: &ServiceKey,
    gw: &GatewayRef,
) -> Option<ResolvedGateway> {
    let Some((resolved, probe)) = resolve_addresses(inner, key, gw).await else {
        inner.probers.alive(inner, gw, None, &[]);
        return None;
    };
    let target = probe
        .port
        .zip(resolved.addresses.first())
        .map(|(port, ip)| ProbeTarget {
            addr: SocketAddr::new(*ip, port),
            path: probe.path.clone(),
            period: probe.period,
        });
    let alive = inner.probers.alive(inner, gw, target, &probe.warnings);
    Some(resolved.with_alive(alive))
}

async fn resolve_addresses(
    inner: &Inner,
    key: &ServiceKey,
    gw: &GatewayRef,
) -> Option<(ResolvedGateway, ProbeSpec)> {
    let cluster = &inner.link.cluster_name;
    let Some(svc) = gateway_service(inner, gw) else {
        tracing::warn!(%cluster, %key, gateway = %gw, "gateway not found; mirror kept without endpoints");
        return None;
    };
    let spec = match gateway_spec(&svc) {
        Ok(spec) => spec,
        Err(e) => {
            tracing::warn!(%cluster, %key, gateway = %gw, error = %e, "gateway unusable; mirror kept without endpoints");
            return None;
        }
    };
    if !spec.invalid_ingress.is_empty() {
        tracing::warn!(%cluster, gateway = %gw, invalid = ?spec.invalid_ingress, "ignoring invalid gateway ingress entries");
    }
    let mut resolved = Vec::new();
    for host in &spec.hostnames {
        match inner.resolver.resolve(host).await {
            Ok(ips) => {
                let (ok, refused): (Vec<_>, Vec<_>) =
                    ips.into_iter().partition(endpoint_ip_allowed);
                if !refused.is_empty() {
                    tracing::warn!(%cluster, gateway = %gw, host, ?refused, "ignoring resolved addresses that cannot be Endpoints addresses");
                }
                resolved.extend(ok)
            }
            Err(e) => {
                tracing::warn!(%cluster, gateway = %gw, error = %e, "gateway hostname unresolved; retried every endpoint refresh period")
            }
        }
    }
    let probe = probe_spec(&svc);
    let resolved = spec.into_resolved(resolved);
    (!resolved.addresses.is_empty()).then_some((resolved, probe))
}

/// Brings the local mirror of `key` to its desired state.
pub(super) async fn reconcile(inner: &Arc<Inner>, key: &ServiceKey) -> Result<Outcome> {
    let remote = inner
        .remote
        .get(&ObjectRef::new(&key.name).within(&key.namespace));
    // Absence in a cache that has not listed yet proves nothing: wait for the list.
    if remote.is_none()
        && !inner
            .remote_synced
            .load(std::sync::atomic::Ordering::SeqCst)
    {
        return Ok(Outcome::Done);
    }
    let mut requeue = None;
    let exported = remote
        .as_deref()
        .filter(|_| inner.opts.namespaces.allows(&key.namespace))
        .and_then(|svc| exported_gateway(svc).map(|gw| (svc, gw)));
    if let Some((svc, _)) = &exported
        && svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .is_none_or(|p| p.is_empty())
    {
        // A Service without ports cannot be mirrored (a ClusterIP Service needs one).
        // Refuse it visibly and touch nothing: an existing mirror stays as it was.
        tracing::warn!(cluster = %inner.link.cluster_name, %key, "exported service has no ports; not mirrored");
        inner
            .opts
            .metrics
            .reconcile_errors
            .get_or_create(&crate::metrics::ErrorLabels {
                cluster: inner.link.cluster_name.clone(),
                kind: "unmirrorable".into(),
            })
            .inc();
        return Ok(Outcome::Done);
    }
    let desired = match exported {
        Some((svc, gw)) => {
            let resolved = resolve_gateway(inner, key, &gw).await;
            let hostnames = gateway_service(inner, &gw)
                .and_then(|g| gateway_spec(&g).ok())
                .map(|spec| spec.hostnames)
                .unwrap_or_default();
            if hostnames.iter().any(|h| inner.resolver.failing(h)) {
                requeue = Some(super::resolve::RETRY_FAILED_AFTER);
            }
            Some(desired_mirror(svc, &inner.link, &gw, resolved.as_ref()))
        }
        None => None,
    };

    let (mut svc_names, mut ep_names): (BTreeSet<String>, BTreeSet<String>) = {
        let (s, e) = inner.index().local_names(key);
        (s.into_iter().collect(), e.into_iter().collect())
    };
    if let Some(d) = &desired {
        let name = d.service.metadata.name.clone().unwrap_or_default();
        svc_names.insert(name.clone());
        ep_names.insert(name);
    }
    // Only objects that stand for this key: the index is a hint built from events, the
    // caches are the truth. A Go-made Endpoints without annotation belongs to the key of
    // its Service, so it is updated in place rather than deleted by another key.
    let desired_name = desired
        .as_ref()
        .and_then(|d| d.service.metadata.name.clone());
    let belongs = |name: &String, k: ServiceKey| {
        &k == key || (Some(name) == desired_name.as_ref() && k.name == *name)
    };
    let services: Vec<_> = svc_names
        .iter()
        .filter_map(|n| {
            inner
                .local_services
                .get(&ObjectRef::new(n).within(&key.namespace))
        })
        .filter(|s| belongs(&s.name_any(), service_key(s)))
        .collect();
    let endpoints: Vec<_> = ep_names
        .iter()
        .filter_map(|n| {
            inner
                .local_endpoints
                .get(&ObjectRef::new(n).within(&key.namespace))
        })
        .filter(|e| belongs(&e.name_any(), endpoints_key(inner, e)))
        .collect();
    let services: Vec<&_> = services.iter().map(|s| s.as_ref()).collect();
    let endpoints: Vec<&_> = endpoints.iter().map(|e| e.as_ref()).collect();

    let actions = plan(
        key,
        desired.as_ref(),
        &services,
        &endpoints,
        &inner.link.cluster_name,
    );
    for action in &actions {
        tracing::debug!(cluster = %inner.link.cluster_name, %key, ?action, "writing");
        if inner.writer.execute(action).await? == Applied::Stale {
            // Keep the plan's order (Service before Endpoints): the watch event that
            // brings the newer version queues this key again.
            break;
        }
    }
    Ok(requeue.map_or(Outcome::Done, Outcome::RequeueAfter))
}
