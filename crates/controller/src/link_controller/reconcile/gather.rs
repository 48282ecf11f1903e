//! The read-only step of a reconcile: what the decision needs from the caches, the
//! index, the gateways and the pending writes, as one `Gathered` value. It writes
//! nothing: what it finds to say comes back as [`Notes`], recorded by the reconcile.

use super::*;

/// What gather found to say; the reconcile records it (gather writes nothing).
#[derive(Debug, Default, PartialEq)]
pub(in crate::link_controller) struct Notes {
    /// The gateway's notes (Event reason, text), set once per gateway and episode by
    /// whichever caller resolved it first: every one is recorded on the link.
    pub(in crate::link_controller) gateway: Vec<(&'static str, String)>,
    /// A headless remote Service was planned as a ClusterIP mirror (said once per
    /// link when the remote refuses the slice watch).
    pub(in crate::link_controller) headless_as_cluster_ip: bool,
}

impl View {
    /// Reads what the decision needs: the remote Service and its export decision, the
    /// gateway (asked once), the local objects that stand for the key, pending writes.
    /// Neither the Endpoints-first memory nor kube-controller-manager's slices: the
    /// reconcile adds those (see `mirroring.rs`).
    pub(in crate::link_controller) async fn gather(&self, key: &ServiceKey) -> (Gathered, Notes) {
        let remote = self
            .remote
            .get(&ObjectRef::new(&key.name).within(&key.namespace));
        // A Link's gateway mirrors depend on the remote's readiness too.
        let readiness_listed = self.readiness.as_ref().is_none_or(|r| r.lock().listed());
        let mut g = Gathered {
            remote_listed: (remote.is_some() || self.synced.borrow().remote) && readiness_listed,
            mode: self.mode,
            ..Gathered::default()
        };
        let mut notes = Notes::default();
        // A list after an outage that would delete every mirror is not trusted yet
        // (remote_state.rs): a key whose remote Service it lacks waits.
        if !g.remote_listed || (remote.is_none() && self.health.holding_deletes()) {
            g.remote_listed = false;
            return (g, notes);
        }
        let export = remote
            .as_deref()
            .map_or(ExportDecision::NotExported, |svc| {
                export_decision(svc, &self.export)
            });
        if let ExportDecision::Refused { .. } = export {
            g.has_local_services = self.index.lock().has_local_services(key);
            g.export = Some(export);
            return (g, notes);
        }
        match (remote.as_deref(), &export) {
            (Some(svc), ExportDecision::Mirror(gw)) => {
                let link_gateway = self.link_gateway.borrow().clone();
                let source = match &self.export.rule {
                    ExportRule::GatewayAnnotations => self
                        .remote
                        .get(&ObjectRef::new(&gw.name).within(&gw.namespace))
                        .map(|gateway| GatewaySource::from_service(&gateway)),
                    ExportRule::Selectors { .. } => link_gateway.clone().map(Ok),
                };
                let resolution = match source {
                    // A Link without a gateway: nothing to resolve or probe.
                    None if link_gateway.is_none() && self.readiness.is_some() => {
                        Resolution::default()
                    }
                    source => self.gateways.resolve(key, gw, source).await,
                };
                g.requeue = resolution.retry_after;
                notes.gateway = resolution
                    .notes()
                    .map(|(reason, note)| (reason, note.to_owned()))
                    .collect();
                let mut gateway = resolution.gateway;
                // A remote Service without a ready endpoint: Endpoints without subsets,
                // as Linkerd makes them (failover tools read that as "remote empty").
                if let Some(r) = &self.readiness
                    && !r.lock().ready(key)
                    && let Some(gw) = gateway.as_mut()
                {
                    gw.addresses.clear();
                }
                // A remote that has not answered for long: not ready (unless the gateway
                // probe says alive), then empty.
                let state = self.health.state();
                if state >= RemoteState::Stale {
                    let probe = self.gateways.probe_state(gw).map(|s| s.alive);
                    gateway = stale_gateway(gateway, stale_effect(state, probe));
                }
                match self.headless_shape(key, svc) {
                    None => {
                        // The remote slices are not listed yet: a pod missing from a
                        // partial view would lose its endpoint mirror.
                        g.remote_listed = false;
                        return (g, notes);
                    }
                    Some(true) => {
                        let (parent, members, refused) =
                            self.headless_desired(key, svc, gw, gateway.as_ref());
                        g.desired = Some(parent);
                        g.members = Some(members);
                        g.refused_hostnames = refused;
                    }
                    Some(false) => {
                        notes.headless_as_cluster_ip = is_headless(svc);
                        g.desired = Some(desired_mirror(svc, &self.link, gw, gateway.as_ref()));
                    }
                }
            }
            (Some(svc), ExportDecision::RemoteDiscovery) => {
                g.desired = Some(remote_discovery_mirror(svc, &self.link));
            }
            _ => {}
        }
        g.export = Some(export);

        let (mut svc_names, mut ep_names, mut slice_names): (
            BTreeSet<String>,
            BTreeSet<String>,
            BTreeSet<String>,
        ) = {
            let index = self.index.lock();
            let (s, e) = index.local_names(key);
            let l = index.slice_names(key);
            (
                s.into_iter().collect(),
                e.into_iter().collect(),
                l.into_iter().collect(),
            )
        };
        let desired_name = g
            .desired
            .as_ref()
            .and_then(|d| d.service.metadata.name.clone());
        if let Some(name) = &desired_name {
            svc_names.insert(name.clone());
            ep_names.insert(name.clone());
        }
        for m in g.members.iter().flatten() {
            if let Some(name) = &m.service.metadata.name {
                svc_names.insert(name.clone());
                ep_names.insert(name.clone());
            }
        }
        // Only objects that stand for this key: the index is a hint built from events, the
        // caches are the truth. A Go-made Endpoints without annotation belongs to the key of
        // its Service, so it is updated in place rather than deleted by another key.
        let belongs = |name: &String, k: ServiceKey| {
            &k == key || (Some(name) == desired_name.as_ref() && k.name == *name)
        };
        // The desired slices' names too: a create of ours the cache has not shown yet is
        // pending under its name (the owner uid does not matter for names). In
        // `endpoints` mode our slices are written only while some are left.
        let writes_slices = self.mode.writes_slices() || !slice_names.is_empty();
        let desired_all = g.desired.iter().chain(g.members.iter().flatten());
        for d in desired_all.filter(|_| writes_slices) {
            slice_names.extend(
                desired_slices(d, "")
                    .into_iter()
                    .filter_map(|s| s.metadata.name),
            );
        }
        // A write of ours to one of these objects has not reached the caches yet: planning
        // now would repeat it. The watch event that brings it queues the key again. Asked
        // BEFORE the caches are read: a watch applies an event to its cache, then marks
        // the expectation met, so "not pending" now means the caches read next hold our
        // write. Asked after, a write seen between the two reads looked met and absent,
        // and was sent again (a create answered 409 after convergence, chaos run 12).
        let pending = |kind, names: &BTreeSet<String>| {
            names
                .iter()
                .any(|n| self.expectations.pending(kind, &key.namespace, n))
        };
        g.pending = pending(LocalObject::Service, &svc_names)
            || pending(LocalObject::Endpoints, &ep_names)
            || pending(LocalObject::EndpointSlice, &slice_names);
        g.services = svc_names
            .iter()
            .filter_map(|n| {
                self.local_services
                    .get(&ObjectRef::new(n).within(&key.namespace))
            })
            .filter(|s| belongs(&s.name_any(), service_key(s)))
            .collect();
        g.endpoints = ep_names
            .iter()
            .filter_map(|n| {
                self.local_endpoints
                    .get(&ObjectRef::new(n).within(&key.namespace))
            })
            .filter(|e| belongs(&e.name_any(), endpoints_key(&self.local_services, e)))
            .collect();
        g.slices = slice_names
            .iter()
            .filter_map(|n| {
                self.local_slices
                    .get(&ObjectRef::new(n).within(&key.namespace))
            })
            .filter(|s| slice_key(&self.local_services, s) == *key)
            .collect();
        (g, notes)
    }
}

#[cfg(test)]
#[path = "gather_tests.rs"]
mod tests;
