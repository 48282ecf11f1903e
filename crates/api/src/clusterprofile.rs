//! The cluster inventory API's `ClusterProfile` (KEP-4322,
//! `multicluster.x-k8s.io/v1alpha1`, kubernetes-sigs/cluster-inventory-api): one
//! cluster of a fleet, written by a cluster manager. Read here as a link source; only
//! the fields the link manager reads are typed (the rest of a stored object is not
//! decoded, and never written back: our only write is a server-side apply of our own
//! condition). The CRD is the published one, unchanged (`crds/clusterprofile-crd.yaml`,
//! its source and commit in its header).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group (the Multi-Cluster SIG's, shared with ServiceExport and ServiceImport).
pub const CLUSTER_PROFILE_GROUP: &str = "multicluster.x-k8s.io";
/// The only published version.
pub const CLUSTER_PROFILE_VERSION: &str = "v1alpha1";
/// Kind.
pub const CLUSTER_PROFILE_KIND: &str = "ClusterProfile";
/// Plural (resource) name, as in RBAC rules.
pub const CLUSTER_PROFILE_PLURAL: &str = "clusterprofiles";
/// Name of the CRD.
pub const CLUSTER_PROFILE_CRD_NAME: &str = "clusterprofiles.multicluster.x-k8s.io";
/// The published CRD (kubernetes-sigs/cluster-inventory-api, Apache-2.0), with a header
/// saying where and at which commit it was taken.
pub const CLUSTER_PROFILE_CRD_YAML: &str = include_str!("../crds/clusterprofile-crd.yaml");

/// `spec` of a ClusterProfile: who manages the cluster. Every field optional on read.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterProfile",
    plural = "clusterprofiles",
    namespaced,
    status = "ClusterProfileStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core")
)]
#[serde(remote = "Self", rename_all = "camelCase", default)]
pub struct ClusterProfileSpec {
    /// A human-readable name (not the cluster's name: that is `metadata.name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// The cluster manager that owns the profile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_manager: Option<ClusterManager>,
}
crate::absent_is_default!(ClusterProfileSpec);

/// `spec.clusterManager`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct ClusterManager {
    /// The cluster manager's name.
    pub name: String,
}

/// `status` of a ClusterProfile, as far as it is read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ClusterProfileStatus {
    /// Every writer's conditions (a map keyed by `type`): the cluster manager's, and
    /// ours (`service-mirror.io/Linked`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// How the cluster can be reached, one entry per access provider name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub access_providers: Vec<AccessProvider>,
    /// The deprecated name of `accessProviders` (an entry of the same name there wins).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub credential_providers: Vec<AccessProvider>,
}

/// One access provider: its name and the cluster's connection details (client-go's
/// kubeconfig `Cluster`, v1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct AccessProvider {
    /// The provider's name (e.g. `kubeconfig-secretreader`).
    pub name: String,
    /// The connection details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ProviderCluster>,
}

/// The read fields of an access provider's `cluster` (kubeconfig v1 `Cluster`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct ProviderCluster {
    /// `https://host:port` of the cluster's apiserver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Named extensions; `client.authentication.k8s.io/exec` carries the provider's
    /// own configuration.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<NamedExtension>,
}

/// One named kubeconfig extension: any JSON value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct NamedExtension {
    /// The extension's name.
    pub name: String,
    /// Its value, as stored.
    pub extension: serde_json::Value,
}

impl ClusterProfile {
    /// The access providers: `accessProviders`, then the deprecated
    /// `credentialProviders` whose name `accessProviders` does not have (upstream's
    /// rule: of one name, the `accessProviders` entry is preferred).
    pub fn access_providers(&self) -> Vec<&AccessProvider> {
        let Some(status) = &self.status else {
            return Vec::new();
        };
        let mut all: Vec<&AccessProvider> = status.access_providers.iter().collect();
        for p in &status.credential_providers {
            if !all.iter().any(|a| a.name == p.name) {
                all.push(p);
            }
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_core::Resource;

    #[test]
    fn the_resource_is_namespaced_clusterprofiles_in_multicluster_x_k8s_io_v1alpha1() {
        assert_eq!(
            ClusterProfile::url_path(&(), Some("fleet")),
            "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/fleet/clusterprofiles"
        );
        assert_eq!(
            CLUSTER_PROFILE_CRD_NAME,
            format!("{}.{CLUSTER_PROFILE_GROUP}", ClusterProfile::plural(&()))
        );
        assert_eq!(ClusterProfile::kind(&()), CLUSTER_PROFILE_KIND);
        assert_eq!(CLUSTER_PROFILE_PLURAL, ClusterProfile::plural(&()));
        assert_eq!(
            ClusterProfile::api_version(&()),
            format!("{CLUSTER_PROFILE_GROUP}/{CLUSTER_PROFILE_VERSION}")
        );
    }

    /// Every field the type reads is in the published CRD's schema, with the type the
    /// type expects (the CRD is upstream's, so the type is a subset, checked this way
    /// rather than by `schema_check`'s equality).
    #[test]
    fn every_field_read_is_in_the_published_crd() {
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(CLUSTER_PROFILE_CRD_YAML).expect("valid YAML");
        assert_eq!(docs.len(), 1, "one document");
        let crd = &docs[0];
        assert_eq!(crd["metadata"]["name"], CLUSTER_PROFILE_CRD_NAME);
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        let v = &crd["spec"]["versions"][0];
        assert_eq!(v["name"], CLUSTER_PROFILE_VERSION);
        assert_eq!(v["subresources"]["status"], serde_json::json!({}));
        let root = &v["schema"]["openAPIV3Schema"]["properties"];
        let at = |path: &[&str]| {
            let mut node = root;
            for (i, p) in path.iter().enumerate() {
                node = if *p == "[]" {
                    &node["items"]
                } else if i == 0 {
                    &node[*p]
                } else {
                    &node["properties"][*p]
                };
                assert!(!node.is_null(), "{path:?} not in the CRD");
            }
            node["type"].as_str().unwrap_or("any").to_string()
        };
        for (path, want) in [
            (&["spec", "displayName"][..], "string"),
            (&["spec", "clusterManager", "name"], "string"),
            (&["status", "conditions"], "array"),
            (&["status", "accessProviders", "[]", "name"], "string"),
            (
                &["status", "accessProviders", "[]", "cluster", "server"],
                "string",
            ),
            (
                &[
                    "status",
                    "accessProviders",
                    "[]",
                    "cluster",
                    "extensions",
                    "[]",
                    "name",
                ],
                "string",
            ),
            (
                &[
                    "status",
                    "accessProviders",
                    "[]",
                    "cluster",
                    "extensions",
                    "[]",
                    "extension",
                ],
                "object",
            ),
            (&["status", "credentialProviders", "[]", "name"], "string"),
        ] {
            assert_eq!(at(path), want, "{path:?}");
        }
        // Conditions are a map keyed by type: our server-side apply of one type keeps
        // the others.
        let conditions = &root["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map");
        assert_eq!(
            conditions["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"])
        );
    }

    #[test]
    fn an_upstream_profile_reads_and_access_providers_prefer_the_new_field() {
        let cp: ClusterProfile = serde_json::from_value(serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": {"name": "east", "namespace": "fleet"},
            "spec": {"displayName": "East", "clusterManager": {"name": "ocm"}},
            "status": {
                "version": {"kubernetes": "1.34.0"},
                "properties": [{"name": "id.k8s.io", "value": "east"}],
                "conditions": [{"type": "ControlPlaneHealthy", "status": "True",
                    "reason": "Healthy", "message": "", "lastTransitionTime": "2026-05-01T00:00:00Z"}],
                "accessProviders": [{"name": "kubeconfig-secretreader", "cluster": {
                    "server": "https://east:6443",
                    "certificate-authority-data": "Zm9v",
                    "extensions": [{"name": "client.authentication.k8s.io/exec",
                        "extension": {"name": "east-kubeconfig", "key": "kubeconfig"}}],
                }}],
                "credentialProviders": [
                    {"name": "kubeconfig-secretreader", "cluster": {"server": "https://old:6443"}},
                    {"name": "token", "cluster": {"server": "https://east:6443"}},
                ],
            },
        }))
        .unwrap();
        assert_eq!(cp.spec.display_name.as_deref(), Some("East"));
        assert_eq!(cp.spec.cluster_manager.as_ref().unwrap().name, "ocm");
        let providers = cp.access_providers();
        let names: Vec<_> = providers.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["kubeconfig-secretreader", "token"]);
        let cluster = providers[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://east:6443"));
        assert_eq!(cluster.extensions[0].extension["name"], "east-kubeconfig");
        assert_eq!(
            cp.status.as_ref().unwrap().conditions[0].type_,
            "ControlPlaneHealthy"
        );
        // No spec, no status: still a profile (a watch is not stopped by one odd object).
        let bare: ClusterProfile =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).unwrap();
        assert!(bare.access_providers().is_empty());
    }
}
