//! Hostile and bad input from a remote cluster: every case ends in a valid mirror or a
//! reported refusal, never a crash, a stuck queue or a write outside the remit.

use crate::support::*;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::{Api, ListParams, PostParams};
use service_mirror_controller::link_controller::{LinkConfig, LinkDeps};
use service_mirror_controller::metrics::Metrics;
use service_mirror_core::NamespaceFilter;

fn svc(value: serde_json::Value) -> Service {
    serde_json::from_value(value).unwrap()
}

#[tokio::test]
async fn hostile_remote_services_end_in_valid_mirrors_or_reported_refusals() {
    let env = Env::new("hostile").await;
    // A second namespace of the maximum length, holding the gateway of some services.
    let long_ns = format!("{}-{}", env.ns, "n".repeat(62 - env.ns.len()));
    assert_eq!(long_ns.len(), 63);
    create_namespace(&env.rc, &long_ns).await;
    gateway_in(&env.rc, &long_ns, "gw", 4143, &["192.0.2.1"]).await;
    env.gateway("gw-v6", 4143, &["2001:db8::1"]).await;
    env.gateway("gw-loopback", 4143, &["127.0.0.1"]).await;
    let remote_long: Api<Service> = Api::namespaced(env.rc.clone(), &long_ns);
    let exported_to = |name: &str, gw_ns: &str, gw: &str, extra: serde_json::Value| {
        let mut v = serde_json::json!({
            "metadata": {"name": name, "annotations": {
                "mirror.linkerd.io/gateway-name": gw, "mirror.linkerd.io/gateway-ns": gw_ns}},
            "spec": {"ports": [{"name": "http", "port": 80}]}
        });
        merge(&mut v, extra);
        svc(v)
    };
    let pp = PostParams::default();
    let name63 = format!("s{}", "x".repeat(62));
    remote_long
        .create(
            &pp,
            &exported_to(&name63, &long_ns, "gw", serde_json::json!({})),
        )
        .await
        .unwrap();
    let ports: Vec<_> = (0..250)
        .map(|i| serde_json::json!({"name": format!("p{i}"), "port": 1000 + i}))
        .collect();
    let cases = [
        (
            "many-ports",
            &long_ns,
            "gw",
            serde_json::json!({"spec": {"ports": ports}}),
        ),
        // The gateway lives in another namespace than the service.
        ("cross-ns-gateway", &long_ns, "gw", serde_json::json!({})),
        ("missing-gateway", &env.ns, "nope", serde_json::json!({})),
        ("ipv6-gateway", &env.ns, "gw-v6", serde_json::json!({})),
        (
            "loopback-gateway",
            &env.ns,
            "gw-loopback",
            serde_json::json!({}),
        ),
        (
            "huge-annotation",
            &long_ns,
            "gw",
            serde_json::json!({"metadata": {"annotations": {"junk": "x".repeat(200_000)}}}),
        ),
        (
            "unnamed-port",
            &long_ns,
            "gw",
            serde_json::json!({"spec": {"ports": [{"port": 8080}]}}),
        ),
        (
            "udp",
            &long_ns,
            "gw",
            serde_json::json!({"spec": {"ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}}),
        ),
        (
            "no-ports",
            &long_ns,
            "gw",
            serde_json::json!({"spec": {"clusterIP": "None", "ports": null}}),
        ),
    ];
    for (name, gw_ns, gw, extra) in &cases {
        env.remote_services()
            .create(&pp, &exported_to(name, gw_ns, gw, extra.clone()))
            .await
            .unwrap();
    }
    // A service in kube-system asks to be mirrored; even allowing it by name, the
    // default deny list wins.
    let system: Api<Service> = Api::namespaced(env.rc.clone(), "kube-system");
    let sys_name = format!("sys-{}", env.cluster);
    system
        .create(
            &pp,
            &exported_to(&sys_name, &long_ns, "gw", serde_json::json!({})),
        )
        .await
        .unwrap();

    let metrics = Metrics::new();
    let w = env.watch_with(
        LinkConfig {
            namespaces: NamespaceFilter::allow_only([
                env.ns.clone(),
                long_ns.clone(),
                "kube-system".into(),
            ]),
            ..env.config()
        },
        LinkDeps {
            metrics: metrics.clone(),
            ..LinkDeps::default()
        },
    );

    // 63-character name and namespace: the short-name rule applies.
    let long_mirrors: Api<Service> = Api::namespaced(env.lc.clone(), &long_ns);
    let m = service_mirror_core::mirror_name(&name63, &env.cluster);
    assert_eq!(m.len(), 63);
    eventually("63-character mirror", || async {
        long_mirrors.get_opt(&m).await.unwrap()
    })
    .await;

    let (svc, ep) = env
        .mirror_until("many-ports", "250 ports", |s, e| {
            service_ports(s).len() == 250 && subset_ports(e).len() == 250
        })
        .await;
    assert!(
        svc.spec
            .unwrap()
            .ports
            .unwrap()
            .iter()
            .all(|p| p.node_port.is_none())
    );
    assert!(has_subsets(&ep));
    env.mirror_until(
        "cross-ns-gateway",
        "gateway in another namespace",
        |_, e| subset_ips(e) == ["192.0.2.1"],
    )
    .await;
    env.mirror_until("missing-gateway", "no gateway: no subsets", |_, e| {
        !has_subsets(e)
    })
    .await;
    env.mirror_until("ipv6-gateway", "IPv6 gateway address", |_, e| {
        subset_ips(e) == ["2001:db8::1"]
    })
    .await;
    env.mirror_until(
        "loopback-gateway",
        "a loopback gateway address is refused",
        |_, e| !has_subsets(e),
    )
    .await;
    env.mirror_until(
        "huge-annotation",
        "mirrored without the remote's annotations",
        |s, _| {
            s.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| !a.contains_key("junk"))
        },
    )
    .await;
    env.mirror_until("unnamed-port", "unnamed port", |s, e| {
        service_ports(s) == [(None, 8080)] && has_subsets(e)
    })
    .await;
    env.mirror_until("udp", "UDP port", |s, _| {
        s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0]
            .protocol
            .as_deref()
            == Some("UDP")
    })
    .await;

    // Refusals are reported and nothing is stuck.
    eventually("queue drained", || async {
        (w.status().queue_depth == 0).then_some(())
    })
    .await;
    assert_eq!(
        env.mirror("no-ports").await,
        (None, None),
        "a service without ports is not mirrored"
    );
    assert!(
        metrics.encode().contains("kind=\"unmirrorable\""),
        "the refusal is counted"
    );
    let local_system: Api<Service> = Api::namespaced(env.lc.clone(), "kube-system");
    assert!(
        local_system
            .get_opt(&service_mirror_core::mirror_name(&sys_name, &env.cluster))
            .await
            .unwrap()
            .is_none()
    );

    // Nothing was written outside the namespaces the mirror may write into.
    let lp =
        ListParams::default().labels(&format!("mirror.linkerd.io/cluster-name={}", env.cluster));
    for o in Api::<Endpoints>::all(env.lc.clone())
        .list_metadata(&lp)
        .await
        .unwrap()
        .items
    {
        let ns = o.metadata.namespace.unwrap();
        assert!(ns == env.ns || ns == long_ns, "wrote into {ns}");
    }
    w.stop(true).await.unwrap();
}

fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
    match (base, extra) {
        (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

#[tokio::test]
async fn names_that_collide_after_the_suffix_rule_are_reported_not_fought_over() {
    // "<name>-<cluster>" is not injective across links: cluster A = "k…" exporting
    // "web-z" and cluster B = "z-k…" exporting "web" both want "web-z-k…".
    let env = Env::new("collide").await;
    env.gateway("gw", 4143, &["192.0.2.1"]).await;
    let a_cluster = format!("k{}", env.cluster.replace('-', ""));
    let b_cluster = format!("z-{a_cluster}");
    env.export("web-z", "gw", &[("http", 80)]).await;
    env.export("web", "gw", &[("http", 81)]).await;
    let taken = format!("web-{b_cluster}");
    assert_eq!(service_mirror_core::mirror_name("web-z", &a_cluster), taken);
    assert_eq!(service_mirror_core::mirror_name("web", &b_cluster), taken);

    let start = |cluster: &str| {
        service_mirror_controller::link_controller::LinkController::start(
            env.lc.clone(),
            env.rc.clone(),
            service_mirror_core::Link::new(cluster, None),
            env.config(),
            LinkDeps::default(),
        )
        .unwrap()
    };
    let a = start(&a_cluster);
    let owner = eventually("one of them holds the name", || async {
        let s = env.local_services().get_opt(&taken).await.unwrap()?;
        s.metadata
            .labels
            .as_ref()?
            .get("mirror.linkerd.io/cluster-name")
            .cloned()
    })
    .await;
    assert_eq!(owner, a_cluster);
    let b = start(&b_cluster);
    let note = wait_event(&env.lc, &env.ns, &taken, "MirrorConflict").await;
    assert!(note.contains(&b_cluster), "{note}");
    let before = env
        .local_services()
        .get(&taken)
        .await
        .unwrap()
        .metadata
        .resource_version;
    // B's next retry of its key, refused again: it had its chance to write.
    Mark::now(&InProcess, Subject::link(&b_cluster, &env.ns, "web"))
        .passed()
        .await;
    let after = env.local_services().get(&taken).await.unwrap();
    assert_eq!(
        after.metadata.resource_version, before,
        "the loser never writes the winner's mirror"
    );
    assert_eq!(
        service_ports(&after),
        [(Some("http".to_string()), 80)],
        "still A's mirror"
    );
    assert!(
        b.status().failing > 0,
        "B retries (slowly) and reports, it does not give up"
    );
    b.stop(false).await.unwrap();
    a.stop(true).await.unwrap();
}
