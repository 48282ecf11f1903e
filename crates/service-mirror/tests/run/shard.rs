//! Links sharded over replicas (`run --shard-links`): three replicas share twelve
//! links by their write Leases, rebalance as replicas join and die, and never write one
//! link from two replicas (the audit log, watched throughout by the safety monitor,
//! per link).

use crate::ha::{replica_identity, signal};
use crate::support::controller::{Controller, link_secret, reader_kubeconfig};
use crate::support::*;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Endpoints, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use local_cluster::unique_namespace;
use service_mirror_core::NamespaceFilter;
use service_mirror_testkit::monitor::{AuditWrite, Breach, Monitor, Remit};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const LEASE_SECS: u64 = 4;
const LINKS: usize = 12;
/// The link whose write Lease a foreign writer (Linkerd's controller, played by the
/// test) holds and renews throughout.
const FOREIGN: usize = 11;
const REPLICAS: [&str; 3] = ["replica-a", "replica-b", "replica-c"];

/// Each link's write Lease holder (`""`: released), by cluster.
async fn holders(lc: &kube::Client, ns: &str) -> BTreeMap<String, String> {
    Api::<Lease>::namespaced(lc.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|l| {
            let cluster = l
                .metadata
                .name
                .as_deref()?
                .strip_prefix("service-mirror-write-")?
                .to_string();
            let holder = l.spec?.holder_identity.unwrap_or_default();
            Some((cluster, holder))
        })
        .collect()
}

/// How many links each replica of `alive` holds, once every link but the foreign one
/// is held by one of them.
fn spread(h: &BTreeMap<String, String>, clusters: &[String], alive: &[&str]) -> Option<Vec<usize>> {
    let ours = clusters.iter().enumerate().filter(|(i, _)| *i != FOREIGN);
    let mut counts = vec![0; alive.len()];
    for (_, c) in ours {
        let holder = h.get(c)?;
        let k = alive.iter().position(|a| a == holder)?;
        counts[k] += 1;
    }
    Some(counts)
}

/// Waits until every link but the foreign one is held by a replica of `alive`, each
/// holding `min..=max`; returns the counts and how long it took.
async fn spread_within(
    lc: &kube::Client,
    ns: &str,
    clusters: &[String],
    alive: &[&str],
    (min, max): (usize, usize),
    monitor: &mut Monitor,
) -> (Vec<usize>, Duration) {
    let t = Instant::now();
    loop {
        monitor.poll().await;
        let h = holders(lc, ns).await;
        if let Some(counts) = spread(&h, clusters, alive)
            && counts.iter().all(|n| (min..=max).contains(n))
        {
            return (counts, t.elapsed());
        }
        assert!(
            t.elapsed() < CONVERGE,
            "links spread over {alive:?}, {min} to {max} each: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `one` holds every link but the foreign one; returns how long it took.
async fn held_by_one(
    lc: &kube::Client,
    ns: &str,
    clusters: &[String],
    one: &str,
    monitor: &mut Monitor,
) -> Duration {
    let all = (LINKS - 1, LINKS - 1);
    spread_within(lc, ns, clusters, &[one], all, monitor)
        .await
        .1
}

/// Waits until every mirror of every link but the foreign one points at `ip`; returns
/// how long it took.
async fn mirrors_point_at(
    env: &Env,
    clusters: &[String],
    ip: &str,
    monitor: &mut Monitor,
) -> Duration {
    let t = Instant::now();
    let endpoints: Api<Endpoints> = Api::namespaced(env.lc.clone(), &env.ns);
    loop {
        monitor.poll().await;
        let list = endpoints.list(&ListParams::default()).await.unwrap().items;
        let at: BTreeMap<String, Vec<String>> = list
            .iter()
            .filter_map(|e| Some((e.metadata.name.clone()?, subset_ips(e))))
            .collect();
        let missing: Vec<String> = clusters
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != FOREIGN)
            .flat_map(|(_, c)| ["a", "b"].map(|s| format!("{s}-{c}")))
            .filter(|m| at.get(m).is_none_or(|ips| ips != &[ip.to_string()]))
            .collect();
        if missing.is_empty() {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < CONVERGE,
            "mirrors not pointing at {ip}: {missing:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A Lease `service-mirror-write-<cluster>` held by a writer that is not ours, renewed
/// every second until the task is aborted.
async fn foreign_holder(
    lc: kube::Client,
    ns: String,
    cluster: String,
) -> tokio::task::JoinHandle<()> {
    let api: Api<Lease> = Api::namespaced(lc, &ns);
    let name = format!("service-mirror-write-{cluster}");
    let now = || MicroTime(k8s_openapi::jiff::Timestamp::now());
    api.create(
        &PostParams::default(),
        &Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("linkerd-service-mirror-east-7f9".into()),
                lease_duration_seconds: Some(30),
                renew_time: Some(now()),
                ..Default::default()
            }),
        },
    )
    .await
    .unwrap();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if let Ok(mut l) = api.get(&name).await {
                l.spec.as_mut().unwrap().renew_time = Some(now());
                let _ = api.replace(&name, &PostParams::default(), &l).await;
            }
        }
    })
}

#[tokio::test]
async fn links_spread_over_replicas_rebalance_on_join_and_death_with_one_writer_per_link() {
    let env = Env::new("shard").await;
    env.gateway("gw", 4143, &["192.0.2.1"]).await;
    env.export("a", "gw", &[("http", 80)]).await;
    env.export("b", "gw", &[("http", 80)]).await;
    let ctl_ns = unique_namespace("shard-sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let clusters: Vec<String> = (0..LINKS)
        .map(|i| format!("{}-s{i:02}", env.cluster))
        .collect();
    let foreign = foreign_holder(env.lc.clone(), ctl_ns.clone(), clusters[FOREIGN].clone()).await;
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    let secrets: Api<Secret> = Api::namespaced(env.lc.clone(), &ctl_ns);
    for (i, c) in clusters.iter().enumerate() {
        secrets
            .create(
                &PostParams::default(),
                &link_secret(&format!("link-{i:02}"), Some(c), Some(&kc.yaml)),
            )
            .await
            .unwrap();
    }
    let user = |name: &str| format!("system:serviceaccount:{ctl_ns}:{name}");
    let mut monitor = Monitor::new(
        env.local.audit_log(),
        Remit {
            users: REPLICAS.iter().map(|r| user(r)).collect(),
            leader_lease: Some("service-mirror".into()),
            controller_namespace: ctl_ns.clone(),
            clusters: clusters.clone(),
            namespaces: NamespaceFilter::allow_only([env.ns.as_str()]),
        },
        vec![],
    )
    .per_link_writers();
    let lease = format!("{LEASE_SECS}s");
    let flags = [
        "--namespace-allow",
        env.ns.as_str(),
        "--lease-duration",
        lease.as_str(),
        "--shard-links",
        "true",
    ];
    let mut replicas = Vec::new();
    for r in REPLICAS {
        let id = replica_identity(&env.local, &ctl_ns, r).await;
        replicas.push((r, id));
    }
    let spawn = |r: &str, path: &std::path::Path| {
        Controller::spawn_as(path, &ctl_ns, &flags, &[("POD_NAME", r)])
    };

    // One replica alone holds every link (the foreign one aside) and mirrors them.
    let mut running = vec![spawn(REPLICAS[0], &replicas[0].1.path)];
    running[0].wait_ready().await;
    let (counts, took) = spread_within(
        &env.lc,
        &ctl_ns,
        &clusters,
        &REPLICAS[..1],
        (LINKS - 1, LINKS - 1),
        &mut monitor,
    )
    .await;
    println!("1 replica: {counts:?} links after {took:.1?}");
    mirrors_point_at(&env, &clusters, "192.0.2.1", &mut monitor).await;

    // Two more join: the first hands links over until each holds its share, 4 or 3 of
    // the 11 (ceil(11 / 3) = 4), within a couple of lease durations.
    let joined = Instant::now();
    for (r, id) in &replicas[1..] {
        running.push(spawn(r, &id.path));
    }
    for c in &mut running[1..] {
        c.wait_ready().await;
    }
    let (counts, _) =
        spread_within(&env.lc, &ctl_ns, &clusters, &REPLICAS, (3, 4), &mut monitor).await;
    let rebalanced = joined.elapsed();
    println!(
        "3 replicas: {counts:?} links, rebalanced {rebalanced:.1?} after the two joined (lease {LEASE_SECS} s)"
    );
    // The remote changes: every mirror follows, each written by its link's holder.
    gateway_in(&env.rc, &env.ns, "gw", 4143, &["192.0.2.2"]).await;
    let took = mirrors_point_at(&env, &clusters, "192.0.2.2", &mut monitor).await;
    println!(
        "3 replicas: a gateway change reached all {} mirrors in {took:.1?}",
        2 * (LINKS - 1)
    );
    // Cold standby (the default): a replica watches only the links it holds; a link
    // handed over stops on its old holder one lease duration later.
    if cold_standby() {
        let t = Instant::now();
        let watched = eventually("each replica watching only the links it holds", || async {
            let h = holders(&env.lc, &ctl_ns).await;
            let mut watched = Vec::new();
            for (k, r) in REPLICAS.iter().enumerate() {
                let held = h.values().filter(|v| v == r).count();
                let m = running[k].metrics().await;
                let n = gauge(&m, "service_mirror_shard_links_watched")?;
                (n == held).then_some(())?;
                watched.push(n);
            }
            Some(watched)
        })
        .await;
        println!(
            "cold standby: replicas watch {watched:?} links, the ones they hold, {:.1?} after the rebalance",
            t.elapsed() + rebalanced
        );
    }

    // The replica holding the most links dies (kill -9, nothing released): its links
    // move to the two others within the lease duration + 5 s.
    let h = holders(&env.lc, &ctl_ns).await;
    let counts = spread(&h, &clusters, &REPLICAS).unwrap();
    let victim = (0..3).max_by_key(|k| counts[*k]).unwrap();
    running[victim].child.kill().unwrap();
    let killed = Instant::now();
    let alive: Vec<&str> = REPLICAS
        .iter()
        .enumerate()
        .filter(|(k, _)| *k != victim)
        .map(|(_, r)| *r)
        .collect();
    gateway_in(&env.rc, &env.ns, "gw", 4143, &["192.0.2.3"]).await;
    // ceil(11 / 2) = 6: shares 6 and 5.
    let (counts, moved) =
        spread_within(&env.lc, &ctl_ns, &clusters, &alive, (5, 6), &mut monitor).await;
    mirrors_point_at(&env, &clusters, "192.0.2.3", &mut monitor).await;
    let converged = killed.elapsed();
    println!(
        "{} killed: its links held by {alive:?} ({counts:?}) {moved:.1?} after, every mirror current {converged:.1?} after",
        REPLICAS[victim]
    );
    assert!(
        converged < Duration::from_secs(LEASE_SECS + 5),
        "links moved and mirrors current {converged:?} after the kill"
    );

    // One survivor stops (SIGSTOP) past its lease while the remote changes: the other
    // takes its links; continued, it writes nothing it no longer holds (the monitor:
    // no write of a link by a replica not holding it, beyond requests on their way
    // when it stopped), counts as live again and gets its share back.
    let (paused, other) = (alive[0], alive[1]);
    let paused_at = REPLICAS.iter().position(|r| *r == paused).unwrap();
    let other_at = REPLICAS.iter().position(|r| *r == other).unwrap();
    signal(&running[paused_at], libc::SIGSTOP);
    let stopped = Instant::now();
    gateway_in(&env.rc, &env.ns, "gw", 4143, &["192.0.2.4"]).await;
    let taken = held_by_one(&env.lc, &ctl_ns, &clusters, other, &mut monitor).await;
    mirrors_point_at(&env, &clusters, "192.0.2.4", &mut monitor).await;
    // Time is the subject: stopped past its lease.
    tokio::time::sleep(Duration::from_secs(LEASE_SECS + 2).saturating_sub(stopped.elapsed())).await;
    signal(&running[paused_at], libc::SIGCONT);
    monitor.resumed(&user(paused)).await;
    println!(
        "{paused} stopped {:.1?}: {other} held every link {taken:.1?} after the stop",
        stopped.elapsed()
    );
    gateway_in(&env.rc, &env.ns, "gw", 4143, &["192.0.2.5"]).await;
    let (counts, back) = spread_within(
        &env.lc,
        &ctl_ns,
        &clusters,
        &[paused, other],
        (5, 6),
        &mut monitor,
    )
    .await;
    mirrors_point_at(&env, &clusters, "192.0.2.5", &mut monitor).await;
    println!("{paused} continued: shares {counts:?} {back:.1?} after");

    // The foreign-held link so far: its Lease never taken, nothing of it written by a
    // replica (the audit log: no write of any object of its mirrors).
    let foreign_cluster = clusters[FOREIGN].clone();
    let h = holders(&env.lc, &ctl_ns).await;
    assert_eq!(
        h.get(&foreign_cluster).map(String::as_str),
        Some("linkerd-service-mirror-east-7f9")
    );
    let log = std::fs::read_to_string(env.local.audit_log()).unwrap();
    let touched: Vec<String> = log
        .lines()
        .filter_map(AuditWrite::parse)
        .filter(|w| monitor_users(&ctl_ns).contains(&w.user) && w.name.contains(&foreign_cluster))
        .filter(|w| w.resource != "leases")
        .map(|w| w.to_string())
        .collect();
    assert!(
        touched.is_empty(),
        "the foreign-held link written: {touched:?}"
    );
    // Told once, by the leader, not once per replica; each replica's gauge says it.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(env.lc.clone(), &ctl_ns);
    let link_secret = format!("link-{FOREIGN:02}");
    let told: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("WriteLeaseHeldElsewhere"))
        .filter(|e| e.involved_object.name.as_deref() == Some(link_secret.as_str()))
        .map(|e| format!("{:?} x{:?}", e.reporting_instance, e.count))
        .collect();
    assert_eq!(told.len(), 1, "the foreign holder told by: {told:?}");
    let blocked = format!("service_mirror_write_lease_blocked{{cluster=\"{foreign_cluster}\"");
    for k in [paused_at, other_at] {
        let m = running[k].metrics().await;
        assert!(
            m.lines()
                .any(|l| l.starts_with(&blocked) && l.ends_with(" 1")),
            "{} does not count the link blocked",
            REPLICAS[k]
        );
    }
    // The foreign writer releases it (holder "", as client-go releases): one replica
    // takes it and mirrors it; no replica reports it blocked any more.
    foreign.abort();
    let leases: Api<Lease> = Api::namespaced(env.lc.clone(), &ctl_ns);
    let name = format!("service-mirror-write-{foreign_cluster}");
    release_lease(&leases, &name).await;
    let released = Instant::now();
    let services: Api<Service> = Api::namespaced(env.lc.clone(), &env.ns);
    let endpoints: Api<Endpoints> = Api::namespaced(env.lc.clone(), &env.ns);
    let taker = eventually("the released link taken and mirrored", || async {
        let holder = holders(&env.lc, &ctl_ns).await.remove(&foreign_cluster)?;
        [paused, other].contains(&holder.as_str()).then_some(())?;
        for s in ["a", "b"] {
            let m = format!("{s}-{foreign_cluster}");
            services.get_opt(&m).await.ok()??;
            let e = endpoints.get_opt(&m).await.ok()??;
            (subset_ips(&e) == ["192.0.2.5"]).then_some(())?;
        }
        Some(holder)
    })
    .await;
    println!(
        "the foreign writer released its link: {taker} took and mirrored it {:.1?} later",
        released.elapsed()
    );
    for k in [paused_at, other_at] {
        eventually("no replica reports the link blocked", || async {
            let m = running[k].metrics().await;
            (!m.lines()
                .any(|l| l.starts_with(&blocked) && l.ends_with(" 1")))
            .then_some(())
        })
        .await;
    }

    // A replica shutting down (SIGTERM) releases its links and deletes its member
    // Lease: the other takes them within a pass or two, not after a lease duration.
    signal(&running[paused_at], libc::SIGTERM);
    let handed = held_by_one(&env.lc, &ctl_ns, &clusters, other, &mut monitor).await;
    println!("{paused} shut down: {other} held every link {handed:.1?} after SIGTERM");
    assert!(
        handed < Duration::from_millis(2500),
        "released links taken {handed:?} after SIGTERM (expiry alone takes 4 s or more)"
    );
    let member = format!("service-mirror-member-{paused}");
    eventually(
        "the member Lease of the replica shut down deleted",
        || async { leases.get_opt(&member).await.ok()?.is_none().then_some(()) },
    )
    .await;

    // The audit log: no mirror deleted, no write of a link by a replica not holding
    // it, nothing else out of remit.
    monitor.poll().await;
    let log = std::fs::read_to_string(env.local.audit_log()).unwrap();
    let writes: Vec<AuditWrite> = log
        .lines()
        .filter_map(AuditWrite::parse)
        .filter(|w| monitor_users(&ctl_ns).contains(&w.user) && w.namespace == env.ns)
        .collect();
    let deletes: Vec<String> = writes
        .iter()
        .filter(|w| w.verb == "delete")
        .map(|w| w.to_string())
        .collect();
    let by: BTreeMap<&str, usize> = REPLICAS
        .iter()
        .map(|r| (*r, writes.iter().filter(|w| w.user == user(r)).count()))
        .collect();
    let two = monitor
        .breaches()
        .iter()
        .filter(|b| matches!(b, Breach::TwoWriters(..)))
        .count();
    println!(
        "audit log: {} mirror writes {by:?}, {} deletes, {two} by a replica not holding the link, {} in flight at a hand-over, {} on their way when a stopped replica continued",
        writes.len(),
        deletes.len(),
        monitor.in_flight_at_handover.len(),
        monitor.in_flight_after_resume.len()
    );
    assert!(deletes.is_empty(), "mirror deletions: {deletes:?}");
    monitor
        .assert_clean("three replicas sharding twelve links")
        .await;
}

/// Whether the replicas run in cold standby: the default, unless the test is run with
/// `SERVICE_MIRROR_SHARD_STANDBY=warm` (the replicas inherit it) to measure the
/// hand-overs of a warm standby.
fn cold_standby() -> bool {
    std::env::var("SERVICE_MIRROR_SHARD_STANDBY").map_or(true, |v| v != "warm")
}

/// The value of an unlabelled gauge on a metrics page.
fn gauge(page: &str, name: &str) -> Option<usize> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn monitor_users(ns: &str) -> Vec<String> {
    REPLICAS
        .iter()
        .map(|r| format!("system:serviceaccount:{ns}:{r}"))
        .collect()
}
