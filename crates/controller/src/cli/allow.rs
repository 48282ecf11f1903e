//! `service-mirror allow`: the manifests to apply on a remote cluster so that a mirror
//! may read its Services, and nothing else.
//!
//! ```text
//! service-mirror allow | kubectl --context east apply -f -
//! ```
//!
//! It prints a Namespace, a ServiceAccount, a ClusterRole allowing only `list` and
//! `watch` on `services` (and on `endpointslices`), the ClusterRoleBinding granting it to the account, and a
//! `kubernetes.io/service-account-token` Secret `<account>-token` that the cluster's
//! token controller fills with a long-lived token (`service-mirror link` reads it).
//!
//! `--linkerd-destination` adds what Linkerd's destination controller reads through the
//! same credentials (the destination credentials Secret of `link --format link`): it
//! asks for `list pods` cluster-wide before it adds the cluster
//! (pkg/k8s/authz.go `ClusterAccess`), then watches EndpointSlices (or Endpoints),
//! Pods, Services, `policy.linkerd.io` Servers and ReplicaSets
//! (controller/api/destination/watcher/cluster_store.go).

use super::args::OutputArgs;
use super::manifest::{MANAGED_BY, MANAGED_BY_LABEL};
use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::ObjectMeta;
use service_mirror_core::naming::{MAX_SUBDOMAIN_LEN, is_dns1123_label, is_dns1123_subdomain};
use std::collections::BTreeMap;

/// Default name of the remote ServiceAccount (Linkerd's name, so both tools agree).
pub const DEFAULT_SERVICE_ACCOUNT: &str = "linkerd-service-mirror-remote-access-default";
/// Default namespace of the remote ServiceAccount.
pub use super::manifest::DEFAULT_NAMESPACE;
/// Secret `type` of a ServiceAccount token Secret filled by the token controller.
pub const SERVICE_ACCOUNT_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";
/// Annotation naming the ServiceAccount a token Secret is for.
pub const SERVICE_ACCOUNT_NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";

/// Arguments of `allow`.
#[derive(Debug, clap::Args)]
pub struct AllowArgs {
    /// Name of the ServiceAccount the mirror authenticates as on this (remote) cluster.
    #[arg(
        long,
        env = "SERVICE_MIRROR_SERVICE_ACCOUNT_NAME",
        default_value = DEFAULT_SERVICE_ACCOUNT
    )]
    pub service_account_name: String,
    /// Namespace of the ServiceAccount and of its token Secret (created if missing).
    #[arg(
        long,
        env = "SERVICE_MIRROR_REMOTE_NAMESPACE",
        default_value = DEFAULT_NAMESPACE
    )]
    pub namespace: String,
    /// Also grant what Linkerd's destination controller reads on this cluster for
    /// remote-discovery and federated Services (list and watch of Pods, Endpoints,
    /// ReplicaSets and Linkerd's Servers besides the mirror's reads).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub linkerd_destination: bool,
    /// How the manifests are printed.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Name of the token Secret of ServiceAccount `service_account`.
pub fn token_secret_name(service_account: &str) -> String {
    format!("{service_account}-token")
}

/// Name of the ClusterRole and ClusterRoleBinding of `namespace/service_account`: one
/// pair per account, so that two accounts never share (and overwrite) a binding.
pub fn cluster_role_name(namespace: &str, service_account: &str) -> String {
    format!("service-mirror:{namespace}:{service_account}")
}

/// The only permissions a mirror needs on a remote cluster: list and watch its Services,
/// its EndpointSlices (a `Link`'s mirrors follow whether the remote Service has
/// ready endpoints, as Linkerd's do; Secret links never read them), and its
/// ServiceExports (read where the local controller runs MCS). No `get`: the
/// controller reads the remote through its watches only (tests/least_privilege.rs).
pub fn remote_access_rules() -> Vec<PolicyRule> {
    vec![
        PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["services".into()]),
            verbs: vec!["list".into(), "watch".into()],
            ..Default::default()
        },
        PolicyRule {
            api_groups: Some(vec!["discovery.k8s.io".into()]),
            resources: Some(vec!["endpointslices".into()]),
            verbs: vec!["list".into(), "watch".into()],
            ..Default::default()
        },
        PolicyRule {
            api_groups: Some(vec![service_mirror_core::mcs::GROUP.into()]),
            resources: Some(vec!["serviceexports".into()]),
            verbs: vec!["list".into(), "watch".into()],
            ..Default::default()
        },
    ]
}

/// What Linkerd's destination controller reads on a linked cluster beyond
/// [`remote_access_rules`]: Pods (its `list pods` access check, then a watch),
/// Endpoints (its watch without EndpointSlices), ReplicaSets (metadata, for owner
/// names) and `policy.linkerd.io` Servers (protocol hints). Services and EndpointSlices
/// are in [`remote_access_rules`] already. Linkerd's own remote role also grants `get`
/// and Jobs, which its destination does not read.
pub fn linkerd_destination_rules() -> Vec<PolicyRule> {
    let read = |group: &str, resources: &[&str]| PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: vec!["list".into(), "watch".into()],
        ..Default::default()
    };
    vec![
        read("", &["pods", "endpoints"]),
        read("apps", &["replicasets"]),
        read("policy.linkerd.io", &["servers"]),
    ]
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    let labels = BTreeMap::from([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())]);
    super::manifest::meta(name, namespace, labels)
}

/// The remote-side manifests, in apply order: Namespace, ServiceAccount, ClusterRole,
/// ClusterRoleBinding and the ServiceAccount token Secret `<service_account>-token`.
pub fn allow_manifests(namespace: &str, service_account: &str) -> Vec<serde_json::Value> {
    allow_manifests_with(namespace, service_account, false)
}

/// [`allow_manifests`], the ClusterRole also granting [`linkerd_destination_rules`]
/// with `linkerd_destination`.
pub fn allow_manifests_with(
    namespace: &str,
    service_account: &str,
    linkerd_destination: bool,
) -> Vec<serde_json::Value> {
    let mut rules = remote_access_rules();
    if linkerd_destination {
        rules.extend(linkerd_destination_rules());
    }
    let role = cluster_role_name(namespace, service_account);
    let ns = Namespace {
        metadata: meta(namespace, None),
        ..Default::default()
    };
    let sa = ServiceAccount {
        metadata: meta(service_account, Some(namespace)),
        ..Default::default()
    };
    let cluster_role = ClusterRole {
        metadata: meta(&role, None),
        rules: Some(rules),
        ..Default::default()
    };
    let binding = ClusterRoleBinding {
        metadata: meta(&role, None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: service_account.to_string(),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        }]),
    };
    let mut token_meta = meta(&token_secret_name(service_account), Some(namespace));
    token_meta.annotations = Some(BTreeMap::from([(
        SERVICE_ACCOUNT_NAME_ANNOTATION.to_string(),
        service_account.to_string(),
    )]));
    let token = Secret {
        metadata: token_meta,
        type_: Some(SERVICE_ACCOUNT_TOKEN_TYPE.into()),
        data: None::<BTreeMap<String, ByteString>>,
        ..Default::default()
    };
    [
        serde_json::to_value(ns),
        serde_json::to_value(sa),
        serde_json::to_value(cluster_role),
        serde_json::to_value(binding),
        serde_json::to_value(token),
    ]
    .into_iter()
    .map(|v| v.expect("Kubernetes objects serialise to JSON"))
    .collect()
}

/// Checks a name against the DNS-1123 label rule (Namespace names).
fn check_label(what: &str, name: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        is_dns1123_label(name),
        "{what} {name:?} is not a valid name: use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
    );
    Ok(())
}

/// Checks a name against the DNS-1123 subdomain rule (ServiceAccount names), leaving
/// room for the `-token` suffix of its Secret.
fn check_subdomain(what: &str, name: &str) -> anyhow::Result<()> {
    let ok = is_dns1123_subdomain(name) && name.len() + "-token".len() <= MAX_SUBDOMAIN_LEN;
    anyhow::ensure!(
        ok,
        "{what} {name:?} is not a valid name: use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    );
    Ok(())
}

/// Checks the namespace and ServiceAccount names given to `allow` or `link`.
pub fn check_names(namespace: &str, service_account: &str) -> anyhow::Result<()> {
    check_label("namespace", namespace)?;
    check_subdomain("service account name", service_account)
}

/// Prints the remote-side manifests.
pub fn run(args: AllowArgs) -> anyhow::Result<()> {
    check_names(&args.namespace, &args.service_account_name)?;
    args.output
        .print(&allow_manifests_with(
            &args.namespace,
            &args.service_account_name,
            args.linkerd_destination,
        ))
        .context("printing the manifests")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::output::OutputFormat;
    use serde_json::json;

    fn by_kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
        let found: Vec<_> = docs.iter().filter(|d| d["kind"] == kind).collect();
        assert_eq!(found.len(), 1, "exactly one {kind}");
        found[0]
    }

    #[test]
    fn linkerd_destination_adds_only_reads_of_what_the_destination_watches() {
        let plain = allow_manifests("mc", "reader");
        let with = allow_manifests_with("mc", "reader", true);
        let rules = |docs: &[serde_json::Value]| by_kind(docs, "ClusterRole")["rules"].clone();
        assert_eq!(allow_manifests_with("mc", "reader", false), plain);
        let added: Vec<serde_json::Value> =
            rules(&with).as_array().unwrap()[rules(&plain).as_array().unwrap().len()..].to_vec();
        assert_eq!(
            added,
            [
                json!({"apiGroups": [""], "resources": ["pods", "endpoints"], "verbs": ["list", "watch"]}),
                json!({"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["list", "watch"]}),
                json!({"apiGroups": ["policy.linkerd.io"], "resources": ["servers"], "verbs": ["list", "watch"]}),
            ]
        );
        for doc in &with {
            if doc["kind"] != "ClusterRole" {
                assert!(plain.contains(doc), "only the ClusterRole differs: {doc}");
            }
        }
    }

    #[test]
    fn manifests_come_in_apply_order() {
        let docs = allow_manifests("mc", "reader");
        let kinds: Vec<_> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "Namespace",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Secret"
            ]
        );
        for d in &docs {
            assert!(d["apiVersion"].is_string(), "{d}");
            assert!(d["metadata"]["name"].is_string(), "{d}");
        }
    }

    #[test]
    fn cluster_role_allows_only_reading_services_endpointslices_and_serviceexports() {
        let docs = allow_manifests("mc", "reader");
        let role = by_kind(&docs, "ClusterRole");
        assert_eq!(role["apiVersion"], "rbac.authorization.k8s.io/v1");
        assert_eq!(
            role["rules"],
            json!([
                {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
                {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceexports"], "verbs": ["list", "watch"]}
            ])
        );
        assert!(role.get("aggregationRule").is_none());
    }

    #[test]
    fn binding_grants_the_role_to_the_account_only() {
        let docs = allow_manifests("mc", "reader");
        let role = by_kind(&docs, "ClusterRole");
        let binding = by_kind(&docs, "ClusterRoleBinding");
        assert_eq!(
            binding["roleRef"],
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]})
        );
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "reader", "namespace": "mc"}])
        );
    }

    #[test]
    fn account_and_token_secret_live_in_the_namespace() {
        let docs = allow_manifests("mc", "reader");
        assert_eq!(by_kind(&docs, "Namespace")["metadata"]["name"], "mc");
        let sa = by_kind(&docs, "ServiceAccount");
        assert_eq!(sa["metadata"]["name"], "reader");
        assert_eq!(sa["metadata"]["namespace"], "mc");
        let secret = by_kind(&docs, "Secret");
        assert_eq!(secret["metadata"]["name"], "reader-token");
        assert_eq!(secret["metadata"]["namespace"], "mc");
        assert_eq!(secret["type"], "kubernetes.io/service-account-token");
        assert_eq!(
            secret["metadata"]["annotations"],
            json!({"kubernetes.io/service-account.name": "reader"})
        );
        assert!(
            secret.get("data").is_none(),
            "the token controller fills it"
        );
    }

    #[test]
    fn two_namespaces_never_share_a_binding() {
        let a = allow_manifests("a", "reader");
        let b = allow_manifests("b", "reader");
        assert_ne!(
            by_kind(&a, "ClusterRoleBinding")["metadata"]["name"],
            by_kind(&b, "ClusterRoleBinding")["metadata"]["name"]
        );
    }

    #[test]
    fn default_names_are_linkerds() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: AllowArgs,
        }
        let args = Cli::try_parse_from(["allow"]).unwrap().args;
        assert_eq!(
            args.service_account_name,
            "linkerd-service-mirror-remote-access-default"
        );
        assert_eq!(args.namespace, "linkerd-multicluster");
        assert_eq!(args.output.output, OutputFormat::Yaml);
        let args = Cli::try_parse_from(["allow", "-o", "json", "--namespace", "x"])
            .unwrap()
            .args;
        assert_eq!(args.output.output, OutputFormat::Json);
        assert_eq!(args.namespace, "x");
    }

    #[test]
    fn bad_names_are_refused_with_a_clear_message() {
        check_names("linkerd-multicluster", "a.b-c").unwrap();
        let err = check_names("Bad_NS", "reader").unwrap_err().to_string();
        assert!(
            err.contains("namespace \"Bad_NS\" is not a valid name"),
            "{err}"
        );
        let err = check_names("ok", "-x").unwrap_err().to_string();
        assert!(err.contains("service account name"), "{err}");
    }
}
