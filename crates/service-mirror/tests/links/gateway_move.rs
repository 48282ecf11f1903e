//! A Link whose gateway alone changes (a load balancer's new address): the running
//! link takes it in place. Its mirrors are rewritten towards the new gateway and keep
//! their uids; no second controller starts and nothing is listed again.

use crate::support::links::{LinkWorld, remote_slice};
use crate::support::*;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};

const OLD_IDENTITY: &str =
    "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local";
const NEW_IDENTITY: &str =
    "gateway-b.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local";

fn endpoint_ips(ep: &Endpoints) -> Vec<String> {
    let mut ips: Vec<String> = ep
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| s.addresses.iter().flatten().map(|a| a.ip.clone()))
        .collect();
    ips.sort();
    ips
}

/// The gateway identity Linkerd's destination reads off the mirror's Endpoints.
fn identity(ep: &Endpoints) -> Option<String> {
    ep.metadata
        .annotations
        .as_ref()?
        .get("mirror.linkerd.io/remote-gateway-identity")
        .cloned()
}

/// The sorted addresses of the local slices of Service `service`.
async fn slice_addresses(w: &LinkWorld, service: &str) -> Vec<String> {
    let slices = Api::<EndpointSlice>::namespaced(w.env.lc.clone(), &w.env.ns)
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .unwrap();
    let mut addresses: Vec<String> = slices
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
        .collect();
    addresses.sort();
    addresses
}

/// (Service, Endpoints, slice addresses) of `web`'s mirror.
async fn mirror(w: &LinkWorld) -> Option<(Service, Endpoints, Vec<String>)> {
    let name = w.env.mirror_name("web");
    let svc = w.env.local_services().get_opt(&name).await.unwrap()?;
    let ep = w.env.local_endpoints().get_opt(&name).await.unwrap()?;
    Some((svc, ep, slice_addresses(w, &name).await))
}

#[tokio::test]
async fn a_links_new_gateway_is_taken_in_place_without_a_restart_or_a_relist() {
    let w = LinkWorld::new("lkmove", &[], &[]).await;
    let cluster = w.env.cluster.clone();
    // web is mirrored, api is a member of the federated api-federated.
    for (name, label, value) in [
        ("web", "mirror.linkerd.io/exported", "true"),
        ("api", "mirror.linkerd.io/federated", "member"),
    ] {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": w.env.ns, "labels": {label: value}},
            "spec": {"ports": [{"name": "http", "port": 80}]},
        }))
        .unwrap();
        w.env
            .remote_services()
            .create(&PostParams::default(), &svc)
            .await
            .unwrap();
        let slice = remote_slice(&w.env.ns, name, &[true]);
        Api::<EndpointSlice>::namespaced(w.env.rc.clone(), &w.env.ns)
            .create(&PostParams::default(), &slice)
            .await
            .unwrap();
    }
    w.create_link(serde_json::json!({})).await;
    let old = ["192.0.2.10".to_string(), "192.0.2.11".to_string()];
    let (before, before_ep, _) = eventually("mirrored through the first gateway", || async {
        mirror(&w)
            .await
            .filter(|(_, ep, slice)| endpoint_ips(ep) == old && *slice == old)
    })
    .await;
    assert_eq!(identity(&before_ep).as_deref(), Some(OLD_IDENTITY));
    eventually("the federated slice through the first gateway", || async {
        (slice_addresses(&w, "api-federated").await == old).then_some(())
    })
    .await;

    w.patch_link(
        &cluster,
        serde_json::json!({"gatewayAddress": "192.0.2.12", "gatewayIdentity": NEW_IDENTITY}),
    )
    .await;
    let new = ["192.0.2.12".to_string()];
    let (after, after_ep, _) = eventually("mirrored through the moved gateway", || async {
        mirror(&w).await.filter(|(_, ep, slice)| {
            endpoint_ips(ep) == new
                && *slice == new
                && identity(ep).as_deref() == Some(NEW_IDENTITY)
        })
    })
    .await;
    // The federation was told too (the Link gateway's report follows the move).
    eventually("the federated slice through the moved gateway", || async {
        (slice_addresses(&w, "api-federated").await == new).then_some(())
    })
    .await;
    assert_eq!(after.metadata.uid, before.metadata.uid, "the Service kept");
    assert_eq!(
        after_ep.metadata.uid, before_ep.metadata.uid,
        "the Endpoints kept"
    );
    let note = wait_event(&w.env.lc, &w.ctl_ns, &cluster, "SettingsApplied").await;
    assert!(note.contains("moved"), "{note}");
    // In place: one controller ever started for the link, the remote listed once.
    let started = w
        .ctl
        .log_lines("service_mirror_controller::link_controller::running: watching remote cluster");
    assert_eq!(started.len(), 1, "{started:?}");
    let listed = w.ctl.log_lines("remote services synced");
    assert_eq!(listed.len(), 1, "{listed:?}");
    let metrics = w.ctl.metrics_text().await;
    assert!(
        metrics.contains(r#"service_mirror_link_rotations_total{outcome="moved"} 1"#),
        "{metrics}"
    );
    assert!(!metrics.contains(r#"outcome="restarted""#), "{metrics}");
}
