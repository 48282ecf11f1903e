//! A Link's label selectors (`selector`, `remoteDiscoverySelector`,
//! `federatedServiceSelector`): Kubernetes' `metav1.LabelSelectorAsSelector` and
//! `Matches`, except that an unset or empty selector matches nothing (Linkerd's rule,
//! so that a Link without a selector exports no Service rather than all of them).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::naming::{label_value_error, qualified_name_error};

/// A validated Kubernetes label selector, as a Link's `selector` / `remoteDiscoverySelector` / `federatedServiceSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    /// ANDed requirements, stably sorted by key (Kubernetes' order, so `Display`
    /// prints what Kubernetes would). Empty means match nothing: an empty Kubernetes
    /// selector (match everything) is never built.
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

/// An operator with its values. Values are a set: order and repeats never change a
/// match, and a set prints sorted, as Kubernetes prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    /// A `matchLabels` entry.
    Equals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    DoesNotExist,
}

impl Op {
    /// The `matchExpressions` operator name, for errors.
    fn name(&self) -> &'static str {
        match self {
            Op::Equals(_) => "matchLabels",
            Op::In(_) => "In",
            Op::NotIn(_) => "NotIn",
            Op::Exists => "Exists",
            Op::DoesNotExist => "DoesNotExist",
        }
    }
}

/// Why a LabelSelector is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A `matchExpressions` operator other than `In`, `NotIn`, `Exists`, `DoesNotExist`.
    #[error(
        "label selector expression on key {key:?}: {operator:?} is not a valid operator (In, NotIn, Exists or DoesNotExist)"
    )]
    UnknownOperator {
        /// The expression's key.
        key: String,
        /// The refused operator.
        operator: String,
    },
    /// A key that is not a qualified name.
    #[error("label selector key {key:?} is invalid: {reason}")]
    InvalidKey {
        /// The refused key.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `In` or `NotIn` without any value.
    #[error("label selector expression {key:?} {operator}: needs at least one value")]
    MissingValues {
        /// The expression's key.
        key: String,
        /// `In` or `NotIn`.
        operator: &'static str,
    },
    /// `Exists` or `DoesNotExist` with values.
    #[error("label selector expression {key:?} {operator}: takes no values, got {values:?}")]
    UnexpectedValues {
        /// The expression's key.
        key: String,
        /// `Exists` or `DoesNotExist`.
        operator: &'static str,
        /// The values given.
        values: Vec<String>,
    },
    /// A value (of `matchLabels` or of an expression) that is not a label value.
    #[error("label selector value {value:?} for key {key:?} is invalid: {reason}")]
    InvalidValue {
        /// The key the value is for.
        key: String,
        /// The refused value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl Selector {
    /// `None`, or a selector with neither matchLabels nor matchExpressions, matches NOTHING (Linkerd's rule: an unset selector must not export everything).
    pub fn parse(selector: Option<&LabelSelector>) -> Result<Selector, SelectorError> {
        let Some(selector) = selector else {
            return Ok(Selector::nothing());
        };
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            check_key(key)?;
            check_value(key, value)?;
            requirements.push(Requirement {
                key: key.clone(),
                op: Op::Equals(value.clone()),
            });
        }
        for expr in selector.match_expressions.iter().flatten() {
            let key = &expr.key;
            let values = expr.values.as_deref().unwrap_or_default();
            let set = || values.iter().cloned().collect();
            // Kubernetes checks the operator before the key, then the value count.
            let op = match expr.operator.as_str() {
                "In" => Op::In(set()),
                "NotIn" => Op::NotIn(set()),
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                other => {
                    return Err(SelectorError::UnknownOperator {
                        key: key.clone(),
                        operator: other.to_owned(),
                    });
                }
            };
            check_key(key)?;
            let takes_values = matches!(op, Op::In(_) | Op::NotIn(_));
            if takes_values && values.is_empty() {
                return Err(SelectorError::MissingValues {
                    key: key.clone(),
                    operator: op.name(),
                });
            }
            if !takes_values && !values.is_empty() {
                return Err(SelectorError::UnexpectedValues {
                    key: key.clone(),
                    operator: op.name(),
                    values: values.to_vec(),
                });
            }
            for value in values {
                check_value(key, value)?;
            }
            requirements.push(Requirement {
                key: key.clone(),
                op,
            });
        }
        // Stable, so that matchLabels stay before expressions on the same key.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Selector { requirements })
    }

    /// The selector that matches nothing (= Default).
    pub fn nothing() -> Selector {
        Selector::default()
    }

    /// Whether a set of labels (None = no labels) is selected.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        !self.matches_nothing()
            && self.requirements.iter().all(|r| {
                let value = labels.and_then(|l| l.get(&r.key));
                match (&r.op, value) {
                    (Op::Equals(want), Some(v)) => want == v,
                    (Op::In(set), Some(v)) => set.contains(v),
                    (Op::NotIn(set), Some(v)) => !set.contains(v),
                    (Op::Exists, Some(_)) => true,
                    (Op::DoesNotExist, Some(_)) => false,
                    (Op::NotIn(_) | Op::DoesNotExist, None) => true,
                    (Op::Equals(_) | Op::In(_) | Op::Exists, None) => false,
                }
            })
    }

    /// True for the match-nothing selector.
    pub fn matches_nothing(&self) -> bool {
        self.requirements.is_empty()
    }
}

fn check_key(key: &str) -> Result<(), SelectorError> {
    match qualified_name_error(key) {
        None => Ok(()),
        Some(reason) => Err(SelectorError::InvalidKey {
            key: key.to_owned(),
            reason,
        }),
    }
}

fn check_value(key: &str, value: &str) -> Result<(), SelectorError> {
    match label_value_error(value) {
        None => Ok(()),
        Some(reason) => Err(SelectorError::InvalidValue {
            key: key.to_owned(),
            value: value.to_owned(),
            reason,
        }),
    }
}

/// The Kubernetes string form, e.g. `a=b,c in (x,y),!d`; `<nothing>` for
/// match-nothing (what Kubernetes prints for `labels.Nothing()`).
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.matches_nothing() {
            return f.write_str("<nothing>");
        }
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let key = &r.key;
            let join = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>().join(",");
            match &r.op {
                Op::Equals(v) => write!(f, "{key}={v}")?,
                Op::In(set) => write!(f, "{key} in ({})", join(set))?,
                Op::NotIn(set) => write!(f, "{key} notin ({})", join(set))?,
                Op::Exists => write!(f, "{key}")?,
                Op::DoesNotExist => write!(f, "!{key}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    /// Labels of a table row: `None` is an object without labels.
    type Labels<'a> = Option<Vec<(&'a str, &'a str)>>;

    fn expr(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn selector(labels: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_labels: (!labels.is_empty()).then(|| map(labels)),
            match_expressions: (!exprs.is_empty()).then_some(exprs),
        }
    }

    fn parse(labels: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> Selector {
        Selector::parse(Some(&selector(labels, exprs))).unwrap()
    }

    #[test]
    fn an_unset_or_empty_selector_matches_nothing() {
        let empties = [
            None,
            Some(LabelSelector::default()),
            Some(LabelSelector {
                match_labels: Some(BTreeMap::new()),
                match_expressions: Some(Vec::new()),
            }),
        ];
        let some = map(&[("app", "web")]);
        for s in &empties {
            let got = Selector::parse(s.as_ref()).unwrap();
            assert!(got.matches_nothing(), "{s:?}");
            assert_eq!(got, Selector::nothing());
            assert_eq!(got, Selector::default());
            assert!(!got.matches(None), "{s:?}");
            assert!(!got.matches(Some(&BTreeMap::new())), "{s:?}");
            assert!(!got.matches(Some(&some)), "{s:?}");
            assert_eq!(got.to_string(), "<nothing>");
        }
    }

    #[test]
    fn a_non_empty_selector_does_not_match_nothing() {
        assert!(!parse(&[("a", "b")], vec![]).matches_nothing());
        assert!(!parse(&[], vec![expr("a", "DoesNotExist", &[])]).matches_nothing());
    }

    #[test]
    fn each_operator_matches_as_kubernetes_does() {
        // (expression, labels, selected)
        let table: Vec<(LabelSelectorRequirement, Labels<'_>, bool)> = vec![
            (expr("a", "In", &["x", "y"]), Some(vec![("a", "x")]), true),
            (expr("a", "In", &["x", "y"]), Some(vec![("a", "y")]), true),
            (expr("a", "In", &["x", "y"]), Some(vec![("a", "z")]), false),
            (expr("a", "In", &["x"]), Some(vec![("b", "x")]), false),
            (expr("a", "In", &["x"]), None, false),
            (expr("a", "In", &[""]), Some(vec![("a", "")]), true),
            (
                expr("a", "NotIn", &["x", "y"]),
                Some(vec![("a", "z")]),
                true,
            ),
            (
                expr("a", "NotIn", &["x", "y"]),
                Some(vec![("a", "x")]),
                false,
            ),
            (expr("a", "NotIn", &["x"]), Some(vec![("b", "x")]), true),
            (expr("a", "NotIn", &["x"]), None, true),
            (expr("a", "Exists", &[]), Some(vec![("a", "")]), true),
            (expr("a", "Exists", &[]), Some(vec![("a", "v")]), true),
            (expr("a", "Exists", &[]), Some(vec![("b", "v")]), false),
            (expr("a", "Exists", &[]), None, false),
            (expr("a", "DoesNotExist", &[]), Some(vec![("a", "")]), false),
            (expr("a", "DoesNotExist", &[]), Some(vec![("b", "v")]), true),
            (expr("a", "DoesNotExist", &[]), Some(vec![]), true),
            (expr("a", "DoesNotExist", &[]), None, true),
        ];
        for (e, labels, want) in table {
            let s = parse(&[], vec![e.clone()]);
            let labels = labels.map(|l| map(&l));
            assert_eq!(s.matches(labels.as_ref()), want, "{e:?} on {labels:?}");
        }
    }

    #[test]
    fn not_in_matches_a_missing_key() {
        let s = parse(&[], vec![expr("tier", "NotIn", &["internal"])]);
        assert!(s.matches(None));
        assert!(s.matches(Some(&map(&[("app", "web")]))));
        assert!(!s.matches(Some(&map(&[("tier", "internal")]))));
    }

    #[test]
    fn does_not_exist_matches_a_missing_key_only() {
        let s = parse(&[], vec![expr("tier", "DoesNotExist", &[])]);
        assert!(s.matches(None));
        assert!(s.matches(Some(&map(&[("app", "web")]))));
        assert!(!s.matches(Some(&map(&[("tier", "")]))));
    }

    #[test]
    fn match_labels_need_the_exact_value() {
        let s = parse(&[("mirror.linkerd.io/exported", "true")], vec![]);
        let table: Vec<(Labels<'_>, bool)> = vec![
            (Some(vec![("mirror.linkerd.io/exported", "true")]), true),
            (
                Some(vec![("mirror.linkerd.io/exported", "true"), ("x", "y")]),
                true,
            ),
            (Some(vec![("mirror.linkerd.io/exported", "True")]), false),
            (Some(vec![("mirror.linkerd.io/exported", "")]), false),
            (Some(vec![("exported", "true")]), false),
            (Some(vec![]), false),
            (None, false),
        ];
        for (labels, want) in table {
            let labels = labels.map(|l| map(&l));
            assert_eq!(s.matches(labels.as_ref()), want, "{labels:?}");
        }
        let empty = parse(&[("a", "")], vec![]);
        assert!(empty.matches(Some(&map(&[("a", "")]))));
        assert!(!empty.matches(None));
    }

    #[test]
    fn match_labels_and_expressions_are_all_required() {
        let s = parse(
            &[("app", "web"), ("env", "prod")],
            vec![
                expr("tier", "In", &["front", "back"]),
                expr("canary", "DoesNotExist", &[]),
                expr("team", "Exists", &[]),
            ],
        );
        let all = [
            ("app", "web"),
            ("env", "prod"),
            ("tier", "front"),
            ("team", "a"),
        ];
        assert!(s.matches(Some(&map(&all))));
        // Dropping or breaking any one requirement unselects.
        for i in 0..all.len() {
            let mut fewer = all.to_vec();
            fewer.remove(i);
            assert!(!s.matches(Some(&map(&fewer))), "without {:?}", all[i]);
        }
        let mut canary = all.to_vec();
        canary.push(("canary", "true"));
        assert!(!s.matches(Some(&map(&canary))));
        let mut wrong_tier = all.to_vec();
        wrong_tier[2] = ("tier", "db");
        assert!(!s.matches(Some(&map(&wrong_tier))));
        assert!(!s.matches(None));
    }

    #[test]
    fn requirements_on_the_same_key_are_anded() {
        let s = parse(
            &[("a", "x")],
            vec![expr("a", "In", &["x", "y"]), expr("a", "NotIn", &["y"])],
        );
        assert!(s.matches(Some(&map(&[("a", "x")]))));
        assert!(!s.matches(Some(&map(&[("a", "y")]))));
        let contradiction = parse(&[("a", "x")], vec![expr("a", "NotIn", &["x"])]);
        assert!(!contradiction.matches(Some(&map(&[("a", "x")]))));
        assert!(!contradiction.matches(None));
    }

    #[test]
    fn operators_are_case_sensitive_and_unknown_ones_are_refused() {
        for op in ["in", "IN", "notin", "exists", "Equals", "=", "Gt", "Lt", ""] {
            let got = Selector::parse(Some(&selector(&[], vec![expr("a", op, &["1"])])));
            assert_eq!(
                got,
                Err(SelectorError::UnknownOperator {
                    key: "a".into(),
                    operator: op.into(),
                }),
                "{op:?}"
            );
        }
    }

    #[test]
    fn in_and_not_in_need_a_value_and_exists_takes_none() {
        for op in ["In", "NotIn"] {
            for values in [None, Some(vec![])] {
                let e = LabelSelectorRequirement {
                    key: "a".into(),
                    operator: op.into(),
                    values,
                };
                assert_eq!(
                    Selector::parse(Some(&selector(&[], vec![e]))),
                    Err(SelectorError::MissingValues {
                        key: "a".into(),
                        operator: op,
                    })
                );
            }
        }
        for op in ["Exists", "DoesNotExist"] {
            assert_eq!(
                Selector::parse(Some(&selector(&[], vec![expr("a", op, &["x"])]))),
                Err(SelectorError::UnexpectedValues {
                    key: "a".into(),
                    operator: op,
                    values: vec!["x".into()],
                })
            );
            // An explicit empty list is no values.
            let e = LabelSelectorRequirement {
                key: "a".into(),
                operator: op.into(),
                values: Some(vec![]),
            };
            assert!(Selector::parse(Some(&selector(&[], vec![e]))).is_ok());
        }
    }

    #[test]
    fn invalid_keys_are_refused_in_labels_and_expressions() {
        let long = "x".repeat(64);
        for key in [
            "",
            "-a",
            "a b",
            "/a",
            "a/",
            "a/b/c",
            "A.com/a",
            long.as_str(),
        ] {
            let by_label = Selector::parse(Some(&selector(&[(key, "v")], vec![])));
            assert!(
                matches!(&by_label, Err(SelectorError::InvalidKey { key: k, .. }) if k == key),
                "{key:?}: {by_label:?}"
            );
            for op in ["In", "NotIn", "Exists", "DoesNotExist"] {
                let values: &[&str] = if op.starts_with('I') || op.starts_with('N') {
                    &["v"]
                } else {
                    &[]
                };
                let by_expr = Selector::parse(Some(&selector(&[], vec![expr(key, op, values)])));
                assert!(
                    matches!(&by_expr, Err(SelectorError::InvalidKey { key: k, .. }) if k == key),
                    "{key:?} {op}: {by_expr:?}"
                );
            }
        }
    }

    #[test]
    fn invalid_values_are_refused_in_labels_and_expressions() {
        let long = "v".repeat(64);
        for value in ["-v", "v-", "a b", "a/b", "a,b", "é", long.as_str()] {
            let want = |got: &Result<Selector, SelectorError>| matches!(got, Err(SelectorError::InvalidValue { key, value: v, .. }) if key == "k" && v == value);
            let by_label = Selector::parse(Some(&selector(&[("k", value)], vec![])));
            assert!(want(&by_label), "{value:?}: {by_label:?}");
            for op in ["In", "NotIn"] {
                let by_expr =
                    Selector::parse(Some(&selector(&[], vec![expr("k", op, &["ok", value])])));
                assert!(want(&by_expr), "{value:?} {op}: {by_expr:?}");
            }
        }
        let max = "v".repeat(63);
        assert!(Selector::parse(Some(&selector(&[("k", &max)], vec![]))).is_ok());
    }

    #[test]
    fn errors_name_the_key_operator_and_value() {
        let table: Vec<(LabelSelector, &[&str])> = vec![
            (
                selector(&[], vec![expr("tier", "Has", &[])]),
                &["tier", "Has"],
            ),
            (selector(&[("Bad Key", "v")], vec![]), &["Bad Key"]),
            (
                selector(&[], vec![expr("tier", "In", &[])]),
                &["tier", "In"],
            ),
            (
                selector(&[], vec![expr("tier", "Exists", &["front"])]),
                &["tier", "Exists", "front"],
            ),
            (selector(&[("tier", "no way")], vec![]), &["tier", "no way"]),
        ];
        for (s, words) in table {
            let msg = Selector::parse(Some(&s)).unwrap_err().to_string();
            for w in words {
                assert!(msg.contains(w), "{msg:?} should name {w:?}");
            }
        }
    }

    #[test]
    fn display_is_the_kubernetes_string_form_sorted_by_key() {
        let table: Vec<(Selector, &str)> = vec![
            (parse(&[("a", "b")], vec![]), "a=b"),
            (parse(&[("a", "")], vec![]), "a="),
            (
                parse(
                    &[("a", "b")],
                    vec![expr("c", "In", &["y", "x"]), expr("d", "DoesNotExist", &[])],
                ),
                "a=b,c in (x,y),!d",
            ),
            (
                parse(
                    &[],
                    vec![
                        expr("z", "Exists", &[]),
                        expr("m", "NotIn", &["2", "1", "1"]),
                        expr("example.com/a", "In", &["v"]),
                    ],
                ),
                "example.com/a in (v),m notin (1,2),z",
            ),
            (
                parse(&[("k", "x")], vec![expr("k", "Exists", &[])]),
                "k=x,k",
            ),
            (Selector::nothing(), "<nothing>"),
        ];
        for (s, want) in table {
            assert_eq!(s.to_string(), want);
        }
    }

    #[test]
    fn value_order_and_repeats_do_not_change_a_selector() {
        let a = parse(&[], vec![expr("k", "In", &["x", "y"])]);
        let b = parse(&[], vec![expr("k", "In", &["y", "x", "y"])]);
        assert_eq!(a, b);
        let c = parse(&[], vec![expr("k", "In", &["x"])]);
        assert_ne!(a, c);
    }

    #[test]
    fn parsing_the_json_of_a_link_selector() {
        let s: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"mirror.linkerd.io/exported": "true"},
            "matchExpressions": [
                {"key": "app", "operator": "NotIn", "values": ["debug"]}
            ]
        }))
        .unwrap();
        let got = Selector::parse(Some(&s)).unwrap();
        assert_eq!(
            got.to_string(),
            "app notin (debug),mirror.linkerd.io/exported=true"
        );
        assert!(got.matches(Some(&map(&[("mirror.linkerd.io/exported", "true")]))));
        assert!(!got.matches(Some(&map(&[
            ("mirror.linkerd.io/exported", "true"),
            ("app", "debug")
        ]))));
    }
}
