//! The read-only step of a reconcile: what the decision needs from the caches, the
//! index, the gateways and the pending writes, as one `Gathered` value.

use super::*;

impl Reconciler {
    /// The mirror limit for a headless key that has mirrors: its existing objects keep
    /// being written however many pods it grows to; new endpoint mirrors beyond the
    /// limit are left out of `g` (name order, the same each pass) and refused as over
    /// the limit. True when the key's slots were taken here.
    pub(super) async fn admit_members(&self, key: &ServiceKey, g: &mut Gathered) -> bool {
        let Some(members) = g.members.as_mut().filter(|_| !g.pending) else {
            return false;
        };
        match self.limit.admit_members(key, 1 + members.len()) {
            None => false,
            Some(Members::All) => true,
            Some(Members::Part { allowed, first }) => {
                let existing: BTreeSet<&str> = g
                    .services
                    .iter()
                    .filter_map(|s| s.metadata.name.as_deref())
                    .collect();
                let wanted = members.len();
                *members =
                    admitted_members(std::mem::take(members), |n| existing.contains(n), allowed);
                let cluster = &self.link.cluster_name;
                tracing::debug!(%cluster, %key, wanted, admitted = members.len(), "mirror limit reached: new endpoint mirrors refused");
                self.refuse_over_limit(key, first, true).await;
                true
            }
        }
    }

    /// Reads what the decision needs: the remote Service and its export decision, the
    /// gateway (asked once), the local objects that stand for the key, pending writes.
    pub(super) async fn gather(&self, key: &ServiceKey) -> Gathered {
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
        // A list after an outage that would delete every mirror is not trusted yet
        // (remote_state.rs): a key whose remote Service it lacks waits.
        if !g.remote_listed || (remote.is_none() && self.health.holding_deletes()) {
            g.remote_listed = false;
            return g;
        }
        let export = remote
            .as_deref()
            .map_or(ExportDecision::NotExported, |svc| {
                export_decision(svc, &self.export)
            });
        if let ExportDecision::Refused { .. } = export {
            g.has_local_services = !self.index.lock().local_names(key).0.is_empty();
            g.export = Some(export);
            return g;
        }
        match (remote.as_deref(), &export) {
            (Some(svc), ExportDecision::Mirror(gw)) => {
                let source = match &self.export.rule {
                    ExportRule::GatewayAnnotations => self
                        .remote
                        .get(&ObjectRef::new(&gw.name).within(&gw.namespace))
                        .map(|gateway| GatewaySource::from_service(&gateway)),
                    ExportRule::Selectors { .. } => self.link_gateway.clone().map(Ok),
                };
                let resolution = match source {
                    // A Link without a gateway: nothing to resolve or probe.
                    None if self.link_gateway.is_none() && self.readiness.is_some() => {
                        Resolution::default()
                    }
                    source => self.gateways.resolve(key, gw, source).await,
                };
                g.requeue = resolution.retry_after;
                if let Some(link) = &self.link_secret {
                    for (reason, note) in resolution.notes() {
                        self.writer
                            .record(link, reason, "Mirror", note.to_owned())
                            .await;
                    }
                }
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
                        return g;
                    }
                    Some(true) => {
                        let (parent, members, refused) =
                            self.headless_desired(key, svc, gw, gateway.as_ref());
                        g.desired = Some(parent);
                        g.members = Some(members);
                        g.refused_hostnames = refused;
                    }
                    Some(false) => {
                        self.report_slices_unavailable(key, svc).await;
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
        g.endpoints_written_first = self.endpoints_first.lock().get(key).cloned();
        // `endpoints` mode with slices of ours left (a switch from a mode that writes
        // them, so transitional): they go only once kube-controller-manager's mirrored
        // slices route the same, as kube-proxy reads only slices and kcm makes them
        // asynchronously. Our slice watch does not see kcm's, so they are read here.
        if self.mode == EndpointsMode::Endpoints
            && !g.pending
            && !g.slices.is_empty()
            && let Some(name) = &desired_name
        {
            g.mirrored = self.mirrored_routes(&key.namespace, name).await;
            g.mirroring_waits = self
                .mirroring_waits
                .lock()
                .get(key)
                .copied()
                .unwrap_or_default();
        }
        g
    }

    /// What kube-controller-manager's mirrored slices of the mirror `namespace/name`
    /// route, by one label-selected LIST served from the apiserver's watch cache
    /// (resourceVersion 0: at most as fresh as a watch would be); `None` when it fails
    /// (the slices of ours then stay, and the key comes back). Read only: kcm's slices
    /// are never written.
    pub(super) async fn mirrored_routes(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<BTreeSet<Route>> {
        let api: Api<EndpointSlice> = Api::namespaced(self.local.clone(), namespace);
        let lp = ListParams::default()
            .labels(&mirrored_slice_selector(name))
            .match_any();
        match api.list(&lp).await {
            Ok(list) => Some(slice_routes(
                list.items
                    .iter()
                    .filter(|s| is_mirrored_slice(&s.metadata, name)),
            )),
            Err(err) => {
                let cluster = &self.link.cluster_name;
                tracing::debug!(%cluster, namespace, name, error = %err, "listing kube-controller-manager's mirrored slices failed");
                None
            }
        }
    }
}
