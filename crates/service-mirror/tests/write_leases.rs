//! Per-link write Leases `service-mirror-write-<cluster>` (what Linkerd's `check` and
//! `gateways` read to find the writing pod), on real controller processes: held by the
//! leader, renewed sparingly when idle (counted in the audit log, apart from mirror
//! writes), handed over with the leadership, deleted on unlink, and a Lease without our
//! label never touched.

mod support;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use local_cluster::unique_namespace;
use std::time::{Duration, Instant};
use support::controller::{Controller, LinkSecrets, reader_kubeconfig};
use support::*;

const LEASE_SECS: u64 = 3;

/// Audit-log write requests (verb, resource, name) in namespace `ns` that completed.
fn audit_writes(env: &Env, ns: &str) -> Vec<(String, String, String)> {
    let log = std::fs::read_to_string(env.local.audit_log()).unwrap_or_default();
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete" && e["objectRef"]["namespace"] == ns)
        .filter(|e| {
            matches!(
                e["verb"].as_str(),
                Some("create" | "update" | "patch" | "delete")
            )
        })
        .map(|e| {
            let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&e["verb"]),
                s(&e["objectRef"]["resource"]),
                s(&e["objectRef"]["name"]),
            )
        })
        .collect()
}

fn holder(l: &Lease) -> Option<String> {
    l.spec.as_ref()?.holder_identity.clone()
}

#[tokio::test]
async fn the_leader_holds_one_write_lease_per_link_and_hands_it_over() {
    let env = Env::new("wl").await;
    env.gateway("gw", 4143, &["192.0.2.1"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let ctl_ns = unique_namespace("wl-sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let leases: Api<Lease> = Api::namespaced(env.lc.clone(), &ctl_ns);
    // A second link whose Lease name is already taken by someone else (Linkerd's own
    // controller electing on the same name).
    let foreign_cluster = format!("{}-x", env.cluster);
    let foreign_name = format!("service-mirror-write-{foreign_cluster}");
    let foreign = leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some(foreign_name.clone()),
                    ..Default::default()
                },
                spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                    holder_identity: Some("linkerd-service-mirror-0".into()),
                    lease_duration_seconds: Some(30),
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap();
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    let secrets = LinkSecrets::new(&env.lc, &ctl_ns);
    secrets
        .link("link", Some(&env.cluster), Some(&kc.yaml))
        .await;
    secrets
        .link("link-x", Some(&foreign_cluster), Some(&kc.yaml))
        .await;
    let duration = format!("{LEASE_SECS}s");
    let flags = [
        "--namespace-allow",
        env.ns.as_str(),
        "--lease-duration",
        duration.as_str(),
    ];
    let admin = env.local.admin_kubeconfig().path.clone();
    let mut a = Controller::spawn_as(&admin, &ctl_ns, &flags, &[("POD_NAME", "replica-a")]);
    a.wait_ready().await;
    let name = format!("service-mirror-write-{}", env.cluster);

    let lease = eventually("write Lease held by replica-a", || async {
        let l = leases.get_opt(&name).await.unwrap()?;
        (holder(&l).as_deref() == Some("replica-a")).then_some(l)
    })
    .await;
    let labels = lease.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("service-mirror.linkerd.io")
    );
    assert_eq!(
        labels.get("mirror.linkerd.io/cluster-name"),
        Some(&env.cluster)
    );
    assert_eq!(
        lease.spec.as_ref().unwrap().lease_duration_seconds,
        Some(LEASE_SECS as i32)
    );
    env.mirror_until("web", "mirrored", |_, e| has_subsets(e))
        .await;
    a.wait_log(&["without our label", &foreign_cluster], CONVERGE)
        .await;

    // Idle: only renewals, each at least two thirds of the duration apart.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = audit_writes(&env, &ctl_ns);
    let mirror_before = audit_writes(&env, &env.ns);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(4 * LEASE_SECS)).await;
    let window = start.elapsed();
    // The audit log is written asynchronously: let it catch up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during: Vec<_> = audit_writes(&env, &ctl_ns)[before.len()..].to_vec();
    let renewals = during
        .iter()
        .filter(|(v, r, n)| v == "update" && r == "leases" && *n == name)
        .count();
    let others: Vec<_> = during
        .iter()
        .filter(|(_, r, n)| r == "leases" && n.starts_with("service-mirror-write-") && *n != name)
        .collect();
    println!(
        "idle {window:?}: {renewals} write-Lease renewals (lease {LEASE_SECS}s); all writes in the controller namespace: {during:?}"
    );
    let most = (window.as_secs_f64() / (LEASE_SECS as f64 / 2.0)).ceil() as usize + 1;
    assert!(
        (1..=most).contains(&renewals),
        "{renewals} renewals in {window:?}"
    );
    assert!(others.is_empty(), "only our own Lease: {others:?}");
    assert_eq!(
        audit_writes(&env, &env.ns).len(),
        mirror_before.len(),
        "an idle link writes no mirror"
    );
    let counted = a.metrics_text().await;
    assert!(
        counted
            .lines()
            .any(|l| l.starts_with("service_mirror_write_lease_writes_total{verb=\"update\"}")),
        "{counted}"
    );
    let untouched = leases.get(&foreign_name).await.unwrap();
    assert_eq!(
        untouched.metadata.resource_version,
        foreign.metadata.resource_version
    );

    // A second replica; the leader stops (SIGTERM): the write Lease follows the leadership.
    let b = Controller::spawn_as(&admin, &ctl_ns, &flags, &[("POD_NAME", "replica-b")]);
    b.wait_ready().await;
    assert_eq!(
        holder(&leases.get(&name).await.unwrap()).as_deref(),
        Some("replica-a"),
        "a follower does not take it"
    );
    let handover = Instant::now();
    let (ok, _) = a.terminate();
    assert!(ok);
    eventually("write Lease held by replica-b", || async {
        let l = leases.get_opt(&name).await.unwrap()?;
        (holder(&l).as_deref() == Some("replica-b")).then_some(())
    })
    .await;
    println!(
        "write Lease handed over {:?} after SIGTERM",
        handover.elapsed()
    );
    let transitions = leases
        .get(&name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .lease_transitions;
    assert!(transitions >= Some(1), "{transitions:?}");

    // Unlink: our Lease goes; the foreign one stays as it was, also after its link goes.
    secrets.unlink("link").await;
    secrets.unlink("link-x").await;
    env.mirror_gone("web").await;
    eventually("write Lease deleted", || async {
        leases.get_opt(&name).await.unwrap().is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let untouched = leases.get(&foreign_name).await.unwrap();
    assert_eq!(
        untouched.metadata.resource_version,
        foreign.metadata.resource_version
    );
    leases
        .delete(&foreign_name, &DeleteParams::default())
        .await
        .unwrap();
}
