//! The stale-remote policy on the wire, with the real `service-mirror run` binary: local
//! `west` and remote `east` with data planes (docs/data-plane.md), east's workload behind
//! the stand-in gateway, the controller run with `--remote-grace 2s --stale-after 6s
//! --stale-delete-after 12s`. East's apiserver stopped with its gateway answering:
//! requests keep succeeding through Disconnected and Stale (the probe says alive) and
//! fail in Expired. Both down: the probe turns the endpoints not ready first, and the
//! states still come at the configured times.
//! Needs root: without it each test prints `skipped: needs root for network namespaces`.

use crate::support::controller::{Controller, link_secret, reader_kubeconfig};
use crate::support::wire::data_plane_cluster;
use crate::support::*;
use k8s_openapi::api::core::v1::{Secret, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, PostParams};
use local_cluster::{
    DataPlane, Gateway, HttpAnswer, LocalCluster, Workload, publish_endpoints,
    skip_without_data_plane,
};
use std::time::{Duration, Instant};

/// The stale settings of these tests, in seconds.
const GRACE: u64 = 2;
const STALE: u64 = 6;
const EXPIRE: u64 = 12;

/// The mirror's name on west.
const MIRROR: &str = "web-east.shop.svc.cluster.local";

/// West and east with data planes, east's `shop/web` (port 80 → 8080) exported through
/// the stand-in gateway, the controller on west linked to east.
struct World {
    west: LocalCluster,
    east: LocalCluster,
    ctl: Controller,
    gateway: Option<Gateway>,
    _workload: Workload,
    _permit: tokio::sync::SemaphorePermit<'static>,
}

/// One world (two data-plane clusters) at a time: the machines are 2-core.
static WORLDS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

impl World {
    async fn new(west_name: &str, east_name: &str) -> Self {
        let permit = WORLDS.acquire().await.expect("never closed");
        let (west, east) =
            tokio::join!(data_plane_cluster(west_name), data_plane_cluster(east_name));
        let (wc, ec) = (west.client().await.unwrap(), east.client().await.unwrap());
        for c in [&wc, &ec] {
            create_namespace(c, "shop").await;
        }
        let ep = east.data_plane().unwrap();
        let workload = ep.serve_http(8080, "east/web:http").unwrap();
        let east_ip = ep.node_ip().to_string();
        let mut svc = exported("web", "shop", "gateway", &[]);
        svc.spec.as_mut().unwrap().ports = Some(vec![ServicePort {
            name: Some("http".into()),
            port: 80,
            target_port: Some(IntOrString::Int(8080)),
            ..Default::default()
        }]);
        Api::<Service>::namespaced(ec.clone(), "shop")
            .create(&PostParams::default(), &svc)
            .await
            .unwrap();
        publish_endpoints(&ec, "shop", "web", &east_ip, &[("http", 8080)])
            .await
            .unwrap();
        let gateway = ep.start_gateway("east").unwrap();
        stand_in_gateway_service(&ec, "shop", &east_ip, &[&east_ip]).await;

        let ctl_ns = local_cluster::unique_namespace("sm");
        create_namespace(&wc, &ctl_ns).await;
        let (grace, stale, expire) = (
            format!("{GRACE}s"),
            format!("{STALE}s"),
            format!("{EXPIRE}s"),
        );
        let flags = [
            "--namespace-allow",
            "shop",
            "--remote-grace",
            &grace,
            "--stale-after",
            &stale,
            "--stale-delete-after",
            &expire,
        ];
        let ctl = Controller::spawn(&west, &ctl_ns, &flags);
        ctl.wait_ready().await;
        let kc = reader_kubeconfig(&east, "shop", "reader").await;
        Api::<Secret>::namespaced(wc.clone(), &ctl_ns)
            .create(
                &PostParams::default(),
                &link_secret("cluster-credentials-east", Some("east"), Some(&kc.yaml)),
            )
            .await
            .unwrap();
        Self {
            west,
            east,
            ctl,
            gateway: Some(gateway),
            _workload: workload,
            _permit: permit,
        }
    }

    fn wp(&self) -> &DataPlane {
        self.west.data_plane().unwrap()
    }

    /// Waits (a request every 250 ms, at most 120 s) until the mirror answers.
    async fn until_answered(&self) {
        let start = Instant::now();
        loop {
            if answered(&self.wp().http_get(MIRROR, 80, "/").await) {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(120), "never answered");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The current state per the controller's metric.
    async fn state(&self) -> Option<String> {
        let text = self.ctl.metrics().await;
        let prefix = "service_mirror_remote_state{cluster=\"east\",state=\"";
        text.lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .find(|l| l.ends_with("\"} 1"))
            .map(|l| l.trim_end_matches("\"} 1").to_owned())
    }
}

fn answered(r: &local_cluster::Result<HttpAnswer>) -> bool {
    matches!(r, Ok(a) if a.status == 200 && a.body == "east/web:http")
}

/// What one run of requests saw: when each state was first reported and when requests
/// first failed, since the outage began.
#[derive(Debug, Default)]
struct Timeline {
    states: Vec<(String, f64)>,
    first_failure: Option<f64>,
    answered_before_first_failure: u32,
    answered_after_first_failure: u32,
    sent: u32,
}

/// Requests every 200 ms (at most 150, 30 s) and reads the state metric each time,
/// from `t0`, until the Expired state has lasted 3 s.
async fn observe(w: &World, t0: Instant) -> Timeline {
    let mut t = Timeline::default();
    let mut expired_at = None;
    while t.sent < 150 && t0.elapsed() < Duration::from_secs(30) {
        let r = w.wp().http_get(MIRROR, 80, "/").await;
        t.sent += 1;
        let now = t0.elapsed().as_secs_f64();
        match (answered(&r), t.first_failure) {
            (true, None) => t.answered_before_first_failure += 1,
            (true, Some(_)) => t.answered_after_first_failure += 1,
            (false, None) => t.first_failure = Some(now),
            (false, Some(_)) => {}
        }
        if let Some(s) = w.state().await
            && t.states.last().is_none_or(|(l, _)| *l != s)
        {
            if s == "expired" {
                expired_at = Some(Instant::now());
            }
            t.states.push((s, now));
        }
        if expired_at.is_some_and(|e| e.elapsed() > Duration::from_secs(3)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    t
}

fn at(t: &Timeline, state: &str) -> f64 {
    t.states
        .iter()
        .find(|(s, _)| s == state)
        .map(|(_, at)| *at)
        .unwrap_or_else(|| panic!("{state} never reported: {t:?}"))
}

#[tokio::test]
async fn with_the_gateway_up_traffic_flows_through_disconnected_and_stale_and_stops_in_expired() {
    if skip_without_data_plane("wire_stale: gateway up") {
        return;
    }
    let w = World::new("west-st", "east-st").await;
    w.until_answered().await;
    // t0 before the kill: the controller cannot see east gone earlier, so a state
    // reported before its set time counts as early (one run, with t0 taken after the
    // gateway's drop, saw `stale` 18 ms before it).
    let t0 = Instant::now();
    w.east.stop_apiserver();
    let t = observe(&w, t0).await;
    eprintln!("measured (gateway up): {t:?}");
    let (disc, stale, exp) = (at(&t, "disconnected"), at(&t, "stale"), at(&t, "expired"));
    // Each read costs a request and a scrape (~0.2-0.5 s on a loaded machine).
    assert!((GRACE as f64..GRACE as f64 + 2.0).contains(&disc), "{t:?}");
    assert!((STALE as f64..STALE as f64 + 2.0).contains(&stale), "{t:?}");
    assert!((EXPIRE as f64..EXPIRE as f64 + 2.0).contains(&exp), "{t:?}");
    let failed = t.first_failure.expect("requests fail in Expired");
    assert!(
        failed >= EXPIRE as f64,
        "every request before Expired was answered: first failure at {failed:.2} s"
    );
    assert!(failed < EXPIRE as f64 + 4.0, "{t:?}");
    assert_eq!(t.answered_after_first_failure, 0, "{t:?}");

    w.east.start_apiserver().await.unwrap();
    let back = Instant::now();
    w.until_answered().await;
    eprintln!(
        "measured: answered again {:?} after east's apiserver restarted",
        back.elapsed()
    );
}

#[tokio::test]
async fn with_the_gateway_and_the_apiserver_down_the_states_come_at_the_set_times() {
    if skip_without_data_plane("wire_stale: both down") {
        return;
    }
    let mut w = World::new("west-sb", "east-sb").await;
    w.until_answered().await;
    // As above: t0 before the kill and the gateway's drop.
    let t0 = Instant::now();
    w.east.stop_apiserver();
    drop(w.gateway.take());
    let t = observe(&w, t0).await;
    eprintln!("measured (both down): {t:?}");
    let (stale, exp) = (at(&t, "stale"), at(&t, "expired"));
    assert!((STALE as f64..STALE as f64 + 2.0).contains(&stale), "{t:?}");
    assert!((EXPIRE as f64..EXPIRE as f64 + 2.0).contains(&exp), "{t:?}");
    assert!(t.first_failure.is_some_and(|f| f < exp), "{t:?}");
    assert_eq!(t.answered_after_first_failure, 0, "{t:?}");
    let log = w.ctl.log_text();
    assert!(
        log.contains("RemoteStale") || log.contains("--stale-after"),
        "{log}"
    );
}
