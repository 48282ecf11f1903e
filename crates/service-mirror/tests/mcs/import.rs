//! ServiceImports and their derived Services (KEP-1645 "Importing Services"; issue 17
//! point 3) on real apiservers, in the two-cluster world of `support/mcs.rs`. Each
//! expected import is written out from the KEP and read as plain JSON, never computed
//! with the core.

use crate::support::mcs::*;
use crate::support::{create_namespace, events_on, eventually, wait_event};
use crate::{Judged, past_second_of, poke_import};
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::net::Ipv4Addr;

const BOTH: [&str; 2] = ["west", "east"];

fn cs(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

fn port(name: &str, protocol: &str, port: i64) -> (String, String, i64) {
    (name.into(), protocol.into(), port)
}

/// The import's one IP is an IPv4 address that is the ClusterIP of the derived Service
/// the import names, and that Service is ours (labels) with the import's ports.
async fn check_derived(w: &World, cluster: &str, name: &str, import: &Imported) {
    let ips = import.ips();
    assert_eq!(ips.len(), 1, "{cluster}/{name}: one IP per family: {ips:?}");
    ips[0]
        .parse::<Ipv4Addr>()
        .unwrap_or_else(|e| panic!("{cluster}/{name}: {ips:?} is no IPv4 address: {e}"));
    let derived = w.derived(cluster, name).await;
    assert_eq!(derived.len(), 1, "{cluster}/{name}: one derived Service");
    let d = &derived[0];
    assert_eq!(
        d.metadata.name,
        import.derived_name(),
        "the annotation names it"
    );
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some(ips[0].as_str()));
    assert!(spec.selector.is_none(), "selects no pod of this cluster");
    let ports: Vec<(String, String, i64)> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.protocol.clone().unwrap_or_default(),
                i64::from(p.port),
            )
        })
        .collect();
    assert_eq!(
        ports,
        import.ports(),
        "the derived Service serves the import's ports"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_exists_in_every_cluster_while_one_exports_and_goes_with_the_last() {
    let w = World::new("mcs-imp").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    // The conformance suite's Service: TCP and UDP on one number.
    let ports = serde_json::json!([
        tcp("tcp", 42),
        {"name": "udp", "port": 42, "protocol": "UDP"},
    ]);
    w.service("west", "hello", clusterip(ports.clone())).await;
    w.export("west", "hello").await;
    let want_ports = vec![port("tcp", "TCP", 42), port("udp", "UDP", 42)];
    for c in BOTH {
        let i = w
            .import_until(c, "hello", "ClusterSetIP from west", |i| {
                i.type_() == "ClusterSetIP" && !i.ips().is_empty() && i.clusters() == cs(&["west"])
            })
            .await;
        assert_eq!(i.ports(), want_ports, "{c}");
        assert!(
            !i.has_target_port(),
            "{c}: an import's ports have no targetPort"
        );
        check_derived(&w, c, "hello", &i).await;
    }
    // A second exporter: both clusters list it.
    w.service("east", "hello", clusterip(ports)).await;
    w.export("east", "hello").await;
    for c in BOTH {
        w.import_until(c, "hello", "exported by both", |i| {
            i.clusters() == cs(&["east", "west"])
        })
        .await;
    }
    // Both status writes went through the writer: counted like every local write (the
    // export's conditions in each exporting cluster, the import's clusters in each).
    for (c, r) in [("west", &west), ("east", &east)] {
        for resource in ["serviceexports/status", "serviceimports/status"] {
            let series = format!(
                "service_mirror_local_writes_total{{verb=\"patch\",resource=\"{resource}\"}} "
            );
            eventually(&format!("{c}: {series}counted"), || async {
                let text = r.metrics.encode();
                let n = text
                    .lines()
                    .find_map(|l| l.strip_prefix(&series))
                    .and_then(|v| v.trim().parse::<f64>().ok());
                n.is_some_and(|n| n >= 1.0).then_some(())
            })
            .await;
        }
    }
    // Converged: nothing is written again while nothing changes.
    let versions = || async {
        let mut v = Vec::new();
        for c in BOTH {
            let i = w.imports(c).get("hello").await.unwrap();
            v.push(i.metadata.resource_version);
            for d in w.derived(c, "hello").await {
                v.push(d.metadata.resource_version);
            }
        }
        v
    };
    let settled = versions().await;
    let writes = |r: &Running| {
        r.metrics
            .encode()
            .lines()
            .filter(|l| {
                // A link's own status writes (debounced, up to 16 s late) are not
                // MCS's.
                l.starts_with("service_mirror_mcs_import_writes_total{")
                    || (l.starts_with("service_mirror_local_writes_total{")
                        && !l.contains("links/status"))
            })
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let counted = (writes(&west), writes(&east));
    // Another writer annotates west's import: judged again, nothing to write (its
    // annotation stays; ours are all there).
    let patch = serde_json::json!({"metadata": {"annotations": {"team": "x"}}});
    let judged = Judged::mark(&w, &west, "hello");
    w.imports("west")
        .patch("hello", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    judged.passed().await;
    let mut now = versions().await;
    now[0] = settled[0].clone(); // the annotation's own write
    assert_eq!(now, settled, "an unchanged world writes nothing");
    assert_eq!(
        (writes(&west), writes(&east)),
        counted,
        "no write attempted"
    );
    let annotated = w.imports("west").get("hello").await.unwrap();
    assert_eq!(
        annotated
            .metadata
            .annotations
            .unwrap()
            .get("team")
            .map(String::as_str),
        Some("x"),
        "another writer's annotation stays"
    );
    // The first goes: the import stays, with one cluster; its IP does not change.
    let before = w.imports("west").get("hello").await.unwrap();
    w.exports("west")
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    for c in BOTH {
        w.import_until(c, "hello", "exported by east alone", |i| {
            i.clusters() == cs(&["east"])
        })
        .await;
    }
    let after = Imported::read(&w.imports("west").get("hello").await.unwrap());
    assert_eq!(
        after.ips(),
        Imported::read(&before).ips(),
        "the ClusterSetIP stays"
    );
    // The last goes: no import and no derived Service anywhere.
    w.exports("east")
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    for c in BOTH {
        w.import_gone(c, "hello").await;
    }
    west.stop().await;
    east.stop().await;
}

/// West's export of `web`, narrowed to `to` (`None`: no annotation; applied, so that
/// the first is created with it).
async fn export_to(w: &World, to: Option<&str>) {
    let mut meta = serde_json::json!({"name": "web"});
    if let Some(to) = to {
        meta["annotations"] = serde_json::json!({"service-mirror.io/export-to": to});
    }
    let body = serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
        "metadata": meta, "spec": {},
    });
    w.exports("west")
        .patch("web", &PatchParams::apply("test"), &Patch::Apply(body))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_to_narrows_the_clusters_that_import_and_withdraws_an_import_left_out() {
    let w = World::new("mcs-imp-to").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    // The cluster set as west's link sources name it: north is not in it.
    west.mcs
        .expect(["west".to_string(), "east".to_string()].into());
    w.service(
        "west",
        "web",
        clusterip(serde_json::json!([tcp("http", 80)])),
    )
    .await;
    w.service(
        "east",
        "web",
        clusterip(serde_json::json!([tcp("http", 81)])),
    )
    .await;
    // West exports to north only; east to every cluster, another port.
    export_to(&w, Some("north")).await;
    w.export("east", "web").await;
    // The conditions merge every export (east's judged knowing west's)...
    for c in BOTH {
        w.until(c, "web", &in_conflict("PortConflict")).await;
    }
    // ... the imports only those that reach them: east's its own alone, judged since.
    w.import_until("west", "web", "both", |i| {
        i.clusters() == cs(&["east", "west"])
    })
    .await;
    w.import_until("east", "web", "its own", |i| !i.clusters().is_empty())
        .await;
    poke_import(&w, &east, "east", "web").await;
    let i = Imported::read(&w.imports("east").get("web").await.unwrap());
    assert_eq!(
        i.clusters(),
        cs(&["east"]),
        "west's export does not reach east"
    );
    assert_eq!(i.ports(), vec![port("http", "TCP", 81)]);
    wait_event(&w.west, &w.ns, "web", "ExportToUnknownCluster").await;
    // East stops exporting: nothing reaches it, its import goes; west's stays.
    w.exports("east")
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    w.import_gone("east", "web").await;
    w.import_until("west", "web", "west's own", |i| {
        i.clusters() == cs(&["west"])
    })
    .await;
    // East added: it imports.
    export_to(&w, Some(" north , east,")).await;
    let i = w
        .import_until("east", "web", "from west", |i| {
            i.clusters() == cs(&["west"]) && !i.ips().is_empty()
        })
        .await;
    check_derived(&w, "east", "web", &i).await;
    // East dropped again: withdrawn there (import and derived Service); west's stays.
    export_to(&w, Some("north")).await;
    w.import_gone("east", "web").await;
    let i = w
        .import_until("west", "web", "west's own", |i| {
            i.clusters() == cs(&["west"])
        })
        .await;
    check_derived(&w, "west", "web", &i).await;
    // Back to every cluster, then an invalid name: east's import goes, even though the
    // list names east (never wider than asked), and west says why.
    export_to(&w, None).await;
    w.import_until("east", "web", "from west", |i| {
        i.clusters() == cs(&["west"])
    })
    .await;
    export_to(&w, Some("east,Bad_Name")).await;
    w.import_gone("east", "web").await;
    let note = wait_event(&w.west, &w.ns, "web", "InvalidExportTo").await;
    assert!(note.contains("Bad_Name"), "{note}");
    west.metric("service_mirror_mcs_export_to_problems_total{reason=\"InvalidExportTo\"} 1\n")
        .await;
    // West's --cluster-priority names `nowhere`, which no link source names.
    west.metric("service_mirror_mcs_priority_unknown_clusters 1\n")
        .await;
    west.metric(
        "service_mirror_mcs_export_to_problems_total{reason=\"ExportToUnknownCluster\"} 1\n",
    )
    .await;
    w.import_until("west", "web", "west's own", |i| {
        i.clusters() == cs(&["west"])
    })
    .await;
    // Its conditions describe the name across the cluster set: unchanged.
    w.until("west", "web", &exported()).await;
    assert!(
        w.imports("east").get_opt("web").await.unwrap().is_none(),
        "nothing came back to east"
    );

    // Bad traffic annotations (issue 32's bad input): each told once (a Warning Event
    // naming the value, the counter), the default minimum holds, nothing else changes:
    // without export-to, east imports west's export again.
    let annotate = |minimum: &str| {
        let body = serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
            "metadata": {"name": "web", "annotations": {
                "service-mirror.io/local-minimum": minimum}},
            "spec": {},
        });
        let exports = w.exports("west");
        async move {
            exports
                .patch("web", &PatchParams::apply("test"), &Patch::Apply(body))
                .await
                .unwrap();
        }
    };
    annotate("-1").await;
    let note = wait_event(&w.west, &w.ns, "web", "InvalidTrafficAnnotation").await;
    assert!(note.contains("\"-1\""), "{note}");
    west.metric(
        "service_mirror_mcs_traffic_problems_total{reason=\"InvalidTrafficAnnotation\"} 1\n",
    )
    .await;
    annotate("1000000000").await;
    eventually("a second Event, naming 10^9", || async {
        events_on(&w.west, &w.ns, "web")
            .await
            .into_iter()
            .any(|(r, n)| r == "InvalidTrafficAnnotation" && n.contains("1000000000"))
            .then_some(())
    })
    .await;
    west.metric(
        "service_mirror_mcs_traffic_problems_total{reason=\"InvalidTrafficAnnotation\"} 2\n",
    )
    .await;
    w.import_until("east", "web", "west's again", |i| {
        i.clusters() == cs(&["west"])
    })
    .await;
    w.until("west", "web", &exported()).await;
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_traffic_policy_distribution_and_exported_labels_are_imported_and_the_derived_service_is_never_node_local()
 {
    let w = World::new("mcs-imp-affinity").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    w.service(
        "west",
        "sticky",
        serde_json::json!({
            "selector": {"app": "x"},
            "ports": [tcp("http", 80)],
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 300}},
            "internalTrafficPolicy": "Local",
            "trafficDistribution": "PreferClose",
        }),
    )
    .await;
    w.export_with(
        "west",
        "sticky",
        serde_json::json!({
            "exportedLabels": {"team": "shop"},
            "exportedAnnotations": {"owner": "ann"},
        }),
    )
    .await;
    for c in BOTH {
        let i = w
            .import_until(c, "sticky", "imported", |i| !i.ips().is_empty())
            .await;
        let meta = &i.object.metadata;
        assert_eq!(
            meta.labels.as_ref().unwrap()["team"],
            "shop",
            "{c}: exportedLabels"
        );
        assert_eq!(
            meta.annotations.as_ref().unwrap()["owner"],
            "ann",
            "{c}: exportedAnnotations"
        );
        let spec = i.spec();
        assert_eq!(spec["sessionAffinity"], "ClientIP", "{c}");
        assert_eq!(
            spec["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"],
            300
        );
        assert_eq!(spec["internalTrafficPolicy"], "Local");
        assert_eq!(spec["trafficDistribution"], "PreferClose");
        assert_eq!(spec["ipFamilies"], serde_json::json!(["IPv4"]));
        let d = w.derived(c, "sticky").await.remove(0);
        let ds = d.spec.unwrap();
        assert_eq!(ds.session_affinity.as_deref(), Some("ClientIP"));
        assert_eq!(
            ds.session_affinity_config
                .and_then(|a| a.client_ip)
                .and_then(|c| c.timeout_seconds),
            Some(300)
        );
        // The import's `Local` is cluster-local (no remote's slice is ready:
        // core::traffic); node-local on the derived Service would drop traffic on every
        // node without an endpoint of it.
        assert_eq!(ds.internal_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(ds.traffic_distribution.as_deref(), Some("PreferClose"));
    }
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_imports_have_no_ips_external_name_imports_nothing_and_mixed_headlessness_is_clusterset_ip()
 {
    let w = World::new("mcs-imp-types").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    let headless = serde_json::json!({"clusterIP": "None", "selector": {"app": "x"}, "ports": [tcp("db", 5432)]});
    w.service("west", "db", headless.clone()).await;
    w.export("west", "db").await;
    w.service(
        "west",
        "outside",
        serde_json::json!({"type": "ExternalName", "externalName": "example.invalid"}),
    )
    .await;
    w.export("west", "outside").await;
    // Oldest (west) not headless, newer (east) headless: ClusterSetIP.
    w.service(
        "west",
        "mixed",
        clusterip(serde_json::json!([tcp("db", 5432)])),
    )
    .await;
    w.export("west", "mixed").await;
    w.until("west", "mixed", &exported()).await;
    // creationTimestamp has whole seconds (a tie goes to the first cluster name, east).
    past_second_of(&created(&w, "west", "mixed").await).await;
    w.service("east", "mixed", headless).await;
    w.export("east", "mixed").await;
    for c in BOTH {
        let i = w
            .import_until(c, "db", "Headless", |i| i.type_() == "Headless")
            .await;
        assert!(i.ips().is_empty(), "{c}: a headless import has no ips");
        let derived = w.derived(c, "db").await;
        assert_eq!(
            derived[0].spec.as_ref().unwrap().cluster_ip.as_deref(),
            Some("None"),
            "{c}: the derived Service is headless"
        );
        let i = w
            .import_until(c, "mixed", "ClusterSetIP from both", |i| {
                i.clusters() == cs(&["east", "west"])
            })
            .await;
        assert_eq!(i.type_(), "ClusterSetIP", "{c}: the oldest export's type");
        check_derived(&w, c, "mixed", &i).await;
        w.until(c, "mixed", &in_conflict("TypeConflict")).await;
    }
    w.until("west", "outside", &invalid("InvalidServiceType"))
        .await;
    for c in BOTH {
        assert!(
            w.imports(c).get_opt("outside").await.unwrap().is_none(),
            "{c}: an ExternalName export imports nothing"
        );
    }
    // The oldest export (west's ClusterIP) goes: east's headless one decides, and the
    // derived Service is made again headless (a ClusterIP cannot change in place),
    // under the same import.
    let mut kept = Vec::new();
    for c in BOTH {
        let import = w.imports(c).get("mixed").await.unwrap();
        let derived = w.derived(c, "mixed").await.remove(0);
        kept.push((c, import.metadata.uid, derived.metadata.uid));
    }
    w.exports("west")
        .delete("mixed", &DeleteParams::default())
        .await
        .unwrap();
    for (c, import_uid, derived_uid) in kept {
        let i = w
            .import_until(c, "mixed", "Headless from east alone", |i| {
                i.type_() == "Headless" && i.clusters() == cs(&["east"])
            })
            .await;
        assert!(i.ips().is_empty(), "{c}");
        assert_eq!(i.object.metadata.uid, import_uid, "{c}: the same import");
        let derived = eventually(&format!("{c}: the derived Service headless"), || async {
            let d = w.derived(c, "mixed").await.pop()?;
            (d.spec.as_ref()?.cluster_ip.as_deref() == Some("None")).then_some(d)
        })
        .await;
        assert_ne!(derived.metadata.uid, derived_uid, "{c}: made again");
    }
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_ports_import_the_union_with_the_oldest_exports_numbers() {
    let w = World::new("mcs-imp-ports").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    w.serve("west", "hello", 80).await;
    w.export("west", "hello").await;
    w.until("west", "hello", &exported()).await;
    // creationTimestamp has whole seconds (a tie goes to the first cluster name, east).
    past_second_of(&created(&w, "west", "hello").await).await;
    // Newer: the same name on another number, and an SCTP port.
    w.service(
        "east",
        "hello",
        clusterip(serde_json::json!([
            tcp("http", 8080),
            {"name": "sctp", "port": 9000, "protocol": "SCTP"},
        ])),
    )
    .await;
    w.export("east", "hello").await;
    for c in BOTH {
        w.until(c, "hello", &in_conflict("PortConflict")).await;
        let i = w
            .import_until(c, "hello", "the union", |i| i.ports().len() == 2)
            .await;
        assert_eq!(
            i.ports(),
            vec![port("http", "TCP", 80), port("sctp", "SCTP", 9000)],
            "{c}: http keeps the oldest export's number"
        );
        check_derived(&w, c, "hello", &i).await;
    }
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_service_import_is_never_touched_and_is_reported() {
    let w = World::new("mcs-imp-foreign").await;
    let theirs: serde_json::Value = serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
        "metadata": {"name": "hello", "labels": {"team": "other"}},
        "spec": {"type": "ClusterSetIP", "ports": [{"port": 1, "protocol": "TCP"}]},
    });
    let theirs: kube::api::DynamicObject = serde_json::from_value(theirs).unwrap();
    let created = w
        .imports("east")
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    let (west, east) = (w.start("west", None), w.start("east", None));
    w.serve("west", "hello", 80).await;
    w.export("west", "hello").await;
    w.import_until("west", "hello", "imported where none was", |i| {
        !i.ips().is_empty()
    })
    .await;
    eventually("ImportOwnedByAnother on east's import", || async {
        w.our_events("east", "hello")
            .await
            .contains(&"ImportOwnedByAnother".to_string())
            .then_some(())
    })
    .await;
    east.metric(
        r#"service_mirror_mcs_import_writes_total{kind="service_import",outcome="foreign"}"#,
    )
    .await;
    assert!(
        w.derived("east", "hello").await.is_empty(),
        "no derived Service for a name not imported here"
    );
    // The export goes: west's import goes, east's foreign one stays as it was (east
    // judged the name again: west's export left its merge).
    let judged = Judged::mark(&w, &east, "hello");
    w.exports("west")
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    w.import_gone("west", "hello").await;
    judged.passed().await;
    let now = w.imports("east").get("hello").await.unwrap();
    assert_eq!(
        now.metadata.resource_version, created.metadata.resource_version,
        "the foreign import was never written"
    );
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_namespace_is_not_created_and_the_import_comes_once_it_exists() {
    let w = World::new("mcs-imp-ns").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    let only = w.west_only();
    create_namespace(&w.west, &only).await;
    let exports = w.exports_in("west", &only);
    let svcs: Api<Service> = Api::namespaced(w.west.clone(), &only);
    svcs.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "metadata": {"name": "hello"},
            "spec": {"selector": {"app": "x"}, "ports": [{"name": "http", "port": 80}]},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    exports
        .patch(
            "hello",
            &PatchParams::apply("test"),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
                "metadata": {"name": "hello"},
            })),
        )
        .await
        .unwrap();
    let west_imports = w.imports_in("west", &only);
    eventually("west imports it", || async {
        west_imports.get_opt("hello").await.unwrap()
    })
    .await;
    east.metric(
        r#"service_mirror_mcs_import_writes_total{kind="derived_service",outcome="no_namespace"}"#,
    )
    .await;
    let namespaces: Api<Namespace> = Api::all(w.east.clone());
    assert!(
        namespaces.get_opt(&only).await.unwrap().is_none(),
        "east's namespace was not created"
    );
    create_namespace(&w.east, &only).await;
    let east_imports = w.imports_in("east", &only);
    eventually("east imports it once the namespace exists", || async {
        east_imports.get_opt("hello").await.unwrap()
    })
    .await;
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_holding_the_derived_name_is_never_touched_and_the_import_has_no_ips() {
    let w = World::new("mcs-imp-taken").await;
    let west = w.start("west", None);
    w.serve("west", "hello", 80).await;
    w.export("west", "hello").await;
    let i = w
        .import_until("west", "hello", "imported in west", |i| !i.ips().is_empty())
        .await;
    // The same namespace/name derives the same name in east: someone's Service has it.
    let name = i
        .derived_name()
        .expect("the import names its derived Service");
    let api: Api<Service> = Api::namespaced(w.east.clone(), &w.ns);
    let theirs: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"team": "other"}},
        "spec": {"selector": {"app": "theirs"}, "ports": [{"name": "x", "port": 1}]},
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &theirs).await.unwrap();
    let east = w.start("east", None);
    let i = w
        .import_until("east", "hello", "imported in east", |i| {
            i.clusters() == cs(&["west"])
        })
        .await;
    assert!(i.ips().is_empty(), "no ClusterSetIP from another's Service");
    eventually("DerivedServiceNameTaken on the Service", || async {
        w.our_events("east", &name)
            .await
            .contains(&"DerivedServiceNameTaken".to_string())
            .then_some(())
    })
    .await;
    east.metric(
        r#"service_mirror_mcs_import_writes_total{kind="derived_service",outcome="foreign"}"#,
    )
    .await;
    // The export goes: east's import goes, the Service stays as it was (east's
    // reconcile that deleted the import has ended, and another after it: the import's
    // own delete event queues the name).
    let judged = Judged::mark(&w, &east, "hello");
    w.exports("west")
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    eventually("east's import gone", || async {
        w.imports("east")
            .get_opt("hello")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    judged.passed_more_than(1).await;
    let now = api.get(&name).await.unwrap();
    assert_eq!(
        now.metadata.resource_version, created.metadata.resource_version,
        "the Service holding the name was never written"
    );
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_remote_only_imports_until_their_cluster_is_known_gone() {
    let w = World::new("mcs-imp-restart").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    w.serve("east", "hello", 80).await;
    w.export("east", "hello").await;
    let before = w
        .import_until("west", "hello", "imported from east", |i| {
            i.clusters() == cs(&["east"]) && !i.ips().is_empty()
        })
        .await;
    west.stop().await;
    // Restarted with its link not running yet: west sees no export of hello at all.
    let west = w.start_unlinked("west", None);
    west.metric("service_mirror_mcs_clusters_listed 1").await;
    // West judges the name with its lists in and east unknown.
    poke_import(&w, &west, "west", "hello").await;
    let same = |what: &str, now: Option<kube::api::DynamicObject>| {
        let now = now.unwrap_or_else(|| panic!("{what}: the import was deleted"));
        assert_eq!(now.metadata.uid, before.object.metadata.uid, "{what}");
        assert_eq!(Imported::read(&now).ips(), before.ips(), "{what}");
    };
    same(
        "before the links",
        w.imports("west").get_opt("hello").await.unwrap(),
    );
    // The link sources are listed and name east: its link is coming, still kept (the
    // expectation queues every import: judged again).
    let judged = Judged::mark(&w, &west, "hello");
    west.mcs.expect(["east".to_string()].into());
    judged.passed().await;
    same(
        "east named",
        w.imports("west").get_opt("hello").await.unwrap(),
    );
    // East's link is removed for good: the import goes with its derived Service.
    west.mcs.link_removed("east");
    w.import_gone("west", "hello").await;
    west.stop().await;
    east.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_export_seen_later_takes_over_the_import_and_both_exports_conflict() {
    let w = World::new("mcs-imp-older").await;
    // East exports first (the older export); west does not see east yet.
    let east = w.start("east", None);
    w.serve("east", "hello", 8080).await;
    w.export("east", "hello").await;
    w.until("east", "hello", &exported()).await;
    // creationTimestamp has whole seconds.
    past_second_of(&created(&w, "east", "hello").await).await;
    let west = w.start_unlinked("west", None);
    w.serve("west", "hello", 80).await;
    w.export("west", "hello").await;
    let first = w
        .import_until("west", "hello", "west's own export alone", |i| {
            i.clusters() == cs(&["west"])
        })
        .await;
    assert_eq!(first.ports(), vec![port("http", "TCP", 80)]);
    // West's link to east starts: east's older export wins the port, in both clusters.
    let tasks = west.mcs.link("east", &w.east, &west.link);
    for c in BOTH {
        w.import_until(c, "hello", "the older export's port", |i| {
            i.clusters() == cs(&["east", "west"]) && i.ports() == vec![port("http", "TCP", 8080)]
        })
        .await;
        w.until(c, "hello", &in_conflict("PortConflict")).await;
    }
    west.stop().await;
    east.stop().await;
    for t in tasks {
        let _ = t.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_whose_exporter_stopped_while_down_goes_once_that_cluster_lists() {
    let w = World::new("mcs-imp-down").await;
    let (west, east) = (w.start("west", None), w.start("east", None));
    w.serve("east", "hello", 80).await;
    w.export("east", "hello").await;
    w.import_until("west", "hello", "imported from east", |i| {
        i.clusters() == cs(&["east"])
    })
    .await;
    west.stop().await;
    // While west's controller is down, east stops exporting.
    w.exports("east")
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    w.import_gone("east", "hello").await;
    // West comes back; its link to east is not running yet: the import is kept.
    let west = w.start_unlinked("west", None);
    west.metric("service_mirror_mcs_clusters_listed 1").await;
    // West judges the name with its lists in and east unknown.
    poke_import(&w, &west, "west", "hello").await;
    assert!(
        w.imports("west").get_opt("hello").await.unwrap().is_some(),
        "kept while east is unknown"
    );
    // East's lists come in without the export: the import goes (its own list names
    // no key of it).
    let tasks = west.mcs.link("east", &w.east, &west.link);
    w.import_gone("west", "hello").await;
    west.stop().await;
    east.stop().await;
    for t in tasks {
        let _ = t.await;
    }
}

/// The creationTimestamp of `cluster`'s ServiceExport `name`.
async fn created(
    w: &World,
    cluster: &str,
    name: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    w.exports(cluster)
        .get(name)
        .await
        .unwrap()
        .metadata
        .creation_timestamp
        .expect("a creationTimestamp")
}
