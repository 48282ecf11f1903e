//! The witness a test waits on instead of a fixed sleep: "this key was reconciled
//! after my change". The runtime's workers log one debug line per reconcile
//! (`reconciled component=link scope=east key=ns/web outcome=done`, runtime/worker.rs).
//! An in-process controller's lines are counted by a tracing layer ([`Capture`], which
//! [`super::init_tracing`] installs); a spawned binary's are read from its log
//! ([`super::controller::Controller`], which runs with `--log-level debug`).
//!
//! A negative check ("the change made nothing be written") is then: count the key's
//! reconciles, make the change, wait for one more, check. A reconcile already running
//! when the change lands may be the one counted (then the check runs early and passes
//! without proof); the key's own reconcile comes next and a write it made would be
//! caught by the checks that follow in the same test.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer};

/// The target of the workers' line.
pub(crate) const WORKER_TARGET: &str = "service_mirror_controller::runtime::worker";

/// Whose reconciles to count.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Subject {
    /// `link`, `federation` or `mcs`.
    pub(crate) component: String,
    /// A link's cluster name; empty for federation and MCS.
    pub(crate) scope: String,
    /// `namespace/name`.
    pub(crate) key: String,
}

impl Subject {
    /// A key of the link to `cluster`.
    pub(crate) fn link(cluster: &str, namespace: &str, name: &str) -> Self {
        Self::new("link", cluster, namespace, name)
    }

    /// A key of the federation.
    pub(crate) fn federation(namespace: &str, name: &str) -> Self {
        Self::new("federation", "", namespace, name)
    }

    /// A key of MCS.
    pub(crate) fn mcs(namespace: &str, name: &str) -> Self {
        Self::new("mcs", "", namespace, name)
    }

    fn new(component: &str, scope: &str, namespace: &str, name: &str) -> Self {
        Self {
            component: component.into(),
            scope: scope.into(),
            key: format!("{namespace}/{name}"),
        }
    }

    /// Whether the log line `line` is one reconcile of this subject.
    pub(crate) fn matches_line(&self, line: &str) -> bool {
        let (component, scope, key) = (
            format!("component={}", self.component),
            format!("scope={}", self.scope),
            format!("key={}", self.key),
        );
        let has = |want: &str| line.split_whitespace().any(|t| t == want);
        line.contains(WORKER_TARGET)
            && has("reconciled")
            && has(&component)
            && has(&scope)
            && has(&key)
    }
}

/// Reconciles seen by the in-process layer, per subject.
static SEEN: LazyLock<Mutex<HashMap<Subject, u64>>> = LazyLock::new(Default::default);

/// Counts the workers' `reconciled` events.
pub(crate) struct Capture;

#[derive(Default)]
struct Fields {
    message: String,
    component: String,
    scope: String,
    key: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.set(field, format!("{value:?}"));
    }
}

impl Fields {
    fn set(&mut self, field: &Field, text: String) {
        match field.name() {
            "message" => self.message = text,
            "component" => self.component = text,
            "scope" => self.scope = text,
            "key" => self.key = text,
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != WORKER_TARGET {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        if f.message != "reconciled" {
            return;
        }
        let subject = Subject {
            component: f.component,
            scope: f.scope,
            key: f.key,
        };
        *SEEN.lock().unwrap().entry(subject).or_default() += 1;
    }
}

/// Where reconciles are counted: this process's controllers, or a spawned binary's log.
pub(crate) trait Witness {
    /// Reconciles of `subject` so far.
    fn reconciles(&self, subject: &Subject) -> u64;
}

/// The controllers running in this test process.
pub(crate) struct InProcess;

impl Witness for InProcess {
    fn reconciles(&self, subject: &Subject) -> u64 {
        SEEN.lock().unwrap().get(subject).copied().unwrap_or(0)
    }
}

/// How long a key may take to be reconciled again (a loaded machine; a converged key
/// takes milliseconds).
const WITHIN: Duration = Duration::from_secs(60);

/// Waits until `subject` has been reconciled more than `seen` times.
pub(crate) async fn reconciled_after(w: &impl Witness, subject: &Subject, seen: u64) {
    let start = Instant::now();
    while w.reconciles(subject) <= seen {
        assert!(
            start.elapsed() < WITHIN,
            "{subject:?} not reconciled again within {WITHIN:?} (seen {seen})"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Counts `subject`'s reconciles now; [`Mark::passed`] waits for the next one.
pub(crate) struct Mark<'a, W: Witness> {
    witness: &'a W,
    subject: Subject,
    seen: u64,
}

impl<'a, W: Witness> Mark<'a, W> {
    /// Marks `subject`'s count now.
    pub(crate) fn now(witness: &'a W, subject: Subject) -> Self {
        let seen = witness.reconciles(&subject);
        Self {
            witness,
            subject,
            seen,
        }
    }

    /// Waits until `subject` has been reconciled since the mark.
    pub(crate) async fn passed(&self) {
        reconciled_after(self.witness, &self.subject, self.seen).await;
    }
}
