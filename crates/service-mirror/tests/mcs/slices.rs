//! The EndpointSlices of ServiceImports (KEP-1645 "Tracking Endpoints"; issue 17 point
//! 3) on real apiservers, in the two-cluster world of `support/mcs.rs`: one group per
//! remote exporting cluster, at the gateway its link reports, owned by the import.
//! Every expected field is written out from the KEP and the contract and read as plain
//! JSON, never computed with the core.

use crate::support::eventually;
use crate::support::mcs::*;
use crate::{Judged, poke_import};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use service_mirror_controller::events::EventRecorder;
use service_mirror_controller::metrics::Metrics;
use service_mirror_controller::writer::{LocalWriter, MirrorSelector};
use service_mirror_core::ResolvedGateway;
use service_mirror_core::mcs_slices::SourceGateway;

const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";

fn gateway(addr: &str, alive: bool) -> Option<SourceGateway> {
    Some(SourceGateway {
        gateway: ResolvedGateway::new([addr.parse().unwrap()], 4143)
            .with_identity(Some(
                "gateway.linkerd-multicluster.serviceaccount.identity.linkerd.east".into(),
            ))
            .with_alive(alive),
        domain: "cluster.local".into(),
    })
}

/// The slices of ours (our managed-by and this cluster's controller namespace, as
/// `World::start` names it) of the import `name` in `cluster`.
async fn ours(w: &World, cluster: &str, name: &str) -> Vec<Value> {
    let all = w.slices(cluster, name).await;
    let ctl = format!("sm-{cluster}");
    all.into_iter()
        .filter(|s| s["metadata"]["labels"][MANAGED_BY] == "service-mirror.linkerd.io")
        .filter(|s| s["metadata"]["annotations"]["service-mirror.io/controller-namespace"] == ctl)
        .collect()
}

fn ready(s: &Value) -> (Value, Value) {
    let c = &s["endpoints"][0]["conditions"];
    (c["ready"].clone(), c["serving"].clone())
}

/// `(name, protocol, port)` of a slice's ports, sorted.
fn ports(s: &Value) -> Vec<(String, String, i64)> {
    let mut out: Vec<(String, String, i64)> = s["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or("").into(),
                p["protocol"].as_str().unwrap_or("").into(),
                p["port"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    out.sort();
    out
}

/// A slice of the import `name` by another install of ours (every label we set, its own
/// controller namespace), named `slice`: our watch sees it, our writes never touch it.
fn theirs(ns: &str, name: &str, slice: &str) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": slice, "namespace": ns, "labels": {
            "multicluster.kubernetes.io/service-name": name,
            "multicluster.kubernetes.io/source-cluster": "east",
            "service-mirror.io/mcs-import": "true",
            MANAGED_BY: "service-mirror.linkerd.io",
        }, "annotations": {"service-mirror.io/controller-namespace": "another-install"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["192.0.2.99"]}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_exporter_gets_a_slice_at_its_gateway_owned_by_the_import_until_it_stops() {
    let w = World::new("mcs-sl").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    let svc_ports = json!([tcp("http", 80), {"name": "dns", "port": 53, "protocol": "UDP"}]);
    for c in ["west", "east"] {
        w.service(c, "hello", clusterip(svc_ports.clone())).await;
        w.export(c, "hello").await;
    }
    west.mcs.gateway("east", gateway("192.0.2.10", true));
    let import = w
        .import_until("west", "hello", "exported by both", |i| {
            i.clusters() == ["east", "west"]
        })
        .await;
    let derived = import
        .derived_name()
        .expect("the import names its derived Service");
    let slice = eventually("west's slice of east, ready", || async {
        let s = ours(&w, "west", "hello").await;
        (s.len() == 1 && ready(&s[0]).0 == true).then(|| s[0].clone())
    })
    .await;
    let labels = &slice["metadata"]["labels"];
    assert_eq!(labels["multicluster.kubernetes.io/source-cluster"], "east");
    assert_eq!(
        labels["kubernetes.io/service-name"], derived,
        "kube-proxy serves the ClusterSetIP from it"
    );
    assert_eq!(slice["addressType"], "IPv4");
    assert_eq!(slice["endpoints"][0]["addresses"], json!(["192.0.2.10"]));
    assert_eq!(ready(&slice), (json!(true), json!(true)));
    assert_eq!(
        ports(&slice),
        [
            ("dns".into(), "UDP".into(), 4143),
            ("http".into(), "TCP".into(), 4143)
        ],
        "every port, by name, at the gateway's port"
    );
    let owner = &slice["metadata"]["ownerReferences"][0];
    assert_eq!(owner["apiVersion"], "multicluster.x-k8s.io/v1beta1");
    assert_eq!(owner["kind"], "ServiceImport");
    assert_eq!(owner["name"], "hello");
    assert_eq!(owner["uid"], json!(import.object.metadata.uid));
    let notes = &slice["metadata"]["annotations"];
    assert_eq!(
        notes["mirror.linkerd.io/remote-svc-fq-name"],
        format!("hello.{}.svc.cluster.local", w.ns)
    );
    assert!(
        notes["mirror.linkerd.io/remote-gateway-identity"]
            .as_str()
            .is_some_and(|i| i.starts_with("gateway.")),
        "{notes}"
    );
    // Linkerd's destination labels its metrics `dst_target_cluster` from cluster-name.
    assert_eq!(labels["mirror.linkerd.io/cluster-name"], "east");
    assert_eq!(labels["mirror.linkerd.io/mirrored-service"], Value::Null);
    // Unlinking east (the link's cleanup: every mirror of east deleted) leaves the
    // import's slice of east to its own writer: it is no mirror.
    let unlink = LocalWriter::with_recorder(
        w.west.clone(),
        "east",
        Metrics::new(),
        EventRecorder::new(w.west.clone(), None),
    );
    // This test's namespace only: the cluster is shared with the other tests.
    let ns = w.ns.clone();
    let here: MirrorSelector =
        std::sync::Arc::new(move |m: &kube::api::ObjectMeta| m.namespace.as_deref() == Some(&ns));
    assert_eq!(unlink.delete_mirrors_in(Some(&here)).await.unwrap(), 0);
    let after = ours(&w, "west", "hello").await;
    assert_eq!(
        after[0]["metadata"]["uid"], slice["metadata"]["uid"],
        "the unlink cleanup of east left the import slice of east"
    );
    // East has no gateway of west reported: no slice (and its own endpoints are not
    // copied here).
    assert_eq!(ours(&w, "east", "hello").await, Vec::<Value>::new());

    // Another writer's slice of the same import: never touched.
    let api: Api<EndpointSlice> = Api::namespaced(w.west.clone(), &w.ns);
    let foreign = api
        .create(
            &PostParams::default(),
            &theirs(&w.ns, "hello", "hello-theirs"),
        )
        .await
        .unwrap();

    // The gateway's probe fails: its endpoint is neither ready nor serving.
    west.mcs.gateway("east", gateway("192.0.2.10", false));
    eventually("west's slice of east not ready", || async {
        let s = ours(&w, "west", "hello").await;
        (s.len() == 1 && ready(&s[0]) == (json!(false), json!(false))).then_some(())
    })
    .await;

    // East's gateway has no usable address any more (refused by the address policy,
    // its Service gone): its slice goes; reported again, it comes back.
    west.mcs.gateway("east", None);
    eventually("west's slice of east gone with its gateway", || async {
        ours(&w, "west", "hello").await.is_empty().then_some(())
    })
    .await;
    west.mcs.gateway("east", gateway("192.0.2.10", true));
    eventually("west's slice of east back", || async {
        (ours(&w, "west", "hello").await.len() == 1).then_some(())
    })
    .await;

    // East stops exporting: its slice goes, the import stays for west.
    w.exports("east")
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    w.import_until("west", "hello", "exported by west alone", |i| {
        i.clusters() == ["west"]
    })
    .await;
    eventually("west's slice of east gone", || async {
        ours(&w, "west", "hello").await.is_empty().then_some(())
    })
    .await;
    // The last export goes: no import, no slice of ours; theirs as it was.
    w.exports("west")
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    w.import_gone("west", "hello").await;
    assert_eq!(ours(&w, "west", "hello").await, Vec::<Value>::new());
    let now = api.get("hello-theirs").await.unwrap();
    assert_eq!(
        now.metadata.resource_version, foreign.metadata.resource_version,
        "another writer's slice is never written"
    );
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_slices_until_the_gateway_is_reported_and_then_writes_nothing() {
    let w = World::new("mcs-slr").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    w.service("east", "hello", clusterip(json!([tcp("http", 80)])))
        .await;
    w.export("east", "hello").await;
    west.mcs.gateway("east", gateway("192.0.2.10", true));
    let before = eventually("west's slice of east", || async {
        let s = ours(&w, "west", "hello").await;
        (s.len() == 1).then(|| s[0].clone())
    })
    .await;
    west.stop().await;
    // Restarted: its imports list, east's exports list, no gateway yet.
    let west = w.start("west", None);
    west.metric("service_mirror_mcs_clusters_listed 2").await;
    // West judges the name with its lists in and no gateway.
    poke_import(&w, &west, "west", "hello").await;
    let kept = ours(&w, "west", "hello").await;
    assert_eq!(kept, vec![before.clone()], "kept as it was, not emptied");
    // The same gateway reported: judged, nothing to write.
    let judged = Judged::mark(&w, &west, "hello");
    west.mcs.gateway("east", gateway("192.0.2.10", true));
    judged.passed().await;
    assert_eq!(ours(&w, "west", "hello").await, vec![before]);
    let text = west.metrics.encode();
    assert!(
        !text.contains("kind=\"endpoint_slice\""),
        "no slice write after the restart: {text}"
    );
    // The control: a changed report is judged and written, once: the reconcile that
    // wrote, then one after it (its slice's own event, or a poke) writes nothing.
    let judged = Judged::mark(&w, &west, "hello");
    west.mcs.gateway("east", gateway("192.0.2.10", false));
    west.metric(
        "service_mirror_mcs_import_writes_total{kind=\"endpoint_slice\",outcome=\"updated\"} 1",
    )
    .await;
    poke_import(&w, &west, "west", "hello").await;
    judged.passed_more_than(1).await;
    let text = west.metrics.encode();
    let slice_writes: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("kind=\"endpoint_slice\""))
        .collect();
    assert_eq!(
        slice_writes,
        ["service_mirror_mcs_import_writes_total{kind=\"endpoint_slice\",outcome=\"updated\"} 1"],
        "one write for one change"
    );
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_name_held_by_another_writer_is_never_touched_and_is_reported() {
    let w = World::new("mcs-slf").await;
    let east = w.start("east", None);
    w.service("east", "hello", clusterip(json!([tcp("http", 80)])))
        .await;
    w.export("east", "hello").await;
    // West starts after the import's name is known, so the test can take its slice's
    // name first: `<derived Service>-<cluster>-<family>-<index>`.
    let west = w.start("west", None);
    let import = w
        .import_until("west", "hello", "exported by east", |i| {
            i.clusters() == ["east"]
        })
        .await;
    let name = format!("{}-east-ipv4-0", import.derived_name().unwrap());
    let api: Api<EndpointSlice> = Api::namespaced(w.west.clone(), &w.ns);
    let foreign = api
        .create(&PostParams::default(), &theirs(&w.ns, "hello", &name))
        .await
        .unwrap();
    // West exports it too, with its own endpoints: its slice is written all the same.
    w.service("west", "hello", clusterip(json!([tcp("http", 80)])))
        .await;
    api.create(
        &PostParams::default(),
        &service_slice(&w.ns, "hello", "hello-w1", &["10.244.2.7"]),
    )
    .await
    .unwrap();
    w.export("west", "hello").await;
    w.import_until("west", "hello", "exported by both", |i| {
        i.clusters() == ["east", "west"]
    })
    .await;
    west.mcs.gateway("east", gateway("192.0.2.10", true));
    west.metric(
        "service_mirror_mcs_import_writes_total{kind=\"endpoint_slice\",outcome=\"foreign\"} 1",
    )
    .await;
    eventually("the SliceNameTaken Event", || async {
        let events = w.our_events("west", &name).await;
        events.iter().any(|r| r == "SliceNameTaken").then_some(())
    })
    .await;
    let now = api.get(&name).await.unwrap();
    assert_eq!(
        now.metadata.resource_version, foreign.metadata.resource_version,
        "never written"
    );
    let mine = eventually(
        "west's own slice, written despite the taken name",
        || async {
            let s = ours(&w, "west", "hello").await;
            (s.len() == 1).then(|| s[0].clone())
        },
    )
    .await;
    assert_eq!(
        mine["metadata"]["labels"]["multicluster.kubernetes.io/source-cluster"],
        "west"
    );
    assert_eq!(addresses(&mine), ["10.244.2.7"]);
    west.stop().await;
    east.stop().await;
}

/// A slice of `cluster`'s Service `name` as kube-controller-manager writes it.
fn service_slice(ns: &str, name: &str, slice: &str, addrs: &[&str]) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": slice, "namespace": ns, "labels": {
            "kubernetes.io/service-name": name,
            MANAGED_BY: "endpointslice-controller.k8s.io",
        }},
        "addressType": "IPv4",
        "endpoints": addrs.iter().map(|a| json!({
            "addresses": [a], "conditions": {"ready": true}, "nodeName": "node-1",
        })).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}

fn addresses(s: &Value) -> Vec<String> {
    let mut out: Vec<String> = s["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_clusters_own_endpoints_are_copied_into_its_imports_slice_and_follow_its_pods() {
    let w = World::new("mcs-sll").await;
    let west = w.start("west", None);
    w.serve("west", "hello", 80).await;
    let api: Api<EndpointSlice> = Api::namespaced(w.west.clone(), &w.ns);
    let source = api
        .create(
            &PostParams::default(),
            &service_slice(&w.ns, "hello", "hello-abcde", &["10.244.1.7", "10.244.1.8"]),
        )
        .await
        .unwrap();
    w.export("west", "hello").await;
    let import = w
        .import_until("west", "hello", "exported by west", |i| {
            i.clusters() == ["west"]
        })
        .await;
    let derived = import.derived_name().unwrap();
    let copy = eventually("west's own slice", || async {
        let s = ours(&w, "west", "hello").await;
        (s.len() == 1).then(|| s[0].clone())
    })
    .await;
    assert_eq!(
        copy["metadata"]["labels"]["multicluster.kubernetes.io/source-cluster"],
        "west"
    );
    assert_eq!(
        copy["metadata"]["labels"]["kubernetes.io/service-name"],
        derived
    );
    assert_eq!(addresses(&copy), ["10.244.1.7", "10.244.1.8"]);
    assert_eq!(
        ports(&copy),
        [("http".into(), "TCP".into(), 8080)],
        "the pods' port"
    );
    assert_eq!(copy["endpoints"][0]["nodeName"], "node-1");
    assert_eq!(
        copy["metadata"]["ownerReferences"][0]["kind"],
        "ServiceImport"
    );
    // A pod goes: the copy follows.
    let mut fewer = service_slice(&w.ns, "hello", "hello-abcde", &["10.244.1.8"]);
    fewer.metadata.resource_version = source.metadata.resource_version.clone();
    api.replace("hello-abcde", &PostParams::default(), &fewer)
        .await
        .unwrap();
    eventually("the copy follows", || async {
        let s = ours(&w, "west", "hello").await;
        (s.len() == 1 && addresses(&s[0]) == ["10.244.1.8"]).then_some(())
    })
    .await;
    // The source slice is never written by us.
    let now = api.get("hello-abcde").await.unwrap();
    assert_eq!(
        addresses(&serde_json::to_value(&now).unwrap()),
        ["10.244.1.8"]
    );
    // The export goes: the import and its slice go.
    w.exports("west")
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    w.import_gone("west", "hello").await;
    assert_eq!(ours(&w, "west", "hello").await, Vec::<Value>::new());
    assert!(api.get_opt("hello-abcde").await.unwrap().is_some());
    west.stop().await;
}
