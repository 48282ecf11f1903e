//! Command-line interface: one file per command.

pub mod allow;
mod args;
pub mod check;
pub mod client;
mod export;
pub mod gateways;
mod install;
pub mod link;
pub mod link_destination;
pub mod link_gen;
mod manifest;
mod output;
mod run;
pub mod unlink;

use clap::Subcommand;

/// The controller's commands; the `service-mirror` binary adds `demo` beside them.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller: watch link Secrets and mirror every linked cluster.
    Run(run::RunArgs),
    /// Print the link Secret (or, with --format link, what Linkerd's link-gen prints:
    /// two credentials Secrets and a Link) for a remote cluster (apply it to the local
    /// cluster);
    /// --kubeconfig and --context reach the REMOTE cluster.
    Link(link::LinkArgs),
    /// Print the local-side manifests: namespace, RBAC and Deployment of the controller.
    Install(install::InstallArgs),
    /// Print the remote-side manifests: a ServiceAccount that may only read Services.
    Allow(allow::AllowArgs),
    /// Export a Service: annotate it with the gateway that carries its traffic.
    Export(export::ExportArgs),
    /// Stop exporting a Service: remove the gateway annotations.
    Unexport(export::UnexportArgs),
    /// Show every link's gateways (alive, mirrors, latency) from a controller's admin server.
    Gateways(gateways::GatewaysArgs),
    /// Remove (or with --dry-run list) what links a cluster and all its mirrors, on the
    /// LOCAL cluster.
    Unlink(unlink::UnlinkArgs),
    /// Check the links, the controller's leader, the gateways and the mirrors' endpoints
    /// on the LOCAL cluster; exit code 1 if a check fails.
    Check(check::CheckArgs),
}

impl Command {
    /// Parses `argv` (the program name first) as one of these commands, as the
    /// `service-mirror` binary would (for programs that embed the controller).
    pub fn try_parse_from<I, T>(argv: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(clap::Parser)]
        #[command(name = "service-mirror")]
        struct Args {
            #[command(subcommand)]
            command: Command,
        }
        <Args as clap::Parser>::try_parse_from(argv).map(|a| a.command)
    }

    /// Runs the chosen command.
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            Command::Run(args) => run::run(args).await,
            Command::Link(args) => link::run(args).await,
            Command::Install(args) => install::run(args),
            Command::Allow(args) => allow::run(args),
            Command::Export(args) => export::export(args).await,
            Command::Unexport(args) => export::unexport(args).await,
            Command::Gateways(args) => gateways::run(args).await,
            Command::Unlink(args) => unlink::run(args).await,
            Command::Check(args) => check::run(args).await,
        }
    }
}
