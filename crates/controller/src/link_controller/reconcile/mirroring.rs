//! `endpoints` mode with slices of ours left (a switch from a mode that writes them, so
//! transitional): they go only once kube-controller-manager's mirrored slices route the
//! same, as kube-proxy reads only slices and kcm makes them asynchronously. Our slice
//! watch does not see kcm's, so they are read here, after gather, by one LIST.

use super::*;

impl Reconciler {
    /// Adds to `g` what kube-controller-manager's mirrored slices of the key's mirror
    /// route and how many looks its slices have waited for them, when they matter:
    /// `endpoints` mode, nothing pending, slices of ours left.
    pub(super) async fn read_mirroring(&self, key: &ServiceKey, g: &mut Gathered) {
        let desired_name = g
            .desired
            .as_ref()
            .and_then(|d| d.service.metadata.name.clone());
        if self.view.mode == EndpointsMode::Endpoints
            && !g.pending
            && !g.slices.is_empty()
            && let Some(name) = &desired_name
        {
            g.mirrored = self.mirrored_routes(&key.namespace, name).await;
            g.mirroring_waits = self
                .memory
                .mirroring_waits
                .lock()
                .get(key)
                .copied()
                .unwrap_or_default();
        }
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
        let api: Api<EndpointSlice> = Api::namespaced(self.fx.local.clone(), namespace);
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
                let cluster = &self.view.link.cluster_name;
                tracing::debug!(%cluster, namespace, name, error = %err, "listing kube-controller-manager's mirrored slices failed");
                None
            }
        }
    }
}
