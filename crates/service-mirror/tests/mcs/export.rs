//! ServiceExport conditions (KEP-1645; issue 17 point 2) on real apiservers, in the
//! two-cluster world of `support/mcs.rs`: each cluster's component writes only its own
//! cluster's export conditions.
//!
//! Expected conditions are written out from the KEP here, never computed with the core.

use crate::support::controller::{Controller, LinkSecrets};
use crate::support::mcs::*;
use crate::support::{create_namespace, eventually};
use crate::{Judged, past_second_of, poke_import};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use local_cluster::{shared_cluster, unique_namespace};
use service_mirror_controller::leader::Leadership;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_is_invalid_without_its_service_valid_once_it_comes_and_never_for_external_name()
{
    let w = World::new("mcs-valid").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    w.export("west", "lonely").await;
    w.until("west", "lonely", &invalid("NoService")).await;
    w.serve("west", "lonely", 80).await;
    w.until("west", "lonely", &exported()).await;
    w.service(
        "west",
        "outside",
        serde_json::json!({"type": "ExternalName", "externalName": "example.invalid"}),
    )
    .await;
    w.export("west", "outside").await;
    w.until("west", "outside", &invalid("InvalidServiceType"))
        .await;
    eventually(
        "an ExportInvalid Event on the ExternalName export",
        || async {
            w.our_events("west", "outside")
                .await
                .contains(&"ExportInvalid".to_string())
                .then_some(())
        },
    )
    .await;
    for series in [
        r#"service_mirror_mcs_exports{state="InvalidServiceType"} 1"#,
        r#"service_mirror_mcs_exports{state="Exported"} 1"#,
        r#"service_mirror_mcs_exports{state="NoService"} 0"#,
        // The runtime counted MCS's reconciles.
        r#"service_mirror_component_reconciles_total{component="mcs",outcome="done"}"#,
    ] {
        west.metric(series).await;
    }
    // The Service goes: invalid again, nothing else touched.
    Api::<Service>::namespaced(w.west.clone(), &w.ns)
        .delete("lonely", &DeleteParams::default())
        .await
        .unwrap();
    w.until("west", "lonely", &invalid("NoService")).await;
    assert!(
        w.conditions("east", "lonely").await.is_empty(),
        "east has no such export: nothing written there"
    );
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_that_differ_across_clusters_raise_conflict_on_both_until_they_agree() {
    let w = World::new("mcs-conflict").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    // Ports: one name, two numbers.
    w.serve("west", "hello", 80).await;
    w.export("west", "hello").await;
    w.serve("east", "hello", 8080).await;
    w.export("east", "hello").await;
    // Headless in one cluster only.
    w.service(
        "west",
        "mixed",
        clusterip(serde_json::json!([tcp("db", 5432)])),
    )
    .await;
    w.export("west", "mixed").await;
    w.service(
        "east",
        "mixed",
        serde_json::json!({"clusterIP": "None", "selector": {"app": "x"}, "ports": [tcp("db", 5432)]}),
    )
    .await;
    w.export("east", "mixed").await;
    // The conformance suite's service: TCP and UDP on one number, the same in both.
    let both = serde_json::json!([
        tcp("tcp", 42),
        {"name": "udp", "port": 42, "protocol": "UDP"},
    ]);
    for c in ["west", "east"] {
        w.service(c, "same", clusterip(both.clone())).await;
        w.export(c, "same").await;
    }
    for c in ["west", "east"] {
        w.until(c, "hello", &in_conflict("PortConflict")).await;
        w.until(c, "mixed", &in_conflict("TypeConflict")).await;
        w.until(c, "same", &exported()).await;
    }
    for c in ["west", "east"] {
        eventually(&format!("an ExportConflict Event in {c}"), || async {
            w.our_events(c, "hello")
                .await
                .contains(&"ExportConflict".to_string())
                .then_some(())
        })
        .await;
    }
    // They agree: the conflict ends on both, its transition time moves.
    let before = w.conditions("west", "hello").await;
    // Transition times have whole seconds: a Valid time reset would show.
    let valid = before.iter().find(|c| c.type_ == "Valid").unwrap();
    past_second_of(&valid.last_transition_time).await;
    w.serve("east", "hello", 80).await;
    for c in ["west", "east"] {
        w.until(c, "hello", &exported()).await;
    }
    let after = w.conditions("west", "hello").await;
    let time = |cs: &[Condition], t: &str| {
        cs.iter()
            .find(|c| c.type_ == t)
            .map(|c| c.last_transition_time.clone())
    };
    assert_eq!(
        time(&before, "Valid"),
        time(&after, "Valid"),
        "Valid did not change: its time stays"
    );
    assert!(
        before
            .iter()
            .any(|c| c.type_ == "Conflict" && c.status == "True")
            && after
                .iter()
                .any(|c| c.type_ == "Conflict" && c.status == "False"),
        "{before:?} -> {after:?}"
    );
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_ends_takes_its_exports_out_of_the_merge_and_other_writers_conditions_stay() {
    let w = World::new("mcs-link").await;
    // Someone else's condition on the export, written before ours.
    w.serve("west", "hello", 80).await;
    w.export("west", "hello").await;
    w.their_condition(
        "west",
        "hello",
        "someone-else",
        "example.com/Audited",
        "by someone else",
    )
    .await;
    w.serve("east", "hello", 81).await;
    w.export("east", "hello").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    let all = w.until("west", "hello", &in_conflict("PortConflict")).await;
    assert!(
        all.iter()
            .any(|c| c.type_ == "example.com/Audited" && c.message == "by someone else"),
        "another writer's condition stays: {all:?}"
    );
    // West's link to east ends: east's export no longer counts there.
    west.link.cancel();
    w.until("west", "hello", &exported()).await;
    // East still sees both.
    w.until("east", "hello", &in_conflict("PortConflict")).await;
    assert!(
        w.conditions("west", "hello")
            .await
            .iter()
            .any(|c| c.type_ == "example.com/Audited"),
        "still there"
    );
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_are_written_only_while_leader_and_an_unchanged_world_writes_nothing() {
    let w = World::new("mcs-leader").await;
    w.serve("west", "hello", 80).await;
    w.export("west", "hello").await;
    let (switch, leadership) = Leadership::manual(false);
    let west = w.start("west", Some(leadership));
    // Both clusters listed, then a while not leading: nothing written.
    west.metric("service_mirror_mcs_clusters_listed 2").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(w.conditions("west", "hello").await.is_empty());
    assert_eq!(west.writes("applied"), 0);
    switch.send_replace(true);
    w.until("west", "hello", &exported()).await;
    west.metric(r#"service_mirror_mcs_export_status_writes_total{outcome="applied"} 1"#)
        .await;
    let written = west.writes("applied");
    assert_eq!(written, 1, "one write: the three conditions at once");
    // The import is written after the conditions, in the same reconcile: the poke below
    // patches it (it met a 404 now and then under load).
    w.import_until("west", "hello", "made", |_| true).await;
    // Idle: what the merge does not read changes (a label, the selector), and another
    // cluster makes a Service nobody exports here: nothing judged, nothing written.
    Api::<Service>::namespaced(w.west.clone(), &w.ns)
        .patch(
            "hello",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"labels": {"touched": "yes"}},
                "spec": {"selector": {"app": "other"}},
            })),
        )
        .await
        .unwrap();
    w.service(
        "east",
        "unrelated",
        clusterip(serde_json::json!([tcp("x", 1)])),
    )
    .await;
    // Then a change that is judged and writes nothing (another writer's annotation on
    // the import): its look comes after those changes' events, and a write they led to
    // would be counted by then.
    poke_import(&w, &west, "west", "hello").await;
    assert_eq!(west.writes("applied"), written, "no write in an idle world");
    assert_eq!(west.writes("failed"), 0);
    west.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_another_writer_owns_are_never_overwritten_and_that_is_reported() {
    let w = World::new("mcs-owned").await;
    w.serve("west", "hello", 80).await;
    w.export("west", "hello").await;
    w.their_condition(
        "west",
        "hello",
        "other-mcs",
        "Valid",
        "another controller's",
    )
    .await;
    let west = w.start("west", None);
    eventually("an ExportConditionsOwned Event", || async {
        w.our_events("west", "hello")
            .await
            .contains(&"ExportConditionsOwned".to_string())
            .then_some(())
    })
    .await;
    west.metric(r#"service_mirror_mcs_export_status_writes_total{outcome="owned_by_another"} 1"#)
        .await;
    let all = w.conditions("west", "hello").await;
    assert_eq!(all.len(), 1, "nothing of ours added: {all:?}");
    assert_eq!(all[0].message, "another controller's");
    west.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controller_processes_linked_both_ways_judge_each_others_exports() {
    let w = World::new("mcs-bin").await;
    let (west_cluster, east_cluster) = (
        shared_cluster("mcs-west").await.unwrap(),
        shared_cluster("mcs-east").await.unwrap(),
    );
    let ctl = unique_namespace("mcsctl");
    create_namespace(&w.west, &ctl).await;
    create_namespace(&w.east, &ctl).await;
    LinkSecrets::new(&w.west, &ctl)
        .link(
            "east",
            Some("east"),
            Some(&east_cluster.admin_kubeconfig().yaml),
        )
        .await;
    LinkSecrets::new(&w.east, &ctl)
        .link(
            "west",
            Some("west"),
            Some(&west_cluster.admin_kubeconfig().yaml),
        )
        .await;
    // Only this test's namespace: the apiservers are shared with the other tests.
    let flags = |name: &'static str| ["--mcs-cluster-name", name, "--namespace-allow"];
    let west = Controller::spawn(
        &west_cluster,
        &ctl,
        &[&flags("west")[..], &[&w.ns]].concat(),
    );
    let east = Controller::spawn(
        &east_cluster,
        &ctl,
        &[&flags("east")[..], &[&w.ns]].concat(),
    );
    w.serve("west", "hello", 80).await;
    w.serve("east", "hello", 8080).await;
    w.export("west", "hello").await;
    w.export("east", "hello").await;
    for c in ["west", "east"] {
        w.until(c, "hello", &in_conflict("PortConflict")).await;
    }
    w.serve("east", "hello", 80).await;
    for c in ["west", "east"] {
        w.until(c, "hello", &exported()).await;
    }
    for (c, controller) in [("west", &west), ("east", &east)] {
        // The gauge is set once the worker's pass ends: after the conditions, and
        // after the name's import writes that follow them.
        let text = eventually(&format!("{c}: Exported 1"), || async {
            let text = controller.metrics().await;
            text.contains(r#"service_mirror_mcs_exports{state="Exported"} 1"#)
                .then_some(text)
        })
        .await;
        assert!(
            !text.contains("service_mirror_mcs_watch_errors_total{"),
            "{c}: no failed watch: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_link_that_stops_leaves_the_running_links_exports_counted() {
    let w = World::new("mcs-rotate").await;
    w.serve("west", "hello", 80).await;
    w.export("west", "hello").await;
    w.serve("east", "hello", 81).await;
    w.export("east", "hello").await;
    let west = w.start("west", None);
    w.until("west", "hello", &in_conflict("PortConflict")).await;
    // A rotation that times out: a second link of east starts, lists, and stops.
    let replacement = CancellationToken::new();
    let tasks = west.mcs.link("east", &w.east, &replacement);
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Its end queues every import: the name is judged again without it.
    let judged = Judged::mark(&w, &west, "hello");
    replacement.cancel();
    for t in tasks {
        let _ = t.await;
    }
    judged.passed().await;
    w.until("west", "hello", &in_conflict("PortConflict")).await;
    // The first link still feeds: east agreeing ends the conflict.
    w.serve("east", "hello", 80).await;
    w.until("west", "hello", &exported()).await;
    // A link named like this cluster is refused: nothing of it is read.
    let own = CancellationToken::new();
    assert!(west.mcs.link("west", &w.east, &own).is_empty());
    west.stop().await;
}
