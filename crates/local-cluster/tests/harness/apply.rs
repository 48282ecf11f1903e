//! `apply_yaml` and `fill_token_secret` on a real apiserver.

use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{Api, ObjectMeta, PostParams};
use local_cluster::{apply_yaml, shared_cluster, unique_namespace};
use std::collections::BTreeMap;

fn manifests(ns: &str, value: &str) -> String {
    format!(
        "apiVersion: v1
kind: Namespace
metadata:
  name: {ns}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: {ns}
data:
  colour: \"{value}\"
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: reader
  namespace: {ns}
rules:
- apiGroups: [\"\"]
  resources: [configmaps]
  verbs: [get, list]
"
    )
}

#[tokio::test]
async fn multi_document_yaml_is_applied_idempotently() {
    let cluster = shared_cluster("east").await.expect("cluster");
    let client = cluster.client().await.unwrap();
    let ns = unique_namespace("apply");

    let first = apply_yaml(&client, &manifests(&ns, "blue")).await.unwrap();
    assert_eq!(
        first,
        [
            format!("Namespace/{ns}"),
            format!("ConfigMap/{ns}/settings"),
            format!("Role/{ns}/reader"),
        ]
    );
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("settings")
        .await
        .unwrap();
    let rv = cm.metadata.resource_version.clone();

    // Same again: nothing changes, not even the resourceVersion.
    let second = apply_yaml(&client, &manifests(&ns, "blue")).await.unwrap();
    assert_eq!(first, second);
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("settings")
        .await
        .unwrap();
    assert_eq!(
        cm.metadata.resource_version, rv,
        "a no-op apply writes nothing"
    );
    assert_eq!(cm.data.unwrap()["colour"], "blue");
    let managers: Vec<_> = cm
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.iter().any(|m| m == "local-cluster"),
        "{managers:?}"
    );

    // A change is applied.
    apply_yaml(&client, &manifests(&ns, "green")).await.unwrap();
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("settings")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["colour"], "green");

    Api::<Namespace>::all(client.clone())
        .get(&ns)
        .await
        .unwrap();
    let role = Api::<Role>::namespaced(client.clone(), &ns)
        .get("reader")
        .await
        .unwrap();
    let rules = role.rules.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["configmaps".to_string()][..])
    );
    assert_eq!(rules[0].verbs, ["get", "list"]);
}

#[tokio::test]
async fn json_list_is_applied() {
    let cluster = shared_cluster("east").await.expect("cluster");
    let client = cluster.client().await.unwrap();
    let ns = unique_namespace("apply-json");
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns}, "data": {"a": "b"}},
        ],
    });
    let applied = apply_yaml(&client, &list.to_string()).await.unwrap();
    assert_eq!(
        applied,
        [format!("Namespace/{ns}"), format!("ConfigMap/{ns}/c")]
    );
    Api::<ConfigMap>::namespaced(client, &ns)
        .get("c")
        .await
        .unwrap();
}

#[tokio::test]
async fn unknown_kinds_are_reported() {
    let cluster = shared_cluster("east").await.expect("cluster");
    let client = cluster.client().await.unwrap();
    let err = apply_yaml(
        &client,
        "apiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g}\n",
    )
    .await
    .unwrap_err();
    assert!(matches!(err, local_cluster::Error::Manifest(_)), "{err}");
    assert!(err.to_string().contains("example.com/v1/Gadget"), "{err}");
}

#[tokio::test]
async fn token_secret_is_filled_with_a_working_token() {
    let cluster = shared_cluster("east").await.expect("cluster");
    let client = cluster.client().await.unwrap();
    let ns = unique_namespace("token");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.clone()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some("robot".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("robot-token".into()),
                    annotations: Some(BTreeMap::from([(
                        "kubernetes.io/service-account.name".to_string(),
                        "robot".to_string(),
                    )])),
                    ..Default::default()
                },
                type_: Some("kubernetes.io/service-account-token".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();

    cluster.fill_token_secret(&ns, "robot-token").await.unwrap();

    let data = secrets.get("robot-token").await.unwrap().data.unwrap();
    assert_eq!(data["ca.crt"].0, cluster.ca_pem().as_bytes());
    assert_eq!(data["namespace"].0, ns.as_bytes());
    let token = String::from_utf8(data["token"].0.clone()).unwrap();
    assert!(!token.is_empty());

    // The token authenticates as the account (which may do nothing: 403, not 401).
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
        cluster.server_url(),
        base64::engine::general_purpose::STANDARD.encode(cluster.ca_pem()),
    );
    let robot = local_cluster::client_from_yaml(&yaml).await.unwrap();
    let err = Api::<ConfigMap>::namespaced(robot, &ns)
        .list(&Default::default())
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 403, "{s:?}");
            assert!(
                s.message
                    .contains(&format!("system:serviceaccount:{ns}:robot")),
                "{s:?}"
            );
        }
        other => panic!("expected 403, got {other}"),
    }

    // A Secret without the annotation is refused clearly.
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("plain".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let err = cluster.fill_token_secret(&ns, "plain").await.unwrap_err();
    assert!(
        err.to_string()
            .contains("kubernetes.io/service-account.name"),
        "{err}"
    );
}
