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

/// How long an apiserver may take to answer `/readyz` 200 (2 cores, cold caches).
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(120);
const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(30);
const START_ATTEMPTS: usize = 3;
/// Keys of [`LocalCluster::fill_etcd`]'s filler values.
const FILL_PREFIX: &str = "/local-cluster/fill/";
/// Restarts on the same port that found it taken: 10 attempts, 1 s apart.
const RESTART_PORT_ATTEMPTS: usize = 10;

/// Whether a failed apiserver start failed to bind its port.
fn lost_its_port(e: &Error) -> bool {
    matches!(e, Error::Start { log_tail, .. } if log_tail.contains("address already in use"))
}

/// Audit policy: metadata of every write, nothing else. Tests count writes with it.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
- level: Metadata
  verbs: [\"create\", \"update\", \"patch\", \"delete\", \"deletecollection\"]
- level: None
";

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

    /// Kills the apiserver (etcd keeps the data): the cluster is "away".
    pub fn stop_apiserver(&self) {
        if let Some(mut p) = self.apiserver.lock().take() {
            p.kill();
        }
    }

    /// Starts the apiserver again on the same port and waits until it is ready. The port
    /// was free while the old process held it, but between the kill and the restart any
    /// process of the machine may bind it (an ephemeral client port, another test's
    /// `free_port`): such holders go within seconds, so a restart that loses its port
    /// retries (up to [`RESTART_PORT_ATTEMPTS`], 1 s apart) instead of failing the test.
    /// Clients keep the URL, so moving to another port is not an option.
    pub async fn start_apiserver(&self) -> Result<()> {
        let mut attempt = 1;
        loop {
            match self.spawn_apiserver().await {
                Err(e) if attempt < RESTART_PORT_ATTEMPTS && lost_its_port(&e) => {
                    eprintln!(
                        "local-cluster {}: apiserver port {} taken on restart (attempt {attempt}), retrying in 1 s",
                        self.name,
                        self.apiserver_port()
                    );
                    attempt += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                other => return other,
            }
        }
    }

    /// Writes a throw-away key to etcd and compacts its history up to that revision, so
    /// that a watch that etcd serves and that resumes from an earlier resourceVersion
    /// gets HTTP 410 Gone. The apiserver's watch cache keeps its own history, though: a
    /// watch it serves resumes fine from a resourceVersion still in that window. Start
    /// the cluster with `--watch-cache=false` ([`ClusterOptions::extra_apiserver_args`])
    /// or restart the apiserver after compacting to expire every older resume point.
    pub async fn compact_etcd(&self) -> Result<i64> {
        let put = etcd_post(
            self.etcd_port,
            "/v3/kv/put",
            r#"{"key":"L2xvY2FsLWNsdXN0ZXIvY29tcGFjdA==","value":"eA=="}"#,
        )
        .await?;
        let revision: i64 = put["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| Error::Kubeconfig(format!("etcd put answered {put}")))?;
        etcd_post(
            self.etcd_port,
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        )
        .await?;
        Ok(revision)
    }

    /// Writes 512 KiB values under `/local-cluster/fill/` until etcd refuses a write for
    /// lack of space (its NOSPACE alarm: from then on the apiserver's writes fail with
    /// `etcdserver: mvcc: database space exceeded` and only reads and deletes work);
    /// returns how many values it wrote. Start the cluster with a small
    /// [`ClusterOptions::etcd_quota_bytes`]: at most `quota / 512 KiB + 64` writes are
    /// tried, then an error says the quota was never reached.
    pub async fn fill_etcd(&self) -> Result<u32> {
        use base64::Engine;
        const VALUE: usize = 512 * 1024;
        let limit = self.etcd_quota_bytes.unwrap_or(2 << 30) / VALUE as u64 + 64;
        let value = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; VALUE]);
        for n in 0..limit as u32 {
            let key =
                base64::engine::general_purpose::STANDARD.encode(format!("{FILL_PREFIX}{n:08}"));
            let body = format!(r#"{{"key":"{key}","value":"{value}"}}"#);
            // A put may find its connection closed with no answer on a loaded machine:
            // tried again, 5 times at most.
            let mut tries = 0;
            let answer = loop {
                tries += 1;
                match etcd_post(self.etcd_port, "/v3/kv/put", &body).await {
                    Err(_) if tries < 5 => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    answer => break answer?,
                }
            };
            if answer.to_string().contains("space exceeded") {
                return Ok(n);
            }
        }
        Err(Error::Kubeconfig(format!(
            "etcd took {limit} values of {VALUE} bytes without running out of space"
        )))
    }

    /// Undoes [`LocalCluster::fill_etcd`]: deletes the filler, compacts and defragments
    /// (etcd's file keeps its size until then) and disarms every NOSPACE alarm, so that
    /// writes are accepted again.
    pub async fn free_etcd_space(&self) -> Result<()> {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        // The range end of a prefix: its last byte plus one ('/' + 1 = '0').
        let end = format!("{}0", FILL_PREFIX.trim_end_matches('/'));
        let deleted = etcd_post(
            self.etcd_port,
            "/v3/kv/deleterange",
            &format!(
                r#"{{"key":"{}","range_end":"{}"}}"#,
                b64(FILL_PREFIX),
                b64(&end)
            ),
        )
        .await?;
        let revision = deleted["header"]["revision"]
            .as_str()
            .ok_or_else(|| Error::Kubeconfig(format!("etcd deleterange answered {deleted}")))?
            .to_string();
        etcd_post(
            self.etcd_port,
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        )
        .await?;
        etcd_post(self.etcd_port, "/v3/maintenance/defragment", "{}").await?;
        // The NOSPACE alarm goes through raft after the refused put: a GET right after
        // can miss it, and it lands later (chaos run 16: a compaction's put after this
        // was refused "database space exceeded"). Done once a probe write is accepted.
        let probe = format!(r#"{{"key":"{}","value":"eA=="}}"#, b64(FILL_PREFIX));
        for _ in 0..50 {
            let alarms = etcd_post(
                self.etcd_port,
                "/v3/maintenance/alarm",
                r#"{"action":"GET","alarm":"NONE"}"#,
            )
            .await?;
            for alarm in alarms["alarms"].as_array().into_iter().flatten() {
                let member = alarm["memberID"].as_str().unwrap_or("0");
                etcd_post(
                    self.etcd_port,
                    "/v3/maintenance/alarm",
                    &format!(
                        r#"{{"action":"DEACTIVATE","memberID":"{member}","alarm":"NOSPACE"}}"#
                    ),
                )
                .await?;
            }
            let put = etcd_post(self.etcd_port, "/v3/kv/put", &probe).await?;
            if !put.to_string().contains("space exceeded") {
                etcd_post(
                    self.etcd_port,
                    "/v3/kv/deleterange",
                    &format!(r#"{{"key":"{}"}}"#, b64(FILL_PREFIX)),
                )
                .await?;
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(Error::Kubeconfig(
            "etcd still refuses writes for lack of space after 10 s of disarming".into(),
        ))
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

    fn apiserver_args(&self) -> Vec<String> {
        let d = self.dir.path();
        let p = |f: &str| d.join(f).display().to_string();
        let advertise = self
            .fabric_ip
            .map_or_else(|| "127.0.0.1".to_string(), |ip| ip.to_string());
        let mut args = vec![
            format!("--etcd-servers={}", self.etcd_url()),
            "--bind-address=127.0.0.1".into(),
            format!("--advertise-address={advertise}"),
            format!("--secure-port={}", self.apiserver_port()),
            format!("--cert-dir={}", p("apiserver-certs")),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            "--authorization-mode=RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-cluster-ip-range={}", self.service_cidr),
            "--allow-privileged=true".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--endpoint-reconciler-type=none".into(),
            format!("--audit-policy-file={}", p("audit-policy.yaml")),
            format!("--audit-log-path={}", p("audit.log")),
            // Never rotated: the log writer rotates at 100 MB when this is 0 (its
            // default), keeping every old file anyway, and a reader that follows the
            // file by offset (the safety monitor, the bench) loses the lines it had not
            // read yet. The bench's 50 x 1,000 fleet passed 100 MB during its cold sync,
            // and every count it took afterwards was 0. In megabytes: 1 TiB.
            "--audit-log-maxsize=1048576".into(),
            "--v=1".into(),
        ];
        if self.nodes > 0 {
            // As a kubeadm cluster runs (docs/real-node.md): ServiceAccount admission on
            // (pods get their projected token), kubelets authorized as nodes, the
            // `kubernetes` Endpoints at the advertised address (through kube-proxy, the
            // pods' in-cluster config), the apiserver's calls to kubelets (logs, exec) by
            // InternalIP with a client certificate; and taint-based eviction after 10 s,
            // not 300 s, so that a lost node's pods move within a test.
            args.retain(|a| {
                a != "--disable-admission-plugins=ServiceAccount"
                    && a != "--endpoint-reconciler-type=none"
                    && a != "--authorization-mode=RBAC"
            });
            args.extend([
                "--authorization-mode=Node,RBAC".to_string(),
                "--enable-admission-plugins=NodeRestriction".into(),
                "--endpoint-reconciler-type=lease".into(),
                format!("--kubelet-client-certificate={}", p("admin.crt")),
                format!("--kubelet-client-key={}", p("admin.key")),
                "--kubelet-preferred-address-types=InternalIP".into(),
                "--default-not-ready-toleration-seconds=10".into(),
                "--default-unreachable-toleration-seconds=10".into(),
            ]);
        }
        args.extend(self.extra_apiserver_args.iter().cloned());
        args
    }

    async fn spawn_apiserver(&self) -> Result<()> {
        let admin = Kubeconfig::write(
            Kubeconfig::render(
                &self.name,
                &self.server_url(),
                &self.pki.ca_cert,
                Credential::ClientCert {
                    cert: &self.pki.admin_cert,
                    key: &self.pki.admin_key,
                },
            ),
            self.dir.path().join("admin.kubeconfig"),
        )?;
        *self.admin.lock() = admin.clone();
        let process = Process::spawn(
            "kube-apiserver",
            &self.binaries.kube_apiserver,
            &self.apiserver_args(),
            &self.dir.path().join("kube-apiserver.log"),
        )?;
        *self.apiserver.lock() = Some(process);
        let client = admin.client().await?;
        let deadline = Instant::now() + APISERVER_READY_TIMEOUT;
        loop {
            if let Some(status) = self.with_apiserver(|p| p.exited()) {
                let err = self.with_apiserver_err(format!("exited: {status}"));
                self.stop_apiserver();
                return Err(err);
            }
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("static request");
            if client
                .request_text(req)
                .await
                .is_ok_and(|t| t.trim() == "ok")
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                let err = self.with_apiserver_err(format!(
                    "/readyz not 200 within {}s",
                    APISERVER_READY_TIMEOUT.as_secs()
                ));
                self.stop_apiserver();
                return Err(err);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn with_apiserver<T: Default>(&self, f: impl FnOnce(&mut Process) -> Option<T>) -> Option<T> {
        self.apiserver.lock().as_mut().and_then(f)
    }

    fn with_apiserver_err(&self, reason: String) -> Error {
        let etcd_tail = self
            .etcd
            .lock()
            .as_ref()
            .map(|p| p.log_tail(10))
            .unwrap_or_default();
        match self.apiserver.lock().as_ref() {
            Some(p) => match p.start_error(reason) {
                Error::Start {
                    what,
                    reason,
                    log_tail,
                } => Error::Start {
                    what,
                    reason,
                    log_tail: format!("{log_tail}\n--- etcd log tail ---\n{etcd_tail}"),
                },
                other => other,
            },
            None => Error::Start {
                what: "kube-apiserver".into(),
                reason,
                log_tail: String::new(),
            },
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

/// Starts etcd on free ports, retrying on a lost port race; waits for `/health`.
async fn start_etcd(
    binaries: &Binaries,
    dir: &Path,
    quota_bytes: Option<u64>,
) -> Result<(Process, u16)> {
    let mut last = None;
    for _ in 0..START_ATTEMPTS {
        let (client, peer) = (free_port()?, free_port()?);
        let mut args = vec![
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{client}"),
            format!("--advertise-client-urls=http://127.0.0.1:{client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-cluster=default=http://127.0.0.1:{peer}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        if let Some(bytes) = quota_bytes {
            args.push(format!("--quota-backend-bytes={bytes}"));
        }
        let mut p = Process::spawn("etcd", &binaries.etcd, &args, &dir.join("etcd.log"))?;
        let deadline = Instant::now() + ETCD_READY_TIMEOUT;
        let outcome = loop {
            if let Some(status) = p.exited() {
                break Err(p.start_error(format!("exited: {status}")));
            }
            if etcd_healthy(client).await {
                break Ok(());
            }
            if Instant::now() > deadline {
                break Err(p.start_error("/health not true within 30s"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        match outcome {
            Ok(()) => return Ok((p, client)),
            Err(e) => {
                p.kill();
                last = Some(e);
            }
        }
    }
    Err(last.expect("at least one attempt"))
}

/// POSTs JSON to etcd's HTTP gateway and returns the JSON answer.
async fn etcd_post(port: u16, path: &str, body: &str) -> Result<serde_json::Value> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let req = format!(
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).await?;
    let json = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    serde_json::from_str(json)
        .map_err(|e| Error::Kubeconfig(format!("etcd {path} answered {answer:?}: {e}")))
}

async fn etcd_healthy(port: u16) -> bool {
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut body = String::new();
        s.read_to_string(&mut body).await?;
        Ok::<_, std::io::Error>(body.contains("\"health\":\"true\""))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), probe).await,
        Ok(Ok(true))
    )
}
