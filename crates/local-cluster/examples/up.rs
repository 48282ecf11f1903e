//! Starts local clusters (default: `west` and `east`) and prints how to reach them;
//! Ctrl-C stops them. `cargo run -p local-cluster --example up -- west east north`

use local_cluster::LocalCluster;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut names: Vec<String> = std::env::args().skip(1).collect();
    if names.is_empty() {
        names = vec!["west".into(), "east".into()];
    }
    let mut clusters = Vec::new();
    for name in &names {
        let started = std::time::Instant::now();
        let c = LocalCluster::start(name).await?;
        println!(
            "{name}: ready in {:.1?} at {}",
            started.elapsed(),
            c.server_url()
        );
        println!(
            "  kubectl --kubeconfig {} get namespaces",
            c.admin_kubeconfig().path.display()
        );
        clusters.push(c);
    }
    println!("Ctrl-C stops the clusters and removes their files.");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
