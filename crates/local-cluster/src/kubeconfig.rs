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

    /// The same kubeconfig with every cluster's `server` set to `https://<addr>` (a
    /// [`crate::TcpProxy`] in front of the apiserver, say), written next to this one as
    /// `<name>-via-<port>.kubeconfig`. TLS is unchanged: the apiserver's certificate is
    /// valid for 127.0.0.1, so a client verifies it through a loopback proxy.
    pub fn via(&self, addr: std::net::SocketAddr) -> Result<Self> {
        let yaml = with_server(&self.yaml, &format!("https://{addr}"))?;
        let stem = self
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "kubeconfig".into());
        let path = self
            .path
            .with_file_name(format!("{stem}-via-{}.kubeconfig", addr.port()));
        Self::write(yaml, path)
    }

    /// A kube client for this kubeconfig's current context.
    pub async fn client(&self) -> Result<kube::Client> {
        client_from_yaml(&self.yaml).await
    }

    /// One kubeconfig holding every cluster, user and context of `parts` (their names
    /// must differ), the first one's context current, written to `path` (mode 0600).
    /// Written as JSON, which every kubeconfig loader reads as YAML.
    pub fn merge(parts: &[&Kubeconfig], path: PathBuf) -> Result<Self> {
        let mut merged = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [], "users": [], "contexts": [],
        });
        let mut names = std::collections::BTreeSet::new();
        for (i, part) in parts.iter().enumerate() {
            let doc: serde_json::Value = serde_saphyr::from_str(&part.yaml)
                .map_err(|e| Error::Kubeconfig(format!("{}: {e}", part.path.display())))?;
            for list in ["clusters", "users", "contexts"] {
                for entry in doc[list].as_array().into_iter().flatten() {
                    let name = entry["name"].as_str().unwrap_or_default();
                    if !names.insert(format!("{list}/{name}")) {
                        return Err(Error::Kubeconfig(format!("two {list} named {name:?}")));
                    }
                    merged[list]
                        .as_array_mut()
                        .expect("an array")
                        .push(entry.clone());
                }
            }
            if i == 0 {
                merged["current-context"] = doc["current-context"].clone();
            }
        }
        let text = serde_json::to_string_pretty(&merged).expect("JSON");
        Self::write(text, path)
    }
}

/// Kubeconfig YAML `yaml` with the value of every `server:` key replaced by `server`.
pub fn with_server(yaml: &str, server: &str) -> Result<String> {
    let mut replaced = 0;
    let mut out = String::with_capacity(yaml.len() + server.len());
    for line in yaml.split_inclusive('\n') {
        let body = line.trim_start();
        if body.starts_with("server:") {
            let indent = &line[..line.len() - body.len()];
            out.push_str(indent);
            out.push_str("server: ");
            out.push_str(server);
            out.push('\n');
            replaced += 1;
        } else {
            out.push_str(line);
        }
    }
    if replaced == 0 {
        return Err(Error::Kubeconfig("no `server:` in the kubeconfig".into()));
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merged_kubeconfig_holds_every_context_and_refuses_a_name_twice() {
        let dir = tempfile::tempdir().unwrap();
        let part = |name: &str| {
            let yaml =
                Kubeconfig::render(name, "https://127.0.0.1:6443", "ca", Credential::Token("t"));
            Kubeconfig::write(yaml, dir.path().join(format!("{name}.kubeconfig"))).unwrap()
        };
        let (west, east) = (part("west"), part("east"));
        let merged = Kubeconfig::merge(&[&west, &east], dir.path().join("both")).unwrap();
        let doc: serde_json::Value = serde_saphyr::from_str(&merged.yaml).unwrap();
        let names = |list: &str| -> Vec<String> {
            doc[list]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(names("contexts"), ["west", "east"]);
        assert_eq!(names("clusters"), ["west", "east"]);
        assert_eq!(doc["current-context"], "west");
        assert_eq!(doc["contexts"][1]["context"]["cluster"], "east");
        assert!(Kubeconfig::merge(&[&west, &west], dir.path().join("twice")).is_err());
    }

    #[test]
    fn with_server_replaces_every_server_and_keeps_the_rest() {
        let yaml = Kubeconfig::render("c", "https://127.0.0.1:1", "ca", Credential::Token("t"));
        let moved = with_server(&yaml, "https://127.0.0.1:2").unwrap();
        assert!(
            moved.contains("    server: https://127.0.0.1:2\n"),
            "{moved}"
        );
        assert!(!moved.contains(":1\n"), "{moved}");
        assert_eq!(moved.replace(":2\n", ":1\n"), yaml);
        assert!(with_server("apiVersion: v1\n", "x").is_err());
    }
}
