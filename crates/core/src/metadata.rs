//! Which remote labels and annotations a Link mirror copies (placeholder API; the
//! implementation lands next).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A Link's `excludedLabels` or `excludedAnnotations`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exclusions {
    patterns: Vec<String>,
}

/// Why an exclusion pattern is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExclusionError {
    /// Placeholder.
    #[error("invalid exclusion pattern {0:?}")]
    Invalid(String),
}

impl Exclusions {
    /// Parses patterns.
    pub fn parse(patterns: &[String]) -> Result<Exclusions, ExclusionError> {
        Ok(Exclusions {
            patterns: patterns.to_vec(),
        })
    }

    /// Whether `key` is excluded.
    pub fn excludes(&self, key: &str) -> bool {
        self.patterns.iter().any(|p| match p.strip_suffix("/*") {
            Some(prefix) => key.starts_with(prefix),
            None => key == p,
        })
    }
}

/// Labels a Link mirror copies.
pub fn copied_labels(remote: &ObjectMeta, excluded: &Exclusions) -> BTreeMap<String, String> {
    remote
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with("mirror.linkerd.io") && !excluded.excludes(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Annotations a Link mirror Service copies.
pub fn copied_annotations(
    remote: &ObjectMeta,
    excluded: &Exclusions,
    owned: &[&str],
) -> BTreeMap<String, String> {
    remote
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !excluded.excludes(k) && !owned.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}
