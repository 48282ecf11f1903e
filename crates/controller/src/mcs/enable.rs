//! Whether the MCS component runs, and under which cluster name, from what the start
//! found (pure; `startup.rs` asks the apiserver). `--mcs-cluster-name` is an operator's
//! explicit word: it runs the component (a missing CRD is waited for), as it always
//! did. Without it, `--mcs=auto`, the default, runs it only where the ServiceExport CRD
//! is served and the About API's ClusterProperty `id.k8s.io` (KEP-2149, the name MCS
//! implementations agree on) names the cluster. Off is never an error in `auto` (most
//! clusters have no MCS); `on` refuses to start without a usable name.

/// `--mcs`: when the MCS component runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum McsMode {
    /// Where the ServiceExport CRD is served and the cluster has a name.
    Auto,
    /// Always (a missing CRD is waited for); no usable name refuses the start.
    On,
    /// Never.
    Off,
}

/// What the ClusterProperty `id.k8s.io` lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PropertyLookup {
    /// Not asked (the flag names the cluster, or the mode or CRD made it moot), or no
    /// answer in time.
    NotAsked,
    /// Its `spec.value`.
    Value(String),
    /// No such object (or the About API is not served).
    Absent,
    /// The identity may not `get` it (the message says which permission).
    Forbidden(String),
}

/// What the start found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Whether the ServiceExport CRD is served (`None`: not asked, or no answer).
    pub crd_served: Option<bool>,
    /// `--mcs-cluster-name`, trimmed (`None`: empty).
    pub flag: Option<String>,
    /// The ClusterProperty, if asked.
    pub property: PropertyLookup,
}

/// Where the running component's name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameSource {
    /// `--mcs-cluster-name`.
    Flag,
    /// ClusterProperty `id.k8s.io`.
    ClusterProperty,
}

/// Why the component does not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffReason {
    /// `--mcs=off`.
    Disabled,
    /// `auto` and the ServiceExport CRD is not served.
    NoCrd,
    /// No flag and no ClusterProperty `id.k8s.io`.
    NoClusterName,
    /// The ClusterProperty could not be read (the message names the permission).
    Forbidden(String),
    /// The name found is no cluster name we can use (the message says why).
    InvalidClusterName(String),
    /// The apiserver did not answer the start's questions in time.
    Unanswered,
}

impl OffReason {
    /// The metric label (bounded).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::NoCrd => "no_crd",
            Self::NoClusterName => "no_cluster_name",
            Self::Forbidden(_) => "forbidden",
            Self::InvalidClusterName(_) => "invalid_cluster_name",
            Self::Unanswered => "unanswered",
        }
    }

    /// Whether a later look may find MCS able to run (the CRD or the name may come,
    /// the apiserver may answer): the start looks again now and then and says so.
    pub fn may_change(&self) -> bool {
        matches!(self, Self::NoCrd | Self::NoClusterName | Self::Unanswered)
    }
}

impl std::fmt::Display for OffReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Disabled => f.write_str("--mcs=off"),
            Self::NoCrd => f.write_str("the ServiceExport CRD is not served"),
            Self::NoClusterName => f.write_str(
                "this cluster has no name in the cluster set: set --mcs-cluster-name or create the ClusterProperty id.k8s.io",
            ),
            Self::Forbidden(e) => write!(f, "the ClusterProperty id.k8s.io cannot be read: {e}"),
            Self::InvalidClusterName(e) => write!(f, "{e}"),
            Self::Unanswered => f.write_str(
                "the apiserver did not say in time whether the ServiceExport CRD is served or the cluster is named",
            ),
        }
    }
}

/// The verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The component runs as `name`.
    Run {
        /// This cluster's name in the cluster set.
        name: String,
        /// Where it came from.
        source: NameSource,
    },
    /// It does not run (in `on` mode this refuses the start).
    Off(OffReason),
}

/// Whether discovery must be asked about the CRD: only when it can decide (`auto`
/// without the flag).
pub fn needs_crd(mode: McsMode, flag: Option<&str>) -> bool {
    mode == McsMode::Auto && flag.is_none()
}

/// Whether the ClusterProperty must be asked: only when it can decide.
pub fn needs_property(mode: McsMode, crd_served: Option<bool>, flag: Option<&str>) -> bool {
    flag.is_none()
        && match mode {
            McsMode::Off => false,
            McsMode::Auto => crd_served == Some(true),
            McsMode::On => true,
        }
}

/// The verdict for `mode` on what the start `found`. The flag wins over the
/// ClusterProperty (an operator's explicit word) and runs the component in `auto` too;
/// either must be a cluster name ([`service_mirror_core::validate_cluster_name`]: the
/// links' names, so a DNS label of at most 48, though KEP-2149 allows a dotted id).
pub fn decide(mode: McsMode, found: &Found) -> Decision {
    if mode == McsMode::Off {
        return Decision::Off(OffReason::Disabled);
    }
    if mode == McsMode::Auto && found.flag.is_none() {
        match found.crd_served {
            Some(true) => {}
            Some(false) => return Decision::Off(OffReason::NoCrd),
            None => return Decision::Off(OffReason::Unanswered),
        }
    }
    let (name, source) = match (&found.flag, &found.property) {
        (Some(flag), _) => (flag.clone(), NameSource::Flag),
        (None, PropertyLookup::Value(v)) => (v.trim().to_owned(), NameSource::ClusterProperty),
        (None, PropertyLookup::Forbidden(e)) => {
            return Decision::Off(OffReason::Forbidden(e.clone()));
        }
        (None, PropertyLookup::Absent) => return Decision::Off(OffReason::NoClusterName),
        (None, PropertyLookup::NotAsked) => return Decision::Off(OffReason::Unanswered),
    };
    match service_mirror_core::validate_cluster_name(&name) {
        Ok(()) => Decision::Run { name, source },
        Err(e) => {
            let shown = shown(&name);
            Decision::Off(OffReason::InvalidClusterName(match source {
                NameSource::Flag => format!("--mcs-cluster-name {shown:?}: {e}"),
                NameSource::ClusterProperty => {
                    format!("ClusterProperty id.k8s.io value {shown:?}: {e}")
                }
            }))
        }
    }
}

/// At most 64 characters of a refused name: a ClusterProperty value may be 128,000
/// long, and it goes into a log line, an Event note and an error.
fn shown(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &name[..end]),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::McsMode::{Auto, Off, On};
    use super::*;

    fn found(crd_served: Option<bool>, flag: Option<&str>, property: PropertyLookup) -> Found {
        Found {
            crd_served,
            flag: flag.map(str::to_owned),
            property,
        }
    }

    fn run(name: &str, source: NameSource) -> Decision {
        Decision::Run {
            name: name.into(),
            source,
        }
    }

    #[test]
    fn mcs_runs_by_default_only_with_the_crd_and_a_name() {
        use NameSource::{ClusterProperty, Flag};
        use PropertyLookup::{Absent, NotAsked, Value};
        let forbidden = || PropertyLookup::Forbidden("cannot get".into());
        let (yes, no) = (Some(true), Some(false));
        let table: Vec<(&str, McsMode, Found, Decision)> = vec![
            (
                "auto, CRD, property",
                Auto,
                found(yes, None, Value("west".into())),
                run("west", ClusterProperty),
            ),
            (
                "auto, flag: nothing asked, it runs",
                Auto,
                found(None, Some("east"), NotAsked),
                run("east", Flag),
            ),
            (
                "the flag wins over the property",
                Auto,
                found(yes, Some("east"), Value("west".into())),
                run("east", Flag),
            ),
            (
                "an explicit flag runs without the CRD (waited for), as it always did",
                Auto,
                found(no, Some("east"), NotAsked),
                run("east", Flag),
            ),
            (
                "a property value's blanks are not part of the name",
                Auto,
                found(yes, None, Value(" west\n".into())),
                run("west", ClusterProperty),
            ),
            (
                "auto without the CRD",
                Auto,
                found(no, None, NotAsked),
                Decision::Off(OffReason::NoCrd),
            ),
            (
                "auto, no answer on the CRD",
                Auto,
                found(None, None, NotAsked),
                Decision::Off(OffReason::Unanswered),
            ),
            (
                "auto, CRD, no name anywhere",
                Auto,
                found(yes, None, Absent),
                Decision::Off(OffReason::NoClusterName),
            ),
            (
                "auto, CRD, no answer on the property",
                Auto,
                found(yes, None, NotAsked),
                Decision::Off(OffReason::Unanswered),
            ),
            (
                "auto, CRD, the property unreadable",
                Auto,
                found(yes, None, forbidden()),
                Decision::Off(OffReason::Forbidden("cannot get".into())),
            ),
            (
                "off, everything there",
                Off,
                found(yes, Some("east"), Value("west".into())),
                Decision::Off(OffReason::Disabled),
            ),
            (
                "on, the CRD not asked: it runs (and waits for the CRD)",
                On,
                found(None, None, Value("west".into())),
                run("west", ClusterProperty),
            ),
            (
                "on without a name is off (the start refuses)",
                On,
                found(None, None, Absent),
                Decision::Off(OffReason::NoClusterName),
            ),
        ];
        for (what, mode, found, want) in table {
            assert_eq!(decide(mode, &found), want, "{what}");
        }
    }

    #[test]
    fn a_name_that_is_no_cluster_name_keeps_mcs_off_and_says_where_it_came_from() {
        for (flag, property, names) in [
            (
                None,
                "west.zone-1",
                "ClusterProperty id.k8s.io value \"west.zone-1\"",
            ),
            (None, "", "ClusterProperty id.k8s.io value \"\""),
            (None, &"a".repeat(49), "ClusterProperty id.k8s.io"),
            (None, &"é".repeat(100_000), "ClusterProperty id.k8s.io"),
            (Some("West"), "west", "--mcs-cluster-name \"West\""),
        ] {
            let d = decide(
                Auto,
                &found(Some(true), flag, PropertyLookup::Value(property.into())),
            );
            let Decision::Off(reason @ OffReason::InvalidClusterName(_)) = d else {
                panic!("{flag:?}/{property:?}: {d:?}");
            };
            assert_eq!(reason.label(), "invalid_cluster_name");
            assert!(reason.to_string().starts_with(names), "{reason}");
            assert!(reason.to_string().len() < 400, "a shown name is cut");
        }
    }

    #[test]
    fn the_crd_and_the_property_are_asked_only_when_they_can_decide() {
        let (yes, no) = (Some(true), Some(false));
        let table = [
            (Auto, None, None, true, false),
            (Auto, yes, None, true, true),
            (Auto, no, None, true, false),
            (Auto, None, Some("east"), false, false),
            (On, None, None, false, true),
            (On, None, Some("east"), false, false),
            (Off, None, None, false, false),
        ];
        for (mode, crd, flag, want_crd, want_property) in table {
            let what = format!("{mode:?} crd={crd:?} flag={flag:?}");
            assert_eq!(needs_crd(mode, flag), want_crd, "{what}");
            assert_eq!(needs_property(mode, crd, flag), want_property, "{what}");
        }
    }

    #[test]
    fn every_off_reason_has_its_own_bounded_label() {
        let reasons = [
            OffReason::Disabled,
            OffReason::NoCrd,
            OffReason::NoClusterName,
            OffReason::Forbidden(String::new()),
            OffReason::InvalidClusterName(String::new()),
            OffReason::Unanswered,
        ];
        let labels: std::collections::BTreeSet<_> = reasons.iter().map(OffReason::label).collect();
        assert_eq!(labels.len(), reasons.len());
        assert!(!labels.contains("flag") && !labels.contains("cluster_property"));
        let may: Vec<_> = reasons.iter().filter(|r| r.may_change()).collect();
        assert_eq!(
            may,
            [
                &OffReason::NoCrd,
                &OffReason::NoClusterName,
                &OffReason::Unanswered
            ],
            "an operator's choice or a wrong value changes only by a restart"
        );
    }
}
