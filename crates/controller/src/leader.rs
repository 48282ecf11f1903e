//! Leader election on a `coordination.k8s.io` Lease: every replica keeps warm caches,
//! only the holder writes.
//!
//! Leadership is bounded by this process's monotonic clock (client-go's rule): a replica
//! may write only while `now < sent + duration - margin`, `sent` being the instant just
//! before the request that created, took or renewed the Lease. CLOCK_MONOTONIC runs on
//! while a process is stopped (SIGSTOP, a frozen VM), so a replica resumed after a pause
//! longer than its lease sees its leadership over before it sends anything. Another
//! replica takes the Lease only after seeing it unchanged (same resourceVersion) for a
//! whole lease duration on ITS clock: wall clocks are never compared across machines.
//! Every write carries the resourceVersion read (a JSON merge patch with
//! `metadata.resourceVersion` is a precondition), so two replicas never both win one
//! round. Verbs: `get`, `create`, `patch` on the one Lease (`permissions.rs`).

use crate::metrics::Metrics;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

mod campaign;
use campaign::*;

/// Leader election's metric family.
#[derive(Debug, Default)]
pub(crate) struct LeaderFamilies {
    /// 1 while this replica holds the leader Lease (or runs without election).
    pub(crate) leading: Gauge,
}

impl LeaderFamilies {
    /// Registers the family (under the registry's prefix).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "leader",
            "Whether this replica may write: it holds the leader Lease, or runs without election",
            self.leading.clone(),
        );
    }
}

/// Where and how to hold the lease.
#[derive(Debug, Clone)]
pub struct LeaderOptions {
    /// Namespace of the Lease (the controller's own).
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's identity (the pod name in a cluster).
    pub identity: String,
    /// How long a lease lasts without renewal: the longest a dead leader blocks writes.
    pub duration: Duration,
}

/// This replica's identity: its pod name (`$POD_NAME`), else host name and process id.
pub fn default_identity(pod_name: Option<&str>) -> String {
    pod_name
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        })
}

/// Cut from the end of each term: a write checked just before it still reaches the
/// apiserver before another replica may take over (3 s of the default 15 s).
fn margin(duration: Duration) -> Duration {
    duration / 5
}

/// The holder renews every third of the duration (5 s of the default 15 s): with the
/// margin, two renewals may fail before the term ends.
fn renew_every(duration: Duration) -> Duration {
    duration / 3
}

/// After a failed request (not a conflict): look again this soon.
fn retry_after(duration: Duration) -> Duration {
    (duration / 10).clamp(Duration::from_millis(200), Duration::from_secs(2))
}

/// The end of a term won by a request sent at `sent`.
pub(crate) fn term_end(sent: Instant, duration: Duration) -> Instant {
    sent + duration.saturating_sub(margin(duration))
}

/// Whether a replica whose term ends at `term` may write at `now`.
pub(crate) fn may_write(term: Option<Instant>, now: Instant) -> bool {
    term.is_some_and(|end| now < end)
}

/// The Lease as read: what tells whether its holder is alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// `spec.holderIdentity`; `None` when absent or empty (released).
    pub(crate) holder: Option<String>,
    /// Changes with every write, renewals included.
    pub(crate) resource_version: String,
    /// `spec.leaseDurationSeconds` (the holder's own duration).
    pub(crate) duration: Option<Duration>,
}

impl Record {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
            duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .map(|s| Duration::from_secs(s.max(0) as u64)),
        }
    }
}

/// Another replica's record, and when we first read it unchanged (our clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) record: Record,
    pub(crate) since: Instant,
}

/// What to do after reading the Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// No Lease: create it unheld (then take it: every term begins with a patch).
    Create,
    /// We hold it: renew it.
    Renew,
    /// Released, or its holder let it go unchanged for a whole duration: take it.
    Acquire,
    /// Another replica holds it: not leading; read again at this instant.
    Follow(Instant),
}

/// The decision of one round: given the Lease read (`None`: absent), our identity, the
/// record last seen, `now` and our duration; with the record to remember.
pub(crate) fn decide(
    read: Option<&Record>,
    me: &str,
    seen: Option<&Seen>,
    now: Instant,
    duration: Duration,
) -> (Step, Option<Seen>) {
    let Some(record) = read else {
        return (Step::Create, None);
    };
    match record.holder.as_deref() {
        None => (Step::Acquire, None),
        Some(h) if h == me => (Step::Renew, None),
        Some(_) => {
            let since = seen
                .filter(|s| s.record == *record)
                .map_or(now, |s| s.since);
            // The longer of the holder's duration and ours: a holder configured longer
            // than us is not cut short.
            let wait = record.duration.unwrap_or(duration).max(duration);
            let expiry = since + wait;
            let seen = Some(Seen {
                record: record.clone(),
                since,
            });
            if now >= expiry {
                (Step::Acquire, seen)
            } else {
                (Step::Follow(expiry.min(now + renew_every(duration))), seen)
            }
        }
    }
}

/// The term shared by the campaign, the expiry task and every [`Leadership`].
#[derive(Debug)]
struct Term {
    /// When our term ends; `None`: not leading.
    end: Mutex<Option<Instant>>,
    /// Mirrors `end.is_some()`, for waiting on transitions.
    said: watch::Sender<bool>,
    /// Wakes the expiry task when `end` moves.
    moved: Notify,
    metrics: Arc<Metrics>,
    identity: String,
}

impl Term {
    /// Sets the end of the term (`None`: over), under the lock the expiry task takes.
    fn set(&self, end: Option<Instant>) {
        let mut held = self.end.lock();
        let now = Instant::now();
        // Leading again after the clock ended the term but before the expiry task said
        // so: `said` never left true, yet a waiter that read the clock (a worker parked
        // at its gate) saw the term over and waits for a transition, which `say` alone
        // would not send. Sent here, or every such worker stays parked until the next
        // real transition (days, on a healthy leader).
        let regained_quietly = *self.said.borrow() && !may_write(*held, now);
        *held = end;
        // A renewal answered after its term already ended (a pause mid-request) is no
        // transition to leading.
        let leading = may_write(end, now);
        self.say(leading);
        if leading && regained_quietly {
            self.said.send_modify(|_| {});
        }
        drop(held);
        self.moved.notify_one();
    }

    /// Ends the term if its end has passed at `now`.
    fn expire(&self, now: Instant) {
        let mut held = self.end.lock();
        if held.is_some_and(|end| now >= end) {
            *held = None;
            self.say(false);
        }
    }

    fn say(&self, leading: bool) {
        let changed = self.said.send_if_modified(|v| {
            let changed = *v != leading;
            *v = leading;
            changed
        });
        if changed {
            tracing::info!(identity = %self.identity, leading, "leadership changed");
            self.metrics.leader.leading.set(leading as i64);
        }
    }
}

/// Whether this replica may write, read at the moment of each write decision.
#[derive(Debug, Clone)]
pub struct Leadership {
    said: watch::Receiver<bool>,
    /// `None` for a [`Leadership::manual`] one (tests): the flag alone decides.
    term: Option<Arc<Term>>,
    /// A link's write gate (`write_leases.rs`): the end of our hold on the link's write
    /// Lease, `None` while it is not held. Writes need both.
    gate: Option<watch::Receiver<Option<Instant>>>,
    /// Keeps the sender of an always-true `said` alive (a gate without an election).
    _always: Option<Arc<watch::Sender<bool>>>,
}

/// The next transition of `leader` (see [`Leadership::changed`]); never without one,
/// or once its election is gone: for a `select!` that also waits on other things.
pub(crate) async fn next_change(leader: Option<&mut Leadership>) {
    match leader {
        Some(l) => {
            if l.changed().await.is_err() {
                std::future::pending::<()>().await
            }
        }
        None => std::future::pending().await,
    }
}

/// Whether a write gate is open at `now`.
pub(crate) fn gate_open(end: Option<Instant>, now: Instant) -> bool {
    may_write(end, now)
}

impl Leadership {
    /// A leadership switched by hand through the sender (for tests): no term.
    pub fn manual(leading: bool) -> (watch::Sender<bool>, Self) {
        let (tx, said) = watch::channel(leading);
        (
            tx,
            Self {
                said,
                term: None,
                gate: None,
                _always: None,
            },
        )
    }

    /// `base` (or always, without an election) and also `gate`: one link's writes,
    /// which need the leadership and that link's write Lease. Everything that reads a
    /// [`Leadership`] (the writer before each write, the workers' gate, the status
    /// writers, the reconcile-everything on a gain) then follows both.
    pub fn gated(base: Option<Leadership>, gate: watch::Receiver<Option<Instant>>) -> Self {
        let mut l = match base {
            Some(l) => l,
            None => {
                let (tx, said) = watch::channel(true);
                Self {
                    said,
                    term: None,
                    gate: None,
                    _always: Some(Arc::new(tx)),
                }
            }
        };
        l.gate = Some(gate);
        l
    }

    /// Whether this replica leads now: its term has not ended on the monotonic clock
    /// (whether or not the expiry task has run since), and its write gate, if any, is
    /// open.
    pub fn leading(&self) -> bool {
        let base = match &self.term {
            Some(t) => may_write(*t.end.lock(), Instant::now()),
            None => *self.said.borrow(),
        };
        base && self
            .gate
            .as_ref()
            .is_none_or(|g| gate_open(*g.borrow(), Instant::now()))
    }

    /// As [`Leadership::leading`], marking the last transition seen.
    pub fn leading_and_update(&mut self) -> bool {
        self.said.borrow_and_update();
        if let Some(g) = &mut self.gate {
            g.borrow_and_update();
        }
        self.leading()
    }

    /// The next transition (gained or lost, by deadline too, of the leadership or the
    /// gate); an error once the election is gone.
    pub async fn changed(&mut self) -> Result<(), watch::error::RecvError> {
        match &mut self.gate {
            None => self.said.changed().await,
            Some(gate) => {
                tokio::select! {
                    r = self.said.changed() => r,
                    r = gate.changed() => match r {
                        Ok(()) => Ok(()),
                        // The gates are gone (shutting down): only the election speaks.
                        Err(_) => self.said.changed().await,
                    },
                }
            }
        }
    }

    /// Waits until leading; an error once the election is gone.
    pub async fn wait_leading(&mut self) -> Result<(), watch::error::RecvError> {
        while !self.leading_and_update() {
            self.changed().await?;
        }
        Ok(())
    }
}

/// Starts campaigning. The [`Leadership`] says whether this replica leads now; the task
/// ends (releasing the lease so another replica takes over at once) when `shutdown`
/// fires.
pub fn elect(
    client: kube::Client,
    opts: LeaderOptions,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> (Leadership, JoinHandle<()>) {
    let (said, rx) = watch::channel(false);
    let term = Arc::new(Term {
        end: Mutex::new(None),
        said,
        moved: Notify::new(),
        metrics,
        identity: opts.identity.clone(),
    });
    let expiry = tokio::spawn(expire(term.clone(), shutdown.clone()));
    let campaign = Campaign {
        api: Api::namespaced(client, &opts.namespace),
        opts,
        term: term.clone(),
        written: None,
    };
    let task = tokio::spawn(async move {
        campaign.run(shutdown).await;
        let _ = expiry.await;
    });
    (
        Leadership {
            said: rx,
            term: Some(term),
            gate: None,
            _always: None,
        },
        task,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);
    const ME: &str = "replica-a";

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn record(holder: Option<&str>, rv: &str, duration: Option<u64>) -> Record {
        Record {
            holder: holder.map(str::to_string),
            resource_version: rv.into(),
            duration: duration.map(Duration::from_secs),
        }
    }

    #[test]
    fn a_term_ends_a_margin_before_the_lease_another_replica_waits_out() {
        let t0 = Instant::now();
        let end = term_end(t0, D);
        assert_eq!(end, t0 + secs(12.0), "15 s lease, 3 s margin");
        // (term sent at, now since sent, may write)
        let table = [
            (Some(t0), 0.0, true),
            (Some(t0), 11.9, true),
            (Some(t0), 12.0, false),
            (Some(t0), 14.9, false),
            (None, 0.0, false),
        ];
        for (sent, after, want) in table {
            let term = sent.map(|s| term_end(s, D));
            assert_eq!(
                may_write(term, t0 + secs(after)),
                want,
                "{after} s after the renewal"
            );
        }
    }

    #[test]
    fn resumed_after_a_pause_longer_than_the_lease_a_replica_does_not_lead_before_any_request() {
        // Renewed at t0, stopped (SIGSTOP) for 2 lease durations: the monotonic clock
        // ran on, so the first look after SIGCONT says no, before any request.
        let t0 = Instant::now();
        let term = Some(term_end(t0, D));
        for paused in [D, D * 2, D * 10, D + secs(0.001)] {
            assert!(!may_write(term, t0 + paused), "paused {paused:?}");
        }
        // Even a pause shorter than the lease ends the term within the margin.
        assert!(!may_write(term, t0 + D - margin(D)));
        assert!(may_write(term, t0 + D - margin(D) - secs(0.001)));
    }

    #[test]
    fn a_renewal_ends_the_term_one_lease_after_it_was_sent_minus_the_margin() {
        let t0 = Instant::now();
        for (d, want) in [(15.0, 12.0), (3.0, 2.4), (4.0, 3.2), (60.0, 48.0)] {
            assert_eq!(term_end(t0, secs(d)), t0 + secs(want), "lease {d} s");
        }
        assert_eq!(renew_every(D), secs(5.0));
        // Two renewals can fail before the term ends: 2 x 5 s < 12 s.
        assert!(renew_every(D) * 2 < D - margin(D));
        assert_eq!(retry_after(D), secs(1.5));
        assert_eq!(retry_after(secs(1.0)), secs(0.2));
        assert_eq!(retry_after(secs(600.0)), secs(2.0));
    }

    #[test]
    fn decide_table() {
        let t0 = Instant::now();
        let other = record(Some("replica-b"), "10", Some(15));
        let seen_other = |since: Instant| Seen {
            record: other.clone(),
            since,
        };
        // (case, read, seen, now, step, remembered since)
        #[allow(clippy::type_complexity)]
        let table: Vec<(
            &str,
            Option<Record>,
            Option<Seen>,
            Instant,
            Step,
            Option<Instant>,
        )> = vec![
            ("no Lease: create it", None, None, t0, Step::Create, None),
            (
                "ours: renew",
                Some(record(Some(ME), "7", Some(15))),
                None,
                t0,
                Step::Renew,
                None,
            ),
            (
                "ours, though we saw another holder before: renew",
                Some(record(Some(ME), "11", Some(15))),
                Some(seen_other(t0)),
                t0 + secs(1.0),
                Step::Renew,
                None,
            ),
            (
                "released (no holder): take it at once",
                Some(record(None, "8", None)),
                None,
                t0,
                Step::Acquire,
                None,
            ),
            (
                "another holder, first read: follow, look again in a third",
                Some(other.clone()),
                None,
                t0,
                Step::Follow(t0 + secs(5.0)),
                Some(t0),
            ),
            (
                "unchanged for 14 s: follow until the lease has passed",
                Some(other.clone()),
                Some(seen_other(t0)),
                t0 + secs(14.0),
                Step::Follow(t0 + secs(15.0)),
                Some(t0),
            ),
            (
                "unchanged for a whole duration: take it",
                Some(other.clone()),
                Some(seen_other(t0)),
                t0 + D,
                Step::Acquire,
                Some(t0),
            ),
            (
                "renewed (new resourceVersion) just before: the wait starts again",
                Some(record(Some("replica-b"), "11", Some(15))),
                Some(seen_other(t0)),
                t0 + secs(20.0),
                Step::Follow(t0 + secs(25.0)),
                Some(t0 + secs(20.0)),
            ),
            (
                "another holder with a longer lease: its duration is waited out",
                Some(record(Some("replica-b"), "10", Some(60))),
                Some(Seen {
                    record: record(Some("replica-b"), "10", Some(60)),
                    since: t0,
                }),
                t0 + secs(30.0),
                Step::Follow(t0 + secs(35.0)),
                Some(t0),
            ),
            (
                "another holder with a shorter lease: ours is waited out",
                Some(record(Some("replica-b"), "10", Some(2))),
                Some(Seen {
                    record: record(Some("replica-b"), "10", Some(2)),
                    since: t0,
                }),
                t0 + secs(3.0),
                Step::Follow(t0 + secs(8.0)),
                Some(t0),
            ),
            (
                "another holder's renewTime in the far past means nothing: our clock decides",
                Some(record(Some("replica-b"), "10", None)),
                None,
                t0 + secs(100.0),
                Step::Follow(t0 + secs(105.0)),
                Some(t0 + secs(100.0)),
            ),
        ];
        for (case, read, seen, now, want, since) in table {
            let (step, remembered) = decide(read.as_ref(), ME, seen.as_ref(), now, D);
            assert_eq!(step, want, "{case}");
            assert_eq!(remembered.map(|s| s.since), since, "{case}");
        }
    }

    #[test]
    fn a_paused_leader_resumed_after_a_takeover_follows_on_its_first_read() {
        // We renewed at t0, were stopped 40 s; meanwhile replica-b took the Lease.
        let t0 = Instant::now();
        let term = Some(term_end(t0, D));
        let resumed = t0 + secs(40.0);
        assert!(!may_write(term, resumed), "before any request");
        let (step, _) = decide(
            Some(&record(Some("replica-b"), "20", Some(15))),
            ME,
            None,
            resumed,
            D,
        );
        assert!(matches!(step, Step::Follow(_)), "{step:?}");
    }

    #[test]
    fn a_lease_without_holder_or_duration_reads_as_released() {
        let lease = Lease {
            metadata: ObjectMeta {
                resource_version: Some("5".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(String::new()),
                ..LeaseSpec::default()
            }),
        };
        assert_eq!(Record::of(&lease), record(None, "5", None));
        let held = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("b".into()),
                lease_duration_seconds: Some(4),
                ..LeaseSpec::default()
            }),
            ..lease
        };
        assert_eq!(Record::of(&held), record(Some("b"), "5", Some(4)));
    }

    #[tokio::test]
    async fn a_manual_leadership_follows_its_switch() {
        let (tx, mut l) = Leadership::manual(false);
        assert!(!l.leading());
        tx.send_replace(true);
        l.wait_leading().await.unwrap();
        assert!(l.leading());
    }

    /// A term not yet begun and the leadership reading it (no expiry task).
    fn elected_term() -> (Arc<Term>, Leadership) {
        let (said, rx) = watch::channel(false);
        let term = Arc::new(Term {
            end: Mutex::new(None),
            said,
            moved: Notify::new(),
            metrics: Metrics::new(),
            identity: ME.into(),
        });
        let l = Leadership {
            said: rx,
            term: Some(term.clone()),
            gate: None,
            _always: None,
        };
        (term, l)
    }

    #[tokio::test]
    async fn a_term_past_its_end_is_not_leading_before_the_expiry_task_runs() {
        let (term, mut l) = elected_term();
        term.set(Some(Instant::now() + secs(60.0)));
        assert!(l.leading_and_update());
        // The clock passed the end (a resumed process; the same as moving the end back):
        // the flag still says true, the clock no.
        *term.end.lock() = Some(Instant::now() - secs(1.0));
        assert!(*l.said.borrow());
        assert!(!l.leading());
        // The expiry task's flip is a transition followers see.
        term.expire(Instant::now());
        l.changed().await.unwrap();
        assert!(!l.leading_and_update());
        // A renewal answered after its term already ended is no transition.
        term.set(Some(Instant::now() - secs(1.0)));
        assert!(!*l.said.borrow());
        assert!(!l.leading());
    }
    #[tokio::test]
    async fn a_renewal_after_the_clock_ended_the_term_but_before_the_expiry_task_wakes_waiters() {
        let (term, mut l) = elected_term();
        term.set(Some(Instant::now() + secs(60.0)));
        assert!(l.leading_and_update());
        // The clock ends the term; the expiry task has not run: a waiter reads "not
        // leading" and waits for a change.
        *term.end.lock() = Some(Instant::now() - secs(1.0));
        assert!(!l.leading_and_update());
        // A renewal lands now: the flag stays true, and the waiter is still woken.
        term.set(Some(Instant::now() + secs(60.0)));
        tokio::time::timeout(Duration::from_secs(5), l.changed())
            .await
            .expect("a waiter parked on the clock's verdict is woken by the renewal")
            .unwrap();
        assert!(l.leading_and_update());
        // A plain renewal while leading is no transition.
        term.set(Some(Instant::now() + secs(90.0)));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), l.changed())
                .await
                .is_err()
        );
    }
}
