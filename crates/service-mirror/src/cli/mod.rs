//! Command-line interface: one file per command.

pub mod allow;
pub mod client;
mod export;
mod install;
pub mod link;
mod output;
mod run;

use clap::{Parser, Subcommand};

/// Kubernetes multi-cluster service mirror.
#[derive(Debug, Parser)]
#[command(name = "service-mirror", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller: watch link Secrets and mirror every linked cluster.
    Run(run::RunArgs),
    /// Print the link Secret for a remote cluster (apply it to the local cluster).
    Link(link::LinkArgs),
    /// Print the local-side manifests: namespace, RBAC and Deployment of the controller.
    Install(install::InstallArgs),
    /// Print the remote-side manifests: a ServiceAccount that may only read Services.
    Allow(allow::AllowArgs),
    /// Export a Service: annotate it with the gateway that carries its traffic.
    Export(export::ExportArgs),
    /// Stop exporting a Service: remove the gateway annotations.
    Unexport(export::UnexportArgs),
    /// Start local clusters (west local, east remote), link them and play a short story.
    Demo(crate::demo::DemoArgs),
}

impl Cli {
    /// Runs the chosen command.
    pub async fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Run(args) => run::run(args).await,
            Command::Link(args) => link::run(args).await,
            Command::Install(args) => install::run(args),
            Command::Allow(args) => allow::run(args),
            Command::Export(args) => export::export(args).await,
            Command::Unexport(args) => export::unexport(args).await,
            Command::Demo(args) => {
                crate::telemetry::init_logging(
                    "warn,kube_client=off",
                    crate::telemetry::LogFormat::Plain,
                )?;
                crate::demo::run(args).await
            }
        }
    }
}
