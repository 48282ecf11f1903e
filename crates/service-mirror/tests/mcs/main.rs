//! The Multi-Cluster Services API (multicluster.x-k8s.io) on real apiservers: one test binary,
//! its shared clusters started once for every module.

#[path = "../support/mod.rs"]
mod support;

mod conformance;
mod crd;
mod enable;
mod export;
mod import;
mod slices;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use support::mcs::{Running, World};
use support::{InProcess, Subject, Witness, eventually};

/// Reconciles of `r`'s MCS component so far, every outcome, from its own metrics (each
/// cluster's component has its own: unlike the workers' log line, which says no cluster,
/// this tells west's from east's; a test's world holds only its own names).
pub(crate) fn reconciles(r: &Running) -> u64 {
    r.metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(r#"service_mirror_component_reconciles_total{component="mcs","#))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// `r`'s reconciles now, and the witness's of `name`: [`Judged::passed`] waits until
/// that component has reconciled since, and `name` has been.
pub(crate) struct Judged<'a> {
    running: &'a Running,
    subject: Subject,
    seen: (u64, u64),
}

impl<'a> Judged<'a> {
    pub(crate) fn mark(w: &World, running: &'a Running, name: &str) -> Self {
        let subject = Subject::mcs(&w.ns, name);
        let seen = (reconciles(running), InProcess.reconciles(&subject));
        Self {
            running,
            subject,
            seen,
        }
    }

    pub(crate) async fn passed(&self) {
        eventually(&format!("{:?} judged again", self.subject), || async {
            (reconciles(self.running) > self.seen.0
                && InProcess.reconciles(&self.subject) > self.seen.1)
                .then_some(())
        })
        .await
    }

    /// Waits until the component has reconciled more than `n` times since the mark.
    pub(crate) async fn passed_more_than(&self, n: u64) {
        eventually(
            &format!("{:?} judged {} times", self.subject, n + 1),
            || async {
                (reconciles(self.running) > self.seen.0 + n
                    && InProcess.reconciles(&self.subject) > self.seen.1 + n)
                    .then_some(())
            },
        )
        .await
    }
}

/// Another writer's annotation on `cluster`'s ServiceImport `name`: an event of the
/// local imports that queues the name, and nothing for MCS to write (another writer's
/// annotation stays; its own are all there). Returns once `running` (that cluster's
/// component) has judged the name since: a look after its imports' list, on what its
/// watches had brought by then.
pub(crate) async fn poke_import(w: &World, running: &Running, cluster: &str, name: &str) {
    static POKES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = POKES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let judged = Judged::mark(w, running, name);
    let patch = serde_json::json!({"metadata": {"annotations": {"test.service-mirror.io/poke": n.to_string()}}});
    w.imports(cluster)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    judged.passed().await;
}

/// Waits until the wall clock is in a later second than `t`: Kubernetes timestamps
/// (creationTimestamp, a condition's lastTransitionTime) have whole seconds, and an
/// apiserver on this machine stamps later objects with a later one from then on.
pub(crate) async fn past_second_of(t: &Time) {
    let next = t.0.as_second() + 1;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let wait = std::time::Duration::from_secs(next.max(0) as u64).saturating_sub(now);
    // Time is the subject: the next second of the clock the timestamps come from.
    tokio::time::sleep(wait).await;
    assert!(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            >= next as u64
    );
}
