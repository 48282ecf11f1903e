//! `--mcs-exports N`: the Multi-Cluster Services cold sync. Two fresh local clusters,
//! west and east, each with the MCS and Link CRDs, named by its ClusterProperty
//! `id.k8s.io` and running a plain `service-mirror run` (MCS on by default there),
//! linked to the other by a `Link` whose gateway is 192.0.2.50:4143 (never probed:
//! no probe port; nothing is sent there); west exports N Services, each with one
//! EndpointSlice of one endpoint. Timed from the controllers' start until, in both
//! clusters, every import exists with its ClusterSetIP and west's `status.clusters` and
//! has its EndpointSlice (in west a copy of the Service's, in east at west's gateway),
//! and every export in west says `Ready`. The reference writer, in the same run and on
//! the same apiservers (another namespace), writes the same objects as fast as the
//! apiservers take them: per name and cluster a derived Service, then the ServiceImport
//! with its IP, then the import's status, then its EndpointSlice (owned by the import);
//! in west also each export's conditions. Each name's writes go in order (each needs
//! the previous answer), `concurrency` names at a time per cluster, both clusters at
//! once.

use crate::observe::bench_client;
use crate::process::{Controller, ControllerBin, cpu_seconds, memory_mib};
use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use local_cluster::{ClusterOptions, LocalCluster, apply_yaml};
use service_mirror_controller::links::LINK_CRD_YAML;
use service_mirror_controller::mcs::startup::{CLUSTER_PROPERTY_CRD_YAML, cluster_id_property};
use service_mirror_controller::mcs::{SERVICE_EXPORT_CRD_YAML, SERVICE_IMPORT_CRD_YAML};
use service_mirror_controller::permissions::service_export_api_served;
use service_mirror_core::ResolvedGateway;
use service_mirror_core::ServiceKey;
use service_mirror_core::mcs::{ImportPort, ImportSpec, ImportType};
use service_mirror_core::mcs_derived::{desired_derived_service, import_ips};
use service_mirror_core::mcs_slices::{ImportSlicesInput, SourceGateway, desired_import_slices};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// The exported Services' namespace (the controllers read only it).
const NAMESPACE: &str = "mcs-bench";
/// The reference writer's namespace (no controller reads it).
const REFERENCE: &str = "mcs-reference";
/// The controllers' namespace (link Secrets).
const CONTROLLER: &str = "service-mirror";
/// How often the controllers' progress is listed.
const POLL: Duration = Duration::from_secs(1);
/// The controllers give up after this.
const LIMIT: Duration = Duration::from_secs(900);
/// Each cluster's gateway as its peer's Link names it (documentation range: never
/// probed, nothing is sent there).
const GATEWAY: &str = "192.0.2.50";
const GATEWAY_PORT: i32 = 4143;
const GATEWAY_IDENTITY: &str =
    "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local";

/// What one run needs.
pub(crate) struct McsRun<'a> {
    /// Exported Services in west.
    pub(crate) exports: usize,
    /// The controller executable.
    pub(crate) controller: &'a ControllerBin,
    /// Reference requests in flight per cluster (names at a time).
    pub(crate) concurrency: usize,
    /// Where the controllers' logs go.
    pub(crate) workdir: &'a Path,
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "multicluster.x-k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "multicluster.x-k8s.io/v1beta1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn imports(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &resource("ServiceImport", "serviceimports"),
    )
}

fn exports(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &resource("ServiceExport", "serviceexports"),
    )
}

fn name(i: usize) -> String {
    format!("svc-{i}")
}

async fn cluster(name: &str) -> anyhow::Result<(LocalCluster, Client)> {
    let c = LocalCluster::start_with(name, ClusterOptions::default()).await?;
    let client = bench_client(&c.admin_kubeconfig().yaml).await?;
    for yaml in [
        SERVICE_EXPORT_CRD_YAML,
        SERVICE_IMPORT_CRD_YAML,
        CLUSTER_PROPERTY_CRD_YAML,
        LINK_CRD_YAML,
    ] {
        apply_yaml(&client, yaml).await?;
    }
    let id = cluster_id_property(name.trim_start_matches("bench-mcs-"));
    let start = Instant::now();
    // Served: discovery lists the exports (what the controllers' start asks), the
    // property applies and Links list.
    while !service_export_api_served(&client).await.unwrap_or(false)
        || apply_yaml(&client, &id.to_string()).await.is_err()
        || links(&client).list(&ListParams::default()).await.is_err()
    {
        if start.elapsed() > Duration::from_secs(60) {
            bail!("{name}: the ServiceExport, ClusterProperty or Link CRD is not served");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for ns in [NAMESPACE, REFERENCE, CONTROLLER] {
        local_cluster::ensure_namespace(&client, ns).await?;
    }
    Ok((c, client))
}

fn links(client: &Client) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "multicluster.linkerd.io".into(),
        version: "v1alpha3".into(),
        api_version: "multicluster.linkerd.io/v1alpha3".into(),
        kind: "Link".into(),
        plural: "links".into(),
    };
    Api::namespaced_with(client.clone(), CONTROLLER, &resource)
}

/// The EndpointSlice of exported Service `i` in `ns`: one ready endpoint at
/// 198.18.x.y (never reached: nothing is sent to it).
fn source_slice(ns: &str, i: usize) -> anyhow::Result<EndpointSlice> {
    let ip = format!("198.18.{}.{}", i / 250, 1 + i % 250);
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{}-abcde", name(i)), "namespace": ns,
                     "labels": {"kubernetes.io/service-name": name(i),
                                "endpointslice.kubernetes.io/managed-by": "bench.service-mirror.io"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))?)
}

/// N Services with their exports and EndpointSlices in `ns` (not timed).
async fn export_all(client: &Client, ns: &str, n: usize) -> anyhow::Result<()> {
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let exports = exports(client, ns);
    futures::stream::iter(0..n)
        .map(|i| {
            let (services, slices, exports) = (services.clone(), slices.clone(), exports.clone());
            async move {
                let svc: Service = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name(i)},
                    "spec": {"selector": {"app": name(i)},
                             "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
                }))?;
                services.create(&PostParams::default(), &svc).await?;
                slices
                    .create(&PostParams::default(), &source_slice(ns, i)?)
                    .await?;
                let export: DynamicObject = serde_json::from_value(serde_json::json!({
                    "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
                    "metadata": {"name": name(i)},
                }))?;
                exports.create(&PostParams::default(), &export).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// What every import of the run is (one TCP port).
fn spec() -> ImportSpec {
    ImportSpec {
        type_: ImportType::ClusterSetIp,
        ports: vec![ImportPort {
            name: "http".into(),
            protocol: "TCP".into(),
            port: 80,
            app_protocol: None,
        }],
        session_affinity: Some("None".into()),
        session_affinity_config: None,
        internal_traffic_policy: Some("Cluster".into()),
        traffic_distribution: None,
        ip_families: vec!["IPv4".into()],
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
    }
}

/// The EndpointSlices of import `i` of the reference namespace in `cluster` (west: a
/// copy of the Service's; east: at west's gateway), owned by the import `owner`, as the
/// controller's core builds them (the reference writes the same objects; what it
/// measures is the writes, not how they are computed).
fn reference_slices(
    cluster: &str,
    i: usize,
    owner: OwnerReference,
) -> anyhow::Result<Vec<EndpointSlice>> {
    let key = ServiceKey::new(REFERENCE, name(i));
    let local = [source_slice(REFERENCE, i)?];
    let gateway = SourceGateway {
        gateway: ResolvedGateway::new([GATEWAY.parse()?], GATEWAY_PORT)
            .with_identity(Some(GATEWAY_IDENTITY.into())),
        domain: "cluster.local".into(),
    };
    let gateways = BTreeMap::from([("west".to_string(), Some(gateway))]);
    let desired = desired_import_slices(&ImportSlicesInput {
        key: &key,
        ports: &spec().ports,
        headless: false,
        clusters: &["west".to_string()],
        local_cluster: cluster,
        local_slices: Some(&local),
        gateways: &gateways,
        controller_namespace: CONTROLLER,
        traffic: &service_mirror_core::traffic::TrafficPolicy::spread(),
    });
    Ok(desired
        .slices
        .into_iter()
        .map(|mut s| {
            s.metadata.owner_references = Some(vec![owner.clone()]);
            s
        })
        .collect())
}

/// The reference writer's chain for name `i` in `cluster`: the derived Service, the
/// import with its IP, the import's status, its EndpointSlice; in west also the
/// export's conditions.
async fn reference_one(client: &Client, cluster: &str, i: usize) -> anyhow::Result<()> {
    let export = cluster == "west";
    let key = ServiceKey::new(REFERENCE, name(i));
    let derived = desired_derived_service(&key, &spec(), CONTROLLER);
    let services: Api<Service> = Api::namespaced(client.clone(), REFERENCE);
    let created = services.create(&PostParams::default(), &derived).await?;
    let import: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
        "metadata": {"name": name(i), "labels": {"service-mirror.io/mcs-import": "true"}},
        "spec": {"type": "ClusterSetIP", "ips": import_ips(&created), "ipFamilies": ["IPv4"],
                 "sessionAffinity": "None", "internalTrafficPolicy": "Cluster",
                 "ports": [{"name": "http", "protocol": "TCP", "port": 80}]},
    }))?;
    let api = imports(client, REFERENCE);
    let stored = api.create(&PostParams::default(), &import).await?;
    let status = serde_json::json!({
        "metadata": {"resourceVersion": stored.metadata.resource_version},
        "status": {"clusters": [{"cluster": "west"}]},
    });
    api.patch_status(&name(i), &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let owner = OwnerReference {
        api_version: "multicluster.x-k8s.io/v1beta1".into(),
        kind: "ServiceImport".into(),
        name: name(i),
        uid: stored.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        ..Default::default()
    };
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), REFERENCE);
    for slice in reference_slices(cluster, i, owner)? {
        slices.create(&PostParams::default(), &slice).await?;
    }
    if export {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let condition = |t: &str, s: &str, r: &str| {
            serde_json::json!({"type": t, "status": s, "reason": r, "message": "",
                               "lastTransitionTime": now})
        };
        let body = serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
            "metadata": {"name": name(i)},
            "status": {"conditions": [condition("Valid", "True", "Valid"),
                                      condition("Ready", "True", "Exported"),
                                      condition("Conflict", "False", "NoConflicts")]},
        });
        exports(client, REFERENCE)
            .patch_status(
                &name(i),
                &PatchParams::apply("reference"),
                &Patch::Apply(&body),
            )
            .await?;
    }
    Ok(())
}

async fn reference(
    client: &Client,
    cluster: &str,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    futures::stream::iter(0..n)
        .map(|i| reference_one(client, cluster, i))
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<_>>()
        .await
        .context("reference writer")?;
    Ok(())
}

/// How many of the N imports of `client`'s cluster are complete (with their slice of
/// one endpoint at `address`: `None`, any), and (west) exports `Ready`.
async fn done(
    client: &Client,
    with_exports: bool,
    address: Option<&str>,
) -> anyhow::Result<(usize, usize)> {
    let list = imports(client, NAMESPACE)
        .list(&ListParams::default())
        .await?;
    let sliced: std::collections::BTreeSet<String> =
        Api::<EndpointSlice>::namespaced(client.clone(), NAMESPACE)
            .list(&ListParams::default().labels("multicluster.kubernetes.io/source-cluster=west"))
            .await?
            .items
            .into_iter()
            .filter(|s| {
                s.endpoints.len() == 1
                    && address.is_none_or(|a| s.endpoints[0].addresses == [a.to_string()])
            })
            .filter_map(|s| {
                s.metadata
                    .labels?
                    .remove("multicluster.kubernetes.io/service-name")
            })
            .collect();
    let complete = list
        .items
        .iter()
        .filter(|i| {
            i.data["spec"]["ips"]
                .as_array()
                .is_some_and(|a| a.len() == 1)
                && i.data["status"]["clusters"] == serde_json::json!([{"cluster": "west"}])
                && i.metadata.name.as_ref().is_some_and(|n| sliced.contains(n))
        })
        .count();
    let ready = match with_exports {
        false => 0,
        true => exports(client, NAMESPACE)
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|e| {
                e.data["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .count(),
    };
    Ok((complete, ready))
}

/// A `Link` to `cluster` in `client`'s cluster, through its gateway [`GATEWAY`], and
/// its credentials Secret.
async fn link(client: &Client, cluster: &str, kubeconfig: &str) -> anyhow::Result<()> {
    let credentials = format!("cluster-credentials-{cluster}");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": credentials},
        "type": "mirror.linkerd.io/remote-kubeconfig",
        "stringData": {"kubeconfig": kubeconfig},
    }))?;
    Api::<Secret>::namespaced(client.clone(), CONTROLLER)
        .create(&PostParams::default(), &secret)
        .await?;
    let link: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.linkerd.io/v1alpha3", "kind": "Link",
        "metadata": {"name": cluster},
        "spec": {
            "targetClusterName": cluster,
            "targetClusterDomain": "cluster.local",
            "targetClusterLinkerdNamespace": "linkerd",
            "clusterCredentialsSecret": credentials,
            "gatewayAddress": GATEWAY,
            "gatewayPort": GATEWAY_PORT.to_string(),
            "gatewayIdentity": GATEWAY_IDENTITY,
            "selector": {"matchLabels": {"mirror.linkerd.io/exported": "true"}},
        },
    }))?;
    links(client).create(&PostParams::default(), &link).await?;
    Ok(())
}

/// Runs the scenario; returns its JSON result.
pub(crate) async fn bench(run: McsRun<'_>) -> anyhow::Result<serde_json::Value> {
    let n = run.exports;
    let ((west, wc), (east, ec)) =
        tokio::try_join!(cluster("bench-mcs-west"), cluster("bench-mcs-east"))?;
    export_all(&wc, NAMESPACE, n).await?;
    export_all(&wc, REFERENCE, n).await?;
    eprintln!(
        "mcs: {n} exports in west; reference writer, {} names at a time per cluster",
        run.concurrency
    );
    // Both apiservers' CPU in each phase: where the time goes beside the writes.
    let apiservers =
        || crate::scrape::cpu(west.apiserver_pid()) + crate::scrape::cpu(east.apiserver_pid());
    let api0 = apiservers();
    let t0 = Instant::now();
    tokio::try_join!(
        reference(&wc, "west", n, run.concurrency),
        reference(&ec, "east", n, run.concurrency)
    )?;
    let reference_time = t0.elapsed();
    let api_reference = apiservers() - api0;
    eprintln!(
        "mcs: reference writer {:.2} s",
        reference_time.as_secs_f64()
    );

    link(&wc, "east", &east.admin_kubeconfig().yaml).await?;
    link(&ec, "west", &west.admin_kubeconfig().yaml).await?;
    // No MCS flag: each is named by its ClusterProperty.
    let spawn = |c: &LocalCluster, me: &str, admin: &str| {
        Controller::spawn(
            run.controller,
            &c.admin_kubeconfig().path,
            CONTROLLER,
            admin,
            &["--namespace-allow".into(), NAMESPACE.into()],
            &run.workdir.join(format!("controller-{me}.log")),
        )
    };
    let api0 = apiservers();
    let t0 = Instant::now();
    let admin_west = format!("127.0.0.1:{}", crate::free_port()?);
    let admin_east = format!("127.0.0.1:{}", crate::free_port()?);
    let mut ctl_west = spawn(&west, "west", &admin_west)?;
    let mut ctl_east = spawn(&east, "east", &admin_east)?;
    // When each cluster had its first import done: the start (processes, discovery,
    // links, lists) apart from the writing.
    let (mut first_west, mut first_east) = (None, None);
    let controller_time = loop {
        let ((wi, wr), (ei, _)) =
            tokio::try_join!(done(&wc, true, None), done(&ec, false, Some(GATEWAY)))?;
        if wi > 0 && first_west.is_none() {
            first_west = Some(t0.elapsed().as_secs_f64());
        }
        if ei > 0 && first_east.is_none() {
            first_east = Some(t0.elapsed().as_secs_f64());
        }
        if std::env::var_os("BENCH_MCS_PROGRESS").is_some() {
            eprintln!(
                "mcs: {:.1} s: west imports {wi}, ready {wr}; east imports {ei}",
                t0.elapsed().as_secs_f64()
            );
        }
        if wi == n && wr == n && ei == n {
            break t0.elapsed();
        }
        ctl_west.check_running()?;
        ctl_east.check_running()?;
        if t0.elapsed() > LIMIT {
            bail!(
                "mcs: not synced after {LIMIT:?}: west imports {wi}, ready {wr}; east imports {ei}"
            );
        }
        // Each look lists every import, slice and export of both clusters (1,000 objects
        // each, ~0.4 s a look): every 100 ms it loaded the apiservers the controllers
        // write to (one run each, quiet: 41.0 s at 100 ms, 37.2 s at 1 s). Up to 1 s
        // late on a ~40 s sync.
        tokio::time::sleep(POLL).await;
    };
    let api_controllers = apiservers() - api0;
    let ratio = controller_time.as_secs_f64() / reference_time.as_secs_f64();
    // How many passes a name took: MCS's reconciles by outcome, its writes, and every
    // request to the local apiserver.
    let passes = |metrics: &str| {
        let mut by: BTreeMap<String, f64> = BTreeMap::new();
        for line in metrics.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let counted = series
                .starts_with("service_mirror_component_reconciles_total{component=\"mcs\"")
                || series.starts_with("service_mirror_mcs_import_writes_total{")
                || series.starts_with("service_mirror_mcs_export_status_writes_total{")
                || series.starts_with("service_mirror_kube_requests_total{client=\"local\"");
            if counted {
                *by.entry(series.to_string()).or_default() += value.parse::<f64>().unwrap_or(0.0);
            }
        }
        by
    };
    let counted_west = passes(&crate::scrape::scrape_metrics(&admin_west).await?);
    let counted_east = passes(&crate::scrape::scrape_metrics(&admin_east).await?);
    let usage = |c: &Controller, counted: &BTreeMap<String, f64>| {
        serde_json::json!({
            "cpu_s": cpu_seconds(c.pid),
            "rss_mib": memory_mib(c.pid, "VmRSS"),
            "hwm_mib": memory_mib(c.pid, "VmHWM"),
            "counted": counted,
        })
    };
    let result = serde_json::json!({
        "exports": n,
        "reference_concurrency": run.concurrency,
        "reference_s": reference_time.as_secs_f64(),
        "controller_s": controller_time.as_secs_f64(),
        "ratio": ratio,
        "first_import_s": {"west": first_west, "east": first_east},
        "apiserver_cpu_s": {"reference": api_reference, "controllers": api_controllers},
        "west": usage(&ctl_west, &counted_west),
        "east": usage(&ctl_east, &counted_east),
    });
    eprintln!(
        "mcs: cold sync of {n} exports across 2 clusters: controllers {:.2} s, reference {:.2} s, ratio {ratio:.2}; {result}",
        controller_time.as_secs_f64(),
        reference_time.as_secs_f64()
    );
    ctl_west.stop()?;
    ctl_east.stop()?;
    Ok(result)
}
