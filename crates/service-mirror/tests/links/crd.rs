//! Linkerd's `Link` resource on a real apiserver: the CRD `service-mirror install`
//! prints applies and becomes Established, Links written as Linkerd's `link-gen`
//! writes them (v1alpha3, and an older v1alpha1 object) read back through our type and
//! parse, bad input is stored (the CRD's fields are strings) and refused by
//! `parse_link` with its reason, and the installed Role grants the Link permissions.

use crate::rbac_support;
use crate::support::*;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use local_cluster::{LocalCluster, apply_yaml, shared_cluster, unique_namespace};
use rbac_support::{RunningController, apply_documents, install, install_documents, remove_verb};
use service_mirror_controller::links::{
    LINK_CRD_NAME, LinkCondition, LinkObjectRef, LinkResource, LinkResourceStatus,
    LinkServiceStatus, LinkSource, parse_link,
};
use service_mirror_controller::permissions::{
    link_api_served, link_permissions, missing_link_permissions, missing_permissions,
};
use std::time::Duration;

const KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: east
  cluster:
    server: https://east.example:6443
    certificate-authority-data: Zm9v
users:
- name: east
  user:
    token: a-token
contexts:
- name: east
  context: {cluster: east, user: east}
current-context: east
";

/// `service-mirror install` for a fresh namespace applied (CRD included); waits until
/// the CRD is Established and discovery serves `links`. Returns the namespace.
async fn installed(local: &LocalCluster, prefix: &str) -> String {
    let ns = unique_namespace(prefix);
    let applied = apply_documents(local, &install_documents(&ns, &[])).await;
    assert_eq!(
        applied[0],
        format!("CustomResourceDefinition/{LINK_CRD_NAME}"),
        "the CRD is applied first"
    );
    let admin = local.client().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    eventually("the Link CRD is Established", || {
        let crds = crds.clone();
        async move {
            let crd = crds.get(LINK_CRD_NAME).await.ok()?;
            let established = crd
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            established.then_some(())
        }
    })
    .await;
    eventually("discovery serves links", || {
        let admin = admin.clone();
        async move { link_api_served(&admin).await.ok()?.then_some(()) }
    })
    .await;
    ns
}

/// The credentials Secret and Link `linkerd multicluster link-gen` prints, as YAML
/// (the probe spec without timeout and failureThreshold: the CRD defaults them).
fn link_gen_yaml(ns: &str, api_version: &str, gateway_port: &str) -> String {
    let kubeconfig = base64_encode(KUBECONFIG);
    format!(
        r#"apiVersion: v1
kind: Secret
type: mirror.linkerd.io/remote-kubeconfig
metadata:
  name: cluster-credentials-east
  namespace: {ns}
  labels:
    multicluster.linkerd.io/cluster-name: east
  annotations:
    linkerd.io/created-by: linkerd/cli stable-2.14.0
data:
  kubeconfig: {kubeconfig}
---
apiVersion: multicluster.linkerd.io/{api_version}
kind: Link
metadata:
  name: east
  namespace: {ns}
  annotations:
    linkerd.io/created-by: linkerd/cli stable-2.14.0
spec:
  targetClusterName: east
  targetClusterDomain: cluster.local
  targetClusterLinkerdNamespace: linkerd
  clusterCredentialsSecret: cluster-credentials-east
  gatewayAddress: 203.0.113.7,gw.east.example
  gatewayPort: "{gateway_port}"
  gatewayIdentity: linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local
  probeSpec:
    path: /ready
    port: "4191"
    period: 3s
  selector:
    matchLabels:
      mirror.linkerd.io/exported: "true"
  remoteDiscoverySelector:
    matchLabels:
      mirror.linkerd.io/exported: remote-discovery
  federatedServiceSelector:
    matchLabels:
      mirror.linkerd.io/federated: member
  excludedAnnotations: []
  excludedLabels: []
"#
    )
}

fn base64_encode(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// Applies the link-gen output and reads the Link (as v1alpha3, through our type) and
/// its credentials Secret back.
async fn applied_link(
    local: &LocalCluster,
    ns: &str,
    api_version: &str,
    gateway_port: &str,
) -> (LinkResource, Secret) {
    let admin = local.client().await.unwrap();
    apply_yaml(&admin, &link_gen_yaml(ns, api_version, gateway_port))
        .await
        .expect("the apiserver stores link-gen's output");
    let link = Api::<LinkResource>::namespaced(admin.clone(), ns)
        .get("east")
        .await
        .expect("the Link reads back through our type");
    let secret = Api::<Secret>::namespaced(admin, ns)
        .get("cluster-credentials-east")
        .await
        .unwrap();
    (link, secret)
}

fn assert_link_gen_link_parses(link: &LinkResource, secret: &Secret) {
    let probe = link.spec.probe_spec.as_ref().unwrap();
    assert_eq!(probe.timeout.as_deref(), Some("30s"), "the CRD's default");
    assert_eq!(
        probe.failure_threshold.as_deref(),
        Some("3"),
        "the CRD's default"
    );
    let spec = parse_link(link, Some(secret)).expect("parse_link accepts link-gen's Link");
    assert_eq!(spec.link().cluster_name, "east");
    let LinkSource::Resource(r) = spec.source() else {
        panic!("a resource link: {spec:?}");
    };
    let gw = r.gateway.as_ref().unwrap();
    assert_eq!(gw.ips, ["203.0.113.7".parse::<std::net::IpAddr>().unwrap()]);
    assert_eq!(gw.hostnames, ["gw.east.example"]);
    assert_eq!(gw.port, 4143);
    assert_eq!(r.probe.port, Some(4191));
    assert_eq!(r.probe_timeout, Duration::from_secs(30));
    assert_eq!(r.probe_failure_threshold, 3);
}

#[tokio::test]
async fn installs_crd_is_established_and_a_link_gen_v1alpha3_link_parses_through_our_type() {
    init_tracing();
    let local = shared_cluster("local").await.expect("local cluster");
    let ns = installed(&local, "link-crd-v3").await;
    let (link, secret) = applied_link(&local, &ns, "v1alpha3", "4143").await;
    assert_link_gen_link_parses(&link, &secret);

    // The status subresource takes our status types, and keeps the spec as it was.
    let status = LinkResourceStatus {
        mirror_services: vec![LinkServiceStatus {
            controller_name: "service-mirror.linkerd.io/controller".into(),
            remote_ref: LinkObjectRef {
                group: String::new(),
                kind: "Service".into(),
                name: "web".into(),
                namespace: "shop".into(),
            },
            conditions: vec![LinkCondition {
                type_: "Mirrored".into(),
                status: "True".into(),
                last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                )),
                reason: "Mirrored".into(),
                message: String::new(),
                local_ref: Some(LinkObjectRef {
                    name: "web-east".into(),
                    namespace: "shop".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        }],
        federated_services: vec![],
        conditions: vec![],
    };
    let links = Api::<LinkResource>::namespaced(local.client().await.unwrap(), &ns);
    let patched = links
        .patch_status(
            "east",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": status})),
        )
        .await
        .expect("merge-patch of links/status");
    let mut written = patched.status.clone().unwrap();
    written.mirror_services[0].conditions[0].last_transition_time = None;
    let mut want = status.clone();
    want.mirror_services[0].conditions[0].last_transition_time = None;
    assert_eq!(
        written, want,
        "the status round-trips through the apiserver"
    );
    assert_eq!(patched.spec, link.spec);
}

#[tokio::test]
async fn an_older_v1alpha1_link_reads_as_v1alpha3_and_parses() {
    init_tracing();
    let local = shared_cluster("local").await.expect("local cluster");
    let ns = installed(&local, "link-crd-v1").await;
    let (link, secret) = applied_link(&local, &ns, "v1alpha1", "4143").await;
    // v1alpha1 has no federatedServiceSelector in Linkerd's schema; ours keeps it.
    assert!(link.spec.federated_service_selector.is_some());
    assert_link_gen_link_parses(&link, &secret);
}

#[tokio::test]
async fn bad_input_is_stored_by_the_apiserver_and_refused_by_parse_link_alone() {
    init_tracing();
    let local = shared_cluster("local").await.expect("local cluster");
    let ns = installed(&local, "link-crd-bad").await;
    let (link, secret) = applied_link(&local, &ns, "v1alpha3", "gateway").await;
    assert_eq!(link.spec.gateway_port.as_deref(), Some("gateway"));
    let err = parse_link(&link, Some(&secret)).unwrap_err();
    assert_eq!(err.reason(), "InvalidGatewayPort", "{err}");
    assert!(!err.retryable());
    assert!(err.to_string().contains("\"gateway\""), "{err}");
    // Its credentials missing: a reason of its own.
    let err = parse_link(&link, None).unwrap_err();
    assert_eq!(err.reason(), "MissingCredentials", "{err}");

    // `exported: true` unquoted: the open matchLabels stores a boolean. The list of
    // all Links still decodes (a watch is not stopped by one bad Link), and that
    // Link alone is refused, naming its selector.
    let admin = local.client().await.unwrap();
    let bad_selector = link_gen_yaml(&ns, "v1alpha3", "4143")
        .replace("name: east\n  namespace", "name: west\n  namespace")
        .replace(
            "mirror.linkerd.io/exported: \"true\"",
            "mirror.linkerd.io/exported: true",
        );
    let link_only = bad_selector.split("---\n").nth(1).unwrap();
    apply_yaml(&admin, link_only).await.expect("stored");
    let all = Api::<LinkResource>::namespaced(admin, &ns)
        .list(&Default::default())
        .await
        .expect("every Link of the namespace decodes");
    let names: Vec<_> = all
        .items
        .iter()
        .map(|l| l.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["east", "west"]);
    let west = &all.items[1];
    let err = parse_link(west, Some(&secret)).unwrap_err();
    assert_eq!(err.reason(), "InvalidSelector", "{err}");
    assert!(err.to_string().starts_with("spec.selector:"), "{err}");
}

#[tokio::test]
async fn the_installed_role_grants_the_link_permissions_and_they_are_reported_apart() {
    init_tracing();
    let local = shared_cluster("local").await.expect("local cluster");
    let ns = unique_namespace("link-crd-rbac");
    let kc = install(&local, &ns, &install_documents(&ns, &[])).await;
    let client = kc.client().await.unwrap();
    eventually("every required and Link permission granted", || {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            let ok = missing_permissions(&client, &ns).await.ok()?.is_empty()
                && missing_link_permissions(&client, &ns)
                    .await
                    .ok()?
                    .is_empty();
            ok.then_some(())
        }
    })
    .await;
    // The controller's own identity can discover the Link API.
    assert!(link_api_served(&client).await.unwrap());

    // A Role without them: only the Link permissions are missing, never the required.
    let ns = unique_namespace("link-crd-norbac");
    let mut docs = install_documents(&ns, &["--link-crd=false"]);
    assert!(!docs.iter().any(|d| d["metadata"]["name"] == LINK_CRD_NAME));
    for p in link_permissions(&ns) {
        remove_verb(&mut docs, "Role", &p.group, &p.resource, &p.verb);
    }
    let kc = install(&local, &ns, &docs).await;
    let client = kc.client().await.unwrap();
    let want: Vec<String> = link_permissions(&ns)
        .iter()
        .map(ToString::to_string)
        .collect();
    eventually("exactly the Link permissions missing", || {
        let (client, ns, want) = (client.clone(), ns.clone(), want.clone());
        async move {
            let required = missing_permissions(&client, &ns).await.ok()?;
            let links = missing_link_permissions(&client, &ns).await.ok()?;
            (required.is_empty() && links == want).then_some(())
        }
    })
    .await;

    // The startup check names them as breaking Link links only, and runs on.
    let mut ctl = RunningController::spawn_as(&kc.path, &ns, &[], &[]);
    let (line, _) = ctl
        .wait_log(
            &["missing permission: get links.multicluster.linkerd.io"],
            Duration::from_secs(15),
        )
        .await;
    assert!(line.contains("Secret links are unaffected"), "{line}");
    ctl.wait_ready().await;
    let lines = ctl.log_lines("missing permission:");
    assert_eq!(
        lines.len(),
        want.len(),
        "only the Link ones:\n{}",
        ctl.log_text()
    );
    assert!(ctl.log_lines("cannot work without it").is_empty());
    assert!(ctl.running(), "a missing Link permission is not fatal");
}

/// A cluster where the Link CRD was never installed: the Link permissions are not
/// checked at all (nothing to serve), and the controller starts as with Secrets only.
#[tokio::test]
async fn without_the_link_crd_the_link_permissions_are_not_asked_for() {
    init_tracing();
    let local = shared_cluster("no-link-crd")
        .await
        .expect("a cluster of its own");
    let ns = unique_namespace("link-crd-absent");
    let mut docs = install_documents(&ns, &["--link-crd=false"]);
    for p in link_permissions(&ns) {
        remove_verb(&mut docs, "Role", &p.group, &p.resource, &p.verb);
    }
    let kc = install(&local, &ns, &docs).await;
    let client = kc.client().await.unwrap();
    assert!(!link_api_served(&client).await.unwrap());
    eventually("the required permissions granted", || {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            missing_permissions(&client, &ns)
                .await
                .ok()?
                .is_empty()
                .then_some(())
        }
    })
    .await;
    let mut ctl = RunningController::spawn_as(&kc.path, &ns, &[], &[]);
    ctl.wait_log(
        &["the Link CRD is not installed: links come from Secrets only"],
        Duration::from_secs(15),
    )
    .await;
    ctl.wait_log(
        &["local permissions checked: all granted"],
        Duration::from_secs(15),
    )
    .await;
    ctl.wait_ready().await;
    assert!(
        ctl.log_lines("missing permission").is_empty(),
        "{}",
        ctl.log_text()
    );
    assert!(ctl.running());
}

/// Without the Link CRD, the Links watch fails with 404 for good until someone installs
/// it: it is retried with a doubling delay (0.8 s to 30 s), not once a second forever.
/// kube's stream backoff reset itself on the `Init` event the watcher yields before each
/// list, so every retry waited 0.8 s (measured before the fix: 247 lists in 300 s).
#[tokio::test]
async fn a_missing_link_crd_is_asked_for_with_a_doubling_delay_not_every_second() {
    init_tracing();
    let local = shared_cluster("no-link-crd")
        .await
        .expect("a cluster of its own");
    let ns = unique_namespace("link-crd-backoff");
    let docs = install_documents(&ns, &["--link-crd=false"]);
    let kc = install(&local, &ns, &docs).await;
    let ctl = RunningController::spawn_as(&kc.path, &ns, &[], &[]);
    ctl.wait_log(
        &["the Link CRD (links.multicluster.linkerd.io) is not installed"],
        Duration::from_secs(15),
    )
    .await;
    // Time is the subject: list attempts counted over a window from the start.
    let window = Duration::from_secs(14);
    tokio::time::sleep(window.saturating_sub(ctl.started.elapsed())).await;
    // Counted by the controller's own client metrics: its only lists answered 404 are
    // the Links' (the harness's audit policy logs writes only).
    let metrics = ctl.metrics().await;
    let lists: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("service_mirror_kube_requests_total{")
                && l.contains("client=\"local\"")
                && l.contains("verb=\"list\"")
                && l.contains("code=\"404\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let lists = lists as usize;
    eprintln!("list links in the first {window:?}: {lists}");
    // Tries at 0, 0.8, 2.4, 5.6, 12 s (then 24.8 s): 5, a slow start allowing one more
    // or one less (once a second would be 14).
    assert!(
        (3..=6).contains(&lists),
        "{lists} lists of links in {window:?}: not a doubling delay"
    );
}
