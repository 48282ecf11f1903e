//! ServiceExport conditions (KEP-1645; issue 17 point 2) on real apiservers: two
//! clusters, west and east, each with its own MCS component that reads the other's
//! exports through a client as a link gives it (a full mesh) and writes only its own
//! cluster's export conditions. Each test reads only its own namespace (the
//! components' namespace filter), so tests sharing the apiservers do not meet.
//!
//! Expected conditions are written out from the KEP here, never computed with the core.

mod support;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use local_cluster::{LocalCluster, apply_yaml, shared_cluster, unique_namespace};
use service_mirror_controller::events::EventRecorder;
use service_mirror_controller::leader::Leadership;
use service_mirror_controller::mcs::resource::ServiceExport;
use service_mirror_controller::mcs::{
    Mcs, McsOptions, SERVICE_EXPORT_CRD_NAME, SERVICE_EXPORT_CRD_YAML, SERVICE_IMPORT_CRD_YAML,
};
use service_mirror_controller::metrics::Metrics;
use service_mirror_controller::writer::FIELD_MANAGER;
use service_mirror_core::NamespaceFilter;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use support::controller::{Controller, LinkSecrets};
use support::{create_namespace, events_about, eventually, init_tracing};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// (status, reason) by condition type.
type Conditions = BTreeMap<String, (String, String)>;

fn expect(rows: &[(&str, &str, &str)]) -> Conditions {
    rows.iter()
        .map(|(t, s, r)| ((*t).into(), ((*s).into(), (*r).into())))
        .collect()
}

/// The KEP's conditions of a valid export with no conflict.
fn exported() -> Conditions {
    expect(&[
        ("Valid", "True", "Valid"),
        ("Ready", "True", "Exported"),
        ("Conflict", "False", "NoConflicts"),
    ])
}

/// ... of a valid export in conflict for `reason`.
fn in_conflict(reason: &str) -> Conditions {
    expect(&[
        ("Valid", "True", "Valid"),
        ("Ready", "True", "Exported"),
        ("Conflict", "True", reason),
    ])
}

/// ... of an invalid export (no Conflict condition: it takes no part in the merge).
fn invalid(reason: &str) -> Conditions {
    expect(&[("Valid", "False", reason), ("Ready", "False", "Failed")])
}

/// One cluster's running component.
struct Running {
    mcs: Mcs,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
    /// The link to the other cluster: cancelled alone, its exports leave.
    link: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        self.link.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Waits until the metrics hold `series` (updated after the write or Event a test
    /// sees in the API).
    async fn metric(&self, series: &str) {
        eventually(&format!("metric {series}"), || async {
            self.metrics.encode().contains(series).then_some(())
        })
        .await
    }

    fn writes(&self, outcome: &str) -> u64 {
        let text = self.metrics.encode();
        let series =
            format!("service_mirror_mcs_export_status_writes_total{{outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |v| v.trim().parse().unwrap())
    }
}

struct World {
    west: Client,
    east: Client,
    ns: String,
}

async fn installed(cluster: &LocalCluster) -> Client {
    let client = cluster.client().await.unwrap();
    for yaml in [SERVICE_EXPORT_CRD_YAML, SERVICE_IMPORT_CRD_YAML] {
        apply_yaml(&client, yaml).await.expect("the CRD applies");
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    eventually("the ServiceExport CRD Established", || {
        let crds = crds.clone();
        async move {
            let crd = crds.get(SERVICE_EXPORT_CRD_NAME).await.ok()?;
            crd.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        }
    })
    .await;
    // Established can come before the resource is served.
    let api: Api<ServiceExport> = Api::all(client.clone());
    eventually("ServiceExports listable", || async {
        api.list(&Default::default()).await.ok()
    })
    .await;
    client
}

impl World {
    async fn new(prefix: &str) -> Self {
        init_tracing();
        let west = installed(&shared_cluster("mcs-west").await.unwrap()).await;
        let east = installed(&shared_cluster("mcs-east").await.unwrap()).await;
        let ns = unique_namespace(prefix);
        create_namespace(&west, &ns).await;
        create_namespace(&east, &ns).await;
        Self { west, east, ns }
    }

    /// The component of `cluster` (`"west"` or `"east"`), linked to the other.
    fn start(&self, cluster: &str, leader: Option<Leadership>) -> Running {
        let (local, other, other_name) = match cluster {
            "west" => (&self.west, &self.east, "east"),
            _ => (&self.east, &self.west, "west"),
        };
        let metrics = Metrics::new();
        let cancel = CancellationToken::new();
        let (mcs, mut tasks) = Mcs::start(
            local.clone(),
            EventRecorder::new(local.clone(), None),
            metrics.clone(),
            McsOptions {
                cluster_name: cluster.into(),
                leader,
                namespaces: NamespaceFilter::allow_only([self.ns.clone()]),
            },
            cancel.clone(),
        );
        let link = CancellationToken::new();
        tasks.extend(mcs.link(other_name, other, &link));
        Running {
            mcs,
            metrics,
            cancel,
            link,
            tasks,
        }
    }

    fn client(&self, cluster: &str) -> &Client {
        match cluster {
            "west" => &self.west,
            _ => &self.east,
        }
    }

    async fn service(&self, cluster: &str, name: &str, spec: serde_json::Value) {
        let api: Api<Service> = Api::namespaced(self.client(cluster).clone(), &self.ns);
        let body = serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name}, "spec": spec,
        });
        api.patch(
            name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(body),
        )
        .await
        .unwrap();
    }

    /// A ClusterIP Service `name` with one TCP port `http`/`port`.
    async fn serve(&self, cluster: &str, name: &str, port: i32) {
        self.service(
            cluster,
            name,
            clusterip(serde_json::json!([tcp("http", port)])),
        )
        .await
    }

    /// A condition `type_` of `manager` (not us) on the export's status.
    async fn their_condition(
        &self,
        cluster: &str,
        name: &str,
        manager: &str,
        type_: &str,
        message: &str,
    ) {
        let theirs = serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
            "metadata": {"name": name},
            "status": {"conditions": [{
                "type": type_, "status": "True", "reason": "Theirs",
                "message": message, "lastTransitionTime": "2026-12-01T00:00:00Z",
            }]},
        });
        self.exports(cluster)
            .patch_status(name, &PatchParams::apply(manager), &Patch::Apply(theirs))
            .await
            .unwrap();
    }

    async fn export(&self, cluster: &str, name: &str) {
        let api = self.exports(cluster);
        let body = serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
            "metadata": {"name": name},
        });
        api.patch(name, &PatchParams::apply("test"), &Patch::Apply(body))
            .await
            .unwrap();
    }

    fn exports(&self, cluster: &str) -> Api<ServiceExport> {
        Api::namespaced(self.client(cluster).clone(), &self.ns)
    }

    async fn conditions(&self, cluster: &str, name: &str) -> Vec<Condition> {
        match self.exports(cluster).get_opt(name).await.unwrap() {
            Some(e) => e.conditions().to_vec(),
            None => Vec::new(),
        }
    }

    /// Waits until the export's conditions of our types are `want`.
    async fn until(&self, cluster: &str, name: &str, want: &Conditions) -> Vec<Condition> {
        eventually(&format!("{cluster}/{name}: {want:?}"), || async {
            let all = self.conditions(cluster, name).await;
            let ours: Conditions = all
                .iter()
                .filter(|c| ["Valid", "Ready", "Conflict"].contains(&c.type_.as_str()))
                .map(|c| (c.type_.clone(), (c.status.clone(), c.reason.clone())))
                .collect();
            (&ours == want).then_some(all)
        })
        .await
    }

    /// Reasons of the Events our controller posted about `name` in `cluster`.
    async fn our_events(&self, cluster: &str, name: &str) -> Vec<String> {
        events_about(self.client(cluster), &self.ns, name)
            .await
            .into_iter()
            .filter(|e| e.reporting_controller.as_deref() == Some(FIELD_MANAGER))
            .filter_map(|e| e.reason)
            .collect()
    }
}

/// With a selector, so that the apiserver defaults one IP family whether headless or
/// not (a headless Service without one defaults to RequireDualStack).
fn clusterip(ports: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"ports": ports, "selector": {"app": "x"}})
}

fn tcp(name: &str, port: i32) -> serde_json::Value {
    serde_json::json!({"name": name, "port": port, "protocol": "TCP"})
}

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
    tokio::time::sleep(Duration::from_millis(1100)).await;
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
    tokio::time::sleep(Duration::from_secs(5)).await;
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
        let text = controller.metrics().await;
        assert!(
            text.contains(r#"service_mirror_mcs_exports{state="Exported"} 1"#),
            "{c}: {text}"
        );
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
    replacement.cancel();
    for t in tasks {
        let _ = t.await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.until("west", "hello", &in_conflict("PortConflict")).await;
    // The first link still feeds: east agreeing ends the conflict.
    w.serve("east", "hello", 80).await;
    w.until("west", "hello", &exported()).await;
    // A link named like this cluster is refused: nothing of it is read.
    let own = CancellationToken::new();
    assert!(west.mcs.link("west", &w.east, &own).is_empty());
    west.stop().await;
}
