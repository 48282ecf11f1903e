//! The local permissions the controller needs, in one place: `service-mirror install`
//! grants exactly these, and `service-mirror run` checks them at startup with
//! SelfSubjectAccessReviews so that a missing one is named in the log instead of
//! showing up later as failing reconciles.
//!
//! What uses them:
//!
//! | resource | verbs | used by |
//! |---|---|---|
//! | `services`, `endpoints` (all namespaces) | get, list, watch, create, update, delete | the link controllers' caches (list, watch) and the writer (create; `get` when a create finds the name taken; `update` is a replace with the cached resourceVersion; delete) |
//! | `discovery.k8s.io` `endpointslices` (all namespaces) | get, list, watch, create, update, delete | our EndpointSlices: cached, written, and in every mode deleted after a switch or an unlink (`get`: a create that finds the name taken checks whose it is; no `patch`) |
//! | `namespaces` | create | the writer creates a missing namespace for a mirror (a create that finds it there is a 409: no read needed) |
//! | `events.k8s.io` `events` (all namespaces) | create, patch | Events on link Secrets and on objects that hold a mirror's name (`patch` updates a repeated Event's series) |
//! | `secrets` (controller namespace only) | list, watch | the link Secrets, read through one watch (never one by one) |
//! | `coordination.k8s.io` `leases` (controller namespace only) | get, list, create, update, patch, delete | leader election (HA: get, create, patch); the per-link write Leases `service-mirror-write-<cluster>` (get, create, update; `delete`: on unlink, only those labelled ours); with `--shard-links`, the member Leases `service-mirror-member-<identity>` (get, create, update, delete) and one `list` of our Leases (labelled ours) per pass; no Lease is watched |
//! | `multicluster.linkerd.io` `links` (controller namespace only) | get, list, watch | Linkerd `Link` resources, a second link source ([`LINK_RULES`]; `get`: the status writer reads the Link's current status first) |
//! | `multicluster.linkerd.io` `links/status` (controller namespace only) | patch | the Links' status |
//! | `multicluster.x-k8s.io` `clusterprofiles` (controller namespace only) | list, watch | `ClusterProfile`s as a link source ([`CLUSTER_PROFILE_RULES`]; read only with `--link-source` `cluster-profiles` or `all`; `list` also confirms a deleted one is gone before its mirrors are) |
//! | `multicluster.x-k8s.io` `clusterprofiles/status` (controller namespace only) | patch | our one condition `service-mirror.io/Linked` (server-side apply; the cluster manager's conditions are not ours) |
//! | `multicluster.x-k8s.io` `serviceexports` (all namespaces) | list, watch | the MCS component's reader of local ServiceExports ([`MCS_RULES`]; where MCS runs only) |
//! | `multicluster.x-k8s.io` `serviceexports/status` (all namespaces) | patch | the local exports' `Valid`, `Ready` and `Conflict` conditions (server-side apply) |
//! | `multicluster.x-k8s.io` `serviceimports` (all namespaces) | list, watch, create, update, delete | the local ServiceImports: cached (all, so a foreign one is seen and left alone), created, replaced with the cached resourceVersion, deleted with the last export (uid and resourceVersion preconditions) |
//! | `multicluster.x-k8s.io` `serviceimports/status` (all namespaces) | patch | an import's `status.clusters` (a merge patch with the resourceVersion) |
//! | `about.k8s.io` `clusterproperties` (cluster-scoped) | get | the start reads the ClusterProperty `id.k8s.io` for the cluster's MCS name when `--mcs-cluster-name` is empty (one `get`, never listed) |
//! | `networking.k8s.io` `servicecidrs` (cluster-scoped) | list, watch | the local service CIDRs, refused as gateway addresses with no flag ([`LOCAL_NETWORK_RULES`]; without it only the `kubernetes` Service's ClusterIP is) |
//! | `nodes` (cluster-scoped) | list, watch | the local pod CIDRs (`spec.podCIDRs`), refused as gateway addresses with no flag (without it they are not) |

//!
//! The derived Services of the imports are Services: the `services` rule covers them.
//!
//! The `Link` credentials Secrets are covered by the `secrets` rule: same namespace,
//! same type (`mirror.linkerd.io/remote-kubeconfig`), only without the cluster-name
//! annotation.
//!
//! `links/status` takes `patch`, not `update`: a status write sends the status alone
//! (a merge patch; with `metadata.resourceVersion` in the body when it must not
//! overwrite a newer one), not the whole Link back, so its bytes do not grow with the
//! spec; and it is the verb Linkerd's own Roles grant, so one Role serves either
//! controller.
//!
//! Each verb is proven needed by removal (tests/least_privilege.rs: without it a
//! lifecycle step fails); the verbs the contract lists beyond these (`patch` on Services
//! and Endpoints, `get`/`list`/`watch` on Namespaces) and `get` on Secrets, `list`/`watch`
//! on Leases are not granted: no request of the controller uses them (RELIABILITY.md,
//! "Least privilege").
//!
//! The Link permissions are optional at startup: without the Link CRD (a cluster with
//! Secret links only) they are not checked at all, and where the CRD is served a
//! missing one is reported as breaking Link links only.

use futures::StreamExt;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use std::fmt;
use std::time::Duration;

mod check;
pub use check::*;

/// One RBAC rule: `verbs` on `resources` of API group `group` (`""` is the core group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// Resources (plural names; `plural/subresource` for a subresource).
    pub resources: &'static [&'static str],
    /// Verbs allowed on each of them.
    pub verbs: &'static [&'static str],
}

/// Rules granted cluster-wide (ClusterRole): mirrors live in any namespace.
pub const CLUSTER_RULES: &[Rule] = &[
    Rule {
        group: "",
        resources: &["services", "endpoints"],
        verbs: &["get", "list", "watch", "create", "update", "delete"],
    },
    // Every mode needs all of them: `endpoints` mode still watches and deletes the slices
    // `both` left, and creates them again on the way back.
    Rule {
        group: "discovery.k8s.io",
        resources: &["endpointslices"],
        verbs: &["get", "list", "watch", "create", "update", "delete"],
    },
    Rule {
        group: "",
        resources: &["namespaces"],
        verbs: &["create"],
    },
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
    },
];

/// Rules granted only in the controller's own namespace (Role).
pub const NAMESPACE_RULES: &[Rule] = &[
    Rule {
        group: "",
        resources: &["secrets"],
        verbs: &["list", "watch"],
    },
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "list", "create", "update", "patch", "delete"],
    },
];

/// Rules for Linkerd `Link` resources, granted in the controller's namespace (in the
/// same Role as [`NAMESPACE_RULES`]) but needed only where the Link CRD is served.
pub const LINK_RULES: &[Rule] = &[
    Rule {
        group: "multicluster.linkerd.io",
        resources: &["links"],
        verbs: &["get", "list", "watch"],
    },
    Rule {
        group: "multicluster.linkerd.io",
        resources: &["links/status"],
        verbs: &["patch"],
    },
];

/// Rules for `ClusterProfile`s (KEP-4322) as a link source, granted in the controller's
/// namespace (in the same Role as [`NAMESPACE_RULES`]) but needed only where that
/// source is enabled (`--link-source` `cluster-profiles` or `all`). No `get`: the
/// profiles come from one watch, and our condition is a server-side apply.
pub const CLUSTER_PROFILE_RULES: &[Rule] = &[
    Rule {
        group: "multicluster.x-k8s.io",
        resources: &["clusterprofiles"],
        verbs: &["list", "watch"],
    },
    Rule {
        group: "multicluster.x-k8s.io",
        resources: &["clusterprofiles/status"],
        verbs: &["patch"],
    },
];

/// Rules of the Multi-Cluster Services API, granted cluster-wide (in the same
/// ClusterRole as [`CLUSTER_RULES`]: exports live in any namespace) but needed only
/// where MCS runs (`--mcs`), so checked only then (`get clusterproperties` by the start
/// itself, which needs it only to learn the cluster's name). Services are read under
/// [`CLUSTER_RULES`].
pub const MCS_RULES: &[Rule] = &[
    Rule {
        group: service_mirror_core::mcs::GROUP,
        resources: &["serviceexports"],
        verbs: &["list", "watch"],
    },
    Rule {
        group: service_mirror_core::mcs::GROUP,
        resources: &["serviceexports/status"],
        verbs: &["patch"],
    },
    Rule {
        group: service_mirror_core::mcs::GROUP,
        resources: &["serviceimports"],
        verbs: &["list", "watch", "create", "update", "delete"],
    },
    Rule {
        group: service_mirror_core::mcs::GROUP,
        resources: &["serviceimports/status"],
        verbs: &["patch"],
    },
    Rule {
        group: crate::mcs::startup::ABOUT_GROUP,
        resources: &["clusterproperties"],
        verbs: &["get"],
    },
];

/// Reads of the local cluster's own networks, granted cluster-wide (in the same
/// ClusterRole as [`CLUSTER_RULES`]): the gateway address policy refuses gateway
/// addresses in the local service and pod CIDRs with no flag
/// (`crate::local_networks`), so that a remote cannot aim local clients at the local
/// apiserver's ClusterIP, a local Service or a pod. The `kubernetes` Service in
/// `default` (the fallback) is read under [`CLUSTER_RULES`]' `services`. Without them
/// the controller runs, refusing less: the startup check reports them as a degraded
/// feature, not an error.
pub const LOCAL_NETWORK_RULES: &[Rule] = &[
    Rule {
        group: "networking.k8s.io",
        resources: &["servicecidrs"],
        verbs: &["list", "watch"],
    },
    Rule {
        group: "",
        resources: &["nodes"],
        verbs: &["list", "watch"],
    },
];

/// One permission: a verb on a resource, cluster-wide or in one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    /// The verb (`get`, `create`, ...).
    pub verb: String,
    /// API group (`""` for the core group).
    pub group: String,
    /// Resource (plural name; `plural/subresource` for a subresource).
    pub resource: String,
    /// `None`: in every namespace; `Some(ns)`: in namespace `ns` only.
    pub namespace: Option<String>,
}

impl fmt::Display for Permission {
    /// `create services (cluster-wide)`, `watch secrets in namespace linkerd-multicluster`,
    /// `create events.events.k8s.io (cluster-wide)` (kubectl's `resource.group` form).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        match &self.namespace {
            None => write!(f, " (cluster-wide)"),
            Some(ns) => write!(f, " in namespace {ns}"),
        }
    }
}

fn expand(rules: &[Rule], namespace: Option<&str>) -> impl Iterator<Item = Permission> {
    rules.iter().flat_map(move |rule| {
        rule.resources.iter().flat_map(move |resource| {
            rule.verbs.iter().map(move |verb| Permission {
                verb: verb.to_string(),
                group: rule.group.to_string(),
                resource: resource.to_string(),
                namespace: namespace.map(str::to_string),
            })
        })
    })
}

/// Every permission the controller running in `namespace` needs, one per verb and
/// resource: the cluster-wide ones, then those in `namespace`.
pub fn required_permissions(namespace: &str) -> Vec<Permission> {
    expand(CLUSTER_RULES, None)
        .chain(expand(NAMESPACE_RULES, Some(namespace)))
        .collect()
}

/// The permissions of [`LINK_RULES`] in `namespace`: needed only to serve `Link`
/// resources, so checked only where their CRD is served.
pub fn link_permissions(namespace: &str) -> Vec<Permission> {
    expand(LINK_RULES, Some(namespace)).collect()
}

/// The permissions of [`CLUSTER_PROFILE_RULES`] in `namespace`: needed only where
/// ClusterProfiles are a link source.
pub fn cluster_profile_permissions(namespace: &str) -> Vec<Permission> {
    expand(CLUSTER_PROFILE_RULES, Some(namespace)).collect()
}

/// The permissions of [`MCS_RULES`]: needed only where MCS runs.
pub fn mcs_permissions() -> Vec<Permission> {
    expand(MCS_RULES, None).collect()
}

/// The permissions of [`LOCAL_NETWORK_RULES`]: without them less is refused.
pub fn local_network_permissions() -> Vec<Permission> {
    expand(LOCAL_NETWORK_RULES, None).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(namespace: &str) -> Vec<String> {
        required_permissions(namespace)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn permissions_read_as_verb_resource_and_scope() {
        let all = lines("mc");
        assert!(all.contains(&"create services (cluster-wide)".to_string()));
        assert!(all.contains(&"delete endpoints (cluster-wide)".to_string()));
        assert!(all.contains(&"create namespaces (cluster-wide)".to_string()));
        assert!(all.contains(&"delete endpointslices.discovery.k8s.io (cluster-wide)".to_string()));
        assert!(all.contains(&"patch events.events.k8s.io (cluster-wide)".to_string()));
        assert!(all.contains(&"watch secrets in namespace mc".to_string()));
        assert!(!all.contains(&"patch services (cluster-wide)".to_string()));
        assert!(all.contains(&"update leases.coordination.k8s.io in namespace mc".to_string()));
    }

    #[test]
    fn one_permission_per_verb_and_resource_without_duplicates() {
        let all = required_permissions("mc");
        // services + endpoints: 6 verbs each; endpointslices 6; namespaces 1; events 2;
        // secrets 2; leases 6.
        assert_eq!(all.len(), 12 + 6 + 1 + 2 + 2 + 6);
        let mut unique = all.clone();
        unique.sort_by_key(ToString::to_string);
        unique.dedup();
        assert_eq!(unique.len(), all.len());
    }

    #[test]
    fn secrets_and_leases_are_only_asked_in_the_namespace() {
        for p in required_permissions("mc") {
            let namespaced = matches!(p.resource.as_str(), "secrets" | "leases");
            assert_eq!(p.namespace.is_some(), namespaced, "{p}");
            if namespaced {
                assert_eq!(p.namespace.as_deref(), Some("mc"));
            }
        }
    }

    #[test]
    fn link_permissions_are_read_watch_and_status_patch_in_the_namespace_only() {
        let got: Vec<String> = link_permissions("mc")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            [
                "get links.multicluster.linkerd.io in namespace mc",
                "list links.multicluster.linkerd.io in namespace mc",
                "watch links.multicluster.linkerd.io in namespace mc",
                "patch links/status.multicluster.linkerd.io in namespace mc",
            ]
        );
    }

    #[test]
    fn local_network_permissions_are_cluster_wide_reads_apart_from_the_required_ones() {
        let got: Vec<String> = local_network_permissions()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            [
                "list servicecidrs.networking.k8s.io (cluster-wide)",
                "watch servicecidrs.networking.k8s.io (cluster-wide)",
                "list nodes (cluster-wide)",
                "watch nodes (cluster-wide)",
            ]
        );
        let required = required_permissions("mc");
        for p in local_network_permissions() {
            assert!(
                !required.contains(&p),
                "{p}: a degraded feature, not required"
            );
        }
    }

    #[test]
    fn link_permissions_are_not_among_the_required_ones() {
        // A cluster without the Link CRD must not report them as missing.
        let required = required_permissions("mc");
        for p in link_permissions("mc") {
            assert!(!required.contains(&p), "{p}");
        }
    }

    #[test]
    fn link_rules_name_the_resource_the_link_type_uses() {
        use kube::Resource;
        let plural = crate::links::LinkResource::plural(&());
        let group = crate::links::LinkResource::group(&());
        for rule in LINK_RULES {
            assert_eq!(rule.group, group);
            for r in rule.resources {
                assert!(r == &plural || *r == format!("{plural}/status"), "{r}");
            }
        }
    }

    #[test]
    fn nothing_beyond_the_contract() {
        // The contract's local permissions, and nothing more (least privilege).
        let mut got: Vec<(String, String, String)> = required_permissions("mc")
            .into_iter()
            .map(|p| (p.group, p.resource, p.verb))
            .collect();
        got.sort();
        let mut want = Vec::new();
        // No `patch`: every write is a create, a replace (update) or a delete.
        for r in ["services", "endpoints"] {
            for v in ["get", "list", "watch", "create", "update", "delete"] {
                want.push((String::new(), r.to_string(), v.to_string()));
            }
        }
        for v in ["get", "list", "watch", "create", "update", "delete"] {
            want.push(("discovery.k8s.io".into(), "endpointslices".into(), v.into()));
        }
        want.push((String::new(), "namespaces".into(), "create".into()));
        for v in ["create", "patch"] {
            want.push(("events.k8s.io".into(), "events".into(), v.into()));
        }
        for v in ["list", "watch"] {
            want.push((String::new(), "secrets".into(), v.into()));
        }
        // `delete`: the write Lease of an unlinked cluster (write_leases.rs); `list`: the
        // sharded replicas' one read of our Leases per pass; no watch.
        for v in ["get", "list", "create", "update", "patch", "delete"] {
            want.push(("coordination.k8s.io".into(), "leases".into(), v.into()));
        }
        want.sort();
        assert_eq!(got, want);
    }
}
