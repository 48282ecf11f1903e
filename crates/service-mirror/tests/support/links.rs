//! Links as Linkerd writes them: the CRD, a credentials Secret without annotations, a
//! `Link`, and remote credentials that may read what a Link's mirrors need.

use super::controller::{Controller, kubeconfig_with_rules, link_secret};
use super::{CONVERGE, Env, create_namespace, eventually};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use local_cluster::{Kubeconfig, LocalCluster};
use service_mirror_controller::cli::allow::remote_access_rules;
use service_mirror_controller::links::{LINK_CRD_YAML, LinkResource};
use tokio::sync::OnceCell;

/// Applies our Link CRD to `local` once per test binary and waits until Links can be
/// listed.
pub(crate) async fn link_crd(local: &LocalCluster) {
    static APPLIED: OnceCell<()> = OnceCell::const_new();
    APPLIED
        .get_or_init(|| async {
            let client = local.client().await.unwrap();
            local_cluster::apply_yaml(&client, LINK_CRD_YAML)
                .await
                .expect("apply the Link CRD");
            let links: Api<LinkResource> = Api::namespaced(client, "default");
            eventually("the Link CRD is served", || {
                let links = links.clone();
                async move { links.list(&Default::default()).await.ok() }
            })
            .await;
        })
        .await;
}

/// A kubeconfig on `remote` for a ServiceAccount with exactly what `allow` grants
/// (Services and EndpointSlices read), created in namespace `ns`.
pub(crate) async fn allowed_kubeconfig(remote: &LocalCluster, ns: &str, sa: &str) -> Kubeconfig {
    let rules = remote_access_rules();
    kubeconfig_with_rules(remote, ns, sa, "service-mirror-remote-allowed", rules).await
}

/// A credentials Secret as Linkerd's `link-gen` writes it: the type and the kubeconfig,
/// no annotations.
pub(crate) fn credentials_secret(name: &str, kubeconfig: &str) -> Secret {
    let mut s = link_secret(name, None, Some(kubeconfig));
    s.metadata.annotations = None;
    s
}

/// A Link of `cluster` through the gateway at `addresses:4143`, with Linkerd's default
/// selectors, merged with `extra` (a JSON object of spec fields).
pub(crate) fn link(
    name: &str,
    cluster: &str,
    credentials: &str,
    extra: serde_json::Value,
) -> LinkResource {
    let mut spec = serde_json::json!({
        "targetClusterName": cluster,
        "targetClusterDomain": "cluster.local",
        "targetClusterLinkerdNamespace": "linkerd",
        "clusterCredentialsSecret": credentials,
        "gatewayAddress": "192.0.2.10,192.0.2.11",
        "gatewayPort": "4143",
        "gatewayIdentity": "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local",
        "selector": {"matchLabels": {"mirror.linkerd.io/exported": "true"}},
        "remoteDiscoverySelector": {"matchLabels": {"mirror.linkerd.io/exported": "remote-discovery"}},
        "federatedServiceSelector": {"matchLabels": {"mirror.linkerd.io/federated": "member"}},
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.linkerd.io/v1alpha3",
        "kind": "Link",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

/// One test's world with a controller that links by `Link`s: the CRD applied, a fresh
/// controller namespace, and remote credentials in a Secret there (not yet a Link).
pub(crate) struct LinkWorld {
    pub(crate) env: Env,
    pub(crate) ctl_ns: String,
    pub(crate) ctl: Controller,
    pub(crate) links: Api<LinkResource>,
    pub(crate) secrets: Api<Secret>,
    pub(crate) kc: Kubeconfig,
}

impl LinkWorld {
    /// The world; the controller mirrors the remote namespaces `env.ns` and `also`.
    pub(crate) async fn new(prefix: &str, also: &[&str], extra: &[&str]) -> Self {
        let env = Env::new(prefix).await;
        link_crd(&env.local).await;
        // A Link creates no namespace (Linkerd's default): the mirrors' must exist.
        create_namespace(&env.lc, &env.ns).await;
        let ctl_ns = local_cluster::unique_namespace("lc");
        create_namespace(&env.lc, &ctl_ns).await;
        let mut allow = vec![env.ns.clone()];
        allow.extend(also.iter().map(|s| s.to_string()));
        let allow = allow.join(",");
        let mut args = vec![
            "--namespace-allow",
            &allow,
            "--endpoint-refresh-period",
            "2s",
        ];
        args.extend_from_slice(extra);
        let ctl = Controller::spawn(&env.local, &ctl_ns, &args);
        ctl.wait_ready().await;
        let kc = allowed_kubeconfig(&env.remote, &env.ns, "reader").await;
        let secrets: Api<Secret> = Api::namespaced(env.lc.clone(), &ctl_ns);
        secrets
            .create(
                &PostParams::default(),
                &credentials_secret(&format!("cluster-credentials-{}", env.cluster), &kc.yaml),
            )
            .await
            .unwrap();
        let links = Api::namespaced(env.lc.clone(), &ctl_ns);
        Self {
            env,
            ctl_ns,
            ctl,
            links,
            secrets,
            kc,
        }
    }

    /// The credentials Secret's name.
    pub(crate) fn credentials(&self) -> String {
        format!("cluster-credentials-{}", self.env.cluster)
    }

    /// Creates the Link of this world's cluster, named after it, with `extra` spec fields.
    pub(crate) async fn create_link(&self, extra: serde_json::Value) -> LinkResource {
        let l = link(
            &self.env.cluster,
            &self.env.cluster,
            &self.credentials(),
            extra,
        );
        self.links.create(&PostParams::default(), &l).await.unwrap()
    }

    /// Merge-patches the spec of the Link `name`.
    pub(crate) async fn patch_link(&self, name: &str, spec: serde_json::Value) {
        self.links
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": spec })),
            )
            .await
            .unwrap();
    }

    /// Waits for the Link's status to hold an entry of ours for remote Service `svc`
    /// with `reason`; returns the entry as JSON.
    pub(crate) async fn status_entry(
        &self,
        link: &str,
        svc: &str,
        reason: &str,
    ) -> serde_json::Value {
        let links = self.links.clone();
        let what = format!("no status entry {reason} for {svc} on Link {link}");
        let (link, svc, reason) = (link.to_string(), svc.to_string(), reason.to_string());
        tokio::time::timeout(CONVERGE * 2, async move {
            loop {
                if let Ok(l) = links.get_status(&link).await {
                    let v = serde_json::to_value(&l).unwrap();
                    let found = v["status"]["mirrorServices"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|e| {
                            e["remoteRef"]["name"] == svc.as_str()
                                && e["conditions"][0]["reason"] == reason.as_str()
                        })
                        .cloned();
                    if let Some(e) = found {
                        return e;
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}"))
    }
}

/// A remote EndpointSlice of Service `service` in `ns` with endpoints of the given
/// readiness (what kube-controller-manager would write; the remote here runs none).
pub(crate) fn remote_slice(ns: &str, service: &str, ready: &[bool]) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-abcde"), "namespace": ns,
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": ready.iter().enumerate().map(|(i, r)| serde_json::json!({
            "addresses": [format!("198.18.0.{}", i + 1)],
            "conditions": {"ready": r},
        })).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}
