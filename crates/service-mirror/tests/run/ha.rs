//! High availability: two `service-mirror run` replicas, one Lease, one writer.

use crate::support::controller::{Controller, link_secret, reader_kubeconfig};
use crate::support::*;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use local_cluster::{LocalCluster, unique_namespace};
use service_mirror_core::NamespaceFilter;
use service_mirror_testkit::monitor::{AuditWrite, Breach, Monitor, Remit};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const LEASE: &str = "4s";

/// A kubeconfig for ServiceAccount `ns/name` bound to cluster-admin, so each replica
/// shows up under its own name in the audit log.
pub(crate) async fn replica_identity(
    local: &LocalCluster,
    ns: &str,
    name: &str,
) -> local_cluster::Kubeconfig {
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

/// Writes a ConfigMap of the test in `ns` and waits until the audit log shows it: the
/// writes that completed before it are in the log too (the log is written
/// asynchronously, in the order requests complete).
async fn audit_barrier(local: &LocalCluster, ns: &str) {
    let name = "audit-barrier";
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(local.client().await.unwrap(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    eventually("the audit log caught up", || async {
        let log = std::fs::read_to_string(local.audit_log()).unwrap_or_default();
        log.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|e| {
                e["stage"] == "ResponseComplete"
                    && e["objectRef"]["namespace"] == ns
                    && e["objectRef"]["resource"] == "configmaps"
                    && e["objectRef"]["name"] == name
            })
            .then_some(())
    })
    .await;
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

/// Sends `signal` to the controller process.
pub(crate) fn signal(c: &Controller, signal: i32) {
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(c.child.id() as i32, signal) }, 0);
}

/// One step of remote churn: a new export `c{i}`, and `a`'s port changed to `8000 + i`.
async fn churn(env: &Env, i: i32) {
    env.export(&format!("c{i}"), "gw", &[("http", 80)]).await;
    env.patch_remote(
        "a",
        serde_json::json!({"spec": {"ports": [{"name": "http", "port": 8000 + i, "protocol": "TCP"}]}}),
    )
    .await;
}

/// The leader Lease's name (`run --lease-name` default).
const LEADER_LEASE: &str = "service-mirror";

#[tokio::test]
async fn a_leader_stopped_past_its_lease_writes_nothing_after_resuming_while_another_leads() {
    const LEASE_SECS: u64 = 3;
    let env = Env::new("ha-stop").await;
    env.gateway("gw", 4143, &["192.0.2.1"]).await;
    env.export("a", "gw", &[("http", 80)]).await;
    let ctl_ns = unique_namespace("ha-stop-sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    Api::<Secret>::namespaced(env.lc.clone(), &ctl_ns)
        .create(
            &PostParams::default(),
            &link_secret("link", Some(&env.cluster), Some(&kc.yaml)),
        )
        .await
        .unwrap();
    let lease = format!("{LEASE_SECS}s");
    let flags = [
        "--namespace-allow",
        env.ns.as_str(),
        "--lease-duration",
        lease.as_str(),
    ];
    let user = |name: &str| format!("system:serviceaccount:{ctl_ns}:{name}");
    let mut monitor = Monitor::new(
        env.local.audit_log(),
        Remit {
            users: vec![user("replica-a"), user("replica-b")],
            leader_lease: Some(LEADER_LEASE.into()),
            controller_namespace: ctl_ns.clone(),
            clusters: vec![env.cluster.clone()],
            namespaces: NamespaceFilter::allow_only([env.ns.as_str()]),
        },
        vec![],
    );
    let id_a = replica_identity(&env.local, &ctl_ns, "replica-a").await;
    let id_b = replica_identity(&env.local, &ctl_ns, "replica-b").await;
    let a = Controller::spawn_as(&id_a.path, &ctl_ns, &flags, &[("POD_NAME", "replica-a")]);
    a.wait_ready().await;
    env.mirror_until("a", "mirrored by the first replica", |_, e| has_subsets(e))
        .await;
    let b = Controller::spawn_as(&id_b.path, &ctl_ns, &flags, &[("POD_NAME", "replica-b")]);
    b.wait_ready().await;
    let (paused, other, paused_user, other_user) = if is_leader(&a).await {
        (&a, &b, user("replica-a"), user("replica-b"))
    } else {
        (&b, &a, user("replica-b"), user("replica-a"))
    };
    monitor.poll().await;
    assert_eq!(monitor.holder.as_deref(), Some(paused_user.as_str()));

    // The leader stops (SIGSTOP) while the remote churns; the other replica takes over.
    signal(paused, libc::SIGSTOP);
    let stopped = Instant::now();
    let mut i = 0;
    let took_over = loop {
        i += 1;
        churn(&env, i).await;
        monitor.poll().await;
        if monitor.holder.as_deref() == Some(other_user.as_str()) {
            break stopped.elapsed();
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(8 * LEASE_SECS),
            "no takeover"
        );
        // The churn's pace.
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    env.mirror_until(
        &format!("c{i}"),
        "the churn mirrored by the new leader",
        |_, e| has_subsets(e),
    )
    .await;
    // Time is the subject: stopped for more than two lease durations, the remote
    // changing all along.
    while stopped.elapsed() < Duration::from_secs(2 * LEASE_SECS + 1) {
        i += 1;
        churn(&env, i).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    signal(paused, libc::SIGCONT);
    let resumed = Instant::now();
    println!(
        "stopped {:.1?}; the other replica wrote the leader Lease {took_over:.1?} after the stop (lease {LEASE_SECS} s)",
        resumed - stopped
    );
    // The resumed replica wakes to buffered watch events and expired timers: the churn
    // goes on until it has said it no longer leads (its term found over) and two steps
    // more.
    let mut after = None;
    loop {
        i += 1;
        churn(&env, i).await;
        if after.is_none() && !paused.log_lines("leadership changed").is_empty() {
            let said = paused.log_lines("leadership changed");
            if said.last().is_some_and(|l| l.contains("leading=false")) {
                after = Some(i);
            }
        }
        if after.is_some_and(|a| i >= a + 2) {
            break;
        }
        assert!(
            resumed.elapsed() < CONVERGE,
            "the resumed replica never said it follows:\n{}",
            paused.log_lines("leadership changed").join("\n")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let last = i;
    env.mirror_until("a", "the last port change mirrored", |s, e| {
        service_ports(s) == [(Some("http".into()), 8000 + last)] && has_subsets(e)
    })
    .await;
    for i in 1..=last {
        env.mirror_until(&format!("c{i}"), "every export mirrored", |_, e| {
            has_subsets(e)
        })
        .await;
    }
    assert!(is_leader(other).await, "the other replica still leads");
    assert!(!is_leader(paused).await, "the resumed replica follows");

    // From the audit log: not one write attempt (any status) by the resumed replica
    // while the other held the leader Lease.
    monitor.poll().await;
    let two: Vec<String> = monitor
        .breaches()
        .iter()
        .filter(|b| matches!(b, Breach::TwoWriters(..)))
        .map(|b| b.to_string())
        .collect();
    let succeeded = monitor
        .breaches()
        .iter()
        .filter(|b| matches!(b, Breach::TwoWriters(w, _) if (200..300).contains(&w.code)))
        .count();
    println!(
        "write attempts by the resumed replica while the other led: {} ({succeeded} succeeded)",
        two.len()
    );
    assert!(two.is_empty(), "two writers:\n{}", two.join("\n"));
    let log = std::fs::read_to_string(env.local.audit_log()).unwrap();
    let writes: Vec<AuditWrite> = log.lines().filter_map(AuditWrite::parse).collect();
    let by = |u: &str| writes.iter().filter(|w| w.user == u).count();
    let campaign = writes
        .iter()
        .filter(|w| w.user == paused_user && w.resource == "leases" && w.name == LEADER_LEASE)
        .count();
    println!(
        "{} replicas' writes in the audit log: {} by the resumed one ({campaign} to the leader Lease), {} by the new leader; {} s of churn ({last} steps)",
        by(&paused_user) + by(&other_user),
        by(&paused_user),
        by(&other_user),
        stopped.elapsed().as_secs()
    );
    assert_eq!(monitor.holder.as_deref(), Some(other_user.as_str()));
}

/// Every replica stops a link whose Secret goes, but only the leader deletes its
/// mirrors: before, the follower deleted them too (two writers; seen by the chaos
/// suite's monitor as `TwoWriters` on `RecreateLinkSecret`).
#[tokio::test]
async fn only_the_leader_deletes_the_mirrors_of_an_unlinked_cluster() {
    let env = Env::new("ha-unlink").await;
    env.gateway("gw", 4143, &["192.0.2.1"]).await;
    env.export("a", "gw", &[("http", 80)]).await;
    env.export("b", "gw", &[("http", 80)]).await;
    let ctl_ns = unique_namespace("ha-unlink-sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    let secrets = Api::<Secret>::namespaced(env.lc.clone(), &ctl_ns);
    secrets
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
    let mut b = Controller::spawn_as(&id_b.path, &ctl_ns, &flags, &[("POD_NAME", "replica-b")]);
    a.wait_ready().await;
    b.wait_ready().await;
    for s in ["a", "b"] {
        env.mirror_until(s, "mirrored", |_, e| has_subsets(e)).await;
    }
    // Both replicas run the link (warm caches) before it goes.
    for c in [&a, &b] {
        c.wait_log(&["remote services synced"], Duration::from_secs(30))
            .await;
    }
    secrets.delete("link", &Default::default()).await.unwrap();
    for s in ["a", "b"] {
        env.mirror_gone(s).await;
    }
    // Both have stopped the link by now, the follower knowing the leader deletes the
    // mirrors (its own cleanup waits to lead); and the audit log has every write.
    for c in [&a, &b] {
        c.wait_log(&["unlinked"], Duration::from_secs(30)).await;
    }
    let follower = "unlinked on a replica that does not lead";
    eventually("the follower left the mirrors to the leader", || async {
        (a.log_lines(follower).len() + b.log_lines(follower).len() == 1).then_some(())
    })
    .await;
    audit_barrier(&env.local, &ctl_ns).await;
    let wrote = writers(&env.local, &env.ns);
    assert_eq!(
        wrote.len(),
        1,
        "one replica created and deleted the mirrors: {wrote:?}"
    );
    assert!(a.running() && b.running(), "both replicas still run");
}
