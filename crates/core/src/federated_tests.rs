use super::*;
use crate::metadata::Exclusions;

const NS: &str = "mc";

fn svc(name: &str, ports: &[(&str, i32)], labels: &[(&str, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            annotations: Some(
                [(
                    "team".to_owned(),
                    labels.first().map_or("x", |l| l.1).to_owned(),
                )]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("10.0.0.1".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| ServicePort {
                        name: (!n.is_empty()).then(|| (*n).into()),
                        port: *p,
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

fn at(secs: i64) -> Option<Timestamp> {
    Some(Timestamp::from_second(secs).unwrap())
}

fn member(cluster: Option<&str>, created: Option<Timestamp>, service: Service) -> Member {
    Member {
        cluster: cluster.map(str::to_owned),
        link_created: created,
        domain: "cluster.local".into(),
        exclusions: ResourceStyle::default(),
        service,
    }
}

fn web(cluster: Option<&str>, created: Option<Timestamp>, tag: &str) -> Member {
    member(
        cluster,
        created,
        svc(
            "web",
            &[("http", 80)],
            &[("app", tag), ("mirror.linkerd.io/federated", "member")],
        ),
    )
}

fn gw(ip: &str, alive: bool) -> ResolvedGateway {
    ResolvedGateway::new([ip.parse().unwrap()], 4143)
        .with_identity(Some("gw.id".into()))
        .with_alive(alive)
}

struct World {
    members: Vec<Member>,
    gateways: BTreeMap<String, ResolvedGateway>,
    pending: BTreeSet<String>,
}

impl World {
    fn new(members: Vec<Member>) -> Self {
        Self {
            members,
            gateways: BTreeMap::new(),
            pending: BTreeSet::new(),
        }
    }
    fn gw(mut self, cluster: &str, g: ResolvedGateway) -> Self {
        self.gateways.insert(cluster.into(), g);
        self
    }
    fn pending(mut self, cluster: &str) -> Self {
        self.pending.insert(cluster.into());
        self
    }
    fn desired(&self, stored: Option<&str>) -> DesiredFederation {
        desired_federated(
            &FederationInput {
                namespace: "shop",
                name: "web",
                members: &self.members,
                gateways: &self.gateways,
                pending: &self.pending,
                controller_namespace: NS,
                local_slices: Some(&[]),
                traffic: &crate::traffic::TrafficPolicy::spread(),
            },
            stored,
        )
    }
}

fn service_of(d: &DesiredFederation) -> Service {
    match &d.service {
        DesiredService::Present(s) => (**s).clone(),
        other => panic!("no service: {other:?}"),
    }
}

fn annotation(s: &Service, key: &str) -> Option<String> {
    s.metadata.annotations.as_ref()?.get(key).cloned()
}

fn label(s: &Service, key: &str) -> Option<String> {
    s.metadata.labels.as_ref()?.get(key).cloned()
}

/// The Service as the apiserver would store it.
fn stored(mut s: Service) -> Service {
    s.metadata.uid = Some("uid-1".into());
    s.metadata.resource_version = Some("7".into());
    s.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.9".into());
    s
}

fn stored_slices(d: &DesiredFederation) -> Vec<EndpointSlice> {
    let svc = stored(service_of(d));
    plan_federated(d, Some(&svc), &[], NS)
        .actions
        .into_iter()
        .filter_map(|a| match a {
            Action::Create(Object::EndpointSlice(mut s)) => {
                s.metadata.uid = Some(format!("s-{}", s.metadata.name.clone().unwrap()));
                s.metadata.resource_version = Some("3".into());
                Some(s)
            }
            _ => None,
        })
        .collect()
}

#[test]
fn federated_name_follows_the_63_character_rule() {
    assert_eq!(federated_name("web"), "web-federated");
    let long = "a".repeat(60);
    let name = federated_name(&long);
    assert_eq!(name.len(), 63);
    assert!(name.ends_with("-federated"));
    assert_eq!(name, federated_name(&long), "deterministic");
}

#[test]
fn remote_discovery_annotation_is_sorted_whatever_the_member_order() {
    let orders = [
        vec![
            web(Some("north"), at(2), "n"),
            web(Some("east"), at(1), "e"),
        ],
        vec![
            web(Some("east"), at(1), "e"),
            web(Some("north"), at(2), "n"),
        ],
    ];
    for members in orders {
        let d = World::new(members).desired(None);
        let s = service_of(&d);
        assert_eq!(
            annotation(&s, REMOTE_DISCOVERY_ANNOTATION).as_deref(),
            Some("web@east,web@north")
        );
        assert_eq!(annotation(&s, LOCAL_DISCOVERY_ANNOTATION), None);
    }
}

#[test]
fn local_member_sets_local_discovery_and_wins_metadata() {
    let d = World::new(vec![
        web(Some("east"), at(1), "east"),
        web(None, None, "local"),
    ])
    .desired(None);
    let s = service_of(&d);
    assert_eq!(
        annotation(&s, LOCAL_DISCOVERY_ANNOTATION).as_deref(),
        Some("web")
    );
    assert_eq!(
        annotation(&s, REMOTE_DISCOVERY_ANNOTATION).as_deref(),
        Some("web@east")
    );
    assert_eq!(label(&s, "app").as_deref(), Some("local"));
}

#[test]
fn oldest_link_gives_metadata_table() {
    // (members, expected `app` label)
    let table: Vec<(&str, Vec<Member>, &str)> = vec![
        (
            "older first",
            vec![
                web(Some("east"), at(1), "east"),
                web(Some("north"), at(2), "north"),
            ],
            "east",
        ),
        (
            "older second",
            vec![
                web(Some("east"), at(5), "east"),
                web(Some("north"), at(2), "north"),
            ],
            "north",
        ),
        (
            "unknown time loses",
            vec![web(Some("a"), None, "a"), web(Some("z"), at(9), "z")],
            "z",
        ),
        (
            "tie: cluster name",
            vec![web(Some("z"), at(1), "z"), web(Some("b"), at(1), "b")],
            "b",
        ),
        (
            "local beats the oldest link",
            vec![web(Some("east"), at(0), "east"), web(None, None, "local")],
            "local",
        ),
    ];
    for (what, members, want) in table {
        let s = service_of(&World::new(members).desired(None));
        assert_eq!(label(&s, "app").as_deref(), Some(want), "{what}");
    }
}

#[test]
fn service_carries_ownership_and_no_cluster_label() {
    let s = service_of(&World::new(vec![web(Some("east"), at(1), "e")]).desired(None));
    assert_eq!(s.metadata.name.as_deref(), Some("web-federated"));
    assert_eq!(s.metadata.namespace.as_deref(), Some("shop"));
    assert!(is_owned_federated(&s.metadata, NS));
    assert!(!crate::is_owned(&s.metadata, "east"));
    assert_eq!(label(&s, MIRRORED_SERVICE_LABEL).as_deref(), Some("true"));
    assert_eq!(label(&s, crate::labels::CLUSTER_NAME_LABEL), None);
    // mirror.linkerd.io* labels (the member selector's) are not copied.
    assert_eq!(label(&s, "mirror.linkerd.io/federated"), None);
    assert_eq!(annotation(&s, "team").as_deref(), Some("e"));
    let spec = s.spec.unwrap();
    assert_eq!(spec.selector, None);
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
}

#[test]
fn exclusions_of_the_primary_link_apply() {
    let mut m = web(Some("east"), at(1), "e");
    m.exclusions = ResourceStyle {
        excluded_labels: Exclusions::parse(&["app".into()]).unwrap(),
        excluded_annotations: Exclusions::parse(&["team".into()]).unwrap(),
    };
    let s = service_of(&World::new(vec![m]).desired(None));
    assert_eq!(label(&s, "app"), None);
    assert_eq!(annotation(&s, "team"), None);
}

#[test]
fn ports_union_table() {
    let m = |c: &str, t: i64, ports: &[(&str, i32)]| member(Some(c), at(t), svc("web", ports, &[]));
    // (members, union as (name, port), conflicts)
    type Row = (&'static str, Vec<Member>, Vec<(&'static str, i32)>, usize);
    let table: Vec<Row> = vec![
        (
            "equal",
            vec![m("a", 1, &[("http", 80)]), m("b", 2, &[("http", 80)])],
            vec![("http", 80)],
            0,
        ),
        (
            "disjoint: union",
            vec![m("a", 1, &[("http", 80)]), m("b", 2, &[("grpc", 90)])],
            vec![("http", 80), ("grpc", 90)],
            0,
        ),
        (
            "same name, other number: primary's, conflict",
            vec![m("a", 1, &[("http", 80)]), m("b", 2, &[("http", 8080)])],
            vec![("http", 80)],
            1,
        ),
        (
            "same number, other name: conflict",
            vec![m("a", 1, &[("http", 80)]), m("b", 2, &[("web", 80)])],
            vec![("http", 80)],
            1,
        ),
        (
            "the oldest decides, whatever the order",
            vec![m("b", 2, &[("http", 8080)]), m("a", 1, &[("http", 80)])],
            vec![("http", 80)],
            1,
        ),
        (
            "unnamed cannot join named",
            vec![m("a", 1, &[("http", 80)]), m("b", 2, &[("", 90)])],
            vec![("http", 80)],
            1,
        ),
        (
            "unnamed alone",
            vec![m("a", 1, &[("", 80)]), m("b", 2, &[("", 80)])],
            vec![("", 80)],
            0,
        ),
    ];
    for (what, members, want, conflicts) in table {
        let d = World::new(members).desired(None);
        let got: Vec<(String, i32)> = service_of(&d)
            .spec
            .unwrap()
            .ports
            .unwrap()
            .iter()
            .map(|p| (p.name.clone().unwrap_or_default(), p.port))
            .collect();
        let want: Vec<(String, i32)> = want.iter().map(|(n, p)| ((*n).into(), *p)).collect();
        assert_eq!(got, want, "{what}");
        assert_eq!(d.conflicts.len(), conflicts, "{what}: {:?}", d.conflicts);
    }
}

#[test]
fn headless_and_portless_members_refused_others_unaffected() {
    let mut headless = web(Some("east"), at(1), "e");
    headless.service.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    let portless = member(Some("south"), at(0), svc("web", &[], &[]));
    let d = World::new(vec![headless, portless, web(Some("north"), at(2), "n")]).desired(None);
    assert_eq!(
        d.refused,
        vec![
            ("web@east".to_owned(), MemberRefusal::Headless),
            ("web@south".to_owned(), MemberRefusal::NoPorts)
        ]
    );
    let s = service_of(&d);
    assert_eq!(
        annotation(&s, REMOTE_DISCOVERY_ANNOTATION).as_deref(),
        Some("web@north")
    );
    assert_eq!(label(&s, "app").as_deref(), Some("n"));
    assert_eq!(MemberRefusal::Headless.reason(), "InvalidService");
    assert!(MemberRefusal::Headless.detail().contains("headless"));
}

#[test]
fn only_refused_members_give_no_service() {
    let mut headless = web(Some("east"), at(1), "e");
    headless.service.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    let d = World::new(vec![headless]).desired(None);
    assert_eq!(d.service, DesiredService::Absent);
    assert_eq!(d.refused.len(), 1);
}

#[test]
fn pending_cluster_entries_are_kept() {
    let table: Vec<(&str, World, Option<&str>, Option<&str>)> = vec![
        (
            "pending entry kept beside a live one",
            World::new(vec![web(Some("north"), at(2), "n")]).pending("east"),
            Some("web@east,web@north"),
            Some("web@east,web@north"),
        ),
        (
            "an entry of a cluster no longer linked goes",
            World::new(vec![web(Some("north"), at(2), "n")]),
            Some("web@east,web@north"),
            Some("web@north"),
        ),
        (
            "pending without stored entry adds nothing",
            World::new(vec![web(Some("north"), at(2), "n")]).pending("east"),
            None,
            Some("web@north"),
        ),
    ];
    for (what, world, stored, want) in table {
        let s = match world.desired(stored).service {
            DesiredService::Present(s) => *s,
            // The stored Service is kept while a stored entry's cluster is pending.
            DesiredService::Keep => {
                assert_eq!(stored, want, "{what}");
                continue;
            }
            DesiredService::Absent => panic!("{what}"),
        };
        assert_eq!(
            annotation(&s, REMOTE_DISCOVERY_ANNOTATION).as_deref(),
            want,
            "{what}"
        );
    }
    let only_pending = World::new(vec![]).pending("east").desired(Some("web@east"));
    assert_eq!(only_pending.service, DesiredService::Keep);
    let none = World::new(vec![]).desired(Some("web@east"));
    assert_eq!(none.service, DesiredService::Absent);
}

#[test]
fn slices_per_remote_cluster_point_at_its_gateway() {
    let d = World::new(vec![
        web(Some("east"), at(1), "e"),
        web(Some("north"), at(2), "n"),
        web(None, None, "l"),
    ])
    .gw("east", gw("198.18.1.1", true))
    .gw("north", gw("198.18.2.1", false))
    .desired(None);
    assert_eq!(d.slices.len(), 2, "one per remote cluster, none for local");
    let east = &d.slices[0];
    assert_eq!(
        east.metadata.name.as_deref(),
        Some("web-federated-east-ipv4-0")
    );
    let labels = east.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[SERVICE_NAME_LABEL], "web-federated");
    assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY_VALUE);
    assert_eq!(labels[FEDERATED_CLUSTER_LABEL], "east");
    assert!(!labels.contains_key(MIRRORED_SERVICE_LABEL));
    assert!(is_owned_federated(&east.metadata, NS));
    let ann = east.metadata.annotations.as_ref().unwrap();
    assert_eq!(
        ann[REMOTE_SVC_FQ_NAME_ANNOTATION],
        "web.shop.svc.cluster.local"
    );
    assert_eq!(ann[REMOTE_GATEWAY_IDENTITY_ANNOTATION], "gw.id");
    assert_eq!(east.endpoints[0].addresses, ["198.18.1.1"]);
    assert_eq!(
        east.endpoints[0].conditions.as_ref().unwrap().ready,
        Some(true)
    );
    let port = &east.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.port),
        (Some("http"), Some(4143))
    );
    let north = &d.slices[1];
    assert_eq!(
        north.endpoints[0].conditions.as_ref().unwrap().ready,
        Some(false)
    );
}

#[test]
fn dual_stack_gateway_gives_one_slice_per_family() {
    let g = ResolvedGateway::new(
        [
            "2001:db8::1".parse().unwrap(),
            "198.18.1.1".parse().unwrap(),
        ],
        4143,
    );
    let d = World::new(vec![web(Some("east"), at(1), "e")])
        .gw("east", g)
        .desired(None);
    let types: Vec<&str> = d.slices.iter().map(|s| s.address_type.as_str()).collect();
    assert_eq!(types, ["IPv4", "IPv6"]);
    assert!(
        !d.slices[0]
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(REMOTE_GATEWAY_IDENTITY_ANNOTATION)
    );
}

#[test]
fn create_then_slices_once_the_service_has_a_uid() {
    let d = World::new(vec![web(Some("east"), at(1), "e")])
        .gw("east", gw("198.18.1.1", true))
        .desired(None);
    let first = plan_federated(&d, None, &[], NS);
    assert!(matches!(
        first.actions.as_slice(),
        [Action::Create(Object::Service(_))]
    ));
    let svc = stored(service_of(&d));
    let second = plan_federated(&d, Some(&svc), &[], NS);
    match second.actions.as_slice() {
        [Action::Create(Object::EndpointSlice(s))] => {
            let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.uid.as_str()),
                ("Service", "uid-1")
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn equal_inputs_give_no_action() {
    let world = World::new(vec![
        web(Some("east"), at(1), "e"),
        web(Some("north"), at(2), "n"),
        web(None, None, "l"),
    ])
    .gw("east", gw("198.18.1.1", true))
    .gw("north", gw("198.18.2.1", true));
    let d = world.desired(None);
    let svc = stored(service_of(&d));
    let slices = stored_slices(&d);
    assert_eq!(slices.len(), 2);
    let again = world.desired(annotation(&svc, REMOTE_DISCOVERY_ANNOTATION).as_deref());
    assert_eq!(again, d);
    assert_eq!(
        plan_federated(&again, Some(&svc), &slices, NS),
        FederatedPlan::default()
    );
}

#[test]
fn membership_changes_update_the_annotation() {
    let two = World::new(vec![
        web(Some("east"), at(1), "e"),
        web(Some("north"), at(2), "n"),
    ]);
    let svc = stored(service_of(&two.desired(None)));
    let one = World::new(vec![web(Some("north"), at(2), "n")]).desired(Some("web@east,web@north"));
    match plan_federated(&one, Some(&svc), &[], NS).actions.as_slice() {
        [Action::Update(Object::Service(u))] => {
            assert_eq!(
                annotation(u, REMOTE_DISCOVERY_ANNOTATION).as_deref(),
                Some("web@north")
            );
            assert_eq!(u.metadata.resource_version.as_deref(), Some("7"));
            // The oldest remaining member now gives the metadata.
            assert_eq!(label(u, "app").as_deref(), Some("n"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn last_member_leaving_deletes_slices_then_service_with_preconditions() {
    let world = World::new(vec![web(Some("east"), at(1), "e")]).gw("east", gw("198.18.1.1", true));
    let d = world.desired(None);
    let svc = stored(service_of(&d));
    let slices = stored_slices(&d);
    let gone = World::new(vec![]).desired(Some("web@east"));
    let plan = plan_federated(&gone, Some(&svc), &slices, NS);
    match plan.actions.as_slice() {
        [
            Action::Delete(ObjectRef {
                kind: ObjectKind::EndpointSlice,
                uid: su,
                ..
            }),
            Action::Delete(ObjectRef {
                kind: ObjectKind::Service,
                uid,
                resource_version,
                ..
            }),
        ] => {
            assert_eq!(su.as_deref(), Some("s-web-federated-east-ipv4-0"));
            assert_eq!(uid.as_deref(), Some("uid-1"));
            assert_eq!(resource_version.as_deref(), Some("7"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn foreign_federated_service_is_never_touched() {
    let d = World::new(vec![web(Some("east"), at(1), "e")]).desired(None);
    let mut linkerds = stored(service_of(&d));
    // Linkerd's: mirrored-service, no ownership mark of ours.
    linkerds
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(FEDERATED_LABEL);
    let plan = plan_federated(&d, Some(&linkerds), &[], NS);
    assert_eq!(plan.actions, vec![]);
    assert!(plan.foreign);
    // Another controller's (other namespace): same.
    let mut other = stored(service_of(&d));
    other
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(CONTROLLER_NAMESPACE_ANNOTATION.into(), "other".into());
    assert!(plan_federated(&d, Some(&other), &[], NS).foreign);
    // No member left: a foreign one is not deleted, nor reported.
    let gone = World::new(vec![]).desired(None);
    assert_eq!(
        plan_federated(&gone, Some(&linkerds), &[], NS),
        FederatedPlan::default()
    );
}

#[test]
fn gateway_moves_and_verdicts_update_slices_only() {
    let base = World::new(vec![web(Some("east"), at(1), "e")]).gw("east", gw("198.18.1.1", true));
    let d = base.desired(None);
    let svc = stored(service_of(&d));
    let slices = stored_slices(&d);
    let table = [
        ("moved", gw("198.18.1.9", true), "198.18.1.9", true),
        ("dead", gw("198.18.1.1", false), "198.18.1.1", false),
    ];
    for (what, g, ip, ready) in table {
        let w = World::new(vec![web(Some("east"), at(1), "e")]).gw("east", g);
        let d = w.desired(Some("web@east"));
        match plan_federated(&d, Some(&svc), &slices, NS)
            .actions
            .as_slice()
        {
            [Action::Update(Object::EndpointSlice(s))] => {
                assert_eq!(s.endpoints[0].addresses, [ip], "{what}");
                let c = s.endpoints[0].conditions.as_ref().unwrap();
                assert_eq!(c.ready, Some(ready), "{what}");
                assert_eq!(s.metadata.resource_version.as_deref(), Some("3"), "{what}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[test]
fn a_member_address_failing_its_own_probes_goes_not_ready_alone() {
    let two = |alive: bool, dead: &[&str]| {
        ResolvedGateway::new(
            ["198.18.1.1".parse().unwrap(), "198.18.1.2".parse().unwrap()],
            4143,
        )
        .with_alive(alive)
        .with_dead(dead.iter().map(|a| a.parse().unwrap()))
    };
    type Row<'a> = (&'a str, ResolvedGateway, [bool; 2]);
    let table: [Row; 4] = [
        ("both alive", two(true, &[]), [true, true]),
        ("the second dead", two(true, &["198.18.1.2"]), [true, false]),
        ("the first dead", two(true, &["198.18.1.1"]), [false, true]),
        (
            "both dead: the gateway too",
            two(false, &["198.18.1.1", "198.18.1.2"]),
            [false, false],
        ),
    ];
    for (what, g, want) in table {
        let d = World::new(vec![web(Some("east"), at(1), "e")])
            .gw("east", g)
            .desired(None);
        let slice = &d.slices[0];
        let got: Vec<(String, bool, bool)> = slice
            .endpoints
            .iter()
            .map(|e| {
                let c = e.conditions.as_ref().unwrap();
                (e.addresses[0].clone(), c.ready.unwrap(), c.serving.unwrap())
            })
            .collect();
        let want: Vec<(String, bool, bool)> = ["198.18.1.1", "198.18.1.2"]
            .iter()
            .zip(want)
            .map(|(a, r)| (a.to_string(), r, r))
            .collect();
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn slices_of_pending_or_unreported_clusters_are_untouched() {
    let w = World::new(vec![
        web(Some("east"), at(1), "e"),
        web(Some("north"), at(2), "n"),
    ])
    .gw("east", gw("198.18.1.1", true))
    .gw("north", gw("198.18.2.1", true));
    let d = w.desired(None);
    let svc = stored(service_of(&d));
    let slices = stored_slices(&d);
    // After a restart: north's gateway not reported yet, east not listed yet.
    let w = World::new(vec![web(Some("north"), at(2), "n")]).pending("east");
    let d = w.desired(Some("web@east,web@north"));
    assert!(d.untouched_slices.contains("east") && d.untouched_slices.contains("north"));
    let plan = plan_federated(&d, Some(&svc), &slices, NS);
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    // A cluster that left (not pending, no member): its slice goes.
    let w = World::new(vec![web(Some("north"), at(2), "n")]).gw("north", gw("198.18.2.1", true));
    let d = w.desired(Some("web@east,web@north"));
    let deletes: Vec<_> = plan_federated(&d, Some(&svc), &slices, NS)
        .actions
        .into_iter()
        .filter_map(|a| match a {
            Action::Delete(ObjectRef {
                kind: ObjectKind::EndpointSlice,
                name,
                ..
            }) => Some(name),
            _ => None,
        })
        .collect();
    assert_eq!(deletes, ["web-federated-east-ipv4-0"]);
}

#[test]
fn foreign_slices_are_ignored() {
    let w = World::new(vec![web(Some("east"), at(1), "e")]).gw("east", gw("198.18.1.1", true));
    let d = w.desired(None);
    let svc = stored(service_of(&d));
    let mut slices = stored_slices(&d);
    slices[0]
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(CONTROLLER_NAMESPACE_ANNOTATION.into(), "other".into());
    slices[0].metadata.name = Some("someone-elses".into());
    let plan = plan_federated(&d, Some(&svc), &slices, NS);
    // Ours is created; theirs neither updated nor deleted.
    assert!(matches!(
        plan.actions.as_slice(),
        [Action::Create(Object::EndpointSlice(_))]
    ));
}

#[test]
fn entries_parse_table() {
    let table: Vec<(Option<&str>, Vec<&str>)> = vec![
        (None, vec![]),
        (Some(""), vec![]),
        (Some("web@east"), vec!["web@east"]),
        (Some("web@north, web@east,,"), vec!["web@east", "web@north"]),
    ];
    for (input, want) in table {
        let got: Vec<String> = entries(input).into_iter().collect();
        assert_eq!(got, want, "{input:?}");
    }
}

#[test]
fn a_pending_cluster_with_a_known_member_does_not_freeze_the_others_changes() {
    let mut north = web(Some("north"), at(2), "n");
    north
        .service
        .spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()
        .push(ServicePort {
            name: Some("grpc".into()),
            port: 90,
            protocol: Some("TCP".into()),
            ..Default::default()
        });
    let east = web(Some("east"), at(1), "e");
    type Row<'a> = (&'a str, World, Option<&'a str>, Option<(&'a str, usize)>);
    let table: Vec<Row> = vec![
        (
            "east pending with its last known member: north's new port lands, east's entry stays",
            World::new(vec![east.clone(), north.clone()]).pending("east"),
            Some("web@east,web@north"),
            Some(("web@east,web@north", 2)),
        ),
        (
            "east pending, its member known, its entry not stored yet: it joins",
            World::new(vec![east.clone(), north.clone()]).pending("east"),
            Some("web@north"),
            Some(("web@east,web@north", 2)),
        ),
        (
            "east pending and unknown (a start): the stored Service is kept",
            World::new(vec![north.clone()]).pending("east"),
            Some("web@east,web@north"),
            None,
        ),
        (
            "both pending, both known: planned",
            World::new(vec![east.clone(), north.clone()])
                .pending("east")
                .pending("north"),
            Some("web@east,web@north"),
            Some(("web@east,web@north", 2)),
        ),
    ];
    for (what, world, stored, want) in table {
        let d = world.desired(stored);
        match want {
            None => assert_eq!(d.service, DesiredService::Keep, "{what}"),
            Some((entries, ports)) => {
                let s = service_of(&d);
                assert_eq!(
                    annotation(&s, REMOTE_DISCOVERY_ANNOTATION).as_deref(),
                    Some(entries),
                    "{what}"
                );
                let got = s.spec.as_ref().unwrap().ports.as_ref().unwrap().len();
                assert_eq!(got, ports, "{what}");
            }
        }
        assert!(d.untouched_slices.contains("east"), "{what}: slices left");
    }
}

#[test]
fn ports_keep_the_members_target_port_as_linkerd_copies_it() {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    // Linkerd's `remapRemoteServicePorts` copies name, protocol, port and targetPort:
    // a member serving 80 from its pods' 8080 gives 80 -> 8080 there too. A port
    // without targetPort gets the apiserver's default (the port), so a stored Service
    // compares equal and an idle federation writes nothing.
    let mut east = svc("web", &[("http", 80), ("admin", 9000)], &[]);
    let ports = east.spec.as_mut().unwrap().ports.as_mut().unwrap();
    ports[0].target_port = Some(IntOrString::Int(8080));
    let mut north = svc("web", &[("grpc", 9090)], &[]);
    north.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].target_port =
        Some(IntOrString::String("grpc-port".into()));
    let d = World::new(vec![
        member(Some("east"), at(1), east),
        member(Some("north"), at(2), north),
    ])
    .desired(None);
    let s = service_of(&d);
    let got: Vec<(Option<String>, i32, Option<IntOrString>)> = s
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.name, p.port, p.target_port))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some("http".into()), 80, Some(IntOrString::Int(8080))),
            (Some("admin".into()), 9000, Some(IntOrString::Int(9000))),
            (
                Some("grpc".into()),
                9090,
                Some(IntOrString::String("grpc-port".into()))
            ),
        ]
    );
    // The slices still carry every port at the gateway's port, by name.
    let d = World::new(vec![member(
        Some("east"),
        at(1),
        svc("web", &[("http", 80)], &[]),
    )])
    .gw("east", gw("192.0.2.1", true))
    .desired(None);
    let ports = d.slices[0].ports.clone().unwrap();
    assert_eq!(
        (ports[0].name.as_deref(), ports[0].port),
        (Some("http"), Some(4143))
    );
}

/// A slice of the local member `web` (kube-controller-manager's), one endpoint.
fn home_slice(ready: bool) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-abcde", "namespace": "shop",
            "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.1.0.5"], "nodeName": "n1",
            "conditions": {"ready": ready, "serving": ready, "terminating": false}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}

fn desired_with(
    w: &World,
    local: Option<&[EndpointSlice]>,
    traffic: &TrafficPolicy,
) -> DesiredFederation {
    desired_federated(
        &FederationInput {
            namespace: "shop",
            name: "web",
            members: &w.members,
            gateways: &w.gateways,
            pending: &w.pending,
            controller_namespace: NS,
            local_slices: local,
            traffic,
        },
        None,
    )
}

/// `cluster`'s slice endpoints' ready flags ("" for the local copies).
fn ready_of(d: &DesiredFederation, cluster: &str) -> Vec<bool> {
    d.slices
        .iter()
        .filter(|s| {
            s.metadata
                .labels
                .as_ref()
                .unwrap()
                .get(FEDERATED_CLUSTER_LABEL)
                .map_or("", String::as_str)
                == cluster
        })
        .flat_map(|s| &s.endpoints)
        .map(|e| e.conditions.as_ref().unwrap().ready.unwrap())
        .collect()
}

#[test]
fn the_local_member_s_endpoints_are_copied_without_a_cluster_label_under_a_name_no_cluster_takes() {
    let w = World::new(vec![web(None, None, "l"), web(Some("east"), at(1), "e")])
        .gw("east", gw("192.0.2.1", true));
    let d = desired_with(&w, Some(&[home_slice(true)]), &TrafficPolicy::default());
    let copy = d
        .slices
        .iter()
        .find(|s| s.metadata.name.as_deref().unwrap().contains(".local-"))
        .expect("a local copy");
    let labels = copy.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[SERVICE_NAME_LABEL], "web-federated");
    assert!(
        !labels.contains_key(CLUSTER_NAME_LABEL),
        "not remote for Linkerd"
    );
    assert!(!labels.contains_key(FEDERATED_CLUSTER_LABEL));
    assert!(is_owned_federated(&copy.metadata, NS));
    assert_eq!(
        copy.metadata.annotations.as_ref().unwrap()[LOCAL_DISCOVERY_ANNOTATION],
        "web"
    );
    assert_eq!(copy.endpoints[0].addresses, vec!["10.1.0.5".to_string()]);
    assert_eq!(copy.ports.as_ref().unwrap()[0].port, Some(8080));
    // A long federated name still gives a valid name of at most 63 characters.
    let long = "w".repeat(60);
    let mut w2 = World::new(vec![member(None, None, svc(&long, &[("http", 80)], &[]))]);
    w2.members[0].service.metadata.name = Some(long.clone());
    let d = desired_federated(
        &FederationInput {
            namespace: "shop",
            name: &long,
            members: &w2.members,
            gateways: &w2.gateways,
            pending: &w2.pending,
            controller_namespace: NS,
            local_slices: Some(&[home_slice(true)]),
            traffic: &TrafficPolicy::default(),
        },
        None,
    );
    let name = d.slices[0].metadata.name.clone().unwrap();
    assert!(name.len() <= 63 && name.contains(".local-"), "{name}");
}

#[test]
fn local_first_federation_stands_remotes_by_while_home_is_ready_and_fails_over_by_priority() {
    let w = World::new(vec![
        web(None, None, "l"),
        web(Some("east"), at(1), "e"),
        web(Some("north"), at(2), "n"),
    ])
    .gw("east", gw("192.0.2.1", true))
    .gw("north", gw("192.0.2.2", true));
    let prio = TrafficPolicy {
        priority: vec!["north".into()],
        ..Default::default()
    };
    let up = [home_slice(true)];
    let down = [home_slice(false)];
    let d = desired_with(&w, Some(&up), &prio);
    assert_eq!(ready_of(&d, ""), vec![true], "home copied as it is");
    assert_eq!(ready_of(&d, "east"), vec![false]);
    assert_eq!(ready_of(&d, "north"), vec![false]);
    let d = desired_with(&w, Some(&down), &prio);
    assert_eq!(ready_of(&d, ""), vec![false]);
    assert_eq!(ready_of(&d, "north"), vec![true], "north first");
    assert_eq!(ready_of(&d, "east"), vec![false]);
    let w_dead = World::new(w.members.clone())
        .gw("east", gw("192.0.2.1", true))
        .gw("north", gw("192.0.2.2", false));
    let d = desired_with(&w_dead, Some(&down), &prio);
    assert_eq!(ready_of(&d, "east"), vec![true], "north dead: east");
    // Spread: every remote alike, home or not.
    let d = desired_with(&w, Some(&up), &TrafficPolicy::spread());
    assert_eq!(ready_of(&d, "east"), vec![true]);
    assert_eq!(ready_of(&d, "north"), vec![true]);
}

#[test]
fn until_home_s_slices_are_listed_the_copies_and_the_remotes_are_left_as_they_are() {
    let w = World::new(vec![web(None, None, "l"), web(Some("east"), at(1), "e")])
        .gw("east", gw("192.0.2.1", true));
    let d = desired_with(&w, None, &TrafficPolicy::default());
    assert!(d.slices.is_empty());
    assert_eq!(
        d.untouched_slices,
        BTreeSet::from([LOCAL_SLICES.to_string(), "east".to_string()])
    );
    // No local member: nothing to count, east serves at once.
    let w = World::new(vec![web(Some("east"), at(1), "e")]).gw("east", gw("192.0.2.1", true));
    let d = desired_with(&w, None, &TrafficPolicy::default());
    assert_eq!(ready_of(&d, "east"), vec![true]);
}

fn verbs(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            Action::Create(o) => {
                format!("create {}", o.metadata().name.clone().unwrap_or_default())
            }
            Action::Update(o) => {
                format!("update {}", o.metadata().name.clone().unwrap_or_default())
            }
            Action::Delete(r) => format!("delete {}", r.name),
        })
        .collect()
}

#[test]
fn the_local_copies_are_planned_kept_while_unlisted_deleted_when_the_member_goes_and_unchanged_input_writes_nothing()
 {
    let home = [home_slice(true)];
    let w = World::new(vec![web(None, None, "l"), web(Some("east"), at(1), "e")])
        .gw("east", gw("192.0.2.1", true));
    let d = desired_with(&w, Some(&home), &TrafficPolicy::default());
    let svc = stored(service_of(&d));
    let slices = stored_slices(&d);
    assert_eq!(slices.len(), 2, "the copy and east's standby");
    // The same input again (a restart): nothing.
    let again = desired_with(&w, Some(&home), &TrafficPolicy::default());
    assert!(
        plan_federated(&again, Some(&svc), &slices, NS)
            .actions
            .is_empty()
    );
    // Home's slices not listed (a restart before its watch lists): nothing either.
    let unlisted = desired_with(&w, None, &TrafficPolicy::default());
    assert!(
        plan_federated(&unlisted, Some(&svc), &slices, NS)
            .actions
            .is_empty()
    );
    // The local member turns headless (refused): its copy goes, east serves.
    let mut refused = w.members.clone();
    refused[0].service.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    let w2 = World::new(refused).gw("east", gw("192.0.2.1", true));
    let d2 = desired_with(&w2, Some(&home), &TrafficPolicy::default());
    let v = verbs(&plan_federated(&d2, Some(&svc), &slices, NS).actions);
    assert!(
        v.iter()
            .any(|a| a.starts_with("delete web-federated.local-")),
        "{v:?}"
    );
    assert!(
        v.iter().any(|a| a == "update web-federated-east-ipv4-0"),
        "{v:?}"
    );
    // The order: east turns ready before the copy goes.
    let east = v
        .iter()
        .position(|a| a.starts_with("update web-federated-east"))
        .unwrap();
    let copy = v
        .iter()
        .position(|a| a.starts_with("delete web-federated.local"))
        .unwrap();
    assert!(east < copy, "{v:?}");
}

#[test]
fn a_port_only_a_remote_member_serves_keeps_that_remote_ready() {
    let mut east = web(Some("east"), at(1), "e");
    east.service.spec.as_mut().unwrap().ports = Some(vec![
        ServicePort {
            name: Some("http".into()),
            port: 80,
            protocol: Some("TCP".into()),
            ..Default::default()
        },
        ServicePort {
            name: Some("grpc".into()),
            port: 9090,
            protocol: Some("TCP".into()),
            ..Default::default()
        },
    ]);
    let w = World::new(vec![web(None, None, "l"), east]).gw("east", gw("192.0.2.1", true));
    // Home (http only) is ready, but grpc has no endpoint of its own: east serves.
    let d = desired_with(&w, Some(&[home_slice(true)]), &TrafficPolicy::default());
    assert_eq!(ready_of(&d, "east"), vec![true]);
}
