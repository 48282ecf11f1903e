//! The third document of `link --format link`: the credentials Secret Linkerd's
//! destination controller reads, and the remote's `linkerd-config` it is built from.
//!
//! Linkerd's `link-gen` (multicluster/cmd/link-gen.go) prints, between the Link's
//! credentials Secret and the Link, a second `cluster-credentials-<cluster>` Secret in
//! the control-plane namespace (`-L`, default `linkerd`): same type and kubeconfig,
//! labelled `multicluster.linkerd.io/cluster-name: <cluster>` and annotated with the
//! remote's trust domain and cluster domain. Linkerd's destination
//! (controller/api/destination/watcher/cluster_store.go) watches Secrets of that type
//! carrying that label and builds its remote-discovery and federated clients from them;
//! without it, it answers `NotFound: Remote cluster not found`. Our controller never
//! reads it.
//!
//! `link-gen` reads both domains from the `values` of the remote's `linkerd-config`
//! ConfigMap (`identityTrustDomain`, `clusterDomain`, hoisted from a `global:` block in
//! older installs) and refuses a remote without it. Here an explicit flag wins (the
//! operator's word, as `--mcs-cluster-name` over the ClusterProperty), then
//! `linkerd-config`, then `cluster.local`: an MCS user without Linkerd still gets a
//! complete output. Pure; [`super::link`] does the reading.

use super::link_gen::credentials_secret;
use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use service_mirror_core::labels::{DEFAULT_CLUSTER_DOMAIN, LINK_SECRET_TYPE};
use service_mirror_core::naming::is_dns1123_subdomain;
use std::collections::BTreeMap;

/// Linkerd's control-plane namespace (`linkerd mc -L`).
pub const DEFAULT_LINKERD_NAMESPACE: &str = "linkerd";
/// The ConfigMap of Linkerd's control plane holding its install values.
pub const LINKERD_CONFIG_NAME: &str = "linkerd-config";
/// Label naming the cluster of a destination credentials Secret (what Linkerd's
/// destination and `linkerd mc unlink` select on).
pub const DESTINATION_CLUSTER_NAME_LABEL: &str = "multicluster.linkerd.io/cluster-name";
/// Annotation: the remote's identity trust domain (TLS identities of its endpoints).
pub const DESTINATION_TRUST_DOMAIN_ANNOTATION: &str = "multicluster.linkerd.io/trust-domain";
/// Annotation: the remote's DNS cluster domain.
pub const DESTINATION_CLUSTER_DOMAIN_ANNOTATION: &str = "multicluster.linkerd.io/cluster-domain";
/// Linkerd's default identity trust domain (`identityTrustDomain`).
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// What `linkerd-config` says about the remote (each `None` when it does not say).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkerdConfig {
    /// `identityTrustDomain`.
    pub trust_domain: Option<String>,
    /// `clusterDomain`.
    pub cluster_domain: Option<String>,
}

/// The `values` text of a `linkerd-config` ConfigMap as a YAML map, the keys of a
/// top-level `global:` map (before Linkerd 2.10) overriding the top-level ones
/// (Linkerd's `RemoveGlobalFieldIfPresent`). Empty text: an empty map.
pub fn linkerd_values(text: &str) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let values: serde_json::Value = serde_saphyr::from_str(text).context("`values` is not YAML")?;
    let mut top = match values {
        serde_json::Value::Object(m) => m,
        serde_json::Value::Null => serde_json::Map::new(),
        _ => anyhow::bail!("`values` is not a YAML map"),
    };
    if let Some(serde_json::Value::Object(global)) = top.remove("global") {
        top.extend(global);
    }
    Ok(top)
}

/// Reads `identityTrustDomain` and `clusterDomain` from the `values` of a
/// `linkerd-config` ConfigMap, keys of a top-level `global:` map overriding the
/// top-level ones (Linkerd's `RemoveGlobalFieldIfPresent`). No `values`: says nothing
/// (Linkerd would dereference nil there). A value that is not a DNS subdomain is an
/// error, never passed on to the destination.
pub fn parse_linkerd_config(cm: &ConfigMap) -> anyhow::Result<LinkerdConfig> {
    let name = format!(
        "ConfigMap {}/{}",
        cm.metadata.namespace.as_deref().unwrap_or_default(),
        cm.metadata.name.as_deref().unwrap_or_default()
    );
    let Some(text) = cm
        .data
        .as_ref()
        .and_then(|d| d.get("values"))
        .filter(|v| !v.trim().is_empty())
    else {
        return Ok(LinkerdConfig::default());
    };
    let top = linkerd_values(text).with_context(|| name.clone())?;
    let field = |key: &str| -> anyhow::Result<Option<String>> {
        match top.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) if s.is_empty() => Ok(None),
            Some(serde_json::Value::String(s)) if is_dns1123_subdomain(s) => Ok(Some(s.clone())),
            Some(other) => anyhow::bail!("{name}: {key} {other} is not a DNS domain"),
        }
    };
    Ok(LinkerdConfig {
        trust_domain: field("identityTrustDomain")?,
        cluster_domain: field("clusterDomain")?,
    })
}

/// The remote's trust and cluster domains as printed, and where each came from (one
/// stderr note each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domains {
    /// The identity trust domain.
    pub trust_domain: String,
    /// The DNS cluster domain.
    pub cluster_domain: String,
    /// Where each came from, for stderr.
    pub notes: Vec<String>,
}

/// Flag (explicit) over `linkerd-config` over `cluster.local`, for each domain.
/// `config` is `None` when the remote has no `linkerd-config` in `linkerd_namespace`
/// (or it was not read: both flags given).
pub fn resolve_domains(
    trust_flag: Option<&str>,
    cluster_flag: Option<&str>,
    config: Option<&LinkerdConfig>,
    linkerd_namespace: &str,
) -> Domains {
    let mut notes = Vec::new();
    let mut pick = |what: &str,
                    flag_name: &str,
                    flag: Option<&str>,
                    from_config: Option<&str>,
                    default: &str| {
        let source = format!("{LINKERD_CONFIG_NAME} in {linkerd_namespace} on the remote");
        match (flag, from_config) {
            (Some(f), Some(c)) if f != c => {
                notes.push(format!(
                    "{what} {f} from {flag_name}, although {source} says {c}"
                ));
                f.to_string()
            }
            (Some(f), _) => f.to_string(),
            (None, Some(c)) => {
                notes.push(format!("{what} {c} from {source}"));
                c.to_string()
            }
            (None, None) => {
                let why = match config {
                    None => format!("no {source}"),
                    Some(_) => format!("{source} does not say"),
                };
                notes.push(format!(
                    "{what} {default} ({why}; set {flag_name} if the remote uses another)"
                ));
                default.to_string()
            }
        }
    };
    let trust_domain = pick(
        "trust domain",
        "--trust-domain",
        trust_flag,
        config.and_then(|c| c.trust_domain.as_deref()),
        DEFAULT_TRUST_DOMAIN,
    );
    let cluster_domain = pick(
        "cluster domain",
        "--cluster-domain",
        cluster_flag,
        config.and_then(|c| c.cluster_domain.as_deref()),
        DEFAULT_CLUSTER_DOMAIN,
    );
    Domains {
        trust_domain,
        cluster_domain,
        notes,
    }
}

/// The destination credentials Secret of `cluster` in `linkerd_namespace`, as
/// `link-gen` prints it: `cluster-credentials-<cluster>`, type
/// `mirror.linkerd.io/remote-kubeconfig`, the label and two annotations Linkerd's
/// destination requires, and the Link's kubeconfig under `kubeconfig`.
pub fn destination_credentials_secret(
    cluster: &str,
    linkerd_namespace: &str,
    kubeconfig: String,
    domains: &Domains,
) -> Secret {
    // The Link's credentials Secret (same name, type and data), in Linkerd's namespace,
    // with what the destination selects and reads.
    let mut secret = credentials_secret(cluster, linkerd_namespace, kubeconfig);
    secret.metadata.labels = Some(BTreeMap::from([(
        DESTINATION_CLUSTER_NAME_LABEL.to_string(),
        cluster.to_string(),
    )]));
    secret.metadata.annotations = Some(BTreeMap::from([
        (
            DESTINATION_TRUST_DOMAIN_ANNOTATION.to_string(),
            domains.trust_domain.clone(),
        ),
        (
            DESTINATION_CLUSTER_DOMAIN_ANNOTATION.to_string(),
            domains.cluster_domain.clone(),
        ),
    ]));
    secret
}

/// Whether `secret` is a destination credentials Secret of `cluster`: the label names
/// it and the type is Linkerd's (what `unlink` may delete; Linkerd's `unlink` selects
/// on the label alone, we also want the type, so a look-alike of another kind stays).
pub fn is_destination_credentials_of(secret: &Secret, cluster: &str) -> bool {
    secret.type_.as_deref() == Some(LINK_SECRET_TYPE)
        && secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(DESTINATION_CLUSTER_NAME_LABEL))
            .is_some_and(|c| c == cluster)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config_map(values: Option<&str>) -> ConfigMap {
        let data = values.map(|v| json!({"values": v})).unwrap_or(json!({}));
        serde_json::from_value(json!({
            "metadata": {"name": "linkerd-config", "namespace": "linkerd"},
            "data": data,
        }))
        .unwrap()
    }

    #[test]
    fn linkerd_config_values_give_both_domains_global_first() {
        let table: &[(Option<&str>, Option<&str>, Option<&str>)] = &[
            // A HEAD install: both at the top of `values`.
            (
                Some("clusterDomain: east.local\nidentityTrustDomain: root.east\nfoo: 1\n"),
                Some("root.east"),
                Some("east.local"),
            ),
            // Before 2.10: under `global:`, which wins over the top level.
            (
                Some(
                    "identityTrustDomain: top.example\nglobal:\n  identityTrustDomain: g.example\n  clusterDomain: c.example\n",
                ),
                Some("g.example"),
                Some("c.example"),
            ),
            // Says nothing: no values, empty values, empty strings, null.
            (None, None, None),
            (Some(""), None, None),
            (
                Some("identityTrustDomain: \"\"\nclusterDomain: ~\n"),
                None,
                None,
            ),
        ];
        for (values, trust, cluster) in table {
            let c = parse_linkerd_config(&config_map(*values)).unwrap();
            assert_eq!(c.trust_domain.as_deref(), *trust, "{values:?}");
            assert_eq!(c.cluster_domain.as_deref(), *cluster, "{values:?}");
        }
    }

    #[test]
    fn unusable_linkerd_config_values_are_refused_with_the_configmap_named() {
        for values in [
            "identityTrustDomain: [a, b]\n",
            "identityTrustDomain: \"Bad Domain\"\n",
            "clusterDomain: 42\n",
            "- a list\n",
            "{unclosed: ",
        ] {
            let err = parse_linkerd_config(&config_map(Some(values))).unwrap_err();
            assert!(
                format!("{err:#}").contains("ConfigMap linkerd/linkerd-config"),
                "{values}: {err:#}"
            );
        }
    }

    #[test]
    fn an_explicit_flag_wins_then_linkerd_config_then_cluster_local() {
        let cfg = LinkerdConfig {
            trust_domain: Some("root.east".into()),
            cluster_domain: Some("east.local".into()),
        };
        let d = resolve_domains(None, None, Some(&cfg), "linkerd");
        assert_eq!(
            (d.trust_domain.as_str(), d.cluster_domain.as_str()),
            ("root.east", "east.local")
        );
        assert!(
            d.notes[0].contains("from linkerd-config in linkerd"),
            "{d:?}"
        );
        let d = resolve_domains(Some("mine.example"), None, Some(&cfg), "l5d");
        assert_eq!(d.trust_domain, "mine.example");
        assert!(d.notes[0].contains("although linkerd-config in l5d on the remote says root.east"));
        let d = resolve_domains(None, None, None, "linkerd");
        assert_eq!(
            (d.trust_domain.as_str(), d.cluster_domain.as_str()),
            ("cluster.local", "cluster.local")
        );
        assert!(
            d.notes.iter().all(|n| n.contains("no linkerd-config")),
            "{d:?}"
        );
        let d = resolve_domains(
            None,
            Some("c.example"),
            Some(&LinkerdConfig::default()),
            "linkerd",
        );
        assert_eq!(d.cluster_domain, "c.example");
        assert!(d.notes[0].contains("does not say"), "{d:?}");
        assert_eq!(
            d.notes.len(),
            1,
            "an explicit flag that agrees says nothing"
        );
    }

    /// Field by field against what `link-gen` prints (getCreds with the destination
    /// labels and annotations, link-gen.go): only name, namespace, labels,
    /// annotations, type and the one data key.
    #[test]
    fn the_destination_secret_has_link_gens_shape() {
        let d = resolve_domains(Some("root.east"), Some("east.local"), None, "linkerd");
        let s = destination_credentials_secret("east", "linkerd", "kc".into(), &d);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v,
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": "cluster-credentials-east",
                    "namespace": "linkerd",
                    "labels": {"multicluster.linkerd.io/cluster-name": "east"},
                    "annotations": {
                        "multicluster.linkerd.io/trust-domain": "root.east",
                        "multicluster.linkerd.io/cluster-domain": "east.local",
                    },
                },
                "type": "mirror.linkerd.io/remote-kubeconfig",
                "data": {"kubeconfig": "a2M="},
            })
        );
        assert!(is_destination_credentials_of(&s, "east"));
        assert!(!is_destination_credentials_of(&s, "west"));
        let mut opaque = s.clone();
        opaque.type_ = Some("Opaque".into());
        assert!(!is_destination_credentials_of(&opaque, "east"));
        let mut unlabelled = s;
        unlabelled.metadata.labels = None;
        assert!(!is_destination_credentials_of(&unlabelled, "east"));
    }
}
