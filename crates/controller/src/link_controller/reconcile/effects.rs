//! What a link's reconcile does to the world besides reading: writes, Events, metrics,
//! the Link's status, the mirror-limit slots and the keys it queues.

use super::*;

/// The write side of a link's reconcile.
pub(in crate::link_controller) struct Effects {
    pub(in crate::link_controller) writer: LocalWriter,
    pub(in crate::link_controller) create_limit: CreateLimit,
    /// How many mirrors of one headless set are written at once (the link's
    /// `--workers`): serial, 1,000 pods took 2.59x the reference writer.
    pub(in crate::link_controller) member_writes: usize,
    /// Slots for mirrors under the link's limit.
    pub(in crate::link_controller) limit: Arc<MirrorLimit>,
    /// To wake keys refused under the limit when a slot frees.
    pub(in crate::link_controller) queue: WorkQueue<ServiceKey>,
    /// Mirror names someone else's object holds, read again until free.
    pub(in crate::link_controller) blocked: Arc<super::super::blocked::Blocked>,
    /// The local cluster, for reads beyond the caches only: kube-controller-manager's
    /// mirrored slices of a mirror whose slices of ours wait for them (`endpoints` mode,
    /// see [`Reconciler::mirrored_routes`]) and blocked names. Writes go through `writer`.
    pub(in crate::link_controller) local: kube::Client,
    /// The link Secret, where link-wide Events (the mirror limit) are recorded.
    pub(in crate::link_controller) link_secret: Option<ObjectReference>,
    /// Where the link says its conditions once per episode (Events on `link_secret`).
    pub(in crate::link_controller) reporter: crate::runtime::once::Reporter,
    pub(in crate::link_controller) metrics: LinkMetrics,
    /// The Link's status entries (Link links only).
    pub(in crate::link_controller) status: Option<Arc<StatusBook>>,
}
