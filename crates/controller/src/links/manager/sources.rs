//! The watched sources (link Secrets and Links here; ClusterProfiles in
//! `profiles.rs`), their first lists, and the collection of mirrors no source names.

use super::*;

impl Inner {
    /// The clusters the valid Links and ClusterProfiles name (links of the Link kind:
    /// a federated selector, Linkerd-shaped mirrors).
    pub(super) fn clusters_of_links(&self) -> std::collections::BTreeSet<String> {
        let mut clusters: std::collections::BTreeSet<String> = self
            .links
            .state()
            .iter()
            .filter_map(|l| self.parse(l).ok())
            .map(|spec| spec.link().cluster_name.clone())
            .collect();
        clusters.extend(
            self.profiles
                .state()
                .iter()
                .filter_map(|p| self.parse_profile(p).ok())
                .map(|spec| spec.link().cluster_name.clone()),
        );
        clusters
    }

    /// A source listed (`first`: for the first time): every source is looked at again,
    /// and once both are listed the first time, unlinked mirrors are collected.
    pub(super) fn listed_once(self: &Arc<Self>, first: bool) {
        if !self.listed() {
            return;
        }
        // Only from a Links list: refused (403), the Links are unknown, and planning
        // without their clusters pending would delete their federated Services; the
        // federation writes nothing until the Links can be listed.
        if self.known()
            && !self.federation_expected.swap(true, Ordering::SeqCst)
            && let Some(federation) = &self.opts.deps.federation
        {
            // Clusters a valid Link names: their federated entries wait for their lists.
            federation.expect(self.clusters_of_links().into_iter().collect());
        }
        // The same for the MCS imports, with every source kind: a cluster none names is
        // gone. Not while the Links are unknown (their clusters would look gone).
        if self.known()
            && !self.mcs_expected.swap(true, Ordering::SeqCst)
            && let Some(mcs) = &self.opts.deps.mcs
        {
            let mut clusters = self.clusters_of_links();
            if self.opts.sources.secrets() {
                clusters.extend(
                    self.secrets
                        .state()
                        .iter()
                        .filter_map(|s| parse_link_secret(s).ok())
                        .map(|spec| spec.link().cluster_name.clone()),
                );
            }
            mcs.expect(clusters);
        }
        if first && self.opts.collect_unlinked {
            match self.known() {
                true => {
                    tokio::spawn(collect_unlinked(self.clone()));
                }
                false => tracing::warn!(
                    "not collecting mirrors of unlinked clusters: the Links or ClusterProfiles could not be listed (a cluster one names would look unlinked)"
                ),
            }
        }
        self.queue_all();
    }
}

pub(super) async fn watch_secrets(
    inner: Arc<Inner>,
    store: reflector::store::Writer<Secret>,
    cancel: CancellationToken,
) {
    let watch = Watch {
        api: Api::namespaced(inner.local.clone(), &inner.opts.namespace),
        config: watcher::Config::default().fields(&format!("type={LINK_SECRET_TYPE}")),
        strip: keep_all,
        store,
    };
    let on_event = |ev: &watcher::Event<Secret>| match ev {
        watcher::Event::Apply(s) | watcher::Event::Delete(s) => {
            inner.queue.add(SourceKey::Secret(s.name_any()))
        }
        watcher::Event::InitDone => {
            let first = !inner.synced.swap(true, Ordering::SeqCst);
            inner.listed_once(first);
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
    };
    let on_error = |e: &watcher::Error| tracing::warn!(error = %e, namespace = %inner.opts.namespace, "watching link Secrets failed; retrying");
    drive(watch, cancel, on_event, on_error).await
}

/// Keeps a Link's spec and conditions, drops its service lists: `mirrorServices` and
/// `federatedServices` (up to 512 KiB of ours alone at 10,000 Services) are never read
/// from the store (the status writer reads the Link afresh before it patches), and
/// every status write comes back through this watch.
pub(super) fn strip_service_lists(link: &mut LinkResource) {
    if let Some(status) = link.status.as_mut() {
        status.mirror_services = Vec::new();
        status.federated_services = Vec::new();
    }
    link.metadata.managed_fields = None;
}

/// Watches the `Link`s of the namespace. Without the CRD (a cluster that only uses link
/// Secrets) the list fails with 404: the Links count as listed, and the watch keeps
/// retrying, so a CRD installed later is picked up.
pub(super) async fn watch_links(
    inner: Arc<Inner>,
    store: reflector::store::Writer<LinkResource>,
    cancel: CancellationToken,
) {
    let source = SourceWatch {
        strip: strip_service_lists,
        key: SourceKey::Link,
        known: |i| &i.links_known,
        synced: |i| &i.links_synced,
        not_installed: "the Link CRD (links.multicluster.linkerd.io) is not installed: linking by Secrets only until it is".into(),
        forbidden: "not allowed to list Links: linking by Secrets only; grant links get/list/watch (service-mirror install)".into(),
        failed: "watching Links failed; retrying",
    };
    watch_source(inner, store, cancel, source).await
}

/// What differs between the namespaced source watches (Links, ClusterProfiles).
pub(super) struct SourceWatch<K> {
    /// What is kept of an object in the store.
    pub(super) strip: fn(&mut K),
    /// The source key of an object's name.
    pub(super) key: fn(String) -> SourceKey,
    /// Set when the kind is known to be listed (or not installed): the collector may run.
    pub(super) known: fn(&Inner) -> &AtomicBool,
    /// Set at the first list (or its 403/404).
    pub(super) synced: fn(&Inner) -> &AtomicBool,
    /// Said once on a 404 (the CRD is not installed).
    pub(super) not_installed: String,
    /// Said once on a 403.
    pub(super) forbidden: String,
    /// Said on any other failure.
    pub(super) failed: &'static str,
}

/// Watches one kind of source object in the controller's namespace, queuing each
/// object's key. Not installed (404): the kind counts as listed and known; forbidden
/// (403): listed but unknown (nothing is collected meanwhile); either is said once and
/// the watch keeps retrying, so a CRD installed or a permission granted later is
/// picked up.
pub(super) async fn watch_source<K>(
    inner: Arc<Inner>,
    store: reflector::store::Writer<K>,
    cancel: CancellationToken,
    source: SourceWatch<K>,
) where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let watch = Watch {
        api: Api::namespaced(inner.local.clone(), &inner.opts.namespace),
        config: watcher::Config::default(),
        strip: source.strip,
        store,
    };
    let (known, synced) = ((source.known)(&inner), (source.synced)(&inner));
    let on_event = |ev: &watcher::Event<K>| match ev {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
            inner.queue.add((source.key)(o.name_any()))
        }
        watcher::Event::InitDone => {
            known.store(true, Ordering::SeqCst);
            let first = !synced.swap(true, Ordering::SeqCst);
            inner.listed_once(first);
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
    };
    let mut said = false;
    let on_error = |e: &watcher::Error| {
        let code = match e {
            watcher::Error::InitialListFailed(kube::Error::Api(s)) => Some(s.code),
            _ => None,
        };
        if let Some(code @ (403 | 404)) = code {
            // Not installed: no such object can exist. Forbidden: unknown (the
            // collector waits).
            if code == 404 {
                known.store(true, Ordering::SeqCst);
            }
            if !synced.swap(true, Ordering::SeqCst) {
                inner.listed_once(true);
            }
            if !std::mem::replace(&mut said, true) {
                match code {
                    404 => {
                        tracing::info!(namespace = %inner.opts.namespace, "{}", source.not_installed)
                    }
                    _ => {
                        tracing::warn!(namespace = %inner.opts.namespace, error = %e, "{}", source.forbidden)
                    }
                }
            }
        } else {
            tracing::warn!(error = %e, namespace = %inner.opts.namespace, "{}", source.failed);
        }
    };
    drive(watch, cancel, on_event, on_error).await
}

/// Deletes the mirrors of clusters that no link source names (see [`Collector`]); only
/// on the leader.
async fn collect_unlinked(inner: Arc<Inner>) {
    let collector = Collector {
        local: inner.local.clone(),
        secrets: inner.secrets.clone(),
        links: inner.links.clone(),
        profiles: inner.profiles.clone(),
        namespace: inner.opts.namespace.clone(),
        namespaces: inner.opts.config.namespaces.clone(),
        leader: inner.opts.deps.leader.clone(),
        cancel: inner.cancel.clone(),
    };
    let Some(unlinked) = collector.unlinked().await else {
        return;
    };
    for cluster in unlinked.clusters {
        // Linked since the collector looked: its link owns these mirrors now.
        let running = inner
            .active()
            .values()
            .any(|a| a.spec.link().cluster_name == cluster);
        if running {
            continue;
        }
        // Another writer (Linkerd's controller) holding the cluster's write Lease may
        // serve these mirrors: left alone (the cleanup's write gate would also wait).
        if inner.opts.deps.write_gates.is_some() {
            match crate::write_leases::held_elsewhere(&inner.local, &inner.opts.namespace, &cluster)
                .await
            {
                Ok(None) => {}
                Ok(Some(holder)) => {
                    tracing::info!(%cluster, holder = %service_mirror_core::write_lease::shown_holder(&holder), "not collecting the mirrors of an unlinked cluster: its write Lease is held by another writer");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(%cluster, error = %e, "not collecting the mirrors of an unlinked cluster: cannot read its write Lease");
                    continue;
                }
            }
        }
        tracing::info!(%cluster, "deleting the mirrors of a cluster no link Secret names");
        inner.spawn_cleanup(&cluster, Some(unlinked.select.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_link_keeps_its_spec_and_conditions_but_not_its_service_lists() {
        let mut link: LinkResource = serde_json::from_value(serde_json::json!({
            "apiVersion": "multicluster.linkerd.io/v1alpha3",
            "kind": "Link",
            "metadata": {"name": "east", "managedFields": [{"manager": "x"}]},
            "spec": {"targetClusterName": "east", "gatewayPort": "4143"},
            "status": {
                "mirrorServices": [{"controllerName": "x", "remoteRef": {"kind": "Service", "name": "web", "namespace": "shop"}}],
                "federatedServices": [{"controllerName": "x", "remoteRef": {"kind": "Service", "name": "api", "namespace": "shop"}}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "Linked", "message": "", "lastTransitionTime": "2026-12-05T00:00:00Z"}],
            },
        }))
        .unwrap();
        let spec = serde_json::to_value(&link.spec).unwrap();
        strip_service_lists(&mut link);
        assert_eq!(serde_json::to_value(&link.spec).unwrap(), spec);
        let status = link.status.unwrap();
        assert!(status.mirror_services.is_empty() && status.federated_services.is_empty());
        assert_eq!(
            status.conditions.len(),
            1,
            "the Ready condition is read from the store"
        );
        assert!(link.metadata.managed_fields.is_none());
    }
}
