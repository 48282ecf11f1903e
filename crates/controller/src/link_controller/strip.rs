//! What the caches keep of each object.

use k8s_openapi::api::core::v1::Service;
use kube::Resource;
// Every annotation the controller reads on a remote Service (export and probe
// settings) is under this prefix, but one: the clusters it is exported to.
use service_mirror_core::labels::MIRROR_PREFIX;
use service_mirror_core::mcs::EXPORT_TO_ANNOTATION;

/// Managed fields are large and never read: keep them out of the caches. Local objects
/// keep everything else: an update PUTs the cached object with our changes.
pub(super) fn strip_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// A remote Service is never written back: keep only what the core reads (name,
/// namespace, resourceVersion, `mirror.linkerd.io/` annotations and
/// `service-mirror.io/export-to`, ports, load-balancer status), so a large remote costs
/// little memory.
pub(super) fn strip_remote(svc: &mut Service) {
    use k8s_openapi::api::core::v1::{ServiceSpec, ServiceStatus};
    use kube::api::ObjectMeta;
    let meta = std::mem::take(&mut svc.metadata);
    svc.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        resource_version: meta.resource_version,
        annotations: meta.annotations.map(|a| {
            a.into_iter()
                .filter(|(k, _)| k.starts_with(MIRROR_PREFIX) || k == EXPORT_TO_ANNOTATION)
                .collect()
        }),
        ..ObjectMeta::default()
    };
    svc.spec = svc.spec.take().map(|spec| ServiceSpec {
        ports: spec.ports,
        // Headless mirrors (`--enable-headless-services`) read these two.
        cluster_ip: spec.cluster_ip.filter(|ip| ip == "None"),
        publish_not_ready_addresses: spec.publish_not_ready_addresses.filter(|p| *p),
        ..ServiceSpec::default()
    });
    svc.status = svc
        .status
        .take()
        .and_then(|status| status.load_balancer)
        .map(|lb| ServiceStatus {
            load_balancer: Some(lb),
            ..ServiceStatus::default()
        });
}

/// [`strip_remote`] for a Link link: its selectors read the labels and its mirrors copy
/// labels and annotations, so those stay whole; `clusterIP` too (a headless federated
/// member is refused).
pub(super) fn strip_remote_keeping_metadata(svc: &mut Service) {
    let labels = svc.metadata.labels.take();
    let annotations = svc.metadata.annotations.take();
    let cluster_ip = svc.spec.as_mut().and_then(|s| s.cluster_ip.take());
    strip_remote(svc);
    svc.metadata.labels = labels;
    svc.metadata.annotations = annotations;
    if let Some(spec) = svc.spec.as_mut() {
        spec.cluster_ip = cluster_ip;
    }
}

/// What the MCS merge reads of a remote Service's spec beyond what the link keeps (its
/// type, affinity, traffic policies, IP families, external name; see `mcs/index.rs`):
/// kept when the link also feeds MCS, which reads the remote Services from this watch.
fn keep_mcs_spec(svc: &mut Service, spec: Option<k8s_openapi::api::core::v1::ServiceSpec>) {
    let (Some(kept), Some(spec)) = (svc.spec.as_mut(), spec) else {
        return;
    };
    kept.type_ = spec.type_;
    kept.cluster_ip = kept
        .cluster_ip
        .take()
        .or(spec.cluster_ip.filter(|ip| ip == "None"));
    kept.session_affinity = spec.session_affinity;
    kept.session_affinity_config = spec.session_affinity_config;
    kept.internal_traffic_policy = spec.internal_traffic_policy;
    kept.traffic_distribution = spec.traffic_distribution;
    kept.ip_families = spec.ip_families;
    kept.external_name = spec.external_name;
}

/// [`strip_remote`], keeping what MCS reads (the link feeds MCS).
pub(super) fn strip_remote_for_mcs(svc: &mut Service) {
    let (spec, deleting) = (svc.spec.clone(), svc.metadata.deletion_timestamp.take());
    strip_remote(svc);
    keep_mcs_spec(svc, spec);
    // MCS counts a terminating Service as gone (`mcs/index.rs`, as its own watch did).
    svc.metadata.deletion_timestamp = deleting;
}

/// [`strip_remote_keeping_metadata`], keeping what MCS reads (the link feeds MCS).
pub(super) fn strip_remote_keeping_metadata_for_mcs(svc: &mut Service) {
    let (spec, deleting) = (svc.spec.clone(), svc.metadata.deletion_timestamp.take());
    strip_remote_keeping_metadata(svc);
    keep_mcs_spec(svc, spec);
    svc.metadata.deletion_timestamp = deleting;
}

#[cfg(test)]
mod tests {
    use super::*;
    use service_mirror_core::{
        Link, ResolvedGateway, desired_mirror, exported_gateway, gateway_spec, probe_spec,
    };

    fn full(json: serde_json::Value) -> Service {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn stripped_remote_services_mirror_the_same() {
        let svc = full(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "42", "uid": "u",
                "labels": {"app": "web"},
                "annotations": {"mirror.linkerd.io/gateway-name": "gw", "mirror.linkerd.io/gateway-ns": "mc",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"a\": 1}"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.0.0.7", "type": "ClusterIP",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "appProtocol": "http"}]},
            "status": {"loadBalancer": {}}
        }));
        let gw = full(serde_json::json!({
            "metadata": {"name": "gw", "namespace": "mc", "resourceVersion": "7",
                "annotations": {"mirror.linkerd.io/probe-path": "/health", "mirror.linkerd.io/probe-period": "5", "other": "x"}},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.0.0.9", "ports": [
                {"name": "mc-gateway", "port": 4143, "nodePort": 30001},
                {"name": "mc-probe", "port": 4191, "nodePort": 30002}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"hostname": "gw.example"}]},
                "conditions": [{"type": "x", "status": "True", "reason": "r", "message": "m",
                    "lastTransitionTime": "2024-01-01T00:00:00Z"}]}
        }));
        let (mut s, mut g) = (svc.clone(), gw.clone());
        strip_remote(&mut s);
        strip_remote(&mut g);
        assert!(s.metadata.labels.is_none() && s.metadata.managed_fields.is_none());
        assert_eq!(s.metadata.annotations.as_ref().unwrap().len(), 2);
        assert!(s.spec.as_ref().unwrap().selector.is_none());
        assert_eq!(exported_gateway(&s), exported_gateway(&svc));
        assert_eq!(gateway_spec(&g), gateway_spec(&gw));
        assert_eq!(probe_spec(&g), probe_spec(&gw));
        let link = Link::new("east", None);
        let gref = exported_gateway(&svc).unwrap();
        let resolved =
            ResolvedGateway::new(["192.0.2.1".parse().unwrap()], 4143).with_resource_version("7");
        assert_eq!(
            desired_mirror(&s, &link, &gref, Some(&resolved)),
            desired_mirror(&svc, &link, &gref, Some(&resolved))
        );
    }

    #[test]
    fn every_strip_keeps_the_export_to_annotation() {
        let svc = full(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop",
                "annotations": {"service-mirror.io/export-to": "east", "other": "x",
                    "service-mirror.io/other": "y"}},
            "spec": {"ports": [{"port": 80}]}
        }));
        for strip in [
            strip_remote as fn(&mut Service),
            strip_remote_for_mcs,
            strip_remote_keeping_metadata,
            strip_remote_keeping_metadata_for_mcs,
        ] {
            let mut s = svc.clone();
            strip(&mut s);
            assert_eq!(
                service_mirror_core::withheld(&s, Some("west")),
                service_mirror_core::withheld(&svc, Some("west"))
            );
            let kept = s.metadata.annotations.unwrap_or_default();
            assert_eq!(
                kept.get(EXPORT_TO_ANNOTATION).map(String::as_str),
                Some("east")
            );
        }
        // The Secret link's strip keeps nothing else of ours.
        let mut s = svc.clone();
        strip_remote(&mut s);
        assert_eq!(s.metadata.annotations.unwrap().len(), 1);
    }

    #[test]
    fn a_link_feeding_mcs_keeps_what_the_mcs_merge_reads_and_mirrors_the_same() {
        let svc = full(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "42",
                "labels": {"app": "web"}, "annotations": {"mirror.linkerd.io/gateway-name": "gw"}},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.0.0.7", "type": "NodePort",
                "sessionAffinity": "ClientIP", "internalTrafficPolicy": "Local",
                "ipFamilies": ["IPv4"], "trafficDistribution": "PreferClose",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
        }));
        for (strip, mcs) in [
            (
                strip_remote as fn(&mut Service),
                strip_remote_for_mcs as fn(&mut Service),
            ),
            (
                strip_remote_keeping_metadata,
                strip_remote_keeping_metadata_for_mcs,
            ),
        ] {
            let (mut plain, mut kept) = (svc.clone(), svc.clone());
            strip(&mut plain);
            mcs(&mut kept);
            let spec = kept.spec.as_ref().unwrap();
            assert_eq!(spec.type_.as_deref(), Some("NodePort"));
            assert_eq!(spec.session_affinity.as_deref(), Some("ClientIP"));
            assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Local"));
            assert_eq!(spec.ip_families, Some(vec!["IPv4".to_string()]));
            assert_eq!(spec.traffic_distribution.as_deref(), Some("PreferClose"));
            assert!(spec.selector.is_none(), "still not kept");
            assert_eq!(kept.metadata, plain.metadata);
            assert_eq!(spec.ports, plain.spec.as_ref().unwrap().ports);
            assert_eq!(spec.cluster_ip, plain.spec.as_ref().unwrap().cluster_ip);
            // A terminating Service stays terminating for MCS (it is gone to the merge).
            let mut deleting = svc.clone();
            deleting.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
            mcs(&mut deleting);
            assert!(deleting.metadata.deletion_timestamp.is_some());
        }
    }
}
