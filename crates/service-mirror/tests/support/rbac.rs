//! The controller as it is installed: `service-mirror install` applied to the local
//! cluster, and the real binary running with the token of its ServiceAccount (not the
//! admin kubeconfig that `controller::Controller` uses).
#![allow(dead_code)]

use super::controller::service_mirror;
use local_cluster::{Kubeconfig, LocalCluster, apply_yaml, parse_documents};

/// Name of the controller's ServiceAccount in the install manifests.
pub(crate) const SERVICE_ACCOUNT: &str = "service-mirror";

/// The objects printed by `service-mirror install --namespace <namespace>` (and `extra`).
pub(crate) fn install_documents(namespace: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["install", "--namespace", namespace, "-o", "json"];
    args.extend_from_slice(extra);
    let run = service_mirror(&args);
    assert!(run.ok, "install failed: {}", run.stderr);
    parse_documents(&run.stdout).expect("install prints Kubernetes objects")
}

/// Applies `docs` (as one JSON `List`) to `cluster` as its admin; returns the applied
/// `Kind/namespace/name` lines.
pub(crate) async fn apply_documents(
    cluster: &LocalCluster,
    docs: &[serde_json::Value],
) -> Vec<String> {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
    let admin = cluster.client().await.unwrap();
    apply_yaml(&admin, &list.to_string())
        .await
        .expect("apply the manifests")
}

/// Applies `docs` (install manifests for `namespace`, possibly edited) and returns a
/// token kubeconfig of the controller's ServiceAccount.
pub(crate) async fn install(
    cluster: &LocalCluster,
    namespace: &str,
    docs: &[serde_json::Value],
) -> Kubeconfig {
    apply_documents(cluster, docs).await;
    cluster
        .service_account_kubeconfig(namespace, SERVICE_ACCOUNT)
        .await
        .expect("token of the controller's ServiceAccount")
}

/// The controller process wrapper, shared with the other tests.
pub(crate) use super::controller::Controller as RunningController;

/// Removes `verb` on `group`/`resource` from the rules of the `kind` (`ClusterRole` or
/// `Role`) in `docs`, keeping every other verb and resource of the rule that held it.
pub(crate) fn remove_verb(
    docs: &mut [serde_json::Value],
    kind: &str,
    group: &str,
    resource: &str,
    verb: &str,
) {
    let role = docs
        .iter_mut()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the manifests"));
    let rules = role["rules"].as_array_mut().expect("rules");
    let mut split = Vec::new();
    let mut found = false;
    for rule in rules.iter_mut() {
        let groups = rule["apiGroups"].as_array().expect("apiGroups");
        assert_eq!(groups.len(), 1, "one API group per rule: {rule}");
        if groups[0] != group {
            continue;
        }
        let verbs: Vec<serde_json::Value> = rule["verbs"]
            .as_array()
            .expect("verbs")
            .iter()
            .filter(|v| *v != verb)
            .cloned()
            .collect();
        let resources = rule["resources"].as_array_mut().expect("resources");
        let before = resources.len();
        resources.retain(|r| r != resource);
        if resources.len() == before {
            continue;
        }
        found = true;
        if !verbs.is_empty() {
            split.push(serde_json::json!({
                "apiGroups": [group],
                "resources": [resource],
                "verbs": verbs,
            }));
        }
    }
    assert!(
        found,
        "{kind} has no rule for {resource} in group {group:?}"
    );
    rules.retain(|r| r["resources"].as_array().is_some_and(|a| !a.is_empty()));
    rules.extend(split);
}
