//! Every behaviour of one cluster watcher, on two real apiservers (remote + local).

use crate::support::resolver::MapResolver;
use crate::support::*;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use local_cluster::{ClusterOptions, LocalCluster};
use service_mirror_controller::link_controller::{LinkConfig, LinkDeps};
use std::sync::Arc;
use std::time::Duration;

const GW_PORT: i32 = 4143;

fn ips(ep: &Endpoints) -> Vec<String> {
    subset_ips(ep)
}

#[tokio::test]
async fn exported_service_gets_a_mirror_with_the_contract_shape() {
    let env = Env::new("shape").await;
    env.gateway("gw", GW_PORT, &["192.0.2.20", "192.0.2.10"])
        .await;
    env.export("web", "gw", &[("http", 80), ("grpc", 9090)])
        .await;
    let w = env.watch();
    let (svc, ep) = env
        .mirror_until("web", "mirror with subsets", |_, e| has_subsets(e))
        .await;

    let remote = env.remote_services().get("web").await.unwrap();
    let gw = env.remote_services().get("gw").await.unwrap();
    let m = &svc.metadata;
    assert_eq!(
        m.name.as_deref(),
        Some(format!("web-{}", env.cluster).as_str())
    );
    for meta in [&svc.metadata, &ep.metadata] {
        assert_eq!(
            label(meta, "mirror.linkerd.io/mirrored-service"),
            Some("true")
        );
        assert_eq!(
            label(meta, "mirror.linkerd.io/cluster-name"),
            Some(env.cluster.as_str())
        );
        assert_eq!(
            label(meta, "mirror.linkerd.io/remote-gateway-name"),
            Some("gw")
        );
        assert_eq!(
            label(meta, "mirror.linkerd.io/remote-gateway-ns"),
            Some(env.ns.as_str())
        );
    }
    assert_eq!(
        annotation(m, "mirror.linkerd.io/remote-resource-version"),
        remote.metadata.resource_version.as_deref()
    );
    assert_eq!(
        annotation(m, "mirror.linkerd.io/remote-svc-fq-name"),
        Some(format!("web.{}.svc.cluster.local", env.ns).as_str())
    );
    assert_eq!(
        annotation(m, "mirror.linkerd.io/remote-gateway-resource-version"),
        gw.metadata.resource_version.as_deref()
    );

    let spec = svc.spec.unwrap();
    assert!(spec.selector.is_none(), "no selector");
    let ports = spec.ports.unwrap();
    assert_eq!(ports.len(), 2);
    for p in &ports {
        assert!(p.node_port.is_none(), "no nodePort");
        assert_eq!(p.protocol.as_deref(), Some("TCP"));
        assert_eq!(p.target_port, Some(IntOrString::Int(p.port)));
    }
    // The ClusterIP comes from the local cluster's own range.
    let ip = spec.cluster_ip.unwrap();
    let prefix = env
        .local
        .service_cidr()
        .split('.')
        .take(2)
        .collect::<Vec<_>>()
        .join(".");
    assert!(
        ip.starts_with(&format!("{prefix}.")),
        "{ip} in {}",
        env.local.service_cidr()
    );

    assert_eq!(
        ips(&ep),
        vec!["192.0.2.10", "192.0.2.20"],
        "sorted gateway addresses"
    );
    assert_eq!(
        subset_ports(&ep),
        vec![
            (Some("http".into()), GW_PORT),
            (Some("grpc".into()), GW_PORT)
        ],
        "one port per service port, at the gateway port"
    );
    assert_eq!(ep.subsets.unwrap().len(), 1);
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn unusable_gateway_gives_endpoints_without_subsets_until_it_becomes_usable() {
    let env = Env::new("nogw").await;
    env.export("api", "gw", &[("http", 80)]).await;
    let w = env.watch();
    // Missing gateway.
    env.mirror_until("api", "mirror without subsets", |_, e| !has_subsets(e))
        .await;
    // Gateway without ingress.
    env.gateway("gw", GW_PORT, &[]).await;
    // Gateway with ingress but no mc-gateway port: each change is reconciled (the
    // gateway's events queue its users) and gives no subsets.
    let api = Subject::link(&env.cluster, &env.ns, "api");
    let wrong_port = serde_json::json!({"spec": {"ports": [{"name": "other", "port": 1234}]}});
    let mark = Mark::now(&InProcess, api.clone());
    Api::<Service>::namespaced(env.rc.clone(), &env.ns)
        .patch("gw", &PatchParams::default(), &Patch::Merge(&wrong_port))
        .await
        .unwrap();
    mark.passed().await;
    let mark = Mark::now(&InProcess, api);
    set_ingress(&env.rc, &env.ns, "gw", &["192.0.2.1"]).await;
    mark.passed().await;
    let (_, ep) = env.mirror("api").await;
    assert!(!has_subsets(&ep.unwrap()), "no mc-gateway port: no subsets");
    // Usable now.
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    let (_, ep) = env
        .mirror_until("api", "subsets appear", |_, e| has_subsets(e))
        .await;
    assert_eq!(ips(&ep), vec!["192.0.2.1"]);
    w.stop(false).await.unwrap();
}

/// A resolver whose answers the test sets.
#[tokio::test]
async fn hostname_ingress_is_resolved_refreshed_and_written_only_on_change() {
    let env = Env::new("dns").await;
    let resolver = Arc::new(MapResolver::default());
    resolver.set("gw.example", &["192.0.2.9", "192.0.2.3"]);
    env.gateway("gw", GW_PORT, &["gw.example"]).await;
    env.gateway("gw2", GW_PORT, &["nowhere.invalid"]).await;
    env.export("db", "gw", &[("pg", 5432)]).await;
    env.export("lost", "gw2", &[("pg", 5432)]).await;
    let config = LinkConfig {
        endpoint_refresh_period: Duration::from_millis(500),
        ..env.config()
    };
    let deps = LinkDeps {
        resolver: resolver.clone(),
        ..LinkDeps::default()
    };
    let w = env.watch_with(config, deps);
    let (_, ep) = env
        .mirror_until("db", "resolved addresses", |_, e| has_subsets(e))
        .await;
    assert_eq!(
        ips(&ep),
        vec!["192.0.2.3", "192.0.2.9"],
        "all addresses, sorted"
    );
    let (_, lost) = env
        .mirror_until("lost", "unresolvable: mirror without subsets", |_, _| true)
        .await;
    assert!(!has_subsets(&lost));

    // Several refresh periods with the same answers: no write. Each refresh queues the
    // mirrors of gateways given by hostname (`refresh_hostnames`): four more reconciles
    // of each are at least two refresh rounds (two may be the own events of its last
    // writes, its Service's and its Endpoints').
    let before = env.local_writes().len();
    let seen: Vec<(Subject, u64)> = ["db", "lost"]
        .iter()
        .map(|s| {
            let s = Subject::link(&env.cluster, &env.ns, s);
            let n = InProcess.reconciles(&s);
            (s, n)
        })
        .collect();
    for (s, n) in &seen {
        reconciled_after(&InProcess, s, n + 3).await;
    }
    assert_eq!(
        env.local_writes()[before..],
        [] as [String; 0],
        "no write while addresses are unchanged"
    );

    // New answers are picked up at the next refresh; the lost host resolves later.
    resolver.set("gw.example", &["192.0.2.4"]);
    resolver.set("nowhere.invalid", &["192.0.2.5"]);
    env.mirror_until("db", "re-resolved", |_, e| ips(e) == ["192.0.2.4"])
        .await;
    env.mirror_until("lost", "resolved later", |_, e| ips(e) == ["192.0.2.5"])
        .await;
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn remote_updates_rewrite_the_mirror() {
    let env = Env::new("update").await;
    env.gateway("gw-a", GW_PORT, &["192.0.2.1"]).await;
    env.gateway("gw-b", 5000, &["192.0.2.2"]).await;
    env.export("web", "gw-a", &[("http", 80)]).await;
    let w = env.watch();
    env.mirror_until("web", "first mirror", |_, e| has_subsets(e))
        .await;

    // Port added and renamed.
    env.patch_remote(
        "web",
        serde_json::json!({"spec": {"ports": [
        {"name": "web", "port": 80, "protocol": "TCP"},
        {"name": "admin", "port": 9000, "protocol": "TCP"}]}}),
    )
    .await;
    let (svc, ep) = env
        .mirror_until("web", "ports added and renamed", |s, e| {
            service_ports(s).len() == 2 && subset_ports(e).len() == 2
        })
        .await;
    assert_eq!(
        service_ports(&svc),
        vec![(Some("web".into()), 80), (Some("admin".into()), 9000)]
    );
    assert_eq!(
        subset_ports(&ep),
        vec![
            (Some("web".into()), GW_PORT),
            (Some("admin".into()), GW_PORT)
        ]
    );

    // Port removed.
    env.patch_remote("web", serde_json::json!({"spec": {"ports": [{"name": "admin", "port": 9000, "protocol": "TCP"}]}}))
        .await;
    env.mirror_until("web", "port removed", |s, e| {
        service_ports(s).len() == 1 && subset_ports(e).len() == 1
    })
    .await;

    // Moved to another gateway.
    env.patch_remote("web", serde_json::json!({"metadata": {"annotations": {"mirror.linkerd.io/gateway-name": "gw-b"}}}))
        .await;
    let (svc, ep) = env
        .mirror_until("web", "moved to gw-b", |s, e| {
            // Service and Endpoints are two writes; wait for both rather than
            // read the Service in the gap between them (CI run of stop 18).
            ips(e) == ["192.0.2.2"]
                && label(&s.metadata, "mirror.linkerd.io/remote-gateway-name") == Some("gw-b")
        })
        .await;
    assert_eq!(
        label(&svc.metadata, "mirror.linkerd.io/remote-gateway-name"),
        Some("gw-b")
    );
    assert_eq!(
        label(&ep.metadata, "mirror.linkerd.io/remote-gateway-name"),
        Some("gw-b")
    );
    assert_eq!(subset_ports(&ep), vec![(Some("admin".into()), 5000)]);
    let remote = env.remote_services().get("web").await.unwrap();
    assert_eq!(
        annotation(&svc.metadata, "mirror.linkerd.io/remote-resource-version"),
        remote.metadata.resource_version.as_deref()
    );
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn unexported_or_deleted_services_lose_their_mirror() {
    let env = Env::new("unexport").await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    env.export("a", "gw", &[("http", 80)]).await;
    env.export("b", "gw", &[("http", 80)]).await;
    let w = env.watch();
    env.mirror_until("a", "mirror a", |_, _| true).await;
    env.mirror_until("b", "mirror b", |_, _| true).await;
    env.patch_remote(
        "a",
        serde_json::json!({"metadata": {"annotations": {"mirror.linkerd.io/gateway-ns": null}}}),
    )
    .await;
    env.mirror_gone("a").await;
    env.delete_remote("b").await;
    env.mirror_gone("b").await;
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn gateway_changes_update_its_mirrors_and_only_those() {
    let env = Env::new("gwupd").await;
    env.gateway("gw-1", GW_PORT, &["192.0.2.1"]).await;
    env.gateway("gw-2", GW_PORT, &["192.0.2.2"]).await;
    env.export("one-a", "gw-1", &[("http", 80)]).await;
    env.export("one-b", "gw-1", &[("http", 80)]).await;
    env.export("two", "gw-2", &[("http", 80)]).await;
    let w = env.watch();
    for s in ["one-a", "one-b", "two"] {
        env.mirror_until(s, "mirrored", |_, e| has_subsets(e)).await;
    }
    let (two_svc, two_ep) = env.mirror("two").await;
    let untouched = (
        two_svc.unwrap().metadata.resource_version,
        two_ep.unwrap().metadata.resource_version,
    );

    env.gateway("gw-1", 4999, &["192.0.2.7", "192.0.2.8"]).await;
    let gw = env.remote_services().get("gw-1").await.unwrap();
    for s in ["one-a", "one-b"] {
        // The Endpoints are written first, the Service's gateway annotation right after.
        let (_, ep) = env
            .mirror_until(s, "new gateway addresses, port and version", |svc, e| {
                ips(e) == ["192.0.2.7", "192.0.2.8"]
                    && subset_ports(e) == [(Some("http".into()), 4999)]
                    && annotation(
                        &svc.metadata,
                        "mirror.linkerd.io/remote-gateway-resource-version",
                    ) == gw.metadata.resource_version.as_deref()
            })
            .await;
        assert!(has_subsets(&ep));
    }
    let (two_svc, two_ep) = env.mirror("two").await;
    assert_eq!(
        (
            two_svc.unwrap().metadata.resource_version,
            two_ep.unwrap().metadata.resource_version
        ),
        untouched
    );
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn deleted_or_unusable_gateway_keeps_services_and_empties_endpoints() {
    let env = Env::new("gwdel").await;
    env.gateway("gw-1", GW_PORT, &["192.0.2.1"]).await;
    env.gateway("gw-2", GW_PORT, &["192.0.2.2"]).await;
    env.export("x", "gw-1", &[("http", 80)]).await;
    env.export("y", "gw-2", &[("http", 80)]).await;
    let w = env.watch();
    env.mirror_until("x", "x mirrored", |_, e| has_subsets(e))
        .await;
    env.mirror_until("y", "y mirrored", |_, e| has_subsets(e))
        .await;
    env.delete_remote("gw-1").await;
    env.mirror_until("x", "gateway deleted: no subsets", |_, e| !has_subsets(e))
        .await;
    set_ingress(&env.rc, &env.ns, "gw-2", &[]).await;
    env.mirror_until("y", "gateway unusable: no subsets", |_, e| !has_subsets(e))
        .await;
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn missing_local_namespace_is_created_with_mirror_labels() {
    let env = Env::new("newns").await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    env.export("svc", "gw", &[("http", 80)]).await;
    let namespaces: Api<Namespace> = Api::all(env.lc.clone());
    assert!(namespaces.get_opt(&env.ns).await.unwrap().is_none());
    let w = env.watch();
    env.mirror_until("svc", "mirror", |_, _| true).await;
    let ns = namespaces.get(&env.ns).await.unwrap();
    assert_eq!(
        label(&ns.metadata, "mirror.linkerd.io/mirrored-service"),
        Some("true")
    );
    assert_eq!(
        label(&ns.metadata, "mirror.linkerd.io/cluster-name"),
        Some(env.cluster.as_str())
    );
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn restart_collects_orphans_left_by_a_crash() {
    let env = Env::new("orphan").await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    for s in ["keep", "gone", "unexported"] {
        env.export(s, "gw", &[("http", 80)]).await;
    }
    let w = env.watch();
    for s in ["keep", "gone", "unexported"] {
        env.mirror_until(s, "mirrored", |_, _| true).await;
    }
    w.stop(false).await.unwrap(); // the "crash": mirrors stay
    env.delete_remote("gone").await;
    env.patch_remote(
        "unexported",
        serde_json::json!({"metadata": {"annotations": {"mirror.linkerd.io/gateway-name": null}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        env.mirror("gone").await.0.is_some(),
        "nobody watched: the orphan is still there"
    );

    let w = env.watch();
    env.mirror_gone("gone").await;
    env.mirror_gone("unexported").await;
    let (svc, ep) = env.mirror("keep").await;
    assert!(
        svc.is_some() && ep.is_some(),
        "exported service keeps its mirror"
    );
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn stop_with_cleanup_deletes_every_mirror_and_without_keeps_them() {
    let env = Env::new("cleanup").await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    env.export("a", "gw", &[("http", 80)]).await;
    env.export("b", "gw", &[("http", 80)]).await;
    let w = env.watch();
    env.mirror_until("a", "a", |_, _| true).await;
    env.mirror_until("b", "b", |_, _| true).await;
    w.stop(false).await.unwrap();
    assert!(
        env.mirror("a").await.0.is_some(),
        "stop without cleanup keeps mirrors"
    );

    let w = env.watch();
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.stop(true).await.unwrap();
    for s in ["a", "b"] {
        assert_eq!(
            env.mirror(s).await,
            (None, None),
            "link removed: {s} deleted"
        );
    }
}

/// Creates someone else's Service (no mirror labels) holding the name of `remote`'s
/// mirror.
async fn foreign_holder(env: &Env, remote: &str) -> Service {
    let foreign = Service {
        metadata: kube::api::ObjectMeta {
            name: Some(env.mirror_name(remote)),
            labels: Some([("app".to_string(), "mine".to_string())].into()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
            ports: Some(ports(&[("x", 1)])),
            ..Default::default()
        }),
        ..Default::default()
    };
    env.local_services()
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap()
}

/// Waits for the `MirrorConflict` Event of the world's namespace.
async fn conflict_event(env: &Env) -> Event {
    let events: Api<Event> = Api::namespaced(env.lc.clone(), &env.ns);
    eventually("conflict event", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("MirrorConflict"))
    })
    .await
}

#[tokio::test]
async fn objects_we_do_not_own_are_never_touched_and_conflicts_are_reported() {
    let env = Env::new("owner").await;
    create_namespace(&env.lc, &env.ns).await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    env.export("taken", "gw", &[("http", 80)]).await;
    // Someone else's Service holds the mirror's name.
    let foreign = foreign_holder(&env, "taken").await;
    // A mirror of another cluster in the same namespace.
    let mut other = exported("other-svc-x", &env.ns, "gw", &[("http", 80)]);
    other.metadata.annotations = Some(
        [(
            "mirror.linkerd.io/remote-svc-fq-name".to_string(),
            format!("other-svc.{}.svc.cluster.local", env.ns),
        )]
        .into(),
    );
    other.metadata.labels = Some(
        [
            (
                "mirror.linkerd.io/mirrored-service".to_string(),
                "true".to_string(),
            ),
            (
                "mirror.linkerd.io/cluster-name".to_string(),
                "x".to_string(),
            ),
        ]
        .into(),
    );
    let other = env
        .local_services()
        .create(&PostParams::default(), &other)
        .await
        .unwrap();

    let w = env.watch();
    let event = conflict_event(&env).await;
    assert_eq!(event.regarding.unwrap().name, foreign.metadata.name);
    // The conflict's retry, refused again: it had its chance to write.
    Mark::now(&InProcess, Subject::link(&env.cluster, &env.ns, "taken"))
        .passed()
        .await;
    let now = env
        .local_services()
        .get(&env.mirror_name("taken"))
        .await
        .unwrap();
    assert_eq!(
        now.metadata.resource_version, foreign.metadata.resource_version,
        "foreign Service untouched"
    );
    let now = env.local_services().get("other-svc-x").await.unwrap();
    assert_eq!(
        now.metadata.resource_version, other.metadata.resource_version,
        "other cluster's mirror untouched"
    );
    assert!(
        env.status_failing(&w),
        "the conflict is retried, not dropped"
    );

    // Once the owner frees the name, the retry creates the mirror.
    env.local_services()
        .delete(&env.mirror_name("taken"), &DeleteParams::default())
        .await
        .unwrap();
    env.mirror_until("taken", "mirror after the conflict is gone", |s, _| {
        label(&s.metadata, "mirror.linkerd.io/cluster-name") == Some(env.cluster.as_str())
    })
    .await;
    w.stop(true).await.unwrap();
    assert!(
        env.local_services()
            .get_opt("other-svc-x")
            .await
            .unwrap()
            .is_some(),
        "cleanup spares other clusters"
    );
}

/// A name held for long enough that the key's retries have backed off to 16 s (after
/// the first failure at t0: 5, 10, 20 ms, then t0+1, +3, +7, +15, +31 s) comes back
/// within the 5 s read recheck of `blocked.rs` once freed at t0+17 s, not at the retry
/// of t0+31 s: the label-selected watches see nothing of the holder's delete.
#[tokio::test]
async fn a_mirror_name_freed_after_a_long_conflict_is_mirrored_within_the_recheck() {
    let env = Env::new("freed").await;
    create_namespace(&env.lc, &env.ns).await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    foreign_holder(&env, "held").await;
    env.export("held", "gw", &[("http", 80)]).await;
    let w = env.watch();
    conflict_event(&env).await;
    // Time is the subject: the key's retries must have backed off to 16 s (past t0+15 s)
    // before the name is freed, so that the recheck, not a retry, brings the mirror.
    tokio::time::sleep(Duration::from_secs(17)).await;
    env.local_services()
        .delete(&env.mirror_name("held"), &DeleteParams::default())
        .await
        .unwrap();
    let freed = std::time::Instant::now();
    env.mirror_until("held", "mirror after the long conflict", |s, _| {
        label(&s.metadata, "mirror.linkerd.io/cluster-name") == Some(env.cluster.as_str())
    })
    .await;
    let took = freed.elapsed();
    eprintln!("mirrored {took:?} after the name was freed");
    // The recheck runs every 5 s; the next retry comes about 14 s after the delete
    // (measured: 14.2 s without the recheck, 2.9 s with it). A generous bound for a loaded 2-core
    // machine, still under the backoff's.
    assert!(took < Duration::from_secs(9), "took {took:?}");
    w.stop(true).await.unwrap();
}

trait StatusExt {
    fn status_failing(
        &self,
        w: &service_mirror_controller::link_controller::LinkController,
    ) -> bool;
}

impl StatusExt for Env {
    fn status_failing(
        &self,
        w: &service_mirror_controller::link_controller::LinkController,
    ) -> bool {
        w.status().failing > 0
    }
}

#[tokio::test]
async fn long_names_get_a_deterministic_short_name_and_map_back_by_annotation() {
    let env = Env::new("long").await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    let long = format!("s{}", "x".repeat(61)); // 62 chars: with the suffix it exceeds 63
    env.export(&long, "gw", &[("http", 80)]).await;
    let w = env.watch();
    let (svc, _) = env.mirror_until(&long, "long mirror", |_, _| true).await;
    let name = svc.metadata.name.clone().unwrap();
    assert_eq!(name.len(), 63, "{name}");
    assert!(name.ends_with(&format!("-{}", env.cluster)));
    assert_eq!(
        annotation(&svc.metadata, "mirror.linkerd.io/remote-svc-fq-name"),
        Some(format!("{long}.{}.svc.cluster.local", env.ns).as_str())
    );
    env.delete_remote(&long).await;
    env.mirror_gone(&long).await;
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn drift_is_restored() {
    let env = Env::new("drift").await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let w = env.watch();
    env.mirror_until("web", "mirror", |_, e| has_subsets(e))
        .await;
    let name = env.mirror_name("web");

    let drift = serde_json::json!({
        "metadata": {"labels": {"mirror.linkerd.io/remote-gateway-name": "evil"}},
        "spec": {"ports": [{"name": "http", "port": 81, "protocol": "TCP", "targetPort": 81}]}
    });
    env.local_services()
        .patch(&name, &PatchParams::default(), &Patch::Merge(&drift))
        .await
        .unwrap();
    env.mirror_until("web", "service restored", |s, _| {
        service_ports(s) == [(Some("http".into()), 80)]
            && label(&s.metadata, "mirror.linkerd.io/remote-gateway-name") == Some("gw")
    })
    .await;

    let drift = serde_json::json!({"subsets": [{"addresses": [{"ip": "198.51.100.1"}], "ports": [{"name": "http", "port": 1}]}]});
    env.local_endpoints()
        .patch(&name, &PatchParams::default(), &Patch::Merge(&drift))
        .await
        .unwrap();
    env.mirror_until("web", "subsets restored", |_, e| {
        ips(e) == ["192.0.2.1"] && subset_ports(e) == [(Some("http".into()), GW_PORT)]
    })
    .await;

    env.local_endpoints()
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    env.mirror_until("web", "endpoints re-created", |_, e| has_subsets(e))
        .await;
    env.local_services()
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    env.mirror_until("web", "service re-created", |_, _| true)
        .await;
    w.stop(false).await.unwrap();
}

/// The local identity of the watcher in the retry test: all it needs, but Endpoints
/// read-only (every Endpoints create or update is forbidden).
const ENDPOINTS_READ_ONLY: Rules<'static> = &[
    (
        &["services"],
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ],
    ),
    (&["endpoints"], &["get", "list", "watch"]),
    (&["namespaces"], &["create", "get"]),
    // Every mode watches our slices (to clean up after a switch): part of any identity.
    (&["endpointslices.discovery.k8s.io"], SLICE_VERBS),
];

/// The verbs `install` grants on EndpointSlices.
const SLICE_VERBS: &[&str] = &["get", "list", "watch", "create", "update", "delete"];

/// The same identity with full rights on Endpoints too.
const FULL_RIGHTS: Rules<'static> = &[
    (
        &["services", "endpoints"],
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ],
    ),
    (&["namespaces"], &["create", "get"]),
    (&["endpointslices.discovery.k8s.io"], SLICE_VERBS),
];

/// How many audit entries (`verb resource/name`) start with `prefix`.
fn count(entries: &[String], prefix: &str) -> usize {
    entries.iter().filter(|e| e.starts_with(prefix)).count()
}

#[tokio::test]
async fn failing_writes_are_retried_with_backoff_without_deleting_the_mirror() {
    let env = Env::new("retry").await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    env.export("web", "gw", &[("http", 80)]).await;
    let name = env.mirror_name("web");
    // A denied create is audited without a name (its body is never read); this
    // namespace holds one mirror only, so the kind tells which object it was.
    let (create_svc, create_ep) = ("create services/", "create endpoints/");
    let (update_svc, update_ep) = (
        format!("update services/{name}"),
        format!("update endpoints/{name}"),
    );
    let delete_svc = format!("delete services/{name}");
    // The account lives in another namespace: the watcher creates the mirror's one.
    let sa_ns = format!("{}-sa", env.ns);
    let local = sa_client(&env.local, &sa_ns, "mirror", ENDPOINTS_READ_ONLY).await;
    let w = env.watch_clients(local, env.rc.clone());

    // The Service is created, its Endpoints are forbidden.
    let svc = eventually("mirror Service created, Endpoints failing", || async {
        let svc = env.local_services().get_opt(&name).await.unwrap()?;
        (w.status().failing > 0 && count(&env.local_write_attempts(), create_ep) > 0).then_some(svc)
    })
    .await;
    let uid = svc.metadata.uid.clone();
    let started = count(&env.local_write_attempts(), create_ep);
    // Time is the subject: retried with backoff, not in a hot loop, is a count of
    // attempts within a span (at most 10 Endpoints creates in 2 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (writes, attempts) = (env.local_writes(), env.local_write_attempts());
    let ep_attempts = count(&attempts, create_ep);
    assert_eq!(
        count(&writes, create_ep),
        0,
        "every Endpoints create is forbidden"
    );
    assert!(
        ep_attempts >= 3 && ep_attempts > started,
        "the Endpoints create is retried: {attempts:#?}"
    );
    assert!(
        attempts.len() < 40 && ep_attempts - started <= 10,
        "backoff, not a hot loop: {} write requests, {} Endpoints creates in 2 s",
        attempts.len(),
        ep_attempts - started
    );
    assert!(w.status().failing > 0, "still retrying");
    assert_eq!(count(&writes, create_svc), 1, "{writes:#?}");
    assert_eq!(
        count(&attempts, &delete_svc),
        0,
        "the Service is never deleted because its Endpoints cannot be written: {attempts:#?}"
    );
    let (svc, ep) = env.mirror("web").await;
    assert_eq!(svc.expect("the Service stays").metadata.uid, uid);
    assert!(ep.is_none());

    // Full rights for the same identity: the retries complete the mirror, and the
    // Service is the one created first.
    sa_kubeconfig(&env.local, &sa_ns, "mirror", FULL_RIGHTS).await;
    let (svc, _) = env
        .mirror_until("web", "Endpoints written once allowed", |_, e| {
            ips(e) == ["192.0.2.1"]
        })
        .await;
    assert_eq!(svc.metadata.uid, uid, "the Service was never re-created");
    eventually("no failing key", || async {
        (w.status().failing == 0).then_some(())
    })
    .await;

    // Endpoints read-only again: updates that fail later keep the working mirror. The
    // port change updates the Service; the Endpoints update is forbidden and retried.
    sa_kubeconfig(&env.local, &sa_ns, "mirror", ENDPOINTS_READ_ONLY).await;
    let before = env.local_write_attempts().len();
    env.patch_remote(
        "web",
        serde_json::json!({"spec": {"ports": [{"name": "http", "port": 81, "protocol": "TCP"}]}}),
    )
    .await;
    set_ingress(&env.rc, &env.ns, "gw", &["192.0.2.2"]).await;
    env.mirror_until("web", "Service updated", |s, _| {
        service_ports(s) == [(Some("http".into()), 81)]
    })
    .await;
    eventually("Endpoints update failing", || async {
        (w.status().failing > 0 && count(&env.local_write_attempts()[before..], &update_ep) > 0)
            .then_some(())
    })
    .await;
    // Its next retry, refused again: the key had another chance to delete.
    Mark::now(&InProcess, Subject::link(&env.cluster, &env.ns, "web"))
        .passed()
        .await;
    let attempts = env.local_write_attempts()[before..].to_vec();
    assert_eq!(
        count(&env.local_writes(), &update_ep),
        0,
        "no Endpoints update is allowed"
    );
    assert!(count(&attempts, &update_svc) >= 1, "{attempts:#?}");
    assert!(
        attempts.iter().all(|a| !a.starts_with("delete ")),
        "nothing is deleted while writes fail: {attempts:#?}"
    );
    let (svc, ep) = env.mirror("web").await;
    assert_eq!(svc.expect("the Service stays").metadata.uid, uid);
    let ep = ep.expect("the Endpoints stay");
    assert_eq!(ips(&ep), ["192.0.2.1"], "old Endpoints kept as they were");

    sa_kubeconfig(&env.local, &sa_ns, "mirror", FULL_RIGHTS).await;
    let (svc, _) = env
        .mirror_until("web", "Endpoints updated once allowed", |_, e| {
            ips(e) == ["192.0.2.2"] && subset_ports(e) == [(Some("http".into()), GW_PORT)]
        })
        .await;
    assert_eq!(svc.metadata.uid, uid);
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn remote_outage_keeps_mirrors_and_expired_watches_resync() {
    // A private remote cluster: this test compacts its etcd. Without a watch cache its
    // apiserver serves watches from etcd, so a compacted resume point answers 410 as it
    // does after a long outage (the cache window passed) or an apiserver restart. The
    // watcher reaches it through a proxy the test cuts; the test's admin goes direct.
    let opts = ClusterOptions {
        extra_apiserver_args: vec!["--watch-cache=false".into()],
        ..Default::default()
    };
    let remote = Arc::new(LocalCluster::start_with("outage", opts).await.unwrap());
    let local = local_cluster::shared_cluster("local").await.unwrap();
    let env = Env::on(remote.clone(), local, "outage").await;
    let (proxy, proxied) = through_proxy(&remote).await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    env.export("a", "gw", &[("http", 80)]).await;
    env.export("b", "gw", &[("http", 80)]).await;
    let w = env.watch_clients(env.lc.clone(), proxied);
    env.mirror_until("a", "a", |_, e| has_subsets(e)).await;
    env.mirror_until("b", "b", |_, e| has_subsets(e)).await;
    assert!(
        proxy.accepted() > 0,
        "the watcher's remote client uses the proxy"
    );
    assert_eq!(w.status().relists, 0);

    // The outage: the watcher is blind, the remote lives on.
    let before = env.local_writes().len();
    proxy.cut().await.unwrap();
    eventually("the watcher notices the outage", || async {
        (!w.status().remote_connected).then_some(())
    })
    .await;
    env.delete_remote("b").await;
    set_ingress(&env.rc, &env.ns, "gw", &["192.0.2.99"]).await;
    // History up to now is compacted: the watcher's resume point is gone (HTTP 410).
    remote.compact_etcd().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!w.status().remote_connected, "still blind");
    assert_eq!(
        env.local_writes()[before..],
        [] as [String; 0],
        "outage: mirrors untouched"
    );
    let (a, b) = (env.mirror("a").await, env.mirror("b").await);
    assert!(a.1.is_some_and(|e| ips(&e) == ["192.0.2.1"]), "a as it was");
    assert!(b.0.is_some() && b.1.is_some(), "b kept while blind");

    proxy.restore().unwrap();
    // The delete of `b` was never seen as an event: only a full list finds it.
    eventually("the watcher lists the remote again", || async {
        (w.status().relists >= 1).then_some(())
    })
    .await;
    env.mirror_gone("b").await;
    env.mirror_until("a", "new gateway address after resync", |_, e| {
        ips(e) == ["192.0.2.99"]
    })
    .await;
    assert!(w.status().remote_connected && w.status().remote_synced);
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn start_while_the_remote_is_away_deletes_nothing() {
    let remote = Arc::new(LocalCluster::start("away").await.unwrap());
    let local = local_cluster::shared_cluster("local").await.unwrap();
    let env = Env::on(remote.clone(), local, "away").await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    env.export("a", "gw", &[("http", 80)]).await;
    let w = env.watch();
    env.mirror_until("a", "a", |_, e| has_subsets(e)).await;
    w.stop(false).await.unwrap();

    remote.stop_apiserver();
    let before = env.local_writes().len();
    // The successor's local lists queue `a` (its mirror): reconciled with the remote
    // never listed, it had its chance to delete.
    let mark = Mark::now(&InProcess, Subject::link(&env.cluster, &env.ns, "a"));
    let w = env.watch();
    mark.passed().await;
    assert!(!w.status().remote_synced);
    assert_eq!(
        env.local_writes().len(),
        before,
        "an unreachable remote is not an empty one"
    );
    assert!(env.mirror("a").await.0.is_some());
    remote.start_apiserver().await.unwrap();
    eventually("remote synced", || async {
        w.status().remote_synced.then_some(())
    })
    .await;
    env.mirror_until("a", "mirror still there", |_, e| has_subsets(e))
        .await;
    w.stop(false).await.unwrap();
}

#[tokio::test]
async fn an_unchanged_world_causes_zero_writes() {
    let env = Env::new("idle").await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    for i in 0..10 {
        env.export(&format!("s{i}"), "gw", &[("http", 80), ("admin", 9000)])
            .await;
    }
    let config = LinkConfig {
        endpoint_refresh_period: Duration::from_millis(300),
        ..env.config()
    };
    let w = env.watch_with(config, LinkDeps::default());
    for i in 0..10 {
        env.mirror_until(&format!("s{i}"), "mirrored", |_, e| has_subsets(e))
            .await;
    }
    let converged = env.local_writes();
    // 10 Services + 10 Endpoints + the namespace, exactly. Workers that race into the
    // missing namespace each pay at most a refused create and a namespace create that
    // finds it made (4 workers); a create racing our own cache is one more, rarely:
    // attempts, not writes.
    assert_eq!(converged.len(), 21, "writes to converge: {converged:#?}");
    let attempts = env.local_write_attempts().len();
    assert!(
        attempts <= 21 + 2 * 4 + 2,
        "requests to converge: {attempts}"
    );
    // Idle: a round in which every key was reconciled after its last write wrote
    // nothing (`quiet`; the gateway is given by IP, so the 300 ms endpoint refresh
    // queues nothing).
    let keys: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    let keys: Vec<(&str, &str)> = keys.iter().map(|k| (env.ns.as_str(), k.as_str())).collect();
    let attempts = crate::quiet(&env, &w, &keys).await;
    // A restart re-lists everything and finds nothing to do either.
    env.assert_restart_writes_nothing(w, attempts, || env.watch())
        .await;
}

#[tokio::test]
async fn the_mirror_limit_refuses_wakes_in_order_and_never_deletes() {
    let env = Env::new("limit").await;
    env.gateway("gw", GW_PORT, &["192.0.2.1"]).await;
    env.export("a", "gw", &[("http", 80)]).await;
    env.export("b", "gw", &[("http", 80)]).await;
    let limited = |max| LinkConfig {
        max_mirrors: Some(max),
        ..env.config()
    };
    let w = env.watch_with(limited(2), LinkDeps::default());
    env.mirror_until("a", "mirror a", |_, _| true).await;
    env.mirror_until("b", "mirror b", |_, _| true).await;
    // Over the limit: c (headless, so its ports may go later) and d are refused.
    let mut c = exported("c", &env.ns, "gw", &[("http", 80)]);
    c.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    env.remote_services()
        .create(&PostParams::default(), &c)
        .await
        .unwrap();
    env.export("d", "gw", &[("http", 80)]).await;
    eventually("c and d refused", || async {
        (w.status().refused == 2).then_some(())
    })
    .await;
    // A refused service that can no longer be mirrored gives up its place in line...
    env.patch_remote("c", serde_json::json!({"spec": {"ports": null}}))
        .await;
    eventually("c no longer refused", || async {
        (w.status().refused == 1).then_some(())
    })
    .await;
    // ...so the slot a frees goes to d.
    env.patch_remote(
        "a",
        serde_json::json!({"metadata": {"annotations": {"mirror.linkerd.io/gateway-ns": null}}}),
    )
    .await;
    env.mirror_gone("a").await;
    env.mirror_until("d", "d takes the freed slot", |_, e| {
        subset_ips(e) == ["192.0.2.1"]
    })
    .await;
    assert_eq!(w.status().refused, 0);
    assert_eq!(env.mirror("c").await, (None, None));
    w.stop(false).await.unwrap();

    // A lower limit after a restart keeps every existing mirror and refuses new ones.
    let w = env.watch_with(limited(1), LinkDeps::default());
    env.export("e", "gw", &[("http", 80)]).await;
    eventually("e refused", || async {
        (w.status().refused == 1).then_some(())
    })
    .await;
    for kept in ["b", "d"] {
        assert!(env.mirror(kept).await.0.is_some(), "{kept} kept");
    }
    assert_eq!(env.mirror("e").await, (None, None));
    w.stop(false).await.unwrap();
}
