//! The whole wire vocabulary: every label, annotation, port name, Secret type and
//! Secret key this project reads or writes on Kubernetes objects, defined here and
//! nowhere else (code elsewhere names these constants, never the strings).
//!
//! Most are shared with Linkerd's multicluster tooling, and part of the contract: a
//! cluster running this project must look the same to Linkerd's CLI, proxies and
//! dashboards as one running the original. The one of our own is marked so.

/// Prefix of every Linkerd mirror label and annotation: the per-link controller keeps
/// only the remote Service annotations under it (export and probe settings).
pub const MIRROR_PREFIX: &str = "mirror.linkerd.io/";

/// Linkerd's `SvcMirrorPrefix`, without the slash: a mirror copies no remote label
/// starting with it (so also `mirror.linkerd.iox/...`, as Linkerd does).
pub const SVC_MIRROR_PREFIX: &str = "mirror.linkerd.io";

/// Service annotation of topology-aware hints: never copied to a mirror (topology is
/// not multicluster-aware).
pub const TOPOLOGY_AWARE_HINTS_ANNOTATION: &str = "service.kubernetes.io/topology-aware-hints";
/// Service annotation of topology-aware routing: never copied to a mirror, like
/// [`TOPOLOGY_AWARE_HINTS_ANNOTATION`].
pub const TOPOLOGY_MODE_ANNOTATION: &str = "service.kubernetes.io/topology-mode";
/// Linkerd proxy annotation listing opaque ports: always copied to a mirror, even when
/// a Link excludes it (the local proxies must treat those ports as opaque too).
pub const OPAQUE_PORTS_ANNOTATION: &str = "config.linkerd.io/opaque-ports";

/// Label marking a local object as a mirror (value `"true"`).
pub const MIRRORED_SERVICE_LABEL: &str = "mirror.linkerd.io/mirrored-service";
/// Value of [`MIRRORED_SERVICE_LABEL`] on every mirror.
pub const MIRRORED_SERVICE_VALUE: &str = "true";
/// Label naming the link (remote cluster) a mirror belongs to.
pub const CLUSTER_NAME_LABEL: &str = "mirror.linkerd.io/cluster-name";
/// Label naming the remote gateway Service a mirror sends traffic to.
pub const REMOTE_GATEWAY_NAME_LABEL: &str = "mirror.linkerd.io/remote-gateway-name";
/// Label naming the namespace of the remote gateway Service.
pub const REMOTE_GATEWAY_NS_LABEL: &str = "mirror.linkerd.io/remote-gateway-ns";

/// Annotation on a remote Service naming its gateway; with [`GATEWAY_NS_ANNOTATION`] it marks the Service exported.
pub const GATEWAY_NAME_ANNOTATION: &str = "mirror.linkerd.io/gateway-name";
/// Annotation on a remote Service naming its gateway's namespace.
pub const GATEWAY_NS_ANNOTATION: &str = "mirror.linkerd.io/gateway-ns";
/// Annotation on a mirror: the remote Service's resourceVersion when last mirrored.
pub const REMOTE_RESOURCE_VERSION_ANNOTATION: &str = "mirror.linkerd.io/remote-resource-version";
/// Annotation on a mirror: `<name>.<ns>.svc.<domain>` of its remote Service.
pub const REMOTE_SVC_FQ_NAME_ANNOTATION: &str = "mirror.linkerd.io/remote-svc-fq-name";
/// Annotation on a mirror Service: the gateway's resourceVersion when last resolved.
pub const REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION: &str =
    "mirror.linkerd.io/remote-gateway-resource-version";

/// Annotation on the Endpoints (and slices) of a gateway mirror: the gateway's TLS
/// identity (Linkerd's gateway only admits meshed clients that know it).
pub const REMOTE_GATEWAY_IDENTITY_ANNOTATION: &str = "mirror.linkerd.io/remote-gateway-identity";
/// Annotation on a remote gateway Service giving its identity (Secret links).
pub const GATEWAY_IDENTITY_ANNOTATION: &str = "mirror.linkerd.io/gateway-identity";
/// Label on a remote-discovery mirror Service: the link's cluster name.
pub const REMOTE_DISCOVERY_LABEL: &str = "multicluster.linkerd.io/remote-discovery";
/// Label on a remote-discovery mirror Service: the remote Service's name.
pub const REMOTE_SERVICE_LABEL: &str = "multicluster.linkerd.io/remote-service";

/// Namespace of the controller whose link made a mirror (ours, not Linkerd's): scopes
/// the collection of mirrors of unlinked clusters to the controller that made them.
pub const CONTROLLER_NAMESPACE_ANNOTATION: &str = "service-mirror.io/controller-namespace";

/// Annotation on a federated Service (Linkerd's destination reads it): its remote
/// members, `<svc>@<cluster>[,...]`, sorted. The same key as [`REMOTE_DISCOVERY_LABEL`].
pub const REMOTE_DISCOVERY_ANNOTATION: &str = "multicluster.linkerd.io/remote-discovery";
/// Annotation on a federated Service: the local member's name, when there is one.
pub const LOCAL_DISCOVERY_ANNOTATION: &str = "multicluster.linkerd.io/local-discovery";
/// Label marking a federated Service (and its EndpointSlices) as ours (value `"true"`;
/// ours, not Linkerd's). With [`CONTROLLER_NAMESPACE_ANNOTATION`] naming our namespace
/// it is the ownership mark of federated objects: they have no cluster-name label (no
/// one link owns them), so no link controller ever selects them.
pub const FEDERATED_LABEL: &str = "service-mirror.linkerd.io/federated";
/// Value of [`FEDERATED_LABEL`].
pub const FEDERATED_VALUE: &str = "true";
/// Label on a federated EndpointSlice naming the member cluster it points at (ours).
pub const FEDERATED_CLUSTER_LABEL: &str = "service-mirror.linkerd.io/federated-cluster";
/// Suffix of a federated Service's name: `<svc>-federated` (Linkerd's).
pub const FEDERATED_SUFFIX: &str = "federated";
/// Linkerd's default `federatedServiceSelector` (and `--federated-service-selector`).
pub const DEFAULT_FEDERATED_SELECTOR: &str = "mirror.linkerd.io/federated=member";

/// Label selector matching every federated object of ours (Services and slices; the
/// controller namespace annotation is checked on each, see `is_owned_federated`).
pub fn federated_selector() -> String {
    format!("{FEDERATED_LABEL}={FEDERATED_VALUE}")
}

/// Label on an EndpointSlice naming the Service it belongs to (Kubernetes' own).
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label of a headless Service's EndpointSlices (and of a headless mirror's): kube-proxy
/// skips them, CoreDNS serves their per-pod hostnames.
pub const HEADLESS_SLICE_LABEL: &str = "service.kubernetes.io/headless";
/// Label of an endpoint mirror (one pod of a headless mirror): the headless mirror's name.
pub const HEADLESS_MIRROR_SVC_NAME_LABEL: &str = "mirror.linkerd.io/headless-mirror-svc-name";
/// Label on an EndpointSlice naming the controller that manages it (Kubernetes' own key).
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Our value of [`MANAGED_BY_LABEL`] (ours, not Linkerd's): never one of the built-in
/// controllers' (`endpointslice-controller.k8s.io`,
/// `endpointslicemirroring-controller.k8s.io`); a label value holds no `/`.
pub const MANAGED_BY_VALUE: &str = "service-mirror.linkerd.io";
/// kube-controller-manager's EndpointSliceMirroring value of [`MANAGED_BY_LABEL`]: the
/// slices it derives from an Endpoints without `skip-mirror` (read, never written).
pub const MIRRORING_MANAGED_BY_VALUE: &str = "endpointslicemirroring-controller.k8s.io";
/// Label on an Endpoints asking kube-controller-manager's EndpointSliceMirroring not to
/// mirror it (value `"true"`): set when we write the slices ourselves.
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";
/// Value of [`SKIP_MIRROR_LABEL`].
pub const SKIP_MIRROR_VALUE: &str = "true";

/// Name of the gateway Service port that receives cross-cluster traffic.
pub const GATEWAY_PORT_NAME: &str = "mc-gateway";
/// Name of the gateway Service port used for health probes.
pub const PROBE_PORT_NAME: &str = "mc-probe";
/// Annotation on the gateway Service: HTTP path of the health probe (e.g. `/health`).
pub const PROBE_PATH_ANNOTATION: &str = "mirror.linkerd.io/probe-path";
/// Annotation on the gateway Service: probe period in seconds.
pub const PROBE_PERIOD_ANNOTATION: &str = "mirror.linkerd.io/probe-period";

/// Secret `type` of a link registration.
pub const LINK_SECRET_TYPE: &str = "mirror.linkerd.io/remote-kubeconfig";
/// Data key of a link Secret holding the remote kubeconfig.
pub const LINK_KUBECONFIG_KEY: &str = "kubeconfig";
/// Annotation on a link Secret: the link's cluster name.
pub const LINK_CLUSTER_NAME_ANNOTATION: &str = "mirror.linkerd.io/cluster-name";
/// Annotation on a link Secret: the remote cluster's DNS domain.
pub const LINK_CLUSTER_DOMAIN_ANNOTATION: &str = "mirror.linkerd.io/remote-cluster-domain";
/// Annotation on a link Secret used only by Linkerd; accepted and ignored.
pub const LINK_L5D_NS_ANNOTATION: &str = "mirror.linkerd.io/remote-cluster-l5d-ns";
/// Remote cluster domain when the link Secret does not say.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// Label selector matching every EndpointSlice of ours for `cluster`: the mirror labels
/// and our managed-by (kube-controller-manager's mirrored slices copy the Endpoints'
/// labels, so the mirror labels alone would match them too).
pub fn slice_owner_selector(cluster: &str) -> String {
    format!(
        "{},{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}",
        owner_selector(cluster)
    )
}

/// Label selector matching kube-controller-manager's mirrored slices of the mirror
/// Service `mirror` (in its namespace).
pub fn mirrored_slice_selector(mirror: &str) -> String {
    format!("{SERVICE_NAME_LABEL}={mirror},{MANAGED_BY_LABEL}={MIRRORING_MANAGED_BY_VALUE}")
}

/// Label selector matching every mirror object of `cluster`.
pub fn owner_selector(cluster: &str) -> String {
    format!("{MIRRORED_SERVICE_LABEL}={MIRRORED_SERVICE_VALUE},{CLUSTER_NAME_LABEL}={cluster}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_selector_matches_contract() {
        assert_eq!(
            owner_selector("east"),
            "mirror.linkerd.io/mirrored-service=true,mirror.linkerd.io/cluster-name=east"
        );
    }

    #[test]
    fn slice_selector_adds_our_managed_by() {
        assert_eq!(
            slice_owner_selector("east"),
            "mirror.linkerd.io/mirrored-service=true,mirror.linkerd.io/cluster-name=east,endpointslice.kubernetes.io/managed-by=service-mirror.linkerd.io"
        );
        for builtin in [
            "endpointslice-controller.k8s.io",
            "endpointslicemirroring-controller.k8s.io",
        ] {
            assert_ne!(MANAGED_BY_VALUE, builtin);
        }
        assert!(!MANAGED_BY_VALUE.contains('/'));
    }

    #[test]
    fn mirrored_slice_selector_names_the_service_and_kcm() {
        assert_eq!(
            mirrored_slice_selector("web-east"),
            "kubernetes.io/service-name=web-east,endpointslice.kubernetes.io/managed-by=endpointslicemirroring-controller.k8s.io"
        );
    }

    #[test]
    fn wire_names_are_exact() {
        let table = [
            (MIRRORED_SERVICE_LABEL, "mirror.linkerd.io/mirrored-service"),
            (CLUSTER_NAME_LABEL, "mirror.linkerd.io/cluster-name"),
            (
                REMOTE_GATEWAY_NAME_LABEL,
                "mirror.linkerd.io/remote-gateway-name",
            ),
            (
                REMOTE_GATEWAY_NS_LABEL,
                "mirror.linkerd.io/remote-gateway-ns",
            ),
            (GATEWAY_NAME_ANNOTATION, "mirror.linkerd.io/gateway-name"),
            (GATEWAY_NS_ANNOTATION, "mirror.linkerd.io/gateway-ns"),
            (
                REMOTE_RESOURCE_VERSION_ANNOTATION,
                "mirror.linkerd.io/remote-resource-version",
            ),
            (
                REMOTE_SVC_FQ_NAME_ANNOTATION,
                "mirror.linkerd.io/remote-svc-fq-name",
            ),
            (
                REMOTE_GATEWAY_RESOURCE_VERSION_ANNOTATION,
                "mirror.linkerd.io/remote-gateway-resource-version",
            ),
            (GATEWAY_PORT_NAME, "mc-gateway"),
            (PROBE_PORT_NAME, "mc-probe"),
            (PROBE_PATH_ANNOTATION, "mirror.linkerd.io/probe-path"),
            (PROBE_PERIOD_ANNOTATION, "mirror.linkerd.io/probe-period"),
            (LINK_SECRET_TYPE, "mirror.linkerd.io/remote-kubeconfig"),
            (LINK_KUBECONFIG_KEY, "kubeconfig"),
            (
                LINK_CLUSTER_NAME_ANNOTATION,
                "mirror.linkerd.io/cluster-name",
            ),
            (
                LINK_CLUSTER_DOMAIN_ANNOTATION,
                "mirror.linkerd.io/remote-cluster-domain",
            ),
            (
                LINK_L5D_NS_ANNOTATION,
                "mirror.linkerd.io/remote-cluster-l5d-ns",
            ),
            (DEFAULT_CLUSTER_DOMAIN, "cluster.local"),
            (SERVICE_NAME_LABEL, "kubernetes.io/service-name"),
            (MANAGED_BY_LABEL, "endpointslice.kubernetes.io/managed-by"),
            (MANAGED_BY_VALUE, "service-mirror.linkerd.io"),
            (
                MIRRORING_MANAGED_BY_VALUE,
                "endpointslicemirroring-controller.k8s.io",
            ),
            (SKIP_MIRROR_LABEL, "endpointslice.kubernetes.io/skip-mirror"),
            (SVC_MIRROR_PREFIX, "mirror.linkerd.io"),
            (
                TOPOLOGY_AWARE_HINTS_ANNOTATION,
                "service.kubernetes.io/topology-aware-hints",
            ),
            (
                TOPOLOGY_MODE_ANNOTATION,
                "service.kubernetes.io/topology-mode",
            ),
            (OPAQUE_PORTS_ANNOTATION, "config.linkerd.io/opaque-ports"),
            (
                REMOTE_GATEWAY_IDENTITY_ANNOTATION,
                "mirror.linkerd.io/remote-gateway-identity",
            ),
            (
                GATEWAY_IDENTITY_ANNOTATION,
                "mirror.linkerd.io/gateway-identity",
            ),
            (
                REMOTE_DISCOVERY_LABEL,
                "multicluster.linkerd.io/remote-discovery",
            ),
            (
                REMOTE_SERVICE_LABEL,
                "multicluster.linkerd.io/remote-service",
            ),
        ];
        for (got, want) in table {
            assert_eq!(got, want);
        }
        let federated = [
            (
                REMOTE_DISCOVERY_ANNOTATION,
                "multicluster.linkerd.io/remote-discovery",
            ),
            (
                LOCAL_DISCOVERY_ANNOTATION,
                "multicluster.linkerd.io/local-discovery",
            ),
            (FEDERATED_LABEL, "service-mirror.linkerd.io/federated"),
            (FEDERATED_VALUE, "true"),
            (
                FEDERATED_CLUSTER_LABEL,
                "service-mirror.linkerd.io/federated-cluster",
            ),
            (FEDERATED_SUFFIX, "federated"),
            (
                DEFAULT_FEDERATED_SELECTOR,
                "mirror.linkerd.io/federated=member",
            ),
        ];
        for (got, want) in federated {
            assert_eq!(got, want);
        }
        assert_eq!(
            federated_selector(),
            "service-mirror.linkerd.io/federated=true"
        );
        // Federated objects must never carry a key a link controller selects on.
        assert!(!FEDERATED_LABEL.starts_with(SVC_MIRROR_PREFIX));
        assert!(!FEDERATED_CLUSTER_LABEL.starts_with(SVC_MIRROR_PREFIX));
        assert_eq!(MIRROR_PREFIX, format!("{SVC_MIRROR_PREFIX}/"));
    }
}
