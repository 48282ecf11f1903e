//! The About API's `ClusterProperty` (KEP-2149, `about.k8s.io/v1alpha1`): a
//! cluster-scoped property of this cluster, named by `metadata.name`. The one read here
//! is `id.k8s.io`, this cluster's name in its cluster set.

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

/// The About API group (KEP-2149).
pub const ABOUT_GROUP: &str = "about.k8s.io";
/// The About API version.
pub const ABOUT_VERSION: &str = "v1alpha1";
/// The ClusterProperty whose value names the cluster in its cluster set.
pub const CLUSTER_ID_PROPERTY: &str = "id.k8s.io";
/// The ClusterProperty CRD, as we install it beside the MCS ones.
pub const CLUSTER_PROPERTY_CRD_YAML: &str = include_str!("../crds/clusterproperty-crd.yaml");
/// Name of the ClusterProperty CRD.
pub const CLUSTER_PROPERTY_CRD_NAME: &str = "clusterproperties.about.k8s.io";

/// `spec` of a ClusterProperty.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "about.k8s.io",
    version = "v1alpha1",
    kind = "ClusterProperty",
    plural = "clusterproperties",
    status = "ClusterPropertyStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core")
)]
pub struct ClusterPropertySpec {
    /// The property's value. One that is not a string (the schema forbids it; a CRD
    /// not ours may allow it) reads as its JSON text, so that it is reported as a bad
    /// value rather than failing the read.
    #[serde(deserialize_with = "any_as_string")]
    pub value: String,
}

/// `status` of a ClusterProperty: no field is defined; kept as stored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct ClusterPropertyStatus(pub serde_json::Map<String, serde_json::Value>);

/// A string as itself, any other JSON value as its text.
fn any_as_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    })
}

impl ClusterProperty {
    /// The ClusterProperty `id.k8s.io` naming this cluster `name`, as an operator
    /// applies it.
    pub fn cluster_id(name: &str) -> Self {
        ClusterProperty::new(
            CLUSTER_ID_PROPERTY,
            ClusterPropertySpec { value: name.into() },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_core::Resource;

    #[test]
    fn the_resource_is_cluster_scoped_clusterproperties_in_about_k8s_io_v1alpha1() {
        assert_eq!(
            ClusterProperty::url_path(&(), None),
            "/apis/about.k8s.io/v1alpha1/clusterproperties"
        );
        assert_eq!(
            CLUSTER_PROPERTY_CRD_NAME,
            format!("{}.{ABOUT_GROUP}", ClusterProperty::plural(&()))
        );
        assert_eq!(
            ClusterProperty::api_version(&()),
            format!("{ABOUT_GROUP}/{ABOUT_VERSION}")
        );
    }

    #[test]
    fn the_cluster_id_property_is_written_as_an_operator_applies_it() {
        assert_eq!(
            serde_json::to_value(ClusterProperty::cluster_id("east")).unwrap(),
            serde_json::json!({
                "apiVersion": "about.k8s.io/v1alpha1",
                "kind": "ClusterProperty",
                "metadata": {"name": "id.k8s.io"},
                "spec": {"value": "east"},
            })
        );
    }

    #[test]
    fn a_value_that_is_not_a_string_reads_as_its_json() {
        for (value, want) in [
            (serde_json::json!("east"), "east"),
            (serde_json::json!(7), "7"),
            (serde_json::json!(null), "null"),
            (serde_json::json!({"a": true}), r#"{"a":true}"#),
        ] {
            let p: ClusterProperty = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "id.k8s.io"},
                "spec": {"value": value},
            }))
            .unwrap();
            assert_eq!(p.spec.value, want);
        }
    }
}
