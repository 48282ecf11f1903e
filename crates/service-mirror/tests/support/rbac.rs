//! The controller as it is installed: `service-mirror install` applied to the local
//! cluster, and the real binary running with the token of its ServiceAccount (not the
//! admin kubeconfig that `controller::Controller` uses).
#![allow(dead_code)]

use super::controller::service_mirror;
use local_cluster::{Kubeconfig, LocalCluster, apply_yaml, parse_documents};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Name of the controller's ServiceAccount in the install manifests.
pub const SERVICE_ACCOUNT: &str = "service-mirror";

/// The objects printed by `service-mirror install --namespace <namespace>` (and `extra`).
pub fn install_documents(namespace: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["install", "--namespace", namespace, "-o", "json"];
    args.extend_from_slice(extra);
    let run = service_mirror(&args);
    assert!(run.ok, "install failed: {}", run.stderr);
    parse_documents(&run.stdout).expect("install prints Kubernetes objects")
}

/// Applies `docs` (as one JSON `List`) to `cluster` as its admin; returns the applied
/// `Kind/namespace/name` lines.
pub async fn apply_documents(cluster: &LocalCluster, docs: &[serde_json::Value]) -> Vec<String> {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
    let admin = cluster.client().await.unwrap();
    apply_yaml(&admin, &list.to_string())
        .await
        .expect("apply the manifests")
}

/// Applies `docs` (install manifests for `namespace`, possibly edited) and returns a
/// token kubeconfig of the controller's ServiceAccount.
pub async fn install(
    cluster: &LocalCluster,
    namespace: &str,
    docs: &[serde_json::Value],
) -> Kubeconfig {
    apply_documents(cluster, docs).await;
    cluster
        .service_account_kubeconfig(namespace, SERVICE_ACCOUNT)
        .await
        .expect("token of the controller's ServiceAccount")
}

/// A `service-mirror run` process using `kubeconfig`; killed on drop.
pub struct RunningController {
    pub child: Child,
    pub admin: String,
    pub log: PathBuf,
    pub started: Instant,
    _dir: tempfile::TempDir,
}

impl RunningController {
    /// Starts the binary with `kubeconfig` as its only credential, link Secrets in
    /// `namespace`, debug logs, plus `extra` flags.
    pub fn spawn(kubeconfig: &Path, namespace: &str, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("controller.log");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let admin = format!("127.0.0.1:{port}");
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_service-mirror"));
        // Only the flags count: no SERVICE_MIRROR_* nor KUBECONFIG from the environment.
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("SERVICE_MIRROR_") || k == "KUBECONFIG" {
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
                "--metrics-addr",
                &admin,
                "--log-level",
                "debug",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn service-mirror run");
        Self {
            child,
            admin,
            log,
            started: Instant::now(),
            _dir: dir,
        }
    }

    /// Everything the process logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log lines containing `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.log_text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// Waits (at most `within`) for a log line containing every one of `needles`; returns
    /// it and the time since the start of the process.
    pub async fn wait_log(&self, needles: &[&str], within: Duration) -> (String, Duration) {
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

    /// GET on the admin server: (status, body).
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.admin).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).await.ok()?;
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Some((status, body))
    }

    /// Waits until `/ready` answers 200.
    pub async fn wait_ready(&self) {
        let start = Instant::now();
        loop {
            if let Some((200, _)) = self.get("/ready").await {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "controller not ready; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for RunningController {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Removes `verb` on `group`/`resource` from the rules of the `kind` (`ClusterRole` or
/// `Role`) in `docs`, keeping every other verb and resource of the rule that held it.
pub fn remove_verb(
    docs: &mut [serde_json::Value],
    kind: &str,
    group: &str,
    resource: &str,
    verb: &str,
) {
    let role = docs
        .iter_mut()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the manifests"));
    let rules = role["rules"].as_array_mut().expect("rules");
    let mut split = Vec::new();
    let mut found = false;
    for rule in rules.iter_mut() {
        let groups = rule["apiGroups"].as_array().expect("apiGroups");
        assert_eq!(groups.len(), 1, "one API group per rule: {rule}");
        if groups[0] != group {
            continue;
        }
        let verbs: Vec<serde_json::Value> = rule["verbs"]
            .as_array()
            .expect("verbs")
            .iter()
            .filter(|v| *v != verb)
            .cloned()
            .collect();
        let resources = rule["resources"].as_array_mut().expect("resources");
        let before = resources.len();
        resources.retain(|r| r != resource);
        if resources.len() == before {
            continue;
        }
        found = true;
        if !verbs.is_empty() {
            split.push(serde_json::json!({
                "apiGroups": [group],
                "resources": [resource],
                "verbs": verbs,
            }));
        }
    }
    assert!(
        found,
        "{kind} has no rule for {resource} in group {group:?}"
    );
    rules.retain(|r| r["resources"].as_array().is_some_and(|a| !a.is_empty()));
    rules.extend(split);
}
