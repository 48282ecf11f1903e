//! `FaultProxy` in front of a real apiserver: it forwards untouched in `pass`, and each
//! fault does to kube clients what it says (statuses, latency, stall, partition).

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams};
use local_cluster::{
    Fault, FaultProxy, Kubeconfig, LocalCluster, ensure_namespace, shared_cluster, unique_namespace,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn cluster() -> Arc<LocalCluster> {
    shared_cluster("faulty").await.unwrap()
}

/// A kube client that does not retry 429/503/504 itself (kube's default client retries
/// them up to 15 times, which hides the injected answers from the caller).
async fn client_without_retries(kubeconfig: &Kubeconfig) -> kube::Client {
    // Installs the process's rustls provider.
    let _ = kubeconfig.client().await.unwrap();
    let parsed = kube::config::Kubeconfig::from_yaml(&kubeconfig.yaml).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
        .await
        .unwrap();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A watch on ConfigMaps of `namespace` from now, through `client`.
async fn watch_config_maps(
    client: kube::Client,
    namespace: &str,
) -> futures::stream::BoxStream<'static, kube::Result<WatchEvent<ConfigMap>>> {
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.watch(&WatchParams::default().timeout(290), &rv)
        .await
        .unwrap()
        .boxed()
}

/// Waits (up to `within`) for the watch to report ConfigMap `name` added.
async fn sees_added(
    watch: &mut futures::stream::BoxStream<'static, kube::Result<WatchEvent<ConfigMap>>>,
    name: &str,
    within: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, watch.next()).await {
            Err(_) => return Err(format!("no event for {name} within {within:?}")),
            Ok(None) => return Err("the watch ended".into()),
            Ok(Some(Err(e))) => return Err(format!("the watch failed: {e}")),
            Ok(Some(Ok(WatchEvent::Added(cm)))) if cm.metadata.name.as_deref() == Some(name) => {
                return Ok(());
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

#[tokio::test]
async fn pass_forwards_lists_watches_and_credentials_untouched() {
    let cluster = cluster().await;
    let proxy = FaultProxy::start(&cluster, 1).await.unwrap();
    assert_eq!(proxy.fault(), Fault::Pass);
    assert_eq!(proxy.target(), cluster.apiserver_addr());
    let ns = unique_namespace("fp-pass");
    let direct = cluster.client().await.unwrap();
    ensure_namespace(&direct, &ns).await.unwrap();

    // The admin kubeconfig works unchanged through the proxy (same CA, admin identity).
    let proxied = cluster
        .admin_kubeconfig_via(proxy.addr())
        .unwrap()
        .client()
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(proxied.clone());
    let listed = namespaces.list(&ListParams::default()).await.unwrap();
    assert!(
        listed
            .items
            .iter()
            .any(|n| n.metadata.name == Some(ns.clone()))
    );

    // A watch streams events as they happen.
    let mut watch = watch_config_maps(proxied, &ns).await;
    Api::<ConfigMap>::namespaced(direct, &ns)
        .create(&PostParams::default(), &config_map("seen"))
        .await
        .unwrap();
    sees_added(&mut watch, "seen", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(proxy.open_connections() >= 1);
    assert!(proxy.requests() >= 3, "{}", proxy.requests());
    assert_eq!(proxy.faulted(), 0);

    // A bearer token passes: the apiserver names the service account, not anonymous.
    let token = cluster
        .service_account_kubeconfig(&ns, "reader")
        .await
        .unwrap()
        .via(proxy.addr())
        .unwrap()
        .client()
        .await
        .unwrap();
    let refused = Api::<Namespace>::all(token)
        .get("default")
        .await
        .expect_err("the service account may not read namespaces");
    let kube::Error::Api(status) = refused else {
        panic!("{refused:?}")
    };
    assert_eq!(status.code, 403);
    assert!(
        status
            .message
            .contains(&format!("system:serviceaccount:{ns}:reader")),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn status_429_answers_new_requests_like_the_apiserver_and_spares_open_watches() {
    let cluster = cluster().await;
    let proxy = FaultProxy::start(&cluster, 2).await.unwrap();
    let ns = unique_namespace("fp-429");
    let direct = cluster.client().await.unwrap();
    ensure_namespace(&direct, &ns).await.unwrap();
    let kubeconfig = cluster.admin_kubeconfig_via(proxy.addr()).unwrap();
    let proxied = client_without_retries(&kubeconfig).await;
    let mut watch = watch_config_maps(proxied.clone(), &ns).await;

    proxy.status(429, 100);
    let before = (proxy.requests(), proxy.faulted());
    let answer = Api::<Namespace>::all(proxied)
        .get("default")
        .await
        .expect_err("every new request gets 429");
    let kube::Error::Api(status) = answer else {
        panic!("{answer:?}")
    };
    assert_eq!(status.code, 429);
    assert_eq!(status.reason, "TooManyRequests");
    assert_eq!(
        (proxy.requests(), proxy.faulted()),
        (before.0 + 1, before.1 + 1)
    );

    // The watch opened before goes on.
    Api::<ConfigMap>::namespaced(direct, &ns)
        .create(&PostParams::default(), &config_map("during-429"))
        .await
        .unwrap();
    sees_added(&mut watch, "during-429", Duration::from_secs(10))
        .await
        .unwrap();
}

#[tokio::test]
async fn status_500_refuses_writes_unforwarded_and_the_connection_serves_on() {
    let cluster = cluster().await;
    let proxy = FaultProxy::start(&cluster, 6).await.unwrap();
    let ns = unique_namespace("fp-500");
    let direct = cluster.client().await.unwrap();
    ensure_namespace(&direct, &ns).await.unwrap();
    let kubeconfig = cluster.admin_kubeconfig_via(proxy.addr()).unwrap();
    let config_maps: Api<ConfigMap> =
        Api::namespaced(client_without_retries(&kubeconfig).await, &ns);
    config_maps.list(&ListParams::default()).await.unwrap();
    let accepted = proxy.accepted();

    proxy.status(500, 100);
    for i in 0..3 {
        let refused = config_maps
            .create(&PostParams::default(), &config_map(&format!("refused-{i}")))
            .await
            .expect_err("every write gets 500");
        let kube::Error::Api(status) = refused else {
            panic!("{refused:?}")
        };
        assert_eq!(
            (status.code, status.reason.as_str()),
            (500, "InternalError")
        );
    }
    proxy.pass();
    config_maps
        .create(&PostParams::default(), &config_map("passed"))
        .await
        .unwrap();
    let names: Vec<_> = Api::<ConfigMap>::namespaced(direct, &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .filter(|name| name != "kube-root-ca.crt")
        .collect();
    assert_eq!(names, ["passed"], "no refused write reached the apiserver");
    // The request bodies were read: the client kept its one connection.
    assert_eq!(proxy.accepted(), accepted);
    assert_eq!(proxy.faulted(), 3);
}

/// The outcome (fault code or 200) of 40 gets through a fresh proxy seeded `seed`.
async fn outcomes_at_503_half(cluster: &LocalCluster, seed: u64) -> Vec<u16> {
    let proxy = FaultProxy::start(cluster, seed).await.unwrap();
    proxy.status(503, 50);
    let kubeconfig = cluster.admin_kubeconfig_via(proxy.addr()).unwrap();
    let namespaces: Api<Namespace> = Api::all(client_without_retries(&kubeconfig).await);
    let mut outcomes = Vec::new();
    for _ in 0..40 {
        outcomes.push(match namespaces.get("default").await {
            Ok(_) => 200,
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.reason, "ServiceUnavailable");
                status.code
            }
            Err(e) => panic!("{e:?}"),
        });
    }
    let faulted = outcomes.iter().filter(|&&c| c == 503).count() as u64;
    assert_eq!((proxy.requests(), proxy.faulted()), (40, faulted));
    outcomes
}

#[tokio::test]
async fn status_503_at_half_faults_about_half_and_the_same_requests_for_a_seed() {
    let cluster = cluster().await;
    let first = outcomes_at_503_half(&cluster, 42).await;
    let faulted = first.iter().filter(|&&c| c == 503).count();
    // Binomial(40, 0.5): 10..=30 is beyond 3 standard deviations (3.2).
    assert!((10..=30).contains(&faulted), "{faulted} of 40: {first:?}");
    assert_eq!(first, outcomes_at_503_half(&cluster, 42).await, "same seed");
}

#[tokio::test]
async fn latency_delays_each_new_request() {
    let cluster = cluster().await;
    let proxy = FaultProxy::start(&cluster, 3).await.unwrap();
    let namespaces: Api<Namespace> = Api::all(
        cluster
            .admin_kubeconfig_via(proxy.addr())
            .unwrap()
            .client()
            .await
            .unwrap(),
    );
    namespaces.get("default").await.unwrap();
    proxy.latency(Duration::from_millis(300));
    for _ in 0..2 {
        let started = Instant::now();
        namespaces.get("default").await.unwrap();
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(300), "{took:?}");
    }
    assert_eq!(proxy.faulted(), 0);
}

#[tokio::test]
async fn stall_freezes_open_and_new_connections_until_pass() {
    let cluster = cluster().await;
    let proxy = FaultProxy::start(&cluster, 4).await.unwrap();
    let ns = unique_namespace("fp-stall");
    let direct = cluster.client().await.unwrap();
    ensure_namespace(&direct, &ns).await.unwrap();
    let proxied = cluster
        .admin_kubeconfig_via(proxy.addr())
        .unwrap()
        .client()
        .await
        .unwrap();
    let mut watch = watch_config_maps(proxied.clone(), &ns).await;
    let namespaces: Api<Namespace> = Api::all(proxied);

    proxy.stall();
    assert_eq!(proxy.fault(), Fault::Stall);
    let get = tokio::time::timeout(Duration::from_secs(1), namespaces.get("default")).await;
    assert!(get.is_err(), "a get completed while stalled: {get:?}");
    // A new connection is accepted, then stalls too (its TLS handshake never ends).
    let accepted = proxy.accepted();
    let fresh = cluster
        .admin_kubeconfig_via(proxy.addr())
        .unwrap()
        .client()
        .await
        .unwrap();
    let fresh_get = tokio::time::timeout(
        Duration::from_secs(1),
        Api::<Namespace>::all(fresh).get("default"),
    )
    .await;
    assert!(
        fresh_get.is_err(),
        "a new connection got through: {fresh_get:?}"
    );
    assert!(proxy.accepted() > accepted);
    // The open watch stays open and silent: no event, no end.
    Api::<ConfigMap>::namespaced(direct, &ns)
        .create(&PostParams::default(), &config_map("while-stalled"))
        .await
        .unwrap();
    let silent = sees_added(&mut watch, "while-stalled", Duration::from_secs(1)).await;
    assert!(
        silent.as_ref().is_err_and(|e| e.starts_with("no event")),
        "{silent:?}"
    );

    proxy.pass();
    sees_added(&mut watch, "while-stalled", Duration::from_secs(10))
        .await
        .expect("the surviving watch delivers after pass");
    namespaces.get("default").await.unwrap();
}

#[tokio::test]
async fn cut_refuses_at_once_and_restore_serves_on_the_same_port() {
    let cluster = cluster().await;
    let proxy = FaultProxy::start(&cluster, 5).await.unwrap();
    let addr = proxy.addr();
    let namespaces: Api<Namespace> = Api::all(
        cluster
            .admin_kubeconfig_via(addr)
            .unwrap()
            .client()
            .await
            .unwrap(),
    );
    namespaces.get("default").await.unwrap();
    assert!(proxy.open_connections() >= 1);

    proxy.cut().await.unwrap();
    assert!(proxy.is_cut());
    assert_eq!(proxy.open_connections(), 0);
    let refused = tokio::net::TcpStream::connect(addr).await;
    assert!(
        matches!(&refused, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused),
        "{refused:?}"
    );
    let during = tokio::time::timeout(Duration::from_secs(5), namespaces.get("default"))
        .await
        .expect("a cut request fails at once");
    assert!(during.is_err());

    proxy.restore().unwrap();
    assert_eq!(proxy.addr(), addr);
    namespaces
        .get("default")
        .await
        .expect("the same client works again");

    // A cut also drops stalled connections, and a stall outlives cut and restore.
    proxy.stall();
    let stalled = tokio::time::timeout(Duration::from_secs(1), namespaces.get("default")).await;
    assert!(stalled.is_err(), "{stalled:?}");
    assert!(proxy.open_connections() >= 1);
    proxy.cut().await.unwrap();
    assert_eq!(proxy.open_connections(), 0, "stalled connections dropped");
    proxy.restore().unwrap();
    assert_eq!(proxy.fault(), Fault::Stall);
    proxy.pass();
    namespaces.get("default").await.unwrap();
}

#[tokio::test]
async fn an_away_apiserver_fails_requests_at_once_and_is_reached_again_when_back() {
    let cluster = LocalCluster::start("fp-away").await.unwrap();
    let proxy = FaultProxy::start(&cluster, 7).await.unwrap();
    let kubeconfig = cluster.admin_kubeconfig_via(proxy.addr()).unwrap();
    let namespaces: Api<Namespace> = Api::all(client_without_retries(&kubeconfig).await);
    namespaces.get("default").await.unwrap();

    cluster.stop_apiserver();
    let away = tokio::time::timeout(Duration::from_secs(5), namespaces.get("default"))
        .await
        .expect("no hang while the apiserver is away");
    assert!(away.is_err(), "{away:?}");

    cluster.start_apiserver().await.unwrap();
    namespaces
        .get("default")
        .await
        .expect("the proxy reconnects to the restarted apiserver");
}
