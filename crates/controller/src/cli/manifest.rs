//! Names and labels shared by the manifests `install` (local side) and `allow` (remote
//! side) print.

use kube::api::ObjectMeta;
use std::collections::BTreeMap;

/// Default namespace of the multicluster objects on both sides (Linkerd's): the
/// controller and its link Secrets locally, the mirror's ServiceAccount remotely.
pub const DEFAULT_NAMESPACE: &str = "linkerd-multicluster";

/// The recommended label naming the tool that manages an object.
pub(super) const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Our value of [`MANAGED_BY_LABEL`], and the name of the controller's objects.
pub(super) const MANAGED_BY: &str = "service-mirror";

/// Metadata of a printed object: `name` in `namespace` (none: cluster-scoped), `labels`.
pub(super) fn meta(
    name: &str,
    namespace: Option<&str>,
    labels: BTreeMap<String, String>,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(labels),
        ..Default::default()
    }
}
