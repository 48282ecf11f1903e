//! Remote clusters: a gateway and N exported Services each, the changes the bench makes
//! to them, and the local state those changes should produce.

use crate::observe::{ObjKey, Want};
use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use local_cluster::LocalCluster;
use service_mirror_controller::cli::allow::remote_access_rules;
use service_mirror_controller::links::LinkResource;
use service_mirror_core::labels::{
    GATEWAY_NAME_ANNOTATION, GATEWAY_NS_ANNOTATION, LINK_CLUSTER_NAME_ANNOTATION,
    LINK_KUBECONFIG_KEY, LINK_SECRET_TYPE,
};
use service_mirror_core::mirror_name;
use std::collections::BTreeMap;
use std::sync::Arc;
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

/// Label that exports a remote Service through a Link with Linkerd's default `selector`.
pub(crate) const EXPORTED_LABEL: &str = "mirror.linkerd.io/exported";
/// Its value.
pub(crate) const EXPORTED_VALUE: &str = "true";
/// The gateway identity of the bench's Links (the one Linkerd's `link-gen` writes for a
/// gateway in `linkerd-multicluster`).
pub(crate) const GATEWAY_IDENTITY: &str =
    "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local";
/// Namespace and ServiceAccount of a Link's remote credentials (what `allow` makes).
const CREDENTIALS_NAMESPACE: &str = "linkerd-multicluster";
const CREDENTIALS_ACCOUNT: &str = "linkerd-service-mirror-remote-access-local";

/// Where the controller finds its links, and so how remote Services are exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LinkSource {
    /// Link Secrets with the cluster-name annotation (the 2020 contract): export by the
    /// gateway annotations, the gateway read from the remote gateway Service.
    Secrets,
    /// Linkerd `Link` resources: export by the label `mirror.linkerd.io/exported=true`
    /// (Linkerd's default selector), the gateway from the Link, readiness from the
    /// remote EndpointSlices.
    Links,
}

impl LinkSource {
    /// As on the command line.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LinkSource::Secrets => "secrets",
            LinkSource::Links => "links",
        }
    }
}

/// A documentation address (192.0.2.0/24, TEST-NET-1): never routed, never probed.
pub(crate) fn doc_ip(host: usize) -> String {
    format!("192.0.2.{}", host % 254 + 1)
}

/// Name of remote Service number `i`.
pub(crate) fn service_name(i: usize) -> String {
    format!("svc-{i}")
}

/// A remote apiserver: one per remote cluster, or in fleet mode (`--fleet-apiservers`)
/// shared by several links, each under a cluster name of its own.
struct Server {
    /// Its control plane (running as long as a link to it lives).
    _cluster: LocalCluster,
    client: Client,
    /// The kubeconfig its links use: the admin's for a link Secret; for a Link, a
    /// ServiceAccount's with exactly what `allow` grants (`remote_access_rules`).
    credentials: String,
}

/// One remote cluster (one link, one cluster name) and what the bench knows of its
/// state. In fleet mode several share one apiserver, and so its Services: a change made
/// through one is made to all of them ([`propagate`] keeps their models equal).
pub(crate) struct Remote {
    /// Link (cluster) name.
    pub(crate) name: String,
    /// Its apiserver, shared with the other links of [`Remote::server_index`].
    server: Arc<Server>,
    /// Which remote apiserver serves it (remotes with the same index share Services).
    pub(crate) server_index: usize,
    /// Whether this link created the apiserver's Services (the first link of it).
    owner: bool,
    /// Current gateway ingress IP.
    pub(crate) gateway_ip: String,
    /// Current `http` port of each Service (index = Service number).
    pub(crate) http_ports: Vec<i32>,
    /// Whether each Service is exported.
    pub(crate) exported: Vec<bool>,
    /// How this remote is linked.
    pub(crate) source: LinkSource,
}

impl Remote {
    /// Starts a cluster with namespaces and a gateway at `gateway_ip` (no `mc-probe` port,
    /// so nothing is probed).
    pub(crate) async fn start(
        name: &str,
        gateway_ip: String,
        source: LinkSource,
    ) -> anyhow::Result<Self> {
        Self::start_server(name, 0, gateway_ip, source).await
    }

    /// [`Remote::start`], the apiserver numbered `server_index`.
    pub(crate) async fn start_server(
        name: &str,
        server_index: usize,
        gateway_ip: String,
        source: LinkSource,
    ) -> anyhow::Result<Self> {
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
        let credentials = match source {
            LinkSource::Secrets => cluster.admin_kubeconfig().yaml,
            LinkSource::Links => allowed_kubeconfig(&cluster, &client).await?,
        };
        let mut remote = Self {
            name: name.to_string(),
            server: Arc::new(Server {
                _cluster: cluster,
                client,
                credentials,
            }),
            server_index,
            owner: true,
            gateway_ip: String::new(),
            http_ports: Vec::new(),
            exported: Vec::new(),
            source,
        };
        remote.set_gateway_ip(&gateway_ip).await?;
        Ok(remote)
    }

    /// Another link to this remote's apiserver under the cluster name `name` (fleet
    /// mode): its own link Secret or Link and credentials Secret locally, so its own
    /// full watch, of the same Services and gateway.
    pub(crate) fn share(&self, name: &str) -> Self {
        Self {
            name: name.to_string(),
            server: self.server.clone(),
            server_index: self.server_index,
            owner: false,
            gateway_ip: self.gateway_ip.clone(),
            http_ports: self.http_ports.clone(),
            exported: self.exported.clone(),
            source: self.source,
        }
    }

    /// An admin client of the remote.
    pub(crate) fn client(&self) -> &Client {
        &self.server.client
    }

    /// Exported Services on the remote.
    pub(crate) fn len(&self) -> usize {
        self.http_ports.len()
    }

    /// Creates Services until there are `n`, `SETUP_CONCURRENCY` at a time. For a Link,
    /// each with one ready EndpointSlice (what kube-controller-manager, absent here,
    /// would make), so that its mirror gets endpoints.
    pub(crate) async fn ensure_services(&mut self, n: usize) -> anyhow::Result<()> {
        let have = self.http_ports.len();
        if n <= have {
            return Ok(());
        }
        if !self.owner {
            // The apiserver's first link creates them.
            self.http_ports.resize(n, HTTP_PORT);
            self.exported.resize(n, true);
            return Ok(());
        }
        let api: Api<Service> = Api::namespaced(self.client().clone(), NAMESPACE);
        let slices: Api<EndpointSlice> = Api::namespaced(self.client().clone(), NAMESPACE);
        let source = self.source;
        futures::stream::iter(have..n)
            .map(|i| {
                let (api, slices) = (api.clone(), slices.clone());
                async move {
                    let svc = exported_service(i, source)?;
                    api.create(&PostParams::default(), &svc)
                        .await
                        .with_context(|| format!("creating remote Service {}", service_name(i)))?;
                    if source == LinkSource::Links {
                        slices
                            .create(&PostParams::default(), &ready_slice(i)?)
                            .await
                            .with_context(|| {
                                format!("creating the EndpointSlice of {}", service_name(i))
                            })?;
                    }
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
        let api: Api<Service> = Api::namespaced(self.client().clone(), GATEWAY_NAMESPACE);
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

    /// Moves the gateway of a Link to `ip` (`links`, the Link on `local`: its
    /// `gatewayAddress`) or of a link Secret (the remote gateway Service's ingress);
    /// returns the time just before the request and, for a link Secret, the gateway's
    /// new resourceVersion (a Link's mirrors record none).
    pub(crate) async fn move_gateway(
        &mut self,
        ip: &str,
        links: &Api<LinkResource>,
    ) -> anyhow::Result<(Instant, Option<String>)> {
        match self.source {
            LinkSource::Secrets => {
                let (at, version) = self.set_gateway_ip(ip).await?;
                Ok((at, Some(version)))
            }
            LinkSource::Links => {
                let patch = serde_json::json!({"spec": {"gatewayAddress": ip}});
                let at = Instant::now();
                links
                    .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .context("moving the Link's gateway")?;
                self.gateway_ip = ip.to_string();
                Ok((at, None))
            }
        }
    }

    /// Unexports Service `i` (removes its export annotations, or for a Link its export
    /// label); returns the time just before.
    pub(crate) async fn unexport(&mut self, i: usize) -> anyhow::Result<Instant> {
        let patch = match self.source {
            LinkSource::Secrets => serde_json::json!({"metadata": {"annotations": {
                GATEWAY_NAME_ANNOTATION: null, GATEWAY_NS_ANNOTATION: null}}}),
            LinkSource::Links => {
                serde_json::json!({"metadata": {"labels": {EXPORTED_LABEL: null}}})
            }
        };
        let at = self.patch_service(i, &patch).await?;
        self.exported[i] = false;
        Ok(at)
    }

    /// Merge-patches Service `i`; returns the time just before the request.
    async fn patch_service(&self, i: usize, patch: &serde_json::Value) -> anyhow::Result<Instant> {
        let api: Api<Service> = Api::namespaced(self.client().clone(), NAMESPACE);
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
        let api: Api<Service> = Api::namespaced(self.client().clone(), NAMESPACE);
        for i in 0..self.len() {
            if self.exported[i] {
                continue;
            }
            let patch = serde_json::json!({"metadata": export_metadata(self.source)});
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

    /// What links this remote on the local cluster: the link Secret (contract format,
    /// admin kubeconfig); or, for a Link, the credentials Secret as Linkerd's `link-gen`
    /// writes it (no annotations) and the `Link`.
    pub(crate) fn link_objects(&self) -> (Secret, Option<LinkResource>) {
        match self.source {
            LinkSource::Secrets => (self.link_secret(), None),
            LinkSource::Links => {
                let secret_name = format!("cluster-credentials-{}", self.name);
                let mut secret = self.link_secret();
                secret.metadata.name = Some(secret_name.clone());
                secret.metadata.annotations = None;
                (secret, Some(self.link(&secret_name)))
            }
        }
    }

    /// The `Link` of this remote (named after it, as Linkerd does): its gateway the one
    /// the gateway Service gives a link Secret (address and `mc-gateway` port), Linkerd's
    /// default selectors, no probe port (nothing probed, as for the gateway Service).
    fn link(&self, credentials: &str) -> LinkResource {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "multicluster.linkerd.io/v1alpha3",
            "kind": "Link",
            "metadata": {"name": self.name},
            "spec": {
                "targetClusterName": self.name,
                "targetClusterDomain": "cluster.local",
                "targetClusterLinkerdNamespace": "linkerd",
                "clusterCredentialsSecret": credentials,
                "gatewayAddress": self.gateway_ip,
                "gatewayPort": GATEWAY_PORT.to_string(),
                "gatewayIdentity": GATEWAY_IDENTITY,
                "selector": {"matchLabels": {EXPORTED_LABEL: EXPORTED_VALUE}},
                "remoteDiscoverySelector": {"matchLabels": {EXPORTED_LABEL: "remote-discovery"}},
                "federatedServiceSelector": {"matchLabels": {"mirror.linkerd.io/federated": "member"}},
            },
        }))
        .expect("a Link")
    }

    /// The link Secret (contract format) of this remote, with its credentials.
    fn link_secret(&self) -> Secret {
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
                ByteString(self.server.credentials.clone().into_bytes()),
            )])),
            ..Default::default()
        }
    }
}

/// Copies what the bench knows of the Services of `remotes[from]`'s apiserver (ports,
/// exported or not) and, for link Secrets, of its gateway Service (address) to every
/// other remote served by the same apiserver: a change made through one link is seen by
/// all of them (fleet mode). A Link's gateway is the Link's own, not shared.
pub(crate) fn propagate(remotes: &mut [Remote], from: usize) {
    let (index, ports, exported, gateway) = {
        let r = &remotes[from];
        (
            r.server_index,
            r.http_ports.clone(),
            r.exported.clone(),
            (r.source == LinkSource::Secrets).then(|| r.gateway_ip.clone()),
        )
    };
    for (j, r) in remotes.iter_mut().enumerate() {
        if j == from || r.server_index != index {
            continue;
        }
        r.http_ports.clone_from(&ports);
        r.exported.clone_from(&exported);
        if let Some(ip) = &gateway {
            r.gateway_ip.clone_from(ip);
        }
    }
}

/// A kubeconfig on `cluster` for a ServiceAccount bound to a ClusterRole of exactly
/// `remote_access_rules` (what `service-mirror allow` grants: Services read, EndpointSlices
/// list/watch).
async fn allowed_kubeconfig(cluster: &LocalCluster, admin: &Client) -> anyhow::Result<String> {
    let role = "service-mirror-remote-access";
    let cluster_role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(role.into()),
            ..Default::default()
        },
        rules: Some(remote_access_rules()),
        ..Default::default()
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &cluster_role)
        .await
        .context("creating the remote access ClusterRole")?;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(role.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: CREDENTIALS_ACCOUNT.into(),
            namespace: Some(CREDENTIALS_NAMESPACE.into()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .context("creating the remote access ClusterRoleBinding")?;
    Ok(cluster
        .service_account_kubeconfig(CREDENTIALS_NAMESPACE, CREDENTIALS_ACCOUNT)
        .await
        .context("remote ServiceAccount kubeconfig")?
        .yaml)
}

/// The labels of remote Service number `i` (as exported by `source`).
pub(crate) fn service_labels(i: usize, source: LinkSource) -> BTreeMap<String, String> {
    let name = service_name(i);
    let mut labels = BTreeMap::from([
        ("app".to_string(), name),
        ("app.kubernetes.io/part-of".to_string(), "bench".to_string()),
    ]);
    if source == LinkSource::Links {
        labels.insert(EXPORTED_LABEL.into(), EXPORTED_VALUE.into());
    }
    labels
}

/// The metadata that exports a Service: the gateway annotations, or the export label.
fn export_metadata(source: LinkSource) -> serde_json::Value {
    match source {
        LinkSource::Secrets => serde_json::json!({"annotations": {
            GATEWAY_NAME_ANNOTATION: GATEWAY_NAME, GATEWAY_NS_ANNOTATION: GATEWAY_NAMESPACE}}),
        LinkSource::Links => serde_json::json!({"labels": {EXPORTED_LABEL: EXPORTED_VALUE}}),
    }
}

/// The EndpointSlice of remote Service `i`: one ready endpoint (a documentation
/// address, never routed), the Service's ports.
fn ready_slice(i: usize) -> anyhow::Result<EndpointSlice> {
    let name = service_name(i);
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("{name}-bench"),
            "labels": {
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": "bench",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [format!("198.51.100.{}", i % 254 + 1)],
                       "conditions": {"ready": true}}],
        "ports": [
            {"name": "http", "port": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "port": GRPC_PORT, "protocol": "TCP"},
        ],
    }))?)
}

/// Remote Service number `i`: exported (gateway annotations, or for a Link the export
/// label), two ports, a selector and labels as a workload's. Headless: its ClusterIP is
/// of no use to the mirror, and allocating one costs the remote apiserver time that
/// grows with the Services it holds (setup time only).
fn exported_service(i: usize, source: LinkSource) -> anyhow::Result<Service> {
    let name = service_name(i);
    let mut metadata = export_metadata(source);
    metadata["name"] = name.clone().into();
    metadata["labels"] = serde_json::to_value(service_labels(i, source))?;
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": metadata,
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
