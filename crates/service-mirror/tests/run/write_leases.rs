//! Per-link write Leases `service-mirror-write-<cluster>` (what Linkerd's `check` and
//! `gateways` read to find the writing pod), on real controller processes: held by the
//! leader, renewed sparingly when idle (counted in the audit log, apart from mirror
//! writes), handed over with the leadership, deleted on unlink, and a Lease without our
//! label never touched while its holder renews it: that link writes nothing until the
//! Lease is released or expires, then it is taken over and the mirrors adopted in place.

use crate::support::controller::{Controller, LinkSecrets, reader_kubeconfig};
use crate::support::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use local_cluster::unique_namespace;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

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

/// Writes a ConfigMap of the test in `ns` and waits until the audit log shows it: the
/// writes that completed before it are in the log too (the audit log is written
/// asynchronously, in the order requests complete).
/// Seconds since midnight of a log line's timestamp (`2026-12-05T04:51:16.093188Z ...`).
fn log_secs(line: &str) -> f64 {
    let time = line
        .split_whitespace()
        .next()
        .and_then(|t| t.split_once('T'))
        .map(|(_, t)| t.trim_end_matches('Z'))
        .unwrap_or_else(|| panic!("no timestamp in {line:?}"));
    time.split(':')
        .map(|p| p.parse::<f64>().unwrap())
        .fold(0.0, |acc, p| acc * 60.0 + p)
}

async fn audit_barrier(env: &Env, ns: &str) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = format!(
        "audit-barrier-{}",
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(env.lc.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let mine = ("create".to_string(), "configmaps".to_string(), name);
    eventually("the audit log caught up", || async {
        audit_writes(env, ns).contains(&mine).then_some(())
    })
    .await;
}

/// The controller's reads of the Lease `name` (its debug log of each request): it looks
/// at a Lease held by a foreign holder again at least every 2 s
/// (`service_mirror_core::write_lease::MAX_FOREIGN_POLL`).
fn lease_reads(ctl: &Controller, name: &str) -> usize {
    let get = format!("/leases/{name} otel.name=\"get\"");
    ctl.log_text()
        .lines()
        .filter(|l| l.contains(&get) && l.contains("kube_client::client::builder: requesting"))
        .count()
}

/// Waits until the controller has read the Lease `name` twice more: two rounds of its
/// look at a foreign hold, each a chance to take the Lease or open the write gate.
async fn two_more_reads(ctl: &Controller, name: &str) {
    let seen = lease_reads(ctl, name);
    eventually(&format!("two more reads of the Lease {name}"), || async {
        (lease_reads(ctl, name) >= seen + 2).then_some(())
    })
    .await;
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
                // Held for longer than this test runs (capped at 300 s): this link
                // stays blocked throughout, and its Lease is never written by us.
                spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                    holder_identity: Some("linkerd-service-mirror-0".into()),
                    lease_duration_seconds: Some(3600),
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
    // Taken as the link starts, not a Lease-task tick (1 s) later: the task is woken
    // once the link is in the set it reads (with the link's writes waiting meanwhile).
    let linked = a
        .wait_log(
            &["linked cluster=", &format!("cluster={} ", env.cluster)],
            CONVERGE,
        )
        .await
        .0;
    let holding = a
        .wait_log(
            &[
                "holding the link's write Lease",
                &format!("cluster={} ", env.cluster),
            ],
            CONVERGE,
        )
        .await
        .0;
    let waited = log_secs(&holding) - log_secs(&linked);
    eprintln!("write Lease held {waited:.3} s after the link started");
    assert!(
        waited < 0.9,
        "the write Lease waited {waited:.3} s for the Lease task's tick:\n{linked}\n{holding}"
    );
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

    // Idle: only renewals, each at least two thirds of the duration apart. From when
    // the mirror's writes are done and seen, and the audit log has them.
    a.settled(&env, "web").await;
    audit_barrier(&env, &ctl_ns).await;
    let before = audit_writes(&env, &ctl_ns);
    let mirror_before = audit_writes(&env, &env.ns);
    let start = Instant::now();
    // Time is the subject: the renewal rate, counted over four lease durations.
    tokio::time::sleep(Duration::from_secs(4 * LEASE_SECS)).await;
    let window = start.elapsed();
    audit_barrier(&env, &ctl_ns).await;
    let during: Vec<_> = audit_writes(&env, &ctl_ns)[before.len()..]
        .iter()
        .filter(|(_, r, _)| r != "configmaps")
        .cloned()
        .collect();
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
    // The new leader looked at the foreign Lease and reports the link blocked.
    let blocked = format!("service_mirror_write_lease_blocked{{cluster=\"{foreign_cluster}\"");
    eventually("replica-b reports the foreign Lease", || async {
        b.metrics_text().await.contains(&blocked).then_some(())
    })
    .await;
    secrets.unlink("link").await;
    secrets.unlink("link-x").await;
    env.mirror_gone("web").await;
    eventually("write Lease deleted", || async {
        leases.get_opt(&name).await.unwrap().is_none().then_some(())
    })
    .await;
    // The Lease pass that saw the foreign Lease's link gone (and forgot its report).
    eventually("the foreign Lease's link forgotten", || async {
        (!b.metrics_text().await.contains(&blocked)).then_some(())
    })
    .await;
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

/// A Lease named as the write Lease of `cluster`, as Linkerd's controller holds it (no
/// label of ours).
fn linkerd_lease(cluster: &str, holder: &str, secs: i32) -> Lease {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    Lease {
        metadata: ObjectMeta {
            name: Some(format!("service-mirror-write-{cluster}")),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(secs),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..Default::default()
        }),
    }
}

/// The mirror Service and Endpoints of `ns/web` for `cluster` as Linkerd's controller
/// writes them (its labels and fq-name annotation; one gateway address).
fn linkerd_mirror(ns: &str, cluster: &str) -> (Service, Endpoints) {
    let name = format!("web-{cluster}");
    let meta = ObjectMeta {
        name: Some(name),
        namespace: Some(ns.into()),
        labels: Some(BTreeMap::from([
            ("mirror.linkerd.io/mirrored-service".into(), "true".into()),
            ("mirror.linkerd.io/cluster-name".into(), cluster.into()),
        ])),
        annotations: Some(BTreeMap::from([(
            "mirror.linkerd.io/remote-svc-fq-name".into(),
            format!("web.{ns}.svc.cluster.local"),
        )])),
        ..Default::default()
    };
    let svc = Service {
        metadata: meta.clone(),
        spec: Some(ServiceSpec {
            ports: Some(ports(&[("http", 80)])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let ep = Endpoints {
        metadata: meta,
        subsets: Some(vec![EndpointSubset {
            addresses: Some(vec![EndpointAddress {
                ip: "192.0.2.99".into(),
                ..Default::default()
            }]),
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: 4143,
                ..Default::default()
            }]),
            ..Default::default()
        }]),
    };
    (svc, ep)
}

/// Writes (verb, resource, name) in `ns` to objects of the mirror `web-<cluster>` (the
/// Service, its Endpoints and its slices `web-<cluster>-ipv4…`).
fn mirror_writes(env: &Env, ns: &str, cluster: &str) -> Vec<(String, String, String)> {
    let mirror = format!("web-{cluster}");
    audit_writes(env, ns)
        .into_iter()
        .filter(|(_, _, n)| *n == mirror || n.starts_with(&format!("{mirror}-ipv")))
        .collect()
}

#[tokio::test]
async fn a_link_whose_write_lease_another_writer_renews_writes_nothing_then_takes_over_and_adopts_in_place()
 {
    let env = Env::new("wlf").await;
    env.gateway("gw", 4143, &["192.0.2.1"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    create_namespace(&env.lc, &env.ns).await;
    let ctl_ns = unique_namespace("wlf-sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let leases: Api<Lease> = Api::namespaced(env.lc.clone(), &ctl_ns);
    let held = env.cluster.clone();
    // A second link whose foreign holder stopped renewing: taken over on expiry.
    let gone = format!("e{}", env.cluster);
    let held_lease = format!("service-mirror-write-{held}");
    let gone_lease = format!("service-mirror-write-{gone}");

    // Linkerd's controller wrote the mirror and holds the Lease, renewing it every 1.5 s.
    let (svc, ep) = linkerd_mirror(&env.ns, &held);
    let svc = Api::<Service>::namespaced(env.lc.clone(), &env.ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let ep = Api::<Endpoints>::namespaced(env.lc.clone(), &env.ns)
        .create(&PostParams::default(), &ep)
        .await
        .unwrap();
    leases
        .create(
            &PostParams::default(),
            &linkerd_lease(&held, "linkerd-service-mirror-7f9", 30),
        )
        .await
        .unwrap();
    // Bad input too: a garbage holder, no leaseDurationSeconds (ours, 3 s, counts) and a
    // renewTime a year ahead (ignored).
    let mut garbage = linkerd_lease(&gone, "linkerd\n\u{7}💥 gone", 4);
    let spec = garbage.spec.as_mut().unwrap();
    spec.lease_duration_seconds = None;
    spec.renew_time = Some(MicroTime(
        k8s_openapi::jiff::Timestamp::now()
            + k8s_openapi::jiff::SignedDuration::from_hours(24 * 365),
    ));
    leases
        .create(&PostParams::default(), &garbage)
        .await
        .unwrap();
    // The test's own two creates, once the (asynchronous) audit log has them.
    let baseline = eventually("the pre-created mirror in the audit log", || async {
        let n = mirror_writes(&env, &env.ns, &held).len();
        (n >= 2).then_some(n)
    })
    .await;
    let renewer = renew_forever(&leases, &held_lease);

    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    let secrets = LinkSecrets::new(&env.lc, &ctl_ns);
    secrets.link("held", Some(&held), Some(&kc.yaml)).await;
    secrets.link("gone", Some(&gone), Some(&kc.yaml)).await;
    let admin = env.local.admin_kubeconfig().path.clone();
    let flags = [
        "--namespace-allow",
        env.ns.as_str(),
        "--lease-duration",
        "3s",
    ];
    let ctl = Controller::spawn_as(&admin, &ctl_ns, &flags, &[("POD_NAME", "ours-0")]);
    let started = Instant::now();
    ctl.wait_ready().await;
    let blocked = wait_event(&env.lc, &ctl_ns, "held", "WriteLeaseHeldElsewhere").await;
    assert!(blocked.contains("linkerd-service-mirror-7f9"), "{blocked}");

    // The Lease whose holder stopped renewing is taken over after a duration (ours).
    let taken = eventually("the unrenewed Lease taken over", || async {
        let l = leases.get(&gone_lease).await.ok()?;
        (holder(&l).as_deref() == Some("ours-0")).then_some(l)
    })
    .await;
    println!(
        "unrenewed foreign Lease (no duration: ours, 3 s) taken over {:?} after the start",
        started.elapsed()
    );
    let note = wait_event(&env.lc, &ctl_ns, "gone", "WriteLeaseHeldElsewhere").await;
    println!("its report: {note}");
    for said in [
        "\\n",
        "no positive leaseDurationSeconds",
        "renewTime",
        "ahead of our clock",
    ] {
        assert!(note.contains(said), "{said:?} in {note}");
    }
    assert_eq!(
        taken
            .metadata
            .labels
            .unwrap_or_default()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("service-mirror.linkerd.io")
    );
    wait_event(&env.lc, &ctl_ns, "gone", "WriteLeaseTakenOver").await;
    eventually("the taken-over link mirrors", || async {
        Api::<Service>::namespaced(env.lc.clone(), &env.ns)
            .get_opt(&format!("web-{gone}"))
            .await
            .unwrap()
    })
    .await;

    // Held and renewed while the remote Service changes: not one write to the held
    // link's mirrors.
    env.patch_remote(
        "web",
        serde_json::json!({"spec": {"ports": [{"name": "http", "port": 80}, {"name": "admin", "port": 9090}]}}),
    )
    .await;
    // The change reached the controller: the taken-over link, which watches the same
    // remote, mirrored it (the held link's watch runs too; its writes wait for the
    // Lease). Then two more looks at the renewed Lease, each a chance to take it or
    // to write, and the audit log caught up.
    eventually("the change mirrored by the taken-over link", || async {
        let svc = Api::<Service>::namespaced(env.lc.clone(), &env.ns)
            .get_opt(&format!("web-{gone}"))
            .await
            .unwrap()?;
        (service_ports(&svc).len() == 2).then_some(())
    })
    .await;
    two_more_reads(&ctl, &held_lease).await;
    audit_barrier(&env, &env.ns).await;
    let during = mirror_writes(&env, &env.ns, &held)[baseline..].to_vec();
    println!(
        "held by a foreign holder for {:?}: {} writes to its mirrors; writes to the taken-over link's: {}",
        started.elapsed(),
        during.len(),
        mirror_writes(&env, &env.ns, &gone).len()
    );
    assert!(
        during.is_empty(),
        "no write while held elsewhere: {during:?}"
    );
    let metrics = ctl.metrics_text().await;
    let series = format!(
        "service_mirror_write_lease_blocked{{cluster=\"{held}\",reason=\"held_by_foreign\"}} 1"
    );
    assert!(
        metrics.lines().any(|l| l == series),
        "{series} in\n{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l
                .starts_with("service_mirror_write_lease_takeovers_total{reason=\"expired\"} 1")),
        "{metrics}"
    );
    let still = leases.get(&held_lease).await.unwrap();
    assert_eq!(
        holder(&still).as_deref(),
        Some("linkerd-service-mirror-7f9")
    );

    // Released as client-go releases (holder "", 1 s): taken over, the mirrors adopted
    // in place.
    renewer.abort();
    let _ = renewer.await;
    release(&leases, &held_lease).await;
    let released = Instant::now();
    eventually("the released Lease taken over", || async {
        let l = leases.get(&held_lease).await.ok()?;
        (holder(&l).as_deref() == Some("ours-0")).then_some(())
    })
    .await;
    let took = released.elapsed();
    let (after, after_ep) = env
        .mirror_until("web", "adopted and updated", |s, e| {
            service_ports(s).len() == 2 && subset_ips(e) == ["192.0.2.1"]
        })
        .await;
    println!(
        "released: Lease taken over after {took:?}, mirror adopted and updated after {:?}; writes to it: {:?}",
        released.elapsed(),
        &mirror_writes(&env, &env.ns, &held)[baseline..]
    );
    assert_eq!(
        after.metadata.uid, svc.metadata.uid,
        "the Service adopted in place"
    );
    assert_eq!(
        after_ep.metadata.uid, ep.metadata.uid,
        "the Endpoints adopted in place"
    );
    assert!(
        !mirror_writes(&env, &env.ns, &held)
            .iter()
            .any(|(v, r, _)| v == "delete" && (r == "services" || r == "endpoints")),
        "nothing deleted"
    );
    wait_event(&env.lc, &ctl_ns, "held", "WriteLeaseTakenOver").await;
    let metrics = ctl.metrics_text().await;
    assert!(!metrics.contains(&series), "no longer blocked");
    secrets.unlink("held").await;
    secrets.unlink("gone").await;
    env.mirror_gone("web").await;
}

/// Releases the foreign holder's Lease `name` as client-go does (holder "", 1 s). An
/// aborted renewer's last replace may still land after the abort (it was on the wire), so
/// a 409 reads the Lease again: 5 tries.
async fn release(leases: &Api<Lease>, name: &str) {
    let mut holder_before = None;
    for attempt in 1..=5 {
        let mut l = leases.get(name).await.unwrap();
        // What changed it in between was the renewer (the same foreign holder), never
        // this controller writing a Lease held elsewhere.
        let now = holder(&l);
        assert!(
            holder_before.as_ref().is_none_or(|h| *h == now),
            "the Lease {name} changed holder under a foreign hold: {holder_before:?} -> {now:?}"
        );
        holder_before = Some(now);
        let spec = l.spec.as_mut().unwrap();
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        match leases.replace(name, &PostParams::default(), &l).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 5 => continue,
            Err(e) => panic!("release the Lease {name}: {e}"),
        }
    }
}

/// Renews Lease `name` every 1.5 s as its holder would, until aborted.
fn renew_forever(leases: &Api<Lease>, name: &str) -> tokio::task::JoinHandle<()> {
    let leases = leases.clone();
    let name = name.to_string();
    tokio::spawn(async move {
        loop {
            // Time is the subject: the foreign holder's renewal period.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let mut l = leases.get(&name).await.unwrap();
            l.spec.as_mut().unwrap().renew_time =
                Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
            let _ = leases.replace(&name, &PostParams::default(), &l).await;
        }
    })
}

#[tokio::test]
async fn unlinking_while_another_writer_renews_the_write_lease_deletes_no_mirror_until_the_lease_is_ours()
 {
    let env = Env::new("wlu").await;
    env.gateway("gw", 4143, &["192.0.2.1"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    create_namespace(&env.lc, &env.ns).await;
    let ctl_ns = unique_namespace("wlu-sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let leases: Api<Lease> = Api::namespaced(env.lc.clone(), &ctl_ns);
    let cluster = env.cluster.clone();
    let name = format!("service-mirror-write-{cluster}");
    // Linkerd's controller wrote the mirror and holds the Lease, renewing it.
    let (svc, ep) = linkerd_mirror(&env.ns, &cluster);
    Api::<Service>::namespaced(env.lc.clone(), &env.ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    Api::<Endpoints>::namespaced(env.lc.clone(), &env.ns)
        .create(&PostParams::default(), &ep)
        .await
        .unwrap();
    leases
        .create(
            &PostParams::default(),
            &linkerd_lease(&cluster, "linkerd-service-mirror-7f9", 30),
        )
        .await
        .unwrap();
    let renewer = renew_forever(&leases, &name);
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    let secrets = LinkSecrets::new(&env.lc, &ctl_ns);
    secrets.link("held", Some(&cluster), Some(&kc.yaml)).await;
    let admin = env.local.admin_kubeconfig().path.clone();
    let flags = [
        "--namespace-allow",
        env.ns.as_str(),
        "--lease-duration",
        "3s",
    ];
    let ctl = Controller::spawn_as(&admin, &ctl_ns, &flags, &[("POD_NAME", "ours-0")]);
    ctl.wait_ready().await;
    wait_event(&env.lc, &ctl_ns, "held", "WriteLeaseHeldElsewhere").await;

    // Unlinked while Linkerd's controller still renews: its mirrors are not ours to
    // delete (before, the cleanup retried without the write gate and deleted them).
    secrets.unlink("held").await;
    let unlinked = Instant::now();
    eventually("the link stopped", || async {
        let m = ctl.metrics_text().await;
        m.lines()
            .any(|l| l == "service_mirror_links 0")
            .then_some(())
    })
    .await;
    // A cleanup without the gate deletes at once. The unlinked cluster's Lease is
    // claimed for its cleanup: two more looks at the renewed Lease (each a chance to
    // take it and open the gate), and the audit log caught up, show none came.
    two_more_reads(&ctl, &name).await;
    audit_barrier(&env, &env.ns).await;
    let deletes: Vec<_> = mirror_writes(&env, &env.ns, &cluster)
        .into_iter()
        .filter(|(v, _, _)| v == "delete")
        .collect();
    println!(
        "unlinked while held elsewhere: {} deletes of its mirrors in {:?}",
        deletes.len(),
        unlinked.elapsed()
    );
    assert!(
        deletes.is_empty(),
        "no delete while held elsewhere: {deletes:?}"
    );
    assert!(
        Api::<Service>::namespaced(env.lc.clone(), &env.ns)
            .get_opt(&format!("web-{cluster}"))
            .await
            .unwrap()
            .is_some()
    );

    // Released: the Lease is ours, the unlink's cleanup deletes the mirrors, and only
    // then is the Lease deleted.
    renewer.abort();
    let _ = renewer.await;
    release(&leases, &name).await;
    let released = Instant::now();
    env.mirror_gone("web").await;
    eventually("the write Lease deleted after the cleanup", || async {
        leases.get_opt(&name).await.unwrap().is_none().then_some(())
    })
    .await;
    println!(
        "released: mirrors deleted and the Lease gone {:?} after the release",
        released.elapsed()
    );
    let lease_writes: Vec<_> = audit_writes(&env, &ctl_ns)
        .into_iter()
        .filter(|(_, r, n)| r == "leases" && *n == name)
        .collect();
    assert!(
        lease_writes.iter().any(|(v, _, _)| v == "delete"),
        "{lease_writes:?}"
    );
}
