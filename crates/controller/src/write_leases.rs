//! Per-link write Leases named as Linkerd names them: `linkerd multicluster check` and
//! `gateways` find the pod that writes a link through the Lease
//! `service-mirror-write-<cluster>` in the controller's namespace (its `holderIdentity`).
//!
//! They only report: who may write is decided by the one leader-election Lease
//! (`leader.rs`). The leader holds one write Lease per running link (holder: its
//! identity, `leaseDurationSeconds` as the leader Lease), renewed once every two thirds
//! of the duration, the one write per Lease an idle link costs. A Lease is ours only
//! with [`OWNER_LABEL`]; any other (Linkerd's own controller electing on the same name)
//! is never written, and reported once, since two controllers would write that link.
//! Every write carries the resourceVersion last seen, so a replica that lost the
//! leadership cannot overwrite the new leader's claim, and each write first reads the
//! clock-bounded leadership (`leader.rs`): a replica whose term ended writes nothing.
//! Shutting down while leading releases the Leases (holder `""`, as client-go
//! releases); losing the leadership only forgets them (the new leader takes them); an
//! unlinked cluster's Lease is deleted.

use crate::backoff::Backoff;
use crate::metrics::Metrics;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use service_mirror_core::labels::CLUSTER_NAME_LABEL;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Marks a write Lease as ours (the value is [`OWNER_VALUE`]).
pub const OWNER_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`OWNER_LABEL`] on our write Leases.
pub const OWNER_VALUE: &str = "service-mirror.linkerd.io";
/// Field manager of every write.
const FIELD_MANAGER: &str = "service-mirror-write-lease";
/// How often the running links are looked at (in memory: costs no request).
const TICK: Duration = Duration::from_secs(1);

/// The Lease of link `cluster`.
pub fn lease_name(cluster: &str) -> String {
    format!("service-mirror-write-{cluster}")
}

/// Labels of the write Lease counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VerbLabels {
    /// `create`, `update` or `delete`.
    pub(crate) verb: String,
}

/// The write Leases' metric family.
#[derive(Debug, Default)]
pub(crate) struct WriteLeaseFamilies {
    /// Writes to write Leases (never counted in `local_writes_total`, the mirrors').
    pub(crate) writes: Family<VerbLabels, Counter>,
}

impl WriteLeaseFamilies {
    /// Registers the family (under the registry's prefix).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "write_lease_writes",
            "Writes to the per-link service-mirror-write-<cluster> Leases",
            self.writes.clone(),
        );
    }

    fn wrote(&self, verb: &str) {
        self.writes
            .get_or_create(&VerbLabels { verb: verb.into() })
            .inc();
    }
}

/// The links the manager runs, and those it still claims (a rotation stops the old link
/// controller before the new one runs: its Lease is kept meanwhile).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkSet {
    /// Clusters with a running link controller.
    pub running: BTreeSet<String>,
    /// Clusters a link Secret claims, running or not.
    pub claimed: BTreeSet<String>,
}

/// Where and as whom the Leases are held.
#[derive(Debug, Clone)]
pub struct WriteLeaseOptions {
    /// The controller's namespace.
    pub namespace: String,
    /// The holder identity (the leader Lease's).
    pub identity: String,
    /// `leaseDurationSeconds`.
    pub duration: Duration,
}

struct Held {
    lease: Lease,
    renewed: Instant,
}

struct WriteLeases {
    api: Api<Lease>,
    opts: WriteLeaseOptions,
    metrics: Arc<Metrics>,
    held: BTreeMap<String, Held>,
    /// Clusters whose Lease is not ours: reported once, never written.
    foreign: BTreeSet<String>,
    /// Failed attempts and when to try again, by cluster.
    failing: BTreeMap<String, (u32, Instant)>,
    /// Read before each write: a replica whose leadership ended writes nothing.
    leader: Option<crate::leader::Leadership>,
}

/// Holds the write Leases while `leader` says so (always without election), for the
/// links `links` returns, until `shutdown`; then releases them.
pub fn spawn(
    client: kube::Client,
    opts: WriteLeaseOptions,
    mut leader: Option<crate::leader::Leadership>,
    links: Arc<dyn Fn() -> LinkSet + Send + Sync>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let mut w = WriteLeases {
        api: Api::namespaced(client, &opts.namespace),
        opts,
        metrics,
        held: BTreeMap::new(),
        foreign: BTreeSet::new(),
        failing: BTreeMap::new(),
        leader: leader.clone(),
    };
    tokio::spawn(async move {
        loop {
            let leading = leader.as_mut().is_none_or(|l| l.leading_and_update());
            if leading {
                w.step(&links()).await;
            } else {
                // Not released: the leadership ended, so another replica may hold these
                // already, and a replica that is not the leader writes nothing.
                w.forget_all();
            }
            let changed = async {
                match leader.as_mut() {
                    Some(l) => {
                        if l.changed().await.is_err() {
                            std::future::pending::<()>().await
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(TICK) => {}
                _ = changed => {}
            }
        }
        w.release_all().await;
    })
}

impl WriteLeases {
    fn may_write(&self) -> bool {
        self.leader.as_ref().is_none_or(|l| l.leading())
    }

    /// Drops what is held without writing (the leadership ended).
    fn forget_all(&mut self) {
        self.held.clear();
        self.foreign.clear();
        self.failing.clear();
    }

    fn renew_every(&self) -> Duration {
        self.opts.duration.mul_f64(2.0 / 3.0)
    }

    fn secs(&self) -> i32 {
        self.opts.duration.as_secs().max(1) as i32
    }

    fn due(&self, cluster: &str) -> bool {
        self.failing
            .get(cluster)
            .is_none_or(|(_, at)| Instant::now() >= *at)
    }

    fn failed(&mut self, cluster: &str, what: &str, e: &kube::Error) {
        let n = self.failing.get(cluster).map_or(1, |(n, _)| n + 1);
        let delay = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(30)).delay(n);
        self.failing
            .insert(cluster.to_string(), (n, Instant::now() + delay));
        tracing::warn!(%cluster, lease = %lease_name(cluster), error = %e, "cannot {what} the write Lease; retrying");
    }

    /// One pass as leader: delete the Leases of unlinked clusters, take those of new
    /// links, renew those due.
    async fn step(&mut self, links: &LinkSet) {
        let gone: Vec<String> = self
            .held
            .keys()
            .filter(|c| !links.running.contains(*c) && !links.claimed.contains(*c))
            .cloned()
            .collect();
        for cluster in gone {
            self.delete(&cluster).await;
        }
        self.foreign
            .retain(|c| links.running.contains(c) || links.claimed.contains(c));
        self.failing
            .retain(|c, _| links.running.contains(c) || links.claimed.contains(c));
        for cluster in &links.running {
            if !self.held.contains_key(cluster)
                && !self.foreign.contains(cluster)
                && self.due(cluster)
            {
                self.acquire(cluster).await;
            }
        }
        let every = self.renew_every();
        let due: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| h.renewed.elapsed() >= every)
            .map(|(c, _)| c.clone())
            .collect();
        for cluster in due {
            if self.due(&cluster) {
                self.renew(&cluster).await;
            }
        }
    }

    fn params() -> PostParams {
        PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        }
    }

    async fn acquire(&mut self, cluster: &str) {
        let name = lease_name(cluster);
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let existing = match self.api.get_opt(&name).await {
            Ok(l) => l,
            Err(e) => return self.failed(cluster, "read", &e),
        };
        if !self.may_write() {
            return;
        }
        let (verb, result) = match existing {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some(
                            [
                                (OWNER_LABEL.to_string(), OWNER_VALUE.to_string()),
                                (CLUSTER_NAME_LABEL.to_string(), cluster.to_string()),
                            ]
                            .into(),
                        ),
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
            Some(lease) if !is_ours(&lease) => {
                let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
                tracing::warn!(%cluster, lease = %name, ?holder, "a Lease of this name exists without our label: another controller (Linkerd's?) may write this link; leaving it alone");
                self.foreign.insert(cluster.to_string());
                return;
            }
            Some(mut lease) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if spec.holder_identity.as_deref() != Some(&self.opts.identity) {
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
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
                tracing::info!(%cluster, lease = %name, identity = %self.opts.identity, "holding the link's write Lease");
                self.held.insert(
                    cluster.to_string(),
                    Held {
                        lease,
                        renewed: Instant::now(),
                    },
                );
            }
            Err(e) => self.failed(cluster, "take", &e),
        }
    }

    async fn renew(&mut self, cluster: &str) {
        if !self.may_write() {
            return;
        }
        let Some(held) = self.held.get_mut(cluster) else {
            return;
        };
        let mut lease = held.lease.clone();
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        }
        match self
            .api
            .replace(&lease_name(cluster), &Self::params(), &lease)
            .await
        {
            Ok(lease) => {
                self.metrics.write_leases.wrote("update");
                *held = Held {
                    lease,
                    renewed: Instant::now(),
                };
            }
            Err(e) => {
                // Changed or deleted by someone else: read it again on the next pass.
                self.held.remove(cluster);
                self.failed(cluster, "renew", &e);
            }
        }
    }

    async fn delete(&mut self, cluster: &str) {
        if !self.may_write() {
            return;
        }
        let Some(held) = self.held.remove(cluster) else {
            return;
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: held.lease.metadata.uid.clone(),
                resource_version: held.lease.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
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
    /// only if unchanged since our last write, and only while still leading.
    async fn release_all(&mut self) {
        for (cluster, held) in std::mem::take(&mut self.held) {
            if !self.may_write() {
                continue;
            }
            let mut lease = held.lease;
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = Some(String::new());
                spec.lease_duration_seconds = Some(1);
                spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
            }
            match self
                .api
                .replace(&lease_name(&cluster), &Self::params(), &lease)
                .await
            {
                Ok(_) => {
                    self.metrics.write_leases.wrote("update");
                    tracing::info!(%cluster, lease = %lease_name(&cluster), "write Lease released");
                }
                Err(e) => {
                    tracing::debug!(%cluster, error = %e, "write Lease not released (taken over already?)")
                }
            }
        }
        self.foreign.clear();
        self.failing.clear();
    }
}

fn is_ours(lease: &Lease) -> bool {
    lease
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(OWNER_LABEL))
        .is_some_and(|v| v == OWNER_VALUE)
}
