//! An unchanged world at binary level: the real `service-mirror run`, leader election
//! on, idle for 75 s — longer than every periodic timer short of the watch renewal (30 s
//! expectation expiry, 60 s gateway refresh at its default; the 290 s watch renewal is a
//! re-watch, not a relist, and is covered by the restart tests that relist everything).
//! Every write of the controller's own identity is counted from the audit log: the
//! Lease renewals apart, nothing at all.

mod support;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use local_cluster::{LocalCluster, unique_namespace};
use std::collections::BTreeMap;
use std::time::Duration;
use support::controller::{Controller, link_secret, own_identity, reader_kubeconfig};
use support::*;

/// Longer than the 60 s gateway refresh and two 30 s expectation expiries.
const IDLE: Duration = Duration::from_secs(75);
/// `--lease-duration` default 15 s: the leader Lease is renewed every 5 s (a third of
/// it: its term ends 3 s before the lease, so two renewals may fail first, `leader.rs`),
/// each per-link write Lease every half of it (7.5 s; on the 1 s tick of
/// `write_leases.rs`, every 8 s: bounded here with 7).
const LEADER_RENEW_EVERY_SECS: u64 = 5;
const WRITE_LEASE_RENEW_EVERY_SECS: u64 = 7;

/// The audit log's successful writes of `user`, as `verb resource namespace/name`, from
/// line `from` on; and the number of lines read.
fn writes_of(local: &LocalCluster, user: &str, from: usize) -> (Vec<String>, usize) {
    let log = std::fs::read_to_string(local.audit_log()).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    let writes = lines[from.min(lines.len())..]
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete" && e["user"]["username"] == user)
        .filter(|e| {
            e["responseStatus"]["code"]
                .as_i64()
                .is_some_and(|c| c < 300)
        })
        .map(|e| {
            format!(
                "{} {} {}/{}",
                e["verb"].as_str().unwrap_or(""),
                e["objectRef"]["resource"].as_str().unwrap_or(""),
                e["objectRef"]["namespace"].as_str().unwrap_or(""),
                e["objectRef"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    (writes, lines.len())
}

#[tokio::test]
async fn an_idle_leader_writes_nothing_but_its_lease_renewals_for_75_seconds() {
    let env = Env::new("idle75").await;
    env.gateway("gw", 4143, &["192.0.2.1"]).await;
    for i in 0..10 {
        env.export(&format!("s{i}"), "gw", &[("http", 80), ("admin", 9000)])
            .await;
    }
    let ctl_ns = unique_namespace("idle-sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    Api::<Secret>::namespaced(env.lc.clone(), &ctl_ns)
        .create(
            &PostParams::default(),
            &link_secret("link", Some(&env.cluster), Some(&kc.yaml)),
        )
        .await
        .unwrap();
    let id = own_identity(&env.local, &ctl_ns, "idle-replica").await;
    let user = format!("system:serviceaccount:{ctl_ns}:idle-replica");
    let ctl = Controller::spawn_as(
        &id.path,
        &ctl_ns,
        &["--namespace-allow", env.ns.as_str()],
        &[("POD_NAME", "idle-replica")],
    );
    ctl.wait_ready().await;
    for i in 0..10 {
        env.mirror_until(&format!("s{i}"), "mirrored", |_, e| has_subsets(e))
            .await;
    }
    // Converged: every slice written too (the default mode writes both).
    eventually("every mirror's slice written", || async {
        let (w, _) = writes_of(&env.local, &user, 0);
        (w.iter()
            .filter(|w| w.starts_with("create endpointslices"))
            .count()
            == 10)
            .then_some(())
    })
    .await;
    // And the link's write Lease made (a write of the start, not of the idle window:
    // once it came 0.1 s after the last slice and counted as an idle write).
    let leases =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(env.lc.clone(), &ctl_ns);
    let write_lease = format!("service-mirror-write-{}", env.cluster);
    eventually("the link's write Lease made", || async {
        leases.get_opt(&write_lease).await.unwrap().map(|_| ())
    })
    .await;
    let (converging, from) = writes_of(&env.local, &user, 0);
    eprintln!("{} writes to converge", converging.len());

    // Time is the subject: idle past every periodic timer (the 60 s gateway refresh
    // leaves no trace when it finds nothing to do), the Lease renewals counted below.
    tokio::time::sleep(IDLE).await;
    let (idle, _) = writes_of(&env.local, &user, from);
    let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for w in &idle {
        *by_kind.entry(w.split(' ').nth(1).unwrap()).or_default() += 1;
    }
    eprintln!("writes in {IDLE:?} idle: {by_kind:?}");
    let others: Vec<&String> = idle
        .iter()
        .filter(|w| !w.starts_with("update leases ") && !w.starts_with("patch leases "))
        .collect();
    assert!(
        others.is_empty(),
        "idle writes besides Lease renewals: {others:#?}"
    );
    // Two Leases: the leader's, renewed every 5 s, and the link's write Lease, every 7.5-8 s.
    let leases = by_kind.get("leases").copied().unwrap_or(0);
    let most = (IDLE.as_secs() / LEADER_RENEW_EVERY_SECS
        + 1
        + IDLE.as_secs() / WRITE_LEASE_RENEW_EVERY_SECS
        + 1) as usize;
    assert!(
        (2..=most).contains(&leases),
        "{leases} Lease renewals in {IDLE:?} (expected 2 to {most}): leader election is on"
    );
    assert!(
        ctl.metrics()
            .await
            .lines()
            .any(|l| l == "service_mirror_leader 1"),
        "the controller led throughout"
    );
}
