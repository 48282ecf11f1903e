//! `link --format link`: a Linkerd `Link` and its credentials Secret, as Linkerd's
//! `link-gen` prints them, with the gateway values read from the remote gateway Service
//! (or, for a gateway that is no Service, from `--gateway-addresses` and
//! `--gateway-port` alone). The third document, the destination's credentials Secret,
//! is in [`super::link_destination`].
//!
//! Pure: [`link_resource`] and [`credentials_secret`] build the objects from what
//! `link` read on the remote; `parse_link` accepts what they build (unit-tested).

use super::export::{DEFAULT_GATEWAY_NAME, DEFAULT_GATEWAY_NAMESPACE};
use super::link::link_secret_name;
use super::link_destination::DEFAULT_LINKERD_NAMESPACE;
use crate::links::{LinkProbeSpec, LinkResource, LinkResourceSpec, parse_go_duration};
use anyhow::{Context, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ObjectMeta;
use service_mirror_core::labels::{
    GATEWAY_IDENTITY_ANNOTATION, GATEWAY_PORT_NAME, LINK_KUBECONFIG_KEY, LINK_SECRET_TYPE,
    PROBE_PATH_ANNOTATION, PROBE_PERIOD_ANNOTATION, PROBE_PORT_NAME,
};
use service_mirror_core::probe::DEFAULT_PROBE_PATH;
use std::collections::BTreeMap;
use std::time::Duration;

/// Linkerd's default export selector.
pub const DEFAULT_SELECTOR: &str = "mirror.linkerd.io/exported=true";
/// Linkerd's default remote-discovery selector.
pub const DEFAULT_REMOTE_DISCOVERY_SELECTOR: &str = "mirror.linkerd.io/exported=remote-discovery";
/// Linkerd's default federated-service selector.
pub const DEFAULT_FEDERATED_SERVICE_SELECTOR: &str = "mirror.linkerd.io/federated=member";
/// Probe period when the gateway has no `probe-period` annotation (Linkerd's).
const DEFAULT_PROBE_PERIOD: &str = "3s";
/// Annotation `link-gen` puts on the Link (`linkerd/cli <version>` there).
pub const CREATED_BY_ANNOTATION: &str = "linkerd.io/created-by";

/// This CLI as it names itself in [`CREATED_BY_ANNOTATION`].
pub fn created_by() -> String {
    format!("service-mirror/cli {}", env!("CARGO_PKG_VERSION"))
}

/// The flags of `link` that only `--format link` reads.
#[derive(Debug, Clone, clap::Args)]
pub struct LinkGenArgs {
    /// With `--format link`: read the gateway from the remote (`--gateway=false`: a
    /// Link without gateway, for remote discovery only).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub gateway: bool,
    /// Name of the remote gateway Service (as given to `export`).
    #[arg(long, env = "SERVICE_MIRROR_GATEWAY_NAME", default_value = DEFAULT_GATEWAY_NAME)]
    pub gateway_name: String,
    /// Namespace of the remote gateway Service.
    #[arg(
        long,
        env = "SERVICE_MIRROR_GATEWAY_NAMESPACE",
        default_value = DEFAULT_GATEWAY_NAMESPACE
    )]
    pub gateway_namespace: String,
    /// Gateway IPs and hostnames, comma-separated (default: the gateway Service's
    /// load-balancer ingress).
    #[arg(long)]
    pub gateway_addresses: Option<String>,
    /// Gateway port (default: the gateway Service's `mc-gateway` port).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub gateway_port: Option<u16>,
    /// Services mirrored through the gateway: `key=value[,key=value]`.
    #[arg(long, default_value = DEFAULT_SELECTOR)]
    pub selector: String,
    /// Services mirrored without endpoints (remote discovery): `key=value[,...]`.
    #[arg(long, default_value = DEFAULT_REMOTE_DISCOVERY_SELECTOR)]
    pub remote_discovery_selector: String,
    /// Members of federated Services: `key=value[,...]`.
    #[arg(long, default_value = DEFAULT_FEDERATED_SERVICE_SELECTOR)]
    pub federated_service_selector: String,
    /// Namespace of Linkerd's control plane (Linkerd's `-L`): where `linkerd-config` is
    /// read on the remote, where the destination credentials Secret goes locally, and
    /// the Link's `targetClusterLinkerdNamespace`.
    #[arg(
        long,
        env = "SERVICE_MIRROR_LINKERD_NAMESPACE",
        default_value = DEFAULT_LINKERD_NAMESPACE
    )]
    pub linkerd_namespace: String,
    /// Identity trust domain of the remote (default: `identityTrustDomain` of its
    /// `linkerd-config`, else `cluster.local`), annotated on the destination Secret.
    #[arg(long, env = "SERVICE_MIRROR_TRUST_DOMAIN")]
    pub trust_domain: Option<String>,
    /// Print the credentials Secret Linkerd's destination reads (in
    /// `--linkerd-namespace`), as `link-gen` does. `false` where the local cluster runs
    /// no Linkerd (applying it would need that namespace).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub destination_credentials: bool,
}

impl Default for LinkGenArgs {
    fn default() -> Self {
        LinkGenArgs {
            gateway: true,
            gateway_name: DEFAULT_GATEWAY_NAME.into(),
            gateway_namespace: DEFAULT_GATEWAY_NAMESPACE.into(),
            gateway_addresses: None,
            gateway_port: None,
            selector: DEFAULT_SELECTOR.into(),
            remote_discovery_selector: DEFAULT_REMOTE_DISCOVERY_SELECTOR.into(),
            federated_service_selector: DEFAULT_FEDERATED_SERVICE_SELECTOR.into(),
            linkerd_namespace: DEFAULT_LINKERD_NAMESPACE.into(),
            trust_domain: None,
            destination_credentials: true,
        }
    }
}

impl LinkGenArgs {
    /// The gateway address and port given by flags, both present: a Link needs no
    /// gateway Service then.
    pub fn gateway_from_flags(&self) -> Option<(&str, u16)> {
        let addresses = self
            .gateway_addresses
            .as_deref()
            .map(str::trim)
            .filter(|a| !a.is_empty())?;
        Some((addresses, self.gateway_port?))
    }
}

/// Whether `text` is made of label-key (or, `value`, label-value) characters.
fn label_text(text: &str, value: bool) -> bool {
    (value || !text.is_empty())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c) || (!value && c == '/'))
}

/// `key=value[,key=value]` as matchLabels (set-based syntax is refused, not guessed).
pub fn parse_selector(text: &str) -> anyhow::Result<LabelSelector> {
    let mut labels = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .filter(|(k, v)| label_text(k.trim(), false) && label_text(v.trim(), true))
            .with_context(|| {
                format!(
                    "selector {text:?}: {part:?} is not key=value (only matchLabels are supported)"
                )
            })?;
        labels.insert(k.trim().to_string(), v.trim().to_string());
    }
    anyhow::ensure!(
        !labels.is_empty(),
        "selector {text:?} is empty: it would match nothing"
    );
    Ok(LabelSelector {
        match_labels: Some(labels),
        match_expressions: None,
    })
}

/// The credentials Secret `cluster-credentials-<cluster>` of a Link: Linkerd's type
/// and data key, and no annotation (a Secret link is told apart by its annotation).
pub fn credentials_secret(cluster: &str, namespace: &str, kubeconfig: String) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(link_secret_name(cluster)),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        type_: Some(LINK_SECRET_TYPE.to_string()),
        data: Some(BTreeMap::from([(
            LINK_KUBECONFIG_KEY.to_string(),
            ByteString(kubeconfig.into_bytes()),
        )])),
        ..Default::default()
    }
}

/// Go's `Duration.String()` of whole seconds (`3s`, `1m0s`), as `link-gen` writes a
/// numeric probe-period annotation.
fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec}s"),
        (h, m, sec) => format!("{h}h{m}m{sec}s"),
    }
}

/// A port of `gateway` by name (the node port for a NodePort Service, as `link-gen`).
fn named_port(gateway: &Service, name: &str) -> Option<i32> {
    let spec = gateway.spec.as_ref()?;
    let port = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))?;
    match spec.type_.as_deref() {
        Some("NodePort") => port.node_port,
        _ => Some(port.port),
    }
}

/// The Link of remote cluster `cluster` in `namespace`. `gateway` is the remote gateway
/// Service: `None` with `--gateway=false`, or where the remote has none and both
/// `--gateway-addresses` and `--gateway-port` are given (no identity, no probe then).
/// Returns the Link and warnings about defaults taken where the gateway said nothing.
pub fn link_resource(
    cluster: &str,
    domain: &str,
    namespace: &str,
    args: &LinkGenArgs,
    gateway: Option<&Service>,
) -> anyhow::Result<(LinkResource, Vec<String>)> {
    let mut warnings = Vec::new();
    let mut spec = LinkResourceSpec {
        target_cluster_name: Some(cluster.to_string()),
        target_cluster_domain: Some(domain.to_string()),
        target_cluster_linkerd_namespace: Some(args.linkerd_namespace.clone()),
        cluster_credentials_secret: Some(link_secret_name(cluster)),
        remote_discovery_selector: Some(parse_selector(&args.remote_discovery_selector)?),
        federated_service_selector: Some(parse_selector(&args.federated_service_selector)?),
        ..Default::default()
    };
    if args.gateway {
        match gateway {
            Some(gw) => gateway_fields(&mut spec, &mut warnings, args, gw)?,
            None => {
                let Some((addresses, port)) = args.gateway_from_flags() else {
                    bail!(
                        "no gateway Service given: pass --gateway-addresses and --gateway-port (a gateway that is no Service), or --gateway=false for a Link without gateway"
                    );
                };
                spec.gateway_address = Some(addresses.to_string());
                spec.gateway_port = Some(port.to_string());
                warnings.push(format!(
                    "no gateway Service {}/{}: the Link's gateway is {addresses} port {port} from the flags, with no gatewayIdentity (a meshed Linkerd gateway refuses such traffic) and no probeSpec (never probed: counted alive)",
                    args.gateway_namespace, args.gateway_name
                ));
            }
        }
        // As link-gen: the export selector only makes sense with a gateway.
        spec.selector = Some(parse_selector(&args.selector)?);
    }
    let link = LinkResource {
        metadata: ObjectMeta {
            name: Some(cluster.to_string()),
            namespace: Some(namespace.to_string()),
            annotations: Some(BTreeMap::from([(
                CREATED_BY_ANNOTATION.to_string(),
                created_by(),
            )])),
            ..Default::default()
        },
        spec,
        status: None,
    };
    Ok((link, warnings))
}

/// The gateway fields of `spec` from the remote gateway Service `gw` and the flags.
fn gateway_fields(
    spec: &mut LinkResourceSpec,
    warnings: &mut Vec<String>,
    args: &LinkGenArgs,
    gw: &Service,
) -> anyhow::Result<()> {
    let gw_name = format!(
        "{}/{}",
        gw.metadata.namespace.as_deref().unwrap_or_default(),
        gw.metadata.name.as_deref().unwrap_or_default()
    );
    let ingress: Vec<String> = gw
        .status
        .iter()
        .flat_map(|s| s.load_balancer.iter())
        .flat_map(|lb| lb.ingress.iter().flatten())
        .filter_map(|i| {
            i.ip.clone()
                .filter(|ip| !ip.is_empty())
                .or_else(|| i.hostname.clone())
        })
        .filter(|a| !a.is_empty())
        .collect();
    spec.gateway_address = Some(match &args.gateway_addresses {
        Some(a) if !a.trim().is_empty() => a.trim().to_string(),
        _ if !ingress.is_empty() => ingress.join(","),
        _ => bail!(
            "gateway {gw_name} has no load-balancer ingress address: pass --gateway-addresses"
        ),
    });
    let port = match args.gateway_port {
        Some(p) => i32::from(p),
        None => named_port(gw, GATEWAY_PORT_NAME).with_context(|| {
            format!("gateway {gw_name} has no port named {GATEWAY_PORT_NAME}: pass --gateway-port")
        })?,
    };
    spec.gateway_port = Some(port.to_string());
    let annotations = gw.metadata.annotations.clone().unwrap_or_default();
    match annotations.get(GATEWAY_IDENTITY_ANNOTATION) {
        Some(id) if !id.is_empty() => spec.gateway_identity = Some(id.clone()),
        _ => warnings.push(format!(
            "gateway {gw_name} has no {GATEWAY_IDENTITY_ANNOTATION} annotation: the Link has no gatewayIdentity (a meshed Linkerd gateway refuses such traffic)"
        )),
    }
    let path = match annotations.get(PROBE_PATH_ANNOTATION) {
        Some(p) if !p.is_empty() => p.clone(),
        _ => DEFAULT_PROBE_PATH.to_string(),
    };
    // Linkerd's annotation is whole seconds ("3"); a Link wants a Go duration.
    let period = match annotations.get(PROBE_PERIOD_ANNOTATION) {
        None => DEFAULT_PROBE_PERIOD.to_string(),
        Some(p) => match p.parse::<u64>() {
            Ok(secs) => go_duration(Duration::from_secs(secs)),
            Err(_) => {
                parse_go_duration(p).map_err(|why| {
                    anyhow::anyhow!(
                        "gateway {gw_name}: {PROBE_PERIOD_ANNOTATION} {p:?} is neither seconds nor a Go duration: {why}"
                    )
                })?;
                p.clone()
            }
        },
    };
    let probe_port = named_port(gw, PROBE_PORT_NAME);
    if probe_port.is_none() {
        warnings.push(format!(
            "gateway {gw_name} has no port named {PROBE_PORT_NAME}: the Link's probeSpec has no port"
        ));
    }
    spec.probe_spec = Some(LinkProbeSpec {
        path: Some(path),
        port: probe_port.map(|p| p.to_string()),
        period: Some(period),
        ..Default::default()
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::output::{OutputFormat, render_documents};
    use crate::links::{LinkSource, parse_link};
    use serde_json::json;
    use service_mirror_core::ExportRule;

    const KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: east
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority-data: Zm9v
users:
- name: east
  user:
    token: t0ken
contexts:
- name: east
  context: {cluster: east, user: east}
current-context: east
";

    fn gateway(annotations: serde_json::Value, ports: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "linkerd-gateway", "namespace": "linkerd-multicluster",
                         "annotations": annotations},
            "spec": {"type": "LoadBalancer", "ports": ports},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"hostname": "gw.example.com"}]}},
        }))
        .unwrap()
    }

    fn full_gateway() -> Service {
        gateway(
            json!({
                "mirror.linkerd.io/gateway-identity": "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local",
                "mirror.linkerd.io/probe-path": "/health",
                "mirror.linkerd.io/probe-period": "7",
            }),
            json!([{"name": "mc-gateway", "port": 4143}, {"name": "mc-probe", "port": 4191}]),
        )
    }

    /// Renders Secret and Link as `link` prints them, reads them back, parses them.
    fn round_trip(link: &LinkResource, format: OutputFormat) -> crate::links::LinkSpec {
        let secret = credentials_secret("east", "mc", KUBECONFIG.into());
        let docs = [
            serde_json::to_value(&secret).unwrap(),
            serde_json::to_value(link).unwrap(),
        ];
        let text = render_documents(&docs, format).unwrap();
        let back: Vec<serde_json::Value> = match format {
            OutputFormat::Yaml => serde_saphyr::from_multiple(&text).unwrap(),
            OutputFormat::Json => {
                serde_json::from_str::<serde_json::Value>(&text).unwrap()["items"]
                    .as_array()
                    .unwrap()
                    .clone()
            }
        };
        assert_eq!(back[0]["kind"], "Secret");
        assert_eq!(back[1]["apiVersion"], "multicluster.linkerd.io/v1alpha3");
        assert_eq!(back[1]["kind"], "Link");
        let secret: Secret = serde_json::from_value(back[0].clone()).unwrap();
        assert!(secret.metadata.annotations.is_none(), "no annotations");
        let link: LinkResource = serde_json::from_value(back[1].clone()).unwrap();
        parse_link(&link, Some(&secret)).expect("parse_link accepts link's output")
    }

    #[test]
    fn link_gen_output_parses_with_the_gateway_values() {
        let (link, warnings) = link_resource(
            "east",
            "cluster.local",
            "mc",
            &LinkGenArgs::default(),
            Some(&full_gateway()),
        )
        .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(link.metadata.name.as_deref(), Some("east"));
        assert_eq!(link.metadata.namespace.as_deref(), Some("mc"));
        let s = &link.spec;
        assert_eq!(
            s.cluster_credentials_secret.as_deref(),
            Some("cluster-credentials-east")
        );
        assert_eq!(
            s.gateway_address.as_deref(),
            Some("192.0.2.1,gw.example.com")
        );
        assert_eq!(s.gateway_port.as_deref(), Some("4143"));
        let probe = s.probe_spec.as_ref().unwrap();
        assert_eq!(probe.period.as_deref(), Some("7s"));
        assert_eq!(probe.port.as_deref(), Some("4191"));
        for format in [OutputFormat::Yaml, OutputFormat::Json] {
            let spec = round_trip(&link, format);
            assert_eq!(spec.link().cluster_name, "east");
            assert_eq!(spec.link().cluster_domain, "cluster.local");
            let LinkSource::Resource(r) = spec.source() else {
                panic!("a Link source")
            };
            assert_eq!(r.credentials_secret, "cluster-credentials-east");
            let gw = r.gateway.as_ref().expect("a gateway");
            assert_eq!(
                gw.ips,
                vec!["192.0.2.1".parse::<std::net::IpAddr>().unwrap()]
            );
            assert_eq!(gw.hostnames, vec!["gw.example.com".to_string()]);
            assert_eq!(gw.port, 4143);
            assert!(
                gw.identity
                    .as_deref()
                    .unwrap()
                    .starts_with("linkerd-gateway.")
            );
            assert_eq!(r.probe.path, "/health");
            assert_eq!(r.probe.port, Some(4191));
            assert_eq!(r.probe.period, Duration::from_secs(7));
            let ExportRule::Selectors {
                export,
                remote_discovery,
                ..
            } = &r.export
            else {
                panic!("selectors")
            };
            assert_eq!(export.to_string(), "mirror.linkerd.io/exported=true");
            assert_eq!(
                remote_discovery.to_string(),
                "mirror.linkerd.io/exported=remote-discovery"
            );
        }
        let fed = link.spec.federated_service_selector.unwrap().match_labels;
        assert_eq!(fed.unwrap()["mirror.linkerd.io/federated"], "member");
    }

    #[test]
    fn flags_override_the_gateway_and_defaults_fill_what_it_lacks() {
        let args = LinkGenArgs {
            gateway_addresses: Some("198.51.100.7".into()),
            gateway_port: Some(10443),
            ..Default::default()
        };
        let bare = gateway(json!({}), json!([{"name": "mc-gateway", "port": 4143}]));
        let (link, warnings) = link_resource("east", "c.local", "mc", &args, Some(&bare)).unwrap();
        assert_eq!(link.spec.gateway_address.as_deref(), Some("198.51.100.7"));
        assert_eq!(link.spec.gateway_port.as_deref(), Some("10443"));
        assert_eq!(link.spec.gateway_identity, None);
        assert_eq!(warnings.len(), 2, "identity and probe port: {warnings:?}");
        let probe = link.spec.probe_spec.as_ref().unwrap();
        assert_eq!(probe.path.as_deref(), Some("/ready"));
        assert_eq!(probe.period.as_deref(), Some("3s"));
        let spec = round_trip(&link, OutputFormat::Yaml);
        assert_eq!(spec.link().cluster_domain, "c.local");
    }

    #[test]
    fn a_gateway_less_link_has_no_gateway_fields_and_still_parses() {
        let args = LinkGenArgs {
            gateway: false,
            ..Default::default()
        };
        let (link, _) = link_resource("east", "cluster.local", "mc", &args, None).unwrap();
        assert_eq!(link.spec.gateway_address, None);
        assert_eq!(link.spec.gateway_port, None);
        assert_eq!(link.spec.probe_spec, None);
        assert_eq!(link.spec.selector, None);
        assert!(link.spec.remote_discovery_selector.is_some());
        let spec = round_trip(&link, OutputFormat::Yaml);
        let LinkSource::Resource(r) = spec.source() else {
            panic!("a Link source")
        };
        assert!(r.gateway.is_none());
    }

    #[test]
    fn unusable_gateways_and_selectors_are_refused_clearly() {
        let no_ingress: Service = serde_json::from_value(json!({
            "metadata": {"name": "gw", "namespace": "mc"},
            "spec": {"ports": [{"name": "mc-gateway", "port": 4143}]},
        }))
        .unwrap();
        let err =
            link_resource("e", "d", "mc", &LinkGenArgs::default(), Some(&no_ingress)).unwrap_err();
        assert!(err.to_string().contains("--gateway-addresses"), "{err}");
        let no_port = gateway(json!({}), json!([{"name": "http", "port": 80}]));
        let err =
            link_resource("e", "d", "mc", &LinkGenArgs::default(), Some(&no_port)).unwrap_err();
        assert!(err.to_string().contains("mc-gateway"), "{err}");
        let bad_period = gateway(
            json!({"mirror.linkerd.io/probe-period": "soon"}),
            json!([{"name": "mc-gateway", "port": 4143}]),
        );
        let err =
            link_resource("e", "d", "mc", &LinkGenArgs::default(), Some(&bad_period)).unwrap_err();
        assert!(err.to_string().contains("probe-period"), "{err}");
        let err = link_resource("e", "d", "mc", &LinkGenArgs::default(), None).unwrap_err();
        assert!(err.to_string().contains("--gateway=false"), "{err}");
        assert!(parse_selector("a in (b)").is_err());
        assert!(parse_selector("").is_err());
        assert!(parse_selector("a!=b").is_err());
        let s = parse_selector("a=b, c=d").unwrap().match_labels.unwrap();
        assert_eq!(s.len(), 2);
    }

    /// Field by field against what `link-gen` prints for the same remote (getLink in
    /// link-gen.go, defaults of newLinkGenOptionsWithDefault): the only difference is
    /// the created-by value (`linkerd/cli <version>` there). Go's encoder also writes
    /// `creationTimestamp: null`, `status: {}` and, without gateway, `probeSpec: {}`:
    /// empty values a reader cannot tell from absent ones.
    #[test]
    fn the_link_has_link_gens_fields() {
        let (link, _) = link_resource(
            "east",
            "cluster.local",
            "linkerd-multicluster",
            &LinkGenArgs::default(),
            Some(&full_gateway()),
        )
        .unwrap();
        let v = serde_json::to_value(&link).unwrap();
        assert_eq!(
            v,
            json!({
                "apiVersion": "multicluster.linkerd.io/v1alpha3",
                "kind": "Link",
                "metadata": {
                    "name": "east",
                    "namespace": "linkerd-multicluster",
                    "annotations": {"linkerd.io/created-by": created_by()},
                },
                "spec": {
                    "targetClusterName": "east",
                    "targetClusterDomain": "cluster.local",
                    "targetClusterLinkerdNamespace": "linkerd",
                    "clusterCredentialsSecret": "cluster-credentials-east",
                    "gatewayAddress": "192.0.2.1,gw.example.com",
                    "gatewayPort": "4143",
                    "gatewayIdentity": "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local",
                    "probeSpec": {"path": "/health", "port": "4191", "period": "7s"},
                    "selector": {"matchLabels": {"mirror.linkerd.io/exported": "true"}},
                    "remoteDiscoverySelector":
                        {"matchLabels": {"mirror.linkerd.io/exported": "remote-discovery"}},
                    "federatedServiceSelector":
                        {"matchLabels": {"mirror.linkerd.io/federated": "member"}},
                },
            })
        );
        assert!(created_by().starts_with("service-mirror/cli "));
        let other = LinkGenArgs {
            linkerd_namespace: "l5d".into(),
            ..Default::default()
        };
        let (link, _) =
            link_resource("east", "c.local", "mc", &other, Some(&full_gateway())).unwrap();
        assert_eq!(
            link.spec.target_cluster_linkerd_namespace.as_deref(),
            Some("l5d")
        );
    }

    #[test]
    fn a_gateway_that_is_no_service_comes_from_both_flags_unprobed() {
        let args = LinkGenArgs {
            gateway_addresses: Some(" 198.51.100.7,gw.example.org ".into()),
            gateway_port: Some(10443),
            ..Default::default()
        };
        let (link, warnings) = link_resource("east", "cluster.local", "mc", &args, None).unwrap();
        assert_eq!(
            link.spec.gateway_address.as_deref(),
            Some("198.51.100.7,gw.example.org")
        );
        assert_eq!(link.spec.gateway_port.as_deref(), Some("10443"));
        assert_eq!(link.spec.gateway_identity, None);
        assert_eq!(link.spec.probe_spec, None, "nothing to probe");
        assert!(link.spec.selector.is_some(), "exports go through it");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("no gatewayIdentity"), "{warnings:?}");
        let spec = round_trip(&link, OutputFormat::Yaml);
        let LinkSource::Resource(r) = spec.source() else {
            panic!("a Link source")
        };
        let gw = r.gateway.as_ref().expect("a gateway");
        assert_eq!(gw.port, 10443);
        assert_eq!(r.probe.port, None, "never probed");
        // One flag alone is not a gateway.
        for half in [
            LinkGenArgs {
                gateway_addresses: Some("198.51.100.7".into()),
                ..Default::default()
            },
            LinkGenArgs {
                gateway_port: Some(10443),
                ..Default::default()
            },
        ] {
            let err = link_resource("east", "cluster.local", "mc", &half, None).unwrap_err();
            assert!(err.to_string().contains("--gateway-port"), "{err}");
        }
    }

    #[test]
    fn go_durations_match_go() {
        assert_eq!(go_duration(Duration::from_secs(3)), "3s");
        assert_eq!(go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration(Duration::from_secs(3661)), "1h1m1s");
    }
}
