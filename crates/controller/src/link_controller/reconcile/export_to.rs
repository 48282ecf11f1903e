//! What a reconcile says about a remote Service's `service-mirror.io/export-to`
//! (`core::export_to`). Withholding is the plan's: a withheld key's desired state is no
//! mirror, so a mirror it had goes like any other unexported one. What is said: an
//! invalid list, per key and once per episode (a Warning Event `InvalidExportTo` on the
//! link object, a warning, `reconcile_errors{kind="invalid_export_to"}`; a federated
//! member's too, although the link mirrors nothing of it), and a narrowed
//! Service this cluster cannot place because it has no name, once per link
//! (`ExportToNoClusterName`, `kind="export_to_no_cluster_name"`). A Service listing
//! other clusters is not this one's business: nothing is said.

use super::*;
use service_mirror_core::Withheld;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a link remembers of what it said about export-to.
#[derive(Debug, Default)]
pub(in crate::link_controller) struct ExportToMemory {
    /// Per key, the invalid annotation's reason last told (its episode runs).
    invalid: Mutex<HashMap<ServiceKey, String>>,
    /// The link said that this cluster has no name.
    unnamed_told: AtomicBool,
}

/// What to do about a key's invalid export-to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum InvalidStep {
    /// As remembered (or not known yet): nothing.
    Nothing,
    /// Valid now, or gone, or not exported: the episode ends.
    Forget,
    /// A new episode (or another invalid value): remember and tell this reason.
    Tell(String),
}

/// The step for a key whose export decision is `export` (`None`: the remote is not
/// listed, nothing is known), given the invalid reason `last` told.
pub(super) fn invalid_step(export: Option<&ExportDecision>, last: Option<&String>) -> InvalidStep {
    match (export, last) {
        (None, _) => InvalidStep::Nothing,
        (
            Some(
                ExportDecision::Withheld(Withheld::Invalid(now))
                | ExportDecision::InvalidMemberExportTo(now),
            ),
            Some(last),
        ) if now == last => InvalidStep::Nothing,
        (
            Some(
                ExportDecision::Withheld(Withheld::Invalid(now))
                | ExportDecision::InvalidMemberExportTo(now),
            ),
            _,
        ) => InvalidStep::Tell(now.clone()),
        (Some(_), Some(_)) => InvalidStep::Forget,
        (Some(_), None) => InvalidStep::Nothing,
    }
}

impl Reconciler {
    /// Says what the key's export-to calls for (see the module's text).
    pub(super) fn say_export_to(&self, key: &ServiceKey, g: &Gathered) {
        let export = g.remote_listed.then_some(g.export.as_ref()).flatten();
        let memory = &self.memory.export_to;
        let step = invalid_step(export, memory.invalid.lock().get(key));
        match step {
            InvalidStep::Nothing => {}
            InvalidStep::Forget => {
                memory.invalid.lock().remove(key);
            }
            InvalidStep::Tell(reason) => {
                memory.invalid.lock().insert(key.clone(), reason.clone());
                // The key and the names quoted are the remote's text.
                let service = crate::links::sanitize_remote_text(&key.to_string());
                let reason = crate::links::sanitize_remote_text(&reason);
                let cluster = &self.view.link.cluster_name;
                self.say_withheld(
                    "invalid_export_to",
                    "InvalidExportTo",
                    format!(
                        "remote service {service} of cluster {cluster} is neither mirrored nor a federated member here: its service-mirror.io/export-to annotation has {reason}, so it reaches no cluster (never wider than asked); a mirror of it here is removed"
                    ),
                    service,
                );
            }
        }
        if let Some(ExportDecision::Withheld(w @ Withheld::NoClusterName)) = export
            && !memory.unnamed_told.swap(true, Ordering::Relaxed)
        {
            let service = crate::links::sanitize_remote_text(&key.to_string());
            let cluster = &self.view.link.cluster_name;
            self.say_withheld(
                w.reason(),
                "ExportToNoClusterName",
                format!(
                    "remote service {service} of cluster {cluster} is exported only to the clusters its service-mirror.io/export-to annotation lists, and this cluster has no name in the cluster set (--mcs-cluster-name, or the ClusterProperty id.k8s.io read at the start): it, and every other remote service so narrowed, is not mirrored here (said once per link); name the cluster and restart the controller"
                ),
                service,
            );
        }
    }

    /// A warning, the metric (`reconcile_errors{kind}`: the withholding's bounded
    /// reason) and a Warning Event `reason` on the link object.
    fn say_withheld(
        &self,
        kind: &'static str,
        reason: &'static str,
        note: String,
        service: String,
    ) {
        let metrics = self.fx.metrics.clone();
        let reporter = self
            .fx
            .reporter
            .counting(Arc::new(move |_| metrics.error(kind)));
        reporter.say(Say {
            reason,
            action: "Mirror",
            note,
            key: Some(service),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_export_to_is_told_once_per_episode() {
        let invalid = |r: &str| ExportDecision::Withheld(Withheld::Invalid(r.into()));
        let told = |r: &str| Some(r.to_string());
        let others = [
            ExportDecision::NotExported,
            ExportDecision::RemoteDiscovery,
            ExportDecision::Withheld(Withheld::NotListed),
            ExportDecision::Withheld(Withheld::NoClusterName),
        ];
        // Not listed: nothing known, the episode neither starts nor ends.
        assert_eq!(invalid_step(None, None), InvalidStep::Nothing);
        assert_eq!(invalid_step(None, told("a").as_ref()), InvalidStep::Nothing);
        // Starts, lasts, changes; a federated member's invalid list the same, and the
        // same episode: a Service that stops being mirrored but stays a member is not
        // told again.
        let member = |r: &str| ExportDecision::InvalidMemberExportTo(r.into());
        for bad in [invalid, member] {
            assert_eq!(
                invalid_step(Some(&bad("a")), None),
                InvalidStep::Tell("a".into())
            );
            assert_eq!(
                invalid_step(Some(&bad("a")), told("a").as_ref()),
                InvalidStep::Nothing
            );
            assert_eq!(
                invalid_step(Some(&bad("b")), told("a").as_ref()),
                InvalidStep::Tell("b".into())
            );
        }
        // Ends with anything else; nothing to forget without an episode.
        for other in &others {
            assert_eq!(
                invalid_step(Some(other), told("a").as_ref()),
                InvalidStep::Forget,
                "{other:?}"
            );
            assert_eq!(invalid_step(Some(other), None), InvalidStep::Nothing);
        }
    }
}
