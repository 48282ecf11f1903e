//! The command line: the controller's commands, and `demo` in builds with the `demo`
//! feature (the default for `cargo run`; the release image is built without it).

use clap::{Parser, Subcommand};
use service_mirror_controller::cli::Command as ControllerCommand;

/// `--version` names the build's features, so a check can tell the release image's binary
/// (`--no-default-features`, as the Dockerfile builds it) from a development build without
/// trusting how it was built.
#[cfg(feature = "demo")]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (features: demo)");
#[cfg(not(feature = "demo"))]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (features: none)");

/// Kubernetes multi-cluster service mirror.
#[derive(Debug, Parser)]
#[command(name = "service-mirror", version = VERSION, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Controller(Box<ControllerCommand>),
    /// Start local clusters (west local, east and north remote), link them and play a
    /// short story.
    #[cfg(feature = "demo")]
    Demo(service_mirror_demo::DemoArgs),
}

impl Cli {
    /// Runs the chosen command.
    pub(crate) async fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Controller(command) => command.run().await,
            #[cfg(feature = "demo")]
            Command::Demo(args) => service_mirror_demo::run(args).await,
        }
    }
}
