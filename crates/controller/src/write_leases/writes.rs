//! The Lease task's writes of one link's write Lease: take, renew, delete, release.

use super::*;

impl WriteLeases {
    pub(super) fn params() -> PostParams {
        PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        }
    }

    /// Reads the Lease and takes it, unless a foreign holder holds it.
    pub(super) async fn acquire(&mut self, cluster: &str, source: Option<&ObjectReference>) {
        let name = lease_name(cluster);
        let existing = match self.api.get_opt(&name).await {
            Ok(l) => l,
            Err(e) => return self.failed(cluster, "read", &e),
        };
        if !self.may_write() {
            return;
        }
        let view = existing.as_ref().map(view_of);
        let last = self
            .foreign
            .get(cluster)
            .and_then(|f| f.observed.as_ref())
            .or_else(|| self.peers.get(cluster));
        let judge = match self.gates.is_sharded() {
            true => judge_sharded,
            false => judge,
        };
        let (verdict, observed) = judge(
            view.as_ref(),
            &self.opts.identity,
            last,
            Instant::now(),
            Duration::from_secs(self.secs() as u64),
        );
        if let Verdict::HeldByPeer { .. } = &verdict {
            // Another replica of ours writes it (sharded: raced to it, or renewing; a
            // foreign holder's Lease it took over is no longer blocked).
            self.gates.set(cluster, None);
            if let Some(o) = observed {
                self.peers.insert(cluster.to_string(), o);
            }
            self.no_longer_foreign(cluster);
            return;
        }
        self.peers.remove(cluster);
        if let Verdict::HeldByForeign {
            holder, look_again, ..
        } = &verdict
        {
            self.gates.set(cluster, None);
            let shown = shown_holder(holder);
            let first = self
                .foreign
                .get(cluster)
                .is_none_or(|f| f.reported != *holder);
            self.foreign.insert(
                cluster.to_string(),
                Foreign {
                    observed,
                    look_again: *look_again,
                    reported: holder.clone(),
                },
            );
            if first {
                let odd: Vec<String> = view
                    .as_ref()
                    .map(anomalies)
                    .unwrap_or_default()
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                tracing::warn!(%cluster, lease = %name, holder = %shown, anomalies = ?odd, "the link's write Lease is held without our label by another writer (Linkerd's controller?): this link writes nothing until it is released or expires");
                let mut note = format!(
                    "the write Lease {name} is held by {shown:?}, not by this controller: mirrors of {cluster} are not written until it is released or stops being renewed"
                );
                if !odd.is_empty() {
                    note.push_str(&format!(" ({})", odd.join("; ")));
                }
                self.reporter().blocked(cluster, source, note).await;
            }
            return;
        }
        let was_foreign = self.foreign.contains_key(cluster);
        let takeover = match (&verdict, existing.as_ref().is_some_and(is_ours)) {
            (Verdict::Expired { .. }, _) => Some(Takeover::Expired),
            (Verdict::Released, false) => Some(Takeover::Released),
            _ => None,
        };
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let sent = Instant::now();
        let (verb, result) = match existing {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some(our_labels(cluster).into_iter().collect()),
                        annotations: Some({
                            let mut a = BTreeMap::from([(
                                HOLDER_ANNOTATION.to_string(),
                                self.opts.identity.clone(),
                            )]);
                            if self.gates.is_sharded() {
                                a.insert(SHARDED_ANNOTATION.to_string(), "true".to_string());
                            }
                            a
                        }),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.opts.identity.clone()),
                        lease_duration_seconds: Some(self.secs()),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                ("create", self.api.create(&Self::params(), &lease).await)
            }
            Some(mut lease) => {
                // Taken with the resourceVersion read: a holder that renewed meanwhile
                // makes this a 409, and the next pass reads it again.
                let labels = lease.metadata.labels.get_or_insert_with(Default::default);
                labels.extend(our_labels(cluster));
                mark_holder(&mut lease, &self.opts.identity, self.gates.is_sharded());
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if spec.holder_identity.as_deref() != Some(&self.opts.identity) {
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).max(0) + 1);
                    spec.acquire_time = Some(now.clone());
                }
                spec.holder_identity = Some(self.opts.identity.clone());
                spec.lease_duration_seconds = Some(self.secs());
                spec.renew_time = Some(now);
                (
                    "update",
                    self.api.replace(&name, &Self::params(), &lease).await,
                )
            }
        };
        match result {
            Ok(lease) => {
                self.metrics.write_leases.wrote(verb);
                self.failing.remove(cluster);
                self.foreign.remove(cluster);
                self.gates.set(cluster, Some(self.hold_until(sent)));
                tracing::info!(%cluster, lease = %name, identity = %self.opts.identity, ?takeover, "holding the link's write Lease");
                self.held.insert(
                    cluster.to_string(),
                    Held {
                        lease,
                        renewed: sent,
                    },
                );
                if takeover.is_some() || was_foreign {
                    let note = match (&verdict, takeover) {
                        (Verdict::Expired { holder }, _) => format!(
                            "the write Lease {name} was not renewed by {:?} for its whole duration: taken over; mirrors of {cluster} are written again",
                            shown_holder(holder)
                        ),
                        _ => format!(
                            "the write Lease {name} was released by its holder: taken over; mirrors of {cluster} are written again"
                        ),
                    };
                    self.reporter()
                        .unblocked(cluster, source, takeover, note)
                        .await;
                }
            }
            // Sharded, two replicas reaching for one free link: one wins, the other
            // reads the winner's Lease on its next pass.
            Err(kube::Error::Api(s)) if self.gates.is_sharded() && s.code == 409 => {
                tracing::debug!(%cluster, lease = %name, "another replica took the write Lease first");
                self.no_longer_foreign(cluster);
            }
            Err(e) => self.failed(cluster, "take", &e),
        }
    }

    pub(super) async fn renew(&mut self, cluster: &str) {
        if !self.may_write() {
            return;
        }
        let Some(held) = self.held.get(cluster) else {
            return;
        };
        let mut lease = held.lease.clone();
        mark_holder(&mut lease, &self.opts.identity, self.gates.is_sharded());
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        }
        let sent = Instant::now();
        match self
            .api
            .replace(&lease_name(cluster), &Self::params(), &lease)
            .await
        {
            Ok(lease) => {
                self.metrics.write_leases.wrote("update");
                self.gates.set(cluster, Some(self.hold_until(sent)));
                self.held.insert(
                    cluster.to_string(),
                    Held {
                        lease,
                        renewed: sent,
                    },
                );
            }
            Err(e) => {
                // Changed or deleted by someone else: read it again on the next pass
                // (the gate closes by itself when the hold runs out).
                self.held.remove(cluster);
                self.failed(cluster, "renew", &e);
            }
        }
    }

    pub(super) async fn delete(&mut self, cluster: &str) {
        if !self.may_write() {
            return;
        }
        let Some(held) = self.held.remove(cluster) else {
            return;
        };
        self.gates.forget(cluster);
        let params = only_as_read(&held.lease);
        match self.api.delete(&lease_name(cluster), &params).await {
            Ok(_) => {
                self.metrics.write_leases.wrote("delete");
                tracing::info!(%cluster, lease = %lease_name(cluster), "link removed: write Lease deleted");
            }
            Err(e) => {
                tracing::warn!(%cluster, lease = %lease_name(cluster), error = %e, "write Lease not deleted (changed meanwhile?)")
            }
        }
    }

    /// Gives every held Lease up (holder `""`, duration 1 s, as client-go releases), each
    /// only if unchanged since our last write, and only while still leading; the gates
    /// close first.
    pub(super) async fn release_all(&mut self) {
        self.gates.set_in_charge(false);
        self.gates.close_all();
        if self.gates.is_sharded() && !self.held.is_empty() {
            // Another replica takes a released link within a pass: writes that passed a
            // gate just before it closed land first (leader mode: the leader Lease,
            // released last, covers them).
            tokio::time::sleep(sharded::RELEASE_GRACE).await;
        }
        for (cluster, held) in std::mem::take(&mut self.held) {
            if !self.may_write() {
                continue;
            }
            self.release(&cluster, held).await;
        }
        self.foreign.clear();
        self.failing.clear();
        self.gates.set_foreign(BTreeSet::new());
    }

    /// Gives the Lease `held` of `cluster` up (its gate closed already): holder `""`,
    /// duration 1 s, as client-go releases; only if unchanged since our last write.
    pub(super) async fn release(&mut self, cluster: &str, held: Held) {
        let mut lease = held.lease;
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some(String::new());
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        }
        match self
            .api
            .replace(&lease_name(cluster), &Self::params(), &lease)
            .await
        {
            Ok(_) => {
                self.metrics.write_leases.wrote("update");
                tracing::info!(%cluster, lease = %lease_name(cluster), "write Lease released");
            }
            Err(e) => {
                tracing::debug!(%cluster, error = %e, "write Lease not released (taken over already?)")
            }
        }
    }
}
