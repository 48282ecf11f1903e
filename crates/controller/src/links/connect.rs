//! Turning a link into a client, checked against the remote before it is used.

use super::sanitize::sanitize_remote_text;
use super::secret::{LinkError, LinkSpec, redact};
use crate::kube_client::ClientMetrics;
use crate::permissions::{Permission, is_allowed};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams};
use std::time::Duration;

const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a client for the link (its requests counted in `metrics` under the link's
/// cluster name, each response body bounded to `max_frame` bytes a line: see
/// frame_limit.rs) and checks it may list Services on the remote. The kubeconfig is
/// checked again here, where the client is built, whatever the caller checked.
pub async fn connect(
    spec: &LinkSpec,
    metrics: &ClientMetrics,
    max_frame: usize,
) -> Result<kube::Client, LinkError> {
    let kc = spec.checked_kubeconfig()?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| LinkError::InvalidKubeconfig(redact(&e.to_string())))?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(295));
    let client =
        crate::kube_client::build_remote(config, &spec.link().cluster_name, metrics, max_frame)
            .map_err(|e| classify(&e))?;
    let api = Api::<Service>::all(client.clone());
    let lp = ListParams::default().limit(1);
    match tokio::time::timeout(PROBE_TIMEOUT, api.list_metadata(&lp)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(classify(&e)),
        Err(_) => {
            return Err(LinkError::Unreachable(format!(
                "no answer within {} s",
                PROBE_TIMEOUT.as_secs()
            )));
        }
    }
    // A list can succeed where a watch is refused; without watch the mirrors would
    // freeze at the first list, so ask before linking.
    let watch = Permission {
        verb: "watch".into(),
        group: String::new(),
        resource: "services".into(),
        namespace: None,
    };
    match tokio::time::timeout(PROBE_TIMEOUT, is_allowed(&client, &watch)).await {
        Ok(Ok(true)) => Ok(client),
        Ok(Ok(false)) => Err(LinkError::Forbidden(
            "the credentials may list but not watch services (cluster-wide): grant list and watch"
                .into(),
        )),
        Ok(Err(e)) => Err(classify(&e)),
        Err(_) => Err(LinkError::Unreachable(format!(
            "no answer within {} s",
            PROBE_TIMEOUT.as_secs()
        ))),
    }
}

/// Sorts a client error into the reasons an operator can act on. Every text in it
/// comes from the remote (or the way to it): sanitized and bounded.
fn classify(e: &kube::Error) -> LinkError {
    if let kube::Error::Api(s) = e {
        return match s.code {
            401 => LinkError::Unauthorized,
            403 => LinkError::Forbidden(sanitize_remote_text(&s.message)),
            _ => LinkError::Unreachable(format!(
                "HTTP {}: {}",
                s.code,
                sanitize_remote_text(&s.message)
            )),
        };
    }
    // Walk the source chain: TLS failures hide a few levels down.
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    let lower = text.to_lowercase();
    if lower.contains("certificate") || lower.contains("tls") || lower.contains("unknownissuer") {
        LinkError::Tls(sanitize_remote_text(&text))
    } else {
        LinkError::Unreachable(sanitize_remote_text(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use service_mirror_core::Link;

    const KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: east
  cluster:
    server: https://127.0.0.1:1
    insecure-skip-tls-verify: true
users:
- name: east
  user:
    exec: {command: /bin/false, apiVersion: client.authentication.k8s.io/v1}
contexts:
- name: east
  context: {cluster: east, user: east}
current-context: east
";

    #[tokio::test]
    async fn connect_checks_again_and_refuses_a_spec_that_skipped_the_parse() {
        let unsafe_spec = LinkSpec::unchecked_for_tests(Link::new("east", None), KUBECONFIG);
        let err = connect(&unsafe_spec, &ClientMetrics::default(), 1 << 20)
            .await
            .err()
            .expect("refused");
        assert_eq!(err.reason(), "UnsafeKubeconfig", "{err}");
        let insecure = KUBECONFIG.replace(
            "    exec: {command: /bin/false, apiVersion: client.authentication.k8s.io/v1}",
            "    token: t",
        );
        let insecure_spec = LinkSpec::unchecked_for_tests(Link::new("east", None), &insecure);
        let err = connect(&insecure_spec, &ClientMetrics::default(), 1 << 20)
            .await
            .err()
            .expect("refused");
        assert_eq!(err.reason(), "InsecureKubeconfig", "{err}");
    }
}
