//! The ServiceImport: its desired form, ownership and the action that keeps it.

use super::*;
use k8s_openapi::api::core::v1::{ClientIPConfig, SessionAffinityConfig};

use crate::mcs_test_support::{CTL, key, port};

fn spec(type_: ImportType) -> ImportSpec {
    ImportSpec {
        type_,
        ports: vec![port("http", "TCP", 80), port("dns", "UDP", 53)],
        session_affinity: Some("ClientIP".into()),
        session_affinity_config: Some(SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(30),
            }),
        }),
        internal_traffic_policy: Some("Local".into()),
        traffic_distribution: Some("PreferClose".into()),
        ip_families: vec!["IPv4".into()],
        labels: BTreeMap::from([("team".into(), "shop".into())]),
        annotations: BTreeMap::from([("owner".into(), "ann".into())]),
    }
}

/// A change to a stored import.
type Edit = Box<dyn Fn(&mut ServiceImport)>;

fn labels(o: &mut ServiceImport) -> &mut BTreeMap<String, String> {
    o.metadata.labels.get_or_insert_default()
}

fn annotations(o: &mut ServiceImport) -> &mut BTreeMap<String, String> {
    o.metadata.annotations.get_or_insert_default()
}

fn listed(o: &mut ServiceImport) -> &mut Vec<ClusterStatus> {
    &mut o.status.get_or_insert_default().clusters
}

fn clusters(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

fn desired(type_: ImportType) -> ServiceImport {
    desired_import(
        &key(),
        &spec(type_),
        &clusters(&["west", "east"]),
        vec!["10.96.0.10".into()],
        CTL,
    )
}

#[test]
fn the_import_carries_every_merged_field_the_exporters_labels_and_our_marks() {
    let mut d = desired(ImportType::ClusterSetIp);
    assert_eq!(d.metadata.name.as_deref(), Some("hello"));
    assert_eq!(d.metadata.namespace.as_deref(), Some("shop"));
    let s = &d.spec;
    assert_eq!(s.type_.as_deref(), Some("ClusterSetIP"));
    let ports: Vec<_> = s
        .ports
        .iter()
        .map(|p| (p.name.as_deref(), p.protocol.as_deref(), p.port))
        .collect();
    assert_eq!(
        ports,
        [
            (Some("http"), Some("TCP"), 80),
            (Some("dns"), Some("UDP"), 53)
        ]
    );
    assert_eq!(s.ips, vec!["10.96.0.10".to_string()]);
    assert_eq!(s.ip_families, vec!["IPv4".to_string()]);
    assert_eq!(s.session_affinity.as_deref(), Some("ClientIP"));
    assert_eq!(
        s.session_affinity_config
            .clone()
            .and_then(|c| c.client_ip)
            .and_then(|c| c.timeout_seconds),
        Some(30)
    );
    assert_eq!(s.internal_traffic_policy.as_deref(), Some("Local"));
    assert_eq!(s.traffic_distribution.as_deref(), Some("PreferClose"));
    assert_eq!(d.clusters(), clusters(&["east", "west"]), "sorted");
    assert_eq!(labels(&mut d)["team"], "shop");
    assert_eq!(labels(&mut d)[IMPORT_LABEL], IMPORT_VALUE);
    let a = annotations(&mut d);
    assert_eq!(a["owner"], "ann");
    assert_eq!(a[CONTROLLER_NAMESPACE_ANNOTATION], CTL);
    assert_eq!(a[DERIVED_SERVICE_ANNOTATION], derived_service_name(&key()));
}

#[test]
fn a_nameless_port_is_written_without_a_name() {
    let mut s = spec(ImportType::ClusterSetIp);
    s.ports = vec![port("", "TCP", 80)];
    let d = desired_import(&key(), &s, &[], vec![], CTL);
    assert_eq!(d.spec.ports[0].name, None);
    assert_eq!(d.spec.ports[0].protocol.as_deref(), Some("TCP"));
    // Stored with an empty name (another writer's spelling): the same port.
    let mut stored = d.clone();
    stored.spec.ports[0].name = Some(String::new());
    assert_eq!(
        import_action(Some(&stored), true, &d),
        ImportAction::Nothing
    );
}

#[test]
fn a_headless_import_has_no_ips_whatever_it_is_given() {
    let d = desired(ImportType::Headless);
    assert_eq!(d.spec.type_.as_deref(), Some("Headless"));
    assert!(d.spec.ips.is_empty());
}

#[test]
fn our_marks_win_over_exported_labels_and_annotations_of_the_same_key() {
    let mut s = spec(ImportType::ClusterSetIp);
    s.labels.insert(IMPORT_LABEL.into(), "false".into());
    s.annotations
        .insert(CONTROLLER_NAMESPACE_ANNOTATION.into(), "elsewhere".into());
    s.annotations
        .insert(DERIVED_SERVICE_ANNOTATION.into(), "kube-dns".into());
    let mut d = desired_import(&key(), &s, &clusters(&["west"]), vec![], CTL);
    assert!(is_owned_import(&d.metadata, CTL));
    assert_eq!(
        annotations(&mut d)[DERIVED_SERVICE_ANNOTATION],
        derived_service_name(&key())
    );
}

#[test]
fn duplicate_clusters_are_listed_once() {
    let d = desired_import(
        &key(),
        &spec(ImportType::ClusterSetIp),
        &clusters(&["west", "east", "west"]),
        vec![],
        CTL,
    );
    assert_eq!(d.clusters(), clusters(&["east", "west"]));
    assert_eq!(listed(&mut d.clone()).len(), 2, "written once each");
}

#[test]
fn ownership_needs_our_label_and_our_controller_namespace() {
    let d = desired(ImportType::ClusterSetIp);
    let cases: Vec<(&str, Edit, bool)> = vec![
        ("as we write it", Box::new(|_| {}), true),
        (
            "label removed",
            Box::new(|o| {
                labels(o).remove(IMPORT_LABEL);
            }),
            false,
        ),
        (
            "label false",
            Box::new(|o| {
                labels(o).insert(IMPORT_LABEL.into(), "false".into());
            }),
            false,
        ),
        (
            "another controller namespace",
            Box::new(|o| {
                annotations(o).insert(CONTROLLER_NAMESPACE_ANNOTATION.into(), "other".into());
            }),
            false,
        ),
        (
            "no annotation",
            Box::new(|o| {
                annotations(o).remove(CONTROLLER_NAMESPACE_ANNOTATION);
            }),
            false,
        ),
        (
            "someone else's label added",
            Box::new(|o| {
                labels(o).insert("extra".into(), "1".into());
            }),
            true,
        ),
    ];
    for (what, edit, owned) in cases {
        let mut o = d.clone();
        edit(&mut o);
        assert_eq!(is_owned_import(&o.metadata, CTL), owned, "{what}");
    }
}

#[test]
fn the_action_depends_on_what_differs() {
    let d = desired(ImportType::ClusterSetIp);
    let cases: Vec<(&str, Edit, ImportAction)> = vec![
        ("equal", Box::new(|_| {}), ImportAction::Nothing),
        (
            "a cluster more",
            Box::new(|o| {
                listed(o).push(ClusterStatus {
                    cluster: "south".into(),
                })
            }),
            ImportAction::Update {
                spec: false,
                status: true,
            },
        ),
        (
            "no clusters yet (just created)",
            Box::new(|o| o.status = None),
            ImportAction::Update {
                spec: false,
                status: true,
            },
        ),
        (
            "a port less",
            Box::new(|o| {
                o.spec.ports.pop();
            }),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "no ips yet",
            Box::new(|o| o.spec.ips.clear()),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "another affinity",
            Box::new(|o| o.spec.session_affinity = Some("None".into())),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "another affinity timeout",
            Box::new(|o| {
                o.spec.session_affinity_config = Some(SessionAffinityConfig {
                    client_ip: Some(ClientIPConfig {
                        timeout_seconds: Some(31),
                    }),
                })
            }),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "another traffic policy",
            Box::new(|o| o.spec.internal_traffic_policy = None),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "another traffic distribution",
            Box::new(|o| o.spec.traffic_distribution = None),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "another family",
            Box::new(|o| o.spec.ip_families = vec!["IPv6".into()]),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "headless",
            Box::new(|o| o.spec.type_ = Some("Headless".into())),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "a type we do not know",
            Box::new(|o| o.spec.type_ = Some("Bogus".into())),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "a TCP port stored without its protocol (the KEP's default)",
            Box::new(|o| o.spec.ports[0].protocol = None),
            ImportAction::Nothing,
        ),
        (
            "a cluster listed twice",
            Box::new(|o| {
                listed(o).push(ClusterStatus {
                    cluster: "west".into(),
                })
            }),
            ImportAction::Update {
                spec: false,
                status: true,
            },
        ),
        (
            "another writer's label and annotation (or an exported label since dropped)",
            Box::new(|o| {
                labels(o).insert("old".into(), "1".into());
                annotations(o).insert("webhook".into(), "1".into());
            }),
            ImportAction::Nothing,
        ),
        (
            "an exported label changed",
            Box::new(|o| {
                labels(o).insert("team".into(), "other".into());
            }),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "our mark removed",
            Box::new(|o| {
                annotations(o).remove(DERIVED_SERVICE_ANNOTATION);
            }),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "an annotation edited and a cluster gone",
            Box::new(|o| {
                annotations(o).insert("owner".into(), "bob".into());
                listed(o).pop();
            }),
            ImportAction::Update {
                spec: true,
                status: true,
            },
        ),
    ];
    for (what, edit, want) in cases {
        let mut current = d.clone();
        edit(&mut current);
        assert_eq!(import_action(Some(&current), true, &d), want, "{what}");
    }
}

#[test]
fn none_stored_is_created_and_a_foreign_one_is_never_touched_even_if_equal() {
    let d = desired(ImportType::ClusterSetIp);
    assert_eq!(import_action(None, false, &d), ImportAction::Create);
    assert_eq!(import_action(Some(&d), false, &d), ImportAction::Foreign);
    let mut other = d.clone();
    other.spec.ports.clear();
    assert_eq!(
        import_action(Some(&other), false, &d),
        ImportAction::Foreign
    );
}
