//! Flags shared by several commands, flattened into their arguments so that each flag,
//! its environment variable and its default are written once.

use super::output::{OutputFormat, print_documents};
use std::path::PathBuf;

/// Which cluster a command talks to: `--kubeconfig` and `--context`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KubeArgs {
    /// Kubeconfig of the cluster this command talks to (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, env = "SERVICE_MIRROR_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig (default: its current context).
    #[arg(long, env = "SERVICE_MIRROR_CONTEXT")]
    pub context: Option<String>,
}

impl KubeArgs {
    /// A client for these flags (see [`super::client::client_from`]).
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        super::client::client_from(self.kubeconfig.as_ref(), self.context.as_deref()).await
    }
}

/// How a command prints its manifests: `-o`/`--output`.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(
        short,
        long,
        env = "SERVICE_MIRROR_OUTPUT",
        value_enum,
        default_value = "yaml"
    )]
    pub output: OutputFormat,
}

impl OutputArgs {
    /// Prints `docs` to stdout in the chosen format.
    pub fn print(&self, docs: &[serde_json::Value]) -> anyhow::Result<()> {
        print_documents(docs, self.output)
    }
}
