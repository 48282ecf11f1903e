//! Table tests of the pure steps of a reconcile: how a plan is grouped for concurrent
//! writes, which plans count for the contention check, what a Link's status says of a
//! key.

use super::apply::{by_mirror, is_delete};
use super::*;
use service_mirror_core::labels::SERVICE_NAME_LABEL;

fn service(name: &str) -> Service {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": "shop"}}))
        .unwrap()
}

fn endpoints(name: &str) -> Endpoints {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": "shop"}}))
        .unwrap()
}

/// A slice `name` of the mirror `of` (by its service-name label, as ours carry).
fn slice(name: &str, of: &str) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "shop", "labels": {SERVICE_NAME_LABEL: of}},
        "addressType": "IPv4", "endpoints": [],
    }))
    .unwrap()
}

fn delete(name: &str) -> Action {
    Action::Delete(service_mirror_core::ObjectRef {
        kind: ObjectKind::Service,
        namespace: "shop".into(),
        name: name.into(),
        uid: None,
        resource_version: Some("3".into()),
    })
}

/// What an action writes, for comparing groups: kind and name.
fn label(a: &Action) -> String {
    let kind = match a.kind() {
        ObjectKind::Service => "svc",
        ObjectKind::Endpoints => "ep",
        ObjectKind::EndpointSlice => "slice",
        ObjectKind::ServiceImport => "import",
    };
    match a {
        Action::Create(o) => format!("+{kind} {}", o.metadata().name.as_deref().unwrap_or("")),
        Action::Update(o) => format!("~{kind} {}", o.metadata().name.as_deref().unwrap_or("")),
        Action::Delete(r) => format!("-{kind} {}", r.name),
    }
}

#[test]
fn a_set_is_written_by_mirror_in_the_plan_order_with_the_deletes_last_in_one_group() {
    // (case, plan, the groups it is written in: kind and name of each write)
    type Case = (&'static str, Vec<Action>, Vec<Vec<&'static str>>);
    let table: Vec<Case> = vec![
        ("an empty plan has no group", vec![], vec![]),
        (
            "one mirror is one group, in the plan's order",
            vec![
                Action::Create(Object::Service(service("db-east"))),
                Action::Create(Object::Endpoints(endpoints("db-east"))),
            ],
            vec![vec!["+svc db-east", "+ep db-east"]],
        ),
        (
            "each mirror's writes together, the mirrors in order of first write",
            vec![
                Action::Update(Object::Service(service("db-0-east"))),
                Action::Create(Object::Service(service("db-1-east"))),
                Action::Update(Object::Endpoints(endpoints("db-0-east"))),
                Action::Create(Object::Endpoints(endpoints("db-1-east"))),
            ],
            vec![
                vec!["~svc db-0-east", "~ep db-0-east"],
                vec!["+svc db-1-east", "+ep db-1-east"],
            ],
        ),
        (
            "a slice goes with the mirror its label names, not its own name",
            vec![
                Action::Create(Object::Service(service("db-0-east"))),
                Action::Create(Object::EndpointSlice(slice("db-0-east-x7k2p", "db-0-east"))),
            ],
            vec![vec!["+svc db-0-east", "+slice db-0-east-x7k2p"]],
        ),
        (
            "the deletes of every mirror come last, in one group in the plan's order",
            vec![
                delete("db-2-east"),
                Action::Update(Object::Service(service("db-0-east"))),
                delete("db-3-east"),
            ],
            vec![
                vec!["~svc db-0-east"],
                vec!["-svc db-2-east", "-svc db-3-east"],
            ],
        ),
    ];
    for (case, plan, want) in table {
        let got: Vec<Vec<String>> = by_mirror(&plan)
            .into_iter()
            .map(|g| g.into_iter().map(label).collect())
            .collect();
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn only_deletes_are_deletes() {
    let table = [
        (Action::Create(Object::Service(service("a"))), false),
        (Action::Update(Object::Endpoints(endpoints("a"))), false),
        (delete("a"), true),
        (
            Action::Delete(service_mirror_core::ObjectRef {
                kind: ObjectKind::Endpoints,
                namespace: "shop".into(),
                name: "a".into(),
                uid: None,
                resource_version: None,
            }),
            true,
        ),
        (
            Action::Delete(service_mirror_core::ObjectRef {
                kind: ObjectKind::EndpointSlice,
                namespace: "shop".into(),
                name: "a".into(),
                uid: None,
                resource_version: None,
            }),
            true,
        ),
    ];
    for (action, want) in table {
        assert_eq!(is_delete(&action), want, "{}", label(&action));
    }
}

fn write(steps: Steps) -> Decision {
    Decision::Write(Writes {
        steps,
        admit: false,
        release_slot: false,
        create_permit: false,
        second_pass: false,
        requeue: None,
        slices_of_new_service: None,
        slices_of_new_members: Vec::new(),
        awaiting_mirroring: false,
    })
}

#[test]
fn only_a_plan_updating_in_its_own_order_counts_for_the_contention_check() {
    let table: Vec<(&str, Decision, bool)> = vec![
        ("waiting", Decision::Wait, false),
        ("pending", Decision::Pending { requeue: None }, false),
        ("nothing to write", write(Steps::InOrder(vec![])), false),
        (
            "creates only",
            write(Steps::InOrder(vec![Action::Create(Object::Service(
                service("a"),
            ))])),
            false,
        ),
        (
            "deletes only",
            write(Steps::InOrder(vec![delete("a")])),
            false,
        ),
        (
            "a Service update",
            write(Steps::InOrder(vec![Action::Update(Object::Service(
                service("a"),
            ))])),
            true,
        ),
        (
            "an Endpoints update among creates",
            write(Steps::InOrder(vec![
                Action::Create(Object::Service(service("b"))),
                Action::Update(Object::Endpoints(endpoints("a"))),
            ])),
            true,
        ),
        (
            "a slice update",
            write(Steps::InOrder(vec![Action::Update(Object::EndpointSlice(
                slice("a-x", "a"),
            ))])),
            true,
        ),
        (
            "the Endpoints-first half of a gateway move",
            write(Steps::EndpointsFirst {
                endpoints: vec![Action::Update(Object::Endpoints(endpoints("a")))],
                service: Box::new(Action::Update(Object::Service(service("a")))),
            }),
            false,
        ),
    ];
    for (case, decision, want) in table {
        assert_eq!(updates(&decision), want, "{case}");
    }
}

fn mirror(name: &str, ip: &str) -> DesiredMirror {
    let mut endpoints = endpoints(name);
    endpoints.subsets = Some(vec![k8s_openapi::api::core::v1::EndpointSubset {
        addresses: Some(vec![k8s_openapi::api::core::v1::EndpointAddress {
            ip: ip.into(),
            ..Default::default()
        }]),
        ..Default::default()
    }]);
    DesiredMirror {
        service: service(name),
        endpoints,
        has_endpoints: true,
        ownership: Default::default(),
    }
}

#[test]
fn a_fingerprint_is_deterministic_and_changes_with_any_desired_object() {
    let a = mirror("web-east", "203.0.113.7");
    let fp = |d: &DesiredMirror, members: Option<&[DesiredMirror]>| fingerprint(Some(d), members);
    assert_eq!(fp(&a, None), fp(&a.clone(), None), "deterministic");
    let table: Vec<(&str, u64)> = vec![
        (
            "another address",
            fp(&mirror("web-east", "203.0.113.8"), None),
        ),
        ("another name", fp(&mirror("api-east", "203.0.113.7"), None)),
        ("without endpoints", {
            let mut d = a.clone();
            d.has_endpoints = false;
            fp(&d, None)
        }),
        (
            "with an endpoint mirror",
            fp(&a, Some(&[mirror("db-0-east", "203.0.113.7")])),
        ),
        ("nothing desired", fingerprint(None, None)),
    ];
    for (case, other) in table {
        assert_ne!(fp(&a, None), other, "{case}");
    }
}

#[test]
fn a_links_status_says_what_gather_found_once_the_remote_listed() {
    let gw = || service_mirror_core::GatewayRef::new("gw-ns", "gw");
    let listed = |export: Option<ExportDecision>, desired: Option<DesiredMirror>| Gathered {
        remote_listed: true,
        export,
        desired,
        ..Gathered::default()
    };
    let table: Vec<(&str, Gathered, Option<Observed>)> = vec![
        (
            "not listed: nothing known",
            Gathered {
                remote_listed: false,
                export: Some(ExportDecision::Mirror(gw())),
                ..Gathered::default()
            },
            None,
        ),
        (
            "mirrored as its desired mirror",
            listed(
                Some(ExportDecision::Mirror(gw())),
                Some(mirror("web-east", "203.0.113.7")),
            ),
            Some(Observed::Mirrored {
                local: "web-east".into(),
            }),
        ),
        (
            "remote discovery is mirrored too",
            listed(
                Some(ExportDecision::RemoteDiscovery),
                Some(mirror("web-east", "203.0.113.7")),
            ),
            Some(Observed::Mirrored {
                local: "web-east".into(),
            }),
        ),
        (
            "refused: invalid, with the reason",
            listed(
                Some(ExportDecision::Refused {
                    gateway: gw(),
                    reason: service_mirror_core::Refusal::NoPorts,
                }),
                None,
            ),
            Some(Observed::Invalid(
                service_mirror_core::Refusal::NoPorts.describe().into(),
            )),
        ),
        (
            "not exported: gone",
            listed(Some(ExportDecision::NotExported), None),
            Some(Observed::Gone),
        ),
        (
            "no decision: gone",
            listed(None, None),
            Some(Observed::Gone),
        ),
    ];
    for (case, g, want) in table {
        assert_eq!(observed(&g), want, "{case}");
    }
}
