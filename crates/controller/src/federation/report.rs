//! What a federation reconcile says beyond its writes, once per episode per key: a log
//! line, a Warning Event and a metric for a refused member, for members whose ports
//! conflict, and for a foreign Service holding a `<svc>-federated` name. What was last
//! said is in the shared state; it is compared and updated under the lock, and the
//! Events are published after it is released.

use super::reconcile::Reconciler;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use service_mirror_core::ServiceKey;
use service_mirror_core::federated::MemberRefusal;

fn service_ref(namespace: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

impl Reconciler {
    async fn event(&self, regarding: &ObjectReference, reason: &str, note: String) {
        self.recorder
            .publish(regarding, EventType::Warning, reason, "Federate", note)
            .await;
    }

    /// A problem of the local member's traffic annotations: a Warning Event on it.
    pub(super) async fn report_traffic(&self, key: &ServiceKey, reason: &str, note: String) {
        self.event(&service_ref(&key.namespace, &key.name), reason, note)
            .await;
    }

    pub(super) async fn report_foreign(&self, key: &ServiceKey, name: &str, exists: bool) {
        if !exists || !self.shared.lock().foreign.insert(key.clone()) {
            return;
        }
        let reason = "FederatedConflict";
        tracing::warn!(%key, federated = %name, "a Service named like the federated Service exists and is not ours: left untouched");
        self.metrics.federation.problem(reason);
        let note = format!(
            "Service {}/{name} exists without this controller's federated mark (label service-mirror.linkerd.io/federated=true and annotation service-mirror.io/controller-namespace={}): it is never adopted or changed; delete or rename it to let the federated Service of {key} be created",
            key.namespace, self.namespace
        );
        self.event(&service_ref(&key.namespace, name), reason, note)
            .await;
    }

    pub(super) async fn report_refused(
        &self,
        key: &ServiceKey,
        refused: &[(String, MemberRefusal)],
    ) {
        // The refusals not reported before, with where each is reported (its Link).
        let new: Vec<(&String, &MemberRefusal, ObjectReference)> = {
            let mut s = self.shared.lock();
            let last = s.refused.get(key).cloned().unwrap_or_default();
            if last.as_slice() == refused {
                return;
            }
            match refused.is_empty() {
                true => s.refused.remove(key),
                false => s.refused.insert(key.clone(), refused.to_vec()),
            };
            refused
                .iter()
                .filter(|r| !last.contains(r))
                .map(|(member, why)| {
                    let cluster = member.rsplit_once('@').map(|(_, c)| c).unwrap_or_default();
                    let regarding = match s.index.link_of(cluster) {
                        Some(link) => link.clone(),
                        None => service_ref(&key.namespace, &key.name),
                    };
                    (member, why, regarding)
                })
                .collect()
        };
        for (member, why, regarding) in new {
            let reason = why.reason();
            tracing::warn!(%key, %member, why = why.detail(), "federated member refused; the others are unaffected");
            self.metrics.federation.problem(reason);
            let note = format!(
                "federated member {member} in namespace {} refused: {}",
                key.namespace,
                why.detail()
            );
            self.event(&regarding, reason, note).await;
        }
    }

    pub(super) async fn report_conflicts(
        &self,
        key: &ServiceKey,
        name: &str,
        conflicts: &[String],
    ) {
        {
            let mut s = self.shared.lock();
            let last = s.conflicts.get(key).map(Vec::as_slice).unwrap_or_default();
            if last == conflicts {
                return;
            }
            if conflicts.is_empty() {
                s.conflicts.remove(key);
                return;
            }
            s.conflicts.insert(key.clone(), conflicts.to_vec());
        }
        let reason = "FederatedPortConflict";
        let list = conflicts.join("; ");
        tracing::warn!(%key, federated = %name, conflicts = %list, "federated members' ports conflict; the union keeps the oldest member's");
        self.metrics.federation.problem(reason);
        let note = format!(
            "members of {key} disagree on ports: the federated Service has the union of their ports, the oldest member's (local first) winning; left out: {list}"
        );
        self.event(&service_ref(&key.namespace, name), reason, note)
            .await;
    }
}
