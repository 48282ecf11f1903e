//! The Multi-Cluster Services API (KEP-1645, `multicluster.x-k8s.io`): its CRDs as we
//! install them. The merge of exports across the cluster set is pure and lives in
//! `service_mirror_core::mcs`.

/// The ServiceExport CRD (v1alpha1 and v1beta1 served, v1beta1 stored).
pub const SERVICE_EXPORT_CRD_YAML: &str = include_str!("serviceexport-crd.yaml");
/// The ServiceImport CRD (v1alpha1 and v1beta1 served, v1beta1 stored).
pub const SERVICE_IMPORT_CRD_YAML: &str = include_str!("serviceimport-crd.yaml");
/// Name of the ServiceExport CRD.
pub const SERVICE_EXPORT_CRD_NAME: &str = "serviceexports.multicluster.x-k8s.io";
/// Name of the ServiceImport CRD.
pub const SERVICE_IMPORT_CRD_NAME: &str = "serviceimports.multicluster.x-k8s.io";
/// The version the conformance suite and current implementations use.
pub const VERSION: &str = "v1beta1";
/// Every served version: the same schema, no conversion.
pub const SERVED_VERSIONS: [&str; 2] = ["v1alpha1", "v1beta1"];
