//! One local cluster: an etcd and a kube-apiserver with their own PKI and data.

use crate::binaries::{Binaries, ensure_binaries};
use crate::certs::Pki;
use crate::data_plane::{ClusterView, DataPlane};
use crate::kubeconfig::{Credential, Kubeconfig, client_from_yaml};
use crate::ports::free_port;
use crate::process::Process;
use crate::{Error, Result, workdir};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod apiserver;
mod etcd;

use apiserver::*;
use etcd::*;

const START_ATTEMPTS: usize = 3;

/// Options of a local cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Service CIDR; by default a distinct `10.<n>.0.0/16` per cluster of this process.
    pub service_cidr: Option<String>,
    /// More kube-apiserver flags, after the harness's own (a repeated flag takes the
    /// last value). `--watch-cache=false`, say, serves every watch from etcd, so that
    /// [`LocalCluster::compact_etcd`] expires any older resume point at once.
    pub extra_apiserver_args: Vec<String>,
    /// Also start a data plane ([`crate::DataPlane`]): a node namespace with kube-proxy
    /// (nftables) and CoreDNS, and kube-controller-manager's EndpointSlice controllers.
    /// Needs root; the service CIDR then defaults to a `198.18.<n>.0/24` of its own.
    pub data_plane: bool,
    /// etcd's `--quota-backend-bytes`: with a small quota, [`LocalCluster::fill_etcd`]
    /// reaches etcd's NOSPACE alarm within a few seconds. `None`: etcd's default (2 GiB).
    pub etcd_quota_bytes: Option<u64>,
    /// Real nodes (kubelet + containerd, each in its own namespaces: see [`crate::Node`]
    /// and docs/real-node.md), with kube-controller-manager's default controllers and
    /// kube-scheduler. `0`: none. Implies [`ClusterOptions::data_plane`], whose node
    /// becomes the first real node. Needs root and `build-control-plane.sh --node`.
    pub nodes: usize,
}

/// A running local cluster. Dropping it kills both processes and removes its directory.
#[derive(Debug)]
pub struct LocalCluster {
    name: String,
    binaries: Binaries,
    service_cidr: String,
    extra_apiserver_args: Vec<String>,
    etcd_quota_bytes: Option<u64>,
    /// Real nodes asked for ([`ClusterOptions::nodes`]).
    nodes: usize,
    /// The address pods reach this apiserver at (the data plane's host address on its
    /// fabric), when the cluster has real nodes: advertised as the `kubernetes` Service's
    /// endpoint.
    fabric_ip: Option<std::net::Ipv4Addr>,
    etcd_port: u16,
    apiserver_port: Mutex<u16>,
    admin: Mutex<Kubeconfig>,
    pki: Pki,
    // Before the control plane: stopped first.
    data_plane: Option<DataPlane>,
    etcd: Mutex<Option<Process>>,
    apiserver: Mutex<Option<Process>>,
    // Last, so the processes die before their directory goes.
    dir: tempfile::TempDir,
}

fn next_service_cidr() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("10.{}.0.0/16", 100 + (n % 150))
}

impl LocalCluster {
    /// Starts a cluster with default options.
    pub async fn start(name: &str) -> Result<Self> {
        Self::start_with(name, ClusterOptions::default()).await
    }

    /// Starts a cluster: builds the binaries if needed, generates certificates, starts
    /// etcd and kube-apiserver and waits until `/readyz` answers 200.
    pub async fn start_with(name: &str, opts: ClusterOptions) -> Result<Self> {
        let binaries = tokio::task::spawn_blocking(ensure_binaries)
            .await
            .map_err(|e| Error::Binaries(e.to_string()))??;
        let dir = workdir::create(name)?;
        let data_plane = opts.data_plane || opts.nodes > 0;
        let service_cidr = opts.service_cidr.unwrap_or_else(|| {
            if data_plane {
                crate::data_plane::next_service_cidr()
            } else {
                next_service_cidr()
            }
        });
        // A node cluster's pods reach the apiserver at the `kubernetes` ClusterIP, which
        // kube-proxy DNATs to the fabric address: both are in the serving certificate.
        let fabric = if opts.nodes > 0 {
            Some(crate::data_plane::Fabric::get(dir.path())?)
        } else {
            None
        };
        let fabric_ip = fabric.as_ref().map(|f| f.host_ip());
        let extra_ips = match fabric_ip {
            Some(ip) => vec![crate::data_plane::first_service_ip(&service_cidr)?, ip],
            None => Vec::new(),
        };
        let pki = Pki::generate(name, &extra_ips)?;
        for (file, pem) in [
            ("ca.crt", &pki.ca_cert),
            ("admin.crt", &pki.admin_cert),
            ("admin.key", &pki.admin_key),
            ("apiserver.crt", &pki.serving_cert),
            ("apiserver.key", &pki.serving_key),
            ("sa.key", &pki.sa_key),
            ("sa.pub", &pki.sa_pub),
        ] {
            std::fs::write(dir.path().join(file), pem)?;
        }
        std::fs::write(dir.path().join("audit-policy.yaml"), AUDIT_POLICY)?;
        std::fs::create_dir_all(dir.path().join("etcd"))?;

        let (etcd, etcd_port) = start_etcd(&binaries, dir.path(), opts.etcd_quota_bytes).await?;
        let mut cluster = Self {
            name: name.to_string(),
            binaries,
            service_cidr,
            extra_apiserver_args: opts.extra_apiserver_args,
            etcd_quota_bytes: opts.etcd_quota_bytes,
            nodes: opts.nodes,
            fabric_ip,
            etcd_port,
            apiserver_port: Mutex::new(0),
            admin: Mutex::new(Kubeconfig {
                yaml: String::new(),
                path: PathBuf::new(),
            }),
            pki,
            data_plane: None,
            etcd: Mutex::new(Some(etcd)),
            apiserver: Mutex::new(None),
            dir,
        };
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            *cluster.apiserver_port.get_mut() = port;
            match cluster.spawn_apiserver().await {
                Ok(()) => {
                    if data_plane {
                        let admin = cluster.admin_kubeconfig();
                        let plane = DataPlane::start(ClusterView {
                            name: &cluster.name,
                            dir: cluster.dir.path(),
                            apiserver: cluster.apiserver_addr(),
                            admin_yaml: &admin.yaml,
                            admin_path: &admin.path,
                            service_cidr: &cluster.service_cidr,
                            nodes: cluster.nodes,
                            fabric: fabric.clone(),
                            pki: &cluster.pki,
                        })
                        .await?;
                        cluster.data_plane = Some(plane);
                    }
                    return Ok(cluster);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// The data plane, if the cluster was started with [`ClusterOptions::data_plane`].
    pub fn data_plane(&self) -> Option<&DataPlane> {
        self.data_plane.as_ref()
    }

    /// The apiserver's URL as pods of any real-node cluster of this process reach it
    /// (the data plane's fabric forwarder; in the serving certificate): what a link's
    /// kubeconfig names for a controller running as a Pod. `None` without real nodes.
    pub fn fabric_server_url(&self) -> Option<String> {
        self.fabric_ip
            .map(|ip| format!("https://{ip}:{}", self.apiserver_port()))
    }

    /// The cluster's name (also its kubeconfig context name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `https://127.0.0.1:<port>` of the apiserver.
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.apiserver_port())
    }

    fn apiserver_port(&self) -> u16 {
        *self.apiserver_port.lock()
    }

    /// The etcd client URL.
    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.etcd_port)
    }

    /// The service CIDR ClusterIPs are allocated from.
    pub fn service_cidr(&self) -> &str {
        &self.service_cidr
    }

    /// The cluster CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_cert
    }

    /// The cluster's certificates and keys (the fault proxy serves and connects with them).
    pub(crate) fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The admin (`system:masters`) kubeconfig.
    pub fn admin_kubeconfig(&self) -> Kubeconfig {
        self.admin.lock().clone()
    }

    /// The admin kubeconfig with its server set to `https://<proxy>`, typically a
    /// [`crate::TcpProxy`] started on [`LocalCluster::apiserver_addr`]; written to the
    /// cluster's directory. TLS passes through the proxy and verifies as usual.
    pub fn admin_kubeconfig_via(&self, proxy: std::net::SocketAddr) -> Result<Kubeconfig> {
        self.admin_kubeconfig().via(proxy)
    }

    /// `127.0.0.1:<port>` of the apiserver (what a [`crate::TcpProxy`] forwards to).
    pub fn apiserver_addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, self.apiserver_port()))
    }

    /// A new admin client. Create one per tokio runtime (per test).
    pub async fn client(&self) -> Result<kube::Client> {
        client_from_yaml(&self.admin_kubeconfig().yaml).await
    }

    /// The apiserver's audit log: one JSON line per write request (metadata only).
    pub fn audit_log(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    /// The cluster's working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Process id of etcd, if it runs.
    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd.lock().as_ref().map(Process::pid)
    }

    /// Process id of kube-apiserver, if it runs.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.lock().as_ref().map(Process::pid)
    }

    /// Process ids of etcd and kube-apiserver (those running).
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        for p in [&self.etcd, &self.apiserver] {
            if let Some(p) = p.lock().as_ref() {
                pids.push(p.pid());
            }
        }
        pids
    }

    /// A kubeconfig that authenticates as ServiceAccount `namespace/name` with a token
    /// from the TokenRequest API (valid 24 h). Creates the namespace and account if absent.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Kubeconfig> {
        let client = self.client().await?;
        let pp = PostParams::default();
        ensure_namespace(&client, namespace).await?;
        let sas: Api<ServiceAccount> = Api::namespaced(client, namespace);
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        ignore_exists(sas.create(&pp, &sa).await)?;
        let req = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(24 * 3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let token = sas
            .create_token_request(name, &pp, &req)
            .await?
            .status
            .map(|s| s.token)
            .ok_or_else(|| Error::Kubeconfig("TokenRequest returned no status".into()))?;
        let context = format!("{}-{namespace}-{name}", self.name);
        let yaml = Kubeconfig::render(
            &context,
            &self.server_url(),
            &self.pki.ca_cert,
            Credential::Token(&token),
        );
        Kubeconfig::write(yaml, self.dir.path().join(format!("{context}.kubeconfig")))
    }

    /// Does what the token controller (absent here: no controller manager) does for a
    /// `kubernetes.io/service-account-token` Secret `namespace/secret`: gets a token
    /// (24 h, TokenRequest API) for the ServiceAccount named by its
    /// `kubernetes.io/service-account.name` annotation and writes `token`, `ca.crt` (the
    /// cluster CA) and `namespace` into its data.
    pub async fn fill_token_secret(&self, namespace: &str, secret: &str) -> Result<()> {
        use k8s_openapi::ByteString;
        use k8s_openapi::api::core::v1::Secret;
        use kube::api::{Patch, PatchParams};
        const SA_ANNOTATION: &str = "kubernetes.io/service-account.name";
        let client = self.client().await?;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let current = secrets.get(secret).await?;
        let account = current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SA_ANNOTATION))
            .filter(|a| !a.is_empty())
            .ok_or_else(|| {
                Error::TokenSecret(format!(
                    "Secret {namespace}/{secret} has no {SA_ANNOTATION} annotation"
                ))
            })?
            .clone();
        let req = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(24 * 3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let token = Api::<ServiceAccount>::namespaced(client, namespace)
            .create_token_request(&account, &PostParams::default(), &req)
            .await?
            .status
            .map(|s| s.token)
            .ok_or_else(|| Error::TokenSecret("TokenRequest returned no status".into()))?;
        let data = [
            ("token", token.into_bytes()),
            ("ca.crt", self.ca_pem().as_bytes().to_vec()),
            ("namespace", namespace.as_bytes().to_vec()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v)))
        .collect::<std::collections::BTreeMap<_, _>>();
        let patch = serde_json::json!({ "data": data });
        secrets
            .patch(secret, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Kills all processes now (also done on drop).
    pub fn stop(&self) {
        if let Some(plane) = &self.data_plane {
            plane.shut_down_nodes();
        }
        self.stop_apiserver();
        if let Some(mut p) = self.etcd.lock().take() {
            p.kill();
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        drop(self.data_plane.take());
        self.stop();
    }
}

/// Creates namespace `name`; one that exists already is fine.
pub async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    ignore_exists(
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await,
    )
}

fn ignore_exists<T>(r: kube::Result<T>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
