//! `service-mirror link`: the Secret that registers a remote cluster with the mirror.
//!
//! ```text
//! service-mirror link --context east --cluster-name east | kubectl --context west apply -f -
//! ```
//!
//! It runs against the REMOTE cluster: it reads the token Secret of the ServiceAccount
//! created by `service-mirror allow`, and prints a `mirror.linkerd.io/remote-kubeconfig`
//! Secret holding a kubeconfig with the remote server, its CA and that (read-only)
//! token. The token is a credential: it is never logged nor put in an error message.

use super::allow::{DEFAULT_NAMESPACE, DEFAULT_SERVICE_ACCOUNT, check_names, token_secret_name};
use super::args::{KubeArgs, OutputArgs};
use super::link_destination::{
    LINKERD_CONFIG_NAME, LinkerdConfig, destination_credentials_secret, parse_linkerd_config,
    resolve_domains,
};
use super::link_gen::{LinkGenArgs, credentials_secret, link_resource};
use anyhow::{Context, bail};
use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta};
use service_mirror_core::labels::{
    DEFAULT_CLUSTER_DOMAIN, LINK_CLUSTER_DOMAIN_ANNOTATION, LINK_CLUSTER_NAME_ANNOTATION,
    LINK_KUBECONFIG_KEY, LINK_SECRET_TYPE,
};
use service_mirror_core::naming::validate_cluster_name;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Name of the link Secret of `cluster` (the conventional `cluster-credentials-<cluster>`).
pub fn link_secret_name(cluster: &str) -> String {
    format!("cluster-credentials-{cluster}")
}

/// Arguments of `link`.
#[derive(Debug, clap::Args)]
pub struct LinkArgs {
    /// Name of the remote cluster, used as the suffix of its mirrors (a DNS-1123 label of
    /// at most 48 characters).
    #[arg(long, env = "SERVICE_MIRROR_CLUSTER_NAME", value_parser = parse_cluster_name)]
    pub cluster_name: String,
    /// The REMOTE cluster: where the token Secret is read.
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Namespace of the ServiceAccount on the remote cluster (as given to `allow`).
    #[arg(
        long,
        env = "SERVICE_MIRROR_REMOTE_NAMESPACE",
        default_value = DEFAULT_NAMESPACE
    )]
    pub namespace: String,
    /// Name of the ServiceAccount on the remote cluster (as given to `allow`).
    #[arg(
        long,
        env = "SERVICE_MIRROR_SERVICE_ACCOUNT_NAME",
        default_value = DEFAULT_SERVICE_ACCOUNT
    )]
    pub service_account_name: String,
    /// Address of the remote API server as the mirror reaches it (default: the server of
    /// the kubeconfig context).
    #[arg(long, env = "SERVICE_MIRROR_API_SERVER_ADDRESS")]
    pub api_server_address: Option<String>,
    /// DNS domain of the remote cluster (default `cluster.local`; with `--format link`,
    /// `clusterDomain` of the remote's `linkerd-config` when it has one).
    #[arg(long, env = "SERVICE_MIRROR_CLUSTER_DOMAIN")]
    pub cluster_domain: Option<String>,
    /// Namespace of the printed Secret: where the mirror controller runs, locally.
    #[arg(
        long,
        env = "SERVICE_MIRROR_LINK_NAMESPACE",
        default_value = DEFAULT_NAMESPACE
    )]
    pub link_namespace: String,
    /// What is printed: `secret`, a link Secret (the 2020 contract, annotated with
    /// the cluster name), or `link`, what `linkerd multicluster link-gen` prints: a
    /// credentials Secret, the credentials Secret of Linkerd's destination (in
    /// `--linkerd-namespace`) and a Linkerd `Link`.
    #[arg(long, env = "SERVICE_MIRROR_LINK_FORMAT", value_enum, default_value_t = LinkFormat::Secret)]
    pub format: LinkFormat,
    /// The gateway and selectors of a `Link` (`--format link`).
    #[command(flatten)]
    pub link_gen: LinkGenArgs,
    /// How the manifests are printed.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// What `link` prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LinkFormat {
    /// One link Secret with the cluster-name annotation.
    #[default]
    Secret,
    /// A credentials Secret, the destination's credentials Secret and a `Link`.
    Link,
}

fn parse_cluster_name(name: &str) -> Result<String, String> {
    validate_cluster_name(name).map_err(|e| e.to_string())?;
    Ok(name.to_string())
}

/// Base64 (standard alphabet, padded) of `bytes`, as Kubernetes writes `*-data` fields.
fn base64_encode(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes a base64 `*-data` field of a kubeconfig (whitespace ignored).
fn base64_decode(text: &str) -> anyhow::Result<Vec<u8>> {
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(compact)?)
}

/// The link Secret of remote cluster `cluster_name`, in `link_namespace`: type
/// `mirror.linkerd.io/remote-kubeconfig`, the cluster-name and cluster-domain
/// annotations, and under `kubeconfig` a kubeconfig whose only cluster, user and context
/// are named `cluster_name`: `server`, the CA `ca_pem` and the bearer `token`.
pub fn link_secret(
    cluster_name: &str,
    cluster_domain: &str,
    link_namespace: &str,
    server: &str,
    ca_pem: &[u8],
    token: &str,
) -> anyhow::Result<Secret> {
    check_link_names(cluster_name, cluster_domain, link_namespace)?;
    let kubeconfig = kubeconfig_yaml(cluster_name, server, ca_pem, token)?;
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(link_secret_name(cluster_name)),
            namespace: Some(link_namespace.to_string()),
            annotations: Some(BTreeMap::from([
                (
                    LINK_CLUSTER_NAME_ANNOTATION.to_string(),
                    cluster_name.to_string(),
                ),
                (
                    LINK_CLUSTER_DOMAIN_ANNOTATION.to_string(),
                    cluster_domain.to_string(),
                ),
            ])),
            ..Default::default()
        },
        type_: Some(LINK_SECRET_TYPE.to_string()),
        data: Some(BTreeMap::from([(
            LINK_KUBECONFIG_KEY.to_string(),
            ByteString(kubeconfig.into_bytes()),
        )])),
        ..Default::default()
    })
}

fn check_link_names(
    cluster_name: &str,
    cluster_domain: &str,
    link_namespace: &str,
) -> anyhow::Result<()> {
    validate_cluster_name(cluster_name)
        .with_context(|| format!("invalid cluster name {cluster_name:?}"))?;
    anyhow::ensure!(
        !cluster_domain.is_empty() && !cluster_domain.contains(char::is_whitespace),
        "invalid cluster domain {cluster_domain:?}"
    );
    anyhow::ensure!(
        !link_namespace.is_empty(),
        "the link namespace must not be empty"
    );
    Ok(())
}

/// A kubeconfig whose only cluster, user and context are named `cluster_name`:
/// `server`, the CA `ca_pem` and the bearer `token`.
pub fn kubeconfig_yaml(
    cluster_name: &str,
    server: &str,
    ca_pem: &[u8],
    token: &str,
) -> anyhow::Result<String> {
    anyhow::ensure!(
        server.starts_with("https://") || server.starts_with("http://"),
        "API server address {server:?} is not a URL: it must start with https://"
    );
    anyhow::ensure!(
        String::from_utf8_lossy(ca_pem).contains("-----BEGIN CERTIFICATE-----"),
        "the CA of the remote cluster is not a PEM certificate"
    );
    let token = token.trim();
    anyhow::ensure!(!token.is_empty(), "the ServiceAccount token is empty");
    anyhow::ensure!(
        !token.contains(char::is_whitespace),
        "the ServiceAccount token holds whitespace: it is not a bearer token"
    );

    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": cluster_name,
            "cluster": {
                "server": server,
                "certificate-authority-data": base64_encode(ca_pem),
            },
        }],
        "users": [{
            "name": cluster_name,
            "user": { "token": token },
        }],
        "contexts": [{
            "name": cluster_name,
            "context": { "cluster": cluster_name, "user": cluster_name },
        }],
        "current-context": cluster_name,
        "preferences": {},
    });
    serde_saphyr::to_string(&kubeconfig).context("rendering the kubeconfig")
}

/// Server and CA of one context of a kubeconfig file.
#[derive(Debug, Default)]
struct KubeconfigCluster {
    server: Option<String>,
    ca_pem: Option<Vec<u8>>,
}

/// Reads the cluster of `context` (default: the current context) from `path` (default:
/// `$KUBECONFIG` or `~/.kube/config`).
fn kubeconfig_cluster(
    path: Option<&PathBuf>,
    context: Option<&str>,
) -> anyhow::Result<KubeconfigCluster> {
    let (kc, source) = match path {
        Some(p) => (
            kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("reading kubeconfig {}", p.display()))?,
            p.display().to_string(),
        ),
        None => (
            kube::config::Kubeconfig::read()
                .context("reading $KUBECONFIG or ~/.kube/config (pass --kubeconfig, or give both --api-server-address and a token Secret with ca.crt)")?,
            "$KUBECONFIG or ~/.kube/config".to_string(),
        ),
    };
    let context_name = match context {
        Some(c) => c.to_string(),
        None => kc.current_context.clone().with_context(|| {
            format!("kubeconfig {source} has no current-context: pass --context")
        })?,
    };
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .with_context(|| format!("kubeconfig {source} has no context {context_name:?}"))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.as_ref())
        .with_context(|| {
            format!(
                "kubeconfig {source} has no cluster {:?} (used by context {context_name:?})",
                ctx.cluster
            )
        })?;
    let ca_pem = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => Some(base64_decode(data).with_context(|| {
            format!(
                "certificate-authority-data of cluster {:?} in {source} is not base64",
                ctx.cluster
            )
        })?),
        (None, Some(file)) => Some(
            std::fs::read(file)
                .with_context(|| format!("reading certificate-authority file {file}"))?,
        ),
        (None, None) => None,
    };
    Ok(KubeconfigCluster {
        server: cluster.server.clone(),
        ca_pem,
    })
}

/// The bearer token and CA (when present) of the token Secret `namespace/name`.
struct TokenSecret {
    token: String,
    ca_pem: Option<Vec<u8>>,
}

async fn read_token_secret(
    client: kube::Client,
    namespace: &str,
    name: &str,
    service_account: &str,
) -> anyhow::Result<TokenSecret> {
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    let secret = match secrets.get_opt(name).await {
        Ok(Some(s)) => s,
        Ok(None) => bail!(
            "ServiceAccount token Secret {namespace}/{name} not found: apply `service-mirror allow --namespace {namespace} --service-account-name {service_account}` on the remote cluster first"
        ),
        Err(kube::Error::Api(status)) if status.code == 403 => bail!(
            "not allowed to read Secret {namespace}/{name} on the remote cluster: run `link` with credentials that may read Secrets there (e.g. the cluster admin's): {}",
            status.message
        ),
        Err(e) => {
            return Err(e).with_context(|| {
                format!("reading Secret {namespace}/{name} on the remote cluster")
            });
        }
    };
    let data = secret.data.unwrap_or_default();
    let token = match data.get("token").map(|t| t.0.as_slice()) {
        Some(t) if !t.iter().all(u8::is_ascii_whitespace) => t,
        _ => bail!(
            "Secret {namespace}/{name} has no token yet: the token controller fills it; wait a few seconds and retry, or, if it stays empty (no token controller), create a token with `kubectl -n {namespace} create token {service_account} --duration 8760h` and store it under data.token of that Secret"
        ),
    };
    let token = std::str::from_utf8(token)
        .map_err(|_| anyhow::anyhow!("the token in Secret {namespace}/{name} is not text"))?
        .trim()
        .to_string();
    let ca_pem = data
        .get("ca.crt")
        .map(|c| c.0.clone())
        .filter(|c| !c.is_empty());
    Ok(TokenSecret { token, ca_pem })
}

/// Server, CA and token of the remote, read from the token Secret and the kubeconfig.
struct Credentials {
    server: String,
    ca_pem: Vec<u8>,
    token: String,
}

/// Reads the remote token Secret and the kubeconfig's server and CA.
async fn credentials(args: &LinkArgs, client: kube::Client) -> anyhow::Result<Credentials> {
    check_names(&args.namespace, &args.service_account_name)?;
    let context = args.kube.context.clone();
    let secret_name = token_secret_name(&args.service_account_name);
    let token = read_token_secret(
        client,
        &args.namespace,
        &secret_name,
        &args.service_account_name,
    )
    .await?;

    let needs_kubeconfig = args.api_server_address.is_none() || token.ca_pem.is_none();
    let from_kubeconfig = if needs_kubeconfig {
        kubeconfig_cluster(args.kube.kubeconfig.as_ref(), context.as_deref())?
    } else {
        KubeconfigCluster::default()
    };
    let server = match (&args.api_server_address, from_kubeconfig.server) {
        (Some(s), _) => s.clone(),
        (None, Some(s)) => s,
        (None, None) => {
            bail!("the kubeconfig context has no server address: pass --api-server-address")
        }
    };
    let ca_pem = match (token.ca_pem, from_kubeconfig.ca_pem) {
        (Some(ca), _) | (None, Some(ca)) => ca,
        (None, None) => bail!(
            "no CA for the remote cluster: Secret {}/{secret_name} has no ca.crt and the kubeconfig cluster has no certificate-authority(-data)",
            args.namespace
        ),
    };
    Ok(Credentials {
        server,
        ca_pem,
        token: token.token,
    })
}

/// Reads what `link` needs on the remote and builds the manifests to print: the link
/// Secret, or (as `link-gen`) the credentials Secret, the destination credentials
/// Secret and the `Link` (and notes and warnings for stderr).
pub async fn build(args: &LinkArgs) -> anyhow::Result<(Vec<serde_json::Value>, Vec<String>)> {
    let client = args
        .kube
        .client()
        .await
        .context("connecting to the remote cluster")?;
    let creds = credentials(args, client.clone()).await?;
    let (c, ns) = (&args.cluster_name, &args.link_namespace);
    if args.format == LinkFormat::Secret {
        let domain = args
            .cluster_domain
            .as_deref()
            .unwrap_or(DEFAULT_CLUSTER_DOMAIN);
        let secret = link_secret(c, domain, ns, &creds.server, &creds.ca_pem, &creds.token)?;
        return Ok((vec![serde_json::to_value(&secret)?], Vec::new()));
    }
    let lg = &args.link_gen;
    anyhow::ensure!(
        service_mirror_core::naming::is_dns1123_label(&lg.linkerd_namespace),
        "invalid --linkerd-namespace {:?}: not a namespace name",
        lg.linkerd_namespace
    );
    // As link-gen: read with the CLI's own credentials (the mirror's ServiceAccount
    // may read Services only), and only when a flag leaves a domain to learn.
    let config = match (&lg.trust_domain, &args.cluster_domain) {
        (Some(_), Some(_)) => None,
        _ => read_linkerd_config(client.clone(), &lg.linkerd_namespace).await?,
    };
    let domains = resolve_domains(
        lg.trust_domain.as_deref(),
        args.cluster_domain.as_deref(),
        config.as_ref(),
        &lg.linkerd_namespace,
    );
    check_link_names(c, &domains.cluster_domain, ns)?;
    anyhow::ensure!(
        service_mirror_core::naming::is_dns1123_subdomain(&domains.trust_domain),
        "invalid trust domain {:?}",
        domains.trust_domain
    );
    let kubeconfig = kubeconfig_yaml(c, &creds.server, &creds.ca_pem, &creds.token)?;
    let gateway = match lg.gateway {
        true => read_gateway(client, lg).await?,
        false => None,
    };
    let (link, warnings) = link_resource(c, &domains.cluster_domain, ns, lg, gateway.as_ref())?;
    let mut notes = domains.notes.clone();
    notes.extend(warnings);
    let mut docs = vec![serde_json::to_value(credentials_secret(
        c,
        ns,
        kubeconfig.clone(),
    ))?];
    if lg.destination_credentials {
        let destination =
            destination_credentials_secret(c, &lg.linkerd_namespace, kubeconfig, &domains);
        if lg.linkerd_namespace == *ns {
            // One Secret can be both (same name, type and data): the destination's,
            // whose label and annotations the controller ignores.
            notes.push(format!(
                "--link-namespace and --linkerd-namespace are both {ns}: one credentials Secret serves the Link and Linkerd's destination"
            ));
            docs[0] = serde_json::to_value(destination)?;
        } else {
            docs.push(serde_json::to_value(destination)?);
        }
    }
    docs.push(serde_json::to_value(&link)?);
    Ok((docs, notes))
}

/// What the remote's `linkerd-config` in `namespace` says; `None` without one (no
/// Linkerd there: the flags and defaults then).
async fn read_linkerd_config(
    client: kube::Client,
    namespace: &str,
) -> anyhow::Result<Option<LinkerdConfig>> {
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    match api.get_opt(LINKERD_CONFIG_NAME).await {
        Ok(Some(cm)) => parse_linkerd_config(&cm).map(Some),
        Ok(None) => Ok(None),
        Err(kube::Error::Api(status)) if status.code == 403 => bail!(
            "not allowed to read ConfigMap {namespace}/{LINKERD_CONFIG_NAME} on the remote cluster (it gives the trust and cluster domains): run `link` with credentials that may read it, or pass both --trust-domain and --cluster-domain: {}",
            status.message
        ),
        Err(e) => Err(e).with_context(|| {
            format!("reading ConfigMap {namespace}/{LINKERD_CONFIG_NAME} on the remote cluster")
        }),
    }
}

/// The remote gateway Service `--gateway-namespace/--gateway-name`; `None` when it does
/// not exist and `--gateway-addresses` and `--gateway-port` say where the gateway is.
async fn read_gateway(
    client: kube::Client,
    args: &LinkGenArgs,
) -> anyhow::Result<Option<k8s_openapi::api::core::v1::Service>> {
    let (ns, name) = (&args.gateway_namespace, &args.gateway_name);
    let api: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client, ns);
    match api.get_opt(name).await {
        Ok(Some(s)) => Ok(Some(s)),
        Ok(None) if args.gateway_from_flags().is_some() => Ok(None),
        Ok(None) => bail!(
            "gateway Service {ns}/{name} not found on the remote cluster: pass --gateway-name/--gateway-namespace, --gateway-addresses and --gateway-port for a gateway that is no Service, or --gateway=false for a Link without gateway"
        ),
        Err(e) => Err(e)
            .with_context(|| format!("reading gateway Service {ns}/{name} on the remote cluster")),
    }
}

/// Prints the link Secret, or the credentials Secret and the `Link`.
pub async fn run(args: LinkArgs) -> anyhow::Result<()> {
    let (docs, warnings) = build(&args).await?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    args.output.print(&docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str =
        "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUTEST\n-----END CERTIFICATE-----\n";
    const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ0ZXN0In0.c2lnbmF0dXJl";

    fn kubeconfig_of(secret: &Secret) -> kube::config::Kubeconfig {
        let data = secret.data.as_ref().expect("data");
        assert_eq!(data.len(), 1, "only the kubeconfig key");
        let yaml = std::str::from_utf8(&data["kubeconfig"].0).expect("utf-8");
        kube::config::Kubeconfig::from_yaml(yaml).expect("a valid kubeconfig")
    }

    #[test]
    fn secret_follows_the_link_contract() {
        let s = link_secret(
            "east",
            "cluster.local",
            "linkerd-multicluster",
            "https://10.0.0.1:6443",
            CA.as_bytes(),
            TOKEN,
        )
        .unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("cluster-credentials-east"));
        assert_eq!(
            s.metadata.namespace.as_deref(),
            Some("linkerd-multicluster")
        );
        assert_eq!(
            s.type_.as_deref(),
            Some("mirror.linkerd.io/remote-kubeconfig")
        );
        let annotations = s.metadata.annotations.clone().unwrap();
        assert_eq!(annotations["mirror.linkerd.io/cluster-name"], "east");
        assert_eq!(
            annotations["mirror.linkerd.io/remote-cluster-domain"],
            "cluster.local"
        );
        assert_eq!(annotations.len(), 2);
    }

    #[test]
    fn kubeconfig_round_trips_with_server_ca_token_and_context() {
        let s = link_secret(
            "east",
            "east.example",
            "mc",
            "https://10.0.0.1:6443",
            CA.as_bytes(),
            TOKEN,
        )
        .unwrap();
        let kc = kubeconfig_of(&s);
        assert_eq!(kc.current_context.as_deref(), Some("east"));
        assert_eq!(kc.contexts.len(), 1);
        let ctx = kc.contexts[0].context.as_ref().unwrap();
        assert_eq!(kc.contexts[0].name, "east");
        assert_eq!(ctx.cluster, "east");
        assert_eq!(ctx.user.as_deref(), Some("east"));
        assert_eq!(kc.clusters.len(), 1);
        assert_eq!(kc.clusters[0].name, "east");
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443"));
        let ca = base64_decode(cluster.certificate_authority_data.as_deref().unwrap()).unwrap();
        assert_eq!(ca, CA.as_bytes());
        assert_eq!(kc.auth_infos.len(), 1);
        assert_eq!(kc.auth_infos[0].name, "east");
        // The token is a SecretString: serialising exposes it.
        let user = serde_json::to_value(kc.auth_infos[0].auth_info.as_ref().unwrap()).unwrap();
        assert_eq!(user["token"], TOKEN);
        assert!(user.get("client-certificate-data").is_none());
    }

    #[tokio::test]
    async fn kubeconfig_in_the_secret_makes_a_client_config() {
        let s = link_secret(
            "east",
            "cluster.local",
            "mc",
            "https://127.0.0.1:6443",
            CA.as_bytes(),
            TOKEN,
        )
        .unwrap();
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig_of(&s),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
    }

    #[test]
    fn base64_matches_kubernetes() {
        assert_eq!(base64_encode(b"hello"), "aGVsbG8=");
        assert_eq!(base64_decode("aGVs\nbG8=").unwrap(), b"hello");
        assert!(base64_decode("not base64!").is_err());
    }

    #[test]
    fn bad_inputs_are_refused_clearly() {
        let ok = |c, srv, ca: &str, t| link_secret(c, "cluster.local", "mc", srv, ca.as_bytes(), t);
        let err = ok("East", "https://x", CA, TOKEN).unwrap_err();
        assert!(
            format!("{err:#}").contains("invalid cluster name"),
            "{err:#}"
        );
        let err = ok("east", "10.0.0.1:6443", CA, TOKEN).unwrap_err();
        assert!(err.to_string().contains("is not a URL"), "{err}");
        let err = ok("east", "https://x", "garbage", TOKEN).unwrap_err();
        assert!(err.to_string().contains("not a PEM"), "{err}");
        let err = ok("east", "https://x", CA, "  ").unwrap_err();
        assert!(err.to_string().contains("token is empty"), "{err}");
        let err = ok("east", "https://x", CA, "tok1 tok2").unwrap_err();
        assert!(
            !err.to_string().contains("tok1"),
            "never echo a token: {err}"
        );
    }

    #[test]
    fn cluster_name_is_validated_by_the_parser() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: LinkArgs,
        }
        let err = Cli::try_parse_from(["link", "--cluster-name", "East_1"])
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("invalid character"), "{err}");
        assert!(
            Cli::try_parse_from(["link"]).is_err(),
            "cluster name is required"
        );
        let args = Cli::try_parse_from(["link", "--cluster-name", "east"])
            .unwrap()
            .args;
        assert_eq!(args.namespace, "linkerd-multicluster");
        assert_eq!(args.link_namespace, "linkerd-multicluster");
        assert_eq!(
            args.service_account_name,
            "linkerd-service-mirror-remote-access-default"
        );
        assert_eq!(
            args.cluster_domain, None,
            "cluster.local unless linkerd-config says"
        );
        assert_eq!(args.link_gen.linkerd_namespace, "linkerd");
        assert!(args.link_gen.destination_credentials);
    }

    #[test]
    fn kubeconfig_cluster_reads_server_and_ca_of_the_context() {
        let dir = std::env::temp_dir().join(format!("sm-link-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.pem"), CA).unwrap();
        let path = dir.join("config");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: a\nclusters:\n- name: ca\n  cluster:\n    server: https://a:1\n    certificate-authority-data: {}\n- name: cb\n  cluster:\n    server: https://b:2\n    certificate-authority: ca.pem\ncontexts:\n- name: a\n  context: {{cluster: ca, user: u}}\n- name: b\n  context: {{cluster: cb, user: u}}\nusers:\n- name: u\n  user: {{token: t}}\n",
                base64_encode(CA.as_bytes())
            ),
        )
        .unwrap();
        let a = kubeconfig_cluster(Some(&path), None).unwrap();
        assert_eq!(a.server.as_deref(), Some("https://a:1"));
        assert_eq!(a.ca_pem.as_deref(), Some(CA.as_bytes()));
        let b = kubeconfig_cluster(Some(&path), Some("b")).unwrap();
        assert_eq!(b.server.as_deref(), Some("https://b:2"));
        assert_eq!(b.ca_pem.as_deref(), Some(CA.as_bytes()));
        let err = kubeconfig_cluster(Some(&path), Some("nope")).unwrap_err();
        assert!(err.to_string().contains("has no context \"nope\""), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
