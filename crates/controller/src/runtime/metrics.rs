//! What the runtime's workers count for every component: reconciles by outcome and
//! their duration, labelled by the component (`link`, `federation`, `mcs`: bounded,
//! never a key), as controller-runtime's `controller_runtime_reconcile_total`.
//!
//! The count is also the witness tests wait on: "the change was reconciled and nothing
//! was written" is a wait for the count to move, not a fixed sleep.

use super::queue::Outcome;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

/// Labels of a reconcile's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReconcileLabels {
    /// The component: `link`, `federation` or `mcs`.
    pub(crate) component: String,
    /// `done`, `requeue` (converged, look again later) or `failed` (retried with backoff).
    pub(crate) outcome: String,
}

/// Labels of a component.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ComponentLabels {
    /// The component: `link`, `federation` or `mcs`.
    pub(crate) component: String,
}

fn duration_histogram() -> Histogram {
    // 0.5 ms to ~16 s, as the link controller's per-cluster histogram.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The runtime's families.
#[derive(Debug)]
pub(crate) struct RuntimeFamilies {
    /// Reconciles of one key, by component and outcome.
    pub(crate) reconciles: Family<ReconcileLabels, Counter>,
    /// Time to reconcile one key, by component.
    pub(crate) duration: Family<ComponentLabels, Histogram, fn() -> Histogram>,
}

impl Default for RuntimeFamilies {
    fn default() -> Self {
        Self {
            reconciles: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
        }
    }
}

impl RuntimeFamilies {
    /// Registers the families (under the registry's prefix).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "component_reconciles",
            "Reconciles of one key by component (link, federation, mcs) and outcome (done, requeue, failed)",
            self.reconciles.clone(),
        );
        r.register(
            "component_reconcile_duration_seconds",
            "Time to reconcile one key, by component (link, federation, mcs)",
            self.duration.clone(),
        );
    }

    /// Counts one reconcile of `component` that took `took`; `outcome` `None`: failed.
    pub(crate) fn observe(&self, component: &str, outcome: Option<&Outcome>, took: Duration) {
        let outcome = outcome_label(outcome);
        self.reconciles
            .get_or_create(&ReconcileLabels {
                component: component.into(),
                outcome: outcome.into(),
            })
            .inc();
        self.duration
            .get_or_create(&ComponentLabels {
                component: component.into(),
            })
            .observe(took.as_secs_f64());
    }
}

/// The `outcome` label of a reconcile that ended in `outcome` (`None`: failed).
pub(crate) fn outcome_label(outcome: Option<&Outcome>) -> &'static str {
    match outcome {
        Some(Outcome::Done) => "done",
        Some(Outcome::RequeueAfter(_)) => "requeue",
        Some(Outcome::Failed) | None => "failed",
    }
}

/// Where a component's reconciles are counted: its name and the process's families.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meter<'a> {
    /// The families.
    pub(crate) families: &'a RuntimeFamilies,
    /// The component's label.
    pub(crate) component: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(f: &RuntimeFamilies) -> String {
        crate::metrics::registered_text(|r| f.register(r))
    }

    #[test]
    fn each_outcome_is_counted_under_its_component_with_bounded_labels() {
        let f = RuntimeFamilies::default();
        let ms = Duration::from_millis(3);
        f.observe("federation", Some(&Outcome::Done), ms);
        f.observe("federation", Some(&Outcome::Done), ms);
        f.observe("mcs", Some(&Outcome::RequeueAfter(ms)), ms);
        f.observe("link", Some(&Outcome::Failed), ms);
        f.observe("link", None, ms);
        let text = encoded(&f);
        for line in [
            r#"component_reconciles_total{component="federation",outcome="done"} 2"#,
            r#"component_reconciles_total{component="mcs",outcome="requeue"} 1"#,
            r#"component_reconciles_total{component="link",outcome="failed"} 2"#,
            r#"component_reconcile_duration_seconds_count{component="federation"} 2"#,
            r#"component_reconcile_duration_seconds_count{component="link"} 2"#,
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }
}
