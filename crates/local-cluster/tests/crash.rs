//! A process that started clusters and dies with SIGKILL leaves no etcd or kube-apiserver
//! behind, and its working directory is swept by the next start.

use local_cluster::LocalCluster;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Kills the child on drop, so a failing test leaves nothing running.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// State letter and start time (clock ticks after boot) of `pid`, from /proc/<pid>/stat;
/// `None` once the process is reaped.
fn stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`: comm may hold spaces and parentheses, so split at the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    // Field 22 of stat is starttime; `fields` starts at field 3.
    let start = fields.get(22 - 3)?.parse().ok()?;
    Some((state, start))
}

/// Whether the process that had start time `start` under `pid` is gone: reaped, a zombie
/// (dead, waiting for init to reap it) or the pid reused by another process.
fn gone(pid: u32, start: u64) -> bool {
    match stat(pid) {
        None => true,
        Some((state, s)) => s != start || matches!(state, 'Z' | 'X' | 'x'),
    }
}

/// The cluster's lines printed by the `local-cluster` binary.
#[derive(Debug, Default)]
struct Printed {
    dir: Option<PathBuf>,
    etcd: Option<u32>,
    apiserver: Option<u32>,
}

fn parse_pids(line: &str, printed: &mut Printed) {
    for word in line.trim().trim_start_matches("pids:").split_whitespace() {
        match word.split_once('=') {
            Some(("etcd", p)) => printed.etcd = p.parse().ok(),
            Some(("kube-apiserver", p)) => printed.apiserver = p.parse().ok(),
            _ => {}
        }
    }
}

/// Starts the `local-cluster` binary with `args`; its stdout lines arrive on the
/// receiver, read on a thread (the test waits for the pids lines with a deadline).
fn spawn_local_cluster(args: &[&str]) -> (Guard, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_local-cluster"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the local-cluster binary");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (Guard(child), rx)
}

#[tokio::test]
async fn sigkilled_owner_leaves_no_control_plane_and_its_directory_is_swept() {
    let (mut guard, rx) = spawn_local_cluster(&["k9"]);
    let mut printed = Printed::default();
    let mut output = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while printed.apiserver.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).unwrap_or_else(|e| {
            panic!("no pids line ({e}); output so far:\n{}", output.join("\n"))
        });
        if let Some(dir) = line.trim().strip_prefix("dir: ") {
            printed.dir = Some(PathBuf::from(dir));
        }
        if line.trim().starts_with("pids:") {
            parse_pids(&line, &mut printed);
        }
        output.push(line);
    }
    assert!(
        output[0].starts_with("k9: ready in "),
        "the first line is unchanged: {output:?}"
    );
    let dir = printed.dir.expect("a dir line before the pids line");
    let pids = [
        printed.etcd.expect("etcd pid"),
        printed.apiserver.expect("kube-apiserver pid"),
    ];
    let starts: Vec<u64> = pids
        .iter()
        .map(|&p| {
            let (state, start) = stat(p).unwrap_or_else(|| panic!("pid {p} runs"));
            assert!(!matches!(state, 'Z' | 'X'), "pid {p} is alive: {state}");
            start
        })
        .collect();
    assert!(
        dir.is_dir(),
        "{} exists while the owner runs",
        dir.display()
    );

    // SIGKILL: no handler, no destructor, no atexit runs in the owner.
    let owner = guard.0.id();
    // SAFETY: signalling our own child.
    assert_eq!(
        unsafe { libc::kill(owner as libc::pid_t, libc::SIGKILL) },
        0
    );
    let killed = Instant::now();
    let status = guard.0.wait().unwrap();
    assert!(!status.success());
    for (&pid, &start) in pids.iter().zip(&starts) {
        while !gone(pid, start) && killed.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            gone(pid, start),
            "pid {pid} still runs {:?} after its owner was killed: {:?}",
            killed.elapsed(),
            stat(pid)
        );
    }
    eprintln!(
        "etcd and kube-apiserver gone {:?} after SIGKILL",
        killed.elapsed()
    );
    assert!(
        dir.is_dir(),
        "nobody cleaned up after SIGKILL: {} is left",
        dir.display()
    );
    assert!(
        !Path::new(&format!("/proc/{owner}")).exists(),
        "owner reaped"
    );

    // The next start (of any process) removes the directories of dead owners.
    let next = LocalCluster::start("sweeper").await.unwrap();
    assert!(!dir.exists(), "{} swept by the next start", dir.display());
    drop(next);
}

/// The inode of a network namespace (`/proc/<pid>/ns/net` links read `net:[<inode>]`).
fn netns_inode(link: &Path) -> Option<String> {
    std::fs::read_link(link)
        .ok()
        .map(|l| l.display().to_string())
}

/// Whether any process still lives in the network namespace `inode`.
fn netns_in_use(inode: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            netns_inode(Path::new(&format!("/proc/{pid}/ns/net"))).as_deref() == Some(inode)
        })
        .collect()
}

#[tokio::test]
async fn sigkilled_owner_leaves_no_data_plane_process_namespace_or_link() {
    if local_cluster::skip_without_data_plane("sigkilled_owner_leaves_no_data_plane") {
        return;
    }
    let (mut guard, rx) = spawn_local_cluster(&["--data-plane", "k9dp"]);
    let mut printed = Printed::default();
    let mut plane_pids: Vec<u32> = Vec::new();
    let mut netns: Option<PathBuf> = None;
    let mut output = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while plane_pids.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).unwrap_or_else(|e| {
            panic!(
                "no data-plane pids line ({e}); output so far:\n{}",
                output.join("\n")
            )
        });
        let t = line.trim();
        if t.starts_with("pids:") {
            parse_pids(t, &mut printed);
        }
        if let Some(rest) = t.strip_prefix("node: ") {
            netns = rest.split(" netns ").nth(1).map(PathBuf::from);
        }
        if let Some(rest) = t.strip_prefix("data-plane pids: ") {
            plane_pids = rest
                .split_whitespace()
                .map(|p| p.parse().unwrap())
                .collect();
        }
        output.push(line);
    }
    let netns = netns.expect("a node line before the data-plane pids line");
    let inode = netns_inode(&netns).expect("the node namespace exists");
    let mut pids = plane_pids.clone();
    pids.extend([printed.etcd.unwrap(), printed.apiserver.unwrap()]);
    // kube-controller-manager, kube-proxy, coredns, node and bridge holders, etcd, apiserver.
    assert_eq!(pids.len(), 7, "{output:?}");
    let starts: Vec<u64> = pids
        .iter()
        .map(|&p| stat(p).unwrap_or_else(|| panic!("pid {p} runs")).1)
        .collect();
    let owner = guard.0.id();
    let host_link = format!("smh{owner}");
    let link_exists = || {
        Command::new("ip")
            .args(["link", "show", &host_link])
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    assert!(
        link_exists(),
        "host veth {host_link} exists while the owner runs"
    );
    assert!(!netns_in_use(&inode).is_empty());

    // SAFETY: signalling our own child.
    assert_eq!(
        unsafe { libc::kill(owner as libc::pid_t, libc::SIGKILL) },
        0
    );
    let killed = Instant::now();
    assert!(!guard.0.wait().unwrap().success());
    for (&pid, &start) in pids.iter().zip(&starts) {
        while !gone(pid, start) && killed.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            gone(pid, start),
            "pid {pid} still runs after SIGKILL: {:?}",
            stat(pid)
        );
    }
    // The namespaces go with their last process, the veths with their namespaces.
    while (link_exists() || !netns_in_use(&inode).is_empty())
        && killed.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        netns_in_use(&inode).is_empty(),
        "node namespace {inode} still used"
    );
    assert!(!link_exists(), "{host_link} left behind");
    eprintln!(
        "data plane (7 processes, 2 namespaces, veths) gone {:?} after SIGKILL",
        killed.elapsed()
    );
}

/// Processes whose pid namespace is that of `pid` (a node's processes, pods included).
fn in_pid_namespace_of(pid: u32) -> Vec<(u32, u64)> {
    let Some(ns) = netns_inode(Path::new(&format!("/proc/{pid}/ns/pid"))) else {
        return Vec::new();
    };
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| netns_inode(Path::new(&format!("/proc/{p}/ns/pid"))).as_deref() == Some(&ns))
        .filter_map(|p| Some((p, stat(p)?.1)))
        .collect()
}

#[tokio::test]
async fn sigkilled_owner_leaves_no_node_process_or_pod_and_its_cgroups_are_swept() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};
    if local_cluster::skip_without_nodes("sigkilled_owner_leaves_no_node_process_or_pod") {
        return;
    }
    let (mut guard, rx) = spawn_local_cluster(&["--nodes", "1", "k9n"]);
    let mut kubeconfig = None;
    let mut node_pids: Vec<u32> = Vec::new();
    let mut output = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while node_pids.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).unwrap_or_else(|e| {
            panic!(
                "no real node line ({e}); output so far:\n{}",
                output.join("\n")
            )
        });
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("kubectl --kubeconfig ") {
            kubeconfig = rest.split_whitespace().next().map(PathBuf::from);
        }
        if let Some(rest) = t.strip_prefix("real node: ") {
            node_pids = rest
                .split(" pids ")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .map(|p| p.parse().unwrap())
                .collect();
        }
        output.push(line);
    }
    // A pod on the node: its shim and containers must die with the owner too.
    let yaml = std::fs::read_to_string(kubeconfig.expect("a kubectl line")).unwrap();
    let client = local_cluster::client_from_yaml(&yaml).await.unwrap();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sleeper"},
        "spec": {"nodeName": "k9n-node", "automountServiceAccountToken": false,
            "containers": [{"name": "s", "image": "service-mirror.local/busybox:1.35",
                "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let t = Instant::now();
    loop {
        // The namespace's ServiceAccount comes a moment after the cluster.
        if pods.create(&PostParams::default(), &pod).await.is_ok() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "create the pod");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let init = *node_pids.last().unwrap();
    let t = Instant::now();
    let procs = loop {
        let running = pods
            .get("sleeper")
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .is_some_and(|p| p == "Running");
        let procs = in_pid_namespace_of(init);
        if running && procs.len() >= 4 {
            break procs;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the pod runs: {procs:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let owner = guard.0.id();
    let prefix = format!("service-mirror-{owner}-");
    let ours = || {
        local_cluster::leftover_cgroups()
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
            })
            .collect::<Vec<_>>()
    };
    assert!(!ours().is_empty(), "the node's cgroup roots exist");

    // SAFETY: signalling our own child.
    assert_eq!(
        unsafe { libc::kill(owner as libc::pid_t, libc::SIGKILL) },
        0
    );
    let killed = Instant::now();
    assert!(!guard.0.wait().unwrap().success());
    for (pid, start) in procs.iter().chain(
        node_pids
            .iter()
            .filter_map(|p| Some((*p, stat(*p)?.1)))
            .collect::<Vec<_>>()
            .iter(),
    ) {
        while !gone(*pid, *start) && killed.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            gone(*pid, *start),
            "pid {pid} of the node still runs {:?} after its owner was killed",
            killed.elapsed()
        );
    }
    eprintln!(
        "{} node processes (kubelet, containerd, shim, pause, the pod's sleep) gone {:?} after SIGKILL",
        procs.len() + node_pids.len(),
        killed.elapsed()
    );
    // Its empty cgroup roots are swept by the next node start (this sweep).
    local_cluster::sweep_node_cgroups();
    assert!(ours().is_empty(), "swept: {:?}", ours());
}
