//! Running the real `service-mirror run` binary as a child process, and link Secrets.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, PostParams};
use local_cluster::{Kubeconfig, LocalCluster};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Prometheus' own `Accept` header.
pub(crate) const OPENMETRICS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// A `service-mirror run` process; killed on drop.
pub(crate) struct Controller {
    pub(crate) child: Child,
    /// The admin server's address, read from the log once it listens.
    admin: std::sync::OnceLock<String>,
    pub(crate) log: PathBuf,
    pub(crate) started: Instant,
    _dir: tempfile::TempDir,
}

impl Controller {
    /// Starts the binary against `local` (admin credentials) with link Secrets in
    /// `namespace`.
    pub(crate) fn spawn(local: &LocalCluster, namespace: &str, extra: &[&str]) -> Self {
        Self::spawn_as(&local.admin_kubeconfig().path, namespace, extra, &[])
    }

    /// Starts the binary with `kubeconfig` as its only credential, link Secrets in
    /// `namespace`, debug logs, `extra` flags and `env` variables. No `SERVICE_MIRROR_*`
    /// nor `KUBECONFIG` comes from the test's environment: only the flags count.
    pub(crate) fn spawn_as(
        kubeconfig: &std::path::Path,
        namespace: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("controller.log");
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_service-mirror"));
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            // `_RJEM_MALLOC_CONF` would override the allocator's options.
            if k.starts_with("SERVICE_MIRROR_") || k == "KUBECONFIG" || k == "_RJEM_MALLOC_CONF" {
                cmd.env_remove(&key);
            }
        }
        let child = cmd
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "--namespace",
                namespace,
                // The process picks a free port and logs it: no race with other tests
                // for a port probed free beforehand.
                "--metrics-addr",
                "127.0.0.1:0",
                "--log-level",
                "debug",
            ])
            .args(extra)
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn service-mirror run");
        Self {
            child,
            admin: std::sync::OnceLock::new(),
            log,
            started: Instant::now(),
            _dir: dir,
        }
    }

    /// The log lines containing `needle`.
    pub(crate) fn log_lines(&self, needle: &str) -> Vec<String> {
        self.log_text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// Waits (at most `within`) for a log line containing every one of `needles`; returns
    /// it and the time since the start of the process.
    pub(crate) async fn wait_log(&self, needles: &[&str], within: Duration) -> (String, Duration) {
        loop {
            if let Some(line) = self
                .log_text()
                .lines()
                .find(|l| needles.iter().all(|n| l.contains(n)))
            {
                return (line.to_string(), self.started.elapsed());
            }
            assert!(
                self.started.elapsed() < within,
                "no log line with {needles:?} within {within:?}; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The admin server's address, once it listens.
    pub(crate) fn admin(&self) -> Option<&str> {
        if self.admin.get().is_none() {
            let bound = self.log_text().lines().find_map(|l| {
                l.contains("admin server listening")
                    .then(|| l.split_once("bound=")?.1.split_whitespace().next())?
                    .map(str::to_string)
            })?;
            let _ = self.admin.set(bound);
        }
        self.admin.get().map(String::as_str)
    }

    /// GET on the admin server: (status, body); None while it does not answer.
    pub(crate) async fn get(&self, path: &str) -> Option<(u16, String)> {
        self.get_accept(path, None)
            .await
            .map(|(status, _, body)| (status, body))
    }

    /// GET with an optional `Accept` header: (status, content type, body).
    pub(crate) async fn get_accept(
        &self,
        path: &str,
        accept: Option<&str>,
    ) -> Option<(u16, String, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.admin()?).await.ok()?;
        let accept = accept
            .map(|a| format!("Accept: {a}\r\n"))
            .unwrap_or_default();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n{accept}\r\n").as_bytes())
            .await
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).await.ok()?;
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let content_type = head
            .lines()
            .find_map(|l| {
                l.split_once(':')
                    .filter(|(k, _)| k.eq_ignore_ascii_case("content-type"))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_default();
        Some((status, content_type, body.to_string()))
    }

    /// The admin server's address, once it listens (waits for it).
    pub(crate) async fn admin_addr(&self) -> String {
        let start = Instant::now();
        loop {
            if let Some(a) = self.admin() {
                return a.to_string();
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no admin address"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `/ready` answers 200; returns how long that took.
    pub(crate) async fn wait_ready(&self) -> Duration {
        let start = Instant::now();
        loop {
            if let Some((200, _)) = self.get("/ready").await {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "controller not ready; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The metrics page in OpenMetrics, asked for as Prometheus asks.
    pub(crate) async fn metrics(&self) -> String {
        self.get_accept("/metrics", Some(OPENMETRICS_ACCEPT))
            .await
            .map(|(_, _, b)| b)
            .unwrap_or_default()
    }

    /// The metrics page as a scraper without `Accept` gets it (Linkerd's CLI).
    pub(crate) async fn metrics_text(&self) -> String {
        self.get_accept("/metrics", None)
            .await
            .map(|(_, _, b)| b)
            .unwrap_or_default()
    }

    /// Everything the process logged.
    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the exit; returns (exit success, time taken).
    pub(crate) fn terminate(&mut self) -> (bool, Duration) {
        let start = Instant::now();
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status.success(), start.elapsed());
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process still runs.
    pub(crate) fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Controller {
    /// Waits until the link's key of remote Service `remote` (in `env`) has been
    /// reconciled after its last write and after the local caches showed that write
    /// (the reconcile's `writing` lines and the watch's `write seen in the cache` in
    /// the debug log): the write's own watch event brings the key back, and a mirror
    /// that did not agree with what was written would be written again there. A key
    /// never written needs one reconcile. The idle witness of a link with no periodic
    /// writer (IP gateways, no probe): after it, nothing more is written unless
    /// something changes.
    pub(crate) async fn settled(&self, env: &super::Env, remote: &str) {
        let key = format!("key={}/{remote} ", env.ns);
        let cluster = format!("cluster={} ", env.cluster);
        // The mirror's Service and Endpoints, and its EndpointSlices (`<name>-ipv4-0`).
        let (ns, seen) = (
            format!("ns={} ", env.ns),
            format!("name={}", env.mirror_name(remote)),
        );
        let subject = super::witness::Subject::link(&env.cluster, &env.ns, remote);
        super::eventually(&format!("{subject:?} settled after its writes"), || async {
            let text = self.log_text();
            let lines: Vec<&str> = text.lines().collect();
            let last = |f: &dyn Fn(&str) -> bool| lines.iter().rposition(|l| f(l));
            let wrote =
                last(&|l| l.contains("writing ") && l.contains(&key) && l.contains(&cluster));
            let cached = last(&|l| {
                l.contains("write seen in the cache") && l.contains(&ns) && l.contains(&seen)
            });
            if wrote.is_some_and(|w| cached.is_none_or(|c| c < w)) {
                return None;
            }
            let after = wrote.max(cached).map_or(0, |i| i + 1);
            lines[after..]
                .iter()
                .any(|l| subject.matches_line(l))
                .then_some(())
        })
        .await
    }
}

/// A spawned controller's reconciles, read from its log.
impl super::witness::Witness for Controller {
    fn reconciles(&self, subject: &super::witness::Subject) -> u64 {
        let text = self.log_text();
        text.lines().filter(|l| subject.matches_line(l)).count() as u64
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A kubeconfig on `remote` for a ServiceAccount that may only get/list/watch Services
/// (the contract's remote credential), created in namespace `ns`.
pub(crate) async fn reader_kubeconfig(remote: &LocalCluster, ns: &str, sa: &str) -> Kubeconfig {
    let services = PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["services".into()]),
        verbs: vec!["get".into(), "list".into(), "watch".into()],
        ..Default::default()
    };
    kubeconfig_with_rules(
        remote,
        ns,
        sa,
        "service-mirror-remote-reader",
        vec![services],
    )
    .await
}

/// A kubeconfig on `remote` for the ServiceAccount `ns/sa`, bound to the ClusterRole
/// `role` with `rules` (created if missing).
pub(crate) async fn kubeconfig_with_rules(
    remote: &LocalCluster,
    ns: &str,
    sa: &str,
    role: &str,
    rules: Vec<PolicyRule>,
) -> Kubeconfig {
    let admin = remote.client().await.unwrap();
    let cluster_role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(role.into()),
            ..Default::default()
        },
        rules: Some(rules),
        ..Default::default()
    };
    let _ = Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &cluster_role)
        .await;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{ns}-{sa}-{role}")),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.into(),
            namespace: Some(ns.into()),
            ..Default::default()
        }]),
    };
    let _ = Api::<ClusterRoleBinding>::all(admin)
        .create(&PostParams::default(), &binding)
        .await;
    remote.service_account_kubeconfig(ns, sa).await.unwrap()
}

/// A link Secret (contract format) named `name` for cluster `cluster`.
pub(crate) fn link_secret(name: &str, cluster: Option<&str>, kubeconfig: Option<&str>) -> Secret {
    let mut annotations = BTreeMap::new();
    if let Some(c) = cluster {
        annotations.insert("mirror.linkerd.io/cluster-name".to_string(), c.to_string());
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(annotations),
            ..Default::default()
        },
        type_: Some("mirror.linkerd.io/remote-kubeconfig".into()),
        data: kubeconfig
            .map(|k| [("kubeconfig".to_string(), ByteString(k.as_bytes().to_vec()))].into()),
        ..Default::default()
    }
}

/// Result of one run of the binary.
pub(crate) struct Run {
    pub(crate) ok: bool,
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs `service-mirror <args>` with no `SERVICE_MIRROR_*` nor `KUBECONFIG` from the
/// environment, so that only the flags count.
pub(crate) fn service_mirror(args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_service-mirror"));
    cmd.args(args);
    for (key, _) in std::env::vars_os() {
        let key_str = key.to_string_lossy();
        if key_str.starts_with("SERVICE_MIRROR_") || key_str == "KUBECONFIG" {
            cmd.env_remove(&key);
        }
    }
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run service-mirror");
    Run {
        ok: status.success(),
        code: status.code(),
        stdout: String::from_utf8(stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(stderr).expect("utf-8 stderr"),
    }
}

/// A fresh controller namespace on `local`, and a controller in it that mirrors only
/// the remote namespaces `mirror_ns` (gateway hostnames resolved every 2 s).
pub(crate) async fn controller_in_new_namespace(
    local: &LocalCluster,
    mirror_ns: &[&str],
) -> (String, Controller) {
    let ns = local_cluster::unique_namespace("sm");
    super::create_namespace(&local.client().await.unwrap(), &ns).await;
    let allow = mirror_ns.join(",");
    let c = Controller::spawn(
        local,
        &ns,
        &[
            "--namespace-allow",
            &allow,
            "--endpoint-refresh-period",
            "2s",
        ],
    );
    (ns, c)
}

/// The link Secrets of one controller namespace; derefs to their `Api` for the rest.
pub(crate) struct LinkSecrets(pub Api<Secret>);

impl std::ops::Deref for LinkSecrets {
    type Target = Api<Secret>;
    fn deref(&self) -> &Api<Secret> {
        &self.0
    }
}

impl LinkSecrets {
    /// The link Secrets in namespace `ns` of the cluster `client` reaches.
    pub(crate) fn new(client: &kube::Client, ns: &str) -> Self {
        Self(Api::namespaced(client.clone(), ns))
    }

    /// Creates the link Secret `name` (see [`link_secret`]).
    pub(crate) async fn link(&self, name: &str, cluster: Option<&str>, kubeconfig: Option<&str>) {
        self.0
            .create(
                &PostParams::default(),
                &link_secret(name, cluster, kubeconfig),
            )
            .await
            .unwrap();
    }

    /// Deletes the link Secret `name`.
    pub(crate) async fn unlink(&self, name: &str) {
        self.0
            .delete(name, &kube::api::DeleteParams::default())
            .await
            .unwrap();
    }

    /// Merge-patches the link Secret `name` with `patch`.
    pub(crate) async fn merge(&self, name: &str, patch: serde_json::Value) {
        self.0
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(patch),
            )
            .await
            .unwrap();
    }
}

/// A kubeconfig on `local` for the controller's own ServiceAccount `ns/sa`, bound to
/// cluster-admin (what it may do is other tests' concern), so that the safety monitor
/// (`service_mirror_testkit::monitor`) tells its writes apart in the audit log by
/// `user.username`: `system:serviceaccount:<ns>:<sa>`.
pub(crate) async fn own_identity(local: &LocalCluster, ns: &str, sa: &str) -> Kubeconfig {
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("own-identity-{ns}-{sa}")),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "cluster-admin".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.into(),
            namespace: Some(ns.into()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(local.client().await.unwrap())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    local.service_account_kubeconfig(ns, sa).await.unwrap()
}
