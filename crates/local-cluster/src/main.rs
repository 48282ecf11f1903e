//! `local-cluster [NAME...]`: starts local clusters (default: `west` and `east`), prints
//! how to reach them, and stops them on Ctrl-C or SIGTERM.
//!
//! `cargo run -p local-cluster -- west east north`
//!
//! For every cluster it prints, in this order:
//!
//! ```text
//! west: ready in 3.1s at https://127.0.0.1:40123
//!   kubectl --kubeconfig /tmp/service-mirror-local/1234-west-ab12/admin.kubeconfig get namespaces
//!   dir: /tmp/service-mirror-local/1234-west-ab12
//!   pids: etcd=1240 kube-apiserver=1251
//! ```
//!
//! and finally `Ctrl-C stops the clusters and removes their files.` once all are ready.
//!
//! `--data-plane` (needs root) gives every cluster a data plane (docs/data-plane.md) and
//! adds, after the pids line:
//!
//! ```text
//!   node: west-node 198.19.7.10 dns 198.19.7.10:53 netns /proc/1262/ns/net
//!   data-plane pids: 1270 1275 1281 1262 1258
//! ```
//! `--nodes N` (root) gives every cluster N real nodes (docs/real-node.md) and adds a
//! line per node:
//!
//! ```text
//!   real node: west-node 198.19.7.10 pids 1290 1301 1262
//! ```
//!
//! The processes die with this program, also when it is killed with SIGKILL.

use local_cluster::{ClusterOptions, LocalCluster};
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut names: Vec<String> = std::env::args().skip(1).collect();
    if names.iter().any(|n| n == "-h" || n == "--help") {
        println!(
            "usage: local-cluster [--data-plane] [--nodes N] [NAME...]\n\nStarts one etcd + kube-apiserver per NAME (default: west east) on 127.0.0.1\nand prints their URLs, kubeconfig paths, directories and process ids.\n--data-plane (root) adds a node namespace with kube-proxy and CoreDNS and\nkube-controller-manager to each; --nodes N (root) gives each N real nodes\n(kubelet + containerd; docs/real-node.md).\nCtrl-C or SIGTERM stops them and removes their files."
        );
        return Ok(());
    }
    let data_plane = names.iter().any(|n| n == "--data-plane");
    names.retain(|n| n != "--data-plane");
    let mut nodes = 0;
    if let Some(i) = names.iter().position(|n| n == "--nodes") {
        let n = names.get(i + 1).and_then(|n| n.parse::<usize>().ok());
        let Some(n) = n.filter(|n| (1..=8).contains(n)) else {
            anyhow::bail!("--nodes wants a number of nodes per cluster, 1 to 8");
        };
        nodes = n;
        names.drain(i..=i + 1);
    }
    if names.is_empty() {
        names = vec!["west".into(), "east".into()];
    }
    let mut terminate = signal(SignalKind::terminate())?;
    let mut clusters = Vec::new();
    for name in &names {
        let started = std::time::Instant::now();
        let c = tokio::select! {
            c = LocalCluster::start_with(name, ClusterOptions { data_plane, nodes, ..Default::default() }) => c?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
        };
        println!(
            "{name}: ready in {:.1?} at {}",
            started.elapsed(),
            c.server_url()
        );
        println!(
            "  kubectl --kubeconfig {} get namespaces",
            c.admin_kubeconfig().path.display()
        );
        println!("  dir: {}", c.dir().display());
        let pid = |p: Option<u32>| p.map_or_else(|| "-".to_string(), |p| p.to_string());
        println!(
            "  pids: etcd={} kube-apiserver={}",
            pid(c.etcd_pid()),
            pid(c.apiserver_pid())
        );
        if let Some(p) = c.data_plane() {
            println!(
                "  node: {} {} dns {} netns {}",
                p.node_name(),
                p.node_ip(),
                p.dns_addr(),
                p.netns_path().display()
            );
            let pids: Vec<String> = p.pids().iter().map(u32::to_string).collect();
            println!("  data-plane pids: {}", pids.join(" "));
            for n in p.nodes() {
                let pids: Vec<String> = n.pids().iter().map(u32::to_string).collect();
                println!(
                    "  real node: {} {} pids {}",
                    n.name(),
                    n.ip(),
                    pids.join(" ")
                );
            }
        }
        clusters.push(c);
    }
    println!("Ctrl-C stops the clusters and removes their files.");
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = terminate.recv() => {}
    }
    // Dropping the handles kills the processes and removes the directories.
    drop(clusters);
    Ok(())
}
