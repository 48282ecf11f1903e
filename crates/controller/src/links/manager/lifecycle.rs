//! A source's link started, rotated (new credentials: the new controller syncs before
//! the old one stops), restarted (new settings, same credentials: the new one starts
//! paused as the old one stops) and stopped, with the cleanup of its mirrors.

use super::*;

impl Inner {
    /// Brings the link of a valid source to `spec`: start, restart with new settings, or
    /// nothing.
    pub(super) async fn apply_spec(
        &self,
        key: &SourceKey,
        source: &SourceObject<'_>,
        spec: LinkSpec,
    ) -> Outcome {
        let current = self.active().get(key).map(|a| a.spec.clone());
        match current {
            Some(cur) if cur == spec => {
                // The same spec, maybe from a re-created object: it runs from that one.
                let uid = source.meta().uid.clone();
                let moved = match self.active().get_mut(key) {
                    Some(a) if a.uid != uid => {
                        a.uid = uid;
                        true
                    }
                    _ => false,
                };
                if moved {
                    self.update_links_gauge();
                }
                // Back to the running spec after a refused change: ready again.
                self.ready(source, &spec.link().cluster_name).await;
                Outcome::Done
            }
            // A Link's gateway alone moved: the running link takes it in place.
            Some(cur) if cur.only_gateway_moved(&spec) => {
                self.move_gateway(key, source, spec).await
            }
            // Same cluster name: new credentials (the new link controller syncs before
            // the old stops) or new domain or (a Link's) settings (the old stops as the
            // new starts); the mirror names stay.
            Some(cur) if cur.link().cluster_name == spec.link().cluster_name => {
                let rotate = !cur.same_credentials(&spec);
                self.replace(key, source, spec, rotate).await
            }
            Some(_) => {
                // Another cluster name: a different link. A source refused as a
                // duplicate of the old cluster may link it now.
                if let Some(a) = self.take(key) {
                    self.unlink(key, a).await;
                }
                self.queue_all();
                self.link(key, source, spec).await
            }
            None => self.link(key, source, spec).await,
        }
    }

    pub(super) async fn link(
        &self,
        key: &SourceKey,
        source: &SourceObject<'_>,
        spec: LinkSpec,
    ) -> Outcome {
        let cluster = spec.link().cluster_name.clone();
        // The oldest valid source of a cluster links it, whichever is reconciled first;
        // one that runs keeps it (no flapping when an older one becomes valid).
        let taken_by = {
            let oldest = self.candidates(&cluster).into_iter().next();
            let mut claims = self.claims();
            match claims.get(&cluster) {
                Some(other) if other != key => Some(other.clone()),
                Some(_) => None,
                None => match oldest {
                    Some(older) if &older != key => {
                        self.queue.add(older.clone());
                        Some(older)
                    }
                    _ => {
                        claims.insert(cluster.clone(), key.clone());
                        None
                    }
                },
            }
        };
        if let Some(other) = taken_by {
            self.report(
                source,
                &LinkError::DuplicateClusterName(cluster, other.to_string()),
            )
            .await;
            return Outcome::Done;
        }
        // A background cleanup of an earlier link of this cluster must not delete the
        // mirrors of this one.
        self.cleanups.cancel(&cluster);
        let client = match connect(
            &spec,
            &self.metrics().client,
            self.opts.config.max_remote_response_bytes,
        )
        .await
        {
            Ok(c) => {
                self.failing.lock().remove(key);
                self.failing_clusters.lock().remove(key);
                c
            }
            Err(e) => {
                self.claims().remove(&cluster);
                self.failing.lock().insert(key.clone());
                self.failing_clusters
                    .lock()
                    .insert(key.clone(), cluster.clone());
                self.report(source, &e).await;
                // Another source of the cluster may link it meanwhile.
                for other in self.candidates(&cluster) {
                    self.queue.add(other);
                }
                return if e.retryable() {
                    Outcome::Failed
                } else {
                    Outcome::Done
                };
            }
        };
        match LinkController::start(
            self.local.clone(),
            client,
            spec.link().clone(),
            self.link_config(&spec),
            self.link_deps(source),
        ) {
            Ok(controller) => {
                self.run(key, source, spec, controller);
                tracing::info!(%cluster, source = %key, "linked");
                self.ready(source, &cluster).await;
                self.event(
                    source,
                    EventType::Normal,
                    "Linked",
                    format!("watching remote cluster {cluster}"),
                )
                .await;
                Outcome::Done
            }
            Err(e) => {
                self.claims().remove(&cluster);
                let err = LinkError::InvalidClusterName(cluster, e.to_string());
                self.report(source, &err).await;
                Outcome::Done
            }
        }
    }

    /// A client for the new spec of a running link, its remote probed; a refusal is
    /// reported and the running link keeps mirroring (`Err`: the outcome to return).
    async fn connect_running(
        &self,
        source: &SourceObject<'_>,
        spec: &LinkSpec,
    ) -> Result<kube::Client, Outcome> {
        let max = self.opts.config.max_remote_response_bytes;
        match connect(spec, &self.metrics().client, max).await {
            Ok(c) => Ok(c),
            Err(e) => {
                self.report(source, &e).await;
                Err(if e.retryable() {
                    Outcome::Failed
                } else {
                    Outcome::Done
                })
            }
        }
    }

    /// `controller` now runs `key`'s link of `spec`.
    fn run(
        &self,
        key: &SourceKey,
        source: &SourceObject<'_>,
        spec: LinkSpec,
        controller: LinkController,
    ) {
        self.active().insert(
            key.clone(),
            Active {
                spec,
                controller,
                uid: source.meta().uid.clone(),
            },
        );
        self.update_links_gauge();
        // In the set the write Lease task reads: its Lease is taken now, not a tick later.
        if let Some(gates) = &self.opts.deps.write_gates {
            gates.wake();
        }
    }

    /// A running Link's new gateway, and nothing else new: the running controller
    /// takes it in place (its mirrors reconciled towards it; no relist, no second set
    /// of caches), `SettingsApplied`. A link that cannot (no Link gateway running)
    /// restarts instead.
    async fn move_gateway(
        &self,
        key: &SourceKey,
        source: &SourceObject<'_>,
        spec: LinkSpec,
    ) -> Outcome {
        let cluster = spec.link().cluster_name.clone();
        let gateway = self.link_config(&spec).link_gateway;
        // From the object it runs from only: a Link deleted and re-created with a new
        // gateway restarts, so the controller's Events and federation identity follow
        // the new object (they are set at start).
        let uid = source.meta().uid.clone();
        let moved = match (self.active().get_mut(key), gateway) {
            (Some(a), Some(gateway)) if a.uid == uid && a.controller.has_link_gateway() => {
                a.controller.move_gateway(gateway);
                a.spec = spec.clone();
                true
            }
            _ => false,
        };
        if !moved {
            return self.replace(key, source, spec, false).await;
        }
        tracing::info!(%cluster, source = %key, "the Link's gateway moved in place");
        self.metrics().links.rotation_ended("moved");
        self.ready(source, &cluster).await;
        let note = format!(
            "the gateway of {cluster} moved; its mirrors are rewritten in place, without a restart"
        );
        self.event(source, EventType::Normal, "SettingsApplied", note)
            .await;
        Outcome::Done
    }

    /// A running link's new spec: a new link controller, started paused, takes over
    /// from the old one, which stops before the new one writes, so the two never work
    /// on the same mirror at once and no mirror is deleted or flaps.
    ///
    /// - New credentials (`rotate`): the new controller lists beside the old one and
    ///   takes over once synced; credentials that do not sync in time leave the old
    ///   ones mirroring (`RotationTimeout`), else `CredentialsRotated`.
    /// - New settings, the same credentials: the old one stops as soon as the new one
    ///   has started, and the new one writes once it has listed (as after a process
    ///   restart), `SettingsApplied`. Side by side until synced, two controllers held
    ///   two copies of the remote's Services (at 10,000 Services: 120.3 MiB peak
    ///   against 69.2 once synced), and the same credentials need no proof. Its feeds
    ///   (MCS, federation) start before the old ones end, so the old link's exports
    ///   count until the new one has listed (mcs/index.rs keeps an ended view for a
    ///   successor that has not listed).
    ///
    /// Either way the remote is probed first: a refusal leaves the old link running,
    /// and the change is tried again.
    pub(super) async fn replace(
        &self,
        key: &SourceKey,
        source: &SourceObject<'_>,
        spec: LinkSpec,
        rotate: bool,
    ) -> Outcome {
        let cluster = spec.link().cluster_name.clone();
        let _counted = RotationInProgress::start(&self.metrics().links.rotations_in_progress);
        let client = match self.connect_running(source, &spec).await {
            Ok(c) => c,
            Err(outcome) => return outcome,
        };
        if self.cancel.is_cancelled() {
            return Outcome::Done;
        }
        let new = match LinkController::start_paused(
            self.local.clone(),
            client,
            spec.link().clone(),
            self.link_config(&spec),
            self.link_deps(source),
        ) {
            Ok(w) => w,
            Err(e) => {
                // Not reached with a cluster name that ran: the old link keeps running.
                tracing::error!(%cluster, error = %e, "could not start the new link controller");
                return Outcome::Failed;
            }
        };
        if rotate {
            tokio::select! {
                _ = new.wait_synced() => {}
                _ = self.cancel.cancelled() => {
                    let _ = new.stop(false).await;
                    return Outcome::Done;
                }
                _ = tokio::time::sleep(self.opts.rotation_timeout) => {
                    let _ = new.stop(false).await;
                    self.metrics().links.rotation_ended("timeout");
                    self.report(
                        source,
                        &LinkError::RotationTimeout(self.opts.rotation_timeout.as_secs()),
                    )
                    .await;
                    return Outcome::Failed;
                }
            }
        }
        // The claim on the cluster stays, so its write Lease is kept meanwhile (the
        // lock is released before the stop is awaited).
        let old = self.active().remove(key);
        if let Some(old) = old {
            let _ = old.controller.stop(false).await;
        }
        new.resume();
        self.run(key, source, spec, new);
        let (outcome, reason, note) = match rotate {
            true => (
                "rotated",
                "CredentialsRotated",
                format!("now using the new credentials and settings for {cluster}"),
            ),
            false => (
                "restarted",
                "SettingsApplied",
                format!(
                    "restarted with the new settings for {cluster}; the mirrors are kept and rewritten once the remote is listed again"
                ),
            ),
        };
        tracing::info!(%cluster, source = %key, reason, "link controller replaced");
        self.metrics().links.rotation_ended(outcome);
        self.ready(source, &cluster).await;
        self.event(source, EventType::Normal, reason, note).await;
        Outcome::Done
    }

    /// Stops a link: a Secret's and a ClusterProfile's mirrors are deleted with it, a
    /// Link's are kept (as Linkerd keeps them; `service-mirror unlink` removes them).
    pub(super) async fn unlink(&self, key: &SourceKey, a: Active) {
        let cleanup = matches!(key, SourceKey::Secret(_) | SourceKey::ClusterProfile(_));
        self.stop_link(key, a, cleanup).await
    }

    /// Stops a link, its mirrors deleted with it if `cleanup`. A deleted ClusterProfile's
    /// link stops without (parked): its mirrors stay as they were, no longer written,
    /// and the federation and MCS are not told the link is gone until the deletion grace
    /// ends (profiles.rs), so a profile back within it resumes as after a restart.
    pub(super) async fn stop_link(&self, key: &SourceKey, a: Active, cleanup: bool) {
        let cluster = a.spec.link().cluster_name.clone();
        let parked = !cleanup && matches!(key, SourceKey::ClusterProfile(_));
        self.update_links_gauge();
        // Claimed while its mirrors are deleted: its write Lease is kept until then
        // (deleted at the next Lease pass otherwise, failing a long deletion).
        let begun = cleanup.then(|| self.cleanups.begin(&cluster));
        let stopped = a.controller.stop(cleanup).await;
        // A Link's mirrors stay, but its series go with it (`remote_state` would
        // otherwise say `stale` forever).
        self.metrics().link.forget(&cluster);
        // Stopped first, so none of its member reports comes after this.
        if !parked {
            self.link_removed(&cluster);
        }
        match stopped {
            Ok(()) => {
                if let Some(id) = begun {
                    self.cleanups.end(&cluster, id);
                }
            }
            // The leader deletes them (or, under a write Lease another writer holds,
            // nobody until it is ours); this replica does if it comes to lead first.
            Err(crate::error::Error::NotLeader) => {
                tracing::debug!(%cluster, "unlinked on a replica that does not lead: the leader deletes the mirrors");
                self.spawn_cleanup(&cluster, None);
            }
            Err(e) => {
                // Keep trying in the background: the mirrors must not outlive the link.
                // A new link of the same cluster cancels this (see `link`).
                tracing::warn!(%cluster, error = %e, "cleanup after unlink failed; retrying");
                self.spawn_cleanup(&cluster, None);
            }
        }
        match (cleanup, parked) {
            (true, _) => tracing::info!(%cluster, source = %key, "unlinked"),
            (false, true) => {
                let grace_s = self.opts.cluster_profile_deletion_grace.as_secs_f64();
                tracing::info!(%cluster, source = %key, grace_s, "ClusterProfile deleted: link stopped, mirrors kept; deleted if it stays absent for the grace, kept if it comes back")
            }
            (false, false) => {
                tracing::info!(%cluster, source = %key, "Link deleted: link stopped, mirrors kept")
            }
        }
    }

    /// The federation and MCS are told that `cluster`'s link is gone (after its link
    /// controller stopped, so none of its member reports comes after this).
    pub(super) fn link_removed(&self, cluster: &str) {
        if let Some(federation) = &self.opts.deps.federation {
            federation.link_removed(cluster);
        }
        // Only if no source names it any more (a duplicate refused so far may link it
        // next; a failing one still may).
        if let Some(mcs) = &self.opts.deps.mcs
            && self.candidates(cluster).is_empty()
        {
            mcs.link_removed(cluster);
        }
    }

    /// Deletes every mirror of `cluster` in the background until it succeeds, unless the
    /// cluster is linked again first.
    pub(super) fn spawn_cleanup(&self, cluster: &str, only: Option<MirrorSelector>) {
        // Under the cluster's write gate: mirrors of a cluster whose Lease another
        // writer (Linkerd's controller) holds may be its own, and are left alone.
        let leader = match &self.opts.deps.write_gates {
            Some(gates) => Some(gates.link_leadership(self.opts.deps.leader.clone(), cluster)),
            None => self.opts.deps.leader.clone(),
        };
        let writer = LocalWriter::with_recorder(
            self.local.clone(),
            cluster,
            self.opts.deps.metrics.clone(),
            self.recorder.clone(),
        )
        .led_by(leader.clone());
        self.cleanups
            .spawn(cluster, writer, only, leader, &self.cancel);
    }
}
