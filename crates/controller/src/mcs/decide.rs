//! The pure middle of the MCS reconcile: from what was gathered about one name (the
//! merge of its exports, the local export and import as the caches hold them, which
//! clusters have settled) to what to write, delete and tell. `reconcile.rs` gathers and applies the
//! export's side, `imports.rs` (and its children) the import's, derived Service's and
//! slices'.

use super::resource::ServiceExport;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use service_mirror_core::mcs::{
    ClusterExport, EXPORT_CONDITION_TYPES, ExportTo, ImportSpec, ImportType, Merge, Validity,
    conflict_reason, export_conditions, with_transition_times,
};
use service_mirror_core::mcs_derived::{DerivedAction, derived_action};
use service_mirror_core::mcs_slices::{
    DesiredImportSlices, ImportSlicesInput, SourceGateway, desired_import_slices,
    plan_import_slices,
};
use service_mirror_core::traffic::TrafficPolicy;
use service_mirror_core::{Action, ServiceKey};
use std::collections::{BTreeMap, BTreeSet};

/// What a local export was last judged to be (for Events and the gauge).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Valid, no conflict.
    Exported,
    /// Valid, with these conflicts (the KEP's reasons, comma-joined).
    Conflict(String),
    /// Not valid: `NoService` or `InvalidServiceType`.
    Invalid(&'static str),
}

impl Verdict {
    pub(super) fn of(validity: Validity, merge: &Merge) -> Self {
        match (validity.is_valid(), merge.conflicts.is_empty()) {
            (false, _) => Self::Invalid(validity.reason()),
            (true, true) => Self::Exported,
            (true, false) => Self::Conflict(conflict_reason(&merge.conflicts)),
        }
    }

    pub(super) fn state(&self) -> &'static str {
        match self {
            Self::Exported => "Exported",
            Self::Conflict(_) => "Conflict",
            Self::Invalid(reason) => reason,
        }
    }
}

/// What was gathered about the local export of one name.
pub(super) struct ExportFacts<'a> {
    /// The local export as the cache holds it (`None`: there is none).
    pub(super) export: Option<&'a ServiceExport>,
    /// The local cluster's entry among the name's exports (`None`: not among them).
    pub(super) local: Option<&'a ClusterExport>,
    /// The merge of the name's exports in every listed cluster.
    pub(super) merged: &'a Merge,
    /// The verdict last remembered for the name: the export's uid, and the verdict.
    pub(super) last: Option<&'a (Option<String>, Verdict)>,
    /// The resourceVersion the export had when we last wrote (or were refused for good).
    pub(super) written: Option<&'a String>,
    /// Whether this replica leads (only the leader remembers and tells verdicts).
    pub(super) leading: bool,
    /// The transition time of a condition that changes.
    pub(super) now: Timestamp,
}

/// What becomes of the local export of one name.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum ExportStep {
    /// No local export: its verdict and last write are forgotten.
    Forget,
    /// Nothing to remember, tell or write.
    Nothing,
    /// It was judged: remember, tell and write this.
    Judged(ExportJudgement),
}

/// The judgement of a local export.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct ExportJudgement {
    /// The verdict to remember (the export's uid, the verdict); `None`: not leading (the
    /// leader tells it, or we do once we lead).
    pub(super) remember: Option<(Option<String>, Verdict)>,
    /// An Event on the export: a new problem, or its end, told once.
    pub(super) event: Option<Told>,
    /// Our conditions to apply to its status; `None`: none to write (they say so
    /// already, or our last write has not come back yet, or was refused).
    pub(super) conditions: Option<Vec<Condition>>,
}

/// An Event to publish.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Told {
    pub(super) type_: EventType,
    pub(super) reason: &'static str,
    pub(super) note: String,
}

/// What to do about the local export of one name (see [`ExportFacts`]).
pub(super) fn decide_export(facts: &ExportFacts<'_>) -> ExportStep {
    let Some(export) = facts.export else {
        return ExportStep::Forget;
    };
    let Some(local) = facts.local else {
        return ExportStep::Nothing;
    };
    let validity = Validity::of(local);
    let verdict = Verdict::of(validity, facts.merged);
    let (remember, event) = match facts.leading {
        true => {
            let now = (export.metadata.uid.clone(), verdict.clone());
            let event = match facts.last == Some(&now) {
                true => None,
                false => told(&verdict, facts.last.is_some(), facts.merged),
            };
            (Some(now), event)
        }
        false => (None, None),
    };
    let conditions = match facts.written == export.metadata.resource_version.as_ref() {
        true => None, // our last write has not come back yet, or was refused
        false => with_transition_times(
            export.conditions(),
            &export_conditions(validity, facts.merged),
            facts.now,
        )
        .map(|all| {
            all.into_iter()
                .filter(|c| EXPORT_CONDITION_TYPES.contains(&c.type_.as_str()))
                .collect()
        }),
    };
    ExportStep::Judged(ExportJudgement {
        remember,
        event,
        conditions,
    })
}

/// The Event of a new `verdict` (`before`: the name had one): a problem, or its end; a
/// first clean verdict is not told.
fn told(verdict: &Verdict, before: bool, merged: &Merge) -> Option<Told> {
    let (type_, reason, note) = match verdict {
        Verdict::Invalid(reason) => (
            EventType::Warning,
            "ExportInvalid",
            format!("{reason}: not exported; see its Valid condition"),
        ),
        Verdict::Conflict(reasons) => (
            EventType::Warning,
            "ExportConflict",
            format!(
                "{reasons}: the exports of this name in clusters {} differ; the oldest export's value is imported (where it reaches)",
                merged.clusters.join(", ")
            ),
        ),
        // Back to normal after a problem: said; a first clean verdict is not.
        Verdict::Exported if before => (
            EventType::Normal,
            "Exported",
            format!(
                "exported, with no conflict, from clusters {}",
                merged.clusters.join(", ")
            ),
        ),
        Verdict::Exported => return None,
    };
    Some(Told {
        type_,
        reason,
        note,
    })
}

/// Most cluster names an `ExportToUnknownCluster` note quotes.
const MAX_NAMED: usize = 10;

/// What is wrong with the local export's `service-mirror.io/export-to` annotation:
/// told once per episode (an Event, a warning, the metric).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ExportToProblem {
    /// `InvalidExportTo` or `ExportToUnknownCluster` (the Event's reason, the metric's
    /// label).
    pub(super) reason: &'static str,
    /// For people: the offending names (bounded).
    pub(super) note: String,
}

impl ExportToProblem {
    /// Of the local export's `export_to`, in `local`: an invalid annotation, or names
    /// that are neither `local` nor a cluster this component knows (one with a feed, or
    /// named by the link sources; `expected` None: those are not listed yet, so no name
    /// is called unknown).
    pub(super) fn of(
        export_to: &ExportTo,
        local: &str,
        feeds: &BTreeMap<String, bool>,
        expected: Option<&BTreeSet<String>>,
    ) -> Option<Self> {
        match export_to {
            ExportTo::Every => None,
            ExportTo::Invalid(reason) => Some(Self {
                reason: "InvalidExportTo",
                note: format!("{reason}: exported to no other cluster"),
            }),
            ExportTo::Only(names) => {
                let expected = expected?;
                let unknown: Vec<&str> = names
                    .iter()
                    .filter(|n| *n != local && !feeds.contains_key(*n) && !expected.contains(*n))
                    .map(String::as_str)
                    .collect();
                if unknown.is_empty() {
                    return None;
                }
                let mut named = unknown
                    .iter()
                    .take(MAX_NAMED)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ");
                if unknown.len() > MAX_NAMED {
                    named.push_str(&format!(" and {} more", unknown.len() - MAX_NAMED));
                }
                Some(Self {
                    reason: "ExportToUnknownCluster",
                    note: format!(
                        "export-to names clusters this cluster set does not know: {named}"
                    ),
                })
            }
        }
    }
}

/// What to do about the local export's annotation problem (see [`decide_export_to`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum ExportToStep {
    /// As remembered (or not leading): nothing.
    Nothing,
    /// No problem (any more): forget the one remembered.
    Forget,
    /// A new problem (or another, or on a new export of the name): remember and tell it.
    Tell((Option<String>, ExportToProblem)),
}

/// The step for the problem `now` (the export's uid, the problem) of a local export,
/// given the one `last` remembered: a problem is told once per episode, when it starts
/// or changes; only the leader remembers and tells.
pub(super) fn decide_export_to(
    now: Option<(Option<String>, ExportToProblem)>,
    last: Option<&(Option<String>, ExportToProblem)>,
    leading: bool,
) -> ExportToStep {
    match (now, last) {
        _ if !leading => ExportToStep::Nothing,
        (None, None) => ExportToStep::Nothing,
        (None, Some(_)) => ExportToStep::Forget,
        (Some(now), Some(last)) if &now == last => ExportToStep::Nothing,
        (Some(now), _) => ExportToStep::Tell(now),
    }
}

/// Which clusters have settled: a cluster counts now (its lists are in), or is known
/// gone (its link removed, or named by no link source once those were listed). See the
/// module doc of imports.rs.
pub(super) struct Settling<'a> {
    /// Each cluster with a feed (the local one included), and whether it counts.
    pub(super) feeds: BTreeMap<String, bool>,
    /// The local cluster (never unlisted: nothing is judged before its lists are in).
    pub(super) local: &'a str,
    /// The clusters the link sources named when first listed (`None`: not yet).
    pub(super) expected: Option<&'a BTreeSet<String>>,
    /// Clusters whose link was removed since.
    pub(super) removed: &'a BTreeSet<String>,
}

impl Settling<'_> {
    /// Whether `cluster` counts now or is known gone.
    pub(super) fn settled(&self, cluster: &str) -> bool {
        match self.feeds.get(cluster) {
            Some(counts) => *counts,
            None => {
                self.removed.contains(cluster)
                    || self.expected.is_some_and(|e| !e.contains(cluster))
            }
        }
    }

    /// For an import whose status names no cluster (its status write never came):
    /// every cluster a source names is settled, and every one with a feed counts.
    pub(super) fn all_settled(&self) -> bool {
        self.expected
            .is_some_and(|e| e.iter().all(|c| self.settled(c)))
            && self
                .feeds
                .iter()
                .all(|(c, counts)| *counts || c == self.local)
    }
}

/// The local ServiceImport of a name as the cache holds it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct StoredImport {
    /// It is ours (`core::mcs_import::is_owned_import`).
    pub(super) owned: bool,
    /// The clusters its status lists.
    pub(super) clusters: Vec<String>,
}

/// What becomes of the local import of one name, its derived Service and its slices.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum ImportPlan {
    /// Another's import holds the name: never touched (told once), and our slices and
    /// derived Service of the name go (none of ours serves a name not imported here).
    Foreign,
    /// No export left, but these clusters the import lists may export it still (they
    /// have not settled; none listed while not all have): kept, judged again when they
    /// list or their links go.
    Keep { unsettled: Vec<String> },
    /// No export left: our slices go, then our import (`import`: one is cached), then
    /// our derived Service.
    Remove { import: bool },
    /// The merge's import, `spec`: the derived Service, then the import, then its
    /// slices; the slices of `keep` (clusters the stored import lists that have not
    /// settled) stay as they are, as they keep their place in the import.
    Write {
        spec: ImportSpec,
        keep: BTreeSet<String>,
    },
}

/// What to do about the local import of a name: `stored` as cached, `merged` from the
/// exports, `settling` which clusters settled.
pub(super) fn decide_import(
    stored: Option<&StoredImport>,
    merged: &Merge,
    settling: &Settling<'_>,
) -> ImportPlan {
    if stored.is_some_and(|i| !i.owned) {
        return ImportPlan::Foreign;
    }
    let listed = stored.map(|i| i.clusters.as_slice()).unwrap_or_default();
    let Some(spec) = merged.import.as_ref() else {
        let Some(_) = stored else {
            // Slices of ours with no import of ours (left by a failed delete): they go.
            return ImportPlan::Remove { import: false };
        };
        let unsettled: Vec<String> = listed
            .iter()
            .filter(|c| !settling.settled(c))
            .cloned()
            .collect();
        // One whose status names no cluster (its status write never came) may be any
        // cluster's: it goes only once every cluster counts or is known gone.
        let unknown = listed.is_empty() && !settling.all_settled();
        return match unsettled.is_empty() && !unknown {
            true => ImportPlan::Remove { import: true },
            false => ImportPlan::Keep { unsettled },
        };
    };
    // A cluster the stored import lists that does not count yet (a restart, a slow
    // list) keeps its slices as they are, as it keeps its place in the import.
    let keep = listed
        .iter()
        .filter(|c| !merged.clusters.contains(c) && !settling.settled(c))
        .cloned()
        .collect();
    ImportPlan::Write {
        spec: spec.clone(),
        keep,
    }
}

/// What to do about the derived Service of a name.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum DerivedStep {
    /// None is cached: create it.
    Create,
    /// Another's Service holds the name: never touched (told once); the import has no
    /// ips.
    Foreign,
    /// Ours: bring it to the desired one.
    Ours(DerivedAction),
}

/// What makes `current` (`owned`: it is ours, `core::mcs_derived::is_owned_derived`)
/// the derived Service `desired`.
pub(super) fn decide_derived(
    current: Option<&Service>,
    owned: bool,
    desired: &Service,
) -> DerivedStep {
    match current {
        None => DerivedStep::Create,
        Some(_) if !owned => DerivedStep::Foreign,
        Some(current) => DerivedStep::Ours(derived_action(current, desired)),
    }
}

/// What was gathered about the slices of one import.
pub(super) struct SliceFacts<'a> {
    pub(super) key: &'a ServiceKey,
    /// Our import slices are listed (none is written before).
    pub(super) listed: bool,
    /// The import (`None`: no import of ours; every slice of ours of the name goes).
    pub(super) spec: Option<&'a ImportSpec>,
    /// The clusters that export it validly.
    pub(super) clusters: &'a [String],
    /// Clusters whose stored slices stay as they are (see [`ImportPlan::Write`]).
    pub(super) keep: BTreeSet<String>,
    /// The uid of our import as cached (`None`: none of ours, or a new one whose watch
    /// event has not come: its slices come with it, which brings its uid).
    pub(super) import_uid: Option<&'a str>,
    /// This cluster's Service's own slices of the name (`None`: not listed yet).
    pub(super) local_slices: Option<&'a [EndpointSlice]>,
    /// Each linked cluster's gateway, as its link last reported it.
    pub(super) gateways: &'a BTreeMap<String, Option<SourceGateway>>,
    /// This cluster's name.
    pub(super) local_cluster: &'a str,
    /// Our controller namespace.
    pub(super) controller_namespace: &'a str,
    /// Our import slices of the name, as cached.
    pub(super) stored: &'a [EndpointSlice],
    /// Where the import's traffic goes (`core::traffic`).
    pub(super) traffic: &'a TrafficPolicy,
}

/// The slice writes of one import, in order; `None`: wait (not listed yet, or the new
/// import not seen yet: judged again when it is).
pub(super) fn decide_slices(facts: SliceFacts<'_>) -> Option<Vec<Action>> {
    if !facts.listed {
        return None;
    }
    let mut desired = match (facts.spec, facts.import_uid) {
        (Some(spec), Some(_)) => desired_import_slices(&ImportSlicesInput {
            key: facts.key,
            ports: &spec.ports,
            headless: spec.type_ == ImportType::Headless,
            clusters: facts.clusters,
            local_cluster: facts.local_cluster,
            local_slices: facts.local_slices,
            gateways: facts.gateways,
            controller_namespace: facts.controller_namespace,
            traffic: facts.traffic,
        }),
        (Some(_), None) => return None,
        (None, _) => DesiredImportSlices::default(),
    };
    desired.untouched.extend(facts.keep);
    let owner = OwnerReference {
        api_version: format!("{}/{}", service_mirror_core::mcs::GROUP, super::VERSION),
        kind: "ServiceImport".into(),
        name: facts.key.name.clone(),
        uid: facts.import_uid.unwrap_or_default().to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    Some(plan_import_slices(
        facts.key,
        &desired,
        facts.stored,
        &owner,
        facts.controller_namespace,
    ))
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
