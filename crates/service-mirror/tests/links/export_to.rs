//! `service-mirror.io/export-to` on a remote Service exported to Links (issue 32, point
//! 4, the Link half): two controller processes of the real binary, named `east` and
//! `west` (`--mcs=off --mcs-cluster-name`), on the same local apiserver, each with a
//! Link of its own to the same remote (mirror suffixes `<cluster>` and `<cluster>w`).
//! A Service annotated for east is mirrored by east only; annotated for west, east's
//! mirror is withdrawn (deleted with its uid as precondition) and west mirrors it; an
//! invalid list mirrors nowhere and is reported once per episode (Event on each Link,
//! `reconcile_errors{kind="invalid_export_to"}`); a Service without the annotation is
//! mirrored by both throughout and never written again.

use crate::support::controller::Controller;
use crate::support::links::{LinkWorld, credentials_secret, link};
use crate::support::{
    CONVERGE, Mark, Subject, create_namespace, eventually, reconciled_after, wait_event, writes_in,
};
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use service_mirror_controller::links::LinkResource;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const EXPORTED: (&str, &str) = ("mirror.linkerd.io/exported", "true");
const EXPORT_TO: &str = "service-mirror.io/export-to";

/// A remote Service `name` selected by the Links' default selector, exported to
/// `export_to` when given.
fn remote_service(ns: &str, name: &str, export_to: Option<&str>) -> Service {
    let annotations: BTreeMap<String, String> = export_to
        .map(|to| (EXPORT_TO.to_string(), to.to_string()))
        .into_iter()
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns,
            "labels": {EXPORTED.0: EXPORTED.1}, "annotations": annotations},
        "spec": {"ports": [{"name": "http", "port": 80}]},
    }))
    .unwrap()
}

/// The local Service `name` in `ns`, if it exists.
async fn local(svc: &Api<Service>, name: &str) -> Option<Service> {
    svc.get_opt(name).await.unwrap()
}

/// Waits until the local Service `name` exists; returns it.
async fn appears(svc: &Api<Service>, name: &str) -> Service {
    eventually(&format!("mirror {name} created"), || local(svc, name)).await
}

/// Waits until the local Service `name` is gone.
async fn goes(svc: &Api<Service>, name: &str) {
    eventually(&format!("mirror {name} withdrawn"), || async {
        local(svc, name).await.is_none().then_some(())
    })
    .await
}

/// The counter line of `kind` of `cluster`'s reconcile errors on `ctl`'s metrics page.
async fn errors(ctl: &Controller, cluster: &str, kind: &str) -> Option<String> {
    let want =
        format!("service_mirror_reconcile_errors_total{{cluster=\"{cluster}\",kind=\"{kind}\"}} ");
    ctl.metrics()
        .await
        .lines()
        .find(|l| l.starts_with(&want))
        .map(str::to_owned)
}

/// Waits until the counter of `kind` of `cluster` reads `value`.
async fn errors_reach(ctl: &Controller, cluster: &str, kind: &str, value: u64) {
    let start = Instant::now();
    loop {
        let line = errors(ctl, cluster, kind).await;
        if line.as_deref().and_then(|l| l.rsplit(' ').next()) == Some(&value.to_string()) {
            return;
        }
        assert!(
            start.elapsed() < CONVERGE,
            "{kind} of {cluster} never {value}: {line:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_remote_service_exported_to_chosen_clusters_is_mirrored_only_there_and_withdrawn_elsewhere()
 {
    let started = Instant::now();
    // East: the world's controller and Link.
    let w = LinkWorld::new("xt", &[], &["--mcs=off", "--mcs-cluster-name", "east"]).await;
    let (ns, east) = (w.env.ns.clone(), w.env.cluster.clone());
    // West: a second controller of its own namespace, linked to the same remote.
    let west = format!("{east}w");
    let west_ns = local_cluster::unique_namespace("lcw");
    create_namespace(&w.env.lc, &west_ns).await;
    let west_ctl = Controller::spawn(
        &w.env.local,
        &west_ns,
        &[
            "--namespace-allow",
            &ns,
            "--endpoint-refresh-period",
            "2s",
            "--mcs=off",
            "--mcs-cluster-name",
            "west",
        ],
    );
    west_ctl.wait_ready().await;
    let remote: Api<Service> = w.env.remote_services();
    remote
        .create(&PostParams::default(), &remote_service(&ns, "plain", None))
        .await
        .unwrap();
    w.create_link(serde_json::json!({})).await;
    let credentials = format!("cluster-credentials-{west}");
    Api::<Secret>::namespaced(w.env.lc.clone(), &west_ns)
        .create(
            &PostParams::default(),
            &credentials_secret(&credentials, &w.kc.yaml),
        )
        .await
        .unwrap();
    let west_links: Api<LinkResource> = Api::namespaced(w.env.lc.clone(), &west_ns);
    west_links
        .create(
            &PostParams::default(),
            &link(&west, &west, &credentials, serde_json::json!({})),
        )
        .await
        .unwrap();

    // Both links run: the unannotated Service is mirrored by both.
    let mirrors: Api<Service> = Api::namespaced(w.env.lc.clone(), &ns);
    appears(&mirrors, &format!("plain-{east}")).await;
    appears(&mirrors, &format!("plain-{west}")).await;

    // Exported to east: east mirrors it, west does not (its key reconciled after the
    // Service came).
    remote
        .create(
            &PostParams::default(),
            &remote_service(&ns, "web", Some("east")),
        )
        .await
        .unwrap();
    let east_web = appears(&mirrors, &format!("web-{east}")).await;
    let west_web = Subject::link(&west, &ns, "web");
    reconciled_after(&west_ctl, &west_web, 0).await;
    assert!(local(&mirrors, &format!("web-{west}")).await.is_none());
    assert!(
        !east_web
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(EXPORT_TO),
        "the mirror does not carry whom the remote exports to"
    );

    // Exported to west instead: east's mirror is withdrawn, west's made.
    let patch =
        |to: &str| Patch::Merge(serde_json::json!({"metadata": {"annotations": {EXPORT_TO: to}}}));
    remote
        .patch("web", &PatchParams::default(), &patch("west"))
        .await
        .unwrap();
    goes(&mirrors, &format!("web-{east}")).await;
    appears(&mirrors, &format!("web-{west}")).await;
    let deletes = |name: &str| {
        writes_in(&w.env.local, &ns, true)
            .into_iter()
            .filter(|l| l == &format!("delete services/{name}"))
            .count()
    };
    // The apiserver writes a request's audit line once its response is sent, so the
    // watch can see the mirror gone before the line exists (it did, once, in CI).
    let east_mirror = format!("web-{east}");
    eventually("the mirror's delete in the audit log", || async {
        (deletes(&east_mirror) > 0).then_some(())
    })
    .await;
    assert_eq!(deletes(&east_mirror), 1);
    // Withdrawn is no failure: nothing counted but the delete.
    assert_eq!(errors(&w.ctl, &east, "export_to_not_listed").await, None);
    let plain = [
        local(&mirrors, &format!("plain-{east}")).await.unwrap(),
        local(&mirrors, &format!("plain-{west}")).await.unwrap(),
    ];

    // An invalid list: mirrored nowhere, said once on each Link.
    let east_mark = Mark::now(&w.ctl, Subject::link(&east, &ns, "web"));
    remote
        .patch("web", &PatchParams::default(), &patch("west,Bad_Name"))
        .await
        .unwrap();
    goes(&mirrors, &format!("web-{west}")).await;
    east_mark.passed().await;
    assert!(local(&mirrors, &format!("web-{east}")).await.is_none());
    for (ctl, ctl_ns, cluster) in [(&w.ctl, &w.ctl_ns, &east), (&west_ctl, &west_ns, &west)] {
        let note = wait_event(&w.env.lc, ctl_ns, cluster, "InvalidExportTo").await;
        assert!(
            note.contains("Bad_Name") && note.contains(&format!("{ns}/web")),
            "{note}"
        );
        errors_reach(ctl, cluster, "invalid_export_to", 1).await;
    }
    w.status_entry(&east, "web", "InvalidService").await;
    // Once per episode: another change of the Service says nothing more.
    let mark = Mark::now(&west_ctl, west_web.clone());
    remote
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .unwrap();
    mark.passed().await;
    errors_reach(&west_ctl, &west, "invalid_export_to", 1).await;
    assert!(local(&mirrors, &format!("web-{west}")).await.is_none());

    // Nothing else was affected: the unannotated Service's mirrors never written again.
    for before in plain {
        let name = before.metadata.name.clone().unwrap();
        let now = local(&mirrors, &name).await.expect("still mirrored");
        assert_eq!(now.metadata.uid, before.metadata.uid, "{name}");
        assert_eq!(
            now.metadata.resource_version, before.metadata.resource_version,
            "{name}"
        );
    }
    eprintln!("export-to on Links: {:.1?}", started.elapsed());
}
