use super::*;
use crate::mcs::resource::{ServiceExportSpec, ServiceExportStatus};
use k8s_openapi::api::core::v1::ServiceSpec;
use kube::api::ObjectMeta;
use service_mirror_core::mcs::{Conflict, ImportPort};
use service_mirror_core::mcs_derived::desired_derived_service;
use service_mirror_core::traffic::TrafficPolicy;
use service_mirror_core::{Object, ObjectKind};

const CTL: &str = "sm";

fn key() -> ServiceKey {
    ServiceKey::new("shop", "hello")
}

fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|c| (*c).into()).collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|c| (*c).into()).collect()
}

fn spec(type_: ImportType) -> ImportSpec {
    ImportSpec {
        type_,
        ports: vec![ImportPort {
            name: "http".into(),
            protocol: "TCP".into(),
            port: 80,
            app_protocol: None,
        }],
        session_affinity: None,
        session_affinity_config: None,
        internal_traffic_policy: None,
        traffic_distribution: None,
        ip_families: vec!["IPv4".into()],
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
    }
}

/// The merge of a name exported validly by `clusters` (none: no import), with
/// `conflicts`.
fn merged(clusters: &[&str], conflicts: &[Conflict]) -> Merge {
    Merge {
        import: (!clusters.is_empty()).then(|| spec(ImportType::ClusterSetIp)),
        clusters: names(clusters),
        conflicts: conflicts.iter().copied().collect(),
    }
}

// ---- the export's status ----

fn export(uid: &str, rv: &str, conditions: Vec<Condition>) -> ServiceExport {
    ServiceExport {
        metadata: ObjectMeta {
            name: Some("hello".into()),
            namespace: Some("shop".into()),
            uid: Some(uid.into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        },
        spec: ServiceExportSpec::default(),
        status: Some(ServiceExportStatus {
            conditions: Some(conditions),
        }),
    }
}

/// The local cluster's export, its Service of `type_` (`None`: no Service).
fn local(type_: Option<&str>) -> ClusterExport {
    ClusterExport {
        cluster: "west".into(),
        created: Timestamp::UNIX_EPOCH,
        exported_labels: BTreeMap::new(),
        exported_annotations: BTreeMap::new(),
        service: type_.map(|t| Service {
            spec: Some(ServiceSpec {
                type_: Some(t.into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        export_to: ExportTo::Every,
    }
}

fn facts<'a>(
    export: Option<&'a ServiceExport>,
    local: Option<&'a ClusterExport>,
    merged: &'a Merge,
    last: Option<&'a (Option<String>, Verdict)>,
) -> ExportFacts<'a> {
    ExportFacts {
        export,
        local,
        merged,
        last,
        written: None,
        leading: true,
        now: Timestamp::UNIX_EPOCH,
    }
}

fn judged(step: ExportStep) -> ExportJudgement {
    match step {
        ExportStep::Judged(j) => j,
        other => panic!("not judged: {other:?}"),
    }
}

fn event(j: &ExportJudgement) -> Option<(EventType, &'static str)> {
    j.event.as_ref().map(|t| (t.type_, t.reason))
}

fn types(conditions: &[Condition]) -> Vec<(&str, &str, &str)> {
    conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
        .collect()
}

#[test]
fn no_local_export_forgets_its_verdict_and_last_write() {
    let m = merged(&["east"], &[]);
    let last = (Some("u1".into()), Verdict::Exported);
    assert_eq!(
        decide_export(&facts(None, None, &m, Some(&last))),
        ExportStep::Forget
    );
}

#[test]
fn a_local_export_not_among_the_listed_exports_is_left_alone() {
    let (e, m) = (export("u1", "7", vec![]), merged(&["east"], &[]));
    assert_eq!(
        decide_export(&facts(Some(&e), None, &m, None)),
        ExportStep::Nothing
    );
}

/// A name, the local export, the merge, the verdict before, the verdict, the Event.
type VerdictCase<'a> = (
    &'static str,
    &'a ClusterExport,
    &'a Merge,
    Option<Verdict>,
    Verdict,
    Option<(EventType, &'static str)>,
);

#[test]
fn each_verdict_is_remembered_and_told_once_and_a_first_clean_one_is_not_told() {
    let clean = merged(&["east", "west"], &[]);
    let conflict = merged(&["east", "west"], &[Conflict::Port, Conflict::Type]);
    let none = merged(&[], &[]);
    let e = export("u1", "7", vec![]);
    let (valid, absent, external) = (
        local(Some("ClusterIP")),
        local(None),
        local(Some("ExternalName")),
    );
    let conflicted = Verdict::Conflict("PortConflict,TypeConflict".into());
    let cases: Vec<VerdictCase> = vec![
        ("first clean", &valid, &clean, None, Verdict::Exported, None),
        (
            "clean again",
            &valid,
            &clean,
            Some(Verdict::Exported),
            Verdict::Exported,
            None,
        ),
        (
            "conflict",
            &valid,
            &conflict,
            None,
            conflicted.clone(),
            Some((EventType::Warning, "ExportConflict")),
        ),
        (
            "same conflict again",
            &valid,
            &conflict,
            Some(conflicted.clone()),
            conflicted.clone(),
            None,
        ),
        (
            "conflict over",
            &valid,
            &clean,
            Some(conflicted.clone()),
            Verdict::Exported,
            Some((EventType::Normal, "Exported")),
        ),
        (
            "no Service",
            &absent,
            &none,
            None,
            Verdict::Invalid("NoService"),
            Some((EventType::Warning, "ExportInvalid")),
        ),
        (
            "ExternalName",
            &external,
            &none,
            Some(Verdict::Invalid("NoService")),
            Verdict::Invalid("InvalidServiceType"),
            Some((EventType::Warning, "ExportInvalid")),
        ),
    ];
    for (name, local, m, before, verdict, told) in cases {
        let last = before.map(|v| (Some("u1".to_string()), v));
        let j = judged(decide_export(&facts(
            Some(&e),
            Some(local),
            m,
            last.as_ref(),
        )));
        assert_eq!(
            j.remember,
            Some((Some("u1".into()), verdict)),
            "{name}: remembered"
        );
        assert_eq!(event(&j), told, "{name}: told");
    }
}

#[test]
fn an_export_made_again_is_told_its_problem_again() {
    let m = merged(&["east", "west"], &[Conflict::Port]);
    let e = export("u2", "9", vec![]);
    let last = (
        Some("u1".to_string()),
        Verdict::Conflict("PortConflict".into()),
    );
    let j = judged(decide_export(&facts(
        Some(&e),
        Some(&local(Some("ClusterIP"))),
        &m,
        Some(&last),
    )));
    assert_eq!(event(&j), Some((EventType::Warning, "ExportConflict")));
    let note = j.event.unwrap().note;
    assert!(note.contains("east, west"), "names the clusters: {note}");
}

#[test]
fn a_replica_that_does_not_lead_neither_remembers_nor_tells_but_still_plans_the_write() {
    let (m, e, l) = (
        merged(&["west"], &[Conflict::Port]),
        export("u1", "7", vec![]),
        local(Some("ClusterIP")),
    );
    let mut f = facts(Some(&e), Some(&l), &m, None);
    f.leading = false;
    let j = judged(decide_export(&f));
    assert_eq!((j.remember, j.event), (None, None));
    assert!(j.conditions.is_some());
}

#[test]
fn conditions_are_written_unless_they_say_so_or_our_last_write_has_not_come_back() {
    let (m, l) = (merged(&["west"], &[]), local(Some("ClusterIP")));
    let e = export("u1", "7", vec![]);
    let first = judged(decide_export(&facts(Some(&e), Some(&l), &m, None)));
    let ours = first.conditions.clone().expect("first write");
    assert_eq!(
        types(&ours),
        [
            ("Valid", "True", "Valid"),
            ("Ready", "True", "Exported"),
            ("Conflict", "False", "NoConflicts")
        ]
    );
    // Our write came back: nothing more to write.
    let stored = export("u1", "8", ours.clone());
    let again = judged(decide_export(&facts(Some(&stored), Some(&l), &m, None)));
    assert_eq!(again.conditions, None);
    // Our write is not back yet (the cache shows the version we wrote over).
    let mut f = facts(Some(&e), Some(&l), &m, None);
    let rv = "7".to_string();
    f.written = Some(&rv);
    assert_eq!(judged(decide_export(&f)).conditions, None);
}

#[test]
fn only_our_condition_types_are_written_and_another_writers_are_left_out() {
    let (m, l) = (merged(&["west"], &[]), local(Some("ClusterIP")));
    let theirs = Condition {
        type_: "example.com/Audited".into(),
        status: "True".into(),
        reason: "Theirs".into(),
        message: String::new(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::UNIX_EPOCH,
        ),
        observed_generation: None,
    };
    let e = export("u1", "7", vec![theirs]);
    let j = judged(decide_export(&facts(Some(&e), Some(&l), &m, None)));
    let written = j.conditions.expect("ours differ");
    assert_eq!(written.len(), 3, "{written:?}");
    assert!(
        written
            .iter()
            .all(|c| EXPORT_CONDITION_TYPES.contains(&c.type_.as_str())),
        "{written:?}"
    );
}

// ---- which clusters settled ----

fn settling<'a>(
    feeds: &[(&str, bool)],
    expected: Option<&'a BTreeSet<String>>,
    removed: &'a BTreeSet<String>,
) -> Settling<'a> {
    Settling {
        feeds: feeds.iter().map(|(c, n)| ((*c).into(), *n)).collect(),
        local: "west",
        expected,
        removed,
    }
}

#[test]
fn a_cluster_settles_when_it_counts_or_is_known_gone_and_a_running_feed_decides() {
    let expected = set(&["west", "east", "north"]);
    let removed = set(&["south", "north"]);
    let s = settling(
        &[("west", true), ("east", false), ("north", false)],
        Some(&expected),
        &removed,
    );
    let cases = [
        ("west", true),   // counts
        ("east", false),  // a feed not listed yet
        ("north", false), // removed, but a new feed runs: it decides
        ("south", true),  // link removed, no feed
        ("gone", true),   // named by no link source
    ];
    for (cluster, want) in cases {
        assert_eq!(s.settled(cluster), want, "{cluster}");
    }
    // Before the link sources are listed, a cluster with no feed may still come.
    let none = BTreeSet::new();
    let early = settling(&[("west", true)], None, &none);
    assert!(!early.settled("east"));
    assert!(early.settled("west"));
}

/// A name, the expected clusters, the feeds (counting or not), all settled.
type SettleCase<'a> = (
    &'static str,
    Option<&'a BTreeSet<String>>,
    &'a [(&'a str, bool)],
    bool,
);

#[test]
fn all_settle_only_once_the_sources_are_listed_and_every_linked_feed_counts() {
    let none = BTreeSet::new();
    let expected = set(&["west", "east"]);
    let cases: [SettleCase; 5] = [
        ("sources not listed", None, &[("west", true)], false),
        (
            "every feed counts",
            Some(&expected),
            &[("west", true), ("east", true)],
            true,
        ),
        (
            "an expected cluster has no feed",
            Some(&expected),
            &[("west", true)],
            false,
        ),
        (
            "a linked feed not listed",
            Some(&expected),
            &[("west", true), ("east", true), ("extra", false)],
            false,
        ),
        (
            "an expected cluster's own feed not listed",
            Some(&expected),
            &[("west", false), ("east", true)],
            false,
        ),
    ];
    for (name, expected, feeds, want) in cases {
        assert_eq!(
            settling(feeds, expected, &none).all_settled(),
            want,
            "{name}"
        );
    }
    // An unlisted local feed does not count against the linked ones.
    let only_east = set(&["east"]);
    let s = settling(&[("west", false), ("east", true)], Some(&only_east), &none);
    assert!(s.all_settled());
}

// ---- the import ----

fn stored(owned: bool, clusters: &[&str]) -> StoredImport {
    StoredImport {
        owned,
        clusters: names(clusters),
    }
}

#[test]
fn what_becomes_of_the_import_of_each_case() {
    let expected = set(&["west", "east", "north"]);
    let none = BTreeSet::new();
    // west and east count; north's feed has not listed.
    let s = settling(
        &[("west", true), ("east", true), ("north", false)],
        Some(&expected),
        &none,
    );
    let write = |keep: &[&str]| ImportPlan::Write {
        spec: spec(ImportType::ClusterSetIp),
        keep: set(keep),
    };
    let cases: Vec<(&str, Option<StoredImport>, Merge, ImportPlan)> = vec![
        (
            "another's import, exported",
            Some(stored(false, &["east"])),
            merged(&["east"], &[]),
            ImportPlan::Foreign,
        ),
        (
            "another's import, no export",
            Some(stored(false, &[])),
            merged(&[], &[]),
            ImportPlan::Foreign,
        ),
        (
            "no export, no import: stray slices and Service go",
            None,
            merged(&[], &[]),
            ImportPlan::Remove { import: false },
        ),
        (
            "no export, every listed cluster counts",
            Some(stored(true, &["east", "west"])),
            merged(&[], &[]),
            ImportPlan::Remove { import: true },
        ),
        (
            "no export, a listed cluster not settled",
            Some(stored(true, &["east", "north"])),
            merged(&[], &[]),
            ImportPlan::Keep {
                unsettled: names(&["north"]),
            },
        ),
        (
            "no export, no cluster listed while one is unsettled",
            Some(stored(true, &[])),
            merged(&[], &[]),
            ImportPlan::Keep { unsettled: vec![] },
        ),
        ("new import", None, merged(&["east"], &[]), write(&[])),
        (
            "a settled cluster leaving loses its slices",
            Some(stored(true, &["east", "west"])),
            merged(&["east"], &[]),
            write(&[]),
        ),
        (
            "an unsettled cluster leaving keeps them",
            Some(stored(true, &["east", "north"])),
            merged(&["east"], &[]),
            write(&["north"]),
        ),
        (
            "an unsettled cluster still exporting is not kept apart",
            Some(stored(true, &["north"])),
            merged(&["north"], &[]),
            write(&[]),
        ),
    ];
    for (name, stored, m, want) in cases {
        assert_eq!(decide_import(stored.as_ref(), &m, &s), want, "{name}");
    }
}

#[test]
fn an_import_naming_no_cluster_goes_once_every_cluster_settled() {
    let expected = set(&["west", "east"]);
    let none = BTreeSet::new();
    let s = settling(&[("west", true), ("east", true)], Some(&expected), &none);
    assert_eq!(
        decide_import(Some(&stored(true, &[])), &merged(&[], &[]), &s),
        ImportPlan::Remove { import: true }
    );
}

// ---- the derived Service ----

#[test]
fn the_derived_service_is_created_kept_updated_or_recreated_and_anothers_left_alone() {
    let k = key();
    let clusterset = desired_derived_service(&k, &spec(ImportType::ClusterSetIp), CTL);
    let headless = desired_derived_service(&k, &spec(ImportType::Headless), CTL);
    let mut more_ports = spec(ImportType::ClusterSetIp);
    more_ports.ports.push(ImportPort {
        name: "dns".into(),
        protocol: "UDP".into(),
        port: 53,
        app_protocol: None,
    });
    let wider = desired_derived_service(&k, &more_ports, CTL);
    assert_eq!(
        decide_derived(None, false, &clusterset),
        DerivedStep::Create
    );
    assert_eq!(
        decide_derived(Some(&clusterset), false, &clusterset),
        DerivedStep::Foreign
    );
    assert_eq!(
        decide_derived(Some(&clusterset), true, &clusterset),
        DerivedStep::Ours(DerivedAction::Nothing)
    );
    assert!(matches!(
        decide_derived(Some(&clusterset), true, &wider),
        DerivedStep::Ours(DerivedAction::Update(_))
    ));
    for (from, to) in [(&clusterset, &headless), (&headless, &clusterset)] {
        assert_eq!(
            decide_derived(Some(from), true, to),
            DerivedStep::Ours(DerivedAction::Recreate),
            "headless and not cannot change in place"
        );
    }
}

// ---- the slices ----

/// A slice of the local exported Service `hello` by kube-controller-manager.
fn local_slice() -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hello-abc", "namespace": "shop", "uid": "u-abc",
            "labels": {"kubernetes.io/service-name": "hello"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.0.9"], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}

struct Slices {
    key: ServiceKey,
    listed: bool,
    spec: Option<ImportSpec>,
    clusters: Vec<String>,
    keep: BTreeSet<String>,
    uid: Option<String>,
    local: Option<Vec<EndpointSlice>>,
    stored: Vec<EndpointSlice>,
}

impl Slices {
    /// The import of `hello` exported by this cluster (west), its slices listed.
    fn new() -> Self {
        Self {
            key: key(),
            listed: true,
            spec: Some(spec(ImportType::ClusterSetIp)),
            clusters: names(&["west"]),
            keep: BTreeSet::new(),
            uid: Some("import-uid".into()),
            local: Some(vec![local_slice()]),
            stored: vec![],
        }
    }

    fn decide(&self) -> Option<Vec<Action>> {
        let gateways = BTreeMap::new();
        decide_slices(SliceFacts {
            key: &self.key,
            listed: self.listed,
            spec: self.spec.as_ref(),
            clusters: &self.clusters,
            keep: self.keep.clone(),
            import_uid: self.uid.as_deref(),
            local_slices: self.local.as_deref(),
            gateways: &gateways,
            local_cluster: "west",
            controller_namespace: CTL,
            stored: &self.stored,
            traffic: &TrafficPolicy::spread(),
        })
    }

    /// The slices a first pass creates, as stored.
    fn created(&self) -> Vec<EndpointSlice> {
        self.decide()
            .unwrap()
            .into_iter()
            .map(|a| match a {
                Action::Create(Object::EndpointSlice(s)) => s,
                other => panic!("not a create: {other:?}"),
            })
            .collect()
    }
}

fn verbs(actions: &[Action]) -> Vec<&'static str> {
    actions
        .iter()
        .map(|a| match a {
            Action::Create(Object::EndpointSlice(_)) => "create",
            Action::Update(Object::EndpointSlice(_)) => "update",
            Action::Delete(r) if r.kind == ObjectKind::EndpointSlice => "delete",
            _ => "other",
        })
        .collect()
}

#[test]
fn no_slice_is_planned_before_our_slices_list_or_before_a_new_import_is_seen() {
    let mut s = Slices::new();
    s.listed = false;
    assert_eq!(s.decide(), None);
    let mut s = Slices::new();
    s.uid = None;
    assert_eq!(s.decide(), None, "a new import's slices come with its uid");
}

#[test]
fn a_clusterset_import_gets_slices_owned_by_it_and_a_second_pass_writes_nothing() {
    let mut s = Slices::new();
    let created = s.created();
    assert_eq!(created.len(), 1);
    let owner = &created[0].metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("ServiceImport", "hello", "import-uid")
    );
    assert_eq!(owner.controller, Some(true));
    s.stored = created;
    assert_eq!(s.decide(), Some(vec![]));
}

#[test]
fn slices_go_with_the_import_when_it_turns_headless_and_when_no_cluster_exports() {
    let mut s = Slices::new();
    s.stored = s.created();
    let mut headless = Slices {
        spec: Some(spec(ImportType::Headless)),
        ..Slices::new()
    };
    headless.stored = s.stored.clone();
    assert_eq!(verbs(&headless.decide().unwrap()), ["delete"]);
    // No import of ours (gone, or another's): every slice of ours of the name goes,
    // whatever the uid.
    for uid in [None, Some("import-uid".to_string())] {
        let gone = Slices {
            spec: None,
            clusters: vec![],
            uid,
            stored: s.stored.clone(),
            ..Slices::new()
        };
        assert_eq!(verbs(&gone.decide().unwrap()), ["delete"]);
    }
}

#[test]
fn a_leaving_cluster_loses_its_slices_unless_it_has_not_settled() {
    let mut s = Slices::new();
    s.stored = s.created();
    // west no longer exports; east does (its gateway not reported: nothing of its).
    s.clusters = names(&["east"]);
    assert_eq!(verbs(&s.decide().unwrap()), ["delete"]);
    s.keep = set(&["west"]);
    assert_eq!(s.decide(), Some(vec![]), "kept as they are");
}

#[test]
fn this_clusters_slices_stay_as_they_are_until_its_services_slices_are_listed() {
    let mut s = Slices::new();
    s.stored = s.created();
    s.local = None;
    assert_eq!(s.decide(), Some(vec![]));
}

#[test]
fn an_export_to_problem_is_an_invalid_annotation_or_a_name_no_feed_or_link_knows() {
    let feeds: BTreeMap<String, bool> = [("west".into(), true), ("east".into(), false)].into();
    let expected = set(&["west", "east", "north"]);
    let only = |names: &[&str]| ExportTo::Only(set(names));
    let reason = |to: &ExportTo, expected: Option<&BTreeSet<String>>| {
        ExportToProblem::of(to, "west", &feeds, expected).map(|p| p.reason)
    };
    // Known: the local cluster, one with a feed (listed or not), one a link names.
    for to in [
        ExportTo::Every,
        only(&[]),
        only(&["west"]),
        only(&["east", "north"]),
    ] {
        assert_eq!(reason(&to, Some(&expected)), None, "{to:?}");
    }
    assert_eq!(
        reason(&only(&["east", "south"]), Some(&expected)),
        Some("ExportToUnknownCluster")
    );
    // Before the link sources are listed no name is called unknown.
    assert_eq!(reason(&only(&["south"]), None), None);
    // Invalid is invalid whatever is known.
    let invalid = ExportTo::parse(Some("east,Bad"));
    for expected in [Some(&expected), None] {
        assert_eq!(reason(&invalid, expected), Some("InvalidExportTo"));
    }
    let note = ExportToProblem::of(&invalid, "west", &feeds, None)
        .unwrap()
        .note;
    assert!(
        note.contains("Bad") && note.contains("no other cluster"),
        "{note}"
    );

    // The note names the unknown names only, at most 10 of them.
    let note = ExportToProblem::of(
        &only(&["east", "south", "zz"]),
        "west",
        &feeds,
        Some(&expected),
    )
    .unwrap()
    .note;
    assert!(note.ends_with("south, zz"), "{note}");
    let many: Vec<String> = (0..25).map(|i| format!("c{i:02}")).collect();
    let many = ExportTo::Only(many.into_iter().collect());
    let note = ExportToProblem::of(&many, "west", &feeds, Some(&expected))
        .unwrap()
        .note;
    assert!(note.contains("c09") && !note.contains("c10"), "{note}");
    assert!(note.ends_with("and 15 more"), "{note}");
}

#[test]
fn an_export_to_problem_is_told_once_per_episode_by_the_leader() {
    let problem = |reason: &'static str, note: &str| ExportToProblem {
        reason,
        note: note.into(),
    };
    let bad = (Some("u1".to_string()), problem("InvalidExportTo", "Bad"));
    let worse = (Some("u1".to_string()), problem("InvalidExportTo", "Worse"));
    let unknown = (
        Some("u1".to_string()),
        problem("ExportToUnknownCluster", "south"),
    );
    let again = (Some("u2".to_string()), problem("InvalidExportTo", "Bad"));
    let tell = |p: &(Option<String>, ExportToProblem)| ExportToStep::Tell(p.clone());
    let cases = [
        // (now, last, leading, step)
        (None, None, true, ExportToStep::Nothing),
        (Some(&bad), None, true, tell(&bad)),
        (Some(&bad), Some(&bad), true, ExportToStep::Nothing),
        (Some(&worse), Some(&bad), true, tell(&worse)),
        (Some(&unknown), Some(&bad), true, tell(&unknown)),
        // The name exported again (a new uid): a new episode.
        (Some(&again), Some(&bad), true, tell(&again)),
        (None, Some(&bad), true, ExportToStep::Forget),
        // A follower tells and forgets nothing.
        (Some(&bad), None, false, ExportToStep::Nothing),
        (None, Some(&bad), false, ExportToStep::Nothing),
    ];
    for (i, (now, last, leading, want)) in cases.into_iter().enumerate() {
        assert_eq!(
            decide_export_to(now.cloned(), last, leading),
            want,
            "case {i}"
        );
    }
}
