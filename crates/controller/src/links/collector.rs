//! The unlinked-mirror collector: at start, finds the clusters whose mirrors this
//! controller made but that no link Secret names any more (their Secret was deleted while
//! no controller ran, so no unlink happened).
//!
//! It only reads; the link manager deletes what it finds through its cleanups, so a
//! cluster linked again meanwhile cancels the deletion.

use super::resource::Link as LinkResource;
use crate::writer::MirrorSelector;
use k8s_openapi::api::core::v1::{Endpoints, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, ObjectMeta};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use service_mirror_core::labels::{
    CLUSTER_NAME_LABEL, CONTROLLER_NAMESPACE_ANNOTATION, LINK_CLUSTER_NAME_ANNOTATION,
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, MIRRORED_SERVICE_LABEL, MIRRORED_SERVICE_VALUE,
};
use service_mirror_core::{NamespaceFilter, validate_cluster_name};
use std::collections::{BTreeSet, HashSet};
use std::fmt::Debug;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// What the collector reads: the link Secrets and the local mirrors.
pub(super) struct Collector {
    /// The local cluster.
    pub(super) local: Client,
    /// The link Secrets (listed: the collector runs after their first list).
    pub(super) secrets: Store<Secret>,
    /// The `Link`s (listed, or not read).
    pub(super) links: Store<LinkResource>,
    /// The `ClusterProfile`s (listed, or not read): each names the cluster of its name.
    pub(super) profiles: Store<service_mirror_api::clusterprofile::ClusterProfile>,
    /// The controller's namespace, recorded on every mirror it made.
    pub(super) namespace: String,
    /// The local namespaces this controller mirrors into.
    pub(super) namespaces: NamespaceFilter,
    /// When set, the collector waits until this replica leads.
    pub(super) leader: Option<crate::leader::Leadership>,
    /// Ends the wait for leadership.
    pub(super) cancel: CancellationToken,
}

/// Clusters to clean up, and the selector of the mirrors a cleanup may delete.
pub(super) struct Unlinked {
    /// Cluster names with mirrors but no link Secret, sorted.
    pub(super) clusters: Vec<String>,
    /// Selects the mirrors this controller made in namespaces it mirrors into.
    pub(super) select: MirrorSelector,
}

impl Collector {
    /// The clusters to clean up, or `None` when nothing may be collected: no longer
    /// running, not the leader, a Secret's cluster name unreadable (its mirrors cannot be
    /// told apart), or the mirrors could not be listed.
    pub(super) async fn unlinked(self) -> Option<Unlinked> {
        if let Some(mut leader) = self.leader.clone() {
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                r = leader.wait_leading() => if r.is_err() { return None },
            }
        }
        let (ns, filter) = (self.namespace.clone(), self.namespaces.clone());
        let select: MirrorSelector = Arc::new(move |m: &ObjectMeta| {
            let made_here = m
                .annotations
                .as_ref()
                .and_then(|a| a.get(CONTROLLER_NAMESPACE_ANNOTATION))
                == Some(&ns);
            made_here && filter.allows(m.namespace.as_deref().unwrap_or_default())
        });
        let mut clusters = BTreeSet::new();
        for (slices, listed) in [
            (false, self.mirror_clusters::<Service>(&select).await),
            (false, self.mirror_clusters::<Endpoints>(&select).await),
            (true, self.mirror_clusters::<EndpointSlice>(&select).await),
        ] {
            match listed {
                Ok(names) => clusters.extend(names),
                // A ClusterRole from before slices: collect by Services and Endpoints
                // (our slices go with their Service through the ownerReference).
                Err(kube::Error::Api(e)) if slices && e.code == 403 => {
                    tracing::warn!(error = %e, "not allowed to list EndpointSlices; collecting by Services and Endpoints only");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list mirrors to collect those of unlinked clusters");
                    return None;
                }
            }
        }
        // Which clusters are linked is read after the mirrors are listed, not before: a
        // link Secret created meanwhile starts a link whose first mirrors may be in the
        // lists, and its cluster must count as linked (its Secret reached the store before
        // its link started).
        let mut linked = HashSet::new();
        for l in self.links.state() {
            linked.insert(l.spec.target_cluster_name.clone().unwrap_or_default());
        }
        for p in self.profiles.state() {
            linked.insert(p.name_any());
        }
        for s in self.secrets.state() {
            // A Secret without the annotation (a Link's credentials) names no cluster.
            let Some(name) = s.annotations().get(LINK_CLUSTER_NAME_ANNOTATION).cloned() else {
                continue;
            };
            if validate_cluster_name(&name).is_err() {
                tracing::warn!(secret = %s.name_any(), "not collecting mirrors of unlinked clusters: a link Secret has no valid cluster name");
                return None;
            }
            linked.insert(name);
        }
        // Only mirrors this controller made (annotated with its namespace), in namespaces it
        // mirrors into: another controller's mirrors are never collected.
        let clusters = clusters
            .into_iter()
            .filter(|c| !linked.contains(c))
            .collect();
        Some(Unlinked { clusters, select })
    }

    /// The cluster names on the local mirrors of kind `K` that `select` picks.
    async fn mirror_clusters<K>(&self, select: &MirrorSelector) -> kube::Result<Vec<String>>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        // For slices, ours only: kube-controller-manager's copy our labels.
        let selector = match K::kind(&()) == "EndpointSlice" {
            true => format!(
                "{MIRRORED_SERVICE_LABEL}={MIRRORED_SERVICE_VALUE},{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"
            ),
            false => format!("{MIRRORED_SERVICE_LABEL}={MIRRORED_SERVICE_VALUE}"),
        };
        let lp = ListParams::default().labels(&selector);
        let listed = Api::<K>::all(self.local.clone()).list_metadata(&lp).await?;
        Ok(listed
            .items
            .into_iter()
            .filter(|o| select(&o.metadata))
            .filter_map(|o| o.metadata.labels?.remove(CLUSTER_NAME_LABEL))
            .collect())
    }
}
