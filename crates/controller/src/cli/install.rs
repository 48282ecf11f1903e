//! `service-mirror install`: the local-side manifests of the controller.
//!
//! ```text
//! service-mirror install | kubectl apply -f -
//! ```
//!
//! It prints, in apply order: the `links.multicluster.linkerd.io` CRD (Linkerd's `Link`;
//! `--link-crd=false` leaves it out where Linkerd's own is installed), the
//! `serviceexports` and `serviceimports.multicluster.x-k8s.io` CRDs of the
//! Multi-Cluster Services API (`--mcs-crds=false` leaves them out), the About API's
//! ClusterProperty CRD (`--cluster-property-crd=false` leaves it out: the upstream MCS
//! CRDs do not include it, so `--mcs-crds=false` keeps it), the Namespace,
//! the ServiceAccount `service-mirror`, a ClusterRole and its ClusterRoleBinding with
//! the cluster-wide permissions, a Role and its RoleBinding with the permissions
//! limited to the controller's namespace (Link permissions included; all from
//! [`crate::permissions`], which `run` checks at startup), the Service
//! `service-mirror-admin` in front of every replica's admin port (`/metrics`), and the
//! Deployment. With `--ha`: three replicas spread over nodes and a PodDisruptionBudget.
//!
//! The Helm chart `charts/service-mirror` renders the same objects (the Namespace
//! aside: Helm's `--create-namespace` makes it); `tests/cli/links.rs` compares the two
//! object by object.

mod clusterset_dns;

use super::allow::check_names;
use super::args::OutputArgs;
use super::manifest::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::links::LINK_CRD_YAML;
use crate::permissions::{
    CLUSTER_PROFILE_RULES, CLUSTER_RULES, LINK_RULES, LOCAL_NETWORK_RULES, MCS_RULES,
    NAMESPACE_RULES, Rule,
};
use anyhow::Context;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    Namespace, ObjectFieldSelector, PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext, Service,
    ServiceAccount, ServicePort, ServiceSpec, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;
use std::collections::BTreeMap;

/// Name of the ServiceAccount, Deployment, Role and RoleBinding.
pub(crate) const NAME: &str = MANAGED_BY;
/// Default namespace of the controller (Linkerd's).
pub(crate) use super::manifest::DEFAULT_NAMESPACE;
/// Port of the admin server (`/metrics`, `/live`, `/ready`): `run`'s default
/// `--metrics-addr`.
pub(crate) const ADMIN_PORT: i32 = 9999;
/// Name of the admin port on the container: ends in `-admin`, as Linkerd's tools
/// (and `check`) look for.
pub(crate) const ADMIN_PORT_NAME: &str = "mirror-admin";
/// Name of the Service in front of the admin ports: not [`NAME`], so that it can never
/// be taken for the mirror of a remote `service` of a cluster named `mirror`.
pub(crate) const ADMIN_SERVICE_NAME: &str = "service-mirror-admin";
/// The non-root user and group of the distroless image.
pub(crate) const RUN_AS: i64 = 65532;

const NAME_LABEL: &str = "app.kubernetes.io/name";
const COMPONENT_LABEL: &str = "app.kubernetes.io/component";

/// The default image: this build's version.
pub(crate) fn default_image() -> String {
    format!(
        "ghcr.io/service-mirror/service-mirror:{}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Arguments of `install`.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Namespace of the controller and of its link Secrets (created if missing).
    #[arg(
        long,
        env = "SERVICE_MIRROR_NAMESPACE",
        default_value = DEFAULT_NAMESPACE
    )]
    pub namespace: String,
    /// High availability: 3 replicas spread over nodes and a PodDisruptionBudget.
    #[arg(long)]
    pub ha: bool,
    /// Container image of the controller.
    #[arg(long, env = "SERVICE_MIRROR_IMAGE", default_value_t = default_image())]
    pub image: String,
    /// Print the CRD of Linkerd's `Link` resource (links.multicluster.linkerd.io).
    /// `false` where Linkerd's multicluster extension already installed it: applying
    /// ours would take its fields over.
    #[arg(long, env = "SERVICE_MIRROR_LINK_CRD", default_value_t = true, action = clap::ArgAction::Set)]
    pub link_crd: bool,
    /// Print the CRDs of the Multi-Cluster Services API (ServiceExport, ServiceImport;
    /// multicluster.x-k8s.io). `false` where another implementation installed them.
    #[arg(long, env = "SERVICE_MIRROR_MCS_CRDS", default_value_t = true, action = clap::ArgAction::Set)]
    pub mcs_crds: bool,
    /// Print the CRD of the About API's ClusterProperty (about.k8s.io, whose `id.k8s.io`
    /// names the cluster for MCS). Independent of `--mcs-crds`: the upstream MCS CRDs do
    /// not include it. `false` where the About API's own CRD is installed.
    #[arg(long, env = "SERVICE_MIRROR_CLUSTER_PROPERTY_CRD", default_value_t = true, action = clap::ArgAction::Set)]
    pub cluster_property_crd: bool,
    /// Print the published CRD of the cluster inventory API's ClusterProfile
    /// (clusterprofiles.multicluster.x-k8s.io, KEP-4322), read as a link source with
    /// `run --link-source=cluster-profiles` or `all`. Off by default: the source is, and
    /// a cluster manager usually installs it.
    #[arg(long, env = "SERVICE_MIRROR_CLUSTER_PROFILE_CRD", default_value_t = false, action = clap::ArgAction::Set)]
    pub cluster_profile_crd: bool,
    /// Serve the `clusterset.local` DNS zone from the ServiceImports on every replica
    /// (`run --clusterset-dns-addr :5353`) behind the Service
    /// `service-mirror-clusterset-dns` on port 53 (UDP and TCP), the address a
    /// cluster's CoreDNS forwards `clusterset.local` to.
    #[arg(long, env = "SERVICE_MIRROR_CLUSTERSET_DNS")]
    pub clusterset_dns: bool,
    /// How the manifests are printed.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Name of the ClusterRole and ClusterRoleBinding of the controller in `namespace`: one
/// pair per installation, so two installations never overwrite each other's binding
/// (and never collide with the `service-mirror:<ns>:<account>` names of `allow`).
pub(crate) fn cluster_role_name(namespace: &str) -> String {
    format!("service-mirror-controller:{namespace}")
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_LABEL.to_string(), NAME.to_string()),
        (COMPONENT_LABEL.to_string(), "controller".to_string()),
        (MANAGED_BY_LABEL.to_string(), NAME.to_string()),
    ])
}

/// Labels that select the controller's pods.
fn selector_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_LABEL.to_string(), NAME.to_string()),
        (COMPONENT_LABEL.to_string(), "controller".to_string()),
    ])
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    super::manifest::meta(name, namespace, labels())
}

fn policy_rules(rules: &[Rule]) -> Vec<PolicyRule> {
    rules
        .iter()
        .map(|r| PolicyRule {
            api_groups: Some(vec![r.group.to_string()]),
            resources: Some(r.resources.iter().map(|s| s.to_string()).collect()),
            verbs: r.verbs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .collect()
}

fn subjects(namespace: &str) -> Option<Vec<Subject>> {
    Some(vec![Subject {
        kind: "ServiceAccount".into(),
        name: NAME.into(),
        namespace: Some(namespace.to_string()),
        ..Default::default()
    }])
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String(ADMIN_PORT_NAME.into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(1),
        ..Default::default()
    }
}

fn deployment(namespace: &str, ha: bool, image: &str) -> Deployment {
    let seccomp = || {
        Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        })
    };
    let container = Container {
        name: NAME.into(),
        image: Some(image.to_string()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(
            ["run", "--namespace", namespace, "--log-format", "json"]
                .map(str::to_string)
                .to_vec(),
        ),
        env: Some(vec![EnvVar {
            name: "POD_NAME".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: Some(vec![ContainerPort {
            name: Some(ADMIN_PORT_NAME.into()),
            container_port: ADMIN_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        liveness_probe: Some(http_probe("/live", 10, 3)),
        readiness_probe: Some(http_probe("/ready", 5, 3)),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("100m".into())),
                ("memory".to_string(), Quantity("64Mi".into())),
            ])),
            limits: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("1".into())),
                ("memory".to_string(), Quantity("256Mi".into())),
            ])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            seccomp_profile: seccomp(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let affinity = ha.then(|| Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(LabelSelector {
                            match_labels: Some(selector_labels()),
                            ..Default::default()
                        }),
                        topology_key: "kubernetes.io/hostname".into(),
                        ..Default::default()
                    },
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    });
    let mut template_labels = labels();
    template_labels.extend(selector_labels());
    Deployment {
        metadata: meta(NAME, Some(namespace)),
        spec: Some(DeploymentSpec {
            replicas: Some(if ha { 3 } else { 1 }),
            selector: LabelSelector {
                match_labels: Some(selector_labels()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(template_labels),
                    annotations: Some(BTreeMap::from([
                        ("prometheus.io/scrape".to_string(), "true".to_string()),
                        ("prometheus.io/port".to_string(), ADMIN_PORT.to_string()),
                        ("prometheus.io/path".to_string(), "/metrics".to_string()),
                    ])),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(NAME.into()),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(RUN_AS),
                        run_as_group: Some(RUN_AS),
                        seccomp_profile: seccomp(),
                        ..Default::default()
                    }),
                    node_selector: Some(BTreeMap::from([(
                        "kubernetes.io/os".to_string(),
                        "linux".to_string(),
                    )])),
                    affinity,
                    containers: vec![container],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The ClusterIP Service `service-mirror-admin` on every replica's admin port: one
/// scrape target per replica for a Prometheus that discovers endpoints (every replica
/// is ready once its caches synced, leader or not, and serves its own metrics).
fn admin_service(namespace: &str) -> Service {
    Service {
        metadata: meta(ADMIN_SERVICE_NAME, Some(namespace)),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector_labels()),
            ports: Some(vec![ServicePort {
                name: Some(ADMIN_PORT_NAME.into()),
                port: ADMIN_PORT,
                target_port: Some(IntOrString::String(ADMIN_PORT_NAME.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The `Link` CRD, from its YAML (anchors expanded), with install's labels added.
pub(crate) fn link_crd() -> serde_json::Value {
    crd(LINK_CRD_YAML)
}

/// The ServiceExport and ServiceImport CRDs, as [`link_crd`].
pub(crate) fn mcs_crds() -> [serde_json::Value; 2] {
    [
        crd(crate::mcs::SERVICE_EXPORT_CRD_YAML),
        crd(crate::mcs::SERVICE_IMPORT_CRD_YAML),
    ]
}

/// The published ClusterProfile CRD, as [`link_crd`].
pub(crate) fn cluster_profile_crd() -> serde_json::Value {
    crd(service_mirror_api::clusterprofile::CLUSTER_PROFILE_CRD_YAML)
}

/// The About API's ClusterProperty CRD (whose `id.k8s.io` names the cluster for MCS),
/// as [`link_crd`].
pub(crate) fn cluster_property_crd() -> serde_json::Value {
    crd(crate::mcs::startup::CLUSTER_PROPERTY_CRD_YAML)
}

fn crd(yaml: &str) -> serde_json::Value {
    let mut crd: serde_json::Value =
        serde_saphyr::from_str(yaml).expect("an embedded CRD is valid YAML");
    let crd_labels = crd["metadata"]
        .as_object_mut()
        .expect("the CRD has metadata")
        .entry("labels")
        .or_insert_with(|| serde_json::json!({}));
    for (k, v) in labels() {
        crd_labels[k] = v.into();
    }
    crd
}

/// What `install` prints.
pub(crate) struct Install<'a> {
    /// The controller's namespace.
    pub namespace: &'a str,
    /// Three replicas and a PodDisruptionBudget.
    pub ha: bool,
    /// The controller's image.
    pub image: &'a str,
    /// Whether the Link CRD is printed.
    pub link_crd: bool,
    /// Whether the MCS CRDs are printed.
    pub mcs_crds: bool,
    /// Whether the ClusterProperty CRD is printed.
    pub cluster_property_crd: bool,
    /// Whether the ClusterProfile CRD is printed.
    pub cluster_profile_crd: bool,
}

/// The local-side manifests, in apply order: the CRDs (unless left out), Namespace,
/// ServiceAccount, ClusterRole, ClusterRoleBinding, Role, RoleBinding, the admin
/// Service, Deployment and, with `ha`, a PodDisruptionBudget.
pub(crate) fn install_manifests(install: &Install<'_>) -> Vec<serde_json::Value> {
    let Install {
        namespace,
        ha,
        image,
        link_crd: with_crd,
        mcs_crds: with_mcs_crds,
        cluster_property_crd: with_cluster_property_crd,
        cluster_profile_crd: with_cluster_profile_crd,
    } = *install;
    let cluster_role = cluster_role_name(namespace);
    let ns = Namespace {
        metadata: meta(namespace, None),
        ..Default::default()
    };
    let sa = ServiceAccount {
        metadata: meta(NAME, Some(namespace)),
        ..Default::default()
    };
    let cr = ClusterRole {
        metadata: meta(&cluster_role, None),
        // MCS permissions even without our CRDs: another implementation's may be there.
        // The local networks' reads (ServiceCIDRs, Nodes): the address policy refuses
        // gateway addresses in the local service and pod CIDRs with no flag.
        rules: Some(
            policy_rules(CLUSTER_RULES)
                .into_iter()
                .chain(policy_rules(MCS_RULES))
                .chain(policy_rules(LOCAL_NETWORK_RULES))
                .collect(),
        ),
        ..Default::default()
    };
    let crb = ClusterRoleBinding {
        metadata: meta(&cluster_role, None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: cluster_role.clone(),
        },
        subjects: subjects(namespace),
    };
    // Link permissions even without our CRD: Linkerd's may be installed, or come later.
    let mut namespace_rules = policy_rules(NAMESPACE_RULES);
    namespace_rules.extend(policy_rules(LINK_RULES));
    // ClusterProfile permissions whatever the source: `--link-source` alone enables it.
    namespace_rules.extend(policy_rules(CLUSTER_PROFILE_RULES));
    let role = Role {
        metadata: meta(NAME, Some(namespace)),
        rules: Some(namespace_rules),
    };
    let rb = RoleBinding {
        metadata: meta(NAME, Some(namespace)),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: NAME.into(),
        },
        subjects: subjects(namespace),
    };
    let to_value =
        |r: serde_json::Result<serde_json::Value>| r.expect("Kubernetes objects serialise to JSON");
    let mut docs: Vec<serde_json::Value> = with_crd.then(link_crd).into_iter().collect();
    if with_mcs_crds {
        docs.extend(mcs_crds());
    }
    if with_cluster_property_crd {
        docs.push(cluster_property_crd());
    }
    if with_cluster_profile_crd {
        docs.push(cluster_profile_crd());
    }
    docs.extend([
        to_value(serde_json::to_value(ns)),
        to_value(serde_json::to_value(sa)),
        to_value(serde_json::to_value(cr)),
        to_value(serde_json::to_value(crb)),
        to_value(serde_json::to_value(role)),
        to_value(serde_json::to_value(rb)),
        to_value(serde_json::to_value(admin_service(namespace))),
        to_value(serde_json::to_value(deployment(namespace, ha, image))),
    ]);
    if ha {
        let pdb = PodDisruptionBudget {
            metadata: meta(NAME, Some(namespace)),
            spec: Some(PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(1)),
                selector: Some(LabelSelector {
                    match_labels: Some(selector_labels()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        docs.push(to_value(serde_json::to_value(pdb)));
    }
    docs
}

/// Prints the local-side manifests.
pub(crate) fn run(args: InstallArgs) -> anyhow::Result<()> {
    check_names(&args.namespace, NAME)?;
    anyhow::ensure!(
        !args.image.is_empty() && !args.image.contains(char::is_whitespace),
        "invalid image {:?}",
        args.image
    );
    let install = Install {
        namespace: &args.namespace,
        ha: args.ha,
        image: &args.image,
        link_crd: args.link_crd,
        mcs_crds: args.mcs_crds,
        cluster_property_crd: args.cluster_property_crd,
        cluster_profile_crd: args.cluster_profile_crd,
    };
    let mut docs = install_manifests(&install);
    if args.clusterset_dns {
        clusterset_dns::add(&mut docs, &args.namespace);
    }
    args.output.print(&docs).context("printing the manifests")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::output::OutputFormat;
    use serde_json::json;

    const IMAGE: &str = "example.org/sm:1";

    fn manifests(namespace: &str, ha: bool) -> Vec<serde_json::Value> {
        install_manifests(&Install {
            namespace,
            ha,
            image: IMAGE,
            link_crd: true,
            mcs_crds: true,
            cluster_property_crd: true,
            cluster_profile_crd: false,
        })
    }

    fn by_kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
        let found: Vec<_> = docs.iter().filter(|d| d["kind"] == kind).collect();
        assert_eq!(found.len(), 1, "exactly one {kind}");
        found[0]
    }

    fn container(docs: &[serde_json::Value]) -> &serde_json::Value {
        let containers = &by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers.as_array().unwrap().len(), 1);
        &containers[0]
    }

    #[test]
    fn manifests_come_in_apply_order() {
        let kinds = |ha| {
            manifests("mc", ha)
                .iter()
                .map(|d| d["kind"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        let base = [
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Service",
            "Deployment",
        ];
        assert_eq!(kinds(false), base);
        let mut with_pdb = base.to_vec();
        with_pdb.push("PodDisruptionBudget");
        assert_eq!(kinds(true), with_pdb);
        for d in manifests("mc", true) {
            assert!(d["apiVersion"].is_string(), "{d}");
            assert!(d["metadata"]["name"].is_string(), "{d}");
            let cluster_scoped = matches!(
                d["kind"].as_str().unwrap(),
                "CustomResourceDefinition" | "Namespace" | "ClusterRole" | "ClusterRoleBinding"
            );
            assert_eq!(d["metadata"]["namespace"].is_null(), cluster_scoped, "{d}");
            if !cluster_scoped {
                assert_eq!(d["metadata"]["namespace"], "mc", "{d}");
            }
        }
    }

    #[test]
    fn cluster_role_has_exactly_the_cluster_wide_rules() {
        let docs = manifests("mc", false);
        let role = by_kind(&docs, "ClusterRole");
        assert_eq!(role["apiVersion"], "rbac.authorization.k8s.io/v1");
        assert_eq!(
            role["rules"],
            json!([
                {"apiGroups": [""], "resources": ["services", "endpoints"],
                 "verbs": ["get", "list", "watch", "create", "update", "delete"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                 "verbs": ["get", "list", "watch", "create", "update", "delete"]},
                {"apiGroups": [""], "resources": ["namespaces"],
                 "verbs": ["create"]},
                {"apiGroups": ["events.k8s.io"], "resources": ["events"],
                 "verbs": ["create", "patch"]},
                {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceexports"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceexports/status"],
                 "verbs": ["patch"]},
                {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceimports"],
                 "verbs": ["list", "watch", "create", "update", "delete"]},
                {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceimports/status"],
                 "verbs": ["patch"]},
                {"apiGroups": ["about.k8s.io"], "resources": ["clusterproperties"],
                 "verbs": ["get"]},
                {"apiGroups": ["networking.k8s.io"], "resources": ["servicecidrs"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": [""], "resources": ["nodes"],
                 "verbs": ["list", "watch"]},
            ])
        );
        assert!(role.get("aggregationRule").is_none());
    }

    #[test]
    fn role_has_exactly_the_namespace_rules() {
        let docs = manifests("mc", false);
        let role = by_kind(&docs, "Role");
        assert_eq!(role["metadata"]["namespace"], "mc");
        assert_eq!(
            role["rules"],
            json!([
                {"apiGroups": [""], "resources": ["secrets"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                 "verbs": ["get", "list", "create", "update", "patch", "delete"]},
                {"apiGroups": ["multicluster.linkerd.io"], "resources": ["links"],
                 "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["multicluster.linkerd.io"], "resources": ["links/status"],
                 "verbs": ["patch"]},
                {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["clusterprofiles"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["clusterprofiles/status"],
                 "verbs": ["patch"]},
            ])
        );
    }

    #[test]
    fn the_crds_come_first_and_each_can_be_left_out_keeping_their_rules() {
        let with = manifests("mc", false);
        assert_eq!(with[0]["kind"], "CustomResourceDefinition");
        assert_eq!(with[0]["metadata"]["name"], "links.multicluster.linkerd.io");
        assert_eq!(
            with[0]["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "service-mirror"
        );
        let only = |link_crd, mcs_crds, cluster_property_crd| {
            install_manifests(&Install {
                namespace: "mc",
                ha: false,
                image: IMAGE,
                link_crd,
                mcs_crds,
                cluster_property_crd,
                cluster_profile_crd: false,
            })
        };
        let crd_names = |docs: &[serde_json::Value]| -> Vec<String> {
            docs.iter()
                .filter(|d| d["kind"] == "CustomResourceDefinition")
                .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
                .collect()
        };
        let without = only(false, false, false);
        assert!(crd_names(&without).is_empty());
        assert_eq!(&with[4..], &without[..], "nothing else differs");
        assert_eq!(
            crd_names(&only(false, true, false)),
            [
                "serviceexports.multicluster.x-k8s.io",
                "serviceimports.multicluster.x-k8s.io",
            ]
        );
        // The upstream MCS CRDs do not include the About API's: `--mcs-crds=false`
        // (another implementation's MCS CRDs) still names the cluster.
        let mcs_crds_off = only(true, false, true);
        assert_eq!(
            crd_names(&mcs_crds_off),
            [
                "links.multicluster.linkerd.io",
                "clusterproperties.about.k8s.io"
            ]
        );
        assert_eq!(&mcs_crds_off[2..], &without[..], "the same RBAC either way");
        assert_eq!(&only(false, true, true)[3..], &without[..]);
        // The ClusterProfile CRD only when asked for, after the others, as published.
        let profiles = install_manifests(&Install {
            namespace: "mc",
            ha: false,
            image: IMAGE,
            link_crd: false,
            mcs_crds: false,
            cluster_property_crd: false,
            cluster_profile_crd: true,
        });
        assert_eq!(
            crd_names(&profiles),
            ["clusterprofiles.multicluster.x-k8s.io"]
        );
        assert_eq!(&profiles[1..], &without[..], "the same RBAC either way");
        assert_eq!(profiles[0]["spec"]["versions"][0]["name"], "v1alpha1");
        assert_eq!(
            profiles[0]["metadata"]["annotations"]["controller-gen.kubebuilder.io/version"],
            "v0.20.0",
            "upstream's, unchanged"
        );
    }

    #[test]
    fn the_link_crd_serves_three_versions_with_v1alpha3_stored_and_a_status_subresource() {
        let crd = link_crd();
        assert_eq!(crd["apiVersion"], "apiextensions.k8s.io/v1");
        let spec = &crd["spec"];
        assert_eq!(spec["group"], "multicluster.linkerd.io");
        assert_eq!(spec["scope"], "Namespaced");
        assert_eq!(
            spec["names"],
            json!({"plural": "links", "singular": "link", "kind": "Link", "listKind": "LinkList"})
        );
        let versions = spec["versions"].as_array().unwrap();
        let names: Vec<&str> = versions
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["v1alpha1", "v1alpha2", "v1alpha3"]);
        for v in versions {
            assert_eq!(v["served"], true, "{}", v["name"]);
            assert_eq!(v["storage"], v["name"] == "v1alpha3", "{}", v["name"]);
            assert_eq!(v["subresources"], json!({"status": {}}), "{}", v["name"]);
            // No conversion webhook: the versions share one schema.
            assert_eq!(v["schema"], versions[2]["schema"]);
        }
        let props = &versions[2]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for field in [
            "targetClusterName",
            "targetClusterDomain",
            "targetClusterLinkerdNamespace",
            "clusterCredentialsSecret",
            "gatewayAddress",
            "gatewayPort",
            "gatewayIdentity",
        ] {
            assert_eq!(props[field]["type"], "string", "{field}");
        }
        for field in ["excludedAnnotations", "excludedLabels"] {
            assert_eq!(props[field]["items"]["type"], "string", "{field}");
        }
        for field in [
            "selector",
            "remoteDiscoverySelector",
            "federatedServiceSelector",
        ] {
            assert_eq!(props[field]["type"], "object", "{field}");
            assert_eq!(props[field], props["selector"], "{field}");
        }
        let probe = &props["probeSpec"]["properties"];
        assert_eq!(probe["timeout"]["default"], "30s");
        assert_eq!(probe["failureThreshold"]["default"], "3");
        for field in ["path", "port", "period", "timeout", "failureThreshold"] {
            assert_eq!(probe[field]["type"], "string", "{field}");
            assert!(
                probe[field].get("format").is_none(),
                "{field}: checked by the controller"
            );
        }
    }

    /// Structural: every schema node has a type, except under an open one.
    fn assert_structural(node: &serde_json::Value, path: &str) {
        if node["x-kubernetes-preserve-unknown-fields"] == true {
            return;
        }
        assert!(node["type"].is_string(), "{path} has no type");
        if let Some(props) = node["properties"].as_object() {
            for (k, v) in props {
                assert_structural(v, &format!("{path}.{k}"));
            }
        }
        if node.get("items").is_some() {
            assert_structural(&node["items"], &format!("{path}[]"));
        }
    }

    #[test]
    fn the_link_crd_schema_is_structural_and_open_only_in_match_labels() {
        let crd = link_crd();
        let schema = &crd["spec"]["versions"][2]["schema"]["openAPIV3Schema"];
        assert_structural(schema, "");
        let text = serde_json::to_string(schema).unwrap();
        let open = text.matches("x-kubernetes-preserve-unknown-fields").count();
        // Once per selector, in matchLabels (as Linkerd's).
        assert_eq!(open, 3, "{text}");
        let status = &schema["properties"]["status"]["properties"];
        let cond =
            &status["mirrorServices"]["items"]["properties"]["conditions"]["items"]["properties"];
        for field in [
            "type",
            "status",
            "lastTransitionTime",
            "lastProbeTime",
            "reason",
            "message",
        ] {
            assert!(cond[field]["type"].is_string(), "{field}");
        }
        assert_eq!(
            cond["localRef"]["properties"]["namespace"]["type"],
            "string"
        );
        assert_eq!(status["federatedServices"], status["mirrorServices"]);
    }

    #[test]
    fn bindings_grant_the_roles_to_the_service_account_only() {
        let docs = manifests("mc", false);
        let subject =
            json!([{"kind": "ServiceAccount", "name": "service-mirror", "namespace": "mc"}]);
        let crb = by_kind(&docs, "ClusterRoleBinding");
        assert_eq!(
            crb["roleRef"],
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                   "name": by_kind(&docs, "ClusterRole")["metadata"]["name"]})
        );
        assert_eq!(crb["subjects"], subject);
        let rb = by_kind(&docs, "RoleBinding");
        assert_eq!(
            rb["roleRef"],
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "service-mirror"})
        );
        assert_eq!(rb["subjects"], subject);
        assert_eq!(
            by_kind(&docs, "ServiceAccount")["metadata"]["name"],
            "service-mirror"
        );
        assert_eq!(
            by_kind(&docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"],
            "service-mirror"
        );
    }

    #[test]
    fn two_namespaces_never_share_a_cluster_binding() {
        let a = manifests("a", false);
        let b = manifests("b", false);
        for kind in ["ClusterRole", "ClusterRoleBinding"] {
            assert_ne!(
                by_kind(&a, kind)["metadata"]["name"],
                by_kind(&b, kind)["metadata"]["name"]
            );
        }
        // Nor with the remote-side names of `allow` (service-mirror:<ns>:<account>).
        let remote = super::super::allow::cluster_role_name("a", "service-mirror");
        assert_ne!(
            by_kind(&a, "ClusterRole")["metadata"]["name"],
            remote.as_str()
        );
    }

    #[test]
    fn container_is_locked_down() {
        let docs = manifests("mc", false);
        let c = container(&docs);
        assert_eq!(
            c["securityContext"],
            json!({
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            })
        );
        let pod = &by_kind(&docs, "Deployment")["spec"]["template"]["spec"];
        assert_eq!(
            pod["securityContext"],
            json!({
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            })
        );
        assert!(pod.get("hostNetwork").is_none());
        let resources = &c["resources"];
        for key in ["requests", "limits"] {
            assert!(resources[key]["cpu"].is_string(), "{resources}");
            assert!(resources[key]["memory"].is_string(), "{resources}");
        }
    }

    #[test]
    fn container_runs_the_controller_with_probes_on_the_admin_port() {
        let docs = manifests("mc", false);
        let c = container(&docs);
        assert_eq!(c["image"], IMAGE);
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(args, ["run", "--namespace", "mc", "--log-format", "json"]);
        assert_eq!(
            c["env"],
            json!([{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])
        );
        assert_eq!(
            c["ports"],
            json!([{"name": "mirror-admin", "containerPort": 9999, "protocol": "TCP"}])
        );
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/live");
        assert_eq!(c["livenessProbe"]["httpGet"]["port"], "mirror-admin");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/ready");
        assert_eq!(c["readinessProbe"]["httpGet"]["port"], "mirror-admin");
        let annotations =
            &by_kind(&docs, "Deployment")["spec"]["template"]["metadata"]["annotations"];
        assert_eq!(annotations["prometheus.io/scrape"], "true");
        assert_eq!(annotations["prometheus.io/port"], "9999");
        assert_eq!(annotations["prometheus.io/path"], "/metrics");
    }

    #[test]
    fn the_admin_service_reaches_every_replica_on_the_admin_port() {
        for ha in [false, true] {
            let docs = manifests("mc", ha);
            let svc = by_kind(&docs, "Service");
            assert_eq!(svc["apiVersion"], "v1");
            assert_eq!(svc["metadata"]["name"], "service-mirror-admin");
            assert_eq!(svc["metadata"]["namespace"], "mc");
            let d = by_kind(&docs, "Deployment");
            assert_eq!(
                svc["spec"]["selector"],
                d["spec"]["selector"]["matchLabels"]
            );
            assert_eq!(svc["spec"]["type"], "ClusterIP");
            assert_eq!(
                svc["spec"]["ports"],
                json!([{"name": "mirror-admin", "port": 9999, "targetPort": "mirror-admin",
                        "protocol": "TCP"}])
            );
            // The port the scrape annotation names is the one the Service targets.
            let port = &container(&docs)["ports"][0];
            assert_eq!(port["name"], svc["spec"]["ports"][0]["targetPort"]);
            assert_eq!(
                d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"],
                port["containerPort"].to_string()
            );
        }
    }

    #[test]
    fn the_args_parse_as_a_run_command() {
        let docs = manifests("mc", false);
        let mut argv = vec!["service-mirror".to_string()];
        argv.extend(
            container(&docs)["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string()),
        );
        let cli =
            crate::cli::Command::try_parse_from(argv).expect("the Deployment's args are valid");
        // The probes and the scrape annotation use run's default admin address.
        let debug = format!("{cli:?}");
        assert!(
            debug.contains(&format!("metrics_addr: \":{ADMIN_PORT}\"")),
            "{debug}"
        );
    }

    #[test]
    fn selector_matches_the_pod_template() {
        for ha in [false, true] {
            let docs = manifests("mc", ha);
            let d = by_kind(&docs, "Deployment");
            let selector = d["spec"]["selector"]["matchLabels"].as_object().unwrap();
            let labels = &d["spec"]["template"]["metadata"]["labels"];
            assert!(!selector.is_empty());
            for (k, v) in selector {
                assert_eq!(&labels[k], v, "{k}");
            }
        }
    }

    #[test]
    fn ha_adds_replicas_anti_affinity_and_a_disruption_budget() {
        let single = manifests("mc", false);
        let d = by_kind(&single, "Deployment");
        assert_eq!(d["spec"]["replicas"], 1);
        assert!(d["spec"]["template"]["spec"].get("affinity").is_none());
        assert!(!single.iter().any(|d| d["kind"] == "PodDisruptionBudget"));

        let ha = manifests("mc", true);
        let d = by_kind(&ha, "Deployment");
        let selector = d["spec"]["selector"].clone();
        assert_eq!(d["spec"]["replicas"], 3);
        assert_eq!(
            d["spec"]["template"]["spec"]["affinity"],
            json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": selector,
                    "topologyKey": "kubernetes.io/hostname",
                },
            }]}})
        );
        let pdb = by_kind(&ha, "PodDisruptionBudget");
        assert_eq!(pdb["apiVersion"], "policy/v1");
        assert_eq!(pdb["metadata"]["namespace"], "mc");
        assert_eq!(pdb["spec"]["minAvailable"], 1);
        assert_eq!(pdb["spec"]["selector"], selector);
        // Nothing else differs: same RBAC, same container.
        for kind in ["ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"] {
            assert_eq!(by_kind(&single, kind), by_kind(&ha, kind), "{kind}");
        }
        assert_eq!(container(&single), container(&ha));
    }

    #[test]
    fn defaults_and_flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: InstallArgs,
        }
        let args = Cli::try_parse_from(["install"]).unwrap().args;
        assert_eq!(args.namespace, "linkerd-multicluster");
        assert!(!args.ha);
        assert_eq!(
            args.image,
            format!(
                "ghcr.io/service-mirror/service-mirror:{}",
                env!("CARGO_PKG_VERSION")
            )
        );
        assert_eq!(args.output.output, OutputFormat::Yaml);
        assert!(args.link_crd);
        let args = Cli::try_parse_from([
            "install",
            "--namespace",
            "x",
            "--ha",
            "--image",
            "i:2",
            "-o",
            "json",
            "--link-crd=false",
        ])
        .unwrap()
        .args;
        assert_eq!(args.namespace, "x");
        assert!(args.ha);
        assert!(!args.link_crd);
        assert_eq!(args.image, "i:2");
        assert_eq!(args.output.output, OutputFormat::Json);
    }
}
