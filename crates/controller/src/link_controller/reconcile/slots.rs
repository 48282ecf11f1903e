//! The mirror limit in a reconcile: a headless key's slots taken before its plan, a
//! key's slot freed when it has no mirror.

use super::*;

impl Reconciler {
    /// The mirror limit for a headless key that has mirrors: its existing objects keep
    /// being written however many pods it grows to; new endpoint mirrors beyond the
    /// limit are left out of `g` (name order, the same each pass) and refused as over
    /// the limit. True when the key's slots were taken here.
    pub(super) async fn admit_members(&self, key: &ServiceKey, g: &mut Gathered) -> bool {
        let Some(members) = g.members.as_mut().filter(|_| !g.pending) else {
            return false;
        };
        match self.fx.limit.admit_members(key, 1 + members.len()) {
            None => false,
            Some(Members::All) => true,
            Some(Members::Part { allowed, first }) => {
                let existing: BTreeSet<&str> = g
                    .services
                    .iter()
                    .filter_map(|s| s.metadata.name.as_deref())
                    .collect();
                let wanted = members.len();
                *members =
                    admitted_members(std::mem::take(members), |n| existing.contains(n), allowed);
                let cluster = &self.view.link.cluster_name;
                tracing::debug!(%cluster, %key, wanted, admitted = members.len(), "mirror limit reached: new endpoint mirrors refused");
                self.refuse_over_limit(key, first, true).await;
                true
            }
        }
    }

    /// Frees the mirror-limit slot of `key` (which has no mirror and creates none) and
    /// queues the refused keys that may take it.
    pub(super) fn release_slot(&self, key: &ServiceKey) {
        for woken in self.fx.limit.release(key) {
            self.fx.queue.add(woken);
        }
    }
}
