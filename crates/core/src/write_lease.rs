//! Whether a link may be written, judged from its write Lease
//! `service-mirror-write-<cluster>` (the Lease Linkerd's own controllers elect on).
//!
//! During a migration Linkerd's controller and ours serve the same link: whoever holds
//! the Lease writes, the other only watches. A Lease held by a writer that is not ours
//! (no owner label, another identity) blocks the link until it is released (holder
//! empty, as client-go releases) or expires unrenewed.
//!
//! Expiry is judged as client-go judges it: on our monotonic clock, from when we last
//! saw the record change, for the holder's `leaseDurationSeconds`. The holder's
//! `renewTime` is never compared with our clock, so a skewed clock or a `renewTime`
//! in the future cannot hold the link forever, and one in the past cannot take a Lease
//! that is still being renewed. A holder renewing changes its record (`renewTime`),
//! which restarts the count; a change of metadata alone (a label, an annotation, a
//! managed field: the resourceVersion moves) does not, as client-go compares only the
//! leader-election record (holder, duration, acquire and renew times, transitions).

use std::time::{Duration, Instant};

/// The longest a foreign holder's `leaseDurationSeconds` is honoured: a Lease claiming
/// a day and then left alone must not block the link for a day. Linkerd's is 30 s.
pub const MAX_FOREIGN_DURATION: Duration = Duration::from_secs(300);

/// The longest between two reads of a foreign Lease (Linkerd's retry period is 2 s):
/// the hand-over follows a release within this.
pub const MAX_FOREIGN_POLL: Duration = Duration::from_secs(2);

/// Written by our replicas on every take and renewal of a write Lease: the identity
/// that wrote it. The Lease is ours only while this equals `spec.holderIdentity`.
pub const HOLDER_ANNOTATION: &str = "service-mirror.linkerd.io/holder";

/// Written by our replicas that shard the links (`run --shard-links`) on every take and
/// renewal (value `"true"`): such a Lease is its holder's while it renews it, even for a
/// replica that does not shard (a rollout switching the flag), never taken at once as a
/// former leader's is.
pub const SHARDED_ANNOTATION: &str = "service-mirror.linkerd.io/sharded";

/// The longest a holder identity is shown in a report.
const MAX_SHOWN_HOLDER: usize = 63;

/// A write Lease as read: the fields the judgement uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// `spec.holderIdentity`; `None` when absent or empty (released).
    pub holder: Option<String>,
    /// The value of [`HOLDER_ANNOTATION`], if any: the identity of the replica of ours
    /// that last took or renewed the Lease.
    pub marked_holder: Option<String>,
    /// Whether [`SHARDED_ANNOTATION`] says a replica sharding the links wrote it.
    pub sharded: bool,
    /// The rest of the election record: what a renewal or a new holder changes.
    pub record: Record,
    /// `spec.leaseDurationSeconds` as stored (may be absent, zero or negative).
    pub duration_seconds: Option<i32>,
    /// How far `spec.renewTime` lies ahead of our wall clock, if it does (only
    /// reported: the judgement never reads it).
    pub renew_ahead: Option<Duration>,
}

/// The fields of a Lease's spec beside holder and duration that make up its
/// leader-election record (as stored, compared as text).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// `spec.acquireTime`.
    pub acquire_time: Option<String>,
    /// `spec.renewTime`.
    pub renew_time: Option<String>,
    /// `spec.leaseTransitions`.
    pub transitions: Option<i32>,
}

/// A foreign record, and since when (our clock) we have seen it unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The holder seen.
    pub holder: String,
    /// Its `leaseDurationSeconds` then.
    pub duration_seconds: Option<i32>,
    /// The rest of its record then.
    pub record: Record,
    /// When it was first seen so.
    pub since: Instant,
}

/// What the Lease lets the link do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No Lease: create it (ours), then write.
    Absent,
    /// Held by us: renew it, and write.
    Ours,
    /// Held by another of our replicas (a former leader: our holder annotation names
    /// the holder): the leader
    /// election already decided that we write; take it.
    OurReplica,
    /// Released (holder empty): take it.
    Released,
    /// A foreign holder let it go unchanged for its whole duration: take it.
    Expired {
        /// The holder that stopped renewing.
        holder: String,
    },
    /// With links sharded over replicas ([`judge_sharded`]): another replica of ours
    /// holds it and renews it; read it again at `look_again`.
    HeldByPeer {
        /// That replica's identity.
        holder: String,
        /// When to read it again.
        look_again: Instant,
    },
    /// A foreign holder holds it and renews it: write nothing; read it again at
    /// `look_again` (the moment it would expire, or sooner).
    HeldByForeign {
        /// The holder (as stored: show it through [`shown_holder`]).
        holder: String,
        /// When it expires unless it changes first.
        expires: Instant,
        /// When to read it again.
        look_again: Instant,
    },
}

impl Verdict {
    /// Whether the Lease is to be taken (created, renewed or taken over) so the link
    /// writes.
    pub fn take(&self) -> bool {
        !matches!(
            self,
            Verdict::HeldByForeign { .. } | Verdict::HeldByPeer { .. }
        )
    }
}

/// What is odd about a foreign Lease: said in the report, never a reason to write
/// earlier or to delete anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Anomaly {
    /// `leaseDurationSeconds` absent, zero or negative: our own duration is used.
    NoDuration,
    /// `leaseDurationSeconds` above [`MAX_FOREIGN_DURATION`]: capped.
    DurationCapped(i32),
    /// `renewTime` ahead of our clock by this much (a skewed clock).
    RenewTimeAhead(Duration),
    /// The holder identity has characters a name would not (shown escaped).
    OddHolder,
}

impl std::fmt::Display for Anomaly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Anomaly::NoDuration => {
                write!(
                    f,
                    "no positive leaseDurationSeconds (our own duration is used)"
                )
            }
            Anomaly::DurationCapped(s) => write!(
                f,
                "leaseDurationSeconds {s} honoured only up to {} s",
                MAX_FOREIGN_DURATION.as_secs()
            ),
            Anomaly::RenewTimeAhead(d) => write!(
                f,
                "renewTime {} s ahead of our clock (ignored: expiry is counted from when the Lease last changed)",
                d.as_secs()
            ),
            Anomaly::OddHolder => write!(f, "the holder identity is not a plain name"),
        }
    }
}

/// The duration a foreign holder is granted: its own, within
/// `1 s..=`[`MAX_FOREIGN_DURATION`], or ours when it states none.
pub fn foreign_duration(view: &LeaseView, ours: Duration) -> Duration {
    match view.duration_seconds {
        Some(s) if s > 0 => Duration::from_secs(s as u64).min(MAX_FOREIGN_DURATION),
        _ => ours.max(Duration::from_secs(1)),
    }
}

/// The judgement of one read: the Lease read (`None`: absent), our identity, the
/// record last observed, `now` (monotonic) and our own duration; with the observation
/// to keep for the next read (`None` unless held by a foreign holder or, marked
/// sharded, by another replica of ours).
pub fn judge(
    read: Option<&LeaseView>,
    me: &str,
    last: Option<&Observed>,
    now: Instant,
    ours: Duration,
) -> (Verdict, Option<Observed>) {
    let Some(view) = read else {
        return (Verdict::Absent, None);
    };
    let holder = match view.holder.as_deref() {
        None | Some("") => return (Verdict::Released, None),
        Some(h) if h == me => return (Verdict::Ours, None),
        // Our annotation naming this very holder: one of our replicas wrote it. Our
        // labels, or an annotation naming someone else, say nothing (a foreign
        // controller re-acquiring what we released keeps both).
        Some(h) if view.marked_holder.as_deref() == Some(h) => {
            // A replica sharding the links holds it while it renews it, whoever leads.
            if view.sharded {
                return peer_until_expired(view, h, last, now, ours);
            }
            return (Verdict::OurReplica, None);
        }
        Some(h) => h,
    };
    held_until_expired(view, holder, last, now, ours)
}

/// [`judge`] when links are sharded over replicas: a Lease another replica of ours
/// holds is that replica's while it renews it (counted as a foreign one is, on our
/// clock), not ours to take ([`Verdict::HeldByPeer`]); expired, it is
/// [`Verdict::Expired`].
pub fn judge_sharded(
    read: Option<&LeaseView>,
    me: &str,
    last: Option<&Observed>,
    now: Instant,
    ours: Duration,
) -> (Verdict, Option<Observed>) {
    match judge(read, me, last, now, ours) {
        (Verdict::OurReplica, _) => {
            let view = read.expect("a replica's Lease was read");
            let holder = view.holder.as_deref().unwrap_or_default();
            peer_until_expired(view, holder, last, now, ours)
        }
        other => other,
    }
}

/// The verdict on a Lease another replica of ours holds: [`Verdict::HeldByPeer`] until
/// its record stayed unchanged for its own duration on our clock (uncapped: a peer
/// renews within it whatever `--lease-duration` says, up to its 1 h), then expired.
fn peer_until_expired(
    view: &LeaseView,
    holder: &str,
    last: Option<&Observed>,
    now: Instant,
    ours: Duration,
) -> (Verdict, Option<Observed>) {
    let own = match view.duration_seconds {
        Some(s) if s > 0 => Duration::from_secs(s as u64),
        _ => ours.max(Duration::from_secs(1)),
    };
    match counted(view, holder, last, now, own) {
        (
            Verdict::HeldByForeign {
                holder, look_again, ..
            },
            observed,
        ) => (Verdict::HeldByPeer { holder, look_again }, observed),
        other => other,
    }
}

/// The verdict on a Lease a foreign `holder` holds: expired once its record stayed
/// unchanged for its duration (capped, see [`foreign_duration`]) on our clock, else held
/// (with the observation to keep).
fn held_until_expired(
    view: &LeaseView,
    holder: &str,
    last: Option<&Observed>,
    now: Instant,
    ours: Duration,
) -> (Verdict, Option<Observed>) {
    counted(view, holder, last, now, foreign_duration(view, ours))
}

/// Expired once the record of `holder` stayed unchanged for `wait` on our clock, else
/// held (with the observation to keep).
fn counted(
    view: &LeaseView,
    holder: &str,
    last: Option<&Observed>,
    now: Instant,
    wait: Duration,
) -> (Verdict, Option<Observed>) {
    // Counted from the first read of this very record: a renewal or a new holder
    // changes it and starts the count again; metadata churn does not (it would hold
    // the link forever).
    let since = last
        .filter(|o| {
            o.holder == holder
                && o.duration_seconds == view.duration_seconds
                && o.record == view.record
        })
        .map_or(now, |o| o.since);
    let expires = since + wait;
    if now >= expires {
        return (
            Verdict::Expired {
                holder: holder.to_string(),
            },
            None,
        );
    }
    let poll = (wait / 3).clamp(Duration::from_millis(200), MAX_FOREIGN_POLL);
    let observed = Observed {
        holder: holder.to_string(),
        duration_seconds: view.duration_seconds,
        record: view.record.clone(),
        since,
    };
    (
        Verdict::HeldByForeign {
            holder: holder.to_string(),
            expires,
            look_again: expires.min(now + poll),
        },
        Some(observed),
    )
}

/// What is odd about a Lease held by a foreign holder.
pub fn anomalies(view: &LeaseView) -> Vec<Anomaly> {
    let mut found = Vec::new();
    match view.duration_seconds {
        Some(s) if s <= 0 => found.push(Anomaly::NoDuration),
        None => found.push(Anomaly::NoDuration),
        Some(s) if Duration::from_secs(s as u64) > MAX_FOREIGN_DURATION => {
            found.push(Anomaly::DurationCapped(s))
        }
        Some(_) => {}
    }
    if let Some(ahead) = view.renew_ahead.filter(|d| *d >= Duration::from_secs(1)) {
        found.push(Anomaly::RenewTimeAhead(ahead));
    }
    if view
        .holder
        .as_deref()
        .is_some_and(|h| h.len() > MAX_SHOWN_HOLDER || !h.chars().all(plain))
    {
        found.push(Anomaly::OddHolder);
    }
    found
}

fn plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/' | '@')
}

/// A holder identity as a report may show it: control and other unexpected characters
/// escaped, cut to 63 characters (a holder is whatever another program wrote).
pub fn shown_holder(holder: &str) -> String {
    let mut out = String::new();
    for (i, c) in holder.chars().enumerate() {
        if i == MAX_SHOWN_HOLDER {
            out.push('…');
            break;
        }
        if plain(c) {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "service-mirror-abc";
    const OURS: Duration = Duration::from_secs(15);

    /// `ours`: our annotation names the holder.
    fn view(holder: Option<&str>, ours: bool, rv: &str, secs: Option<i32>) -> LeaseView {
        LeaseView {
            holder: holder.map(str::to_string),
            marked_holder: holder.filter(|_| ours).map(str::to_string),
            sharded: false,
            record: renewed(rv),
            duration_seconds: secs,
            renew_ahead: None,
        }
    }

    /// A record whose `renewTime` is `at`.
    fn renewed(at: &str) -> Record {
        Record {
            renew_time: Some(at.into()),
            ..Record::default()
        }
    }

    fn seen(holder: &str, at: &str, secs: Option<i32>, since: Instant) -> Observed {
        Observed {
            holder: holder.into(),
            duration_seconds: secs,
            record: renewed(at),
            since,
        }
    }

    #[derive(Debug, PartialEq)]
    enum V {
        Absent,
        Ours,
        OurReplica,
        Released,
        Expired,
        Held { expires_in: u64 },
    }

    #[test]
    fn sharded_a_peers_lease_is_its_own_until_it_stops_renewing_and_nothing_else_changes() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let peer = view(Some("service-mirror-r2"), true, "1", Some(15));
        // First read: held, read again within a third of the duration.
        let (v, seen1) = judge_sharded(Some(&peer), ME, None, t0, OURS);
        assert_eq!(
            v,
            Verdict::HeldByPeer {
                holder: "service-mirror-r2".into(),
                look_again: t0 + s(2)
            }
        );
        let seen1 = seen1.expect("observed");
        // Renewed 10 s later: the count starts again.
        let renewed_peer = view(Some("service-mirror-r2"), true, "2", Some(15));
        let (v, seen2) = judge_sharded(Some(&renewed_peer), ME, Some(&seen1), t0 + s(10), OURS);
        assert!(matches!(v, Verdict::HeldByPeer { .. }), "{v:?}");
        let seen2 = seen2.unwrap();
        assert_eq!(seen2.since, t0 + s(10));
        // Unchanged for 14 s: held; for its 15 s: expired (taken as a foreign one is).
        let (v, _) = judge_sharded(Some(&renewed_peer), ME, Some(&seen2), t0 + s(24), OURS);
        assert!(matches!(v, Verdict::HeldByPeer { .. }), "{v:?}");
        let (v, _) = judge_sharded(Some(&renewed_peer), ME, Some(&seen2), t0 + s(25), OURS);
        assert!(matches!(v, Verdict::Expired { .. }), "{v:?}");
        assert!(v.take());
        // A peer's own duration, uncapped: 600 s is not expired after 301 s.
        let slow = view(Some("service-mirror-r2"), true, "1", Some(600));
        let (_, o) = judge_sharded(Some(&slow), ME, None, t0, OURS);
        let (v, _) = judge_sharded(Some(&slow), ME, o.as_ref(), t0 + s(301), OURS);
        assert!(matches!(v, Verdict::HeldByPeer { .. }), "{v:?}");
        let (v, _) = judge_sharded(Some(&slow), ME, o.as_ref(), t0 + s(600), OURS);
        assert!(matches!(v, Verdict::Expired { .. }), "{v:?}");
        // A Lease a sharding replica renews is its own for a replica that does not shard
        // too (a rollout switching --shard-links): not taken at once as a former
        // leader's is.
        let sharded_peer = LeaseView {
            sharded: true,
            ..peer.clone()
        };
        let (v, o) = judge(Some(&sharded_peer), ME, None, t0, OURS);
        assert!(matches!(v, Verdict::HeldByPeer { .. }), "{v:?}");
        let (v, _) = judge(Some(&sharded_peer), ME, o.as_ref(), t0 + s(15), OURS);
        assert!(matches!(v, Verdict::Expired { .. }), "{v:?}");
        // Everything else as unsharded.
        for other in [
            None,
            Some(view(Some(ME), true, "1", Some(15))),
            Some(view(None, true, "1", Some(15))),
            Some(view(Some("linkerd"), false, "1", Some(30))),
        ] {
            assert_eq!(
                judge_sharded(other.as_ref(), ME, None, t0, OURS),
                judge(other.as_ref(), ME, None, t0, OURS)
            );
        }
    }

    #[test]
    fn a_foreign_lease_blocks_until_released_or_unchanged_for_its_whole_duration() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        const L: &str = "linkerd-service-mirror-east-7f9";
        let linkerd = Some(L);
        #[allow(clippy::type_complexity)]
        let table: Vec<(&str, Option<LeaseView>, Option<Observed>, Duration, V)> = vec![
            ("absent", None, None, s(0), V::Absent),
            (
                "held by us",
                Some(view(Some(ME), true, "1", Some(15))),
                None,
                s(0),
                V::Ours,
            ),
            (
                "our identity without our label (a label removed by hand)",
                Some(view(Some(ME), false, "1", Some(15))),
                None,
                s(0),
                V::Ours,
            ),
            (
                "another replica of ours",
                Some(view(Some("service-mirror-old"), true, "1", Some(15))),
                None,
                s(0),
                V::OurReplica,
            ),
            (
                "our labels and annotation kept by a foreign re-acquire (client-go updates the whole object): foreign",
                Some(LeaseView {
                    marked_holder: Some("service-mirror-old".into()),
                    ..view(linkerd, false, "7", Some(30))
                }),
                None,
                s(0),
                V::Held { expires_in: 30 },
            ),
            (
                "released (empty holder)",
                Some(view(Some(""), false, "9", Some(1))),
                None,
                s(0),
                V::Released,
            ),
            (
                "released (no holder)",
                Some(view(None, false, "9", None)),
                None,
                s(0),
                V::Released,
            ),
            (
                "foreign, first seen: its whole duration from now",
                Some(view(linkerd, false, "5", Some(30))),
                None,
                s(0),
                V::Held { expires_in: 30 },
            ),
            (
                "foreign, unchanged for 29 s of 30",
                Some(view(linkerd, false, "5", Some(30))),
                Some(seen(L, "5", Some(30), t0)),
                s(29),
                V::Held { expires_in: 1 },
            ),
            (
                "foreign, unchanged for its 30 s: expired",
                Some(view(linkerd, false, "5", Some(30))),
                Some(seen(L, "5", Some(30), t0)),
                s(30),
                V::Expired,
            ),
            (
                "foreign, renewed (renewTime moved) at 29 s: counted again",
                Some(view(linkerd, false, "6", Some(30))),
                Some(seen(L, "5", Some(30), t0)),
                s(29),
                V::Held { expires_in: 30 },
            ),
            (
                "a new foreign holder: counted again",
                Some(view(Some("other"), false, "5", Some(30))),
                Some(seen(L, "5", Some(30), t0)),
                s(40),
                V::Held { expires_in: 30 },
            ),
            (
                "foreign, only metadata changed (resourceVersion moved, record not): expired at 30 s",
                Some(view(linkerd, false, "5", Some(30))),
                Some(seen(L, "5", Some(30), t0)),
                s(30),
                V::Expired,
            ),
            (
                "foreign, acquireTime and transitions changed (a new term): counted again",
                Some(LeaseView {
                    record: Record {
                        acquire_time: Some("t1".into()),
                        transitions: Some(2),
                        ..renewed("5")
                    },
                    ..view(linkerd, false, "5", Some(30))
                }),
                Some(seen(L, "5", Some(30), t0)),
                s(40),
                V::Held { expires_in: 30 },
            ),
            (
                "foreign, its duration changed: counted again",
                Some(view(linkerd, false, "5", Some(20))),
                Some(seen(L, "5", Some(30), t0)),
                s(40),
                V::Held { expires_in: 20 },
            ),
            (
                "no leaseDurationSeconds: ours (15 s)",
                Some(view(linkerd, false, "5", None)),
                Some(seen(L, "5", None, t0)),
                s(15),
                V::Expired,
            ),
            (
                "negative leaseDurationSeconds: ours",
                Some(view(linkerd, false, "5", Some(-4))),
                Some(seen(L, "5", Some(-4), t0)),
                s(14),
                V::Held { expires_in: 1 },
            ),
            (
                "a day's leaseDurationSeconds: capped at 300 s",
                Some(view(linkerd, false, "5", Some(86_400))),
                Some(seen(L, "5", Some(86_400), t0)),
                s(300),
                V::Expired,
            ),
            (
                "a garbage holder is still a holder",
                Some(view(
                    Some("\u{0}\n💥 x".repeat(40).as_str()),
                    false,
                    "5",
                    Some(30),
                )),
                None,
                s(0),
                V::Held { expires_in: 30 },
            ),
        ];
        for (name, read, last, after, want) in table {
            let now = t0 + after;
            let (verdict, observed) = judge(read.as_ref(), ME, last.as_ref(), now, OURS);
            let got = match &verdict {
                Verdict::Absent => V::Absent,
                Verdict::Ours => V::Ours,
                Verdict::OurReplica => V::OurReplica,
                Verdict::Released => V::Released,
                Verdict::Expired { .. } => V::Expired,
                Verdict::HeldByPeer { .. } => unreachable!("{name}: judge never says it"),
                Verdict::HeldByForeign {
                    expires,
                    look_again,
                    ..
                } => {
                    assert!(*look_again <= *expires, "{name}: looks again by expiry");
                    assert!(*look_again <= now + MAX_FOREIGN_POLL, "{name}: polls");
                    assert!(*look_again > now, "{name}: not a busy loop");
                    V::Held {
                        expires_in: (*expires - now).as_secs(),
                    }
                }
            };
            assert_eq!(got, want, "{name}");
            assert_eq!(verdict.take(), !matches!(want, V::Held { .. }), "{name}");
            assert_eq!(observed.is_some(), matches!(want, V::Held { .. }), "{name}");
        }
    }

    #[test]
    fn a_renew_time_in_the_future_neither_blocks_nor_shortens_the_count() {
        // renewTime a year ahead: the verdict is the same as without it.
        let t0 = Instant::now();
        let mut v = view(Some("linkerd"), false, "5", Some(30));
        v.renew_ahead = Some(Duration::from_secs(365 * 86_400));
        let (first, seen) = judge(Some(&v), ME, None, t0, OURS);
        assert!(matches!(first, Verdict::HeldByForeign { .. }));
        let later = t0 + Duration::from_secs(30);
        let (then, _) = judge(Some(&v), ME, seen.as_ref(), later, OURS);
        assert_eq!(
            then,
            Verdict::Expired {
                holder: "linkerd".into()
            }
        );
        assert!(
            anomalies(&v).contains(&Anomaly::RenewTimeAhead(Duration::from_secs(365 * 86_400)))
        );
    }

    #[test]
    fn anomalies_are_named_and_holders_shown_escaped_and_cut() {
        let ok = view(
            Some("linkerd-service-mirror-east-7f9"),
            false,
            "1",
            Some(30),
        );
        assert_eq!(anomalies(&ok), vec![]);
        assert_eq!(
            anomalies(&view(Some("x"), false, "1", None)),
            vec![Anomaly::NoDuration]
        );
        assert_eq!(
            anomalies(&view(Some("x"), false, "1", Some(0))),
            vec![Anomaly::NoDuration]
        );
        assert_eq!(
            anomalies(&view(Some("x"), false, "1", Some(3600))),
            vec![Anomaly::DurationCapped(3600)]
        );
        assert_eq!(
            anomalies(&view(Some("a\nb"), false, "1", Some(30))),
            vec![Anomaly::OddHolder]
        );
        assert_eq!(shown_holder("a\nb\u{0}"), "a\\nb\\u{0}");
        let long = shown_holder(&"x".repeat(500));
        assert_eq!(long.chars().count(), 64, "63 and an ellipsis");
        for a in anomalies(&view(Some("a b"), false, "1", Some(-1))) {
            assert!(!a.to_string().is_empty());
        }
    }
}
