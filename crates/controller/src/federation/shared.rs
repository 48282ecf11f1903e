//! What the index task and the reconcile workers share, behind one `parking_lot`
//! Mutex: the index (members, gateways, pending clusters), the held messages (their
//! clusters count as pending), the Links' status books, and what reconcile remembers per
//! key (status entries, a foreign name holder, what was last reported).
//!
//! Critical sections are short and never span an `.await` (the guard is not `Send`, so
//! the compiler refuses it in a worker's future): a reconcile copies what it plans from,
//! plans and writes unlocked, and locks again to record what it found.

use super::held::Held;
use super::index::Index;
use super::local_slices::LocalSlices;
use crate::link_controller::link_status::StatusBook;
use service_mirror_core::ServiceKey;
use service_mirror_core::federated::MemberRefusal;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub(super) struct Shared {
    pub(super) index: Index,
    /// Messages of links whose write gate is closed (see `held.rs`).
    pub(super) held: Held,
    /// Each Link's status book (its `federatedServices`), by cluster.
    pub(super) books: BTreeMap<String, Arc<StatusBook>>,
    /// The clusters each key has a status entry in (to remove it when a member leaves).
    pub(super) entries: BTreeMap<ServiceKey, BTreeSet<String>>,
    /// Keys whose `<svc>-federated` name a foreign Service holds (`true` while it is
    /// there): no write until its watch (the token stops it) says it changed to ours or
    /// went.
    pub(super) blocked: BTreeMap<ServiceKey, (bool, CancellationToken)>,
    /// Keys whose federated Service is desired.
    pub(super) present: BTreeSet<ServiceKey>,
    /// What was last reported per key (reported again only when it changes).
    pub(super) refused: BTreeMap<ServiceKey, Vec<(String, MemberRefusal)>>,
    pub(super) conflicts: BTreeMap<ServiceKey, Vec<String>>,
    pub(super) foreign: BTreeSet<ServiceKey>,
    /// The local members' own EndpointSlices, one watch per key with a local member:
    /// copied into its federated Service's slices.
    pub(super) local_slices: LocalSlices,
    /// The traffic-annotation problems last told of each key's local member.
    pub(super) traffic: BTreeMap<ServiceKey, Vec<String>>,
}

impl Shared {
    /// The foreign Service holding `key`'s name is gone (or no longer matters): stop
    /// watching it.
    pub(super) fn unblock(&mut self, key: &ServiceKey) {
        if let Some((_, cancel)) = self.blocked.remove(key) {
            cancel.cancel();
        }
    }

    /// The clusters whose stored entries stay as they are: not listed yet, or held
    /// (another writer may be maintaining them).
    pub(super) fn pending(&self) -> BTreeSet<String> {
        let mut pending = self.index.pending().clone();
        pending.extend(self.held.clusters().cloned());
        pending
    }
}
