//! Reading a link Secret: what it says, or a clear reason why it cannot be used.
//!
//! A link Secret and the remote it names are untrusted: the only way to get a
//! [`LinkSpec`] is [`parse_link_secret`], which checks the kubeconfig, and
//! [`LinkSpec::checked_kubeconfig`] checks it again where the client is built.

use super::sanitize::sanitize_remote_text;
use k8s_openapi::api::core::v1::Secret;
use kube::config::Kubeconfig;
use service_mirror_core::labels::{
    LINK_CLUSTER_DOMAIN_ANNOTATION, LINK_CLUSTER_NAME_ANNOTATION, LINK_KUBECONFIG_KEY,
};
use service_mirror_core::{ExportRule, GatewaySpec, Link, ProbeSpec, validate_cluster_name};
use std::time::Duration;

/// Annotation on a link Secret listing the transport weakenings that link may use:
/// comma-separated values of [`Insecure::as_str`] (`skip-tls-verify`, `http`,
/// `proxy-url`). Absent or empty: none.
pub const ALLOW_INSECURE_ANNOTATION: &str = "mirror.linkerd.io/allow-insecure";

/// Largest kubeconfig a link accepts, in bytes. A real one (inline CA, token or client
/// certificate) is a few KiB; the cap bounds the parser's work on hostile input.
pub const MAX_KUBECONFIG_BYTES: usize = 256 * 1024;

/// A transport weakening a kubeconfig may ask for, refused unless the link Secret's
/// [`ALLOW_INSECURE_ANNOTATION`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Insecure {
    /// `insecure-skip-tls-verify: true`: any server certificate is accepted.
    SkipTlsVerify,
    /// An `http://` server: the credentials travel in clear text.
    Http,
    /// `proxy-url`: the traffic goes through a third party.
    ProxyUrl,
}

impl Insecure {
    const ALL: [Insecure; 3] = [Insecure::SkipTlsVerify, Insecure::Http, Insecure::ProxyUrl];

    /// Its value in [`ALLOW_INSECURE_ANNOTATION`].
    pub fn as_str(self) -> &'static str {
        match self {
            Insecure::SkipTlsVerify => "skip-tls-verify",
            Insecure::Http => "http",
            Insecure::ProxyUrl => "proxy-url",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Insecure::SkipTlsVerify => "insecure-skip-tls-verify",
            Insecure::Http => "an http:// server",
            Insecure::ProxyUrl => "proxy-url",
        }
    }
}

/// The weakenings one link may use (its [`ALLOW_INSECURE_ANNOTATION`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allowances {
    skip_tls_verify: bool,
    http: bool,
    proxy_url: bool,
}

impl Allowances {
    /// Reads the annotation's value; an unknown entry is an error, not ignored, so a
    /// typo never silently weakens or keeps refusing a link.
    pub fn parse(value: &str) -> Result<Self, LinkError> {
        let mut allow = Allowances::default();
        for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            match Insecure::ALL.iter().find(|i| i.as_str() == entry) {
                Some(i) => *allow.flag(*i) = true,
                None => {
                    return Err(LinkError::InvalidAllowInsecure(sanitize_remote_text(entry)));
                }
            }
        }
        Ok(allow)
    }

    /// Whether `what` is allowed.
    pub fn allows(&self, what: Insecure) -> bool {
        match what {
            Insecure::SkipTlsVerify => self.skip_tls_verify,
            Insecure::Http => self.http,
            Insecure::ProxyUrl => self.proxy_url,
        }
    }

    fn flag(&mut self, what: Insecure) -> &mut bool {
        match what {
            Insecure::SkipTlsVerify => &mut self.skip_tls_verify,
            Insecure::Http => &mut self.http,
            Insecure::ProxyUrl => &mut self.proxy_url,
        }
    }
}

/// A checked link: the remote cluster's name and domain, its kubeconfig and what it may
/// weaken. Built only by [`parse_link_secret`]: its fields are private.
///
/// ```compile_fail
/// use service_mirror_controller::links::LinkSpec;
/// let spec = LinkSpec {
///     link: service_mirror_core::Link::new("east", None),
///     kubeconfig: String::new(),
///     allow: Default::default(),
/// };
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LinkSpec {
    link: Link,
    /// A credential: never logged.
    kubeconfig: String,
    allow: Allowances,
    source: LinkSource,
}

/// Where a link comes from, with what a `Link` resource says beyond credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum LinkSource {
    /// A link Secret (the 2020 contract): export by gateway annotations, gateways are
    /// remote Services.
    #[default]
    Secret,
    /// A Linkerd `Link` resource.
    Resource(Box<ResourceLink>),
}

/// What a `Link` resource says besides its cluster name, domain and credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceLink {
    /// The Link's name (in the controller's namespace).
    pub name: String,
    /// `clusterCredentialsSecret`: the Secret holding the kubeconfig.
    pub credentials_secret: String,
    /// Its selectors, as the export rule (always [`ExportRule::Selectors`]).
    pub export: ExportRule,
    /// `gatewayAddress` / `gatewayPort` / `gatewayIdentity`: static addresses,
    /// hostnames to resolve, the port of every endpoint, the identity. `None`: the
    /// Link has no gateway (remote discovery only); selected Services are mirrored
    /// without endpoints.
    pub gateway: Option<GatewaySpec>,
    /// `probeSpec`: where and how often the gateway is probed.
    pub probe: ProbeSpec,
    /// `probeSpec.timeout`.
    pub probe_timeout: Duration,
    /// `probeSpec.failureThreshold`.
    pub probe_failure_threshold: u32,
    /// `federatedServiceSelector`: remote members of federated Services.
    pub federated: service_mirror_core::Selector,
}

impl LinkSpec {
    /// Name and domain.
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Where the link comes from.
    pub fn source(&self) -> &LinkSource {
        &self.source
    }

    /// A spec from parts that were checked: the kubeconfig went through
    /// [`check_kubeconfig`] with `allow` (for the Link parse, in this module's parent).
    pub(super) fn from_checked(
        link: Link,
        kubeconfig: String,
        allow: Allowances,
        source: LinkSource,
    ) -> Self {
        LinkSpec {
            link,
            kubeconfig,
            allow,
            source,
        }
    }

    /// Whether `other` reaches the remote the same way (the same kubeconfig and
    /// allowances): a change of anything else (domain, selectors, gateway, probes) needs
    /// no new credentials proven before the running link stops.
    pub fn same_credentials(&self, other: &LinkSpec) -> bool {
        self.kubeconfig == other.kubeconfig && self.allow == other.allow
    }

    /// Whether `other` is this Link with another gateway (`gatewayAddress`,
    /// `gatewayPort`, `gatewayIdentity`) and nothing else changed, a gateway on both
    /// sides: the running link moves its gateway in place, with no restart and no
    /// relist (a gateway's load balancer got a new address).
    pub fn only_gateway_moved(&self, other: &LinkSpec) -> bool {
        let (LinkSource::Resource(a), LinkSource::Resource(b)) = (&self.source, &other.source)
        else {
            return false;
        };
        let (Some(_), Some(_)) = (&a.gateway, &b.gateway) else {
            return false;
        };
        let rest_same = ResourceLink {
            gateway: b.gateway.clone(),
            ..(**a).clone()
        } == **b;
        a.gateway != b.gateway
            && rest_same
            && self.link == other.link
            && self.same_credentials(other)
    }

    /// The weakenings the link Secret allows.
    pub fn allowances(&self) -> Allowances {
        self.allow
    }

    /// The kubeconfig, parsed and checked again (defence in depth: whoever builds a
    /// client from it goes through the same check as the parse).
    pub(crate) fn checked_kubeconfig(&self) -> Result<Kubeconfig, LinkError> {
        let kc = parse_kubeconfig(&self.kubeconfig)?;
        check_kubeconfig(&kc, self.allow)?;
        Ok(kc)
    }
}

#[cfg(test)]
impl LinkSpec {
    /// A spec that skipped the parse and its check: only for proving that the code
    /// building the client checks again.
    pub(crate) fn unchecked_for_tests(link: Link, kubeconfig: &str) -> Self {
        LinkSpec {
            link,
            kubeconfig: kubeconfig.into(),
            allow: Allowances::default(),
            source: LinkSource::Secret,
        }
    }
}

impl std::fmt::Debug for LinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkSpec")
            .field("link", &self.link)
            .field("kubeconfig", &"<redacted>")
            .field("allow", &self.allow)
            .field("source", &self.source)
            .finish()
    }
}

/// Why a link Secret or a `Link` resource cannot be used. Messages never contain credential material, and
/// text from the remote is sanitized and bounded ([`sanitize_remote_text`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// No `kubeconfig` key.
    #[error("the Secret has no `kubeconfig` data key")]
    MissingKubeconfig,
    /// The kubeconfig is larger than [`MAX_KUBECONFIG_BYTES`].
    #[error("the kubeconfig has {0} bytes, more than the {MAX_KUBECONFIG_BYTES} a link accepts")]
    KubeconfigTooLarge(usize),
    /// The kubeconfig is not a valid kubeconfig document.
    #[error("the kubeconfig is invalid: {0}")]
    InvalidKubeconfig(String),
    /// No current context to use.
    #[error("the kubeconfig has no current-context")]
    NoCurrentContext,
    /// The kubeconfig would run commands or read local files.
    #[error("the kubeconfig uses {0}, which a link may not (only inline certificates and tokens)")]
    UnsafeKubeconfig(String),
    /// The kubeconfig weakens the transport and the Secret does not allow it.
    #[error(
        "the kubeconfig uses {}, refused unless the link Secret's (or Link's) {ALLOW_INSECURE_ANNOTATION} annotation lists {:?}",
        .0.what(),
        .0.as_str()
    )]
    InsecureKubeconfig(Insecure),
    /// The allow-insecure annotation has an entry that is not one of the known values.
    #[error(
        "annotation {ALLOW_INSECURE_ANNOTATION}: unknown value {0:?} (known: skip-tls-verify, http, proxy-url)"
    )]
    InvalidAllowInsecure(String),
    /// `proxy-url` is allowed but this build's client cannot use a proxy.
    #[error(
        "the kubeconfig uses proxy-url (allowed by {ALLOW_INSECURE_ANNOTATION}), but this build has no proxy support: remove proxy-url"
    )]
    ProxyNotSupported,
    /// No cluster-name annotation.
    #[error("the Secret lacks the mirror.linkerd.io/cluster-name annotation")]
    MissingClusterName,
    /// The cluster name is not a valid DNS-1123 label of at most 48 characters.
    #[error("invalid cluster name {0:?}: {1}")]
    InvalidClusterName(String, String),
    /// Another Secret links the same cluster name.
    #[error("cluster name {0:?} is already linked by {1}")]
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
    #[error("the remote cluster refused the credentials (403 Forbidden): {0}")]
    Forbidden(String),
    /// The new credentials did not sync in time during a rotation.
    #[error("the new credentials did not sync within {0} s; the old ones stay in use")]
    RotationTimeout(u64),
    // What a `Link` resource can get wrong (`links/link.rs`).
    /// A Link without `targetClusterName`.
    #[error("the Link has no spec.targetClusterName")]
    MissingTargetClusterName,
    /// `targetClusterDomain` is not a DNS-1123 subdomain.
    #[error("spec.targetClusterDomain {0:?} is not a DNS-1123 subdomain")]
    InvalidClusterDomain(String),
    /// A Link without `clusterCredentialsSecret`.
    #[error("the Link has no spec.clusterCredentialsSecret")]
    MissingCredentialsSecretName,
    /// The Secret `clusterCredentialsSecret` names does not exist (in the Link's namespace).
    #[error(
        "the credentials Secret {0:?} (a Link's spec.clusterCredentialsSecret, a ClusterProfile's access provider) does not exist in the controller's namespace"
    )]
    MissingCredentials(String),
    /// The credentials Secret is not of type `mirror.linkerd.io/remote-kubeconfig`.
    #[error(
        "the credentials Secret {secret:?} has type {type_:?}, not mirror.linkerd.io/remote-kubeconfig"
    )]
    InvalidCredentialsType {
        /// The Secret's name.
        secret: String,
        /// Its type.
        type_: String,
    },
    /// An entry of `gatewayAddress` is neither an IP address an Endpoints may hold nor
    /// a DNS-1123 hostname.
    #[error("spec.gatewayAddress entry {entry:?}: {why}")]
    InvalidGatewayAddress {
        /// The refused entry.
        entry: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A gateway address without `gatewayPort`.
    #[error("spec.gatewayAddress is set but spec.gatewayPort is not")]
    MissingGatewayPort,
    /// `gatewayPort` is not a decimal port from 1 to 65535.
    #[error("spec.gatewayPort {0:?} is not a port number from 1 to 65535")]
    InvalidGatewayPort(String),
    /// `gatewayIdentity` is not a DNS name.
    #[error("spec.gatewayIdentity {0:?} is not a DNS-1123 subdomain (a TLS identity)")]
    InvalidGatewayIdentity(String),
    /// A `probeSpec` field cannot be used.
    #[error("spec.probeSpec.{field} {value:?}: {why}")]
    InvalidProbeSpec {
        /// `path`, `port`, `period`, `timeout` or `failureThreshold`.
        field: &'static str,
        /// The refused value.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// A label selector is invalid.
    #[error("spec.{which}: {message}")]
    InvalidSelector {
        /// `selector`, `remoteDiscoverySelector` or `federatedServiceSelector`.
        which: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// An exclusion pattern is invalid.
    #[error("spec.{which}: {message}")]
    InvalidExclusion {
        /// `excludedLabels` or `excludedAnnotations`.
        which: &'static str,
        /// What is wrong with it.
        message: String,
    },
    // What a `ClusterProfile` can get wrong (`links/clusterprofile.rs`).
    /// A ClusterProfile without an access provider this controller can use: the names
    /// it has (sanitized, bounded), or that it has none.
    #[error(
        "no access provider service-mirror can use (it reads `kubeconfig-secretreader`: a kubeconfig Secret in the controller's namespace named by its client.authentication.k8s.io/exec extension); the ClusterProfile has {0}"
    )]
    UnsupportedAccessProvider(String),
    /// The `kubeconfig-secretreader` access provider cannot be used as it is.
    #[error("access provider kubeconfig-secretreader: {0}")]
    InvalidAccessProvider(String),
}

impl LinkError {
    /// The Kubernetes Event reason (also the metric label): a fixed, bounded set.
    pub fn reason(&self) -> &'static str {
        match self {
            LinkError::MissingKubeconfig => "MissingKubeconfig",
            LinkError::KubeconfigTooLarge(_) => "KubeconfigTooLarge",
            LinkError::InvalidKubeconfig(_) => "InvalidKubeconfig",
            LinkError::NoCurrentContext => "NoCurrentContext",
            LinkError::UnsafeKubeconfig(_) => "UnsafeKubeconfig",
            LinkError::InsecureKubeconfig(_) => "InsecureKubeconfig",
            LinkError::InvalidAllowInsecure(_) => "InvalidAllowInsecure",
            LinkError::ProxyNotSupported => "ProxyNotSupported",
            LinkError::MissingClusterName => "MissingClusterName",
            LinkError::InvalidClusterName(..) => "InvalidClusterName",
            LinkError::DuplicateClusterName(..) => "DuplicateClusterName",
            LinkError::Unreachable(_) => "RemoteUnreachable",
            LinkError::Tls(_) => "RemoteTLSError",
            LinkError::Unauthorized => "RemoteUnauthorized",
            LinkError::Forbidden(_) => "RemoteForbidden",
            LinkError::RotationTimeout(_) => "RotationTimeout",
            LinkError::MissingTargetClusterName => "MissingTargetClusterName",
            LinkError::InvalidClusterDomain(_) => "InvalidClusterDomain",
            LinkError::MissingCredentialsSecretName => "MissingCredentialsSecretName",
            LinkError::MissingCredentials(_) => "MissingCredentials",
            LinkError::InvalidCredentialsType { .. } => "InvalidCredentialsType",
            LinkError::InvalidGatewayAddress { .. } => "InvalidGatewayAddress",
            LinkError::MissingGatewayPort => "MissingGatewayPort",
            LinkError::InvalidGatewayPort(_) => "InvalidGatewayPort",
            LinkError::InvalidGatewayIdentity(_) => "InvalidGatewayIdentity",
            LinkError::InvalidProbeSpec { .. } => "InvalidProbeSpec",
            LinkError::InvalidSelector { .. } => "InvalidSelector",
            LinkError::InvalidExclusion { .. } => "InvalidExclusion",
            LinkError::UnsupportedAccessProvider(_) => "UnsupportedAccessProvider",
            LinkError::InvalidAccessProvider(_) => "InvalidAccessProvider",
        }
    }

    /// Whether retrying without a change to the Secret may help (the remote may come
    /// back, or its RBAC may be fixed). A refused Secret waits for its next change.
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
    let first = out.lines().next().unwrap_or_default();
    sanitize_remote_text(first)
}

/// Reads a link Secret: the only way to make a [`LinkSpec`].
pub fn parse_link_secret(secret: &Secret) -> Result<LinkSpec, LinkError> {
    let annotations = secret.metadata.annotations.clone().unwrap_or_default();
    let name = annotations
        .get(LINK_CLUSTER_NAME_ANNOTATION)
        .filter(|n| !n.is_empty())
        .ok_or(LinkError::MissingClusterName)?;
    validate_cluster_name(name)
        .map_err(|e| LinkError::InvalidClusterName(sanitize_remote_text(name), e.to_string()))?;
    let domain = annotations
        .get(LINK_CLUSTER_DOMAIN_ANNOTATION)
        .map(String::as_str);
    let allow = match annotations.get(ALLOW_INSECURE_ANNOTATION) {
        Some(v) => Allowances::parse(v)?,
        None => Allowances::default(),
    };
    let text = checked_kubeconfig_text(secret, allow)?;
    let mut link = Link::new(name.clone(), domain);
    if let Some(ns) = &secret.metadata.namespace {
        link = link.with_controller_namespace(ns);
    }
    Ok(LinkSpec {
        link,
        kubeconfig: text,
        allow,
        source: LinkSource::Secret,
    })
}

/// The kubeconfig of a Secret (a link Secret or a Link's credentials Secret), parsed
/// and checked under `allow`: size, UTF-8, syntax, no exec or files, no weakening
/// `allow` does not list.
pub(super) fn checked_kubeconfig_text(
    secret: &Secret,
    allow: Allowances,
) -> Result<String, LinkError> {
    let raw = secret
        .data
        .as_ref()
        .and_then(|d| d.get(LINK_KUBECONFIG_KEY))
        .ok_or(LinkError::MissingKubeconfig)?;
    if raw.0.len() > MAX_KUBECONFIG_BYTES {
        return Err(LinkError::KubeconfigTooLarge(raw.0.len()));
    }
    let text = String::from_utf8(raw.0.clone())
        .map_err(|_| LinkError::InvalidKubeconfig("not UTF-8 text".into()))?;
    let kc = parse_kubeconfig(&text)?;
    check_kubeconfig(&kc, allow)?;
    Ok(text)
}

/// Parses as `Kubeconfig::from_yaml` does (documents merged), within a budget far
/// below the parser's defaults: a real kubeconfig has a few hundred events and no
/// aliases, and an alias bomb must fail in milliseconds, not after a million copies.
pub(super) fn parse_kubeconfig(text: &str) -> Result<Kubeconfig, LinkError> {
    if text.len() > MAX_KUBECONFIG_BYTES {
        return Err(LinkError::KubeconfigTooLarge(text.len()));
    }
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_events: 50_000,
            max_aliases: 100,
            max_anchors: 100,
            max_documents: 8,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: 1_000,
            max_replay_stack_depth: 8,
        },
        // No source snippet in the error: it would quote the kubeconfig (tokens, keys).
        with_snippet: false,
    };
    let invalid = |e: &dyn std::fmt::Display| LinkError::InvalidKubeconfig(redact(&e.to_string()));
    let docs: Vec<Kubeconfig> =
        serde_saphyr::from_multiple_with_options(text, options).map_err(|e| invalid(&e))?;
    docs.into_iter()
        .try_fold(Kubeconfig::default(), Kubeconfig::merge)
        .map_err(|e| invalid(&e))
}

/// A link kubeconfig must be self-contained (no exec plugins, auth providers or files:
/// those would run commands or read this pod's files, such as its own token), its
/// current context must name a defined cluster and user, and it may weaken the
/// transport (skip TLS verification, plain http, a proxy) only as far as `allow` says.
pub fn check_kubeconfig(kc: &Kubeconfig, allow: Allowances) -> Result<(), LinkError> {
    let current = kc
        .current_context
        .as_deref()
        .filter(|c| !c.is_empty())
        .ok_or(LinkError::NoCurrentContext)?;
    let context = kc
        .contexts
        .iter()
        .find(|c| c.name == current)
        .ok_or_else(|| undefined("current-context", current))?
        .context
        .as_ref()
        .ok_or_else(|| undefined("current-context", current))?;
    if !kc.clusters.iter().any(|c| c.name == context.cluster) {
        return Err(undefined("the current context's cluster", &context.cluster));
    }
    // No user means no credential: kube would then fall back to nothing local, but a
    // named user must exist, or the link would run without the credential it meant.
    if let Some(user) = context.user.as_deref().filter(|u| !u.is_empty())
        && !kc.auth_infos.iter().any(|a| a.name == user)
    {
        return Err(undefined("the current context's user", user));
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
    // Every cluster, not only the current one: an unused entry is no reason for an
    // exception, and kube must never be handed one.
    for c in kc.clusters.iter().filter_map(|c| c.cluster.as_ref()) {
        let server = c.server.as_deref().unwrap_or_default();
        let scheme = server
            .split_once("://")
            .map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("https") => {}
            Some("http") => refuse_unless(allow, Insecure::Http)?,
            _ => {
                return Err(LinkError::InvalidKubeconfig(
                    "a cluster's server is not an https:// URL".into(),
                ));
            }
        }
        if c.insecure_skip_tls_verify == Some(true) {
            refuse_unless(allow, Insecure::SkipTlsVerify)?;
        }
        if c.proxy_url.as_deref().is_some_and(|p| !p.is_empty()) {
            refuse_unless(allow, Insecure::ProxyUrl)?;
            // kube is built without its proxy features: it would fail to connect, and
            // that must not look like an unreachable remote retried forever.
            return Err(LinkError::ProxyNotSupported);
        }
    }
    Ok(())
}

fn refuse_unless(allow: Allowances, what: Insecure) -> Result<(), LinkError> {
    if allow.allows(what) {
        Ok(())
    } else {
        Err(LinkError::InsecureKubeconfig(what))
    }
}

fn undefined(what: &str, name: &str) -> LinkError {
    LinkError::InvalidKubeconfig(format!(
        "{what} {:?} is not defined",
        sanitize_remote_text(name)
    ))
}

/// A valid kubeconfig (cluster, user with a token, current context `east`) for the
/// parsers' unit tests of every link source.
#[cfg(test)]
pub(crate) const TEST_KUBECONFIG: &str = "apiVersion: v1
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;

    use super::TEST_KUBECONFIG as KUBECONFIG;

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
        assert_eq!(spec.link(), &Link::new("east", None));
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
        assert_eq!(spec.link().cluster_domain, "east.local");
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

    const ALLOW: &str = "mirror.linkerd.io/allow-insecure";

    /// A billion-laughs document: 9^9 strings if aliases were expanded without bound.
    fn alias_bomb() -> String {
        let mut doc = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for i in 1..10 {
            let p = format!("*a{}", i - 1);
            doc.push_str(&format!("a{i}: &a{i} [{}]\n", vec![p; 9].join(", ")));
        }
        doc + KUBECONFIG
    }

    #[test]
    fn unsafe_or_insecure_kubeconfigs_are_refused_unless_allowed_and_never_run_anything() {
        let user = |with: &str| KUBECONFIG.replace("    token: s3cr3t-token\n", with);
        let cluster = |with: &str| {
            KUBECONFIG.replace(
                "    certificate-authority-data: Zm9v\n",
                &format!("    certificate-authority-data: Zm9v\n{with}"),
            )
        };
        let skip_tls = KUBECONFIG.replace(
            "    certificate-authority-data: Zm9v\n",
            "    insecure-skip-tls-verify: true\n",
        );
        let http = KUBECONFIG.replace("https://", "http://");
        let proxy = cluster("    proxy-url: http://127.0.0.1:3128\n");
        let mut not_utf8 = KUBECONFIG.as_bytes().to_vec();
        not_utf8.extend([0xff, 0xfe, b'\n']);
        let mut huge = KUBECONFIG.to_string();
        huge.push_str(&format!("# {}\n", "x".repeat(1 << 20)));
        let cases: Vec<(&str, Vec<u8>, Option<&str>, &str)> = vec![
            ("good", KUBECONFIG.into(), None, "ok"),
            (
                "exec",
                user("    exec: {command: touch, args: [/tmp/never-made], apiVersion: client.authentication.k8s.io/v1}\n").into(),
                Some("skip-tls-verify,http,proxy-url"),
                "UnsafeKubeconfig",
            ),
            (
                "auth-provider",
                user("    auth-provider: {name: gcp, config: {cmd-path: /bin/sh}}\n").into(),
                None,
                "UnsafeKubeconfig",
            ),
            (
                "client-certificate file",
                user("    client-certificate: /etc/passwd\n").into(),
                None,
                "UnsafeKubeconfig",
            ),
            (
                "client-key file",
                user("    client-key: /etc/passwd\n").into(),
                None,
                "UnsafeKubeconfig",
            ),
            (
                "certificate-authority file",
                cluster("    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt\n").into(),
                None,
                "UnsafeKubeconfig",
            ),
            (
                "context names a missing user",
                KUBECONFIG.replace("user: east}", "user: nobody}").into(),
                None,
                "InvalidKubeconfig",
            ),
            (
                "context names a missing cluster",
                KUBECONFIG.replace("{cluster: east,", "{cluster: nowhere,").into(),
                None,
                "InvalidKubeconfig",
            ),
            ("not UTF-8", not_utf8, None, "InvalidKubeconfig"),
            ("1 MiB", huge.into(), Some("http"), "KubeconfigTooLarge"),
            (
                "not an https server",
                KUBECONFIG.replace("https://", "file://").into(),
                Some("http"),
                "InvalidKubeconfig",
            ),
            ("skip-tls-verify", skip_tls.clone().into(), None, "InsecureKubeconfig"),
            (
                "skip-tls-verify, other allowed",
                skip_tls.clone().into(),
                Some("http,proxy-url"),
                "InsecureKubeconfig",
            ),
            ("skip-tls-verify allowed", skip_tls.into(), Some("skip-tls-verify"), "ok"),
            ("http", http.clone().into(), None, "InsecureKubeconfig"),
            ("http allowed", http.clone().into(), Some(" http , "), "ok"),
            ("proxy-url", proxy.clone().into(), Some("http"), "InsecureKubeconfig"),
            ("proxy-url allowed", proxy.into(), Some("proxy-url"), "ProxyNotSupported"),
            ("unknown allowance", http.clone().into(), Some("http,everything"), "InvalidAllowInsecure"),
            ("empty allowance", http.into(), Some(""), "InsecureKubeconfig"),
        ];
        for (case, kubeconfig, allow, want) in cases {
            let mut s = secret(&[NAME], None);
            if let Some(a) = allow {
                s.metadata
                    .annotations
                    .as_mut()
                    .unwrap()
                    .insert(ALLOW.into(), a.into());
            }
            s.data = Some([("kubeconfig".to_string(), ByteString(kubeconfig))].into());
            let got = match parse_link_secret(&s) {
                Ok(spec) => {
                    // What was accepted passes the check again where the client is built.
                    spec.checked_kubeconfig().unwrap();
                    "ok".to_string()
                }
                Err(e) => {
                    assert!(
                        !e.retryable(),
                        "{case}: a refusal waits for the Secret to change"
                    );
                    assert!(
                        !e.to_string().contains("s3cr3t"),
                        "{case}: no credential in {e}"
                    );
                    assert!(e.to_string().len() < 400, "{case}: bounded message");
                    e.reason().to_string()
                }
            };
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn a_yaml_alias_bomb_is_refused_in_bounded_time_and_memory() {
        // Peak resident memory of this process (Linux), in KiB.
        let peak = || {
            std::fs::read_to_string("/proc/self/status")
                .ok()?
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))?
                .trim()
                .trim_end_matches(" kB")
                .parse::<u64>()
                .ok()
        };
        let s = secret(&[NAME], Some(&alias_bomb()));
        let before = peak();
        let start = std::time::Instant::now();
        let got = parse_link_secret(&s).map(|_| ()).map_err(|e| e.reason());
        let took = start.elapsed();
        let grew = before.zip(peak()).map(|(b, a)| a - b);
        eprintln!("alias bomb: {got:?} in {took:?}, peak memory grew {grew:?} KiB");
        assert_eq!(got, Err("InvalidKubeconfig"));
        assert!(took < std::time::Duration::from_secs(1), "took {took:?}");
        // Other tests run alongside: a loose bound, far below an expansion's gigabytes.
        assert!(grew.unwrap_or(0) < 64 * 1024, "peak grew {grew:?} KiB");
    }

    #[test]
    fn redaction_drops_quoted_fragments() {
        assert_eq!(
            redact("invalid type: string \"abc\", expected x\nmore"),
            "invalid type: string \"…\", expected x"
        );
    }
}
