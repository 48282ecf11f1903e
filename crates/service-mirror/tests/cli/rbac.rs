//! RBAC as shipped: `service-mirror install` applied to a real apiserver, and the real
//! binary running with nothing but its ServiceAccount's token. The full lifecycle works
//! with exactly those permissions; each one removed is named in the log at startup; a
//! remote credential that may not read Services is reported.

use crate::rbac_support;
use crate::support::controller::service_mirror;
use crate::support::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use local_cluster::{LocalCluster, apply_yaml, client_from_yaml, shared_cluster, unique_namespace};
use rbac_support::{
    RunningController, SERVICE_ACCOUNT, apply_documents, install, install_documents, remove_verb,
};
use service_mirror_controller::permissions::{Permission, is_allowed, missing_permissions};
use std::time::{Duration, Instant};

const GW: i32 = 4143;
/// The remote ServiceAccount `allow` creates by default.
const REMOTE_SA: &str = "linkerd-service-mirror-remote-access-default";

/// A fresh controller namespace with `install`'s manifests applied; returns the token
/// kubeconfig of its ServiceAccount once the apiserver grants every permission.
async fn installed(local: &LocalCluster, prefix: &str) -> (String, local_cluster::Kubeconfig) {
    let ns = unique_namespace(prefix);
    let kc = install(local, &ns, &install_documents(&ns, &[])).await;
    wait_missing(&kc, &ns, &[]).await;
    (ns, kc)
}

/// Waits until the RBAC authorizer's view of `kc`'s identity misses exactly `expected`
/// (new roles and bindings take a moment to reach it).
async fn wait_missing(kc: &local_cluster::Kubeconfig, ns: &str, expected: &[String]) {
    let client = kc.client().await.unwrap();
    eventually(&format!("RBAC in {ns} misses exactly {expected:?}"), || {
        let client = client.clone();
        async move {
            let missing = missing_permissions(&client, ns).await.ok()?;
            (missing == expected).then_some(())
        }
    })
    .await;
}

/// On the remote: `allow` in a fresh namespace (its ClusterRole without `drop_verb`),
/// the token Secret filled, and the link Secret for `cluster` printed by `link` and
/// applied into `ctl_ns` on the local cluster. Returns the link Secret's name.
async fn link(env: &Env, ctl_ns: &str, drop_verb: Option<&str>) -> String {
    let rns = unique_namespace("rbac-remote");
    let allow = service_mirror(&["allow", "--namespace", &rns, "-o", "json"]);
    assert!(allow.ok, "allow failed: {}", allow.stderr);
    let mut docs = local_cluster::parse_documents(&allow.stdout).unwrap();
    if let Some(verb) = drop_verb {
        remove_verb(&mut docs, "ClusterRole", "", "services", verb);
    }
    apply_documents(&env.remote, &docs).await;
    env.remote
        .fill_token_secret(&rns, &format!("{REMOTE_SA}-token"))
        .await
        .unwrap();
    let remote_admin = env.remote.admin_kubeconfig().path.display().to_string();
    let run = service_mirror(&[
        "link",
        "--cluster-name",
        &env.cluster,
        "--kubeconfig",
        &remote_admin,
        "--namespace",
        &rns,
        "--link-namespace",
        ctl_ns,
    ]);
    assert!(run.ok, "link failed: {}", run.stderr);
    let value: serde_json::Value = serde_saphyr::from_str(&run.stdout).unwrap();
    let secret: Secret = serde_json::from_value(value).unwrap();
    let kubeconfig = String::from_utf8(secret.data.as_ref().unwrap()["kubeconfig"].0.clone())
        .expect("utf-8 kubeconfig");
    // The remote authorizer must see the role as applied before the link is used.
    let remote = client_from_yaml(&kubeconfig).await.unwrap();
    for verb in ["list", "watch"] {
        let p = Permission {
            verb: verb.into(),
            group: String::new(),
            resource: "services".into(),
            namespace: None,
        };
        let want = Some(verb) != drop_verb;
        eventually(&format!("remote RBAC: {verb} services = {want}"), || {
            let (remote, p) = (remote.clone(), p.clone());
            async move { (is_allowed(&remote, &p).await.ok()? == want).then_some(()) }
        })
        .await;
    }
    apply_yaml(&env.lc, &run.stdout)
        .await
        .expect("apply the link Secret");
    secret.metadata.name.unwrap()
}

/// Users who made successful write requests to Services and Endpoints of `ns` (other
/// than `except`), according to the local apiserver's audit log.
fn writers_in(cluster: &LocalCluster, ns: &str, except: &str) -> Vec<String> {
    let log = std::fs::read_to_string(cluster.audit_log()).unwrap_or_default();
    let mut users: Vec<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["objectRef"]["namespace"] == ns && e["stage"] == "ResponseComplete")
        .filter(|e| e["objectRef"]["name"] != except)
        .filter(|e| {
            matches!(
                e["objectRef"]["resource"].as_str(),
                Some("services" | "endpoints")
            )
        })
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "delete")))
        .filter(|e| {
            e["responseStatus"]["code"]
                .as_i64()
                .is_some_and(|c| c < 300)
        })
        .filter_map(|e| e["user"]["username"].as_str().map(str::to_string))
        .collect();
    users.sort();
    users.dedup();
    users
}

#[tokio::test]
async fn installed_permissions_carry_the_whole_lifecycle() {
    let env = Env::new("rbac").await;
    let (ctl_ns, kc) = installed(&env.local, "sm-rbac").await;
    // The token belongs to the account the manifests created (not overwritten).
    let sa = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(env.lc.clone(), &ctl_ns)
        .get(SERVICE_ACCOUNT)
        .await
        .unwrap();
    assert_eq!(
        sa.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/managed-by"))
            .map(String::as_str),
        Some("service-mirror"),
        "the install's ServiceAccount is kept"
    );
    env.gateway("gw", GW, &["192.0.2.10"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let secret = link(&env, &ctl_ns, None).await;

    let ctl = RunningController::spawn_as(
        &kc.path,
        &ctl_ns,
        &[
            "--namespace-allow",
            &env.ns,
            "--endpoint-refresh-period",
            "2s",
        ],
        &[],
    );
    ctl.wait_log(
        &["local permissions checked: all granted"],
        Duration::from_secs(15),
    )
    .await;
    ctl.wait_ready().await;
    wait_event(&env.lc, &ctl_ns, &secret, "Linked").await;

    // Created: the mirror (and its namespace, absent locally) appears with subsets.
    let (_, ep) = env
        .mirror_until("web", "mirror of web with subsets", |_, e| has_subsets(e))
        .await;
    assert_eq!(subset_ips(&ep), ["192.0.2.10"]);
    assert_eq!(subset_ports(&ep), [(Some("http".into()), GW)]);

    // Updated: a port added.
    env.patch_remote(
        "web",
        serde_json::json!({"spec": {"ports": [
            {"name": "http", "port": 80, "protocol": "TCP"},
            {"name": "grpc", "port": 9090, "protocol": "TCP"}]}}),
    )
    .await;
    env.mirror_until("web", "grpc port mirrored", |s, e| {
        service_ports(s).len() == 2 && subset_ports(e).len() == 2
    })
    .await;

    // Gateway changed: a new address.
    set_ingress(&env.rc, &env.ns, "gw", &["192.0.2.20"]).await;
    env.mirror_until("web", "new gateway address", |_, e| {
        subset_ips(e) == ["192.0.2.20"]
    })
    .await;

    // A name held by a foreign Service: reported by an Event in that (mirror) namespace.
    let taken = env.mirror_name("taken");
    let foreign = Service {
        metadata: ObjectMeta {
            name: Some(taken.clone()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
            ports: Some(ports(&[("http", 80)])),
            ..Default::default()
        }),
        ..Default::default()
    };
    env.local_services()
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    env.export("taken", "gw", &[("http", 80)]).await;
    let note = wait_event(&env.lc, &env.ns, &taken, "MirrorConflict").await;
    assert!(note.contains(&env.cluster), "{note}");

    // Unexported: the mirror goes; another exported service stays.
    env.export("api", "gw", &[("http", 8080)]).await;
    env.mirror_until("api", "mirror of api", |_, e| has_subsets(e))
        .await;
    env.patch_remote(
        "web",
        serde_json::json!({"metadata": {"annotations": {
            "mirror.linkerd.io/gateway-name": null,
            "mirror.linkerd.io/gateway-ns": null}}}),
    )
    .await;
    env.mirror_gone("web").await;
    assert!(env.mirror("api").await.0.is_some());

    // Unlinked: every mirror of the cluster is deleted; the foreign Service stays.
    Api::<Secret>::namespaced(env.lc.clone(), &ctl_ns)
        .delete(&secret, &DeleteParams::default())
        .await
        .unwrap();
    let by_cluster =
        ListParams::default().labels(&format!("mirror.linkerd.io/cluster-name={}", env.cluster));
    eventually("every mirror of the cluster deleted", || async {
        let svcs = Api::<Service>::all(env.lc.clone())
            .list_metadata(&by_cluster)
            .await
            .unwrap();
        let eps = Api::<Endpoints>::all(env.lc.clone())
            .list_metadata(&by_cluster)
            .await
            .unwrap();
        (svcs.items.is_empty() && eps.items.is_empty()).then_some(())
    })
    .await;
    assert!(
        env.local_services()
            .get_opt(&taken)
            .await
            .unwrap()
            .is_some()
    );

    // Every write was made with the ServiceAccount's token, and nothing was refused.
    assert_eq!(
        writers_in(&env.local, &env.ns, &taken),
        [format!("system:serviceaccount:{ctl_ns}:{SERVICE_ACCOUNT}")]
    );
    let log = ctl.log_text();
    assert!(!log.contains("missing permission"), "{log}");
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "no request of the controller was refused:\n{log}"
    );
}

/// One permission taken away from the installed roles: the startup check names it
/// (verb, resource and scope), and only it, within a few seconds; the process runs on.
async fn missing_one(local: &LocalCluster, permission: Permission) -> Duration {
    let ns = unique_namespace(&format!("rbac-{}-{}", permission.verb, permission.resource));
    let mut docs = install_documents(&ns, &[]);
    let permission = Permission {
        namespace: permission.namespace.map(|_| ns.clone()),
        ..permission
    };
    let kind = if permission.namespace.is_some() {
        "Role"
    } else {
        "ClusterRole"
    };
    remove_verb(
        &mut docs,
        kind,
        &permission.group,
        &permission.resource,
        &permission.verb,
    );
    let kc = install(local, &ns, &docs).await;
    let expected = permission.to_string();
    wait_missing(&kc, &ns, std::slice::from_ref(&expected)).await;

    let mut ctl = RunningController::spawn_as(&kc.path, &ns, &[], &[]);
    let (line, took) = ctl
        .wait_log(
            &[&format!("missing permission: {expected}:"), "ERROR"],
            Duration::from_secs(10),
        )
        .await;
    assert!(
        line.contains("the controller cannot work without it"),
        "{line}"
    );
    assert!(line.contains(&permission.verb) && line.contains(&permission.resource));
    // The check logs the local answers, then the Link ones: once its last line is
    // there, every missing permission has been said.
    ctl.wait_log(
        &[service_mirror_controller::permissions::PERMISSION_CHECK_DONE],
        Duration::from_secs(30),
    )
    .await;
    let lines = ctl.log_lines("missing permission:");
    assert_eq!(
        lines.len(),
        1,
        "only {expected} is missing:\n{}",
        ctl.log_text()
    );
    assert!(ctl.running(), "a missing permission is reported, not fatal");
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_missing_local_permission_is_named_at_startup() {
    init_tracing();
    let local = shared_cluster("local").await.expect("local cluster");
    let started = Instant::now();
    let all = service_mirror_controller::permissions::required_permissions("placeholder");
    let n = all.len();
    let took: Vec<(String, Duration)> = futures::stream::iter(all)
        .map(|p| {
            let local = local.clone();
            async move {
                let what = p.to_string();
                (what, missing_one(&local, p).await)
            }
        })
        .buffer_unordered(6)
        .collect()
        .await;
    assert_eq!(took.len(), n);
    let slowest = took.iter().map(|(_, d)| *d).max().unwrap();
    eprintln!(
        "{n} cases in {:?}; slowest report {slowest:?} after start",
        started.elapsed()
    );
    assert!(slowest < Duration::from_secs(5), "{took:?}");
}

#[tokio::test]
async fn remote_credentials_that_may_not_list_services_are_reported() {
    let env = Env::new("rbac-nolist").await;
    let (ctl_ns, kc) = installed(&env.local, "sm-nolist").await;
    env.gateway("gw", GW, &["192.0.2.10"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let secret = link(&env, &ctl_ns, Some("list")).await;
    let ctl = RunningController::spawn_as(&kc.path, &ctl_ns, &["--namespace-allow", &env.ns], &[]);
    let note = wait_event(&env.lc, &ctl_ns, &secret, "RemoteForbidden").await;
    assert!(
        note.contains("list") && note.contains("services"),
        "the Event names the verb and the resource: {note}"
    );
    ctl.wait_log(
        &["link Secret not usable", "RemoteForbidden"],
        Duration::from_secs(10),
    )
    .await;
    assert!(env.mirror("web").await.0.is_none());
    assert!(!ctl.log_text().contains("missing permission"));
}

#[tokio::test]
async fn remote_credentials_that_may_not_watch_services_are_reported() {
    let env = Env::new("rbac-nowatch").await;
    let (ctl_ns, kc) = installed(&env.local, "sm-nowatch").await;
    env.gateway("gw", GW, &["192.0.2.10"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let secret = link(&env, &ctl_ns, Some("watch")).await;
    let ctl = RunningController::spawn_as(&kc.path, &ctl_ns, &["--namespace-allow", &env.ns], &[]);

    // Linking asks the remote whether it may watch: a refusal is reported on the Secret
    // instead of mirrors silently frozen at the first list.
    let note = wait_event(&env.lc, &ctl_ns, &secret, "RemoteForbidden").await;
    assert!(note.contains("watch services"), "{note}");
    assert!(
        events_on(&env.lc, &ctl_ns, &secret)
            .await
            .iter()
            .all(|(r, _)| r != "Linked"),
        "not linked"
    );
    let metrics = ctl
        .get("/metrics")
        .await
        .map(|(_, b)| b)
        .unwrap_or_default();
    assert!(metrics.contains("reason=\"RemoteForbidden\""), "{metrics}");
    assert!(
        env.mirror("web").await.0.is_none(),
        "nothing mirrored from a half-working link"
    );
}

#[tokio::test]
async fn a_refused_write_is_logged_as_a_warning_naming_verb_and_resource() {
    let env = Env::new("rbac-nocreate").await;
    let ns = unique_namespace("sm-nocreate");
    let mut docs = install_documents(&ns, &[]);
    remove_verb(&mut docs, "ClusterRole", "", "services", "create");
    let kc = install(&env.local, &ns, &docs).await;
    wait_missing(&kc, &ns, &["create services (cluster-wide)".to_string()]).await;
    env.gateway("gw", GW, &["192.0.2.10"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let secret = link(&env, &ns, None).await;
    let ctl = RunningController::spawn_as(&kc.path, &ns, &["--namespace-allow", &env.ns], &[]);
    wait_event(&env.lc, &ns, &secret, "Linked").await;
    // After the fast retries, each failure is a warning carrying the apiserver's reason.
    let (line, _) = ctl
        .wait_log(
            &[
                "WARN",
                "reconcile failed",
                "cannot create resource \\\"services\\\"",
            ],
            Duration::from_secs(15),
        )
        .await;
    eprintln!("reported as: {line}");
    assert!(line.contains(&env.ns), "{line}");
    assert!(env.mirror("web").await.0.is_none());
}

#[tokio::test]
async fn ha_manifests_are_accepted_by_the_apiserver() {
    let local = shared_cluster("local").await.expect("local cluster");
    let ns = unique_namespace("sm-ha");
    let applied = apply_documents(&local, &install_documents(&ns, &["--ha"])).await;
    assert_eq!(
        applied,
        [
            "CustomResourceDefinition/links.multicluster.linkerd.io".to_string(),
            "CustomResourceDefinition/serviceexports.multicluster.x-k8s.io".to_string(),
            "CustomResourceDefinition/serviceimports.multicluster.x-k8s.io".to_string(),
            "CustomResourceDefinition/clusterproperties.about.k8s.io".to_string(),
            format!("Namespace/{ns}"),
            format!("ServiceAccount/{ns}/service-mirror"),
            format!("ClusterRole/service-mirror-controller:{ns}"),
            format!("ClusterRoleBinding/service-mirror-controller:{ns}"),
            format!("Role/{ns}/service-mirror"),
            format!("RoleBinding/{ns}/service-mirror"),
            format!("Service/{ns}/service-mirror-admin"),
            format!("Deployment/{ns}/service-mirror"),
            format!("PodDisruptionBudget/{ns}/service-mirror"),
        ]
    );
    let deployment = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(
        local.client().await.unwrap(),
        &ns,
    )
    .get("service-mirror")
    .await
    .unwrap();
    assert_eq!(deployment.spec.unwrap().replicas, Some(3));
}

/// Upgrading the binary before the ClusterRole: `endpoints` mode writes no slice, so
/// without any `endpointslices` verb it still mirrors (the refused slice watch does not
/// hold the link back), and unlinking still deletes every mirror Service and Endpoints.
#[tokio::test]
async fn a_cluster_role_from_before_slices_still_mirrors_and_unlinks_in_endpoints_mode() {
    let env = Env::new("rbac-old").await;
    let ns = unique_namespace("sm-rbac-old");
    let mut docs = install_documents(&ns, &[]);
    let slice_verbs: Vec<Permission> =
        service_mirror_controller::permissions::required_permissions(&ns)
            .into_iter()
            .filter(|p| p.resource == "endpointslices")
            .collect();
    assert!(!slice_verbs.is_empty(), "install grants slice verbs");
    for p in &slice_verbs {
        remove_verb(&mut docs, "ClusterRole", &p.group, &p.resource, &p.verb);
    }
    let kc = install(&env.local, &ns, &docs).await;
    let expected: Vec<String> = slice_verbs.iter().map(|p| p.to_string()).collect();
    wait_missing(&kc, &ns, &expected).await;
    env.gateway("gw", GW, &["192.0.2.10"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let secret = link(&env, &ns, None).await;
    let ctl = RunningController::spawn_as(
        &kc.path,
        &ns,
        &["--namespace-allow", &env.ns, "--endpoints-mode=endpoints"],
        &[],
    );
    let (_, ep) = env
        .mirror_until("web", "mirrored without slice permissions", |_, e| {
            has_subsets(e)
        })
        .await;
    assert_eq!(subset_ips(&ep), ["192.0.2.10"]);
    assert!(
        !ctl.log_lines("missing permission: list endpointslices")
            .is_empty(),
        "the startup check still names what is missing"
    );

    Api::<Secret>::namespaced(env.lc.clone(), &ns)
        .delete(&secret, &DeleteParams::default())
        .await
        .unwrap();
    env.mirror_gone("web").await;
}
