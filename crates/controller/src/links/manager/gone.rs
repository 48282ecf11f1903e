//! A source gone (deleted, or no longer a link source): its link handed over to another
//! source of the same cluster, or stopped, once the apiserver confirms what the cache
//! says.

use super::*;

impl Inner {
    /// The source `key` is gone: hand its link over to another source of the same
    /// cluster, or stop it. The hand-over moves the running link and the claim under one
    /// lock, so no other source can claim the cluster in between. `absent`: the caller
    /// found no object in the cache (else one that is no longer a source).
    pub(super) async fn gone(&self, key: &SourceKey, absent: bool) -> Outcome {
        let Some(cluster) = self
            .active()
            .get(key)
            .map(|a| a.spec.link().cluster_name.clone())
        else {
            // Nothing ran, but the federation may wait for its list (a Link valid at
            // start whose connect kept failing): it is told the link is gone, unless
            // another source links the cluster now.
            let failed = self.failing_clusters.lock().remove(key);
            if let Some(cluster) = failed
                && !self.claims().contains_key(&cluster)
            {
                if let Some(federation) = &self.opts.deps.federation {
                    federation.link_removed(&cluster);
                }
                if let Some(mcs) = &self.opts.deps.mcs
                    && self.candidates(&cluster).is_empty()
                {
                    mcs.link_removed(&cluster);
                }
            }
            return Outcome::Done;
        };
        let next = self.successor(key, &cluster);
        // Unlinking a Secret the cache lost deletes its mirrors: the cache alone does not
        // decide it. A watch that resumes from an old resourceVersion delivers a delete
        // and a re-create back to back, and a reconcile between the two finds no Secret
        // in the cache while the apiserver holds one again (chaos run 10, round 366:
        // three live mirrors deleted and re-created 0.1 s later). One the cache holds,
        // turned into a Link's credentials, is gone as a source whatever the apiserver
        // says.
        // A Secret the caller found absent that the cache holds again: the watch's
        // re-create landed since that read (CI, under load: the delete and the re-create
        // back to back, the second applied between the reconcile's read and this one;
        // without this the link was unlinked with its Secret present). The next
        // reconcile judges the Secret that is there.
        let cached = |name: &str| {
            self.secrets
                .get(&ObjectRef::new(name).within(&self.opts.namespace))
                .is_some()
        };
        if absent
            && next.is_none()
            && let SourceKey::Secret(name) = key
            && cached(name)
        {
            tracing::debug!(%cluster, secret = %name, "link Secret back in the cache: looked at again");
            self.queue.add(key.clone());
            return Outcome::Done;
        }
        if next.is_none()
            && let SourceKey::Secret(name) = key
            && !cached(name)
        {
            match self.secret_exists(name).await {
                Ok(false) => {}
                Ok(true) => {
                    tracing::debug!(%cluster, secret = %name, "link Secret gone from the cache but not from the apiserver (the watch is behind): mirrors kept");
                    return Outcome::RequeueAfter(WATCH_BEHIND_RECHECK);
                }
                Err(e) => {
                    tracing::warn!(%cluster, secret = %name, error = %e, "cannot confirm that the link Secret is gone: mirrors kept; retrying");
                    return Outcome::Failed;
                }
            }
        }
        // The same for a ClusterProfile: its mirrors go after the deletion grace, but a
        // profile the apiserver still holds does not even stop its link.
        if next.is_none()
            && let SourceKey::ClusterProfile(name) = key
            && self
                .profiles
                .get(&ObjectRef::new(name).within(&self.opts.namespace))
                .is_some()
        {
            // Back in the cache since the caller found it absent (as for Secrets).
            tracing::debug!(%cluster, cluster_profile = %name, "ClusterProfile back in the cache: looked at again");
            self.queue.add(key.clone());
            return Outcome::Done;
        }
        if next.is_none()
            && let SourceKey::ClusterProfile(name) = key
        {
            match self.profile_exists(name).await {
                Ok(false) => {}
                Ok(true) => {
                    tracing::debug!(%cluster, cluster_profile = %name, "ClusterProfile gone from the cache but not from the apiserver (the watch is behind): mirrors kept");
                    return Outcome::RequeueAfter(WATCH_BEHIND_RECHECK);
                }
                Err(e) => {
                    tracing::warn!(%cluster, cluster_profile = %name, error = %e, "cannot confirm that the ClusterProfile is gone: mirrors kept; retrying");
                    return Outcome::Failed;
                }
            }
        }
        let stopped = {
            let mut active = self.active();
            let mut claims = self.claims();
            let Some(a) = active.remove(key) else {
                return Outcome::Done;
            };
            match &next {
                // Hand the running link controller over: its reconcile rotates credentials
                // (or restyles mirrors) if they differ, and no mirror is deleted.
                Some(next) => {
                    tracing::info!(%cluster, from = %key, to = %next, "link moved to another source");
                    claims.insert(cluster.clone(), next.clone());
                    active.insert(next.clone(), a);
                    None
                }
                None => {
                    if claims.get(&cluster) == Some(key) {
                        claims.remove(&cluster);
                    }
                    // A deleted ClusterProfile's mirrors wait out the grace, counted as
                    // a cleanup (its write Lease kept) that a new link of the cluster
                    // cancels, under the same locks as the claim's release.
                    if let SourceKey::ClusterProfile(name) = key {
                        self.park_profile(name, &cluster);
                    }
                    Some(a)
                }
            }
        };
        match (next, stopped) {
            (Some(next), _) => self.queue.add(next),
            (None, Some(a)) => {
                let parked = matches!(key, SourceKey::ClusterProfile(_));
                match parked {
                    true => self.stop_link(key, a, false).await,
                    false => self.unlink(key, a).await,
                }
                // A source refused as a duplicate of this one may link now.
                self.queue_all();
                if parked {
                    return Outcome::RequeueAfter(self.opts.cluster_profile_deletion_grace);
                }
            }
            (None, None) => {}
        }
        Outcome::Done
    }

    /// Whether the apiserver holds link Secret `name` now (a quorum list by name and
    /// type, metadata only: the install grants Secrets list, not get).
    pub(super) async fn secret_exists(&self, name: &str) -> kube::Result<bool> {
        let api: Api<Secret> = Api::namespaced(self.local.clone(), &self.opts.namespace);
        let params = ListParams::default()
            .fields(&format!("metadata.name={name},type={LINK_SECRET_TYPE}"))
            .limit(1);
        Ok(!api.list_metadata(&params).await?.items.is_empty())
    }
}
