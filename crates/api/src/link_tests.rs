//! The Link types' wire form: decoding what Linkerd and people write, and writing
//! what the apiserver takes.

use super::*;
use kube_core::Resource;
use serde_json::json;

#[test]
fn the_resource_is_namespaced_links_in_multicluster_linkerd_io_v1alpha3() {
    assert_eq!(Link::api_version(&()), "multicluster.linkerd.io/v1alpha3");
    assert_eq!(
        Link::url_path(&(), Some("mc")),
        "/apis/multicluster.linkerd.io/v1alpha3/namespaces/mc/links"
    );
    assert_eq!(Link::kind(&()), "Link");
    assert_eq!(
        LINK_CRD_NAME,
        format!("{LINK_PLURAL}.{LINK_GROUP}"),
        "the CRD name is plural.group"
    );
}

#[test]
fn a_link_gen_link_decodes_field_by_field() {
    let link: Link = serde_json::from_value(json!({
        "apiVersion": "multicluster.linkerd.io/v1alpha3",
        "kind": "Link",
        "metadata": {"name": "east", "namespace": "linkerd-multicluster"},
        "spec": {
            "targetClusterName": "east",
            "targetClusterDomain": "cluster.local",
            "targetClusterLinkerdNamespace": "linkerd",
            "clusterCredentialsSecret": "cluster-credentials-east",
            "gatewayAddress": "10.0.0.1,gw.example.com",
            "gatewayPort": "4143",
            "gatewayIdentity": "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local",
            "probeSpec": {"path": "/ready", "port": "4191", "period": "3s",
                          "timeout": "30s", "failureThreshold": "3"},
            "selector": {"matchLabels": {"mirror.linkerd.io/exported": "true"}},
            "remoteDiscoverySelector": {"matchLabels": {"mirror.linkerd.io/exported": "remote-discovery"}},
            "federatedServiceSelector": {"matchLabels": {"mirror.linkerd.io/federated": "member"}},
            "excludedAnnotations": ["a/*"],
            "excludedLabels": ["b"],
        },
    }))
    .unwrap();
    let s = &link.spec;
    assert_eq!(s.target_cluster_name.as_deref(), Some("east"));
    assert_eq!(
        s.target_cluster_linkerd_namespace.as_deref(),
        Some("linkerd")
    );
    assert_eq!(s.gateway_port.as_deref(), Some("4143"));
    let probe = s.probe_spec.as_ref().unwrap();
    assert_eq!(probe.failure_threshold.as_deref(), Some("3"));
    assert_eq!(probe.timeout.as_deref(), Some("30s"));
    assert!(s.federated_service_selector.is_some());
    assert_eq!(
        s.excluded_annotations.as_deref(),
        Some(&["a/*".to_string()][..])
    );
    assert_eq!(link.status, None);
}

#[test]
fn a_half_written_link_still_decodes() {
    for doc in [
        json!({"metadata": {"name": "x"}}),
        json!({"metadata": {"name": "x"}, "spec": {}}),
        json!({"metadata": {"name": "x"}, "spec": {"probeSpec": {}}, "status": {}}),
    ] {
        let link: Link = serde_json::from_value(doc.clone()).unwrap();
        assert_eq!(link.spec.target_cluster_name, None, "{doc}");
    }
}

#[test]
fn a_selector_that_does_not_decode_leaves_the_link_decodable_and_is_named() {
    let link: Link = serde_json::from_value(json!({
        "metadata": {"name": "x"},
        "spec": {
            "targetClusterName": "east",
            "selector": {"matchLabels": {"mirror.linkerd.io/exported": true}},
            "remoteDiscoverySelector": {"matchLabels": {"a": "b"}},
            "federatedServiceSelector": "not an object",
        },
    }))
    .unwrap();
    assert_eq!(link.spec.target_cluster_name.as_deref(), Some("east"));
    assert_eq!(link.spec.selector, None);
    assert!(link.spec.remote_discovery_selector.is_some());
    assert_eq!(link.spec.federated_service_selector, None);
    let which: Vec<&str> = link.spec.undecodable.iter().map(|(w, _)| *w).collect();
    assert_eq!(which, ["selector", "federatedServiceSelector"]);
    assert!(
        link.spec.undecodable[0].1.contains("boolean"),
        "{:?}",
        link.spec.undecodable
    );
    let v = serde_json::to_value(&link).unwrap();
    assert!(v["spec"].get("undecodable").is_none(), "{v}");
}

#[test]
fn serialising_writes_api_version_and_kind_and_round_trips() {
    let mut link = Link::default();
    link.metadata.name = Some("east".into());
    link.spec.gateway_port = Some("4143".into());
    link.status = Some(LinkResourceStatus {
        mirror_services: vec![LinkServiceStatus {
            controller_name: "linkerd.io/service-mirror".into(),
            remote_ref: LinkObjectRef {
                group: String::new(),
                kind: "Service".into(),
                name: "web".into(),
                namespace: "shop".into(),
            },
            conditions: vec![LinkCondition {
                type_: "Mirrored".into(),
                status: "True".into(),
                reason: "Mirrored".into(),
                local_ref: Some(LinkObjectRef {
                    name: "web-east".into(),
                    namespace: "shop".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        }],
        federated_services: vec![],
        conditions: vec![],
    });
    let v = serde_json::to_value(&link).unwrap();
    assert_eq!(v["apiVersion"], "multicluster.linkerd.io/v1alpha3");
    assert_eq!(v["kind"], "Link");
    assert_eq!(v["spec"], json!({"gatewayPort": "4143"}));
    let cond = &v["status"]["mirrorServices"][0]["conditions"][0];
    assert_eq!(cond["type"], "Mirrored");
    assert!(
        cond.get("lastProbeTime").is_none(),
        "unset times are omitted"
    );
    assert!(v["status"].get("federatedServices").is_none());
    let back: Link = serde_json::from_value(v).unwrap();
    assert_eq!(back, link);
}

#[test]
fn no_status_is_omitted_not_null() {
    let v = serde_json::to_value(Link::default()).unwrap();
    assert!(v.get("status").is_none(), "{v}");
}

#[test]
fn the_written_bytes_are_the_hand_written_types_ones() {
    // The exact text the hand-written `Serialize` wrote before the types were derived
    // (apiVersion, kind, metadata, spec, status; unset fields omitted): Linkerd and
    // the apiserver read what we write.
    let mut link = Link::new("east", LinkResourceSpec::default());
    link.spec.target_cluster_name = Some("east".into());
    link.spec.probe_spec = Some(LinkProbeSpec {
        port: Some("4191".into()),
        ..Default::default()
    });
    assert_eq!(
        serde_json::to_string(&link).unwrap(),
        r#"{"apiVersion":"multicluster.linkerd.io/v1alpha3","kind":"Link","metadata":{"name":"east"},"spec":{"targetClusterName":"east","probeSpec":{"port":"4191"}}}"#
    );
    link.status = Some(LinkResourceStatus::default());
    assert!(serde_json::to_string(&link).unwrap().ends_with(
        r#""spec":{"targetClusterName":"east","probeSpec":{"port":"4191"}},"status":{}}"#
    ));
}

#[test]
fn every_served_version_reads_and_writes_the_same_fields() {
    let doc = json!({
        "apiVersion": "multicluster.linkerd.io/v1alpha1",
        "kind": "Link",
        "metadata": {"name": "east"},
        "spec": {"targetClusterName": "east", "gatewayPort": "4143",
                 "selector": {"matchLabels": {"a": true}}},
        "status": {"mirrorServices": [{"controllerName": "x", "remoteRef": {"name": "web", "namespace": "shop"}}]},
    });
    let old: v1alpha1::Link = serde_json::from_value(doc.clone()).unwrap();
    let mid: v1alpha2::Link = serde_json::from_value(doc.clone()).unwrap();
    let new: Link = serde_json::from_value(doc.clone()).unwrap();
    assert_eq!(old.spec.0, new.spec);
    assert_eq!(mid.spec.0, new.spec);
    assert_eq!(old.spec.0.undecodable.len(), 1, "tolerant in every version");
    // Written back without the undecodable selector, in the version it was read as.
    let mut want = doc.clone();
    want["spec"].as_object_mut().unwrap().remove("selector");
    let mut written = serde_json::to_value(&old).unwrap();
    assert_eq!(written, want);
    written["apiVersion"] = "multicluster.linkerd.io/v1alpha3".into();
    assert_eq!(written, serde_json::to_value(&new).unwrap());
    assert_eq!(
        v1alpha2::Link::api_version(&()),
        "multicluster.linkerd.io/v1alpha2"
    );
    let bare: v1alpha1::Link = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
    assert_eq!(bare.spec.0, LinkResourceSpec::default());
}
