//! The MCS tests' world: two real apiservers, west and east, with the MCS CRDs; each
//! cluster's MCS component reads the other's exports through a client as a link gives
//! it (a full mesh) and writes only its own cluster's objects. Each test reads only its
//! own namespace (the components' namespace filter), so tests sharing the apiservers do
//! not meet.

use super::{create_namespace, events_about, eventually, init_tracing};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
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
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// (status, reason) by condition type.
pub(crate) type Conditions = BTreeMap<String, (String, String)>;

pub(crate) fn expect(rows: &[(&str, &str, &str)]) -> Conditions {
    rows.iter()
        .map(|(t, s, r)| ((*t).into(), ((*s).into(), (*r).into())))
        .collect()
}

/// The KEP's conditions of a valid export with no conflict.
pub(crate) fn exported() -> Conditions {
    expect(&[
        ("Valid", "True", "Valid"),
        ("Ready", "True", "Exported"),
        ("Conflict", "False", "NoConflicts"),
    ])
}

/// ... of a valid export in conflict for `reason`.
pub(crate) fn in_conflict(reason: &str) -> Conditions {
    expect(&[
        ("Valid", "True", "Valid"),
        ("Ready", "True", "Exported"),
        ("Conflict", "True", reason),
    ])
}

/// ... of an invalid export (no Conflict condition: it takes no part in the merge).
pub(crate) fn invalid(reason: &str) -> Conditions {
    expect(&[("Valid", "False", reason), ("Ready", "False", "Failed")])
}

/// One cluster's running component.
pub(crate) struct Running {
    pub(crate) mcs: Mcs,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) cancel: CancellationToken,
    /// The link to the other cluster: cancelled alone, its exports leave.
    pub(crate) link: CancellationToken,
    pub(crate) tasks: Vec<JoinHandle<()>>,
}

impl Running {
    pub(crate) async fn stop(self) {
        self.cancel.cancel();
        self.link.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Waits until the metrics hold `series` (updated after the write or Event a test
    /// sees in the API).
    pub(crate) async fn metric(&self, series: &str) {
        eventually(&format!("metric {series}"), || async {
            self.metrics.encode().contains(series).then_some(())
        })
        .await
    }

    pub(crate) fn writes(&self, outcome: &str) -> u64 {
        let text = self.metrics.encode();
        let series =
            format!("service_mirror_mcs_export_status_writes_total{{outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |v| v.trim().parse().unwrap())
    }
}

pub(crate) struct World {
    pub(crate) west: Client,
    pub(crate) east: Client,
    pub(crate) ns: String,
}

pub(crate) async fn installed(cluster: &LocalCluster) -> Client {
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
    pub(crate) async fn new(prefix: &str) -> Self {
        init_tracing();
        let west = installed(&shared_cluster("mcs-west").await.unwrap()).await;
        let east = installed(&shared_cluster("mcs-east").await.unwrap()).await;
        let ns = unique_namespace(prefix);
        create_namespace(&west, &ns).await;
        create_namespace(&east, &ns).await;
        Self { west, east, ns }
    }

    /// The component of `cluster` (`"west"` or `"east"`), linked to the other.
    pub(crate) fn start(&self, cluster: &str, leader: Option<Leadership>) -> Running {
        let running = self.start_unlinked(cluster, leader);
        let other = match cluster {
            "west" => ("east", &self.east),
            _ => ("west", &self.west),
        };
        let tasks = running.mcs.link(other.0, other.1, &running.link);
        Running {
            tasks: running.tasks.into_iter().chain(tasks).collect(),
            ..running
        }
    }

    /// The component of `cluster` with no link yet (as while a restarted controller's
    /// link manager lists its sources and connects).
    pub(crate) fn start_unlinked(&self, cluster: &str, leader: Option<Leadership>) -> Running {
        let local = self.client(cluster);
        let metrics = Metrics::new();
        let cancel = CancellationToken::new();
        let (mcs, tasks) = Mcs::start(
            local.clone(),
            EventRecorder::new(local.clone(), None),
            metrics.clone(),
            McsOptions {
                cluster_name: cluster.into(),
                leader,
                namespaces: NamespaceFilter::allow_only([self.ns.clone(), self.west_only()]),
                controller_namespace: format!("sm-{cluster}"),
                // The other cluster first, then one no link source names (its gauge is
                // checked in import.rs); with two clusters the order changes nothing.
                traffic: service_mirror_core::traffic::TrafficDefaults {
                    priority: vec![
                        if cluster == "west" { "east" } else { "west" }.into(),
                        "nowhere".into(),
                    ],
                    ..Default::default()
                },
            },
            cancel.clone(),
        );
        let link = CancellationToken::new();
        Running {
            mcs,
            metrics,
            cancel,
            link,
            tasks,
        }
    }

    pub(crate) fn client(&self, cluster: &str) -> &Client {
        match cluster {
            "west" => &self.west,
            _ => &self.east,
        }
    }

    pub(crate) async fn service(&self, cluster: &str, name: &str, spec: serde_json::Value) {
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
    pub(crate) async fn serve(&self, cluster: &str, name: &str, port: i32) {
        self.service(
            cluster,
            name,
            clusterip(serde_json::json!([tcp("http", port)])),
        )
        .await
    }

    /// A condition `type_` of `manager` (not us) on the export's status.
    pub(crate) async fn their_condition(
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

    pub(crate) async fn export(&self, cluster: &str, name: &str) {
        self.export_with(cluster, name, serde_json::json!({})).await
    }

    /// A ServiceExport `name` with `spec` (`exportedLabels`, `exportedAnnotations`).
    pub(crate) async fn export_with(&self, cluster: &str, name: &str, spec: serde_json::Value) {
        let api = self.exports(cluster);
        let body = serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
            "metadata": {"name": name}, "spec": spec,
        });
        api.patch(name, &PatchParams::apply("test"), &Patch::Apply(body))
            .await
            .unwrap();
    }

    pub(crate) fn exports(&self, cluster: &str) -> Api<ServiceExport> {
        Api::namespaced(self.client(cluster).clone(), &self.ns)
    }

    pub(crate) async fn conditions(&self, cluster: &str, name: &str) -> Vec<Condition> {
        match self.exports(cluster).get_opt(name).await.unwrap() {
            Some(e) => e.conditions().to_vec(),
            None => Vec::new(),
        }
    }

    /// Waits until the export's conditions of our types are `want`.
    pub(crate) async fn until(
        &self,
        cluster: &str,
        name: &str,
        want: &Conditions,
    ) -> Vec<Condition> {
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
    pub(crate) async fn our_events(&self, cluster: &str, name: &str) -> Vec<String> {
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
pub(crate) fn clusterip(ports: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"ports": ports, "selector": {"app": "x"}})
}

pub(crate) fn tcp(name: &str, port: i32) -> serde_json::Value {
    serde_json::json!({"name": name, "port": port, "protocol": "TCP"})
}

/// The ServiceImport API, read as plain JSON (the oracle does not use the controller's
/// type).
/// The MCS objects of `kind` (`ServiceExport`, `ServiceImport`) in `ns`, as plain JSON.
pub(crate) fn mcs_api(client: &Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("multicluster.x-k8s.io", "v1beta1", kind);
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn import_resource() -> ApiResource {
    ApiResource {
        group: "multicluster.x-k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "multicluster.x-k8s.io/v1beta1".into(),
        kind: "ServiceImport".into(),
        plural: "serviceimports".into(),
    }
}

impl World {
    /// A namespace the components read that exists only where a test creates it.
    pub(crate) fn west_only(&self) -> String {
        format!("{}-w", self.ns)
    }

    /// The ServiceExports of namespace `ns` of `cluster`.
    pub(crate) fn exports_in(&self, cluster: &str, ns: &str) -> Api<ServiceExport> {
        Api::namespaced(self.client(cluster).clone(), ns)
    }

    /// The ServiceImports of namespace `ns` of `cluster`.
    pub(crate) fn imports_in(&self, cluster: &str, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client(cluster).clone(), ns, &import_resource())
    }

    /// The ServiceImports of the test's namespace of `cluster`.
    pub(crate) fn imports(&self, cluster: &str) -> Api<DynamicObject> {
        self.imports_in(cluster, &self.ns)
    }

    /// Waits until the import `name` of `cluster` exists and `ok` holds for it.
    pub(crate) async fn import_until(
        &self,
        cluster: &str,
        name: &str,
        what: &str,
        ok: impl Fn(&Imported) -> bool,
    ) -> Imported {
        let api = self.imports(cluster);
        eventually(&format!("{cluster}/{name}: {what}"), || async {
            let o = api.get_opt(name).await.unwrap()?;
            let i = Imported::read(&o);
            ok(&i).then_some(i)
        })
        .await
    }

    /// Waits until `cluster` holds no import `name` and no derived Service of it.
    pub(crate) async fn import_gone(&self, cluster: &str, name: &str) {
        let api = self.imports(cluster);
        eventually(&format!("{cluster}/{name}: no import"), || async {
            let none = api.get_opt(name).await.unwrap().is_none()
                && self.derived(cluster, name).await.is_empty();
            none.then_some(())
        })
        .await
    }

    /// The derived Services of the import `name` in `cluster` (by their labels).
    pub(crate) async fn derived(&self, cluster: &str, name: &str) -> Vec<Service> {
        let api: Api<Service> = Api::namespaced(self.client(cluster).clone(), &self.ns);
        let selector = format!(
            "multicluster.kubernetes.io/service-name={name},service-mirror.io/mcs-derived=true"
        );
        api.list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
    }

    /// Every EndpointSlice of the import `name` in `cluster` (by the KEP's label, any
    /// writer's), as plain JSON.
    pub(crate) async fn slices(&self, cluster: &str, name: &str) -> Vec<serde_json::Value> {
        let api: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
            Api::namespaced(self.client(cluster).clone(), &self.ns);
        let selector = format!("multicluster.kubernetes.io/service-name={name}");
        let list = api.list(&ListParams::default().labels(&selector)).await;
        list.unwrap()
            .items
            .iter()
            .map(|s| serde_json::to_value(s).unwrap())
            .collect()
    }
}

/// A ServiceImport as the tests read it.
#[derive(Debug, Clone)]
pub(crate) struct Imported {
    pub(crate) object: DynamicObject,
}

impl Imported {
    /// Of a ServiceImport as read.
    pub(crate) fn read(object: &DynamicObject) -> Self {
        Self {
            object: object.clone(),
        }
    }

    pub(crate) fn spec(&self) -> &serde_json::Value {
        &self.object.data["spec"]
    }

    /// `spec.type`.
    pub(crate) fn type_(&self) -> &str {
        self.spec()["type"].as_str().unwrap_or("")
    }

    /// `spec.ips`.
    pub(crate) fn ips(&self) -> Vec<String> {
        strings(&self.spec()["ips"])
    }

    /// `spec.ports` as (name, protocol, port), in order.
    pub(crate) fn ports(&self) -> Vec<(String, String, i64)> {
        self.spec()["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    p["name"].as_str().unwrap_or("").to_string(),
                    p["protocol"].as_str().unwrap_or("").to_string(),
                    p["port"].as_i64().unwrap_or(0),
                )
            })
            .collect()
    }

    /// Whether any port names a `targetPort` (an import's never do).
    pub(crate) fn has_target_port(&self) -> bool {
        self.spec()["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p.get("targetPort").is_some())
    }

    /// `status.clusters[].cluster`, sorted.
    pub(crate) fn clusters(&self) -> Vec<String> {
        let mut c: Vec<String> = self.object.data["status"]["clusters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["cluster"].as_str().map(str::to_string))
            .collect();
        c.sort();
        c
    }

    /// The annotation naming the derived Service.
    pub(crate) fn derived_name(&self) -> Option<String> {
        self.object
            .metadata
            .annotations
            .as_ref()?
            .get("multicluster.kubernetes.io/derived-service")
            .cloned()
    }
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}
