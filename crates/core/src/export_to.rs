//! `service-mirror.io/export-to` on a remote Service: which clusters' link controllers
//! mirror it (issue 32, point 4, the Link half).
//!
//! The same annotation, and the same parse ([`ExportTo::parse`]), as on a ServiceExport
//! (the MCS half): a comma-separated list of cluster names as the cluster set names them
//! (each controller's `--mcs-cluster-name` or ClusterProperty `id.k8s.io`). A remote
//! Service a link exports (its selector, its remote-discovery selector or, for a link
//! Secret, its gateway annotations) that carries it is mirrored only by the controllers
//! of the listed clusters; every other controller withholds it, so a mirror it had goes.
//! The rule is never wider than asked: an invalid list reaches no cluster, and a
//! controller that does not know its own cluster's name mirrors no narrowed Service (it
//! cannot tell whether it is listed).

use k8s_openapi::api::core::v1::Service;

use crate::mcs::{EXPORT_TO_ANNOTATION, ExportTo};

/// Why a remote Service the link exports is not mirrored by this cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Withheld {
    /// The annotation lists clusters, and not this one (or none at all).
    NotListed,
    /// The annotation names an invalid cluster name (the reason, quoting them, bounded
    /// but as the remote wrote them: sanitize before a log or an Event): mirrored by no
    /// cluster.
    Invalid(String),
    /// The annotation lists clusters and this cluster has no name: it cannot tell
    /// whether it is one of them.
    NoClusterName,
}

impl Withheld {
    /// A bounded label (metrics, logs).
    pub fn reason(&self) -> &'static str {
        match self {
            Withheld::NotListed => "export_to_not_listed",
            Withheld::Invalid(_) => "invalid_export_to",
            Withheld::NoClusterName => "export_to_no_cluster_name",
        }
    }

    /// What an operator reads, without remote text (a Link's status entry).
    pub fn describe(&self) -> &'static str {
        match self {
            Withheld::NotListed => "its service-mirror.io/export-to does not list this cluster",
            Withheld::Invalid(_) => {
                "its service-mirror.io/export-to names an invalid cluster name: mirrored by no cluster"
            }
            Withheld::NoClusterName => {
                "it has a service-mirror.io/export-to and this cluster has no name (--mcs-cluster-name or the ClusterProperty id.k8s.io)"
            }
        }
    }
}

/// Whether the cluster `local` (`None`: its name is unknown) withholds `service`, by the
/// Service's [`EXPORT_TO_ANNOTATION`]; `None`: it may mirror it (no annotation, or one
/// listing `local`).
pub fn withheld(service: &Service, local: Option<&str>) -> Option<Withheld> {
    let value = service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXPORT_TO_ANNOTATION));
    match ExportTo::parse(value.map(String::as_str)) {
        ExportTo::Every => None,
        ExportTo::Invalid(reason) => Some(Withheld::Invalid(reason)),
        // No cluster at all: whatever this one's name.
        ExportTo::Only(names) if names.is_empty() => Some(Withheld::NotListed),
        ExportTo::Only(names) => match local {
            None => Some(Withheld::NoClusterName),
            Some(local) if names.contains(local) => None,
            Some(_) => Some(Withheld::NotListed),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn svc(export_to: Option<&str>) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some("web".into());
        s.metadata.annotations = export_to.map(|v| {
            BTreeMap::from([
                (EXPORT_TO_ANNOTATION.to_string(), v.to_string()),
                ("other".to_string(), "x".to_string()),
            ])
        });
        s
    }

    /// Who mirrors what: (annotation, this cluster's name, verdict).
    #[test]
    fn who_mirrors_what() {
        let invalid = |s: &str| Some(Withheld::Invalid(s.to_string()));
        let cases: &[(Option<&str>, Option<&str>, Option<Withheld>)] = &[
            // No annotation: every cluster, named or not.
            (None, Some("east"), None),
            (None, None, None),
            // Listed.
            (Some("east"), Some("east"), None),
            (Some("west,east"), Some("east"), None),
            (Some(" west , east ,"), Some("east"), None),
            // Not listed.
            (Some("east"), Some("west"), Some(Withheld::NotListed)),
            (Some("west,north"), Some("east"), Some(Withheld::NotListed)),
            // A prefix or a longer name is another name.
            (Some("eas"), Some("east"), Some(Withheld::NotListed)),
            (Some("east-1"), Some("east"), Some(Withheld::NotListed)),
            // Empty lists reach no cluster, named or not.
            (Some(""), Some("east"), Some(Withheld::NotListed)),
            (Some(","), None, Some(Withheld::NotListed)),
            (Some(" , "), Some("east"), Some(Withheld::NotListed)),
            // This cluster has no name: a narrowed Service is not mirrored.
            (Some("east"), None, Some(Withheld::NoClusterName)),
            (Some("east,west"), None, Some(Withheld::NoClusterName)),
            // One invalid name: no cluster, even a listed one, named or not.
            (
                Some("east,Bad_Name"),
                Some("east"),
                invalid("not valid cluster names: Bad_Name"),
            ),
            (
                Some("East"),
                Some("east"),
                invalid("not valid cluster names: East"),
            ),
            (
                Some("east,Bad_Name"),
                None,
                invalid("not valid cluster names: Bad_Name"),
            ),
            (
                Some("east;west"),
                Some("east"),
                invalid("not valid cluster names: east;west"),
            ),
        ];
        for (annotation, local, want) in cases {
            assert_eq!(
                &withheld(&svc(*annotation), *local),
                want,
                "export-to {annotation:?} in cluster {local:?}"
            );
        }
    }

    #[test]
    fn a_hostile_annotation_is_bounded_and_reaches_no_cluster() {
        let long = format!("east,{}", "X\n".repeat(10_000));
        let Some(Withheld::Invalid(reason)) = withheld(&svc(Some(&long)), Some("east")) else {
            panic!("invalid");
        };
        assert!(reason.chars().count() < 300, "{}", reason.len());
        let many = (0..1000).map(|i| format!("c{i}")).collect::<Vec<_>>();
        let listed = many.join(",");
        assert_eq!(withheld(&svc(Some(&listed)), Some("c999")), None);
        assert_eq!(
            withheld(&svc(Some(&listed)), Some("east")),
            Some(Withheld::NotListed)
        );
    }

    #[test]
    fn reasons_are_bounded_labels_and_descriptions_quote_no_remote_text() {
        let all = [
            Withheld::NotListed,
            Withheld::Invalid("not valid cluster names: <script>".into()),
            Withheld::NoClusterName,
        ];
        let labels: Vec<_> = all.iter().map(Withheld::reason).collect();
        assert_eq!(
            labels,
            [
                "export_to_not_listed",
                "invalid_export_to",
                "export_to_no_cluster_name"
            ]
        );
        assert!(all.iter().all(|w| !w.describe().contains("<script>")));
    }
}
