//! Building a Kubernetes client from the usual flags.

use anyhow::Context;
use std::path::PathBuf;

/// A client for `--kubeconfig`/`--context`; with neither, the in-cluster config, then
/// `$KUBECONFIG` or `~/.kube/config`.
pub async fn client_from(
    kubeconfig: Option<&PathBuf>,
    context: Option<&str>,
) -> anyhow::Result<kube::Client> {
    Ok(kube::Client::try_from(
        config_from(kubeconfig, context).await?,
    )?)
}

/// The configuration [`client_from`] uses.
pub async fn config_from(
    kubeconfig: Option<&PathBuf>,
    context: Option<&str>,
) -> anyhow::Result<kube::Config> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        None if context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .context("loading $KUBECONFIG or ~/.kube/config")?,
        None => kube::Config::infer()
            .await
            .context("no --kubeconfig given and neither in-cluster config nor $KUBECONFIG/~/.kube/config works")?,
    };
    Ok(config)
}
