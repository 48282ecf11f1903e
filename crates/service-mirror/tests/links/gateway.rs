//! A gateway named by a `Link` (and a Secret link's gateway identity), in process on real
//! apiservers: link controllers started directly with the `LinkConfig` the link manager
//! builds (`links::link_config` of `parse_link`'s spec), hostnames answered by a stub
//! resolver, probes redirected to small HTTP servers on 127.0.0.x.

use crate::support;
use crate::support::links::{credentials_secret, link, remote_slice};
use crate::support::resolver::MapResolver;
use crate::support::*;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use service_mirror_controller::gateway::ProbeRedirect;
use service_mirror_controller::link_controller::{LinkConfig, LinkController, LinkDeps};
use service_mirror_controller::links::{LinkSpec, link_config, parse_link};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The namespace the test Links and their credentials Secrets claim to live in (nothing
/// is created there: the controllers are started directly).
const LINK_NS: &str = "link-gateway-tests";
const IDENTITY_KEY: &str = "mirror.linkerd.io/remote-gateway-identity";
const GW_IDENTITY: &str =
    "linkerd-gateway.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local";

/// The `LinkSpec` of a Link of `env`'s cluster with `extra` spec fields, as the link
/// manager gets it: `parse_link` of the Link and its credentials Secret.
fn link_spec(env: &Env, extra: serde_json::Value) -> LinkSpec {
    let secret_name = format!("cluster-credentials-{}", env.cluster);
    let mut l = link(&env.cluster, &env.cluster, &secret_name, extra);
    l.metadata.namespace = Some(LINK_NS.into());
    let mut secret = credentials_secret(&secret_name, &env.remote.admin_kubeconfig().yaml);
    secret.metadata.namespace = Some(LINK_NS.into());
    parse_link(&l, Some(&secret)).expect("parse_link accepts the test Link")
}

/// Starts the link controller of `spec` with the config the link manager would give it
/// on top of `base`.
fn start_link(env: &Env, spec: &LinkSpec, base: LinkConfig, deps: LinkDeps) -> LinkController {
    LinkController::start(
        env.lc.clone(),
        env.rc.clone(),
        spec.link().clone(),
        link_config(&base, spec, false),
        deps,
    )
    .expect("start the link controller")
}

/// Creates remote Service `name` exported by label (`mirror.linkerd.io/exported=true`)
/// with one ready remote EndpointSlice, in `env.ns`.
async fn export_by_label(env: &Env, name: &str) {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"mirror.linkerd.io/exported": "true"}},
        "spec": {"ports": [{"name": "http", "port": 80}]},
    }))
    .unwrap();
    env.remote_services()
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    Api::<EndpointSlice>::namespaced(env.rc.clone(), &env.ns)
        .create(
            &PostParams::default(),
            &remote_slice(&env.ns, name, &[true]),
        )
        .await
        .unwrap();
}

/// A Link's mirrors are never created namespaces (Linkerd's default): the local one
/// must exist.
async fn local_namespace(env: &Env) {
    create_namespace(&env.lc, &env.ns).await;
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

/// A redirect of probes to 192.0.2.N to the fake gateway on 127.0.0.N; every address
/// the prober asked for is recorded, and anything outside 192.0.2.0/24 goes to a closed
/// loopback port (never off the machine).
#[derive(Clone, Default)]
struct Redirect(Arc<Mutex<Vec<SocketAddr>>>);

impl Redirect {
    fn probe_redirect(&self) -> ProbeRedirect {
        let asked = self.0.clone();
        ProbeRedirect(Arc::new(move |addr: SocketAddr| {
            asked.lock().unwrap().push(addr);
            match addr.ip() {
                IpAddr::V4(v4) if v4.octets()[..3] == [192, 0, 2] => {
                    SocketAddr::from(([127, 0, 0, v4.octets()[3]], addr.port()))
                }
                _ => SocketAddr::from(([127, 0, 0, 1], 9)),
            }
        }))
    }

    fn asked(&self) -> Vec<SocketAddr> {
        self.0.lock().unwrap().clone()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Healthy,
    Failing,
    /// Answers 200 after 3 s.
    Slow,
}

/// One request the fake gateway accepted: when, the request line's path, and how it was
/// answered.
#[derive(Clone, Debug)]
struct Hit {
    at: Instant,
    path: String,
    mode: Mode,
}

/// An HTTP server on `ip` answering as told and recording every request.
struct FakeGateway {
    addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    hits: Arc<Mutex<Vec<Hit>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeGateway {
    async fn start(ip: &str) -> Self {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(Mutex::new(Mode::Healthy));
        let hits = Arc::new(Mutex::new(Vec::new()));
        let (m, h) = (mode.clone(), hits.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let at = Instant::now();
                let mode = *m.lock().unwrap();
                let h = h.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]);
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    h.lock().unwrap().push(Hit { at, path, mode });
                    let answer = match mode {
                        Mode::Healthy => "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                        Mode::Failing => {
                            "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
                        }
                        Mode::Slow => {
                            // Time is the subject: an answer slower than the probe's
                            // 1 s timeout.
                            tokio::time::sleep(Duration::from_secs(3)).await;
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

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// Requests answered in `mode` since index `from` of the hit list.
    fn count_since(&self, from: usize, mode: Mode) -> usize {
        self.hits()[from.min(self.hits().len())..]
            .iter()
            .filter(|h| h.mode == mode)
            .count()
    }

    /// Waits until `n` requests answered in `mode` were made since index `from`.
    async fn wait_hits(&self, from: usize, mode: Mode, n: usize) {
        eventually(&format!("{n} {mode:?} probes"), || async {
            (self.count_since(from, mode) >= n).then_some(())
        })
        .await
    }

    /// The 192.0.2.N address a Link names for this 127.0.0.N server.
    fn public_ip(&self) -> String {
        match self.addr.ip() {
            IpAddr::V4(v4) => format!("192.0.2.{}", v4.octets()[3]),
            other => panic!("fake gateways listen on 127.0.0.N, not {other}"),
        }
    }
}

impl Drop for FakeGateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn link_gateway_hostnames_are_resolved_sorted_mixed_with_static_ips_and_re_resolved() {
    let env = Env::new("lgdns").await;
    local_namespace(&env).await;
    let resolver = Arc::new(MapResolver::default());
    resolver.set("gw.example", &["192.0.2.21", "192.0.2.20"]);
    // `nowhere.invalid` never resolves; 192.0.2.100 sorts after .20 and .21 as an
    // address (before them as text).
    let spec = link_spec(
        &env,
        serde_json::json!({"gatewayAddress": "192.0.2.100, gw.example, nowhere.invalid",
            "gatewayPort": "4180"}),
    );
    export_by_label(&env, "web").await;
    let refresh = Duration::from_millis(500);
    let config = LinkConfig {
        endpoint_refresh_period: refresh,
        ..env.config()
    };
    let w = start_link(
        &env,
        &spec,
        config,
        LinkDeps {
            resolver: resolver.clone(),
            ..LinkDeps::default()
        },
    );
    let (_, ep) = env
        .mirror_until("web", "resolved gateway addresses", |_, e| has_subsets(e))
        .await;
    assert_eq!(
        ready_ips(&ep),
        ["192.0.2.20", "192.0.2.21", "192.0.2.100"],
        "resolved and static addresses, sorted as addresses; the unresolvable host adds none"
    );
    assert_eq!(
        subset_ports(&ep),
        [(Some("http".into()), 4180)],
        "gatewayPort"
    );
    assert_eq!(
        annotation(&ep.metadata, IDENTITY_KEY),
        Some(GW_IDENTITY),
        "gatewayIdentity"
    );

    // A new answer is picked up within a few refresh periods.
    resolver.set("gw.example", &["192.0.2.22"]);
    let changed = Instant::now();
    env.mirror_until("web", "re-resolved", |_, e| {
        ready_ips(e) == ["192.0.2.22", "192.0.2.100"]
    })
    .await;
    let took = changed.elapsed();
    println!("re-resolution reached the mirror in {took:.1?} (refresh period {refresh:?})");
    assert!(
        took < refresh * 20,
        "re-resolved within a few refresh periods: {took:?}"
    );
    w.stop(false).await.unwrap();

    // A Link whose only hostname never resolves: its static address alone.
    let env = Env::new("lgnodns").await;
    local_namespace(&env).await;
    let spec = link_spec(
        &env,
        serde_json::json!({"gatewayAddress": "nowhere.invalid,192.0.2.101"}),
    );
    export_by_label(&env, "web").await;
    let config = LinkConfig {
        endpoint_refresh_period: refresh,
        ..env.config()
    };
    let w = start_link(
        &env,
        &spec,
        config,
        LinkDeps {
            resolver: resolver.clone(),
            ..LinkDeps::default()
        },
    );
    let (_, ep) = env
        .mirror_until("web", "the static address", |_, e| has_subsets(e))
        .await;
    assert_eq!(ready_ips(&ep), ["192.0.2.101"]);
    // Two refreshes: each forgets the lookups and queues the mirror of the hostname's
    // gateway, whose reconcile asks for `nowhere.invalid` again.
    let web = Subject::link(&env.cluster, &env.ns, "web");
    let seen = InProcess.reconciles(&web);
    reconciled_after(&InProcess, &web, seen + 1).await;
    let (_, ep) = env.mirror("web").await;
    assert_eq!(
        ready_ips(&ep.unwrap()),
        ["192.0.2.101"],
        "still the static address after several refreshes"
    );
    // A hostname resolving later is added.
    resolver.set("nowhere.invalid", &["192.0.2.23"]);
    env.mirror_until("web", "the late hostname added", |_, e| {
        ready_ips(e) == ["192.0.2.23", "192.0.2.101"]
    })
    .await;
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn link_probe_spec_sets_port_path_period_timeout_and_failure_threshold() {
    let env = Env::new("lgprobe").await;
    local_namespace(&env).await;
    let fake = FakeGateway::start("127.0.0.31").await;
    let ip = fake.public_ip();
    let period = Duration::from_secs(2);
    let spec = link_spec(
        &env,
        serde_json::json!({
            "gatewayAddress": ip,
            "probeSpec": {"port": fake.addr.port().to_string(), "path": "/probe-me",
                "period": "2s", "timeout": "1s", "failureThreshold": "3"},
        }),
    );
    export_by_label(&env, "web").await;
    let redirect = Redirect::default();
    // The base config's probe settings must not be the ones used.
    let config = LinkConfig {
        probe_timeout: Duration::from_secs(10),
        probe_failure_threshold: 1,
        ..env.config()
    };
    let metrics = service_mirror_controller::metrics::Metrics::new();
    let w = start_link(
        &env,
        &spec,
        config,
        LinkDeps {
            probe_redirect: Some(redirect.probe_redirect()),
            metrics: metrics.clone(),
            ..LinkDeps::default()
        },
    );
    // The prober's own series (one gateway): probes answered `ok` or not, its verdict.
    let series = |name: &str| {
        let text = metrics.encode_text();
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let failed = || {
        let text = metrics.encode_text();
        text.lines()
            .find(|l| {
                l.starts_with("gateway_probes_total{") && l.contains("probe_successful=\"false\"")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    env.mirror_until("web", "ready", |_, e| ready_ips(e) == [ip.clone()])
        .await;

    // Port and path: the fake is asked for /probe-me, every `period`.
    fake.wait_hits(0, Mode::Healthy, 4).await;
    let hits = fake.hits();
    assert!(
        hits.iter().all(|h| h.path == "/probe-me"),
        "probeSpec.path: {hits:?}"
    );
    let gaps: Vec<Duration> = hits.windows(2).map(|w| w[1].at - w[0].at).collect();
    let mean = gaps.iter().sum::<Duration>() / gaps.len() as u32;
    println!("probe period configured {period:?}, measured gaps {gaps:.2?}, mean {mean:.2?}");
    assert!(
        mean >= period.mul_f64(0.7) && mean <= period.mul_f64(1.8),
        "probes every probeSpec.period: mean gap {mean:?}"
    );

    // Failures: ready through 2 of them, not ready at the third.
    let from = fake.hits().len();
    let failed_before = failed();
    fake.set(Mode::Failing);
    fake.wait_hits(from, Mode::Failing, 2).await;
    // The prober took the second failure in (counted) and judged after it: still
    // alive, so no verdict went to the mirrors (a wrongly early one would say 0 here,
    // a period before the third probe).
    eventually("the second failure counted", || async {
        (failed() >= failed_before + 2.0).then_some(())
    })
    .await;
    assert_eq!(series("gateway_alive"), Some(1.0), "alive after 2 failures");
    let failures = fake.count_since(from, Mode::Failing);
    let (_, ep) = env.mirror("web").await;
    let ep = ep.unwrap();
    assert_eq!(failures, 2, "checked between the second and third failure");
    assert_eq!(
        (ready_ips(&ep), not_ready_ips(&ep)),
        (vec![ip.clone()], vec![]),
        "still ready after 2 failures of failureThreshold 3"
    );
    env.mirror_until("web", "not ready after 3 failures", |_, e| {
        ready_ips(e).is_empty() && not_ready_ips(e) == [ip.clone()]
    })
    .await;
    let failures = fake.count_since(from, Mode::Failing);
    assert!(
        failures >= 3,
        "not ready only after failureThreshold: {failures}"
    );

    // Recovery.
    fake.set(Mode::Healthy);
    env.mirror_until("web", "ready again", |_, e| {
        ready_ips(e) == [ip.clone()] && not_ready_ips(e).is_empty()
    })
    .await;

    // Timeout: answers slower than probeSpec.timeout (1 s) count as failures (the base
    // config's 10 s would have accepted them).
    let from = fake.hits().len();
    fake.set(Mode::Slow);
    let slowed = Instant::now();
    env.mirror_until("web", "not ready after slow answers", |_, e| {
        not_ready_ips(e) == [ip.clone()]
    })
    .await;
    println!(
        "slow gateway -> not ready in {:.1?} after {} slow probes",
        slowed.elapsed(),
        fake.count_since(from, Mode::Slow)
    );
    assert!(fake.count_since(from, Mode::Slow) >= 3);
    fake.set(Mode::Healthy);
    env.mirror_until("web", "ready after the slow spell", |_, e| {
        ready_ips(e) == [ip.clone()] && not_ready_ips(e).is_empty()
    })
    .await;

    let asked = redirect.asked();
    assert!(!asked.is_empty());
    assert!(
        asked
            .iter()
            .all(|a| *a == SocketAddr::new(ip.parse().unwrap(), fake.addr.port())),
        "only the Link's gateway at probeSpec.port is probed: {asked:?}"
    );
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn link_without_probe_port_is_never_probed_and_its_mirrors_are_ready() {
    let env = Env::new("lgnoprobe").await;
    local_namespace(&env).await;
    let spec = link_spec(
        &env,
        serde_json::json!({"gatewayAddress": "192.0.2.32",
            "probeSpec": {"path": "/ready", "period": "1s", "timeout": "1s", "failureThreshold": "1"}}),
    );
    export_by_label(&env, "web").await;
    let redirect = Redirect::default();
    let metrics = service_mirror_controller::metrics::Metrics::new();
    let w = start_link(
        &env,
        &spec,
        env.config(),
        LinkDeps {
            probe_redirect: Some(redirect.probe_redirect()),
            metrics: metrics.clone(),
            ..LinkDeps::default()
        },
    );
    env.mirror_until("web", "ready", |_, e| ready_ips(e) == ["192.0.2.32"])
        .await;
    // The reconcile that made the mirror decided the gateway's probing: no prober
    // (one reports `gateway_enabled` before its first probe).
    let text = metrics.encode_text();
    assert!(!text.contains("gateway_enabled{"), "a prober runs:\n{text}");
    // Time is the subject: a prober started all the same would probe at once and then
    // every probeSpec.period (1 s); two periods without a probe.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, ep) = env.mirror("web").await;
    let ep = ep.unwrap();
    assert_eq!(
        (ready_ips(&ep), not_ready_ips(&ep)),
        (vec!["192.0.2.32".to_string()], vec![]),
        "still ready"
    );
    assert_eq!(redirect.asked(), [], "no probe without probeSpec.port");
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn secret_link_mirror_endpoints_carry_the_valid_gateway_identity_annotation_only() {
    let env = Env::new("lgident").await;
    env.gateway("gw", 4143, &["192.0.2.40"]).await;
    let identity = |value: serde_json::Value| serde_json::json!({"metadata": {"annotations": {"mirror.linkerd.io/gateway-identity": value}}});
    env.patch_remote("gw", identity(GW_IDENTITY.into())).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let w = env.watch();
    env.mirror_until("web", "the identity annotated", |_, e| {
        has_subsets(e) && annotation(&e.metadata, IDENTITY_KEY) == Some(GW_IDENTITY)
    })
    .await;

    env.patch_remote("gw", identity("Not/Valid".into())).await;
    let (_, ep) = env
        .mirror_until("web", "an invalid identity: no annotation", |_, e| {
            annotation(&e.metadata, IDENTITY_KEY).is_none()
        })
        .await;
    assert_eq!(ready_ips(&ep), ["192.0.2.40"], "the endpoints stay");

    let other = "gw-2.linkerd-multicluster.serviceaccount.identity.linkerd.cluster.local";
    env.patch_remote("gw", identity(other.into())).await;
    env.mirror_until("web", "a valid identity again", |_, e| {
        annotation(&e.metadata, IDENTITY_KEY) == Some(other)
    })
    .await;

    env.patch_remote("gw", identity(serde_json::Value::Null))
        .await;
    let (_, ep) = env
        .mirror_until("web", "annotation removed with the gateway's", |_, e| {
            annotation(&e.metadata, IDENTITY_KEY).is_none()
        })
        .await;
    assert_eq!(ready_ips(&ep), ["192.0.2.40"], "the endpoints stay");
    w.stop(false).await.unwrap();
}

/// `hello` exported from the remote with a ServiceExport (no export label: no mirror),
/// on the MCS clusters (which have the CRDs); the world and this cluster's MCS
/// component (its metrics in the returned registry), whose tasks end with the returned
/// token.
async fn mcs_world(
    prefix: &str,
) -> (
    Env,
    service_mirror_controller::mcs::Mcs,
    Arc<service_mirror_controller::metrics::Metrics>,
    Vec<tokio::task::JoinHandle<()>>,
    tokio_util::sync::CancellationToken,
) {
    use service_mirror_controller::events::EventRecorder;
    use service_mirror_controller::mcs::{Mcs, McsOptions};
    let east = local_cluster::shared_cluster("mcs-east").await.unwrap();
    let west = local_cluster::shared_cluster("mcs-west").await.unwrap();
    support::mcs::installed(&east).await;
    support::mcs::installed(&west).await;
    let env = Env::on(east, west, prefix).await;
    local_namespace(&env).await;
    let hello: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hello"},
        "spec": {"ports": [{"name": "http", "port": 80}]},
    }))
    .unwrap();
    env.remote_services()
        .create(&PostParams::default(), &hello)
        .await
        .unwrap();
    let exports: Api<kube::api::DynamicObject> =
        support::mcs::mcs_api(&env.rc, &env.ns, "ServiceExport");
    let export = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
        "metadata": {"name": "hello"},
    }))
    .unwrap();
    exports
        .create(&PostParams::default(), &export)
        .await
        .unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let metrics = service_mirror_controller::metrics::Metrics::new();
    let (mcs, tasks) = Mcs::start(
        env.lc.clone(),
        EventRecorder::new(env.lc.clone(), None),
        metrics.clone(),
        McsOptions {
            cluster_name: format!("{}-local", env.cluster),
            leader: None,
            namespaces: service_mirror_core::NamespaceFilter::allow_only([env.ns.clone()]),
            controller_namespace: format!("sm-{prefix}"),
            traffic: Default::default(),
        },
        cancel.clone(),
    );
    (env, mcs, metrics, tasks, cancel)
}

/// The remote cluster's slices of the import `hello`: (addresses, port, ready) of each
/// slice's endpoints (`None`: the list failed).
async fn hello_slices(env: &Env) -> Option<Vec<(Vec<String>, Option<i32>, Option<bool>)>> {
    let selector = format!(
        "multicluster.kubernetes.io/service-name=hello,multicluster.kubernetes.io/source-cluster={}",
        env.cluster
    );
    let list = Api::<EndpointSlice>::namespaced(env.lc.clone(), &env.ns)
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .ok()?;
    Some(
        list.items
            .into_iter()
            .flat_map(|s| {
                let port = s.ports.as_ref().and_then(|p| p.first()?.port);
                s.endpoints
                    .into_iter()
                    .map(move |e| (e.addresses, port, e.conditions.and_then(|c| c.ready)))
            })
            .collect(),
    )
}

/// A Link's gateway reaches the MCS component too: the ServiceImport of a Service the
/// linked cluster exports gets an EndpointSlice at the Link's gateway address and port,
/// ready while the Link's probe passes (on the MCS clusters, which have the CRDs). A
/// hostname of the gateway resolving into a denied CIDR is left out of the slice and
/// said by a `GatewayAddressRefused` Event on the link, though no mirror resolves the
/// gateway (only the MCS report does).
#[tokio::test]
async fn a_links_gateway_reaches_the_mcs_import_slices_and_follows_its_probe() {
    let (env, mcs, _, tasks, cancel) = mcs_world("lgmcs").await;
    let fake = FakeGateway::start("127.0.0.33").await;
    let ip = fake.public_ip();
    let resolver = Arc::new(MapResolver::default());
    resolver.set("denied.example", &["198.18.0.1"]);
    let events_ns = local_cluster::unique_namespace("lgmcs-ev");
    create_namespace(&env.lc, &events_ns).await;
    let link_ref = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Secret".into()),
        name: Some(format!("cluster-credentials-{}", env.cluster)),
        namespace: Some(events_ns.clone()),
        ..Default::default()
    };
    let spec = link_spec(
        &env,
        serde_json::json!({
            "gatewayAddress": format!("{ip}, denied.example"), "gatewayPort": "4143",
            "probeSpec": {"port": fake.addr.port().to_string(), "path": "/ready",
                "period": "1s", "timeout": "1s", "failureThreshold": "1"},
        }),
    );
    let redirect = Redirect::default();
    let config = LinkConfig {
        gateway_address_policy: service_mirror_core::AddressPolicy {
            deny: service_mirror_core::Cidr::parse_list("198.18.0.0/15").unwrap(),
            allow: vec![],
        },
        ..env.config()
    };
    let w = start_link(
        &env,
        &spec,
        config,
        LinkDeps {
            probe_redirect: Some(redirect.probe_redirect()),
            resolver: resolver.clone(),
            mcs: Some(mcs),
            link_secret: Some(link_ref.clone()),
            ..LinkDeps::default()
        },
    );
    let slice_until = |what: &'static str, ready: bool| {
        let (env, ip) = (&env, ip.clone());
        async move {
            eventually(what, || async {
                (hello_slices(env).await? == [(vec![ip.clone()], Some(4143), Some(ready))])
                    .then_some(())
            })
            .await
        }
    };
    slice_until("a ready slice at the Link's gateway", true).await;
    let secret = link_ref.name.as_deref().unwrap();
    let refused = eventually("GatewayAddressRefused for the resolved address", || async {
        events_on(&env.lc, &events_ns, secret)
            .await
            .into_iter()
            .find(|(r, _)| r == "GatewayAddressRefused")
            .map(|(_, note)| note)
    })
    .await;
    assert!(
        refused.contains("198.18.0.1 is in denied CIDR 198.18.0.0/15"),
        "{refused}"
    );
    fake.set(Mode::Failing);
    slice_until("the slice not ready once the probe fails", false).await;
    fake.set(Mode::Healthy);
    slice_until("ready again", true).await;
    assert!(
        redirect.asked().iter().all(|a| a.ip().to_string() == ip),
        "probes only the Link's gateway: {:?}",
        redirect.asked()
    );
    w.stop(false).await.unwrap();
    cancel.cancel();
    for t in tasks {
        let _ = t.await;
    }
}

/// A lost cluster's MCS slices go by the links' stale policy (issue 17 point 4): its
/// apiserver silent (the link's proxy cut), the slices stay ready through the grace,
/// turn not ready at `--stale-after` (no probe says alive) and go at
/// `--stale-delete-after`, the import staying all along; the remote back, they return.
/// (With the policy off, the default, nothing of a silent remote's is touched:
/// `a_restart_keeps_the_slices_until_the_gateway_is_reported_and_then_writes_nothing`
/// and the federation's probe-only rule in docs/operations.md.)
#[tokio::test]
async fn a_lost_clusters_import_slices_go_not_ready_then_away_by_the_stale_policy() {
    let (env, mcs, _, tasks, cancel) = mcs_world("lgstale").await;
    let (proxy, remote) = through_proxy(&env.remote).await;
    // No probe port: never probed, so only the stale policy can say not ready.
    let spec = link_spec(
        &env,
        serde_json::json!({"gatewayAddress": "192.0.2.40", "gatewayPort": "4143"}),
    );
    let secs = Duration::from_secs;
    let base = LinkConfig {
        stale_policy: service_mirror_core::StalePolicy::new(secs(1), secs(3), secs(6)).unwrap(),
        ..env.config()
    };
    let w = LinkController::start(
        env.lc.clone(),
        remote,
        spec.link().clone(),
        link_config(&base, &spec, false),
        LinkDeps {
            mcs: Some(mcs),
            ..LinkDeps::default()
        },
    )
    .unwrap();
    let ready = |r: bool| vec![(vec!["192.0.2.40".to_string()], Some(4143), Some(r))];
    let until = |what: &'static str, want: Vec<(Vec<String>, Option<i32>, Option<bool>)>| {
        let env = &env;
        async move {
            eventually(what, || async {
                let now = hello_slices(env).await?;
                (now == want).then_some(())
            })
            .await
        }
    };
    until("a ready slice at the Link's gateway", ready(true)).await;
    let imports = support::mcs::mcs_api(&env.lc, &env.ns, "ServiceImport");
    let uid = imports.get("hello").await.unwrap().metadata.uid;

    let cut = Instant::now();
    proxy.cut().await.unwrap();
    // Ready through the grace and until Stale (1 s + 3 s after the last answer): the
    // link past its grace (Disconnected) still leaves the slices alone.
    eventually("the remote Disconnected after the grace", || async {
        (w.remote_state() == service_mirror_core::RemoteState::Disconnected).then_some(())
    })
    .await;
    assert_eq!(
        hello_slices(&env).await,
        Some(ready(true)),
        "ready before Stale"
    );
    until("not ready once Stale", ready(false)).await;
    let stale = cut.elapsed();
    until("no slice once Expired", vec![]).await;
    let expired = cut.elapsed();
    eprintln!("not ready after {stale:.1?}, gone after {expired:.1?} (policy: 3 s, 6 s)");
    assert!(
        stale >= secs(3),
        "not ready before --stale-after: {stale:?}"
    );
    assert!(
        expired >= secs(6),
        "gone before --stale-delete-after: {expired:?}"
    );
    assert_eq!(
        imports.get("hello").await.unwrap().metadata.uid,
        uid,
        "the import stays: its export is last seen, not gone"
    );

    proxy.restore().unwrap();
    until("ready again once the remote answers", ready(true)).await;
    assert_eq!(imports.get("hello").await.unwrap().metadata.uid, uid);
    w.stop(false).await.unwrap();
    cancel.cancel();
    for t in tasks {
        let _ = t.await;
    }
}

/// A Link restarted with new settings and the same credentials (the link manager's
/// `replace` without new credentials) stops before its successor lists, so the two never hold the remote's
/// Services at once; its MCS exports keep counting until the successor has listed.
/// With the successor's remote cut the cluster stays listed (the old link's ended view
/// is kept for its unlisted successor: without it the cluster would leave the merge at
/// once, and its imports after the 30 s hold); once the remote answers the successor
/// lists, and a withdrawn export is followed by the successor's feed.
#[tokio::test]
async fn a_restarted_links_mcs_exports_count_until_its_successor_has_listed() {
    let (env, mcs, metrics, tasks, cancel) = mcs_world("lgrestart").await;
    let listed = || {
        metrics
            .encode_text()
            .lines()
            .find_map(|l| l.strip_prefix("service_mirror_mcs_clusters_listed "))
            .map(str::to_owned)
    };
    let spec = link_spec(
        &env,
        serde_json::json!({"gatewayAddress": "192.0.2.41", "gatewayPort": "4143"}),
    );
    let deps = || LinkDeps {
        mcs: Some(mcs.clone()),
        ..LinkDeps::default()
    };
    let old = start_link(&env, &spec, env.config(), deps());
    eventually("a slice at the first gateway", || async {
        let slices = hello_slices(&env).await?;
        (slices.len() == 1 && slices[0].0 == ["192.0.2.41"]).then_some(())
    })
    .await;
    eventually("both clusters listed", || async {
        (listed().as_deref() == Some("2")).then_some(())
    })
    .await;
    let imports = support::mcs::mcs_api(&env.lc, &env.ns, "ServiceImport");
    let uid = imports.get("hello").await.unwrap().metadata.uid;

    // As the link manager restarts a link: the new controller started paused, the old
    // one stopped, the new one resumed.
    let (proxy, remote) = through_proxy(&env.remote).await;
    proxy.cut().await.unwrap();
    let spec2 = link_spec(
        &env,
        serde_json::json!({"gatewayAddress": "192.0.2.42", "gatewayPort": "4143"}),
    );
    let new = LinkController::start_paused(
        env.lc.clone(),
        remote,
        spec2.link().clone(),
        link_config(&env.config(), &spec2, false),
        deps(),
    )
    .unwrap();
    old.stop(false).await.unwrap();
    new.resume();
    // Were the old view dropped with its feed, the cluster would count as not listed
    // once the index task takes in the feed's end, sent as the old link stopped. A
    // message sent after it, which queues the import (the clusters the link sources
    // name, as the link manager says them), and that reconcile: the end was taken in.
    let hello = Subject::mcs(&env.ns, "hello");
    let mark = Mark::now(&InProcess, hello);
    mcs.expect([env.cluster.clone()].into());
    mark.passed().await;
    assert_eq!(
        listed().as_deref(),
        Some("2"),
        "the stopped link's exports still count while its successor cannot list"
    );
    assert!(!new.status().remote_synced);
    assert_eq!(imports.get("hello").await.unwrap().metadata.uid, uid);

    proxy.restore().unwrap();
    eventually("the successor listed", || async {
        new.status().remote_synced.then_some(())
    })
    .await;
    // Listed all along: the old view until the successor's lists, then the successor's.
    assert_eq!(listed().as_deref(), Some("2"));
    // The successor's feed is the live one: the withdrawn export takes the import away.
    support::mcs::mcs_api(&env.rc, &env.ns, "ServiceExport")
        .delete("hello", &Default::default())
        .await
        .unwrap();
    eventually("the import gone with its only export", || async {
        imports
            .get_opt("hello")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    new.stop(false).await.unwrap();
    cancel.cancel();
    for t in tasks {
        let _ = t.await;
    }
}
