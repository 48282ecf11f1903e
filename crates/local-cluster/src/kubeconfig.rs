//! Kubeconfigs handed out by a local cluster.

use crate::{Error, Result};
use base64::Engine;
use std::path::PathBuf;

/// A kubeconfig as YAML text, also written to a file.
#[derive(Debug, Clone)]
pub struct Kubeconfig {
    /// The YAML document.
    pub yaml: String,
    /// Where it was written.
    pub path: PathBuf,
}

/// How the user of a kubeconfig authenticates.
pub(crate) enum Credential<'a> {
    ClientCert { cert: &'a str, key: &'a str },
    Token(&'a str),
}

impl Kubeconfig {
    /// Renders a single-context kubeconfig named `context`.
    pub(crate) fn render(
        context: &str,
        server: &str,
        ca_pem: &str,
        cred: Credential<'_>,
    ) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let user = match cred {
            Credential::ClientCert { cert, key } => format!(
                "    client-certificate-data: {}\n    client-key-data: {}\n",
                b64(cert),
                b64(key)
            ),
            Credential::Token(t) => format!("    token: {t}\n"),
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {context}\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {context}\n  user:\n{user}contexts:\n- name: {context}\n  context:\n    cluster: {context}\n    user: {context}\ncurrent-context: {context}\n",
            ca = b64(ca_pem),
        )
    }

    /// Writes `yaml` to `path` (mode 0600) and returns the pair.
    pub(crate) fn write(yaml: String, path: PathBuf) -> Result<Self> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(yaml.as_bytes())?;
        Ok(Self { yaml, path })
    }

    /// A kube client for this kubeconfig's current context.
    pub async fn client(&self) -> Result<kube::Client> {
        client_from_yaml(&self.yaml).await
    }
}

/// A kube client from kubeconfig YAML text.
pub async fn client_from_yaml(yaml: &str) -> Result<kube::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc =
        kube::config::Kubeconfig::from_yaml(yaml).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Ok(kube::Client::try_from(config)?)
}
