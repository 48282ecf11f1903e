//! `service-mirror unlink`: removes, from the LOCAL cluster, what links a remote
//! cluster (its `Link` and credentials Secret, or its link Secret; and the credentials
//! Secret of Linkerd's destination that `link --format link` printed with it) and every mirror
//! of it, or with `--dry-run` only lists them.
//!
//! ```text
//! service-mirror unlink --cluster-name east --context west [--dry-run]
//! ```
//!
//! Only objects carrying both mirror labels for the cluster are mirrors, and only
//! Secrets of type `mirror.linkerd.io/remote-kubeconfig` labelled
//! `multicluster.linkerd.io/cluster-name=<cluster>` in `--linkerd-namespace` with the
//! credentials of a link Secret that goes are the destination's (see
//! [`destination_objects`]): nothing else is ever deleted. Deletes carry a uid
//! precondition (an object replaced since the list is left alone), and go Link,
//! Secrets, then mirrors: the controller stops the link before its mirrors go, so it
//! never recreates them.

use super::allow::{DEFAULT_NAMESPACE, DEFAULT_SERVICE_ACCOUNT};
use super::args::KubeArgs;
use super::link_destination::{
    DEFAULT_LINKERD_NAMESPACE, DESTINATION_CLUSTER_NAME_LABEL, is_destination_credentials_of,
};
use crate::links::LinkResource;
use anyhow::Context;
use k8s_openapi::api::core::v1::{Endpoints, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Resource, ResourceExt};
use service_mirror_core::labels::{
    LINK_CLUSTER_NAME_ANNOTATION, LINK_KUBECONFIG_KEY, LINK_SECRET_TYPE, owner_selector,
    slice_owner_selector,
};
use std::fmt;

/// Arguments of `unlink`.
#[derive(Debug, clap::Args)]
pub struct UnlinkArgs {
    /// Name of the remote cluster to unlink.
    #[arg(long, env = "SERVICE_MIRROR_CLUSTER_NAME")]
    pub cluster_name: String,
    /// Namespace of the controller, where its Links and link Secrets are.
    #[arg(
        short,
        long,
        env = "SERVICE_MIRROR_NAMESPACE",
        default_value = DEFAULT_NAMESPACE
    )]
    pub namespace: String,
    /// Namespace of Linkerd's control plane, where `link --format link` (as Linkerd's
    /// `link-gen`) put the destination's credentials Secret.
    #[arg(
        long,
        env = "SERVICE_MIRROR_LINKERD_NAMESPACE",
        default_value = DEFAULT_LINKERD_NAMESPACE
    )]
    pub linkerd_namespace: String,
    /// List what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The LOCAL cluster (where the mirrors are).
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// Kinds `unlink` deletes, in deletion order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A Linkerd `Link`.
    Link,
    /// A link or credentials Secret.
    Secret,
    /// One of our EndpointSlices of a mirror.
    EndpointSlice,
    /// A mirror's Endpoints.
    Endpoints,
    /// A mirror Service.
    Service,
}

/// One object `unlink` found: kind, namespace, name and uid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Found {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid, the delete's precondition.
    pub uid: String,
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}/{}/{}", self.kind, self.namespace, self.name)
    }
}

fn found<K: Resource>(kind: Kind, o: &K) -> Found {
    Found {
        kind,
        namespace: o.meta().namespace.clone().unwrap_or_default(),
        name: o.meta().name.clone().unwrap_or_default(),
        uid: o.meta().uid.clone().unwrap_or_default(),
    }
}

/// What links `cluster` among `links` and `secrets` of the controller namespace: the
/// Links named or targeting it, the credentials Secrets only they use, and the link
/// Secrets annotated with it. Pure.
pub fn link_objects(cluster: &str, links: &[LinkResource], secrets: &[Secret]) -> Vec<Found> {
    let targets = |l: &LinkResource| {
        l.name_any() == cluster || l.spec.target_cluster_name.as_deref() == Some(cluster)
    };
    let (ours, others): (Vec<&LinkResource>, Vec<&LinkResource>) =
        links.iter().partition(|l| targets(l));
    let mut out: Vec<Found> = ours.iter().map(|l| found(Kind::Link, *l)).collect();
    for s in secrets
        .iter()
        .filter(|s| s.type_.as_deref() == Some(LINK_SECRET_TYPE))
    {
        let name = s.name_any();
        let credentials_of =
            |l: &&LinkResource| l.spec.cluster_credentials_secret.as_deref() == Some(name.as_str());
        let annotated = s
            .annotations()
            .get(LINK_CLUSTER_NAME_ANNOTATION)
            .is_some_and(|c| c == cluster);
        // A Secret another Link still reads stays, even if this cluster's Link named it.
        let ours_only = ours.iter().any(credentials_of) && !others.iter().any(credentials_of);
        if annotated || ours_only {
            out.push(found(Kind::Secret, s));
        }
    }
    out
}

/// The destination credentials Secrets of `cluster` among `destination` (labelled
/// for it, Linkerd's type) that one `link` run printed beside a Secret of `linked`
/// (the link or credentials Secrets [`link_objects`] chose): the same `kubeconfig`
/// bytes. A label and a type prove nothing: Linkerd's own `link-gen` writes that shape
/// too, and a Linkerd link of the same cluster beside ours (other credentials) must
/// keep its Secret. In the controller namespace (`--linkerd-namespace` =
/// `--namespace`) only what [`link_objects`] chose goes: it keeps a Secret another
/// Link still reads. Pure.
pub fn destination_objects(
    cluster: &str,
    namespace: &str,
    destination: &[Secret],
    linked: &[&Secret],
) -> Vec<Found> {
    let kubeconfig = |s: &Secret| {
        s.data
            .as_ref()
            .and_then(|d| d.get(LINK_KUBECONFIG_KEY))
            .map(|b| b.0.clone())
    };
    let printed: Vec<Vec<u8>> = linked.iter().filter_map(|s| kubeconfig(s)).collect();
    destination
        .iter()
        .filter(|s| is_destination_credentials_of(s, cluster))
        .filter(|s| {
            if s.namespace().as_deref() == Some(namespace) {
                return linked.iter().any(|l| l.uid() == s.uid());
            }
            kubeconfig(s).is_some_and(|k| printed.contains(&k))
        })
        .map(|s| found(Kind::Secret, s))
        .collect()
}

/// Lists everything that links `cluster` or mirrors it, in deletion order: what
/// [`link_objects`] finds in `namespace`, the destination credentials Secrets in
/// `linkerd_namespace`, and the mirrors.
pub async fn find(
    client: &kube::Client,
    namespace: &str,
    linkerd_namespace: &str,
    cluster: &str,
) -> anyhow::Result<Vec<Found>> {
    let links = match Api::<LinkResource>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
    {
        Ok(l) => l.items,
        // No Link CRD: no Links.
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => return Err(e).context("listing Links"),
    };
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing Secrets in {namespace}"))?
        .items;
    let mut out = link_objects(cluster, &links, &secrets);
    let linked: Vec<&Secret> = secrets
        .iter()
        .filter(|s| {
            out.iter()
                .any(|o| o.kind == Kind::Secret && Some(&o.uid) == s.uid().as_ref())
        })
        .collect();
    // Selected by the label (a namespace that does not exist lists nothing); the type
    // and the credentials are checked on each. Only asked when a link of the cluster
    // was found (nothing else can prove a destination Secret ours), and a refusal is
    // said, not fatal: the link and its mirrors still go.
    if !linked.is_empty() {
        let labelled =
            ListParams::default().labels(&format!("{DESTINATION_CLUSTER_NAME_LABEL}={cluster}"));
        match Api::<Secret>::namespaced(client.clone(), linkerd_namespace)
            .list(&labelled)
            .await
        {
            Ok(list) => {
                let chosen = destination_objects(cluster, namespace, &list.items, &linked);
                for s in &list.items {
                    if !chosen.iter().any(|c| Some(&c.uid) == s.uid().as_ref())
                        && is_destination_credentials_of(s, cluster)
                    {
                        eprintln!(
                            "left in place: Secret {linkerd_namespace}/{} (labelled for {cluster}, \
                             but with other credentials than this link's: not printed by the \
                             same `link` run)",
                            s.name_any()
                        );
                    }
                }
                out.extend(chosen);
            }
            Err(kube::Error::Api(s)) if s.code == 403 => eprintln!(
                "not listed: destination credentials Secrets in {linkerd_namespace} ({}); \
                 delete cluster-credentials-{cluster} there by hand if `link` printed it",
                s.message
            ),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("listing destination credentials Secrets in {linkerd_namespace}")
                });
            }
        }
    }
    let owned = ListParams::default().labels(&owner_selector(cluster));
    let slices = ListParams::default().labels(&slice_owner_selector(cluster));
    for s in &Api::<EndpointSlice>::all(client.clone())
        .list(&slices)
        .await
        .context("listing mirror EndpointSlices")?
        .items
    {
        out.push(found(Kind::EndpointSlice, s));
    }
    for e in &Api::<Endpoints>::all(client.clone())
        .list(&owned)
        .await
        .context("listing mirror Endpoints")?
        .items
    {
        out.push(found(Kind::Endpoints, e));
    }
    for s in &Api::<Service>::all(client.clone())
        .list(&owned)
        .await
        .context("listing mirror Services")?
        .items
    {
        out.push(found(Kind::Service, s));
    }
    out.sort();
    // One Secret may be both (`--link-namespace` = `--linkerd-namespace`).
    out.dedup();
    Ok(out)
}

/// Deletes `o` if its uid is still the listed one; already gone counts as done.
async fn delete(client: &kube::Client, o: &Found) -> anyhow::Result<()> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(o.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let c = client.clone();
    let ns = &o.namespace;
    let result = match o.kind {
        Kind::Link => Api::<LinkResource>::namespaced(c, ns)
            .delete(&o.name, &dp)
            .await
            .map(drop),
        Kind::Secret => Api::<Secret>::namespaced(c, ns)
            .delete(&o.name, &dp)
            .await
            .map(drop),
        Kind::EndpointSlice => Api::<EndpointSlice>::namespaced(c, ns)
            .delete(&o.name, &dp)
            .await
            .map(drop),
        Kind::Endpoints => Api::<Endpoints>::namespaced(c, ns)
            .delete(&o.name, &dp)
            .await
            .map(drop),
        Kind::Service => Api::<Service>::namespaced(c, ns)
            .delete(&o.name, &dp)
            .await
            .map(drop),
    };
    match result {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => anyhow::bail!(
            "{o} was replaced since it was listed (another uid): not deleted; run unlink again"
        ),
        Err(e) => Err(e).with_context(|| format!("deleting {o}")),
    }
}

/// The hint about the remote side, which `unlink` does not touch.
fn remote_hint(cluster: &str) -> String {
    format!(
        "The remote cluster {cluster} still holds what `service-mirror allow` made there \
         (Namespace, ServiceAccount {DEFAULT_SERVICE_ACCOUNT} and its token Secret, a ClusterRole \
         and ClusterRoleBinding). If nothing else links it, remove them on the remote with:\n  \
         service-mirror allow [--namespace NS --service-account-name SA] | kubectl --context <remote> delete -f -"
    )
}

/// Lists, then (unless `--dry-run`) deletes, what links and mirrors the cluster.
pub async fn run(args: UnlinkArgs) -> anyhow::Result<()> {
    let client = args
        .kube
        .client()
        .await
        .context("connecting to the local cluster")?;
    let objects = find(
        &client,
        &args.namespace,
        &args.linkerd_namespace,
        &args.cluster_name,
    )
    .await?;
    for o in &objects {
        println!("{o}");
    }
    if !objects
        .iter()
        .any(|o| matches!(o.kind, Kind::Link | Kind::Secret))
    {
        eprintln!(
            "no Link nor link Secret of cluster {} in namespace {}",
            args.cluster_name, args.namespace
        );
    }
    if args.dry_run {
        eprintln!("dry run: {} objects would be deleted", objects.len());
        eprintln!("{}", remote_hint(&args.cluster_name));
        return Ok(());
    }
    let mut failures = Vec::new();
    for o in &objects {
        if let Err(e) = delete(&client, o).await {
            failures.push(format!("{e:#}"));
        }
    }
    anyhow::ensure!(
        failures.is_empty(),
        "{} of {} objects not deleted:\n{}",
        failures.len(),
        objects.len(),
        failures.join("\n")
    );
    eprintln!(
        "deleted {} objects of cluster {}",
        objects.len(),
        args.cluster_name
    );
    eprintln!("{}", remote_hint(&args.cluster_name));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn link(name: &str, target: &str, secret: &str) -> LinkResource {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "mc", "uid": format!("u-{name}")},
            "spec": {"targetClusterName": target, "clusterCredentialsSecret": secret},
        }))
        .unwrap()
    }

    fn secret(name: &str, cluster: Option<&str>, type_: &str) -> Secret {
        let annotations = cluster
            .map(|c| json!({"mirror.linkerd.io/cluster-name": c}))
            .unwrap_or(json!({}));
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "mc", "uid": format!("u-{name}"),
                         "annotations": annotations},
            "type": type_,
        }))
        .unwrap()
    }

    const T: &str = "mirror.linkerd.io/remote-kubeconfig";

    #[test]
    fn finds_the_link_its_secret_and_annotated_secrets_only() {
        let links = [
            link("east", "east", "cluster-credentials-east"),
            link("west", "west", "cluster-credentials-west"),
        ];
        let secrets = [
            secret("cluster-credentials-east", None, T),
            secret("cluster-credentials-west", None, T),
            secret("old-east", Some("east"), T),
            secret("opaque-east", Some("east"), "Opaque"),
        ];
        let names: Vec<String> = link_objects("east", &links, &secrets)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            names,
            [
                "Link/mc/east",
                "Secret/mc/cluster-credentials-east",
                "Secret/mc/old-east"
            ]
        );
    }

    #[test]
    fn a_link_found_by_target_and_a_shared_secret_kept() {
        let links = [
            link("to-east", "east", "shared"),
            link("other", "north", "shared"),
        ];
        let secrets = [secret("shared", None, T)];
        let found = link_objects("east", &links, &secrets);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].to_string(), "Link/mc/to-east");
        assert_eq!(found[0].uid, "u-to-east");
        assert!(link_objects("south", &links, &secrets).is_empty());
    }

    #[test]
    fn destination_secrets_go_only_with_the_credentials_of_the_link_that_goes() {
        use k8s_openapi::ByteString;
        let with = |name: &str, ns: &str, cluster: &str, type_: &str, kc: &str| -> Secret {
            let mut s: Secret = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns, "uid": format!("u-{ns}-{name}"),
                             "labels": {"multicluster.linkerd.io/cluster-name": cluster}},
                "type": type_,
            }))
            .unwrap();
            s.data = Some([("kubeconfig".to_string(), ByteString(kc.as_bytes().to_vec()))].into());
            s
        };
        let ours = with("cluster-credentials-east", "mc", "east", T, "ours");
        let destination = [
            // Printed by the same `link` run: same credentials.
            with("cluster-credentials-east", "linkerd", "east", T, "ours"),
            // Linkerd's own link-gen of east, beside ours: other credentials, kept.
            with("linkerd-made-east", "linkerd", "east", T, "linkerd's"),
            with("cluster-credentials-west", "linkerd", "west", T, "ours"),
            with("look-alike", "linkerd", "east", "Opaque", "ours"),
        ];
        let names =
            |found: Vec<Found>| -> Vec<String> { found.iter().map(ToString::to_string).collect() };
        assert_eq!(
            names(destination_objects("east", "mc", &destination, &[&ours])),
            ["Secret/linkerd/cluster-credentials-east"]
        );
        // No link Secret of east goes (a `--format secret` link elsewhere, or none):
        // nothing proves any destination Secret ours.
        assert!(destination_objects("east", "mc", &destination, &[]).is_empty());
        // `--linkerd-namespace` = `--namespace`: only what link_objects chose (it keeps
        // a Secret another Link reads), even with the same credentials.
        let shared = with("shared", "mc", "east", T, "ours");
        assert!(
            destination_objects("east", "mc", std::slice::from_ref(&shared), &[&ours]).is_empty()
        );
        assert_eq!(
            names(destination_objects(
                "east",
                "mc",
                std::slice::from_ref(&shared),
                &[&shared]
            )),
            ["Secret/mc/shared"]
        );
    }

    #[test]
    fn deletion_order_is_link_secret_slices_endpoints_services() {
        let mut v = [
            Kind::Service,
            Kind::Endpoints,
            Kind::Link,
            Kind::EndpointSlice,
            Kind::Secret,
        ];
        v.sort();
        assert_eq!(
            v,
            [
                Kind::Link,
                Kind::Secret,
                Kind::EndpointSlice,
                Kind::Endpoints,
                Kind::Service
            ]
        );
    }
}
