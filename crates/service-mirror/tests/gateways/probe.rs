//! Gateway probing on real apiservers, against small HTTP servers run by the test on
//! 127.0.0.x addresses standing in for remote gateways.

use crate::support::*;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::PostParams;
use service_mirror_controller::gateway::ProbeRedirect;
use service_mirror_controller::link_controller::{LinkConfig, LinkDeps};
use service_mirror_controller::metrics::Metrics;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Healthy,
    Failing,
    Slow,
}

/// An HTTP server answering probes as told; dropping it (or `stop`) closes the port.
struct FakeGateway {
    addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeGateway {
    async fn start(ip: &str) -> Self {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(Mutex::new(Mode::Healthy));
        let hits = Arc::new(AtomicUsize::new(0));
        let (m, h) = (mode.clone(), hits.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                h.fetch_add(1, Ordering::SeqCst);
                let mode = *m.lock().unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = conn.read(&mut buf).await;
                    let answer = match mode {
                        Mode::Healthy => "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                        Mode::Failing => {
                            "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
                        }
                        Mode::Slow => {
                            // Time is the subject: slow is an answer later than the
                            // probe timeout (300 ms in these tests).
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                        }
                    };
                    let _ = conn.write_all(answer.as_bytes()).await;
                });
            }
        });
        Self {
            addr,
            mode,
            hits,
            task,
        }
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for FakeGateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Creates or updates gateway `name` pointing at `fake` (ingress IP + mc-probe port).
async fn gateway_for(env: &Env, name: &str, fake: &FakeGateway, period: Option<&str>) {
    let api = env.remote_services();
    let ip = public_ip(fake);
    let mut annotations = serde_json::json!({"mirror.linkerd.io/probe-path": "/health"});
    if let Some(p) = period {
        annotations["mirror.linkerd.io/probe-period"] = p.into();
    }
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "ports": [
            {"name": "mc-gateway", "port": 4143}, {"name": "mc-probe", "port": fake.addr.port()}]}
    }))
    .unwrap();
    if api.get_opt(name).await.unwrap().is_none() {
        api.create(&PostParams::default(), &svc).await.unwrap();
    } else {
        env.patch_remote(name, serde_json::json!({"spec": svc.spec}))
            .await;
    }
    set_ingress(&env.rc, &env.ns, name, &[&ip]).await;
}

/// Endpoints may not hold loopback addresses, so a gateway at 127.0.0.N is published as
/// 192.0.2.N (a documentation range, never contacted) and probes are redirected back.
fn public_ip(fake: &FakeGateway) -> String {
    match fake.addr.ip() {
        std::net::IpAddr::V4(v4) => format!("192.0.2.{}", v4.octets()[3]),
        other => panic!("fake gateways listen on 127.0.0.N, not {other}"),
    }
}

fn redirect() -> ProbeRedirect {
    ProbeRedirect(Arc::new(|addr: SocketAddr| match addr.ip() {
        std::net::IpAddr::V4(v4) if v4.octets()[..3] == [192, 0, 2] => {
            SocketAddr::from(([127, 0, 0, v4.octets()[3]], addr.port()))
        }
        _ => addr,
    }))
}

fn fast_options(env: &Env, metrics: Arc<Metrics>) -> (LinkConfig, LinkDeps) {
    let config = LinkConfig {
        probe_timeout: Duration::from_millis(300),
        probe_failure_threshold: 2,
        ..env.config()
    };
    let deps = LinkDeps {
        probe_redirect: Some(redirect()),
        metrics,
        ..LinkDeps::default()
    };
    (config, deps)
}

fn ready_ips(ep: &Endpoints) -> Vec<String> {
    subset_ips(ep)
}

fn not_ready_ips(ep: &Endpoints) -> Vec<String> {
    ep.subsets
        .iter()
        .flatten()
        .flat_map(|s| s.not_ready_addresses.iter().flatten().map(|a| a.ip.clone()))
        .collect()
}

/// The probes sent to gateway `gw` so far (both outcomes), from `metrics`.
fn probes(metrics: &Metrics, env: &Env, gw: &str) -> u64 {
    let labels = format!(
        "gateway_name=\"{gw}\",gateway_namespace=\"{}\",target_cluster_name=\"{}\"",
        env.ns, env.cluster
    );
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("gateway_probes_total{") && l.contains(&labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn enabled_series(env: &Env, gw: &str) -> String {
    format!(
        "gateway_enabled{{gateway_name=\"{gw}\",gateway_namespace=\"{}\",target_cluster_name=\"{}\"}}",
        env.ns, env.cluster
    )
}

fn alive_series(env: &Env, gw: &str, value: u8) -> String {
    format!(
        "gateway_alive{{gateway_name=\"{gw}\",gateway_namespace=\"{}\",target_cluster_name=\"{}\"}} {value}",
        env.ns, env.cluster
    )
}

#[tokio::test]
async fn a_dead_gateway_turns_its_mirrors_not_ready_and_back() {
    let env = Env::new("probe").await;
    let fake = FakeGateway::start("127.0.0.11").await;
    gateway_for(&env, "gw", &fake, Some("1")).await;
    env.export("a", "gw", &[("http", 80), ("admin", 9000)])
        .await;
    env.export("b", "gw", &[("http", 80)]).await;
    let metrics = Metrics::new();
    let w = {
        let (config, deps) = fast_options(&env, metrics.clone());
        env.watch_with(config, deps)
    };
    for s in ["a", "b"] {
        env.mirror_until(s, "ready", |_, e| ready_ips(e) == ["192.0.2.11"])
            .await;
    }
    eventually("probes recorded", || async {
        metrics
            .encode()
            .contains(&alive_series(&env, "gw", 1))
            .then_some(())
    })
    .await;
    let (_, healthy) = env.mirror("a").await;
    let ports_before = subset_ports(&healthy.unwrap());

    // Healthy: no write while nothing changes, over two more probe rounds (the probes
    // are the only periodic activity here; a verdict that changed would queue both).
    let writes = env.local_writes().len();
    let sent = probes(&metrics, &env, "gw");
    eventually("two probe rounds", || async {
        (probes(&metrics, &env, "gw") >= sent + 2).then_some(())
    })
    .await;
    assert_eq!(
        env.local_writes().len(),
        writes,
        "steady probes write nothing"
    );

    fake.set(Mode::Failing);
    for s in ["a", "b"] {
        env.mirror_until(s, "not ready", |_, e| {
            ready_ips(e).is_empty() && not_ready_ips(e) == ["192.0.2.11"]
        })
        .await;
    }
    let (_, down) = env.mirror("a").await;
    assert_eq!(
        subset_ports(&down.unwrap()),
        ports_before,
        "ports unchanged while down"
    );
    let text = metrics.encode();
    assert!(text.contains(&alive_series(&env, "gw", 0)), "{text}");
    assert!(text.contains("probe_successful=\"false\""), "{text}");
    assert!(text.contains("gateway_probe_latency_ms_bucket"), "{text}");

    fake.set(Mode::Healthy);
    for s in ["a", "b"] {
        env.mirror_until(s, "ready again", |_, e| {
            ready_ips(e) == ["192.0.2.11"] && not_ready_ips(e).is_empty()
        })
        .await;
    }
    assert!(metrics.encode().contains(&alive_series(&env, "gw", 1)));

    // No mirror uses the gateway: its prober stops.
    env.delete_remote("a").await;
    env.delete_remote("b").await;
    env.mirror_gone("a").await;
    env.mirror_gone("b").await;
    // The prober is gone: its gauges go with it (a probe already sent may still land).
    eventually("the prober stopped", || async {
        (!metrics.encode().contains(&enabled_series(&env, "gw"))).then_some(())
    })
    .await;
    let hits = fake.hits();
    // Time is the subject: a stopped prober is told by the probes that do not come;
    // two probe periods (1 s, jittered up to 1.1 s) would bring two.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert!(
        fake.hits() <= hits + 1,
        "prober stopped: {hits} -> {}",
        fake.hits()
    );
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn a_slow_gateway_counts_as_failing() {
    let env = Env::new("slow").await;
    let fake = FakeGateway::start("127.0.0.12").await;
    gateway_for(&env, "gw", &fake, Some("1")).await;
    env.export("a", "gw", &[("http", 80)]).await;
    let w = {
        let (config, deps) = fast_options(&env, Metrics::new());
        env.watch_with(config, deps)
    };
    env.mirror_until("a", "ready", |_, e| ready_ips(e) == ["192.0.2.12"])
        .await;
    fake.set(Mode::Slow);
    env.mirror_until("a", "not ready after timeouts", |_, e| {
        not_ready_ips(e) == ["192.0.2.12"]
    })
    .await;
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn a_gateway_whose_ip_changes_is_probed_at_the_new_address() {
    let env = Env::new("moved").await;
    let old = FakeGateway::start("127.0.0.13").await;
    let new = FakeGateway::start("127.0.0.14").await;
    gateway_for(&env, "gw", &old, Some("1")).await;
    env.export("a", "gw", &[("http", 80)]).await;
    let w = {
        let (config, deps) = fast_options(&env, Metrics::new());
        env.watch_with(config, deps)
    };
    env.mirror_until("a", "ready at the old address", |_, e| {
        ready_ips(e) == ["192.0.2.13"]
    })
    .await;
    // The gateway moves (new IP and new probe port); the old address dies.
    gateway_for(&env, "gw", &new, Some("1")).await;
    old.stop();
    env.mirror_until("a", "ready at the new address", |_, e| {
        ready_ips(e) == ["192.0.2.14"]
    })
    .await;
    let hits = new.hits();
    eventually("the new address probed twice more", || async {
        (new.hits() >= hits + 2).then_some(())
    })
    .await;
    let (_, ep) = env.mirror("a").await;
    assert_eq!(
        ready_ips(&ep.unwrap()),
        ["192.0.2.14"],
        "the dead old address does not matter"
    );
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn two_gateways_of_one_cluster_are_independent() {
    let env = Env::new("twogw").await;
    let dying = FakeGateway::start("127.0.0.15").await;
    let fine = FakeGateway::start("127.0.0.16").await;
    gateway_for(&env, "gw-dying", &dying, Some("1")).await;
    gateway_for(&env, "gw-fine", &fine, Some("1")).await;
    env.export("x", "gw-dying", &[("http", 80)]).await;
    env.export("y", "gw-fine", &[("http", 80)]).await;
    let w = {
        let (config, deps) = fast_options(&env, Metrics::new());
        env.watch_with(config, deps)
    };
    env.mirror_until("x", "x ready", |_, e| ready_ips(e) == ["192.0.2.15"])
        .await;
    env.mirror_until("y", "y ready", |_, e| ready_ips(e) == ["192.0.2.16"])
        .await;
    let (_, y_before) = env.mirror("y").await;
    dying.stop();
    env.mirror_until("x", "x not ready", |_, e| {
        not_ready_ips(e) == ["192.0.2.15"]
    })
    .await;
    let (_, y_after) = env.mirror("y").await;
    assert_eq!(
        y_before.unwrap().metadata.resource_version,
        y_after.unwrap().metadata.resource_version,
        "the other gateway's mirrors are untouched"
    );
    w.stop(false).await.unwrap();
}

/// With default settings (period 3 s, 3 failures, 5 s timeout): how long from a gateway's
/// death to not-ready endpoints, and from its recovery to ready ones.
#[tokio::test]
async fn default_settings_detection_times() {
    let env = Env::new("timing").await;
    let fake = FakeGateway::start("127.0.0.17").await;
    gateway_for(&env, "gw", &fake, None).await;
    env.export("a", "gw", &[("http", 80)]).await;
    let metrics = Metrics::new();
    let w = env.watch_with(
        env.config(),
        LinkDeps {
            probe_redirect: Some(redirect()),
            metrics: metrics.clone(),
            ..LinkDeps::default()
        },
    );
    env.mirror_until("a", "ready", |_, e| ready_ips(e) == ["192.0.2.17"])
        .await;
    // Probed healthy once: the prober runs its periods, the address alive on a probe
    // and not on the optimistic first verdict.
    eventually("a successful probe", || async {
        metrics
            .encode()
            .contains(&alive_series(&env, "gw", 1))
            .then_some(())
    })
    .await;
    fake.set(Mode::Failing);
    let died = Instant::now();
    env.mirror_until("a", "not ready", |_, e| not_ready_ips(e) == ["192.0.2.17"])
        .await;
    let to_not_ready = died.elapsed();
    fake.set(Mode::Healthy);
    let recovered = Instant::now();
    env.mirror_until("a", "ready again", |_, e| ready_ips(e) == ["192.0.2.17"])
        .await;
    let to_ready = recovered.elapsed();
    println!(
        "default settings: gateway death -> not ready in {to_not_ready:.1?}; recovery -> ready in {to_ready:.1?}"
    );
    // Not ready takes 3 consecutive failures: the first within one jittered period
    // (3-3.3 s) of the death, two more periods after it, so 6-9.9 s plus the write; the
    // lower bound proves the threshold is kept (one failure never flips it). Recovery is
    // one success: at most one period. The upper bounds leave 5 s for a loaded machine.
    assert!(
        to_not_ready >= Duration::from_millis(5900),
        "3 failures 3 s apart need 6 s, not {to_not_ready:?}"
    );
    assert!(
        to_not_ready <= Duration::from_secs(15),
        "3 probe periods plus margin: {to_not_ready:?}"
    );
    assert!(
        to_ready <= Duration::from_millis(8300),
        "one probe period plus margin: {to_ready:?}"
    );
    w.stop(false).await.unwrap();
}

/// The mirror's EndpointSlices' endpoints: `(address, ready)`, sorted.
async fn slice_readiness(env: &Env, remote: &str) -> Vec<(String, bool)> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let api: kube::Api<EndpointSlice> = kube::Api::namespaced(env.lc.clone(), &env.ns);
    let selector = format!("kubernetes.io/service-name={}", env.mirror_name(remote));
    let list = api
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .unwrap();
    let mut out: Vec<(String, bool)> = list
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .flat_map(|e| {
            let ready = e.conditions.as_ref().and_then(|c| c.ready) == Some(true);
            e.addresses.iter().map(move |a| (a.clone(), ready))
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn every_gateway_address_is_probed_and_a_dead_one_goes_not_ready_alone() {
    let started = Instant::now();
    let env = Env::new("probe2").await;
    let first = FakeGateway::start("127.0.0.21").await;
    let second = FakeGateway::start("127.0.0.22").await;
    // One gateway, two addresses: each probe goes to its own server.
    let (a, b) = (public_ip(&first), public_ip(&second));
    let (to_first, to_second) = (first.addr, second.addr);
    let redirect = ProbeRedirect(Arc::new(move |addr: SocketAddr| {
        match addr.ip().to_string().as_str() {
            "192.0.2.21" => to_first,
            "192.0.2.22" => to_second,
            _ => addr,
        }
    }));
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gw2", "annotations": {
            "mirror.linkerd.io/probe-path": "/health", "mirror.linkerd.io/probe-period": "1"}},
        "spec": {"type": "LoadBalancer", "ports": [
            {"name": "mc-gateway", "port": 4143}, {"name": "mc-probe", "port": 4191}]}
    }))
    .unwrap();
    env.remote_services()
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    set_ingress(&env.rc, &env.ns, "gw2", &[a.as_str(), b.as_str()]).await;
    env.export("web", "gw2", &[("http", 80)]).await;
    let metrics = Metrics::new();
    let w = {
        let (config, mut deps) = fast_options(&env, metrics.clone());
        deps.probe_redirect = Some(redirect);
        let config = LinkConfig {
            endpoints_mode: service_mirror_core::EndpointsMode::Both,
            ..config
        };
        env.watch_with(config, deps)
    };
    let slices_until = |what: &'static str, want: Vec<(String, bool)>| {
        let env = &env;
        async move {
            eventually(what, || async {
                (slice_readiness(env, "web").await == want).then_some(())
            })
            .await
        }
    };
    let both = vec![(a.clone(), true), (b.clone(), true)];
    env.mirror_until("web", "both ready", |_, e| {
        ready_ips(e) == [a.as_str(), b.as_str()]
    })
    .await;
    slices_until("both ready in the slice", both.clone()).await;
    eventually("both addresses probed", || async {
        (first.hits() > 0 && second.hits() > 0).then_some(())
    })
    .await;

    // The second address fails its probes: it alone goes not ready.
    second.set(Mode::Failing);
    let (_, ep) = env
        .mirror_until("web", "the second not ready alone", |_, e| {
            ready_ips(e) == [a.as_str()] && not_ready_ips(e) == [b.as_str()]
        })
        .await;
    assert_eq!(ready_ips(&ep), [a.as_str()]);
    slices_until(
        "the second not ready alone in the slice",
        vec![(a.clone(), true), (b.clone(), false)],
    )
    .await;
    // The gateway is alive while one address is (Linkerd's series, one per gateway).
    assert!(
        metrics.encode().contains(&alive_series(&env, "gw2", 1)),
        "gateway_alive stays 1"
    );

    // Back: both ready again.
    second.set(Mode::Healthy);
    env.mirror_until("web", "both ready again", |_, e| {
        ready_ips(e) == [a.as_str(), b.as_str()] && not_ready_ips(e).is_empty()
    })
    .await;
    slices_until("both ready again in the slice", both).await;

    // Both dead: the gateway is dead, every address not ready.
    first.set(Mode::Failing);
    second.set(Mode::Failing);
    env.mirror_until("web", "both not ready", |_, e| {
        ready_ips(e).is_empty() && not_ready_ips(e) == [a.as_str(), b.as_str()]
    })
    .await;
    eventually("gateway_alive 0", || async {
        metrics
            .encode()
            .contains(&alive_series(&env, "gw2", 0))
            .then_some(())
    })
    .await;
    w.stop(false).await.unwrap();
    eprintln!("two-address probe test took {:?}", started.elapsed());
}
