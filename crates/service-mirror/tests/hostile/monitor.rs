//! The safety monitor itself (`service_mirror_testkit::monitor`) on a real apiserver's
//! audit log: writes done with a controller's ServiceAccount identity, allowed ones and
//! one of each forbidden kind; the monitor must pass the first and report each of the
//! others as the breach it is, and ignore the same writes by another identity.

use crate::support;
use crate::support::{create_namespace, exported, sa_client};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use local_cluster::LocalCluster;
use service_mirror_core::NamespaceFilter;
use service_mirror_testkit::monitor::{Breach, Monitor, Remit, UNCHANGED_FOR, WatchedRemote};
use std::time::Duration;

fn meta(ns: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..Default::default()
    }
}

fn kinds(m: &Monitor) -> Vec<&'static str> {
    m.breaches()
        .iter()
        .map(|b| match b {
            Breach::NotOwned(_) => "not owned",
            Breach::OutsideRemit(_) => "outside remit",
            Breach::DeletedWhileExported(..) => "deleted while exported",
            Breach::AfterConvergence(_) => "after convergence",
            Breach::TwoWriters(..) => "two writers",
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_reports_each_kind_of_breach_by_the_controllers_identity_and_nothing_else() {
    support::init_tracing();
    let cluster = LocalCluster::start("monitor").await.expect("cluster");
    let admin = cluster.client().await.unwrap();
    for ns in ["a", "c", "sm"] {
        create_namespace(&admin, ns).await;
    }
    // The cluster is its own remote ("self"): exported `a/web` is mirrored as
    // `a/web-self`.
    let remote: Api<Service> = Api::namespaced(admin.clone(), "a");
    remote
        .create(
            &PostParams::default(),
            &exported("web", "a", "gw", &[("http", 80)]),
        )
        .await
        .unwrap();
    let remote_created = std::time::Instant::now();
    let ctl = sa_client(
        &cluster,
        "sm",
        "ctl",
        &[
            (
                &["services", "endpoints", "secrets", "configmaps"],
                &["get", "create", "update", "patch", "delete"],
            ),
            (
                &[
                    "leases.coordination.k8s.io",
                    "endpointslices.discovery.k8s.io",
                ],
                &["get", "create", "update", "patch", "delete"],
            ),
        ],
    )
    .await;
    let mut m = Monitor::new(
        cluster.audit_log(),
        Remit {
            users: vec!["system:serviceaccount:sm:ctl".into()],
            leader_lease: None,
            controller_namespace: "sm".into(),
            clusters: vec!["self".into()],
            namespaces: NamespaceFilter::allow_only(["a", "sm"]),
        },
        vec![WatchedRemote {
            cluster: "self".into(),
            client: admin.clone(),
        }],
    );
    let pp = PostParams::default();
    let svc = |ns: &str, name: &str| Service {
        metadata: meta(ns, name),
        spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
            ports: Some(support::ports(&[("http", 80)])),
            ..Default::default()
        }),
        status: None,
    };
    let services = |ns: &str| Api::<Service>::namespaced(ctl.clone(), ns);

    // Allowed: a mirror, a Lease of its own namespace; and anything by the admin.
    services("a")
        .create(&pp, &svc("a", "web-self"))
        .await
        .unwrap();
    let lease = Lease {
        metadata: meta("sm", "ctl"),
        spec: None,
    };
    Api::<Lease>::namespaced(ctl.clone(), "sm")
        .create(&pp, &lease)
        .await
        .unwrap();
    Api::<Secret>::namespaced(admin.clone(), "sm")
        .create(
            &pp,
            &Secret {
                metadata: meta("sm", "by-admin"),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    m.poll().await;
    assert_eq!(kinds(&m), Vec::<&str>::new(), "{:?}", m.breaches());

    // Not owned: a Secret, a ConfigMap, a Lease elsewhere, a slice that is not ours,
    // a Service that is no mirror, a mirror declared foreign.
    Api::<Secret>::namespaced(ctl.clone(), "sm")
        .create(
            &pp,
            &Secret {
                metadata: meta("sm", "stolen"),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(ctl.clone(), "a")
        .create(
            &pp,
            &ConfigMap {
                metadata: meta("a", "cm"),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    Api::<Lease>::namespaced(ctl.clone(), "a")
        .create(
            &pp,
            &Lease {
                metadata: meta("a", "other"),
                spec: None,
            },
        )
        .await
        .unwrap();
    Api::<EndpointSlice>::namespaced(ctl.clone(), "a")
        .create(
            &pp,
            &EndpointSlice {
                metadata: meta("a", "kcm-abcde"),
                address_type: "IPv4".into(),
                endpoints: vec![],
                ports: None,
            },
        )
        .await
        .unwrap();
    services("a")
        .create(&pp, &svc("a", "frontend"))
        .await
        .unwrap();
    m.foreign("services", "a", "web-self").await;
    let patch = serde_json::json!({"metadata": {"labels": {"x": "y"}}});
    services("a")
        .patch("web-self", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    m.released("services", "a", "web-self").await;
    m.poll().await;
    assert_eq!(kinds(&m), vec!["not owned"; 6], "{:?}", m.breaches());

    // Outside the remit: a mirror-named Service in a namespace the filter denies.
    services("c")
        .create(&pp, &svc("c", "web-self"))
        .await
        .unwrap();
    m.poll().await;
    assert_eq!(kinds(&m)[6..], ["outside remit"], "{:?}", m.breaches());

    // uid stability: the mirror of a remote exported and unchanged for longer than
    // the bound is deleted. Time is the subject: the remote must have stayed unchanged
    // past the monitor's bound (2 s beyond it: Kubernetes timestamps have whole seconds).
    let wait = (UNCHANGED_FOR.unsigned_abs() + Duration::from_secs(2))
        .saturating_sub(remote_created.elapsed());
    tokio::time::sleep(wait).await;
    services("a")
        .delete("web-self", &DeleteParams::default())
        .await
        .unwrap();
    m.poll().await;
    assert_eq!(
        kinds(&m)[7..],
        ["deleted while exported"],
        "{:?}",
        m.breaches()
    );
    // The same delete once the remote is unexported is not a breach.
    services("a")
        .create(&pp, &svc("a", "web-self"))
        .await
        .unwrap();
    let unexport = serde_json::json!({"metadata": {"annotations": {
        "mirror.linkerd.io/gateway-name": null, "mirror.linkerd.io/gateway-ns": null}}});
    remote
        .patch("web", &PatchParams::default(), &Patch::Merge(&unexport))
        .await
        .unwrap();
    services("a")
        .delete("web-self", &DeleteParams::default())
        .await
        .unwrap();
    m.poll().await;
    assert_eq!(kinds(&m).len(), 8, "{:?}", m.breaches());

    // After convergence: a Lease renewal is fine, any other write (even a refused
    // one) is a breach; `changing` ends the quiet time.
    m.converged().await;
    let renew = serde_json::json!({"metadata": {"labels": {"renewed": "1"}}});
    Api::<Lease>::namespaced(ctl.clone(), "sm")
        .patch("ctl", &PatchParams::default(), &Patch::Merge(&renew))
        .await
        .unwrap();
    let refused = services("a")
        .delete("web-self", &DeleteParams::default())
        .await;
    assert!(refused.is_err(), "already deleted: a 404");
    m.poll().await;
    assert_eq!(kinds(&m)[8..], ["after convergence"], "{:?}", m.breaches());
    m.changing().await;
    services("a")
        .create(&pp, &svc("a", "web-self"))
        .await
        .unwrap();
    m.poll().await;
    assert_eq!(kinds(&m).len(), 9, "{:?}", m.breaches());
}
