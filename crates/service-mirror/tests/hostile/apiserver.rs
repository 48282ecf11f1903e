//! A hostile remote apiserver (tests/support/hostile_apiserver.rs) behind one link of
//! the real `service-mirror run`, beside a good link to a real remote. It first serves a
//! good list with two exported Services, so mirrors exist, then turns hostile. For each
//! case: the process stays up, the good link keeps mirroring (a new export appears), no
//! mirror of the hostile link is deleted or replaced, its peak RSS stays under the
//! install's 256 MiB limit, and where the product refuses, the refusal is reported.
//!
//! `HOSTILE_FLAGS` (space-separated) adds controller flags, e.g.
//! `--max-remote-cache-bytes=0 --max-remote-response-bytes=0` to see the cases fail
//! without the bounds.

use crate::support::controller::{Controller, LinkSecrets, link_secret, reader_kubeconfig};
use crate::support::hostile_apiserver::{
    Fail, Hostile, List, Script, Watch, assert_bounded_and_clean, exported, gateway, hostile_text,
    service,
};
use crate::support::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Service;
use kube::api::PostParams;
use serde_json::{Value, json};
use service_mirror_controller::frame_limit::FRAME_TOO_LARGE;
use std::sync::Arc;
use std::time::{Duration, Instant};

const GW: i32 = 4143;
/// The install's memory limit (deploy manifests: 256Mi).
const LIMIT_MIB: f64 = 256.0;

/// A good link to a real remote and a hostile one, both mirroring.
struct World {
    env: Env,
    ctl_ns: String,
    ctl: Controller,
    hostile: Hostile,
    /// The hostile link's cluster name.
    cluster: String,
    /// The first two items the hostile remote lists: its gateway and `alpha`, `beta`.
    good_items: Vec<Value>,
    /// uid of each hostile mirror once created.
    uids: Vec<(String, Option<String>)>,
    probes: std::sync::atomic::AtomicU32,
}

async fn world(prefix: &str, extra: &[&str]) -> World {
    let env = Env::new(prefix).await;
    env.gateway("gw", GW, &["192.0.2.1"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let ctl_ns = local_cluster::unique_namespace("sm");
    create_namespace(&env.lc, &ctl_ns).await;
    let mut args = vec![
        "--namespace-allow",
        &env.ns,
        "--endpoint-refresh-period",
        "2s",
    ];
    args.extend_from_slice(extra);
    let flags = std::env::var("HOSTILE_FLAGS").unwrap_or_default();
    args.extend(flags.split_whitespace());
    let ctl = Controller::spawn(&env.local, &ctl_ns, &args);
    ctl.wait_ready().await;
    let secrets = LinkSecrets::new(&env.lc, &ctl_ns);
    let kc = reader_kubeconfig(&env.remote, &env.ns, "reader").await;
    secrets
        .link("good", Some(&env.cluster), Some(&kc.yaml))
        .await;
    let ns = env.ns.clone();
    let good_items = vec![
        gateway(&ns, vec![json!({"ip": "192.0.2.1"})]),
        exported(&ns, "alpha"),
        exported(&ns, "beta"),
    ];
    let hostile = Hostile::start(Script {
        list: List::Items(Arc::new(good_items.clone())),
        watch: Watch::Quiet,
        fail: None,
    })
    .await;
    let cluster = format!("{}-h", env.cluster);
    let mut secret = link_secret("hostile", Some(&cluster), None);
    secret
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("mirror.linkerd.io/allow-insecure".into(), "http".into());
    secret.data = Some(
        [(
            "kubeconfig".to_string(),
            ByteString(hostile.kubeconfig().into_bytes()),
        )]
        .into(),
    );
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let mut uids = Vec::new();
    for name in ["alpha", "beta"] {
        let mirror = service_mirror_core::mirror_name(name, &cluster);
        let svc = eventually(&format!("hostile link mirrors {name}"), || async {
            env.local_services().get_opt(&mirror).await.unwrap()
        })
        .await;
        uids.push((mirror, svc.metadata.uid));
    }
    World {
        env,
        ctl_ns,
        ctl,
        hostile,
        cluster,
        good_items,
        uids,
        probes: Default::default(),
    }
}

impl World {
    /// The invariants of every case.
    async fn survives(&mut self, case: &str) {
        assert!(self.ctl.running(), "{case}: the controller is up");
        let n = self
            .probes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("probe-{n}");
        self.env.export(&name, "gw", &[("http", 80)]).await;
        self.env
            .mirror_until(&name, "the good link keeps mirroring", |_, _| true)
            .await;
        for (mirror, uid) in &self.uids {
            let svc = self.env.local_services().get_opt(mirror).await.unwrap();
            assert_eq!(
                svc.and_then(|s| s.metadata.uid),
                uid.clone(),
                "{case}: {mirror} kept, the same object"
            );
        }
        let rss = peak_rss_mib(self.ctl.child.id());
        eprintln!("{case}: peak RSS {rss:.0} MiB");
        assert!(rss < LIMIT_MIB, "{case}: peak RSS {rss:.0} MiB");
        assert!(
            !self.ctl.log_text().contains("panicked"),
            "{case}: no panic"
        );
    }

    /// The hostile remote lists `list` from its next list on, and its next watch says
    /// 410 Gone so that the link lists again.
    fn relist(&self, list: List) {
        self.hostile.set(|s| {
            s.list = list;
            s.watch = Watch::GoneOnce;
        });
    }

    async fn wait_relisted(&self, after: usize) {
        let cluster = self.cluster.clone();
        eventually("the hostile link listed again", || async {
            let n = self
                .ctl
                .log_lines("remote services listed again")
                .into_iter()
                .filter(|l| l.contains(&cluster))
                .count();
            (n > after).then_some(())
        })
        .await;
    }

    /// The hostile link's mirror of `name`, once `check` holds.
    async fn hostile_mirror(&self, name: &str, check: impl Fn(&Service) -> bool) -> Service {
        let mirror = service_mirror_core::mirror_name(name, &self.cluster);
        let api = self.env.local_services();
        eventually(&format!("hostile mirror {mirror}"), || async {
            api.get_opt(&mirror).await.unwrap().filter(|s| check(s))
        })
        .await
    }

    /// Waits up to `within` for an Event `reason` on the hostile link Secret.
    async fn wait_refusal(&self, reason: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let events = events_on(&self.env.lc, &self.ctl_ns, "hostile").await;
            if let Some((_, note)) = events.into_iter().find(|(r, _)| r == reason) {
                return note;
            }
            assert!(
                Instant::now() < deadline,
                "no {reason} Event within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn metric_has(&self, metrics: &str, reason: &str) -> bool {
        metrics.lines().any(|l| {
            l.starts_with("service_mirror_link_errors_total{")
                && l.contains("secret=\"hostile\"")
                && l.contains(&format!("reason=\"{reason}\""))
        })
    }
}

fn ports(n: usize, name: impl Fn(usize) -> String, port: impl Fn(usize) -> i64) -> Value {
    (0..n)
        .map(|i| json!({"name": name(i), "port": port(i), "protocol": "TCP"}))
        .collect()
}

#[tokio::test]
async fn invalid_names_ports_and_huge_port_and_ingress_lists_keep_every_mirror() {
    let mut w = world("hinvalid", &[]).await;
    let ns = w.env.ns.clone();
    let annotations = |gw: &str| json!({"mirror.linkerd.io/gateway-name": gw, "mirror.linkerd.io/gateway-ns": ns});
    let http = json!({"ports": [{"name": "http", "port": 80}]});
    let mut items = w.good_items.clone();
    items.extend([
        service(&ns, "ünïcødé-☃", annotations("gw"), http.clone()),
        service(&ns, &"x".repeat(300), annotations("gw"), http.clone()),
        service(
            &ns,
            "port-zero",
            annotations("gw"),
            json!({"ports": [{"name": "a", "port": 0}, {"name": "b", "port": 70000}]}),
        ),
        service(
            &ns,
            "dup-names",
            annotations("gw"),
            json!({"ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]}),
        ),
        service(
            &ns,
            "many-ports",
            annotations("gw"),
            json!({"ports": ports(5000, |i| format!("p{i}"), |i| 1000 + i as i64)}),
        ),
        service(&ns, "many-ingress", annotations("gw2"), http.clone()),
    ]);
    let mut gw2 = gateway(&ns, (0..5000).map(|i| json!({"ip": format!("192.0.2.{}", i % 250 + 1), "hostname": format!("h{i}.example")})).collect());
    gw2["metadata"]["name"] = json!("gw2");
    items.push(gw2);
    w.relist(List::Items(Arc::new(items)));
    w.wait_relisted(0).await;
    // What a real apiserver would refuse is refused by its reason, each said: a Warning
    // Event InvalidService on the link Secret naming the Service (cleaned and bounded),
    // and the reconcile error metric by reason. What it accepts is mirrored.
    let long = "x".repeat(300);
    for (name, reason) in [
        ("dup-names", "invalid_ports"),
        ("port-zero", "invalid_ports"),
        ("ünïcødé-☃", "invalid_name"),
        (long.as_str(), "invalid_name"),
    ] {
        let note = eventually(&format!("the refusal of {name} said"), || async {
            events_on(&w.env.lc, &w.ctl_ns, "hostile")
                .await
                .into_iter()
                .find(|(r, n)| r == "InvalidService" && n.contains(&name[..name.len().min(40)]))
                .map(|(_, n)| n)
        })
        .await;
        assert!(note.chars().count() < 600, "a bounded note: {note}");
        eventually(&format!("reconcile_errors {reason}"), || async {
            w.ctl
                .metrics()
                .await
                .lines()
                .any(|l| {
                    l.starts_with("service_mirror_reconcile_errors_total{")
                        && l.contains(&format!("\"{reason}\""))
                })
                .then_some(())
        })
        .await;
    }
    // A refusal is a decision, not a failure: the runtime counts those reconciles done,
    // none failed (a refused Service is not retried with backoff forever).
    let metrics = w.ctl.metrics().await;
    let reconciles = |outcome: &str| {
        let series = format!(
            r#"service_mirror_component_reconciles_total{{component="link",outcome="{outcome}"}}"#
        );
        metrics.lines().any(|l| l.starts_with(&series))
    };
    assert!(reconciles("done"), "link reconciles counted: {metrics}");
    assert!(!reconciles("failed"), "no failed link reconcile: {metrics}");
    for name in ["many-ports", "many-ingress"] {
        w.hostile_mirror(name, |_| true).await;
    }
    let suffix = format!("-{}", w.cluster);
    let mirrors: Vec<String> = w
        .env
        .local_services()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .filter(|n| n.ends_with(&suffix))
        .collect();
    for refused in ["dup-names", "port-zero"] {
        let mirror = service_mirror_core::mirror_name(refused, &w.cluster);
        assert!(!mirrors.contains(&mirror), "{mirror} not created");
    }
    assert_eq!(
        mirrors.len(),
        4,
        "alpha, beta and the two valid ones: {mirrors:?}"
    );
    // No create of an invalid mirror was even tried: nothing for the apiserver to refuse.
    let tried: Vec<String> = w
        .env
        .local_write_attempts()
        .into_iter()
        .filter(|l| l.contains("dup-names") || l.contains("port-zero"))
        .collect();
    assert!(tried.is_empty(), "writes of refused mirrors: {tried:?}");
    w.survives("invalid names and ports").await;
}

#[tokio::test]
async fn a_5_mb_object_is_stripped_and_a_100_mb_list_hits_the_frame_limit() {
    let mut w = world("hbig", &[]).await;
    let ns = w.env.ns.clone();
    let mut items = w.good_items.clone();
    let mut big = exported(&ns, "gamma");
    big["metadata"]["annotations"]["big"] = json!("B".repeat(5 << 20));
    items.push(big);
    w.relist(List::Items(Arc::new(items)));
    w.wait_relisted(0).await;
    let svc = w.hostile_mirror("gamma", |_| true).await;
    w.uids
        .push((svc.metadata.name.clone().unwrap(), svc.metadata.uid));
    w.survives("a 5 MB Service").await;

    let start = Instant::now();
    w.relist(List::Endless { bytes: 100 << 20 });
    let note = w
        .wait_refusal("RemoteResponseTooLarge", Duration::from_secs(120))
        .await;
    eprintln!("100 MB list refused after {:?}: {note}", start.elapsed());
    let metrics = w.ctl.metrics().await;
    assert!(
        w.metric_has(&metrics, "RemoteResponseTooLarge"),
        "{metrics}"
    );
    // Retried with backoff and refused again (kube's watcher logs each failed list at
    // debug, the level the controller runs with), said once.
    let refusals = || {
        w.ctl
            .log_lines("list error")
            .into_iter()
            .filter(|l| l.contains("FrameTooLarge") || l.contains(FRAME_TOO_LARGE))
            .count()
    };
    let first = refusals();
    assert!(first >= 1, "the refused list logged: {}", w.ctl.log_text());
    eventually("the list refused again", || async {
        (refusals() > first).then_some(())
    })
    .await;
    let events = events_on(&w.env.lc, &w.ctl_ns, "hostile").await;
    let said = events
        .iter()
        .filter(|(r, _)| r == "RemoteResponseTooLarge")
        .count();
    assert_eq!(said, 1, "one Event per refusal: {events:?}");
    w.survives("a 100 MB list body").await;
}

#[tokio::test]
async fn a_500k_item_paginated_list_hits_the_cache_cap_and_changes_no_mirror() {
    let mut w = world("hpaged", &[]).await;
    let start = Instant::now();
    w.relist(List::Generated {
        first: Arc::new(w.good_items.clone()),
        total: 500_000,
    });
    let note = w
        .wait_refusal("RemoteTooLarge", Duration::from_secs(300))
        .await;
    eprintln!(
        "500,000 items: refused after {:?} and {} requests: {note}",
        start.elapsed(),
        w.hostile
            .requests
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    let metrics = w.ctl.metrics().await;
    assert!(w.metric_has(&metrics, "RemoteTooLarge"), "{metrics}");
    w.survives("a 500,000-item list").await;

    // The list is tried again after the backoff (1 min) and refused again: said once.
    let cluster = w.cluster.clone();
    let deadline = Instant::now() + Duration::from_secs(180);
    while w
        .ctl
        .log_lines("remote services over the cache cap")
        .iter()
        .filter(|l| l.contains(&cluster))
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "no second try within 180 s");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let events = events_on(&w.env.lc, &w.ctl_ns, "hostile").await;
    let said = events.iter().filter(|(r, _)| r == "RemoteTooLarge").count();
    assert_eq!(said, 1, "one Event across retries: {events:?}");
    w.survives("a 500,000-item list, refused again").await;
}

#[tokio::test]
async fn malformed_watch_events_are_skipped_and_the_watch_goes_on() {
    let mut w = world("hwatch", &[]).await;
    let ns = w.env.ns.clone();
    let mut alpha = exported(&ns, "alpha");
    alpha["metadata"]["resourceVersion"] = json!("2");
    alpha["spec"]["ports"][0]["port"] = json!(81);
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": ns, "resourceVersion": "3"}, "spec": {"containers": []}});
    w.hostile.set(|s| {
        s.watch = Watch::Lines(vec![
            "this is not json {".into(),
            json!({"type": "WEIRD", "object": {}}).to_string(),
            json!({"type": "ADDED", "object": pod}).to_string(),
            json!({"type": "MODIFIED", "object": alpha}).to_string(),
        ])
    });
    w.hostile_mirror("alpha", |s| service_ports(s).iter().any(|(_, p)| *p == 81))
        .await;
    w.survives("malformed watch events").await;
}

#[tokio::test]
async fn a_stalled_watch_deletes_nothing() {
    let mut w = world("hstall", &[]).await;
    let before = w
        .hostile
        .requests
        .load(std::sync::atomic::Ordering::Relaxed);
    w.hostile.set(|s| s.watch = Watch::Stall);
    // The quiet watch open now ends within its second: the link's next one stalls.
    eventually("the link watches again, into the stall", || async {
        let now = w
            .hostile
            .requests
            .load(std::sync::atomic::Ordering::Relaxed);
        (now > before).then_some(())
    })
    .await;
    // Time is the subject: a stall is a watch that stays silent, here ten times as long
    // as a good watch lasts (1 s), far shorter than kube's read timeout (295 s); no timer
    // of the controller falls in between.
    tokio::time::sleep(Duration::from_secs(10)).await;
    w.survives("a stalled watch").await;
}

#[tokio::test]
async fn a_429_storm_then_a_1_mb_403_keep_every_mirror_and_say_it_cleanly() {
    let mut w = world("hstorm", &[]).await;
    let before = w
        .hostile
        .requests
        .load(std::sync::atomic::Ordering::Relaxed);
    w.hostile.set(|s| s.fail = Some(Fail::TooMany));
    // Time is the subject: backoff is a bound on the requests within a span.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let during = w
        .hostile
        .requests
        .load(std::sync::atomic::Ordering::Relaxed)
        - before;
    eprintln!("429 storm: {during} requests in 15 s");
    assert!(during < 60, "backoff bounds the requests: {during} in 15 s");
    w.survives("a 429 storm").await;

    w.hostile
        .set(|s| s.fail = Some(Fail::Forbidden(hostile_text(1 << 20))));
    let note = w
        .wait_refusal("RemoteForbidden", Duration::from_secs(60))
        .await;
    assert_bounded_and_clean(&note, &w.ctl.log_lines(&w.cluster));
    w.survives("a 1 MB 403").await;

    // The storm over, the link mirrors again.
    let mut items = w.good_items.clone();
    items.push(exported(&w.env.ns, "delta"));
    w.hostile.set(|s| s.fail = None);
    w.relist(List::Items(Arc::new(items)));
    w.hostile_mirror("delta", |_| true).await;
}
