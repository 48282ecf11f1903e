//! The export index, fed watch events and read back.

use super::*;
use k8s_openapi::api::core::v1::ServicePort;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn export(name: &str, created: &str) -> ServiceExport {
    ServiceExport {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            uid: Some(format!("uid-{name}")),
            creation_timestamp: Some(Time(created.parse().unwrap())),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn service(name: &str, port: i32) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("10.0.0.1".into()),
            selector: Some(BTreeMap::from([("app".into(), name.into())])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("shop", name)
}

fn keys(names: &[&str]) -> Changed {
    names.iter().map(|n| key(n)).collect()
}

const T0: &str = "2026-12-02T10:00:00Z";
const T1: &str = "2026-12-02T10:00:01Z";

/// Lists `exports` and `services` of `cluster` (generation `g`) completely; returns the
/// keys the second list's end changed.
fn list(
    index: &mut ExportIndex,
    cluster: &str,
    g: Generation,
    exports: &[ServiceExport],
    services: &[Service],
) -> Changed {
    index.export_event(cluster, g, &Event::Init);
    for e in exports {
        index.export_event(cluster, g, &Event::InitApply(e.clone()));
    }
    index.export_event(cluster, g, &Event::InitDone);
    index.service_event(cluster, g, &Event::Init);
    for s in services {
        index.service_event(cluster, g, &Event::InitApply(s.clone()));
    }
    index.service_event(cluster, g, &Event::InitDone)
}

fn clusters_of(index: &ExportIndex, name: &str) -> Vec<String> {
    index
        .exports(&key(name))
        .into_iter()
        .map(|e| e.cluster)
        .collect()
}

#[test]
fn a_cluster_counts_only_once_both_its_lists_are_complete_and_then_every_export_is_judged() {
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    assert!(index.feed("east", 1, now));
    let g = 1;
    index.export_event("east", g, &Event::Init);
    index.export_event("east", g, &Event::InitApply(export("hello", T0)));
    index.export_event("east", g, &Event::InitApply(export("lonely", T0)));
    index.export_event("east", g, &Event::InitDone);
    assert!(
        clusters_of(&index, "hello").is_empty(),
        "services not listed"
    );
    assert_eq!(index.unlisted(), vec!["east"]);
    index.service_event("east", g, &Event::Init);
    index.service_event("east", g, &Event::InitApply(service("hello", 80)));
    let changed = index.service_event("east", g, &Event::InitDone);
    // `lonely` has no Service: judged too (it may have counted as valid before).
    assert_eq!(changed, keys(&["hello", "lonely"]));
    assert_eq!(clusters_of(&index, "hello"), vec!["east"]);
    let lonely = index.exports(&key("lonely"));
    assert_eq!(lonely.len(), 1);
    assert!(lonely[0].service.is_none());
    assert!(index.unlisted().is_empty());
}

#[test]
fn a_relist_keeps_every_object_until_it_completes_then_drops_what_it_lacks() {
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    index.feed("east", 1, now);
    list(
        &mut index,
        "east",
        1,
        &[export("a", T0), export("b", T0)],
        &[service("a", 80), service("b", 80)],
    );
    // The watch restarts: a new list in progress holds nothing yet.
    assert!(index.export_event("east", 1, &Event::Init).is_empty());
    let again = index.export_event("east", 1, &Event::InitApply(export("a", T0)));
    assert!(again.is_empty(), "an unchanged export changes nothing");
    assert_eq!(
        clusters_of(&index, "b"),
        vec!["east"],
        "kept during the list"
    );
    let done = index.export_event("east", 1, &Event::InitDone);
    assert_eq!(done, keys(&["b"]));
    assert!(clusters_of(&index, "b").is_empty());
    assert_eq!(clusters_of(&index, "a"), vec!["east"]);
}

#[test]
fn an_older_feed_is_refused_and_its_late_events_change_nothing() {
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    assert!(index.feed("east", 2, now));
    assert!(!index.feed("east", 1, now), "older");
    assert!(!index.feed("east", 2, now), "the same");
    let stale = list(
        &mut index,
        "east",
        1,
        &[export("a", T0)],
        &[service("a", 80)],
    );
    assert!(stale.is_empty());
    assert!(clusters_of(&index, "a").is_empty());
    // The newer feed's objects count; a third feed's count once its lists end.
    list(
        &mut index,
        "east",
        2,
        &[export("a", T0)],
        &[service("a", 80)],
    );
    assert!(index.feed("east", 3, now));
    assert_eq!(clusters_of(&index, "a"), vec!["east"]);
    let changed = list(&mut index, "east", 3, &[], &[service("a", 80)]);
    assert_eq!(
        changed,
        keys(&["a"]),
        "the export left when feed 3 took over"
    );
    assert!(clusters_of(&index, "a").is_empty());
    // Feed 2 ending changes nothing: it no longer counted.
    assert!(index.remove("east", 2).is_empty());
}

#[test]
fn a_replacement_that_stops_first_leaves_the_running_feed_counting() {
    // A rotation that times out: the new link listed, then stopped; the old one runs.
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    index.feed("east", 1, now);
    list(
        &mut index,
        "east",
        1,
        &[export("a", T0)],
        &[service("a", 80)],
    );
    index.feed("east", 2, now);
    list(
        &mut index,
        "east",
        2,
        &[export("a", T0)],
        &[service("a", 80)],
    );
    assert_eq!(index.remove("east", 2), keys(&["a"]), "feed 1 counts again");
    assert_eq!(clusters_of(&index, "a"), vec!["east"]);
    // Feed 1's events still count.
    let added = index.export_event("east", 1, &Event::Apply(export("b", T0)));
    assert_eq!(added, keys(&["b"]));
    assert_eq!(clusters_of(&index, "b"), vec!["east"]);
}

#[test]
fn a_link_named_like_the_local_cluster_never_feeds_it() {
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    list(
        &mut index,
        "west",
        0,
        &[export("a", T0)],
        &[service("a", 80)],
    );
    assert!(!index.feed("west", 1, now));
    let foreign = list(&mut index, "west", 1, &[export("x", T0)], &[]);
    assert!(foreign.is_empty());
    assert_eq!(index.local_keys(), vec![key("a")]);
    assert!(index.local_export(&key("x")).is_none());
}

#[test]
fn only_what_the_merge_reads_of_a_service_judges_its_export_again() {
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    list(
        &mut index,
        "west",
        0,
        &[export("a", T0)],
        &[service("a", 80)],
    );
    let mut moved = service("a", 80);
    let spec = moved.spec.as_mut().unwrap();
    spec.cluster_ip = Some("10.0.0.9".into());
    spec.selector = None;
    moved.metadata.resource_version = Some("2".into());
    moved.metadata.labels = Some(BTreeMap::from([("x".into(), "y".into())]));
    let table: Vec<(&str, Service, Changed)> = vec![
        ("address, selector, labels", moved, keys(&[])),
        ("a port", service("a", 81), keys(&["a"])),
        ("a Service nobody exports", service("b", 80), keys(&[])),
        (
            "headless",
            {
                let mut s = service("a", 81);
                s.spec.as_mut().unwrap().cluster_ip = Some("None".into());
                s
            },
            keys(&["a"]),
        ),
    ];
    for (what, svc, want) in table {
        assert_eq!(
            index.service_event("west", 0, &Event::Apply(svc)),
            want,
            "{what}"
        );
    }
    let gone = index.service_event("west", 0, &Event::Delete(service("a", 81)));
    assert_eq!(gone, keys(&["a"]));
    assert!(index.exports(&key("a"))[0].service.is_none());
}

#[test]
fn an_export_or_service_being_deleted_counts_as_gone() {
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    list(
        &mut index,
        "west",
        0,
        &[export("a", T0)],
        &[service("a", 80)],
    );
    let mut deleting = service("a", 80);
    deleting.metadata.deletion_timestamp = Some(Time(T1.parse().unwrap()));
    assert_eq!(
        index.service_event("west", 0, &Event::Apply(deleting)),
        keys(&["a"])
    );
    assert!(index.exports(&key("a"))[0].service.is_none());
    let mut leaving = export("a", T0);
    leaving.metadata.deletion_timestamp = Some(Time(T1.parse().unwrap()));
    assert_eq!(
        index.export_event("west", 0, &Event::Apply(leaving)),
        keys(&["a"])
    );
    assert!(index.exports(&key("a")).is_empty());
    assert!(index.local_export(&key("a")).is_none());
}

#[test]
fn only_the_local_export_keeps_its_object_and_the_order_of_exports_is_by_cluster() {
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    index.feed("east", 1, now);
    list(
        &mut index,
        "west",
        0,
        &[export("a", T1)],
        &[service("a", 80)],
    );
    list(
        &mut index,
        "east",
        1,
        &[export("a", T0)],
        &[service("a", 81)],
    );
    let local = index.local_export(&key("a")).expect("local export");
    assert_eq!(local.metadata.uid.as_deref(), Some("uid-a"));
    let exports = index.exports(&key("a"));
    let seen: Vec<(&str, Timestamp)> = exports
        .iter()
        .map(|e| (e.cluster.as_str(), e.created))
        .collect();
    assert_eq!(
        seen,
        vec![("east", T0.parse().unwrap()), ("west", T1.parse().unwrap())]
    );
    assert_eq!(index.local_keys(), vec![key("a")]);
}

#[test]
fn an_ended_feed_takes_its_exports_unless_replaced_and_the_local_cluster_stays() {
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    index.feed("east", 1, now);
    list(
        &mut index,
        "west",
        0,
        &[export("a", T0)],
        &[service("a", 80)],
    );
    list(
        &mut index,
        "east",
        1,
        &[export("a", T0), export("b", T0)],
        &[],
    );
    // A successful rotation: the new feed lists, then the old one ends.
    assert!(index.feed("east", 2, now));
    list(
        &mut index,
        "east",
        2,
        &[export("a", T0), export("b", T0)],
        &[],
    );
    assert!(
        index.remove("east", 1).is_empty(),
        "replaced: the newer feed counts"
    );
    assert_eq!(clusters_of(&index, "a"), vec!["east", "west"]);
    assert_eq!(index.remove("east", 2), keys(&["a", "b"]));
    assert_eq!(clusters_of(&index, "a"), vec!["west"]);
    assert!(index.remove("west", 0).is_empty());
    assert_eq!(clusters_of(&index, "a"), vec!["west"]);
    // A link of that cluster made again starts from generation 1 afresh.
    assert!(index.feed("east", 1, now));
}

#[test]
fn an_unlisted_cluster_holds_judgements_for_at_most_the_hold() {
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    assert_eq!(
        index.held_until(now),
        Some(now + LIST_HOLD),
        "local unlisted"
    );
    list(&mut index, "west", 0, &[], &[]);
    assert!(index.local_listed());
    assert_eq!(index.held_until(now), None);
    let later = now + Duration::from_secs(10);
    index.feed("east", 1, later);
    assert_eq!(index.held_until(later), Some(later + LIST_HOLD));
    assert_eq!(index.held_until(later + LIST_HOLD), None, "the hold ended");
    // A replacement feed does not extend the hold.
    index.feed("east", 2, later + Duration::from_secs(20));
    assert_eq!(index.held_until(later), Some(later + LIST_HOLD));
    list(&mut index, "east", 1, &[], &[]);
    assert_eq!(index.held_until(later), None);
    assert_eq!(index.listed_count(), 2);
}

#[test]
fn exports_and_services_of_a_namespace_not_allowed_are_never_read() {
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::allow_only(["shop"]), now);
    let mut elsewhere = export("a", T0);
    elsewhere.metadata.namespace = Some("kube-system".into());
    let mut svc = service("a", 80);
    svc.metadata.namespace = Some("kube-system".into());
    let changed = list(&mut index, "west", 0, &[elsewhere, export("b", T0)], &[svc]);
    assert_eq!(changed, keys(&["b"]));
    assert_eq!(index.local_keys(), vec![key("b")]);
    assert!(
        index
            .exports(&ServiceKey::new("kube-system", "a"))
            .is_empty()
    );
}

/// A slice named `name` of the import `import` (its KEP label), at resourceVersion `rv`.
fn slice(name: &str, import: &str, rv: &str) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    k8s_openapi::api::discovery::v1::EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            resource_version: Some(rv.into()),
            labels: Some(BTreeMap::from([(
                service_mirror_core::mcs::SERVICE_NAME_LABEL.into(),
                import.into(),
            )])),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: Vec::new(),
        ports: None,
    }
}

fn grouped_key(s: &k8s_openapi::api::discovery::v1::EndpointSlice) -> Option<ServiceKey> {
    let import = s
        .metadata
        .labels
        .as_ref()?
        .get(service_mirror_core::mcs::SERVICE_NAME_LABEL)?;
    Some(ServiceKey::new(s.metadata.namespace.as_deref()?, import))
}

fn names(g: &Grouped<k8s_openapi::api::discovery::v1::EndpointSlice>, import: &str) -> Vec<String> {
    g.of(&key(import))
        .map(|s| s.metadata.name.clone().unwrap())
        .collect()
}

#[test]
fn grouped_objects_share_their_key_and_each_event_names_only_the_keys_it_changed() {
    let mut g = Grouped::default();
    assert!(!g.listed);
    assert_eq!(g.apply(&Event::Init, grouped_key), Changed::new());
    g.apply(&Event::InitApply(slice("a-1", "a", "1")), grouped_key);
    g.apply(&Event::InitApply(slice("a-2", "a", "1")), grouped_key);
    assert_eq!(
        names(&g, "a"),
        Vec::<String>::new(),
        "nothing before the list is complete"
    );
    assert_eq!(g.apply(&Event::InitDone, grouped_key), keys(&["a"]));
    assert!(g.listed);
    assert_eq!(names(&g, "a"), ["a-1", "a-2"]);
    // The same object again: nothing changed.
    assert_eq!(
        g.apply(&Event::Apply(slice("a-1", "a", "1")), grouped_key),
        Changed::new()
    );
    // A new version, then a new object of another key.
    assert_eq!(
        g.apply(&Event::Apply(slice("a-1", "a", "2")), grouped_key),
        keys(&["a"])
    );
    assert_eq!(
        g.apply(&Event::Apply(slice("b-1", "b", "3")), grouped_key),
        keys(&["b"])
    );
    // Relabelled to another import: both keys changed, it moved.
    assert_eq!(
        g.apply(&Event::Apply(slice("a-2", "b", "4")), grouped_key),
        keys(&["a", "b"])
    );
    assert_eq!(
        (names(&g, "a"), names(&g, "b")),
        (vec!["a-1".into()], vec!["a-2".to_string(), "b-1".into()])
    );
    // Deleted: gone from its key; the key's last one empties it.
    assert_eq!(
        g.apply(&Event::Delete(slice("a-1", "a", "2")), grouped_key),
        keys(&["a"])
    );
    assert!(!g.items.contains_key(&key("a")));
    // Unlabelled: forgotten.
    let mut bare = slice("b-1", "b", "5");
    bare.metadata.labels = None;
    assert_eq!(g.apply(&Event::Apply(bare), grouped_key), keys(&["b"]));
    assert_eq!(names(&g, "b"), ["a-2"]);
}

#[test]
fn a_relist_replaces_the_groups_at_its_end_and_names_what_differs() {
    let mut g = Grouped::default();
    g.apply(&Event::Init, grouped_key);
    for s in [
        slice("a-1", "a", "1"),
        slice("b-1", "b", "1"),
        slice("c-1", "c", "1"),
    ] {
        g.apply(&Event::InitApply(s), grouped_key);
    }
    g.apply(&Event::InitDone, grouped_key);
    // A relist: a unchanged, b changed, c gone, d new; the old view holds meanwhile.
    g.apply(&Event::Init, grouped_key);
    g.apply(&Event::InitApply(slice("a-1", "a", "1")), grouped_key);
    g.apply(&Event::InitApply(slice("b-1", "b", "2")), grouped_key);
    g.apply(&Event::InitApply(slice("d-1", "d", "1")), grouped_key);
    assert_eq!(names(&g, "c"), ["c-1"], "kept until the list is complete");
    assert_eq!(
        g.apply(&Event::InitDone, grouped_key),
        keys(&["b", "c", "d"])
    );
    assert_eq!(names(&g, "c"), Vec::<String>::new());
    assert_eq!(names(&g, "d"), ["d-1"]);
    // An event after the relist finds the object where the list filed it.
    assert_eq!(
        g.apply(&Event::Delete(slice("d-1", "d", "1")), grouped_key),
        keys(&["d"])
    );
}

#[test]
fn a_feed_that_ends_before_its_successor_lists_counts_until_the_successor_has() {
    // A link restarted with new settings: the old link stops, then the new one lists.
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    index.feed("east", 1, now);
    list(
        &mut index,
        "east",
        1,
        &[export("a", T0)],
        &[service("a", 80)],
    );
    index.feed("east", 2, now);
    assert!(index.remove("east", 1).is_empty(), "nothing moves yet");
    assert!(index.counts("east"));
    assert_eq!(clusters_of(&index, "a"), vec!["east"]);
    // The successor lists with "b" instead of "a": both judged, the old view gone.
    let changed = list(
        &mut index,
        "east",
        2,
        &[export("b", T0)],
        &[service("b", 80)],
    );
    assert_eq!(changed, keys(&["a", "b"]));
    assert!(clusters_of(&index, "a").is_empty());
    assert_eq!(clusters_of(&index, "b"), vec!["east"]);
    // Ending the successor now takes the cluster out: no old view is left.
    assert_eq!(index.remove("east", 2), keys(&["b"]));
    assert!(!index.counts("east"));
}

#[test]
fn a_kept_view_goes_when_its_unlisted_successors_all_end() {
    // Two quick edits: 1 listed, 2 and 3 never list, then the link goes.
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    index.feed("east", 1, now);
    list(
        &mut index,
        "east",
        1,
        &[export("a", T0)],
        &[service("a", 80)],
    );
    index.feed("east", 2, now);
    assert!(index.remove("east", 1).is_empty());
    index.feed("east", 3, now);
    assert!(
        index.remove("east", 2).is_empty(),
        "feed 1 still waits for 3"
    );
    assert_eq!(clusters_of(&index, "a"), vec!["east"]);
    assert_eq!(index.remove("east", 3), keys(&["a"]), "no successor left");
    assert!(!index.counts("east"));
    assert!(index.feeds().is_empty() || !index.feeds().contains_key("east"));
}

#[test]
fn an_exports_export_to_annotation_is_read_and_a_change_of_it_judges_the_name_again() {
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    assert!(index.feed("east", 1, now));
    let annotated = |to: Option<&str>| {
        let mut e = export("hello", T0);
        e.metadata.annotations = to.map(|to| {
            BTreeMap::from([
                (EXPORT_TO_ANNOTATION.to_string(), to.to_string()),
                ("unrelated".to_string(), "x".to_string()),
            ])
        });
        e
    };
    list(
        &mut index,
        "east",
        1,
        &[annotated(None)],
        &[service("hello", 80)],
    );
    let export_to = |index: &ExportIndex| index.exports(&key("hello"))[0].export_to.clone();
    assert_eq!(export_to(&index), ExportTo::Every);
    let changed = index.export_event("east", 1, &Event::Apply(annotated(Some("north, west"))));
    assert_eq!(changed, keys(&["hello"]));
    assert_eq!(
        export_to(&index),
        ExportTo::Only(["north".to_string(), "west".to_string()].into())
    );
    // The same list spelt otherwise: nothing to judge.
    let changed = index.export_event("east", 1, &Event::Apply(annotated(Some("west,north,"))));
    assert!(changed.is_empty(), "{changed:?}");
    let changed = index.export_event("east", 1, &Event::Apply(annotated(Some("Bad"))));
    assert_eq!(changed, keys(&["hello"]));
    assert!(matches!(export_to(&index), ExportTo::Invalid(_)));
    let changed = index.export_event("east", 1, &Event::Apply(annotated(None)));
    assert_eq!(changed, keys(&["hello"]));
    assert_eq!(export_to(&index), ExportTo::Every);
}

#[test]
fn a_change_of_the_local_exports_traffic_annotations_judges_the_name_again_a_remotes_does_not() {
    use service_mirror_core::traffic::LOCALITY_ANNOTATION;
    let now = Instant::now();
    let mut index = ExportIndex::new("west", NamespaceFilter::default(), now);
    assert!(index.feed("east", 1, now));
    let annotated = |locality: Option<&str>| {
        let mut e = export("hello", T0);
        e.metadata.annotations =
            locality.map(|l| BTreeMap::from([(LOCALITY_ANNOTATION.to_string(), l.to_string())]));
        e
    };
    list(
        &mut index,
        "west",
        0,
        &[annotated(None)],
        &[service("hello", 80)],
    );
    list(
        &mut index,
        "east",
        1,
        &[annotated(None)],
        &[service("hello", 80)],
    );
    let changed = index.export_event("west", 0, &Event::Apply(annotated(Some("spread"))));
    assert_eq!(changed, keys(&["hello"]), "the local export: judged again");
    let local = index.local_export(&key("hello")).unwrap();
    assert_eq!(
        local.metadata.annotations.as_ref().unwrap()[LOCALITY_ANNOTATION],
        "spread",
        "read by the reconcile from the local export"
    );
    let changed = index.export_event("east", 1, &Event::Apply(annotated(Some("spread"))));
    assert!(
        changed.is_empty(),
        "a remote's traffic annotations mean nothing here: {changed:?}"
    );
}
