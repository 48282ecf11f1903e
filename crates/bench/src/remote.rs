//! Remote clusters: a gateway and N exported Services each, the changes the bench makes
//! to them, and the local state those changes should produce.

use crate::observe::{ObjKey, Want};
use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use local_cluster::LocalCluster;
use service_mirror_core::labels::{
    GATEWAY_NAME_ANNOTATION, GATEWAY_NS_ANNOTATION, LINK_CLUSTER_NAME_ANNOTATION,
    LINK_KUBECONFIG_KEY, LINK_SECRET_TYPE,
};
use service_mirror_core::mirror_name;
use std::collections::BTreeMap;
use std::time::Instant;

/// Namespace of the exported Services on every remote, and so of the mirrors locally.
pub(crate) const NAMESPACE: &str = "bench";
/// Namespace of the gateway on every remote.
pub(crate) const GATEWAY_NAMESPACE: &str = "linkerd-multicluster";
/// Name of the gateway on every remote.
pub(crate) const GATEWAY_NAME: &str = "linkerd-gateway";
/// The gateway's `mc-gateway` port.
pub(crate) const GATEWAY_PORT: i32 = 4143;
/// Every exported Service has ports `http` (80, or 8080 after a port change) and `grpc`.
pub(crate) const HTTP_PORT: i32 = 80;
/// The other port.
pub(crate) const GRPC_PORT: i32 = 9090;
/// Remote Services created in parallel during setup (more is slower: see BENCHMARKS.md).
const SETUP_CONCURRENCY: usize = 8;

/// A documentation address (192.0.2.0/24, TEST-NET-1): never routed, never probed.
pub(crate) fn doc_ip(host: usize) -> String {
    format!("192.0.2.{}", host % 254 + 1)
}

/// Name of remote Service number `i`.
pub(crate) fn service_name(i: usize) -> String {
    format!("svc-{i}")
}

/// One remote cluster and what the bench knows of its state.
pub(crate) struct Remote {
    /// Link (cluster) name.
    pub(crate) name: String,
    /// Its control plane.
    pub(crate) cluster: LocalCluster,
    client: Client,
    /// Current gateway ingress IP.
    pub(crate) gateway_ip: String,
    /// Current `http` port of each Service (index = Service number).
    pub(crate) http_ports: Vec<i32>,
    /// Whether each Service is exported.
    pub(crate) exported: Vec<bool>,
}

impl Remote {
    /// Starts a cluster with namespaces and a gateway at `gateway_ip` (no `mc-probe` port,
    /// so nothing is probed).
    pub(crate) async fn start(name: &str, gateway_ip: String) -> anyhow::Result<Self> {
        let cluster = LocalCluster::start(name)
            .await
            .with_context(|| format!("starting remote cluster {name}"))?;
        let client = crate::observe::bench_client(&cluster.admin_kubeconfig().yaml).await?;
        for ns in [NAMESPACE, GATEWAY_NAMESPACE] {
            local_cluster::ensure_namespace(&client, ns).await?;
        }
        let gateways: Api<Service> = Api::namespaced(client.clone(), GATEWAY_NAMESPACE);
        let gw: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": GATEWAY_NAME, "labels": {"app": "linkerd-gateway"}},
            "spec": {"type": "LoadBalancer", "selector": {"app": "linkerd-gateway"},
                     "ports": [{"name": "mc-gateway", "port": GATEWAY_PORT}]}
        }))?;
        gateways.create(&PostParams::default(), &gw).await?;
        let mut remote = Self {
            name: name.to_string(),
            cluster,
            client,
            gateway_ip: String::new(),
            http_ports: Vec::new(),
            exported: Vec::new(),
        };
        remote.set_gateway_ip(&gateway_ip).await?;
        Ok(remote)
    }

    /// Exported Services on the remote.
    pub(crate) fn len(&self) -> usize {
        self.http_ports.len()
    }

    /// Creates Services until there are `n`, `SETUP_CONCURRENCY` at a time.
    pub(crate) async fn ensure_services(&mut self, n: usize) -> anyhow::Result<()> {
        let have = self.http_ports.len();
        if n <= have {
            return Ok(());
        }
        let api: Api<Service> = Api::namespaced(self.client.clone(), NAMESPACE);
        futures::stream::iter(have..n)
            .map(|i| {
                let api = api.clone();
                async move {
                    let svc = exported_service(i)?;
                    api.create(&PostParams::default(), &svc)
                        .await
                        .with_context(|| format!("creating remote Service {}", service_name(i)))?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(SETUP_CONCURRENCY)
            .try_collect::<Vec<_>>()
            .await?;
        self.http_ports.resize(n, HTTP_PORT);
        self.exported.resize(n, true);
        Ok(())
    }

    /// The local mirror name of Service `i`.
    pub(crate) fn mirror(&self, i: usize) -> String {
        mirror_name(&service_name(i), &self.name)
    }

    /// Ports of Service `i`, sorted.
    pub(crate) fn ports(&self, i: usize) -> Vec<i32> {
        let mut p = vec![self.http_ports[i], GRPC_PORT];
        p.sort_unstable();
        p
    }

    /// The Endpoints every mirror of this remote should have.
    pub(crate) fn endpoints_want(&self) -> Want {
        Want::Endpoints {
            ip: self.gateway_ip.clone(),
            port: GATEWAY_PORT,
            ports: 2,
        }
    }

    /// The local state every exported Service should produce: its mirror Service with
    /// the same ports and its Endpoints at the gateway.
    pub(crate) fn mirror_wants(&self) -> Vec<(ObjKey, Want)> {
        let mut wants = Vec::with_capacity(2 * self.len());
        for i in 0..self.len() {
            let name = self.mirror(i);
            if self.exported[i] {
                wants.push((
                    ObjKey::service(NAMESPACE, &name),
                    Want::Service {
                        ports: self.ports(i),
                    },
                ));
                wants.push((ObjKey::endpoints(NAMESPACE, &name), self.endpoints_want()));
            } else {
                wants.push((ObjKey::service(NAMESPACE, &name), Want::Absent));
                wants.push((ObjKey::endpoints(NAMESPACE, &name), Want::Absent));
            }
        }
        wants
    }

    /// Changes the `http` port of Service `i` (80 <-> 8080); returns the time just before
    /// the request and the new port.
    pub(crate) async fn change_port(&mut self, i: usize) -> anyhow::Result<(Instant, i32)> {
        let port = if self.http_ports[i] == HTTP_PORT {
            8080
        } else {
            HTTP_PORT
        };
        let patch = serde_json::json!({"spec": {"ports": [
            {"name": "http", "port": port, "targetPort": HTTP_PORT},
            {"name": "grpc", "port": GRPC_PORT},
        ]}});
        let at = self.patch_service(i, &patch).await?;
        self.http_ports[i] = port;
        Ok((at, port))
    }

    /// Moves the gateway to `ip`; returns the time just before the request and the
    /// gateway's new resourceVersion.
    pub(crate) async fn set_gateway_ip(&mut self, ip: &str) -> anyhow::Result<(Instant, String)> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), GATEWAY_NAMESPACE);
        let status = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}});
        let at = Instant::now();
        let gw = api
            .patch_status(
                GATEWAY_NAME,
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await?;
        self.gateway_ip = ip.to_string();
        Ok((at, gw.metadata.resource_version.unwrap_or_default()))
    }

    /// Removes the export annotations of Service `i`; returns the time just before.
    pub(crate) async fn unexport(&mut self, i: usize) -> anyhow::Result<Instant> {
        let patch = serde_json::json!({"metadata": {"annotations": {
            GATEWAY_NAME_ANNOTATION: null, GATEWAY_NS_ANNOTATION: null}}});
        let at = self.patch_service(i, &patch).await?;
        self.exported[i] = false;
        Ok(at)
    }

    /// Merge-patches Service `i`; returns the time just before the request.
    async fn patch_service(&self, i: usize, patch: &serde_json::Value) -> anyhow::Result<Instant> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), NAMESPACE);
        let at = Instant::now();
        api.patch(
            &service_name(i),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await?;
        Ok(at)
    }

    /// Exports every Service that is not.
    pub(crate) async fn export_all(&mut self) -> anyhow::Result<()> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), NAMESPACE);
        for i in 0..self.len() {
            if self.exported[i] {
                continue;
            }
            let patch = serde_json::json!({"metadata": {"annotations": {
                GATEWAY_NAME_ANNOTATION: GATEWAY_NAME, GATEWAY_NS_ANNOTATION: GATEWAY_NAMESPACE}}});
            api.patch(
                &service_name(i),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
            self.exported[i] = true;
        }
        Ok(())
    }

    /// The link Secret (contract format) of this remote, with its admin kubeconfig.
    pub(crate) fn link_secret(&self) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(format!("link-{}", self.name)),
                annotations: Some(BTreeMap::from([(
                    LINK_CLUSTER_NAME_ANNOTATION.to_string(),
                    self.name.clone(),
                )])),
                ..Default::default()
            },
            type_: Some(LINK_SECRET_TYPE.into()),
            data: Some(BTreeMap::from([(
                LINK_KUBECONFIG_KEY.to_string(),
                ByteString(self.cluster.admin_kubeconfig().yaml.into_bytes()),
            )])),
            ..Default::default()
        }
    }
}

/// Remote Service number `i`: exported, two ports, a selector and labels as a workload's.
/// Headless: its ClusterIP is of no use to the mirror, and allocating one costs the
/// remote apiserver time that grows with the Services it holds (setup time only).
fn exported_service(i: usize) -> anyhow::Result<Service> {
    let name = service_name(i);
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "labels": {"app": name, "app.kubernetes.io/part-of": "bench"},
            "annotations": {
                GATEWAY_NAME_ANNOTATION: GATEWAY_NAME,
                GATEWAY_NS_ANNOTATION: GATEWAY_NAMESPACE,
            },
        },
        "spec": {
            "selector": {"app": name},
            "clusterIP": "None",
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": HTTP_PORT},
                {"name": "grpc", "port": GRPC_PORT},
            ],
        },
    }))?)
}
