//! The derived types against the CRD YAML we install, per CRD and per served version:
//! every property path with its type (and format, and whether unknown fields are kept),
//! and every `required` list. A field added to one and not the other fails here.
//!
//! The YAML is written by hand (comments, anchors) and is deliberately looser than the
//! types in a few places, each listed in the CRD's `LOOSER` table with its reason; a
//! listed difference that no longer exists fails too, so the table cannot go stale.
//! The top-level `apiVersion`, `kind` and `metadata` are left out: the apiserver checks
//! them whatever the schema says, and kube-derive leaves them out of its schema.

use kube_core::CustomResourceExt;
use serde_json::Value;
use std::collections::BTreeMap;

/// The shape of a schema: `path` → what is there. Paths: `spec.ports[]` for array
/// items, `spec.exportedLabels{}` for map values, `spec (required)` for a required list.
type Shape = BTreeMap<String, String>;

/// One deliberate difference: (path, derived says, YAML says, why); `-` is absent.
type Looser = (&'static str, &'static str, &'static str, &'static str);

fn shape(schema: &Value) -> Shape {
    fn walk(path: &str, s: &Value, out: &mut Shape) {
        let mut what = s["type"].as_str().unwrap_or("any").to_string();
        if let Some(f) = s["format"].as_str() {
            what = format!("{what}/{f}");
        }
        if s["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true) {
            what.push_str("+unknown-kept");
        }
        out.insert(path.to_string(), what);
        if let Some(req) = s["required"].as_array() {
            let mut req: Vec<&str> = req.iter().filter_map(Value::as_str).collect();
            req.sort_unstable();
            out.insert(format!("{path} (required)"), req.join(","));
        }
        if let Some(props) = s["properties"].as_object() {
            for (k, v) in props {
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if path.is_empty() && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                walk(&child, v, out);
            }
        }
        if s["items"].is_object() {
            walk(&format!("{path}[]"), &s["items"], out);
        }
        if s["additionalProperties"].is_object() {
            walk(&format!("{path}{{}}"), &s["additionalProperties"], out);
        }
    }
    let mut out = Shape::new();
    walk("", schema, &mut out);
    out
}

/// Every version of the CRD in `yaml`: (name, its openAPIV3Schema).
fn yaml_versions(yaml: &str) -> Vec<(String, Value)> {
    let crd: Value = serde_saphyr::from_str(yaml).expect("the CRD is valid YAML");
    crd["spec"]["versions"]
        .as_array()
        .expect("the CRD lists versions")
        .iter()
        .map(|v| {
            let name = v["name"].as_str().unwrap().to_string();
            (name, v["schema"]["openAPIV3Schema"].clone())
        })
        .collect()
}

/// The derived CRD's one version: (name, its openAPIV3Schema).
fn derived_version<K: CustomResourceExt>() -> (String, Value) {
    let crd = serde_json::to_value(K::crd()).unwrap();
    let v = &crd["spec"]["versions"][0];
    (
        v["name"].as_str().unwrap().to_string(),
        v["schema"]["openAPIV3Schema"].clone(),
    )
}

/// The differences between `derived` and `yaml`: (path, derived says, YAML says).
fn differences(derived: &Value, yaml: &Value) -> Vec<(String, String, String)> {
    let (d, y) = (shape(derived), shape(yaml));
    let mut paths: Vec<&String> = d.keys().chain(y.keys()).collect();
    paths.sort_unstable();
    paths.dedup();
    let or_absent = |s: Option<&String>| s.cloned().unwrap_or_else(|| "-".into());
    paths
        .into_iter()
        .filter(|p| d.get(*p) != y.get(*p))
        .map(|p| (p.clone(), or_absent(d.get(p)), or_absent(y.get(p))))
        .collect()
}

/// Asserts that each `(version, derived)` matches the YAML's version of that name but
/// for `looser`, that the YAML serves exactly those versions, and that every `looser`
/// entry is still a difference.
fn check(yaml: &str, derived: &[(String, Value)], looser: &[Looser]) {
    let versions = yaml_versions(yaml);
    let served: Vec<&str> = versions.iter().map(|(n, _)| n.as_str()).collect();
    let typed: Vec<&str> = derived.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        served, typed,
        "the YAML serves exactly the versions with a type"
    );
    let allowed: Vec<(String, String, String)> = looser
        .iter()
        .map(|(p, d, y, _)| (p.to_string(), d.to_string(), y.to_string()))
        .collect();
    for ((name, yaml_schema), (_, derived_schema)) in versions.iter().zip(derived) {
        let diffs = differences(derived_schema, yaml_schema);
        let unexplained: Vec<_> = diffs.iter().filter(|d| !allowed.contains(d)).collect();
        assert!(
            unexplained.is_empty(),
            "{name}: the derived type and the CRD YAML differ at (path, derived, YAML): \
             {unexplained:#?}\nchange both, or list a deliberate difference with its reason"
        );
        let stale: Vec<_> = allowed.iter().filter(|a| !diffs.contains(a)).collect();
        assert!(
            stale.is_empty(),
            "{name}: listed differences that are gone: {stale:#?}"
        );
    }
}

/// Both kube-derive roots require `spec`; the types read an absent one as empty and
/// the CRDs (as Linkerd's and mcs-api's) let it be absent.
const SPEC_OPTIONAL: Looser = (
    " (required)",
    "spec",
    "-",
    "an absent spec decodes as the empty one; the CRD does not require it",
);

/// Link: `matchLabels` is open in the YAML (as in Linkerd's CRD), so a boolean label
/// value is stored and then refused by name (`undecodable`), not by the apiserver.
const LINK_LOOSER: &[Looser] = &[
    SPEC_OPTIONAL,
    (
        "spec.selector.matchLabels",
        "object",
        "object+unknown-kept",
        "open, as Linkerd's",
    ),
    (
        "spec.selector.matchLabels{}",
        "string",
        "-",
        "open, as Linkerd's",
    ),
    (
        "spec.remoteDiscoverySelector.matchLabels",
        "object",
        "object+unknown-kept",
        "open",
    ),
    (
        "spec.remoteDiscoverySelector.matchLabels{}",
        "string",
        "-",
        "open",
    ),
    (
        "spec.federatedServiceSelector.matchLabels",
        "object",
        "object+unknown-kept",
        "open",
    ),
    (
        "spec.federatedServiceSelector.matchLabels{}",
        "string",
        "-",
        "open",
    ),
    (
        "status.conditions[] (required)",
        "lastTransitionTime,message,reason,status,type",
        "status,type",
        "metav1.Condition's fields; the CRD asks no more than Linkerd's older clients write",
    ),
];

#[test]
fn the_link_types_match_every_served_version_of_the_installed_link_crd() {
    use crate::link::{Link, v1alpha1, v1alpha2};
    let derived = [
        derived_version::<v1alpha1::Link>(),
        derived_version::<v1alpha2::Link>(),
        derived_version::<Link>(),
    ];
    check(crate::link::LINK_CRD_YAML, &derived, LINK_LOOSER);
}

#[test]
fn the_service_export_type_matches_both_served_versions_of_its_installed_crd() {
    let (_, schema) = derived_version::<crate::mcs::ServiceExport>();
    let derived = crate::mcs::SERVED_VERSIONS.map(|v| (v.to_string(), schema.clone()));
    check(
        crate::mcs::SERVICE_EXPORT_CRD_YAML,
        &derived,
        &[SPEC_OPTIONAL],
    );
}

/// ServiceImport: the YAML requires of every writer what a foreign import may lack;
/// the type reads it anyway, so one odd import cannot stop the watch of all of them.
const IMPORT_LOOSER: &[Looser] = &[
    SPEC_OPTIONAL,
    (
        "spec (required)",
        "-",
        "ports,type",
        "a foreign import without them still decodes",
    ),
    (
        "spec.ports[] (required)",
        "-",
        "port",
        "a foreign port without one still decodes",
    ),
    (
        "status.clusters[] (required)",
        "-",
        "cluster",
        "a foreign entry without one still decodes, and is left out",
    ),
];

#[test]
fn the_service_import_type_matches_both_served_versions_of_its_installed_crd() {
    let (_, schema) = derived_version::<crate::mcs::ServiceImport>();
    let derived = crate::mcs::SERVED_VERSIONS.map(|v| (v.to_string(), schema.clone()));
    check(crate::mcs::SERVICE_IMPORT_CRD_YAML, &derived, IMPORT_LOOSER);
}

#[test]
fn the_cluster_property_type_matches_its_installed_crd() {
    // `status` is open in both; the CRD, as KEP-2149's, requires spec.
    check(
        crate::about::CLUSTER_PROPERTY_CRD_YAML,
        &[derived_version::<crate::about::ClusterProperty>()],
        &[],
    );
}

#[test]
fn a_field_in_one_and_not_the_other_is_a_difference() {
    // The checker itself: an added property, a changed type and a dropped required
    // entry are each found, with the side that has them.
    let yaml: Value = serde_json::json!({"type": "object", "required": ["spec"], "properties": {
        "spec": {"type": "object", "properties": {"a": {"type": "string"}}}}});
    let mut derived = yaml.clone();
    derived["properties"]["spec"]["properties"]["b"] =
        serde_json::json!({"type": "integer", "format": "int32"});
    derived["properties"]["spec"]["properties"]["a"]["type"] = "integer".into();
    derived.as_object_mut().unwrap().remove("required");
    let diffs = differences(&derived, &yaml);
    let want = [
        (" (required)", "-", "spec"),
        ("spec.a", "integer", "string"),
        ("spec.b", "integer/int32", "-"),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|(p, d, y)| (p.to_string(), d.to_string(), y.to_string()))
        .collect();
    assert_eq!(diffs, want);
}
