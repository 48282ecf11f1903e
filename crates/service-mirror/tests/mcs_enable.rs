//! MCS on by default only where it can run (issue 17): the real binary with no MCS flag
//! on a cluster of its own (a ClusterProperty `id.k8s.io` is cluster-wide: on a shared
//! apiserver it would name every other test's controller). Each step is one start of
//! the process and what it says: the log line, the `service_mirror_mcs_state` series,
//! an Event where a ClusterProperty is wrong, and whether a ServiceExport is served.

mod support;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DynamicObject, PostParams};
use local_cluster::{LocalCluster, apply_yaml};
use service_mirror_controller::mcs::startup::{
    CLUSTER_ID_PROPERTY, CLUSTER_PROPERTY_CRD_YAML, cluster_id_property, cluster_property_resource,
};
use service_mirror_controller::mcs::{SERVICE_EXPORT_CRD_YAML, SERVICE_IMPORT_CRD_YAML};
use service_mirror_controller::permissions::service_export_api_served;
use std::time::Duration;
use support::controller::{Controller, service_mirror};
use support::mcs::mcs_api;
use support::{create_namespace, events_on, eventually};

/// Longest wait for a start's verdict (a start asks two questions).
const VERDICT_WITHIN: Duration = Duration::from_secs(30);
const NS: &str = "shop";
const CTL: &str = "mc";

/// A controller with `flags` and no MCS flag from the environment; waits for its
/// verdict series, then for `log` in its log.
async fn started(cluster: &LocalCluster, flags: &[&str], series: &str, log: &[&str]) -> Controller {
    let c = Controller::spawn(cluster, CTL, flags);
    c.wait_log(log, VERDICT_WITHIN).await;
    eventually(&format!("{flags:?}: {series}"), || async {
        c.metrics().await.contains(series).then_some(())
    })
    .await;
    c
}

/// Waits for the process to exit and returns its log: a refused start.
async fn refused(cluster: &LocalCluster, flags: &[&str]) -> String {
    let mut c = Controller::spawn(cluster, CTL, flags);
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = c.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < VERDICT_WITHIN,
            "{flags:?}: still running: {}",
            c.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !status.success(),
        "{flags:?}: a refused start exits with an error"
    );
    c.log_text()
}

fn series(state: &str, reason: &str) -> String {
    format!("service_mirror_mcs_state{{state=\"{state}\",reason=\"{reason}\"}} 1")
}

async fn set_cluster_id(client: &kube::Client, value: &str) {
    let id = cluster_id_property(value);
    apply_yaml(client, &id.to_string()).await.unwrap();
}

/// A Service `name` and its ServiceExport in [`NS`].
async fn export(client: &kube::Client, name: &str) {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let export = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
        "metadata": {"name": name},
    }))
    .unwrap();
    mcs_api(client, NS, "ServiceExport")
        .create(&PostParams::default(), &export)
        .await
        .unwrap();
}

/// The export's condition types (empty: never judged).
async fn conditions(client: &kube::Client, name: &str) -> Vec<String> {
    let e = mcs_api(client, NS, "ServiceExport")
        .get(name)
        .await
        .unwrap();
    e.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["type"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcs_runs_by_default_only_where_the_crd_is_served_and_the_cluster_is_named() {
    support::init_tracing();
    let cluster = LocalCluster::start("mcs-auto").await.unwrap();
    let client = cluster.client().await.unwrap();
    create_namespace(&client, CTL).await;
    create_namespace(&client, NS).await;

    // 1. No ServiceExport CRD: off, quietly; `on` without a name refuses to start, and
    //    so does an unusable --mcs-cluster-name in any mode.
    let mut c = started(
        &cluster,
        &[],
        &series("off", "no_crd"),
        &["MCS off", "no_crd"],
    )
    .await;
    assert!(
        c.log_lines("clusterproperties").is_empty(),
        "the ClusterProperty is not asked where it cannot decide"
    );
    c.terminate();
    let log = refused(&cluster, &["--mcs=on"]).await;
    assert!(log.contains("--mcs=on: this cluster has no name"), "{log}");
    let run = service_mirror(&[
        "run",
        "--kubeconfig",
        cluster.admin_kubeconfig().path.to_str().unwrap(),
        "--namespace",
        CTL,
        "--mcs-cluster-name",
        "West",
    ]);
    assert!(
        !run.ok && run.stderr.contains("--mcs-cluster-name"),
        "{}",
        run.stderr
    );

    // 2. The CRDs (install's three), no name: off, with a warning naming both ways.
    for yaml in [
        SERVICE_EXPORT_CRD_YAML,
        SERVICE_IMPORT_CRD_YAML,
        CLUSTER_PROPERTY_CRD_YAML,
    ] {
        apply_yaml(&client, yaml).await.unwrap();
    }
    eventually(
        "the ServiceExport and ClusterProperty CRDs served",
        || async {
            let exports = mcs_api(&client, NS, "ServiceExport");
            let properties: Api<DynamicObject> =
                Api::all_with(client.clone(), &cluster_property_resource());
            let lp = Default::default();
            (exports.list(&lp).await.is_ok() && properties.list(&lp).await.is_ok()).then_some(())
        },
    )
    .await;
    // The start asks discovery, which may list the CRD after it serves (what it says
    // then is the start's verdict for the process's life).
    eventually("discovery lists ServiceExports", || async {
        service_export_api_served(&client).await.ok()?.then_some(())
    })
    .await;
    export(&client, "web").await;
    // This one runs on (under a Lease of its own, not to hold the others' leadership):
    // once the cluster is named (step 4) its next look says a restart would start MCS.
    let unnamed = started(
        &cluster,
        &["--lease-name", "unnamed"],
        &series("off", "no_cluster_name"),
        &[
            "MCS off",
            "no_cluster_name",
            "--mcs-cluster-name",
            "id.k8s.io",
        ],
    )
    .await;

    // 3. A ClusterProperty value that is no cluster name (KEP-2149 allows dots, our
    //    mirror names do not): off, an error, a Warning Event on the ClusterProperty;
    //    `on` refuses.
    set_cluster_id(&client, "west.zone-1").await;
    let mut c = started(
        &cluster,
        &[],
        &series("off", "invalid_cluster_name"),
        &["ERROR", "MCS off", "west.zone-1"],
    )
    .await;
    let event = eventually(
        "an InvalidClusterName Event on the ClusterProperty",
        || async {
            events_on(&client, "default", CLUSTER_ID_PROPERTY)
                .await
                .into_iter()
                .find(|(reason, _)| reason == "InvalidClusterName")
        },
    )
    .await;
    assert!(event.1.contains("west.zone-1"), "{event:?}");
    c.terminate();
    let log = refused(&cluster, &["--mcs=on"]).await;
    assert!(
        log.contains("--mcs=on: ClusterProperty id.k8s.io value"),
        "{log}"
    );
    assert!(
        conditions(&client, "web").await.is_empty(),
        "nothing judged yet"
    );

    // 4. Named: on as that name; the export is judged and imported under it.
    set_cluster_id(&client, "west").await;
    let mut c = started(
        &cluster,
        &[],
        &series("on", "cluster_property"),
        &["MCS on", "cluster=west"],
    )
    .await;
    eventually("web judged", || async {
        let types = conditions(&client, "web").await;
        ["Valid", "Ready", "Conflict"]
            .iter()
            .all(|t| types.iter().any(|x| x == t))
            .then_some(())
    })
    .await;
    let imports = mcs_api(&client, NS, "ServiceImport");
    eventually("web imported from west", || async {
        imports
            .get_opt("web")
            .await
            .ok()?
            .filter(|i| i.data["status"]["clusters"][0]["cluster"].as_str() == Some("west"))
    })
    .await;
    c.terminate();
    // Its look every 60 s: within 60 s of the name and a little more.
    let asked = std::time::Instant::now();
    loop {
        let text = unnamed.metrics().await;
        if text.contains(&series("off", "restart_needed")) {
            assert!(
                !text.contains(&series("off", "no_cluster_name")),
                "one verdict series: {text}"
            );
            break;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(75),
            "no restart_needed: {}",
            unnamed.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    unnamed
        .wait_log(&["WARN", "MCS can run now", "west"], VERDICT_WITHIN)
        .await;

    // 5. The flag wins over the ClusterProperty; `--mcs=off` wins over both.
    let mut c = started(
        &cluster,
        &["--mcs-cluster-name", "north"],
        &series("on", "flag"),
        &["MCS on", "cluster=north"],
    )
    .await;
    c.terminate();
    let c = started(
        &cluster,
        &["--mcs=off"],
        &series("off", "disabled"),
        &["MCS off", "disabled"],
    )
    .await;
    c.wait_log(&["service mirror running"], VERDICT_WITHIN)
        .await;
    export(&client, "api").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        conditions(&client, "api").await.is_empty(),
        "--mcs=off: a new export is not judged"
    );
    assert!(
        imports.get_opt("api").await.unwrap().is_none(),
        "--mcs=off: nor imported"
    );
}
