//! The ServiceImport: its desired form, ownership and the action that keeps it.

use super::*;
use k8s_openapi::api::core::v1::ClientIPConfig;

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
type Edit = Box<dyn Fn(&mut ImportObject)>;

fn clusters(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

fn desired(type_: ImportType) -> ImportObject {
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
    let d = desired(ImportType::ClusterSetIp);
    assert_eq!(d.type_, Some(ImportType::ClusterSetIp));
    assert_eq!(d.ports, spec(ImportType::ClusterSetIp).ports);
    assert_eq!(d.ips, vec!["10.96.0.10".to_string()]);
    assert_eq!(d.ip_families, vec!["IPv4".to_string()]);
    assert_eq!(d.session_affinity.as_deref(), Some("ClientIP"));
    assert_eq!(
        d.session_affinity_config
            .and_then(|c| c.client_ip)
            .and_then(|c| c.timeout_seconds),
        Some(30)
    );
    assert_eq!(d.internal_traffic_policy.as_deref(), Some("Local"));
    assert_eq!(d.traffic_distribution.as_deref(), Some("PreferClose"));
    assert_eq!(d.labels["team"], "shop");
    assert_eq!(d.labels[IMPORT_LABEL], IMPORT_VALUE);
    assert_eq!(d.annotations["owner"], "ann");
    assert_eq!(d.annotations[CONTROLLER_NAMESPACE_ANNOTATION], CTL);
    assert_eq!(
        d.annotations[DERIVED_SERVICE_ANNOTATION],
        derived_service_name(&key())
    );
    assert_eq!(d.clusters, clusters(&["east", "west"]), "sorted");
}

#[test]
fn a_headless_import_has_no_ips_whatever_it_is_given() {
    let d = desired(ImportType::Headless);
    assert_eq!(d.type_, Some(ImportType::Headless));
    assert!(d.ips.is_empty());
}

#[test]
fn our_marks_win_over_exported_labels_and_annotations_of_the_same_key() {
    let mut s = spec(ImportType::ClusterSetIp);
    s.labels.insert(IMPORT_LABEL.into(), "false".into());
    s.annotations
        .insert(CONTROLLER_NAMESPACE_ANNOTATION.into(), "elsewhere".into());
    s.annotations
        .insert(DERIVED_SERVICE_ANNOTATION.into(), "kube-dns".into());
    let d = desired_import(&key(), &s, &clusters(&["west"]), vec![], CTL);
    assert!(is_owned_import(&d.labels, &d.annotations, CTL));
    assert_eq!(
        d.annotations[DERIVED_SERVICE_ANNOTATION],
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
    assert_eq!(d.clusters, clusters(&["east", "west"]));
}

#[test]
fn ownership_needs_our_label_and_our_controller_namespace() {
    let d = desired(ImportType::ClusterSetIp);
    let cases: Vec<(&str, Edit, bool)> = vec![
        ("as we write it", Box::new(|_| {}), true),
        (
            "label removed",
            Box::new(|o| {
                o.labels.remove(IMPORT_LABEL);
            }),
            false,
        ),
        (
            "label false",
            Box::new(|o| {
                o.labels.insert(IMPORT_LABEL.into(), "false".into());
            }),
            false,
        ),
        (
            "another controller namespace",
            Box::new(|o| {
                o.annotations
                    .insert(CONTROLLER_NAMESPACE_ANNOTATION.into(), "other".into());
            }),
            false,
        ),
        (
            "no annotation",
            Box::new(|o| {
                o.annotations.remove(CONTROLLER_NAMESPACE_ANNOTATION);
            }),
            false,
        ),
        (
            "someone else's label added",
            Box::new(|o| {
                o.labels.insert("extra".into(), "1".into());
            }),
            true,
        ),
    ];
    for (what, edit, owned) in cases {
        let mut o = d.clone();
        edit(&mut o);
        assert_eq!(
            is_owned_import(&o.labels, &o.annotations, CTL),
            owned,
            "{what}"
        );
    }
}

#[test]
fn the_action_depends_on_what_differs() {
    let d = desired(ImportType::ClusterSetIp);
    let cases: Vec<(&str, Edit, ImportAction)> = vec![
        ("equal", Box::new(|_| {}), ImportAction::Nothing),
        (
            "a cluster more",
            Box::new(|o| o.clusters.push("south".into())),
            ImportAction::Update {
                spec: false,
                status: true,
            },
        ),
        (
            "no clusters yet (just created)",
            Box::new(|o| o.clusters.clear()),
            ImportAction::Update {
                spec: false,
                status: true,
            },
        ),
        (
            "a port less",
            Box::new(|o| {
                o.ports.pop();
            }),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "no ips yet",
            Box::new(|o| o.ips.clear()),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "another affinity",
            Box::new(|o| o.session_affinity = Some("None".into())),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "another affinity timeout",
            Box::new(|o| {
                o.session_affinity_config = Some(SessionAffinityConfig {
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
            Box::new(|o| o.internal_traffic_policy = None),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "another traffic distribution",
            Box::new(|o| o.traffic_distribution = None),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "another family",
            Box::new(|o| o.ip_families = vec!["IPv6".into()]),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "headless",
            Box::new(|o| o.type_ = Some(ImportType::Headless)),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "another writer's label and annotation (or an exported label since dropped)",
            Box::new(|o| {
                o.labels.insert("old".into(), "1".into());
                o.annotations.insert("webhook".into(), "1".into());
            }),
            ImportAction::Nothing,
        ),
        (
            "an exported label changed",
            Box::new(|o| {
                o.labels.insert("team".into(), "other".into());
            }),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "our mark removed",
            Box::new(|o| {
                o.annotations.remove(DERIVED_SERVICE_ANNOTATION);
            }),
            ImportAction::Update {
                spec: true,
                status: false,
            },
        ),
        (
            "an annotation edited and a cluster gone",
            Box::new(|o| {
                o.annotations.insert("owner".into(), "bob".into());
                o.clusters.pop();
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
    other.ports.clear();
    assert_eq!(
        import_action(Some(&other), false, &d),
        ImportAction::Foreign
    );
}
