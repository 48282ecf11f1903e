//! A local cluster's kube-apiserver: its flags, its start and wait for `/readyz`, and
//! the stop and restart on the same port tests use to take a cluster away.

use super::*;

/// How long an apiserver may take to answer `/readyz` 200 (2 cores, cold caches).
pub(super) const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Restarts on the same port that found it taken: 10 attempts, 1 s apart.
pub(super) const RESTART_PORT_ATTEMPTS: usize = 10;

/// Whether a failed apiserver start failed to bind its port.
pub(super) fn lost_its_port(e: &Error) -> bool {
    matches!(e, Error::Start { log_tail, .. } if log_tail.contains("address already in use"))
}

/// Audit policy: metadata of every write, nothing else. Tests count writes with it.
pub(super) const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
- level: Metadata
  verbs: [\"create\", \"update\", \"patch\", \"delete\", \"deletecollection\"]
- level: None
";

impl LocalCluster {
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

    pub(super) fn apiserver_args(&self) -> Vec<String> {
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

    pub(super) async fn spawn_apiserver(&self) -> Result<()> {
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

    pub(super) fn with_apiserver<T: Default>(
        &self,
        f: impl FnOnce(&mut Process) -> Option<T>,
    ) -> Option<T> {
        self.apiserver.lock().as_mut().and_then(f)
    }

    pub(super) fn with_apiserver_err(&self, reason: String) -> Error {
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
