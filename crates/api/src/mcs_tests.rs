//! The MCS types' wire form.

use super::*;
use kube_core::Resource;
use serde_json::json;

#[test]
fn the_resources_are_namespaced_in_multicluster_x_k8s_io_v1beta1() {
    assert_eq!(
        ServiceExport::url_path(&(), Some("shop")),
        "/apis/multicluster.x-k8s.io/v1beta1/namespaces/shop/serviceexports"
    );
    assert_eq!(
        ServiceImport::url_path(&(), Some("shop")),
        "/apis/multicluster.x-k8s.io/v1beta1/namespaces/shop/serviceimports"
    );
    assert_eq!(ServiceExport::kind(&()), SERVICE_EXPORT_KIND);
    assert_eq!(ServiceImport::kind(&()), SERVICE_IMPORT_KIND);
    assert_eq!(
        SERVICE_EXPORT_CRD_NAME,
        format!("{SERVICE_EXPORT_PLURAL}.{GROUP}")
    );
    assert_eq!(
        SERVICE_IMPORT_CRD_NAME,
        format!("{SERVICE_IMPORT_PLURAL}.{GROUP}")
    );
    assert_eq!(SERVED_VERSIONS.last(), Some(&VERSION));
}

#[test]
fn an_export_decodes_with_or_without_spec_and_status() {
    let bare: ServiceExport = serde_json::from_value(json!({
        "metadata": {"name": "hello", "namespace": "shop"}
    }))
    .unwrap();
    assert_eq!(bare.spec, ServiceExportSpec::default());
    assert!(bare.conditions().is_empty());
    let null: ServiceExport = serde_json::from_value(json!({
        "metadata": {"name": "hello"}, "spec": null
    }))
    .unwrap();
    assert_eq!(null.spec, ServiceExportSpec::default());
    let full: ServiceExport = serde_json::from_value(json!({
        "metadata": {"name": "hello", "namespace": "shop"},
        "spec": {"exportedLabels": {"a": "1"}},
        "status": {"conditions": [{
            "type": "Valid", "status": "True", "reason": "Valid", "message": "",
            "lastTransitionTime": "2026-12-02T10:00:00Z"
        }]}
    }))
    .unwrap();
    assert_eq!(
        full.spec.exported_labels,
        Some(BTreeMap::from([("a".into(), "1".into())]))
    );
    assert_eq!(full.conditions().len(), 1);
}

#[test]
fn an_import_without_spec_or_with_odd_status_entries_still_decodes() {
    let bare: ServiceImport =
        serde_json::from_value(json!({"metadata": {"name": "hello"}})).unwrap();
    assert_eq!(bare.spec, ServiceImportSpec::default());
    assert!(bare.clusters().is_empty());
    let odd: ServiceImport = serde_json::from_value(json!({
        "metadata": {"name": "hello"},
        "spec": {"ports": [{}]},
        "status": {"clusters": [{"cluster": "west"}, {}, {"cluster": "east"}]},
    }))
    .unwrap();
    assert_eq!(odd.spec.ports, vec![ServiceImportPort::default()]);
    assert_eq!(odd.clusters(), ["east", "west"], "sorted, unnamed left out");
}

#[test]
fn an_import_is_written_as_the_hand_written_type_wrote_it() {
    // The exact bytes of the hand-written type (apiVersion, kind, metadata, spec,
    // status; unset fields omitted, `ports` always present).
    let mut import = ServiceImport::new("hello", ServiceImportSpec::default());
    import.spec.type_ = Some("ClusterSetIP".into());
    import.spec.ports.push(ServiceImportPort {
        protocol: Some("TCP".into()),
        port: 80,
        ..Default::default()
    });
    assert_eq!(
        serde_json::to_string(&import).unwrap(),
        r#"{"apiVersion":"multicluster.x-k8s.io/v1beta1","kind":"ServiceImport","metadata":{"name":"hello"},"spec":{"type":"ClusterSetIP","ports":[{"protocol":"TCP","port":80}]}}"#
    );
    let empty = ServiceImport::new("x", ServiceImportSpec::default());
    assert_eq!(
        serde_json::to_value(&empty).unwrap()["spec"],
        json!({"ports": []})
    );
    import.status = Some(ServiceImportStatus {
        clusters: vec![ClusterStatus {
            cluster: "west".into(),
        }],
        conditions: vec![],
    });
    let v = serde_json::to_value(&import).unwrap();
    assert_eq!(v["status"], json!({"clusters": [{"cluster": "west"}]}));
    assert_eq!(serde_json::from_value::<ServiceImport>(v).unwrap(), import);
}
