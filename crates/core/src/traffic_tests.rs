use super::*;

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn set(names: &[&str]) -> Serving {
    Serving::Only(names.iter().map(|s| s.to_string()).collect())
}

fn policy(locality: Locality, minimum: u32, priority: &[&str]) -> TrafficPolicy {
    TrafficPolicy {
        cluster_local: false,
        locality,
        minimum,
        priority: priority.iter().map(|s| s.to_string()).collect(),
    }
}

fn remotes(list: &[(&str, bool)]) -> Vec<(String, bool)> {
    list.iter().map(|(c, u)| (c.to_string(), *u)).collect()
}

#[test]
fn export_annotations_are_read_and_a_bad_value_is_named_and_ignored() {
    // (annotations, locality, minimum, problems, why)
    type Case<'a> = (
        Vec<(&'a str, &'a str)>,
        Option<Locality>,
        u32,
        usize,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (vec![], None, 1, 0, "none: defaults"),
        (
            vec![(LOCALITY_ANNOTATION, "spread")],
            Some(Locality::Spread),
            1,
            0,
            "spread",
        ),
        (
            vec![(LOCALITY_ANNOTATION, " local-first ")],
            Some(Locality::LocalFirst),
            1,
            0,
            "trimmed",
        ),
        (
            vec![(LOCALITY_ANNOTATION, "nearest")],
            None,
            1,
            1,
            "an unknown word",
        ),
        (vec![(LOCAL_MINIMUM_ANNOTATION, "3")], None, 3, 0, "three"),
        (
            vec![(LOCAL_MINIMUM_ANNOTATION, "1000")],
            None,
            1000,
            0,
            "the largest",
        ),
        (vec![(LOCAL_MINIMUM_ANNOTATION, "-1")], None, 1, 1, "-1"),
        (vec![(LOCAL_MINIMUM_ANNOTATION, "0")], None, 1, 1, "0"),
        (
            vec![(LOCAL_MINIMUM_ANNOTATION, "1000000000")],
            None,
            1,
            1,
            "10^9",
        ),
        (
            vec![(LOCAL_MINIMUM_ANNOTATION, "two")],
            None,
            1,
            1,
            "a word",
        ),
        (
            vec![(LOCALITY_ANNOTATION, "x"), (LOCAL_MINIMUM_ANNOTATION, "y")],
            None,
            1,
            2,
            "both bad: both named",
        ),
    ];
    for (pairs, locality, minimum, problems, why) in cases {
        let a = annotations(&pairs);
        let t = export_traffic(Some(&a));
        assert_eq!(t.locality, locality, "{why}");
        assert_eq!(t.minimum, minimum, "{why}");
        assert_eq!(t.problems.len(), problems, "{why}: {:?}", t.problems);
    }
    assert_eq!(export_traffic(None).minimum, DEFAULT_LOCAL_MINIMUM);
}

#[test]
fn a_problem_quotes_a_long_value_cut_to_forty_characters() {
    let long = "x".repeat(5000);
    let a = annotations(&[(LOCALITY_ANNOTATION, &long)]);
    let t = export_traffic(Some(&a));
    assert!(t.problems[0].len() < 200, "{}", t.problems[0]);
    assert!(t.problems[0].contains("..."));
}

#[test]
fn the_export_annotation_wins_then_a_close_distribution_then_the_default() {
    let spread = ExportTraffic {
        locality: Some(Locality::Spread),
        minimum: 2,
        problems: vec![],
    };
    let none = ExportTraffic {
        minimum: 1,
        ..Default::default()
    };
    // (default, export, itp, distribution, locality, cluster_local, why)
    let cases = [
        (
            Locality::LocalFirst,
            &none,
            None,
            None,
            Locality::LocalFirst,
            false,
            "the default",
        ),
        (
            Locality::Spread,
            &none,
            None,
            None,
            Locality::Spread,
            false,
            "the default, spread",
        ),
        (
            Locality::Spread,
            &none,
            None,
            Some("PreferClose"),
            Locality::LocalFirst,
            false,
            "PreferClose: the closest a remote can be is this cluster",
        ),
        (
            Locality::Spread,
            &none,
            None,
            Some("PreferSameZone"),
            Locality::LocalFirst,
            false,
            "PreferSameZone",
        ),
        (
            Locality::LocalFirst,
            &spread,
            None,
            Some("PreferClose"),
            Locality::Spread,
            false,
            "the export's own word wins",
        ),
        (
            Locality::Spread,
            &none,
            Some("Local"),
            None,
            Locality::Spread,
            true,
            "Local: cluster-local",
        ),
        (
            Locality::Spread,
            &none,
            Some("Cluster"),
            None,
            Locality::Spread,
            false,
            "Cluster",
        ),
    ];
    for (default, export, itp, td, locality, cluster_local, why) in cases {
        let p = TrafficPolicy::of(default, &["east".into()], export, itp, td);
        assert_eq!(p.locality, locality, "{why}");
        assert_eq!(p.cluster_local, cluster_local, "{why}");
        assert_eq!(p.minimum, export.minimum, "{why}");
        assert_eq!(p.priority, vec!["east".to_string()], "{why}");
    }
}

#[test]
fn local_first_keeps_traffic_home_while_enough_and_fails_over_by_priority_tier() {
    let all = remotes(&[("east", true), ("north", true), ("south", true)]);
    let east_dead = remotes(&[("east", false), ("north", true), ("south", true)]);
    let all_dead = remotes(&[("east", false), ("north", false), ("south", false)]);
    let lf = policy(Locality::LocalFirst, 1, &["east", "north"]);
    let lf2 = policy(Locality::LocalFirst, 2, &[]);
    let no_list = policy(Locality::LocalFirst, 1, &[]);
    let spread = policy(Locality::Spread, 1, &["east"]);
    let mut local = policy(Locality::LocalFirst, 1, &["east"]);
    local.cluster_local = true;
    // (policy, local ready, remotes, serving, why)
    let cases = [
        (&lf, Some(3), &all, set(&[]), "enough at home: no remote"),
        (&lf, Some(1), &all, set(&[]), "exactly the minimum"),
        (
            &lf,
            Some(0),
            &all,
            set(&["east"]),
            "none at home: the first tier",
        ),
        (
            &lf,
            Some(0),
            &east_dead,
            set(&["north"]),
            "the first tier's gateway dead: the next",
        ),
        (
            &lf,
            Some(0),
            &remotes(&[("east", false), ("north", false), ("south", true)]),
            set(&["south"]),
            "both listed dead: the unlisted, as the last tier",
        ),
        (
            &lf,
            Some(0),
            &all_dead,
            Serving::All,
            "none usable: readiness by probe alone",
        ),
        (
            &lf2,
            Some(1),
            &all,
            set(&["east", "north", "south"]),
            "below a minimum of 2, no list: every remote is one tier",
        ),
        (&lf2, Some(2), &all, set(&[]), "at a minimum of 2"),
        (
            &no_list,
            Some(0),
            &east_dead,
            set(&["east", "north", "south"]),
            "one tier: a dead member stands in it (its probe says not ready)",
        ),
        (&lf, None, &all, Serving::Undecided, "home not counted yet"),
        (&spread, Some(5), &all, Serving::All, "spread: everyone"),
        (&spread, None, &all, Serving::All, "spread needs no count"),
        (
            &local,
            Some(0),
            &all,
            set(&[]),
            "cluster-local: never a remote",
        ),
        (&local, None, &all, set(&[]), "cluster-local needs no count"),
        (
            &lf,
            Some(0),
            &remotes(&[("north", true), ("east", true)]),
            set(&["east"]),
            "the list's order, not the remotes' order",
        ),
        (
            &lf,
            Some(0),
            &remotes(&[]),
            Serving::All,
            "no remote at all",
        ),
    ];
    for (p, local_ready, rs, want, why) in cases {
        assert_eq!(serving_remotes(p, local_ready, rs), want, "{why}");
    }
}

#[test]
fn serves_answers_per_cluster() {
    assert_eq!(Serving::All.serves("x"), Some(true));
    assert_eq!(set(&["a"]).serves("a"), Some(true));
    assert_eq!(set(&["a"]).serves("b"), Some(false));
    assert_eq!(Serving::Undecided.serves("a"), None);
}

#[test]
fn locality_words_round_trip() {
    for l in [Locality::LocalFirst, Locality::Spread] {
        assert_eq!(Locality::parse(l.as_str()), Some(l));
    }
    assert_eq!(Locality::parse("Spread"), None);
}

#[test]
fn a_priority_list_is_cluster_names_once_each() {
    let ok = |v: &str| parse_priority(v).unwrap();
    assert_eq!(ok(""), Vec::<String>::new());
    assert_eq!(ok(" east , north,"), vec!["east", "north"]);
    for bad in ["East", "east,east", "a.b", &"x".repeat(49), "-x"] {
        assert!(parse_priority(bad).is_err(), "{bad:?} refused");
    }
}
