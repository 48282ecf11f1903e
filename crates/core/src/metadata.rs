//! Which remote labels and annotations a Link mirror copies: Linkerd's
//! `getCommonServiceLabels` and `getCommonServiceAnnotations`, with a Link's
//! `excludedLabels` / `excludedAnnotations`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::labels::{
    GATEWAY_NAME_ANNOTATION, GATEWAY_NS_ANNOTATION, OPAQUE_PORTS_ANNOTATION, SVC_MIRROR_PREFIX,
    TOPOLOGY_AWARE_HINTS_ANNOTATION, TOPOLOGY_MODE_ANNOTATION,
};

/// Suffix that makes an exclusion pattern a prefix pattern.
const PREFIX_SUFFIX: &str = "/*";

/// A Link's `excludedLabels` or `excludedAnnotations`: exact keys, or `prefix/*` patterns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exclusions {
    exact: BTreeSet<String>,
    /// The `p` of each `p/*`.
    prefixes: BTreeSet<String>,
}

/// Why an exclusion pattern is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExclusionError {
    /// An empty pattern (it would exclude nothing: surely a mistake).
    #[error("exclusion pattern is empty")]
    Empty,
    /// A `*` other than in a trailing `/*` (Linkerd would compare it literally, and no
    /// valid key holds a `*`, so the pattern could never exclude anything).
    #[error(
        "exclusion pattern {pattern:?} has a '*' that is not a trailing '/*': use an exact key or 'prefix/*'"
    )]
    MisplacedWildcard {
        /// The refused pattern.
        pattern: String,
    },
}

impl Exclusions {
    /// Parses a Link's patterns: each is an exact key, or `prefix/*`.
    pub fn parse(patterns: &[String]) -> Result<Exclusions, ExclusionError> {
        let mut exclusions = Exclusions::default();
        for pattern in patterns {
            if pattern.is_empty() {
                return Err(ExclusionError::Empty);
            }
            let (set, body) = match pattern.strip_suffix(PREFIX_SUFFIX) {
                Some(prefix) => (&mut exclusions.prefixes, prefix),
                None => (&mut exclusions.exact, pattern.as_str()),
            };
            if body.contains('*') {
                return Err(ExclusionError::MisplacedWildcard {
                    pattern: pattern.clone(),
                });
            }
            set.insert(body.to_owned());
        }
        Ok(exclusions)
    }

    /// Linkerd's rule: `p/*` excludes every key that starts with `p` (TrimSuffix "/*" then HasPrefix — note this also excludes `pother/x`; keep Linkerd's behaviour and say so in a doc comment); anything else excludes that exact key.
    ///
    /// So `example.com/*` also excludes `example.community/x` and `example.com-x`, and
    /// a bare `/*` excludes every key: that is what Linkerd does with the same Link,
    /// and a mirror must carry the same metadata under either controller.
    pub fn excludes(&self, key: &str) -> bool {
        self.exact.contains(key) || self.prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }
}

/// Labels a Link mirror (Service and Endpoints) copies from the remote Service: all of them except keys starting with `mirror.linkerd.io` (Linkerd's SvcMirrorPrefix, no slash: use a constant in labels.rs) and those `excluded`.
pub fn copied_labels(remote: &ObjectMeta, excluded: &Exclusions) -> BTreeMap<String, String> {
    remote
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with(SVC_MIRROR_PREFIX) && !excluded.excludes(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Annotations a Link mirror Service copies: all except `service.kubernetes.io/topology-aware-hints` and `service.kubernetes.io/topology-mode` (topology is not multicluster-aware), except those `excluded`, and NEVER the export annotations `mirror.linkerd.io/gateway-name` / `mirror.linkerd.io/gateway-ns` (a mirror must never look exported to a cluster that links this one) and `service-mirror.io/export-to` (whom the remote exports to, not a property of the mirror), nor any key in `owned` (keys the mirror sets itself, passed by the caller, e.g. `mirror.linkerd.io/remote-svc-fq-name`); `config.linkerd.io/opaque-ports` is ALWAYS kept when present even if excluded (Linkerd's rule).
///
/// The "never" rules win over the opaque-ports one: `owned` could name it.
pub fn copied_annotations(
    remote: &ObjectMeta,
    excluded: &Exclusions,
    owned: &[&str],
) -> BTreeMap<String, String> {
    let copied = |key: &str| {
        if key == GATEWAY_NAME_ANNOTATION
            || key == GATEWAY_NS_ANNOTATION
            || key == crate::mcs::EXPORT_TO_ANNOTATION
            || owned.contains(&key)
        {
            return false;
        }
        key == OPAQUE_PORTS_ANNOTATION
            || !(key == TOPOLOGY_AWARE_HINTS_ANNOTATION
                || key == TOPOLOGY_MODE_ANNOTATION
                || excluded.excludes(key))
    };
    remote
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| copied(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::{
        CLUSTER_NAME_LABEL, MIRRORED_SERVICE_LABEL, REMOTE_RESOURCE_VERSION_ANNOTATION,
        REMOTE_SVC_FQ_NAME_ANNOTATION,
    };

    fn patterns(ps: &[&str]) -> Vec<String> {
        ps.iter().map(|p| (*p).to_owned()).collect()
    }

    fn exclusions(ps: &[&str]) -> Exclusions {
        Exclusions::parse(&patterns(ps)).unwrap()
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            labels: Some(map(labels)),
            annotations: Some(map(annotations)),
            ..Default::default()
        }
    }

    #[test]
    fn no_patterns_exclude_nothing() {
        let none = Exclusions::parse(&[]).unwrap();
        assert_eq!(none, Exclusions::default());
        for key in ["", "a", "example.com/a", "mirror.linkerd.io/x"] {
            assert!(!none.excludes(key), "{key:?}");
        }
    }

    #[test]
    fn exact_patterns_exclude_only_that_key() {
        let ex = exclusions(&["app", "example.com/team"]);
        let table = [
            ("app", true),
            ("example.com/team", true),
            ("apps", false),
            ("ap", false),
            ("App", false),
            ("example.com/teams", false),
            ("example.com/tea", false),
            ("example.com/other", false),
        ];
        for (key, want) in table {
            assert_eq!(ex.excludes(key), want, "{key:?}");
        }
    }

    #[test]
    fn prefix_patterns_exclude_every_key_starting_with_the_prefix_as_linkerd_does() {
        let ex = exclusions(&["example.com/*"]);
        let table = [
            ("example.com/a", true),
            ("example.com/", true),
            ("example.com", true),
            // Linkerd's HasPrefix without the slash: these go too.
            ("example.community/a", true),
            ("example.com-x", true),
            ("sub.example.com/a", false),
            ("example.org/a", false),
            ("example", false),
        ];
        for (key, want) in table {
            assert_eq!(ex.excludes(key), want, "{key:?}");
        }
    }

    #[test]
    fn a_bare_slash_star_excludes_every_key() {
        let ex = exclusions(&["/*"]);
        for key in ["a", "example.com/a", ""] {
            assert!(ex.excludes(key), "{key:?}");
        }
    }

    #[test]
    fn exact_and_prefix_patterns_combine() {
        let ex = exclusions(&["app", "team.io/*", "app"]);
        assert!(ex.excludes("app"));
        assert!(ex.excludes("team.io/owner"));
        assert!(!ex.excludes("version"));
        // Repeats and order do not matter.
        assert_eq!(ex, exclusions(&["team.io/*", "app"]));
    }

    #[test]
    fn empty_or_wildcard_patterns_other_than_a_trailing_slash_star_are_refused() {
        let table = [
            ("", ExclusionError::Empty),
            ("*", misplaced("*")),
            ("app*", misplaced("app*")),
            ("example.com*", misplaced("example.com*")),
            ("*/a", misplaced("*/a")),
            ("a/*/b", misplaced("a/*/b")),
            ("a*/*", misplaced("a*/*")),
            ("a/**", misplaced("a/**")),
            ("a/*/*", misplaced("a/*/*")),
        ];
        for (pattern, want) in table {
            assert_eq!(
                Exclusions::parse(&patterns(&["ok", pattern])),
                Err(want),
                "{pattern:?}"
            );
        }
    }

    fn misplaced(p: &str) -> ExclusionError {
        ExclusionError::MisplacedWildcard { pattern: p.into() }
    }

    #[test]
    fn exclusion_errors_name_the_pattern() {
        let msg = misplaced("app*").to_string();
        assert!(msg.contains("\"app*\""), "{msg}");
        assert!(ExclusionError::Empty.to_string().contains("empty"));
    }

    #[test]
    fn labels_are_copied_except_the_mirror_prefix_and_exclusions() {
        let remote = meta(
            &[
                ("app", "web"),
                ("team", "a"),
                ("example.com/owner", "x"),
                ("other.io/keep", "y"),
                (MIRRORED_SERVICE_LABEL, "true"),
                (CLUSTER_NAME_LABEL, "east"),
                ("mirror.linkerd.io/exported", "true"),
                // No slash in Linkerd's prefix: dropped too.
                ("mirror.linkerd.iox/other", "z"),
            ],
            &[("ann", "v")],
        );
        let got = copied_labels(&remote, &exclusions(&["team", "example.com/*"]));
        assert_eq!(got, map(&[("app", "web"), ("other.io/keep", "y")]));
        let all = copied_labels(&remote, &Exclusions::default());
        assert_eq!(
            all,
            map(&[
                ("app", "web"),
                ("example.com/owner", "x"),
                ("other.io/keep", "y"),
                ("team", "a"),
            ])
        );
    }

    #[test]
    fn the_mirror_prefix_is_dropped_from_labels_even_if_nothing_is_excluded() {
        let remote = meta(&[("mirror.linkerd.io/exported", "true")], &[]);
        assert!(copied_labels(&remote, &Exclusions::default()).is_empty());
    }

    #[test]
    fn unset_metadata_copies_nothing() {
        let remote = ObjectMeta::default();
        assert!(copied_labels(&remote, &Exclusions::default()).is_empty());
        assert!(copied_annotations(&remote, &Exclusions::default(), &[]).is_empty());
    }

    #[test]
    fn annotations_are_copied_except_topology_and_exclusions() {
        let remote = meta(
            &[("app", "web")],
            &[
                ("a", "1"),
                ("b", "2"),
                ("example.com/x", "3"),
                ("keep.io/y", "4"),
                (TOPOLOGY_AWARE_HINTS_ANNOTATION, "auto"),
                (TOPOLOGY_MODE_ANNOTATION, "Auto"),
                ("mirror.linkerd.io/probe-path", "/health"),
            ],
        );
        let got = copied_annotations(&remote, &exclusions(&["b", "example.com/*"]), &[]);
        assert_eq!(
            got,
            map(&[
                ("a", "1"),
                ("keep.io/y", "4"),
                // Annotations have no prefix rule, unlike labels (Linkerd's).
                ("mirror.linkerd.io/probe-path", "/health"),
            ])
        );
    }

    #[test]
    fn opaque_ports_are_always_copied_even_when_excluded() {
        let remote = meta(&[], &[(OPAQUE_PORTS_ANNOTATION, "3306"), ("x", "y")]);
        for ps in [
            vec![],
            vec![OPAQUE_PORTS_ANNOTATION],
            vec!["config.linkerd.io/*"],
            vec!["config/*"],
            vec!["/*"],
        ] {
            let got = copied_annotations(&remote, &exclusions(&ps), &[]);
            assert_eq!(
                got.get(OPAQUE_PORTS_ANNOTATION).map(String::as_str),
                Some("3306"),
                "{ps:?}"
            );
        }
        let everything = copied_annotations(&remote, &exclusions(&["/*"]), &[]);
        assert_eq!(everything, map(&[(OPAQUE_PORTS_ANNOTATION, "3306")]));
        let absent = meta(&[], &[("x", "y")]);
        let got = copied_annotations(&absent, &exclusions(&[]), &[]);
        assert!(!got.contains_key(OPAQUE_PORTS_ANNOTATION));
    }

    #[test]
    fn export_annotations_are_never_copied() {
        let remote = meta(
            &[],
            &[
                (GATEWAY_NAME_ANNOTATION, "gw"),
                (GATEWAY_NS_ANNOTATION, "linkerd-multicluster"),
                (crate::mcs::EXPORT_TO_ANNOTATION, "east"),
                ("a", "1"),
            ],
        );
        for ps in [vec![], vec!["a"], vec!["mirror.linkerd.io/*"]] {
            let got = copied_annotations(&remote, &exclusions(&ps), &[]);
            assert!(!got.contains_key(GATEWAY_NAME_ANNOTATION), "{ps:?}");
            assert!(!got.contains_key(GATEWAY_NS_ANNOTATION), "{ps:?}");
            assert!(
                !got.contains_key(crate::mcs::EXPORT_TO_ANNOTATION),
                "{ps:?}"
            );
        }
        assert_eq!(
            copied_annotations(&remote, &Exclusions::default(), &[]),
            map(&[("a", "1")])
        );
    }

    #[test]
    fn owned_annotations_are_never_copied() {
        let remote = meta(
            &[],
            &[
                (REMOTE_SVC_FQ_NAME_ANNOTATION, "spoofed.svc.cluster.local"),
                (REMOTE_RESOURCE_VERSION_ANNOTATION, "1"),
                ("a", "1"),
            ],
        );
        let owned = [
            REMOTE_SVC_FQ_NAME_ANNOTATION,
            REMOTE_RESOURCE_VERSION_ANNOTATION,
        ];
        let got = copied_annotations(&remote, &Exclusions::default(), &owned);
        assert_eq!(got, map(&[("a", "1")]));
        // Without `owned`, they would be copied: the caller decides.
        let got = copied_annotations(&remote, &Exclusions::default(), &[]);
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn owned_wins_over_the_opaque_ports_rule() {
        let remote = meta(&[], &[(OPAQUE_PORTS_ANNOTATION, "3306")]);
        let got = copied_annotations(&remote, &Exclusions::default(), &[OPAQUE_PORTS_ANNOTATION]);
        assert!(got.is_empty());
    }

    #[test]
    fn labels_and_annotations_use_their_own_exclusions() {
        let remote = meta(&[("k", "label")], &[("k", "annotation")]);
        let ex = exclusions(&["k"]);
        assert!(copied_labels(&remote, &ex).is_empty());
        assert_eq!(
            copied_annotations(&remote, &Exclusions::default(), &[]),
            map(&[("k", "annotation")])
        );
        assert!(copied_annotations(&remote, &ex, &[]).is_empty());
        assert_eq!(
            copied_labels(&remote, &Exclusions::default()),
            map(&[("k", "label")])
        );
    }
}
