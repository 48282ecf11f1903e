//! What an operator sees of a link blocked by a foreign write Lease (`write_leases.rs`):
//! a Warning Event on the link object (Secret or Link) when the block begins, a Normal
//! one when the Lease is taken over, the gauge `service_mirror_write_lease_blocked`
//! and the counter `service_mirror_write_lease_takeovers_total`, and on a `Link` the
//! condition `WriteLeaseHeld` (False while blocked, True once taken over).

use crate::events::EventRecorder;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// The condition type on a `Link` (beside `Ready` and `RemoteReachable`).
pub const CONDITION_TYPE: &str = "WriteLeaseHeld";
/// Warning Event reason: the link writes nothing while another writer holds its Lease.
pub const BLOCKED_REASON: &str = "WriteLeaseHeldElsewhere";
/// Normal Event reason: the Lease was released or expired and is ours now.
pub const TAKEN_OVER_REASON: &str = "WriteLeaseTakenOver";

/// Labels of the blocked gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BlockedLabels {
    pub(crate) cluster: String,
    /// Only `held_by_foreign` (bounded).
    pub(crate) reason: String,
}

/// Labels of the takeover counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TakeoverLabels {
    /// `released` or `expired`.
    pub(crate) reason: String,
}

/// How a foreign Lease became ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Takeover {
    /// Its holder released it (holder empty).
    Released,
    /// Its holder stopped renewing for a whole duration.
    Expired,
}

impl Takeover {
    fn label(self) -> &'static str {
        match self {
            Takeover::Released => "released",
            Takeover::Expired => "expired",
        }
    }
}

/// Reports about one link's write Lease.
pub(crate) struct Reporter<'a> {
    /// Whether a block is told (Event, condition) or only counted in the gauge: links
    /// sharded over replicas tell it from the leader alone.
    pub(crate) tell_blocked: bool,
    pub(crate) recorder: Option<&'a EventRecorder>,
    pub(crate) client: &'a kube::Client,
    pub(crate) blocked: &'a Family<BlockedLabels, Gauge>,
    pub(crate) takeovers: &'a Family<TakeoverLabels, Counter>,
    /// Where the condition writes are counted.
    pub(crate) metrics: &'a std::sync::Arc<crate::metrics::Metrics>,
}

const HELD_BY_FOREIGN: &str = "held_by_foreign";

impl Reporter<'_> {
    /// The link stopped writing: a foreign holder holds its Lease.
    pub(crate) async fn blocked(
        &self,
        cluster: &str,
        source: Option<&ObjectReference>,
        note: String,
    ) {
        self.blocked
            .get_or_create(&BlockedLabels {
                cluster: cluster.into(),
                reason: HELD_BY_FOREIGN.into(),
            })
            .set(1);
        if !self.tell_blocked {
            return;
        }
        if let (Some(rec), Some(src)) = (self.recorder, source) {
            rec.publish(
                src,
                EventType::Warning,
                BLOCKED_REASON,
                "Link",
                note.clone(),
            )
            .await;
        }
        self.condition(source, "False", "HeldByForeign", &note)
            .await;
    }

    /// The link writes again: its Lease was taken over (`how`), or was never foreign
    /// (`None`: only the gauge and a stale condition are cleared).
    pub(crate) async fn unblocked(
        &self,
        cluster: &str,
        source: Option<&ObjectReference>,
        how: Option<Takeover>,
        note: String,
    ) {
        self.forget(cluster);
        if let Some(how) = how {
            self.takeovers
                .get_or_create(&TakeoverLabels {
                    reason: how.label().into(),
                })
                .inc();
            if let (Some(rec), Some(src)) = (self.recorder, source) {
                rec.publish(
                    src,
                    EventType::Normal,
                    TAKEN_OVER_REASON,
                    "Link",
                    note.clone(),
                )
                .await;
            }
        }
        self.condition(source, "True", "Held", &note).await;
    }

    /// Drops the gauge of a link that is gone or no longer blocked.
    pub(crate) fn forget(&self, cluster: &str) {
        self.blocked.remove(&BlockedLabels {
            cluster: cluster.into(),
            reason: HELD_BY_FOREIGN.into(),
        });
    }

    /// Sets `WriteLeaseHeld` on a Link source (a Secret has no conditions), only when
    /// its status or reason changes; with the version read, retried on 409.
    async fn condition(
        &self,
        source: Option<&ObjectReference>,
        status: &str,
        reason: &str,
        note: &str,
    ) {
        let Some(src) = source.filter(|s| s.kind.as_deref() == Some("Link")) else {
            return;
        };
        let (Some(ns), Some(name)) = (&src.namespace, &src.name) else {
            return;
        };
        let writer = crate::writer::link_status::LinkStatusWriter::new(
            self.client.clone(),
            ns,
            self.metrics.clone(),
        );
        let written = writer
            .condition(name, CONDITION_TYPE, None, |old, generation| {
                match old {
                    Some(c) if c.status == status && c.reason == reason => return None,
                    // Never blocked: no condition to clear (a Link that never met a foreign
                    // holder carries none; writing one would cost a write per Link).
                    None if status == "True" => return None,
                    _ => {}
                }
                Some(crate::writer::link_status::condition(
                    old,
                    CONDITION_TYPE,
                    status,
                    reason,
                    note,
                    generation,
                ))
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(link = %name, error = %e, "could not write the Link's WriteLeaseHeld condition");
        }
    }
}
