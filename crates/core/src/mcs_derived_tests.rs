//! The derived Service: its name, ownership, desired form and the action that keeps it.

use super::*;
use crate::mcs::ImportPort;

use crate::mcs_test_support::{CTL, key, port};

fn spec(type_: ImportType, ports: Vec<ImportPort>, families: &[&str]) -> ImportSpec {
    ImportSpec {
        type_,
        ports,
        session_affinity: None,
        session_affinity_config: None,
        internal_traffic_policy: None,
        traffic_distribution: None,
        ip_families: families.iter().map(|f| f.to_string()).collect(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
    }
}

fn clusterset(ports: Vec<ImportPort>) -> Service {
    desired_derived_service(
        &key(),
        &spec(ImportType::ClusterSetIp, ports, &["IPv4"]),
        CTL,
    )
}

/// `desired` as the apiserver stores it: defaults filled in, addresses allocated,
/// someone else's label added.
fn stored(desired: &Service) -> Service {
    let mut s = desired.clone();
    s.metadata.resource_version = Some("7".into());
    s.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("team".into(), "shop".into());
    let spec = s.spec.as_mut().unwrap();
    for p in spec.ports.iter_mut().flatten() {
        p.target_port = Some(IntOrString::Int(p.port));
    }
    spec.session_affinity.get_or_insert_with(|| "None".into());
    spec.internal_traffic_policy
        .get_or_insert_with(|| "Cluster".into());
    if spec.session_affinity.as_deref() == Some("ClientIP")
        && spec.session_affinity_config.is_none()
    {
        spec.session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(10_800),
            }),
        });
    }
    if spec.cluster_ip.is_none() {
        spec.cluster_ip = Some("10.96.0.17".into());
        spec.cluster_ips = Some(vec!["10.96.0.17".into()]);
    }
    s
}

#[test]
fn fnv1a64_known_vectors() {
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn the_derived_name_is_a_stable_short_label_that_tells_namespace_from_name() {
    let name = derived_service_name(&key());
    // Pinned: a change would replace every ClusterSetIP on upgrade.
    assert_eq!(name, format!("derived-{:016x}", fnv1a64(b"shop/hello")));
    assert_eq!(name.len(), 24);
    assert!(
        crate::validate_cluster_name(&name).is_ok(),
        "a DNS-1035 label"
    );
    let long = ServiceKey::new("shop", "a".repeat(63));
    assert_eq!(derived_service_name(&long).len(), 24);
    assert_ne!(
        derived_service_name(&ServiceKey::new("a", "bc")),
        derived_service_name(&ServiceKey::new("ab", "c"))
    );
}

#[test]
fn only_a_derived_service_with_our_mark_label_and_namespace_is_ours() {
    let ours = clusterset(vec![port("http", "TCP", 80)]).metadata;
    let without = |f: &dyn Fn(&mut ObjectMeta)| {
        let mut m = ours.clone();
        f(&mut m);
        m
    };
    let table: Vec<(&str, ObjectMeta, &str, bool)> = vec![
        ("ours", ours.clone(), "hello", true),
        ("another import's", ours.clone(), "other", false),
        (
            "no mark",
            without(&|m| {
                m.labels.as_mut().unwrap().remove(DERIVED_LABEL);
            }),
            "hello",
            false,
        ),
        (
            "another controller's",
            without(&|m| {
                m.annotations = Some(BTreeMap::from([(
                    CONTROLLER_NAMESPACE_ANNOTATION.to_string(),
                    "other-ns".to_string(),
                )]));
            }),
            "hello",
            false,
        ),
        ("no metadata", ObjectMeta::default(), "hello", false),
    ];
    for (what, meta, import, want) in table {
        assert_eq!(is_owned_derived(&meta, import, CTL), want, "{what}");
    }
}

#[test]
fn the_desired_service_carries_the_imports_settings_no_selector_and_never_a_node_local_policy() {
    let mut s = spec(
        ImportType::ClusterSetIp,
        vec![port("tcp", "TCP", 42), port("", "UDP", 42)],
        &["IPv4", "IPv6"],
    );
    s.session_affinity = Some("ClientIP".into());
    s.internal_traffic_policy = Some("Local".into());
    s.traffic_distribution = Some("PreferClose".into());
    let svc = desired_derived_service(&key(), &s, CTL);
    assert!(is_owned_derived(&svc.metadata, "hello", CTL));
    assert_eq!(svc.metadata.namespace.as_deref(), Some("shop"));
    let got = svc.spec.unwrap();
    assert_eq!(got.cluster_ip, None, "allocated by the apiserver");
    assert_eq!(got.selector, None);
    assert_eq!(got.ip_family_policy.as_deref(), Some("PreferDualStack"));
    assert_eq!(got.session_affinity.as_deref(), Some("ClientIP"));
    // The import's `Local` is cluster-local (core::traffic): node-local here would drop
    // traffic on every node without a gateway or copy endpoint.
    assert_eq!(got.internal_traffic_policy.as_deref(), Some("Cluster"));
    assert_eq!(got.traffic_distribution.as_deref(), Some("PreferClose"));
    let ports: Vec<(Option<&str>, &str, i32, bool)> = got
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.name.as_deref(),
                p.protocol.as_deref().unwrap(),
                p.port,
                p.target_port.is_some(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        vec![(Some("tcp"), "TCP", 42, false), (None, "UDP", 42, false)]
    );
    /// (type, families) -> (clusterIP, ipFamilyPolicy)
    type Row<'a> = (ImportType, &'a [&'a str], Option<&'a str>, Option<&'a str>);
    let table: Vec<Row> = vec![
        (
            ImportType::Headless,
            &["IPv4"],
            Some("None"),
            Some("SingleStack"),
        ),
        (ImportType::ClusterSetIp, &[], None, None),
    ];
    for (type_, families, cluster_ip, policy) in table {
        let svc = desired_derived_service(&key(), &spec(type_, vec![], families), CTL);
        let got = svc.spec.unwrap();
        assert_eq!(got.cluster_ip.as_deref(), cluster_ip, "{type_:?}");
        assert_eq!(got.ip_family_policy.as_deref(), policy, "{type_:?}");
    }
}

#[test]
fn a_stored_service_with_the_apiservers_defaults_plans_nothing() {
    let mut affinity = spec(
        ImportType::ClusterSetIp,
        vec![port("http", "TCP", 80)],
        &["IPv4"],
    );
    affinity.session_affinity = Some("ClientIP".into());
    let table: Vec<(&str, Service)> = vec![
        ("plain", clusterset(vec![port("http", "TCP", 80)])),
        (
            "ClientIP, default timeout",
            desired_derived_service(&key(), &affinity, CTL),
        ),
        (
            "headless",
            desired_derived_service(
                &key(),
                &spec(
                    ImportType::Headless,
                    vec![port("db", "TCP", 5432)],
                    &["IPv4"],
                ),
                CTL,
            ),
        ),
    ];
    for (what, desired) in table {
        assert_eq!(
            derived_action(&stored(&desired), &desired),
            DerivedAction::Nothing,
            "{what}"
        );
    }
}

#[test]
fn a_change_updates_in_place_keeping_addresses_and_others_labels() {
    let before = stored(&clusterset(vec![port("http", "TCP", 80)]));
    let desired = clusterset(vec![port("http", "TCP", 80), port("grpc", "TCP", 9090)]);
    let DerivedAction::Update(next) = derived_action(&before, &desired) else {
        panic!("an update");
    };
    let spec = next.spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.17"));
    assert_eq!(spec.ports.as_ref().unwrap().len(), 2);
    assert_eq!(next.metadata.resource_version.as_deref(), Some("7"));
    assert_eq!(next.metadata.labels.as_ref().unwrap()["team"], "shop");
    // Applied, it plans nothing more.
    assert_eq!(
        derived_action(&stored(&next), &desired),
        DerivedAction::Nothing
    );
}

#[test]
fn edits_of_our_fields_are_restored_and_a_headless_flip_recreates() {
    let desired = clusterset(vec![port("http", "TCP", 80)]);
    let edit = |f: &dyn Fn(&mut Service)| {
        let mut s = stored(&desired);
        f(&mut s);
        s
    };
    let table: Vec<(&str, Service)> = vec![
        (
            "a targetPort",
            edit(&|s| {
                s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].target_port =
                    Some(IntOrString::Int(8080));
            }),
        ),
        (
            "our mark removed",
            edit(&|s| {
                s.metadata.labels.as_mut().unwrap().remove(DERIVED_LABEL);
            }),
        ),
        (
            "affinity",
            edit(&|s| s.spec.as_mut().unwrap().session_affinity = Some("ClientIP".into())),
        ),
        (
            "traffic policy",
            edit(&|s| s.spec.as_mut().unwrap().internal_traffic_policy = Some("Local".into())),
        ),
    ];
    for (what, current) in table {
        match derived_action(&current, &desired) {
            DerivedAction::Update(next) => assert_eq!(
                derived_action(&stored(&next), &desired),
                DerivedAction::Nothing,
                "{what}: restored"
            ),
            other => panic!("{what}: {other:?}"),
        }
    }
    let headless = desired_derived_service(
        &key(),
        &spec(
            ImportType::Headless,
            vec![port("http", "TCP", 80)],
            &["IPv4"],
        ),
        CTL,
    );
    assert_eq!(
        derived_action(&stored(&desired), &headless),
        DerivedAction::Recreate
    );
    assert_eq!(
        derived_action(&stored(&headless), &desired),
        DerivedAction::Recreate
    );
}

#[test]
fn the_import_ips_are_the_allocated_cluster_ips() {
    let with = |ip: Option<&str>, ips: Option<Vec<&str>>| Service {
        spec: Some(ServiceSpec {
            cluster_ip: ip.map(Into::into),
            cluster_ips: ips.map(|v| v.into_iter().map(Into::into).collect()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let table: Vec<(&str, Service, Vec<&str>)> = vec![
        (
            "dual stack",
            with(Some("10.96.0.1"), Some(vec!["10.96.0.1", "fd00::1"])),
            vec!["10.96.0.1", "fd00::1"],
        ),
        (
            "clusterIP only",
            with(Some("10.96.0.1"), None),
            vec!["10.96.0.1"],
        ),
        ("headless", with(Some("None"), Some(vec!["None"])), vec![]),
        ("not allocated", with(None, None), vec![]),
        ("no spec", Service::default(), vec![]),
    ];
    for (what, svc, want) in table {
        assert_eq!(import_ips(&svc), want, "{what}");
    }
}
