//! ClusterProfiles (KEP-4322) as a link source, on real apiservers with the published
//! CRD and the real binary (`--link-source=all`): a profile with the
//! `kubeconfig-secretreader` access provider links its cluster as a Link does, our
//! condition is written beside the cluster manager's (and put back after a manager's
//! plain status update drops it), a profile deleted and re-created within the deletion
//! grace keeps its mirrors (same uid), one absent past the grace loses them; a profile
//! with an unsupported access provider is refused (Event, condition, metric: once)
//! while a Link beside it keeps mirroring.

use crate::support::controller::Controller;
use crate::support::links::{
    LinkWorld, allowed_kubeconfig, credentials_secret, link, remote_slice,
};
use crate::support::{
    Env, create_namespace, events_on, eventually, has_subsets, ports, subset_ips, wait_event,
};
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use service_mirror_controller::links::{
    ACCESS_PROVIDER, CLUSTER_PROFILE_CRD_YAML, ClusterProfile, EXEC_EXTENSION, LINKED_CONDITION,
};
use tokio::sync::OnceCell;

/// Applies the published ClusterProfile CRD to the local cluster (`admin`: its admin
/// client) once per test binary and waits until ClusterProfiles can be listed.
async fn cluster_profile_crd(admin: &kube::Client) {
    static APPLIED: OnceCell<()> = OnceCell::const_new();
    APPLIED
        .get_or_init(|| async {
            local_cluster::apply_yaml(admin, CLUSTER_PROFILE_CRD_YAML)
                .await
                .expect("the apiserver takes the published ClusterProfile CRD");
            let api: Api<ClusterProfile> = Api::namespaced(admin.clone(), "default");
            eventually("the ClusterProfile CRD is served", || {
                let api = api.clone();
                async move { api.list(&Default::default()).await.ok() }
            })
            .await;
        })
        .await;
}

/// The remote Service `name` in `ns`, selected by a Link's default selector, and a
/// ready remote endpoint for it (a Link-shaped mirror reads the remote's readiness).
async fn exported(env: &Env, name: &str) {
    let svc = Service {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(env.ns.clone()),
            labels: Some([("mirror.linkerd.io/exported".into(), "true".into())].into()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
            ports: Some(ports(&[("http", 80)])),
            ..Default::default()
        }),
        status: None,
    };
    env.remote_services()
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    Api::<EndpointSlice>::namespaced(env.rc.clone(), &env.ns)
        .create(
            &PostParams::default(),
            &remote_slice(&env.ns, name, &[true]),
        )
        .await
        .unwrap();
}

/// The server of a kubeconfig's current context.
fn server_of(kubeconfig: &str) -> String {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).unwrap();
    let current = kc.current_context.clone().unwrap();
    let ctx = kc.contexts.iter().find(|c| c.name == current).unwrap();
    let cluster = &ctx.context.as_ref().unwrap().cluster;
    kc.clusters
        .iter()
        .find(|c| &c.name == cluster)
        .unwrap()
        .cluster
        .as_ref()
        .unwrap()
        .server
        .clone()
        .unwrap()
}

/// Creates ClusterProfile `name` in `ns` with `annotations`, then writes its status as
/// a cluster manager would (its own field manager): `providers` and a condition of its
/// own, `ControlPlaneHealthy`.
async fn create_profile(
    client: &kube::Client,
    ns: &str,
    name: &str,
    annotations: serde_json::Value,
    providers: serde_json::Value,
) -> Api<ClusterProfile> {
    let api: Api<ClusterProfile> = Api::namespaced(client.clone(), ns);
    let cp: ClusterProfile = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ClusterProfile",
        "metadata": {"name": name, "annotations": annotations,
            "labels": {"x-k8s.io/cluster-manager": "test-manager"}},
        "spec": {"displayName": name, "clusterManager": {"name": "test-manager"}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &cp).await.unwrap();
    let status = serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ClusterProfile",
        "metadata": {"name": name, "namespace": ns},
        "status": {
            "conditions": [{"type": "ControlPlaneHealthy", "status": "True",
                "reason": "Healthy", "message": "from the cluster manager",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "accessProviders": providers,
        },
    });
    api.patch_status(
        name,
        &PatchParams::apply("test-manager"),
        &Patch::Apply(&status),
    )
    .await
    .expect("the cluster manager writes the status");
    api
}

/// Waits until the profile's conditions satisfy `ok`; returns them.
async fn conditions_until(
    api: &Api<ClusterProfile>,
    name: &str,
    what: &str,
    ok: impl Fn(&[Condition]) -> bool,
) -> Vec<Condition> {
    eventually(what, || async {
        let cp = api.get_status(name).await.ok()?;
        let conditions = cp.status.map(|s| s.conditions).unwrap_or_default();
        ok(&conditions).then_some(conditions)
    })
    .await
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[tokio::test]
async fn a_cluster_profile_links_its_cluster_keeps_the_managers_conditions_and_unlinks_when_deleted()
 {
    let env = Env::new("cp").await;
    cluster_profile_crd(&env.lc).await;
    create_namespace(&env.lc, &env.ns).await;
    let ctl_ns = local_cluster::unique_namespace("cpc");
    create_namespace(&env.lc, &ctl_ns).await;
    let grace = std::time::Duration::from_secs(4);
    let ctl = Controller::spawn(
        &env.local,
        &ctl_ns,
        &[
            "--namespace-allow",
            &env.ns,
            "--link-source",
            "all",
            "--cluster-profile-deletion-grace",
            "4s",
        ],
    );
    let kc = allowed_kubeconfig(&env.remote, &env.ns, "reader").await;
    Api::<Secret>::namespaced(env.lc.clone(), &ctl_ns)
        .create(
            &PostParams::default(),
            &credentials_secret("east-kubeconfig", &kc.yaml),
        )
        .await
        .unwrap();
    exported(&env, "web").await;
    ctl.wait_ready().await;

    let annotations = serde_json::json!({
        "service-mirror.io/gateway-address": "192.0.2.10",
        "service-mirror.io/gateway-port": "4143",
    });
    let providers = serde_json::json!([
        {"name": "kubelogin", "cluster": {"server": "https://elsewhere.example"}},
        {"name": ACCESS_PROVIDER, "cluster": {
            "server": server_of(&kc.yaml),
            "extensions": [{"name": EXEC_EXTENSION,
                "extension": {"name": "east-kubeconfig", "key": "kubeconfig"}}],
        }},
    ]);
    let profiles = create_profile(
        &env.lc,
        &ctl_ns,
        &env.cluster,
        annotations.clone(),
        providers.clone(),
    )
    .await;

    // Linked as a Link links: the mirror of the selected Service, at the gateway the
    // annotations give.
    let (svc, ep) = env
        .mirror_until("web", "the ClusterProfile's mirror of web", |_, e| {
            has_subsets(e)
        })
        .await;
    assert_eq!(subset_ips(&ep), ["192.0.2.10"]);
    let labels = svc.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["mirror.linkerd.io/cluster-name"], env.cluster);
    assert!(
        !svc.metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .contains_key("mirror.linkerd.io/remote-gateway-name"),
        "a Link's shape"
    );
    wait_event(&env.lc, &ctl_ns, &env.cluster, "Linked").await;

    // Our condition, beside the manager's, which stays as it wrote it.
    let conditions = conditions_until(&profiles, &env.cluster, "Linked=True", |c| {
        condition(c, LINKED_CONDITION).is_some_and(|c| c.status == "True")
    })
    .await;
    let ours = condition(&conditions, LINKED_CONDITION).unwrap();
    assert_eq!(ours.reason, "Linked");
    assert_eq!(
        ours.message,
        format!("watching remote cluster {}", env.cluster)
    );
    let theirs = condition(&conditions, "ControlPlaneHealthy").expect("the manager's kept");
    assert_eq!(
        (
            theirs.status.as_str(),
            theirs.reason.as_str(),
            theirs.message.as_str()
        ),
        ("True", "Healthy", "from the cluster manager")
    );
    assert_eq!(conditions.len(), 2, "{conditions:?}");
    // Written under our field manager, which owns our condition only.
    let cp = profiles.get(&env.cluster).await.unwrap();
    let ours_managed: Vec<String> = cp
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.manager.as_deref() == Some("service-mirror"))
        .map(|m| serde_json::to_string(&m.fields_v1).unwrap())
        .collect();
    assert_eq!(ours_managed.len(), 1, "{ours_managed:?}");
    assert!(
        ours_managed[0].contains(LINKED_CONDITION),
        "{ours_managed:?}"
    );
    assert!(
        !ours_managed[0].contains("ControlPlaneHealthy")
            && !ours_managed[0].contains("accessProviders"),
        "{ours_managed:?}"
    );
    // The manager rewrites its own condition by server-side apply, with everything it
    // owns (an apply that left out `accessProviders` would remove them): ours stays,
    // and the profile stays linked.
    let status = serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ClusterProfile",
        "metadata": {"name": env.cluster, "namespace": ctl_ns},
        "status": {
            "conditions": [{"type": "ControlPlaneHealthy", "status": "False",
                "reason": "Unhealthy", "message": "", "lastTransitionTime": "2026-01-02T00:00:00Z"}],
            "accessProviders": providers,
        },
    });
    profiles
        .patch_status(
            &env.cluster,
            &PatchParams::apply("test-manager"),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();
    let after = profiles.get_status(&env.cluster).await.unwrap();
    let after = after.status.unwrap().conditions;
    assert_eq!(
        condition(&after, "ControlPlaneHealthy").unwrap().status,
        "False"
    );
    assert_eq!(condition(&after, LINKED_CONDITION).unwrap().status, "True");

    // A manager that writes its status with a plain update (no apply) drops our
    // condition; the update is an event on the profile, which judges it again and
    // applies our condition back.
    eventually("a plain status update without our condition", || async {
        let mut cp = profiles.get_status(&env.cluster).await.ok()?;
        let status = cp.status.as_mut()?;
        status.conditions.retain(|c| c.type_ != LINKED_CONDITION);
        profiles
            .replace_status(&env.cluster, &PostParams::default(), &cp)
            .await
            .ok()
    })
    .await;
    let conditions = conditions_until(&profiles, &env.cluster, "Linked=True back", |c| {
        condition(c, LINKED_CONDITION).is_some()
    })
    .await;
    let ours = condition(&conditions, LINKED_CONDITION).unwrap();
    assert_eq!(
        (ours.status.as_str(), ours.reason.as_str()),
        ("True", "Linked")
    );
    assert_eq!(
        condition(&conditions, "ControlPlaneHealthy")
            .unwrap()
            .status,
        "False"
    );

    // Deleted and re-created within the deletion grace (a manager's re-sync): the link
    // stops at once, resumes with the new profile, and nothing is deleted: the mirror
    // keeps its uid (its ClusterIP) past the end of the grace.
    let uid = svc.metadata.uid.clone().unwrap();
    profiles
        .delete(&env.cluster, &DeleteParams::default())
        .await
        .unwrap();
    let deleted = std::time::Instant::now();
    ctl.wait_log(
        &["ClusterProfile deleted: link stopped", &env.cluster],
        crate::support::CONVERGE,
    )
    .await;
    eventually("the profile gone", || async {
        profiles
            .get_opt(&env.cluster)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let profiles = create_profile(
        &env.lc,
        &ctl_ns,
        &env.cluster,
        annotations.clone(),
        providers.clone(),
    )
    .await;
    assert!(
        deleted.elapsed() < grace,
        "re-created within the grace: {:?}",
        deleted.elapsed()
    );
    conditions_until(&profiles, &env.cluster, "Linked=True again", |c| {
        condition(c, LINKED_CONDITION).is_some_and(|c| c.status == "True")
    })
    .await;
    tokio::time::sleep(
        (grace + std::time::Duration::from_secs(1)).saturating_sub(deleted.elapsed()),
    )
    .await;
    let (kept, _) = env.mirror("web").await;
    assert_eq!(
        kept.and_then(|s| s.metadata.uid),
        Some(uid),
        "the mirror was kept through the re-create"
    );
    assert!(
        ctl.log_lines("ClusterProfile stayed deleted").is_empty(),
        "no deletion after the grace"
    );

    // Deleted for good: the link stops at once, and once the profile has stayed absent
    // for the grace its mirrors go.
    profiles
        .delete(&env.cluster, &DeleteParams::default())
        .await
        .unwrap();
    let deleted = std::time::Instant::now();
    env.mirror_gone("web").await;
    assert!(
        deleted.elapsed() >= grace,
        "deleted only after the grace: {:?}",
        deleted.elapsed()
    );
    ctl.wait_log(
        &["ClusterProfile stayed deleted", "unlinked", &env.cluster],
        crate::support::CONVERGE,
    )
    .await;
}

#[tokio::test]
async fn an_unsupported_access_provider_is_refused_visibly_and_a_link_beside_it_keeps_mirroring() {
    let w = LinkWorld::new("cpu", &[], &["--link-source", "all"]).await;
    cluster_profile_crd(&w.env.lc).await;
    exported(&w.env, "web").await;
    w.links
        .create(
            &PostParams::default(),
            &link(
                &w.env.cluster,
                &w.env.cluster,
                &w.credentials(),
                serde_json::json!({}),
            ),
        )
        .await
        .unwrap();
    w.env
        .mirror_until("web", "the Link's mirror of web", |_, e| has_subsets(e))
        .await;

    // A profile whose only provider we cannot use (an exec plugin we do not run).
    let name = format!("{}-other", w.env.cluster);
    let profiles = create_profile(
        &w.env.lc,
        &w.ctl_ns,
        &name,
        serde_json::json!({}),
        serde_json::json!([{"name": "kubelogin", "cluster": {"server": "https://other.example:6443"}}]),
    )
    .await;
    let note = wait_event(&w.env.lc, &w.ctl_ns, &name, "UnsupportedAccessProvider").await;
    assert!(
        note.contains("kubeconfig-secretreader") && note.contains("\"kubelogin\""),
        "the profile is not refused before its manager wrote its status: {note}"
    );
    let reasons: Vec<String> = events_on(&w.env.lc, &w.ctl_ns, &name)
        .await
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert!(
        reasons.iter().all(|r| r == "UnsupportedAccessProvider"),
        "{reasons:?}"
    );
    let conditions = conditions_until(&profiles, &name, "Linked=False", |c| {
        condition(c, LINKED_CONDITION).is_some_and(|c| c.status == "False")
    })
    .await;
    assert_eq!(
        condition(&conditions, LINKED_CONDITION).unwrap().reason,
        "UnsupportedAccessProvider"
    );
    assert!(condition(&conditions, "ControlPlaneHealthy").is_some());
    let series = format!(
        "service_mirror_cluster_profile_errors_total{{cluster_profile=\"{name}\",reason=\"UnsupportedAccessProvider\"}}"
    );
    eventually("the refusal counted", || async {
        w.ctl
            .metrics()
            .await
            .lines()
            .any(|l| l.starts_with(&series))
            .then_some(())
    })
    .await;
    assert!(
        !w.ctl.log_lines("ClusterProfile not usable").is_empty(),
        "a log line"
    );

    // Nothing else affected: the Link mirrors a Service exported after the refusal, and
    // the refused profile linked nothing.
    exported(&w.env, "api").await;
    w.env
        .mirror_until("api", "the Link's mirror of api", |_, e| has_subsets(e))
        .await;
    let other_mirror = format!("web-{name}");
    assert!(
        w.env
            .local_services()
            .get_opt(&other_mirror)
            .await
            .unwrap()
            .is_none()
    );
    // Told once: every later update of the profile (the echo of our condition write
    // among them) judged it again without telling it again.
    let counted: Vec<String> = w
        .ctl
        .metrics()
        .await
        .lines()
        .filter(|l| l.starts_with(&series))
        .map(str::to_string)
        .collect();
    assert_eq!(counted, [format!("{series} 1")]);
    assert_eq!(w.ctl.log_lines("ClusterProfile not usable").len(), 1);
    assert!(
        w.ctl
            .log_lines("\"unlinked\"")
            .iter()
            .all(|l| !l.contains(&w.env.cluster)),
        "the Link's link was never stopped"
    );
}

/// With ClusterProfiles a link source, the startup permission check covers theirs
/// (where their CRD is served): one taken away from the installed Role is named as
/// breaking ClusterProfile links only, and the process runs on.
#[tokio::test]
async fn a_missing_cluster_profile_permission_is_named_at_startup() {
    use crate::rbac_support::{RunningController, install, install_documents, remove_verb};
    use service_mirror_controller::permissions::{
        PERMISSION_CHECK_DONE, cluster_profile_permissions, missing_cluster_profile_permissions,
        missing_permissions,
    };
    crate::support::init_tracing();
    let local = local_cluster::shared_cluster("local")
        .await
        .expect("local cluster");
    cluster_profile_crd(&local.client().await.unwrap()).await;
    let ns = local_cluster::unique_namespace("cp-norbac");
    let mut docs = install_documents(&ns, &[]);
    let taken = cluster_profile_permissions(&ns)
        .into_iter()
        .find(|p| p.verb == "patch")
        .expect("the status patch");
    remove_verb(
        &mut docs,
        "Role",
        &taken.group,
        &taken.resource,
        &taken.verb,
    );
    let kc = install(&local, &ns, &docs).await;
    let client = kc.client().await.unwrap();
    let expected = taken.to_string();
    eventually("exactly the status patch missing", || {
        let (client, ns, expected) = (client.clone(), ns.clone(), expected.clone());
        async move {
            let required = missing_permissions(&client, &ns).await.ok()?;
            let profiles = missing_cluster_profile_permissions(&client, &ns)
                .await
                .ok()?;
            (required.is_empty() && profiles == [expected]).then_some(())
        }
    })
    .await;

    let mut ctl = RunningController::spawn_as(&kc.path, &ns, &["--link-source", "all"], &[]);
    let (line, _) = ctl
        .wait_log(
            &[&format!("missing permission: {expected}:"), "ERROR"],
            std::time::Duration::from_secs(15),
        )
        .await;
    assert!(
        line.contains("ClusterProfile links cannot work without it"),
        "{line}"
    );
    ctl.wait_log(&[PERMISSION_CHECK_DONE], std::time::Duration::from_secs(30))
        .await;
    assert_eq!(
        ctl.log_lines("missing permission:").len(),
        1,
        "only {expected}:\n{}",
        ctl.log_text()
    );
    assert!(
        ctl.running(),
        "a missing ClusterProfile permission is not fatal"
    );
}
