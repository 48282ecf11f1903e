//! Command-line interface.

use clap::{Parser, Subcommand};

/// Kubernetes multi-cluster service mirror.
#[derive(Debug, Parser)]
#[command(name = "service-mirror", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log filter (tracing `EnvFilter` syntax, e.g. `info` or `service_mirror=debug`).
    #[arg(
        long,
        global = true,
        env = "SERVICE_MIRROR_LOG_LEVEL",
        default_value = "warn,kube_client=off"
    )]
    log_level: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start local clusters (west local, east remote), link them and play a short story.
    Demo(crate::demo::DemoArgs),
}

impl Cli {
    /// Runs the chosen command.
    pub async fn run(self) -> anyhow::Result<()> {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::try_new(&self.log_level)?)
            .with_writer(std::io::stderr)
            .try_init();
        match self.command {
            Command::Demo(args) => crate::demo::run(args).await,
        }
    }
}
