//! `service-mirror check`: is multicluster mirroring healthy on this (local) cluster?
//! In the spirit of `linkerd multicluster check`: one `√`/`×` line per check, a hint
//! under each failure, exit code 1 if any fails.
//!
//! ```text
//! service-mirror check [--namespace linkerd-multicluster] [--admin-addr HOST:PORT] [-o json]
//! ```

pub mod checks;
pub mod gather;
pub mod linkerd;

use super::allow::DEFAULT_NAMESPACE;
use super::args::KubeArgs;
use anyhow::Context;
pub use checks::{Gathered, Line};
pub use gather::{MetricsSource, gather};

/// Output of `check`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckOutput {
    /// `√`/`×` lines.
    Table,
    /// `{"success": bool, "checks": [...]}`.
    Json,
}

/// Arguments of `check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Namespace of the controller (its Links, link Secrets and Lease).
    #[arg(short, long, env = "SERVICE_MIRROR_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Name of the controller's leader-election Lease (`run --lease-name`).
    #[arg(
        long,
        env = "SERVICE_MIRROR_LEASE_NAME",
        default_value = "service-mirror"
    )]
    pub lease_name: String,
    /// Address of the controller's admin server (`HOST:PORT`); default: the Lease
    /// holder pod's `*-admin` port through the apiserver's pod proxy.
    #[arg(long)]
    pub admin_addr: Option<String>,
    /// Namespace of Linkerd's control plane on this cluster (its `linkerd-config`
    /// holds the trust anchors compared with each remote's).
    #[arg(long, default_value = "linkerd")]
    pub linkerd_namespace: String,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: CheckOutput,
    /// The LOCAL cluster.
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// What `check` prints for `lines`.
pub fn render(lines: &[Line], output: CheckOutput) -> String {
    match output {
        CheckOutput::Table => checks::render(lines),
        CheckOutput::Json => {
            let v = serde_json::json!({
                "success": lines.iter().all(|l| l.ok),
                "checks": lines,
            });
            format!("{}\n", serde_json::to_string_pretty(&v).expect("JSON"))
        }
    }
}

/// Runs every check against the cluster: the lines, and the data they came from.
pub async fn check(
    client: &kube::Client,
    args: &CheckArgs,
) -> anyhow::Result<(Vec<Line>, Gathered)> {
    let source = match &args.admin_addr {
        Some(a) => MetricsSource::Addr(a.clone()),
        None => MetricsSource::PodProxy,
    };
    let g = gather::gather_with(
        client,
        &args.namespace,
        &args.lease_name,
        &source,
        &args.linkerd_namespace,
    )
    .await?;
    Ok((checks::all(&g), g))
}

/// Prints the checks; fails (exit code 1) if any failed.
pub async fn run(args: CheckArgs) -> anyhow::Result<()> {
    let client = args
        .kube
        .client()
        .await
        .context("connecting to the local cluster")?;
    let (lines, _) = check(&client, &args).await?;
    print!("{}", render(&lines, args.output));
    let failed = lines.iter().filter(|l| !l.ok).count();
    anyhow::ensure!(failed == 0, "{failed} checks failed");
    Ok(())
}
