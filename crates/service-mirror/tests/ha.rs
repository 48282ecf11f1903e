//! High availability: two `service-mirror run` replicas, one Lease, one writer.

mod support;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use local_cluster::{LocalCluster, unique_namespace};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use support::controller::{Controller, link_secret, reader_kubeconfig};
use support::*;

const LEASE: &str = "4s";

/// A kubeconfig for ServiceAccount `ns/name` bound to cluster-admin, so each replica
/// shows up under its own name in the audit log.
async fn replica_identity(local: &LocalCluster, ns: &str, name: &str) -> local_cluster::Kubeconfig {
    let admin = local.client().await.unwrap();
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{ns}-{name}")),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "cluster-admin".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(ns.into()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(admin)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    local.service_account_kubeconfig(ns, name).await.unwrap()
}

/// Users that wrote mirror Services or Endpoints in `ns`.
fn writers(local: &LocalCluster, ns: &str) -> BTreeSet<String> {
    let log = std::fs::read_to_string(local.audit_log()).unwrap_or_default();
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["objectRef"]["namespace"] == ns && e["stage"] == "ResponseComplete")
        .filter(|e| {
            matches!(
                e["objectRef"]["resource"].as_str(),
                Some("services" | "endpoints")
            )
        })
        .filter(|e| {
            e["user"]["username"]
                .as_str()
                .is_some_and(|u| u.contains(":replica-"))
        })
        .filter_map(|e| e["user"]["username"].as_str().map(str::to_string))
        .collect()
}

async fn is_leader(c: &Controller) -> bool {
    c.get("/metrics")
        .await
        .is_some_and(|(_, m)| m.lines().any(|l| l == "service_mirror_leader 1"))
}

#[tokio::test]
async fn one_replica_writes_and_the_other_takes_over_when_it_dies() {
    let env = Env::new("ha").await;
    env.gateway("gw", 4143, &["192.0.2.1"]).await;
    env.export("a", "gw", &[("http", 80)]).await;
    let ctl_ns = unique_namespace("ha-sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    Api::<Secret>::namespaced(env.lc.clone(), &ctl_ns)
        .create(
            &PostParams::default(),
            &link_secret("link", Some(&env.cluster), Some(&kc.yaml)),
        )
        .await
        .unwrap();
    let flags = [
        "--namespace-allow",
        env.ns.as_str(),
        "--lease-duration",
        LEASE,
    ];
    let id_a = replica_identity(&env.local, &ctl_ns, "replica-a").await;
    let id_b = replica_identity(&env.local, &ctl_ns, "replica-b").await;
    let mut a = Controller::spawn_as(&id_a.path, &ctl_ns, &flags, &[("POD_NAME", "replica-a")]);
    a.wait_ready().await;
    env.mirror_until("a", "mirrored by the first replica", |_, e| has_subsets(e))
        .await;
    let mut b = Controller::spawn_as(&id_b.path, &ctl_ns, &flags, &[("POD_NAME", "replica-b")]);
    b.wait_ready().await;

    env.export("b", "gw", &[("http", 80)]).await;
    env.mirror_until("b", "mirrored with two replicas", |_, e| has_subsets(e))
        .await;
    let (leader, follower, follower_user) = if is_leader(&a).await {
        (&mut a, &mut b, "replica-b")
    } else {
        (&mut b, &mut a, "replica-a")
    };
    assert!(
        !is_leader(follower).await,
        "exactly one leader:\n{:?}\n{:?}",
        leader.log_lines("leadership"),
        follower.log_lines("leadership")
    );
    let before = writers(&env.local, &env.ns);
    assert_eq!(before.len(), 1, "exactly one replica wrote: {before:?}");
    assert!(follower.running());

    // The leader dies without releasing its Lease.
    leader.child.kill().unwrap();
    let killed = Instant::now();
    env.export("after", "gw", &[("http", 80)]).await;
    gateway_in(&env.rc, &env.ns, "gw", 4143, &["192.0.2.2"]).await;
    env.mirror_until("after", "mirrored by the new leader", |_, e| has_subsets(e))
        .await;
    for s in ["a", "b", "after"] {
        env.mirror_until(s, "new gateway address", |_, e| {
            subset_ips(e) == ["192.0.2.2"]
        })
        .await;
    }
    let takeover = killed.elapsed();
    println!(
        "takeover: world converged {takeover:.1?} after the leader was killed (lease {LEASE})"
    );
    assert!(takeover < Duration::from_secs(4 + 5), "took {takeover:?}");
    assert!(is_leader(follower).await);
    let after = writers(&env.local, &env.ns);
    assert!(
        after.iter().any(|u| u.ends_with(follower_user)),
        "the survivor writes now: {after:?}"
    );

    // No duplicate or lost mirror.
    let names: BTreeSet<String> = env
        .local_services()
        .list(
            &ListParams::default()
                .labels(&format!("mirror.linkerd.io/cluster-name={}", env.cluster)),
        )
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s: Service| s.metadata.name)
        .collect();
    let want: BTreeSet<String> = ["a", "b", "after"]
        .iter()
        .map(|s| env.mirror_name(s))
        .collect();
    assert_eq!(names, want);
}
