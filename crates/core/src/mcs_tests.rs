//! Cases from KEP-1645's conflict rules and the Required specs of the mcs-api
//! conformance suite (`conformance/service_import.go`), written from them.

use super::*;
use k8s_openapi::api::core::v1::{ClientIPConfig, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A port `name/protocol/number`.
fn port(name: &str, protocol: &str, number: i32) -> ServicePort {
    ServicePort {
        name: (!name.is_empty()).then(|| name.into()),
        protocol: Some(protocol.into()),
        port: number,
        ..Default::default()
    }
}

fn ip(name: &str, protocol: &str, number: i32) -> ImportPort {
    ImportPort {
        name: name.into(),
        protocol: protocol.into(),
        port: number,
        app_protocol: None,
    }
}

/// The suite's `hello` Service: tcp/42 and udp/42, ClientIP affinity for 10 s.
fn hello() -> Service {
    Service {
        spec: Some(ServiceSpec {
            cluster_ip: Some("10.96.0.10".into()),
            ports: Some(vec![port("tcp", "TCP", 42), port("udp", "UDP", 42)]),
            session_affinity: Some("ClientIP".into()),
            session_affinity_config: Some(SessionAffinityConfig {
                client_ip: Some(ClientIPConfig {
                    timeout_seconds: Some(10),
                }),
            }),
            ip_families: Some(vec!["IPv4".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn with(mut s: Service, f: impl FnOnce(&mut ServiceSpec)) -> Service {
    f(s.spec.get_or_insert_with(Default::default));
    s
}

fn export(cluster: &str, created: i64, service: Option<Service>) -> ClusterExport {
    ClusterExport {
        cluster: cluster.into(),
        created: Timestamp::from_second(created).unwrap(),
        exported_labels: BTreeMap::new(),
        exported_annotations: BTreeMap::new(),
        service,
        export_to: ExportTo::Every,
    }
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect()
}

fn reasons(m: &Merge) -> String {
    conflict_reason(&m.conflicts)
}

#[test]
fn validity_follows_the_service() {
    let cases = [
        (None, Validity::NoService, false, "NoService"),
        (Some(hello()), Validity::Valid, true, "Valid"),
        (
            Some(with(hello(), |s| s.cluster_ip = Some("None".into()))),
            Validity::Valid,
            true,
            "Valid",
        ),
        (
            Some(with(hello(), |s| s.type_ = Some("LoadBalancer".into()))),
            Validity::Valid,
            true,
            "Valid",
        ),
        (
            Some(with(hello(), |s| {
                s.type_ = Some("ExternalName".into());
                s.external_name = Some("example.com".into());
            })),
            Validity::InvalidServiceType,
            false,
            "InvalidServiceType",
        ),
    ];
    for (service, want, valid, reason) in cases {
        let v = Validity::of(&export("a", 1, service));
        assert_eq!(v, want);
        assert_eq!(v.is_valid(), valid);
        assert_eq!(v.reason(), reason);
    }
}

#[test]
fn one_clusterip_export_imports_its_properties_without_conflict() {
    let svc = with(hello(), |s| {
        s.internal_traffic_policy = Some("Cluster".into());
        s.traffic_distribution = Some("PreferClose".into());
    });
    let mut e = export("east", 10, Some(svc));
    e.exported_labels = map(&[("dummy-label", "true")]);
    e.exported_annotations = map(&[("dummy-annotation", "true")]);
    let m = merge(&[e]);
    let import = m.import.as_ref().expect("an import");
    assert_eq!(import.type_, ImportType::ClusterSetIp);
    assert_eq!(import.type_.as_str(), "ClusterSetIP");
    // Ports equal the Service's, TCP and UDP on one number, without targetPort.
    assert_eq!(import.ports, [ip("tcp", "TCP", 42), ip("udp", "UDP", 42)]);
    assert_eq!(import.session_affinity.as_deref(), Some("ClientIP"));
    assert_eq!(
        import.session_affinity_config,
        hello().spec.unwrap().session_affinity_config
    );
    assert_eq!(import.internal_traffic_policy.as_deref(), Some("Cluster"));
    assert_eq!(import.traffic_distribution.as_deref(), Some("PreferClose"));
    assert_eq!(import.ip_families, ["IPv4"]);
    // Only what the export lists as exported is carried, not the Service's own.
    assert_eq!(import.labels, map(&[("dummy-label", "true")]));
    assert_eq!(import.annotations, map(&[("dummy-annotation", "true")]));
    assert_eq!(m.clusters, ["east"]);
    assert_eq!(reasons(&m), "NoConflicts");
}

#[test]
fn no_valid_export_means_no_import() {
    let external = with(hello(), |s| s.type_ = Some("ExternalName".into()));
    for exports in [
        vec![],
        vec![export("east", 1, None)],
        vec![export("east", 1, Some(external.clone()))],
        vec![export("east", 1, None), export("west", 2, Some(external))],
    ] {
        let m = merge(&exports);
        assert_eq!(m.import, None, "{exports:?}");
        assert!(m.clusters.is_empty());
        assert!(m.conflicts.is_empty());
    }
}

#[test]
fn the_import_lives_while_one_cluster_exports() {
    let both = merge(&[
        export("east", 1, Some(hello())),
        export("west", 2, Some(hello())),
    ]);
    assert_eq!(both.clusters, ["east", "west"]);
    assert_eq!(reasons(&both), "NoConflicts");
    // The first exporter leaves: the second keeps the import, unchanged.
    let west = merge(&[export("west", 2, Some(hello()))]);
    assert_eq!(west.import, both.import);
    assert_eq!(west.clusters, ["west"]);
    // An export whose Service went (NoService) does not count.
    let gone = merge(&[export("east", 1, None), export("west", 2, Some(hello()))]);
    assert_eq!(gone.clusters, ["west"]);
}

#[test]
fn headless_imports_as_headless() {
    let headless = with(hello(), |s| s.cluster_ip = Some("None".into()));
    let m = merge(&[export("east", 1, Some(headless))]);
    assert_eq!(m.import.as_ref().unwrap().type_, ImportType::Headless);
    assert_eq!(ImportType::Headless.as_str(), "Headless");
}

#[test]
fn a_port_union_with_an_sctp_port_raises_port_conflict() {
    // conformance: the second cluster exports tcp/42 and stcp sctp/142.
    let second = with(hello(), |s| {
        s.ports = Some(vec![port("tcp", "TCP", 42), port("stcp", "SCTP", 142)]);
    });
    let m = merge(&[
        export("east", 1, Some(hello())),
        export("west", 2, Some(second)),
    ]);
    assert_eq!(
        m.import.as_ref().unwrap().ports,
        [
            ip("tcp", "TCP", 42),
            ip("udp", "UDP", 42),
            ip("stcp", "SCTP", 142)
        ]
    );
    assert_eq!(reasons(&m), "PortConflict");
}

#[test]
fn conflicting_port_numbers_resolve_to_the_oldest_export() {
    // conformance: the second cluster exports only "tcp", on 43.
    let second = with(hello(), |s| s.ports = Some(vec![port("tcp", "TCP", 43)]));
    for order in [[0, 1], [1, 0]] {
        let exports = [
            export("east", 1, Some(hello())),
            export("west", 2, Some(second.clone())),
        ];
        let m = merge(&[exports[order[0]].clone(), exports[order[1]].clone()]);
        assert_eq!(
            m.import.as_ref().unwrap().ports,
            [ip("tcp", "TCP", 42), ip("udp", "UDP", 42)],
            "order {order:?}"
        );
        assert_eq!(reasons(&m), "PortConflict");
    }
    // The newer export is the older one now: its number wins.
    let m = merge(&[
        export("east", 5, Some(hello())),
        export("west", 2, Some(second)),
    ]);
    assert_eq!(
        m.import.as_ref().unwrap().ports,
        [ip("tcp", "TCP", 43), ip("udp", "UDP", 42)]
    );
}

#[test]
fn a_protocol_and_number_under_two_names_is_left_out() {
    let second = with(hello(), |s| {
        s.ports = Some(vec![
            port("tcp", "TCP", 42),
            port("udp", "UDP", 42),
            port("web", "TCP", 42),
        ]);
    });
    let m = merge(&[
        export("east", 1, Some(hello())),
        export("west", 2, Some(second)),
    ]);
    assert_eq!(
        m.import.as_ref().unwrap().ports,
        [ip("tcp", "TCP", 42), ip("udp", "UDP", 42)]
    );
    assert_eq!(reasons(&m), "PortConflict");
}

#[test]
fn an_unnamed_port_and_a_default_protocol_compare_as_the_api_stores_them() {
    let one = |protocol: Option<&str>| {
        with(hello(), |s| {
            s.ports = Some(vec![ServicePort {
                protocol: protocol.map(Into::into),
                ..port("", "TCP", 80)
            }]);
        })
    };
    let m = merge(&[
        export("east", 1, Some(one(None))),
        export("west", 2, Some(one(Some("TCP")))),
    ]);
    assert_eq!(m.import.as_ref().unwrap().ports, [ip("", "TCP", 80)]);
    assert_eq!(reasons(&m), "NoConflicts");
}

#[test]
fn conflicting_headlessness_imports_the_oldest_type_with_type_conflict() {
    // conformance: the first cluster exports a ClusterIP Service, the second a
    // headless one.
    let headless = with(hello(), |s| s.cluster_ip = Some("None".into()));
    let m = merge(&[
        export("east", 1, Some(hello())),
        export("west", 2, Some(headless.clone())),
    ]);
    assert_eq!(m.import.as_ref().unwrap().type_, ImportType::ClusterSetIp);
    assert_eq!(reasons(&m), "TypeConflict");
    let m = merge(&[
        export("east", 3, Some(hello())),
        export("west", 2, Some(headless)),
    ]);
    assert_eq!(m.import.as_ref().unwrap().type_, ImportType::Headless);
}

#[test]
fn each_differing_property_raises_its_own_conflict_and_the_oldest_wins() {
    type Edit = fn(&mut ServiceSpec);
    let cases: [(Edit, &str); 6] = [
        (
            |s| s.session_affinity = Some("None".into()),
            "SessionAffinityConflict",
        ),
        (
            |s| {
                s.session_affinity_config = Some(SessionAffinityConfig {
                    client_ip: Some(ClientIPConfig {
                        timeout_seconds: Some(20),
                    }),
                })
            },
            "SessionAffinityConfigConflict",
        ),
        (
            |s| s.internal_traffic_policy = Some("Local".into()),
            "InternalTrafficPolicyConflict",
        ),
        (
            |s| s.traffic_distribution = Some("PreferClose".into()),
            "TrafficDistributionConflict",
        ),
        (
            |s| s.ip_families = Some(vec!["IPv6".into()]),
            "IPFamilyConflict",
        ),
        (
            |s| s.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]),
            "IPFamilyConflict",
        ),
    ];
    for (edit, reason) in cases {
        let newer = with(hello(), edit);
        let m = merge(&[
            export("east", 1, Some(hello())),
            export("west", 2, Some(newer)),
        ]);
        assert_eq!(reasons(&m), reason);
        let import = m.import.as_ref().unwrap();
        let oldest = hello().spec.unwrap();
        assert_eq!(import.session_affinity, oldest.session_affinity, "{reason}");
        assert_eq!(
            import.session_affinity_config,
            oldest.session_affinity_config
        );
        assert_eq!(import.internal_traffic_policy, None, "{reason}");
        assert_eq!(import.traffic_distribution, None, "{reason}");
        assert_eq!(import.ip_families, ["IPv4"], "{reason}");
    }
}

#[test]
fn a_left_out_internal_traffic_policy_equals_cluster() {
    let unset = with(hello(), |s| s.internal_traffic_policy = None);
    let cluster = with(hello(), |s| {
        s.internal_traffic_policy = Some("Cluster".into())
    });
    let m = merge(&[
        export("east", 1, Some(unset)),
        export("west", 2, Some(cluster)),
    ]);
    assert_eq!(reasons(&m), "NoConflicts");
}

#[test]
fn the_same_port_name_with_another_app_protocol_conflicts() {
    let h2c = with(hello(), |s| {
        s.ports = Some(vec![
            ServicePort {
                app_protocol: Some("kubernetes.io/h2c".into()),
                ..port("tcp", "TCP", 42)
            },
            port("udp", "UDP", 42),
        ]);
    });
    let m = merge(&[
        export("east", 1, Some(hello())),
        export("west", 2, Some(h2c)),
    ]);
    assert_eq!(reasons(&m), "PortConflict");
    assert_eq!(
        m.import.as_ref().unwrap().ports,
        [ip("tcp", "TCP", 42), ip("udp", "UDP", 42)]
    );
}

#[test]
fn a_left_out_session_affinity_equals_none() {
    let unset = with(hello(), |s| {
        s.session_affinity = None;
        s.session_affinity_config = None;
    });
    let none = with(unset.clone(), |s| s.session_affinity = Some("None".into()));
    let m = merge(&[
        export("east", 1, Some(unset)),
        export("west", 2, Some(none)),
    ]);
    assert_eq!(reasons(&m), "NoConflicts");
}

#[test]
fn conflicting_exported_labels_and_annotations_keep_the_oldest() {
    // conformance (optional spec): dummy-label/annotation on the first export,
    // dummy-label2/annotation2 on the second.
    let mut first = export("east", 1, Some(hello()));
    first.exported_labels = map(&[("dummy-label", "true")]);
    first.exported_annotations = map(&[("dummy-annotation", "true")]);
    let mut second = export("west", 2, Some(hello()));
    second.exported_labels = map(&[("dummy-label2", "true")]);
    second.exported_annotations = map(&[("dummy-annotation2", "true")]);
    let m = merge(&[second, first]);
    assert_eq!(reasons(&m), "LabelsConflict,AnnotationsConflict");
    let import = m.import.as_ref().unwrap();
    assert_eq!(import.labels, map(&[("dummy-label", "true")]));
    assert_eq!(import.annotations, map(&[("dummy-annotation", "true")]));
}

#[test]
fn several_conflicts_join_in_a_fixed_order() {
    let newer = with(hello(), |s| {
        s.cluster_ip = Some("None".into());
        s.ports = Some(vec![port("tcp", "TCP", 43)]);
        s.traffic_distribution = Some("PreferClose".into());
    });
    let m = merge(&[
        export("west", 2, Some(newer)),
        export("east", 1, Some(hello())),
    ]);
    assert_eq!(
        reasons(&m),
        "PortConflict,TypeConflict,TrafficDistributionConflict"
    );
}

#[test]
fn equal_inputs_in_any_order_give_one_answer_and_ties_go_by_cluster_name() {
    let newer = with(hello(), |s| s.ports = Some(vec![port("tcp", "TCP", 43)]));
    // Exported in the same second: "east" < "west" decides, on every cluster.
    let a = export("west", 7, Some(newer));
    let b = export("east", 7, Some(hello()));
    let c = export("north", 9, Some(hello()));
    let one = merge(&[a.clone(), b.clone(), c.clone()]);
    for exports in [
        [b.clone(), a.clone(), c.clone()],
        [c.clone(), b.clone(), a.clone()],
        [a.clone(), c.clone(), b.clone()],
    ] {
        assert_eq!(merge(&exports), one);
    }
    assert_eq!(one.clusters, ["east", "north", "west"]);
    assert_eq!(one.import.as_ref().unwrap().ports[0], ip("tcp", "TCP", 42));
}

#[test]
fn invalid_exports_neither_win_nor_conflict() {
    // An older ExternalName export and an older export without a Service take no part.
    let external = with(hello(), |s| {
        s.type_ = Some("ExternalName".into());
        s.ports = Some(vec![port("tcp", "TCP", 99)]);
    });
    let m = merge(&[
        export("east", 1, Some(external)),
        export("north", 1, None),
        export("west", 5, Some(hello())),
    ]);
    assert_eq!(m.clusters, ["west"]);
    assert_eq!(reasons(&m), "NoConflicts");
    assert_eq!(
        m.import.as_ref().unwrap().ports,
        [ip("tcp", "TCP", 42), ip("udp", "UDP", 42)]
    );
}

#[test]
fn import_ports_drop_target_and_node_ports_and_keep_app_protocol() {
    let svc = with(hello(), |s| {
        s.ports = Some(vec![ServicePort {
            app_protocol: Some("kubernetes.io/h2c".into()),
            target_port: Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8080)),
            node_port: Some(30080),
            ..port("web", "TCP", 80)
        }]);
    });
    assert_eq!(
        import_ports(&svc),
        [ImportPort {
            app_protocol: Some("kubernetes.io/h2c".into()),
            ..ip("web", "TCP", 80)
        }]
    );
}

fn condition(m: &[ExportCondition], type_: &str) -> (bool, String) {
    let c = m.iter().find(|c| c.type_ == type_).expect(type_);
    (c.status, c.reason.clone())
}

#[test]
fn a_valid_export_is_valid_ready_and_says_whether_it_conflicts() {
    let m = merge(&[export("east", 1, Some(hello()))]);
    let c = export_conditions(Validity::Valid, &m);
    assert_eq!(condition(&c, "Valid"), (true, "Valid".into()));
    assert_eq!(condition(&c, "Ready"), (true, "Exported".into()));
    assert_eq!(condition(&c, "Conflict"), (false, "NoConflicts".into()));
    let second = with(hello(), |s| s.ports = Some(vec![port("tcp", "TCP", 43)]));
    let m = merge(&[
        export("east", 1, Some(hello())),
        export("west", 2, Some(second)),
    ]);
    // The conditions depend on the merge alone: the older export and the newer one
    // carry the same Conflict.
    let c = export_conditions(Validity::Valid, &m);
    assert_eq!(condition(&c, "Conflict"), (true, "PortConflict".into()));
    assert_eq!(condition(&c, "Ready"), (true, "Exported".into()));
}

#[test]
fn an_invalid_export_is_neither_valid_nor_ready_and_has_no_conflict_condition() {
    for (validity, reason) in [
        (Validity::NoService, "NoService"),
        (Validity::InvalidServiceType, "InvalidServiceType"),
    ] {
        let c = export_conditions(validity, &merge(&[]));
        assert_eq!(condition(&c, "Valid"), (false, reason.into()));
        assert_eq!(condition(&c, "Ready"), (false, "Failed".into()));
        assert!(c.iter().all(|c| c.type_ != "Conflict"), "{c:?}");
    }
}

#[test]
fn transition_times_move_only_with_the_status_and_an_unchanged_status_writes_nothing() {
    let t = |s: i64| Timestamp::from_second(s).unwrap();
    let m = merge(&[export("east", 1, Some(hello()))]);
    let desired = export_conditions(Validity::Valid, &m);
    let first = with_transition_times(&[], &desired, t(100)).expect("a first write");
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|c| c.last_transition_time.0 == t(100)));
    // The same conditions later: nothing to write.
    assert_eq!(with_transition_times(&first, &desired, t(200)), None);
    // A conflict appears: only Conflict's time moves.
    let second = with(hello(), |s| s.ports = Some(vec![port("tcp", "TCP", 43)]));
    let m = merge(&[
        export("east", 1, Some(hello())),
        export("west", 2, Some(second)),
    ]);
    let next = with_transition_times(&first, &export_conditions(Validity::Valid, &m), t(300))
        .expect("Conflict changed");
    for c in &next {
        let want = if c.type_ == "Conflict" {
            t(300)
        } else {
            t(100)
        };
        assert_eq!(c.last_transition_time.0, want, "{}", c.type_);
    }
    // The Service goes: Valid and Ready turn False now, Conflict is gone.
    let gone = with_transition_times(
        &next,
        &export_conditions(Validity::NoService, &merge(&[])),
        t(400),
    )
    .expect("Valid changed");
    assert_eq!(gone.len(), 2);
    // A condition of a type that is not ours stays as it is.
    let mut theirs = first.clone();
    theirs.push(Condition {
        type_: "example.com/Audited".into(),
        status: "True".into(),
        reason: "Seen".into(),
        message: String::new(),
        last_transition_time: Time(t(50)),
        observed_generation: None,
    });
    assert_eq!(with_transition_times(&theirs, &desired, t(500)), None);
    let kept = with_transition_times(
        &theirs,
        &export_conditions(Validity::NoService, &merge(&[])),
        t(500),
    )
    .unwrap();
    assert!(
        kept.iter()
            .any(|c| c.type_ == "example.com/Audited" && c.last_transition_time.0 == t(50))
    );
    assert!(
        gone.iter()
            .all(|c| c.status == "False" && c.last_transition_time.0 == t(400))
    );
}

fn only(names: &[&str]) -> ExportTo {
    ExportTo::Only(names.iter().map(|n| (*n).to_string()).collect())
}

#[test]
fn export_to_parses_the_annotation() {
    let cases: &[(Option<&str>, ExportTo)] = &[
        (None, ExportTo::Every),
        (Some("east"), only(&["east"])),
        (Some("east,north"), only(&["east", "north"])),
        (Some(" east , north "), only(&["east", "north"])),
        (Some("east,,north,"), only(&["east", "north"])),
        (Some("east,east"), only(&["east"])),
        (Some(""), only(&[])),
        (Some(","), only(&[])),
        (Some(" , "), only(&[])),
    ];
    for (value, want) in cases {
        assert_eq!(&ExportTo::parse(*value), want, "{value:?}");
    }
    for value in [
        "East",
        "east,no_underscore",
        "-east",
        "a.b",
        &"x".repeat(64),
    ] {
        match ExportTo::parse(Some(value)) {
            ExportTo::Invalid(reason) => assert!(reason.contains("not valid"), "{reason}"),
            other => panic!("{value:?}: {other:?}"),
        }
    }
    // The reason names the offending names only, and stays bounded.
    let ExportTo::Invalid(reason) = ExportTo::parse(Some("east,Bad,also_bad")) else {
        panic!()
    };
    assert!(
        reason.contains("Bad") && reason.contains("also_bad"),
        "{reason}"
    );
    assert!(!reason.contains("east"), "{reason}");
    let many = vec!["X"; 500].join(",");
    let ExportTo::Invalid(reason) = ExportTo::parse(Some(&many)) else {
        panic!()
    };
    assert!(reason.chars().count() < 250, "{}", reason.len());
}

#[test]
fn export_to_reaches_the_listed_clusters_and_always_the_exporter() {
    let invalid = ExportTo::parse(Some("Bad"));
    let cases: &[(&ExportTo, &str, bool)] = &[
        (&ExportTo::Every, "west", true),
        (&ExportTo::Every, "east", true),
        (&only(&["east"]), "west", true),
        (&only(&["east"]), "east", true),
        (&only(&["east"]), "north", false),
        (&only(&[]), "west", true),
        (&only(&[]), "east", false),
        (&invalid, "west", true),
        (&invalid, "east", false),
    ];
    for (to, cluster, want) in cases {
        assert_eq!(to.reaches("west", cluster), *want, "{to:?} {cluster}");
    }
}

#[test]
fn a_cluster_merges_only_the_exports_that_reach_it() {
    let narrowed = |cluster: &str, created, to: ExportTo| ClusterExport {
        export_to: to,
        ..export(cluster, created, Some(hello()))
    };
    // west (oldest) exports to north only, with other ports; east to every cluster.
    let west = narrowed("west", 1, only(&["north"]));
    let west = ClusterExport {
        service: Some(with(hello(), |s| s.ports = Some(vec![port("", "TCP", 9)]))),
        ..west
    };
    let east = export("east", 2, Some(hello()));
    let all = vec![west.clone(), east.clone()];
    let clusters = |m: &Merge| m.clusters.join(",");

    // east's import: east alone (west does not reach it): no conflict, east's port.
    let in_east = merge(&exports_reaching(&all, "east"));
    assert_eq!(clusters(&in_east), "east");
    assert!(in_east.conflicts.is_empty());
    assert_eq!(
        in_east.import.unwrap().ports,
        merge(std::slice::from_ref(&east)).import.unwrap().ports
    );
    // north's and west's: both, west's port first (the oldest), with a port conflict.
    for cluster in ["north", "west"] {
        let m = merge(&exports_reaching(&all, cluster));
        assert_eq!(clusters(&m), "east,west", "{cluster}");
        assert_eq!(reasons(&m), "PortConflict", "{cluster}");
        assert_eq!(m.import.unwrap().ports[0].port, 9, "{cluster}");
    }
    // The unfiltered merge (the exports' conditions) is the same as north's.
    assert_eq!(merge(&all), merge(&exports_reaching(&all, "north")));

    // Nothing reaches south but what is exported to every cluster; nothing at all once
    // east narrows too (or is invalid): no import there.
    assert_eq!(clusters(&merge(&exports_reaching(&all, "south"))), "east");
    for to in [only(&["west"]), ExportTo::parse(Some("Bad")), only(&[])] {
        let all = vec![west.clone(), narrowed("east", 2, to.clone())];
        let m = merge(&exports_reaching(&all, "south"));
        assert_eq!(m.import, None, "{to:?}");
        assert!(m.clusters.is_empty(), "{to:?}");
        // The exporters still import their own.
        assert!(
            merge(&exports_reaching(&all, "east")).import.is_some(),
            "{to:?}"
        );
    }
}
