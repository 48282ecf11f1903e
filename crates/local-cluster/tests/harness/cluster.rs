//! The harness itself, on real etcd + kube-apiserver processes.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, PostParams};
use local_cluster::{LocalCluster, shared_cluster, unique_namespace};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}

async fn create_namespace(client: &kube::Client, ns: &str) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: meta(ns),
                ..Default::default()
            },
        )
        .await
        .expect("create namespace");
}

fn service(name: &str) -> Service {
    Service {
        metadata: meta(name),
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn in_cidr(ip: &str, cidr: &str) -> bool {
    let (base, bits) = cidr.split_once('/').unwrap();
    let (ip, base): (Ipv4Addr, Ipv4Addr) = (ip.parse().unwrap(), base.parse().unwrap());
    let mask = u32::MAX << (32 - bits.parse::<u32>().unwrap());
    u32::from(ip) & mask == u32::from(base) & mask
}

#[tokio::test]
async fn three_clusters_are_isolated_and_allocate_from_their_own_ranges() {
    let started = Instant::now();
    let (a, b, c) = tokio::try_join!(
        shared_cluster("east"),
        shared_cluster("west"),
        shared_cluster("north")
    )
    .expect("start clusters");
    eprintln!("three shared clusters ready in {:?}", started.elapsed());
    let ns = unique_namespace("iso");
    let mut ips = Vec::new();
    for cluster in [&a, &b, &c] {
        assert_ne!(cluster.service_cidr(), "", "each cluster has a CIDR");
        let client = cluster.client().await.unwrap();
        create_namespace(&client, &ns).await;
    }
    assert_ne!(a.service_cidr(), b.service_cidr());
    assert_ne!(b.service_cidr(), c.service_cidr());

    let east = Api::<Service>::namespaced(a.client().await.unwrap(), &ns);
    let created = east
        .create(&PostParams::default(), &service("only-east"))
        .await
        .unwrap();
    let ip = created.spec.unwrap().cluster_ip.unwrap();
    assert!(
        in_cidr(&ip, a.service_cidr()),
        "{ip} in {}",
        a.service_cidr()
    );
    ips.push(ip);

    for other in [&b, &c] {
        let api = Api::<Service>::namespaced(other.client().await.unwrap(), &ns);
        assert!(
            api.get_opt("only-east").await.unwrap().is_none(),
            "service leaked to {}",
            other.name()
        );
        let created = api
            .create(&PostParams::default(), &service("local"))
            .await
            .unwrap();
        let ip = created.spec.unwrap().cluster_ip.unwrap();
        assert!(
            in_cidr(&ip, other.service_cidr()),
            "{ip} in {}",
            other.service_cidr()
        );
        ips.push(ip);
    }
    assert_eq!(ips.len(), 3);
}

#[tokio::test]
async fn service_account_kubeconfig_gets_exactly_its_role() {
    let cluster = shared_cluster("east").await.unwrap();
    let admin = cluster.client().await.unwrap();
    let ns = unique_namespace("rbac");
    create_namespace(&admin, &ns).await;
    let role = Role {
        metadata: meta("read-services"),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["services".into()]),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding = RoleBinding {
        metadata: meta("read-services"),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "read-services".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "reader".into(),
            namespace: Some(ns.clone()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    Api::<Service>::namespaced(admin, &ns)
        .create(&PostParams::default(), &service("visible"))
        .await
        .unwrap();

    let kubeconfig = cluster
        .service_account_kubeconfig(&ns, "reader")
        .await
        .unwrap();
    assert!(kubeconfig.path.is_file());
    let sa = kubeconfig.client().await.unwrap();
    let services = Api::<Service>::namespaced(sa.clone(), &ns);
    let listed = services
        .list(&Default::default())
        .await
        .expect("allowed to list services");
    assert_eq!(listed.items.len(), 1);
    let denied = services
        .create(&PostParams::default(), &service("nope"))
        .await
        .unwrap_err();
    assert!(
        matches!(&denied, kube::Error::Api(s) if s.code == 403),
        "create denied: {denied}"
    );
    let denied = Api::<ConfigMap>::namespaced(sa.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&denied, kube::Error::Api(s) if s.code == 403),
        "configmaps denied: {denied}"
    );
    let denied = Api::<Service>::namespaced(sa, "default")
        .list(&Default::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&denied, kube::Error::Api(s) if s.code == 403),
        "other namespace denied: {denied}"
    );
}

#[tokio::test]
async fn apiserver_restart_keeps_data_and_clients_reconnect() {
    let cluster = LocalCluster::start("restart").await.unwrap();
    let client = cluster.client().await.unwrap();
    let ns = unique_namespace("restart");
    create_namespace(&client, &ns).await;
    let services = Api::<Service>::namespaced(client.clone(), &ns);
    services
        .create(&PostParams::default(), &service("before"))
        .await
        .unwrap();

    cluster.stop_apiserver();
    assert!(
        services.get("before").await.is_err(),
        "the apiserver is away"
    );
    let restarted = Instant::now();
    cluster.start_apiserver().await.unwrap();
    eprintln!("apiserver restarted in {:?}", restarted.elapsed());

    // The same client (same connection pool) reconnects.
    let got = services
        .get("before")
        .await
        .expect("data written before the restart");
    assert_eq!(got.metadata.name.as_deref(), Some("before"));
    services
        .create(&PostParams::default(), &service("after"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_restart_that_finds_its_port_taken_retries_until_the_port_is_free() {
    let cluster = LocalCluster::start("port-taken").await.unwrap();
    let client = cluster.client().await.unwrap();
    let addr = cluster.apiserver_addr();
    cluster.stop_apiserver();
    // Another process takes the port while the apiserver is away, for 2.5 s.
    let squatter = std::net::TcpListener::bind(addr).expect("the killed apiserver freed its port");
    let held = Duration::from_millis(2500);
    let release = std::thread::spawn(move || {
        std::thread::sleep(held);
        drop(squatter);
    });
    let restarted = Instant::now();
    cluster
        .start_apiserver()
        .await
        .expect("the restart retries once the port is free");
    let took = restarted.elapsed();
    release.join().unwrap();
    eprintln!("restart with its port held {held:?}: ready in {took:?}");
    assert!(
        took >= held,
        "it could not have bound before the port was free: {took:?}"
    );
    assert_eq!(
        cluster.apiserver_addr(),
        addr,
        "same port: clients keep the URL"
    );
    Api::<Namespace>::all(client)
        .list(&Default::default())
        .await
        .expect("the old client reconnects");
}

#[tokio::test]
async fn dropping_the_handle_kills_both_processes_and_removes_the_directory() {
    let cluster = LocalCluster::start("dropped").await.unwrap();
    let pids = cluster.pids();
    let dir = cluster.dir().to_path_buf();
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver run");
    for pid in &pids {
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
    drop(cluster);
    let deadline = Instant::now() + Duration::from_secs(5);
    for pid in &pids {
        // A reaped process has no /proc entry.
        while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} still runs"
        );
    }
    assert!(!dir.exists(), "working directory removed");
}

#[tokio::test]
async fn without_watch_cache_compaction_expires_older_watch_resume_points() {
    use futures::StreamExt;
    use kube::api::{ListParams, WatchEvent, WatchParams};
    let opts = local_cluster::ClusterOptions {
        extra_apiserver_args: vec!["--watch-cache=false".into()],
        ..Default::default()
    };
    let cluster = LocalCluster::start_with("compact", opts).await.unwrap();
    let client = cluster.client().await.unwrap();
    let ns = unique_namespace("compact");
    create_namespace(&client, &ns).await;
    let services = Api::<Service>::namespaced(client, &ns);
    services
        .create(&PostParams::default(), &service("first"))
        .await
        .unwrap();
    let rv = services
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    // Resuming from `rv` works while the history is there.
    let mut watch = Box::pin(
        services
            .watch(&WatchParams::default().timeout(10), &rv)
            .await
            .unwrap(),
    );
    services
        .create(&PostParams::default(), &service("second"))
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("an event");
    assert!(
        matches!(&first, Some(Ok(WatchEvent::Added(s))) if s.metadata.name.as_deref() == Some("second")),
        "{first:?}"
    );
    drop(watch);

    let compacted = cluster.compact_etcd().await.unwrap();
    assert!(compacted > rv.parse::<i64>().unwrap());
    let expired = match services
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
    {
        Err(e) => format!("{e}"),
        Ok(stream) => {
            let mut stream = Box::pin(stream);
            match tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .expect("an answer")
            {
                Some(Ok(WatchEvent::Error(e))) => {
                    assert_eq!(e.code, 410, "{e:?}");
                    "410".to_string()
                }
                other => panic!("resuming from a compacted revision: {other:?}"),
            }
        }
    };
    assert!(expired.contains("410"), "{expired}");
}

#[tokio::test]
async fn a_filled_etcd_refuses_the_apiservers_writes_until_its_space_is_freed() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let opts = local_cluster::ClusterOptions {
        etcd_quota_bytes: Some(32 << 20),
        ..Default::default()
    };
    let cluster = LocalCluster::start_with("nospace", opts).await.unwrap();
    let client = cluster.client().await.unwrap();
    let ns = unique_namespace("nospace");
    create_namespace(&client, &ns).await;
    // A ConfigMap: a Service's create would first try every address of the service
    // CIDR (the allocator's IPAddress creates fail too: minutes for a /16).
    let maps = Api::<ConfigMap>::namespaced(client, &ns);
    let map = |name: &str| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let written = cluster.fill_etcd().await.unwrap();
    // 32 MiB of quota, the apiserver's own data included: about 60 values of 512 KiB.
    assert!((20..=80).contains(&written), "{written} values filled etcd");
    let refused = maps
        .create(&PostParams::default(), &map("refused"))
        .await
        .expect_err("a write to a full etcd");
    assert!(
        refused.to_string().contains("database space exceeded"),
        "{refused}"
    );
    cluster.free_etcd_space().await.unwrap();
    maps.create(&PostParams::default(), &map("accepted"))
        .await
        .expect("a write once the space is freed");
    // Freed for good: filling works again from the start.
    assert!(cluster.fill_etcd().await.unwrap() >= 20);
    cluster.free_etcd_space().await.unwrap();
}
