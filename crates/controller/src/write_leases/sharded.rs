//! Links sharded over replicas (`run --shard-links`; docs/operations.md "Scaling
//! out"): every replica holds the write Leases of its share of the links, and a link
//! writes on the replica holding its Lease, whoever leads (the leader Lease keeps the
//! federation, MCS and the unlinked-mirror collector to one writer).
//!
//! Each pass (every tenth of the Lease duration, at most 1 s) lists our Leases in the
//! controller's namespace once (label `app.kubernetes.io/managed-by`): the write Leases
//! and the member Leases `service-mirror-member-<identity>`, one per running replica,
//! renewed as write Leases are. A member Lease renewed within its duration (judged on
//! this replica's clock, as a foreign write Lease is) counts the replica live. The plan
//! (`service_mirror_core::shard`) then says which free Leases to take (each with the
//! resourceVersion read: two replicas reaching for one link make one 409) and which to
//! release. A release closes the link's gate first and writes holder `""` after
//! [`RELEASE_GRACE`], so writes that passed the gate just before it closed land before
//! another replica may take the Lease; a taker takes only a released or expired Lease,
//! never one a live replica renews. A replica shutting down releases its Leases and
//! deletes its member Lease, so the others take its links within a pass.

use super::*;
use kube::api::ListParams;
use service_mirror_core::shard::{self, Holder, ShardView};

/// Label of a member Lease (value `"true"`), beside our owner label.
pub const MEMBER_LABEL: &str = "service-mirror.linkerd.io/member";

/// Between closing a released link's gate and writing the release: a write that
/// passed the gate just before it closed is on its way (a mirror write takes
/// milliseconds here; a loaded apiserver's seconds-long tail is covered only in part:
/// updates and deletes carry the resourceVersion read, so one landing after the
/// taker's write fails; a late create finds the name taken).
pub(super) const RELEASE_GRACE: Duration = Duration::from_millis(500);

/// A member Lease seen unrenewed for this many of its durations is deleted (by any
/// replica, with the resourceVersion read): a replica killed without shutting down
/// (kill -9, its node lost) leaves one behind, and a new replica would count it live
/// for a whole duration.
const STALE_MEMBER_DURATIONS: u32 = 3;

/// This replica's membership, and the others' as observed.
#[derive(Default)]
pub(super) struct Members {
    /// Our member Lease as last written, and when.
    mine: Option<Held>,
    /// The other members' Leases as last observed, by name.
    observed: BTreeMap<String, Observed>,
}

/// The member Lease of replica `identity`: `service-mirror-member-<identity>` when that
/// is a valid name (pod names are), else a hash of the identity.
pub fn member_lease_name(identity: &str) -> String {
    let plain = !identity.is_empty()
        && identity.len() <= 200
        && identity
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && identity.starts_with(|c: char| c.is_ascii_alphanumeric())
        && identity.ends_with(|c: char| c.is_ascii_alphanumeric());
    match plain {
        true => format!("service-mirror-member-{identity}"),
        false => format!("service-mirror-member-{:016x}", shard::rank(identity, "")),
    }
}

impl WriteLeases {
    /// One pass, sharded (see the module's note).
    pub(super) async fn step_sharded(&mut self, links: &LinkSet) {
        self.forget_unlinked(links).await;
        self.renew_member().await;
        // Renewals first: a pass that releases (500 ms) or takes many must not delay them.
        self.renew_due().await;
        // Every Lease of the namespace, not only ours by label: a foreign writer's write
        // Lease (Linkerd's has none of our labels) is nobody's share on every replica.
        let leases = match self.api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the write and member Leases; the links held are renewed, none taken or released");
                self.renew_due().await;
                return;
            }
        };
        let now = Instant::now();
        let ours = Duration::from_secs(self.secs() as u64);
        let me = self.opts.identity.clone();
        let mine = member_lease_name(&me);
        let (members, writes): (Vec<Lease>, Vec<Lease>) = leases.into_iter().partition(|l| {
            l.metadata
                .labels
                .as_ref()
                .is_some_and(|m| m.get(MEMBER_LABEL).is_some_and(|v| v == "true"))
        });
        let mut live = 1;
        let mut observed = BTreeMap::new();
        for lease in members {
            let name = lease.metadata.name.clone().unwrap_or_default();
            if name == mine {
                continue;
            }
            let last = self.members.observed.remove(&name);
            if let Some(o) = &last
                && now.saturating_duration_since(o.since) > ours * STALE_MEMBER_DURATIONS
            {
                self.delete_stale_member(&lease).await;
                continue;
            }
            match judge_sharded(Some(&view_of(&lease)), &me, last.as_ref(), now, ours) {
                (Verdict::HeldByPeer { .. }, o) => {
                    live += 1;
                    if let Some(o) = o {
                        observed.insert(name, o);
                    }
                }
                // Unrenewed for its duration: gone, and still gone on the next read of
                // the same record (the observation is kept, not started again).
                (Verdict::Expired { .. }, _) => {
                    if let Some(o) = last {
                        observed.insert(name, o);
                    }
                }
                _ => {}
            }
        }
        self.members.observed = observed;
        let by_name: BTreeMap<String, Lease> = writes
            .into_iter()
            .filter_map(|l| Some((l.metadata.name.clone()?, l)))
            .filter(|(n, _)| n.starts_with("service-mirror-write-"))
            .collect();
        let wanted: BTreeSet<String> = links
            .running
            .iter()
            .chain(&links.cleaning)
            .cloned()
            .collect();
        let mut holders = BTreeMap::new();
        for cluster in wanted {
            let holder = if self.held.contains_key(&cluster) {
                Holder::Me
            } else if self.foreign.contains_key(&cluster) {
                Holder::Foreign
            } else {
                self.holder_of(&cluster, by_name.get(&lease_name(&cluster)), now)
            };
            holders.insert(cluster, holder);
        }
        let plan = shard::plan(&ShardView {
            me: &me,
            links: &holders,
            live,
        });
        // Foreign Leases are read again when due: reported, and taken once let go.
        let foreign: Vec<String> = holders
            .iter()
            .filter(|(c, h)| **h == Holder::Foreign && self.due(c))
            .map(|(c, _)| c.clone())
            .collect();
        for cluster in foreign {
            self.acquire(&cluster, links.sources.get(&cluster)).await;
        }
        if !plan.release.is_empty() {
            let mut releasing = Vec::new();
            for cluster in &plan.release {
                if let Some(held) = self.held.remove(cluster) {
                    self.gates.set(cluster, None);
                    releasing.push((cluster.clone(), held));
                }
            }
            // Time is the subject: writes that passed the gates just before they closed.
            tokio::time::sleep(RELEASE_GRACE).await;
            for (cluster, held) in releasing {
                tracing::info!(%cluster, live, "handing the link over: above this replica's share");
                self.release(&cluster, held).await;
                self.metrics.write_leases.handovers.inc();
            }
        }
        for cluster in &plan.take {
            if self.due(cluster) {
                self.acquire(cluster, links.sources.get(cluster)).await;
            }
        }
        self.renew_due().await;
        self.gates
            .set_foreign(self.foreign.keys().cloned().collect());
        // Judged: every link looked at, except one this pass meant to take and did not
        // (a failed read or write, a backoff): it runs nowhere yet, and is this
        // replica's to take next.
        let judged = holders
            .into_keys()
            .filter(|c| !plan.take.contains(c) || self.held.contains_key(c))
            .collect();
        self.gates.set_judged(judged);
        self.metrics.write_leases.held.set(self.held.len() as i64);
        self.metrics.write_leases.live.set(live as i64);
    }

    /// Who holds `cluster`'s Lease `lease` (as listed), judged on our clock.
    fn holder_of(&mut self, cluster: &str, lease: Option<&Lease>, now: Instant) -> Holder {
        let Some(lease) = lease else {
            self.peers.remove(cluster);
            return Holder::Free;
        };
        let ours = Duration::from_secs(self.secs() as u64);
        let last = self.peers.get(cluster);
        match judge_sharded(Some(&view_of(lease)), &self.opts.identity, last, now, ours) {
            (Verdict::HeldByPeer { holder, .. }, o) => {
                if let Some(o) = o {
                    self.peers.insert(cluster.to_string(), o);
                }
                Holder::Peer(holder)
            }
            // Our labels with a holder our annotation does not name: `acquire` reads it
            // again and reports it.
            (Verdict::HeldByForeign { .. }, _) => Holder::Foreign,
            // Expired: free, and still on the next read of the same record (the
            // observation is kept, not started again).
            (Verdict::Expired { .. }, _) => Holder::Free,
            // Absent, released, or ours by name but not held here (this identity
            // restarted): to take.
            _ => {
                self.peers.remove(cluster);
                Holder::Free
            }
        }
    }

    /// Creates or renews this replica's member Lease (every half duration).
    async fn renew_member(&mut self) {
        if self
            .members
            .mine
            .as_ref()
            .is_some_and(|h| h.renewed.elapsed() < self.renew_every())
        {
            return;
        }
        let name = member_lease_name(&self.opts.identity);
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let sent = Instant::now();
        let result = match self.members.mine.take() {
            Some(held) => {
                let mut lease = held.lease;
                if let Some(spec) = lease.spec.as_mut() {
                    spec.renew_time = Some(now);
                }
                self.api.replace(&name, &Self::params(), &lease).await
            }
            None => {
                // Read first: a Lease left by an earlier run under this identity is
                // taken over with its resourceVersion.
                let existing = self.api.get_opt(&name).await;
                let mut lease = match existing {
                    Ok(Some(l)) => l,
                    Ok(None) => Lease::default(),
                    Err(e) => {
                        tracing::warn!(lease = %name, error = %e, "cannot read this replica's member Lease; retrying");
                        return;
                    }
                };
                let labels = lease.metadata.labels.get_or_insert_with(Default::default);
                labels.insert(OWNER_LABEL.into(), OWNER_VALUE.into());
                labels.insert(MEMBER_LABEL.into(), "true".into());
                mark_holder(&mut lease, &self.opts.identity, true);
                lease.metadata.name = Some(name.clone());
                lease.spec = Some(LeaseSpec {
                    holder_identity: Some(self.opts.identity.clone()),
                    lease_duration_seconds: Some(self.secs()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    ..LeaseSpec::default()
                });
                match lease.metadata.resource_version.is_some() {
                    true => self.api.replace(&name, &Self::params(), &lease).await,
                    false => self.api.create(&Self::params(), &lease).await,
                }
            }
        };
        match result {
            Ok(lease) => {
                self.metrics.write_leases.wrote("update");
                self.members.mine = Some(Held {
                    lease,
                    renewed: sent,
                });
            }
            Err(e) => {
                tracing::warn!(lease = %name, error = %e, "cannot write this replica's member Lease; retrying");
            }
        }
    }

    /// Deletes another replica's member Lease left unrenewed (see
    /// [`STALE_MEMBER_DURATIONS`]), only as read.
    async fn delete_stale_member(&mut self, lease: &Lease) {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let params = only_as_read(lease);
        match self.api.delete(&name, &params).await {
            Ok(_) => {
                self.metrics.write_leases.wrote("delete");
                tracing::info!(lease = %name, "member Lease of a replica gone without shutting down deleted");
            }
            Err(e) => tracing::debug!(lease = %name, error = %e, "stale member Lease not deleted"),
        }
    }

    /// Deletes this replica's member Lease (shutting down): the others count it gone
    /// at once.
    pub(super) async fn leave(&mut self) {
        let Some(held) = self.members.mine.take() else {
            return;
        };
        let params = only_as_read(&held.lease);
        let name = member_lease_name(&self.opts.identity);
        match self.api.delete(&name, &params).await {
            Ok(_) => {
                self.metrics.write_leases.wrote("delete");
                tracing::info!(lease = %name, "member Lease deleted");
            }
            Err(e) => tracing::debug!(lease = %name, error = %e, "member Lease not deleted"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_lease_is_named_after_a_plain_identity_else_after_its_hash() {
        assert_eq!(
            member_lease_name("service-mirror-7d9f-abcde"),
            "service-mirror-member-service-mirror-7d9f-abcde"
        );
        for odd in ["Host_1-42", "", "-a", "a-", &"a".repeat(201)] {
            let name = member_lease_name(odd);
            assert_eq!(name.len(), "service-mirror-member-".len() + 16, "{odd}");
            assert_eq!(name, member_lease_name(odd), "stable");
        }
        assert_ne!(member_lease_name("Host_1"), member_lease_name("Host_2"));
    }
}
