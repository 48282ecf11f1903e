//! Reading a link Secret: what it says, or a clear reason why it cannot be used.

use k8s_openapi::api::core::v1::Secret;
use kube::config::Kubeconfig;
use service_mirror_core::labels::{
    LINK_CLUSTER_DOMAIN_ANNOTATION, LINK_CLUSTER_NAME_ANNOTATION, LINK_KUBECONFIG_KEY,
};
use service_mirror_core::{Link, validate_cluster_name};

/// A usable link: the remote cluster's name and domain and its kubeconfig.
#[derive(Clone, PartialEq, Eq)]
pub struct LinkSpec {
    /// Name and domain.
    pub link: Link,
    /// The kubeconfig YAML (a credential: never logged).
    pub kubeconfig: String,
}

impl std::fmt::Debug for LinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkSpec")
            .field("link", &self.link)
            .field("kubeconfig", &"<redacted>")
            .finish()
    }
}

/// Why a link Secret cannot be used. Messages never contain credential material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// No `kubeconfig` key.
    #[error("the Secret has no `kubeconfig` data key")]
    MissingKubeconfig,
    /// The kubeconfig is not a valid kubeconfig document.
    #[error("the kubeconfig does not parse: {0}")]
    InvalidKubeconfig(String),
    /// No current context to use.
    #[error("the kubeconfig has no current-context")]
    NoCurrentContext,
    /// The kubeconfig would run commands or read local files.
    #[error("the kubeconfig uses {0}, which a link may not (only inline certificates and tokens)")]
    UnsafeKubeconfig(String),
    /// No cluster-name annotation.
    #[error("the Secret lacks the mirror.linkerd.io/cluster-name annotation")]
    MissingClusterName,
    /// The cluster name is not a valid DNS-1123 label of at most 48 characters.
    #[error("invalid cluster name {0:?}: {1}")]
    InvalidClusterName(String, String),
    /// Another Secret links the same cluster name.
    #[error("cluster name {0:?} is already linked by Secret {1}")]
    DuplicateClusterName(String, String),
    /// The remote apiserver cannot be reached.
    #[error("the remote apiserver is unreachable: {0}")]
    Unreachable(String),
    /// TLS with the remote failed (wrong CA, bad certificate).
    #[error("TLS with the remote apiserver failed (check the CA in the kubeconfig): {0}")]
    Tls(String),
    /// The remote rejected the credentials.
    #[error("the remote apiserver rejected the credentials (401 Unauthorized)")]
    Unauthorized,
    /// The credentials may not list Services.
    #[error("the credentials may not list services on the remote cluster (403 Forbidden): {0}")]
    Forbidden(String),
    /// The new credentials did not sync in time during a rotation.
    #[error("the new credentials did not sync within {0} s; the old ones stay in use")]
    RotationTimeout(u64),
}

impl LinkError {
    /// The Kubernetes Event reason (also the metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            LinkError::MissingKubeconfig => "MissingKubeconfig",
            LinkError::InvalidKubeconfig(_) => "InvalidKubeconfig",
            LinkError::NoCurrentContext => "NoCurrentContext",
            LinkError::UnsafeKubeconfig(_) => "UnsafeKubeconfig",
            LinkError::MissingClusterName => "MissingClusterName",
            LinkError::InvalidClusterName(..) => "InvalidClusterName",
            LinkError::DuplicateClusterName(..) => "DuplicateClusterName",
            LinkError::Unreachable(_) => "RemoteUnreachable",
            LinkError::Tls(_) => "RemoteTLSError",
            LinkError::Unauthorized => "RemoteUnauthorized",
            LinkError::Forbidden(_) => "RemoteForbidden",
            LinkError::RotationTimeout(_) => "RotationTimeout",
        }
    }

    /// Whether retrying without a change to the Secret may help (the remote may come
    /// back, or its RBAC may be fixed).
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            LinkError::Unreachable(_)
                | LinkError::Tls(_)
                | LinkError::Unauthorized
                | LinkError::Forbidden(_)
                | LinkError::RotationTimeout(_)
        )
    }
}

/// Replaces quoted fragments of a parser message: they may quote the document.
pub(crate) fn redact(msg: &str) -> String {
    let mut out = String::new();
    let mut in_quote = false;
    for c in msg.chars() {
        match (c, in_quote) {
            ('"' | '`', false) => {
                in_quote = true;
                out.push_str("\"…");
            }
            ('"' | '`', true) => {
                in_quote = false;
                out.push('"');
            }
            (_, true) => {}
            (c, false) => out.push(c),
        }
    }
    out.lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect()
}

/// Reads a link Secret.
pub fn parse_link_secret(secret: &Secret) -> Result<LinkSpec, LinkError> {
    let annotations = secret.metadata.annotations.clone().unwrap_or_default();
    let name = annotations
        .get(LINK_CLUSTER_NAME_ANNOTATION)
        .filter(|n| !n.is_empty())
        .ok_or(LinkError::MissingClusterName)?;
    validate_cluster_name(name)
        .map_err(|e| LinkError::InvalidClusterName(name.clone(), e.to_string()))?;
    let domain = annotations
        .get(LINK_CLUSTER_DOMAIN_ANNOTATION)
        .map(String::as_str);
    let raw = secret
        .data
        .as_ref()
        .and_then(|d| d.get(LINK_KUBECONFIG_KEY))
        .ok_or(LinkError::MissingKubeconfig)?;
    let text = String::from_utf8(raw.0.clone())
        .map_err(|_| LinkError::InvalidKubeconfig("not UTF-8 text".into()))?;
    let kc = Kubeconfig::from_yaml(&text)
        .map_err(|e| LinkError::InvalidKubeconfig(redact(&e.to_string())))?;
    check_kubeconfig(&kc)?;
    let mut link = Link::new(name.clone(), domain);
    if let Some(ns) = &secret.metadata.namespace {
        link = link.with_controller_namespace(ns);
    }
    Ok(LinkSpec {
        link,
        kubeconfig: text,
    })
}

/// A link kubeconfig must be self-contained: no exec plugins, auth providers or files
/// (those would run commands or read this pod's files, such as its own token).
pub fn check_kubeconfig(kc: &Kubeconfig) -> Result<(), LinkError> {
    let current = kc
        .current_context
        .as_deref()
        .filter(|c| !c.is_empty())
        .ok_or(LinkError::NoCurrentContext)?;
    if !kc.contexts.iter().any(|c| c.name == current) {
        return Err(LinkError::InvalidKubeconfig(format!(
            "current-context {current:?} is not defined"
        )));
    }
    for a in kc.auth_infos.iter().filter_map(|a| a.auth_info.as_ref()) {
        let unsafe_use = [
            (a.exec.is_some(), "an exec credential plugin"),
            (a.auth_provider.is_some(), "an auth provider"),
            (a.token_file.is_some(), "tokenFile"),
            (a.client_certificate.is_some(), "a client-certificate file"),
            (a.client_key.is_some(), "a client-key file"),
        ];
        if let Some((_, what)) = unsafe_use.iter().find(|(used, _)| *used) {
            return Err(LinkError::UnsafeKubeconfig(what.to_string()));
        }
    }
    for c in kc.clusters.iter().filter_map(|c| c.cluster.as_ref()) {
        if c.certificate_authority.is_some() {
            return Err(LinkError::UnsafeKubeconfig(
                "a certificate-authority file".into(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;

    const KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: east
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: Zm9v
users:
- name: east
  user:
    token: s3cr3t-token
contexts:
- name: east
  context: {cluster: east, user: east}
current-context: east
";

    fn secret(annotations: &[(&str, &str)], kubeconfig: Option<&str>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("cluster-credentials-east".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            data: kubeconfig
                .map(|k| [("kubeconfig".to_string(), ByteString(k.as_bytes().to_vec()))].into()),
            type_: Some("mirror.linkerd.io/remote-kubeconfig".into()),
            ..Default::default()
        }
    }

    const NAME: (&str, &str) = ("mirror.linkerd.io/cluster-name", "east");

    #[test]
    fn a_good_secret_parses_with_the_default_domain() {
        let spec = parse_link_secret(&secret(&[NAME], Some(KUBECONFIG))).unwrap();
        assert_eq!(spec.link, Link::new("east", None));
        assert!(
            !format!("{spec:?}").contains("s3cr3t"),
            "debug output redacts the kubeconfig"
        );
        let spec = parse_link_secret(&secret(
            &[
                NAME,
                ("mirror.linkerd.io/remote-cluster-domain", "east.local"),
            ],
            Some(KUBECONFIG),
        ))
        .unwrap();
        assert_eq!(spec.link.cluster_domain, "east.local");
    }

    #[test]
    fn bad_secrets_give_clear_reasons() {
        let no_context = KUBECONFIG.replace("current-context: east\n", "");
        let exec = KUBECONFIG.replace(
            "    token: s3cr3t-token\n",
            "    exec: {command: sh, apiVersion: client.authentication.k8s.io/v1}\n",
        );
        let token_file = KUBECONFIG.replace(
            "    token: s3cr3t-token\n",
            "    tokenFile: /var/run/secrets/token\n",
        );
        let cases: Vec<(Secret, &str)> = vec![
            (secret(&[NAME], None), "MissingKubeconfig"),
            (
                secret(&[NAME], Some("clusters: [s3cr3t-token")),
                "InvalidKubeconfig",
            ),
            (secret(&[NAME], Some(&no_context)), "NoCurrentContext"),
            (secret(&[NAME], Some(&exec)), "UnsafeKubeconfig"),
            (secret(&[NAME], Some(&token_file)), "UnsafeKubeconfig"),
            (secret(&[], Some(KUBECONFIG)), "MissingClusterName"),
            (
                secret(
                    &[("mirror.linkerd.io/cluster-name", "East_1")],
                    Some(KUBECONFIG),
                ),
                "InvalidClusterName",
            ),
        ];
        for (s, reason) in cases {
            let err = parse_link_secret(&s).unwrap_err();
            assert_eq!(err.reason(), reason, "{err}");
            assert!(
                !err.to_string().contains("s3cr3t"),
                "no credential in {err}"
            );
        }
    }

    #[test]
    fn redaction_drops_quoted_fragments() {
        assert_eq!(
            redact("invalid type: string \"abc\", expected x\nmore"),
            "invalid type: string \"…\", expected x"
        );
    }
}
