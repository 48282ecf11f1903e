//! `kubectl apply --server-side` for tests: apply multi-document YAML to a cluster.

use crate::{Error, Result};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use std::collections::HashMap;

/// Field manager of every apply made by [`apply_yaml`].
pub const FIELD_MANAGER: &str = "local-cluster";

/// Splits `text` into Kubernetes objects: YAML documents separated by `---` (JSON is
/// YAML too), empty documents skipped, `List`s (`kind: List` or `*List` with `items`)
/// flattened.
pub fn parse_documents(text: &str) -> Result<Vec<serde_json::Value>> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| Error::Manifest(format!("not valid YAML: {e}")))?;
    let mut out = Vec::new();
    for doc in docs {
        flatten(doc, &mut out)?;
    }
    Ok(out)
}

fn flatten(doc: serde_json::Value, out: &mut Vec<serde_json::Value>) -> Result<()> {
    match doc {
        serde_json::Value::Null => Ok(()),
        serde_json::Value::Object(mut map) => {
            let is_list = map
                .get("kind")
                .and_then(|k| k.as_str())
                .is_some_and(|k| k.ends_with("List"))
                && map.get("items").is_some_and(|i| i.is_array());
            if is_list {
                let Some(serde_json::Value::Array(items)) = map.remove("items") else {
                    unreachable!("checked above")
                };
                for item in items {
                    flatten(item, out)?;
                }
            } else {
                out.push(serde_json::Value::Object(map));
            }
            Ok(())
        }
        other => Err(Error::Manifest(format!(
            "a document is not an object: {other}"
        ))),
    }
}

fn field<'a>(doc: &'a serde_json::Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(doc, |v, key| v.get(key))
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
}

/// Server-side applies (forced, field manager [`FIELD_MANAGER`]) every object of the
/// multi-document YAML (or JSON `List`) `yaml`, in order, and returns one
/// `Kind/namespace/name` (`Kind/name` for cluster-scoped kinds) line per object.
/// Namespaced objects without a namespace go to `default`.
pub async fn apply_yaml(client: &kube::Client, yaml: &str) -> Result<Vec<String>> {
    let docs = parse_documents(yaml)?;
    let mut resources: HashMap<String, (ApiResource, ApiCapabilities)> = HashMap::new();
    let mut applied = Vec::with_capacity(docs.len());
    for mut doc in docs {
        let api_version = field(&doc, &["apiVersion"])
            .ok_or_else(|| Error::Manifest(format!("object without apiVersion: {doc}")))?
            .to_string();
        let kind = field(&doc, &["kind"])
            .ok_or_else(|| Error::Manifest(format!("object without kind: {doc}")))?
            .to_string();
        let name = field(&doc, &["metadata", "name"])
            .ok_or_else(|| Error::Manifest(format!("{kind} without metadata.name")))?
            .to_string();
        let key = format!("{api_version}/{kind}");
        if !resources.contains_key(&key) {
            let (group, version) = api_version
                .split_once('/')
                .unwrap_or(("", api_version.as_str()));
            let gvk = GroupVersionKind::gvk(group, version, &kind);
            let found = kube::discovery::pinned_kind(client, &gvk)
                .await
                .map_err(|e| Error::Manifest(format!("unknown kind {key}: {e}")))?;
            resources.insert(key.clone(), found);
        }
        let (resource, caps) = &resources[&key];
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let (api, line): (Api<DynamicObject>, String) = match caps.scope {
            Scope::Namespaced => {
                let ns = field(&doc, &["metadata", "namespace"])
                    .unwrap_or("default")
                    .to_string();
                (
                    Api::namespaced_with(client.clone(), &ns, resource),
                    format!("{kind}/{ns}/{name}"),
                )
            }
            Scope::Cluster => {
                if let Some(meta) = doc.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                    meta.remove("namespace");
                }
                (
                    Api::all_with(client.clone(), resource),
                    format!("{kind}/{name}"),
                )
            }
        };
        api.patch(&name, &params, &Patch::Apply(&doc)).await?;
        applied.push(line);
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_documents_and_skips_empty_ones() {
        let docs = parse_documents(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: b, namespace: a}\ndata: {k: \"1\"}\n",
        )
        .unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["kind"], "Namespace");
        assert_eq!(docs[1]["data"]["k"], "1");
    }

    #[test]
    fn flattens_json_lists() {
        let docs = parse_documents(
            r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}},{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"b","namespace":"a"}}]}"#,
        )
        .unwrap();
        let kinds: Vec<_> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["Namespace", "ServiceAccount"]);
    }

    #[test]
    fn refuses_scalars_and_bad_yaml() {
        assert!(matches!(
            parse_documents("just a string"),
            Err(Error::Manifest(_))
        ));
        assert!(matches!(
            parse_documents("a: [1, 2"),
            Err(Error::Manifest(_))
        ));
    }
}
