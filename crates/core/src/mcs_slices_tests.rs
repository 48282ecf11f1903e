use super::*;
use crate::action::Object;
use crate::mcs_test_support::{CTL, key, port};
use std::net::IpAddr;

fn gw(addrs: &[&str], alive: bool) -> Option<SourceGateway> {
    Some(SourceGateway {
        gateway: ResolvedGateway::new(addrs.iter().map(|a| a.parse::<IpAddr>().unwrap()), 4143)
            .with_identity(Some(
                "gateway.east.serviceaccount.identity.linkerd.cluster.local".into(),
            ))
            .with_alive(alive),
        domain: "cluster.local".into(),
    })
}

fn ports() -> Vec<ImportPort> {
    vec![port("http", "TCP", 80), port("dns", "UDP", 53)]
}

fn clusters(names: &[&str]) -> Vec<String> {
    names.iter().map(|c| (*c).into()).collect()
}

fn desired(
    headless: bool,
    exporting: &[&str],
    gateways: &BTreeMap<String, Option<SourceGateway>>,
) -> DesiredImportSlices {
    let (k, p, c) = (key(), ports(), clusters(exporting));
    desired_import_slices(&ImportSlicesInput {
        key: &k,
        ports: &p,
        headless,
        clusters: &c,
        local_cluster: "west",
        local_slices: None,
        gateways,
        controller_namespace: CTL,
        traffic: &crate::traffic::TrafficPolicy::spread(),
    })
}

fn owner(uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "multicluster.x-k8s.io/v1beta1".into(),
        kind: "ServiceImport".into(),
        name: "hello".into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The slices as the apiserver would store them after our creates.
fn stored(d: &DesiredImportSlices, uid: &str) -> Vec<EndpointSlice> {
    d.slices
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut s = s.clone();
            s.metadata.owner_references = Some(vec![owner(uid)]);
            s.metadata.uid = Some(format!("s{i}"));
            s.metadata.resource_version = Some(format!("{}", 10 + i));
            s
        })
        .collect()
}

fn east(addrs: &[&str], alive: bool) -> BTreeMap<String, Option<SourceGateway>> {
    BTreeMap::from([("east".into(), gw(addrs, alive))])
}

fn plan(d: &DesiredImportSlices, stored: &[EndpointSlice], uid: &str) -> Vec<Action> {
    plan_import_slices(&key(), d, stored, &owner(uid), CTL)
}

fn verbs(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| a.to_string().replace("shop/", ""))
        .collect()
}

#[test]
fn a_remote_exporter_gets_one_slice_per_family_at_its_gateway_labelled_for_kube_proxy_and_mcs() {
    let d = desired(
        false,
        &["east", "west"],
        &east(&["192.0.2.7", "2001:db8::7"], true),
    );
    // This cluster's own slices are not listed here: left as they are.
    assert_eq!(d.untouched, BTreeSet::from(["west".to_string()]));
    assert_eq!(d.slices.len(), 2, "one per family: {d:?}");
    let v4 = &d.slices[0];
    let derived = derived_service_name(&key());
    assert_eq!(v4.address_type, "IPv4");
    assert_eq!(d.slices[1].address_type, "IPv6");
    assert_eq!(
        v4.metadata.name.as_deref(),
        Some(format!("{derived}-east-ipv4-0").as_str())
    );
    assert_eq!(v4.metadata.namespace.as_deref(), Some("shop"));
    let labels = v4.metadata.labels.clone().unwrap();
    assert_eq!(labels[SERVICE_NAME_LABEL], "hello");
    assert_eq!(labels[SOURCE_CLUSTER_LABEL], "east");
    assert_eq!(
        labels[KUBE_SERVICE_NAME_LABEL], derived,
        "kube-proxy routes the ClusterSetIP"
    );
    assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY_VALUE);
    let notes = v4.metadata.annotations.clone().unwrap();
    assert_eq!(
        notes[REMOTE_SVC_FQ_NAME_ANNOTATION],
        "hello.shop.svc.cluster.local"
    );
    assert!(notes[REMOTE_GATEWAY_IDENTITY_ANNOTATION].starts_with("gateway.east."));
    assert_eq!(notes[CONTROLLER_NAMESPACE_ANNOTATION], CTL);
    assert_eq!(v4.endpoints.len(), 1);
    assert_eq!(v4.endpoints[0].addresses, ["192.0.2.7"]);
    let ready = v4.endpoints[0].conditions.clone().unwrap();
    assert_eq!((ready.ready, ready.serving), (Some(true), Some(true)));
    let got: Vec<(Option<String>, Option<String>, Option<i32>)> = v4
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone(), p.protocol.clone(), p.port))
        .collect();
    assert_eq!(
        got,
        [
            (Some("http".into()), Some("TCP".into()), Some(4143)),
            (Some("dns".into()), Some("UDP".into()), Some(4143)),
        ],
        "every port reaches the gateway's, by name"
    );
    assert!(is_owned_import_slice(&v4.metadata, CTL));
    assert!(!is_owned_import_slice(&v4.metadata, "another-controller"));
}

#[test]
fn an_unlisted_local_exporter_and_a_cluster_without_a_gateway_yet_are_left_untouched() {
    let d = desired(false, &["north", "west"], &east(&["192.0.2.7"], true));
    assert!(d.slices.is_empty(), "{d:?}");
    assert_eq!(
        d.untouched,
        BTreeSet::from(["north".to_string(), "west".to_string()])
    );
    // Its stored slices (from before a restart) stay until its gateway is reported.
    let before = desired(
        false,
        &["north"],
        &BTreeMap::from([("north".into(), gw(&["192.0.2.9"], true))]),
    );
    assert!(plan(&d, &stored(&before, "u1"), "u1").is_empty());
}

#[test]
fn a_headless_import_has_no_slices_and_its_stored_ones_go() {
    let gws = east(&["192.0.2.7"], true);
    assert_eq!(
        desired(true, &["east"], &gws),
        DesiredImportSlices::default()
    );
    let before = stored(&desired(false, &["east"], &gws), "u1");
    let derived = derived_service_name(&key());
    assert_eq!(
        verbs(&plan(&desired(true, &["east"], &gws), &before, "u1")),
        [format!("delete EndpointSlice {derived}-east-ipv4-0")]
    );
}

#[test]
fn equal_inputs_give_no_action() {
    let gws = east(&["192.0.2.7", "2001:db8::7"], true);
    let d = desired(false, &["east", "west"], &gws);
    assert_eq!(plan(&d, &stored(&d, "u1"), "u1"), Vec::new());
    assert_eq!(d, desired(false, &["west", "east"], &gws));
}

#[test]
fn a_new_import_uid_a_dead_gateway_or_a_moved_address_updates_in_place() {
    let d = desired(false, &["east"], &east(&["192.0.2.7"], true));
    let before = stored(&d, "u1");
    let name = format!("{}-east-ipv4-0", derived_service_name(&key()));
    // The import made again (new uid): the owner follows.
    assert_eq!(
        verbs(&plan(&d, &before, "u2")),
        [format!("update EndpointSlice {name}")]
    );
    // The gateway's probe fails: not ready, not serving, same addresses.
    let dead = desired(false, &["east"], &east(&["192.0.2.7"], false));
    let actions = plan(&dead, &before, "u1");
    let [Action::Update(Object::EndpointSlice(s))] = actions.as_slice() else {
        panic!("{actions:?}");
    };
    let c = s.endpoints[0].conditions.clone().unwrap();
    assert_eq!((c.ready, c.serving), (Some(false), Some(false)));
    assert_eq!(
        s.metadata.resource_version.as_deref(),
        Some("10"),
        "precondition kept"
    );
    // One of two addresses failing its own probes: it alone not ready.
    let mut one_dead = east(&["192.0.2.7", "192.0.2.9"], true);
    if let Some(Some(g)) = one_dead.get_mut("east") {
        g.gateway.dead = vec!["192.0.2.9".parse().unwrap()];
    }
    let d = desired(false, &["east"], &one_dead);
    let readiness: Vec<(String, Option<bool>, Option<bool>)> = d.slices[0]
        .endpoints
        .iter()
        .map(|e| {
            let c = e.conditions.clone().unwrap();
            (e.addresses[0].clone(), c.ready, c.serving)
        })
        .collect();
    assert_eq!(
        readiness,
        [
            ("192.0.2.7".to_string(), Some(true), Some(true)),
            ("192.0.2.9".to_string(), Some(false), Some(false)),
        ]
    );
    // A new address.
    let moved = desired(false, &["east"], &east(&["192.0.2.8"], true));
    assert_eq!(
        verbs(&plan(&moved, &before, "u1")),
        [format!("update EndpointSlice {name}")]
    );
}

#[test]
fn a_gateway_that_changes_family_is_deleted_and_created_again() {
    let before = stored(
        &desired(false, &["east"], &east(&["192.0.2.7"], true)),
        "u1",
    );
    let v6 = desired(false, &["east"], &east(&["2001:db8::7"], true));
    let derived = derived_service_name(&key());
    assert_eq!(
        verbs(&plan(&v6, &before, "u1")),
        [
            format!("create EndpointSlice {derived}-east-ipv6-0"),
            format!("delete EndpointSlice {derived}-east-ipv4-0"),
        ]
    );
}

#[test]
fn a_cluster_that_stops_exporting_loses_its_slices_the_others_keep_theirs() {
    let gws = BTreeMap::from([
        ("east".to_string(), gw(&["192.0.2.7"], true)),
        ("north".to_string(), gw(&["192.0.2.9"], true)),
    ]);
    let before = stored(&desired(false, &["east", "north"], &gws), "u1");
    let derived = derived_service_name(&key());
    assert_eq!(
        verbs(&plan(&desired(false, &["east"], &gws), &before, "u1")),
        [format!("delete EndpointSlice {derived}-north-ipv4-0")]
    );
    // No import at all: every slice of ours of the name goes.
    assert_eq!(
        verbs(&plan(&DesiredImportSlices::default(), &before, "u1")).len(),
        2
    );
}

#[test]
fn another_writers_slice_is_never_planned_whatever_it_carries() {
    let gws = east(&["192.0.2.7"], true);
    let d = desired(false, &["east"], &gws);
    let ours = stored(&d, "u1");
    let foreign = |change: &dyn Fn(&mut ObjectMeta)| {
        let mut s = ours[0].clone();
        change(&mut s.metadata);
        s
    };
    let cases: Vec<(&str, EndpointSlice)> = vec![
        (
            "kube-controller-manager's",
            foreign(&|m| {
                m.labels.as_mut().unwrap().insert(
                    MANAGED_BY_LABEL.into(),
                    "endpointslice-controller.k8s.io".into(),
                );
            }),
        ),
        (
            "without our mark",
            foreign(&|m| {
                m.labels.as_mut().unwrap().remove(IMPORT_LABEL);
            }),
        ),
        (
            "of another controller namespace",
            foreign(&|m| {
                m.annotations
                    .as_mut()
                    .unwrap()
                    .insert(CONTROLLER_NAMESPACE_ANNOTATION.into(), "other".into());
            }),
        ),
        (
            "without a source cluster",
            foreign(&|m| {
                m.labels.as_mut().unwrap().remove(SOURCE_CLUSTER_LABEL);
            }),
        ),
    ];
    for (what, theirs) in cases {
        // Not desired any more: still not deleted.
        let none = plan(
            &DesiredImportSlices::default(),
            std::slice::from_ref(&theirs),
            "u1",
        );
        assert!(none.is_empty(), "{what}: {none:?}");
        assert!(!is_owned_import_slice(&theirs.metadata, CTL), "{what}");
    }
    // One of ours of another import, or another namespace: not this import's.
    let mut other = ours[0].clone();
    other
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(SERVICE_NAME_LABEL.into(), "bye".into());
    let mut elsewhere = ours[0].clone();
    elsewhere.metadata.namespace = Some("other".into());
    assert!(plan(&DesiredImportSlices::default(), &[other, elsewhere], "u1").is_empty());
}

#[test]
fn slice_names_never_take_a_mirrors_name_and_stay_within_63_characters() {
    // Two long clusters sharing their first 40 characters: distinct names.
    let (a, b) = (
        format!("{}-a", "c".repeat(40)),
        format!("{}-b", "c".repeat(40)),
    );
    let gws = BTreeMap::from([
        (a.clone(), gw(&["192.0.2.7"], true)),
        (b.clone(), gw(&["192.0.2.8"], true)),
    ]);
    let d = desired(false, &[&a, &b], &gws);
    let names: Vec<String> = d
        .slices
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    assert_eq!(names.len(), 2);
    assert_ne!(names[0], names[1]);
    for name in &names {
        assert!(name.len() <= 63, "{name}");
        assert!(name.starts_with("derived-"), "{name}");
    }
    let short = desired(false, &["east"], &east(&["192.0.2.7"], true));
    // The mirror of hello from east is hello-east, its slices hello-east-ipv4-0.
    assert_ne!(
        short.slices[0].metadata.name.as_deref(),
        Some("hello-east-ipv4-0")
    );
}

/// A slice of the local exported Service `hello` by kube-controller-manager.
fn local_slice(name: &str, address_type: &str, addrs: &[(&str, bool)]) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "shop", "uid": format!("u-{name}"),
            "labels": {"kubernetes.io/service-name": "hello",
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "hello", "uid": "svc"}]},
        "addressType": address_type,
        "endpoints": addrs.iter().map(|(a, ready)| serde_json::json!({
            "addresses": [a], "conditions": {"ready": ready, "serving": ready, "terminating": false},
            "nodeName": "node-1", "zone": "z1",
            "targetRef": {"kind": "Pod", "name": "p", "namespace": "shop"},
        })).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}

fn with_local(exporting: &[&str], local: &[EndpointSlice]) -> DesiredImportSlices {
    let (k, p, c) = (key(), ports(), clusters(exporting));
    desired_import_slices(&ImportSlicesInput {
        key: &k,
        ports: &p,
        headless: false,
        clusters: &c,
        local_cluster: "west",
        local_slices: Some(local),
        gateways: &BTreeMap::new(),
        controller_namespace: CTL,
        traffic: &crate::traffic::TrafficPolicy::spread(),
    })
}

#[test]
fn the_local_exporter_gets_a_copy_of_each_of_its_services_slices_with_its_ports_as_they_are() {
    let local = [
        local_slice("hello-b", "IPv4", &[("10.244.0.9", false)]),
        local_slice(
            "hello-a",
            "IPv4",
            &[("10.244.0.7", true), ("10.244.0.8", true)],
        ),
        local_slice("hello-6", "IPv6", &[("fd00::7", true)]),
        local_slice("hello-f", "FQDN", &[("web.example", true)]),
    ];
    let d = with_local(&["west"], &local);
    assert!(d.untouched.is_empty());
    let derived = derived_service_name(&key());
    let got: Vec<(String, String, Vec<String>)> = d
        .slices
        .iter()
        .map(|s| {
            let addrs = s
                .endpoints
                .iter()
                .flat_map(|e| e.addresses.clone())
                .collect();
            (
                s.metadata.name.clone().unwrap(),
                s.address_type.clone(),
                addrs,
            )
        })
        .collect();
    let shape: Vec<(String, Vec<String>)> =
        got.iter().map(|(_, t, a)| (t.clone(), a.clone())).collect();
    assert_eq!(
        shape,
        [
            ("IPv6".to_string(), vec!["fd00::7".to_string()]),
            (
                "IPv4".into(),
                vec!["10.244.0.7".to_string(), "10.244.0.8".into()]
            ),
            ("IPv4".into(), vec!["10.244.0.9".to_string()]),
        ],
        "one copy per source slice, by source name; FQDN slices are not copied"
    );
    let names: BTreeSet<&String> = got.iter().map(|(n, _, _)| n).collect();
    assert_eq!(names.len(), 3, "distinct: {got:?}");
    for (name, t, _) in &got {
        let family = if t == "IPv6" { "-ipv6-0" } else { "-ipv4-0" };
        assert!(
            name.starts_with(&format!("{derived}-west-")) && name.ends_with(family),
            "{name}"
        );
        assert!(name.len() <= 63, "{name}");
    }
    let first = &d.slices[1];
    let labels = first.metadata.labels.clone().unwrap();
    assert_eq!(labels[SOURCE_CLUSTER_LABEL], "west");
    assert_eq!(labels[KUBE_SERVICE_NAME_LABEL], derived);
    assert!(is_owned_import_slice(&first.metadata, CTL));
    assert!(
        first.metadata.owner_references.is_none(),
        "the plan sets the import"
    );
    let e = &first.endpoints[0];
    assert_eq!(e.node_name.as_deref(), Some("node-1"));
    assert_eq!(e.zone.as_deref(), Some("z1"));
    assert!(e.target_ref.is_none(), "pods are not ours to point at");
    assert_eq!(
        d.slices[2].endpoints[0].conditions.clone().unwrap().ready,
        Some(false),
        "hello-b's not-ready endpoint stays not ready"
    );
    let port = &first.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.port),
        (Some("http"), Some(8080)),
        "the pods' port"
    );
    // Equal inputs: nothing to write; a pod going: an update of that slice only.
    assert!(plan(&d, &stored(&d, "u1"), "u1").is_empty());
    let fewer = [
        local[0].clone(),
        local_slice("hello-a", "IPv4", &[("10.244.0.7", true)]),
        local[2].clone(),
    ];
    assert_eq!(
        verbs(&plan(
            &with_local(&["west"], &fewer),
            &stored(&d, "u1"),
            "u1"
        )),
        [format!("update EndpointSlice {}", got[1].0)]
    );
    // A source slice going (one that sorts first) renames no other copy.
    let without = [local[0].clone(), local[1].clone(), local[3].clone()];
    assert_eq!(
        verbs(&plan(
            &with_local(&["west"], &without),
            &stored(&d, "u1"),
            "u1"
        )),
        [format!("delete EndpointSlice {}", got[0].0)]
    );
    // No longer exported here: this cluster's slices go.
    assert_eq!(
        plan(&with_local(&["east"], &local), &stored(&d, "u1"), "u1").len(),
        3
    );
}

#[test]
fn a_local_exporter_without_endpoints_has_no_slice_and_remote_ones_are_unaffected() {
    let (k, p, c) = (key(), ports(), clusters(&["east", "west"]));
    let gws = east(&["192.0.2.7"], true);
    let none = desired_import_slices(&ImportSlicesInput {
        key: &k,
        ports: &p,
        headless: false,
        clusters: &c,
        local_cluster: "west",
        local_slices: Some(&[]),
        gateways: &gws,
        controller_namespace: CTL,
        traffic: &crate::traffic::TrafficPolicy::spread(),
    });
    assert!(none.untouched.is_empty());
    let only_east = desired(false, &["east"], &gws);
    assert_eq!(
        none.slices, only_east.slices,
        "east's slices as if west did not export"
    );
    assert_eq!(none.slices.len(), 1);
}

#[test]
fn a_gateway_with_no_usable_address_takes_its_clusters_slices_away() {
    let before = stored(
        &desired(false, &["east"], &east(&["192.0.2.7"], true)),
        "u1",
    );
    let unusable = BTreeMap::from([("east".to_string(), None)]);
    let d = desired(false, &["east"], &unusable);
    assert_eq!(d, DesiredImportSlices::default(), "not left untouched");
    let derived = derived_service_name(&key());
    assert_eq!(
        verbs(&plan(&d, &before, "u1")),
        [format!("delete EndpointSlice {derived}-east-ipv4-0")]
    );
}

/// The ready flags of `cluster`'s gateway slices in `d` (none: no slice of it).
fn readiness(d: &DesiredImportSlices, cluster: &str) -> Vec<(bool, bool)> {
    d.slices
        .iter()
        .filter(|s| s.metadata.labels.as_ref().unwrap()[SOURCE_CLUSTER_LABEL] == cluster)
        .flat_map(|s| &s.endpoints)
        .map(|e| {
            let c = e.conditions.as_ref().unwrap();
            (c.ready.unwrap(), c.serving.unwrap())
        })
        .collect()
}

fn with_traffic(
    exporting: &[&str],
    local: Option<&[EndpointSlice]>,
    gateways: &BTreeMap<String, Option<SourceGateway>>,
    traffic: &crate::traffic::TrafficPolicy,
) -> DesiredImportSlices {
    // The one port home's slices carry (see the test of a port only a remote has).
    let (k, p, c) = (key(), vec![port("http", "TCP", 80)], clusters(exporting));
    desired_import_slices(&ImportSlicesInput {
        key: &k,
        ports: &p,
        headless: false,
        clusters: &c,
        local_cluster: "west",
        local_slices: local,
        gateways,
        controller_namespace: CTL,
        traffic,
    })
}

#[test]
fn local_first_stands_remote_slices_by_while_home_has_enough_and_readies_the_first_live_tier() {
    use crate::traffic::TrafficPolicy;
    let gws = |east: bool, north: bool| {
        BTreeMap::from([
            ("east".to_string(), gw(&["192.0.2.1"], east)),
            ("north".to_string(), gw(&["192.0.2.2"], north)),
        ])
    };
    let home_up = [local_slice("hello-a", "IPv4", &[("10.0.0.1", true)])];
    let home_down = [local_slice("hello-a", "IPv4", &[("10.0.0.1", false)])];
    let prio = TrafficPolicy {
        priority: vec!["east".into(), "north".into()],
        ..Default::default()
    };
    let all = ["west", "east", "north"];
    let (on, off) = ((true, true), (false, false));
    // (home slices, east alive, north alive, policy, east, north, why)
    type Case<'a> = (
        Option<&'a [EndpointSlice]>,
        bool,
        bool,
        &'a TrafficPolicy,
        (bool, bool),
        (bool, bool),
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            Some(&home_up),
            true,
            true,
            &prio,
            off,
            off,
            "home has one ready: both stand by",
        ),
        (
            Some(&home_down),
            true,
            true,
            &prio,
            on,
            off,
            "home's one not ready: east, the first tier",
        ),
        (
            Some(&[]),
            true,
            true,
            &prio,
            on,
            off,
            "home has no endpoint: east",
        ),
        (
            Some(&home_down),
            false,
            true,
            &prio,
            off,
            on,
            "east's gateway dead: north",
        ),
        (
            Some(&home_down),
            false,
            false,
            &prio,
            off,
            off,
            "both dead: probe verdicts (not ready) for both",
        ),
    ];
    for (local, e, n, policy, want_e, want_n, why) in cases {
        let d = with_traffic(&all, local, &gws(e, n), policy);
        assert_eq!(readiness(&d, "east"), vec![want_e], "{why}: east");
        assert_eq!(readiness(&d, "north"), vec![want_n], "{why}: north");
        assert!(d.untouched.is_empty(), "{why}");
        // Home's own copy keeps its own conditions whatever the policy.
        let home = d
            .slices
            .iter()
            .find(|s| s.metadata.labels.as_ref().unwrap()[SOURCE_CLUSTER_LABEL] == "west");
        if let Some(home) = home {
            let src = local.unwrap()[0].endpoints[0].conditions.clone();
            assert_eq!(home.endpoints[0].conditions, src, "{why}: home as it is");
        }
    }
}

#[test]
fn a_minimum_above_home_s_count_fails_over_and_a_cluster_local_import_never_does() {
    use crate::traffic::TrafficPolicy;
    let gws = BTreeMap::from([("east".to_string(), gw(&["192.0.2.1"], true))]);
    let two = [local_slice(
        "hello-a",
        "IPv4",
        &[("10.0.0.1", true), ("10.0.0.2", true)],
    )];
    let min3 = TrafficPolicy {
        minimum: 3,
        ..Default::default()
    };
    let d = with_traffic(&["west", "east"], Some(&two), &gws, &min3);
    assert_eq!(
        readiness(&d, "east"),
        vec![(true, true)],
        "2 < 3: east serves"
    );
    let min2 = TrafficPolicy {
        minimum: 2,
        ..Default::default()
    };
    let d = with_traffic(&["west", "east"], Some(&two), &gws, &min2);
    assert_eq!(readiness(&d, "east"), vec![(false, false)], "2 = 2: home");
    let cluster_local = TrafficPolicy {
        cluster_local: true,
        ..TrafficPolicy::spread()
    };
    let d = with_traffic(&["west", "east"], Some(&[]), &gws, &cluster_local);
    assert_eq!(
        readiness(&d, "east"),
        vec![(false, false)],
        "internalTrafficPolicy Local: never a remote, even with none at home"
    );
    // This cluster does not export the name: home has none, east serves.
    let d = with_traffic(&["east"], None, &gws, &TrafficPolicy::default());
    assert_eq!(readiness(&d, "east"), vec![(true, true)]);
}

#[test]
fn local_first_leaves_remote_slices_as_they_are_until_home_s_slices_are_listed() {
    let gws = BTreeMap::from([("east".to_string(), gw(&["192.0.2.1"], true))]);
    let d = with_traffic(
        &["west", "east"],
        None,
        &gws,
        &crate::traffic::TrafficPolicy::default(),
    );
    assert!(d.slices.is_empty());
    assert_eq!(
        d.untouched,
        BTreeSet::from(["west".to_string(), "east".to_string()])
    );
    // Spread needs no count: east is written.
    let d = with_traffic(
        &["west", "east"],
        None,
        &gws,
        &crate::traffic::TrafficPolicy::spread(),
    );
    assert_eq!(readiness(&d, "east"), vec![(true, true)]);
}

#[test]
fn a_dual_stack_home_endpoint_counts_once() {
    let gws = BTreeMap::from([("east".to_string(), gw(&["192.0.2.1"], true))]);
    let home = [
        local_slice("hello-a", "IPv4", &[("10.0.0.1", true)]),
        local_slice("hello-b", "IPv6", &[("fd00::1", true)]),
    ];
    let min2 = crate::traffic::TrafficPolicy {
        minimum: 2,
        ..Default::default()
    };
    let d = with_traffic(&["west", "east"], Some(&home), &gws, &min2);
    assert_eq!(
        readiness(&d, "east"),
        vec![(true, true)],
        "one pod in two families is one endpoint: below 2"
    );
}

#[test]
fn a_switch_writes_the_side_turning_ready_before_the_side_standing_by() {
    use crate::traffic::TrafficPolicy;
    let gws = BTreeMap::from([("east".to_string(), gw(&["192.0.2.1"], true))]);
    let all = ["west", "east"];
    let down = [local_slice("hello-a", "IPv4", &[("10.0.0.1", false)])];
    let up = [local_slice("hello-a", "IPv4", &[("10.0.0.1", true)])];
    let policy = TrafficPolicy::default();
    // Away: east serves, home's copy not ready. Stored as such.
    let away = with_traffic(&all, Some(&down), &gws, &policy);
    let stored_away = stored(&away, "u1");
    // Home again: home's copy turns ready, east stands by. "east" sorts before "west",
    // yet home's update comes first: no instant without a ready endpoint.
    let back = with_traffic(&all, Some(&up), &gws, &policy);
    let actions = plan(&back, &stored_away, "u1");
    let updated: Vec<String> = actions
        .iter()
        .map(|a| match a {
            Action::Update(Object::EndpointSlice(s)) => {
                s.metadata.labels.as_ref().unwrap()[SOURCE_CLUSTER_LABEL].clone()
            }
            other => panic!("only updates: {other:?}"),
        })
        .collect();
    assert_eq!(
        updated,
        vec!["west", "east"],
        "home ready first, then east's standby"
    );
    // And away again: east ready first, then home's copy not ready.
    let actions = plan(&away, &stored(&back, "u1"), "u1");
    let first = match &actions[0] {
        Action::Update(Object::EndpointSlice(s)) => {
            s.metadata.labels.as_ref().unwrap()[SOURCE_CLUSTER_LABEL].clone()
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(first, "east");
}

#[test]
fn a_port_home_does_not_serve_keeps_the_remotes_that_serve_it_ready() {
    // The import's ports are the union: `http` (home and east) and `dns` (east only).
    // Home's one ready endpoint carries `http` alone: for `dns` it has none, so east
    // is not stood by (kube-proxy would have no endpoint for `dns`).
    let gws = BTreeMap::from([("east".to_string(), gw(&["192.0.2.1"], true))]);
    let home = [local_slice("hello-a", "IPv4", &[("10.0.0.1", true)])];
    let (k, c) = (key(), clusters(&["west", "east"]));
    let both = ports();
    let d = desired_import_slices(&ImportSlicesInput {
        key: &k,
        ports: &both,
        headless: false,
        clusters: &c,
        local_cluster: "west",
        local_slices: Some(&home),
        gateways: &gws,
        controller_namespace: CTL,
        traffic: &crate::traffic::TrafficPolicy::default(),
    });
    assert_eq!(readiness(&d, "east"), vec![(true, true)]);
    // Home serving both: east stands by.
    let mut both_home = home[0].clone();
    both_home
        .ports
        .as_mut()
        .unwrap()
        .push(k8s_openapi::api::discovery::v1::EndpointPort {
            name: Some("dns".into()),
            port: Some(53),
            protocol: Some("UDP".into()),
            app_protocol: None,
        });
    let d = desired_import_slices(&ImportSlicesInput {
        key: &k,
        ports: &both,
        headless: false,
        clusters: &c,
        local_cluster: "west",
        local_slices: Some(&[both_home]),
        gateways: &gws,
        controller_namespace: CTL,
        traffic: &crate::traffic::TrafficPolicy::default(),
    });
    assert_eq!(readiness(&d, "east"), vec![(false, false)]);
}
