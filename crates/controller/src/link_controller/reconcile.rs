//! Reconciling one key: desired mirror (pure core) vs. actual local objects (caches).

use super::expect::LocalObject;
use super::limit::Admission;
use super::probe::ProbeTarget;
use super::{Inner, Outcome, endpoints_key, service_key};
use crate::error::Result;
use crate::writer::Applied;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use service_mirror_core::{
    Action, ExportDecision, GatewayRef, ProbeSpec, ResolvedGateway, ServiceKey, desired_mirror,
    endpoint_ip_allowed, export_decision, gateway_spec, plan, probe_spec,
};
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
    let decision = remote
        .as_deref()
        .map_or(ExportDecision::NotExported, |svc| {
            export_decision(svc, &inner.export)
        });
    if let ExportDecision::Refused { reason, .. } = decision {
        // Refuse it visibly and touch nothing: an existing mirror stays as it was.
        tracing::warn!(cluster = %inner.link.cluster_name, %key, reason = reason.reason(), "exported service cannot be mirrored (it has no ports)");
        inner
            .opts
            .metrics
            .reconcile_errors
            .get_or_create(&crate::metrics::ErrorLabels {
                cluster: inner.link.cluster_name.clone(),
                kind: reason.reason().into(),
            })
            .inc();
        if inner.index().local_names(key).0.is_empty() {
            release_slot(inner, key);
        }
        return Ok(Outcome::Done);
    }
    let exported = match (remote.as_deref(), decision) {
        (Some(svc), ExportDecision::Mirror(gw)) => Some((svc, gw)),
        _ => None,
    };
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

    // A write of ours to one of these objects has not reached the caches yet: planning
    // now would repeat it. The watch event that brings it queues the key again.
    let pending = |kind, names: &BTreeSet<String>| {
        names
            .iter()
            .any(|n| inner.expectations.pending(kind, &key.namespace, n))
    };
    if pending(LocalObject::Service, &svc_names) || pending(LocalObject::Endpoints, &ep_names) {
        tracing::trace!(cluster = %inner.link.cluster_name, %key, "cache behind our own write");
        return Ok(requeue.map_or(Outcome::Done, Outcome::RequeueAfter));
    }
    let mut actions = plan(
        key,
        desired.as_ref(),
        &services,
        &endpoints,
        &inner.link.cluster_name,
    );
    let creates = actions
        .iter()
        .any(|a| matches!(a, Action::CreateService(_)));
    if creates && let Admission::Refused { first } = inner.limit.admit(key) {
        refuse_over_limit(inner, key, first).await;
        return Ok(Outcome::Done);
    } else if !creates && services.is_empty() {
        // No mirror and none to create: a slot (or refusal) this key had goes.
        release_slot(inner, key);
    }
    // A plan that creates holds a create permit to its end: a Service create and then
    // its Endpoints, as the apiserver takes them fastest (writer::CREATES_IN_FLIGHT).
    // The semaphore is never closed, so acquiring cannot fail.
    let _permit = match actions.iter().any(Action::is_create) {
        true => inner.opts.create_limit.acquire().await.ok(),
        false => None,
    };
    // Endpoints first. A gateway move changes every mirror of the gateway twice: its
    // Endpoints (where traffic goes) and its Service (the gateway resourceVersion
    // annotation). When a plan is exactly those two updates and the Service's differs
    // in annotations only, the Endpoints are written now and the key goes to the back
    // of the queue; the Service follows on the second pass, after the Endpoints of
    // every key queued meanwhile. Traffic of N mirrors then moves in the time of N
    // writes, not 2N. A Service whose labels or spec change (another gateway, new
    // ports) keeps the plan's order: it is never behind its Endpoints on those.
    let replaced = inner.endpoints_first().remove(key);
    if let Some(rv) = replaced {
        // Second pass: a cached Endpoints still at the version our write replaced means
        // the cache is behind that write, not that it is to be done again.
        actions.retain(|a| {
            !matches!(a, Action::UpdateEndpoints(e) if e.metadata.resource_version.as_deref() == Some(rv.as_str()))
        });
    } else if let [
        svc @ Action::UpdateService(updated),
        ep @ Action::UpdateEndpoints(e),
    ] = actions.as_slice()
        && services.iter().any(|actual| {
            actual.metadata.name == updated.metadata.name
                && actual.metadata.labels == updated.metadata.labels
                && actual.spec == updated.spec
        })
    {
        tracing::debug!(cluster = %inner.link.cluster_name, %key, action = ?ep, "writing Endpoints first");
        let rv = e.metadata.resource_version.clone().unwrap_or_default();
        return match execute(inner, ep).await {
            Ok(Applied::Done) => {
                inner.endpoints_first().insert(key.clone(), rv);
                Ok(Outcome::RequeueAfter(std::time::Duration::ZERO))
            }
            // The event bringing the newer Endpoints queues the key again.
            Ok(Applied::Stale) => Ok(requeue.map_or(Outcome::Done, Outcome::RequeueAfter)),
            // The Endpoints cannot be written now: the Service still is, as when the
            // plan runs in its own order; the key is retried for the Endpoints.
            Err(err) => {
                execute(inner, svc).await?;
                Err(err)
            }
        };
    }
    for action in &actions {
        tracing::debug!(cluster = %inner.link.cluster_name, %key, ?action, "writing");
        if execute(inner, action).await? == Applied::Stale {
            // Keep the plan's order (Service before Endpoints): the watch event that
            // brings the newer version queues this key again.
            break;
        }
    }
    Ok(requeue.map_or(Outcome::Done, Outcome::RequeueAfter))
}

/// Frees the mirror-limit slot of `key` (which has no mirror and creates none) and
/// queues the refused keys that may take it.
fn release_slot(inner: &Inner, key: &ServiceKey) {
    for woken in inner.limit.release(key) {
        inner.queue.add(woken);
    }
}

/// Reports a mirror refused because the link holds its limit: every refusal is logged
/// at debug and counted, the first after none also at warn and as an Event on the link
/// Secret. The key is looked at again when a slot frees.
async fn refuse_over_limit(inner: &Inner, key: &ServiceKey, first: bool) {
    let cluster = &inner.link.cluster_name;
    let max = inner.limit.max().unwrap_or_default();
    inner
        .opts
        .metrics
        .reconcile_errors
        .get_or_create(&crate::metrics::ErrorLabels {
            cluster: cluster.clone(),
            kind: "mirror_limit".into(),
        })
        .inc();
    tracing::debug!(%cluster, %key, max, "mirror limit reached; not mirrored until a mirror goes");
    if !first {
        return;
    }
    let note = format!(
        "cluster {cluster} exports more services than the limit of {max} mirrors per link (--max-mirrors-per-link): {key} and any further ones are not mirrored until mirrors go; existing mirrors are kept"
    );
    tracing::warn!(%cluster, %key, max, "{note}");
    if let Some(secret) = &inner.opts.link_secret {
        inner
            .writer
            .record(secret, "MirrorLimitReached", "Mirror", note)
            .await;
    }
}

/// Executes one action and remembers the write until the caches show it.
async fn execute(inner: &Inner, action: &Action) -> Result<Applied> {
    let applied = inner.writer.execute(action).await?;
    if applied != Applied::Done {
        return Ok(applied);
    }
    // What the write replaced: the version updated or deleted (a precondition of the
    // write), nothing for a create.
    let (kind, ns, name, replaced) = match action {
        Action::CreateService(s) => (LocalObject::Service, s.namespace(), s.name_any(), None),
        Action::UpdateService(s) => (
            LocalObject::Service,
            s.namespace(),
            s.name_any(),
            s.metadata.resource_version.clone(),
        ),
        Action::CreateEndpoints(e) => (LocalObject::Endpoints, e.namespace(), e.name_any(), None),
        Action::UpdateEndpoints(e) => (
            LocalObject::Endpoints,
            e.namespace(),
            e.name_any(),
            e.metadata.resource_version.clone(),
        ),
        Action::DeleteService {
            namespace,
            name,
            resource_version,
            ..
        } => (
            LocalObject::Service,
            Some(namespace.clone()),
            name.clone(),
            // No version precondition: whatever the cache shows next counts.
            Some(resource_version.clone().unwrap_or_default()),
        ),
        Action::DeleteEndpoints {
            namespace,
            name,
            resource_version,
            ..
        } => (
            LocalObject::Endpoints,
            Some(namespace.clone()),
            name.clone(),
            Some(resource_version.clone().unwrap_or_default()),
        ),
    };
    let ns = ns.unwrap_or_default();
    inner.expectations.written(kind, &ns, &name, replaced);
    // Recorded first, then checked against the cache: the event may have come already
    // (and then went by without finding it), or comes after, and finds it.
    let cached = match kind {
        LocalObject::Service => inner
            .local_services
            .get(&ObjectRef::new(&name).within(&ns))
            .and_then(|o| o.metadata.resource_version.clone()),
        LocalObject::Endpoints => inner
            .local_endpoints
            .get(&ObjectRef::new(&name).within(&ns))
            .and_then(|o| o.metadata.resource_version.clone()),
    };
    inner
        .expectations
        .observed(kind, &ns, &name, cached.as_deref());
    Ok(applied)
}
