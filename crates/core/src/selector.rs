//! Label selectors of Link resources (placeholder API; the implementation lands next).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A validated Kubernetes label selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    labels: BTreeMap<String, String>,
}

/// Why a LabelSelector is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// Placeholder.
    #[error("invalid selector: {0}")]
    Invalid(String),
}

impl Selector {
    /// `None` or empty matches nothing.
    pub fn parse(selector: Option<&LabelSelector>) -> Result<Selector, SelectorError> {
        Ok(Selector {
            labels: selector
                .and_then(|s| s.match_labels.clone())
                .unwrap_or_default(),
        })
    }

    /// The selector that matches nothing.
    pub fn nothing() -> Selector {
        Selector::default()
    }

    /// Whether `labels` are selected.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        !self.labels.is_empty()
            && self
                .labels
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    }

    /// True for the match-nothing selector.
    pub fn matches_nothing(&self) -> bool {
        self.labels.is_empty()
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        write!(f, "{}", parts.join(","))
    }
}
